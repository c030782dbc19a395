"""MXFP4's transposed colwise copy on the packed kernel (bf16/fp16 inputs): ``[N, M/2]`` codes of
the transposed values, one E8M0 scale per 32 consecutive elements along M of each column
(``[N, ceil(M/32)]`` compact or swizzled), by the rowwise rule (floor or rceil, a NaN makes its
block's scale 255). The tile is NVFP4's colwise one (KernelConfig.fp4_columns: 32 rows of four
8-row warps), a 32-row block the whole tile, its column maxima reduced over the four warps
(PackedKernel.fp4_column_scales). fp32 inputs and M % 8 != 0 run the reference
(limits.fp4_unserved).

CPU: what is served and what falls back with which message; the config; the warps that store a
column block's scales, on ints over every warp of the grid; sm_90's column word from bf16 on
ints against the oracle; one compiled kernel per arch; a
hand-made 64x32 case of known codes and scales against the oracle and the reference. GPU (marked
gpu): random shapes (partial last blocks), NaN/inf/zero/tie blocks, both scale modes and layouts,
each direction, fused ops, other tiles, byte for byte against the reference, and the hand-made
case on the kernels.
"""

import re
from dataclasses import replace

import pytest
import torch

import mxq
from mxq.frontend import codegen
from mxq.kernels import config as kconfig
from mxq.kernels import device as dev
from mxq.kernels import packed
from mxq.runtime import limits
from mxq.testing import planted, poisoned, same_bytes

from . import oracle_fp4 as oracle
from .test_kernels_fp4 import BOTH as OUTS
from .test_kernels_fp4 import PAIRS, _f32, _ptx, ident, scaled_shift, strict, within_gelu_class  # noqa: F401  (strict: a fixture)
from .test_kernels_fp4 import same_outputs as _same

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _op(**opts):
    return mxq.fused_quant(format="mxfp4", colwise=True, **opts)(ident)


def _unserved(op, x, call=None):
    return limits.unserved(op.spec, op.epilogue, x, lambda: None, call)


# -- what is served ------------------------------------------------------------------------------
@pytest.mark.parametrize("opts", [dict(), dict(rowwise=False), dict(scale_layout="swizzled"),
                                  dict(scale_mode="rceil", rowwise=False, scale_layout="swizzled"),
                                  dict(act="gelu"), dict(amax=True), dict(dact="relu")])
def test_served_calls(opts):
    op = _op(**opts)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, n in ((8, 16), (24, 48), (32, 48), (40, 272), (1000, 4096)):
            assert _unserved(op, torch.zeros(m, n, dtype=dtype)) is None, (opts, dtype, m, n)
    assert "mxfp4" in op.source


@pytest.mark.parametrize("opts, x, why", [
    (dict(), torch.zeros(20, 64), "M % 8"),
    (dict(), torch.zeros(32, 36), "N % 8"),
    (dict(rowwise=False), torch.zeros(20, 64, dtype=torch.bfloat16), "M % 8"),
    (dict(), torch.zeros(4, 64, dtype=torch.bfloat16), "M % 8"),
    (dict(), torch.zeros(32, 36, dtype=torch.bfloat16), "N % 8"),
])
def test_unserved_names_what_has_no_kernel(opts, x, why):
    reason = _unserved(_op(**opts), x)
    assert reason is not None and "mxfp4" in reason and why in reason and "reference" in reason


def test_misaligned_colwise_out_falls_back():
    from mxq.runtime.call import Call

    op = _op()
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    assert _unserved(op, x, Call([x], [], out=out)) is None
    buf = torch.zeros(64 * 16 + 4, dtype=torch.uint8)
    out.colwise_data = buf[4:].view(64, 16)  # [N, M/2], not 16-byte aligned
    assert "colwise data" in _unserved(op, x, Call([x], [], out=out))


def test_tile_config():
    """The packed kernel's FP4 colwise tile (FP4_COL_ROWS, 64 rows of eight 8-row warps: two
    32-row blocks; "max" and "fp4t" shared memory, multipliers in registers); Tuning.fp4_col_rows
    32 takes one block, 16 runs as 32 (a block is 32 rows); the rowwise-only cast keeps the wide
    tile."""
    def cfg(tuning=None, **opts):
        op = mxq.fused_quant(format="mxfp4", **opts)(ident)
        return replace(codegen.kernel_config(op.spec, op.epilogue), tuning=tuning)

    for opts in (dict(colwise=True), dict(colwise=True, rowwise=False), dict(colwise=True, act="gelu")):
        c = cfg(**opts)
        assert c.fp4_columns and c.fmt.col_block == (32, 1) and not c.fmt.global_scale
        assert (c.tile_rows, c.packed_warps(), c.min_blocks) == (64, 8, 0) and c.global_passes() is None
        assert [b.name for b in c.packed_buffers([], False)] == ["max", "fp4t"]
    for rows, want in ((16, 32), (32, 32), (64, 64)):
        c = cfg(kconfig.Tuning(fp4_col_rows=rows), colwise=True)
        assert (c.tile_rows, c.packed_warps()) == (want, want // 8)
    assert cfg().wide and not cfg().fp4_columns


@pytest.mark.parametrize("tile_rows", [32, 64])
def test_column_scales_write_each_once(tile_rows):
    """packed.fp4_scale_warps with MXFP4's 32-row blocks, as fp4_column_scales uses it (warp w0 of
    the block stores, block (rb * tile_rows + w0 * 8) // 32, below M where its first row is),
    over every warp of the grid, against brute force: each (column block, column) of M rows
    (M % 8 == 0) written once, by a warp whose 8 rows lie in that block, which reduces the
    maxima of exactly the block's warps of the tile."""
    warps = tile_rows // 8
    for m in range(8, 8 * 20, 8):
        wrote = {}
        for rb in range(-(-m // tile_rows)):
            for w in range(warps):
                w0, wpb = packed.fp4_scale_warps(w, 8, 32)
                blk = (rb * tile_rows + w0 * 8) // 32
                assert [v for v in range(warps) if (rb * tile_rows + v * 8) // 32 == blk] == list(range(w0, w0 + wpb))
                assert (rb * tile_rows + w * 8) // 32 == blk
                if w == w0 and blk * 32 < m:
                    assert blk not in wrote, (m, rb, w)
                    wrote[blk] = (rb, w)
        assert sorted(wrote) == list(range(-(-m // 32))), m


def test_column_words_on_ints():
    """sm_90's column word from bf16 (PackedKernel.fp4_column_word, codec.pow2_bf16_pairs): a
    thread's 8 rows of 4 packed words, each of its 8 columns as two rows' values a word
    (device.column_pairs), scaled in bf16 and encoded (device.e2m1x2_scaled_codes,
    e2m1x8_from_pairs), run on ints with test_kernels_fp4's PAIRS: each column's 8 codes, row
    2j's in the low nibble of byte j, equal the oracle's E2M1 of the column's values times the
    scale's multiplier (7 where it is NaN: scale 255)."""
    g = torch.Generator().manual_seed(5)
    for e in (0, 100, 124, 127, 131, 200, 254, 255):
        m = dev.inv_scale_bits(e, ops=dev.HOST) & 0xFFFFFFFF
        m2 = PAIRS.prmt(m, m, 0x3232)
        for trial in range(6):
            vals = torch.randint(0, 1 << 16, (8, 8), generator=g)
            if e != 255:  # (a NaN value only meets scale 255, its block's)
                vals = torch.where((vals & 0x7FFF) > 0x7F80, vals & 0x8000, vals)
            vals[trial % 8, (3 * trial) % 8] = 0x3FC0 if trial % 2 else 0xC0C0  # (1.5, -6)
            rows = [[int(vals[i, 2 * j]) | int(vals[i, 2 * j + 1]) << 16 for j in range(4)] for i in range(8)]
            for c in range(8):
                pairs = dev.column_pairs(rows, c, ops=PAIRS)
                word = dev.e2m1x8_from_pairs([dev.e2m1x2_scaled_codes(w, m2, ops=PAIRS) for w in pairs], ops=PAIRS)
                want = [7 if e == 255 else oracle.e2m1(_f32(int(vals[i, c]) << 16) * _f32(m)) for i in range(8)]
                assert [(word >> (4 * i)) & 0xF for i in range(8)] == want, (e, trial, c)


# -- compiled code ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, dtype, opts", [
    ("sm_90a", "bf16", dict()),
    ("sm_100a", "fp16", dict(rowwise=False, scale_mode="rceil", scale_layout="swizzled")),
])
def test_colwise_copy_compiles(arch, dtype, opts):
    """One pass (no global amax); the four warps' words of each of 256 columns leave as one
    16-byte run per output row (two a thread: one 16-byte, two 8-byte or four 4-byte stores by
    the copy's alignment, store_fp4_columns); 8 column-scale bytes a thread (warp 0 stores them);
    the column maxima NaN-propagating everywhere (no NaN-dropping max, NVFP4's colwise rule); no
    E4M3. sm_90: the integer E2M1 encode; sm_100a: 8 columns x 8 rows of cvt (4 per column) and
    the rceil scales by cvt.rp.satfinite.ue8m0x2, one per column."""
    ptx = _ptx(_op(**opts), arch, dtype)
    both = opts.get("rowwise", True)
    assert f".target {arch}" in ptx and ptx.count(".entry") == 1
    assert ptx.count("st.global.v4.b32") == 2 and ptx.count("st.global.v2.b32") == 4
    assert len(re.findall(r"st\.global\.(u8|b8) ", ptx)) == 8  # (colwise scale bytes)
    assert ptx.count("st.global.L2::cache_hint.b8") == (2 if both else 0)  # (a row scale per lane and 4 rows)
    kind = "bf16x2" if dtype == "bf16" else "f16x2"
    assert f"max.NaN.{kind}" in ptx and f"max.{kind}" not in ptx
    assert "e4m3x2" not in ptx
    cvts = ptx.count("cvt.rn.satfinite.e2m1x2.f32")
    if arch == "sm_100a":
        assert cvts == 32 * (2 if both else 1)
        assert ptx.count("cvt.rp.satfinite.ue8m0x2.f32") == 8 + (2 if both else 0)
    else:  # (bf16: each column's 8 values as 4 words of two rows, scaled in bf16, as 8 rows' words)
        assert cvts == 0 and "min.u16x2" in ptx
        assert ptx.count("mul.rn.bf16x2") == 32 * (2 if both else 1)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("opts", [dict(), dict(rowwise=False, scale_mode="rceil", scale_layout="swizzled"),
                                  dict(dbias=True, act="relu")])
def test_fp32_colwise_copy_compiles(arch, opts):
    """The colwise copy from fp32 on the vectorised kernel: FP4_COL_ROWS / 8 warps of 8 rows (a
    32-row block is four), each thread's 8 rows of each of its 8 columns one word of codes (8 four-byte
    stores, 8 more for the rowwise rows), 8 column-scale bytes a thread (warp 0 stores them), the
    column maxima NaN-propagating; sm_100a: the hardware E2M1 conversion, 4 per column and row
    word. Without spills on sm_90. GPU counterpart: test_colwise_copy_matches_reference."""
    import shutil

    op = _op(**opts)
    cfg = codegen.kernel_config(op.spec, op.epilogue)
    rows = kconfig.FP4_COL_ROWS
    assert cfg.fp4_columns and cfg.vec_warps == rows // 8 and cfg.tile_rows == rows
    assert _unserved(op, torch.zeros(8, 256)) is None
    ptx = _ptx(op, arch, "fp32")
    both = opts.get("rowwise", True)
    assert f".reqntid {rows * 4}, 1, 1" in ptx
    vec = max(ptx.split(".entry")[1:], key=len)
    assert vec.count("st.global.b32") == 8 * (2 if both else 1)
    assert vec.count("st.global.b8 ") == 8  # (colwise scale bytes; the rows' with an L2 hint)
    assert vec.count("st.global.L2::cache_hint.b8") == (8 if both else 0)
    assert "max.NaN.f32" in vec and "e4m3x2" not in vec
    if arch == "sm_100a":
        assert vec.count("cvt.rn.satfinite.e2m1x2.f32") == 32 * (2 if both else 1)
    if arch == "sm_90a" and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _assert_ptxas_clean

        _assert_ptxas_clean(ptx)


# -- a hand-made case ------------------------------------------------------------------------------
HAND_M, HAND_N = 64, 32  # two 32-row blocks of each of 32 columns
NAN_AT = (40, 7)  # block 1 of column 7


def _k(c, b):
    return (c + 3 * b) % 9 - 4


def _hand_case():
    """Column c's block b (rows 32b .. 32b + 31) has amax 6 * 2^k, k = _k(c, b) in -4 .. 4, at row
    32b + (5c + 11b + 3) % 32 (negative in odd columns), every other element +-amax / 4 (the sign
    by the parity of row + column); a NaN at NAN_AT. Both scale rules give 127 + k: floor the
    exponent of 1.5 * 2^(k + 2) less 2, rceil fp32(6 * 2^k * fp32(1/6)) = 2^k exactly; the
    multiplier 2^-k makes the codes 7 (0xF) at the amax, 3 (+1.5) or 0xB (-1.5) elsewhere. The
    NaN's block: scale 255, every code 7. Returns (x fp32 [M, N], colwise scales [N][2], the
    transposed codes uint8 [N, M])."""
    x = torch.empty(HAND_M, HAND_N)
    codes = torch.empty(HAND_N, HAND_M, dtype=torch.uint8)
    scales = [[127 + _k(c, b) for b in range(2)] for c in range(HAND_N)]
    for c in range(HAND_N):
        for b in range(2):
            amax = 6.0 * 2.0 ** _k(c, b)
            for r in range(32 * b, 32 * b + 32):
                neg = (r + c) % 2 == 1
                x[r, c], codes[c, r] = (-amax / 4, 0xB) if neg else (amax / 4, 0x3)
            r = 32 * b + (5 * c + 11 * b + 3) % 32
            x[r, c], codes[c, r] = (-amax, 0xF) if c % 2 else (amax, 0x7)
    r, c = NAN_AT
    x[r, c] = float("nan")
    scales[c][1] = 255
    codes[c, 32:] = 7
    return x, scales, codes


def _pack(codes):
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def test_hand_made_case_is_the_oracles():
    """The hand-written codes and scales are tests/oracle_fp4.py's MXFP4 of the transposed values,
    in both scale modes."""
    x, scales, codes = _hand_case()
    for mode in ("floor", "rceil"):
        oc, os_ = oracle.mxfp4(x.t().tolist(), mode)
        assert os_ == scales and oc == codes.tolist(), mode


def _check_hand(device, mode):
    x, scales, codes = _hand_case()
    op = _op(scale_mode=mode)
    got = op(x.to(torch.bfloat16).to(device))
    assert got.colwise_scale.cpu().view(torch.uint8).tolist() == scales
    assert torch.equal(got.colwise_data.cpu(), _pack(codes))
    rc, rs = oracle.mxfp4(x.tolist(), mode)  # (the rowwise copy: 1x32 blocks, whole rows)
    assert got.rowwise_scale.cpu().view(torch.uint8).tolist() == rs
    assert got.rowwise_data.cpu().tolist() == oracle.pack(rc)


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_hand_made_case_on_the_reference(mode):
    _check_hand("cpu", mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_hand_made_case_on_the_kernels(strict, mode):
    _check_hand("cuda", mode)


# -- on the device -----------------------------------------------------------------------------
def _blocks(m, n, dtype, seed, specials=True):
    """planted data (NaN, inf, subnormals, zeros scattered) plus column blocks of MXFP4's edges
    where the shape has room: NaN alone, one NaN among finite values, +inf (floor 253, rceil
    254), zeros, E2M1 ties at scale 1 (amax 6), a saturating block (amax 7: floor's 6, rceil's
    next scale), tiny values (scale 0 under floor)."""
    x = planted(m, n, torch.float32, seed=seed, specials=specials)
    if specials and m >= 64 and n >= 16:
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.1, 5.5, -5.9, 6.0, 0.0, -0.0, 1.0, 3.0])
        x[0:32, 0] = float("nan")
        x[32:64, 1] = 1.0
        x[40, 1] = float("nan")
        x[0:32, 2] = 2.0
        x[5, 2] = float("inf")
        x[32:64, 3] = 0.0
        x[0:32, 4] = torch.cat([ties, -ties])
        x[32:64, 5] = torch.linspace(-7.0, 7.0, 32)
        x[0:32, 6] = 2.0 ** -130 if dtype is torch.float32 else 1e-7
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m, n", [(8, 16), (24, 48), (32, 272), (40, 16), (64, 528), (96, 48), (104, 208),
                                  (1000, 208), (4096, 4096)])
@pytest.mark.parametrize("mode, layout", [("floor", "compact"), ("rceil", "swizzled"), ("floor", "swizzled"),
                                          ("rceil", "compact")])
def test_colwise_copy_matches_reference(strict, dtype, m, n, mode, layout):
    """Both directions and the colwise copy alone, into fresh and poisoned outputs: M % 32 of 0
    (16-byte runs), 8, 16, 24 (a partial last block: 4- and 8-byte runs), N a multiple of the
    256-column tile or not; fp32 on the vectorised kernel (a thread's 8 rows of a column one word).
    CPU counterparts: test_colwise_copy_compiles, test_fp32_colwise_copy_compiles."""
    x = _blocks(m, n, DTYPES[dtype], seed=m * 5 + n)
    for opts in (dict(), dict(rowwise=False)):
        op = _op(scale_mode=mode, scale_layout=layout, **opts)
        _same(op, x, op(x.cuda()))
        _same(op, x, op(x.cuda(), out=poisoned(op, x.cuda())))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_ops_match_reference(strict, dtype):
    """gelu (planted and finite data) with the amax, in the transcendental class; relu with the
    amax and with the copy alone, a user epilogue whose padding rows are nonzero (M % 32 != 0), the
    copy beside a dact: byte for byte."""
    t = DTYPES[dtype]
    x, b = _blocks(72, 528, t, seed=1), planted(1, 528, t, seed=2, specials=False).reshape(528)
    fin = _blocks(72, 528, t, seed=3, specials=False)
    for xx in (x, fin):
        gelu, relu = _op(act="gelu", amax=True), _op(act="relu", amax=True)
        got, want = gelu(xx.cuda()), gelu.reference(xx)
        for direction in ("rowwise", "colwise"):
            within_gelu_class(got, want, direction)
        _same(relu, xx, relu(xx.cuda()))
    relu = _op(act="relu", rowwise=False, scale_mode="rceil")
    _same(relu, x, relu(x.cuda()))
    epi = mxq.fused_quant(format="mxfp4", colwise=True, scale_layout="swizzled")(scaled_shift)
    y = x[:40]
    want, got = epi.reference(y, b), epi(y.cuda(), b.cuda())
    for f in OUTS[:4]:
        assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), f
    drelu = _op(dact="relu")
    a = planted(72, 528, t, seed=5)
    want, got = drelu.reference(fin, act_input=a), drelu(fin.cuda(), act_input=a.cuda())
    for f in OUTS[:4]:
        assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), f


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 64])
@pytest.mark.parametrize("m, n", [(32, 48), (72, 272), (200, 208), (1024, 528)])
def test_colwise_tiles_match_reference(strict, rows, m, n):
    """Tuning.fp4_col_rows: 64 (two blocks a tile; M % 64 of 32, 8, 0) and 16 (run as 32)."""
    for dtype in (torch.bfloat16, torch.float32):  # (fp32: the vectorised kernel's tile of rows / 8 warps)
        x = _blocks(m, n, dtype, seed=m + n + rows)
        for opts in (dict(), dict(rowwise=False, scale_layout="swizzled", scale_mode="rceil")):
            op = _op(**opts)._with_tuning(kconfig.Tuning(fp4_col_rows=rows))
            _same(op, x, op(x.cuda()))


@pytest.mark.gpu
def test_colwise_copy_decodes_as_the_reference(strict):
    """Finite data: the kernels' colwise copy dequantizes to the reference's values exactly."""
    x = _blocks(256, 512, torch.bfloat16, seed=7, specials=False)
    got = _op()(x.cuda())
    want = _op().reference(x)
    assert torch.equal(got.dequantize("colwise").cpu(), want.dequantize("colwise"))


@pytest.mark.gpu
def test_unserved_calls_fall_back_with_the_reference(monkeypatch):
    op = _op()
    for x, why in ((_blocks(20, 64, torch.float32, seed=8), "M % 8"),
                   (_blocks(20, 64, torch.bfloat16, seed=9), "M % 8")):
        _same(op, x, op(x.cuda()))  # (after a one-time warning)
        monkeypatch.setenv("MXQ_STRICT", "1")
        with pytest.raises(RuntimeError, match=why):
            op(x.cuda())
        monkeypatch.delenv("MXQ_STRICT")
