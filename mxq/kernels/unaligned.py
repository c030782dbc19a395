"""Rows at any alignment for the packed kernel (16-bit inputs with N % 8 != 0, or tensors that
are not 16-byte aligned): rows are staged through shared memory as whole 16-byte chunks, read
back realigned, and FP8 rows leave as realigned 8-byte units. The vectorised kernel's fp32 rows
at any alignment use the same chunks (``read_chunked_words``) or are copied word by word
(``stage_words``, at the end), and store whole units (``store_unit_or_prefix``).

A 256-column row segment of such a tensor starts anywhere inside a 16-byte chunk, so a thread's
8 columns cannot be one 16-byte load. Instead:

- ``stage_row``: the warp copies the 16-byte chunks covering the segment, from the chunk it
  starts in (at most 33 chunks), into one shared-memory row with cp.async, 16 bytes per lane.
  A chunk holding any byte of the segment lies in one mapped page, so its other bytes (the
  neighbouring tile's, the next row's) are safe to read; the kernel masks their magnitudes
  (``column_masks``) and never stores them.
- ``read_row``: lane l reads the two chunks its 16 bytes lie in and funnel-shifts the 5 words
  around its 8 columns into the 4 packed words the aligned kernel would have loaded (a branch
  per word offset, which the whole warp shares, picks the words).
- ``store_row``: lane l's 8 FP8 bytes straddle two aligned 8-byte units; the lane writes the
  second one (its last bytes and its neighbour's first, taken by a shuffle) as one 8-byte store
  when it lies wholly inside the segment, so a warp's stores cover 256 contiguous bytes. The
  segment's two partial units (its head, lane 0's first unit, and its tail) are parked in shared
  memory and written once per warp by ``flush_edges``, one lane per unit. (A per-row branch for
  them cost the kernel 3.5x the aligned one's instructions, and 4-byte stores 8 bytes apart
  doubled its L2 write sectors in ncu.)

Rows 8 apart share their misalignment: a 16-bit row is twice its row stride in bytes, so rows r
and r + 8 start a multiple of 16 bytes apart (the same offset inside a chunk), and FP8 rows a
multiple of 8 apart (the same offset inside a unit). The kernel gives a thread rows w, w + W,
w + 2W, ... (W warps) and computes the read plan (``read_plan``) and the store plan
(``store_plan``) once per class of rows 8 apart (``plan_period``), not per row.

Every address here is a plain byte address computed from the tensor's layout: a strided view,
a row operand (row stride 0) and a grouped call's rows need nothing else. The helpers that
branch on device values are ``@cute.jit`` (inlined into the kernel that calls them), but for
``read_row``, whose branch on the word offset is inside its PTX block; the
arithmetic that decides which bytes go where (``read_plan``, ``realign_pairs``, ``unit_offset``,
``head_bytes``, ``tail_bytes``) is written once over ``ops`` (device.DEVICE or device.HOST), so
tests/test_kernels.py checks it on the CPU for every misalignment and segment length.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint16, Uint32, Uint64

from .config import CHUNK, UNIT
from .device import DEVICE


def byte_address(t, r, c):
    """Global byte address of element (r, c) of 2-D tensor ``t`` (strides from its layout)."""
    eb = t.element_type.width // 8
    return t.iterator.toint() + (Int64(r) * t.layout.stride[0] + Int64(c) * t.layout.stride[1]) * eb


def at_address(el, a, n: int = 1, align: int = 0):
    """The ``n`` elements of type ``el`` from global byte address ``a`` as a tensor (``align``:
    the bytes ``a`` is known to be a multiple of; default one element's)."""
    return cute.make_tensor(cute.make_ptr(el, a, cute.AddressSpace.gmem, assumed_align=align or el.width // 8),
                            cute.make_layout(n))


def row_base(t, r, c, step: int = 1):
    """(byte address of t[r, c], bytes between a thread's rows): its rows r, r + step, ... at
    column c."""
    return byte_address(t, r, c), Int64(t.layout.stride[0]) * (step * t.element_type.width // 8)


def plan_period(step: int) -> int:
    """Rows of a thread (``step`` rows apart) before their misalignment repeats: rows 8 apart
    share it."""
    return 8 // math.gcd(step, 8)


def plans_per_thread(rows: int, step: int) -> int:
    """Read and store plans a thread of ``rows`` rows ``step`` apart computes: its row i takes
    plan i % plans_per_thread(rows, step)."""
    return min(rows, plan_period(step))


def unit_misalignment(a):
    """Bytes of address ``a`` past the start of its 8-byte output unit (a row's store plan)."""
    return Int32(a & Int64(UNIT - 1))


def chunk_misalignment(a):
    """Bytes of address ``a`` past the start of its 16-byte chunk (a row's read plan)."""
    return Int32(a & Int64(CHUNK - 1))


def per_class(base, period: int, f):
    """``f`` of the first ``period`` rows' addresses of ``base`` (row_base): one value per class
    of rows 8 apart."""
    return [f(row_at(base, p)) for p in range(period)]


def read_plans(mis, lane):
    """read_plan of each class's misalignment ``mis``. (read_row's branch table needs the word
    offset q to be the same in every lane of a warp: it is, as long as a warp's lanes read one row
    together, which every tiling of the unaligned kernel does.)"""
    return [read_plan(m, lane) for m in mis]


def store_plans(base, period: int, ncols, lane):
    """store_plan of each class of output rows of ``base`` (row_base)."""
    return per_class(base, period, lambda a: store_plan(unit_misalignment(a), ncols, lane))


def row_at(base, i):
    """Byte address of row ``i`` of ``base`` (from row_base)."""
    return base[0] + Int64(i) * base[1]


@cute.jit
def stage_row(el: cutlass.Constexpr, buf, a, mis, ncols, lane, ok, zero_missing: cutlass.Constexpr = False):
    """Copy the chunks covering the ``ncols`` elements of type ``el`` from byte address ``a``,
    starting ``mis`` = chunk_misalignment(a) bytes before it, into ``buf`` (a row of
    config.unaligned_row_elements elements in shared memory, 16-byte aligned) with cp.async;
    ``ok``: the row exists; ``zero_missing``: a row that does not exist is staged as zeros (its
    reads need no branch). The caller commits the group, waits for it and syncs the warp before
    ``read_row``."""
    eb = el.width // 8
    n = (mis + ncols * eb + (CHUNK - 1)) // CHUNK
    first = (a - Int64(mis)) + Int64(lane * CHUNK)
    atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), el,
                               num_bits_per_copy=CHUNK * 8)
    per = CHUNK // eb
    dst = cute.zipped_divide(buf, (per,))  # (chunk elements, chunks)
    nch = cute.size(buf) // per
    if cutlass.const_expr(zero_missing):
        zero = cute.make_rmem_tensor(cute.make_layout(per), el)
        zero.fill(0)
    for k in cutlass.range_constexpr((nch + 31) // 32):
        ch = lane + 32 * k
        if ok and ch < n:
            cute.copy(atom, at_address(el, first + Int64(32 * k * CHUNK), per, CHUNK), dst[(None, ch)])
        if cutlass.const_expr(zero_missing):
            if not ok and ch < nch:
                cute.autovec_copy(zero, dst[(None, ch)])


def shf_r(lo, hi, sh):
    """The 32 bits of hi:lo shifted right by ``sh`` (clamped at 32: sh == 32 gives hi)."""
    return cute.arch.inline_ptx("shf.r.clamp.b32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Uint32],
                                read_only_args=[Uint32(lo), Uint32(hi), Uint32(sh)])


def read_plan(mis, lane):
    """Where lane ``lane``'s 16 bytes lie in a row staged with misalignment ``mis`` (0..15, bytes
    past the first staged chunk's start): (first of the two chunks they span, word offset q in
    it, bit shift)."""
    return lane, (mis >> 2) & 3, (mis & 3) << 3


def realign_pairs(q: int):
    """(lo, hi) word indices into a lane's two chunks of each of its 4 realigned words at word
    offset ``q``: word k is hi:lo = v[q + k + 1]:v[q + k] shifted right by the plan's bits."""
    return [(q + k, q + k + 1) for k in range(4)]


# read_row's realignment (_REALIGN_PTX): a branch through a table on q (warp-uniform, every lane of a warp reads the same
# row: brx.idx.uni) to 4 funnel shifts with fixed operands, instead of picking the words with two
# levels of selects (12 SEL per row and source before the shifts). Operands: $r0..$r7 the two chunks' words, $r8 q, $r9 the shift.
_REALIGN_PTX = (
    "{\nRA_T: .branchtargets RA_Q0, RA_Q1, RA_Q2, RA_Q3;\nbrx.idx.uni {$r8}, RA_T;\n"
    + "".join(f"RA_Q{q}:\n"
              + "".join(f"shf.r.clamp.b32 {{$w{k}}}, {{$r{lo}}}, {{$r{hi}}}, {{$r9}};\n"
                        for k, (lo, hi) in enumerate(realign_pairs(q)))
              + ("bra.uni RA_END;\n" if q < 3 else "") for q in range(4))
    + "RA_END:\n\t}"  # (the tab: a PTX reader that cuts a kernel at its first "\\n}\\n" still finds its end)
)


def read_row(buf_words, plan):
    """A lane's 16 bytes (4 packed words) of a row staged by stage_row, as the aligned kernel
    would have loaded them; ``plan``: read_plan of the row's misalignment and the lane.
    ``buf_words``: the staged row as 32-bit words. The lane loads the two whole chunks its bytes
    lie in (16-byte loads, no bank conflicts: 4-byte loads of its 5 words ran 4-way conflicted)
    and funnel-shifts the 5 words from its word offset on by the byte offset."""
    c, q, sh = plan
    chunks = cute.zipped_divide(buf_words, (CHUNK // 4,))  # (words of a chunk, chunks)
    v = []
    for k in range(2):
        frag = cute.make_rmem_tensor(cute.make_layout(CHUNK // 4), Uint32)
        cute.autovec_copy(chunks[(None, c + k)], frag)
        v += [frag[j] for j in range(CHUNK // 4)]
    return list(cute.arch.inline_ptx(_REALIGN_PTX, write_only_types=[Uint32] * 4,
                                     read_only_args=v + [Uint32(q), Uint32(sh)]))


def column_masks(nvalid, nwords: int):
    """AND masks of a thread's packed 16-bit words when only its first ``nvalid`` columns exist
    (nvalid may be <= 0 or >= 2 * nwords)."""
    full = Uint32(0xFFFFFFFF)
    return [Uint32(cutlass.select_(nvalid >= 2 * k + 2, full,
                                   cutlass.select_(nvalid >= 2 * k + 1, Uint32(0xFFFF), Uint32(0))))
            for k in range(nwords)]


def store_b64(addr, lo, hi, pred=None):
    """One 8-byte store of the words ``lo``, ``hi`` at global byte address ``addr`` (a multiple of
    8), where ``pred`` (None: always)."""
    cute.arch.inline_ptx("st.global.v2.b32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, Uint32(lo), Uint32(hi)],
                         predicate=pred)


@cute.jit
def store_unit_or_prefix(addr, lo, hi, whole, part, n):
    """The unit ``lo``, ``hi`` at ``addr`` (a multiple of 8): one 8-byte store where ``whole``;
    where ``part`` (a row's partial last unit: rare, so a branch) bytes [0, n) one at a time."""
    store_b64(addr, lo, hi, whole)
    if part:
        v = (Uint64(hi) << Uint64(32)) | Uint64(lo)
        for k in cutlass.range_constexpr(UNIT - 1):
            if k < n:
                _st(8, addr + Int64(k), v >> Uint64(8 * k))


def _st(width: int, addr, v):
    """A ``width``-bit store (8, 16 or 32) of the low bits of ``v`` (a piece of an edge unit)."""
    val = Uint16(Uint32(v) & Uint32((1 << width) - 1)) if width < 32 else Uint32(v)
    cute.arch.inline_ptx(f"st.global.b{width} [{{$r0}}], {{$r1}};", read_only_args=[addr, val])


# Output units of a segment of ncols bytes whose first byte lies b bytes past an 8-byte
# boundary: units start at offsets -b, 8 - b, 16 - b, ... of the segment. Lane l writes the unit
# at unit_offset(l, b) when it lies wholly inside; the head unit (offset -b) and the tail unit
# (tail_offset) are written in part, by flush_edges.
def unit_offset(lane, b):
    """Offset of the unit lane ``lane`` writes: its last b bytes and its neighbour's first."""
    return lane * UNIT + UNIT - b


def tail_offset(ncols, b):
    """Offset of the unit holding the segment's last bytes when they do not fill it."""
    return ncols - ((ncols + b) & (UNIT - 1))


def head_bytes(b, ncols, ops=DEVICE):
    """[first, end) of the head unit (offset -b) that belong to the segment."""
    return b, ops.min(ops.I32(UNIT), b + ncols)


def tail_bytes(ncols, b, ops=DEVICE):
    """(offset, [0, end)) of the tail unit's bytes that belong to the segment; end 0 when the
    tail is the head unit (a segment inside one unit) or the segment ends on a boundary."""
    t0 = tail_offset(ncols, b)
    return t0, ops.select(t0 + b >= UNIT, ncols - t0, ops.I32(0))


def store_plan(b, ncols, lane):
    """What store_row does with a row segment of ``ncols`` bytes starting ``b`` bytes past an
    8-byte boundary, for lane ``lane``: (b, which words and shift form its unit, the unit's
    offset, whether it is whole, whether it is the tail)."""
    # the unit at offset o = 8l + 8 - b: the byte stream d0 d1 n0 n1 (n: the next lane's) from byte s = 8 - b on
    s = UNIT - b
    far = s >= 4
    sh = Uint32(8 * s - Int32(cutlass.select_(far, Int32(32), Int32(0))))
    o = unit_offset(lane, b)
    return b, far, sh, o, o + UNIT <= ncols, o == tail_offset(ncols, b)


@cute.jit
def store_row(p0, plan, lane, d0, d1, edges, slot: cutlass.Constexpr):
    """Store one FP8 row segment from byte address ``p0`` (``plan``: store_plan of its
    misalignment): lane l holds bytes 8l .. 8l + 7 as words ``d0``, ``d1``. Every lane of the
    warp calls this (shuffles). Whole 8-byte units go to global memory; the head unit (holding
    lane 0's first bytes) and the tail unit are parked in ``edges`` (2 words each, slots ``slot``
    and ``slot + 1``) for flush_edges."""
    b, far, sh, o, whole, tail = plan
    n0 = Uint32(cute.arch.shuffle_sync_down(Int32(d0), offset=1))  # the next lane's bytes
    n1 = Uint32(cute.arch.shuffle_sync_down(Int32(d1), offset=1))
    x0 = cutlass.select_(far, d1, d0)
    x1 = cutlass.select_(far, n0, d1)
    x2 = cutlass.select_(far, n1, n0)
    lo = shf_r(x0, x1, sh)
    hi = shf_r(x1, x2, sh)
    if whole:
        store_b64(p0 + Int64(o), lo, hi)
    if lane == 0:  # the head unit at offset -b holds lane 0's bytes from byte b on (flush_edges shifts them)
        edges[2 * slot] = d0
        edges[2 * slot + 1] = d1
    if tail:
        edges[2 * slot + 2] = lo
        edges[2 * slot + 3] = hi


def unit_store_plan(lane, ncols):
    """What store_unit_aligned does with lane ``lane``'s unit (offset 8 * lane) of a segment of
    ``ncols`` bytes that starts on a unit boundary: (the unit lies wholly inside: one 8-byte
    store, the unit holds the segment's partial last unit: parked for flush_edges)."""
    o = lane * UNIT
    return o + UNIT <= ncols, (o < ncols) & (o + UNIT > ncols)


@cute.jit
def store_unit_aligned(p, ok, plan, d0, d1, edges, slot: cutlass.Constexpr):
    """Store lane l's unit of one FP8 row segment that starts on a unit boundary: bytes 8l ..
    8l + 7 (words ``d0``, ``d1``) at address ``p`` (the segment's start + 8l), when the row
    exists (``ok``); ``plan``: unit_store_plan. Whole units are one predicated 8-byte store; the
    segment's partial last unit is parked in ``edges`` (slots ``slot + 1``) for
    flush_edges(..., aligned_rows=True)."""
    whole, part = plan
    store_b64(p, d0, d1, ok & whole)
    if ok & part:
        edges[2 * slot + 2] = d0
        edges[2 * slot + 3] = d1


@cute.jit
def flush_edges(edges, lane, dirs, nrows: cutlass.Constexpr, step: cutlass.Constexpr, rows_left, ncols,
                aligned_rows: cutlass.Constexpr):
    """Write the partial units store_row parked: slot 2 * (d * nrows + i) (+1) holds the head
    (tail) unit of the thread's row i in direction d, whose segment starts at
    ``row_at(dirs[d], i)``; one lane per slot, rows with i * step < ``rows_left`` only, and of
    each unit only the segment's bytes. ``aligned_rows``: the segments start on unit boundaries
    (store_unit_aligned): no heads, and a tail of any length. The caller syncs the warp first."""
    nslots = 2 * nrows * len(dirs)
    if lane < nslots:
        i = (lane // 2) % nrows
        d = lane // (2 * nrows)
        p0 = row_at(dirs[0], i)
        for dd in cutlass.range_constexpr(1, len(dirs)):
            if d == dd:
                p0 = row_at(dirs[dd], i)
        b = unit_misalignment(p0)
        v = (Uint64(edges[2 * lane + 1]) << Uint64(32)) | Uint64(edges[2 * lane])
        addr = p0 - Int64(b)  # head: the unit at offset -b, lane 0's bytes moved to byte b on
        v = v << Uint64(8 * b)
        first, end = head_bytes(b, ncols)
        if cutlass.const_expr(aligned_rows):
            end = first  # (no head)
        if lane % 2 == 1:  # tail
            t0, tend = tail_bytes(ncols, b)
            if cutlass.const_expr(aligned_rows):
                tend = ncols - t0  # (the segment's last ncols % 8 bytes, also in a segment of one unit)
            addr = p0 + Int64(t0)
            v = (Uint64(edges[2 * lane + 1]) << Uint64(32)) | Uint64(edges[2 * lane])
            first = Int32(0)
            end = Int32(tend)
        if i * step < rows_left:
            # bytes [first, end) of the unit in aligned pieces (at most 4 stores, each its own
            # request: byte stores cost the kernel more L1 wavefronts than all its other stores)
            p = first
            if p < end and (p & 1) != 0:
                _st(8, addr + Int64(p), v >> Uint64(8 * p))
                p = p + 1
            if p + 2 <= end and (p & 2) != 0:
                _st(16, addr + Int64(p), v >> Uint64(8 * p))
                p = p + 2
            for _ in cutlass.range_constexpr(2):
                if p + 4 <= end:
                    _st(32, addr + Int64(p), v >> Uint64(8 * p))
                    p = p + 4
            if p + 2 <= end:
                _st(16, addr + Int64(p), v >> Uint64(8 * p))
                p = p + 2
            if p < end:
                _st(8, addr + Int64(p), v >> Uint64(8 * p))


# --- fp32 rows by words (vectorized.py's unaligned rows) ---------------------------------------
# An fp32 row starts on a 4-byte boundary, so it can be copied into place without realigning:
# a warp's 256-column row segment goes to 256 consecutive shared words (lane l's columns 8l ..
# 8l + 7 then being its two 16-byte quads), 4 bytes per copy, or 8 where the row starts on 8
# bytes. The quads are swizzled so that neither the copies nor the reads have bank conflicts.

def staged_word(l, k: int):
    """The word of a staged fp32 row segment (256 words) that lane ``l``'s k-th
    copy (the segment's word l + 32k) lands in. Quads (16 bytes, 4 words) are swizzled: logical
    quad q sits at q ^ ((q >> 3) & 1), so the lanes of a 16-byte read phase (8 lanes, quads 2l or
    2l + 1) hit all 32 banks; without it the reads ran 2-way conflicted. A copy's 32 words stay
    8 whole quads (conflict-free writes): odd k swaps the quads of each pair."""
    return (l ^ 4) + 32 * k if k % 2 else l + 32 * k


def staged_pair(l, k: int):
    """The word of a staged fp32 row segment that lane ``l``'s
    k-th 8-byte copy (the segment's words 2l + 64k and 2l + 64k + 1) lands in, swizzled as
    staged_word."""
    return ((2 * l) ^ (((l >> 4) & 1) * 4)) + 64 * k


def staged_quad(l, h: int):
    """The quad of a staged fp32 row segment holding lane ``l``'s columns 4h .. 4h + 3
    (logical quad 2l + h, swizzled as staged_word places it)."""
    return (2 * l + h) ^ ((l >> 2) & 1)


def cp_async_word(dst, src, ok):
    """cp.async of one 4-byte word from global byte address ``src`` to shared byte address
    ``dst`` (32 bits); where ``ok`` is false the source is not read and the word is zeroed
    (ignore-src). L1-cached: the neighbouring word of a warp's next copy hits the same sectors."""
    cute.arch.inline_ptx("{ .reg .pred p; setp.eq.s32 p, {$r2}, 0; cp.async.ca.shared.global [{$r0}], [{$r1}], 4, p; }",
                         read_only_args=[Int32(dst), src, Int32(cutlass.select_(ok, Int32(1), Int32(0)))])


def cp_async_bytes(dst, src, size: int, nbytes):
    """cp.async of ``size`` bytes (4, 8 or 16) from global byte address ``src`` to shared byte
    address ``dst`` (both multiples of ``size``): the first ``nbytes`` (0 .. size) read, the rest
    zeroed. (Also reduce.dbias_round's copies.)"""
    cute.arch.inline_ptx(f"cp.async.ca.shared.global [{{$r0}}], [{{$r1}}], {size}, {{$r2}};",
                         read_only_args=[Int32(dst), src, Int32(nbytes)])


@cute.jit
def stage_words(seg, a, lane, ok, cvalid, pbytes):
    """Copy one row segment of 256 fp32 words from global byte address ``a`` (lane ``lane``'s
    first word: the segment start + 4 * lane) into shared memory at ``seg`` (a pointer to its 256
    swizzled words) with cp.async: 4 copies of 8 bytes per lane where the segment starts on 8
    bytes (a branch the warp shares), else 8 of 4 bytes. ``ok``: the row exists; ``cvalid[k]``:
    word l + 32k exists; ``pbytes[k]``: the bytes of the pair (2l + 64k, 2l + 64k + 1) that
    exist (0, 4 or 8). Words that do not exist are zeroed, not read."""
    if ((a - Int64(4 * lane)) & Int64(7)) == Int64(0):
        for k in cutlass.range_constexpr(4):
            cp_async_bytes((seg + staged_pair(lane, k)).toint(), a + Int64(4 * lane + 256 * k), 8,
                           Int32(cutlass.select_(ok, pbytes[k], Int32(0))))
    else:
        for k in cutlass.range_constexpr(8):
            cp_async_word((seg + staged_word(lane, k)).toint(), a + Int64(128 * k), ok & cvalid[k])


def read_words(seg, lane, frag):
    """Lane ``lane``'s 8 columns of a segment staged by stage_words (two 16-byte shared loads)
    into ``frag`` (8 fp32 values)."""
    for h in range(2):
        quad = cute.make_rmem_tensor(cute.make_layout(4), Float32)
        at = cute.assume(staged_quad(lane, h) * 4, divby=4)
        cute.autovec_copy(cute.make_tensor(seg + at, cute.make_layout(4)), quad)
        for j in range(4):
            frag[4 * h + j] = quad[j]


def read_chunked_words(row, a, lane, frag):
    """Lane ``lane``'s 8 columns of an fp32 row segment staged as chunks by stage_row (``row``:
    its shared row, ``a``: its global byte address) into ``frag``: read_row twice, the two quads
    realigned by whole words (an fp32 row's misalignment is a multiple of 4 bytes: no bit shift)."""
    q = (chunk_misalignment(a) >> 2) & 3
    words = cute.recast_tensor(row, Uint32)
    fw = cute.recast_tensor(frag, Uint32)
    for h in range(2):
        got = read_row(words, (2 * lane + h, q, Int32(0)))
        for j in range(4):
            fw[4 * h + j] = got[j]
