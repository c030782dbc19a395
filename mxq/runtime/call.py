"""One call of an op as one value: bound once where a call enters (``FusedOp.__call__``,
``reference``, ``prepare``, ``mxq.quantize``, the torch operator; ``Binder``) and passed down:
validation, launch, the reference, torch_ops and distributed read its fields by name.

``Call.key`` is what a call's checks and route depend on apart from values: the class, shape,
strides, dtype, device, requires_grad and layout of every tensor it holds (``out``'s too but
requires_grad, which no check of a destination reads; ``out``'s format, block, fp8, scale layout and shape,
and whether its amax and colwise_amax are the one fp32[2] buffer the Hadamard kernels write), the
floats' types and the grad mode. FusedOp keeps the route of a checked call under its key, and later calls
of the same key run it without the checks that depend only on the key (FusedOp._plans).
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch

from ..frontend.epilogue import Epilogue, EpilogueError
from ..formats import fp4, fp4_layouts
from ..tensor import MXFP8Tensor, is_dtensor
from . import validation

KEYWORDS = ("act_input", "noop", "out", "group_offsets")  # a call's own keywords, after the epilogue's
FP4_KEYWORDS = fp4.CallArgs._fields  # an FP4 op's further call keywords (global_amax, seed, offset)


class Call(NamedTuple):
    """The values of one call: the epilogue's tensors and floats (in its parameter order), then
    the call keywords. A tuple (cheap to build on every call, immutable); ``_replace`` derives a
    call, e.g. with copied operands or a rank's local shards."""

    tensors: list
    scalars: list
    act_input: Any = None
    noop: Any = None
    out: Any = None  # an MXFP8Tensor, or None: the call allocates its outputs
    group_offsets: Any = None
    fp4: Any = None  # an FP4 op's own call values (mxq/formats/fp4.py CallArgs), or None

    def operands(self):
        """Every tensor-like value the call passes, keywords included (None where absent)."""
        return (*self.tensors, self.act_input, self.noop, self.group_offsets)

    def key(self, aligned: bool = False):
        """The call's layout signature (module docstring), or None where it cannot be read (a
        sparse tensor's strides, an ``out`` that is not an MXFP8Tensor): such calls are checked
        every time. Read on every call that is not an ordinary allocating one (out=, keywords,
        views), so each value's part is read attribute by attribute, without a loop. ``aligned``:
        with whether each tensor operand starts on a 16-byte boundary (ops whose kernels serve
        aligned inputs alone: FusedOp._key_aligned)."""
        out = self.out
        try:
            if aligned:
                key = self.key()  # (None: checked every time, aligned or not)
                return None if key is None else (key, tuple(t.data_ptr() % 16 == 0 if isinstance(t, _Tensor) else None
                                                            for t in self.operands()))
            if out is not None:
                if out.__class__ is not MXFP8Tensor:
                    return None
                col_amax = out.colwise_amax
                pair = col_amax is not None and fp4_layouts.amax_pair(out.amax, col_amax) is not None
                # (format, block and shape: check_out refuses an out of another format, block or
                # shape, whose tensors can be laid out alike, e.g. FP8 block scaling's 1x128 and
                # 128x128 at M = 1, FP4's colwise copy of [32, 48] and [4, 8, 48])
                # (and whether the rowwise data is 16-byte aligned: the transposed copy's kernel writes
                # only such rows, limits.fp8_block_unserved, so a route kept for them serves no other)
                row, col = out.rowwise_data, out.colwise_data  # (and FP4's colwise data: limits.fp4_unserved)
                out = (out.fp8, out.scale_layout, out.format, out.block, out.shape, _out_layout(row),
                       row is None or row.data_ptr() % 16 == 0, col is None or col.data_ptr() % 16 == 0,
                       _out_layout(col), _out_layout(out.rowwise_scale), _out_layout(out.colwise_scale),
                       _out_layout(out.amax), _out_layout(out.dbias), _out_layout(col_amax), pair)
            if self.fp4 is not None and any(v is not None and not isinstance(v, _Tensor) for v in self.fp4):
                return None  # (a float global_amax, an int seed or offset: their values are checked every call)
            fp4 = None if self.fp4 is None else tuple(map(_layout, self.fp4))
            return (tuple(map(_layout, self.tensors)), tuple(map(type, self.scalars)), _layout(self.act_input),
                    _layout(self.noop), out, _layout(self.group_offsets), _grad_enabled(), fp4)
        except Exception:  # (what the checks will name)
            return None


_Tensor = torch.Tensor
_NoneType = type(None)
_grad_enabled = torch.is_grad_enabled


def _out_layout(t):
    """An ``out`` field's part of Call.key: _layout's but requires_grad, which no check of a
    destination reads (validation.check_out)."""
    cls = t.__class__
    if cls is _NoneType:
        return cls
    if cls is _Tensor or isinstance(t, _Tensor):
        return cls, t.shape, t.stride(), t.dtype, t.device, t.layout
    return cls


def _layout(t):
    """One value's part of Call.key: a tensor's (class, shape, strides, dtype, device,
    requires_grad, layout), anything else's class."""
    cls = t.__class__
    if cls is _NoneType:  # (most of a call's slots; isinstance against torch.Tensor costs as much as a tensor's reads)
        return cls
    if cls is _Tensor or isinstance(t, _Tensor):
        return cls, t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.layout
    return cls


class Binder:
    """One op's binding of call arguments (its epilogue function's signature) to a ``Call``."""

    def __init__(self, fn, epilogue: Epilogue, reserved: tuple = ()):
        """``reserved``: call keywords of the op beyond KEYWORDS (an FP4 op's FP4_KEYWORDS)."""
        keywords = KEYWORDS + tuple(reserved)
        clash = set(epilogue.param_order) & {*keywords, "acc_out"}  # (and op.gemm's own keyword)
        if clash:
            raise EpilogueError(f"parameter name(s) {sorted(clash)} are reserved for the call "
                                f"({', '.join(keywords)}, and op.gemm's acc_out)", inspect.getsourcefile(fn) or "<unknown>",
                                fn.__code__.co_firstlineno, "parameter name")
        self.name, self.order = epilogue.name, epilogue.param_order
        self.signature = inspect.signature(fn)
        self.defaults = {k: p.default for k, p in self.signature.parameters.items()
                         if p.default is not inspect.Parameter.empty}
        # every parameter positional-or-keyword: keywords bind by name without inspect (_bind_names)
        self.by_name = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values())
        self.positional_only = frozenset(k for k, p in self.signature.parameters.items()
                                         if p.kind is inspect.Parameter.POSITIONAL_ONLY)
        self.tensor_pos = [self.order.index(n) for n in epilogue.tensor_params]
        self.scalar_pos = [self.order.index(n) for n in epilogue.scalar_params]
        # (plain): each positional argument's class, and whether the tensors come first
        self.classes = tuple(torch.Tensor if n in epilogue.tensor_params else float for n in self.order)
        self.in_order = self.tensor_pos == list(range(len(self.tensor_pos)))
        # (_bind_names) per count of positional arguments: the names that must follow, as a tuple and a set
        self._named = [(self.order[i:], frozenset(self.order[i:])) for i in range(len(self.order) + 1)]

    def __call__(self, args, kwargs, act_input=None, noop=None, out=None, group_offsets=None,
                 traced: bool = False) -> Call:
        """The Call of one call: its epilogue arguments bound to the parameters (positional,
        keywords by name, then defaults), then the call keywords. By name without inspect where
        the signature allows (and always while torch.compile traces, which does not trace
        inspect); inspect's binding names what is wrong."""
        if kwargs or len(args) != len(self.order):
            try:
                if not (traced or self.by_name):
                    raise TypeError
                args = self._bind_names(args, kwargs, not traced)
            except TypeError:
                if traced:
                    raise
                try:
                    bound = self.signature.bind(*args, **kwargs)
                except TypeError as exc:
                    raise TypeError(f"mxq: {self.name}(): {exc}") from None
                bound.apply_defaults()
                args = tuple(bound.arguments[n] for n in self.order)
        return Call([args[i] for i in self.tensor_pos], [args[i] for i in self.scalar_pos], act_input, noop, out,
                    group_offsets)

    def plain(self, args, act_input, dact):
        """A call's positional arguments as (*tensors, *floats), or None unless every one is of
        its parameter's exact class (torch.Tensor, float), none requires grad in grad mode (the
        checked path warns), and ``act_input`` is a plain tensor exactly when the op has ``dact``
        (FusedOp._fast_call: the rest of a call's checks run in the native dispatcher)."""
        if len(args) != len(self.classes):
            return None
        grad = torch.is_grad_enabled()
        for a, cls in zip(args, self.classes):
            if a.__class__ is not cls or (grad and cls is torch.Tensor and a.requires_grad):
                return None
        if (act_input is not None or dact) and (
                not dact or act_input.__class__ is not torch.Tensor or (grad and act_input.requires_grad)):
            return None
        return args if self.in_order else [args[i] for i in self.tensor_pos] + [args[i] for i in self.scalar_pos]

    def _bind_names(self, args, kwargs, eager: bool = True) -> tuple:
        """The arguments in parameter order, bound as __call__ does, without inspect (``eager``:
        not while torch.compile traces, which takes the plain loop)."""
        order = self.order
        given = len(args)
        if eager and given < len(self._named) and kwargs.keys() == self._named[given][1]:
            # (the common keyword call: exactly the parameters after the positional ones, by name)
            return (*args, *[kwargs[k] for k in self._named[given][0]])
        if len(args) > len(order):
            raise TypeError(f"mxq: {self.name}() takes {len(order)} arguments, got {len(args)}")
        values = dict(zip(order, args))
        for k, v in kwargs.items():
            if k in self.positional_only:  # (as inspect's binding of an eager call refuses it)
                raise TypeError(f"mxq: {self.name}(): {k!r} parameter is positional only, but was passed as a keyword")
            if k not in order or k in values:
                raise TypeError(f"mxq: {self.name}() got an unexpected or repeated argument {k!r}")
            values[k] = v
        for k in order:
            if k not in values:
                if k not in self.defaults:
                    raise TypeError(f"mxq: {self.name}() missing argument {k!r}")
                values[k] = self.defaults[k]
        return tuple(values[k] for k in order)


def has_dtensor(call: Call) -> bool:
    """Whether a call has DTensor operands (then integrations/distributed.py runs it; it refuses
    DTensor group offsets with plain inputs by name, eager or traced alike)."""
    return any(is_dtensor(t) for t in (*call.tensors, call.act_input, call.group_offsets))


def halves_call(spec, epilogue, call: Call, checked: bool = True) -> Call:
    """A gated op's call (mxq/frontend/gated.py) as its inner op's: the inner op's tensors and
    floats over views of the [..., 2N] tensors' halves; noop, out and group_offsets pass through
    (the groups run along the rows, which the halves share). ``checked`` False: a call of a kept
    route's key (FusedOp._route), whose operand shapes were checked by its first call."""
    names = epilogue.tensor_params
    x = call.tensors[0]
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        validation.check_plain_tensor(names[0], x)
        raise ValueError(f"mxq: argument {names[0]!r} must have at least one dimension")
    if spec.act is not None:
        if call.act_input is not None:
            raise ValueError("mxq: argument 'act_input' is only used by ops with dact=...; this op has "
                             f"act={spec.act!r}")
        if x.shape[-1] % 2:
            raise ValueError(f"mxq: argument {names[0]!r} of an act={spec.act!r} op holds the gate and up "
                             f"halves along its last dimension, which must be even; got shape {tuple(x.shape)}")
        n = x.shape[-1] // 2
        for nm, t in zip(names[1:], call.tensors[1:]) if checked else ():  # (here: the shapes as passed)
            if isinstance(t, torch.Tensor):
                validation.check_broadcast(nm, t, names[0], x)
        halves = [split_halves(nm, t, 2 * n) for nm, t in zip(names, call.tensors)]
        return call._replace(tensors=[h[0] for h in halves] + [h[1] for h in halves], scalars=list(call.scalars))
    act_input = call.act_input
    if act_input is None:
        raise ValueError(f"mxq: argument 'act_input' is required with dact={spec.dact!r}")
    validation.check_plain_tensor("act_input", act_input)
    # (its dtype and device: the inner op's checks, in their order, naming its halves _mxq_gate and
    # _mxq_up 'act_input', Epilogue.arg_names)
    n = x.shape[-1]
    if tuple(act_input.shape) != (*x.shape[:-1], 2 * n):
        raise ValueError(f"mxq: argument 'act_input' of a dact={spec.dact!r} op is the forward's input "
                         f"[..., 2N] = {(*x.shape[:-1], 2 * n)} for {names[0]!r} of shape {tuple(x.shape)}, got "
                         f"{tuple(act_input.shape)}")
    return call._replace(tensors=[*call.tensors, *act_input.chunk(2, -1)],  # (chunk: both views in one torch call)
                         scalars=[*call.scalars, 0.0], act_input=None)


def split_halves(name, t, width):
    """(gate half, up half) of tensor argument ``t``: full or row operands are split along
    their last dimension, column and scalar operands serve both halves."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[-1] == 1:
        return t, t
    if t.shape[-1] != width:
        raise ValueError(f"mxq: argument {name!r} has shape {tuple(t.shape)}; a gated op's tensors hold "
                         f"[..., {width}] (both halves), or broadcast along the last dimension")
    return t.chunk(2, -1)  # ([..., :width // 2], [..., width // 2:]: width is even; one torch call for both views)


__all__ = ["FP4_KEYWORDS", "KEYWORDS", "Binder", "Call", "halves_call", "has_dtensor", "split_halves"]
