"""mxq: fused MXFP8 quantization kernels from a decorator (CuTeDSL + TVM-FFI)."""

from .epilogue import EpilogueError
from .math import abs, erf, exp, exp2, log, log2, maximum, minimum, rsqrt, sigmoid, sqrt, tanh, where
from .activations import gelu, qgelu, relu, silu, srelu
from .op import FusedOp, fused_quant, quantize
from .spec import QuantSpec
from .tensor import MXFP8Tensor

__version__ = "0.1.0"


def get_include() -> str:
    """Directory holding ``mxq/mxq.hpp`` for C++ callers (``python -m mxq --includedir``)."""
    from pathlib import Path

    return str(Path(__file__).resolve().parent / "include")

from .op import register_entrypoints as _register_entrypoints

_register_entrypoints()  # "mxq.get_quantize_kernel" for C++ callers



def __getattr__(name):
    """``mxq.distributed`` (DTensor support, all_gather) and ``mxq.fsdp`` (FSDP2 all-gathers in
    MXFP8) load torch.distributed on first use."""
    if name in ("distributed", "fsdp"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mxq' has no attribute {name!r}")


__all__ = [
    "EpilogueError", "FusedOp", "get_include", "MXFP8Tensor", "QuantSpec", "fused_quant", "quantize",
    "abs", "erf", "exp", "exp2", "log", "log2", "maximum", "minimum", "rsqrt", "sigmoid", "sqrt",
    "tanh", "where", "gelu", "silu", "relu", "qgelu", "srelu",
]
