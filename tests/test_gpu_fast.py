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
