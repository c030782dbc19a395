"""The two small kernels around a quantize kernel: amax's zeroing and dbias's final reduction."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32

from .config import DBIAS_UNROLL, DBIAS_WARPS, ROWS
from .grouped import clamp_end


@cute.kernel
def amax_init_kernel(amax: cute.Tensor, noop: cute.Tensor):
    """Zero the amax before the quantize kernel's atomic max-combine (unless noop)."""
    if noop[0] != Float32(1.0):
        amax[0] = Float32(0.0)


def dbias_grid(N, G=None):
    """Column tiles x (groups of a grouped call)."""
    return [cute.ceil_div(N, 32), 1 if G is None else G, 1], [32 * DBIAS_WARPS, 1, 1]


@cute.kernel
def dbias_kernel(dbias_ws: cute.Tensor, dbias: cute.Tensor, noop: cute.Tensor, group_ends, MB: Int32, M: Int32,
                 N: Int32, use_pdl: cutlass.Constexpr):
    """dbias[c] = sum of the per-CTA partials of column c (fp32 for 16-bit inputs, fp64 for fp32
    inputs), added in fp64 in a fixed order (deterministic, no atomics). A grouped call
    (``group_ends``) sums each group's own partial rows (its colwise blocks, grouped.py) into
    dbias[g, c], group g = the grid's y index; an empty group's row is 0.

    A CTA owns 32 columns (lane = column, a warp's load is one 128- or 256-byte row piece), warp w
    takes rows w, w + DBIAS_WARPS, ..., and a round of the CTA reads DBIAS_WARPS * DBIAS_UNROLL
    consecutive rows with DBIAS_UNROLL loads in flight per thread, in separate sums. Order: a
    thread's sums in index order, then the warps' in warp order."""
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
    if noop[0] != Float32(1.0):
        acc = cute.make_rmem_tensor(cute.make_layout(DBIAS_UNROLL), Float64)
        acc.fill(0.0)
        first = Int32(0)  # the partials' first row and count
        if cutlass.const_expr(group_ends is not None):
            start = Int32(0)
            if gy > 0:
                start = clamp_end(Int32(group_ends[gy - 1]), M)
            end = clamp_end(Int32(group_ends[gy]), M)
            first = start // ROWS + gy
            MB = (cutlass.max(end - start, Int32(0)) + ROWS - 1) // ROWS
        if c < N:
            step = DBIAS_WARPS * DBIAS_UNROLL
            last = MB - 1
            for b in cutlass.range(warp, cute.ceil_div(MB, step) * step, step):
                # the last round too has no branch around a load (ptxas keeps loads of separate
                # blocks in order, one latency after another): a row past the end is read as
                # row MB - 1 and added as 0
                for u in cutlass.range_constexpr(DBIAS_UNROLL):
                    r = b + u * DBIAS_WARPS
                    p = dbias_ws[first + cutlass.min(r, last), c].to(Float64)
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
