"""The caches: bounded in-process ones (LRU) and the disk cache under ``$MXQ_CACHE_DIR``.

On disk: the rendered modules (``src/mxq_gen_<sha>.py``: CuTeDSL reads kernels from real files)
and the kernel libraries (``kernels/<arch>-<fingerprint>/``, the fingerprint covering mxq's
version, the files that shape compiled code and the DSL's versions), each written once through
a temporary file and a rename, libraries under a file lock and loaded only when their recorded
SHA-256 matches. Where the disk cache cannot be used, callers degrade to memory with a one-time
warning (``warn_once``). What is cached is decided by the compiler (mxq/runtime/compiler.py).
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from .toolchain import link_shared

EXPORT_NAME = "mxq_launch"  # the function name inside every cached kernel library


class LRU(collections.OrderedDict):
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


def cache_size() -> int:
    """Entries kept by each in-process kernel cache: MXQ_KERNEL_CACHE_SIZE, default 256 (a
    compiled kernel holds a few MB of host memory; a process that decorates ops in a loop would
    otherwise grow without bound). Evicted kernels are rebuilt, or reloaded from disk, on use."""
    raw = os.environ.get("MXQ_KERNEL_CACHE_SIZE", "").strip() or "256"  # (set but empty: the default, as MXQ_CACHE_DIR)
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"mxq: the environment variable MXQ_KERNEL_CACHE_SIZE must be a positive integer, got {raw!r}")
    return n


def cache_dir() -> Path:
    """MXQ_CACHE_DIR (``~`` expanded), default ~/.cache/mxq."""
    return Path(os.environ.get("MXQ_CACHE_DIR") or Path.home() / ".cache" / "mxq").expanduser()


def source_file(source: str) -> Path:
    """Write ``source`` to the cache (atomically, once) and return its path. A damaged file
    (other bytes, invalid UTF-8, a directory in its place) is replaced; where the cache cannot
    be written, a private temporary directory holds the module instead (CuTeDSL reads kernels
    from real files)."""
    data = source.encode()
    digest = hashlib.sha256(data).hexdigest()[:24]
    for where in (lambda: cache_dir() / "src", _private_src_dir):
        try:
            path = where() / f"mxq_gen_{digest}.py"
            if path.is_file() and path.read_bytes() == data:
                return path
            path.parent.mkdir(parents=True, exist_ok=True)
            clear_non_file(path)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            return path
        except OSError as exc:
            warn_once("module cache not writable", exc)
    raise RuntimeError("mxq: no writable directory for the generated module (cache and temporary directory)")


_private_dir: Path | None = None


def _private_src_dir() -> Path:
    """This process's own directory for generated modules (tempfile.mkdtemp: mode 0700 under a
    name no other user can take first; a fixed name in the shared temporary directory let anyone
    create it before us and own what lands there)."""
    global _private_dir
    if _private_dir is None:
        _private_dir = Path(tempfile.mkdtemp(prefix="mxq-src-"))
    return _private_dir


def clear_non_file(path: Path) -> None:
    """Remove a directory (or other non-file) where the cache expects a file."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() and not path.is_file():
        path.unlink(missing_ok=True)


_warned: set = set()


def warn_once(what: str, exc: Exception) -> None:
    if what not in _warned:
        _warned.add(what)
        import warnings

        warnings.warn(f"mxq: {what} ({exc}); kernels compile in memory in every process", RuntimeWarning,
                      stacklevel=4)


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


class FileLock:
    """An exclusive lock on ``path`` (flock) so processes sharing a cache build a file once.
    Something that is not a regular file in the lock's place (a directory) is removed first."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        clear_non_file(self.path)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def load_function(path: Path, name: str):
    import tvm_ffi

    mod = tvm_ffi.load_module(str(path))
    return mod[name]


def _digest(data: bytes, key: str) -> str:
    """SHA-256 of ``key`` (the library's place in the cache) and then its bytes: a digest belongs
    to one key, so a library moved or copied under another key's name does not verify."""
    return hashlib.sha256(key.encode() + b"\0" + data).hexdigest()


def _key_of(path: Path) -> str:
    """A cached library's key: its folder (arch and fingerprint) and its name (source, dtype, variant)."""
    return f"{path.parent.name}/{path.name}"


def elf_within(data: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file's program segments and section header table lie
    inside its ``data``: a shorter file would be mapped past its end and kill the process with
    SIGBUS at load or at its first call, whatever its digest says."""
    import struct

    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return False
    for i in range(phnum):
        offset, filesz = struct.unpack_from("<Q", data, phoff + i * phentsize + 0x08)[0], \
            struct.unpack_from("<Q", data, phoff + i * phentsize + 0x20)[0]
        if offset + filesz > len(data):
            return False
    return True


def verified(path: Path) -> bool:
    """Whether cached library ``path`` is whole and its own: the SHA-256 of its key and bytes
    (which cover the embedded cubin) equals the one recorded beside it when it was written, and
    its ELF segments lie inside the file. A library is loaded only after this check: a damaged
    one that loaded would crash the process at its first call (SIGBUS), and another key's
    library (two keys' files swapped) would compute another op."""
    digest = path.with_suffix(".sha256")
    try:
        if not (path.is_file() and digest.is_file()):
            return False
        data = path.read_bytes()
        recorded = digest.read_text(encoding="ascii", errors="replace").strip()
        return recorded == _digest(data, _key_of(path)) and elf_within(data)
    except OSError:
        return False


def write_library(compiled, path: Path) -> None:
    """Export ``compiled`` to ``path`` and record its digest, each through a temporary file and
    a rename, so no reader ever sees a partial file; stale temporaries of killed writers go."""
    for stale in path.parent.glob("tmp-mxq-*"):
        try:
            if time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    clear_non_file(path)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix="tmp-mxq-") as d:
        obj = Path(d) / "k.o"
        compiled.export_to_c(str(obj), function_name=EXPORT_NAME, export_only_tvm_ffi_symbols=True)
        tmp = Path(d) / "k.so"
        link_shared([obj], tmp)
        digest = Path(d) / "k.sha256"
        digest.write_text(_digest(tmp.read_bytes(), _key_of(path)), encoding="ascii")
        clear_non_file(path.with_suffix(".sha256"))
        path.with_suffix(".sha256").unlink(missing_ok=True)
        os.replace(tmp, path)
        os.replace(digest, path.with_suffix(".sha256"))
