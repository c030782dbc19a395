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
  the next (taking its neighbour's first bytes by a shuffle), lane 0 the first; a word that is
  not wholly inside the segment is written byte by byte, so no byte outside it is touched.

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
    s0 = t.layout.stride[0]
    s1 = t.layout.stride[1]
    return t.iterator.toint() + (Int64(r) * s0 + Int64(c) * s1) * eb


@cute.jit
def stage_row(src, buf, r, c, ncols, lane, ok):
    """Copy the chunks covering ``src[r, c : c + ncols]`` into ``buf`` (a row of row_elements
    elements in shared memory, 16-byte aligned) with cp.async; ``ok``: the row exists. The
    caller commits the group, waits for it and syncs the warp before ``read_row``."""
    el = src.element_type
    eb = el.width // 8
    a = byte_address(src, r, c)
    mis = Int32(a & Int64(CHUNK - 1))
    base = a - Int64(mis)
    n = (mis + ncols * eb + (CHUNK - 1)) // CHUNK
    atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), el,
                               num_bits_per_copy=CHUNK * 8)
    per = CHUNK // eb
    dst = cute.zipped_divide(buf, (per,))  # (chunk elements, chunks)
    for k in cutlass.range_constexpr((cute.size(buf) // per + 31) // 32):
        ch = lane + 32 * k
        if ok and ch < n:
            g = cute.make_tensor(cute.make_ptr(el, base + Int64(ch * CHUNK), cute.AddressSpace.gmem,
                                               assumed_align=CHUNK), cute.make_layout(per))
            cute.copy(atom, g, dst[(None, ch)])


def misalignment(src, r, c):
    """Bytes between ``src[r, c]`` and the 16-byte chunk it lies in (stage_row's offset)."""
    return Int32(byte_address(src, r, c) & Int64(CHUNK - 1))


def shf_r(lo, hi, sh):
    """The 32 bits of hi:lo shifted right by ``sh`` (clamped at 32: sh == 32 gives hi)."""
    return cute.arch.inline_ptx("shf.r.clamp.b32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Uint32],
                                read_only_args=[Uint32(lo), Uint32(hi), Uint32(sh)])


def read_row(buf_words, mis, lane, nwords: int):
    """Lane ``lane``'s ``nwords`` words (16 bytes for nwords == 4) of a row staged by stage_row
    with misalignment ``mis`` (bytes, a multiple of the element size), as the aligned kernel
    would have loaded them. ``buf_words``: the staged row as 32-bit words."""
    q0 = mis // 4 + lane * nwords
    sh = Uint32((mis % 4) * 8)
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


@cute.jit
def store_word(addr, w, lo, hi):
    """Word ``w`` at byte address ``addr`` (4-byte aligned), only its bytes inside [lo, hi)."""
    if addr >= lo and addr + Int64(4) <= hi:
        _st_b32(addr, w)
    else:
        for t in cutlass.range_constexpr(4):
            if addr + Int64(t) >= lo and addr + Int64(t) < hi:
                _st_b8(addr + Int64(t), w >> Uint32(8 * t))


@cute.jit
def store_row(p0, ncols, lane, d0, d1, ok):
    """Store the FP8 bytes of one row segment: lane l holds bytes 8l .. 8l + 7 of the segment
    that starts at byte address ``p0`` (any alignment) as words ``d0``, ``d1``; only the
    segment's first ``ncols`` bytes are written. Every lane of the warp calls this (a shuffle);
    ``ok``: this lane has bytes to write."""
    b = Int32(p0 & Int64(3))
    n0 = Uint32(cute.arch.shuffle_sync_down(Int32(d0), offset=1))  # the next lane's first word
    sh = Uint32((4 - b) * 8)
    lo = p0
    hi = p0 + Int64(ncols)
    pl = p0 + Int64(8 * lane) - Int64(b)  # the aligned word holding the lane's first byte
    if ok:
        store_word(pl + Int64(4), shf_r(d0, d1, sh), lo, hi)
        store_word(pl + Int64(8), shf_r(d1, n0, sh), lo, hi)
        if lane == 0:
            store_word(pl, Uint32(d0) << Uint32(8 * b), lo, hi)
