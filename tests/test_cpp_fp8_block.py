"""FP8 block scaling on the C++ routes: export() (csrc/export_check.h's checks over the size facts
of slots.scale_facts) and register()/dispatcher() (csrc/dispatch.cc), for what the kernels serve:
1x128 rowwise blocks (compact and gemm layouts; bf16, fp16, fp32 inputs) and, from 16-bit inputs,
128-row colwise blocks and 128x128 tiles (compact, and in the gemm layout the transposed colwise
copy [N, M] from aligned rows: the "_vec" kernel alone; from fp32, compact colwise blocks on
"_vec" alone), with or without amax, grouped (compact) and gated backwards. What they do not
serve is refused by name, by limits.cpp_gap (one rule for every route): groups with the gemm
layout, fp32 inputs with tiles, the transposed copy or a gated backward, fp32 into unaligned FP8
rows, the transposed copy on any kernel but "_vec".

CPU: refusals before anything is built; exported libraries build and check their arguments
(a call whose arguments pass reaches the compiled function's device check, "expected
device_type=cuda"); the dispatcher's CPU route fills flat and GEMM-ready scale buffers with the
reference; the dispatcher's native route (its checks, its choice of kernel variant, the views it
hands the kernel) runs on host memory labelled as CUDA, the kernel a recording stand-in
(``native``). GPU (marked gpu): the exported functions and the dispatcher on CUDA, byte for byte
against the Python route and the torch reference.
"""

from __future__ import annotations

import pytest
import torch

import mxq
from mxq.formats.layouts import cdiv, roundup
from mxq.runtime import limits
from mxq.testing import planted, same_bytes

from .test_kernels_fp8_block import FIELDS, _check  # (one rule for the kernels' bytes against the reference)

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
# The forms the C++ routes once refused by name (their checks knew [M, N] data and 1x128 / 128-row
# blocks only), which they now serve as the kernels do
NEW_FORMS = {
    "tiles": dict(block=(128, 128), colwise=True),
    "tiles_gemm": dict(block=(128, 128), colwise=True, scale_layout="gemm"),
    "transposed": dict(colwise=True, scale_layout="gemm"),
    "colwise_amax": dict(colwise=True, amax=True),
}


@pytest.mark.parametrize("opts, routes, words", [
    (dict(dact="swiglu"), ("export_fp32",), "gated backward (two output halves) and fp32 inputs"),
    *((dict(opts), ("export_grouped",), "group_offsets and scale_layout='gemm'")
      for opts in NEW_FORMS.values() if opts.get("scale_layout") == "gemm"),
])
def test_every_cpp_route_refuses_what_the_kernels_do_not_serve(tmp_path, opts, routes, words):
    """What no kernel or no C++ route serves (fp32 inputs with a gated backward; groups with the
    GEMM-ready layout) is refused by name before anything is built; the
    forms once refused by the C++ routes alone (128x128 tiles, the transposed copy, colwise
    blocks with amax, groups, gated backwards) build on every route (the tests below run them)."""
    op = mxq.fused_quant(format="fp8_block", **opts)(ident)
    calls = {"register": lambda: op.register("fp8_block_refused"), "dispatcher": op.dispatcher,
             "export": lambda: op.export(tmp_path / "x", dtype="bf16"),
             "export_fp32": lambda: op.export(tmp_path / "x", dtype="fp32"),
             "export_grouped": lambda: op.export(tmp_path / "x", dtype="bf16", grouped=True)}
    for route in routes:
        msg = _error(calls[route])
        assert msg.startswith("ValueError: mxq: ") and "format='fp8_block'" in msg and words in msg, (route, msg)
        assert "no C++ route" in msg, msg
    assert not (tmp_path / "x").exists()  # (refused before anything is built)


@pytest.mark.parametrize("form", sorted(NEW_FORMS))
def test_the_forms_once_refused_have_every_cpp_route(form):
    """register() and dispatcher() of the newly served forms (their exports: the fixtures below)."""
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(ident)
    assert limits.cpp_gap(op.spec, op.epilogue) is None and limits.cpp_gap(op.spec, op.epilogue, "bf16", "vec") is None
    assert op.dispatcher() is op.register(f"fp8_block_{form}")


def test_export_refuses_by_dtype_and_groups(tmp_path):
    """A colwise op serves 16-bit inputs, grouped ones too (compact), and fp32 ungrouped on the
    aligned kernel alone ("_vec"), as do 128x128 tiles and the transposed copy; a gated backward serves 16-bit inputs on every route."""
    col = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    info = col.export(tmp_path / "a", dtype="fp32")
    assert info["functions"] == ["mxq_ident_vec"], info["functions"]
    info = col.export(tmp_path / "a2", dtype="fp32", grouped=True)
    assert info["functions"] == ["mxq_ident_vec", "mxq_ident_vec_grouped"], info["functions"]
    for i, opts in enumerate((dict(), dict(scale_layout="gemm"))):  # (tiles in both copies; the transposed one)
        tiles = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True, **opts)(ident)
        assert tiles.export(tmp_path / f"t{i}", dtype="fp32")["functions"] == ["mxq_ident_vec"]
    row = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(ident)
    assert "group_offsets" in _error(lambda: row.export(tmp_path / "b", dtype="bf16", grouped=True))
    fwd = mxq.fused_quant(format="fp8_block", act="swiglu", colwise=True)(ident)  # (over the input's halves)
    assert fwd.export(tmp_path / "c", dtype="fp32")["functions"] == ["mxq_ident_vec"]
    bwd = mxq.fused_quant(format="fp8_block", dact="swiglu")(ident)
    assert bwd.dispatcher() is not None
    assert "fp32" in _error(lambda: bwd.export(tmp_path / "d", dtype="fp32"))


@pytest.fixture(scope="module")
def grouped_gated_libs(tmp_path_factory):
    """Exported grouped colwise + dbias (compact) and a gated backward with the transposed copy
    and dbias, loaded."""
    import tvm_ffi

    d = tmp_path_factory.mktemp("fbgg")
    grp = mxq.fused_quant(format="fp8_block", colwise=True, dbias=True)(ident)
    gi = grp.export(d / "g", arch="sm_90", dtype="bf16", name="fbgr", grouped=True)
    bwd = mxq.fused_quant(format="fp8_block", dact="swiglu", colwise=True, scale_layout="gemm", dbias=True)(ident)
    bi = bwd.export(d / "b", arch="sm_90", dtype="bf16", name="fbbw")
    return (grp, tvm_ffi.load_module(gi["library"]), gi), (bwd, tvm_ffi.load_module(bi["library"]), bi)


def test_exported_grouped_and_gated_functions_check_their_sizes(grouped_gated_libs):
    """export(grouped=True) of a compact colwise op: its grouped functions take [ceil(M/128) +
    G]-row colwise scales... as MXFP8Tensor.empty allocates them ([M // 128 + G, N]) and a
    workspace row per 128-row group tile; a gated backward with the transposed copy: "_vec"
    alone, the copy [2N, M] and its padded scales for 2N columns, N a multiple of 128."""
    (grp, glib, gi), (bwd, blib, bi) = grouped_gated_libs
    assert gi["functions"] == ["fbgr", "fbgr_vec", "fbgr_rows8", "fbgr_grouped", "fbgr_vec_grouped"]
    assert bi["functions"] == ["fbbw_vec"]
    assert "mColData    uint8[2N, M]" in open(bi["header"]).read()
    m, n = 300, 256
    offs = torch.tensor([0, 100, 300], dtype=torch.int32)
    t = mxq.MXFP8Tensor.empty(grp.spec, (m, n), torch.bfloat16, "cpu", group_offsets=offs)
    args = [torch.zeros(m, n, dtype=torch.bfloat16), t.rowwise_data.view(torch.uint8), t.rowwise_scale.reshape(-1),
            t.colwise_data.view(torch.uint8), t.colwise_scale.reshape(-1), t.dbias, torch.zeros(m // 128 + 3, n),
            torch.zeros(1), offs]
    for fname in ("fbgr_grouped", "fbgr_vec_grouped"):
        assert "device_type=cuda" in _error(glib[fname], *args), fname  # (sizes pass)
        short = list(args)
        short[4] = t.colwise_scale.reshape(-1)[:-1]
        msg = _error(glib[fname], *short)
        assert "'mColScale'" in msg and f"needs {t.colwise_scale.numel()} elements" in msg, msg
        short = list(args)
        short[6] = torch.zeros(cdiv(m, 128), n)
        assert "'mDbiasWs'" in _error(glib[fname], *short)
    out = mxq.MXFP8Tensor.empty(bwd.spec, (m, 2 * n), torch.bfloat16, "cpu")
    flat = [s if s is not None else None for s in (out.rowwise_scale, out.colwise_scale)]
    args = [torch.zeros(m, n, dtype=torch.bfloat16), torch.zeros(m, n, dtype=torch.bfloat16),
            torch.zeros(m, n, dtype=torch.bfloat16), out.rowwise_data.view(torch.uint8), _flat(flat[0]),
            out.colwise_data.view(torch.uint8), _flat(flat[1]), out.dbias, torch.zeros(cdiv(m, 128), 2 * n),
            torch.zeros(1)]
    assert out.colwise_data.shape == (2 * n, m)
    assert "device_type=cuda" in _error(blib["fbbw_vec"], *args)  # (sizes pass)
    bad = list(args)
    bad[5] = torch.zeros(n, m, dtype=torch.uint8)  # (one half's copy)
    msg = _error(blib["fbbw_vec"], *bad)
    assert "'mColData'" in msg and f"[{2 * n}, {m}]" in msg, msg


def test_cpp_gap_is_the_python_routes_rule():
    """What the Python routes fall back for (fp8_block_unserved) is what cpp_gap names for the
    same dtype and kernel variant: one rule; beyond it cpp_gap names only what the C++ routes
    cannot serve although Python does (cpp_only_gap): groups, and the transposed colwise copy on a
    variant other than "vec" (the Python routes run the reference for such calls: inputs not on
    the aligned rows, limits._aligned_rows)."""
    for opts in (dict(), dict(colwise=True), dict(scale_layout="gemm"), *NEW_FORMS.values(),
                 dict(block=(128, 128), scale_layout="gemm", colwise=True, rowwise=False)):
        op = mxq.fused_quant(format="fp8_block", **opts)(ident)
        assert limits.cpp_only_gap(op.spec) is None, opts  # (whatever the variant)
        assert bool(limits.cpp_only_gap(op.spec, grouped=True)) == (opts.get("scale_layout") == "gemm"), opts
        transposed = opts.get("colwise", False) and opts.get("scale_layout") == "gemm"
        assert limits.cpp_transposed(op.spec) == transposed, opts
        for dtype, name in limits.DTYPE_NAMES.items():
            # (aligned rows: the "vec" kernel; N % 8 != 0: "generic" / "rows8", launch.variant_for)
            for n, variants in ((256, ("vec",)), (100, ("generic", "rows8"))):
                py = limits.unserved(op.spec, op.epilogue, torch.zeros(4, n, dtype=dtype), lambda: None)
                for variant in variants:
                    cpp = limits.cpp_gap(op.spec, op.epilogue, name, variant)
                    if py is None and cpp is not None:
                        # (fp32 into FP8 rows not on 8-byte boundaries: the Python route's own outputs are
                        # on such boundaries, so its N % 8 != 0 calls take "rows8")
                        assert "8-byte boundaries" in cpp and variant == "generic", (opts, name, variant, cpp)
                        continue
                    assert (py is None) == (cpp is None), (opts, name, variant, py, cpp)
                    if cpp is not None and name != "fp32":
                        assert transposed and "the transposed copy" in cpp and "variant 'vec'" in cpp, cpp
                        assert limits.cpp_only_gap(op.spec, False, variant) in cpp
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

    def args(scale):  # (the FP8 rows padded to 8 bytes: "_rows8" takes rows on 8-byte boundaries alone)
        return [torch.zeros(m, n), torch.zeros(m, roundup(n, 8), dtype=torch.uint8)[:, :n], scale, torch.zeros(1)]

    padded = torch.zeros(cdiv(n, 128) * roundup(m, ALIGN))
    for fname in ("fbg_vec", "fbg_rows8"):
        assert "expected device_type=cuda" in _error(lib[fname], *args(padded)), fname
        if m % ALIGN:
            msg = _error(lib[fname], *args(torch.zeros(m * cdiv(n, 128))))
            assert f"'mRowScale'" in msg and f"needs {padded.numel()} elements" in msg, msg


# The newly served forms as exported here: dbias beside the compact ones and the 1x128 transposed
# copy (its workspace one row per 128-row tile), amax beside every one but the compact tiles
EXPORTED = {
    "tiles": dict(NEW_FORMS["tiles"], dbias=True),
    "tiles_gemm": dict(NEW_FORMS["tiles_gemm"], amax=True),
    "transposed": dict(NEW_FORMS["transposed"], amax=True, dbias=True),
    "colwise_amax": dict(NEW_FORMS["colwise_amax"], dbias=True),
}


@pytest.fixture(scope="module")
def new_libs(tmp_path_factory):
    """(op, loaded library, export info) of a bf16 export of an EXPORTED form, built on first use."""
    import tvm_ffi

    built = {}

    def get(form):
        if form not in built:
            op = mxq.fused_quant(format="fp8_block", **EXPORTED[form])(ident)
            info = op.export(tmp_path_factory.mktemp("fb") / form, arch="sm_90", dtype="bf16", name=f"fb_{form}")
            built[form] = (op, tvm_ffi.load_module(info["library"]), info)
        return built[form]

    return get


def _lib_args(op, m, n, out=None, x=None, dtype=torch.bfloat16, **wrong):
    """An exported function's arguments by slot name (slots.kernel_slots' order) for [M, N] of
    ``dtype`` (``x``'s where given): the buffers of ``out`` (default: MXFP8Tensor.empty's, CPU),
    scales as their whole flat buffers (a GEMM-ready view's padded buffer, as the header states),
    the workspace one row per 128-row tile (written out: the kernels' tile) in
    numerics.dbias_partial_dtype; ``wrong``: {slot name: a replacement}."""
    from mxq.formats.numerics import dbias_partial_dtype
    from mxq.runtime import slots

    device = "cpu" if x is None else x.device
    dtype = dtype if x is None else x.dtype
    out = out if out is not None else mxq.MXFP8Tensor.empty(op.spec, (m, n), dtype, device, row_align=1)
    by_role = {"input": x if x is not None else torch.zeros(m, n, dtype=dtype),
               "dbias_workspace": torch.zeros(cdiv(m, 128), n, device=device, dtype=dbias_partial_dtype(dtype)),
               "noop": torch.zeros(1, device=device)}
    for field in FIELDS:
        t = getattr(out, field)
        if t is not None:
            by_role[field] = (_flat(t) if field.endswith("_scale") else t.view(1) if field == "amax"
                              else t.view(torch.uint8) if field.endswith("_data") else t)
    args = {s.name: by_role[s.role] for s in slots.kernel_slots(op.spec, 1, 0)}
    assert set(wrong) <= set(args), wrong
    args.update(wrong)
    return args


def _call(lib, fname, args):
    return _error(lib[fname], *args.values())


def test_exported_headers_of_the_new_forms(new_libs):
    """The header states each form's sizes (the slot table's, from slots.direction_facts) and the
    transposed copy's [N, M]; the transposed copy's library holds "_vec" alone, the header saying why."""
    lines = {
        "tiles": ("mRowScale   float32[ceil(M/128) * ceil(N/128)] flat fp32",
                  "mColScale   float32[ceil(M/128) * ceil(N/128)] flat fp32",
                  "mColData    uint8[M, N]", "mDbiasWs    float32[ceil(M/128), N]"),
        "tiles_gemm": ("mRowScale   float32[roundup(ceil(M/128),4) * roundup(ceil(N/128),4)] flat fp32\n",
                       "mColScale   float32[roundup(ceil(M/128),4) * roundup(ceil(N/128),4)] flat fp32, the "
                       "transposed tile grid", "mColData    uint8[N, M]        (FP8 bytes, the transposed colwise "
                       "copy: contiguous, 128x128 tiles)"),
        "transposed": ("mColData    uint8[N, M]        (FP8 bytes, the transposed colwise copy: contiguous, "
                       "blocks of 128 along M)", "mColScale   float32[ceil(M/128) * roundup(N,4)] flat fp32\n",
                       "mRowScale   float32[roundup(M,4) * ceil(N/128)] flat fp32, outer-dim-major",
                       "mDbiasWs    float32[ceil(M/128), N]", "mAmax       float32[1]"),
        "colwise_amax": ("mColData    uint8[M, N]", "mColScale   float32[ceil(M/128) * N] flat fp32",
                         "mAmax       float32[1]"),
    }
    for form, want in lines.items():
        _, _, info = new_libs(form)
        text = open(info["header"]).read()
        for line in want:
            assert line in text, (form, line)
        transposed = form in ("tiles_gemm", "transposed")
        assert info["functions"] == ([f"fb_{form}_vec"] if transposed else
                                     [f"fb_{form}", f"fb_{form}_vec", f"fb_{form}_rows8"]), form
        flat = " ".join(text.replace("\n * ", " ").split())
        if transposed:
            assert f'"fb_{form}_vec" needs N % 8 == 0 and 16-byte aligned [M, N] tensors. It takes' in flat, flat
            for left in (f"fb_{form}", f"fb_{form}_rows8"):
                assert (f'Not in this library: "{left}" (format=\'fp8_block\' with colwise=True and '
                        f"scale_layout='gemm' (the transposed copy) from inputs with N % 8 != 0") in flat, flat
            assert "_rows8\" serves" not in flat


@pytest.mark.parametrize("form", sorted(EXPORTED))
@pytest.mark.parametrize("m, n", [(200, 96), (64, 256), (129, 136), (128, 128), (1, 8)])
def test_exported_new_forms_check_every_size(new_libs, form, m, n):
    """The sizes Python allocates pass (the call reaches the compiled function's device check);
    each buffer one element short or long, the transposed copy as [M, N] or with padded rows, a
    GEMM-ready scale buffer of the logical count, the workspace of MXFP8's 32-row tiles: refused,
    naming the argument and what M and N need."""
    op, lib, info = new_libs(form)
    transposed = limits.cpp_transposed(op.spec)
    for fname in info["functions"]:
        ok = _lib_args(op, m, n)
        assert "expected device_type=cuda" in _call(lib, fname, ok), fname
        refusals = []  # (slot, bad tensor, words of the refusal)
        for slot in ("mRowScale", "mColScale", "mDbias"):
            if slot in ok:
                t = ok[slot]
                refusals += [(slot, t[:-1], f"needs {t.numel()} elements"),
                             (slot, torch.zeros(t.numel() + 1, dtype=t.dtype), f"needs {t.numel()} elements")]
        for slot, field in (("mRowScale", "rowwise_scale"), ("mColScale", "colwise_scale")):
            logical = getattr(mxq.MXFP8Tensor.empty(op.spec, (m, n), torch.bfloat16, "cpu"), field)
            if slot in ok and logical.numel() != ok[slot].numel():  # (GEMM-ready: the padded buffer)
                refusals.append((slot, torch.zeros(logical.numel()), f"needs {ok[slot].numel()} elements"))
        if "mDbiasWs" in ok and cdiv(m, 32) != cdiv(m, 128):
            refusals.append(("mDbiasWs", torch.zeros(cdiv(m, 32), n), f"needs shape [{cdiv(m, 128)}, {n}]"))
        data = ok["mColData"]
        if transposed:
            assert data.shape == (n, m)
            if m != n:
                refusals.append(("mColData", torch.zeros(m, n, dtype=torch.uint8),
                                 f"needs shape [{n}, {m}] (the transposed colwise copy, [N, M])"))
            refusals.append(("mColData", torch.zeros(n, m + 16, dtype=torch.uint8)[:, :m],
                             f"needs a contiguous tensor (the transposed colwise copy's rows {m} elements apart"
                             if n > 1 else "expected device_type=cuda"))
            refusals.append(("mColData", torch.zeros(n * m, dtype=torch.uint8), f"needs shape [{n}, {m}]"))
        else:
            assert data.shape == (m, n)
            if m != n:
                refusals.append(("mColData", torch.zeros(n, m, dtype=torch.uint8), f"needs shape [{m}, {n}]"))
        for slot, bad, words in refusals:
            msg = _call(lib, fname, _lib_args(op, m, n, **{slot: bad}))
            if words == "expected device_type=cuda":  # (one row: its stride does not matter)
                assert words in msg, msg
                continue
            assert msg.startswith(f"ValueError: mxq: {fname}: argument #") and f"'{slot}'" in msg, (slot, msg)
            assert words in msg and f"M = {m}, N = {n}" in msg, (slot, words, msg)


@pytest.mark.parametrize("form", ["tiles", "tiles_gemm"])
def test_exported_tiles_take_two_scale_buffers(new_libs, form):
    """128x128 tiles: one scale per tile serves both copies (docs/NUMERICS.md), and each direction's
    field holds it (compact: the same values in the same grid; gemm: the transposed grid), so the
    kernels write two buffers; one buffer passed for both is refused (outputs apart, spans.h)."""
    op, lib, info = new_libs(form)
    m, n = 200, 136
    ok = _lib_args(op, m, n)
    assert ok["mRowScale"].numel() == ok["mColScale"].numel()
    shared = dict(ok, mColScale=ok["mRowScale"])
    for fname in info["functions"]:
        msg = _call(lib, fname, shared)
        assert msg.startswith(f"ValueError: mxq: {fname}: argument #4 'mColScale' overlaps argument #2 'mRowScale'"), msg


# -- register() / dispatcher() ---------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["compact", "gemm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [300, 100])
def test_dispatcher_cpu_route_fills_flat_and_gemm_buffers(layout, dtype, n):
    """CPU tensors run the reference into the caller's buffers: compact scales, GEMM-ready ones as
    their padded buffer (what C++ callers pass, as the native route takes it) or as the logical
    view (what Python holds; at N <= 128 one column, a view torch calls contiguous)."""
    op = mxq.fused_quant(format="fp8_block", scale_layout=layout)(ident)
    fn = op.dispatcher()
    x = planted(6, n, dtype, seed=1)
    want = op.reference(x)
    for as_view in (False, True):
        out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", zeroed=True)
        scale = out.rowwise_scale if as_view or layout == "compact" else out.rowwise_scale._base.reshape(-1)
        if layout == "gemm":
            assert scale.stride() == ((1, roundup(6, ALIGN)) if as_view else (1,))
            assert scale.numel() == (6 if as_view else roundup(6, ALIGN)) * cdiv(n, 128)
        fn(x, None, out.rowwise_data, scale, None, None, None, None, None)
        assert same_bytes(out.rowwise_data, want.rowwise_data) and same_bytes(out.rowwise_scale, want.rowwise_scale)


def test_get_quantize_kernel_serves_fp8_block_keys():
    """mxq.get_quantize_kernel (mxq::GetQuantizeKernel in C++) of an FP8 block-scaling key: the
    op's dispatcher, 128x128 keys and the transposed copy's too; a key of a format the C++ routes
    do not serve is refused by name. The key bits as mxq/include/mxq/mxq.hpp spells them
    (kFp8Block 1 << 17, kSwizzled 1 << 5: the gemm layout, kTiles128 1 << 18, kColwise 1 << 2)."""
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
    spec = QuantSpec(format="fp8_block", block=(128, 128), colwise=True, scale_layout="gemm")
    key = spec.key("bf16")
    assert key & (1 << 17) and key & (1 << 5) and key & (1 << 18) and key & (1 << 2)
    op = mxq.fused_quant(format="fp8_block", block=(128, 128), colwise=True, scale_layout="gemm")(ident)
    x = planted(200, 136, torch.bfloat16, seed=5)
    want = op.reference(x)
    out = _poisoned(op, x)
    get(key)(x, None, out.rowwise_data, _flat(out.rowwise_scale), out.colwise_data, _flat(out.colwise_scale),
             None, None, None)
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
        assert same_bytes(getattr(out, f), getattr(want, f)), f
    nv = get(QuantSpec(format="nvfp4").key("bf16"))  # (FP4 keys: Python's route, tests/test_fp4_options.py)
    x = torch.randn(16, 64)
    want = mxq.quantize(x, format="nvfp4")
    data, scale, amax = torch.empty(16, 32, dtype=torch.uint8), torch.empty(64, dtype=torch.uint8), torch.empty(1)
    nv(x, None, data, scale, None, None, amax, None, None)
    assert same_bytes(data, want.rowwise_data) and same_bytes(scale, want.rowwise_scale.view(torch.uint8).reshape(-1))
    assert amax.item() == want.amax.item()


def test_dispatcher_names_a_wrong_scale_buffer():
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(ident)
    fn = op.dispatcher()
    x = torch.zeros(6, 300)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    msg = _error(fn, x, None, out.rowwise_data, torch.zeros(6 * 3), None, None, None, None, None)
    assert "'rowwise_scale'" in msg and f"{3 * roundup(6, ALIGN)} elements" in msg, msg


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_dispatcher_refuses_the_gemm_scale_grid_in_another_order(device):
    """The [M, ceil(N/128)] grid of GEMM-ready 1x128 scales itself, contiguous (row-major): as many
    elements as the padded buffer when M % 4 == 0, and once taken as that buffer, whose
    outer-dim-major order put 60 of 512 scales elsewhere, is refused by name; the buffer, flat or
    [ceil(N/128), roundup(M, 4)], and the logical view are taken. CPU: ffi._padded_scale; CUDA:
    csrc/dispatch.cc's scale check."""
    op = mxq.fused_quant(format="fp8_block", scale_layout="gemm")(ident)
    fn = op.dispatcher()
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(2)).to(device)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, device)
    msg = _error(fn, x, None, out.rowwise_data, torch.zeros(256, 2, device=device), None, None, None, None, None)
    assert "'rowwise_scale' has the scales' shape" in msg and "256, 2" in msg, msg
    if device == "cpu":  # (the right view in another dtype: the dtype is named, not the strides)
        wrong = torch.zeros(2, 256, dtype=torch.float64).t()
        msg = _error(fn, x, None, out.rowwise_data, wrong, None, None, None, None, None)
        assert "must be a contiguous torch.float32 buffer" in msg, msg
    want = op(x)
    for rs in (torch.zeros(512, device=device), torch.zeros(2, 256, device=device), out.rowwise_scale):
        fn(x, None, out.rowwise_data, rs, None, None, None, None, None)
        assert torch.equal(rs.reshape(-1) if rs.dim() == 1 or rs.is_contiguous() else rs._base.reshape(-1),
                           want.rowwise_scale._base.reshape(-1)), tuple(rs.shape)


def _dispatch_args(op, out, x, views: bool, **wrong):
    """The dispatcher's arguments after the epilogue's (act_input, the six outputs, noop) for
    ``out``: scales as their whole flat buffers (what C++ callers pass) or, ``views``, as the
    logical views Python holds (a GEMM-ready scale's view of its padded buffer); ``wrong``: {slot:
    a replacement}."""
    args = {"act_input": None}
    for field in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        t = getattr(out, field)
        args[field] = None if t is None else (t if views else _flat(t)) if field.endswith("_scale") else t
    args["noop"] = torch.zeros(1, device=x.device)
    args.update(wrong)
    return list(args.values())


@pytest.mark.parametrize("form", sorted(NEW_FORMS))
@pytest.mark.parametrize("m, n", [(200, 296), (6, 100), (128, 128)])
def test_dispatcher_cpu_route_fills_the_new_forms(form, m, n):
    """CPU tensors run the reference into the caller's buffers: 128x128 tiles (both scale
    fields), the transposed copy [N, M], colwise blocks with amax; scales as flat buffers or as
    Python's views, the bytes of op.reference and of the Python route."""
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(ident)
    fn = op.dispatcher()
    x = planted(m, n, torch.bfloat16, seed=m + n)
    want, python = op.reference(x), op(x)
    for views in (False, True):
        out = _poisoned(op, x)
        fn(x, *_dispatch_args(op, out, x, views))
        for f in FIELDS:
            if getattr(want, f) is not None:
                assert same_bytes(getattr(out, f), getattr(want, f)), (f, views)
                assert same_bytes(getattr(out, f), getattr(python, f)), (f, views)
        if limits.cpp_transposed(op.spec):
            assert out.colwise_data.shape == (n, m)


def test_dispatcher_cpu_route_refuses_wrong_buffers_of_the_new_forms():
    """The CPU route's checks (Python's, in front of the reference) name a wrong buffer as the
    native route does: the transposed copy as [M, N] or with padded rows, a GEMM-ready scale
    buffer of the logical count, compact tiles' colwise scales one short."""
    m, n = 200, 298
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS["transposed"])(ident)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    for bad in (torch.zeros(m, n, dtype=torch.uint8), torch.zeros(n, m + 8, dtype=torch.uint8)[:, :m]):
        msg = _error(op.dispatcher(), x, *_dispatch_args(op, out, x, False, colwise_data=bad))
        assert f"'colwise_data' is the transposed colwise copy: a contiguous tensor of shape ({n}, {m})" in msg, msg
    msg = _error(op.dispatcher(), x, *_dispatch_args(op, out, x, False, colwise_scale=torch.zeros(cdiv(m, 128) * n)))
    assert f"'colwise_scale' must be a contiguous torch.float32 buffer of {cdiv(m, 128) * roundup(n, ALIGN)}" in msg
    tiles = mxq.fused_quant(format="fp8_block", **NEW_FORMS["tiles_gemm"])(ident)
    out = mxq.MXFP8Tensor.empty(tiles.spec, x.shape, x.dtype, "cpu")
    msg = _error(tiles.dispatcher(), x, *_dispatch_args(tiles, out, x, False, rowwise_scale=torch.zeros(2 * 3)))
    assert f"'rowwise_scale' must be a contiguous torch.float32 buffer of {ALIGN * ALIGN} elements" in msg, msg
    compact = mxq.fused_quant(format="fp8_block", **NEW_FORMS["tiles"])(ident)
    out = mxq.MXFP8Tensor.empty(compact.spec, x.shape, x.dtype, "cpu")
    msg = _error(compact.dispatcher(), x, *_dispatch_args(compact, out, x, False, colwise_scale=torch.zeros(5)))
    assert "'colwise_scale' has 5 elements, expected 6" in msg, msg
    msg = _error(compact.dispatcher(), x, *_dispatch_args(compact, out, x, False, colwise_scale=out.rowwise_scale))
    assert "'colwise_scale' overlaps 'rowwise_scale'" in msg, msg  # (two buffers: each direction's field)


# -- the native route on host memory (tests/conftest.py's `on_cuda` and `native` fixtures) -------------


@pytest.mark.parametrize("form", sorted(NEW_FORMS))
@pytest.mark.parametrize("m, n", [(200, 296), (128, 128), (1, 8)])
def test_native_route_takes_the_new_forms(native, form, m, n):
    """dispatch.cc's checks pass the buffers Python allocates (scales flat or as Python's views),
    the call resolves the "vec" kernel, and the kernel gets the slot table's arguments: the
    transposed copy [N, M] at the caller's address, each scale buffer flat from its start with
    the layout's element count (scale_sizes.h)."""
    from mxq.runtime import slots

    call, launches = native
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(ident)
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    for views in (False, True):
        call(op, x, *_dispatch_args(op, out, x, views))
    assert len(launches) == 2 and launches[0][2][:-1] == launches[1][2][:-1], launches  # (but the two noops)
    dtype, variant, got = launches[0]
    assert (dtype, variant) == ("bf16", "vec")
    table = slots.kernel_slots(op.spec, 1, 0)
    assert [s.role for s in table] == [s for s in ("input", "rowwise_data", "rowwise_scale", "colwise_data",
                                                   "colwise_scale", "amax", "noop") if s in [t.role for t in table]]
    for s, (shape, _, address) in zip(table, got):
        t = x if s.role == "input" else getattr(out, s.role, None)
        if s.role in ("rowwise_scale", "colwise_scale"):
            assert address == t.data_ptr() and shape == (_flat(t).numel(),), s.role
        elif s.role == "colwise_data":
            assert address == t.data_ptr() and shape == ((n, m) if form in ("transposed", "tiles_gemm") else (m, n))
        elif t is not None:
            assert address == t.data_ptr(), s.role


@pytest.mark.parametrize("form", sorted(NEW_FORMS))
def test_native_route_refuses_wrong_buffers_of_the_new_forms(native, form):
    """Each scale buffer one element short or long (and a GEMM-ready one of the logical count),
    colwise data of the other direction's shape, the transposed copy with padded rows, amax of two
    elements, one buffer for both directions' scales: refused by dispatch.cc naming the argument,
    before any kernel is resolved."""
    call, launches = native
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(ident)
    m, n = 200, 296
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    transposed = limits.cpp_transposed(op.spec)
    cases = []  # (slot, bad, words)
    for field in ("rowwise_scale", "colwise_scale"):
        whole = _flat(getattr(out, field))
        cases += [(field, whole[:-1], f"needs {whole.numel()} contiguous"),
                  (field, torch.zeros(whole.numel() + 1), f"needs {whole.numel()} contiguous")]
        if getattr(out, field).numel() != whole.numel():
            cases.append((field, torch.zeros(getattr(out, field).numel()), f"needs {whole.numel()} contiguous"))
    if transposed:
        cases += [("colwise_data", torch.zeros(m, n, dtype=torch.uint8), f"a contiguous tensor of shape [{n}, {m}]"),
                  ("colwise_data", torch.zeros(n, m + 8, dtype=torch.uint8)[:, :m], "(not contiguous)"),
                  ("colwise_data", torch.zeros(n * m, dtype=torch.uint8), f"shape [{n}, {m}] ([N, M]), got shape "
                                                                           f"[{n * m}]")]
    else:
        cases.append(("colwise_data", torch.zeros(n * m - 1, dtype=torch.uint8), f"expected {m * n}"))
    if op.spec.amax:
        cases.append(("amax", torch.zeros(2), "'amax' must have 1 element(s)"))
    if op.spec.block == (128, 128):
        cases.append(("colwise_scale", out.rowwise_scale, "'colwise_scale' overlaps 'rowwise_scale'"))
    for slot, bad, words in cases:
        msg = _error(call, op, x, *_dispatch_args(op, out, x, False, **{slot: bad}))
        assert msg.startswith("ValueError: mxq: argument '") and f"'{slot}'" in msg and words in msg, (slot, msg)
    assert not launches


@pytest.mark.parametrize("form", ["transposed", "tiles_gemm"])
def test_native_route_refuses_the_transposed_copy_from_unaligned_rows(native, form):
    """The transposed copy is written by the "vec" kernel alone: a call from rows N % 8 != 0, or
    into rowwise FP8 data not 16-byte aligned, would take "generic" / "rows8", which the native
    route refuses by name when it resolves the kernel (the Python routes run the reference);
    the compact tiles take those kernels."""
    call, launches = native
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(ident)
    compact = mxq.fused_quant(format="fp8_block", **NEW_FORMS["tiles"])(ident)
    m = 200
    x = torch.zeros(m, 100, dtype=torch.bfloat16)
    for o, variant in ((op, None), (compact, "generic")):
        out = mxq.MXFP8Tensor.empty(o.spec, x.shape, x.dtype, "cpu", row_align=1)  # (100-byte rows: not rows8)
        if variant is None:
            msg = _error(call, o, x, *_dispatch_args(o, out, x, False))
            assert ("format='fp8_block' with colwise=True and scale_layout='gemm' (the transposed copy) from inputs "
                    "with N % 8 != 0") in msg and "variant 'vec', alone writes the copy" in msg, msg
            assert "this bf16 call has no kernel on the C++ routes" in msg, msg
        else:
            call(o, x, *_dispatch_args(o, out, x, False))
            assert launches[-1][:2] == ("bf16", variant)
    # aligned input, rowwise FP8 data 8 bytes off a 16-byte boundary: "rows8"
    x = torch.zeros(m, 128, dtype=torch.bfloat16)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    shifted = torch.zeros(m * 128 + 8, dtype=torch.uint8)[8:].view(m, 128)
    msg = _error(call, op, x, *_dispatch_args(op, out, x, False, rowwise_data=shifted))
    assert "the transposed copy" in msg and "no kernel on the C++ routes" in msg, msg
    call(op, x, *_dispatch_args(op, out, x, False))
    assert launches[-1][:2] == ("bf16", "vec")


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


def test_dispatcher_sends_grouped_calls_to_pythons_binding():
    """A registered FP8 block-scaling op's grouped calls take Python's binding of the kernels
    (bit 8 of slots.dispatch_flags, as swizzled MXFP8 scales'), int32 ends as int64 ones: the
    native route has no grouped kernels for it (limits.cpp_only_gap). MXFP8's compact ops launch
    int32-ended groups natively. GPU counterpart: test_registered_grouped_calls_run_on_cuda."""
    from mxq.runtime import slots

    for opts, python in ((dict(format="fp8_block"), True), (dict(format="fp8_block", colwise=True), True),
                         (dict(), False), (dict(scale_layout="swizzled"), True)):
        spec = mxq.fused_quant(**opts)(ident).spec
        assert bool(slots.dispatch_flags(spec) >> 8 & 1) is python, opts


@pytest.mark.gpu
@pytest.mark.parametrize("opts", [dict(), dict(colwise=True)])
def test_registered_grouped_calls_run_on_cuda(opts):
    """Grouped calls through a registered FP8 block-scaling op's dispatcher, int32 and int64 ends
    alike (int32 ones were refused: the native route has no grouped kernels for it), write the
    Python route's bytes. CPU counterpart: test_dispatcher_sends_grouped_calls_to_pythons_binding."""
    op = mxq.fused_quant(format="fp8_block", **opts)(ident)
    fn = op.dispatcher()
    x = planted(300, 256, torch.bfloat16, seed=3).cuda()
    for ends in (torch.tensor([0, 130, 130, 300], dtype=torch.int32), torch.tensor([0, 130, 130, 300])):
        ends = ends.cuda()
        want = op(x, group_offsets=ends)
        got = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device, group_offsets=ends)
        fn(x, None, got.rowwise_data, got.rowwise_scale, got.colwise_data, got.colwise_scale, None, None, None, ends)
        torch.cuda.synchronize()
        _same_as_python(got, want, str(ends.dtype))


@pytest.mark.gpu
def test_dispatcher_refuses_a_calls_dtype_and_variant_by_name():
    """What register() could not refuse up front: a colwise op's fp32 call from unaligned rows (the
    aligned kernel alone serves fp32 colwise blocks); fp32 into FP8 rows not on 8-byte boundaries
    (no "generic" kernel)."""
    col = mxq.fused_quant(format="fp8_block", colwise=True)(ident).dispatcher()
    x = torch.zeros(64, 100, device="cuda")
    out = mxq.MXFP8Tensor.empty(mxq.fused_quant(format="fp8_block", colwise=True)(ident).spec, x.shape,
                                torch.bfloat16, x.device)
    msg = _error(col, x, None, out.rowwise_data, out.rowwise_scale, out.colwise_data, out.colwise_scale,
                 None, None, None)
    assert "with colwise=True" in msg and "fp32 inputs from unaligned rows" in msg, msg  # (limits._fp32_aligned_only)
    row_op = mxq.fused_quant(format="fp8_block")(ident)
    row = row_op.dispatcher()
    x = torch.zeros(4, 13, device="cuda")
    out = mxq.MXFP8Tensor.empty(row_op.spec, x.shape, x.dtype, x.device, row_align=1)  # (13-byte rows)
    msg = _error(row, x, None, out.rowwise_data, out.rowwise_scale, None, None, None, None, None)
    assert "fp32 inputs into FP8 rows not on 8-byte boundaries" in msg, msg


def _same_as_python(got, want, what=""):
    """Every output of ``got`` byte-equal to the Python route's ``want`` (amax: a NaN amax any NaN;
    dbias is left to _check's rule against the reference: another kernel variant sums in another
    order)."""
    for f in FIELDS:
        w = getattr(want, f)
        if w is None or f == "dbias":
            continue
        g = getattr(got, f)
        if f == "amax":
            assert same_bytes(g.cpu(), w.cpu()) or bool(g.isnan().cpu() & w.isnan().cpu()), (f, what)
        else:
            assert same_bytes(g.contiguous().cpu(), w.contiguous().cpu()), (f, what)


@pytest.fixture(scope="module")
def fp32_libs(tmp_path_factory):
    """(op, loaded library, export info) of an fp32 export of an EXPORTED form (the vectorised
    kernel, "_vec" alone), built on first use."""
    import tvm_ffi

    built = {}

    def get(form):
        if form not in built:
            op = mxq.fused_quant(format="fp8_block", **EXPORTED[form])(ident)
            info = op.export(tmp_path_factory.mktemp("fb32") / form, arch="sm_90", dtype="fp32", name=f"fb32_{form}")
            assert info["functions"] == [f"fb32_{form}_vec"], info["functions"]
            built[form] = (op, tvm_ffi.load_module(info["library"]), info)
        return built[form]

    return get


FP32_SHAPES = [(64, 256), (300, 264), (129, 136), (128, 128)]  # (the aligned kernel: N % 8 == 0)


@pytest.mark.parametrize("form", sorted(EXPORTED))
def test_exported_fp32_forms_take_the_fp32_sizes(fp32_libs, form):
    """An fp32 export's "_vec" function takes fp32 inputs and its fp64 dbias workspace (the
    arguments test_exported_fp32_forms_run_on_cuda passes): the sizes pass to the compiled
    function, which refuses the CPU device; a bf16 input is refused by name."""
    op, lib, info = fp32_libs(form)
    fname = info["functions"][0]
    for m, n in FP32_SHAPES:
        args = _lib_args(op, m, n, dtype=torch.float32)
        assert "expected device_type=cuda" in _call(lib, fname, args), (fname, m, n)
    bad = _lib_args(op, 64, 256, dtype=torch.float32, mIn0=torch.zeros(64, 256, dtype=torch.bfloat16))
    assert "mIn0" in _call(lib, fname, bad)


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(EXPORTED))
@pytest.mark.parametrize("shape", FP32_SHAPES)
def test_exported_fp32_forms_run_on_cuda(fp32_libs, form, shape):
    """An fp32 export's "_vec" function (the vectorised kernel: 128x128 tiles, the transposed copy,
    colwise blocks with amax, dbias) writes the Python route's bytes and the reference's. CPU
    counterpart: test_exported_fp32_forms_take_the_fp32_sizes."""
    op, lib, info = fp32_libs(form)
    m, n = shape
    x = planted(m, n, torch.float32, seed=m + n).cuda()
    want = op(x)
    got = _poisoned(op, x)
    lib[info["functions"][0]](*_lib_args(op, m, n, out=got, x=x).values())
    torch.cuda.synchronize()
    _same_as_python(got, want, info["functions"][0])
    _check(op, [x.cpu()], got)


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(EXPORTED))
@pytest.mark.parametrize("shape", [(64, 256), (300, 264), (129, 136), (128, 128), (33, 100)])
def test_exported_new_forms_run_on_cuda(tmp_path, form, shape):
    """Each exported function of the newly served forms writes the Python route's bytes (and the
    reference's): 128x128 tiles compact and GEMM-ready (two scale fields), the transposed copy
    [N, M] ("_vec" alone), colwise blocks with amax. (CPU: test_exported_new_forms_check_every_size.)"""
    import tvm_ffi

    from mxq.runtime import targets

    arch = targets.device_arch(torch.device("cuda"))
    m, n = shape
    op = mxq.fused_quant(format="fp8_block", **EXPORTED[form])(ident)
    info = op.export(tmp_path / form, arch=arch, dtype="bf16", name=f"fb_{form}")
    if n % 8 and limits.cpp_transposed(op.spec):  # (its library's one function, "_vec", takes N % 8 == 0)
        assert info["functions"] == [f"fb_{form}_vec"]
        return
    lib = tvm_ffi.load_module(info["library"])
    x = planted(m, n, torch.bfloat16, seed=m + n).cuda()
    want = op(x)  # (the Python route, on the kernels)
    ran = 0
    for fname in info["functions"]:
        if fname.endswith("_vec") and n % 8:
            continue
        got = _poisoned(op, x)  # (rows padded to 16 bytes at N % 8 != 0: "_rows8" takes them)
        lib[fname](*_lib_args(op, m, n, out=got, x=x).values())
        torch.cuda.synchronize()
        _same_as_python(got, want, fname)
        _check(op, [x.cpu()], got)
        ran += 1
    assert ran


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(NEW_FORMS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_registered_new_forms_run_on_cuda(form, dtype):
    """The native dispatcher launches the newly served forms of a fused op (a row bias broadcast):
    scales as flat buffers and as Python's views, the Python route's bytes; compact ones from 16-bit
    rows N % 8 != 0 too ("generic" / "rows8"); fp32 on the vectorised kernel's aligned rows (M % 8
    != 0 too: the transposed copy's byte stores). (CPU: test_dispatcher_cpu_route_fills_the_new_forms,
    test_native_route_takes_the_new_forms.)"""
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(bias_gelu)
    fn = op.register(f"fp8_block_{form}_test")
    transposed = limits.cpp_transposed(op.spec)
    aligned_only = transposed or dtype is torch.float32
    for m, n in ((64, 256), (300, 264), (129, 136), (128, 128), *(() if aligned_only else ((33, 100),))):
        x, b = planted(m, n, dtype, seed=m).cuda(), planted(1, n, dtype, seed=n).reshape(n).cuda()
        want = op(x, b)
        for views in (False, True):
            got = _poisoned(op, x)
            fn(x, b, *_dispatch_args(op, got, x, views))
            torch.cuda.synchronize()
            _same_as_python(got, want, (m, n, views))
            if transposed:
                assert got.colwise_data.shape == (n, m)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["transposed", "tiles_gemm"])
def test_dispatcher_refuses_the_unaligned_transposed_copy_on_cuda(form):
    """On CUDA as on host memory labelled CUDA: the transposed copy from rows N % 8 != 0 is
    refused by name (no kernel but "_vec" writes it), and so are its data as [M, N] and a GEMM-ready
    scale buffer of the logical count. (CPU: test_native_route_refuses_the_transposed_copy_from_unaligned_rows,
    test_native_route_refuses_wrong_buffers_of_the_new_forms.)"""
    op = mxq.fused_quant(format="fp8_block", **NEW_FORMS[form])(ident)
    fn = op.dispatcher()
    x = torch.zeros(200, 100, dtype=torch.bfloat16, device="cuda")
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)
    msg = _error(fn, x, *_dispatch_args(op, out, x, False))
    assert "the transposed copy) from inputs with N % 8 != 0" in msg and "no kernel on the C++ routes" in msg, msg
    x = torch.zeros(200, 296, dtype=torch.bfloat16, device="cuda")
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)
    bad = torch.zeros(200, 296, dtype=torch.uint8, device="cuda")
    msg = _error(fn, x, *_dispatch_args(op, out, x, False, colwise_data=bad))
    assert "'colwise_data' is the transposed colwise copy: a contiguous tensor of shape [296, 200]" in msg, msg
    whole = _flat(out.colwise_scale)
    msg = _error(fn, x, *_dispatch_args(op, out, x, False, colwise_scale=whole[:-1]))
    assert f"'colwise_scale' has {whole.numel() - 1} elements" in msg and f"needs {whole.numel()}" in msg, msg


@pytest.mark.gpu
def test_exported_grouped_and_gated_functions_run_on_cuda(grouped_gated_libs):
    """The exported grouped colwise function and the gated backward with the transposed copy
    write the Python route's bytes on the H200 (dbias within an ulp, the reference's class).
    CPU counterpart: test_exported_grouped_and_gated_functions_check_their_sizes."""
    from mxq.testing import compare

    (grp, glib, _), (bwd, blib, _) = grouped_gated_libs
    m, n = 300, 256
    offs = torch.tensor([0, 100, 100, 300], dtype=torch.int32)
    x = planted(m, n, torch.bfloat16, seed=3).cuda()
    want = grp(x, group_offsets=offs.cuda())
    for fname in ("fbgr_grouped", "fbgr_vec_grouped"):
        got = mxq.MXFP8Tensor.empty(grp.spec, (m, n), torch.bfloat16, "cuda", group_offsets=offs)
        glib[fname](x, got.rowwise_data.view(torch.uint8), got.rowwise_scale.reshape(-1), got.colwise_data.view(torch.uint8),
                    got.colwise_scale.reshape(-1), got.dbias, torch.empty(m // 128 + len(offs), n, device="cuda"),
                    torch.zeros(1, device="cuda"), offs.cuda())
        torch.cuda.synchronize()
        assert compare(got, want, True) == [], fname
    g = planted(m, n, torch.bfloat16, seed=4, specials=False).cuda()
    a = planted(m, 2 * n, torch.bfloat16, seed=5, scale=2.0).cuda()
    want = bwd(g, act_input=a)
    got = mxq.MXFP8Tensor.empty(bwd.spec, (m, 2 * n), torch.bfloat16, "cuda")
    blib["fbbw_vec"](g, a[:, :n], a[:, n:], got.rowwise_data.view(torch.uint8), _flat(got.rowwise_scale),
                     got.colwise_data.view(torch.uint8), _flat(got.colwise_scale), got.dbias,
                     torch.empty(cdiv(m, 128), 2 * n, device="cuda"), torch.zeros(1, device="cuda"))
    torch.cuda.synchronize()
    assert compare(got, want, True) == []


def test_the_headers_key_bits_are_quantspecs():
    """mxq/include/mxq/mxq.hpp's KeyBits name every bit QuantSpec.key sets (a C++ caller builds keys
    from them): each flag constant equals the bit the matching option sets, each shift the
    position of its field."""
    import re
    from pathlib import Path

    from mxq.frontend.spec import QuantSpec

    text = (Path(mxq.__file__).parent / "include" / "mxq" / "mxq.hpp").read_text()
    enum = text[text.index("enum KeyBits"):]
    enum = enum[:enum.index("};")]
    bits = {name: 1 << int(b) for name, b in re.findall(r"(k\w+) = 1u << (\d+)", enum)}
    shifts = {name: int(v) for name, v in re.findall(r"(k\w+Shift) = (\d+)", enum)}
    base = QuantSpec(rowwise=True).key("fp32")

    def flag(**options):
        return QuantSpec(**options).key("fp32") ^ base

    assert bits["kColwise"] == flag(colwise=True) & bits["kColwise"] and bits["kE5M2"] == flag(fp8="e5m2")
    assert bits["kSwizzled"] == flag(scale_layout="swizzled") and bits["kAmax"] == flag(amax=True)
    assert bits["kDbias"] == flag(dbias=True) and bits["kGated"] == flag(act="swiglu") ^ (2 << shifts["kActShift"])
    assert bits["kFp8Block"] == flag(format="fp8_block") ^ (base & bits["kFp8Block"])
    fmt = bits["kFormatHigh"] | bits["kFp8Block"]  # (the format's two bits: NVFP4 also sets kAmax, its amax)
    assert flag(format="nvfp4") & fmt == bits["kFormatHigh"] and flag(format="mxfp4") & fmt == fmt
    nv = QuantSpec(format="nvfp4").key("fp32")
    assert QuantSpec(format="nvfp4", block_2d=True).key("fp32") ^ nv == bits["kTiles128"]
    assert QuantSpec(format="nvfp4", colwise=True, hadamard=True).key("bf16") ^ QuantSpec(
        format="nvfp4", colwise=True).key("bf16") == bits["kHadamard"]
    assert QuantSpec(format="nvfp4", stochastic_rounding=True).key("fp32") ^ nv == bits["kStochasticRounding"]
    assert flag(scale_mode="floor") == 1 << shifts["kScaleModeShift"]
    # the scale-mode codes the header gives per format (MXFP4's are not MXFP8's)
    comment = enum[enum.index("kScaleModeShift"):].split("\n")[0]
    for fmt in ("mxfp8", "mxfp4", "fp8_block"):
        codes = re.findall(r"(\d) (\w+)", re.search(fmt + r": ([^;]*)", comment).group(1))
        assert len(codes) >= 2, (fmt, comment)
        for code, mode in codes:
            key = QuantSpec(format=fmt, scale_mode=mode).key("fp32")
            assert (key >> shifts["kScaleModeShift"]) & 3 == int(code), (fmt, mode)
    assert QuantSpec().key("bf16") ^ QuantSpec().key("fp32") == 2 << shifts["kDtypeShift"]
    assert flag(dact="gelu") == 1 << shifts["kDactShift"]
