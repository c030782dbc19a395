"""FP8 block scaling on the C++ routes: export() (csrc/export_check.h's checks over the size facts
of slots.scale_facts) and register()/dispatcher() (csrc/dispatch.cc), for what the kernels serve:
1x128 rowwise blocks (compact and gemm layouts; bf16, fp16, fp32 inputs) and 128-row colwise
blocks (compact; 16-bit inputs, no amax). What they do not serve is refused by name, by
limits.cpp_gap (one rule for every route).

CPU: refusals before anything is built; exported libraries build and check their arguments
(a call whose arguments pass reaches the compiled function's device check, "expected
device_type=cuda"); the dispatcher's CPU route fills flat and GEMM-ready scale buffers with the
reference. GPU (marked gpu): the exported functions and the dispatcher on CUDA, byte for byte
against the Python route and the torch reference.
"""

from __future__ import annotations

import pytest
import torch

import mxq
from mxq.formats.layouts import cdiv, roundup
from mxq.runtime import limits
from mxq.testing import planted, same_bytes

from .test_kernels_fp8_block import _check  # (one rule for the kernels' bytes against the reference)

ALIGN = 4  # the GEMM-ready scales' padding, written out (fp8_block_layouts.GEMM_SCALE_ALIGN)


def ident(x):
    return x


def bias_gelu(x, b):
    return mxq.gelu(x + b)


def _error(fn, *args):
    with pytest.raises(Exception) as e:
        fn(*args)
    return f"{type(e.value).__name__}: {e.value}"


# -- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("opts, words", [
    (dict(block=(128, 128)), "block=(128, 128)"),
    (dict(colwise=True, scale_layout="gemm"), "the transposed copy"),
    (dict(colwise=True, amax=True), "amax"),
])
def test_every_cpp_route_refuses_what_the_kernels_do_not_serve(tmp_path, opts, words):
    op = mxq.fused_quant(format="fp8_block", **opts)(ident)
    for call in (lambda: op.register("fp8_block_refused"), op.dispatcher,
                 lambda: op.export(tmp_path / "x", dtype="bf16")):
        msg = _error(call)
        assert msg.startswith("ValueError: mxq: ") and "format='fp8_block'" in msg and words in msg, msg
        assert "no C++ route" in msg, msg
    assert not (tmp_path / "x").exists()  # (refused before anything is built)


def test_export_refuses_by_dtype_and_groups(tmp_path):
    """A colwise op serves 16-bit inputs only; no fp8_block op serves group_offsets."""
    col = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    assert "fp32 inputs" in _error(lambda: col.export(tmp_path / "a", dtype="fp32"))
    row = mxq.fused_quant(format="fp8_block")(ident)
    assert "group_offsets" in _error(lambda: row.export(tmp_path / "b", dtype="bf16", grouped=True))
    fwd = mxq.fused_quant(format="fp8_block", act="swiglu", colwise=True)(ident)
    assert "fp32 inputs" in _error(lambda: fwd.export(tmp_path / "c", dtype="fp32"))
    bwd = mxq.fused_quant(format="fp8_block", dact="swiglu")(ident)
    for call in (bwd.dispatcher, lambda: bwd.export(tmp_path / "d", dtype="bf16")):
        assert "gated backward" in _error(call)


def test_cpp_gap_is_the_python_routes_rule():
    """What the Python routes fall back for (fp8_block_unserved) is what cpp_gap names for the
    same dtype: one rule; beyond it cpp_gap names only what the C++ routes' checks do not know yet
    (cpp_only_gap: 128x128 tiles, the transposed copy, colwise with amax), which Python serves."""
    cpp_only = (dict(colwise=True, amax=True), dict(block=(128, 128)), dict(colwise=True, scale_layout="gemm"))
    for opts in (dict(), dict(colwise=True), *cpp_only, dict(scale_layout="gemm")):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        only = limits.cpp_only_gap(op.spec)
        assert (only is not None) == (opts in cpp_only), opts
        for dtype, name in limits.DTYPE_NAMES.items():
            py = limits.unserved(op.spec, op.epilogue, torch.zeros(4, 256, dtype=dtype), lambda: None)
            cpp = limits.cpp_gap(op.spec, op.epilogue, name)
            if py is None and only is not None:
                assert cpp is not None and only in cpp, (opts, name, cpp)
                continue
            assert (py is None) == (cpp is None) and (py is None or cpp in py), (opts, name, py, cpp)
    op = mxq.fused_quant(format="fp8_block")(ident)
    assert limits.cpp_gap(op.spec, op.epilogue, "fp32", "generic")  # (the element-wise kernel: 1x32 only)
    assert limits.cpp_gap(op.spec, op.epilogue, "fp32", "rows8") is None
    assert limits.cpp_gap(op.spec, op.epilogue, "bf16", "generic") is None


# -- export ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def col_lib(tmp_path_factory):
    """An exported bf16 op of both directions (compact) and dbias, loaded."""
    import tvm_ffi

    op = mxq.fused_quant(format="fp8_block", colwise=True, dbias=True)(ident)
    info = op.export(tmp_path_factory.mktemp("fb") / "out", arch="sm_90", dtype="bf16", name="fbc")
    return op, tvm_ffi.load_module(info["library"]), info


@pytest.fixture(scope="module")
def gemm_lib(tmp_path_factory):
    """An exported fp32 rowwise op of GEMM-ready scales, loaded."""
    import tvm_ffi

    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(ident)
    info = op.export(tmp_path_factory.mktemp("fb") / "out", arch="sm_90", dtype="fp32", name="fbg")
    return op, tvm_ffi.load_module(info["library"]), info


def _col_args(m, n, device="cpu", **wrong):
    """fbc's arguments of the sizes written out here: scales [M, ceil(N/128)] and
    [ceil(M/128), N] fp32, the workspace one row per 128-row tile."""
    args = dict(mIn0=torch.zeros(m, n, dtype=torch.bfloat16, device=device),
                mRowData=torch.zeros(m, n, dtype=torch.uint8, device=device),
                mRowScale=torch.zeros(m * cdiv(n, 128), device=device),
                mColData=torch.zeros(m, n, dtype=torch.uint8, device=device),
                mColScale=torch.zeros(cdiv(m, 128) * n, device=device),
                mDbias=torch.zeros(n, dtype=torch.bfloat16, device=device),
                mDbiasWs=torch.zeros(cdiv(m, 128), n, device=device),
                mNoop=torch.zeros(1, device=device))
    args.update(wrong)
    return list(args.values())


def test_exported_header_states_the_fp32_scales(col_lib, gemm_lib):
    _, _, info = col_lib
    text = open(info["header"]).read()
    assert "FP8 block-scaling (1x128 blocks, fp32 scales)" in text
    assert "mRowScale   float32[M * ceil(N/128)] flat fp32" in text
    assert "mColScale   float32[ceil(M/128) * N] flat fp32" in text
    assert "mDbiasWs    float32[ceil(M/128), N]" in text
    assert info["functions"] == ["fbc", "fbc_vec", "fbc_rows8"]
    _, _, info = gemm_lib
    raw = open(info["header"]).read()
    assert ("mRowScale   float32[roundup(M,4) * ceil(N/128)] flat fp32, outer-dim-major: scale (i, j) at "
            "j * roundup(M,4) + i") in raw
    text = " ".join(raw.replace("\n * ", " ").split())
    assert info["functions"] == ["fbg_vec", "fbg_rows8"]  # (fp32 into unaligned rows: no kernel)
    assert 'Not in this library: "fbg" (format=\'fp8_block\' with fp32 inputs into FP8 rows not on 8-byte boundaries' in text
    assert '#define FBG_NAME' not in text and '#define FBG_VEC_NAME "fbg_vec"' in text


@pytest.mark.parametrize("m, n", [(64, 96), (33, 200), (300, 40), (129, 256)])
def test_exported_colwise_function_checks_every_size(col_lib, m, n):
    op, lib, _ = col_lib
    for fname in ("fbc", "fbc_vec", "fbc_rows8"):
        assert "expected device_type=cuda" in _error(lib[fname], *_col_args(m, n)), fname  # sizes pass
        ok = dict(zip(("mIn0", "mRowData", "mRowScale", "mColData", "mColScale", "mDbias", "mDbiasWs"), _col_args(m, n)))
        for slot in ("mRowScale", "mColScale", "mDbias"):
            t = ok[slot]
            for bad in (t[:-1], torch.zeros(t.numel() + 1, dtype=t.dtype)):
                msg = _error(lib[fname], *_col_args(m, n, **{slot: bad}))
                assert msg.startswith(f"ValueError: mxq: {fname}: argument #") and f"'{slot}'" in msg, msg
                assert f"needs {t.numel()} elements" in msg, msg
        for rows in (cdiv(m, 32), cdiv(m, 128) + 1):  # (MXFP8's 32-row workspace is not this op's)
            if rows != cdiv(m, 128):
                msg = _error(lib[fname], *_col_args(m, n, mDbiasWs=torch.zeros(rows, n)))
                assert "'mDbiasWs'" in msg and f"needs shape [{cdiv(m, 128)}, {n}]" in msg, msg
        # E8M0-sized byte buffers (an MXFP8 habit): the dtype is named, then the size
        msg = _error(lib[fname], *_col_args(m, n, mRowScale=torch.zeros(m * cdiv(n, 128), dtype=torch.uint8)))
        assert "'mRowScale' has dtype uint8; this op's scales are float32 (fp32 scales)" in msg, msg
        msg = _error(lib[fname], *_col_args(m, n, mColScale=torch.zeros(cdiv(m, 32) * n)))
        assert "'mColScale'" in msg and f"needs {cdiv(m, 128) * n} elements" in msg, msg


@pytest.mark.parametrize("m, n", [(6, 300), (64, 128), (5, 8)])
def test_exported_gemm_function_checks_the_padded_buffer(gemm_lib, m, n):
    """The GEMM-ready scales: the padded buffer [ceil(N/128), roundup(M, 4)] passes; the logical
    count M * ceil(N/128) is refused where M % 4 != 0."""
    op, lib, _ = gemm_lib

    def args(scale):
        return [torch.zeros(m, n), torch.zeros(m, n, dtype=torch.uint8), scale, torch.zeros(1)]

    padded = torch.zeros(cdiv(n, 128) * roundup(m, ALIGN))
    for fname in ("fbg_vec", "fbg_rows8"):
        assert "expected device_type=cuda" in _error(lib[fname], *args(padded)), fname
        if m % ALIGN:
            msg = _error(lib[fname], *args(torch.zeros(m * cdiv(n, 128))))
            assert f"'mRowScale'" in msg and f"needs {padded.numel()} elements" in msg, msg


# -- register() / dispatcher() ---------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["compact", "gemm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dispatcher_cpu_route_fills_flat_and_gemm_buffers(layout, dtype):
    """CPU tensors run the reference into the caller's buffers: compact scales, GEMM-ready ones as
    their padded buffer (what C++ callers pass) or as the logical view (what Python holds)."""
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout)(ident)
    fn = op.dispatcher()
    x = planted(6, 300, dtype, seed=1)
    want = op.reference(x)
    for as_view in (False, True):
        out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", zeroed=True)
        scale = out.rowwise_scale if as_view or layout == "compact" else out.rowwise_scale._base.reshape(-1)
        if layout == "gemm":
            assert scale.stride() == ((1, roundup(6, ALIGN)) if as_view else (1,))
        fn(x, None, out.rowwise_data, scale, None, None, None, None, None)
        assert same_bytes(out.rowwise_data, want.rowwise_data) and same_bytes(out.rowwise_scale, want.rowwise_scale)


def test_get_quantize_kernel_serves_fp8_block_keys():
    """mxq.get_quantize_kernel (mxq::GetQuantizeKernel in C++) of an FP8 block-scaling key: the
    op's dispatcher; a 128x128 key is refused by name. The key bits as mxq/include/mxq/mxq.hpp
    spells them (kFp8Block 1 << 17, kSwizzled 1 << 5: the gemm layout, kTiles128 1 << 18)."""
    import tvm_ffi

    from mxq.frontend.spec import QuantSpec

    get = tvm_ffi.get_global_func("mxq.get_quantize_kernel")
    key = QuantSpec(format="fp8_block", scale_layout="gemm").key("bf16")
    assert key & (1 << 17) and key & (1 << 5) and not key & (1 << 18)
    fn = get(key)
    x = planted(5, 130, torch.bfloat16, seed=4)
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(ident)
    want = op.reference(x)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    fn(x, None, out.rowwise_data, out.rowwise_scale._base.reshape(-1), None, None, None, None, None)
    assert same_bytes(out.rowwise_scale, want.rowwise_scale) and same_bytes(out.rowwise_data, want.rowwise_data)
    msg = _error(get, QuantSpec(format="fp8_block", block=(128, 128)).key("bf16"))
    assert "block=(128, 128)" in msg and "no C++ route" in msg, msg


def test_dispatcher_names_a_wrong_scale_buffer():
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(ident)
    fn = op.dispatcher()
    x = torch.zeros(6, 300)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    msg = _error(fn, x, None, out.rowwise_data, torch.zeros(6 * 3), None, None, None, None, None)
    assert "'rowwise_scale'" in msg and f"{3 * roundup(6, ALIGN)} elements" in msg, msg


# -- on the device ---------------------------------------------------------------------------------
def _poisoned(op, x):
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        t = getattr(out, f)
        if t is not None:
            (t._base if t._base is not None else t).view(torch.uint8).fill_(0x7B)
    return out


def _flat(t):
    """A scale tensor as its flat buffer (a GEMM-ready view's whole padded buffer)."""
    return (t._base if t._base is not None else t).reshape(-1)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 256), (33, 200), (300, 264)])
def test_exported_functions_run_on_cuda(tmp_path, shape):
    """Each exported function writes the bytes of the Python route (and the reference): a
    bf16 op of both directions and dbias, and an fp32 op of GEMM-ready scales."""
    import tvm_ffi

    from mxq.runtime import targets

    arch = targets.device_arch(torch.device("cuda"))
    m, n = shape
    col = mxq.fused_quant(format="fp8_block", colwise=True, dbias=True)(ident)
    info = col.export(tmp_path / "c", arch=arch, dtype="bf16", name="fbc")
    lib = tvm_ffi.load_module(info["library"])
    x = planted(m, n, torch.bfloat16, seed=m).cuda()
    for fname in info["functions"]:
        if fname.endswith("_vec") and n % 8:
            continue
        got = _poisoned(col, x)
        lib[fname](x, got.rowwise_data.view(torch.uint8), _flat(got.rowwise_scale), got.colwise_data.view(torch.uint8),
                   _flat(got.colwise_scale), got.dbias, torch.empty(cdiv(m, 128), n, device="cuda"),
                   torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()
        _check(col, [x.cpu()], got)
    gemm = mxq.fused_quant(format="fp8_block", scale_layout="gemm", amax=True)(ident)
    info = gemm.export(tmp_path / "g", arch=arch, dtype="fp32", name="fbg")
    lib = tvm_ffi.load_module(info["library"])
    xf = planted(m, n, torch.float32, seed=n).cuda()
    want = gemm(xf)
    for fname in info["functions"]:
        if fname.endswith("_vec") and n % 8:
            continue
        # (_vec: contiguous rows; _rows8: rows padded to 16 bytes, as the Python route's own)
        got = mxq.MXFP8Tensor.empty(gemm.spec, xf.shape, xf.dtype, xf.device, row_align=1 if "vec" in fname else 16)
        lib[fname](xf, got.rowwise_data.view(torch.uint8), _flat(got.rowwise_scale), got.amax.view(1),
                   torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()
        assert same_bytes(got.rowwise_scale.cpu(), want.rowwise_scale.cpu()), fname
        assert same_bytes(got.rowwise_data.contiguous().cpu(), want.rowwise_data.contiguous().cpu()), fname
        assert same_bytes(got.amax.cpu(), want.amax.cpu()), fname
        _check(gemm, [xf.cpu()], got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["compact", "gemm"])
def test_registered_rowwise_op_runs_on_cuda(dtype, layout):
    """The native dispatcher launches the kernels: flat buffers and the GEMM-ready view alike,
    fused epilogue operands (a row bias broadcast), the Python route's bytes."""
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout, amax=True)(bias_gelu)
    fn = op.register("fp8_block_rowwise_test")
    import tvm_ffi

    assert tvm_ffi.get_global_func("mxq.fp8_block_rowwise_test") is not None
    for m, n in ((64, 256), (33, 200)):
        x, b = planted(m, n, dtype, seed=m).cuda(), planted(1, n, dtype, seed=n).reshape(n).cuda()
        want = op(x, b)
        for as_view in (False, True):
            got = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device, row_align=16)
            scale = got.rowwise_scale if as_view else _flat(got.rowwise_scale)
            fn(x, b, None, got.rowwise_data, scale, None, None, got.amax, None, None)
            torch.cuda.synchronize()
            for f in ("rowwise_data", "rowwise_scale", "amax"):
                assert same_bytes(getattr(got, f).contiguous().cpu(), getattr(want, f).contiguous().cpu()), (f, m, n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_registered_colwise_op_runs_on_cuda(dtype):
    """128-row colwise blocks with dact and dbias through the dispatcher (its workspace one row per
    128-row tile), against the reference."""
    op = mxq.fused_quant(format="fp8_block", colwise=True, dact="relu", dbias=True)(ident)
    fn = op.dispatcher()
    for m, n in ((1000, 512), (130, 264), (33, 200)):
        x, a = planted(m, n, dtype, seed=m).cuda(), planted(m, n, dtype, seed=n).cuda()
        got = _poisoned(op, x)
        fn(x, a, got.rowwise_data, got.rowwise_scale, got.colwise_data, got.colwise_scale, None, got.dbias, None)
        torch.cuda.synchronize()
        _check(op, [x.cpu()], got, act_input=a.cpu())


@pytest.mark.gpu
def test_dispatcher_refuses_a_calls_dtype_and_variant_by_name():
    """What register() could not refuse up front: a colwise op's fp32 call; fp32 into FP8 rows
    not on 8-byte boundaries (no "generic" kernel)."""
    col = mxq.fused_quant(format="fp8_block", colwise=True)(ident).dispatcher()
    x = torch.zeros(64, 256, device="cuda")
    out = mxq.MXFP8Tensor.empty(mxq.fused_quant(format="fp8_block", colwise=True)(ident).spec, x.shape,
                                torch.bfloat16, x.device)
    msg = _error(col, x, None, out.rowwise_data, out.rowwise_scale, out.colwise_data, out.colwise_scale,
                 None, None, None)
    assert "format='fp8_block' with colwise=True or block=(128, 128) and fp32 inputs" in msg, msg
    row_op = mxq.fused_quant(format="fp8_block")(ident)
    row = row_op.dispatcher()
    x = torch.zeros(4, 13, device="cuda")
    out = mxq.MXFP8Tensor.empty(row_op.spec, x.shape, x.dtype, x.device, row_align=1)  # (13-byte rows)
    msg = _error(row, x, None, out.rowwise_data, out.rowwise_scale, None, None, None, None, None)
    assert "fp32 inputs into FP8 rows not on 8-byte boundaries" in msg, msg
