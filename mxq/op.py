"""``@mxq.fused_quant`` and ``mxq.quantize``: the user-facing op object, the top of the data path.

Shaped like Triton's ``@jit``: decorating parses and validates once (epilogue -> IR, options ->
QuantSpec); the object renders its source lazily (codegen), asks the compiler for one kernel per
(arch, dtype, variant), which the compiler caches by source, so re-decorating an identical
function reuses the compiled kernel, and runs calls through a launch.Launcher per (device,
dtype) or the torch reference. Every stage below is called from here and never calls back;
FusedOp is the only writer of its own state (the launchers, the native dispatchers, the fast
path). ``mxq.quantize`` is this op with the identity epilogue.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from functools import lru_cache

import torch

from .frontend import codegen, gated
from .runtime import export, ffi, inspection, launch, targets, validation
from .integrations import torch_ops
from .formats import reference as _reference
from .frontend.epilogue import IDENTITY, Epilogue, EpilogueError, parse
from .kernels import config as kconfig
from .formats.numerics import BLOCK
from .frontend.spec import QuantSpec
from .tensor import MXFP8Tensor

_CALL_KEYWORDS = ("act_input", "noop", "out", "group_offsets")
_Tensor = torch.Tensor
_FAST_NUMEL = 2 ** 31 - 64  # launch.launcher's limit: beyond it the reference serves (with a warning)


def _any_dtensor(tensors, act_input, group_offsets=None) -> bool:
    """Whether a call has DTensor operands (then distributed.call runs it, and refuses DTensor
    group offsets with plain inputs by name, eager or traced alike)."""
    return any(type(t).__name__ == "DTensor" for t in (*tensors, act_input, group_offsets))


class FusedOp:
    """One fused MXFP8 quantization op: an epilogue plus a QuantSpec."""

    def __init__(self, fn, spec: QuantSpec, epilogue: Epilogue | None = None):
        self.fn = fn
        self.spec = spec
        self.epilogue = epilogue if epilogue is not None else parse(fn)
        clash = set(self.epilogue.param_order) & set(_CALL_KEYWORDS)
        if clash:
            raise EpilogueError(f"parameter name(s) {sorted(clash)} are reserved for the call "
                                f"({', '.join(_CALL_KEYWORDS)})", inspect.getsourcefile(fn) or "<unknown>",
                                fn.__code__.co_firstlineno, "parameter name")
        self._signature = inspect.signature(fn)
        self._defaults = {k: p.default for k, p in self._signature.parameters.items()
                          if p.default is not inspect.Parameter.empty}
        self._nparams = len(self.epilogue.param_order)
        self._tensor_pos = [self.epilogue.param_order.index(n) for n in self.epilogue.tensor_params]
        # (dtype, CUDA device index) -> launcher, filled after a checked call took the allocating
        # native route; only for ops called with one plain tensor
        self._fast: dict = {}
        self._launchers: dict = {}  # (device, dtype name) -> launch.Launcher
        self._dispatchers = None  # (destination-passing, allocating) native functions, built once
        self._torch_id = torch_ops.register(self)  # what the torch operator calls this op by
        self._fast_ok = self._nparams == 1 and len(self.epilogue.tensor_params) == 1 and not spec.dact
        self._scalar_pos = [self.epilogue.param_order.index(n) for n in self.epilogue.scalar_params]
        self._source: str | None = None
        self._tuning = None  # a benchmark's kernels.config.Tuning (None: the library's choice)
        self._halves = gated.is_halves(self.epilogue)  # writes two halves side by side (mxq/frontend/gated.py)
        self._packed_smem: int | None = None  # see _packed_smem_shortfall: on first use (after _tuning is set)
        functools.update_wrapper(self, fn)

    # -- calling ---------------------------------------------------------------------------
    def _bind(self, args, kwargs):
        if kwargs or len(args) != self._nparams:
            try:
                bound = self._signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"mxq: {self.epilogue.name}(): {exc}") from None
            bound.apply_defaults()
            args = tuple(bound.arguments[n] for n in self.epilogue.param_order)
        return [args[i] for i in self._tensor_pos], [args[i] for i in self._scalar_pos]

    def __call__(self, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                 **kwargs) -> MXFP8Tensor:
        if torch.compiler.is_compiling():  # torch.compile: one operator node (mxq/integrations/torch_ops.py)
            tensors, scalars = self._bind_traced(args, kwargs)
            if _any_dtensor(tensors, act_input, group_offsets):  # the node runs on the local shards (distributed.py)
                return self._dtensor_call(tensors, scalars, act_input, noop, out, group_offsets)
            return torch_ops.call(self._torch_id, tensors, scalars, act_input, noop, out, group_offsets)
        if (self._fast and len(args) == 1 and not kwargs and noop is None and out is None and act_input is None
                and group_offsets is None):
            got = self._fast_call(args[0])
            if got is not None:
                return got
        tensors, scalars = self._bind(args, kwargs)
        if _any_dtensor(tensors, act_input, group_offsets):  # each rank quantizes its shard (mxq/integrations/distributed.py)
            return self._dtensor_call(tensors, scalars, act_input, noop, out, group_offsets)
        validation.check_call(self.spec, self.epilogue, tensors, scalars, act_input, noop, out, group_offsets)
        return self._run(tensors, scalars, act_input, noop, out, group_offsets)

    def _dtensor_call(self, tensors, scalars, act_input, noop, out, group_offsets) -> MXFP8Tensor:
        """A call with DTensor operands: each rank runs the op on its local shards (mxq/integrations/distributed.py)."""
        from . import distributed  # (torch.distributed only where DTensors are used)

        return distributed.call(self, tensors, scalars, act_input, noop, out, group_offsets)

    def _local_call(self, tensors, scalars, act_input, noop, out, group_offsets=None) -> MXFP8Tensor:
        """One rank's call on its local shards, into ``out`` (mxq/integrations/distributed.py): the operator
        node while torch.compile traces, else a checked eager call."""
        if torch.compiler.is_compiling():
            return torch_ops.call(self._torch_id, tensors, scalars, act_input, noop, out, group_offsets)
        return self._eager(tensors, scalars, act_input, noop, out, group_offsets)

    def _bind_traced(self, args, kwargs):
        """_bind without inspect (which torch.compile does not trace): positional arguments,
        then keywords by name, then defaults."""
        order = self.epilogue.param_order
        if len(args) > len(order):
            raise TypeError(f"mxq: {self.epilogue.name}() takes {len(order)} arguments, got {len(args)}")
        values = dict(zip(order, args))
        for k, v in kwargs.items():
            if k not in order or k in values:
                raise TypeError(f"mxq: {self.epilogue.name}() got an unexpected or repeated argument {k!r}")
            values[k] = v
        for k in order:
            if k not in values:
                if k not in self._defaults:
                    raise TypeError(f"mxq: {self.epilogue.name}() missing argument {k!r}")
                values[k] = self._defaults[k]
        return [values[order[i]] for i in self._tensor_pos], [values[order[i]] for i in self._scalar_pos]

    def _eager(self, tensors, scalars, act_input, noop, out, group_offsets=None) -> MXFP8Tensor:
        """A checked eager call into ``out`` (what the torch operator runs)."""
        validation.check_call(self.spec, self.epilogue, tensors, scalars, act_input, noop, out, group_offsets)
        return self._run(tensors, scalars, act_input, noop, out, group_offsets)

    def _run(self, tensors, scalars, act_input, noop, out, group_offsets=None) -> MXFP8Tensor:
        """A checked call: the compiled kernel on CUDA when one serves it, else the reference.
        With ``noop`` and no ``out``, the outputs start zeroed (a noop call writes nothing)."""
        x = tensors[0]
        out = self._noop_out(x, noop, out, group_offsets)
        unserved = self._unserved(x, group_offsets) if x.is_cuda else None
        if unserved:
            validation.fallback(unserved)
            return self._reference(tensors, scalars, act_input, noop, out, group_offsets)
        if x.is_cuda:
            launcher = self._launcher_for(x)
            if launcher is not None:
                tensors, act_input, layouts = validation.operand_layouts(tensors, act_input)
                if group_offsets is not None or self._halves or any(k != "full" for k in layouts):
                    # grouped calls, two-halves ops, broadcast or strided operands: the Python binding
                    return launcher.run(tensors, scalars, act_input, noop, out, layouts, group_offsets)
                if self._fast_ok and launcher.allocates(x, noop, out):
                    self._fast[(x.dtype, x.get_device())] = launcher  # later calls skip the checks
                return launcher(tensors, scalars, act_input, noop, out)
        return self._reference(tensors, scalars, act_input, noop, out, group_offsets)

    def _unserved(self, x, group_offsets=None) -> str | None:
        """Why the kernels cannot serve this op on ``x``, or None. A 16-bit op whose inputs do not
        fit the packed kernel's shared memory (many epilogue tensors; _packed_smem_shortfall). A
        two-halves op (mxq/frontend/gated.py): rowwise blocks of the [M, 2N] output must not straddle the
        halves (each half is its own CTAs), and the grouped kernels do not take two halves yet
        (their scale placement assumes one N)."""
        too_big = self._packed_smem_shortfall() if x.element_size() == 2 else None
        if too_big:
            return f"{too_big}; running the torch reference"
        if not self._halves:
            return None
        if x.dim() and x.shape[-1] % self._n_multiple:
            return (f"a gated backward with rowwise blocks needs N % {BLOCK} == 0 on the kernels (N = {x.shape[-1]}: "
                    f"a {BLOCK}-element block would straddle the two halves); running the torch reference")
        if group_offsets is not None:
            return "a gated backward with group_offsets is not served by the kernels yet; running the torch reference"
        return None

    @property
    def _n_multiple(self) -> int:
        """What N must be a multiple of for the kernels to serve this op: a two-halves op with
        rowwise output, a block (a rowwise block may not straddle the halves); else 1."""
        return BLOCK if self._halves and self.spec.rowwise else 1

    def _packed_smem_shortfall(self) -> str | None:
        """Why the 16-bit kernel cannot take this op, or None: the shared memory it needs at its
        largest (unaligned rows, grouped, either warp count of a rows8 plain cast;
        KernelConfig.packed_shared_bytes for this op's config and tuning, computed once like
        ``source``) exceeds what a CTA may take."""
        if self._packed_smem is None:
            cfg = codegen.kernel_config(self.spec, self.epilogue, self._tuning)
            self._packed_smem = max(c.packed_shared_bytes(cfg.n_inputs + cfg.has_dact, unaligned=True, grouped=True)
                                    for c in (cfg, *(cfg.rows8_twins() or ())))
        if self._packed_smem <= kconfig.SMEM_LIMIT:
            return None
        return (f"{len(self.epilogue.tensor_params)} epilogue tensors need {self._packed_smem} bytes of shared "
                f"memory in the 16-bit kernel (at most {kconfig.SMEM_LIMIT})")

    def _noop_out(self, x, noop, out, group_offsets=None):
        """``out``, or for a noop call without one zeroed outputs (a noop call writes nothing)."""
        if noop is not None and out is None:
            return MXFP8Tensor.empty(self.spec, gated.out_shape(self.epilogue, x.shape), x.dtype, x.device, zeroed=True,
                                     group_offsets=group_offsets)
        return out

    def _reference(self, tensors, scalars, act_input, noop, out, group_offsets=None) -> MXFP8Tensor:
        with torch.no_grad():  # outputs are data, not part of an autograd graph
            return _reference.run(self.spec, self.epilogue, tensors, scalars, act_input, noop, out, group_offsets)

    def _fast_call(self, x):
        """The common small call, e.g. mxq.quantize(x) on CUDA, or None: a launcher that already
        served this (dtype, device) through the checked path, so only what can change between
        calls is checked here; anything unusual takes the full path."""
        if type(x) is _Tensor:
            fast = self._fast.get((x.dtype, x.get_device()))
            if fast is not None and 0 < x.numel() < _FAST_NUMEL and x.is_contiguous():
                return fast.call_alloc(x, None, None)
        return None

    def reference(self, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                  **kwargs) -> MXFP8Tensor:
        """The torch reference result, on whatever device the inputs are."""
        tensors, scalars = self._bind(args, kwargs)
        validation.check_call(self.spec, self.epilogue, tensors, scalars, act_input, noop, out, group_offsets)
        out = self._noop_out(tensors[0], noop, out, group_offsets)
        return self._reference(tensors, scalars, act_input, noop, out, group_offsets)

    def prepare(self, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                **kwargs):
        """Check and bind one call on CUDA tensors once; return (launch, out) where ``launch()``
        re-runs the kernel into ``out`` with no Python checks or allocation (for CUDA graphs and
        tight loops). The inputs must stay alive and unchanged in shape. ``group_offsets`` (int32,
        contiguous) is read on the device at every launch: change it in place between launches."""
        tensors, scalars = self._bind(args, kwargs)
        validation.check_call(self.spec, self.epilogue, tensors, scalars, act_input, noop, out, group_offsets)
        if group_offsets is not None and (group_offsets.dtype != torch.int32 or not group_offsets.is_contiguous()):
            raise ValueError("mxq: prepare() reads 'group_offsets' at every launch: it must be a contiguous int32 "
                             f"tensor (an int64 one would be converted once, at bind time); got {group_offsets.dtype}")
        x = tensors[0]
        launcher = self._launcher_for(x) if x.is_cuda and not self._unserved(x, group_offsets) else None
        if launcher is None:
            raise ValueError("mxq: prepare() needs CUDA tensors that a compiled kernel serves")
        tensors, act_input, layouts = validation.operand_layouts(tensors, act_input, copy=False)
        out = self._noop_out(tensors[0], noop, out, group_offsets)
        fn, fargs, out = launcher.bind(tensors, scalars, act_input, noop, out, layouts, group_offsets)
        if fn is None:
            return (lambda: None), out
        if group_offsets is None:
            return (lambda: fn(*fargs)), out
        return launch.grouped_relaunch(fn, fargs, out, group_offsets, noop, self.spec), out

    def _launcher_for(self, x):
        """The launcher running the compiled kernels for CUDA tensor ``x``, or None (after a
        one-time warning, or an error under MXQ_STRICT=1) when no kernel can serve it."""
        reason = launch.unsupported(x)
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
        """The op's native dispatchers (built once), or None where they cannot be built (no
        C++ compiler): launch.Launcher then binds calls in Python. Two-halves ops (mxq/frontend/gated.py)
        have none: their outputs are wider than their inputs, which the dispatchers do not know."""
        if self._halves:
            return None
        if self._dispatchers is None:
            try:
                self._dispatchers = ffi.make_dispatchers(self)
            except Exception as exc:  # pragma: no cover - depends on the machine's toolchain
                import warnings

                warnings.warn(f"mxq: native dispatcher unavailable ({exc}); using the Python launch path",
                              RuntimeWarning, stacklevel=4)
                self._dispatchers = False
        return self._dispatchers or None

    # -- inspection ------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The rendered CuTeDSL module of this op (one module serves every dtype and shape)."""
        if self._source is None:
            self._source = codegen.render(self.spec, self.epilogue, self._tuning)
        return self._source

    def asm(self, arch: str = "sm_90", dtype: str = "bf16") -> dict:
        """Compile without a GPU and return {"ptx", "mlir", "source", "path", ...}."""
        return inspection.compile_artifacts(self, arch=arch, dtype=dtype)

    def register(self, name: str):
        """Register this op as TVM-FFI global ``mxq.<name>`` (destination-passing signature, see
        docs/DESIGN.md); returns the native function. CPU tensors run the reference."""
        if name == "get_quantize_kernel":
            raise ValueError("mxq: register() name 'get_quantize_kernel' is mxq's own entry point")
        fn = self._destination_passing("register()")
        ffi.register_global(name, fn)
        return fn

    def dispatcher(self):
        """The op's destination-passing function (what ``register`` publishes)."""
        return self._destination_passing("dispatcher()")

    def _destination_passing(self, what: str):
        """The function ``what`` publishes: the native dispatcher (csrc/dispatch.cc)."""
        self._refuse_cpp(what)
        pair = self._native_dispatchers()
        if pair is None:
            raise RuntimeError("mxq: the native dispatcher could not be built on this machine (see the warning)")
        return pair[0]

    def export(self, directory, arch: str = "sm_90", dtype: str = "bf16", name: str | None = None,
               grouped: bool = False, operands=None, note: str = "") -> dict:
        """AOT: write a shared library with the kernels embedded plus a C header, for C++
        programs with no Python (see the header for the exported functions' arguments);
        ``grouped``: the grouped kernels too (``group_offsets``); ``operands``: each epilogue
        tensor's kind ("full", "strided", "row", "col", "scalar"), default all full; ``note``:
        a paragraph for the header (GatedOp.export's)."""
        self._refuse_cpp("export()", targets.normalize_dtype(dtype))
        return self._export(directory, arch, dtype, name, grouped, operands, note)

    def _export(self, directory, arch, dtype, name, grouped, operands, note, n_multiple: int = 1) -> dict:
        """export() past the refusals (GatedOp.export calls it on its inner op)."""
        if not isinstance(grouped, bool):
            raise TypeError(f"mxq: export() argument 'grouped' must be a bool, got {type(grouped).__name__}")
        return export.export(self, directory, arch=arch, dtype=dtype, name=name, grouped=grouped, operands=operands,
                             note=note, n_multiple=n_multiple)

    def _refuse_cpp(self, what: str, dtype: str | None = None) -> None:
        """Ops this op's C++ routes cannot serve, refused before anything is built: a gated op's
        inner op (the gated op serves them itself), and _refuse_unlaunchable's."""
        if self.spec.gated or self._halves:
            raise ValueError(f"mxq: {what}: the inner op of a gated activation is not served by this C++ route; "
                             "use the gated op's own register(), dispatcher() or export(), or call it from Python "
                             "(eager or torch.compile)")
        self._refuse_unlaunchable(what, dtype)

    def _refuse_unlaunchable(self, what: str, dtype: str | None = None) -> None:
        """Ops whose 16-bit kernel would not fit shared memory (the Python routes run the
        reference for those CUDA calls; a C++ route would fail at launch): for
        register()/dispatcher(), which serve every dtype, whatever the dtype; for export(), its
        ``dtype``."""
        too_big = self._packed_smem_shortfall() if dtype in (None, "bf16", "fp16") else None
        if too_big:
            raise ValueError(f"mxq: {what}: {too_big}, so its bf16/fp16 calls cannot launch; call the op from "
                             "Python (which runs the torch reference for them)"
                             + (" or export it for dtype='fp32'" if dtype else ""))

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

        def derived_fn(*args):  # (never called: the op binds by this signature and runs the IR)
            raise TypeError("mxq: internal derived epilogue")

        derived_fn.__signature__ = gated.signature(derived)
        derived_fn.__name__ = derived_fn.__qualname__ = derived.name
        self.inner = FusedOp(derived_fn, dataclasses.replace(spec, act=None, dact=None), derived)
        self._dispatcher = None  # (_destination_passing(), built once)

    def _inner_args(self, tensors, scalars, act_input):
        """The inner op's positional arguments for one call of this op, from its bound tensors
        and floats (group_offsets, if any, pass through: the groups are along the rows, which the
        halves share)."""
        names = self.epilogue.tensor_params
        x = tensors[0]
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            validation.check_plain_tensor(names[0], x)
            raise ValueError(f"mxq: argument {names[0]!r} must have at least one dimension")
        if self._forward:
            if act_input is not None:
                raise ValueError("mxq: argument 'act_input' is only used by ops with dact=...; this op has "
                                 f"act={self.spec.act!r}")
            if x.shape[-1] % 2:
                raise ValueError(f"mxq: argument {names[0]!r} of an act={self.spec.act!r} op holds the gate and up "
                                 f"halves along its last dimension, which must be even; got shape {tuple(x.shape)}")
            n = x.shape[-1] // 2
            halves = [self._split(nm, t, 2 * n) for nm, t in zip(names, tensors)]
            return [h[0] for h in halves] + [h[1] for h in halves] + list(scalars)
        if act_input is None:
            raise ValueError(f"mxq: argument 'act_input' is required with dact={self.spec.dact!r}")
        validation.check_plain_tensor("act_input", act_input)
        n = x.shape[-1]
        if tuple(act_input.shape) != (*x.shape[:-1], 2 * n):
            raise ValueError(f"mxq: argument 'act_input' of a dact={self.spec.dact!r} op is the forward's input "
                             f"[..., 2N] = {(*x.shape[:-1], 2 * n)} for {names[0]!r} of shape {tuple(x.shape)}, got "
                             f"{tuple(act_input.shape)}")
        return [*tensors, act_input[..., :n], act_input[..., n:], *scalars, 0.0]

    @staticmethod
    def _split(name, t, width):
        """(gate half, up half) of tensor argument ``t``: full or row operands are split along
        their last dimension, column and scalar operands serve both halves."""
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[-1] == 1:
            return t, t
        if t.shape[-1] != width:
            raise ValueError(f"mxq: argument {name!r} has shape {tuple(t.shape)}; a gated op's tensors hold "
                             f"[..., {width}] (both halves), or broadcast along the last dimension")
        return t[..., :width // 2], t[..., width // 2:]

    def output_shape(self, shape):
        """The outputs' shape for a first input of ``shape``."""
        shape = tuple(shape)
        if not shape:
            raise ValueError(f"mxq: argument {self.epilogue.tensor_params[0]!r} must have at least one dimension")
        return (*shape[:-1], shape[-1] // 2) if self._forward else (*shape[:-1], 2 * shape[-1])

    def __call__(self, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                 **kwargs) -> MXFP8Tensor:
        tensors, scalars = self._bind(args, kwargs)
        if _any_dtensor(tensors, act_input, group_offsets):  # each rank runs it on its rows (mxq/integrations/distributed.py)
            return self._dtensor_call(tensors, scalars, act_input, noop, out, group_offsets)
        return self._eager(tensors, scalars, act_input, noop, out, group_offsets)

    def _eager(self, tensors, scalars, act_input, noop, out, group_offsets=None) -> MXFP8Tensor:
        """A call on bound tensors and floats: the inner op over the halves (which checks it)."""
        return self.inner(*self._inner_args(tensors, scalars, act_input), noop=noop, out=out,
                          group_offsets=group_offsets)

    def _local_call(self, tensors, scalars, act_input, noop, out, group_offsets=None) -> MXFP8Tensor:
        """One rank's call on its local shards: the inner op's call, traced or eager."""
        return self._eager(tensors, scalars, act_input, noop, out, group_offsets)

    def _destination_passing(self, what: str):
        """A gated op's destination-passing function (register(), dispatcher()): the signature of
        its own tensors (x [..., 2N] forward; the gradient [..., N] and act_input [..., 2N]
        backward) and outputs, run in Python on every call (ffi.python_dispatcher: CPU tensors the
        reference, CUDA ones the kernels over the halves)."""
        if self._dispatcher is None:
            self._dispatcher = ffi.python_dispatcher(self)
        return self._dispatcher

    def export(self, directory, arch: str = "sm_90", dtype: str = "bf16", name: str | None = None,
               grouped: bool = False, operands=None) -> dict:
        """A gated op exports its inner op, the kernels over the halves (the header says how its
        arguments map). Forward: a C++ caller passes each [M, 2N] tensor as its two halves,
        x[:, :N] and x[:, N:] (every tensor's gate half, then every tensor's up half; a row
        operand's [2N] halves likewise, a column or scalar operand twice); ``operands``: each of
        this op's tensors' kind, which both its halves take ("full" tensors' halves are "strided"
        views). Backward: the gradient(s) [M, N] as they are (``operands``: their kinds), then
        act_input's halves act_input[:, :N] and act_input[:, N:]; the outputs are [M, 2N] (both
        halves side by side), and the functions refuse an N that is not a multiple of 32 when the
        op has rowwise output (a block would straddle the halves); not grouped (the kernels do
        not serve a grouped gated backward)."""
        dtype = targets.normalize_dtype(dtype)
        kinds = export.check_operands(self, operands) or ("full",) * len(self.epilogue.tensor_params)
        if self._forward:
            inner_kinds, note = self._forward_export_args(kinds)
        else:
            if grouped:
                raise ValueError(f"mxq: export(): a gated backward (dact={self.spec.dact!r}) with group_offsets is "
                                 "not served by the kernels; export it with grouped=False")
            inner_kinds, note = self._backward_export_args(kinds)
        self.inner._refuse_unlaunchable("export()", dtype)
        return self.inner._export(directory, arch, dtype, name or f"mxq_{self.epilogue.name}", grouped, inner_kinds,
                                  note, n_multiple=self.inner._n_multiple)

    def _forward_export_args(self, kinds):
        """(the inner op's operand kinds, the header note) of a gated forward's export: every
        tensor's two halves, gate halves first."""
        halves = tuple("strided" if k == "full" else k for k in kinds)
        params = self.epilogue.tensor_params
        gate, up = self.inner.epilogue.tensor_params[:len(params)], self.inner.epilogue.tensor_params[len(params):]

        def how(p, k, g, u):  # how tensor p of kind k reaches the arguments g (gate) and u (up)
            if k in ("col", "scalar"):
                return f"{g} and {u} both take {p} (a {k} operand serves both halves)"
            if k == "row":
                return f"{g} = {p}[:N], {u} = {p}[N:] (as [M, N] views of strides (0, 1))"
            return f"{g} = {p}[:, :N], {u} = {p}[:, N:]"

        which = "; ".join(how(p, k, g, u) for p, k, g, u in zip(params, kinds, gate, up))
        return halves * 2, (f"Gated op {self.epilogue.name} (act={self.spec.act!r}): its [M, 2N] tensors go in as "
                            f"their two halves, every gate half first, then every up half: {which}. The outputs are "
                            f"[M, N].")

    def _backward_export_args(self, kinds):
        """(the inner op's operand kinds, the header note) of a gated backward's export: the
        gradient(s) as they are, then act_input's two halves."""
        params = ", ".join(self.epilogue.tensor_params)
        mult = self.inner._n_multiple
        need = (f"N must be a multiple of {mult} (rowwise blocks may not straddle the halves; the functions check "
                f"it), " if mult > 1 else "")
        note = (f"Gated backward {self.epilogue.name} (dact={self.spec.dact!r}): the arguments are the incoming "
                f"gradient ({params}, [M, N]), then act_input (the forward's [M, 2N] input) as its two halves, "
                f"_mxq_gate = act_input[:, :N] and _mxq_up = act_input[:, N:] (strided views). The outputs hold "
                f"both halves' gradients side by side: rowwise and colwise data [M, 2N], scale buffers, dbias and "
                f"its workspace sized for 2N columns, as listed below (checked). {need}\"_rows8\" also needs "
                f"N % {kconfig.UNIT} == 0 (checked).")
        return (*kinds, "strided", "strided"), note

    def reference(self, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                  **kwargs) -> MXFP8Tensor:
        return self.inner.reference(*self._inner_args(*self._bind(args, kwargs), act_input), noop=noop, out=out,
                                    group_offsets=group_offsets)

    def prepare(self, *args, act_input=None, noop=None, out: MXFP8Tensor | None = None, group_offsets=None,
                **kwargs):
        return self.inner.prepare(*self._inner_args(*self._bind(args, kwargs), act_input), noop=noop, out=out,
                                  group_offsets=group_offsets)

    @property
    def source(self) -> str:
        return self.inner.source

    def asm(self, arch: str = "sm_90", dtype: str = "bf16") -> dict:
        return self.inner.asm(arch, dtype)


_OPTION_NAMES = ("fp8", "rowwise", "colwise", "scale_mode", "scale_layout", "amax", "act", "dact", "dbias")


def fused_quant(fn=None, **options):
    """Decorate an epilogue function into a fused MXFP8 quantization op.

    ``@mxq.fused_quant(act="gelu", dbias=True, colwise=True)`` or bare ``@mxq.fused_quant``;
    options are those of ``mxq.quantize`` plus ``act``, ``dact`` and ``dbias``.
    """
    unknown = set(options) - set(_OPTION_NAMES)
    if unknown:
        raise TypeError(f"mxq: fused_quant() got unknown option(s) {sorted(unknown)}; "
                        f"options are {_OPTION_NAMES}")
    spec = QuantSpec(**options)

    def wrap(f):
        return GatedOp(f, spec) if spec.gated else FusedOp(f, spec)

    return wrap(fn) if fn is not None else wrap


@lru_cache(maxsize=None)
def _quantize_op(spec: QuantSpec) -> FusedOp:
    return FusedOp(_identity, spec, IDENTITY)


def _identity(x):
    return x




def quantize(x, *, fp8: str = "e4m3", rowwise: bool = True, colwise: bool = False,
             scale_mode: str = "rceil", scale_layout: str = "compact", amax: bool = False,
             noop=None, out: MXFP8Tensor | None = None, group_offsets=None) -> MXFP8Tensor:
    """Quantize ``x`` (fp32/fp16/bf16, any shape, CPU or CUDA) to MXFP8.

    ``out`` (an extension of the DESIGN contract) writes into existing buffers, e.g. for CUDA
    graphs; with ``noop`` holding 1.0 nothing is written at all. ``group_offsets``: cumulative
    group ends along the rows (mixture of experts): colwise blocks restart at every group
    (mxq/formats/groups.py, docs/NUMERICS.md "Groups").
    """
    if torch.compiler.is_compiling():
        i = _quantize_op_id(fp8, rowwise, colwise, scale_mode, scale_layout, amax)
        if _any_dtensor([x], None, group_offsets):  # the node runs on the local shards (mxq/integrations/distributed.py)
            return getattr(_QUANTIZE_BY_ID, f"op{i}")._dtensor_call([x], [], None, noop, out, group_offsets)
        return torch_ops.call(i, [x], [], None, noop, out, group_offsets)
    key = (fp8, rowwise, colwise, scale_mode, scale_layout, amax)
    op = None
    # (1 == True and hash(1) == hash(True): only exact bools may hit the cache, or a call with
    # rowwise=1 would skip the validation that refuses it in a fresh process)
    if rowwise.__class__ is bool and colwise.__class__ is bool and amax.__class__ is bool:
        try:
            op = _QUANTIZE_OPS.get(key)
        except TypeError:  # unhashable option values: QuantSpec names the bad one
            op = None
    if op is None:
        spec = QuantSpec(fp8=fp8, rowwise=rowwise, colwise=colwise, scale_mode=scale_mode,
                         scale_layout=scale_layout, amax=amax)
        op = _quantize_op(spec)
        if len(_QUANTIZE_OPS) < 1024:
            _QUANTIZE_OPS[key] = op
    if op._fast and noop is None and out is None and group_offsets is None:  # the common small call
        got = op._fast_call(x)
        if got is not None:
            return got
    return op(x, noop=noop, out=out, group_offsets=group_offsets)


@torch.compiler.assume_constant_result
def _quantize_op_id(fp8, rowwise, colwise, scale_mode, scale_layout, amax) -> int:
    """torch_ops' id of mxq.quantize's op for these options (validated here; torch.compile runs
    this while tracing and keeps the id as a constant)."""
    op = _quantize_op(QuantSpec(fp8=fp8, rowwise=rowwise, colwise=colwise, scale_mode=scale_mode,
                                scale_layout=scale_layout, amax=amax))
    i = torch_ops.op_id(op)
    setattr(_QUANTIZE_BY_ID, f"op{i}", op)
    return i


_QUANTIZE_OPS: dict = {}  # quantize()'s options as passed -> its op (one dict lookup per call)
# quantize()'s ops by torch_ops' id (attribute op<id>), for traced DTensor calls: torch.compile
# re-reads an attribute at every access, where it would read a dict filled by the trace itself
# (_quantize_op_id, called while tracing) from a stale copy; the ops live on in _quantize_op's
# cache anyway, and torch_ops' own registry holds weak references, which it cannot trace
_QUANTIZE_BY_ID = types.SimpleNamespace()


def get_quantize_kernel(key: int):
    """Lazy entrypoint for C++ (``mxq.get_quantize_kernel``): the native dispatcher of the
    built-in quantize op with 32-bit ``key`` (QuantSpec.key). The key's dtype bits are ignored:
    one dispatcher serves every input dtype; each dtype's kernel compiles on its first call."""
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"mxq: get_quantize_kernel() key must be an int, got {type(key).__name__}")
    spec, _ = QuantSpec.from_key(key)
    return _quantize_op(spec).dispatcher()


def register_entrypoints() -> None:
    """Make ``mxq.get_quantize_kernel`` visible to C++ (idempotent)."""
    import tvm_ffi

    tvm_ffi.register_global_func("mxq.get_quantize_kernel", get_quantize_kernel, override=True)
