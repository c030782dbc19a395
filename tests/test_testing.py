"""The comparison helpers used by the GPU tests and the device check catch what they must."""

import torch

import mxq
from mxq.testing import compare, padded_rows, planted, poisoned, v_abs_sum


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
