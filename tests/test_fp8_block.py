"""FP8 block scaling (mxq/formats/fp8_block.py and the reference's fp8_block route): hand-made
vectors, and every block, scale mode, input dtype, element format and layout bit-exact against
the independent oracle (tests/oracle_fp8_block.py) on shapes with partial blocks."""

import math
import struct

import pytest
import torch

import mxq
from mxq.formats import fp8_block
from tests import oracle_fp8_block as oracle

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def fbits(t: torch.Tensor) -> list:
    return t.contiguous().view(torch.int32).reshape(-1).tolist()


def codes(t: torch.Tensor) -> list:
    return t.contiguous().view(torch.uint8).tolist()


# -- hand-made vectors -----------------------------------------------------------------------

@pytest.mark.parametrize("amax, fp8, mode, dtype, scale_bits", [
    (448.0, "e4m3", "pow2", torch.float32, 0x3F800000),  # 448 / 448 = 1
    (1.0, "e4m3", "pow2", torch.float32, 0x43800000),  # 448 -> 256
    (1.0, "e4m3", "fp32", torch.float32, 0x43E00000),  # 448
    (3.0, "e4m3", "fp32", torch.bfloat16, 0x43155555),  # fp32(448 / 3) = 149.33333
    (3.0, "e4m3", "pow2", torch.bfloat16, 0x43000000),  # 149.3 -> 128
    (1.0, "e5m2", "pow2", torch.float32, 0x47000000),  # 57344 -> 32768
    (1.0, "e5m2", "fp32", torch.float32, 0x47600000),  # 57344
    (0.0, "e4m3", "pow2", torch.float32, 0x3F800000),  # amax 0: scale 1
    (0.0, "e4m3", "fp32", torch.float16, 0x3F800000),
    (math.inf, "e4m3", "fp32", torch.float32, 0x3F800000),  # amax inf: scale 1
    (2.0 ** -140, "e4m3", "fp32", torch.float32, 0x7F7FFFFF),  # 448 * 2^140 overflows: fp32's max
    (2.0 ** -140, "e4m3", "fp32", torch.bfloat16, 0x7F7F0000),  # ... bf16's max
    (2.0 ** -140, "e4m3", "fp32", torch.float16, 0x477FE000),  # ... fp16's max, 65504
    (2.0 ** -140, "e4m3", "pow2", torch.float32, 0x7F000000),  # fp32's max rounded down: 2^127
    (448.0 * 2.0 ** 20, "e4m3", "pow2", torch.float32, 0x35800000),  # 2^-20
])
def test_scale_from_amax_hand_vectors(amax, fp8, mode, dtype, scale_bits):
    s = fp8_block.scale_from_amax(torch.tensor([amax]), fp8, mode, dtype)
    assert fbits(s) == [scale_bits]


def test_inverse_is_an_ieee_division():
    s = torch.tensor([1.0, 256.0, 2.0 ** 127, 448.0, 224.0])
    # 1/448 = 0x3B124925 (docs/NUMERICS.md's RCP), 1/224 one exponent up, 2^-127 subnormal
    assert fbits(fp8_block.inverse(s)) == [0x3F800000, 0x3B800000, 0x00400000, 0x3B124925, 0x3B924925]


@pytest.mark.parametrize("mode, scale_inv_bits, data", [
    # amax 2: pow2 scale 128 (1 -> 128 = 0x70, -2 -> -256 = 0xF8); fp32 scale 224 (224 = 0x76, -448 = 0xFE)
    ("pow2", 0x3C000000, [0x7F, 0x70, 0xF8, 0x00, 0x80]),
    ("fp32", 0x3B924925, [0x7F, 0x76, 0xFE, 0x00, 0x80]),
])
def test_block_hand_vectors(mode, scale_inv_bits, data):
    """NaN does not enter the amax and encodes as 0x7F; -0 stays 0x80."""
    t = mxq.quantize(torch.tensor([[math.nan, 1.0, -2.0, 0.0, -0.0]]), format="fp8_block", scale_mode=mode)
    assert fbits(t.rowwise_scale) == [scale_inv_bits]
    assert codes(t.rowwise_data)[0] == data


@pytest.mark.parametrize("fmt, amax_is_nan", [("mxfp8", True), ("fp8_block", True), ("mxfp4", True),
                                             ("nvfp4", False)])
def test_amax_keeps_nan_but_nvfp4s(fmt, amax_is_nan):
    """amax=True is NaN-propagating in every format but NVFP4 (docs/NUMERICS.md, amax and noop):
    FP8 block scaling's block scales drop the NaN, its tensor amax keeps it; NVFP4's global amax,
    which its scales are encoded by, drops it (3.0 here)."""
    x = torch.tensor([[1.0, math.nan, 3.0, -2.0] * 8])
    t = mxq.quantize(x, format=fmt, amax=True)
    assert math.isnan(t.amax.item()) if amax_is_nan else t.amax.item() == 3.0


def test_inf_block_takes_scale_one_and_saturates():
    t = mxq.quantize(torch.tensor([[math.inf, -math.inf, 1.0, 500.0]]), format="fp8_block")
    assert fbits(t.rowwise_scale) == [0x3F800000]
    assert codes(t.rowwise_data)[0] == [0x7E, 0xFE, 0x38, 0x7E]


def test_nan_only_block_has_scale_one():
    t = mxq.quantize(torch.full((1, 5), math.nan), format="fp8_block")
    assert fbits(t.rowwise_scale) == [0x3F800000]
    assert codes(t.rowwise_data)[0] == [0x7F] * 5


def test_blocks_are_128_wide_and_tiles_128_square():
    x = torch.ones(130, 260)
    x[0, 200] = 4.0  # row 0's block 1 (columns 128..255), tile (0, 1)
    row = mxq.quantize(x, format="fp8_block")
    assert row.rowwise_scale.shape == (130, 3)
    assert row.rowwise_scale[0].tolist() == [1 / 256, 1 / 64, 1 / 256]  # 448/4 = 112 -> 64
    assert row.rowwise_scale[1].tolist() == [1 / 256] * 3
    tile = mxq.quantize(x, format="fp8_block", block=(128, 128))
    assert tile.rowwise_scale.tolist() == [[1 / 256, 1 / 64, 1 / 256], [1 / 256] * 3]
    col = mxq.quantize(x, format="fp8_block", rowwise=False, colwise=True)
    assert col.colwise_scale.shape == (2, 260)
    assert col.colwise_scale[0, 200].item() == 1 / 64 and col.colwise_scale[1, 200].item() == 1 / 256


# -- against the oracle --------------------------------------------------------------------

def planted(m: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values over many binades per block, a zero block row, NaN, +-inf, -0 and fp32 subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-20, 20, (m, 1), generator=g).float())
    if m > 2:
        x[2] = 0.0
    if n > 3:
        x[0, 3] = -0.0
    if m * n > 40:
        x.view(-1)[17] = math.nan
        x.view(-1)[31] = math.inf
        x.view(-1)[39] = -math.inf
    if m > 1 and n > 1:
        x[1] = x[1] * 2.0 ** -140  # a row of tiny values (fp32 subnormals; zero or subnormal in 16-bit)
    return x.to(dtype)


def check_against_oracle(x, fp8, block, mode, layout):
    dtype = {v: k for k, v in DTYPES.items()}[x.dtype]
    t = mxq.quantize(x, format="fp8_block", block=block, fp8=fp8, scale_mode=mode, scale_layout=layout,
                     colwise=True)
    m, n = x.reshape(-1, x.shape[-1]).shape
    rows = x.reshape(m, n).float().tolist()
    want, want_s = oracle.quantize(rows, fp8, block, mode, dtype)
    assert codes(t.rowwise_data.reshape(m, n)) == want
    assert fbits(t.compact_scale("rowwise")) == [bits(s) for r in want_s for s in r]
    want_c, want_cs = oracle.quantize(rows, fp8, (block[1], block[0]), mode, dtype)
    col = t.colwise_data.t() if layout == "gemm" else t.colwise_data.reshape(m, n)
    assert codes(col) == want_c
    assert fbits(t.compact_scale("colwise")) == [bits(s) for r in want_cs for s in r]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", fp8_block.SCALE_MODES)
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("fp8", list(FP8))
def test_matches_oracle(dtype, mode, block, fp8):
    for i, (m, n) in enumerate([(1, 1), (1, 300), (3, 129), (130, 7)]):
        check_against_oracle(planted(m, n, DTYPES[dtype], i), fp8, block, mode, "compact")


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("shape", [(2, 3, 130), (129, 16), (1, 1)])
def test_gemm_layout_matches_oracle(block, shape):
    m = math.prod(shape[:-1])
    check_against_oracle(planted(m, shape[-1], torch.bfloat16, 7).reshape(shape), "e4m3", block, "pow2", "gemm")


def test_empty_and_zero_d_inputs():
    t = mxq.quantize(torch.empty(0, 300), format="fp8_block", colwise=True, scale_layout="gemm")
    assert t.rowwise_scale.shape == (0, 3) and t.colwise_data.shape == (300, 0)
    t = mxq.quantize(torch.tensor(3.0), format="fp8_block", block=(128, 128), colwise=True)
    assert t.rowwise_scale.shape == (1, 1) and t.dequantize().item() == 3.0


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("layout", fp8_block.LAYOUTS)
def test_dequantize_is_data_times_scale(block, layout):
    x = planted(130, 260, torch.float32, 3)
    x = torch.where(torch.isfinite(x), x, 0.0)
    t = mxq.quantize(x, format="fp8_block", block=block, scale_layout=layout, colwise=True, scale_mode="fp32")
    rows = t.rowwise_data.float().tolist()
    s = t.compact_scale("rowwise").tolist()
    want = [[oracle.round_f32(oracle.Fraction(rows[i][j]) * oracle.Fraction(s[i // block[0]][j // 128]))
             for j in range(260)] for i in range(130)]
    assert torch.equal(t.dequantize(), torch.tensor(want))
    if block == (128, 128):  # one scale per tile serves both directions
        assert torch.equal(t.dequantize("colwise"), t.dequantize("rowwise"))
