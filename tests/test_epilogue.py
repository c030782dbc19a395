"""The epilogue parser: what the language accepts, what it refuses (with file and line), and
the fingerprint that identifies an op."""

import inspect
import math

import pytest
import torch

import mxq
from mxq import ir
from mxq.epilogue import EpilogueError, parse

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
    (bad_keyword, "b=0.0", "keyword argument"),
    (bad_arity, "mxq.tanh(x, x)", "call"),
    (bad_no_return, "y = x", "missing return"),
    (bad_chain, "0.0 < x < 1.0", "chained comparison"),
    (bad_bool, "x * True", "Constant"),
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
