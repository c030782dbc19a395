"""The typed expression IR of an epilogue, and its torch evaluator.

Nodes are frozen dataclasses: structurally equal subexpressions are equal and hash alike, so
code generation gets common-subexpression elimination for free and the IR itself can be a
cache key. Every leaf is a named parameter or an fp32 constant; nothing in the IR is text a
user wrote, which is what lets the templates render it without pasting user strings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import math as mxm

ARITH = ("add", "sub", "mul", "div")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


def f32(value: float) -> float:
    """Round a Python float to the nearest fp32 (RNE), as the kernel sees a constant."""
    return torch.tensor(float(value), dtype=torch.float32).item()


class Expr:
    """Base class. ``kind`` is "float" or "bool"."""

    kind = "float"


@dataclass(frozen=True)
class TensorArg(Expr):
    name: str
    index: int  # position among the op's tensor parameters


@dataclass(frozen=True)
class ScalarArg(Expr):
    name: str
    index: int  # position among the op's float parameters


@dataclass(frozen=True)
class Const(Expr):
    value: float  # already fp32-representable

    def __post_init__(self):
        if self.value == self.value and f32(self.value) != self.value:
            raise ValueError(f"Const {self.value!r} is not fp32-representable")


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "neg" or a key of mxq.math.UNARY
    a: Expr


@dataclass(frozen=True)
class Binary(Expr):
    op: str  # ARITH or a key of mxq.math.BINARY
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Compare(Expr):
    op: str  # COMPARE
    a: Expr
    b: Expr
    kind = "bool"


@dataclass(frozen=True)
class Where(Expr):
    cond: Expr
    a: Expr
    b: Expr


_TORCH_ARITH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
_TORCH_CMP = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}


def evaluate(expr: Expr, tensors: list[torch.Tensor], scalars: list[float]) -> torch.Tensor:
    """Evaluate ``expr`` on fp32 tensors, rounding after every operation (no FMA contraction).

    Scalars and constants enter as fp32 0-d tensors so torch never computes in float64.
    """
    memo: dict[Expr, torch.Tensor] = {}
    device = tensors[0].device if tensors else torch.device("cpu")

    def c(v: float) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.float32, device=device)

    def ev(e: Expr) -> torch.Tensor:
        if e in memo:
            return memo[e]
        if isinstance(e, TensorArg):
            r = tensors[e.index]
        elif isinstance(e, ScalarArg):
            r = c(f32(scalars[e.index]))
        elif isinstance(e, Const):
            r = c(e.value)
        elif isinstance(e, Unary):
            r = torch.neg(ev(e.a)) if e.op == "neg" else mxm.UNARY[e.op](ev(e.a))
        elif isinstance(e, Binary):
            fn = _TORCH_ARITH.get(e.op) or mxm.BINARY[e.op]
            r = fn(ev(e.a), ev(e.b))
        elif isinstance(e, Compare):
            r = _TORCH_CMP[e.op](ev(e.a), ev(e.b))
        elif isinstance(e, Where):
            r = torch.where(ev(e.cond), ev(e.a), ev(e.b))
        else:  # pragma: no cover - the parser builds only the nodes above
            raise TypeError(f"unknown IR node {e!r}")
        memo[e] = r
        return r

    return ev(expr)


def walk(expr: Expr):
    """Every node of ``expr`` once, children before parents (a topological order)."""
    seen: set[Expr] = set()
    order: list[Expr] = []

    def visit(e: Expr) -> None:
        if e in seen:
            return
        for child in children(e):
            visit(child)
        seen.add(e)
        order.append(e)

    visit(expr)
    return order


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary):
        return (e.a,)
    if isinstance(e, (Binary, Compare)):
        return (e.a, e.b)
    if isinstance(e, Where):
        return (e.cond, e.a, e.b)
    return ()


def is_exact(expr: Expr) -> bool:
    """True when the NUMERICS "exact class" applies: no division and no transcendental."""
    for e in walk(expr):
        if isinstance(e, Unary) and e.op in mxm.INEXACT:
            return False
        if isinstance(e, Binary) and e.op == "div":
            return False
    return True
