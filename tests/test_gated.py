"""Gated activations (mxq/frontend/gated.py): act= / dact= "swiglu", "geglu", "reglu", "qgeglu", "sreglu".

Expected bytes come from the formulas of docs/NUMERICS.md ("Gated activations") typed out here in
torch fp32 (one rounding per operation) and quantized by tests/oracle.py; relu-based ones are exact,
the others compared in the transcendental class. GPU tests (marked) compare the kernels with the
reference; their CPU counterpart is the compile test below.
"""

import pytest
import torch

import mxq
from mxq.frontend import gated
from mxq.frontend.spec import QuantSpec
from mxq.testing import compare, planted, poisoned, v_abs_sum, v_bound

from . import oracle
from .test_kernels_fp4 import _fmt_ids

F32 = torch.float32


def _c(v):
    return torch.tensor(v, dtype=F32)


def _sigmoid(x):
    return _c(1.0) / (_c(1.0) + torch.exp(-x))


# the activations and derivatives of docs/NUMERICS.md, typed out (operation order as documented)
def _act(name, x):
    if name == "silu":
        return x * _sigmoid(x)
    if name == "gelu":
        return x * (_c(0.5) + _c(0.5) * torch.tanh(x * (_c(0.79788456) + _c(0.03567741) * x * x)))
    if name == "relu":
        return torch.where(x > 0, x, _c(0.0))
    if name == "qgelu":
        return x * _sigmoid(_c(1.702) * x)
    if name == "srelu":
        return torch.where(x > 0, x * x, _c(0.0))
    raise KeyError(name)


def _dact(name, x):
    if name == "silu":
        s = _sigmoid(x)
        return x * (s * (_c(1.0) - s)) + s
    if name == "gelu":
        t = torch.tanh(_c(0.79788456) * x * (_c(1.0) + _c(0.044715) * x * x))
        return (_c(0.5) * x * ((_c(1.0) - t * t) * (_c(0.79788456) + _c(0.1070322243) * x * x))
                + _c(0.5) * (_c(1.0) + t))
    if name == "relu":
        return torch.where(x > 0, _c(1.0), _c(0.0))
    if name == "qgelu":
        z = _c(1.702) * x
        s = _sigmoid(z)
        return z * (s * (_c(1.0) - s)) + s
    if name == "srelu":
        return torch.where(x > 0, _c(2.0) * x, _c(0.0))
    raise KeyError(name)


def _oracle_both(v):
    """Rowwise and colwise e4m3/rceil bytes of fp32 values ``v`` by tests/oracle.py."""
    rd, rs = oracle.quantize_rows(v.tolist(), "e4m3", "rceil")
    cd, cs = oracle.quantize_rows(v.t().tolist(), "e4m3", "rceil")
    u8 = torch.uint8
    return torch.tensor(rd, dtype=u8), torch.tensor(rs, dtype=u8), torch.tensor(cd, dtype=u8).t(), \
        torch.tensor(cs, dtype=u8).t()


def _want(v, dtype):
    """An MXFP8Tensor of values ``v`` (fp32, already through NUMERICS step 5) by the oracle."""
    rd, rs, cd, cs = _oracle_both(v)
    f8 = torch.float8_e4m3fn
    return mxq.MXFP8Tensor(rd.view(f8), cd.contiguous().view(f8), rs, cs.contiguous(), None, None, "e4m3", "compact",
                           v.shape)


EXACT = {"reglu", "sreglu"}


@pytest.mark.parametrize("name", list(gated.GATED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_by_hand(name, dtype):
    """act(gate) * up over [M, 2N], quantized as [M, N] (N = 64: two rowwise blocks per half)."""
    x = (torch.randn(48, 128, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    op = mxq.fused_quant(act=name, rowwise=True, colwise=True)(_ident)
    g, u = x[:, :64].to(F32), x[:, 64:].to(F32)
    v = (_act(gated.GATED[name], g) * u).to(dtype).to(F32) if dtype != F32 else _act(gated.GATED[name], g) * u
    got = op(x)
    assert got.shape == (48, 64)
    assert compare(got, _want(v, dtype), exact=name in EXACT) == []


@pytest.mark.parametrize("name", list(gated.GATED))
def test_backward_by_hand(name):
    """d_gate = (grad * up) * dact(gate), d_up = grad * act(gate), side by side as [M, 2N], dbias over 2N."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(40, 192, generator=gen) * 2
    grad = torch.randn(40, 96, generator=gen)
    op = mxq.fused_quant(dact=name, rowwise=True, colwise=True, dbias=True)(_ident)
    g, u = a[:, :96], a[:, 96:]
    base = gated.GATED[name]
    v = torch.cat([(grad * u) * _dact(base, g), grad * _act(base, g)], dim=1)
    got = op(grad, act_input=a)
    want = _want(v, F32)
    want.dbias = v.sum(0, dtype=torch.float64).to(F32)
    assert got.shape == (40, 192) and got.dbias.shape == (192,)
    exact = name in EXACT
    assert compare(got, want, exact=exact, v_abs=None if exact else v.abs().sum(0, dtype=torch.float64)) == []


def _ident(x):
    return x


@mxq.fused_quant(rowwise=True, colwise=True, dbias=True)
def _swiglu_by_views(g, u, alpha: float = 1.0):
    return mxq.silu(g * alpha) * (u * alpha)


def test_act_form_equals_the_user_epilogue_over_half_views():
    """act="swiglu" on a scaled input computes the bytes of the user epilogue over the halves."""
    @mxq.fused_quant(act="swiglu", rowwise=True, colwise=True, dbias=True)
    def scaled(x, alpha: float = 1.0):
        return x * alpha

    x = (torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 2).bfloat16()
    got = scaled(x, alpha=0.75)
    want = _swiglu_by_views(x[:, :128], x[:, 128:], alpha=0.75)
    assert compare(got, want, exact=True) == []


def test_operands_split_or_broadcast_into_the_halves():
    """A [2N] row operand is split into its halves; a column operand serves both."""
    @mxq.fused_quant(act="reglu", rowwise=True)
    def biased(x, b, s):
        return x * s + b

    gen = torch.Generator().manual_seed(4)
    x, b, s = torch.randn(32, 128, generator=gen), torch.randn(128, generator=gen), torch.randn(32, 1, generator=gen)
    got = biased(x, b, s)
    v = (x * s + b)
    want = _want(torch.where(v[:, :64] > 0, v[:, :64], _c(0.0)) * v[:, 64:], F32)
    want.colwise_data = want.colwise_scale = None
    assert compare(got, want, exact=True) == []


@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_groups_pass_through_both_directions(layout):
    """Row groups with a gated op (MoE experts with SwiGLU): group k of the grouped result is the
    gated op on that group's rows alone, byte for byte, in both directions; dbias is [G, 2N]."""
    gen = torch.Generator().manual_seed(4)
    sizes = [45, 0, 100, 31]
    offs = torch.cumsum(torch.tensor(sizes), 0)
    x = torch.randn(176, 128, generator=gen) * 2
    grad = torch.randn(176, 64, generator=gen)
    opts = dict(rowwise=True, colwise=True, scale_layout=layout)
    fwd = mxq.fused_quant(act="swiglu", **opts)(_ident)
    bwd = mxq.fused_quant(dact="swiglu", dbias=True, **opts)(_ident)
    f, b = fwd(x, group_offsets=offs), bwd(grad, act_input=x, group_offsets=offs)
    assert f.shape == (176, 64) and b.shape == (176, 128) and b.dbias.shape == (4, 128)
    fwd_c = mxq.fused_quant(act="swiglu", rowwise=True, colwise=True)(_ident)
    bwd_c = mxq.fused_quant(dact="swiglu", dbias=True, rowwise=True, colwise=True)(_ident)
    start = 0
    for k, size in enumerate(sizes):
        end = start + size
        alone_f, alone_b = fwd_c(x[start:end]), bwd_c(grad[start:end], act_input=x[start:end])
        assert compare(f.group(k), alone_f, exact=True) == [], k
        part = b.group(k)
        assert torch.equal(part.dbias, alone_b.dbias), k
        part.dbias = alone_b.dbias = None
        assert compare(part, alone_b, exact=True) == [], k
        start = end


def test_bad_gated_calls_name_the_argument():
    fwd = mxq.fused_quant(act="swiglu")(_ident)
    bwd = mxq.fused_quant(dact="geglu")(_ident)
    with pytest.raises(ValueError, match="'x'.*even"):
        fwd(torch.randn(4, 63))
    with pytest.raises(ValueError, match="act_input.*required"):
        bwd(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"act_input.*\(4, 128\)"):
        bwd(torch.randn(4, 64), act_input=torch.randn(4, 64))
    with pytest.raises(ValueError, match="act_input"):
        fwd(torch.randn(4, 64), act_input=torch.randn(4, 64))
    with pytest.raises(ValueError, match="group_offsets.*end at M = 64"):
        fwd(torch.randn(64, 64), group_offsets=torch.tensor([60]))
    with pytest.raises(ValueError, match="inner op of a gated activation is not served by this C\\+\\+ route"):
        bwd.inner.register("mxq.test.inner_halves")


def _plus(x, r):
    return x + r


def test_gated_calls_name_the_arguments_as_passed(recwarn):
    """Messages of a gated op's checks (run on its inner op over the halves) name the caller's
    arguments and shapes: the requires-grad warning names 'r' once, not the up half's inner name
    too, and 'act_input', not the inner _mxq_gate / _mxq_up; an out= field overlapping act_input
    names 'act_input'; a shape that does not broadcast gives the shapes as passed, [..., 2N]."""
    import re
    import warnings

    from mxq.runtime import validation

    validation._warned.clear()
    fwd = mxq.fused_quant(act="swiglu")(_plus)
    bwd = mxq.fused_quant(dact="swiglu")(_ident)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fwd(torch.randn(64, 32), torch.randn(32, requires_grad=True))
        bwd(torch.randn(64, 16), act_input=torch.randn(64, 32, requires_grad=True))
    named = [re.match(r"mxq: argument '([^']*)' requires grad", str(w.message)) for w in caught]
    assert [m.group(1) for m in named if m] == ["r", "act_input"]
    buf = torch.zeros(64 * 32 * 4, dtype=torch.uint8)
    act_input = buf.view(torch.float32).view(64, 32)
    out = mxq.MXFP8Tensor.empty(bwd.spec, (64, 32), torch.float32, "cpu")
    out.rowwise_data = buf[:64 * 32].view(torch.float8_e4m3fn).view(64, 32)
    with pytest.raises(ValueError, match="'out.rowwise_data' overlaps 'act_input'"):
        bwd(torch.randn(64, 16), act_input=act_input, out=out)
    up = torch.empty(64, 32)
    out = mxq.MXFP8Tensor.empty(fwd.spec, (64, 16), torch.float32, "cpu")
    out.rowwise_data = up.view(torch.uint8).view(-1)[64:64 + 1024].view(torch.float8_e4m3fn).reshape(64, 16)
    with pytest.raises(ValueError, match="'out.rowwise_data' overlaps 'r'"):  # (r's halves are both 'r')
        fwd(torch.randn(64, 32), up, out=out)
    for r in (torch.randn(8, 32), torch.randn(64, 32, 1)):
        with pytest.raises(ValueError, match=re.escape(f"'r' has shape {tuple(r.shape)}, which neither equals "
                                                       "'x''s (64, 32)")):
            fwd(torch.randn(64, 32), r)


def test_reserved_parameter_names_are_refused():
    def f(x, _mxq_half: float = 0.0):
        return x

    with pytest.raises(mxq.EpilogueError, match="reserved"):
        mxq.fused_quant(f)


@pytest.mark.parametrize("name", list(gated.GATED))
def test_gated_keys_round_trip(name):
    for spec in (QuantSpec(act=name, colwise=True), QuantSpec(dact=name, dbias=True)):
        assert QuantSpec.from_key(spec.key("bf16")) == (spec, "bf16")
    with pytest.raises(ValueError, match="gated bit"):
        QuantSpec.from_key(1 << 16 | 2)


def test_gated_op_compiles_under_torch_compile():
    fwd = mxq.fused_quant(act="swiglu", rowwise=True, colwise=True)(_ident)
    bwd = mxq.fused_quant(dact="swiglu", rowwise=True, dbias=True)(_ident)

    def f(x, g):
        return fwd(x), bwd(g, act_input=x)

    x, g = torch.randn(64, 128), torch.randn(64, 64)
    got = torch.compile(f, fullgraph=True)(x, g)
    want = f(x, g)
    for a, b in zip(got, want):
        assert compare(a, b, exact=True) == []
    offs = torch.tensor([10, 10, 64])

    def grouped(x, g, offs):
        return fwd(x, group_offsets=offs), bwd(g, act_input=x, group_offsets=offs)

    got = torch.compile(grouped, fullgraph=True)(x, g, offs)
    want = grouped(x, g, offs)
    for a, b in zip(got, want):
        assert a.dbias is None or a.dbias.shape == (3, 128)
        assert compare(a, b, exact=True) == []


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_gated_kernels_compile(arch):
    """CPU counterpart of the GPU tests: the two-halves kernels compile and keep their vector stores
    (the 16-bit packed kernel writes both halves, Tuning.halves_one_cta: twice the stores). Every
    variant and dtype on Hopper; on Blackwell (whose kernels differ only in the E8M0 conversion)
    the bf16 ones."""
    import re

    from mxq.runtime import inspection

    hopper = arch == "sm_90a"
    bwd = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident)
    for dtype, stores in (("bf16", 16), ("fp32", 8)) if hopper else (("bf16", 16),):
        ptx = inspection.ptx_of(bwd.inner, arch, dtype, "vec")
        # the quantize kernel and dbias_kernel's two forms (reduce.py)
        assert ptx.count(".entry") == 3 and len(re.findall(r"st\.global\.v2\.b32", ptx)) == stores
        if hopper:
            inspection.ptx_of(bwd.inner, arch, dtype, "generic")
    # the grouped backward's kernels (row groups over both halves), swizzled scales
    grouped = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True, scale_layout="swizzled")(_ident)
    for dtype in ("bf16", "fp32") if hopper else ("bf16",):
        for variant in ("vec_grouped", "generic_grouped") if hopper else ("vec_grouped",):
            assert ".entry" in inspection.ptx_of(grouped.inner, arch, dtype, variant)


def _one_cta(op, one: bool = True):
    """``op``'s inner op with Tuning.halves_one_cta = ``one`` (the default: both halves from one
    CTA of the packed kernel; False: one CTA per half)."""
    from mxq.kernels.config import Tuning

    return op.inner._with_tuning(Tuning(halves_one_cta=one))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_one_cta_halves_compile(arch):
    """Tuning.halves_one_cta (on by default): the packed kernel writes both halves
    in two passes over one loaded tile, and it compiles; False gives one CTA per half."""
    import re

    from mxq.runtime import inspection

    def bwd():
        return mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident)

    default = inspection.ptx_of(bwd().inner, arch, "bf16", "vec")
    one = inspection.ptx_of(_one_cta(bwd()), arch, "bf16", "vec")
    two = inspection.ptx_of(_one_cta(bwd(), one=False), arch, "bf16", "vec")
    assert default == one
    # one CTA stores both halves: twice the packed kernel's FP8 vector stores, two barriers more
    assert len(re.findall(r"st\.global\.v2\.b32", one)) == 2 * len(re.findall(r"st\.global\.v2\.b32", two))
    assert one.count("bar.sync") > two.count("bar.sync")


def test_grouped_backward_warps_skip_rows_past_the_group_end():
    """The grouped gated backward with the colwise copy (MXFP8, FP8 block scaling): a warp whose rows
    all lie past its group's end (a tile's last warps, a tile with no rows) runs none of its row
    pass (PackedKernel.rows_in_group: one warp-uniform branch, the same bytes; on the GPU:
    test_gated_grouped_backward_on_cuda, whose groups leave such warps). The other grouped ops keep
    their kernels, where the branch took their registers up. With a local ptxas the MXFP8 kernels
    keep at most 64 registers and no spills on sm_90 (bf16, fp16; a branch per row took them to
    83-91)."""
    import re
    import shutil
    from types import SimpleNamespace

    from mxq.frontend import codegen
    from mxq.kernels.packed import PackedKernel
    from mxq.runtime import inspection

    def skips(**opts):
        op = mxq.fused_quant(**opts)(_ident)
        inner = getattr(op, "inner", op)
        cfg = codegen.kernel_config(inner.spec, inner.epilogue)
        ring = cfg.stage_rows(False, True) < cfg.tile_rows // cfg.packed_warps(False)
        return PackedKernel(cfg, None).skips_rows_past_end(SimpleNamespace(GROUPED=True, UNALIGNED=False, RING=ring))

    both = dict(colwise=True, dbias=True)
    for name in gated.GATED:
        assert skips(dact=name, **both) and skips(dact=name, colwise=True, scale_layout="swizzled")
    assert skips(dact="swiglu", format="fp8_block", **both)
    assert not skips(dact="swiglu", rowwise=True)  # (the rowwise-only backward: 96 -> 114 registers)
    assert not skips(dact="swiglu", format="mxfp4", **both) and not skips(dact="swiglu", format="nvfp4", **both)
    assert not skips(act="swiglu", colwise=True) and not skips(dact="gelu", **both) and not skips(act="gelu", colwise=True)
    if shutil.which("ptxas") is None:
        return
    from .test_gemm_sm90 import _ptxas_output

    bwd = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident)
    for dtype in ("bf16", "fp16"):
        out = _ptxas_output(inspection.ptx_of(bwd.inner, "sm_90a", dtype, "vec_grouped"))
        packed = out[out.index("Compiling entry function 'kernel_cutlass_packed_kernel"):]
        assert "0 bytes spill stores" in packed, packed
        assert int(re.search(r"Used (\d+) registers", packed).group(1)) <= 64, packed


# the gated forward in the other formats: the inner op over the two strided halves, [M, N] outputs
GATED_FWD_FORMATS = [("fp8_block", dict(colwise=True)), ("fp8_block", dict(colwise=True, scale_layout="gemm")),
                     ("fp8_block", dict(block=(128, 128), colwise=True)), ("mxfp4", dict(colwise=True)),
                     ("nvfp4", dict(colwise=True)), ("nvfp4", dict(colwise=True, block_2d=True))]


def _check_gated_forward(fmt, opts, dtype, device):
    """reglu and sreglu forwards (the exact class) in ``fmt`` on ``device``, into poisoned outputs
    and allocating, byte for byte against the reference; M a multiple of 8 (FP4's colwise copy)
    with a partial row tile, N a multiple of 128 (FP8 block scaling's 1x128 blocks)."""
    for name, m, n in (("reglu", 96, 256), ("sreglu", 72, 384)):
        op = mxq.fused_quant(format=fmt, act=name, **opts)(_ident)
        x = planted(m, 2 * n, dtype, seed=n)
        want = op.reference(x)
        xd = x.to(device)
        assert compare(op(xd, out=poisoned(op, xd)), want, True) == [], (name, m, n)
        assert compare(op(xd), want, True) == [], (name, m, n)


@pytest.mark.parametrize("case", GATED_FWD_FORMATS, ids=_fmt_ids)
def test_gated_forward_in_other_formats_is_served(case):
    """The gated forwards test_gated_forward_in_other_formats_on_cuda runs are the kernels'
    (limits.unserved on the inner op's call over the halves), and its check runs on the
    reference path (CPU)."""
    from mxq.runtime import limits
    from mxq.runtime.call import Call

    fmt, opts = case
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        inner = mxq.fused_quant(format=fmt, act="reglu", **opts)(_ident).inner
        x = torch.zeros(96, 512, dtype=dtype)
        call = Call([x[:, :256], x[:, 256:]], [])
        assert limits.unserved(inner.spec, inner.epilogue, x[:, :256], inner._packed_smem_shortfall, call) is None
    _check_gated_forward(fmt, opts, torch.bfloat16, "cpu")


# --- on a CUDA device -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", [256, 96, 40, 36])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(gated.GATED))
def test_gated_kernels_match_reference(name, dtype, n):
    """Forward (act=) and backward (dact= with dbias) on the kernels against the reference, into
    poisoned outputs. N = 40, 36: colwise only on the backward's kernels (rowwise blocks would
    straddle the halves; that case runs the reference with a warning); N = 36: the up half
    x[:, 36:] is not 16-byte aligned (16-bit inputs: the packed kernel's unaligned rows)."""
    gen = torch.Generator().manual_seed(n)
    m = 67
    a = planted(m, 2 * n, dtype, seed=n)
    grad = (torch.randn(m, n, generator=gen)).to(dtype)
    exact = name in EXACT
    fwd = mxq.fused_quant(act=name, rowwise=True, colwise=True, amax=True)(_ident)
    want = fwd.reference(a)
    ac = a.cuda()
    assert compare(fwd(ac, out=poisoned(fwd, ac)), want, exact) == []
    rowwise = n % 32 == 0
    bwd = mxq.fused_quant(dact=name, rowwise=rowwise, colwise=True, dbias=True)(_ident)
    want = bwd.reference(grad, act_input=a)
    v_abs = None if exact else v_abs_sum(bwd.inner, grad, a[:, :n], a[:, n:], 0.0)
    bound = None if exact else v_bound(bwd, grad, act_input=a)
    got = bwd(grad.cuda(), act_input=ac, out=poisoned(bwd, grad.cuda()))
    assert compare(got, want, exact, v_abs, v_bound=bound) == []


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_gated_grouped_forward_on_cuda(layout, monkeypatch):
    """Forward with groups runs the grouped kernels over the two half views (against the
    reference; MXQ_STRICT: a fallback to the reference would fail)."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    sizes = [45, 0, 300, 31]
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    x = planted(376, 256, torch.bfloat16, seed=7)
    fwd = mxq.fused_quant(act="swiglu", amax=True, rowwise=True, colwise=True, scale_layout=layout)(_ident)
    got = fwd(x.cuda(), group_offsets=offs.cuda(), out=poisoned(fwd, x.cuda(), offs.cuda()))
    assert compare(got, fwd.reference(x, group_offsets=offs), exact=False) == []


def _random_groups(m: int, g: int, seed: int) -> torch.Tensor:
    """int32 ends of ``g`` groups of random sizes over ``m`` rows, some empty (the first, and a
    run in the middle when g > 4)."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, m + 1, (g - 1,), generator=gen)).values
    cuts[0] = 0  # an empty first group
    if g > 4:
        cuts[g // 2] = cuts[g // 2 + 1] = cuts[g // 2 - 1]  # empty groups in the middle
    return torch.cat([cuts, torch.tensor([m])]).to(torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(gated.GATED))
def test_gated_grouped_backward_on_cuda(name, dtype, layout, monkeypatch):
    """The grouped gated backward (dact + dbias, both directions) on the grouped kernels over the
    two halves, against the reference within the op's class, into poisoned outputs, for random
    group sizes with empty groups; N = 96 and 40 (colwise only: rowwise blocks would straddle the
    halves) on the aligned grouped kernel ("vec_grouped"), N = 36 (colwise only, N % 8 != 0: the
    up halves off 16-byte boundaries) on the other one ("generic_grouped"); MXQ_STRICT: no fallback."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    exact = name in EXACT
    m = 333
    for n, rowwise, groups_ in ((96, True, 7), (40, False, 3), (36, False, 5)):
        offs = _random_groups(m, groups_, seed=n)
        a = planted(m, 2 * n, dtype, seed=n, scale=2.0)
        grad = planted(m, n, dtype, seed=n + 1, specials=False)
        bwd = mxq.fused_quant(dact=name, rowwise=rowwise, colwise=True, dbias=True, scale_layout=layout)(_ident)
        want = bwd.reference(grad, act_input=a, group_offsets=offs)
        v_abs = None if exact else v_abs_sum(bwd.inner, grad, a[:, :n], a[:, n:], 0.0, group_offsets=offs)
        gc, ac, oc = grad.cuda(), a.cuda(), offs.cuda()
        got = bwd(gc, act_input=ac, group_offsets=oc, out=poisoned(bwd, gc, oc))
        assert got.dbias.shape == (groups_, 2 * n)
        bound = None if exact else v_bound(bwd, grad, act_input=a)
        assert compare(got, want, exact, v_abs, v_bound=bound) == [], (n, offs.tolist())
        again = bwd(gc, act_input=ac, group_offsets=oc)  # (allocating)
        assert compare(again, want, exact, v_abs, v_bound=bound) == [], n


@pytest.mark.gpu
@pytest.mark.parametrize("n", [256, 96])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["swiglu", "geglu", "sreglu"])
@pytest.mark.parametrize("one", [True, False])
def test_one_cta_halves_match_reference(name, dtype, n, one, monkeypatch):
    """Tuning.halves_one_cta (the default) and one CTA per half on the GPU: the same bytes as the
    reference; MXQ_STRICT: a fallback to the reference would fail."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(100, 2 * n, generator=gen) * 2).to(dtype)
    grad = torch.randn(100, n, generator=gen).to(dtype)
    for opts in (dict(dbias=True), dict(amax=True, scale_layout="swizzled")):
        op = mxq.fused_quant(dact=name, rowwise=True, colwise=True, **opts)(_ident)
        inner = _one_cta(op, one)
        args = [grad, a[:, :n], a[:, n:], 0.0]
        want = inner.reference(*args)
        exact = name in EXACT
        v_abs = v_abs_sum(inner, *args) if op.spec.dbias and not exact else None
        cu = [t.cuda() for t in args[:3]] + [0.0]
        got = inner(*cu, out=poisoned(inner, cu[0]))
        assert compare(got, want, exact, v_abs, v_bound=None if exact else v_bound(inner, *args)) == [], opts


@pytest.mark.gpu
def test_gated_backward_with_straddling_blocks_falls_back(monkeypatch):
    monkeypatch.setenv("MXQ_STRICT", "1")
    bwd = mxq.fused_quant(dact="swiglu", rowwise=True)(_ident)
    with pytest.raises(Exception, match="straddle"):
        bwd(torch.randn(32, 40, device="cuda"), act_input=torch.randn(32, 80, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("case", GATED_FWD_FORMATS, ids=_fmt_ids)
def test_gated_forward_in_other_formats_on_cuda(case, dtype, monkeypatch):
    """The gated forward in FP8 block scaling (1x128, the transposed copy, 128x128 tiles), MXFP4
    and NVFP4 (1x16, 16x16 tiles) on the kernels, every input dtype: byte for byte against the
    reference (_check_gated_forward); MXQ_STRICT: no fallback. CPU counterpart:
    test_gated_forward_in_other_formats_is_served."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    fmt, opts = case
    _check_gated_forward(fmt, opts, dtype, "cuda")
