"""The sm_90 GEMM's fused epilogue (``op.gemm``): the op's epilogue and act on the fp32
accumulator, then its rowwise quantize, writing FP8 data and scales and never the product.

``GemmQuant`` is what GemmSm90's fused seam (``GemmSm90.fused_epilogue``) calls per output tile with the
consumer thread's accumulator fragment. The value of element (r, c) is the ElementOp's
(docs/NUMERICS.md steps 1-4) with the accumulator as the epilogue's first tensor and the other
tensors read at (r, c) through their [M, N] views (full, or broadcast with stride 0: a bias [N],
a row scale [M, 1], a scalar); the inputs are fp32, so there is no step-5 rounding. Blocks are
the format's rowwise blocks (1x128 FP8 block scaling, 1x32 MXFP8) with codec.py's arithmetic.

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
rows, then the 8 lanes of the column's quad position, by butterfly shuffles: a fixed order) into
one row of an fp32 workspace, which GemmSm90 reduces after the GEMM (reduce.dbias_kernel, the
quantize kernels' fp64 reduction). Colwise blocks (128 rows in FP8 block scaling: more than a
ping-pong tile holds) would need a reduction across warpgroups or tiles, and ``config_gap``
refuses them.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import codec
from . import device as dev
from .element import ElementOp

ACC_QUAD = 4  # lanes that share an accumulator row (wgmma's fp32 C layout)
DBIAS_ROWS = 16  # rows of one dbias partial: a warp's stripe (runtime/gemm.DBIAS_ROWS sizes the workspace by it)
VALUES_PER_GROUP = 4  # a lane's values per 8-column group: 2 columns x 2 rows


def config_gap(cfg) -> str:
    """What of a KernelConfig the fused GEMM epilogue does not serve ("" when it serves it):
    rowwise 1x32 (MXFP8) or 1x128 (FP8 block scaling) blocks, with or without amax and dbias. op.gemm names the option
    from the spec (codegen.gemm_gap) before anything compiles; this is the kernel's own guard."""
    fmt = cfg.fmt
    if fmt.packed or fmt.block[0] != 1 or fmt.block[1] not in (32, 128):
        return f"the format's block {fmt.block}"
    for name in ("colwise", "has_dact", "halves"):
        if getattr(cfg, name):
            return name
    return ""


class GemmQuant:
    """The fused epilogue of one op: its KernelConfig and element functions (a rendered
    module's CONFIG, epilogue and act)."""

    def __init__(self, cfg, epilogue, act=None):
        gap = config_gap(cfg)
        if gap:
            raise NotImplementedError(f"mxq: the GEMM epilogue does not serve {gap}")
        self.cfg = cfg
        self.op = ElementOp(cfg, epilogue, act)

    @cute.jit
    def write(self, acc: cute.Tensor, tile_m: Int32, tile_n: Int32, thr_mma, tile: cutlass.Constexpr, lane: Int32,
              ins: list, scalars: list, row_data: cute.Tensor, row_scale: cute.Tensor, amax_slot=None,
              dbias_ws=None):
        """Tile (tile_m, tile_n) of the outputs from this thread's accumulator fragment ``acc``
        (overwritten with the op's values), one block of each of its two rows at a time (so
        that the operands' loads stay a block's: all 128 at once spill registers): the values
        (``value``), the block's amax over the quad (NaN-dropping for FP8 block scaling,
        codec.block_amax_nan), its scale (lane 0 of the quad stores it, codec's layout offsets),
        its values' FP8 bytes (pairs of adjacent columns, one 16-bit store); with the op's amax,
        the maximum |value| of the thread's, the warp's, one atomic into ``amax_slot`` per warp."""
        fmt = self.cfg.fmt
        M, N = row_data.shape[0], row_data.shape[1]
        coords = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor((M, N)), tile, (tile_m, tile_n)))
        nan = codec.block_amax_nan(fmt)
        in_max = codec.input_max(Float32)
        width = fmt.block[1]
        groups = width // 8  # 8-column groups per block
        blocks = tile[1] // width  # blocks per tile row
        nbr = (N + width - 1) // width  # blocks per output row
        tensor_nan = codec.amax_nan(fmt)
        tmax = Float32(0.0)  # (the thread's share of the tensor amax: rows past M left out, columns past N are 0)
        for b in cutlass.range_constexpr(blocks):  # (the two rows inner: a row operand's loads are shared)
            for h in cutlass.range_constexpr(2):
                r = coords[2 * h][0]
                amax = Float32(0.0)
                for g in cutlass.range_constexpr(b * groups, (b + 1) * groups):
                    for c in cutlass.range_constexpr(2):
                        i = c + 2 * h + VALUES_PER_GROUP * g
                        acc[i] = self.value(acc, i, coords, M, N, ins, scalars)
                        amax = cute.arch.fmax(amax, cute.math.abs(acc[i]), nan=nan)
                        if cutlass.const_expr(self.cfg.amax):  # (a row past M: the op of a zero accumulator)
                            tmax = cute.arch.fmax(tmax, cutlass.select_(r < M, cute.math.abs(acc[i]), Float32(0.0)),
                                                  nan=tensor_nan)
                for st in cutlass.range_constexpr(2):  # the quad: offsets 1, 2
                    amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << st), nan=nan)
                e = codec.block_scale(fmt, amax, False, in_max)
                s = codec.multiplier(fmt, e)
                blk = tile_n * blocks + b
                if lane % ACC_QUAD == 0 and r < M and blk < nbr:
                    codec.store_row_scale(self.cfg, row_scale, codec.row_scale_offset(fmt, r, blk, nbr, M), e)
                for g in cutlass.range_constexpr(b * groups, (b + 1) * groups):
                    i = 2 * h + VALUES_PER_GROUP * g
                    c0 = coords[i][1]
                    if r < M and c0 < N:  # (N % 8 == 0: a pair never straddles N)
                        pair = codec.encode2_word(fmt, dev.mul_rn(acc[i], s), dev.mul_rn(acc[i + 1], s))
                        dev.store_global_u16(row_data.iterator.toint() + cutlass.Int64(r) * cutlass.Int64(N)
                                             + cutlass.Int64(c0), pair)
        if cutlass.const_expr(self.cfg.amax):
            tmax = dev.warp_max(tmax)  # (NaN-propagating, as mxq's amax of these formats is)
            if lane == 0:
                dev.amax_atomic(amax_slot, tmax)
        if cutlass.const_expr(self.cfg.dbias):
            self.column_partials(acc, coords, M, N, lane, dbias_ws, tile[1] // 8)

    @cute.jit
    def column_partials(self, acc, coords, M, N, lane: Int32, dbias_ws: cute.Tensor, groups: cutlass.Constexpr):
        """dbias's partial sums of this warp's 16-row stripe (``acc``: the op's values, write's):
        per column, the thread's two rows (rows past M left out: the op of a zero accumulator),
        then the 8 lanes sharing the column (butterfly shuffles over lane bits 2-4, every lane
        getting the same sum), stored by the quad's 4 lanes into workspace row ``r // 16``
        (columns past N, and a stripe past the workspace's rows, not stored)."""
        r0, r1 = coords[0][0], coords[2][0]
        stripe = r0 // DBIAS_ROWS
        for g in cutlass.range_constexpr(groups):
            for c in cutlass.range_constexpr(2):
                i = c + VALUES_PER_GROUP * g
                s = cutlass.select_(r0 < M, acc[i], Float32(0.0)) + cutlass.select_(r1 < M, acc[i + 2], Float32(0.0))
                for st in cutlass.range_constexpr(2, 5):
                    s = s + cute.arch.shuffle_sync_bfly(s, offset=1 << st)
                col = coords[i][1]
                if lane < ACC_QUAD and col < N and stripe < dbias_ws.shape[0]:
                    dbias_ws[stripe, col] = s

    def value(self, acc, i: int, coords, M, N, ins, scalars):
        """The op's value of accumulator element i (NUMERICS steps 1-4), 0 at columns past N (an
        epilogue of the zero padding need not be 0, and must not enter a block amax). The other
        tensors are read at coordinates clamped into [M, N] (an edge tile's rows and columns
        outside hold no output)."""
        r = cutlass.min(coords[i][0], M - 1)
        c = cutlass.min(coords[i][1], N - 1)

        def load(t, k):
            return acc[k] if t == 0 else ins[t - 1][(r, c)].to(Float32)

        v = self.op.value(list(range(self.cfg.n_inputs)), i, scalars, load)
        return Float32(cutlass.select_(coords[i][1] < N, v, Float32(0.0)))


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


__all__ = ["ACC_QUAD", "GemmQuant", "check_layout", "config_gap"]
