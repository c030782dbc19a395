"""Several processes: DTensor inputs (each rank quantizes its local shard, no communication) and
``all_gather`` of MXFP8Tensors.

``mxq.quantize`` and decorated ops accept DTensors on a 1-D device mesh with one placement:

| input placement | data | rowwise scales | colwise scales | amax | dbias |
|---|---|---|---|---|---|
| Replicate() | Replicate | Replicate | Replicate | Replicate | Replicate |
| Shard(0) (rows) | Shard(0) | Shard(0) | Shard(0) | Partial("max") | Partial("sum") |
| Shard(-1) (columns) | Shard(-1) | Shard(1) | Shard(1) | Partial("max") | Shard(0) |

A shard boundary that would cut a 32-element block is an error naming the placement: with
Shard(0), every rank's first row (after flattening) must be a multiple of 32 when the op writes
colwise blocks; with Shard(-1), every rank's first column must be a multiple of 32 when it writes
rowwise blocks. Scales are compact only (swizzled tiles span 128 rows). The other tensor
operands must have the same placement (or be plain tensors broadcast against the local shard);
``act_input`` likewise. A Partial("sum") dbias reduces the ranks' rounded sums: within the
dbias class of docs/NUMERICS.md of the single-device value, not byte-equal to it.

Row groups (``group_offsets``, a plain or replicated tensor) go with Shard(-1) and Replicate():
every rank holds every row and runs the groups on its columns; the grouped colwise scales [M //
32 + G, N] and dbias [G, N] are Shard(1) under a column split. A row split is refused.

Under torch.compile the same code traces (FusedOp._route: the torch operator on the local
shards; DTensor.from_local around its outputs), so a compiled DTensor call has no graph break.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from ..tensor import MXFP8Tensor, flat_dims


def _name(p) -> str:
    """A placement as a user writes it: Shard(0), Replicate(), Partial()."""
    if isinstance(p, Shard):
        return f"Shard({p.dim})"
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
    raise ValueError(f"mxq: DTensor inputs must be Shard or Replicate, got {_name(p)}")


def _check_blocks(spec, x: DTensor, kind: str, dim):
    """Refuse a split that cuts a 32-element block (each rank's first row / column)."""
    if kind == "replicate":
        return
    if spec.scale_layout != "compact":
        raise ValueError(f"mxq: placement {_name(x.placements[0])} needs scale_layout='compact' (swizzled tiles span "
                         "128 rows of scales)")
    size = x.shape[dim]
    world = x.device_mesh.size()
    chunk = -(-size // world)  # DTensor's even split: ceil(size / world) per rank
    per_index = 1
    if kind == "rows":
        for d in x.shape[1:-1]:
            per_index *= d
    if kind == "rows" and x.dim() > 2 and size % world:
        raise ValueError(f"mxq: placement {_name(x.placements[0])} of a {x.dim()}-D input needs its first dimension "
                         f"({size}) to divide evenly over the {world} ranks (the flattened rows of the shards "
                         "must be DTensor's even split of M)")
    need = spec.colwise if kind == "rows" else spec.rowwise
    if need and world > 1 and (chunk * per_index) % 32 and chunk < size:
        what = "rows" if kind == "rows" else "columns"
        raise ValueError(f"mxq: placement {_name(x.placements[0])} cuts a 32-element block: each rank holds "
                         f"{chunk * per_index} {what} (a multiple of 32 is needed for "
                         f"{'colwise' if kind == 'rows' else 'rowwise'} blocks)")


def _local(t, mesh, placement, name):
    if isinstance(t, DTensor):
        if t.device_mesh != mesh or t.placements != (placement,):
            raise ValueError(f"mxq: argument {name!r} has placements {t.placements} on another mesh or "
                             f"placement than the first input's ({placement})")
        return t.to_local()
    return t


def call(op, call) -> MXFP8Tensor:
    """Run ``op`` on the local shards of ``call``'s DTensor inputs (a mxq/runtime/call.py Call)
    and wrap its outputs (of ``op.output_shape``) as DTensors. A gated op's halves lie along the
    columns: it takes row splits and replicas only. ``group_offsets`` (row groups) go with column
    splits and replicas: every rank holds every row, so each runs the groups on its columns."""
    tensors, scalars, act_input, noop, out, group_offsets = call
    x = tensors[0]
    if not isinstance(x, DTensor):
        if isinstance(group_offsets, DTensor) and not any(isinstance(t, DTensor) for t in (*tensors, act_input)):
            raise TypeError("mxq: argument 'group_offsets' is a DTensor but the inputs are plain tensors: pass it "
                            "as a plain tensor")
        raise TypeError("mxq: with DTensor operands, the first tensor input must be a DTensor too")
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
    if group_offsets is not None:
        if kind == "rows":
            raise ValueError(f"mxq: group_offsets with placement {_name(placement)}: the groups run along the rows, "
                             "which the ranks split; use Shard(-1) or Replicate()")
        if isinstance(group_offsets, DTensor):
            if group_offsets.placements != (Replicate(),):
                raise ValueError(f"mxq: argument 'group_offsets' must be a plain tensor or replicated, got "
                                 f"placements {group_offsets.placements}")
            group_offsets = group_offsets.to_local()
    names = list(op.epilogue.tensor_params)
    local = [_local(t, mesh, placement, n) for t, n in zip(tensors, names)]
    act = _local(act_input, mesh, placement, "act_input") if act_input is not None else None
    if isinstance(noop, DTensor):
        noop = noop.to_local()
    # contiguous FP8 data (not the padded rows of N % 8 != 0): the DTensors below state a
    # contiguous global layout, which a shard's padded rows would not match
    x0 = local[0]
    out = MXFP8Tensor.empty(spec, op.output_shape(x0.shape), x0.dtype, x0.device, zeroed=noop is not None,
                            row_align=1, group_offsets=group_offsets)
    t = op._route(call._replace(tensors=local, act_input=act, noop=noop, out=out, group_offsets=group_offsets),
                  shards=True)
    gshape = torch.Size(op.output_shape(x.shape))
    m, n = flat_dims(gshape)

    def wrap(field, value):
        if value is None:
            return None
        if kind == "replicate":  # (the global tensor is the local one, in any layout)
            return DTensor.from_local(value, mesh, [Replicate()], run_check=False, shape=value.shape,
                                      stride=value.stride())
        if field in ("rowwise_data", "colwise_data"):
            p, shape = Shard(dim), gshape
        elif field == "rowwise_scale":
            p, shape = Shard(0 if kind == "rows" else 1), torch.Size((m, -(-n // 32)))
        elif field == "colwise_scale":  # (split by columns, every rank holds all its rows, grouped or not)
            rows = -(-m // 32) if kind == "rows" else value.shape[0]
            p, shape = Shard(0 if kind == "rows" else 1), torch.Size((rows, n))
        elif field == "amax":
            p, shape = Partial("max"), torch.Size(())
        else:  # dbias: [N], or [G, N] for groups (column splits only)
            p = Partial("sum") if kind == "rows" else Shard(value.dim() - 1)
            shape = torch.Size((*value.shape[:-1], n))
        return DTensor.from_local(value, mesh, [p], run_check=False, shape=shape, stride=_contiguous_stride(shape))

    return MXFP8Tensor(wrap("rowwise_data", t.rowwise_data), wrap("colwise_data", t.colwise_data),
                       wrap("rowwise_scale", t.rowwise_scale), wrap("colwise_scale", t.colwise_scale),
                       wrap("amax", t.amax), wrap("dbias", t.dbias), t.fp8, t.scale_layout, gshape,
                       t.group_offsets)


def _contiguous_stride(shape) -> tuple:
    stride, acc = [], 1
    for d in reversed(tuple(shape)):
        stride.append(acc)
        acc *= d
    return tuple(reversed(stride))




_GATHER_FIELDS = ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale")


def all_gather(t: MXFP8Tensor, group=None) -> MXFP8Tensor:
    """Concatenate the ranks' MXFP8Tensors along rows (rank order): byte-equal to quantizing the
    gathered full tensor, for data, scales and amax. One collective for the data (and a small
    one that checks the shapes agree): every rank's fields go in one byte buffer (so formats torch's backends cannot reduce, float8 included, travel as
    bytes). Each rank's tensor must have the same shape, compact scales and, when it has colwise
    blocks, a row count (after flattening) that is a multiple of 32. dbias is the fp64 sum of the
    ranks' dbias rounded to the input dtype: within the dbias class of the single-tensor value,
    not byte-equal to it."""
    import torch.distributed as dist

    if not isinstance(t, MXFP8Tensor):
        raise TypeError(f"mxq: all_gather() takes an MXFP8Tensor, got {type(t).__name__}")
    if t.scale_layout != "compact":
        raise ValueError("mxq: all_gather() needs compact scales (swizzled tiles span 128 rows)")
    if len(t.shape) < 2:
        raise ValueError(f"mxq: all_gather() concatenates rows: it needs a tensor of 2 or more dimensions, got "
                         f"shape {tuple(t.shape)}")
    if t.group_offsets is not None:
        raise ValueError("mxq: all_gather() of a grouped tensor is not supported (its scale buffers are per group)")
    m, n = flat_dims(t.shape)
    if t.colwise_data is not None and m % 32:
        raise ValueError(f"mxq: all_gather() of colwise blocks needs a multiple of 32 rows per rank, got {m}")
    world = dist.get_world_size(group)
    parts = [(f, getattr(t, f)) for f in (*_GATHER_FIELDS, "amax", "dbias") if getattr(t, f) is not None]
    flat = [v.contiguous().view(torch.uint8).reshape(-1) if v.dim() else v.reshape(1).view(torch.uint8)
            for _, v in parts]
    buf = torch.cat(flat)
    # (on the tensors' device: NCCL moves CUDA tensors only)
    shapes = torch.tensor(list(t.shape) + [buf.numel()], dtype=torch.int64, device=buf.device)
    all_shapes = torch.empty(world * shapes.numel(), dtype=torch.int64, device=buf.device)
    dist.all_gather_into_tensor(all_shapes, shapes, group=group)
    if not torch.equal(all_shapes.view(world, -1), shapes.expand(world, -1)):
        raise ValueError("mxq: all_gather() needs the same shape on every rank")
    gathered = torch.empty(world * buf.numel(), dtype=torch.uint8, device=buf.device)
    dist.all_gather_into_tensor(gathered, buf, group=group)
    per_rank = []
    for b in gathered.view(world, -1):
        fields, at = {}, 0
        for (f, v), fl in zip(parts, flat):
            fields[f] = b[at:at + fl.numel()].view(v.dtype).reshape(v.shape)
            at += fl.numel()
        per_rank.append(fields)
    out = {f: torch.cat([r[f] for r in per_rank], dim=0) for f, _ in parts if f in _GATHER_FIELDS}
    if t.amax is not None:
        out["amax"] = torch.stack([r["amax"] for r in per_rank]).amax()
    if t.dbias is not None:
        out["dbias"] = torch.stack([r["dbias"].double() for r in per_rank]).sum(0).float().to(t.dbias.dtype)
    shape = torch.Size((t.shape[0] * world, *t.shape[1:])) if len(t.shape) else torch.Size((world,))
    return MXFP8Tensor(out.get("rowwise_data"), out.get("colwise_data"), out.get("rowwise_scale"),
                       out.get("colwise_scale"), out.get("amax"), out.get("dbias"), t.fp8, t.scale_layout, shape)


__all__ = ["all_gather", "call"]
