"""FP8 block scaling (TransformerEngine's Float8BlockScaling, DeepSeek-V3's recipe): the arithmetic,
written once in torch.

A block of 1x128 elements (activations, gradients) or 128x128 (weights) shares one fp32 scale
chosen from the block's amax as TransformerEngine's ``compute_scale_from_amax`` chooses it; the
steps are docs/NUMERICS.md's "FP8 block scaling" section, and each function names the step it
implements. Every operation here is exact or one IEEE fp32 rounding (the division, the multiply,
the reciprocal), so the reference is bit-exact on CPU and CUDA alike; tests/oracle_fp8_block.py
states the same steps a second time in plain Python.

Where the scale tensors live (compact and GEMM-ready layouts) is mxq/formats/fp8_block_layouts.py.
"""

from __future__ import annotations

import torch

from .numerics import FORMATS, cast_to_fp8

BLOCK = 128  # elements along a block's long side, both block shapes
SCALE_MODES = ("pow2", "fp32")  # pow2: TransformerEngine's default (power-of-two scales); fp32: the quotient as is
LAYOUTS = ("compact", "gemm")
_POW2_MASK = -8388608  # 0xFF800000 as int32: the sign and exponent bits of an fp32


def block_amax(v: torch.Tensor, block: tuple) -> torch.Tensor:
    """Step 1: max |v| over each (rows, cols) block of the fp32 [M, N] tensor ``v``, as an fp32
    [ceil(M/rows), ceil(N/cols)] tensor. NaN elements do not enter it (TE's fmaxf drops them); a
    partial block at an edge takes the elements it has (the zero padding cannot raise a max of
    magnitudes that starts at 0); a block of NaN alone has amax 0."""
    m, n = v.shape
    br, bc = block
    mb, nb = -(-m // br), -(-n // bc)
    if mb * nb == 0:
        return torch.zeros((mb, nb), dtype=torch.float32, device=v.device)
    mag = torch.where(torch.isnan(v), 0.0, v.abs())
    mag = torch.nn.functional.pad(mag, (0, nb * bc - n, 0, mb * br - m))
    return mag.reshape(mb, br, nb, bc).amax(dim=(1, 3))


def scale_from_amax(amax: torch.Tensor, fp8: str, mode: str, input_dtype: torch.dtype) -> torch.Tensor:
    """Steps 2-4: the quantization multiplier of each block amax (fp32, >= 0, no NaN).

    amax 0 or inf: 1. Else the IEEE fp32 quotient FP8_MAX / amax; an infinite quotient (an amax
    below FP8_MAX / FLT_MAX) becomes ``input_dtype``'s largest finite value; ``pow2`` keeps only
    its sign and exponent bits (rounds it down to a power of two)."""
    if mode not in SCALE_MODES:
        raise ValueError(f"mxq: scale_mode must be one of {SCALE_MODES} for fp8_block, got {mode!r}")
    fmax = torch.tensor(FORMATS[fp8].max, dtype=torch.float32, device=amax.device)
    q = fmax / amax  # one IEEE division, round to nearest even
    q = torch.where(torch.isinf(q), torch.finfo(input_dtype).max, q)
    if mode == "pow2":
        q = (q.view(torch.int32) & _POW2_MASK).view(torch.float32)
    return torch.where((amax == 0) | torch.isinf(amax), 1.0, q)


def inverse(scale: torch.Tensor) -> torch.Tensor:
    """Step 6: the stored dequantization multiplier, 1 / scale as one IEEE fp32 division (exact for
    power-of-two scales; 2^127 gives the subnormal 2^-127)."""
    return torch.ones((), dtype=torch.float32, device=scale.device) / scale


def expand(blocks: torch.Tensor, block: tuple, m: int, n: int) -> torch.Tensor:
    """A per-block [mb, nb] tensor spread over the [m, n] elements its blocks cover."""
    br, bc = block
    mb, nb = blocks.shape
    return blocks[:, None, :, None].expand(mb, br, nb, bc).reshape(mb * br, nb * bc)[:m, :n]


def quantize(v: torch.Tensor, fp8: str, block: tuple, mode: str,
             input_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-6 over (rows, cols) blocks of the fp32 [M, N] tensor ``v``: (FP8 data [M, N], fp32
    dequantization scales [ceil(M/rows), ceil(N/cols)]). ``block`` is (1, 128) for rowwise 1x128
    blocks, (128, 1) for the colwise ones, (128, 128) for tiles; ``input_dtype`` is the op's input
    dtype (step 3)."""
    m, n = v.shape
    scale = scale_from_amax(block_amax(v, block), fp8, mode, input_dtype)
    data = cast_to_fp8(v * expand(scale, block, m, n), FORMATS[fp8])  # step 5: satfinite_rn(v * scale)
    return data, inverse(scale)


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor, block: tuple) -> torch.Tensor:
    """FP8 data [M, N] times its blocks' fp32 dequantization scales [ceil(M/rows), ceil(N/cols)],
    in fp32 (one rounding per element; exact for pow2 scales unless the product underflows)."""
    m, n = data.shape
    return data.to(torch.float32) * expand(scale_inv, block, m, n)


__all__ = ["BLOCK", "LAYOUTS", "SCALE_MODES", "block_amax", "dequantize", "expand", "inverse", "quantize",
           "scale_from_amax"]
