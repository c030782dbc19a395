"""bench/ncu.py and the benchmarks' --launch modes, on the CPU: cases parse into the commands a
device call runs, and every bad case is refused before anything runs."""

import pytest
import torch

from .test_codegen import _bench_tool


def test_cases_parse_into_launch_and_ncu_commands():
    tool = _bench_tool("ncu")
    case = tool.parse_case("fp8_block:colwise_gemm@4096x14336+rows128_min_blocks=2")
    assert case == dict(script="fp8_block", row="colwise_gemm", shape="4096x14336", variant="rows128_min_blocks=2",
                        kernel="packed_kernel")
    cmd = tool.launch_command(case)
    assert cmd[1].endswith("bench/fp8_block.py")
    assert cmd[2:] == ["--launch", "colwise_gemm", "--shape", "4096x14336", "--variants", "rows128_min_blocks=2"]
    ncu = tool.ncu_command(case, "NCU")
    assert ncu[0] == "NCU" and ncu[-len(cmd):] == cmd
    flags = " ".join(ncu[1:-len(cmd)])
    assert "--clock-control none" in flags and "--nvtx-include mxq_launch/" in flags
    assert "-k regex:packed_kernel -s 2 -c 2" in flags and "smsp__issue_active" in flags
    # torchao's kernels, a kernel regex of one's own, gated's group count
    assert tool.parse_case("fp8_block:torchao/transposed")["kernel"] == "fp8_blockwise"
    assert tool.parse_case("fp4:nvfp4_both~packed|amax")["kernel"] == "packed|amax"
    assert tool.launch_command(tool.parse_case("gated:bwd@64"))[2:] == ["--launch", "bwd", "--groups", "64"]
    assert tool.launch_command(tool.parse_case("gated:bwd/fp8_block@256~packed|dbias"))[2:] == [
        "--launch", "bwd", "--layouts", "fp8_block", "--groups", "256"]
    # the profiled range is the one the benchmarks launch in
    assert tool.PROFILED_RANGE == _bench_tool("device_check").PROFILED_RANGE


@pytest.mark.parametrize("bad, match", [
    ("fp8:rowwise_compact", "SCRIPT:ROW"), ("fp4", "SCRIPT:ROW"), ("fp4:nope", "no row 'nope'"),
    ("gated:fwd@64x64", "@G"), ("fp4:nvfp4_both@64", "@MxN"), ("fp4:nvfp4_both+bogus=1", "bogus"),
    ("gated:bwd/mxfp4@8", "no row 'bwd/mxfp4'"),
])
def test_bad_cases_are_refused_before_anything_runs(bad, match, capsys):
    tool = _bench_tool("ncu")
    with pytest.raises((ValueError, TypeError), match=match):
        tool.main(["--dry-run", "fp4:nvfp4_both", bad])
    assert capsys.readouterr().out == ""  # (no command printed for the good case either)


def test_launch_rows_are_the_benchmarks_rows():
    """--launch offers exactly the rows each benchmark times (fp8_block: and torchao's kernels)."""
    fp8, fp4 = _bench_tool("fp8_block"), _bench_tool("fp4")
    assert set(fp8.launch_rows()) == set(fp8.mxq_cases(256, 256)) | {
        "torchao/rowwise", "torchao/colwise", "torchao/transposed", "torchao/weight_128x128"}
    assert set(fp4.cases(256, 256)) <= set(_bench_tool("ncu").script_rows("fp4"))
    with pytest.raises(SystemExit):
        fp4.main(["--launch", "nope"])


def test_profiled_launches_run_inside_the_range(monkeypatch):
    """device_check.launch_for_profiler: one launch outside the NVTX range, then ``times``
    inside it, the range closed after the last."""
    dc = _bench_tool("device_check")
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append("pop"))
    dc.launch_for_profiler(lambda: events.append("launch"), times=3)
    assert events == ["launch", "sync", f"push {dc.PROFILED_RANGE}", "launch", "launch", "launch", "sync", "pop"]


@pytest.mark.parametrize("text, want", [("8192x4096", (8192, 4096)), ("16X32", (16, 32))])
def test_shapes_parse(text, want):
    assert _bench_tool("device_check").parse_shape(text) == want


@pytest.mark.parametrize("text", ["8192", "0x4", "ax4", "4x4x4", "-4x4"])
def test_bad_shapes_are_refused(text):
    with pytest.raises(ValueError, match="MxN"):
        _bench_tool("device_check").parse_shape(text)


def test_a_benchmark_runs_the_shapes_it_is_given():
    pick = _bench_tool("device_check").pick_shapes
    shapes = [(8192, 8192), (16384, 16384), (4096, 14336)]
    assert pick("", False, shapes) == shapes and pick("", True, shapes) == shapes[:2]
    assert pick("4096x14336,8192x8192", True, shapes) == [(4096, 14336), (8192, 8192)]
    with pytest.raises(ValueError, match="--shapes: 4096x4096 is not one of 8192x8192, 16384x16384"):
        pick("8192x8192,4096x4096", False, shapes)
