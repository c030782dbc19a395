"""The kernel slot table and the output order: defined once, read by every route.

A compiled kernel function takes its arguments positionally, in the order ``kernel_slots``
gives: the epilogue's tensors, its floats, then the spec's operands and outputs, then noop.
Everything that builds or documents such an argument list derives from this table:

- the generated launchers' parameter lists (codegen -> templates/module.py.j2),
- the fake compile-time arguments (compiler.fake_args),
- the Python binder of one call (launch.Launcher.bind),
- the AOT header's argument documentation (export),
- the destination-passing signature of the C++ dispatcher (``DESTINATIONS``; csrc/dispatch.cc
  spells the same list in ``kSlots``, and tests/test_architecture.py holds the two equal) and the
  allocating route's result order (``OUTPUTS``, the MXFP8Tensor fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# MXFP8Tensor's output fields, in the order the allocating native route returns them
OUTPUTS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias")

# The destination-passing signature after the epilogue's tensors and floats (registered ops,
# mxq.get_quantize_kernel): act_input, the six outputs, noop. Bit i of dispatch_flags() says
# whether slot i is used (the last, noop, always is).
DESTINATIONS = ("act_input", *OUTPUTS, "noop")

# The operands Quantize.launch (mxq/kernels/quantize.py) takes after the epilogue's tensors and
# floats, in order (a slot the spec does not use is passed as None; group_offsets is used by the
# grouped launchers only).
LAUNCH_OPERANDS = ("act_input", *OUTPUTS, "dbias_workspace", "noop", "group_offsets")


@dataclass(frozen=True)
class Slot:
    """One positional argument of a compiled kernel function."""

    name: str  # the generated launcher's parameter name
    role: str  # "input" | "scalar" | "act_input" | an OUTPUTS field | "dbias_workspace" | "noop" | "group_offsets"
    index: int = 0  # position among the epilogue's tensors / floats
    doc: str = ""  # shape and dtype, for the AOT header

    @property
    def is_tensor(self) -> bool:
        return self.role != "scalar"


def uses(spec, role: str) -> bool:
    """Whether an op with QuantSpec ``spec`` reads or writes the slot with ``role``."""
    if role in ("rowwise_data", "rowwise_scale"):
        return spec.rowwise
    if role in ("colwise_data", "colwise_scale"):
        return spec.colwise
    if role == "act_input":
        return spec.dact is not None
    if role in ("dbias", "dbias_workspace"):
        return spec.dbias
    if role == "amax":
        return spec.amax
    if role == "noop":
        return True
    if role == "group_offsets":
        return False  # a call-time option: kernel_slots(..., grouped=True) adds it
    raise ValueError(f"mxq: unknown slot role {role!r}")


@lru_cache(maxsize=1024)
def kernel_slots(spec, n_inputs: int, n_scalars: int, grouped: bool = False, n_out: str = "N") -> tuple[Slot, ...]:
    """The compiled kernel function's positional arguments for ``spec`` and an epilogue with
    ``n_inputs`` tensor and ``n_scalars`` float parameters; ``grouped``: the grouped kernels'
    (group_offsets; mxq/formats/groups.py gives the grouped buffers' sizes), which take the int32 group
    ends last. ``n_out``: the outputs' width in the docs ("2N" for a two-halves op, mxq/frontend/gated.py)."""
    compact = spec.scale_layout == "compact"
    w = n_out
    row_scale = f"M * ceil({w}/32)" if compact else f"roundup(M,128) * roundup(ceil({w}/32),4)"
    col_scale = f"ceil(M/32) * {w}" if compact else f"roundup(ceil(M/32),4) * roundup({w},128)"
    if grouped:
        row_scale = row_scale if compact else f"(M + 128 G) * roundup(ceil({w}/32),4)"
        col_scale = f"(M//32 + G) * {w}" if compact else f"(M//32 + 4 G) * roundup({w},128)"
    table = [
        *(Slot(f"mIn{i}", "input", i, "dtype[M, N]       (epilogue tensor %d)" % i) for i in range(n_inputs)),
        *(Slot(f"s{i}", "scalar", i, "float32            (epilogue float %d)" % i) for i in range(n_scalars)),
        Slot("mActIn", "act_input", 0, "dtype[M, N]"),
        Slot("mRowData", "rowwise_data", 0, f"uint8[M, {w}]{' ' * (9 - len(w))}(FP8 bytes, rowwise blocks of 32 along {w})"),
        Slot("mRowScale", "rowwise_scale", 0, f"uint8[{row_scale}] flat E8M0"),
        Slot("mColData", "colwise_data", 0, f"uint8[M, {w}]{' ' * (9 - len(w))}(FP8 bytes, colwise blocks of 32 along M)"),
        Slot("mColScale", "colwise_scale", 0, f"uint8[{col_scale}] flat E8M0"),
        Slot("mAmax", "amax", 0, "float32[1]         (set to max|v|; zeroed by the kernel first)"),
        Slot("mDbias", "dbias", 0, f"dtype[G, {w}]" if grouped else f"dtype[{w}]"),
        Slot("mDbiasWs", "dbias_workspace", 0,
             f"ws[{'M//32 + G' if grouped else 'ceil(M/32)'}, {w}]  (dbias workspace: scratch)"),
        Slot("mNoop", "noop", 0, "float32[1]         (1.0: write nothing)"),
    ]
    if grouped:
        table.append(Slot("mGroupEnds", "group_offsets", 0, "int32[G]           (cumulative group ends)"))
    return tuple(s for s in table if s.role in ("input", "scalar", "group_offsets") or uses(spec, s.role))


def dispatch_flags(spec) -> int:
    """The C++ dispatcher's flag word: bit i for DESTINATIONS[i] used (i < 7), bit 7 for e5m2,
    bit 8 for swizzled scales (the dispatcher requires scale buffers of exactly that layout's size)."""
    bits = sum(1 << i for i, role in enumerate(DESTINATIONS[:-1]) if uses(spec, role))
    return bits | (spec.fp8 == "e5m2") << 7 | (spec.scale_layout == "swizzled") << 8


__all__ = ["DESTINATIONS", "LAUNCH_OPERANDS", "OUTPUTS", "Slot", "dispatch_flags", "kernel_slots", "uses"]
