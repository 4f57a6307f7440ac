"""Field case F33 (issue 26): a written buffer that torch would refuse to write is refused before
the first write, and a caller's fault never marks a backend broken.

A pool allocated under ``torch.inference_mode()`` and used outside it was written for slot 0, then
torch raised on slot 3 (decode and prefill), and through a plugin the plugin was marked broken. The
rule (``dispatch/rules/host_rules.py``, ``write_refusal``): an inference tensor outside inference mode, a
buffer that requires grad, or a lazily negated view is a ``ValueError`` before anything runs, on
every backend, plugins included; every buffer and input keeps its bits. A plugin raise that the
call's own validation explains (``validate=False`` with a bad index) raises that refusal and leaves
the plugin chosen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import linattn
from field_cases import DEVICE, HV, backends_for, decode_inputs, prefill_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
from plugin_fakes import Plugin, mangling  # noqa: E402

PLUGIN = "correct-plugin"


def _inference(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return x.clone()


def _negated(x: torch.Tensor) -> torch.Tensor:
    """A lazily negated view holding ``x``'s values (``.imag`` of a conjugated complex tensor)."""
    return torch.complex(torch.zeros_like(x), -x).conj().imag


#: kind -> (make the buffer unwritable, grad mode of the call, what the refusal says)
KINDS = {
    "inference_under_no_grad": (_inference, False, "inference tensor .* outside inference mode"),
    "inference_grad_on": (_inference, True, "inference tensor .* outside inference mode"),
    "requires_grad": (lambda x: x.clone().requires_grad_(True), False, "requires grad"),
    "negated_view": (_negated, False, "lazily negated"),
}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().resolve_neg().clone().contiguous().view(torch.int32)


def _snapshot(kw: dict) -> dict:
    return {n: _bits(x) for n, x in kw.items() if isinstance(x, torch.Tensor)}


def _assert_unchanged(kw: dict, snap: dict) -> None:
    for name, was in snap.items():
        assert torch.equal(_bits(kw[name]), was), f"{name} changed although the call was refused"


def _decode_call(buffer: str, kind: str, device: str):
    args, pool = decode_inputs(N=4, T=2, K=16, V=16, P=9)
    kw = {**{k: v.to(device) for k, v in args.items()}, "state_pool": pool.to(device),
          "state_indices": torch.tensor([0, 3, -1, 5], device=device),
          "intermediate_states": torch.randn(3, 2, HV, 16, 16, device=device),
          "intermediate_state_indices": torch.tensor([2, 0, -1, 1], device=device)}
    kw[buffer] = KINDS[kind][0](kw[buffer])
    return linattn.gdn_decode, kw


def _prefill_call(buffer: str, kind: str, device: str):
    args, pool = prefill_inputs(lens=(5, 9, 0, 3), K=64, V=64, P=9)
    kw = {**{k: v.to(device) for k, v in args.items()}, "state_pool": pool.to(device),
          "state_indices": torch.tensor([1, 4, 6, -1], device=device)}
    kw[buffer] = KINDS[kind][0](kw[buffer])
    return linattn.gdn_prefill, kw


CASES = [("decode", "state_pool"), ("decode", "intermediate_states"), ("prefill", "state_pool")]


def _backends(phase: str) -> list:
    return [*backends_for(f"gdn_{phase}"), PLUGIN]


@pytest.fixture
def plugin_registry(registry):
    registry.add_plugin(Plugin(mangling(PLUGIN, {"gdn_decode", "gdn_prefill"})), name="vendor-correct")
    return registry


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("phase, buffer, backend", [(p, b, be) for p, b in CASES for be in _backends(p)],
                         ids=[f"{p}-{b}-{be}" for p, b in CASES for be in _backends(p)])
def test_f33_unwritable_buffer_is_refused_before_any_write(plugin_registry, phase, buffer, kind, backend):
    device = "cpu" if backend == PLUGIN else DEVICE
    fn, kw = (_decode_call if phase == "decode" else _prefill_call)(buffer, kind, device)
    snap = _snapshot(kw)
    _, grad_on, says = KINDS[kind]
    with torch.set_grad_enabled(grad_on), pytest.raises(ValueError, match=f"{buffer} .*{says}"):
        fn(**kw, backend=backend)
    _assert_unchanged(kw, snap)
    assert not plugin_registry.broken, "a caller's fault marked a backend broken"


def test_f33_plugin_chosen_automatically_is_not_marked_broken_and_runs_the_next_valid_call(plugin_registry):
    fn, kw = _prefill_call("state_pool", "inference_under_no_grad", "cpu")
    snap = _snapshot(kw)
    with torch.no_grad(), pytest.raises(ValueError, match="inference tensor"):
        fn(**kw)
    _assert_unchanged(kw, snap)
    assert not plugin_registry.broken
    kw["state_pool"] = kw["state_pool"].clone()  # a normal tensor now
    with torch.no_grad():
        fn(**kw)
    assert linattn.last_decision("gdn_prefill").chosen == PLUGIN


def test_f33_inference_pool_inside_inference_mode_runs_as_a_normal_pool():
    fn, kw = _decode_call("state_pool", "inference_under_no_grad", DEVICE)
    normal = {**kw, "state_pool": kw["state_pool"].clone(), "intermediate_states": kw["intermediate_states"].clone()}
    with torch.inference_mode():
        o = fn(**kw)
    with torch.no_grad():
        ref = fn(**normal)
    assert torch.equal(o, ref) and torch.equal(kw["state_pool"], normal["state_pool"])
    assert torch.equal(kw["intermediate_states"], normal["intermediate_states"])


def test_f33_read_only_inference_pool_outside_inference_mode_is_accepted():
    """disable_state_update=True only reads the pool: nothing to refuse, and the pool keeps its bits."""
    fn, kw = _decode_call("state_pool", "inference_under_no_grad", DEVICE)
    snap = _bits(kw["state_pool"])
    with torch.no_grad():
        fn(**kw, disable_state_update=True)
    assert torch.equal(_bits(kw["state_pool"]), snap)


@pytest.mark.parametrize("phase", ("decode", "prefill"))
def test_f33_a_cached_call_key_rechecks_inference_mode(phase):
    """The call key holds grad mode but not inference mode: a plan made inside inference_mode must not
    let the same call (same shapes, same inference pool) write outside it."""
    fn, kw = (_decode_call if phase == "decode" else _prefill_call)("state_pool", "inference_under_no_grad", DEVICE)
    with torch.inference_mode():
        fn(**kw)
        fn(**kw)  # the plan is cached now
    snap = _snapshot(kw)
    with torch.no_grad(), pytest.raises(ValueError, match="inference tensor"):
        fn(**kw)
    _assert_unchanged(kw, snap)


def test_f33_a_pool_whose_storage_was_freed_is_refused_before_any_write():
    """Checked by the full validation (the first call of a call key; host_rules.any_unwritable)."""
    fn, kw = _decode_call("state_pool", "requires_grad", DEVICE)
    kw["state_pool"] = kw["state_pool"].detach().clone()
    linattn.dispatch.clear_cache()
    kw["state_pool"].untyped_storage().resize_(0)  # as FSDP frees an unsharded parameter
    snap = _snapshot({n: x for n, x in kw.items() if n != "state_pool"})
    with torch.no_grad(), pytest.raises(ValueError, match=r"state_pool .* addresses \d+ bytes but its storage holds 0"):
        fn(**kw)
    _assert_unchanged(kw, snap)


def test_f33_plugin_raise_explained_by_the_callers_inputs_is_the_callers_refusal(plugin_registry):
    """validate=False with a slot past the pool: the plugin raises, but the call's own validation
    explains it, so the caller gets that ValueError and the plugin stays chosen."""
    fn, kw = _prefill_call("state_pool", "requires_grad", "cpu")
    kw["state_pool"] = kw["state_pool"].detach().clone()
    kw["state_indices"] = torch.tensor([1, 4, 6, 99])
    with torch.no_grad(), pytest.raises(ValueError, match="state_indices") as err:
        fn(**kw, validate=False, backend=PLUGIN)
    assert err.value.__cause__ is not None  # the plugin's own error, kept for the traceback
    assert not plugin_registry.broken
    kw["state_indices"] = torch.tensor([1, 4, 6, -1])
    with torch.no_grad():
        fn(**kw)
    assert linattn.last_decision("gdn_prefill").chosen == PLUGIN
