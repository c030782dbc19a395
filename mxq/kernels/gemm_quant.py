"""The sm_90 GEMM's fused epilogue (``op.gemm``): the op's epilogue and act on the fp32
accumulator, then its quantize (rowwise and/or colwise), writing FP8 data and scales and never
the product.

``GemmQuant`` is what GemmSm90's fused seam (``GemmSm90.fused_epilogue``) calls per output tile with the
consumer thread's accumulator fragment. The value of element (r, c) is the ElementOp's
(docs/NUMERICS.md steps 1-4) with the accumulator as the epilogue's first tensor and the other
tensors read at (r, c) through their [M, N] views (full, or broadcast with stride 0: a bias [N],
a row scale [M, 1], a scalar); the inputs are fp32, so there is no step-5 rounding. Blocks are
the format's (1x128 FP8 block scaling, 1x32 MXFP8; colwise their transposes) with codec.py's
arithmetic.

The accumulator layout of wgmma m64nNk16 (fp32; CUTLASS's SM90 ``CLayout_64xN``, thread layout
(4, 8, 4), value layout (2, 2, N/8)): thread t of a warpgroup holds, for each 8-column group g of
its warpgroup's 64 x 256 part (half the cooperative tile, GemmSm90's whole ping-pong tile),
values ``i = c + 2 h + 4 g`` (c, h in {0, 1}) at row ``16 (t // 32) + (t % 32) // 4 + 8 h`` and
column ``8 g + 2 (t % 4) + c``. So the 4 lanes of a
quad (t % 4) share their two rows, and a row's block of B columns is groups ``g`` in
``[b B/8, (b+1) B/8)`` of those 4 lanes: ``B / 4`` values per lane, reduced over the quad with
two butterfly shuffles (``ACC_QUAD``). ``check_layout`` asserts this at trace time on a few
threads' static coordinates. Columns past N (zeros from TMA, but the epilogue of zero need not be zero) are
left out of the block maxima; rows past M and columns past N are not stored. Both forms of the
GEMM give a warpgroup 64 full rows of 256 columns, so a rowwise block never leaves one thread
quad. The tensor amax (``amax``) is a NaN-propagating max of every value a thread writes (mxq's
amax rule, codec.amax_nan), over the warp, then one atomic per warp into the zeroed slot
(device.amax_atomic). dbias: each warp sums its 16-row stripe of every column (a thread's two
rows, then the 8 lanes of the column's quad position, by stripe_reduce: a fixed order) into
one row of an fp32 workspace, which GemmSm90 reduces after the GEMM (reduce.dbias_kernel, the
quantize kernels' fp64 reduction). The colwise copy (``GemmQuant.colwise_write``): blocks of 32
rows (MXFP8: two warps' stripes) or 128 (FP8 block scaling: the cooperative tile's eight warps;
a ping-pong tile of 64 rows cannot hold one, and GemmSm90 refuses that form for it), each
column's maximum over a warp's stripe by a reduce-scatter of butterfly shuffles, the block's
over its warps through shared memory between two named barriers of the tile's threads, each
value's multiplier from the lane that computed it by one indexed shuffle, the data [M, N] as
the rowwise copy's, or FP8 block scaling's transposed copy [N, M] (``scale_layout="gemm"``:
each warp's stripe transposed over its lanes by shuffles, ``stripe_transpose``, and stored as
16-byte column runs). The lane exchanges are written against ``ops`` (``WARP``), so the tests
run them on emulated lanes.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from . import codec
from . import device as dev
from .element import ElementOp

ACC_QUAD = 4  # lanes that share an accumulator row (wgmma's fp32 C layout)
DBIAS_ROWS = 16  # rows of one dbias partial: a warp's stripe (runtime/gemm.DBIAS_ROWS sizes the workspace by it)
VALUES_PER_GROUP = 4  # a lane's values per 8-column group: 2 columns x 2 rows
WARP_ROWS = 16  # rows of a warp's stripe of the accumulator
CHUNK_GROUPS = 8  # 8-column groups per chunk of the colwise reduce-scatter (the 8 lanes sharing a column)
COLWISE_BARRIER = 3  # named barrier of the colwise exchange: + the warpgroup in ping-pong (1, 2: its order pair)


def config_gap(cfg) -> str:
    """What of a KernelConfig the fused GEMM epilogue does not serve ("" when it serves it): 1x32
    (MXFP8) or 1x128 (FP8 block scaling) blocks, rowwise and/or colwise (32 or 128 rows, the
    colwise data [M, N] or FP8 block scaling's transposed copy [N, M]), with or without amax,
    dbias and an ordinary act or dact (not the two halves of a gated one). op.gemm names the option from the spec
    (codegen.gemm_gap) before anything compiles; this is the kernel's own guard."""
    fmt = cfg.fmt
    if fmt.packed or fmt.block[0] != 1 or fmt.block[1] not in (32, 128):
        return f"the format's block {fmt.block}"
    if cfg.halves:
        return "halves"
    return ""


def colwise_rows(cfg) -> int:
    """Rows of one colwise block (32 MXFP8, 128 FP8 block scaling); 0 without the colwise copy."""
    return cfg.fmt.col_block[0] if cfg.colwise else 0


class GemmQuant:
    """The fused epilogue of one op: its KernelConfig and element functions (a rendered
    module's CONFIG, epilogue and act)."""

    def __init__(self, cfg, epilogue, act=None, dact=None):
        gap = config_gap(cfg)
        if gap:
            raise NotImplementedError(f"mxq: the GEMM epilogue does not serve {gap}")
        self.cfg = cfg
        self.op = ElementOp(cfg, epilogue, act, dact)

    @cute.jit
    def write(self, acc: cute.Tensor, tile_m: Int32, tile_n: Int32, thr_mma, tile: cutlass.Constexpr, ctid: Int32,
              ins: list, scalars: list, row_data: cute.Tensor, row_scale: cute.Tensor, amax_slot=None,
              dbias_ws=None, col=None, stage=None):
        """Tile (tile_m, tile_n) of the outputs from this thread's accumulator fragment ``acc``
        (overwritten with the op's values; ``ctid``: the thread's index among the tile's). Rowwise,
        one block of each of its two rows at a time (so that the operands' loads stay a block's:
        all 128 at once spill registers): the values (``value``), the block's amax over the quad
        (NaN-dropping for FP8 block scaling, codec.block_amax_nan), its scale (lane 0 of the quad
        stores it, codec's layout offsets), its values' FP8 bytes (pairs of adjacent columns, one
        16-bit store). ``row_data`` is [M, N] whether or not the op writes it (a colwise-only
        op's launcher passes its colwise data). Then the colwise copy (``col``: colwise_write's
        outputs and exchange), the op's amax (the maximum |value| of the thread's, the warp's,
        one atomic into ``amax_slot`` per warp) and dbias's partial sums. ``stage``: the rowwise
        FP8 bytes go into shared memory instead (GemmSm90's ``stage_rows``: (the staging tile's
        shared address, its first row and column, its rows, its subtiles' width), stage_offset's
        layout), every pair of the tile, those past M or N too (its TMA store writes none of them)."""
        cfg = self.cfg
        fmt = cfg.fmt
        lane = ctid % 32
        M, N = row_data.shape[0], row_data.shape[1]
        coords = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor((M, N)), tile, (tile_m, tile_n)))
        nan = codec.block_amax_nan(fmt)
        in_max = codec.input_max(Float32)
        width = fmt.block[1]
        groups = width // 8  # 8-column groups per block
        blocks = tile[1] // width  # blocks per tile row
        nbr = (N + width - 1) // width  # blocks per output row
        tmax = Float32(0.0)  # (the thread's share of the tensor amax: rows past M left out, columns past N are 0)
        # (MXFP8's block maxima propagate NaN as its tensor amax does: the amax takes the blocks')
        by_blocks = cfg.rowwise and codec.block_amax_nan(fmt) == codec.amax_nan(fmt)
        if cutlass.const_expr(not cfg.rowwise):  # (the values alone: the colwise copy reads them from acc)
            for i in cutlass.range_constexpr(cute.size(acc)):
                acc[i] = self.value(acc, i, coords, M, N, ins, scalars)
                tmax = self.amax_step(tmax, acc[i], coords[i][0] < M)
        for b in cutlass.range_constexpr(blocks if cfg.rowwise else 0):  # (the two rows inner: a row operand's loads are shared)
            for h in cutlass.range_constexpr(2):
                r = coords[2 * h][0]
                amax = Float32(0.0)
                for g in cutlass.range_constexpr(b * groups, (b + 1) * groups):
                    for c in cutlass.range_constexpr(2):
                        i = c + 2 * h + VALUES_PER_GROUP * g
                        acc[i] = self.value(acc, i, coords, M, N, ins, scalars)
                        amax = cute.arch.fmax(amax, cute.math.abs(acc[i]), nan=nan)
                        if cutlass.const_expr(not by_blocks):  # (a row past M: the op of a zero accumulator)
                            tmax = self.amax_step(tmax, acc[i], r < M)
                for st in cutlass.range_constexpr(2):  # the quad: offsets 1, 2
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << st), nan=nan)
                if cutlass.const_expr(by_blocks):  # (the block's amax: its |values| under the tensor amax's rule)
                    tmax = self.amax_step(tmax, amax, r < M)
                e = codec.block_scale(fmt, amax, False, in_max)
                s = codec.multiplier(fmt, e)
                blk = tile_n * blocks + b
                if lane % ACC_QUAD == 0 and r < M and blk < nbr:
                    codec.store_row_scale(cfg, row_scale, codec.row_scale_offset(fmt, r, blk, nbr, M), e)
                if cutlass.const_expr(stage is not None):
                    sbase, row0, col0, rows, width = stage
                    rl = r - row0
                    rbase = sbase + rl * width + (coords[2 * h][1] - col0)  # (the lane's column in group 0)
                    x = stage_xor(rl, width)
                for g in cutlass.range_constexpr(b * groups, (b + 1) * groups):
                    i = 2 * h + VALUES_PER_GROUP * g
                    c0 = coords[i][1]
                    if cutlass.const_expr(stage is not None):
                        pair = codec.encode2_word(fmt, dev.mul_rn(acc[i], s), dev.mul_rn(acc[i + 1], s))
                        sub, cc = divmod(8 * g, width)  # (the group's subtile and first column in it)
                        dev.store_shared_u16(rbase + sub * rows * width + (Int32(cc) ^ x), pair)
                    elif r < M and c0 < N:  # (N % 8 == 0: a pair never straddles N)
                        pair = codec.encode2_word(fmt, dev.mul_rn(acc[i], s), dev.mul_rn(acc[i + 1], s))
                        dev.store_global_u16(row_data.iterator.toint() + cutlass.Int64(r) * cutlass.Int64(N)
                                             + cutlass.Int64(c0), pair)
        if cutlass.const_expr(cfg.amax):
            tmax = dev.warp_max(tmax)  # (NaN-propagating, as mxq's amax of these formats is)
            if lane == 0:
                dev.amax_atomic(amax_slot, tmax)
        if cutlass.const_expr(cfg.dbias or cfg.colwise):
            self.columns(acc, coords, M, N, tile_m, tile_n, tile, ctid, dbias_ws, col)

    def amax_step(self, tmax, v, inside):
        """The thread's running tensor amax with value ``v`` (left out where not ``inside``: a row
        past M); ``tmax`` unchanged without the op's amax."""
        if cutlass.const_expr(not self.cfg.amax):
            return tmax
        return cute.arch.fmax(tmax, cutlass.select_(inside, cute.math.abs(v), Float32(0.0)),
                              nan=codec.amax_nan(self.cfg.fmt))


    @cute.jit
    def columns(self, acc, coords, M, N, tile_m: Int32, tile_n: Int32, tile: cutlass.Constexpr, ctid: Int32,
                dbias_ws, col):
        """The column reductions of this warp's 16-row stripe, from the op's values in ``acc``
        (rows past M left out: the op of a zero accumulator), a chunk of 8 column groups at a
        time (stripe_reduce: lane l keeps group 8u + l // 4's two columns ``c_own + 64 u + c``):
        dbias's partial sums (a thread's two rows, then the 8 lanes; the pair stored into
        workspace row ``r // 16``) and the colwise copy's column maxima (colwise_write, whose
        exchange they go into)."""
        fmt = self.cfg.fmt
        nan = codec.block_amax_nan(fmt)
        lane = ctid % 32
        warp = ctid // 32
        r0, r1 = coords[0][0], coords[2][0]
        stripe = r0 // DBIAS_ROWS
        c_own = tile_n * tile[1] + 8 * (lane // ACC_QUAD) + 2 * (lane % ACC_QUAD)
        chunks = tile[1] // 8 // CHUNK_GROUPS
        if cutlass.const_expr(self.cfg.colwise):
            xch, bar_id, bar_threads, warp0 = col[2], col[3], col[4], col[5]
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=bar_threads)  # (the last tile's reads are done)
        for u in cutlass.range_constexpr(chunks):
            if cutlass.const_expr(self.cfg.dbias):
                sums = []
                for gg in cutlass.range_constexpr(CHUNK_GROUPS):
                    for c in cutlass.range_constexpr(2):
                        i = c + VALUES_PER_GROUP * (u * CHUNK_GROUPS + gg)
                        sums.append(cutlass.select_(r0 < M, acc[i], Float32(0.0))
                                    + cutlass.select_(r1 < M, acc[i + 2], Float32(0.0)))
                kept = stripe_reduce(sums, lane, lambda a, b: a + b)
                cu = c_own + 8 * CHUNK_GROUPS * u
                if cu < N and stripe < dbias_ws.shape[0]:  # (N % 8 == 0: the pair is inside)
                    dbias_ws[stripe, cu] = kept[0]
                    dbias_ws[stripe, cu + 1] = kept[1]
            if cutlass.const_expr(self.cfg.colwise):
                maxes = []
                for gg in cutlass.range_constexpr(CHUNK_GROUPS):
                    for c in cutlass.range_constexpr(2):
                        i = c + VALUES_PER_GROUP * (u * CHUNK_GROUPS + gg)
                        maxes.append(cute.arch.fmax(cutlass.select_(r0 < M, cute.math.abs(acc[i]), Float32(0.0)),
                                                    cutlass.select_(r1 < M, cute.math.abs(acc[i + 2]), Float32(0.0)),
                                                    nan=nan))
                kept = stripe_reduce(maxes, lane, lambda a, b: cute.arch.fmax(a, b, nan=nan))
                for c in cutlass.range_constexpr(2):  # (slot 2u + c)
                    xch[warp0 + warp, 2 * u + c, lane] = kept[c]
        if cutlass.const_expr(self.cfg.colwise):
            self.colwise_write(acc, coords, M, N, tile_m, tile, ctid, c_own, 2 * chunks, col)

    @cute.jit
    def colwise_write(self, acc, coords, M, N, tile_m: Int32, tile: cutlass.Constexpr, ctid: Int32, c_own: Int32,
                      slots: cutlass.Constexpr, col):
        """The colwise copy of the tile from the op's values in ``acc``, once ``columns`` has put
        each warp's column maxima into the exchange (slot-major, lane innermost: no bank
        conflict): blocks of R rows (colwise_rows: 32 or 128, R / 16 warps' stripes) per column,
        one scale per column and block (codec.put_col_scale: compact, swizzled, fp32, GEMM-ready),
        the data [M, N] (row_stores) or transposed [N, M] (transposed_stores). ``col``: (the
        colwise data, its flat scales, the fp32 exchange in shared memory [warps, 8, 32], the
        named barrier's id and thread count, the first warp of this tile's in the exchange).
        After a barrier of the tile's threads each warp reads its block's R / 16 warps' maxima
        of its lane's ``slots`` columns (slot s: ``c_own + 64 (s // 2) + s % 2``) and has their
        block amax, scale (the block's first warp stores it) and multiplier."""
        col_data, col_scale, xch, bar_id, bar_threads, warp0 = col
        fmt = self.cfg.fmt
        nan = codec.block_amax_nan(fmt)
        in_max = codec.input_max(Float32)
        rows = colwise_rows(self.cfg)
        wpb = rows // WARP_ROWS  # warps per colwise block
        lane = ctid % 32
        warp = ctid // 32  # the warp's stripe in the tile
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=bar_threads)
        first = warp - warp % wpb
        rb = (tile_m * tile[0] + first * WARP_ROWS) // rows  # (the block row: tiles hold whole blocks)
        mults = []
        for s in cutlass.range_constexpr(slots):
            amax = xch[warp0 + first, s, lane]
            for w in cutlass.range_constexpr(1, wpb):
                amax = cute.arch.fmax(amax, xch[warp0 + first + w, s, lane], nan=nan)
            if cutlass.const_expr(not nan):  # (max.f32 keeps a NaN met only by NaN: a block of NaN alone has amax 0)
                amax = cute.arch.fmax(amax, Float32(0.0))
            e = codec.block_scale(fmt, amax, False, in_max)
            mults.append(codec.multiplier(fmt, e))
            c = c_own + (8 * CHUNK_GROUPS * (s // 2) + s % 2)
            if warp == first and rb * rows < M and c < N:
                codec.put_col_scale(fmt, col_scale, None, c, rb, M, N, e)
        if cutlass.const_expr(self.cfg.transposed):
            self.transposed_stores(acc, mults, M, N, tile_m, tile, ctid, c_own, col_data)
        else:
            self.row_stores(acc, mults, coords, M, N, tile, lane % ACC_QUAD, col_data)

    @cute.jit
    def row_stores(self, acc, mults, coords, M, N, tile: cutlass.Constexpr, q: Int32, col_data: cute.Tensor):
        """The colwise data [M, N]: each value times its column's multiplier (from the lane
        holding the column, one indexed shuffle), pairs of adjacent columns as 16-bit stores."""
        fmt = self.cfg.fmt
        r0, r1 = coords[0][0], coords[2][0]
        # (group g's column is the thread's first plus 8 g, its two rows' addresses computed once:
        # the coordinates of all 32 groups held in registers spill the plain ops)
        c_first = coords[0][1]
        rows_at = [col_data.iterator.toint() + cutlass.Int64(rr) * cutlass.Int64(N) + cutlass.Int64(c_first)
                   for rr in (r0, r1)]
        for g in cutlass.range_constexpr(tile[1] // 8):
            m0, m1 = group_multipliers(mults, g, q)
            for h in cutlass.range_constexpr(2):
                i = 2 * h + VALUES_PER_GROUP * g
                if (r0, r1)[h] < M and c_first + 8 * g < N:
                    pair = codec.encode2_word(fmt, dev.mul_rn(acc[i], m0), dev.mul_rn(acc[i + 1], m1))
                    dev.store_global_u16(rows_at[h] + cutlass.Int64(8 * g), pair)

    @cute.jit
    def transposed_stores(self, acc, mults, M, N, tile_m: Int32, tile: cutlass.Constexpr, ctid: Int32,
                          c_own: Int32, col_data: cute.Tensor):
        """The transposed colwise copy ([N, M]: FP8 block scaling's GEMM-ready layout) of this
        warp's 16-row stripe, a chunk of 8 column groups at a time: each value's FP8 byte (its
        multiplier from the lane holding its column, as row_stores'), a word per group (the
        thread's two columns in its two rows), ``stripe_transpose`` (lane l then holds group
        8u + l // 4's two columns, 16 bytes each in row order), one 16-byte store a column at
        ``[column, the stripe's first row]`` where M % 16 == 0, else its bytes inside M one at a
        time: 48 shuffles and 8 stores a thread for the 128 values (64 of each for [M, N])."""
        fmt = self.cfg.fmt
        lane = ctid % 32
        q = lane % ACC_QUAD
        stripe_row = tile_m * tile[0] + (ctid // 32) * WARP_ROWS  # (a multiple of 16)
        aligned = M % 16 == 0
        base = col_data.iterator.toint()
        for u in cutlass.range_constexpr(tile[1] // 8 // CHUNK_GROUPS):
            words = []
            for gg in cutlass.range_constexpr(CHUNK_GROUPS):
                g = CHUNK_GROUPS * u + gg
                m0, m1 = group_multipliers(mults, g, q)
                pairs = [codec.encode2_word(fmt, dev.mul_rn(acc[2 * h + VALUES_PER_GROUP * g], m0),
                                            dev.mul_rn(acc[2 * h + VALUES_PER_GROUP * g + 1], m1)) for h in range(2)]
                words.append(Uint32(pairs[0]) | (Uint32(pairs[1]) << Uint32(16)))
            cols = stripe_transpose(words, lane)
            for c in cutlass.range_constexpr(2):
                col = c_own + (8 * CHUNK_GROUPS * u + c)
                if col < N and stripe_row < M:
                    self.store_run(base + cutlass.Int64(col) * cutlass.Int64(M) + cutlass.Int64(stripe_row), cols[c],
                                   aligned, M - stripe_row)

    @cute.jit
    def store_run(self, addr, words, aligned, left: Int32):
        """One column's 16 stripe rows of the transposed copy at ``addr``: one 16-byte store where
        ``aligned`` (M % 16 == 0), else the bytes of the ``left`` rows inside M one at a time."""
        if aligned:
            dev.store_global_words(addr, words)
        else:
            for k in cutlass.range_constexpr(16):
                if k < left:
                    dev.store_global_u8(addr + cutlass.Int64(k), words[k // 4] >> Uint32(8 * (k % 4)))

    def value(self, acc, i: int, coords, M, N, ins, scalars):
        """The op's value of accumulator element i (NUMERICS steps 1-4), 0 at columns past N (an
        epilogue of the zero padding need not be 0, and must not enter a block amax). The other
        tensors (the epilogue's after the accumulator, then a dact op's act_input, [M, N]) are
        read at coordinates clamped into [M, N] (an edge tile's rows and columns outside hold no
        output)."""
        r = cutlass.min(coords[i][0], M - 1)
        c = cutlass.min(coords[i][1], N - 1)

        def load(t, k):
            return acc[k] if t == 0 else ins[t - 1][(r, c)].to(Float32)

        v = self.op.value(list(range(self.cfg.n_inputs + self.cfg.has_dact)), i, scalars, load)
        return Float32(cutlass.select_(coords[i][1] < N, v, Float32(0.0)))


STAGE_WIDTHS = (128, 64)  # staged subtile widths in bytes (GemmSm90.stage_width): 128-byte or 64-byte swizzled rows


def stage_xor(rl, width: int):
    """The swizzle of row ``rl`` of a staged subtile ``width`` bytes wide, XOR'ed into a byte
    column's 16-byte chunk index (bits 4 and up): TMA's 128-byte swizzle (row % 8) for 128-byte
    rows, its 64-byte one ((row // 2) % 4) for 64-byte rows. So the 8 rows of a warp's pair
    stores fall in 8 different 16-byte chunks of the banks: no conflict."""
    if width == 128:
        return (rl & 7) << 4
    return ((rl >> 1) & 3) << 4


def stage_offset(rl: int, cl: int, rows: int, width: int) -> int:
    """Byte offset of byte (rl, cl) of a tile staged for its TMA store: subtiles of ``width``
    columns, each ``rows`` rows of ``width`` bytes, swizzled by stage_xor (the layout
    cutlass.utils.hopper_helpers.make_smem_layout_epi gives Uint8 rows of that width; GemmSm90
    checks the two agree at trace time). Python ints (the kernel computes it per row and group)."""
    sub, cc = divmod(cl, width)
    return sub * rows * width + rl * width + (cc ^ stage_xor(rl, width))


def group_multipliers(mults, g: int, q):
    """The multipliers of column group g's two columns for a lane of quad position ``q``: from
    the lane that keeps them after stripe_reduce (4 (g % 8) + q, slots 2 (g // 8) + c), one
    indexed shuffle each."""
    src = ACC_QUAD * (g % CHUNK_GROUPS) + q
    return [cute.arch.shuffle_sync(mults[2 * (g // CHUNK_GROUPS) + c], offset=src) for c in range(2)]


# --- the lane exchanges of a warp's 16-row stripe, written against ``ops`` (WARP's on the device;
# tests/test_gemm_epilogue.py runs them on 32 emulated lanes) ------------------------------------
class WARP:
    """The warp operations the stripe exchanges use, as the kernel issues them."""

    select = staticmethod(cutlass.select_)
    bfly = staticmethod(lambda v, offset: cute.arch.shuffle_sync_bfly(v, offset=offset))
    prmt = staticmethod(dev.prmt_var)
    u32 = Uint32

    @staticmethod
    def bit(lane, b: int):
        return ((lane >> b) & 1) == 1


def stripe_reduce(vals: list, lane, combine, ops=WARP) -> list:
    """A chunk's 16 per-thread column values (``vals[2 gg + c]``: group 8u + gg, column c)
    combined over the 8 lanes that share each column (lane bits 2-4) by a reduce-scatter: three
    butterfly steps (lane bits 4, 3, 2), each lane keeping the half its bit selects and combining
    the partner's (``combine(kept, received)``: one fixed order per column). Returns the two
    values lane ``l`` keeps: group ``8u + l // 4``'s columns c = 0, 1 (7 shuffles a pair of
    columns against the 24 of an all-reduce)."""
    for bit in (4, 3, 2):
        upper = ops.bit(lane, bit)
        half = len(vals) // 2
        nxt = []
        for j in range(half):
            send = ops.select(upper, vals[j], vals[j + half])
            keep = ops.select(upper, vals[j + half], vals[j])
            nxt.append(combine(keep, ops.bfly(send, 1 << bit)))
        vals = nxt
    return vals


# stripe_transpose's byte interleave of a kept and a received word, by half (low, high bytes), as
# (the lane's bit clear: the kept word's bytes first, set: the received word's) prmt selectors
TR_SELECTORS = ((0x5140, 0x1504), (0x7362, 0x3726))


def stripe_transpose(words: list, lane, ops=WARP) -> list:
    """A chunk's 8 FP8 words of a thread (``words[gg]``: group 8u + gg, bytes ``[c0 h0, c1 h0,
    c0 h1, c1 h1]``: its two columns in its two rows p = l // 4 and p + 8 of the stripe)
    transposed over the 8 lanes that share the columns: stripe_reduce's exchanges with bytes
    concatenated instead of combined. At the step over lane bit 4, 3, 2 (row bit 2, 1, 0) a
    lane keeps the half of its groups its bit selects, sends the other half (4 words), and
    interleaves each kept word with the received one byte by byte (two prmt, the row whose bit
    is clear first: TR_SELECTORS), so each step doubles a group's words and the three steps put
    the row bits 2, 1, 0 in that significance. Returns lane l's two columns (group 8u + l // 4,
    c = 0, 1) as four words each, the stripe's rows 0-15 in order (12 shuffles)."""
    groups = [[w] for w in words]
    for bit in (4, 3, 2):
        upper = ops.bit(lane, bit)
        sel = [ops.u32(ops.select(upper, ops.u32(hi), ops.u32(lo))) for lo, hi in TR_SELECTORS]
        half = len(groups) // 2
        nxt = []
        for j in range(half):
            sent = [ops.select(upper, a, b) for a, b in zip(groups[j], groups[j + half])]
            kept = [ops.select(upper, b, a) for a, b in zip(groups[j], groups[j + half])]
            got = [ops.bfly(w, 1 << bit) for w in sent]
            nxt.append([ops.prmt(k, r, s) for k, r in zip(kept, got) for s in sel])
        groups = nxt
    # the last group's 8 words: word 4 a + 2 b + d came from the first step's half a (the row h),
    # the second's b (the column c), the third's d (rows 0-3 or 4-7 of the h)
    w = groups[0]
    return [[w[4 * h + 2 * c + d] for h in range(2) for d in range(2)] for c in range(2)]


def check_layout(tiled_mma, tile, wgs: int = 2) -> None:
    """Trace-time check of the accumulator layout the module docstring states, on the static
    coordinates of a few threads t of the ``wgs`` warpgroups sharing a tile (each a 64-row
    part: GemmSm90's cooperative 128 x 256 tile has two, its ping-pong 64 x 256 tile one):
    value i = c + 2h + 4g of thread t at row 64 (t // 128) + 16 (t % 128 // 32) + (t % 32) // 4
    + 8h, column 8g + 2 (t % 4) + c."""
    if tile[0] != 64 * wgs:
        raise AssertionError(f"mxq: a {tile} tile is not {wgs} warpgroups of 64 rows")
    for t in (0, 1, 2, 3, 4, 37, 127, *((128, 255) if wgs == 2 else ())):
        coords = tiled_mma.get_slice(t).partition_C(cute.make_identity_tensor(tile))
        row0 = 64 * (t // 128) + 16 * (t % 128 // 32) + (t % 32) // 4
        for i in range(0, cute.size(coords), 9):  # a sample of the values (all of them is slow to trace)
            c, h, g = i % 2, (i // 2) % 2, i // VALUES_PER_GROUP
            want = (row0 + 8 * h, 8 * g + 2 * (t % ACC_QUAD) + c)
            if tuple(coords[i]) != want:
                raise AssertionError(f"mxq: wgmma's accumulator value {i} of thread {t} is at {tuple(coords[i])}, "
                                     f"not {want}: gemm_quant.py's layout assumption does not hold")


def check_parts(tiled_mma, tile, part) -> None:
    """Trace-time check that a thread's accumulator fragment of a ``tile`` of several wgmma rows
    (a 128-row ping-pong tile: GemmSm90.parts), sliced at its M mode p, holds exactly the values
    of ``part`` p of the tile (the fragment of that part's own partition, value for value), so
    that ``write`` serves each slice as a tile of ``part`` (checked at a sample of threads and
    values, on static coordinates)."""
    parts = tile[0] // part[0]
    if parts * part[0] != tile[0] or part[1] != tile[1]:
        raise AssertionError(f"mxq: a {tile} tile is not whole parts of {part}")
    ident = cute.make_identity_tensor(tile)
    for t in (0, 1, 5, 37, 100, 127):
        thr = tiled_mma.get_slice(t)
        whole = thr.partition_C(ident)
        if cute.size(whole, mode=[1]) != parts:
            raise AssertionError(f"mxq: thread {t}'s fragment of a {tile} tile holds {cute.size(whole, mode=[1])} "
                                 f"wgmma rows, not {parts} parts of {part}")
        for p in range(parts):
            got = whole[(None, p, None)]
            want = thr.partition_C(cute.local_tile(ident, part, (p, 0)))
            if cute.size(got) != cute.size(want):
                raise AssertionError(f"mxq: part {p} of a {tile} tile holds {cute.size(got)} values of thread {t}, "
                                     f"its partition {cute.size(want)}")
            for i in range(0, cute.size(want), 7):
                if tuple(got[i]) != tuple(want[i]):
                    raise AssertionError(f"mxq: value {i} of part {p} of thread {t} is at {tuple(got[i])}, its "
                                         f"partition's at {tuple(want[i])}: GemmSm90's parts do not hold")


__all__ = ["ACC_QUAD", "GemmQuant", "check_layout", "check_parts", "colwise_rows", "config_gap", "stage_offset"]
