"""Seeded fuzzing of the epilogue language against eager torch (issue 21).

Random epilogue functions of ``x``, ``r`` and a float ``s`` are written as Python source into a
temporary module, imported, decorated with ``mxq.fused_quant`` and run through ``op.reference``
on CPU tensors (nothing is compiled). The expected result is computed independently: the same
random formula evaluated here with eager torch in fp32, one rounding per operation (``**`` as
repeated products, left to right; ``maximum``/``minimum`` NaN-dropping as mxq/frontend/math.py documents),
then NUMERICS.md steps 5-9 by ``tests/oracle.py``. Every data byte, scale byte and the amax must
be equal. Constants include -0.0, 0.0, inf, nan, subnormals and fp32's extremes.

The seed is fixed (``MXQ_FUZZ_SEED`` overrides it, ``MXQ_FUZZ_CASES`` the count); the number of
cases is printed.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import sys

import torch

import mxq

from . import oracle

SEED = int(os.environ.get("MXQ_FUZZ_SEED", "20261130"))
CASES = int(os.environ.get("MXQ_FUZZ_CASES", "1000"))

F32 = torch.float32
NAN = float("nan")
# (source text, Python value): what the kernel must see as an fp32 constant
CONSTANTS = [
    ("0.0", 0.0), ("-0.0", -0.0), ("1.0", 1.0), ("2", 2.0), ("0.5", 0.5), ("-2.5", -2.5),
    ("0.1", 0.1), ("3.0", 3.0), ("1e999", math.inf), ("-1e999", -math.inf), ("NAN", NAN),
    ("1e-45", 1e-45), ("-1e-40", -1e-40), ("1.1754942e-38", 1.1754942e-38), ("3.4028235e38", 3.4028235e38),
    ("1e39", 1e39), ("65504", 65504.0), ("448.0", 448.0), ("1e-3", 1e-3), ("7", 7.0),
]
UNARY = ["abs", "exp", "exp2", "log", "log2", "tanh", "sigmoid", "erf", "sqrt", "rsqrt"]
BINARY = ["maximum", "minimum"]
ARITH = {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div}
COMPARE = {"<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq, "!=": torch.ne}
SPECIALS = [0.0, -0.0, math.inf, -math.inf, NAN, 1e-40, -1e-45, 3.4028234663852886e38, -1.1754942e-38, 1.0, -448.0]


class Gen:
    """Random formulas as small trees: ("x",), ("c", text, value), ("neg", a), ("arith", op, a, b),
    ("fn", name, a), ("fn2", name, a, b), ("where", cmp, p, q, a, b), ("pow", a, k), ("var", name)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def leaf(self, names):
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            return ("c", *rng.choice(CONSTANTS))
        return ("var", rng.choice(names))

    def expr(self, depth, names):
        rng = self.rng
        if depth <= 0 or rng.random() < 0.2:
            return self.leaf(names)
        kind = rng.choices(["arith", "neg", "fn", "fn2", "where", "pow"], [8, 2, 3, 2, 2, 1])[0]
        sub = lambda: self.expr(depth - 1, names)  # noqa: E731
        if kind == "arith":
            return ("arith", rng.choice(list(ARITH)), sub(), sub())
        if kind == "neg":
            return ("neg", sub())
        if kind == "fn":
            return ("fn", rng.choice(UNARY), sub())
        if kind == "fn2":
            return ("fn2", rng.choice(BINARY), sub(), sub())
        if kind == "where":
            return ("where", rng.choice(list(COMPARE)), sub(), sub(), sub(), sub())
        return ("pow", sub(), rng.choice([1, 2, 3, 4, -1, -2]))


def source(t) -> str:
    kind = t[0]
    if kind == "c":
        return f"({t[1]})" if t[1].startswith("-") else t[1]  # -2.5 ** 2 is -(2.5 ** 2)
    if kind == "var":
        return t[1]
    if kind == "neg":
        return f"(-{source(t[1])})"
    if kind == "arith":
        return f"({source(t[2])} {t[1]} {source(t[3])})"
    if kind == "fn":
        return f"mxq.{t[1]}({source(t[2])})"
    if kind == "fn2":
        return f"mxq.{t[1]}({source(t[2])}, {source(t[3])})"
    if kind == "where":
        return f"mxq.where({source(t[2])} {t[1]} {source(t[3])}, {source(t[4])}, {source(t[5])})"
    if kind == "pow":
        return f"({source(t[1])} ** {t[2]})"
    raise AssertionError(t)


def _max(a, b):  # NaN-dropping: a if a > b or b is NaN, else b
    return torch.where((a > b) | torch.isnan(b), a, b)


def _min(a, b):
    return torch.where((a < b) | torch.isnan(b), a, b)


def _runs(fn):
    """``fn`` as docs/NUMERICS.md defines the epilogue's transcendental functions on the CPU:
    torch's fp32 function on a contiguous copy zero-padded to whole runs of 64 elements (its
    vectorised code for every element: the few elements here would take its scalar code)."""
    def f(a):
        flat = a.reshape(-1)
        return fn(torch.cat([flat, flat.new_zeros(-flat.numel() % 64)]))[:flat.numel()].view(a.shape)

    return f


_TORCH_UNARY = {"abs": torch.abs, "exp": _runs(torch.exp), "exp2": _runs(torch.exp2), "log": _runs(torch.log),
                "log2": _runs(torch.log2), "tanh": _runs(torch.tanh), "sigmoid": _runs(torch.sigmoid),
                "erf": _runs(torch.erf), "sqrt": torch.sqrt, "rsqrt": torch.rsqrt}


def value(t, env):
    """Eager fp32 torch, one rounding per operation."""
    kind = t[0]
    if kind == "c":
        return torch.tensor(t[2], dtype=F32)
    if kind == "var":
        return env[t[1]]
    if kind == "neg":
        return torch.neg(value(t[1], env))
    if kind == "arith":
        return ARITH[t[1]](value(t[2], env), value(t[3], env))
    if kind == "fn":
        return _TORCH_UNARY[t[1]](value(t[2], env))
    if kind == "fn2":
        return (_max if t[1] == "maximum" else _min)(value(t[2], env), value(t[3], env))
    if kind == "where":
        return torch.where(COMPARE[t[1]](value(t[2], env), value(t[3], env)), value(t[4], env), value(t[5], env))
    if kind == "pow":
        base = value(t[1], env)
        out = base
        for _ in range(abs(t[2]) - 1):
            out = out * base
        return torch.tensor(1.0, dtype=F32) / out if t[2] < 0 else out
    raise AssertionError(t)


def make_case(rng: random.Random, k: int):
    """(function source, statements as (name, op, tree), return tree)."""
    gen = Gen(rng)
    names = ["x", "r", "s"]
    stmts = []
    lines = [f"def f{k}(x, r, s: float):"]
    for i in range(rng.randint(0, 3)):
        name = f"t{i}"
        tree = gen.expr(rng.randint(1, 4), names)
        op = "=" if name not in names or rng.random() < 0.5 else rng.choice(["+=", "-=", "*=", "/="])
        lines.append(f"    {name} {op} {source(tree)}")
        stmts.append((name, op, tree))
        names.append(name)
        if rng.random() < 0.3:  # reassign an existing name: the DAG shares the old value
            op = rng.choice(["+=", "-=", "*=", "/="])
            tree = gen.expr(2, names)
            lines.append(f"    {name} {op} {source(tree)}")
            stmts.append((name, op, tree))
    ret = gen.expr(rng.randint(1, 5), names)
    lines.append(f"    return {source(ret)}")
    return "\n".join(lines) + "\n", stmts, ret


def inputs(rng: random.Random, gen: torch.Generator, shape, dtype):
    t = torch.randn(shape, generator=gen) * (2.0 ** rng.randint(-20, 20))
    flat = t.view(-1)
    for _ in range(rng.randint(0, max(1, flat.numel() // 8))):
        flat[rng.randrange(flat.numel())] = rng.choice(SPECIALS)
    return t.to(dtype)


def expected_value(stmts, ret, x, r, s):
    env = {"x": x.to(F32), "r": r.to(F32), "s": torch.tensor(s, dtype=F32)}
    for name, op, tree in stmts:
        v = value(tree, env)
        env[name] = v if op == "=" else ARITH[op[0]](env[name], v)
    v = value(ret, env).expand(x.shape).to(F32)
    if x.dtype != F32:  # NUMERICS step 5: the input dtype round trip (an epilogue ran)
        v = v.to(x.dtype).to(F32)
    return v


def _bytes(data, m, n):
    return data.view(torch.uint8).reshape(m, n).tolist()


def test_random_epilogues_match_eager_torch(tmp_path, capsys):
    rng = random.Random(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cases = [make_case(rng, k) for k in range(CASES)]
    path = tmp_path / "mxq_fuzz_epilogues.py"
    path.write_text("import mxq\n\nNAN = float('nan')\n\n\n" + "\n\n".join(c[0] for c in cases))
    spec = importlib.util.spec_from_file_location("mxq_fuzz_epilogues", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    checked = 0
    for k, (src, stmts, ret) in enumerate(cases):
        fmt = rng.choice(["e4m3", "e5m2"])
        mode = rng.choice(["rceil", "floor", "ceil", "even"])
        colwise = rng.random() < 0.3
        op = mxq.fused_quant(fp8=fmt, scale_mode=mode, colwise=colwise, amax=True)(getattr(mod, f"f{k}"))
        m, n = rng.choice([(1, 1), (2, 33), (4, 64), (3, 40), (1, 96)])
        dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])
        x, r = inputs(rng, gen, (m, n), dtype), inputs(rng, gen, (m, n), dtype)
        s = rng.choice([0.1, -0.0, 0.0, 2.5, 1e-40, math.inf, NAN, -3.0])
        got = op.reference(x, r, s)
        v = expected_value(stmts, ret, x, r, s)
        where = f"case {k} (seed {SEED}, {fmt}/{mode}, {tuple(x.shape)} {dtype}, s={s}):\n{src}"
        data, scales = oracle.quantize_rows(v.tolist(), fmt, mode)
        assert _bytes(got.rowwise_data, m, n) == data, where
        assert got.rowwise_scale.tolist() == scales, where
        if colwise:
            data_t, scales_t = oracle.quantize_rows(v.t().tolist(), fmt, mode)
            assert _bytes(got.colwise_data, m, n) == [list(c) for c in zip(*data_t)], where
            assert got.colwise_scale.tolist() == [list(c) for c in zip(*scales_t)], where
        amax = NAN if torch.isnan(v).any() else v.abs().max().item()
        assert (math.isnan(amax) and math.isnan(got.amax.item())) or amax == got.amax.item(), where
        checked += 1
    with capsys.disabled():
        print(f"\n[fuzz] {checked} random epilogues matched eager torch byte for byte (seed {SEED})")
    assert checked == CASES
