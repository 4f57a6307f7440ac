"""linattn's tools, apart from the library: the ``linattn`` command line and what it runs.

The top-level ``apps/`` folder installs as the package ``linattn.apps`` (pyproject's ``package-dir``,
as ``dispatch/`` is ``linattn.dispatch``); the console script is ``linattn.apps.cli:app`` and
``python -m linattn`` runs it. ``import linattn`` loads nothing from here
(``tests/api/test_import_scope.py``). Two library modules still reach in, when called: the
measuring of ``linattn.tune`` (``LINATTN_AUTOTUNE``) takes ``bench``'s input builders and timer,
and ``linattn check`` (``linattn.testing.cli``) takes ``cli_common``'s options.
"""
