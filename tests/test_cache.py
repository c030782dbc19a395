"""The disk cache of compiled kernels and AOT export, on a CPU machine (no launch needed)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mxq
from mxq import compiler
from mxq.op import _quantize_op
from mxq.spec import QuantSpec

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
    from mxq import compiler
    from mxq.op import _quantize_op
    from mxq.spec import QuantSpec
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
    assert float(second[1]) < 50, f"load took {second[1]} ms"


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


def test_cache_dir_is_keyed_by_versions_and_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    a, b = compiler.kernel_cache_dir("sm_90"), compiler.kernel_cache_dir("sm_100a")
    assert a != b and a.parent == b.parent == tmp_path / "kernels"
    monkeypatch.setattr(mxq, "__version__", "9.9.9")
    assert compiler.kernel_cache_dir("sm_90") != a


def test_export_writes_library_and_header_loadable_without_cutlass(tmp_path):
    op = mxq.fused_quant(colwise=True, dbias=True)(_residual)
    info = op.export(tmp_path / "out", arch="sm_90", dtype="bf16", name="residual_q")
    lib, header = Path(info["library"]), Path(info["header"])
    assert lib.is_file() and header.is_file()
    text = header.read_text()
    assert '"residual_q"' in text and '"residual_q_vec"' in text and "workspace" in text
    out = _fresh(f"""
        import sys, tvm_ffi, torch
        m = tvm_ffi.load_module({str(lib)!r})
        f, fv = m["residual_q"], m["residual_q_vec"]
        x = torch.zeros(4, 32, dtype=torch.bfloat16)
        try:
            f(x)
        except Exception as e:
            print(type(e).__name__)
        print("cutlass" in sys.modules)
    """, tmp_path)
    assert out.split() == ["TypeError", "False"]  # a clean error, and no cutlass in the process


def test_export_rejects_bad_arguments(tmp_path):
    op = _quantize_op(SPEC)
    with pytest.raises(ValueError, match="identifier"):
        op.export(tmp_path, name="bad-name")
    with pytest.raises(ValueError, match="arch"):
        op.export(tmp_path, arch="hopper")


def _residual(x, r):
    return x + r
