"""The torch reference against the independent oracle and against first principles."""

import math

import pytest
import torch

import mxq
from mxq.frontend import activations
from mxq.formats import layouts
from mxq.tensor import flat_dims

from . import oracle
from .conftest import planted

MODES = ("rceil", "floor", "ceil", "even")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def same_bytes(a, b):
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def bytes_of(t):
    return t.view(torch.uint8).reshape(t.shape[0] if t.dim() else 1, -1).tolist()


def oracle_both(x2d: torch.Tensor, fmt, mode):
    rows = x2d.to(torch.float32).tolist()
    rd, rs = oracle.quantize_rows(rows, fmt, mode)
    cols = x2d.to(torch.float32).t().tolist()
    cd_t, cs_t = oracle.quantize_rows(cols, fmt, mode)
    cd = [list(r) for r in zip(*cd_t)] if cd_t else []
    cs = [list(r) for r in zip(*cs_t)] if cs_t else []
    return rd, rs, cd, cs


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,scale,dtype", [
    ((33, 70), 1.0, torch.float32), ((64, 64), 1e-3, torch.bfloat16), ((31, 1), 300.0, torch.float16),
    ((1, 97), 1e20, torch.float32), ((40, 45), 1e-38, torch.float32), ((2, 3, 40), 1.0, torch.bfloat16),
])
def test_matches_oracle_bytes(fmt, mode, shape, scale, dtype):
    m, n = flat_dims(shape)
    x = planted(m, n, dtype, seed=hash((fmt, mode, shape)) % 1000, scale=scale).reshape(shape)
    t = mxq.quantize(x, fp8=fmt, scale_mode=mode, rowwise=True, colwise=True)
    rd, rs, cd, cs = oracle_both(x.reshape(m, n), fmt, mode)
    assert t.rowwise_data.shape == x.shape and t.colwise_data.shape == x.shape
    assert t.rowwise_data.dtype == mxq.formats.numerics.FORMATS[fmt].torch_dtype
    assert bytes_of(t.rowwise_data.reshape(m, n)) == rd
    assert t.rowwise_scale.tolist() == rs
    assert bytes_of(t.colwise_data.reshape(m, n)) == cd
    assert t.colwise_scale.tolist() == cs


@pytest.mark.parametrize("m,n", [(1, 1), (33, 70), (130, 200)])
def test_swizzled_bytes_match_oracle_offsets(m, n):
    x = planted(m, n, seed=3)
    t = mxq.quantize(x, rowwise=True, colwise=True, scale_layout="swizzled")
    _, rs, _, cs = oracle_both(x, "e4m3", "rceil")
    rflat, cflat = t.rowwise_scale.reshape(-1), t.colwise_scale.reshape(-1)
    assert t.rowwise_scale.shape == layouts.rowwise_scale_shape(m, n, "swizzled")
    assert t.colwise_scale.shape == layouts.colwise_scale_shape(m, n, "swizzled")
    want_r = torch.zeros_like(rflat)
    for i in range(m):
        for j in range(len(rs[0])):
            want_r[oracle.swizzle_offset(i, j, len(rs[0]))] = rs[i][j]
    want_c = torch.zeros_like(cflat)
    for b in range(len(cs)):
        for col in range(n):
            want_c[oracle.swizzle_offset(col, b, len(cs))] = cs[b][col]
    assert torch.equal(rflat, want_r) and torch.equal(cflat, want_c)
    assert torch.equal(t.compact_scale("rowwise"), torch.tensor(rs, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_colwise_is_rowwise_of_transpose(dtype):
    x = planted(70, 45, dtype, seed=5)
    c = mxq.quantize(x, rowwise=False, colwise=True, scale_mode="floor")
    r = mxq.quantize(x.t().contiguous(), scale_mode="floor")
    assert torch.equal(c.colwise_data.view(torch.uint8), r.rowwise_data.view(torch.uint8).t())
    assert torch.equal(c.colwise_scale, r.rowwise_scale.t())
    assert c.rowwise_data is None and c.rowwise_scale is None


def test_partial_blocks_only_see_valid_elements():
    x = torch.zeros(3, 33)
    x[:, 32] = 448.0 * 4  # the 33rd column is alone in its block
    x[:, :32] = 1.0
    t = mxq.quantize(x, scale_mode="floor")
    assert t.rowwise_scale.tolist() == [[119, 129]] * 3
    c = mxq.quantize(x.t().contiguous(), rowwise=False, colwise=True, scale_mode="floor")
    assert c.colwise_scale.shape == (2, 3) and c.colwise_scale[1].tolist() == [129] * 3


@pytest.mark.parametrize("shape", [(5,), (), (2, 3, 4, 33), (1, 1)])
def test_any_rank(shape):
    x = torch.randn(shape)
    t = mxq.quantize(x, rowwise=True, colwise=True)
    assert t.rowwise_data.shape == x.shape and t.shape == x.shape
    m, n = flat_dims(shape)
    assert t.rowwise_scale.shape == (m, -(-n // 32))
    flat = mxq.quantize(x.reshape(m, n), rowwise=True, colwise=True)
    assert torch.equal(t.rowwise_data.view(torch.uint8).reshape(m, n), flat.rowwise_data.view(torch.uint8))


@pytest.mark.parametrize("shape", [(0, 5), (7, 0), (0,), (2, 0, 3)])
def test_empty_tensors(shape):
    x = torch.empty(shape)
    t = mxq.quantize(x, rowwise=True, colwise=True, amax=True, scale_layout="swizzled")
    assert t.rowwise_data.shape == x.shape and t.amax.item() == 0.0
    op = mxq.fused_quant(dbias=True)(_ident)
    r = op(x)
    assert r.dbias.shape == (shape[-1],) and torch.all(r.dbias == 0)


def _ident(x):
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_is_nan_propagating_tensor_max(dtype):
    x = planted(50, 70, dtype, seed=9, specials=False)
    t = mxq.quantize(x, amax=True)
    assert t.amax.dtype == torch.float32 and t.amax.dim() == 0
    assert t.amax.item() == x.float().abs().max().item()
    x[3, 4] = float("nan")
    assert math.isnan(mxq.quantize(x, amax=True).amax.item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_dbias_close_to_float64_sum(dtype):
    x = planted(300, 70, dtype, seed=11, specials=False)

    @mxq.fused_quant(dbias=True, colwise=True)
    def scaled(x, alpha: float = 0.5):
        return x * alpha

    t = scaled(x)
    exact = (x.double() * 0.5).sum(0)
    assert t.dbias.dtype == dtype
    got = t.dbias.double()
    ulp = torch.finfo(dtype).eps * exact.abs().clamp_min(torch.finfo(dtype).tiny)
    assert torch.all((got - exact).abs() <= ulp), "within 1 ulp of the float64 sum"
    assert torch.equal(scaled(x).dbias, t.dbias), "deterministic"


@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "grouped"])
def test_dbias_of_a_view_is_its_contiguous_copys(grouped):
    """dbias is a function of the values, not of their layout: a column-major view gives its
    contiguous copy's dbias. Hand vector: a column whose float64 sum cancels (2^60 and -2^60 among
    ones), where summation order shows; with groups, each group's sum the same."""
    col = torch.ones(256)
    col[0], col[128] = 2.0 ** 60, -(2.0 ** 60)
    y = col[:, None].repeat(1, 64)
    view = y.t().contiguous().t()  # (the same values, column-major)
    assert torch.equal(view, y) and view.stride() == (1, 256)

    @mxq.fused_quant(dbias=True)
    def ident(x):
        return x

    kw = {"group_offsets": torch.tensor([160, 256], dtype=torch.int32)} if grouped else {}
    assert torch.equal(ident(view, **kw).dbias, ident(y, **kw).dbias)


def test_dbias_is_taken_before_the_dtype_round_trip():
    x = torch.full((4, 32), 1.0 + 2 ** -9, dtype=torch.bfloat16)

    @mxq.fused_quant(dbias=True)
    def third(x):
        return x * 0.3333333

    t = third(x)
    v32 = x.float() * torch.tensor(0.3333333, dtype=torch.float32)
    assert t.dbias.tolist() == v32.sum(0, dtype=torch.float64).float().to(torch.bfloat16).tolist()


def test_noop_writes_nothing():
    x = planted(40, 70, seed=2)
    spec_kwargs = dict(rowwise=True, colwise=True, amax=True, scale_layout="swizzled")
    out = mxq.quantize(torch.randn(40, 70), **spec_kwargs)
    before = {k: getattr(out, k).clone() for k in ("rowwise_data", "colwise_data", "rowwise_scale",
                                                    "colwise_scale", "amax")}
    r = mxq.quantize(x, noop=torch.ones(1), out=out, **spec_kwargs)
    assert r is out
    for k, v in before.items():
        assert same_bytes(getattr(out, k), v), k
    mxq.quantize(x, noop=torch.zeros(1), out=out, **spec_kwargs)  # 0.0: runs
    assert torch.equal(out.rowwise_scale, mxq.quantize(x, **spec_kwargs).rowwise_scale)

    @mxq.fused_quant(act="gelu", dbias=True)
    def g(x):
        return x

    o2 = g(x)
    db = o2.dbias.clone()
    g(x * 2, noop=torch.tensor([1.0]), out=o2)
    assert same_bytes(o2.dbias, db)


def test_dequantize_round_trip():
    x = planted(64, 96, seed=4, specials=False)
    for fmt, rel in (("e4m3", 2 ** -4), ("e5m2", 2 ** -3)):
        t = mxq.quantize(x, fp8=fmt, rowwise=True, colwise=True)
        for direction in ("rowwise", "colwise"):
            d = t.dequantize(direction)
            assert d.dtype == torch.float32 and d.shape == x.shape
            blockmax = x.abs().reshape(64, 3, 32).amax(-1, keepdim=True).expand(64, 3, 32).reshape(64, 96)
            err = (d - x).abs()
            assert torch.all(err <= rel * x.abs() + blockmax * 2.0 ** -9), direction
    nan = mxq.quantize(torch.tensor([[float("nan"), 1.0]]))
    assert torch.isnan(nan.dequantize()).all()
    with pytest.raises(ValueError, match="colwise_data"):
        mxq.quantize(x).dequantize("colwise")
    with pytest.raises(ValueError, match="direction"):
        mxq.quantize(x).dequantize("diagonal")


def _f64_act(name, x):
    t = torch.tanh
    s = torch.sigmoid
    return {
        "gelu": lambda: x * (0.5 + 0.5 * t(x * (0.79788456 + 0.03567741 * x * x))),
        "silu": lambda: x * s(x), "qgelu": lambda: x * s(1.702 * x),
        "relu": lambda: torch.where(x > 0, x, 0.0), "srelu": lambda: torch.where(x > 0, x * x, 0.0),
    }[name]()


def _f64_dact(name, x):
    t, s = torch.tanh, torch.sigmoid
    if name == "gelu":
        th = t(0.79788456 * x * (1 + 0.044715 * x * x))
        return 0.5 * x * ((1 - th * th) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + th)
    if name == "silu":
        return x * s(x) * (1 - s(x)) + s(x)
    if name == "qgelu":
        z = 1.702 * x
        return z * s(z) * (1 - s(z)) + s(z)
    if name == "relu":
        return (x > 0).double()
    return torch.where(x > 0, 2 * x, 0.0)


@pytest.mark.parametrize("name", mxq.frontend.spec.ACTIVATIONS)
def test_activation_formulas(name):
    x = torch.linspace(-6, 6, 1001, dtype=torch.float32)
    fwd = activations.FORWARD[name](x)  # eager torch
    ir_fwd = mxq.frontend.ir.evaluate(activations.act_ir(name).expr, [x], [])
    assert torch.equal(fwd, ir_fwd), "eager and IR evaluation are the same computation"
    assert torch.allclose(fwd.double(), _f64_act(name, x.double()), rtol=1e-5, atol=1e-6)
    bwd = mxq.frontend.ir.evaluate(activations.dact_ir(name).expr, [x], [])
    assert torch.allclose(bwd.double(), _f64_dact(name, x.double()), rtol=1e-5, atol=1e-5)


def test_relu_family_specials():
    x = torch.tensor([float("nan"), -0.0, 0.0, -1.0, 2.0, float("inf"), -float("inf")])
    ev = lambda ep: mxq.frontend.ir.evaluate(ep.expr, [x], []).tolist()  # noqa: E731
    assert ev(activations.act_ir("relu"))[1:] == [0.0, 0.0, 0.0, 2.0, math.inf, 0.0]
    assert ev(activations.act_ir("relu"))[0] == 0.0
    assert math.copysign(1, ev(activations.act_ir("relu"))[1]) == 1.0  # -0 -> +0
    assert ev(activations.dact_ir("relu")) == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert ev(activations.act_ir("srelu")) == [0.0, 0.0, 0.0, 0.0, 4.0, math.inf, 0.0]
    assert ev(activations.dact_ir("srelu")) == [0.0, 0.0, 0.0, 0.0, 4.0, math.inf, 0.0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["gelu", "relu"])
def test_act_and_dact_pipeline(dtype, name):
    x = planted(40, 64, dtype, seed=21, specials=False)
    g = planted(40, 64, dtype, seed=22, specials=False)
    fwd = mxq.fused_quant(act=name, colwise=True)(_ident)(x)
    v = activations.FORWARD[name](x.float())
    if dtype != torch.float32:
        v = v.to(dtype).float()  # step 5
    data, _ = _oracle_rows(v)  # expected bytes from tests/oracle.py, not from mxq
    assert torch.equal(fwd.rowwise_data.view(torch.uint8), data)
    _, col_scale = _oracle_rows(v.t())
    assert torch.equal(fwd.colwise_scale, col_scale.t())
    bwd = mxq.fused_quant(dact=name, dbias=True)(_ident)(g, act_input=x)
    v = g.float() * mxq.frontend.ir.evaluate(activations.dact_ir(name).expr, [x.float()], [])
    assert torch.equal(bwd.dbias, v.sum(0, dtype=torch.float64).float().to(dtype))
    if dtype != torch.float32:
        v = v.to(dtype).float()
    data, scale = _oracle_rows(v)
    assert torch.equal(bwd.rowwise_data.view(torch.uint8), data) and torch.equal(bwd.rowwise_scale, scale)


def _oracle_rows(v, fmt="e4m3", mode="rceil"):
    """Rowwise MXFP8 of fp32 ``v`` by tests/oracle.py: (data bytes, compact scales) as uint8."""
    data, scales = oracle.quantize_rows(v.tolist(), fmt, mode)
    return torch.tensor(data, dtype=torch.uint8), torch.tensor(scales, dtype=torch.uint8)


def test_input_dtypes_widen_exactly():
    x = planted(32, 64, torch.float32, seed=8, specials=False)
    for dtype in (torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        a = mxq.quantize(xd, scale_mode="even", fp8="e5m2")
        b = mxq.quantize(xd.float(), scale_mode="even", fp8="e5m2")
        assert torch.equal(a.rowwise_data.view(torch.uint8), b.rowwise_data.view(torch.uint8))
        assert torch.equal(a.rowwise_scale, b.rowwise_scale)
