"""Epilogue functions -> validated IR: the gate between user Python and generated kernels.

The function's source is read with ``inspect`` and parsed with ``ast``; it is never executed
to build the kernel. Every construct outside the epilogue language (DESIGN.md) raises
``EpilogueError`` naming the file, line and construct, at decoration time. Names that are not
parameters or locals are looked up in the function's closure and globals: numbers become
constants (and enter the fingerprint), the ``mxq`` module and its math functions are calls,
anything else is refused.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import textwrap
import types
from dataclasses import dataclass, field

from . import ir
from . import math as mxm

_ARITH_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_CMP_OPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_ARITY = {**{k: 1 for k in mxm.UNARY}, **{k: 2 for k in mxm.BINARY}, **{k: 3 for k in mxm.TERNARY}}
MAX_POWER = 8
_CONSTRUCT_NAMES = {
    ast.Import: "import", ast.ImportFrom: "import", ast.For: "loop", ast.AsyncFor: "loop",
    ast.While: "loop", ast.Lambda: "lambda", ast.If: "if statement", ast.IfExp: "conditional expression "
    "(use mxq.where)", ast.ListComp: "comprehension", ast.GeneratorExp: "comprehension",
    ast.DictComp: "comprehension", ast.SetComp: "comprehension", ast.Attribute: "attribute access",
    ast.Subscript: "subscript", ast.BoolOp: "boolean operator (and/or)", ast.With: "with statement",
    ast.Try: "try statement", ast.Global: "global statement", ast.Nonlocal: "nonlocal statement",
    ast.FunctionDef: "nested function", ast.ClassDef: "class definition", ast.Delete: "del statement",
    ast.Raise: "raise statement", ast.Assert: "assert statement", ast.Pass: "pass statement",
    ast.JoinedStr: "string", ast.NamedExpr: "walrus assignment", ast.Starred: "starred expression",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.List: "list", ast.Tuple: "tuple",
    ast.Dict: "dict", ast.Set: "set",
}


class EpilogueError(Exception):
    """An epilogue uses something outside the epilogue language."""

    def __init__(self, message: str, file: str = "<unknown>", line: int = 0, construct: str = ""):
        self.file, self.line, self.construct = file, line, construct
        super().__init__(f"{file}:{line}: {message}")


@dataclass(frozen=True)
class Epilogue:
    """A parsed epilogue: its parameters, its IR and the fingerprint that identifies it."""

    name: str
    tensor_params: tuple[str, ...]
    scalar_params: tuple[str, ...]
    scalar_defaults: tuple  # float or None per scalar parameter
    param_order: tuple[str, ...]  # the signature's order, for binding calls
    expr: ir.Expr
    fingerprint: str
    captured: tuple = field(default=())  # (name, float) pairs read from closure/globals

    @property
    def is_identity(self) -> bool:
        return isinstance(self.expr, ir.TensorArg) and len(self.tensor_params) == 1

    @property
    def exact(self) -> bool:
        return ir.is_exact(self.expr)


def _construct(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return "string"
    return _CONSTRUCT_NAMES.get(type(node), type(node).__name__)


class _Parser:
    def __init__(self, fn, file: str, first_line: int):
        self.fn, self.file, self.first_line = fn, file, first_line
        self.env: dict[str, ir.Expr] = {}
        self.captured: dict[str, float] = {}
        self.globals = dict(fn.__globals__)
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    self.globals[name] = cell.cell_contents
                except ValueError:  # empty cell
                    pass

    def fail(self, node: ast.AST, message: str, construct: str | None = None):
        line = self.first_line + getattr(node, "lineno", 1) - 1
        raise EpilogueError(message, self.file, line, construct or _construct(node))

    def refuse(self, node: ast.AST, where: str = ""):
        what = _construct(node)
        self.fail(node, f"{what} is not allowed in an epilogue{where}", what)

    # -- expressions ------------------------------------------------------------------------
    def expr(self, node: ast.AST) -> ir.Expr:
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.UnaryOp):
            a = self.float_expr(node.operand)
            if isinstance(node.op, ast.USub):
                return ir.Const(-a.value) if isinstance(a, ir.Const) else ir.Unary("neg", a)
            if isinstance(node.op, ast.UAdd):
                return a
            self.fail(node, f"unary operator {type(node.op).__name__} is not allowed in an epilogue",
                      "unary operator")
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                return self.power(node)
            op = _ARITH_OPS.get(type(node.op))
            if op is None:
                self.fail(node, f"operator {type(node.op).__name__} is not allowed in an epilogue "
                          "(use + - * / and ** with a small integer)", "operator")
            return ir.Binary(op, self.float_expr(node.left), self.float_expr(node.right))
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                self.fail(node, "chained comparisons are not allowed in an epilogue", "chained comparison")
            return ir.Compare(_CMP_OPS[type(node.ops[0])], self.float_expr(node.left),
                              self.float_expr(node.comparators[0]))
        if isinstance(node, ast.Call):
            return self.call(node)
        self.refuse(node)

    def float_expr(self, node: ast.AST) -> ir.Expr:
        e = self.expr(node)
        if e.kind != "float":
            self.fail(node, "a comparison result can only be the condition of mxq.where", "comparison")
        return e

    def constant(self, node: ast.Constant) -> ir.Expr:
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.refuse(node)
        return ir.Const(ir.f32(float(v)))

    def name(self, node: ast.Name) -> ir.Expr:
        if node.id.startswith("__"):
            self.fail(node, f"dunder name {node.id!r} is not allowed in an epilogue", "dunder name")
        if node.id in self.env:
            return self.env[node.id]
        value = self.lookup(node)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(node, f"captured value {node.id!r} is a {type(value).__name__}; an epilogue may "
                      "capture only floats", "captured value")
        self.captured[node.id] = float(value)
        return ir.Const(ir.f32(float(value)))

    def lookup(self, node: ast.Name):
        if node.id in self.globals:
            return self.globals[node.id]
        if hasattr(builtins, node.id):
            return getattr(builtins, node.id)
        self.fail(node, f"name {node.id!r} is not defined", "undefined name")

    def power(self, node: ast.BinOp) -> ir.Expr:
        exp = node.right
        sign = 1
        if isinstance(exp, ast.UnaryOp) and isinstance(exp.op, ast.USub):
            sign, exp = -1, exp.operand
        ok = isinstance(exp, ast.Constant) and not isinstance(exp.value, bool) and \
            isinstance(exp.value, (int, float)) and float(exp.value).is_integer() and \
            1 <= abs(exp.value) <= MAX_POWER
        if not ok:
            self.fail(node, f"** needs a small integer literal exponent (1..{MAX_POWER}, optionally negative)",
                      "power")
        base = self.float_expr(node.left)
        result = base
        for _ in range(int(exp.value) - 1):  # left to right: x*x*x, each product rounded
            result = ir.Binary("mul", result, base)
        return ir.Binary("div", ir.Const(1.0), result) if sign < 0 else result

    def call(self, node: ast.Call) -> ir.Expr:
        fname = self.callee(node.func)
        if fname is None:
            self.fail(node, "only mxq math functions may be called in an epilogue "
                      f"(mxq.{', mxq.'.join(sorted(mxm.FUNCTIONS))})", "call")
        if node.keywords:
            self.fail(node, f"mxq.{fname} takes positional arguments only", "keyword argument")
        if len(node.args) != _ARITY[fname]:
            self.fail(node, f"mxq.{fname} takes {_ARITY[fname]} arguments, got {len(node.args)}", "call")
        if fname == "where":
            cond = self.expr(node.args[0])
            if cond.kind != "bool":
                self.fail(node, "the first argument of mxq.where must be a comparison", "call")
            return ir.Where(cond, self.float_expr(node.args[1]), self.float_expr(node.args[2]))
        args = [self.float_expr(a) for a in node.args]
        return ir.Unary(fname, args[0]) if len(args) == 1 else ir.Binary(fname, args[0], args[1])

    def callee(self, func: ast.AST) -> str | None:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in self.env:
                return None
            mod = self.lookup(func.value)
            if _is_mxq_module(mod) and func.attr in mxm.FUNCTIONS:
                return func.attr
            return None
        if isinstance(func, ast.Name) and func.id not in self.env:
            obj = self.globals.get(func.id)
            for name, f in mxm.FUNCTIONS.items():
                if obj is f:
                    return name
        return None

    # -- statements --------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt]) -> ir.Expr:
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant) \
                and isinstance(stmts[0].value.value, str):
            stmts = stmts[1:]  # a docstring
        if not stmts or not isinstance(stmts[-1], ast.Return) or stmts[-1].value is None:
            self.fail(stmts[-1] if stmts else self.fn_node, "an epilogue must end with `return <expression>`",
                      "missing return")
        for st in stmts[:-1]:
            if isinstance(st, ast.Assign):
                if len(st.targets) != 1 or not isinstance(st.targets[0], ast.Name):
                    self.fail(st, "only single-name assignments are allowed in an epilogue", "assignment")
                self.assign(st.targets[0], self.expr(st.value))
            elif isinstance(st, ast.AnnAssign) and st.value is not None and isinstance(st.target, ast.Name):
                self.assign(st.target, self.expr(st.value))
            elif isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
                op = _ARITH_OPS.get(type(st.op))
                if op is None:
                    self.fail(st, f"augmented operator {type(st.op).__name__} is not allowed", "operator")
                left = self.float_expr(ast.Name(st.target.id, ast.Load(), lineno=st.lineno))
                self.assign(st.target, ir.Binary(op, left, self.float_expr(st.value)))
            elif isinstance(st, ast.Return):
                self.fail(st, "an epilogue has exactly one return, at the end", "early return")
            elif isinstance(st, ast.Expr):
                self.fail(st, f"a bare expression ({_construct(st.value)}) does nothing in an epilogue",
                          _construct(st.value))
            else:
                self.refuse(st)
        result = self.expr(stmts[-1].value)
        if result.kind != "float":
            self.fail(stmts[-1], "an epilogue must return a number, not a comparison", "comparison")
        return result

    def assign(self, target: ast.Name, value: ir.Expr) -> None:
        if target.id.startswith("__"):
            self.fail(target, f"dunder name {target.id!r} is not allowed in an epilogue", "dunder name")
        self.env[target.id] = value


def _is_mxq_module(obj) -> bool:
    return isinstance(obj, types.ModuleType) and obj.__name__ in ("mxq", "mxq.math")


def _fn_node(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise EpilogueError(f"cannot find the definition of {name!r} in its source")


def parse(fn) -> Epilogue:
    """Parse and validate an epilogue function. Raises EpilogueError on anything not allowed."""
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise EpilogueError(f"an epilogue must be a Python function, got {type(fn).__name__}")
    file = inspect.getsourcefile(fn) or "<unknown>"
    line0 = fn.__code__.co_firstlineno
    if fn.__name__ == "<lambda>":
        raise EpilogueError("a lambda cannot be an epilogue; use def", file, line0, "lambda")
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise EpilogueError(f"cannot read the source of {fn.__name__!r} ({exc}); define it in a file",
                            file, line0, "source") from None
    source = textwrap.dedent("".join(lines))
    node = _fn_node(ast.parse(source), fn.__name__)
    p = _Parser(fn, file, first)
    p.fn_node = node
    if isinstance(node, ast.AsyncFunctionDef):
        p.fail(node, "an epilogue cannot be async", "async function")
    args = node.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        p.fail(node, "an epilogue takes plain positional parameters only (no *args, **kwargs or "
               "keyword-only parameters)", "parameters")
    params = list(args.posonlyargs) + list(args.args)
    defaults = dict(zip([a.arg for a in params[len(params) - len(fn.__defaults__ or ()):]],
                        fn.__defaults__ or ()))
    tensors, scalars, scalar_defaults = [], [], []
    for a in params:
        if a.arg.startswith("__"):
            p.fail(a, f"dunder name {a.arg!r} is not allowed in an epilogue", "dunder name")
        is_float_annot = isinstance(a.annotation, ast.Name) and a.annotation.id == "float"
        if a.arg in defaults:
            d = defaults[a.arg]
            if isinstance(d, bool) or not isinstance(d, (int, float)):
                p.fail(a, f"parameter {a.arg!r} has a default of type {type(d).__name__}; only float "
                       "parameters may have defaults", "parameter default")
            scalars.append(a.arg)
            scalar_defaults.append(float(d))
            p.env[a.arg] = ir.ScalarArg(a.arg, len(scalars) - 1)
        elif is_float_annot:
            scalars.append(a.arg)
            scalar_defaults.append(None)
            p.env[a.arg] = ir.ScalarArg(a.arg, len(scalars) - 1)
        else:
            tensors.append(a.arg)
            p.env[a.arg] = ir.TensorArg(a.arg, len(tensors) - 1)
    if not tensors:
        p.fail(node, "an epilogue needs at least one tensor parameter", "parameters")
    expr = p.body(node.body)
    captured = tuple(sorted(p.captured.items()))
    h = hashlib.sha256(b"mxq-epilogue-v1\0")
    h.update(source.encode())
    for name, value in captured:
        h.update(f"\0{name}={value.hex()}".encode())
    return Epilogue(
        name=fn.__name__,
        tensor_params=tuple(tensors),
        scalar_params=tuple(scalars),
        scalar_defaults=tuple(scalar_defaults),
        param_order=tuple(a.arg for a in params),
        expr=expr,
        fingerprint=h.hexdigest()[:32],
        captured=captured,
    )


def _identity(x):
    return x


IDENTITY = parse(_identity)
