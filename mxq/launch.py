"""The CUDA call path: bind one call's tensors to a compiled kernel and launch it.

Two ways to launch, one set of rules: the native dispatcher (csrc/dispatch.cc, shared with C++
callers) for ordinary calls, and a Python binding of the native kernel function for
``op.prepare`` (bound once, re-launched with no checks) and machines that cannot build the
dispatcher. Both pick the vectorised kernel when N % 8 == 0 and every [M, N] tensor is 16-byte
aligned, else the element-wise one.
"""

from __future__ import annotations

import torch

from . import layouts, runtime
from .compiler import VEC_ALIGN, VEC_DIVISOR, native_function
from .numerics import dbias_partial_dtype
from .spec import DTYPES
from .tensor import MXFP8Tensor, flat_dims


def device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


_noop_zero: dict = {}


def _noop_tensor(device):
    t = _noop_zero.get(device)
    if t is None:
        t = _noop_zero[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


_UNSET = object()


class _Launcher:
    """Calls the compiled kernels for one (op, device, dtype): the vectorised one when N % 8 == 0
    and every [M, N] tensor is 16-byte aligned, else the generic one. Each compiles on first use."""

    def __init__(self, op, arch: str, dtype_name: str):
        self.op, self.arch, self.dtype_name = op, arch, dtype_name
        self.fns: dict = {}
        self.dispatch = _UNSET
        self.allocating = None
        # calls without out=/noop allocate in the native route; swizzled scales need zeroed padding,
        # which that route does not write (bench/device_check.py turns this off to compare)
        spec = op.spec
        self.native_alloc = spec.scale_layout == "compact"
        # what call_alloc needs of the spec, read once (it runs on every small call)
        self._fields = (spec.rowwise, spec.colwise, spec.amax, spec.dbias, spec.fp8, spec.scale_layout)

    def _dispatcher(self):
        """The op's native dispatcher (csrc/dispatch.cc): reshaping, variant choice and the
        launch in C++, the same code C++ callers run, so both routes are checked by every GPU
        test. (Host time measured the same as the Python binding within the H200's run-to-run
        noise: 58 vs 47-83 us.) None where it cannot be built (no C++ compiler): the Python
        binding below then does the same work."""
        if self.dispatch is _UNSET:
            try:
                from . import ffi

                self.dispatch = ffi.dispatcher(self.op)
                self.allocating = ffi.allocating_dispatcher(self.op)
                from tvm_ffi import _ffi_api

                self._item = _ffi_api.ArrayGetItem  # one native call per slot (Array.__getitem__ makes two)
            except Exception as exc:  # pragma: no cover - depends on the machine's toolchain
                import warnings

                warnings.warn(f"mxq: native dispatcher unavailable ({exc}); using the Python launch path",
                              RuntimeWarning, stacklevel=4)
                self.dispatch = None
        return self.dispatch

    def _fn(self, variant: str):
        fn = self.fns.get(variant)
        if fn is None:
            fn = self.fns[variant] = native_function(self.op, self.arch, self.dtype_name, variant)
        return fn

    def call_alloc(self, *args):
        """Allocate the outputs and launch in one native call: ``args`` are the allocating
        route's (*tensors, *scalars, act_input, noop), already checked; compact scales only."""
        r = self.allocating(*args)
        item = self._item
        row, col, amax, dbias, fp8, layout = self._fields
        return MXFP8Tensor(item(r, 0) if row else None, item(r, 2) if col else None,
                           item(r, 1) if row else None, item(r, 3) if col else None,
                           item(r, 4) if amax else None, item(r, 5) if dbias else None,
                           fp8, layout, args[0].shape)

    def bind(self, tensors, scalars, act_input, noop, out):
        """(native function, its argument list, out) for one call; launching is ``fn(*args)``."""
        spec = self.op.spec
        x = tensors[0]
        m, n = flat_dims(x.shape)
        if out is None:
            out = MXFP8Tensor.empty(spec, x.shape, x.dtype, x.device)
        if spec.dact:
            tensors = [*tensors, act_input]
        for name, t in zip((*self.op.epilogue.tensor_params, "act_input"), tensors):
            if not t.is_contiguous():
                raise ValueError(f"mxq: argument {name!r} must be contiguous on CUDA (call .contiguous() first)")
        two_d = x.dim() == 2
        mats = [t if two_d else t.reshape(m, n) for t in tensors]
        tensors = tensors[: len(self.op.epilogue.tensor_params)]
        datas = []
        if spec.rowwise:
            datas.append(_as_u8_2d(out.rowwise_data, m, n))
        if spec.colwise:
            datas.append(_as_u8_2d(out.colwise_data, m, n))
        vec = n % VEC_DIVISOR == 0 and all(t.data_ptr() % VEC_ALIGN == 0 for t in mats + datas)
        args = mats[: len(tensors)] + [float(s) for s in scalars] + mats[len(tensors):]
        k = 0
        if spec.rowwise:
            args += [datas[k], out.rowwise_scale.view(-1)]
            k += 1
        if spec.colwise:
            args += [datas[k], out.colwise_scale.view(-1)]
        if spec.amax:
            args.append(out.amax.view(1))
        if spec.dbias:
            args += [out.dbias, torch.empty((layouts.cdiv(m, 32), n), dtype=dbias_partial_dtype(x.dtype),
                                              device=x.device)]
        args.append(noop.reshape(1) if noop is not None else _noop_tensor(x.device))
        return (self._fn("vec" if vec else "generic") if m * n else None), args, out

    def __call__(self, tensors, scalars, act_input, noop, out):
        dispatch = self._dispatcher()
        if dispatch is not None:
            x = tensors[0]
            if out is None and noop is None and self.native_alloc and x.is_cuda and x.numel():
                # one native call allocates every output and launches (the host-time path)
                if self.op._fast_ok:
                    self.op._fast[(x.dtype, x.get_device())] = self  # later calls skip the checks
                return self.call_alloc(*tensors, *scalars, act_input, None)
            if out is None:
                out = MXFP8Tensor.empty(self.op.spec, x.shape, x.dtype, x.device)
            dispatch(*tensors, *scalars, act_input, out.rowwise_data, out.rowwise_scale, out.colwise_data,
                     out.colwise_scale, out.amax, out.dbias, noop)
            return out
        fn, args, out = self.bind(tensors, scalars, act_input, noop, out)
        if fn is not None:
            fn(*args)
        elif self.op.spec.dbias and (noop is None or bool(noop.reshape(-1)[0] != 1.0)):
            out.dbias.zero_()
        return out


def _as_u8_2d(t: torch.Tensor, m: int, n: int) -> torch.Tensor:
    u = t.view(torch.uint8)
    return u if u.dim() == 2 else u.reshape(m, n)


def launcher(op, x: torch.Tensor):
    """A launcher for CUDA tensor ``x``, or None (with a one-time warning) when none can serve."""
    m, n = flat_dims(x.shape)
    if m * n >= 2 ** 31 or m >= 2 ** 31 - 64:
        runtime.fallback("tensors of 2^31 or more elements are not supported by the kernels yet")
        return None
    if not x.is_contiguous():
        raise ValueError("mxq: CUDA tensor inputs must be contiguous (call .contiguous() first)")
    dtype_name = DTYPES[x.dtype]
    key = (x.device, dtype_name)
    launchers = op.__dict__.setdefault("_launchers", {})
    fn = launchers.get(key)
    if fn is None:
        fn = launchers[key] = _Launcher(op, device_arch(x.device), dtype_name)
    return fn
