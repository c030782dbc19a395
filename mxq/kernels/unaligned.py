"""Rows at any alignment for the packed kernel (16-bit inputs with N % 8 != 0, or tensors that
are not 16-byte aligned): rows are staged through shared memory as whole 16-byte chunks, read
back realigned, and FP8 rows leave as realigned 4-byte words.

A 256-column row segment of such a tensor starts anywhere inside a 16-byte chunk, so a thread's
8 columns cannot be one 16-byte load. Instead:

- ``stage_row``: the warp copies the aligned chunks covering the segment (at most 33) into one
  shared-memory row with cp.async, 16 bytes per lane. A chunk holding any byte of the segment
  lies in one mapped page, so its other bytes (the neighbouring tile's, the next row's) are safe
  to read; they are masked later (``column_masks``).
- ``read_row``: lane l reads the 5 words around its 8 columns and funnel-shifts them into the 4
  packed words the aligned kernel would have loaded (the shift is the segment's misalignment,
  the same for the whole warp).
- ``store_row``: lane l's 8 FP8 bytes straddle three aligned words; it writes the middle one and
  the next (taking its neighbour's first bytes by a shuffle) when they lie wholly inside the
  segment. The segment's two partial words (its head, in lane 0's first word, and its tail)
  are parked in shared memory and written byte by byte once per warp by ``flush_edges``, one
  lane per partial word: a per-row branch for them cost the kernel 3.5x the instructions of the
  aligned one (divergent lanes, instruction-cache misses; ncu, docs/performance.md).

Every address here is a plain byte address computed from the tensor's layout: a strided view,
a row operand (row stride 0) and a grouped call's rows need nothing else. The helpers that
branch on device values are ``@cute.jit`` (inlined into the kernel that calls them).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint16, Uint32

CHUNK = 16  # bytes per cp.async copy


def row_elements(cols: int, elem_bytes: int) -> int:
    """Elements of the 16-byte chunks that cover any ``cols``-column segment of a row (one
    chunk more than an aligned segment needs)."""
    return (cols * elem_bytes // CHUNK + 1) * CHUNK // elem_bytes


def byte_address(t, r, c):
    """Global byte address of element (r, c) of 2-D tensor ``t`` (strides from its layout)."""
    eb = t.element_type.width // 8
    return t.iterator.toint() + (Int64(r) * t.layout.stride[0] + Int64(c) * t.layout.stride[1]) * eb


def row_base(t, r, c):
    """(byte address of t[r, c], bytes between rows): a thread's rows r, r + 1, ... at column c."""
    return byte_address(t, r, c), Int64(t.layout.stride[0]) * (t.element_type.width // 8)


def row_at(base, i):
    """Byte address of row ``i`` of ``base`` (from row_base)."""
    return base[0] + Int64(i) * base[1]


@cute.jit
def stage_row(el: cutlass.Constexpr, buf, a, ncols, lane, ok):
    """Copy the chunks covering the ``ncols`` elements of type ``el`` from byte address ``a`` into
    ``buf`` (a row of row_elements elements in shared memory, 16-byte aligned) with cp.async;
    ``ok``: the row exists. The caller commits the group, waits for it and syncs the warp before
    ``read_row``."""
    eb = el.width // 8
    mis = Int32(a & Int64(CHUNK - 1))
    n = (mis + ncols * eb + (CHUNK - 1)) // CHUNK
    first = (a - Int64(mis)) + Int64(lane * CHUNK)
    atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), el,
                               num_bits_per_copy=CHUNK * 8)
    per = CHUNK // eb
    dst = cute.zipped_divide(buf, (per,))  # (chunk elements, chunks)
    for k in cutlass.range_constexpr((cute.size(buf) // per + 31) // 32):
        ch = lane + 32 * k
        if ok and ch < n:
            g = cute.make_tensor(cute.make_ptr(el, first + Int64(32 * k * CHUNK), cute.AddressSpace.gmem,
                                               assumed_align=CHUNK), cute.make_layout(per))
            cute.copy(atom, g, dst[(None, ch)])


def shf_r(lo, hi, sh):
    """The 32 bits of hi:lo shifted right by ``sh`` (clamped at 32: sh == 32 gives hi)."""
    return cute.arch.inline_ptx("shf.r.clamp.b32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Uint32],
                                read_only_args=[Uint32(lo), Uint32(hi), Uint32(sh)])


def read_row(buf_words, a, lane, nwords: int):
    """Lane ``lane``'s ``nwords`` words (16 bytes for nwords == 4) of the row staged by stage_row
    from byte address ``a``, as the aligned kernel would have loaded them. ``buf_words``: the
    staged row as 32-bit words."""
    mis = Int32(a & Int64(CHUNK - 1))
    q0 = (mis >> 2) + lane * nwords
    sh = Uint32((mis & 3) << 3)
    w = [buf_words[q0 + k] for k in range(nwords + 1)]
    return [shf_r(w[k], w[k + 1], sh) for k in range(nwords)]


def column_masks(nvalid, nwords: int):
    """AND masks of a thread's packed 16-bit words when only its first ``nvalid`` columns exist
    (nvalid may be <= 0 or >= 2 * nwords)."""
    full = Uint32(0xFFFFFFFF)
    return [Uint32(cutlass.select_(nvalid >= 2 * k + 2, full,
                                   cutlass.select_(nvalid >= 2 * k + 1, Uint32(0xFFFF), Uint32(0))))
            for k in range(nwords)]


def _st_b32(addr, w):
    cute.arch.inline_ptx("st.global.b32 [{$r0}], {$r1};", read_only_args=[addr, Uint32(w)])


def _st_b8(addr, w):
    cute.arch.inline_ptx("st.global.b8 [{$r0}], {$r1};", read_only_args=[addr, Uint16(w & Uint32(0xFF))])


def _tail(ncols, b):
    """Offset (from the segment's first byte) of the word holding the segment's last partial
    bytes; the segment's word boundaries lie at offsets -b, 4 - b, ..."""
    return ncols - ((ncols + b) & 3)


@cute.jit
def store_row(p0, ncols, lane, d0, d1, edges, slot: cutlass.Constexpr):
    """Store one FP8 row segment of ``ncols`` bytes from byte address ``p0`` (any alignment):
    lane l holds bytes 8l .. 8l + 7 as words ``d0``, ``d1``. Every lane of the warp calls this
    (a shuffle). Whole words go to global memory; the head word (lane 0's first) and the tail
    word are parked in ``edges[slot]``, ``edges[slot + 1]`` for flush_edges."""
    b = Int32(p0 & Int64(3))
    n0 = Uint32(cute.arch.shuffle_sync_down(Int32(d0), offset=1))  # the next lane's first word
    sh = Uint32(32 - 8 * b)
    w1 = shf_r(d0, d1, sh)  # the word at offset o1: the lane's bytes 4 - b .. 7 - b
    w2 = shf_r(d1, n0, sh)  # the next word
    o1 = lane * 8 + 4 - b
    a1 = p0 + Int64(o1)
    if o1 + 4 <= ncols:
        _st_b32(a1, w1)
    if o1 + 8 <= ncols:
        _st_b32(a1 + Int64(4), w2)
    if lane == 0:
        edges[slot] = Uint32(d0) << Uint32(8 * b)
    t0 = _tail(ncols, b)
    if o1 == t0:
        edges[slot + 1] = w1
    if o1 + 4 == t0:
        edges[slot + 1] = w2


@cute.jit
def flush_edges(edges, lane, dirs, nrows: cutlass.Constexpr, live_rows, ncols):
    """Write the partial words store_row parked: slot 2 * (d * nrows + i) (+1) holds row i's head
    (tail) word of direction d, whose segment starts at ``row_at(dirs[d], i)``; one lane per
    slot, rows i < ``live_rows`` only, and of each word only the segment's bytes. The caller
    syncs the warp first."""
    nslots = 2 * nrows * len(dirs)
    if lane < nslots:
        i = (lane // 2) % nrows
        d = lane // (2 * nrows)
        p0 = row_at(dirs[0], i)
        for dd in cutlass.range_constexpr(1, len(dirs)):
            if d == dd:
                p0 = row_at(dirs[dd], i)
        b = Int32(p0 & Int64(3))
        w = edges[lane]
        addr = p0 - Int64(b)  # head: the word at offset -b, bytes [b, b + ncols)
        lo = b
        hi = cutlass.min(Int32(4), b + ncols)
        if lane % 2 == 1:  # tail: the word at offset t0, bytes [0, ncols - t0); none if it is the head word
            t0 = _tail(ncols, b)
            addr = p0 + Int64(t0)
            lo = Int32(0)
            hi = Int32(cutlass.select_(t0 + b >= 4, ncols - t0, Int32(0)))
        if i < live_rows:
            if lo == 0 and hi == 4:
                _st_b32(addr, w)
            else:
                for t in cutlass.range_constexpr(4):
                    if t >= lo and t < hi:
                        _st_b8(addr + Int64(t), w >> Uint32(8 * t))
