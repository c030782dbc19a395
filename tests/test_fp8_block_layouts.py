"""FP8 block scaling's layouts (mxq/formats/fp8_block_layouts.py): shapes, strides and padding of
the compact and GEMM-ready layouts against docs/NUMERICS.md's drawings (tests/oracle_fp8_block.py's
offsets), the groups, the arguments torch._scaled_mm checks, and the three GEMMs of a linear
layer emulated on CPU from the gemm-layout tensors, exactly as the README writes them."""

import pytest
import torch

import mxq
from tests import oracle_fp8_block as oracle


def cdiv(a, b):
    return -(-a // b)


def buffer_of(t: torch.Tensor) -> torch.Tensor:
    """The whole fp32 storage a scale view lives in, flat."""
    return torch.tensor([], dtype=t.dtype).set_(t.untyped_storage()).reshape(-1)


@pytest.mark.parametrize("m, n", [(1, 1), (3, 300), (130, 129), (256, 512)])
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_compact_shapes(m, n, block):
    t = mxq.quantize(torch.randn(m, n), format="fp8_block", block=block, colwise=True)
    rows = m if block == (1, 128) else cdiv(m, 128)
    assert t.rowwise_scale.shape == (rows, cdiv(n, 128)) and t.rowwise_scale.is_contiguous()
    assert t.rowwise_scale.dtype == torch.float32 and t.colwise_data.shape == (m, n)
    if block == (128, 128):  # one scale per tile, both directions the same bytes
        assert torch.equal(t.colwise_scale, t.rowwise_scale)
        assert torch.equal(t.colwise_data.view(torch.uint8), t.rowwise_data.view(torch.uint8))
    else:
        assert t.colwise_scale.shape == (cdiv(m, 128), n)


@pytest.mark.parametrize("m, n", [(1, 1), (3, 300), (130, 129), (256, 640)])
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_gemm_layout_offsets_and_padding(m, n, block):
    """Every logical scale sits at the offset docs/NUMERICS.md draws, in a buffer whose padding is
    zero; the colwise copy is [N, M], contiguous, and its scales describe it."""
    tiles = block == (128, 128)
    x = torch.randn(m, n) + 0.5
    t = mxq.quantize(x, format="fp8_block", block=block, colwise=True, scale_layout="gemm")
    c = mxq.quantize(x, format="fp8_block", block=block, colwise=True)
    assert t.colwise_data.shape == (n, m) and t.colwise_data.is_contiguous()
    assert torch.equal(t.colwise_data.t().view(torch.uint8), c.colwise_data.view(torch.uint8))
    assert torch.equal(t.rowwise_data.view(torch.uint8), c.rowwise_data.view(torch.uint8))
    for scale, compact, rows, cols in ((t.rowwise_scale, c.rowwise_scale, m, n),
                                       (t.colwise_scale, c.colwise_scale.t(), n, m)):
        if not tiles:
            assert scale.stride(0) == 1 and scale.shape == (rows, cdiv(cols, 128))
        assert torch.equal(scale, compact if not tiles or scale is t.rowwise_scale else c.colwise_scale.t())
        buf = buffer_of(scale)
        offsets = oracle.gemm_rowwise_offsets(rows, cols, tiles)
        want = torch.zeros_like(buf)
        for (i, j), off in offsets.items():
            want[off] = scale[i, j]
        assert torch.equal(buf, want)  # each entry where drawn, the rest zero
        if tiles:
            assert buf.numel() == cdiv(cdiv(rows, 128), 4) * 4 * cdiv(cdiv(cols, 128), 4) * 4
        else:
            assert buf.numel() == cdiv(cols, 128) * cdiv(rows, 4) * 4


def test_out_reuses_gemm_layout_buffers():
    x = torch.randn(64, 256)
    out = mxq.MXFP8Tensor.empty(mxq.op.QuantSpec(format="fp8_block", colwise=True, scale_layout="gemm"),
                                x.shape, x.dtype, "cpu")
    got = mxq.quantize(x, format="fp8_block", colwise=True, scale_layout="gemm", out=out)
    want = mxq.quantize(x, format="fp8_block", colwise=True, scale_layout="gemm")
    assert got is out
    for f in ("rowwise_scale", "colwise_scale"):
        assert torch.equal(getattr(got, f), getattr(want, f)) and getattr(got, f).stride() == getattr(want, f).stride()
    with pytest.raises(ValueError, match="out"):
        mxq.quantize(x, format="fp8_block", colwise=True, out=out)  # a compact op into gemm buffers
    with pytest.raises(ValueError, match="out"):
        mxq.quantize(x, colwise=True, out=out)  # an MXFP8 op


@pytest.mark.parametrize("block, m, n", [((1, 128), 6, 200), ((1, 128), 8, 256), ((128, 128), 200, 300),
                                          ((128, 128), 130, 130)])
def test_out_scales_must_keep_the_gemm_layouts_strides(block, m, n):
    """The gemm layout's scales are views of padded buffers, which the kernels write at the
    padded offsets (a [M, nb] 1x128 grid M-fastest, rows of roundup(nb, 4) for 128x128): an
    out= field of the right shape in another layout (a contiguous tensor) is refused by name,
    on the call's and on op.gemm's route; the same strides on a buffer of one's own are taken."""
    x = torch.randn(m, n)
    spec = mxq.op.QuantSpec(format="fp8_block", block=block, scale_layout="gemm")
    want = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu").rowwise_scale
    assert not want.is_contiguous()
    out = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
    out.rowwise_scale = torch.zeros(want.shape)
    with pytest.raises(ValueError, match="out.rowwise_scale' must be laid out"):
        mxq.quantize(x, format="fp8_block", block=block, scale_layout="gemm", out=out)
    if block == (1, 128) and n % 8 == 0:
        op = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(_ident)
        a, w = torch.randn(m, 32, dtype=torch.bfloat16), torch.randn(n, 32, dtype=torch.bfloat16)
        out = mxq.MXFP8Tensor.empty(op.spec, (m, n), a.dtype, "cpu", row_align=1)
        out.rowwise_scale = torch.zeros(want.shape)
        with pytest.raises(ValueError, match="out.rowwise_scale' must be laid out"):
            op.gemm(a, w, out=out)
    own = torch.zeros(want.untyped_storage().nbytes() // 4).as_strided(want.shape, want.stride())
    out = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
    out.rowwise_scale = own
    got = mxq.quantize(x, format="fp8_block", block=block, scale_layout="gemm", out=out)
    assert torch.equal(got.rowwise_scale, mxq.quantize(x, format="fp8_block", block=block,
                                                       scale_layout="gemm").rowwise_scale)


def _ident(x):
    return x


# -- groups --------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_group_equals_its_rows_alone(block):
    x = torch.randn(500, 200)
    offs = torch.tensor([0, 130, 130, 400, 500])
    t = mxq.quantize(x, format="fp8_block", block=block, colwise=True, group_offsets=offs)
    assert t.colwise_scale.shape == (500 // 128 + 5, 200 if block == (1, 128) else 2)
    for g, (s, e) in enumerate([(0, 0), (0, 130), (130, 130), (130, 400), (400, 500)]):
        alone = mxq.quantize(x[s:e], format="fp8_block", block=block, colwise=True)
        part = t.group(g)
        for f in ("rowwise_data", "colwise_data"):
            assert torch.equal(getattr(part, f).view(torch.uint8), getattr(alone, f).view(torch.uint8))
        for f in ("rowwise_scale", "colwise_scale"):
            assert torch.equal(getattr(part, f), getattr(alone, f))
        assert part.format == "fp8_block" and part.block == block
    # the rows between groups' blocks are zero: group g's blocks start at start // 128 + g
    used = {r for g, (s, e) in enumerate([(0, 0), (0, 130), (130, 130), (130, 400), (400, 500)])
            for r in range(s // 128 + g, s // 128 + g + cdiv(e - s, 128))}
    for r in range(t.colwise_scale.shape[0]):
        assert (r in used) or bool((t.colwise_scale[r] == 0).all())
    assert torch.equal(t.dequantize("colwise"), torch.cat([t.group(g).dequantize("colwise") for g in range(5)]))


def test_groups_refuse_the_gemm_layout():
    with pytest.raises(ValueError, match="group_offsets"):
        mxq.quantize(torch.randn(8, 128), format="fp8_block", scale_layout="gemm", group_offsets=torch.tensor([8]))


# -- the three GEMMs of a linear layer ---------------------------------------------------------

def torch_checks(a, b, scale_a, scale_b):
    """What torch._scaled_mm checks of block-scaled operands (aten ScaledBlas.cpp's
    is_blockwise_1x128_scaling / is_blockwise_128x128_scaling, the latter with the padded row
    stride): ``a`` row-major [M, K], ``b`` column-major [K, N], dims multiples of 16."""
    m, k = a.shape
    n = b.shape[1]
    assert a.is_contiguous() and b.t().is_contiguous() and m % 16 == 0 and k % 16 == 0 and n % 16 == 0
    assert scale_a.shape == (m, cdiv(k, 128)) and scale_a.stride() == (1, m)  # 1x128, outer-dim-major
    bt = scale_b.t()  # checked against b.t() [N, K]
    if bt.shape == (n, cdiv(k, 128)):
        assert bt.stride() == (1, n)
    else:
        assert bt.shape == (cdiv(n, 128), cdiv(k, 128)) and bt.stride() == (cdiv(cdiv(k, 128), 4) * 4, 1)
    # and torch's own shape rules for the call (its meta function, on tensors of the same strides)
    meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (a, b, scale_a, scale_b)]
    out = torch._scaled_mm(meta[0], meta[1], scale_a=meta[2], scale_b=meta[3], out_dtype=torch.bfloat16)
    assert out.shape == (m, n)


def emulated_scaled_mm(a, b, scale_a, scale_b):
    """torch._scaled_mm's product in float64: a [M, K] times b [K, N], each element times its
    block's scale (1x128 along K, or 128x128 tiles, told apart by the scale shapes)."""
    m, k = a.shape
    n = b.shape[1]
    rows = torch.arange(m) if scale_a.shape[0] == m else torch.arange(m) // 128
    cols = torch.arange(n) if scale_b.shape[1] == n else torch.arange(n) // 128
    kb = torch.arange(k) // 128
    da = a.double() * scale_a.double()[rows][:, kb]
    db = b.double() * scale_b.double()[kb][:, cols]
    return da @ db


@pytest.mark.parametrize("m, k, n", [(256, 512, 768), (384, 1280, 128), (32, 640, 48)])
def test_three_gemms_from_gemm_layout(m, k, n):
    """forward y = x w^T, dgrad dx = dy w, wgrad dw = dy^T x, each called as the README writes it
    (x, dy 1x128; w 128x128), on their shapes and strides as torch checks them, and equal to the
    float product of the dequantized operands; near the unquantized product."""
    g = torch.Generator().manual_seed(0)
    x, w, dy = (torch.randn(*s, generator=g).bfloat16() for s in ((m, k), (n, k), (m, n)))
    opts = dict(format="fp8_block", colwise=True, scale_layout="gemm")
    qx, qdy = mxq.quantize(x, **opts), mxq.quantize(dy, **opts)
    qw = mxq.quantize(w, block=(128, 128), **opts)
    calls = {
        "forward": ((qx.rowwise_data, qw.rowwise_data.t(), qx.rowwise_scale, qw.rowwise_scale.t()),
                    qx.dequantize("rowwise").double() @ qw.dequantize("rowwise").double().t(), x.float() @ w.float().t()),
        "dgrad": ((qdy.rowwise_data, qw.colwise_data.t(), qdy.rowwise_scale, qw.colwise_scale.t()),
                  qdy.dequantize("rowwise").double() @ qw.dequantize("colwise").double(), dy.float() @ w.float()),
        "wgrad": ((qdy.colwise_data, qx.colwise_data.t(), qdy.colwise_scale, qx.colwise_scale.t()),
                  qdy.dequantize("colwise").double().t() @ qx.dequantize("colwise").double(),
                  dy.float().t() @ x.float()),
    }
    for name, (args, exact, ref) in calls.items():
        torch_checks(*args)
        got = emulated_scaled_mm(*args)
        assert torch.allclose(got, exact, rtol=1e-12, atol=1e-12), name
        cos = torch.nn.functional.cosine_similarity(got.flatten().float(), ref.flatten(), dim=0)
        assert cos > 0.998, (name, cos)


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(256, 512, 768), (384, 1280, 128), (256, 512, 1024), (384, 1536, 512),
                                     (8192, 4096, 4096)])
def test_scaled_mm_runs_the_three_gemms(m, k, n):
    """On the H200: torch._scaled_mm (cuBLAS block scaling) on mxq's gemm-layout outputs, called
    exactly as the README writes it, equals the float emulation (cosine > 0.9999), or, for a
    128x128 operand whose block counts are not multiples of 4 (the weight's dims not multiples of
    512), torch refuses the padded scale rows (torch versions whose check wants an unpadded row
    stride, which cuBLAS reads wrongly there): never a wrong product. Multiples of 512 run on
    every version."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w, dy = (torch.randn(*s, generator=g, device="cuda").bfloat16() for s in ((m, k), (n, k), (m, n)))
    opts = dict(format="fp8_block", colwise=True, scale_layout="gemm")
    qx, qdy = mxq.quantize(x, **opts), mxq.quantize(dy, **opts)
    qw = mxq.quantize(w, block=(128, 128), **opts)
    aligned = k % 512 == 0 and n % 512 == 0  # (the weight's 128x128 block counts are multiples of 4)
    for args in ((qx.rowwise_data, qw.rowwise_data.t(), qx.rowwise_scale, qw.rowwise_scale.t()),
                 (qdy.rowwise_data, qw.colwise_data.t(), qdy.rowwise_scale, qw.colwise_scale.t()),
                 (qdy.colwise_data, qx.colwise_data.t(), qdy.colwise_scale, qx.colwise_scale.t())):
        tiles = args[3].shape[1] != args[1].shape[1]  # (scale_b per 128 columns of b: a 128x128 operand)
        try:
            got = torch._scaled_mm(args[0], args[1], scale_a=args[2], scale_b=args[3], out_dtype=torch.bfloat16)
        except RuntimeError as exc:
            assert tiles and not aligned and "Invalid scaling configuration" in str(exc), (m, k, n, str(exc)[:200])
            continue
        want = emulated_scaled_mm(*(a.cpu() for a in args))
        cos = torch.nn.functional.cosine_similarity(got.double().cpu().flatten(), want.flatten(), dim=0)
        assert cos > 0.9999, (m, k, n, cos)
