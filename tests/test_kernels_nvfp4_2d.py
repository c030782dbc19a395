"""NVFP4's 16x16 tiles (``block_2d=True``) on the packed kernel (bf16/fp16 inputs): one E4M3 scale
per tile from its NaN-dropping amax, in each of its 16 rows' entries of the rowwise scales and each
of its 16 columns' entries of the transposed colwise copy's; the two copies' codes are each other's
transpose (docs/NUMERICS.md N3 and "What serves them"; KernelConfig.fp4_tiles,
PackedKernel.fp4_tile_scales). fp32 inputs and what NVFP4's 1x16 kernels do not serve run the
reference (limits.fp4_unserved).

CPU: what is served and what falls back with which message; the config; one compiled kernel per
arch; a hand-made case of known tile scales and codes against the reference. GPU (marked gpu):
random shapes with partial tiles, NaN/inf/zero tiles, both layouts, each direction alone and both,
fused ops, a given amax, stochastic rounding, byte for byte against the reference, and the
hand-made case on the kernels.
"""

import re
from dataclasses import replace

import pytest
import torch

import mxq
from mxq.frontend import codegen
from mxq.frontend.spec import QuantSpec
from mxq.kernels import config as kconfig
from mxq.kernels import packed
from mxq.runtime import limits
from mxq.testing import planted, poisoned, same_bytes

from .test_kernels_fp4 import BOTH as OUTS
from .test_kernels_fp4 import same_outputs as _same
from .test_kernels_fp4 import within_gelu_class
from .checks import check_exact as _check
from .test_kernels_nvfp4 import _ptx, ident, scaled_shift, strict  # noqa: F401  (strict: a fixture)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _op(**opts):
    return mxq.fused_quant(format="nvfp4", block_2d=True, **opts)(ident)


def _unserved(op, x, call=None):
    return limits.unserved(op.spec, op.epilogue, x, lambda: None, call)


# -- what is served ------------------------------------------------------------------------------
@pytest.mark.parametrize("opts", [dict(), dict(scale_layout="swizzled"), dict(colwise=True),
                                  dict(colwise=True, rowwise=False, scale_layout="swizzled"), dict(act="gelu"),
                                  dict(colwise=True, act="gelu"), dict(dact="relu", dbias=True),
                                  dict(colwise=True, stochastic_rounding=True)])
def test_served_calls(opts):
    op = _op(**opts)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, n in ((24, 16), (40, 48), (1000, 4096)):
            assert _unserved(op, torch.zeros(m, n, dtype=dtype)) is None, (opts, dtype, m, n)


@pytest.mark.parametrize("opts, x, why", [
    (dict(), torch.zeros(32, 40, dtype=torch.bfloat16), "N % 16"),
    (dict(colwise=True), torch.zeros(20, 64, dtype=torch.bfloat16), "M % 8"),
    (dict(colwise=True), torch.zeros(20, 64), "M % 8"),
])
def test_unserved_names_what_has_no_kernel(opts, x, why):
    reason = _unserved(_op(**opts), x)
    assert reason is not None and "nvfp4" in reason and why in reason and "reference" in reason


def test_rowwise_takes_any_rows():
    """Rowwise tiles take any M (rows past M are zero in the tile maxima and not stored)."""
    for m in (1, 5, 17, 33):
        assert _unserved(_op(), torch.zeros(m, 32, dtype=torch.bfloat16)) is None


def test_tile_config():
    """The Format value (16x16 blocks under the global scale) and the packed kernel's tile of 8-row
    warps (the colwise tile, FP4_COL_ROWS rows, with the copy; else 32 rows: rowwise alone is not
    the wide tile), one word per warp and lane of maxima,
    no 128x128 tile machinery; 1x16 NVFP4 keeps its configs."""
    def cfg(**opts):
        op = mxq.fused_quant(format="nvfp4", **opts)(ident)
        c = codegen.kernel_config(op.spec, op.epilogue)
        return c.global_passes()[1]

    assert QuantSpec(format="nvfp4", block_2d=True).block_format.block == (16, 16)
    for opts in (dict(), dict(colwise=True), dict(colwise=True, rowwise=False), dict(dbias=True, dact="relu")):
        c = cfg(block_2d=True, **opts)
        assert c.fp4_tiles and not c.tiles and c.col_reduce and not c.wide and c.fmt.global_scale
        rows = kconfig.FP4_COL_ROWS if c.colwise else 32
        assert (c.tile_rows, c.packed_warps()) == (rows, rows // 8) and c.min_blocks == 0
        assert "max" in [b.name for b in c.packed_buffers([], False)] and "inv" not in [
            b.name for b in c.packed_buffers([], False)]
    plain = cfg()
    assert not plain.fp4_tiles and plain.wide and replace(plain, colwise=True).tile_rows == kconfig.FP4_COL_ROWS


@pytest.mark.parametrize("tile_rows", [16, 32, 64])
def test_tile_scale_entries_write_each_once(tile_rows):
    """packed.fp4_tile_entries under fp4_tile_scales' bounds (a row below M, a first column below
    N; a colwise entry's tile starting below M), over every thread of the grid, against brute
    force: each rowwise entry (r, b) and colwise entry (c, b) of an [M, N] operand (N % 16 == 0,
    any M rowwise, M % 8 == 0 colwise) is written once, by a thread whose own 8 x 8 values lie in
    tile (r // 16, b), (b, c // 16) (its tile: rows of its warp, columns of its lane)."""
    warps, vec = tile_rows // 8, 8
    for m in list(range(1, 70, 3)) + [8, 16, 24, 40, 64, 72, 136]:
        for n in (16, 48, 272, 528):
            rows, cols = {}, {}
            for rb in range(-(-m // tile_rows)):
                for cb in range(-(-n // 256)):
                    for w in range(warps):
                        for lane in range(32):
                            tile = ((rb * tile_rows + w * 8) // 16, ((cb * 32 + lane) * vec) // 16)
                            r0, c1 = packed.fp4_tile_entries(w, lane, rb, cb, tile_rows, 8)
                            w0, wpb = packed.fp4_scale_warps(w, 8)
                            c0, blk = (cb * 32 + lane) * vec, (rb * tile_rows + w0 * 8) // 16
                            assert blk == tile[0]
                            for i in range(4):
                                if c0 < n and r0 + i < m:
                                    assert (r0 + i, c0 // 16) not in rows
                                    rows[(r0 + i, c0 // 16)] = tile
                            for q in range(vec // wpb):
                                if c1 + q < n and blk * 16 < m and m % 8 == 0:
                                    assert (c1 + q, blk) not in cols
                                    cols[(c1 + q, blk)] = tile
            assert rows == {(r, b): (r // 16, b) for r in range(m) for b in range(n // 16)}, (m, n)
            if m % 8 == 0:
                assert cols == {(c, b): (b, c // 16) for c in range(n) for b in range(-(-m // 16))}, (m, n)


# -- compiled code ---------------------------------------------------------------------------------
def _quantize_entry(ptx):
    """The quantize pass's entry (the one that stores FP4 codes: the amax pass stores none)."""
    return max(ptx.split(".entry")[1:], key=lambda e: e.count("cvt.rn.satfinite.e4m3x2.f32"))


@pytest.mark.parametrize("arch, dtype, opts", [("sm_90a", "bf16", dict(colwise=True)),
                                               ("sm_100a", "fp16", dict(scale_layout="swizzled"))])
def test_tiles_compile(arch, dtype, opts):
    """Two passes; the quantize pass computes one scale per thread (one E4M3 conversion; 1x16
    rowwise blocks take four), its tile's other lanes by one shuffle with lane ^ 1, and stores
    half its 8 rows' row-scale entries (L2-kept bytes) and half its 8 columns' colwise ones."""
    ptx = _ptx(_op(**opts), arch, dtype)
    assert f".target {arch}" in ptx and ptx.count(".entry") == 3
    q = _quantize_entry(ptx)
    assert q.count("cvt.rn.satfinite.e4m3x2.f32") == 1
    assert q.count("st.global.L2::cache_hint.b8") == 4
    assert len([ln for ln in q.splitlines() if "st.global.u8" in ln or "st.global.b8" in ln]) == (
        4 if opts.get("colwise") else 0)
    assert len(re.findall(r"shfl\.sync\.bfly\.b32[^;]*, 1, 31, -1;", q)) == 1
    if arch == "sm_100a":  # (8 rows of 8 codes, and with the copy 8 columns of 8)
        assert q.count("cvt.rn.satfinite.e2m1x2.f32") == 32 * (2 if opts.get("colwise") else 1)


@pytest.mark.parametrize("arch, opts", [("sm_90a", dict(colwise=True)), ("sm_100a", dict(scale_layout="swizzled")),
                                        ("sm_90a", dict(colwise=True, rowwise=False, act="gelu", dbias=True))])
def test_fp32_tiles_compile(arch, opts):
    """fp32 16x16 tiles on the vectorised kernel (warps of 8 rows: FP4_COL_ROWS / 8 with the
    colwise copy, else 4; ungrouped): the quantize pass
    computes one scale per thread from both warps' column maxima in shared memory and one shuffle
    with lane ^ 1, stores half its 8 rows' row-scale entries and half its 8 columns' colwise ones,
    and each row's (and column's) 8 codes as one word; no spills on sm_90. Grouped calls are named
    (validation's rule), and not traced. GPU counterpart: test_tiles_match_reference (fp32)."""
    import shutil

    from mxq.runtime.call import Call

    op = _op(**opts)
    x = torch.zeros(24, 256)
    grouped = Call([x], [], group_offsets=torch.tensor([24], dtype=torch.int32))
    assert "group_offsets" in _unserved(op, x, grouped)  # (fp4_layouts.grouped_gap, validation's rule)
    with pytest.raises(Exception, match="16x16"):
        _ptx(op, "sm_90a", "fp32", "vec_grouped")
    ptx = _ptx(op, arch, "fp32")
    q = _quantize_entry(ptx)
    both, rows = opts.get("colwise", False), opts.get("rowwise", True)
    threads = (kconfig.FP4_COL_ROWS if both else 32) * 4
    assert q.count("cvt.rn.satfinite.e4m3x2.f32") == 1 and f".reqntid {threads}, 1, 1" in q
    assert q.count("st.global.L2::cache_hint.b8") == (4 if rows else 0)
    assert q.count("st.global.b8 ") == (4 if both else 0)
    assert q.count("st.global.b32") == 8 * (rows + both)
    assert len(re.findall(r"shfl\.sync\.bfly\.b32[^;]*, 1, 31, -1;", q)) == 1
    if arch == "sm_100a":
        assert q.count("cvt.rn.satfinite.e2m1x2.f32") == 32 * (rows + both)
    if arch == "sm_90a" and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _ptxas_output

        assert all(b == "0" for b in re.findall(r"(\d+) bytes spill stores", _ptxas_output(ptx)))


# -- a hand-made case ------------------------------------------------------------------------------
HAND_M, HAND_N = 40, 48  # (3 tile rows, the last of 8 rows; 3 tile columns)
# the E4M3 bytes of 0.25, 0.5, 1, 2, 4: tile amax 6 * that under S_enc = 1 (global amax 2688)
HAND_SCALES = (0x28, 0x30, 0x38, 0x40, 0x48)


def _hand_case():
    """Tile (i, j) holds amax 6 * 2^(k - 2), k = (i + 2j) % 5, at a place that moves from tile to
    tile (row (5i + 7j + 3) % R of its R rows, column (7i + 5j + 2) % 16: either warp of the
    tile's rows, either lane of its columns), every other element +-amax / 4 (the sign by the
    parity of row + column), and a NaN in tile (0, 1). Under the given global amax 2688, S_enc =
    1 and fp32(amax * fp32(1/6)) is 2^(k - 2) exactly: the tile's scale byte, its multiplier
    6 / amax, so the codes are 7 at the amax, 3 (+1.5) or 0xB (-1.5) elsewhere, 7 for the NaN.
    Returns (x fp32 [M, N], tile scale bytes [3][3], codes uint8 [M, N])."""
    x = torch.empty(HAND_M, HAND_N)
    codes = torch.empty(HAND_M, HAND_N, dtype=torch.uint8)
    tiles = [[HAND_SCALES[(i + 2 * j) % 5] for j in range(3)] for i in range(3)]
    for i in range(3):
        for j in range(3):
            amax = 6.0 * 2.0 ** ((i + 2 * j) % 5 - 2)
            for r in range(16 * i, min(16 * i + 16, HAND_M)):
                for c in range(16 * j, 16 * j + 16):
                    neg = (r + c) % 2 == 1
                    x[r, c] = -amax / 4 if neg else amax / 4
                    codes[r, c] = 0xB if neg else 0x3
            r = 16 * i + (5 * i + 7 * j + 3) % min(16, HAND_M - 16 * i)
            c = 16 * j + (7 * i + 5 * j + 2) % 16
            x[r, c], codes[r, c] = amax, 7
    x[3, 20], codes[3, 20] = float("nan"), 7
    return x, tiles, codes


def _pack(codes):
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _check_hand(device):
    x, tiles, codes = _hand_case()
    op = _op(colwise=True)
    got = op(x.to(torch.bfloat16).to(device), global_amax=2688.0)
    rows = torch.tensor([[tiles[r // 16][b] for b in range(3)] for r in range(HAND_M)], dtype=torch.uint8)
    cols = torch.tensor([[tiles[b][c // 16] for b in range(3)] for c in range(HAND_N)], dtype=torch.uint8)
    assert torch.equal(got.rowwise_scale.cpu().view(torch.uint8), rows)
    assert torch.equal(got.colwise_scale.cpu().view(torch.uint8), cols)
    assert torch.equal(got.rowwise_data.cpu(), _pack(codes))
    assert torch.equal(got.colwise_data.cpu(), _pack(codes.t().contiguous()))
    assert got.amax.item() == 2688.0


def test_hand_made_tiles_on_the_reference():
    """_hand_case's scales and codes, written out by hand, against the reference on CPU."""
    _check_hand("cpu")


@pytest.mark.gpu
def test_hand_made_tiles_on_the_kernels(strict):
    _check_hand("cuda")


# -- on the device -----------------------------------------------------------------------------
def _tiles(m, n, dtype, seed, specials=True):
    """Random data with planted tiles: one of NaN alone (amax 0: scale 0, codes 7), one of zeros,
    one of tiny values (subnormal E4M3 scales), inf in one tile (a computed global amax inf:
    S_enc 1) and a NaN inside an ordinary tile, where the shape has room."""
    x = planted(m, n, torch.float32, seed=seed, specials=False)
    if specials and m >= 32 and n >= 48:
        x[16:32, 16:32] = float("nan")
        x[0:16, 32:48] = 0.0
        x[16:32, 0:16] *= 1e-5
        x[20, 40] = float("inf")
        x[2, 2] = float("nan")
        if m >= 40:
            x[33, 3] = -float("inf") if m % 2 else -1e4
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m, n", [(1, 16), (5, 48), (8, 272), (24, 48), (40, 528), (48, 16), (96, 272),
                                  (1000, 208), (4096, 4096)])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_tiles_match_reference(strict, dtype, m, n, layout):
    """Rowwise alone (any M), both directions and the colwise copy alone (M % 8 == 0: partial
    last tiles where M % 16 == 8), into fresh and poisoned outputs, computed and given amax; fp32
    on the vectorised kernel. CPU counterparts: test_tiles_compile, test_fp32_tiles_compile."""
    x = _tiles(m, n, DTYPES[dtype], seed=m * 3 + n)
    dirs = [dict()] + ([dict(colwise=True), dict(colwise=True, rowwise=False)] if m % 8 == 0 else [])
    for opts in dirs:
        op = _op(scale_layout=layout, **opts)
        _same(op, x, op(x.cuda()))
        _same(op, x, op(x.cuda(), out=poisoned(op, x.cuda())))
        _same(op, x, op(x.cuda(), global_amax=300.0), global_amax=300.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES)[:2])
def test_fused_ops_match_reference(strict, dtype):
    """gelu (both directions; planted and finite data, a real S_enc) in the transcendental class
    (fp16's tiny tile: a scale byte 0 and gelu values at ties of fp16's subnormal grid),
    relu byte for byte; a user epilogue whose padding rows are nonzero (M % 16 != 0), drelu + dbias
    (rowwise; dbias within an ulp, as checks.check_exact), stochastic rounding."""
    t = DTYPES[dtype]
    x, b = _tiles(72, 528, t, seed=1), planted(1, 528, t, seed=2, specials=False).reshape(528)
    fin = _tiles(72, 528, t, seed=3, specials=False)
    for xx in (x, fin):
        gelu, relu = _op(act="gelu", colwise=True), _op(act="relu", colwise=True)
        got, want = gelu(xx.cuda()), gelu.reference(xx)
        for direction in ("rowwise", "colwise"):
            within_gelu_class(got, want, direction, block=16, zero_scale_saturates=True)
        _same(relu, xx, relu(xx.cuda()))
    epi = mxq.fused_quant(format="nvfp4", block_2d=True, scale_layout="swizzled")(scaled_shift)
    y = x[:37]
    want = epi.reference(y, b)
    got = epi(y.cuda(), b.cuda())
    for f in (*OUTS[:2], "amax"):  # (the amax pass masks the padding rows)
        assert same_bytes(getattr(got, f), getattr(want, f)), f
    drelu = _op(dact="relu", dbias=True)
    a = planted(72, 528, t, seed=5)
    _check(drelu, [fin], drelu(fin.cuda(), act_input=a.cuda()), act_input=a)
    sr = _op(colwise=True, stochastic_rounding=True)
    for seed, offset in ((3, 2 ** 35 + 1), (2 ** 63 + 9, 4)):
        _same(sr, x, sr(x.cuda(), seed=seed, offset=offset), seed=seed, offset=offset)
    sr_rows = _op(stochastic_rounding=True, scale_layout="swizzled")
    _same(sr_rows, x, sr_rows(x.cuda(), seed=11, offset=8), seed=11, offset=8)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 64])
@pytest.mark.parametrize("m, n", [(16, 48), (48, 272), (200, 208)])
def test_tiles_under_other_colwise_tile_heights(strict, rows, m, n):
    """Tuning.fp4_col_rows' 16- and 64-row tiles (one and four 16x16 tiles high): both
    directions and the colwise copy alone, byte for byte."""
    for dtype in (torch.bfloat16, torch.float32):  # (fp32: the vectorised kernel's rows / 8 warps)
        x = _tiles(m, n, dtype, seed=m + rows)
        for opts in (dict(), dict(rowwise=False, scale_layout="swizzled")):
            op = _op(colwise=True, **opts)._with_tuning(kconfig.Tuning(fp4_col_rows=rows))
            _same(op, x, op(x.cuda()))


@pytest.mark.gpu
def test_copies_decode_equal(strict):
    """The kernels' two copies decode to the same values (the point of 16x16 tiles)."""
    x = _tiles(256, 512, torch.bfloat16, seed=7, specials=False)
    t = _op(colwise=True)(x.cuda())
    a, b = t.dequantize("rowwise"), t.dequantize("colwise")
    assert torch.equal(a, b)


@pytest.mark.gpu
def test_fp32_fused_ops_match_reference(strict):
    """fp32 16x16 tiles after gelu (both directions, the transcendental class), relu byte for
    byte, a user epilogue (M % 16 != 0, rowwise), drelu + dbias. CPU counterpart:
    test_fp32_tiles_compile."""
    x, b = _tiles(72, 528, torch.float32, seed=11), planted(1, 528, torch.float32, seed=12, specials=False).reshape(528)
    fin = _tiles(72, 528, torch.float32, seed=13, specials=False)
    gelu, relu = _op(act="gelu", colwise=True), _op(act="relu", colwise=True)
    got, want = gelu(fin.cuda()), gelu.reference(fin)
    for direction in ("rowwise", "colwise"):
        within_gelu_class(got, want, direction, block=16, zero_scale_saturates=True)
    _same(relu, x, relu(x.cuda()))
    epi = mxq.fused_quant(format="nvfp4", block_2d=True)(scaled_shift)
    y = x[:37]
    want, got = epi.reference(y, b), epi(y.cuda(), b.cuda())
    for f in (*OUTS[:2], "amax"):
        assert same_bytes(getattr(got, f), getattr(want, f)), f
    drelu = _op(dact="relu", dbias=True, colwise=True)
    a = planted(72, 528, torch.float32, seed=15)
    _check(drelu, [fin], drelu(fin.cuda(), act_input=a.cuda()), act_input=a)


@pytest.mark.gpu
def test_unserved_fp32_falls_back_with_the_reference(monkeypatch):
    op = _op(colwise=True)
    x = _tiles(20, 64, torch.float32, seed=8)  # (M % 8 != 0: the colwise copy's rule)
    _same(op, x, op(x.cuda()))  # (after a one-time warning)
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="M % 8"):
        op(x.cuda())
