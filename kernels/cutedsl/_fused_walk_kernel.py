"""The CuTe DSL walk of the fused GDN prefill (imports ``cutlass``: load it only through
:mod:`linattn.kernels.cutedsl.fused_walk`, which imports this module lazily).

One CTA of ``NW = BV / 16`` warps owns one (value block of ``BV`` columns, sequence ``n``, value
head ``hv``) and walks the sequence's chunks of ``C = 64`` rows in order, the transposed state
``S^T [BV, K]`` fp32 in registers for the whole sequence as the accumulator of warp-level MMAs
(``mma.sync`` m16n8k16, bf16 operands, fp32 accumulation). Warp ``w`` owns state rows
``16 w .. 16 w + 15`` (value channels), so every register operand stays in the warp that made it.
The chunk's tiles (``k``, ``q`` ``[C, K]``; ``v`` ``[C, BV]``; the prep kernel's ``Tm diag(beta)``
and ``Aqk`` ``[C, 64]``; the rows of ``g``, ``rk``, ``qs``) come into shared memory with
``cp.async`` one chunk ahead (two stages; rows past the sequence zero-filled, ``sq`` one-filled).
Per chunk, with the maths of :mod:`linattn.kernels.triton.chunk_fused` (its module docstring)::

    factors   G = cumsum(max(g, G_MIN)); c = min(sq); fx = rk e^G / c; fo = qs e^G sq / c;
              fs = rk e^(G_C - G); dec = e^(G_C)        (each warp: shuffle scans; shared memory)
    P1, P2  = bf16(c S^T) k^T, bf16(c S^T) q^T                          (A: the state, registers)
    X       = v^T - P1 diag(fx)
    Vn^T    = bf16(X) Tb^T                                               (A: X, registers)
    O^T     = P2 diag(fo) + bf16(Vn^T) Aqk^T                             (A: Vn^T, registers)
    S^T     = dec S^T + bf16(Vn^T diag(fs)) k                            (A: Vn^T, registers)

``O^T`` goes through the value tile's shared memory (its ``v`` is consumed) to coalesced 16-byte
stores of the output rows. 256 ``mma.sync`` per warp and chunk (128 + 32 + 32 + 64).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from ._state_kernel import load_state_block, store_rows  # the entering state's load, the rows' store: shared

C = 64  # chunk rows


class FusedWalkKernel:
    """Static configuration of one compiled walk (everything that changes the code).

    Args:
        K, V: head dims (128 for this step; multiples of 16).
        BV: value columns per CTA (16 per warp: 64 or 128).
        pool: pool mode (h0 from and ht to ``state_pool[state_indices[n]]``; negative = padding).
        has_h0: dense mode with an initial state (ignored in pool mode).
        has_init: pool mode with a ``has_initial_state [N]`` byte mask (0: a zero h0, the slot not read).
        g_min: the floor of the log decays (``limits.G_MIN``).
        warp_factors: every warp forms the chunk's factors itself with shuffle scans
            (:meth:`warp_factors`; no CTA barrier); else 64 threads with serial sums
            (:meth:`factors`) and a CTA barrier.
    """

    def __init__(self, K: int, V: int, BV: int, pool: bool, has_h0: bool, has_init: bool, g_min: float,
                 warp_factors: bool = True):
        assert K % 16 == 0 and V % BV == 0 and BV % 16 == 0
        self.K, self.V, self.BV = K, V, BV
        self.pool, self.has_h0 = pool, has_h0
        self.has_init = has_init and pool
        self.g_min = float(g_min)
        self.warp_factors = warp_factors
        self.NW = BV // 16
        self.NT = 32 * self.NW
        assert self.NT >= C, "one thread per chunk row forms the gate factors"
        self.PK = K + 8  # padded smem row pitches (elements): k, q; v / O; Tb, Aqk
        self.PV = BV + 8
        self.PC = C + 8
        assert self.NT % (K // 8) == 0 and self.NT % (BV // 8) == 0 and self.NT % (C // 8) == 0

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
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)),
            (self.NW, 1, 1),
            permutation_mnk=(self.NW * 16, 16, 16),
        )
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
            N, HV, GROUP, tiled_mma, copy_k, copy_v, copy_c, store_o, g2s4,
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
        tiled_mma: cute.TiledMma, copy_k: cute.TiledCopy, copy_v: cute.TiledCopy, copy_c: cute.TiledCopy,
        store_o: cute.TiledCopy, g2s4: cute.CopyAtom,
    ):
        K, V, BV, PK, PV, PC = self.K, self.V, self.BV, self.PK, self.PV, self.PC
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
        smem = cutlass.utils.SmemAllocator()
        sK = smem.allocate_tensor(BFloat16, cute.make_layout((C, K, 2), stride=(PK, 1, C * PK)), 16)
        sQ = smem.allocate_tensor(BFloat16, cute.make_layout((C, K, 2), stride=(PK, 1, C * PK)), 16)
        sV = smem.allocate_tensor(BFloat16, cute.make_layout((C, BV, 2), stride=(PV, 1, C * PV)), 16)
        sT = smem.allocate_tensor(BFloat16, cute.make_layout((C, C, 2), stride=(PC, 1, C * PC)), 16)
        sA = smem.allocate_tensor(BFloat16, cute.make_layout((C, C, 2), stride=(PC, 1, C * PC)), 16)
        # per-row scalars of both stages: g, rk, qs[.., 0] (scale uq), qs[.., 1] (sq)
        sRow = smem.allocate_tensor(Float32, cute.make_layout((C, 4, 2), stride=(1, C, 4 * C)), 16)
        # this chunk's factors fx, fo, fs per row (one copy per warp with warp_factors); dec and c
        nf = self.NW if const_expr(self.warp_factors) else 1
        sFac = smem.allocate_tensor(Float32, cute.make_layout((C, 3 * nf), stride=(1, C)), 16)
        sDec = smem.allocate_tensor(Float32, cute.make_layout(2), 16)
        lane = tid % 32
        sFacW = sFac
        if const_expr(self.warp_factors):
            sFacW = cute.make_tensor(sFac.iterator + (tid // 32) * (3 * C), cute.make_layout((C, 3), stride=(1, C)))
        # B operand of the state update: k viewed as (key channel, row)
        sKt = cute.make_tensor(sK.iterator, cute.make_layout((K, C, 2), stride=(1, PK, C * PK)))

        # ---------------- MMA partitions -------------------------------------------------------
        thr_mma = tiled_mma.get_slice(tid)
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((BV, K)), Float32)
        tScS = thr_mma.partition_C(cute.make_identity_tensor((BV, K)))
        acc_X = cute.make_rmem_tensor(thr_mma.partition_shape_C((BV, C)), Float32)  # P1, then X
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((BV, C)), Float32)  # P2, then O^T
        acc_N = cute.make_rmem_tensor(thr_mma.partition_shape_C((BV, C)), Float32)  # Vn^T
        tPcP = thr_mma.partition_C(cute.make_identity_tensor((BV, C)))

        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), BFloat16)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16)
        s2r = cute.make_tiled_copy_B(ldsm, tiled_mma)
        s2r_t = cute.make_tiled_copy_B(ldsm_t, tiled_mma)
        thr_s2r = s2r.get_slice(tid)
        thr_s2r_t = s2r_t.get_slice(tid)
        # B operands, each (n, k) with the contraction over k: k, q (n = row, k = key channel);
        # Tb, Aqk (n = row r, k = row s); k for the update (n = key channel, k = row)
        tKr = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tQr = thr_mma.make_fragment_B(thr_mma.partition_B(sQ[None, None, 0]))
        tTr = thr_mma.make_fragment_B(thr_mma.partition_B(sT[None, None, 0]))
        tAr = thr_mma.make_fragment_B(thr_mma.partition_B(sA[None, None, 0]))
        tUr = thr_mma.make_fragment_B(thr_mma.partition_B(sKt[None, None, 0]))
        tKs, tKr_v = thr_s2r.partition_S(sK), thr_s2r.retile(tKr)
        tQs, tQr_v = thr_s2r.partition_S(sQ), thr_s2r.retile(tQr)
        tTs, tTr_v = thr_s2r.partition_S(sT), thr_s2r.retile(tTr)
        tAs, tAr_v = thr_s2r.partition_S(sA), thr_s2r.retile(tAr)
        tUs, tUr_v = thr_s2r_t.partition_S(sKt), thr_s2r_t.retile(tUr)

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
        tOc = thr_o.partition_S(cute.make_identity_tensor((C, BV)))

        # ---------------- entering state -------------------------------------------------------
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
            cute.arch.sync_threads()

            # (a) the chunk's gate and scale factors
            dec = Float32(1.0)
            cs = Float32(1.0)
            if const_expr(self.warp_factors):
                dec, cs = self.warp_factors_of(stage, lane, sRow, sFacW)
                cute.arch.sync_warp()
            else:
                if tid < C:
                    self.factors(stage, tid, sRow, sFac, sDec)
                cute.arch.sync_threads()
                dec = sDec[0]
                cs = sDec[1]

            # (b) P1 = bf16(c S^T) k^T, P2 = bf16(c S^T) q^T  (F44: c = 1 unless a query row reaches 2**32)
            rS = cute.make_fragment_like(acc_S, BFloat16)
            rS.store((acc_S.load() * cs).to(BFloat16))
            tSA = self.acc_as_a(rS)
            acc_X.fill(0.0)
            acc_O.fill(0.0)
            for kb in cutlass.range_constexpr(K // 16):
                cute.copy(s2r, tKs[None, None, kb, stage], tKr_v[None, None, kb])
                cute.copy(s2r, tQs[None, None, kb, stage], tQr_v[None, None, kb])
                cute.gemm(tiled_mma, acc_X, tSA[None, None, kb], tKr[None, None, kb], acc_X)
                cute.gemm(tiled_mma, acc_O, tSA[None, None, kb], tQr[None, None, kb], acc_O)

            # (c) X = v^T - P1 diag(fx); Vn^T = bf16(X) Tb^T
            for i in cutlass.range_constexpr(cute.size(acc_X)):
                crd = tPcP[i]  # (value channel, row)
                acc_X[i] = Float32(sV[crd[1], crd[0], stage]) - acc_X[i] * sFacW[crd[1], 0]
            rX = cute.make_fragment_like(acc_X, BFloat16)
            rX.store(acc_X.load().to(BFloat16))
            tXA = self.acc_as_a(rX)
            acc_N.fill(0.0)
            for kb in cutlass.range_constexpr(C // 16):
                cute.copy(s2r, tTs[None, None, kb, stage], tTr_v[None, None, kb])
                cute.gemm(tiled_mma, acc_N, tXA[None, None, kb], tTr[None, None, kb], acc_N)

            # (d) O^T = P2 diag(fo) + bf16(Vn^T) Aqk^T
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                acc_O[i] = acc_O[i] * sFacW[tPcP[i][1], 1]
            rN = cute.make_fragment_like(acc_N, BFloat16)
            rN.store(acc_N.load().to(BFloat16))
            tNA = self.acc_as_a(rN)
            for kb in cutlass.range_constexpr(C // 16):
                cute.copy(s2r, tAs[None, None, kb, stage], tAr_v[None, None, kb])
                cute.gemm(tiled_mma, acc_O, tNA[None, None, kb], tAr[None, None, kb], acc_O)
            # O^T into this stage's value tile (each thread overwrites only the elements it read in (c))
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                crd = tPcP[i]
                sV[crd[1], crd[0], stage] = BFloat16(acc_O[i] * keep)

            # (e) S^T = dec S^T + bf16(Vn^T diag(fs)) k
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = acc_S[i] * dec
            for i in cutlass.range_constexpr(cute.size(acc_N)):
                acc_N[i] = acc_N[i] * sFacW[tPcP[i][1], 2]
            rU = cute.make_fragment_like(acc_N, BFloat16)
            rU.store(acc_N.load().to(BFloat16))
            tUA = self.acc_as_a(rU)
            for kb in cutlass.range_constexpr(C // 16):
                cute.copy(s2r_t, tUs[None, None, kb, stage], tUr_v[None, None, kb])
                cute.gemm(tiled_mma, acc_S, tUA[None, None, kb], tUr[None, None, kb], acc_S)
            cute.arch.sync_threads()

            # (f) the output rows of this chunk: sV (now O^T as [row, value]) -> o[row, hv, v0:v0+BV]
            row0 = bos + Int64(t * C)
            store_rows(o_ptr + (row0 * Int64(HV * V) + hv64 * Int64(V) + Int64(v0)), HV * V, row0, eos, BV,
                       thr_o, tOs, tOc, store_o, stage)
            cute.arch.sync_threads()  # the next iteration's loads overwrite this stage

        cute.arch.cp_async_wait_group(0)

        # ---------------- final state ----------------------------------------------------------
        if live:
            ht = cute.make_tensor(ht_ptr + (slot * st_p + hv64 * st_h + Int64(v0) * Int64(st_v)),
                                  cute.make_layout((BV, K), stride=(st_v, st_k)))
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                ht[tScS[i]] = acc_S[i].to(ht.element_type)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def entering_state(self, acc_S, tScS, i_n, N, sidx_ptr, hinit_ptr, h0_ptr, s0_p, s0_h, s0_v, s0_k, hv64, v0):
        """The state ``acc_S`` a sequence enters with (zero, ``h0`` of its pool slot or its dense row) and
        ``(live, slot, keep)``: whether it writes (padding: a negative slot does not), its slot, and the
        output rows' factor (0 for padding). Both builds (``mma.sync`` and :mod:`._fused_walk_wgmma_kernel`)."""
        K, BV = self.K, self.BV
        acc_S.fill(0.0)
        live = True
        slot = Int64(i_n)
        keep = Float32(1.0)
        if const_expr(self.pool):
            msidx = cute.make_tensor(sidx_ptr, cute.make_layout(N))
            slot = Int64(msidx[i_n])
            live = slot >= 0
            keep = Float32(cutlass.select_(live, Float32(1.0), Float32(0.0)))  # padding: zero output rows
            carry = Int32(1)
            if const_expr(self.has_init):  # has_initial_state[n] == 0: a zero h0, the slot not read
                mhinit = cute.make_tensor(hinit_ptr, cute.make_layout(N))
                carry = Int32(mhinit[i_n])
            if live:
                if carry != 0:
                    load_state_block(acc_S, tScS, h0_ptr + (slot * s0_p + hv64 * s0_h + Int64(v0) * Int64(s0_v)),
                                     BV, K, s0_v, s0_k)
        elif const_expr(self.has_h0):
            load_state_block(acc_S, tScS, h0_ptr + (Int64(i_n) * s0_p + hv64 * s0_h + Int64(v0) * Int64(s0_v)),
                             BV, K, s0_v, s0_k)
        return live, slot, keep

    @cute.jit
    def acc_as_a(self, r: cute.Tensor) -> cute.Tensor:
        """View an m16n8 accumulator-layout fragment (4, M, N) as an m16n8k16 A operand
        ((4, 2), M, N / 2): two neighbouring n8 tiles form one k16 slice."""
        d = cute.logical_divide(r.layout, (None, None, 2))
        lay = cute.make_layout(
            ((d.shape[0], d.shape[2][0]), d.shape[1], d.shape[2][1]),
            stride=((d.stride[0], d.stride[2][0]), d.stride[1], d.stride[2][1]),
        )
        return cute.make_tensor(r.iterator, lay)

    @cute.jit
    def warp_factors_of(self, stage, lane, sRow, sF):
        """The chunk's factors (module docstring) formed by one warp, lane ``l`` taking rows ``l`` and
        ``l + 32``, into the warp's own ``sF [C, 3]``; returns ``(e^(G_C), c)``. Prefix sums ``G`` and
        suffix sums ``sum_{j>r} g_j`` by shuffle scans over each half, the halves joined by adding the
        other half's total; the suffixes summed directly (never ``G_C - G``: no cancellation where
        the gates are strongly negative), as the Triton walk's reverse cumsum."""
        g_min = Float32(self.g_min)
        zero = Float32(0.0)
        glo = cute.arch.fmax(sRow[lane, 0, stage], g_min)
        ghi = cute.arch.fmax(sRow[lane + 32, 0, stage], g_min)
        plo, phi, rlo, rhi = glo, ghi, glo, ghi
        for s in cutlass.range_constexpr(5):  # inclusive scans: prefix (up), suffix (down)
            off = 1 << s
            ulo = cute.arch.shuffle_sync_up(plo, off)
            uhi = cute.arch.shuffle_sync_up(phi, off)
            dlo = cute.arch.shuffle_sync_down(rlo, off)
            dhi = cute.arch.shuffle_sync_down(rhi, off)
            plo = plo + cutlass.select_(lane >= off, ulo, zero)
            phi = phi + cutlass.select_(lane >= off, uhi, zero)
            rlo = rlo + cutlass.select_(lane + off < 32, dlo, zero)
            rhi = rhi + cutlass.select_(lane + off < 32, dhi, zero)
        phi = phi + cute.arch.shuffle_sync(plo, 31)  # the lower half's total
        total = cute.arch.shuffle_sync(phi, 31)
        thi = cute.arch.shuffle_sync(rhi, 0)  # the upper half's total
        slo = cute.arch.shuffle_sync_down(rlo, 1)
        shi = cute.arch.shuffle_sync_down(rhi, 1)
        slo = cutlass.select_(lane == 31, zero, slo) + thi  # exclusive: sum over j > r
        shi = cutlass.select_(lane == 31, zero, shi)
        c = cute.arch.fmin(sRow[lane, 3, stage], sRow[lane + 32, 3, stage])
        for s in cutlass.range_constexpr(5):
            c = cute.arch.fmin(c, cute.arch.shuffle_sync_bfly(c, 1 << s))
        ic = Float32(1.0) / c  # c a power of two in [2**-96, 1]: exact
        for h in cutlass.range_constexpr(2):
            r = lane + 32 * h
            eg = cute.math.exp(plo if h == 0 else phi, fastmath=False)
            rkv = sRow[r, 1, stage]
            sF[r, 0] = rkv * eg * ic
            sF[r, 1] = sRow[r, 2, stage] * eg * (sRow[r, 3, stage] * ic)
            sF[r, 2] = rkv * cute.math.exp(slo if h == 0 else shi, fastmath=False)
        return cute.math.exp(total, fastmath=False), c

    @cute.jit
    def factors(self, stage, tid, sRow, sFac, sDec):
        """Row ``tid``'s factors (module docstring) from the stage's g, rk, qs; ``sDec = (e^(G_C), c)``
        (the last row and row 0 write them). Sums as the Triton walk: a prefix ``G`` and a suffix."""
        g_min = Float32(self.g_min)
        pre = Float32(0.0)
        suf = Float32(0.0)
        c = Float32(1.0)
        for j in cutlass.range(C, unroll=8):
            gj = cute.arch.fmax(sRow[j, 0, stage], g_min)
            pre = pre + cutlass.select_(j <= tid, gj, Float32(0.0))
            suf = suf + cutlass.select_(j <= tid, Float32(0.0), gj)
            c = cute.arch.fmin(c, sRow[j, 3, stage])
        ic = Float32(1.0) / c  # c a power of two in [2**-96, 1]: exact
        eg = cute.math.exp(pre, fastmath=False)
        rkv = sRow[tid, 1, stage]
        sFac[tid, 0] = rkv * eg * ic
        sFac[tid, 1] = sRow[tid, 2, stage] * eg * (sRow[tid, 3, stage] * ic)
        sFac[tid, 2] = rkv * cute.math.exp(suf, fastmath=False)
        if tid == C - 1:
            sDec[0] = eg
        if tid == 0:
            sDec[1] = c

    @cute.jit
    def load_chunk(self, t, stage, bos, eos, q_ptr, k_ptr, v_ptr, g_ptr, tmb_ptr, aqk_ptr, rk_ptr, qs_ptr,
                   sqt, skt, svt, sgt, heads, hv64, HV, tid, copy_k, copy_v, copy_c, g2s4, thr_k, thr_v, thr_c,
                   sRow, tKsK, tQsQ, tKc, tVsV, tVc, tTsT, tAsA, tCc):
        """Issue the cp.async loads of chunk ``t`` into ``stage``; rows past the sequence are zeroed
        (``sq``: one), never read."""
        K, BV = self.K, self.BV
        q_head, k_head, v_head, g_head = heads
        row0 = bos + Int64(t * C)
        nrow = Int32(eos - row0)
        prow = (row0 * Int64(HV) + hv64) * Int64(C)  # the prep's [T, HV, 64] row of this chunk
        gK = cute.make_tensor((k_ptr + (row0 * skt + k_head)).align(16),
                              cute.make_layout((C, K), stride=(cute.assume(Int32(skt), divby=8), 1)))
        gQ = cute.make_tensor((q_ptr + (row0 * sqt + q_head)).align(16),
                              cute.make_layout((C, K), stride=(cute.assume(Int32(sqt), divby=8), 1)))
        gV = cute.make_tensor((v_ptr + (row0 * svt + v_head)).align(16),
                              cute.make_layout((C, BV), stride=(cute.assume(Int32(svt), divby=8), 1)))
        gT = cute.make_tensor((tmb_ptr + prow).align(16),
                              cute.make_layout((C, C), stride=(cute.assume(HV * C, divby=8), 1)))
        gA = cute.make_tensor((aqk_ptr + prow).align(16),
                              cute.make_layout((C, C), stride=(cute.assume(HV * C, divby=8), 1)))
        tKg, tQg = thr_k.partition_S(gK), thr_k.partition_S(gQ)
        tVg = thr_v.partition_S(gV)
        tTg, tAg = thr_c.partition_S(gT), thr_c.partition_S(gA)
        for m in cutlass.range_constexpr(cute.size(tKg, mode=[1])):
            if tKc[0, m, 0][0] < nrow:
                cute.copy(copy_k, tKg[None, m, None], tKsK[None, m, None, stage])
                cute.copy(copy_k, tQg[None, m, None], tQsQ[None, m, None, stage])
            else:
                tKsK[None, m, None, stage].fill(0.0)
                tQsQ[None, m, None, stage].fill(0.0)
        for m in cutlass.range_constexpr(cute.size(tVg, mode=[1])):
            if tVc[0, m, 0][0] < nrow:
                cute.copy(copy_v, tVg[None, m, None], tVsV[None, m, None, stage])
            else:
                tVsV[None, m, None, stage].fill(0.0)
        for m in cutlass.range_constexpr(cute.size(tTg, mode=[1])):
            if tCc[0, m, 0][0] < nrow:
                cute.copy(copy_c, tTg[None, m, None], tTsT[None, m, None, stage])
                cute.copy(copy_c, tAg[None, m, None], tAsA[None, m, None, stage])
            else:
                tTsT[None, m, None, stage].fill(0.0)
                tAsA[None, m, None, stage].fill(0.0)
        # per-row scalars: g, rk, qs[0], qs[1] (one 4-byte cp.async each)
        if tid < C:
            row = row0 + Int64(tid)
            rh = row * Int64(HV) + hv64
            srcs = (g_ptr + (row * sgt + g_head), rk_ptr + rh, qs_ptr + rh * Int64(2), qs_ptr + (rh * Int64(2) + 1))
            for j in cutlass.range_constexpr(4):
                dst = cute.make_tensor(sRow.iterator + (stage * 4 * C + j * C + tid), cute.make_layout(1))
                if tid < nrow:
                    cute.copy(g2s4, cute.make_tensor(srcs[j], cute.make_layout(1)), dst)
                else:
                    dst[0] = Float32(1.0 if j == 3 else 0.0)
