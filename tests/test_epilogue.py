"""The epilogue parser: what the language accepts, what it refuses (with file and line), and
the fingerprint that identifies an op."""

import importlib.util
import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mxq
import mxq.frontend.math as mxq_math
from mxq.frontend import ir
from mxq.frontend.epilogue import EpilogueError, parse

from . import oracle
from .conftest import deadline

CAPTURED_LIST = [1.0]
CAPTURED_TENSOR = torch.ones(1)
SCALE = 0.25


def _line_of(fn, needle):
    lines, first = inspect.getsourcelines(fn)
    for k, line in enumerate(lines):
        if needle in line:
            return first + k
    raise AssertionError(needle)


def test_parameters_and_ir():
    def f(x, r, alpha: float, beta=2):
        """A docstring is fine."""
        y = x * alpha
        y += r ** 3
        return mxq.where(y > beta, y, -y) / SCALE

    e = parse(f)
    assert e.tensor_params == ("x", "r") and e.scalar_params == ("alpha", "beta")
    assert e.scalar_defaults == (None, 2.0)
    assert e.captured == (("SCALE", 0.25),)
    assert not e.exact  # division
    x, r = torch.randn(64), torch.randn(64)
    got = ir.evaluate(e.expr, [x, r], [0.5, 2.0])
    y = x * 0.5 + r * r * r
    assert torch.equal(got, torch.where(y > 2.0, y, -y) / 0.25)


def test_power_expands_left_to_right():
    def f(x):
        return x ** 4 + x ** -2

    e = parse(f)
    x = torch.tensor([1.1, -3.7, 0.3])
    assert torch.equal(ir.evaluate(e.expr, [x], []), ((x * x) * x) * x + 1.0 / (x * x))


def test_augmented_assignment_is_the_binary_operator():
    """y op= e parses as y = y op e for every operator an expression takes, ** included (a
    small integer exponent expands as in an expression; anything else is refused the same way)."""
    def aug(x, r):
        y = x * 0.5
        y **= 3
        y -= r
        y /= 2.0
        return y

    def plain(x, r):
        y = x * 0.5
        y = y ** 3
        y = y - r
        y = y / 2.0
        return y

    assert parse(aug).expr == parse(plain).expr
    x, r = torch.randn(64), torch.randn(64)
    y = x * 0.5
    assert torch.equal(ir.evaluate(parse(aug).expr, [x, r], []), ((y * y) * y - r) / 2.0)


def test_mxq_functions_may_be_imported_by_name():
    from mxq import tanh

    def f(x):
        return tanh(x)

    assert isinstance(parse(f).expr, ir.Unary)


def test_constants_are_fp32():
    def f(x):
        return x * 0.1

    c = [n for n in ir.walk(parse(f).expr) if isinstance(n, ir.Const)][0]
    assert c.value == torch.tensor(0.1, dtype=torch.float32).item() != 0.1


def bad_import(x):
    import os  # noqa: F401
    return x


def bad_attribute(x):
    return x * math.pi


def bad_call(x):
    return torch.exp(x)


def bad_builtin(x):
    return abs(x)


def bad_loop(x):
    for _ in range(3):
        x = x * 2.0
    return x


def bad_lambda(x):
    g = lambda t: t  # noqa: E731
    return x


def bad_string(x):
    y = "scale"  # noqa: F841
    return x


def bad_captured_list(x):
    return x * CAPTURED_LIST


def bad_captured_tensor(x):
    return x * CAPTURED_TENSOR


def bad_dunder(x):
    __y = x
    return __y


def bad_if(x):
    if x:
        return x
    return -x


def bad_bare_compare(x):
    return x > 0.0


def bad_sqrt_power(x):
    return x ** 0.5


def bad_aug_sqrt_power(x):
    y = x
    y **= 0.5
    return y


def bad_aug_floordiv(x):
    y = x
    y //= 2.0
    return y


def bad_keyword(x):
    return mxq.maximum(x, b=0.0)


def bad_arity(x):
    return mxq.tanh(x, x)


def bad_no_return(x):
    y = x  # noqa: F841


def bad_chain(x):
    return mxq.where(0.0 < x < 1.0, x, 0.0)


def bad_bool(x):
    return x * True


def bad_and(x):
    return mxq.where((x > 0.0) and (x < 1.0), x, 0.0)


def bad_varargs(x, *rest):
    return x


def bad_default(x, mode="fast"):
    return x


def bad_undefined(x):
    return x * not_defined_anywhere  # noqa: F821


def bad_subscript(x):
    return x[0]


BAD = [
    (bad_import, "import os", "import"),
    (bad_attribute, "math.pi", "attribute access"),
    (bad_call, "torch.exp", "call"),
    (bad_builtin, "abs(x)", "call"),
    (bad_loop, "for _ in", "loop"),
    (bad_lambda, "lambda t", "lambda"),
    (bad_string, '"scale"', "string"),
    (bad_captured_list, "CAPTURED_LIST", "captured value"),
    (bad_captured_tensor, "CAPTURED_TENSOR", "captured value"),
    (bad_dunder, "__y = x", "dunder name"),
    (bad_if, "if x:", "if statement"),
    (bad_bare_compare, "x > 0.0", "comparison"),
    (bad_sqrt_power, "x ** 0.5", "power"),
    (bad_aug_sqrt_power, "y **= 0.5", "power"),
    (bad_aug_floordiv, "y //= 2.0", "operator"),
    (bad_keyword, "b=0.0", "keyword argument"),
    (bad_arity, "mxq.tanh(x, x)", "call"),
    (bad_no_return, "y = x", "missing return"),
    (bad_chain, "0.0 < x < 1.0", "chained comparison"),
    (bad_bool, "x * True", "bool"),
    (bad_and, ") and (", "boolean operator (and/or)"),
    (bad_varargs, "def bad_varargs", "parameters"),
    (bad_default, "def bad_default", "parameter default"),
    (bad_undefined, "not_defined_anywhere", "undefined name"),
    (bad_subscript, "x[0]", "subscript"),
]


@pytest.mark.parametrize("fn,needle,construct", BAD, ids=[b[0].__name__ for b in BAD])
def test_refused_with_file_line_and_construct(fn, needle, construct):
    with pytest.raises(EpilogueError) as info:
        mxq.fused_quant()(fn)
    err = info.value
    assert err.file == __file__
    assert err.line == _line_of(fn, needle), str(err)
    assert err.construct == construct, str(err)
    assert f"{__file__}:{err.line}" in str(err)


def test_lambda_epilogue_and_no_source():
    with pytest.raises(EpilogueError, match="lambda"):
        mxq.fused_quant()(lambda x: x)
    ns = {}
    exec("def f(x):\n    return x\n", ns)
    with pytest.raises(EpilogueError, match="source"):
        mxq.fused_quant()(ns["f"])


def test_reserved_parameter_names():
    def f(x, noop):
        return x + noop

    with pytest.raises(EpilogueError, match="reserved"):
        mxq.fused_quant()(f)


def _make(scale):
    def scaled(x):
        return x * scale

    return mxq.fused_quant(colwise=True)(scaled)


def test_fingerprint_covers_source_and_captured_values_only():
    a, b, c = _make(2.0), _make(2.0), _make(3.0)
    assert a.epilogue.fingerprint == b.epilogue.fingerprint
    assert a.epilogue.fingerprint != c.epilogue.fingerprint
    assert a.source == b.source and a.source != c.source
    x = torch.randn(8, 64)
    assert torch.equal(a(x).rowwise_scale, b(x * 1).rowwise_scale)  # tensors never enter the key
    assert a.epilogue.fingerprint == _make(2.0).epilogue.fingerprint


def test_eager_function_still_works_on_torch():
    def f(x, r):
        return mxq.maximum(x, r) * mxq.sigmoid(x)

    op = mxq.fused_quant()(f)
    x, r = torch.randn(4, 32), torch.randn(4, 32)
    assert torch.allclose(op.fn(x, r), torch.maximum(x, r) * torch.sigmoid(x))
    assert op.__name__ == "f" and op.__wrapped__ is f


# -- regressions of issue 21 (Reliability) ----------------------------------------------------



_modules = 0


def load(tmp_path, source: str, **globals_):
    """Import ``source`` (a module defining ``f``) from a real file; ``globals_`` are set first."""
    global _modules
    _modules += 1
    name = f"mxq_epilogue_case_{_modules}"
    path = tmp_path / f"{name}.py"
    header = "import mxq\n" + "".join(f"{k} = {v!r}\n" for k, v in globals_.items())
    path.write_text(header + source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, str(path), header.count("\n")


def bits32(t):
    return t.to(torch.float32).reshape(-1).view(torch.int32).tolist()


def oracle_rowwise(v: torch.Tensor):
    """(data bytes, scale bytes) of fp32 values [M, N] by tests/oracle.py (e4m3, rceil)."""
    return oracle.quantize_rows(v.tolist(), "e4m3", "rceil")


def rowwise_bytes(t):
    return t.rowwise_data.view(torch.uint8).reshape(t.rowwise_scale.shape[0], -1).tolist(), \
        t.rowwise_scale.tolist()


def test_zero_and_negative_zero_are_different_constants():  # issue 21 item 2
    def f(x):
        return mxq.where(x > 0.0, x, x / -0.0)

    def g(x):
        return x * 0.0 + x * -0.0

    x = torch.tensor([[-1.0, 2.0, -0.5, 0.0] * 8])
    want_f = torch.where(x > 0.0, x, x / torch.tensor(-0.0))  # +inf for negative x
    assert bits32(ir.evaluate(parse(f).expr, [x], [])) == bits32(want_f)
    assert oracle_rowwise(want_f) == rowwise_bytes(mxq.fused_quant()(f).reference(x))
    nx = -torch.tensor([[1.0, 3.0, 0.25, 8.0] * 8])
    want_g = nx * torch.tensor(0.0) + nx * torch.tensor(-0.0)  # -0 + +0 = +0: bytes 0, not 128
    assert bits32(want_g) == [0] * 32
    assert oracle_rowwise(want_g) == rowwise_bytes(mxq.fused_quant()(g).reference(nx))


NAN = float("nan")


def test_nan_constants_are_one_node():  # issue 21 item 2
    def f(x):
        return mxq.where(x > NAN, x, NAN) + NAN * x

    e = parse(f)
    assert len([n for n in ir.walk(e.expr) if isinstance(n, ir.Const)]) == 1
    assert e.captured == (("NAN", NAN),) or math.isnan(dict(e.captured)["NAN"])
    x = torch.tensor([1.0, -0.0, math.inf])
    nan = torch.tensor(NAN)
    assert torch.isnan(ir.evaluate(e.expr, [x], [])).all() and torch.isnan(torch.where(x > nan, x, nan) + nan * x).all()


def test_fingerprint_is_of_the_ir_too(tmp_path):
    # identical source, different meaning: the name resolves to another mxq function
    src = "def f(x):\n    return act(x) * 0.0\n"
    a, _, _ = load(tmp_path, "from mxq import tanh as act\n" + src)
    b, _, _ = load(tmp_path, "from mxq import sigmoid as act\n" + src)
    c, _, _ = load(tmp_path, "from mxq import tanh as act\n" + src.replace("0.0", "-0.0"))
    fa, fb, fc = (parse(m.f).fingerprint for m in (a, b, c))
    assert len({fa, fb, fc}) == 3
    assert parse(a.f).fingerprint == fa  # deterministic


def test_chained_doubling_is_linear(tmp_path):  # issue 21 item 3
    k = 200  # the tree has 2**200 leaves; the DAG 201 nodes
    mod, _, _ = load(tmp_path, "def f(x):\n    y = x + x\n" + "    y = y + y\n" * (k - 1) + "    return y\n")
    x = torch.tensor([[2.0 ** -140, -(2.0 ** -149), 0.0, -0.0, 1.0, -3.0, NAN, 2.0 ** -100] * 4])
    want = x.clone()
    for _ in range(k):
        want = want + want
    with deadline(30):
        op = mxq.fused_quant(amax=True)(mod.f)
        assert len(ir.walk(op.epilogue.expr)) == k + 1
        got = op.reference(x)
    assert oracle_rowwise(want) == rowwise_bytes(got)
    assert math.isnan(got.amax.item())


def test_long_chains_and_sums_do_not_recurse(tmp_path):  # issue 21 item 5
    n_assign, n_terms, n_neg = 600, 1500, 1001
    mod, _, _ = load(tmp_path, "def f(x, r):\n    y = x\n" + "    y = y * 0.5 + r\n" * n_assign + "    return y\n")
    terms = " + ".join(("x", "r", "0.25 * x")[k % 3] for k in range(n_terms))
    mod2, _, _ = load(tmp_path, f"def f(x, r):\n    return {terms}\n")
    mod3, _, _ = load(tmp_path, f"def f(x):\n    return {'-' * n_neg}x\n")
    x = torch.tensor([[1.0, -2.0, 0.0, -0.0, 3e38, -1e-40, 0.1, 7.0] * 4])
    r = torch.tensor([[0.5, 1.0, -0.0, 0.0, 3e38, 1e-40, -0.3, 2.0] * 4])
    half, quarter = torch.tensor(0.5), torch.tensor(0.25)
    want1 = x.clone()
    for _ in range(n_assign):
        want1 = want1 * half + r
    want2 = x.clone()
    for k in range(1, n_terms):
        want2 = want2 + (x, r, quarter * x)[k % 3]
    want3 = -x  # an odd number of minuses
    for m, want, args in ((mod, want1, (x, r)), (mod2, want2, (x, r)), (mod3, want3, (x,))):
        op = mxq.fused_quant()(m.f)
        assert bits32(ir.evaluate(op.epilogue.expr, list(args), [])) == bits32(want)
        assert oracle_rowwise(want) == rowwise_bytes(op.reference(*args))


def test_size_limit_is_an_epilogue_error(tmp_path):  # issue 21 items 3 and 5
    n = ir.MAX_NODES  # y = x; n times y = y + 1.0: n + 2 distinct nodes
    mod, path, header = load(tmp_path, "def f(x):\n    y = x\n" + "    y = y + 1.0\n" * n + "    return y\n")
    with pytest.raises(EpilogueError) as info:
        mxq.fused_quant()(mod.f)
    assert info.value.construct == "size" and info.value.file == path and info.value.line == header + 1
    assert str(ir.MAX_NODES) in str(info.value)
    ok, _, _ = load(tmp_path, "def f(x):\n    y = x\n" + "    y = y + 1.0\n" * (n - 2) + "    return y\n")
    assert ir.size(mxq.fused_quant()(ok.f).epilogue.expr) == n


def test_nesting_beyond_pythons_parser_is_an_epilogue_error(tmp_path):  # issue 21 item 5
    # compiled under a raised recursion limit, the function exists; at the default limit
    # Python's ast module cannot rebuild its tree
    terms = 4000
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 6000))
    try:
        mod, path, _ = load(tmp_path, "def f(x):\n    return " + " + ".join(["x"] * terms) + "\n")
    finally:
        sys.setrecursionlimit(limit)
    sys.setrecursionlimit(1000)  # (Python's default: an earlier torch.compile in this process raises it)
    try:
        with pytest.raises(EpilogueError) as info:
            mxq.fused_quant()(mod.f)
    finally:
        sys.setrecursionlimit(limit)
    assert info.value.construct == "nesting" and info.value.file == path


@pytest.mark.parametrize("op", ["is", "is not", "in", "not in"])
def test_identity_and_membership_tests_are_refused(tmp_path, op):  # issue 21 item 10
    mod, path, header = load(tmp_path, f"def f(x, r):\n    return mxq.where(x {op} r, x, r)\n")
    with pytest.raises(EpilogueError) as info:
        mxq.fused_quant()(mod.f)
    err = info.value
    assert (err.file, err.line, err.construct) == (path, header + 2, "comparison operator")
    assert f"`{op}`" in str(err)


HUGE = 10 ** 400


@pytest.mark.parametrize("source,line,construct", [
    ("def f(x):\n    return x * 1" + "0" * 400 + "\n", 2, "constant"),
    ("def f(x):\n    return x * -1" + "0" * 400 + "\n", 2, "constant"),
    ("def f(x):\n    return x * HUGE\n", 2, "captured value"),
    ("def f(x, s=HUGE):\n    return x * s\n", 1, "parameter default"),
    ("def make(b):\n    def f(x):\n        return x * b\n    return f\nf = make(HUGE)\n", 3, "captured value"),
])
def test_huge_integers_are_epilogue_errors(tmp_path, source, line, construct):  # issue 21 item 10
    mod, path, header = load(tmp_path, source, HUGE=HUGE)
    with pytest.raises(EpilogueError) as info:
        mxq.fused_quant()(mod.f)
    err = info.value
    assert (err.file, err.line, err.construct) == (path, header + line, construct)
    assert "too large for a float" in str(err)


def test_big_but_finite_integers_round_like_eager_torch(tmp_path):
    mod, _, _ = load(tmp_path, "def f(x):\n    return x * 10000000000000000000000000000000000000000 + x * 3\n")
    x = torch.tensor([1.0, -1e-3, 0.0])
    big = torch.tensor(float(10 ** 40), dtype=torch.float32)  # beyond fp32: inf, as a 1e40 literal
    want = x * big + x * torch.tensor(3.0)  # inf, -inf, nan
    assert bits32(ir.evaluate(parse(mod.f).expr, [x], [])) == bits32(want)


def bad_try(x):
    try:
        y = x * 2.0
    except ValueError:
        y = x
    return y


def bad_try_last(x):
    try:
        return x
    except ValueError:
        return -x


def bad_print(x):
    print(x)
    return x


def bad_bare_mxq_call(x):
    mxq.tanh(x)
    return x


def bad_bare_annotation(x):
    y: float
    return x


@pytest.mark.parametrize("fn,needle,construct,words", [  # issue 21 item 15
    (bad_try, "try:", "try statement", ["try statements are not supported"]),
    (bad_try_last, "try:", "try statement", ["try statements are not supported"]),
    (bad_bool, "x * True", "bool", ["`True` is a bool", "not numbers", "1.0"]),
    (bad_print, "    print(x)", "call", ["print(...)", "calls other than mxq math functions are not supported",
                                     "side effects"]),
    (bad_bare_mxq_call, "mxq.tanh(x)", "bare expression", ["unused", "assign it"]),
    (bad_bare_annotation, "y: float", "annotation", ["def f(x, s: float)"]),
    (bad_if, "if x:", "if statement", ["mxq.where"]),
    (bad_loop, "for _ in", "loop", ["loops are not supported"]),
], ids=["try", "try_last", "bool", "print", "bare_mxq_call", "bare_annotation", "if", "loop"])
def test_messages_say_what_to_do(fn, needle, construct, words):
    with pytest.raises(EpilogueError) as info:
        mxq.fused_quant()(fn)
    err = info.value
    assert (err.line, err.construct) == (_line_of(fn, needle), construct), str(err)
    for w in words:
        assert w in str(err), str(err)
    assert "must end with" not in str(err)


def _swiglu(g, u):
    return mxq.silu(g) * u


def _geglu(g, u):
    return mxq.gelu(g) * u


def _reglu(g, u):
    return mxq.relu(g) * u


def _qgeglu(g, u):
    return mxq.qgelu(g) * u


def _sreglu(g, u):
    return mxq.srelu(g) * u


def _by_hand(name, g):
    """The activations of docs/NUMERICS.md written out here in fp32 torch, one rounding each."""
    if name == "silu":
        return g * torch.sigmoid(g)
    if name == "gelu":
        return g * (0.5 + 0.5 * torch.tanh(g * (0.79788456 + 0.03567741 * g * g)))
    if name == "relu":
        return torch.where(g > 0, g, torch.zeros_like(g))
    if name == "qgelu":
        return g * torch.sigmoid(1.702 * g)
    return torch.where(g > 0, g * g, torch.zeros_like(g))


@pytest.mark.parametrize("fn, name", [(_swiglu, "silu"), (_geglu, "gelu"), (_reglu, "relu"), (_qgeglu, "qgelu"),
                                      (_sreglu, "srelu")])
def test_gated_epilogues_over_half_views(fn, name):
    """The built-in activations are callable in epilogues (mxq.silu(g) * u: a gated activation
    over the two halves of a [M, 2N] tensor); the bytes are those of the formula by hand,
    quantized by tests/oracle.py."""
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(3)) * 3
    g, u = x[:, :64], x[:, 64:]
    t = mxq.fused_quant()(fn)(g, u)
    v = (_by_hand(name, g) * u).tolist()
    data, scales = oracle.quantize_rows(v, "e4m3", "rceil")
    assert torch.equal(t.rowwise_data.view(torch.uint8), torch.tensor(data, dtype=torch.uint8))
    assert torch.equal(t.rowwise_scale, torch.tensor(scales, dtype=torch.uint8))


def test_inline_activation_arity_is_checked():
    def bad(g, u):
        return mxq.silu(g, u)

    with pytest.raises(EpilogueError, match="mxq.silu takes 1 argument, got 2"):
        mxq.fused_quant()(bad)


K_CAPTURE = 3.0  # (tests/wrapping.py's module has its own K_CAPTURE = 100.0)


def test_an_epilogue_wrapped_by_another_modules_decorator_reads_its_own_names_and_defaults():
    """functools.wraps makes inspect find the wrapped function's source; its captured names,
    closure and float defaults must be that function's too, not the wrapper's (the op computed
    with the decorator module's K_CAPTURE = 100 and lost alpha's default)."""
    from .wrapping import passthrough

    @passthrough
    def scaled(x, alpha: float = 0.5):
        return x * K_CAPTURE * alpha

    epi = parse(scaled)
    assert epi.captured == (("K_CAPTURE", 3.0),) and epi.scalar_defaults == (0.5,), (epi.captured, epi.scalar_defaults)
    x = torch.randn(8, 64)
    got = mxq.fused_quant()(scaled).reference(x)
    codes, scales = oracle.quantize_rows(((x * 3.0) * 0.5).tolist(), "e4m3", "rceil")  # (fp32 products)
    assert got.rowwise_data.view(torch.uint8).tolist() == codes and got.rowwise_scale.tolist() == scales


K_LATE = 2.0  # the module global of the same name as a closure variable assigned later


def test_a_closure_variable_assigned_after_decoration_is_refused_not_read_from_globals():
    def make():
        def f(x):
            return x * K_LATE

        op = mxq.fused_quant()(f)
        K_LATE = 3.0  # noqa: F841 (assigned after the epilogue was parsed)
        return op

    with pytest.raises(EpilogueError, match="captured name 'K_LATE' has no value yet when the epilogue is decorated"):
        make()


class _Holder:
    def scaled(self, x):
        return x * 2.0


def _quoted(x, s: "float"):
    return x * s


def test_a_bound_method_is_refused_by_name_and_a_quoted_float_annotation_is_a_float():
    with pytest.raises(EpilogueError, match=r"a bound method \(_Holder.scaled\) cannot be an epilogue"):
        parse(_Holder().scaled)
    epi = parse(_quoted)
    assert epi.tensor_params == ("x",) and epi.scalar_params == ("s",)


def _renamed(x):
    return x * 3.0


_renamed.__name__ = "renamed_later"


def test_the_decorator_above_staticmethod_and_a_renamed_function_are_ops():
    """@mxq.fused_quant above @staticmethod decorates its function (the op, a class attribute,
    binds to no instance; it was '<unknown>:0: ... got staticmethod'), and a function whose
    __name__ was set after its def is found in its source by the def's name ('<unknown>:0:
    cannot find the definition')."""
    class _Ops:
        @mxq.fused_quant(colwise=True)
        @staticmethod
        def doubled(x):
            return x * 2.0

    x = torch.tensor([[1.0, -2.5, 0.75, 448.0] * 8])
    for op in (_Ops.doubled, _Ops().doubled):
        assert isinstance(op, mxq.op.FusedOp) and torch.equal(ir.evaluate(op.epilogue.expr, [x], []), x * 2.0)
    assert torch.equal(ir.evaluate(parse(_renamed).expr, [x], []), x * 3.0)


# the functions an epilogue may call (docs/DESIGN.md, the epilogue language), with their arity
CALLABLE = {"abs": 1, "erf": 1, "exp": 1, "exp2": 1, "log": 1, "log2": 1, "rsqrt": 1, "sigmoid": 1, "sqrt": 1,
            "tanh": 1, "maximum": 2, "minimum": 2, "where": 3,
            "gelu": 1, "silu": 1, "relu": 1, "qgelu": 1, "srelu": 1}


def test_unsupported_call_lists_every_callable_function(tmp_path):
    """The refusal of a foreign call lists what an epilogue may call, built-in activations
    included, and everything it lists parses (issue 37 item 5)."""
    with pytest.raises(EpilogueError, match="is not an mxq math function") as err:
        load(tmp_path, "import torch\n@mxq.fused_quant\ndef f(x):\n    return torch.exp(x)\n")
    listed = str(err.value).split("calls other than ")[1].removesuffix(" are not supported").split(", ")
    assert sorted(listed) == sorted(f"mxq.{name}" for name in CALLABLE)
    for name, arity in CALLABLE.items():
        args = ["x > 0.0", "x", "r"][:arity] if name == "where" else ["x", "r"][:arity]
        mod, _, _ = load(tmp_path, f"@mxq.fused_quant\ndef f(x, r):\n    return mxq.{name}({', '.join(args)}) + r\n")
        assert isinstance(mod.f, mxq.FusedOp), name


_TYPED_IN = "import mxq\n@mxq.fused_quant\ndef f(x):\n    return x * 2\n"


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_epilogue_typed_in_says_why_and_the_fix(how):
    """An epilogue from `python -c` or stdin (a REPL's too): its source does not exist, and the
    error says so and what to do (issue 37 item 5)."""
    args, stdin = ([sys.executable, "-c", _TYPED_IN], None) if how == "-c" else ([sys.executable, "-"], _TYPED_IN)
    got = subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert got.returncode == 1
    last = got.stderr.strip().splitlines()[-1]
    where = "<string>" if how == "-c" else "<stdin>"
    assert last.startswith(f"mxq.EpilogueError: {where}:2: cannot read the source of 'f'"), last
    assert "Python keeps no source for a function typed into an interactive session, `python -c` or stdin" in last
    assert last.endswith("define it in a .py file (a module) and import it from there"), last


def _neg_zero_int(x):
    return x + -0


def _neg_neg_neg_zero(x):
    return x * 1.0 + -(-(-0))


def _neg_zero_float(x):
    return x * 1.0 + -0.0


def test_signs_on_a_literal_are_pythons_then_rounded_once():
    """``-0`` is the int 0 (Python negates the int): x + -0 keeps x = -0.0 at -0.0 + 0 = +0.0 (byte
    0x00), as Python and torch compute it; a float literal's sign stays (-0.0); a sign on a
    literal too large for fp32 rounds to inf as the literal does."""
    x = torch.tensor([[-0.0] * 32])
    for fn in (_neg_zero_int, _neg_neg_neg_zero, _neg_zero_float):
        got = mxq.fused_quant(fn)(x)
        want = mxq.quantize(fn(x))  # (Python's own evaluation, then the plain cast)
        assert torch.equal(got.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8)), fn.__name__
    assert math.copysign(1, parse(_neg_zero_int).expr.b.value) == 1  # (x + Const(+0.0))
    assert math.copysign(1, parse(_neg_zero_float).expr.b.value) == -1


ZERO_INT = 0


def _neg_captured_zero(x):
    return x + -ZERO_INT


def _neg_int_expression(x):
    return x + (0 - 0) * -1


def test_a_sign_on_a_name_or_an_expression_is_an_fp32_negation():
    """docs/NUMERICS.md, Epilogues: only a literal's sign is folded as Python's int; on a captured
    int or a constant expression it negates the fp32 value, so -0 there is -0.0 and -0.0 + -0.0
    stays -0.0 (byte 0x80), where Python's int arithmetic would add +0."""
    x = torch.tensor([[-0.0] * 32])
    for fn in (_neg_captured_zero, _neg_int_expression):
        got = mxq.fused_quant(fn)(x)
        assert got.rowwise_data.view(torch.uint8)[0].tolist() == [0x80] * 32, fn.__name__


Y_GLOBAL = 3.0


def _reads_a_local_first(x):
    z = x * Y_GLOBAL
    Y_GLOBAL = 2.0  # noqa: F841 (a local of the same name as the global: Python's read above raises)
    return z


def _augments_an_unset_local(x):
    Y_GLOBAL += x  # noqa: F821
    return Y_GLOBAL


_mxq_tanh = mxq.tanh  # (a module global naming mxq's function, which the next function's local shadows)


def _calls_a_local_first(x):
    y = _mxq_tanh(x)
    _mxq_tanh = 2.0  # (a local of the global's name: Python's call above raises)
    return y * _mxq_tanh


def _calls_through_a_local_module_first(x):
    y = mxq.exp(x)
    mxq = 3.0  # noqa: F841
    return y * mxq


def test_a_local_read_before_it_is_assigned_is_refused():
    """Python raises UnboundLocalError where a function reads a local before assigning it (a
    called name too); the parser refused nothing and read the module global of that name
    instead (a call of such a name compiled mxq's function)."""
    for fn in (_reads_a_local_first, _augments_an_unset_local):
        with pytest.raises(UnboundLocalError):
            fn(torch.ones(1))
        with pytest.raises(EpilogueError, match="'Y_GLOBAL' is read before it is assigned"):
            mxq.fused_quant(fn)
    for fn, name in ((_calls_a_local_first, "_mxq_tanh"), (_calls_through_a_local_module_first, "mxq")):
        with pytest.raises(UnboundLocalError):
            fn(torch.ones(1))
        with pytest.raises(EpilogueError, match=f"'{name}' is read before it is assigned"):
            mxq.fused_quant(fn)


def _named_self(self, y):
    return self + y


def _floats_named_a_w(acc, a: float = 1.0, w: float = 2.0):
    return acc * a + w


def _named_acc_out(x, acc_out: float = 1.0):
    return x * acc_out


def test_parameters_named_like_the_ops_own_arguments():
    """A parameter named self binds by keyword (the op's methods take self positionally only);
    op.gemm's a and w are positional, so floats named a and w bind by keyword; acc_out, op.gemm's
    own keyword, is refused at decoration like the call's keywords."""
    x, y = torch.randn(4, 32), torch.randn(4, 32)
    op = mxq.fused_quant(_named_self)
    want = mxq.quantize(x + y)
    for got in (op(self=x, y=y), op.reference(self=x, y=y), op(x, y)):
        assert torch.equal(got.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8))
    g = mxq.fused_quant(format="fp8_block")(_floats_named_a_w)
    a, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    got = g.gemm(a, w, a=0.5, w=0.25)
    want = g.reference(torch.matmul(a.float(), w.float().t()), a=0.5, w=0.25)
    assert torch.equal(got.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8))
    with pytest.raises(EpilogueError, match="acc_out"):
        mxq.fused_quant(_named_acc_out)


def _carries_attributes(x):
    return x


_carries_attributes.spec = "the function's own"
_carries_attributes.note = "kept"


def test_the_functions_attributes_do_not_replace_the_ops():
    op = mxq.fused_quant(_carries_attributes)
    assert isinstance(op.spec, mxq.QuantSpec) and op.note == "kept" and op.__name__ == "_carries_attributes"
    assert op(torch.randn(4, 32)).rowwise_data.shape == (4, 32)


@mxq.fused_quant(act="gelu", colwise=True)
def _pickled_op(x, b):
    return x + b


@mxq.fused_quant(act="swiglu")
def _pickled_gated(x):
    return x


_bound_later = mxq.fused_quant(colwise=True)(_pickled_op.fn)  # (a module attribute of another name than its function)


def test_ops_pickle_by_reference_and_run_in_a_fresh_process():
    """An op pickles as a reference to its module's attribute (as a function does; it was pickle's
    "not the same object as ..." about the wrapped function): the same op in this process, the
    module's own op in a fresh one, whose call gives this process's bytes; an op bound to a name
    other than its function's by that name; a built-in quantize op by its spec; an op made inside
    a function by its state, as before (copy.deepcopy of it works; pickle refuses its local function)."""
    import copy
    import os
    import pickle

    for op in (_pickled_op, _pickled_gated, _bound_later):
        assert pickle.loads(pickle.dumps(op)) is op and copy.deepcopy(op) is op
    q = mxq.op._quantize_op(mxq.QuantSpec(colwise=True, amax=True))
    assert pickle.loads(pickle.dumps(q)).spec == q.spec

    def make():
        @mxq.fused_quant()
        def inner(x):
            return x
        return inner

    local = make()
    twin = copy.deepcopy(local)
    assert twin is not local and twin.spec == local.spec
    x0 = torch.randn(4, 64)
    assert torch.equal(twin(x0).rowwise_data.view(torch.uint8), local(x0).rowwise_data.view(torch.uint8))
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps(local)
    # a copy is an op of its own: registered with the torch operator (a compiled call finds it
    # after the original is gone), none of the original's native functions or kept routes copied
    # (they pickled as "ffi.Function does not support ToJSONGraph" after dispatcher())
    local.dispatcher()
    twin = copy.deepcopy(local)
    assert twin._plans == {} and twin._cpp_dispatchers is None and twin._torch_id == local._torch_id
    del local
    import gc
    gc.collect()
    compiled = torch.compile(lambda t: twin(t).rowwise_data, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x0).view(torch.uint8), twin(x0).rowwise_data.view(torch.uint8))

    def make_gated():
        @mxq.fused_quant(act="swiglu")
        def g(x):
            return x
        return g

    gop = make_gated()
    gop.dispatcher()
    gcopy = copy.deepcopy(gop)
    assert gcopy._fast is gcopy.inner._fast and gcopy._dispatcher is None and gcopy.inner is not gop.inner
    xg = torch.randn(4, 128)
    assert torch.equal(gcopy(xg).rowwise_data.view(torch.uint8), gop(xg).rowwise_data.view(torch.uint8))
    x, b = torch.randn(64, 64, generator=torch.Generator().manual_seed(3)), torch.randn(64)
    want = _pickled_op(x, b)
    blob = pickle.dumps((_pickled_op, x, b))
    code = ("import pickle, sys, torch; op, x, b = pickle.loads(sys.stdin.buffer.read()); t = op(x, b); "
            "sys.stdout.buffer.write(pickle.dumps([t.rowwise_data.view(torch.uint8), t.colwise_scale, type(op).__name__]))")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    data, scale, kind = pickle.loads(done.stdout)
    assert kind == "FusedOp" and torch.equal(data, want.rowwise_data.view(torch.uint8))
    assert torch.equal(scale, want.colwise_scale)


def test_a_nested_def_with_lines_indented_less_than_it_parses(tmp_path):
    """A def inside a function whose docstring or backslash-continued line starts left of the def
    (dedent then leaves the def indented): parsed as it stands, with its errors at their file lines."""
    src = ('def make(k):\n'
           '    def f(x):\n'
           '        """Scale.\n'
           'Multiplies by k."""\n'
           '        y = x * \\\n'
           '2.0\n'
           '        return y * k\n'
           '    return f\n'
           'def make_bad():\n'
           '    def f(x):\n'
           '        """Doc.\n'
           'more."""\n'
           '        return x.sum()\n'
           '    return f\n')
    mod, _, _ = load(tmp_path, src)
    op = mxq.fused_quant(mod.make(3.0))
    x = torch.tensor([[1.0, -2.5, 0.75, 448.0] * 8])
    assert torch.equal(ir.evaluate(op.epilogue.expr, [x], []), x * 2.0 * 3.0)
    with pytest.raises(EpilogueError) as err:
        mxq.fused_quant(mod.make_bad())
    assert err.value.args and ":14:" in str(err.value)  # (the file's line of x.sum(): 1 header line + 13)


def _injected(x):
    return x * 2.0


_injected.__name__ = "f */\n#error INJECTED\n/*"


def test_an_ops_name_is_its_defs_name_whatever_its_dunder_name_holds(tmp_path):
    """The epilogue's name is the def's own (an identifier), not __name__, which any string may
    replace: that string reached the exported header's comment and planted a preprocessor line
    (the probe's '*/ #error ... /*'), and the gated ops' notes refused it as the caller's 'note'."""
    epi = parse(_injected)
    assert epi.name == "_injected"
    op = mxq.fused_quant(_injected)
    header = (tmp_path / "mxq_ok.h")
    info = op.export(str(tmp_path), name="mxq_ok")
    text = open(info["header"]).read()
    assert "#error" not in text and " * op: _injected " in text and header.exists()
    gated = mxq.fused_quant(act="swiglu")(_injected)
    assert gated.epilogue.name == "_injected"


_FLT_MAX = 3.4028234663852886e38  # (2 - 2^-23) * 2^127, the largest finite fp32
_HUGE_INT = 2 ** 128 - 2 ** 103 - 1  # just under FLT_MAX + half an ulp: rounds to FLT_MAX, but via float64 to 2^128


def _huge_literal(x):
    return x * 0.0 + 340282356779733661637539395458142568447


def _huge_captured(x):
    return x * 0.0 + _HUGE_INT


def _int60(x):
    return x * 0.0 + 1152921573326323713  # 2^60 + 2^36 + 1: fp32 2^60 + 2^37, via float64 2^60


def _huge_param(x, s: float):
    return x * 0.0 + s


def test_int_constants_round_to_fp32_once():
    """An int constant (literal, captured, a float parameter's argument) rounds to fp32 from its
    own digits, once: float() first would round it to float64, and 2^128 - 2^103 - 1 would
    become 2^128, then inf."""
    assert 340282356779733661637539395458142568447 == _HUGE_INT
    assert ir.f32(_HUGE_INT) == _FLT_MAX and ir.f32(-_HUGE_INT) == -_FLT_MAX
    assert ir.f32(_HUGE_INT + 1) == math.inf  # (the tie rounds to even: 2^128)
    assert ir.f32(1152921573326323713) == 2.0 ** 60 + 2.0 ** 37 and ir.f32(2 ** 60 + 2 ** 36) == 2.0 ** 60
    assert ir.f32(2 ** 60 + 3 * 2 ** 36) == 2.0 ** 60 + 2.0 ** 38  # (a tie to even upwards)
    for fn, value in ((_huge_literal, _FLT_MAX), (_huge_captured, _FLT_MAX), (_int60, 2.0 ** 60 + 2.0 ** 37)):
        expr = parse(fn).expr
        assert isinstance(expr.b, ir.Const) and expr.b.value == value, (fn.__name__, expr)
    op = mxq.fused_quant(fp8="e5m2")(_huge_param)
    x = torch.zeros(2, 32)
    for s in (_HUGE_INT, 1152921573326323713):
        got, want = op(x, s), op(x, ir.f32(s))  # (a float argument: the kernel's one rounding to fp32)
        assert torch.equal(got.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8))
        assert torch.equal(got.rowwise_scale, want.rowwise_scale)
    assert not torch.equal(op(x, _HUGE_INT).rowwise_data.view(torch.uint8), op(x, math.inf).rowwise_data.view(torch.uint8))


def test_a_source_file_changed_since_import_is_refused(tmp_path, monkeypatch):
    """An epilogue decorated after its file changed on disk (its module not reloaded) is refused:
    the op would be built from text Python never ran. The same file unchanged builds."""
    mod = tmp_path / "mxq_stale_mod.py"
    text = ("import mxq\n\n\ndef make():\n    k = 3.0\n\n    @mxq.fused_quant\n    def f(x):\n"
            "        return x * 2.0 + k\n    return f\n")
    mod.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("mxq_stale_mod", mod)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert ir.serialize(m.make().epilogue.expr) == ir.serialize(parse(lambda_free_twice_plus_three).expr)
    later = mod.stat().st_mtime + 5  # (every edit below a new size and mtime, as any filesystem records it)
    mod.write_text(text.replace("x * 2.0", "x * 4.25"))
    os.utime(mod, (later, later))
    with pytest.raises(EpilogueError, match="changed since its module was imported"):
        m.make()
    mod.write_text(text.replace("k = 3.0", "g = 3.0").replace("+ k", "+ g"))  # (a captured name renamed)
    os.utime(mod, (later + 5, later + 5))
    with pytest.raises(EpilogueError, match="changed since its module was imported"):
        m.make()
    # (an edit that leaves the file not compiling: it compiled at import, so it changed; it was taken
    # unchecked, its new text built while Python ran the old)
    mod.write_text(text.replace("x * 2.0", "x * 5.0") + "\ndef g(:\n")
    os.utime(mod, (later + 10, later + 10))
    with pytest.raises(EpilogueError, match="changed since its module was imported"):
        m.make()
    mod.write_text(text.replace("x * 2.0 + k", "x * 2.0 + k  # a comment"))  # (the same code)
    os.utime(mod, (later + 15, later + 15))
    assert ir.serialize(m.make().epilogue.expr) == ir.serialize(parse(lambda_free_twice_plus_three).expr)


def lambda_free_twice_plus_three(x):
    return x * 2.0 + 3.0


def test_an_import_hooks_rewrite_of_an_unchanged_file_is_taken(tmp_path, monkeypatch):
    """A module an import hook rewrote (typeguard-style instrumentation: its functions' code is not
    what a plain compile of the file gives) whose file is unchanged since its .pyc was written (the
    timestamp header's mtime and size) builds its epilogues from the file: no compile, no refusal."""
    import py_compile
    import types

    mod = tmp_path / "mxq_hooked_mod.py"
    mod.write_text("import mxq\n\n\ndef f(x):\n    return x * 2.0\n")
    cached = tmp_path / "__pycache__" / "mxq_hooked_mod.pyc"
    py_compile.compile(str(mod), cfile=str(cached), doraise=True)  # (a timestamp .pyc of the file as it is)
    hooked = compile("import mxq\n\n\ndef f(x):\n    y = x\n    return y * 2.0\n", str(mod), "exec")  # (the rewrite)
    m = types.ModuleType("mxq_hooked_mod")
    m.__file__, m.__cached__ = str(mod), str(cached)
    exec(hooked, m.__dict__)
    m.f.__module__ = "mxq_hooked_mod"
    monkeypatch.setitem(sys.modules, "mxq_hooked_mod", m)
    assert ir.serialize(parse(m.f).expr) == ir.serialize(parse(_twice).expr)
    monkeypatch.setattr(m, "__cached__", str(tmp_path / "none.pyc"))  # (no header: compared, and refused)
    with pytest.raises(EpilogueError, match="or an import hook or AST transformer rewrote it"):
        parse(m.f)


def _twice(x):
    return x * 2.0


def _math_module_gelu(x):
    return mxq_math.gelu(x)  # (mxq.frontend.math holds no gelu: Python raises AttributeError)


def test_a_name_the_math_module_lacks_is_refused():
    """mxq.frontend.math.<name> is taken only where that module has the name: its activations are
    mxq's (mxq.gelu), and mxq_math.gelu compiled as mxq.gelu where Python raises."""
    with pytest.raises(AttributeError):
        _math_module_gelu(torch.zeros(1))
    with pytest.raises(EpilogueError, match="mxq_math.gelu is not an mxq math function"):
        mxq.fused_quant(_math_module_gelu)


_SCALE = 2.0


def test_defaults_and_globals_are_read_once_at_decoration():
    """README: a parameter's default and a global the epilogue reads are taken when the op is
    decorated; rebinding either later changes no call (the bytes stay those of the values then,
    computed here by torch and mxq.quantize), and a new decoration reads the new values."""
    global _SCALE

    def scaled(x, alpha: float = 3.0):
        return x * alpha * _SCALE

    op = mxq.fused_quant()(scaled)
    x = torch.randn(8, 64)

    def want(alpha, scale):
        return mxq.quantize(x * torch.tensor(alpha) * torch.tensor(scale)).rowwise_data.view(torch.uint8)

    before = want(3.0, 2.0)
    try:
        _SCALE, scaled.__defaults__ = 5.0, (7.0,)
        assert torch.equal(op(x).rowwise_data.view(torch.uint8), before)
        assert torch.equal(mxq.fused_quant()(scaled)(x).rowwise_data.view(torch.uint8), want(7.0, 5.0))
        assert not torch.equal(want(7.0, 5.0), before)
    finally:
        _SCALE = 2.0
