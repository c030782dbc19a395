"""mxq under torch.compile (mxq/integrations/torch_ops.py), on CPU: one operator node per call, no graph
break (fullgraph=True), static and dynamic shapes, the same bytes as eager; the operator passes
torch.library.opcheck; MXFP8Tensor is a pytree node (an input and an output of compiled code)."""

import pytest
import torch
import torch.utils._pytree as pytree

import mxq
from mxq.integrations import torch_ops
from mxq.testing import compare


@mxq.fused_quant(colwise=True, act="gelu", amax=True)
def resid(x, r, alpha: float = 0.5):
    return x * alpha + r


@mxq.fused_quant(dact="silu", dbias=True, colwise=True)
def grad(g):
    return g


def _graphs(fn, *args, dynamic=False):
    """Compile ``fn`` with fullgraph=True and a backend that records the FX graphs."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    return out, graphs


def _mxq_nodes(graphs):
    return [n for g in graphs for n in g.graph.nodes if n.op == "call_function" and "mxq" in str(n.target)]


@pytest.mark.parametrize("dynamic", [False, True])
def test_quantize_and_decorated_ops_compile_to_one_node_each(dynamic):
    def f(x, r, a):
        t = mxq.quantize(x, colwise=True, scale_mode="floor")
        u = resid(x, r, alpha=0.25)
        v = grad(r, act_input=a)
        return t, u, v

    x = torch.randn(64, 128, dtype=torch.bfloat16)
    r, a = torch.randn_like(x), torch.randn_like(x)
    got, graphs = _graphs(f, x, r, a, dynamic=dynamic)
    assert len(graphs) == 1 and len(_mxq_nodes(graphs)) == 3
    want = f(x, r, a)
    for g, w in zip(got, want):
        assert isinstance(g, mxq.MXFP8Tensor) and compare(g, w, exact=False) == []
    if dynamic:  # another shape, no recompile of the graph's structure needed for correctness
        x2 = torch.randn(96, 256, dtype=torch.bfloat16)
        got2 = torch.compile(f, fullgraph=True, dynamic=True)(x2, torch.randn_like(x2), torch.randn_like(x2))
        assert got2[0].colwise_data.shape == (96, 256)


def test_out_and_noop_under_compile():
    def f(x, out, noop):
        mxq.quantize(x, rowwise=True, colwise=True, out=out)
        return mxq.quantize(x * 2, noop=noop)

    x = torch.randn(32, 64)
    out = mxq.MXFP8Tensor.empty(mxq.QuantSpec(rowwise=True, colwise=True), x.shape, x.dtype, "cpu")
    t = torch.compile(f, fullgraph=True)(x, out, torch.ones(1))
    assert compare(out, mxq.quantize(x, rowwise=True, colwise=True), exact=True) == []
    assert not t.rowwise_data.view(torch.uint8).any(), "noop: nothing written (zeros)"


def test_mxfp8tensor_is_a_pytree_node_and_a_compiled_input():
    t = mxq.quantize(torch.randn(64, 96), rowwise=True, colwise=True, amax=True)
    leaves, spec = pytree.tree_flatten(t)
    assert len([leaf for leaf in leaves if leaf is not None]) == 5 and len(leaves) == 7
    back = pytree.tree_unflatten(leaves, spec)
    assert isinstance(back, mxq.MXFP8Tensor) and back.shape == t.shape and back.fp8 == t.fp8
    got = torch.compile(lambda u: u.dequantize("colwise") * 2, fullgraph=True)(t)
    assert torch.equal(got, t.dequantize("colwise") * 2)


@pytest.mark.parametrize("which", ["quantize", "resid", "grad", "odd"])
def test_operator_passes_opcheck(which):
    """opcheck (fake against real outputs, strides included); "odd": N % 8 != 0, whose data are
    views of padded rows (MXFP8Tensor.empty's default) in the fakes as in the real outputs."""
    x = torch.randn(40, 70 if which == "odd" else 96, dtype=torch.bfloat16)
    if which == "odd":
        args = ([x], [], None, None, None, mxq.op._quantize_op_id("e4m3", True, True, "rceil", "compact", False))
    elif which == "quantize":
        i = mxq.op._quantize_op_id("e5m2", True, True, "even", "swizzled", True)
        args = ([x], [], None, None, None, i)
    elif which == "resid":
        args = ([x, torch.randn_like(x)], [0.75], None, None, None, torch_ops.op_id(resid))
    else:
        args = ([x], [], torch.randn_like(x), None, None, torch_ops.op_id(grad))
    torch.library.opcheck(torch.ops.mxq.fused_quant.default, args)


def test_eager_calls_do_not_go_through_the_operator(monkeypatch):
    """Eager calls keep their host time: the torch operator runs only under torch.compile."""
    monkeypatch.setattr(torch_ops, "call", lambda *a, **k: pytest.fail("eager call went through torch_ops"))
    x = torch.randn(8, 64)
    mxq.quantize(x)
    resid(x, x)


def test_out_and_noop_under_compile_keep_eager_semantics():
    """noop=1 with out= leaves out as it was (a cached weight must survive); a wrong out or a
    bool for a float parameter is refused while tracing, as eager refuses them."""
    x = torch.randn(32, 64)
    out = mxq.quantize(x)
    snap = out.rowwise_data.view(torch.uint8).clone()
    f = torch.compile(lambda x, o, n: mxq.quantize(x * 3, out=o, noop=n), fullgraph=True)
    f(x, out, torch.ones(1))
    assert torch.equal(out.rowwise_data.view(torch.uint8), snap)
    with pytest.raises(Exception, match="out.rowwise_data' must be torch.float8_e4m3fn"):
        torch.compile(lambda x, o: mxq.quantize(x, out=o), fullgraph=True)(x, mxq.quantize(x, fp8="e5m2"))

    @mxq.fused_quant()
    def scaled(x, alpha: float = 1.0):
        return x * alpha

    with pytest.raises(Exception, match="'alpha' must be a float, got bool"):
        torch.compile(lambda x: scaled(x, alpha=True), fullgraph=True)(x)
