"""mxq ops as torch operators: what torch.compile traces.

One custom operator, ``torch.ops.mxq.fused_quant``, serves every op (``fused_quant_out`` its
``out=`` calls, ``fused_quant_fp4`` the FP4 calls with their own values or outputs: global_amax,
seed, offset, stochastic rounding, the Hadamard pair; ``fused_gemm`` its ``op.gemm`` calls,
gemm_call): its string argument names the FusedOp by its identity (``identity``: spec key,
epilogue fingerprint and mxq's version, the same in every process; a registry of the live ops,
filled as they are built), the tensors and floats are the epilogue's, and it returns the six
output slots (slots.OUTPUTS; an unused slot is an empty tensor). torch's on-disk caches (inductor's FX graph cache, the AOTAutograd cache) key a
compiled graph by its code and constants, and the graph bakes in what the fake implementation
said of the op (its outputs' shapes, strides and dtypes): the identity in that code is what
keeps one op's cached graph from serving another op in a later process, which a per-process
number would not (an e4m3 op's graph loaded for an e5m2 op reads its bytes as the wrong format).
Its fake implementation gives the exact shapes, strides and dtypes of
``MXFP8Tensor.empty``, so compiled graphs hold the op as one node, with no graph break, for
static and dynamic shapes. Eager calls do not go through the dispatcher (it costs host time):
``FusedOp.__call__`` routes here only while torch.compile traces. DTensor calls trace through
mxq/integrations/distributed.py, which runs this operator on the local shards (the operator itself has no
sharding rule). MXFP8Tensor is a registered pytree node, so it can be an input and an output of
compiled functions.
"""

from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree

from .._version import __version__
from ..formats import fp4, fp4_layouts, groups
from ..frontend import gated, ir
from ..frontend.epilogue import IDENTITY
from ..frontend.spec import QuantSpec
from ..runtime import slots, validation
from ..runtime.call import Call
from ..tensor import MXFP8Tensor

_ops: dict = {}  # identity -> weakref.WeakSet of the live FusedOps of that identity
quantize_op = None  # mxq.quantize's op of a QuantSpec (mxq/op.py sets it when it is imported: _quantize_op_of)


def identity(op) -> str:
    """What the torch operator calls ``op`` by: everything its outputs depend on (the spec's key,
    the epilogue's fingerprint, which covers its source, captured values and IR) and mxq's
    version (the fake implementation's shapes are mxq's code). Ops of one identity compute the
    same bytes, so any of them serves a call. A caller's Hadamard signs, which the key does not
    hold, follow it as their mask."""
    signs = "" if op.spec.hadamard_signs is None else f"s{op.spec.signs_mask():04x}"
    return f"{op.spec.key('fp32'):05x}{signs}-{op.epilogue.fingerprint}-{__version__}"


def register(op) -> str:
    """``op``'s identity, ``op`` registered under it (FusedOp.__init__ asks once). The registry
    does not keep the op alive; a compiled graph holds the identity as a constant, and the op
    lives as long as the code that calls it."""
    i = identity(op)
    _ops.setdefault(i, weakref.WeakSet()).add(op)
    return i


def op_id(op) -> str:
    return op._torch_id


def _op(i: str):
    """A live op of identity ``i``; for mxq.quantize's own ops (the identity epilogue, no caller's
    Hadamard signs) the op its spec key names, built here: a program saved by torch.export and
    loaded in a fresh process calls ops no code of that process has made yet."""
    for op in _ops.get(i, ()):
        return op
    built = _quantize_op_of(i)
    if built is not None:
        return built
    raise RuntimeError(f"mxq: no live op of identity {i!r} (the torch operator's 'op' argument): the op "
                       "a compiled graph calls must live as long as the graph")


def _quantize_op_of(i: str):
    """mxq.quantize's op of identity ``i`` (``quantize_op``: mxq/op.py's builder, whose cache keeps
    it), or None where ``i`` names another op or does not parse."""
    key, _, rest = i.partition("-")
    if rest != f"{IDENTITY.fingerprint}-{__version__}" or not key or any(c not in "0123456789abcdef" for c in key):
        return None
    try:
        spec, _ = QuantSpec.from_key(int(key, 16))
    except ValueError:
        return None
    op = quantize_op(spec)
    return op if op._torch_id == i else None


def _slots(t: MXFP8Tensor, x: torch.Tensor) -> list:
    """An operator's outputs: ``t``'s fields in slots.OUTPUTS order, an unused one an empty tensor."""
    return [getattr(t, f) if getattr(t, f) is not None else x.new_empty(0) for f in slots.OUTPUTS]


def _fake_slots(like: MXFP8Tensor, x: torch.Tensor) -> list:
    """_slots of fake tensors shaped, strided and typed as ``like``'s fields (strides too: FP8 data
    of N % 8 != 0 are views of padded rows, GEMM-ready fp32 scales of padded buffers)."""
    return [x.new_empty_strided(g.shape, g.stride(), dtype=g.dtype) if g is not None else x.new_empty(0)
            for g in (getattr(like, f) for f in slots.OUTPUTS)]


def _result(spec, res: list, shape, group_offsets=None, pair=None) -> MXFP8Tensor:
    """The MXFP8Tensor of an operator's outputs ``res`` (slots.OUTPUTS order; unused slots None);
    ``pair``: NVFP4's Hadamard [amax, colwise_amax] buffer, whose entries the two fields view."""
    fields = {f: (r if slots.uses(spec, f) else None) for f, r in zip(slots.OUTPUTS, res)}
    colwise_amax = None
    if pair is not None:
        fields["amax"], colwise_amax = pair[0], pair[1]
    return MXFP8Tensor(fields["rowwise_data"], fields["colwise_data"], fields["rowwise_scale"],
                       fields["colwise_scale"], fields["amax"], fields["dbias"], spec.fp8, spec.scale_layout,
                       shape, group_offsets, spec.scale_mode, spec.format, spec.block, colwise_amax)


@torch.library.custom_op("mxq::fused_quant", mutates_args=())
def fused_quant(tensors: list[torch.Tensor], scalars: list[float], act_input: torch.Tensor | None,
                noop: torch.Tensor | None, group_offsets: torch.Tensor | None, op: str) -> list[torch.Tensor]:
    fused = _op(op)
    x = tensors[0]
    # outputs from torch's allocator (the native allocating route's memory is not torch's: a
    # CUDA graph captured by torch.compile must own its outputs)
    out = MXFP8Tensor.empty(fused.spec, gated.out_shape(fused.epilogue, x.shape), x.dtype, x.device,
                            zeroed=noop is not None, group_offsets=group_offsets)
    return _slots(fused._eager(Call(tensors, scalars, act_input, noop, out, group_offsets)), x)


@fused_quant.register_fake
def _fused_quant_fake(tensors, scalars, act_input, noop, group_offsets, op):
    fused = _op(op)
    x = tensors[0]
    return _fake_slots(MXFP8Tensor.empty(fused.spec, gated.out_shape(fused.epilogue, x.shape), x.dtype, "meta",
                                         group_offsets=group_offsets), x)


@torch.library.custom_op("mxq::fused_quant_out", mutates_args=("outs",))
def fused_quant_out(tensors: list[torch.Tensor], scalars: list[float], act_input: torch.Tensor | None,
                    noop: torch.Tensor | None, group_offsets: torch.Tensor | None, outs: list[torch.Tensor],
                    op: str) -> None:
    """The ``out=`` form: writes into ``outs`` (the fields the op uses, in slots.OUTPUTS order),
    so a noop call leaves them as they were, as in eager mode."""
    fused = _op(op)
    x = tensors[0]
    it = iter(outs)
    fields = {f: (next(it) if slots.uses(fused.spec, f) else None) for f in slots.OUTPUTS}
    out = MXFP8Tensor(fields["rowwise_data"], fields["colwise_data"], fields["rowwise_scale"],
                      fields["colwise_scale"], fields["amax"], fields["dbias"], fused.spec.fp8,
                      fused.spec.scale_layout, gated.out_shape(fused.epilogue, x.shape), group_offsets,
                      fused.spec.scale_mode, fused.spec.format,
                      fused.spec.block)
    fused._eager(Call(tensors, scalars, act_input, noop, out, group_offsets))


@fused_quant_out.register_fake
def _fused_quant_out_fake(tensors, scalars, act_input, noop, group_offsets, outs, op):
    return None


# (a seed left out is drawn from torch's generator when the call runs: two calls are never merged,
# and they run outside CUDA graphs, whose replay would repeat one draw and which cannot capture
# the seed's copy to the device; given seeds and amaxes take the same path)
_FP4_TAGS = tuple(getattr(torch.Tag, t) for t in ("nondeterministic_seeded", "cudagraph_unsafe")
                  if hasattr(torch.Tag, t))


@torch.library.custom_op("mxq::fused_quant_fp4", mutates_args=(), tags=_FP4_TAGS)
def fused_quant_fp4(tensors: list[torch.Tensor], scalars: list[float], act_input: torch.Tensor | None,
                    noop: torch.Tensor | None, global_amax: torch.Tensor | None, global_amax_value: float | None,
                    seed: list[int], offset: int | None, group_offsets: torch.Tensor | None,
                    op: str) -> list[torch.Tensor]:
    """An FP4 call with its own values (fp4.CallArgs): ``global_amax`` a tensor or
    ``global_amax_value`` a float (or neither: computed), ``seed`` as [low, high] 32-bit halves
    (a seed takes 64 bits, more than an int argument holds) or [] (drawn when the call runs, as
    in eager mode), ``offset``; ``group_offsets`` (NVFP4's amax then per group). Outputs as
    fused_quant's, then NVFP4's Hadamard [amax, colwise_amax] pair (one buffer, as
    MXFP8Tensor.empty lays them out) or an empty tensor."""
    fused = _op(op)
    x = tensors[0]
    args = fp4.CallArgs(global_amax if global_amax is not None else global_amax_value,
                        seed[0] | seed[1] << 32 if seed else None, offset)
    out = MXFP8Tensor.empty(fused.spec, gated.out_shape(fused.epilogue, x.shape), x.dtype, x.device,
                            zeroed=noop is not None, group_offsets=group_offsets)
    t = fused._eager(Call(tensors, scalars, act_input, noop, out, group_offsets, args))
    res = _slots(t, x)
    if t.colwise_amax is not None:  # (amax and colwise_amax: one fp32[2] buffer, returned whole)
        res[slots.OUTPUTS.index("amax")] = x.new_empty(0)
        res.append(torch.stack([t.amax.reshape(()), t.colwise_amax.reshape(())]))
    else:
        res.append(x.new_empty(0))
    return res


@fused_quant_fp4.register_fake
def _fused_quant_fp4_fake(tensors, scalars, act_input, noop, global_amax, global_amax_value, seed, offset,
                          group_offsets, op):
    fused = _op(op)
    x = tensors[0]
    like = MXFP8Tensor.empty(fused.spec, gated.out_shape(fused.epilogue, x.shape), x.dtype, "meta",
                             group_offsets=group_offsets)
    out = _fake_slots(like, x)
    if like.colwise_amax is not None:
        out[slots.OUTPUTS.index("amax")] = x.new_empty(0)
        out.append(x.new_empty(2, dtype=torch.float32))
    else:
        out.append(x.new_empty(0))
    return out


@torch.library.custom_op("mxq::fused_gemm", mutates_args=())
def fused_gemm(a: torch.Tensor, w: torch.Tensor, tensors: list[torch.Tensor], scalars: list[float],
               op: str) -> list[torch.Tensor]:
    """``op.gemm(a, w, *tensors, **floats)``: the GEMM with the op in its epilogue (FusedOp.gemm),
    its outputs in slots.OUTPUTS order (an unused slot an empty tensor)."""
    from ..runtime import gemm as gemm_rt

    fused = _op(op)
    gemm_rt.check_args(a, w)  # (what tracing could not check: the real tensors' addresses)
    return _slots(fused._gemm_run(a, w, list(tensors), list(scalars)), a)


@fused_gemm.register_fake
def _fused_gemm_fake(a, w, tensors, scalars, op):
    return _fake_slots(MXFP8Tensor.empty(_op(op).spec, (a.shape[0], w.shape[0]), a.dtype, "meta", row_align=1), a)


def constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing torch._dynamo, which takes
    about a second, more than all the rest of ``import mxq``: that decorator imports it only to
    set this attribute, which torch.compile reads when it traces a call of ``fn`` (while tracing,
    torch._dynamo is loaded anyway). tests/test_torch_ops.py checks that both mark ``fn`` alike."""
    fn._dynamo_marked_constant = True
    return fn


@constant_result
def _spec_key(i: str) -> int:
    return _op(i).spec.key("fp32")


@constant_result
def _halves(i: str) -> bool:
    return gated.is_halves(_op(i).epilogue)


@constant_result
def _scalar_names(i: str) -> tuple:
    return tuple(_op(i).epilogue.scalar_params)


@constant_result
def _tensor_names(i: str) -> tuple:
    return tuple(_op(i).epilogue.tensor_params)


def call(i: str, call: Call):
    """The traced ``call`` of op ``i`` (op_id): the operator, then an MXFP8Tensor (``out`` filled by
    copies)."""
    from ..frontend.spec import QuantSpec

    tensors, scalars, act_input, noop, out, group_offsets, fp4_args = call

    spec, _ = QuantSpec.from_key(_spec_key(i))
    names = _tensor_names(i)
    # (what is not a tensor where the operator's schema takes one: mxq's error, as eager, not torch's)
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            validation.check_tensor_arg(name, t)
    if act_input is not None and not isinstance(act_input, torch.Tensor):
        validation.check_plain_tensor("act_input", act_input)
    validation.check_noop_type(noop)
    if group_offsets is not None:  # (its class, dtype and rank are static while tracing, a FakeTensor's too under
        groups.check_form(group_offsets)  # non-strict export: mxq's error, as eager, not torch's from the fake
        # implementation; its values: the operator's eager checks)
    # (devices are static while tracing; a mixed call would reach the operator's fake implementation)
    validation.check_devices(names, tensors, act_input, noop, group_offsets)
    validation.check_dtypes(names, tensors, act_input)  # (dtypes are static too)
    fp4_call = spec.hadamard or spec.stochastic_rounding or fp4_args is not None
    if fp4_call and out is not None:
        raise ValueError("mxq: torch.compile does not trace out= with NVFP4's hadamard, stochastic_rounding, "
                         "global_amax, seed or offset yet; call such an op outside the compiled region "
                         "(torch.compiler.disable)")
    shape = gated.double_last(tensors[0].shape) if _halves(i) else tensors[0].shape
    validation.check_scalars(_scalar_names(i), scalars)  # (shapes and dtypes: the operator's eager check)
    if spec.is_fp4 or fp4_args is not None:  # (the packed shapes here, not in the fake implementation's terms)
        validation.check_fp4(spec, fp4_args if fp4_args is not None else fp4.CallArgs(), tensors[0], shape,
                             group_offsets)  # (group values: when the call runs)
    floats = [_traced_scalar(name, s) for name, s in zip(_scalar_names(i), scalars)]
    # (outputs carry no gradient, as in eager: the operator takes its inputs detached, so a
    # compiled training step with requires_grad inputs traces without an autograd formula)
    tensors = [t.detach() if isinstance(t, torch.Tensor) else t for t in tensors]
    act_input = act_input.detach() if isinstance(act_input, torch.Tensor) else act_input
    noop = noop.detach() if isinstance(noop, torch.Tensor) else noop
    if out is not None:  # validated while tracing (static shapes and dtypes), written in place
        validation.check_out(spec, out, tensors[0], group_offsets, shape, noop)
        outs = [getattr(out, f) for f in slots.OUTPUTS if slots.uses(spec, f)]
        torch.ops.mxq.fused_quant_out(list(tensors), floats, act_input, noop, group_offsets, outs, i)
        return out.label(spec, group_offsets, noop)  # (as the eager routes: what the outputs are laid out by)
    if fp4_call:
        args = fp4_args if fp4_args is not None else fp4.CallArgs()
        amax = args.global_amax
        if isinstance(amax, (tuple, list, torch.Tensor)):  # (the operator takes a tensor; given_amax detaches it:
            amax = fp4_layouts.given_amax(amax, tensors[0].device)  # an amax computed in the graph may require grad)
        seed = [] if args.seed is None else [args.seed & 0xFFFFFFFF, args.seed >> 32]
        res = torch.ops.mxq.fused_quant_fp4(list(tensors), floats, act_input, noop,
                                            amax if isinstance(amax, torch.Tensor) else None,
                                            None if amax is None or isinstance(amax, torch.Tensor)
                                            else _traced_scalar("global_amax", amax),
                                            seed, args.offset, group_offsets, i)
    else:
        res = torch.ops.mxq.fused_quant(list(tensors), floats, act_input, noop, group_offsets, i)
    return _result(spec, res, shape, None if group_offsets is None else group_offsets.clone(),  # (a copy, as eager)
                   res[-1] if spec.hadamard else None)


def _traced_scalar(name: str, value) -> float:
    """A Python number argument as the operator's float (ir.scalar: an int exactly, one beyond 2^53
    rounded to fp32 from its digits, a double for the call to round once). An int that
    torch.compile made symbolic (dynamic=True, or a value that changed) has no digits to round
    while tracing: beyond 2^53 (where float() would round it twice) it is refused by name."""
    validation.check_traced_int(name, value)
    return ir.scalar(value)


def gemm_call(i: str, a, w, others, scalars) -> MXFP8Tensor:
    """The traced ``op.gemm`` of op ``i``: the operator, then an MXFP8Tensor of [M, N]."""
    from ..frontend.spec import QuantSpec

    spec, _ = QuantSpec.from_key(_spec_key(i))
    validation.check_scalars(_scalar_names(i), scalars)
    res = torch.ops.mxq.fused_gemm(a.detach(), w.detach(), [t.detach() for t in others],
                                   [_traced_scalar(name, s) for name, s in zip(_scalar_names(i), scalars)], i)
    return _result(spec, res, torch.Size((a.shape[0], w.shape[0])))


_FIELDS = ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax", "dbias", "group_offsets",
           "colwise_amax")


def _flatten(t: MXFP8Tensor):
    return [getattr(t, f) for f in _FIELDS], (t.fp8, t.scale_layout, tuple(t.shape), t.scale_mode, t.format,
                                                t.block)


def _unflatten(children, context):
    fp8, layout, shape, mode, fmt, block = context
    *fields, offsets, colwise_amax = children
    return MXFP8Tensor(*fields, fp8, layout, torch.Size(shape), offsets, mode, fmt, block, colwise_amax)


pytree.register_pytree_node(MXFP8Tensor, _flatten, _unflatten,
                            serialized_type_name="mxq.MXFP8Tensor")

__all__ = ["call", "fused_gemm", "fused_quant", "fused_quant_fp4", "gemm_call", "identity", "op_id"]
