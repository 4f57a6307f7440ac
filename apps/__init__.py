"""linattn's tools, apart from the library: the ``linattn`` command line and what it runs.

The top-level ``apps/`` folder installs as the package ``linattn.apps`` (pyproject's ``package-dir``,
as ``dispatch/`` is ``linattn.dispatch``); the console script is ``linattn.apps.cli:app`` and
``python -m linattn`` runs it. ``import linattn`` loads nothing from here
(``tests/api/test_import_scope.py``), and the library imports nothing from here: ``bench``'s input
cases and timer are the library's (:mod:`linattn.measure`, which the tuning measurement uses too).
``linattn check`` (``linattn.testing.cli``, a tool as these are) takes ``cli_common``'s options.
"""
