"""Row groups in the kernels: which rows a grouped call's row tile covers (mxq/groups.py and
docs/NUMERICS.md "Groups" define the placements).

A grouped call's grid has M // R + G row tiles, one per row of the compact grouped colwise scale
buffer, R the rows of a colwise block (the kernel's tile rows, KernelConfig.tile_rows: 32 for
MXFP8 and FP8 block scaling's 1x128 rowwise blocks, 128 for its 128-row colwise blocks and
128x128 tiles). Group g's first block sits at row f(g) = start_g // R + g, so row tile rb is
block b = rb - f(g) of the group g with the last f(g) <= rb, and holds rows [start_g + R b,
min(start_g + R b + R, end_g)); a tile past its group's last block (the rows the placement
leaves between groups) holds no rows and writes zero scales (MXFP8's E8M0 zeros; FP8 block
scaling's fp32 0.0, not the 1 / scale of an amax 0).

Every CTA finds its group from the offsets alone, with no search and no prefix-sum pass: f is
strictly increasing, so with h running over the groups, "h < g" is "f(h + 1) <= rb", and then
g = the number of such h, start_g = the largest of their ends, end_g = the smallest of the
other ends, and the swizzled layouts' group starts (sums over the groups before g) are sums over
the same h. One pass of the CTA's threads over the G ends (independent loads: one memory
latency) and a block reduction give all five. Tuning.group_search picks how (find_group; the
library's choice: KernelConfig.group_search): "block_all" reduces all five; "block" only those the config reads (three compact,
four or five swizzled: KernelConfig.group_terms), with shifts and a redux.sync per warp and
term; "warp" and "warps" pass over the ends in one warp, broadcasting through shared memory
behind one barrier or (each warp searching for itself) with none. Integer sums, maxima and
minima are exact, so every form gives every tile the same group.

The offsets are not validated on the device: every end is clamped to [0, M] first, so offsets
that are not non-decreasing give unspecified bytes but never an access outside the buffers.

``terms``, ``accumulate``, ``combine`` and ``tile`` are written against device.DEVICE /
device.HOST ops, so the very expressions the kernels trace run on Python ints in
tests/test_kernels.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from . import smem as shared
from .config import N_TERMS, ROWS, group_scratch
from .device import DEVICE


def clamp_end(e, M, ops=DEVICE):
    return ops.min(ops.max(e, ops.I32(0)), M)


def _div(x, k: int, shift: bool):
    """x // k for a power of two k: as an arithmetic shift with ``shift`` (the same value for
    every integer: both round down; a signed division compiles to a shift and corrections for
    negative x, which LLVM cannot rule out here)."""
    return x >> (k.bit_length() - 1) if shift else x // k


def terms(h, e_prev, e, G, rb, M, ops=DEVICE, shift: bool = False, rows: int = ROWS):
    """Group h's contribution to row tile rb's reductions: (1 if h is before rb's group else 0,
    its end if before else 0 [max], M if before else its end [min], and if before its swizzled
    rowwise rows roundup(m_h, 128) and colwise block rows roundup(ceil(m_h / 32), 4) [sums]).
    ``e``, ``e_prev``: ends h and h - 1 (0 for h = 0), clamped to [0, M]. ``shift``: the
    divisions by powers of two as shifts (_div; the same values). ``rows``: a row tile's rows,
    R (the swizzled layouts, MXFP8's alone, have R = 32)."""
    I32 = ops.I32
    after_first = ops.select(h + 1 < G, I32(1), I32(0))
    before = after_first * ops.select(_div(e, rows, shift) + h + 1 <= rb, I32(1), I32(0))
    m = ops.max(e - e_prev, I32(0))
    rows_sw = _div(m + 127, 128, shift) * 128
    blocks_sw = _div(_div(m + ROWS - 1, ROWS, shift) + 3, 4, shift) * 4
    return (before, ops.select(before == 1, e, I32(0)), ops.select(before == 1, M, e),
            ops.select(before == 1, rows_sw, I32(0)), ops.select(before == 1, blocks_sw, I32(0)))


def tile(rb, g, start, end, ops=DEVICE, rows: int = ROWS):
    """(first row, row end, block index b in the group, the group's block count) of row tile rb
    of group g = [start, end), whose tiles have ``rows`` rows; rows [0, 0) when the tile holds
    no rows."""
    I32 = ops.I32
    b = rb - (start // rows + g)
    row0 = start + b * rows
    has_rows = ops.select(b >= 0, ops.select(row0 < end, I32(1), I32(0)), I32(0))
    row_end = ops.min(row0 + rows, end)
    nb = (ops.max(end - start, I32(0)) + rows - 1) // rows
    return (ops.select(has_rows == 1, row0, I32(0)), ops.select(has_rows == 1, row_end, I32(0)),
            ops.select(has_rows == 1, b, I32(0)), nb)


def init(M, ops=DEVICE):
    """The five reductions' identities: 0 for the sums and the max (clamped ends are >= 0), M
    for the min."""
    I32 = ops.I32
    return I32(0), I32(0), M, I32(0), I32(0)


def combine(k: int, a, b, ops=DEVICE):
    """How reduction k combines two partial results: exact integer operations, so any order and
    any partition of the groups over threads gives the same result."""
    if k == 1:
        return ops.max(a, b)
    if k == 2:
        return ops.min(a, b)
    return a + b


REDUX = ("add", "max", "min", "add", "add")  # combine's operation per term, as warp_redux_sync names it


def stride(search: str, nthreads: int) -> int:
    """Groups between two of one thread's in find_group's pass over the ends: the CTA's
    ``nthreads`` threads share the pass in the block searches, a warp's lanes in the warp ones."""
    return nthreads if search in ("block_all", "block") else 32


def accumulate(acc, h, e_prev, e, G, rb, M, used, shift: bool, ops=DEVICE, rows: int = ROWS):
    """``acc`` (five partial results) with group h's terms (``shift``, ``rows``: see terms)
    combined into the reductions in ``used`` (KernelConfig.group_terms); the others unchanged."""
    t = terms(h, e_prev, e, G, rb, M, ops, shift, rows)
    return tuple(combine(k, acc[k], t[k], ops) if k in used else acc[k] for k in range(len(acc)))


@cute.jit
def _thread_pass(ends: cute.Tensor, rb: Int32, M: Int32, first: Int32, step: cutlass.Constexpr,
                 used: cutlass.Constexpr, shift: cutlass.Constexpr, rows: cutlass.Constexpr):
    """One thread's partial results over groups first, first + step, ... (``step``: stride;
    ``rows``: a row tile's, terms)."""
    G = Int32(ends.shape[0])
    a0, a1, a2, a3, a4 = init(M)
    # (the block searches' threads pass over at most ceil(G / nthreads) groups each: one trip
    # for G <= nthreads, no unrolling; a warp's lanes over G / 32: LLVM's unrolling batches loads)
    for h in cutlass.range(first, G, step, unroll=1 if step > 32 else 0):
        e = clamp_end(Int32(ends[h]), M)
        e_prev = Int32(0)
        if cutlass.const_expr(3 in used or 4 in used):  # (group sizes: the swizzled starts' terms only)
            e_prev = clamp_end(Int32(ends[cutlass.max(h - 1, Int32(0))]), M)
            e_prev = Int32(cutlass.select_(h > 0, e_prev, Int32(0)))
        a0, a1, a2, a3, a4 = accumulate((a0, a1, a2, a3, a4), h, e_prev, e, G, rb, M, used, shift, rows=rows)
    return a0, a1, a2, a3, a4


@cute.jit
def _block_search(ends: cute.Tensor, red: cute.Tensor, rb: Int32, M: Int32, nthreads: cutlass.Constexpr,
                  used: cutlass.Constexpr, redux: cutlass.Constexpr, rows: cutlass.Constexpr):
    """The CTA's reductions (every thread gets them): the threads share the pass, each warp
    reduces each term (``redux``: one redux.sync, sm_80+; else a five-step shuffle butterfly),
    lane 0 of each warp writes a word per term, one barrier, a sum over the warps."""
    tidx, _, _ = cute.arch.thread_idx()
    lane = tidx % 32
    warp = tidx // 32
    a = list(_thread_pass(ends, rb, M, tidx, stride("block", nthreads), used, redux, rows))
    if cutlass.const_expr(redux):
        for k in cutlass.range_constexpr(N_TERMS):
            if cutlass.const_expr(k in used):
                a[k] = cute.arch.warp_redux_sync(a[k], REDUX[k])
    else:
        for s in cutlass.range_constexpr(5):
            for k in cutlass.range_constexpr(N_TERMS):
                if cutlass.const_expr(k in used):
                    a[k] = combine(k, a[k], cute.arch.shuffle_sync_bfly(a[k], offset=1 << s))
    if lane == 0:
        for k in cutlass.range_constexpr(N_TERMS):
            if cutlass.const_expr(k in used):
                red[k, warp] = a[k]
    cute.arch.sync_threads()
    r = list(init(M))
    for k in cutlass.range_constexpr(N_TERMS):
        if cutlass.const_expr(k in used):
            r[k] = red[k, 0]
    for w in cutlass.range_constexpr(1, nthreads // 32):
        for k in cutlass.range_constexpr(N_TERMS):
            if cutlass.const_expr(k in used):
                r[k] = combine(k, r[k], red[k, w])
    return r[0], r[1], r[2], r[3], r[4]


@cute.jit
def _warp_search(ends: cute.Tensor, rb: Int32, M: Int32, used: cutlass.Constexpr, rows: cutlass.Constexpr):
    """This warp's reductions, every lane getting them: the lanes share the pass, one redux.sync
    per term (sm_80+)."""
    tidx, _, _ = cute.arch.thread_idx()
    a = list(_thread_pass(ends, rb, M, tidx % 32, stride("warps", 32), used, True, rows))
    for k in cutlass.range_constexpr(N_TERMS):
        if cutlass.const_expr(k in used):
            a[k] = cute.arch.warp_redux_sync(a[k], REDUX[k])
    return a[0], a[1], a[2], a[3], a[4]


@cute.jit
def _broadcast_search(ends: cute.Tensor, red: cute.Tensor, rb: Int32, M: Int32, used: cutlass.Constexpr,
                      rows: cutlass.Constexpr):
    """Warp 0's reductions (_warp_search) for every thread of the CTA: its lane 0 writes a word
    per term to ``red`` (N_TERMS x 1), one barrier, every thread reads them."""
    tidx, _, _ = cute.arch.thread_idx()
    if tidx < 32:
        a = _warp_search(ends, rb, M, used, rows)
        if tidx == 0:
            for k in cutlass.range_constexpr(N_TERMS):
                if cutlass.const_expr(k in used):
                    red[k, 0] = a[k]
    cute.arch.sync_threads()
    r = list(init(M))
    for k in cutlass.range_constexpr(N_TERMS):
        if cutlass.const_expr(k in used):
            r[k] = red[k, 0]
    return r[0], r[1], r[2], r[3], r[4]


@cute.jit
def find_group(ends: cute.Tensor, red, rb: Int32, M: Int32, nthreads: cutlass.Constexpr,
               search: cutlass.Constexpr = "block_all", used: cutlass.Constexpr = tuple(range(N_TERMS)),
               rows: cutlass.Constexpr = ROWS):
    """(g, start_g, end_g, swizzled rowwise rows before g, swizzled colwise block rows before g)
    of row tile rb for every thread of the CTA's ``nthreads``, by ``search`` (config.Tuning.
    group_search; terms not in ``used`` are left at their identities, init; every search but
    "block_all" computes terms with shifts and reduces a warp's with redux.sync):
    "block_all" / "block": _block_search, through ``red`` (shared Int32, N_TERMS x (nthreads /
    32)); "warp": _broadcast_search, through ``red`` (N_TERMS x 1); "warps": every warp runs
    _warp_search for itself (``red``: None, no barrier). ``rows``: a row tile's rows (terms)."""
    if cutlass.const_expr(search == "warps"):
        r0, r1, r2, r3, r4 = _warp_search(ends, rb, M, used, rows)
    elif cutlass.const_expr(search == "warp"):
        r0, r1, r2, r3, r4 = _broadcast_search(ends, red, rb, M, used, rows)
    else:
        r0, r1, r2, r3, r4 = _block_search(ends, red, rb, M, nthreads, used, search == "block", rows)
    return r0, r1, r2, r3, r4


def scratch(smem, nthreads: int, search: str = "block_all"):
    """The shared scratch find_group reduces through (config.group_scratch), from allocator
    ``smem``; None for "warps"."""
    bufs = group_scratch(nthreads // 32, search)
    return shared.allocate(smem, bufs)["group"] if bufs else None


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
    """Row tile rb of a grouped call, as the kernels use it (Int32 device values): ``g`` its group,
    ``start`` the group's first row, ``b`` the tile's index in the group, ``row0`` and ``row_end``
    its rows, ``G`` the group count; swizzled layouts: ``row_sw``, ``col_sw``, ``col_t512``
    (swizzled_bases). A tile with no rows has b = 0 and writes nothing to the swizzled buffers."""

    def __init__(self, ends, red, rb, M, N, cfg, nthreads: int):
        """``red``: the CTA's scratch (config.group_scratch; None for "warps"); ``N``: the outputs'
        width (2N for a two-halves op, whose halves share the groups' scale rows); ``cfg``: the
        KernelConfig (its scale layout, group_search, group_terms and tile_rows)."""
        g, start, end, rows_before, blocks_before = find_group(ends, red, rb, M, nthreads, cfg.group_search,
                                                               cfg.group_terms, cfg.tile_rows)
        self.g, self.start, self.G = g, start, Int32(ends.shape[0])
        self.row0, self.row_end, b, nb = tile(rb, g, start, end, rows=cfg.tile_rows)
        self.b = b
        if cfg.fmt.swizzled:
            self.row_sw, self.col_sw, self.col_t512 = swizzled_bases(rows_before, blocks_before, b, nb, N)


def group_amax(amax: cute.Tensor, gt: "GroupTile") -> cute.Tensor:
    """NVFP4's amax slot of a grouped call's tile: entry g of the per-group amax [G] (each group
    quantized with its own, docs/NUMERICS.md), as a tensor whose entry 0 it is, so the amax pass's
    atomics and the quantize pass's reads (codec.global_scales, device.amax_atomic) take it as
    they take an ungrouped call's one amax."""
    return cute.make_tensor(amax.iterator + gt.g, cute.make_layout(1))


def row_tiles(M, G, rows: int = ROWS):
    """Row tiles of a grouped call whose tiles have ``rows`` rows (rows of the compact grouped
    colwise scale buffer)."""
    return M // rows + G
