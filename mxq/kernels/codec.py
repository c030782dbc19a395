"""A Format's device side: the scale rule, the element encoding and where a scale byte goes.

The kernels call these with their config's ``Format`` (mxq/formats/format.py) and branch on it
only through ``cutlass.const_expr`` (plain Python at trace time): a new format is a new case
here, not a new branch in every kernel. MXFP8 (E8M0 scales, FP8 elements) is the one
implemented: device.py holds its exact arithmetic.
"""

from __future__ import annotations

from cutlass import Uint8

from . import device as dev
from . import grouped


# --- the scale rule and the element encoding ----------------------------------------------------
def block_scale(fmt, amax, use_hw_e8m0: bool):
    """The scale (an E8M0 byte as Int32) of a block with magnitude maximum ``amax``."""
    return dev.e8m0_scale(amax, fmt.element, fmt.rule, use_hw_e8m0)


def encode1(fmt, q):
    """One scaled value as an element byte."""
    return dev.to_fp8(q, fmt.element)


def encode2(fmt, lo, hi):
    """Two scaled values in one conversion: (byte of lo, byte of hi)."""
    return dev.to_fp8x2(lo, hi, fmt.element)


def encode4(fmt, a, b, c, d):
    """Four scaled values as one word of element bytes (a in the lowest byte)."""
    return dev.fp8x4(a, b, c, d, fmt.element)


# --- where scale bytes go (compact or swizzled; a grouped call's per-group blocks) ---------------
def store_row_scale(cfg, row_scale, offset, e):
    """A row-scale byte (KernelConfig.row_scale_l2_keep: with an L2 evict_last policy)."""
    dev.store_row_scale(row_scale, offset, e, cfg.row_scale_l2_keep)


def row_scale_offset(fmt, r, blk, nbr):
    """Offset of row r's scale of block blk in rowwise scales of nbr blocks per row."""
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


def put_col_scale(fmt, col_scale, gt, c, rb, M, NOUT, e):
    """Column c's scale byte of row tile rb (``gt``: a grouped call's GroupTile, else None)."""
    if gt is not None and fmt.swizzled:
        col_scale[group_col_scale_offset(gt, c)] = Uint8(e)
    elif gt is None and fmt.swizzled:
        col_scale[dev.swizzle_offset(c, rb, (M + 31) // 32)] = Uint8(e)
    else:
        col_scale[rb * NOUT + c] = Uint8(e)

