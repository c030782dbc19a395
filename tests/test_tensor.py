"""mxq/tensor.py: MXFP8Tensor as a saved object, and what MXFP8Tensor.empty refuses."""

import io

import pytest
import torch

import mxq
from mxq.testing import compare


def _ident(x):
    return x


def test_saved_tensors_load_back_with_torch_defaults():
    """torch.save / torch.load with torch's default weights_only=True: the fields come back
    byte-equal, views of padded rows keep their strides, grouped tensors their offsets."""
    x = torch.randn(64, 64)
    cases = [mxq.quantize(x, colwise=True, amax=True),
             mxq.quantize(x[:, :13], scale_layout="swizzled", fp8="e5m2"),  # N % 8 != 0: padded rows
             mxq.quantize(x[:, :32], colwise=True, group_offsets=torch.tensor([20, 64]))]
    for t in cases:
        buf = io.BytesIO()
        torch.save(t, buf)
        buf.seek(0)
        u = torch.load(buf, weights_only=True)  # (torch's default, stated: an environment variable can change it)
        assert type(u) is mxq.MXFP8Tensor
        assert (u.fp8, u.scale_layout, u.shape) == (t.fp8, t.scale_layout, t.shape)
        assert compare(u, t, exact=True) == []
        for f in ("rowwise_data", "colwise_data"):
            if getattr(t, f) is not None:
                assert getattr(u, f).stride() == getattr(t, f).stride(), f
        assert (u.group_offsets is None) == (t.group_offsets is None)
        if t.group_offsets is not None:
            assert torch.equal(u.group_offsets, t.group_offsets)
            assert compare(u.group(0), t.group(0), exact=True) == []


class _Index:
    """An integer-like index (numpy's integers behave so: operator.index takes them)."""

    def __index__(self):
        return 1


def test_group_takes_any_integer_index_and_refuses_the_rest():
    import pytest

    x = torch.randn(64, 32)
    t = mxq.quantize(x, colwise=True, group_offsets=torch.tensor([32, 64]))
    want = mxq.quantize(x[32:], colwise=True)
    for g in (1, _Index(), torch.tensor(1)):
        assert compare(t.group(g), want, exact=True) == [], g
    for g, exc in ((True, TypeError), (1.0, TypeError), (2, ValueError), (-1, ValueError), ("1", TypeError),
                   (torch.tensor(0.5), TypeError), (torch.tensor([1]), TypeError)):
        with pytest.raises(exc, match=r"group index must be an int in \[0, 2\)"):
            t.group(g)


@pytest.mark.parametrize("fmt, layout", [("mxfp8", "compact"), ("mxfp8", "swizzled"), ("mxfp4", "compact"),
                                         ("fp8_block", "compact")])
def test_grouped_decode_reads_the_group_ends_once(fmt, layout, monkeypatch):
    """dequantize() and compact_scale() of a grouped tensor read the group ends from the device once,
    not once per group (which made 16,000 groups take minutes); each group's values are group(g)'s."""
    from mxq.formats import groups

    ends = torch.tensor([0, 4, 64, 64, 100, 130])  # (empty groups, ends off the 32- and 128-row blocks)
    x = torch.randn(130, 64)
    t = mxq.quantize(x, colwise=True, format=fmt, scale_layout=layout, group_offsets=ends)
    reads, bounds = [], groups.bounds
    monkeypatch.setattr(groups, "bounds", lambda off: reads.append(1) or bounds(off))
    for direction in ("rowwise", "colwise"):
        reads.clear()
        got = t.dequantize(direction)
        assert len(reads) <= 1, (direction, len(reads))
        want = torch.cat([t.group(g).dequantize(direction) for g in range(len(ends))])
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    if layout == "swizzled":
        reads.clear()
        got = t.compact_scale("rowwise")
        assert len(reads) == 1 and torch.equal(got, torch.cat([t.group(g).compact_scale() for g in range(len(ends))]))
        with pytest.raises(ValueError, match="direction must be 'rowwise' or 'colwise', got 'bad'"):
            t.compact_scale("bad")


def test_empty_names_a_spec_that_is_not_one():
    import pytest

    with pytest.raises(TypeError, match="MXFP8Tensor.empty\\(\\) argument 'spec' must be a QuantSpec"):
        mxq.MXFP8Tensor.empty(None, (4, 32), torch.float32, "cpu")


def test_empty_names_a_bad_shape_or_dtype():
    """MXFP8Tensor.empty's shape (a torch.Size, tuple or list of ints >= 0) and dtype (the input's,
    which the dbias takes: float32, float16, bfloat16) are checked by name; they were Python's
    "'int' object is not iterable", torch's RuntimeError, or a float64 dbias every call refused."""
    import pytest

    spec = mxq.fused_quant(colwise=True, dbias=True)(_ident).spec
    for shape in (13, (4, 32.0), "ab", (4, True)):
        with pytest.raises(TypeError, match="argument 'shape' must be a torch.Size or a tuple or list of ints"):
            mxq.MXFP8Tensor.empty(spec, shape, torch.float32, "cpu")
    with pytest.raises(ValueError, match="argument 'shape' must hold sizes >= 0"):
        mxq.MXFP8Tensor.empty(spec, [4, -1], torch.float32, "cpu")
    for dtype in (torch.float64, torch.uint8):
        with pytest.raises(TypeError, match="argument 'dtype'"):
            mxq.MXFP8Tensor.empty(spec, (4, 32), dtype, "cpu")
    t = mxq.MXFP8Tensor.empty(spec, [4, 32], torch.bfloat16, "cpu")
    assert t.shape == (4, 32) and t.dbias.dtype == torch.bfloat16


def test_results_carry_their_scale_mode_through_every_route():
    """An MXFP8Tensor records the rule its scales were chosen by: eager, reference, empty(),
    group(), torch.compile's result (a pytree node) and torch.save all keep it."""
    import io

    x = torch.randn(64, 32)
    for mode in ("rceil", "floor", "ceil", "even"):
        t = mxq.quantize(x, colwise=True, scale_mode=mode, group_offsets=torch.tensor([32, 64]))
        assert t.scale_mode == mode and t.group(1).scale_mode == mode
        compiled = torch.compile(lambda a, m=mode: mxq.quantize(a, colwise=True, scale_mode=m), backend="aot_eager",
                                 fullgraph=True)(x)
        assert compiled.scale_mode == mode
        buf = io.BytesIO()
        torch.save(t, buf)
        buf.seek(0)
        assert torch.load(buf, weights_only=True).scale_mode == mode
    op = mxq.fused_quant(scale_mode="even")(lambda_free_ident)
    assert op.reference(x).scale_mode == "even"
    assert mxq.MXFP8Tensor.empty(op.spec, (4, 32), torch.float32, "cpu").scale_mode == "even"


def lambda_free_ident(x):
    return x


def test_an_out_buffer_describes_the_call_that_wrote_it():
    """A reused out= is labelled by the call that writes it (MXFP8Tensor.label, on every route:
    eager, compiled, op.gemm): its scale_mode the op's, no colwise_amax after an op without the
    Hadamard transform (dequantize reads the colwise copy by it: a stale one decoded the copy
    as transformed), the call's group ends or none; under noop the ends follow on the device
    (the old ones kept where nothing was written) and labels a call that may write nothing
    cannot change are refused. Each label is checked against a fresh call's."""
    import pytest

    x = torch.randn(32, 64, dtype=torch.bfloat16)
    y = torch.randn(32, 64, dtype=torch.bfloat16) * 100
    kw = dict(format="nvfp4", colwise=True)
    out = mxq.quantize(x, **kw, hadamard=True)
    assert out.colwise_amax is not None
    got, fresh = mxq.quantize(y, **kw, out=out), mxq.quantize(y, **kw)
    assert got.colwise_amax is None and torch.equal(got.dequantize("colwise"), fresh.dequantize("colwise"))
    spec = mxq.QuantSpec(format="fp8_block", scale_mode="pow2")
    for route in ("eager", "compiled"):
        out = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
        fn = lambda u, o: mxq.quantize(u, format="fp8_block", scale_mode="fp32", out=o)  # noqa: E731
        if route == "compiled":
            torch._dynamo.reset()
            fn = torch.compile(fn, backend="aot_eager", fullgraph=True)
        assert fn(x, out).scale_mode == "fp32" and out.scale_mode == "fp32", route
    grouped = mxq.quantize(x, group_offsets=torch.tensor([8, 32]))  # (rowwise: buffers a plain call takes too)
    assert grouped.group_offsets is not None and mxq.quantize(x, out=grouped).group_offsets is None
    a_ends, b_ends = torch.tensor([8, 32], dtype=torch.int32), torch.tensor([16, 32], dtype=torch.int32)
    for route in ("eager", "compiled"):
        fn = lambda u, o, e, n: mxq.quantize(u, colwise=True, out=o, group_offsets=e, noop=n)  # noqa: E731
        if route == "compiled":
            torch._dynamo.reset()
            fn = torch.compile(fn, backend="aot_eager", fullgraph=True)
        out = mxq.MXFP8Tensor.empty(mxq.QuantSpec(colwise=True), x.shape, x.dtype, "cpu", group_offsets=a_ends)
        fn(x, out, b_ends, torch.ones(1))
        assert out.group_offsets.tolist() == [8, 32], route  # (nothing written: the old ends)
        fn(x, out, b_ends, torch.zeros(1))
        want = mxq.quantize(x, colwise=True, group_offsets=b_ends)
        assert out.group_offsets.tolist() == [16, 32] and compare(out, want, exact=True) == [], route
        assert out.group(0).shape[0] == 16
    out = mxq.MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
    with pytest.raises(ValueError, match="with noop"):
        mxq.quantize(x, format="fp8_block", scale_mode="fp32", out=out, noop=torch.zeros(1))
    out = mxq.quantize(x, **kw, hadamard=True)
    with pytest.raises(ValueError, match="with noop"):
        mxq.quantize(y, **kw, out=out, noop=torch.zeros(1))


def test_results_compare_by_identity_and_hash():
    """Two results are equal only when they are the same object (their tensors' == is
    element-wise: a dataclass __eq__ raised on any two distinct results), and results hash."""
    import copy

    t = mxq.quantize(torch.randn(32, 64))
    assert t == t and (t == copy.deepcopy(t)) is False and t != copy.deepcopy(t)
    assert len({t, t, copy.deepcopy(t)}) == 2


@pytest.mark.parametrize("offsets, error, named", [
    ([64], TypeError, "must be a torch.Tensor"),
    (torch.tensor(64), ValueError, "1-D"),
    (torch.tensor([64.0]), TypeError, "int32 or int64"),
    (torch.tensor([[32, 64]]), ValueError, "1-D"),
    (torch.tensor([], dtype=torch.int32), ValueError, "at least one group end"),
])
def test_empty_checks_group_offsets_by_name(offsets, error, named):
    """MXFP8Tensor.empty(group_offsets=...) refuses offsets that cannot size grouped outputs, by
    name, before anything is allocated (a list used to fail in torch's words, a 0-d or 2-D tensor
    and float ends were accepted and failed later in group())."""
    spec = mxq.QuantSpec(colwise=True)
    with pytest.raises(error, match=f"group_offsets.*{named}"):
        mxq.MXFP8Tensor.empty(spec, (64, 32), torch.float32, "cpu", group_offsets=offsets)
    t = mxq.MXFP8Tensor.empty(spec, (64, 32), torch.float32, "cpu", group_offsets=torch.tensor([32, 64]))
    assert t.colwise_scale.shape[0] == 64 // 32 + 2


def test_empty_checks_a_torch_size_with_a_negative_dim():
    """A torch.Size is taken unchecked (a tensor's shape) unless it holds a negative size, which
    is refused by name like a tuple's."""
    spec = mxq.QuantSpec()
    for shape in (torch.Size([-1, 4]), (-1, 4)):
        with pytest.raises(ValueError, match="argument 'shape' must hold sizes >= 0"):
            mxq.MXFP8Tensor.empty(spec, shape, torch.float32, "cpu")


def test_empty_refuses_what_a_call_refuses_of_grouped_and_packed_outputs():
    """MXFP8Tensor.empty refuses the outputs a call of the same spec would refuse, by name, before
    allocating: FP8 block scaling's GEMM-ready layout with group_offsets (it built ungrouped
    buffers that failed later inside torch), FP4 data of an odd N (or an odd M with the colwise
    copy, and a 0-d shape, N = 1: it floored the packed dims)."""
    spec = mxq.QuantSpec(format="fp8_block", colwise=True, scale_layout="gemm")
    ends = torch.tensor([100, 256])
    with pytest.raises(ValueError, match="'group_offsets' with format='fp8_block' does not go with scale_layout='gemm'"):
        mxq.MXFP8Tensor.empty(spec, (256, 128), torch.bfloat16, "cpu", group_offsets=ends)
    with pytest.raises(ValueError, match="'group_offsets' does not go with scale_layout='gemm'"):
        mxq.quantize(torch.randn(256, 128), format="fp8_block", colwise=True, scale_layout="gemm", group_offsets=ends)
    grouped = mxq.MXFP8Tensor.empty(mxq.QuantSpec(format="fp8_block", colwise=True), (256, 128), torch.bfloat16, "cpu",
                                    group_offsets=ends)
    assert grouped.colwise_scale.shape == (256 // 128 + 2, 128)
    for fmt in ("nvfp4", "mxfp4"):
        for shape, colwise in (((3, 5), False), ((3, 4), True), ((), False), ((2, 3, 7), False)):
            with pytest.raises(ValueError, match="argument 'shape': .*packs two E2M1 elements per byte"):
                mxq.MXFP8Tensor.empty(mxq.QuantSpec(format=fmt, colwise=colwise), shape, torch.bfloat16, "cpu")
        t = mxq.MXFP8Tensor.empty(mxq.QuantSpec(format=fmt, colwise=True), (3, 2, 64), torch.bfloat16, "cpu")
        assert t.rowwise_data.shape == (3, 2, 32) and t.colwise_data.shape == (64, 3)


def test_copies_keep_every_format_s_fields():
    """deepcopy and copy of results of every format keep dtypes, strides of padded rows and bytes;
    plain pickle too where no field is float8 (torch's own pickle of float8 storages does not
    load back: README, Known limits), and its state stays the plain fields torch.save writes."""
    import copy
    import pickle

    x = torch.randn(64, 70)
    cases = [mxq.quantize(x, colwise=True, amax=True), mxq.quantize(x, fp8="e5m2"),
             mxq.quantize(x, format="fp8_block", colwise=True), mxq.quantize(x, format="nvfp4", colwise=True),
             mxq.quantize(x, format="mxfp4", colwise=True)]
    for t in cases:
        copies = [copy.deepcopy(t), copy.copy(t)]
        if t.format == "mxfp4":
            copies.append(pickle.loads(pickle.dumps(t)))
        for u in copies:
            for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax"):
                a, b = getattr(t, f), getattr(u, f)
                assert (a is None) == (b is None), f
                if a is not None:
                    assert (b.dtype, b.shape, b.stride()) == (a.dtype, a.shape, a.stride()), (t.format, f)
            assert compare(u, t, exact=True) == []
        assert all(v is getattr(t, k) for k, v in t.__getstate__().items())  # (what older versions load)


@pytest.mark.parametrize("fmt, field, dtype", [
    ("mxfp8", "rowwise_data", torch.uint8), ("mxfp8", "rowwise_scale", torch.float8_e8m0fnu),
    ("fp8_block", "rowwise_scale", torch.int32), ("nvfp4", "rowwise_scale", torch.uint8),
    ("mxfp4", "rowwise_scale", torch.float8_e8m0fnu), ("mxfp4", "rowwise_data", torch.int8)])
def test_fields_of_another_dtype_are_refused_by_name(fmt, field, dtype):
    """A field holding its bytes as another dtype (e.g. float8 viewed as uint8 to cross gloo) is
    refused by name, with the dtype to view it back as: dequantize() decoded the bytes as values."""
    import dataclasses

    t = mxq.quantize(torch.randn(64, 64), format=fmt)
    bad = dataclasses.replace(t, **{field: getattr(t, field).view(dtype)})
    want = getattr(t, field).dtype
    for decode in (bad.dequantize, bad.compact_scale) if field.endswith("scale") else (bad.dequantize,):
        with pytest.raises(ValueError, match=f"{field} must be {want}.*view\\({want}\\)"):
            decode()


def test_fp8_data_of_another_fp8_than_its_description_is_named():
    """FP8 data of the other FP8 type than ``fp8`` says: the description disagrees (viewing the
    bytes as ``fp8``'s type would decode other values)."""
    import dataclasses

    t = mxq.quantize(torch.randn(64, 64), fp8="e5m2")
    with pytest.raises(ValueError, match="holds torch.float8_e5m2, but its fp8='e4m3' says"):
        dataclasses.replace(t, fp8="e4m3").dequantize()


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8_block", "nvfp4", "mxfp4"])
def test_a_missing_direction_is_named_before_the_grouped_advice(fmt):
    """compact_scale("colwise") of a grouped rowwise-only tensor says it has no colwise scales,
    not to use group(g).compact_scale(), which then said the same."""
    opts = dict(block=(1, 128)) if fmt == "fp8_block" else {}
    t = mxq.quantize(torch.randn(64, 128), format=fmt, group_offsets=torch.tensor([32, 64]), **opts)
    with pytest.raises(ValueError, match="has no colwise_scale"):
        t.compact_scale("colwise")


def test_empty_names_a_bad_device_or_zeroed():
    spec = mxq.QuantSpec()
    with pytest.raises(ValueError, match="argument 'device' must name a device"):
        mxq.MXFP8Tensor.empty(spec, (4, 64), torch.float32, "nope")
    with pytest.raises(TypeError, match="argument 'device' must be a torch.device"):
        mxq.MXFP8Tensor.empty(spec, (4, 64), torch.float32, ["cpu"])
    with pytest.raises(TypeError, match="argument 'zeroed' must be a bool"):
        mxq.MXFP8Tensor.empty(spec, (4, 64), torch.float32, "cpu", zeroed="no")


def test_repr_says_what_the_result_holds():
    """repr names the format's own options (no fp8 for FP4, whose element is E2M1), the scale
    mode, every field held (the Hadamard pair's colwise_amax too) and the group count."""
    t = mxq.quantize(torch.randn(64, 64), colwise=True, group_offsets=torch.tensor([32, 64]))
    assert repr(t) == ("MXFP8Tensor(shape=(64, 64), fp8='e4m3', scale_layout='compact', scale_mode='rceil', "
                       "has=['rowwise_data', 'colwise_data'], groups=2)")
    u = mxq.quantize(torch.randn(32, 64).bfloat16(), format="nvfp4", colwise=True, hadamard=True)
    assert repr(u) == ("MXFP8Tensor(shape=(32, 64), format='nvfp4', block=(1, 16), scale_layout='compact', "
                       "scale_mode='e4m3', has=['rowwise_data', 'colwise_data', 'amax', 'colwise_amax'])")


def test_label_names_a_bad_spec_or_group_ends():
    t = mxq.quantize(torch.randn(64, 64))
    with pytest.raises(TypeError, match="label\\(\\) argument 'spec' must be a QuantSpec"):
        t.label(None)
    with pytest.raises(TypeError, match="'group_offsets' must be a torch.Tensor"):
        t.label(mxq.QuantSpec(), group_offsets=[32, 64])
