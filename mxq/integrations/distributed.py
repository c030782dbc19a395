"""Several processes: DTensor inputs (each rank quantizes its local shard; no communication but
NVFP4's amax all-reduce) and ``all_gather`` of MXFP8Tensors of every format.

``mxq.quantize`` and decorated ops accept DTensors on a 1-D device mesh with one placement:

| input placement | data | rowwise scales | colwise scales | amax | dbias |
|---|---|---|---|---|---|
| Replicate() | Replicate | Replicate | Replicate | Replicate | Replicate |
| Shard(0) (rows) | Shard(0) | Shard(0) | Shard(0) | Partial("max") (NVFP4: Replicate) | Partial("sum") |
| Shard(-1) (columns) | Shard(-1) | Shard(1) | Shard(1) | Partial("max") (NVFP4: Replicate) | Shard(0) |

A shard boundary that would cut a block is an error naming the placement: with Shard(0), every
rank's first row (after flattening) must be a multiple of the blocks' rows when the op writes
blocks spanning rows (MXFP8's colwise blocks: 32; FP8 block scaling's colwise blocks and
128x128 tiles: 128; NVFP4's colwise blocks and 16x16 tiles: 16; MXFP4's colwise blocks: 32);
with Shard(-1), every rank's first column a multiple of the blocks' columns when it writes
blocks spanning columns (MXFP8's and MXFP4's rowwise blocks: 32; FP8 block scaling's 1x128
blocks and tiles: 128; NVFP4's: 16). Scales are compact only (swizzled tiles span 128 rows; FP8
block scaling's GEMM-ready scales are padded over all rows); a 128x128 op's one scale grid
[ceil(M/128), ceil(N/128)] serves both directions and is split like the data.

NVFP4 and MXFP4: the packed data [M, N/2] and the transposed colwise copy [N, M/2] (and their
scales [M, ceil(N/B)], [N, ceil(M/B)]) are split along the input's split dim (a row split splits
the colwise copy's columns). NVFP4's per-tensor amax is the whole tensor's, so a split call
quantizes its shard twice: once for the shard's amax, then, after an all-reduce (max) of the
ranks' amaxes, with that as ``global_amax`` (one quantize where ``global_amax`` is given, which
must be the same on every rank: not checked, a collective); its amax field, equal on every rank,
is Replicate(). Stochastic rounding (whose
random words follow the element's place in the whole tensor) and the Hadamard transform are
refused, and so is an NVFP4 split without ``global_amax`` under torch.compile (the all-reduce is
eager). The other tensor operands must have the same placement (or be plain tensors broadcast
against the local shard); ``act_input`` likewise. A Partial("sum") dbias reduces the ranks'
sums, each rounded to the dbias dtype: the roundings add, so it is not within the dbias class of
docs/NUMERICS.md of the single-device value where the ranks' sums cancel (a bf16 column summing
to 2^-6 over two ranks can come back 0).

Row groups (``group_offsets``, a plain or replicated tensor) go with Shard(-1) and Replicate():
every rank holds every row and runs the groups on its columns; the grouped colwise scales [M //
32 + G, N] and dbias [G, N] are Shard(1) under a column split. A row split is refused.

Under torch.compile the same code traces (FusedOp._route: the torch operator on the local
shards; DTensor.from_local around its outputs), so a compiled DTensor call has no graph break.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from ..formats import fp4, fp8_block, numerics
from ..runtime import validation
from ..tensor import MXFP8Tensor, contiguous_stride, flat_dims


def _name(p) -> str:
    """A placement as a user writes it: Shard(0), Replicate(), Partial()."""
    if isinstance(p, Shard):  # (int(): torch.compile may trace p.dim as a symbol, which dynamo cannot format)
        return f"Shard({int(p.dim)})"
    return f"{type(p).__name__}()"


def _placement(x: DTensor, name: str):
    mesh = x.device_mesh
    if mesh.ndim != 1 or len(x.placements) != 1:
        raise ValueError(f"mxq: argument {name!r} must live on a 1-D device mesh with one placement, got "
                         f"placements {x.placements}")
    p = x.placements[0]
    if isinstance(p, Shard):
        # (the dims returned are constants, not p.dim: torch.compile may trace p.dim as a symbol)
        dim = p.dim % x.dim()
        if dim == 0 and x.dim() > 1:
            return mesh, "rows", 0
        if dim == x.dim() - 1:
            return mesh, "cols", x.dim() - 1
        raise ValueError(f"mxq: placement Shard({p.dim}) splits neither the rows (Shard(0)) nor the "
                         "columns (Shard(-1)) of the input")
    if isinstance(p, Replicate):
        return mesh, "replicate", None
    raise ValueError(f"mxq: argument {name!r} must be Shard or Replicate, got {_name(p)}")


def _edge(fmt: str) -> int:
    """Elements a scale covers along its block's long side: MXFP8's and MXFP4's 32, FP8 block
    scaling's 128, NVFP4's 16."""
    return {"fp8_block": fp8_block.BLOCK, **fp4.BLOCKS}.get(fmt, numerics.BLOCK)


def _tiles(fmt: str, block: tuple) -> bool:
    """FP8 block scaling's 128x128 tiles (one scale grid for both directions, spanning rows and
    columns) and NVFP4's 16x16 ones (block_2d): blocks spanning rows and columns."""
    return fmt in ("fp8_block", "nvfp4") and block[0] > 1


def _spans(spec) -> tuple:
    """(rows, columns) a row split / a column split must keep whole: the blocks spanning rows
    and those spanning columns that ``spec`` writes (0: none)."""
    edge, tiles = _edge(spec.format), _tiles(spec.format, spec.block)
    return (edge if spec.colwise or tiles else 0), (edge if spec.rowwise or tiles else 0)


def share(size: int, world: int, rank: int):
    """Rank ``rank``'s share of ``size`` elements split evenly over ``world`` ranks, as DTensor and
    FSDP2 split a dimension: ceil(size / world) a rank, the last ones what is left (0 past the end)."""
    chunk = -(-size // world)
    return min(chunk, max(0, size - rank * chunk))


def even_split(size: int, world: int) -> list:
    """Every rank's share (``share``): what every rank computes alike, so that a refusal judged
    from it is every rank's."""
    return [share(size, world, r) for r in range(world)]


def _uneven(x: DTensor, kind: str, dim):
    """This rank's refusal of a shard other than DTensor's even split gives it (a from_local of
    other sizes), or None. Judged from this rank's shard alone: another rank may hold the size the
    split gives it and accept (call: where the ranks then meet in a collective, the refusal joins
    it, so that none waits there)."""
    if kind == "replicate":
        return None
    size, world, coord = x.shape[dim], x.device_mesh.size(), x.device_mesh.get_coordinate()
    if coord is None:
        return None
    want, got = share(size, world, coord[0]), x.to_local().shape[dim]
    if got == want:
        return None
    return ValueError(f"mxq: placement {_name(x.placements[0])}: this rank's shard holds {got} of the {size} "
                      f"{'rows' if kind == 'rows' else 'columns'} where DTensor's even split over {world} ranks "
                      f"gives it {want} (uneven shards, as DTensor.from_local(..., shape=...) makes, are not "
                      "supported: the blocks would be placed by the even split)")


def _check_blocks(spec, x: DTensor, kind: str, dim):
    """Refuse a split that cuts a block (each rank's first row / column), judged from the global
    shape alone: every rank refuses the same call."""
    if kind == "replicate":
        return
    if spec.scale_layout != "compact":
        raise ValueError(f"mxq: placement {_name(x.placements[0])} needs scale_layout='compact' (swizzled tiles span "
                         "128 rows of scales, GEMM-ready ones are padded over all rows)")
    size = x.shape[dim]
    world = x.device_mesh.size()
    chunk = -(-size // world)  # (DTensor's even split: share)
    per_index = 1
    if kind == "rows":
        for d in x.shape[1:-1]:
            per_index *= d
    if kind == "rows" and x.dim() > 2 and size % world:
        raise ValueError(f"mxq: placement {_name(x.placements[0])} of a {x.dim()}-D input needs its first dimension "
                         f"({int(size)}) to divide evenly over the {world} ranks (the flattened rows of the shards "
                         "must be DTensor's even split of M)")
    if spec.format in fp4.FORMATS and (kind == "cols" or spec.colwise):
        # (two E2M1 codes a byte along the columns, and along the rows for the colwise copy: every rank's
        # shard even, judged from the global shape, so that every rank refuses the same call)
        sizes = [c * per_index for c in even_split(size, world)]
        odd = next((c for c in sizes if c % 2), None)
        if odd is not None:
            what = "columns" if kind == "cols" else "rows"
            raise ValueError(f"mxq: placement {_name(x.placements[0])} leaves a rank {int(odd)} {what}, which "
                             f"format={spec.format!r} cannot pack two to a byte (DTensor's even split of "
                             f"{int(size)} over {world} ranks: {[int(c) for c in sizes]}); use a split whose "
                             "shards are even")
    span = _spans(spec)[0 if kind == "rows" else 1]
    if span and world > 1 and (chunk * per_index) % span and chunk < size:
        what = "rows" if kind == "rows" else "columns"
        blocks = ("x".join(map(str, spec.block)) if _tiles(spec.format, spec.block) else "colwise" if kind == "rows"
                  else "rowwise")
        # (int(): under torch.compile with dynamic shapes the sizes are symbols, which dynamo cannot format)
        raise ValueError(f"mxq: placement {_name(x.placements[0])} cuts a {span}-element block: each rank holds "
                         f"{int(chunk * per_index)} {what} (a multiple of {span} is needed for {blocks} blocks)")


def _local(t, mesh, kind, x, name):
    """An operand's local shard: a DTensor on the first input's mesh split the same way (``kind``:
    "rows", "cols" or "replicate", as _placement reads it: a bias [N] split by Shard(0) splits the
    columns), along a dimension it holds whole (a broadcast one, of size 1, would leave a rank no
    values). Judged from global shapes and placements alone, so every rank refuses the same call."""
    if not isinstance(t, DTensor):
        return t
    if t.device_mesh != mesh or len(t.placements) != 1:
        raise ValueError(f"mxq: argument {name!r} is on another device mesh than the first input's")
    if isinstance(t.placements[0], Partial):
        raise ValueError(f"mxq: argument {name!r} must be Shard or Replicate, got {_name(t.placements[0])}")
    _, got, _ = _placement(t, name)
    if got != kind:
        raise ValueError(f"mxq: argument {name!r} has placements {t.placements}, which split "
                         f"{'nothing' if got == 'replicate' else 'the ' + got}, but the first input's split "
                         f"{'nothing' if kind == 'replicate' else 'the ' + kind}")
    axis = {"rows": 0, "cols": -1}.get(got)  # (the split axis in both: an operand's dims align from the last)
    if axis is not None and t.shape[axis] != x.shape[axis]:
        raise ValueError(f"mxq: argument {name!r} of shape {tuple(t.shape)} is split along a dimension it "
                         f"broadcasts ({t.shape[axis]} against the first input's {x.shape[axis]}): pass it "
                         "Replicate() or as a plain tensor")
    return t.to_local()


def call(op, call) -> MXFP8Tensor:
    """Run ``op`` on the local shards of ``call``'s DTensor inputs (a mxq/runtime/call.py Call)
    and wrap its outputs (of ``op.output_shape``) as DTensors. A gated op's halves lie along the
    columns: it takes row splits and replicas only. ``group_offsets`` (row groups) go with column
    splits and replicas: every rank holds every row, so each runs the groups on its columns."""
    tensors, scalars, act_input, noop, out, group_offsets, _ = call
    x = tensors[0]
    if not isinstance(x, DTensor):
        if isinstance(group_offsets, DTensor) and not any(isinstance(t, DTensor) for t in (*tensors, act_input)):
            raise TypeError("mxq: argument 'group_offsets' is a DTensor but the inputs are plain tensors: pass it "
                            "as a plain tensor")
        raise TypeError("mxq: with DTensor operands, the first tensor input must be a DTensor too")
    packed = op.spec.format in fp4.FORMATS
    for name in ("stochastic_rounding", "hadamard"):
        if packed and getattr(op.spec, name):
            raise ValueError(f"mxq: DTensor inputs with {name}=True are not supported (its values follow each "
                             "element's place in the whole tensor); pass the full tensor")
    if out is not None:
        raise ValueError("mxq: out= is not supported with DTensor inputs")
    mesh, kind, dim = _placement(x, op.epilogue.tensor_params[0])
    placement = x.placements[0]
    spec = op.spec
    if spec.gated and group_offsets is not None and kind != "replicate":
        raise ValueError(f"mxq: group_offsets with placement {_name(placement)}: a gated op's halves lie along the "
                         "columns and its groups along the rows, so it takes Replicate() inputs only")
    if spec.gated and kind == "cols":
        raise ValueError(f"mxq: placement {_name(placement)} splits the columns, which hold a gated op's two halves; "
                         "use Shard(0) or Replicate()")
    _check_blocks(spec, x, kind, dim)
    # (an NVFP4 split meets the other ranks in its amax all-reduce: its refusal joins it there)
    meets = spec.format == "nvfp4" and kind != "replicate" and (call.fp4 is None or call.fp4.global_amax is None)
    uneven = _uneven(x, kind, dim)
    if uneven is not None and not meets:
        raise uneven
    if group_offsets is not None:
        if packed:
            raise ValueError(f"mxq: group_offsets with DTensor inputs and format={spec.format!r} are not supported "
                             "yet; quantize each rank's local tensor (.to_local()) with the groups")
        if kind == "rows":
            raise ValueError(f"mxq: group_offsets with placement {_name(placement)}: the groups run along the rows, "
                             "which the ranks split; use Shard(-1) or Replicate()")
        if isinstance(group_offsets, DTensor):
            if group_offsets.placements != (Replicate(),):
                raise ValueError(f"mxq: argument 'group_offsets' must be a plain tensor or replicated, got "
                                 f"placements {group_offsets.placements}")
            group_offsets = group_offsets.to_local()
    names = list(op.epilogue.tensor_params)
    local = [_local(t, mesh, kind, x, n) for t, n in zip(tensors, names)]
    act = _local(act_input, mesh, kind, x, "act_input") if act_input is not None else None
    if isinstance(noop, DTensor):
        if noop.placements != (Replicate(),):  # (a split one-element flag leaves a rank none)
            raise ValueError(f"mxq: argument 'noop' must be a plain tensor or replicated, got placements "
                             f"{noop.placements}")
        noop = noop.to_local()
    # contiguous FP8 data (not the padded rows of N % 8 != 0): the DTensors below state a
    # contiguous global layout, which a shard's padded rows would not match (FP4's packed data
    # always is: those calls allocate their own, as torch.compile traces them without out=)
    x0 = local[0]
    validation.check_dtype(names[0], x0)  # (named before MXFP8Tensor.empty takes x's dtype for the dbias)
    out = None if packed else MXFP8Tensor.empty(spec, op.output_shape(x0.shape), x0.dtype, x0.device,
                                                zeroed=noop is not None, row_align=1, group_offsets=group_offsets)
    fp4_args = call.fp4
    if fp4_args is not None and isinstance(fp4_args.global_amax, DTensor):
        if fp4_args.global_amax.placements != (Replicate(),):
            raise ValueError(f"mxq: argument 'global_amax' must be a plain tensor, a float or replicated, got "
                             f"placements {fp4_args.global_amax.placements}")
        fp4_args = fp4_args._replace(global_amax=fp4_args.global_amax.to_local())
    lowered = call._replace(tensors=local, act_input=act, noop=noop, out=out, group_offsets=group_offsets, fp4=fp4_args)
    if meets:
        lowered = _whole_amax(op, lowered, mesh, placement, uneven)
    t = op._route(lowered, shards=True)
    gshape = torch.Size(op.output_shape(x.shape))
    m, n = flat_dims(gshape)
    tiles, edge = _tiles(spec.format, spec.block), _edge(spec.format)

    def wrap(field, value):
        if value is None:
            return None
        if kind == "replicate" or (field == "amax" and spec.format == "nvfp4"):  # (the same on every rank)
            return DTensor.from_local(value, mesh, [Replicate()], run_check=False, shape=value.shape,
                                      stride=value.stride())
        if packed and field not in ("amax", "dbias"):
            return wrap_fp4(field, value)
        if field in ("rowwise_data", "colwise_data"):
            p, shape = Shard(dim), gshape
        elif field in ("rowwise_scale", "colwise_scale") and tiles:  # (one grid of 128x128 tiles; split by
            # columns, every rank holds all its rows, grouped ([M // 128 + G] rows) or not)
            rows = -(-m // edge) if kind == "rows" else value.shape[0]
            p, shape = Shard(0 if kind == "rows" else 1), torch.Size((rows, -(-n // edge)))
        elif field == "rowwise_scale":
            p, shape = Shard(0 if kind == "rows" else 1), torch.Size((m, -(-n // edge)))
        elif field == "colwise_scale":  # (split by columns, every rank holds all its rows, grouped or not)
            rows = -(-m // edge) if kind == "rows" else value.shape[0]
            p, shape = Shard(0 if kind == "rows" else 1), torch.Size((rows, n))
        elif field == "amax":
            p, shape = Partial("max"), torch.Size(())
        else:  # dbias: [N], or [G, N] for groups (column splits only)
            p = Partial("sum") if kind == "rows" else Shard(value.dim() - 1)
            shape = torch.Size((*value.shape[:-1], n))
        return DTensor.from_local(value, mesh, [p], run_check=False, shape=shape, stride=contiguous_stride(shape))

    def wrap_fp4(field, value):
        """Packed data [..., N/2] (the input's leading dims) and the transposed copy [N, M/2],
        scales [M, ceil(N/B)] and [N, ceil(M/B)]: split along the input's split dim (the copy's
        other one)."""
        if field == "rowwise_data":  # (the input's leading dims kept: [..., N/2])
            shape = torch.Size((*gshape[:-1], n // 2))
            return DTensor.from_local(value, mesh, [Shard(0 if kind == "rows" else len(shape) - 1)], run_check=False,
                                      shape=shape, stride=contiguous_stride(shape))
        rowwise = field.startswith("rowwise")
        along = 0 if (kind == "rows") == rowwise else 1
        rows, cols = (m, n) if rowwise else (n, m)
        width = cols // 2 if field.endswith("data") else -(-cols // edge)
        shape = torch.Size((rows, width))
        return DTensor.from_local(value, mesh, [Shard(along)], run_check=False, shape=shape,
                                  stride=contiguous_stride(shape))

    return MXFP8Tensor(wrap("rowwise_data", t.rowwise_data), wrap("colwise_data", t.colwise_data),
                       wrap("rowwise_scale", t.rowwise_scale), wrap("colwise_scale", t.colwise_scale),
                       wrap("amax", t.amax), wrap("dbias", t.dbias), t.fp8, t.scale_layout, gshape,
                       t.group_offsets, t.scale_mode, format=t.format, block=t.block)


def _whole_amax(op, call, mesh, placement, refused=None):
    """``call`` (on this rank's shard) with NVFP4's global amax set to the whole tensor's: the
    shard quantized once for its own amax (the op's values, act and epilogue included), then the
    ranks' maximum (an all-reduce; NaN-free, as each amax is). ``refused``: this rank's refusal
    already made (_uneven), raised after the all-reduce it joins."""
    import torch.distributed as dist

    if torch.compiler.is_compiling():
        raise ValueError(f"mxq: an NVFP4 call on DTensor shards ({_name(placement)}) needs the whole tensor's amax, "
                         "an all-reduce that torch.compile does not trace here; pass global_amax= (e.g. delayed "
                         "scaling) or call it outside the compiled region")
    # (a rank whose first pass refuses its shard, e.g. a plain operand that fits another rank's
    # shard only, still joins the all-reduce, flagging its refusal, so that no rank waits in it)
    amax = torch.zeros(1, device=call.tensors[0].device)
    if refused is None:
        try:
            amax = op._route(call, shards=True).amax.reshape(1).float()
        except (ValueError, TypeError) as exc:
            refused = exc
    both = torch.cat([amax, torch.ones_like(amax) if refused else torch.zeros_like(amax)])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=mesh.get_group())
    if refused is not None:
        raise refused
    if both[1] > 0:
        raise ValueError("mxq: another rank refused its shard of this NVFP4 call (its error names why); this "
                         "rank's shard was accepted")
    return call._replace(fp4=(call.fp4 or fp4.CallArgs())._replace(global_amax=both[:1].clone()))




_GATHER_FIELDS = ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale")
_MAX_DIMS = 8  # dimensions a gathered tensor may have (the descriptor's fixed width holds its shape)
# what every rank's descriptor records, in order: the local check's verdict, then what must agree
_CHECKS = (
    "an MXFP8Tensor",
    "compact scales (swizzled tiles span 128 rows)",
    f"a tensor of 2 to {_MAX_DIMS} dimensions (all_gather concatenates rows)",
    "an ungrouped tensor (a grouped tensor's scale buffers are per group)",
    "a row count per rank that is a multiple of its blocks' rows when it has blocks spanning rows (32 for "
    "MXFP8's and MXFP4's colwise blocks, 128 for FP8 block scaling's colwise blocks and 128x128 tiles, 16 for "
    "NVFP4's colwise blocks and 16x16 tiles)",
    "MXFP8, FP8 block scaling, NVFP4 or MXFP4",
    "no Hadamard-transformed colwise copy (its amax is its own: gather the full tensor's copy instead)",
    "an MXFP8Tensor of plain tensors (a DTensor call's result is already distributed: use its fields' "
    "full_tensor() or redistribute)",
    "an MXFP8Tensor whose fields are a quantize call's (data, each direction with its scales, and NVFP4's amax; "
    "tensors of the format's dtypes, one amax value)",
)
_FP8_CODES = {"e4m3": 1, "e5m2": 2}
_MODE_CODES = {None: 0, "rceil": 1, "floor": 2, "ceil": 3, "even": 4, "pow2": 5, "fp32": 6, "e4m3": 7}
_FORMAT_CODES = {"mxfp8": 1, "fp8_block": 2, "nvfp4": 3, "mxfp4": 4}
_DBIAS_CODES = {None: 0, torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


_ALIGN = 16  # bytes: each gathered field's start in the byte buffer (any dtype views from there)


def _padded(b: torch.Tensor) -> torch.Tensor:
    """Bytes ``b`` followed by zeros up to a multiple of _ALIGN."""
    pad = -b.numel() % _ALIGN
    return torch.cat([b, b.new_zeros(pad)]) if pad else b


def _local_verdict(t) -> int:
    """0 when ``t`` can be gathered on its own, else 1 + the index of the first check it fails."""
    if not isinstance(t, MXFP8Tensor):
        return 1
    if t.scale_layout != "compact":
        return 2
    if not 2 <= len(t.shape) <= _MAX_DIMS:
        return 3
    if t.group_offsets is not None:
        return 4
    if t.format not in _FORMAT_CODES:
        return 6
    if (t.colwise_data is not None or _tiles(t.format, t.block)) and flat_dims(t.shape)[0] % _edge(t.format):
        return 5
    if t.colwise_amax is not None:
        return 7
    if any(isinstance(getattr(t, f), DTensor) for f in (*_GATHER_FIELDS, "amax", "dbias")):
        return 8
    directions = [(getattr(t, f"{d}_data") is None, getattr(t, f"{d}_scale") is None) for d in ("rowwise", "colwise")]
    if (all(data for data, _ in directions) or any(data != scale for data, scale in directions)
            or (t.format == "nvfp4" and t.amax is None)):
        return 9
    # (fields of other classes, dtypes or an amax of more than one value would fail on this rank alone,
    # after the others entered the exchange: refused here, on every rank)
    fields = [(f, getattr(t, f)) for f in (*_GATHER_FIELDS, "amax", "dbias") if getattr(t, f) is not None]
    if any(not isinstance(v, torch.Tensor) for _, v in fields):
        return 9
    if any(v.dtype != t._field_dtype(f) for f, v in fields if f != "dbias") or (t.amax is not None
                                                                                and t.amax.numel() != 1):
        return 9
    return 0


def _descriptor(t, verdict: int, nbytes: int) -> list:
    """The fixed-width int64 record every rank sends first: its verdict, then its format, block
    rows, fp8 format, directions, optional fields, shape, byte count, scale mode and NVFP4's amax
    (its fp32 bits: every rank's shard must be quantized under one per-tensor amax, as the whole
    tensor is; zeros where the verdict is not 0)."""
    if verdict:
        return [verdict] + [0] * (11 + _MAX_DIMS)
    dims = list(t.shape) + [0] * (_MAX_DIMS - len(t.shape))
    amax_bits = int(t.amax.float().reshape(1).view(torch.int32).item()) if t.format == "nvfp4" else 0
    return [0, _FORMAT_CODES[t.format], t.block[0], _FP8_CODES.get(t.fp8, 9), int(t.rowwise_data is not None),
            int(t.colwise_data is not None), int(t.amax is not None),
            _DBIAS_CODES.get(t.dbias.dtype if t.dbias is not None else None, 9),
            len(t.shape), *dims, nbytes, _MODE_CODES.get(t.scale_mode, 9), amax_bits]


def _exchange_device(t, group):
    """Where the descriptors travel: the tensor's device where it has one, else the backend's (NCCL
    moves CUDA tensors only)."""
    import torch.distributed as dist

    if isinstance(t, MXFP8Tensor):  # (a tensor with no data field fails its local check: the backend's)
        field = next((getattr(t, f) for f in _GATHER_FIELDS if getattr(t, f) is not None), None)
        if field is not None:
            return field.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(t, parts_bytes: int, group, verdict: int) -> None:
    """Every rank checks its own tensor, then the ranks exchange one fixed-width record each and
    every rank raises the same error when any rank failed its check or the ranks disagree on the
    format, directions, optional fields, shape or scale mode: no rank is left waiting in a
    collective its peers never enter, and no mix of formats is gathered under one label."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.tensor(_descriptor(t, verdict, parts_bytes), dtype=torch.int64, device=_exchange_device(t, group))
    every = torch.empty(world * mine.numel(), dtype=torch.int64, device=mine.device)
    dist.all_gather_into_tensor(every, mine, group=group)
    every = every.view(world, -1).cpu()
    failed = [(r, int(v)) for r, v in enumerate(every[:, 0].tolist()) if v]
    if failed:
        rank, v = failed[0]
        got = f", got {type(t).__name__}" if v == 1 and rank == dist.get_rank(group) else ""
        raise (TypeError if v in (1, 8) else ValueError)(
            f"mxq: all_gather() needs {_CHECKS[v - 1]} on every rank; rank {rank} has not{got}")
    first = every[0]
    for r in range(1, world):
        if not torch.equal(every[r], first):
            what = ("format", "block", "fp8 format", "rowwise direction", "colwise direction", "amax", "dbias (its presence or dtype)",
                    "number of dimensions") + ("shape",) * _MAX_DIMS + ("byte count", "scale mode", "NVFP4 amax")
            i = next(i for i in range(1, first.numel()) if every[r, i] != first[i]) - 1
            raise ValueError(f"mxq: all_gather() needs every rank's tensor to agree; rank {r}'s {what[i]} "
                             f"differs from rank 0's (shape {_shape_of(every[r])} against {_shape_of(first)})")


def _shape_of(desc) -> tuple:
    nd = int(desc[8])
    return tuple(int(d) for d in desc[9:9 + nd])


def all_gather(t: MXFP8Tensor, group=None) -> MXFP8Tensor:
    """Concatenate the ranks' MXFP8Tensors along rows (rank order): byte-equal to quantizing the
    gathered full tensor, for data, scales and amax (NVFP4: every rank's amax must be the same, the
    whole tensor's, as DTensor calls and ``global_amax=`` give; FP4's transposed colwise copies
    side by side). Two collectives: a fixed-width record per
    rank (every rank's own checks and what must agree, _agree: any failure raises the same
    error on every rank, before the data moves), then every rank's fields in one byte buffer (so
    formats torch's backends cannot reduce, float8 included, travel as bytes). Each rank's tensor
    must have the same format, block, shape, fp8 format, scale mode, directions and optional
    fields, compact scales and, when it has blocks spanning rows, a row count (after flattening)
    that is a multiple of their rows (32 for MXFP8's colwise blocks, 128 for FP8 block scaling's
    colwise blocks and 128x128 tiles: their scale rows then concatenate). dbias is the
    fp64 sum of the ranks' dbias (each already rounded to the input dtype) rounded to it: not
    within the dbias class of the single-tensor value where the ranks' sums cancel (each rank's
    rounding stays in it: a bf16 column summing to 2^-6 over two ranks can come back 0)."""
    import torch.distributed as dist

    if group is dist.GroupMember.NON_GROUP_MEMBER:  # (what torch's new_group gives the ranks outside it)
        raise ValueError("mxq: all_gather() argument 'group' is one this rank is not a member of (torch's "
                         "new_group hands the other ranks a marker): call it on the group's ranks only")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"mxq: all_gather() group must be a torch.distributed ProcessGroup or None, got "
                        f"{type(group).__name__}")
    verdict = _local_verdict(t)  # (a DTensor field included: every rank raises, _agree)
    parts = [(f, getattr(t, f)) for f in (*_GATHER_FIELDS, "amax", "dbias") if getattr(t, f) is not None
             ] if verdict == 0 else []
    # each field's bytes padded to _ALIGN, so that every field starts where its dtype may be viewed
    flat = [_padded(v.contiguous().view(torch.uint8).reshape(-1) if v.dim() else v.reshape(1).view(torch.uint8))
            for _, v in parts]
    _agree(t, sum(f.numel() for f in flat), group, verdict)
    world = dist.get_world_size(group)
    buf = torch.cat(flat)
    gathered = torch.empty(world * buf.numel(), dtype=torch.uint8, device=buf.device)
    dist.all_gather_into_tensor(gathered, buf, group=group)
    per_rank = []
    for b in gathered.view(world, -1):
        fields, at = {}, 0
        for (f, v), fl in zip(parts, flat):
            nbytes = v.numel() * v.element_size()  # (an empty field: no bytes to view, at any offset)
            got = b[at:at + nbytes].view(v.dtype) if nbytes else b.new_empty(0, dtype=v.dtype)
            fields[f] = got.reshape(v.shape)
            at += fl.numel()
        per_rank.append(fields)
    packed = t.format in fp4.FORMATS  # (FP4's colwise copy is transposed, [N, M/2]: its rows' ranks side by side)
    out = {f: torch.cat([r[f] for r in per_rank], dim=1 if packed and f.startswith("colwise") else 0)
           for f, _ in parts if f in _GATHER_FIELDS}
    if t.amax is not None:
        out["amax"] = torch.stack([r["amax"] for r in per_rank]).amax()
    if t.dbias is not None:
        out["dbias"] = torch.stack([r["dbias"].double() for r in per_rank]).sum(0).float().to(t.dbias.dtype)
    shape = torch.Size((t.shape[0] * world, *t.shape[1:]))
    return MXFP8Tensor(out.get("rowwise_data"), out.get("colwise_data"), out.get("rowwise_scale"),
                       out.get("colwise_scale"), out.get("amax"), out.get("dbias"), t.fp8, t.scale_layout, shape,
                       scale_mode=t.scale_mode, format=t.format, block=t.block)


__all__ = ["all_gather", "call"]
