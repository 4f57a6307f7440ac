"""The call objects of plugin API 2 (``dispatch/plugin/calls.py``) are written-out classes, held
field by field to the op table (``dispatch/rules/ops_table.py``).

They were generated from the table at import (611c513) so that a new argument was written once;
IDEs and type checkers then saw no fields, and ``DecodeCall`` / ``PrefillCall`` listed theirs in
the table's order instead of the documented one. Now the classes are written out and this test is
what keeps them equal to the table: an argument added to an op without its field fails here with
the line to add.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Optional

import pytest
import torch

from linattn.dispatch.plugin import calls
from linattn.dispatch.plugin.calls import CALL_TYPES, ClampCall, DecodeCall, GatingCall, PrefillCall, make_call
from linattn.dispatch.rules.ops_table import METHODS, OP_TABLE

CALLS_PY = Path(calls.__file__)

#: The field order documented before 611c513 (the hand-written classes it replaced): required
#: tensors, the gates, the second release's slot arguments, then the options. A field added later
#: goes after these.
DOCUMENTED_ORDER = {
    DecodeCall: ("q", "k", "v", "state_pool", "state_indices", "a", "b", "A_log", "dt_bias", "g", "beta",
                 "has_initial_state", "output_state_indices", "scale", "use_qk_l2norm", "state_layout",
                 "intermediate_states", "intermediate_state_indices", "disable_state_update", "num_accepted_tokens",
                 "softplus_beta", "softplus_threshold", "lower_bound"),
    PrefillCall: ("q", "k", "v", "g", "beta", "cu_seqlens", "state_pool", "state_indices", "initial_state",
                  "has_initial_state", "output_state_indices", "checkpoint_every", "checkpoint_indices", "scale",
                  "use_qk_l2norm", "state_layout"),
    GatingCall: ("A_log", "a", "b", "dt_bias", "softplus_beta", "softplus_threshold", "lower_bound"),
    ClampCall: ("x", "limit"),
}


def spec_fields(method: str) -> dict[str, tuple[object, object]]:
    """What the op table says the call type of ``method`` holds: field name -> (type, default), the
    default :data:`dataclasses.MISSING` where the call always holds a value (a required argument,
    ``scale`` which a host rule fills in, decode's ``state_indices`` whose None is refused). An
    argument only some of the method's ops take (KDA's ``lower_bound``) is ``Optional``, None in
    the others' calls."""
    specs = [s for s in OP_TABLE.values() if s.method == method]
    entries = {}
    for spec in specs:
        for a in spec.args:
            entries.setdefault(a.name, a)
    out = {}
    for name, a in entries.items():
        if not all(s.takes(name) for s in specs):
            out[name] = (Optional[a.type], None)
        elif a.required or a.filled or a.refuses_none:
            out[name] = (a.call_annotation, dataclasses.MISSING)
        else:
            out[name] = (a.call_annotation, a.default)
    return out


def _type_text(tp) -> str:
    if typing.get_origin(tp) is typing.Union:
        inner = [t for t in typing.get_args(tp) if t is not type(None)]
        return f"Optional[{_type_text(inner[0])}]"
    return "Tensor" if tp is torch.Tensor else tp.__name__


def _line(name: str, tp, default) -> str:
    """The field as it is written in calls.py."""
    return f"{name}: {_type_text(tp)}" + ("" if default is dataclasses.MISSING else f" = {default!r}")


def _class_fields(cls) -> dict[str, tuple[object, object]]:
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(cls) if f.name != "spec"}


@pytest.mark.parametrize("method", METHODS)
def test_each_call_class_has_exactly_the_op_tables_arguments_as_fields(method):
    cls = CALL_TYPES[method]
    want, have = spec_fields(method), _class_fields(cls)
    ops = ", ".join(s.name for s in OP_TABLE.values() if s.method == method)
    missing = [_line(n, *want[n]) for n in want if n not in have]
    assert not missing, (f"{cls.__name__} lacks arguments of {ops} in the op table: add "
                         + "; ".join(f"`{m}`" for m in missing)
                         + f" to class {cls.__name__} in dispatch/plugin/calls.py, after its documented fields")
    extra = [n for n in have if n not in want]
    assert not extra, (f"{cls.__name__} has fields {extra} that no op of {ops} takes: remove them from "
                       f"dispatch/plugin/calls.py, or add the argument to the op table (dispatch/rules/ops_table.py)")
    for name, (tp, default) in want.items():
        assert have[name] == (tp, default), (
            f"{cls.__name__}.{name} is `{_line(name, *have[name])}`; the op table makes it `{_line(name, tp, default)}`")


@pytest.mark.parametrize("cls", list(DOCUMENTED_ORDER))
def test_each_call_class_keeps_the_documented_field_order(cls):
    names = tuple(f.name for f in dataclasses.fields(cls))
    assert names[0] == "spec"
    documented = DOCUMENTED_ORDER[cls]
    assert names[1:len(documented) + 1] == documented, (
        f"{cls.__name__}'s fields {names[1:]} do not begin with the documented order {documented}; "
        "keep that order and add a new field after it")


@pytest.mark.parametrize("cls", list(DOCUMENTED_ORDER))
def test_each_call_class_is_written_out_so_that_type_checkers_see_its_fields(cls):
    tree = ast.parse(CALLS_PY.read_text())
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
    assert node is not None, f"{cls.__name__} is not a class statement of {CALLS_PY.name} (IDEs would see no fields)"
    written = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    assert written == [f.name for f in dataclasses.fields(cls) if f.name != "spec"]


@pytest.mark.parametrize("cls", list(DOCUMENTED_ORDER))
def test_call_objects_are_frozen_slotted_and_built_by_keyword_only(cls):
    op = next(s for s in OP_TABLE.values() if CALL_TYPES[s.method] is cls)
    params = dataclasses.fields(cls)
    assert all(f.kw_only for f in params)
    values = {f.name: (torch.ones(1) if f.default is dataclasses.MISSING else f.default) for f in params
              if f.name != "spec"}
    if "scale" in values:
        values["scale"] = 0.5
    call = cls(spec=op, **values)
    with pytest.raises(TypeError):
        cls(op, *values.values())  # as before 611c513 (and since): no positional construction
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.spec = op
    assert not hasattr(call, "__dict__")
    assert call.replace(spec=op) == call


def test_a_call_built_from_validated_keywords_reads_its_fields_by_name():
    call = make_call("kda_gating", {"A_log": torch.zeros(2), "a": torch.ones(3, 2, 4), "b": torch.ones(3, 2),
                                    "dt_bias": torch.zeros(2, 4), "lower_bound": -5.0})
    assert type(call) is GatingCall and call.lower_bound == -5.0 and call.softplus_threshold == 20.0
    assert call.family == "kda" and "lower_bound" in call.arguments()


def test_call_objects_print_without_the_op_table():
    """The op table's row would fill a screen: the repr names the fields but not the spec."""
    import torch

    from linattn.dispatch.plugin.calls import ClampCall
    from linattn.dispatch.rules.ops_table import OP_TABLE

    a = ClampCall(spec=OP_TABLE["silu_and_mul_clamp"], x=torch.zeros(2, 8))
    assert "spec=" not in repr(a) and "Arg(" not in repr(a) and repr(a).startswith("ClampCall(x=")
