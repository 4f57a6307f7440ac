"""The one-kernel GDN prefill in CuTe DSL (SM90; imports ``cutlass``: load it only through
:mod:`linattn.kernels.cutedsl.fused_prefill`, which imports it lazily).

The prep (:mod:`._fused_prep_kernel`) and the ``wgmma`` walk (:mod:`._fused_walk_wgmma_kernel`) in one
warp-specialized kernel: one CTA of three warpgroups per (sequence, value head), ``V = BV = 128``::

    warpgroup 0 (prep, 128 threads, few registers)      warpgroups 1, 2 (walk, 256 threads)
                                                          chunk t:
      chunk u (once its tiles are ready):                   wait until chunk t + 1's norms are ready
        chunk u + 1 (its k, q, v in flight since u - 1):    chunk t + 1's tiles on wgmma: K K^T -> A
          the gates' prefix sums, beta, the q / k norms       (fp32 registers, warpgroup 1), Q K^T -> Aqk
          (F44: rewritten rows, scale folded in:              (bf16, warpgroup 2), with the gates
          rk = uk, sq = 1); norms ready                     wait until chunk t's stage is full; A^T ->
        chunk u: (I + A)^-1 blockwise, Tm diag(beta) ->       sAt (the solve has left it); tiles ready
          stage u % 2; rk, qs -> its row vectors; full      the gate factors, then P1, P2, Vn^T, O^T and
      wait until the walk has left chunk u - 1, then          the state update on wgmma (the state S^T fp32
        chunk u + 1's raw g row and chunk u + 2's k, q, v     in registers for the whole sequence)
        (cp.async; rows past the sequence: 0)               O^T through the v tile to the output
                                                          leave the stage ("empty")

so the prep forms chunk u + 1's norms, then solves chunk u, while the walk works on chunk u - 1 (the norms
a chunk ahead of the solve, each chunk's in its own ``sVec`` stage). Each side still waits for the other once
a chunk: the prep's solve of chunk u for the walk's tiles of chunk u, the walk's products of chunk u for that
solve (docs/performance.md: the prep, at one CTA per SM, bounds the kernel). Nothing per chunk goes to HBM:
q, k, v, g, beta are read once, o and the pool row written once. The hand-overs are named barriers (each:
one side's threads arrive, the other's wait); the shared-memory writes one side makes for the other's
``wgmma`` (the async proxy) are fenced by ``fence.proxy.async`` before the arrival. ``setmaxnreg`` moves
registers from the prep warpgroup to the walk's (``regs``: 128 x (prep + 2 walk) <= 64,512).

The maths is :mod:`linattn.kernels.triton.chunk_fused`'s (module docstring); each stage's products are
the two kernels' own, in the same order (``K K^T``, ``Q K^T`` on ``wgmma`` here, on ``mma.sync`` in the prep
kernel: the same bits on the H200), so on inputs whose rows need no F44 scale its outputs and pool rows
are bitwise those of the prep + ``wgmma`` walk pair. Resources and speed: docs/performance.md,
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
#: named barriers (0 is the CTA's): stage s full at BAR_FULL + s, empty at BAR_EMPTY + s; each warpgroup's own;
#: a chunk's norms and gates ready (the prep arrives, the walk waits), its A^T and Aqk ready (the other way round)
BAR_FULL, BAR_EMPTY, BAR_PREP, BAR_WALK, BAR_NORMS, BAR_TILES = 1, 3, 5, 6, 7, 8
#: stages of the k, q, v tiles (chunk t for the walk's products, t + 1 for its tiles and the prep's norms, t + 2
#: in flight) and of the products (Tb, Aqk, the row vectors: chunks t and t + 1)
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
        tma: k and q tiles by TMA (the prep's warp 0 issues both, an mbarrier per stage counts their bytes);
            else by the prep warpgroup's ``cp.async``, as v always is.
    """

    def __init__(self, K: int, V: int, pool: bool, has_h0: bool, has_init: bool, g_min: float, l2norm: bool,
                 beta_bf16: bool, regs: tuple, tma: bool = False):
        super().__init__(K, V, V, pool, has_h0, has_init, g_min)
        assert V == 128 and K == 128, "one CTA per (sequence, value head): BV = V = 128"
        assert regs[0] % 8 == 0 and regs[1] % 8 == 0 and regs[0] + 2 * regs[1] <= 504
        self.regs = regs
        self.tma = tma
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
        sbt: Int64, sbh: Int64, T: Int64,
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
        # a walk warpgroup's K K^T or Q K^T (m64n64k16, both operands in shared memory)
        mma_t = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (64, C),
            warpgroup.OperandSource.SMEM)
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
        atom_k = atom_q = tma_k = tma_q = None
        if const_expr(self.tma):
            atom_k, tma_k = self.tma_of(k_ptr, T, skt, skh, HV // GROUP)
            atom_q, tma_q = self.tma_of(q_ptr, T, sqt, sqh, HV // GROUP)
        self.kernel(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, cu_ptr, sidx_ptr, hinit_ptr, h0_ptr, ht_ptr,
            sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, T, s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k,
            N, HV, GROUP, scale, mma_c, mma_k, mma_t, copy_k, copy_v, store_o, atom_k, tma_k, atom_q, tma_q,
        ).launch(grid=[N * HV, 1, 1], block=[THREADS, 1, 1], stream=stream)

    def smem_layouts(self):
        """The swizzled shared-memory layouts of the k / q stages and of the products' (C x C) stages."""
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        return (cute.tile_to_shape(atom, (C, self.K, KQV_STAGES), order=(0, 1, 2)),
                cute.tile_to_shape(atom, (C, C, PRODUCT_STAGES), order=(0, 1, 2)))

    @cute.jit
    def tma_of(self, ptr, T, st, sh, H):
        """The TMA atom and coordinate tensor that load ``(C, K)`` tiles of ``[T, H, K]`` rows (token stride ``st``,
        head stride ``sh``, both multiples of 8 elements: the host side copies other rows first) into a k / q
        stage; rows past ``T`` arrive as zeros."""
        g = cute.make_tensor(ptr, cute.make_layout(
            (Int32(T), self.K, H), stride=(cute.assume(st, divby=8), 1, cute.assume(sh, divby=8))))
        return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), g, self.smem_layouts()[0], (C, self.K))

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, g_ptr: cute.Pointer,
        beta_ptr: cute.Pointer, o_ptr: cute.Pointer, cu_ptr: cute.Pointer, sidx_ptr: cute.Pointer,
        hinit_ptr: cute.Pointer, h0_ptr: cute.Pointer, ht_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, svt: Int64, svh: Int64, sgt: Int64, sgh: Int64,
        sbt: Int64, sbh: Int64, T: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32, scale: Float32,
        mma_c: cute.TiledMma, mma_k: cute.TiledMma, mma_t: cute.TiledMma, copy_k: cute.TiledCopy,
        copy_v: cute.TiledCopy, store_o: cute.TiledCopy, atom_k, tma_k, atom_q, tma_q,
    ):
        BV, PV = self.BV, self.PV
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
        lay_kq, lay_cc = self.smem_layouts()
        smem = cutlass.utils.SmemAllocator()
        sK = smem.allocate_tensor(BFloat16, lay_kq.outer, 1024, swizzle=lay_kq.inner)
        sQ = smem.allocate_tensor(BFloat16, lay_kq.outer, 1024, swizzle=lay_kq.inner)
        sT = smem.allocate_tensor(BFloat16, lay_cc.outer, 1024, swizzle=lay_cc.inner)
        sA = smem.allocate_tensor(BFloat16, lay_cc.outer, 1024, swizzle=lay_cc.inner)
        sV = smem.allocate_tensor(BFloat16, cute.make_layout((C, BV, KQV_STAGES), stride=(PV, 1, C * PV)), 16)
        # per stage: g (raw), rk, qs, sq of each row (the walk's factors read them)
        sRow = smem.allocate_tensor(Float32, cute.make_layout((C, 4, PRODUCT_STAGES), stride=(1, C, 4 * C)), 16)
        sFac = smem.allocate_tensor(Float32, cute.make_layout((C, 3 * self.NW), stride=(1, C)), 16)
        # A^T (fp32, written by walk warpgroup 1; the prep's solve keeps Tm in its strictly lower triangle), the
        # solve's Z, the row vectors (the prep's)
        sAt = smem.allocate_tensor(Float32, cute.make_layout((C, C), stride=(P.PA, 1)), 16)
        sZ = smem.allocate_tensor(Float32, cute.make_layout(32 * P.PZ), 16)
        # per chunk (two stages: the prep writes chunk u + 1's before it solves chunk u): uk, rk, qs, sq, G, -, beta, -
        sVec = smem.allocate_tensor(Float32, cute.make_layout((C, 8, PRODUCT_STAGES), stride=(1, C, 8 * C)), 16)
        bars = None
        if const_expr(self.tma):  # a k / q stage's TMA bytes (one arrival: the issuing lane's expect-tx)
            bars = smem.allocate_array(Int64, KQV_STAGES, byte_alignment=8)
            if tid == 0:
                for i in cutlass.range_constexpr(KQV_STAGES):
                    cute.arch.mbarrier_init(bars + i, 1)
                cute.arch.mbarrier_init_fence()
            cute.arch.barrier()

        if tid < PREP_THREADS:
            cute.arch.setmaxregister_decrease(self.regs[0])
            self.prep_loop(tid, nc, bos, eos, i_hv, HV, GROUP, scale, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                           sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, copy_k, copy_v,
                           (atom_k, tma_k, atom_q, tma_q, bars), sK, sQ, sT, sV, sRow, sAt, sZ, sVec)
        else:
            cute.arch.setmaxregister_increase(self.regs[1])
            self.walk_loop(tid - PREP_THREADS, nc, bos, eos, i_n, hv64, N, HV, o_ptr, sidx_ptr, hinit_ptr, h0_ptr,
                           ht_ptr, s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k, mma_c, mma_k, mma_t, store_o,
                           sK, sQ, sT, sA, sV, sRow, sFac, sAt, sVec)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def prep_loop(self, ptid, nc, bos, eos, i_hv, HV, GROUP, scale, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                  sqt, sqh, skt, skh, svt, svh, sgt, sgh, sbt, sbh, copy_k, copy_v, tma,
                  sK, sQ, sT, sV, sRow, sAt, sZ, sVec):
        """The prep warpgroup (thread ``ptid`` of 128): chunk 0's gates and norms ("norms ready"), then per chunk
        u, once the walk has formed its ``A^T`` and ``Aqk`` ("tiles ready"): chunk u + 1's gates and norms into
        ``sVec`` stage (u + 1) % 2 ("norms ready"; its loads were issued after chunk u - 1's), then chunk u's
        solve into the products' stage u % 2 ("full"); once the walk has left chunk u - 1: chunk u + 1's raw g
        row and chunk u + 2's loads."""
        lane = ptid % 32
        wid = ptid // 32
        i_h = i_hv // GROUP
        hv64 = Int64(i_hv)
        thr_k = copy_k.get_slice(ptid)
        thr_v = copy_v.get_slice(ptid)
        tKsK, tQsQ = thr_k.partition_D(sK), thr_k.partition_D(sQ)
        tKc = thr_k.partition_S(cute.make_identity_tensor((C, self.K)))
        tVsV = thr_v.partition_D(sV)
        tVc = thr_v.partition_S(cute.make_identity_tensor((C, self.BV)))
        tiles = None
        if const_expr(self.tma):
            tiles = (tma[0], *self.tma_tiles(tma[0], tma[1], bos, i_h, sK), tma[2],
                     *self.tma_tiles(tma[2], tma[3], bos, i_h, sQ), tma[4])
        loads = (bos, eos, i_h, hv64, q_ptr, k_ptr, v_ptr, sqt, sqh, skt, skh, svt, svh, copy_k, copy_v, thr_k, thr_v,
                 tKsK, tQsQ, tKc, tVsV, tVc, tiles)
        # Tm diag(beta)'s blocks above the diagonal: zero for good (the solve writes the others every chunk)
        for i in cutlass.range_constexpr(C * C * PRODUCT_STAGES // PREP_THREADS):
            e = ptid + i * PREP_THREADS
            sT[e % C, (e // C) % C, e // (C * C)] = BFloat16(0.0)
        for c in cutlass.range_constexpr(2):  # chunks 0 and 1 in flight
            if c < nc:
                self.load_kqv(c, c, *loads)
            cute.arch.cp_async_commit_group()
        # warp 0 holds the next chunk's raw g and beta (loaded a chunk ahead, as k, q, v)
        gb = self.prep.load_gates(g_ptr, beta_ptr, bos, hv64, sgt, sgh, sbt, sbh, self.rows_of(bos, eos, 0), lane)
        g0, g1, b0, b1 = gb[0], gb[1], gb[2], gb[3]
        if nc > 0:
            cute.arch.cp_async_wait_group(1)  # chunk 0's loads
            rg0, rg1 = g0, g1
            gb = self.prep_front(ptid, 0, bos, eos, hv64, scale, g_ptr, beta_ptr, sgt, sgh, sbt, sbh, [g0, g1, b0, b1],
                                 sK, sQ, sVec[None, None, 0], tma[4])
            g0, g1, b0, b1 = gb[0], gb[1], gb[2], gb[3]
            if wid == 0:
                sRow[lane, 0, 0] = rg0
                sRow[lane + 32, 0, 0] = rg1
        for u in cutlass.range(nc, unroll=1):
            s = u % PRODUCT_STAGES
            r = ptid % C
            # chunk u's A^T, Aqk formed (the walk wrote A^T once it had chunk u - 1's stage: the solve's sAt is free);
            # the walk has also passed chunk u's "norms ready", so chunk u + 1's may be arrived at
            cute.arch.barrier(barrier_id=BAR_TILES, number_of_threads=THREADS)
            rg0, rg1 = g0, g1  # chunk u + 1's raw g (for its row, below)
            # chunk u + 1's gates and norms first (its loads are the only ones in flight): the walk forms its tiles
            # while this warpgroup solves chunk u
            if u + 1 < nc:
                cute.arch.cp_async_wait_group(0)
                gb = self.prep_front(ptid, u + 1, bos, eos, hv64, scale, g_ptr, beta_ptr, sgt, sgh, sbt, sbh,
                                     [g0, g1, b0, b1], sK, sQ, sVec[None, None, (u + 1) % PRODUCT_STAGES], tma[4])
                g0, g1, b0, b1 = gb[0], gb[1], gb[2], gb[3]
            self.prep.solve_one_head(sAt, sZ.iterator, sT[None, None, s], sVec[None, None, s], ptid)
            if ptid >= C:  # rk, qs, sq of row r for the walk's factors
                sRow[r, 1, s] = sVec[r, 1, s]
                sRow[r, 2, s] = sVec[r, 2, s]
                sRow[r, 3, s] = sVec[r, 3, s]
            # this thread's shared-memory writes (cp.async included) visible to the walk's wgmma reads
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier_arrive(barrier_id=BAR_FULL + s, number_of_threads=THREADS)
            if u + 1 < nc:
                if u >= 1:  # the walk has left chunk u - 1: its stages take chunk u + 1's row g, chunk u + 2's loads
                    cute.arch.barrier(barrier_id=BAR_EMPTY + (u + 1) % PRODUCT_STAGES, number_of_threads=THREADS)
                if wid == 0:
                    sRow[lane, 0, (u + 1) % PRODUCT_STAGES] = rg0
                    sRow[lane + 32, 0, (u + 1) % PRODUCT_STAGES] = rg1
                if u + 2 < nc:
                    self.load_kqv(u + 2, (u + 2) % KQV_STAGES, *loads)
                cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def rows_of(self, bos, eos, c):
        """The rows of chunk ``c`` in the sequence ``[bos, eos)`` (``C`` but for the last; <= 0 past it)."""
        left = eos - (bos + Int64(c * C))
        return Int32(cutlass.select_(left < Int64(C), left, Int64(C)))

    @cute.jit
    def prep_front(self, ptid, c, bos, eos, hv64, scale, g_ptr, beta_ptr, sgt, sgh, sbt, sbh, gb, sK, sQ, sVec,
                   bars):
        """Chunk ``c``'s gates (warp 0, from ``gb``: its raw g and beta; returns chunk ``c + 1``'s, loaded) and
        norms into ``sVec``, then "norms ready" (the caller has waited for the chunk's ``cp.async`` loads; TMA's
        are waited for here, and the rows past the sequence's end zeroed: TMA loaded the next sequence's)."""
        lane = ptid % 32
        L = self.rows_of(bos, eos, c)
        if const_expr(self.tma):
            cute.arch.mbarrier_wait(bars + c % KQV_STAGES, (c // KQV_STAGES) % 2)
            if L < C:
                self.zero_rows(ptid, L, sK, sQ, c % KQV_STAGES)
                self.prep.sync()
        else:
            self.prep.sync()  # every thread's cp.async loads of chunk c landed (visible to the other threads)
        nb = gb
        if ptid // 32 == 0:
            self.prep.scan_gates(gb, lane, 0, sVec, Float32(self.g_min))
            nb = self.prep.load_gates(g_ptr, beta_ptr, bos + Int64((c + 1) * C), hv64, sgt, sgh, sbt, sbh,
                                      self.rows_of(bos, eos, c + 1), lane)
        # the norms: thread r < 64 row r of k, else row r - 64 of q
        ks = c % KQV_STAGES
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
        cute.arch.fence_proxy("async.shared", space="cta")  # the tiles (rewritten rows too) for the walk's wgmma
        cute.arch.barrier_arrive(barrier_id=BAR_NORMS, number_of_threads=THREADS)
        return nb

    @cute.jit
    def tma_tiles(self, atom, mX, bos, i_h, sX):
        """(stage tiles, chunk tiles) of one TMA source: ``sX``'s stages and head ``i_h``'s ``(C, K)`` tiles
        from row ``bos`` on, partitioned for ``atom``."""
        g = cute.local_tile(cute.domain_offset((Int32(bos), 0, 0), mX)[None, None, i_h], (C, self.K), (None, 0))
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                     cute.group_modes(g, 0, 2))

    @cute.jit
    def zero_rows(self, ptid, L, sK, sQ, ks):
        """Rows ``L..C-1`` of k / q stage ``ks`` set to zero (the prep warpgroup's threads share them)."""
        for i in cutlass.range(ptid, (C - L) * self.K, PREP_THREADS, unroll=1):
            sK[L + i // self.K, i % self.K, ks] = BFloat16(0.0)
            sQ[L + i // self.K, i % self.K, ks] = BFloat16(0.0)

    @cute.jit
    def load_kqv(self, t, ks, bos, eos, i_h, hv64, q_ptr, k_ptr, v_ptr, sqt, sqh, skt, skh, svt, svh, copy_k, copy_v,
                 thr_k, thr_v, tKsK, tQsQ, tKc, tVsV, tVc, tiles):
        """Issue chunk ``t``'s loads into stage ``ks``: k and q by TMA (``tiles``: the atoms, their partitions and
        the stages' mbarriers; the prep's warp 0 issues them) or the prep warpgroup's ``cp.async``, v by ``cp.async``
        (rows past the sequence zero; TMA's are zeroed once loaded, :meth:`zero_rows`)."""
        K, BV = self.K, self.BV
        row0 = bos + Int64(t * C)
        L = self.rows_of(bos, eos, t)
        if const_expr(self.tma):
            ptid, _, _ = cute.arch.thread_idx()
            if ptid // 32 == 0:  # the whole warp: a TMA copy elects its issuing lane (elect.sync of all 32)
                bar = tiles[6] + ks
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(bar, 2 * C * K * 2)
                cute.copy(tiles[0], tiles[2][None, t], tiles[1][None, ks], tma_bar_ptr=bar)
                cute.copy(tiles[3], tiles[5][None, t], tiles[4][None, ks], tma_bar_ptr=bar)
        else:
            gK = cute.make_tensor((k_ptr + (row0 * skt + Int64(i_h) * skh)).align(16),
                                  cute.make_layout((C, K), stride=(cute.assume(Int32(skt), divby=8), 1)))
            gQ = cute.make_tensor((q_ptr + (row0 * sqt + Int64(i_h) * sqh)).align(16),
                                  cute.make_layout((C, K), stride=(cute.assume(Int32(sqt), divby=8), 1)))
            tKg, tQg = thr_k.partition_S(gK), thr_k.partition_S(gQ)
            for m in cutlass.range_constexpr(cute.size(tKg, mode=[1])):
                if tKc[0, m, 0][0] < L:
                    cute.copy(copy_k, tKg[None, m, None], tKsK[None, m, None, ks])
                    cute.copy(copy_k, tQg[None, m, None], tQsQ[None, m, None, ks])
                else:
                    tKsK[None, m, None, ks].fill(0.0)
                    tQsQ[None, m, None, ks].fill(0.0)
        gV = cute.make_tensor((v_ptr + (row0 * svt + hv64 * svh)).align(16),
                              cute.make_layout((C, BV), stride=(cute.assume(Int32(svt), divby=8), 1)))
        tVg = thr_v.partition_S(gV)
        for m in cutlass.range_constexpr(cute.size(tVg, mode=[1])):
            if tVc[0, m, 0][0] < L:
                cute.copy(copy_v, tVg[None, m, None], tVsV[None, m, None, ks])
            else:
                tVsV[None, m, None, ks].fill(0.0)

    @cute.jit
    def walk_tiles(self, wtid, ks, s, mma_t, acc, sK, sQ, sA, sVec):
        """A walk warpgroup's share of a chunk's tiles (k, q stage ``ks``, the chunk's ``sVec`` stage): the first
        walk warpgroup (the kernel's warpgroup 1, ``wtid < 128``) ``K K^T`` and its gate tile ``A`` (fp32) into
        ``acc`` (:meth:`store_at` writes it once the prep's solve has left ``sAt``), the second (warpgroup 2)
        ``Q K^T`` and ``Aqk`` (bf16) into stage ``s``'s ``sA``; the products on ``wgmma`` (both operands in shared
        memory), the factors as the prep kernel's (b) (the same expressions, so the same bits)."""
        thr = mma_t.get_slice(wtid % 128)
        tCc = thr.partition_C(cute.make_identity_tensor((C, C)))
        sKs, sQs = sK[None, None, ks], sQ[None, None, ks]
        tKA = thr.make_fragment_A(thr.partition_A(sKs))
        tQA = thr.make_fragment_A(thr.partition_A(sQs))
        tKB = thr.make_fragment_B(thr.partition_B(sKs))
        zero = Float32(0.0)
        warpgroup.fence()
        if wtid < 128:
            self.wg_gemm(mma_t, acc, tKA, tKB, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            for i in cutlass.range_constexpr(cute.size(acc)):
                rr, ss, e = self.gate_decay(tCc[i], sVec)
                a = acc[i] * e * (sVec[rr, 6] * sVec[rr, 0]) * sVec[ss, 0]
                acc[i] = cutlass.select_(rr > ss, a, zero)
        else:
            self.wg_gemm(mma_t, acc, tQA, tKB, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            for i in cutlass.range_constexpr(cute.size(acc)):
                rr, ss, e = self.gate_decay(tCc[i], sVec)
                acc[i] = acc[i] * e * sVec[ss, 0] * sVec[rr, 2]
            rq = cute.make_fragment_like(acc, BFloat16)
            rq.store(acc.load().to(BFloat16))
            cute.autovec_copy(rq, thr.partition_C(sA[None, None, s]))

    @cute.jit
    def store_at(self, wtid, mma_t, acc, sAt):
        """The first walk warpgroup's ``A`` tile (``acc`` from :meth:`walk_tiles`) into ``sAt``, transposed (the
        prep's solve reads it with plain loads, ordered by "tiles ready", which the caller arrives at); then
        every walk thread fences its shared-memory writes for the async proxy: the second warpgroup's ``Aqk``
        in ``sA``, which the walk's ``wgmma`` reads at the next chunk."""
        if wtid < 128:
            thr = mma_t.get_slice(wtid)
            sAtT = cute.make_tensor(sAt.iterator, cute.make_layout((C, C), stride=(1, self.prep.PA)))  # (r, s) -> A^T
            cute.autovec_copy(acc, thr.partition_C(sAtT))
        cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def gate_decay(self, crd, sVec):
        """Row ``r``, column ``s`` of a tile element at ``crd`` and its decay ``exp(G_r - G_s)`` (0 above the
        diagonal), as the prep kernel's (b) forms it."""
        rr = crd[0]
        ss = crd[1]
        d = sVec[rr, 4] - sVec[ss, 4]
        return rr, ss, cute.math.exp(cutlass.select_(rr >= ss, d, Float32(-float("inf"))), fastmath=True)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def walk_loop(self, wtid, nc, bos, eos, i_n, hv64, N, HV, o_ptr, sidx_ptr, hinit_ptr, h0_ptr, ht_ptr,
                  s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k, mma_c, mma_k, mma_t, store_o,
                  sK, sQ, sT, sA, sV, sRow, sFac, sAt, sVec):
        """The walk warpgroups (thread ``wtid`` of 256): :class:`FusedWalkWgmmaKernel`'s chunk loop on
        the stages the prep fills (its loads replaced by the stage's "full" barrier), each chunk t's
        products preceded by chunk t + 1's tiles (:meth:`walk_tiles`), which the prep then solves."""
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
        shape_T = mma_t.get_slice(wtid % 128).partition_shape_C((C, C))
        if nc > 0:  # chunk 0's tiles
            acc_T = cute.make_rmem_tensor(shape_T, Float32)
            cute.arch.barrier(barrier_id=BAR_NORMS, number_of_threads=THREADS)
            self.walk_tiles(wtid, 0, 0, mma_t, acc_T, sK, sQ, sA, sVec[None, None, 0])
            self.store_at(wtid, mma_t, acc_T, sAt)
            cute.arch.barrier_arrive(barrier_id=BAR_TILES, number_of_threads=THREADS)
        for t in cutlass.range(nc, unroll=1):
            stage = t % PRODUCT_STAGES
            ks = t % KQV_STAGES
            if t + 1 < nc:  # chunk t + 1's tiles (its Aqk stage held chunk t - 1's), solved while this chunk runs
                acc_T = cute.make_rmem_tensor(shape_T, Float32)
                cute.arch.barrier(barrier_id=BAR_NORMS, number_of_threads=THREADS)
                self.walk_tiles(wtid, (t + 1) % KQV_STAGES, (t + 1) % PRODUCT_STAGES, mma_t, acc_T, sK, sQ, sA,
                                sVec[None, None, (t + 1) % PRODUCT_STAGES])
                # chunk t's stage full: the prep has solved chunk t, so sAt takes chunk t + 1's A^T (and the prep,
                # which waits for it, has passed chunk t's "tiles ready")
                cute.arch.barrier(barrier_id=BAR_FULL + stage, number_of_threads=THREADS)
                self.store_at(wtid, mma_t, acc_T, sAt)
                cute.arch.barrier_arrive(barrier_id=BAR_TILES, number_of_threads=THREADS)
            else:
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
