"""FP8 block scaling on the kernels: 1x128 rowwise blocks (mxq/kernels/codec.py's fp32-scale
format, packed.PackedKernel.row_block_scales, vectorized.VectorizedKernel.row_scale) and colwise
128-row blocks (the packed kernel's 128-row tile, KernelConfig.tile_rows), compact or as the
GEMM-ready transposed copy (KernelConfig.transposed, packed.PackedKernel.store_transposed_rows),
with or without the tensor amax.

CPU: what the kernels serve (limits.fp8_block_unserved), the module renders, the kernels compile
for sm_90a and sm_100a with TransformerEngine's arithmetic in their PTX, and the GEMM-ready
scale offsets the kernels write through (codec.row_scale_offset over launch.flat_scale) land on
the logical scales. GPU (marked gpu): every dtype, fp8, scale mode, layout and variant against the
torch reference byte for byte, and a small case against tests/oracle_fp8_block.py.
"""

import dataclasses
import math
import re

import pytest
import torch

import mxq
from mxq.formats import fp8_block_layouts
from mxq.formats.format import Format
from mxq.frontend import codegen
from mxq.frontend.spec import QuantSpec
from mxq.kernels import codec
from mxq.kernels.vectorized import VectorizedKernel
from mxq.runtime import compiler, inspection, launch, limits
from mxq.testing import planted, poisoned, same_bytes

from . import oracle_fp8_block as oracle
from .checks import check_exact as _check

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FIELDS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias")


def ident(x):
    return x


def scaled_shift(x, b, s: float = 1.5):
    return x * s + b


# -- what is served ------------------------------------------------------------------------------
@pytest.mark.parametrize("opts, dtype, n, why", [
    (dict(colwise=True, scale_layout="gemm"), torch.bfloat16, 131, "transposed"),
    (dict(colwise=True, scale_layout="gemm"), torch.float32, 100, "transposed"),
    (dict(colwise=True), torch.float32, 131, "fp32"),  # (fp32 colwise blocks: aligned rows alone)
    (dict(block=(128, 128)), torch.float32, 100, "fp32"),  # (fp32 tiles: aligned rows alone)
    (dict(block=(128, 128), colwise=True, scale_layout="gemm"), torch.float32, 100, "transposed"),
    (dict(block=(128, 128), colwise=True, scale_layout="gemm"), torch.float16, 100, "transposed"),
])
def test_unserved_names_what_has_no_kernel(opts, dtype, n, why):
    spec = QuantSpec(format="fp8_block", **opts)
    reason = limits.unserved(spec, mxq.fused_quant(format="fp8_block", **opts)(ident).epilogue,
                             torch.zeros(4, n, dtype=dtype), lambda: None)
    assert "fp8_block" in reason and why in reason


GATED_BWD = [dict(rowwise=True, colwise=True, dbias=True), dict(rowwise=True, scale_layout="gemm", amax=True),
             dict(rowwise=False, colwise=True, amax=True, dbias=True), dict(block=(128, 128), colwise=True),
             dict(block=(128, 128), scale_layout="gemm"),
             # the transposed colwise copy (staged in KernelConfig.tr_parts column parts beside the two passes' inputs)
             dict(colwise=True, scale_layout="gemm"), dict(colwise=True, scale_layout="gemm", dbias=True),
             dict(rowwise=False, colwise=True, scale_layout="gemm", amax=True, dbias=True),
             dict(block=(128, 128), colwise=True, scale_layout="gemm")]
# grouped (compact layout: validation refuses group_offsets with scale_layout="gemm")
GATED_BWD_GROUPED = [dict(colwise=True, dbias=True), dict(rowwise=False, colwise=True, dbias=True, amax=True),
                     dict(block=(128, 128), colwise=True), dict(dbias=True)]


def _ids(o):
    return "-".join(f"{k}={v}" for k, v in o.items())


@pytest.mark.parametrize("opts", GATED_BWD, ids=_ids)
def test_gated_backward_is_served_where_no_block_straddles_the_halves(opts):
    """A gated backward (two output halves [M, 2N]) on the kernels from 16-bit inputs, the op's
    own shared-memory rule included: served at N = 256, and at N = 96 only without rowwise
    blocks or tiles (a 1x128 block or 128x128 tile would straddle the halves); the C++ routes
    serve it from 16-bit inputs and refuse fp32 (they cannot fall back to the reference)."""
    inner = mxq.fused_quant(format="fp8_block", dact="swiglu", **opts)(ident).inner
    spec, epi, smem = inner.spec, inner.epilogue, inner._packed_smem_shortfall
    for dtype in (torch.bfloat16, torch.float16):
        assert limits.unserved(spec, epi, torch.zeros(4, 256, dtype=dtype), smem) is None
    reason = limits.unserved(spec, epi, torch.zeros(4, 96, dtype=torch.float16), smem)
    assert (reason is None) == (opts.get("rowwise") is False), reason
    if reason is not None:
        assert "N % 128 == 0" in reason and "straddle" in reason
    assert limits.cpp_gap(spec, epi, "bf16") is None and "fp32" in limits.cpp_gap(spec, epi, "fp32")


@pytest.mark.parametrize("opts", GATED_BWD, ids=_ids)
def test_fp32_gated_backward_is_served_and_compiles(opts):
    """A gated backward from fp32 inputs on the vectorised kernel (both halves in the grid), from
    aligned rows alone, grouped too (compact), each row's three inputs loaded just before it on the
    128-row tile (VectorizedKernel.lazy_loads: at most 80 bytes of spills on sm_90, against
    0.7-2.8 KB with all rows' loads first); the unaligned rows and the C++ routes are named.
    GPU counterpart: test_gpu_fp32_gated_backward_matches_the_reference."""
    import re
    import shutil

    from mxq.runtime.call import Call

    inner = mxq.fused_quant(format="fp8_block", dact="swiglu", **opts)(ident).inner
    spec, epi, smem = inner.spec, inner.epilogue, inner._packed_smem_shortfall
    assert limits.unserved(spec, epi, torch.zeros(8, 256), smem) is None
    assert "N % 8 != 0" in limits.unserved(spec, epi, torch.zeros(8, 100), smem)
    assert "C++ routes" in limits.cpp_gap(spec, epi, "fp32", "vec")
    cfg = codegen.kernel_config(spec, epi)
    assert cfg.halves and VectorizedKernel(cfg, None).lazy_loads() == (cfg.tile_rows == 128)
    ptx = _ptx(inner, "sm_90a", "fp32")
    assert "div.rn.f32" in ptx and (".reqntid 512, 1, 1" in ptx) == (cfg.tile_rows == 128)
    if not cfg.transposed:
        grouped = Call([torch.zeros(8, 256)], [], group_offsets=torch.tensor([8], dtype=torch.int32))
        assert limits.unserved(spec, epi, torch.zeros(8, 256), smem, grouped) is None
        x3 = torch.zeros(2, 4, 256)  # (an out= of [.., 2N] rows: its colwise data viewed as [M, 2N])
        into = Call([x3], [], out=mxq.MXFP8Tensor.empty(spec, (2, 4, 512), torch.float32, "cpu"))
        assert limits.unserved(spec, epi, x3, smem, into) is None
        assert "div.rn.f32" in _ptx(inner, "sm_90a", "fp32", "vec_grouped")
    if shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _ptxas_output

        spills = [int(b) for b in re.findall(r"(\d+) bytes spill stores", _ptxas_output(ptx))]
        assert max(spills) <= 80, spills


@pytest.mark.parametrize("opts", GATED_BWD_GROUPED, ids=_ids)
def test_grouped_gated_backward_is_served_and_compiles(opts):
    """A grouped gated backward from 16-bit inputs on the grouped packed kernel (128-row group
    tiles, both halves per CTA): served, traced for bf16 and fp16, and assembled without spills."""
    import shutil

    from mxq.runtime.call import Call

    op = mxq.fused_quant(format="fp8_block", dact="swiglu", **opts)(ident)
    inner = op.inner
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.zeros(300, 256, dtype=dtype)
        call = Call([x], [], group_offsets=torch.tensor([0, 100, 300], dtype=torch.int32))
        assert limits.unserved(inner.spec, inner.epilogue, x, inner._packed_smem_shortfall, call) is None
    if opts.get("rowwise") is False:  # (colwise blocks alone: any N, unaligned rows on the unaligned grouped kernel)
        x = torch.zeros(300, 100, dtype=torch.bfloat16)
        call = Call([x], [], group_offsets=torch.tensor([0, 100, 300], dtype=torch.int32))
        assert limits.unserved(inner.spec, inner.epilogue, x, inner._packed_smem_shortfall, call) is None
        assert "cvt.rn.satfinite.e4m3x2.f32" in inspection.ptx_of(inner, "sm_90", "bf16", "generic_grouped")
    for dtype in ("bf16", "fp16"):
        text = inspection.ptx_of(inner, "sm_90", dtype, "vec_grouped")
        assert "cvt.rn.satfinite.e4m3x2.f32" in text
        if shutil.which("ptxas") is not None and dtype == "bf16":
            from .test_gemm_epilogue import _assert_ptxas_clean

            _assert_ptxas_clean(text)


@pytest.mark.parametrize("opts", GATED_BWD, ids=_ids)
def test_gated_backward_kernels_compile_with_both_halves(opts):
    """The packed kernel of a served gated backward (128-row tile, one CTA writing both halves:
    two passes) traces for bf16 and fp16, and assembles without spills."""
    import shutil

    op = mxq.fused_quant(format="fp8_block", dact="swiglu", **opts)(ident)
    for dtype in ("bf16", "fp16"):
        text = inspection.ptx_of(op.inner, "sm_90", dtype, "vec")
        assert "cvt.rn.satfinite.e4m3x2.f32" in text and text.count("bar.sync") >= 2
        if shutil.which("ptxas") is not None and dtype == "bf16":
            from .test_gemm_epilogue import _assert_ptxas_clean

            _assert_ptxas_clean(text)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [256, 96, 640])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("opts", GATED_BWD, ids=_ids)
def test_gpu_gated_backward_matches_the_reference(opts, dtype, n, monkeypatch):
    """FP8 block scaling's gated backward (dswiglu, dgeglu's class too) on the kernels, into
    poisoned outputs, against the reference within the op's class; MXQ_STRICT: no fallback
    (N = 96 only where no block straddles the halves; N = 640: three column tiles per half, the
    last partial). CPU counterparts: test_grouped_gated_backward_is_served_and_compiles,
    test_gated_backward_kernels_compile_with_both_halves."""
    from mxq.testing import compare, v_abs_sum, v_bound

    monkeypatch.setenv("MXQ_STRICT", "1")
    if n % 128 and opts.get("rowwise", True):
        pytest.skip("a block would straddle the halves: the reference's (test_gated's fallback test)")
    # (partial 128-row tiles: 2 and 3 of them; M % 16 == 0 for the transposed copy's 16-byte stores)
    for name, m in (("swiglu", 131), ("geglu", 300), ("swiglu", 272)):
        op = mxq.fused_quant(format="fp8_block", dact=name, **opts)(ident)
        a = planted(m, 2 * n, dtype, seed=n, scale=2.0)
        grad = planted(m, n, dtype, seed=n + 1, specials=False)
        want = op.reference(grad, act_input=a)
        exact = False
        v_abs = v_abs_sum(op.inner, grad, a[:, :n], a[:, n:], 0.0) if op.spec.dbias else None
        got = op(grad.cuda(), act_input=a.cuda(), out=poisoned(op, grad.cuda()))
        assert compare(got, want, exact, v_abs, v_bound=v_bound(op, grad, act_input=a)) == [], (name, m)


def _on_cuda(t: torch.Tensor, aligned: bool) -> torch.Tensor:
    """``t`` on the device, as aligned as the allocator makes it or one element off a 16-byte
    boundary (``t.cuda()`` would align it again)."""
    if aligned:
        return t.cuda()
    out = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")[1:].view(t.shape).copy_(t)
    assert out.data_ptr() % 16
    return out


# colwise blocks alone: no 1x128 block to straddle the halves at N % 128 != 0
UNALIGNED_GATED_BWD = [dict(rowwise=False, colwise=True), dict(rowwise=False, colwise=True, amax=True, dbias=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("opts", UNALIGNED_GATED_BWD, ids=_ids)
def test_gpu_gated_backward_from_unaligned_rows_matches_the_reference(opts, dtype, monkeypatch):
    """FP8 block scaling's gated backward (colwise blocks: no 1x128 block to straddle the halves) on
    the kernels for unaligned rows: N = 100 (variant "generic") and N = 96 from inputs one
    element off a 16-byte boundary (variant "rows8"), into poisoned outputs and allocating,
    against the reference within the op's class (dreglu: the exact class); MXQ_STRICT: no fallback.
    CPU counterpart: test_gated_backward_from_unaligned_rows_is_served."""
    from mxq.testing import compare, is_exact, v_abs_sum, v_bound

    monkeypatch.setenv("MXQ_STRICT", "1")
    for name, m, n, aligned in (("swiglu", 131, 100, True), ("reglu", 300, 100, True), ("swiglu", 131, 96, False)):
        op = mxq.fused_quant(format="fp8_block", dact=name, **opts)(ident)
        a = planted(m, 2 * n, dtype, seed=n, scale=2.0)
        grad = planted(m, n, dtype, seed=n + 1, specials=False)
        want = op.reference(grad, act_input=a)
        exact = is_exact(op)
        v_abs = v_abs_sum(op.inner, grad, a[:, :n], a[:, n:], 0.0) if op.spec.dbias else None
        bound = None if exact else v_bound(op, grad, act_input=a)
        ac, gc = _on_cuda(a, aligned), _on_cuda(grad, aligned)
        got = op(gc, act_input=ac, out=poisoned(op, gc))
        assert compare(got, want, exact, v_abs, v_bound=bound) == [], (name, m, n)
        assert compare(op(gc, act_input=ac), want, exact, v_abs, v_bound=bound) == [], (name, m, n)


def test_gated_backward_from_unaligned_rows_is_served():
    """The calls test_gpu_gated_backward_from_unaligned_rows_matches_the_reference makes are the
    kernels' (limits.unserved), and its misaligned inputs are what launch.variant_for sends to
    "rows8", its N = 100 ones to "generic"."""
    from mxq.runtime.call import Call

    from .test_launch import _at

    for opts in UNALIGNED_GATED_BWD:
        inner = mxq.fused_quant(format="fp8_block", dact="swiglu", **opts)(ident).inner
        for n, aligned in ((100, True), (96, False)):
            off = 0 if aligned else 2  # (bytes past a 64-byte boundary: _on_cuda's misalignment)
            g, a = _at(off, (131, n), torch.bfloat16), _at(off, (131, 2 * n), torch.bfloat16)
            call = Call([g, a[:, :n], a[:, n:]], [0.0])
            assert limits.unserved(inner.spec, inner.epilogue, g, inner._packed_smem_shortfall, call) is None
            variant = launch.variant_for(n, 2 * n, [g, a[:, :n], a[:, n:]], ["full", "strided", "strided"],
                                         (None, torch.empty(131, 2 * n, dtype=torch.uint8)), False)
            assert variant == ("generic" if aligned else "rows8"), (n, variant)


@pytest.mark.gpu
@pytest.mark.parametrize("opts", GATED_BWD, ids=_ids)
def test_gpu_fp32_gated_backward_matches_the_reference(opts, monkeypatch):
    """FP8 block scaling's gated backward from fp32 inputs on the vectorised kernel, into poisoned
    outputs and allocating, against the reference within the op's class, ungrouped (N = 96 only
    where no block straddles the halves; N = 640: three column tiles per half, the last partial;
    partial 128-row tiles, M % 8 != 0 with the transposed copy too) and grouped (compact, random
    groups with empty ones); MXQ_STRICT: no fallback. CPU counterpart:
    test_fp32_gated_backward_is_served_and_compiles."""
    from mxq.testing import compare, v_abs_sum, v_bound

    from .test_gated import _random_groups

    monkeypatch.setenv("MXQ_STRICT", "1")
    for name, m, n in (("swiglu", 131, 256), ("geglu", 272, 640), ("swiglu", 40, 96)):
        if n % 128 and opts.get("rowwise", True):
            continue  # (a block would straddle the halves: the reference's, test_gated's fallback test)
        op = mxq.fused_quant(format="fp8_block", dact=name, **opts)(ident)
        a = planted(m, 2 * n, torch.float32, seed=n, scale=2.0)
        grad = planted(m, n, torch.float32, seed=n + 1, specials=False)
        want = op.reference(grad, act_input=a)
        v_abs = v_abs_sum(op.inner, grad, a[:, :n], a[:, n:], 0.0) if op.spec.dbias else None
        bound = v_bound(op, grad, act_input=a)
        got = op(grad.cuda(), act_input=a.cuda(), out=poisoned(op, grad.cuda()))
        assert compare(got, want, False, v_abs, v_bound=bound) == [], (name, m, n)
        assert compare(op(grad.cuda(), act_input=a.cuda()), want, False, v_abs, v_bound=bound) == [], (name, m, n)
    if opts.get("scale_layout") == "gemm":
        return  # (groups take compact scales: validation)
    m, n = 333, 256
    for g in (3, 9):
        offs = _random_groups(m, g, seed=g)
        op = mxq.fused_quant(format="fp8_block", dact="swiglu", **opts)(ident)
        a = planted(m, 2 * n, torch.float32, seed=g, scale=2.0)
        grad = planted(m, n, torch.float32, seed=g + 1, specials=False)
        want = op.reference(grad, act_input=a, group_offsets=offs)
        v_abs = v_abs_sum(op.inner, grad, a[:, :n], a[:, n:], 0.0, group_offsets=offs) if op.spec.dbias else None
        gc, ac, oc = grad.cuda(), a.cuda(), offs.cuda()
        got = op(gc, act_input=ac, group_offsets=oc, out=poisoned(op, gc, oc))
        assert compare(got, want, False, v_abs, v_bound=v_bound(op, grad, act_input=a)) == [], offs.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("opts", GATED_BWD_GROUPED, ids=_ids)
def test_gpu_grouped_gated_backward_matches_the_reference(opts, dtype, monkeypatch):
    """FP8 block scaling's grouped gated backward on the grouped kernels, into poisoned outputs and
    allocating, against the reference within the op's class (dreglu and dsreglu: the exact class),
    for random group sizes with empty groups: dswiglu at three shapes, every other gated name at
    one; MXQ_STRICT: no fallback. CPU counterpart: test_grouped_gated_backward_is_served_and_compiles."""
    from mxq.frontend import gated
    from mxq.testing import compare, is_exact, v_abs_sum, v_bound

    from .test_gated import _random_groups

    monkeypatch.setenv("MXQ_STRICT", "1")
    m = 333
    # (N = 100, colwise blocks alone: rows not whole 16-byte vectors, the unaligned grouped kernel)
    shapes = ((3, 256), (9, 256), (5, 100 if opts.get("rowwise") is False else 640))
    for name, (g, n) in [("swiglu", s) for s in shapes] + [(nm, shapes[1]) for nm in gated.GATED if nm != "swiglu"]:
        offs = _random_groups(m, g, seed=g)
        op = mxq.fused_quant(format="fp8_block", dact=name, **opts)(ident)
        a = planted(m, 2 * n, dtype, seed=g, scale=2.0)
        grad = planted(m, n, dtype, seed=g + 1, specials=False)
        want = op.reference(grad, act_input=a, group_offsets=offs)
        v_abs = v_abs_sum(op.inner, grad, a[:, :n], a[:, n:], 0.0, group_offsets=offs) if op.spec.dbias else None
        gc, ac, oc = grad.cuda(), a.cuda(), offs.cuda()
        exact = is_exact(op)
        bound = None if exact else v_bound(op, grad, act_input=a)
        got = op(gc, act_input=ac, group_offsets=oc, out=poisoned(op, gc, oc))
        assert compare(got, want, exact, v_abs, v_bound=bound) == [], (name, offs.tolist())
        again = op(gc, act_input=ac, group_offsets=oc)  # (allocating)
        assert compare(again, want, exact, v_abs, v_bound=bound) == [], (name, offs.tolist())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transposed_copy_and_colwise_amax_are_served(dtype):
    """The GEMM-ready colwise copy from aligned rows (N % 8 == 0, 16-byte aligned rows a multiple
    of 8 elements apart), and the amax beside colwise blocks in either layout."""
    from mxq.runtime.call import Call

    for opts in (dict(colwise=True, scale_layout="gemm"), dict(rowwise=False, colwise=True, scale_layout="gemm"),
                 dict(colwise=True, amax=True), dict(colwise=True, scale_layout="gemm", amax=True, dbias=True)):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 200, dtype=dtype), lambda: None) is None
    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(ident)
    rows = torch.zeros(4, 204, dtype=dtype)[:, :200]  # (rows 204 elements apart)
    assert "transposed" in limits.unserved(op.spec, op.epilogue, rows, lambda: None, Call([rows], []))
    epi = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(scaled_shift)
    x, b = torch.zeros(4, 200, dtype=dtype), torch.zeros(201, dtype=dtype)
    assert limits.unserved(epi.spec, epi.epilogue, x, lambda: None, Call([x, b[:200]], [])) is None
    assert "transposed" in limits.unserved(epi.spec, epi.epilogue, x, lambda: None, Call([x, b[1:]], []))
    # into rowwise FP8 rows the aligned kernel cannot write (variant_for would pick another: the reference)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None, Call([x], [], out=out)) is None
    buf = torch.zeros(4 * 200 + 16, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for data in (buf[8:808].view(4, 200), buf[:812].as_strided((4, 200), (203, 1))):  # (8 bytes off; rows 203 apart)
        out.rowwise_data = data
        assert "rowwise FP8 rows" in limits.unserved(op.spec, op.epilogue, x, lambda: None, Call([x], [], out=out))


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_rowwise_1x128_is_served(dtype, layout):
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout, amax=True)(ident)
    assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 200, dtype=dtype), lambda: None) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_colwise_128_rows_are_served_from_16_bit_inputs(dtype):
    for opts in (dict(colwise=True), dict(rowwise=False, colwise=True, act="gelu"), dict(colwise=True, dbias=True)):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 200, dtype=dtype), lambda: None) is None


def test_grouped_fp32_and_unaligned_fp32_rows_fall_back():
    """Grouped calls from unaligned fp32 rows (the vectorised kernel's aligned rows alone) and fp32
    rows into FP8 rows not on 8-byte boundaries run the reference; grouped calls from aligned
    fp32 rows (1x128, compact 128-row colwise blocks, 128x128 tiles) and from 16-bit inputs
    (1x128, 128-row colwise blocks, 128x128 tiles) the kernels."""
    from mxq.runtime.call import Call

    op = mxq.fused_quant(format="fp8_block")(ident)
    x = torch.zeros(8, 131)
    grouped = Call([x], [], group_offsets=torch.tensor([8]))
    assert "group_offsets and fp32" in limits.unserved(op.spec, op.epilogue, x, lambda: None, grouped)
    x32 = torch.zeros(8, 256)
    for opts, served in ((dict(), True), (dict(colwise=True, dbias=True, amax=True), True),
                         (dict(block=(128, 128)), True), (dict(block=(128, 128), colwise=True, amax=True), True)):
        o = mxq.fused_quant(format="fp8_block", **opts)(ident)
        why = limits.unserved(o.spec, o.epilogue, x32, lambda: None, Call([x32], [], group_offsets=torch.tensor([8])))
        assert (why is None) == served, (opts, why)
    for opts in (dict(), dict(colwise=True, dbias=True), dict(block=(128, 128), colwise=True)):
        op16 = mxq.fused_quant(format="fp8_block", **opts)(ident)
        x16 = x.bfloat16()
        assert limits.unserved(op16.spec, op16.epilogue, x16, lambda: None, Call([x16], [], group_offsets=torch.tensor([8]))) is None
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", row_align=1)  # rows 131 bytes apart
    into = Call([x], [], out=out)
    assert "8-byte" in limits.unserved(op.spec, op.epilogue, x, lambda: None, into)
    padded = Call([x], [], out=mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu"))
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None, padded) is None
    assert limits.unserved(op.spec, op.epilogue, x.bfloat16(), lambda: None, into) is None  # (16-bit: any rows)


# -- compiled code ---------------------------------------------------------------------------------
def _ptx(op, arch, dtype, variant="vec"):
    return compiler.compile_op(op, arch, dtype, keep_ptx=True, variant=variant).__ptx__


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, layout", [("bf16", "compact"), ("fp16", "gemm"), ("fp32", "compact")])
def test_rowwise_compiles_with_te_arithmetic(arch, dtype, layout):
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout)(ident)
    ptx = _ptx(op, arch, dtype)
    assert f".target {arch}" in ptx
    # the scale fp8max / amax and the stored 1 / scale: IEEE divisions, no approximate reciprocal
    assert "div.rn.f32" in ptx and "rcp.approx" not in ptx and "div.approx" not in ptx and "div.full" not in ptx
    assert "0f43E00000" in ptx  # 448.0
    assert "-8388608" in ptx  # pow2: the sign and exponent bits (0xFF800000)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "st.global.b32" in ptx  # fp32 scales
    # NaN elements do not enter a block's amax (TE's fmaxf): no NaN-propagating max without amax=True
    assert "max.NaN" not in ptx
    if dtype == "fp32":  # a 128-column block is 16 lanes: 4 butterfly stages per row
        assert ptx.count("shfl.sync.bfly") == 4 * 8
    else:  # 16 lanes x 8 rows: a reduce-scatter (4 + 2 + 1 shuffles) and one all-reduce stage
        assert ptx.count("shfl.sync.bfly") == 8 and {"bf16": "max.bf16x2", "fp16": "max.f16x2"}[dtype] in ptx


def test_fp32_mode_and_e5m2_compile():
    op = mxq.fused_quant(format="fp8_block", fp8="e5m2", scale_mode="fp32")(ident)
    ptx = _ptx(op, "sm_90a", "bf16")
    assert "cvt.rn.satfinite.e5m2x2.f32" in ptx and "0f47600000" in ptx  # 57344.0
    assert "-8388608" not in ptx


@pytest.mark.parametrize("dtype, variant", [("bf16", "generic"), ("fp16", "rows8"), ("fp32", "rows8")])
def test_unaligned_variants_compile(dtype, variant):
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm", amax=True)(ident)
    assert "div.rn.f32" in _ptx(op, "sm_90a", dtype, variant)


def test_fused_ops_compile():
    ops = [mxq.fused_quant(format="fp8_block", act="gelu")(ident),
           mxq.fused_quant(format="fp8_block", dact="gelu", dbias=True, amax=True)(ident),
           mxq.fused_quant(format="fp8_block")(scaled_shift)]
    for op in ops:
        for dtype in ("bf16", "fp32"):
            assert "cvt.rn.satfinite.e4m3x2.f32" in _ptx(op, "sm_90a", dtype)


def test_element_wise_kernel_refuses_wide_blocks():
    op = mxq.fused_quant(format="fp8_block")(ident)
    with pytest.raises(Exception, match="1x32"):
        _ptx(op, "sm_90a", "fp32", "generic")


def test_source_renders_for_served_specs_only():
    assert "fp8_block" in mxq.fused_quant(format="fp8_block")(ident).source
    assert "fp8_block" in mxq.fused_quant(format="fp8_block", colwise=True)(ident).source
    assert "gemm" in mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(ident).source
    assert "128, 128" in mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True)(ident).source


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, variant", [("bf16", "vec"), ("fp16", "generic"), ("bf16", "rows8")])
def test_colwise_compiles_as_a_128_row_tile(arch, dtype, variant):
    """Colwise 128-row blocks: the packed kernel's tile is 128 rows (16 warps of 8 rows), the
    column maxima drop NaN, each column's scale and 1 / scale are IEEE divisions."""
    op = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    ptx = _ptx(op, arch, dtype, variant)
    assert ".reqntid 512, 1, 1" in ptx
    assert "max.NaN" not in ptx
    # an infinite quotient (a subnormal amax) becomes the input's largest finite value, pow2-rounded
    # (folded to one constant), in the row scales and in each column word's two scales
    assert ptx.count({"bf16": "0f7F000000", "fp16": "0f47000000"}[dtype]) >= 3
    assert ptx.count("div.rn.f32") >= 6  # row: scale, 1 / scale; columns: two of each per owner word
    cfg = codegen.kernel_config(op.spec, op.epilogue)
    assert cfg.tile_rows == 128 and cfg.packed_warps() == 16 and cfg.packed_warps(True) == 16
    assert cfg.rows8_warps() is None


def test_colwise_dbias_compiles():
    """dbias with 128-row tiles: 512 threads for 256 columns' sums (the threads past them store nothing)."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, dact="relu", dbias=True)(ident)
    for variant in ("vec", "generic"):
        ptx = _ptx(op, "sm_90a", "bf16", variant)
        assert ".reqntid 512, 1, 1" in ptx and ("add.rn.f64" in ptx or "add.f64" in ptx)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, variant", [("bf16", "vec_grouped"), ("fp16", "generic_grouped")])
def test_grouped_compiles_as_128_row_tiles(arch, dtype, variant):
    """CPU counterpart of test_grouped_matches_reference: a grouped op with colwise blocks (and
    dbias) compiles to the 128-row tile, with the grouped dbias reduction's five kernel forms; a
    rowwise-only grouped op keeps the 32-row tile (1x128 rowwise blocks do not depend on groups)."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, dact="relu", dbias=True)(ident)
    ptx = _ptx(op, arch, dtype, variant)
    assert ".reqntid 512, 1, 1" in ptx and ptx.count(".entry") == 6
    tiles = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True)(ident)
    assert ".reqntid 512, 1, 1" in _ptx(tiles, arch, dtype, variant)
    row = mxq.fused_quant(format="fp8_block", dbias=True)(ident)
    assert codegen.kernel_config(row.spec, row.epilogue).tile_rows == 32
    assert ".reqntid 512, 1, 1" not in _ptx(row, arch, dtype, variant)


def test_colwise_refuses_to_trace_what_it_does_not_serve():
    """fp32 colwise blocks, 128x128 tiles and the transposed copy: the vectorised kernel's
    aligned 128-row tile alone (no "rows8" or "generic"); the transposed copy from aligned rows
    alone."""
    for opts in (dict(), dict(scale_layout="gemm"), dict(block=(128, 128))):
        op = mxq.fused_quant(format="fp8_block", colwise=True, **opts)(ident)
        for variant in ("rows8", "generic"):
            with pytest.raises(Exception, match="128 rows"):
                _ptx(op, "sm_90a", "fp32", variant)
    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(ident)
    with pytest.raises(Exception, match="aligned rows"):
        _ptx(op, "sm_90a", "bf16", "generic")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, opts", [("bf16", dict(amax=True)), ("fp16", dict(rowwise=False)),
                                         ("bf16", dict(dact="relu", dbias=True)), ("fp16", dict(act="relu"))])
def test_transposed_copy_compiles(arch, dtype, opts):
    """The GEMM-ready colwise copy: the 128-row tile, each thread's 8x8 bytes transposed in
    registers (32 prmt), staged in shared memory as 8-byte chunks and stored as 16-byte runs (or
    bytes); colwise scales still IEEE divisions; the amax NaN-propagating beside NaN-dropping
    column maxima (one atomic per warp)."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", **opts)(ident)
    ptx = _ptx(op, arch, dtype)
    assert ".reqntid 512, 1, 1" in ptx
    assert ptx.count("prmt.b32") == 32
    assert ptx.count("st.shared.u64") + ptx.count("st.shared.b64") >= 8  # (dbias: its reduction's too)
    assert ptx.count("ld.shared.u64") + ptx.count("ld.shared.b64") >= 8
    assert ptx.count("st.global.v4.b32") == 4 and "st.global.b8" in ptx
    assert ptx.count("div.rn.f32") >= 4
    assert ("max.NaN" in ptx) == bool(opts.get("amax"))
    assert ("red.relaxed.gpu.global.max.s32" in ptx) == bool(opts.get("amax"))  # (device.amax_atomic)
    assert codegen.kernel_config(op.spec, op.epilogue).transposed


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, rowwise", [("bf16", False), ("fp16", True)])
def test_transposed_copy_stage_forms_compile(arch, dtype, rowwise):
    """Tuning.tr_stage, the transposed copy of a plain cast: "regs" loads the thread's 8 rows into
    registers (no cp.async) and has a "tr" buffer of its own; "stage" and "park" request all 8
    rows as 16-byte cp.async copies (one commit group each, a wait before each row's read) and
    transpose the tile in the staged input's shared memory (32 KB less), "park" with one barrier
    more (every thread's parked rows read before "tr" overwrites them) and fewer registers (none of
    the input words live across the scale phases). 3 CTAs of the staged forms share an SM's
    shared memory. The library's choice is "park" (the transposed copy alone and beside the
    rowwise copy); ops with arithmetic or dbias are not switched."""
    from mxq.kernels import config as kc

    def build(form):
        op = mxq.fused_quant(format="fp8_block", colwise=True, rowwise=rowwise, scale_layout="gemm")(ident)
        return op._with_tuning(kc.Tuning(tr_stage=form)) if form else op

    ptx = {form: _ptx(build(form), arch, dtype) for form in kc.TR_STAGES}
    assert "cp.async" not in ptx["regs"]
    for form in ("stage", "park"):
        copies = re.findall(r"cp\.async\.cg\.shared\.global(?:\.L2::128B)? \[[^]]+\], \[[^]]+\], (\d+)", ptx[form])
        assert copies == ["16"] * 8, copies
        assert ptx[form].count("cp.async.commit_group") == 8
        assert ptx[form].count("cp.async.wait_group") == 8
    assert ptx["park"].count("bar.sync") == ptx["stage"].count("bar.sync") + 1 == ptx["regs"].count("bar.sync") + 1
    for p in ptx.values():  # (the same transpose and stores in every form)
        assert p.count("prmt.b32") == 32 and p.count("st.global.v4.b32") == 4
    default = "park"
    assert _ptx(build(None), arch, dtype) == ptx[default]
    op = build(None)
    cfg = codegen.kernel_config(op.spec, op.epilogue)
    assert cfg.tr_stage == default and cfg.stage == cfg.tr_aliased == (default == "park")
    sizes = {}
    for form in kc.TR_STAGES:
        c = dataclasses.replace(cfg, tuning=kc.Tuning(tr_stage=form))
        names = [b.name for b in c.packed_buffers([(16, False)] if c.stage else [], False)]
        assert ("tr" in names) == (form == "regs") and ("in0" in names) == (form != "regs")
        sizes[form] = c.packed_shared_bytes(1, False)
    # by hand: column maxima 16 warps x 128 words, 256 inverse scales, then "tr" (128 x 256 bytes)
    # or the staged input (8 rows x 512 threads x 16 bytes), which holds it
    assert sizes["regs"] == 16 * 128 * 4 + 256 * 4 + 128 * 256
    assert sizes["stage"] == sizes["park"] == 16 * 128 * 4 + 256 * 4 + 8 * 512 * 16
    assert kc.KernelConfig.ctas_fit(sizes["park"], 3) and not kc.KernelConfig.ctas_fit(sizes["park"] + 128 * 256, 3)
    # a cap that 4 CTAs' shared memory cannot meet is none: the staged forms never halve their rows
    # into a ring (a parked row keeps its slot until encoded)
    for form in ("stage", "park"):
        c = dataclasses.replace(cfg, tuning=kc.Tuning(tr_stage=form, rows128_min_blocks=4))
        assert c.stage_rows(False) == 8 and c.min_blocks == 0
        c = dataclasses.replace(cfg, tuning=kc.Tuning(tr_stage=form, rows128_min_blocks=3))
        assert c.stage_rows(False) == 8 and c.min_blocks == 3
    for opts in (dict(act="gelu"), dict(dact="gelu", dbias=True), dict(dbias=True)):
        other = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", **opts)(ident)
        oc = codegen.kernel_config(other.spec, other.epilogue)
        assert oc.transposed and oc.tr_stage == "" and not oc.tr_aliased
    with pytest.raises(ValueError, match="tr_stage"):
        kc.Tuning(tr_stage="ring")


@pytest.mark.parametrize("arch", ["sm_90"])
def test_transposed_park_registers(arch):
    """Where ptxas is present: the "park" form of the colwise-only transposed copy fits 3 CTAs of
    512 threads per SM by registers (at most 40) without a cap and without spills, and takes fewer
    registers than "regs" (53 on sm_90 with CuTeDSL's ptxas)."""
    from mxq.kernels import config as kc
    from mxq.runtime import inspection

    regs = {}
    for form in ("regs", "park"):
        op = mxq.fused_quant(format="fp8_block", colwise=True, rowwise=False, scale_layout="gemm")(ident)
        art = inspection.compile_artifacts(op._with_tuning(kc.Tuning(tr_stage=form)), arch, "bf16", "vec")
        regs[form] = next((v for k, v in art["kernels"].items() if "packed_kernel" in k), None)
    if regs["park"] is None or regs["park"].get("registers") is None:
        pytest.skip("no local ptxas")
    assert regs["park"]["registers"] <= 40 and regs["park"]["registers"] < regs["regs"]["registers"], regs
    assert not regs["park"].get("spill_stores"), regs


def test_transposed_rows_fast_grid():
    """Tuning.tr_rows_fast: the transposed copy's grid takes its row tiles along x and its column
    tiles along y (split over z past 65535 as the row tiles are otherwise), by hand: M = 1000 is 8
    row tiles of 128, N = 3000 12 column tiles of 256; 70000 column tiles take y = 35000, z = 2.
    The library's choice: rows along x for the transposed copy alone, not beside the rowwise copy.
    Other ops ignore the switch; the kernel reads its tile from the swapped indices (its PTX
    differs)."""
    from mxq.kernels import config as kc
    from mxq.kernels import packed

    op = mxq.fused_quant(format="fp8_block", colwise=True, rowwise=False, scale_layout="gemm")(ident)
    cfg = dataclasses.replace(codegen.kernel_config(op.spec, op.epilogue), tuning=kc.Tuning(tr_rows_fast=False))
    fast = dataclasses.replace(cfg, tuning=kc.Tuning(tr_rows_fast=True))
    assert not cfg.rows_fast and fast.rows_fast and codegen.kernel_config(op.spec, op.epilogue).rows_fast
    both = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(ident)
    assert not codegen.kernel_config(both.spec, both.epilogue).rows_fast
    assert packed.grid(cfg, 1000, 3000) == ([12, 8, 1], [512, 1, 1])
    assert packed.grid(fast, 1000, 3000) == ([8, 12, 1], [512, 1, 1])
    assert packed.grid(fast, 128 * 9, 256 * 70000)[0] == [9, 35000, 2]
    compact = mxq.fused_quant(format="fp8_block", colwise=True, rowwise=False)(ident)
    ccfg = codegen.kernel_config(compact.spec, compact.epilogue, kc.Tuning(tr_rows_fast=True))
    assert not ccfg.rows_fast and packed.grid(ccfg, 1000, 3000)[0] == [12, 8, 1]
    ptx = _ptx(op, "sm_90a", "bf16")
    op2 = mxq.fused_quant(format="fp8_block", colwise=True, rowwise=False, scale_layout="gemm")(ident)
    assert _ptx(op2._with_tuning(kc.Tuning(tr_rows_fast=True)), "sm_90a", "bf16") == ptx
    op3 = mxq.fused_quant(format="fp8_block", colwise=True, rowwise=False, scale_layout="gemm")(ident)
    assert _ptx(op3._with_tuning(kc.Tuning(tr_rows_fast=False)), "sm_90a", "bf16") != ptx


def test_colwise_amax_compiles():
    """amax beside compact colwise blocks: NaN-dropping column maxima for the scales, a
    NaN-propagating maximum per thread for the amax (codec.amax_by_owners)."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, amax=True)(ident)
    cfg = codegen.kernel_config(op.spec, op.epilogue)
    assert not codec.amax_by_owners(cfg) and not codec.column_max_nan(cfg)
    ptx = _ptx(op, "sm_90a", "bf16")
    assert "max.NaN.bf16x2" in ptx and "max.bf16x2" in ptx and "red.relaxed.gpu.global.max.s32" in ptx
    mx = mxq.fused_quant(colwise=True, amax=True)(ident)
    assert codec.amax_by_owners(codegen.kernel_config(mx.spec, mx.epilogue))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_128x128_tiles_are_served_from_16_bit_inputs(dtype):
    for opts in (dict(), dict(colwise=True), dict(rowwise=False, colwise=True, scale_layout="gemm"),
                 dict(colwise=True, scale_layout="gemm", amax=True, dact="relu", dbias=True)):
        op = mxq.fused_quant(format="fp8_block", block=(128, 128), **opts)(ident)
        assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 200, dtype=dtype), lambda: None) is None
        cfg = codegen.kernel_config(op.spec, op.epilogue)
        assert cfg.tiles and cfg.tile_rows == 128 and cfg.col_reduce and not cfg.wide_tile(False, False)
        assert not codec.column_max_nan(cfg) and not codec.amax_by_owners(cfg)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype, layout, opts", [("bf16", "compact", dict()), ("fp16", "gemm", dict()),
                                                 ("bf16", "compact", dict(colwise=True)),
                                                 ("fp16", "compact", dict(rowwise=False, colwise=True)),
                                                 ("bf16", "gemm", dict(colwise=True, amax=True)),
                                                 ("fp16", "gemm", dict(rowwise=False, colwise=True, dbias=True)),
                                                 ("bf16", "compact", dict(dact="relu", dbias=True, colwise=True))])
def test_128x128_tiles_compile(arch, dtype, layout, opts):
    """128x128 tiles: the 128-row tile; no per-row scales (no row-block shuffles), the column
    owners' NaN-dropping maxima reduced per half-warp (4 shuffles) and over the owner warps; one
    scale division and one 1 / scale per tile and direction."""
    op = mxq.fused_quant(format="fp8_block", block=(128, 128), scale_layout=layout, **opts)(ident)
    ptx = _ptx(op, arch, dtype)
    assert ".reqntid 512, 1, 1" in ptx
    assert ptx.count("shfl.sync.bfly") == 4 + (5 if opts.get("amax") else 0)  # (amax: warp_max)
    assert ("max.NaN" in ptx) == bool(opts.get("amax"))
    assert "div.rn.f32" in ptx and "cvt.rn.satfinite" in ptx
    assert ("prmt.b32" in ptx) == (layout == "gemm" and bool(opts.get("colwise")))


@pytest.mark.parametrize("m, n", [(1, 1), (129, 200), (300, 1000), (512, 128)])
def test_tile_offsets_land_on_the_logical_scales(m, n):
    """codec.tile_scale_offset (plain integers) over launch.flat_scale's buffers: tile (rb, b)'s
    scale lands at [rb, b] of the rowwise tile grid and [b, rb] of the transposed copy's, in the
    GEMM-ready padded views; compact: the same [mb, nb] grid for both directions."""
    mb, nb = -(-m // 128), -(-n // 128)
    gemm = Format.fp8_block("e4m3", (128, 128), "pow2", "gemm")
    row, col = fp8_block_layouts.gemm_scale(m, n, True, "cpu"), fp8_block_layouts.gemm_scale(n, m, True, "cpu")
    for rb in range(mb):
        for b in range(nb):
            launch.flat_scale(row)[codec.tile_scale_offset(gemm, rb, b, mb, nb, False)] = rb * 1000 + b
            launch.flat_scale(col)[codec.tile_scale_offset(gemm, rb, b, mb, nb, True)] = rb * 1000 + b
    assert row.tolist() == [[rb * 1000 + b for b in range(nb)] for rb in range(mb)]
    assert col.tolist() == [[rb * 1000 + b for rb in range(mb)] for b in range(nb)]
    compact = Format.fp8_block("e4m3", (128, 128), "pow2", "compact")
    assert [codec.tile_scale_offset(compact, rb, b, mb, nb, c) for c in (False, True)
            for rb in range(mb) for b in range(nb)] == list(range(mb * nb)) * 2


def _prmt(a, b, selector):
    """PTX prmt.b32 (default mode) on host integers."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(selector >> (4 * i)) & 7] << (8 * i) for i in range(4))


def test_register_transpose_on_host(monkeypatch):
    """device.transpose8x8 with prmt evaluated on host integers: column c's two words hold byte c
    of rows 0-3 and 4-7."""
    from mxq.kernels import device as dev

    monkeypatch.setattr(dev, "prmt", _prmt)
    rows = [[sum((16 * i + c) << (8 * c) for c in range(4)), sum((16 * i + 4 + c) << (8 * c) for c in range(4))]
            for i in range(8)]
    cols = dev.transpose8x8(rows)
    for c in range(8):
        got = [(cols[c][i // 4] >> (8 * (i % 4))) & 0xFF for i in range(8)]
        assert got == [16 * i + c for i in range(8)], c


def test_transposed_staging_is_a_conflict_free_bijection():
    """packed.transposed_chunk: each column's 16 chunks land on its own 16 slots; a
    half-warp's 8-byte stores (lanes 8 columns apart, one warp's chunk) and loads (8 lanes per
    column, two columns) touch 16 distinct bank pairs."""
    from mxq.kernels.packed import TR_CHUNKS, VCOLS, transposed_chunk as at

    for c in range(VCOLS):
        assert sorted(at(c, q) for q in range(TR_CHUNKS)) == list(range(c * TR_CHUNKS, (c + 1) * TR_CHUNKS))
    for w in range(TR_CHUNKS):
        for k in range(8):
            for half in range(2):
                banks = {(2 * at(8 * l + k, w)) % 32 for l in range(16 * half, 16 * half + 16)}
                assert len(banks) == 16
    for p0 in range(0, VCOLS * TR_CHUNKS // 2, 16):
        for second in range(2):
            banks = {(2 * at(p // 8, 2 * (p % 8) + second)) % 32 for p in range(p0, p0 + 16)}
            assert len(banks) == 16


# -- GEMM-ready offsets ------------------------------------------------------------------------
@pytest.mark.parametrize("m, n", [(1, 1), (5, 300), (8, 128), (130, 257)])
def test_gemm_offsets_land_on_the_logical_scales(m, n):
    """codec.row_scale_offset (plain integers here) over launch.flat_scale's buffer writes scale
    (r, b) where the GEMM-ready view reads it, and where the oracle's drawing puts it."""
    view = fp8_block_layouts.gemm_scale(m, n, False, "cpu")
    flat = launch.flat_scale(view)
    fmt = Format.fp8_block("e4m3", (1, 128), "pow2", "gemm")
    nbr = -(-n // 128)
    want = oracle.gemm_rowwise_offsets(m, n, False)
    for r in range(m):
        for b in range(nbr):
            off = codec.row_scale_offset(fmt, r, b, nbr, m)
            assert off == want[(r, b)]
            flat[off] = r * 1000 + b
            assert view[r, b].item() == r * 1000 + b
    compact = Format.fp8_block("e4m3", (1, 128), "pow2", "compact")
    assert codec.row_scale_offset(compact, 3, 1, nbr, m) == 3 * nbr + 1


@pytest.mark.parametrize("m, n", [(1, 8), (129, 200), (300, 136), (256, 1)])
def test_gemm_colwise_offsets_land_on_the_logical_scales(m, n):
    """codec.col_scale_row (plain integers) over launch.flat_scale's buffer: column c's scale of
    128-row block rb lands at [c, rb] of the transposed copy's GEMM-ready scales ([N, ceil(M/128)],
    outer-dim-major); compact colwise scales stay [ceil(M/128), N] row-major."""
    view = fp8_block_layouts.gemm_scale(n, m, False, "cpu")
    flat = launch.flat_scale(view)
    fmt = Format.fp8_block("e4m3", (1, 128), "pow2", "gemm")
    for rb in range(-(-m // 128)):
        for c in range(n):
            flat[codec.col_scale_row(fmt, n) * rb + c] = c * 1000 + rb
    assert view.tolist() == [[c * 1000 + rb for rb in range(-(-m // 128))] for c in range(n)]
    assert codec.col_scale_row(Format.fp8_block("e4m3", (1, 128), "pow2", "compact"), n) == n


# -- on the device -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """No fallback: every call here is one the kernels serve (MXQ_STRICT=1 raises otherwise)."""
    monkeypatch.setenv("MXQ_STRICT", "1")


def _specials(m, n, dtype, seed):
    """planted data plus FP8 block scaling's edge blocks: all NaN, NaN with values, inf, tiny
    (fp8max / amax overflows fp32 where the type has the range), all zero."""
    x = planted(m, n, torch.float32, seed=seed)
    if m >= 6 and n >= 256:
        x[0, :128] = float("nan")
        x[1, 128:256] = float("nan")
        x[1, 130] = 3.0
        x[2, 5] = float("inf")
        x[4, :128] = 1e-38 if dtype is not torch.float16 else 1e-7
        x[5, 128:256] = 0.0
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (33, 31), (6, 300), (127, 200), (4, 5, 96), (64, 1024), (130, 1000)])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fp8, mode", [("e4m3", "pow2"), ("e5m2", "fp32"), ("e4m3", "fp32")])
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_rowwise_matches_reference(shape, dtype, fp8, mode, layout):
    op = mxq.fused_quant(format="fp8_block", fp8=fp8, scale_mode=mode, scale_layout=layout, amax=True)(ident)
    m = math.prod(shape[:-1])
    x = _specials(m, shape[-1], DTYPES[dtype], seed=sum(shape)).reshape(shape)
    got = op(x.cuda())
    into = op(x.cuda(), out=poisoned(op, x.cuda(), row_align=None)) if layout == "compact" else got  # (fp32: rows8)
    _check(op, [x], got)
    _check(op, [x], into)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8), (33, 200), (130, 264), (257, 1000), (4, 5, 96)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fp8, mode", [("e4m3", "pow2"), ("e5m2", "fp32")])
@pytest.mark.parametrize("rowwise", [True, False])
def test_colwise_matches_reference(shape, dtype, fp8, mode, rowwise, monkeypatch):
    """128-row colwise blocks (partial at M % 128), with and without the rowwise copy (fp32: the
    vectorised kernel's 128-row tile, aligned rows); MXQ_STRICT: no fallback."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    op = mxq.fused_quant(format="fp8_block", fp8=fp8, scale_mode=mode, rowwise=rowwise, colwise=True)(ident)
    m = math.prod(shape[:-1])
    x = _specials(m, shape[-1], DTYPES[dtype], seed=m).reshape(shape)
    if m >= 130:  # a column of NaN and inf in the second block; a column all zero
        x.view(m, -1)[128:, 3] = float("nan")
        x.view(m, -1)[129, 4] = float("inf")
        x.view(m, -1)[:, 5] = 0.0
    got = op(x.cuda(), out=poisoned(op, x.cuda()))
    _check(op, [x], got)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("opts", [dict(), dict(rowwise=False, amax=True), dict(dbias=True, amax=True),
                                  dict(dact="gelu", dbias=True)], ids=_ids)
def test_fp32_colwise_compiles(arch, opts):
    """fp32 colwise blocks on the vectorised kernel's 128-row tile (16 warps of 8 rows): served
    on aligned rows alone; IEEE divisions for the scales; with amax, a NaN-propagating maximum
    per thread beside the NaN-dropping column maxima (vectorized.split_amax); plain casts
    without spills on sm_90."""
    import shutil

    op = mxq.fused_quant(format="fp8_block", colwise=True, **opts)(ident)
    assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 256), lambda: None) is None
    assert "fp32" in limits.unserved(op.spec, op.epilogue, torch.zeros(4, 100), lambda: None)
    ptx = _ptx(op, arch, "fp32")
    assert ".reqntid 512, 1, 1" in ptx and "div.rn.f32" in ptx
    if opts.get("amax"):
        assert "red.relaxed.gpu.global.max.s32" in ptx  # (device.amax_atomic)
    if arch == "sm_90a" and not opts.get("dact") and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _assert_ptxas_clean

        _assert_ptxas_clean(ptx)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(131, 256), (300, 1000)])
def test_gpu_fp32_colwise_fused_ops(shape, monkeypatch):
    """fp32 colwise blocks with the amax (a NaN column: the amax NaN, its block's scale from the
    rest), dbias, a bias + gelu (the transcendental class) and dgelu + dbias, against the
    reference; MXQ_STRICT: no fallback. CPU counterpart: test_fp32_colwise_compiles."""
    from mxq.testing import compare, v_abs_sum, v_bound

    monkeypatch.setenv("MXQ_STRICT", "1")
    m, n = shape
    x = _colwise_specials(m, n, torch.float32, seed=m)
    a = planted(m, n, torch.float32, seed=m + 1)
    b = planted(1, n, torch.float32, seed=m + 2, specials=False).reshape(n)
    for opts in (dict(amax=True), dict(rowwise=False, amax=True), dict(dbias=True)):
        op = mxq.fused_quant(format="fp8_block", colwise=True, **opts)(ident)
        _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))
    fin = planted(m, n, torch.float32, seed=m + 3, specials=False)
    gelu = mxq.fused_quant(format="fp8_block", colwise=True, act="gelu")(scaled_shift)
    assert compare(gelu(fin.cuda(), b.cuda()), gelu.reference(fin, b), False,
                   v_bound=v_bound(gelu, fin, b)) == []
    dg = mxq.fused_quant(format="fp8_block", colwise=True, dact="gelu", dbias=True)(ident)
    got = dg(fin.cuda(), act_input=a.cuda())
    assert compare(got, dg.reference(fin, act_input=a), False, v_abs_sum(dg, fin, act_input=a),
                   v_bound=v_bound(dg, fin, act_input=a)) == []


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_grouped_fp32_compiles(arch):
    """Grouped fp32 calls on the vectorised kernel: 1x128 rowwise on 32-row group tiles, compact
    128-row colwise blocks on 128-row ones (a tile between groups storing 0.0 scales)."""
    for opts in (dict(), dict(colwise=True, dbias=True, amax=True), dict(block=(128, 128), dbias=True)):
        ptx = _ptx(mxq.fused_quant(format="fp8_block", **opts)(ident), arch, "fp32", "vec_grouped")
        assert "div.rn.f32" in ptx and (".reqntid 512, 1, 1" in ptx) == ("colwise" in opts or "block" in opts)


FP32_TILES = [dict(), dict(colwise=True), dict(rowwise=False, colwise=True), dict(scale_layout="gemm"),
              dict(colwise=True, amax=True, dbias=True), dict(scale_layout="gemm", act="gelu", amax=True),
              dict(colwise=True, dact="gelu", dbias=True)]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("opts", FP32_TILES, ids=_ids)
def test_fp32_tiles_compile(arch, opts):
    """fp32 128x128 tiles on the vectorised kernel's 128-row tile (16 warps of 8 rows, two tiles
    per CTA): served on aligned rows alone (the transposed copy too); no per-row scales (no
    row-block shuffles), the column owners' NaN-dropping maxima reduced per half-warp (4
    shuffles; amax: a NaN-propagating warp maximum, 5 more) and over the owner warps in shared
    memory; IEEE divisions for the scale and its inverse, one fp32 scale store per direction;
    plain casts without spills on sm_90."""
    import shutil

    op = mxq.fused_quant(format="fp8_block", block=(128, 128), **opts)(ident)
    assert limits.unserved(op.spec, op.epilogue, torch.zeros(4, 256), lambda: None) is None
    assert "fp32" in limits.unserved(op.spec, op.epilogue, torch.zeros(4, 100), lambda: None)
    assert limits.cpp_gap(op.spec, op.epilogue, "fp32", "vec") is None
    assert "fp32" in limits.cpp_gap(op.spec, op.epilogue, "fp32", "rows8")
    transposed = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True, scale_layout="gemm")(ident)
    for m in (8, 12):
        assert limits.unserved(transposed.spec, transposed.epilogue, torch.zeros(m, 256), lambda: None) is None
    cfg = codegen.kernel_config(op.spec, op.epilogue)
    assert cfg.tiles and cfg.tile_rows == 128 and cfg.vec_warps == 16 and not codec.column_max_nan(cfg)
    ptx = _ptx(op, arch, "fp32")
    assert ".reqntid 512, 1, 1" in ptx and "div.rn.f32" in ptx
    assert "rcp.approx" not in ptx or opts.get("act") or opts.get("dact")  # (the acts' own sigmoid)
    assert ptx.count("shfl.sync.bfly") == 4 + (5 if opts.get("amax") else 0)
    assert ("max.NaN" in ptx) == bool(opts.get("amax"))
    assert "st.global.b32" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx  # (fp32 scales; the data)
    if arch == "sm_90a" and not opts.get("act") and not opts.get("dact") and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _assert_ptxas_clean

        _assert_ptxas_clean(ptx)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 128), (129, 200), (160, 264), (300, 136), (1000, 1000), (4096, 4096)])
@pytest.mark.parametrize("layout, rowwise, colwise", [("compact", True, False), ("compact", False, True),
                                                      ("compact", True, True), ("gemm", True, False)])
def test_gpu_fp32_tiles_match_reference(shape, layout, rowwise, colwise, monkeypatch):
    """fp32 128x128 tiles on the vectorised kernel, one scale per tile shared by both copies:
    partial tiles at M and N, NaN, inf and subnormal columns, a tile of NaN alone (amax 0, scale
    1), fp8max / amax overflowing fp32 (the scale FLT_MAX); amax on the odd shapes; into
    poisoned outputs and allocating; MXQ_STRICT: no fallback. CPU counterpart:
    test_fp32_tiles_compile."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    fp8, mode = ("e4m3", "pow2") if shape[1] % 3 else ("e5m2", "fp32")
    op = mxq.fused_quant(format="fp8_block", block=(128, 128), fp8=fp8, scale_mode=mode, scale_layout=layout,
                         rowwise=rowwise, colwise=colwise, amax=shape[0] % 2 == 1)(ident)
    x = _colwise_specials(*shape, torch.float32, seed=shape[0] * 5 + shape[1])
    if shape[0] >= 256 and shape[1] >= 256:
        x[128:256, 128:256] = float("nan")
        x[0, 200] = float("nan")
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))
    _check(op, [x], op(x.cuda()))


@pytest.mark.gpu
@pytest.mark.parametrize("opts", FP32_TILES[4:], ids=_ids)
def test_gpu_fp32_tiles_fused_match_reference(opts, monkeypatch):
    """fp32 128x128 tiles after an act (the transcendental class: mxq.testing.compare's bound),
    dact + dbias, with amax and dbias, and a user epilogue with a bias operand; MXQ_STRICT: no
    fallback. CPU counterpart: test_fp32_tiles_compile."""
    from mxq.testing import compare, v_abs_sum, v_bound

    monkeypatch.setenv("MXQ_STRICT", "1")
    m, n = 300, 264
    x = planted(m, n, torch.float32, seed=61, specials=False)
    a = planted(m, n, torch.float32, seed=62)
    b = planted(1, n, torch.float32, seed=63, specials=False).reshape(n)
    op = mxq.fused_quant(format="fp8_block", block=(128, 128), **opts)(ident)
    kw = {"act_input": a} if opts.get("dact") else {}
    got = op(x.cuda(), **{k: v.cuda() for k, v in kw.items()})
    if opts.get("act") or opts.get("dact"):
        assert compare(got, op.reference(x, **kw), False, v_abs_sum(op, x, **kw) if opts.get("dbias") else None,
                       v_bound=v_bound(op, x, **kw)) == []
    else:
        _check(op, [x], got)
    epi = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True)(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda(), out=poisoned(epi, x.cuda())))


FP32_TRANSPOSED = [dict(), dict(rowwise=False), dict(block=(128, 128)), dict(block=(128, 128), rowwise=False, amax=True),
                   dict(amax=True, dbias=True), dict(act="gelu"), dict(dact="gelu", dbias=True, rowwise=False)]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("opts", FP32_TRANSPOSED, ids=_ids)
def test_fp32_transposed_compiles(arch, opts):
    """The transposed colwise copy from fp32 on the vectorised kernel's 128-row tile: served from
    aligned rows at any M, on the C++ routes too; its 8 x 8 byte blocks transposed by prmt and
    staged in shared memory (8 eight-byte stores a thread), then read back as 16-byte runs of
    output rows (8 eight-byte loads): 4 sixteen-byte stores a thread where the copy's rows are
    16-byte aligned, else 64 byte stores below M (and the rowwise rows' 8 eight-byte stores);
    plain casts without spills on sm_90."""
    import shutil

    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", **opts)(ident)
    for m in (8, 12):
        assert limits.unserved(op.spec, op.epilogue, torch.zeros(m, 256), lambda: None) is None
    assert "N % 8" in limits.unserved(op.spec, op.epilogue, torch.zeros(8, 100), lambda: None)
    assert limits.cpp_gap(op.spec, op.epilogue, "fp32", "vec") is None
    assert "fp32" in limits.cpp_gap(op.spec, op.epilogue, "fp32", "rows8")
    ptx = _ptx(op, arch, "fp32")
    assert ".reqntid 512, 1, 1" in ptx and "prmt.b32" in ptx
    assert ptx.count("st.global.v4.b32") == 4 and ptx.count("st.global.b8 ") >= 64
    assert ptx.count("st.global.v2.b32") == 8 * opts.get("rowwise", True)
    assert ptx.count("st.shared.b64") >= 8 and ptx.count("ld.shared.b64") >= 8
    assert ptx.count("shfl.sync.bfly") == ((4 if "block" in opts else 32 * opts.get("rowwise", True))
                                           + (5 if opts.get("amax") else 0))
    if arch == "sm_90a" and not opts.get("act") and not opts.get("dact") and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _assert_ptxas_clean

        _assert_ptxas_clean(ptx)


def test_fp32_transposed_copy_refuses_a_grouped_kernel():
    """The vectorised kernel stores the transposed copy from row rb * 128 (the GEMM-ready layout
    takes no groups, so no call reaches a grouped one): a grouped variant fails to compile, by name,
    rather than writing a group's rows at the wrong place."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm")(ident)
    with pytest.raises(RuntimeError, match="transposed colwise copy takes no groups"):
        compiler.compile_op(op, "sm_90a", "fp32", variant="vec_grouped")
    with pytest.raises(ValueError, match="group_offsets"):
        op(torch.zeros(256, 256), group_offsets=torch.tensor([128, 256], dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 128), (160, 264), (131, 264), (300, 136), (136, 1000), (1000, 1000),
                                   (2048, 4096)])
@pytest.mark.parametrize("opts", FP32_TRANSPOSED, ids=_ids)
def test_gpu_fp32_transposed_matches_reference(shape, opts, monkeypatch):
    """The transposed colwise copy from fp32 (1x128 blocks along M and 128x128 tiles) against the
    reference: partial blocks and tiles at M and N, M % 8 != 0 or the copy at an odd address
    (its rows not 8-byte aligned: byte stores), NaN, inf and subnormal columns, fused acts
    (the transcendental class: mxq.testing.compare's bound) and dact + dbias; into poisoned
    outputs and allocating; MXQ_STRICT: no fallback. CPU counterpart: test_fp32_transposed_compiles."""
    from mxq.testing import compare, v_abs_sum, v_bound

    monkeypatch.setenv("MXQ_STRICT", "1")
    fp8, mode = ("e4m3", "pow2") if shape[1] % 3 else ("e5m2", "fp32")
    op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", fp8=fp8, scale_mode=mode,
                         **opts)(ident)
    m, n = shape
    if opts.get("act") or opts.get("dact"):
        x = planted(m, n, torch.float32, seed=m + n, specials=False)
        kw = {"act_input": planted(m, n, torch.float32, seed=m)} if opts.get("dact") else {}
        got = op(x.cuda(), **{k: v.cuda() for k, v in kw.items()})
        assert compare(got, op.reference(x, **kw), False, v_abs_sum(op, x, **kw) if opts.get("dbias") else None,
                       v_bound=v_bound(op, x, **kw)) == []
        return
    x = _colwise_specials(m, n, torch.float32, seed=m * 7 + n)
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))
    _check(op, [x], op(x.cuda()))
    out = poisoned(op, x.cuda())  # (the copy at an odd address: its rows not 8-byte aligned, byte stores)
    buf = torch.full((n * m + 1,), 0x5A, dtype=torch.uint8, device="cuda")
    out.colwise_data = buf[1:].view(out.colwise_data.dtype).view(n, m)
    _check(op, [x], op(x.cuda(), out=out))


@pytest.mark.gpu
@pytest.mark.parametrize("opts", [dict(), dict(scale_mode="fp32", amax=True), dict(colwise=True, dbias=True),
                                  dict(rowwise=False, colwise=True, amax=True),
                                  dict(block=(128, 128), colwise=True, amax=True), dict(block=(128, 128), dbias=True)],
                         ids=_ids)
def test_gpu_grouped_fp32_matches_the_reference(opts, monkeypatch):
    """Grouped fp32 calls on the vectorised kernel against the reference byte for byte (dbias
    within an ulp), random groups with empty ones, into poisoned outputs and allocating; MXQ_STRICT:
    no fallback. CPU counterpart: test_grouped_fp32_compiles."""
    from .test_gated import _random_groups

    monkeypatch.setenv("MXQ_STRICT", "1")
    m, n = 333, 264
    op = mxq.fused_quant(format="fp8_block", **opts)(ident)
    for g in (3, 9):
        offs = _random_groups(m, g, seed=g)
        x = _colwise_specials(m, n, torch.float32, seed=g)
        _check(op, [x], op(x.cuda(), group_offsets=offs.cuda(), out=poisoned(op, x.cuda(), offs.cuda())),
               group_offsets=offs)
        _check(op, [x], op(x.cuda(), group_offsets=offs.cuda()), group_offsets=offs)


def _colwise_specials(m, n, dtype, seed, specials=True):
    """_specials plus colwise edge blocks where the shape has room: a column of NaN past row 128
    with an inf below it, an all-zero column, a column of subnormals (fp8max / amax overflows
    fp32 where the type has the range); ``specials`` False: clean data (an exact, finite amax)."""
    x = (_specials(m, n, dtype, seed) if specials else planted(m, n, torch.float32, seed=seed, specials=False))
    x = x.to(dtype)
    if specials and n >= 8:
        if m >= 130:
            x[128:, 3] = float("nan")
            x[129, 4] = float("inf")
        x[:, 5] = 0.0
        x[:, 6] = 1e-40 if dtype is torch.bfloat16 else 1e-7
    return x


GEMM_SHAPES = [(1, 128), (129, 200), (160, 264), (300, 136), (1000, 1000), (4096, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GEMM_SHAPES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("rowwise", [True, False])
@pytest.mark.parametrize("amax", [False, True])
def test_transposed_colwise_matches_reference(shape, dtype, rowwise, amax):
    """The GEMM-ready colwise copy ([N, M], 1x128 blocks along M, outer-dim-major padded scales),
    alone and beside the rowwise copy, with and without amax: partial tiles at M (M % 128, M % 16:
    the byte stores) and N (N % 256), into poisoned outputs and fresh ones."""
    fp8, mode = ("e4m3", "pow2") if shape[0] % 2 else ("e5m2", "fp32")
    op = mxq.fused_quant(format="fp8_block", fp8=fp8, scale_mode=mode, scale_layout="gemm", rowwise=rowwise,
                         colwise=True, amax=amax)(ident)
    x = _colwise_specials(*shape, DTYPES[dtype], seed=sum(shape))
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))
    if amax:  # (an amax of finite values, exactly)
        clean = _colwise_specials(*shape, DTYPES[dtype], seed=sum(shape), specials=False)
        _check(op, [clean], op(clean.cuda()))


@pytest.mark.gpu
def test_transposed_copy_into_unaligned_rowwise_rows_falls_back(monkeypatch):
    """An out= whose rowwise FP8 rows the aligned kernel cannot write (8 bytes off 16): the
    reference serves the call (its bytes, a one-time warning; under MXQ_STRICT an error naming
    it), not a NotImplementedError from the kernels' launch. CPU counterpart:
    test_transposed_copy_and_colwise_amax_are_served."""
    monkeypatch.delenv("MXQ_STRICT")  # (this module's _strict: the fallback is what this test checks)
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm", colwise=True)(ident)
    x = _colwise_specials(256, 200, torch.bfloat16, seed=5)
    _check(op, [x], op(x.cuda(), out=mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cuda")))  # (a route kept)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cuda")
    buf = torch.zeros(256 * 200 + 16, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    out.rowwise_data = buf[8:8 + 256 * 200].view(256, 200)  # (the same layout, 8 bytes off: not that route)
    _check(op, [x], op(x.cuda(), out=out))
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="rowwise FP8 rows"):
        op(x.cuda(), out=out)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["regs", "park"])
@pytest.mark.parametrize("shape", [(129, 200), (300, 600), (1000, 1000), (2056, 520)])
@pytest.mark.parametrize("rowwise", [True, False])
def test_transposed_rows_fast_matches_reference(form, shape, rowwise):
    """Tuning.tr_rows_fast (row tiles along x, column tiles along y): byte for byte against the
    reference at partial tiles in both directions, several of each, into poisoned outputs."""
    from mxq.kernels import config as kc

    op = mxq.fused_quant(format="fp8_block", fp8="e4m3", scale_mode="pow2", scale_layout="gemm", rowwise=rowwise,
                         colwise=True, amax=True)(ident)
    op._with_tuning(kc.Tuning(tr_stage=form, tr_rows_fast=True))
    x = _colwise_specials(*shape, torch.bfloat16, seed=sum(shape))
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["regs", "stage", "park"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("fp8, mode, block", [("e4m3", "pow2", (1, 128)), ("e5m2", "fp32", (1, 128)),
                                              ("e4m3", "fp32", (128, 128))])
@pytest.mark.parametrize("rowwise", [True, False])
def test_transposed_stage_forms_match_reference(form, dtype, fp8, mode, block, rowwise):
    """Each Tuning.tr_stage form of the transposed copy (registers, staged, staged and parked)
    byte for byte against the reference, 1x128 blocks and 128x128 tiles: partial row tiles (M %
    128 of 1, 8, 44, 104: rows past M staged by no copy; the parked form encodes their slots,
    never loaded, and the stores drop them), M % 16 != 0 (the byte stores) and M % 16 == 0 (the
    16-byte stores), partial column tiles (N % 256), into poisoned outputs and fresh ones, with
    the amax beside the staged forms. (One kernel per case: the shapes are symbolic.)"""
    from mxq.kernels import config as kc

    amax = form != "regs"
    op = mxq.fused_quant(format="fp8_block", fp8=fp8, scale_mode=mode, scale_layout="gemm", rowwise=rowwise,
                         colwise=True, amax=amax, block=block)(ident)
    op._with_tuning(kc.Tuning(tr_stage=form))
    for shape in [(1, 8), (129, 200), (300, 264), (1000, 1000), (2056, 520), (1024, 520)]:
        x = _colwise_specials(*shape, DTYPES[dtype], seed=sum(shape))
        _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))
        _check(op, [x], op(x.cuda()))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8), (129, 200), (300, 136), (1000, 1000)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_colwise_amax_matches_reference(shape, dtype, layout):
    """amax beside 1x128 colwise blocks: NaN-propagating (NaN planted), exact when finite."""
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout, colwise=True, amax=True)(ident)
    if layout == "gemm" and shape[1] % 8:
        pytest.skip("the transposed copy needs N % 8 == 0")
    for specials in (True, False):
        x = _colwise_specials(*shape, DTYPES[dtype], seed=7, specials=specials)
        got = op(x.cuda(), out=poisoned(op, x.cuda()))
        _check(op, [x], got)
        assert got.amax.isnan().item() == (specials and bool(x.isnan().any()))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GEMM_SHAPES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["compact", "gemm"])
@pytest.mark.parametrize("rowwise, colwise", [(True, False), (False, True), (True, True)])
def test_128x128_tiles_match_reference(shape, dtype, layout, rowwise, colwise):
    """128x128 tiles, one scale per tile shared by both copies (a NaN-dropping max over the tile):
    partial tiles at M and N, NaN, inf and subnormal blocks; amax on the odd shapes."""
    fp8, mode = ("e4m3", "pow2") if shape[1] % 3 else ("e5m2", "fp32")
    amax = shape[0] % 2 == 1
    op = mxq.fused_quant(format="fp8_block", block=(128, 128), fp8=fp8, scale_mode=mode, scale_layout=layout,
                         rowwise=rowwise, colwise=colwise, amax=amax)(ident)
    x = _colwise_specials(*shape, DTYPES[dtype], seed=shape[0] * 3 + shape[1])
    if shape[0] >= 256 and shape[1] >= 256:  # a tile of NaN alone (amax 0, scale 1), one NaN in a tile
        x[128:256, 128:256] = float("nan")
        x[0, 200] = float("nan")
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_128x128_fused_and_unaligned_match_reference(dtype):
    """128x128 tiles after act, dact + dbias, a user epilogue; unaligned rows (N % 8 != 0,
    compact: the packed kernel's unaligned variants)."""
    t = DTYPES[dtype]
    x, b = _colwise_specials(300, 264, t, seed=41), planted(1, 264, t, seed=42, specials=False).reshape(264)
    epi = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True, scale_layout="gemm")(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))
    a = planted(300, 264, t, seed=43)
    for opts in (dict(act="relu", amax=True), dict(dact="relu", dbias=True, colwise=True),
                 dict(dbias=True, rowwise=False, colwise=True, scale_layout="gemm")):
        op = mxq.fused_quant(format="fp8_block", block=(128, 128), **opts)(ident)
        kw = {"act_input": a} if "dact" in opts else {}
        _check(op, [x], op(x.cuda(), **{k: v.cuda() for k, v in kw.items()}), **kw)
    u = _specials(200, 261, t, seed=44)
    op = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True)(ident)
    _check(op, [u], op(u.cuda(), out=poisoned(op, u.cuda(), row_align=1)))  # (variant generic)
    _check(op, [u], op(u.cuda()))  # (rows padded: variant rows8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_transposed_colwise_fused_match_reference(dtype):
    """The transposed copy after act, dact + dbias, a user epilogue (a bias), amax."""
    t = DTYPES[dtype]
    x, b = _colwise_specials(300, 264, t, seed=31), planted(1, 264, t, seed=32, specials=False).reshape(264)
    epi = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", amax=True)(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda(), out=poisoned(epi, x.cuda())))
    a = planted(300, 264, t, seed=33)
    for opts in (dict(act="relu", amax=True), dict(dact="relu", dbias=True), dict(dbias=True, rowwise=False),
                 dict(dact="relu", dbias=True, amax=True, rowwise=False)):
        op = mxq.fused_quant(format="fp8_block", colwise=True, scale_layout="gemm", **opts)(ident)
        kw = {"act_input": a} if "dact" in opts else {}
        _check(op, [x], op(x.cuda(), **{k: v.cuda() for k, v in kw.items()}), **kw)
        y = planted(1024, 512, t, seed=34)  # (8 tiles of 128 rows: the 16-byte stores throughout)
        _check(op, [y], op(y.cuda(), **({"act_input": y.cuda()} if kw else {})), **({"act_input": y} if kw else {}))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_colwise_fused_and_unaligned_match_reference(dtype):
    t = DTYPES[dtype]
    x, b = _specials(300, 261, t, seed=21), planted(1, 261, t, seed=22, specials=False).reshape(261)
    epi = mxq.fused_quant(format="fp8_block", colwise=True)(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda(), out=poisoned(epi, x.cuda(), row_align=1)))  # (variant generic)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))  # (rows padded: variant rows8)
    a = planted(300, 261, t, seed=23)
    for opts in (dict(dact="relu"), dict(dact="relu", dbias=True), dict(dbias=True, rowwise=False)):
        op = mxq.fused_quant(format="fp8_block", colwise=True, **opts)(ident)
        kw = {"act_input": a} if "dact" in opts else {}
        _check(op, [x], op(x.cuda(), **{k: v.cuda() for k, v in kw.items()}), **kw)
        y = planted(1000, 512, t, seed=24)  # (8 tiles of 128 rows: 8 dbias partials)
        _check(op, [y], op(y.cuda(), **({"act_input": y.cuda()} if kw else {})), **({"act_input": y} if kw else {}))


GROUPED_OPTS = [dict(colwise=True), dict(rowwise=False, colwise=True, amax=True),
                dict(block=(128, 128), colwise=True), dict(block=(128, 128), rowwise=True),
                dict(block=(128, 128), colwise=True, amax=True), dict(block=(128, 128), rowwise=True, dbias=True),
                dict(colwise=True, dact="relu", dbias=True), dict(dbias=True, act="relu"),
                dict(colwise=True, act="relu", amax=True, fp8="e5m2", scale_mode="fp32")]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [264, 261])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("opts", GROUPED_OPTS)
def test_grouped_matches_reference(opts, dtype, n, monkeypatch):
    """Grouped calls on the kernels (MXQ_STRICT: a fallback would raise; exact-class ops): 128-row colwise blocks
    and 128x128 tiles restart at each group (kernels/grouped.py with 128-row tiles), rows
    between groups zero, dbias per group, amax; random group sizes around the block with empty
    groups first, last and between; aligned rows (N = 264) and not (261: the unaligned packed
    rows), into fresh and poisoned outputs. CPU counterpart: test_grouped_compiles_as_128_row_tiles."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    t = DTYPES[dtype]
    g = torch.Generator().manual_seed(n + len(GROUPED_OPTS[0]) + sum(map(len, opts)))
    sizes = [0, 127, 128, 129, 1, 0, *(int(v) for v in torch.randint(0, 400, (6,), generator=g)), 0, 300, 0]
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    m = int(offs[-1])
    op = mxq.fused_quant(format="fp8_block", **opts)(ident)
    x = _colwise_specials(m, n, t, seed=m + n)
    kw = {"act_input": planted(m, n, t, seed=m)} if "dact" in opts else {}
    cuda_kw = {k: v.cuda() for k, v in kw.items()}
    got = op(x.cuda(), group_offsets=offs.cuda(), **cuda_kw)
    _check(op, [x], got, group_offsets=offs, **kw)
    into = op(x.cuda(), group_offsets=offs.cuda(), out=poisoned(op, x.cuda(), group_offsets=offs.cuda()), **cuda_kw)
    _check(op, [x], into, group_offsets=offs, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, n", [("bf16", 256), ("fp16", 261)])
@pytest.mark.parametrize("search", ["block_all", "block", "warp", "warps"])
def test_grouped_search_forms_match_reference(search, dtype, n, monkeypatch):
    """Every group search form (Tuning.group_search) finds the 128-row tiles' groups: a plain
    cast (the library's block_all) and a computed op (its warps), 300 groups, aligned rows and
    not (N = 261: the unaligned packed rows)."""
    from mxq.kernels.config import Tuning

    monkeypatch.setenv("MXQ_STRICT", "1")
    g = torch.Generator().manual_seed(5)
    sizes = [int(v) for v in torch.randint(0, 200, (300,), generator=g)]
    sizes[::7] = [0] * len(sizes[::7])
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    x = _colwise_specials(int(offs[-1]), n, DTYPES[dtype], seed=6)
    for opts in (dict(colwise=True), dict(colwise=True, act="relu", dbias=True)):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        op._with_tuning(Tuning(group_search=search))
        _check(op, [x], op(x.cuda(), group_offsets=offs.cuda()), group_offsets=offs)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 5000], [9000], [3000, 0], [5000] + [0] * 7, [130] * 40])
def test_grouped_dbias_forms_with_128_row_partials(sizes, monkeypatch):
    """The grouped dbias reduction's forms on 128-row partial sums (FP8 block scaling's colwise
    blocks): a CTA per group and column tile in registers ([0, 5000]), staged ([9000]) and
    launched early ([3000, 0]), and a warp per group past its first round ([5000] + 7 empty:
    ROUND partial rows are 4096 rows here) and within it (40 groups of 130 rows); dbias within
    one ulp, every other byte the reference's."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    m = int(offs[-1])
    x = planted(m, 264, torch.bfloat16, seed=m, specials=False)
    op = mxq.fused_quant(format="fp8_block", colwise=True, dbias=True)(ident)
    _check(op, [x], op(x.cuda(), group_offsets=offs.cuda()), group_offsets=offs)


@pytest.mark.gpu
def test_grouped_noop_writes_nothing(monkeypatch):
    """noop=1 on grouped 128-row tiles (colwise blocks with dbias and amax; 128x128 tiles): every
    byte of poisoned outputs unchanged, scales, amax and dbias included."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    offs = torch.tensor([0, 100, 300, 300, 700], dtype=torch.int32)
    x = planted(700, 264, torch.bfloat16, seed=9).cuda()
    for opts in (dict(colwise=True, dbias=True, amax=True), dict(block=(128, 128), colwise=True, amax=True)):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        out = poisoned(op, x, group_offsets=offs.cuda())
        before = {f: getattr(out, f).clone() for f in FIELDS if getattr(out, f) is not None}
        op(x, group_offsets=offs.cuda(), noop=torch.ones(1, device="cuda"), out=out)
        for f, b in before.items():
            assert same_bytes(getattr(out, f), b), (opts, f)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_unaligned_rows_match_reference(dtype):
    """N % 8 != 0 into contiguous FP8 rows: the packed kernel's unaligned rows (variant generic)."""
    op = mxq.fused_quant(format="fp8_block", scale_layout="compact")(ident)
    x = _specials(37, 261, DTYPES[dtype], seed=3)
    got = op(x.cuda(), out=poisoned(op, x.cuda(), row_align=1))
    _check(op, [x], got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_ops_match_reference(dtype):
    t = DTYPES[dtype]
    x, b = _specials(70, 384, t, seed=1), planted(1, 384, t, seed=2, specials=False).reshape(384)
    relu = mxq.fused_quant(format="fp8_block", act="relu", amax=True)(ident)
    _check(relu, [x], relu(x.cuda()))
    epi = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))
    drelu = mxq.fused_quant(format="fp8_block", dact="relu", dbias=True)(ident)
    a = planted(70, 384, t, seed=5)
    _check(drelu, [x], drelu(x.cuda(), act_input=a.cuda()), act_input=a)


@pytest.mark.gpu
def test_gelu_within_the_transcendental_class():
    from mxq.testing import compare

    op = mxq.fused_quant(format="fp8_block", act="gelu")(ident)
    x = planted(96, 512, torch.bfloat16, seed=4)
    assert compare(op(x.cuda()), op.reference(x), False) == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernels_match_the_oracle(dtype):
    x = _specials(6, 300, DTYPES[dtype], seed=9)
    got = mxq.quantize(x.cuda(), format="fp8_block", scale_layout="gemm")
    codes, scales = oracle.quantize(x.float().tolist(), "e4m3", (1, 128), "pow2", dtype)
    assert got.rowwise_data.cpu().view(torch.uint8).tolist() == codes
    assert got.rowwise_scale.cpu().tolist() == scales


@pytest.mark.gpu
def test_prepare_and_noop():
    op = mxq.fused_quant(format="fp8_block")(ident)
    x = planted(64, 512, torch.bfloat16, seed=11).cuda()
    run, out = op.prepare(x)
    run()
    _check(op, [x.cpu()], out)
    keep = poisoned(op, x)
    before = keep.rowwise_data.clone()
    op(x, out=keep, noop=torch.ones(1, device="cuda"))
    assert same_bytes(keep.rowwise_data, before)


def test_fp32_colwise_routes_by_every_rows_alignment():
    """fp32 colwise blocks (the vectorised kernel's aligned 128-row tile): an out= whose colwise FP8
    rows are not 16-byte aligned, or not a multiple of 8 bytes apart, runs the reference; a column
    operand [M, 1] or a one-element one (read an element at a time) does not stop the kernel."""
    from mxq.runtime.call import Call

    op = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    x = torch.zeros(256, 264)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None, Call([x], [], out=out)) is None
    buf = torch.zeros(256 * 268 + 16, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for col in (buf[8:8 + 256 * 264].view(256, 264), buf[:256 * 268].as_strided((256, 264), (268, 1)),
                buf[:256 * 268].as_strided((256, 1, 264), (268, 264, 1))):  # (3-D: rows 268 apart)
        out.colwise_data = col
        assert "colwise FP8 rows" in limits.unserved(op.spec, op.epilogue, x, lambda: None, Call([x], [], out=out))
    out3 = mxq.MXFP8Tensor.empty(op.spec, (256, 1, 264), x.dtype, "cpu")  # (the same rows as [M, N])
    x3 = x.view(256, 1, 264)
    assert limits.unserved(op.spec, op.epilogue, x3, lambda: None, Call([x3], [], out=out3)) is None
    epi = mxq.fused_quant(format="fp8_block", colwise=True)(scaled_shift)
    for s in (torch.zeros(256, 1), torch.zeros(1)):
        assert limits.unserved(epi.spec, epi.epilogue, x, lambda: None, Call([x, s], [])) is None, tuple(s.shape)
