"""Ranks that disagree: one case per argument the context-parallel agreement covers (F37, F38).

Run inside 2 spawned gloo ranks (``spawn_ranks``). In every case rank 1 changes one argument and
rank 0 passes the ordinary one; each rank reports what it raised, how long the call took and
whether its pool kept its bits. The parent test (``test_cp_agreement.py``) wants every rank to
raise the same class, promptly, with a message naming the argument (or the failing rank), and
every pool untouched. ``AGREED`` names every agreed argument; a test checks that the library's
agreement has no other and misses none.
"""

from __future__ import annotations

import time
import torch

from linattn import context_parallel as cp
from linattn.context_parallel import context_parallel_prefill

H, HV, K, V, P = 1, 2, 8, 8, 5
LENS, SLICES = (10, 12), (13, 9)  # sequence 1 spans both ranks: the call has an exchange


def global_inputs(hv: int = HV) -> dict:
    gen = torch.Generator().manual_seed(0)
    T = sum(LENS)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=r(T, H, K), k=r(T, H, K), v=r(T, hv, V), g=-torch.rand(T, hv, generator=gen),
                beta=torch.rand(T, hv, generator=gen), cu=torch.tensor([0, LENS[0], sum(LENS)]),
                pool=r(P, hv, V, K), init=r(len(LENS), hv, V, K))


def _base(rank: int, d: dict, dense: bool) -> tuple[list, dict]:
    lo = sum(SLICES[:rank])
    hi = lo + SLICES[rank]
    x = [d[n][lo:hi] for n in ("q", "k", "v", "g", "beta")]
    kw = dict(cu_seqlens=d["cu"], token_offset=lo, backend="torch-ref")
    if dense:
        kw["initial_state"] = d["init"]
    else:
        kw.update(state_pool=d["pool"], state_indices=torch.tensor([3, 1]))
    return x, kw


def _kda(x, kw):
    x[3] = x[3][..., None].expand(-1, -1, K).contiguous()
    return "kda"


def _hv(x, kw):
    d = global_inputs(hv=2 * HV)
    x[2:] = [d["v"][:SLICES[1]], d["g"][:SLICES[1]], d["beta"][:SLICES[1]]]
    kw["state_pool"] = d["pool"]


def _fail_before_exchange(x, kw):
    """A failure after the agreement, before the exchange (a kernel error, out of memory): rank 1's
    first stage raises."""
    def raises(*a, **k):
        raise RuntimeError("a kernel failed on rank 1")

    cp._run_known = raises


def _fail_dense_final(x, kw):
    """Dense mode's final_state allocation fails on rank 1 (out of memory), after the agreement."""
    def raises(*a, **k):
        raise RuntimeError("out of memory allocating final_state on rank 1")

    cp._dense_final = raises


def _fail_call_setup(x, kw):
    """The call's setup fails on rank 1 after the agreement (dense mode: rank 0 writes no pool before the exchange)."""
    def raises(*a, **k):
        raise RuntimeError("the call's setup failed on rank 1")

    cp._Call = raises


#: name -> (agreed argument it exercises or None, dense mode?, change on rank 1, words every message has).
#: A change returns a family to use instead of "gdn", or None.
CASES: dict[str, tuple] = {
    "family_typo_F38": ("family", False, lambda x, kw: "GDN", ("refused on rank 1", "family")),
    "family_kda_vs_gdn": ("family", False, _kda, ("disagree", "family")),
    "cu_seqlens": ("cu_seqlens", False, lambda x, kw: kw.update(cu_seqlens=torch.tensor([0, LENS[0] + 1, sum(LENS)])),
                   ("disagree", "cu_seqlens")),
    "mode_dense_vs_pool": ("mode", False, lambda x, kw: [kw.pop("state_pool"), kw.pop("state_indices")],
                           ("disagree", "mode")),
    "state_indices": ("state_indices", False, lambda x, kw: kw.update(state_indices=torch.tensor([1, 3])),
                      ("disagree", "state_indices")),
    "has_initial_state": ("has_initial_state", False,
                          lambda x, kw: kw.update(has_initial_state=torch.tensor([True, False])),
                          ("disagree", "has_initial_state")),
    "initial_state_one_rank_F37": ("initial_state given", True, lambda x, kw: kw.update(initial_state=None),
                                   ("disagree", "initial_state given")),
    "state_dtype": ("state dtype", False, lambda x, kw: kw.update(state_pool=kw["state_pool"].to(torch.bfloat16)),
                    ("disagree", "state dtype")),
    "state_layout": ("state_layout", False, lambda x, kw: kw.update(state_layout="kv"), ("disagree", "state_layout")),
    "head_shapes": ("head shapes", False, _hv, ("disagree", "head shapes")),
    "qkv_dtype": ("q/k/v dtypes", False, lambda x, kw: x.__setitem__(slice(0, 3), [t.bfloat16() for t in x[:3]]),
                  ("disagree", "q/k/v dtypes")),
    "scale": ("scale", False, lambda x, kw: kw.update(scale=0.5), ("disagree", "scale")),
    "use_qk_l2norm": ("use_qk_l2norm", False, lambda x, kw: kw.update(use_qk_l2norm=False),
                      ("disagree", "use_qk_l2norm")),
    "validate": ("validate and check_finite", False, lambda x, kw: kw.update(validate=False),
                 ("disagree", "validate")),
    "check_finite": ("validate and check_finite", False, lambda x, kw: kw.update(check_finite=True),
                     ("disagree", "check_finite")),
    "local_refusal_bad_g_F38": (None, False, lambda x, kw: x.__setitem__(3, x[3].abs() + 1.0),
                                ("refused on rank 1", "g")),
    "failure_after_agreement_before_exchange": (None, False, _fail_before_exchange, ("rank", "1")),
    "dense_final_fails_after_agreement": (None, True, _fail_dense_final, ("rank", "1")),
    "call_setup_fails_after_agreement": (None, True, _fail_call_setup, ("rank", "1")),
}
#: g/beta dtypes and the g shape are refused by every rank's own validation (g and beta must be fp32
#: and shaped [T, HV] / [T, HV, K]) before the agreement compares them; they are in it as a backstop.
AGREED = {"family", "cu_seqlens", "mode", "state_indices", "has_initial_state", "initial_state given", "state dtype",
          "state_layout", "head shapes", "g shape", "q/k/v dtypes", "g/beta dtypes", "scale", "use_qk_l2norm",
          "validate and check_finite"}


def run_case(rank: int, name: str) -> tuple:
    """``(outcome, error class, message, seconds, pool bits unchanged)`` of this rank's call in case ``name``."""
    _, dense, change, _ = CASES[name]
    d = global_inputs()
    x, kw = _base(rank, d, dense)
    patched = {n: getattr(cp, n) for n in ("_run_known", "_dense_final", "_Call")}
    changed = change(x, kw) if rank == 1 else None
    family = changed if isinstance(changed, str) else "gdn"
    pools = [t for t in (kw.get("state_pool"), kw.get("initial_state")) if t is not None]
    before = [t.clone() for t in pools]
    t0 = time.monotonic()
    try:
        with torch.no_grad():
            context_parallel_prefill(family, *x, **kw)
        outcome, cls, msg = "ok", "", ""
    except Exception as e:  # noqa: BLE001 - reported
        outcome, cls, msg = "err", type(e).__name__, str(e)
    finally:
        for n, f in patched.items():
            setattr(cp, n, f)
    unchanged = all(torch.equal(a, b) for a, b in zip(pools, before))
    return outcome, cls, msg, time.monotonic() - t0, unchanged


def run_all(rank: int, world: int, names: list[str]) -> dict:
    """Every case of ``names`` in order on this rank (the ranks run them in the same order)."""
    torch.set_num_threads(1)
    return {name: run_case(rank, name) for name in names}

