"""Where NVFP4's and MXFP4's outputs live (docs/NUMERICS.md, "NVFP4 and MXFP4", draws them).

For an input read as [M, N] (mxq/tensor.py ``flat_dims``), B = 16 (NVFP4) or 32 (MXFP4):

- rowwise data: uint8 ``(*shape[:-1], N/2)``, E2M1 codes two per byte (element 2j in the low
  nibble); rowwise scales [M, ceil(N/B)] (compact).
- colwise data: the transposed copy, uint8 [N, M/2] (FP4 GEMMs take only the TN layout); its
  scales are the rowwise scales of that copy, [N, ceil(M/B)].
- ``swizzled`` scales: cuBLAS/CUTLASS's 128x4 atoms over those [rows, blocks] grids
  (mxq/formats/layouts.py ``swizzle``, the same atom as MXFP8's with B-element blocks), zero
  padded to [roundup(rows, 128), roundup(blocks, 4)].
- scales are torch.float8_e4m3fn (NVFP4) or uint8 E8M0 bytes (MXFP4); NVFP4 results also hold
  the per-tensor fp32 amax (``amax``, and with the Hadamard transform the colwise copy's own,
  ``colwise_amax``).
- grouped (``group_offsets``, G groups; compact scales): group g is its rows [start_g, end_g)
  quantized alone. Rowwise data and scales are its rows; the colwise copy's bytes are columns
  [start_g / 2, end_g / 2) of [N, M/2] (every end even: a byte packs rows 2j and 2j + 1) and its
  ceil(m_g / B) colwise blocks columns start_g // B + g onwards of a zeroed [N, M // B + G]
  buffer (the transposed placement of MXFP8's grouped colwise rows, mxq/formats/groups.py);
  NVFP4's amax is per group, [G].

FP4 data is always contiguous.
"""

from __future__ import annotations

import math

import torch

from ..frontend import ir
from . import groups, layouts
from .fp4 import BLOCKS


def scale_dtype(fmt: str) -> torch.dtype:
    return torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8


def scale_grid(rows: int, cols: int, fmt: str) -> tuple[int, int]:
    """The compact scale shape of a [rows, cols] operand quantized along ``cols``."""
    return rows, layouts.cdiv(cols, BLOCKS[fmt])


def scale_shape(rows: int, cols: int, fmt: str, layout: str) -> tuple[int, int]:
    r, b = scale_grid(rows, cols, fmt)
    return (r, b) if layout == "compact" else (layouts.roundup(r, 128), layouts.roundup(b, 4))


def data_shape(shape) -> tuple:
    """The rowwise data's shape for a logical ``shape`` (its last dim halved)."""
    return (*shape[:-1], shape[-1] // 2)


def packed_gap(spec, shape) -> str | None:
    """Why outputs of ``shape`` cannot be packed two E2M1 elements per byte, or None: N (the last
    dimension; a 0-d tensor's 1) must be even, and M (the product of the others) too with the
    colwise copy [N, M/2] (validation.check_fp4 and MXFP8Tensor.empty raise it)."""
    m, n = (1, 1) if len(shape) == 0 else (math.prod(shape[:-1]), shape[-1])
    what = f"format={spec.format!r} packs two E2M1 elements per byte"
    if n % 2:
        return f"{what} along the last dimension, which must be even; got output shape {tuple(shape)}"
    if spec.colwise and m % 2:
        return (f"{what}; its colwise copy [N, M/2] packs along the rows, whose count M (the product of the leading "
                f"dimensions) must be even; got output shape {tuple(shape)}")
    return None


def grouped_gap(spec) -> str | None:
    """What of an NVFP4 / MXFP4 op its grouped outputs cannot be, or None: compact scales only,
    no Hadamard transform, stochastic rounding or 16x16 tiles (validation.check_fp4_groups and
    MXFP8Tensor.empty say it after the option's name)."""
    if spec.scale_layout != "compact":
        return (f"takes scale_layout='compact' (each group's colwise blocks in the [N, M // {BLOCKS[spec.format]} + "
                f"G] buffer); got {spec.scale_layout!r}")
    flag = next((f for f in ("hadamard", "stochastic_rounding", "block_2d") if getattr(spec, f)), None)
    return f"does not go with {flag}=True yet" if flag else None


def group_bounds(offsets, colwise: bool, m: int | None = None) -> list[tuple[int, int]]:
    """(start, end) of every group on the host (groups.bounds), every end even where the op
    writes the colwise copy (a ValueError naming group_offsets otherwise). ``m``: the rows; each
    end is then clamped to [0, m] and each start to at most its end, as the kernels clamp offsets
    they cannot validate (CUDA offsets are not checked: bad ones give unspecified bytes, never
    an error past these checks or an access outside the buffers)."""
    bnds = groups.bounds(offsets)
    if m is not None:
        ends = [min(max(e, 0), m) for _, e in bnds]
        bnds = [(min(ends[g - 1] if g else 0, e), e) for g, e in enumerate(ends)]
    odd = next(((g, e) for g, (_, e) in enumerate(bnds) if e % 2), None) if colwise else None
    if odd is not None:
        raise ValueError(f"mxq: argument 'group_offsets': FP4's colwise copy [N, M/2] packs rows 2j and 2j + 1 "
                         f"in one byte, so every group must end on an even row; group {odd[0]} ends at {odd[1]}")
    return bnds


def grouped_colwise_blocks(m: int, g: int, fmt: str) -> int:
    """Columns of a grouped colwise scale buffer [N, M // B + G] (groups.grouped_colwise_rows
    with B-row blocks)."""
    return groups.grouped_colwise_rows(m, g, BLOCKS[fmt])


def first_colwise_block(g: int, start: int, fmt: str) -> int:
    """The column of group g's first colwise block in the grouped buffer."""
    return groups.first_block_row(g, start, BLOCKS[fmt])


def outputs(spec, shape, m: int, n: int, device, zeroed: bool, groups_count: int | None = None) -> dict:
    """The FP4 output tensors of ``spec`` for a logical ``shape`` read as [m, n] (MXFP8Tensor
    fields by name; absent ones None; ``amax`` only with the Hadamard transform: it and
    ``colwise_amax`` are the two entries of one zeroed fp32[2], amax_pair; grouped, NVFP4's
    per-group [G]). Swizzled scales start zeroed, the rest too when ``zeroed``; grouped
    (``groups_count`` G), the colwise scales are the zeroed [N, M // B + G] buffer."""
    alloc = torch.zeros if zeroed else torch.empty
    scale_alloc = torch.zeros if zeroed or spec.scale_layout == "swizzled" else torch.empty
    sdt = scale_dtype(spec.format)
    out = dict.fromkeys(("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "colwise_amax"))
    if spec.rowwise:
        out["rowwise_data"] = alloc(data_shape(shape), dtype=torch.uint8, device=device)
        out["rowwise_scale"] = scale_alloc(scale_shape(m, n, spec.format, spec.scale_layout), dtype=sdt,
                                           device=device)
    if spec.colwise:
        out["colwise_data"] = alloc((n, m // 2), dtype=torch.uint8, device=device)
        if groups_count is None:
            out["colwise_scale"] = scale_alloc(scale_shape(n, m, spec.format, spec.scale_layout), dtype=sdt,
                                               device=device)
        else:  # (rows between groups' blocks stay 0)
            out["colwise_scale"] = torch.zeros((n, grouped_colwise_blocks(m, groups_count, spec.format)), dtype=sdt,
                                               device=device)
    if groups_count is not None and spec.format == "nvfp4":  # each group's own amax
        out["amax"] = torch.zeros((groups_count,), dtype=torch.float32, device=device)
    if spec.hadamard:  # the amax and the transformed copy's: one fp32[2] buffer, the kernels' amax slot
        pair = torch.zeros((2,), dtype=torch.float32, device=device)
        out["amax"], out["colwise_amax"] = pair[0], pair[1]
    return out


def amax_pair(amax: torch.Tensor, colwise_amax: torch.Tensor) -> torch.Tensor | None:
    """NVFP4 with the Hadamard transform: ``amax`` and ``colwise_amax`` as the one fp32[2] view
    the kernels write (outputs' ``pair``), or None where they do not lie side by side."""
    if amax is None or colwise_amax is None:
        return None
    if amax.dtype != torch.float32 or colwise_amax.dtype != torch.float32 or amax.device != colwise_amax.device:
        return None
    if amax.untyped_storage().data_ptr() != colwise_amax.untyped_storage().data_ptr():
        return None
    if colwise_amax.data_ptr() != amax.data_ptr() + 4:
        return None
    return torch.as_strided(amax, (2,), (1,))


def given_amax(value, device) -> torch.Tensor | None:
    """A call's ``global_amax`` (fp4.CallArgs) as an fp32 tensor on ``device``, or None: a float
    as 0-d, a pair (hadamard=True's amax and colwise_amax, which the amax_pair buffer takes: two
    floats, or two one-element tensors stacked on their device) as [2], a tensor as it is
    (validation.check_fp4 has checked its dtype and shape), each detached from autograd (the
    outputs are data, whatever the amax given)."""
    if value is None or isinstance(value, torch.Tensor):
        return value if value is None else value.detach()
    if isinstance(value, (tuple, list)):
        if isinstance(value[0], torch.Tensor):
            return torch.stack([v.detach().reshape(()) for v in value])
        return torch.tensor([ir.scalar(v) for v in value], dtype=torch.float32, device=device)
    return torch.tensor(ir.scalar(value), dtype=torch.float32, device=device)  # (an int rounded once)


def to_layout(s: torch.Tensor, layout: str) -> torch.Tensor:
    """Compact scales [rows, blocks] in ``layout`` (swizzled: zero padded atoms)."""
    if layout == "compact":
        return s
    return layouts.swizzle(s.view(torch.uint8)).view(s.dtype)


def compact(buf: torch.Tensor, rows: int, cols: int, fmt: str, layout: str) -> torch.Tensor:
    """A direction's scales of a [rows, cols] operand as the compact grid [rows, ceil(cols/B)]."""
    if layout == "compact":
        return buf
    return layouts.unswizzle(buf.view(torch.uint8), *scale_grid(rows, cols, fmt)).view(buf.dtype)


def operand_dims(direction: str, m: int, n: int) -> tuple[int, int]:
    """[rows, cols] of a direction's quantized operand: rowwise [M, N], colwise the copy [N, M]."""
    return (m, n) if direction == "rowwise" else (n, m)


__all__ = ["amax_pair", "compact", "data_shape", "first_colwise_block", "given_amax", "group_bounds",
           "grouped_colwise_blocks", "grouped_gap", "operand_dims", "outputs", "scale_dtype", "scale_grid",
           "scale_shape", "to_layout"]
