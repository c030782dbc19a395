"""On a CUDA device: the eager fast routes (FusedOp._fast_call, FusedOp._plans: a checked
call's route kept for later calls) give the reference's bytes, and bad input on them still
raises naming the argument. CPU counterparts: tests/test_runtime.py (the fast path's gatekeeping
with a stand-in launcher), tests/test_call.py (Call.key)."""

import pytest
import torch

import mxq
from mxq.testing import compare, is_exact, planted, poisoned

pytestmark = pytest.mark.gpu

M, N = 96, 256


def _bias(x, b):
    return x + b


def _axpy(x, alpha: float, r):
    return x * alpha + r


def _ident(x):
    return x


def _cuda(*ts):
    return [t.cuda() for t in ts]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_operand_kinds_on_the_fast_path_match_the_reference(dtype):
    """Row, column, scalar, full and strided operands: the first call is checked, the later ones
    go straight to the native dispatcher (which launches every kind itself), fresh inputs each."""
    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(_bias)
    for seed, second in enumerate([(N,), (M, 1), (1,), (M, N), (M, N), "strided", (N,)]):
        x = planted(M, N, dtype, seed=seed)
        if second == "strided":
            wide = planted(M, 2 * N, dtype, seed=seed + 50)
            b, bc = wide[:, :N], wide.cuda()[:, :N]  # (a view on the device too)
        else:
            rows = second[0] if len(second) == 2 else 1  # (a row [N] or a scalar [1]: from the first row)
            b = planted(M, N, dtype, seed=seed + 50)[:rows, :second[-1]].reshape(second)
            bc = b.cuda()
        want = op.reference(x, b)
        got = op(x.cuda(), bc)
        assert compare(got, want, is_exact(op)) == [], second
        assert (dtype, 0) in [(k[0], k[1]) for k in op._fast], "the allocating route was kept"


def test_floats_keywords_and_strided_first_input_match_the_reference():
    op = mxq.fused_quant(rowwise=True, colwise=True, act="silu")(_axpy)
    for seed in range(3):  # (the second and third calls: fast)
        x, r = planted(M, N, torch.bfloat16, seed=seed), planted(M, N, torch.bfloat16, seed=seed + 9)
        want = op.reference(x, 0.25 * (seed + 1), r)
        assert compare(op(*_cuda(x), 0.25 * (seed + 1), *_cuda(r)), want, is_exact(op)) == []
        assert compare(op(x.cuda(), r=r.cuda(), alpha=0.25 * (seed + 1)), want, is_exact(op)) == []
        wide = torch.cat([x, r], dim=1).cuda()
        assert compare(op(wide[:, :N], 0.25 * (seed + 1), r.cuda()), want, is_exact(op)) == []
    assert op._plans, "the keyword and strided calls' routes were kept"


def test_an_int_float_argument_rounds_to_fp32_once_on_every_route():
    """An int float argument beyond 2^53 (2^60 + 2^36 + 1: fp32 2^60 + 2^37, through float64
    2^60) gives the bytes of its exact fp32 value on the allocating route, out= and a kept
    route, as the reference does (CPU counterpart: tests/test_epilogue.py
    test_int_constants_round_to_fp32_once)."""
    op = mxq.fused_quant(rowwise=True)(_axpy)
    big, exact = 2 ** 60 + 2 ** 36 + 1, 2.0 ** 60 + 2.0 ** 37
    # every value an E4M3 tie (1.0625, between 1.0 and 1.125) under a block maximum of 224 (scale
    # 2^0): times 2^60 (the doubly rounded value) ties to 1.0, times the exact one rounds to 1.125
    x = torch.full((M, N), 1.0625 * 2.0 ** -60)
    x[:, ::32] = 224 * 2.0 ** -60
    r = torch.zeros(M, N)
    want = op.reference(x, exact, r)
    assert compare(op.reference(x, big, r), want, True) == []
    assert compare(op.reference(x, 2.0 ** 60, r), want, True) != []  # (the test would see a double rounding)
    for _ in range(2):  # (the second call: the kept route)
        assert compare(op(*_cuda(x), big, *_cuda(r)), want, True) == []
        out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cuda")
        assert compare(op(*_cuda(x), big, *_cuda(r), out=out), want, True) == []


def test_out_noop_groups_and_gated_on_kept_routes_match_the_reference():
    both = mxq.fused_quant(rowwise=True, colwise=True)(_ident)
    offsets = torch.tensor([0, 32, 32, M], dtype=torch.int32)
    glu = mxq.fused_quant(rowwise=True, colwise=True, act="swiglu")(_ident)
    for seed in range(3):
        x = planted(M, N, torch.bfloat16, seed=seed)
        xc = x.cuda()
        assert compare(both(xc, out=poisoned(both, xc)), both.reference(x), True) == []
        out = poisoned(both, xc)
        assert compare(both(xc, out=out, noop=torch.zeros(1, device="cuda")), both.reference(x), True) == []
        skipped = both(xc, out=out, noop=torch.ones(1, device="cuda"))  # writes nothing
        assert compare(skipped, both.reference(x), True) == []
        assert compare(both(xc, noop=torch.ones(1, device="cuda")), both.reference(x, noop=torch.ones(1)), True) == []
        assert compare(both(xc, group_offsets=offsets.cuda()), both.reference(x, group_offsets=offsets), True) == []
        w = planted(M, 2 * N, torch.bfloat16, seed=seed + 5)
        assert compare(glu(w.cuda()), glu.reference(w), is_exact(glu)) == []
    assert both._plans and glu._plans


def test_bad_input_on_the_fast_path_raises_by_name():
    """After fast calls, a second call of another dtype, device, shape, layout or aliasing still
    raises naming the argument, before anything is written."""
    op = mxq.fused_quant(rowwise=True, colwise=True)(_bias)
    x, b = _cuda(planted(M, N, torch.bfloat16), planted(1, N, torch.bfloat16).reshape(N))
    out = poisoned(op, x)
    op(x, b)
    op(x, b, out=out)
    op(x, b)
    op(x, b, out=out)  # (both routes kept)
    with pytest.raises(TypeError, match="'b'"):
        op(x, b.float())
    with pytest.raises(ValueError, match="'b'"):
        op(x, b.cpu())
    with pytest.raises(ValueError, match="'b'"):
        op(x, b[: N // 2])  # does not broadcast
    with pytest.raises(TypeError, match="'b'"):
        op(x, 1.5)
    with pytest.raises(ValueError, match="out"):
        op(x, b, out=poisoned(op, x[: M // 2]))  # another shape
    same = poisoned(op, x)
    same.colwise_data = same.rowwise_data  # the same layout as `out`: the kept route checks the overlap
    with pytest.raises(ValueError, match="overlaps"):
        op(x, b, out=same)
    inside = poisoned(op, x)
    inside.rowwise_data = x.view(torch.uint8).view(-1)[: M * N].view(M, N).view(inside.rowwise_data.dtype)
    with pytest.raises(ValueError, match="overlaps"):
        op(x, b, out=inside)
    e5 = mxq.MXFP8Tensor.empty(mxq.QuantSpec(rowwise=True, colwise=True, fp8="e5m2"), x.shape, x.dtype, x.device)
    with pytest.raises(ValueError, match="out"):
        op(x, b, out=e5)
    with pytest.raises(ValueError, match="noop"):
        op(x, b, out=out, noop=torch.zeros(2, device="cuda"))


def _python_binding(op, call):
    """The call through Launcher.run, the Python binding of the kernels (the route grouped and
    noop calls took before the native dispatcher launched them)."""
    from mxq.runtime.launch import zeroed_out

    return op._launcher_for(call.tensors[0]).run(zeroed_out(op.spec, op.epilogue, call), None)


@pytest.mark.parametrize("ends", [[0, 32, 32, M], [M], [5, 40, 41, M]])
def test_grouped_calls_on_the_native_routes_match_the_reference_and_the_python_binding(ends):
    """Grouped calls (empty groups, partial blocks) on the allocating route (first checked, then
    the fast path) and into ``out`` on the destination-passing one: the reference's bytes within
    the op's class, the Python binding's bytes exactly, the ends recorded as a copy."""
    from mxq.runtime.call import Call

    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True, dact="gelu", dbias=True)(_ident)
    for seed in range(3):
        x, a = planted(M, N, torch.bfloat16, seed=seed), planted(M, N, torch.bfloat16, seed=seed + 7)
        offs = torch.tensor(ends, dtype=torch.int32)
        want = op.reference(x, act_input=a, group_offsets=offs)
        xc, ac, oc = *_cuda(x, a), offs.cuda()
        # (freed NaN blocks of the dbias's size: the route's allocation may get one back; an empty
        # group's row is the reduction's to write, not a memset's)
        junk = [torch.full((len(ends), N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(8)]
        del junk
        got = op(xc, act_input=ac, group_offsets=oc)
        assert compare(got, want, is_exact(op)) == [] and got.group_offsets.tolist() == ends
        assert got.group_offsets.data_ptr() != oc.data_ptr()
        assert compare(got, _python_binding(op, Call([xc], [], ac, None, None, oc)), True) == []
        out = mxq.MXFP8Tensor.empty(op.spec, xc.shape, xc.dtype, xc.device, group_offsets=oc)
        assert compare(op(xc, act_input=ac, group_offsets=oc, out=out), want, is_exact(op)) == []
    assert (torch.bfloat16, 0) in op._fast


def test_noop_calls_on_the_allocating_route_start_zeroed():
    """A noop call without ``out`` (allocating route, zeroed natively): noop 1.0 returns all-zero
    outputs even where the allocator hands back memory a previous call wrote; noop 0.0 the
    reference's bytes and the Python binding's."""
    from mxq.runtime.call import Call

    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True, dact="gelu", dbias=True)(_ident)
    x, a = planted(M, N, torch.bfloat16, seed=3), planted(M, N, torch.bfloat16, seed=4)
    xc, ac = _cuda(x, a)
    one, zero = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda")
    for grouped in (None, torch.tensor([0, 50, M], dtype=torch.int32, device="cuda")):
        for _ in range(3):
            dirty = op(xc, act_input=ac, group_offsets=grouped)  # (its memory freed below, then reused)
            del dirty
            z = op(xc, act_input=ac, noop=one, group_offsets=grouped)
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
                assert not getattr(z, f).reshape(-1).view(torch.uint8).any(), f
        want = op.reference(x, act_input=a, group_offsets=None if grouped is None else grouped.cpu())
        got = op(xc, act_input=ac, noop=zero, group_offsets=grouped)
        assert compare(got, want, is_exact(op)) == []
        assert compare(got, _python_binding(op, Call([xc], [], ac, zero, None, grouped)), True) == []


def test_gated_forward_fast_path_matches_the_reference():
    glu = mxq.fused_quant(rowwise=True, colwise=True, act="swiglu")(_ident)
    for seed, shape in enumerate([(M, 2 * N), (M, 2 * N), (3, 32, 2 * N), (M, 2 * N)]):
        w = planted(shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1], torch.bfloat16, seed=seed).reshape(shape)
        assert compare(glu(w.cuda()), glu.reference(w), is_exact(glu)) == []
    with pytest.raises(ValueError, match="'x'.*even"):
        glu(torch.zeros(M, 2 * N - 2, device="cuda", dtype=torch.bfloat16)[:, :2 * N - 3])
    assert glu._fast
    # operands of each kind, split (full, row) or shared (column, scalar) by the fast path
    ops = mxq.fused_quant(rowwise=True, colwise=True, act="swiglu")(_gated_operands)
    w, r = planted(M, 2 * N, torch.bfloat16, seed=7), planted(M, 2 * N, torch.bfloat16, seed=8)
    for second in (r[0].contiguous(), r[:, :1].contiguous(), r[0, 0].clone(), r, r[0].contiguous()):
        got = ops(w.cuda(), second.cuda(), 0.75)
        assert compare(got, ops.reference(w, second, 0.75), is_exact(ops)) == [], tuple(second.shape)
    assert ops._fast


def _gated_operands(x, b, alpha: float):
    return x * alpha + b


def test_bad_keywords_on_the_fast_path_raise_by_name():
    """Keywords, noop and group ends on the fast path: bad values still raise naming them."""
    op = mxq.fused_quant(rowwise=True, colwise=True)(_bias)
    x, b = _cuda(planted(M, N, torch.bfloat16), planted(1, N, torch.bfloat16).reshape(N))
    op(x, b)
    op(x, b=b)  # (fast from here)
    with pytest.raises(TypeError, match="'b'"):
        op(x, b=b.float())
    with pytest.raises(ValueError, match="noop"):
        op(x, b, noop=torch.zeros(2, device="cuda"))
    with pytest.raises(ValueError, match="noop"):
        op(x, b, noop=torch.zeros(1))  # (on the CPU)
    with pytest.raises(ValueError, match="group_offsets"):
        op(x, b, group_offsets=torch.tensor([M], dtype=torch.int32))  # (on the CPU)
    with pytest.raises(ValueError, match="group_offsets"):
        op(x, b, group_offsets=torch.tensor([[M]], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="group_offsets"):
        op(x, b, group_offsets=torch.zeros(0, dtype=torch.int32, device="cuda"))


def test_out_calls_on_the_token_route_match_the_reference_and_recheck_fields():
    """A checked call into ``out`` leaves the native route's token on it (launch.into_token);
    later calls into it take that route (FusedOp._fast_into, mxq.quantize's) and give the
    reference's bytes; a field set to a tensor of another shape, or resized in place, is checked
    again by Python, naming it; one re-strided in place (the same shape and dtype) is refused by
    the native dispatcher before anything runs, and then by the checked path in its words."""
    op = mxq.fused_quant(rowwise=True, colwise=True)(_bias)
    x, b = _cuda(planted(M, N, torch.bfloat16, seed=7), planted(1, N, torch.bfloat16, seed=8).reshape(N))
    want = op.reference(x.cpu(), b.cpu())
    out = poisoned(op, x)
    assert op(x, b, out=out) is out and "_mxq_into" in out.__dict__
    for _ in range(2):
        out.rowwise_data.view(torch.uint8).fill_(0xFF)
        assert op(x, b, out=out) is out and compare(out, want, True) == []
    q = poisoned(mxq.fused_quant(rowwise=True, colwise=True)(_ident), x)
    mxq.quantize(x, colwise=True, out=q)
    q.colwise_data.view(torch.uint8).fill_(0xFF)
    assert mxq.quantize(x, colwise=True, out=q) is q and compare(q, mxq.quantize(x.cpu(), colwise=True), True) == []
    good = out.rowwise_scale
    out.rowwise_scale = torch.zeros(3, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="out.rowwise_scale"):
        op(x, b, out=out)
    out.rowwise_scale = good
    op(x, b, out=out)
    good.resize_(3)  # (in place: another shape, which the token holds)
    with pytest.raises(ValueError, match="out.rowwise_scale"):
        op(x, b, out=out)
    good.resize_(M, N // 32)
    op(x, b, out=out)
    good.as_strided_((M, N // 32), (1, M))  # (the same shape and dtype, not contiguous: the native dispatcher refuses
    with pytest.raises(ValueError, match="'out.rowwise_scale' must be laid out"):  # it, the checked path names it)
        op(x, b, out=out)
