"""The element-wise kernel: fp32 inputs at any N and alignment (16-bit inputs at those shapes
run the packed kernel with unaligned rows, packed.py / unaligned.py).

Tiling: a CTA of GENERIC_WARPS warps covers ROWS (32) rows x 32 * GENERIC_WARPS columns; lane =
column, so one warp row is one rowwise 32-block (its amax one redux.sync, device.warp_amax) and
one lane's 32 rows are one colwise block. Every row's load is issued before any arithmetic (one
independent load per row and input, so their latencies overlap: odd-N shapes ran at 20-26% of
copy when each row's arithmetic waited for that row's load). Row addresses step by the row
stride (but a plain colwise cast's loads) and lane i stores row i's scale byte, once
(measured on the H200).

Phases: ``load_rows``; then, unless noop, the kernel body's pass over the rows (values, rowwise
FP8 bytes, column maxima); ``store_row_scale``, ``store_column``, the amax and dbias partials.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8

from . import codec
from . import device as dev
from . import grouped
from . import unaligned as ua
from .config import GENERIC_WARPS, ROWS

COLS = 32 * GENERIC_WARPS


def _widen(reg, i):
    return reg[i].to(Float32)


def grid(cfg, M, N, G=None):
    rows = cute.ceil_div(M, ROWS) if G is None else grouped.row_tiles(M, G)
    return [rows, cute.ceil_div(N, COLS) * (2 if cfg.halves else 1), 1], [COLS, 1, 1]


class GenericKernel:
    """The generic kernel of one config and op (element.ElementOp)."""

    def __init__(self, cfg, op):
        self.cfg = cfg
        self.op = op

    @cute.kernel
    def generic_kernel(self, ins: list, scalars: list, act_in, row_data, row_scale, col_data, col_scale, amax,
                       dbias_ws, noop, group_ends, M: Int32, N: Int32, NO: Int32, use_hw_e8m0: cutlass.Constexpr):
        cfg = self.cfg
        GROUPED = cutlass.const_expr(group_ends is not None)
        tidx, _, _ = cute.arch.thread_idx()
        rb, cb, _ = cute.arch.block_idx()
        # outputs: NOUT columns, this CTA's at column offset co (two-halves ops: half h of 2N, ElementOp.output_half)
        cb, co, NOUT, scalars = self.op.output_half(cb, N, NO, COLS, scalars)
        lane = tidx % 32
        col = (cb * GENERIC_WARPS + tidx // 32) * 32 + lane
        row0 = rb * ROWS
        row_end = M
        if cutlass.const_expr(GROUPED):
            # row tile rb is one colwise block of a group: rows [gt.row0, gt.row_end) (grouped.py)
            red = grouped.scratch(cutlass.memory.SmemAllocator(), COLS, cfg.group_search)
            gt = grouped.GroupTile(group_ends, red, rb, M, NOUT, cfg, COLS)
            row0 = gt.row0
            row_end = gt.row_end
        col_ok = col < N
        # this thread's column of the CTA's rows, per source (the epilogue's inputs, then act_input)
        sources = self.op.sources(ins, act_in)
        regs = [cute.make_rmem_tensor(cute.make_layout(ROWS), s.element_type) for s in sources]
        self.load_rows(sources, regs, GROUPED, rb, row0, row_end, col, col_ok)
        if noop[0] != Float32(1.0):
            vals = cute.make_rmem_tensor(cute.make_layout(ROWS), Float32)
            cmax = Float32(0.0)
            # the block's partial dbias sum in the workspace's precision (numerics.dbias_partial_dtype)
            dsum = self.op.dbias_zero(dbias_ws)
            nbr = (NOUT + 31) // 32  # row-scale blocks per row
            if cutlass.const_expr(cfg.rowwise):
                out_row, out_step = ua.row_base(self.op.out_window(row_data, co), row0, col)
                row_e = Int32(0)
            for i in cutlass.range_constexpr(ROWS):
                r = row0 + i
                v = Float32(0.0)
                if col_ok and r < row_end:
                    v = self.op.value(regs, i, scalars, _widen)
                    dsum = self.op.dbias_add(dsum, v, dbias_ws)
                    v = self.op.round_to_input(v, ins[0].element_type)
                vals[i] = v
                cmax = cute.arch.fmax(cmax, cute.math.abs(v), nan=True)
                if cutlass.const_expr(cfg.rowwise):
                    e = codec.block_scale(cfg.fmt, dev.warp_amax(v), use_hw_e8m0)
                    if col_ok and r < row_end:
                        ua.at_address(Uint8, out_row)[0] = codec.encode1(cfg.fmt, dev.mul_rn(v, dev.inv_scale(e)))
                    out_row = out_row + out_step
                    row_e = Int32(cutlass.select_(lane == i, e, row_e))  # lane i keeps row i's scale
            if cutlass.const_expr(cfg.rowwise):
                self.store_row_scale(row_scale, row_e, gt if GROUPED else None, row0, row_end, lane, col, co, N, nbr)
            if cutlass.const_expr(cfg.colwise):
                e = codec.block_scale(cfg.fmt, cmax, use_hw_e8m0)
                s_inv = dev.inv_scale(e)
                if col_ok:
                    self.store_column(vals, e, s_inv, col_data, col_scale, gt if GROUPED else None, rb, row0, row_end, col, co,
                                      M, N, NOUT)
            if cutlass.const_expr(cfg.amax):
                wmax = dev.warp_max(cmax)
                if lane == 0:
                    dev.amax_atomic(amax, wmax)
            if cutlass.const_expr(cfg.dbias):
                if col_ok:
                    dbias_ws[rb, co + col] = dsum  # this CTA's partial column sum, reduced in order later

    @cute.jit
    def load_rows(self, sources, regs, grouped_: cutlass.Constexpr, rb, row0, row_end, col, col_ok):
        """Every row's load of this thread's column, issued before any arithmetic, into ``regs``."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.rowwise or cfg.computed):
            # each row's byte address stepped from the last by the row stride (an address computed
            # per row under its predicate took ~6 instructions per row; these ops are issue-bound)
            src_rows = [ua.row_base(s, row0, col) for s in sources]
            ptrs = [a for a, _ in src_rows]
            for i in cutlass.range_constexpr(ROWS):
                if col_ok and row0 + i < row_end:
                    for t in cutlass.range_constexpr(len(sources)):
                        regs[t][i] = ua.at_address(sources[t].element_type, ptrs[t])[0]
                ptrs = [ptrs[t] + src_rows[t][1] for t in range(len(sources))]
        else:
            # a plain colwise cast is memory-bound, and its loads through the global tile (an address
            # per row) ran it 2.6-3.1% faster than the stepped ones, both with stepped stores
            tiles = [dev.thread_tile(s, (ROWS, 1), rb, row0, col, grouped_) for s in sources]
            for i in cutlass.range_constexpr(ROWS):
                if col_ok and row0 + i < row_end:
                    for t in cutlass.range_constexpr(len(sources)):
                        regs[t][i] = tiles[t][i, 0]

    @cute.jit
    def store_row_scale(self, row_scale, row_e, gt, row0, row_end, lane, col, co, N, nbr):
        """Each lane stores its row's scale byte of the warp's block (one store per lane, not one
        per row by lane 0; plain stores: L2-kept ones ran this kernel 8-15% slower). (co + col) // 32
        is the warp's block in every lane because co % 32 == 0: a two-halves op with rowwise
        output needs N % 32 == 0 (op._unserved). ``gt``: the group tile of a grouped call."""
        cfg = self.cfg
        r = row0 + lane
        if col - lane < N and r < row_end:
            if cutlass.const_expr(gt is not None):
                row_scale[codec.group_row_scale_offset(cfg.fmt, gt, r, self.op.out_col(co, col) // 32, nbr)] = Uint8(row_e)
            elif cutlass.const_expr(cfg.fmt.swizzled):
                row_scale[dev.swizzle_offset(r, (co + col) // 32, nbr)] = Uint8(row_e)
            else:
                row_scale[r * nbr + (co + col) // 32] = Uint8(row_e)

    @cute.jit
    def store_column(self, vals, e, s_inv, col_data, col_scale, gt, rb, row0, row_end, col, co, M, N, NOUT):
        """This thread's column block: its 32 FP8 values (scale ``e``, inverse ``s_inv``) and its
        scale byte."""
        cfg = self.cfg
        # (two rows per conversion; each pair's addresses stepped from the last pair's)
        out_col, col_step = ua.row_base(self.op.out_window(col_data, co), row0, col)
        for i in cutlass.range_constexpr(0, ROWS, 2):
            lo, hi = codec.encode2(cfg.fmt, cute.math.mul(vals[i], s_inv, rounding=dev.RN),
                                   cute.math.mul(vals[i + 1], s_inv, rounding=dev.RN))
            if row0 + i < row_end:
                ua.at_address(Uint8, out_col)[0] = lo
            if row0 + i + 1 < row_end:
                ua.at_address(Uint8, out_col + col_step)[0] = hi
            out_col = out_col + col_step * 2
        if cutlass.const_expr(gt is not None and cfg.fmt.swizzled):
            if row_end > row0:
                col_scale[codec.group_col_scale_offset(gt, self.op.out_col(co, col))] = Uint8(e)
        elif cutlass.const_expr(gt is not None):  # a tile with no rows writes its scale row's zeros
            col_scale[rb * NOUT + self.op.out_col(co, col)] = Uint8(cutlass.select_(row_end > row0, e, Int32(0)))
        elif cutlass.const_expr(cfg.fmt.swizzled):
            col_scale[dev.swizzle_offset(co + col, rb, (M + 31) // 32)] = Uint8(e)
        else:
            col_scale[rb * NOUT + co + col] = Uint8(e)
