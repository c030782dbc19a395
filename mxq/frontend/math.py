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


# _by_value's evaluation: runs of _VALUE_RUN elements (a multiple of every CPU vector width torch
# uses, zero-padded) and calls of at most _VALUE_CALL elements. torch's own loops (sigmoid, exp2)
# split a call over threads only from its intra-op grain, 32768 elements, and a thread's chunk may
# end inside a vector, whose elements then take scalar code; under it one thread runs the call,
# vectorised from the run's start to its end. (exp, log, log2, tanh and erf go to MKL's vector math,
# which splits smaller calls over threads too but computes each chunk's end with vector code.)
_VALUE_RUN = 64
_VALUE_CALL = 16384


def _by_value(fn, a):
    """``fn`` of ``a``, a function of each element's value alone. torch's fp32 CPU kernels of these
    functions give a last bit that depends on where an element lies: a contiguous run goes
    through vectorised code, a strided or broadcast view and a run's tail (or a thread's chunk
    boundary) through scalar code (sigmoid and exp2 differed by 1 ulp for the same values). So on
    the CPU an fp32 tensor is evaluated as one contiguous zero-padded buffer of whole vector runs,
    in calls one thread runs: every element through torch's vectorised code (NUMERICS
    "Epilogue language")."""
    a = _t(a)
    if a.device.type != "cpu" or a.dtype != torch.float32:
        return fn(a)
    flat = a.reshape(-1)
    n = flat.numel()
    pad = -n % _VALUE_RUN
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    elif not flat.is_contiguous():
        flat = flat.contiguous()
    if flat.numel() <= _VALUE_CALL:
        out = fn(flat)
    else:
        out = torch.cat([fn(flat[i:i + _VALUE_CALL]) for i in range(0, flat.numel(), _VALUE_CALL)])
    return out[:n].view(a.shape)


def exp(a):
    return _by_value(torch.exp, a)


def exp2(a):
    return _by_value(torch.exp2, a)


def log(a):
    return _by_value(torch.log, a)


def log2(a):
    return _by_value(torch.log2, a)


def tanh(a):
    return _by_value(torch.tanh, a)


def sigmoid(a):
    return _by_value(torch.sigmoid, a)


def erf(a):
    return _by_value(torch.erf, a)


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
        for name in UNARY:  # (torch's own functions: the table's pad and split their argument, _by_value)
            getattr(torch, name)(one)


resolve_cpu_dispatch()
