"""The rules: the op table and the validation rules it names.

``ops_table`` (every fact about an op: its arguments and which host and value rules validate it),
``host_rules`` (ranks, shapes, dtypes, devices, strides, scalars: no device sync), ``value_rules``
(what the values must be: one sync, or one fused kernel), ``validate`` (runs them per op) and
``layouts`` (the stride and aliasing rules at the boundary with a backend).

Layering (``tests/test_layering.py``): imports only ``dispatch/env.py`` and ``dispatch/lru.py``
below it, never the plugin API (``dispatch/plugin/``) or the runtime (``dispatch/runtime/``). The op
table and the rules live in one package because each reads the other: the table lists the rule
functions, and validation reads the table.
"""
