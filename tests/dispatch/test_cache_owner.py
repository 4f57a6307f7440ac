"""One owner for every per-process cache (issue 30, section 2): ``Dispatcher.clear()`` empties the
dispatcher's caches and every module-level cache of the call path (``dispatch/lru.py``'s
``PROCESS_CACHES``), results after it are bitwise those before, and no module keeps a cache the
list does not name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import torch

import linattn
from linattn.dispatch import dispatcher
from linattn.dispatch import lru
from linattn.dispatch.lru import PROCESS_CACHES, cache_size

ROOT = Path(__file__).resolve().parents[2]
#: the folders whose modules' caches the dispatcher owns, and their import packages
PACKAGES = {"dispatch": "linattn.dispatch", "backends": "linattn.backends", "kernels": "linattn.kernels",
            "capabilities": "linattn.capabilities", "linattn/compat": "linattn.compat",
            "linattn/integrations": "linattn.integrations"}


def _decode(n: int, seed: int = 0, H=1, HV=2, K=8, V=8, P=8) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=r(n, 1, H, K), k=r(n, 1, H, K), v=r(n, 1, HV, V), a=r(n, 1, HV), b=r(n, 1, HV),
                A_log=r(HV), dt_bias=r(HV), state_pool=r(P, HV, V, K),
                state_indices=torch.arange(n, dtype=torch.int32))


def _prefill(lens=(5, 3), seed=1, H=1, HV=2, K=8, V=8, P=8) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t, n = sum(lens), len(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return dict(q=r(t, H, K), k=r(t, H, K), v=r(t, HV, V), g=-torch.rand(t, HV, generator=g), beta=torch.rand(t, HV, generator=g),
                state_pool=r(P, HV, V, K), state_indices=torch.arange(n, dtype=torch.int32) + 2, cu_seqlens=cu)


def _run_all() -> list[torch.Tensor]:
    """Calls that fill the call-path caches on the CPU; every output and written pool, in order.
    Pool rows a call does not own are checked unchanged."""
    out = []
    for n in (2, 3, 5):  # a new decode batch: class plans
        x = _decode(n)
        before = x["state_pool"].clone()
        out += [linattn.gdn_decode(**x), x["state_pool"]]
        assert torch.equal(x["state_pool"][n:], before[n:])  # rows no sequence owns
    x = _prefill()
    before = x["state_pool"].clone()
    out += [linattn.gdn_prefill(**x)[0], x["state_pool"]]
    assert torch.equal(x["state_pool"][:2], before[:2]) and torch.equal(x["state_pool"][4:], before[4:])
    with linattn.policy(disable="triton-split"):  # a scoped policy: the merged-policy cache
        x = _decode(2, seed=3)
        out += [linattn.gdn_decode(**x), x["state_pool"]]
    # the decision for a GPU profile asks the Triton backends' size classes (grid verdicts, grid plans)
    for op, t in (("gdn_prefill", 64), ("gdn_decode", 1)):
        linattn.explain(linattn.Problem(op=op, n=2, t=t, h=16, hv=32, k=128, v=128), "sm90")
    from linattn.compat import fla  # the FLA-compatible API: its kept slot tensors and option sets

    r = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 1, 1, 8, generator=r), torch.randn(2, 1, 1, 8, generator=r)
    v, g = torch.randn(2, 1, 2, 8, generator=r), -torch.rand(2, 1, 2, generator=r)
    out += list(fla._run_with_options(fla.fused_recurrent_gated_delta_rule, None, True, q, k, v, g=g,
                                      beta=torch.rand(2, 1, 2, generator=r), output_final_state=True))
    return out


def _fill_the_rest(monkeypatch) -> None:
    """Caches the CPU calls above leave empty: filled by calling their functions, or (compiled
    kernels, GPU self-checks) with a stand-in entry, so that clearing them is seen."""
    from linattn.backends.peer import import_library
    from linattn.kernels import cutedsl
    from linattn.kernels.cutedsl import chunk_state, fused_prefill, fused_prep, fused_walk
    from linattn.kernels.triton import launch, silu_clamp

    import_library("math")
    silu_clamp.silu_config(64)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cutedsl.device_arch(torch.device("cuda", 0))
    cutedsl.importable()  # imports CuTe DSL where installed (about 2 s), else records why not
    from linattn.backends import torch_chunked

    for cache in (launch._compiled, chunk_state._CACHE, fused_walk._CACHE, fused_walk._STEPS, fused_walk._LAYOUTS,
                  fused_prep._CACHE, fused_prefill._CACHE, dispatcher().self_checks._results,
                  torch_chunked._LAYOUTS, torch_chunked._CONSTANTS):  # the last two: when no CPU prefill above ran torch-chunked
        cache.setdefault(("stand-in",), None)


def test_clear_empties_every_cache_and_results_stay_bitwise(monkeypatch):
    dispatcher().clear()
    first = _run_all()
    _fill_the_rest(monkeypatch)
    caches = dispatcher().caches()
    assert set(caches) >= set(PROCESS_CACHES)  # every listed module was imported above
    empty = [name for name, c in caches.items() if cache_size(c) == 0]
    assert not empty, f"not filled by the calls: {empty}"
    dispatcher().clear()
    left = {name: cache_size(c) for name, c in dispatcher().caches().items() if cache_size(c)}
    assert not left, f"not emptied by Dispatcher.clear(): {left}"
    monkeypatch.undo()
    again = _run_all()
    assert len(first) == len(again)
    for a, b in zip(first, again):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_clear_cache_keeps_its_scope():
    """``linattn.dispatch.clear_cache()`` drops decisions and call plans as before, and keeps what
    only ``Dispatcher.clear()`` drops (here: the compiled launches)."""
    from linattn.dispatch.runtime import fast_path
    from linattn.kernels.triton import launch

    _run_all()
    launch._compiled[("stand-in",)] = None
    try:
        linattn.dispatch.clear_cache()
        assert launch._compiled == {("stand-in",): None}
        caches = dispatcher().caches()
        assert cache_size(caches["decisions"]) == 0 and len(fast_path._plans) == len(fast_path._classes) == 0
    finally:
        launch._compiled.pop(("stand-in",), None)


def _module_caches(path: Path, module: str) -> set[str]:
    """``module:name`` for each module-level cache of a source file: a name bound to ``LRUCache(...)``
    or to an empty dict (``{}``, ``dict()``), and each function decorated with ``functools.lru_cache``
    or ``functools.cache``."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            is_cache = (isinstance(value, ast.Dict) and not value.keys) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("LRUCache", "dict")
                and not value.args and not value.keywords) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "LRUCache")
            if is_cache:
                found |= {f"{module}:{t.id}" for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                fn = dec.func if isinstance(dec, ast.Call) else dec
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("lru_cache", "cache"):
                    found.add(f"{module}:{node.name}")
    return found


#: module-level empty dicts that are tables filled at import or registries, not caches, with why
NOT_CACHES = {
    "linattn.kernels.cutedsl.selfcheck:CHECKS": "the CuTe DSL self-check's registry of check functions, filled "
                                                 "by a decorator at import: clearing it would lose the checks",
    "linattn.kernels.cutedsl.fused_walk:_runtime": "CuTe DSL's runtime entry points (make_ptr, the address space, "
                                                   "the stream and integer types), imported once: no call's data",
    "linattn.integrations.transformers:_ROUTERS": "the routers enable() installed over transformers' functions, "
                                                  "undone by disable(): state of the app's models, not a cache",
}


def test_every_module_cache_is_listed():
    found = set()
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found |= _module_caches(path, ".".join([package, *parts]))
    listed = set(PROCESS_CACHES)
    assert found - listed - set(NOT_CACHES) == set(), "a module-level cache Dispatcher.clear() does not own"
    assert listed - found == set(), "PROCESS_CACHES names a cache that is gone"
    for spec in listed:  # each names a clearable object
        mod, _, attr = spec.partition(":")
        obj = getattr(importlib.import_module(mod), attr)
        assert hasattr(obj, "cache_clear") or isinstance(obj, dict), spec
    assert lru.process_caches().keys() <= listed
