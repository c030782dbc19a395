"""The math of the epilogue language, runnable eagerly on torch tensors.

An epilogue may call only these functions (as ``mxq.<name>``). Each is defined here once with
torch, and the reference evaluates the parsed IR through this table, so "what the function
does in eager torch" and "what the reference computes" are the same code. The kernel templates
implement the same definitions; for ``maximum``/``minimum`` that means the select form below
(NaN-dropping like IEEE maxNum / PTX ``max.f32``, with a fixed answer for +0 vs -0), not
torch.maximum, which propagates NaN.
"""

from __future__ import annotations

import torch


def _t(a):
    return a if isinstance(a, torch.Tensor) else torch.tensor(float(a), dtype=torch.float32)


def where(cond, a, b):
    """``a`` where ``cond`` holds, else ``b``."""
    return torch.where(_t(cond).bool(), _t(a), _t(b))


def maximum(a, b):
    """``a`` if ``a > b`` or ``b`` is NaN, else ``b``: NaN-dropping, ``maximum(-0., 0.) == 0.``."""
    a, b = _t(a), _t(b)
    return torch.where((a > b) | torch.isnan(b), a, b)


def minimum(a, b):
    """``a`` if ``a < b`` or ``b`` is NaN, else ``b``: NaN-dropping, ``minimum(0., -0.) == -0.``."""
    a, b = _t(a), _t(b)
    return torch.where((a < b) | torch.isnan(b), a, b)


def abs(a):  # noqa: A001 - the epilogue language's name
    return torch.abs(_t(a))


def exp(a):
    return torch.exp(_t(a))


def exp2(a):
    return torch.exp2(_t(a))


def log(a):
    return torch.log(_t(a))


def log2(a):
    return torch.log2(_t(a))


def tanh(a):
    return torch.tanh(_t(a))


def sigmoid(a):
    return torch.sigmoid(_t(a))


def erf(a):
    return torch.erf(_t(a))


def sqrt(a):
    return torch.sqrt(_t(a))


def rsqrt(a):
    return torch.rsqrt(_t(a))


UNARY = {"abs": abs, "exp": exp, "exp2": exp2, "log": log, "log2": log2, "tanh": tanh,
         "sigmoid": sigmoid, "erf": erf, "sqrt": sqrt, "rsqrt": rsqrt}
BINARY = {"maximum": maximum, "minimum": minimum}
TERNARY = {"where": where}
FUNCTIONS = {**UNARY, **BINARY, **TERNARY}
# Functions written in the epilogue language itself (the built-in activations, registered by
# mxq/frontend/activations.py, their one definition): a call expands into their IR, applied to the
# argument. mxq.gelu(x) etc. also run eagerly on torch tensors.
INLINE: dict = {}
# Functions whose GPU result may differ from torch's in the last bit (NUMERICS "transcendental class").
INEXACT = frozenset({"exp", "exp2", "log", "log2", "tanh", "sigmoid", "erf", "sqrt", "rsqrt"})


def resolve_cpu_dispatch() -> None:
    """Call every function of the table once on a one-element tensor, fp32 and fp64.

    PyTorch's CPU kernels for contiguous float unary ops call MKL VML from every intra-op
    thread, and oneMKL 2024.2 (the wheels' pin) picks each function's kernel lazily at its first
    call: concurrent first calls can run a low-accuracy kernel on one thread's chunk of that one
    call (pytorch/pytorch#188792, open). Here `torch.tanh` of a 4001-element fp32 tensor came
    back with its second half up to 9e-5 off (tanh(5.0) == 1.0) in 2 of 24 fresh processes, so
    the reference's gelu, and every test that compares against it, depended on which call came
    first. A one-element call runs on the calling thread alone and settles the choice before
    any parallel one; mxq makes these calls when it is imported (tests/test_math.py)."""
    for dtype in (torch.float32, torch.float64):
        one = torch.full((1,), 0.5, dtype=dtype, device="cpu")  # (not a default device set by the user)
        for f in UNARY.values():
            f(one)


resolve_cpu_dispatch()
