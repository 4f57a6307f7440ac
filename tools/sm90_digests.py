"""Digests of the sm_90 code of every shipped Triton build, built on a machine without a GPU.

A host-side change (a launcher reshaped, an operand renamed, an unused one passed as None) must not
change the code the H200 runs. This tool holds the code against digests committed beside it:

1. it runs the real launchers (:func:`linattn.kernels.triton.prefill.chunk_prefill`,
   :func:`~linattn.kernels.triton.decode.recurrent_decode`,
   :func:`~linattn.kernels.triton.silu_clamp.silu_and_mul_clamp`) on CPU tensors over the call
   classes of :func:`call_classes`, with every kernel launch recorded instead of run
   (``registry.capture_launches``; the launch fast path is switched off with
   ``LINATTN_FAST_LAUNCH=0`` so that every launch reaches Triton's own binding);
2. builds each distinct launch with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``;
3. disassembles the cubin with the ``cuobjdump`` Triton bundles (``-sass`` and ``-elf``) and
   normalises it (:func:`normalise_sass`): instruction addresses, headers and the kernel name go;
   each instruction keeps its text and its scheduling bits; a kernel-parameter operand
   ``c[0x0][0x...]`` becomes the rank of its parameter among the parameters the code reads (so an
   operand that is never read may go from a placeholder tensor to None, as its constexpr-folded
   parameter leaves the constant bank, without a false alarm; any change in what is read, and in
   which instruction reads it, still shows);
4. hashes the normalised text with the build's warps and shared memory (sha256).

Build ids read ``<call class> :: <kernel>``, e.g. ``prefill gdn bf16 K128 V128 G2 pool :: chunk_state_kernel``.

Usage (from the repository root)::

    .venv-triton-device/bin/python tools/sm90_digests.py              # compare against tools/sm90_digests.json
    .venv-triton-device/bin/python tools/sm90_digests.py --write      # record the digests of this tree
    .venv-triton-device/bin/python tools/sm90_digests.py --tree /tmp/other-checkout --write  # of another tree (one that has registry.compile_inputs)
    .venv-triton-device/bin/python tools/sm90_digests.py --dump /tmp/sass   # also write each normalised build

(``.venv-triton-device``: ``make test``'s second venv, with the GPU machine's Triton, the release the
digests are recorded with; ``--write`` refuses another release unless ``--other-triton`` says so.)

Exit status: 0 when every digest equals the recorded one; 1 with the changed, missing and new
builds listed; 2 when the tool cannot run (no Triton, no bundled cuobjdump, another Triton version
than the one recorded).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "sm90_digests.json"
#: bump when :func:`normalise_sass` changes: digests of another normalisation are not comparable
NORMALISATION = 1
TARGET = ("cuda", 90, 32)


# -- the call classes -------------------------------------------------------------------------

class CallClass(NamedTuple):
    """One call of a shipped launcher, named by what decides its builds."""

    name: str
    run: Callable[[], object]


def _prefill_call(family: str, dtype_name: str, K: int, V: int, group: int, mode: str = "pool",
                  variant: str = "") -> CallClass:
    """``chunk_prefill`` on 70 tokens in two sequences (5 and 65: a partial and a full chunk).

    ``mode``: ``pool``, ``pool+has_init``, ``dense`` (no initial state) or ``dense+h0``.
    ``variant``: one departure from the production call (``kv`` state layout, ``folded`` grid,
    ``sm120`` device (less shared memory: the unpipelined state kernel), ``i64`` index tensors,
    ``pool-bf16``, ``no-l2norm``, ``ext-state`` (a replacement state kernel, as the CuTe DSL
    backend passes), ``fused`` (the fused prefill, which the planner picks for GDN's bf16 where its grid
    fills the SMs: two sequences at 32 value heads do not; KDA's: prefill.FUSED_KDA_DEFAULT)), ``ckpt``
    (state checkpoints every 64 tokens, the ``HAS_CKPT`` builds, bf16 only: the 65-token sequence's to slot 1),
    ``fused+ckpt`` (both)."""
    import torch

    from linattn.capabilities import profile

    dt = getattr(torch, dtype_name)
    HV = 32
    H = HV // group
    lens, N = (5, 65), 2
    T = sum(lens)
    idt = torch.int64 if variant == "i64" else torch.int32
    layout = "kv" if variant == "kv" else "vk"
    sshape = (HV, K, V) if layout == "kv" else (HV, V, K)
    pdt = torch.bfloat16 if variant == "pool-bf16" else torch.float32

    def run():
        kw = dict(q=torch.zeros(T, H, K, dtype=dt), k=torch.zeros(T, H, K, dtype=dt),
                  v=torch.zeros(T, HV, V, dtype=dt),
                  g=torch.zeros(T, HV, K) if family == "kda" else torch.zeros(T, HV),
                  beta=torch.zeros(T, HV), cu_seqlens=torch.tensor([0, lens[0], T], dtype=idt),
                  scale=0.1, use_qk_l2norm=variant != "no-l2norm", state_layout=layout,
                  caps=profile("sm120" if variant == "sm120" else "sm90"),
                  layout="folded" if variant == "folded" else "split")
        if mode.startswith("pool"):
            kw.update(state_pool=torch.zeros(3, *sshape, dtype=pdt), initial_state=None,
                      state_indices=torch.tensor([2, 0], dtype=idt))
            if mode == "pool+has_init":
                kw["has_initial_state"] = torch.tensor([True, False])
        else:
            kw.update(state_pool=None, state_indices=None,
                      initial_state=torch.zeros(N, *sshape) if mode == "dense+h0" else None)
        if variant == "ext-state":
            kw["state_kernel"] = lambda **_: None
        if variant in ("fused", "fused+ckpt"):
            kw["fused"] = True
        if variant.endswith("ckpt"):
            kw.update(checkpoint_every=64, checkpoint_indices=torch.tensor([[-1], [1]], dtype=idt))
        from linattn.kernels.triton.prefill import chunk_prefill

        chunk_prefill(family, **kw)

    parts = ["prefill", family, {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype_name],
             f"K{K}", f"V{V}", f"G{group}", mode] + ([variant] if variant else [])
    return CallClass(" ".join(parts), run)


def _decode_call(gate: str, K: int, V: int, n_seq: int, variant: str = "") -> CallClass:
    """``recurrent_decode`` (one token per sequence unless the variant says otherwise).

    ``variant``: ``gates`` (precomputed g/beta and has_initial_state), ``spec`` (per-token slots,
    accepted counts, intermediate states, 3 tokens), ``misc`` (lower bound, no l2norm, ``kv`` state
    layout, no state update, folded grid), ``pool-bf16`` (a bf16 state pool: its own row of
    ``decode.PINNED``)."""
    import torch

    from linattn.capabilities import profile

    H, HV, T = 16, 32, 3 if variant == "spec" else 1
    bf = torch.bfloat16
    gshape = (n_seq, T, HV, K) if gate == "kda" else (n_seq, T, HV)
    layout = "kv" if variant == "misc" else "vk"
    sshape = (HV, K, V) if layout == "kv" else (HV, V, K)

    def run():
        kw = dict(gate=gate, q=torch.zeros(n_seq, T, H, K, dtype=bf), k=torch.zeros(n_seq, T, H, K, dtype=bf),
                  v=torch.zeros(n_seq, T, HV, V, dtype=bf),
                  state_pool=torch.zeros(n_seq * T + 1, *sshape, dtype=bf if variant == "pool-bf16" else torch.float32),
                  state_indices=torch.zeros(n_seq, dtype=torch.int32), scale=None, state_layout=layout,
                  caps=profile("sm90"), layout="folded" if variant == "misc" else "split")
        if variant == "gates":
            kw.update(g=torch.zeros(gshape), beta=torch.zeros(n_seq, T, HV),
                      has_initial_state=torch.ones(n_seq, dtype=torch.bool))
        else:
            kw.update(a=torch.zeros(gshape, dtype=bf), b=torch.zeros(n_seq, T, HV, dtype=bf),
                      A_log=torch.zeros(HV), dt_bias=torch.zeros(HV, *((K,) if gate == "kda" else ())))
        if variant == "spec":
            kw.update(state_indices=torch.zeros(n_seq, T, dtype=torch.int32),
                      num_accepted_tokens=torch.ones(n_seq, dtype=torch.int32),
                      intermediate_states=torch.zeros(n_seq, T, *sshape),
                      intermediate_state_indices=torch.arange(n_seq, dtype=torch.int32))
        if variant == "misc":
            kw.update(lower_bound=-5.0, use_qk_l2norm=False, disable_state_update=True)
        from linattn.kernels.triton.decode import recurrent_decode

        recurrent_decode(**kw)

    parts = ["decode", gate, f"K{K}", f"V{V}", f"N{n_seq}"] + ([variant] if variant else [])
    return CallClass(" ".join(parts), run)


def _silu_call(M: int, D: int, limit: Optional[float], dtype_name: str) -> CallClass:
    import torch

    from linattn.capabilities import profile

    def run():
        from linattn.kernels.triton.silu_clamp import silu_and_mul_clamp

        silu_and_mul_clamp(torch.zeros(M, 2 * D, dtype=getattr(torch, dtype_name)), limit,
                           caps=profile("sm90"), layout="split")

    return CallClass(f"silu_clamp M{M} D{D} {'limit' if limit is not None else 'no-limit'} {dtype_name}", run)


def call_classes() -> Iterator[CallClass]:
    """The representative call classes (module docstring; the report lists how many builds).

    Prefill: every (family, q/k/v dtype, K, V) over the pinned head dims in pool mode (GDN at GVA
    group size 2, KDA at 1); at K = V = 128 (the production shape) every state mode (pool,
    has_initial_state, dense with and without h0) at every GVA group class (GDN 1, 2, 4; KDA 1,
    2) and, one at a time, each other departure that selects other code (state layout, grid layout,
    a device with less shared memory, int64 index tensors, a bf16 pool, no l2norm, a replacement
    state kernel, state checkpoints) and the bf16 fused prefill (GDN's, KDA's) in every state mode
    (and with checkpoints). Decode: both gates at the pinned K = V = 128 (small and large batch class:
    their two tile configs) plus K = V = 64 and 256, and the flag classes (precomputed gates,
    speculative decode, the rest, a bf16 pool). The SwiGLU clamp: its block classes with and without limit."""
    dtypes = ("bfloat16", "float16", "float32")
    dims = (64, 128, 256)
    for family in ("gdn", "kda"):
        group = 2 if family == "gdn" else 1
        for dt in dtypes:
            for K in dims:
                for V in dims:
                    yield _prefill_call(family, dt, K, V, group)
    for family, groups in (("gdn", (1, 2, 4)), ("kda", (1, 2))):
        for dt in dtypes:
            for group in groups:
                for mode in ("pool", "pool+has_init", "dense", "dense+h0"):
                    if (group, mode) != ((2 if family == "gdn" else 1), "pool"):  # in the sweep above
                        yield _prefill_call(family, dt, 128, 128, group, mode)
            main = 2 if family == "gdn" else 1
            for variant in ("kv", "folded", "sm120", "i64", "pool-bf16", "no-l2norm", "ext-state", "ckpt"):
                if variant == "ext-state" and dt != "bfloat16":
                    continue  # a replacement state kernel runs on the bf16 path only
                if variant == "ckpt" and dt != "bfloat16":
                    continue  # the HAS_CKPT builds' code is held at the shipped dtype (make test's time)
                yield _prefill_call(family, dt, 128, 128, main, "pool", variant)
            if dt == "bfloat16":  # the fused prefill's builds (GDN's shipped, KDA's opt-in), every state mode
                for mode in ("pool", "pool+has_init", "dense", "dense+h0"):
                    yield _prefill_call(family, dt, 128, 128, main, mode, "fused")
                yield _prefill_call(family, dt, 128, 128, main, "pool", "fused+ckpt")
    for gate in ("gdn", "kda"):
        for n_seq in (1, 64):
            for variant in ("", "gates", "spec", "misc", "pool-bf16"):
                yield _decode_call(gate, 128, 128, n_seq, variant)
        for d in (64, 256):
            yield _decode_call(gate, d, d, 64)
    for M, D in ((8, 18432), (8, 1000), (4, 100), (4, 16)):
        for limit in (None, 7.0):
            yield _silu_call(M, D, limit, "bfloat16")
    yield _silu_call(8, 1000, 7.0, "float32")


# -- building and digesting -------------------------------------------------------------------

class Build(NamedTuple):
    """What ``triton.compile`` needs for one launch (plain data: it crosses to a worker)."""

    kernel: str  # "module:attribute"
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict

    def key(self) -> str:
        return repr((self.kernel, sorted(self.signature.items()), sorted(self.constexprs.items(), key=repr),
                     sorted(self.attrs.items()), sorted(self.options.items())))


def _build_of(launch) -> Build:
    """The compile inputs of a captured launch (``registry.compile_inputs``)."""
    from linattn.kernels.triton.registry import compile_inputs

    fn = launch.fn
    signature, constexprs, attrs = compile_inputs(launch)
    options = {k: v for k, v in launch.options.items() if v is not None}
    return Build(f"{fn.fn.__module__}:{fn.fn.__name__}", signature, constexprs, attrs, options)


def cuobjdump() -> Optional[str]:
    """Path of the cuobjdump bundled with Triton (None if absent)."""
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return None
    path = Path(nv.__file__).parent / "bin" / "cuobjdump"
    return str(path) if path.exists() else None


_INSN = re.compile(r"^\s*/\*[0-9a-f]+\*/\s*(.*?)\s*;?\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
_CBANK = re.compile(r"c\[0x0\]\[(0x[0-9a-f]+)\]")
_KPARAM = re.compile(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)")
_PARAM_CBANK = re.compile(r"EIATTR_PARAM_CBANK\s+Format:\s*\S+\s+Value:\s*0x[0-9a-f]+\s+(0x[0-9a-f]+)")


def normalise_sass(sass: str, elf: str) -> list[str]:
    """One line per instruction: its text (parameter operands by rank) and its control bits.

    ``sass``: ``cuobjdump -sass`` of a one-kernel cubin; ``elf``: ``cuobjdump -elf`` of it (the
    parameters' offsets and sizes, ``EIATTR_KPARAM_INFO``, and the parameter bank's base,
    ``EIATTR_PARAM_CBANK``). Addresses, headers and the kernel name are dropped. A constant-bank
    operand inside the parameter area becomes ``param<r>+<byte>``, ``r`` the rank of its
    parameter's ordinal among the parameters read anywhere in the code.
    """
    m = _PARAM_CBANK.search(elf)
    base = int(m.group(1), 16) & 0xFFFF if m else 0x210
    params = sorted((int(o, 16), int(s, 16), int(n, 16)) for n, o, s in _KPARAM.findall(elf))

    def param_of(addr: int) -> Optional[tuple[int, int]]:
        for off, size, ordinal in params:
            if off <= addr - base < off + size:
                return ordinal, addr - base - off
        return None

    insns: list[list[str]] = []
    for line in sass.splitlines():
        mi = _INSN.match(line)
        if mi:
            insns.append([mi.group(1), ""])
            continue
        mw = _WORD.match(line)
        if mw and insns and not insns[-1][1]:
            insns[-1][1] = f"{int(mw.group(1), 16) >> 41:06x}"  # bits 105..127: stall, yield, barriers, reuse
    read = sorted({p[0] for text, _ in insns for a in _CBANK.findall(text) if (p := param_of(int(a, 16)))})
    rank = {ordinal: r for r, ordinal in enumerate(read)}

    def rename(mc: re.Match) -> str:
        p = param_of(int(mc.group(1), 16))
        return mc.group(0) if p is None else f"c[0x0][param{rank[p[0]]}+{p[1]}]"

    return [f"{_CBANK.sub(rename, text)} ;ctrl={ctrl}" for text, ctrl in insns]


def digest_build(build: Build, dump_dir: Optional[str] = None) -> str:
    """Compile ``build`` for sm_90, disassemble, normalise, hash (runs in a worker process)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    mod, _, attr = build.kernel.partition(":")
    fn = getattr(importlib.import_module(mod), attr)
    src = ASTSource(fn, build.signature, build.constexprs, build.attrs)
    ck = triton.compile(src, target=GPUTarget(*TARGET), options=dict(build.options))
    tool = cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(ck.asm["cubin"])
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        elf = subprocess.run([tool, "-elf", cubin], capture_output=True, text=True, check=True).stdout
    lines = [f"num_warps={ck.metadata.num_warps} shared={ck.metadata.shared}"] + normalise_sass(sass, elf)
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    if dump_dir:
        Path(dump_dir, f"{attr}-{digest[:16]}.sass").write_text(text)
    return digest


def capture(classes) -> dict[str, Build]:
    """Build id -> Build for every launch of every call class (nothing runs on a device)."""
    from linattn.kernels.triton import registry

    out: dict[str, Build] = {}
    for cc in classes:
        with registry.capture_launches() as launches:
            cc.run()
        seen: dict[str, int] = {}
        for launch in launches:
            n = seen[launch.name] = seen.get(launch.name, 0) + 1
            out[f"{cc.name} :: {launch.name}" + (f" #{n}" if n > 1 else "")] = _build_of(launch)
    return out


def compute(jobs: int, dump_dir: Optional[str] = None, select: Optional[str] = None) -> dict[str, str]:
    """Build id -> digest over :func:`call_classes` (``select``: a regex on the call class name)."""
    classes = [c for c in call_classes() if select is None or re.search(select, c.name)]
    builds = capture(classes)
    unique: dict[str, Build] = {}
    for b in builds.values():
        unique.setdefault(b.key(), b)
    keys = list(unique)
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        digests = dict(zip(keys, pool.map(digest_build, [unique[k] for k in keys], [dump_dir] * len(keys))))
    print(f"{len(classes)} call classes, {len(builds)} launches, {len(unique)} distinct builds", file=sys.stderr)
    return {bid: digests[b.key()] for bid, b in sorted(builds.items())}


# -- comparison and the command line -----------------------------------------------------------

def compare(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Lines naming every build whose digest differs, is missing or is new (empty: all equal)."""
    lines = []
    for bid in sorted(set(recorded) | set(current)):
        was, now = recorded.get(bid), current.get(bid)
        if was == now:
            continue
        if was is None:
            lines.append(f"new      {bid}")
        elif now is None:
            lines.append(f"missing  {bid}")
        else:
            lines.append(f"changed  {bid}  ({was[:12]} -> {now[:12]})")
    return lines


def _tree_pythonpath(tree: Path, tmp: str) -> str:
    """A directory on which ``import linattn`` resolves to ``tree``'s sources (its pyproject's
    package-dir mapping, mirrored with symlinks)."""
    import tomllib

    cfg = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = Path(tmp, "linattn")
    root.mkdir()
    for entry in (tree / cfg["linattn"]).iterdir():
        (root / entry.name).symlink_to(entry)
    for pkg, rel in cfg.items():
        if pkg.count(".") == 1:  # linattn.<sub> -> <dir>
            link = root / pkg.split(".")[1]
            if not link.exists():
                link.symlink_to(tree / rel)
    return tmp


def _device_triton() -> str:
    """The GPU machine's Triton release: the sm90 device profile's toolchain (capabilities/profiles.py)."""
    from linattn.capabilities import profile

    return profile("sm90").toolchain.triton


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"record the digests in {DIGESTS.name}")
    ap.add_argument("--json", type=Path, default=DIGESTS, help="the digests file (default: beside this tool)")
    ap.add_argument("--tree", type=Path, help="digest another checkout's kernels (e.g. a git worktree)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel builds")
    ap.add_argument("--dump", help="write each distinct build's normalised code into this directory")
    ap.add_argument("--select", help="only the call classes whose name matches this regex (no --write)")
    ap.add_argument("--other-triton", action="store_true",
                    help="--write with a Triton other than the GPU machine's (its sm90 profile's toolchain); run the tool "
                         "from .venv-triton-device, make test's second venv, otherwise")
    ap.add_argument("--emit", type=Path, help=argparse.SUPPRESS)  # internal: --tree's subprocess
    a = ap.parse_args(argv)
    try:
        import triton
    except ImportError:
        print("sm90_digests: triton is not installed", file=sys.stderr)
        return 2
    if cuobjdump() is None:
        print("sm90_digests: Triton's bundled cuobjdump (triton/backends/nvidia/bin) is missing", file=sys.stderr)
        return 2
    if a.select and a.write:
        print("sm90_digests: --write records every build; drop --select", file=sys.stderr)
        return 2
    device_triton = _device_triton()
    if a.write and triton.__version__ != device_triton and not a.other_triton:
        print(f"sm90_digests: this is triton {triton.__version__}; the digests guard the GPU machine's "
              f"triton {device_triton} (the sm90 profile's toolchain): run --write from .venv-triton-device "
              f"(make test's second venv), or pass --other-triton to record this release", file=sys.stderr)
        return 2
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    recorded = None if (a.write or a.emit) else json.loads(a.json.read_text())
    if recorded and (recorded["triton"], recorded["normalisation"]) != (triton.__version__, NORMALISATION):
        print(f"sm90_digests: {a.json.name} was recorded with triton {recorded['triton']} (normalisation "
              f"{recorded['normalisation']}); this is triton {triton.__version__} (normalisation "
              f"{NORMALISATION}): not comparable; run the tool from .venv-triton-device (the GPU machine's "
              f"triton {device_triton}), or record the base tree's digests with --write there", file=sys.stderr)
        return 2  # before any build: the recorded release is known up front
    t0 = time.time()
    if a.tree is not None:
        with tempfile.TemporaryDirectory() as tmp, tempfile.NamedTemporaryFile(suffix=".json") as out:
            env = dict(os.environ, PYTHONPATH=_tree_pythonpath(a.tree.resolve(), tmp))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--emit", out.name, "--jobs", str(a.jobs)]
            cmd += (["--dump", a.dump] if a.dump else []) + (["--select", a.select] if a.select else [])
            subprocess.run(cmd, env=env, check=True, cwd=tmp)
            current = json.loads(Path(out.name).read_text())
    else:
        current = compute(a.jobs, a.dump, a.select)
        if a.emit:
            a.emit.write_text(json.dumps(current))
            return 0
    record = {"triton": triton.__version__, "target": "cuda:90", "normalisation": NORMALISATION,
              "builds": current}
    print(f"{len(current)} builds digested in {time.time() - t0:.0f} s", file=sys.stderr)
    if a.write:
        a.json.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"wrote {a.json}", file=sys.stderr)
        return 0
    builds = recorded["builds"]
    if a.select:
        builds = {k: v for k, v in builds.items() if re.search(a.select, k.split(" :: ")[0])}
    diff = compare(builds, current)
    for line in diff:
        print(line)
    print(f"{len(diff)} of {len(set(builds) | set(current))} builds differ" if diff else
          f"all {len(current)} builds equal the recorded digests", file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    os.environ["LINATTN_FAST_LAUNCH"] = "0"  # every launch through Triton's binding (captured)
    os.environ.pop("TRITON_INTERPRET", None)
    sys.exit(main())
