"""The argument check in front of every exported function (mxq/csrc/export_check.h) and the
C++ scale sizes it shares with the registered dispatcher (mxq/csrc/scale_sizes.h).

The sizes are checked against what Python allocates (MXFP8Tensor.empty, the launcher's dbias
workspace rule), the calls on CPU tensors: the check runs before the compiled function's own
device check, so a call whose sizes pass reaches that check ("expected device_type=cuda") and
one whose sizes do not is refused naming the argument."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import mxq
from mxq.formats import groups
from mxq.frontend.spec import QuantSpec
from mxq.runtime import slots

CSRC = Path(mxq.__file__).resolve().parent / "csrc"
SHAPES = [(m, n) for m in (1, 31, 32, 33, 127, 128, 129, 200, 4097) for n in (1, 8, 31, 32, 33, 100, 129, 256)]


def _cxx_sizes(tmp_path, cases):
    """ScaleElements of the rowwise and colwise scales and WorkspaceRows of scale_sizes.h for each
    (facts, m, n, G): the C++ arithmetic over the facts Python hands it (slots.scale_facts)."""
    src = tmp_path / "sizes.cc"
    src.write_text('#include <cstdio>\n#include "scale_sizes.h"\nint main() {\n  long long v[mxq_sizes::kFacts + 3];\n'
                   '  for (;;) {\n    for (auto& x : v) if (std::scanf("%lld", &x) != 1) return 0;\n'
                   '    int64_t f[mxq_sizes::kFacts];\n    for (int i = 0; i < mxq_sizes::kFacts; ++i) f[i] = v[i];\n'
                   '    const mxq_sizes::Facts facts = mxq_sizes::FromList(f);\n'
                   '    const long long m = v[mxq_sizes::kFacts], n = v[mxq_sizes::kFacts + 1], g = v[mxq_sizes::kFacts + 2];\n'
                   '    std::printf("%lld %lld %lld\\n", (long long)mxq_sizes::ScaleElements(facts.row, m, n, g),\n'
                   '                (long long)mxq_sizes::ScaleElements(facts.col, m, n, g),\n'
                   '                (long long)mxq_sizes::WorkspaceRows(m, facts.tile_rows, g));\n  }\n}\n')
    exe = tmp_path / "sizes"
    subprocess.run(["g++", "-std=c++17", f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], input="".join(" ".join(map(str, (*f, m, n, g))) + "\n" for f, m, n, g in cases),
                         capture_output=True, text=True, check=True).stdout
    return [tuple(map(int, line.split())) for line in out.splitlines()]


def test_cxx_size_limit_is_pythons(tmp_path):
    """scale_sizes.h's kMaxElements and kMaxRows (the C++ routes' limit) are limits.MAX_ELEMENTS and
    MAX_ROWS (Python's: the reference beyond them)."""
    from mxq.runtime import limits

    src = tmp_path / "limit.cc"
    src.write_text('#include <cstdio>\n#include "scale_sizes.h"\nint main() {\n  std::printf("%lld %lld\\n", '
                   '(long long)mxq_sizes::kMaxElements, (long long)mxq_sizes::kMaxRows);\n}\n')
    exe = tmp_path / "limit"
    subprocess.run(["g++", "-std=c++17", f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert list(map(int, got)) == [limits.MAX_ELEMENTS, limits.MAX_ROWS]


def _buffer_elements(t):
    """Elements of the buffer behind scale tensor ``t`` (a GEMM-ready view's whole padded buffer)."""
    return t.untyped_storage().nbytes() // t.element_size()


# (spec options, tile rows of the dbias workspace: the kernels' KernelConfig.tile_rows, written
# out here: MXFP8 and rowwise-only FP8 block scaling one 32-row block, colwise 128-row blocks 128)
SPECS = [(dict(scale_layout=layout), 32) for layout in ("compact", "swizzled")] + [
    (dict(format="fp8_block", block=block, scale_layout=layout), 128)
    for block in ((1, 128), (128, 128)) for layout in ("compact", "gemm")] + [
    (dict(format=fmt, scale_layout=layout), 32) for fmt in ("nvfp4", "mxfp4") for layout in ("compact", "swizzled")] + [
    (dict(format="nvfp4", block_2d=True, scale_layout=layout), 32) for layout in ("compact", "swizzled")]


@pytest.mark.parametrize("opts, tile", SPECS)
def test_cxx_scale_sizes_equal_what_python_allocates(tmp_path, opts, tile):
    """Every layout's buffers (FP8 block scaling's 1x128 blocks and 128x128 tiles, compact and
    GEMM-ready, the transposed colwise copy's scales too): the C++ sizes equal MXFP8Tensor.empty's
    buffers (a GEMM-ready view's whole padded buffer), the workspace the launcher's rule at the
    kernels' tile."""
    # (FP8 block scaling's gemm layout and FP4's swizzled scales take no groups: validation)
    no_groups = opts.get("block_2d") or opts["scale_layout"] == (
        "gemm" if opts.get("format") == "fp8_block" else "swizzled") and opts.get("format") in ("fp8_block", "nvfp4", "mxfp4")
    grouped = (-1,) if no_groups else (-1, 1, 3)
    spec = QuantSpec(colwise=True, dbias=True, **opts)
    facts = slots.scale_facts(spec, tile or 32)
    cases = [(facts, m, n, g) for m, n in SHAPES for g in grouped]
    got = _cxx_sizes(tmp_path, cases)
    assert len(got) == len(cases)
    for (_, m, n, g), sizes in zip(cases, got):
        if spec.is_fp4 and (n % 16 or m % 2):  # (FP4: N whole bytes (NVFP4 whole blocks); the copy's M/2 bytes)
            continue
        offs = None if g < 0 else torch.tensor([m] * g, dtype=torch.int32)
        t = mxq.MXFP8Tensor.empty(spec, (m, n), torch.bfloat16, "cpu", group_offsets=offs, row_align=1)
        ws = -(-m // (tile or 32)) if g < 0 else m // (tile or 32) + g
        if spec.format == "mxfp8":
            assert ws == groups.workspace_rows(m, None if g < 0 else g)  # (what launch.py allocates)
        assert sizes == (_buffer_elements(t.rowwise_scale), _buffer_elements(t.colwise_scale), ws), (opts, m, n, g)


def test_scale_facts_come_from_the_op(tmp_path):
    """limits.cpp_facts: the served ops' facts at the kernels' own tile (a 128-row colwise tile
    for FP8 block scaling's colwise blocks)."""
    from mxq.runtime import limits

    for opts, tile in (({}, 32), (dict(format="fp8_block"), 32), (dict(format="fp8_block", colwise=True), 128),
                       (dict(format="fp8_block", scale_layout="gemm"), 32),
                       (dict(format="fp8_block", colwise=True, scale_layout="gemm"), 128),
                       (dict(format="fp8_block", block=(128, 128)), 128),
                       (dict(format="fp8_block", block=(128, 128), colwise=True, scale_layout="gemm"), 128)):
        op = mxq.fused_quant(dbias=True, **opts)(_ident)
        assert limits.cpp_facts(op.spec, op.epilogue) == slots.scale_facts(op.spec, tile), opts


@pytest.mark.parametrize("opts", [dict(scale_layout=layout) for layout in ("compact", "swizzled")] + [
    dict(format="fp8_block", block=block, scale_layout=layout, rowwise=rowwise)
    for block in ((1, 128), (128, 128)) for layout in ("compact", "gemm") for rowwise in (True, False)])
def test_the_transposed_copy_is_what_python_allocates(opts):
    """limits.cpp_transposed (the C++ checks' [N, M] colwise data: export_check.h's kColDataT,
    dispatch.cc's State::transposed) holds exactly where MXFP8Tensor.empty's colwise data is [N, M]
    and the kernels write the copy transposed (KernelConfig.transposed)."""
    from mxq.frontend import codegen
    from mxq.runtime import limits

    op = mxq.fused_quant(colwise=True, **opts)(_ident)
    m, n = 200, 96
    t = mxq.MXFP8Tensor.empty(op.spec, (m, n), torch.bfloat16, "cpu")
    assert t.colwise_data.shape in ((m, n), (n, m))
    assert limits.cpp_transposed(op.spec) == (t.colwise_data.shape == (n, m))
    assert limits.cpp_transposed(op.spec) == codegen.kernel_config(op.spec, op.epilogue).transposed
    assert t.colwise_data.is_contiguous()


def _ident(x):
    return x


@pytest.fixture(scope="module")
def grouped_lib(tmp_path_factory):
    """An exported swizzled both-directions + dbias op with its grouped functions, loaded."""
    import tvm_ffi

    op = mxq.fused_quant(colwise=True, dbias=True, scale_layout="swizzled")(_ident)
    info = op.export(tmp_path_factory.mktemp("export") / "out", arch="sm_90", dtype="bf16", name="chk", grouped=True)
    return op, tvm_ffi.load_module(info["library"]), info["library"]


def _args(op, m, n, g=None, **wrong):
    """The positional arguments of the exported functions on CPU tensors of the sizes Python
    allocates; ``wrong``: {slot name: a replacement tensor}."""
    offs = None if g is None else torch.full((g,), m, dtype=torch.int32)
    t = mxq.MXFP8Tensor.empty(op.spec, (m, n), torch.bfloat16, "cpu", group_offsets=offs, row_align=1)
    ws_rows = groups.workspace_rows(m, g)
    args = dict(mIn0=torch.zeros(m, n, dtype=torch.bfloat16), mRowData=t.rowwise_data.view(torch.uint8),
                mRowScale=t.rowwise_scale.view(-1), mColData=t.colwise_data.view(torch.uint8),
                mColScale=t.colwise_scale.view(-1), mDbias=t.dbias, mDbiasWs=torch.zeros(ws_rows, n),
                mNoop=torch.zeros(1))
    if g is not None:
        args["mGroupEnds"] = offs
    args.update(wrong)
    return list(args.values())


def _error(fn, args):
    with pytest.raises(Exception) as e:
        fn(*args)
    return f"{type(e.value).__name__}: {e.value}"


@pytest.mark.parametrize("m, n", [(64, 96), (33, 200), (300, 40)])
def test_exported_function_refuses_buffers_of_the_wrong_size(grouped_lib, m, n):
    op, lib, _ = grouped_lib
    for fname in ("chk", "chk_rows8"):
        assert "expected device_type=cuda" in _error(lib[fname], _args(op, m, n)), fname  # sizes pass
        ok = _args(op, m, n)
        for i, slot in enumerate(("mRowScale", "mColScale", "mDbias")):
            t = ok[2 + 2 * i if slot != "mDbias" else 5]
            for bad in (t[:-1], torch.zeros(t.numel() + 1, dtype=t.dtype)):
                msg = _error(lib[fname], _args(op, m, n, **{slot: bad}))
                assert msg.startswith(f"ValueError: mxq: {fname}: argument #") and f"'{slot}'" in msg, msg
        if m > 1:  # FP8 rows may be padded (ld >= N), not overlap
            padded = torch.zeros(m, n + 16, dtype=torch.uint8)[:, :n]
            assert "expected device_type=cuda" in _error(lib[fname], _args(op, m, n, mRowData=padded))
            overlapping = torch.zeros(m * n, dtype=torch.uint8).as_strided((m, n), (n - 1, 1))
            msg = _error(lib[fname], _args(op, m, n, mColData=overlapping))
            assert "'mColData'" in msg and f"rows at least {n} elements apart (its row stride is {n - 1})" in msg, msg
            ws = torch.zeros(-(-m // 32) * n).as_strided((-(-m // 32), n), (n - 1, 1))
            if ws.shape[0] > 1:
                assert "'mDbiasWs'" in _error(lib[fname], _args(op, m, n, mDbiasWs=ws))
        for rows in (-(-m // 32) - 1, -(-m // 32) + 1):
            msg = _error(lib[fname], _args(op, m, n, mDbiasWs=torch.zeros(max(rows, 0), n)))
            assert "'mDbiasWs'" in msg and f"needs shape [{-(-m // 32)}, {n}]" in msg, msg


def test_exported_function_refuses_what_its_kernel_cannot_take(grouped_lib, raw_caller):
    """Before the compiled function runs: a first input with no rows or columns, or of 2^31
    elements or more (Python falls back to the reference there; an exported function has none),
    refused naming mIn0; FP8 data rows off 8-byte boundaries for "_rows8", naming the data; and
    from a C++ caller's raw DLTensor*, strides left NULL (the compiled function reads them), a null
    data pointer or a negative dimension, each naming the argument. Sound, the same call reaches
    the device check."""
    op, lib, _ = grouped_lib
    for m, n in ((0, 96), (64, 0)):
        args = _args(op, max(m, 1), max(n, 1))
        args[0] = torch.zeros(m, n, dtype=torch.bfloat16)
        msg = _error(lib["chk"], args)
        assert f"'mIn0' has shape [{m}, {n}]; the kernels take M, N >= 1 and fewer than 2^31" in msg, msg
    args = _args(op, 64, 96)
    args[0] = torch.zeros(1, dtype=torch.bfloat16).expand(2 ** 16, 2 ** 15)
    assert "'mIn0' has shape [65536, 32768]" in _error(lib["chk"], args)
    m, n = 64, 96
    for bad in (torch.zeros(m * n + 1, dtype=torch.uint8)[1:].view(m, n),  # (an address off 8 bytes)
                torch.zeros(m, n + 4, dtype=torch.uint8)[:, :n]):  # (rows 100 bytes apart)
        for slot in ("mRowData", "mColData"):
            msg = _error(lib["chk_rows8"], _args(op, m, n, **{slot: bad}))
            assert f"'{slot}' must hold rows that start on 8-byte boundaries" in msg, msg
            assert "expected device_type=cuda" in _error(lib["chk"], _args(op, m, n, **{slot: bad}))
    padded = torch.zeros(m, n + 8, dtype=torch.uint8)[:, :n]
    assert "expected device_type=cuda" in _error(lib["chk_rows8"], _args(op, m, n, mRowData=padded))
    import tvm_ffi

    args = _args(op, m, n)
    assert "expected device_type=cuda" in raw_caller.raw_call_error(lib["chk"], args, -1, "")
    for index, name in ((0, "mIn0"), (1, "mRowData"), (2, "mRowScale"), (5, "mDbias")):
        for how, words in (("strides", "has no strides (a DLTensor whose strides are NULL)"),
                           ("data", "has elements but no data (a null pointer)"),
                           ("negative", "a negative dimension"),
                           ("negstride", "has a negative stride"),
                           ("null", "is a null DLTensor pointer"),
                           ("overflow", "more elements or bytes than an int64 counts")):
            if how == "overflow" and args[index].dim() == 1:
                continue  # (2^62 + 1 elements of one byte: an int64 counts them; the size check refuses them)
            msg = raw_caller.raw_call_error(lib["chk"], args, index, how)
            assert msg.startswith(f"ValueError: mxq: chk: argument #{index} '{name}' ") and words in msg, (how, msg)
    assert isinstance(lib["chk"], tvm_ffi.Function)


def test_exported_function_refuses_outputs_that_share_memory(grouped_lib):
    """An output sharing memory with another output or with an input (csrc/spans.h) is refused
    naming both; apart (the same sizes) the call reaches the device check."""
    op, lib, _ = grouped_lib
    m, n = 64, 96
    # (slot index, what to put there made from the same call's other arguments, the refusal)
    cases = ((3, lambda a: a[1], "'mColData' overlaps argument #1 'mRowData'"),
             (1, lambda a: a[0].view(torch.uint8).view(-1)[:m * n].view(m, n), "'mRowData' overlaps argument #0 'mIn0'"),
             (5, lambda a: a[0][5], "'mDbias' overlaps argument #0 'mIn0'"),
             (4, lambda a: a[6].view(torch.uint8).view(-1)[:a[4].numel()], "'mDbiasWs' overlaps argument #4 'mColScale'"),
             (7, lambda a: a[6].view(-1)[:1], "'mDbiasWs' overlaps argument #7 'mNoop'"))
    for slot, make, words in cases:
        for fname in ("chk", "chk_vec"):
            args = _args(op, m, n)
            args[slot] = make(args)
            msg = _error(lib[fname], args)
            assert msg.startswith(f"ValueError: mxq: {fname}: argument #") and words in msg, msg
    assert "expected device_type=cuda" in _error(lib["chk"], _args(op, m, n))


def test_exported_grouped_function_checks_its_grouped_sizes(grouped_lib):
    op, lib, _ = grouped_lib
    m, n = 200, 96
    for g in (1, 3):
        args = _args(op, m, n, g)
        assert "expected device_type=cuda" in _error(lib["chk_grouped"], args)
        overlapping = torch.zeros(g * n, dtype=torch.bfloat16).as_strided((g, n), (n - 1, 1))
        for slot, bad in (("mRowScale", args[2][:-128]), ("mColScale", args[4][:-1]),
                          ("mDbias", torch.zeros(g + 1, n, dtype=torch.bfloat16)),
                          *((("mDbias", overlapping),) if g > 1 else ()),
                          ("mDbiasWs", torch.zeros(groups.grouped_colwise_rows(m, g) + 1, n))):
            msg = _error(lib["chk_grouped"], _args(op, m, n, g, **{slot: bad}))
            assert f"'{slot}'" in msg and f"G = {g}" in msg, msg
        # an ungrouped call's buffers are not a grouped call's
        ungrouped = _args(op, m, n)
        msg = _error(lib["chk_grouped"], ungrouped[:2] + [args[2]] + ungrouped[3:] + [args[-1]])
        assert "'mColScale'" in msg, msg
    # no group (the kernels would take all rows as one, which buffers sized for none do not
    # hold), and more groups than the dbias reduction serves
    for ends in (torch.zeros(0, dtype=torch.int32), torch.full((groups.MAX_GROUPS + 1,), m, dtype=torch.int32)):
        msg = _error(lib["chk_grouped"], _args(op, m, n, 1)[:-1] + [ends])
        assert f"'mGroupEnds' has {ends.numel()} group ends; a grouped call takes 1 to {groups.MAX_GROUPS}" in msg, msg


def test_exported_function_refuses_other_dtypes_by_name(grouped_lib):
    """FP8 data and E8M0 scales are uint8 bytes and the group ends int32 (the header's dtypes):
    another one-byte dtype (int8, an FP8 or E8M0 dtype) or uint32 ends are refused naming the
    argument (the compiled function's own check let int8 and uint32 through, read as other
    values); uint8 and int32 reach the device check."""
    op, lib, _ = grouped_lib
    m, n = 64, 96
    args = _args(op, m, n)
    for slot, at, dtype, words in (("mRowData", 1, torch.int8, "the data is passed as uint8 bytes"),
                                   ("mColData", 3, torch.float8_e4m3fn, "the data is passed as uint8 bytes"),
                                   ("mRowScale", 2, torch.int8, "this op's scales are uint8 (E8M0 bytes)"),
                                   ("mColScale", 4, torch.float8_e8m0fnu, "this op's scales are uint8 (E8M0 bytes)")):
        msg = _error(lib["chk"], _args(op, m, n, **{slot: args[at].view(dtype)}))
        assert f"'{slot}' has dtype" in msg and words in msg, msg
    ends = _args(op, m, n, 2)[-1]
    for bad in (ends.view(torch.uint32), ends.long()):
        msg = _error(lib["chk_grouped"], _args(op, m, n, 2, mGroupEnds=bad))
        assert "'mGroupEnds' has dtype" in msg and "the group ends are int32" in msg, msg
    assert "expected device_type=cuda" in _error(lib["chk_grouped"], _args(op, m, n, 2))


def test_unreadable_arguments_are_left_to_the_compiled_function(grouped_lib):
    """A wrong count, a non-tensor or a 1-D first input: the compiled function's own messages."""
    op, lib, _ = grouped_lib
    args = _args(op, 64, 96)
    assert _error(lib["chk"], args[:3]).startswith("TypeError: Expects 8 parameters")
    assert "Mismatched" in _error(lib["chk"], args[:2] + [1.0] + args[3:])  # (its first complaint: the device)
    assert "Mismatched Tensor on argument #0" in _error(lib["chk"], [torch.zeros(96, dtype=torch.bfloat16)] + args[1:])


def test_only_the_checked_names_are_exported(grouped_lib):
    """(The compiled functions are linked in under hidden names: callers cannot skip the check.)"""
    path = grouped_lib[2]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in syms.splitlines())
    assert names == sorted(f"__tvm_ffi_chk{s}" for s in ("", "_vec", "_rows8", "_grouped", "_vec_grouped"))
    # (the header's include guard is prefixed: an export named tvm_ffi_function would otherwise hold
    # TVM-FFI's own tvm/ffi/function.h guard, TVM_FFI_FUNCTION_H_, and hide that header)
    header = (Path(path).parent / "chk.h").read_text()
    assert "#ifndef MXQ_EXPORT_CHK_H_\n#define MXQ_EXPORT_CHK_H_" in header


@pytest.mark.parametrize("direction", ["backward", "forward"])
def test_exported_gated_op_checks_its_output_width(tmp_path, direction):
    """A gated backward's outputs are [M, 2N] for [M, N] arguments (its kernels are a two-halves
    op), a gated forward's [M, N] (they are not): outputs of that width pass, of the other width
    are refused by name, and so is a scale buffer sized for the other width (the scales are flat:
    the signature alone lets any length through)."""
    import tvm_ffi

    bwd = direction == "backward"
    op = mxq.fused_quant(colwise=True, **({"dact": "swiglu"} if bwd else {"act": "swiglu"}))(_ident)
    info = op.export(tmp_path / "out", arch="sm_90", dtype="bf16", name="g")
    lib = tvm_ffi.load_module(info["library"])
    m, n = 64, 96
    a = torch.zeros(m, 2 * n, dtype=torch.bfloat16)
    lead = [torch.zeros(m, n, dtype=torch.bfloat16)] if bwd else []  # (the backward's gradient)
    width, other = (2 * n, n) if bwd else (n, 2 * n)

    def args(out):
        return lead + [a[:, :n], a[:, n:], out.rowwise_data.view(torch.uint8), out.rowwise_scale.view(-1),
                       out.colwise_data.view(torch.uint8), out.colwise_scale.view(-1), torch.zeros(1)]

    right = mxq.MXFP8Tensor.empty(op.spec, (m, width), torch.bfloat16, "cpu")
    wrong = mxq.MXFP8Tensor.empty(op.spec, (m, other), torch.bfloat16, "cpu")
    for fname in info["functions"]:
        assert "expected device_type=cuda" in _error(lib[fname], args(right)), fname
        msg = _error(lib[fname], args(wrong))
        assert "'mRowData'" in msg and f"needs shape [{m}, {width}]" in msg, msg
        mixed = args(right)
        mixed[-2] = wrong.colwise_scale.view(-1)
        msg = _error(lib[fname], mixed)
        assert "'mColScale'" in msg and f"needs {-(-m // 32) * width} elements" in msg, msg
