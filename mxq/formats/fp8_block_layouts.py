"""Where FP8 block scaling's outputs live: the compact and the GEMM-ready (``gemm``) layouts of its
data and fp32 scales, and the grouped compact buffers (docs/NUMERICS.md, "FP8 block scaling",
draws each one).

For an input read as [M, N] (mxq/tensor.py ``flat_dims``) and R = 128:

- compact: rowwise data [M, N] (the input's shape) with scales [M, ceil(N/R)] (1x128) or
  [ceil(M/R), ceil(N/R)] (128x128); colwise data [M, N] too, with scales [ceil(M/R), N] (128-row
  blocks down each column) or, 128x128, the same tile grid as rowwise (the same bytes).
- gemm: what torch._scaled_mm / cuBLAS take with no reformatting. Rowwise data as compact; the
  colwise copy transposed, [N, M] contiguous (the wgrad GEMM reads it K-major). 1x128 scales of
  a [rows, cols] operand are outer-dim-major, the view ``buf[:, :rows].t()`` of an fp32 buffer
  [ceil(cols/R), roundup(rows, 4)] (stride(0) == 1; TE's layout); 128x128 scales are the view
  ``buf[:ceil(rows/R), :ceil(cols/R)]`` of a zeroed buffer [roundup(ceil(rows/R), 4),
  roundup(ceil(cols/R), 4)] (row stride a multiple of 4, as cuBLAS needs: unpadded ones were
  seen to give wrong products with no error). The colwise scales describe the transposed copy
  ([N, M]: 1x128 blocks along M, or its tiles).

Grouped (``group_offsets``, compact only): blocks that span rows restart at each group, as for
MXFP8 (mxq/formats/groups.py) with 128-row blocks: group g's block rows start at row
``start_g // 128 + g`` of a zeroed [M // 128 + G, cols] buffer; 1x128 rowwise scales do not
depend on the groups.
"""

from __future__ import annotations

import torch

from . import groups
from .layouts import cdiv, roundup
from .fp8_block import BLOCK

# what the GEMM-ready scales' padded dimensions are multiples of (cuBLAS's row stride of 16 bytes)
GEMM_SCALE_ALIGN = 4


def scale_grid(rows: int, cols: int, block: tuple) -> tuple[int, int]:
    """The logical scale shape of a [rows, cols] operand quantized in ``block`` blocks."""
    return cdiv(rows, block[0]), cdiv(cols, block[1])


def gemm_scale(rows: int, cols: int, tiles: bool, device, alloc=torch.zeros) -> torch.Tensor:
    """The GEMM-ready fp32 scales of a [rows, cols] FP8 operand: 1x128 blocks along ``cols``
    (outer-dim-major) or, ``tiles``, 128x128 (row-major, padded); a view of a fresh buffer."""
    if tiles:
        mb, nb = scale_grid(rows, cols, (BLOCK, BLOCK))
        return alloc((roundup(mb, GEMM_SCALE_ALIGN), roundup(nb, GEMM_SCALE_ALIGN)), dtype=torch.float32, device=device)[:mb, :nb]
    buf = alloc((cdiv(cols, BLOCK), roundup(rows, GEMM_SCALE_ALIGN)), dtype=torch.float32, device=device)
    return buf[:, :rows].t()


def colwise_block(block: tuple) -> tuple:
    """The block of the colwise direction over [M, N]: 128 rows of one column (1x128), or the tile."""
    return (block[1], block[0])


def scales(spec, m: int, n: int, device, zeroed: bool, groups_count: int | None):
    """(rowwise scale, colwise scale) tensors for an fp8_block ``spec`` over [M, N] (None where the
    spec has no such direction). Compact scales are uninitialised unless ``zeroed`` or grouped
    (rows between groups stay 0); GEMM-ready ones are views of zeroed padded buffers."""
    tiles = spec.block == (BLOCK, BLOCK)
    alloc = torch.zeros if zeroed else torch.empty
    row = col = None
    if spec.scale_layout == "gemm":
        if spec.rowwise:
            row = gemm_scale(m, n, tiles, device)
        if spec.colwise:
            col = gemm_scale(n, m, tiles, device)
        return row, col
    row_grid = scale_grid(m, n, spec.block)
    col_grid = scale_grid(m, n, colwise_block(spec.block))
    if groups_count is not None:  # blocks spanning rows restart at each group
        if tiles:
            row_grid = (grouped_rows(m, groups_count), row_grid[1])
        col_grid = (grouped_rows(m, groups_count), col_grid[1])
    row_alloc = torch.zeros if groups_count is not None and tiles else alloc
    col_alloc = torch.zeros if groups_count is not None else alloc
    if spec.rowwise:
        row = row_alloc(row_grid, dtype=torch.float32, device=device)
    if spec.colwise:
        col = col_alloc(col_grid, dtype=torch.float32, device=device)
    return row, col


def colwise_data(spec, m: int, n: int, device, zeroed: bool) -> torch.Tensor | None:
    """The colwise FP8 data of the GEMM-ready layout: the transposed copy [N, M], contiguous
    (None for the compact layout, whose colwise data is shaped as the rowwise data)."""
    if spec.scale_layout != "gemm":
        return None
    alloc = torch.zeros if zeroed else torch.empty
    return alloc((n, m), dtype=spec.element.torch_dtype, device=device)


def grouped_rows(m: int, groups_count: int) -> int:
    """Rows of a grouped compact buffer of 128-row blocks: M // 128 + G (an upper bound that
    needs no offsets on the host; groups.grouped_colwise_rows with 128-row blocks)."""
    return groups.grouped_colwise_rows(m, groups_count, BLOCK)


def first_block_row(g: int, start: int) -> int:
    """The row of group g's first 128-row block in a grouped compact buffer."""
    return groups.first_block_row(g, start, BLOCK)


__all__ = ["GEMM_SCALE_ALIGN", "colwise_block", "colwise_data", "first_block_row", "gemm_scale", "grouped_rows",
           "scale_grid", "scales"]
