"""Rendered source -> importable module file -> ``cute.compile`` -> native TVM-FFI function.

CuTeDSL needs kernels in real files (it reads their source), so each rendered module is written
once to ``$MXQ_CACHE_DIR/src/<sha>.py`` and imported from there; tracebacks and compile errors
point into that file. Compiles are keyed by (source hash, arch, dtype) -- the source already
covers the spec, the epilogue fingerprint and the templates -- and run under one lock
(``cute.compile`` is not thread-safe); concurrent first calls of one key wait for one compile.
M and N are symbolic, so one compile serves every shape. ``native_function`` adds the disk
cache: each kernel exported once to a shared library under a versioned directory, loaded by
later processes in milliseconds without importing cutlass.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..frontend import gated
from . import slots, targets
from ..formats.numerics import dbias_partial_dtype
from ..frontend.spec import DTYPES

_DTYPE_BY_NAME = {v: k for k, v in DTYPES.items()}
_compile_lock = threading.Lock()
_key_locks: dict = {}


class _LRU(collections.OrderedDict):
    """A dict that keeps its ``maxsize`` most recently used entries (``on_evict(key, value)``
    runs for each one it drops)."""

    def __init__(self, maxsize: int, on_evict=None):
        super().__init__()
        self.maxsize, self.on_evict = maxsize, on_evict

    def get(self, key, default=None):
        try:
            value = super().__getitem__(key)
        except KeyError:
            return default
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            old_key, old = self.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(old_key, old)


def _cache_size() -> int:
    """Entries kept by each in-process kernel cache: MXQ_KERNEL_CACHE_SIZE, default 256 (a
    compiled kernel holds a few MB of host memory; a process that decorates ops in a loop would
    otherwise grow without bound). Evicted kernels are rebuilt, or reloaded from disk, on use."""
    try:
        n = int(os.environ.get("MXQ_KERNEL_CACHE_SIZE", "256"))
    except ValueError:
        raise ValueError("mxq: MXQ_KERNEL_CACHE_SIZE must be a positive integer") from None
    if n < 1:
        raise ValueError("mxq: MXQ_KERNEL_CACHE_SIZE must be a positive integer")
    return n


_compiled = _LRU(_cache_size())  # compile key -> compiled function
_modules = _LRU(_cache_size(), on_evict=lambda name, mod: sys.modules.pop(name, None))  # generated modules


def cache_dir() -> Path:
    return Path(os.environ.get("MXQ_CACHE_DIR") or Path.home() / ".cache" / "mxq")


def _import_cutlass(arch: str):
    """Import cutlass with CUTE_DSL_ARCH set (it is read at import; needed without a GPU)."""
    if "cutlass" not in sys.modules:
        os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass  # noqa: F401
    import cutlass.cute as cute

    return cute


def source_file(source: str) -> Path:
    """Write ``source`` to the cache (atomically, once) and return its path. A damaged file
    (other bytes, invalid UTF-8, a directory in its place) is replaced; where the cache cannot
    be written, a private temporary directory holds the module instead (CuTeDSL reads kernels
    from real files)."""
    data = source.encode()
    digest = hashlib.sha256(data).hexdigest()[:24]
    for root in (cache_dir() / "src", _private_src_dir()):
        path = root / f"mxq_gen_{digest}.py"
        try:
            if path.is_file() and path.read_bytes() == data:
                return path
            path.parent.mkdir(parents=True, exist_ok=True)
            _clear_non_file(path)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            return path
        except OSError as exc:
            _warn_once("module cache not writable", exc)
    raise RuntimeError("mxq: no writable directory for the generated module (cache and temporary directory)")


def _private_src_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"mxq-src-{os.getuid()}"


def load_module(source: str):
    path = source_file(source)
    name = path.stem
    mod = _modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
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
    cute = _import_cutlass(arch)
    import cutlass
    from cutlass import Float32, Uint8

    spec, epi = op.spec, op.epilogue
    el = {"fp32": cutlass.Float32, "fp16": cutlass.Float16, "bf16": cutlass.BFloat16}[dtype_name]
    nbytes = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype_name]
    m, n = cute.sym_int(), cute.sym_int(divisibility=math.lcm(VEC_DIVISOR if vec else 1, n_multiple))
    fake = cute.runtime.make_fake_compact_tensor
    big = VEC_ALIGN if vec else None
    ws_bytes = dbias_partial_dtype(_DTYPE_BY_NAME[dtype_name]).itemsize  # fp32 for 16-bit inputs

    # two-halves ops (mxq/frontend/gated.py) write outputs [M, 2N]: their output width is its own value
    n_out = cute.sym_int(divisibility=VEC_DIVISOR if vec else 1) if gated.is_halves(epi) else n

    def mat(dtype, align, rows=m, cols=n):
        return fake(dtype, (rows, cols), stride_order=(1, 0), assumed_align=align)

    def flat_u8():
        return fake(Uint8, (cute.sym_int(),), assumed_align=1)

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
        stride = {"row": (0, 1), "col": (1, 0), "scalar": (0, 0)}[kind]
        return cute.runtime.make_fake_tensor(el, (m, n), stride=stride,
                                             assumed_align=(big or nbytes) if kind == "row" else nbytes)

    kinds = iter(layouts or ())
    by_role = {
        "input": lambda: operand(next(kinds, "full")),
        "scalar": lambda: Float32(0.0),
        "act_input": lambda: mat(el, big or nbytes),
        "rowwise_data": lambda: mat(Uint8, big or 1, cols=n_out),
        "rowwise_scale": flat_u8,
        "colwise_data": lambda: mat(Uint8, big or 1, cols=n_out),
        "colwise_scale": flat_u8,
        "amax": f32_one,
        "dbias": lambda: (fake(el, (cute.sym_int(), n_out), stride_order=(1, 0), assumed_align=nbytes) if grouped
                          else fake(el, (n_out,), assumed_align=nbytes)),
        "dbias_workspace": lambda: mat({4: cutlass.Float32, 8: cutlass.Float64}[ws_bytes], ws_bytes,
                                       rows=cute.sym_int(), cols=n_out),
        "noop": f32_one,
        "group_offsets": lambda: fake(cutlass.Int32, (cute.sym_int(),), assumed_align=4),
    }
    table = slots.kernel_slots(spec, len(epi.tensor_params), gated.launch_scalars(epi), grouped)
    args = [by_role[s.role]() for s in table]
    args.append(use_hw)
    if spec.dbias:
        args.append(uses_pdl(arch))
    args.append(cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))
    return args


def device_arch(device) -> str:
    """The arch string of a CUDA device (torch.device), e.g. "sm_90a" for an H200."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def uses_hw_e8m0(arch: str) -> bool:
    return int(re.sub(r"\D", "", arch)[:3] or 0) >= 100


def uses_pdl(arch: str) -> bool:
    """Programmatic dependent launch (griddepcontrol, sm_90+): dbias ops launch their second
    kernel while the first still runs; it waits in griddepcontrol.wait for the first to finish."""
    return int(re.sub(r"\D", "", arch)[:3] or 0) >= 90


VEC_DIVISOR = 8  # the vectorised kernel's N must be a multiple of this
VEC_ALIGN = 16  # ... and every [M, N] tensor 16-byte aligned
# compiled variants -> the generated module's launcher: the vectorised kernels (N % 8 == 0, aligned
# tensors), the any-shape ones (16-bit: unaligned rows; fp32: element-wise), "rows8" (any shape
# whose FP8 output rows start on 8-byte boundaries: padded outputs, launch.variant_for; fp32: the
# vectorised kernel with staged rows, KernelConfig.vec_unaligned),
# and the grouped twins of the first two (group_offsets)
VARIANTS = {"vec": "launch_vec", "generic": "launch", "rows8": "launch_rows8", "vec_grouped": "launch_vec_grouped",
            "generic_grouped": "launch_grouped"}


def compile_op(op, arch: str, dtype_name: str, keep_ptx: bool = False, variant: str = "vec", layouts=None,
               n_multiple: int = 1):
    """The compiled CuTeDSL function (TVM-FFI wrapper) for ``op`` on ``arch`` with input dtype.

    ``variant`` "vec" is the 16-byte vectorised kernel (N % 8 == 0, aligned tensors), "generic"
    the one that serves every shape and alignment (16-bit inputs: the packed kernel with
    unaligned rows; fp32: the element-wise kernel). ``n_multiple``: the function refuses an N
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
        args = fake_args(op, dtype_name, uses_hw_e8m0(arch), arch, vec=variant.startswith("vec"), layouts=layouts,
                         grouped=variant.endswith("_grouped"), n_multiple=n_multiple)
        cute = _import_cutlass(arch)
        options = f"--enable-tvm-ffi --gpu-arch {arch}"
        dump = None
        if keep_ptx:
            # CuTeDSL writes the PTX into a file named by the kernel signature alone (two ops of
            # one signature share a name, across processes too) and the option string is split
            # like a shell line: a fresh private directory per compile, quoted
            dump = tempfile.mkdtemp(prefix="mxq-ptx-")
            options += f" --keep-ptx --dump-dir {shlex.quote(dump)}"
        try:
            with _compile_lock:
                try:
                    entry = getattr(mod, VARIANTS[variant])
                    compiled = cute.compile(entry, *args, options=options)
                except Exception as exc:
                    raise RuntimeError(f"mxq: compiling {source_file(source)} ({variant}) for {arch}/{dtype_name} "
                                       f"failed: {exc}") from exc
        finally:
            if dump is not None:
                shutil.rmtree(dump, ignore_errors=True)
        _compiled[key] = compiled
        return compiled


def ptx_of(op, arch: str, dtype_name: str, variant: str = "vec", layouts=None) -> str:
    """The PTX of one kernel of ``op`` (compiled with keep_ptx on first use)."""
    # (the DSL reads the dump into the compiled object right after compiling: no file is kept)
    return compile_op(op, arch, dtype_name, keep_ptx=True, variant=variant, layouts=layouts).__ptx__


def compile_artifacts(op, arch: str = "sm_90", dtype="bf16", variant: str = "vec", layouts=None) -> dict:
    """Compile without a GPU and return what was produced, for inspection. ``dtype``: "bf16",
    "fp16", "fp32" or the torch dtype; ``arch``: one of targets.SUPPORTED_ARCHS."""
    arch = targets.normalize_arch(arch)
    dtype = targets.normalize_dtype(dtype)
    if variant not in VARIANTS:
        raise ValueError(f"mxq: variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    compiled = compile_op(op, arch, dtype, keep_ptx=True, variant=variant, layouts=layouts)
    ptx = ptx_of(op, arch, dtype, variant, layouts)
    mlir = compiled.ir_module
    out = {"ptx": ptx, "mlir": str(mlir) if mlir is not None else "", "source": op.source,
           "path": str(source_file(op.source)), "arch": arch, "dtype": dtype, "variant": variant}
    out.update(ptxas_report(ptx, arch))
    out["conversions"] = sorted(set(re.findall(r"\bcvt\.[a-z0-9.]+", ptx)))
    return out


def ptxas_report(ptx: str, arch: str) -> dict:
    """Registers and spills per kernel from the local ``ptxas -v``, when a CUDA toolkit is present.

    CuTeDSL embeds a newer ptxas than a local toolkit may have; if the local one refuses the PTX
    ISA version, the report re-assembles a copy stamped with the version it accepts (the kernels
    use no newer instructions) and says so in ``ptxas_note``.
    """
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return {"ptxas": None, "kernels": {}}
    note = ""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        for _ in range(2):
            src.write_text(ptx)
            r = subprocess.run([ptxas, "-v", f"-arch={arch}", str(src), "-o", str(Path(d) / "k.cubin")],
                               capture_output=True, text=True, timeout=300)
            text = r.stdout + r.stderr
            m = re.search(r"Unsupported \.version (\S+); current version is '([\d.]+)'", text)
            if r.returncode == 0 or not m:
                break
            note = f"PTX ISA {m.group(1)} re-stamped as {m.group(2)} for the local ptxas"
            ptx = re.sub(r"^\.version \S+", f".version {m.group(2)}", ptx, count=1, flags=re.M)
        sass = sass_opcodes(Path(d) / "k.cubin") if r.returncode == 0 else {}
    kernels: dict = {name: {"sass_instructions": sum(ops.values()), "sass_opcodes": ops} for name, ops in sass.items()}
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = kernels.setdefault(m.group(1), {})
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current is not None:
            current["spill_stores"], current["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
    return {"ptxas": "ok" if r.returncode == 0 else text, "ptxas_note": note, "kernels": kernels}


def sass_opcodes(cubin: Path) -> dict:
    """Machine instructions per kernel, by opcode (``{kernel: Counter}``), when ``nvdisasm`` is on
    PATH (optional: it is not part of the CUDA toolkits without a driver, but NVIDIA ships it as
    a pip wheel). Their total bounds the issue-limited fused ops; PTX counts include moves that
    vanish in SASS. Not counted: instructions predicated on ``!PT`` (never executed) and the
    padding after the last EXIT (its self-branch and the alignment NOPs)."""
    nvdisasm = shutil.which("nvdisasm")
    if nvdisasm is None:
        return {}
    r = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    listing: dict = {}
    current = None
    for line in r.stdout.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            current = m.group(1)
            listing[current] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)", line)
        if current and m and (m.group(1) or "").strip() != "@!PT":
            listing[current].append(m.group(2))
    counts = {}
    for name, ops in listing.items():
        while ops and ops[-1] == "NOP":
            ops.pop()
        if len(ops) >= 2 and ops[-1] == "BRA" and ops[-2] == "EXIT":
            ops.pop()
        counts[name] = collections.Counter(ops)
    return counts


# -- the disk cache ---------------------------------------------------------------------------

EXPORT_NAME = "mxq_launch"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from .._version import __version__
    from ..frontend import codegen

    parts = [f"mxq={__version__}", f"kernels={codegen.kernels_hash()}"]
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            parts.append(f"{dist}={version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist}=?")
    return ";".join(parts)


def kernel_cache_dir(arch: str) -> Path:
    """$MXQ_CACHE_DIR/<fingerprint of mxq, templates, cutlass-dsl, tvm-ffi versions and arch>."""
    fp = hashlib.sha256(f"{_versions()};arch={arch}".encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{arch}-{fp}"


def runtime_libraries() -> list[str]:
    """The shared libraries a kernel library needs at run time: the CuTeDSL runtime (which
    loads the CUDA driver itself) and TVM-FFI; both need only system libraries."""
    cute = _import_cutlass("sm_90")
    return list(cute.runtime.find_runtime_libraries(enable_tvm_ffi=True))


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("mxq: no C++ compiler (g++) found to build the kernel library; set CXX")
    return cxx


def _compile_cxx(src: Path, obj: Path, includes: list[str]) -> None:
    """Compile one C++ source into a position-independent object."""
    cmd = [_cxx(), "-std=c++17", "-O2", "-fPIC", "-c", str(src), "-o", str(obj), *(f"-I{i}" for i in includes)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"mxq: compiling {src.name} failed: {r.stderr.strip()[:2000]}")


def _link_shared(objects: list[Path], out: Path, rpaths: list[str] | None = None, flags=()) -> None:
    """Link exported objects with the CuTeDSL runtime and TVM-FFI into a shared library.
    ``rpaths``: where the loader looks for them (default: where they are now); ``flags``: more
    linker arguments."""
    libs = runtime_libraries()
    rpaths = rpaths if rpaths is not None else [os.path.dirname(lib) for lib in libs]
    cmd = [_cxx(), "-shared", "-o", str(out), *map(str, objects), *libs, "-Wl,--enable-new-dtags",
           *(f"-Wl,-rpath,{r}" for r in rpaths), *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"mxq: linking {out.name} failed: {r.stderr.strip()[:2000]}")


class _FileLock:
    """An exclusive lock on ``path`` (flock) so processes sharing a cache build a file once.
    Something that is not a regular file in the lock's place (a directory) is removed first."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        _clear_non_file(self.path)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _clear_non_file(path: Path) -> None:
    """Remove a directory (or other non-file) where the cache expects a file."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() and not path.is_file():
        path.unlink(missing_ok=True)


def _load_function(path: Path, name: str):
    import tvm_ffi

    mod = tvm_ffi.load_module(str(path))
    return mod[name]


def _digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verified(path: Path) -> bool:
    """Whether cached library ``path`` is whole: its SHA-256 (which covers the embedded cubin)
    equals the one recorded beside it when it was written. A library is loaded only after this
    check: a damaged one that loaded would crash the process at its first call (SIGBUS)."""
    digest = path.with_suffix(".sha256")
    try:
        if not (path.is_file() and digest.is_file()):
            return False
        return digest.read_text(encoding="ascii", errors="replace").strip() == _digest_file(path)
    except OSError:
        return False


def _write_library(compiled, path: Path) -> None:
    """Export ``compiled`` to ``path`` and record its digest, each through a temporary file and
    a rename, so no reader ever sees a partial file; stale temporaries of killed writers go."""
    for stale in path.parent.glob("tmp-mxq-*"):
        try:
            if time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    _clear_non_file(path)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix="tmp-mxq-") as d:
        obj = Path(d) / "k.o"
        compiled.export_to_c(str(obj), function_name=EXPORT_NAME, export_only_tvm_ffi_symbols=True)
        tmp = Path(d) / "k.so"
        _link_shared([obj], tmp)
        digest = Path(d) / "k.sha256"
        digest.write_text(_digest_file(tmp), encoding="ascii")
        _clear_non_file(path.with_suffix(".sha256"))
        path.with_suffix(".sha256").unlink(missing_ok=True)
        os.replace(tmp, path)
        os.replace(digest, path.with_suffix(".sha256"))


_native = _LRU(_cache_size())  # (source sha, arch, dtype, variant) -> native function
_native_locks: dict = {}  # the same key -> a lock: concurrent first calls load one library once
_warned: set = set()


def _warn_once(what: str, exc: Exception) -> None:
    if what not in _warned:
        _warned.add(what)
        import warnings

        warnings.warn(f"mxq: {what} ({exc}); kernels compile in memory in every process", RuntimeWarning,
                      stacklevel=4)


def native_function(op, arch: str, dtype_name: str, variant: str, layouts=None):
    """The native TVM-FFI function of one kernel, from memory, the disk cache, or a compile.

    Disk: ``kernel_cache_dir(arch)/<source sha>_<dtype>_<variant>.so`` with its SHA-256 in a
    ``.sha256`` beside it, written under a file lock through temporary names; a library is
    loaded only if its digest matches (a damaged one is rebuilt). ``MXQ_ALWAYS_COMPILE=1`` skips
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
    path = kernel_cache_dir(arch) / f"{source_sha}_{dtype_name}_{key[3]}.so"
    try:
        lock = _FileLock(path.with_suffix(".lock"))
        lock.__enter__()
    except OSError as exc:  # read-only or unusable cache: load a valid library, else compile
        if _verified(path):
            try:
                fn = _native[key] = _load_function(path, EXPORT_NAME)
                return fn
            except Exception:
                pass
        _warn_once("kernel disk cache not writable", exc)
        fn = _native[key] = _native_of(compile_op(op, arch, dtype_name, variant=variant, layouts=layouts))
        return fn
    try:
        if _verified(path):
            try:
                fn = _native[key] = _load_function(path, EXPORT_NAME)
                return fn
            except Exception:
                pass  # rebuilt below
        compiled = compile_op(op, arch, dtype_name, variant=variant, layouts=layouts)
        try:
            _write_library(compiled, path)
            fn = _native[key] = _load_function(path, EXPORT_NAME)
        except Exception as exc:
            _warn_once("kernel disk cache unavailable", exc)
            fn = _native[key] = _native_of(compiled)
        return fn
    finally:
        lock.__exit__(None, None, None)


def _native_of(compiled):
    """The positional tvm_ffi.Function behind a compiled wrapper (the wrapper itself where the
    DSL has not materialised one, as happens on a machine without a GPU)."""
    obj = compiled.__tvm_ffi_object__()
    return obj if obj is not None else compiled
