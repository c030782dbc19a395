"""Scale rules and the FP8 cast: hand-made byte vectors, and sweeps against tests/oracle.py."""

import math

import pytest
import torch

from mxq.formats import numerics
from mxq.formats.numerics import FORMATS, cast_to_fp8, e8m0_from_amax, e8m0_to_inv_scale, quantize_blocks

from . import oracle

INF, NAN = float("inf"), float("nan")


def block(*head, fill=0.0):
    return torch.tensor([list(head) + [fill] * (32 - len(head))], dtype=torch.float32)


def q(values, fmt="e4m3", mode="rceil"):
    data, scale = quantize_blocks(values, FORMATS[fmt], mode)
    return data.view(torch.uint8)[0].tolist(), scale[0].tolist()


# (format, mode, block head, expected scale byte, expected leading data bytes) -- worked by hand:
# e.g. 448 * fp32(1/448) == 1.0 exactly, so RCEIL gives 2^0 and 448 -> 0x7E; CEIL rounds 448's
# mantissa up to 2^9 -> scale 128 and 448/2 = 224 -> 0x76; 1.0 / 2^-8 = 256 -> 0x78.
HAND = [
    ("e4m3", "rceil", [448.0, 1.0, -1.0, 0.0, -0.0], 127, [0x7E, 0x38, 0xB8, 0x00, 0x80]),
    ("e4m3", "floor", [448.0, 1.0, -1.0, 0.0, -0.0], 127, [0x7E, 0x38, 0xB8, 0x00, 0x80]),
    ("e4m3", "ceil", [448.0, 1.0, -1.0, 0.0, -0.0], 128, [0x76, 0x30, 0xB0, 0x00, 0x80]),
    ("e4m3", "even", [448.0, 1.0, -1.0], 127, [0x7E, 0x38, 0xB8]),
    ("e4m3", "rceil", [449.0], 128, [0x76]),           # 224.5 -> 224 (RNE)
    ("e4m3", "floor", [449.0], 127, [0x7E]),           # saturates to 448
    ("e4m3", "floor", [510.0], 127, [0x7E]),           # FLOOR saturates [1.75, 2) * 2^8
    ("e4m3", "rceil", [510.0], 128, [0x78]),           # 255 -> 256
    ("e4m3", "even", [510.0], 128, [0x78]),            # 510 rounds to 512 before the floor
    ("e4m3", "rceil", [512.0, 1.0], 128, [0x78, 0x30]),
    ("e4m3", "rceil", [1.0] * 32, 119, [0x78] * 32),
    ("e5m2", "rceil", [1.0], 112, [0x78]),
    ("e5m2", "floor", [1.0, -2.0], 113, [0x74, 0xF8]),  # amax 2 -> 2^(1-15); 1 -> 2^14 = 0x74
    ("e5m2", "rceil", [57344.0, 1.0], 127, [0x7B, 0x3C]),
    ("e4m3", "rceil", [448.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10], 127, [0x7E, 0x01, 0x00, 0x02]),
    ("e4m3", "rceil", [NAN, 1.0, -1.0, INF], 255, [0x7F] * 4),
    ("e5m2", "floor", [1.0, -NAN, -3.0], 255, [0x7F] * 3),
    ("e4m3", "rceil", [INF, -INF, 1.0, -1.0], 254, [0x7E, 0xFE, 0x00, 0x80]),
    ("e4m3", "floor", [INF, -INF, 1.0, -1.0], 247, [0x7E, 0xFE, 0x00, 0x80]),
    ("e5m2", "floor", [INF, 1.0], 240, [0x7B, 0x00]),
    ("e4m3", "ceil", [INF, 1.0], 247, [0x7E, 0x00]),
    ("e4m3", "rceil", [0.0, -0.0], 0, [0x00, 0x80]),
    ("e4m3", "floor", [0.0, -0.0], 0, [0x00, 0x80]),
    ("e4m3", "rceil", [2.0 ** -130], 0, [0x20]),       # fp32 subnormal amax: scale 2^-127 -> 2^-3
    ("e4m3", "floor", [2.0 ** -130, -(2.0 ** -130)], 0, [0x20, 0xA0]),
]


@pytest.mark.parametrize("fmt,mode,head,scale,data", HAND)
def test_hand_vectors(fmt, mode, head, scale, data):
    got_data, got_scale = q(block(*head), fmt, mode)
    assert got_scale == [scale]
    assert got_data[: len(data)] == data
    assert all(b in (0x00, 0x7F) for b in got_data[len(data):]) or scale == 255


def test_constants():
    for fmt in FORMATS.values():
        assert fmt.rcp == pytest.approx(1 / fmt.max, rel=1e-7)
        assert torch.tensor(fmt.max).to(fmt.torch_dtype).item() == fmt.max
    assert numerics.FP8_NAN_BYTE == 0x7F


def _sweep_values():
    """Every FP8 value of both formats, the midpoints between neighbours, +-1 fp32 ulp around
    them, signed, plus specials and fp32 subnormals."""
    vals = set()
    for fmt in oracle.FMT:
        table = oracle._table(fmt)
        for a, b in zip(table, table[1:]):
            for v in (float(a), float((a + b) / 2)):
                f = oracle.f32(v)
                for d in (-1, 0, 1):
                    vals.add(oracle.from_bits(oracle.bits(f) + d) if f > 0 else f)
    vals |= {1e-45, 1e-40, 3e-39, 6e-5, 448.5, 449.0, 464.0, 465.0, 1e6, 57344.0, 61440.0, 61441.0,
             3.4e38, INF}
    out = sorted(v for v in vals if v >= 0)
    return out + [-v for v in out] + [NAN]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_matches_independent_encoder(fmt):
    vals = _sweep_values()
    got = cast_to_fp8(torch.tensor(vals, dtype=torch.float32), FORMATS[fmt]).view(torch.uint8).tolist()
    want = [oracle.encode(v, fmt) for v in vals]
    bad = [(v, g, w) for v, g, w in zip(vals, got, want) if g != w]
    assert not bad, bad[:10]


def _amax_sweep():
    g = torch.Generator().manual_seed(1)
    rand_bits = torch.randint(0, 0x7F800000, (4000,), generator=g, dtype=torch.int32)
    edges = []
    for fmt in FORMATS.values():  # around the RCEIL and power-of-two boundaries
        for k in range(-140, 129, 3):
            base = oracle.f32(fmt.max * 2.0 ** k) if abs(k) < 120 else 2.0 ** k
            for d in (-2, -1, 0, 1, 2):
                edges.append(oracle.from_bits(max(0, oracle.bits(oracle.f32(base)) + d)))
    vals = rand_bits.view(torch.float32).tolist() + edges + [0.0, INF, NAN, 1e-45, 2.0 ** -127, 2.0 ** -126]
    return [v for v in vals if not math.isinf(v) or v > 0]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", numerics.SCALE_MODES)
def test_scale_rule_matches_independent_rule(fmt, mode):
    vals = _amax_sweep()
    got = e8m0_from_amax(torch.tensor(vals, dtype=torch.float32), FORMATS[fmt], mode).tolist()
    want = [oracle.scale_byte(v, fmt, mode) for v in vals]
    bad = [(v, g, w) for v, g, w in zip(vals, got, want) if g != w]
    assert not bad, bad[:10]


def test_inv_scale_bits():
    e = torch.arange(256, dtype=torch.uint8)
    got = e8m0_to_inv_scale(e).view(torch.int32).tolist()
    for i, b in enumerate(got):
        want = oracle.inv_scale(i)
        if i == 255:
            assert math.isnan(oracle.from_bits(b))
        else:
            assert b == oracle.bits(want), i
    assert got[254] == 0x00400000 and got[253] == 1 << 23 and got[127] == 127 << 23


def test_rceil_never_saturates_and_scales_cover_amax():
    """RCEIL picks the smallest power of two with amax * s_inv <= MAX: the max element lands in
    (MAX/2, MAX] unless clamped at the ends of the E8M0 range."""
    fmt = FORMATS["e4m3"]
    amax = torch.logspace(-30, 30, 2001, dtype=torch.float32)
    e = e8m0_from_amax(amax, fmt, "rceil")
    y = amax * e8m0_to_inv_scale(e)
    assert torch.all(y <= fmt.max)
    assert torch.all(y > fmt.max / 2 * (1 - 1e-6))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_nan_encodes_as_0x7f_whatever_its_sign(fmt):
    from mxq.formats.numerics import FORMATS, cast_to_fp8

    bits = torch.tensor([0x7FC00000, -0x400000, 0x7F800001, -0x7FFFFF, -1], dtype=torch.int32)  # +-qNaN, +-sNaN
    y = bits.view(torch.float32)
    assert torch.isnan(y).all()
    assert cast_to_fp8(y, FORMATS[fmt]).view(torch.uint8).tolist() == [0x7F] * 5
