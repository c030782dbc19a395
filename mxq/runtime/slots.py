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

from ..formats import fp8_block_layouts, layouts
from ..formats.numerics import BLOCK as ROWS  # MXFP8's tile: one 32-row block (KernelConfig.tile_rows)

# MXFP8Tensor's output fields, in the order the allocating native route returns them
OUTPUTS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias")

# The destination-passing signature after the epilogue's tensors and floats (registered ops,
# mxq.get_quantize_kernel): act_input, the six outputs, noop. Bit i of dispatch_flags() says
# whether slot i is used (the last, noop, always is).
DESTINATIONS = ("act_input", *OUTPUTS, "noop")

# The operands Quantize.launch (mxq/kernels/quantize.py) takes after the epilogue's tensors and
# floats, in order (a slot the spec does not use is passed as None; group_offsets is used by the
# grouped launchers only; rng by NVFP4's stochastic rounding: its seed and offset).
LAUNCH_OPERANDS = ("act_input", *OUTPUTS, "dbias_workspace", "noop", "group_offsets", "rng")


@dataclass(frozen=True)
class Slot:
    """One positional argument of a compiled kernel function."""

    name: str  # the generated launcher's parameter name
    role: str  # "input" | "scalar" | "act_input" | an OUTPUTS field | "dbias_workspace" | "noop" | "group_offsets"
    # | "rng"
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
    if role == "rng":
        return spec.stochastic_rounding
    if role == "group_offsets":
        return False  # a call-time option: kernel_slots(..., grouped=True) adds it
    raise ValueError(f"mxq: unknown slot role {role!r}")


# csrc/scale_sizes.h's Order: how a direction's scale grid lies in its flat buffer
ROW_MAJOR, OUTER_MAJOR, BLOCKED = 0, 1, 2


def direction_facts(spec, colwise: bool) -> tuple[int, int, int, int, int]:
    """(block rows, block columns, pad rows, pad columns, order) of one direction's scales of an
    [M, W] output (csrc/scale_sizes.h's ScaleFacts): a grid of [ceil(M / block rows), ceil(W /
    block columns)] scales padded to multiples of the pads, stored in ``order``. MXFP8: 1x32
    (colwise 32x1) blocks, the swizzled layout's 128x4 tiles (layouts.SWIZZLE_TILE). FP8 block
    scaling (fp8_block_layouts): 1x128 blocks (colwise 128x1) or 128x128 tiles; the GEMM-ready
    layout pads by GEMM_SCALE_ALIGN, 1x128 scales outer-dim-major (the colwise ones describe the
    transposed copy [N, M]: row-major over its M blocks), tiles row-major (colwise: transposed)."""
    fmt = spec.block_format
    block = fmt.col_block if colwise else fmt.block
    if spec.is_fp4:  # (NVFP4's 16x16 tiles too: each tile's scale stored in every row's / column's entry)
        block = (spec.block[1], 1) if colwise else (1, spec.block[1])
    if spec.format in ("mxfp8", "mxfp4", "nvfp4"):  # (FP4's colwise grid: the transposed copy's scales, transposed)
        if spec.scale_layout == "compact":
            return (*block, 1, 1, ROW_MAJOR)
        tile = layouts.SWIZZLE_TILE[::-1] if colwise else layouts.SWIZZLE_TILE
        return (*block, *tile, BLOCKED)
    if spec.scale_layout == "compact":
        return (*block, 1, 1, ROW_MAJOR)
    a = fp8_block_layouts.GEMM_SCALE_ALIGN
    if block[0] == block[1]:  # 128x128 tiles: [roundup(mb, a), roundup(nb, a)] (colwise: of [N, M])
        return (*block, a, a, OUTER_MAJOR if colwise else ROW_MAJOR)
    if colwise:  # the transposed copy's 1x128 scales: [ceil(M/128), roundup(N, a)]
        return (*block, 1, a, ROW_MAJOR)
    return (*block, a, 1, OUTER_MAJOR)  # [ceil(N/128), roundup(M, a)]: scale (i, j) at j * roundup(M, a) + i



@lru_cache(maxsize=1024)
def kernel_slots(spec, n_inputs: int, n_scalars: int, grouped: bool = False, n_out: str = "N",
                 tile_rows: int = ROWS) -> tuple[Slot, ...]:
    """The compiled kernel function's positional arguments for ``spec`` and an epilogue with
    ``n_inputs`` tensor and ``n_scalars`` float parameters; ``grouped``: the grouped kernels'
    (group_offsets; mxq/formats/groups.py gives the grouped buffers' sizes), which take the int32 group
    ends last. ``n_out``: the outputs' width in the docs ("2N" for a two-halves op, mxq/frontend/gated.py);
    ``tile_rows``: the rows of one dbias partial sum in the docs (KernelConfig.tile_rows)."""
    w = n_out
    row, col = direction_facts(spec, False), direction_facts(spec, True)
    el, enc = ("float32", "fp32") if spec.block_format.scale == "fp32" else ("uint8", "E8M0")
    ws_rows = (f"M//{tile_rows} + G" if grouped else f"ceil(M/{tile_rows})")
    row_data = f"uint8[M, {w}]{' ' * (9 - len(w))}(FP8 bytes, rowwise blocks of {row[1]} along {w})"
    col_data = f"uint8[M, {w}]{' ' * (9 - len(w))}(FP8 bytes, colwise blocks of {col[0]} along M)"
    amax = "float32[1]         (set to max|v|; zeroed by the kernel first)"
    if spec.is_fp4:  # (E2M1 codes two a byte, element 2j in the low nibble; the colwise copy transposed)
        enc = "E4M3" if spec.format == "nvfp4" else "E8M0"
        row_data = f"uint8[M, {w}/2]     (E2M1 codes two a byte, rowwise blocks of {row[1]} along {w})"
        col_data = (f"uint8[{w}, M/2]     (E2M1 codes two a byte, the transposed colwise copy: contiguous, "
                    f"blocks of {col[0]} along M; its scales are the copy's rowwise ones, [{w}, ceil(M/{col[0]})])")
        if spec.format == "nvfp4":
            amax = (f"float32[{'G' if grouped else 1}]         (the tensor amax{' of each group' if grouped else ''} "
                    "the scales use: set by the amax pass, zeroed first; \"_vec_given\": the given amax, read)")
    table = [
        *(Slot(f"mIn{i}", "input", i, "dtype[M, N]       (epilogue tensor %d)" % i) for i in range(n_inputs)),
        *(Slot(f"s{i}", "scalar", i, "float32            (epilogue float %d)" % i) for i in range(n_scalars)),
        Slot("mActIn", "act_input", 0, "dtype[M, N]"),
        Slot("mRowData", "rowwise_data", 0, row_data),
        Slot("mRowScale", "rowwise_scale", 0, f"{el}[{scale_size_text(row, w, grouped)}] flat {enc}{_order_text(row)}"),
        Slot("mColData", "colwise_data", 0, col_data),
        Slot("mColScale", "colwise_scale", 0, f"{el}[{scale_size_text(col, w, grouped)}] flat {enc}{_order_text(col)}"),
        Slot("mAmax", "amax", 0, amax),
        Slot("mDbias", "dbias", 0, f"dtype[G, {w}]" if grouped else f"dtype[{w}]"),
        Slot("mDbiasWs", "dbias_workspace", 0, f"ws[{ws_rows}, {w}]  (dbias workspace: scratch)"),
        Slot("mNoop", "noop", 0, "float32[1]         (1.0: write nothing)"),
        Slot("mRng", "rng", 0, "int64[2]           (stochastic rounding: seed, offset)"),
    ]
    if grouped:
        table.append(Slot("mGroupEnds", "group_offsets", 0, "int32[G]           (cumulative group ends)"))
    return tuple(s for s in table if s.role in ("input", "scalar", "group_offsets") or uses(spec, s.role))


def scale_size_text(facts, w: str = "N", grouped: bool = False) -> str:
    """A direction's flat scale buffer length as the AOT header writes it (direction_facts; the
    formula of csrc/scale_sizes.h's ScaleElements): e.g. "M * ceil(N/32)"."""
    br, bc, pr, pc, _ = facts
    rows = "M" if br == 1 else f"ceil(M/{br})"
    if grouped and not (br == 1 and pr == 1):
        rows = f"(M{f'//{br}' if br > 1 else ''} + {f'{pr} ' if pr > 1 else ''}G)"
    elif pr > 1:
        rows = f"roundup({rows},{pr})"
    cols = w if bc == 1 else f"ceil({w}/{bc})"
    cols = f"roundup({cols},{pc})" if pc > 1 else cols
    return f"{rows} * {cols}"


def _order_text(facts) -> str:
    if facts[4] != OUTER_MAJOR:
        return ""
    return (f", outer-dim-major: scale (i, j) at j * roundup(M,{facts[2]}) + i" if facts[0] == 1 else
            ", the transposed tile grid")


def dispatch_flags(spec) -> int:
    """The C++ dispatcher's flag word: bit i for DESTINATIONS[i] used (i < 7), bit 7 for e5m2,
    bit 8 where its grouped calls take Python's binding of the kernels (csrc/dispatch.cc's
    State::groups_in_python): swizzled scales, whose padding Python clears, and FP8 block
    scaling, whose grouped calls its dispatcher does not bind (they take Python's binding of the
    grouped kernels; export(grouped=True) serves them compiled)."""
    bits = sum(1 << i for i, role in enumerate(DESTINATIONS[:-1]) if uses(spec, role))
    return bits | (spec.fp8 == "e5m2") << 7 | (spec.scale_layout == "swizzled" or spec.format == "fp8_block") << 8


def scale_facts(spec, tile_rows: int) -> tuple[int, ...]:
    """An op's facts for the C++ routes' size checks (csrc/scale_sizes.h's Facts, in its order):
    the rowwise and colwise scales' direction_facts, the scales' bits (E8M0 bytes: 8; fp32: 32)
    and the rows of one dbias partial sum (``tile_rows``: the kernels' tile,
    KernelConfig.tile_rows). Rendered into an exported library's check and passed to the native
    dispatcher; no C++ code states them again."""
    bits = 32 if spec.block_format.scale == "fp32" else 8
    return (*direction_facts(spec, False), *direction_facts(spec, True), bits, tile_rows)


__all__ = ["BLOCKED", "DESTINATIONS", "LAUNCH_OPERANDS", "OUTER_MAJOR", "OUTPUTS", "ROW_MAJOR", "Slot", "direction_facts",
           "dispatch_flags", "kernel_slots", "scale_facts", "scale_size_text", "uses"]
