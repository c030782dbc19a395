"""The sm_90 GEMM (mxq/kernels/gemm_sm90.py, mxq/runtime/gemm.py).

CPU: the kernel compiles to sm_90a PTX holding wgmma and TMA loads, with and without the fp32
accumulator hook; bad arguments raise before any launch, naming the argument; bench/gemm.py's
cases and tolerances (the tolerances checked on an fp32 CPU matmul, and a planted wrong K tile
caught). GPU (marked ``gpu``): D and the accumulator against a float64 matmul on full and
partial tiles, fp16, ``out=`` into a view, and empty M.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from mxq.runtime import gemm as g

from .test_codegen import _bench_tool


@pytest.fixture(scope="module")
def ptx():
    """PTX of both variants (bf16), by hook."""
    return {hook: g.compile_gemm("bf16", acc_hook=hook, keep_ptx=True).__ptx__ for hook in (False, True)}


@pytest.mark.parametrize("hook", [False, True])
def test_compiles_to_sm90a_ptx_with_wgmma_and_tma(ptx, hook):
    text = ptx[hook]
    assert re.search(r"^\.target sm_90a", text, re.M)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in text
    assert "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes" in text
    assert "setmaxnreg.dec" in text and "setmaxnreg.inc" in text  # producer / consumer warpgroups
    assert "mbarrier.try_wait" in text  # the stages' full / empty barriers


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs a local ptxas")
@pytest.mark.parametrize("hook", [False, True])
def test_ptxas_keeps_wgmmas_pipelined_without_spills(ptx, hook):
    """The local ptxas assembles the kernel with no spills and without serialising the wgmmas
    (its C7514 warning: a non-wgmma instruction reading the accumulators while a wgmma group is in
    flight, which an edge store of single elements caused)."""
    text = ptx[hook]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        for _ in range(2):
            src.write_text(text)
            r = subprocess.run(["ptxas", "-v", "-arch=sm_90a", str(src), "-o", str(Path(d) / "k.cubin")],
                               capture_output=True, text=True, timeout=600)
            m = re.search(r"Unsupported \.version \S+; current version is '([\d.]+)'", r.stderr)
            if r.returncode == 0 or not m:
                break
            text = re.sub(r"^\.version \S+", f".version {m.group(1)}", text, count=1, flags=re.M)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    assert "C7514" not in out and "serialized" not in out, out[-2000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in out
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    assert regs <= 65536 // 384  # (384 threads at launch, before setmaxnreg moves registers between warpgroups)


def test_fp16_compiles_to_f16_wgmma():
    text = g.compile_gemm("fp16", keep_ptx=True).__ptx__
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in text


def test_d_leaves_as_bf16_pairs_and_the_hook_adds_fp32_stores(ptx):
    """D leaves as 32-bit bf16 pairs (full tiles and edge tiles alike: a pair never straddles
    N, a multiple of 8); the hook variant also stores the fp32 accumulator (pairs as v2.b32)."""
    plain = re.findall(r"st\.global[\w.]*", ptx[False])
    assert plain and set(plain) == {"st.global.b32"}
    assert "st.global.v2.b32" in ptx[True]


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize("args,match", [
    ((torch.zeros(16, 8), _bf16(16, 8)), r"a must be bfloat16 or float16"),
    ((_bf16(16, 8), torch.zeros(16, 8, dtype=torch.float16)), r"w must have a's dtype"),
    ((_bf16(16, 8), torch.zeros(16, 8, dtype=torch.int8)), r"w must be bfloat16 or float16"),
    ((_bf16(8, 16).T, _bf16(16, 8)), r"a must be K-major"),
    ((_bf16(16, 8), _bf16(8, 16).T), r"w must be K-major"),
    ((_bf16(16, 16)[:, :8], _bf16(16, 8)), r"a must be K-major and contiguous"),
    ((_bf16(16), _bf16(16, 8)), r"a must be 2-D"),
    ((_bf16(16, 8), _bf16(16, 16)), r"w must be \[N, K\] with a's K=8"),
    ((_bf16(16, 12), _bf16(16, 12)), r"K \(a.shape\[1\]\) must be a positive multiple of 8"),
    ((_bf16(16, 0), _bf16(16, 0)), r"K \(a.shape\[1\]\) must be a positive multiple of 8"),
    ((_bf16(16, 8), _bf16(12, 8)), r"N \(w.shape\[0\]\) must be a multiple of 8"),
    ((_bf16(17, 8).reshape(-1)[1:129].reshape(16, 8), _bf16(16, 8)), r"a must start on a 16-byte boundary"),
    (("x", _bf16(16, 8)), r"a must be a torch.Tensor"),
])
def test_bad_arguments_name_the_argument(args, match):
    with pytest.raises((TypeError, ValueError), match=match):
        g.check_args(*args)


@pytest.mark.parametrize("kw,match", [
    (dict(out=torch.zeros(16, 16)), r"out must be a torch.bfloat16 tensor of shape \(16, 16\)"),
    (dict(out=_bf16(16, 8)), r"out must be a torch.bfloat16 tensor of shape \(16, 16\)"),
    (dict(out=_bf16(16, 32)[:, :16]), r"out must be contiguous"),
    (dict(acc_out=_bf16(16, 16)), r"acc_out must be a torch.float32 tensor of shape \(16, 16\)"),
    (dict(acc_out=torch.zeros(16, 17)), r"acc_out must be a torch.float32 tensor"),
])
def test_bad_outputs_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        g.check_args(_bf16(16, 8), _bf16(16, 8), **kw)


def test_good_arguments_pass_and_cpu_tensors_are_refused_before_launch():
    a, w = _bf16(16, 8), _bf16(24, 8)
    g.check_args(a, w, out=_bf16(16, 24), acc_out=torch.zeros(16, 24))
    with pytest.raises(ValueError, match=r"a must be a CUDA tensor"):
        g.gemm(a, w)


def test_tile_order_groups_divide_the_n_tiles():
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)  # (the kernel module imports cutlass: with the arch set first)
    from mxq.kernels.gemm_sm90 import TILE

    assert g.TILE_N == TILE[1]
    assert [g.swizzle_for(n) for n in (8, 256, 512, 768, 1024, 4096, 14336, 28672, 2056)] == [1, 1, 2, 1, 4, 8, 8, 8, 1]
    for n in range(8, 40000, 8):
        tiles = -(-n // 256)
        s = g.swizzle_for(n)
        assert tiles % s == 0 and all(tiles % t for t in g.SWIZZLES if t > s), n


def test_bench_cases_cover_the_shapes_and_partial_tiles():
    tool = _bench_tool("gemm")
    full = tool.cases()
    for m in (8192, 16384):
        for k, n in ((4096, 14336), (14336, 4096), (8192, 28672)):
            assert (m, n, k) in full
    assert (200, 136, 64) in full and (1000, 520, 4096) in full
    assert all(n % 8 == 0 and k % 8 == 0 for _, n, k in full)  # what TMA takes
    tile_m, tile_n, tile_k = 128, 256, 64
    assert any(m % tile_m for m, _, _ in full) and any(n % tile_n for _, n, _ in full)
    assert any(k % tile_k for _, _, k in full)
    assert set(tool.cases(quick=True)) < set(full)


def test_bench_tolerance_admits_fp32_accumulation_and_catches_a_wrong_k_tile():
    """The bounds hold for a true fp32 accumulation (torch's CPU fp32 matmul) and are tight
    enough to catch a missing K tile (the last 64 products of every element)."""
    tool = _bench_tool("gemm")
    a, w = tool.inputs(96, 40, 1024, device="cpu")
    ref, acc_tol, out_tol = tool.bounds(a, w)
    acc = a.float() @ w.float().T
    assert tool.violations(acc, ref, acc_tol, "acc") == []
    assert tool.violations(acc.to(torch.bfloat16), ref, out_tol, "D") == []
    short = a[:, :-64].float() @ w[:, :-64].float().T
    assert tool.violations(short, ref, acc_tol, "acc")
    assert tool.violations(short.to(torch.bfloat16), ref, out_tol, "D")
    one = acc.clone()
    one[95, 39] += float(acc_tol[95, 39]) * 2
    assert "[95,39]" in tool.violations(one, ref, acc_tol, "acc")[0]


def test_bench_case_errors_become_rows(monkeypatch):
    """A case that raises (here: no CUDA) prints and returns an error row; the run goes on."""
    tool = _bench_tool("gemm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    row = tool.run_case(200, 136, 64)
    assert row["name"] == "gemm_bf16 200x136x64" and "error" in row and row["K"] == 64
    assert tool.main([]) == 2


GPU_SHAPES = [(128, 256, 64), (200, 136, 64), (1000, 520, 4096), (1, 8, 8), (129, 264, 72), (384, 768, 1024),
              (4096, 4096, 4096), (8192, 14336, 512)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_gpu_gemm_against_float64(m, n, k):
    tool = _bench_tool("gemm")
    # (torch.matmul's own verdict is only printed by the bench: cuBLAS may reduce split-K partials in bf16)
    problems, _ = tool.check(m, n, k)
    assert problems == [], problems


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_out_argument_and_dtypes(dtype):
    tool = _bench_tool("gemm")
    a, w = tool.inputs(300, 1000, 200, dtype=dtype)
    out = torch.full((300, 1000), float("nan"), dtype=dtype, device="cuda")
    assert g.gemm(a, w, out=out) is out
    ref, _, out_tol = tool.bounds(a, w)
    assert tool.violations(out, ref, out_tol, "D") == []


@pytest.mark.gpu
def test_gpu_edges_leave_memory_outside_d_untouched():
    """D written into a view of a larger buffer's leading rows: the rows after it keep their values."""
    tool = _bench_tool("gemm")
    a, w = tool.inputs(130, 264, 64)
    buf = torch.full((130 + 128, 264), 7.0, dtype=torch.bfloat16, device="cuda")
    g.gemm(a, w, out=buf[:130])
    assert bool((buf[130:] == 7.0).all())
    ref, _, out_tol = tool.bounds(a, w)
    assert tool.violations(buf[:130], ref, out_tol, "D") == []


@pytest.mark.gpu
def test_gpu_empty_m_returns_empty():
    a, w = torch.zeros(0, 64, dtype=torch.bfloat16, device="cuda"), torch.zeros(8, 64, dtype=torch.bfloat16,
                                                                              device="cuda")
    assert g.gemm(a, w).shape == (0, 8)
