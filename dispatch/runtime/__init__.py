"""The runtime: what runs on every op call, above the backends.

``selection`` (the :class:`~linattn.dispatch.runtime.selection.Dispatcher`: verdicts, ranking,
the decision cache), ``fast_path`` (the per-call plans), ``registry`` (the pluggy registry of
backends), ``policy`` (forcing and disabling backends), ``self_check`` (when first-call self-checks
run, and their results) and ``results`` (the checks of a plugin backend's result).

Layering (``tests/test_layering.py``): the top of ``dispatch/``; it imports the plugin API
(``dispatch/plugin/``), the rules (``dispatch/rules/``), ``dispatch/env.py`` and ``dispatch/lru.py``,
and nothing imports it but the ops and the tools above it.
"""
