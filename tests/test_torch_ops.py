"""mxq under torch.compile (mxq/integrations/torch_ops.py), on CPU: one operator node per call, no graph
break (fullgraph=True), static and dynamic shapes, the same bytes as eager; the operator passes
torch.library.opcheck; MXFP8Tensor is a pytree node (an input and an output of compiled code)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import mxq
from mxq.integrations import torch_ops
from mxq.testing import compare

ROOT = Path(__file__).resolve().parent.parent


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
    assert len([leaf for leaf in leaves if leaf is not None]) == 5 and len(leaves) == 8  # (colwise_amax: NVFP4's)
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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_grouped_result_keeps_its_own_offsets(backend):
    """A grouped result holds a copy of group_offsets, compiled as eager: refilling the caller's
    offsets buffer afterwards changes neither t.group_offsets nor what t.group(g) returns."""
    x = torch.randn(96, 64)
    offs = torch.tensor([32, 96])
    f = torch.compile(lambda a, o: mxq.quantize(a, rowwise=False, colwise=True, group_offsets=o), backend=backend,
                      fullgraph=True)
    for t in (f(x, offs), mxq.quantize(x, rowwise=False, colwise=True, group_offsets=offs)):
        offs.copy_(torch.tensor([64, 96]))
        assert t.group_offsets.tolist() == [32, 96]
        assert t.group(0).shape == (32, 64)
        assert torch.equal(t.group(0).colwise_data.view(torch.uint8), t.colwise_data[:32].view(torch.uint8))
        offs.copy_(torch.tensor([32, 96]))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_compiled_grouped_fp4_writes_the_eager_bytes(fmt):
    """A grouped NVFP4 / MXFP4 call compiles to the eager bytes (NVFP4's per-group amax [G]
    included; with a per-group global_amax too, with and without fullgraph)."""
    from mxq.testing import same_bytes

    offs = torch.tensor([0, 18, 20, 60, 60, 124, 130], dtype=torch.int32)
    x = torch.randn(130, 96, dtype=torch.bfloat16)
    f = torch.compile(lambda a, o: mxq.quantize(a, format=fmt, colwise=True, group_offsets=o), fullgraph=True)
    got, want = f(x, offs), mxq.quantize(x, format=fmt, colwise=True, group_offsets=offs)
    for field in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None) and (a is None or same_bytes(a, b)), field
    assert got.group_offsets.tolist() == offs.tolist() and (fmt == "mxfp4" or got.amax.shape == (7,))
    if fmt == "nvfp4":  # (global_amax with groups: one fused_quant_fp4 node; fullgraph and not)
        per = torch.arange(1, 8, dtype=torch.float32)
        for full in (True, False):
            g = torch.compile(lambda a, o, p: mxq.quantize(a, format=fmt, colwise=True, group_offsets=o, global_amax=p),
                              fullgraph=full)
            got, want = g(x, offs, per), mxq.quantize(x, format=fmt, colwise=True, group_offsets=offs, global_amax=per)
            for field in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
                assert same_bytes(getattr(got, field), getattr(want, field)), (full, field)


def test_compiled_calls_with_requires_grad_inputs_trace_and_carry_no_gradient():
    """A compiled training step that quantizes activations: inputs with requires_grad trace (no
    autograd formula is asked for) and the outputs carry no gradient, as in eager."""
    x = torch.randn(64, 64, requires_grad=True)
    r = torch.randn(64, 64)

    @mxq.fused_quant(dbias=True, amax=True, colwise=True)
    def resid(a, b):
        return a + b

    for fn in (lambda a: mxq.quantize(a, colwise=True, amax=True), lambda a: resid(a, r)):
        got = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
        want = fn(x.detach())
        assert compare(got, want, exact=True) == []
        assert not got.amax.requires_grad and (got.dbias is None or not got.dbias.requires_grad)


def _compiled_outputs(f, args, mode, dynamic):
    """``f(*args)`` fullgraph-compiled in ``mode``, run three times (reduce-overhead records its CUDA
    graph on a later call): the last call's outputs, the GPU synchronised."""
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, dynamic=dynamic, mode=mode)
    for _ in range(3):
        got = cf(*args)
    torch.cuda.synchronize()
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("mode,dynamic", [(None, False), (None, True), ("reduce-overhead", False)])
def test_compiled_cuda_calls_write_the_eager_bytes(mode, dynamic):
    """On the GPU, a fullgraph-compiled function of a plain cast and a fused op (static and dynamic
    shapes, and captured in a CUDA graph by mode="reduce-overhead") writes the bytes of the same
    calls made eagerly."""

    def f(x, b):
        return mxq.quantize(x, rowwise=True, colwise=True), resid(x, b, alpha=0.25)

    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    want = f(x, b)
    got = _compiled_outputs(f, (x, b), mode, dynamic)
    assert [p for g, w in zip(got, want) for p in compare(g, w, exact=True)] == []


@mxq.fused_quant(act="swiglu", colwise=True)
def glu(x):
    return x


def _every_kind(x, offs):
    """One call of each kind the MXFP8-only compiled tests leave out: FP8 block scaling's
    GEMM-ready copy, MXFP4, a grouped MXFP8 call, a gated forward."""
    return (mxq.quantize(x, format="fp8_block", colwise=True, scale_layout="gemm"),
            mxq.quantize(x, format="mxfp4", colwise=True),
            mxq.quantize(x, colwise=True, group_offsets=offs),
            glu(x))


def test_every_kind_compiles_with_the_eager_bytes():
    """_every_kind fullgraph-compiled on CPU writes the eager calls' bytes (the GPU side:
    test_compiled_cuda_calls_of_every_kind_write_the_eager_bytes)."""
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    offs = torch.tensor([0, 40, 40, 128], dtype=torch.int32)
    got = torch.compile(_every_kind, fullgraph=True, backend="aot_eager")(x, offs)
    for g, w in zip(got, _every_kind(x, offs)):
        assert compare(g, w, exact=True) == []


@pytest.mark.gpu
@pytest.mark.parametrize("mode,dynamic", [(None, False), (None, True), ("reduce-overhead", False)])
def test_compiled_cuda_calls_of_every_kind_write_the_eager_bytes(mode, dynamic):
    """On the GPU, _every_kind fullgraph-compiled (static, dynamic, and captured in a CUDA graph)
    writes the eager calls' bytes. CPU counterpart: test_every_kind_compiles_with_the_eager_bytes."""
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([0, 100, 100, 612, 1024], dtype=torch.int32, device="cuda")
    want = _every_kind(x, offs)
    got = _compiled_outputs(_every_kind, (x, offs), mode, dynamic)
    assert [p for g, w in zip(got, want) for p in compare(g, w, exact=True)] == []


@pytest.mark.gpu
@pytest.mark.parametrize("mode,dynamic", [(None, False), (None, True), ("reduce-overhead", False)])
def test_compiled_cuda_fp4_call_values_write_the_eager_bytes(mode, dynamic):
    """On the GPU (the NVFP4 kernels): a given amax tensor, stochastic rounding with a seed and an
    offset, and the Hadamard transform's pair, fullgraph-compiled (static, dynamic, and captured in
    a CUDA graph), write the eager calls' bytes. CPU counterpart:
    test_fp4_call_values_compile_to_one_node_with_the_eager_bytes."""
    def f(x, a):
        return (mxq.quantize(x, format="nvfp4", colwise=True, global_amax=a),
                sr_scaled(x, s=0.5, seed=2 ** 63 + 11, offset=8),
                mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True))

    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    a = x.float().abs().amax().reshape(1)
    want = f(x, a)
    for g, w in zip(_compiled_outputs(f, (x, a), mode, dynamic), want):
        _same_fp4(g, w)
    drawn = torch.compile(lambda u: sr_scaled(u), fullgraph=True, mode=mode)  # (a seed drawn per call)
    a, b, c = (drawn(x).rowwise_data.clone() for _ in range(3))
    assert not torch.equal(b, c) and not torch.equal(a, b)


def test_import_mxq_does_not_load_torch_dynamo():
    """torch._dynamo takes about a second to import, more than the rest of ``import mxq``: mxq
    leaves it to torch.compile, which loads it before it traces (bench/import_time.py)."""
    code = "import sys, mxq; print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))"
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "[]"


def test_constant_result_marks_as_torch_does():
    """torch_ops.constant_result marks a function as torch.compiler.assume_constant_result does
    (so torch.compile runs it once while tracing and keeps its result)."""
    def f():
        return 1

    def g():
        return 1

    torch.compiler.assume_constant_result(f)
    torch_ops.constant_result(g)
    marks = {k: v for k, v in vars(f).items()}
    assert marks and vars(g) == marks
    for fn in (torch_ops._spec_key, torch_ops._halves, torch_ops._scalar_names, torch_ops._tensor_names,
               mxq.op._quantize_op_id):
        assert {k: getattr(fn, k, None) for k in marks} == marks, fn.__name__


@mxq.fused_quant(act="silu")
def _plus_r(x, r):
    return x + r


@mxq.fused_quant(dact="gelu")
def _back(dy):
    return dy


def test_compiled_calls_refuse_a_number_where_a_tensor_goes_with_mxqs_message():
    """A number in an epilogue's tensor slot, or as noop or act_input: under torch.compile mxq's
    TypeError, as eager (not the operator schema's error)."""
    plus, back = _plus_r, _back
    x = torch.randn(8, 32)
    for fn, words in ((lambda a: plus(a, 2.0), "argument 'r' must be a torch.Tensor, got float; to pass a number"),
                      (lambda a: mxq.quantize(a, noop=1.0), "argument 'noop' must be a one-element float32 torch.Tensor or None"),
                      (lambda a: back(a, act_input=1.0), "argument 'act_input' must be a torch.Tensor, got float")):
        with pytest.raises(TypeError, match=words):
            fn(x)
        torch._dynamo.reset()
        with pytest.raises(TypeError, match=words):
            torch.compile(fn, backend="aot_eager")(x)


@mxq.fused_quant(act="silu")
def _posonly(x, /, r, t: float = 2.0):
    return x * t + r


def test_compiled_calls_refuse_what_eager_refuses_with_its_message():
    """A positional-only parameter passed by name, an input of an unserved dtype, a dact input of
    another dtype: under torch.compile eager's error (the traced binding accepted the name; the
    fake implementation named MXFP8Tensor.empty's 'dtype' for a float64 input)."""
    x, r = torch.randn(8, 32), torch.randn(8, 32)
    cases = ((lambda a: _posonly(x=a, r=r), TypeError, "'x' parameter is positional only"),
             (lambda a: _plus_r(a.double(), r.double()), TypeError, "argument 'x' must be float32, float16 or bfloat16"),
             (lambda a: _plus_r(a, r.half()), TypeError, "argument 'r' has dtype torch.float16 but 'x' has torch.float32"),
             (lambda a: _back(a, act_input=a.half()), TypeError, "argument 'act_input' has dtype torch.float16"))
    for fn, error, words in cases:
        with pytest.raises(error, match=words):
            fn(x)
        torch._dynamo.reset()
        with pytest.raises(error, match=words):
            torch.compile(fn, backend="aot_eager")(x)
    assert torch.equal(torch.compile(lambda a: _posonly(a, r=r).rowwise_data, backend="aot_eager")(x).view(torch.uint8),
                       _posonly(x, r).rowwise_data.view(torch.uint8))


def test_compiled_fp4_amax_and_noop_that_require_grad_trace():
    """NVFP4's global_amax and a noop computed in the graph from a tensor that requires grad: the
    compiled call traces (no autograd formula asked for) and writes the eager bytes."""
    h = torch.randn(16, 64, requires_grad=True)
    cases = (lambda a: mxq.quantize(a.detach(), format="nvfp4", global_amax=a.abs().amax()),
             lambda a: mxq.quantize(a.detach(), colwise=True, noop=(a.sum() * 0).reshape(1)))
    for fn in cases:
        torch._dynamo.reset()
        got = torch.compile(fn, backend="aot_eager")(h)
        assert compare(got, fn(h), exact=True) == []


def test_compiled_gated_op_refuses_a_bad_input_with_mxqs_message():
    """A gated op's argument checks under torch.compile: mxq's own ValueError without fullgraph
    (dynamo re-raises it), and under fullgraph (which forbids that) dynamo's error carrying mxq's
    message, as for every op."""
    def ident(x):
        return x

    swiglu = mxq.fused_quant(act="swiglu")(ident)
    odd = torch.randn(64, 63)
    words = "holds the gate and up halves along its last dimension, which must be even"
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=words):
        torch.compile(lambda x: swiglu(x), backend="aot_eager")(odd)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=words):
        torch.compile(lambda x: swiglu(x), backend="aot_eager", fullgraph=True)(odd)


@pytest.mark.parametrize("layout", ["compact", "gemm"])
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_fp8_block_through_the_operator(layout, block):
    """FP8 block scaling under torch.compile: opcheck (the gemm layout's strided scale views in the
    fakes as in the real outputs), one graph, the eager bytes and the format carried through."""
    x = torch.randn(40, 256, dtype=torch.bfloat16)
    i = mxq.op._quantize_op_id("e4m3", True, True, None, layout, True, "fp8_block", block)
    torch.library.opcheck(torch.ops.mxq.fused_quant.default, ([x], [], None, None, None, i))
    opts = dict(format="fp8_block", block=block, colwise=True, scale_layout=layout)
    # (a reset: a recompile of the same lambda for another block would make the block's ints
    # dynamic, which _quantize_op_id, a constant function, cannot take)
    torch._dynamo.reset()
    got = torch.compile(lambda t: mxq.quantize(t, **opts), fullgraph=True)(x)
    want = mxq.quantize(x, **opts)
    assert (got.format, got.block) == ("fp8_block", block)
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        g, w = getattr(got, f), getattr(want, f)
        assert g.stride() == w.stride() and torch.equal(g.float(), w.float())


_CACHE_CHILD = """
import sys, torch, mxq
from torch._dynamo.utils import counters

def e4m3(x):
    return x * 2.0

def e5m2(x):
    return x * 3.0

ops = {f.__name__: mxq.fused_quant(fp8=f.__name__)(f) for f in (globals()[n] for n in sys.argv[1].split(","))}
x = torch.linspace(-4.0, 4.0, 64 * 128).reshape(64, 128)
for name in sys.argv[2].split(","):
    op = ops[name]
    before = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    got = torch.compile(lambda t: op(t).dequantize(), fullgraph=True)(x)
    hit = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"] > before
    same = torch.equal(got.view(torch.int32), op(x).dequantize().view(torch.int32))
    print(name, "hit" if hit else "miss", "same" if same else "DIFFERENT")
"""


def test_compiled_graphs_cached_on_disk_keep_their_op_across_processes(tmp_path):
    """inductor's FX graph cache and the AOTAutograd cache key a graph by its code and constants,
    and the graph bakes in the op's output dtypes: the operator's op argument must name the op the
    same way in every process and differently for different ops. Two processes share the caches
    and build an e4m3 op (x * 2) and an e5m2 op (x * 3) in opposite orders; the second compiles
    the e5m2 op first (a per-process counter would give it the number the first process's e4m3
    graph was cached under, whose dequantize then reads e5m2 bytes as e4m3), then the e4m3 op
    (the first process's graph, loaded from the cache). Compiled bytes equal eager bytes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "MXQ_CACHE_DIR": str(tmp_path / "mxq"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}

    child = tmp_path / "child.py"  # (a file: mxq reads an epilogue's source)
    child.write_text(_CACHE_CHILD)

    def run(order, compiled):
        got = subprocess.run([sys.executable, str(child), order, compiled], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        assert got.returncode == 0, got.stderr[-3000:]
        return got.stdout.split("\n")[:-1]

    assert run("e4m3,e5m2", "e4m3") == ["e4m3 miss same"]
    assert run("e5m2,e4m3", "e5m2,e4m3") == ["e5m2 miss same", "e4m3 hit same"]


def test_nvfp4_and_mxfp4_compile_through_the_operator():
    x = torch.randn(32, 64)
    for kw in (dict(format="nvfp4", colwise=True, scale_layout="swizzled"), dict(format="mxfp4", colwise=True)):
        got = torch.compile(lambda u, kw=kw: mxq.quantize(u, **kw), fullgraph=True)(x)
        want = mxq.quantize(x, **kw)
        for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax"):
            a, b = getattr(got, f), getattr(want, f)
            as_bytes = (lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)  # noqa: E731
            assert (a is None) == (b is None) and (a is None or torch.equal(as_bytes(a), as_bytes(b))), f
        assert (got.format, got.block) == (want.format, want.block)


FP4_FIELDS = ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax", "colwise_amax")


def test_compiled_fp4_call_refuses_an_odd_last_dimension_with_mxqs_message():
    """An FP4 call whose packed dimension is odd: eager's ValueError naming the format under
    torch.compile too (the fake implementation raised it as MXFP8Tensor.empty's 'shape', inside
    torch's TorchRuntimeError)."""
    x = torch.randn(16, 17)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="format='nvfp4' packs two E2M1 elements per byte"):
        torch.compile(lambda x: mxq.quantize(x, format="nvfp4"), backend="aot_eager")(x)
    with pytest.raises(Exception, match="format='nvfp4' packs two E2M1 elements per byte"):
        _graphs(lambda x: mxq.quantize(x, format="nvfp4"), x)
    with pytest.raises(Exception, match="argument 's' must be a float"):  # (named first, as eager names it)
        _graphs(lambda x: sr_scaled(x, "bad"), x)


@mxq.fused_quant(colwise=True, dact="swiglu")
def _dswiglu(dy):
    return dy


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4", "mxfp4"])
def test_compiled_gated_backward_into_out_writes_the_eager_bytes(fmt, device):
    """A gated backward's out= is [..., 2N] for dy of [..., N]: the traced out= operator describes
    its buffers at the op's output shape (it took dy's and refused the call)."""
    op = mxq.fused_quant(format=fmt, colwise=True, dact="swiglu")(_dswiglu.fn)
    dy, act_input = torch.randn(64, 64, device=device), torch.randn(64, 128, device=device)
    want = op(dy, act_input=act_input)
    into = op(dy * 3, act_input=act_input)
    torch._dynamo.reset()
    got = torch.compile(lambda d, a, t: op(d, act_input=a, out=t), backend="eager", fullgraph=True)(dy, act_input, into)
    assert got is into and tuple(got.shape) == (64, 128)
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
        a, b = getattr(got, f), getattr(want, f)
        assert (a is None) == (b is None) and (a is None or torch.equal(a.reshape(-1).view(torch.uint8),
                                                                        b.reshape(-1).view(torch.uint8))), f


def _same_fp4(got, want):
    for f in FP4_FIELDS:
        a, b = getattr(got, f), getattr(want, f)
        as_bytes = (lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)  # noqa: E731
        assert (a is None) == (b is None) and (a is None or torch.equal(as_bytes(a), as_bytes(b))), f


def test_numbers_dynamo_traces_as_dynamic_compile_or_are_refused_by_name():
    """Under dynamic=True dynamo traces Python numbers as symbolic: NVFP4's global_amax as a
    number traces in one graph with eager's bytes (its check compares, reading no tensor) and a
    bad one raises mxq's message; an int beyond 2^53 (an epilogue float, global_amax), which the
    call rounds to fp32 from its digits, is refused by name there and gives eager's bytes when
    static."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)

    def amax_given(x, a):
        return mxq.quantize(x, format="nvfp4", global_amax=a)

    for a in (2.0, 3.5):
        got, graphs = _graphs(amax_given, x, a, dynamic=True)
        assert len(graphs) == 1
        _same_fp4(got, amax_given(x, a))
    torch._dynamo.reset()
    compiled = torch.compile(amax_given, backend="eager", fullgraph=True, dynamic=True)
    compiled(x, 2.0)
    with pytest.raises(Exception, match="argument 'global_amax' must be >= 0"):
        compiled(x, -1.0)
    big = 2 ** 53 + 2 ** 29 + 1  # (rounded once: 2^53 + 2^30; through float64 first: 2^53)
    y, r = torch.ones(4, 32), torch.full((4, 32), -2.0 ** 53)

    def scaled(y, r, a):
        return resid(y, r, alpha=a)

    got, _ = _graphs(scaled, y, r, big)
    assert torch.equal(got.rowwise_data.view(torch.uint8), resid(y, r, alpha=big).rowwise_data.view(torch.uint8))
    assert got.amax.item() == resid(y, r, alpha=big).amax.item() != resid(y, r, alpha=float(big)).amax.item()
    class Int(int):  # (a subclass of int, constant while tracing: rounded from its digits, not refused)
        pass

    got, _ = _graphs(scaled, y, r, Int(big))
    assert got.amax.item() == resid(y, r, alpha=big).amax.item()
    for fn, args, name in ((scaled, (y, r, big), "alpha"), (amax_given, (x, 2 ** 60 + 1), "global_amax"),
                           (amax_given, (x, 2 ** 128 - 2 ** 103 - 1), "global_amax")):  # (eager: finite, taken)
        with pytest.raises(Exception, match=f"argument '{name}': an int beyond 2\\^53 that torch.compile traces"):
            _graphs(fn, *args, dynamic=True)


@mxq.fused_quant(format="nvfp4", colwise=True, stochastic_rounding=True, act="relu")
def sr_scaled(x, s: float = 2.0):
    return x * s


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_tuple_option_held_in_a_closure_compiles(dynamic):
    """mxq.quantize's block= from a closure (dynamo makes its ints symbolic under dynamic=True,
    and an op's options must be constants): one node, the eager bytes; a bool in it is still
    refused by name."""
    x = torch.randn(256, 256, dtype=torch.bfloat16)
    block = [128, 128]
    got, graphs = _graphs(lambda u: mxq.quantize(u, format="fp8_block", colwise=True, block=block), x,
                          dynamic=dynamic)
    assert len(_mxq_nodes(graphs)) == 1
    want = mxq.quantize(x, format="fp8_block", colwise=True, block=(128, 128))
    assert got.block == (128, 128) and torch.equal(got.rowwise_scale, want.rowwise_scale)
    assert torch.equal(got.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8))
    bad = (True, 128)
    with pytest.raises(Exception, match="block"):
        _graphs(lambda u: mxq.quantize(u, format="fp8_block", block=bad), x, dynamic=dynamic)


REFUSED_OPTIONS = [  # (options of mxq.quantize eager calls refuse, and the words of the refusal)
    (dict(fp8="e9m9"), ValueError, "fp8 must be one of"),
    (dict(format="fp8_block", block=(1.0, 128.0)), ValueError, "block must"),
    (dict(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=[float(v) for v in [1, -1] * 8]), ValueError,
     "hadamard_signs must"),
    (dict(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=[1] * 15), ValueError,
     "hadamard_signs must be 16 ints"),
    (dict(format="nvfp4", colwise=True, hadamard=True, hadamard_signs=list(torch.tensor([1, -1] * 8))), ValueError,
     "hadamard_signs must"),
]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("options,exc,words", REFUSED_OPTIONS, ids=["fp8", "float-block", "float-signs", "short-signs",
                                                                   "tensor-signs"])
def test_compiled_quantize_refuses_what_eager_refuses_with_mxqs_exception(options, exc, words, dynamic):
    """Each option an eager call refuses is refused under torch.compile too (floats equal to a
    block size or a sign are not taken for ints), as mxq's own exception class without fullgraph
    and as dynamo's Unsupported carrying mxq's message under fullgraph (the validation inside
    the op's constant identity would otherwise surface as dynamo's internal error)."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    held = dict(options)  # (held by the closure: under dynamic=True its ints are traced symbolically)
    with pytest.raises(exc, match=words):
        mxq.quantize(x, **held)
    torch._dynamo.reset()
    with pytest.raises(exc, match=words):
        torch.compile(lambda u: mxq.quantize(u, **held), backend="aot_eager", dynamic=dynamic)(x)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=words):
        torch.compile(lambda u: mxq.quantize(u, **held), backend="aot_eager", fullgraph=True, dynamic=dynamic)(x)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("offsets,exc,words", [
    (torch.tensor([[32, 64]]), ValueError, "'group_offsets' must be 1-D"),
    (torch.tensor([], dtype=torch.int64), ValueError, "'group_offsets' must be 1-D with at least one group end"),
    (torch.tensor([32.0, 64.0]), TypeError, "'group_offsets' must be int32 or int64")])
def test_compiled_calls_refuse_malformed_group_offsets_as_eager(offsets, exc, words, dynamic):
    """Group ends of the wrong rank, none, or float are refused under torch.compile as in eager
    mode: mxq's exception without fullgraph, dynamo's Unsupported carrying mxq's message with it
    (they reached the operator's fake implementation: torch's TorchRuntimeError, not a ValueError)."""
    x = torch.randn(64, 128)
    with pytest.raises(exc, match=words):
        mxq.quantize(x, group_offsets=offsets)
    for fullgraph in (False, True):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported if fullgraph else exc, match=words):
            torch.compile(lambda u, g: mxq.quantize(u, group_offsets=g), backend="eager", fullgraph=fullgraph,
                          dynamic=dynamic)(x, offsets)


def test_non_strict_export_of_a_grouped_call():
    """torch.export without strict mode traces a grouped call (its group ends a FakeTensor, which
    the form check while tracing takes), with the eager bytes."""
    class Grouped(torch.nn.Module):
        def forward(self, x, g):
            return mxq.quantize(x, colwise=True, group_offsets=g).colwise_scale

    x, g = torch.randn(64, 128), torch.tensor([32, 64])
    exported = torch.export.export(Grouped(), (x, g), strict=False)
    assert torch.equal(exported.module()(x, g), Grouped()(x, g))


@pytest.mark.parametrize("dynamic", [False, True])
def test_fp4_call_values_compile_to_one_node_with_the_eager_bytes(dynamic):
    """NVFP4's own call values under torch.compile: global_amax as a tensor and as a float,
    stochastic rounding with a seed of 64 bits and an offset (a decorated op's too), and the
    Hadamard transform's amax pair; one torch.ops.mxq.fused_quant_fp4 node each, no graph break,
    the eager call's bytes. A seed left out is drawn when the compiled call runs, from torch's
    generator as in eager mode (the same bytes after torch.manual_seed), a new one for each call."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    ga = torch.tensor([3.5])
    cases = [
        (lambda u, a: mxq.quantize(u, format="nvfp4", colwise=True, global_amax=a),
         dict(format="nvfp4", colwise=True), dict(global_amax=ga)),
        (lambda u, a: mxq.quantize(u, format="nvfp4", global_amax=2.75), dict(format="nvfp4"), dict(global_amax=2.75)),
        (lambda u, a: mxq.quantize(u, format="nvfp4", colwise=True, stochastic_rounding=True, seed=2 ** 64 - 5,
                                   offset=2 ** 40 + 3),
         dict(format="nvfp4", colwise=True, stochastic_rounding=True), dict(seed=2 ** 64 - 5, offset=2 ** 40 + 3)),
        (lambda u, a: mxq.quantize(u, format="nvfp4", colwise=True, hadamard=True),
         dict(format="nvfp4", colwise=True, hadamard=True), {}),
        # (a given pair with the transform, as two floats and as a tensor; a caller's sign vector)
        (lambda u, a: mxq.quantize(u, format="nvfp4", colwise=True, hadamard=True, global_amax=(2.5, 3.25)),
         dict(format="nvfp4", colwise=True, hadamard=True), dict(global_amax=(2.5, 3.25))),
        (lambda u, a: mxq.quantize(u, format="nvfp4", colwise=True, hadamard=True, global_amax=a.repeat(2)),
         dict(format="nvfp4", colwise=True, hadamard=True), dict(global_amax=ga.repeat(2))),
    ]
    for f, opts, kw in cases:
        got, graphs = _graphs(f, x, ga, dynamic=dynamic)
        assert [str(n.target) for n in _mxq_nodes(graphs)] == ["mxq.fused_quant_fp4"]
        _same_fp4(got, mxq.quantize(x, **opts, **kw))
    got, graphs = _graphs(lambda u: sr_scaled(u, s=1.5, seed=7, offset=12), x, dynamic=dynamic)
    assert len(_mxq_nodes(graphs)) == 1
    _same_fp4(got, sr_scaled(x, s=1.5, seed=7, offset=12))
    torch._dynamo.reset()
    once = torch.compile(lambda u: sr_scaled(u), fullgraph=True, dynamic=dynamic)
    once(x)  # (compiling draws from torch's generator too)
    torch.manual_seed(5)
    got = once(x)
    torch.manual_seed(5)
    _same_fp4(got, sr_scaled(x))
    assert not torch.equal(once(x).rowwise_data, once(x).rowwise_data)  # (a new seed each call)
    a, b = torch.compile(lambda u: (sr_scaled(u), sr_scaled(u)), fullgraph=True, dynamic=dynamic)(x)
    assert not torch.equal(a.rowwise_data, b.rowwise_data)  # (two calls, two draws: never merged)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_callers_hadamard_signs_are_their_own_node(dynamic):
    """TE's transform and a caller's sign vector in one compiled function: two fused_quant_fp4
    nodes naming two ops (the signs are in the op's identity), each with its eager call's bytes,
    which differ."""
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    signs = [-1, 1] * 8  # (a list in a closure: symbolic ints under dynamic=True, taken as constants)
    got, graphs = _graphs(lambda u: (mxq.quantize(u, format="nvfp4", colwise=True, hadamard=True),
                                     mxq.quantize(u, format="nvfp4", colwise=True, hadamard=True,
                                                  hadamard_signs=signs)),
                          x, dynamic=dynamic)
    nodes = _mxq_nodes(graphs)
    assert len(nodes) == 2 and nodes[0].args[-1] != nodes[1].args[-1]
    te, own = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True), mxq.quantize(
        x, format="nvfp4", colwise=True, hadamard=True, hadamard_signs=signs)
    _same_fp4(got[0], te)
    _same_fp4(got[1], own)
    assert not torch.equal(te.colwise_data, own.colwise_data)


@mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True, scale_layout="swizzled")
def rht(x):
    return x


def _same(x):
    return x


def test_fp4_operator_passes_opcheck_and_bad_call_values_are_named_under_compile():
    """opcheck of fused_quant_fp4 (fake against real outputs): a seed's two halves and an offset, a
    seed drawn when it runs, a given amax tensor, the Hadamard amax pair, a grouped call's amax
    per group; bad values refused by name while tracing."""
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    plain = mxq.fused_quant(format="nvfp4", colwise=True)(_same)
    offs = torch.tensor([0, 10, 32], dtype=torch.int32)
    for op, scalars, amax, seed, offset, groups in (
            (sr_scaled, [1.0], None, [9, 1], 4, None), (sr_scaled, [1.0], None, [], None, None),
            (sr_scaled, [0.5], torch.tensor([2.0]), [3, 0], 0, None), (rht, [], None, [], None, None),
            (rht, [], torch.tensor([2.0, 3.0]), [], None, None),
            (plain, [], torch.tensor([1.0, 2.0, 3.0]), [], None, offs)):
        torch.library.opcheck(torch.ops.mxq.fused_quant_fp4.default,
                              ([x], scalars, None, None, amax, None, seed, offset, groups, torch_ops.op_id(op)))
    with pytest.raises(Exception, match="seed"):
        torch.compile(lambda u: sr_scaled(u, seed=-1), fullgraph=True)(x)
    with pytest.raises(Exception, match="global_amax"):
        torch.compile(lambda u: mxq.quantize(u, format="mxfp4", global_amax=1.0), fullgraph=True)(x)
    with pytest.raises(Exception, match="global_amax"):  # (hadamard=True's amax is a pair)
        torch.compile(lambda u: rht(u, global_amax=1.0), fullgraph=True)(x)
    o = mxq.MXFP8Tensor.empty(sr_scaled.spec, x.shape, x.dtype, "cpu")
    with pytest.raises(Exception, match="out="):
        torch.compile(lambda u: sr_scaled(u, seed=3, out=o), fullgraph=True)(x)


@mxq.fused_quant(act="gelu", format="fp8_block", scale_layout="gemm")
def gemm_bias(acc, b, s: float = 1.0):
    return acc * s + b


@mxq.fused_quant(act="silu", scale_mode="even")
def gemm_resid(acc, r):
    return acc + r


@mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")
def gemm_both(acc, b):
    return acc + b


@mxq.fused_quant(dact="gelu", dbias=True, colwise=True)
def gemm_dgelu(acc):
    return acc


@pytest.mark.parametrize("dynamic", [False, True])
def test_op_gemm_compiles_to_one_node_with_the_eager_bytes(dynamic):
    """op.gemm under torch.compile: one torch.ops.mxq.fused_gemm node per call (a bias row and a
    float; a full residual; both directions with the transposed colwise copy; a dact op's
    act_input, with dbias), no graph break,
    the eager call's bytes (on CPU the reference on the fp32 matmul), static and dynamic M."""
    def f(a, w, b, r):
        return (gemm_bias.gemm(a, w, b, s=0.5), gemm_resid.gemm(a, w, r), gemm_both.gemm(a, w, b),
                gemm_dgelu.gemm(a, w, act_input=r))

    for m in (64, 40):
        a = torch.randn(m, 256, dtype=torch.bfloat16)
        w, b = torch.randn(384, 256, dtype=torch.bfloat16), torch.randn(384, dtype=torch.bfloat16)
        r = torch.randn(m, 384, dtype=torch.bfloat16)
        got, graphs = _graphs(f, a, w, b, r, dynamic=dynamic)
        nodes = _mxq_nodes(graphs)
        assert len(graphs) == 1 and [str(n.target) for n in nodes] == ["mxq.fused_gemm"] * 4
        for g, want in zip(got, f(a, w, b, r)):
            assert isinstance(g, mxq.MXFP8Tensor) and g.shape == (m, 384) and g.format == want.format
            assert compare(g, want, exact=True) == []
            assert g.rowwise_scale.stride() == want.rowwise_scale.stride()
            if want.colwise_data is not None:  # (the transposed copy [N, M] and its outer-dim-major scales too)
                assert g.colwise_data.shape == want.colwise_data.shape
                assert g.colwise_scale.stride() == want.colwise_scale.stride()
        assert got[2].colwise_data.shape == (384, m)


def test_op_gemm_operator_passes_opcheck_and_refuses_out_and_the_hook_under_compile():
    """opcheck of fused_gemm (fake against real outputs: the gemm layout's outer-dim-major scales);
    acc_out= (the eager test hook) and out= are refused by name while tracing."""
    a, w = torch.randn(48, 128, dtype=torch.bfloat16), torch.randn(256, 128, dtype=torch.bfloat16)
    b = torch.randn(256, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.mxq.fused_gemm.default, (a, w, [b], [0.25], torch_ops.op_id(gemm_bias)))
    acc = torch.empty(48, 256)
    with pytest.raises(Exception, match="acc_out"):
        torch.compile(lambda a, w, b: gemm_bias.gemm(a, w, b, acc_out=acc), fullgraph=True)(a, w, b)
    o = mxq.MXFP8Tensor.empty(gemm_bias.spec, (48, 256), a.dtype, "cpu", row_align=1)
    with pytest.raises(Exception, match="out= serves eager calls only"):
        torch.compile(lambda a, w, b: gemm_bias.gemm(a, w, b, out=o), fullgraph=True)(a, w, b)


@pytest.mark.parametrize("ends", [[10, 64], (64,), 64])
def test_compiled_group_offsets_that_are_not_a_tensor_are_named(ends):
    """A traced call checks group_offsets' type before the operator's schema refuses it in
    torch's words: mxq's TypeError naming it, as eager."""
    x = torch.randn(64, 32)
    with pytest.raises(TypeError, match="'group_offsets' must be a torch.Tensor"):
        mxq.quantize(x, colwise=True, group_offsets=ends)
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="'group_offsets' must be a torch.Tensor"):
        torch.compile(lambda u: mxq.quantize(u, colwise=True, group_offsets=ends), backend="aot_eager")(x)


def test_compiled_calls_refuse_tensors_on_another_device_or_meta():
    """A traced call whose tensors do not share the input's device (here the meta device: an
    operand, act_input, noop, group_offsets, or the input itself) is refused by name, as eager
    refuses it: such a call dispatches to the operator's fake implementation, which returned
    outputs of unwritten memory. op.gemm's operands are checked by its own route first."""
    x = torch.randn(64, 64)
    meta = dict(device="meta")
    cases = [("group_offsets", lambda u: mxq.quantize(u, colwise=True, group_offsets=torch.tensor([30, 64], **meta))),
             ("noop", lambda u: mxq.quantize(u, noop=torch.zeros(1, **meta))),
             ("'r'", lambda u: _plus_r(u, torch.randn(64, **meta))),
             ("act_input", lambda u: _back(u, act_input=torch.randn(64, 64, **meta))),
             ("'x'", lambda u: mxq.quantize(u.to("meta")))]
    for name, fn in cases:
        with pytest.raises(ValueError, match=f"{name}.* (is on|on the) meta"):
            fn(x)
        torch._dynamo.reset()
        with pytest.raises(ValueError, match=f"{name}.* (is on|on the) meta"):
            torch.compile(fn, backend="aot_eager")(x)
    a, w = torch.randn(48, 128, dtype=torch.bfloat16), torch.randn(256, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="argument 'b' must be on a's device cpu, got meta"):
        torch.compile(lambda a, w: gemm_bias.gemm(a, w, torch.randn(256, dtype=torch.bfloat16, **meta)),
                      backend="aot_eager")(a, w)


def test_an_exported_program_calling_quantize_runs_in_a_fresh_process(tmp_path):
    """A torch.export program that calls mxq.quantize, loaded in a process that has made no
    quantize op yet, finds the op its identity names (torch_ops._op builds mxq.quantize's own ops
    from their spec key; it raised 'no live op of identity'), with the eager call's bytes; an
    identity of no op is still refused by name."""
    class M(torch.nn.Module):
        def forward(self, x):
            return mxq.quantize(x, colwise=True, fp8="e5m2").colwise_data

    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(M(), (torch.randn(64, 128),)), str(path))
    child = (f"import torch, mxq\nep = torch.export.load({str(path)!r})\n"
             "x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))\n"
             "got = ep.module()(x).view(torch.uint8)\n"
             "want = mxq.quantize(x, colwise=True, fp8='e5m2').colwise_data.view(torch.uint8)\n"
             "print('equal', torch.equal(got, want))\n")
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600, cwd=root,
                         env=dict(os.environ, PYTHONPATH=root, PYTHONWARNINGS="ignore"))
    assert "equal True" in out.stdout, out.stdout + out.stderr[-2000:]
    with pytest.raises(RuntimeError, match="no live op of identity"):
        torch_ops._op("fffff-" + "0" * 32 + "-0.0.0")


def test_dynamic_shapes_compile_once_whichever_dim_is_larger():
    """A dynamic-shape compile of mxq.quantize holds no guard relating M and N (MXFP8Tensor.empty
    checks each size's sign alone: a min() over the sizes guarded N >= M, and a call with M > N
    recompiled)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    f = torch.compile(lambda x: mxq.quantize(x).rowwise_data, backend=counter, dynamic=True)
    for shape in ((64, 128), (96, 160), (160, 96)):
        x = torch.randn(*shape)
        assert torch.equal(f(x).view(torch.uint8), mxq.quantize(x).rowwise_data.view(torch.uint8))
    assert counter.frame_count == 1


@mxq.fused_quant(dact="swiglu", colwise=True, dbias=True, amax=True)
def _dswiglu(g):
    return g


@mxq.fused_quant(act="gelu", dbias=True, colwise=True, amax=True)
def _res_gelu(x, r, alpha: float = 1.0):
    return x * alpha + r


@pytest.mark.parametrize("strict", [True, False])
def test_torch_export_of_gated_backward_given_amax_and_out(strict):
    """torch.export, strict and not (its default: the Python code sees FakeTensors, which the
    checks took for a tensor subclass mxq does not handle): a gated backward, NVFP4 with a
    global_amax tensor and out= export, and the program gives eager's bytes."""
    g, a = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)
    x, r = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)

    class Gated(torch.nn.Module):
        def forward(self, g, a):
            t = _dswiglu(g, act_input=a)
            return t.rowwise_data.view(torch.uint8), t.colwise_scale, t.dbias

    class GivenAmax(torch.nn.Module):
        def forward(self, x, amax):
            t = mxq.quantize(x, format="nvfp4", global_amax=amax)
            return t.rowwise_data, t.rowwise_scale.view(torch.uint8)

    class Out(torch.nn.Module):
        def forward(self, x, r):
            o = mxq.MXFP8Tensor.empty(_res_gelu.spec, x.shape, x.dtype, x.device)
            t = _res_gelu(x, r, out=o)
            return t.rowwise_data.view(torch.uint8), t.colwise_scale, t.dbias, t.amax

    for m, args in ((Gated(), (g, a)), (GivenAmax(), (x, torch.tensor(4.0))), (Out(), (x, r))):
        got = torch.export.export(m, args, strict=strict).module()(*args)
        want = m(*args)
        assert all(torch.equal(u, v) for u, v in zip(got, want)), type(m).__name__
