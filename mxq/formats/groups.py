"""Row groups (mixture-of-experts tokens sorted by expert): ``group_offsets`` and where each
group's colwise blocks live (docs/NUMERICS.md, "Groups").

``group_offsets`` holds G cumulative group ends along the rows (after flattening the input to
[M, N]; the convention of ``torch._grouped_mm``): group g is rows [start_g, end_g) with
start_0 = 0, start_g = end_{g-1}, and end_{G-1} = M. Groups may be empty and of any size.

Colwise 32-row blocks restart at each group's first row; a group's last block may be partial.
Compact grouped colwise scales are a [M // 32 + G, N] buffer (an upper bound that depends on M
and G only, so the output size never needs the offsets on the host): group g's blocks are the
rows ``floor(start_g / 32) + g`` onwards, ``ceil((end_g - start_g) / 32)`` of them. The rows
this leaves between groups are zero. Rowwise blocks do not depend on the groups.
"""

from __future__ import annotations

import torch

BLOCK = 32
MAX_GROUPS = 65535  # the grouped dbias reduction's grid y (one CTA row per group)


def grouped_colwise_rows(m: int, groups: int, block: int = BLOCK) -> int:
    """Rows of the compact grouped colwise scale buffer (of ``block``-row blocks: 128 for FP8
    block scaling, mxq/formats/fp8_block_layouts.py)."""
    return m // block + groups


def workspace_rows(m: int, groups: int | None = None, rows: int = BLOCK) -> int:
    """Rows of the dbias workspace (one row of partial sums per ``rows``-row tile, by default a
    32-row block; grouped, every group's tiles: the compact grouped colwise scales' rows)."""
    return -(-m // rows) if groups is None else grouped_colwise_rows(m, groups, rows)


# Swizzled grouped scales: each group's scales in the cuBLAS 128x4 blocked layout of its own,
# the groups one after another (the layout the MXFP8 grouped GEMMs read; torchao's M-groups and
# K-groups rearrangements), in buffers sized by M, N and G alone.
def swizzled_rowwise_rows(m: int, groups: int) -> int:
    """Rows of the swizzled grouped rowwise buffer [M + 128 G, roundup(ceil(N/32), 4)]: group g's
    blocked scales (roundup(m_g, 128) rows) start at row sum_{h<g} roundup(m_h, 128)."""
    return m + 128 * groups


def swizzled_colwise_rows(m: int, groups: int) -> int:
    """Rows of the swizzled grouped colwise buffer [M // 32 + 4 G, roundup(N, 128)]: group g's
    blocked scales (its ceil(m_g/32) blocks, padded to a multiple of 4, times roundup(N, 128)
    columns, tile by tile) start at row sum_{h<g} roundup(ceil(m_h / 32), 4)."""
    return m // BLOCK + 4 * groups


def swizzled_starts(bnds) -> tuple[list[int], list[int]]:
    """(rowwise start rows, colwise start rows) of every group in the swizzled grouped buffers."""
    rows, cols, r, c = [], [], 0, 0
    for start, end in bnds:
        rows.append(r)
        cols.append(c)
        r += -(-(end - start) // 128) * 128
        c += -(-(-(-(end - start) // BLOCK)) // 4) * 4
    return rows, cols


def check_type(offsets) -> None:
    """Raise a TypeError naming ``group_offsets`` unless it is a plain, dense, strided torch.Tensor
    (what a traced call can check before the operator's schema would refuse it in torch's words;
    a sparse or nested tensor would fail inside torch)."""
    if not isinstance(offsets, torch.Tensor) or type(offsets) not in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(f"mxq: argument 'group_offsets' must be a torch.Tensor, got {type(offsets).__name__}")
    if offsets.is_nested or offsets.layout is not torch.strided:
        raise TypeError(f"mxq: argument 'group_offsets' must be a dense strided tensor, got a "
                        f"{'nested' if offsets.is_nested else str(offsets.layout)} one")


def check_form(offsets) -> None:
    """Raise a TypeError/ValueError naming ``group_offsets`` unless it is a 1-D int32 or int64
    tensor of 1 to MAX_GROUPS group ends: what sizes the grouped outputs (check's, after
    check_type; all MXFP8Tensor.empty checks, whose offsets may be torch.compile's fake tensors)."""
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"mxq: argument 'group_offsets' must be a torch.Tensor, got {type(offsets).__name__}")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"mxq: argument 'group_offsets' must be int32 or int64, got {offsets.dtype}")
    if offsets.dim() != 1 or offsets.numel() == 0:
        raise ValueError(f"mxq: argument 'group_offsets' must be 1-D with at least one group end, got shape "
                         f"{tuple(offsets.shape)}")
    if offsets.numel() > MAX_GROUPS:
        raise ValueError(f"mxq: argument 'group_offsets' has {offsets.numel()} groups; at most {MAX_GROUPS} "
                         "are supported")


def check(offsets, m: int, device) -> None:
    """Raise a ValueError/TypeError naming ``group_offsets`` unless it is a valid offsets tensor
    for M rows on ``device``. The values (non-decreasing, last == M) are checked on CPU only: on
    CUDA that would be a host sync per call (and impossible inside CUDA-graph capture), so there
    the kernels clamp every end to [0, M] instead (mxq/kernels/grouped.py): bad values give
    unspecified bytes, never an access outside the buffers."""
    check_type(offsets)
    check_form(offsets)
    if offsets.device != torch.device(device):
        raise ValueError(f"mxq: argument 'group_offsets' is on {offsets.device} but the input is on {device}")
    if offsets.device.type != "cpu":
        return
    ends = offsets.to(torch.int64)
    # (order first: [40, 30] is decreasing, whatever its last end)
    if int(ends[0]) < 0 or bool((ends[1:] < ends[:-1]).any()):
        raise ValueError("mxq: argument 'group_offsets' must be non-decreasing group ends starting at >= 0")
    if int(ends[-1]) != m:
        raise ValueError(f"mxq: argument 'group_offsets' must end at M = {m} (rows after flattening), got "
                         f"{int(ends[-1])}")


def bounds(offsets) -> list[tuple[int, int]]:
    """(start, end) of every group, on the host."""
    ends = offsets.to(torch.int64).cpu().tolist()
    return list(zip([0] + ends[:-1], ends))


def first_block_row(g: int, start: int, block: int = BLOCK) -> int:
    """The row of group g's first colwise block in the compact grouped scale buffer (of
    ``block``-row blocks)."""
    return start // block + g


__all__ = ["BLOCK", "bounds", "check", "first_block_row", "grouped_colwise_rows", "swizzled_colwise_rows",
           "swizzled_rowwise_rows", "swizzled_starts", "workspace_rows"]
