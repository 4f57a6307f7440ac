"""linattn's tools, apart from the library: the ``linattn`` command line and what it runs.

The top-level ``apps/`` folder installs as the package ``linattn.apps`` (pyproject's ``package-dir``,
as ``dispatch/`` is ``linattn.dispatch``). Nothing in the library (``linattn.ops``, ``linattn.dispatch``,
``linattn.backends``, ``linattn.kernels``) imports from here; ``import linattn`` does not load it.
"""
