"""The native dispatchers (``csrc/dispatch.cc``) and TVM-FFI global names.

``make_dispatchers(op)`` builds an op's two native functions: the destination-passing
dispatcher (the signature of docs/DESIGN.md; what C++ callers and registered names get) and the
allocating route of ordinary Python calls. The C++ library is built once per machine by
tvm-ffi's ``load_inline`` and cached on disk. On CUDA tensors a dispatcher launches the compiled
kernel without Python after the first call of a dtype; it calls back into Python for four
things only: compiling (or loading) a kernel on that first call, the torch reference on CPU
tensors, the CUDA calls it does not launch itself (grouped calls of int64 group ends or swizzled
scales, and operands it does not take as they are, such as a non-contiguous bias: Python's
binding of the kernels), and a zero noop tensor per device. Broadcast and strided epilogue
operands, and grouped calls of compact scales with int32 group ends (a trailing
``group_offsets``), it launches itself, on the kernels compiled for them. The callers (mxq/op.py) keep what this returns.
"""

from __future__ import annotations

import os
import threading
from importlib import resources

import torch

from . import compiler, launch, limits, slots, targets, validation
from . import gemm as gemm_rt
from ..formats import groups
from ..frontend import gated
from ..kernels.config import UNIT
from ..tensor import PADDED_ROW_BYTES, MXFP8Tensor, data_rows, flat_dims

_lock = threading.RLock()
# (a forked child's copy of a lock a parent thread held stays locked, with no thread to release it:
# reinitialised in the child, as the threading module does its own)
os.register_at_fork(after_in_child=_lock._at_fork_reinit)
_shim = None
_DL_FLOAT, _DL_BFLOAT = 2, 4
# The allocating route puts both directions' FP8 data and scales in one allocation when they
# total at most this many bytes (256x4096 rowwise+colwise: 2.1 MB). A small call's host time is
# mostly allocation; a large tensor keeps one allocation per direction, so that dropping one
# direction (e.g. rowwise after the forward GEMM) frees its memory. Read when an op's
# dispatcher is built.
SHARED_ALLOC_MAX_BYTES = 4 << 20


# csrc/'s headers that dispatch.cc shares with the exported functions' check (export_check.h)
SHARED_HEADERS = ("scale_sizes.h", "spans.h")


def _dispatch_module():
    """Build (or load from tvm-ffi's cache) the C++ dispatcher library."""
    global _shim
    with _lock:
        if _shim is None:
            import tvm_ffi.cpp

            csrc = resources.files("mxq").joinpath("csrc")
            # one source (each shared header's text in place of its #include), so that
            # load_inline's cache key covers the scale sizes and the overlap check too
            src = csrc.joinpath("dispatch.cc").read_text()
            for header in SHARED_HEADERS:
                include = f'#include "{header}"'
                assert include in src, f"mxq: csrc/dispatch.cc must include {header}"
                src = src.replace(include, csrc.joinpath(header).read_text(), 1)
            _shim = tvm_ffi.cpp.load_inline(name="mxq_dispatch_v22", cpp_sources=src,
                                            functions=["make_dispatcher", "python_route"])
        return _shim


# torch hands tvm-ffi its DLPack exchange API (recent torch, or torch-c-dlpack-ext): tensors cross
# into a Python callback as torch tensors in one call (_wrap_callback)
TORCH_EXCHANGE_API = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


def _torch(t):
    return None if t is None else torch.from_dlpack(t)


def _python_callback(op):
    """The Python route of the destination-passing dispatcher, into the caller's destination
    tensors: CPU and empty tensors (the torch reference), and the CUDA calls the dispatcher does
    not launch itself (grouped ones, with the optional trailing ``group_offsets``, and operands it
    does not take as they are: ``op(...)``, Python's binding of the kernels). A gated
    op's whole destination-passing function (python_dispatcher)."""
    spec, epi = op.spec, op.epilogue
    nt, ns = len(epi.tensor_params), len(epi.scalar_params)
    transposed = limits.cpp_transposed(spec)  # (colwise data [N, M])

    def call(*args):
        if len(args) not in (nt + ns + 8, nt + ns + 9):
            raise TypeError(f"mxq: expected {nt + ns + 8} arguments (or {nt + ns + 9} with group_offsets), got "
                            f"{len(args)}")
        names = list(epi.tensor_params) + list(epi.scalar_params) + list(slots.DESTINATIONS) + ["group_offsets"]
        _check_arg_types(args, names, nt, ns)
        tensors = [_torch(a) for a in args[:nt]]
        scalars = list(args[nt:nt + ns])  # (numbers as given: the call rounds each to fp32 once, ir.scalar)
        act, rd, rs, cd, cs, amax, dbias, noop = (_torch(a) for a in args[nt + ns:nt + ns + 8])
        offsets = _torch(args[nt + ns + 8]) if len(args) > nt + ns + 8 else None
        x = tensors[0]
        validation.check_dtype(names[0], x)  # (before the outputs' shapes are made from it)
        if offsets is not None:
            groups.check(offsets, flat_dims(x.shape)[0], x.device)
        shape = torch.Size(op.output_shape(x.shape))  # (a gated op's: half or twice x's width)
        want = MXFP8Tensor.empty(spec, shape, x.dtype, "meta",
                                 group_offsets=None if offsets is None else offsets.to("meta"))

        def dest(t, like, name):
            return _destination(t, like, name, transposed, offsets is not None)

        out = MXFP8Tensor(
            rowwise_data=dest(rd, want.rowwise_data, "rowwise_data"),
            colwise_data=dest(cd, want.colwise_data, "colwise_data"),
            rowwise_scale=dest(rs, want.rowwise_scale, "rowwise_scale"),
            colwise_scale=dest(cs, want.colwise_scale, "colwise_scale"),
            amax=dest(amax, want.amax, "amax"),
            dbias=dest(dbias, want.dbias, "dbias"),
            fp8=spec.fp8, scale_layout=spec.scale_layout, shape=shape, scale_mode=spec.scale_mode,
            format=want.format, block=want.block, group_offsets=offsets)  # (described as this call's: a buffer
        # of the caller's carries no label of an earlier call, which a noop call would have to keep)
        _check_apart([*zip(epi.tensor_params, tensors), ("act_input", act), ("noop", noop), ("group_offsets", offsets)],
                     out)
        args = _in_order(epi, epi.tensor_params, tensors, scalars)
        if x.device.type == "cpu" or x.numel() == 0:
            # (an empty CUDA call too: op(...) would hand it back to the dispatcher, which sends it here)
            op.reference(*args, act_input=act, noop=noop, out=out, group_offsets=offsets)
            return
        with _caller_stream(x.device):  # the C++ caller's stream (TVMFFIEnvSetStream), not torch's
            op(*args, act_input=act, noop=noop, out=out, group_offsets=offsets)

    return call


def _check_apart(reads, out: MXFP8Tensor) -> None:
    """validation.check_apart of a destination-passing call, naming its slots as the C++ signature
    does (the Python route would name them as fields of an ``out``)."""
    writes = [(f, getattr(out, f)) for f in validation.OUT_FIELDS if getattr(out, f) is not None]
    validation.check_apart(None, [(n, t) for n, t in reads if isinstance(t, torch.Tensor)], writes)


def _in_order(epi, tensor_names, tensors, scalars) -> list:
    """The epilogue's arguments in its parameter order (positional: positional-only parameters
    take no keywords), from its tensors (``tensor_names``, in its tensors' order) and floats;
    parameters of neither (op.gemm's accumulator) left out."""
    values = dict(zip(tensor_names, tensors))
    values.update(zip(epi.scalar_params, scalars))
    return [values[k] for k in epi.param_order if k in values]


def _check_arg_types(args, names, tensors: int, floats: int) -> None:
    """A destination-passing call's arguments (``names`` for the messages): ``tensors`` tensors,
    then ``floats`` Python numbers (not bools), then tensors or None; a TypeError naming the
    first that is not."""
    import tvm_ffi

    for i, a in enumerate(args):
        if tensors <= i < tensors + floats:
            if isinstance(a, bool) or not isinstance(a, (int, float)):
                raise TypeError(f"mxq: argument #{i} ({names[i]}) must be a float, got {type(a).__name__}")
        elif not (a is None and i >= tensors) and not isinstance(a, tvm_ffi.Tensor):
            raise TypeError(f"mxq: argument #{i} ({names[i]}) must be a tensor{' or None' if i >= tensors else ''}, "
                            f"got {type(a).__name__}")


_E8M0 = getattr(torch, "float8_e8m0fnu", None)
_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _destination(t, like, name: str, transposed: bool = False, grouped: bool = False):
    """A C++ caller's destination tensor ``t`` (or None) for output field ``name`` shaped like
    ``like`` (a meta tensor of MXFP8Tensor.empty's): checked, and viewed as the field (flat
    scale buffers, bytes for 1-byte dtypes, GEMM-ready padded scales: _padded_scale)."""
    if (t is None) != (like is None):
        raise ValueError(f"mxq: argument {name!r} is {'required' if like is not None else 'not used'} "
                         f"by this op")
    if t is None:
        return None
    if name.endswith("_scale") and (like._base is not None or not like.is_contiguous()):
        # (GEMM-ready scales: views of padded buffers)
        return _padded_scale(t, like, name)
    if name == "colwise_data" and transposed and (t.shape != like.shape or not t.is_contiguous()):
        # (as the native dispatcher: the kernel stores the copy's rows M bytes apart)
        raise ValueError(f"mxq: argument 'colwise_data' is the transposed colwise copy: a contiguous "
                         f"tensor of shape {tuple(like.shape)} ([N, M]), got shape {tuple(t.shape)} and "
                         f"strides {tuple(t.stride())}")
    if t.numel() != like.numel():
        raise ValueError(f"mxq: argument {name!r} has {t.numel()} elements, expected {like.numel()}"
                         f"{' (grouped buffers: docs/NUMERICS.md, Groups)' if grouped else ''}")
    if like.dtype != t.dtype and like.dtype.itemsize == t.dtype.itemsize == 1:
        # (FP8 data and NVFP4's E4M3 scales passed as bytes, E8M0 scale bytes as torch's E8M0 dtype;
        # another 1-byte dtype, int8, bool or the other FP8 format, would hand back other values)
        e8m0_slot = name.endswith("_scale") and like.dtype == torch.uint8
        fp4_slot = name.endswith("_data") and like.dtype == torch.uint8  # (FP4's packed codes)
        if t.dtype != (_E8M0 if e8m0_slot else _FP4X2 if fp4_slot else torch.uint8):
            also = (" (E8M0 bytes) or float8_e8m0fnu" if e8m0_slot else " (packed E2M1 codes) or float4_e2m1fn_x2"
                    if fp4_slot else " or uint8")
            raise TypeError(f"mxq: argument {name!r} must be a {like.dtype}{also} tensor, got {t.dtype}")
        t = t.view(like.dtype)
    elif like.dtype != t.dtype:  # (named by its slot here, before the op's call checks it as a field of out=)
        # (ValueError, as the native dispatcher's and check_out's)
        raise ValueError(f"mxq: argument {name!r} must be {like.dtype}, got {t.dtype}")
    if name.endswith("_data") and not grouped and not t.is_contiguous():
        # FP8 data of padded rows (what the allocating route makes at N % 8 != 0), as its shape
        m, n = flat_dims(like.shape)
        if t.shape != like.shape or data_rows(t, m, n) is None:
            raise ValueError(f"mxq: argument {name!r} must be contiguous or rows of unit stride at least "
                             f"{n} elements apart, of shape {tuple(like.shape)}")
        return t
    if not t.is_contiguous():  # (a reshape would copy it: the call would write into the copy)
        raise ValueError(f"mxq: argument {name!r} must be contiguous")
    return t.view(like.shape)


def _padded_scale(t, like, name: str):
    """A destination for GEMM-ready scales ``like`` (a view of a padded buffer,
    fp8_block_layouts.gemm_scale: 1x128 scales outer-dim-major, 128x128 tiles row-major with a
    padded row stride): that view itself (strides of dimensions of one element aside), or its whole
    buffer, contiguous (what the native dispatcher takes, slots.direction_facts), as the view."""
    if t.dtype == like.dtype and t.shape == like.shape and all(
            a == b for a, b, d in zip(t.stride(), like.stride(), like.shape) if d > 1):
        return t
    base = like._base if like._base is not None else like
    whole = base.numel()
    if t.dtype == like.dtype and t.shape == like.shape and t.shape != base.shape:  # (the grid, in another order)
        raise ValueError(f"mxq: argument {name!r} has the scales' shape {tuple(like.shape)} but strides "
                         f"{tuple(t.stride())}: pass the view of strides {like.stride()} of a padded buffer "
                         f"(MXFP8Tensor.empty's), or the contiguous buffer of {whole} elements")
    if t.dtype != like.dtype or t.numel() != whole or not t.is_contiguous():
        raise ValueError(f"mxq: argument {name!r} must be a contiguous {like.dtype} buffer of {whole} "
                         f"elements, or its view of shape {tuple(like.shape)} and strides {like.stride()}")
    return t.reshape(-1).as_strided(like.shape, like.stride())


def python_dispatcher(op):
    """A destination-passing function of ``op``'s signature that runs in Python on every call
    (what a gated op registers: the native dispatcher does not split [M, 2N] tensors into halves;
    an FP4 op's), behind its C++ face (_python_route)."""
    epi = op.epilogue
    names = [*epi.tensor_params, *epi.scalar_params, *slots.DESTINATIONS, "group_offsets"]
    return _python_route(_python_callback(op), names)


def _python_route(call, names):
    """``call`` as a TVM-FFI function that a C++ caller may hand raw DLTensor* arguments
    (csrc/dispatch.cc python_route: each checked, naming it by ``names``, then passed as a tensor
    owning nothing; tvm-ffi's own conversion of a raw DLTensor* for Python crashed); ``call``
    converted alone, with a warning, where the C++ library cannot be built (no compiler)."""
    import tvm_ffi

    try:
        mod = _dispatch_module()
    except Exception as exc:  # pragma: no cover - depends on the machine's toolchain
        import warnings

        warnings.warn(f"mxq: native dispatcher unavailable ({exc}); a C++ caller must pass tensor objects, not "
                      "raw DLTensor*", RuntimeWarning, stacklevel=4)
        return tvm_ffi.convert(call)
    return mod.python_route(tvm_ffi.convert(call), list(names))


def gemm_dispatcher(op):
    """``op.gemm``'s destination-passing function (``op.register(name, gemm=True)``,
    ``op.dispatcher(gemm=True)``), in Python on every call: ``(a, w, *epilogue tensors after the
    accumulator, *epilogue floats, act_input, rowwise_data, rowwise_scale, colwise_data,
    colwise_scale, amax, dbias, noop)``, act_input a dact op's [M, N] input (else None), the
    slots op.gemm does not write None (noop, and the rowwise, colwise, amax and dbias ones unless
    the op has them: a ValueError naming them otherwise), the data contiguous [M, N] FP8 (or uint8) tensors, the scales flat or as Python
    holds them. CPU tensors run op.gemm's reference; CUDA ones its sm_90 GEMM on the caller's
    stream."""
    spec, epi = op.spec, op.epilogue
    nt, ns = len(epi.tensor_params) - 1, len(epi.scalar_params)  # (the first tensor: the accumulator)
    names = ["a", "w", *epi.tensor_params[1:], *epi.scalar_params, *slots.DESTINATIONS]

    def call(*args):
        if len(args) != 2 + nt + ns + len(slots.DESTINATIONS):
            raise TypeError(f"mxq: {op.__name__}.gemm's dispatcher expects {2 + nt + ns + len(slots.DESTINATIONS)} "
                            f"arguments ({', '.join(names)}), got {len(args)}")
        _check_arg_types(args, names, 2 + nt, ns)
        a, w = _torch(args[0]), _torch(args[1])
        others = [_torch(t) for t in args[2:2 + nt]]
        scalars = list(args[2 + nt:2 + nt + ns])  # (numbers as given: op.gemm rounds each once)
        dests = dict(zip(slots.DESTINATIONS, (_torch(t) for t in args[2 + nt + ns:])))
        written = (*(("rowwise_data", "rowwise_scale") if spec.rowwise else ()),
                   *(("colwise_data", "colwise_scale") if spec.colwise else ()),
                   *(("amax",) if spec.amax else ()), *(("dbias",) if spec.dbias else ()))
        if dests.get("noop") is not None:  # (an input of a call's, which op.gemm has no route for)
            raise ValueError(f"mxq: argument 'noop' is not served by {op.__name__}.gemm (noop is a call's keyword "
                             "op.gemm has no route for): pass None")
        unused = [k for k, t in dests.items() if t is not None and k not in written and k not in ("act_input", "noop")]
        if unused:
            raise ValueError(f"mxq: argument {unused[0]!r} is not written by {op.__name__}.gemm (its epilogue "
                             f"writes {', '.join(written)}): pass None")
        if a.dim() != 2 or w.dim() != 2:
            raise ValueError(f"mxq: {op.__name__}.gemm takes a [M, K] and w [N, K], got shapes {tuple(a.shape)} and "
                             f"{tuple(w.shape)}")
        gemm_rt.check_args(a, w)  # (a's dtype, before the outputs' are made from it)
        shape = torch.Size((a.shape[0], w.shape[0]))
        want = MXFP8Tensor.empty(spec, shape, a.dtype, "meta", row_align=1)
        fields = {}
        for name in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
            fields[name] = (_destination(dests[name], getattr(want, name), name, limits.cpp_transposed(spec))
                            if name in written else None)
            if name.endswith("data") and fields[name] is not None and not fields[name].is_contiguous():
                raise ValueError(f"mxq: argument {name!r} of op.gemm must be contiguous (the GEMM writes whole rows)")
        out = MXFP8Tensor(**fields, amax=_destination(dests["amax"], want.amax, "amax") if spec.amax else None,
                          dbias=_destination(dests["dbias"], want.dbias, "dbias") if spec.dbias else None,
                          fp8=spec.fp8, scale_layout=spec.scale_layout,
                          shape=shape, scale_mode=spec.scale_mode, format=want.format, block=want.block)
        _check_apart([("a", a), ("w", w), *zip(epi.tensor_params[1:], others), ("act_input", dests["act_input"])], out)
        operands = _in_order(epi, epi.tensor_params[1:], others, scalars)
        kwargs = {}
        if dests["act_input"] is not None or spec.dact is not None:  # (op.gemm names it where it does not belong)
            kwargs["act_input"] = dests["act_input"]
        if a.device.type != "cuda":
            op.gemm(a, w, *operands, out=out, **kwargs)
            return
        with _caller_stream(a.device):  # the C++ caller's stream (TVMFFIEnvSetStream), not torch's
            op.gemm(a, w, *operands, out=out, **kwargs)

    return _python_route(call, names)


def _caller_stream(device):
    """A context making the TVM-FFI environment stream of ``device`` (what a C++ caller set)
    torch's current stream, so that the Python route's launches and torch work run on it."""
    import contextlib

    import tvm_ffi

    raw = tvm_ffi.get_raw_stream(tvm_ffi.device("cuda", device.index or 0))
    if raw == torch.cuda.current_stream(device).cuda_stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(raw, device=device))


# the kernel variants of dispatch.cc's enum Variant, by its values
_NATIVE_VARIANTS = ("generic", "vec", "rows8", "vec_grouped", "generic_grouped")


def _resolve_callback(op):
    """First CUDA call of a dtype/variant/operand layouts: compile (or load from the disk cache)
    the kernel. ``kinds``: one compiler.LAYOUT_CODES letter per epilogue tensor, "" when all are
    plain full tensors."""
    by_code = {(_DL_FLOAT, 32): "fp32", (_DL_FLOAT, 16): "fp16", (_DL_BFLOAT, 16): "bf16"}
    by_letter = {c: k for k, c in compiler.LAYOUT_CODES.items()}

    def resolve(code, bits, variant, device_id, kinds=""):
        dtype = by_code.get((int(code), int(bits)))
        if dtype is None:
            raise TypeError(f"mxq: input dtype (DLPack code {code}, {bits} bits) is not float32, float16 or bfloat16")
        name = _NATIVE_VARIANTS[int(variant)]
        gap = limits.cpp_gap(op.spec, op.epilogue, dtype, name, name.endswith("_grouped"))
        if gap:  # (what register()/dispatcher() could not refuse up front: the call's dtype and variant)
            raise ValueError(f"mxq: {gap}; this {dtype} call has no kernel on the C++ routes")
        arch = targets.device_arch(torch.device("cuda", int(device_id)))
        layouts = tuple(by_letter[c] for c in str(kinds)) or None
        return compiler.native_function(op, arch, dtype, _NATIVE_VARIANTS[int(variant)], layouts)

    return resolve


def _zero_callback(device_id):
    """A zero noop tensor on a device (one per device, kept for the process)."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(launch.noop_tensor(torch.device("cuda", int(device_id))))


def _wrap_callback(spec):
    """The allocating route's result, made from its seven outputs (csrc/dispatch.cc): the
    MXFP8Tensor, its shape its data's (the route allocates data of the input's shape). One
    callback whose tensors tvm-ffi hands over as torch tensors, where an array of outputs cost
    one native call per output on the host's path of every small call."""
    import tvm_ffi

    fp8, layout, mode = spec.fp8, spec.scale_layout, spec.scale_mode

    def wrap(rd, rs, cd, cs, amax, dbias, ends):
        return MXFP8Tensor(rd, cd, rs, cs, amax, dbias, fp8, layout, (rd if rd is not None else cd).shape, ends, mode)

    if TORCH_EXCHANGE_API:
        return tvm_ffi.convert_func(wrap, tensor_cls=torch.Tensor)

    def each(*outs):  # (older torch: each tensor through torch.from_dlpack)
        return wrap(*(_torch(t) for t in outs))

    return each


def make_dispatchers(op) -> tuple:
    """(destination-passing dispatcher, allocating route, *their Python callbacks) of ``op``. The allocating route takes
    (*tensors, *scalars, act_input, noop[, group_offsets]) and returns the MXFP8Tensor of the six
    output slots (slots.OUTPUTS, compact scales; FP8 data of N % 8 != 0 as views of rows padded to
    16 bytes, as MXFP8Tensor.empty makes by default) and a copy of the int32 group ends as its
    ``group_offsets`` (None ungrouped; _wrap_callback), the outputs zeroed where MXFP8Tensor.empty zeroes them (all of a noop call's; a grouped
    call's colwise scales; its dbias the reduction writes whole, an empty group's row 0); on CPU tensors it allocates the same and fills them with
    the reference (how tests check it without a GPU). The destination-passing one takes FP8 data
    of such padded rows too (the kernels' variant "rows8" when they start on 8-byte boundaries)."""
    with _lock:
        mod = _dispatch_module()
        # (the callbacks become ffi.Functions owned by the dispatcher's state: they live as long
        # as the dispatchers, which the op keeps)
        py, res, wrap = _python_callback(op), _resolve_callback(op), _wrap_callback(op.spec)
        epi = op.epilogue
        pair = mod.make_dispatcher(len(epi.tensor_params), len(epi.scalar_params), slots.dispatch_flags(op.spec),
                                   list(epi.tensor_params + epi.scalar_params), py, res, _zero_callback, wrap,
                                   SHARED_ALLOC_MAX_BYTES, UNIT, PADDED_ROW_BYTES, groups.MAX_GROUPS,
                                   list(limits.cpp_facts(op.spec, op.epilogue)), limits.cpp_transposed(op.spec))
        return pair[0], pair[1], py, res  # (the callbacks too: kept alive with the dispatchers)


def dispatchers_or_none(op):
    """make_dispatchers(op) for the Python routes' CUDA calls (launch.Launcher), or None (after a
    warning) where they cannot be built (no C++ compiler). Two-halves ops (mxq/frontend/gated.py)
    have none: their outputs are wider than their inputs, which the dispatchers do not know; nor
    do FP8 block-scaling ops on this route: their calls take Python's binding of the kernels
    (Launcher.bind: GEMM-ready scales are views of padded buffers, fp32 calls fall back per call,
    limits.fp8_block_unserved), while register()/dispatcher() build theirs (op.py)."""
    if gated.is_halves(op.epilogue) or op.spec.format != "mxfp8":
        return None
    try:
        return make_dispatchers(op)
    except Exception as exc:  # pragma: no cover - depends on the machine's toolchain
        import warnings

        warnings.warn(f"mxq: native dispatcher unavailable ({exc}); using the Python launch path", RuntimeWarning,
                      stacklevel=5)
        return None


def register_global(name: str, fn) -> None:
    """Make ``fn`` the TVM-FFI global ``mxq.<name>``."""
    import re

    import tvm_ffi

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name, re.ASCII):
        raise ValueError(f"mxq: register() name must be an identifier (dots allowed), got {name!r}")
    tvm_ffi.register_global_func(f"mxq.{name}", fn, override=True)


__all__ = ["SHARED_ALLOC_MAX_BYTES", "dispatchers_or_none", "gemm_dispatcher", "make_dispatchers", "python_dispatcher",
           "register_global"]
