"""python -m mxq {info,render,compile,export} as a user runs it."""

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mxq

ROOT = Path(__file__).resolve().parent.parent

# written out by hand: the CLI's public contract
COMMANDS = ("info", "render", "compile", "export")
OP_FLAGS = ("--format", "--fp8", "--no-rowwise", "--colwise", "--scale-mode", "--scale-layout", "--block",
            "--block-2d", "--hadamard", "--hadamard-signs", "--stochastic-rounding", "--amax", "--act", "--dact",
            "--dbias")
FLAGS = {"info": (), "render": OP_FLAGS, "compile": OP_FLAGS + ("--arch", "--dtype", "--ptx"),
         "export": OP_FLAGS + ("--dir", "--arch", "--dtype", "--name", "--grouped", "--operands")}
ARCHS = ("sm_89", "sm_90", "sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_103f", "sm_110a", "sm_110f",
         "sm_120a", "sm_120f", "sm_121a", "sm_121f")
ARCH_LIST = ", ".join(ARCHS)


def run(*args, tmp_path):
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "mxq", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)


def test_render_builtin_spec(tmp_path):
    r = run("render", "--colwise", "--act", "gelu", "--scale-layout", "swizzled", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    ast.parse(r.stdout)
    assert re.search(r"act=['\"]?gelu", r.stdout) and re.search(r"scale_layout=['\"]?swizzled", r.stdout)


def test_render_decorated_function_in_a_file(tmp_path):
    r = run("render", "examples/custom_epilogue.py:residual_clamp", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    ast.parse(r.stdout)
    assert re.search(r"scale_mode=['\"]?floor", r.stdout) and "epilogue" in r.stdout and "8.0" in r.stdout


def test_compile_reports_ptx_registers_and_conversions(tmp_path):
    r = run("compile", "--act", "silu", "--arch", "sm_100a", "--ptx", str(tmp_path / "k.ptx"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "cvt.rp.satfinite.ue8m0x2.f32" in r.stdout and "cvt.rn.satfinite.e4m3x2.f32" in r.stdout
    assert "registers" in r.stdout and "spill" in r.stdout
    assert ".target sm_100a" in (tmp_path / "k.ptx").read_text()


def test_compile_sm89(tmp_path):
    r = run("compile", "--dbias", "--arch", "sm_89", "--dtype", "fp32", "--ptx", str(tmp_path / "k.ptx"),
            tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "arch     sm_89   input dtype fp32" in r.stdout
    assert ".target sm_89" in (tmp_path / "k.ptx").read_text()


def test_dtype_takes_torchs_names_too(tmp_path):
    r = run("compile", "--dtype", "float16", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "arch     sm_90   input dtype fp16" in r.stdout


def test_export(tmp_path):
    r = run("export", "--colwise", "--dir", str(tmp_path / "aot"), "--name", "q_both", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "aot" / "libq_both.so").is_file() and (tmp_path / "aot" / "q_both.h").is_file()
    header = (tmp_path / "aot" / "q_both.h").read_text()
    assert "functions q_both, q_both_vec, q_both_rows8\n" in r.stdout and "mGroupEnds" not in header
    assert " * op: mxq.quantize (no epilogue)  spec: " in header  # (the built-in op, not its internal name)


def test_export_default_names(user_files, tmp_path):
    """Without --name: mxq_<epilogue function's name> for an op from a file, mxq_quantize for the
    built-in op (its files lib<NAME>.so and <NAME>.h), as export --help says."""
    r = run("export", f"{user_files}/two.py:b", "--dir", str(tmp_path / "aot"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "aot" / "libmxq_b.so").is_file() and (tmp_path / "aot" / "mxq_b.h").is_file()
    assert "functions mxq_b, mxq_b_vec, mxq_b_rows8\n" in r.stdout
    help_text = " ".join(run("export", "--help", tmp_path=tmp_path).stdout.split())
    assert "NAME is --name, by default mxq_<epilogue function's name> (libmxq_bias_gelu.so for `def bias_gelu`), " \
           "mxq_quantize for the built-in quantize op" in help_text
    assert "which also names the files lib<NAME>.so and <NAME>.h" in help_text


def test_gated_activations_from_the_command_line(tmp_path):
    """--act swiglu renders and compiles the gated op (its two-input module over the halves);
    a gated backward exports (its two-halves kernels). (The gated forward's and the grouped
    exports' contents: tests/test_cache.py; --grouped: test_export_grouped.)"""
    r = run("render", "--act", "swiglu", "--colwise", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "def epilogue(x0, x1):" in r.stdout and "launch(mIn0: cute.Tensor, mIn1: cute.Tensor" in r.stdout
    r = run("compile", "--dact", "geglu", "--dbias", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("export", "--dact", "reglu", "--dir", str(tmp_path / "aot3"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mxq_quantize, mxq_quantize_vec, mxq_quantize_rows8" in r.stdout
    assert "Gated backward" in (tmp_path / "aot3" / "mxq_quantize.h").read_text()  # the built-in op's default name


def test_export_grouped(tmp_path):
    """--grouped adds the grouped kernels, and the header documents their grouped buffer sizes."""
    r = run("export", "--colwise", "--scale-layout", "swizzled", "--dir", str(tmp_path / "aot"), "--name", "q_g",
            "--grouped", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "functions q_g, q_g_vec, q_g_rows8, q_g_grouped, q_g_vec_grouped" in r.stdout
    header = (tmp_path / "aot" / "q_g.h").read_text()
    assert "mGroupEnds  int32[G]" in header and "(M//32 + 4 G) * roundup(N,128)" in header
    assert "must be zero before each grouped call" in header and "exports 5 TVM-FFI functions" in header and '"q_g_vec_grouped"' in header
    out = subprocess.run([sys.executable, "-c", f"""
import tvm_ffi
m = tvm_ffi.load_module({str(tmp_path / "aot" / "libq_g.so")!r})
print(all(m[f] is not None for f in ("q_g", "q_g_vec", "q_g_rows8", "q_g_grouped", "q_g_vec_grouped")))
"""], capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert out.stdout.split()[-1:] == ["True"], out.stderr


def test_every_format_from_the_command_line(tmp_path):
    """--format and its options build the built-in op of each format (QuantSpec's, rendered and
    compiled for sm_90 with that format's conversions), and export an FP8 block-scaling op."""
    r = run("render", "--format", "fp8_block", "--block", "128x128", "--colwise", "--scale-layout", "gemm",
            tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "format='fp8_block', block=(128, 128)" in r.stdout and "scale_layout='gemm'" in r.stdout
    for args, spec, cvt in ((("--format", "nvfp4", "--colwise", "--stochastic-rounding"),
                             "format='nvfp4', block=(1, 16), block_2d=False, hadamard=False, stochastic_rounding=True",
                             None),
                            (("--format", "nvfp4", "--colwise", "--hadamard", "--hadamard-signs=" + ",".join(["-1"] * 16)),
                             "hadamard=True, stochastic_rounding=False, hadamard_signs=(-1, -1,", "cvt.rn.bf16.f64"),
                            (("--format", "mxfp4", "--scale-mode", "rceil", "--scale-layout", "swizzled"),
                             "scale_mode='rceil', scale_layout='swizzled'", None),
                            (("--format", "fp8_block", "--scale-mode", "fp32", "--dtype", "fp32"), "scale_mode='fp32'",
                             "cvt.rn.satfinite.e4m3x2.f32")):
        r = run("compile", *args, tmp_path=tmp_path)
        assert r.returncode == 0, r.stderr
        assert spec in r.stdout, (args, r.stdout)
        if cvt:
            assert cvt in r.stdout, r.stdout
    r = run("export", "--format", "fp8_block", "--colwise", "--dir", str(tmp_path / "fb"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    header = (tmp_path / "fb" / "mxq_quantize.h").read_text()
    assert "FP8 block-scaling (1x128 blocks, fp32 scales)" in header
    r = run("export", "--format", "nvfp4", "--colwise", "--dir", str(tmp_path / "nv"), "--grouped", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "functions mxq_quantize_vec, mxq_quantize_vec_given, mxq_quantize_vec_grouped, " in r.stdout, r.stdout


def test_info(tmp_path):
    r = run("info", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "nvidia-cutlass-dsl" in r.stdout and "templates" in r.stdout and "cache dir" in r.stdout
    assert ARCH_LIST in r.stdout
    assert r.stdout.splitlines()[0] == f"mxq {mxq.__version__}"


def test_includedir(tmp_path):
    r = run("--includedir", tmp_path=tmp_path)
    assert r.returncode == 0 and r.stderr == ""
    assert (Path(r.stdout.strip()) / "mxq" / "mxq.hpp").is_file()


# -- --help --------------------------------------------------------------------------------------

def test_help_lists_every_command_and_every_flag(tmp_path):
    r = run("--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"^  --includedir +print the directory", out, re.M) and re.search(r"^  -h, --help ", out, re.M)
    for cmd in COMMANDS:
        assert re.search(rf"^    {cmd} +\S", out, re.M), cmd  # the command, with its help text
        assert f"python -m mxq {cmd}" in out, cmd  # and its usage line, with its flags
    for flags in FLAGS.values():
        for flag in flags:
            assert re.search(rf"(?<![\w-]){flag}(?![\w-])", out), flag
    for arch in ARCHS:
        assert arch in out, arch
    assert "{bf16,fp16,fp32}" in out
    for values in ("{e4m3,e5m2}", "{rceil,floor,ceil,even,pow2,fp32,e4m3}", "{compact,swizzled,gemm}",
                   "{mxfp8,fp8_block,nvfp4,mxfp4}", "{gelu,silu,relu,qgelu,srelu,swiglu,geglu,reglu,qgeglu,sreglu}"):
        assert values in out, values


@pytest.mark.parametrize("cmd", COMMANDS)
def test_command_help_lists_its_flags(cmd, tmp_path):
    r = run(cmd, "--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    for flag in FLAGS[cmd]:
        assert re.search(rf"^  {flag}\b", r.stdout, re.M), flag  # listed with its help text
    others = {f for flags in FLAGS.values() for f in flags} - set(FLAGS[cmd])
    for flag in others:
        assert not re.search(rf"(?<![\w-]){flag}(?![\w-])", r.stdout), flag
    if cmd in ("compile", "export"):
        assert ARCH_LIST in " ".join(r.stdout.split())  # the help text's wrapping undone
        assert "{bf16,fp16,fp32}" in r.stdout


# -- user errors: one line on stderr, exit status 2 -------------------------------------------

USER_FILES = {
    "exits.py": "import sys\nsys.exit(0)\n",
    "loop.py": """\
        import mxq


        @mxq.fused_quant(colwise=True)
        def bad(x):
            for i in range(3):
                x = x + 1
            return x
        """,
    "unknown_option.py": """\
        import mxq


        @mxq.fused_quant(colwise=True, bogus=1)
        def f(x):
            return x
        """,
    "exclusive.py": """\
        import mxq


        @mxq.fused_quant(act="gelu", dact="gelu")
        def f(x):
            return x
        """,
    "syntax.py": """\
        import mxq
        def f(x)
            return x
        """,
    "two.py": """\
        import mxq


        @mxq.fused_quant
        def a(x):
            return x


        @mxq.fused_quant(colwise=True)
        def b(x):
            return x * 2.0
        """,
    "own_bug.py": """\
        raise ValueError("a bug of the file's own")
        """,
    "notes.txt": "not python\n",
}


@pytest.fixture
def user_files(tmp_path):
    d = tmp_path / "user"
    d.mkdir()
    for name, text in USER_FILES.items():
        (d / name).write_text(textwrap.dedent(text))
    (tmp_path / "a_file").write_text("")
    return d


# (arguments, the start of the one line); "{u}" is the user-file directory, "{t}" tmp_path
USER_ERRORS = [
    (("export", "--colwise", "--dir", "{t}/aot", "--name", "bad-name"),
     "mxq: --name must be a C identifier, got 'bad-name'"),
    (("compile", "--act", "gelu", "--dact", "gelu"),
     "mxq: --act and --dact are exclusive, got --act gelu and --dact gelu"),
    (("export", "--dir", "{t}/aot", "--operands", "row"),
     "mxq: --operands: the first tensor 'x' sets the shape and must be 'full' or 'strided', got 'row'"),
    (("export", "--dir", "{t}/aot", "--operands", "full,row"), "mxq: --operands must be a sequence of 1 kind(s)"),
    (("export", "--dir", "{t}/aot", "--operands", "sideways"), "mxq: --operands: 'x' has kind 'sideways'"),
    (("render", "--no-rowwise"), "mxq: --no-rowwise needs --colwise (at least one of the rowwise and colwise "
     "outputs is written)"),
    (("compile", "--arch", "sm_80"), f"mxq: argument --arch: must be one of ({ARCH_LIST}), got 'sm_80'"),
    (("compile", "--arch", "sm_100"), f"mxq: argument --arch: must be one of ({ARCH_LIST}), got 'sm_100'"),
    (("compile", "--arch", "sm_100 "), f"mxq: argument --arch: must be one of ({ARCH_LIST}), got 'sm_100 '"),
    (("export", "--dir", "{t}/aot", "--arch", "sm_120"),
     f"mxq: argument --arch: must be one of ({ARCH_LIST}), got 'sm_120'"),
    (("compile", "--dtype", "fp64"), "mxq: argument --dtype: invalid choice: 'fp64'"),
    (("compile", "--dtype", "torch.float16"), "mxq: argument --dtype: invalid choice: 'torch.float16'"),
    (("render", "--act", "tanh"), "mxq: argument --act: invalid choice: 'tanh'"),
    (("render", "--format", "fp8_block", "--block", "2x2"),
     "mxq: --block must be one of (1x128, 128x128) with --format fp8_block, got 2x2"),
    (("render", "--block", "1x128"), "mxq: --block must be one of (1x32,) with --format mxfp8, got 1x128"),
    (("render", "--block", "wide"), "mxq: argument --block: expected ROWSxCOLUMNS such as 1x128 or 128x128"),
    (("render", "--scale-mode", "pow2"), "mxq: --scale-mode must be one of ('rceil', 'floor', 'ceil', 'even') with "
     "--format mxfp8, got 'pow2'"),
    (("render", "--format", "fp8_block", "--scale-layout", "swizzled"),
     "mxq: --scale-layout must be one of ('compact', 'gemm') with --format fp8_block, got 'swizzled'"),
    (("render", "--format", "mxfp4", "--stochastic-rounding"),
     "mxq: --stochastic-rounding is an option of --format nvfp4, not 'mxfp4'"),
    (("render", "--format", "nvfp4", "--hadamard"), "mxq: --hadamard transforms the colwise copy only: it needs --colwise"),
    (("render", "--format", "nvfp4", "--colwise", "--hadamard", "--hadamard-signs", "1,1"),
     "mxq: --hadamard-signs must be 16 ints, each 1 or -1 (a tuple or list), got [1, 1]"),
    (("render", "--format", "nvfp4", "--colwise", "--hadamard-signs", ",".join(["1"] * 16)),
     "mxq: --hadamard-signs is the sign vector of --hadamard's transform"),
    (("render", "--hadamard-signs", "a,b"), "mxq: argument --hadamard-signs: expected 16 comma-separated signs"),
    (("render", "--format", "int4"), "mxq: argument --format: invalid choice: 'int4'"),
    (("render", "--format", "nvfp4", "--fp8", "e5m2"), "mxq: --fp8 does not apply to --format nvfp4"),
    (("render", "--format", "nvfp4", "--colwise", "--block-2d", "--hadamard"),
     "mxq: --block-2d and --hadamard are exclusive"),
    (("compile", "--format", "nvfp4", "--colwise", "--hadamard", "--dtype", "fp32"),
     "mxq: asm(): --format nvfp4 with --hadamard and fp32 inputs has no GPU kernels (the transform takes bf16 "
     "inputs only); such calls run the reference"),
    (("render", "nope.py"), "mxq: no such file: nope.py"),
    (("render", "examples/custom_epilogue.py:"),
     "mxq: 'examples/custom_epilogue.py:' names no op after its colon: give FILE.py:NAME"),
    (("render", "{u}"), "mxq: {u} is not a file"),
    (("render", "{u}/notes.txt"), "mxq: {u}/notes.txt is not a Python file"),
    (("render", "examples/custom_epilogue.py:missing"),
     "mxq: examples/custom_epilogue.py has no @mxq.fused_quant op named 'missing'"),
    (("render", "{u}/two.py"), "mxq: {u}/two.py defines 2 ops at module level (['a', 'b']); pick one with {u}/two.py:NAME"),
    (("render", "{u}/loop.py"), "mxq: {u}/loop.py:6: "),  # EpilogueError: file and line of the loop
    (("compile", "{u}/unknown_option.py"), "mxq: fused_quant() got unknown option(s) ['bogus']"),
    (("render", "{u}/exclusive.py"), "mxq: act and dact are exclusive"),
    (("render", "{u}/syntax.py"), "mxq: {u}/syntax.py:2: "),
    (("export", "{u}/exits.py", "--dir", "{t}/aot"), "mxq: {u}/exits.py called sys.exit(0) while it was imported"),
    (("render", "examples/custom_epilogue.py", "--act", "gelu"), "mxq: --act describes the built-in quantize op"),
    (("compile", "{u}/two.py:b", "--colwise", "--scale-mode", "floor"),
     "mxq: --colwise, --scale-mode describe the built-in quantize op"),
    (("compile", "--ptx", "{t}/no/such/dir/k.ptx"), "mxq: --ptx {t}/no/such/dir/k.ptx: no such directory"),
    (("export", "--dir", "{t}/a_file"), "mxq: --dir is '{t}/a_file', which is a file, not a directory"),
    (("compile", "--ptx", "{t}"), "mxq: --ptx {t} is a directory"),
    (("export", "--colwise"), "mxq: the following arguments are required: --dir"),
    ((), "mxq: the following arguments are required: command"),
    (("quantize",), "mxq: argument command: invalid choice: 'quantize'"),
    (("render", "--bogus"), "mxq: unrecognized arguments: --bogus"),
    (("--bogus",), "mxq: unrecognized arguments: --bogus"),
    (("export", "--format", "fp8_block", "--colwise", "--scale-layout", "gemm", "--grouped", "--dir", "{t}/g"),
     "mxq: --format fp8_block with --grouped and --scale-layout gemm is not served"),
]


@pytest.mark.parametrize("args,start", USER_ERRORS, ids=[" ".join(a) or "(none)" for a, _ in USER_ERRORS])
def test_user_errors_print_one_line_and_exit_2(args, start, user_files, tmp_path):
    fill = {"u": str(user_files), "t": str(tmp_path)}
    r = run(*(a.format(**fill) for a in args), tmp_path=tmp_path)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.endswith("\n"), r.stderr
    assert r.stderr.startswith(start.format(**fill)), r.stderr
    if not any("{u}" in a for a in args):  # the CLI's own options: named as its flags, not as Python's
        assert not re.search(r"(?<![-\w])(rowwise|colwise|act|dact|dtype|arch|name|grouped|operands|fp8|scale_mode|"
                             r"scale_layout|format|block|block_2d|hadamard|stochastic_rounding)(=| must| and dact)|"
                             r"export\(\)|argument '", r.stderr), r.stderr


def test_no_writable_directory_for_the_module_is_one_line(tmp_path, monkeypatch, capsys):
    """Where neither the cache nor the temporary directory can hold the generated module, compile
    says so in one line and exits 2 (it was a traceback)."""
    import tempfile

    from mxq import cli
    from mxq.runtime import cache

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(cache, "_private_dir", None)

    def no_dir(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/tmp")

    monkeypatch.setattr(tempfile, "mkdtemp", no_dir)
    assert cli.main(["compile", "--act", "srelu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxq: no writable directory for the generated module") and err.count("\n") == 1, err


def test_unsupported_arch_is_refused_before_compiling(tmp_path):
    r = run("compile", "--arch", "sm_80", tmp_path=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"mxq: argument --arch: must be one of ({ARCH_LIST}), got 'sm_80' "
                        "(the FP8 conversions need sm_89 or newer)\n")
    assert not (tmp_path / "cache").exists()  # nothing rendered or compiled


def test_errors_in_a_users_own_code_keep_their_traceback(user_files, tmp_path):
    r = run("render", str(user_files / "own_bug.py"), tmp_path=tmp_path)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "ValueError: a bug of the file's own" in r.stderr


def test_a_closed_pipe_is_not_an_error(tmp_path):
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")
    p = subprocess.Popen([sys.executable, "-m", "mxq", "render", "--colwise"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=ROOT)
    p.stdout.close()  # the reader goes away before mxq writes (it is still importing)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 1 and err == b"", err


def test_paths_with_commas_and_colons(tmp_path):
    """A temporary directory or output directory with a comma in its path links (the linker
    arguments went through -Wl, which splits at commas), and FILE.py[:NAME] takes NAME after the
    last colon only, so a path may hold colons."""
    odd = tmp_path / "a,b:c"
    odd.mkdir()
    (odd / "ops.py").write_text("import mxq\n\n\n@mxq.fused_quant(colwise=True)\ndef cast(x):\n    return x\n")
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore", TMPDIR=str(odd))
    r = subprocess.run([sys.executable, "-m", "mxq", "export", f"{odd}/ops.py:cast", "--dir", str(odd / "out")],
                       capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (odd / "out" / "libmxq_cast.so").is_file() and (odd / "out" / "mxq_cast.h").is_file()
    r = run("render", f"{odd}/ops.py", tmp_path=tmp_path)
    assert r.returncode == 0 and "QUANTIZE" in r.stdout, r.stderr[-2000:]
    r = run("render", f"{odd}/ops.py:nope", tmp_path=tmp_path)
    assert r.returncode == 2 and f"{odd}/ops.py has no @mxq.fused_quant op named 'nope'" in r.stderr, r.stderr


def test_a_dotted_name_picks_an_op_in_a_class(tmp_path):
    """FILE.py:Holder.op names an op that is a class attribute (it read as a file name: 'no such
    file'); a dotted name that is no op is named as one."""
    (tmp_path / "held.py").write_text("import mxq\n\n\nclass Holder:\n    @mxq.fused_quant(colwise=True)\n"
                                      "    @staticmethod\n    def op(x):\n        return x * 2.0\n")
    r = run("render", f"{tmp_path}/held.py:Holder.op", tmp_path=tmp_path)
    assert r.returncode == 0 and "QUANTIZE" in r.stdout, r.stderr[-2000:]
    r = run("render", f"{tmp_path}/held.py:Holder.nope", tmp_path=tmp_path)
    assert r.returncode == 2 and "held.py has no @mxq.fused_quant op named 'Holder.nope'" in r.stderr, r.stderr
    r = run("render", f"{tmp_path}/held.py", tmp_path=tmp_path)  # (no name: the class's op is named, to pick)
    assert r.returncode == 2 and "defines 0 ops at module level ([]) and 1 in its classes (['Holder.op'])" in r.stderr, \
        r.stderr


def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path):
    """--dir under a file (as a read-only directory is for a user who is not root): one line
    naming the flag and the path, before anything compiles, no traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = run("export", "--colwise", "--dir", str(blocker / "out"), tmp_path=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"mxq: --dir is '{blocker / 'out'}', which cannot be made"), \
        r.stderr[-500:]


def test_an_option_the_kernels_refuse_for_a_dtype_is_one_mxq_line(tmp_path):
    """A compile the kernels refuse for an option and dtype (the Hadamard transform takes bf16
    inputs only) prints their mxq: message and exits 2, with no traceback."""
    r = run("compile", "--format", "nvfp4", "--colwise", "--hadamard", "--dtype", "fp16", tmp_path=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("mxq:") and "bf16" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_for_sm89_is_refused_by_name(fmt, tmp_path):
    """FP4's encode has no sm_89 form (ptxas refuses its bf16x2 / u16x2 arithmetic there): compile
    and export refuse the arch by name before compiling, one mxq: line, exit 2 (sm_90 compiles)."""
    for cmd in (["compile"], ["export", "--dir", str(tmp_path / "lib")]):
        r = run(*cmd, "--format", fmt, "--arch", "sm_89", tmp_path=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("mxq:") and "sm_90 or newer" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    from mxq.runtime import limits

    spec = mxq.QuantSpec(format=fmt)
    assert limits.arch_gap(spec, "sm_89") and limits.arch_gap(spec, "sm_90") is None
    assert limits.arch_gap(spec, "sm_100a") is None and limits.arch_gap(spec, "sm_120f") is None
    assert limits.arch_gap(mxq.QuantSpec(), "sm_89") is None


def test_empty_name_and_operands_are_refused_not_ignored(tmp_path):
    """--name '' and --operands '' are values (refused by name), not the options left out."""
    for flag in ("--name", "--operands"):
        r = run("export", "--dir", str(tmp_path / "lib"), flag, "", tmp_path=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("mxq:") and flag[2:] in r.stderr, (flag, r.stderr)
    op = mxq.fused_quant(act="swiglu")(_gate_ident)
    with pytest.raises(ValueError, match="name"):
        op.export(tmp_path / "gated", name="")


def test_export_directory_and_runtime_library_names_are_refused(tmp_path):
    """--dir '' (export's '' directory) is refused, not the current directory; a name whose
    lib<name>.so is a runtime library the export copies beside it (which would overwrite the
    export's own library) is refused by name, on the CLI and in op.export."""
    r = run("export", "--dir", "", tmp_path=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("mxq: --dir must name a directory"), r.stderr
    from mxq.runtime import toolchain

    for lib in toolchain.runtime_libraries():
        name = Path(lib).name[len("lib"):-len(".so")]
        r = run("export", "--dir", str(tmp_path / "d"), "--name", name, tmp_path=tmp_path)
        assert r.returncode == 2 and f"--name {name!r} is reserved" in r.stderr, r.stderr
        with pytest.raises(ValueError, match="is reserved: lib"):
            mxq.fused_quant()(_gate_ident).export(tmp_path / "e", name=name)
    with pytest.raises(ValueError, match="'directory' must name a directory"):
        mxq.fused_quant()(_gate_ident).export("")


def test_a_file_ops_refusal_keeps_its_own_option_words(tmp_path):
    """An op from FILE.py takes its options from its decorator, not from flags: its errors keep
    the option words (hadamard=True), not the flags that describe the built-in op (--hadamard)."""
    f = tmp_path / "hop.py"
    f.write_text("import mxq\n\n\n@mxq.fused_quant(format='nvfp4', colwise=True, hadamard=True)\n"
                 "def hop(x):\n    return x\n")
    r = run("export", str(f), "--dir", str(tmp_path / "d"), tmp_path=tmp_path)
    assert r.returncode == 2 and "hadamard=True" in r.stderr and "--hadamard" not in r.stderr, r.stderr
    r = run("export", "--format", "nvfp4", "--colwise", "--hadamard", "--dir", str(tmp_path / "d"), tmp_path=tmp_path)
    assert r.returncode == 2 and "--hadamard" in r.stderr, r.stderr  # (the built-in op: in flags)


def _gate_ident(x):
    return x


def test_a_file_op_imports_its_neighbours_and_counts_only_its_own_ops(tmp_path):
    """A FILE.py op is loaded as `python FILE.py` runs it: a module beside it imports from any
    working directory (it was a ModuleNotFoundError traceback from elsewhere), and only the ops the
    file makes count, each once (an imported op and a second name of one made it "defines 2 ops";
    an op bound by assignment or made by a factory is the file's); any can be picked by name."""
    d = tmp_path / "ops"
    d.mkdir()
    (d / "helper.py").write_text("import mxq\n\n\n@mxq.fused_quant(colwise=True)\ndef shared(x):\n    return x\n")
    (d / "mine.py").write_text(textwrap.dedent("""\
        import mxq
        from helper import shared

        SCALE = 2.0


        @mxq.fused_quant(act="gelu")
        def mine(x):
            return x * SCALE


        alias = mine
    """))
    r = run("render", str(d / "mine.py"), tmp_path=tmp_path)  # (run from the repository root, not ops/)
    assert r.returncode == 0, r.stderr
    assert "gelu" in r.stdout and "2.0" in r.stdout
    r = run("render", f"{d / 'mine.py'}:shared", tmp_path=tmp_path)
    assert r.returncode == 0 and "colwise=True" in r.stdout.replace(" ", ""), r.stderr
    # an op bound by assignment, or made by a factory in the file, is the file's too
    (d / "bound.py").write_text("import mxq\n\n\ndef f(x):\n    return x\n\n\nop = mxq.fused_quant(colwise=True)(f)\n")
    (d / "factory.py").write_text("import mxq\n\n\ndef make():\n    @mxq.fused_quant(act='relu')\n    def g(x):\n"
                                  "        return x\n    return g\n\n\nop = make()\n")
    for f, words in (("bound.py", "colwise=True"), ("factory.py", "relu")):
        r = run("render", str(d / f), tmp_path=tmp_path)
        assert r.returncode == 0 and words in r.stdout.replace(" ", ""), (f, r.stderr)
    (d / "two.py").write_text("import mxq\n\n\n@mxq.fused_quant()\ndef a(x):\n    return x\n\n\n"
                              "@mxq.fused_quant()\ndef b(x):\n    return x\n")
    r = run("render", str(d / "two.py"), tmp_path=tmp_path)
    assert r.returncode == 2 and "defines 2 ops at module level (['a', 'b'])" in r.stderr, r.stderr


def test_export_toolchain_failures_are_one_line(tmp_path, monkeypatch, capsys):
    """The C++ compiler's or linker's failure (toolchain.ToolchainError) prints its one-line
    message and exits 2, as other refusals do, not a traceback; a library path that is a
    directory is refused before compiling (export._check_destinations)."""
    from mxq import cli
    from mxq.runtime import export, toolchain

    (tmp_path / "d1" / "libmxq_quantize.so").mkdir(parents=True)
    assert cli.main(["export", "--dir", str(tmp_path / "d1")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxq: --dir, --name: the export writes the file") and "export()" not in err
    assert "libmxq_quantize.so', which exists and is not a file" in err

    def fails(*args, **kwargs):
        raise toolchain.ToolchainError("mxq: linking libq.so failed: ld: cannot open output file")

    monkeypatch.setattr(export, "compile_op", fails)
    assert cli.main(["export", "--dir", str(tmp_path / "d2"), "--name", "q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxq: linking libq.so failed") and "Traceback" not in err
