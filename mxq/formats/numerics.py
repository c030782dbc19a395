"""MXFP8 number formats and E8M0 scale rules, written once in torch integer bit math.

Kept apart from the kernels (as torchao keeps ``mx_formats`` numerics apart) so the reference,
the tests and the code generator all read the same constants. Every function here is exact:
it only uses fp32 multiplies by powers of two, integer ops on fp32 bit patterns, and torch's
fp32 -> fp8 cast (RNE), which ``tests/test_numerics.py`` checks against an independent encoder.
The rules are those of ``docs/NUMERICS.md``; the comments name the step they implement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # elements per E8M0 scale, in both directions
E8M0_NAN = 255
E8M0_MAX_FINITE = 254


@dataclass(frozen=True)
class FP8Format:
    """Constants of one FP8 element format. ``rcp_bits`` is fp32(1/max) as a bit pattern."""

    name: str
    torch_dtype: torch.dtype
    max: float
    rcp_bits: int
    emax: int  # exponent of the largest power of two <= max (FLOOR / CEIL / EVEN rules)
    mbits: int  # mantissa bits (EVEN rule)

    @property
    def rcp(self) -> float:
        return _f32_from_bits(self.rcp_bits)


def _f32_from_bits(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


FORMATS = {
    "e4m3": FP8Format("e4m3", torch.float8_e4m3fn, 448.0, 0x3B124925, 8, 3),
    "e5m2": FP8Format("e5m2", torch.float8_e5m2, 57344.0, 0x37924925, 15, 2),
}
SCALE_MODES = ("rceil", "floor", "ceil", "even")
FP8_NAN_BYTE = 0x7F  # every NaN element is stored as this byte, whatever its sign


def f32_bits(t: torch.Tensor) -> torch.Tensor:
    """The int32 bit patterns of an fp32 tensor (a view, no copy)."""
    return t.contiguous().view(torch.int32)


def _exponent_field(bits: torch.Tensor) -> torch.Tensor:
    return (bits >> 23) & 0xFF


def e8m0_from_amax(amax: torch.Tensor, fmt: FP8Format, mode: str) -> torch.Tensor:
    """Step 7: the E8M0 scale byte of each block amax (fp32, >= 0 or NaN) as uint8."""
    amax = amax.to(torch.float32)
    nan = torch.isnan(amax)
    if mode == "rceil":
        p = amax * fmt.rcp  # fp32 multiply, round to nearest even
        b = f32_bits(p)
        e, m = _exponent_field(b), b & 0x7FFFFF
        round_up = (m > 0) & (e != 0xFE) & ~((e == 0) & (m <= 0x400000))
        out = e + round_up.to(torch.int32)
        out = torch.where(torch.isinf(p), E8M0_MAX_FINITE, out)
    elif mode in ("floor", "ceil", "even"):
        b = f32_bits(amax)
        if mode == "even":  # round the amax to the element format's mantissa width first
            b = (b + (1 << (23 - fmt.mbits - 1))) & 0x7F800000
        e = _exponent_field(b)
        if mode == "ceil":
            e = e + ((b & 0x7FFFFF) > 0).to(torch.int32)
        out = (e - fmt.emax).clamp(0, 255)
    else:
        raise ValueError(f"mxq: scale_mode must be one of {SCALE_MODES}, got {mode!r}")
    out = torch.where(nan, E8M0_NAN, out)
    return out.to(torch.uint8)


def e8m0_to_inv_scale(e: torch.Tensor) -> torch.Tensor:
    """Step 8: 2^(127-e) as fp32 built from bits; 254 -> 2^-127 (subnormal); 255 -> NaN."""
    e = e.to(torch.int32)
    bits = (254 - e) << 23
    bits = torch.where(e == E8M0_MAX_FINITE, 0x00400000, bits)
    bits = torch.where(e == E8M0_NAN, 0x7FC00000, bits)
    return bits.view(torch.float32)


def e8m0_to_scale(e: torch.Tensor) -> torch.Tensor:
    """The decoded scale 2^(e-127) as fp32 (0 -> 2^-127, 255 -> NaN); used by dequantize."""
    e = e.to(torch.int32)
    bits = torch.where(e == 0, 0x00400000, e << 23)
    bits = torch.where(e == E8M0_NAN, 0x7FC00000, bits)
    return bits.view(torch.float32)


def cast_to_fp8(y: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """Step 9: RNE, saturating to +-MAX (inf included), NaN -> 0x7F, -0 kept as 0x80.

    Clamping first makes torch's cast exact for every non-NaN fp32; NaN's sign is then cleared.
    """
    q = y.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype)
    qb = q.view(torch.uint8)
    qb = torch.where(torch.isnan(y), FP8_NAN_BYTE, qb.to(torch.int32)).to(torch.uint8)
    return qb.view(fmt.torch_dtype)


def quantize_blocks(v: torch.Tensor, fmt: FP8Format, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 6-9 along the last dim of a 2-D fp32 tensor: (fp8 data [M, N], scales [M, ceil(N/32)]).

    A partial last block is padded with zeros, which cannot change a max of absolute values
    that starts at 0; the padding never reaches the output. A NaN anywhere in a block makes
    its amax NaN (torch.amax propagates NaN), hence scale 255 and every byte 0x7F.
    """
    m, n = v.shape
    nb = -(-n // BLOCK)
    padded = torch.nn.functional.pad(v, (0, nb * BLOCK - n)) if nb * BLOCK != n else v
    blocks = padded.reshape(m, nb, BLOCK)
    if m * nb == 0:
        scales = torch.zeros((m, nb), dtype=torch.uint8, device=v.device)
    else:
        scales = e8m0_from_amax(blocks.abs().amax(dim=-1), fmt, mode)
    y = blocks * e8m0_to_inv_scale(scales).unsqueeze(-1)
    data = cast_to_fp8(y.reshape(m, nb * BLOCK)[:, :n], fmt)
    return data, scales


def dbias_partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of the kernels' dbias partial sums (one workspace row per 32-row block).

    16-bit inputs: each 32-row block is summed in fp32 (docs/NUMERICS.md's fp32 accumulation) and the
    blocks in fp64. Measured on the H200, this made dgelu+dbias 6-7 us faster at 8192^2 than fp64
    block sums (fewer registers: 5 CTAs per SM instead of 4; half the workspace bytes). Its error is at most 31 * 2^-24 * sum |v|, far
    inside the 1-ulp bf16/fp16 class unless a column's sum cancels to below ~2^-11 (bf16) or ~2^-8
    (fp16) of its sum of |v|. fp32 inputs keep fp64 block sums: their 1-ulp class is fp32's own.
    """
    return torch.float64 if dtype == torch.float32 else torch.float32
