"""NVFP4 with ``hadamard=True`` on the kernels: the colwise copy of bf16 input through TE's
16-point random Hadamard transform (docs/NUMERICS.md), the amax pass writing the amax and the
transformed copy's colwise_amax (the amax slot is their fp32[2] buffer), the packed kernel's
colwise path transforming each 16-row group held by two 8-row warps (device.rht_half).

CPU: the transform's rule (the very function the kernels trace, on Python floats) against exact
rational sums with a Hadamard matrix built here, wide exponent spans, ties, signed zeros, inf and
NaN; what is served; one compile per arch. GPU (marked gpu): bytes and amax/colwise_amax against
the torch reference, random shapes, specials, both layouts, fused ops, out=.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

import mxq
from mxq.kernels import device as dev
from mxq.runtime import compiler, limits
from mxq.runtime.call import Call
from mxq.testing import planted, poisoned, same_bytes

from . import oracle_fp4 as oracle

SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)  # TE's (get_wgrad_sign_vector)
FIELDS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "colwise_amax")


def ident(x):
    return x


def shift_scale(x, b):
    return x * 1.5 + b


def _h16(i: int, j: int) -> int:
    """Sylvester's H16 entry: (-1)^popcount(i & j)."""
    return -1 if bin(i & j).count("1") % 2 else 1


def _exact(x: list, signs=SIGNS) -> list:
    """y_j = sum_i x_i s_i H16[i, j] / 4 as exact rationals (finite x)."""
    return [sum(Fraction(x[i]) * signs[i] * _h16(i, j) for i in range(16)) / 4 for j in range(16)]


def _rule(x: list, signs=None) -> list:
    """The kernels' rule on the host: each half b from rows 0-7 and rows 8-15 times (-1)^b, then
    fma(value, +-1/4, +0) (exact: Python's float product by a power of two, then + 0.0), as the
    16 outputs in fp64 before the bf16 rounding (``signs``: the kernels' argument, None for TE's)."""
    out = []
    for b in range(2):
        x1f = [-v if b else v for v in x[8:]]
        out += [v * (-0.25 if neg else 0.25) + 0.0 for v, neg in dev.rht_half(x[:8], x1f, dev.HOST_F64, signs)]
    return out


def _random_group(rng, lo: int, hi: int) -> list:
    """16 bf16 values (random bit patterns) with exponent fields in [lo, hi] (0: zeros and
    subnormals), random signs, some zeros."""
    bits = [rng.randrange(2) << 15 | rng.randint(lo, hi) << 7 | rng.randrange(128) for _ in range(16)]
    bits = [b & 0x8000 if rng.random() < 0.1 else b for b in bits]
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().tolist()


def test_rule_equals_exact_sums():
    """Random groups (narrow and 2^40-wide exponent spans, bf16 subnormals), ties to even, a tie
    broken by a term 2^-40 below it (lost by any fp32 sum), and canceling groups: the rule's fp64
    sums are exact, so rounding them once gives the exact sum's bf16."""
    rng = random.Random(20261203)
    groups = [_random_group(rng, 124, 130) for _ in range(300)] + [_random_group(rng, 107, 147) for _ in range(300)]
    groups += [_random_group(rng, 0, 40) for _ in range(100)]  # (bf16 subnormals among them)
    groups += [_random_group(rng, 214, 254) for _ in range(100)]  # (sums past bf16's largest: inf)
    tie = [1.0, 2.0 ** -8] + [0.0] * 14  # y = (1 +- 2^-8) / 4: 1 + 2^-8 is a bf16 midpoint (to 1)
    groups += [tie, [1.0 + 2.0 ** -7, 2.0 ** -8] + [0.0] * 14,  # (midpoint above an odd code: up)
               [1.0, 2.0 ** -8, 2.0 ** -40] + [0.0] * 13,  # (just above the midpoint: up)
               [1.0, 2.0 ** -8, -(2.0 ** -40)] + [0.0] * 13,  # (just below: down)
               [2.0 ** 20, -(2.0 ** 20), 2.0 ** -20] + [0.0] * 13, [3.0] * 16, [-0.0] * 16]
    for x in groups:
        got, want = _rule(x), _exact(x)
        for j in range(16):  # (exact, so one rounding of it is the exact sum's: cvt.rn.bf16.f64 on the GPU)
            assert got[j] == want[j] and (want[j] != 0 or math.copysign(1, got[j]) == 1), (x, j)
    assert [oracle.round_bf16(v) for v in _exact(tie)][:2] == [0.25, 0.25 - 2.0 ** -10]  # (the tie went to even)


def _random_signs(rng) -> tuple:
    return tuple(rng.choice((1, -1)) for _ in range(16))


def test_rule_with_a_callers_signs_equals_exact_sums():
    """hadamard_signs: the rule the kernels trace with a caller's sign vector (all +1, all -1,
    random ones) gives the exact sums with that vector, and TE's vector is what None means."""
    rng = random.Random(20261206)
    vectors = [(1,) * 16, (-1,) * 16] + [_random_signs(rng) for _ in range(20)]
    for signs in vectors:
        for _ in range(20):
            x = _random_group(rng, 107, 147)
            assert _rule(x, signs) == [float(v) for v in _exact(x, signs)], signs
    x = _random_group(rng, 120, 130)
    assert _rule(x, None) == _rule(x, SIGNS) != _rule(x, vectors[0])


def test_rule_zeros_are_positive():
    """An exact zero is +0 whatever the inputs' zero signs (the oracle's; a product summed from +0):
    for each output j, the zero pattern whose every term s_i H16[i, j] x_i is -0."""
    for j in range(16):
        x = [-0.0 if SIGNS[i] * _h16(i, j) > 0 else 0.0 for i in range(16)]
        assert all(math.copysign(1, v) == 1 and v == 0 for v in _rule(x)), j


def test_rule_inf_and_nan():
    """inf terms: each output is +-inf by the sign of its inf terms, NaN where they differ or a
    NaN is in the group (IEEE, whatever the order)."""
    rng = random.Random(5)
    for _ in range(200):
        x = _random_group(rng, 122, 132)
        specials = rng.sample(range(16), rng.randint(1, 3))
        for i in specials:
            x[i] = rng.choice((math.inf, -math.inf, math.inf, -math.inf, math.nan))
        got = _rule(x)
        for j in range(16):
            terms = [x[i] * SIGNS[i] * _h16(i, j) for i in specials]
            if any(math.isnan(t) for t in terms) or (math.inf in terms and -math.inf in terms):
                assert math.isnan(got[j]), (x, j)
            else:
                assert got[j] == terms[0], (x, j)


# -- what is served ------------------------------------------------------------------------------
def _unserved(op, x, call=None):
    return limits.unserved(op.spec, op.epilogue, x, lambda: None, call)


def test_served_calls_and_the_amax_pair():
    """bf16, M % 16 == 0 (validation's), both copies or the colwise one, compact or swizzled, fused
    ops: served; an out= whose amax and colwise_amax are not one fp32[2] buffer: the reference."""
    for opts in (dict(), dict(rowwise=False), dict(scale_layout="swizzled"), dict(act="gelu"),
                 dict(stochastic_rounding=True)):
        op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, **opts)(ident)
        for m, n in ((16, 16), (48, 272), (1024, 4096)):
            assert _unserved(op, torch.zeros(m, n, dtype=torch.bfloat16)) is None, (opts, m, n)
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(ident)
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)
    assert out.colwise_amax.data_ptr() == out.amax.data_ptr() + 4
    assert _unserved(op, x, Call([x], [], out=out)) is None
    paired = Call([x], [], out=out).key()
    out.colwise_amax = torch.zeros((), dtype=torch.float32)
    why = _unserved(op, x, Call([x], [], out=out))
    assert "hadamard" in why and "colwise_amax" in why and "reference" in why
    # (a call's kept route must not serve the other kind of out=: the keys differ)
    assert Call([x], [], out=out).key() != paired
    out.colwise_amax = None
    with pytest.raises(ValueError, match="colwise_amax"):
        op(x, out=out)


def _ptx(op, arch):
    return compiler.compile_op(op, arch, "bf16", keep_ptx=True).__ptx__


@pytest.mark.parametrize("arch, layout", [("sm_90a", "compact"), ("sm_100a", "swizzled")])
def test_transform_compiles_per_arch(arch, layout):
    """Both copies: the amax zeroing (both entries), the amax pass (the owners' amax and the
    transformed copy's, one atomic each per warp) and the quantize pass, each pass transforming
    its thread's 8 columns x 8 rows: 4 fp64 additions and one fma and one cvt.rn.bf16.f64 per value."""
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, scale_layout=layout)(ident)
    ptx = _ptx(op, arch)
    assert f".target {arch}" in ptx and ptx.count(".entry") == 3
    assert ptx.count("red.relaxed.gpu.global.max.s32") == 2
    assert ptx.count("add.rn.f64") + ptx.count("sub.rn.f64") == 2 * 4 * 64
    assert ptx.count("cvt.rn.bf16.f64") == 2 * 64 and ptx.count("cvt.f64.bf16") == 2 * 128
    assert ptx.count("fma.rn.f64") == 2 * 64 and "0d0000000000000000" in ptx
    assert "max.NaN.bf16x2" not in ptx  # (NaN enters no packed maximum)


OTHER_SIGNS = (-1, 1, 1, 1, -1, 1, -1, 1, 1, -1, -1, -1, 1, 1, -1, 1)  # (a caller's: not TE's)


def test_a_callers_signs_are_the_ops_own():
    """hadamard_signs: part of the op (its spec, name, torch identity and rendered source) where
    it is not TE's; TE's vector given is the default op; what is wrong is named."""
    te = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(ident)
    same = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=list(SIGNS))(ident)
    other = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=OTHER_SIGNS)(ident)
    assert same.spec == te.spec and same._torch_id == te._torch_id and same.source == te.source
    assert other.spec != te.spec and other._torch_id != te._torch_id
    assert other.spec.name("bf16") != te.spec.name("bf16") and f"hadamard_signs={OTHER_SIGNS!r}" in other.source
    assert other.spec.key("bf16") == te.spec.key("bf16")  # (the C++ key: TE's transform)
    assert te.spec.signs_mask() == sum(1 << i for i in range(16) if SIGNS[i] < 0)
    x = torch.zeros(32, 32, dtype=torch.bfloat16)
    for bad in ([1] * 15, [1.0] * 16, [True] * 16, [0] + [1] * 15):
        with pytest.raises(ValueError, match="hadamard_signs"):
            mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, hadamard_signs=bad)
    for bad, kind in (("1" * 16, "str"), (3, "int"), (torch.ones(16, dtype=torch.int32), "Tensor")):  # (the wrong type)
        with pytest.raises(TypeError, match=f"hadamard_signs must be a tuple or list of 16 ints, .* got {kind}$"):
            mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, hadamard_signs=bad)
    mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, hadamard_signs=OTHER_SIGNS)  # (cached)
    with pytest.raises(ValueError, match="hadamard_signs"):  # (and not served from that cache)
        mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True,
                     hadamard_signs=tuple(bool(v > 0) or -1 for v in OTHER_SIGNS))
    with pytest.raises(ValueError, match="hadamard_signs.*hadamard=True"):
        mxq.quantize(x, format="nvfp4", colwise=True, hadamard_signs=OTHER_SIGNS)


def test_reference_with_a_callers_signs_matches_the_oracle():
    """The reference's transformed copy and colwise_amax with a caller's sign vector against
    tests/oracle_fp4.py's exact transform by the same vector (and not TE's bytes)."""
    x = _values(32, 48, 4, False)
    t = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, hadamard_signs=OTHER_SIGNS)
    w = oracle.hadamard_rows([list(col) for col in zip(*x.float().tolist())], OTHER_SIGNS)
    ga = oracle.amax([e for row in w for e in row])
    assert float(t.colwise_amax) == ga
    codes, _ = oracle.nvfp4(w, ga, 1)
    assert t.colwise_data.tolist() == oracle.pack(codes)
    te = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True)
    assert not torch.equal(te.colwise_data, t.colwise_data) and torch.equal(te.rowwise_data, t.rowwise_data)


def test_a_given_amax_pair():
    """global_amax with hadamard=True: the pair (amax, colwise_amax), two floats, an fp32 (2,)
    tensor or two one-element tensors (an earlier result's), each copy quantized under its own
    entry (the oracle's codes under those amaxes); any other form is named."""
    x = _values(32, 48, 6, False)
    computed = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True)
    pair = (float(computed.amax), float(computed.colwise_amax))
    for given in (pair, list(pair), torch.tensor(pair), (computed.amax, computed.colwise_amax),
                  (torch.tensor([pair[0]]), torch.tensor(pair[1]))):
        t = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, global_amax=given)
        assert all(same_bytes(getattr(t, f), getattr(computed, f)) for f in FIELDS), given
    t = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, global_amax=(2.0, 20.0))
    assert float(t.amax) == 2.0 and float(t.colwise_amax) == 20.0
    v = x.float().tolist()
    w = oracle.hadamard_rows([list(col) for col in zip(*v)])
    assert t.colwise_data.tolist() == oracle.pack(oracle.nvfp4(w, 20.0, 1)[0])
    assert t.rowwise_data.tolist() == oracle.pack(oracle.nvfp4(v, 2.0, 1)[0])
    for bad, err in ((1.0, TypeError), ((1.0,), TypeError), ((1.0, 2.0, 3.0), TypeError), ((1.0, -1.0), ValueError),
                     ((1.0, -float("inf")), ValueError), (("1", 2.0), TypeError), ((True, 1.0), TypeError),
                     ((10 ** 400, 1.0), ValueError), ((1.0, 1e39), ValueError), ((float("nan"), 1.0), ValueError),
                     (torch.zeros(3), ValueError), (torch.zeros(2, dtype=torch.float64), ValueError),
                     (torch.zeros(1, 2), ValueError), (torch.zeros(2, 1), ValueError),
                     ((torch.tensor(1.0), 2.0), TypeError), ((torch.tensor(1.0), torch.zeros(2)), ValueError),
                     ((torch.tensor(1.0), torch.tensor(2.0, dtype=torch.float64)), ValueError)):
        with pytest.raises(err, match="global_amax"):
            mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True, global_amax=bad)
    with pytest.raises(TypeError, match="global_amax"):  # (without the transform: one amax)
        mxq.quantize(x, format="nvfp4", colwise=True, global_amax=pair)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_given_pair_and_callers_signs_compile(arch):
    """The quantize pass alone (variant "vec_given": no amax pass, no atomics) of a hadamard op,
    and the transform with a caller's vector: its additions and subtractions are TE's count in
    another pattern (the signs are compile-time constants of the fp64 sums)."""
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(ident)
    given = compiler.compile_op(op, arch, "bf16", keep_ptx=True, variant="vec_given").__ptx__
    assert given.count(".entry") == 1 and "red.relaxed.gpu.global.max" not in given
    assert given.count("cvt.rn.bf16.f64") == 64
    te = _ptx(op, arch)
    other = _ptx(mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=OTHER_SIGNS)(ident), arch)
    count = lambda ptx: ptx.count("add.rn.f64") + ptx.count("sub.rn.f64")  # noqa: E731
    assert count(other) == count(te) == 2 * 4 * 64
    assert other.count("sub.rn.f64") != te.count("sub.rn.f64")


# -- on the device -----------------------------------------------------------------------------
@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("MXQ_STRICT", "1")


def _compare(got, want, what=""):
    for f in FIELDS:
        w = getattr(want, f)
        if w is not None:
            assert same_bytes(getattr(got, f).contiguous(), w.contiguous()), (what, f)


def _values(m, n, seed, specials):
    """planted bf16 values and a group of bf16 subnormals (sums rounding to bf16's subnormal grid,
    ties among them); with ``specials``: inf and NaN in some groups, a group of 2^40-wide
    magnitudes, zero columns and -0 groups, a group whose sums overflow to inf."""
    x = planted(m, n, torch.float32, seed=seed, specials=False)
    if m >= 48 and n >= 16:
        x[32:48, 7] = torch.arange(16) * 3 * 2.0 ** -133
    if specials and m >= 32 and n >= 16:
        x[0, 0] = float("inf")
        x[16:32, 1] = float("nan")
        x[0:16, 2] = torch.tensor([2.0 ** 20, -(2.0 ** 18), 2.0 ** -20, 1.0] * 4)
        x[:, 3] = 0.0
        x[16:32, 4] = -0.0
        x[0, 5], x[3, 5] = float("inf"), float("-inf")  # (opposite infinities: NaN outputs)
        x[5, 6] = float("-inf")
        if m >= 48:
            x[32:48, 8] = torch.tensor(SIGNS, dtype=torch.float32) * 1.5 * 2.0 ** 126  # (y[0]: 1.5 * 2^128)
    return x.to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(16, 16), (32, 48), (48, 272), (80, 16), (1024, 528), (4096, 4096)])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
@pytest.mark.parametrize("specials", [False, True])
def test_transform_matches_reference(strict, m, n, layout, specials):
    """Both copies, the colwise copy alone and into a poisoned out=, byte for byte with amax and
    colwise_amax (M % 32 of 0 and 16: the tile's second block past M)."""
    x = _values(m, n, m * 3 + n, specials)
    for opts in (dict(), dict(rowwise=False)):
        op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, scale_layout=layout, **opts)(ident)
        want = op.reference(x)
        _compare(op(x.cuda()), want, opts)
        out = poisoned(op, x.cuda())
        out.colwise_amax.fill_(-1.0)
        _compare(op(x.cuda(), out=out), want, (opts, "out="))


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(48, 272), (1024, 528)])
def test_fused_ops_match_reference(strict, m, n):
    """A user epilogue with a bias (rows past M map to the bias: masked from both amaxes), gelu,
    stochastic rounding, another colwise tile."""
    x = _values(m, n, m + n, True)
    b = planted(1, n, torch.float32, seed=3, specials=False).to(torch.bfloat16).reshape(n)
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(shift_scale)
    _compare(op(x.cuda(), b.cuda()), op.reference(x, b), "epilogue")
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, act="gelu", scale_layout="swizzled")(ident)
    _compare(op(x.cuda()), op.reference(x), "gelu")
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, stochastic_rounding=True)(ident)
    for offset in (2 ** 33 + 1, 2 ** 33 + 4):  # (% 4 of 0: the colwise groups' warps share their Philox)
        _compare(op(x.cuda(), seed=11, offset=offset), op.reference(x, seed=11, offset=offset), ("sr", offset))
    from mxq.kernels import config as kconfig
    for rows in (16, 64):
        op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(ident)._with_tuning(
            kconfig.Tuning(fp4_col_rows=rows))
        _compare(op(x.cuda()), op.reference(x), rows)


@pytest.mark.gpu
def test_out_with_separate_amaxes_falls_back(monkeypatch):
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(ident)
    x = _values(64, 64, 1, False)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cuda")
    _compare(op(x.cuda(), out=out), op.reference(x))  # (the pair first: its route is kept under its key)
    out.colwise_amax = torch.zeros((), dtype=torch.float32, device="cuda")
    _compare(op(x.cuda(), out=out), op.reference(x))
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="colwise_amax"):
        op(x.cuda(), out=out)


@pytest.mark.gpu
def test_kernels_match_the_oracle(strict):
    """The colwise copy's transformed values (dequantized) against tests/oracle_fp4.py's exact
    transform, through the bytes: the codes of the kernels' copy equal the oracle's."""
    x = _values(32, 48, 9, False)
    t = mxq.quantize(x.cuda(), format="nvfp4", colwise=True, hadamard=True)
    v = x.float().tolist()
    w = oracle.hadamard_rows([list(col) for col in zip(*v)])
    ga = oracle.amax([e for row in w for e in row])
    assert float(t.colwise_amax) == ga and float(t.amax) == oracle.amax([e for row in v for e in row])
    codes, scales = oracle.nvfp4(w, ga, 1)
    assert t.colwise_data.cpu().tolist() == oracle.pack(codes)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(48, 272), (1024, 528)])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_callers_signs_match_reference(strict, m, n, layout):
    """A caller's sign vector on the kernels, both copies and the colwise one, a fused op, into a
    poisoned out=: the reference's bytes (which differ from TE's transform)."""
    x = _values(m, n, m + 2 * n, True)
    for signs in (OTHER_SIGNS, (-1,) * 16):
        for opts in (dict(), dict(rowwise=False)):
            op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=signs,
                                 scale_layout=layout, **opts)(ident)
            want = op.reference(x)
            _compare(op(x.cuda()), want, (signs, opts))
            out = poisoned(op, x.cuda())
            _compare(op(x.cuda(), out=out), want, (signs, opts, "out="))
    b = planted(1, n, torch.float32, seed=5, specials=False).to(torch.bfloat16).reshape(n)
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=OTHER_SIGNS)(shift_scale)
    _compare(op(x.cuda(), b.cuda()), op.reference(x, b), "epilogue")


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(64, 96), (1024, 528)])
def test_given_pair_matches_reference(strict, m, n):
    """global_amax=(amax, colwise_amax) with hadamard=True on the kernels (the quantize pass
    alone): floats and a tensor, equal to the computed pair (the computed call's bytes) and
    other values (the reference's); into a poisoned out=; noop=1 writes nothing; a prepared
    launch re-reads a tensor pair changed in place."""
    x = _values(m, n, 3 * m + n, False).cuda()
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(ident)
    computed = op(x)
    pair = (float(computed.amax), float(computed.colwise_amax))
    for given in (pair, torch.tensor(pair, device="cuda"), (pair[0] * 4, pair[1] / 2)):
        want = op.reference(x.cpu(), global_amax=given.cpu() if isinstance(given, torch.Tensor) else given)
        _compare(op(x, global_amax=given), want, given)
        _compare(op(x, global_amax=given, out=poisoned(op, x)), want, (given, "out="))
    _compare(op(x, global_amax=pair), computed, "computed")
    out = poisoned(op, x)
    before = [getattr(out, f).clone() for f in FIELDS]
    op(x, global_amax=pair, out=out, noop=torch.ones(1, device="cuda"))
    assert all(same_bytes(getattr(out, f), b) for f, b in zip(FIELDS, before))
    amax = torch.tensor(pair, device="cuda")
    launch, out = op.prepare(x, global_amax=amax)
    launch()
    _compare(out, op.reference(x.cpu(), global_amax=pair), "prepared")
    amax.mul_(3.0)
    launch()
    _compare(out, op.reference(x.cpu(), global_amax=amax.cpu()), "prepared, changed in place")
    halves = (computed.amax.clone(), computed.colwise_amax.clone())  # (an earlier result's two entries)
    launch, out = op.prepare(x, global_amax=halves)
    halves[1].mul_(0.5)
    launch()
    _compare(out, op.reference(x.cpu(), global_amax=(pair[0], pair[1] * 0.5)), "prepared, two tensors")
    launch, out = op.prepare(x, global_amax=(pair[0] * 2, pair[1]))
    launch()
    _compare(out, op.reference(x.cpu(), global_amax=(pair[0] * 2, pair[1])), "prepared, two floats")
    signed = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=OTHER_SIGNS)(ident)
    for given in ((pair[0], pair[1] * 3), torch.tensor(pair, device="cuda")):  # (the given pass, a caller's signs)
        _compare(signed(x, global_amax=given),
                 signed.reference(x.cpu(), global_amax=given.cpu() if isinstance(given, torch.Tensor) else given),
                 ("signs", given))
