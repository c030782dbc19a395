"""Operand layouts (mxq/runtime/operands.py): broadcast operands and strided views, on CPU -- the
reference's semantics against hand-made expectations, validation, the binding and the compiled
kernels' loads. GPU side: tests/test_gpu.py::test_broadcast_and_strided_operands_match_reference."""

import re

import pytest
import torch

import mxq
from mxq.runtime import inspection, operands, targets
from mxq.runtime.call import Call

from . import oracle


def _add(x, b):
    return x + b


def _mul_add(x, s, b):
    return x * s + b


@pytest.mark.parametrize("full, shape, kind", [
    ((8, 64), (8, 64), "full"), ((8, 64), (64,), "row"), ((8, 64), (1, 64), "row"), ((8, 64), (8, 1), "col"),
    ((8, 64), (), "scalar"), ((8, 64), (1,), "scalar"), ((8, 64), (1, 1), "scalar"), ((2, 4, 64), (64,), "row"),
    ((2, 4, 64), (1, 1, 64), "row"), ((2, 4, 64), (2, 4, 1), "col"), ((2, 4, 64), (8, 64), None),
    ((8, 64), (64, 1), None), ((8, 64), (8,), None), ((8, 64), (2, 64), None), ((1, 64), (1, 64), "full")])
def test_kinds_by_hand(full, shape, kind):
    m = 1
    for d in full[:-1]:
        m *= d
    assert operands.kind_of(torch.Size(shape), m, full[-1], torch.Size(full)) == kind


def _oracle_add_rows(x, b):
    """Rowwise e4m3/rceil bytes of x + b (b broadcast by hand, fp32 adds), by tests/oracle.py."""
    rows = [[oracle.f32(x[i][j] + b[i][j]) for j in range(len(x[0]))] for i in range(len(x))]
    return oracle.quantize_rows(rows, "e4m3", "rceil")


@pytest.mark.parametrize("bshape", [(70,), (1, 70), (33, 1), (), (1,), (1, 1)])
def test_broadcast_operand_bytes_match_the_oracle(bshape):
    g = torch.Generator().manual_seed(len(bshape) * 7 + sum(bshape))
    x = torch.randn(33, 70, generator=g) * 4
    b = torch.randn(bshape, generator=g) * 4
    t = mxq.fused_quant()(_add)(x, b)
    full = b.reshape(-1)
    bb = [[float(full[j] if bshape in ((70,), (1, 70)) else full[i] if bshape == (33, 1) else full[0])
           for j in range(70)] for i in range(33)]
    data, scales = _oracle_add_rows(x.tolist(), bb)
    assert torch.equal(t.rowwise_data.view(torch.uint8), torch.tensor(data, dtype=torch.uint8))
    assert torch.equal(t.rowwise_scale, torch.tensor(scales, dtype=torch.uint8))


def test_broadcast_equals_the_materialised_operand_in_every_direction():
    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True, dbias=True, act="gelu")(_mul_add)
    x = torch.randn(3, 40, 96, dtype=torch.bfloat16)
    s, b = torch.rand(3, 40, 1, dtype=torch.bfloat16) + 0.5, torch.randn(96, dtype=torch.bfloat16)
    got = op(x, s, b)
    want = op(x, s.expand_as(x).contiguous(), b.expand_as(x).contiguous())
    from mxq.testing import compare

    assert compare(got, want, exact=True) == []


def test_broadcast_shapes_that_do_not_fit_name_the_argument():
    op = mxq.fused_quant()(_add)
    with pytest.raises(ValueError, match=r"argument 'b' has shape \(8,\), which neither equals 'x'"):
        op(torch.randn(8, 64), torch.randn(8))
    with pytest.raises(ValueError, match="argument 'b'"):
        op(torch.randn(8, 64), torch.randn(2, 64))


def test_strided_views_and_copies():
    """x[:, :N] of a [M, 2N] tensor is a strided full operand (no copy); other non-contiguous
    inputs are copied with a warning, refused under MXQ_STRICT=1."""
    base = torch.randn(16, 128)
    kinds = mxq.runtime.validation.operand_layouts([base[:, :64], base[:, 64:]], None)[2]
    assert kinds == ("strided", "strided")
    ts, _, kinds = mxq.runtime.validation.operand_layouts([base[:, :64], base[:, ::2]], None)
    assert kinds == ("strided", "full") and ts[1].is_contiguous()
    op = mxq.fused_quant()(_add)
    assert torch.equal(op(base[:, :64], base[:, 64:]).rowwise_data.view(torch.uint8),
                       op(base[:, :64].contiguous(), base[:, 64:].contiguous()).rowwise_data.view(torch.uint8))


def test_binding_passes_broadcast_operands_as_stride_zero_views(monkeypatch, tmp_path):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(targets, "device_arch", lambda device: "sm_90")
    op = mxq.fused_quant(colwise=True)(_mul_add)
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    s, b = torch.rand(64, 1, dtype=torch.bfloat16), torch.randn(96, dtype=torch.bfloat16)
    tensors, act, kinds = mxq.runtime.validation.operand_layouts([x, s, b], None)
    assert kinds == ("full", "col", "row")
    fn, args, out = op._launcher_for(x).bind(Call(tensors, [], act), kinds)
    assert fn is not None
    assert args[0].stride() == (96, 1) and args[1].stride() == (1, 0) and args[2].stride() == (0, 1)
    assert args[1].data_ptr() == s.data_ptr() and args[2].data_ptr() == b.data_ptr()


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_a_row_operand_is_loaded_once_per_tile(arch):
    """The packed kernel stages x row by row (8 rows per thread) but a bias [N] once: 9 cp.async
    copies per thread instead of 16; a column operand takes element loads, not staged copies."""
    op = mxq.fused_quant(colwise=True, act="gelu")(_add)

    def body(kinds):
        ptx = inspection.ptx_of(op, arch, "bf16", "vec", kinds)
        start = ptx.index(".entry kernel_cutlass_packed_kernel")
        return ptx[start:]

    assert body(("full", "full")).count("cp.async.cg.shared.global") == 16
    assert body(("full", "row")).count("cp.async.cg.shared.global") == 9
    assert body(("strided", "row")).count("cp.async.cg.shared.global") == 9
    col = body(("full", "col"))
    assert col.count("cp.async.cg.shared.global") == 8 and re.search(r"ld\.global(\.nc)?\.b16", col)
    scalar = body(("full", "scalar"))
    assert scalar.count("cp.async.cg.shared.global") == 8


def _swiglu(g, u):
    return mxq.silu(g) * u


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_swiglu_over_half_views_compiles_for_the_fast_kernels(arch):
    """A gated activation written as an epilogue over the two strided halves of a [M, 2N]
    tensor compiles to the packed kernel with both operands staged, read in place. (On sm_90 the
    local ptxas reports a 4-byte spill at 80 registers: its speed is still to be measured.)"""
    op = mxq.fused_quant(rowwise=True, colwise=True)(_swiglu)
    art = inspection.compile_artifacts(op, arch, "bf16", "vec", ("strided", "strided"))
    body = art["ptx"][art["ptx"].index(".entry kernel_cutlass_packed_kernel"):]
    assert body.count("cp.async.cg.shared.global") == 16  # 8 rows x (gate, up)


# operand kinds in the other formats (the GPU side: tests/test_gpu.py::test_operands_in_other_formats_match_reference)
OPERAND_FORMATS = [("fp8_block", dict(colwise=True)), ("fp8_block", dict(block=(128, 128), colwise=True)),
                   ("mxfp4", dict(colwise=True)), ("nvfp4", dict(colwise=True))]
OPERAND_KINDS = [("col", "row"), ("scalar", "row"), ("full", "scalar"), ("col", "full")]


def operand_inputs(kinds, m: int, n: int, dtype):
    """x [m, n] and the two operands of ``_mul_add`` of ``kinds`` (full, row [n], col [m, 1],
    scalar), planted values."""
    from mxq.testing import planted

    def one(kind, seed):
        full = planted(m, n, dtype, seed=seed, specials=False)
        return {"full": full, "row": full[0], "col": full[:, :1].contiguous(), "scalar": full.reshape(-1)[:1].reshape(())}[kind]

    return planted(m, n, dtype, seed=m + n), one(kinds[0], 5), one(kinds[1], 6)


def test_operands_in_other_formats_are_served():
    """Every operand kind in FP8 block scaling, MXFP4 and NVFP4 is the kernels' (limits.unserved)
    for the calls the GPU test makes, and their reference runs."""
    from mxq.runtime import limits

    for fmt, opts in OPERAND_FORMATS:
        op = mxq.fused_quant(format=fmt, **opts)(_mul_add)
        for dtype in (torch.bfloat16, torch.float32):
            for kinds in OPERAND_KINDS:
                x, s, b = operand_inputs(kinds, 96, 512, dtype)
                assert limits.unserved(op.spec, op.epilogue, x, op._packed_smem_shortfall, Call([x, s, b], [])) is None
                assert op.reference(x, s, b).rowwise_data.shape[0] == 96

