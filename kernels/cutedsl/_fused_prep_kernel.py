"""The CuTe DSL prep of the fused GDN prefill (imports ``cutlass``: load it only through
:mod:`linattn.kernels.cutedsl.fused_prep`, which imports this module lazily).

One CTA of four warps per (chunk, key head) item (grid ``NT_max * H``, key head fastest, as the
Triton prep's items; a chunk past the real count does nothing). The maths is
:mod:`linattn.kernels.triton.chunk_fused`'s (module docstring, 1); how it maps onto the hardware::

    loads     k, q [C, K] bf16 -> shared memory by cp.async (rows past the sequence zero)
    norms     one thread per (row, k or q): max|x|, the power-of-two scale s (F44), u = 1 / sqrt(sum (s x)^2
              + 1e-6 s^2); a row with s != 1 is rewritten as bf16(s x) before the products
    products  K K^T, Q K^T [C, C]: warp mma.sync m16n8k16 (bf16, fp32 accumulation), warp w rows 16 w ..
    per value head of the key head, two at a time (slots 0 and 1):
      gates   G = cumsum(max(g, G_MIN)) by a warp's shuffle scan; beta
      tiles   e = exp(G_r - G_s) once per element, shared by Aqk (r >= s) and A (r > s) (each warp its rows)
              Aqk = (Q K^T) e uk_s qs_r -> bf16 staging;  A = (K K^T) e (beta uk)_r uk_s -> fp32, transposed
      solve   Tm = (I + A)^-1 (``solve="blocks"``, the default): the four 16 x 16 diagonal blocks by forward
              substitution in fp32 registers (a thread per block column, 15 dependent steps), then block
              doubling 16 -> 32 -> 64 (Tm_off = -Tm_hi A_off Tm_lo) on warp mma.sync with each fp32 operand
              split into bf16 hi + lo (three products per tile: about 16 bits of each operand, fp32's
              range), Tm kept in fp32 in the free triangle of A^T's tile (:meth:`FusedPrepKernel.solve_blocks`).
              ``solve="column"``: thread c of the slot's 64 threads holds column c of Tm and runs the
              right-looking substitution x_i -= A_ij x_j over the whole block (63 dependent steps)
      stores  Tm diag(beta) -> bf16 staging; the staged Aqk and Tm diag(beta) rows to HBM by 16-byte
              stores; rk, qs per row

No scratch in HBM and no Neumann product (the Triton prep: Neumann products on 3xTF32 dots for the
16 x 16 diagonal blocks, single TF32 dots below them): on the worst-conditioned input (A all ones below
the diagonal) the substitution's x stays in {0, +-1}, and the doubling's products of those entries are
exact in bf16 hi + lo.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp

C = 64  # chunk rows
NT = 128  # threads per CTA (four warps)


def _bits(x: Float32) -> Int32:
    """The bits of an fp32 value as an int32."""
    return Int32(llvm.bitcast(Int32.mlir_type, Float32(x).ir_value()))


def _from_bits(b: Int32) -> Float32:
    """The fp32 value of 32 bits."""
    return Float32(llvm.bitcast(Float32.mlir_type, Int32(b).ir_value()))


def _unit_lower(v: Float32, r, c) -> Float32:
    """Entry ``(r, c)`` of a unit lower-triangular matrix whose entries below the diagonal are stored
    (``v``, read whatever ``(r, c)``): ``v`` below the diagonal, 1 on it, 0 above it."""
    return cutlass.select_(r > c, v, cutlass.select_(r == c, Float32(1.0), Float32(0.0)))


class FusedPrepKernel:
    """Static configuration of one compiled prep (everything that changes the code).

    Args:
        K: key head dim (128 for this step; a multiple of 16).
        l2norm: the q/k l2 norms in the kernel (else ``rk = 1``, ``qs = (scale, 1)``).
        beta_bf16: beta is bf16 (else fp32).
        g_min: the floor of the log decays (``limits.G_MIN``).
        min_ctas: CTAs per SM the register allocation must allow (0: the compiler's choice; 3 caps a
            thread at 168 registers).
        solve: how ``(I + A)^-1`` is computed: ``"blocks"`` (:meth:`solve_blocks`), ``"column"``
            (:meth:`solve_column`) or ``"one_head"`` (:meth:`solve_one_head`: the one-kernel prefill's, one
            value head on the four warps; not this kernel's).
        barrier: the barrier the prep's threads meet at: ``None`` the CTA's (this kernel), else
            ``(id, threads)``: a named barrier of one warpgroup (the one-kernel prefill's prep warpgroup,
            :mod:`._fused_prefill_kernel`).
        fold_scale: the F44 row scale ``s`` folded into the rewritten rows: ``rk = uk`` and ``sq = 1``
            (the one-kernel prefill's walk reads the rewritten k and q tiles); else ``rk = uk s``,
            ``sq = s`` (the walk kernel reads k and q from HBM).
        stream_norm: the norms read their row in pieces (:meth:`row_norm_streamed`; fewer registers).
    """

    def __init__(self, K: int, l2norm: bool, beta_bf16: bool, g_min: float, min_ctas: int = 0,
                 solve: str = "blocks", barrier=None, fold_scale: bool = False, stream_norm: bool = False):
        assert K % 16 == 0 and K <= 128
        assert solve in ("blocks", "column", "one_head")
        self.solve = solve
        self.barrier = barrier
        self.fold_scale = fold_scale
        self.stream_norm = stream_norm
        self.min_ctas = min_ctas
        self.K = K
        self.l2norm = l2norm
        self.beta_bf16 = beta_bf16
        self.g_min = float(g_min)
        self.PK = K + 8  # padded smem pitches (elements): k, q rows; the bf16 staging; A^T (fp32)
        self.PS = C + 8
        self.PA = C + 4
        self.PZ = 32 + 4  # the blockwise solve's fp32 Z [32, 32] (in the slot's Tm diag(beta) staging bytes)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, g_ptr: cute.Pointer, beta_ptr: cute.Pointer,
        cu_ptr: cute.Pointer, cseq_ptr: cute.Pointer, cstart_ptr: cute.Pointer,
        tmb_ptr: cute.Pointer, aqk_ptr: cute.Pointer, rk_ptr: cute.Pointer, qs_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, sgt: Int64, sgh: Int64, sbt: Int64, sbh: Int64,
        N: Int32, HV: Int32, GROUP: Int32, ITEMS: Int32, scale: Float32,
        stream,
    ):
        K = self.K
        assert self.solve in ("blocks", "column"), "solve='one_head' is the one-kernel prefill's, not this kernel's"
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)), (4, 1, 1), permutation_mnk=(64, 16, 16))
        g2s16 = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16, num_bits_per_copy=128)
        st16 = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        tk, tc = K // 8, C // 8  # threads per row (8 bf16 = 16 bytes each)
        copy_k = cute.make_tiled_copy_tv(
            g2s16, cute.make_layout((NT // tk, tk), stride=(tk, 1)), cute.make_layout((1, 8)))
        store_c = cute.make_tiled_copy_tv(
            st16, cute.make_layout((NT // tc, tc), stride=(tc, 1)), cute.make_layout((1, 8)))
        self.kernel(
            q_ptr, k_ptr, g_ptr, beta_ptr, cu_ptr, cseq_ptr, cstart_ptr, tmb_ptr, aqk_ptr, rk_ptr, qs_ptr,
            sqt, sqh, skt, skh, sgt, sgh, sbt, sbh, N, HV, GROUP, scale, tiled_mma, copy_k, store_c,
        ).launch(grid=[ITEMS, 1, 1], block=[NT, 1, 1], stream=stream, min_blocks_per_mp=self.min_ctas,
                 preferred_smem_carveout=100 if self.min_ctas > 1 else None)

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, g_ptr: cute.Pointer, beta_ptr: cute.Pointer,
        cu_ptr: cute.Pointer, cseq_ptr: cute.Pointer, cstart_ptr: cute.Pointer,
        tmb_ptr: cute.Pointer, aqk_ptr: cute.Pointer, rk_ptr: cute.Pointer, qs_ptr: cute.Pointer,
        sqt: Int64, sqh: Int64, skt: Int64, skh: Int64, sgt: Int64, sgh: Int64, sbt: Int64, sbh: Int64,
        N: Int32, HV: Int32, GROUP: Int32, scale: Float32,
        tiled_mma: cute.TiledMma, copy_k: cute.TiledCopy, store_c: cute.TiledCopy,
    ):
        K, PK, PS, PA = self.K, self.PK, self.PS, self.PA
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        H = HV // GROUP
        i_c = bid // H
        i_h = bid % H
        lane = tid % 32
        wid = tid // 32

        # ---------------- shared memory --------------------------------------------------------
        smem = cutlass.utils.SmemAllocator()
        nraw = max(2 * C * PK, 4 * C * PS)
        sRaw = smem.allocate_tensor(BFloat16, cute.make_layout(nraw), 16)
        # k (0) and q (1) rows; after the products the same bytes hold the staging of Aqk (slots 0, 1)
        # and Tm diag(beta) (slots 2, 3), each [C, C] bf16
        sKQ = cute.make_tensor(sRaw.iterator, cute.make_layout((C, K, 2), stride=(PK, 1, C * PK)))
        sStg = cute.make_tensor(sRaw.iterator, cute.make_layout((C, C, 4), stride=(PS, 1, C * PS)))
        # A^T of the two value-head slots: sAt[j, i, slot] = A[i, j] (fp32)
        sAt = smem.allocate_tensor(Float32, cute.make_layout((C, C, 2), stride=(PA, 1, C * PA)), 16)
        # per-row vectors: uk (masked), rk = uk sk (masked), qs = uq scale, sq; G and beta of slots 0, 1
        sVec = smem.allocate_tensor(Float32, cute.make_layout((C, 8), stride=(1, C)), 16)

        mseq = cute.make_tensor(cseq_ptr, cute.make_layout(i_c + 1))
        n = Int32(mseq[i_c])
        if n < N:
            mstart = cute.make_tensor(cstart_ptr, cute.make_layout(i_c + 1))
            mcu = cute.make_tensor(cu_ptr, cute.make_layout(N + 1))
            t0 = Int64(mstart[i_c])
            left = Int64(mcu[n + 1]) - t0
            L = Int32(cutlass.select_(left < Int64(C), left, Int64(C)))

            # ---------------- loads: k, q -> sKQ (rows past the sequence zero) ------------------
            thr_k = copy_k.get_slice(tid)
            tKsK = thr_k.partition_D(sKQ)
            tKc = thr_k.partition_S(cute.make_identity_tensor((C, K)))
            gK = cute.make_tensor((k_ptr + (t0 * skt + Int64(i_h) * skh)).align(16),
                                  cute.make_layout((C, K), stride=(cute.assume(Int32(skt), divby=8), 1)))
            gQ = cute.make_tensor((q_ptr + (t0 * sqt + Int64(i_h) * sqh)).align(16),
                                  cute.make_layout((C, K), stride=(cute.assume(Int32(sqt), divby=8), 1)))
            tKg, tQg = thr_k.partition_S(gK), thr_k.partition_S(gQ)
            for m in cutlass.range_constexpr(cute.size(tKg, mode=[1])):
                if tKc[0, m, 0][0] < L:
                    cute.copy(copy_k, tKg[None, m, None], tKsK[None, m, None, 0])
                    cute.copy(copy_k, tQg[None, m, None], tKsK[None, m, None, 1])
                else:
                    tKsK[None, m, None, 0].fill(0.0)
                    tKsK[None, m, None, 1].fill(0.0)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()

            # ---------------- norms (thread: row r of k (tid < 64) or q) ------------------------
            r = tid % C
            mat = tid // C
            if const_expr(self.l2norm):
                self.row_norm(sKQ[None, None, mat], sVec, r, mat, L, scale)
            else:
                one = Float32(cutlass.select_(r < L, Float32(1.0), Float32(0.0)))
                if mat == 0:
                    sVec[r, 0] = one
                    sVec[r, 1] = one
                else:
                    sVec[r, 2] = scale
                    sVec[r, 3] = Float32(1.0)
            cute.arch.sync_threads()

            # ---------------- K K^T and Q K^T (warp w: rows 16 w .. 16 w + 15) -----------------
            thr_mma = tiled_mma.get_slice(tid)
            acc_kk = cute.make_rmem_tensor(thr_mma.partition_shape_C((C, C)), Float32)
            acc_qk = cute.make_rmem_tensor(thr_mma.partition_shape_C((C, C)), Float32)
            tCc = thr_mma.partition_C(cute.make_identity_tensor((C, C)))
            ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), BFloat16)
            s2r_a = cute.make_tiled_copy_A(ldsm, tiled_mma)
            s2r_b = cute.make_tiled_copy_B(ldsm, tiled_mma)
            thr_a = s2r_a.get_slice(tid)
            thr_b = s2r_b.get_slice(tid)
            tKA = thr_mma.make_fragment_A(thr_mma.partition_A(sKQ[None, None, 0]))
            tQA = thr_mma.make_fragment_A(thr_mma.partition_A(sKQ[None, None, 1]))
            tKB = thr_mma.make_fragment_B(thr_mma.partition_B(sKQ[None, None, 0]))
            tAs = thr_a.partition_S(sKQ)
            tBs = thr_b.partition_S(sKQ)
            tKA_v, tQA_v, tKB_v = thr_a.retile(tKA), thr_a.retile(tQA), thr_b.retile(tKB)
            acc_kk.fill(0.0)
            acc_qk.fill(0.0)
            for kb in cutlass.range_constexpr(K // 16):
                cute.copy(s2r_a, tAs[None, None, kb, 0], tKA_v[None, None, kb])
                cute.copy(s2r_a, tAs[None, None, kb, 1], tQA_v[None, None, kb])
                cute.copy(s2r_b, tBs[None, None, kb, 0], tKB_v[None, None, kb])
                cute.gemm(tiled_mma, acc_kk, tKA[None, None, kb], tKB[None, None, kb], acc_kk)
                cute.gemm(tiled_mma, acc_qk, tQA[None, None, kb], tKB[None, None, kb], acc_qk)
            cute.arch.sync_threads()  # k, q are dead: their bytes become the staging

            # ---------------- the value heads of this key head, two at a time -------------------
            thr_o = store_c.get_slice(tid)
            tOs = thr_o.partition_S(sStg)
            tOc = thr_o.partition_S(cute.make_identity_tensor((C, C)))
            g_min = Float32(self.g_min)
            zero = Float32(0.0)
            npair = (GROUP + 1) // 2
            for p in cutlass.range(npair, unroll=1):
                j0 = 2 * p
                # (a) gates and beta of slot w (warps 0, 1): lane l rows l, l + 32
                if wid < 2:
                    if j0 + wid < GROUP:
                        hv = Int64(i_h * GROUP + j0 + wid)
                        self.warp_gates(g_ptr, beta_ptr, t0, hv, sgt, sgh, sbt, sbh, L, lane, wid, sVec, g_min)
                cute.arch.sync_threads()
                # (b) Aqk -> staging (bf16), A -> sAt (fp32, transposed); e shared by both
                for slot in cutlass.range_constexpr(2):
                    if j0 + slot < GROUP:
                        for i in cutlass.range_constexpr(cute.size(acc_kk)):
                            crd = tCc[i]
                            rr = crd[0]
                            ss = crd[1]
                            d = sVec[rr, 4 + slot] - sVec[ss, 4 + slot]
                            e = cute.math.exp(cutlass.select_(rr >= ss, d, Float32(-float("inf"))), fastmath=True)
                            uks = sVec[ss, 0]
                            aq = acc_qk[i] * e * uks * sVec[rr, 2]
                            sStg[rr, ss, slot] = BFloat16(aq)
                            a = acc_kk[i] * e * (sVec[rr, 6 + slot] * sVec[rr, 0]) * uks
                            sAt[ss, rr, slot] = cutlass.select_(rr > ss, a, zero)
                cute.arch.sync_threads()
                # (c) the solve (slot tid // 64): Tm diag(beta) into the staging
                slot_t = tid // C
                col = tid % C
                active = j0 + slot_t < GROUP
                if const_expr(self.solve == "column"):
                    if active:
                        self.solve_column(sAt, sStg, sVec, slot_t, col)
                else:
                    zp = cute.recast_ptr(sRaw.iterator + (2 + slot_t) * (C * PS), dtype=Float32)
                    self.solve_blocks(sAt, zp, sStg[None, None, 2 + slot_t], sVec, slot_t, col, active)
                if active:
                    if col < L:  # rk, qs of row col for this value head
                        hv = Int64(i_h * GROUP + j0 + slot_t)
                        rh = (t0 + Int64(col)) * Int64(HV) + hv
                        mrk = cute.make_tensor(rk_ptr + rh, cute.make_layout(1))
                        mqs = cute.make_tensor(qs_ptr + rh * Int64(2), cute.make_layout(2))
                        mrk[0] = sVec[col, 1]
                        mqs[0] = sVec[col, 2]
                        mqs[1] = sVec[col, 3]
                cute.arch.sync_threads()
                # (d) the staged rows to HBM: aqk and tmb [T, HV, 64], rows < L
                for slot in cutlass.range_constexpr(2):
                    if j0 + slot < GROUP:
                        hv = Int64(i_h * GROUP + j0 + slot)
                        prow = (t0 * Int64(HV) + hv) * Int64(C)
                        for which in cutlass.range_constexpr(2):
                            base = aqk_ptr if which == 0 else tmb_ptr
                            gO = cute.make_tensor((base + prow).align(16),
                                                  cute.make_layout((C, C), stride=(cute.assume(HV * C, divby=8), 1)))
                            tOg = thr_o.partition_D(gO)
                            tOr = cute.make_fragment_like(tOs[None, None, None, 0])
                            cute.autovec_copy(tOs[None, None, None, slot + 2 * which], tOr)
                            for m in cutlass.range_constexpr(cute.size(tOr, mode=[1])):
                                if tOc[0, m, 0][0] < L:
                                    cute.copy(store_c, tOr[None, m, None], tOg[None, m, None])
                cute.arch.sync_threads()  # the staging, sAt and the gates are free for the next pair

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def sync(self):
        """The prep's threads meet: the CTA's barrier, or the named barrier of ``self.barrier``."""
        if const_expr(self.barrier is None):
            cute.arch.sync_threads()
        else:
            cute.arch.barrier(barrier_id=self.barrier[0], number_of_threads=self.barrier[1])

    @cute.jit
    def row_norm(self, sX, sVec, r, mat, L, scale):
        """Row ``r`` of k (``mat`` 0) or q (1): the inverse l2 norm without overflow (F44, as the Triton
        prep's ``_rnorm``): ``s = 2**-(e - 32)`` for ``max|x| = f 2**e >= 2**32`` (else 1), ``u = 1 /
        sqrt(sum (s x)^2 + 1e-6 s^2)``; a row with ``s != 1`` is rewritten as ``bf16(s x)``. Writes
        ``uk``, ``rk = uk sk`` (0 past the sequence) or ``qs = uq scale``, ``sq`` to ``sVec`` (``fold_scale``:
        ``rk = uk``, ``sq = 1``). ``sX``: the ``[C, K]`` tile of k (``mat`` 0) or q."""
        if const_expr(self.stream_norm):
            self.row_norm_streamed(sX, sVec, r, mat, L, scale)
            return
        K = self.K
        row = cute.make_rmem_tensor((K,), BFloat16)
        cute.autovec_copy(sX[r, None], row)
        mx = Float32(0.0)
        for i in cutlass.range_constexpr(K):
            x = Float32(row[i])
            mx = cute.arch.fmax(mx, cute.arch.fmax(x, -x))
        e = (_bits(mx) >> 23) & 0xFF
        shift = cutlass.select_(e > 158, e - 158, Int32(0))
        sc = _from_bits((127 - shift) << 23)
        acc = [Float32(0.0)] * 4
        for i in cutlass.range_constexpr(K):
            y = Float32(row[i]) * sc
            acc[i % 4] = acc[i % 4] + y * y
        ssum = (acc[0] + acc[1]) + (acc[2] + acc[3])
        u = Float32(1.0) / cute.math.sqrt(ssum + Float32(1e-6) * sc * sc)
        if shift != 0:  # F44: the products run on s x (exact: a power of two)
            for i in cutlass.range_constexpr(K):
                sX[r, i] = BFloat16(Float32(row[i]) * sc)
        self.store_norm(sVec, r, mat, L, u, sc, scale)

    @cute.jit
    def row_norm_streamed(self, sX, sVec, r, mat, L, scale):
        """:meth:`row_norm` reading the row in pieces of 16 (8 registers of row instead of 64, for a prep
        warpgroup with few registers), in one pass where no row of the warp needs the F44 scale: the
        largest entry and the sum of squares together (``s = 1``: ``s x = x``), the same sums in the same
        order as :meth:`row_norm`, so the same bits. Where a row of the warp does (a rare branch the
        whole warp takes: a loop whose trip count is 0 otherwise, so it is never executed predicated),
        the sum again on ``s x`` and the row rewritten."""
        K, P = self.K, 16
        xrow = sX[r, None]
        seg = cute.make_rmem_tensor((P,), BFloat16)
        mx = Float32(0.0)
        acc = [Float32(0.0)] * 4
        for p in cutlass.range_constexpr(K // P):
            cute.autovec_copy(cute.local_tile(xrow, (P,), (p,)), seg)
            for j in cutlass.range_constexpr(P):
                x = Float32(seg[j])
                mx = cute.arch.fmax(mx, cute.arch.fmax(x, -x))
                acc[j % 4] = acc[j % 4] + x * x
        e = (_bits(mx) >> 23) & 0xFF
        shift = cutlass.select_(e > 158, e - 158, Int32(0))
        sc = _from_bits((127 - shift) << 23)
        ssum = (acc[0] + acc[1]) + (acc[2] + acc[3])
        redo = Int32(cutlass.select_(cute.arch.vote_any_sync(shift != 0), Int32(1), Int32(0)))
        for _ in cutlass.range(redo, unroll=1):  # F44: the sum on s x, the row rewritten as bf16(s x)
            acc2 = [Float32(0.0)] * 4
            for p in cutlass.range_constexpr(K // P):
                piece = cute.local_tile(xrow, (P,), (p,))
                cute.autovec_copy(piece, seg)
                for j in cutlass.range_constexpr(P):
                    y = Float32(seg[j]) * sc
                    acc2[j % 4] = acc2[j % 4] + y * y
                    if shift != 0:
                        piece[j] = BFloat16(y)
            ssum = (acc2[0] + acc2[1]) + (acc2[2] + acc2[3])
        u = Float32(1.0) / cute.math.sqrt(ssum + Float32(1e-6) * sc * sc)
        self.store_norm(sVec, r, mat, L, u, sc, scale)

    @cute.jit
    def store_norm(self, sVec, r, mat, L, u, sc, scale):
        """Row ``r``'s factors into ``sVec``: k (``mat`` 0): ``uk``, ``rk = uk sk`` (0 past the sequence);
        q: ``qs = uq scale``, ``sq`` (``fold_scale``: ``rk = uk``, ``sq = 1``, the scale being in the rewritten
        rows the walk reads)."""
        live = r < L
        kept = Float32(1.0) if const_expr(self.fold_scale) else sc
        if mat == 0:
            sVec[r, 0] = cutlass.select_(live, u, Float32(0.0))
            sVec[r, 1] = cutlass.select_(live, u * kept, Float32(0.0))
        else:
            sVec[r, 2] = u * scale
            sVec[r, 3] = kept

    @cute.jit
    def warp_gates(self, g_ptr, beta_ptr, t0, hv, sgt, sgh, sbt, sbh, L, lane, slot, sVec, g_min):
        """One warp: ``G = cumsum(max(g, G_MIN))`` over the chunk's rows (0 past the sequence) and
        beta (0 past it) of value head ``hv`` into ``sVec[:, 4 + slot]`` and ``sVec[:, 6 + slot]``;
        lane ``l`` takes rows ``l`` and ``l + 32`` (a shuffle scan over each half)."""
        gb = self.load_gates(g_ptr, beta_ptr, t0, hv, sgt, sgh, sbt, sbh, L, lane)
        self.scan_gates(gb, lane, slot, sVec, g_min)

    @cute.jit
    def load_gates(self, g_ptr, beta_ptr, t0, hv, sgt, sgh, sbt, sbh, L, lane):
        """Lane ``l``'s raw ``g`` and beta of the chunk's rows ``l`` and ``l + 32`` (0 past the sequence):
        ``[g_l, g_l+32, beta_l, beta_l+32]`` as fp32 (:meth:`scan_gates` takes them)."""
        zero = Float32(0.0)
        gs = []
        bs = []
        for h in cutlass.range_constexpr(2):
            rr = lane + 32 * h
            gv = zero
            bv = zero
            if rr < L:
                row = t0 + Int64(rr)
                mg = cute.make_tensor(g_ptr + (row * sgt + hv * sgh), cute.make_layout(1))
                mb = cute.make_tensor(beta_ptr + (row * sbt + hv * sbh), cute.make_layout(1))
                gv = Float32(mg[0])
                bv = Float32(mb[0])
            gs.append(gv)
            bs.append(bv)
        return [gs[0], gs[1], bs[0], bs[1]]

    @cute.jit
    def scan_gates(self, gb, lane, slot, sVec, g_min):
        """:meth:`warp_gates`' scan of :meth:`load_gates`' values ``gb``."""
        zero = Float32(0.0)
        plo, phi = cute.arch.fmax(gb[0], g_min), cute.arch.fmax(gb[1], g_min)
        for s in cutlass.range_constexpr(5):
            off = 1 << s
            ulo = cute.arch.shuffle_sync_up(plo, off)
            uhi = cute.arch.shuffle_sync_up(phi, off)
            plo = plo + cutlass.select_(lane >= off, ulo, zero)
            phi = phi + cutlass.select_(lane >= off, uhi, zero)
        phi = phi + cute.arch.shuffle_sync(plo, 31)
        sVec[lane, 4 + slot] = plo
        sVec[lane + 32, 4 + slot] = phi
        sVec[lane, 6 + slot] = gb[2]
        sVec[lane + 32, 6 + slot] = gb[3]

    @cute.jit
    def solve_column(self, sAt, sStg, sVec, slot, col):
        """Column ``col`` of ``Tm = (I + A)^-1`` (``A`` strictly lower, ``sAt`` its transpose) by the
        right-looking forward substitution in fp32 registers, then ``Tm[:, col] beta_col`` into the
        staging slot ``2 + slot`` (bf16). Rows of a 4-row group at or above ``j`` read ``A^T``'s
        zeros, so every 16-byte read of row ``j`` of ``A^T`` is whole."""
        x = cute.make_rmem_tensor((C,), Float32)
        for i in cutlass.range_constexpr(C):
            x[i] = cutlass.select_(col == i, Float32(1.0), Float32(0.0))
        a4 = cute.make_rmem_tensor((4,), Float32)
        for j in cutlass.range_constexpr(C - 1):
            xj = x[j]
            for ib in cutlass.range_constexpr((j + 1) // 4, C // 4):
                src = cute.make_tensor((sAt.iterator + (slot * (C * self.PA) + j * self.PA + 4 * ib)).align(16),
                                       cute.make_layout(4))
                cute.autovec_copy(src, a4)
                for u in cutlass.range_constexpr(4):
                    x[4 * ib + u] = x[4 * ib + u] - a4[u] * xj
        b = sVec[col, 6 + slot]
        for i in cutlass.range_constexpr(C):
            sStg[i, col, 2 + slot] = BFloat16(x[i] * b)

    # ------------------------------------------------------------------------------------------
    # The blockwise solve (``solve="blocks"``): Tm = (I + A)^-1 by block doubling. Tm's strictly lower
    # part is kept in fp32 in ``sAt``'s strictly lower triangle (``sAt[i, j] = Tm[i, j]``, i > j), where
    # A^T holds zeros; A^T stays in the strictly upper triangle and Tm's unit diagonal is implicit.
    #   S1  the four 16 x 16 diagonal blocks by forward substitution in fp32 (thread: a block's column)
    #   S2  16 -> 32: Tm[o+16:o+32, o:o+16] = -Tm_hi (A[o+16:o+32, o:o+16] Tm_lo), o = 0, 32 (a warp each)
    #   S3  32 -> 64: Tm[32:64, 0:32] = -Tm_hi (A[32:64, 0:32] Tm_lo) (a warp per 16 rows)
    #   S4  Tm diag(beta) -> the bf16 staging (thread: a column)
    # The products run on warp mma.sync (bf16, fp32 accumulation) with each fp32 operand split into
    # bf16 hi + lo (hi lo + lo hi + hi hi: about 16 bits of each operand, fp32's range).
    @cute.jit
    def solve_blocks(self, sAt, zp, sDst, sVec, slot, col, active):
        """``Tm diag(beta)`` of value-head slot ``slot`` into ``sDst [C, C]`` (bf16; the scheme above), with
        ``Z`` (fp32, ``32 x PZ``) at ``zp``. Every prep thread calls it (it holds the prep's barriers,
        :meth:`sync`); ``active``: this thread's slot holds a value head."""
        PA = self.PA
        sA = cute.make_tensor(sAt.iterator + slot * (C * PA), cute.make_layout((C, C), stride=(PA, 1)))
        ws = col // 32  # the warp of the slot
        lane = col % 32
        tiled = cute.make_tiled_mma(warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)), (1, 1, 1))
        # S1: the diagonal blocks (x: column col % 16 of block col // 16), written once every thread has
        # read the zeros below A^T's diagonal
        x = cute.make_rmem_tensor((16,), Float32)
        o = (col // 16) * 16
        if active:
            self.solve_diag_block(sA, x, o, col % 16)
        self.sync()
        if active:
            for i in cutlass.range_constexpr(1, 16):
                if col % 16 < i:
                    sA[o + i, o + col % 16] = x[i]
        self.sync()
        self.doubling(tiled, sA, zp, ws, lane, active)
        # S4: column col of Tm diag(beta) (Z's bytes are dead: the staging takes them)
        if active:
            b = sVec[col, 6 + slot]
            for i in cutlass.range_constexpr(C):
                sDst[i, col] = BFloat16(_unit_lower(sA[i, col], i, col) * b)

    @cute.jit
    def doubling(self, tiled, sA, zp, ws, lane, active):
        """S2 and S3 of :meth:`solve_blocks` for one slot on its two warps (``ws``: 0 or 1)."""
        PA, PZ = self.PA, self.PZ
        # S2: warp ws doubles the pair at o = 32 ws (its own Z rows 16 ws ..)
        if active:
            o2 = ws * 32
            zw = zp + ws * (16 * PZ)
            self.block_product(tiled, lane, sA.iterator + (o2 * PA + o2 + 16), (1, PA), False, 0,
                               sA.iterator + (o2 * PA + o2), (1, PA), True, 16, 16, zw, False)
            cute.arch.sync_warp()
            self.block_product(tiled, lane, sA.iterator + ((o2 + 16) * PA + o2 + 16), (PA, 1), True, 0,
                               zw, (1, PZ), False, 16, 16, sA.iterator + ((o2 + 16) * PA + o2), True)
        self.sync()
        # S3: Z = A[32:64, 0:32] Tm[0:32, 0:32] (warp ws: rows 16 ws ..), then Tm[32:64, 0:32] = -Tm_hi Z
        if active:
            self.block_product(tiled, lane, sA.iterator + (32 + 16 * ws), (1, PA), False, 0,
                               sA.iterator, (1, PA), True, 32, 32, zp + ws * (16 * PZ), False)
        self.sync()
        if active:
            self.block_product(tiled, lane, sA.iterator + ((32 + 16 * ws) * PA + 32), (PA, 1), True, 16 * ws,
                               zp, (1, PZ), False, 32, 32, sA.iterator + ((32 + 16 * ws) * PA), True)
        self.sync()

    @cute.jit
    def solve_one_head(self, sAt, zp, sDst, sVec, ptid):
        """``Tm diag(beta)`` of one value head into ``sDst [C, C]`` (bf16) on the four warps (thread ``ptid``
        of 128): S1 as :meth:`solve_blocks` (threads 0 .. 63), then S2, S3 as :meth:`doubling_four_warps`
        (the same products, so the same bits), and no S4: each block of Tm goes to ``sDst`` as
        ``bf16(Tm beta_col)`` where it is made (the diagonal blocks from S1's registers, the others from
        the products' accumulators). ``sDst``'s blocks above the diagonal are never written: the caller
        zeroes them once."""
        sA = cute.make_tensor(sAt.iterator, cute.make_layout((C, C), stride=(self.PA, 1)))
        tiled = cute.make_tiled_mma(warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)), (1, 1, 1))
        w = ptid // 32
        lane = ptid % 32
        col = ptid % C
        x = cute.make_rmem_tensor((16,), Float32)
        o = (col // 16) * 16
        if ptid < C:  # warps 0, 1: a block's 16 columns in one warp, so its reads and writes meet at the warp
            self.solve_diag_block(sA, x, o, col % 16)
            cute.arch.sync_warp()
            # the block's column: strictly lower part -> sA (fp32); all 16 rows x beta -> sDst
            for i in cutlass.range_constexpr(1, 16):
                if col % 16 < i:
                    sA[o + i, o + col % 16] = x[i]
            b = sVec[col, 6]
            for i in cutlass.range_constexpr(16):
                sDst[o + i, col] = BFloat16(x[i] * b)
        self.sync()
        self.doubling_four_warps(tiled, sA, zp, w, lane, sDst, sVec)

    @cute.jit
    def doubling_four_warps(self, tiled, sA, zp, w, lane, sDst, sVec):
        """S2 and S3 of :meth:`solve_blocks` for one value head on four warps (``w`` 0 .. 3): each product's
        columns split between two warps (each output entry the same mma.sync sums as :meth:`doubling`'s,
        so the same bits), half the dependent MMAs per warp; each block of Tm also to ``sDst`` as
        ``bf16(Tm beta_col)`` (:meth:`solve_one_head`)."""
        PA, PZ = self.PA, self.PZ
        # S2: warps 2 p, 2 p + 1 double the pair at o = 32 p, columns 8 (w % 2) .. of Z and of the block
        o2 = (w // 2) * 32
        n2 = (w % 2) * 8
        zw = zp + (w // 2) * (16 * PZ)
        self.block_product(tiled, lane, sA.iterator + (o2 * PA + o2 + 16), (1, PA), False, 0,
                           sA.iterator + (o2 * PA + o2 + n2), (1, PA), True, 16, 8, zw + n2, False, n2)
        cute.arch.sync_warp()
        self.block_product(tiled, lane, sA.iterator + ((o2 + 16) * PA + o2 + 16), (PA, 1), True, 0,
                           zw + n2, (1, PZ), False, 16, 8, sA.iterator + ((o2 + 16) * PA + o2 + n2), True, 0,
                           sDst, o2 + 16, o2 + n2, sVec)
        self.sync()
        # S3: warp w: rows 16 (w // 2) .., columns 16 (w % 2) .. of Z, then of Tm[32:64, 0:32]
        rb = (w // 2) * 16
        n3 = (w % 2) * 16
        self.block_product(tiled, lane, sA.iterator + (32 + rb), (1, PA), False, 0,
                           sA.iterator + n3, (1, PA), True, 32, 16, zp + (rb * PZ + n3), False, n3)
        self.sync()
        self.block_product(tiled, lane, sA.iterator + ((32 + rb) * PA + 32), (PA, 1), True, rb,
                           zp + n3, (1, PZ), False, 32, 16, sA.iterator + ((32 + rb) * PA + n3), True, 0,
                           sDst, 32 + rb, n3, sVec)

    @cute.jit
    def solve_diag_block(self, sA, x, o, c):
        """Column ``c`` of ``(I + A[o:o+16, o:o+16])^-1`` into ``x`` (fp32 forward substitution;
        ``A``'s column ``j`` read as 16-byte pieces of row ``j`` of ``A^T``, whose zeros at and below
        its diagonal keep the leading pieces harmless)."""
        for i in cutlass.range_constexpr(16):
            x[i] = cutlass.select_(c == i, Float32(1.0), Float32(0.0))
        a4 = cute.make_rmem_tensor((4,), Float32)
        for j in cutlass.range_constexpr(15):
            xj = x[j]
            for ib in cutlass.range_constexpr((j + 1) // 4, 4):
                src = cute.make_tensor((sA.iterator + (o + j) * self.PA + o + 4 * ib).align(16), cute.make_layout(4))
                cute.autovec_copy(src, a4)
                for u in cutlass.range_constexpr(4):
                    x[4 * ib + u] = x[4 * ib + u] - a4[u] * xj

    @cute.jit
    def block_product(self, tiled, lane, pa, sa, tri_a: cutlass.Constexpr[bool], row_a, pb, sb,
                      tri_b: cutlass.Constexpr[bool], KD: cutlass.Constexpr[int], N: cutlass.Constexpr[int],
                      pd, neg: cutlass.Constexpr[bool], col_b=0, out=None, out_row=0, out_col=0, sVec=None):
        """One warp: ``D[16, N] = (-)X[16, KD] Y[KD, N]`` from fp32 shared memory on mma.sync.

        ``X`` at ``pa`` with strides ``sa`` (row, column); ``Y`` given as its transpose at ``pb`` with
        strides ``sb`` (``Y[k, n]`` at ``pb + n sb[0] + k sb[1]``). ``tri_a`` / ``tri_b``: the operand is a
        block of Tm on its diagonal (row ``row_a + r`` / ``k`` against column ``c`` / ``n``): 1 on the
        diagonal, 0 above it, the stored value below; ``col_b``: ``Y``'s first column within its block (a
        product split by columns). ``D`` goes to ``pd`` (``neg``: a block of Tm, negated, row pitch ``PA``;
        else Z, row pitch ``PZ``). ``out``: a block of Tm also goes to ``out[out_row + r, out_col + c]`` as
        ``bf16(D beta_c)`` (beta from ``sVec``)."""
        thr = tiled.get_slice(lane)
        gX = cute.make_tensor(pa, cute.make_layout((16, KD), stride=sa))
        gY = cute.make_tensor(pb, cute.make_layout((N, KD), stride=sb))
        tX = thr.partition_A(gX)
        tY = thr.partition_B(gY)
        cX = thr.partition_A(cute.make_identity_tensor((16, KD)))
        cY = thr.partition_B(cute.make_identity_tensor((N, KD)))
        xf = cute.make_rmem_tensor_like(tX, Float32)
        yf = cute.make_rmem_tensor_like(tY, Float32)
        for i in cutlass.range_constexpr(cute.size(tX)):
            xf[i] = _unit_lower(Float32(tX[i]), row_a + cX[i][0], cX[i][1]) if const_expr(tri_a) else Float32(tX[i])
        for i in cutlass.range_constexpr(cute.size(tY)):  # Y[k, n] at (n, k)
            yf[i] = _unit_lower(Float32(tY[i]), cY[i][1], col_b + cY[i][0]) if const_expr(tri_b) else Float32(tY[i])
        # the split: hi = bf16(v), lo = bf16(v - hi) (whole fragments: packed conversions, no local memory)
        xh = thr.make_fragment_A(thr.partition_shape_A((16, KD)))
        xl = thr.make_fragment_A(thr.partition_shape_A((16, KD)))
        yh = thr.make_fragment_B(thr.partition_shape_B((N, KD)))
        yl = thr.make_fragment_B(thr.partition_shape_B((N, KD)))
        xh.store(xf.load().to(BFloat16))
        xl.store((xf.load() - xh.load().to(Float32)).to(BFloat16))
        yh.store(yf.load().to(BFloat16))
        yl.store((yf.load() - yh.load().to(Float32)).to(BFloat16))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((16, N)), Float32)
        acc.fill(0.0)
        cute.gemm(tiled, acc, xl, yh, acc)
        cute.gemm(tiled, acc, xh, yl, acc)
        cute.gemm(tiled, acc, xh, yh, acc)
        cD = thr.partition_C(cute.make_identity_tensor((16, N)))
        pitch = self.PA if neg else self.PZ
        gD = cute.make_tensor(pd, cute.make_layout((16, N), stride=(pitch, 1)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            crd = cD[i]
            d = -acc[i] if neg else acc[i]
            gD[crd] = d
            if const_expr(out is not None):
                c = out_col + crd[1]
                out[out_row + crd[0], c] = BFloat16(d * sVec[c, 6])
