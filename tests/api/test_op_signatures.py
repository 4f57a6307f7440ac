"""The public functions are typed signatures written by hand; the op table's argument entries
(``OpSpec.args``, ``dispatch/rules/ops_table.py``) are the contract. These tests hold the two together:
names, order and defaults of every public op, every argument handed on to the dispatcher as given,
and the custom op's schema derived from the same entries."""

import inspect

import pytest
import torch

import linattn
import linattn.ops as ops
from linattn.dispatch.rules.ops_table import CALL_OPTIONS, OP_TABLE, OPS, REQUIRED


class _Handed(Exception):
    """Raised by the stand-in dispatcher with what the public function handed it."""


@pytest.mark.parametrize("op", OPS)
def test_public_signature_has_the_specs_names_order_and_defaults(op):
    spec = OP_TABLE[op]
    params = inspect.signature(getattr(linattn, op)).parameters
    assert tuple(params) == tuple(a.name for a in spec.signature)
    for a in spec.signature:
        default = params[a.name].default
        if a.default is REQUIRED:  # a required argument may default to None only to keep its position
            assert default in (inspect.Parameter.empty, None), a.name
        else:
            assert default == a.default and type(default) is type(a.default), a.name
    assert [a.name for a in spec.signature if a in CALL_OPTIONS] == ["backend", "validate", "check_finite"]


@pytest.mark.parametrize("op", OPS)
def test_public_function_hands_every_argument_on_as_given(op, monkeypatch):
    spec = OP_TABLE[op]
    given = {name: object() for name in spec.arguments}
    options = ("plugin-x", False, True)

    def dispatcher(op_, args, backend, validate, check_finite):
        raise _Handed(op_, args, (backend, validate, check_finite))

    monkeypatch.setattr(ops, "_call", dispatcher)
    with pytest.raises(_Handed) as seen:
        getattr(linattn, op)(**given, **dict(zip(("backend", "validate", "check_finite"), options)))
    op_, args, handed = seen.value.args
    assert op_ == op and handed == options
    assert tuple(args) == tuple(a.name for a in spec.args)  # the spec's order: the call key's
    assert all(args[name] is given[name] for name in spec.arguments)


@pytest.mark.parametrize("op", OPS)
def test_custom_op_schema_is_the_specs_signature(op):
    spec = OP_TABLE[op]
    schema = getattr(torch.ops.linattn, op).default._schema
    assert tuple(a.name for a in schema.arguments) == tuple(a.name for a in spec.signature)
    for arg, a in zip(schema.arguments, spec.signature):
        assert str(arg.type).startswith("Optional") == (a.default is None and not a.refuses_none
                                                          and a not in CALL_OPTIONS), a.name
        assert (arg.alias_info is not None and arg.alias_info.is_write) == a.mutated, a.name
        assert arg.has_default_value() == (a.since > 1), a.name
