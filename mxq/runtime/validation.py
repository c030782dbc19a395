"""The call path: check every input before anything runs, then run the kernel or the reference.

Validation lives here, not in the kernels, so that every bad argument gets a Python exception
that names it (kernels only see inputs that passed), and CPU and CUDA callers get identical
errors. ``MXQ_STRICT=1`` turns a GPU fallback to the reference into an error.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

import torch

from ..frontend.epilogue import Epilogue
from ..frontend.spec import DTYPES, QuantSpec
from ..frontend import gated, ir
from ..formats import fp4_layouts, groups
from . import operands
from ..tensor import MXFP8Tensor, data_rows, flat_dims, grouped_gap


def _fail_type(name: str, what: str, got) -> None:
    raise TypeError(f"mxq: argument {name!r} must be {what}, got {got}")


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def check_one_float32(name: str, t, what: str, device, owner: str) -> None:
    """Raise unless tensor argument ``name`` is a plain one-element float32 tensor on ``device``
    (``what`` it must be, ``owner`` what sets the device, both for the message)."""
    check_plain_tensor(name, t)
    if t.dtype != torch.float32 or t.numel() != 1:
        raise ValueError(f"mxq: argument {name!r} must be {what}, got dtype {t.dtype} with {t.numel()} elements")
    if t.device != device:
        raise ValueError(f"mxq: argument {name!r} is on {t.device} but {owner} is on {device}")


def check_noop_type(noop) -> None:
    """``noop`` is a tensor or None (its dtype, size and device: check_call's check_one_float32)."""
    if noop is not None and not isinstance(noop, torch.Tensor):
        _fail_type("noop", "a one-element float32 torch.Tensor or None", type(noop).__name__)


def check_tensor_arg(name: str, t) -> None:
    """An epilogue's tensor argument ``name``: a number is refused with the way to pass one (a
    float parameter), anything else as check_plain_tensor refuses it."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        raise TypeError(f"mxq: argument {name!r} must be a torch.Tensor, got {type(t).__name__}; to pass a "
                        f"number, make it a float parameter of the epilogue: annotate it (`{name}: float`) "
                        "or give it a float default")
    check_plain_tensor(name, t)


def check_plain_tensor(name: str, t) -> None:
    """``t`` must be a dense, strided torch.Tensor (or nn.Parameter). Tensor subclasses (DTensor,
    FakeTensor wrappers, ...) are refused: their shape and their data pointer may describe
    different tensors (a DTensor's global shape, its local shard's memory), which a kernel would
    read out of bounds; sparse and nested tensors have no single strided buffer."""
    if not isinstance(t, torch.Tensor):
        _fail_type(name, "a torch.Tensor", type(t).__name__)
    if type(t) not in _PLAIN and not _traced_fake(t):
        raise TypeError(f"mxq: argument {name!r} is a {type(t).__name__}, a torch.Tensor subclass mxq does not "
                        "handle; pass a plain tensor (for a DTensor: .to_local() or .full_tensor())")
    if t.layout is not torch.strided or t.is_nested:
        raise TypeError(f"mxq: argument {name!r} must be a dense strided tensor, got "
                        f"{'a nested tensor' if t.is_nested else f'layout {t.layout}'}")
    if t.device.type == "meta":
        raise ValueError(f"mxq: argument {name!r} is on the meta device, which holds no data to quantize (under "
                         "torch.compile, fake tensors need no such call: the operator has a fake implementation)")


def _traced_fake(t) -> bool:
    """A fake tensor while torch.compile or torch.export traces (non-strict torch.export hands
    the Python code FakeTensors, as dynamo does not): a shape without data, which the checks read
    as a plain tensor's; the operator node checks the real tensors when the program runs."""
    if not torch.compiler.is_compiling():
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def check_dtype(name: str, t: torch.Tensor, first=None) -> None:
    """A tensor argument's dtype: float32, float16 or bfloat16, and (``first``: (name, tensor) of
    the epilogue's first tensor) the first tensor's."""
    if t.dtype not in DTYPES:
        _fail_type(name, "float32, float16 or bfloat16", t.dtype)
    if first is not None and t.dtype != first[1].dtype:
        raise TypeError(f"mxq: argument {name!r} has dtype {t.dtype} but {first[0]!r} has {first[1].dtype}; "
                        "every tensor input of one op has the same dtype")


def check_dtypes(names, tensors, act_input=None) -> None:
    """check_dtype of a call's epilogue tensors (``names``) and act_input, as check_call has it:
    for torch.compile's traced call (torch_ops.call), whose fake implementation would otherwise
    meet an unserved dtype first and name its own argument."""
    first = (names[0], tensors[0])
    for name, t in [*zip(names, tensors), ("act_input", act_input)]:
        if isinstance(t, torch.Tensor):
            check_dtype(name, t, None if t is tensors[0] else first)


def check_devices(names, tensors, act_input=None, noop=None, group_offsets=None) -> None:
    """The devices of a call's tensor arguments (the epilogue's tensors ``names``, act_input,
    noop, group_offsets) as check_call has them: each on the first tensor's device, which is not
    the meta device. For torch.compile's traced call (torch_ops.call), whose tensors are fake
    ones check_call's class checks refuse: a call mixing devices dispatches to the operator's fake
    implementation (its Meta kernel), which would return outputs of unwritten memory where eager
    raises."""
    fname, f = names[0], tensors[0]
    if f.device.type == "meta":
        raise ValueError(f"mxq: argument {fname!r} is on the meta device, which holds no data to quantize")
    for name, t in [*zip(names[1:], tensors[1:]), ("act_input", act_input), ("noop", noop)]:
        if isinstance(t, torch.Tensor):
            check_device(name, t, (fname, f))
    if isinstance(group_offsets, torch.Tensor) and group_offsets.device != f.device:
        raise ValueError(f"mxq: argument 'group_offsets' is on {group_offsets.device} but the input is on {f.device}")


def check_device(name: str, t: torch.Tensor, first) -> None:
    """Raise a ValueError naming argument ``name`` unless ``t`` is on the device of ``first``
    ((name, tensor) of the call's first tensor): every tensor argument's rule."""
    fname, f = first
    if t.device != f.device:
        raise ValueError(f"mxq: argument {name!r} is on {t.device} but {fname!r} is on {f.device}")


def check_call(spec: QuantSpec, epilogue: Epilogue, call, prepare: bool = False) -> None:
    """Raise a TypeError/ValueError naming the first bad argument of ``call`` (a
    mxq/runtime/call.py Call); return None if all is well (after a one-time warning for an input
    that requires grad: warn_no_autograd). ``prepare``: op.prepare()'s call, whose group offsets
    are read at every launch."""
    tensors, scalars, act_input, noop, out, group_offsets, fp4_args = call
    names = epilogue.arg_names
    first = None
    for name, t in zip(names, tensors):
        check_tensor_arg(name, t)
        check_dtype(name, t)
        if first is None:
            first = (name, t)
            continue
        check_broadcast(name, t, *first)
        check_dtype(name, t, first)
        check_device(name, t, first)
    check_scalars(epilogue.scalar_params, scalars)
    fname, f = first
    if spec.dact:
        if act_input is None:
            raise ValueError(f"mxq: argument 'act_input' is required with dact={spec.dact!r}")
        check_plain_tensor("act_input", act_input)
        if act_input.shape != f.shape:
            raise ValueError(f"mxq: argument 'act_input' has shape {tuple(act_input.shape)} but "
                             f"{fname!r} has {tuple(f.shape)}")
        check_dtype("act_input", act_input, first)
        check_device("act_input", act_input, first)
    elif act_input is not None:
        raise ValueError("mxq: argument 'act_input' is only used by ops with dact=...; this op has dact=None")
    if noop is not None:
        check_noop_type(noop)
        check_one_float32("noop", noop, "a one-element float32 tensor", f.device, repr(fname))
    if group_offsets is not None:
        groups.check(group_offsets, flat_dims(f.shape)[0], f.device)
        if prepare and (group_offsets.dtype != torch.int32 or not group_offsets.is_contiguous()):
            got = (f"dtype {group_offsets.dtype}" if group_offsets.dtype != torch.int32
                   else f"a view of strides {tuple(group_offsets.stride())}")
            raise ValueError("mxq: prepare() reads 'group_offsets' at every launch: it must be a contiguous int32 "
                             f"tensor (another would be converted once, at bind time); got {got}")
        gap = None if spec.is_fp4 else grouped_gap(spec)  # (FP4's: check_fp4_groups, naming the format)
        if gap:
            raise ValueError(f"mxq: argument 'group_offsets' {gap}")
    if spec.is_fp4 or fp4_args is not None:
        check_fp4(spec, fp4_args, f, gated.out_shape(epilogue, f.shape), group_offsets)
    if out is not None:
        check_out(spec, out, f, group_offsets, gated.out_shape(epilogue, f.shape), noop)
        check_out_apart(epilogue, call, spec.hadamard)
    if torch.is_grad_enabled():
        for name, t in (*zip(names, tensors), ("act_input", act_input)):
            if t is not None and t.requires_grad:
                warn_no_autograd(epilogue.name, name)


def check_broadcast(name: str, t: torch.Tensor, fname: str, f: torch.Tensor) -> None:
    """Tensor argument ``t`` equals the first tensor ``f``'s shape or broadcasts against it as an
    operand (operands.kind_of); raise naming both otherwise."""
    if t.shape != f.shape and operands.kind_of(t.shape, *flat_dims(f.shape), f.shape) is None:
        raise ValueError(f"mxq: argument {name!r} has shape {tuple(t.shape)}, which neither equals "
                         f"{fname!r}'s {tuple(f.shape)} nor broadcasts against it (a row [N], a column "
                         "[..., 1] or a scalar; docs/NUMERICS.md, Operands)")


OUT_FIELDS = ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax", "dbias", "colwise_amax")


def _span(t: torch.Tensor):
    """The bytes ``t`` can touch, [first, end) (None for an empty tensor): its first element to
    its last, whatever lies between (two views interleaved in one buffer count as overlapping)."""
    if t.numel() == 0:
        return None
    last = sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def check_apart(out: MXFP8Tensor | None, reads, writes=()) -> None:
    """``out``'s tensors and ``writes`` (further (name, tensor) outputs, e.g. op.gemm's acc_out)
    must not share memory with each other or with a tensor the call reads (``reads``: (name,
    tensor) pairs): the kernels read each input once and write each output once, so a shared
    byte would be written while it is read, or twice (wrong bytes, silently)."""
    spans = [(f"out.{f}", _span(getattr(out, f))) for f in OUT_FIELDS if out is not None and getattr(out, f) is not None]
    spans += [(n, _span(t)) for n, t in writes]
    others = [(n, _span(t)) for n, t in reads]
    for i, (name, a) in enumerate(spans):
        for other, b in spans[:i] + others:
            if _overlap(a, b):
                raise ValueError(f"mxq: argument {name!r} overlaps {other!r} in memory: an op's outputs must not "
                                 "share memory with each other or with its inputs")


def check_out_apart(epilogue: Epilogue, call, hadamard: bool = False) -> None:
    """check_apart of a call's ``out`` against every tensor the call reads (a value check: on
    every call, also those that skip the checks of their layout, FusedOp._plans); ``hadamard``:
    the op's (its given amax is the pair)."""
    reads = [*zip(epilogue.arg_names, call.tensors), ("act_input", call.act_input), ("noop", call.noop),
             ("group_offsets", call.group_offsets)]
    check_apart(call.out, [(n, t) for n, t in reads if isinstance(t, torch.Tensor)])
    given = call.fp4.global_amax if call.fp4 is not None else None
    if given is not None and call.out is not None:
        # (NVFP4's given amax is copied into out.amax (and colwise_amax) before the kernel reads it:
        # those it may be, as an earlier call's t.amax; no other output field)
        tensors = [t for t in (given if isinstance(given, (tuple, list)) else (given,)) if isinstance(t, torch.Tensor)]
        fields = [(f"out.{f}", getattr(call.out, f)) for f in OUT_FIELDS
                  if f not in ("amax", "colwise_amax") and getattr(call.out, f) is not None]
        if tensors:
            check_apart(None, [("global_amax", t) for t in tensors], fields)
            _check_amax_copies(call.out, given, tensors, hadamard)


def _addresses(t: torch.Tensor) -> list:
    """The byte address of each element of a 0-d or 1-D tensor, in order."""
    flat = t.reshape(-1)  # (a view: 0-d and 1-D tensors)
    return [flat.data_ptr() + i * flat.stride(0) * flat.element_size() for i in range(flat.numel())]


def _check_amax_copies(out: MXFP8Tensor, given, tensors, hadamard: bool) -> None:
    """A given NVFP4 amax (``given``: global_amax; ``tensors``: its tensors) is copied into
    out.amax (and out.colwise_amax) before the kernels read it. A given tensor may be the very
    field it is copied into (an earlier result's t.amax given back: each value copied onto
    itself); sharing memory with them any other way is refused by name (a value overwritten by
    the copy before it is read gives wrong bytes; torch's copy_ refuses a partial overlap)."""
    # (an out= of a Hadamard op passed to another op still holds its colwise_amax until the call
    # labels it: no copy goes there)
    pair = hadamard and out.colwise_amax is not None
    fields = [f for f in ((out.amax, out.colwise_amax) if pair else (out.amax,)) if f is not None]
    if not any(_overlap(_span(t), _span(f)) for t in tensors for f in fields):
        return
    # each given tensor and the addresses it is copied onto (launch.given_amax_first, reference.write_fp4 and
    # write_fp4_groups): the amax (one a group); with hadamard=True the pair, as one [2] tensor or two
    if not pair:
        targets = [(given, _addresses(out.amax))]
    elif isinstance(given, torch.Tensor):
        targets = [(given, _addresses(out.amax) + _addresses(out.colwise_amax))]
    else:
        targets = [(v, _addresses(f)) for v, f in zip(given, (out.amax, out.colwise_amax)) if isinstance(v, torch.Tensor)]
    for t, onto in targets:
        if any(_overlap(_span(t), _span(f)) for f in fields) and _addresses(t) != onto:
            raise ValueError("mxq: argument 'global_amax' overlaps 'out.amax' (or 'out.colwise_amax') in memory "
                             "other than as the very field it is copied into: pass the earlier result's t.amax "
                             "(and t.colwise_amax) as they are, or a copy")


def _overlap(a, b) -> bool:
    """Whether two spans (_span; None for an empty tensor) share a byte."""
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


_PAIR = ("hadamard=True's pair (amax, colwise_amax): a float32 tensor of shape (2,), two floats, or two "
         "one-element float32 tensors (such as an earlier result's t.amax and t.colwise_amax)")


def _check_amax_pair(amax, device) -> None:
    """``global_amax`` of a hadamard=True call: the untransformed values' amax and the transformed
    copy's, as the outputs' amax and colwise_amax hold them (fp4_layouts.given_amax's forms)."""
    if isinstance(amax, torch.Tensor):
        check_plain_tensor("global_amax", amax)
        if amax.dtype != torch.float32 or amax.shape != (2,):
            raise ValueError(f"mxq: argument 'global_amax' must be {_PAIR}, got dtype {amax.dtype} of shape "
                             f"{tuple(amax.shape)}")
        if amax.device != device:
            raise ValueError(f"mxq: argument 'global_amax' is on {amax.device} but the input is on {device}")
        _check_amax_tensor(amax)
        return
    if not isinstance(amax, (tuple, list)) or len(amax) != 2:
        _fail_type("global_amax", _PAIR, type(amax).__name__ if not isinstance(amax, (tuple, list))
                   else f"{type(amax).__name__} of {len(amax)}")
    if all(isinstance(v, torch.Tensor) for v in amax):
        for v in amax:
            check_one_float32("global_amax", v, _PAIR, device, "the input")
            _check_amax_tensor(v)
        return
    for v in amax:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            _fail_type("global_amax", _PAIR, f"a pair holding {type(v).__name__}")
        _check_amax_value(v, tuple(amax))


_FP32_MAX = torch.finfo(torch.float32).max
_FP32_MAX_TEXT = repr(_FP32_MAX)  # (a str: torch.compile traces no formatting of a float under dynamic=True)
_FP32_ROUNDS_TO_INF = 2.0 ** 128 - 2.0 ** 103  # (exact in float64: a float or an int at or above it rounds to inf)


def _check_amax_tensor(t) -> None:
    """A tensor given as an amax (one value, a group's, or the Hadamard pair's): on the CPU each
    value >= 0 (NaN refused; inf taken: an fp32 tensor holds no finite value above fp32's largest,
    and inf is the amax of values holding inf, which N2 defines), as _check_amax_value has a
    number; on a GPU not read (that would wait for the device: the kernels take the value as
    docs/NUMERICS.md's formula does)."""
    if t.device.type == "cpu" and not torch.compiler.is_compiling() and t.numel():
        bad = t.reshape(-1)[~(t >= 0).reshape(-1)]  # (NaN fails the comparison)
        if bad.numel():
            raise ValueError(f"mxq: argument 'global_amax' must hold values >= 0 (or inf), got {float(bad[0])!r}")


def check_traced_int(name: str, value) -> None:
    """An int torch.compile made symbolic (dynamic=True, or a value that changed) has no digits to
    round while tracing: beyond 2^53 (where float() would round it twice) it is refused by name
    (a call rounds an int to fp32 from its digits: ir.scalar)."""
    if type(value) is int and value.__class__ is not int and not -2 ** 53 <= value <= 2 ** 53:
        # (while dynamo traces, a symbolic int's type reads int and its __class__ does not; a
        # subclass of int, kept constant, has another type; bools were refused before)
        raise ValueError(f"mxq: argument {name!r}: an int beyond 2^53 that torch.compile traces as a dynamic value "
                         "cannot be rounded to fp32 from its digits; pass a float, or mark it static")


def _check_amax_value(v, shown) -> None:
    """A Python number given as an amax: >= 0 and rounding to a finite fp32 (it is stored as fp32,
    rounded once: below 2^128 - 2^103, fp32's largest finite value plus half its ulp; a larger
    finite value would become inf, which it is not), or inf itself (the amax of values holding inf:
    N2 takes S_enc = 1), compared exactly (an int of any size too; a traced one beyond 2^53 is
    named as such first: its comparisons round it); ``shown``: what the error repeats of the
    argument."""
    check_traced_int("global_amax", v)
    if not (v >= 0 and (v == math.inf or v < _FP32_ROUNDS_TO_INF)):  # (comparisons alone: torch.compile traces them)
        raise ValueError(f"mxq: argument 'global_amax' must be >= 0 and round to a finite fp32 (below 2^128 - 2^103; "
                         f"fp32's largest finite value is {_FP32_MAX_TEXT}), or inf, got {_shown(shown)}")


def _shown(value) -> str:
    """repr of a Python number (or a pair of them) for a message; a number that torch.compile
    traces as a dynamic value (whose class is not int or float while tracing) has no text there."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    if not torch.compiler.is_compiling() or all(v.__class__ is int or v.__class__ is float for v in values):
        return repr(value)
    return "a value torch.compile traces as dynamic (it fails this check)"


def check_fp4(spec: QuantSpec, args, x: torch.Tensor, shape, group_offsets) -> None:
    """An NVFP4 / MXFP4 call (mxq/formats/fp4.py): outputs of ``shape`` whose packed dims are even
    (N; M too with colwise, whose copy is [N, M/2]); groups (``group_offsets``) with compact scales
    and without hadamard, stochastic_rounding or block_2d, with colwise every group end even
    (checked here on CPU; on CUDA where the reference reads them); the Hadamard
    transform's bf16 input and 16-row blocks; and ``args`` (fp4.CallArgs: global_amax, seed,
    offset; any op's call may carry them, only the ops that use them take them; a grouped NVFP4
    call's global_amax one value for every group or one per group; a hadamard=True call's the pair
    (amax, colwise_amax))."""
    m, n = flat_dims(shape)
    if spec.is_fp4:
        gap = fp4_layouts.packed_gap(spec, shape)
        if gap:
            raise ValueError(f"mxq: {gap}")
        if group_offsets is not None:
            check_fp4_groups(spec, group_offsets)
    if spec.hadamard:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"mxq: hadamard=True takes bfloat16 inputs only (the transform's result is rounded to "
                            f"bf16, as TransformerEngine's), got {x.dtype}")
        if m % 16:
            raise ValueError(f"mxq: hadamard=True transforms 16-row groups of the colwise copy: M (the product of "
                             f"the leading dimensions) must be a multiple of 16; got output shape {tuple(shape)}")
    if args is None:
        return
    amax = args.global_amax
    if amax is not None:
        if spec.format != "nvfp4":
            raise ValueError(f"mxq: argument 'global_amax' is NVFP4's per-tensor amax; this op has "
                             f"format={spec.format!r}")
        want = "a one-element float32 tensor or a float" + (
            "" if group_offsets is None else f" (or a float32 tensor of one amax per group, ({group_offsets.numel()},))")
        if spec.hadamard:
            _check_amax_pair(amax, x.device)
        elif isinstance(amax, torch.Tensor) and group_offsets is not None and amax.numel() != 1:
            check_plain_tensor("global_amax", amax)
            g = group_offsets.numel()
            if amax.dtype != torch.float32 or amax.shape != (g,):
                raise ValueError(f"mxq: argument 'global_amax' of a grouped call must be a float32 tensor of one "
                                 f"amax per group ({g},) or one value for all, got dtype {amax.dtype} and shape "
                                 f"{tuple(amax.shape)}")
            if amax.device != x.device:
                raise ValueError(f"mxq: argument 'global_amax' is on {amax.device} but the input is on {x.device}")
            _check_amax_tensor(amax)
        elif isinstance(amax, torch.Tensor):
            check_one_float32("global_amax", amax, want, x.device, "the input")
            _check_amax_tensor(amax)
        elif isinstance(amax, bool) or not isinstance(amax, (int, float)):
            _fail_type("global_amax", want, type(amax).__name__)
        else:
            _check_amax_value(amax, amax)
    for name, bound in (("seed", 2 ** 64), ("offset", 2 ** 62)):
        value = getattr(args, name)
        if value is None:
            continue
        if not spec.stochastic_rounding:
            raise ValueError(f"mxq: argument {name!r} is only used with stochastic_rounding=True")
        if isinstance(value, bool) or not isinstance(value, int):
            _fail_type(name, "an int", type(value).__name__)
        if not 0 <= value < bound:
            raise ValueError(f"mxq: argument {name!r} must be in [0, 2^{bound.bit_length() - 1}), got {value}")


def check_fp4_groups(spec: QuantSpec, group_offsets) -> None:
    """What a grouped NVFP4 / MXFP4 call may be (docs/NUMERICS.md "NVFP4 and MXFP4", groups):
    compact scales, no Hadamard transform, stochastic rounding or 16x16 tiles; with the colwise
    copy, whose bytes pack rows 2j and 2j + 1, even group ends (checked on CPU offsets; CUDA
    ones where the reference reads them, fp4_layouts.group_bounds)."""
    gap = fp4_layouts.grouped_gap(spec)
    if gap:
        raise ValueError(f"mxq: argument 'group_offsets' with format={spec.format!r} {gap}")
    if spec.colwise and group_offsets.device.type == "cpu" and not torch.compiler.is_compiling():
        # (traced offsets have no values: the compiled call checks them when it runs)
        fp4_layouts.group_bounds(group_offsets, colwise=True)


def check_scalars(names, scalars) -> None:
    """The epilogue's float parameters: Python numbers (not bools) that fit a float."""
    for name, s in zip(names, scalars):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            _fail_type(name, "a float", type(s).__name__)
        if isinstance(s, int):
            try:
                float(s)
            except OverflowError:
                raise ValueError(f"mxq: argument {name!r} is an integer of {s.bit_length()} bits, too large "
                                 "for a float") from None


def check_out(spec: QuantSpec, out: MXFP8Tensor, x: torch.Tensor, group_offsets=None, shape=None,
              noop=None) -> None:
    """``out`` must hold exactly the tensors ``spec`` writes, shaped as MXFP8Tensor.empty makes them
    for outputs of ``shape`` (default: x's; mxq/frontend/gated.py's two-halves ops write wider ones).
    With ``noop`` it must already be described as this op's outputs (its scale_mode, and a
    ``colwise_amax`` only with the Hadamard transform): a call that may write nothing cannot
    relabel it (MXFP8Tensor.label)."""
    if not isinstance(out, MXFP8Tensor):
        _fail_type("out", "an MXFP8Tensor", type(out).__name__)
    shape = x.shape if shape is None else shape
    if tuple(out.shape) != tuple(shape):
        # (its fields may still fit: FP4's colwise copy [N, M/2] and FP8 block scaling's GEMM-ready
        # one [N, M] read only M and N; it would come back describing another shape)
        raise ValueError(f"mxq: argument 'out' holds outputs of shape {tuple(out.shape)} but this call writes "
                         f"{tuple(shape)} (pass an out made for it: MXFP8Tensor.empty(op.spec, {tuple(shape)}, ...))")
    want = MXFP8Tensor.empty(spec, shape, x.dtype, "meta", group_offsets=group_offsets)
    for field in OUT_FIELDS:
        w, g = getattr(want, field), getattr(out, field)
        if w is None:
            # (it would come back holding an earlier call's values, and dequantize() read them; a
            # colwise_amax is a label, which MXFP8Tensor.label clears)
            if g is not None and field != "colwise_amax":
                raise ValueError(f"mxq: argument 'out' holds {field}, which this op does not write; set "
                                 f"out.{field} = None or pass an out made for the op (MXFP8Tensor.empty(op.spec, ...))")
            continue
        if g is None:
            raise ValueError(f"mxq: argument 'out' has no {field}, which this op writes")
        check_plain_tensor(f"out.{field}", g)
        if g.shape != w.shape or g.dtype != w.dtype:
            raise ValueError(f"mxq: argument 'out.{field}' must be {w.dtype} of shape {tuple(w.shape)}, "
                             f"got {g.dtype} of shape {tuple(g.shape)}")
        if g.device != x.device:
            raise ValueError(f"mxq: argument 'out.{field}' is on {g.device} but the input is on {x.device}")
        if field == "colwise_data" and spec.colwise_transposed and not g.is_contiguous():
            # (the kernels store the copy's rows a whole row apart; at M == N a padded [N, M] view has
            # the right shape, and the rule for [M, N] rows below would take it)
            raise ValueError(f"mxq: argument 'out.colwise_data' is the transposed colwise copy: it must be "
                             f"contiguous of shape {tuple(w.shape)}, got strides {tuple(g.stride())}")
        if field in ("rowwise_data", "colwise_data") and spec.is_fp4 and not g.is_contiguous():
            # (the packed codes, two a byte: the kernels write them as contiguous [M, N/2] and [N, M/2])
            raise ValueError(f"mxq: argument 'out.{field}' of format={spec.format!r} must be contiguous, got "
                             f"strides {tuple(g.stride())}")
        if field in ("rowwise_data", "colwise_data") and group_offsets is None and not g.is_contiguous():
            m, n = flat_dims(shape)
            if data_rows(g, m, n) is None:
                raise ValueError(f"mxq: argument 'out.{field}' must be contiguous or rows of unit stride at least "
                                 f"{n} elements apart (MXFP8Tensor.empty(..., row_align=16)), got strides "
                                 f"{tuple(g.stride())}")
        elif field.endswith("_scale") and not _laid_out_as(g, w):
            raise ValueError(f"mxq: argument 'out.{field}' must be laid out as MXFP8Tensor.empty makes it: "
                             + ("contiguous" if w.is_contiguous() else
                                f"strides {tuple(w.stride())} (a view of a padded buffer: the GEMM-ready layout)")
                             + f", got strides {tuple(g.stride())}")
        elif not field.endswith("_scale") and not g.is_contiguous() and g.stride() != w.stride():
            raise ValueError(f"mxq: argument 'out.{field}' must be contiguous")
    if out.fp8 != spec.fp8 or out.scale_layout != spec.scale_layout or (out.format, out.block) != (spec.format,
                                                                                                  spec.block):
        raise ValueError(f"mxq: argument 'out' is {out.format} {out.block} {out.fp8}/{out.scale_layout} but the op "
                         f"writes {spec.format} {spec.block} {spec.fp8}/{spec.scale_layout}")
    old = out.group_offsets
    if noop is not None and ((old is None) != (group_offsets is None)
                             or (old is not None and old.shape != group_offsets.shape)):
        raise ValueError(f"mxq: argument 'out' with noop: out holds outputs of "
                         f"{'no groups' if old is None else f'{old.numel()} groups'}, which a call that writes "
                         f"nothing cannot relabel; this call has "
                         f"{'no groups' if group_offsets is None else f'{group_offsets.numel()} groups'} (pass an out "
                         "made for it: MXFP8Tensor.empty(op.spec, ..., group_offsets=...))")
    if noop is not None and (out.scale_mode not in (None, spec.scale_mode)
                             or (out.colwise_amax is not None and not spec.hadamard)):
        raise ValueError(f"mxq: argument 'out' with noop: out holds outputs of scale_mode={out.scale_mode!r}"
                         f"{' with the Hadamard transform' if out.colwise_amax is not None else ''}, which a call "
                         f"that writes nothing cannot relabel; this op writes scale_mode={spec.scale_mode!r}"
                         f"{' with the transform' if spec.hadamard else ''} (pass an out made for it: "
                         "MXFP8Tensor.empty(op.spec, ...))")


def _laid_out_as(g: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``g`` (of ``w``'s shape) has ``w``'s layout: contiguous where ``w`` is, else
    ``w``'s strides on every dimension longer than 1 (the GEMM-ready scales are views of padded
    buffers, which the kernels write at the padded offsets; a dimension of one element has no
    stride to keep)."""
    if w.is_contiguous():
        return g.is_contiguous()
    return all(a == b for a, b, size in zip(g.stride(), w.stride(), w.shape) if size > 1)


_warned: set = set()


def warn_no_autograd(op: str, name: str) -> None:
    """An input that requires grad, with grad mode on: mxq's outputs are data with no autograd
    graph, so nothing flows back to it. A UserWarning, once per op name and argument."""
    if (op, name) in _warned:
        return
    _warned.add((op, name))
    warnings.warn(f"mxq: argument {name!r} requires grad, but mxq records no autograd graph: its outputs are "
                  f"MXFP8 data and no gradient flows back to {name!r} through this call. To train through mxq, "
                  "call it inside a torch.autograd.Function whose backward computes the gradient (the pattern of "
                  "examples/train_mlp.py; no warning there, nor under torch.no_grad())",
                  UserWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first caller outside mxq, as seen from the function
    that calls this one."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "mxq":
        frame, level = frame.f_back, level + 1
    return level


def fallback(reason: str) -> None:
    """A GPU call the kernels cannot serve: warn once per reason, or raise under MXQ_STRICT=1."""
    _warn_once_or_raise(reason, f"no GPU kernel for this call ({reason})",
                        f"running the torch reference instead of a GPU kernel: {reason}", stacklevel=4)


def _warn_once_or_raise(key: str, strict: str, message: str, stacklevel: int) -> None:
    """The one-time warning of a degraded call, or a RuntimeError under MXQ_STRICT=1."""
    if os.environ.get("MXQ_STRICT") == "1":
        raise RuntimeError(f"mxq: {strict} and MXQ_STRICT=1")
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"mxq: {message}", RuntimeWarning, stacklevel=stacklevel)


def operand_layouts(tensors, act_input, copy: bool = True):
    """(tensors, act_input, layouts) for the kernels: each epilogue input's kind (full, strided,
    row, col, scalar; mxq/runtime/operands.py) and the tensors to pass. A layout the kernels cannot read
    in place (a non-contiguous full input that is not a strided 2-D view, a non-contiguous
    broadcast operand or act_input) is copied to contiguous with a one-time warning, an error
    under MXQ_STRICT=1."""
    x = tensors[0]
    m, n = flat_dims(x.shape)
    out, layouts = [], []
    for i, t in enumerate(tensors):
        kind = "full" if i == 0 else operands.kind_of(t.shape, m, n, x.shape)
        if kind == "full" and not t.is_contiguous() and operands.is_row_strided(t, n):
            kind = "strided"
        elif not t.is_contiguous():
            if not copy:
                raise ValueError(f"mxq: argument #{i} must be contiguous or a strided 2-D view with unit last "
                                 "stride here (a copy would be bound once and never see later updates)")
            copied("non-contiguous tensor inputs are copied (strided 2-D views with unit last stride are not)")
            t = t.contiguous()
        out.append(t)
        layouts.append(kind)
    if act_input is not None and not act_input.is_contiguous():
        if not copy:
            raise ValueError("mxq: argument 'act_input' must be contiguous here (a copy would be bound once)")
        copied("a non-contiguous act_input is copied")
        act_input = act_input.contiguous()
    return out, act_input, tuple(layouts)


def copied(reason: str) -> None:
    """An input copied before the kernel: warn once per reason, or raise under MXQ_STRICT=1."""
    _warn_once_or_raise(reason, reason, reason, stacklevel=5)


def dtype_name(dtype: torch.dtype) -> str:
    """"fp32", "fp16" or "bf16" of a (validated) torch dtype."""
    return DTYPES[dtype]


__all__ = ["OUT_FIELDS", "check_apart", "check_call", "check_fp4", "check_out", "check_out_apart", "copied", "dtype_name", "fallback", "operand_layouts"]
