"""NVFP4 and MXFP4 options and routes: QuantSpec's checks and key round trip, bad call arguments
named, out= and noop, fused epilogues against quantizing their values, the C++ routes and
DTensor/all_gather refused by name, the CUDA fallback's reason."""

import itertools

import pytest
import torch

import mxq
from mxq.frontend.epilogue import EpilogueError
from mxq.formats import reference
from mxq.frontend.spec import QuantSpec
from mxq.runtime import limits


def test_key_round_trip_of_every_fp4_spec():
    seen = set()
    for fmt, mode, layout, rc, b2, h, sr in itertools.product(
            ("nvfp4", "mxfp4"), ("e4m3", "floor", "rceil"), ("compact", "swizzled"),
            ((True, False), (False, True), (True, True)), (False, True), (False, True), (False, True)):
        try:
            spec = QuantSpec(format=fmt, scale_mode=mode, scale_layout=layout, rowwise=rc[0], colwise=rc[1],
                             block_2d=b2, hadamard=h, stochastic_rounding=sr)
        except ValueError:
            continue
        for dtype in ("fp32", "bf16"):
            key = spec.key(dtype)
            assert key >> 22 == 0 and QuantSpec.from_key(key) == (spec, dtype)
            assert spec.name(dtype) not in seen
            seen.add(spec.name(dtype))
    assert len(seen) > 80


def test_spec_defaults_and_repr():
    s = QuantSpec(format="nvfp4")
    assert (s.scale_mode, s.block, s.amax) == ("e4m3", (1, 16), True)  # NVFP4 records its global amax
    assert QuantSpec(format="nvfp4", block_2d=True).block == (16, 16)
    assert QuantSpec(format="mxfp4").scale_mode == "floor" and QuantSpec(format="mxfp4").block == (1, 32)
    assert "hadamard" not in repr(QuantSpec()) and "format" not in repr(QuantSpec())
    assert "hadamard=False" in repr(s) and "hadamard" not in repr(QuantSpec(format="mxfp4"))
    assert (s.block_format.block, s.block_format.scale, s.block_format.global_scale) == ((1, 16), "e4m3", True)
    assert QuantSpec(format="nvfp4", block_2d=True).block_format.block == (16, 16)
    assert QuantSpec(format="nvfp4", colwise=True, hadamard=True).block_format.hadamard


@pytest.mark.parametrize("options, match", [
    (dict(format="nvfp4", fp8="e5m2"), "fp8"),
    (dict(format="mxfp4", block_2d=True), "block_2d"),
    (dict(format="mxfp4", stochastic_rounding=True), "stochastic_rounding"),
    (dict(format="fp8_block", hadamard=True, colwise=True), "hadamard"),
    (dict(format="nvfp4", hadamard=True), "colwise"),
    (dict(format="nvfp4", hadamard=True, colwise=True, block_2d=True), "exclusive"),
    (dict(format="nvfp4", block=(16, 16)), "block_2d"),
    (dict(format="nvfp4", scale_mode="floor"), "scale_mode"),
    (dict(format="mxfp4", scale_mode="even"), "scale_mode"),
    (dict(format="nvfp4", scale_layout="gemm"), "scale_layout"),
    (dict(format="nvfp4", hadamard=1, colwise=True), "hadamard"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises((ValueError, TypeError), match=match):
        QuantSpec(**options)
    with pytest.raises((ValueError, TypeError), match=match):
        mxq.quantize(torch.zeros(4, 32), **options)


@pytest.mark.parametrize("x, kwargs, match", [
    (torch.zeros(4, 33), dict(format="nvfp4"), "even"),
    (torch.zeros(3, 32), dict(format="mxfp4", colwise=True), "M"),
    (torch.zeros(32, 32), dict(format="nvfp4", colwise=True, hadamard=True), "bfloat16"),
    (torch.zeros(8, 32, dtype=torch.bfloat16), dict(format="nvfp4", colwise=True, hadamard=True), "multiple of 16"),
    (torch.zeros(4, 32), dict(format="nvfp4", colwise=True, group_offsets=torch.tensor([1, 4])), "group_offsets"),
    (torch.zeros(4, 32), dict(format="nvfp4", seed=1), "stochastic_rounding"),
    (torch.zeros(4, 32), dict(format="mxfp4", global_amax=1.0), "global_amax"),
    (torch.zeros(4, 32), dict(global_amax=1.0), "global_amax"),
    (torch.zeros(4, 32), dict(seed=3), "seed"),
    (torch.zeros(4, 32), dict(format="nvfp4", global_amax=-1.0), "global_amax"),
    (torch.zeros(4, 32), dict(format="nvfp4", global_amax=10 ** 400), "global_amax"),  # (no OverflowError)
    (torch.zeros(4, 32), dict(format="nvfp4", global_amax=1e39), "global_amax"),  # (inf once stored as fp32)
    (torch.zeros(4, 32), dict(format="nvfp4", global_amax=torch.tensor([1.0, 2.0])), "global_amax"),
    (torch.zeros(4, 32), dict(format="nvfp4", global_amax="1"), "global_amax"),
    (torch.zeros(4, 32), dict(format="nvfp4", stochastic_rounding=True, seed=-1), "seed"),
    (torch.zeros(4, 32), dict(format="nvfp4", stochastic_rounding=True, seed=True), "seed"),
    (torch.zeros(4, 32), dict(format="nvfp4", stochastic_rounding=True, offset=2 ** 62), "offset"),
    (torch.zeros(32, 32, dtype=torch.bfloat16), dict(format="nvfp4", colwise=True, hadamard=True,
                                                    global_amax=1.0), "global_amax"),
])
def test_bad_call_arguments_are_named(x, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mxq.quantize(x, **kwargs)


def test_an_fp4_ops_call_keywords_are_reserved_and_taken():
    def bad(x, seed: float = 1.0):
        return x * seed

    with pytest.raises(EpilogueError, match="seed"):
        mxq.fused_quant(format="nvfp4", stochastic_rounding=True)(bad)
    mxq.fused_quant(bad)  # (an MXFP8 op's epilogue may name a parameter seed)

    def shifted(x, offset: float = 0.0):
        return x + offset

    with pytest.raises(EpilogueError, match="offset"):
        mxq.fused_quant(format="mxfp4")(shifted)
    x = torch.randn(4, 64)
    mx = mxq.fused_quant(shifted)  # (an MXFP8 op's epilogue may name a parameter offset)
    assert torch.equal(mx(x, offset=1.0).rowwise_data, mxq.quantize(x + 1.0).rowwise_data)

    @mxq.fused_quant(format="nvfp4", stochastic_rounding=True)
    def scaled(x, alpha: float = 1.0):
        return x * alpha

    a = scaled(x, alpha=2.0, seed=5, offset=0)
    b = mxq.quantize(x * 2.0, format="nvfp4", stochastic_rounding=True, seed=5, offset=0)
    assert torch.equal(a.rowwise_data, b.rowwise_data)
    assert torch.equal(scaled.reference(x, alpha=2.0, seed=5).rowwise_data, a.rowwise_data)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_epilogue_act_and_dbias_quantize_the_step_5_values(fmt, dtype):
    x, r = torch.randn(8, 64, dtype=dtype), torch.randn(64, dtype=dtype)

    @mxq.fused_quant(format=fmt, act="gelu", dbias=True, colwise=True)
    def op(x, r):
        return x + r

    @mxq.fused_quant(act="gelu", dbias=True)
    def mx(x, r):
        return x + r

    t = op(x, r)
    v = reference.epilogue_value(op.spec, op.epilogue, [x, r], [], None).to(dtype)  # steps 1-5, every format's
    want = mxq.quantize(v, format=fmt, colwise=True)
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        assert torch.equal(getattr(t, f).view(torch.uint8), getattr(want, f).view(torch.uint8)), f
    assert torch.equal(t.dbias, mx(x, r).dbias)


def test_gated_forward_quantizes_the_gated_values():
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))

    @mxq.fused_quant(format="nvfp4", act="swiglu")
    def op(x):
        return x

    @mxq.fused_quant(act="swiglu", fp8="e4m3")
    def mx(x):
        return x

    t = op(x)
    assert t.shape == (4, 64) and t.rowwise_data.shape == (4, 32)
    # the gated values g are MXFP8's (steps 1-5 shared). NVFP4 is within half the E2M1 grid's widest
    # step (1, between 4 and 6) times its block's scale, at most amax / 6 raised by the E4M3 scale's
    # rounding (2^-4); MXFP8 E4M3 within 2^-4 |g| <= amax / 16
    err = (t.dequantize() - mx(x).dequantize()).abs().max()
    assert 0 < err <= t.amax * ((1 + 2 ** -4) / 6 + 2 ** -4)


@pytest.mark.parametrize("kwargs", [dict(format="nvfp4", colwise=True, scale_layout="swizzled"),
                                    dict(format="mxfp4", colwise=True, scale_mode="rceil")])
def test_out_and_noop(kwargs):
    x = torch.randn(130, 48)
    t = mxq.quantize(x, **kwargs)
    out = mxq.MXFP8Tensor.empty(QuantSpec(**kwargs), x.shape, x.dtype, "cpu")
    got = mxq.quantize(x, out=out, **kwargs)
    assert got is out
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax"):
        a, b = getattr(t, f), getattr(out, f)
        assert (a is None and b is None) or torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                                        b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
    before = out.rowwise_data.clone()
    mxq.quantize(x * 2, out=out, noop=torch.ones(1), **kwargs)
    assert torch.equal(out.rowwise_data, before)
    wrong = mxq.MXFP8Tensor.empty(QuantSpec(), x.shape, x.dtype, "cpu")
    with pytest.raises(ValueError, match="out"):
        mxq.quantize(x, out=wrong, **kwargs)
    with pytest.raises(ValueError, match="row_align"):
        mxq.MXFP8Tensor.empty(QuantSpec(**kwargs), x.shape, x.dtype, "cpu", row_align=16)


def test_save_and_load(tmp_path):
    t = mxq.quantize(torch.randn(32, 32, dtype=torch.bfloat16), format="nvfp4", colwise=True, hadamard=True)
    torch.save(t, tmp_path / "t.pt")
    u = torch.load(tmp_path / "t.pt")
    assert (u.format, u.block) == ("nvfp4", (1, 16)) and torch.equal(u.colwise_amax, t.colwise_amax)
    assert torch.equal(u.dequantize("colwise"), t.dequantize("colwise"))


def _double(x):
    return x * 2


def _dest_call(fn, op, x, offs=None, poison=False):
    """Call destination-passing ``fn`` as a C++ caller does (flat scale buffers, FP4 data and
    NVFP4's E4M3 scales as bytes; every slot the op does not use None) into buffers shaped like
    op's outputs (``poison``: filled with 0xAB first); returns them by field."""
    like = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device, group_offsets=offs)
    bufs = {}
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        t = getattr(like, f)
        if t is not None:
            t = t.view(torch.uint8) if t.dtype.itemsize == 1 else t
            t = t.reshape(-1) if f.endswith("_scale") or f == "amax" else t
            bufs[f] = t.fill_(0xAB) if poison and t.dtype == torch.uint8 else t
    args = [x, None, *(bufs.get(f) for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale",
                                             "amax", "dbias")), None]
    fn(*args, *([offs] if offs is not None else []))
    return bufs


def _as_bytes(w, like):
    return (w.view(torch.uint8) if w.dtype.itemsize == 1 else w).reshape(like.shape)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_register_and_dispatcher_serve_fp4_through_python(fmt):
    """register() and dispatcher() of an NVFP4 / MXFP4 op: the destination-passing signature, run in
    Python (CPU tensors: the reference), into a C++ caller's flat byte buffers the bytes of the
    Python call, grouped too; stochastic rounding and the Hadamard transform (whose seed and
    colwise_amax have no slot) refused."""
    import tvm_ffi

    op = mxq.fused_quant(format=fmt, colwise=True, dbias=True)(_double)
    op.register(f"fp4_{fmt}")
    x = torch.randn(64, 96)
    offs = torch.tensor([0, 30, 64], dtype=torch.int32)
    for fn in (tvm_ffi.get_global_func(f"mxq.fp4_{fmt}"), op.dispatcher()):
        for groups in (None, offs):
            want = op(x, group_offsets=groups)
            got = _dest_call(fn, op, x, groups, poison=True)
            for f, buf in got.items():
                assert torch.equal(buf, _as_bytes(getattr(want, f), buf)), (f, groups is None)
    bad = [mxq.fused_quant(format="nvfp4", stochastic_rounding=True)(_double),
           mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(_double)]
    for b, word in zip(bad, ("stochastic_rounding", "hadamard")):
        for call in (lambda: b.register("fp4_bad"), b.dispatcher):
            with pytest.raises(ValueError, match=word):
                call()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dispatcher_on_cuda_writes_the_python_bytes(fmt):
    """CUDA tensors through an FP4 op's dispatcher (Python, then the kernels as a Python call
    takes them) into a caller's byte buffers: the Python call's bytes. CPU counterpart:
    test_register_and_dispatcher_serve_fp4_through_python."""
    op = mxq.fused_quant(format=fmt, colwise=True)(_double)
    x = torch.randn(128, 256, dtype=torch.bfloat16, device="cuda")
    want = op(x)
    got = _dest_call(op.dispatcher(), op, x, poison=True)
    for f, buf in got.items():
        assert torch.equal(buf, _as_bytes(getattr(want, f), buf)), f


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_cuda_calls_fall_back_by_name(fmt):
    double = _double
    op = mxq.fused_quant(format=fmt)(double)
    # rowwise blocks and the colwise copy have kernels (tests/test_kernels_fp4.py, tests/test_kernels_nvfp4.py,
    # tests/test_kernels_mxfp4_col.py), the copy where M % 8 == 0
    x = torch.zeros(4, 32, dtype=torch.bfloat16)
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None) is None
    col = mxq.fused_quant(format=fmt, colwise=True)(double)
    assert fmt in limits.unserved(col.spec, col.epilogue, x, lambda: None)  # (M % 8 != 0 here)
    assert limits.unserved(col.spec, col.epilogue, torch.zeros(8, 32, dtype=torch.bfloat16), lambda: None) is None
    assert fmt in col.source


def test_all_gather_takes_fp4_but_not_its_hadamard_copy():
    """all_gather's own check (before any collective): FP4 tensors gather; a Hadamard-transformed
    copy (its own amax) and colwise copies of rows that are not whole blocks do not."""
    from mxq.integrations import distributed

    verdict = distributed._local_verdict
    assert verdict(mxq.quantize(torch.randn(32, 32), format="nvfp4")) == 0
    assert verdict(mxq.quantize(torch.randn(64, 64), format="mxfp4", colwise=True)) == 0
    had = mxq.quantize(torch.randn(32, 32, dtype=torch.bfloat16), format="nvfp4", colwise=True, hadamard=True)
    assert "Hadamard" in distributed._CHECKS[verdict(had) - 1]
    odd = mxq.quantize(torch.randn(48, 64), format="mxfp4", colwise=True)
    assert "multiple of its blocks' rows" in distributed._CHECKS[verdict(odd) - 1]
