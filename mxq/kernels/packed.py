"""The packed kernel for 16-bit inputs (bf16, fp16): N % 8 == 0 and 16-byte aligned tensors,
or, with ``unaligned``, any N and alignment (loads and stores through unaligned.py; the rest of
the kernel is the same code).

Values stay in the input's 16-bit format, two per 32-bit word: the amax is computed on packed
words (AND + max.NaN.{bf16x2,f16x2}, exact), values widen to fp32 only to be multiplied by the
scale, and four FP8 bytes leave as one word. This cuts the instructions per element about 3x
against fp32 values, which is what bounds the rowwise+colwise pass on the H200.

Tiling (KernelConfig.packed_warps = W warps, PK_ROWS = KernelConfig.tile_rows / W rows per thread):
- ops with a column reduction (colwise, amax, dbias): a CTA covers 32 rows x 32 * VEC columns;
  lane l owns columns 8l..8l+7, warp w owns PK_ROWS adjacent rows (unaligned rows: rows w,
  w + W, ..., which share their read and store plans, unaligned.py); FP8 block scaling's
  colwise blocks take 128 rows and FP4's transposed colwise copy (NVFP4, MXFP4) 32 (KernelConfig.tile_rows),
  both as warps of 8 rows;
- a pure rowwise cast ("wide", KernelConfig.wide): the warps lie side by side along one band of
  PK_ROWS rows (8 x 1024 columns), so a CTA's rows are long runs of memory and its row-scale
  bytes, gathered in shared memory, leave as whole 4-byte words.

The kernel body finds the thread's place and the CTA's shared memory (KernelConfig.packed_buffers)
and runs the phases, each a method below with one job: ``stage_loads`` (cp.async of every row,
ops with arithmetic, unaligned rows and KernelConfig.tr_stage's staged transposed copy; where
KernelConfig.stage_rows stages half the rows at once, a ring whose later rows ``values``
requests, ``stage_row``), ``load_registers``; then per output half ``values``
(the op, rounding, magnitudes, dbias sums: ``row_values``), ``row_scales``, ``column_owners``
after one barrier, and one pass over the rows that widens each word once for both directions'
FP8 bytes and stores them (``store_rows`` / ``store_unaligned``). The grid is (column tiles, row
tiles), the row tiles split over y and z past 65535, so no integer division finds the tile
(KernelConfig.rows_fast: (row tiles, column tiles), the column tiles split the same way; a
padding tile past N has no column inside N, and every load and store is bounded by N).
Nothing branches on noop: it zeroes the row bound Ms of every store instead (with an early exit
ptxas sank three of the four row loads below the noop load, serialising two memory latencies).
"""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32, Uint64

from . import codec
from . import device as dev
from . import grouped
from . import smem as shared
from . import unaligned as ua
from .config import ROWS, VEC

VCOLS = 32 * VEC  # columns of a (non-wide) tile
PKW = VEC // 2  # 32-bit words per row per thread
TR_CHUNKS = 16  # 8-byte chunks of a 128-row tile's column (the transposed colwise copy)


def fp4_column_slot(warp, c):
    """Where warp ``warp``'s word of tile column ``c`` (its 8 rows' codes) lies in "fp4t"
    (FP4's transposed colwise copy): a row of VCOLS words per warp, each 8 columns XOR-swizzled by
    (c >> 5) & 7, so that a warp's stores (lane l writes column 8l + k) and the readers' loads
    (consecutive columns) hit 32 distinct banks."""
    return warp * VCOLS + ((c & ~7) | ((c & 7) ^ ((c >> 5) & 7)))


def fp4_store_words(a, warps: int, ops=dev.RNG_DEVICE):
    """Words per store of FP4's colwise runs (PackedKernel.store_fp4_columns), from ``a`` = the
    copy's base address | its row bytes M / 2: 4 where ``a`` % 16 == 0 (then M % 32 == 0) and
    the run has 4 words or more (``warps`` >= 4), else 2 where ``a`` % 8 == 0 (M % 16 == 0), else
    1 (M % 8 == 0). A store of W words then covers 8 * W rows starting on a multiple of 8 * W,
    and M is a multiple of 8 * W: a store whose first row is below M lies wholly below M."""
    I32, I64 = ops.I32, ops.I64
    w = I32(ops.select((I64(a) & I64(15)) == I64(0), I32(4 if warps >= 4 else 2), I32(2)))
    return I32(ops.select((I64(a) & I64(7)) == I64(0), w, I32(1)))


def fp4_group_store_words(a, warps: int, ops=dev.RNG_DEVICE):
    """Words per store of a grouped call's colwise runs (store_fp4_columns), from ``a`` = the
    copy's base address | M / 2 | the tile's first row / 2 | the tile's row end / 2 (Ms: its
    group's end within the tile; 0 under noop; every one a byte offset): fp4_store_words where
    ``a`` % 4 == 0 (then the run and that end lie on whole 8-row words), else 0: the run as
    aligned words and halves (store_fp4_shifted, fp4_shifted_plan), each byte below that end."""
    I32, I64 = ops.I32, ops.I64
    return I32(ops.select((I64(a) & I64(3)) == I64(0), fp4_store_words(a, warps, ops), I32(0)))


def fp4_shifted_plan(s: int, warps: int):
    """The stores of a grouped colwise run (``warps`` words, 4 * warps bytes) whose first byte
    lies ``s`` = its address % 4 past a word boundary (store_fp4_shifted; ``s`` 0 to 3): the
    aligned words k = 0 .. warps at (address - s) + 4k, word k holding run bytes j = 4k - s + i
    (i its byte, fp4_shifted_word), as pieces (k, i0, width, j0): a word whose four bytes are
    all the run's (width 4), else its run bytes as 2-byte pieces on even i and single bytes
    (the first word's bytes s..3, the last's 0..s-1). Each piece is stored where its last byte
    is one of the run's nv bytes that lie below the group's end (fp4_piece_stores)."""
    plan = []
    for k in range(warps + 1):
        lo, hi = max(0, s - 4 * k), min(3, 4 * warps - 1 + s - 4 * k)
        if lo > hi:
            continue
        if (lo, hi) == (0, 3):
            plan.append((k, 0, 4, 4 * k - s))
            continue
        i = lo
        while i <= hi:
            width = 2 if i % 2 == 0 and i + 1 <= hi else 1
            plan.append((k, i, width, 4 * k - s + i))
            i += width
    return plan


def fp4_piece_stores(i0: int, width: int, j0: int):
    """A piece of fp4_shifted_plan as the stores tried in order, each (byte i in its word, width,
    the run byte whose index must be below nv for it): the piece whole, else (a word) its two
    halves, else (a half) its first byte; the first of a piece's alternatives whose byte is below
    nv is stored, and none if none is."""
    if width == 4:
        return [(0, 4, j0 + 3)], [fp4_piece_stores(0, 2, j0), fp4_piece_stores(2, 2, j0 + 2)]
    if width == 2:
        return [(i0, 2, j0 + 1), (i0, 1, j0)], []
    return [(i0, 1, j0)], []


def fp4_shifted_word(w, k: int, s: int, warps: int, const=Uint32, mask=None):
    """Aligned word k of fp4_shifted_plan from the run's words ``w`` (little-endian: run byte j
    is byte j % 4 of w[j // 4]): w[k] moved up s bytes, the top s bytes of w[k - 1] below it.
    On Uint32 values, or on Python ints with ``const`` int and ``mask`` 0xFFFFFFFF (32 bits)."""
    hi = (const(w[k]) << const(8 * s)) if k < warps else None  # (unsigned: the shifts below are logical)
    if hi is not None and mask is not None:
        hi = hi & mask
    lo = (const(w[k - 1]) >> const(32 - 8 * s)) if k > 0 and s > 0 else None
    return hi if lo is None else lo if hi is None else hi | lo


def fp4_group_block(start, g, b, tile_rows: int, w0, rows: int, block: int):
    """The column, in a grouped call's colwise scale buffer [N, M // block + G], of the block
    held from warp ``w0`` of the ``b``-th row tile of group ``g`` (its first row ``start``;
    ``rows`` rows a warp): the group's blocks start at column start // block + g
    (fp4_layouts.first_colwise_block). Plain integer arithmetic: the tests run it on ints."""
    return start // block + g + (b * tile_rows + w0 * rows) // block


def fp4_run_stores(words: int, warps: int):
    """A column's run of ``warps`` words (one per 8-row warp) as stores of ``words`` words
    (fp4_store_words): (first word, words) each; the store's first row is 8 * first word."""
    return [(q, words) for q in range(0, warps, words)]


def fp4_scale_warps(warp, rows: int, block: int = 16):
    """FP4's colwise scales on a tile of ``rows``-row warps: warp ``warp``'s ``block``-row block
    (NVFP4's 16, MXFP4's 32) is held by warps w0 .. w0 + block // rows - 1 (w0 = warp - warp %
    (block // rows)), whose column maxima give its scales; w0 stores them. Returns (w0, warps
    per block)."""
    wpb = block // rows
    return warp - warp % wpb, wpb


def fp4_column_scale_run(swizzled: bool, c0, blk, nbm):
    """(offset, step): where the colwise scales of block ``blk`` of columns c0 .. c0 + VEC - 1
    (c0 % VEC == 0) lie in a [N, nbm] scale matrix, column c0 + q's at offset + q * step: apart
    by nbm (compact) or by 16 bytes (swizzled: the columns are rows c0 % 32 + q of one 32-row
    group of a 128x4 atom). Plain integer arithmetic: the tests run it on ints."""
    return dev.scale_offset(swizzled, c0, blk, nbm), (16 if swizzled else nbm)


def fp4_split_column_scales(cfg, wpb: int, pkw: int) -> bool:
    """Whether the two warps of an NVFP4 colwise block share its scales' work
    (PackedKernel.fp4_split_column_scales): 1x16 blocks of two 8-row warps, rounding to nearest
    or stochastic, no Hadamard transform (its maxima buffer serves the transform), the copy's
    column run aligned (its scale offsets hoisted); else each warp computes all 8."""
    fmt = cfg.fmt
    return bool(fmt.global_scale and wpb == 2 and pkw == 4 and not fmt.hadamard and not cfg.fp4_tiles
                and not (cfg.halves))


def fp4_tile_entries(warp, lane, rb, cb, tile_rows: int, rows: int, block: int = 16):
    """NVFP4's 16x16 tiles (PackedKernel.fp4_tile_scales) on a tile of ``rows``-row warps: the
    scale entries thread (warp, lane) of CTA (cb, rb) stores, as (its first row, its first
    column): rows first .. first + rows / 2 - 1 of the rowwise scales (lanes 2q and 2q + 1 each
    half of their warp's rows) and columns first .. first + VEC // (block // rows) - 1 of the
    colwise ones (the tile's warps each a share of the lane's columns). Plain integer arithmetic:
    the tests run it on ints."""
    w0, wpb = fp4_scale_warps(warp, rows, block)
    row = rb * tile_rows + warp * rows + (lane % 2) * (rows // 2)
    col = (cb * 32 + lane) * VEC + (warp - w0) * (VEC // wpb)
    return row, col


def ring_wait(i: int, depth: int, rows: int) -> int:
    """Staged rows (one cp.async commit group each, ``depth`` of a thread's ``rows`` at once):
    the groups that may still be pending when row i is read (``cp.async.wait_group``). Rows 0 ..
    depth - 1 are requested first, each later row once the row ``depth`` before it is read
    (ring_next), so row i's read follows min(i + depth, rows) commits, i + 1 of them needed."""
    return min(depth - 1, rows - 1 - i)


def ring_next(i: int, depth: int, rows: int):
    """The row requested into row i's slot (i % depth) once row i is read, or None."""
    return i + depth if i + depth < rows else None


def ring_parks(i: int, depth: int, rows: int) -> bool:
    """Row i's words are parked in its slot after it is read (PackedKernel.park): a ring's slot
    that takes no later row."""
    return depth < rows and ring_next(i, depth, rows) is None


def tile(cfg, grouped: bool = False, unaligned: bool = False):
    """(rows, columns) of one CTA's tile."""
    if cfg.wide_tile(grouped, unaligned):
        return ROWS // cfg.packed_warps(unaligned), VCOLS * cfg.packed_warps(unaligned)
    return cfg.tile_rows, VCOLS


def grid(cfg, M, N, G=None, unaligned: bool = False):
    """Grid and block; ``G``: the group count of a grouped call (grouped.row_tiles row tiles)."""
    tile_rows, tile_cols = tile(cfg, G is not None, unaligned)
    n_fast = cute.ceil_div(N, tile_cols) * (2 if cfg.halves and cfg.halves_passes == 1 else 1)  # (two-halves ops: each tile twice)
    n_slow = cute.ceil_div(M, tile_rows) if G is None else grouped.row_tiles(M, G, cfg.tile_rows)
    if cfg.rows_fast:  # (KernelConfig.rows_fast: row tiles along x, column tiles along y and z)
        n_fast, n_slow = n_slow, n_fast
    gz = cute.ceil_div(n_slow, 65535)  # grid y is at most 65535
    return [n_fast, cute.ceil_div(n_slow, gz), gz], [cfg.packed_warps(unaligned) * 32, 1, 1]


class Fields(dict):
    """Named values of the kernel body that a phase reads."""

    def rec(self, **more):
        """A fresh read-only record of them (and ``more``) for one phase call."""
        return SimpleNamespace(**self, **more)


def rec(fields: Fields, **more):
    """``fields.rec(**more)`` for a kernel body's dynamic ``if``: the DSL takes a method called
    on a name there for a change to it, and cannot carry a Fields through the ``if``."""
    return fields.rec(**more)


class PackedKernel:
    """The packed kernel of one config (``cfg``) and op (``op``: element.ElementOp)."""

    def __init__(self, cfg, op):
        self.cfg = cfg
        self.op = op

    @cute.kernel
    def packed_kernel(self, ins: list, scalars: list, act_in, row_data, row_scale, col_data, col_scale, amax,
                      dbias_ws, noop, group_ends, M: Int32, N: Int32, NO: Int32, use_hw_e8m0: cutlass.Constexpr,
                      use_pdl: cutlass.Constexpr, unaligned: cutlass.Constexpr, rows8: cutlass.Constexpr = False,
                      rng=None):
        cfg = self.cfg
        GROUPED = cutlass.const_expr(group_ends is not None)
        UNALIGNED = cutlass.const_expr(unaligned)  # any N and alignment: rows through unaligned.py
        # (variant "rows8", unaligned rows only: the FP8 output rows start on 8-byte boundaries)
        ROWS8 = cutlass.const_expr(UNALIGNED and rows8)
        WIDE = cutlass.const_expr(cfg.wide_tile(GROUPED, UNALIGNED))
        # a user epilogue may map the zero padding of rows past M to nonzero: kernels without dbias
        # zero those rows' magnitudes (what the row and column maxima read) with one mask per row,
        # instead of a select per element; dbias (which sums v) selects v
        ROW_MASK = cutlass.const_expr(not cfg.identity and not cfg.dbias)
        is_bf16 = cutlass.const_expr(ins[0].element_type is cutlass.BFloat16)
        WARPS = cutlass.const_expr(cfg.packed_warps(UNALIGNED))
        NTHREADS = cutlass.const_expr(WARPS * 32)
        PK_ROWS = cutlass.const_expr(cfg.tile_rows // WARPS)  # rows per thread
        # a thread's rows: rbase + i * RSTEP. Aligned: PK_ROWS adjacent rows. Unaligned: rows WARPS
        # apart, so that rows 8 apart, which share their misalignment, share one thread's read and
        # store plans (unaligned.py); PERIOD plans per thread
        RSTEP = cutlass.const_expr(WARPS if UNALIGNED else 1)
        PERIOD = cutlass.const_expr(ua.plans_per_thread(PK_ROWS, RSTEP))  # row i takes plan i % PERIOD
        TILE_ROWS, TILE_COLS = tile(cfg, GROUPED, UNALIGNED)
        DIVBY = cutlass.const_expr(1 if UNALIGNED else VEC)  # what N is a multiple of
        RS_BLOCKS = cutlass.const_expr(TILE_COLS // cfg.fmt.block[1])  # row-scale blocks per tile row
        # rows per thread staged at once; fewer than PK_ROWS: a ring, its phases ordered for registers
        DEPTH = cutlass.const_expr(cfg.stage_rows(UNALIGNED, GROUPED, ins[0].element_type is cutlass.Float16))
        RING = cutlass.const_expr(DEPTH < PK_ROWS)
        if cutlass.const_expr(use_pdl):
            cute.arch.griddepcontrol_launch_dependents()  # dbias_kernel may start; it waits for this grid to finish
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, bz = cute.arch.block_idx()
        _, gy, _ = cute.arch.grid_dim()
        lane = tidx % 32
        warp = tidx // 32
        cb, rb = (by + bz * gy, bx) if cutlass.const_expr(cfg.rows_fast) else (bx, by + bz * gy)  # (grid)
        # outputs: NOUT columns, this CTA's at column offset co (two-halves ops: half h of 2N, ElementOp.output_half)
        PASSES = cutlass.const_expr(cfg.halves_passes)  # 2: this CTA writes both halves (Tuning.halves_one_cta)
        cb, co, NOUT, scalars = self.op.output_half(cb, N, NO, TILE_COLS, scalars, divby=DIVBY, passes=PASSES)
        # the tensors read per element; operands broadcast along rows (a bias) are loaded once, for
        # row 0, and shared by every row; operands broadcast along columns (a row scale, a scalar)
        # take element loads; the others are staged through shared memory by ops with arithmetic
        # and unaligned rows
        sources = self.op.sources(ins, act_in)
        NSRC = cutlass.const_expr(len(sources))
        once = [dev.broadcast_rows(src) for src in sources]
        staged_src = [(cfg.stage or UNALIGNED) and not dev.broadcast_cols(src) for src in sources]
        # the CTA's shared memory, declared once (KernelConfig.packed_buffers)
        buffers = cfg.packed_buffers([(s.element_type.width, once[t]) if staged_src[t] else None
                                      for t, s in enumerate(sources)], UNALIGNED, GROUPED, DEPTH)
        if cutlass.const_expr(len(buffers) > 0):
            buf = shared.allocate(cutlass.memory.SmemAllocator(), buffers,
                                  {f"in{t}": s.element_type for t, s in enumerate(sources)})
        gt = None
        if cutlass.const_expr(GROUPED):
            # row tile rb is one colwise block of a group: rows [gt.row0, gt.row_end) (grouped.py)
            gt = grouped.GroupTile(group_ends, buf.get("group") if buffers else None, rb, M, NOUT, cfg, NTHREADS)
            in_grid = rb < grouped.row_tiles(M, group_ends.shape[0], cfg.tile_rows)
            row_end = gt.row_end
            if cutlass.const_expr(cfg.fmt.global_scale):  # (NVFP4: each group's own amax)
                amax = grouped.group_amax(amax, gt)
        else:
            in_grid = rb < (M + TILE_ROWS - 1) // TILE_ROWS
            row_end = M
        # the CTA's work, or for a grouped tile with no rows its zero scales alone (empty_tile)
        c = Fields(GROUPED=GROUPED, UNALIGNED=UNALIGNED, ROWS8=ROWS8, WIDE=WIDE, ROW_MASK=ROW_MASK, is_bf16=is_bf16,
                   WARPS=WARPS, NTHREADS=NTHREADS, PK_ROWS=PK_ROWS, RSTEP=RSTEP, PERIOD=PERIOD, TILE_ROWS=TILE_ROWS,
                   RS_BLOCKS=RS_BLOCKS, PASSES=PASSES, DEPTH=DEPTH, RING=RING, use_hw_e8m0=use_hw_e8m0, NSRC=NSRC,
                   DIVBY=DIVBY, sources=sources, once=once, staged_src=staged_src, buffers=buffers, ins=ins, rng=rng)
        v = Fields(tidx=tidx, lane=lane, warp=warp, cb=cb, rb=rb, co=co, NOUT=NOUT, scalars=scalars, gt=gt,
                   in_grid=in_grid, row_end=row_end, amax=amax, M=M, N=N, noop=noop, dbias_ws=dbias_ws,
                   col_scale=col_scale, row_scale=row_scale, row_data=row_data, col_data=col_data,
                   buf=buf if len(buffers) > 0 else None)
        if cutlass.const_expr(GROUPED and not UNALIGNED and cfg.empty_exit):
            if gt.row_end > gt.row0:
                self.tile_work(rec(c), rec(v))
            else:
                self.empty_tile(rec(c), rec(v))
        else:
            self.tile_work(rec(c), rec(v))

    @cute.jit
    def tile_work(self, c, v):
        """The kernel body past the CTA's place (and a grouped tile's group): loads, values, scales
        and stores of every pass (``c``: the body's compile-time values, ``v``: its dynamic ones)."""
        cfg = self.cfg
        GROUPED, UNALIGNED, ROWS8, WIDE, ROW_MASK, is_bf16 = c.GROUPED, c.UNALIGNED, c.ROWS8, c.WIDE, c.ROW_MASK, c.is_bf16
        WARPS, NTHREADS, PK_ROWS, RSTEP, PERIOD, TILE_ROWS = c.WARPS, c.NTHREADS, c.PK_ROWS, c.RSTEP, c.PERIOD, c.TILE_ROWS
        RS_BLOCKS, PASSES, DEPTH, RING, use_hw_e8m0, NSRC = c.RS_BLOCKS, c.PASSES, c.DEPTH, c.RING, c.use_hw_e8m0, c.NSRC
        DIVBY = c.DIVBY
        sources, once, staged_src, buffers, ins, rng = c.sources, c.once, c.staged_src, c.buffers, c.ins, c.rng
        tidx, lane, warp, cb, rb, co, NOUT, scalars = v.tidx, v.lane, v.warp, v.cb, v.rb, v.co, v.NOUT, v.scalars
        gt, in_grid, row_end, amax, M, N, noop, dbias_ws = v.gt, v.in_grid, v.row_end, v.amax, v.M, v.N, v.noop, v.dbias_ws
        col_scale, row_scale, row_data, col_data, buf = v.col_scale, v.row_scale, v.row_data, v.col_data, v.buf
        g, trow, rbase, c0, col_ok, cT, ncols, abs_masks = self.thread_place(WIDE, GROUPED, UNALIGNED, WARPS, PK_ROWS,
                                                                             RSTEP, cb, rb, warp, lane, gt, N)
        # sRS: the wide tile's rows x RS_BLOCKS row-scale bytes, gathered to leave as whole words.
        # sMax, sSum and sInv are indexed by position j * 32 + lane (word or column j of lane), so
        # that a warp's stores and the owners' loads below touch consecutive words: no bank
        # conflicts. sEdge: each warp's partial output units (two words), head and tail per row and direction.
        sRS, sMax, sInv, sSum, sEdge, sTr, sF4, sSX = (
            self.shared_buffer(buf, n, staged_src) if len(buffers) > 0 else None
            for n in ("rs", "max", "inv", "sum", "edge", "tr", "fp4t", "srx"))
        # this thread's PK_ROWS x VEC tile of each tensor: row i is the tile's base + i * RSTEP row strides
        tiles = [dev.thread_tile(s, (PK_ROWS, VEC), trow, rbase, g, GROUPED, RSTEP) for s in sources]
        if cutlass.const_expr(cfg.rowwise):
            nbr = (NOUT + cfg.fmt.block[1] - 1) // cfg.fmt.block[1]  # rowwise blocks per row
        if cutlass.const_expr(PASSES == 1 and not RING):  # (a ring's are built where its stores begin)
            tRow, tCol = self.out_tiles(PK_ROWS, row_data, col_data, co, trow, rbase, g, GROUPED)
        # Each phase call gets its own records (Fields.rec) of this body's values: a record shared
        # by two @cute.jit calls is tracked by the DSL as a mutable place, and that reorders the PTX.
        k = Fields(GROUPED=GROUPED, UNALIGNED=UNALIGNED, ROWS8=ROWS8, WIDE=WIDE, ROW_MASK=ROW_MASK, is_bf16=is_bf16,
                   WARPS=WARPS, NTHREADS=NTHREADS, PK_ROWS=PK_ROWS, RSTEP=RSTEP, PERIOD=PERIOD, TILE_ROWS=TILE_ROWS,
                   RS_BLOCKS=RS_BLOCKS, PASSES=PASSES, DEPTH=DEPTH, RING=RING, use_hw_e8m0=use_hw_e8m0,
                   IN_MAX=codec.input_max(ins[0].element_type),
                   ZERO_ROWS=UNALIGNED and cfg.computed and not cfg.dbias and any(staged_src))
        io = Fields(N=N, M=M, noop=noop, amax=amax, dbias_ws=dbias_ws, col_scale=col_scale, row_scale=row_scale,
                    row_data=row_data, col_data=col_data, glob=None)
        staged = Fields({n: buf[n] for n in [f"in{t}" for t in range(NSRC) if staged_src[t]] + ["rht"] * cfg.fmt.hadamard})
        stg = None
        if cutlass.const_expr(any(staged_src)):
            stg = self.stage_loads(k.rec(), Fields(rbase=rbase, lane=lane, warp=warp, col_ok=col_ok, row_end=row_end,
                                                   tidx=tidx, cT=cT, ncols=ncols).rec(smem=staged.copy()),
                                   sources, tiles, once, staged_src)
        frags = self.load_registers(k.rec(), Fields(col_ok=col_ok, rbase=rbase, row_end=row_end).rec(), tiles, once,
                                    staged_src)
        # every store below is bounded by Ms: 0 under noop (nothing written) or past the grid
        Ms = Int32(cutlass.select_(noop[0] != Float32(1.0), row_end, Int32(0)))
        Ms = Int32(cutlass.select_(in_grid, Ms, Int32(0)))
        if cutlass.const_expr(codec.shared_global_scales(cfg)):  # (read and computed once for both copies)
            io["glob"] = codec.global_scales(cfg.fmt, amax)
        # Two-halves ops with PASSES == 2: everything below runs once per output half over the same
        # loaded tile (the staged inputs are still in shared memory), writing at column offset co.
        for hp in cutlass.range_constexpr(PASSES):
            if cutlass.const_expr(PASSES == 2):
                co, scalars_p = self.op.pass_half(hp, N, scalars, divby=DIVBY)
                if cutlass.const_expr(hp == 1):
                    cute.arch.sync_threads()  # pass 0's readers of sMax/sSum/sInv are done
                tRow, tCol = self.out_tiles(PK_ROWS, row_data, col_data, co, trow, rbase, g, GROUPED)
            else:
                scalars_p = scalars
            words, absw, cm, dsum = self.values(
                k.rec(), Fields(lane=lane, warp=warp, tidx=tidx, col_ok=col_ok, rbase=rbase, row_end=row_end,
                                abs_masks=abs_masks).rec(smem=staged.copy()), hp, frags, stg, once, staged_src, scalars_p)
            sr = None
            owners = Fields(warp=warp, lane=lane, Ms=Ms, in_grid=in_grid, tidx=tidx, cb=cb, rb=rb, co=co, gt=gt, NOUT=NOUT)
            if cutlass.const_expr(cfg.col_reduce and RING):  # (their registers free before the row scales')
                self.publish_columns(k.rec(), owners.rec(smem={"max": sMax, "sum": sSum}), io.rec(), cm, dsum)
                cm = None
            if cutlass.const_expr(cfg.rowwise):
                sr = self.row_scale_phase()(k.rec(), Fields(lane=lane, c0=c0, rbase=rbase, rb=rb, g=g, cb=cb, Ms=Ms, co=co,
                                                     gt=gt, nbr=nbr, tidx=tidx).rec(smem={"rs": sRS}), io.rec(), absw)
            if cutlass.const_expr(cfg.col_reduce):
                self.column_owners(k.rec(), owners.rec(smem={"max": sMax, "sum": sSum, "inv": sInv}), io.rec(), cm, dsum)
            if cutlass.const_expr(cfg.rowwise or cfg.colwise):  # (else NVFP4's amax pass: the owners' amax alone)
                sr, sc = self.block_multipliers(k.rec(), owners.rec(smem={"inv": sInv, "max": sMax}), io.rec(), sr)
                if cutlass.const_expr(RING):
                    tRow, tCol = self.out_tiles(PK_ROWS, row_data, col_data, co, trow, rbase, g, GROUPED)
                if cutlass.const_expr(UNALIGNED):
                    self.store_unaligned(k.rec(), Fields(rbase=rbase, co=co, cT=cT, ncols=ncols, lane=lane, warp=warp,
                                                         Ms=Ms).rec(smem={"edge": sEdge}), io.rec(), words, sr, sc)
                elif cutlass.const_expr(cfg.transposed):
                    self.store_transposed_rows(k.rec(), owners.rec(col_ok=col_ok, rbase=rbase, smem={"tr": sTr}, tRow=tRow),
                                               io.rec(), words, sr, sc)
                else:
                    self.store_rows(k.rec(), Fields(col_ok=col_ok, rbase=rbase, Ms=Ms, tRow=tRow, tCol=tCol, g=g, N=N,
                                                    rng=rng, c0=c0, M=M, col_data=col_data, gt=gt, co=co, lane=lane, warp=warp, tidx=tidx,
                                                    cb=cb, rb=rb).rec(smem={"fp4t": sF4, "srx": sSX, **staged}), words, sr, sc)

    @cute.jit
    def empty_tile(self, c, v):
        """A grouped row tile with no rows (past its group's last block, grouped.py) skips the loads,
        values and barriers of tile_work and writes what that writes for it: with compact colwise
        scales, its scale row's zeros over the CTA's columns (FP8 block scaling's fp32 0.0, MXFP8's
        E8M0 byte 0; KernelConfig.empty_exit says which configs), in each output half of a
        two-halves op; nothing under noop or past the grid. Its dbias partials, which no reduction
        reads (reduce.group_partials), and the swizzled layouts' bytes are not written."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.colwise and not cfg.fmt.swizzled):
            writes = v.in_grid and v.noop[0] != Float32(1.0)
            for hp in cutlass.range_constexpr(c.PASSES):
                co = v.co
                if cutlass.const_expr(c.PASSES == 2):
                    co, _ = self.op.pass_half(hp, v.N, v.scalars, divby=c.DIVBY)
                for r in cutlass.range_constexpr((VCOLS + c.NTHREADS - 1) // c.NTHREADS):
                    oc = v.cb * VCOLS + v.tidx + r * c.NTHREADS
                    if writes and v.tidx + r * c.NTHREADS < VCOLS and oc < v.N:
                        codec.put_empty_col_scale(cfg.fmt, v.col_scale, v.gt, co + oc, v.rb, v.M, v.NOUT)

    def thread_place(self, WIDE, GROUPED, UNALIGNED, WARPS, PK_ROWS, RSTEP, cb, rb, warp, lane, gt, N):
        """Where the thread's tile lies (traced inline, no call of its own): (g, trow, rbase, c0,
        col_ok, cT, ncols, abs_masks). g: the lane's group of VEC columns, c0 its first column,
        col_ok whether it exists (aligned: N % VEC == 0, a group is wholly inside or outside); trow:
        the thread's PK_ROWS-row tile index, rbase its first row. Unaligned rows: the CTA's row
        segments are columns [cT, cT + ncols) of every row; the thread's values past column N (the
        next tile's, the next row's) are never stored, and their magnitudes, which the row maxima
        read, are masked to +0 (abs_masks; aligned: every column exists)."""
        cfg = self.cfg
        if cutlass.const_expr(WIDE):
            g = (cb * WARPS + warp) * 32 + lane
            trow = rb
            rbase = rb * PK_ROWS
        else:
            g = cb * 32 + lane
            trow = rb * WARPS + warp
            WROWS = cutlass.const_expr(PK_ROWS if RSTEP == 1 else 1)  # rows between two warps' first rows
            rbase = rb * cfg.tile_rows + warp * WROWS
            if cutlass.const_expr(GROUPED):
                rbase = gt.row0 + warp * WROWS
        c0 = g * VEC
        col_ok = c0 < N
        cT = ncols = None
        if cutlass.const_expr(UNALIGNED):
            cT = cb * VCOLS
            ncols = cutlass.min(Int32(VCOLS), N - cT)
            abs_masks = [m & Uint32(dev.ABS_BITS) for m in ua.column_masks(N - c0, PKW)]
        else:
            abs_masks = [Uint32(dev.ABS_BITS)] * PKW
        return g, trow, rbase, c0, col_ok, cT, ncols, abs_masks

    def shared_buffer(self, buf: dict, name: str, staged_src):
        """Shared-memory buffer ``name`` (KernelConfig.packed_buffers), None where the config has
        none; "tr" where it lies in the staged input's memory (KernelConfig.tr_aliased) a view of
        the first staged source's bytes as the transposed tile's 8-byte chunks."""
        if name == "tr" and self.cfg.tr_aliased:
            return cute.make_tensor(cute.recast_ptr(buf[f"in{staged_src.index(True)}"].iterator, dtype=Uint64),
                                    cute.make_layout(VCOLS * self.cfg.tile_rows // 8))
        return buf.get(name)

    def out_tiles(self, rows: int, row_data, col_data, co, trow, rbase, g, grouped: bool):
        """The thread's ``rows`` x VEC tiles of the aligned rowwise and colwise outputs at column
        offset ``co`` (None where the op writes no such copy; the colwise copy of the transposed
        and FP4 layouts is staged instead, store_transposed, store_fp4_columns), built where the
        stores begin: their 64-bit addresses then live through no earlier phase."""
        cfg = self.cfg
        tRow = tCol = None
        if cfg.rowwise:  # (FP4's data columns are bytes of two values: the half's from byte co / 2)
            tRow = dev.thread_tile(self.op.out_window(row_data, co // 2 if cfg.fmt.packed else co),
                                   (rows, codec.data_cols(cfg.fmt, VEC)), trow, rbase, g, grouped)
        if cfg.colwise and not cfg.transposed and not cfg.fmt.packed:
            tCol = dev.thread_tile(self.op.out_window(col_data, co), (rows, VEC), trow, rbase, g, grouped)
        return tRow, tCol

    # -- loads -------------------------------------------------------------------------------
    @cute.jit
    def stage_loads(self, k, t, sources, tiles, once, staged_src):
        """Staged loads: every row of every staged input is requested at once with cp.async into
        this thread's own shared-memory slots (one commit group per row) and read back just
        before its row is computed; where the config stages fewer rows at once
        (KernelConfig.stage_rows, aligned rows), the first of them, each later row requested by
        ``values`` into the slot of the row read just before (stage_row). Unaligned: each row
        segment is staged whole (its covering 16-byte chunks, copied by the warp) and every lane
        reads its 8 columns back realigned (unaligned.py). Returns a record of each staged
        source's misalignment per class of rows (unaligned), copy atom and thread tile."""
        NSRC = cutlass.const_expr(len(sources))
        g2s = [cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                   sources[s].element_type, num_bits_per_copy=128) if staged_src[s] else None
               for s in range(NSRC)]
        mis = None
        if cutlass.const_expr(k.UNALIGNED):
            # each source's rows and their misalignment (one per class of rows 8 apart)
            ga = [ua.row_base(sources[s], t.rbase, t.cT, k.RSTEP) if staged_src[s] else None for s in range(NSRC)]
            mis = [ua.per_class(ga[s], k.PERIOD, ua.chunk_misalignment) if staged_src[s] else None for s in range(NSRC)]
        for i in cutlass.range_constexpr(k.DEPTH):
            if cutlass.const_expr(k.UNALIGNED):
                for s in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(staged_src[s] and (i == 0 or not once[s])):
                        ua.stage_row(sources[s].element_type, t.smem[f"in{s}"][(t.warp * k.PK_ROWS + i, None)],
                                     ua.row_at(ga[s], i), mis[s][i % k.PERIOD], t.ncols, t.lane,
                                     t.rbase + i * k.RSTEP < t.row_end, k.ZERO_ROWS)
                cute.arch.cp_async_commit_group()
            else:
                self.stage_row(k, t, i, g2s, tiles, once, staged_src)
        return SimpleNamespace(mis=mis, g2s=g2s, tiles=tiles)

    @cute.jit
    def stage_row(self, k, t, i: cutlass.Constexpr, g2s, tiles, once, staged_src):
        """Aligned rows: row i of each staged source requested (cp.async) into its slot, i modulo
        the rows staged at once (KernelConfig.stage_rows), as one commit group."""
        slot = cutlass.const_expr(i % k.DEPTH)
        if t.col_ok and t.rbase + i < t.row_end:
            for s in cutlass.range_constexpr(len(tiles)):
                if cutlass.const_expr(staged_src[s] and (i == 0 or not once[s])):
                    cute.copy(g2s[s], tiles[s][(i, None)], t.smem[f"in{s}"][(slot, t.tidx, None)])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def load_registers(self, k, t, tiles, once, staged_src):
        """Every row's register fragment of every source, all loads first (PK_ROWS independent
        16-byte loads per unstaged source per thread): frags[i][s] is row i of source s."""
        NSRC = cutlass.const_expr(len(tiles))
        frags = []
        for i in cutlass.range_constexpr(k.PK_ROWS):
            row = []
            for s in cutlass.range_constexpr(NSRC):
                if cutlass.const_expr(i > 0 and once[s]):
                    row.append(frags[0][s])
                else:
                    row.append(cute.make_rmem_tensor_like(tiles[s][(0, None)]))
                    row[s].fill(0)
            frags.append(row)
            if cutlass.const_expr(not all(staged_src)):
                if t.col_ok and t.rbase + i * k.RSTEP < t.row_end:
                    for s in cutlass.range_constexpr(NSRC):
                        if cutlass.const_expr(not staged_src[s] and (i == 0 or not once[s])):
                            cute.autovec_copy(tiles[s][(i, None)], row[s])
        return frags

    @cute.jit
    def read_staged_row(self, k, t, i: cutlass.Constexpr, hp: cutlass.Constexpr, frag, rplan, once, staged_src):
        """Row i of the staged sources into its fragments ``frag``: pass 0 waits for its copies,
        pass 1 reloads it from shared memory (pass 0's values need not stay live until then)."""
        NSRC = cutlass.const_expr(len(frag))
        DEPTH = cutlass.const_expr(k.DEPTH)
        if cutlass.const_expr(hp == 0):
            cute.arch.cp_async_wait_group(ring_wait(i, DEPTH, k.PK_ROWS))  # row i's copies have landed
        else:
            for s in cutlass.range_constexpr(NSRC):
                if cutlass.const_expr(staged_src[s] and (i == 0 or not once[s])):
                    frag[s].fill(0)
        if cutlass.const_expr(k.UNALIGNED):
            cute.arch.sync_warp()  # the row's chunks were copied by every lane of the warp
        if cutlass.const_expr(k.ZERO_ROWS):
            self.read_unaligned_row(t, frag, rplan, t.warp * k.PK_ROWS + i, i % k.PERIOD, once, staged_src, i)
        elif t.col_ok and t.rbase + i * k.RSTEP < t.row_end:
            if cutlass.const_expr(k.UNALIGNED):
                self.read_unaligned_row(t, frag, rplan, t.warp * k.PK_ROWS + i, i % k.PERIOD, once, staged_src, i)
            else:
                for s in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(staged_src[s] and (i == 0 or not once[s])):
                        cute.autovec_copy(t.smem[f"in{s}"][(i % DEPTH, t.tidx, None)], frag[s])

    def read_unaligned_row(self, t, frag, rplan, srow: int, plan: int, once, staged_src, i: int):
        """Unaligned rows: row ``i`` of each staged source (shared-memory row ``srow``, read plan
        ``plan``), realigned into ``frag`` (unaligned.read_row)."""
        for s in range(len(frag)):
            if staged_src[s] and (i == 0 or not once[s]):
                got = ua.read_row(cute.recast_tensor(t.smem[f"in{s}"][(srow, None)], Uint32), rplan[s][plan])
                fw = cute.recast_tensor(frag[s], Uint32)
                for j in range(PKW):
                    fw[j] = got[j]

    # -- one output half -----------------------------------------------------------------------
    def values(self, k, t, hp: int, frags, stg, once, staged_src, scalars):
        """Each row's values as packed words, their magnitudes, the thread's column maxima (one
        word per two columns) and dbias sums: (words[i][j], absw[i][j], cm[j], dsum[k]). ``stg``:
        stage_loads' record (the staged rows' misalignment; the copies a ring's later rows take).
        A ring's rows whose slots take no later row (ring_parks) leave their words in the slot
        (words[i]: the slot, PackedKernel.unpark) and their magnitudes as one row maximum word.
        NVFP4's Hadamard transform: ``words`` are the colwise copy's (transformed) rows (the rows'
        own stay in shared memory, staged_row), absw one row maximum word per row, and cm the
        transformed rows' column maxima, or in the amax pass cm's last word their maximum."""
        cfg = self.cfg
        dsum = None
        if cutlass.const_expr(cfg.dbias):
            # dbias: a 32-row block is summed in fp32 (this thread's rows in order, then the warps in
            # order) and the blocks in fp64 by dbias_kernel (numerics.dbias_partial_dtype says why)
            dsum = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)  # starts at row 0's values
        if cutlass.const_expr(self.skips_rows_past_end(k)):
            words, absw = self.rows_in_group(k, t, hp, frags, once, staged_src, scalars, dsum)
            return words, absw, self.column_partials(k, absw), dsum
        words = []  # words[i][j]: row i's values j*2, j*2+1 as one packed word
        absw = []  # their magnitudes
        cm = None
        rplan = None
        if cutlass.const_expr(k.UNALIGNED and any(staged_src)):
            rplan = [ua.read_plans(stg.mis[s], t.lane) if staged_src[s] else None for s in range(len(staged_src))]
        depth = k.DEPTH
        for i in range(k.PK_ROWS):
            if cutlass.const_expr(any(staged_src)):
                self.read_staged_row(k, t, i, hp, frags[i], rplan, once, staged_src)
                if cutlass.const_expr(ring_next(i, depth, k.PK_ROWS) is not None):  # (row i's slot takes the next)
                    self.stage_row(k, t, ring_next(i, depth, k.PK_ROWS), stg.g2s, stg.tiles, once, staged_src)
            row_words, row_abs = self.row_values(k, t, i, frags[i], scalars, dsum)
            if cutlass.const_expr(cfg.col_reduce):
                if cutlass.const_expr(i == 0):
                    cm = list(row_abs)  # this thread's column maxima, one word per two columns
                else:
                    cm = [dev.pk_max(cm[j], row_abs[j], k.is_bf16, codec.column_max_nan(cfg)) for j in range(PKW)]
            if cutlass.const_expr(cfg.amax and not codec.amax_by_owners(cfg)):
                am = self.fold_amax(am if i > 0 else None, row_abs, k.is_bf16)
            if cutlass.const_expr(ring_parks(i, depth, k.PK_ROWS)):
                # the row's reductions first, so that its words leave registers here
                row_abs = [self.row_partial(row_abs, k.is_bf16, codec.block_amax_nan(cfg.fmt))]
                row_words = self.park(t, i % depth, row_words, once, staged_src)
            elif cutlass.const_expr(cfg.tr_stage == "park"):
                # a plain cast's row is its staged words: left in the slot, read again where it is
                # encoded (unpark); its reductions first, as above
                row_abs = [self.row_partial(row_abs, k.is_bf16, codec.block_amax_nan(cfg.fmt))]
                row_words = self.slot_words(t, i % depth, once, staged_src)
            words.append(row_words)
            absw.append(row_abs)
        if cutlass.const_expr(cfg.amax and not codec.amax_by_owners(cfg)):
            cm.append(am)  # (a last word: the NaN-propagating maximum of all the thread's values)
        if cutlass.const_expr(cfg.fmt.hadamard):  # (NVFP4's transform of the colwise copy: hadamard_columns)
            assert not k.RING and not k.UNALIGNED and k.PASSES == 1 and k.PK_ROWS == 8
            absw = [[self.row_partial(a, k.is_bf16, codec.block_amax_nan(cfg.fmt))] for a in absw]  # (registers)
            words, hcm = self.hadamard_columns(k, t, words)  # (the rows' own words: staged_row)
            # the colwise scales' column maxima: the transformed copy's; the amax pass's last word: its amax
            cm = hcm if cfg.colwise else cm + [self.row_partial(hcm, k.is_bf16, False)]
        return words, absw, cm, dsum

    def skips_rows_past_end(self, k) -> bool:
        """A grouped tile's warps with no rows skip their row pass (rows_in_group): the gated
        backwards with the colwise copy in MXFP8 and FP8 block scaling (two-halves ops, issue-bound
        where the forward and plain casts are not) on aligned rows, whose rows are each
        row_values' alone (no ring, no parked rows). Their registers stay about as they were
        (sm_90, bf16: 63-64; fp16 79 -> 64; FP8 block scaling 102 -> 104, its 128x128 tiles
        92 -> 102, one 512-thread CTA per SM either way); the branch took the other
        grouped ops' up by 8-32 (gelu + both 72 -> 80, dgelu + dbias + both 62 -> 79, MXFP4 drelu
        + dbias 72 -> 96, the rowwise-only SwiGLU backward 96 -> 114, MXFP4's 102 -> 128)."""
        cfg = self.cfg
        return (k.GROUPED and cfg.halves and cfg.colwise and cfg.computed and not cfg.fmt.packed
                and not k.UNALIGNED and not k.RING and cfg.tr_stage != "park")

    @cute.jit
    def rows_in_group(self, k, t, hp: cutlass.Constexpr, frags, once, staged_src, scalars, dsum):
        """values' row pass of a grouped tile, (words, absw): a warp whose rows all lie past its
        group's end (a tile past the group's last rows, or with none: the grid's M / R + G tiles,
        grouped.py) runs none of it. A grouped op with arithmetic is issue-bound and a masked row
        costs what a full one does; the test is warp-uniform (a warp's lanes share their rows), and
        one branch around the pass (not one a row) keeps the registers row_values has. The skipped
        rows' words and magnitudes are 0 and their dbias sums +0, as row_values' masking gives them
        (their words are never stored), so the bytes are the same."""
        words = [[Uint32(0)] * PKW for _ in range(k.PK_ROWS)]
        absw = [[Uint32(0)] * PKW for _ in range(k.PK_ROWS)]
        if t.rbase < t.row_end:
            got_words, got_abs = [], []
            for i in cutlass.range_constexpr(k.PK_ROWS):
                if cutlass.const_expr(any(staged_src)):
                    self.read_staged_row(k, t, i, hp, frags[i], None, once, staged_src)
                row_words, row_abs = self.row_values(k, t, i, frags[i], scalars, dsum)
                got_words.append(row_words)
                got_abs.append(row_abs)
            words, absw = got_words, got_abs
        else:
            if cutlass.const_expr(any(staged_src) and hp == 0):
                cute.arch.cp_async_wait_group(0)  # (the rows' zero-filled copies land before the memory is reused)
            if cutlass.const_expr(self.cfg.dbias):
                for c in cutlass.range_constexpr(VEC):
                    dsum[c] = Float32(0.0)
        return words, absw

    def column_partials(self, k, absw):
        """values' column maxima of rows ``absw`` (one word per two columns), with amax's last word
        where the thread folds it (codec.amax_by_owners), or None where the CTA reduces no columns."""
        cfg = self.cfg
        if cutlass.const_expr(not cfg.col_reduce):
            return None
        nan = codec.column_max_nan(cfg)
        cm = list(absw[0])
        for i in range(1, len(absw)):
            cm = [dev.pk_max(cm[j], absw[i][j], k.is_bf16, nan) for j in range(PKW)]
        if cutlass.const_expr(cfg.amax and not codec.amax_by_owners(cfg)):
            am = None
            for i in range(len(absw)):
                am = self.fold_amax(am, absw[i], k.is_bf16)
            cm.append(am)
        return cm

    @staticmethod
    def row_partial(row_abs, is_bf16: bool, nan: bool):
        """A row's maximum word of its magnitudes ``row_abs`` (itself where already one word)."""
        if len(row_abs) == 1:
            return row_abs[0]
        a = row_abs
        return dev.pk_max(dev.pk_max(a[0], a[1], is_bf16, nan), dev.pk_max(a[2], a[3], is_bf16, nan), is_bf16, nan)

    @staticmethod
    def park(t, slot: int, row_words, once, staged_src):
        """A ring's row read from a slot that takes no later row: its words stored there (the first
        full staged source's slot ``slot``), in registers again only where the stores begin
        (unpark). Returns the slot, as words."""
        s = next(s for s in range(len(staged_src)) if staged_src[s] and not once[s])
        at = cute.recast_tensor(t.smem[f"in{s}"][(slot, t.tidx, None)], Uint32)
        fr = cute.make_rmem_tensor(cute.make_layout(PKW), Uint32)
        for j in range(PKW):
            fr[j] = row_words[j]
        cute.autovec_copy(fr, at)
        return at

    @staticmethod
    def slot_words(t, slot: int, once, staged_src):
        """The words of staged slot ``slot`` (the first full staged source's), unread: a plain
        cast's row, whose words are its staged input (tr_stage "park"; unpark reads them)."""
        s = next(s for s in range(len(staged_src)) if staged_src[s] and not once[s])
        return cute.recast_tensor(t.smem[f"in{s}"][(slot, t.tidx, None)], Uint32)

    @staticmethod
    def unpark(row_words):
        """A row's words: ``row_words`` itself, or where park left them in shared memory, loaded."""
        if isinstance(row_words, list):
            return row_words
        fr = cute.make_rmem_tensor(cute.make_layout(PKW), Uint32)
        cute.autovec_copy(row_words, fr)
        return [fr[j] for j in range(PKW)]

    @staticmethod
    def fold_amax(am, row_abs, is_bf16: bool):
        """The NaN-propagating maximum word of the magnitudes ``row_abs`` and ``am`` (None: none yet)."""
        for w in row_abs:
            am = w if am is None else dev.pk_max(am, w, is_bf16)
        return am

    @cute.jit
    def row_values(self, k, t, i: cutlass.Constexpr, frag, scalars, dsum):
        """Row i's values (the op, rounded to the input format) as packed words, and their
        magnitudes: 0 in columns past N (unaligned) and, with ROW_MASK, in rows past M. Adds the
        row to the dbias sums."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.computed):
            if cutlass.const_expr(not cfg.identity):
                row_ok = t.col_ok and t.rbase + i * k.RSTEP < t.row_end
                if cutlass.const_expr(k.ROW_MASK):
                    abs_keep = Uint32(cutlass.select_(row_ok, Uint32(dev.ABS_BITS), Uint32(0)))
            vv = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
            for c in cutlass.range_constexpr(VEC):
                v = self.op.value(frag, c, scalars, dev.widen)
                if cutlass.const_expr(not cfg.identity and not k.ROW_MASK):
                    # a user epilogue may map padding to nonzero (unaligned: columns past N are
                    # masked with the magnitudes below; their sums are never stored)
                    v = Float32(cutlass.select_(row_ok, v, Float32(0.0)))
                # (built-in act/dact keep the zero padding of rows past M at zero: act(0) == 0 and
                # 0 * dact(0) == 0, see tests/test_codegen.py::test_builtin_acts_keep_zero_padding)
                if cutlass.const_expr(cfg.dbias):
                    # (row 0 starts the sum: 0 + v would turn -0 into +0, as the second pass does anyway)
                    if cutlass.const_expr(i == 0):
                        dsum[c] = v
                    else:
                        dsum[c] = dsum[c] + v
                vv[c] = v
            # NUMERICS step 5: round to the input format, two values per instruction
            row_words = [dev.pk_round(vv[2 * j], vv[2 * j + 1], k.is_bf16) for j in range(PKW)]
        else:
            fw = cute.recast_tensor(frag[0], Uint32)
            row_words = [fw[j] for j in range(PKW)]
            if cutlass.const_expr(cfg.dbias):
                # a plain cast with dbias: v is the input itself (rows past M were loaded as zeros)
                for c in cutlass.range_constexpr(VEC):
                    if cutlass.const_expr(i == 0):
                        dsum[c] = dev.widen(frag[0], c)
                    else:
                        dsum[c] = dsum[c] + dev.widen(frag[0], c)
        if cutlass.const_expr(k.ROW_MASK):
            row_abs = [row_words[j] & (t.abs_masks[j] & abs_keep) for j in range(PKW)]
        else:
            row_abs = [row_words[j] & t.abs_masks[j] for j in range(PKW)]
        return row_words, row_abs

    # -- scales --------------------------------------------------------------------------------
    def row_scale_phase(self):
        """The row-scale phase of the config's format: row_scales for 1x32 and 1x16 blocks (4, 2 lanes),
        row_block_scales for wider ones (FP8 block scaling's 1x128: 16 lanes); none for 128x128
        and NVFP4's 16x16 tiles (their scales come after the column maxima: block_multipliers)."""
        if self.cfg.tiles or self.cfg.fp4_tiles:
            return self.no_row_scales
        return self.row_scales if self.cfg.fmt.block[1] <= 32 else self.row_block_scales

    def no_row_scales(self, k, t, io, absw):
        """128x128 and 16x16 tiles: no per-row scales (block_multipliers gives the rows theirs)."""
        return None

    @cute.jit
    def row_scales(self, k, t, io, absw):
        """The rows' scales, stored, and the multiplier of each of the thread's rows. A row's
        block is the LANES = 4 (1x32) or 2 (NVFP4's 1x16) adjacent lanes q = lane % LANES. Their
        partial maxima are reduce-scattered (one butterfly stage per halving, offsets LANES / 2
        down to 1), so that lane q finishes rows q * PK_ROWS / LANES .. and computes their
        scales alone, then every lane fetches the PK_ROWS multipliers it needs: PK_ROWS shuffles
        instead of PK_ROWS scale computations. NaN-dropping maxima where the format says
        (codec.block_amax_nan); NVFP4 reads its per-tensor scale first (codec.global_scales)."""
        cfg = self.cfg
        is_bf16 = cutlass.const_expr(k.is_bf16)
        NAN = cutlass.const_expr(codec.block_amax_nan(cfg.fmt))
        LANES = cutlass.const_expr(codec.block_lanes(cfg.fmt, VEC))
        SHARE = cutlass.const_expr(k.PK_ROWS // LANES)  # rows each lane finishes
        B = cutlass.const_expr(cfg.fmt.block[1])
        lane = t.lane
        glob = codec.global_scales(cfg.fmt, io.amax, glob=io.glob)
        rp = [self.row_partial(a, is_bf16, NAN) for a in absw]
        for st in cutlass.range_constexpr(LANES.bit_length() - 2):  # offsets LANES / 2, ..., 2
            bfly = LANES >> (st + 1)
            h = len(rp) // 2
            rp = [dev.pk_max_shuffled(rp[m], rp[h + m], bfly, (lane & bfly) != 0, is_bf16, NAN) for m in range(h)]
        hi1 = (lane & 1) != 0
        qrow = (lane % LANES) * SHARE  # first row this lane finishes
        grp_ok = t.c0 - (lane % LANES) * VEC < io.N  # the block's first lane has valid columns
        si = []  # multipliers of the rows this lane finished
        for m in cutlass.range_constexpr(SHARE):
            rq = dev.pk_max_shuffled(rp[m], rp[SHARE + m], 1, hi1, is_bf16, NAN)  # (the last stage, offset 1)
            er = codec.block_scale(cfg.fmt, dev.pk_amax(rq, is_bf16, NAN), k.use_hw_e8m0, glob=glob)
            si.append(codec.multiplier(cfg.fmt, er, glob))
            if cutlass.const_expr(k.WIDE):
                t.smem["rs"][t.rbase - t.rb * k.TILE_ROWS + qrow + m, t.g // LANES - t.cb * k.RS_BLOCKS] = Uint8(er)
            else:
                srow_i = t.rbase + qrow + m  # the thread's row qrow + m (two forms, so the aligned
                if cutlass.const_expr(k.RSTEP > 1):  # kernel keeps its own simpler index)
                    srow_i = t.rbase + (qrow + m) * k.RSTEP
                if grp_ok and srow_i < t.Ms:
                    if cutlass.const_expr(k.GROUPED):
                        off = codec.group_row_scale_offset(cfg.fmt, t.gt, srow_i, (t.co + t.c0) // B, t.nbr)
                    elif cutlass.const_expr(cfg.fmt.swizzled):
                        off = dev.swizzle_offset(srow_i, (t.co + t.c0) // B, t.nbr)
                    else:
                        off = srow_i * t.nbr + (t.co + t.c0) // B
                    codec.store_row_scale(cfg, io.row_scale, off, er)
        if cutlass.const_expr(k.WIDE):
            cute.arch.sync_threads()
            self.store_gathered_row_scales(k, t, io.row_scale)
        gl = lane - lane % LANES
        return [cute.arch.shuffle_sync(si[i % SHARE], gl + i // SHARE) for i in range(k.PK_ROWS)]

    @cute.jit
    def row_block_scales(self, k, t, io, absw):
        """row_scales for rowwise blocks wider than 32 columns (FP8 block scaling's 1x128): a row's
        block is LANES = 16 adjacent lanes (half a warp). Their partial maxima are reduce-scattered
        over the PK_ROWS rows (one butterfly stage per halving, from offset LANES / 2 down), then
        all-reduced over the lanes that finished the same row (the remaining stages), so that
        lanes SPAN apart finish rows (lane % LANES) // SPAN; the first of them stores the row's
        scale (scales are stored directly, the wide tile's gather being for bytes), and every lane
        fetches the PK_ROWS multipliers it needs. NaN-dropping maxima
        (codec.block_amax_nan)."""
        cfg = self.cfg
        is_bf16 = cutlass.const_expr(k.is_bf16)
        NAN = cutlass.const_expr(codec.block_amax_nan(cfg.fmt))
        LANES = cutlass.const_expr(codec.block_lanes(cfg.fmt, VEC))
        SPAN = cutlass.const_expr(LANES // k.PK_ROWS)  # lanes that finish the same row
        lane = t.lane
        rp = [self.row_partial(a, is_bf16, NAN) for a in absw]
        for st in cutlass.range_constexpr(k.PK_ROWS.bit_length() - 1):  # reduce-scatter: offsets LANES / 2, ...
            off = LANES >> (st + 1)
            h = len(rp) // 2
            rp = [dev.pk_max_shuffled(rp[m], rp[h + m], off, (lane & off) != 0, is_bf16, NAN) for m in range(h)]
        w = rp[0]
        for st in cutlass.range_constexpr(SPAN.bit_length() - 1):  # all-reduce: offsets SPAN / 2, ..., 1
            w = dev.pk_max_bfly(w, SPAN >> (st + 1), is_bf16, NAN)
        e = codec.block_scale(cfg.fmt, dev.pk_amax(w, is_bf16, NAN), k.use_hw_e8m0, k.IN_MAX)
        srow = t.rbase + ((lane % LANES) // SPAN) * k.RSTEP  # the row this lane finished
        grp_ok = t.c0 - (lane % LANES) * VEC < io.N  # the block's first lane has valid columns
        if lane % SPAN == 0 and grp_ok and srow < t.Ms:
            soff = codec.row_scale_offset(cfg.fmt, srow, (t.co + t.c0) // cfg.fmt.block[1], t.nbr, io.M)
            codec.store_row_scale(cfg, io.row_scale, soff, e)
        si = codec.multiplier(cfg.fmt, e)
        gl = lane - lane % LANES
        return [cute.arch.shuffle_sync(si, gl + i * SPAN) for i in range(k.PK_ROWS)]

    @cute.jit
    def store_gathered_row_scales(self, k, t, row_scale):
        """The wide tile's row-scale bytes, gathered in shared memory, leave as words of 4 blocks,
        whole rows of the tile per request. Words need nbr % 4 == 0 and a 4-byte aligned scale
        tensor (CTA-uniform); otherwise the same bytes are stored one by one."""
        cfg = self.cfg
        sRS = t.smem["rs"]
        RS_BLOCKS = cutlass.const_expr(k.RS_BLOCKS)
        TILE_ROWS = cutlass.const_expr(k.TILE_ROWS)
        tidx, rb, cb, nbr = t.tidx, t.rb, t.cb, t.nbr
        rs_base = row_scale.iterator.toint()
        if nbr % 4 == 0 and rs_base % 4 == 0:
            if tidx < TILE_ROWS * RS_BLOCKS // 4:
                wr = tidx // (RS_BLOCKS // 4)
                wb = cb * RS_BLOCKS + (tidx % (RS_BLOCKS // 4)) * 4  # the word's first block
                if rb * TILE_ROWS + wr < t.Ms and wb < nbr:
                    word = cute.recast_tensor(sRS, Uint32)[wr, tidx % (RS_BLOCKS // 4)]
                    # (swizzled: blocks 4k..4k+3 of a row are adjacent)
                    woff = codec.row_scale_offset(cfg.fmt, rb * TILE_ROWS + wr, wb, nbr)
                    cute.arch.inline_ptx("st.global.b32 [{$r0}], {$r1};", read_only_args=[rs_base + Int64(woff), word])
        else:
            for r in cutlass.range_constexpr((TILE_ROWS * RS_BLOCKS + k.NTHREADS - 1) // k.NTHREADS):
                p = tidx + r * k.NTHREADS
                br = p // RS_BLOCKS
                bb = cb * RS_BLOCKS + p % RS_BLOCKS
                if br < TILE_ROWS and rb * TILE_ROWS + br < t.Ms and bb < nbr:
                    codec.store_row_scale(cfg, row_scale, codec.row_scale_offset(cfg.fmt, rb * TILE_ROWS + br, bb, nbr),
                                          sRS[br, p % RS_BLOCKS])

    @cute.jit
    def column_owners(self, k, t, io, cm, dsum):
        """The warps' partial column maxima (and dbias sums) meet in shared memory (indexed by
        position j * 32 + lane, word or column j of lane, so that a warp's stores and the owners'
        loads touch consecutive words: no bank conflicts). Column owners: each of the CTA's
        32 * PKW words of column maxima (two columns) is reduced over the warps, turned into two
        scales and stored once per CTA, by one thread, instead of by every warp for its own
        lane's columns; likewise each column's dbias sum."""
        cfg = self.cfg
        if cutlass.const_expr(cm is not None):
            self.publish_columns(k, t, io, cm, dsum)
        cute.arch.sync_threads()
        Ns = Int32(cutlass.select_(t.Ms > 0, io.N, Int32(0)))  # column bound of the owners' stores
        if cutlass.const_expr(k.GROUPED and not cfg.fmt.swizzled):
            # compact grouped: a tile with no rows writes its scale row's zeros (grouped.py)
            Ns = Int32(cutlass.select_(t.in_grid and io.noop[0] != Float32(1.0), io.N, Int32(0)))
        if cutlass.const_expr(not (cfg.fp4_tiles and not cfg.amax)):  # (16x16 tiles: fp4_tile_scales)
            if t.tidx < 32 * PKW:  # warp-uniform (always true below 8 warps)
                self.column_scales_owned(k, t, io, Ns)
        if cutlass.const_expr(cfg.dbias):
            # dbias: each thread sums its column(s) over the warps in a fixed order (deterministic)
            for r in cutlass.range_constexpr(max(1, 32 * VEC // k.NTHREADS)):
                p = t.tidx + r * k.NTHREADS  # position c * 32 + lane
                if cutlass.const_expr(k.NTHREADS > 32 * VEC):  # (a 128-row tile: threads past the columns
                    p = cutlass.min(p, Int32(32 * VEC - 1))  # read the last one's and store nothing)
                s = t.smem["sum"][0, p]
                for w in cutlass.range_constexpr(1, k.WARPS):
                    s = s + t.smem["sum"][w, p]
                oc = t.cb * VCOLS + (p % 32) * VEC + p // 32
                if cutlass.const_expr(k.NTHREADS > 32 * VEC):
                    oc = Int32(cutlass.select_(t.tidx < 32 * VEC, oc, Ns))
                if oc < Ns:
                    io.dbias_ws[t.rb, t.co + oc] = s

    @cute.jit
    def publish_columns(self, k, t, io, cm, dsum):
        """The thread's column maxima and dbias sums into shared memory for the column owners
        (and its amax word's atomic, thread_amax; NVFP4's transformed copy's, hadamard_amax);
        NVFP4's 16x16 tiles (quantize pass): the maximum word of the thread's 8 x 8 values alone,
        at [warp, lane] (fp4_tile_scales)."""
        if cutlass.const_expr(self.cfg.fp4_tiles and not self.cfg.amax):
            t.smem["max"][t.warp, t.lane] = self.row_partial(cm, k.is_bf16, False)
        else:
            for j in cutlass.range_constexpr(PKW):
                t.smem["max"][t.warp, j * 32 + t.lane] = cm[j]
        if cutlass.const_expr(self.cfg.dbias):
            for c in cutlass.range_constexpr(VEC):
                t.smem["sum"][t.warp, c * 32 + t.lane] = dsum[c]
        if cutlass.const_expr(self.cfg.amax and not codec.amax_by_owners(self.cfg)):
            self.thread_amax(t, io, cm[PKW], k.is_bf16)
        if cutlass.const_expr(self.cfg.fmt.hadamard and not self.cfg.colwise):  # (NVFP4's amax pass)
            self.hadamard_amax(t, io, cm[PKW])

    @cute.jit
    def thread_amax(self, t, io, am, is_bf16: cutlass.Constexpr):
        """The tensor amax where the column maxima drop NaN (codec.amax_by_owners): each warp's
        NaN-propagating maximum of its threads' words ``am``, one atomic per warp."""
        tm = dev.warp_max(dev.pk_amax(am, is_bf16))
        if t.lane == 0 and t.Ms > 0:
            dev.amax_atomic(io.amax, tm)

    @cute.jit
    def column_scales_owned(self, k, t, io, Ns):
        """An owner's words of column maxima: the amax, and each column's scale (stored, and its
        inverse left in shared memory for every lane's stores)."""
        cfg = self.cfg
        is_bf16 = cutlass.const_expr(k.is_bf16)
        sMax = t.smem["max"]
        OWN_AMAX = cutlass.const_expr(cfg.amax and codec.amax_by_owners(cfg))
        if cutlass.const_expr(OWN_AMAX):
            tm = Float32(0.0)
        for r in cutlass.range_constexpr(max(1, 32 * PKW // k.NTHREADS)):
            p = t.tidx + r * k.NTHREADS  # position j * 32 + lane of the word
            cw = sMax[0, p]
            for w in cutlass.range_constexpr(1, k.WARPS):
                cw = dev.pk_max(cw, sMax[w, p], is_bf16, codec.column_max_nan(cfg))
            if cutlass.const_expr(OWN_AMAX):  # (NVFP4's amax drops NaN: codec.amax_nan)
                tm = cute.arch.fmax(tm, dev.pk_amax(cw, is_bf16, codec.amax_nan(cfg.fmt)), nan=codec.amax_nan(cfg.fmt))
            if cutlass.const_expr(cfg.tiles):
                self.tile_partial(t, dev.pk_amax(cw, is_bf16, False))
            elif cutlass.const_expr(cfg.colwise and not cfg.fmt.packed):  # (FP4: fp4_column_scales)
                self.column_pair_scales(k, t, io, Ns, p, cw)
        if cutlass.const_expr(OWN_AMAX):
            tm = dev.warp_max(tm)
            if t.lane == 0 and t.Ms > 0:
                dev.amax_atomic(io.amax, tm)  # one atomic per owner warp

    @cute.jit
    def column_pair_scales(self, k, t, io, Ns, p, cw):
        """The two columns of word position p (maxima ``cw``): scales stored, inverses to sInv."""
        cfg = self.cfg
        sInv = t.smem["inv"]
        M, rb, co, gt = io.M, t.rb, t.co, t.gt
        cl, ch = dev.pk_unpack(cw, k.is_bf16)
        if cutlass.const_expr(not codec.column_max_nan(cfg)):  # (a column of NaN alone: amax 0)
            cl, ch = cute.arch.fmax(cl, Float32(0.0)), cute.arch.fmax(ch, Float32(0.0))
        e_lo = codec.block_scale(cfg.fmt, cl, k.use_hw_e8m0, k.IN_MAX)
        e_hi = codec.block_scale(cfg.fmt, ch, k.use_hw_e8m0, k.IN_MAX)
        empty = None  # (a grouped tile with no rows: FP8 block scaling's fp32 scales store 0.0 for it)
        if cutlass.const_expr(k.GROUPED and cfg.fmt.scale == "fp32"):
            empty = t.Ms == 0
        elif cutlass.const_expr(k.GROUPED):
            e_lo = Int32(cutlass.select_(t.Ms > 0, e_lo, Int32(0)))
            e_hi = Int32(cutlass.select_(t.Ms > 0, e_hi, Int32(0)))
        pj = p // 32
        sInv[2 * pj * 32 + p % 32] = codec.multiplier(cfg.fmt, e_lo)  # column k = 2j, 2j + 1 of lane p % 32
        sInv[(2 * pj + 1) * 32 + p % 32] = codec.multiplier(cfg.fmt, e_hi)
        oc = t.cb * VCOLS + (p % 32) * VEC + 2 * pj  # its first column
        if oc < Ns:  # aligned: N % VEC == 0, both columns are in or out
            codec.put_col_scale(cfg.fmt, io.col_scale, gt, co + oc, rb, M, t.NOUT, e_lo, empty)
            if cutlass.const_expr(k.UNALIGNED):
                if oc + 1 < Ns:
                    codec.put_col_scale(cfg.fmt, io.col_scale, gt, co + oc + 1, rb, M, t.NOUT, e_hi, empty)
            else:
                codec.put_col_scale(cfg.fmt, io.col_scale, gt, co + oc + 1, rb, M, t.NOUT, e_hi, empty)

    # -- 128x128 tiles (FP8 block scaling's block=(128, 128), KernelConfig.tiles) ------------------
    @cute.jit
    def tile_partial(self, t, cmax):
        """An owner warp's column maxima (``cmax``: its word's two columns, NaN dropped) reduced over
        each half-warp (lanes 16h .. 16h + 15 own the CTA's tile h: columns 128h .. 128h + 127) to
        "inv"[warp * 2 + h] (tiles have no column scales to leave there)."""
        for off in cutlass.range_constexpr(4):
            cmax = cute.arch.fmax(cmax, cute.arch.shuffle_sync_bfly(cmax, offset=8 >> off))
        # (names bound outside the dynamic ``if``: a store through ``t`` inside it makes the DSL
        # carry ``t`` out of the branch, and the caller's later reads of t.tidx then fail to verify)
        sInv, slot = t.smem["inv"], t.warp * 2 + t.lane // 16
        if t.lane % 16 == 0:
            sInv[slot] = cmax

    def block_multipliers(self, k, t, io, sr):
        """(row multipliers, column multipliers) of the stores: the row-scale phase's ``sr`` and
        the colwise scales the owners left (column_scales); 128x128 tiles: the tile scale of the
        thread's columns (tile_scales) for both."""
        if self.cfg.tiles:
            e = self.tile_scales(k, t, io)
            m = codec.multiplier(self.cfg.fmt, e)
            return ([m] * k.PK_ROWS if self.cfg.rowwise else None), ([m] * VEC if self.cfg.colwise else None)
        if self.cfg.fp4_tiles:
            m = self.fp4_tile_scales(k, t, io)
            return ([m] * k.PK_ROWS if self.cfg.rowwise else None), ([m] * VEC if self.cfg.colwise else None)
        if self.cfg.colwise and self.cfg.fmt.packed:
            return sr, self.fp4_column_scales(k, t, io)
        return sr, (self.column_scales(t) if self.cfg.colwise else None)

    @cute.jit
    def fp4_column_scales(self, k, t, io):
        """FP4's colwise copy (the transposed values, blocks along M: NVFP4's 16 rows, MXFP4's 32):
        the scales of the thread's 8 columns over the rows of its block, from the column maxima
        the warps holding them left in sMax (B // PK_ROWS warps, fp4_scale_warps: two of a 32-row
        tile for NVFP4, all four for MXFP4; NVFP4 drops NaN, MXFP4 propagates it: scale 255,
        codec.block_amax_nan), stored by the block's first warp (compact [N, ceil(M/B)] or its
        swizzled atoms), and the 8 multipliers. NVFP4's two warps of a block each compute half
        of them (fp4_split_column_scales)."""
        cfg = self.cfg
        is_bf16 = cutlass.const_expr(k.is_bf16)
        NAN = cutlass.const_expr(codec.block_amax_nan(cfg.fmt))
        B = cutlass.const_expr(cfg.fmt.col_block[0])  # rows of a block (16, 32)
        glob = codec.global_scales(cfg.fmt, io.amax, colwise=True, glob=io.glob)
        w0, WPB = fp4_scale_warps(t.warp, k.PK_ROWS, B)
        if cutlass.const_expr(k.GROUPED):
            # [N, M // B + G]: the group's blocks from column start // B + g (fp4_layouts), this
            # tile's b-th of the group's row tiles; brow the block's first row
            nbm = io.M // B + t.gt.G
            blk = fp4_group_block(t.gt.start, t.gt.g, t.gt.b, k.TILE_ROWS, w0, k.PK_ROWS, B)
            brow = t.gt.row0 + w0 * k.PK_ROWS
        else:
            nbm = (io.M + B - 1) // B
            blk = (t.rb * k.TILE_ROWS + w0 * k.PK_ROWS) // B
            brow = blk * B
        c0 = t.co + (t.cb * 32 + t.lane) * VEC
        col_end = t.co + io.N if cutlass.const_expr(cfg.halves) else io.N  # (this half's columns end at co + N)
        sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        HOIST = cutlass.const_expr(not (cfg.halves and k.UNALIGNED))  # c0 % VEC == 0 (else co % VEC is unknown)
        if cutlass.const_expr(HOIST):
            off0, step = fp4_column_scale_run(cfg.fmt.swizzled, c0, blk, nbm)
        if cutlass.const_expr(fp4_split_column_scales(cfg, WPB, PKW)):
            self.fp4_split_column_scales(k, t, io, sc, glob, w0, brow, c0, off0, step)
            return sc
        for j in cutlass.range_constexpr(PKW):
            cw = t.smem["max"][w0, j * 32 + t.lane]
            for w in cutlass.range_constexpr(1, WPB):
                cw = dev.pk_max(cw, t.smem["max"][w0 + w, j * 32 + t.lane], is_bf16, NAN)
            lo, hi = dev.pk_unpack(cw, is_bf16)
            if cutlass.const_expr(cfg.fmt.global_scale):  # NVFP4: the two columns' scales at once
                assert not NAN  # (NVFP4's maxima drop NaN: a column of NaN alone has amax 0)
                ew, sc[2 * j], sc[2 * j + 1] = dev.nvfp4_scales2(cute.arch.fmax(lo, Float32(0.0)),
                                                                 cute.arch.fmax(hi, Float32(0.0)), glob[0], glob[1])
            for h in cutlass.range_constexpr(2):
                if cutlass.const_expr(cfg.fmt.global_scale):
                    e = ew if h == 0 else ew >> Uint32(8)  # (a byte store keeps the low byte)
                else:
                    a = lo if h == 0 else hi
                    if cutlass.const_expr(not NAN):  # (NVFP4: a column of NaN alone has amax 0)
                        a = cute.arch.fmax(a, Float32(0.0))
                    e = codec.block_scale(cfg.fmt, a, k.use_hw_e8m0, glob=glob)
                    sc[2 * j + h] = codec.multiplier(cfg.fmt, e, glob)
                c = c0 + 2 * j + h
                if t.warp == w0 and c < col_end and brow < t.Ms:
                    if cutlass.const_expr(HOIST):
                        io.col_scale[off0 + (2 * j + h) * step] = Uint8(e)
                    else:
                        io.col_scale[dev.scale_offset(cfg.fmt.swizzled, c, blk, nbm)] = Uint8(e)
        return sc

    @cute.jit
    def fp4_split_column_scales(self, k, t, io, sc, glob, w0, brow, c0, off0, step):
        """NVFP4's colwise scales shared by the block's two warps (fp4_split_column_scales): warp
        w0 + s computes and stores the scales of the thread's column pairs j = 2s, 2s + 1 (words j
        of the maxima) and leaves each pair's two multipliers where it read the pair's maxima,
        sMax[w0 + h, j * 32 + lane] (read by this thread alone); after a barrier every thread reads
        its 8 multipliers back."""
        sMax = t.smem["max"]
        is_bf16 = cutlass.const_expr(k.is_bf16)
        half = t.warp - w0
        for jj in cutlass.range_constexpr(2):
            j = 2 * half + jj
            cw = dev.pk_max(sMax[w0, j * 32 + t.lane], sMax[w0 + 1, j * 32 + t.lane], is_bf16, False)
            lo, hi = dev.pk_unpack(cw, is_bf16)
            ew, m0, m1 = dev.nvfp4_scales2(cute.arch.fmax(lo, Float32(0.0)), cute.arch.fmax(hi, Float32(0.0)),
                                            glob[0], glob[1])
            sMax[w0, j * 32 + t.lane] = m0.bitcast(Uint32)
            sMax[w0 + 1, j * 32 + t.lane] = m1.bitcast(Uint32)
            if brow < t.Ms:  # (the block's first row)
                for h in cutlass.range_constexpr(2):
                    e = ew if h == 0 else ew >> Uint32(8)  # (a byte store keeps the low byte)
                    if c0 + 2 * j + h < io.N:
                        io.col_scale[off0 + (2 * j + h) * step] = Uint8(e)
        cute.arch.sync_threads()
        for j in cutlass.range_constexpr(PKW):
            for h in cutlass.range_constexpr(2):
                sc[2 * j + h] = sMax[w0 + h, j * 32 + t.lane].bitcast(Float32)

    @cute.jit
    def fp4_tile_scales(self, k, t, io):
        """NVFP4's 16x16 tiles (block_2d): the thread's tile is rows w0 * 8 .. of the CTA (the 16
        // PK_ROWS warps w0 .. of fp4_scale_warps) and columns of lanes 2q, 2q + 1 (lane ^ 1). Its
        amax (NaN dropped, partial tiles the rows below M alone: rows past M are zero) is those
        warps' words at [w, lane] (publish_columns) and the partner lane's, one shuffle; its E4M3
        scale is stored in each of its rows' entries of the rowwise scales (each of the two lanes
        half the thread's rows) and each of its columns' entries of the colwise ones (each of the
        warps VEC // (16 // PK_ROWS) of the thread's columns). Returns the tile's multiplier."""
        cfg = self.cfg
        is_bf16 = cutlass.const_expr(k.is_bf16)
        B = cutlass.const_expr(cfg.fmt.block[0])  # (16)
        glob = codec.global_scales(cfg.fmt, io.amax)
        w0, WPB = fp4_scale_warps(t.warp, k.PK_ROWS, B)
        cw = t.smem["max"][w0, t.lane]
        for w in cutlass.range_constexpr(1, WPB):
            cw = dev.pk_max(cw, t.smem["max"][w0 + w, t.lane], is_bf16, False)
        cw = dev.pk_max_bfly(cw, 1, is_bf16, False)  # (the tile's other 8 columns: lane ^ 1)
        e = codec.block_scale(cfg.fmt, dev.pk_amax(cw, is_bf16, False), k.use_hw_e8m0, glob=glob)
        c0 = t.co + (t.cb * 32 + t.lane) * VEC  # the thread's first column
        r0, c1 = fp4_tile_entries(t.warp, t.lane, t.rb, t.cb, k.TILE_ROWS, k.PK_ROWS, B)
        if cutlass.const_expr(cfg.rowwise):
            HALF = cutlass.const_expr(k.PK_ROWS // 2)
            nbr = (t.NOUT + B - 1) // B
            blk = c0 // B
            for i in cutlass.range_constexpr(HALF):
                if c0 < io.N and r0 + i < t.Ms:
                    off = r0 * nbr + i * nbr + blk
                    if cutlass.const_expr(cfg.fmt.swizzled):
                        off = dev.swizzle_offset(r0 + i, blk, nbr)
                    codec.store_row_scale(cfg, io.row_scale, off, e)
        if cutlass.const_expr(cfg.colwise):
            CPW = cutlass.const_expr(VEC // WPB)  # columns whose scales each of the warps stores
            nbm = (io.M + B - 1) // B
            blk = (t.rb * k.TILE_ROWS + w0 * k.PK_ROWS) // B
            col = t.co + c1
            for q in cutlass.range_constexpr(CPW):
                if col + q < io.N and blk * B < t.Ms:
                    off = (col + q) * nbm + blk
                    if cutlass.const_expr(cfg.fmt.swizzled):
                        off = dev.swizzle_offset(col + q, blk, nbm)
                    io.col_scale[off] = Uint8(e)
        return codec.multiplier(cfg.fmt, e, glob)

    @cute.jit
    def tile_scales(self, k, t, io):
        """The scale of the thread's 128x128 tile (h = lane // 16): the owner warps' partial
        maxima (tile_partial) reduced, TransformerEngine's rule; lanes 0 and 16 of warp 0 store
        tile h's 1 / scale in each direction's layout (codec.tile_scale_offset; one value serves
        both copies, as the reference's single tile amax); a two-halves op's half at tile column
        co / 128 of outputs NOUT wide (N % 128 == 0: limits.n_multiple). A grouped tile with no
        rows stores 0.0 (the rows between groups of the grouped buffers, grouped.py)."""
        cfg = self.cfg
        cute.arch.sync_threads()
        h = t.lane // 16
        amax = t.smem["inv"][h]
        for w in cutlass.range_constexpr(1, 32 * PKW // 32):
            amax = cute.arch.fmax(amax, t.smem["inv"][w * 2 + h])
        e = codec.block_scale(cfg.fmt, amax, k.use_hw_e8m0, k.IN_MAX)
        mb, nb = (io.M + 127) // 128, (io.N + 127) // 128
        blk = t.cb * 2 + h
        lim = nb
        if cutlass.const_expr(cfg.halves):  # (this pass's half: tile columns from co / 128 of NOUT / 128)
            blk = t.co // 128 + blk
            lim = t.co // 128 + nb
            nb = (t.NOUT + 127) // 128
        writes = t.Ms > 0
        d = codec.dequantization_scale(e)
        if cutlass.const_expr(k.GROUPED):
            writes = t.in_grid and io.noop[0] != Float32(1.0)
            d = Float32(cutlass.select_(t.Ms > 0, d, Float32(0.0)))
        if t.warp == 0 and t.lane % 16 == 0 and blk < lim and writes:
            if cutlass.const_expr(cfg.rowwise):
                io.row_scale[codec.tile_scale_offset(cfg.fmt, t.rb, blk, mb, nb, False)] = d
            if cutlass.const_expr(cfg.colwise):
                io.col_scale[codec.tile_scale_offset(cfg.fmt, t.rb, blk, mb, nb, True)] = d
        return e

    def column_scales(self, t):
        """The thread's VEC inverse column scales, once the owners have written them."""
        cute.arch.sync_threads()
        sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        for c in range(VEC):
            sc[c] = t.smem["inv"][c * 32 + t.lane]
        return sc

    # -- encode and store ----------------------------------------------------------------------
    def quantize_row(self, row_words, s_row, sc, is_bf16: bool, use_hw: bool = False, rand=None,
                     prescaled: bool = False):
        """One row's FP8 bytes, four per word: (rowwise words, colwise words), each None where the op
        does not write that direction. ``row_words``: its packed values; ``s_row``: its inverse
        row scale; ``sc``: the thread's inverse column scales. FP4 (rowwise only): the row's eight
        E2M1 codes in one word (``use_hw``: sm_100a's conversion; ``rand``: stochastic rounding's
        two random words, device.e2m1x8_sr; ``prescaled``: ``s_row`` already times 2^-14)."""
        cfg = self.cfg
        if cfg.fmt.packed:
            qr = cute.make_rmem_tensor(cute.make_layout((1,), stride=(1,)), Uint32)
            qr[0] = codec.encode8_words(cfg.fmt, [row_words[j] for j in range(PKW)], s_row, is_bf16, use_hw, rand,
                                        prescaled)
            return qr, None
        qr = cute.make_rmem_tensor(cute.make_layout(PKW // 2), Uint32) if cfg.rowwise else None
        qc = cute.make_rmem_tensor(cute.make_layout(PKW // 2), Uint32) if cfg.colwise else None
        for j in range(0, PKW, 2):
            l0, h0 = dev.pk_unpack(row_words[j], is_bf16)
            l1, h1 = dev.pk_unpack(row_words[j + 1], is_bf16)
            if cfg.rowwise:
                qr[j // 2] = codec.encode4(cfg.fmt, dev.mul_rn(l0, s_row), dev.mul_rn(h0, s_row), dev.mul_rn(l1, s_row),
                                           dev.mul_rn(h1, s_row))
            if cfg.colwise:
                qc[j // 2] = codec.encode4(cfg.fmt, dev.mul_rn(l0, sc[2 * j]), dev.mul_rn(h0, sc[2 * j + 1]),
                                           dev.mul_rn(l1, sc[2 * j + 2]), dev.mul_rn(h1, sc[2 * j + 3]))
        return qr, qc

    @cute.jit
    def store_rows(self, k, t, words, sr, sc):
        """Aligned rows: each row's FP8 words as whole vector stores. Stochastic rounding (NVFP4):
        each row's two random words of the thread's 8 columns (words 2g and 2g + 1 of the row,
        direction 0), drawn for two rows at a time by every lane of the warp
        (device.sr_row_words: lanes g and g ^ 1 share their Philox calls); the colwise copy's
        (direction 1) staged in shared memory before the rows (sr_col_stage: warps 2q and 2q + 1
        share their Philox calls) and read back per column after one barrier; the rule's 2^-14
        taken into the multipliers where that is exact (sr_prescaled). NVFP4's Hadamard
        transform: ``words`` are the colwise copy's (transformed) rows, the rows' own are read
        back from "rht" (staged_row)."""
        cfg = self.cfg
        SR = cutlass.const_expr(cfg.fmt.rounding == "sr")
        SR_COL = cutlass.const_expr(SR and cfg.colwise and cfg.fmt.packed)
        if cutlass.const_expr(SR):
            seed, offset = t.rng[0], t.rng[1]
            fold, mr, mc = self.sr_prescaled(k, sr, sc)
        if cutlass.const_expr(SR_COL):  # (before the rows: their stores lie between the words' stores and loads)
            self.sr_col_stage(t, seed, offset)
        if cutlass.const_expr(cfg.fmt.packed and cfg.rowwise):
            nrows = cutlass.select_(t.col_ok, t.Ms - t.rbase, Int32(0))  # (FP4: one compare a row)
            if cutlass.const_expr(SR):
                if fold:
                    self.fp4_rows(k, t, words, mr, nrows, seed, offset, True)
                else:
                    self.fp4_rows(k, t, words, sr, nrows, seed, offset, False)
            else:
                self.fp4_rows(k, t, words, sr, nrows, None, None, False)
        if cutlass.const_expr(not cfg.fmt.packed):
            first, end = t.rbase, t.Ms  # row i is stored where first + i < end
            if cutlass.const_expr(k.RING):  # (one register for every row's bound: i < Ms - rbase)
                first, end = Int32(0), t.Ms - t.rbase
            for i in cutlass.range_constexpr(k.PK_ROWS):
                if t.col_ok and first + i < end:
                    qr, qc = self.quantize_row(self.unpark(words[i]), sr[i] if cfg.rowwise else None, sc,
                                               k.is_bf16, k.use_hw_e8m0)
                    if cutlass.const_expr(cfg.rowwise):
                        cute.autovec_copy(cute.recast_tensor(qr, Uint8), t.tRow[(i, None)])
                    if cutlass.const_expr(cfg.colwise):
                        cute.autovec_copy(cute.recast_tensor(qc, Uint8), t.tCol[(i, None)])
        if cutlass.const_expr(cfg.colwise and cfg.fmt.packed):
            if cutlass.const_expr(SR_COL):
                cute.arch.sync_threads()  # (the partner warp's words are in "srx")
            if t.col_ok and t.rbase < t.Ms:
                if cutlass.const_expr(SR):
                    if fold:
                        self.fp4_columns(k, t, words, mc, True)
                    else:
                        self.fp4_columns(k, t, words, sc, False)
                else:
                    self.fp4_columns(k, t, words, sc, False)
            cute.arch.sync_threads()
            self.store_fp4_columns(k, t)

    @cute.jit
    def fp4_rows(self, k, t, words, sr, nrows, seed, offset, prescaled: cutlass.Constexpr):
        """FP4's rowwise copy: each row's word of codes, encoded whatever the row and stored under
        ``nrows`` alone; stochastic rounding (``seed`` not None): its random words two rows at a
        time (device.sr_row_words), ``prescaled``: ``sr`` already times 2^-14."""
        SR = cutlass.const_expr(seed is not None)
        for i in cutlass.range_constexpr(k.PK_ROWS):
            if cutlass.const_expr(SR and i % 2 == 0):
                assert k.PK_ROWS % 2 == 0
                pair = dev.sr_row_words(t.rbase + i, t.g, t.N // 4, seed, offset)
            rand = None
            if cutlass.const_expr(SR):
                rand = pair[2 * (i % 2):2 * (i % 2) + 2]
            q4, _ = self.quantize_row(self.staged_row(t, i) if self.cfg.fmt.hadamard else words[i], sr[i], None,
                                      k.is_bf16, k.use_hw_e8m0, rand, prescaled)
            if i < nrows:
                cute.autovec_copy(cute.recast_tensor(q4, Uint8), t.tRow[(i, None)])

    @cute.jit
    def fp4_columns(self, k, t, words, sc, prescaled: cutlass.Constexpr):
        """FP4's transposed colwise copy: each column's word of codes into "fp4t"; stochastic
        rounding: its two random words from "srx" (sr_col_words), ``prescaled``: ``sc`` already
        times 2^-14."""
        sF = t.smem["fp4t"]
        for c in cutlass.range_constexpr(VEC):
            rc = None
            if cutlass.const_expr(self.cfg.fmt.rounding == "sr"):
                rc = self.sr_col_words(t, c)
            sF[fp4_column_slot(t.warp, t.lane * VEC + c)] = self.fp4_column_word(k, words, sc, c, rc, prescaled)

    @cute.jit
    def sr_prescaled(self, k, sr, sc):
        """Stochastic rounding's multipliers times 2^-14 (device.e2m1x8_sr's scaling taken into
        them), (fold, rows', columns'): fold where every multiplier of the warp is at least
        2^-112 (a vote), so that each product is exact: a multiplier below that (a global amax
        past about 2^114) would lose bits to fp32's subnormals, and those warps scale each value
        instead. Then fp32(v * m * 2^-14) is fp32(v * m) * 2^-14 wherever that is an fp32
        normal, and both are at most 2^-126 otherwise, where every code is 0 (the sign kept)."""
        cfg = self.cfg
        low = Float32(2.0 ** 30)
        mr = mc = None
        if cutlass.const_expr(cfg.rowwise):
            mr = cute.make_rmem_tensor(cute.make_layout(k.PK_ROWS), Float32)
            for i in cutlass.range_constexpr(k.PK_ROWS):
                mr[i] = dev.mul_rn(sr[i], Float32(dev.SR_SCALE))
                low = cute.arch.fmin(low, sr[i])
        if cutlass.const_expr(cfg.colwise):
            mc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
            for c in cutlass.range_constexpr(VEC):
                mc[c] = dev.mul_rn(sc[c], Float32(dev.SR_SCALE))
                low = cute.arch.fmin(low, sc[c])
        return cute.arch.vote_all_sync(low >= Float32(2.0 ** -112)), mr, mc

    @cute.jit
    def sr_col_stage(self, t, seed, offset):
        """Stochastic rounding's colwise words (direction 1: row c0 + c of the transposed values, M
        / 4 words a row) into "srx" [warp pair, c, half, lane, 2] (half 0: the upper warp's
        rows), read back per column by sr_col_words: the thread of warp parity p draws the four
        words of its columns c = 2q + p from the group's first row rbase - 8 p
        (device.sr_col_group: one Philox where the groups start on a counter,
        device.sr_col_aligned, else two) and leaves both halves. Every thread of the CTA takes
        part (a thread whose rows lie past M draws its partner's words), and both warps of a
        group hold the same columns."""
        if dev.sr_col_aligned(t.M // 4, offset):
            self.sr_col_draw(t, seed, offset, False)
        else:
            self.sr_col_draw(t, seed, offset, True)

    @cute.jit
    def sr_col_draw(self, t, seed, offset, straddle: cutlass.Constexpr):
        """sr_col_stage's words (``straddle``: device.sr_words4's)."""
        sX = t.smem["srx"]
        p = t.warp % 2
        for q in cutlass.range_constexpr(VEC // 2):
            c = 2 * q + p
            w = dev.sr_col_group(t.c0 + c, t.rbase - 8 * p, t.M // 4, seed, offset, straddle=straddle)
            for h in cutlass.range_constexpr(2):
                fr = cute.make_rmem_tensor(cute.make_layout(2), Uint32)
                fr[0], fr[1] = w[2 * h], w[2 * h + 1]
                cute.autovec_copy(fr, sX[(t.warp // 2, c, h, t.lane, None)])

    @staticmethod
    def sr_col_words(t, c: int):
        """Column c's two words of the thread's rows from "srx" (sr_col_stage)."""
        fr = cute.make_rmem_tensor(cute.make_layout(2), Uint32)
        cute.autovec_copy(t.smem["srx"][(t.warp // 2, c, t.warp % 2, t.lane, None)], fr)
        return [fr[0], fr[1]]

    # -- NVFP4's Hadamard transform of the colwise copy (Format.hadamard) ------------------------
    @cute.jit
    def hadamard_columns(self, k, t, words):
        """The transform of the thread's 8 columns (device.rht_half): a 16-row group is the same
        lane's rows in warps w0 = warp & ~1 and w0 + 1. Every thread leaves its rows' words in
        "rht" (per word j, two 4-row halves as 16-byte vectors, lanes adjacent: no bank
        conflicts), and after one barrier reads both warps' words j, flips the upper rows' signs
        where it is the upper warp (x1f), and computes its own rows' outputs. Returns (the
        transformed words, hw[i][j] as ``words``; their column maxima, NaN dropped, 0 where the
        thread's rows or columns lie outside the tensor: M % 16 == 0, so a group is wholly in or
        out)."""
        sH = t.smem["rht"]
        for j in cutlass.range_constexpr(PKW):
            for h in cutlass.range_constexpr(2):
                fr = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
                for r in cutlass.range_constexpr(4):
                    fr[r] = words[4 * h + r][j]
                cute.autovec_copy(fr, sH[(t.warp, 2 * j + h, t.lane, None)])
        cute.arch.sync_threads()
        w0 = t.warp - t.warp % 2
        flip = Uint32(cutlass.select_(t.warp % 2 != 0, Uint32(0x80008000), Uint32(0)))
        keep = Uint32(cutlass.select_(t.rbase < t.row_end, Uint32(dev.ABS_BITS), Uint32(0)))
        keep = Uint32(cutlass.select_(t.col_ok, keep, Uint32(0)))
        hw = [[None] * PKW for _ in range(k.PK_ROWS)]
        hcm = []
        for j in cutlass.range_constexpr(PKW):
            xw = []  # word j of the group's 16 rows (rows 8-15 sign-flipped in the upper warp)
            for b in cutlass.range_constexpr(2):
                for h in cutlass.range_constexpr(2):
                    fr = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
                    cute.autovec_copy(sH[(w0 + b, 2 * j + h, t.lane, None)], fr)
                    for r in cutlass.range_constexpr(4):
                        xw.append(fr[r] if b == 0 else fr[r] ^ flip)
            x = [dev.bf16x2_to_f64(w) for w in xw]  # (row r's columns 2j, 2j + 1)
            ys = [dev.rht_half([x[r][half] for r in range(8)], [x[8 + r][half] for r in range(8)],
                               signs=self.cfg.fmt.hadamard_signs) for half in range(2)]
            for i in cutlass.range_constexpr(k.PK_ROWS):
                hw[i][j] = dev.rht_bf16x2(ys[0][i], ys[1][i])
            m = hw[0][j] & keep
            for i in cutlass.range_constexpr(1, k.PK_ROWS):
                m = dev.pk_max(m, hw[i][j] & keep, True, False)
            hcm.append(m)
        return hw, hcm

    @staticmethod
    def staged_row(t, i: int):
        """Row i's words as hadamard_columns staged them (word j in the 4-row half i // 4 of its
        chunk), read back where the rows are stored."""
        return [t.smem["rht"][t.warp, 2 * j + i // 4, t.lane, i % 4] for j in range(PKW)]

    @cute.jit
    def hadamard_amax(self, t, io, m):
        """The amax pass: the transformed copy's amax (NaN dropped; ``m``: the maximum word of the
        thread's transformed values) into the amax slot's entry 1 (``colwise_amax``), one atomic
        per warp."""
        tm = dev.warp_amax(dev.pk_amax(m, True, False))
        if t.lane == 0 and t.Ms > 0:
            dev.amax_atomic(io.amax, tm, 1)

    def fp4_column_word(self, k, words, sc, c: int, rand, prescaled: bool = False):
        """FP4's transposed colwise copy: column c's PK_ROWS (8) codes of the thread's rows as
        one word (row 2j's code in the low nibble of byte j: e2m1x8's order). MXFP4 on bf16 without
        sm_100a's conversion (codec.pow2_bf16_pairs): two rows' bf16 values a word
        (device.column_pairs), scaled in bf16 as the rowwise copy's (codec.encode8_words).
        ``prescaled``: stochastic rounding's multipliers already times 2^-14 (sr_prescaled)."""
        fmt = self.cfg.fmt
        if codec.pow2_bf16_pairs(fmt, k.is_bf16, k.use_hw_e8m0):
            return codec.encode8_words(fmt, dev.column_pairs(words, c), sc[c], k.is_bf16, k.use_hw_e8m0, rand)
        vals = []
        for i in range(k.PK_ROWS):
            lo, hi = dev.pk_unpack(words[i][c // 2], k.is_bf16)
            vals.append(dev.mul_rn(lo if c % 2 == 0 else hi, sc[c]))
        return codec.encode8(self.cfg.fmt, vals, k.use_hw_e8m0, rand, prescaled)

    @cute.jit
    def store_fp4_columns(self, k, t):
        """The staged transposed copy [N, M/2]: tile column c's TILE_ROWS rows are its warps'
        words (8 rows each), a run of 4 * WARPS bytes at byte r0 / 2 of output row cb * VCOLS + c
        (r0 the tile's first row: rb * TILE_ROWS, or a grouped tile's); one thread per column, the
        run as stores of 4, 2 or 1 words, the widest that the copy's base and row bytes M / 2
        align (fp4_store_words; grouped: the run's first byte and its group's end too), each
        below M (a group's end) where its first row is (M % 8 == 0, limits.fp4_unserved); a
        grouped run that is not 4-byte aligned as aligned words and 2- and 1-byte pieces
        (store_fp4_unaligned), each below its group's end."""
        sF = t.smem["fp4t"]
        half_m = t.M // 2
        base = t.col_data.iterator.toint()
        if cutlass.const_expr(k.GROUPED):
            r0 = t.gt.row0
            words = fp4_group_store_words(base | Int64(half_m) | Int64(r0 // 2) | Int64(t.Ms // 2), k.WARPS)
        else:
            r0 = t.rb * k.TILE_ROWS
            words = fp4_store_words(base | Int64(half_m), k.WARPS)
        for s in cutlass.range_constexpr(VCOLS // k.NTHREADS):
            c = t.tidx + s * k.NTHREADS
            oc = t.cb * VCOLS + c
            w = [sF[fp4_column_slot(j, c)] for j in range(k.WARPS)]
            if oc < t.N and r0 < t.Ms:
                addr = base + Int64(self.op.out_col(t.co, oc)) * Int64(half_m) + Int64(r0 // 2)
                if cutlass.const_expr(k.WARPS >= 4):
                    if words == 4:
                        self.store_fp4_run(k, t, addr, r0, w, 4)
                if words == 2:
                    self.store_fp4_run(k, t, addr, r0, w, 2)
                if words == 1:
                    self.store_fp4_run(k, t, addr, r0, w, 1)
                if cutlass.const_expr(k.GROUPED):
                    if words == 0:
                        self.store_fp4_unaligned(k, t, addr, r0, w)

    @cute.jit
    def store_fp4_unaligned(self, k, t, addr, r0, w):
        """A grouped run that is not 4-byte aligned (its address, group end or row bytes):
        store_fp4_shifted for its address % 4, its bytes below the group's end."""
        nv = cutlass.min((t.Ms - r0 + 1) // 2, Int32(4 * k.WARPS))
        sh = Int32(addr & Int64(3))
        for s in cutlass.range_constexpr(4):
            if sh == s:
                self.store_fp4_shifted(k, addr - Int64(s), w, nv, s)

    @cute.jit
    def store_fp4_shifted(self, k, aligned, w, nv, s: cutlass.Constexpr):
        """One column's run ``w`` of a grouped tile whose address, group end or row bytes are
        not 4-byte aligned, as aligned words and halves (fp4_shifted_plan) from ``aligned`` (its
        address - s): run byte j holds rows r0 + 2j and r0 + 2j + 1 and is stored where j < nv
        (below the group's end); about W + 2 stores where byte by byte took 4W."""
        for kk, i0, width, j0 in fp4_shifted_plan(s, k.WARPS):
            word = fp4_shifted_word(w, kk, s, k.WARPS)
            first, halves = fp4_piece_stores(i0, width, j0)
            if cutlass.const_expr(len(halves) == 0):
                self.store_fp4_piece(aligned + Int64(4 * kk), word, first, nv)
            else:
                if j0 + 3 < nv:
                    dev.store_global_words(aligned + Int64(4 * kk), [word])
                else:
                    for half in halves:
                        self.store_fp4_piece(aligned + Int64(4 * kk), word, half[0], nv)

    @cute.jit
    def store_fp4_piece(self, at, word, tries, nv):
        """The first of ``tries`` (fp4_piece_stores: byte, width, the run byte it needs below
        ``nv``) that fits, of aligned word ``word`` at ``at``: a 2-byte store, else one byte."""
        (i0, width, need), rest = tries[0], tries[1:]
        if need < nv:
            if cutlass.const_expr(width == 2):
                dev.store_global_u16(at + Int64(i0), (word >> Uint32(8 * i0)) & Uint32(0xFFFF))
            else:
                dev.store_global_u8(at + Int64(i0), word >> Uint32(8 * i0))
        else:
            if cutlass.const_expr(len(rest) > 0):
                (i1, _, need1) = rest[0]
                if need1 < nv:
                    dev.store_global_u8(at + Int64(i1), word >> Uint32(8 * i1))

    @cute.jit
    def store_fp4_run(self, k, t, addr, r0, w, words: cutlass.Constexpr):
        """One column's run ``w`` at ``addr`` as stores of ``words`` words (fp4_run_stores)."""
        for q, n in fp4_run_stores(words, k.WARPS):
            if cutlass.const_expr(q == 0):
                dev.store_global_words(addr, w[0:n])
            elif r0 + 8 * q < t.Ms:
                dev.store_global_words(addr + Int64(4 * q), w[q:q + n])

    # -- the transposed colwise copy (FP8 block scaling's GEMM-ready layout, KernelConfig.transposed) --
    @cute.jit
    def store_transposed_rows(self, k, t, io, words, sr, sc):
        """Aligned rows with the colwise copy transposed ([N, M]): each row's rowwise words are
        stored as store_rows does; its colwise words (the thread's 8 rows x 8 columns of bytes)
        are transposed in registers into 8 columns of 8 rows, staged in shared memory, and leave
        as 16-byte runs of output rows (store_transposed). Parked rows (KernelConfig.tr_stage
        "park") are read from their slots here, and "tr" lies over those slots: one barrier more."""
        cfg = self.cfg
        qcs = []
        for i in cutlass.range_constexpr(k.PK_ROWS):
            qr, qc = self.quantize_row(self.unpark(words[i]), sr[i] if cfg.rowwise else None, sc, k.is_bf16)
            if cutlass.const_expr(cfg.rowwise):
                if t.col_ok and t.rbase + i < t.Ms:
                    cute.autovec_copy(cute.recast_tensor(qr, Uint8), t.tRow[(i, None)])
            qcs.append([qc[0], qc[1]])
        if cutlass.const_expr(cfg.tr_stage == "park"):
            cute.arch.sync_threads()  # every thread's parked rows are read: "tr" may overwrite them
        for part in cutlass.range_constexpr(cfg.tr_parts):  # (KernelConfig.tr_parts: "tr" holds one part)
            if cutlass.const_expr(part > 0):
                cute.arch.sync_threads()  # the previous part's readers are done
            self.stage_transposed(t, qcs, part)
            cute.arch.sync_threads()
            self.store_transposed(k, t, io, part)

    def stage_transposed(self, t, qcs, part: int = 0):
        """The thread's colwise bytes (``qcs[i]``: row i's two words) into "tr" (stage_transposed_block)."""
        stage_transposed_block(t.smem["tr"], t.lane, t.warp, dev.transpose8x8(qcs), self.cfg.tr_parts, part)

    @cute.jit
    def store_transposed(self, k, t, io, part: cutlass.Constexpr = 0):
        """The staged tile (column part ``part`` of KernelConfig.tr_parts) as rows of the transposed
        copy (store_transposed_runs)."""
        store_transposed_runs(t.smem["tr"], io.col_data, io.M, io.N, t.Ms, t.tidx, k.NTHREADS, t.cb,
                              t.rb * k.TILE_ROWS, t.co, self.op, self.cfg.tr_parts, part)

    def store_unaligned(self, k, t, io, words, sr, sc):
        """Unaligned rows: the output rows' segments (rowwise, then colwise), their store plans
        (one per class of rows 8 apart) and the warp's parked partial words, then the row pass.
        Output rows that start on 8-byte boundaries (an out= with rows padded to a multiple of 8
        bytes, the layout FP8 GEMMs take) hold whole units: a lane's 8 bytes are one aligned
        store, with nothing to realign and no parked heads. Variant "rows8" (the host saw such
        outputs) compiles only that form. Otherwise plain casts pick it per warp at run time
        (their warps whose rows happen to be aligned); ops with arithmetic, dbias and two-halves
        ops keep only the realigned form: with both forms, dbias and two-halves ops took more
        registers (a CTA per SM fewer) and gelu + both on contiguous outputs ran 5.6% slower at
        8192x8190."""
        cfg = self.cfg
        dirs = ([ua.row_base(io.row_data, t.rbase, t.co + t.cT, k.RSTEP)] if cfg.rowwise else []) + \
            ([ua.row_base(io.col_data, t.rbase, t.co + t.cT, k.RSTEP)] if cfg.colwise else [])
        splan = None if k.ROWS8 else [ua.store_plans(dd, k.PERIOD, t.ncols, t.lane) for dd in dirs]
        edges = t.smem["edge"][(t.warp, None)]
        rows = (words, sr, sc, dirs)
        tail = (edges, t.lane, t.rbase, t.Ms, t.ncols, k.is_bf16)
        if k.ROWS8:
            self.unaligned_row_pass(*rows, None, *tail, True)
        elif cfg.computed or cfg.dbias or k.PASSES == 2:
            self.unaligned_row_pass(*rows, splan, *tail, False)
        else:
            fast = cutlass.Boolean(True)
            for dd in dirs:
                fast = fast & (((ua.row_at(dd, 0) | dd[1]) & Int64(ua.UNIT - 1)) == Int64(0))
            self.unaligned_row_pass_by(fast, rows, splan, tail)

    @cute.jit
    def unaligned_row_pass_by(self, fast, rows, splan, tail):
        """The row pass of a plain cast, in the form its warp's output rows allow: whole units
        where they start on 8-byte boundaries (``fast``), else realigned."""
        if fast:
            self.unaligned_row_pass(*rows, None, *tail, True)
        else:
            self.unaligned_row_pass(*rows, splan, *tail, False)

    @cute.jit
    def unaligned_row_pass(self, words, sr, sc, dirs, splan, edges, lane, rbase, Ms, ncols, is_bf16: cutlass.Constexpr,
                           aligned_rows: cutlass.Constexpr):
        """Unaligned rows: quantize the thread's rows and store them through unaligned.py, then write
        the parked partial units. ``aligned_rows``: the output rows start on 8-byte boundaries
        (unaligned.store_unit_aligned, only the last tile's tails parked); else realigned
        (unaligned.store_row with ``splan``, heads and tails parked)."""
        cfg = self.cfg
        WARPS = cutlass.const_expr(cfg.packed_warps(True))
        PK_ROWS = cutlass.const_expr(cfg.tile_rows // WARPS)
        PERIOD = cutlass.const_expr(ua.plans_per_thread(PK_ROWS, WARPS))
        if cutlass.const_expr(aligned_rows):
            # every row's stores predicated (no branch per row: rows past M are quantized and not
            # stored), each direction's lane address stepped from row to row
            uplan = ua.unit_store_plan(lane, ncols)
            p = [ua.row_at(dd, 0) + Int64(lane * ua.UNIT) for dd in dirs]
            for i in cutlass.range_constexpr(PK_ROWS):
                ok = rbase + i * WARPS < Ms
                qr, qc = self.quantize_row(words[i], sr[i] if cfg.rowwise else None, sc, is_bf16)
                q = ([qr] if cfg.rowwise else []) + ([qc] if cfg.colwise else [])
                for d in cutlass.range_constexpr(len(dirs)):
                    ua.store_unit_aligned(p[d], ok, uplan, q[d][0], q[d][1], edges, 2 * (d * PK_ROWS + i))
                    if cutlass.const_expr(i + 1 < PK_ROWS):
                        p[d] = p[d] + dirs[d][1]
        else:
            for i in cutlass.range_constexpr(PK_ROWS):
                if rbase + i * WARPS < Ms:  # (every lane of a live row takes part in the realigned stores' shuffle)
                    qr, qc = self.quantize_row(words[i], sr[i] if cfg.rowwise else None, sc, is_bf16)
                    q = ([qr] if cfg.rowwise else []) + ([qc] if cfg.colwise else [])
                    for d in cutlass.range_constexpr(len(dirs)):
                        ua.store_row(ua.row_at(dirs[d], i), splan[d][i % PERIOD], lane, q[d][0], q[d][1], edges,
                                     2 * (d * PK_ROWS + i))
        cute.arch.sync_warp()  # the parked words are read by other lanes
        if cutlass.const_expr(aligned_rows):
            if ncols % ua.UNIT != 0:  # (only the last column tile has a partial unit per row)
                ua.flush_edges(edges, lane, dirs, PK_ROWS, WARPS, Ms - rbase, ncols, True)
        else:
            ua.flush_edges(edges, lane, dirs, PK_ROWS, WARPS, Ms - rbase, ncols, False)
        cute.arch.sync_warp()  # (a second pass parks its own)


# -- the transposed colwise copy's staging tile, shared by the packed and the vectorised kernels ------
def transposed_chunk(c, chunk, first: int = 0):
    """Where 8-byte chunk ``chunk`` (rows 8 * chunk ..) of tile column ``c`` lies in "tr" (rows
    of TR_CHUNKS chunks, one per column from column ``first`` on: a column part's first,
    KernelConfig.tr_parts): XOR-swizzled by the column's lane (c >> 3) and parity, so that a
    warp's chunk stores (one column per lane, lanes 8 columns apart) and the readers' loads (8
    lanes per column, two adjacent columns per 16 lanes) hit distinct banks."""
    return (c - first if first else c) * TR_CHUNKS + (chunk ^ (((c >> 3) ^ (c & 1)) & (TR_CHUNKS - 1)))


@cute.jit
def stage_transposed_block(sT, lane, warp, cols, parts: cutlass.Constexpr = 1, part: cutlass.Constexpr = 0):
    """A thread's 8 x 8 block of colwise FP8 bytes, already transposed (``cols[c]``: column
    lane * VEC + c's 8 rows as two words; the warp's 8 rows are chunk ``warp`` of every column),
    into "tr"; where the tile is staged in ``parts`` column parts (KernelConfig.tr_parts), the
    threads of part ``part`` alone, from the part's first column on."""
    PART_COLS = cutlass.const_expr(VCOLS // parts)
    if cutlass.const_expr(parts == 1):
        for c in cutlass.range_constexpr(VEC):
            sT[transposed_chunk(lane * VEC + c, warp)] = dev.pack64(cols[c][0], cols[c][1])
    elif lane // (32 // parts) == part:
        for c in cutlass.range_constexpr(VEC):
            sT[transposed_chunk(lane * VEC + c, warp, part * PART_COLS)] = dev.pack64(cols[c][0], cols[c][1])


@cute.jit
def store_transposed_runs(sT, col_data, M, N, Ms, tidx, nthreads: cutlass.Constexpr, cb, row0, co, op: cutlass.Constexpr,
                          parts: cutlass.Constexpr = 1, part: cutlass.Constexpr = 0):
    """The staged tile in "tr" (column part ``part`` of ``parts``) as rows of the transposed copy
    ([N, M], row stride M): output row cb * VCOLS + c (the input's column; a two-halves op's from
    its half's first row, ``op.out_col(co, ..)``), bytes row0 .. row0 + 127 (rows below ``Ms``);
    8 threads per row, 16 bytes each (two chunks), as one 16-byte store where the copy's rows and
    base are 16-byte aligned (M % 16 == 0: the FP8 GEMMs' own rule) and the run lies below Ms,
    else byte by byte below Ms."""
    base = col_data.iterator.toint()
    PART_COLS = cutlass.const_expr(VCOLS // parts)
    fast = ((base | Int64(M)) & Int64(15)) == Int64(0)
    for s in cutlass.range_constexpr(PART_COLS * TR_CHUNKS // 2 // nthreads):
        p = tidx + s * nthreads
        c = p // (TR_CHUNKS // 2)
        if cutlass.const_expr(part > 0):
            c = c + part * PART_COLS
        q = p % (TR_CHUNKS // 2)
        a = sT[transposed_chunk(c, 2 * q, part * PART_COLS)]
        b = sT[transposed_chunk(c, 2 * q + 1, part * PART_COLS)]
        w = [Uint32(a & Uint64(0xFFFFFFFF)), Uint32(a >> Uint64(32)), Uint32(b & Uint64(0xFFFFFFFF)),
             Uint32(b >> Uint64(32))]
        oc = cb * VCOLS + c
        r0 = row0 + q * 16
        orow = op.out_col(co, oc)  # (outside the branch: ``op`` is a Python object)
        if oc < N and r0 < Ms:
            addr = base + Int64(orow) * Int64(M) + Int64(r0)
            if fast and r0 + 16 <= Ms:
                dev.store_global_words(addr, w)
            else:
                for j in cutlass.range_constexpr(16):
                    if r0 + j < Ms:
                        dev.store_global_u8(addr + Int64(j), w[j // 4] >> Uint32(8 * (j % 4)))
