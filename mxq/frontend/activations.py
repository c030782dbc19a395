"""act / dact formulas of docs/NUMERICS.md, written in the epilogue language.

Writing them as epilogues means one definition serves three readers: eager torch (call the
function), the reference (evaluates the parsed IR) and the kernel templates (render the same
IR). Constants and operation order follow TransformerEngine's ``util/math.h``.

mxq choice: relu/srelu and their derivatives use ``mxq.where(x > 0, ...)``, so NaN -> 0 and
-0 -> +0 deterministically (TE's ``fmaxf(x, 0)`` leaves the sign of a zero to the hardware).
"""

from __future__ import annotations

from functools import lru_cache

from . import math as mxq
from .epilogue import Epilogue, parse


def gelu(x):
    return x * (0.5 + 0.5 * mxq.tanh(x * (0.79788456 + 0.03567741 * x * x)))


def dgelu(x):
    t = mxq.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))
    return 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)


def silu(x):
    return x * mxq.sigmoid(x)


def dsilu(x):
    s = mxq.sigmoid(x)
    return x * (s * (1.0 - s)) + s


def qgelu(x):
    return x * mxq.sigmoid(1.702 * x)


def dqgelu(x):
    z = 1.702 * x
    s = mxq.sigmoid(z)
    return z * (s * (1.0 - s)) + s


def relu(x):
    return mxq.where(x > 0.0, x, 0.0)


def drelu(x):
    return mxq.where(x > 0.0, 1.0, 0.0)


def srelu(x):
    return mxq.where(x > 0.0, x * x, 0.0)


def dsrelu(x):
    return mxq.where(x > 0.0, 2.0 * x, 0.0)


FORWARD = {"gelu": gelu, "silu": silu, "relu": relu, "qgelu": qgelu, "srelu": srelu}
mxq.INLINE.update(FORWARD)  # callable in epilogues as mxq.gelu(x), ... (e.g. a gated mxq.silu(g) * u)
BACKWARD = {"gelu": dgelu, "silu": dsilu, "relu": drelu, "qgelu": dqgelu, "srelu": dsrelu}


@lru_cache(maxsize=None)
def act_ir(name: str) -> Epilogue:
    return parse(FORWARD[name])


@lru_cache(maxsize=None)
def dact_ir(name: str) -> Epilogue:
    return parse(BACKWARD[name])
