"""mxq/runtime/call.py: one call as one value -- binding, the gated halves, the signature."""

import dataclasses

import pytest
import torch

import mxq
from mxq.frontend.epilogue import EpilogueError
from mxq.frontend.spec import QuantSpec
from mxq.runtime.call import KEYWORDS, Binder, Call, halves_call, has_dtensor
from mxq.tensor import MXFP8Tensor


def _axr(x, r, alpha: float = 1.0, beta: float = 2.0):
    return x * alpha + r * beta


def test_binder_orders_tensors_and_floats_by_parameter_kind():
    op = mxq.fused_quant()(_axr)
    bind = Binder(_axr, op.epilogue)
    x, r = torch.zeros(2, 32), torch.ones(2, 32)
    for args, kwargs in (((x, r), {}), ((x,), {"r": r}), ((), {"r": r, "x": x}), ((x, r, 1.0), {})):
        for traced in (False, True):
            call = bind(args, kwargs, traced=traced)
            assert call.tensors[0] is x and call.tensors[1] is r, (args, kwargs, traced)
            assert call.scalars == [1.0, 2.0]
            assert (call.act_input, call.noop, call.out, call.group_offsets) == (None, None, None, None)
    call = bind((x, r), {"beta": 0.5}, noop="n", group_offsets="g")
    assert call.scalars == [1.0, 0.5] and call.noop == "n" and call.group_offsets == "g"


def test_binder_errors_name_the_function_and_argument():
    op = mxq.fused_quant()(_axr)
    bind = Binder(_axr, op.epilogue)
    x = torch.zeros(2, 32)
    with pytest.raises(TypeError, match=r"mxq: _axr\(\): missing a required argument: 'r'"):
        bind((x,), {})
    with pytest.raises(TypeError, match=r"mxq: _axr\(\) missing argument 'r'"):
        bind((x,), {}, traced=True)
    with pytest.raises(TypeError, match=r"mxq: _axr\(\) got an unexpected or repeated argument 'x'"):
        bind((x,), {"x": x}, traced=True)
    with pytest.raises(TypeError, match=r"mxq: _axr\(\) takes 4 arguments, got 5"):
        bind((x, x, 1.0, 2.0, 3.0), {}, traced=True)


def _reserved(x, noop):
    return x * noop


def test_call_keywords_are_reserved_parameter_names():
    assert KEYWORDS == ("act_input", "noop", "out", "group_offsets")
    with pytest.raises(EpilogueError, match=r"parameter name\(s\) \['noop'\] are reserved for the call"):
        mxq.fused_quant()(_reserved)


def test_call_is_an_immutable_value_and_replace_derives_one():
    x = torch.zeros(4, 32)
    call = Call([x], [])
    with pytest.raises(AttributeError):
        call.noop = torch.ones(1)
    other = call._replace(noop=torch.ones(1))
    assert call.noop is None and other.noop is not None and other.tensors is call.tensors


def test_key_follows_layout_not_values():
    """Call.key: what a call's checks depend on apart from values (FusedOp._plans keeps a
    checked call's route under it), so every layout fact the checks read changes it."""
    a, b = torch.zeros(4, 32), torch.ones(4, 32)
    assert Call([a], [1.0]).key() == Call([b], [3.0]).key()
    assert Call([a], [1.0]).key() != Call([a.t()], [1.0]).key()  # strides
    assert Call([a], []).key() != Call([a.t().contiguous()], []).key()  # shape
    assert Call([a], []).key() != Call([a.half()], []).key()  # dtype
    assert Call([a], []).key() != Call([a.to("meta")], []).key()  # device
    assert Call([a], []).key() != Call([torch.nn.Parameter(a, requires_grad=False)], []).key()  # class
    assert Call([a], []).key() != Call([a.clone().requires_grad_()], []).key()
    with torch.no_grad():
        off = Call([a], []).key()
    assert off != Call([a], []).key()  # grad mode
    assert Call([a], [1.0]).key() != Call([a], [1]).key()  # a float's type
    assert Call([a], []).key() != Call([a], [], noop=torch.zeros(1)).key()
    assert Call([a], []).key() != Call([a], [], act_input=b).key()
    assert Call([a], []).key() != Call([a], [], group_offsets=torch.tensor([4])).key()
    assert Call([a], []).key() != Call([a], [1.0]).key()
    assert Call([a], [], out=object()).key() is None  # (not an MXFP8Tensor: checked every time)
    dense = torch.zeros(1, 1).expand(4, 32)
    assert Call([dense], []).key() != Call([a.to_sparse()], []).key()  # (a sparse tensor's strides read (0, 0))


def _fields_of(t):
    return [(f.shape, f.stride(), f.dtype) for f in (t.rowwise_data, t.colwise_data, t.rowwise_scale,
                                                     t.colwise_scale, t.amax) if f is not None]


def test_key_follows_out_layout():
    spec = QuantSpec(rowwise=True, colwise=True)
    one, two = (MXFP8Tensor.empty(spec, (64, 32), torch.float32, "cpu") for _ in range(2))
    assert Call([b := torch.zeros(64, 32)], [], out=one).key() == Call([b], [], out=two).key()
    padded = MXFP8Tensor.empty(spec, (64, 32), torch.float32, "cpu", row_align=64)
    assert Call([b], [], out=one).key() != Call([b], [], out=padded).key()  # a field's strides
    e5 = MXFP8Tensor.empty(QuantSpec(rowwise=True, colwise=True, fp8="e5m2"), (64, 32), torch.float32, "cpu")
    assert Call([b], [], out=one).key() != Call([b], [], out=e5).key()
    assert Call([b], [], out=one).key() != Call([b], []).key()
    # an out of another format or block whose tensors are laid out alike (FP8 block scaling's 1x128 and
    # 128x128 scales of one row: [1, 2] fp32 both): check_out refuses it, so a kept route must not take it
    x = torch.zeros(1, 256)
    outs = [MXFP8Tensor.empty(QuantSpec(format="fp8_block", block=block), (1, 256), torch.float32, "cpu")
            for block in ((1, 128), (128, 128))]
    assert [(t.rowwise_scale.shape, t.rowwise_scale.dtype) for t in outs] == [((1, 2), torch.float32)] * 2
    assert Call([x], [], out=outs[0]).key() != Call([x], [], out=outs[1]).key()
    # an out of another shape whose tensors are laid out alike (FP4's colwise copy reads only M and N)
    fp4 = QuantSpec(format="nvfp4", rowwise=False, colwise=True)
    flat, tall = (MXFP8Tensor.empty(fp4, s, torch.float32, "cpu") for s in ((32, 48), (4, 8, 48)))
    assert [_fields_of(flat)] == [_fields_of(tall)]
    x3 = torch.zeros(4, 8, 48)
    assert Call([x3], [], out=flat).key() != Call([x3], [], out=tall).key()
    # rowwise data of one layout 8 bytes off 16 (the transposed copy's kernel writes aligned rows only,
    # limits.fp8_block_unserved): another key; 16 bytes off: the same
    buf = torch.zeros(64 * 32 + 32, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for off, same in ((8, False), (16, True)):
        moved = MXFP8Tensor.empty(spec, (64, 32), torch.float32, "cpu")
        moved.rowwise_data = buf[off:off + 64 * 32].view(64, 32)
        assert (Call([b], [], out=one).key() == Call([b], [], out=moved).key()) is same, off


def test_has_dtensor_looks_at_inputs_act_input_and_offsets_by_type_name():
    class DTensor(torch.Tensor):  # (a stand-in: the check goes by the type's name, not by import)
        pass

    d = torch.zeros(4, 32).as_subclass(DTensor)
    plain = torch.zeros(4, 32)
    assert not has_dtensor(Call([plain], []))
    assert has_dtensor(Call([plain, d], []))
    assert has_dtensor(Call([plain], [], act_input=d))
    assert has_dtensor(Call([plain], [], group_offsets=d))
    assert not has_dtensor(Call([plain], [], noop=d))  # (noop is moved to the local shard, not routed)


def _ident(x):
    return x


def test_halves_call_of_a_gated_forward_splits_every_tensor():
    op = mxq.fused_quant(act="swiglu")(_ident)
    x = torch.arange(2 * 64, dtype=torch.float32).reshape(2, 64)
    inner = halves_call(op.spec, op.epilogue, Call([x], [], noop="n"))
    assert torch.equal(inner.tensors[0], x[:, :32]) and torch.equal(inner.tensors[1], x[:, 32:])
    assert inner.noop == "n" and inner.act_input is None and inner.scalars == []
    with pytest.raises(ValueError, match="only used by ops with dact"):
        halves_call(op.spec, op.epilogue, Call([x], [], act_input=x))
    with pytest.raises(ValueError, match="must be even"):
        halves_call(op.spec, op.epilogue, Call([x[:, :63]], []))


def test_halves_call_of_a_gated_backward_appends_act_inputs_halves_and_the_half_flag():
    op = mxq.fused_quant(dact="geglu")(_ident)
    d, a = torch.zeros(2, 32), torch.arange(2 * 64, dtype=torch.float32).reshape(2, 64)
    inner = halves_call(op.spec, op.epilogue, Call([d], [], act_input=a))
    assert inner.tensors[0] is d and torch.equal(inner.tensors[1], a[:, :32]) and torch.equal(inner.tensors[2], a[:, 32:])
    assert inner.scalars == [0.0] and inner.act_input is None
    with pytest.raises(ValueError, match="'act_input' is required"):
        halves_call(op.spec, op.epilogue, Call([d], []))
    with pytest.raises(ValueError, match=r"'act_input' of a dact='geglu' op is the forward's input"):
        halves_call(op.spec, op.epilogue, Call([d], [], act_input=d))


def _ident(x):
    return x


def test_a_gated_backwards_act_input_is_named_as_the_caller_passed_it():
    """act_input's halves become the inner op's _mxq_gate and _mxq_up: a wrong dtype or device is
    named 'act_input' before the split (it was reported as '_mxq_gate')."""
    import pytest
    import torch

    import mxq

    op = mxq.fused_quant(dact="swiglu")(_ident)
    g = torch.randn(64, 64)
    for a, kind in ((torch.randn(64, 128, dtype=torch.float16), TypeError),
                    (torch.randn(64, 128).to(torch.int32), TypeError),
                    (torch.randn(64, 128, device="meta"), ValueError)):
        with pytest.raises(kind, match="argument 'act_input'") as err:
            op(g, act_input=a)
        assert "_mxq_" not in str(err.value)


def test_a_kept_route_does_not_outlive_an_in_place_change():
    """FusedOp._plans keeps a checked call's route under Call.key: a later call whose tensors were
    changed in place (the same objects resized, re-strided, their .data swapped for another dtype)
    has another key and is checked again (here: refused by name, or run by the CPU reference),
    by the op and by mxq.quantize alike."""
    from mxq.op import _quantize_op

    spec = QuantSpec(rowwise=True, colwise=True)
    for op, call in ((mxq.fused_quant(rowwise=True, colwise=True)(_ident), lambda x, out: op(x, out=out)),
                     (_quantize_op(spec), lambda x, out: mxq.quantize(x, colwise=True, out=out))):
        x = torch.randn(64, 32)
        out = MXFP8Tensor.empty(spec, x.shape, x.dtype, "cpu")
        op._plans[Call([x], [], out=out).key()] = lambda c: "kept"
        try:
            assert call(x, out) == "kept"
            out.rowwise_data.resize_(32, 32)
            with pytest.raises(ValueError, match="out.rowwise_data"):
                call(x, out)
            out.rowwise_data.resize_(64, 32)
            assert call(x, out) == "kept"
            out.colwise_data.data = torch.zeros(64, 32, dtype=torch.float8_e5m2)
            with pytest.raises(ValueError, match="out.colwise_data"):
                call(x, out)
            out.colwise_data.data = torch.zeros(64, 32, dtype=torch.float8_e4m3fn)
            assert call(x, out) == "kept"
            x.as_strided_((64, 32), (1, 64))  # (the same elements, column-major)
            assert isinstance(call(x, out), MXFP8Tensor)  # (checked: the reference, into out)
            x.resize_(32, 64)
            with pytest.raises(ValueError, match="'out' holds outputs of shape"):  # (out is for [64, 32])
                call(x, out)
        finally:
            op._plans.clear()


def _ident(x):
    return x


def test_bind_names_in_one_step_binds_as_the_loop():
    """Binder._bind_names' one step (a keyword call naming exactly the parameters after the
    positional ones) binds as the loop torch.compile traces, and every other call takes the loop,
    which names what is wrong."""
    bind = Binder(_axr, mxq.fused_quant()(_axr).epilogue)
    x, r = torch.zeros(2, 32), torch.ones(2, 32)
    for args, kwargs in (((x,), dict(r=r, alpha=0.5, beta=3.0)), ((x, r), dict(beta=3.0, alpha=0.5)),
                         ((), dict(beta=3.0, x=x, alpha=0.5, r=r)), ((x, r, 0.5), dict(beta=3.0)),
                         ((x,), dict(r=r)), ((x, r, 0.5, 3.0), {})):
        fast, loop = bind._bind_names(args, kwargs), bind._bind_names(args, kwargs, eager=False)
        assert len(fast) == len(loop) == 4 and all(a is b for a, b in zip(fast, loop)), (args, kwargs)
    for args, kwargs, match in (((x, r), dict(r=r, alpha=0.5), "repeated argument 'r'"),
                                ((x,), dict(r=r, alpha=0.5, gamma=1.0), "unexpected or repeated argument 'gamma'"),
                                ((x, r, 0.5), dict(gamma=1.0), "unexpected or repeated argument 'gamma'"),
                                ((), dict(r=r), "missing argument 'x'")):
        for eager in (True, False):
            with pytest.raises(TypeError, match=match):
                bind._bind_names(args, kwargs, eager)


def test_key_holds_the_inputs_alignment_for_ops_that_need_it():
    """Ops whose kernels serve 16-byte aligned inputs alone (FP4, FP8 block scaling: its transposed
    copy, fp32 colwise and grouped calls; limits.fp4_unserved, fp8_block_unserved) keep a route
    per alignment too: a checked
    call's route (the kernels) must not serve a later call of the same layout whose inputs are
    not aligned (the reference does); other ops keep one route per layout."""
    flat = torch.zeros(2 * 64 + 8, dtype=torch.bfloat16)
    aligned, shifted = flat[:128].view(2, 64), flat[4:132].view(2, 64)  # (8 bytes apart: same layout)
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 8
    a, b = Call([aligned], []), Call([shifted], [])
    assert a.key() == b.key() and a.key(True) != b.key(True) and a.key(True) == Call([aligned.clone()], []).key(True)

    def ident(x):
        return x

    needs = {(fmt, tuple(sorted(o.items()))): mxq.fused_quant(format=fmt, **o)(ident)._key_aligned
             for fmt, o in (("mxfp8", {}), ("mxfp8", dict(colwise=True)), ("fp8_block", dict(colwise=True)),
                            ("fp8_block", dict(colwise=True, scale_layout="gemm")), ("nvfp4", {}), ("mxfp4", {}))}
    assert [v for v in needs.values()] == [False, False, True, True, True, True]
    gated = mxq.fused_quant(format="fp8_block", dact="swiglu", colwise=True, scale_layout="gemm")(ident)
    assert gated._key_aligned

    class Out(MXFP8Tensor):  # (an out= of a subclass: no key, so checked every time, aligned or not)
        pass

    spec = QuantSpec(format="nvfp4", colwise=True)
    sub = Out(**{f.name: getattr(MXFP8Tensor.empty(spec, (16, 64), torch.bfloat16, "cpu"), f.name)
                 for f in dataclasses.fields(MXFP8Tensor)})
    assert Call([aligned], [], out=sub).key() is None and Call([aligned], [], out=sub).key(True) is None
    # (an out='s colwise data 16-byte aligned or not: FP4's kernels write aligned copies alone)
    out = MXFP8Tensor.empty(spec, (16, 64), torch.bfloat16, "cpu")
    key = Call([aligned], [], out=out).key()
    buf = torch.zeros(64 * 8 + 16, dtype=torch.uint8)
    out.colwise_data = buf[1:1 + 64 * 8].view(64, 8)
    assert Call([aligned], [], out=out).key() != key
