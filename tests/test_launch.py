"""mxq/runtime/launch.py on the CPU: which compiled variant a call's tensors get (variant_for). The GPU
side (each variant's bytes against the reference): tests/test_gpu.py."""

import torch

from mxq.frontend.spec import QuantSpec
from mxq.runtime.launch import variant_for
from mxq.tensor import MXFP8Tensor


def _at(nbytes_off: int, shape, dtype, row_stride=None):
    """A tensor of ``shape`` whose data starts ``nbytes_off`` bytes past a 64-byte boundary, rows
    ``row_stride`` elements apart (default: contiguous)."""
    m, n = shape
    rs = row_stride or n
    es = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 1
    buf = torch.zeros(m * rs * es + 256, dtype=torch.uint8)
    skip = (-buf.data_ptr()) % 64 + nbytes_off
    return buf[skip:skip + (m - 1) * rs * es + n * es].view(dtype).as_strided((m, n), (rs, 1))


def _u8(nbytes_off, shape, row_stride=None):
    return _at(nbytes_off, shape, torch.uint8, row_stride)


def test_variant_by_hand():
    """vec: N % 8 == 0 and every [M, N] tensor 16-byte aligned with rows 8 elements apart; rows8:
    ungrouped, every FP8 data's start and row stride multiples of 8 bytes (any input dtype; a
    two-halves op also N % 8 == 0); generic: the rest."""
    bf, m = torch.bfloat16, 4
    x64, x62 = _at(0, (m, 64), bf), _at(0, (m, 62), bf)
    full = ("full",)
    # aligned everything: vec (grouped: its twin)
    assert variant_for(64, 64, [x64], full, (_u8(0, (m, 64)), None), False) == "vec"
    assert variant_for(64, 64, [x64], full, (_u8(0, (m, 64)), None), True) == "vec_grouped"
    # N % 8 != 0, contiguous FP8 rows 62 bytes apart: generic
    assert variant_for(62, 62, [x62], full, (_u8(0, (m, 62)), None), False) == "generic"
    # ... rows padded to 64 bytes: rows8, but only when every written direction is padded
    pad = _u8(0, (m, 62), 64)
    assert variant_for(62, 62, [x62], full, (pad, pad), False) == "rows8"
    assert variant_for(62, 62, [x62], full, (pad, _u8(0, (m, 62))), False) == "generic"
    assert variant_for(62, 62, [x62], full, (None, pad), False) == "rows8"
    # rows 8 bytes apart but the data starting 4 bytes past a unit: generic
    assert variant_for(62, 62, [x62], full, (_u8(4, (m, 62), 64), None), False) == "generic"
    # rows 68 bytes apart (4 mod 8): generic
    assert variant_for(62, 62, [x62], full, (_u8(0, (m, 62), 68), None), False) == "generic"
    # fp32 inputs like 16-bit ones (their rows8 kernel: KernelConfig.vec_unaligned); grouped calls have none
    x32 = _at(0, (m, 62), torch.float32)
    assert variant_for(62, 62, [x32], full, (pad, None), False) == "rows8"
    assert variant_for(62, 62, [x62], full, (pad, None), True) == "generic_grouped"
    # N % 8 == 0 with a misaligned input: the outputs are whole units, so rows8
    xoff = _at(2, (m, 64), bf)
    assert variant_for(64, 64, [xoff], full, (_u8(0, (m, 64)), None), False) == "rows8"
    # a two-halves op writes half 1 from column n: n % 8 == 0 too
    p2 = _u8(0, (m, 124), 128)
    assert variant_for(62, 124, [x62], full, (p2, None), False) == "generic"
    p3 = _u8(0, (m, 128), 128)
    assert variant_for(64, 128, [xoff], full, (p3, None), False) == "rows8"
    # one row: its stride does not matter (csrc/dispatch.cc agrees), only where it starts
    x1 = _at(0, (1, 62), bf)
    assert variant_for(62, 62, [x1], full, (_u8(0, (1, 62)), None), False) == "rows8"
    assert variant_for(62, 62, [x1], full, (_u8(0, (1, 62), 70), None), False) == "rows8"
    assert variant_for(62, 62, [x1], full, (_u8(4, (1, 62)), None), False) == "generic"
    assert variant_for(64, 64, [_at(0, (1, 64), bf)], full, (_u8(0, (1, 64), 68), None), False) == "vec"


def test_variant_rules_one_clause_at_a_time():
    """Each clause of variant_for on its own, so that dropping or loosening one fails a case."""
    bf, m = torch.bfloat16, 4
    x60, x62, x64 = _at(0, (m, 60), bf), _at(0, (m, 62), bf), _at(0, (m, 64), bf)
    full = ("full",)
    # rows8 needs rows a multiple of 8 bytes apart, not 16
    assert variant_for(62, 62, [x62], full, (_u8(0, (m, 62), 72), None), False) == "rows8"
    # two halves: the rule is on n (half 1 starts at column n), not on n_out: n = 60, n_out = 120
    assert variant_for(60, 120, [x60], full, (_u8(0, (m, 120), 128), None), False) == "generic"
    # vec needs the FP8 data's rows 8 elements apart ...
    assert variant_for(64, 64, [x64], full, (_u8(0, (m, 64), 68), None), False) == "generic"
    # ... and its start 16-byte aligned (8 bytes is rows8's)
    assert variant_for(64, 64, [x64], full, (_u8(8, (m, 64)), None), False) == "rows8"
    # a strided input (a view) whose rows are not 8 elements apart: rows8, not vec
    xs = _at(0, (m, 64), bf, row_stride=132)
    assert variant_for(64, 64, [xs], ("strided",), (_u8(0, (m, 64)), None), False) == "rows8"
    assert variant_for(64, 64, [_at(0, (m, 64), bf, row_stride=136)], ("strided",), (_u8(0, (m, 64)), None),
                       False) == "vec"


def test_destination_passing_route_hands_the_dispatcher_every_slot():
    """Launcher._dispatch_into (the native destination-passing route of a kept plan): the
    dispatcher gets the call's tensors, floats, act_input, the seven output slots and noop, for a
    Call with every field (a new field once broke the unpacking here on CUDA only). CPU tensors
    and a recording dispatcher stand in for the native one."""
    import mxq
    from mxq.runtime.call import Call
    from mxq.runtime.launch import Launcher

    def scaled(x, r, alpha: float = 1.0):
        return x * alpha + r

    op = mxq.fused_quant(colwise=True, amax=True)(scaled)
    launcher = Launcher(op, "sm_90", "bf16", None)
    seen = []
    launcher.dispatch = lambda *args: seen.append(args)
    x, r = torch.randn(64, 32), torch.randn(64, 32)
    noop = torch.zeros(1)
    out = launcher._dispatch_into(Call([x, r], [0.5], None, noop, None, None))
    (args,) = seen
    assert args[0] is x and args[1] is r and args[2] == 0.5 and args[3] is None and args[-1] is noop
    slots = (out.rowwise_data, out.rowwise_scale, out.colwise_data, out.colwise_scale, out.amax, out.dbias)
    assert len(args) == 4 + len(slots) + 1 and all(a is b for a, b in zip(args[4:-1], slots))
    assert not out.rowwise_data.view(torch.uint8).any()  # (a noop call without out: zeroed outputs)


def test_destination_passing_route_hands_the_dispatcher_group_ends():
    """A grouped call on the destination-passing route: the int32 group ends go last to the
    dispatcher (csrc/dispatch.cc launches the grouped kernels itself), fresh outputs are the
    grouped buffers, and a given ``out`` records a copy of the ends once the dispatcher took the
    call (and keeps its old ones when the dispatcher refuses it). A recording stand-in."""
    import pytest

    import mxq
    from mxq.runtime.call import Call
    from mxq.runtime.launch import Launcher, native_groups

    op = mxq.fused_quant(rowwise=True, colwise=True, dbias=True, dact="relu")(_ident)
    launcher = Launcher(op, "sm_90", "bf16", None)
    seen = []
    launcher.dispatch = lambda *args: seen.append(args)
    x, a, ends = torch.randn(64, 32), torch.randn(64, 32), torch.tensor([0, 40, 64], dtype=torch.int32)
    fresh = launcher._dispatch_into(Call([x], [], a, None, None, ends))
    assert seen[0][-1] is ends and len(seen[0]) == 1 + 1 + 6 + 1 + 1
    assert fresh.colwise_scale.shape == (64 // 32 + 3, 32) and fresh.dbias.shape == (3, 32)
    given = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", group_offsets=ends)
    before = given.group_offsets
    later = torch.tensor([10, 20, 64], dtype=torch.int32)
    assert launcher._dispatch_into(Call([x], [], a, None, given, later)) is given
    assert given.group_offsets.tolist() == later.tolist() and given.group_offsets is not later
    assert given.group_offsets is not before

    def refuse(*args):
        raise ValueError("mxq: argument 'colwise_scale' ...")

    launcher.dispatch = refuse
    kept = given.group_offsets
    with pytest.raises(ValueError):
        launcher._dispatch_into(Call([x], [], a, None, given, ends))
    assert given.group_offsets is kept
    assert native_groups(op.spec, ends) and not native_groups(op.spec, ends.long())
    assert not native_groups(mxq.QuantSpec(colwise=True, scale_layout="swizzled"), ends)


def _ident(x):
    return x


def test_clear_padding_zeroes_the_scales_the_grouped_kernels_leave():
    """launch._clear_padding before a grouped launch into a reused out=: the swizzled buffers
    (both directions) and FP4's colwise [N, M // B + G] buffer (the kernels write only the
    groups' blocks there), nothing else (compact MXFP8, FP4's rowwise scales); a noop of 1.0
    keeps everything (a multiply, no host sync)."""
    from mxq.runtime.launch import _clear_padding

    offs = torch.tensor([4, 10], dtype=torch.int32)
    cases = [(QuantSpec(format="nvfp4", colwise=True), (False, True)),
             (QuantSpec(format="mxfp4", colwise=True), (False, True)),
             (QuantSpec(colwise=True, scale_layout="swizzled"), (True, True)),
             (QuantSpec(colwise=True), (False, False))]
    for spec, cleared in cases:
        for noop, keep in ((None, False), (torch.zeros(1), False), (torch.ones(1), True)):
            out = MXFP8Tensor.empty(spec, (10, 64), torch.bfloat16, "cpu", group_offsets=offs)
            for f in ("rowwise_scale", "colwise_scale"):
                getattr(out, f).view(torch.uint8).fill_(0x7E)
            _clear_padding(spec, out, noop)
            for f, c in zip(("rowwise_scale", "colwise_scale"), cleared):
                got = getattr(out, f).view(torch.uint8)
                assert bool((got == (0 if c and not keep else 0x7E)).all()), (spec.format, f, noop)


# noop and prepare() in the other formats (the GPU side: tests/test_gpu.py::test_noop_and_prepare_in_every_format)
NOOP_CASES = [("mxfp4", dict(colwise=True)), ("nvfp4", dict(colwise=True)), ("nvfp4", dict(colwise=True, block_2d=True)),
              ("fp8_block", dict(colwise=True, scale_layout="gemm")), ("fp8_block", dict(block=(128, 128), colwise=True))]


def _relu(x):
    return x


def check_noop(fmt, opts, dtype, device):
    """An ``out=`` call with noop 1.0 writes none of its fields (every byte the poison's, NVFP4's
    amax pass included); with noop 0.0 the reference's bytes (relu: the exact class)."""
    import mxq
    from mxq.testing import compare, planted, poisoned, same_bytes

    op = mxq.fused_quant(format=fmt, act="relu", **opts)(_relu)
    x = planted(96, 256, dtype, seed=1).to(device)
    out = poisoned(op, x)
    fields = [f for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax")
              if getattr(out, f) is not None]
    before = {f: getattr(out, f).clone() for f in fields}
    op(x, out=out, noop=torch.ones(1, device=device))
    for f in fields:
        assert same_bytes(getattr(out, f).cpu(), before[f].cpu()), (fmt, f)
    op(x, out=out, noop=torch.zeros(1, device=device))
    assert compare(out, op.reference(x.cpu()), True) == [], fmt


def test_noop_in_every_format_on_the_reference():
    """check_noop on CPU (the reference path honours noop as the kernels do)."""
    for fmt, opts in NOOP_CASES:
        for dtype in (torch.bfloat16, torch.float32):
            check_noop(fmt, opts, dtype, "cpu")



def _ident_for_empty(x):
    return x


def test_an_empty_call_zeroes_its_dbias_and_amax_on_every_route():
    """A call on an empty input writes the reference's zeros into the dbias and amax its op owns
    (a reused out= held other values): eager (Launcher.run), prepared (each launch), and
    not where noop holds 1 (chosen on the device: no host read). The binding of an empty call
    compiles nothing, so this runs on CPU tensors."""
    import mxq
    from mxq.runtime.call import Call
    from mxq.runtime.launch import Launcher

    op = mxq.fused_quant(colwise=True, dbias=True, amax=True)(_ident_for_empty)
    x = torch.zeros(0, 128, dtype=torch.bfloat16)
    launcher = Launcher(op, "sm_90", "bf16", None)

    def stale():
        out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
        out.dbias.fill_(7.0)
        out.amax.fill_(5.0)
        return out

    want = op.reference(x)
    assert float(want.amax) == 0.0 and not bool(want.dbias.any())
    got = launcher.run(Call([x], [], None, None, stale(), None, None), None)
    assert float(got.amax) == 0.0 and not bool(got.dbias.any())
    launch, got = launcher.prepare(Call([x], [], None, None, stale(), None, None), None)
    launch()
    assert float(got.amax) == 0.0 and not bool(got.dbias.any())
    for held, zeroed in ((1.0, False), (0.0, True)):
        noop = torch.tensor([held])
        launch, got = launcher.prepare(Call([x], [], None, noop, stale(), None, None), None)
        launch()
        assert (float(got.amax) == 0.0) == zeroed and (not bool(got.dbias.any())) == zeroed


def test_prepare_leaves_a_grouped_out_to_its_launches(monkeypatch):
    """op.prepare's binding of a grouped call into a given ``out`` writes nothing into it: the
    swizzled scales' padding is cleared and the ends relabelled at every launch, under that
    launch's noop (a noop that turns 1 before the first launch keeps out's scales and ends).
    A native function that writes nothing stands in for the kernel (CPU tensors)."""
    import mxq
    from mxq.runtime import launch
    from mxq.runtime.call import Call
    from mxq.runtime.launch import Launcher

    op = mxq.fused_quant(colwise=True, scale_layout="swizzled")(_ident)
    monkeypatch.setattr(launch, "native_function", lambda *a, **k: (lambda *args: None))
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    old, new = torch.tensor([16, 64], dtype=torch.int32), torch.tensor([48, 64], dtype=torch.int32)
    out = op(x, group_offsets=old)
    scales = out.colwise_scale.clone()
    assert scales.view(torch.uint8).any()
    noop = torch.zeros(1)
    run, got = Launcher(op, "sm_90", "bf16", None).prepare(Call([x], [], None, noop, out, new), None)
    assert got is out and out.group_offsets.tolist() == [16, 64] and torch.equal(out.colwise_scale, scales)
    noop.fill_(1.0)
    run()  # (nothing written)
    assert out.group_offsets.tolist() == [16, 64] and torch.equal(out.colwise_scale, scales)
    noop.fill_(0.0)
    run()  # (written: the new ends, the padding cleared for the kernel to fill)
    assert out.group_offsets.tolist() == [48, 64] and not out.colwise_scale.view(torch.uint8).any()
