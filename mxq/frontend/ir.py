"""The typed expression IR of an epilogue, and its torch evaluator.

The IR is a DAG of immutable, hash-consed nodes: constructing a node that is structurally equal
to a live one returns that same object. Equality is therefore identity and hashing is O(1) (no
walk over the subexpression), so code generation gets common-subexpression elimination for free
and an epilogue whose tree form is exponential (``y = y + y`` repeated) costs time linear in its
number of distinct nodes everywhere: construction, hashing, ``walk``, ``evaluate``,
``fingerprint`` and the lowering in codegen (which visits ``walk``'s order). Nothing here
recurses, so no depth of nesting raises ``RecursionError``.

Constants are compared by their float64 bit pattern: ``Const(0.0)`` and ``Const(-0.0)`` are
different nodes, and ``Const(nan)`` is one node equal to itself.

Every leaf is a named parameter or an fp32 constant; nothing in the IR is text a user wrote,
which is what lets the templates render it without pasting user strings.

Limits: ``MAX_NODES`` distinct nodes per epilogue; ``epilogue.parse`` raises ``EpilogueError``
beyond it (the IR itself has no limit).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
import os
import struct
import threading
import weakref

import torch

from . import math as mxm

ARITH = ("add", "sub", "mul", "div")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")

MAX_NODES = 4096
"""Most distinct IR nodes (leaves included, equal subexpressions counted once) that an epilogue
may have; decoration raises ``EpilogueError`` beyond it. A 2,000-term sum or 4,000 chained
assignments fit; each node is one fp32 operation per element in the generated kernel."""


def f32(value) -> float:
    """Round a Python float or int to the nearest fp32 (RNE), as the kernel sees a constant, in
    integers from the value's own digits: the same on any default device and under
    torch.set_flush_denormal (which a conversion through a CPU tensor or the FPU obeys, flushing
    fp32 subnormals to 0). An int beyond 2^53 is rounded from its digits too (float() would round
    it to float64 first: 2^128 - 2^103 - 1 would become inf instead of the largest fp32)."""
    if value.__class__ is float:
        if value != value or value in (math.inf, -math.inf) or value == 0.0:
            return value  # (NaN, +-inf and +-0 as they are)
        num, den = abs(value).as_integer_ratio()  # (exact: |value| = num / den, den a power of two)
    elif isinstance(value, int):
        if value == 0:
            return 0.0
        num, den = abs(value), 1
    else:
        return f32(float(value))
    k = den.bit_length() - 1  # |value| = num * 2^-k
    shift = max(num.bit_length() - 24, k - 149)  # keep 24 significant bits, none below 2^-149 (subnormals)
    if shift > 0:
        q, r = divmod(num, 1 << shift)
        half = 1 << (shift - 1)
        num, k = q + (r > half or (r == half and q & 1)), k - shift
    r = math.inf if num.bit_length() - k > 128 else math.ldexp(num, -k)  # (2^128 and up: beyond the largest fp32)
    return -r if value < 0 else r


def scalar(value) -> float:
    """A float parameter's value as the kernels and the reference take it: a Python float as it
    is (the kernel's one conversion to fp32 rounds it), an int exactly as a float where float64
    holds it, else rounded to fp32 from its digits (f32)."""
    if value.__class__ is float:
        return value
    if isinstance(value, int):
        return float(value) if -2 ** 53 <= value <= 2 ** 53 else f32(value)
    return float(value)


def float_bits(value: float) -> int:
    """The float64 bit pattern of ``value``: the identity of a constant (0.0 != -0.0, nan == nan)."""
    return struct.unpack("<Q", struct.pack("<d", value))[0]


_TABLE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
# (a forked child's copy of a lock a parent thread held stays locked, with no thread to release it:
# reinitialised in the child, as the threading module does its own)
os.register_at_fork(after_in_child=_LOCK._at_fork_reinit)
_UIDS = itertools.count()


class Expr:
    """Base class of the IR nodes. ``kind`` is "float" or "bool".

    Nodes are immutable and interned (see the module docstring); ``_fields`` names the
    constructor arguments, in order.
    """

    __slots__ = ("_uid", "__weakref__")
    kind = "float"
    _fields: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.__match_args__ = cls._fields

    @classmethod
    def _intern(cls, key: tuple, values: tuple) -> "Expr":
        with _LOCK:
            node = _TABLE.get(key)
            if node is None:
                node = object.__new__(cls)
                for name, value in zip(cls._fields, values):
                    object.__setattr__(node, name, value)
                object.__setattr__(node, "_uid", next(_UIDS))
                _TABLE[key] = node
            return node

    def __setattr__(self, name, value):
        raise AttributeError(f"IR nodes are immutable (cannot set {name!r})")

    def __delattr__(self, name):
        raise AttributeError(f"IR nodes are immutable (cannot delete {name!r})")

    # equality is identity (interning makes it structural) and hashing is object identity;
    # pickling writes the whole DAG flat (one row per distinct node), so it does not recurse
    def __reduce__(self):
        return (_rebuild, (_rows(self),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def _head(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return _render(self)


def _child(e, what: str) -> "Expr":
    if not isinstance(e, Expr):
        raise TypeError(f"{what} must be an ir.Expr, got {type(e).__name__}")
    return e


def _float_child(e, what: str) -> "Expr":
    if _child(e, what).kind != "float":
        raise TypeError(f"{what} must be a float expression, got a comparison")
    return e


class _Param(Expr):
    """A parameter of the op: its name and its position among the tensor or float parameters."""

    __slots__ = ("name", "index")
    _fields = ("name", "index")

    def __new__(cls, name: str, index: int):
        if not isinstance(name, str) or not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise TypeError(f"{cls.__name__}(name: str, index: int >= 0), got {name!r}, {index!r}")
        return cls._intern((cls, name, index), (name, index))


class TensorArg(_Param):
    """The fp32 value of the op's tensor parameter number ``index`` (named ``name``)."""

    __slots__ = ()


class ScalarArg(_Param):
    """The op's float parameter number ``index`` (named ``name``), rounded to fp32."""

    __slots__ = ()


class Const(Expr):
    """An fp32-representable constant (stored as a Python float); identified by its bits."""

    __slots__ = ("value",)
    _fields = ("value",)

    def __new__(cls, value: float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"Const needs an int or float, got {type(value).__name__}")
        value = float(value)
        if value == value and f32(value) != value:
            raise ValueError(f"Const {value!r} is not fp32-representable")
        return cls._intern((cls, float_bits(value)), (value,))


class Unary(Expr):
    __slots__ = ("op", "a")
    _fields = ("op", "a")

    def __new__(cls, op: str, a: Expr):
        if op != "neg" and op not in mxm.UNARY:
            raise ValueError(f"unknown unary operation {op!r}")
        _float_child(a, f"the operand of {op}")
        return cls._intern((cls, op, a._uid), (op, a))

    def _head(self) -> str:
        return f"Unary({self.op!r})"


class Binary(Expr):
    __slots__ = ("op", "a", "b")
    _fields = ("op", "a", "b")

    def __new__(cls, op: str, a: Expr, b: Expr):
        if op not in ARITH and op not in mxm.BINARY:
            raise ValueError(f"unknown binary operation {op!r}")
        _float_child(a, f"the first operand of {op}")
        _float_child(b, f"the second operand of {op}")
        return cls._intern((cls, op, a._uid, b._uid), (op, a, b))

    def _head(self) -> str:
        return f"Binary({self.op!r})"


class Compare(Expr):
    __slots__ = ("op", "a", "b")
    _fields = ("op", "a", "b")
    kind = "bool"

    def __new__(cls, op: str, a: Expr, b: Expr):
        if op not in COMPARE:
            raise ValueError(f"unknown comparison {op!r}")
        _float_child(a, f"the first operand of {op}")
        _float_child(b, f"the second operand of {op}")
        return cls._intern((cls, op, a._uid, b._uid), (op, a, b))

    def _head(self) -> str:
        return f"Compare({self.op!r})"


class Where(Expr):
    __slots__ = ("cond", "a", "b")
    _fields = ("cond", "a", "b")

    def __new__(cls, cond: Expr, a: Expr, b: Expr):
        if _child(cond, "the condition of where").kind != "bool":
            raise TypeError("the condition of where must be a comparison")
        _float_child(a, "the second argument of where")
        _float_child(b, "the third argument of where")
        return cls._intern((cls, cond._uid, a._uid, b._uid), (cond, a, b))


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary):
        return (e.a,)
    if isinstance(e, (Binary, Compare)):
        return (e.a, e.b)
    if isinstance(e, Where):
        return (e.cond, e.a, e.b)
    return ()


def walk(expr: Expr) -> list[Expr]:
    """Every distinct node of ``expr`` once, children before parents (a topological order).

    Depth-first, children left to right (the order a recursive post-order visit gives), with an
    explicit stack: linear in the number of distinct nodes and edges, no recursion limit.
    """
    order: list[Expr] = []
    opened: set[Expr] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        node, close = stack.pop()
        if close:
            order.append(node)
            continue
        if node in opened:  # finished already (or, impossible in a DAG, in progress)
            continue
        opened.add(node)
        stack.append((node, True))
        for child in reversed(children(node)):
            if child not in opened:
                stack.append((child, False))
    return order


def applied_nodes(expr: Expr, args) -> frozenset:
    """The nodes of ``expr`` (a function's body applied to ``args``) that are not nodes of an
    argument: the function's own operations (codegen lowers an activation's as built-in)."""
    own = set(walk(expr))
    for a in args:
        own -= set(walk(a))
    return frozenset(own)


def substitute(expr: Expr, tensors: dict[int, Expr]) -> Expr:
    """``expr`` with tensor parameter k replaced by ``tensors[k]`` (an inlined function's body
    applied to its arguments): one rebuild per distinct node, in ``walk`` order."""
    new: dict[Expr, Expr] = {}
    for node in walk(expr):
        if isinstance(node, TensorArg):
            new[node] = tensors[node.index]
        elif isinstance(node, Unary):
            new[node] = Unary(node.op, new[node.a])
        elif isinstance(node, Binary):
            new[node] = Binary(node.op, new[node.a], new[node.b])
        elif isinstance(node, Compare):
            new[node] = Compare(node.op, new[node.a], new[node.b])
        elif isinstance(node, Where):
            new[node] = Where(new[node.cond], new[node.a], new[node.b])
        else:  # constants and float parameters stay
            new[node] = node
    return new[expr]


def size(expr: Expr) -> int:
    """The number of distinct nodes of ``expr`` (what ``MAX_NODES`` limits)."""
    return len(walk(expr))


def _rows(expr: Expr) -> list[tuple]:
    """``expr`` as rows (class name, fields...) in ``walk`` order, children as row numbers."""
    index: dict[Expr, int] = {}
    rows = []
    for k, node in enumerate(walk(expr)):
        index[node] = k
        rows.append((type(node).__name__, *(index[v] if isinstance(v, Expr) else v
                                             for v in (getattr(node, f) for f in node._fields))))
    return rows


def _rebuild(rows: list[tuple]) -> Expr:
    """The inverse of ``_rows`` (the interned nodes, so unpickling gives the same objects)."""
    built: list[Expr] = []
    for name, *values in rows:
        cls = _CLASSES[name]
        built.append(cls(*(built[v] if f in _CHILD_FIELDS else v for f, v in zip(cls._fields, values))))
    return built[-1]


def _render(expr: Expr, limit: int = 240) -> str:
    """A readable, bounded text of ``expr``: subexpressions longer than ``limit`` characters are
    shortened to their head (``Binary('add')(...)``), so this stays linear in the node count."""
    text: dict[Expr, str] = {}
    for node in walk(expr):
        if isinstance(node, (TensorArg, ScalarArg)):
            s = f"{type(node).__name__}({node.name!r}, {node.index})"
        elif isinstance(node, Const):
            s = f"Const({node.value!r})"
        else:
            parts = []
            for c in children(node):
                t = text[c]
                parts.append(t if len(t) <= limit else f"{c._head()}(...)")
            args = ", ".join(parts)
            if isinstance(node, (Unary, Binary, Compare)):
                s = f"{type(node).__name__}({node.op!r}, {args})"
            else:
                s = f"{type(node).__name__}({args})"
        text[node] = s
    return text[expr]


def serialize(expr: Expr) -> str:
    """A canonical text of the DAG, one line per distinct node in ``walk`` order (children by
    line number, constants by their float64 bits): deterministic across processes, linear."""
    index: dict[Expr, int] = {}
    lines = []
    for k, node in enumerate(walk(expr)):
        index[node] = k
        if isinstance(node, (TensorArg, ScalarArg)):
            lines.append(f"{type(node).__name__} {node.index}")
        elif isinstance(node, Const):
            lines.append(f"Const {float_bits(node.value):016x}")
        else:
            head = type(node).__name__ + ("" if isinstance(node, Where) else f" {node.op}")
            lines.append(head + "".join(f" {index[c]}" for c in children(node)))
    return "\n".join(lines)


def digest(expr: Expr) -> str:
    """sha256 of ``serialize(expr)``."""
    return hashlib.sha256(serialize(expr).encode()).hexdigest()


_CLASSES = {c.__name__: c for c in (TensorArg, ScalarArg, Const, Unary, Binary, Compare, Where)}
_CHILD_FIELDS = frozenset({"a", "b", "cond"})

_TORCH_ARITH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
_TORCH_CMP = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}


def evaluate(expr: Expr, tensors: list[torch.Tensor], scalars: list[float]) -> torch.Tensor:
    """Evaluate ``expr`` on fp32 tensors, rounding after every operation (no FMA contraction).

    Scalars and constants enter as fp32 0-d tensors so torch never computes in float64. Each
    distinct node is computed once, in ``walk`` order, and its value is dropped as soon as its
    last user has read it (memory: the live intermediates, not every node).
    """
    device = tensors[0].device if tensors else torch.device("cpu")

    def c(v: float) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.float32, device=device)

    order = walk(expr)
    uses = collections.Counter(ch for node in order for ch in children(node))
    values: dict[Expr, torch.Tensor] = {}
    for e in order:
        args = [values[ch] for ch in children(e)]
        if isinstance(e, TensorArg):
            r = tensors[e.index]
        elif isinstance(e, ScalarArg):
            r = c(f32(scalars[e.index]))
        elif isinstance(e, Const):
            r = c(e.value)
        elif isinstance(e, Unary):
            r = torch.neg(args[0]) if e.op == "neg" else mxm.UNARY[e.op](args[0])
        elif isinstance(e, Binary):
            fn = _TORCH_ARITH.get(e.op) or mxm.BINARY[e.op]
            r = fn(*args)
        elif isinstance(e, Compare):
            r = _TORCH_CMP[e.op](*args)
        elif isinstance(e, Where):
            r = torch.where(*args)
        else:  # pragma: no cover - only the node classes above exist
            raise TypeError(f"unknown IR node {e!r}")
        values[e] = r
        for ch in children(e):
            uses[ch] -= 1
            if uses[ch] == 0:
                del values[ch]
    return values[expr]


def is_exact(expr: Expr) -> bool:
    """True when the NUMERICS "exact class" applies: no division and no transcendental."""
    for e in walk(expr):
        if isinstance(e, Unary) and e.op in mxm.INEXACT:
            return False
        if isinstance(e, Binary) and e.op == "div":
            return False
    return True
