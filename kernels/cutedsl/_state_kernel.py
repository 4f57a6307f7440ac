"""The CuTe DSL chunked-prefill state kernel (imports ``cutlass``: load it only through
:mod:`linattn.kernels.cutedsl.chunk_state`, which imports this module lazily).

One CTA of ``NW`` warps owns one (sequence ``n``, value head ``hv``, value block of ``BV = 16 NW``
columns) and walks the sequence's chunks of ``C = 64`` rows in order. The state is held
transposed, ``S^T [BV, K]`` (rows: value channels, columns: key channels), in fp32 registers as
the accumulator of a warp-level MMA (``mma.sync`` m16n8k16, bf16 operands, fp32 accumulation;
present on SM80, SM90 and SM100 alike). Warps split the ``BV`` rows, so every MMA operand that
comes from registers stays in the warp that produced it. Per chunk (maths: docs/ops.md "Chunked
form"; maths layout ``S [K, V]``)::

    hbuf[c] = bf16(S)                                   (via shared memory, coalesced)
    Vn^T    = U^T - bf16(S^T) @ W^T                     GEMM 1: A = state (registers), B = W (smem)
    vn      = bf16(Vn)                                  (in place of U in shared memory)
    GDN:  S^T = exp(g_tot) S^T + bf16(Vn^T * f) @ K     f_r = exp(sum_{j>r} g_j) rk_r
    KDA:  S^T = S^T diag(exp(g_tot)) + bf16(Vn^T) @ Kd  Kd_rd = k_rd exp(sum_{j>r} g_jd) rk_r
                                                        GEMM 2: A = Vn (registers), B = K (smem)

Tail sums ``sum_{j>r} g_j`` are accumulated directly (never as a difference of two cumulative
sums), so strongly negative gates lose no precision. Loads of W, U, K (and KDA's gates) for the
next chunk are issued with ``cp.async`` while the current chunk computes (two stages); rows past
the end of the sequence are zero-filled, never read.

Initial state: pool mode reads ``state_pool[state_indices[n]]`` (unless ``has_initial_state[n]`` is
False: then a zero state, the slot not read) and stores the final state to the same row; a
negative index reads nothing (zero state), stores nothing, and writes zero ``vn`` and ``hbuf`` for
the sequence, so the output stage gives the zero output docs/ops.md asks of padding. Dense mode reads
``initial_state[n]`` (or zeros) and writes ``final_state[n]``. Both modes run the same
instructions on the same data, so they agree bitwise. All token-row, chunk and pool offsets are
64-bit. State checkpoints (pool mode, ``ckpt``; docs/ops.md "State checkpoints"): after a chunk
that ends at a multiple of ``ck_every`` chunks, full, the state goes to the slot the table
``[N, ck_n]`` names for it (none for ``-1``, past the table, or a padding sequence), stored as the
final state is.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warp


def load_state_block(acc_S, tScS, base, BV, K, s_v, s_k) -> None:
    """The fp32 registers ``acc_S`` from the ``[BV, K]`` state block at ``base`` (value-row stride ``s_v``,
    key stride ``s_k``), register ``i`` from the thread's coordinate ``tScS[i]``. A plain function,
    traced inline where a kernel calls it (this state kernel's and the fused walk's entering state): not
    preprocessed by CuTe DSL, so its Python loop is unrolled at trace time, as ``range_constexpr`` is in a kernel."""
    block = cute.make_tensor(base, cute.make_layout((BV, K), stride=(s_v, s_k)))
    for i in range(cute.size(acc_S)):
        acc_S[i] = Float32(block[tScS[i]])


C = 64  # chunk rows


@cute.jit
def store_rows(base, pitch, row0, eos, BV: cutlass.Constexpr[int], thr, tS, tC, copy, stage):
    """A chunk's ``[C, BV]`` bf16 tile from shared memory to the rows at ``base`` (row pitch ``pitch``
    elements, a multiple of 8) by ``copy``'s 16-byte stores, the rows of the sequence only (the chunk's first
    token ``row0``, the sequence's end ``eos``): ``tS`` the tile's
    stages and ``tC`` its coordinates as ``thr`` partitions them, ``stage`` the one stored. Shared by this
    kernel's new-value rows and the fused walks' output rows."""
    g = cute.make_tensor(base.align(16), cute.make_layout((C, BV), stride=(cute.assume(pitch, divby=8), 1)))
    tG = thr.partition_D(g)
    tR = cute.make_fragment_like(tS[None, None, None, 0])
    cute.autovec_copy(tS[None, None, None, stage], tR)
    nrow = Int32(eos - row0)
    for m in cutlass.range_constexpr(cute.size(tR, mode=[1])):
        if tC[0, m, 0][0] < nrow:
            cute.copy(copy, tR[None, m, None], tG[None, m, None])


class StateKernel:
    """Static configuration of one compiled state kernel (everything that changes the code).

    Args:
        K, V: head dims (multiples of 16; K in {64, 128}, V a multiple of ``BV``).
        BV: value columns per CTA (16 per warp: 32, 64 or 128).
        kda: per-channel gates (KDA) instead of one gate per value head (GDN).
        pool: pool mode (h0 from and ht to ``state_pool[state_indices[n]]``).
        has_h0: dense mode with an initial state (ignored in pool mode).
        has_init: pool mode with a ``has_initial_state [N]`` byte mask: 0 = a zero h0, the slot
            not read (the final state is stored as usual).
        ckpt: pool mode with state checkpoints (``ck_ptr``: the ``[N, ck_n]`` slot table; ``ck_every``:
            checkpoint_every in chunks). Without it the three are not read.
    """

    def __init__(self, K: int, V: int, BV: int, kda: bool, pool: bool, has_h0: bool, has_init: bool = False,
                 ckpt: bool = False):
        assert K % 16 == 0 and V % BV == 0 and BV % 16 == 0
        self.K, self.V, self.BV = K, V, BV
        self.kda, self.pool, self.has_h0 = kda, pool, has_h0
        self.has_init = has_init and pool
        self.ckpt = ckpt and pool
        self.NW = BV // 16
        self.NT = 32 * self.NW
        self.PK = K + 8  # padded smem row pitch (elements) of the W and K tiles
        self.PV = BV + 8  # padded smem row pitch of the U / Vn tile
        self.PH = BV + 8  # padded smem row pitch of the h tile [K, BV]
        assert (self.K // 8) <= self.NT and self.NT % (self.K // 8) == 0
        assert self.NT % (BV // 8) == 0

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        k_ptr: cute.Pointer, g_ptr: cute.Pointer, w_ptr: cute.Pointer, u_ptr: cute.Pointer,
        rk_ptr: cute.Pointer, cu_ptr: cute.Pointer, coff_ptr: cute.Pointer, sidx_ptr: cute.Pointer,
        h0_ptr: cute.Pointer, ht_ptr: cute.Pointer, hbuf_ptr: cute.Pointer, vn_ptr: cute.Pointer,
        hinit_ptr: cute.Pointer, ck_ptr: cute.Pointer,
        skt: Int64, skh: Int64, sgt: Int64, sgh: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32, ck_n: Int32, ck_every: Int32,
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
        g2s32f = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Float32, num_bits_per_copy=128)
        g2s4 = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
        st16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        # thread layouts of the row-tile copies (8 bf16 = 16 bytes per thread per row piece)
        tk = K // 8
        copy_wk = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((NT // tk, tk), stride=(tk, 1)), cute.make_layout((1, 8)))
        tv = BV // 8
        copy_u = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((NT // tv, tv), stride=(tv, 1)), cute.make_layout((1, 8)))
        store_v = cute.make_tiled_copy_tv(
            st16, cute.make_layout((NT // tv, tv), stride=(tv, 1)), cute.make_layout((1, 8)))
        tg = K // 4
        copy_g = cute.make_tiled_copy_tv(
            g2s32f, cute.make_layout((NT // tg, tg), stride=(tg, 1)), cute.make_layout((1, 4)))
        nvb = self.V // BV
        self.kernel(
            k_ptr, g_ptr, w_ptr, u_ptr, rk_ptr, cu_ptr, coff_ptr, sidx_ptr, h0_ptr, ht_ptr,
            hbuf_ptr, vn_ptr, hinit_ptr, ck_ptr, skt, skh, sgt, sgh, s0_p, s0_h, s0_v, s0_k, st_p, st_h, st_v, st_k,
            N, HV, GROUP, ck_n, ck_every, tiled_mma, copy_wk, copy_u, store_v, copy_g, g2s4,
        ).launch(grid=[N * HV * nvb, 1, 1], block=[NT, 1, 1], stream=stream)

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        k_ptr: cute.Pointer, g_ptr: cute.Pointer, w_ptr: cute.Pointer, u_ptr: cute.Pointer,
        rk_ptr: cute.Pointer, cu_ptr: cute.Pointer, coff_ptr: cute.Pointer, sidx_ptr: cute.Pointer,
        h0_ptr: cute.Pointer, ht_ptr: cute.Pointer, hbuf_ptr: cute.Pointer, vn_ptr: cute.Pointer,
        hinit_ptr: cute.Pointer, ck_ptr: cute.Pointer,
        skt: Int64, skh: Int64, sgt: Int64, sgh: Int64,
        s0_p: Int64, s0_h: Int64, s0_v: Int32, s0_k: Int32,
        st_p: Int64, st_h: Int64, st_v: Int32, st_k: Int32,
        N: Int32, HV: Int32, GROUP: Int32, ck_n: Int32, ck_every: Int32,
        tiled_mma: cute.TiledMma, copy_wk: cute.TiledCopy, copy_u: cute.TiledCopy,
        store_v: cute.TiledCopy, copy_g: cute.TiledCopy, g2s4: cute.CopyAtom,
    ):
        K, V, BV, PK, PV, PH = self.K, self.V, self.BV, self.PK, self.PV, self.PH
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
        mcoff = cute.make_tensor(coff_ptr, cute.make_layout(N + 1))
        bos = Int64(mcu[i_n])
        eos = Int64(mcu[i_n + 1])
        c_first = Int64(mcoff[i_n])
        seqlen = Int32(eos - bos)
        nc = (seqlen + (C - 1)) // C
        hv64 = Int64(i_hv)
        HVV = HV * V
        HVK = HV * K

        # ---------------- shared memory --------------------------------------------------------
        smem = cutlass.utils.SmemAllocator()
        sW = smem.allocate_tensor(BFloat16, cute.make_layout((C, K, 2), stride=(PK, 1, C * PK)), 16)
        sKb = smem.allocate_tensor(BFloat16, cute.make_layout((C, K, 2), stride=(PK, 1, C * PK)), 16)
        sU = smem.allocate_tensor(BFloat16, cute.make_layout((C, BV, 2), stride=(PV, 1, C * PV)), 16)
        sH = smem.allocate_tensor(BFloat16, cute.make_layout((K, BV), stride=(PH, 1)), 16)
        sRk = smem.allocate_tensor(Float32, cute.make_layout((C, 2), stride=(1, C)), 16)
        sFac = smem.allocate_tensor(Float32, cute.make_layout(C), 16)
        sDec = smem.allocate_tensor(Float32, cute.make_layout(K), 16)
        if const_expr(self.kda):
            sG = smem.allocate_tensor(Float32, cute.make_layout((C, K, 2), stride=(K, 1, C * K)), 16)
        else:
            sG = smem.allocate_tensor(Float32, cute.make_layout((C, 2), stride=(1, C)), 16)
        # B operand of GEMM 2: K viewed as (key channel, row): B[n = d, k = r] = Kd[r, d]
        sKt = cute.make_tensor(sKb.iterator, cute.make_layout((K, C, 2), stride=(1, PK, C * PK)))

        # ---------------- MMA partitions -------------------------------------------------------
        thr_mma = tiled_mma.get_slice(tid)
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((BV, K)), Float32)
        tScS = thr_mma.partition_C(cute.make_identity_tensor((BV, K)))
        acc_P = cute.make_rmem_tensor(thr_mma.partition_shape_C((BV, C)), Float32)
        tPcP = thr_mma.partition_C(cute.make_identity_tensor((BV, C)))

        tWr = thr_mma.make_fragment_B(thr_mma.partition_B(sW[None, None, 0]))
        tKr = thr_mma.make_fragment_B(thr_mma.partition_B(sKt[None, None, 0]))
        s2r_w = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), BFloat16), tiled_mma)
        s2r_k = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16), tiled_mma)
        thr_s2r_w = s2r_w.get_slice(tid)
        thr_s2r_k = s2r_k.get_slice(tid)
        tWs = thr_s2r_w.partition_S(sW)
        tWr_v = thr_s2r_w.retile(tWr)
        tKs = thr_s2r_k.partition_S(sKt)
        tKr_v = thr_s2r_k.retile(tKr)

        # ---------------- copy partitions ------------------------------------------------------
        thr_wk = copy_wk.get_slice(tid)
        thr_u = copy_u.get_slice(tid)
        thr_st = store_v.get_slice(tid)
        tWsW = thr_wk.partition_D(sW)
        tKsK = thr_wk.partition_D(sKb)
        tWc = thr_wk.partition_S(cute.make_identity_tensor((C, K)))
        tUsU = thr_u.partition_D(sU)
        tUc = thr_u.partition_S(cute.make_identity_tensor((C, BV)))
        tHs = thr_st.partition_S(sH)
        tVs = thr_st.partition_S(sU)
        tVc = thr_st.partition_S(cute.make_identity_tensor((C, BV)))

        # ---------------- initial state --------------------------------------------------------
        acc_S.fill(0.0)
        live = True
        slot = Int64(0)
        keep = Float32(1.0)
        if const_expr(self.pool):
            msidx = cute.make_tensor(sidx_ptr, cute.make_layout(N))
            slot = Int64(msidx[i_n])
            live = slot >= 0
            # padding: Vn (hence the state and hbuf) stays zero, so the output stage writes zeros
            keep = Float32(cutlass.select_(live, Float32(1.0), Float32(0.0)))
            if const_expr(self.has_init):  # has_initial_state[n] == 0: a zero h0, the slot is not read
                mhinit = cute.make_tensor(hinit_ptr, cute.make_layout(N))
                carry = Int32(mhinit[i_n])
                if live:
                    if carry != 0:
                        load_state_block(acc_S, tScS, h0_ptr + (slot * s0_p + hv64 * s0_h + Int64(v0) * Int64(s0_v)),
                                         BV, K, s0_v, s0_k)
            else:  # the code measured on the H200, unchanged
                if live:
                    load_state_block(acc_S, tScS, h0_ptr + (slot * s0_p + hv64 * s0_h + Int64(v0) * Int64(s0_v)),
                                     BV, K, s0_v, s0_k)
        elif const_expr(self.has_h0):
            load_state_block(acc_S, tScS, h0_ptr + (Int64(i_n) * s0_p + hv64 * s0_h + Int64(v0) * Int64(s0_v)),
                             BV, K, s0_v, s0_k)

        # ---------------- chunk loads (cp.async, rows past the sequence zero-filled) ----------
        k_head = Int64(i_h) * skh
        g_head = hv64 * sgh

        # prologue: chunk 0 into stage 0
        if nc > 0:
            self.load_chunk(0, 0, bos, eos, k_ptr, g_ptr, w_ptr, u_ptr, rk_ptr, skt, k_head, sgt, g_head,
                            hv64, HVK, HVV, v0, tid, copy_wk, copy_u, copy_g, g2s4,
                            sW, sKb, sU, sG, sRk, tWsW, tKsK, tWc, tUsU, tUc)
        cute.arch.cp_async_commit_group()

        for t in cutlass.range(nc, unroll=1):
            stage = t % 2
            if t + 1 < nc:
                self.load_chunk(t + 1, 1 - stage, bos, eos, k_ptr, g_ptr, w_ptr, u_ptr, rk_ptr, skt, k_head,
                                sgt, g_head, hv64, HVK, HVV, v0, tid, copy_wk, copy_u, copy_g, g2s4,
                                sW, sKb, sU, sG, sRk, tWsW, tKsK, tWc, tUsU, tUc)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(1)
            cute.arch.sync_threads()

            # (b) gate factors; bf16 state to sH (for hbuf) and as the A operand of GEMM 1
            if const_expr(self.kda):
                self.kda_factors(stage, tid, sG, sKb, sRk, sDec)
            else:
                if tid < C:
                    tail = Float32(0.0)
                    for j in cutlass.range(tid + 1, C, unroll=1):
                        tail = tail + sG[j, stage]
                    sFac[tid] = cute.math.exp(tail, fastmath=False) * sRk[tid, stage]
                    if tid == 0:
                        sDec[0] = cute.math.exp(tail + sG[0, stage], fastmath=False)
            rS = cute.make_fragment_like(acc_S, BFloat16)
            rS.store(acc_S.load().to(BFloat16))
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                crd = tScS[i]
                sH[crd[1], crd[0]] = rS[i]
            cute.arch.sync_threads()

            # (c) h of this chunk: sH -> hbuf[c, hv, :, v0:v0+BV]
            chunk = c_first + Int64(t)
            gH = cute.make_tensor((hbuf_ptr + ((chunk * Int64(HV) + hv64) * Int64(K * V) + Int64(v0))).align(16),
                                  cute.make_layout((K, BV), stride=(V, 1)))
            tHg = thr_st.partition_D(gH)
            tHr = cute.make_fragment_like(tHs)
            cute.autovec_copy(tHs, tHr)
            cute.copy(store_v, tHr, tHg)

            # (d) GEMM 1: P = S^T W^T  (BV x C), then Vn = U - P
            tSA = self.acc_as_a(rS)
            acc_P.fill(0.0)
            for kb in cutlass.range_constexpr(K // 16):
                cute.copy(s2r_w, tWs[None, None, kb, stage], tWr_v[None, None, kb])
                cute.gemm(tiled_mma, acc_P, tSA[None, None, kb], tWr[None, None, kb], acc_P)
            for i in cutlass.range_constexpr(cute.size(acc_P)):
                crd = tPcP[i]  # (value channel, row)
                vn = Float32(sU[crd[1], crd[0], stage]) - acc_P[i]
                if const_expr(self.pool):
                    vn = vn * keep
                vnb = BFloat16(vn)
                sU[crd[1], crd[0], stage] = vnb
                if const_expr(self.kda):
                    acc_P[i] = Float32(vnb)
                else:
                    acc_P[i] = vn * sFac[crd[1]]

            # (e) decay the state, GEMM 2: S^T += Vn^T Kd
            if const_expr(self.kda):
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    acc_S[i] = acc_S[i] * sDec[tScS[i][1]]
            else:
                dec = sDec[0]
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    acc_S[i] = acc_S[i] * dec
            rP = cute.make_fragment_like(acc_P, BFloat16)
            rP.store(acc_P.load().to(BFloat16))
            tPA = self.acc_as_a(rP)
            for kb in cutlass.range_constexpr(C // 16):
                cute.copy(s2r_k, tKs[None, None, kb, stage], tKr_v[None, None, kb])
                cute.gemm(tiled_mma, acc_S, tPA[None, None, kb], tKr[None, None, kb], acc_S)
            if const_expr(self.ckpt):  # the state after t + 1 chunks, where a checkpoint falls there
                self.store_checkpoint(t, i_n, seqlen, live, ck_ptr, ck_n, ck_every, N, ht_ptr, hv64, v0, st_p, st_h,
                                      st_v, st_k, acc_S, tScS)
            cute.arch.sync_threads()

            # (f) vn rows of this chunk: sU (now Vn) -> vn[row, hv, v0:v0+BV]
            row0 = bos + Int64(t * C)
            store_rows(vn_ptr + (row0 * Int64(HVV) + hv64 * Int64(V) + Int64(v0)), HVV, row0, eos, BV, thr_st,
                       tVs, tVc, store_v, stage)
            # the next iteration's loads overwrite this stage's U (now Vn) tile
            cute.arch.sync_threads()

        cute.arch.cp_async_wait_group(0)

        # ---------------- final state ----------------------------------------------------------
        if const_expr(self.pool):
            if live:
                ht = cute.make_tensor(ht_ptr + (slot * st_p + hv64 * st_h + Int64(v0) * Int64(st_v)),
                                      cute.make_layout((BV, K), stride=(st_v, st_k)))
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    ht[tScS[i]] = acc_S[i].to(ht.element_type)
        else:
            ht = cute.make_tensor(ht_ptr + (Int64(i_n) * st_p + hv64 * st_h + Int64(v0) * Int64(st_v)),
                                  cute.make_layout((BV, K), stride=(st_v, st_k)))
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                ht[tScS[i]] = acc_S[i].to(ht.element_type)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def store_checkpoint(self, t, i_n, seqlen, live, ck_ptr, ck_n, ck_every, N, ht_ptr, hv64, v0, st_p, st_h, st_v,
                         st_k, acc_S: cute.Tensor, tScS: cute.Tensor):
        """Checkpoint ``j = (t + 1) / ck_every - 1`` of sequence ``i_n`` after chunk ``t``: where ``t + 1``
        is a multiple of ``ck_every``, the chunk full (``(t + 1) C <= seqlen``), ``j < ck_n``, the
        sequence live and ``ck_ptr[i_n, j] >= 0``, the fp32 state ``acc_S`` goes to that pool row in
        the pool's dtype and strides, as the final state is stored."""
        done = Int32(t + 1)
        if live:
            if done % ck_every == 0:
                j = done // ck_every - 1
                if j < ck_n:
                    if done * C <= seqlen:
                        mck = cute.make_tensor(ck_ptr, cute.make_layout(N * ck_n))
                        cs = Int64(mck[i_n * ck_n + j])
                        if cs >= 0:
                            ck = cute.make_tensor(ht_ptr + (cs * st_p + hv64 * st_h + Int64(v0) * Int64(st_v)),
                                                  cute.make_layout((self.BV, self.K), stride=(st_v, st_k)))
                            for i in cutlass.range_constexpr(cute.size(acc_S)):
                                ck[tScS[i]] = acc_S[i].to(ck.element_type)

    # ------------------------------------------------------------------------------------------
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
    def load_chunk(self, t, stage, bos, eos, k_ptr, g_ptr, w_ptr, u_ptr, rk_ptr, skt, k_head, sgt, g_head,
                   hv64, HVK, HVV, v0, tid, copy_wk, copy_u, copy_g, g2s4,
                   sW, sKb, sU, sG, sRk, tWsW, tKsK, tWc, tUsU, tUc):
        """Issue the cp.async loads of chunk ``t`` into ``stage``; rows >= the sequence end are zeroed."""
        K, V, BV = self.K, self.V, self.BV
        row0 = bos + Int64(t * C)
        nrow = Int32(eos - row0)
        thr_wk = copy_wk.get_slice(tid)
        thr_u = copy_u.get_slice(tid)
        gW = cute.make_tensor((w_ptr + (row0 * Int64(HVK) + hv64 * Int64(K))).align(16),
                              cute.make_layout((C, K), stride=(cute.assume(HVK, divby=8), 1)))
        gK = cute.make_tensor((k_ptr + (row0 * skt + k_head)).align(16),
                              cute.make_layout((C, K), stride=(cute.assume(Int32(skt), divby=8), 1)))
        gU = cute.make_tensor((u_ptr + (row0 * Int64(HVV) + hv64 * Int64(V) + Int64(v0))).align(16),
                              cute.make_layout((C, BV), stride=(cute.assume(HVV, divby=8), 1)))
        tWg = thr_wk.partition_S(gW)
        tKg = thr_wk.partition_S(gK)
        tUg = thr_u.partition_S(gU)
        for m in cutlass.range_constexpr(cute.size(tWg, mode=[1])):
            if tWc[0, m, 0][0] < nrow:
                cute.copy(copy_wk, tWg[None, m, None], tWsW[None, m, None, stage])
                cute.copy(copy_wk, tKg[None, m, None], tKsK[None, m, None, stage])
            else:
                tWsW[None, m, None, stage].fill(0.0)
                tKsK[None, m, None, stage].fill(0.0)
        for m in cutlass.range_constexpr(cute.size(tUg, mode=[1])):
            if tUc[0, m, 0][0] < nrow:
                cute.copy(copy_u, tUg[None, m, None], tUsU[None, m, None, stage])
            else:
                tUsU[None, m, None, stage].fill(0.0)
        # per-row key norms (and GDN gates): one 4-byte cp.async per row
        if tid < C:
            row = row0 + Int64(tid)
            dst_rk = cute.make_tensor(sRk.iterator + (stage * C + tid), cute.make_layout(1))
            if tid < nrow:
                src_rk = cute.make_tensor(rk_ptr + (row * Int64(HVK // K) + hv64), cute.make_layout(1))
                cute.copy(g2s4, src_rk, dst_rk)
            else:
                dst_rk[0] = Float32(0.0)
            if const_expr(not self.kda):
                dst_g = cute.make_tensor(sG.iterator + (stage * C + tid), cute.make_layout(1))
                if tid < nrow:
                    src_g = cute.make_tensor(g_ptr + (row * sgt + g_head), cute.make_layout(1))
                    cute.copy(g2s4, src_g, dst_g)
                else:
                    dst_g[0] = Float32(0.0)
        if const_expr(self.kda):
            thr_g = copy_g.get_slice(tid)
            gG = cute.make_tensor((g_ptr + (row0 * sgt + g_head)).align(16),
                                  cute.make_layout((C, K), stride=(cute.assume(Int32(sgt), divby=4), 1)))
            tGg = thr_g.partition_S(gG)
            tGs = thr_g.partition_D(sG)
            tGc = thr_g.partition_S(cute.make_identity_tensor((C, K)))
            for m in cutlass.range_constexpr(cute.size(tGg, mode=[1])):
                if tGc[0, m, 0][0] < nrow:
                    cute.copy(copy_g, tGg[None, m, None], tGs[None, m, None, stage])
                else:
                    tGs[None, m, None, stage].fill(0.0)

    @cute.jit
    def kda_factors(self, stage, tid, sG, sKb, sRk, sDec):
        """KDA: Kd[r, d] = k[r, d] exp(sum_{j>r} g[j, d]) rk[r] in place in sK; sDec[d] = exp(sum_j g[j, d])."""
        for d in cutlass.range(tid, self.K, self.NT, unroll=1):
            tail = Float32(0.0)
            for jj in cutlass.range(C, unroll=1):
                r = C - 1 - jj
                f = cute.math.exp(tail, fastmath=False) * sRk[r, stage]
                sKb[r, d, stage] = BFloat16(Float32(sKb[r, d, stage]) * f)
                tail = tail + sG[r, d, stage]
            sDec[d] = cute.math.exp(tail, fastmath=False)
