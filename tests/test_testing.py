"""The comparison helpers used by the GPU tests and the device check catch what they must."""

import pytest
import torch

import mxq
from mxq.testing import DACT_SLACK, V_SLACK, compare, padded_rows, planted, poisoned, v_abs_sum, v_bound, v_weight


def test_compare_flags_a_single_byte_and_accepts_equal():
    x = planted(40, 70, torch.bfloat16, seed=1)
    want = mxq.quantize(x, rowwise=True, colwise=True, amax=True)
    got = mxq.quantize(x, rowwise=True, colwise=True, amax=True)
    assert compare(got, want, exact=True) == []
    got.colwise_data.view(torch.uint8)[3, 4] ^= 1
    assert compare(got, want, exact=True) == ["colwise_data: 1 bytes differ (worst by 1)"]
    assert compare(got, want, exact=False) == []  # one code, one byte: allowed in the transcendental class
    got.rowwise_scale[0, 0] ^= 2
    assert any("rowwise_scale" in p for p in compare(got, want, exact=True))
    got.amax.fill_(1.0)
    assert any("amax" in p for p in compare(got, want, exact=False))


def test_poisoned_outputs_are_not_valid_results():
    op = mxq.fused_quant(colwise=True, dbias=True, amax=True)(lambda_free)
    x = planted(40, 70, seed=2)
    out = poisoned(op, x)
    assert compare(out, op.reference(x), exact=False) != []
    assert compare(op(x, out=out), op.reference(x), exact=True) == []


def lambda_free(x):
    return x


def test_dbias_slack_grows_with_the_columns_sum_of_abs_v_outside_the_exact_class():
    """Column 0 of v = (1e4, -1e4, 1) sums to 1, and one fp32 ulp of either big value is ~1e-3:
    a kernel whose v differs from the reference's in the last bits of an element (the
    transcendental class) can be a thousand ulps of that sum off. compare() allows
    V_SLACK x sum |v| (here 20001 x 2^-21 = 9.5e-3) only when given v_abs and outside the exact
    class, and none where sum |v| is infinite."""
    op = mxq.fused_quant(colwise=True, dbias=True)(lambda_free)
    x = torch.zeros(3, 32)
    x[0, 0], x[1, 0], x[2, 0] = 1e4, -1e4, 1.0
    v_abs = v_abs_sum(op, x)
    assert v_abs[0].item() == 20001.0 and v_abs[1].item() == 0.0
    want = op.reference(x)
    assert want.dbias[0].item() == 1.0
    got = op.reference(x)
    got.dbias[0] = 1.005
    assert compare(got, want, exact=False) == ["dbias: 1 of 32 columns off by more than 1 ulp"]
    assert compare(got, want, exact=False, v_abs=v_abs) == []
    assert compare(got, want, exact=True, v_abs=v_abs) != []
    assert compare(got, want, exact=False, v_abs=torch.where(v_abs > 0, float("inf"), 0.0)) != []
    got.dbias[0] = 1.02
    assert compare(got, want, exact=False, v_abs=v_abs) != []


def test_dbias_slack_of_a_builtin_dact_is_absolute_in_dact():
    """One row: dbias is v = d * dgelu(a) itself. Where dgelu(a) is small the kernels' value
    (fast tanh, good to ~2^-24 absolute; `1 - t * t` cancels) is off from the reference's by far
    more than V_SLACK relative: the slack adds DACT_SLACK x |d| (1 + |a|) per element. By hand:
    d = 3, a = -3 gives the weight 3 * 4 * 2^-20 / 2^-21 = 24 on top of |v|."""
    op = mxq.fused_quant(colwise=True, dbias=True, dact="gelu")(lambda_free)
    d = torch.full((1, 32), 3.0)
    a = torch.full((1, 32), -3.0)
    want = op.reference(d, act_input=a)
    v = want.dbias[0].item()
    assert abs(v) < 0.05  # 3 * dgelu(-3) = 3 * -0.0119...
    v_abs = v_abs_sum(op, d, act_input=a)
    assert abs(v_abs[0].item() - (abs(v) + 24.0)) < 1e-6
    plain = mxq.fused_quant(colwise=True, dbias=True, act="gelu")(lambda_free)  # no dact: |v| alone
    assert torch.equal(v_abs_sum(plain, d), plain.reference(d).dbias.abs().double())
    got = op.reference(d, act_input=a)
    got.dbias[0] = v + 2.0 ** -22 * 3.0 * 4.0  # within the dact slack (24 x 2^-21 = 1.1e-5)
    assert compare(got, want, exact=False, v_abs=torch.full_like(v_abs, abs(v))) != []  # |v| alone: too tight
    assert compare(got, want, exact=False, v_abs=v_abs) == []
    got.dbias[0] = v + 2.0 ** -18 * 3.0 * 4.0
    assert compare(got, want, exact=False, v_abs=v_abs) != []


def _one_block(codes_up: int, bound=None):
    """compare() of an e5m2 row [2, 2^-24, 0, ...] (scale 2^-14: 2^-24 is the code 2^-10) against
    itself with the byte of 2^-24 moved ``codes_up`` codes up, under ``bound`` at that element
    (zero elsewhere; None: no v_bound)."""
    op = mxq.fused_quant(fp8="e5m2")(lambda_free)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 2.0, 2.0 ** -24
    want = op.reference(x)
    assert want.rowwise_scale[0, 0].item() == 127 - 14 and want.rowwise_data[0, 1].item() == 2.0 ** -10
    got = op.reference(x)
    got.rowwise_data.view(torch.uint8)[0, 1] += codes_up
    if bound is not None:
        bound = torch.zeros(1, 32, dtype=torch.float64).index_fill_(1, torch.tensor([1]), bound)
    return compare(got, want, exact=False, v_bound=bound)


def test_compare_holds_a_byte_past_one_code_to_the_bound_on_v():
    """4 codes up from 2^-10 (e5m2: 1, 1.25, 1.5, 1.75, 2 x 2^-10) decodes to 2^-23 for the
    reference's 2^-24: 2^-24 apart. Half a code of each (2^-13 and 2^-12 of the block's 2^-14
    scale: 3 x 2^-27) leaves 5 x 2^-27 for the bound on v. One code is always allowed, two never
    without a bound."""
    assert _one_block(1) == []
    assert _one_block(2) == ["rowwise_data: 1 bytes differ (worst by 2); 1 by more than one code"]
    assert _one_block(4) != []
    assert _one_block(4, 2.0 ** -24) == []
    assert _one_block(4, 5 * 2.0 ** -27) == []
    assert _one_block(4, 4.9 * 2.0 ** -27) == ["rowwise_data: 1 bytes differ (worst by 4); 1 by more than one "
                                               "code outside v_bound"]
    # 2 codes: 2^-11 x 2^-14 = 4 x 2^-27 apart, half a code of each 2^-27 (one binade)
    assert _one_block(2, 2 * 2.0 ** -27) == []
    assert _one_block(2, 1.9 * 2.0 ** -27) != []


def test_compare_bound_reaches_across_zero_and_keeps_nan():
    """Near a root of dact the two values can have opposite signs: bytes 0x01 and 0x81 are 128
    apart as codes, yet 2 x 2^-16 x 2^-14 apart decoded (e5m2's smallest subnormal 2^-16 of the
    block's 2^-14 scale). A NaN data byte is never inside a bound."""
    op = mxq.fused_quant(fp8="e5m2", colwise=True)(lambda_free)
    x = torch.zeros(32, 32)
    x[0, :], x[:, 0], x[1, 1] = 2.0, 2.0, 2.0 ** -30
    want = op.reference(x)
    got = op.reference(x)
    for t in (got.rowwise_data, got.colwise_data):
        assert t.view(torch.uint8)[1, 1].item() == 0x01
        t.view(torch.uint8)[1, 1] = 0x81
    tight = torch.zeros(32, 32, dtype=torch.float64)
    tight[1, 1] = 2.0 ** -30  # + half a code of each (2^-31 each): 2^-29, just the distance
    assert compare(got, want, exact=False, v_bound=tight) == []
    assert len(compare(got, want, exact=False, v_bound=tight / 2)) == 2
    got.rowwise_data.view(torch.uint8)[1, 1] = 0x7F
    assert compare(got, want, exact=False, v_bound=torch.full((32, 32), float("inf"))) != []


def test_v_weight_by_hand():
    """|v|, plus DACT_SLACK / V_SLACK = 2 times the factor the derivative multiplies: |d| (1 + |a|)
    for dact=; for a gated backward |d u| (1 + |g|) on the gate half, nothing on the up half
    (d * act(g)). A gated op and its inner op over the halves give the same weights; v_abs_sum
    is their column sum."""
    k = DACT_SLACK / V_SLACK
    assert k == 2.0
    op = mxq.fused_quant(dact="gelu")(lambda_free)
    d, a = torch.full((1, 32), 3.0), torch.full((1, 32), -3.0)
    w = v_weight(op, d, act_input=a)
    assert w.dtype == torch.float64 and abs(w[0, 0].item() - (3.0 * 0.011584 + k * 3.0 * 4.0)) < 1e-5  # dgelu(-3)
    assert torch.equal(v_abs_sum(op, d, act_input=a), w.sum(0))
    plain = mxq.fused_quant(act="silu")(lambda_free)
    assert torch.equal(v_weight(plain, d), (d * torch.sigmoid(d)).abs().double())
    gen = torch.Generator().manual_seed(5)
    grad, a = torch.randn(2, 32, generator=gen), torch.randn(2, 64, generator=gen) * 2
    g, u = a[:, :32], a[:, 32:]
    bwd = mxq.fused_quant(dact="swiglu", dbias=True)(lambda_free)
    w = v_weight(bwd, grad, act_input=a)
    s = torch.sigmoid(g)
    v_gate, v_up = (grad * u) * (g * (s * (1.0 - s)) + s), grad * (g * s)
    want_gate = v_gate.abs().double() + k * (grad * u).abs().double() * (1 + g.abs().double())
    assert torch.allclose(w[:, :32], want_gate, rtol=1e-6)
    assert torch.allclose(w[:, 32:], v_up.abs().double(), rtol=1e-6)
    assert torch.equal(w, v_weight(bwd.inner, grad, g, u, 0.0))
    assert torch.equal(v_abs_sum(bwd, grad, act_input=a), w.sum(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_v_bound_by_hand(dtype):
    """fp32 inputs: V_SLACK x v_weight. bf16/fp16: step 5 rounds v to the input dtype, so the
    bound is how far the rounded v can move within V_SLACK x v_weight: one step of the dtype for
    v on a tie (1 + eps/2 and 1 + 3 eps/2, which round down and up: v - B and v + B round to
    two neighbours), 0 for v
    inside a rounding interval (3 + eps/2, 0 + eps/2: 1/4 of a step from ties, and 0). inf: 0."""
    eps = torch.finfo(dtype).eps if dtype != torch.float32 else torch.finfo(torch.bfloat16).eps
    op = mxq.fused_quant()(_plus_half_step(eps / 2))
    x = torch.tensor([[1.0, 3.0, 0.0, float("inf"), 1.0 + eps] * 8]).to(dtype)
    w, b = v_weight(op, x), v_bound(op, x)
    assert w[0, 0].item() == 1.0 + eps / 2
    if dtype == torch.float32:
        assert torch.equal(b[0, [0, 1, 2, 4]], V_SLACK * w[0, [0, 1, 2, 4]])
    else:
        assert b[0, :5].tolist() == [eps, 0.0, 0.0, 0.0, eps]  # (1 + 3 eps / 2: a tie rounding up)
    assert b[0, 3].item() == 0.0


def _plus_half_step(c):
    def plus(x):
        return x + c
    return plus


QGELU_ROOT = -0.7511542  # dqgelu(a) = z s (1 - s) + s, z = 1.702 a, s = sigmoid(z), is 0 here (to 1e-7)


def test_qgelu_root():
    a = torch.tensor([QGELU_ROOT - 1e-6, QGELU_ROOT + 1e-6], dtype=torch.float64)
    z = 1.702 * a
    s = torch.sigmoid(z)
    d = z * s * (1 - s) + s
    assert d[0].item() < 0 < d[1].item()


@pytest.mark.gpu
def test_dact_bytes_next_to_a_root_of_the_derivative_are_held_to_the_bound_on_v():
    """An fp32 dact="qgelu" + dbias, e5m2, rowwise and colwise, 2048 x 4096: act_input normal,
    with 1 in 4096 elements within 64 fp32 ulps of the derivative's root. There v = d * dqgelu(a)
    is tiny next to its block's amax, e5m2's codes there are fine (subnormals of a scale set by
    values ~3), and the kernels' derivative, accurate to DACT_SLACK (1 + |a|) absolute, lands
    some bytes several codes (or a sign) away from the reference's: the old one-code rule
    refuses them, the class of docs/NUMERICS.md (within v_bound plus half a code of each)
    accepts them, and at most 1 in 1e4 bytes differ at all."""
    op = mxq.fused_quant(rowwise=True, colwise=True, fp8="e5m2", dact="qgelu", dbias=True)(lambda_free)
    m, n = 2048, 4096
    gen = torch.Generator().manual_seed(0)
    d = torch.randn(m, n, generator=gen)
    a = torch.randn(m, n, generator=gen)
    near = torch.randperm(m * n, generator=gen)[: m * n // 4096]
    ulps = torch.randint(-64, 65, near.shape, generator=gen, dtype=torch.int32)
    a.view(-1)[near] = (torch.tensor(QGELU_ROOT).view(torch.int32) + ulps).view(torch.float32)
    want = op.reference(d, act_input=a)
    got = op(d.cuda(), act_input=a.cuda(), out=poisoned(op, d.cuda()))
    v_abs = v_abs_sum(op, d, act_input=a)
    assert compare(got, want, False, v_abs, v_bound=v_bound(op, d, act_input=a)) == []
    old = compare(got, want, False, v_abs)
    assert old and all("by more than one code" in p for p in old), old  # else the class could be one code again


def test_padded_rows_by_hand():
    """padded_rows: the whole rows of FP8 data, padding included, for 2-D and N-D data whose
    size-1 leading dimensions carry any stride (a [4, 1, 13] view of 16-byte rows: (16, 13, 1))."""
    spec = mxq.QuantSpec(rowwise=True)
    for shape, rows in (((6, 13), 6), ((4, 1, 13), 4), ((2, 3, 13), 6), ((5, 16), 5)):
        d = mxq.MXFP8Tensor.empty(spec, shape, torch.bfloat16, "cpu").rowwise_data
        p = padded_rows(d)
        assert p.shape == (rows, 16), (shape, p.shape)
        p.fill_(7)
        assert bool((d.view(torch.uint8) == 7).all())
