"""The packed kernel for 16-bit inputs (bf16, fp16): N % 8 == 0 and 16-byte aligned tensors,
or, with ``unaligned``, any N and alignment (loads and stores through unaligned.py; the rest of
the kernel is the same code).

Values stay in the input's 16-bit format, two per 32-bit word: the amax is computed on packed
words (AND + max.NaN.{bf16x2,f16x2}, exact), values widen to fp32 only to be multiplied by the
scale, and four FP8 bytes leave as one word. This cuts the instructions per element about 3x
against fp32 values, which is what bounds the rowwise+colwise pass on the H200.

Tiling (KernelConfig.packed_warps = W warps, PK_ROWS = 32 / W rows per thread):
- ops with a column reduction (colwise, amax, dbias): a CTA covers 32 rows x 32 * VEC columns;
  lane l owns columns 8l..8l+7, warp w owns PK_ROWS adjacent rows (unaligned rows: rows w,
  w + W, ..., which share their read and store plans, unaligned.py);
- a pure rowwise cast ("wide", KernelConfig.wide): the warps lie side by side along one band of
  PK_ROWS rows (8 x 1024 columns), so a CTA's rows are long runs of memory and its row-scale
  bytes, gathered in shared memory, leave as whole 4-byte words.

Phases: loads (staged through shared memory with cp.async for ops with arithmetic); values,
maxima and row scales; column owners after one barrier; then one pass over the rows that widens
each word once for both directions' FP8 bytes and stores them. The grid is (column tiles, row
tiles), the row tiles split over y and z past 65535, so no integer division finds the tile.
Nothing branches on noop: it zeroes the row bound Ms of every store instead (with an early exit
ptxas sank three of the four row loads below the noop load, serialising two memory latencies).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32

from . import codec
from . import device as dev
from . import grouped
from . import smem as shared
from . import unaligned as ua
from .config import ROWS, VEC

VCOLS = 32 * VEC  # columns of a (non-wide) tile
PKW = VEC // 2  # 32-bit words per row per thread


def tile(cfg, grouped: bool = False, unaligned: bool = False):
    """(rows, columns) of one CTA's tile."""
    if cfg.wide_tile(grouped, unaligned):
        return ROWS // cfg.packed_warps(unaligned), VCOLS * cfg.packed_warps(unaligned)
    return ROWS, VCOLS


def grid(cfg, M, N, G=None, unaligned: bool = False):
    """Grid and block; ``G``: the group count of a grouped call (grouped.row_tiles row tiles)."""
    tile_rows, tile_cols = tile(cfg, G is not None, unaligned)
    n_fast = cute.ceil_div(N, tile_cols) * (2 if cfg.halves and cfg.halves_passes == 1 else 1)  # (two-halves ops: each tile twice)
    n_slow = cute.ceil_div(M, tile_rows) if G is None else grouped.row_tiles(M, G)
    gz = cute.ceil_div(n_slow, 65535)  # grid y is at most 65535
    return [n_fast, cute.ceil_div(n_slow, gz), gz], [cfg.packed_warps(unaligned) * 32, 1, 1]


class PackedKernel:
    """The packed kernel of one config (``cfg``) and op (``op``: element.ElementOp)."""

    def __init__(self, cfg, op):
        self.cfg = cfg
        self.op = op

    @cute.kernel
    def packed_kernel(self, ins: list, scalars: list, act_in, row_data, row_scale, col_data, col_scale, amax,
                      dbias_ws, noop, group_ends, M: Int32, N: Int32, NO: Int32, use_hw_e8m0: cutlass.Constexpr,
                      use_pdl: cutlass.Constexpr, unaligned: cutlass.Constexpr, rows8: cutlass.Constexpr = False):
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
        PK_ROWS = cutlass.const_expr(ROWS // WARPS)  # rows per thread
        # a thread's rows: rbase + i * RSTEP. Aligned: PK_ROWS adjacent rows. Unaligned: rows WARPS
        # apart, so that rows 8 apart, which share their misalignment, share one thread's read and
        # store plans (unaligned.py); PERIOD plans per thread
        RSTEP = cutlass.const_expr(WARPS if UNALIGNED else 1)
        PERIOD = cutlass.const_expr(ua.plans_per_thread(PK_ROWS, RSTEP))  # row i takes plan i % PERIOD
        TILE_ROWS, TILE_COLS = tile(cfg, GROUPED, UNALIGNED)
        DIVBY = cutlass.const_expr(1 if UNALIGNED else VEC)  # what N is a multiple of
        RS_BLOCKS = cutlass.const_expr(TILE_COLS // 32)  # row-scale blocks per tile row
        if cutlass.const_expr(use_pdl):
            cute.arch.griddepcontrol_launch_dependents()  # dbias_kernel may start; it waits for this grid to finish
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, bz = cute.arch.block_idx()
        _, gy, _ = cute.arch.grid_dim()
        lane = tidx % 32
        warp = tidx // 32
        cb = bx
        # outputs: NOUT columns, this CTA's at column offset co (two-halves ops: half h of 2N, ElementOp.output_half)
        PASSES = cutlass.const_expr(cfg.halves_passes)  # 2: this CTA writes both halves (Tuning.halves_one_cta)
        cb, co, NOUT, scalars = self.op.output_half(cb, N, NO, TILE_COLS, scalars, divby=DIVBY, passes=PASSES)
        rb = by + bz * gy
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
                                      for t, s in enumerate(sources)], UNALIGNED, GROUPED)
        if cutlass.const_expr(len(buffers) > 0):
            buf = shared.allocate(cutlass.memory.SmemAllocator(), buffers,
                                  {f"in{t}": s.element_type for t, s in enumerate(sources)})
        gt = None
        if cutlass.const_expr(GROUPED):
            # row tile rb is one colwise block of a group: rows [gt.row0, gt.row_end) (grouped.py)
            gt = grouped.GroupTile(group_ends, buf["group"], rb, M, N, cfg.fmt.swizzled, NTHREADS)
            in_grid = rb < grouped.row_tiles(M, group_ends.shape[0])
            row_end = gt.row_end
        else:
            in_grid = rb < (M + TILE_ROWS - 1) // TILE_ROWS
            row_end = M
        if cutlass.const_expr(WIDE):
            g = (cb * WARPS + warp) * 32 + lane  # this lane's group of VEC columns
            trow = rb  # this thread's PK_ROWS-row tile index
            rbase = rb * PK_ROWS
        else:
            g = cb * 32 + lane
            trow = rb * WARPS + warp
            WROWS = cutlass.const_expr(PK_ROWS if RSTEP == 1 else 1)  # rows between two warps' first rows
            rbase = rb * ROWS + warp * WROWS
            if cutlass.const_expr(GROUPED):
                rbase = gt.row0 + warp * WROWS
        c0 = g * VEC
        col_ok = c0 < N  # aligned: N % VEC == 0, a group is wholly inside or outside
        if cutlass.const_expr(UNALIGNED):
            # the CTA's row segments: columns [cT, cT + ncols) of every row. The thread's values past
            # column N (the next tile's, the next row's) are never stored; their magnitudes, which
            # the row maxima read, are masked to +0 (abs_masks)
            cT = cb * VCOLS
            ncols = cutlass.min(Int32(VCOLS), N - cT)
            abs_masks = [m & Uint32(dev.ABS_BITS) for m in ua.column_masks(N - c0, PKW)]
        else:
            abs_masks = [Uint32(dev.ABS_BITS)] * PKW  # every column exists
        # sRS: the wide tile's rows x RS_BLOCKS row-scale bytes, gathered to leave as whole words.
        # sMax, sSum and sInv are indexed by position j * 32 + lane (word or column j of lane), so
        # that a warp's stores and the owners' loads below touch consecutive words: no bank
        # conflicts. sEdge: each warp's partial output units (two words), head and tail of each of
        # its rows, per direction.
        sRS, sMax, sInv, sSum, sEdge = (buf.get(n) if len(buffers) > 0 else None
                                        for n in ("rs", "max", "inv", "sum", "edge"))
        # this thread's PK_ROWS x VEC tile of each tensor: row i is the tile's base + i * RSTEP row strides
        tiles = [dev.thread_tile(s, (PK_ROWS, VEC), trow, rbase, g, GROUPED, RSTEP) for s in sources]
        if cutlass.const_expr(cfg.rowwise):
            if cutlass.const_expr(PASSES == 1):
                tRow = dev.thread_tile(self.op.out_window(row_data, co), (PK_ROWS, VEC), trow, rbase, g, GROUPED)
            nbr = (NOUT + 31) // 32
        if cutlass.const_expr(cfg.colwise and PASSES == 1):
            tCol = dev.thread_tile(self.op.out_window(col_data, co), (PK_ROWS, VEC), trow, rbase, g, GROUPED)
        if cutlass.const_expr(any(staged_src)):
            # Staged loads: every row of every input is requested at once with cp.async into this
            # thread's own shared-memory slots (one commit group per row) and read back just before
            # its row is computed.
            # Unaligned: each row segment is staged whole (its covering 16-byte chunks, copied by the
            # warp) and every lane reads its 8 columns back realigned (unaligned.py).
            # (unaligned: a row's covering chunks per staged row; aligned: the thread's rows, or the
            # one row of a source broadcast along rows, a bias)
            staged = [buf[f"in{t}"] if staged_src[t] else None for t in range(NSRC)]
            g2s = [cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                       sources[t].element_type, num_bits_per_copy=128) if staged_src[t] else None
                   for t in range(NSRC)]
            # Unaligned rows of ops with arithmetic and no dbias: rows past M are staged as zeros, so
            # every row is read without a branch (plain casts and dbias ops keep the branch: without
            # it ptxas kept more values live, a CTA per SM fewer)
            ZERO_ROWS = cutlass.const_expr(UNALIGNED and cfg.computed and not cfg.dbias)
            if cutlass.const_expr(UNALIGNED):
                # each source's rows and their misalignment (one per class of rows 8 apart)
                ga = [ua.row_base(sources[t], rbase, cT, RSTEP) if staged_src[t] else None for t in range(NSRC)]
                mis = [ua.per_class(ga[t], PERIOD, ua.chunk_misalignment) if staged_src[t] else None for t in range(NSRC)]
            for i in cutlass.range_constexpr(PK_ROWS):
                if cutlass.const_expr(UNALIGNED):
                    for t in cutlass.range_constexpr(NSRC):
                        if cutlass.const_expr(staged_src[t] and (i == 0 or not once[t])):
                            ua.stage_row(sources[t].element_type, staged[t][(warp * PK_ROWS + i, None)],
                                         ua.row_at(ga[t], i), mis[t][i % PERIOD], ncols, lane,
                                         rbase + i * RSTEP < row_end, ZERO_ROWS)
                elif col_ok and rbase + i < row_end:
                    for t in cutlass.range_constexpr(NSRC):
                        if cutlass.const_expr(staged_src[t] and (i == 0 or not once[t])):
                            cute.copy(g2s[t], tiles[t][(i, None)], staged[t][(i, tidx, None)])
                cute.arch.cp_async_commit_group()
        # all loads first (PK_ROWS independent 16-byte loads per source per thread, unless staged)
        frags = []  # frags[i][t]: row i of source t
        for i in cutlass.range_constexpr(PK_ROWS):
            row = []
            for t in cutlass.range_constexpr(NSRC):
                if cutlass.const_expr(i > 0 and once[t]):
                    row.append(frags[0][t])
                else:
                    row.append(cute.make_rmem_tensor_like(tiles[t][(0, None)]))
                    row[t].fill(0)
            frags.append(row)
            if cutlass.const_expr(not all(staged_src)):
                if col_ok and rbase + i * RSTEP < row_end:
                    for t in cutlass.range_constexpr(NSRC):
                        if cutlass.const_expr(not staged_src[t] and (i == 0 or not once[t])):
                            cute.autovec_copy(tiles[t][(i, None)], row[t])
        # every store below is bounded by Ms: 0 under noop (nothing written) or past the grid
        Ms = Int32(cutlass.select_(noop[0] != Float32(1.0), row_end, Int32(0)))
        Ms = Int32(cutlass.select_(in_grid, Ms, Int32(0)))
        # Two-halves ops with PASSES == 2: everything below runs once per output half over the same
        # loaded tile (the staged inputs are still in shared memory), writing at column offset co.
        for hp in cutlass.range_constexpr(PASSES):
            if cutlass.const_expr(PASSES == 2):
                co, scalars_p = self.op.pass_half(hp, N, scalars, divby=DIVBY)
                if cutlass.const_expr(hp == 1):
                    cute.arch.sync_threads()  # pass 0's readers of sMax/sSum/sInv are done
                if cutlass.const_expr(cfg.rowwise):
                    tRow = dev.thread_tile(self.op.out_window(row_data, co), (PK_ROWS, VEC), trow, rbase, g, GROUPED)
                if cutlass.const_expr(cfg.colwise):
                    tCol = dev.thread_tile(self.op.out_window(col_data, co), (PK_ROWS, VEC), trow, rbase, g, GROUPED)
            else:
                scalars_p = scalars
            if cutlass.const_expr(cfg.dbias):
                # dbias: a 32-row block is summed in fp32 (this thread's rows in order, then the warps in
                # order) and the blocks in fp64 by dbias_kernel (numerics.dbias_partial_dtype says why)
                dsum = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)  # starts at row 0's values
            words = []  # words[i][j]: row i's values j*2, j*2+1 as one packed word
            absw = []  # their magnitudes
            if cutlass.const_expr(UNALIGNED and any(staged_src)):
                rplan = [ua.read_plans(mis[t], lane) if staged_src[t] else None for t in range(NSRC)]
            for i in cutlass.range_constexpr(PK_ROWS):
                if cutlass.const_expr(any(staged_src)):
                    if cutlass.const_expr(hp == 0):
                        cute.arch.cp_async_wait_group(PK_ROWS - 1 - i)  # row i's copies have landed
                    else:  # reloaded from shared memory: pass 0's values need not stay live until here
                        for t in cutlass.range_constexpr(NSRC):
                            if cutlass.const_expr(staged_src[t] and (i == 0 or not once[t])):
                                frags[i][t].fill(0)
                    if cutlass.const_expr(UNALIGNED):
                        cute.arch.sync_warp()  # the row's chunks were copied by every lane of the warp
                    if cutlass.const_expr(ZERO_ROWS):
                        self.read_unaligned_row(frags[i], staged, rplan, warp * PK_ROWS + i, i % PERIOD, once, staged_src, i)
                    elif col_ok and rbase + i * RSTEP < row_end:
                        if cutlass.const_expr(UNALIGNED):
                            self.read_unaligned_row(frags[i], staged, rplan, warp * PK_ROWS + i, i % PERIOD, once,
                                                    staged_src, i)
                        else:
                            for t in cutlass.range_constexpr(NSRC):
                                if cutlass.const_expr(staged_src[t] and (i == 0 or not once[t])):
                                    cute.autovec_copy(staged[t][(i, tidx, None)], frags[i][t])
                if cutlass.const_expr(cfg.computed):
                    if cutlass.const_expr(not cfg.identity):
                        row_ok = col_ok and rbase + i * RSTEP < row_end
                        if cutlass.const_expr(ROW_MASK):
                            abs_keep = Uint32(cutlass.select_(row_ok, Uint32(dev.ABS_BITS), Uint32(0)))
                    vv = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
                    for k in cutlass.range_constexpr(VEC):
                        v = self.op.value(frags[i], k, scalars_p, dev.widen)
                        if cutlass.const_expr(not cfg.identity and not ROW_MASK):
                            # a user epilogue may map padding to nonzero (unaligned: columns past N are
                            # masked with the magnitudes below; their sums are never stored)
                            v = Float32(cutlass.select_(row_ok, v, Float32(0.0)))
                        # (built-in act/dact keep the zero padding of rows past M at zero: act(0) == 0 and
                        # 0 * dact(0) == 0, see tests/test_codegen.py::test_builtin_acts_keep_zero_padding)
                        if cutlass.const_expr(cfg.dbias):
                            # (row 0 starts the sum: 0 + v would turn -0 into +0, as the second pass does anyway)
                            if cutlass.const_expr(i == 0):
                                dsum[k] = v
                            else:
                                dsum[k] = dsum[k] + v
                        vv[k] = v
                    # NUMERICS step 5: round to the input format, two values per instruction
                    row_words = [dev.pk_round(vv[2 * j], vv[2 * j + 1], is_bf16) for j in range(PKW)]
                else:
                    fw = cute.recast_tensor(frags[i][0], Uint32)
                    row_words = [fw[j] for j in range(PKW)]
                    if cutlass.const_expr(cfg.dbias):
                        # a plain cast with dbias: v is the input itself (rows past M were loaded as zeros)
                        for k in cutlass.range_constexpr(VEC):
                            if cutlass.const_expr(i == 0):
                                dsum[k] = dev.widen(frags[i][0], k)
                            else:
                                dsum[k] = dsum[k] + dev.widen(frags[i][0], k)
                words.append(row_words)
                # |v|, and 0 in columns past N (unaligned) and, with ROW_MASK, in rows past M
                if cutlass.const_expr(ROW_MASK):
                    absw.append([row_words[j] & (abs_masks[j] & abs_keep) for j in range(PKW)])
                else:
                    absw.append([row_words[j] & abs_masks[j] for j in range(PKW)])
                if cutlass.const_expr(cfg.col_reduce):
                    if cutlass.const_expr(i == 0):
                        cm = list(absw[0])  # this thread's column maxima, one word per two columns
                    else:
                        cm = [dev.pk_max(cm[j], absw[i][j], is_bf16) for j in range(PKW)]
            if cutlass.const_expr(cfg.rowwise):
                # rowwise: the 32-column block of a row is the 4 adjacent lanes q = lane % 4. Their
                # partial maxima are reduce-scattered (two butterfly stages), so that lane q finishes
                # rows q * PK_ROWS / 4 .. and computes their scales alone, then every lane fetches the
                # PK_ROWS inverse scales it needs: PK_ROWS shuffles instead of PK_ROWS scale computations.
                HALF = cutlass.const_expr(PK_ROWS // 2)
                QUARTER = cutlass.const_expr(PK_ROWS // 4)
                rp = [dev.pk_max(dev.pk_max(a[0], a[1], is_bf16), dev.pk_max(a[2], a[3], is_bf16), is_bf16) for a in absw]
                hi2 = (lane & 2) != 0
                rs = [dev.pk_max_shuffled(rp[m], rp[HALF + m], 2, hi2, is_bf16) for m in range(HALF)]
                hi1 = (lane & 1) != 0
                qrow = (lane % 4) * QUARTER  # first row this lane finishes
                grp_ok = c0 - (lane % 4) * VEC < N  # the block's first lane has valid columns
                si = []  # inverse scales of the rows this lane finished
                for m in cutlass.range_constexpr(QUARTER):
                    rq = dev.pk_max_shuffled(rs[m], rs[QUARTER + m], 1, hi1, is_bf16)
                    er = dev.e8m0_scale(dev.pk_amax(rq, is_bf16), cfg.fmt.element, cfg.fmt.rule, use_hw_e8m0)
                    si.append(dev.inv_scale(er))
                    if cutlass.const_expr(WIDE):
                        sRS[rbase - rb * TILE_ROWS + qrow + m, g // 4 - cb * RS_BLOCKS] = Uint8(er)
                    else:
                        srow_i = rbase + qrow + m  # the thread's row qrow + m (two forms: the aligned
                        if cutlass.const_expr(RSTEP > 1):  # kernel's PTX stays as it was)
                            srow_i = rbase + (qrow + m) * RSTEP
                        if grp_ok and srow_i < Ms:
                            if cutlass.const_expr(GROUPED):
                                codec.store_row_scale(cfg, row_scale, codec.group_row_scale_offset(cfg.fmt, gt, srow_i, (co + c0) // 32, nbr), er)
                            elif cutlass.const_expr(cfg.fmt.swizzled):
                                codec.store_row_scale(cfg, row_scale, dev.swizzle_offset(srow_i, (co + c0) // 32, nbr), er)
                            else:
                                codec.store_row_scale(cfg, row_scale, srow_i * nbr + (co + c0) // 32, er)
                if cutlass.const_expr(WIDE):
                    cute.arch.sync_threads()
                    # Row scales leave as words of 4 blocks, whole rows of the tile per request. Words need
                    # nbr % 4 == 0 and a 4-byte aligned scale tensor (CTA-uniform); otherwise the same
                    # bytes are stored one by one.
                    rs_base = row_scale.iterator.toint()
                    if nbr % 4 == 0 and rs_base % 4 == 0:
                        if tidx < TILE_ROWS * RS_BLOCKS // 4:
                            wr = tidx // (RS_BLOCKS // 4)
                            wb = cb * RS_BLOCKS + (tidx % (RS_BLOCKS // 4)) * 4  # the word's first block
                            if rb * TILE_ROWS + wr < Ms and wb < nbr:
                                word = cute.recast_tensor(sRS, Uint32)[wr, tidx % (RS_BLOCKS // 4)]
                                # (swizzled: blocks 4k..4k+3 of a row are adjacent)
                                woff = dev.scale_offset(cfg.fmt.swizzled, rb * TILE_ROWS + wr, wb, nbr)
                                cute.arch.inline_ptx("st.global.b32 [{$r0}], {$r1};", read_only_args=[rs_base + Int64(woff), word])
                    else:
                        for r in cutlass.range_constexpr((TILE_ROWS * RS_BLOCKS + NTHREADS - 1) // NTHREADS):
                            p = tidx + r * NTHREADS
                            br = p // RS_BLOCKS
                            bb = cb * RS_BLOCKS + p % RS_BLOCKS
                            if br < TILE_ROWS and rb * TILE_ROWS + br < Ms and bb < nbr:
                                codec.store_row_scale(cfg, row_scale, dev.scale_offset(cfg.fmt.swizzled, rb * TILE_ROWS + br, bb, nbr),
                                                  sRS[br, p % RS_BLOCKS])
                gl = lane - lane % 4
                sr = [cute.arch.shuffle_sync(si[i % QUARTER], gl + i // QUARTER) for i in range(PK_ROWS)]
            if cutlass.const_expr(cfg.col_reduce):
                # the warps' partial column amax (and dbias sums) meet in shared memory
                for j in cutlass.range_constexpr(PKW):
                    sMax[warp, j * 32 + lane] = cm[j]
                if cutlass.const_expr(cfg.dbias):
                    for k in cutlass.range_constexpr(VEC):
                        sSum[warp, k * 32 + lane] = dsum[k]
                cute.arch.sync_threads()
                # Column owners: each of the CTA's 32 * PKW words of column maxima (two columns) is reduced
                # over the warps, turned into two scales and stored once per CTA, by one thread, instead
                # of by every warp for its own lane's columns.
                Ns = Int32(cutlass.select_(Ms > 0, N, Int32(0)))  # column bound of the owners' stores
                if cutlass.const_expr(GROUPED and not cfg.fmt.swizzled):
                    # compact grouped: a tile with no rows writes its scale row's zeros (grouped.py)
                    Ns = Int32(cutlass.select_(in_grid and noop[0] != Float32(1.0), N, Int32(0)))
                if tidx < 32 * PKW:  # warp-uniform (always true below 8 warps)
                    if cutlass.const_expr(cfg.amax):
                        tm = Float32(0.0)
                    for r in cutlass.range_constexpr(max(1, 32 * PKW // NTHREADS)):
                        p = tidx + r * NTHREADS  # position j * 32 + lane of the word
                        cw = sMax[0, p]
                        for w in cutlass.range_constexpr(1, WARPS):
                            cw = dev.pk_max(cw, sMax[w, p], is_bf16)
                        if cutlass.const_expr(cfg.amax):
                            tm = cute.arch.fmax(tm, dev.pk_amax(cw, is_bf16), nan=True)
                        if cutlass.const_expr(cfg.colwise):
                            cl, ch = dev.pk_unpack(cw, is_bf16)
                            e_lo = dev.e8m0_scale(cl, cfg.fmt.element, cfg.fmt.rule, use_hw_e8m0)
                            e_hi = dev.e8m0_scale(ch, cfg.fmt.element, cfg.fmt.rule, use_hw_e8m0)
                            if cutlass.const_expr(GROUPED):
                                e_lo = Int32(cutlass.select_(Ms > 0, e_lo, Int32(0)))
                                e_hi = Int32(cutlass.select_(Ms > 0, e_hi, Int32(0)))
                            pj = p // 32
                            sInv[2 * pj * 32 + p % 32] = dev.inv_scale(e_lo)  # column k = 2j, 2j + 1 of lane p % 32
                            sInv[(2 * pj + 1) * 32 + p % 32] = dev.inv_scale(e_hi)
                            oc = cb * VCOLS + (p % 32) * VEC + 2 * pj  # its first column
                            if oc < Ns:  # aligned: N % VEC == 0, both columns are in or out
                                codec.put_col_scale(cfg.fmt, col_scale, gt, co + oc, rb, M, NOUT, e_lo)
                                if cutlass.const_expr(UNALIGNED):
                                    if oc + 1 < Ns:
                                        codec.put_col_scale(cfg.fmt, col_scale, gt, co + oc + 1, rb, M, NOUT, e_hi)
                                else:
                                    codec.put_col_scale(cfg.fmt, col_scale, gt, co + oc + 1, rb, M, NOUT, e_hi)
                    if cutlass.const_expr(cfg.amax):
                        tm = dev.warp_max(tm)
                        if lane == 0 and Ms > 0:
                            cute.arch.atomic_fmax(amax.iterator, tm, sign_bit=False)  # one atomic per owner warp
                if cutlass.const_expr(cfg.dbias):
                    # dbias: each thread sums its column(s) over the warps in a fixed order (deterministic)
                    for r in cutlass.range_constexpr(max(1, 32 * VEC // NTHREADS)):
                        p = tidx + r * NTHREADS  # position k * 32 + lane
                        s = sSum[0, p]
                        for w in cutlass.range_constexpr(1, WARPS):
                            s = s + sSum[w, p]
                        oc = cb * VCOLS + (p % 32) * VEC + p // 32
                        if oc < Ns:
                            dbias_ws[rb, co + oc] = s
            if cutlass.const_expr(cfg.colwise):
                cute.arch.sync_threads()
                sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
                for k in cutlass.range_constexpr(VEC):
                    sc[k] = sInv[k * 32 + lane]
            if cutlass.const_expr(UNALIGNED):
                # the output rows' segments (rowwise, then colwise), their store plans (one per class of
                # rows 8 apart) and the warp's parked partial words
                dirs = ([ua.row_base(row_data, rbase, co + cT, RSTEP)] if cfg.rowwise else []) + \
                    ([ua.row_base(col_data, rbase, co + cT, RSTEP)] if cfg.colwise else [])
                splan = None if ROWS8 else [ua.store_plans(dd, PERIOD, ncols, lane) for dd in dirs]
                edges = sEdge[(warp, None)]
            # one pass over the rows: each word is widened once for both directions
            if cutlass.const_expr(UNALIGNED):
                # Output rows that start on 8-byte boundaries (an out= with rows padded to a multiple
                # of 8 bytes, the layout FP8 GEMMs take) hold whole units: a lane's 8 bytes are one
                # aligned store, with nothing to realign and no parked heads. Variant "rows8" (the
                # host saw such outputs) compiles only that form. Otherwise plain casts pick it per
                # warp at run time (their warps whose rows happen to be aligned); ops with arithmetic,
                # dbias and two-halves ops keep only the realigned form: with both forms, dbias and
                # two-halves ops took more registers (a CTA per SM fewer) and gelu + both on
                # contiguous outputs ran 5.6% slower at 8192x8190 on the H200.
                rows = (words, sr if cfg.rowwise else None, sc if cfg.colwise else None, dirs)
                tail = (edges, lane, rbase, Ms, ncols, is_bf16)
                if cutlass.const_expr(ROWS8):
                    self.unaligned_row_pass(*rows, None, *tail, True)
                elif cutlass.const_expr(cfg.computed or cfg.dbias or PASSES == 2):
                    self.unaligned_row_pass(*rows, splan, *tail, False)
                else:
                    fast = cutlass.Boolean(True)
                    for dd in dirs:
                        fast = fast & (((ua.row_at(dd, 0) | dd[1]) & Int64(ua.UNIT - 1)) == Int64(0))
                    if fast:
                        self.unaligned_row_pass(*rows, None, *tail, True)
                    else:
                        self.unaligned_row_pass(*rows, splan, *tail, False)
            else:
                for i in cutlass.range_constexpr(PK_ROWS):
                    if col_ok and rbase + i < Ms:
                        qr, qc = self.quantize_row(words[i], sr[i] if cfg.rowwise else None, sc if cfg.colwise else None,
                                                   is_bf16)
                        if cutlass.const_expr(cfg.rowwise):
                            cute.autovec_copy(cute.recast_tensor(qr, Uint8), tRow[(i, None)])
                        if cutlass.const_expr(cfg.colwise):
                            cute.autovec_copy(cute.recast_tensor(qc, Uint8), tCol[(i, None)])

    def read_unaligned_row(self, frag, staged, rplan, srow: int, plan: int, once, staged_src, i: int):
        """Unaligned rows: row ``i`` of each staged source (shared-memory row ``srow``, read plan
        ``plan``), realigned into ``frag`` (unaligned.read_row)."""
        for t in range(len(frag)):
            if staged_src[t] and (i == 0 or not once[t]):
                got = ua.read_row(cute.recast_tensor(staged[t][(srow, None)], Uint32), rplan[t][plan])
                fw = cute.recast_tensor(frag[t], Uint32)
                for j in range(PKW):
                    fw[j] = got[j]

    def quantize_row(self, row_words, s_row, sc, is_bf16: bool):
        """One row's FP8 bytes, four per word: (rowwise words, colwise words), each None where the op
        does not write that direction. ``row_words``: its packed values; ``s_row``: its inverse
        row scale; ``sc``: the thread's inverse column scales."""
        cfg = self.cfg
        qr = cute.make_rmem_tensor(cute.make_layout(PKW // 2), Uint32) if cfg.rowwise else None
        qc = cute.make_rmem_tensor(cute.make_layout(PKW // 2), Uint32) if cfg.colwise else None
        for j in range(0, PKW, 2):
            l0, h0 = dev.pk_unpack(row_words[j], is_bf16)
            l1, h1 = dev.pk_unpack(row_words[j + 1], is_bf16)
            if cfg.rowwise:
                qr[j // 2] = dev.fp8x4(dev.mul_rn(l0, s_row), dev.mul_rn(h0, s_row), dev.mul_rn(l1, s_row),
                                       dev.mul_rn(h1, s_row), cfg.fmt.element)
            if cfg.colwise:
                qc[j // 2] = dev.fp8x4(dev.mul_rn(l0, sc[2 * j]), dev.mul_rn(h0, sc[2 * j + 1]),
                                       dev.mul_rn(l1, sc[2 * j + 2]), dev.mul_rn(h1, sc[2 * j + 3]), cfg.fmt.element)
        return qr, qc

    @cute.jit
    def unaligned_row_pass(self, words, sr, sc, dirs, splan, edges, lane, rbase, Ms, ncols, is_bf16: cutlass.Constexpr,
                           aligned_rows: cutlass.Constexpr):
        """Unaligned rows: quantize the thread's rows and store them through unaligned.py, then write
        the parked partial units. ``aligned_rows``: the output rows start on 8-byte boundaries
        (unaligned.store_unit_aligned, only the last tile's tails parked); else realigned
        (unaligned.store_row with ``splan``, heads and tails parked)."""
        cfg = self.cfg
        WARPS = cutlass.const_expr(cfg.packed_warps(True))
        PK_ROWS = cutlass.const_expr(ROWS // WARPS)
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
