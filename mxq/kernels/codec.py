"""A Format's device side: the scale rule, the element encoding and where a scale byte goes.

The kernels call these with their config's ``Format`` (mxq/formats/format.py) and branch on it
only through ``cutlass.const_expr`` (plain Python at trace time): a new format is a new case
here, not a new branch in every kernel. MXFP8 (E8M0 scales, FP8 elements) and FP8 block
scaling (fp32 scales by TransformerEngine's rule, ``fmt.scale == "fp32"``: 1x128 rowwise blocks,
colwise 128-row blocks and 128x128 tiles in the packed kernel's 128-row tile, compact or
GEMM-ready) and MXFP4's rowwise blocks (E8M0 scales, E2M1 elements two per byte: ``encode8``;
the aligned kernels only) are implemented: device.py holds their exact arithmetic.

A block's scale ``e`` (block_scale) is what the format computes once per block: an E8M0 byte
(Int32) for MXFP8 and MXFP4, an E4M3 byte (Int32) for NVFP4, the fp32 quantization multiplier
for FP8 block scaling. ``multiplier`` is what
the block's values are multiplied by before encoding, ``store_row_scale`` what is stored (the
byte; the dequantization multiplier 1 / e).
"""

from __future__ import annotations

import torch
import cutlass
from cutlass import Float32, Uint8

from . import device as dev
from . import grouped


# --- the scale rule and the element encoding ----------------------------------------------------
# the torch dtype of each cutlass input element type
_TORCH_DTYPES = {"BFloat16": torch.bfloat16, "Float16": torch.float16, "Float32": torch.float32}


def input_max(element_type) -> float:
    """The largest finite value of a cutlass input element type (FP8 block scaling's value for an
    infinite quotient, torch.finfo's, as mxq/formats/fp8_block.scale_from_amax takes it)."""
    return torch.finfo(_TORCH_DTYPES[element_type.__name__]).max


def global_scales(fmt, amax, colwise: bool = False, glob=None):
    """A format's per-tensor values, read once per thread from the amax tensor ``amax`` (NVFP4:
    the amax pass's result or the caller's global_amax; device.nvfp4_global), or None. The
    ``colwise`` copy of NVFP4 with the Hadamard transform has its own amax, entry 1. ``glob``:
    the values already computed (shared_global_scales), returned as they are."""
    if not fmt.global_scale:
        return None
    if glob is not None:
        return glob
    return dev.nvfp4_global(amax[1 if colwise and fmt.hadamard else 0])


def shared_global_scales(cfg) -> bool:
    """Whether the packed kernel computes global_scales once for both copies: NVFP4 (1x16 blocks)
    writing both, the same amax entry for each (no Hadamard transform). Else each copy's scale
    phase reads the amax itself: the colwise one after a barrier, which keeps the compiler from
    reusing the rowwise read (a second load and two more IEEE divisions a thread)."""
    fmt = cfg.fmt
    return bool(fmt.global_scale and cfg.rowwise and cfg.colwise and not fmt.hadamard and not cfg.fp4_tiles)


def block_scale(fmt, amax, use_hw_e8m0: bool, in_max: float | None = None, glob=None):
    """The scale of a block with magnitude maximum ``amax``: an E8M0 byte as Int32, or (fp32
    scales: amax >= 0 without NaN, ``in_max`` the input type's largest finite value, required)
    the fp32 quantization multiplier, or (NVFP4: amax >= 0 without NaN, ``glob`` its
    global_scales) an E4M3 byte as Int32."""
    if fmt.global_scale:
        return dev.nvfp4_scale(amax, glob[0])
    if fmt.scale == "fp32":
        if in_max is None:  # (an infinite quotient becomes in_max: no default may stand in for it)
            raise TypeError("mxq: codec.block_scale of fp32 scales needs in_max (codec.input_max)")
        return dev.te_scale(amax, fmt.elem.max, in_max, fmt.rule == "pow2")
    return dev.e8m0_scale(amax, fmt.element, fmt.rule, use_hw_e8m0)


def multiplier(fmt, e, glob=None):
    """What a block's values are multiplied by before encoding, from its scale ``e`` (NVFP4:
    and its global_scales ``glob``)."""
    if fmt.global_scale:
        return dev.nvfp4_multiplier(e, glob[1])
    if fmt.scale == "fp32":
        return e
    return dev.inv_scale(e)


def block_amax_nan(fmt) -> bool:
    """Whether a NaN element makes its block's amax NaN (MXFP8, MXFP4) or is left out of it (FP8
    block scaling and NVFP4, TransformerEngine's fmaxf; a block of NaN alone has amax 0)."""
    return fmt.scale == "e8m0"


def amax_nan(fmt) -> bool:
    """Whether a NaN element makes the tensor amax NaN (mxq's amax output) or is left out of it
    (NVFP4's per-tensor amax, TransformerEngine's CUDA)."""
    return not fmt.global_scale


def column_max_nan(cfg) -> bool:
    """Whether the packed kernel's column maxima propagate NaN: yes for MXFP8's colwise scales and
    for the tensor amax; no where they make FP8 block scaling's colwise or 128x128 tile scales
    (which then cannot also give the amax: amax_by_owners), nor for NVFP4's amax."""
    return block_amax_nan(cfg.fmt) or (amax_nan(cfg.fmt) and not (cfg.colwise or cfg.tiles))


def block_lanes(fmt, vec: int) -> int:
    """Lanes that share a rowwise block when each lane holds ``vec`` adjacent columns."""
    return fmt.block[1] // vec


def encode1(fmt, q):
    """One scaled value as an element byte."""
    return dev.to_fp8(q, fmt.element)


def encode2(fmt, lo, hi):
    """Two scaled values in one conversion: (byte of lo, byte of hi)."""
    return dev.to_fp8x2(lo, hi, fmt.element)


def encode2_word(fmt, lo, hi):
    """Two scaled values as one 16-bit word of element bytes (lo in the low byte)."""
    return dev.to_fp8x2_word(lo, hi, fmt.element)


def encode4(fmt, a, b, c, d):
    """Four scaled values as one word of element bytes (a in the lowest byte)."""
    return dev.fp8x4(a, b, c, d, fmt.element)


def encode8(fmt, vals, use_hw: bool, rand=None, prescaled: bool = False):
    """Eight scaled values as one word of 4-bit element codes (E2M1, two per byte: value k in
    bits 4k..4k+3); ``use_hw``: sm_100a's conversion, else the integer encode (device.e2m1x8);
    stochastic rounding (``fmt.rounding``, ``rand`` its two random words): the rule on fp16 pairs
    on every arch (device.e2m1x8_sr; ``prescaled``: the values already times 2^-14; sm_100a's
    cvt.rs is not yet checked against it)."""
    if fmt.rounding == "sr":
        return dev.e2m1x8_sr(vals, rand, prescaled=prescaled)
    return dev.e2m1x8(vals, use_hw)


def pow2_bf16_pairs(fmt, is_bf16: bool, use_hw: bool) -> bool:
    """E2M1 from bf16 words scaled in bf16 (device.e2m1x8_bf16): MXFP4 rounding to nearest on
    bf16 input without sm_100a's conversion (an E8M0 inverse scale is a power of two, so the
    bf16 products are exact)."""
    return fmt.packed and fmt.scale == "e8m0" and fmt.rounding == "rn" and is_bf16 and not use_hw


def encode8_words(fmt, words, mult, is_bf16: bool, use_hw: bool, rand=None, prescaled: bool = False):
    """Eight values held as four words of two 16-bit inputs (element 2j in word j's low half),
    times ``mult`` (fp32), as encode8's word: bf16 pairs scaled in bf16 where pow2_bf16_pairs
    allows, else unpacked and scaled in fp32 (``prescaled``: encode8's)."""
    if pow2_bf16_pairs(fmt, is_bf16, use_hw):
        return dev.e2m1x8_bf16(words, mult)
    vals = []
    for w in words:
        lo, hi = dev.pk_unpack(w, is_bf16)
        vals += [dev.mul_rn(lo, mult), dev.mul_rn(hi, mult)]
    return encode8(fmt, vals, use_hw, rand, prescaled)


def data_cols(fmt, n: int) -> int:
    """Bytes of ``n`` adjacent elements (``n`` a multiple of the elements per byte)."""
    return n // fmt.elem.per_byte


def dequantization_scale(e):
    """The stored fp32 scale of a block whose quantization multiplier is ``e``: 1 / e as one IEEE
    division (exact for pow2 scales; 2^127 gives the subnormal 2^-127), fp8_block.inverse's."""
    return dev.div_rn(Float32(1.0), e)


# --- where scale bytes go (compact or swizzled; a grouped call's per-group blocks) ---------------
def store_row_scale(cfg, row_scale, offset, e):
    """A row scale: the E8M0 byte (KernelConfig.row_scale_l2_keep: with an L2 evict_last policy),
    or the fp32 dequantization multiplier 1 / e (one IEEE division: exact for pow2 scales)."""
    if cfg.fmt.scale == "fp32":
        row_scale[offset] = dequantization_scale(e)
    else:
        dev.store_row_scale(row_scale, offset, e, cfg.row_scale_l2_keep)


def row_scale_offset(fmt, r, blk, nbr, M=None):
    """Offset of row r's scale of block blk in rowwise scales of nbr blocks per row (of M rows:
    the GEMM-ready layout's outer-dim-major buffer, mxq/formats/fp8_block_layouts.gemm_scale,
    holds block blk's scales of every row at blk * roundup(M, 4))."""
    if fmt.layout == "gemm":
        return blk * ((M + 3) // 4 * 4) + r
    return dev.scale_offset(fmt.swizzled, r, blk, nbr)


def group_row_scale_offset(fmt, gt, r, blk, nbr):
    """Offset of row r's scale byte of block blk in a grouped call's rowwise scales: compact
    scales do not depend on the groups; swizzled ones are blocked per group (grouped.py)."""
    if fmt.swizzled:
        return grouped.row_swizzled_offset(gt.row_sw, r - gt.row0, blk)
    return r * nbr + blk


def group_col_scale_offset(gt, c):
    """Offset of column c's scale byte of a grouped tile in the swizzled colwise scales."""
    return grouped.col_swizzled_offset(gt.col_sw, gt.col_t512, c)


def col_scale_row(fmt, NOUT):
    """Elements between two 128-row block rows of FP8 block scaling's colwise scales: N (compact,
    [ceil(M/128), N]) or roundup(N, 4) (GEMM-ready: the transposed copy's 1x128 scales are
    outer-dim-major, mxq/formats/fp8_block_layouts.gemm_scale)."""
    if fmt.layout == "gemm":
        return (NOUT + 3) // 4 * 4
    return NOUT


def tile_scale_offset(fmt, rb, blk, mb, nb, colwise: bool):
    """Offset of 128x128 tile (rb, blk)'s scale in a [mb, nb] tile grid: compact, both directions
    row-major (the same bytes); GEMM-ready, padded to rows of roundup(nb, 4) (rowwise) or, for
    the transposed copy's [nb, mb] grid, roundup(mb, 4) (mxq/formats/fp8_block_layouts.gemm_scale)."""
    if fmt.layout != "gemm":
        return rb * nb + blk
    if colwise:
        return blk * ((mb + 3) // 4 * 4) + rb
    return rb * ((nb + 3) // 4 * 4) + blk


def amax_by_owners(cfg) -> bool:
    """Whether the packed kernel's column owners give the tensor amax from the column maxima
    (which then propagate NaN, column_max_nan, or drop it as NVFP4's amax does); else (FP8 block
    scaling's colwise scales drop NaN) each thread keeps a NaN-propagating maximum of its own
    values beside them."""
    return column_max_nan(cfg) == amax_nan(cfg.fmt)


def col_scale_offset(fmt, gt, c, rb, M, NOUT):
    """Offset of column c's scale of row tile rb (``gt``: a grouped call's GroupTile, else None)."""
    if fmt.scale == "fp32":
        return col_scale_row(fmt, NOUT) * rb + c
    if gt is not None and fmt.swizzled:
        return group_col_scale_offset(gt, c)
    if fmt.swizzled:
        return dev.swizzle_offset(c, rb, (M + 31) // 32)
    return rb * NOUT + c


def put_col_scale(fmt, col_scale, gt, c, rb, M, NOUT, e, empty=None):
    """Column c's scale byte of row tile rb (col_scale_offset); fp32 scales (FP8 block scaling):
    the dequantization multiplier 1 / e, or 0.0 where ``empty`` (a grouped tile with no rows;
    None: ungrouped)."""
    if fmt.scale == "fp32":
        d = dequantization_scale(e)
        if empty is not None:
            d = Float32(cutlass.select_(empty, Float32(0.0), d))
        col_scale[col_scale_offset(fmt, gt, c, rb, M, NOUT)] = d
    else:
        col_scale[col_scale_offset(fmt, gt, c, rb, M, NOUT)] = Uint8(e)


def put_empty_col_scale(fmt, col_scale, gt, c, rb, M, NOUT):
    """Column c's scale of a grouped row tile with no rows: 0.0 (fp32 scales) or byte 0."""
    col_scale[col_scale_offset(fmt, gt, c, rb, M, NOUT)] = Float32(0.0) if fmt.scale == "fp32" else Uint8(0)

