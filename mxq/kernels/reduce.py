"""The small kernels around a quantize kernel: amax's zeroing and dbias's final reduction
(dbias_kernel; a grouped call's many small groups under Tuning.dbias_group_rows:
dbias_groups_kernel)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Int64

from . import unaligned as ua
from .config import DBIAS_BYTES_IN_FLIGHT, DBIAS_UNROLL, DBIAS_WARPS, ROWS
from .grouped import clamp_end


@cute.kernel
def amax_init_kernel(amax: cute.Tensor, noop: cute.Tensor, entries: cutlass.Constexpr = 1):
    """Zero the amax (``entries`` of it: 2 for NVFP4's Hadamard transform, amax and colwise_amax;
    0: all of it, a grouped NVFP4 call's amax per group, the block's threads striding over it)
    before the quantize kernel's atomic max-combine (unless noop)."""
    if noop[0] != Float32(1.0):
        if cutlass.const_expr(entries == 0):
            tidx, _, _ = cute.arch.thread_idx()
            bdim, _, _ = cute.arch.block_dim()
            for i in cutlass.range(tidx, amax.shape[0], bdim):
                amax[i] = Float32(0.0)
        else:
            for i in cutlass.range_constexpr(entries):
                amax[i] = Float32(0.0)


def dbias_grid(N, G=None):
    """Column tiles x (groups of a grouped call)."""
    return [cute.ceil_div(N, 32), 1 if G is None else G, 1], [32 * DBIAS_WARPS, 1, 1]


def dbias_groups_grid(N, G):
    """dbias_groups_kernel: column tiles x groups of DBIAS_WARPS."""
    return [cute.ceil_div(N, 32), cute.ceil_div(G, DBIAS_WARPS), 1], [32 * DBIAS_WARPS, 1, 1]


@cute.jit
def dbias_round(sBuf, acc, a0, rbytes, b, MB, n: cutlass.Constexpr, tidx):
    """One round of dbias_kernel for thread ``tidx``: copy rows b, b + DBIAS_WARPS, ... (n of
    them, from byte address a0 + row * rbytes) into its slots sBuf[i, tidx], wait, and add row i
    to sum i % DBIAS_UNROLL. A row past MB is not read: its slot is zero-filled and adds 0."""
    eb = sBuf.element_type.width // 8
    nthreads = cute.size(sBuf, mode=[1])
    slot = sBuf.iterator + tidx  # copy i goes to slot + i * nthreads
    for i in cutlass.range_constexpr(n):
        r = b + i * DBIAS_WARPS
        ua.cp_async_bytes(slot.toint() + (i * nthreads) * eb, a0 + Int64(cutlass.min(r, MB - 1)) * rbytes, eb,
                          Int32(cutlass.select_(r < MB, Int32(eb), Int32(0))))
    cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(0)  # (a thread reads only its own slots: no barrier)
    for i in cutlass.range_constexpr(n):
        acc[i % DBIAS_UNROLL] = acc[i % DBIAS_UNROLL] + sBuf[i, tidx].to(Float64)


@cute.jit
def group_partials(group_ends: cute.Tensor, g: Int32, M: Int32, rows: cutlass.Constexpr = ROWS):
    """(first row, rows) of group g's partial sums in a grouped call's dbias workspace: its
    colwise blocks of ``rows`` rows, the quantize kernel's row tiles (grouped.py)."""
    start = Int32(0)
    if g > 0:
        start = clamp_end(Int32(group_ends[g - 1]), M)
    end = clamp_end(Int32(group_ends[g]), M)
    return start // rows + g, (cutlass.max(end - start, Int32(0)) + rows - 1) // rows


@cute.kernel
def dbias_kernel(dbias_ws: cute.Tensor, dbias: cute.Tensor, noop: cute.Tensor, group_ends, MB: Int32, M: Int32,
                 N: Int32, use_pdl: cutlass.Constexpr, staged: cutlass.Constexpr, rows: cutlass.Constexpr = ROWS):
    """dbias[c] = sum of the per-CTA partials of column c (fp32 for 16-bit inputs, fp64 for fp32
    inputs), added in fp64 in a fixed order (deterministic, no atomics). A grouped call
    (``group_ends``) sums each group's own partial rows (its colwise blocks, grouped.py) into
    dbias[g, c], group g = the grid's y index; an empty group's row is 0.

    A CTA owns 32 columns (lane = column, a warp's copy is one 128- or 256-byte row piece) and
    warp w takes rows w, w + DBIAS_WARPS, ...; the thread's row i (counting from 0) goes to sum
    i % DBIAS_UNROLL. Order: each sum in row order, a thread's sums in index order, then the warps'
    in warp order.

    Two forms, one order of additions (so the same bits):
    - ``staged`` (long reductions, more than PDL_MAX_ROWS rows): bound by its loads' latency (at
      N = 4096 one CTA of 256 threads per SM), a round copies DBIAS_BYTES_IN_FLIGHT bytes of
      partials per thread into the thread's own slots of shared memory with cp.async (32 KB per
      CTA in flight), waits once, then adds them (dbias_round). Loaded into registers instead,
      ptxas interleaved the loads with the additions and kept about 6 in flight.
    - not staged (short ones, launched early with ``use_pdl``): rounds of DBIAS_UNROLL loads into
      registers; without the 32 KB of shared memory a small call ran about 2 us faster."""
    if cutlass.const_expr(use_pdl):
        # launched early (programmatic dependent launch, sm_90+): wait until the quantize kernel
        # has finished and its partials are visible
        cute.arch.griddepcontrol_wait()
    tidx, _, _ = cute.arch.thread_idx()
    cb, gy, _ = cute.arch.block_idx()
    lane = tidx % 32
    warp = tidx // 32
    c = cb * 32 + lane
    smem = cutlass.memory.SmemAllocator()
    sPart = smem.allocate_tensor(Float64, cute.make_layout((DBIAS_WARPS, 32), stride=(32, 1)), 16)
    EB = cutlass.const_expr(dbias_ws.element_type.width // 8)  # bytes per partial
    if cutlass.const_expr(staged):
        NV = cutlass.const_expr(DBIAS_BYTES_IN_FLIGHT // EB)  # partials a thread copies per round
        NTHREADS = cutlass.const_expr(32 * DBIAS_WARPS)
        sBuf = smem.allocate_tensor(dbias_ws.element_type, cute.make_layout((NV, NTHREADS), stride=(NTHREADS, 1)), 16)
    if noop[0] != Float32(1.0):
        acc = cute.make_rmem_tensor(cute.make_layout(DBIAS_UNROLL), Float64)
        acc.fill(0.0)
        first = Int32(0)  # the partials' first row and count
        if cutlass.const_expr(group_ends is not None):
            first, MB = group_partials(group_ends, gy, M, rows)
        if cutlass.const_expr(staged):
            if c < N:
                step = DBIAS_WARPS * NV  # rows per round of the CTA
                a0 = ua.byte_address(dbias_ws, first, c)
                rbytes = Int64(dbias_ws.layout.stride[0]) * EB
                for base in cutlass.range(0, MB, step):
                    # (a round of at most half the rows copies half as many: 6144 rows have 192 rows
                    # of partials, which full rounds would copy as 256 and 256 zero-filled slots)
                    if MB - base > step // 2:
                        dbias_round(sBuf, acc, a0, rbytes, base + warp, MB, NV, tidx)
                    else:
                        dbias_round(sBuf, acc, a0, rbytes, base + warp, MB, NV // 2, tidx)
        else:
            if c < N:
                step = DBIAS_WARPS * DBIAS_UNROLL
                last = MB - 1
                top = cutlass.max(last, Int32(0))  # (the row read: an empty group reads its first row, added as 0)
                for b in cutlass.range(warp, cute.ceil_div(MB, step) * step, step):
                    # the last round too has no branch around a load (ptxas keeps loads of separate
                    # blocks in order, one latency after another): a row past the end is read as
                    # row MB - 1 and added as 0
                    for u in cutlass.range_constexpr(DBIAS_UNROLL):
                        r = b + u * DBIAS_WARPS
                        p = dbias_ws[first + cutlass.min(r, top), c].to(Float64)
                        acc[u] = acc[u] + Float64(cutlass.select_(r <= last, p, Float64(0.0)))
        t = acc[0]
        for u in cutlass.range_constexpr(1, DBIAS_UNROLL):
            t = t + acc[u]
        sPart[warp, lane] = t
        cute.arch.sync_threads()
        if warp == 0 and c < N:
            s = sPart[0, lane]
            for w in cutlass.range_constexpr(1, DBIAS_WARPS):
                s = s + sPart[w, lane]
            if cutlass.const_expr(group_ends is not None):
                dbias[gy, c] = s.to(Float32).to(dbias.element_type)
            else:
                dbias[c] = s.to(Float32).to(dbias.element_type)  # fp64 -> fp32 -> dtype, as the reference


ROUND = DBIAS_WARPS * DBIAS_UNROLL  # dbias_groups_kernel: rows of partials per round (dbias_kernel's rows per step)
FEW_ROWS = DBIAS_WARPS  # ... and the most a group's partials may have for its sum of those rows alone


@cute.jit
def few_rows_sum(dbias_ws: cute.Tensor, first: Int32, top: Int32, last: Int32, c: Int32) -> Float64:
    """dbias_groups_kernel's sum of a group's rows first .. first + last (last < FEW_ROWS) of
    column c: 0 + p[0], then + (0 + p[r]) in row order, FEW_ROWS loads at once."""
    p = cute.make_rmem_tensor(cute.make_layout(FEW_ROWS), dbias_ws.element_type)
    for r in cutlass.range_constexpr(FEW_ROWS):
        p[r] = dbias_ws[first + cutlass.min(Int32(r), top), c]
    s = Float64(0.0)
    for r in cutlass.range_constexpr(FEW_ROWS):
        s = s + Float64(cutlass.select_(r <= last, Float64(0.0) + p[r].to(Float64), Float64(0.0)))
    return s


@cute.jit
def rounds_sum(dbias_ws: cute.Tensor, first: Int32, top: Int32, last: Int32, MB: Int32, c: Int32) -> Float64:
    """dbias_groups_kernel's sum of a group's MB rows of partials from row ``first`` of column c,
    in dbias_kernel's order: its first ROUND rows loaded at once, the rest a round at a time."""
    p0 = cute.make_rmem_tensor(cute.make_layout(ROUND), dbias_ws.element_type)  # row r of the first round, or 0
    for r in cutlass.range_constexpr(ROUND):
        q = dbias_ws[first + cutlass.min(Int32(r), top), c]
        p0[r] = dbias_ws.element_type(cutlass.select_(r <= last, q, dbias_ws.element_type(0.0)))
    s = Float64(0.0)
    acc = cute.make_rmem_tensor(cute.make_layout(DBIAS_UNROLL), Float64)
    for v in cutlass.range_constexpr(DBIAS_WARPS):
        for u in cutlass.range_constexpr(DBIAS_UNROLL):
            acc[u] = Float64(0.0) + p0[v + u * DBIAS_WARPS].to(Float64)
        for base in cutlass.range(ROUND, MB, ROUND):
            for u in cutlass.range_constexpr(DBIAS_UNROLL):
                r = base + v + u * DBIAS_WARPS
                p = dbias_ws[first + cutlass.min(r, top), c].to(Float64)
                acc[u] = acc[u] + Float64(cutlass.select_(r <= last, p, Float64(0.0)))
        t = acc[0]
        for u in cutlass.range_constexpr(1, DBIAS_UNROLL):
            t = t + acc[u]
        if cutlass.const_expr(v == 0):
            s = t
        else:
            s = s + t
    return s  # (the caller rounds fp64 -> fp32 -> dtype, as the reference)


@cute.kernel
def dbias_groups_kernel(dbias_ws: cute.Tensor, dbias: cute.Tensor, noop: cute.Tensor, group_ends: cute.Tensor,
                        M: Int32, N: Int32, use_pdl: cutlass.Constexpr, rows: cutlass.Constexpr = ROWS):
    """A grouped call's dbias[g, c] for many small groups (Tuning.dbias_group_rows): a warp per
    group (warp w of CTA y: group y * DBIAS_WARPS + w), lane = column, with dbias_kernel's
    additions in dbias_kernel's order, so the same bits: sum u of "warp" v is its rows
    v + 8 u + 32 k (k = 0, 1, ...) in row order, fp64; each v's sums added in index order, then the
    v's in order (where dbias_kernel's warp v holds them). A group's first ROUND rows are loaded
    at once (rows past its end read its last row and add 0, as in dbias_kernel; 32 independent
    loads), the rest a round at a time for each v in turn (rare: a group above ROUND partial
    rows, 1024 rows of 32-row tiles, 4096 of 128-row ones). An empty group's row is 0.

    A group of at most DBIAS_WARPS partial rows (most groups of a call of hundreds) loads only
    those (FEW_ROWS loads; 8 in place of ROUND's 32): its rows are v + 0 of each v, so the sum
    above is 0 + p[0], then + (0 + p[v]) in order, and each added 0 it drops is +0.0 added to a
    sum that is never -0.0 (0 + x is not; nor is a sum of two such), which leaves it unchanged."""
    if cutlass.const_expr(use_pdl):
        cute.arch.griddepcontrol_wait()  # (launched early: the quantize kernel's partials are visible)
    tidx, _, _ = cute.arch.thread_idx()
    cb, gb, _ = cute.arch.block_idx()
    g = gb * DBIAS_WARPS + tidx // 32
    c = cb * 32 + tidx % 32
    if noop[0] != Float32(1.0) and g < group_ends.shape[0] and c < N:
        first, MB = group_partials(group_ends, g, M, rows)
        last = MB - 1
        # (rows past the end read the last row, an empty group's its first row: group_partials'
        # first row exists for every group, even an empty one at the end)
        top = cutlass.max(last, Int32(0))
        if MB <= FEW_ROWS:
            dbias[g, c] = few_rows_sum(dbias_ws, first, top, last, c).to(Float32).to(dbias.element_type)
        else:
            dbias[g, c] = rounds_sum(dbias_ws, first, top, last, MB, c).to(Float32).to(dbias.element_type)
