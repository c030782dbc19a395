"""mxq: fused MXFP8 quantization kernels from a decorator (CuTeDSL + TVM-FFI)."""

from .epilogue import EpilogueError
from .math import abs, erf, exp, exp2, log, log2, maximum, minimum, rsqrt, sigmoid, sqrt, tanh, where
from .op import FusedOp, fused_quant, quantize
from .spec import QuantSpec
from .tensor import MXFP8Tensor

__version__ = "0.1.0"

__all__ = [
    "EpilogueError", "FusedOp", "MXFP8Tensor", "QuantSpec", "fused_quant", "quantize",
    "abs", "erf", "exp", "exp2", "log", "log2", "maximum", "minimum", "rsqrt", "sigmoid", "sqrt",
    "tanh", "where",
]
