"""The one-kernel GDN prefill in CuTe DSL (SM90; imports ``cutlass``: load it only through
:mod:`linattn.kernels.cutedsl.fused_prefill`, which imports it lazily).

The prep (:mod:`._fused_prep_kernel`) and the ``wgmma`` walk (:mod:`._fused_walk_wgmma_kernel`) in one
warp-specialized kernel: one CTA of three warpgroups per (sequence, value head), ``V = BV = 128``::

    warpgroup 0 (prep, 128 threads, few registers)      warpgroups 1, 2 (walk, 256 threads)
      chunk t (k, q, v stage t % 3, products t % 2):      chunk t from its stages:
        wait until the walk has left chunk t - 2            wait until chunk t's stage is full
        chunk t + 1's k, q, v rows by cp.async (rows        the gate factors, then P1, P2, Vn^T,
          past the sequence: 0)
        the gates' prefix sums, beta, the raw g row           O^T and the state update on wgmma
        the q / k norms (F44: rewritten rows, scale           (the state S^T fp32 in registers for
          folded in: rk = uk, sq = 1)                         the whole sequence)
        K K^T, Q K^T (warp mma.sync), the gate tiles:       O^T through the v tile to the output
          Aqk -> the stage (bf16), A -> fp32 A^T            leave the stage
        (I + A)^-1 blockwise, Tm diag(beta) -> the stage
        rk, qs -> the stage's row vectors; stage full

so nothing per chunk goes to HBM: q, k, v, g, beta are read once, o and the pool row written once. The
stages are handed over by named barriers (a stage's "full" barrier: the prep's 128 threads arrive, the
walk's 256 wait; its "empty" barrier the other way round), the prep one chunk ahead of the walk. The
prep's generic shared-memory writes are made visible to the walk's ``wgmma`` (the async proxy) by
``fence.proxy.async`` before its arrival. ``setmaxnreg`` moves registers from the prep warpgroup to
the walk's (``regs``: 128 x (prep + 2 walk) <= 64,512).

The maths is :mod:`linattn.kernels.triton.chunk_fused`'s (module docstring); each stage's products are
the two kernels' own, in the same order, so on inputs whose rows need no F44 scale its outputs and pool
rows are bitwise those of the prep + ``wgmma`` walk pair. Resources and speed: docs/performance.md,
'The one-kernel prefill'.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup

from ._fused_prep_kernel import FusedPrepKernel
from ._fused_walk_kernel import C
from ._fused_walk_wgmma_kernel import FusedWalkWgmmaKernel

PREP_THREADS = 128
WALK_THREADS = 256
THREADS = PREP_THREADS + WALK_THREADS
#: named barriers (0 is the CTA's): stage s full at BAR_FULL + s, empty at BAR_EMPTY + s; each warpgroup's own
BAR_FULL, BAR_EMPTY, BAR_PREP, BAR_WALK = 1, 3, 5, 6
#: stages of the k, q, v tiles (the prep loads chunk t + 1 while it works on chunk t and the walk on chunk
#: t - 1) and of the prep's products (Tb, Aqk, the row vectors: chunks t and t - 1)
KQV_STAGES, PRODUCT_STAGES = 3, 2


class FusedPrefillKernel(FusedWalkWgmmaKernel):
    """Static configuration of one compiled one-kernel prefill.

    Args:
        K, V: head dims (128 each).
        pool, has_h0, has_init: as :class:`._fused_walk_kernel.FusedWalkKernel`.
        g_min: the floor of the log decays.
        l2norm, beta_bf16: as :class:`._fused_prep_kernel.FusedPrepKernel`.
        regs: registers per thread of the prep and walk warpgroups (``setmaxnreg``; the host side's
            ``fused_prefill.REGS`` by default).
        prep_mma: the prep's ``K K^T``, ``Q K^T``: ``"wgmma"`` (the prep warpgroup's, operands from shared
            memory) or ``"sync"`` (its four warps' ``mma.sync``, the prep kernel's code).
    """

    def __init__(self, K: int, V: int, pool: bool, has_h0: bool, has_init: bool, g_min: float, l2norm: bool,
                 beta_bf16: bool, regs: tuple, prep_mma: str = "sync"):
        super().__init__(K, V, V, pool, has_h0, has_init, g_min)
        assert V == 128 and K == 128, "one CTA per (sequence, value head): BV = V = 128"
        assert regs[0] % 8 == 0 and regs[1] % 8 == 0 and regs[0] + 2 * regs[1] <= 504
        assert prep_mma in ("wgmma", "sync")
        self.regs = regs
        self.prep_mma = prep_mma
        self.prep = FusedPrepKernel(K, l2norm, beta_bf16, g_min, solve="one_head",
                                    barrier=(BAR_PREP, PREP_THREADS), fold_scale=True, stream_norm=True)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, g_ptr: cute.Pointer,
        beta_ptr: cute.Pointer, o_ptr: cute.Pointer, cu_ptr: cute.Pointer, sidx_ptr: cute.Pointer,
        hinit_ptr: cute.Pointer, h0_ptr: cute.Pointer, ht_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, svt: Int64, svh: Int64, sgt: Int64, sgh: Int64,
        sbt: Int64, sbh: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32, scale: Float32,
        stream,
    ):
        K, BV = self.K, self.BV
        rs = warpgroup.OperandSource.RMEM
        mma_c = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32, (self.NWG, 1, 1), (64, C), rs)
        mma_k = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.MN, Float32, (self.NWG, 1, 1), (64, K), rs)
        if const_expr(self.prep_mma == "wgmma"):
            mma_p = sm90_utils.make_trivial_tiled_mma(
                BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (64, C),
                warpgroup.OperandSource.SMEM)
        else:
            mma_p = cute.make_tiled_mma(
                warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)), (4, 1, 1), permutation_mnk=(64, 16, 16))
        g2s16 = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16, num_bits_per_copy=128)
        st16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        tk, tv = K // 8, BV // 8  # threads per row (8 bf16 = 16 bytes each)
        copy_k = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((PREP_THREADS // tk, tk), stride=(tk, 1)), cute.make_layout((1, 8)))
        copy_v = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((PREP_THREADS // tv, tv), stride=(tv, 1)), cute.make_layout((1, 8)))
        store_o = cute.make_tiled_copy_tv(
            st16, cute.make_layout((WALK_THREADS // tv, tv), stride=(tv, 1)), cute.make_layout((1, 8)))
        self.kernel(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, cu_ptr, sidx_ptr, hinit_ptr, h0_ptr, ht_ptr,
            sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k,
            N, HV, GROUP, scale, mma_c, mma_k, mma_p, copy_k, copy_v, store_o,
        ).launch(grid=[N * HV, 1, 1], block=[THREADS, 1, 1], stream=stream)

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, g_ptr: cute.Pointer,
        beta_ptr: cute.Pointer, o_ptr: cute.Pointer, cu_ptr: cute.Pointer, sidx_ptr: cute.Pointer,
        hinit_ptr: cute.Pointer, h0_ptr: cute.Pointer, ht_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, svt: Int64, svh: Int64, sgt: Int64, sgh: Int64,
        sbt: Int64, sbh: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32, scale: Float32,
        mma_c: cute.TiledMma, mma_k: cute.TiledMma, mma_p: cute.TiledMma, copy_k: cute.TiledCopy,
        copy_v: cute.TiledCopy, store_o: cute.TiledCopy,
    ):
        K, BV, PV = self.K, self.BV, self.PV
        P = self.prep
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        i_n = bid // HV
        i_hv = bid % HV
        mcu = cute.make_tensor(cu_ptr, cute.make_layout(N + 1))
        bos = Int64(mcu[i_n])
        eos = Int64(mcu[i_n + 1])
        nc = (Int32(eos - bos) + (C - 1)) // C
        hv64 = Int64(i_hv)

        # ---------------- shared memory: the k, q, v and the products' stages, the prep's own tiles -----
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        lay_kq = cute.tile_to_shape(atom, (C, K, KQV_STAGES), order=(0, 1, 2))
        lay_cc = cute.tile_to_shape(atom, (C, C, PRODUCT_STAGES), order=(0, 1, 2))
        smem = cutlass.utils.SmemAllocator()
        sK = smem.allocate_tensor(BFloat16, lay_kq.outer, 1024, swizzle=lay_kq.inner)
        sQ = smem.allocate_tensor(BFloat16, lay_kq.outer, 1024, swizzle=lay_kq.inner)
        sT = smem.allocate_tensor(BFloat16, lay_cc.outer, 1024, swizzle=lay_cc.inner)
        sA = smem.allocate_tensor(BFloat16, lay_cc.outer, 1024, swizzle=lay_cc.inner)
        sV = smem.allocate_tensor(BFloat16, cute.make_layout((C, BV, KQV_STAGES), stride=(PV, 1, C * PV)), 16)
        # per stage: g (raw), rk, qs, sq of each row (the walk's factors read them)
        sRow = smem.allocate_tensor(Float32, cute.make_layout((C, 4, PRODUCT_STAGES), stride=(1, C, 4 * C)), 16)
        sFac = smem.allocate_tensor(Float32, cute.make_layout((C, 3 * self.NW), stride=(1, C)), 16)
        # the prep's: A^T (fp32; Tm in its strictly lower triangle), the solve's Z, the row vectors
        sAt = smem.allocate_tensor(Float32, cute.make_layout((C, C), stride=(P.PA, 1)), 16)
        sZ = smem.allocate_tensor(Float32, cute.make_layout(32 * P.PZ), 16)
        sVec = smem.allocate_tensor(Float32, cute.make_layout((C, 8), stride=(1, C)), 16)

        if tid < PREP_THREADS:
            cute.arch.setmaxregister_decrease(self.regs[0])
            self.prep_loop(tid, nc, bos, eos, i_hv, HV, GROUP, scale, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                           sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, mma_p, copy_k, copy_v,
                           sK, sQ, sT, sA, sV, sRow, sAt, sZ, sVec)
        else:
            cute.arch.setmaxregister_increase(self.regs[1])
            self.walk_loop(tid - PREP_THREADS, nc, bos, eos, i_n, hv64, N, HV, o_ptr, sidx_ptr, hinit_ptr, h0_ptr,
                           ht_ptr, s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k, mma_c, mma_k, store_o,
                           sK, sQ, sT, sA, sV, sRow, sFac)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def prep_loop(self, ptid, nc, bos, eos, i_hv, HV, GROUP, scale, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                  sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, mma_p, copy_k, copy_v,
                  sK, sQ, sT, sA, sV, sRow, sAt, sZ, sVec):
        """The prep warpgroup (thread ``ptid`` of 128): each chunk's loads and state-independent
        products into its stage (module docstring), one chunk ahead of the walk."""
        K, BV = self.K, self.BV
        lane = ptid % 32
        wid = ptid // 32
        i_h = i_hv // GROUP
        hv64 = Int64(i_hv)
        g_min = Float32(self.g_min)
        thr_k = copy_k.get_slice(ptid)
        thr_v = copy_v.get_slice(ptid)
        tKsK, tQsQ = thr_k.partition_D(sK), thr_k.partition_D(sQ)
        tKc = thr_k.partition_S(cute.make_identity_tensor((C, K)))
        tVsV = thr_v.partition_D(sV)
        tVc = thr_v.partition_S(cute.make_identity_tensor((C, BV)))
        # Tm diag(beta)'s blocks above the diagonal: zero for good (the solve writes the others every chunk)
        for i in cutlass.range_constexpr(C * C * PRODUCT_STAGES // PREP_THREADS):
            e = ptid + i * PREP_THREADS
            sT[e % C, (e // C) % C, e // (C * C)] = BFloat16(0.0)
        if nc > 0:
            self.load_kqv(0, 0, bos, eos, i_h, hv64, q_ptr, k_ptr, v_ptr, sqt, sqh, skt, skh, svt, svh, copy_k, copy_v,
                          thr_k, thr_v, tKsK, tQsQ, tKc, tVsV, tVc)
        cute.arch.cp_async_commit_group()
        # warp 0 holds the next chunk's raw g and beta (loaded a chunk ahead, as k, q, v)
        gb = self.prep.load_gates(g_ptr, beta_ptr, bos, hv64, sgt, sgh, sbt, sbh,
                                  Int32(cutlass.select_(eos - bos < Int64(C), eos - bos, Int64(C))), lane)
        g0, g1, b0, b1 = gb[0], gb[1], gb[2], gb[3]
        for t in cutlass.range(nc, unroll=1):
            ks = t % KQV_STAGES
            s = t % PRODUCT_STAGES
            if t >= 2:  # the walk has left chunk t - 2: its k, q, v stage and its products' stage are free
                cute.arch.barrier(barrier_id=BAR_EMPTY + s, number_of_threads=THREADS)
            if t + 1 < nc:  # chunk t + 1's loads fly while this chunk is worked on
                self.load_kqv(t + 1, (t + 1) % KQV_STAGES, bos, eos, i_h, hv64, q_ptr, k_ptr, v_ptr, sqt, sqh, skt,
                              skh, svt, svh, copy_k, copy_v, thr_k, thr_v, tKsK, tQsQ, tKc, tVsV, tVc)
            cute.arch.cp_async_commit_group()
            row0 = bos + Int64(t * C)
            left = eos - row0
            L = Int32(cutlass.select_(left < Int64(C), left, Int64(C)))
            self.prep.sync()  # the previous chunk's reads of sVec, sAt and sZ are done
            # the gates' prefix sums and beta, the raw g row for the walk (warp 0); chunk t + 1's loaded
            if wid == 0:
                self.prep.scan_gates([g0, g1, b0, b1], lane, 0, sVec, g_min)
                sRow[lane, 0, s] = g0
                sRow[lane + 32, 0, s] = g1
                nxt = row0 + Int64(C)
                left1 = eos - nxt
                L1 = Int32(cutlass.select_(left1 < Int64(C), left1, Int64(C)))
                gb = self.prep.load_gates(g_ptr, beta_ptr, nxt, hv64, sgt, sgh, sbt, sbh, L1, lane)
                g0, g1, b0, b1 = gb[0], gb[1], gb[2], gb[3]
            cute.arch.cp_async_wait_group(1)  # chunk t's loads (chunk t + 1's may still fly)
            self.prep.sync()
            # the norms: thread r < 64 row r of k, else row r - 64 of q
            r = ptid % C
            if const_expr(self.prep.l2norm):
                if ptid < C:
                    self.prep.row_norm(sK[None, None, ks], sVec, r, 0, L, scale)
                else:
                    self.prep.row_norm(sQ[None, None, ks], sVec, r, 1, L, scale)
            else:
                one = Float32(cutlass.select_(r < L, Float32(1.0), Float32(0.0)))
                if ptid < C:
                    sVec[r, 0] = one
                    sVec[r, 1] = one
                else:
                    sVec[r, 2] = scale
                    sVec[r, 3] = Float32(1.0)
            cute.arch.fence_proxy("async.shared", space="cta")  # the tiles (rewritten rows too) for wgmma
            self.prep.sync()
            self.prep_tiles(ptid, ks, s, mma_p, sK, sQ, sA, sAt, sVec)
            self.prep.sync()
            # the solve (threads 0 .. 63: a column each; Tm diag(beta) by all 128) -> the stage
            self.prep.solve_one_head(sAt, sZ.iterator, sT[None, None, s], sVec, ptid)
            if ptid >= C:  # rk, qs, sq of row r for the walk's factors
                sRow[r, 1, s] = sVec[r, 1]
                sRow[r, 2, s] = sVec[r, 2]
                sRow[r, 3, s] = sVec[r, 3]
            # this thread's shared-memory writes (cp.async included) visible to the walk's wgmma reads
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier_arrive(barrier_id=BAR_FULL + s, number_of_threads=THREADS)
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def load_kqv(self, t, ks, bos, eos, i_h, hv64, q_ptr, k_ptr, v_ptr, sqt, sqh, skt, skh, svt, svh, copy_k, copy_v,
                 thr_k, thr_v, tKsK, tQsQ, tKc, tVsV, tVc):
        """Issue the prep warpgroup's cp.async loads of chunk ``t``'s k, q, v rows into stage ``ks`` (rows
        past the sequence zero)."""
        K, BV = self.K, self.BV
        row0 = bos + Int64(t * C)
        left = eos - row0
        L = Int32(cutlass.select_(left < Int64(C), left, Int64(C)))
        gK = cute.make_tensor((k_ptr + (row0 * skt + Int64(i_h) * skh)).align(16),
                              cute.make_layout((C, K), stride=(cute.assume(Int32(skt), divby=8), 1)))
        gQ = cute.make_tensor((q_ptr + (row0 * sqt + Int64(i_h) * sqh)).align(16),
                              cute.make_layout((C, K), stride=(cute.assume(Int32(sqt), divby=8), 1)))
        gV = cute.make_tensor((v_ptr + (row0 * svt + hv64 * svh)).align(16),
                              cute.make_layout((C, BV), stride=(cute.assume(Int32(svt), divby=8), 1)))
        tKg, tQg, tVg = thr_k.partition_S(gK), thr_k.partition_S(gQ), thr_v.partition_S(gV)
        for m in cutlass.range_constexpr(cute.size(tKg, mode=[1])):
            if tKc[0, m, 0][0] < L:
                cute.copy(copy_k, tKg[None, m, None], tKsK[None, m, None, ks])
                cute.copy(copy_k, tQg[None, m, None], tQsQ[None, m, None, ks])
            else:
                tKsK[None, m, None, ks].fill(0.0)
                tQsQ[None, m, None, ks].fill(0.0)
        for m in cutlass.range_constexpr(cute.size(tVg, mode=[1])):
            if tVc[0, m, 0][0] < L:
                cute.copy(copy_v, tVg[None, m, None], tVsV[None, m, None, ks])
            else:
                tVsV[None, m, None, ks].fill(0.0)

    @cute.jit
    def prep_tiles(self, ptid, ks, s, mma_p, sK, sQ, sA, sAt, sVec):
        """``K K^T`` and ``Q K^T`` of k, q stage ``ks`` (warp ``w``: rows ``16 w ..``) and their gate tiles:
        ``Aqk`` (bf16) into stage ``s``'s ``sA``, ``A`` (fp32, transposed) into ``sAt``; the same
        products and factors, in the same order, as the prep kernel's (b) for one value head (``prep_mma``:
        the products on the warpgroup's ``wgmma`` or the warps' ``mma.sync``: the same bits on the H200)."""
        thr = mma_p.get_slice(ptid)
        acc_kk = cute.make_rmem_tensor(thr.partition_shape_C((C, C)), Float32)
        acc_qk = cute.make_rmem_tensor(thr.partition_shape_C((C, C)), Float32)
        tCc = thr.partition_C(cute.make_identity_tensor((C, C)))
        sKs, sQs = sK[None, None, ks], sQ[None, None, ks]
        if const_expr(self.prep_mma == "wgmma"):  # the warpgroup's m64n64k16, both operands from shared memory
            tKA = thr.make_fragment_A(thr.partition_A(sKs))
            tQA = thr.make_fragment_A(thr.partition_A(sQs))
            tKB = thr.make_fragment_B(thr.partition_B(sKs))
            warpgroup.fence()
            self.wg_gemm(mma_p, acc_kk, tKA, tKB, True)
            self.wg_gemm(mma_p, acc_qk, tQA, tKB, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
        else:
            self.warp_products(ptid, mma_p, sKs, sQs, acc_kk, acc_qk)
        self.gate_tiles(thr, tCc, s, acc_kk, acc_qk, sA, sAt, sVec)

    @cute.jit
    def warp_products(self, ptid, mma_p, sKs, sQs, acc_kk, acc_qk):
        """``K K^T`` and ``Q K^T`` on warp ``mma.sync`` (warp ``w``: rows ``16 w ..``), A and B by ``ldmatrix``."""
        K = self.K
        thr = mma_p.get_slice(ptid)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), BFloat16)
        s2r_a = cute.make_tiled_copy_A(ldsm, mma_p)
        s2r_b = cute.make_tiled_copy_B(ldsm, mma_p)
        thr_a = s2r_a.get_slice(ptid)
        thr_b = s2r_b.get_slice(ptid)
        tKA = thr.make_fragment_A(thr.partition_A(sKs))
        tQA = thr.make_fragment_A(thr.partition_A(sQs))
        tKB = thr.make_fragment_B(thr.partition_B(sKs))
        tKs, tQs, tBs = thr_a.partition_S(sKs), thr_a.partition_S(sQs), thr_b.partition_S(sKs)
        tKA_v, tQA_v, tKB_v = thr_a.retile(tKA), thr_a.retile(tQA), thr_b.retile(tKB)
        acc_kk.fill(0.0)
        acc_qk.fill(0.0)
        for kb in cutlass.range_constexpr(K // 16):
            cute.copy(s2r_a, tKs[None, None, kb], tKA_v[None, None, kb])
            cute.copy(s2r_a, tQs[None, None, kb], tQA_v[None, None, kb])
            cute.copy(s2r_b, tBs[None, None, kb], tKB_v[None, None, kb])
            cute.gemm(mma_p, acc_kk, tKA[None, None, kb], tKB[None, None, kb], acc_kk)
            cute.gemm(mma_p, acc_qk, tQA[None, None, kb], tKB[None, None, kb], acc_qk)

    @cute.jit
    def gate_tiles(self, thr, tCc, s, acc_kk, acc_qk, sA, sAt, sVec):
        """The gate tiles of the products (the prep kernel's (b)): ``Aqk`` (bf16) into stage ``s``'s
        ``sA``, ``A`` (fp32, transposed) into ``sAt``, each computed in registers first (no store in
        between: each row's and column's factors read once)."""
        zero = Float32(0.0)
        for i in cutlass.range_constexpr(cute.size(acc_kk)):
            rr = tCc[i][0]
            ss = tCc[i][1]
            d = sVec[rr, 4] - sVec[ss, 4]
            e = cute.math.exp(cutlass.select_(rr >= ss, d, Float32(-float("inf"))), fastmath=True)
            uks = sVec[ss, 0]
            acc_qk[i] = acc_qk[i] * e * uks * sVec[rr, 2]
            a = acc_kk[i] * e * (sVec[rr, 6] * sVec[rr, 0]) * uks
            acc_kk[i] = cutlass.select_(rr > ss, a, zero)
        rq = cute.make_fragment_like(acc_qk, BFloat16)
        rq.store(acc_qk.load().to(BFloat16))
        cute.autovec_copy(rq, thr.partition_C(sA[None, None, s]))
        sAtT = cute.make_tensor(sAt.iterator, cute.make_layout((C, C), stride=(1, self.prep.PA)))  # (r, s) -> A^T
        cute.autovec_copy(acc_kk, thr.partition_C(sAtT))

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def walk_loop(self, wtid, nc, bos, eos, i_n, hv64, N, HV, o_ptr, sidx_ptr, hinit_ptr, h0_ptr, ht_ptr,
                  s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k, mma_c, mma_k, store_o,
                  sK, sQ, sT, sA, sV, sRow, sFac):
        """The walk warpgroups (thread ``wtid`` of 256): :class:`FusedWalkWgmmaKernel`'s chunk loop on
        the stages the prep fills (its loads replaced by the stage's "full" barrier)."""
        K, BV = self.K, self.BV
        lane = wtid % 32
        sFacW = cute.make_tensor(sFac.iterator + (wtid // 32) * (3 * C), cute.make_layout((C, 3), stride=(1, C)))
        sKt = cute.make_tensor(sK.iterator, cute.select(sK.layout, mode=[1, 0, 2]))
        sVt = cute.make_tensor(sV.iterator, cute.select(sV.layout, mode=[1, 0, 2]))
        thr_mc = mma_c.get_slice(wtid)
        thr_mk = mma_k.get_slice(wtid)
        acc_S = cute.make_rmem_tensor(thr_mk.partition_shape_C((BV, K)), Float32)
        tScS = thr_mk.partition_C(cute.make_identity_tensor((BV, K)))
        acc_X = cute.make_rmem_tensor(thr_mc.partition_shape_C((BV, C)), Float32)  # P1, then X
        acc_O = cute.make_rmem_tensor(thr_mc.partition_shape_C((BV, C)), Float32)  # P2, then O^T
        acc_N = cute.make_rmem_tensor(thr_mc.partition_shape_C((BV, C)), Float32)  # Vn^T
        tPcP = thr_mc.partition_C(cute.make_identity_tensor((BV, C)))
        tKb = thr_mc.make_fragment_B(thr_mc.partition_B(sK))
        tQb = thr_mc.make_fragment_B(thr_mc.partition_B(sQ))
        tTb = thr_mc.make_fragment_B(thr_mc.partition_B(sT))
        tAb = thr_mc.make_fragment_B(thr_mc.partition_B(sA))
        tUb = thr_mk.make_fragment_B(thr_mk.partition_B(sKt))
        thr_o = store_o.get_slice(wtid)
        tOs = thr_o.partition_S(sV)
        tOc = thr_o.partition_S(cute.make_identity_tensor((C, BV)))
        s2r_v = cute.make_tiled_copy_C(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16), mma_c)
        thr_s2r_v = s2r_v.get_slice(wtid)
        tVtS = thr_s2r_v.partition_S(sVt)
        r2s_o = cute.make_tiled_copy_C(
            cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16), mma_c)
        thr_r2s_o = r2s_o.get_slice(wtid)
        tOtD = thr_r2s_o.partition_D(sVt)

        live, slot, keep = self.entering_state(acc_S, tScS, i_n, N, sidx_ptr, hinit_ptr, h0_ptr, s0_p, s0_h, s0_v,
                                               s0_k, hv64, Int32(0))
        for t in cutlass.range(nc, unroll=1):
            stage = t % PRODUCT_STAGES
            ks = t % KQV_STAGES
            cute.arch.barrier(barrier_id=BAR_FULL + stage, number_of_threads=THREADS)
            dec, cs = self.warp_factors_of(stage, lane, sRow, sFacW)
            cute.arch.sync_warp()
            self.chunk_products(ks, stage, mma_c, mma_k, acc_S, acc_X, acc_O, acc_N, tPcP, sFacW, dec, cs, keep,
                                tKb, tQb, tTb, tAb, tUb, s2r_v, thr_s2r_v, tVtS, r2s_o, thr_r2s_o, tOtD)
            cute.arch.barrier(barrier_id=BAR_WALK, number_of_threads=WALK_THREADS)
            # the chunk's output rows: sV (now O^T as [row, value]) -> o[row, hv, :]
            self.output_rows(o_ptr, bos + Int64(t * C), eos, HV, hv64, None, thr_o, tOs, tOc, store_o, ks)
            if t + 2 < nc:  # the prep may refill the stages of chunk t with chunk t + 2 (k, q, v: t + 3)
                cute.arch.barrier_arrive(barrier_id=BAR_EMPTY + stage, number_of_threads=THREADS)

        if live:
            ht = cute.make_tensor(ht_ptr + (slot * st_p + hv64 * st_h), cute.make_layout((BV, K), stride=(st_v, st_k)))
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                ht[tScS[i]] = acc_S[i].to(ht.element_type)
