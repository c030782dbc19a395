"""The expression IR as a DAG: constants by their bits, one node per structure, and every pass
(walk, evaluate, serialize, repr, pickle) linear in the distinct nodes and free of recursion.

Expected values come from eager torch written out by hand here, not from ``ir.evaluate``.
"""

import copy
import math
import os
import pickle
import struct
import subprocess
import sys

import pytest
import torch

from mxq.frontend import ir

from .conftest import deadline

X = ir.TensorArg("x", 0)
R = ir.TensorArg("r", 1)


def bits32(t: torch.Tensor) -> list[int]:
    return t.to(torch.float32).reshape(-1).view(torch.int32).tolist()


def test_constants_are_compared_by_their_bits():
    nan = float("nan")
    assert ir.Const(0.0) != ir.Const(-0.0)
    assert len({ir.Const(0.0), ir.Const(-0.0)}) == 2
    assert ir.Const(nan) == ir.Const(nan) and hash(ir.Const(nan)) == hash(ir.Const(nan))
    assert ir.Const(math.inf) != ir.Const(-math.inf)
    e = ir.Binary("add", ir.Binary("mul", X, ir.Const(0.0)), ir.Binary("mul", X, ir.Const(-0.0)))
    assert len([n for n in ir.walk(e) if isinstance(n, ir.Const)]) == 2
    x = torch.tensor([-1.0, 2.0])
    want = x * torch.tensor(0.0) + x * torch.tensor(-0.0)  # -0 + 0 = +0, 0 + -0 = +0
    assert bits32(ir.evaluate(e, [x], [])) == bits32(want) == [0, 0]


def test_structurally_equal_nodes_are_one_node():
    a = ir.Binary("add", ir.Unary("neg", X), ir.Const(1.5))
    b = ir.Binary("add", ir.Unary("neg", ir.TensorArg("x", 0)), ir.Const(1.5))
    assert a is b and a == b and hash(a) == hash(b)
    assert ir.Binary("add", X, R) != ir.Binary("add", R, X)
    assert ir.Compare("lt", X, R) != ir.Compare("le", X, R)


def test_walk_is_children_first_each_node_once():
    s = ir.Binary("add", X, R)
    c = ir.Compare("gt", s, ir.Const(0.0))
    e = ir.Where(c, s, ir.Binary("mul", s, X))
    order = ir.walk(e)
    # depth first, children left to right, each distinct node once
    assert order == [X, R, s, ir.Const(0.0), c, ir.Binary("mul", s, X), e]
    assert ir.size(e) == 7


def test_exponential_tree_form_is_linear():
    k = 3000  # y = x; k times y = y + y: 2**3000 leaves as a tree, k + 1 distinct nodes
    with deadline(30):
        y = X
        for _ in range(k):
            y = ir.Binary("add", y, y)
        z = X
        for _ in range(k):
            z = ir.Binary("add", z, z)
        assert y is z and y == z and hash(y) == hash(z)
        assert len(ir.walk(y)) == k + 1
        x = torch.tensor([1.0, -0.0, 0.0, 2.0 ** -149, -3.0, float("nan")])
        want = x.clone()
        for _ in range(k):
            want = want + want
        assert bits32(ir.evaluate(y, [x], [])) == bits32(want)
        assert len(ir.serialize(y).splitlines()) == k + 1
        assert len(repr(y)) < 2000
        assert ir.is_exact(y)


def test_deep_chains_do_not_recurse():
    depth = 20000  # far beyond the interpreter's recursion limit
    with deadline(30):
        e = X
        for k in range(depth):
            e = ir.Unary("neg", e) if k % 2 else ir.Binary("sub", e, ir.Const(0.5))
        order = ir.walk(e)
        assert len(order) == depth + 2 and order[0] is X and order[-1] is e
        x = torch.tensor([1.0, -2.5, 1e30])
        want = x.clone()
        half = torch.tensor(0.5)
        for k in range(depth):
            want = -want if k % 2 else want - half
        assert bits32(ir.evaluate(e, [x], [])) == bits32(want)
        repr(e)
        ir.digest(e)
        assert pickle.loads(pickle.dumps(e)) is e
        assert copy.deepcopy(e) is e and copy.copy(e) is e


def test_pickle_round_trip_keeps_zero_signs_and_nan():
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    e = ir.Where(ir.Compare("ne", X, ir.Const(nan)), ir.Binary("mul", X, ir.Const(-0.0)),
                 ir.ScalarArg("s", 0))
    back = pickle.loads(pickle.dumps(e))
    assert back is e
    assert [type(n).__name__ for n in ir.walk(back)] == [type(n).__name__ for n in ir.walk(e)]


def test_evaluate_releases_nothing_it_still_needs():
    # a value used by an early and a late node must survive until the late one
    s = ir.Binary("add", X, R)
    t = ir.Unary("abs", s)
    u = ir.Binary("mul", t, ir.Const(2.0))
    e = ir.Binary("sub", u, s)
    x, r = torch.tensor([1.0, -4.0]), torch.tensor([-3.0, 1.0])
    want = torch.abs(x + r) * torch.tensor(2.0) - (x + r)
    assert bits32(ir.evaluate(e, [x, r], [])) == bits32(want)


def test_nodes_are_validated_and_immutable():
    with pytest.raises(ValueError):
        ir.Binary("pow", X, R)
    with pytest.raises(ValueError):
        ir.Unary("print", X)
    with pytest.raises(TypeError):
        ir.Binary("add", 1.0, X)
    with pytest.raises(TypeError):
        ir.Where(X, X, R)  # the condition must be a comparison
    with pytest.raises(TypeError):
        ir.Binary("add", ir.Compare("lt", X, R), X)
    with pytest.raises(TypeError):
        ir.Const(True)
    with pytest.raises(ValueError):
        ir.Const(0.1)  # not fp32-representable
    with pytest.raises(AttributeError):
        X.index = 3
    assert ir.Const(1).value == 1.0 and isinstance(ir.Const(1).value, float)


_FINGERPRINT_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from mxq.frontend import ir
x = ir.TensorArg("x", 0)
e = ir.Binary("add", ir.Binary("mul", x, ir.Const(0.0)), ir.Binary("mul", x, ir.Const(-0.0)))
for _ in range(50):
    e = ir.Binary("add", e, e)
print(ir.digest(e))
"""


def test_digest_is_deterministic_across_processes_and_sees_zero_signs():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONHASHSEED": str(12345 + (hash("mxq") & 0xFF))}  # not this process's
    out = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT.format(root=root)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    e = ir.Binary("add", ir.Binary("mul", X, ir.Const(0.0)), ir.Binary("mul", X, ir.Const(-0.0)))
    for _ in range(50):
        e = ir.Binary("add", e, e)
    assert out == ir.digest(e)
    flipped = ir.Binary("add", ir.Binary("mul", X, ir.Const(-0.0)), ir.Binary("mul", X, ir.Const(0.0)))
    assert ir.digest(flipped) != ir.digest(
        ir.Binary("add", ir.Binary("mul", X, ir.Const(0.0)), ir.Binary("mul", X, ir.Const(-0.0))))


def _torch_f32(x: float) -> float:
    """fp32 RNE of a float64 by torch's conversion (the oracle; flush-to-zero off)."""
    return torch.tensor(x, dtype=torch.float64).to(torch.float32).item()


def test_f32_rounds_as_torch_converts_float64_to_float32():
    """ir.f32 (integer rounding from the value's digits) against torch's float64 -> float32
    conversion: ties to even at normal and subnormal quanta, the largest fp32's rounding edge,
    overflow to inf, underflow to +-0, and random doubles across fp32's whole range."""
    import random

    rng = random.Random(7)
    edges = [1.0, 1 + 2 ** -24, 1 + 3 * 2 ** -24, 2.0 ** -149, 2.0 ** -150, 3 * 2.0 ** -150, 2.0 ** -151,
             1.5 * 2.0 ** -149, 2.5 * 2.0 ** -149, 2.0 ** -126 * (1 - 2 ** -24), 3.4028234663852886e38,
             3.4028235677973362e38, 3.4028235677973366e38, 1e39, 1e300, 1e-300, 5e-324, 0.1, 1 / 3]
    values = edges + [-v for v in edges] + [rng.choice((-1, 1)) * rng.random() * 2.0 ** rng.randint(-155, 130)
                                            for _ in range(20000)]
    for v in values:  # (float64 bit patterns: a value not rounded to fp32 differs)
        got, want = ir.f32(v), _torch_f32(v)
        assert struct.pack("<d", got) == struct.pack("<d", want), (v, got, want)
    assert math.copysign(1.0, ir.f32(-0.0)) == -1.0 and math.isnan(ir.f32(math.nan))


def test_f32_ignores_flush_to_zero_and_the_default_device():
    """A constant's rounding is the same under torch.set_flush_denormal(True) (which a conversion
    through a CPU tensor obeys, flushing fp32 subnormals) and under a meta default device (where
    a tensor has no value to read), so decorating in either gives the op it gives elsewhere."""
    import mxq

    def tiny(x):
        return x * 1e-40

    want = ir.f32(1e-40)
    assert want == _torch_f32(1e-40) != 0.0
    with torch.device("meta"):
        op = mxq.fused_quant(act="gelu")(tiny)
    assert op.epilogue.expr == ir.Binary("mul", ir.TensorArg("x", 0), ir.Const(want))
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        assert _torch_f32(1e-40) == 0.0  # (the mode holds: a conversion through a tensor flushes)
        assert ir.f32(1e-40) == want and ir.f32(-3 * 2.0 ** -150) == -(2.0 ** -148)
        assert mxq.fused_quant()(tiny).epilogue.expr == ir.Binary("mul", ir.TensorArg("x", 0), ir.Const(want))
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="os.fork")
def test_a_child_forked_while_an_op_is_decorated_gets_a_fresh_lock():
    """ir's table lock, held by a thread decorating an op at a fork, is free in the child."""
    from mxq.frontend import ir

    from .checks import child_gets_fresh_locks

    assert child_gets_fresh_locks((ir, "_LOCK"))
