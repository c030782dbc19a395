"""The disk cache of compiled kernels and AOT export, on a CPU machine (no launch needed)."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mxq
import mxq._version
from mxq.runtime import cache, compiler, targets
from mxq.op import _quantize_op
from mxq.frontend.spec import QuantSpec

ROOT = Path(__file__).resolve().parent.parent
SPEC = QuantSpec(rowwise=True, colwise=True, amax=True, scale_mode="floor")


def _fresh(code: str, cache: Path, **env):
    e = dict(os.environ, MXQ_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore", **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=600, env=e, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


LOAD = """
    import sys, time
    import tvm_ffi
    from mxq.runtime import cache, compiler, targets
    from mxq.op import _quantize_op
    from mxq.frontend.spec import QuantSpec
    op = _quantize_op(QuantSpec(rowwise=True, colwise=True, amax=True, scale_mode="floor"))
    op.source
    t = time.perf_counter()
    fn = compiler.native_function(op, "sm_90", "bf16", "vec")
    ms = (time.perf_counter() - t) * 1000
    print(type(fn).__name__, round(ms, 2), "cutlass" in sys.modules)
"""


def test_compiled_once_then_loaded_from_disk_without_cutlass(tmp_path):
    first = _fresh(LOAD, tmp_path).split()
    assert first[0] == "Function" and first[2] == "True"  # compiled: cutlass was needed
    assert len(list((tmp_path / "kernels").rglob("*.so"))) == 1
    second = _fresh(LOAD, tmp_path).split()
    assert second[0] == "Function" and second[2] == "False", "a cached kernel loads without cutlass"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_damaged_library_is_rebuilt_not_loaded(tmp_path, damage):
    """A cached library is loaded only if its recorded SHA-256 matches: half a file (which
    loaded and then died with SIGBUS at the first call) or flipped bytes inside the embedded
    cubin are rebuilt (the rebuild needs cutlass: that is how the test sees it)."""
    _fresh(LOAD, tmp_path)
    (so,) = (tmp_path / "kernels").rglob("*.so")
    data = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        at = data.find(b"\x7fELF", 64)  # the embedded cubin's ELF header, past the library's own
        at = at + 200 if at > 0 else len(data) // 2
        so.write_bytes(data[:at] + bytes(b ^ 0x5A for b in data[at:at + 64]) + data[at + 64:])
    else:
        so.write_bytes(b"not a shared library")
    out = _fresh(LOAD, tmp_path).split()
    assert out[0] == "Function" and out[2] == "True", "rebuilt, hence compiled"
    assert so.read_bytes() == data or so.stat().st_size > 10000
    assert cache.verified(so)


def test_libraries_swapped_between_keys_are_rebuilt_not_loaded(tmp_path):
    """Two keys' libraries and digests swapped (each pair whole): a digest belongs to its key, so
    each op rebuilds its own library instead of loading the other op's (which computed x*2.0 for
    x*3.0)."""
    other = LOAD.replace('scale_mode="floor"', 'scale_mode="ceil"')
    _fresh(LOAD, tmp_path)
    _fresh(other, tmp_path)
    a, b = sorted((tmp_path / "kernels").rglob("*.so"))
    pairs = [(p.read_bytes(), p.with_suffix(".sha256").read_bytes()) for p in (a, b)]
    for p, (so, sha) in zip((b, a), pairs):
        p.write_bytes(so)
        p.with_suffix(".sha256").write_bytes(sha)
    assert not cache.verified(a) and not cache.verified(b)
    for code in (LOAD, other):
        out = _fresh(code, tmp_path).split()
        assert out[0] == "Function" and out[2] == "True", "rebuilt, hence compiled"
    assert cache.verified(a) and cache.verified(b)


def test_truncated_library_with_a_matching_digest_is_rebuilt(tmp_path):
    """A library cut short whose digest was recorded for the cut file (so the digest matches):
    its ELF segments reach past its end, which would map past the file (SIGBUS); it is rebuilt."""
    _fresh(LOAD, tmp_path)
    (so,) = (tmp_path / "kernels").rglob("*.so")
    data = so.read_bytes()
    assert cache.elf_within(data)
    cut = data[: len(data) * 3 // 4]
    so.write_bytes(cut)
    so.with_suffix(".sha256").write_text(cache._digest(cut, f"{so.parent.name}/{so.name}"))
    assert not cache.verified(so)
    out = _fresh(LOAD, tmp_path).split()
    assert out[0] == "Function" and out[2] == "True", "rebuilt, hence compiled"
    assert cache.verified(so)


def test_bytecode_beside_a_generated_module_is_never_read(tmp_path):
    """A generated module runs from its source (compiler.load_module): no .pyc is written, and
    neither a damaged one ("bad marshal data" failed every later compile of the op) nor another
    module's bytecode that Python would trust (an unchecked hash-based .pyc: a kernel of another
    op) is read in its place."""
    import py_compile

    code = """
        from mxq.runtime import compiler
        from mxq.op import _quantize_op
        from mxq.frontend.spec import QuantSpec
        mod = compiler.load_module(_quantize_op(QuantSpec(colwise=True)).source)
        print(type(mod.QUANTIZE).__name__)
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    e = dict(env, MXQ_CACHE_DIR=str(tmp_path), PYTHONWARNINGS="ignore")
    run = lambda: subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,  # noqa: E731
                                 text=True, timeout=600, env=e, cwd=ROOT)
    assert run().stdout.split() == ["Quantize"]
    assert not list((tmp_path / "src").rglob("*.pyc"))
    (module,) = (tmp_path / "src").glob("mxq_gen_*.py")
    pyc = Path(importlib.util.cache_from_source(str(module)))
    other = tmp_path / "other.py"
    other.write_text("QUANTIZE = 'planted'\n")
    py_compile.compile(str(other), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    r = run()
    assert r.returncode == 0 and r.stdout.split() == ["Quantize"], r.stderr[-2000:]
    pyc.write_bytes(pyc.read_bytes()[:16] + b"\xff" * 64)  # (damaged: the header kept)
    r = run()
    assert r.returncode == 0 and r.stdout.split() == ["Quantize"], r.stderr[-2000:]


def test_directories_in_place_of_cache_files_are_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    op = _quantize_op(QuantSpec(rowwise=True, colwise=True, scale_mode="ceil"))
    sha = __import__("hashlib").sha256(op.source.encode()).hexdigest()[:32]
    base = cache.kernel_cache_dir("sm_90") / f"{sha}_bf16_vec"
    for suffix in (".so", ".lock"):
        (base.parent / (base.name + suffix)).mkdir(parents=True)
    src = cache.source_file(op.source)
    src.unlink()
    src.mkdir()
    compiler._native.clear()
    fn = compiler.native_function(op, "sm_90", "bf16", "vec")
    assert type(fn).__name__ == "Function" and cache.verified(base.with_suffix(".so"))
    assert cache.source_file(op.source).read_text() == op.source


def test_an_unwritable_cache_writes_the_module_into_a_directory_of_its_own(tmp_path, monkeypatch):
    """Where the cache cannot hold the generated module, it goes to a directory this process made
    (mode 0700, a name nobody could take first), not the fixed /tmp/mxq-src-<uid> another user
    could create beforehand and plant bytecode in: one squatted here is left unused."""
    import tempfile

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MXQ_CACHE_DIR", str(blocker / "cache"))  # (under a file: not creatable)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cache, "_private_dir", None)
    monkeypatch.setattr(cache, "_warned", set())  # (the warning is once a process: this test's own)
    squatted = tmp_path / f"mxq-src-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    op = _quantize_op(QuantSpec(colwise=True, scale_mode="even", amax=True))
    with pytest.warns(RuntimeWarning, match="not writable"):
        path = cache.source_file(op.source)
    assert path.read_text() == op.source and path.parent != squatted and not any(squatted.iterdir())
    assert path.parent.parent == tmp_path and path.parent.stat().st_mode & 0o777 == 0o700
    assert cache.source_file(op.source) == path  # (the same directory for the process's later modules)


def test_invalid_utf8_source_file_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    op = _quantize_op(QuantSpec(colwise=True, scale_mode="even"))
    path = cache.source_file(op.source)
    path.write_bytes(b"\xff\xfe not utf-8 \x80")
    assert cache.source_file(op.source) == path and path.read_text() == op.source


def test_unwritable_cache_loads_a_valid_library_or_compiles_in_memory(tmp_path, monkeypatch):
    """A read-only cache (simulated: root ignores permission bits) still serves a valid library
    without compiling; without one, the kernel compiles in memory with a one-time warning."""
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    op = _quantize_op(QuantSpec(rowwise=False, colwise=True, scale_mode="floor", amax=True))
    compiler._native.clear()
    compiler.native_function(op, "sm_90", "bf16", "vec")  # a valid library on disk

    def read_only(self):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache.FileLock, "__enter__", read_only)
    compiler._native.clear()
    monkeypatch.setattr(compiler, "compile_op", lambda *a, **k: pytest.fail("compiled despite a valid library"))
    assert type(compiler.native_function(op, "sm_90", "bf16", "vec")).__name__ == "Function"
    monkeypatch.undo()
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache.FileLock, "__enter__", read_only)
    compiler._native.clear()
    cache._warned.discard("kernel disk cache not writable")
    with pytest.warns(RuntimeWarning, match="not writable"):
        fn = compiler.native_function(op, "sm_90", "bf16", "generic")  # not on disk: compiled in memory
    assert fn is not None


def test_cache_path_that_is_a_file_degrades_to_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("MXQ_CACHE_DIR", str(blocker))
    op = _quantize_op(QuantSpec(rowwise=True, scale_mode="even", fp8="e5m2"))
    compiler._native.clear()
    cache._warned.clear()
    with pytest.warns(RuntimeWarning):
        fn = compiler.native_function(op, "sm_90", "fp16", "vec")
    assert fn is not None and blocker.read_text().startswith("a file")


def test_damaged_file_is_rebuilt(tmp_path):
    _fresh(LOAD, tmp_path)
    (so,) = (tmp_path / "kernels").rglob("*.so")
    so.write_bytes(b"not a shared library")
    out = _fresh(LOAD, tmp_path).split()
    assert out[0] == "Function" and out[2] == "True"  # rebuilt, hence compiled
    assert so.stat().st_size > 10000


def test_always_compile_bypasses_the_disk(tmp_path):
    out = _fresh(LOAD, tmp_path, MXQ_ALWAYS_COMPILE="1").split()
    assert out[2] == "True", out  # compiled in-process (cutlass imported)
    assert not list(tmp_path.rglob("*.so"))


def test_cache_environment_values(monkeypatch):
    """MXQ_KERNEL_CACHE_SIZE: a positive integer, set but empty the default (as MXQ_CACHE_DIR); a
    bad value is named with the variable. MXQ_CACHE_DIR expands ``~``."""
    for raw, want in (("", 256), (" 7 ", 7), ("1", 1)):
        monkeypatch.setenv("MXQ_KERNEL_CACHE_SIZE", raw)
        assert cache.cache_size() == want
    for raw in ("0", "-1", "abc", "1e3"):
        monkeypatch.setenv("MXQ_KERNEL_CACHE_SIZE", raw)
        with pytest.raises(ValueError, match=f"MXQ_KERNEL_CACHE_SIZE must be a positive integer, got '{raw}'"):
            cache.cache_size()
    monkeypatch.setenv("MXQ_CACHE_DIR", "~/mxq-cache-here")
    assert cache.cache_dir() == Path.home() / "mxq-cache-here"
    monkeypatch.setenv("MXQ_CACHE_DIR", "")
    assert cache.cache_dir() == Path.home() / ".cache" / "mxq"


def test_cache_dir_is_keyed_by_versions_and_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    a, b = cache.kernel_cache_dir("sm_90"), cache.kernel_cache_dir("sm_100a")
    assert a != b and a.parent == b.parent == tmp_path / "kernels"
    monkeypatch.setattr(mxq._version, "__version__", "9.9.9")
    assert cache.kernel_cache_dir("sm_90") != a


def test_export_writes_library_and_header_loadable_without_cutlass(tmp_path):
    op = mxq.fused_quant(colwise=True, dbias=True)(_residual)
    info = op.export(tmp_path / "out", arch="sm_90", dtype="bf16", name="residual_q")
    lib, header = Path(info["library"]), Path(info["header"])
    assert lib.is_file() and header.is_file()
    text = header.read_text()
    assert '"residual_q"' in text and '"residual_q_vec"' in text and "workspace" in text
    assert info["functions"] == ["residual_q", "residual_q_vec", "residual_q_rows8"]
    assert '#define RESIDUAL_Q_ROWS8_NAME "residual_q_rows8"' in text
    out = _fresh(f"""
        import sys, tvm_ffi, torch
        m = tvm_ffi.load_module({str(lib)!r})
        f, fv, f8 = m["residual_q"], m["residual_q_vec"], m["residual_q_rows8"]
        x = torch.zeros(4, 32, dtype=torch.bfloat16)
        try:
            f(x)
        except Exception as e:
            print(type(e).__name__)
        print("cutlass" in sys.modules)
    """, tmp_path)
    assert out.split() == ["TypeError", "False"]  # a clean error, and no cutlass in the process


def _bias_gelu(x, b, scale: float = 1.0):
    return (x + b) * scale


def test_export_with_operand_kinds(tmp_path):
    """operands= compiles kernels for a bias [N] read as a stride-(0, 1) row and a strided first
    input; the header says which strides each takes, and the library loads without cutlass."""
    op = mxq.fused_quant(colwise=True, act="gelu")(_bias_gelu)
    info = op.export(tmp_path / "out", arch="sm_90", dtype="bf16", name="bias_q", operands=("strided", "row"))
    text = Path(info["header"]).read_text()
    assert "mIn0        (x): strides (ld, 1), ld >= N" in text and "mIn1        (b): strides (0, 1)" in text
    plain = op.export(tmp_path / "plain", arch="sm_90", dtype="bf16", name="bias_p")
    assert "strides (0, 1)" not in Path(plain["header"]).read_text()
    out = _fresh(f"""
        import sys, tvm_ffi
        m = tvm_ffi.load_module({info["library"]!r})
        print(m["bias_q"] is not None, m["bias_q_vec"] is not None, "cutlass" in sys.modules)
    """, tmp_path)
    assert out.split() == ["True", "True", "False"]


@pytest.mark.gpu
def test_exported_operand_kinds_run_on_cuda(tmp_path):
    """The exported kernels of a strided x and a row bias, called with x[:, :N] and b.expand(M, N):
    the bytes of the Python call (the GPU counterpart of the test above)."""
    import tvm_ffi

    from mxq.runtime import cache, compiler, targets
    from mxq.testing import compare

    op = mxq.fused_quant(colwise=True, act="gelu")(_bias_gelu)
    arch = targets.device_arch(torch.device("cuda"))
    info = op.export(tmp_path / "out", arch=arch, dtype="bf16", name="bias_q", operands=("strided", "row"))
    lib = tvm_ffi.load_module(info["library"])
    xx = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    x, b = xx[:, :256], torch.randn(256, device="cuda", dtype=torch.bfloat16)
    want = op(x, b, 0.5)
    for fname in ("bias_q", "bias_q_vec"):
        got = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)
        lib[fname](x, b.expand(256, 256), 0.5, got.rowwise_data.view(torch.uint8), got.rowwise_scale.view(-1),
                   got.colwise_data.view(torch.uint8), got.colwise_scale.view(-1),
                   torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()
        assert compare(got, want, exact=False) == [], fname


def _gate_bias(x, b):
    return x + b


def _grad_identity(x):
    return x


def test_gated_forward_exports_its_halves_kernels(tmp_path):
    """A gated forward exports the kernels over the halves: each [M, 2N] tensor goes in as two
    [M, N] views (gate halves first), full tensors' halves as strided views, other kinds as they
    are; the header says so. (The backward: test_gated_backward_exports_its_two_halves_kernels.)"""
    fwd = mxq.fused_quant(act="swiglu", colwise=True)(_gate_bias)
    info = fwd.export(tmp_path / "out", arch="sm_90", dtype="bf16", operands=("full", "row"))
    assert info["functions"] == ["mxq__gate_bias", "mxq__gate_bias_vec", "mxq__gate_bias_rows8"]
    text = " ".join(Path(info["header"]).read_text().replace(" * ", " ").split())
    assert ("Gated op _gate_bias (act='swiglu'): its [M, 2N] tensors go in as their two halves, every gate half "
            "first, then every up half: x = x[:, :N], _mxq_up_x = x[:, N:]; b = b[:N], _mxq_up_b = b[N:] (as "
            "[M, N] views of strides (0, 1)). The outputs are those of an [M, N] input.") in text
    for i, (p, doc) in enumerate((("x", "strides (ld, 1)"), ("b", "strides (0, 1)"), ("_mxq_up_x", "strides (ld, 1)"),
                                  ("_mxq_up_b", "strides (0, 1)"))):
        assert f"mIn{i} ({p}): {doc}" in text, (i, p)
    out = _fresh(f"""
        import sys, tvm_ffi
        m = tvm_ffi.load_module({info["library"]!r})
        print(m["mxq__gate_bias_rows8"] is not None, "cutlass" in sys.modules)
    """, tmp_path)
    assert out.split() == ["True", "False"]
    with pytest.raises(ValueError, match="sequence of 2 kind"):
        fwd.export(tmp_path / "bad", operands=("full",))


def test_gated_backward_exports_its_two_halves_kernels(tmp_path, monkeypatch):
    """A gated backward exports its inner op: the gradient(s) as they are, then act_input's two
    halves as strided views; the outputs (data, scales, dbias and its workspace) are documented
    2N wide; with rowwise output every function refuses an N that is not a multiple of 32 (a
    rowwise block would straddle the halves: compiled in as N's divisibility, which TVM-FFI
    checks, see tests/test_gpu.py's counterpart), and "_rows8" an N % 8 != 0 (its second half
    starts at column N); a grouped export adds the grouped kernels, their buffers 2N wide too
    (one grouped export checks both kinds)."""
    from mxq.runtime import export as export_mod

    seen = {}
    real = export_mod.compile_op

    def spy(op, arch, dtype, variant="vec", layouts=None, n_multiple=1):
        seen[variant] = n_multiple
        return real(op, arch, dtype, variant=variant, layouts=layouts, n_multiple=n_multiple)

    monkeypatch.setattr(export_mod, "compile_op", spy)
    bwd = mxq.fused_quant(dact="swiglu", dbias=True, colwise=True)(_gate_bias)
    # (one grouped export: it holds the ungrouped functions and documents both kinds' buffers)
    info = bwd.export(tmp_path / "out", arch="sm_90", dtype="bf16", name="bw", operands=("full", "row"), grouped=True)
    assert info["functions"] == ["bw", "bw_vec", "bw_rows8", "bw_grouped", "bw_vec_grouped"]
    assert {v: seen[v] for v in ("generic", "vec", "rows8", "vec_grouped")} == {
        "generic": 32, "vec": 32, "rows8": 32, "vec_grouped": 32}
    text = " ".join(Path(info["header"]).read_text().replace(" * ", " ").split())
    assert ("Gated backward _gate_bias (dact='swiglu'): the arguments are the incoming gradient (x, b, [M, N]), "
            "then act_input (the forward's [M, 2N] input) as its two halves, _mxq_gate = act_input[:, :N] and "
            "_mxq_up = act_input[:, N:] (strided views).") in text
    assert "N must be a multiple of 32" in text and '"_rows8" also needs N % 8 == 0' in text
    lines = " ".join(Path(info["header"]).read_text().split())  # (the header's own " * " kept)
    for doc in ("mRowData uint8[M, 2N]", "mColScale uint8[ceil(M/32) * 2N]", "mDbias bfloat16[2N]",
                "mDbiasWs float32[ceil(M/32), 2N]", "mIn1 (b): strides (0, 1)", "mIn2 (_mxq_gate): strides (ld, 1)",
                "mIn3 (_mxq_up): strides (ld, 1)", '"bw_rows8" serves any M and N % 8 == 0',
                "mColScale uint8[(M//32 + G) * 2N]", "mDbias bfloat16[G, 2N]", "mDbiasWs float32[M//32 + G, 2N]"):
        assert doc in lines, doc
    assert " s0 " not in lines  # (the kernels' own half parameter is no argument)
    seen.clear()
    colwise = mxq.fused_quant(dact="geglu", rowwise=False, colwise=True)(_gate_bias)
    colwise.export(tmp_path / "col", arch="sm_90", dtype="bf16")
    assert seen == {"generic": 1, "vec": 1, "rows8": 8}
    assert "multiple of 32" not in Path(tmp_path / "col" / "mxq__gate_bias.h").read_text()
    # the multiple reaches the compiled signature as N's divisibility (what TVM-FFI checks)
    inner = bwd.inner
    for vec, mult, want in ((False, 32, 32), (True, 32, 32), (True, 1, 8), (False, 1, 1), (False, 8, 8)):
        n = compiler.fake_args(inner, "bf16", False, "sm_90", vec=vec, n_multiple=mult)[0].shape[1]
        assert n.divisibility == want, (vec, mult, n)


@pytest.mark.gpu
def test_exported_gated_forward_runs_on_cuda(tmp_path):
    """The exported swiglu forward called with the halves x[:, :N], x[:, N:] and a bias's halves:
    the bytes of the Python call (the GPU counterpart of the test above)."""
    import tvm_ffi

    from mxq.testing import compare

    fwd = mxq.fused_quant(act="swiglu", colwise=True)(_gate_bias)
    arch = targets.device_arch(torch.device("cuda"))
    info = fwd.export(tmp_path / "out", arch=arch, dtype="bf16", name="sw", operands=("full", "row"))
    lib = tvm_ffi.load_module(info["library"])
    m, n = 256, 320
    x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2 * n, device="cuda", dtype=torch.bfloat16)
    want = fwd(x, b)
    for fname in ("sw", "sw_vec", "sw_rows8"):
        got = mxq.MXFP8Tensor.empty(fwd.spec, (m, n), x.dtype, x.device)
        lib[fname](x[:, :n], b[:n].expand(m, n), x[:, n:], b[n:].expand(m, n), got.rowwise_data.view(torch.uint8),
                   got.rowwise_scale.view(-1), got.colwise_data.view(torch.uint8), got.colwise_scale.view(-1),
                   torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()
        assert compare(got, want, exact=False) == [], fname


@pytest.mark.gpu
def test_exported_gated_backward_runs_on_cuda(tmp_path):
    """The exported swiglu backward + dbias called with the gradient and act_input's halves:
    the data and scale bytes of the Python call and its dbias (to rounding: the kernels' block
    sums may run in another order), from each function ("_rows8" into rows padded to 16 bytes);
    an N that is not a multiple of 32 is refused by name (the GPU counterpart of
    test_gated_backward_exports_its_two_halves_kernels)."""
    import tvm_ffi

    bwd = mxq.fused_quant(dact="swiglu", dbias=True, colwise=True)(_grad_identity)
    arch = targets.device_arch(torch.device("cuda"))
    info = bwd.export(tmp_path / "out", arch=arch, dtype="bf16", name="swb")
    lib = tvm_ffi.load_module(info["library"])

    def args(out, g, a, n):
        ws = torch.empty((g.shape[0] + 31) // 32, 2 * n, device="cuda", dtype=torch.float32)
        return (g, a[:, :n], a[:, n:], out.rowwise_data.view(torch.uint8), out.rowwise_scale.view(-1),
                out.colwise_data.view(torch.uint8), out.colwise_scale.view(-1), out.dbias, ws,
                torch.zeros(1, device="cuda"))

    m, n = 256, 320
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
    want = bwd(g, act_input=a)
    for fname, row_align in (("swb", 1), ("swb_vec", 1), ("swb_rows8", 16)):
        got = mxq.MXFP8Tensor.empty(bwd.spec, (m, 2 * n), g.dtype, g.device, row_align=row_align)
        lib[fname](*args(got, g, a, n))
        torch.cuda.synchronize()
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
            assert torch.equal(getattr(got, f).view(torch.uint8), getattr(want, f).view(torch.uint8)), (fname, f)
        assert torch.allclose(got.dbias.float(), want.dbias.float(), rtol=2 ** -7, atol=1e-3), fname
    n = 40  # rowwise blocks would straddle the halves
    g, a = g[:, :n].contiguous(), a[:, :2 * n].contiguous()
    got = mxq.MXFP8Tensor.empty(bwd.spec, (m, 2 * n), g.dtype, g.device)
    with pytest.raises(ValueError, match="divisible by 32"):
        lib["swb"](*args(got, g, a, n))


@pytest.mark.gpu
def test_exported_grouped_gated_backward_runs_on_cuda(tmp_path):
    """The exported grouped swiglu backward + dbias (swizzled scales), called with the gradient,
    act_input's halves and int32 group ends (an empty group among them): the data and scale
    bytes of the Python grouped call and its [G, 2N] dbias (to rounding)."""
    import tvm_ffi

    from mxq.formats import groups

    bwd = mxq.fused_quant(dact="swiglu", dbias=True, colwise=True, scale_layout="swizzled")(_grad_identity)
    arch = targets.device_arch(torch.device("cuda"))
    info = bwd.export(tmp_path / "out", arch=arch, dtype="bf16", name="gswb", grouped=True)
    lib = tvm_ffi.load_module(info["library"])
    m, n = 300, 320
    offs = torch.tensor([70, 70, 200, 300], dtype=torch.int32, device="cuda")
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
    want = bwd(g, act_input=a, group_offsets=offs)
    for fname in ("gswb_grouped", "gswb_vec_grouped"):
        got = mxq.MXFP8Tensor.empty(bwd.spec, (m, 2 * n), g.dtype, g.device, group_offsets=offs)
        ws = torch.empty(groups.workspace_rows(m, offs.numel()), 2 * n, device="cuda", dtype=torch.float32)
        lib[fname](g, a[:, :n], a[:, n:], got.rowwise_data.view(torch.uint8), got.rowwise_scale.view(-1),
                   got.colwise_data.view(torch.uint8), got.colwise_scale.view(-1), got.dbias, ws,
                   torch.zeros(1, device="cuda"), offs)
        torch.cuda.synchronize()
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
            assert torch.equal(getattr(got, f).view(torch.uint8), getattr(want, f).view(torch.uint8)), (fname, f)
        assert got.dbias.shape == (4, 2 * n)
        assert torch.allclose(got.dbias.float(), want.dbias.float(), rtol=2 ** -7, atol=1e-3), fname


def test_every_operand_kind_has_its_header_doc():
    from mxq.runtime import export

    assert set(export.OPERAND_DOC) == set(compiler.LAYOUT_CODES)


@pytest.mark.parametrize("operands, match", [
    (("full",), "sequence of 2 kind"), ("full,row", "sequence of 2 kind"),
    (("full", "bias"), "'b' has kind 'bias'"), (("col", "full"), "must be 'full' or 'strided'")])
def test_export_operand_kinds_are_checked(tmp_path, operands, match):
    op = mxq.fused_quant()(_bias_gelu)
    with pytest.raises(ValueError, match=match):
        op.export(tmp_path, operands=operands)


def test_export_rejects_bad_arguments(tmp_path):
    op = _quantize_op(SPEC)
    with pytest.raises(ValueError, match="identifier"):
        op.export(tmp_path, name="bad-name")
    with pytest.raises(ValueError, match="arch"):
        op.export(tmp_path, arch="hopper")


def _residual(x, r):
    return x + r


def test_in_process_caches_are_bounded(monkeypatch, tmp_path):
    """Issue 21 item 12: compiled kernels, generated modules (and their sys.modules entries) and
    native functions are kept in LRUs (MXQ_KERNEL_CACHE_SIZE, default 256); an evicted kernel
    compiles again on use."""
    import sys

    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    lru = cache.LRU(2, on_evict=lambda k, v: evicted.append(k))
    evicted = []
    for k in "abc":
        lru[k] = k.upper()
    assert list(lru) == ["b", "c"] and evicted == ["a"]
    assert lru.get("b") == "B" and list(lru) == ["c", "b"], "get marks an entry as recent"
    monkeypatch.setattr(compiler._compiled, "maxsize", 2)
    monkeypatch.setattr(compiler._modules, "maxsize", 2)

    def make(c):
        def shifted(x):
            return x + c

        return mxq.fused_quant()(shifted)

    ops = [make(c) for c in (0.375, 0.625, 0.875)]
    names = [cache.source_file(op.source).stem for op in ops]
    for op in ops:
        compiler.compile_op(op, "sm_90", "bf16", variant="generic")
    assert len(compiler._compiled) <= 2 and len(compiler._modules) <= 2
    assert names[0] not in sys.modules, "an evicted module leaves sys.modules too"
    assert ".entry" in ops[0].asm("sm_90", "bf16", )["ptx"]  # evicted: compiled again


def test_concurrent_first_calls_load_a_library_once(monkeypatch, tmp_path):
    import threading

    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    op = _quantize_op(QuantSpec(rowwise=True, colwise=True, scale_mode="ceil", fp8="e5m2"))
    compiler.native_function(op, "sm_90", "fp16", "generic")  # on disk
    compiler._native.clear()
    loads = []
    real = cache.load_function
    monkeypatch.setattr(cache, "load_function", lambda p, n: loads.append(p) or real(p, n))
    results = []
    threads = [threading.Thread(target=lambda: results.append(compiler.native_function(op, "sm_90", "fp16", "generic")))
               for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and len(loads) == 1


def test_exported_directory_is_relocatable(tmp_path):
    """The AOT library must not depend on the building machine's virtual environment: the runtime
    libraries are copied beside it (RUNPATH $ORIGIN), so a copy of the
    directory in another place, loaded by a C++ program built with rpath $ORIGIN and run with an
    empty environment from elsewhere, resolves nothing inside the venv, loads, and its function
    answers a CPU tensor with the clean device error (no GPU here)."""
    import shutil

    info = mxq.fused_quant()(_residual_free).export(tmp_path / "out", arch="sm_90", dtype="bf16", name="reloc")
    moved = tmp_path / "elsewhere" / "deploy"
    shutil.copytree(tmp_path / "out", moved)
    venv = str(Path(sys.executable).resolve().parent.parent)
    dyn = subprocess.run(["readelf", "-d", str(moved / "libreloc.so")], capture_output=True, text=True).stdout
    assert "$ORIGIN" in dyn and venv not in dyn and ".venv" not in dyn
    cfg = lambda *a: subprocess.check_output([sys.executable, "-m", "tvm_ffi.config", *a], text=True).split()  # noqa: E731
    exe = moved / "aot_main"
    subprocess.run(["g++", "-std=c++17", "-O1", str(ROOT / "examples" / "aot_export" / "main.cpp"), "-o", str(exe),
                    *cfg("--cxxflags"), f"-L{moved}", "-ltvm_ffi", "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN",
                    "-ldl"], check=True)
    (moved / "x.bf16").write_bytes(bytes(2 * 64 * 32))
    clean = {"PATH": "/usr/bin:/bin"}
    ldd = subprocess.run(["ldd", str(moved / "libreloc.so")], capture_output=True, text=True, env=clean).stdout
    for name in ("libcute_dsl_runtime.so", "libtvm_ffi.so"):
        assert f"{name} => {moved}/{name}" in ldd, ldd
    r = subprocess.run([str(exe), str(moved / "libreloc.so"), "reloc_vec", "64", "32", str(moved / "x.bf16"),
                        str(moved / "q"), "cpu"], capture_output=True, text=True, env=clean, cwd=tmp_path)
    assert r.returncode == 0 and "device_type=cuda" in r.stdout, r.stdout + r.stderr
    assert sorted(Path(p).name for p in info["runtime_libraries"]) == ["libcute_dsl_runtime.so", "libtvm_ffi.so"]


def _residual_free(x):
    return x * 0.5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_child_forked_while_a_thread_compiles_gets_fresh_locks():
    """A process forked while another of its threads held the compile locks (compiler's, the
    GEMM's) has no thread left to release them: the child's first compile waited forever. The
    child gets fresh ones (os.register_at_fork)."""
    from mxq.runtime import gemm

    from .checks import child_gets_fresh_locks

    assert child_gets_fresh_locks((compiler, "_compile_lock"), (gemm, "_lock"))
