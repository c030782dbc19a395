"""The call path's own rules: fallback warnings, MXQ_STRICT, prepare() on CPU tensors."""

import warnings

import pytest
import torch

import mxq
from mxq.tensor import data_rows
from mxq.runtime import validation as runtime


def test_fallback_warns_once_per_reason(monkeypatch):
    monkeypatch.delenv("MXQ_STRICT", raising=False)
    runtime._warned.discard("test reason")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime.fallback("test reason")
        runtime.fallback("test reason")
    assert [str(w.message) for w in caught] == [
        "mxq: running the torch reference instead of a GPU kernel: test reason"]


def test_strict_mode_turns_fallback_into_an_error(monkeypatch):
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="MXQ_STRICT"):
        runtime.fallback("another reason")


def test_prepare_needs_cuda_tensors():
    op = mxq.fused_quant()(_ident)
    with pytest.raises(ValueError, match="CUDA"):
        op.prepare(torch.randn(4, 32))


def test_out_must_be_contiguous():
    x = torch.randn(64, 64)
    out = mxq.quantize(x, colwise=True)
    out.colwise_scale = torch.empty(64, 2, dtype=torch.uint8).t()  # right shape, not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        mxq.quantize(x, colwise=True, out=out)


def test_out_may_have_padded_rows():
    """FP8 data of rows padded to 16 bytes (MXFP8Tensor.empty(row_align=16): [.., N] views of
    [M, 16 * ceil(N / 16)] bytes, N-D shapes with their leading dimensions as rows) is a legal
    out= and gets the contiguous call's bytes (CPU reference here; the kernels:
    test_gpu.py::test_padded_outputs_match_reference); data whose elements are not adjacent, a
    row_align that is not a power of two, and padded grouped outputs are refused."""
    spec = mxq.QuantSpec(rowwise=True, colwise=True)
    x = torch.randn(4, 3, 70, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu", row_align=16)
    assert out.rowwise_data.shape == (4, 3, 70) and out.rowwise_data.stride() == (3 * 80, 80, 1)
    want = mxq.quantize(x, rowwise=True, colwise=True, out=mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu",
                                                                             row_align=1))
    assert want.rowwise_data.is_contiguous()
    got = mxq.quantize(x, rowwise=True, colwise=True, out=out)
    for name in ("rowwise_data", "colwise_data"):
        assert torch.equal(getattr(got, name).view(torch.uint8), getattr(want, name).view(torch.uint8))
    assert torch.equal(got.rowwise_scale, want.rowwise_scale) and torch.equal(got.colwise_scale, want.colwise_scale)
    assert mxq.MXFP8Tensor.empty(spec, (64, 64), x.dtype, "cpu", row_align=16).rowwise_data.is_contiguous()
    bad = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
    bad.rowwise_data = torch.empty(12, 140, dtype=bad.rowwise_data.dtype)[:, ::2].reshape(4, 3, 70)
    with pytest.raises(ValueError, match="out.rowwise_data.*rows of unit stride"):
        mxq.quantize(x, rowwise=True, colwise=True, out=bad)
    with pytest.raises(ValueError, match="row_align"):
        mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu", row_align=12)
    with pytest.raises(ValueError, match="row_align"):
        mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu", row_align=16.0)
    # padding past what the kernels serve is refused by name before any allocation (it reached the
    # allocator's out-of-memory error); the largest sane padding still allocates
    with pytest.raises(ValueError, match="'row_align' = 1099511627776 pads 4 rows"):
        mxq.MXFP8Tensor.empty(spec, (4, 64), x.dtype, "cpu", row_align=2 ** 40)
    assert mxq.MXFP8Tensor.empty(spec, (4, 64), x.dtype, "cpu", row_align=4096).rowwise_data.stride(0) == 4096
    # a 0-d input has no rows to pad; its data is one row of one byte to the kernels
    assert data_rows(torch.zeros((), dtype=torch.uint8), 1, 1).shape == (1, 1)
    scalar = torch.tensor(1.5, dtype=torch.bfloat16)
    zero_d = mxq.quantize(scalar, rowwise=True, colwise=True,
                          out=mxq.MXFP8Tensor.empty(spec, (), x.dtype, "cpu", row_align=16))
    assert torch.equal(zero_d.rowwise_data.view(torch.uint8),
                       mxq.quantize(scalar, rowwise=True, colwise=True).rowwise_data.view(torch.uint8))
    with pytest.raises(ValueError, match="row_align"):
        mxq.MXFP8Tensor.empty(spec, (64, 70), x.dtype, "cpu", row_align=16,
                              group_offsets=torch.tensor([64], dtype=torch.int32))


def test_default_outputs_pad_rows_that_are_not_whole_units():
    """Without out=, FP8 data whose rows are not whole 8-byte units (N % 8 != 0) is a view of
    rows padded to 16 bytes (MXFP8Tensor.empty's default, tensor.default_row_align), with the
    bytes of contiguous data; N % 8 == 0, grouped outputs and 0-d shapes stay contiguous, and
    row_align=1 asks for contiguous data at any N. The kernels' side:
    test_gpu.py::test_default_outputs_pad_odd_rows."""
    spec = mxq.QuantSpec(rowwise=True, colwise=True)
    bf = torch.bfloat16
    for shape, strides in (((64, 70), (80, 1)), ((4, 3, 70), (3 * 80, 80, 1)), ((5, 1), (16, 1)),
                           ((33, 4), (16, 1)), ((33, 20), (32, 1)), ((2, 17), (32, 1))):
        x = torch.randn(shape, dtype=bf)
        got = mxq.quantize(x, rowwise=True, colwise=True)
        assert got.rowwise_data.stride() == strides and got.colwise_data.stride() == strides, shape
        want = mxq.quantize(x, rowwise=True, colwise=True,
                            out=mxq.MXFP8Tensor.empty(spec, x.shape, bf, "cpu", row_align=1))
        for name in ("rowwise_data", "colwise_data"):
            assert getattr(want, name).is_contiguous()
            assert torch.equal(getattr(got, name).view(torch.uint8), getattr(want, name).view(torch.uint8))
        assert torch.equal(got.dequantize(), want.dequantize())
    # whole units: contiguous, as are grouped outputs and 0-d shapes
    for shape in ((64, 64), (3, 8), (7, 4104)):
        assert mxq.quantize(torch.randn(shape, dtype=bf), rowwise=True, colwise=True).rowwise_data.is_contiguous()
    assert mxq.MXFP8Tensor.empty(spec, (), bf, "cpu").rowwise_data.shape == ()
    grouped = mxq.MXFP8Tensor.empty(spec, (64, 70), bf, "cpu", group_offsets=torch.tensor([64], dtype=torch.int32))
    assert grouped.rowwise_data.is_contiguous() and grouped.colwise_data.is_contiguous()
    # a gated backward writes [M, 2N]: padded when 2N % 8 != 0
    assert mxq.MXFP8Tensor.empty(spec, (8, 2 * 35), bf, "cpu").rowwise_data.stride() == (80, 1)
    assert mxq.MXFP8Tensor.empty(spec, (8, 2 * 36), bf, "cpu").rowwise_data.is_contiguous()
    # the noop call's zeroed outputs follow the same rule
    noop = torch.ones(1)
    assert mxq.quantize(torch.randn(8, 70, dtype=bf), noop=noop).rowwise_data.stride() == (80, 1)


def _ident(x):
    return x


class _RecordingLauncher:
    """Stands in for a CUDA launcher in the op's fast-path table (keyed by get_device() == -1,
    a CPU tensor's), so the gatekeeping of the fast path runs without a GPU."""

    def __init__(self):
        self.calls = []
        self.keywords = []  # (noop, group_offsets) of each call

    def allocating(self, *args):
        *values, noop, offsets = args  # (the allocating route's: *tensors, *floats, act_input, noop, group_offsets)
        self.calls.append(values[0] if len(values) == 2 and values[1] is None else tuple(values))
        self.keywords.append((noop, offsets))
        return "fast"


def test_fast_path_takes_only_plain_calls():
    op = mxq.fused_quant(colwise=True)(_plain)
    assert not op._fast, "nothing is fast before a checked CUDA call"
    fake = op._fast[(torch.bfloat16, -1)] = _RecordingLauncher()
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    assert op(x) == "fast" and fake.calls == [x] and fake.keywords == [(None, None)]
    # noop, int32 group ends, keywords and a 2-D view of rows go to the allocating route too
    noop, ends = torch.zeros(1), torch.tensor([10, 64], dtype=torch.int32)
    view = torch.randn(64, 96, dtype=torch.bfloat16)[:, :64]
    assert op(x, noop=noop) == op(x, group_offsets=ends) == op(x=x) == op(view) == "fast"
    assert fake.calls[1:] == [x, x, x, view] and fake.keywords[1:3] == [(noop, None), (None, ends)]
    # everything else goes through the checked path (here: the CPU reference)
    assert isinstance(op(x.t()), mxq.MXFP8Tensor)  # not rows of unit stride
    assert isinstance(op(x, group_offsets=ends.long()), mxq.MXFP8Tensor)  # (the checked path converts)
    strided_ends = torch.tensor([10, 0, 64, 0], dtype=torch.int32)[::2]  # (the native route takes contiguous ends)
    assert isinstance(op(x, group_offsets=strided_ends), mxq.MXFP8Tensor)
    assert isinstance(mxq.quantize(x, colwise=True, group_offsets=strided_ends), mxq.MXFP8Tensor)
    assert isinstance(op(x, out=mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")), mxq.MXFP8Tensor)
    assert isinstance(op(torch.nn.Parameter(x, requires_grad=False)), mxq.MXFP8Tensor)  # a subclass
    assert isinstance(op(x[:0]), mxq.MXFP8Tensor)  # empty
    assert isinstance(op(x.float()), mxq.MXFP8Tensor)  # another dtype: another key
    with pytest.raises(TypeError, match="too many positional"):
        op(x, x)
    with pytest.raises(TypeError, match="_plain"):
        op(y=x)  # (keywords the signature does not take: the checked path names the function)
    assert len(fake.calls) == 5


def test_quantize_takes_the_fast_path_itself():
    """mxq.quantize checks the fast path before calling its op (one layer of Python less on the
    host-time path), noop= and int32 group_offsets= calls too; out= calls take the checked path."""
    from mxq.op import _quantize_op
    from mxq.frontend.spec import QuantSpec

    op = _quantize_op(QuantSpec(fp8="e5m2", rowwise=False, colwise=True, scale_mode="floor"))
    fake = op._fast[(torch.float16, -1)] = _RecordingLauncher()
    try:
        x = torch.randn(64, 64, dtype=torch.float16)
        assert mxq.quantize(x, fp8="e5m2", rowwise=False, colwise=True, scale_mode="floor") == "fast"
        noop = torch.zeros(1)
        assert mxq.quantize(x, fp8="e5m2", rowwise=False, colwise=True, scale_mode="floor", noop=noop) == "fast"
        assert fake.keywords == [(None, None), (noop, None)]
        out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
        got = mxq.quantize(x, fp8="e5m2", rowwise=False, colwise=True, scale_mode="floor", out=out)
        assert got is out and fake.calls == [x, x]
    finally:
        op._fast.clear()


def test_fast_path_checks_each_argument_class_and_act_input():
    """Ops with floats and several tensors take the fast path too, their arguments in the
    allocating route's order (tensors, then floats); a float where a tensor goes, an int float,
    an input that requires grad, or act_input on an op without dact go the checked path."""
    op = mxq.fused_quant()(_mixed)
    fake = op._fast[(torch.float32, -1)] = _RecordingLauncher()
    x, r = torch.randn(64, 32), torch.randn(64, 32)
    assert op(x, 0.5, r) == "fast" and fake.calls == [(x, r, 0.5, None)]
    for bad in ((x, 1, r), (x, 0.5, 0.5), (x, 0.5, r.clone().requires_grad_())):
        with pytest.raises((TypeError, ValueError)) if bad[2].__class__ is float else _no_raise():
            op(*bad)
    with pytest.raises(ValueError, match="act_input"):
        op(x, 0.5, r, act_input=x)
    assert len(fake.calls) == 1
    back = mxq.fused_quant(dact="gelu")(_plain)
    fake = back._fast[(torch.float32, -1)] = _RecordingLauncher()
    assert back(x, act_input=r) == "fast" and fake.calls == [(x, r)]
    with pytest.raises(ValueError, match="act_input"):
        back(x)  # (required: the checked path names it)


def _mixed(x, alpha: float, r):
    return x * alpha + r


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_quantize_rejects_unhashable_options_by_name():
    with pytest.raises((TypeError, ValueError), match="fp8"):
        mxq.quantize(torch.zeros(4, 32), fp8=["e4m3"])


def _plain(x):
    return x


def _scaled(x, alpha: float = 2.0):
    return x * alpha


def test_python_binding_puts_every_tensor_in_its_slot(monkeypatch, tmp_path):
    """Launcher.bind (what prepare() launches): each kernel argument is the tensor of its slot
    in the table, by data pointer -- a binder that swapped the rowwise and colwise buffers fails
    here on CPU (GPU side: tests/test_gpu.py::test_prepare_matches_reference)."""
    from mxq.runtime import slots, targets
    from mxq.runtime.call import Call

    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(targets, "device_arch", lambda device: "sm_90")

    def axr(x, r, alpha: float = 1.0):
        return x * alpha + r

    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True, dact="relu", dbias=True)(axr)
    x, r, a = (torch.randn(64, 96, dtype=torch.bfloat16) for _ in range(3))
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    noop = torch.zeros(1)
    fn, args, got_out = op._launcher_for(x).bind(Call([x, r], [0.5], a, noop, out))
    assert got_out is out and fn is not None
    want = {"mIn0": x, "mIn1": r, "mActIn": a, "mRowData": out.rowwise_data, "mRowScale": out.rowwise_scale,
            "mColData": out.colwise_data, "mColScale": out.colwise_scale, "mAmax": out.amax, "mDbias": out.dbias,
            "mNoop": noop}
    table = slots.kernel_slots(op.spec, 2, 1)
    assert len(args) == len(table)
    for slot, arg in zip(table, args):
        if slot.role == "scalar":
            assert arg == 0.5
        elif slot.role == "dbias_workspace":
            assert arg.shape == (2, 96) and arg.dtype == torch.float32
        else:
            assert arg.data_ptr() == want[slot.name].data_ptr(), slot.name


def test_gated_forward_takes_the_inner_ops_fast_path():
    """A gated forward call (mxq/frontend/gated.py) goes straight to its inner op's allocating
    route with the halves of its [M, 2N] tensor (views, no copy); odd widths and backward calls
    take the checked path, which names what is wrong."""
    op = mxq.fused_quant(rowwise=True, colwise=True, act="swiglu")(_plain)
    fake = op.inner._fast[(torch.bfloat16, -1)] = _RecordingLauncher()
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    ends = torch.tensor([64], dtype=torch.int32)
    assert op(w) == op(w, group_offsets=ends) == "fast"
    (gate, up, act_input), again = fake.calls
    assert act_input is None and again[0].data_ptr() == gate.data_ptr() and fake.keywords[1] == (None, ends)
    assert gate.shape == up.shape == (64, 64) and gate.stride() == up.stride() == (128, 1)
    assert gate.data_ptr() == w.data_ptr() and up.data_ptr() == w.data_ptr() + 64 * w.element_size()
    with pytest.raises(ValueError, match="'x'.*even"):
        op(w[:, :127])
    back = mxq.fused_quant(rowwise=True, dact="swiglu")(_plain)
    back.inner._fast[(torch.bfloat16, -1)] = fake
    assert isinstance(back(w[:, :64].contiguous(), act_input=w), mxq.MXFP8Tensor) and len(fake.calls) == 2


def _gated_operands(x, b, c, alpha: float):
    return x * c + b * alpha


def test_gated_forward_fast_path_splits_each_operand_by_its_kind():
    """The fast path's split of a gated forward's tensors: a full or row operand of the input's
    width gives its two halves, a column or scalar operand serves both halves; any other width is
    refused naming the argument (call.split_halves, the checked path's rule), nothing launched."""
    op = mxq.fused_quant(rowwise=True, colwise=True, act="swiglu")(_gated_operands)
    fake = op.inner._fast[(torch.bfloat16, -1)] = _RecordingLauncher()
    w, b = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
    for c in (torch.randn(64, 1, dtype=torch.bfloat16), torch.randn((), dtype=torch.bfloat16), w.flip(0)):
        assert op(w, b, c, 0.5) == "fast"
        gates, ups = fake.calls[-1][:3], fake.calls[-1][3:6]
        assert fake.calls[-1][6:] == (0.5, None)
        for t, g, u in zip((w, b, c), gates, ups):
            if t.dim() and t.shape[-1] == 128:
                assert torch.equal(g, t[..., :64]) and torch.equal(u, t[..., 64:]) and g.data_ptr() == t.data_ptr()
            else:
                assert g is t and u is t
    with pytest.raises(ValueError, match="'b'"):
        op(w, torch.randn(64, dtype=torch.bfloat16), w, 0.5)
    assert len(fake.calls) == 3


def test_prepare_says_why_it_cannot_prepare():
    x = torch.randn(8, 64)
    with pytest.raises(ValueError, match="prepare\\(\\) needs CUDA tensors .*: the input is not a CUDA tensor"):
        mxq.fused_quant(colwise=True)(_ident).prepare(x)


def test_out_calls_take_the_route_a_checked_call_left_on_the_out():
    """A call into ``out`` on the native route leaves a token on it (launch.into_token); a later
    call of the same op into the same out, with the same input shape, dtype, device and group
    count and the same field tensors, goes straight to that route (FusedOp._fast_into; the native
    dispatcher checks the fields per call), anything else takes the checked path. Here a real
    Launcher whose native dispatcher is a recorder, on CPU tensors."""
    import copy
    import pickle

    from mxq.runtime import launch
    from mxq.runtime.call import Call

    op = mxq.fused_quant(colwise=True)(_ident)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    sent = []
    launcher = launch.Launcher(op, "sm_90a", "bf16", (lambda *a: sent.append(a), None))
    assert launcher._dispatch_into(Call([x], [], None, None, out, None)) is out and len(sent) == 1
    assert out.__dict__["_mxq_into"][0] is launcher
    assert op(x, out=out) is out and op(x=x, out=out) is out and len(sent) == 3  # (the token's route)
    assert sent[-1][0] is x and sent[-1][2] is out.rowwise_data and sent[-1][6] is out.amax
    # another op's call, a noop call, a call of another shape or dtype: the checked path (the CPU reference)
    assert mxq.quantize(x, colwise=True, out=out) is out and op(x, out=out, noop=torch.zeros(1)) is out
    assert op(x.float(), out=out) is out
    with pytest.raises(ValueError, match="'out' holds outputs of shape"):
        op(x[:32], out=out)
    assert len(sent) == 3
    # a field set to another tensor is checked again; the token holds until a route leaves a new one
    out.rowwise_scale = torch.zeros(3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="out.rowwise_scale"):
        op(x, out=out)
    out.rowwise_scale = torch.zeros(64, 2, dtype=torch.uint8)
    assert op(x, out=out) is out and len(sent) == 3  # (checked: the reference wrote it)
    # whatever Python's checks read, changed after the token was left, is checked again by them: a
    # field freed and replaced (its id may be the freed one's), resized in place or given other
    # .data, out's description (fp8, shape)
    def spoiled(change):
        fresh = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
        launcher._dispatch_into(Call([x], [], None, None, fresh, None))
        change(fresh)
        return fresh

    def replace_scale(t):
        t.rowwise_scale = None
        t.rowwise_scale = torch.zeros(128, dtype=torch.float8_e8m0fnu)

    for change, words in ((replace_scale, "out.rowwise_scale"),
                          (lambda t: t.rowwise_scale.resize_(2, 64), "out.rowwise_scale"),
                          (lambda t: t.colwise_scale.resize_(128), "out.colwise_scale"),
                          (lambda t: setattr(t.rowwise_data, "data", torch.empty(4096, dtype=torch.uint8)),
                           "out.rowwise_data"),
                          (lambda t: setattr(t, "fp8", "e5m2"), "e5m2"),
                          (lambda t: setattr(t, "shape", torch.Size([32, 128])), "holds outputs of shape")):
        sent.clear()
        with pytest.raises(ValueError, match=words):
            op(x, out=spoiled(change))
        assert len(sent) == 1, words  # (the token's own call only)
    sent.clear()
    sent.extend([None] * 3)
    # groups: the token holds the group count
    ends = torch.tensor([10, 64], dtype=torch.int32)
    grouped = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", group_offsets=ends)
    launcher._dispatch_into(Call([x], [], None, None, grouped, ends))
    assert op(x, out=grouped, group_offsets=torch.tensor([20, 64], dtype=torch.int32)) is grouped and len(sent) == 5
    with pytest.raises(ValueError, match="out.colwise_scale"):  # (one group: another count, the checked path)
        op(x, out=grouped, group_offsets=torch.tensor([64], dtype=torch.int32))
    assert len(sent) == 5
    # mxq.quantize takes the token of its own op
    launcher_q = launch.Launcher(mxq.op._QUANTIZE_OPS[next(k for k, v in mxq.op._QUANTIZE_OPS.items()
                                                            if v.spec == mxq.QuantSpec(colwise=True))],
                                 "sm_90a", "bf16", (lambda *a: sent.append(a), None))
    fresh = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    launcher_q._dispatch_into(Call([x], [], None, None, fresh, None))
    assert mxq.quantize(x, colwise=True, out=fresh) is fresh and len(sent) == 7
    # what the native dispatcher refuses on the token's route, the checked path refuses in its own words
    def refusing(*a):
        raise ValueError("mxq: argument 'rowwise_scale' has 128 elements (not contiguous)")

    held = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    launch.Launcher(op, "sm_90a", "bf16", (lambda *a: None, None))._dispatch_into(Call([x], [], None, None, held, None))
    held.__dict__["_mxq_into"][0].dispatch = refusing
    held.rowwise_scale.as_strided_((64, 2), (1, 64))  # (its shape and dtype: the token holds)
    with pytest.raises(ValueError, match="'out.rowwise_scale' must be laid out as MXFP8Tensor.empty makes it"):
        op(x, out=held)
    assert "_mxq_into" not in held.__dict__
    # pickle and copy leave the token behind
    assert "_mxq_into" not in copy.copy(fresh).__dict__ and "_mxq_into" not in copy.deepcopy(fresh).__dict__
    assert "_mxq_into" not in fresh.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[2]
