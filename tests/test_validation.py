"""Every bad argument raises a clear exception that names it, before anything runs."""

import re
import warnings

import pytest
import torch

import mxq
import mxq.testing
from mxq.runtime import validation


def _ident(x):
    return x


def two(x, r, alpha: float = 1.0):
    return x * alpha + r


@pytest.mark.parametrize("kwargs,exc,word", [
    ({"fp8": "e4m3fnuz"}, ValueError, "fp8"),
    ({"scale_mode": "nearest"}, ValueError, "scale_mode"),
    ({"scale_layout": "blocked"}, ValueError, "scale_layout"),
    ({"rowwise": False}, ValueError, "rowwise"),
    ({"amax": "yes"}, TypeError, "amax"),
    ({"colwise": None}, TypeError, "colwise"),
    ({"noop": torch.ones(2)}, ValueError, "noop"),
    ({"noop": torch.ones(1, dtype=torch.float64)}, ValueError, "noop"),
    ({"noop": 1.0}, TypeError, "noop"),
    ({"noop": torch.ones(1, device="meta")}, ValueError, "noop"),
    ({"group_offsets": torch.tensor([4], device="meta")}, ValueError, "group_offsets"),
    ({"fp8": ["e4m3"]}, ValueError, "fp8"),
])
def test_quantize_options(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        mxq.quantize(torch.randn(4, 32), **kwargs)


@pytest.mark.parametrize("x,exc,word", [
    (torch.randn(4, 4).to(torch.float64), TypeError, "'x'"),
    (torch.randint(0, 5, (4, 4)), TypeError, "'x'"),
    ([1.0, 2.0], TypeError, "'x'"),
    (None, TypeError, "'x'"),
    (torch.randn(4, 32, device="meta"), ValueError, "'x' is on the meta device"),
])
def test_quantize_input(x, exc, word):
    with pytest.raises(exc, match=word):
        mxq.quantize(x)


def test_fused_input_mismatches():
    op = mxq.fused_quant(colwise=True)(two)
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="'r' has shape"):
        op(x, torch.randn(4, 33))
    with pytest.raises(TypeError, match="'r' has dtype"):
        op(x, torch.randn(4, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="'r' is on the meta device"):
        op(x, torch.randn(4, 32, device="meta"))
    with pytest.raises(TypeError, match="'alpha' must be a float"):
        op(x, x, alpha="2")
    with pytest.raises(TypeError, match="'alpha' must be a float"):
        op(x, x, alpha=True)
    with pytest.raises(TypeError, match="two\\(\\)"):
        op(x)
    with pytest.raises(TypeError, match="two\\(\\)"):
        op(x, x, beta=2.0)


def test_options_given_by_position_are_named_as_such():
    """fused_quant("gelu") (an option where the function goes) is a TypeError saying options are
    keywords, before any tracing; a function, or a staticmethod in a class body, is decorated."""
    for wrong in ("gelu", 3, ("act", "gelu")):
        with pytest.raises(TypeError, match=r"fused_quant\(\) takes its options by keyword .* got (str|int|tuple)"):
            mxq.fused_quant(wrong)
    assert isinstance(mxq.fused_quant(_ident), mxq.FusedOp)
    assert isinstance(mxq.fused_quant(act="gelu")(staticmethod(_ident)), mxq.FusedOp)


def test_act_and_dact_exclusive_and_act_input_rules():
    with pytest.raises(ValueError, match="exclusive"):
        mxq.fused_quant(act="gelu", dact="gelu")(_ident)
    with pytest.raises(TypeError, match="unknown option"):
        mxq.fused_quant(activation="gelu")(_ident)
    back = mxq.fused_quant(dact="silu")(_ident)
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="'act_input' is required"):
        back(x)
    with pytest.raises(ValueError, match="'act_input' has shape"):
        back(x, act_input=torch.randn(4, 31))
    with pytest.raises(TypeError, match="'act_input' has dtype"):
        back(x, act_input=torch.randn(4, 32, dtype=torch.float16))
    with pytest.raises(TypeError, match="'act_input' must be"):
        back(x, act_input=3.0)
    fwd = mxq.fused_quant(act="silu")(_ident)
    with pytest.raises(ValueError, match="'act_input' is only used"):
        fwd(x, act_input=x)



@pytest.mark.parametrize("dact", ["silu", "swiglu"])
def test_a_bad_first_tensor_is_named_before_act_input(dact):
    """A dact op's bad first tensor (dtype, meta device) is reported as its own, not as act_input's
    mismatch with it (the gated backward compared act_input with it first)."""
    back = mxq.fused_quant(dact=dact, colwise=True, dbias=True)(_ident)
    width = 64 if dact == "swiglu" else 32
    a = torch.randn(4, width)
    with pytest.raises(TypeError, match="argument 'x' must be float32, float16 or bfloat16, got torch.int32"):
        back(torch.ones(4, 32, dtype=torch.int32), act_input=a)
    with pytest.raises(ValueError, match="argument 'x' is on the meta device"):
        back(torch.randn(4, 32, device="meta"), act_input=a)
    with pytest.raises(TypeError, match="argument 'act_input' has dtype torch.float16 but 'x' has torch.float32"):
        back(torch.randn(4, 32), act_input=a.half())


def test_out_is_checked():
    x = torch.randn(8, 64)
    good = mxq.quantize(x, colwise=True)
    with pytest.raises(ValueError, match="out' has no colwise_data"):
        mxq.quantize(x, colwise=True, out=mxq.quantize(x))
    with pytest.raises(ValueError, match=r"'out' holds outputs of shape \(8, 64\) but this call writes \(8, 32\)"):
        mxq.quantize(torch.randn(8, 32), colwise=True, out=good)
    good.shape = torch.Size((8, 32))  # (a label that lies about its fields: they are still checked)
    with pytest.raises(ValueError, match="out.rowwise_data"):
        mxq.quantize(torch.randn(8, 32), colwise=True, out=good)
    with pytest.raises(ValueError, match="out.rowwise_data' must be torch.float8_e5m2"):
        mxq.quantize(x, colwise=True, fp8="e5m2", out=mxq.quantize(x, colwise=True, fp8="e4m3"))
    with pytest.raises(TypeError, match="'out'"):
        mxq.quantize(x, out=(good.rowwise_data, good.rowwise_scale))


def test_transposed_colwise_copy_into_padded_rows_is_named():
    """The transposed colwise copy ([N, M]: FP8 block scaling's GEMM-ready layout, FP4's) must
    be contiguous: at M == N a padded view has the right shape (and would pass the [M, N] rows'
    rule), but the kernels store its rows a whole row apart."""
    for opts, width in ((dict(format="fp8_block", scale_layout="gemm"), 64), (dict(format="mxfp4"), 32)):
        op = mxq.fused_quant(colwise=True, **opts)(_ident)
        x = torch.randn(64, 64, dtype=torch.bfloat16)
        out = op(x)
        pad = torch.zeros(64, width + 16, dtype=out.colwise_data.dtype)[:, :width]
        assert pad.shape == out.colwise_data.shape and not pad.is_contiguous()
        out.colwise_data = pad
        with pytest.raises(ValueError, match="out.colwise_data' is the transposed colwise copy"):
            op(x, out=out)


def _aliased_out_cases():
    """(name, call) pairs: each call passes an ``out`` whose tensors share memory with each other
    or with an input (each gave wrong bytes with no error before the check)."""
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    op = mxq.fused_quant(colwise=True, dbias=True, amax=True)(_ident)
    fresh = lambda: op(x)  # noqa: E731
    same = fresh()
    same.colwise_data = same.rowwise_data  # one storage for both directions
    inside = fresh()  # rowwise data inside x's own bytes
    inside.rowwise_data = _into_bytes_of(x, (64, 64))
    dbias_in_x = fresh()
    dbias_in_x.dbias = x[0]
    scales = fresh()  # the colwise scales overlap the rowwise ones' tail
    buf = torch.empty(64 * 2 + 2 * 64, dtype=torch.uint8)
    scales.rowwise_scale, scales.colwise_scale = buf[:128].view(64, 2), buf[64:192].view(2, 64)
    noop_is_amax = fresh()
    g = torch.randn_like(x)
    dgelu = mxq.fused_quant(dact="gelu")(_ident)
    into_act_input = dgelu(g, act_input=x)
    into_act_input.rowwise_data = _into_bytes_of(x, (64, 64))
    return [
        ("out.colwise_data' overlaps 'out.rowwise_data", lambda: op(x, out=same)),
        ("out.rowwise_data' overlaps 'x'", lambda: op(x, out=inside)),
        ("out.dbias' overlaps 'x'", lambda: op(x, out=dbias_in_x)),
        ("out.colwise_scale' overlaps 'out.rowwise_scale", lambda: op(x, out=scales)),
        ("out.amax' overlaps 'noop'", lambda: op(x, noop=noop_is_amax.amax, out=noop_is_amax)),
        ("out.rowwise_data' overlaps 'act_input'", lambda: dgelu(g, act_input=x, out=into_act_input)),
    ]


def _into_bytes_of(t, shape):
    """An FP8 tensor of ``shape`` over the first bytes of ``t``'s memory."""
    n = shape[0] * shape[1]
    return t.view(torch.uint8).view(-1)[:n].view(shape).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("case", range(6))
def test_outputs_that_overlap_each_other_or_an_input_are_refused_by_name(case):
    words, call = _aliased_out_cases()[case]
    with pytest.raises(ValueError, match=re.escape(words) + ".*must not share memory"):
        call()


def test_outputs_apart_from_everything_pass_the_overlap_check():
    """mxq's own outputs, padded rows included, and outputs next to (not over) an input pass."""
    x = torch.randn(64, 13, dtype=torch.bfloat16)
    op = mxq.fused_quant(colwise=True, dbias=True, amax=True)(_ident)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", row_align=16)
    assert mxq.testing.compare(op(x, out=out), op.reference(x), exact=True) == []
    pool = torch.empty(2 * 64 * 16, dtype=torch.uint8)  # two directions side by side in one buffer
    out.rowwise_data = pool[:1024].view(64, 16)[:, :13].view(torch.float8_e4m3fn)
    out.colwise_data = pool[1024:].view(64, 16)[:, :13].view(torch.float8_e4m3fn)
    assert mxq.testing.compare(op(x, out=out), op.reference(x), exact=True) == []


def _plus(x, r):
    return x + r


def test_errors_happen_before_anything_is_written():
    """A bad argument after good ones: nothing is written into out. (An r of another float dtype
    computes fine in torch, so a call path that ran before validating would fill out before
    anything complained.)"""
    op = mxq.fused_quant(amax=True)(_plus)
    x = torch.randn(8, 64)
    out = op(x, x)
    snapshot = [t.clone() for t in (out.rowwise_data.view(torch.uint8), out.rowwise_scale, out.amax)]
    with pytest.raises(TypeError, match="'r' has dtype"):
        op(x * 100, torch.randn(8, 64, dtype=torch.float16) * 100, out=out)
    after = (out.rowwise_data.view(torch.uint8), out.rowwise_scale, out.amax)
    assert all(torch.equal(a, b) for a, b in zip(after, snapshot))


def _times(x, s):
    return x * s


def test_number_for_a_tensor_parameter_suggests_a_float_annotation():
    op = mxq.fused_quant()(_times)
    with pytest.raises(TypeError, match=r"argument 's' must be a torch.Tensor, got float.*`s: float`"):
        op(torch.ones(4, 32), 2.0)


def test_option_cache_does_not_skip_validation():
    """Issue 21 item 9: 1 == True, so after quantize(x) the cached op answered rowwise=1."""
    x = torch.randn(4, 32)
    mxq.quantize(x)
    with pytest.raises(TypeError, match="rowwise must be a bool"):
        mxq.quantize(x, rowwise=1, colwise=1.0, amax=0)
    with pytest.raises(TypeError, match="amax must be a bool"):
        mxq.quantize(x, amax=0)


@pytest.mark.parametrize("value", [1, 0, "no", None, [1]])
def test_amax_must_be_a_bool_for_nvfp4_too(value):
    """NVFP4 always records its amax; a non-bool amax= is still refused by name (as for every
    format), an unhashable one too, not accepted because the format sets it."""
    with pytest.raises(TypeError, match="amax must be a bool"):
        mxq.quantize(torch.randn(4, 32), format="nvfp4", amax=value)
    with pytest.raises(TypeError, match="amax must be a bool"):
        mxq.fused_quant(format="nvfp4", amax=value)


def test_out_holding_fields_the_op_does_not_write_is_refused():
    """An out= with a field the op does not write (a rowwise copy, an amax, a dbias of an earlier
    call) is refused by name: it came back holding the earlier values, and dequantize() read the
    stale rowwise copy. The C++ routes refuse such slots too."""
    x, y = torch.randn(64, 64), torch.randn(64, 64) * 100
    out = mxq.quantize(x, colwise=True, amax=True)
    with pytest.raises(ValueError, match="'out' holds rowwise_data, which this op does not write"):
        mxq.quantize(y, rowwise=False, colwise=True, out=out)
    with pytest.raises(ValueError, match="'out' holds amax, which this op does not write"):
        mxq.quantize(y, colwise=True, out=out)
    out.amax = None
    assert mxq.quantize(y, colwise=True, out=out) is out


def test_out_made_for_another_shape_is_refused_even_where_its_fields_fit():
    """An out= must describe the call's shape: FP4's colwise copy ([N, M/2]) and FP8 block
    scaling's GEMM-ready one ([N, M]) read only M and N, so an out made for [32, 48] has the
    fields of a [4, 8, 48] call and came back as [32, 48] (its dequantize() too). Refused by
    name, on the first call and on a call of a kept route (Call.key holds the shape)."""
    x = torch.randn(4, 8, 48)
    cases = [dict(format="nvfp4"), dict(format="mxfp4"),
             dict(format="fp8_block", scale_layout="gemm", block=(1, 128))]
    for kw in cases:
        op = mxq.fused_quant(rowwise=False, colwise=True, **kw)(_ident)
        good = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
        assert op(x, out=good) is good and good.shape == x.shape  # (the route kept under its key)
        for shape in ((32, 48), (2, 16, 48)):
            bad = mxq.MXFP8Tensor.empty(op.spec, shape, x.dtype, "cpu")
            with pytest.raises(ValueError, match=r"'out' holds outputs of shape \(%s\) but this call writes "
                               r"\(4, 8, 48\)" % ", ".join(map(str, shape))):
                op(x, out=bad)
            with pytest.raises(ValueError, match="'out' holds outputs of shape"):
                mxq.quantize(x, rowwise=False, colwise=True, out=bad, **kw)


def test_fp4_out_data_must_be_contiguous():
    """FP4's packed data in out= are contiguous [M, N/2] (and the colwise [N, M/2]): a view of
    wider rows is refused by name (its row-stride rule was the unpacked N's)."""
    x = torch.randn(64, 128)
    for fmt in ("nvfp4", "mxfp4"):
        out = mxq.quantize(x, format=fmt)
        out.rowwise_data = torch.zeros(64, 128, dtype=torch.uint8)[:, :64]  # (rows 128 bytes apart: accepted before)
        with pytest.raises(ValueError, match="'out.rowwise_data' of format=.* must be contiguous"):
            mxq.quantize(x, format=fmt, out=out)
        out.rowwise_data = torch.zeros(64, 64, dtype=torch.uint8)
        assert mxq.quantize(x, format=fmt, out=out) is out


def test_noop_call_cannot_regroup_its_out():
    """Under noop (a device value: nothing may be written) a call whose grouping differs from
    out's (grouped into an ungrouped out, ungrouped into a grouped one, another group count) is
    refused by name: its group_offsets would change with nothing written. Same grouping: taken."""
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    one = torch.ones(1)
    plain, grouped = mxq.quantize(x), mxq.quantize(x, group_offsets=torch.tensor([16, 64]))
    for out, ends in ((plain, torch.tensor([16, 64])), (grouped, None), (grouped, torch.tensor([8, 16, 64]))):
        with pytest.raises(ValueError, match="'out' with noop: out holds outputs of"):
            mxq.quantize(x, out=out, group_offsets=ends, noop=one)
    before = grouped.group_offsets.tolist()
    mxq.quantize(x, out=grouped, group_offsets=torch.tensor([32, 64]), noop=one)
    assert grouped.group_offsets.tolist() == before


def test_group_offsets_sparse_or_nested_are_named():
    x = torch.randn(64, 64)
    for ends in (torch.tensor([16, 64]).to_sparse(), torch.nested.nested_tensor([torch.tensor([16, 64])])):
        with pytest.raises(TypeError, match="'group_offsets' must be a dense strided tensor"):
            mxq.quantize(x, colwise=True, group_offsets=ends)


def test_option_cache_does_not_skip_the_block_check():
    """True == 1 and 128.0 == 128 hash alike: after a call with block=(1, 128) the cached op
    must not answer a block of bools or floats, which a fresh process refuses."""
    x = torch.randn(4, 256)
    mxq.quantize(x, format="fp8_block", block=(1, 128))
    mxq.quantize(x, format="fp8_block", block=[1, 128])  # (a list of ints: the tuple's spec)
    for bad in ((True, 128), (1, 128.0), [1.0, 128], (128.0, 128)):
        with pytest.raises(ValueError, match="block must be one of"):
            mxq.quantize(x, format="fp8_block", block=bad)


def test_a_cpu_tensor_global_amax_is_checked_as_a_number_is():
    """NVFP4's global_amax as a CPU tensor (one value, one per group, the Hadamard pair as a
    (2,) tensor or two one-element tensors): NaN and negative values refused by name as the same
    numbers are; 0, fp32's largest value and inf (the amax of values holding inf) taken."""
    x = torch.randn(32, 64)
    for bad in (float("nan"), -3.0):
        with pytest.raises(ValueError, match="'global_amax' must hold values >= 0"):
            mxq.quantize(x, format="nvfp4", global_amax=torch.tensor(bad))
        with pytest.raises(ValueError, match="'global_amax' must be >= 0"):
            mxq.quantize(x, format="nvfp4", global_amax=bad)
    ends = torch.tensor([16, 32], dtype=torch.int32)
    with pytest.raises(ValueError, match="'global_amax' must hold values >= 0.*-1.0"):
        mxq.quantize(x, format="nvfp4", group_offsets=ends, global_amax=torch.tensor([1.0, -1.0]))
    # (a grouped call's message names its other form: one amax per group)
    with pytest.raises(ValueError, match="or a float32 tensor of one amax per group, \\(2,\\)"):
        mxq.quantize(x, format="nvfp4", group_offsets=ends, global_amax=torch.tensor(2.0, dtype=torch.float64))
    xb = x.bfloat16()
    for pair in (torch.tensor([1.0, float("nan")]), (torch.tensor(1.0), torch.tensor(-0.5))):
        with pytest.raises(ValueError, match="'global_amax' must hold values >= 0"):
            mxq.quantize(xb, format="nvfp4", colwise=True, hadamard=True, global_amax=pair)
    for good in (0.0, torch.finfo(torch.float32).max, float("inf")):
        assert float(mxq.quantize(x, format="nvfp4", global_amax=torch.tensor(good)).amax) == good
        assert float(mxq.quantize(x, format="nvfp4", global_amax=good).amax) == good
    for pair in ((1.0, float("inf")), torch.tensor([float("inf"), 2.0])):
        t = mxq.quantize(xb, format="nvfp4", colwise=True, hadamard=True, global_amax=pair)
        assert (float(t.amax), float(t.colwise_amax)) == tuple(float(v) for v in pair)
    # a number that rounds to fp32's largest value is taken as it (float32(3.4028235e38) is it); the
    # least that rounds to inf, 2^128 - 2^103 (an int: no float64 rounding first), is refused
    fmax = torch.finfo(torch.float32).max
    for near in (3.4028235e38, 2 ** 128 - 2 ** 103 - 1):
        assert float(mxq.quantize(x, format="nvfp4", global_amax=near).amax) == fmax
        t = mxq.quantize(xb, format="nvfp4", colwise=True, hadamard=True, global_amax=(near, 1.0))
        assert float(t.amax) == fmax
    with pytest.raises(ValueError, match="'global_amax' must be >= 0 and round to a finite fp32"):
        mxq.quantize(x, format="nvfp4", global_amax=2 ** 128 - 2 ** 103)


class _Sub(torch.Tensor):
    pass


def test_tensor_subclasses_sparse_and_nested_are_refused():
    """Issue 21 items 13-14: a DTensor's shape and pointer describe different tensors; every
    subclass mxq does not handle is refused before any launch, naming the argument."""
    x = torch.randn(8, 32)
    with pytest.raises(TypeError, match="'x' is a _Sub"):
        mxq.quantize(x.as_subclass(_Sub))
    with pytest.raises(TypeError, match="dense strided"):
        mxq.quantize(x.to_sparse())
    nested = torch.nested.nested_tensor([torch.randn(2, 32), torch.randn(3, 32)])
    with pytest.raises(TypeError, match="dense strided tensor, got a nested tensor"):
        mxq.quantize(nested)
    with pytest.raises(TypeError, match="'noop'"):
        mxq.quantize(x, noop=torch.zeros(1).as_subclass(_Sub))
    assert mxq.quantize(torch.nn.Parameter(x)).rowwise_data.shape == x.shape  # parameters are plain


def test_out_field_that_is_not_a_tensor_names_it():
    x = torch.randn(8, 32)
    out = mxq.MXFP8Tensor.empty(mxq.QuantSpec(), x.shape, x.dtype, "cpu")
    out.rowwise_data = [1, 2, 3]
    with pytest.raises(TypeError, match="'out.rowwise_data' must be a torch.Tensor"):
        mxq.quantize(x, out=out)


def _d(x):
    return x * 2.0


def test_reference_outputs_carry_no_autograd_graph():
    x = torch.randn(64, 32, requires_grad=True)
    with pytest.warns(UserWarning, match="argument 'x' requires grad"):
        t = mxq.fused_quant(amax=True, dbias=True)(_d)(x)
    assert t.amax.grad_fn is None and t.dbias.grad_fn is None and not t.dbias.requires_grad


def test_noop_without_out_returns_zeros():
    x = torch.randn(64, 32)
    t = mxq.quantize(x, rowwise=True, colwise=True, noop=torch.ones(1))
    for name in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        assert not getattr(t, name).view(torch.uint8).any(), name


def test_dequantize_of_colwise_only_uses_colwise():
    x = torch.randn(64, 32)
    t = mxq.quantize(x, rowwise=False, colwise=True)
    assert torch.equal(t.dequantize(), t.dequantize("colwise"))
    both = mxq.quantize(x, rowwise=True, colwise=True)
    assert torch.equal(both.dequantize(), both.dequantize("rowwise"))


def _scaled(x, s: float = 1.0):
    return x * s


def test_huge_int_for_a_float_parameter_is_a_value_error():
    """Issue 21 item 10: op(x, 10**400) raised OverflowError from deep inside the call."""
    op = mxq.fused_quant()(_scaled)
    with pytest.raises(ValueError, match="argument 's' is an integer of 1329 bits"):
        op(torch.ones(4, 32), 10 ** 400)
    assert op(torch.ones(4, 32), 10 ** 30).rowwise_data is not None  # large but a float: fine


def _thirteen(a, b, c, d, e, f, g, h, i, j, k, m, n):
    return a + b + c + d + e + f + g + h + i + j + k + m + n


def _twelve(a, b, c, d, e, f, g, h, i, j, k, m):
    return a + b + c + d + e + f + g + h + i + j + k + m


def test_too_many_epilogue_tensors_for_shared_memory_run_the_reference(monkeypatch):
    """The 16-bit kernel stages every epilogue tensor in shared memory: 13 of them with dbias and
    colwise need more than a CTA may take (227 KiB), so the op names the reason and runs the
    reference (a warning; an error under MXQ_STRICT) instead of failing at launch; 12 fit, and
    fp32 (no staging) is not refused."""
    big = mxq.fused_quant(rowwise=True, colwise=True, dbias=True)(_thirteen)
    fits = mxq.fused_quant(rowwise=True, colwise=True, dbias=True)(_twelve)
    x16 = torch.zeros(4, 8, dtype=torch.bfloat16)
    reason = big._unserved(x16)
    assert reason and "13 epilogue tensors" in reason and "shared memory" in reason
    assert fits._unserved(x16) is None
    assert big._unserved(torch.zeros(4, 8, dtype=torch.float32)) is None
    # a variant op's tuning counts (FusedOp._with_tuning sets its need with its source): 8 warps of the unaligned
    # kernel take 2048 bytes more than 4 (Tuning.unaligned_warps: column maxima 4 x 128 words) and
    # a grouped call's "block_all" scratch 80 more (5 Int32 terms x 4 warps; the library's "warps"
    # search, this op's, takes none); with a limit between the two, 13 tensors without dbias fit
    # 4 warps and not 8
    from mxq.frontend import codegen
    from mxq.kernels import config as kconfig
    from mxq.kernels.config import Tuning

    four = mxq.fused_quant(rowwise=True, colwise=True)(_thirteen)
    four._with_tuning(Tuning(unaligned_warps=4, group_search="block_all"))  # (4 warps: its default too)
    eight = mxq.fused_quant(rowwise=True, colwise=True)(_thirteen)
    eight._with_tuning(Tuning(unaligned_warps=8, group_search="block_all"))
    assert four._unserved(x16) is None and eight._unserved(x16) is None  # both fit 227 KiB
    need = [codegen.kernel_config(op.spec, op.epilogue, Tuning(unaligned_warps=w, group_search=s)).packed_shared_bytes(
        13, True, True) for op, w, s in ((four, 4, "block_all"), (eight, 8, "block_all"), (four, 4, ""), (eight, 8, ""))]
    assert need[1] - need[0] == 2048 + 80 and need[3] - need[2] == 2048 and need[0] - need[2] == 4 * 5 * 4
    monkeypatch.setattr(kconfig, "SMEM_LIMIT", need[0])  # (each op's need is its own, against the limit of the call)
    assert four._unserved(x16) is None
    assert "shared memory" in (eight._unserved(x16) or "")


def _two(a, b):
    return a + b


def _three(a, b, c):
    return a + b + c


def _four(a, b, c, d):
    return a + b + c + d


def test_fp8_block_128_row_blocks_fit_fewer_epilogue_tensors():
    """README's bounds for FP8 block scaling: the 128-row tile of its colwise blocks and 128x128
    tiles stages 128 rows of every epilogue tensor (and a dact op's input), so 3 fit and 4 run the
    reference; with the transposed copy (gemm layout) 2 and 3; 1x128 rows take 13 as MXFP8."""
    x16 = torch.zeros(256, 256, dtype=torch.bfloat16)

    def refused(fn, **opts):
        return "shared memory" in (mxq.fused_quant(format="fp8_block", **opts)(fn)._unserved(x16) or "")

    for opts in ({"colwise": True}, {"block": (128, 128)}, {"rowwise": True, "colwise": True}):
        assert not refused(_three, **opts) and refused(_four, **opts), opts
        assert not refused(_two, dact="gelu", **opts) and refused(_three, dact="gelu", **opts), opts
    gemm = {"colwise": True, "scale_layout": "gemm"}
    assert not refused(_two, **gemm) and refused(_three, **gemm)
    assert not refused(_twelve) and not refused(_thirteen) and not refused(_four, rowwise=True)


def test_cpp_routes_refuse_ops_whose_16_bit_kernel_does_not_fit(tmp_path):
    """The C++ routes have no reference to fall back to: register(), dispatcher() and export()
    for bf16/fp16 refuse an op whose 16-bit kernel needs more shared memory than a CTA may take,
    naming the reason, before anything is built; export() for fp32 is not refused by it."""
    big = mxq.fused_quant(rowwise=True, colwise=True, dbias=True)(_thirteen)
    for call in (lambda: big.register("mxq_test_too_big"), big.dispatcher,
                 lambda: big.export(tmp_path, dtype="bf16"), lambda: big.export(tmp_path, dtype=torch.float16)):
        with pytest.raises(ValueError, match="13 epilogue tensors need .* shared memory"):
            call()
    assert not list(tmp_path.iterdir())
    big._refuse_cpp("export()", "fp32")  # fp32 does not stage its inputs: nothing to refuse
    fits = mxq.fused_quant(rowwise=True, colwise=True, dbias=True)(_twelve)
    fits._refuse_cpp("register()")


def test_packed_shared_bytes_counts_the_allocations():
    """KernelConfig.packed_shared_bytes against the packed kernel's allocations counted by hand for
    rowwise + colwise. Unaligned at 4 warps (Tuning.unaligned_warps=4): one staged row buffer of
    32 rows x 33 chunks x 16 B = 16896, column maxima 4 x 128 words = 2048, inverse column scales
    256 x 4 = 1024, parked units 4 warps x 64 words = 1024; at its default 8 warps: maxima 8 x 128
    words = 4096, parked units 8 warps x 32 words = 1024; aligned plain casts stage nothing
    (2048 + 1024)."""
    from mxq.frontend import codegen
    from mxq.kernels.config import Tuning

    both = mxq.fused_quant(rowwise=True, colwise=True)(_ident_for_smem)
    four = codegen.kernel_config(both.spec, both.epilogue, Tuning(unaligned_warps=4))
    assert four.packed_shared_bytes(1, unaligned=True) == 16896 + 2048 + 1024 + 1024
    cfg = codegen.kernel_config(both.spec, both.epilogue)
    assert cfg.packed_shared_bytes(1, unaligned=True) == 16896 + 4096 + 1024 + 1024
    assert cfg.packed_shared_bytes(1, unaligned=False) == 2048 + 1024


def _six_for_smem(a, b, c, d, e, f):
    return a + b + c + d + e + f


def _seven_for_smem(a, b, c, d, e, f, g):
    return a + b + c + d + e + f + g


def _eight_for_smem(a, b, c, d, e, f, g, h):
    return a + b + c + d + e + f + g + h


def test_fp32_unaligned_rows_fit_shared_memory():
    """KernelConfig.vec_unaligned_bytes against the dynamic shared memory the fp32 kernel's
    unaligned rows (variant rows8) are compiled with, rowwise + colwise: words 32 x 256 x 4 =
    32768 per input, chunks 32 x 260 x 4 = 33280, plus 1024 of inverse column scales. Seven
    inputs fit as words (230400) but not as chunks (233984 > 232448: the kernel would not
    launch), so they take words; eight fit neither and run the element-wise kernel."""
    from mxq.frontend import codegen
    from mxq.runtime import inspection
    from mxq.kernels.config import SMEM_LIMIT, Tuning

    def smem(op):
        return inspection.compile_artifacts(op, "sm_90", "fp32", "rows8")["mlir"]

    for copy, want in (("words", 32768 + 1024), ("chunks", 33280 + 1024)):
        one = mxq.fused_quant(rowwise=True, colwise=True)(_ident_for_smem)
        one._with_tuning(Tuning(vec_unaligned_copy=copy))
        cfg = codegen.kernel_config(one.spec, one.epilogue, Tuning(vec_unaligned_copy=copy))
        assert cfg.vec_unaligned_chunks == (copy == "chunks")
        assert cfg.vec_unaligned_bytes(cfg.vec_unaligned_chunks) == want
        assert f"constant({want} : i64)" in smem(one)
    seven = mxq.fused_quant(rowwise=True, colwise=True)(_seven_for_smem)
    cfg = codegen.kernel_config(seven.spec, seven.epilogue, None)
    assert cfg.vec_unaligned_bytes(True) == 7 * 33280 + 1024 > SMEM_LIMIT
    assert cfg.vec_unaligned and not cfg.vec_unaligned_chunks
    assert f"constant({7 * 32768 + 1024} : i64)" in smem(seven)
    eight = mxq.fused_quant(rowwise=True, colwise=True)(_eight_for_smem)
    assert not codegen.kernel_config(eight.spec, eight.epilogue, None).vec_unaligned
    assert "generic_kernel" in inspection.compile_artifacts(eight, "sm_90", "fp32", "rows8")["ptx"]
    with pytest.raises(ValueError, match="vec_unaligned_copy"):
        Tuning(vec_unaligned_copy="chunk")


def _ident_for_smem(x):
    return x


def _grad_warnings(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
    return [w for w in got if "requires grad" in str(w.message)]


def test_inputs_that_require_grad_warn_once_per_op_and_argument(monkeypatch):
    """No autograd graph through mxq: a UserWarning naming the argument, pointing at the caller's
    line and at the autograd.Function pattern, once per op and argument (issue 37 item 5)."""
    monkeypatch.setattr(validation, "_warned", set())
    x, r = torch.randn(64, 32), torch.randn(64, 32, requires_grad=True)
    op = mxq.fused_quant(colwise=True)(two)
    got = _grad_warnings(lambda: [op(x, r), op(x, r), op(x, r, alpha=0.5)])
    assert len(got) == 1 and got[0].category is UserWarning and got[0].filename == __file__
    message = str(got[0].message)
    assert message.startswith("mxq: argument 'r' requires grad") and "torch.autograd.Function" in message
    assert "examples/train_mlp.py" in message
    got = _grad_warnings(lambda: [mxq.quantize(r), mxq.quantize(r, colwise=True)])
    assert len(got) == 1 and "argument 'x' requires grad" in str(got[0].message) and got[0].filename == __file__
    g = torch.randn(64, 32, requires_grad=True)
    dact = mxq.fused_quant(dact="gelu")(_ident)
    got = _grad_warnings(lambda: dact(torch.randn(64, 32), act_input=g))
    assert len(got) == 1 and "argument 'act_input' requires grad" in str(got[0].message)


def test_no_grad_warning_where_no_graph_is_expected(monkeypatch):
    """Under torch.no_grad() and in an autograd.Function's forward (examples/train_mlp.py) an
    input that requires grad is expected: no warning."""
    monkeypatch.setattr(validation, "_warned", set())
    w = torch.nn.Parameter(torch.randn(64, 32))

    class Quantized(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return mxq.quantize(w).dequantize("rowwise")

        @staticmethod
        def backward(ctx, grad):
            return grad

    def calls():
        with torch.no_grad():
            mxq.quantize(w)
        Quantized.apply(w).sum().backward()

    assert _grad_warnings(calls) == [] and w.grad is not None


def test_the_fast_path_does_not_skip_the_grad_warning(monkeypatch):
    """A call that may skip the checks (FusedOp._fast, filled by an earlier checked CUDA call)
    still warns for an input that requires grad."""
    monkeypatch.setattr(validation, "_warned", set())
    op = mxq.fused_quant()(_ident)
    x = torch.randn(64, 32)
    monkeypatch.setitem(op._fast, (x.dtype, x.get_device()), type("Launcher", (), {"allocating": staticmethod(lambda *a: "fast")})())
    assert op(x) == "fast"  # (the fake stands in for a CUDA launcher)
    got = _grad_warnings(lambda: op(x.requires_grad_()))
    assert len(got) == 1 and "argument 'x' requires grad" in str(got[0].message)


def test_a_global_amax_in_an_out_field_is_refused_but_out_amax():
    """NVFP4's global_amax is read by the call: sharing memory with an out= field is refused by
    name, as an input's is, but out.amax itself (an earlier result's t.amax, reused: the call
    copies the amax into it first), whose call gives the bytes of the same amax given apart."""
    x = torch.randn(32, 64)
    t = mxq.quantize(x, format="nvfp4")
    want = mxq.quantize(x, format="nvfp4", global_amax=t.amax.clone())
    got = mxq.quantize(x, format="nvfp4", global_amax=t.amax, out=t)
    assert torch.equal(got.rowwise_data, want.rowwise_data) and torch.equal(got.rowwise_scale, want.rowwise_scale)
    inside = t.rowwise_scale.view(torch.uint8).reshape(-1)[:4].view(torch.float32).reshape(())
    with pytest.raises(ValueError, match="'out.rowwise_scale' overlaps 'global_amax'"):
        mxq.quantize(x, format="nvfp4", global_amax=inside, out=t)


def test_a_global_amax_sharing_out_amax_other_than_as_that_field_is_refused():
    """The given amax is copied into out.amax (and colwise_amax) first: a tensor that is the very
    field (an earlier result's amax, a grouped call's [G], the Hadamard pair as its [2] buffer
    or as two fields) gives the bytes of the same amax given apart; one shifted against the field
    it is copied into, a group's value broadcast from inside the field, or the pair swapped
    would read values the copy has overwritten, and is refused by name."""
    from mxq import MXFP8Tensor
    from mxq.formats import fp4_layouts
    x = torch.randn(48, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    go = torch.tensor([16, 32, 48], dtype=torch.int32)
    t = mxq.quantize(x, format="nvfp4", colwise=True, group_offsets=go)
    want = mxq.quantize(x, format="nvfp4", colwise=True, group_offsets=go, global_amax=t.amax.clone())
    got = mxq.quantize(x, format="nvfp4", colwise=True, group_offsets=go, global_amax=t.amax, out=t)
    assert all(torch.equal(getattr(got, f).view(torch.uint8), getattr(want, f).view(torch.uint8))
               for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"))
    spec = mxq.QuantSpec(format="nvfp4", colwise=True)
    o = MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu", group_offsets=go)
    buf = torch.tensor([1.0, 2.0, 3.0, 4.0])
    o.amax = buf[1:4]
    with pytest.raises(ValueError, match="'global_amax' overlaps 'out.amax'"):  # (read [1, 2, 3], copied as [1, 1, 1])
        mxq.quantize(x, format="nvfp4", colwise=True, group_offsets=go, global_amax=buf[0:3], out=o)
    with pytest.raises(ValueError, match="'global_amax' overlaps 'out.amax'"):
        mxq.quantize(x, format="nvfp4", colwise=True, group_offsets=go, global_amax=t.amax[1], out=t)
    h = mxq.quantize(x[:32], format="nvfp4", colwise=True, hadamard=True)
    want = mxq.quantize(x[:32], format="nvfp4", colwise=True, hadamard=True,
                        global_amax=(h.amax.clone(), h.colwise_amax.clone()))
    pair = fp4_layouts.amax_pair(h.amax, h.colwise_amax)
    for given in ((h.amax, h.colwise_amax), pair):
        got = mxq.quantize(x[:32], format="nvfp4", colwise=True, hadamard=True, global_amax=given, out=h)
        assert torch.equal(got.colwise_data, want.colwise_data) and torch.equal(got.colwise_amax, want.colwise_amax)
    with pytest.raises(ValueError, match="'global_amax' overlaps 'out.amax'"):
        mxq.quantize(x[:32], format="nvfp4", colwise=True, hadamard=True, global_amax=(h.colwise_amax, h.amax), out=h)
    # (a Hadamard op's result as the out= of a plain NVFP4 op: its colwise_amax is no destination)
    plain = mxq.quantize(x[:32], format="nvfp4", colwise=True, global_amax=h.amax.clone())
    got = mxq.quantize(x[:32], format="nvfp4", colwise=True, global_amax=h.amax, out=h)
    assert torch.equal(got.rowwise_data, plain.rowwise_data) and torch.equal(got.colwise_data, plain.colwise_data)
    b = torch.tensor([5.0, 6.0, 7.0])
    o = MXFP8Tensor.empty(mxq.QuantSpec(format="nvfp4", colwise=True, hadamard=True), (32, 64), x.dtype, "cpu")
    o.amax, o.colwise_amax = b[1], b[2]
    with pytest.raises(ValueError, match="'global_amax' overlaps 'out.amax'"):  # (colwise_amax would read 5, not 6)
        mxq.quantize(x[:32], format="nvfp4", colwise=True, hadamard=True, global_amax=b[0:2], out=o)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_noop_other_than_one_is_an_ordinary_call(device):
    """docs/NUMERICS.md, noop: only 1.0 writes nothing; 0, 0.5 and NaN write what the call
    without noop writes (TE's noop[0] == 1.0 test), into an earlier result or fresh outputs."""
    x = torch.randn(64, 96, device=device)
    want = mxq.quantize(x, colwise=True, amax=True)
    for value in (0.0, 0.5, float("nan")):
        noop = torch.full((1,), value, device=device)
        earlier = mxq.quantize(x * 3, colwise=True, amax=True)
        for got in (mxq.quantize(x, colwise=True, amax=True, noop=noop, out=earlier),
                    mxq.quantize(x, colwise=True, amax=True, noop=noop)):
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
                assert torch.equal(getattr(got, f).reshape(-1).view(torch.uint8),
                                   getattr(want, f).reshape(-1).view(torch.uint8)), (value, f)
