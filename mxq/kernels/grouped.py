"""Row groups in the kernels: which rows a grouped call's row tile covers (mxq/groups.py and
docs/NUMERICS.md "Groups" define the placements).

A grouped call's grid has M // 32 + G row tiles, one per row of the compact grouped colwise scale
buffer. Group g's first block sits at row f(g) = start_g // 32 + g, so row tile rb is block
b = rb - f(g) of the group g with the last f(g) <= rb, and holds rows [start_g + 32 b,
min(start_g + 32 b + 32, end_g)); a tile past its group's last block (the rows the placement
leaves between groups) holds no rows and writes zero scales.

Every CTA finds its group from the offsets alone, with no search and no prefix-sum pass: f is
strictly increasing, so with h running over the groups, "h < g" is "f(h + 1) <= rb", and then
g = the number of such h, start_g = the largest of their ends, end_g = the smallest of the
other ends, and the swizzled layouts' group starts (sums over the groups before g) are sums over
the same h. One pass of the CTA's threads over the G ends (independent loads: one memory
latency) and a block reduction give all five. With Tuning.grouped_tiles = T a CTA of the packed
kernel covers T consecutive row tiles and searches for each, the next tile's search issued behind
the current tile's row copies (packed.PackedKernel.packed_kernel).

The offsets are not validated on the device: every end is clamped to [0, M] first, so offsets
that are not non-decreasing give unspecified bytes but never an access outside the buffers.

``terms`` and ``tile`` are written against device.DEVICE / device.HOST ops, so the very
expressions the kernels trace run on Python ints in tests/test_kernels.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from . import smem as shared
from .config import ROWS, group_scratch
from .device import DEVICE


def clamp_end(e, M, ops=DEVICE):
    return ops.min(ops.max(e, ops.I32(0)), M)


def terms(h, e_prev, e, G, rb, M, ops=DEVICE):
    """Group h's contribution to row tile rb's reductions: (1 if h is before rb's group else 0,
    its end if before else 0 [max], M if before else its end [min], and if before its swizzled
    rowwise rows roundup(m_h, 128) and colwise block rows roundup(ceil(m_h / 32), 4) [sums]).
    ``e``, ``e_prev``: ends h and h - 1 (0 for h = 0), clamped to [0, M]."""
    I32 = ops.I32
    after_first = ops.select(h + 1 < G, I32(1), I32(0))
    before = after_first * ops.select(e // ROWS + h + 1 <= rb, I32(1), I32(0))
    m = ops.max(e - e_prev, I32(0))
    rows_sw = (m + 127) // 128 * 128
    blocks_sw = ((m + ROWS - 1) // ROWS + 3) // 4 * 4
    return (before, ops.select(before == 1, e, I32(0)), ops.select(before == 1, M, e),
            ops.select(before == 1, rows_sw, I32(0)), ops.select(before == 1, blocks_sw, I32(0)))


def tile(rb, g, start, end, ops=DEVICE):
    """(first row, row end, block index b in the group, the group's block count) of row tile rb
    of group g = [start, end); rows [0, 0) when the tile holds no rows."""
    I32 = ops.I32
    b = rb - (start // ROWS + g)
    row0 = start + b * ROWS
    has_rows = ops.select(b >= 0, ops.select(row0 < end, I32(1), I32(0)), I32(0))
    row_end = ops.min(row0 + ROWS, end)
    nb = (ops.max(end - start, I32(0)) + ROWS - 1) // ROWS
    return (ops.select(has_rows == 1, row0, I32(0)), ops.select(has_rows == 1, row_end, I32(0)),
            ops.select(has_rows == 1, b, I32(0)), nb)


def _combine(k: int, a, b):
    """How reduction k combines two partial results."""
    if k == 1:
        return cutlass.max(a, b)
    if k == 2:
        return cutlass.min(a, b)
    return a + b


@cute.jit
def find_group(ends: cute.Tensor, red: cute.Tensor, rb: Int32, M: Int32, nthreads: cutlass.Constexpr):
    """(g, start_g, end_g, swizzled rowwise rows before g, swizzled colwise block rows before g)
    of row tile rb, reduced over the CTA's ``nthreads`` threads (every thread gets them; one
    barrier). ``red``: shared Int32 scratch of N_TERMS x (nthreads / 32)."""
    tidx, _, _ = cute.arch.thread_idx()
    lane = tidx % 32
    warp = tidx // 32
    G = Int32(ends.shape[0])
    a0, a1, a2, a3, a4 = Int32(0), Int32(0), M, Int32(0), Int32(0)
    for h in cutlass.range(tidx, G, nthreads):
        e = clamp_end(Int32(ends[h]), M)
        e_prev = clamp_end(Int32(ends[cutlass.max(h - 1, Int32(0))]), M)
        e_prev = Int32(cutlass.select_(h > 0, e_prev, Int32(0)))
        t0, t1, t2, t3, t4 = terms(h, e_prev, e, G, rb, M)
        a0 = a0 + t0
        a1 = cutlass.max(a1, t1)
        a2 = cutlass.min(a2, t2)
        a3 = a3 + t3
        a4 = a4 + t4
    for s in cutlass.range_constexpr(5):
        a0 = a0 + cute.arch.shuffle_sync_bfly(a0, offset=1 << s)
        a1 = cutlass.max(a1, cute.arch.shuffle_sync_bfly(a1, offset=1 << s))
        a2 = cutlass.min(a2, cute.arch.shuffle_sync_bfly(a2, offset=1 << s))
        a3 = a3 + cute.arch.shuffle_sync_bfly(a3, offset=1 << s)
        a4 = a4 + cute.arch.shuffle_sync_bfly(a4, offset=1 << s)
    if lane == 0:
        red[0, warp] = a0
        red[1, warp] = a1
        red[2, warp] = a2
        red[3, warp] = a3
        red[4, warp] = a4
    cute.arch.sync_threads()
    r0, r1, r2, r3, r4 = red[0, 0], red[1, 0], red[2, 0], red[3, 0], red[4, 0]
    for w in cutlass.range_constexpr(1, nthreads // 32):
        r0 = r0 + red[0, w]
        r1 = cutlass.max(r1, red[1, w])
        r2 = cutlass.min(r2, red[2, w])
        r3 = r3 + red[3, w]
        r4 = r4 + red[4, w]
    return r0, r1, r2, r3, r4


def scratch(smem, nthreads: int):
    """The shared scratch find_group reduces through (config.group_scratch), from allocator ``smem``."""
    return shared.allocate(smem, [group_scratch(nthreads // 32)])["group"]


# Swizzled scale offsets of a grouped tile, split into a per-tile base and a per-element rest so
# the kernels keep two values live instead of five (device.swizzle_offset's terms regrouped: the
# tile's rows are 32 b .. 32 b + 31 of its group, so (row in group) // 128 = b // 4 and
# ((row in group) % 128) // 32 = b % 4). Plain integer arithmetic: tests/test_kernels.py checks
# them against device.swizzle_offset on Python ints.
def swizzled_bases(rows_before, blocks_before, b, nb, N):
    """(rowwise base, colwise base, colwise bytes per 128 columns) of block b of a group with
    nb blocks whose regions start at rows rows_before / blocks_before of the grouped buffers."""
    t_row = ((N + ROWS - 1) // ROWS + 3) // 4  # 512-byte tiles per 128 rows of rowwise scales
    row_sw = rows_before * (4 * t_row) + (b // 4) * t_row * 512 + (b % 4) * 4
    col_sw = blocks_before * ((N + 127) // 128 * 128) + (b // 4) * 512 + b % 4
    return row_sw, col_sw, (nb + 3) // 4 * 512


def row_swizzled_offset(row_sw, r_in_tile, blk):
    """Scale byte of row r_in_tile (0..31) of the tile, block blk, in the swizzled rowwise buffer."""
    return row_sw + (blk // 4) * 512 + r_in_tile * 16 + blk % 4


def col_swizzled_offset(col_sw, col_t512, c):
    """Scale byte of column c of the tile's block in the swizzled colwise buffer."""
    return col_sw + (c // 128) * col_t512 + (c % 32) * 16 + ((c % 128) // 32) * 4


class GroupTile:
    """Row tile rb of a grouped call, as the kernels use it (Int32 device values): ``row0`` and
    ``row_end`` its rows; swizzled layouts: ``row_sw``, ``col_sw``, ``col_t512`` (swizzled_bases).
    A tile with no rows has b = 0 and writes nothing to the swizzled buffers."""

    def __init__(self, ends, red, rb, M, N, swizzled: bool, nthreads: int):
        """``red``: the CTA's scratch (config.group_scratch); ``N``: the outputs' width (2N for a
        two-halves op, whose halves share the groups' scale rows)."""
        g, start, end, rows_before, blocks_before = find_group(ends, red, rb, M, nthreads)
        self.row0, self.row_end, b, nb = tile(rb, g, start, end)
        if swizzled:
            self.row_sw, self.col_sw, self.col_t512 = swizzled_bases(rows_before, blocks_before, b, nb, N)


def row_tiles(M, G):
    """Row tiles of a grouped call (rows of the compact grouped colwise scale buffer)."""
    return M // ROWS + G
