"""mxq: fused MXFP8 quantization kernels from a decorator (CuTeDSL + TVM-FFI)."""

from .frontend.epilogue import EpilogueError
from .frontend.math import abs, erf, exp, exp2, log, log2, maximum, minimum, rsqrt, sigmoid, sqrt, tanh, where
from .frontend.activations import gelu, qgelu, relu, silu, srelu
from .op import FusedOp, fused_quant, quantize
from .frontend.spec import QuantSpec
from .tensor import MXFP8Tensor
from ._version import __version__


def get_include() -> str:
    """Directory holding ``mxq/mxq.hpp`` for C++ callers (``python -m mxq --includedir``)."""
    from pathlib import Path

    return str(Path(__file__).resolve().parent / "include")

from .integrations.entrypoints import get_quantize_kernel
from .integrations.entrypoints import register_entrypoints as _register_entrypoints

_register_entrypoints()  # "mxq.get_quantize_kernel" for C++ callers, the function above



# Public modules whose code lives in a stage's folder: ``mxq.distributed`` (DTensor support,
# all_gather) and ``mxq.fsdp`` (FSDP2 all-gathers in MXFP8), which load torch.distributed, and
# ``mxq.targets`` (SUPPORTED_ARCHS). They load on first use: as attributes (__getattr__) or
# imported by name (_AliasFinder).
_ALIASES = {"mxq.distributed": "mxq.integrations.distributed", "mxq.fsdp": "mxq.integrations.fsdp",
            "mxq.targets": "mxq.runtime.targets"}


class _AliasFinder:
    """``import mxq.fsdp`` and ``from mxq.distributed import all_gather``: the import system
    gets the module of the stage's folder itself (one module object under both names)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in _ALIASES:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, _AliasFinder)

    @staticmethod
    def create_module(spec):
        import importlib

        module = importlib.import_module(_ALIASES[spec.name])
        spec.loader_state = module.__spec__  # (the import system stamps the alias's spec on it next)
        return module

    @staticmethod
    def exec_module(module):
        module.__spec__ = module.__spec__.loader_state  # its own spec back; the code ran already


import sys as _sys

if not any(getattr(f, "__qualname__", None) == "_AliasFinder" for f in _sys.meta_path):
    _sys.meta_path.insert(0, _AliasFinder)  # (before an editable install's finder of another tree)


def __getattr__(name):
    if f"{__name__}.{name}" in _ALIASES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mxq' has no attribute {name!r}")


__all__ = [
    "EpilogueError", "FusedOp", "get_include", "get_quantize_kernel", "MXFP8Tensor", "QuantSpec", "fused_quant",
    "quantize",
    "abs", "erf", "exp", "exp2", "log", "log2", "maximum", "minimum", "rsqrt", "sigmoid", "sqrt",
    "tanh", "where", "gelu", "silu", "relu", "qgelu", "srelu",
]
