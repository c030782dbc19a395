"""Shared memory, declared once: a kernel's buffers as a list of ``Buffer`` descriptions.

The same list gives the kernel its tensors (``allocate``, in list order, each 16-byte aligned)
and the host its byte count (``nbytes``: whether an op's kernel fits a CTA, mxq/op.py), so the
two cannot drift apart. Nothing here imports cutlass at module level: config.py and the tests
read the byte counts without the DSL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALIGN = 16  # bytes every buffer starts on

# element types by name (a staged source's, "src", is the source tensor's own)
BITS = {"u8": 8, "i32": 32, "u32": 32, "u64": 64, "f32": 32, "f64": 64}


@dataclass(frozen=True)
class Buffer:
    """One shared-memory tensor: row-major ``shape`` of ``dtype`` (a BITS key, or "src" with
    ``bits`` given: a staged copy of a source tensor, typed like it)."""

    name: str
    dtype: str
    shape: tuple
    bits: int = 0

    @property
    def width(self) -> int:
        return self.bits or BITS[self.dtype]

    @property
    def nbytes(self) -> int:
        """Its bytes, rounded up to the next buffer's alignment."""
        n = math.prod(self.shape) * self.width // 8
        return (n + ALIGN - 1) // ALIGN * ALIGN


def nbytes(buffers) -> int:
    """Shared memory a kernel allocates for ``buffers``."""
    return sum(b.nbytes for b in buffers)


def allocate(smem, buffers, src_types=None) -> dict:
    """The tensors of ``buffers`` from ``smem`` (a cutlass SmemAllocator), by name, in order;
    ``src_types``: the element type of each "src" buffer, by name."""
    import cutlass
    import cutlass.cute as cute

    types = {"u8": cutlass.Uint8, "i32": cutlass.Int32, "u32": cutlass.Uint32, "u64": cutlass.Uint64,
             "f32": cutlass.Float32,
             "f64": cutlass.Float64}
    out = {}
    for b in buffers:
        el = src_types[b.name] if b.dtype == "src" else types[b.dtype]
        if len(b.shape) == 1:
            layout = cute.make_layout(b.shape[0])
        else:
            stride = tuple(math.prod(b.shape[k + 1:]) for k in range(len(b.shape)))
            layout = cute.make_layout(b.shape, stride=stride)
        out[b.name] = smem.allocate_tensor(el, layout, ALIGN)
    return out
