"""C++ callers through TVM-FFI, on CPU tensors (the registered function runs the reference)."""

from pathlib import Path

import math

import re

import pytest
import torch

import mxq
from mxq.frontend.spec import QuantSpec
from mxq.testing import planted, same_bytes

tvm_ffi = pytest.importorskip("tvm_ffi")


@mxq.fused_quant(colwise=True, dbias=True, amax=True, scale_mode="floor")
def resid(x, r, alpha: float = 1.0):
    return x * alpha + r


@pytest.fixture(scope="module")
def caller():
    import tvm_ffi.cpp

    resid.register("test_resid")
    src = (Path(__file__).parent / "cpp" / "caller.cc").read_text()
    return tvm_ffi.cpp.load_inline(
        name="mxq_test_caller", cpp_sources=src, extra_include_paths=[mxq.get_include()],
        functions=["call_registered", "call_error", "quantize_by_key", "concurrent_get", "bad_key_twice"])


def dests(m, n, fp8_rows=False):
    return dict(
        row_data=torch.full((m, n), 0xAB, dtype=torch.uint8),
        row_scale=torch.full((m, -(-n // 32)), 0xCD, dtype=torch.uint8),
        col_data=torch.full((m, n), 0xAB, dtype=torch.uint8).view(torch.float8_e4m3fn),
        col_scale=torch.full((-(-m // 32), n), 0xCD, dtype=torch.uint8),
        amax=torch.full((), -1.0), dbias=torch.zeros(n, dtype=torch.bfloat16))


def test_cpp_caller_fills_destinations_like_python(caller):
    x, r = planted(70, 96, torch.bfloat16, seed=1), planted(70, 96, torch.bfloat16, seed=2)
    d = dests(70, 96)
    caller.call_registered("test_resid", x, r, 0.5, d["row_data"], d["row_scale"], d["col_data"],
                           d["col_scale"], d["amax"], d["dbias"])
    want = resid(x, r, alpha=0.5)
    assert same_bytes(d["row_data"], want.rowwise_data.view(torch.uint8))
    assert same_bytes(d["col_data"], want.colwise_data)
    assert torch.equal(d["row_scale"], want.rowwise_scale) and torch.equal(d["col_scale"], want.colwise_scale)
    assert same_bytes(d["amax"], want.amax) and same_bytes(d["dbias"], want.dbias)


def test_python_call_of_the_global_matches(caller):
    g = tvm_ffi.get_global_func("mxq.test_resid")
    x, r = torch.randn(40, 64), torch.randn(40, 64)
    rd = torch.empty(40, 64, dtype=torch.uint8)
    rs = torch.empty(40, 2, dtype=torch.uint8)
    cd = torch.empty(40, 64, dtype=torch.float8_e4m3fn)
    cs = torch.empty(2, 64, dtype=torch.uint8)
    am, db = torch.empty(1), torch.empty(64)
    g(x, r, 2.0, None, rd, rs, cd, cs, am, db, None)
    want = resid(x, r, alpha=2.0)
    assert same_bytes(rd, want.rowwise_data.view(torch.uint8)) and torch.equal(db, want.dbias)
    before = rd.clone()
    g(x * 3, r, 2.0, None, rd, rs, cd, cs, am, db, torch.ones(1))  # noop
    assert torch.equal(rd, before)


def test_cpp_caller_gets_clean_errors(caller):
    x, r = torch.randn(8, 64), torch.randn(8, 63)
    d = list(dests(8, 64).values())  # (a bf16 dbias: an fp32 input's is fp32, d32's)
    d32 = d[:-1] + [torch.zeros(64)]
    err = caller.call_error("test_resid", x, r, True, *d32)
    assert err.startswith("ValueError:") and "'r' has shape" in err
    err = caller.call_error("test_resid", x, torch.randn(8, 64), False, *d32)
    assert err.startswith("ValueError:") and "rowwise_data" in err and "required" in err
    err = caller.call_error("test_resid", x, torch.randn(8, 64), True, *dests(8, 32).values())
    assert err.startswith("ValueError:") and "rowwise_data" in err
    xb = x.bfloat16()
    assert caller.call_error("test_resid", xb, xb, True, *d) == ""
    err = caller.call_error("test_resid", x, torch.randn(8, 64), True, *d)  # fp32 input, bf16 dbias
    assert err.startswith("ValueError:") and "'dbias' must be torch.float32, got torch.bfloat16" in err


def test_lazy_entrypoint_by_key(caller):
    spec = QuantSpec(scale_mode="even", fp8="e5m2")
    key = spec.key("bf16")
    x = planted(33, 70, torch.bfloat16, seed=5)
    data, scale = torch.empty(33, 70, dtype=torch.uint8), torch.empty(33, 3, dtype=torch.uint8)
    caller.quantize_by_key(key, x, data, scale)
    want = mxq.quantize(x, fp8="e5m2", scale_mode="even")
    assert same_bytes(data, want.rowwise_data.view(torch.uint8)) and torch.equal(scale, want.rowwise_scale)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_lazy_entrypoint_by_fp8_block_key(caller, device, layout):
    """mxq::GetQuantizeKernel of an FP8 block-scaling key from C++: fp32 scales into a flat
    buffer (the GEMM-ready layout's padded [ceil(N/128), roundup(M, 4)] one), the bytes of
    mxq.quantize (CPU: the reference through Python; CUDA: the dispatcher launches the kernel)."""
    key = QuantSpec(format="fp8_block", scale_layout=layout).key("bf16")
    x = planted(33, 300, torch.bfloat16, seed=6).to(device)
    want = mxq.quantize(x, format="fp8_block", scale_layout=layout)
    buf = want.rowwise_scale if layout == "compact" else want.rowwise_scale._base
    data, scale = torch.empty(33, 300, dtype=torch.uint8, device=device), torch.full_like(buf, -1.0).reshape(-1)
    assert scale.numel() == (33 * 3 if layout == "compact" else 3 * 36)  # (sizes written out)
    caller.quantize_by_key(key, x, data, scale)
    if device == "cuda":
        torch.cuda.synchronize()
    assert same_bytes(data.cpu(), want.rowwise_data.view(torch.uint8).contiguous().cpu())
    got = scale.view(buf.shape) if layout == "compact" else scale.view(buf.shape)[:, :33].t()
    assert same_bytes(got.cpu(), want.rowwise_scale.cpu())


def test_concurrent_first_calls_build_once(caller):
    key = QuantSpec(scale_mode="ceil", colwise=True).key("fp32")
    distinct, builds_before, errors = caller.concurrent_get(key, 1)
    distinct, builds, errors = caller.concurrent_get(QuantSpec(scale_mode="ceil", amax=True).key("fp16"), 16)
    assert (distinct, errors) == (1, 0)
    assert builds == builds_before + 1


def test_failure_is_not_cached(caller):
    assert caller.bad_key_twice(7 << 7) == "ValueError;ValueError;"  # act code 7 does not exist


def test_python_launch_path_through_the_dispatcher(monkeypatch):
    """The CUDA call path hands tensors to the native dispatcher; on CPU tensors the same
    plumbing reaches the reference, so the argument order is checked here without a GPU."""
    from mxq.runtime import targets
    from mxq.runtime.call import Call

    op = mxq.fused_quant(colwise=True, amax=True, dact="relu", dbias=True)(resid.fn)
    monkeypatch.setattr(targets, "device_arch", lambda device: "sm_90")  # the CPU route never compiles
    launcher = op._launcher_for(planted(40, 64, torch.bfloat16))
    assert launcher is op._launcher_for(planted(40, 64, torch.bfloat16)), "one launcher per device/dtype"
    x, r, a = (planted(40, 64, torch.bfloat16, seed=s) for s in (1, 2, 3))
    want = op.reference(x, r, alpha=0.25, act_input=a)
    from mxq.testing import compare

    call = Call([x, r], [0.25], a)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    # (the two native routes: allocating without out, noop calls too; destination-passing into out)
    for c, allocating in ((call, True), (call._replace(noop=torch.zeros(1)), True), (call._replace(out=out), False)):
        run, took = launcher.plan(c, ("full", "full"))
        assert took == allocating
        assert compare(run(c), want, exact=True) == []
    ends = torch.tensor([0, 17, 40], dtype=torch.int32)
    grouped = op.reference(x, r, alpha=0.25, act_input=a, group_offsets=ends)
    for c, allocating in ((call._replace(group_offsets=ends), True),
                          (call._replace(group_offsets=ends, out=mxq.MXFP8Tensor.empty(
                              op.spec, x.shape, x.dtype, "cpu", group_offsets=ends)), False)):
        run, took = launcher.plan(c, ("full", "full"))
        assert took == allocating
        got = run(c)
        assert compare(got, grouped, exact=True) == [] and got.group_offsets.tolist() == ends.tolist()
    # int64 ends: Python's binding (it converts them; launch.native_groups), never the allocating route
    assert launcher.plan(call._replace(group_offsets=ends.long()), ("full", "full"))[1] is False


def test_allocating_route_refuses_empty_inputs_and_bad_arity():
    """The allocating route (Python's ordinary CUDA calls) serves non-empty tensors; anything
    else is a clean error, never a crash (Python sends empty calls down the other routes)."""
    from mxq.runtime import slots

    op = mxq.fused_quant(rowwise=True, colwise=True, fp8="e5m2")(resid.fn)
    assert slots.dispatch_flags(op.spec) >> 7 & 1, "the fp8 format reaches the native allocator"
    alloc = op._native_dispatchers()[1]
    x = planted(8, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="non-empty"):
        alloc(x[:0], x[:0], 0.5, None, None)
    with pytest.raises(TypeError, match="expected 5 arguments"):
        alloc(x, x, 0.5, None)


def test_native_routes_refuse_tensors_no_kernel_can_read(raw_caller):
    """From a C++ caller's raw DLTensor*: a negative dimension, an element count past int64 (it
    wrapped to a small one), a null data pointer with elements, or a vector dtype (bfloat16x2)
    is refused naming the argument before anything runs, on the registered dispatcher and the
    allocating route alike; the allocating route also refuses 2^31 elements (Python sends those
    to the reference)."""
    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True)(resid.fn)
    disp, alloc = op._native_dispatchers()[:2]
    x = planted(8, 32, torch.bfloat16)
    d = dests(8, 32)
    full = [x, x, 0.5, None, d["row_data"], d["row_scale"], d["col_data"].view(torch.uint8), d["col_scale"],
            d["amax"].reshape(1), None, None]
    assert raw_caller.raw_call_error(disp, full, -1, "") == ""  # (sound: the CPU reference fills the outputs)
    zero_d = full[:8] + [d["amax"]] + full[9:]  # (a 0-d amax, as Python allocates it: no strides to pass on)
    assert raw_caller.raw_call_error(disp, zero_d, -1, "") == ""
    assert float(d["amax"]) != -1.0  # (written: dests() fills it with -1)
    for fn, args, cases in ((disp, full, ((0, "x"), (1, "r"), (4, "rowwise_data"), (8, "amax"))),
                            (alloc, [x, x, 0.5, None, None], ((0, "x"), (1, "r")))):
        for index, name in cases:
            for how, words in (("negative", "has a negative dimension (-1 at dimension 0)"),
                               ("overflow", "has more elements or bytes than an int64 counts"),
                               ("data", "has elements but no data (a null pointer)"),
                               ("lanes", "has a dtype of 2 lanes an element"),
                               ("negstride", "has a negative stride"),
                               ("null", "is a null DLTensor pointer")):
                msg = raw_caller.raw_call_error(fn, args, index, how)
                assert msg.startswith(f"ValueError: mxq: argument '{name}' {words}"), (how, msg)
    big = torch.zeros(1, dtype=torch.bfloat16).expand(2 ** 16, 2 ** 15)
    with pytest.raises(ValueError, match="fewer than 2\\^31 elements"):
        alloc(big, big, 0.5, None, None)


def _ident(x):
    return x


def _round256(b):
    return (b + 255) // 256 * 256


@pytest.mark.parametrize("shape", [(70, 200), (70, 199), (2, 5, 37)])
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("opts", [dict(rowwise=True, colwise=True), dict(rowwise=True), dict(rowwise=False, colwise=True),
                                  dict(rowwise=True, colwise=True, fp8="e5m2", amax=True)])
def test_allocating_route_layout(monkeypatch, opts, share, shape):
    """The native allocation of a call's outputs, run on CPU tensors (the reference fills them):
    each direction's scales sit at the next 256-byte boundary after its data in the same
    allocation; below ffi.SHARED_ALLOC_MAX_BYTES the colwise half follows the rowwise half in
    that one allocation too. Dtypes, shapes, strides (FP8 rows of N % 8 != 0 padded to 16
    bytes, by hand) and bytes are those of MXFP8Tensor.empty + the reference. GPU side:
    tests/test_gpu.py::test_allocating_route_frees_a_large_direction and
    test_default_outputs_pad_odd_rows."""
    from mxq.runtime import ffi

    monkeypatch.setattr(ffi, "SHARED_ALLOC_MAX_BYTES", 4 << 20 if share else 0)
    op = mxq.fused_quant(**opts)(_ident)  # a fresh op: its dispatcher reads the limit
    n = shape[-1]
    m = math.prod(shape[:-1])
    ld = n if n % 8 == 0 else -(-n // 16) * 16  # (the rows' stride, by hand)
    x = planted(m, n, torch.bfloat16, seed=11).reshape(shape)
    r = op._native_dispatchers()[1](x, None, None)
    want = op.reference(x)
    like = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "meta")
    names = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias")  # by hand
    assert names == mxq.runtime.slots.OUTPUTS
    assert isinstance(r, mxq.MXFP8Tensor) and r.shape == x.shape and r.group_offsets is None
    assert (r.fp8, r.scale_layout, r.scale_mode, r.format) == (op.spec.fp8, "compact", op.spec.scale_mode, "mxfp8")
    for name in names:
        g, w = getattr(r, name), getattr(like, name)
        assert (g is None) == (w is None), name
        if g is not None:
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), name
            if name.endswith("_data"):
                assert g.stride()[-2:] == (ld, 1), name
            assert same_bytes(g, getattr(want, name)), name
    data = _round256(m * ld)
    for d, s in (("rowwise_data", "rowwise_scale"), ("colwise_data", "colwise_scale")):
        if getattr(r, d) is not None:
            assert getattr(r, s).data_ptr() - getattr(r, d).data_ptr() == data, "scales at the 256-byte boundary"
    if op.spec.rowwise and op.spec.colwise:
        gap = r.colwise_data.data_ptr() - r.rowwise_data.data_ptr()
        assert (gap == data + _round256(m * ((n + 31) // 32))) == share, "colwise follows rowwise iff shared"

def test_registered_names_are_dotted_identifiers():
    """Issue 21 item 11: "a." and "a..b" were accepted; mxq's own entry point cannot be replaced."""
    for bad in ("a.", "a..b", ".a", "1a", "a-b", "", "é"):
        with pytest.raises(ValueError, match="identifier"):
            resid.register(bad)
    with pytest.raises(ValueError, match="get_quantize_kernel"):
        resid.register("get_quantize_kernel")
    assert resid.register("ok.name_2") is not None


def test_get_quantize_kernel_is_mxqs_attribute_and_the_global():
    """mxq.get_quantize_kernel (the public name) is the function the TVM-FFI global of that name
    calls: a key's dispatcher writes what mxq.quantize of its spec writes (CPU route)."""
    from mxq.frontend.spec import QuantSpec

    spec = QuantSpec(colwise=True, scale_mode="floor")
    x = torch.randn(40, 64)
    want = mxq.quantize(x, colwise=True, scale_mode="floor")
    for get in (mxq.get_quantize_kernel, tvm_ffi.get_global_func("mxq.get_quantize_kernel")):
        d = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
        get(spec.key("fp32"))(x, None, d.rowwise_data, d.rowwise_scale, d.colwise_data, d.colwise_scale, None, None,
                              None)
        assert torch.equal(d.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8))
        assert torch.equal(d.colwise_scale, want.colwise_scale)
    with pytest.raises(TypeError, match="key must be an int"):
        mxq.get_quantize_kernel("2")
    with pytest.raises(ValueError, match=r"^mxq: get_quantize_kernel\(\): the inner op of a gated activation"):
        mxq.get_quantize_kernel(QuantSpec(act="swiglu").key("bf16"))


def test_register_and_dispatcher_refusals_name_the_call():
    """register()'s and dispatcher()'s refusals name the function called, not the other."""
    for call, what in ((lambda g: resid.register("test_resid_named", gemm=g), "register()"),
                       (lambda g: resid.dispatcher(g), "dispatcher()")):
        with pytest.raises(TypeError, match=f"^mxq: {re.escape(what)} argument 'gemm' must be a bool, got int"):
            call(1)


@pytest.mark.parametrize("key", ["2", 2.0, 2.5, True])
def test_get_quantize_kernel_refuses_non_int_keys(key):
    g = tvm_ffi.get_global_func("mxq.get_quantize_kernel")
    with pytest.raises(TypeError, match="key must be an int"):
        g(key)


def test_cpu_route_names_a_bad_argument():
    """A string or an int in a tensor slot, or a string for a float, is a TypeError naming the
    argument (it was "from_dlpack received an invalid capsule", and alpha="0.5" was accepted)."""
    resid.register("test_resid_bad")
    g = tvm_ffi.get_global_func("mxq.test_resid_bad")
    x = torch.randn(40, 64)
    d = dests(40, 64)
    outs = (d["row_data"], d["row_scale"], d["col_data"], d["col_scale"], d["amax"].reshape(1),
            torch.zeros(64))
    with pytest.raises(TypeError, match=r"#1 \(r\) must be a tensor"):
        g(x, "r", 2.0, None, *outs, None)
    with pytest.raises(TypeError, match=r"#0 \(x\) must be a tensor"):
        g(7, x, 2.0, None, *outs, None)
    with pytest.raises(TypeError, match=r"#2 \(alpha\) must be a float"):
        g(x, x, "0.5", None, *outs, None)
    with pytest.raises(TypeError, match=r"rowwise_data\) must be a tensor or None"):
        g(x, x, 2.0, None, "rd", *outs[1:], None)
    # padded rows are written in place (they were once reshaped into a copy the call wrote
    # instead); data of any other layout is refused
    buf = torch.full((40, 80), 0xAB, dtype=torch.uint8)
    g(x, x, 2.0, None, buf[:, :64], *outs[1:], None)
    want = torch.empty_like(outs[0])
    g(x, x, 2.0, None, want, *outs[1:], None)
    assert torch.equal(buf[:, :64], want) and bool((buf[:, 64:] == 0xAB).all())
    strided = torch.zeros(40, 128, dtype=torch.uint8)[:, ::2]
    with pytest.raises(ValueError, match="'rowwise_data' must be contiguous or rows of unit stride"):
        g(x, x, 2.0, None, strided, *outs[1:], None)
    with pytest.raises(ValueError, match="'rowwise_scale' must be contiguous"):
        g(x, x, 2.0, None, outs[0], torch.zeros(40, 4, dtype=torch.uint8)[:, :2], *outs[2:], None)


def test_registered_op_refuses_outputs_that_share_memory():
    """An output that shares memory with another output or with an input (spans.h, before any
    route: the CPU route reaches it here; a kernel would write a byte while reading it, or
    twice) is a ValueError naming both arguments."""
    resid.register("test_resid_apart")
    g = tvm_ffi.get_global_func("mxq.test_resid_apart")
    x, r = torch.randn(40, 64), torch.randn(40, 64)
    d = dests(40, 64)
    outs = [d["row_data"], d["row_scale"], d["col_data"], d["col_scale"], d["amax"].reshape(1), torch.zeros(64)]
    in_x = x.view(torch.uint8).view(-1)[:40 * 64].view(40, 64)
    noop = torch.zeros(1)
    offs = torch.tensor([8, 40], dtype=torch.int32)
    for slot, bad, words in ((2, outs[0].view(torch.float8_e4m3fn), "'colwise_data' overlaps 'rowwise_data'"),
                             (0, in_x, "'rowwise_data' overlaps 'x'"),
                             (5, r[3], "'dbias' overlaps 'r'"),
                             (4, noop, "'amax' overlaps 'noop'")):
        args = list(outs)
        args[slot] = bad
        with pytest.raises(ValueError, match=words + " in memory"):
            g(x, r, 2.0, None, *args, noop)
    args = list(outs)
    args[4] = offs.view(torch.float32)[:1]
    with pytest.raises(ValueError, match="'amax' overlaps 'group_offsets' in memory"):
        g(x, r, 2.0, None, *args[:4], args[4], torch.zeros(2, 64), None, offs)
    g(x, r, 2.0, None, *outs, noop)  # apart: runs (the reference on CPU)
    assert torch.equal(outs[5], resid.reference(x, r, alpha=2.0).dbias)


def _grouped_dests(m, n, g, device="cpu"):
    """Destinations for resid with group_offsets (G groups), filled with stale bytes."""
    u8 = dict(dtype=torch.uint8, device=device)
    return [torch.full((m, n), 0xAB, **u8), torch.full((m, -(-n // 32)), 0xCD, **u8),
            torch.full((m, n), 0xAB, **u8), torch.full((m // 32 + g, n), 0xCD, **u8),
            torch.full((1,), -1.0, device=device), torch.zeros(g, n, dtype=torch.bfloat16, device=device)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_registered_op_takes_group_offsets(device):
    """The destination-passing route's optional trailing group_offsets: the same bytes as the
    Python grouped call (compact colwise scales [M // 32 + G, N], dbias [G, N]); a trailing None
    is an ungrouped call; grouped buffer sizes and the offsets are checked, naming the argument."""
    resid.register("test_resid_grouped")
    g = tvm_ffi.get_global_func("mxq.test_resid_grouped")
    x, r = planted(150, 64, torch.bfloat16, seed=1).to(device), planted(150, 64, torch.bfloat16, seed=2).to(device)
    for offs in (torch.tensor([0, 40, 41, 150], dtype=torch.int32), torch.tensor([150], dtype=torch.int64)):
        offs = offs.to(device)
        d = _grouped_dests(150, 64, offs.numel(), device)
        g(x, r, 0.5, None, *d, None, offs)
        want = resid(x, r, alpha=0.5, group_offsets=offs)
        got = [d[0], d[1], d[2], d[3], d[4], d[5]]
        for a, b in zip(got, (want.rowwise_data, want.rowwise_scale, want.colwise_data, want.colwise_scale,
                              want.amax.reshape(1), want.dbias)):
            assert same_bytes(a, b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
    d = _grouped_dests(150, 64, 1, device)
    d[3], d[5] = torch.empty(5, 64, dtype=torch.uint8, device=device), torch.empty(64, dtype=torch.bfloat16,
                                                                                   device=device)
    g(x, r, 0.5, None, *d, None, None)  # ungrouped
    assert same_bytes(d[3], resid(x, r, alpha=0.5).colwise_scale)
    offs = torch.tensor([0, 40, 41, 150], dtype=torch.int32, device=device)
    d = _grouped_dests(150, 64, 4, device)
    with pytest.raises(ValueError, match="colwise_scale.*grouped buffers"):
        g(x, r, 0.5, None, *d[:3], d[3][:-1], *d[4:], None, offs)
    with pytest.raises(TypeError, match="group_offsets.*int32 or int64"):
        g(x, r, 0.5, None, *d, None, offs.float())
    with pytest.raises(TypeError, match="expected 11 arguments"):
        g(x, r, 0.5, None, *d, None, offs, offs)


@mxq.fused_quant(rowwise=True, colwise=True, act="gelu")
def gelu_both(x):
    return x


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_registered_op_fp8_data_layouts(device):
    """The destination route's FP8 data: contiguous (any shape of M * N bytes), or rows of unit
    stride at least N apart with the input's row length (padded rows, written in place, padding
    untouched; size-1 leading dimensions with any stride; one row with any row stride). Refused,
    naming the argument: a last stride other than 1 (one row included: it was once taken as
    contiguous on CUDA) and rows of another length with the right count (an [8, 26] view of rows
    32 apart for a [16, 13] input: on CUDA this was once accepted and written out of bounds).
    CPU: ffi's Python route; CUDA: csrc/dispatch.cc's RowStride (not run on a GPU yet)."""
    gelu_both.register("test_gelu_both_layouts")
    g = tvm_ffi.get_global_func("mxq.test_gelu_both_layouts")
    u8 = dict(dtype=torch.uint8, device=device)

    def call(x, row_data, col_data):
        m, n = x.numel() // x.shape[-1], x.shape[-1]
        g(x, None, row_data, torch.empty(m, -(-n // 32), **u8), col_data, torch.empty(-(-m // 32), n, **u8),
          None, None, None)

    for shape, ld in (((16, 13), 16), ((4, 1, 13), 16), ((1, 13), 64), ((2, 3, 40), 48)):
        x = planted(math.prod(shape[:-1]), shape[-1], torch.bfloat16, seed=ld).reshape(shape).to(device)
        m, n = x.numel() // shape[-1], shape[-1]
        want = gelu_both(x, out=mxq.MXFP8Tensor.empty(gelu_both.spec, shape, x.dtype, device, row_align=1))
        bufs = [torch.full((m, ld), 0xAB, **u8) for _ in range(2)]
        call(x, *[b[:, :n].view(shape) for b in bufs])
        for b, w in zip(bufs, (want.rowwise_data, want.colwise_data)):
            assert same_bytes(b[:, :n], w.view(torch.uint8).reshape(m, n)), shape
            assert bool((b[:, n:] == 0xAB).all()), shape
    x = planted(16, 13, torch.bfloat16, seed=3).to(device)
    ok = torch.empty(16, 13, **u8)
    with pytest.raises(ValueError, match="'rowwise_data' must be contiguous or rows of unit stride"):
        call(x, torch.empty(16, 26, **u8)[:, ::2], ok)
    with pytest.raises(ValueError, match="'colwise_data' must be contiguous or rows of unit stride"):
        call(x, ok, torch.empty(8, 32, **u8)[:, :26])
    x1 = planted(1, 13, torch.bfloat16, seed=4).to(device)
    with pytest.raises(ValueError, match="'rowwise_data' must be contiguous or rows of unit stride"):
        call(x1, torch.empty(1, 26, **u8)[:, ::2], torch.empty(1, 13, **u8))


@mxq.fused_quant(rowwise=True, colwise=True, act="gelu")
def bias_gelu(x, b):
    return x + b


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_registered_op_takes_broadcast_operands_and_strided_views(device):
    """A bias [N] and strided half-views through the registered route: the bytes of the Python
    call (on CUDA the dispatcher hands such calls to the Python binding of the kernels)."""
    bias_gelu.register("test_bias_gelu")
    g = tvm_ffi.get_global_func("mxq.test_bias_gelu")
    xx = planted(96, 256, torch.bfloat16, seed=4).to(device)
    b = planted(1, 128, torch.bfloat16, seed=5).reshape(128).to(device)
    for x, bias in ((xx[:, :128], b), (xx[:, :128], xx[:, 128:]), (xx[:, 128:].contiguous(), b)):
        u8 = dict(dtype=torch.uint8, device=device)
        d = [torch.full((96, 128), 0xAB, **u8), torch.full((96, 4), 0xCD, **u8),
             torch.full((96, 128), 0xAB, **u8), torch.full((3, 128), 0xCD, **u8)]
        g(x, bias, None, *d, None, None, None)
        want = bias_gelu(x, bias)
        for a, w in zip(d, (want.rowwise_data, want.rowwise_scale, want.colwise_data, want.colwise_scale)):
            assert same_bytes(a, w.view(torch.uint8))
    with pytest.raises(ValueError, match="'b' has shape"):
        g(xx[:, :128], b[:100], None, *d, None, None, None)


def _gate_ident(x):
    return x


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_registered_gated_ops(device):
    """Gated ops register: their destination-passing function takes the op's own tensors (swiglu
    forward: x [M, 2N] into [M, N] outputs; backward: the gradient [M, N] and act_input [M, 2N]
    into [M, 2N] outputs and dbias [2N]) and runs in Python on every call (the reference on CPU,
    the kernels over the halves on CUDA); the bytes of the Python call, nothing written under
    noop, a destination of the input's width refused naming it."""
    fwd = mxq.fused_quant(act="swiglu", colwise=True, amax=True)(_gate_ident)
    bwd = mxq.fused_quant(dact="swiglu", colwise=True, dbias=True)(_gate_ident)
    assert fwd.register("test_swiglu") is not None and bwd.register("test_dswiglu") is not None
    m, n = 64, 96
    x = planted(m, 2 * n, torch.bfloat16, seed=3).to(device)
    dy = planted(m, n, torch.bfloat16, seed=4).to(device)

    def dests_of(width, dbias):
        u8 = dict(dtype=torch.uint8, device=device)
        return [torch.full((m, width), 0xAB, **u8), torch.full((m, width // 32), 0xCD, **u8),
                torch.full((m, width), 0xAB, **u8), torch.full((m // 32, width), 0xCD, **u8),
                torch.full((1,), -1.0, device=device),
                torch.zeros(width, dtype=torch.bfloat16, device=device) if dbias else None]

    for name, op, args, kw, width in (("test_swiglu", fwd, (x, None), {}, n),
                                      ("test_dswiglu", bwd, (dy, x), {"act_input": x}, 2 * n)):
        g = tvm_ffi.get_global_func(f"mxq.{name}")
        d = dests_of(width, op.spec.dbias)
        if not op.spec.amax:
            d[4] = None
        g(*args, *d, None)
        want = op(args[0], **kw)
        for got, w in zip(d, (want.rowwise_data, want.rowwise_scale, want.colwise_data, want.colwise_scale,
                              want.amax, want.dbias)):
            assert (got is None) == (w is None), name
            if got is not None:
                w = w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w
                assert same_bytes(got, w.reshape(got.shape)), name
        before = [t.clone() if t is not None else None for t in d]
        g(*(a * 3 if a is not None else None for a in args), *d, torch.ones(1, device=device))  # noop
        assert all(t is None or same_bytes(t, b) for t, b in zip(d, before)), name
        wrong = dests_of(2 * width if width == n else n, op.spec.dbias)
        if not op.spec.amax:
            wrong[4] = None
        with pytest.raises(ValueError, match="'rowwise_data' has"):
            g(*args, *wrong, None)
        with pytest.raises(ValueError, match="'x' must have at least one dimension"):
            g(torch.ones((), device=device), *args[1:], *d, None)


@mxq.fused_quant(rowwise=True, colwise=True, amax=True, dact="relu", dbias=True)
def _relu_back(x):
    return x


@pytest.mark.parametrize("shape", [(150, 64), (3, 50, 37)])
def test_allocating_route_grouped_and_noop_calls(shape):
    """The allocating route's optional group_offsets and its noop call, on CPU tensors (the
    reference fills them): grouped outputs of MXFP8Tensor.empty's sizes (colwise scales
    [M // 32 + G, N], dbias [G, N], contiguous data) with the reference's bytes, and a copy of
    the group ends last (a tensor of its own); a noop call's outputs all zero (noop 1.0 writes
    nothing); ends the route does not take (int64) refused by name. GPU side:
    tests/test_gpu_fast.py."""
    op, n = _relu_back, shape[-1]
    m = math.prod(shape[:-1])
    alloc = op._native_dispatchers()[1]
    x, a = (planted(m, n, torch.bfloat16, seed=s).reshape(shape) for s in (1, 2))
    offs = torch.tensor([0, 40, 41, m], dtype=torch.int32)
    r = alloc(x, a, None, offs)
    want = op.reference(x, act_input=a, group_offsets=offs)
    like = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "meta", group_offsets=offs.to("meta"))
    assert r.shape == x.shape
    for name in mxq.runtime.slots.OUTPUTS:
        g, w = getattr(r, name), getattr(like, name)
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), name
        assert same_bytes(g, getattr(want, name)), name
    ends = r.group_offsets
    assert ends.tolist() == offs.tolist() and ends.dtype == torch.int32 and ends.data_ptr() != offs.data_ptr()
    for grouped in (offs, None):
        z = alloc(x, a, torch.ones(1), grouped)
        fields = [getattr(z, name) for name in mxq.runtime.slots.OUTPUTS]
        assert all(not f.reshape(-1).view(torch.uint8).any() for f in fields if f.dim()), "zeroed outputs"
        assert float(z.amax) == 0.0 and (z.group_offsets is None) == (grouped is None)
        assert same_bytes(alloc(x, a, torch.zeros(1), grouped).rowwise_data, op.reference(x, act_input=a).rowwise_data)
    with pytest.raises(ValueError, match="'group_offsets'"):
        alloc(x, a, None, offs.long())
    with pytest.raises(ValueError, match="'group_offsets'"):
        alloc(x, a, None, torch.zeros(0, dtype=torch.int32))


@pytest.mark.parametrize("exchange", [True, False])
def test_allocating_route_result_with_and_without_torchs_exchange_api(monkeypatch, exchange):
    """The allocating route's one callback (ffi._wrap_callback) makes the MXFP8Tensor of torch
    tensors whether torch hands tvm-ffi its DLPack exchange API (one conversion call) or not (each
    tensor through torch.from_dlpack): the same fields and bytes as the reference, on CPU tensors."""
    from mxq.runtime import ffi

    monkeypatch.setattr(ffi, "TORCH_EXCHANGE_API", exchange and ffi.TORCH_EXCHANGE_API)
    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True)(_ident)  # a fresh op: fresh dispatchers
    x = planted(70, 64, torch.bfloat16, seed=5)
    r = op._native_dispatchers()[1](x, None, None)
    want = op.reference(x)
    assert isinstance(r, mxq.MXFP8Tensor) and r.shape == x.shape
    for name in mxq.runtime.slots.OUTPUTS:
        g, w = getattr(r, name), getattr(want, name)
        assert (g is None) == (w is None), name
        assert g is None or (type(g) is torch.Tensor and same_bytes(g, w)), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_registered_op_refuses_data_and_scales_of_another_one_byte_dtype(device):
    """FP8 data destinations take the op's FP8 dtype or its bytes (uint8), E8M0 scale ones uint8
    or torch.float8_e8m0fnu: another 1-byte dtype (the other FP8 format, int8, bool) is a
    TypeError naming the slot (they were viewed as the op's dtype: e4m3 bytes read back as e5m2
    values). CPU: ffi._destination; CUDA: csrc/dispatch.cc's DataBytes and scale check."""
    gelu_both.register("test_gelu_both_dtypes")
    g = tvm_ffi.get_global_func("mxq.test_gelu_both_dtypes")
    x = planted(64, 64, torch.bfloat16, seed=5).to(device)

    def call(rd, rs, cd=None, cs=None):
        u8 = dict(dtype=torch.uint8, device=device)
        g(x, None, rd, rs, torch.empty(64, 64, **u8) if cd is None else cd,
          torch.empty(2, 64, **u8) if cs is None else cs, None, None, None)

    want = gelu_both(x)
    for dt in (torch.uint8, torch.float8_e4m3fn):
        rd, rs = torch.empty(64, 64, dtype=dt, device=device), torch.empty(64, 2, dtype=torch.float8_e8m0fnu,
                                                                              device=device)
        call(rd, rs)
        assert same_bytes(rd.view(torch.uint8), want.rowwise_data.view(torch.uint8))
        assert same_bytes(rs.view(torch.uint8), want.rowwise_scale)
    ok_s = torch.empty(64, 2, dtype=torch.uint8, device=device)
    for dt in (torch.float8_e5m2, torch.int8, torch.bool):
        with pytest.raises(TypeError, match="'rowwise_data' must be a (torch.)?float8_e4m3fn or uint8"):
            call(torch.empty(64, 64, dtype=dt, device=device), ok_s)
        with pytest.raises(TypeError, match="'colwise_data' must be a (torch.)?float8_e4m3fn or uint8"):
            call(torch.empty(64, 64, dtype=torch.uint8, device=device), ok_s,
                 cd=torch.empty(64, 64, dtype=dt, device=device))
    for dt in (torch.int8, torch.float8_e4m3fn):
        with pytest.raises(TypeError, match="'rowwise_scale' must be a (torch.)?uint8 \\(E8M0 bytes\\) or float8_e8m0fnu"):
            call(torch.empty(64, 64, dtype=torch.uint8, device=device), torch.empty(64, 2, dtype=dt, device=device))


def test_fp4_data_destinations_take_torchs_packed_fp4_dtype():
    """An FP4 op's packed data destination takes uint8 or torch.float4_e2m1fn_x2 (two E2M1 codes a
    byte, the same bytes); another 1-byte dtype is named, with what it must be."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch without float4_e2m1fn_x2")
    op = mxq.fused_quant(format="mxfp4")(_ident_fp4)
    fn = op.dispatcher()
    x = torch.randn(8, 64)
    want = op(x)
    for dt in (torch.uint8, torch.float4_e2m1fn_x2):
        rd, rs = torch.empty(8, 32, dtype=dt), torch.empty(8, 2, dtype=torch.uint8)
        fn(x, None, rd, rs, None, None, None, None, None)
        assert torch.equal(rd.view(torch.uint8), want.rowwise_data) and torch.equal(rs, want.rowwise_scale)
    with pytest.raises(TypeError, match="'rowwise_data' must be a torch.uint8 \\(packed E2M1 codes\\) or "
                                        "float4_e2m1fn_x2 tensor, got torch.int8"):
        fn(x, None, torch.empty(8, 32, dtype=torch.int8), torch.empty(8, 2, dtype=torch.uint8), None, None, None,
           None, None)


def _ident_fp4(x):
    return x


def _scale_posonly(x, s: float, /):
    return x * s


def test_dispatchers_bind_positional_only_parameters():
    """The dispatchers' Python routes pass the epilogue's arguments by position: positional-only
    parameters bind (they took them by name, a TypeError), the same bytes as the Python call."""
    op = mxq.fused_quant(_scale_posonly)
    x = planted(8, 64, torch.float32, seed=3)
    want = op(x, 3.0)
    rd, rs = torch.empty(8, 64, dtype=torch.float8_e4m3fn), torch.full((8, 2), 7, dtype=torch.uint8)
    op.dispatcher()(x, 3.0, None, rd, rs, None, None, None, None, None)
    assert same_bytes(rd.view(torch.uint8), want.rowwise_data.view(torch.uint8))
    assert same_bytes(rs, want.rowwise_scale)
    a, w = planted(16, 32, torch.bfloat16, seed=4), planted(64, 32, torch.bfloat16, seed=5)
    want = op.gemm(a, w, 3.0)
    rd, rs = torch.empty(16, 64, dtype=torch.float8_e4m3fn), torch.full((16, 2), 7, dtype=torch.uint8)
    op.dispatcher(gemm=True)(a, w, 3.0, None, rd, rs, None, None, None, None, None)
    assert same_bytes(rd.view(torch.uint8), want.rowwise_data.view(torch.uint8))
    assert same_bytes(rs, want.rowwise_scale)


def _float_first(s: float, acc, b):
    return acc * s + b


def test_gemm_dispatcher_serves_a_float_before_the_accumulator():
    """op.gemm's dispatcher (a, w, *operands, *floats, ...) of an epilogue whose float comes
    first: b binds to b (it bound to s: "multiple values for argument 's'")."""
    op = mxq.fused_quant(_float_first)
    a, w = planted(16, 32, torch.bfloat16, seed=6), planted(64, 32, torch.bfloat16, seed=7)
    b = planted(1, 64, torch.bfloat16, seed=8).reshape(64)
    want = op.reference(2.0, torch.matmul(a.float(), w.float().t()), b.float())
    rd, rs = torch.empty(16, 64, dtype=torch.float8_e4m3fn), torch.full((16, 2), 7, dtype=torch.uint8)
    op.dispatcher(gemm=True)(a, w, b, 2.0, None, rd, rs, None, None, None, None, None)
    assert same_bytes(rd.view(torch.uint8), want.rowwise_data.view(torch.uint8))
    assert same_bytes(rs, want.rowwise_scale)


def test_gemm_dispatcher_names_noop_as_what_it_does_not_serve():
    """op.gemm's dispatcher takes the destination-passing signature, noop included, which
    op.gemm has no route for: refused by name as not served (not as an output it does not write)."""
    op = mxq.fused_quant(_scale_posonly)
    a, w = planted(16, 32, torch.bfloat16, seed=4), planted(64, 32, torch.bfloat16, seed=5)
    rd, rs = torch.empty(16, 64, dtype=torch.float8_e4m3fn), torch.empty(16, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="'noop' is not served by _scale_posonly.gemm"):
        op.dispatcher(gemm=True)(a, w, 3.0, None, rd, rs, None, None, None, None, torch.zeros(1))


def test_dispatchers_name_a_bad_input_dtype_and_destinations_by_their_slots():
    """A destination-passing call names the caller's argument: an input of an unserved dtype as
    'x' / 'a' (it was MXFP8Tensor.empty's 'dtype'); a destination sharing memory with an input or
    another destination by its slot name (not as a field of an out= the C++ signature does not
    have)."""
    op = mxq.fused_quant(_scale_posonly)
    x = planted(8, 64, torch.float32, seed=3)
    rd, rs = torch.empty(8, 64, dtype=torch.float8_e4m3fn), torch.empty(8, 2, dtype=torch.uint8)
    g = op.dispatcher()
    for bad in (x.int(), x.double()):
        with pytest.raises(TypeError, match=f"argument 'x' must be float32, float16 or bfloat16, got {bad.dtype}"):
            g(bad, 3.0, None, rd, rs, None, None, None, None, None)
    in_x = x.view(torch.uint8).view(-1)[:8 * 64].view(8, 64)
    with pytest.raises(ValueError, match="argument 'rowwise_data' overlaps 'x' in memory"):
        g(x, 3.0, None, in_x, rs, None, None, None, None, None)
    wide = torch.empty(8, 64, dtype=torch.float16)  # (a 2-byte dtype: its bytes are not the FP8 data's)
    with pytest.raises(ValueError, match="argument 'rowwise_data' must be torch.float8_e4m3fn, got torch.float16"):
        g(x, 3.0, None, wide, rs, None, None, None, None, None)
    amax_op = mxq.fused_quant(_scale_posonly, amax=True)
    with pytest.raises(ValueError, match="argument 'amax' must be torch.float32, got torch.float16"):
        amax_op.dispatcher()(x, 3.0, None, rd, rs, None, None, torch.zeros((), dtype=torch.float16), None, None)
    a, w = planted(16, 32, torch.bfloat16, seed=4), planted(64, 32, torch.bfloat16, seed=5)
    rd, rs = torch.empty(16, 64, dtype=torch.float8_e4m3fn), torch.empty(16, 2, dtype=torch.uint8)
    gg = op.dispatcher(gemm=True)
    with pytest.raises(TypeError, match="mxq.gemm: a must be bfloat16 or float16"):
        gg(a.double(), w.double(), 3.0, None, rd, rs, None, None, None, None, None)
    with pytest.raises(ValueError, match="argument 'rowwise_scale' overlaps 'rowwise_data' in memory"):
        gg(a, w, 3.0, None, rd, rd.view(torch.uint8).view(-1)[:32].view(16, 2), None, None, None, None, None)


@mxq.fused_quant(act="swiglu", colwise=True)
def _gated(x):
    return x


@mxq.fused_quant(format="nvfp4", colwise=True)
def _nvfp4(x):
    return x


@mxq.fused_quant(act="gelu", format="fp8_block")
def _gemm_gelu(acc, b):
    return acc + b


@pytest.mark.parametrize("kind", ["gated", "nvfp4", "gemm"])
def test_python_routes_take_raw_tensors_from_cpp(raw_caller, kind):
    """The destination-passing functions that run in Python on every call (a gated op's, an FP4
    op's, op.gemm's) take a C++ caller's raw DLTensor* arguments (they crashed inside tvm-ffi's
    DLPack export): the destinations get the Python call's bytes, and an argument no kernel can
    read is refused by name before anything runs."""
    from mxq.runtime import slots

    if kind == "gemm":
        a, w = planted(24, 64, torch.bfloat16, seed=3), planted(256, 64, torch.bfloat16, seed=4)
        b = planted(1, 256, torch.bfloat16, seed=5).reshape(256)
        want, fn, ins, first = _gemm_gelu.gemm(a, w, b), _gemm_gelu.dispatcher(gemm=True), [a, w, b], "a"
    else:
        op = _gated if kind == "gated" else _nvfp4
        x = planted(64, 128, torch.bfloat16, seed=6)
        want, fn, ins, first = op(x), op.dispatcher(), [x], "x"
    outs = [None if getattr(want, f) is None else torch.empty_like(getattr(want, f)) for f in slots.OUTPUTS]
    for t in outs:
        if t is not None:
            t.reshape(-1).view(torch.uint8).fill_(0xAB)
    args = [*ins, None, *outs, None]
    assert raw_caller.raw_call_error(fn, args, -1, "") == ""
    for f, got in zip(slots.OUTPUTS, outs):
        if got is not None:
            assert same_bytes(got, getattr(want, f)), f
    out_at = len(ins) + 1 + next(i for i, t in enumerate(outs) if t is not None)
    for index, name in ((0, first), (out_at, "rowwise_data")):
        for how, words in (("negative", "has a negative dimension (-1 at dimension 0)"),
                           ("data", "has elements but no data (a null pointer)"),
                           ("lanes", "has a dtype of 2 lanes an element"),
                           ("negstride", "has a negative stride"),  # (torch's DLPack import aborted the process)
                           ("null", "is a null DLTensor pointer")):  # (it segfaulted)
            msg = raw_caller.raw_call_error(fn, args, index, how)
            assert msg.startswith("ValueError") and f"argument '{name}' {words}" in msg, (index, how, msg)


def test_native_route_refuses_padded_rows_of_a_grouped_call(native):
    """A grouped call's FP8 data is contiguous on the native route as on Python's (check_out,
    ffi._destination): rows padded apart, which an ungrouped call takes (the rows8 and vec
    variants' row stride), are refused naming the slot before anything launches (here on host
    memory labelled CUDA, the kernel a stand-in)."""
    call, launches = native
    op = mxq.fused_quant(colwise=True)(_ident)
    m, n = 64, 64
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    ends = torch.tensor([20, 64], dtype=torch.int32)
    t = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", group_offsets=ends)
    padded = torch.zeros(m, n + 16, dtype=torch.uint8)[:, :n]
    noop = torch.zeros(1)  # (given: the dispatcher's own zero noop tensor would be a real CUDA one)
    slots = [None, t.rowwise_data, t.rowwise_scale, t.colwise_data, t.colwise_scale, None, None, noop]
    call(op, x, *slots, ends)
    assert len(launches) == 1 and launches[0][1] == "vec_grouped"
    for at in (1, 3):
        spoiled = list(slots)
        spoiled[at] = padded
        with pytest.raises(ValueError, match=f"'{('rowwise_data', 'colwise_data')[at // 2]}' of a grouped call must be "
                                             "contiguous"):
            call(op, x, *spoiled, ends)
    assert len(launches) == 1
    ungrouped = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    call(op, x, None, padded, ungrouped.rowwise_scale, ungrouped.colwise_data, ungrouped.colwise_scale, None, None, noop)
    assert len(launches) == 2  # (ungrouped: padded rows launch)


def test_native_route_takes_floats_and_ints_as_python_does(native):
    """The native dispatcher's float slots (here on host memory labelled CUDA, the kernel a
    stand-in): a float as given, an int rounded to fp32 once (ir.scalar's value: through a double,
    one beyond 2^53 would round twice), and anything else (a bool, a string, None, a tensor) a
    TypeError naming the parameter before anything launches, as Python's routes refuse it."""
    from mxq.frontend import ir

    call, launches = native
    op = mxq.fused_quant(rowwise=True)(resid.fn)  # (no dbias: its workspace would need a real CUDA allocator)
    m, n = 32, 64
    x, r = torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(m, n, dtype=torch.bfloat16)
    t = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    outs = [None, t.rowwise_data, t.rowwise_scale, None, None, None, None, torch.zeros(1)]
    big = 2 ** 54 + 2 ** 30 + 1
    for alpha in (0.1, 3, big, -big):
        call(op, x, r, alpha, *outs)
        assert launches[-1][2][2] == ir.scalar(alpha), alpha  # (the kernel's arguments: x, r, alpha, ...)
    count = len(launches)
    for bad in (True, "abc", None, torch.zeros(1)):
        with pytest.raises(TypeError, match=r"argument #2 \(alpha\) must be a float"):
            call(op, x, r, bad, *outs)
    assert len(launches) == count


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="os.fork")
def test_a_child_forked_while_the_dispatchers_are_built_gets_a_fresh_lock():
    """ffi's lock, held by a thread building dispatchers at a fork, is free in the child."""
    from mxq.runtime import ffi

    from .checks import child_gets_fresh_locks

    assert child_gets_fresh_locks((ffi, "_lock"))
