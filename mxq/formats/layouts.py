"""Scale tensor shapes and the cuBLAS 128x4 "swizzled" (GEMM-ready) scale layout.

One place answers "what shape is this scale tensor" so the reference, the runtime's output
allocation and the kernels' launch code cannot disagree. Swizzling is expressed as a torch
view/permute (fast, and what the reference uses); ``swizzle_offset`` is the closed-form byte
offset from docs/NUMERICS.md that the kernel templates use and the tests check the view against.
"""

from __future__ import annotations

import torch

from .numerics import BLOCK

LAYOUTS = ("compact", "swizzled")
# the swizzled layout's tile of rowwise scales: 128 rows x 4 blocks (colwise scales: its transpose)
SWIZZLE_TILE = (128, 4)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def roundup(a: int, b: int) -> int:
    return cdiv(a, b) * b


def rowwise_scale_shape(m: int, n: int, layout: str) -> tuple[int, int]:
    if layout == "compact":
        return (m, cdiv(n, BLOCK))
    return (roundup(m, SWIZZLE_TILE[0]), roundup(cdiv(n, BLOCK), SWIZZLE_TILE[1]))


def colwise_scale_shape(m: int, n: int, layout: str) -> tuple[int, int]:
    if layout == "compact":
        return (cdiv(m, BLOCK), n)
    return (roundup(cdiv(m, BLOCK), SWIZZLE_TILE[1]), roundup(n, SWIZZLE_TILE[0]))


def swizzle_offset(i: int, j: int, blocks: int) -> int:
    """Byte offset of logical scale (row ``i``, block ``j``) with ``blocks`` blocks per row."""
    t = cdiv(blocks, 4)
    return ((i // 128) * t + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4


def swizzle(s: torch.Tensor) -> torch.Tensor:
    """Compact [rows, blocks] -> swizzled [roundup(rows,128), roundup(blocks,4)], zero padded."""
    rows, blocks = s.shape
    rp, bp = roundup(rows, 128), roundup(blocks, 4)
    padded = torch.zeros((rp, bp), dtype=s.dtype, device=s.device)
    padded[:rows, :blocks] = s
    return padded.view(rp // 128, 4, 32, bp // 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, bp)


def unswizzle(buf: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """Inverse of ``swizzle``: the compact [rows, blocks] entries of a swizzled buffer."""
    rp, bp = roundup(rows, 128), roundup(blocks, 4)
    flat = buf.reshape(-1)
    if flat.numel() != rp * bp:
        raise ValueError(f"mxq: swizzled scale buffer has {flat.numel()} bytes, expected {rp * bp}")
    tiles = flat.view(rp // 128, bp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rp, bp)[:rows, :blocks]


def to_layout_rowwise(s: torch.Tensor, layout: str) -> torch.Tensor:
    """Compact rowwise scales [M, ceil(N/32)] in the requested layout."""
    return s if layout == "compact" else swizzle(s)


def to_layout_colwise(s: torch.Tensor, layout: str) -> torch.Tensor:
    """Compact colwise scales [ceil(M/32), N] in the requested layout.

    Swizzled colwise scales are the swizzle of the transpose (column n, block b), stored in a
    buffer of shape [roundup(ceil(M/32),4), roundup(N,128)] (TE's convention).
    """
    if layout == "compact":
        return s
    sw = swizzle(s.t())
    return sw.reshape(sw.shape[1], sw.shape[0])


def compact_rowwise(buf: torch.Tensor, m: int, n: int, layout: str) -> torch.Tensor:
    return buf if layout == "compact" else unswizzle(buf, m, cdiv(n, BLOCK))


def compact_colwise(buf: torch.Tensor, m: int, n: int, layout: str) -> torch.Tensor:
    return buf if layout == "compact" else unswizzle(buf, n, cdiv(m, BLOCK)).t()
