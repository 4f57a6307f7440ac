"""``linattn.policy``'s arguments: ``disable`` as a string is LINATTN_DISABLE's syntax, never split
into letters; a force value is one backend name (else ValueError, as F48); a ``disable`` of another type is a
TypeError."""

import pytest

import linattn
from linattn.dispatch import current_policy


@pytest.mark.parametrize("disable, names", [
    ("torch-ref", {"torch-ref"}),
    ("triton-folded, triton-split", {"triton-folded", "triton-split"}),
    (["torch-ref"], {"torch-ref"}),
    (("triton-folded", "triton-split"), {"triton-folded", "triton-split"}),
])
def test_disable_takes_one_string_in_the_env_syntax_or_a_sequence_of_names(disable, names):
    with linattn.policy(disable=disable):
        assert current_policy().disable == names


def test_disabling_torch_ref_by_a_plain_string_really_disables_it():
    with linattn.policy(disable="torch-ref"):
        d = linattn.explain("gdn_decode", "cpu", n=2, h=1, hv=1, k=16, v=16)
    assert d.chosen != "torch-ref"
    assert d.verdict("torch-ref").reason.value == "disabled"


@pytest.mark.parametrize("kw, error, needle", [
    (dict(disable=5), TypeError, "disable=5 is a int"),
    (dict(disable=b"torch-ref"), TypeError, "is a bytes"),
    (dict(disable=[None]), ValueError, "holds None"),
    (dict(disable="a,,b"), ValueError, "is empty"),
    (dict(disable="decode=torch-ref"), ValueError, "not a backend name"),
    (dict(disable=["a b"]), ValueError, "not a backend name"),
    (dict(decode=["torch-ref"]), ValueError, "decode=['torch-ref'] is not a backend name"),
    (dict(decode="torch-ref,triton-split"), ValueError, "not a backend name"),
    (dict(all="decode=torch-ref"), ValueError, "not a backend name"),
])
def test_malformed_policy_arguments_are_refused(kw, error, needle):
    with pytest.raises(error) as info:
        with linattn.policy(**kw):
            pass
    assert needle in str(info.value)
