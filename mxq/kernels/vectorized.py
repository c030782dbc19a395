"""The vectorised kernel for fp32 inputs: N % 8 == 0 and 16-byte aligned tensors, and (variant
"rows8", ``unaligned``) any N and input alignment whose FP8 output rows start on 8-byte boundaries.

Tiling: a CTA of W warps (KernelConfig.vec_warps) covers KernelConfig.tile_rows rows (32; FP8
block scaling's 128-row colwise blocks and 128x128 tiles 128, W = 16) x 32 * VEC columns. Lane
l of every warp owns the VEC adjacent columns 8l..8l+7 and warp w owns rows w * (rows / W) .. of
the tile. Rowwise: a 32-column block is 4 adjacent lanes, its amax two xor shuffles. Colwise: a
column's rows are spread over the W warps; their partial amax (and dbias sums) meet in shared
memory. 128x128 tiles (two per CTA, lanes 0-15 and 16-31): the column owners' maxima meet per
half-warp and over the owner warps (``tile_scales``), and every row is stored after them. Every
input byte is read from global memory once, all rows' loads first.

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

The kernel body finds the thread's place and the CTA's shared memory (KernelConfig.vec_buffers)
and runs the phases, each a method below with one job: staging (``stage_rows``, or for
unaligned rows ``stage_words`` / ``stage_chunks``), ``load_registers``; then, unless noop, per
row ``read_staged_row``, ``row_values``, ``row_scale`` and ``store_row``; then
``share_partials``, ``column_owners``, ``column_scales`` (128x128 tiles: ``tile_scales``) and
``store_columns``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Int64, Uint8, Uint32

from . import codec
from . import device as dev
from . import grouped
from . import smem as shared
from . import unaligned as ua
from .config import ROWS, VEC
from .packed import (Fields, fp4_column_scale_run, fp4_group_block, fp4_scale_warps, fp4_tile_entries, rec,
                     stage_transposed_block, store_transposed_runs)

VCOLS = 32 * VEC


def grid(cfg, M, N, G=None):
    rows = cute.ceil_div(M, cfg.tile_rows) if G is None else grouped.row_tiles(M, G, cfg.tile_rows)
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
                   unaligned: cutlass.Constexpr = False, rng=None):  # (rng: stochastic rounding's [seed, offset])
        cfg = self.cfg
        GROUPED = cutlass.const_expr(group_ends is not None)
        UNALIGNED = cutlass.const_expr(unaligned)  # (never grouped nor two-halves: KernelConfig.vec_unaligned)
        if cutlass.const_expr(GROUPED and cfg.transposed):
            raise ValueError("mxq: the vectorised kernel's transposed colwise copy takes no groups "
                             "(store_transposed: the tile's rows start at rb * tile_rows)")
        CHUNKS = cutlass.const_expr(unaligned and cfg.vec_unaligned_chunks)
        WARPS = cutlass.const_expr(cfg.vec_warps)
        TILE = cutlass.const_expr(cfg.tile_rows)  # ROWS, or FP8 block scaling's 128-row colwise blocks
        VROWS = cutlass.const_expr(TILE // cfg.vec_warps)  # rows per warp
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
        nvalid = None
        if cutlass.const_expr(UNALIGNED):
            nvalid = N - c0  # this lane's columns that exist (<= 0: none, >= VEC: all, else a partial unit)
        rbase = rb * TILE + warp * VROWS
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
        buf = shared.allocate(cutlass.memory.SmemAllocator(), buffers) if len(buffers) > 0 else {}
        gt = None
        if cutlass.const_expr(GROUPED):
            # row tile rb is one colwise block of a group: rows [gt.row0, gt.row_end) (grouped.py)
            gt = grouped.GroupTile(group_ends, buf.get("group"), rb, M, NOUT, cfg, WARPS * 32)
            rbase = gt.row0 + warp * VROWS
            row_end = gt.row_end
            if cutlass.const_expr(cfg.fmt.global_scale):  # (NVFP4: each group's own amax)
                amax = grouped.group_amax(amax, gt)
        tiles = [cute.zipped_divide(s, (1, VEC)) for s in sources]
        staged = [buf[f"in{t}"] if staged_src[t] else None for t in range(NSRC)]
        sMax, sSum, sInv = self.column_buffers(buf, staged, STAGED)
        tRow, tCol, nbr = None, None, None
        if cutlass.const_expr(cfg.rowwise):
            # (FP4: two values a byte, a two-halves op's half from byte co / 2)
            tRow = cute.zipped_divide(self.op.out_window(row_data, codec.data_cols(cfg.fmt, co)),
                                      (1, codec.data_cols(cfg.fmt, VEC)))
            B = cutlass.const_expr(cfg.fmt.block[1])  # (rowwise blocks per row)
            nbr = NOUT // B + Int32(cutlass.select_(NOUT % B != 0, Int32(1), Int32(0)))
        if cutlass.const_expr(cfg.colwise and not cfg.transposed and not cfg.fp4_columns):
            tCol = cute.zipped_divide(self.op.out_window(col_data, co), (1, VEC))
        whole, part = None, None
        if cutlass.const_expr(UNALIGNED):
            # FP8 rows on unit boundaries: lane l's VEC bytes are one 8-byte unit, its address
            # stepped from row to row; the row's last unit may be partial (whole / part)
            whole = nvalid >= VEC
            part = (nvalid > 0) & (nvalid < VEC)
        # Each phase call gets its own records (Fields.rec) of this body's values (packed.py says why).
        k = Fields(GROUPED=GROUPED, UNALIGNED=UNALIGNED, CHUNKS=CHUNKS, WARPS=WARPS, VROWS=VROWS, NTHREADS=NTHREADS,
                   STAGED=STAGED, use_hw_e8m0=use_hw_e8m0, IN_MAX=codec.input_max(ins[0].element_type),
                   SPLIT_AMAX=self.split_amax())
        at = Fields(tidx=tidx, lane=lane, warp=warp, g=g, c0=c0, col_ok=col_ok, rbase=rbase, row_end=row_end,
                    nvalid=nvalid)
        ga = None
        if cutlass.const_expr(CHUNKS):
            ga = self.stage_chunks(rec(k), rec(at), sources, staged, staged_src, cb, N)
        elif cutlass.const_expr(UNALIGNED):
            self.stage_words(rec(k), rec(at), sources, staged, staged_src, cb, N)
        elif cutlass.const_expr(len(STAGED) > 0):
            self.stage_rows(rec(k), rec(at), sources, staged, staged_src)
        LAZY = cutlass.const_expr(self.lazy_loads())
        frags = self.load_registers(rec(k), rec(at), sources, tiles, once, staged_src, 0, 1 if LAZY else None)
        if noop[0] != Float32(1.0):
            vals = cute.make_rmem_tensor(cute.make_layout(VROWS * VEC), Float32)
            cmax, dsum = self.column_partials(dbias_ws)  # (cmax[VEC]: the thread's amax, split_amax)
            glob = codec.global_scales(cfg.fmt, amax) if cfg.rowwise or cfg.fp4_columns else None  # (NVFP4's, codec.py)
            for i in cutlass.range_constexpr(VROWS):
                row_ok = col_ok and rbase + i < row_end
                frag = frags[0] if cutlass.const_expr(LAZY) else frags[i]
                if cutlass.const_expr(LAZY and i > 0):
                    frag = self.load_registers(rec(k), rec(at), sources, tiles, once, staged_src, i, i + 1, frags[0])[0]
                if cutlass.const_expr(len(STAGED) > 0):
                    self.read_staged_row(rec(k), rec(at), i, row_ok, frag, ga, staged, staged_src)
                self.row_values(rec(k), rec(at), i, row_ok, frag, vals, cmax, dsum, scalars, ins[0].element_type)
                if cutlass.const_expr(cfg.rowwise and not cfg.tiles and not cfg.fp4_tiles):  # (tiles: after their scale)
                    if cutlass.const_expr(UNALIGNED and i == 0):
                        out_row = ua.row_base(row_data, rbase, c0)  # (unaligned: row i's units at row_at(out_row, i))
                    er, sr = self.row_scale(vals, i, use_hw_e8m0, codec.input_max(ins[0].element_type), glob)
                    pair, rand = self.sr_row_rand(i, rbase, g, N, rng, pair if i % 2 else None)
                    self.store_row(rec(k), rec(at, co=co, nbr=nbr, gt=gt, whole=whole, part=part, M=M), i, row_ok, vals,
                                   er, sr, out_row if UNALIGNED else None, tRow, row_scale, rand)
            if cutlass.const_expr(cfg.col_reduce):
                # colwise: the warps' partial column amax (and dbias sums) meet in shared memory
                self.share_partials(rec(k), rec(at), cmax, dsum, sMax, sSum)
                self.column_owners(rec(k), rec(at, cb=cb, rb=rb, co=co, gt=gt, NOUT=NOUT, M=M, N=N), sMax, sSum, sInv,
                                   col_scale, dbias_ws, amax, cmax)
            sc = None
            if cutlass.const_expr(cfg.fp4_tiles and (cfg.rowwise or cfg.colwise)):  # (not the amax pass)
                # NVFP4's 16x16 tiles: one multiplier for the thread's 8 x 8 values, both copies
                sc = self.fp4_tile_scales(rec(k), rec(at, rb=rb, cb=cb, co=co, nbr=nbr, gt=gt, M=M, N=N), sMax, row_scale,
                                          col_scale, glob)
                if cutlass.const_expr(cfg.rowwise):
                    self.store_fp4_rows(rec(k), rec(at, co=co, N=N), vals, sc[0], tRow, rng)
                if cutlass.const_expr(cfg.colwise):
                    self.store_fp4_columns(rec(k), rec(at, co=co, M=M), vals, sc, col_data, rng)
            elif cutlass.const_expr(cfg.fp4_columns):
                # FP4's transposed colwise copy: each thread's 8 rows of a column are one word of codes
                sc = self.fp4_column_scales(rec(k), rec(at, rb=rb, co=co, gt=gt, M=M, N=N), sMax, col_scale,
                                            codec.global_scales(cfg.fmt, amax, colwise=True, glob=glob))
                self.store_fp4_columns(rec(k), rec(at, co=co, M=M), vals, sc, col_data, rng)
            elif cutlass.const_expr(cfg.tiles):
                # one multiplier per 128x128 tile serves every row and column of it
                sc = self.tile_scales(rec(k), rec(at, cb=cb, rb=rb, co=co, gt=gt, M=M, N=N, NOUT=NOUT), sInv, row_scale,
                                      col_scale)
                if cutlass.const_expr(cfg.rowwise):
                    self.store_columns(rec(k), rec(at), vals, sc, row_data, tRow)
            elif cutlass.const_expr(cfg.colwise):
                sc = self.column_scales(rec(at), sInv)
            if cutlass.const_expr(cfg.transposed):
                self.store_transposed(rec(k), rec(at, co=co, cb=cb, rb=rb, M=M, N=N, smem=buf), vals, sc, col_data)
            elif cutlass.const_expr(cfg.colwise and not cfg.fp4_columns):
                self.store_columns(rec(k), rec(at, whole=whole, part=part), vals, sc, col_data, tCol)
        if cutlass.const_expr(len(STAGED) > 0):
            cute.arch.cp_async_wait_group(0)  # (under noop nothing above waited for the staged copies)

    def column_buffers(self, buf, staged, STAGED):
        """The column reduction's shared memory (sMax, sSum, sInv; None where the op has none),
        indexed k * 32 + lane for column k of lane (a warp's accesses touch 32 consecutive words,
        no bank conflicts). sMax and sSum reuse the staged inputs' memory, which is dead once
        every row has been read back (a barrier in between), so a CTA needs no more than that."""
        cfg = self.cfg
        WARPS = cfg.vec_warps
        sMax, sSum, sInv = None, None, None
        if cfg.col_reduce:
            if len(STAGED) >= 1:
                sMax = cute.make_tensor(staged[STAGED[0]].iterator, cute.make_layout((WARPS, VCOLS), stride=(VCOLS, 1)))
            else:
                sMax = buf["max"]
            if cfg.dbias:
                if len(STAGED) >= 2:
                    sSum = cute.make_tensor(cute.recast_ptr(staged[STAGED[1]].iterator, dtype=Float64),
                                            cute.make_layout((WARPS, VCOLS), stride=(VCOLS, 1)))
                else:
                    sSum = buf["sum"]
            if (cfg.colwise and not cfg.fp4_columns) or cfg.tiles:
                sInv = buf["inv"]  # the columns' inverse scales (128x128 tiles: the owner warps' tile maxima)
        return sMax, sSum, sInv

    # -- loads -------------------------------------------------------------------------------
    def stage_chunks(self, k, t, sources, staged, staged_src, cb, N):
        """Unaligned rows, chunks form: the 16-byte chunks covering each warp's row segments,
        copied as the 16-bit unaligned rows are (unaligned.stage_row). Returns each source's
        row addresses (read_staged_row realigns from them)."""
        ga = [ua.row_base(sources[s], t.rbase, cb * VCOLS) for s in range(len(sources))]
        ncols = cutlass.min(N - cb * VCOLS, VCOLS)
        for i in range(k.VROWS):
            for s in range(len(sources)):
                if staged_src[s]:
                    a = ua.row_at(ga[s], i)
                    ua.stage_row(Float32, staged[s][(t.warp * k.VROWS + i, None)], a, ua.chunk_misalignment(a), ncols,
                                 t.lane, t.rbase + i < t.row_end)
            cute.arch.cp_async_commit_group()
        return ga

    def stage_words(self, k, t, sources, staged, staged_src, cb, N):
        """Unaligned rows, words form: each warp's row segments word by word
        (unaligned.stage_words), given which of lane l's words (columns cb * VCOLS + l + 32k)
        and pairs (+ 2l + 64k) exist."""
        ccol = cb * VCOLS + t.lane
        cvalid = [ccol + 32 * c < N for c in range(VEC)]
        pbytes = [cutlass.max(cutlass.min(N - (cb * VCOLS + 2 * t.lane + 64 * c), 2), 0) * 4 for c in range(VEC // 2)]
        src_rows = [ua.row_base(s, t.rbase, ccol) for s in sources]
        for i in range(k.VROWS):
            rok = t.rbase + i < t.row_end
            for s in range(len(sources)):
                if staged_src[s]:
                    ua.stage_words(staged[s].iterator + (i * k.NTHREADS * VEC + t.warp * VCOLS),
                                   ua.row_at(src_rows[s], i), t.lane, rok, cvalid, pbytes)
            cute.arch.cp_async_commit_group()

    @cute.jit
    def stage_rows(self, k, t, sources, staged, staged_src):
        """Aligned rows (KernelConfig.vec_stage): every row of every staged source requested at
        once with cp.async, 16 bytes per copy, into this thread's own slots."""
        NSRC = cutlass.const_expr(len(sources))
        g2s = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL),
                                  Float32, num_bits_per_copy=128)
        for i in cutlass.range_constexpr(k.VROWS):
            if t.col_ok and t.rbase + i < t.row_end:
                for s in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(staged_src[s]):
                        for h in cutlass.range_constexpr(VEC // 4):  # 16-byte copies of 4 values
                            cute.copy(g2s, cute.local_tile(sources[s], (1, 4), (t.rbase + i, t.g * (VEC // 4) + h))[(0, None)],
                                      cute.local_tile(staged[s][(i, t.tidx, 0, None)], (4,), (h,)))
            cute.arch.cp_async_commit_group()

    def lazy_loads(self) -> bool:
        """Each row's inputs are loaded just before the row is computed, not all rows' first: a
        two-halves op on 8-row threads (the 128-row tile, FP4's colwise copy), whose three
        full-size sources (the incoming gradient and both halves of the act input) held for every
        row need 192 registers: of the 128 a 512-thread CTA may take, ptxas spilled 0.7-2.8 KB a
        thread; FP4's 128-thread CTAs took 214-245 registers (2 CTAs an SM) without spills."""
        cfg = self.cfg
        return cfg.halves and cfg.tile_rows // cfg.vec_warps == VEC

    @cute.jit
    def load_registers(self, k, t, sources, tiles, once, staged_src, lo: cutlass.Constexpr = 0,
                       hi: cutlass.Constexpr = None, row0=None):
        """All loads first: VROWS independent 16-byte loads per unstaged source in flight per
        thread (staged sources: read back by read_staged_row). frags[i][s]: row i of source s.
        ``lo``, ``hi`` (lazy_loads): rows lo..hi - 1 only (frags[0] is row lo), ``row0`` row 0's
        fragments, which row operands (loaded once) reuse."""
        NSRC = cutlass.const_expr(len(sources))
        frags = []
        for i in cutlass.range_constexpr(lo, k.VROWS if hi is None else hi):
            row = []
            for s in cutlass.range_constexpr(NSRC):
                if cutlass.const_expr(i > 0 and once[s]):
                    row.append(frags[0][s] if cutlass.const_expr(row0 is None) else row0[s])
                else:
                    row.append(cute.make_rmem_tensor_like(tiles[s][(None, (0, 0))]))
                    row[s].fill(0)
            frags.append(row)
            if t.col_ok and t.rbase + i < t.row_end:
                for s in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(not staged_src[s] and (i == 0 or not once[s])):
                        self.load_row(k.UNALIGNED and once[s], dev.broadcast_cols(sources[s]),
                                      tiles[s][(None, (t.rbase + i, t.g))], t.nvalid, row[s])
        return frags

    @cute.jit
    def load_row(self, operand: cutlass.Constexpr, scalar: cutlass.Constexpr, src, nvalid, frag):
        """One row of an unstaged source into ``frag``. Unaligned rows (``operand``): a scalar's
        one element, loaded once, or a row operand's ([N]) columns that exist, one load each."""
        if cutlass.const_expr(operand and scalar):
            one = src[0]
            for c in cutlass.range_constexpr(VEC):
                frag[c] = one
        elif cutlass.const_expr(operand):
            for c in cutlass.range_constexpr(VEC):
                if c < nvalid:
                    frag[c] = src[c]
        else:
            cute.autovec_copy(src, frag)

    @cute.jit
    def read_staged_row(self, k, t, i: cutlass.Constexpr, row_ok, frag, ga, staged, staged_src):
        """Row i of the staged sources into its fragments ``frag``, once its copies have landed."""
        NSRC = cutlass.const_expr(len(frag))
        cute.arch.cp_async_wait_group(k.VROWS - 1 - i)  # row i's copies have landed ...
        if cutlass.const_expr(k.UNALIGNED):
            cute.arch.sync_warp()  # ... in every lane of the warp (they copied each other's columns)
        if cutlass.const_expr(k.CHUNKS):
            if t.rbase + i < t.row_end:
                for s in cutlass.range_constexpr(NSRC):
                    if cutlass.const_expr(staged_src[s]):
                        ua.read_chunked_words(staged[s][(t.warp * k.VROWS + i, None)], ua.row_at(ga[s], i), t.lane,
                                              frag[s])
        elif cutlass.const_expr(k.UNALIGNED):
            for s in cutlass.range_constexpr(NSRC):  # (zeros where no row or column: no branch)
                if cutlass.const_expr(staged_src[s]):
                    ua.read_words(staged[s].iterator + (i * k.NTHREADS * VEC + t.warp * VCOLS), t.lane, frag[s])
        elif row_ok:
            for s in cutlass.range_constexpr(NSRC):
                if cutlass.const_expr(staged_src[s]):
                    cute.autovec_copy(staged[s][(i, t.tidx, None, None)], frag[s])

    # -- values --------------------------------------------------------------------------------
    def split_amax(self) -> bool:
        """The column maxima drop NaN (FP8 block scaling's colwise scales, codec.column_max_nan)
        while the tensor amax keeps it: each thread then also keeps its own NaN-propagating
        maximum (column_partials' last entry), one atomic per warp."""
        cfg = self.cfg
        return cfg.amax and codec.column_max_nan(cfg) != codec.amax_nan(cfg.fmt)

    def column_partials(self, dbias_ws):
        """The thread's column maxima (and its amax, split_amax) and dbias sums (None where the op
        has none), zeroed."""
        cfg = self.cfg
        cmax, dsum = None, None
        if cfg.col_reduce:
            cmax = cute.make_rmem_tensor(cute.make_layout(VEC + int(self.split_amax())), Float32)
            cmax.fill(0.0)
        if cfg.dbias:
            # the block's partial sums in the workspace's precision (numerics.dbias_partial_dtype)
            dsum = cute.make_rmem_tensor(cute.make_layout(VEC), dbias_ws.element_type)
            dsum.fill(0.0)
        return cmax, dsum

    def row_values(self, k, t, i: int, row_ok, frag, vals, cmax, dsum, scalars, in_type):
        """Row i's VEC values (the op, rounded to the input's type) into ``vals``; the thread's
        column maxima and dbias sums updated."""
        cfg = self.cfg
        for c in range(VEC):
            v = self.op.value(frag, c, scalars, _widen)
            if cfg.computed or k.CHUNKS:
                ok = row_ok
                if k.UNALIGNED:
                    ok = row_ok & (t.nvalid > c)
                # rows past M and their act(0) do not count; unaligned rows: nor columns past N
                # (chunks: the neighbouring bytes a staged chunk holds)
                v = Float32(cutlass.select_(ok, v, Float32(0.0)))
            if cfg.dbias:
                dsum[c] = dsum[c] + v.to(Float64)
            v = self.op.round_to_input(v, in_type)
            vals[i * VEC + c] = v
            if cfg.col_reduce:  # (NaN-dropping for NVFP4's amax and FP8 block scaling's colwise scales)
                cmax[c] = cute.arch.fmax(cmax[c], cute.math.abs(v), nan=codec.column_max_nan(cfg))
                if cutlass.const_expr(k.SPLIT_AMAX):
                    cmax[VEC] = cute.arch.fmax(cmax[VEC], cute.math.abs(v), nan=True)

    # -- rowwise -------------------------------------------------------------------------------
    def row_scale(self, vals, i: int, use_hw_e8m0, in_max: float, glob=None):
        """Row i's block scale and its multiplier: the block is adjacent lanes (2 for 16 columns,
        4 for 32, 16 for 128; codec.block_lanes), NaN-dropping where the format says
        (codec.block_amax_nan). ``in_max``: the input type's largest finite value; ``glob``:
        NVFP4's per-tensor values (codec.block_scale, codec.global_scales)."""
        fmt = self.cfg.fmt
        nan = codec.block_amax_nan(fmt)
        ramax = Float32(0.0)
        for c in range(VEC):
            ramax = cute.arch.fmax(ramax, cute.math.abs(vals[i * VEC + c]), nan=nan)
        for st in range(codec.block_lanes(fmt, VEC).bit_length() - 1):
            ramax = cute.arch.fmax(ramax, cute.arch.shuffle_sync_bfly(ramax, offset=1 << st), nan=nan)
        er = codec.block_scale(fmt, ramax, use_hw_e8m0, in_max, glob)
        return er, codec.multiplier(fmt, er, glob)

    @cute.jit
    def store_row(self, k, t, i: cutlass.Constexpr, row_ok, vals, er, sr, out_row, tRow, row_scale, rand=None):
        """Row i's FP8 values and (lanes 4j) its block's scale byte (``rand``: stochastic rounding's
        two random words of the row's 8 values; FP4 with ``row_scale`` None: the values alone, their
        scales stored elsewhere, fp4_tile_scales)."""
        cfg = self.cfg
        if cutlass.const_expr(k.UNALIGNED):
            self.store_unit_row(ua.row_at(out_row, i), vals, i, [sr] * VEC, row_ok, t.whole, t.part, t.nvalid)
            if row_ok and t.lane % codec.block_lanes(cfg.fmt, VEC) == 0:
                codec.store_row_scale(cfg, row_scale, codec.row_scale_offset(cfg.fmt, t.rbase + i, t.c0 // cfg.fmt.block[1],
                                                                             t.nbr, t.M), er)
        elif cutlass.const_expr(cfg.fmt.packed):
            if row_ok:  # FP4: the row's eight E2M1 codes as one word
                qw = cute.make_rmem_tensor(cute.make_layout((1,), stride=(1,)), Uint32)
                qw[0] = codec.encode8(cfg.fmt, [dev.mul_rn(vals[i * VEC + c], sr) for c in range(VEC)], k.use_hw_e8m0,
                                      rand)
                cute.autovec_copy(cute.recast_tensor(qw, Uint8), tRow[(None, (t.rbase + i, t.g))])
                if cutlass.const_expr(row_scale is not None):
                    if t.lane % codec.block_lanes(cfg.fmt, VEC) == 0:
                        codec.store_row_scale(cfg, row_scale, self.row_scale_offset(k, t, t.rbase + i), er)
        elif row_ok:
            qr = cute.make_rmem_tensor_like(tRow[(None, (0, 0))])
            for c in cutlass.range_constexpr(0, VEC, 2):
                lo, hi = codec.encode2(cfg.fmt, dev.mul_rn(vals[i * VEC + c], sr), dev.mul_rn(vals[i * VEC + c + 1], sr))
                qr[c] = lo
                qr[c + 1] = hi
            cute.autovec_copy(qr, tRow[(None, (t.rbase + i, t.g))])
            if t.lane % codec.block_lanes(cfg.fmt, VEC) == 0:
                codec.store_row_scale(cfg, row_scale, self.row_scale_offset(k, t, t.rbase + i), er)

    def row_scale_offset(self, k, t, r):
        """The row-scale byte offset of row ``r``'s block of this lane's columns."""
        cfg = self.cfg
        if k.GROUPED:
            blk = self.op.out_col(t.co, t.c0) // cfg.fmt.block[1]
            return codec.group_row_scale_offset(cfg.fmt, t.gt, r, blk, t.nbr)
        if cfg.fmt.layout == "gemm":
            return codec.row_scale_offset(cfg.fmt, r, (t.co + t.c0) // cfg.fmt.block[1], t.nbr, t.M)
        if cfg.fmt.swizzled:
            return dev.swizzle_offset(r, (t.co + t.c0) // cfg.fmt.block[1], t.nbr)
        return r * t.nbr + (t.co + t.c0) // cfg.fmt.block[1]  # (this order of operations: MXFP8's PTX)

    # -- colwise -------------------------------------------------------------------------------
    def share_partials(self, k, t, cmax, dsum, sMax, sSum):
        """The thread's column maxima (and dbias sums) to shared memory, for the column owners."""
        if len(k.STAGED) > 0:
            cute.arch.sync_threads()  # every thread has read its staged rows back (sMax reuses them)
        for c in range(VEC):
            sMax[t.warp, c * 32 + t.lane] = cmax[c]
            if self.cfg.dbias:
                sSum[t.warp, c * 32 + t.lane] = dsum[c]
        cute.arch.sync_threads()

    @cute.jit
    def column_owners(self, k, t, sMax, sSum, sInv, col_scale, dbias_ws, amax, cmax):
        """Column owners: each of the CTA's VCOLS columns is reduced over the warps, turned into
        its scale and stored by one thread, not by every warp for its own lane's columns;
        likewise its dbias sum, and the amax (one atomic per warp; split_amax: every warp's, of its
        threads' own maxima ``cmax[VEC]``)."""
        cfg = self.cfg
        OWN_AMAX = cutlass.const_expr(cfg.amax and not k.SPLIT_AMAX)
        if cutlass.const_expr(k.SPLIT_AMAX):
            tm = dev.warp_max(cmax[VEC])
            if t.lane == 0:
                dev.amax_atomic(amax, tm)  # (every warp: each its threads' NaN-propagating maximum)
        if cutlass.const_expr(OWN_AMAX):
            tm = Float32(0.0)
        for r in cutlass.range_constexpr(max(1, VCOLS // k.NTHREADS)):
            p = t.tidx + r * k.NTHREADS  # position c * 32 + l: column l * VEC + c of the tile
            if cutlass.const_expr(k.NTHREADS > VCOLS):  # (a 128-row tile: threads past the columns
                p = cutlass.min(p, Int32(VCOLS - 1))  # read the last one's and store nothing)
            c = t.cb * VCOLS + (p % 32) * VEC + p // 32
            if cutlass.const_expr(k.NTHREADS > VCOLS):
                c = Int32(cutlass.select_(t.tidx < VCOLS, c, t.N))
            m = sMax[0, p]
            for w in cutlass.range_constexpr(1, k.WARPS):
                m = cute.arch.fmax(m, sMax[w, p], nan=codec.column_max_nan(cfg))
            if cutlass.const_expr(OWN_AMAX):
                tm = cute.arch.fmax(tm, m, nan=codec.amax_nan(cfg.fmt))
            if cutlass.const_expr(cfg.tiles):
                # the column's tile (lanes 0-15 of an owner warp: tile 0, 16-31: tile 1) maximum over
                # the warp's 16 columns, NaN-dropping (column_max_nan); tile_scales reduces the warps'
                tm16 = m
                for st in cutlass.range_constexpr(4):
                    tm16 = cute.arch.fmax(tm16, cute.arch.shuffle_sync_bfly(tm16, offset=1 << st))
                if t.tidx < VCOLS and t.lane % 16 == 0:
                    sInv[t.warp * 2 + t.lane // 16] = tm16
            elif cutlass.const_expr(cfg.colwise and not cfg.fp4_columns):  # (FP4's: fp4_column_scales)
                e = codec.block_scale(cfg.fmt, m, k.use_hw_e8m0, k.IN_MAX if cfg.fmt.scale == "fp32" else None)
                sInv[p] = codec.multiplier(cfg.fmt, e)  # (threads past a 128-row tile's columns: the last one's, alike)
                if c < t.N:
                    self.put_col_scale(k.GROUPED, t.gt, col_scale, c, e, t.rb, t.co, t.M, t.NOUT)
            if cutlass.const_expr(cfg.dbias):
                sm = sSum[0, p]
                for w in cutlass.range_constexpr(1, k.WARPS):
                    sm = sm + sSum[w, p]  # fixed order: deterministic
                if c < t.N:
                    dbias_ws[t.rb, t.co + c] = sm
        if cutlass.const_expr(OWN_AMAX):
            tm = dev.warp_max(tm)
            if t.lane == 0:
                dev.amax_atomic(amax, tm)  # one atomic per warp

    @cute.jit
    def put_col_scale(self, grouped_: cutlass.Constexpr, gt, col_scale, c, e, rb, co, M, NOUT):
        """Column c's scale ``e``: a grouped tile with no rows writes none (swizzled) or its scale
        row's zeros (compact; FP8 block scaling's fp32 scales 0.0, codec.put_col_scale)."""
        cfg = self.cfg
        if cutlass.const_expr(grouped_ and cfg.fmt.scale == "fp32"):
            codec.put_col_scale(cfg.fmt, col_scale, gt, self.op.out_col(co, c), rb, M, NOUT, e, gt.row_end <= gt.row0)
        elif cutlass.const_expr(grouped_ and cfg.fmt.swizzled):
            if gt.row_end > gt.row0:
                col_scale[codec.group_col_scale_offset(gt, self.op.out_col(co, c))] = Uint8(e)
        elif cutlass.const_expr(grouped_):
            col_scale[rb * NOUT + self.op.out_col(co, c)] = Uint8(cutlass.select_(gt.row_end > gt.row0, e, Int32(0)))
        else:
            codec.put_col_scale(cfg.fmt, col_scale, None, co + c, rb, M, NOUT, e)

    @cute.jit
    def tile_scales(self, k, t, sTile, row_scale, col_scale):
        """The multipliers of the thread's 128x128 tile (h = lane // 16, columns 128h.. of the CTA's
        VCOLS), as VEC copies: the owner warps' tile maxima (column_owners) reduced, NaN-dropping,
        TransformerEngine's rule (codec.block_scale); lanes 0 and 16 of warp 0 store tile h's 1 /
        scale in each direction's layout (codec.tile_scale_offset: compact, one [mb, nb] grid for
        both; GEMM-ready, padded); a two-halves op's half at tile column co / 128 of outputs NOUT
        wide (N % 128 == 0: limits.n_multiple). A grouped tile with no rows stores 0.0 (the rows
        between groups of the grouped buffers, grouped.py)."""
        cfg = self.cfg
        cute.arch.sync_threads()
        h = t.lane // 16
        amax = sTile[h]
        for w in cutlass.range_constexpr(1, VCOLS // 32):
            amax = cute.arch.fmax(amax, sTile[w * 2 + h])
        e = codec.block_scale(cfg.fmt, amax, k.use_hw_e8m0, k.IN_MAX)
        blk = t.cb * (VCOLS // 128) + h  # (of this half)
        inside = blk < (t.N + 127) // 128
        blk = self.op.out_col(t.co // 128, blk)
        mb, nb = (t.M + 127) // 128, (t.NOUT + 127) // 128
        d = codec.dequantization_scale(e)
        if cutlass.const_expr(k.GROUPED):
            d = Float32(cutlass.select_(t.gt.row_end > t.gt.row0, d, Float32(0.0)))
        if t.warp == 0 and t.lane % 16 == 0 and inside:
            if cutlass.const_expr(cfg.rowwise):
                row_scale[codec.tile_scale_offset(cfg.fmt, t.rb, blk, mb, nb, False)] = d
            if cutlass.const_expr(cfg.colwise):
                col_scale[codec.tile_scale_offset(cfg.fmt, t.rb, blk, mb, nb, True)] = d
        sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        for c in cutlass.range_constexpr(VEC):
            sc[c] = codec.multiplier(cfg.fmt, e)
        return sc

    def column_scales(self, t, sInv):
        """The thread's VEC inverse column scales, once the owners have written them."""
        cute.arch.sync_threads()
        sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        for c in range(VEC):
            sc[c] = sInv[c * 32 + t.lane]
        return sc

    @cute.jit
    def store_columns(self, k, t, vals, sc, col_data, tCol):
        """Every row's colwise FP8 values."""
        cfg = self.cfg
        if cutlass.const_expr(k.UNALIGNED):
            out_col = ua.row_base(col_data, t.rbase, t.c0)
            for i in cutlass.range_constexpr(k.VROWS):
                self.store_unit_row(ua.row_at(out_col, i), vals, i, sc, t.col_ok and t.rbase + i < t.row_end,
                                    t.whole, t.part, t.nvalid)
        for i in cutlass.range_constexpr(0 if k.UNALIGNED else k.VROWS):
            if t.col_ok and t.rbase + i < t.row_end:
                qc = cute.make_rmem_tensor_like(tCol[(None, (0, 0))])
                for c in cutlass.range_constexpr(0, VEC, 2):
                    lo, hi = codec.encode2(cfg.fmt, dev.mul_rn(vals[i * VEC + c], sc[c]),
                                           dev.mul_rn(vals[i * VEC + c + 1], sc[c + 1]))
                    qc[c] = lo
                    qc[c + 1] = hi
                cute.autovec_copy(qc, tCol[(None, (t.rbase + i, t.g))])

    @cute.jit
    def store_transposed(self, k, t, vals, sc, col_data):
        """The transposed colwise copy (KernelConfig.transposed: [N, M], FP8 block scaling's
        GEMM-ready layout), as the packed kernel writes it: the thread's 8 x 8 block of FP8 bytes
        (rows rbase.., columns c0..) transposed in registers (device.transpose8x8), staged in
        shared memory ("tr": packed.stage_transposed_block), and after one barrier stored as
        16-byte runs of output rows (packed.store_transposed_runs). The copy is never grouped
        (FP8 block scaling's GEMM-ready layout takes no groups), so the tile's rows start at
        rb * 128."""
        fmt = self.cfg.fmt
        rows = []
        for i in cutlass.range_constexpr(VEC):  # (VROWS == VEC: the 128-row tile's 16 warps of 8 rows)
            q = [dev.mul_rn(vals[i * VEC + c], sc[c]) for c in range(VEC)]
            rows.append([codec.encode4(fmt, q[0], q[1], q[2], q[3]), codec.encode4(fmt, q[4], q[5], q[6], q[7])])
        sT = t.smem["tr"]
        stage_transposed_block(sT, t.lane, t.warp, dev.transpose8x8(rows))
        cute.arch.sync_threads()
        store_transposed_runs(sT, col_data, t.M, t.N, t.row_end, t.tidx, k.NTHREADS, t.cb, t.rb * self.cfg.tile_rows,
                              t.co, self.op)

    # -- FP4's transposed colwise copy ([N, M/2], blocks along M: NVFP4's 16 rows, MXFP4's 32) ---------
    @cute.jit
    def fp4_column_scales(self, k, t, sMax, col_scale, glob):
        """The scales of the thread's 8 columns over the rows of its block, from the column maxima
        the block's warps left in sMax (packed.fp4_scale_warps: NVFP4's 16-row block two 8-row
        warps, MXFP4's 32-row block four; NVFP4 drops NaN, MXFP4 propagates it: scale 255,
        codec.block_amax_nan), stored by the block's first warp (compact [N, ceil(M/B)] or its
        swizzled atoms, packed.fp4_column_scale_run; a two-halves op's half from row co; grouped:
        [N, M // B + G], the group's blocks from column start // B + g, packed.fp4_group_block),
        and the 8 multipliers. ``glob``: NVFP4's per-tensor values (codec.global_scales)."""
        cfg = self.cfg
        NAN = cutlass.const_expr(codec.block_amax_nan(cfg.fmt))
        B = cutlass.const_expr(cfg.fmt.col_block[0])
        w0, WPB = fp4_scale_warps(t.warp, k.VROWS, B)
        if cutlass.const_expr(k.GROUPED):
            nbm = t.M // B + t.gt.G
            blk = fp4_group_block(t.gt.start, t.gt.g, t.gt.b, cfg.tile_rows, w0, k.VROWS, B)
            brow = t.gt.row0 + w0 * k.VROWS  # (the block's first row; a tile with no rows: none below row_end)
        else:
            nbm = (t.M + B - 1) // B
            blk = (t.rb * cfg.tile_rows + w0 * k.VROWS) // B
            brow = blk * B
        off0, step = fp4_column_scale_run(cfg.fmt.swizzled, self.op.out_col(t.co, t.c0), blk, nbm)
        sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        for c in cutlass.range_constexpr(VEC):
            m = sMax[w0, c * 32 + t.lane]
            for w in cutlass.range_constexpr(1, WPB):
                m = cute.arch.fmax(m, sMax[w0 + w, c * 32 + t.lane], nan=NAN)
            if cutlass.const_expr(not NAN):  # (NVFP4: a column of NaN alone has amax 0)
                m = cute.arch.fmax(m, Float32(0.0))
            e = codec.block_scale(cfg.fmt, m, k.use_hw_e8m0, glob=glob)
            sc[c] = codec.multiplier(cfg.fmt, e, glob)
            if t.warp == w0 and t.c0 + c < t.N and brow < t.row_end:
                col_scale[off0 + c * step] = Uint8(e)
        return sc

    @cute.jit
    def fp4_tile_scales(self, k, t, sMax, row_scale, col_scale, glob):
        """NVFP4's 16x16 tiles (block_2d): the thread's tile is rows w0 * 8 .. of the CTA (the two
        8-row warps w0, w0 + 1 of packed.fp4_scale_warps) and the columns of lanes 2q, 2q + 1
        (lane ^ 1). Its amax (NaN dropped; rows past M are zeros) is both warps' column maxima
        of the thread's columns in sMax (share_partials) and the partner lane's, one shuffle; its
        E4M3 scale is stored in each of its rows' rowwise entries (each of the two lanes half the
        thread's rows) and each of its columns' colwise entries (each of the two warps half the
        thread's columns: packed.fp4_tile_entries). Returns the tile's multiplier,
        VEC copies."""
        cfg = self.cfg
        B = cutlass.const_expr(cfg.fmt.block[0])  # (16)
        w0, WPB = fp4_scale_warps(t.warp, k.VROWS, B)
        a = Float32(0.0)
        for w in cutlass.range_constexpr(WPB):
            for c in cutlass.range_constexpr(VEC):
                a = cute.arch.fmax(a, sMax[w0 + w, c * 32 + t.lane])
        a = cute.arch.fmax(a, cute.arch.shuffle_sync_bfly(a, offset=1))  # (the tile's other 8 columns)
        e = codec.block_scale(cfg.fmt, a, k.use_hw_e8m0, glob=glob)
        r0, c1 = fp4_tile_entries(t.warp, t.lane, t.rb, t.cb, cfg.tile_rows, k.VROWS, B)
        if cutlass.const_expr(cfg.rowwise):
            for i in cutlass.range_constexpr(k.VROWS // 2):
                if t.col_ok and r0 + i < t.row_end:
                    codec.store_row_scale(cfg, row_scale, self.row_scale_offset(k, t, r0 + i), e)
        if cutlass.const_expr(cfg.colwise):
            nbm = (t.M + B - 1) // B
            blk = (t.rb * cfg.tile_rows + w0 * k.VROWS) // B
            for q in cutlass.range_constexpr(VEC // WPB):
                if c1 + q < t.N and blk * B < t.row_end:
                    col_scale[dev.scale_offset(cfg.fmt.swizzled, c1 + q, blk, nbm)] = Uint8(e)
        sc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
        for c in cutlass.range_constexpr(VEC):
            sc[c] = codec.multiplier(cfg.fmt, e, glob)
        return sc

    @cute.jit
    def store_fp4_rows(self, k, t, vals, mult, tRow, rng=None):
        """Every row's 8 values times ``mult`` (16x16 tiles: their scales stored by
        fp4_tile_scales) through store_row; stochastic rounding: sr_row_rand's words."""
        pair = None
        for i in cutlass.range_constexpr(k.VROWS):
            pair, rand = self.sr_row_rand(i, t.rbase, t.g, t.N, rng, pair)
            self.store_row(k, t, i, t.col_ok and t.rbase + i < t.row_end, vals, None, mult, None, tRow, None, rand)

    @staticmethod
    def sr_row_rand(i: int, rbase, g, N, rng, pair):
        """Stochastic rounding's (``rng``: int64 [seed, offset]; None: none) two random words of
        row i's 8 values, as (the pair of rows' words, row i's): drawn two rows at a time at even i
        (device.sr_row_words; every lane of the warp draws: neighbour lanes exchange), ``pair``
        the words drawn at i - 1 for odd i."""
        if rng is None:
            return None, None
        if i % 2 == 0:
            pair = dev.sr_row_words(rbase + i, g, N // 4, rng[0], rng[1])
        return pair, pair[2 * (i % 2):2 * (i % 2) + 2]

    @cute.jit
    def store_fp4_columns(self, k, t, vals, sc, col_data, rng=None):
        """The thread's 8 rows of each of its 8 columns as one word of E2M1 codes (row rbase + i
        in bits 4i..4i+3: codec.encode8's order, two rows a byte) at byte rbase / 2 of output row
        c0 + c of the [N, M/2] copy: M % 8 == 0 (limits.fp4_unserved), so a thread's rows all
        exist or none and every word is 4-byte aligned; grouped, the group's first row any even
        row: the word's 4 bytes one at a time, each below the group's end (its rows are another
        group's past it; the ends are even, so a byte's two rows share a group). Stochastic
        rounding (``rng``, ungrouped): each
        column's words of the thread's 8 rows, half of its 16-row group's four
        (device.sr_col_group, from the group's first row rbase - 8 p, p the warp's parity; one
        Philox per column where the groups start on a counter, device.sr_col_aligned, else two)."""
        fmt = self.cfg.fmt
        if t.col_ok and t.rbase < t.row_end:
            out = ua.row_base(col_data, self.op.out_col(t.co, t.c0), t.rbase // 2)  # (two halves: from row co)
            if cutlass.const_expr(rng is not None):
                odd = (t.warp % 2) == 1
                aligned = dev.sr_col_aligned(t.M // 4, rng[1])
            for c in cutlass.range_constexpr(VEC):
                rand = None
                if cutlass.const_expr(rng is not None):
                    args = (t.c0 + c, t.rbase - 8 * (t.warp % 2), t.M // 4, rng[0], rng[1])
                    w4 = dev.RNG_DEVICE.when(aligned, 4, lambda: dev.sr_col_group(*args),
                                             lambda: dev.sr_col_group(*args, straddle=True))
                    rand = [Uint32(cutlass.select_(odd, w4[2 + h], w4[h])) for h in range(2)]
                w = codec.encode8(fmt, [dev.mul_rn(vals[i * VEC + c], sc[c]) for i in range(k.VROWS)], k.use_hw_e8m0,
                                  rand)
                if cutlass.const_expr(k.GROUPED):
                    for j in cutlass.range_constexpr(VEC // 2):
                        if t.rbase + 2 * j < t.row_end:
                            dev.store_global_u8(ua.row_at(out, c) + Int64(j), w >> Uint32(8 * j))
                else:
                    dev.store_global_words(ua.row_at(out, c), [w])

    def store_unit_row(self, p, vals, i: int, inv, ok, whole, part, nvalid):
        """Unaligned rows: row i's VEC values times their inverse scales ``inv`` as one FP8 unit
        at byte address ``p`` (a multiple of 8), when the row exists (``ok``)."""
        q = [dev.mul_rn(vals[i * VEC + k], inv[k]) for k in range(VEC)]
        d0 = codec.encode4(self.cfg.fmt, q[0], q[1], q[2], q[3])
        d1 = codec.encode4(self.cfg.fmt, q[4], q[5], q[6], q[7])
        ua.store_unit_or_prefix(p, d0, d1, ok & whole, ok & part, nvalid)
