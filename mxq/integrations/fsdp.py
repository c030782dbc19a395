"""FSDP2 all-gathers in MXFP8: a sharded linear weight travels as FP8 bytes plus E8M0 scales
(1 + 1/32 bytes per element instead of 2 for bf16 or 4 for fp32).

    mxq.fsdp.mxfp8_all_gather(model)      # before fully_shard(...)

``mxfp8_all_gather`` wraps the weight of every ``nn.Linear`` of a module in ``MXFP8ShardedWeight``,
a tensor subclass that behaves as its high-precision tensor everywhere (optimizer, state dict,
sharding) and implements FSDP2's all-gather extension:

- ``fsdp_pre_all_gather``: each rank quantizes its own shard of rows with ``mxq.quantize`` and
  sends two uint8 tensors: the FP8 data [rows, K] and the scales as [rows, K / 32]. Before a
  forward it sends the rowwise copy (blocks along K, what y = x W^T reads); inside backward
  (FSDP re-gathers a resharded weight there) the colwise copy (blocks along the output rows,
  what dx = dy W reads). Colwise scales [rows / 32, K] have the same number of bytes, so both
  directions gather buffers of one shape, and FSDP's row concatenation of the ranks' buffers is
  byte for byte the full tensor's quantization (``mxq.distributed.all_gather`` shows the same).
- ``fsdp_post_all_gather``: wraps the gathered bytes in ``MXFP8GatheredWeight``, which
  ``F.linear`` recognises: its forward multiplies by the dequantized rowwise weight, its backward
  by the colwise one when that was gathered (else the rowwise one: FSDP does not reshard the
  root module after forward, so give every Linear its own ``fully_shard``). The GEMMs here
  dequantize and multiply in the input's dtype (Hopper, CPU); the weight gradient is computed
  from the high-precision activations and gradients, as with any FSDP2 parameter.

Constraints: every rank's shard must hold a multiple of 32 rows (the colwise blocks must not
cross ranks) and K must be a multiple of 32; ``mxfp8_all_gather`` checks the weight shapes
against the world size it is given, and the pre-all-gather hook raises on a bad shard.
Activation checkpointing that recomputes a forward inside backward would get the colwise copy;
it is not supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map_only

from ..op import quantize
from .distributed import even_split
from ..tensor import MXFP8Tensor

aten = torch.ops.aten

# ops whose results are still "the weight" (views, copies FSDP makes while sharding): re-wrapped
_KEEP = {aten.detach.default, aten.view.default, aten.slice.Tensor, aten.split.Tensor, aten.split_with_sizes.default,
         aten.chunk.default, aten.as_strided.default, aten.clone.default, aten._to_copy.default,
         aten.empty_like.default, aten.new_zeros.default, aten.new_empty.default, aten.alias.default,
         aten.t.default, aten._pin_memory.default}


def _in_backward() -> bool:
    """Whether the autograd engine is running (FSDP's pre-backward all-gathers run inside it)."""
    return torch._C._current_graph_task_id() != -1


class MXFP8ShardedWeight(torch.Tensor):
    """A linear weight (or its shard) whose FSDP2 all-gathers travel as MXFP8 (module docstring)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype,
                                                   device=data.device, requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor):
        self._data = data

    def __repr__(self):
        return f"MXFP8ShardedWeight({self._data!r})"

    def __tensor_flatten__(self):
        return ["_data"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return MXFP8ShardedWeight(inner["_data"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*tree_map_only(cls, lambda t: t._data, args), **tree_map_only(cls, lambda t: t._data, kwargs or {}))
        if func is aten.copy_.default:
            return args[0]
        if func in _KEEP:
            return tree_map_only(torch.Tensor, cls, out)
        return out

    # FSDP2's all-gather extension (torch.distributed.fsdp, "fsdp_pre_all_gather")
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        w = self._data
        if mp_policy is not None and mp_policy.param_dtype is not None:
            w = w.to(mp_policy.param_dtype)
        rows, k = w.shape
        # (judged from the whole weight's shape and FSDP's even split of its rows, the same on every rank: a
        # rank raising alone would leave the others waiting in the all-gather)
        world = mesh.size(mesh.ndim - 1)
        if k != outer_size[-1]:  # (FSDP's shard_placement_fn split the columns: each rank holds k of them)
            raise ValueError(f"mxq.fsdp: a weight of shape {tuple(outer_size)} sharded along its columns ({k} on "
                             "each rank: shard_placement_fn gave Shard(1)) cannot travel as MXFP8: "
                             "mxfp8_all_gather takes FSDP's row split, Shard(0)")
        shards = even_split(outer_size[0], world)
        if k % 32 or any(c % 32 for c in shards) or rows % 32:
            raise ValueError(f"mxq.fsdp: a weight of shape {tuple(outer_size)} sharded over {world} ranks ({shards} "
                             "rows each) cannot travel as MXFP8: every rank's rows and the columns must be "
                             "multiples of 32")
        direction = "colwise" if _in_backward() else "rowwise"
        t = quantize(w.contiguous(), rowwise=direction == "rowwise", colwise=direction == "colwise")
        data = getattr(t, f"{direction}_data").view(torch.uint8)
        scales = getattr(t, f"{direction}_scale").reshape(rows, k // 32)
        return (data, scales), (direction, w.dtype)

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        direction, dtype = metadata
        data, scales = outputs
        if out is not None:  # FSDP refilled the buffers of an earlier gather in place
            out._direction = direction
            return None
        return MXFP8GatheredWeight(data, scales, direction, dtype), outputs


class MXFP8GatheredWeight(torch.Tensor):
    """The gathered weight [N, K] as MXFP8 bytes: rowwise or colwise data and scales (module
    docstring). Only ``F.linear`` (and detach/views FSDP applies) may use it."""

    @staticmethod
    def __new__(cls, data, scales, direction, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=dtype, device=data.device)

    def __init__(self, data, scales, direction, dtype):
        self._fp8, self._scales, self._direction = data, scales, direction

    def __repr__(self):
        return f"MXFP8GatheredWeight({tuple(self.shape)}, {self._direction}, dtype={self.dtype})"

    def __tensor_flatten__(self):
        return ["_fp8", "_scales"], (self._direction, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return MXFP8GatheredWeight(inner["_fp8"], inner["_scales"], *meta)

    def dequantize(self) -> torch.Tensor:
        """The weight's values from the bytes gathered last (rowwise or colwise blocks)."""
        n, k = self.shape
        if self._direction == "rowwise":
            t = MXFP8Tensor(self._fp8.view(torch.float8_e4m3fn), None, self._scales, None, None, None, "e4m3",
                            "compact", self.shape)
        else:
            t = MXFP8Tensor(None, self._fp8.view(torch.float8_e4m3fn), None, self._scales.reshape(n // 32, k), None,
                            None, "e4m3", "compact", self.shape)
        return t.dequantize(self._direction).to(self.dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return _MXFP8Linear.apply(x, w, bias)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        w = args[0]
        same = func in (aten.detach.default, aten.alias.default) or (
            func in (aten.as_strided.default, aten.view.default) and list(args[1]) == list(w.shape))
        if same:  # FSDP's views of the whole unsharded parameter: the same weight
            return MXFP8GatheredWeight(w._fp8, w._scales, w._direction, w.dtype)
        raise NotImplementedError(f"mxq.fsdp: MXFP8GatheredWeight supports F.linear only, got {func}")


class _MXFP8Linear(torch.autograd.Function):
    """y = x W^T + b with W from its MXFP8 bytes: W's rowwise copy in forward, its colwise copy
    (if the backward re-gather brought it) for dx."""

    @staticmethod
    def forward(ctx, x, w, bias):
        ctx.save_for_backward(x)
        ctx.w = w  # re-gathered in place before backward (fsdp_post_all_gather's out=)
        ctx.has_bias = bias is not None
        y = x @ w.dequantize().t()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = dy @ ctx.w.dequantize()
        dw = dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db


def mxfp8_all_gather(module: torch.nn.Module, world_size: int | None = None) -> torch.nn.Module:
    """Wrap the weight of every nn.Linear in ``module`` so that FSDP2 all-gathers it as MXFP8
    (call before ``fully_shard``; module docstring). ``world_size``: check now that each rank's
    rows will be a multiple of 32 (a positive int, or None not to check). Returns ``module``."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"mxq.fsdp: argument 'module' must be a torch.nn.Module, got {type(module).__name__}")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"mxq.fsdp: argument 'world_size' must be a positive int or None, got {world_size!r}")
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Linear) and not isinstance(sub.weight, MXFP8ShardedWeight):
            n, k = sub.weight.shape
            if k % 32:
                raise ValueError(f"mxq.fsdp: {name or 'module'}.weight of shape ({n}, {k}) cannot travel as MXFP8: "
                                 f"K = {k} is not a multiple of 32")
            if world_size is not None and (n % world_size or (n // world_size) % 32):
                raise ValueError(f"mxq.fsdp: {name or 'module'}.weight of shape ({n}, {k}) cannot travel as MXFP8 "
                                 f"over {world_size} ranks: the rows per rank must be a multiple of 32")
            sub.weight = torch.nn.Parameter(MXFP8ShardedWeight(sub.weight.data), requires_grad=sub.weight.requires_grad)
    return module


__all__ = ["MXFP8GatheredWeight", "MXFP8ShardedWeight", "mxfp8_all_gather"]
