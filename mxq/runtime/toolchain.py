"""The toolchains mxq drives: CuTeDSL's (imported with the target arch set, and its runtime
libraries) and the C++ compiler and linker that build kernel libraries (the disk cache's, AOT
export's)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


class ToolchainError(RuntimeError):
    """The C++ compiler or linker failed, or there is none (the message holds its own words)."""


def import_cutlass(arch: str):
    """Import cutlass with CUTE_DSL_ARCH set (it is read at import; needed without a GPU)."""
    if "cutlass" not in sys.modules:
        os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass  # noqa: F401
    import cutlass.cute as cute

    return cute


def runtime_libraries() -> list[str]:
    """The shared libraries a kernel library needs at run time: the CuTeDSL runtime (which
    loads the CUDA driver itself) and TVM-FFI; both need only system libraries."""
    cute = import_cutlass("sm_90")
    return list(cute.runtime.find_runtime_libraries(enable_tvm_ffi=True))


def _cxx() -> list[str]:
    """The C++ compiler's command: ``CXX`` split as a shell line (a launcher or flags may come
    with it: ``ccache g++``, ``g++ -O2``), else g++ or c++ from PATH."""
    env = os.environ.get("CXX", "")
    if not env.strip():
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            raise ToolchainError("mxq: no C++ compiler (g++) found to build the kernel library; set CXX")
        return [cxx]
    try:
        cmd = shlex.split(env)
    except ValueError as exc:
        raise ToolchainError(f"mxq: the environment variable CXX={env!r} is not a command line: {exc}") from exc
    if shutil.which(cmd[0]) is None:
        raise ToolchainError(f"mxq: the environment variable CXX={env!r} names {cmd[0]!r}, which is not an "
                             "executable program (on PATH or as a path)")
    return cmd


def compile_cxx(src: Path, obj: Path, includes: list[str]) -> None:
    """Compile one C++ source into a position-independent object."""
    cmd = [*_cxx(), "-std=c++17", "-O2", "-fPIC", "-c", str(src), "-o", str(obj), *(f"-I{i}" for i in includes)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise ToolchainError(f"mxq: compiling {src.name} failed: {r.stderr.strip()[:2000]}")


def link_shared(objects: list[Path], out: Path, rpaths: list[str] | None = None, flags=()) -> None:
    """Link exported objects with the CuTeDSL runtime and TVM-FFI into a shared library.
    ``rpaths``: where the loader looks for them (default: where they are now); ``flags``: more
    linker arguments."""
    libs = runtime_libraries()
    rpaths = rpaths if rpaths is not None else [os.path.dirname(lib) for lib in libs]
    # (-Xlinker passes one argument as it is: -Wl,... would split a path at its commas)
    cmd = [*_cxx(), "-shared", "-o", str(out), *map(str, objects), *libs, "-Wl,--enable-new-dtags",
           *(a for r in rpaths for a in ("-Xlinker", "-rpath", "-Xlinker", r)), *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise ToolchainError(f"mxq: linking {out.name} failed: {r.stderr.strip()[:2000]}")
