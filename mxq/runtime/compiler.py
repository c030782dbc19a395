"""Rendered source -> importable module file -> ``cute.compile`` -> native TVM-FFI function.

CuTeDSL needs kernels in real files (it reads their source), so each rendered module is written
once to ``$MXQ_CACHE_DIR/src/mxq_gen_<sha>.py`` (mxq/runtime/cache.py) and imported from there;
tracebacks and compile errors point into that file. Compiles are keyed by (source hash, arch,
dtype, variant, operand layouts, and whether PTX is kept) -- the source already covers the
spec, the epilogue fingerprint and the templates -- and
run under one lock (``cute.compile`` is not thread-safe); concurrent first calls of one key wait
for one compile. M and N are symbolic, so one compile serves every shape. ``native_function``
adds the disk cache: each kernel exported once to a shared library under a versioned directory,
loaded by later processes in milliseconds without importing cutlass.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from ..formats.numerics import dbias_partial_dtype
from ..frontend import gated
from ..frontend.codegen import GIVEN_AMAX_LAUNCHERS, LAUNCHERS
from ..frontend.spec import DTYPES
from . import cache, operands, slots, targets, toolchain

_DTYPE_BY_NAME = {v: k for k, v in DTYPES.items()}
_compile_lock = threading.Lock()
_key_locks: dict = {}
_compiled = cache.LRU(cache.cache_size())  # compile key -> compiled function
_modules = cache.LRU(cache.cache_size(), on_evict=lambda name, mod: sys.modules.pop(name, None))  # generated modules


def load_module(source: str):
    """The generated module of ``source``, run from ``source`` itself (compiled here, never from a
    .pyc: Python trusts a bytecode file whose recorded time and size match the .py, so another
    module's bytecode could stand in), with the cache's file as its ``__file__`` (CuTeDSL reads
    its kernels' text from there)."""
    path = cache.source_file(source)
    name = path.stem
    mod = _modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            exec(compile(source, str(path), "exec"), mod.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[name] = mod
    return mod


LAYOUT_CODES = {"full": "f", "strided": "s", "row": "r", "col": "c", "scalar": "k"}


def layout_tag(layouts) -> str:
    """The compile-key suffix of the epilogue inputs' layouts ("" when every input is a plain
    full tensor: the default kernels, whose keys and PTX never change)."""
    if not layouts or all(k == "full" for k in layouts):
        return ""
    return "".join(LAYOUT_CODES[k] for k in layouts)


def fake_args(op, dtype_name: str, use_hw: bool, arch: str, vec: bool, layouts=None, grouped: bool = False,
              n_multiple: int = 1):
    """The compile-time arguments of ``launch``/``launch_vec``, one per slot of the kernel slot
    table (mxq/runtime/slots.py): fake tensors with symbolic M, N tied together; the vectorised variant
    also promises N % 8 == 0 and 16-byte aligned [M, N] tensors; ``n_multiple``: N must be a
    multiple of it too (checked by the compiled function: an exported gated backward's)."""
    cute = toolchain.import_cutlass(arch)
    import cutlass
    from cutlass import Float32, Uint8

    spec, epi = op.spec, op.epilogue
    fmt = spec.block_format
    el = {"fp32": cutlass.Float32, "fp16": cutlass.Float16, "bf16": cutlass.BFloat16}[dtype_name]
    nbytes = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype_name]
    m, n = cute.sym_int(), cute.sym_int(divisibility=math.lcm(VEC_DIVISOR if vec else 1, n_multiple))
    fake = cute.runtime.make_fake_compact_tensor
    big = VEC_ALIGN if vec else None
    ws_bytes = dbias_partial_dtype(_DTYPE_BY_NAME[dtype_name]).itemsize  # fp32 for 16-bit inputs

    # two-halves ops (mxq/frontend/gated.py) write outputs [M, 2N]: their output width is its own value
    n_out = cute.sym_int(divisibility=VEC_DIVISOR if vec else 1) if gated.is_halves(epi) else n

    transposed = spec.colwise and spec.scale_layout == "gemm"

    def mat(dtype, align, rows=m, cols=n):
        return fake(dtype, (rows, cols), stride_order=(1, 0), assumed_align=align)

    def flat_scale():
        """A flat scale buffer: E8M0 bytes, or fp32 (FP8 block scaling; the GEMM-ready layout's
        outer-dim-major buffer as it is laid out in memory, launch.flat_scale)."""
        if fmt.scale == "fp32":
            return fake(Float32, (cute.sym_int(),), assumed_align=4)
        return fake(Uint8, (cute.sym_int(),), assumed_align=1)

    def fp4_cols():
        """FP4 rowwise data [M, N / 2] (two elements a byte; N % 8 == 0: rows of whole words)."""
        return cute.sym_int(divisibility=VEC_DIVISOR // 2 if vec else 1)

    def f32_one():
        return fake(Float32, (1,), assumed_align=4)

    def operand(kind):
        """A fake [M, N] operand of a layout kind (mxq/runtime/operands.py): a row stride of its own
        (strided, a multiple of 8 elements for the vectorised kernel), or stride-0 broadcast dims."""
        if kind == "full":
            return mat(el, big or nbytes)
        if kind == "strided":
            ld = cute.sym_int64(divisibility=VEC_DIVISOR if vec else 1)
            return cute.runtime.make_fake_tensor(el, (m, n), stride=(ld, 1), assumed_align=big or nbytes)
        stride = operands.BROADCAST_STRIDES[kind]
        return cute.runtime.make_fake_tensor(el, (m, n), stride=stride,
                                             assumed_align=(big or nbytes) if kind == "row" else nbytes)

    kinds = iter(layouts or ())
    by_role = {
        "input": lambda: operand(next(kinds, "full")),
        "scalar": lambda: Float32(0.0),
        "act_input": lambda: mat(el, big or nbytes),
        "rowwise_data": lambda: mat(Uint8, big or 1, cols=fp4_cols() if fmt.packed else n_out),
        "rowwise_scale": flat_scale,
        "colwise_data": lambda: (mat(Uint8, 4, rows=n_out, cols=cute.sym_int(divisibility=4)) if fmt.packed
                                 else mat(Uint8, 1, rows=n_out, cols=m) if transposed  # (the GEMM-ready [N, M] copy)
                                 else mat(Uint8, big or 1, cols=n_out)),
        "colwise_scale": flat_scale,
        "amax": lambda: (fake(Float32, (2,), assumed_align=4) if fmt.hadamard  # (and colwise_amax)
                         else fake(Float32, (cute.sym_int(),), assumed_align=4) if grouped and fmt.global_scale
                         else f32_one()),  # (grouped NVFP4: an amax per group)
        "dbias": lambda: (fake(el, (cute.sym_int(), n_out), stride_order=(1, 0), assumed_align=nbytes) if grouped
                          else fake(el, (n_out,), assumed_align=nbytes)),
        "dbias_workspace": lambda: mat({4: cutlass.Float32, 8: cutlass.Float64}[ws_bytes], ws_bytes,
                                       rows=cute.sym_int(), cols=n_out),
        "noop": f32_one,
        "rng": lambda: fake(cutlass.Int64, (2,), assumed_align=8),
        "group_offsets": lambda: fake(cutlass.Int32, (cute.sym_int(),), assumed_align=4),
    }
    table = slots.kernel_slots(spec, len(epi.tensor_params), gated.launch_scalars(epi), grouped)
    args = [by_role[s.role]() for s in table]
    args.append(use_hw)
    if spec.dbias:
        args.append(targets.uses_pdl(arch))
    args.append(cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))
    return args


VEC_DIVISOR = 8  # the vectorised kernel's N must be a multiple of this
VEC_ALIGN = 16  # ... and every [M, N] tensor 16-byte aligned
# compiled variants -> the generated module's launcher: the vectorised kernels (N % 8 == 0, aligned
# tensors), the any-shape ones (16-bit: unaligned rows; fp32: element-wise), "rows8" (any shape
# whose FP8 output rows start on 8-byte boundaries: padded outputs, launch.variant_for; fp32: the
# vectorised kernel with staged rows, KernelConfig.vec_unaligned),
# and the grouped twins of the first two (group_offsets): codegen.LAUNCHERS, the template's list;
# NVFP4 modules also have "vec_given" (the quantize pass alone: codegen.GIVEN_AMAX_LAUNCHERS)
VARIANTS = {variant + ("_grouped" if grouped else ""): fn for fn, variant, grouped in LAUNCHERS + GIVEN_AMAX_LAUNCHERS}


@contextlib.contextmanager
def compile_options(arch: str, keep_ptx: bool):
    """cute.compile's options for ``arch`` (TVM-FFI functions); ``keep_ptx``: with the PTX kept.
    CuTeDSL writes kept PTX into a file named by the kernel signature alone (two ops of one
    signature share a name, across processes too) and splits the option string like a shell
    line: a fresh private directory per compile, quoted, removed after it."""
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if not keep_ptx:
        yield options
        return
    dump = tempfile.mkdtemp(prefix="mxq-ptx-")
    try:
        yield options + f" --keep-ptx --dump-dir {shlex.quote(dump)}"
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def compile_op(op, arch: str, dtype_name: str, keep_ptx: bool = False, variant: str = "vec", layouts=None,
               n_multiple: int = 1):
    """The compiled CuTeDSL function (TVM-FFI wrapper) for ``op`` on ``arch`` with input dtype.

    ``variant`` "vec" is the 16-byte vectorised kernel (N % 8 == 0, aligned tensors), "generic"
    the one that serves every shape and alignment (16-bit inputs: the packed kernel with
    unaligned rows; fp32: the element-wise kernel), "rows8" the one for FP8 output rows on 8-byte
    boundaries; a ``_grouped`` suffix takes group ends. ``n_multiple``: the function refuses an N
    that is not a multiple of it (fake_args; export.py's gated backward).
    """
    if variant not in VARIANTS:
        raise ValueError(f"mxq: variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    source = op.source
    key = (hashlib.sha256(source.encode()).hexdigest(), arch, dtype_name, keep_ptx, variant, layout_tag(layouts),
           n_multiple)
    compiled = _compiled.get(key)
    if compiled is not None:
        return compiled
    with _compile_lock:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:
        compiled = _compiled.get(key)
        if compiled is not None:
            return compiled
        mod = load_module(source)
        args = fake_args(op, dtype_name, targets.uses_hw_e8m0(arch), arch, vec=variant.startswith("vec"), layouts=layouts,
                         grouped=variant.endswith("_grouped"), n_multiple=n_multiple)
        cute = toolchain.import_cutlass(arch)
        with compile_options(arch, keep_ptx) as options, _compile_lock:
            try:
                entry = getattr(mod, VARIANTS[variant])
                compiled = cute.compile(entry, *args, options=options)
            except Exception as exc:
                raise RuntimeError(f"mxq: compiling {cache.source_file(source)} ({variant}) for {arch}/{dtype_name} "
                                   f"failed: {exc}") from exc
        _compiled[key] = compiled
        return compiled


_native = cache.LRU(cache.cache_size())  # (source sha, arch, dtype, variant) -> native function
_native_locks: dict = {}  # the same key -> a lock: concurrent first calls load one library once


def _fresh_locks() -> None:
    """In a forked child: the locks free (a child forked while another thread compiled holds them
    locked, with no thread left to release them: its first compile would wait forever)."""
    _compile_lock._at_fork_reinit()
    _key_locks.clear()
    _native_locks.clear()


os.register_at_fork(after_in_child=_fresh_locks)


def native_function(op, arch: str, dtype_name: str, variant: str, layouts=None):
    """The native TVM-FFI function of one kernel, from memory, the disk cache, or a compile.

    Disk: ``cache.kernel_cache_dir(arch)/<source sha>_<dtype>_<variant>[_<layout tag>].so`` with
    the SHA-256 of its key and bytes in a ``.sha256`` beside it, written under a file lock through
    temporary names; a library is loaded only if it verifies (cache.verified: a damaged one, or
    another key's, is rebuilt). ``MXQ_ALWAYS_COMPILE=1`` skips
    the disk. A cache that cannot be used (read-only, full, a file where a directory should be,
    no C++ compiler to link) degrades to the in-memory compile with a one-time warning; a valid
    library in a read-only cache is still loaded.
    """
    source_sha = hashlib.sha256(op.source.encode()).hexdigest()[:32]
    tag = layout_tag(layouts)
    key = (source_sha, arch, dtype_name, variant + (f"_{tag}" if tag else ""))
    fn = _native.get(key)
    if fn is not None:
        return fn
    with _compile_lock:
        lock = _native_locks.setdefault(key, threading.Lock())
    with lock:
        fn = _native.get(key)
        return fn if fn is not None else _native_function(op, key, arch, dtype_name, variant, layouts)


def _native_function(op, key, arch: str, dtype_name: str, variant: str, layouts):
    source_sha = key[0]
    if os.environ.get("MXQ_ALWAYS_COMPILE") == "1":
        fn = _native[key] = _native_of(compile_op(op, arch, dtype_name, variant=variant, layouts=layouts))
        return fn
    path = cache.kernel_cache_dir(arch) / f"{source_sha}_{dtype_name}_{key[3]}.so"
    try:
        lock = cache.FileLock(path.with_suffix(".lock"))
        lock.__enter__()
    except OSError as exc:  # read-only or unusable cache: load a valid library, else compile
        if cache.verified(path):
            try:
                fn = _native[key] = cache.load_function(path, cache.EXPORT_NAME)
                return fn
            except Exception:
                pass
        cache.warn_once("kernel disk cache not writable", exc)
        fn = _native[key] = _native_of(compile_op(op, arch, dtype_name, variant=variant, layouts=layouts))
        return fn
    try:
        if cache.verified(path):
            try:
                fn = _native[key] = cache.load_function(path, cache.EXPORT_NAME)
                return fn
            except Exception:
                pass  # rebuilt below
        compiled = compile_op(op, arch, dtype_name, variant=variant, layouts=layouts)
        try:
            cache.write_library(compiled, path)
            fn = _native[key] = cache.load_function(path, cache.EXPORT_NAME)
        except Exception as exc:
            cache.warn_once("kernel disk cache unavailable", exc)
            fn = _native[key] = _native_of(compiled)
        return fn
    finally:
        lock.__exit__(None, None, None)


def _native_of(compiled):
    """The positional tvm_ffi.Function behind a compiled wrapper (the wrapper itself where the
    DSL has not materialised one, as happens on a machine without a GPU)."""
    obj = compiled.__tvm_ffi_object__()
    return obj if obj is not None else compiled
