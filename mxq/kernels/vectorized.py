"""The vectorised kernel for fp32 inputs: N % 8 == 0 and 16-byte aligned tensors, and (variant
"rows8", ``unaligned``) any N and input alignment whose FP8 output rows start on 8-byte boundaries.

Tiling: a CTA of W warps (KernelConfig.vec_warps) covers 32 rows x 32 * VEC columns. Lane l of
every warp owns the VEC adjacent columns 8l..8l+7 and warp w owns rows w * (32 / W) .. of the
tile. Rowwise: a 32-column block is 4 adjacent lanes, its amax two xor shuffles. Colwise: a
column's 32 rows are spread over the W warps; their partial amax (and dbias sums) meet in
shared memory. Every input byte is read from global memory once, all rows' loads first.

Unaligned rows (KernelConfig.vec_unaligned): an fp32 row starts on any 4-byte boundary, so a
lane's 8 columns are not one 16-byte load. Every full-size source is staged through shared
memory, in one of two forms (KernelConfig.vec_unaligned_chunks says which an op takes, from
their timings):

- words: a warp's row segment of 32 * VEC words is copied into place by cp.async, 8 bytes per
  copy where the row starts on 8 bytes (lane l: words 2l + 64k, 2l + 64k + 1), else 4 (l + 32k);
  quads are swizzled (staged_word, staged_pair, staged_quad) so the copies and the lanes' two
  16-byte reads of their columns are free of bank conflicts. Columns past N and rows past M are
  zero-filled (cp.async ignore-src / src-size), not branched around. Nothing to realign.
- chunks: the 16-byte chunks covering the segment are copied as the 16-bit unaligned rows are
  (unaligned.stage_row), and each lane reads its two quads back realigned by whole words
  (unaligned.read_row with a zero bit shift); columns past N hold the neighbours' bytes and are
  masked. Fewer, wider copies; a branch table per quad.

FP8 stores are whole 8-byte units (variant rows8: the rows start on unit boundaries); a row's
partial last unit goes byte by byte.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Uint8

from . import codec
from . import device as dev
from . import grouped
from . import smem as shared
from . import unaligned as ua
from .config import ROWS, VEC

VCOLS = 32 * VEC


def grid(cfg, M, N, G=None):
    rows = cute.ceil_div(M, ROWS) if G is None else grouped.row_tiles(M, G)
    return [rows, cute.ceil_div(N, VCOLS) * (2 if cfg.halves else 1), 1], [cfg.vec_warps * 32, 1, 1]


def _widen(frag, k):
    return frag[k].to(Float32)


class VectorizedKernel:
    """The vectorized kernel of one config and op (element.ElementOp)."""

    def __init__(self, cfg, op):
        self.cfg = cfg
        self.op = op

    @cute.kernel
    def vec_kernel(self, ins: list, scalars: list, act_in, row_data, row_scale, col_data, col_scale, amax,
                   dbias_ws, noop, group_ends, M: Int32, N: Int32, NO: Int32, use_hw_e8m0: cutlass.Constexpr,
                   unaligned: cutlass.Constexpr = False):
        cfg = self.cfg
        GROUPED = cutlass.const_expr(group_ends is not None)
        UNALIGNED = cutlass.const_expr(unaligned)  # (never grouped nor two-halves: KernelConfig.vec_unaligned)
        CHUNKS = cutlass.const_expr(unaligned and cfg.vec_unaligned_chunks)
        WARPS = cutlass.const_expr(cfg.vec_warps)
        VROWS = cutlass.const_expr(ROWS // cfg.vec_warps)  # rows per warp
        NTHREADS = cutlass.const_expr(WARPS * 32)
        tidx, _, _ = cute.arch.thread_idx()
        rb, cb, _ = cute.arch.block_idx()
        # outputs: NOUT columns, this CTA's at column offset co (two-halves ops: half h of 2N, ElementOp.output_half)
        cb, co, NOUT, scalars = self.op.output_half(cb, N, NO, VCOLS, scalars, divby=VEC)
        lane = tidx % 32
        warp = tidx // 32
        g = cb * 32 + lane  # this lane's group of VEC columns
        c0 = g * VEC
        col_ok = c0 < N  # aligned: N % VEC == 0, a group is wholly inside or outside
        if cutlass.const_expr(UNALIGNED):
            nvalid = N - c0  # this lane's columns that exist (<= 0: none, >= VEC: all, else a partial unit)
        rbase = rb * ROWS + warp * VROWS
        row_end = M
        sources = self.op.sources(ins, act_in)
        NSRC = cutlass.const_expr(len(sources))
        once = [dev.broadcast_rows(src) for src in sources]  # row operands: loaded once, for row 0
        # KernelConfig.vec_stage: full-size sources are staged through shared memory with cp.async
        # (each thread's rows into its own slots, one commit group per row, read back just before
        # the row is computed), so the registers hold one row of inputs instead of all of them
        # (unaligned rows: every full-size source, the only way its rows are read)
        staged_src = [(cfg.vec_stage or UNALIGNED) and not once[t] and not dev.broadcast_cols(sources[t])
                      for t in range(NSRC)]
        STAGED = cutlass.const_expr([t for t in range(NSRC) if staged_src[t]])
        # the CTA's shared memory, declared once (KernelConfig.vec_buffers)
        buffers = cfg.vec_buffers(staged_src, GROUPED, CHUNKS)
        if cutlass.const_expr(len(buffers) > 0):
            buf = shared.allocate(cutlass.memory.SmemAllocator(), buffers)
        if cutlass.const_expr(GROUPED):
            # row tile rb is one colwise block of a group: rows [gt.row0, gt.row_end) (grouped.py)
            gt = grouped.GroupTile(group_ends, buf["group"], rb, M, N, cfg.fmt.swizzled, WARPS * 32)
            rbase = gt.row0 + warp * VROWS
            row_end = gt.row_end
        tiles = [cute.zipped_divide(s, (1, VEC)) for s in sources]
        staged = [buf[f"in{t}"] if staged_src[t] else None for t in range(NSRC)]
        # The column reduction's buffers (indexed k * 32 + lane for column k of lane: a warp's accesses
        # touch 32 consecutive words, no bank conflicts) reuse the staged inputs' memory, which is dead
        # once every row has been read back (a barrier in between), so a CTA needs no more than that.
        if cutlass.const_expr(cfg.col_reduce):
            if cutlass.const_expr(len(STAGED) >= 1):
                sMax = cute.make_tensor(staged[STAGED[0]].iterator, cute.make_layout((WARPS, VCOLS), stride=(VCOLS, 1)))
            else:
                sMax = buf["max"]
            if cutlass.const_expr(cfg.dbias):
                if cutlass.const_expr(len(STAGED) >= 2):
                    sSum = cute.make_tensor(cute.recast_ptr(staged[STAGED[1]].iterator, dtype=Float64),
                                            cute.make_layout((WARPS, VCOLS), stride=(VCOLS, 1)))
                else:
                    sSum = buf["sum"]
            if cutlass.const_expr(cfg.colwise):
                sInv = buf["inv"]  # the columns' inverse scales
        if cutlass.const_expr(cfg.rowwise):
            tRow = cute.zipped_divide(self.op.out_window(row_data, co), (1, VEC))
            nbr = NOUT // 32 + Int32(cutlass.select_(NOUT % 32 != 0, Int32(1), Int32(0)))
        if cutlass.const_expr(cfg.colwise):
            tCol = cute.zipped_divide(self.op.out_window(col_data, co), (1, VEC))
        if cutlass.const_expr(UNALIGNED):
            # FP8 rows on unit boundaries: lane l's VEC bytes are one 8-byte unit, its address
            # stepped from row to row; the row's last unit may be partial (whole / part)
            whole = nvalid >= VEC
            part = (nvalid > 0) & (nvalid < VEC)
        if cutlass.const_expr(CHUNKS):
            ga = [ua.row_base(sources[t], rbase, cb * VCOLS) for t in range(NSRC)]
            ncols = cutlass.min(N - cb * VCOLS, VCOLS)
            for i in cutlass.range_constexpr(VROWS):
                for t in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(staged_src[t]):
                        a = ua.row_at(ga[t], i)
                        ua.stage_row(Float32, staged[t][(warp * VROWS + i, None)], a, ua.chunk_misalignment(a), ncols,
                                     lane, rbase + i < row_end)
                cute.arch.cp_async_commit_group()
        elif cutlass.const_expr(UNALIGNED):
            # each warp's row segments word by word (unaligned.stage_words): which of lane l's
            # words (columns cb * VCOLS + l + 32k) and pairs (+ 2l + 64k) exist
            ccol = cb * VCOLS + lane
            cvalid = [ccol + 32 * k < N for k in range(VEC)]
            pbytes = [cutlass.max(cutlass.min(N - (cb * VCOLS + 2 * lane + 64 * k), 2), 0) * 4 for k in range(VEC // 2)]
            src_rows = [ua.row_base(sources[t], rbase, ccol) for t in range(NSRC)]
            for i in cutlass.range_constexpr(VROWS):
                rok = rbase + i < row_end
                for t in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(staged_src[t]):
                        ua.stage_words(staged[t].iterator + (i * NTHREADS * VEC + warp * VCOLS),
                                       ua.row_at(src_rows[t], i), lane, rok, cvalid, pbytes)
                cute.arch.cp_async_commit_group()
        elif cutlass.const_expr(len(STAGED) > 0):
            g2s = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                      Float32, num_bits_per_copy=128)
            for i in cutlass.range_constexpr(VROWS):
                if col_ok and rbase + i < row_end:
                    for t in cutlass.range_constexpr(NSRC):
                        if cutlass.const_expr(staged_src[t]):
                            for h in cutlass.range_constexpr(VEC // 4):  # 16-byte copies of 4 values
                                cute.copy(g2s, cute.local_tile(sources[t], (1, 4), (rbase + i, g * (VEC // 4) + h))[(0, None)],
                                          cute.local_tile(staged[t][(i, tidx, 0, None)], (4,), (h,)))
                cute.arch.cp_async_commit_group()
        # all loads first: VROWS independent 16-byte loads per source in flight per thread (staged
        # sources: read back from shared memory below)
        frags = []  # frags[i][t]: row i of source t
        for i in cutlass.range_constexpr(VROWS):
            row = []
            for t in cutlass.range_constexpr(NSRC):
                if cutlass.const_expr(i > 0 and once[t]):
                    row.append(frags[0][t])
                else:
                    row.append(cute.make_rmem_tensor_like(tiles[t][(None, (0, 0))]))
                    row[t].fill(0)
            frags.append(row)
            if col_ok and rbase + i < row_end:
                for t in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(not staged_src[t] and (i == 0 or not once[t])):
                        if cutlass.const_expr(UNALIGNED and once[t] and dev.broadcast_cols(sources[t])):
                            # a scalar: its one element, loaded once
                            one = tiles[t][(None, (rbase + i, g))][0]
                            for k in cutlass.range_constexpr(VEC):
                                row[t][k] = one
                        elif cutlass.const_expr(UNALIGNED and once[t]):
                            # a row operand ([N]): its columns that exist, one load each
                            for k in cutlass.range_constexpr(VEC):
                                if k < nvalid:
                                    row[t][k] = tiles[t][(None, (rbase + i, g))][k]
                        else:
                            cute.autovec_copy(tiles[t][(None, (rbase + i, g))], row[t])
        if noop[0] != Float32(1.0):
            vals = cute.make_rmem_tensor(cute.make_layout(VROWS * VEC), Float32)
            if cutlass.const_expr(cfg.col_reduce):
                cmax = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
                cmax.fill(0.0)
            if cutlass.const_expr(cfg.dbias):
                # the block's partial sums in the workspace's precision (numerics.dbias_partial_dtype)
                dsum = cute.make_rmem_tensor(cute.make_layout(VEC), dbias_ws.element_type)
                dsum.fill(0.0)
            for i in cutlass.range_constexpr(VROWS):
                row_ok = col_ok and rbase + i < row_end
                if cutlass.const_expr(CHUNKS):
                    cute.arch.cp_async_wait_group(VROWS - 1 - i)
                    cute.arch.sync_warp()
                    if rbase + i < row_end:
                        for t in cutlass.range_constexpr(NSRC):
                            if cutlass.const_expr(staged_src[t]):
                                ua.read_chunked_words(staged[t][(warp * VROWS + i, None)], ua.row_at(ga[t], i), lane,
                                                      frags[i][t])
                elif cutlass.const_expr(UNALIGNED):
                    cute.arch.cp_async_wait_group(VROWS - 1 - i)  # row i's copies have landed ...
                    cute.arch.sync_warp()  # ... in every lane of the warp (they copied each other's columns)
                    for t in cutlass.range_constexpr(NSRC):  # (zeros where no row or column: no branch)
                        if cutlass.const_expr(staged_src[t]):
                            ua.read_words(staged[t].iterator + (i * NTHREADS * VEC + warp * VCOLS), lane, frags[i][t])
                elif cutlass.const_expr(len(STAGED) > 0):
                    cute.arch.cp_async_wait_group(VROWS - 1 - i)  # row i's copies have landed
                    if row_ok:
                        for t in cutlass.range_constexpr(NSRC):
                            if cutlass.const_expr(staged_src[t]):
                                cute.autovec_copy(staged[t][(i, tidx, None, None)], frags[i][t])
                for k in cutlass.range_constexpr(VEC):
                    v = self.op.value(frags[i], k, scalars, _widen)
                    if cutlass.const_expr(cfg.computed or CHUNKS):
                        ok = row_ok
                        if cutlass.const_expr(UNALIGNED):
                            ok = row_ok & (nvalid > k)
                        # rows past M and their act(0) do not count; unaligned rows: nor columns past N
                        # (chunks: the neighbouring bytes a staged chunk holds)
                        v = Float32(cutlass.select_(ok, v, Float32(0.0)))
                    if cutlass.const_expr(cfg.dbias):
                        dsum[k] = dsum[k] + v.to(Float64)
                    v = self.op.round_to_input(v, ins[0].element_type)
                    vals[i * VEC + k] = v
                    if cutlass.const_expr(cfg.col_reduce):
                        cmax[k] = cute.arch.fmax(cmax[k], cute.math.abs(v), nan=True)
                if cutlass.const_expr(cfg.rowwise):
                    # rowwise: the 32-column block of this row is 4 adjacent lanes
                    if cutlass.const_expr(UNALIGNED and i == 0):
                        out_row = ua.row_base(row_data, rbase, c0)  # (unaligned: row i's units at row_at(out_row, i))
                    ramax = Float32(0.0)
                    for k in cutlass.range_constexpr(VEC):
                        ramax = cute.arch.fmax(ramax, cute.math.abs(vals[i * VEC + k]), nan=True)
                    ramax = cute.arch.fmax(ramax, cute.arch.shuffle_sync_bfly(ramax, offset=1), nan=True)
                    ramax = cute.arch.fmax(ramax, cute.arch.shuffle_sync_bfly(ramax, offset=2), nan=True)
                    er = codec.block_scale(cfg.fmt, ramax, use_hw_e8m0)
                    sr = dev.inv_scale(er)
                    if cutlass.const_expr(UNALIGNED):
                        self.store_unit_row(ua.row_at(out_row, i), vals, i, [sr] * VEC, row_ok, whole, part, nvalid)
                        if row_ok and lane % 4 == 0:
                            codec.store_row_scale(cfg, row_scale, dev.scale_offset(cfg.fmt.swizzled, rbase + i, c0 // 32, nbr), er)
                    elif row_ok:
                        qr = cute.make_rmem_tensor_like(tRow[(None, (0, 0))])
                        for k in cutlass.range_constexpr(0, VEC, 2):
                            lo, hi = codec.encode2(cfg.fmt, dev.mul_rn(vals[i * VEC + k], sr), dev.mul_rn(vals[i * VEC + k + 1], sr))
                            qr[k] = lo
                            qr[k + 1] = hi
                        cute.autovec_copy(qr, tRow[(None, (rbase + i, g))])
                        if lane % 4 == 0:
                            if cutlass.const_expr(GROUPED):
                                codec.store_row_scale(cfg, row_scale, codec.group_row_scale_offset(cfg.fmt, gt, rbase + i, c0 // 32, nbr), er)
                            elif cutlass.const_expr(cfg.fmt.swizzled):
                                codec.store_row_scale(cfg, row_scale, dev.swizzle_offset(rbase + i, (co + c0) // 32, nbr), er)
                            else:
                                codec.store_row_scale(cfg, row_scale, (rbase + i) * nbr + (co + c0) // 32, er)
            if cutlass.const_expr(cfg.col_reduce):
                # colwise: the warps' partial column amax (and dbias sums) meet in shared memory
                if cutlass.const_expr(len(STAGED) > 0):
                    cute.arch.sync_threads()  # every thread has read its staged rows back (sMax reuses them)
                for k in cutlass.range_constexpr(VEC):
                    sMax[warp, k * 32 + lane] = cmax[k]
                    if cutlass.const_expr(cfg.dbias):
                        sSum[warp, k * 32 + lane] = dsum[k]
                cute.arch.sync_threads()
                # Column owners: each of the CTA's VCOLS columns is reduced over the warps, turned into
                # its scale and stored by one thread, not by every warp for its own lane's columns.
                if cutlass.const_expr(cfg.amax):
                    tm = Float32(0.0)
                for r in cutlass.range_constexpr(max(1, VCOLS // NTHREADS)):
                    p = tidx + r * NTHREADS  # position k * 32 + l: column l * VEC + k of the tile
                    c = cb * VCOLS + (p % 32) * VEC + p // 32
                    m = sMax[0, p]
                    for w in cutlass.range_constexpr(1, WARPS):
                        m = cute.arch.fmax(m, sMax[w, p], nan=True)
                    if cutlass.const_expr(cfg.amax):
                        tm = cute.arch.fmax(tm, m, nan=True)
                    if cutlass.const_expr(cfg.colwise):
                        e = codec.block_scale(cfg.fmt, m, use_hw_e8m0)
                        sInv[p] = dev.inv_scale(e)
                        if c < N:
                            if cutlass.const_expr(GROUPED and cfg.fmt.swizzled):
                                if gt.row_end > gt.row0:
                                    col_scale[codec.group_col_scale_offset(gt, c)] = Uint8(e)
                            elif cutlass.const_expr(GROUPED):  # a tile with no rows writes its scale row's zeros
                                col_scale[rb * N + c] = Uint8(cutlass.select_(gt.row_end > gt.row0, e, Int32(0)))
                            else:
                                codec.put_col_scale(cfg.fmt, col_scale, None, co + c, rb, M, NOUT, e)
                    if cutlass.const_expr(cfg.dbias):
                        sm = sSum[0, p]
                        for w in cutlass.range_constexpr(1, WARPS):
                            sm = sm + sSum[w, p]  # fixed order: deterministic
                        if c < N:
                            dbias_ws[rb, co + c] = sm
                if cutlass.const_expr(cfg.amax):
                    tm = dev.warp_max(tm)
                    if lane == 0:
                        cute.arch.atomic_fmax(amax.iterator, tm, sign_bit=False)  # one atomic per warp
            if cutlass.const_expr(cfg.colwise):
                cute.arch.sync_threads()
                sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
                for k in cutlass.range_constexpr(VEC):
                    sc[k] = sInv[k * 32 + lane]
                if cutlass.const_expr(UNALIGNED):
                    out_col = ua.row_base(col_data, rbase, c0)
                    for i in cutlass.range_constexpr(VROWS):
                        self.store_unit_row(ua.row_at(out_col, i), vals, i, sc, col_ok and rbase + i < row_end,
                                            whole, part, nvalid)
                for i in cutlass.range_constexpr(0 if UNALIGNED else VROWS):
                    if col_ok and rbase + i < row_end:
                        qc = cute.make_rmem_tensor_like(tCol[(None, (0, 0))])
                        for k in cutlass.range_constexpr(0, VEC, 2):
                            lo, hi = codec.encode2(cfg.fmt, dev.mul_rn(vals[i * VEC + k], sc[k]),
                                                  dev.mul_rn(vals[i * VEC + k + 1], sc[k + 1]))
                            qc[k] = lo
                            qc[k + 1] = hi
                        cute.autovec_copy(qc, tCol[(None, (rbase + i, g))])
        if cutlass.const_expr(len(STAGED) > 0):
            cute.arch.cp_async_wait_group(0)  # (under noop nothing above waited for the staged copies)

    def store_unit_row(self, p, vals, i: int, inv, ok, whole, part, nvalid):
        """Unaligned rows: row i's VEC values times their inverse scales ``inv`` as one FP8 unit
        at byte address ``p`` (a multiple of 8), when the row exists (``ok``)."""
        q = [dev.mul_rn(vals[i * VEC + k], inv[k]) for k in range(VEC)]
        d0 = codec.encode4(self.cfg.fmt, q[0], q[1], q[2], q[3])
        d1 = codec.encode4(self.cfg.fmt, q[4], q[5], q[6], q[7])
        ua.store_unit_or_prefix(p, d0, d1, ok & whole, ok & part, nvalid)
