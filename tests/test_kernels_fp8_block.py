"""FP8 block scaling on the kernels: 1x128 rowwise blocks (mxq/kernels/codec.py's fp32-scale
format, packed.PackedKernel.row_block_scales, vectorized.VectorizedKernel.row_scale) and colwise
128-row blocks (the packed kernel's 128-row tile, KernelConfig.tile_rows).

CPU: what the kernels serve (limits.fp8_block_unserved), the module renders, the kernels compile
for sm_90a and sm_100a with TransformerEngine's arithmetic in their PTX, and the GEMM-ready
scale offsets the kernels write through (codec.row_scale_offset over launch.flat_scale) land on
the logical scales. GPU (marked gpu): every dtype, fp8, scale mode, layout and variant against the
torch reference byte for byte, and a small case against tests/oracle_fp8_block.py.
"""

import math

import pytest
import torch

import mxq
from mxq.formats import fp8_block_layouts
from mxq.formats.format import Format
from mxq.frontend import codegen
from mxq.frontend.spec import QuantSpec
from mxq.kernels import codec
from mxq.runtime import compiler, launch, limits
from mxq.testing import planted, poisoned, same_bytes

from . import oracle_fp8_block as oracle

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FIELDS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias")


def ident(x):
    return x


def scaled_shift(x, b, s: float = 1.5):
    return x * s + b


# -- what is served ------------------------------------------------------------------------------
@pytest.mark.parametrize("opts, dtype, why", [
    (dict(colwise=True, scale_layout="gemm"), torch.bfloat16, "gemm"),
    (dict(colwise=True, amax=True), torch.bfloat16, "amax"),
    (dict(colwise=True), torch.float32, "fp32"),
    (dict(block=(128, 128)), torch.bfloat16, "block"),
])
def test_unserved_names_what_has_no_kernel(opts, dtype, why):
    spec = QuantSpec(format="fp8_block", **opts)
    reason = limits.unserved(spec, mxq.fused_quant(format="fp8_block", **opts)(ident).epilogue,
                             torch.zeros(4, 128, dtype=dtype), lambda: None)
    assert "fp8_block" in reason and why in reason


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_rowwise_1x128_is_served(dtype, layout):
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout, amax=True)(ident)
    assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 200, dtype=dtype), lambda: None) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_colwise_128_rows_are_served_from_16_bit_inputs(dtype):
    for opts in (dict(colwise=True), dict(rowwise=False, colwise=True, act="gelu"), dict(colwise=True, dbias=True)):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 200, dtype=dtype), lambda: None) is None


def test_grouped_and_unaligned_fp32_rows_fall_back():
    from mxq.runtime.call import Call

    op = mxq.fused_quant(format="fp8_block")(ident)
    x = torch.zeros(8, 131)
    grouped = Call([x], [], group_offsets=torch.tensor([8]))
    assert "group_offsets" in limits.unserved(op.spec, op.epilogue, x, lambda: None, grouped)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", row_align=1)  # rows 131 bytes apart
    into = Call([x], [], out=out)
    assert "8-byte" in limits.unserved(op.spec, op.epilogue, x, lambda: None, into)
    padded = Call([x], [], out=mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu"))
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None, padded) is None
    assert limits.unserved(op.spec, op.epilogue, x.bfloat16(), lambda: None, into) is None  # (16-bit: any rows)


# -- compiled code ---------------------------------------------------------------------------------
def _ptx(op, arch, dtype, variant="vec"):
    return compiler.compile_op(op, arch, dtype, keep_ptx=True, variant=variant).__ptx__


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, layout", [("bf16", "compact"), ("fp16", "gemm"), ("fp32", "compact")])
def test_rowwise_compiles_with_te_arithmetic(arch, dtype, layout):
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout)(ident)
    ptx = _ptx(op, arch, dtype)
    assert f".target {arch}" in ptx
    # the scale fp8max / amax and the stored 1 / scale: IEEE divisions, no approximate reciprocal
    assert "div.rn.f32" in ptx and "rcp.approx" not in ptx and "div.approx" not in ptx and "div.full" not in ptx
    assert "0f43E00000" in ptx  # 448.0
    assert "-8388608" in ptx  # pow2: the sign and exponent bits (0xFF800000)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "st.global.b32" in ptx  # fp32 scales
    # NaN elements do not enter a block's amax (TE's fmaxf): no NaN-propagating max without amax=True
    assert "max.NaN" not in ptx
    if dtype == "fp32":  # a 128-column block is 16 lanes: 4 butterfly stages per row
        assert ptx.count("shfl.sync.bfly") == 4 * 8
    else:  # 16 lanes x 8 rows: a reduce-scatter (4 + 2 + 1 shuffles) and one all-reduce stage
        assert ptx.count("shfl.sync.bfly") == 8 and {"bf16": "max.bf16x2", "fp16": "max.f16x2"}[dtype] in ptx


def test_fp32_mode_and_e5m2_compile():
    op = mxq.fused_quant(format="fp8_block", fp8="e5m2", scale_mode="fp32")(ident)
    ptx = _ptx(op, "sm_90a", "bf16")
    assert "cvt.rn.satfinite.e5m2x2.f32" in ptx and "0f47600000" in ptx  # 57344.0
    assert "-8388608" not in ptx


@pytest.mark.parametrize("dtype, variant", [("bf16", "generic"), ("fp16", "rows8"), ("fp32", "rows8")])
def test_unaligned_variants_compile(dtype, variant):
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm", amax=True)(ident)
    assert "div.rn.f32" in _ptx(op, "sm_90a", dtype, variant)


def test_fused_ops_compile():
    ops = [mxq.fused_quant(format="fp8_block", act="gelu")(ident),
           mxq.fused_quant(format="fp8_block", dact="gelu", dbias=True, amax=True)(ident),
           mxq.fused_quant(format="fp8_block")(scaled_shift)]
    for op in ops:
        for dtype in ("bf16", "fp32"):
            assert "cvt.rn.satfinite.e4m3x2.f32" in _ptx(op, "sm_90a", dtype)


def test_element_wise_kernel_refuses_wide_blocks():
    op = mxq.fused_quant(format="fp8_block")(ident)
    with pytest.raises(Exception, match="1x32"):
        _ptx(op, "sm_90a", "fp32", "generic")


def test_source_renders_for_served_specs_only():
    assert "fp8_block" in mxq.fused_quant(format="fp8_block")(ident).source
    assert "fp8_block" in mxq.fused_quant(format="fp8_block", colwise=True)(ident).source
    with pytest.raises(NotImplementedError, match="transposed"):
        mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(ident).source


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, variant", [("bf16", "vec"), ("fp16", "generic"), ("bf16", "rows8")])
def test_colwise_compiles_as_a_128_row_tile(arch, dtype, variant):
    """Colwise 128-row blocks: the packed kernel's tile is 128 rows (16 warps of 8 rows), the
    column maxima drop NaN, each column's scale and 1 / scale are IEEE divisions."""
    op = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    ptx = _ptx(op, arch, dtype, variant)
    assert ".reqntid 512, 1, 1" in ptx
    assert "max.NaN" not in ptx
    # an infinite quotient (a subnormal amax) becomes the input's largest finite value, pow2-rounded
    # (folded to one constant), in the row scales and in each column word's two scales
    assert ptx.count({"bf16": "0f7F000000", "fp16": "0f47000000"}[dtype]) >= 3
    assert ptx.count("div.rn.f32") >= 6  # row: scale, 1 / scale; columns: two of each per owner word
    cfg = codegen.kernel_config(op.spec, op.epilogue)
    assert cfg.tile_rows == 128 and cfg.packed_warps() == 16 and cfg.packed_warps(True) == 16
    assert cfg.rows8_warps() is None


def test_colwise_dbias_compiles():
    """dbias with 128-row tiles: 512 threads for 256 columns' sums (the threads past them store nothing)."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, dact="relu", dbias=True)(ident)
    for variant in ("vec", "generic"):
        ptx = _ptx(op, "sm_90a", "bf16", variant)
        assert ".reqntid 512, 1, 1" in ptx and ("add.rn.f64" in ptx or "add.f64" in ptx)


def test_colwise_refuses_to_trace_what_it_does_not_serve():
    op = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    with pytest.raises(Exception, match="128 rows"):
        _ptx(op, "sm_90a", "fp32")


# -- GEMM-ready offsets ------------------------------------------------------------------------
@pytest.mark.parametrize("m, n", [(1, 1), (5, 300), (8, 128), (130, 257)])
def test_gemm_offsets_land_on_the_logical_scales(m, n):
    """codec.row_scale_offset (plain integers here) over launch.flat_scale's buffer writes scale
    (r, b) where the GEMM-ready view reads it, and where the oracle's drawing puts it."""
    view = fp8_block_layouts.gemm_scale(m, n, False, "cpu")
    flat = launch.flat_scale(view)
    fmt = Format.fp8_block("e4m3", (1, 128), "pow2", "gemm")
    nbr = -(-n // 128)
    want = oracle.gemm_rowwise_offsets(m, n, False)
    for r in range(m):
        for b in range(nbr):
            off = codec.row_scale_offset(fmt, r, b, nbr, m)
            assert off == want[(r, b)]
            flat[off] = r * 1000 + b
            assert view[r, b].item() == r * 1000 + b
    compact = Format.fp8_block("e4m3", (1, 128), "pow2", "compact")
    assert codec.row_scale_offset(compact, 3, 1, nbr, m) == 3 * nbr + 1


# -- on the device -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """No fallback: every call here is one the kernels serve (MXQ_STRICT=1 raises otherwise)."""
    monkeypatch.setenv("MXQ_STRICT", "1")


def _check(op, ins, got, **kw):
    """Every output byte equal to the reference's; dbias within one ulp of the input dtype (the
    kernels sum in another order) and a NaN amax any NaN (mxq.testing.compare's rules)."""
    want = op.reference(*ins, **kw)
    for f in FIELDS:
        w = getattr(want, f)
        if w is not None:
            g = getattr(got, f)
            if f == "dbias":
                gd, wd = g.cpu().double(), w.double()
                ulp = torch.finfo(w.dtype).eps * wd.abs() + torch.finfo(w.dtype).tiny
                assert bool((((gd - wd).abs() <= ulp) | (gd == wd) | (gd.isnan() & wd.isnan())).all()), f
            elif f == "amax":  # (a NaN amax: NaN, any payload, as mxq.testing.compare has it)
                assert same_bytes(g, w) or bool(g.isnan().cpu() & w.isnan()), f
            else:
                assert same_bytes(g.contiguous(), w.contiguous()), f


def _specials(m, n, dtype, seed):
    """planted data plus FP8 block scaling's edge blocks: all NaN, NaN with values, inf, tiny
    (fp8max / amax overflows fp32 where the type has the range), all zero."""
    x = planted(m, n, torch.float32, seed=seed)
    if m >= 6 and n >= 256:
        x[0, :128] = float("nan")
        x[1, 128:256] = float("nan")
        x[1, 130] = 3.0
        x[2, 5] = float("inf")
        x[4, :128] = 1e-38 if dtype is not torch.float16 else 1e-7
        x[5, 128:256] = 0.0
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (33, 31), (6, 300), (127, 200), (4, 5, 96), (64, 1024), (130, 1000)])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fp8, mode", [("e4m3", "pow2"), ("e5m2", "fp32"), ("e4m3", "fp32")])
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_rowwise_matches_reference(shape, dtype, fp8, mode, layout):
    op = mxq.fused_quant(format="fp8_block", fp8=fp8, scale_mode=mode, scale_layout=layout, amax=True)(ident)
    m = math.prod(shape[:-1])
    x = _specials(m, shape[-1], DTYPES[dtype], seed=sum(shape)).reshape(shape)
    got = op(x.cuda())
    into = op(x.cuda(), out=poisoned(op, x.cuda(), row_align=None)) if layout == "compact" else got  # (fp32: rows8)
    _check(op, [x], got)
    _check(op, [x], into)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8), (33, 200), (130, 264), (257, 1000), (4, 5, 96)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("fp8, mode", [("e4m3", "pow2"), ("e5m2", "fp32")])
@pytest.mark.parametrize("rowwise", [True, False])
def test_colwise_matches_reference(shape, dtype, fp8, mode, rowwise):
    """128-row colwise blocks (partial at M % 128), with and without the rowwise copy."""
    op = mxq.fused_quant(format="fp8_block", fp8=fp8, scale_mode=mode, rowwise=rowwise, colwise=True)(ident)
    m = math.prod(shape[:-1])
    x = _specials(m, shape[-1], DTYPES[dtype], seed=m).reshape(shape)
    if m >= 130:  # a column of NaN and inf in the second block; a column all zero
        x.view(m, -1)[128:, 3] = float("nan")
        x.view(m, -1)[129, 4] = float("inf")
        x.view(m, -1)[:, 5] = 0.0
    got = op(x.cuda(), out=poisoned(op, x.cuda()))
    _check(op, [x], got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_colwise_fused_and_unaligned_match_reference(dtype):
    t = DTYPES[dtype]
    x, b = _specials(300, 261, t, seed=21), planted(1, 261, t, seed=22, specials=False).reshape(261)
    epi = mxq.fused_quant(format="fp8_block", colwise=True)(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda(), out=poisoned(epi, x.cuda(), row_align=1)))  # (variant generic)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))  # (rows padded: variant rows8)
    a = planted(300, 261, t, seed=23)
    for opts in (dict(dact="relu"), dict(dact="relu", dbias=True), dict(dbias=True, rowwise=False)):
        op = mxq.fused_quant(format="fp8_block", colwise=True, **opts)(ident)
        kw = {"act_input": a} if "dact" in opts else {}
        _check(op, [x], op(x.cuda(), **{k: v.cuda() for k, v in kw.items()}), **kw)
        y = planted(1000, 512, t, seed=24)  # (8 tiles of 128 rows: 8 dbias partials)
        _check(op, [y], op(y.cuda(), **({"act_input": y.cuda()} if kw else {})), **({"act_input": y} if kw else {}))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_unaligned_rows_match_reference(dtype):
    """N % 8 != 0 into contiguous FP8 rows: the packed kernel's unaligned rows (variant generic)."""
    op = mxq.fused_quant(format="fp8_block", scale_layout="compact")(ident)
    x = _specials(37, 261, DTYPES[dtype], seed=3)
    got = op(x.cuda(), out=poisoned(op, x.cuda(), row_align=1))
    _check(op, [x], got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_ops_match_reference(dtype):
    t = DTYPES[dtype]
    x, b = _specials(70, 384, t, seed=1), planted(1, 384, t, seed=2, specials=False).reshape(384)
    relu = mxq.fused_quant(format="fp8_block", act="relu", amax=True)(ident)
    _check(relu, [x], relu(x.cuda()))
    epi = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))
    drelu = mxq.fused_quant(format="fp8_block", dact="relu", dbias=True)(ident)
    a = planted(70, 384, t, seed=5)
    _check(drelu, [x], drelu(x.cuda(), act_input=a.cuda()), act_input=a)


@pytest.mark.gpu
def test_gelu_within_the_transcendental_class():
    from mxq.testing import compare

    op = mxq.fused_quant(format="fp8_block", act="gelu")(ident)
    x = planted(96, 512, torch.bfloat16, seed=4)
    assert compare(op(x.cuda()), op.reference(x), False) == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernels_match_the_oracle(dtype):
    x = _specials(6, 300, DTYPES[dtype], seed=9)
    got = mxq.quantize(x.cuda(), format="fp8_block", scale_layout="gemm")
    codes, scales = oracle.quantize(x.float().tolist(), "e4m3", (1, 128), "pow2", dtype)
    assert got.rowwise_data.cpu().view(torch.uint8).tolist() == codes
    assert got.rowwise_scale.cpu().tolist() == scales


@pytest.mark.gpu
def test_prepare_and_noop():
    op = mxq.fused_quant(format="fp8_block")(ident)
    x = planted(64, 512, torch.bfloat16, seed=11).cuda()
    run, out = op.prepare(x)
    run()
    _check(op, [x.cpu()], out)
    keep = poisoned(op, x)
    before = keep.rowwise_data.clone()
    op(x, out=keep, noop=torch.ones(1, device="cuda"))
    assert same_bytes(keep.rowwise_data, before)
