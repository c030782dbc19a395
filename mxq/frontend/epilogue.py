"""Epilogue functions -> validated IR: the gate between user Python and generated kernels.

The function's source is read with ``inspect`` and parsed with ``ast``; it is never executed
to build the kernel. Every construct outside the epilogue language (docs/DESIGN.md) raises
``EpilogueError`` naming the file, line and construct, at decoration time. Names that are not
parameters or locals are looked up in the function's closure and globals: numbers become
constants (and enter the fingerprint), the ``mxq`` module and its math functions are calls,
anything else is refused.

Limits (each an ``EpilogueError`` at decoration, construct in parentheses):

- at most ``mxq.frontend.ir.MAX_NODES`` (4096) distinct values and operations in the returned
  expression, equal subexpressions counted once (``"size"``). Reusing a value is free: ``y = y +
  y`` repeated k times is k + 1 nodes, and every pass over the IR is linear in that count;
- nesting depth is not limited by mxq (the source is converted without recursion), only by
  Python's own ``ast`` module, which gives up near 3 x ``sys.getrecursionlimit()`` levels on
  CPython 3.11 (about 2,900 terms of one unparenthesised sum at the default limit;
  ``"nesting"``). Python itself refuses more than 200 nested parentheses when the module is
  compiled;
- integer literals, captured integers and integer defaults must convert to a float (``"constant"``,
  ``"captured value"``, ``"parameter default"``); each is rounded to fp32 once, from its digits
  (ir.f32), so magnitudes from 2^128 - 2^103 on become +-inf, as float literals beyond fp32 do.

The fingerprint hashes the source, the captured values and a canonical serialization of the IR
(``ir.serialize``: constants by their bits), so it is deterministic across processes and tells
``0.0`` from ``-0.0`` and ``mxq.tanh`` from ``mxq.sigmoid`` bound to one name.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import linecache
import os
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass, field

from . import ir
from . import math as mxm

_ARITH_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_CMP_OPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_IDENTITY_OPS = {ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
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

# what to tell the user about a construct the language does not have (default: "<construct> is
# not allowed in an epilogue")
_REFUSALS = {
    "try statement": "try statements are not supported in an epilogue: it cannot raise or catch "
                     "exceptions (guard values with mxq.where instead)",
    "if statement": "if statements are not supported in an epilogue; choose between values with "
                    "mxq.where(condition, a, b)",
    "loop": "loops are not supported in an epilogue; write the operations out (or use ** with a small "
            "integer exponent)",
    "with statement": "with statements are not supported in an epilogue",
    "raise statement": "an epilogue cannot raise exceptions",
    "assert statement": "an epilogue cannot assert (it cannot raise exceptions)",
    "import": "imports are not allowed in an epilogue; import mxq at module level and call mxq.<function>",
    "attribute access": "attribute access is not allowed in an epilogue (except calling mxq.<function>); "
                        "bind the number to a module-level name and use that name",
}


class EpilogueError(Exception):
    """An epilogue uses something outside the epilogue language."""

    def __init__(self, message: str, file: str = "<unknown>", line: int = 0, construct: str = ""):
        self.file, self.line, self.construct = file, line, construct
        super().__init__(f"{file}:{line}: {message}")


EpilogueError.__module__ = "mxq"  # (its public name, mxq.EpilogueError, in tracebacks and pickles)


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
    # nodes of built-in activations called in the epilogue (mxq.silu(g), ...): codegen lowers them
    # as it lowers act=/dact= (fast tanh/sigmoid, FMAs; transcendental class), the rest one
    # rounding per operation
    builtin: frozenset = field(default=frozenset(), compare=False, repr=False)
    # what the caller passed for each tensor parameter, where another op's call is split into this
    # one's (a gated op's halves, mxq/frontend/gated.py): the names its messages give
    shown_params: tuple = field(default=(), compare=False, repr=False)

    @property
    def arg_names(self) -> tuple:
        """The caller's name of each tensor parameter (messages name the argument as passed)."""
        return self.shown_params or self.tensor_params

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


def _signed_literal(node: ast.AST):
    """The Python value of a literal number under unary signs (``-0``, ``-(-1.5)``, ``+2``), or
    None: a sign on a literal is folded as Python computes it, before the one rounding to fp32
    (negating the rounded value would make ``-0`` the float -0.0)."""
    signs = 1
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        signs = -signs if isinstance(node.op, ast.USub) else signs
        node = node.operand
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
        return None
    return node.value if signs == 1 else -node.value


class _Parser:
    def __init__(self, fn, file: str, first_line: int):
        self.fn, self.file, self.first_line = fn, file, first_line
        self.env: dict[str, ir.Expr] = {}
        self.builtin: frozenset = frozenset()  # nodes of inlined activations (Epilogue.builtin)
        self.captured: dict[str, float] = {}
        self._calls: dict[ast.Call, str] = {}  # call node -> the mxq function it calls (checked)
        self.globals = dict(fn.__globals__)
        self.unset: set[str] = set()  # closure variables with no value yet (assigned after decoration)
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    self.globals[name] = cell.cell_contents
                except ValueError:  # an empty cell: never the module global of the same name
                    self.globals.pop(name, None)
                    self.unset.add(name)

    def fail(self, node: ast.AST, message: str, construct: str | None = None):
        line = self.first_line + getattr(node, "lineno", 1) - 1
        raise EpilogueError(message, self.file, line, construct or _construct(node))

    def refuse(self, node: ast.AST):
        what = _construct(node)
        self.fail(node, _REFUSALS.get(what, f"{what} is not allowed in an epilogue"), what)

    # -- expressions ------------------------------------------------------------------------
    # Converted with an explicit stack, not recursion, so no nesting depth raises RecursionError:
    # ``_enter`` checks a node before its operands (as a recursive descent would) and returns
    # either its IR (a leaf) or its operands, each with what the node needs of it; ``_exit``
    # builds the node's IR from its operands' IR.
    def expr(self, node: ast.AST, need=None) -> ir.Expr:
        results: list[ir.Expr] = []
        stack: list[tuple] = [(node, need, None)]
        while stack:
            item, want, n = stack.pop()
            if n is None:
                got = self._enter(item)
                if isinstance(got, ir.Expr):
                    results.append(self._check(got, item, want))
                    continue
                stack.append((item, want, len(got)))
                for child, child_want in reversed(got):
                    stack.append((child, child_want, None))
            else:
                args = results[len(results) - n:]
                del results[len(results) - n:]
                results.append(self._check(self._exit(item, args), item, want))
        return results[0]

    def float_expr(self, node: ast.AST) -> ir.Expr:
        return self.expr(node, "float")

    def _check(self, e: ir.Expr, node: ast.AST, want) -> ir.Expr:
        if want == "float" and e.kind != "float":
            self.fail(node, "a comparison result can only be the condition of mxq.where", "comparison")
        if isinstance(want, ast.Call) and e.kind != "bool":
            self.fail(want, "the first argument of mxq.where must be a comparison", "call")
        return e

    def _enter(self, node: ast.AST):
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                what = {ast.Not: "`not`", ast.Invert: "`~`"}.get(type(node.op), type(node.op).__name__)
                self.fail(node, f"unary operator {what} is not allowed in an epilogue (only unary - and +; "
                          "conditions go in mxq.where)", "unary operator")
            return [(node.operand, "float")]
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                self.power_exponent(node)
                return [(node.left, "float")]
            if type(node.op) not in _ARITH_OPS:
                self.fail(node, f"operator {type(node.op).__name__} is not allowed in an epilogue "
                          "(use + - * / and ** with a small integer)", "operator")
            return [(node.left, "float"), (node.right, "float")]
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                self.fail(node, "chained comparisons are not allowed in an epilogue", "chained comparison")
            if type(node.ops[0]) not in _CMP_OPS:
                word = _IDENTITY_OPS.get(type(node.ops[0]), type(node.ops[0]).__name__)
                self.fail(node, f"`{word}` is not allowed in an epilogue: values are compared with "
                          "< <= > >= == !=", "comparison operator")
            return [(node.left, "float"), (node.comparators[0], "float")]
        if isinstance(node, ast.Call):
            fname = self.call_name(node)
            if fname == "where":
                return [(node.args[0], node), (node.args[1], "float"), (node.args[2], "float")]
            return [(a, "float") for a in node.args]
        self.refuse(node)

    def _exit(self, node: ast.AST, args: list[ir.Expr]) -> ir.Expr:
        if isinstance(node, ast.UnaryOp):
            a = args[0]
            literal = _signed_literal(node)
            if literal is not None:  # (signs on a literal taken as Python does, then rounded once: -0 is 0)
                return ir.Const(ir.f32(self.number(node, literal, "this constant", "constant")))
            if isinstance(node.op, ast.USub):
                return ir.Const(-a.value) if isinstance(a, ir.Const) else ir.Unary("neg", a)
            return a
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                return self.power(node, args[0])
            return ir.Binary(_ARITH_OPS[type(node.op)], args[0], args[1])
        if isinstance(node, ast.Compare):
            return ir.Compare(_CMP_OPS[type(node.ops[0])], args[0], args[1])
        fname = self.call_name(node)
        if fname == "where":
            return ir.Where(*args)
        if fname in mxm.INLINE:  # a built-in activation: its own IR, applied to the argument
            applied = ir.substitute(_inline_ir(fname), {0: args[0]})
            self.builtin |= ir.applied_nodes(applied, args)  # lowered as the built-in formulas
            return applied
        return ir.Unary(fname, args[0]) if len(args) == 1 else ir.Binary(fname, args[0], args[1])

    def number(self, node: ast.AST, value, what: str, construct: str):
        """``value`` (an int or float, not a bool) as it is (an int stays exact for ir.f32's one
        rounding), or an EpilogueError where it is an int too large for a float."""
        try:
            float(value)
            return value
        except OverflowError:
            self.fail(node, f"{what} is an integer of {value.bit_length()} bits, too large for a float "
                      "(fp32 holds magnitudes up to about 3.4e38)", construct)

    def constant(self, node: ast.Constant) -> ir.Expr:
        v = node.value
        if isinstance(v, bool):
            self.fail(node, f"`{v}` is a bool, and bools are not numbers in an epilogue: write "
                      f"{float(v)!r} for the number, or a comparison inside mxq.where for a condition",
                      "bool")
        if isinstance(v, (str, bytes)):
            self.refuse(node)
        if not isinstance(v, (int, float)):
            self.fail(node, f"the constant {v!r} is not allowed in an epilogue: constants are int or "
                      "float literals", "constant")
        return ir.Const(ir.f32(self.number(node, v, "this constant", "constant")))

    def name(self, node: ast.Name) -> ir.Expr:
        if node.id.startswith("__"):
            self.fail(node, f"dunder name {node.id!r} is not allowed in an epilogue", "dunder name")
        if node.id in self.env:
            return self.env[node.id]
        if node.id in self.fn.__code__.co_varnames:  # (a local of the function, not assigned yet: Python raises)
            self.fail(node, f"local variable {node.id!r} is read before it is assigned (Python raises "
                      "UnboundLocalError here; a module global of that name is not read)", "unassigned local")
        value = self.lookup(node)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(node, f"captured value {node.id!r} is a {type(value).__name__}; an epilogue may "
                      "capture only floats", "captured value")
        value = self.number(node, value, f"captured value {node.id!r}", "captured value")
        self.captured[node.id] = ir.scalar(value)
        return ir.Const(ir.f32(value))

    def lookup(self, node: ast.Name):
        if node.id in self.unset:
            self.fail(node, f"captured name {node.id!r} has no value yet when the epilogue is decorated (it is "
                      "assigned later in the enclosing function); captured values are read once, at decoration: "
                      "assign it before the decorator runs, or make it a float parameter", "captured value")
        if node.id in self.globals:
            return self.globals[node.id]
        if hasattr(builtins, node.id):
            return getattr(builtins, node.id)
        self.fail(node, f"name {node.id!r} is not defined", "undefined name")

    def power_exponent(self, node: ast.BinOp) -> int:
        """The exponent of ``base ** k``: a literal integer 1..MAX_POWER, optionally negative."""
        exp = node.right
        sign = 1
        if isinstance(exp, ast.UnaryOp) and isinstance(exp.op, ast.USub):
            sign, exp = -1, exp.operand
        v = exp.value if isinstance(exp, ast.Constant) else None
        ok = (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_POWER) or \
            (isinstance(v, float) and v.is_integer() and 1 <= v <= MAX_POWER)
        if not ok:
            self.fail(node, f"** needs a small integer literal exponent (1..{MAX_POWER}, optionally negative)",
                      "power")
        return sign * int(v)

    def power(self, node: ast.BinOp, base: ir.Expr) -> ir.Expr:
        k = self.power_exponent(node)
        result = base
        for _ in range(abs(k) - 1):  # left to right: x*x*x, each product rounded
            result = ir.Binary("mul", result, base)
        return ir.Binary("div", ir.Const(1.0), result) if k < 0 else result

    def call_name(self, node: ast.Call) -> str:
        """The mxq function ``node`` calls, after checking the call's form; else EpilogueError."""
        fname = self._calls.get(node)
        if fname is not None:
            return fname
        fname = self.callee(node.func)
        if fname is None:
            self.fail(node, f"{_callee_text(node.func)} is not an mxq math function: an epilogue is compiled "
                      "into the kernel, so calls other than "
                      f"mxq.{', mxq.'.join(sorted(_callables()))} are not supported", "call")
        if node.keywords:
            self.fail(node, f"mxq.{fname} takes positional arguments only", "keyword argument")
        arity = 1 if fname in mxm.INLINE else _ARITY[fname]
        if len(node.args) != arity:
            self.fail(node, f"mxq.{fname} takes {arity} argument{'s' if arity > 1 else ''}, got {len(node.args)}",
                      "call")
        self._calls[node] = fname
        return fname

    def callee(self, func: ast.AST) -> str | None:
        """The mxq function ``func`` names (``mxq.exp``, ``exp`` imported from mxq), or None. A
        name that is a local of the function but not assigned yet is refused as name() refuses it
        (Python raises UnboundLocalError; the global of that name is not what runs)."""
        base = func.value if isinstance(func, ast.Attribute) else func
        if isinstance(base, ast.Name) and base.id not in self.env and base.id in self.fn.__code__.co_varnames:
            self.name(base)  # (fails: an unassigned local)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in self.env:
                return None
            mod = self.lookup(func.value)
            # (the attribute as that module has it: mxq.frontend.math holds no activations, mxq.gelu is one)
            if _is_mxq_module(mod) and func.attr in _callables() and getattr(mod, func.attr, None) is _callables()[
                    func.attr]:
                return func.attr
            return None
        if isinstance(func, ast.Name) and func.id not in self.env:
            obj = self.globals.get(func.id)
            for name, f in _callables().items():
                if obj is f:
                    return name
        return None

    # -- statements --------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt]) -> ir.Expr:
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant) \
                and isinstance(stmts[0].value.value, str):
            stmts = stmts[1:]  # a docstring
        if not stmts:
            self.fail(self.fn_node, "an epilogue must end with `return <expression>`", "missing return")
        for k, st in enumerate(stmts):
            if isinstance(st, ast.Return):
                if k != len(stmts) - 1:
                    self.fail(st, "an epilogue has exactly one return, at the end", "early return")
                if st.value is None:
                    self.fail(st, "an epilogue must return a value: end it with `return <expression>`",
                              "missing return")
                result = self.expr(st.value)
                if result.kind != "float":
                    self.fail(st, "an epilogue must return a number, not a comparison", "comparison")
                return result
            if isinstance(st, ast.Assign):
                if len(st.targets) != 1 or not isinstance(st.targets[0], ast.Name):
                    self.fail(st, "only single-name assignments are allowed in an epilogue", "assignment")
                self.assign(st.targets[0], self.expr(st.value))
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                if st.value is None:
                    self.fail(st, "an annotation without a value is not allowed in an epilogue (to make a "
                              "parameter a float, annotate it in the signature: `def f(x, s: float)`)",
                              "annotation")
                self.assign(st.target, self.expr(st.value))
            elif isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
                # y op= e is y = y op e, ** included: the same checks and the same IR
                left = ast.copy_location(ast.Name(st.target.id, ast.Load()), st.target)
                self.assign(st.target, self.float_expr(ast.copy_location(ast.BinOp(left, st.op, st.value), st)))
            elif isinstance(st, ast.Expr):
                self.bare_expression(st)
            else:
                self.refuse(st)
        self.fail(stmts[-1], "an epilogue must end with `return <expression>`", "missing return")

    def bare_expression(self, st: ast.Expr) -> None:
        value = st.value
        if isinstance(value, ast.Call):
            fname = self.callee(value.func)
            if fname is None:
                self.fail(st, f"{_callee_text(value.func)}(...) cannot run in an epilogue: calls other than "
                          "mxq math functions are not supported, and an epilogue cannot have side effects "
                          "(no print, no logging, no in-place updates)", "call")
            self.fail(st, f"the result of mxq.{fname}(...) is unused; assign it (`y = ...`) or return it",
                      "bare expression")
        self.fail(st, f"a bare expression ({_construct(value)}) does nothing in an epilogue; assign it "
                  "(`y = ...`) or return it", "bare expression")

    def assign(self, target: ast.Name, value: ir.Expr) -> None:
        if target.id.startswith("__"):
            self.fail(target, f"dunder name {target.id!r} is not allowed in an epilogue", "dunder name")
        self.env[target.id] = value


def _callee_text(func: ast.AST) -> str:
    """How a refused callee reads in a message: ``print``, ``torch.exp``, or ``this call``."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        return ".".join([func.id, *reversed(parts)])
    return "this callee"


def _callables() -> dict:
    """What an epilogue may call, name -> function: the math table and the built-in activations
    (math.INLINE, filled by mxq/frontend/activations.py). The parser accepts exactly these, and
    its error for any other call lists them."""
    return {**mxm.FUNCTIONS, **mxm.INLINE}


def _is_mxq_module(obj) -> bool:
    return isinstance(obj, types.ModuleType) and obj.__name__ in ("mxq", "mxq.frontend.math")


def _fn_node(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise EpilogueError(f"cannot find the definition of {name!r} in its source")


def _unchanged_since_cached(module_name, file: str) -> bool:
    """Whether ``file`` is still the text its module's cached bytecode was compiled from: the
    timestamp .pyc header (source mtime and size) against the file's stat. Then the code Python
    runs is that text's (or an import hook's rewrite of it, which _compiles_to could not match)
    and no compile is needed. False where there is no such header to read."""
    module = sys.modules.get(module_name) if module_name else None
    cached, origin = getattr(module, "__cached__", None), getattr(module, "__file__", None)
    if not cached or not origin:
        return False
    try:
        if os.path.realpath(origin) != os.path.realpath(file):
            return False
        with open(cached, "rb") as f:
            head = f.read(16)
        st = os.stat(file)
    except (OSError, TypeError, ValueError):
        return False
    if len(head) < 16 or int.from_bytes(head[4:8], "little") != 0:  # (a hash-based .pyc: no timestamp)
        return False
    return (int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)


def _compiles_to(code, file: str, module_name: str | None = None) -> bool:
    """Whether the source file as inspect reads it now (linecache) compiles to ``code`` at its
    line, the function Python runs: not where the file changed since its module was imported (a
    factory decorating later would build the op from text Python never ran). The whole file is
    compiled (the compiler's choices depend on the module's other names, e.g. its imports), once
    per text; the code compared on what the text decides: bytecode, constants (by type and repr:
    0.0 and -0.0 differ), names, variables and parameters. False where the file does not compile
    as a whole: its module compiled at import, so the text changed since (a half-finished edit)."""
    if _unchanged_since_cached(module_name, file):
        return True
    text = "".join(linecache.getlines(file))
    if not text:
        return True
    entry = _COMPILED.get(file)
    if entry is None or entry[0] != text:
        try:
            with warnings.catch_warnings():  # (the file's own SyntaxWarnings were shown at its import)
                warnings.simplefilter("ignore")
                module = compile(text, code.co_filename, "exec", dont_inherit=True)
        except Exception:
            return False
        index, pending = {}, [module]
        while pending:
            for k in pending.pop().co_consts:
                if hasattr(k, "co_code"):
                    index.setdefault((k.co_name, k.co_firstlineno), _code_text(k))
                    pending.append(k)
        if len(_COMPILED) >= 64:
            _COMPILED.clear()
        entry = _COMPILED[file] = (text, index)
    return entry[1].get((code.co_name, code.co_firstlineno)) == _code_text(code)


_COMPILED: dict = {}  # source file -> (its text, {(function name, first line): _code_text}) for _compiles_to


def _code_text(code) -> tuple:
    return (code.co_code, tuple(_code_text(k) if hasattr(k, "co_code") else (type(k), repr(k)) for k in code.co_consts),
            code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_argcount,
            code.co_posonlyargcount, code.co_kwonlyargcount)


_INLINE_IR: dict = {}


def _inline_ir(name: str) -> ir.Expr:
    """The IR of the inline function ``name`` (parsed once)."""
    expr = _INLINE_IR.get(name)
    if expr is None:
        expr = _INLINE_IR[name] = parse(mxm.INLINE[name]).expr
    return expr


def parse(fn) -> Epilogue:
    """Parse and validate an epilogue function. Raises EpilogueError on anything not allowed."""
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise EpilogueError(f"an epilogue must be a Python function, got {type(fn).__name__}")
    # A function wrapped by a functools.wraps decorator: its source (which inspect finds through
    # __wrapped__), its globals, closure and defaults are the wrapped function's, not the wrapper's.
    fn = inspect.unwrap(fn)
    if inspect.ismethod(fn):
        raise EpilogueError(f"a bound method ({fn.__qualname__}) cannot be an epilogue: use a plain function "
                            "(a module-level def or a staticmethod) and pass what it needs as parameters",
                            inspect.getsourcefile(fn) or "<unknown>", fn.__code__.co_firstlineno, "bound method")
    if not hasattr(fn, "__code__"):
        raise EpilogueError(f"an epilogue must be a Python function, got a wrapper of {type(fn).__name__}")
    file = inspect.getsourcefile(fn) or "<unknown>"
    line0 = fn.__code__.co_firstlineno
    if fn.__name__ == "<lambda>":
        raise EpilogueError("a lambda cannot be an epilogue; use def", file, line0, "lambda")
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        if file.startswith("<"):  # <stdin>, <string>: typed in, not read from a file
            why = (f"it was defined in {file}, and Python keeps no source for a function typed into an "
                   "interactive session, `python -c` or stdin, while mxq compiles an epilogue from its source")
        else:
            why = str(exc)
        raise EpilogueError(f"cannot read the source of {fn.__name__!r} ({why}); define it in a .py file "
                            "(a module) and import it from there", file, line0, "source") from None
    source = textwrap.dedent("".join(lines))
    try:
        try:
            tree = ast.parse(source)
        except SyntaxError as dedented:
            if not lines[0][:1].isspace():
                raise
            # a nested def whose docstring or continuation lines are indented less than it (dedent
            # then leaves the def indented): parsed as it stands, inside a block, a line above it
            try:
                tree = ast.parse("if True:\n" + "".join(lines))
            except SyntaxError:
                raise dedented from None
            first -= 1
    except (RecursionError, MemoryError):
        raise EpilogueError(f"the source of {fn.__name__!r} is nested too deeply for Python's ast module; "
                            "split long expressions with assignments", file, first, "nesting") from None
    except SyntaxError as exc:
        raise EpilogueError(f"cannot parse the source of {fn.__name__!r} on its own ({exc.msg})",
                            file, first + (exc.lineno or 1) - 1, "source") from None
    node = _fn_node(tree, fn.__code__.co_name)  # (the def's own name: __name__ may have been set since)
    if not _compiles_to(fn.__code__, file, getattr(fn, "__module__", None)):
        raise EpilogueError(f"the source of {fn.__name__!r} in {file} is not the code Python runs (the file has "
                            "changed since its module was imported: reload the module; or an import hook or AST "
                            "transformer rewrote it)", file, first, "source")
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
        if a.arg.startswith("_mxq_"):  # (mxq/frontend/gated.py names the parameters it adds so)
            p.fail(a, f"parameter name {a.arg!r} is reserved (names starting with _mxq_ are mxq's)", "parameter name")
        is_float_annot = (isinstance(a.annotation, ast.Name) and a.annotation.id == "float") or \
            (isinstance(a.annotation, ast.Constant) and a.annotation.value == "float")  # (`s: "float"` too)
        if a.arg in defaults:
            d = defaults[a.arg]
            if isinstance(d, bool) or not isinstance(d, (int, float)):
                p.fail(a, f"parameter {a.arg!r} has a default of type {type(d).__name__}; only float "
                       "parameters may have defaults", "parameter default")
            scalars.append(a.arg)
            scalar_defaults.append(ir.scalar(p.number(a, d, f"the default of parameter {a.arg!r}", "parameter default")))
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
    n = ir.size(expr)
    if n > ir.MAX_NODES:
        p.fail(node, f"the epilogue has {n} distinct values and operations, more than the limit of "
               f"{ir.MAX_NODES} (mxq.frontend.ir.MAX_NODES)", "size")
    captured = tuple(sorted(p.captured.items()))
    # source text, captured values and the IR itself (constants by their bits, so 0.0 and -0.0
    # differ): deterministic across processes, linear in the IR's distinct nodes
    h = hashlib.sha256(b"mxq-epilogue-v2\0")
    h.update(source.encode())
    for name, value in captured:
        h.update(f"\0{name}={value.hex()}".encode())
    h.update(f"\0params={len(tensors)},{len(scalars)}\0".encode())
    h.update(ir.serialize(expr).encode())
    return Epilogue(
        name=node.name,  # (the def's own name, an identifier: __name__ may hold any string, and this one
        # reaches error messages, the CLI and an exported header's comment)
        tensor_params=tuple(tensors),
        scalar_params=tuple(scalars),
        scalar_defaults=tuple(scalar_defaults),
        param_order=tuple(a.arg for a in params),
        expr=expr,
        fingerprint=h.hexdigest()[:32],
        captured=captured,
        builtin=p.builtin & frozenset(ir.walk(expr)),
    )


def _identity(x):
    return x


IDENTITY = parse(_identity)
