"""mxq's own TVM-FFI global for C++ callers: ``mxq.get_quantize_kernel(key)``, the native
dispatcher of the built-in quantize op of a QuantSpec key (registered when mxq is imported)."""

from __future__ import annotations

from ..frontend.spec import QuantSpec
from ..op import _quantize_op


def get_quantize_kernel(key: int):
    """Lazy entrypoint for C++ (``mxq.get_quantize_kernel``): the destination-passing dispatcher
    of the built-in quantize op with 32-bit ``key`` (QuantSpec.key): the native one (MXFP8, FP8
    block scaling), or for NVFP4 and MXFP4 one that runs in Python on every call. The key's dtype
    bits are ignored: one dispatcher serves every input dtype; each dtype's kernel compiles on its
    first call."""
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"mxq: get_quantize_kernel() key must be an int, got {type(key).__name__}")
    spec, _ = QuantSpec.from_key(key)
    return _quantize_op(spec)._dispatcher_for(False, "get_quantize_kernel()")


def register_entrypoints() -> None:
    """Make ``mxq.get_quantize_kernel`` visible to C++ (idempotent)."""
    import tvm_ffi

    tvm_ffi.register_global_func("mxq.get_quantize_kernel", get_quantize_kernel, override=True)
