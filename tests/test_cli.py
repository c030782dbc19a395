"""python -m mxq {info,render,compile} as a user runs it."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args, tmp_path):
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "mxq", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)


def test_render_builtin_spec(tmp_path):
    r = run("render", "--colwise", "--act", "gelu", "--scale-layout", "swizzled", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    ast.parse(r.stdout)
    assert "act=gelu" in r.stdout and "swizzle_offset(" in r.stdout


def test_render_decorated_function_in_a_file(tmp_path):
    r = run("render", "examples/custom_epilogue.py:residual_clamp", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "scale_mode=floor" in r.stdout and "# epilogue" in r.stdout


def test_compile_reports_ptx_registers_and_conversions(tmp_path):
    r = run("compile", "--act", "silu", "--arch", "sm_100a", "--ptx", str(tmp_path / "k.ptx"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "cvt.rp.satfinite.ue8m0x2.f32" in r.stdout and "cvt.rn.satfinite.e4m3x2.f32" in r.stdout
    assert "registers" in r.stdout and "spill" in r.stdout
    assert ".target sm_100a" in (tmp_path / "k.ptx").read_text()


def test_export(tmp_path):
    r = run("export", "--colwise", "--dir", str(tmp_path / "aot"), "--name", "q_both", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "aot" / "libq_both.so").is_file() and (tmp_path / "aot" / "q_both.h").is_file()


def test_info(tmp_path):
    r = run("info", tmp_path=tmp_path)
    assert r.returncode == 0 and "nvidia-cutlass-dsl" in r.stdout and "templates" in r.stdout


@pytest.mark.parametrize("args,msg", [(("render", "nope.py"), "no such file"),
                                      (("render", "examples/custom_epilogue.py:missing"), "no @mxq.fused_quant op"),
                                      (("render", "--act", "tanh"), "invalid choice")])
def test_errors(args, msg, tmp_path):
    r = run(*args, tmp_path=tmp_path)
    assert r.returncode != 0 and msg in r.stdout + r.stderr
