"""The CuTe DSL walk of the fused GDN prefill on warpgroup MMAs (``wgmma``, SM90; imports ``cutlass``:
load it only through :mod:`linattn.kernels.cutedsl.fused_walk`, which imports it lazily).

The same walk as :mod:`._fused_walk_kernel` (the maths there and in
:mod:`linattn.kernels.triton.chunk_fused`'s docstring; the same chunk loads, gate factors, output
staging and pool rows, inherited from :class:`FusedWalkKernel`), with the tensor-core products
issued by whole warpgroups: ``BV / 64`` warpgroups per CTA (2 at ``BV = 128``, 1 at ``BV = 64``),
warpgroup ``w`` owning state rows ``64 w .. 64 w + 63`` (value channels). ``S^T [BV, K]`` fp32 stays
in registers as the ``wgmma`` accumulator (m64n128k16: 64 values per thread, as with ``mma.sync``),
and every product that reads it or a product of it takes its A operand from registers
(``wgmma ... .bf16`` with A in registers, FlashAttention-3's RS form); the B operands are read by
``wgmma`` straight from shared memory through descriptors, so no ``ldmatrix``::

    P1, P2  = bf16(c S^T) k^T, bf16(c S^T) q^T      m64n64k16 x 8 each, B k, q  [C, K] K-major
    Vn^T    = bf16(X) Tb^T                          m64n64k16 x 4,      B Tb    [C, C] K-major
    O^T     = P2 diag(fo) + bf16(Vn^T) Aqk^T        m64n64k16 x 4,      B Aqk   [C, C] K-major
    S^T     = dec S^T + bf16(Vn^T diag(fs)) k       m64n128k16 x 4,     B k     [K, C] MN-major

so ``k``'s one shared tile serves as a K-major B (``P1``) and, viewed transposed, an MN-major B
(the update). ``k``, ``q``, ``Tb``, ``Aqk`` sit in 128-byte-swizzled shared memory (the ``wgmma``
canonical layouts; 1,024-byte aligned); ``v`` keeps the padded rows of the ``mma.sync`` kernel and is
read as ``v^T`` straight into ``X``'s accumulator layout by ``ldmatrix.trans`` (8 x 8 bf16 tiles: a
row of 8 value channels is 16 contiguous bytes), then overwritten by ``O^T`` through
``stmatrix.trans`` (each warp writes back only the tiles it read) for the coalesced output stores.
Three ``wgmma`` groups per chunk (``P1, P2``; ``Vn^T``; ``O^T`` then the update, committed apart
so that ``O^T`` is staged while the update runs); ``wgmma.fence`` before each group (its
accumulators and A registers were written by ordinary instructions), ``fence.proxy.async`` after
each thread's ``cp.async`` and zero fills land (``wgmma`` reads shared memory through the async
proxy). Loads stay ``cp.async`` by every thread, one chunk ahead (no producer warp, no TMA).

Its outputs and pool rows are bitwise those of :mod:`._fused_walk_kernel` (the same bf16 operands, fp32
products summed in the same order). Build resources and speed: docs/performance.md, 'The walk on warpgroup MMAs'.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup

from ._fused_walk_kernel import C, FusedWalkKernel
from ._state_kernel import store_rows


class FusedWalkWgmmaKernel(FusedWalkKernel):
    """Static configuration of one compiled ``wgmma`` walk: :class:`FusedWalkKernel`'s arguments
    (``BV`` 64 or 128: one or two warpgroups), the gate factors always by warp shuffle scans."""

    def __init__(self, K: int, V: int, BV: int, pool: bool, has_h0: bool, has_init: bool, g_min: float):
        super().__init__(K, V, BV, pool, has_h0, has_init, g_min, warp_factors=True)
        assert BV in (64, 128) and K % 64 == 0, "one warpgroup per 64 state rows; 128-byte swizzled key rows"
        self.NWG = BV // 64

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, g_ptr: cute.Pointer,
        tmb_ptr: cute.Pointer, aqk_ptr: cute.Pointer, rk_ptr: cute.Pointer, qs_ptr: cute.Pointer,
        o_ptr: cute.Pointer, cu_ptr: cute.Pointer, sidx_ptr: cute.Pointer, hinit_ptr: cute.Pointer,
        h0_ptr: cute.Pointer, ht_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, svt: Int64, svh: Int64, sgt: Int64, sgh: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32,
        stream,
    ):
        K, BV, NT = self.K, self.BV, self.NT
        rs = warpgroup.OperandSource.RMEM
        # N = C (P1, P2, Vn^T, O^T: B K-major) and N = K (the update: B = k, MN-major)
        mma_c = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32, (self.NWG, 1, 1), (64, C), rs)
        mma_k = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.MN, Float32, (self.NWG, 1, 1), (64, K), rs)
        g2s16 = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16, num_bits_per_copy=128)
        g2s4 = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
        st16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        tk, tv, tc = K // 8, BV // 8, C // 8  # threads per row (8 bf16 = 16 bytes each)
        copy_k = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((NT // tk, tk), stride=(tk, 1)), cute.make_layout((1, 8)))
        copy_v = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((NT // tv, tv), stride=(tv, 1)), cute.make_layout((1, 8)))
        copy_c = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((NT // tc, tc), stride=(tc, 1)), cute.make_layout((1, 8)))
        store_o = cute.make_tiled_copy_tv(
            st16, cute.make_layout((NT // tv, tv), stride=(tv, 1)), cute.make_layout((1, 8)))
        nvb = self.V // BV
        self.kernel(
            q_ptr, k_ptr, v_ptr, g_ptr, tmb_ptr, aqk_ptr, rk_ptr, qs_ptr, o_ptr, cu_ptr, sidx_ptr, hinit_ptr,
            h0_ptr, ht_ptr, sqt, sqh, skt, skh, svt, svh, sgt, sgh, s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k,
            N, HV, GROUP, mma_c, mma_k, copy_k, copy_v, copy_c, store_o, g2s4,
        ).launch(grid=[N * HV * nvb, 1, 1], block=[NT, 1, 1], stream=stream)

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, g_ptr: cute.Pointer,
        tmb_ptr: cute.Pointer, aqk_ptr: cute.Pointer, rk_ptr: cute.Pointer, qs_ptr: cute.Pointer,
        o_ptr: cute.Pointer, cu_ptr: cute.Pointer, sidx_ptr: cute.Pointer, hinit_ptr: cute.Pointer,
        h0_ptr: cute.Pointer, ht_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, svt: Int64, svh: Int64, sgt: Int64, sgh: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32,
        mma_c: cute.TiledMma, mma_k: cute.TiledMma, copy_k: cute.TiledCopy, copy_v: cute.TiledCopy,
        copy_c: cute.TiledCopy, store_o: cute.TiledCopy, g2s4: cute.CopyAtom,
    ):
        K, V, BV, PV = self.K, self.V, self.BV, self.PV
        nvb = V // BV
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        i_v = bid % nvb
        i_nh = bid // nvb
        i_n = i_nh // HV
        i_hv = i_nh % HV
        i_h = i_hv // GROUP
        v0 = i_v * BV

        mcu = cute.make_tensor(cu_ptr, cute.make_layout(N + 1))
        bos = Int64(mcu[i_n])
        eos = Int64(mcu[i_n + 1])
        seqlen = Int32(eos - bos)
        nc = (seqlen + (C - 1)) // C
        hv64 = Int64(i_hv)

        # ---------------- shared memory --------------------------------------------------------
        # k, q [C, K] and Tb, Aqk [C, C], two stages each, in wgmma's 128-byte-swizzled K-major
        # layout (8-row x 64-column atoms; the swizzle on the pointer, byte addresses)
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        lay_kq = cute.tile_to_shape(atom, (C, K, 2), order=(0, 1, 2))
        lay_cc = cute.tile_to_shape(atom, (C, C, 2), order=(0, 1, 2))
        smem = cutlass.utils.SmemAllocator()
        sK = smem.allocate_tensor(BFloat16, lay_kq.outer, 1024, swizzle=lay_kq.inner)
        sQ = smem.allocate_tensor(BFloat16, lay_kq.outer, 1024, swizzle=lay_kq.inner)
        sT = smem.allocate_tensor(BFloat16, lay_cc.outer, 1024, swizzle=lay_cc.inner)
        sA = smem.allocate_tensor(BFloat16, lay_cc.outer, 1024, swizzle=lay_cc.inner)
        sV = smem.allocate_tensor(BFloat16, cute.make_layout((C, BV, 2), stride=(PV, 1, C * PV)), 16)
        sRow = smem.allocate_tensor(Float32, cute.make_layout((C, 4, 2), stride=(1, C, 4 * C)), 16)
        sFac = smem.allocate_tensor(Float32, cute.make_layout((C, 3 * self.NW), stride=(1, C)), 16)
        lane = tid % 32
        sFacW = cute.make_tensor(sFac.iterator + (tid // 32) * (3 * C), cute.make_layout((C, 3), stride=(1, C)))
        # k viewed as (key channel, row): the update's MN-major B operand (the same bytes)
        sKt = cute.make_tensor(sK.iterator, cute.select(sK.layout, mode=[1, 0, 2]))
        # v viewed as (value channel, row): read into X's accumulator layout by ldmatrix.trans (v's rows of 8
        # value channels are 16 contiguous bytes; the transpose hands each thread its pairs of rows)
        sVt = cute.make_tensor(sV.iterator, cute.select(sV.layout, mode=[1, 0, 2]))

        # ---------------- MMA partitions -------------------------------------------------------
        thr_mc = mma_c.get_slice(tid)
        thr_mk = mma_k.get_slice(tid)
        acc_S = cute.make_rmem_tensor(thr_mk.partition_shape_C((BV, K)), Float32)
        tScS = thr_mk.partition_C(cute.make_identity_tensor((BV, K)))
        acc_X = cute.make_rmem_tensor(thr_mc.partition_shape_C((BV, C)), Float32)  # P1, then X
        acc_O = cute.make_rmem_tensor(thr_mc.partition_shape_C((BV, C)), Float32)  # P2, then O^T
        acc_N = cute.make_rmem_tensor(thr_mc.partition_shape_C((BV, C)), Float32)  # Vn^T
        tPcP = thr_mc.partition_C(cute.make_identity_tensor((BV, C)))
        # B operands (descriptors; modes (value, n tile, k block, stage))
        tKb = thr_mc.make_fragment_B(thr_mc.partition_B(sK))
        tQb = thr_mc.make_fragment_B(thr_mc.partition_B(sQ))
        tTb = thr_mc.make_fragment_B(thr_mc.partition_B(sT))
        tAb = thr_mc.make_fragment_B(thr_mc.partition_B(sA))
        tUb = thr_mk.make_fragment_B(thr_mk.partition_B(sKt))

        # ---------------- copy partitions (loads: :meth:`load_chunk`; the output rows) ---------
        thr_k = copy_k.get_slice(tid)
        thr_v = copy_v.get_slice(tid)
        thr_c = copy_c.get_slice(tid)
        thr_o = store_o.get_slice(tid)
        tKsK, tQsQ = thr_k.partition_D(sK), thr_k.partition_D(sQ)
        tKc = thr_k.partition_S(cute.make_identity_tensor((C, K)))
        tVsV = thr_v.partition_D(sV)
        tVc = thr_v.partition_S(cute.make_identity_tensor((C, BV)))
        tTsT, tAsA = thr_c.partition_D(sT), thr_c.partition_D(sA)
        tCc = thr_c.partition_S(cute.make_identity_tensor((C, C)))
        tOs = thr_o.partition_S(sV)
        # v^T in, O^T out: 8 x 8 transposing ldmatrix / stmatrix in the accumulators' layout
        s2r_v = cute.make_tiled_copy_C(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16), mma_c)
        thr_s2r_v = s2r_v.get_slice(tid)
        tVtS = thr_s2r_v.partition_S(sVt)
        r2s_o = cute.make_tiled_copy_C(
            cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16), mma_c)
        thr_r2s_o = r2s_o.get_slice(tid)
        tOtD = thr_r2s_o.partition_D(sVt)
        tOc = thr_o.partition_S(cute.make_identity_tensor((C, BV)))

        # ---------------- entering state (as the mma.sync walk) -------------------------------
        live, slot, keep = self.entering_state(acc_S, tScS, i_n, N, sidx_ptr, hinit_ptr, h0_ptr, s0_p, s0_h, s0_v,
                                               s0_k, hv64, v0)

        heads = (Int64(i_h) * sqh, Int64(i_h) * skh, hv64 * svh + Int64(v0), hv64 * sgh)
        if nc > 0:  # prologue: chunk 0 into stage 0
            self.load_chunk(0, 0, bos, eos, q_ptr, k_ptr, v_ptr, g_ptr, tmb_ptr, aqk_ptr, rk_ptr, qs_ptr,
                            sqt, skt, svt, sgt, heads, hv64, HV, tid, copy_k, copy_v, copy_c, g2s4, thr_k, thr_v,
                            thr_c, sRow, tKsK, tQsQ, tKc, tVsV, tVc, tTsT, tAsA, tCc)
        cute.arch.cp_async_commit_group()

        for t in cutlass.range(nc, unroll=1):
            stage = t % 2
            if t + 1 < nc:
                self.load_chunk(t + 1, 1 - stage, bos, eos, q_ptr, k_ptr, v_ptr, g_ptr, tmb_ptr, aqk_ptr, rk_ptr,
                                qs_ptr, sqt, skt, svt, sgt, heads, hv64, HV, tid, copy_k, copy_v, copy_c, g2s4,
                                thr_k, thr_v, thr_c, sRow, tKsK, tQsQ, tKc, tVsV, tVc, tTsT, tAsA, tCc)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            # this thread's cp.async writes and zero fills, made visible to wgmma's (async proxy) reads
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()

            # (a) the chunk's gate and scale factors (each warp its own copy; no CTA barrier)
            dec, cs = self.warp_factors_of(stage, lane, sRow, sFacW)
            cute.arch.sync_warp()

            self.chunk_products(stage, stage, mma_c, mma_k, acc_S, acc_X, acc_O, acc_N, tPcP, sFacW, dec, cs, keep,
                                tKb, tQb, tTb, tAb, tUb, s2r_v, thr_s2r_v, tVtS, r2s_o, thr_r2s_o, tOtD)
            cute.arch.sync_threads()

            # (f) the output rows of this chunk: sV (now O^T as [row, value]) -> o[row, hv, v0:v0+BV]
            self.output_rows(o_ptr, bos + Int64(t * C), eos, HV, hv64, v0, thr_o, tOs, tOc, store_o, stage)
            cute.arch.sync_threads()  # the next iteration's loads overwrite this stage

        cute.arch.cp_async_wait_group(0)

        # ---------------- final state ----------------------------------------------------------
        if live:
            ht = cute.make_tensor(ht_ptr + (slot * st_p + hv64 * st_h + Int64(v0) * Int64(st_v)),
                                  cute.make_layout((BV, K), stride=(st_v, st_k)))
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                ht[tScS[i]] = acc_S[i].to(ht.element_type)

    @cute.jit
    def chunk_products(self, ks, stage, mma_c, mma_k, acc_S, acc_X, acc_O, acc_N, tPcP, sFacW, dec, cs, keep, tKb, tQb,
                       tTb, tAb, tUb, s2r_v, thr_s2r_v, tVtS, r2s_o, thr_r2s_o, tOtD):
        """One chunk's products on the warpgroups (module docstring, (b) to (e)): ``acc_S`` advanced in place,
        ``O^T`` (times ``keep``) into the value tile; every group waited for on return. The k, q, v tiles
        (``tKb, tQb, tUb``, ``tVtS`` / ``tOtD``) are read from stage ``ks``, ``Tb`` and ``Aqk`` from ``stage``
        (this kernel: the same; :mod:`._fused_prefill_kernel` keeps more k, q, v stages)."""
        # (b) P1 = bf16(c S^T) k^T, P2 = bf16(c S^T) q^T  (F44: c = 1 unless a query row reaches 2**32)
        rS = cute.make_fragment_like(acc_S, BFloat16)
        rS.store((acc_S.load() * cs).to(BFloat16))
        tSA = self.wg_acc_as_a(rS)
        warpgroup.fence()
        self.wg_gemm(mma_c, acc_X, tSA, tKb[None, None, None, ks], True)
        self.wg_gemm(mma_c, acc_O, tSA, tQb[None, None, None, ks], True)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

        # (c) X = v^T - P1 diag(fx); Vn^T = bf16(X) Tb^T
        rV = cute.make_fragment_like(acc_X, BFloat16)  # v^T (value channel, row), X's layout
        cute.copy(s2r_v, tVtS[None, None, None, ks], thr_s2r_v.retile(rV))
        for i in cutlass.range_constexpr(cute.size(acc_X)):
            acc_X[i] = Float32(rV[i]) - acc_X[i] * sFacW[tPcP[i][1], 0]
        rX = cute.make_fragment_like(acc_X, BFloat16)
        rX.store(acc_X.load().to(BFloat16))
        warpgroup.fence()
        self.wg_gemm(mma_c, acc_N, self.wg_acc_as_a(rX), tTb[None, None, None, stage], True)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

        # (d) O^T = P2 diag(fo) + bf16(Vn^T) Aqk^T; (e) S^T = dec S^T + bf16(Vn^T diag(fs)) k
        for i in cutlass.range_constexpr(cute.size(acc_O)):
            acc_O[i] = acc_O[i] * sFacW[tPcP[i][1], 1]
        rN = cute.make_fragment_like(acc_N, BFloat16)
        rN.store(acc_N.load().to(BFloat16))
        for i in cutlass.range_constexpr(cute.size(acc_N)):
            acc_N[i] = acc_N[i] * sFacW[tPcP[i][1], 2]
        rU = cute.make_fragment_like(acc_N, BFloat16)
        rU.store(acc_N.load().to(BFloat16))
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            acc_S[i] = acc_S[i] * dec
        warpgroup.fence()
        self.wg_gemm(mma_c, acc_O, self.wg_acc_as_a(rN), tAb[None, None, None, stage], False)
        warpgroup.commit_group()
        self.wg_gemm(mma_k, acc_S, self.wg_acc_as_a(rU), tUb[None, None, None, ks], False)
        warpgroup.commit_group()
        warpgroup.wait_group(1)  # O^T done; the update still running
        # O^T into this stage's value tile (each warp overwrites only the elements it read in (c))
        rO = cute.make_fragment_like(acc_O, BFloat16)
        rO.store((acc_O.load() * keep).to(BFloat16))
        cute.copy(r2s_o, thr_r2s_o.retile(rO), tOtD[None, None, None, ks])
        warpgroup.wait_group(0)

    @cute.jit
    def output_rows(self, o_ptr, row0, eos, HV, hv64, v0, thr_o, tOs, tOc, store_o, ks):
        """The chunk's output rows from stage ``ks`` of the value tile (``O^T`` as ``[row, value]``) to
        ``o[row0 + r, hv, v0 : v0 + BV]`` by 16-byte stores, the rows inside the sequence (``eos``) only;
        ``v0`` None: the head's first column (a CTA per whole value head)."""
        V = self.V
        head = row0 * Int64(HV * V) + hv64 * Int64(V)
        if const_expr(v0 is not None):
            head = head + Int64(v0)
        store_rows(o_ptr + head, HV * V, row0, eos, self.BV, thr_o, tOs, tOc, store_o, ks)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def wg_acc_as_a(self, r: cute.Tensor) -> cute.Tensor:
        """View a wgmma accumulator-layout fragment ``((2, 2, N / 8), M, N_tiles)`` as a register A
        operand ``((2, 2, 2), M, (N / 16, N_tiles))``: two neighbouring n8 columns form one k16 slice."""
        d = cute.logical_divide(r.layout, ((None, None, 2), None, None))
        lay = cute.make_layout(
            ((d.shape[0][0], d.shape[0][1], d.shape[0][2][0]), d.shape[1], (d.shape[0][2][1], d.shape[2])),
            stride=((d.stride[0][0], d.stride[0][1], d.stride[0][2][0]), d.stride[1],
                    (d.stride[0][2][1], d.stride[2])),
        )
        return cute.make_tensor(r.iterator, lay)

    @cute.jit
    def wg_gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
                zero: cutlass.Constexpr[bool]):
        """``acc (+)= A B`` over all k blocks of ``tA`` (registers) and ``tB`` (descriptors), issued
        into the open wgmma group (the caller fences, commits and waits); ``zero``: the first k block
        overwrites ``acc`` (wgmma's scale-d 0) instead of adding to it."""
        mma = cute.make_mma_atom(tiled_mma.op)
        mma.set(warpgroup.Field.ACCUMULATE, not zero)
        for kb in cutlass.range_constexpr(cute.size(tA.shape[2])):
            cute.gemm(mma, acc, tA[None, None, kb], tB[None, None, kb], acc)
            mma.set(warpgroup.Field.ACCUMULATE, True)
