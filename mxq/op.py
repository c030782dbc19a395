"""``@mxq.fused_quant`` and ``mxq.quantize``: the user-facing op object, the top of the data path.

Shaped like Triton's ``@jit``: decorating parses and validates once (epilogue -> IR, options ->
QuantSpec); the op renders its source lazily (codegen) and runs calls through a launch.Launcher
per (device, dtype), whose kernels the compiler caches by source, or the torch reference. A
call's values become one ``Call`` (mxq/runtime/call.py) where it enters, and ``FusedOp._route``
is the one place its route is chosen: DTensor shards, the torch operator while torch.compile
traces, else a checked eager call (the kernels on CUDA when they serve it, else the reference),
whose route is kept under the call's key (Call.key, like Triton's specialisation key) for later
calls of that layout; ordinary calls go straight to the native allocating route (_fast_call).
Every stage below is called from here and never calls back; FusedOp is the only writer of its
own state. ``mxq.quantize`` is this op with the identity epilogue.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
from functools import lru_cache

import torch

from .frontend import codegen, gated, ir
from .runtime import export, ffi, inspection, launch, limits, targets, validation
from .runtime import gemm as gemm_rt
from .runtime import operands as operands_mod
from .runtime.call import FP4_KEYWORDS, Binder, Call, halves_call, has_dtensor, split_halves
from .integrations import torch_ops
from .formats import fp4
from .formats import reference as _reference
from .frontend.epilogue import IDENTITY, Epilogue, parse
from .frontend.spec import BLOCK_SIZES, QuantSpec
from .tensor import MXFP8Tensor

_Tensor = torch.Tensor
_FAST_NUMEL = limits.MAX_ROWS  # (below limits.unsupported's bounds: beyond them the reference serves, with a warning)
_MAX_PLANS = 256  # routes kept per op (FusedOp._plans): calls of yet more layouts are checked every time


class FusedOp:
    """One fused quantization op: an epilogue (the decorated function, parsed) plus a QuantSpec
    (format, directions, scales, act/dact, amax, dbias). Calling it quantizes the epilogue's
    value; ``reference``, ``prepare``, ``gemm``, ``source`` and ``asm`` are its other faces."""

    def __init__(self, fn, spec: QuantSpec, epilogue: Epilogue | None = None):
        functools.update_wrapper(self, fn)  # (first: an attribute of fn's named like one of the op's is the op's)
        self.fn = fn
        self.spec = spec
        self.epilogue = epilogue if epilogue is not None else parse(fn)
        # (args, kwargs, call keywords) -> Call; an FP4 op also takes FP4_KEYWORDS (_bind_call)
        self._bind = Binder(fn, self.epilogue, FP4_KEYWORDS if spec.is_fp4 else ())
        self._fresh_runtime()
        self._source: str | None = None
        self._packed_smem: int | None = None  # see _packed_smem_shortfall: on first use
        # whether a call's route depends on its inputs' 16-byte alignment (limits: FP4's kernels, and
        # FP8 block scaling's transposed copy and fp32 colwise or grouped calls on the aligned
        # vectorised kernel, serve aligned inputs alone): then its key holds it
        self._key_aligned = spec.is_fp4 or spec.format == "fp8_block"

    # what an op builds as it runs: process-local (native functions, launchers, routes kept for
    # this process's calls), never pickled or copied (__getstate__), built again on use
    _RUNTIME = ("_plans", "_fast", "_launchers", "_dispatchers", "_cpp_dispatchers", "_gemm_dispatcher", "_torch_id")

    def _fresh_runtime(self) -> None:
        """The op's _RUNTIME state, empty, and the op registered with the torch operator."""
        self._plans: dict = {}  # Call.key -> a checked call's route, for later calls of that key (_route)
        # (dtype, CUDA device index) -> launcher, filled after a checked call took the allocating
        # native route: later ordinary calls go straight to it (_fast_call)
        self._fast: dict = {}
        self._launchers: dict = {}  # (device, dtype name) -> launch.Launcher
        self._dispatchers = None  # (destination-passing, allocating) native functions, built once
        self._cpp_dispatchers = None  # the same for register()/dispatcher() where Python calls take none
        self._gemm_dispatcher = None  # op.gemm's destination-passing function (dispatcher(gemm=True))
        self._torch_id = torch_ops.register(self)  # what the torch operator calls this op by (its identity)

    def __getstate__(self) -> dict:
        """An op pickled or copied by its state (__reduce_ex__): its definition without _RUNTIME."""
        return {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}

    def __setstate__(self, state: dict) -> None:
        """A copy or an unpickled op: its definition, fresh _RUNTIME state, registered with the
        torch operator as a new op is (a compiled graph finds it by its identity)."""
        self.__dict__.update(state)
        self._fresh_runtime()

    def __reduce_ex__(self, protocol):
        """Pickled by reference (as functions are): the attribute of the defining module the op
        is (its function's name, or any other module-level name it is bound to), found again on
        loading (a spawned worker imports the module, which builds the op again); mxq.quantize's
        built-in ops by their spec. Any other op (one made inside a function) pickles and copies
        by its state, as objects do."""
        if self.fn is _identity and self.epilogue is IDENTITY:
            return _quantize_op, (self.spec,)
        module = self.fn.__module__
        name = self.fn.__qualname__
        try:
            found = _op_by_name(module, name) is self
            if not found:
                name = next((k for k, v in vars(importlib.import_module(module)).items() if v is self), None)
                found = name is not None
        except Exception:  # (not importable, or not an attribute path: "<locals>")
            found = False
        if found:
            return _op_by_name, (module, name)
        return super().__reduce_ex__(protocol)

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, /, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                 **kwargs) -> MXFP8Tensor:
        """The op on the epilogue's arguments (``args``, ``kwargs``): an MXFP8Tensor of the spec's
        format. ``act_input``: a dact op's forward pre-activation; ``noop``: a one-element float32
        tensor, 1.0 writes nothing; ``out``: buffers to write into (MXFP8Tensor.empty of op.spec);
        ``group_offsets``: cumulative row-group ends (colwise blocks restart at each). An FP4 op
        also takes ``global_amax``, ``seed`` and ``offset``."""
        traced = torch.compiler.is_compiling()  # torch.compile: one operator node (integrations/torch_ops.py)
        if not traced and self._fast and out is None:
            got = self._fast_call(args, kwargs, act_input, noop, group_offsets)
            if got is not None:
                return got
        elif not traced and out.__class__ is MXFP8Tensor and "_mxq_into" in out.__dict__ and noop is None:
            got = self._fast_into(args, kwargs, act_input, out, group_offsets)
            if got is not None:
                return got
        call = self._bind_call(args, kwargs, act_input, noop, out, group_offsets, traced)
        key = None if traced else call.key(self._key_aligned)
        plan = self._plans.get(key)
        return plan(call) if plan is not None else self._route(call, traced, key=key)

    def _bind_call(self, args, kwargs, act_input, noop, out, group_offsets, traced: bool = False) -> Call:
        """The Call of one call (Binder), an FP4 op's own keywords (global_amax, seed, offset)
        taken out of ``kwargs`` into Call.fp4 first."""
        extra = None
        if self.spec.is_fp4 and any(k in kwargs for k in FP4_KEYWORDS):
            kwargs = dict(kwargs)
            extra = fp4.CallArgs(*(kwargs.pop(k, None) for k in FP4_KEYWORDS))
        call = self._bind(args, kwargs, act_input, noop, out, group_offsets, traced)
        return call if extra is None else call._replace(fp4=extra)

    def _with_accumulator(self, acc, operands: tuple, params: dict) -> tuple:
        """(args, kwargs) of op.gemm's epilogue call: the accumulator in the place of the
        epilogue's first tensor parameter; ``operands`` (positional) fill the other parameters in
        their order, skipping those ``params`` names (as a call's keywords would leave them to
        their names). The parameters given up to the first one left out go positionally
        (positional-only ones included), the rest by name."""
        names = self.epilogue.param_order
        first = self.epilogue.tensor_params[0]
        if first in params:
            raise TypeError(f"mxq: {self.__name__}.gemm: {first!r} is the accumulator (the epilogue's first tensor), "
                            "which the GEMM computes; pass the other tensors and floats")
        named = next((k for k in params if k in self._bind.positional_only), None)
        if named is not None:  # (as a call refuses it: Binder)
            raise TypeError(f"mxq: {self.__name__}(): {named!r} parameter is positional only, but was passed as a keyword")
        free = [k for k in names if k != first and k not in params]
        if len(operands) > len(free):
            raise TypeError(f"mxq: {self.__name__}.gemm got too many positional arguments: {len(operands)} after a "
                            f"and w, for {len(free)} parameter(s) ({', '.join(free) or 'none'}: the epilogue's but "
                            f"the accumulator {first!r} and those given by name)")
        values = {**params, **dict(zip(free, operands)), first: acc}
        args = []
        for k in names:
            if k not in values:
                break
            args.append(values.pop(k))
        return tuple(args), values

    def _lower(self, call: Call, checked: bool = True):
        """(the op that runs ``call``, the call it runs): this op itself; GatedOp's inner op over
        the halves. ``checked`` False: a call of a kept route's key, whose layout checks passed."""
        return self, call

    def _route(self, call: Call, traced: bool | None = None, shards: bool = False, key=None) -> MXFP8Tensor:
        """Where every call goes, chosen here only: DTensor operands to integrations/distributed.py,
        which runs each rank's local shards back through here (``shards``); while torch.compile
        traces, the torch operator node; else a checked eager call, whose route is kept under the
        call's ``key`` (Call.key) when every call of that key may take it unchecked (_plans)."""
        if not shards and has_dtensor(call):
            from .integrations import distributed  # (torch.distributed only where DTensors are used)

            return distributed.call(self, call)
        op, lowered = self._lower(call)
        if torch.compiler.is_compiling() if traced is None else traced:
            return torch_ops.call(op._torch_id, lowered)
        run, lowered, reusable = op._plan(lowered)
        if reusable and key is not None and len(self._plans) < _MAX_PLANS:
            self._plans[key] = run if op is self else (lambda c: run(self._lower(c, False)[1]))
        return run(lowered)

    def _eager(self, call: Call) -> MXFP8Tensor:
        """A checked eager call into ``call.out`` (what the torch operator runs)."""
        run, call, _ = self._plan(call)
        return run(call)

    def _plan(self, call: Call):
        """(run, call, reusable) of a call, checked here (validation.check_call): the compiled
        kernel on CUDA when one serves it (launch.Launcher.plan), else the reference; ``call`` with the operands the kernels read
        (validation.operand_layouts: copied where they cannot be read in place, which makes the
        route not ``reusable`` by later calls of the same key). With ``noop`` and no ``out``, the
        outputs start zeroed (a noop call writes nothing)."""
        validation.check_call(self.spec, self.epilogue, call)
        x = call.tensors[0]
        unserved = self._unserved(x, call) if x.is_cuda else None
        if unserved:
            validation.fallback(unserved)
        launcher = self._launcher_for(x) if x.is_cuda and not unserved else None
        if launcher is None:
            return self._reference_run, call, False
        tensors, act_input, layouts = validation.operand_layouts(call.tensors, call.act_input)
        copied = act_input is not call.act_input or any(a is not b for a, b in zip(tensors, call.tensors))
        run, allocating = launcher.plan(call, layouts)
        if allocating:
            self._fast[(x.dtype, x.get_device())] = launcher  # ordinary calls skip even the key (_fast_call)
        if any(s.__class__ is not float for s in call.scalars):  # (an int: the native routes take its value as a
            native = run  # double, so one beyond 2^53 is rounded to fp32 exactly first; Call.key holds the classes)
            run = lambda c: native(c._replace(scalars=[ir.scalar(s) for s in c.scalars]))  # noqa: E731
        return run, call._replace(tensors=tensors, act_input=act_input), not copied

    def _unserved(self, x, call=None) -> str | None:
        """Why the kernels cannot serve this op on ``x`` (``call``: its out= and group offsets), or None
        (limits.unserved)."""
        return limits.unserved(self.spec, self.epilogue, x, self._packed_smem_shortfall, call)

    def _packed_smem_shortfall(self) -> str | None:
        """limits.smem_shortfall of this op, its need computed once like ``source``."""
        if self._packed_smem is None:
            self._packed_smem = limits.packed_shared_bytes(self.spec, self.epilogue, None)
        return limits.smem_shortfall(self.epilogue, self._packed_smem)

    def _reference_run(self, call: Call) -> MXFP8Tensor:
        with torch.no_grad():  # outputs are data, not part of an autograd graph
            return _reference.run(self.spec, self.epilogue, launch.zeroed_out(self.spec, self.epilogue, call))

    def _fast_call(self, args, kwargs, act_input, noop=None, group_offsets=None):
        """A CUDA call without ``out`` (epilogue arguments positional or by keyword), or None:
        once a checked call of this (dtype, device) took the allocating native route, later ones
        go straight to it. The native dispatcher checks per call what it serves (operand kinds,
        dtypes, devices, contiguity, alignment, noop, group ends: csrc/dispatch.cc, errors naming
        the argument) and sends what it does not serve to the checked path (ffi's callback); the
        rest is checked here: plain tensor and float classes, grad (Binder.plain), the size
        limit (_fast_launcher)."""
        args = self._plain_args(args, kwargs, act_input)
        fast = self._fast_launcher(args[0], noop, group_offsets) if args is not None else None
        return fast.allocating(*args, act_input, noop, group_offsets) if fast is not None else None

    def _fast_into(self, args, kwargs, act_input, out, group_offsets):
        """A CUDA call into ``out`` without noop, or None: where a checked call of this op wrote
        into this very ``out`` on the native route and nothing Python's checks read has changed
        since (launch.into_token: the input's shape, dtype and device, the group count, out's
        description, each field tensor with its shape and dtype), a later one goes straight to
        that route, which checks per call what the native dispatcher checks (each field's
        device, element count and layout, memory overlap: csrc/dispatch.cc); the rest as
        _fast_call."""
        args = self._plain_args(args, kwargs, act_input)
        return None if args is None else _into(self, args, act_input, out, group_offsets)

    def _plain_args(self, args, kwargs, act_input):
        """A fast route's epilogue arguments as (*tensors, *floats) (Binder.plain), or None where
        the checked path binds them: keywords the signature does not bind by name, or an FP4
        op's (which may be its own call keywords), or arguments that are not plain."""
        if kwargs:
            if not self._bind.by_name or self.spec.is_fp4:
                return None
            try:
                args = self._bind._bind_names(args, kwargs)
            except TypeError:  # (the checked path names it)
                return None
        return self._bind.plain(args, act_input, self.spec.dact)

    def _fast_launcher(self, x, noop, group_offsets):
        """The launcher of ``x``'s (dtype, device) whose allocating route serves a call (_fast),
        or None: ``x`` non-empty below the kernels' size limit, contiguous or a 2-D view of rows
        (the dispatcher's strided kind) whose extent is below it too; ``noop`` and
        ``group_offsets`` plain tensors, the ends contiguous int32 (others take the checked path,
        which converts them)."""
        fast = self._fast.get((x.dtype, x.get_device()))
        return fast if fast is not None and _fast_served(x, noop, group_offsets) else None

    def reference(self, /, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                  **kwargs) -> MXFP8Tensor:
        """The torch reference result, on whatever device the inputs are."""
        op, call = self._lower(self._bind_call(args, kwargs, act_input, noop, out, group_offsets))
        validation.check_call(op.spec, op.epilogue, call)
        return op._reference_run(call)

    def gemm(self, a, w, /, *operands, out: MXFP8Tensor | None = None, acc_out=None, **params) -> MXFP8Tensor:
        """The op applied to the GEMM ``a @ w.T`` in the GEMM's epilogue: a [M, K], w [N, K]
        (bf16 or fp16, K-major), the accumulator (fp32) as the epilogue's first tensor; the
        other tensors (``operands``: [M, N], a row [N], a column [M, 1] or a scalar, in a's
        dtype) and floats (``params``) as in a call. Returns the op's outputs, written by the
        epilogue of mxq's sm_90 GEMM (mxq/kernels/gemm_quant.py); the product itself is never
        stored. On CPU (and GPUs other than sm_90) the reference: the op on the fp32 matmul.
        ``out``: an MXFP8Tensor of the op's outputs for [M, N] with contiguous data rows
        (``MXFP8Tensor.empty(spec, (M, N), a.dtype, device, row_align=1)``) to write into, eager
        calls only. ``acc_out``: an fp32 [M, N] tensor that also receives the accumulator (a test
        hook, eager calls only). ``act_input``: a dact op's [M, N] tensor in a's dtype (the
        forward's pre-activation: the backward's dgrad GEMM then writes dact(act_input) times
        the op's value, quantized, and its dbias). Serves MXFP8 and 1x128 FP8 block scaling,
        rowwise and/or colwise (32- or 128-row blocks; the colwise data [M, N], or FP8 block
        scaling's transposed copy [N, M] with scale_layout="gemm"), every scale layout, with an
        ordinary act or dact, with or without amax and dbias (a's dtype, as the outputs of a call
        on the GEMM's bf16/fp16 product would have it); other options raise ValueError naming the
        option (codegen.gemm_gap). Under torch.compile one operator node (torch.ops.mxq.fused_gemm,
        integrations/torch_ops.py; a dact op's act_input its last tensor)."""
        gap = codegen.gemm_gap(self.spec, self.epilogue)
        if gap:
            raise ValueError(f"mxq: {self.__name__}.gemm does not serve {gap}: the GEMM epilogue writes MXFP8 or "
                             "1x128 FP8 block-scaling outputs, rowwise and/or colwise (and their amax and dbias), "
                             "with no act or an ordinary (not gated) act or dact")
        act_input = params.pop("act_input", None)
        taken = [k for k in ("group_offsets", "noop") if params.pop(k, None) is not None]  # (None: as a call's)
        if taken:
            raise ValueError(f"mxq: {self.__name__}.gemm does not serve {taken[0]}= (grouped GEMMs and noop are "
                             "calls' keywords it has no route for)")
        traced = torch.compiler.is_compiling()
        for name, given in (("acc_out", acc_out), ("out", out)):
            if traced and given is not None:
                raise ValueError(f"mxq: {self.__name__}.gemm: {name}= serves eager calls only, not torch.compile")
        for name, t in (("a", a), ("w", w)):  # (before the epilogue's own tensors are bound and named: a dense
            if isinstance(t, torch.Tensor) and t.device.type == "meta":  # strided tensor, no subclass, before any work)
                raise ValueError(f"mxq.gemm: {name} is on the meta device, which holds no data to multiply")
            validation.check_plain_tensor(name, t)
        if not traced:
            gemm_rt.check_args(a, w, acc_out=acc_out)
        else:  # (the operator checks the rest on its real tensors when the graph runs: addresses need them)
            for name, t in (("a", a), ("w", w)):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"mxq.gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        m, n = a.shape[0], w.shape[0]
        acc = torch.empty((m, n), dtype=torch.float32, device="meta")  # (the accumulator's place)
        call = self._bind_call(*self._with_accumulator(acc, operands, params), None, None, None, None, traced)
        if call.tensors[0] is not acc:
            raise TypeError(f"mxq: {self.__name__}.gemm: the accumulator did not bind to the epilogue's first "
                            f"tensor {self.epilogue.tensor_params[0]!r}")
        others = call.tensors[1:]
        validation.check_scalars(self.epilogue.scalar_params, call.scalars)  # (a call's rule, before any conversion)
        names = gemm_rt.operand_names(self)
        for name, t in zip(names, others):  # (plain dense tensors, as a call's, before the GEMM and its hook;
            if not (isinstance(t, torch.Tensor) and t.is_meta):  # a meta one is not on a's device: operand_kinds)
                validation.check_tensor_arg(name, t)
        if self.spec.dact is not None and isinstance(act_input, torch.Tensor) and not act_input.is_meta:
            validation.check_plain_tensor("act_input", act_input)  # (the rest: check_act_input's)
        gemm_rt.operand_kinds(a, w, others, names)
        if self.spec.dact is not None or act_input is not None:  # (the kernel reads it as one more full operand)
            others = [*others, gemm_rt.check_act_input(self, a, w, act_input)]
        if traced:
            return torch_ops.gemm_call(self._torch_id, a, w, others, call.scalars)
        if torch.is_grad_enabled():  # (the outputs are data: nothing flows back to a or w)
            for name, t in (("a", a), ("w", w)):
                if t.requires_grad:
                    validation.warn_no_autograd(f"{self.__name__}.gemm", name)
        if out is not None:
            validation.check_out(self.spec, out, a, None, (m, n))
            for name in ("rowwise_data", "colwise_data"):
                data = getattr(out, name)
                if data is not None and not data.is_contiguous():
                    raise ValueError(f"mxq: {self.__name__}.gemm: argument 'out.{name}' must be contiguous (the "
                                     "GEMM writes whole rows: MXFP8Tensor.empty(..., row_align=1)), got strides "
                                     f"{tuple(data.stride())}")
            if self.spec.colwise_transposed and out.colwise_data.data_ptr() % 16:
                raise ValueError(f"mxq: {self.__name__}.gemm: argument 'out.colwise_data' (the transposed copy, "
                                 "stored 16 bytes at a time) must start on a 16-byte boundary, got address "
                                 f"{out.colwise_data.data_ptr():#x}")
        if out is not None or acc_out is not None:  # (what the call writes, apart from what it reads)
            reads = [("a", a), ("w", w), *zip(names, others)]  # (a dact op's act_input: its last, so named)
            validation.check_apart(out, reads, [("acc_out", acc_out)] if acc_out is not None else [])
        return self._gemm_run(a, w, others, [ir.scalar(s) for s in call.scalars], acc_out, out)

    def _gemm_run(self, a, w, others, scalars, acc_out=None, out: MXFP8Tensor | None = None) -> MXFP8Tensor:
        """op.gemm's checked call (what the torch operator runs): the fused GEMM on sm_90, else the
        reference on the fp32 matmul; into ``out`` where given (checked by the caller)."""
        if out is not None:
            out.label(self.spec)
        if a.is_cuda and targets.device_arch(a.device) == gemm_rt.ARCH:
            if out is None:
                out = MXFP8Tensor.empty(self.spec, (a.shape[0], w.shape[0]), a.dtype, a.device, row_align=1)
            if not all(t.is_contiguous() for t in others):  # (the kinds read only then: gemm_op reads them too)
                others = [operands_mod.unit_stride(t, kind, validation.copied)  # (a dact op's act_input: full)
                          for t, kind in zip(others, gemm_rt.operand_kinds(a, w, others,
                                                                           gemm_rt.operand_names(self)))]
            return gemm_rt.gemm_op(self, a, w, others, scalars, out, acc_out)
        if a.is_cuda:
            validation.fallback(f"op.gemm runs on sm_90a only, not {targets.device_arch(a.device)}")
        acc = torch.matmul(a.detach().float(), w.detach().float().t())  # (data: no autograd graph, as the kernel's)
        if acc_out is not None:
            acc_out.copy_(acc)
        given = out
        if self.spec.dbias and out is not None:  # (the reference's dbias is fp32, the input's: given's a's dtype)
            out = dataclasses.replace(out, dbias=torch.empty_like(out.dbias, dtype=acc.dtype))
        act_input = None
        if self.spec.dact is not None:  # (act_input: the last of the kernel's operands)
            others, act_input = others[:-1], others[-1].float()
        call = Call([acc, *[t.float() for t in others]], list(scalars), act_input=act_input, out=out)
        validation.check_call(self.spec, self.epilogue, call)
        res = self._reference_run(call)
        if not self.spec.dbias:
            return res
        if given is None:  # (dbias in a's dtype, as the kernel writes it: the reference's fp32 sum rounded once more)
            return dataclasses.replace(res, dbias=res.dbias.to(a.dtype))
        given.dbias.copy_(res.dbias)
        return given

    def prepare(self, /, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                **kwargs):
        """Check and bind one call on CUDA tensors once; return (launch, out) where ``launch()``
        re-runs the kernel into ``out`` with no Python checks or allocation (for CUDA graphs and
        tight loops). The inputs must stay alive and unchanged in shape. ``group_offsets`` (int32,
        contiguous) is read on the device at every launch: change it in place between launches."""
        op, call = self._lower(self._bind_call(args, kwargs, act_input, noop, out, group_offsets))
        return op._prepare(call)

    def _prepare(self, call: Call):
        validation.check_call(self.spec, self.epilogue, call, prepare=True)
        x = call.tensors[0]
        unserved = self._unserved(x, call) if x.is_cuda else "the input is not a CUDA tensor"
        launcher = self._launcher_for(x) if not unserved else None
        if launcher is None:
            why = unserved or "no kernel serves this GPU"
            raise ValueError(f"mxq: prepare() needs CUDA tensors that a compiled kernel serves: {why}")
        tensors, act_input, layouts = validation.operand_layouts(call.tensors, call.act_input, copy=False)
        call = launch.zeroed_out(self.spec, self.epilogue, call._replace(tensors=tensors, act_input=act_input))
        return launcher.prepare(call, layouts)

    def _launcher_for(self, x):
        """The launcher running the compiled kernels for CUDA tensor ``x``, or None (after a
        one-time warning, or an error under MXQ_STRICT=1) when no kernel can serve it."""
        reason = limits.unsupported(x)
        if reason is not None:
            validation.fallback(reason)
            return None
        key = (x.device, validation.dtype_name(x.dtype))
        fn = self._launchers.get(key)
        if fn is None:
            fn = self._launchers[key] = launch.Launcher(self, targets.device_arch(x.device), key[1],
                                                        self._native_dispatchers())
        return fn

    def _native_dispatchers(self):
        """The op's native dispatchers (built once: ffi.dispatchers_or_none), or None: launch.Launcher
        then binds calls in Python."""
        if self._dispatchers is None:
            self._dispatchers = ffi.dispatchers_or_none(self) or False
        return self._dispatchers or None

    # -- inspection ------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The rendered CuTeDSL module of this op (one module serves every dtype and shape)."""
        if self._source is None:
            self._source = codegen.render(self.spec, self.epilogue)
        return self._source

    def _with_tuning(self, tuning):
        """This op built as a benchmark's variant: its module rendered with ``tuning`` (a
        kernels.config.Tuning, codegen.render's hook), before first use. Returns the op."""
        if self._source is not None:
            raise RuntimeError("mxq: _with_tuning must come before the op's module is rendered")
        self._source = codegen.render(self.spec, self.epilogue, tuning)
        self._packed_smem = limits.packed_shared_bytes(self.spec, self.epilogue, tuning)
        return self

    def asm(self, arch: str = "sm_90", dtype: str = "bf16", gemm: bool = False, operands=None) -> dict:
        """Compile without a GPU and return {"ptx", "mlir", "source", "path", ...}. ``gemm=True``:
        the kernel of ``op.gemm`` instead (sm_90a, bf16 or fp16; ``operands``: the kind of each
        epilogue tensor after the accumulator, "full", "row", "col" or "scalar", all "full" by
        default; a dact op's act_input is full and not named; inspection.gemm_artifacts)."""
        if not isinstance(gemm, bool):  # (as dispatcher()'s: "yes" compiled the GEMM's kernel)
            raise TypeError(f"mxq: asm() argument 'gemm' must be a bool, got {type(gemm).__name__}")
        if gemm:
            if targets.normalize_arch(arch) not in ("sm_90", "sm_90a"):
                raise ValueError(f"mxq: asm(gemm=True): op.gemm's kernel is sm_90a's (wgmma), got arch={arch!r}")
            return inspection.gemm_artifacts(self, dtype, operands)
        if operands is not None:
            raise ValueError("mxq: asm(): operands= names op.gemm's operand kinds; pass gemm=True")
        return inspection.compile_artifacts(self, arch=arch, dtype=dtype)

    def register(self, name: str, gemm: bool = False):
        """Register this op as TVM-FFI global ``mxq.<name>`` (destination-passing signature, see
        docs/DESIGN.md); returns the native function. CPU tensors run the reference. ``gemm=True``:
        ``op.gemm``'s instead (dispatcher(gemm=True))."""
        if name == "get_quantize_kernel":
            raise ValueError("mxq: register() name 'get_quantize_kernel' is mxq's own entry point")
        fn = self._dispatcher_for(gemm, "register()")
        ffi.register_global(name, fn)
        return fn

    def dispatcher(self, gemm: bool = False):
        """The op's destination-passing function (what ``register`` publishes). ``gemm=True``:
        ``op.gemm``'s, in Python on every call (ffi.gemm_dispatcher: ``(a, w, *the epilogue's other
        tensors, *its floats, act_input, rowwise_data, rowwise_scale, colwise_data, colwise_scale,
        amax, dbias, noop)``, the slots op.gemm does not write None)."""
        return self._dispatcher_for(gemm, "dispatcher()")

    def _dispatcher_for(self, gemm, what: str):
        """dispatcher()'s function, its refusals naming ``what`` (register() or dispatcher())."""
        if not isinstance(gemm, bool):
            raise TypeError(f"mxq: {what} argument 'gemm' must be a bool, got {type(gemm).__name__}")
        if not gemm:
            return self._destination_passing(what)
        gap = codegen.gemm_gap(self.spec, self.epilogue)
        if gap:
            raise ValueError(f"mxq: {self.__name__}.gemm does not serve {gap}, so it has no C++ route")
        if self._gemm_dispatcher is None:
            self._gemm_dispatcher = ffi.gemm_dispatcher(self)
        return self._gemm_dispatcher

    def _destination_passing(self, what: str):
        """The function ``what`` publishes: the native dispatcher (csrc/dispatch.cc; FP8 block
        scaling's are built here, its Python calls take none: ffi.dispatchers_or_none); NVFP4's
        and MXFP4's run in Python on every call (ffi.python_dispatcher, as a gated op's)."""
        self._refuse_cpp(what, native=not self.spec.is_fp4)
        if self.spec.is_fp4:
            if self._cpp_dispatchers is None:
                self._cpp_dispatchers = (ffi.python_dispatcher(self), None)
            return self._cpp_dispatchers[0]
        if self.spec.format != "mxfp8":
            if self._cpp_dispatchers is None:
                self._cpp_dispatchers = ffi.make_dispatchers(self)
            return self._cpp_dispatchers[0]
        pair = self._native_dispatchers()
        if pair is None:
            raise RuntimeError("mxq: the native dispatcher could not be built on this machine (see the warning)")
        return pair[0]

    def export(self, directory, arch: str = "sm_90", dtype: str = "bf16", name: str | None = None,
               grouped: bool = False, operands=None, note: str = "") -> dict:
        """AOT: write ``lib<name>.so`` (the kernels embedded) and the C header ``<name>.h`` into
        ``directory``, for C++ programs with no Python (see the header for the exported functions'
        arguments). ``name``, a C identifier, defaults to ``mxq_<the epilogue function's name>``
        (``libmxq_bias_gelu.so`` and ``mxq_bias_gelu.h`` for ``def bias_gelu``) and names the
        functions too: ``<name>``, ``<name>_vec``, ``<name>_rows8`` (returned under "functions",
        beside "library" and "header").
        ``grouped``: the grouped kernels too (``group_offsets``); ``operands``: each epilogue
        tensor's kind ("full", "strided", "row", "col", "scalar"), default all full; ``note``:
        a paragraph for the header (GatedOp.export's)."""
        self._refuse_cpp("export()", targets.normalize_dtype(dtype), grouped is True)
        return self._export(directory, arch, dtype, name, grouped, operands, note)

    def _export(self, directory, arch, dtype, name, grouped, operands, note, n_multiple: int = 1) -> dict:
        """export() past the refusals (GatedOp.export calls it on its inner op)."""
        if not isinstance(grouped, bool):
            raise TypeError(f"mxq: export() argument 'grouped' must be a bool, got {type(grouped).__name__}")
        return export.export(self, directory, arch=arch, dtype=dtype, name=name, grouped=grouped, operands=operands,
                             note=note, n_multiple=n_multiple)

    def _refuse_cpp(self, what: str, dtype: str | None = None, grouped: bool = False, native: bool = True) -> None:
        """What this op's C++ routes cannot serve, refused before anything is built (limits.refuse_cpp;
        ``native``: a route of compiled code alone, export or the native dispatcher)."""
        limits.refuse_cpp(what, self.spec, self.epilogue, self._packed_smem_shortfall, dtype, grouped, native)

    def output_shape(self, shape):
        """The outputs' shape for a first input of ``shape`` (wider for mxq/frontend/gated.py's ops)."""
        return gated.out_shape(self.epilogue, shape)

    def __repr__(self) -> str:
        return f"<mxq.FusedOp {self.epilogue.name} {self.spec}>"


class GatedOp(FusedOp):
    """A fused op with a gated ``act=`` or ``dact=`` (mxq/frontend/gated.py): every call runs ``inner``, an
    ordinary op over views of the [..., 2N] tensors' halves (the gate, then the up half)."""

    def __init__(self, fn, spec: QuantSpec, epilogue: Epilogue | None = None):
        super().__init__(fn, spec, epilogue)
        self._forward = spec.act is not None
        name = spec.act if self._forward else spec.dact
        derived = (gated.forward_epilogue if self._forward else gated.backward_epilogue)(self.epilogue, name)
        self.inner = FusedOp(gated.function_of(derived), dataclasses.replace(spec, act=None, dact=None), derived)
        self._inner_runtime()

    _RUNTIME = FusedOp._RUNTIME + ("_dispatcher",)

    def _inner_runtime(self) -> None:
        """The gated op's own _RUNTIME state, empty, beside FusedOp's."""
        self._dispatcher = None  # (_destination_passing(), built once)
        # the inner op's allocating launchers: a forward call goes straight to them (_fast_call)
        self._fast = self.inner._fast

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._inner_runtime()

    def _fast_call(self, args, kwargs, act_input, noop=None, group_offsets=None):
        """A forward CUDA call without ``out`` of positional arguments, or None: its tensors split
        into halves (halves_call, which checks them) and run on the inner op's allocating route
        (FusedOp._fast_call). A backward call writes both halves' outputs, which the native route
        does not allocate: it takes the checked path."""
        if not self._forward or kwargs or act_input is not None:
            return None
        args = self._bind.plain(args, None, None)
        if args is None or args[0].dim() == 0 or args[0].shape[-1] % 2:
            return None
        # (halves_call's split of each tensor, without the layers of its other checks)
        names = self.epilogue.tensor_params
        width = args[0].shape[-1]
        halves = [split_halves(name, t, width) for name, t in zip(names, args)]
        fast = self._fast_launcher(halves[0][0], noop, group_offsets)
        return None if fast is None else fast.allocating(*[h[0] for h in halves], *[h[1] for h in halves],
                                                         *args[len(names):], None, noop, group_offsets)

    def _lower(self, call: Call, checked: bool = True):
        """Every call runs the inner op over the halves (which checks it)."""
        return self.inner, halves_call(self.spec, self.epilogue, call, checked)

    def output_shape(self, shape):
        """The outputs' shape for a first input of ``shape``."""
        shape = tuple(shape)
        if not shape:
            raise ValueError(f"mxq: argument {self.epilogue.tensor_params[0]!r} must have at least one dimension")
        return (*shape[:-1], shape[-1] // 2) if self._forward else (*shape[:-1], 2 * shape[-1])

    def _destination_passing(self, what: str):
        """A gated op's destination-passing function (register(), dispatcher()): the signature of
        its own tensors (x [..., 2N] forward; the gradient [..., N] and act_input [..., 2N]
        backward) and outputs, run in Python on every call (ffi.python_dispatcher: CPU tensors the
        reference, CUDA ones the kernels over the halves)."""
        gap = limits.cpp_gap(self.inner.spec, self.inner.epilogue, native=False)
        if gap:
            raise ValueError(f"mxq: {what}: {gap}, so it has no C++ route; call the op from Python")
        if self._dispatcher is None:
            self._dispatcher = ffi.python_dispatcher(self)
        return self._dispatcher

    def export(self, directory, arch: str = "sm_90", dtype: str = "bf16", name: str | None = None,
               grouped: bool = False, operands=None) -> dict:
        """A gated op exports its inner op, the kernels over the halves: a C++ caller passes each
        [M, 2N] tensor as its two halves (export.gated_export; the header says how the arguments
        map); ``operands``: each of this op's tensors' kind."""
        dtype, kinds, note, mult = export.gated_export(self, dtype, operands)
        gap = limits.cpp_gap(self.inner.spec, self.inner.epilogue, dtype, grouped=grouped is True)
        if gap:
            raise ValueError(f"mxq: export(): {gap}, so it has no C++ route; call the op from Python")
        limits.refuse_unlaunchable("export()", self.inner._packed_smem_shortfall, dtype)
        return self.inner._export(directory, arch, dtype, export.default_name(self.epilogue) if name is None else name,
                                  grouped, kinds, note,
                                  n_multiple=mult)

    @property
    def source(self) -> str:
        return self.inner.source

    def asm(self, arch: str = "sm_90", dtype: str = "bf16", gemm: bool = False, operands=None) -> dict:
        if not isinstance(gemm, bool):
            raise TypeError(f"mxq: asm() argument 'gemm' must be a bool, got {type(gemm).__name__}")
        if gemm:  # (op.gemm refuses a gated op, as FusedOp.asm reads gemm=: no kernel of its inner op stands for it)
            raise ValueError(f"mxq: asm(gemm=True): op.gemm does not serve {codegen.gemm_gap(self.spec, self.epilogue)}")
        return self.inner.asm(arch, dtype, gemm, operands)


_OPTION_NAMES = ("fp8", "rowwise", "colwise", "scale_mode", "scale_layout", "amax", "act", "dact", "dbias",
                 "format", "block", "block_2d", "hadamard", "stochastic_rounding", "hadamard_signs")


def fused_quant(fn=None, **options):
    """Decorate an epilogue function into a fused MXFP8 (or, ``format="fp8_block"``, FP8 block
    scaling; ``"nvfp4"``, ``"mxfp4"``) quantization op. An FP4 op's calls also take the keywords
    ``global_amax``, ``seed`` and ``offset`` (as mxq.quantize).

    ``@mxq.fused_quant(act="gelu", dbias=True, colwise=True)`` or bare ``@mxq.fused_quant``;
    options (``_OPTION_NAMES``) are the format options of ``mxq.quantize`` plus ``act``, ``dact``
    and ``dbias``; its per-call keywords (``noop``, ``out``, ``group_offsets``, FP4's three) go to
    the op's calls.
    """
    unknown = set(options) - set(_OPTION_NAMES)
    if unknown:
        raise TypeError(f"mxq: fused_quant() got unknown option(s) {sorted(unknown)}; "
                        f"options are {_OPTION_NAMES}")
    if fn is not None and not callable(fn):  # (a staticmethod is callable)
        raise TypeError(f"mxq: fused_quant() takes its options by keyword (e.g. fused_quant(act='gelu')) and "
                        f"decorates a function, got {type(fn).__name__} {fn!r:.60} as its first argument")
    spec = QuantSpec(**options)

    def wrap(f):
        if isinstance(f, staticmethod):  # (above @staticmethod in a class body: its function; the op
            f = f.__func__  # binds to no instance, as a staticmethod does)
        return GatedOp(f, spec) if spec.gated else FusedOp(f, spec)

    return wrap(fn) if fn is not None else wrap


def _op_by_name(module: str, qualname: str):
    """The object at ``module``.``qualname`` (an op a pickle names: FusedOp.__reduce_ex__)."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _fast_served(x, noop, group_offsets) -> bool:
    """Whether the native route takes ``x`` (a plain tensor) without Python's checks
    (FusedOp._fast_launcher, _into): non-empty below the kernels' size limit, contiguous or a 2-D
    view of rows (the dispatcher's strided kind) whose extent is below it too; ``noop`` and
    ``group_offsets`` plain tensors, the ends contiguous int32 (others take the checked path,
    which converts them)."""
    if not 0 < x.numel() < _FAST_NUMEL:
        return False
    if not x.is_contiguous() and not (x.dim() == 2 and x.stride(1) == 1
                                      and (x.shape[0] - 1) * x.stride(0) + x.shape[1] < _FAST_NUMEL):
        return False
    if noop is not None and noop.__class__ is not _Tensor:
        return False
    # (the native route takes contiguous int32 ends; others: the checked path converts them)
    return group_offsets is None or (group_offsets.__class__ is _Tensor and group_offsets.dtype == torch.int32
                                     and group_offsets.is_contiguous())


def _into(op, args, act_input, out, group_offsets):
    """``op``'s call of plain positional ``args`` (*tensors, *floats) into ``out`` on the native
    route its token names (launch.into_token; FusedOp._fast_into), or None where the token does
    not hold for this call (launch.token_holds)."""
    launcher, token = out.__dict__["_mxq_into"]
    x = args[0]
    if launcher.op is not op or not _fast_served(x, None, group_offsets) or not launch.token_holds(
            token, x, out, group_offsets):
        return None
    nt = len(op.epilogue.tensor_params)
    try:
        return launcher._dispatch_into(Call(list(args[:nt]), list(args[nt:]), act_input, None, out, group_offsets),
                                       token)
    except (TypeError, ValueError):  # (refused before any launch: the checked path says why, naming out's field)
        del out.__dict__["_mxq_into"]
        return None


@lru_cache(maxsize=None)
def _quantize_op(spec: QuantSpec) -> FusedOp:
    return FusedOp(_identity, spec, IDENTITY)


torch_ops.quantize_op = _quantize_op  # (a loaded program's call of an op this process has not made yet)


def _identity(x):
    return x


def quantize(x, *, fp8: str = "e4m3", rowwise: bool = True, colwise: bool = False,
             scale_mode: str | None = None, scale_layout: str = "compact", amax: bool = False,
             noop=None, out: MXFP8Tensor | None = None, group_offsets=None, format: str = "mxfp8",
             block=None, block_2d: bool = False, hadamard: bool = False, stochastic_rounding: bool = False,
             global_amax=None, seed: int | None = None, offset: int | None = None,
             hadamard_signs=None) -> MXFP8Tensor:
    """Quantize ``x`` (fp32/fp16/bf16, any shape, CPU or CUDA) to MXFP8, or with
    ``format="fp8_block"`` to FP8 block scaling (``block`` (1, 128), the default, or (128, 128);
    ``scale_mode`` "pow2", the default, or "fp32"; ``scale_layout`` "compact" or "gemm";
    docs/NUMERICS.md "FP8 block scaling"). ``scale_mode`` None is the format's default ("rceil"
    for MXFP8). ``format="nvfp4"`` (TransformerEngine's NVFP4: E2M1 data two per byte, E4M3
    scales per 16 under the per-tensor amax; ``block_2d`` 16x16 weight blocks, ``hadamard`` the
    random Hadamard transform of the colwise copy, by TE's sign vector or ``hadamard_signs`` (16
    ints of +-1), ``stochastic_rounding`` with ``seed`` and ``offset``; ``global_amax`` a known
    amax, skipping the first pass: with ``hadamard`` the pair (amax, colwise_amax)) or ``"mxfp4"`` (E8M0
    scales per 32, ``scale_mode`` "floor" or "rceil"): docs/NUMERICS.md "NVFP4 and MXFP4".

    ``out`` (an extension of the DESIGN contract) writes into existing buffers, e.g. for CUDA
    graphs; with ``noop`` holding 1.0 nothing is written at all. ``group_offsets``: cumulative
    group ends along the rows (mixture of experts): colwise blocks restart at every group
    (mxq/formats/groups.py, docs/NUMERICS.md "Groups").
    """
    extra = None if global_amax is None and seed is None and offset is None else fp4.CallArgs(global_amax, seed,
                                                                                              offset)
    if torch.compiler.is_compiling():
        i = _quantize_op_id(fp8, rowwise, colwise, scale_mode, scale_layout, amax, format,
                            _traced_ints(block, BLOCK_SIZES, "block"), block_2d, hadamard, stochastic_rounding,
                            _traced_ints(hadamard_signs, (1, -1), "hadamard_signs"))
        if i.startswith(_REFUSED):  # (raised here, in the traced code: mxq's exception, not dynamo's wrapper)
            kind, message = i[len(_REFUSED):].split(":", 1)
            raise (TypeError if kind == "TypeError" else ValueError)(message)
        call = Call([x], [], None, noop, out, group_offsets, extra)
        if has_dtensor(call):  # the node runs on the local shards (integrations/distributed.py)
            return getattr(_QUANTIZE_BY_ID, _by_id_name(i))._route(call, traced=True)
        return torch_ops.call(i, call)
    signs = tuple(hadamard_signs) if hadamard_signs.__class__ is list else hadamard_signs
    key = (fp8, rowwise, colwise, scale_mode, scale_layout, amax, format,
           tuple(block) if block.__class__ is list else block,  # (a list block= is a tuple's spec)
           block_2d, hadamard, stochastic_rounding, signs)
    op = None
    # (1 == True and hash(1) == hash(True): only exact bools may hit the cache, or a call with
    # rowwise=1 would skip the validation that refuses it in a fresh process; the signs and the
    # block's entries likewise exact ints: block=(True, 128) or (1, 128.0) equals (1, 128))
    if (rowwise.__class__ is colwise.__class__ is amax.__class__ is block_2d.__class__ is hadamard.__class__
            is stochastic_rounding.__class__ is bool  # (a chain, not all(...) over a generator: every call)
            and (signs is None or (signs.__class__ is tuple and all(v.__class__ is int for v in signs)))
            and (block is None or (block.__class__ in (tuple, list) and all(v.__class__ is int for v in block)))):
        try:
            op = _QUANTIZE_OPS.get(key)
        except TypeError:  # unhashable option values: QuantSpec names the bad one
            op = None
    if op is None:
        spec = QuantSpec(fp8=fp8, rowwise=rowwise, colwise=colwise, scale_mode=scale_mode,
                         scale_layout=scale_layout, amax=amax, format=format, block=block, block_2d=block_2d,
                         hadamard=hadamard, stochastic_rounding=stochastic_rounding, hadamard_signs=hadamard_signs)
        op = _quantize_op(spec)
        if len(_QUANTIZE_OPS) < 1024:
            try:
                _QUANTIZE_OPS[key] = op
            except TypeError:  # (an unhashable value the spec takes in another form: the op is not kept)
                pass
    if extra is not None:  # (checked for every format: validation names what the op does not take)
        return op._route(Call([x], [], None, noop, out, group_offsets, extra))
    if out is None and op._fast and x.__class__ is _Tensor and not (x.requires_grad and torch.is_grad_enabled()):
        # (FusedOp._fast_call without its layers: the identity op's one plain tensor, Binder.plain's rule)
        fast = op._fast_launcher(x, noop, group_offsets)
        if fast is not None:
            return fast.allocating(x, None, noop, group_offsets)
    if (noop is None and out.__class__ is MXFP8Tensor and "_mxq_into" in out.__dict__ and x.__class__ is _Tensor
            and not (x.requires_grad and torch.is_grad_enabled())):
        got = _into(op, (x,), None, out, group_offsets)  # (FusedOp._fast_into's)
        if got is not None:
            return got
    # what op(x, noop=..., out=..., group_offsets=...) runs (FusedOp.__call__), bound here: the
    # identity op's one tensor
    call = Call([x], [], None, noop, out, group_offsets)
    key = call.key(op._key_aligned)
    plan = op._plans.get(key)
    return plan(call) if plan is not None else op._route(call, False, key=key)


def _traced_ints(values, choices, name: str):
    """A tuple option of mxq.quantize (``block``, ``hadamard_signs``: ``name``) with each entry
    that equals one of ``choices`` as that Python int, while torch.compile traces: under
    dynamic=True dynamo makes the ints of a closure symbolic, which _quantize_op_id's constant
    result refuses; a comparison guards on the value and gives the constant. Other ints and bools
    stay as they are, for QuantSpec to name; an entry of any other type (a float, a tensor: both
    refused by eager calls, and perhaps symbolic, which no constant can hold) is refused here,
    naming the option."""
    if not isinstance(values, (tuple, list)):
        return values
    out = []
    for v in values:
        if not isinstance(v, (int, torch.SymInt)):
            raise ValueError(f"mxq: {name} must hold ints, got an entry of type {type(v).__name__}")
        for c in choices:
            if not isinstance(v, bool) and v == c:
                out.append(c)
                break
        else:
            out.append(v)
    return tuple(out)


@torch_ops.constant_result
def _quantize_op_id(fp8, rowwise, colwise, scale_mode, scale_layout, amax, format="mxfp8", block=None,
                    block_2d=False, hadamard=False, stochastic_rounding=False, hadamard_signs=None) -> str:
    """torch_ops' identity of mxq.quantize's op for these options (validated here; torch.compile
    runs this while tracing and keeps the identity as a constant). Options QuantSpec refuses give
    ``_REFUSED`` + "<exception class>:<message>", which quantize raises in the traced code: an
    exception raised in here reaches the caller wrapped as dynamo's internal error."""
    try:
        spec = QuantSpec(fp8=fp8, rowwise=rowwise, colwise=colwise, scale_mode=scale_mode,
                         scale_layout=scale_layout, amax=amax, format=format, block=block, block_2d=block_2d,
                         hadamard=hadamard, stochastic_rounding=stochastic_rounding, hadamard_signs=hadamard_signs)
    except (TypeError, ValueError) as exc:
        return f"{_REFUSED}{type(exc).__name__}:{exc}"
    op = _quantize_op(spec)
    i = torch_ops.op_id(op)
    setattr(_QUANTIZE_BY_ID, _by_id_name(i), op)
    return i


def _by_id_name(i: str) -> str:
    """The attribute of _QUANTIZE_BY_ID holding the op of identity ``i`` (dynamo takes no dot in
    an attribute name, and the identity holds mxq's version)."""
    return "op_" + i.replace(".", "_").replace("-", "_")


_REFUSED = "!refused:"  # _quantize_op_id's result for options QuantSpec refuses (no identity starts so)
_QUANTIZE_OPS: dict = {}  # quantize()'s options as passed -> its op (one dict lookup per call)
# quantize()'s ops by torch_ops' identity (attribute _by_id_name(identity)), for traced DTensor calls: torch.compile
# re-reads an attribute at every access, where it would read a dict filled by the trace itself
# (_quantize_op_id, called while tracing) from a stale copy; the ops live on in _quantize_op's
# cache anyway, and torch_ops' own registry holds weak references, which it cannot trace
_QUANTIZE_BY_ID = types.SimpleNamespace()
