"""MXFP8Tensor: what every mxq op returns (and what ``out=`` accepts).

A plain container of the output tensors plus the facts needed to read them back
(format, layout, logical shape). It owns no numerics beyond ``dequantize``, which decodes with
the same helpers as the reference so a round trip is exact wherever the format allows.

One class serves every format an op quantizes to: ``format`` says which ("mxfp8": E8M0 scale
bytes over 1x32 blocks; "fp8_block": fp32 scales over 1x128 or 128x128 blocks, ``block``;
"nvfp4" and "mxfp4": packed E2M1 data, mxq/formats/fp4_layouts.py), and the fields keep their
names and roles (docs/DESIGN.md says why one class).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass

import torch

from .formats import fp4, fp4_layouts, fp8_block, fp8_block_layouts, groups, layouts
from .kernels.config import UNIT
from .formats.numerics import BLOCK, FORMATS, e8m0_to_scale

# FP8 data rows of N % 8 != 0 (not a whole number of the kernels' 8-byte store units) are padded
# to a multiple of this many bytes by default: the leading dimension FP8 GEMMs take, and rows the
# kernels store whole units into (faster on the H200: docs/performance.md, "N % 8 != 0")
PADDED_ROW_BYTES = 16
# The kernels serve fewer elements than this (csrc/scale_sizes.h's kMaxElements, the C++ routes'),
# and M below MAX_ROWS (kMaxRows); runtime/limits.py asks it before a launch, MXFP8Tensor.empty of
# its padded rows
MAX_ELEMENTS = 2 ** 31
MAX_ROWS = MAX_ELEMENTS - 64


def default_row_align(shape, grouped: bool = False) -> int:
    """MXFP8Tensor.empty's row_align when none is given: PADDED_ROW_BYTES for outputs whose rows
    are not whole 8-byte units (N % 8 != 0), else 1 (contiguous). Grouped outputs and 0-d
    shapes are contiguous."""
    return PADDED_ROW_BYTES if len(shape) and shape[-1] % UNIT and not grouped else 1


def replicated_local(fn, buf, *args):
    """``fn(buf, *args)``, a scale buffer's layout conversion; a DTensor buffer replicated on every
    rank converted on its local tensor (the whole buffer: no collective) and wrapped back as one
    (torch's DTensor.view of a zero-size tensor never returns, torch 2.11: a replicated tensor's
    empty group or zero rows under swizzled scales)."""
    if not is_dtensor(buf):
        return fn(buf, *args)
    from torch.distributed.tensor import DTensor, Replicate

    if not all(isinstance(p, Replicate) for p in buf.placements):
        return fn(buf, *args)
    out = fn(buf.to_local(), *args)
    return DTensor.from_local(out, buf.device_mesh, buf.placements, run_check=False)


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor (a DTensor call's operand or field: mxq/integrations/distributed.py),
    without importing torch.distributed where nothing is distributed."""
    return type(t).__name__ == "DTensor"


def contiguous_stride(shape) -> tuple:
    """The strides of a contiguous tensor of ``shape`` (a DTensor's global layout, from_local's)."""
    stride, acc = [], 1
    for d in reversed(tuple(shape)):
        stride.append(acc)
        acc *= d
    return tuple(reversed(stride))


def flat_dims(shape) -> tuple[int, int]:
    """[M, N] of a tensor of any rank: N = last dim, M = product of the others (0-d: 1 x 1)."""
    if len(shape) == 0:
        return 1, 1
    m = 1
    for d in shape[:-1]:
        m *= d
    return m, shape[-1]


def data_rows(t: torch.Tensor, m: int, n: int) -> torch.Tensor | None:
    """FP8 data ``t`` (shape [..., n], m rows) as an [m, n] view, no copy: contiguous, or rows of
    unit stride that start at least n elements apart (MXFP8Tensor.empty(row_align=...)); None
    for any other layout."""
    if t.dim() == 0:
        return t.view(1, 1)
    if t.numel() and t.stride(-1) != 1 and n > 1:
        return None
    try:
        v = t if t.dim() == 2 else t.view(m, n)
    except RuntimeError:  # (leading dimensions that do not merge into rows)
        return None
    return v if m <= 1 or v.stride(0) >= n else None


_INPUT_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16))


def _checked_shape(shape) -> tuple:
    """MXFP8Tensor.empty's ``shape`` other than a torch.Size: a tuple or list of integers (ints,
    anything with __index__ such as numpy's, or torch.SymInt), each >= 0, as a tuple."""
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"mxq: MXFP8Tensor.empty() argument 'shape' must be a torch.Size or a tuple or list of ints, "
                        f"got {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, torch.SymInt):
            out.append(d)
            continue
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"mxq: MXFP8Tensor.empty() argument 'shape' must be a torch.Size or a tuple or list of "
                            f"ints, got {shape!r}")
        d = operator.index(d)
        if d < 0:
            raise ValueError(f"mxq: MXFP8Tensor.empty() argument 'shape' must hold sizes >= 0, got {tuple(shape)}")
        out.append(d)
    return tuple(out)


def grouped_gap(spec) -> str | None:
    """What of ``spec``'s outputs cannot be grouped (``group_offsets``), or None: FP4's rule
    (fp4_layouts.grouped_gap); FP8 block scaling's compact layout only (MXFP8Tensor.empty and
    validation.check_call say it after the argument's name)."""
    if spec.format in fp4.FORMATS:
        return fp4_layouts.grouped_gap(spec)
    if spec.format == "fp8_block" and spec.scale_layout == "gemm":
        return "does not go with scale_layout='gemm' (grouped FP8 block scaling is laid out compact; docs/NUMERICS.md)"
    return None


@dataclass(eq=False)  # (identity equality: its fields are tensors, whose == is element-wise)
class MXFP8Tensor:
    """A quantized tensor of any format (``format``: "mxfp8", "fp8_block", "nvfp4", "mxfp4"; the
    name is the first format's): the data and scales of each direction written (None where not),
    amax and dbias where the op makes them, and what decodes them (fp8, scale layout and mode,
    block, group ends). docs/NUMERICS.md draws every format's fields."""
    rowwise_data: torch.Tensor | None
    colwise_data: torch.Tensor | None
    rowwise_scale: torch.Tensor | None
    colwise_scale: torch.Tensor | None
    amax: torch.Tensor | None
    dbias: torch.Tensor | None
    fp8: str
    scale_layout: str
    shape: torch.Size
    group_offsets: torch.Tensor | None = None  # grouped colwise blocks (mxq/formats/groups.py)
    scale_mode: str | None = None  # the rule its scales were chosen by (None where not known)
    format: str = "mxfp8"  # "mxfp8", "fp8_block" (mxq/formats/fp8_block.py), "nvfp4" or "mxfp4" (fp4.py)
    block: tuple = (1, 32)  # the rowwise block (rows, columns) one scale covers
    # NVFP4 with hadamard=True: the global amax of the transformed colwise copy (``amax`` is the
    # rowwise one); its presence says the colwise copy holds the transform's values
    colwise_amax: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        """Its fields, for pickle and copy: not the route token an ``out=`` call leaves on it
        (launch.into_token, this process's own; a copy is checked again at its first call)."""
        state = dict(self.__dict__)
        state.pop("_mxq_into", None)
        return state

    @staticmethod
    def empty(spec, shape, dtype: torch.dtype, device, zeroed: bool = False,
              group_offsets: torch.Tensor | None = None, row_align: int | None = None) -> "MXFP8Tensor":
        """Outputs for ``spec``; swizzled scales, amax and dbias start zeroed (their padding and
        the amax reduction rely on it), data and compact scales are left uninitialised unless
        ``zeroed`` (what a noop call without ``out`` returns: nothing is written into it).
        With ``group_offsets`` (G groups): colwise scales are the [M // 32 + G, N] grouped buffer
        (zeroed: rows between groups stay 0) and dbias is [G, N].
        ``row_align``: the FP8 data's rows start a multiple of this many bytes apart (a power of
        two; e.g. 16, the leading dimension FP8 GEMMs take): the data tensors are then [.., N]
        views of rows padded to it (not contiguous when N is not a multiple), which the kernels
        write faster at N % 8 != 0 (docs/performance.md, "N % 8 != 0"). Not
        with ``group_offsets``. None (the default): 16 when N % 8 != 0, else 1 (contiguous;
        default_row_align); 1 asks for contiguous data at any N. A ``format="fp8_block"`` spec:
        fp32 scales shaped by mxq/formats/fp8_block_layouts.py (GEMM-ready ones are views of
        zeroed padded buffers) and, in its ``gemm`` layout, colwise data transposed, [N, M]
        contiguous (``row_align`` applies to the rowwise data). NVFP4 and MXFP4 (packed uint8 data,
        the colwise copy transposed; mxq/formats/fp4_layouts.py): contiguous data, ``row_align``
        must be left None or 1; grouped, compact colwise scales [N, M // B + G] and NVFP4's amax
        per group, [G]."""
        if not hasattr(spec, "scale_layout"):
            raise TypeError(f"mxq: MXFP8Tensor.empty() argument 'spec' must be a QuantSpec (e.g. op.spec), got "
                            f"{type(spec).__name__}")
        if not isinstance(zeroed, bool):  # (not __class__: torch 2.11's dynamo traces a bool's as another class)
            raise TypeError(f"mxq: MXFP8Tensor.empty() argument 'zeroed' must be a bool, got {type(zeroed).__name__}")
        if device.__class__ is not torch.device:
            if not isinstance(device, (str, int)) or isinstance(device, bool):
                raise TypeError(f"mxq: MXFP8Tensor.empty() argument 'device' must be a torch.device, a device string "
                                f"or an index, got {type(device).__name__}")
            try:
                device = torch.device(device)
            except RuntimeError as exc:
                raise ValueError(f"mxq: MXFP8Tensor.empty() argument 'device' must name a device, got {device!r} "
                                 f"({exc})") from None
        # (a tensor's shape, what the routes pass, needs no check but its sign: a torch.Size built by hand may
        # hold a negative; each size against 0 alone, so that symbolic sizes gain no guard relating them)
        if shape.__class__ is not torch.Size or any(d < 0 for d in shape):
            shape = _checked_shape(shape)
        if dtype not in _INPUT_DTYPES:
            raise TypeError(f"mxq: MXFP8Tensor.empty() argument 'dtype' (the input's: the dbias dtype) must be "
                            f"float32, float16 or bfloat16, got {dtype}")
        shape = torch.Size(shape)
        m, n = flat_dims(shape)
        if group_offsets is not None:
            groups.check_form(group_offsets)
            gap = grouped_gap(spec)
            if gap:
                raise ValueError(f"mxq: argument 'group_offsets' with format={spec.format!r} {gap}")
        if spec.format in fp4.FORMATS:
            if row_align not in (None, 1):
                raise ValueError(f"mxq: format={spec.format!r} outputs are contiguous: leave 'row_align' None")
            gap = fp4_layouts.packed_gap(spec, shape)
            if gap:
                raise ValueError(f"mxq: MXFP8Tensor.empty() argument 'shape': {gap}")
            g = None
            if group_offsets is not None:
                group_offsets, g = group_offsets.clone(), group_offsets.numel()  # (the caller may reuse its tensor)
            fields = fp4_layouts.outputs(spec, shape, m, n, device, zeroed, g)
            return MXFP8Tensor(
                **{f: fields[f] for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale")},
                amax=fields["amax"] if fields["amax"] is not None else (
                    torch.zeros((), dtype=torch.float32, device=device) if spec.amax else None),
                dbias=torch.zeros((n,) if g is None else (g, n), dtype=dtype, device=device) if spec.dbias else None,
                fp8=spec.fp8, scale_layout=spec.scale_layout, shape=shape, group_offsets=group_offsets,
                scale_mode=spec.scale_mode, format=spec.format, block=spec.block, colwise_amax=fields["colwise_amax"])
        if row_align is None:
            row_align = default_row_align(shape, group_offsets is not None)
        if isinstance(row_align, bool) or not isinstance(row_align, int) or row_align < 1 or row_align & (row_align - 1):
            raise ValueError(f"mxq: argument 'row_align' must be a power of two, got {row_align!r}")
        if row_align > 1 and group_offsets is not None:
            raise ValueError("mxq: argument 'row_align' does not go with 'group_offsets' (grouped outputs are contiguous)")
        npad = -(-n // row_align) * row_align if len(shape) else n  # (a 0-d tensor: one element, no rows)
        if npad > n and m * npad >= MAX_ELEMENTS:
            raise ValueError(f"mxq: argument 'row_align' = {row_align} pads {m} rows of {n} bytes to {npad}: "
                             f"{m * npad} bytes, more than the kernels serve (2^31)")
        fp8 = FORMATS[spec.fp8].torch_dtype
        if group_offsets is not None:
            group_offsets = group_offsets.clone()  # (the caller may reuse its tensor)
        swizzled = spec.scale_layout == "swizzled"
        scale_alloc = torch.zeros if zeroed or swizzled else torch.empty
        data_alloc = torch.zeros if zeroed else torch.empty
        row_shape = layouts.rowwise_scale_shape(m, n, spec.scale_layout)
        col_shape, col_alloc = layouts.colwise_scale_shape(m, n, spec.scale_layout), scale_alloc
        dbias_shape = (n,)
        if group_offsets is not None:  # grouped buffers sized by M, N and G (mxq/formats/groups.py)
            g = group_offsets.numel()
            if swizzled:
                row_shape = (groups.swizzled_rowwise_rows(m, g), row_shape[1])
                col_shape = (groups.swizzled_colwise_rows(m, g), col_shape[1])
            else:
                col_shape = (groups.grouped_colwise_rows(m, g), n)
            col_alloc = torch.zeros  # rows between groups stay 0
            dbias_shape = (g, n)

        def data():
            if npad == n:
                return data_alloc(shape, dtype=fp8, device=device)
            # rows of npad bytes, their first n viewed as the data's shape (leading dimensions split from the rows)
            return data_alloc((m, npad), dtype=fp8, device=device)[:, :n].view(shape)

        if spec.format == "fp8_block":  # fp32 scales (mxq/formats/fp8_block_layouts.py)
            g = None if group_offsets is None else group_offsets.numel()
            row_scale, col_scale = fp8_block_layouts.scales(spec, m, n, device, zeroed, g)
            col_data = fp8_block_layouts.colwise_data(spec, m, n, device, zeroed)
        else:
            row_scale = scale_alloc(row_shape, dtype=torch.uint8, device=device) if spec.rowwise else None
            col_scale = col_alloc(col_shape, dtype=torch.uint8, device=device) if spec.colwise else None
            col_data = None
        return MXFP8Tensor(
            rowwise_data=data() if spec.rowwise else None,
            colwise_data=(data() if col_data is None else col_data) if spec.colwise else None,
            rowwise_scale=row_scale,
            colwise_scale=col_scale,
            amax=torch.zeros((), dtype=torch.float32, device=device) if spec.amax else None,
            dbias=torch.zeros(dbias_shape, dtype=dtype, device=device) if spec.dbias else None,
            fp8=spec.fp8,
            scale_layout=spec.scale_layout,
            shape=shape,
            group_offsets=group_offsets,
            scale_mode=spec.scale_mode,
            format=spec.format,
            block=spec.block,
        )

    def label(self, spec, group_offsets=None, noop=None) -> "MXFP8Tensor":
        """This ``out=`` buffer described as what a call of ``spec`` writes into it (every route
        that takes ``out`` calls this): the spec's scale_mode, no ``colwise_amax`` unless the op's
        Hadamard transform writes one (its presence says the colwise copy holds transformed
        values, which ``dequantize`` reads by it), and the call's group ends (a copy, as
        ``empty`` keeps; None for an ungrouped call). With ``noop`` (a device value: nothing is
        written where it holds 1) the ends are chosen on the device, the old ones kept where
        nothing was written; the other two, and the grouping (none, or as many groups), must
        already be the call's (validation.check_out).
        Returns ``self``."""
        if not hasattr(spec, "hadamard"):
            raise TypeError(f"mxq: MXFP8Tensor.label() argument 'spec' must be a QuantSpec (e.g. op.spec), got "
                            f"{type(spec).__name__}")
        if group_offsets is not None and not isinstance(group_offsets, torch.Tensor):
            groups.check_form(group_offsets)  # (names it: a list has no .clone())
        self.scale_mode = spec.scale_mode
        if not spec.hadamard:
            self.colwise_amax = None
        old = self.group_offsets
        if group_offsets is None:
            self.group_offsets = None
        elif noop is None or old is None or old.shape != group_offsets.shape:
            self.group_offsets = group_offsets.clone()
        else:  # (as op.prepare's grouped launches: launch.grouped_relaunch)
            self.group_offsets = torch.where(noop.reshape(()) == 1.0, old, group_offsets.to(old.dtype))
        return self

    def compact_scale(self, direction: str = "rowwise") -> torch.Tensor:
        """The scale bytes in compact layout ([M, ceil(N/32)] rowwise, [ceil(M/32), N] colwise;
        fp8_block: its fp32 scales over [M, N], docs/NUMERICS.md). A grouped tensor's colwise
        scales are per group: ``group(g).compact_scale(...)``."""
        if direction not in ("rowwise", "colwise"):
            raise ValueError(f"mxq: direction must be 'rowwise' or 'colwise', got {direction!r}")
        scale = self._need(f"{direction}_scale")  # (a tensor without them is told so before any grouped advice)
        if self.format == "fp8_block":
            return self._block_scale(direction)
        m, n = flat_dims(self.shape)
        if self.format in fp4.FORMATS:  # the scales of the rowwise data [M, N] or the colwise copy [N, M]
            if self.group_offsets is not None and direction == "colwise":
                raise ValueError("mxq: a grouped tensor's colwise scales are per group: use group(g).compact_scale()")
            rows, cols = fp4_layouts.operand_dims(direction, m, n)
            return replicated_local(fp4_layouts.compact, scale, rows, cols, self.format, self.scale_layout)
        if self.group_offsets is not None and (direction == "colwise" or self.scale_layout != "compact"):
            if direction == "rowwise":
                return torch.cat([t.compact_scale("rowwise") for t in self._groups()])
            raise ValueError("mxq: a grouped tensor's colwise scales are per group: use group(g).compact_scale()")
        if direction == "rowwise":
            return replicated_local(layouts.compact_rowwise, scale, m, n, self.scale_layout)
        return replicated_local(layouts.compact_colwise, scale, m, n, self.scale_layout)

    def dequantize(self, direction: str | None = None) -> torch.Tensor:
        """Decode to float32 of the original shape: data * 2^(scale-127); scale 255 gives NaN
        (fp8_block: data times its block's fp32 scale, one fp32 rounding; NVFP4 and MXFP4:
        docs/NUMERICS.md's decode, the colwise copy transposed back to the original shape).
        ``direction``: "rowwise" or "colwise"; None takes rowwise data where there is some,
        else colwise."""
        if direction is None:
            direction = "rowwise" if self.rowwise_data is not None else "colwise"
        if direction not in ("rowwise", "colwise"):
            raise ValueError(f"mxq: direction must be 'rowwise' or 'colwise', got {direction!r}")
        m, n = flat_dims(self.shape)
        data = self._need(f"{direction}_data")
        if is_dtensor(data):
            # each rank decodes its own fields, no collective: a rank's shard is quantized alone and
            # no block crosses a shard's edge (integrations/distributed.py), so its local fields are
            # the result of its local input (_local_input). (Decoding the DTensors themselves fails
            # where the split dim holds one block, and DTensor's view of a zero-size tensor, an
            # empty group's, never returns.)
            from torch.distributed.tensor import DTensor

            fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            local = dataclasses.replace(self, **{k: v.to_local() for k, v in fields.items() if is_dtensor(v)})
            local.shape, placements = self._local_input(local)
            return DTensor.from_local(local.dequantize(direction), data.device_mesh, placements, run_check=False,
                                      shape=self.shape, stride=contiguous_stride(self.shape))
        if self.format in fp4.FORMATS and self.group_offsets is None:
            return self._fp4_values(direction).reshape(self.shape)
        per_group = (self.scale_layout != "compact" or direction == "colwise" or self.block[0] > 1
                     or self.format in fp4.FORMATS)
        if self.group_offsets is not None and per_group:
            parts = [t.dequantize(direction).reshape(t.shape[0], n) for t in self._groups()]
            return torch.cat(parts).reshape(self.shape)
        if self.format == "fp8_block":
            if self._transposed(direction):
                data = data.t()
            block = self.block if direction == "rowwise" else fp8_block_layouts.colwise_block(self.block)
            return fp8_block.dequantize(data.reshape(m, n), self.compact_scale(direction), block).reshape(self.shape)
        data = data.reshape(m, n).to(torch.float32)
        scale = e8m0_to_scale(self.compact_scale(direction))
        if direction == "rowwise":
            full = scale.repeat_interleave(BLOCK, dim=1)[:, :n]
        else:
            full = scale.repeat_interleave(BLOCK, dim=0)[:m, :]
        return (data * full).reshape(self.shape)

    def _local_input(self, local: "MXFP8Tensor") -> tuple:
        """(the shape of a rank's local input, the input's placements) of a DTensor call's result,
        from ``local``, its fields on this rank: rowwise data keeps the input's leading dims (FP4's
        packed [..., N/2]); a transposed colwise copy (FP4's [N, M/2], FP8 block scaling's gemm
        layout [N, M]) is split along the input's other dim (integrations/distributed.py)."""
        from torch.distributed.tensor import Shard

        per_byte = 2 if self.format in fp4.FORMATS else 1  # (FP4: two codes a byte)
        if self.rowwise_data is not None:
            rd = local.rowwise_data
            return torch.Size((*rd.shape[:-1], per_byte * rd.shape[-1])), self.rowwise_data.placements
        cd, (p,) = local.colwise_data, self.colwise_data.placements
        if per_byte == 1 and not self._transposed("colwise"):  # (the colwise copy of the input's shape)
            return cd.shape, self.colwise_data.placements
        if not isinstance(p, Shard):  # (replicated: the whole input on every rank)
            return self.shape, self.colwise_data.placements
        if p.dim == 0:  # (the copy's rows: the input's columns split)
            return torch.Size((*self.shape[:-1], cd.shape[0])), (Shard(len(self.shape) - 1),)
        lead = math.prod(self.shape[1:-1]) or 1  # (the copy's columns: the input's rows split, along its dim 0)
        return torch.Size((per_byte * cd.shape[1] // lead, *self.shape[1:-1], self.shape[-1])), (Shard(0),)

    def group(self, g: int) -> "MXFP8Tensor":
        """Group g of a grouped tensor (rows [start_g, end_g) after flattening) as an MXFP8Tensor
        with compact scales: byte-equal to quantizing those rows alone with the same options
        (amax, which covers the whole tensor, is not part of it; dbias is row g)."""
        if self.group_offsets is None:
            raise ValueError("mxq: group() needs a tensor quantized with group_offsets")
        bnds = groups.bounds(self.group_offsets)
        if isinstance(g, torch.Tensor) and g.dim() != 0:  # (torch's __index__ takes a 1-element tensor too)
            raise TypeError(f"mxq: group index must be an int in [0, {len(bnds)}), got a tensor of shape "
                            f"{tuple(g.shape)}")
        if not isinstance(g, bool) and hasattr(g, "__index__"):  # (an int, numpy's ints, a 0-d int tensor)
            try:
                g = operator.index(g)
            except TypeError:
                pass
        if not isinstance(g, int) or isinstance(g, bool):
            raise TypeError(f"mxq: group index must be an int in [0, {len(bnds)}), got {type(g).__name__}")
        if not 0 <= g < len(bnds):
            raise ValueError(f"mxq: group index must be an int in [0, {len(bnds)}), got {g!r}")
        return self._group(g, bnds)

    def _groups(self) -> list["MXFP8Tensor"]:
        """[group(g) for every g], the group ends read from the device once (not once per group:
        65535 groups decode in seconds, not hours)."""
        bnds = groups.bounds(self.group_offsets)
        starts = groups.swizzled_starts(bnds) if self.scale_layout == "swizzled" else None
        return [self._group(g, bnds, starts) for g in range(len(bnds))]

    def _group(self, g: int, bnds, starts=None) -> "MXFP8Tensor":
        """group(g) of the groups' bounds ``bnds`` (and, swizzled, their ``starts``,
        groups.swizzled_starts; computed here when not given)."""
        start, end = bnds[g]
        m, n = flat_dims(self.shape)
        mg, nb = end - start, layouts.cdiv(end - start, BLOCK)
        rows = lambda t: t.reshape(m, n)[start:end] if t is not None else None  # noqa: E731
        row_scale = col_scale = None
        if self.format in fp4.FORMATS:
            return self._fp4_group(g, start, end)
        if self.format == "fp8_block":  # (compact: grouped calls refuse the gemm layout)
            first, nb = fp8_block_layouts.first_block_row(g, start), layouts.cdiv(mg, fp8_block.BLOCK)
            if self.rowwise_scale is not None:
                row_scale = self.rowwise_scale[first:first + nb] if self.block[0] > 1 else self.rowwise_scale[start:end]
            if self.colwise_scale is not None:
                col_scale = self.colwise_scale[first:first + nb]
        elif self.scale_layout == "compact":
            if self.rowwise_scale is not None:
                row_scale = self.rowwise_scale[start:end]
            if self.colwise_scale is not None:
                first = groups.first_block_row(g, start)
                col_scale = self.colwise_scale[first:first + nb]
        else:  # this group's own blocked region, back to compact
            row_starts, col_starts = starts if starts is not None else groups.swizzled_starts(bnds)
            if self.rowwise_scale is not None:
                r0 = row_starts[g]
                region = self.rowwise_scale[r0:r0 + layouts.roundup(mg, 128)]
                row_scale = replicated_local(layouts.compact_rowwise, region, mg, n, "swizzled")
            if self.colwise_scale is not None:
                c0 = col_starts[g]
                region = self.colwise_scale[c0:c0 + layouts.roundup(nb, 4)]
                col_scale = replicated_local(layouts.compact_colwise, region, mg, n, "swizzled")
        return MXFP8Tensor(rows(self.rowwise_data), rows(self.colwise_data), row_scale, col_scale, None,
                           self.dbias[g] if self.dbias is not None else None, self.fp8, "compact",
                           torch.Size((mg, n)), scale_mode=self.scale_mode, format=self.format, block=self.block)

    def _fp4_group(self, g: int, start: int, end: int) -> "MXFP8Tensor":
        """group(g) of a grouped NVFP4 / MXFP4 tensor (mxq/formats/fp4_layouts.py): its rows of the
        rowwise data and scales, its columns [start / 2, end / 2) of the colwise copy and its
        colwise blocks, NVFP4's amax its own (MXFP4's amax=True covers the whole tensor: left out)."""
        m, n = flat_dims(self.shape)
        mg = end - start
        row_data = self.rowwise_data.reshape(m, n // 2)[start:end] if self.rowwise_data is not None else None
        row_scale = self.rowwise_scale[start:end] if self.rowwise_scale is not None else None
        col_data = col_scale = None
        if self.colwise_data is not None:
            col_data = self.colwise_data[:, start // 2:end // 2]
            first = fp4_layouts.first_colwise_block(g, start, self.format)
            col_scale = self.colwise_scale[:, first:first + layouts.cdiv(mg, fp4.BLOCKS[self.format])]
        amax = self.amax[g] if self.format == "nvfp4" else None
        return MXFP8Tensor(row_data, col_data, row_scale, col_scale, amax,
                           self.dbias[g] if self.dbias is not None else None, self.fp8, "compact",
                           torch.Size((mg, n)), scale_mode=self.scale_mode, format=self.format, block=self.block)

    def _fp4_values(self, direction: str) -> torch.Tensor:
        """dequantize() of an NVFP4 / MXFP4 tensor as [M, N] fp32 (the colwise copy transposed
        back; with the Hadamard transform, the transformed values: mxq/formats/fp4.py)."""
        m, n = flat_dims(self.shape)
        rows, cols = fp4_layouts.operand_dims(direction, m, n)
        data = self._need(f"{direction}_data").reshape(rows, cols // 2)
        scale = self.compact_scale(direction)
        if self.format == "mxfp4":
            values = fp4.dequantize_mxfp4(data, scale)
        else:
            amax = self.colwise_amax if direction == "colwise" and self.colwise_amax is not None else self.amax
            values = fp4.dequantize_nvfp4(data, scale, self._need("amax") if amax is None else amax)
        return values if direction == "rowwise" else values.t()

    def _block_scale(self, direction: str) -> torch.Tensor:
        """compact_scale of an fp8_block tensor: its fp32 scale grid over [M, N] (a view)."""
        if self.group_offsets is not None and (direction == "colwise" or self.block[0] > 1):
            raise ValueError(f"mxq: a grouped tensor's {direction} scales are per group: use "
                             "group(g).compact_scale()")
        scale = self._need(f"{direction}_scale")
        return scale.t() if self._transposed(direction) else scale

    def _transposed(self, direction: str) -> bool:
        """Whether an fp8_block tensor's ``direction`` data and scales are the GEMM-ready
        transposed copy ([N, M] data, its scales transposed likewise: QuantSpec.colwise_transposed)."""
        return direction == "colwise" and self.format == "fp8_block" and self.scale_layout == "gemm"

    def _need(self, name: str) -> torch.Tensor:
        """Field ``name`` (a data, scale or amax field), which must be there and hold its format's
        dtype (_field_dtype): bytes of another dtype, e.g. float8 fields viewed as uint8 to cross
        gloo, would decode as other values."""
        t = getattr(self, name)
        if t is None:
            raise ValueError(f"mxq: this MXFP8Tensor has no {name} (quantize with "
                             f"{name.split('_')[0]}=True)")
        want = self._field_dtype(name)
        if t.dtype != want:
            if name.endswith("_data") and t.dtype.is_floating_point and want.is_floating_point:  # (two FP8s)
                raise ValueError(f"mxq: this MXFP8Tensor's {name} holds {t.dtype}, but its fp8={self.fp8!r} says "
                                 f"{want}: the description disagrees with the data")
            raise ValueError(f"mxq: this MXFP8Tensor's {name} must be {want} for format={self.format!r}, got "
                             f"{t.dtype} (bytes viewed as another dtype: view them back, .view({want}))")
        return t

    def _field_dtype(self, name: str) -> torch.dtype:
        """The dtype data, scale or amax field ``name`` holds in this tensor's format: FP8 data of
        its ``fp8`` (FP4's packed codes uint8); E8M0 scale bytes uint8, FP8 block scaling's fp32
        scales, NVFP4's E4M3 scales (fp4_layouts.scale_dtype); amax fp32."""
        fp4_format = self.format in fp4.FORMATS
        if name.endswith("amax"):
            return torch.float32
        if name.endswith("_data"):
            return torch.uint8 if fp4_format else FORMATS[self.fp8].torch_dtype
        if fp4_format:
            return fp4_layouts.scale_dtype(self.format)
        return torch.float32 if self.format == "fp8_block" else torch.uint8

    def __repr__(self) -> str:
        have = [k for k in ("rowwise_data", "colwise_data", "amax", "colwise_amax", "dbias")
                if getattr(self, k) is not None]
        fmt = "" if self.format == "mxfp8" else f"format={self.format!r}, block={self.block!r}, "
        fp8 = "" if self.format in fp4.FORMATS else f"fp8={self.fp8!r}, "  # (FP4's element is E2M1 whatever fp8 says)
        grouped = "" if self.group_offsets is None else f", groups={self.group_offsets.numel()}"
        return (f"MXFP8Tensor(shape={tuple(self.shape)}, {fmt}{fp8}scale_layout={self.scale_layout!r}, "
                f"scale_mode={self.scale_mode!r}, has={have}{grouped})")


# torch.load (weights_only=True, torch's default since 2.6) rebuilds only allow-listed classes.
# An MXFP8Tensor is tensors, strings and a torch.Size, and unpickling one runs no code of ours
# (a dataclass without __setstate__), so saved MXFP8Tensors load back with the default.
torch.serialization.add_safe_globals([MXFP8Tensor])
