"""Operand layouts: how a tensor argument maps onto the op's [M, N] element grid.

The first tensor parameter sets the shape S (any rank; M = prod(S[:-1]), N = S[-1]). Every other
tensor parameter either has shape S or broadcasts against it over the last two dimensions
(docs/NUMERICS.md, "Operands"):

| kind     | shapes                                  | element (i, j) reads        |
|----------|-----------------------------------------|-----------------------------|
| full     | S                                       | t[i, j]                     |
| row      | [N], [1, N] (any number of leading 1s)  | t[j]      (e.g. a bias)     |
| col      | S[:-1] + [1]                            | t[i]      (e.g. a row scale)|
| scalar   | 0-d, [1], [1, 1], ...                   | t[0]      (a device scalar) |

A full operand may be a strided 2-D view (last stride 1, row stride >= N, e.g. ``x[:, :N]`` of a
``[M, 2N]`` tensor); the kernels take it with its row stride, no copy. ``act_input`` is always
full. The kernels receive every operand as an [M, N] view (broadcast dims with stride 0), and
specialise on those strides at trace time (a row operand is loaded once per tile).
"""

from __future__ import annotations

import torch

KINDS = ("full", "row", "col", "scalar")
BROADCAST_STRIDES = {"row": (0, 1), "col": (1, 0), "scalar": (0, 0)}  # a broadcast kind's [M, N] view strides


def kind_of(shape, m: int, n: int, full_shape) -> str | None:
    """The kind of an operand of ``shape`` against the op's shape ``full_shape`` ([M, N] after
    flattening), or None when it does not broadcast. An exact match is full; otherwise the
    broadcast kinds are tried in the order of the table (so a [1] operand of a [1, 1] op is a
    scalar: the same element either way)."""
    shape = tuple(shape)
    if shape == tuple(full_shape):
        return "full"
    if all(d == 1 for d in shape):
        return "scalar"
    if shape and shape[-1] == n and all(d == 1 for d in shape[:-1]):
        return "row"
    if len(shape) == len(full_shape) and shape[-1] == 1 and tuple(shape[:-1]) == tuple(full_shape[:-1]):
        return "col"
    return None


def as_matrix(t: torch.Tensor, kind: str, m: int, n: int) -> torch.Tensor:
    """``t`` as an [M, N] view: a reshape for full operands (a strided 2-D view stays a view),
    an expand (stride 0) for broadcast ones."""
    if kind == "full":
        return t if t.dim() == 2 and t.shape == (m, n) else t.reshape(m, n)
    if kind == "row":
        return t.reshape(1, n).expand(m, n)
    if kind == "col":
        return t.reshape(m, 1).expand(m, n)
    return t.reshape(1, 1).expand(m, n)


def unit_stride(t: torch.Tensor, kind: str, copied) -> torch.Tensor:
    """A broadcast operand of op.gemm as the GEMM's epilogue reads it (compiled for a row's or a
    column's unit stride, 0 along the broadcast dimension): a non-contiguous one (a strided or
    expanded row, a column sliced from a wider tensor) copied, after ``copied(reason)`` (the
    copy's warning: validation.copied), as a call copies the operands its kernel cannot read in
    place. Full operands are checked contiguous by runtime/gemm.operand_kinds."""
    if kind == "full" or t.is_contiguous():
        return t
    copied(f"op.gemm copies a {kind} operand of strides {tuple(t.stride())}: the GEMM's epilogue reads "
           "broadcast operands of unit stride (pass it contiguous to avoid the copy)")
    return t.contiguous()


def is_row_strided(t: torch.Tensor, n: int) -> bool:
    """A 2-D view the kernels take as is: last stride 1 and a row stride of at least N (not the
    contiguous row stride N itself: that is a plain full operand)."""
    return t.dim() == 2 and t.stride(-1) == 1 and t.stride(0) > n and t.shape[0] > 1


__all__ = ["BROADCAST_STRIDES", "KINDS", "as_matrix", "is_row_strided", "kind_of", "unit_stride"]
