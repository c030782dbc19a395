"""The reference's FP8 block-scaling route (mxq/formats/reference.py, write_fp8_block) through
every op feature MXFP8 has: user epilogues with broadcast operands, act/dact (plain and gated),
dbias, amax, noop, out=, groups; the options' validation; CUDA calls no kernel serves run the
reference with the fallback warning (an error under MXQ_STRICT=1); the C++ routes refused. Expected
bytes come from tests/oracle_fp8_block.py on values computed here with plain torch."""

import math
import struct
import warnings

import pytest
import torch

import mxq
from mxq.frontend.spec import QuantSpec
from tests import oracle_fp8_block as oracle

NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def ident(x):
    return x


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def expect(t, v, dtype, block=(1, 128), mode="pow2", fp8="e4m3"):
    """t's rowwise and colwise bytes and scales are the oracle's on the fp32 values v [M, N]."""
    rows = v.tolist()
    for direction, blk in (("rowwise", block), ("colwise", (block[1], block[0]))):
        data = getattr(t, f"{direction}_data")
        if data is None:
            continue
        want, want_s = oracle.quantize(rows, fp8, blk, mode, NAMES[dtype])
        assert data.reshape(v.shape).contiguous().view(torch.uint8).tolist() == want, direction
        got_s = t.compact_scale(direction).contiguous().view(torch.int32).reshape(-1).tolist()
        assert got_s == [bits(s) for r in want_s for s in r], direction


@pytest.mark.parametrize("dtype", list(NAMES))
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_epilogue_with_broadcast_operands(dtype, block):
    @mxq.fused_quant(format="fp8_block", block=block, colwise=True, amax=True, dbias=True)
    def scale_bias(x, bias, s, alpha: float = 1.0):
        return x * s * alpha + bias

    g = torch.Generator().manual_seed(1)
    x = torch.randn(130, 260, generator=g).to(dtype)
    bias, s = torch.randn(260, generator=g).to(dtype), torch.randn(130, 1, generator=g).to(dtype)
    t = scale_bias(x, bias, s, alpha=0.5)
    v = x.float() * s.float() * 0.5 + bias.float()  # one fp32 rounding per operation
    assert torch.equal(t.dbias, v.double().sum(0).float().to(dtype))  # before the input-dtype round trip
    v = v.to(dtype).float()  # step 5
    assert t.amax.item() == v.abs().max().item()
    expect(t, v, dtype, block)
    # the same bytes as materialised operands
    full = scale_bias(x, bias.expand(130, 260).contiguous(), s.expand(130, 260).contiguous(), alpha=0.5)
    for f in ("rowwise_data", "colwise_data"):
        assert torch.equal(getattr(t, f).view(torch.uint8), getattr(full, f).view(torch.uint8))


def test_act_gelu_matches_eager_gelu():
    @mxq.fused_quant(format="fp8_block", act="gelu", colwise=True)
    def bias_gelu(x, b):
        return x + b

    x, b = torch.randn(64, 300).bfloat16(), torch.randn(300).bfloat16()
    t = bias_gelu(x, b)
    v = mxq.gelu((x.float() + b.float())).bfloat16().float()
    expect(t, v, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dact_drelu_dbias(dtype):
    op = mxq.fused_quant(format="fp8_block", dact="relu", dbias=True, colwise=True, scale_mode="fp32")(ident)
    g, a = torch.randn(200, 256).to(dtype), torch.randn(200, 256).to(dtype)
    t = op(g, act_input=a)
    v = g.float() * torch.where(a.float() > 0, 1.0, 0.0)
    assert torch.equal(t.dbias, v.double().sum(0).float().to(dtype))
    expect(t, v.to(dtype).float(), dtype, mode="fp32")


def test_gated_forward_and_backward():
    fwd = mxq.fused_quant(format="fp8_block", act="reglu", block=(128, 128), colwise=True)(ident)
    bwd = mxq.fused_quant(format="fp8_block", dact="reglu", dbias=True)(ident)
    x = torch.randn(130, 512).bfloat16()
    gate, up = x[:, :256].float(), x[:, 256:].float()
    t = fwd(x)
    assert t.shape == (130, 256)
    expect(t, (torch.where(gate > 0, gate, 0.0) * up).bfloat16().float(), torch.bfloat16, (128, 128))
    d = torch.randn(130, 256).bfloat16()
    t = bwd(d, act_input=x)
    v = torch.cat([(d.float() * up) * torch.where(gate > 0, 1.0, 0.0), d.float() * torch.where(gate > 0, gate, 0.0)], 1)
    assert t.shape == (130, 512) and torch.equal(t.dbias, v.double().sum(0).float().bfloat16())
    expect(t, v.bfloat16().float(), torch.bfloat16)


def test_noop_and_out():
    op = mxq.fused_quant(format="fp8_block", colwise=True, amax=True, scale_layout="gemm")(ident)
    x = torch.randn(64, 256)
    out = op(x)
    before = [getattr(out, f).clone() for f in ("rowwise_data", "rowwise_scale", "colwise_scale", "amax")]
    assert op(x * 3, noop=torch.ones(1), out=out) is out
    for f, b in zip(("rowwise_data", "rowwise_scale", "colwise_scale", "amax"), before):
        assert torch.equal(getattr(out, f).reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    fresh = op(x, noop=torch.ones(1))  # nothing written into zeroed outputs
    assert not fresh.rowwise_scale.any() and fresh.format == "fp8_block"
    op(x * 3, out=out)
    assert torch.equal(out.rowwise_scale, op(x * 3).rowwise_scale)


def test_mxfp8_results_unchanged():
    x = torch.randn(64, 96)
    t = mxq.quantize(x)
    assert isinstance(t, mxq.MXFP8Tensor) and t.format == "mxfp8" and t.block == (1, 32)
    assert t.scale_mode == "rceil" and t.rowwise_scale.dtype == torch.uint8
    assert repr(QuantSpec()) == ("QuantSpec(fp8='e4m3', rowwise=True, colwise=False, scale_mode='rceil', "
                                 "scale_layout='compact', amax=False, act=None, dact=None, dbias=False)")
    assert QuantSpec() == QuantSpec(scale_mode="rceil", block=(1, 32)) and QuantSpec().key("fp32") == 2


@pytest.mark.parametrize("options, name", [
    ({"format": "nvfp8"}, "format"),
    ({"format": "fp8_block", "block": (1, 64)}, "block"),
    ({"format": "fp8_block", "block": (128, 1)}, "block"),
    ({"format": "fp8_block", "block": 128}, "block"),
    ({"format": "fp8_block", "block": (True, 128)}, "block"),
    ({"format": "fp8_block", "block": (1.0, 128)}, "block"),
    ({"block": (1, 128)}, "block"),  # an MXFP8 op takes no other block
    ({"format": "fp8_block", "scale_mode": "rceil"}, "scale_mode"),
    ({"scale_mode": "pow2"}, "scale_mode"),
    ({"format": "fp8_block", "scale_layout": "swizzled"}, "scale_layout"),
    ({"scale_layout": "gemm"}, "scale_layout"),
    ({"format": "fp8_block", "fp8": "e3m4"}, "fp8"),
])
def test_bad_options_name_the_argument(options, name):
    with pytest.raises(ValueError, match=name):
        mxq.quantize(torch.randn(4, 4), **options)
    with pytest.raises(ValueError, match=name):
        mxq.fused_quant(**options)(ident)


def test_spec_key_round_trips():
    for block in ((1, 128), (128, 128)):
        for mode in ("pow2", "fp32"):
            for layout in ("compact", "gemm"):
                spec = QuantSpec(format="fp8_block", block=block, scale_mode=mode, scale_layout=layout, colwise=True)
                assert QuantSpec.from_key(spec.key("bf16")) == (spec, "bf16")
    with pytest.raises(ValueError, match="key"):
        QuantSpec.from_key(1 << 18 | 2)  # a 128x128 block on an MXFP8 key


def test_cpp_routes_take_128x128_tiles_where_the_kernels_do(tmp_path):
    """The C++ routes serve fp8_block's 128x128 tiles as the kernels do (tests/test_cpp_fp8_block.py
    runs their exports): register() and dispatcher() build; a gated backward's fp32 export, which
    only Python's route serves, is refused by name before anything is built."""
    op = mxq.fused_quant(format="fp8_block", block=(128, 128))(ident)
    assert op.dispatcher() is op.register("fp8_block_tiles")
    bwd = mxq.fused_quant(format="fp8_block", block=(128, 128), dact="swiglu")(ident)
    with pytest.raises(ValueError, match=r"gated backward \(two output halves\) and fp32"):
        bwd.export(tmp_path / "x", dtype="fp32")
    assert not (tmp_path / "x").exists()


def test_cuda_calls_fall_back_to_the_reference(monkeypatch):
    """No kernel serves fp8_block's 128x128 tiles from unaligned fp32 rows: limits.unserved says so
    (the one-time warning; MXQ_STRICT=1 raises) before any kernel is looked for."""
    from mxq.runtime import limits

    x = torch.randn(4, 100)
    op = mxq.fused_quant(format="fp8_block", block=(128, 128))(ident)
    spec, epi = op.spec, op.epilogue
    assert "fp8_block" in limits.unserved(spec, epi, x, lambda: pytest.fail("not asked"))
    monkeypatch.setenv("MXQ_STRICT", "1")
    from mxq.runtime import validation

    with pytest.raises(RuntimeError, match="fp8_block"):
        validation.fallback(limits.unserved(spec, epi, x, None))


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_gpu_calls_equal_the_cpu_reference(block):
    x = torch.randn(1000, 1000).bfloat16()
    with warnings.catch_warnings():  # (the fallback's one-time warning may have been given already)
        warnings.simplefilter("ignore")
        got = mxq.quantize(x.cuda(), format="fp8_block", block=block, colwise=True, scale_layout="gemm")
    want = mxq.quantize(x, format="fp8_block", block=block, colwise=True, scale_layout="gemm")
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        assert torch.equal(getattr(got, f).cpu().contiguous().view(torch.uint8),
                           getattr(want, f).contiguous().view(torch.uint8)), f
    assert math.isfinite(got.dequantize().float().sum().item())


def test_block_as_a_list():
    x = torch.randn(4, 256)
    for _ in range(2):  # (the second call finds quantize's cached op)
        assert mxq.quantize(x, format="fp8_block", block=[128, 128]).block == (128, 128)
