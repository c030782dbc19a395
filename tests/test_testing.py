"""The comparison helpers used by the GPU tests and the device check catch what they must."""

import pytest
import torch

import mxq
from tests import fast_math
from mxq.testing import (ACT_SLACK, DACT_SLACK, V_SLACK, VBound, byte_diff, compare, padded_rows, planted, poisoned, v_abs_sum,
                         v_bound, v_weight)


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
    from dataclasses import replace

    op = mxq.fused_quant(dbias=True)(_ident)
    full = op(x.float())
    for field in ("amax", "dbias"):  # (a field the reference has and the result lacks: named, not an AttributeError)
        ref = replace(full, amax=full.dbias.new_zeros(()).float()) if field == "amax" else full
        assert f"{field}: missing" in compare(replace(full, **{field: None}), ref, exact=True)
    # (and a field the result has where the reference has none: another spec's result, not a pass)
    rowwise = mxq.quantize(x, amax=True)
    assert compare(want, rowwise, exact=True) == [
        "colwise_data, colwise_scale: present where the reference has none"]
    assert compare(full, replace(full, dbias=None), exact=False) == ["dbias: present where the reference has none"]


def test_compare_reads_a_grouped_amax_entry_by_entry():
    """A grouped NVFP4 call's amax holds one value per group: each entry compared by its bits (a
    NaN for a NaN), a transcendental-class entry within rtol 1e-5."""
    offs = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    x = planted(9, 32, torch.bfloat16, seed=4, specials=False)
    op = mxq.fused_quant(format="nvfp4")(lambda_free)
    want = op.reference(x, group_offsets=offs)
    got = op.reference(x, group_offsets=offs)
    assert want.amax.shape == (4,) and compare(got, want, exact=True) == []
    got.amax[3] = torch.nextafter(got.amax[3], torch.tensor(float("inf")))
    assert [p for p in compare(got, want, exact=True) if p.startswith("amax")] != []
    assert [p for p in compare(got, want, exact=False) if p.startswith("amax")] == []
    got.amax[3] *= 1.001
    assert [p for p in compare(got, want, exact=False) if p.startswith("amax")] != []
    for wrong in (want.amax[:1].clone(), want.amax[:3].clone(), want.amax.double()):  # (no broadcasting)
        got.amax = wrong
        assert [p for p in compare(got, want, exact=False) if p.startswith("amax")] != [], wrong


def _ident(x):
    return x


def _scaled(x, s: float = 2.0):
    return x * s


def _over(x, y):
    return x / y


def test_is_exact_names_the_exact_class_of_every_kind_of_op():
    """docs/NUMERICS.md's exact class, written out by hand: the plain cast, relu/srelu and their
    derivatives, reglu/sreglu (forward and backward), arithmetic epilogues; not gelu, silu, qgelu,
    swiglu, geglu, qgeglu (either direction) nor division. Gated ops are judged by their inner
    op (a gated op's own spec names the gated act, which no element-wise list holds)."""
    from mxq.testing import is_exact

    exact = {"relu", "srelu", "reglu", "sreglu"}
    for name in ("gelu", "silu", "relu", "qgelu", "srelu", "swiglu", "geglu", "reglu", "qgeglu", "sreglu"):
        for key in ("act", "dact"):
            for fmt in ("mxfp8", "fp8_block"):
                op = mxq.fused_quant(format=fmt, colwise=True, **{key: name})(_ident)
                assert is_exact(op) == (name in exact), (name, key, fmt)
    assert is_exact(mxq.fused_quant()(_ident)) and is_exact(mxq.fused_quant()(_scaled))
    assert not is_exact(mxq.fused_quant(colwise=True)(_over))


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
    plain = mxq.fused_quant(colwise=True, dbias=True, act="gelu")(lambda_free)  # act=: |v| + ACT_SLACK / V_SLACK |a|
    assert torch.equal(v_abs_sum(plain, d), plain.reference(d).dbias.abs().double() + 0.5 * 3.0)
    got = op.reference(d, act_input=a)
    got.dbias[0] = v + 2.0 ** -22 * 3.0 * 4.0  # within the dact slack (24 x 2^-21 = 1.1e-5)
    assert compare(got, want, exact=False, v_abs=torch.full_like(v_abs, abs(v))) != []  # |v| alone: too tight
    assert compare(got, want, exact=False, v_abs=v_abs) == []
    got.dbias[0] = v + 2.0 ** -18 * 3.0 * 4.0
    assert compare(got, want, exact=False, v_abs=v_abs) != []


def _one_block(codes_up: int, b=None):
    """compare() of an e5m2 row [2, 2^-24, 0, ...] (scale 2^-14: 2^-24 is the code 2^-10) against
    itself with the byte of 2^-24 moved ``codes_up`` codes up, under the interval v +- ``b`` at
    that element (v exactly elsewhere; None: no v_bound)."""
    op = mxq.fused_quant(fp8="e5m2")(lambda_free)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 2.0, 2.0 ** -24
    want = op.reference(x)
    assert want.rowwise_scale[0, 0].item() == 127 - 14 and want.rowwise_data[0, 1].item() == 2.0 ** -10
    got = op.reference(x)
    got.rowwise_data.view(torch.uint8)[0, 1] += codes_up
    bound = None
    if b is not None:
        slack = torch.zeros(1, 32, dtype=torch.float64).index_fill_(1, torch.tensor([1]), b)
        bound = VBound(x.double() - slack, x.double() + slack)
    return compare(got, want, exact=False, v_bound=bound)


def test_compare_holds_a_byte_past_one_code_to_the_bound_on_v():
    """4 codes up from 2^-10 (e5m2: 1, 1.25, 1.5, 1.75, 2 x 2^-10) is 2^-9, the code of the
    values from 1.875 x 2^-10 (a tie, rounding to the even 2^-9) of the block's 2^-14 scale:
    the byte is explained by an interval reaching 0.875 x 2^-24 = 7 x 2^-27 above v. Below
    that, the interval's top code is 1.75 x 2^-10 (above the tie 1.625 x 2^-10: past 5 x 2^-27):
    one code beyond it, allowed as the 1 in 1e4 (at least one byte); from 1.25 x 2^-10 (below
    the tie 1.375 x 2^-10: 3 x 2^-27) the byte is 3 codes beyond, never allowed. Without an
    interval: one code from the reference's byte allowed, two never."""
    assert _one_block(1) == []
    assert _one_block(2) == ["rowwise_data: 1 bytes differ (worst by 2); 1 by more than one code"]
    assert _one_block(4) != []
    assert _one_block(4, 2.0 ** -24) == []
    assert _one_block(4, 7 * 2.0 ** -27) == []
    assert _one_block(4, 5.1 * 2.0 ** -27) == []  # one code past the interval
    assert _one_block(4, 2.9 * 2.0 ** -27) == ["rowwise_data: 1 bytes differ (worst by 4); 1 outside v_bound, "
                                               "1 of them by more than one code"]
    assert _one_block(2, 3 * 2.0 ** -27) == []
    assert _one_block(2, 0.9 * 2.0 ** -27) != []  # (the interval's codes: 2^-10 alone; 2 codes past it)
    assert _one_block(1, 0.0) == []  # one code, one byte: allowed outside the interval too


def test_compare_counts_only_the_bytes_outside_the_interval():
    """1 in 1e4 data bytes may be outside v_bound (each one code off); inside it any number may
    differ, by any number of codes. 64 x 32 elements allow one byte outside: two fail."""
    op = mxq.fused_quant(fp8="e5m2")(lambda_free)
    x = torch.zeros(64, 32)
    x[:, 0], x[:, 1] = 2.0, 2.0 ** -24
    want = op.reference(x)
    got = op.reference(x)
    got.rowwise_data.view(torch.uint8)[:, 1] += 4
    wide = torch.zeros(64, 32, dtype=torch.float64)
    wide[:, 1] = 2.0 ** -24
    assert compare(got, want, exact=False, v_bound=VBound(x.double() - wide, x.double() + wide)) == []
    assert compare(got, want, exact=False) == ["rowwise_data: 64 bytes differ (worst by 4); 64 by more than one code"]
    got = op.reference(x)
    got.rowwise_data.view(torch.uint8)[:2, 1] += 1
    exact_v = VBound(x.double(), x.double())
    assert compare(got, want, exact=False, v_bound=exact_v) == [
        "rowwise_data: 2 bytes differ (worst by 1); 2 outside v_bound, 0 of them by more than one code"]
    got.rowwise_data.view(torch.uint8)[1, 1] -= 1
    assert compare(got, want, exact=False, v_bound=exact_v) == []
    with pytest.raises(TypeError, match="v_bound must be a VBound"):
        compare(got, want, exact=False, v_bound=wide)


def test_compare_bound_reaches_across_zero_and_keeps_nan():
    """Near a root of dact the two values can have opposite signs: bytes 0x01 and 0x81 (e5m2's
    smallest subnormal 2^-16 of the block's 2^-14 scale, +-2^-30) are 128 apart as codes. v =
    2^-30: -2^-30 is the code of v down to the tie -2^-31 exclusive (the tie rounds to -0), so
    the interval must reach more than 1.5 x 2^-30 below v. Short of that, its codes run from -0
    to 2^-30 and 0x81 is one code beyond them (allowed as the 1 in 1e4, one byte here); with v
    alone, two codes (never). A NaN data byte is never inside an interval."""
    op = mxq.fused_quant(fp8="e5m2", colwise=True)(lambda_free)
    x = torch.zeros(32, 32)
    x[0, :], x[:, 0], x[1, 1] = 2.0, 2.0, 2.0 ** -30
    want = op.reference(x)
    got = op.reference(x)
    for t in (got.rowwise_data, got.colwise_data):
        assert t.view(torch.uint8)[1, 1].item() == 0x01
        t.view(torch.uint8)[1, 1] = 0x81
    tight = torch.zeros(32, 32, dtype=torch.float64)
    tight[1, 1] = 1.6 * 2.0 ** -30
    v = x.double()
    assert compare(got, want, exact=False, v_bound=VBound(v - tight, v)) == []
    assert compare(got, want, exact=False, v_bound=VBound(v - tight * (1.5 / 1.6), v)) == []
    assert compare(got, want, exact=False, v_bound=VBound(v, v)) == [
        f"{d}_data: 1 bytes differ (worst by 128); 1 outside v_bound, 1 of them by more than one code"
        for d in ("rowwise", "colwise")]
    got.rowwise_data.view(torch.uint8)[1, 1] = 0x7F
    inf = torch.full((32, 32), float("inf"), dtype=torch.float64)
    assert compare(got, want, exact=False, v_bound=VBound(-inf, inf)) != []


def test_v_weight_by_hand():
    """|v|, plus DACT_SLACK / V_SLACK = 2 times the factor the derivative multiplies: |d| (1 + |a|)
    for dact=; ACT_SLACK / V_SLACK times |a| for act= (gelu, silu, qgelu; a its argument); for a gated backward |d u| (1 + |g|) on the gate half, nothing on the up half
    (d * act(g)). A gated op and its inner op over the halves give the same weights; v_abs_sum
    is their column sum."""
    k = DACT_SLACK / V_SLACK
    assert k == 2.0
    op = mxq.fused_quant(dact="gelu")(lambda_free)
    d, a = torch.full((1, 32), 3.0), torch.full((1, 32), -3.0)
    w = v_weight(op, d, act_input=a)
    assert w.dtype == torch.float64 and abs(w[0, 0].item() - (3.0 * 0.011584 + k * 3.0 * 4.0)) < 1e-5  # dgelu(-3)
    assert torch.equal(v_abs_sum(op, d, act_input=a), w.sum(0))
    plain = mxq.fused_quant(act="silu")(lambda_free)  # (act=: ACT_SLACK / V_SLACK = 1/2 times |a|, a = d here)
    assert ACT_SLACK / V_SLACK == 0.5
    assert torch.equal(v_weight(plain, d), (d * torch.sigmoid(d)).abs().double() + 0.5 * 3.0)
    assert torch.equal(v_weight(mxq.fused_quant(act="relu")(lambda_free), d), d.double())  # (relu: exact, |v|)
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
    """fp32 inputs: v +- V_SLACK x v_weight. bf16/fp16: step 5 rounds v to the input dtype, so
    the interval's ends are v - B and v + B rounded: a step of the dtype wide for v on a tie
    (1 + eps/2 and 1 + 3 eps/2 round down and up: v - B and v + B round to two neighbours),
    v rounded alone for v inside a rounding interval (3 + eps/2, 0 + eps/2: 1/4 of a step from
    ties, and 0). inf: inf alone."""
    eps = torch.finfo(dtype).eps if dtype != torch.float32 else torch.finfo(torch.bfloat16).eps
    op = mxq.fused_quant()(_plus_half_step(eps / 2))
    x = torch.tensor([[1.0, 3.0, 0.0, float("inf"), 1.0 + eps] * 8]).to(dtype)
    w, b = v_weight(op, x), v_bound(op, x)
    assert w[0, 0].item() == 1.0 + eps / 2
    if dtype == torch.float32:
        v = x.double() + torch.tensor(eps / 2, dtype=torch.float32).double()
        at = [0, 1, 2, 4]
        assert torch.equal(b.lo[0, at], v[0, at] - V_SLACK * w[0, at])
        assert torch.equal(b.hi[0, at], v[0, at] + V_SLACK * w[0, at])
    else:
        assert b.lo[0, :5].tolist() == [1.0, 3.0, eps / 2, float("inf"), 1.0 + eps]
        assert b.hi[0, :5].tolist() == [1.0 + eps, 3.0, eps / 2, float("inf"), 1.0 + 2 * eps]
    assert b.lo[0, 3].item() == b.hi[0, 3].item() == float("inf")
    assert torch.equal(b[1:].lo, b.lo[1:])  # rows, as a group's


def _plus_half_step(c):
    def plus(x):
        return x + c
    return plus


def test_roots_of_the_derivatives():
    """dgelu, dsilu and dqgelu change sign once each, near -0.7525, -1.2785 and -0.7512
    (tests/fast_math.root: fp64 bisection of the formulas)."""
    for name, where in (("gelu", -0.7524614), ("silu", -1.2784645), ("qgelu", -0.7511542)):
        r = fast_math.root(name)
        assert abs(r - where) < 1e-7, (name, r)
        a = torch.tensor([r - 1e-6, r + 1e-6], dtype=torch.float64)
        d = fast_math.dact_formula_f64(name, a)
        assert d[0].item() < 0 < d[1].item()


def _near_root(name: str, a: torch.Tensor, gen, every: int, ulps: int) -> None:
    """Set 1 in ``every`` elements of ``a`` (fp32 or bf16) within ``ulps`` of its dtype of the
    root of dact ``name`` (in place)."""
    bits = torch.int32 if a.dtype == torch.float32 else torch.int16
    root = torch.tensor(fast_math.root(name)).to(a.dtype).view(bits).to(torch.int32)
    flat = a.view(-1)
    at = torch.randperm(flat.numel(), generator=gen)[: flat.numel() // every]
    k = torch.randint(-ulps, ulps + 1, at.shape, generator=gen, dtype=torch.int32)
    flat[at] = (root + k).to(bits).view(a.dtype)


@pytest.mark.parametrize("name", ["gelu", "silu", "qgelu"])
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_modelled_kernel_bytes_next_to_a_root_are_inside_the_class(name, fp8):
    """The kernels' derivative as tests/fast_math.py models it (ex2 and rcp off by random ulps
    up to their documented errors) on an fp32 dact op, rowwise and colwise, whose act_input is
    within 64 ulps of the derivative's root in 1 of 4 elements (d normal, 3.0 at one element of
    every row and column block, so the blocks' scales are set by values ~3): every data byte is
    the code of a v inside v_bound; in e5m2, bytes next to the root are many codes (or a sign)
    from the reference's, in numbers far past 1 in 1e4 (the one-code class is false there)."""
    op = mxq.fused_quant(rowwise=True, colwise=True, fp8=fp8, dact=name)(lambda_free)
    gen = torch.Generator().manual_seed(7)
    m, n = 128, 256
    d, a = torch.randn(m, n, generator=gen), torch.randn(m, n, generator=gen)
    _near_root(name, a, gen, 4, 64)
    d[::32, :], d[:, ::32], a[::32, :], a[:, ::32] = 3.0, 3.0, 3.0, 3.0

    def noise(k):
        return lambda shape: torch.randint(-k, k + 1, shape, generator=gen, dtype=torch.int32)

    v = d * fast_math.dact(name, a, noise(fast_math.EX2_ULPS), noise(fast_math.RCP_ULPS))
    got = mxq.fused_quant(rowwise=True, colwise=True, fp8=fp8)(lambda_free).reference(v)  # v's bytes
    want = op.reference(d, act_input=a)
    bound = v_bound(op, d, act_input=a)
    assert compare(got, want, False, v_bound=bound) == []
    if fp8 == "e5m2":  # (e4m3's codes near 0 are 2^14 times coarser: few bytes differ at all)
        one_code = compare(got, want, False)
        assert one_code and all("bytes differ" in p for p in one_code), one_code
        mid, half = (bound.hi + bound.lo) / 2, (bound.hi - bound.lo) / 2 / 256  # not vacuous: 256x tighter fails
        assert compare(got, want, False, v_bound=VBound(mid - half, mid + half)) != []


def test_hand_vectors_next_to_the_qgelu_root():
    """The case of the H200 by hand: an fp32 dact="qgelu" e5m2 row d = 2, act_input = the fp32
    values 0..30 ulps above the derivative's root, and 3.0 (v ~ 3.2, scale 2^-14: codes of
    2^-30 near 0). With ex2 and rcp each off by one of their extreme errors, bytes there are
    up to several codes from the reference's, and all of them inside v_bound."""
    op = mxq.fused_quant(fp8="e5m2", dact="qgelu")(lambda_free)
    root = torch.tensor(fast_math.root("qgelu"), dtype=torch.float32).view(torch.int32)
    a = (root + torch.arange(-1, 30, dtype=torch.int32)).view(torch.float32)
    a = torch.cat([torch.tensor([3.0]), a]).reshape(1, 32)
    d = torch.full((1, 32), 2.0)
    want = op.reference(d, act_input=a)
    assert want.rowwise_scale[0, 0].item() == 127 - 14
    bound = v_bound(op, d, act_input=a)
    cast = mxq.fused_quant(fp8="e5m2")(lambda_free)
    worst = 0
    for e, r in ((-2, -1), (-2, 1), (2, -1), (2, 1)):
        got = cast.reference(d * fast_math.dact("qgelu", a, e, r))
        worst = max(worst, byte_diff(got.rowwise_data[:, 1:], want.rowwise_data[:, 1:])[1])
        assert compare(got, want, False, v_bound=bound) == [], (e, r)
    assert worst >= 4, worst


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["qgelu", "gelu", "silu", "qgeglu", "geglu", "swiglu"])
def test_dact_bytes_next_to_a_root_of_the_derivative_are_held_to_the_bound_on_v(name, dtype):
    """A dact op with dbias, e5m2, rowwise and colwise, 1024 x 4096 (gated: 2 x 2048 columns):
    act_input normal (the gate half for a gated name), with 1 in 4 of those elements within 256
    ulps (fp32) or 8 ulps (bf16) of the derivative's root. There v = d * dact(a) is tiny next
    to its block's amax, e5m2's codes there are fine (subnormals of a scale set by values ~3),
    and the kernels' derivative, accurate to DACT_SLACK (1 + |a|) absolute, lands bytes several
    codes (or a sign) from the reference's: every data byte is the code of a v inside v_bound
    (compare's rule); fp32 breaks the one-code rule (bytes more than one code off, ~1% of the
    bytes off in a model of the kernels, and as many with exact ex2 and rcp). CPU counterpart:
    test_modelled_kernel_bytes_next_to_a_root_are_inside_the_class."""
    from mxq.frontend.spec import GATED_ACTIVATIONS

    op = mxq.fused_quant(rowwise=True, colwise=True, fp8="e5m2", dact=name, dbias=True)(lambda_free)
    gated = name in GATED_ACTIVATIONS
    inner = GATED_ACTIVATIONS.get(name, name)
    m, n = 1024, 4096
    gen = torch.Generator().manual_seed(0)
    d = torch.randn(m, n // 2 if gated else n, generator=gen).to(dtype)
    a = torch.randn(m, n, generator=gen).to(dtype)
    gate = a[:, : n // 2].contiguous() if gated else a
    _near_root(inner, gate, gen, 4, 256 if dtype == torch.float32 else 8)
    if gated:
        a[:, : n // 2] = gate
    want = op.reference(d, act_input=a)
    got = op(d.cuda(), act_input=a.cuda(), out=poisoned(op, d.cuda()))
    v_abs = v_abs_sum(op, d, act_input=a)
    assert compare(got, want, False, v_abs, v_bound=v_bound(op, d, act_input=a)) == []
    if dtype == torch.float32:
        assert compare(got, want, False, v_abs) != []  # else the class could be one code again


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


def test_compare_reads_the_transposed_copy_at_its_elements():
    """compare's class check of FP8 block scaling's transposed colwise copy ([N, M]) reads each
    byte at its element [i, j] of [M, N] (testing._data_mn, _decoded): the decoded value at (i, j)
    is the dequantized tensor's there, on a non-square shape."""
    from mxq.testing import _data_mn, _decoded

    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(lambda_free)
    x = torch.randn(40, 24) * 3
    t = op.reference(x)
    assert t.colwise_data.shape == (24, 40)
    compact = mxq.fused_quant(format="fp8_block", colwise=True)(lambda_free).reference(x)  # ([M, N]: the same codes)
    assert torch.equal(_data_mn(t, "colwise", 40, 24).view(torch.uint8), compact.colwise_data.view(torch.uint8))
    at = (torch.tensor([0, 5, 39]), torch.tensor([0, 17, 23]))
    q, _ = _decoded(t, "colwise", at)
    assert torch.equal(q.float(), t.dequantize("colwise")[at].float())


def test_check_exact_flags_each_output_it_owes():
    """tests/checks.check_exact (the kernel tests' exact-class check): the reference against
    itself passes; one flipped byte of the FP4 colwise copy or its scales, an amax bit, or a
    dbias two ulps off fails, naming the field."""
    from tests.checks import check_exact

    x = planted(32, 64, torch.float32, seed=5)
    a = planted(32, 64, torch.float32, seed=6)
    op = mxq.fused_quant(format="nvfp4", colwise=True, dact="relu", dbias=True)(lambda_free)
    check_exact(op, [x], op.reference(x, act_input=a), act_input=a)
    for field, spoil in (("colwise_data", lambda t: t.view(torch.uint8).view(-1)[7].__ixor__(1)),
                         ("colwise_scale", lambda t: t.view(torch.uint8).view(-1)[3].__ixor__(1)),
                         ("amax", lambda t: t.view(torch.int32).view(-1)[0].__iadd__(1)),
                         ("dbias", lambda t: t.view(-1)[2].mul_(1 + 2 * torch.finfo(t.dtype).eps))):
        got = op.reference(x, act_input=a)
        spoil(getattr(got, field))
        with pytest.raises(AssertionError, match=field):
            check_exact(op, [x], got, act_input=a)


def test_compare_holds_fp32_scales_to_the_bound_on_v():
    """FP8 block scaling's fp32 scales (scale_mode "fp32") move with every bit of a block's amax,
    so in the transcendental class a kernel whose v differs from the reference's by a last bit
    writes many other scales: compare accepts every scale that some v inside the bound gives its
    block and still refuses a scale no such v gives. The "kernel" here is the reference run on the
    bound's upper ends (every v moved as far as the class allows, on rows of many binades, as the
    GPU test's data: most columns' block maxima move), the spoil doubles ten blocks' scales."""
    from tests.test_fp8_block import planted as binades

    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", fp8="e5m2", scale_mode="fp32",
                         act="gelu")(lambda_free)
    x = binades(160, 264, torch.float32, seed=424)
    want, bound = op.reference(x), v_bound(op, x)
    same = dict(fp8="e5m2", colwise=True, scale_layout="gemm", scale_mode="fp32", format="fp8_block")
    got = mxq.quantize(bound.hi.float().reshape(x.shape), **same)
    nd, _ = byte_diff(got.colwise_scale, want.colwise_scale)
    assert nd > 160 * 264 // 3200, "many scale bytes differ: the count alone would refuse them"
    assert compare(got, want, False, v_bound=bound) == []
    flat = got.colwise_scale.flatten()  # (a copy of the GEMM-ready view's elements)
    flat[:10] *= 2
    spoiled = flat.reshape(got.colwise_scale.shape)
    assert any(p.startswith("colwise_scale") for p in compare(
        mxq.MXFP8Tensor(**{**got.__dict__, "colwise_scale": spoiled}), want, False, v_bound=bound))


def test_fp32_scales_next_to_a_zero_amax():
    """Where every interval of a block holds 0, its amax may be anything from 0 to the greatest
    |v|: a kernel's scales of any v inside are accepted (the reference's 5e-4 blocks against its
    1e-3 ones), while a scale no such v gives is refused (0.5: above what |v| <= 3e-3 gives; an
    amax of 0 gives 1, which is not on the line between). Hand-made bound: v = 1e-3 +- 2e-3."""
    same = dict(format="fp8_block", scale_mode="fp32")
    v = torch.full((4, 128), 1e-3)
    bound = VBound((v - 2e-3).double(), (v + 2e-3).double())
    want = mxq.quantize(v, **same)
    assert compare(mxq.quantize(torch.full((4, 128), 5e-4), **same), want, False, v_bound=bound) == []
    assert compare(mxq.quantize(torch.zeros(4, 128), **same), want, False, v_bound=bound) == []  # (amax 0)
    bad = mxq.quantize(torch.zeros(4, 128), **same)
    bad.rowwise_scale.fill_(0.5)
    assert compare(bad, want, False, v_bound=bound) != []
    wide = VBound((v - 1e30).double(), (v + 1e30).double())  # (a greatest |v| past the dtype: clamped, not inf)
    assert compare(mxq.quantize(torch.full((4, 128), 7.0), **same), want, False, v_bound=wide) == []


def test_compare_holds_one_byte_scales_to_one_code_outside_the_exact_class():
    """Outside the exact class a 1-byte scale (E8M0, NVFP4's E4M3) may move by one code where the
    bound moves a block amax across a boundary, never more: a scale byte 40 codes (2^40) off, or
    turned NaN, is reported, with or without v_bound. One code off with the block's data left as
    they were is within the one-code class (no v_bound), but not given the bound: the block's
    bytes, decoded under the moved scale, are twice the values any v inside gives, and no v inside
    gives that scale."""
    from dataclasses import replace

    op = mxq.fused_quant(act="gelu", colwise=True)(_ident)
    x = planted(128, 256, torch.float32, seed=4)
    t, want = op(x), op.reference(x)
    for delta, flagged in ((40, (True, True)), (255, (True, True)), (1, (False, True))):
        bad = replace(t, rowwise_scale=t.rowwise_scale.clone())
        bad.rowwise_scale[3, 2] = delta if delta == 255 else bad.rowwise_scale[3, 2] + delta
        for vb, flag in zip((None, v_bound(op, x)), flagged):
            assert bool(compare(bad, want, False, v_bound=vb)) == flag, (delta, vb is None)
    assert compare(t, want, False) == []


@pytest.mark.parametrize("fmt, spoil", [("mxfp8", lambda s: s.view(torch.uint8).add_(1)),
                                        ("fp8_block", lambda s: s.mul_(1000.0))])
def test_compare_holds_every_block_to_the_bound_under_its_written_scale(fmt, spoil):
    """Given v_bound, a scale that moved is held to the bound, and so is its block's data under it:
    a result quantized from the bound's upper ends (every v as far as the class allows; some E8M0
    and fp32 scales move) is accepted; the same with one block's scale spoiled (E8M0 one code up,
    an fp32 scale x1000) and its data left alone is refused, rowwise and colwise, at a size where
    one block's bytes are far fewer than 1 in 1e4 (a wrong scale moved no data byte, so compare
    never looked at them)."""
    from dataclasses import replace

    from tests.test_fp8_block import planted as binades

    op = mxq.fused_quant(act="gelu", colwise=True, format=fmt)(_ident)
    x = binades(256, 1536, torch.float32, seed=11)
    want, bound = op.reference(x), v_bound(op, x)
    got = mxq.quantize(bound.hi.float().reshape(x.shape), colwise=True, format=fmt)
    assert compare(got, want, False, v_bound=bound) == []
    for name in ("rowwise_scale", "colwise_scale"):
        scale = getattr(got, name).clone()
        spoil(scale.view(-1)[5:6])
        assert any(p.startswith(name) for p in compare(replace(got, **{name: scale}), want, False, v_bound=bound))
    assert compare(got, want, True)  # (the bound's ends are not the reference's v: not vacuous)


def test_compare_accepts_e8m0_scales_the_bound_moves_across_a_boundary():
    """Block maxima of v on an E8M0 boundary (gelu(448) = 448): the bound's upper ends cross it, so
    a result quantized from them has scales one code up with its blocks' data under them, each
    one some v inside gives (not the reference's bytes: 88 rowwise and 8 colwise scales moved)."""
    op = mxq.fused_quant(act="gelu", colwise=True)(_ident)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    x[::3, ::32] = 448.0
    want, bound = op.reference(x), v_bound(op, x)
    got = mxq.quantize(bound.hi.float().reshape(x.shape), colwise=True)
    assert byte_diff(got.rowwise_scale, want.rowwise_scale)[0] > 0 and byte_diff(got.colwise_scale,
                                                                                  want.colwise_scale)[0] > 0
    assert compare(got, want, False, v_bound=bound) == []
    # the moved scale alone over the reference's bytes (no data byte differs): its block decodes twice
    # what any v inside gives
    from dataclasses import replace

    moved = replace(want, rowwise_scale=got.rowwise_scale)
    assert any(p.startswith("rowwise_data") for p in compare(moved, want, False, v_bound=bound))


def test_compare_names_what_is_not_a_result_and_holds_an_infinite_dbias():
    """compare's got/want must be MXFP8Tensors (named); a dbias whose reference sum is infinite is
    matched as that infinity (its 1-ulp slack was infinite: 0, -inf and 1e30 passed for +inf)."""
    from dataclasses import replace

    with pytest.raises(TypeError, match="compare: got must be an MXFP8Tensor, got NoneType"):
        compare(None, mxq.quantize(torch.ones(1, 32)), True)
    op = mxq.fused_quant(dbias=True, colwise=True)(_ident)
    x = torch.randn(64, 64)
    x[0, 3] = float("inf")
    want = op.reference(x)
    assert compare(want, want, True) == []
    for bad in (0.0, -float("inf"), 1e30):
        d = want.dbias.clone()
        d[3] = bad
        assert any(p.startswith("dbias") for p in compare(replace(want, dbias=d), want, True)), bad


def test_compare_holds_a_nan_byte_far_from_its_neighbour_code():
    """Without v_bound a data byte may be one code off, but a NaN is no code's neighbour: 448's
    e4m3 byte 0x7E turned 0x7F (NaN) is reported."""
    from dataclasses import replace

    want = mxq.quantize(torch.tensor([[448.0] + [1.0] * 31]))
    data = want.rowwise_data.clone()
    data.view(torch.uint8)[0, 0] = 0x7F
    assert compare(replace(want, rowwise_data=data), want, False)


def test_compare_reads_fp4_codes_outside_the_exact_class():
    """FP4's packed bytes outside the exact class: compared code by code (two a byte), a code one
    place off on the line of codes within the count, one further off reported (an [M, N/2] byte
    tensor was reshaped to [M, N] and raised)."""
    from dataclasses import replace

    op = mxq.fused_quant(act="gelu", format="nvfp4")(_ident)
    x = planted(128, 256, torch.float32, seed=5)
    t, want = op(x), op.reference(x)
    assert compare(t, want, False) == []
    b = int(t.rowwise_data[0, 0])
    lo = b & 0xF
    near = lo + 1 if lo & 7 < 7 else lo - 1  # (the next magnitude, same sign: one place on the line)
    far = (lo & 8) | ((lo & 7) + 3) % 8  # (three or five places)
    for code, want_problems in ((near, []), (far, ["rowwise_data: 1 codes differ, 1 of them by more than one code"])):
        bad = replace(t, rowwise_data=t.rowwise_data.clone())
        bad.rowwise_data[0, 0] = (b & 0xF0) | code
        assert compare(bad, want, False) == want_problems, (hex(b), code)
