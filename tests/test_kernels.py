"""mxq/kernels/ on CPU: the integer and float logic the kernels trace, run on Python values and
checked against tests/oracle.py (written from docs/NUMERICS.md, sharing no code with mxq), and
the tiling choices of KernelConfig. The GPU side runs the same expressions inside the kernels:
tests/test_gpu.py and bench/device_check.py compare every output byte with the reference."""

import ast
import collections
import itertools
import math
import pathlib
import random
import re

import pytest

from mxq.formats.format import Format
from mxq.kernels import config as kconfig
from mxq.kernels import device as dev

from . import oracle


def _amax_values():
    """Block amax values (>= 0 or NaN) as fp32 bit patterns: every boundary the rules care about
    (zero, subnormals, powers of two and their neighbours, MAX * 2^k, the largest finite, inf,
    NaN) and random patterns."""
    pats = {0, 1, 2, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x7F800000, 0x7FC00000,
            0x7F800001, 0x7FFFFFFF}
    for e in range(0, 255):
        for m in (0, 1, 0x3FFFFF, 0x400000, 0x600000, 0x7FFFFE, 0x7FFFFF, 0x0FFFFF, 0x100000, 0x200000):
            pats.add((e << 23) | m)
    for mx in (448.0, 57344.0):
        for k in range(-140, 130):
            v = oracle.f32(math.ldexp(mx, k)) if -150 < k < 120 else 0.0
            if v and math.isfinite(v):
                b = oracle.bits(v)
                pats.update({b - 1, b, b + 1})
    rng = random.Random(5)
    pats.update(rng.randrange(0, 0x7F800001) for _ in range(4000))
    return sorted(p for p in pats if 0 <= p <= 0x7FFFFFFF)


AMAX = _amax_values()


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_scale_rules_match_the_oracle(fp8, mode):
    """The kernels' software scale rules (device.rceil_scale / exponent_scale, the exact
    expressions traced into every kernel without the sm_100 hardware conversion)."""
    rcp = oracle.from_bits(oracle.FMT[fp8][5])
    bad = []
    for b in AMAX:
        amax = oracle.from_bits(b)
        if mode == "rceil":
            p = oracle.f32(amax * rcp)
            got = dev.rceil_scale(oracle.bits(p) if not math.isnan(p) else 0x7FC00000, dev.HOST)
        else:
            got = dev.exponent_scale(dev.HOST.I32(b), lambda: math.isnan(amax), fp8, mode, dev.HOST)
        want = oracle.scale_byte(amax, fp8, mode)
        if got != want:
            bad.append((hex(b), got, want))
    assert not bad, bad[:10]


def test_rceil_is_the_smallest_power_of_two_at_or_above_amax_over_max():
    """An independent reading of RCEIL (docs/NUMERICS.md): 2^(e-127) is the smallest power of two
    >= p = fp32(amax * fp32(1/MAX)), clamped to [0, 254]; exact rational arithmetic."""
    from fractions import Fraction

    rcp = oracle.from_bits(oracle.FMT["e4m3"][5])
    for b in AMAX[::7]:
        amax = oracle.from_bits(b)
        p = oracle.f32(amax * rcp)
        if math.isnan(p) or math.isinf(p):
            continue
        got = dev.rceil_scale(oracle.bits(p), dev.HOST)
        if p == 0:
            assert got == 0
            continue
        e = 0
        while e < 254 and Fraction(2) ** (e - 127) < Fraction(p):
            e += 1
        assert got == e, (hex(b), got, e)


def test_inverse_scales_match_the_oracle():
    for e in range(256):
        got = dev.inv_scale_bits(e, dev.HOST) & 0xFFFFFFFF
        want = oracle.inv_scale(e)
        assert (math.isnan(want) and got == 0x7FC00000) or got == oracle.bits(want), e


def test_swizzle_offsets_match_the_oracle():
    for blocks in (1, 3, 4, 5, 8, 33):
        for i in range(0, 300):
            for j in range(blocks):
                assert dev.swizzle_offset(i, j, blocks) == oracle.swizzle_offset(i, j, blocks), (i, j, blocks)


def test_swizzle_offsets_by_hand():
    """cuBLAS 128x4 tiles of 512 bytes: row i's 16-byte group is i % 32, its 4-byte group within
    it (i % 128) // 32, then the block j % 4; tiles advance along the blocks first."""
    assert dev.swizzle_offset(0, 0, 4) == 0
    assert dev.swizzle_offset(0, 3, 4) == 3
    assert dev.swizzle_offset(1, 0, 4) == 16
    assert dev.swizzle_offset(32, 0, 4) == 4
    assert dev.swizzle_offset(0, 4, 8) == 512
    assert dev.swizzle_offset(128, 0, 8) == 1024


def _cfg(**kw):
    base = dict(fmt=Format.mxfp8("e4m3", "rceil", "compact"), rowwise=True, colwise=False, amax=False, dbias=False,
                n_inputs=1, n_scalars=0, identity=True, has_act=False, has_dact=False, heavy=False)
    return kconfig.KernelConfig(**{**base, **kw})


def test_tiling_choices_by_hand():
    """What docs/performance.md measured fastest: a pure rowwise cast takes the wide tile; ops
    with arithmetic stage their loads; dbias ops run 8 warps in both fast kernels, the heavy
    fp32 ops 8, the rest 4."""
    plain = _cfg()
    assert plain.wide and not plain.stage and not plain.col_reduce and plain.pk_warps == 4 and plain.vec_warps == 4
    both = _cfg(colwise=True)
    assert not both.wide and both.col_reduce and both.pk_warps == 4
    gelu = _cfg(colwise=True, has_act=True, heavy=True)
    assert gelu.stage and gelu.pk_warps == 4 and gelu.vec_warps == 8
    dbias = _cfg(colwise=True, dbias=True, has_dact=True, heavy=True)
    assert dbias.pk_warps == 8 and dbias.vec_warps == 8 and dbias.pdl
    assert not _cfg(dbias=True, heavy=True, tuning=kconfig.Tuning(pdl=False)).pdl
    assert _cfg(amax=True).col_reduce and not _cfg(amax=True).wide
    user = _cfg(identity=False)
    assert user.computed and user.stage


def test_library_configs_hold_no_benchmark_switch():
    """A library config has no Tuning (its repr, rendered into the module, names none) and reads
    the library's switches; the rows8 twins of a plain cast (a library choice) pin their warps
    on the config itself (8 for an even row stride, 4 for odd), a benchmark's Tuning on its own."""
    both = _cfg(colwise=True)
    assert both.tuning is None and "Tuning" not in repr(both) and "tuning=" not in repr(both)
    assert both.row_scale_l2_keep and both.rows8_min_blocks == 0
    twins = both.rows8_twins()
    assert [t.packed_warps(True) for t in twins] == [8, 4] and all(t.tuning is None for t in twins)
    assert "tuning=Tuning(pdl=False" in repr(_cfg(tuning=kconfig.Tuning(pdl=False)))
    tuned = _cfg(colwise=True, tuning=kconfig.Tuning(unaligned_warps=4, row_scale_l2_keep=False, rows8_min_blocks=3))
    assert tuned.packed_warps(True) == 4 and tuned.rows8_twins() is None
    assert not tuned.row_scale_l2_keep and tuned.rows8_min_blocks == 3
    assert both.min_blocks == 0 and tuned.min_blocks == 0  # (rows128_min_blocks: the 128-row tile only)


def test_rows128_register_cap_is_the_128_row_tiles_and_validated():
    """Tuning.rows128_min_blocks caps the 128-row tile (FP8 block scaling's colwise blocks) and
    no other; by default (None) a plain cast writing both directions (amax or not) and a dact op
    with dbias writing both (bf16 inputs) are capped at 2, and a grouped call of an op with
    arithmetic but no dact or dbias writing both (bf16), and nothing else is (colwise only, an
    act ungrouped, a dact without dbias, a plain cast with dbias, fp16 inputs of ops with
    arithmetic); a cap whose CTAs'
    shared memory would not share an SM is none (the unaligned kernel's two staged 128-row
    inputs, the transposed copy beside a dact op's ring); a negative cap is a clear error naming
    the field; register_cap names the default carveout beside the cap, and nothing for no cap."""
    from mxq.kernels.quantize import register_cap

    cap = kconfig.Tuning(rows128_min_blocks=2)
    fb = Format.fp8_block("e4m3", (1, 128), "pow2", "compact")
    gemm = Format.fp8_block("e4m3", (1, 128), "pow2", "gemm")
    assert _cfg(fmt=fb, colwise=True, tuning=cap).min_blocks == 2
    assert _cfg(fmt=fb, colwise=True).min_blocks == 2 and _cfg(fmt=fb, colwise=True, amax=True).min_blocks == 2
    assert _cfg(fmt=fb, colwise=True, tuning=kconfig.Tuning(rows128_min_blocks=0)).min_blocks == 0
    assert _cfg(fmt=fb, rowwise=False, colwise=True).min_blocks == 0
    assert _cfg(fmt=fb, colwise=True, has_act=True, identity=False).min_blocks == 0
    dact = dict(fmt=fb, colwise=True, dbias=True, has_dact=True, heavy=True)
    assert _cfg(**dact).min_blocks == 2 and _cfg(**dact).packed_min_blocks(fp16=True) == 0
    assert _cfg(**dact, tuning=cap).packed_min_blocks(fp16=True) == 2  # (a benchmark's cap is its own)
    assert _cfg(**dact).packed_min_blocks(unaligned=True) == 0
    assert _cfg(**{**dact, "fmt": gemm}).min_blocks == 0 and _cfg(**{**dact, "fmt": gemm}, tuning=cap).min_blocks == 0
    assert _cfg(**{**dact, "dbias": False}).min_blocks == 0 and _cfg(**{**dact, "has_dact": False}).min_blocks == 0
    assert _cfg(fmt=fb, tuning=cap).min_blocks == 0 and _cfg(colwise=True, tuning=cap).min_blocks == 0
    # a grouped call of an op with arithmetic, no dact or dbias, writing both directions (bf16): 2 (grouped_ring),
    # its ungrouped call none; not fp16, the rowwise- or colwise-only tile, a dact op, nor under a Tuning cap
    act = dict(fmt=fb, colwise=True, has_act=True, identity=False)
    assert _cfg(**act).packed_min_blocks(grouped=True) == 2 and _cfg(**act).packed_min_blocks() == 0
    assert _cfg(fmt=fb, colwise=True, identity=False).packed_min_blocks(grouped=True) == 2  # (a user epilogue)
    assert _cfg(**act).stage_rows(False, True) == 8  # (two 512-thread CTAs' staged rows fit whole)
    assert _cfg(**act).packed_min_blocks(grouped=True, fp16=True) == 0
    assert _cfg(**{**act, "rowwise": False}).packed_min_blocks(grouped=True) == 0
    assert _cfg(**{**act, "has_act": False, "has_dact": True}).packed_min_blocks(grouped=True) == 0
    assert _cfg(**act, tuning=kconfig.Tuning(rows128_min_blocks=0)).packed_min_blocks(grouped=True) == 0
    assert _cfg(colwise=True, has_act=True, identity=False).packed_min_blocks(grouped=True) == 0  # (MXFP8's 32 rows)
    for fp4 in (Format.mxfp4("floor", "compact"), Format.nvfp4("compact")):  # (FP4's colwise tile of 64 rows: not this cap's)
        tall = _cfg(**{**act, "fmt": fp4}, tuning=kconfig.Tuning(fp4_col_rows=64))
        assert tall.tile_rows == 64 and tall.packed_min_blocks(grouped=True) == tall.packed_min_blocks() == 0
    for field in ("rows128_min_blocks", "rows8_min_blocks"):
        with pytest.raises(ValueError, match=field):
            kconfig.Tuning(**{field: -1})
    assert register_cap(0) == {} and register_cap(2) == {"min_blocks_per_mp": 2, "preferred_smem_carveout": -1}


def test_stage_rows_ring_halves_the_staged_inputs_to_share_an_sm():
    """KernelConfig.stage_rows: a dact op with dbias writing both directions (bf16, 128-row tile
    capped at 2 CTAs per SM) stages 4 of its threads' 8 rows at once, so its shared memory
    (by hand: column maxima 16 warps x 128 words, 256 inverse scales, 16 x 256 dbias sums, two
    inputs of 4 rows x 512 threads x 16 bytes) lets two CTAs (and their 1 KB each) share the
    228 KB of an SM, where all 8 rows (157,696 bytes with the same parts) would not; every other
    kernel stages all its rows."""
    fb = Format.fp8_block("e4m3", (1, 128), "pow2", "compact")
    dact = _cfg(fmt=fb, colwise=True, dbias=True, has_dact=True, heavy=True)
    parts = 16 * 128 * 4 + 256 * 4 + 16 * 256 * 4
    assert dact.stage_rows(False) == 4 and dact.packed_shared_bytes(2, False) == parts + 2 * 4 * 512 * 16
    assert dact.packed_shared_bytes(2, False, depth=8) == parts + 2 * 8 * 512 * 16
    assert 2 * (parts + 2 * 4 * 512 * 16 + 1024) <= 228 * 1024 < 2 * (parts + 2 * 8 * 512 * 16 + 1024)
    assert dact.stage_rows(False, fp16=True) == 8 and dact.stage_rows(True) == 8
    assert _cfg(fmt=fb, colwise=True, dbias=True, has_dact=True, tuning=kconfig.Tuning(rows128_min_blocks=0)
                ).stage_rows(False) == 8
    assert _cfg(fmt=fb, colwise=True).stage_rows(False) == 8 and _cfg(colwise=True, dbias=True).stage_rows(False) == 4


@pytest.mark.parametrize("depth,rows", [(4, 8), (8, 8), (2, 8), (1, 4), (3, 8)])
def test_ring_schedule_against_a_simulated_copy_queue(depth, rows):
    """packed.ring_wait / ring_next / ring_parks against a brute-force run of the staging: a
    queue of cp.async commit groups (one per staged row, rows 0 .. depth - 1 first, then the one
    ring_next names after each read) and ``depth`` slots. When row i is read: the slot i % depth
    holds row i, its group is complete under wait_group(ring_wait) (at least that many groups
    were committed after it) and waiting for one fewer pending would be needed no more (exactly
    that many: no needless wait); a parked row's slot is never written again, and every row is
    staged exactly once."""
    from mxq.kernels import packed

    groups, slot = [], {}
    for r in range(min(depth, rows)):
        groups.append(r)
        slot[r % depth] = r
    parked = set()
    for i in range(rows):
        after = len(groups) - 1 - groups.index(i)
        assert slot[i % depth] == i and after == packed.ring_wait(i, depth, rows)
        nxt = packed.ring_next(i, depth, rows)
        if nxt is not None:
            assert nxt % depth == i % depth and i % depth not in parked
            groups.append(nxt)
            slot[nxt % depth] = nxt
        if packed.ring_parks(i, depth, rows):
            parked.add(i % depth)
    assert sorted(groups) == list(range(rows))
    assert len(parked) == (min(depth, rows) if depth < rows else 0)


# --- grouped row tiles (mxq/kernels/grouped.py), traced expressions run on Python ints ---------------
def _host_group_tile(ends, rb, m, rows=32):
    """grouped.find_group's reduction and grouped.tile, on HOST ops, for row tile rb of ``rows``
    rows."""
    from mxq.kernels import grouped

    H = dev.HOST
    acc = [0, 0, m, 0, 0]
    for h, e in enumerate(ends):
        e = grouped.clamp_end(e, m, H)
        e_prev = grouped.clamp_end(ends[h - 1], m, H) if h > 0 else 0
        t = grouped.terms(h, e_prev, e, len(ends), rb, m, H, rows=rows)
        acc = [acc[0] + t[0], max(acc[1], t[1]), min(acc[2], t[2]), acc[3] + t[3], acc[4] + t[4]]
    g, start, end, rows_before, blocks_before = acc
    return (g, *grouped.tile(rb, g, start, end, H, rows=rows), rows_before, blocks_before)


@pytest.mark.parametrize("rows", [32, 128])
@pytest.mark.parametrize("sizes", [[70], [20, 0, 50], [0, 0, 33], [1] * 40, [31, 33, 32, 1, 0, 300, 64],
                                   [5000, 3, 0, 29], [0], [32] * 9, [127, 128, 129, 0, 256, 1]])
def test_grouped_row_tiles_on_host(sizes, rows):
    """Every group's colwise blocks (``rows`` rows: MXFP8's 32, FP8 block scaling's 128) are row
    tiles start_g // rows + g + b holding rows [start_g + rows b, min(+rows, end_g)); every other
    tile of the M // rows + G (kernels.grouped.row_tiles) holds no rows; the tile of group g's
    first block is the scale row the placement of mxq/formats/groups.py gives it; the swizzled
    starts (32-row blocks) are the sums over the groups before (counted here by hand)."""
    from mxq.formats import groups
    from mxq.kernels import grouped

    m, G = sum(sizes), len(sizes)
    assert grouped.row_tiles(m, G, rows) == m // rows + G
    ends = list(itertools.accumulate(sizes))
    want = {}
    start, rows_sw, blocks_sw = 0, 0, 0
    for g, size in enumerate(sizes):
        nb = -(-size // rows)
        if nb:
            assert groups.first_block_row(g, start, rows) == start // rows + g
        for b in range(nb):
            want[start // rows + g + b] = (g, start + rows * b, min(start + rows * b + rows, start + size), b, nb,
                                           rows_sw, blocks_sw)
        rows_sw += -(-size // 128) * 128
        nb32 = -(-size // 32)  # (the swizzled colwise starts count 32-row blocks)
        blocks_sw += -(-nb32 // 4) * 4
        start += size
    assert max(want, default=-1) < m // rows + G <= groups.grouped_colwise_rows(m, G, rows)
    for rb in range(m // rows + G):
        g, row0, row_end, b, nb, rows_before, blocks_before = _host_group_tile(ends, rb, m, rows)
        if rb in want:
            assert (g, row0, row_end, b, nb, rows_before, blocks_before) == want[rb], rb
        else:
            assert row0 == row_end == 0, rb


def _ident(x):
    return x


def test_empty_exit_is_the_grouped_fp8_kernels_alone():
    """Tuning.empty_exit (a grouped row tile with no rows, row_end == row0 above, leaves after its
    group search: PackedKernel.empty_tile) serves MXFP8 and FP8 block scaling's 1x128 blocks, not
    FP4 nor 128x128 tiles, whose empty tiles write otherwise; off under Tuning(empty_exit=False).
    Compiled for sm_90 (bf16): the grouped kernel branches more with it and stores an immediate
    0.0 scale (the empty tile's), the whole tile's path a computed one; an ungrouped kernel's
    PTX is the same either way. GPU counterpart:
    tests/test_groups.py::test_empty_tiles_leave_early_with_the_same_bytes."""
    import mxq
    from mxq.runtime import inspection

    fb = Format.fp8_block("e4m3", (1, 128), "pow2", "compact")
    assert _cfg(colwise=True).empty_exit and _cfg(fmt=fb, colwise=True, has_dact=True, dbias=True).empty_exit
    assert not _cfg(colwise=True, tuning=kconfig.Tuning(empty_exit=False)).empty_exit
    assert not _cfg(fmt=Format.fp8_block("e4m3", (128, 128), "pow2", "compact"), colwise=True).empty_exit
    for fp4 in (Format.mxfp4("floor", "compact"), Format.nvfp4("compact")):
        assert not _cfg(fmt=fp4, colwise=True).empty_exit

    def ptx(variant, leave):
        op = mxq.fused_quant(format="fp8_block", rowwise=True, colwise=True, act="gelu")(_ident)
        return inspection.ptx_of(op._with_tuning(kconfig.Tuning(empty_exit=leave)), "sm_90", "bf16", variant)

    def branches(text):
        return len(re.findall(r"@%p\d+ bra", text))

    def zero_stores(text):
        return len(re.findall(r"st\.global\.b32\s+\[%rd\d+\], 0;", text))

    assert ptx("vec", True) == ptx("vec", False)
    leave, whole = ptx("vec_grouped", True), ptx("vec_grouped", False)
    assert branches(leave) > branches(whole) and zero_stores(leave) == 1 and zero_stores(whole) == 0


@pytest.mark.parametrize("rows", [32, 128])
def test_grouped_row_tiles_stay_in_bounds_for_bad_offsets(rows):
    """Offsets the CUDA path does not validate (decreasing, negative, past M) give tiles inside
    [0, M], at most ``rows`` rows each: unspecified bytes, never an access outside the buffers."""
    rng = random.Random(3)
    for _ in range(300):
        m = rng.randrange(1, 400)
        ends = [rng.randrange(-50, m + 80) for _ in range(rng.randrange(1, 9))]
        for rb in range(m // rows + len(ends)):
            g, row0, row_end, b, nb, _, _ = _host_group_tile(ends, rb, m, rows)
            assert 0 <= row0 <= row_end <= m and row_end - row0 <= rows and 0 <= g < len(ends)


# --- the group search's forms (kernels.config.Tuning.group_search), on HOST ops ------------------------
SEARCHES = kconfig.GROUP_SEARCHES


def _host_find_group(ends, rb, m, search, used, nthreads=128):
    """grouped.find_group's reductions for row tile rb on HOST ops: the pass over the ends split
    over threads as the kernels split it (the CTA's ``nthreads`` threads, or a warp's 32 lanes,
    each from its index by grouped.stride), each thread accumulating its groups' terms (grouped.accumulate, with the
    search's expressions), then the threads' partial results combined (grouped.combine: the
    butterflies, redux.sync and the sum over warps, any order). Terms not in ``used`` stay at
    their identities (grouped.init)."""
    from mxq.kernels import grouped

    H = dev.HOST
    G = len(ends)
    step = grouped.stride(search, nthreads)
    lanes = nthreads if search.startswith("block") else 32  # (the kernels' first group: tidx, or the lane)
    out = list(grouped.init(m, H))
    for first in range(min(lanes, G)):  # (threads past G pass over no group: identities)
        acc = grouped.init(m, H)
        for h in range(first, G, step):
            e = grouped.clamp_end(ends[h], m, H)
            e_prev = 0
            if 3 in used or 4 in used:
                e_prev = grouped.clamp_end(ends[max(h - 1, 0)], m, H) if h > 0 else 0
            acc = grouped.accumulate(acc, h, e_prev, e, G, rb, m, used, search != "block_all", H)
        out = [grouped.combine(k, out[k], acc[k], H) if k in used else out[k] for k in range(kconfig.N_TERMS)]
    return out


def _brute_force_tiles(sizes):
    """Row tile -> (g, first row, row end, block in the group, the group's blocks, swizzled rowwise
    rows and colwise block rows before the group), walking the groups in order (docs/NUMERICS.md
    "Groups"): every other tile of the M // 32 + G holds no rows."""
    want, start, rows_sw, blocks_sw = {}, 0, 0, 0
    for g, size in enumerate(sizes):
        nb = -(-size // 32)
        for b in range(nb):
            want[start // 32 + g + b] = (g, start + 32 * b, min(start + 32 * b + 32, start + size), b, nb, rows_sw,
                                         blocks_sw)
        rows_sw += -(-size // 128) * 128
        blocks_sw += -(-nb // 4) * 4
        start += size
    return want


def _search_sizes():
    """Group sizes: random with empty groups (first and last among them), one group (empty or
    not), 256 groups (empty ones, small and large), all empty but one."""
    rng = random.Random(11)
    cases = [[70], [0], [5000], [0, 0, 33, 0], [31, 33, 32, 1, 0, 300, 64]]
    for n in (3, 9, 40):
        sizes = [rng.choice([0, 0, rng.randrange(1, 33), rng.randrange(1, 300)]) for _ in range(n)]
        cases.append([0, *sizes, 0])
    cases.append([rng.choice([0, 1, 31, 32, 33, rng.randrange(0, 200)]) for _ in range(256)])
    cases.append([0] * 255 + [1000])
    cases.append([1000] + [0] * 255)
    return cases


def _search_configs(search):
    """A config per set of terms the kernels read: compact, and swizzled rowwise, colwise, both."""
    def cfg(layout, rowwise, colwise):
        return _cfg(fmt=Format.mxfp8("e4m3", "rceil", layout), rowwise=rowwise, colwise=colwise,
                    tuning=kconfig.Tuning(group_search=search))
    return [cfg("compact", True, True), cfg("swizzled", True, False), cfg("swizzled", False, True),
            cfg("swizzled", True, True)]


@pytest.mark.parametrize("search", SEARCHES)
def test_group_search_forms_find_every_tile_by_brute_force(search):
    """Each form of the group search, for each set of terms a config reads and the CTA sizes of
    the kernels (128 and 256 threads), gives every row tile the group, rows and block a walk over
    the groups gives (_brute_force_tiles), and where the config reads them the swizzled starts;
    tiles past a group's blocks hold no rows. 256-group calls: a sample of tiles (groups' first
    and last blocks, the tiles after them, random others)."""
    from mxq.kernels import grouped

    H = dev.HOST
    rng = random.Random(13)
    for sizes in _search_sizes():
        m, G = sum(sizes), len(sizes)
        ends = list(itertools.accumulate(sizes))
        want = _brute_force_tiles(sizes)
        tiles = range(m // 32 + G)
        if G > 64:
            firsts = sorted(t for t in want if want[t][3] == 0)
            lasts = sorted(t for t in want if want[t][3] == want[t][4] - 1)
            pick = [*rng.sample(firsts, min(12, len(firsts))), *rng.sample(lasts, min(12, len(lasts)))]
            tiles = sorted({*pick, *(t + 1 for t in pick), *rng.sample(tiles, 12)} & set(tiles))
        for cfg in _search_configs(search):
            used = cfg.group_terms
            for nthreads in ((128, 256) if search.startswith("block") else (128,)):
                for rb in tiles:
                    g, start, end, rows_before, blocks_before = _host_find_group(ends, rb, m, search, used, nthreads)
                    row0, row_end, b, nb = grouped.tile(rb, g, start, end, H)
                    if rb in want:
                        wg, w0, wend, wb, wnb, wrows, wblocks = want[rb]
                        assert (g, row0, row_end, b, nb) == (wg, w0, wend, wb, wnb), (search, sizes, rb)
                        if cfg.fmt.swizzled and cfg.rowwise:
                            assert rows_before == wrows, (search, sizes, rb)
                        if cfg.fmt.swizzled and cfg.colwise:
                            assert blocks_before == wblocks, (search, sizes, rb)
                    else:
                        assert row0 == row_end == 0, (search, sizes, rb)


def test_group_search_forms_agree_on_bad_offsets():
    """Offsets the CUDA path does not validate (decreasing, negative, past M): every form gives
    the library's form's ("block_all") values of the terms it reduces (exact integer min, max and
    sums of the same terms, shifts for divisions by powers of two), so the same tiles: inside
    [0, M], at most 32 rows."""
    rng = random.Random(17)
    for _ in range(40):
        m = rng.randrange(1, 300)
        ends = [rng.randrange(-50, m + 80) for _ in range(rng.randrange(1, 24))]
        for rb in range(m // 32 + len(ends)):
            base = _host_find_group(ends, rb, m, "block_all", tuple(range(kconfig.N_TERMS)))
            for search in SEARCHES:
                for cfg in _search_configs(search):
                    got = _host_find_group(ends, rb, m, search, cfg.group_terms)
                    assert [got[k] for k in cfg.group_terms] == [base[k] for k in cfg.group_terms], (search, ends, rb)


def test_group_search_terms_and_scratch_by_hand():
    """The library's form reduces all five terms through a word per warp and term; the others
    the group's index, start and end, plus the swizzled rowwise rows before it where the config
    writes swizzled rowwise scales and the colwise block rows where it writes swizzled colwise
    ones; "warp" broadcasts through a word per term, "warps" takes no shared memory; a form that
    does not exist is an error naming the field."""
    from mxq.kernels.smem import nbytes

    assert _cfg().group_search == "block_all" and _cfg(colwise=True).group_terms == (0, 1, 2, 3, 4)
    # the library's choice for ops with arithmetic: every warp searches for itself
    assert _cfg(has_act=True, identity=False).group_search == "warps"
    want = {("compact", True, True): (0, 1, 2), ("swizzled", True, False): (0, 1, 2, 3),
            ("swizzled", False, True): (0, 1, 2, 4), ("swizzled", True, True): (0, 1, 2, 3, 4)}
    for search in SEARCHES[1:]:
        for cfg in _search_configs(search):
            assert cfg.group_search == search
            assert cfg.group_terms == want[(cfg.fmt.layout, cfg.rowwise, cfg.colwise)]
    for search, words in (("block_all", 5 * 4), ("block", 5 * 4), ("warp", 5), ("warps", 0)):
        cfg = _cfg(colwise=True, tuning=kconfig.Tuning(group_search=search))
        grouped_bytes = nbytes(cfg.packed_buffers([], False, grouped=True))
        assert grouped_bytes - nbytes(cfg.packed_buffers([], False)) == -(-words * 4 // 16) * 16, search
    for bad in ("Block", "warp0", "none"):
        with pytest.raises(ValueError, match="Tuning.group_search must be"):
            kconfig.Tuning(group_search=bad)


def test_grouped_swizzled_offsets_regroup_the_swizzle():
    """The grouped tiles' split swizzled offsets (a per-tile base + a per-element rest) equal the
    group region's start + device.swizzle_offset of the row / column within the group."""
    from mxq.kernels import grouped

    rng = random.Random(5)
    for _ in range(400):
        n = rng.choice([32, 96, 200, 256, 4096, 7000])
        nbr = -(-n // 32)
        nb = rng.randrange(1, 40)
        b = rng.randrange(nb)
        rows_before, blocks_before = rng.randrange(0, 50) * 128, rng.randrange(0, 50) * 4
        row_sw, col_sw, col_t512 = grouped.swizzled_bases(rows_before, blocks_before, b, nb, n)
        for _ in range(20):
            i, blk, c = rng.randrange(32), rng.randrange(nbr), rng.randrange(n)
            want_row = rows_before * (-(-nbr // 4) * 4) + dev.swizzle_offset(32 * b + i, blk, nbr)
            assert grouped.row_swizzled_offset(row_sw, i, blk) == want_row
            want_col = blocks_before * (-(-n // 128) * 128) + dev.swizzle_offset(c, b, nb)
            assert grouped.col_swizzled_offset(col_sw, col_t512, c) == want_col


# --- unaligned rows (mxq/kernels/unaligned.py): the byte bookkeeping, on the host ------------------------
def _shf_r_clamp(lo, hi, sh):
    """The PTX shf.r.clamp.b32 of (lo, hi, sh), from its definition (an independent model)."""
    return (((hi << 32) | lo) >> min(sh, 32)) & 0xFFFFFFFF


@pytest.mark.parametrize("mis", range(16))
def test_unaligned_reads_realign_every_misalignment(mis):
    """A row staged from its 16-byte chunk (33 chunks): for every misalignment, each lane's two
    chunks, the word pairs of its word offset and the funnel shift give exactly the 16 bytes at
    mis + 16 * lane; and the device's branch for word offset q shifts exactly those pairs."""
    from mxq.kernels import unaligned as ua

    row = bytes((i * 73 + 11) % 251 for i in range(kconfig.unaligned_row_elements(256, 2) * 2))
    words = [int.from_bytes(row[4 * i:4 * i + 4], "little") for i in range(len(row) // 4)]
    for lane in range(32):
        c, q, sh = ua.read_plan(mis, lane)
        v = words[4 * c:4 * c + 8]
        got = b"".join(_shf_r_clamp(v[lo], v[hi], sh).to_bytes(4, "little") for lo, hi in ua.realign_pairs(q))
        assert got == row[mis + 16 * lane:mis + 16 * lane + 16], (mis, lane)
    # the PTX, run for each q: the table entry q, then straight on until a jump to the end; the
    # shifts executed write output k from operands v[lo], v[hi] of realign_pairs(q) (by $w/$r index)
    assert _run_realign_ptx(ua._REALIGN_PTX, 0) is not None
    for q in range(4):
        assert _run_realign_ptx(ua._REALIGN_PTX, q) == [(k, lo, hi) for k, (lo, hi) in enumerate(ua.realign_pairs(q))]


def _run_realign_ptx(ptx, q):
    """The funnel shifts ({$w}, lo {$r}, hi {$r}) that unaligned._REALIGN_PTX executes for word
    offset ``q`` (operand $r8), following its branch table, labels and jumps; the shift operand
    must be $r9 and the block must end at its end label."""
    lines = [ln.strip() for ln in ptx.splitlines() if ln.strip() not in ("{", "}")]
    table = re.fullmatch(r"(\w+): \.branchtargets ([\w, ]+);", lines[0])
    targets = [t.strip() for t in table.group(2).split(",")]
    assert lines[1] == f"brx.idx.uni {{$r8}}, {table.group(1)};"
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.fullmatch(r"\w+:", ln)}
    end = max(labels.values())
    pc, done = labels[targets[q]] + 1, []
    while pc < end:
        ln = lines[pc]
        jump = re.fullmatch(r"bra\.uni (\w+);", ln)
        if jump:
            assert labels[jump.group(1)] == end
            break
        m = re.fullmatch(r"shf\.r\.clamp\.b32 \{\$w(\d)\}, \{\$r(\d)\}, \{\$r(\d)\}, \{\$r9\};", ln)
        if m:
            done.append(tuple(int(g) for g in m.groups()))
        else:
            assert re.fullmatch(r"\w+:", ln), ln
        pc += 1
    return done


@pytest.mark.parametrize("step", [1, 2, 4, 8])
def test_unaligned_rows_a_plan_period_apart_share_their_misalignment(step):
    """The packed kernel computes a thread's read and store plans once per class: its row i
    (rows ``step`` apart) takes plan i % plans_per_thread(rows, step) (unaligned.py). For every
    row stride (elements) and base offset, each row's 16-bit input starts at the same offset
    inside a 16-byte chunk, and its FP8 row at the same offset inside an 8-byte unit, as the row
    whose plan it takes; and the period is the shortest that holds for every stride (stride 1,
    an odd N, tells shorter ones apart)."""
    from mxq.kernels import unaligned as ua

    p = ua.plan_period(step)
    assert p == min(q for q in range(1, 9) if all(2 * s * q * step % ua.CHUNK == 0 for s in range(1, 17)))
    for rows in (4, 8):
        period = ua.plans_per_thread(rows, step)
        assert period == min(rows, p)
        for stride in range(1, 70):
            for base in range(0, 32, 2):
                for i in range(rows):
                    j = i % period  # the row whose plan row i takes
                    a_i, a_j = base + 2 * stride * i * step, base + 2 * stride * j * step
                    assert a_i % ua.CHUNK == a_j % ua.CHUNK, (step, rows, stride, base, i)
                    o_i, o_j = base + stride * i * step, base + stride * j * step
                    assert o_i % ua.UNIT == o_j % ua.UNIT, (step, rows, stride, base, i)


@pytest.mark.parametrize("b", range(8))
def test_unaligned_store_units_cover_each_byte_once(b):
    """Output segments of 1..256 bytes starting b bytes past an 8-byte boundary: the lanes' whole
    units, the head unit's and the tail unit's bytes cover every byte of the segment exactly once
    and nothing outside it, and a tail with bytes is some lane's unit (that lane parks it)."""
    from mxq.kernels import unaligned as ua
    from mxq.kernels.device import HOST

    for ncols in range(1, 257):
        count = collections.Counter()
        units = [ua.unit_offset(lane, b) for lane in range(32)]
        for o in units:
            if o + ua.UNIT <= ncols:
                count.update(range(o, o + ua.UNIT))
        first, end = ua.head_bytes(b, ncols, HOST)
        count.update(range(first - b, end - b))  # byte t of the head unit is segment byte t - b
        t0, tend = ua.tail_bytes(ncols, b, HOST)
        count.update(range(t0, t0 + tend))
        assert count == collections.Counter(range(ncols)), (b, ncols)
        if tend:
            assert t0 in units, (b, ncols)


def test_fp32_unaligned_staging_swizzle():
    """unaligned.py's fp32 rows by words: the words lane l's 4-byte copies (staged_word) and
    8-byte copies (staged_pair) write and the quads it reads back (staged_quad) agree: each
    segment word is written by one copy, and lane l reads its columns 8l .. 8l + 7 in order;
    every copy instruction and every 16-byte read phase of 8 lanes hits all 32 banks once (the
    reads ran 2-way conflicted unswizzled)."""
    from mxq.kernels.unaligned import staged_pair, staged_quad, staged_word

    V, words = kconfig.VEC, 32 * kconfig.VEC
    by_word = {l + 32 * k: staged_word(l, k) for l in range(32) for k in range(V)}
    assert sorted(by_word.values()) == list(range(words))
    by_pair = {}
    for l, k in itertools.product(range(32), range(V // 2)):
        by_pair[2 * l + 64 * k] = staged_pair(l, k)
        by_pair[2 * l + 64 * k + 1] = staged_pair(l, k) + 1
        assert staged_pair(l, k) % 2 == 0  # (an 8-byte copy's destination)
    assert by_pair == by_word
    for l, h, j in itertools.product(range(32), range(2), range(4)):
        assert 4 * staged_quad(l, h) + j == by_word[V * l + 4 * h + j]
    for k in range(V):
        assert len({staged_word(l, k) % 32 for l in range(32)}) == 32
    for k, half in itertools.product(range(V // 2), range(2)):
        assert len({(staged_pair(l, k) + j) % 32 for l in range(16 * half, 16 * half + 16) for j in range(2)}) == 32
    for h, phase in itertools.product(range(2), range(4)):
        assert len({(4 * staged_quad(l, h) + j) % 32 for l in range(8 * phase, 8 * phase + 8) for j in range(4)}) == 32


def test_warp_amax_bit_order():
    """device.warp_amax reduces the unsigned integers device.magnitude_bits makes of each lane's
    fp32 bits (the expression it traces, run here in its host form): their max is the block
    amax, and a NaN if any value is one. Checked against an independent max of the magnitudes
    over warps of random values and every special (+-0, +-inf, NaN payloads of either sign,
    subnormals, the largest finite)."""
    import torch

    g = torch.Generator().manual_seed(5)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-40, 2.0 ** -126, -3.4028235e38,
                             1.0, -1.0], dtype=torch.float32)
    nans = [0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFFFFFFF]
    for trial in range(300):
        v = torch.randn(32, generator=g) * 2.0 ** torch.randint(-140, 120, (32,), generator=g).float()
        k = trial % 4
        if k >= 1:  # plant specials
            idx = torch.randperm(32, generator=g)[:4]
            v[idx] = specials[torch.randint(len(specials), (4,), generator=g)]
        bits = [oracle.bits(float(x)) for x in v]
        if k == 3:  # and a NaN
            bits[int(torch.randint(32, (1,), generator=g))] = nans[trial % len(nans)]
        got = oracle.from_bits(max(dev.magnitude_bits(b, dev.HOST) for b in bits))
        vals = [oracle.from_bits(b) for b in bits]
        if any(math.isnan(x) for x in vals):
            assert math.isnan(got), trial
        else:
            want = max(abs(x) for x in vals)
            assert got == want and math.copysign(1.0, got) > 0, trial


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_scale_rules_ignore_the_nan_payload(fp8, mode):
    """A NaN block amax gives scale 255 whatever its payload: warp_amax returns whichever NaN has
    the largest magnitude bits, not fmax.NaN's canonical one, so every scale rule must read only
    whether amax is NaN (rceil through p = amax / MAX, which is NaN too; sm_100's hardware
    conversion maps every NaN to 255 by the PTX ISA)."""
    for b in (0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF):
        if mode == "rceil":
            got = dev.rceil_scale(b, dev.HOST)  # (p's bits: a NaN times 1/MAX is a NaN)
        else:
            got = dev.exponent_scale(dev.HOST.I32(b), lambda: True, fp8, mode, dev.HOST)
        assert got == 255, (hex(b), got)


def _blocks_deep(node, depth=0):
    """How deeply ``node``'s if / for / while / with blocks nest."""
    deepest = depth
    for child in ast.iter_child_nodes(node):
        inner = depth + isinstance(child, (ast.If, ast.For, ast.While, ast.With))
        deepest = max(deepest, _blocks_deep(child, inner))
    return deepest


def test_kernel_functions_are_short_and_shallow():
    """Kernels are composed of phases: no function in mxq/kernels/ is longer than 150 lines or
    nests its blocks more than 5 deep (a planted 6-deep function is caught)."""
    planted = ast.parse("def f(a):\n" + "".join("    " * (d + 1) + "if a:\n" for d in range(6)) + "    " * 7 + "pass\n")
    assert _blocks_deep(planted.body[0]) == 6
    kernels = pathlib.Path(kconfig.__file__).parent
    for path in sorted(kernels.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                where = f"{path.name}:{node.lineno} {node.name}"
                assert node.end_lineno - node.lineno + 1 <= 150, where
                assert _blocks_deep(node) <= 5, where


def test_fp4_column_slots_are_a_conflict_free_permutation():
    """packed.fp4_column_slot: each warp's VCOLS column words take distinct slots of its own row
    (up to the 64-row tile's 8 warps); a warp's stores (lane l, column 8l + k, for each k) and
    a warp's loads (32 consecutive columns) fall in 32 distinct banks (by hand: slot mod 32)."""
    from mxq.kernels import packed

    V = packed.VCOLS
    for w in range(8):
        slots = [packed.fp4_column_slot(w, c) for c in range(V)]
        assert sorted(slots) == list(range(w * V, (w + 1) * V))
        for k in range(8):
            assert len({packed.fp4_column_slot(w, 8 * lane + k) % 32 for lane in range(32)}) == 32
        for c0 in range(0, V, 32):
            assert len({packed.fp4_column_slot(w, c0 + i) % 32 for i in range(32)}) == 32
