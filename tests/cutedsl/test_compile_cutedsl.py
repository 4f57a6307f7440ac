"""CPU compile checks of the CuTe DSL state kernel for sm_90a (H200) and sm_100a (B200).

Nothing here runs a kernel (CI has no GPU): the kernels are compiled for both targets and the PTX
is checked to use only warp-level instructions that exist on both (mma.sync, ldmatrix, cp.async)
and none of the arch-specific ones (wgmma, tcgen05, TMA bulk copies). What runs on the H200 is
verified by tests/gpu/test_cutedsl_gpu.py; the sm_100a build is compile-checked only (not
verified on hardware).
"""

import re

import pytest

pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (pip install 'linattn[cutedsl]')")

from linattn.kernels.cutedsl.chunk_state import KernelKey, cache_info, compile_state_kernel  # noqa: E402

FORBIDDEN = ("wgmma", "tcgen05", "cp.async.bulk", "setmaxnreg")

#: PTX of each key compiled afresh (``dump_dir``: never the library's cache) in this process: the
#: warp-MMA build of a key is also the ``plain`` build the has_initial_state and checkpoint tests
#: compare with, so each key is compiled once per worker instead of up to three times
_PTX: dict = {}


def _ptx(key: KernelKey, tmp_path_factory) -> str:
    if key not in _PTX:
        fn = compile_state_kernel(key, dump_dir=str(tmp_path_factory.mktemp("cutedsl")))
        _PTX[key] = fn.artifacts.PTX
    return _PTX[key]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_state_kernel_compiles_with_warp_mma_only(tmp_path_factory, arch, kda):
    key = KernelKey(128, 128, 64, kda, True, True, "float32", "float32", "int32", "int32", arch)
    ptx = _ptx(key, tmp_path_factory)
    assert f".target {arch}" in ptx
    mma = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", ptx)
    # per chunk and warp: Vn = U - S^T W^T (16 x 64 x 128) and S^T += Vn^T K (16 x 128 x 64): 64 + 64
    assert len(mma) == 128
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx  # K as the B operand of GEMM 2
    assert "cp.async.cg.shared.global" in ptx
    for bad in FORBIDDEN:
        assert bad not in ptx, bad


@pytest.mark.parametrize("K,V,kda,pool,has_h0,sdt,h0dt,idx", [
    (64, 64, False, True, True, "bfloat16", "bfloat16", "int64"),
    (128, 64, True, False, True, "float32", "bfloat16", "int64"),
    (64, 128, False, False, False, "bfloat16", "float32", "int64"),
])
def test_other_declared_configurations_compile_for_sm90a(K, V, kda, pool, has_h0, sdt, h0dt, idx):
    compile_state_kernel(KernelKey(K, V, 64, kda, pool, has_h0, sdt, h0dt, idx, "int64", "sm_90a"))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_state_kernel_with_has_initial_state_compiles_with_a_guarded_h0_load(tmp_path_factory, arch, kda):
    """Pool mode with a has_initial_state mask (issue 16): one byte load of the flag per CTA
    guards the h0 load (no zeroing pass); the MMA count and the instruction set are unchanged."""
    key = KernelKey(128, 128, 64, kda, True, True, "float32", "float32", "int32", "int32", arch, True)
    ptx = _ptx(key, tmp_path_factory)
    assert f".target {arch}" in ptx
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", ptx)) == 128
    assert re.search(r"ld\.global(\.\w+)*\.[bus]8\b", ptx), "the has_initial_state byte is loaded"
    plain = _ptx(key._replace(has_init=False), tmp_path_factory)
    assert not re.search(r"ld\.global(\.\w+)*\.[bus]8\b", plain)
    for bad in FORBIDDEN:
        assert bad not in ptx, bad


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_state_kernel_with_checkpoints_compiles_with_one_more_state_store(tmp_path_factory, kda):
    """Pool mode with state checkpoints (issue 32 item 1; ``ckpt_dtype``): the chunk loop gains one
    guarded store of the state tile (per thread as many ``st.global`` as the final store: 64 at
    K = 128, BV = 64, 4 warps), the MMA count and the instruction set unchanged."""
    key = KernelKey(128, 128, 64, kda, True, True, "float32", "float32", "int32", "int32", "sm_90a", False, "int64")
    ptx = _ptx(key, tmp_path_factory)
    plain = _ptx(key._replace(ckpt_dtype=""), tmp_path_factory)
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", ptx)) == 128
    stores = len(re.findall(r"st\.global", ptx)) - len(re.findall(r"st\.global", plain))
    assert stores == 128 * 64 // 128, stores  # the [BV, K] fp32 tile over 128 threads
    for bad in FORBIDDEN:
        assert bad not in ptx, bad


def test_compiled_kernels_are_cached_by_their_key():
    key = KernelKey(64, 64, 64, False, True, True, "float32", "float32", "int32", "int32", "sm_90a")
    a = compile_state_kernel(key)
    assert compile_state_kernel(key) is a
    assert key in cache_info()
    other = key._replace(arch="sm_100a")
    assert compile_state_kernel(other) is not a
