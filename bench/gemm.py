"""mxq's sm_90 GEMM (mxq/kernels/gemm_sm90.py) on the GPU: checked, then timed against torch.matmul.

    python bench/gemm.py [--out DIR] [--quick] [--no-bench] [--swizzle 4,8,-16] [--no-fused] [--no-plain]
                         [--forms cooperative,pingpong,cooperative1,pingpong1] [--quack]
                         [--large-only] [--profile MxNxK] [--ops gelu_mxfp8,...]

Cases (M x N x K, bf16, D = A @ W^T with A [M, K], W [N, K]): M in (8192, 16384) crossed with
(K, N) in ((4096, 14336), (14336, 4096), (8192, 28672)), and small or odd shapes with partial
tiles (--quick: the small ones and the first large one). Each case is checked against a float64
matmul of the same inputs: D within bf16 GEMM tolerance (``bounds``) and the fp32 accumulator
hook within a K-dependent fp32 tolerance; torch.matmul is held to the same D bound. Then both are
timed by bench/device_check.py's busy-GPU method (``dc.time_ms``) and printed as TFLOP/s with
the ratio torch time / mxq time (> 1: mxq faster); ``--swizzle`` also times the kernel with those
tile orders (GemmSm90's ``swizzle``, < 0 for bands along N; each must give D bit for bit). A case
that raises prints its
error and the run goes on.

Forms (``--forms``, cooperative and pingpong by default): every mxq row runs once per form of
the kernel, the cooperative one (two consumer warpgroups on a 128 x 256 tile, CTAs in clusters of
mxq.runtime.gemm.CLUSTER_M along M sharing W by TMA multicast; rows named as before), the
ping-pong one (each warpgroup its own 64 x 256 tile, their mainloops alternating; rows named
``... pingpong``), ``cooperative1`` and ``pingpong1`` (each without clusters: ``... cluster1``),
``pingpong128x128`` and ``pingpong128x192`` (ping-pong with those tiles, two m64 wgmma rows a
warpgroup: GemmSm90's ``pp_tile``; 128 x 192 in mxq.runtime.gemm.wide_order's tile order: the
kernel kernel_for takes on every GPU for the plain GEMM and for ops reading the accumulator alone
at K up to 8192), ``pingpong128x192n8`` (that tile in bands of 8 M tile clusters along N whatever M)
and ``cooperativen8`` (the cooperative form in that order), ``pingpong192x128`` and
``pingpong192x128n2`` (ping-pong on 192 x 128, three m64 wgmma rows a warpgroup: a tile whose
columns hold FP8 block scaling's 1x128 blocks with 128 x 192's 192 accumulators a thread; in
swizzle_for's order, in bands of 2 clusters along N, and ``pingpong192x128c1`` without clusters),
and ``library`` (whatever kernel_for
takes on this GPU for each case; rows named
``... library``), set through mxq.runtime.gemm.PINGPONG, CLUSTER_M, PP_TILE and ORDER, each checked
and timed beside the same torch baselines; each form as ``FORM-direct`` too (rows ``... direct``):
op.gemm's rowwise FP8 data stored from registers instead of staged for TMA stores
(mxq.runtime.gemm.STAGE_ROWS False). A fused op runs in a ping-pong form only where its tile
serves it (mxq.runtime.gemm.serves: FP8 block scaling's 1x128 blocks not in 192 columns, its
128-row colwise blocks in no ping-pong tile) and, on the tiles of 192 accumulators a thread (128 x 192,
192 x 128), only what reads the accumulator alone (wide_serves: what else spills).

Fused rows (``op.gemm``, mxq/kernels/gemm_quant.py; off with --no-fused), on the large cases
(--quick: the first): gelu + FP8 block scaling 1x128 rowwise (``gelu_fp8_block``) and gelu +
MXFP8 rowwise (``gelu_mxfp8``), the first with its amax (``gelu_fp8_block_amax``: what the
amax's warp reductions and atomics cost), both directions (``gelu_mxfp8_both``; FP8 block scaling's
GEMM-ready pair ``gelu_fp8_block_both``, cooperative form alone: runs_in) and the backward's dgrad
GEMM with dgelu and dbias (``dgelu_fp8_block_both``) in the GEMM's epilogue, checked against op.reference on the
kernel's own accumulator (docs/NUMERICS.md's transcendental class, mxq.testing.compare), then
timed against torch.matmul alone (``vs_matmul``: fused time / matmul time, issue 42's target
<= 1.05) and against torch.matmul followed by the same op on its bf16 output (``speedup``:
unfused time / fused time, target >= 1.15). ``speedup_bound``: unfused time / matmul time, the
speedup of a fused GEMM as fast as torch.matmul alone (a free epilogue on cuBLAS's mainloop): no
fused GEMM reaches more without a faster mainloop than cuBLAS's, so where it is below 1.15 that
target is out of reach at that shape.

Peer (``--quack``): quack-kernels' sm_90 GEMM (``quack.gemm_interface.gemm_tuned.fn``, its
un-autotuned entry, one GemmConfig a call) on the same inputs of each large case, under each
config of ``QUACK_CONFIGS`` (its default sm_90 config and the tiles its autotuner tries most),
each D checked against float64 like mxq's and timed the same way; the row keeps every config's
time and the best (``quack_ms``, ``ratio``: torch time / quack's best). It answers issue 42's
question, whether quack's mainloop is faster than mxq's own at these shapes. ``--large-only``
skips the small cases. Results: <out>/<device>-<date>-gemm.json.

``--profile MxNxK`` (for Nsight Compute, nothing timed or written): mxq's GEMM in both forms and
quack's at the same cooperative tile (128 x 256, clusters of 2 along M) and at its default
(128 x 192 ping-pong), each run twice, then once each between cudaProfilerStart and Stop:
``ncu --clock-control none --profile-from-start off --section SpeedOfLight --section
MemoryWorkloadAnalysis ... python bench/gemm.py --profile 8192x14336x4096``
(``results/nvidia-h100-ncu-gemm.txt``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import device_check as dc  # noqa: E402

import mxq  # noqa: E402


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128))
def gelu_fp8_block(x):
    return x


@mxq.fused_quant(act="gelu")
def gelu_mxfp8(x):
    return x


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128), amax=True)
def gelu_fp8_block_amax(x):
    return x


@mxq.fused_quant(act="gelu", colwise=True)
def gelu_mxfp8_both(x):
    return x


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128), colwise=True, scale_layout="gemm")
def gelu_fp8_block_both(x):
    return x


@mxq.fused_quant(dact="gelu", dbias=True, format="fp8_block", block=(1, 128), colwise=True, scale_layout="gemm")
def dgelu_fp8_block_both(dy):  # (the backward's dgrad GEMM: dgelu at the forward's pre-activation, dbias)
    return dy


# (the colwise rows: MXFP8's 32-row blocks in either form; FP8 block scaling's GEMM-ready pair, the
# transposed colwise copy of 128-row blocks, in the cooperative form alone)
FUSED = (gelu_fp8_block, gelu_mxfp8, gelu_fp8_block_amax, gelu_mxfp8_both, gelu_fp8_block_both, dgelu_fp8_block_both)

LARGE = [(m, n, k) for m in (8192, 16384) for k, n in ((4096, 14336), (14336, 4096), (8192, 28672))]
SMALL = [(200, 136, 64), (1000, 520, 4096), (128, 256, 64), (1, 8, 8), (129, 264, 72), (300, 1000, 200)]
U_FP32 = 2.0 ** -24  # unit roundoff of fp32
U_OUT = 2.0 ** -8  # bf16's relative spacing: twice its unit roundoff (rounding plus slack)


# --forms names -> (GemmSm90's pingpong, its cluster_m; None: the library's), row-name suffix, the
# ping-pong tile (mxq.runtime.gemm.PP_TILE; None: the library's), the tile order (mxq.runtime.gemm.ORDER:
# GemmSm90's swizzle, < 0 bands along N; None: the library's), op.gemm's rowwise stores
# (mxq.runtime.gemm.STAGE_ROWS; None: the library's, staged by TMA where they can be); "library": PINGPONG
# None, kernel_for's choice; each form also as FORM-direct: the rowwise FP8 data stored from registers
_FORMS = {"cooperative": (False, None, "", None, None), "pingpong": (True, None, " pingpong", None, None),
          "library": (None, None, " library", None, None),
          "cooperative1": (False, 1, " cluster1", None, None), "pingpong1": (True, 1, " pingpong cluster1", None, None),
          "pingpong128x128": (True, None, " pingpong 128x128", (128, 128), None),
          "pingpong128x192": (True, None, " pingpong 128x192", (128, 192), None),
          "pingpong128x192n8": (True, None, " pingpong 128x192 order -8", (128, 192), -8),
          "cooperativen8": (False, None, " order -8", None, -8),
          "pingpong192x128": (True, None, " pingpong 192x128", (192, 128), None),
          "pingpong192x128n2": (True, None, " pingpong 192x128 order -2", (192, 128), -2),
          "pingpong192x128c1": (True, 1, " pingpong 192x128 cluster1", (192, 128), None)}
FORMS = {**{name: (*f, None) for name, f in _FORMS.items()},
         **{f"{name}-direct": (*f[:2], f[2] + " direct", *f[3:], False) for name, f in _FORMS.items()}}
DEFAULT_FORMS = ("cooperative", "pingpong")


@contextlib.contextmanager
def use_form(form: str):
    """mxq.runtime.gemm's kernel (PINGPONG, CLUSTER_M, PP_TILE, ORDER, STAGE_ROWS) set to ``form``'s
    for the rows run inside, restored after."""
    from mxq.runtime import gemm as g

    pingpong, cluster, _, tile, order, stage = FORMS[form]
    old = g.PINGPONG, g.CLUSTER_M, g.PP_TILE, g.ORDER, g.STAGE_ROWS
    g.PINGPONG, g.CLUSTER_M = pingpong, g.CLUSTER_M if cluster is None else cluster
    g.PP_TILE = g.PP_TILE if tile is None else tile
    g.ORDER = g.ORDER if order is None else order
    g.STAGE_ROWS = g.STAGE_ROWS if stage is None else stage
    try:
        yield
    finally:
        g.PINGPONG, g.CLUSTER_M, g.PP_TILE, g.ORDER, g.STAGE_ROWS = old


def _suffix(form: str) -> str:
    return FORMS[form][2]


def runs_in(op, form: str) -> bool:
    """Whether op.gemm of ``op`` runs in ``form`` (where the form's ping-pong tile does not serve
    the op, kernel_for runs it cooperative whatever PINGPONG says), so that no row is named for a
    form it did not run in; "library" runs every op."""
    from mxq.runtime import gemm as g

    if FORMS[form][0] is None:
        return True
    tile = FORMS[form][3]
    if tile is not None and tile[0] * tile[1] == 192 * 128 and not g.wide_serves(op, tile):
        return False  # (192 accumulators a thread: what reads more than the accumulator spills)
    with use_form(form):  # (kernel_for: cooperative where the form's tile does not serve the op)
        return g.kernel_for(op).pingpong == g.PINGPONG


def cases(quick: bool = False):
    """(M, N, K) of every case, small ones first."""
    return SMALL + (LARGE[:1] if quick else LARGE)


def inputs(m, n, k, dtype=torch.bfloat16, device="cuda", seed=0):
    """A [M, K] and W [N, K], normal values (seeded by the shape)."""
    g = torch.Generator(device=device).manual_seed(seed + m * 7 + n * 13 + k)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    w = torch.randn(n, k, generator=g, device=device).to(dtype)
    return a, w


def bounds(a, w):
    """(float64 reference, accumulator bound, output bound) per element. The fp32 accumulator
    may differ from the exact product by 8 sqrt(K) u |A| |W|^T (u = 2^-24: a few times the
    typical error of K rounded fp32 additions, far below the wrongness of a skipped or misplaced
    K tile); D adds its rounding to the output dtype, at most 2^-9 |acc|."""
    k = a.shape[1]
    a64, w64 = a.double(), w.double()
    ref = a64 @ w64.T
    absref = a64.abs() @ w64.abs().T
    acc_tol = 8 * math.sqrt(k) * U_FP32 * absref + 1e-300
    return ref, acc_tol, U_OUT * ref.abs() + 2 * acc_tol


def violations(got, ref, tol, name):
    """[] when every element of ``got`` lies within ``tol`` of ``ref``, else one line saying where not."""
    err = (got.double() - ref).abs()
    bad = ~(err <= tol)  # (NaN is bad)
    if not bool(bad.any()):
        return []
    i = int(bad.reshape(-1).nonzero()[0])
    r, c = divmod(i, ref.shape[1])
    return [f"{name}: {int(bad.sum())} elements off, first [{r},{c}] got {float(got[r, c])} want {float(ref[r, c])} "
            f"tol {float(tol[r, c]):.3g}; max err/tol {float((err / tol).max()):.3g}"]


def check(m, n, k):
    """Problems of mxq's D and fp32 accumulator and of torch.matmul's D against float64 ([]: none)."""
    from mxq.runtime.gemm import gemm

    a, w = inputs(m, n, k)
    acc = torch.empty(m, n, dtype=torch.float32, device=a.device)
    d = gemm(a, w, acc_out=acc)
    d2 = gemm(a, w)  # (the variant without the hook: the one timed)
    torch.cuda.synchronize()
    ref, acc_tol, out_tol = bounds(a, w)
    problems = violations(acc, ref, acc_tol, "acc") + violations(d, ref, out_tol, "D")
    if not torch.equal(d, d2):
        problems.append("D differs between the hook and plain variants")
    torch_problems = violations(torch.matmul(a, w.T), ref, out_tol, "torch D")
    return problems, torch_problems


def time_case(m, n, k):
    """(mxq ms, torch ms) of one GEMM, busy-GPU method."""
    from mxq.runtime.gemm import gemm

    a, w = inputs(m, n, k)
    out = torch.empty(m, n, dtype=a.dtype, device=a.device)
    mxq_ms = dc.time_ms(lambda: gemm(a, w, out=out))
    torch_ms = dc.time_ms(lambda: torch.matmul(a, w.T, out=out))
    return mxq_ms, torch_ms


def swizzle_rows(m, n, k, swizzles):
    """{swizzle: ms, or the error} of the kernel (the form's, mxq.runtime.gemm.PINGPONG and
    PP_TILE) compiled with each tile order (GemmSm90's ``swizzle``: > 0 bands of that many N tiles
    moving down M, < 0 bands of that many clusters of M tiles moving along N); D must equal the
    default order's bit for bit."""
    from mxq.runtime import gemm as g
    from mxq.runtime.gemm import compile_gemm, gemm

    a, w = inputs(m, n, k)
    want = gemm(a, w)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    rows = {}
    for sw in swizzles:
        try:
            kern = g.kernel_for(None, m, n, k)
            fn = compile_gemm("bf16", False, sms, swizzle=sw, pingpong=kern.pingpong, cluster_m=kern.cluster_m,
                              pp_tile=kern.tile if kern.pingpong else None)
            out = torch.empty_like(want)
            fn(a, w, out)
            if not torch.equal(out, want):
                raise AssertionError("D differs from the default tile order's")
            rows[sw] = dc.time_ms(lambda: fn(a, w, out))  # noqa: B023 (timed before the next)
        except Exception as exc:
            rows[sw] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return rows


def run_case(m, n, k, bench: bool = True, swizzles=(), form: str = "cooperative"):
    """One printed and returned row of the kernel form ``form``; an exception becomes the row's error."""
    name = f"gemm_bf16 {m}x{n}x{k}{_suffix(form)}"
    with use_form(form):
        return _run_case(name, m, n, k, bench, swizzles)


def _run_case(name, m, n, k, bench, swizzles):
    try:
        problems, torch_problems = check(m, n, k)
        row = dict(name=name, M=m, N=n, K=k, checked=problems == [], problems=problems[:3],
                   torch_checked=torch_problems == [])
        if bench:
            mxq_ms, torch_ms = time_case(m, n, k)
            flops = 2 * m * n * k
            row.update(ms=mxq_ms, torch_ms=torch_ms, tflops=flops / mxq_ms / 1e9, torch_tflops=flops / torch_ms / 1e9,
                       ratio=torch_ms / mxq_ms)
            print(f"  {name:32s} mxq {row['tflops']:7.1f} TFLOP/s  torch {row['torch_tflops']:7.1f} TFLOP/s  "
                  f"ratio {row['ratio']:5.2f}  checked={row['checked']} {problems[:1]}", flush=True)
            if swizzles:
                row["swizzle_ms"] = swizzle_rows(m, n, k, swizzles)
                print(f"  {'':32s} swizzle ms: {row['swizzle_ms']} (default {mxq_ms:.3f})", flush=True)
        else:
            print(f"  {name:32s} checked={row['checked']} torch_checked={row['torch_checked']} {problems[:2]}",
                  flush=True)
        return row
    except Exception as exc:  # (print and go on to the next shape)
        return dc.error_row(name, m, n, exc, why="failed") | {"K": k}


# quack GemmConfig fields (tile_m, tile_n, pingpong, cluster_m, cluster_n) of the --quack rows: its
# sm_90 default first (128 x 192 ping-pong, clusters of 2 along M), then tiles of its autotuner's list
QUACK_CONFIGS = ((128, 192, True, 2, 1), (128, 192, True, 1, 2), (128, 208, True, 2, 1), (128, 128, True, 2, 1),
                 (256, 128, False, 2, 1), (256, 192, False, 2, 1), (256, 208, False, 1, 2), (128, 256, False, 2, 1))


def quack_row(m, n, k, configs=QUACK_CONFIGS):
    """One row of quack's sm_90 GEMM at M x N x K: each config checked against float64 (as mxq's
    D) and timed; an error (an import, a config it refuses) is kept as that config's entry."""
    name = f"quack_bf16 {m}x{n}x{k}"
    try:
        from quack.gemm_config import GemmConfig
        from quack.gemm_interface import gemm_tuned

        a, w = inputs(m, n, k)
        b = w.T  # (quack's B is (K, N); W's transpose: K contiguous, as wgmma's TN operand)
        ref, _, out_tol = bounds(a, w)
        out = torch.empty(m, n, dtype=a.dtype, device=a.device)
        per, problems = {}, []
        for tm, tn, pp, cm, cn in configs:
            label = f"{tm}x{tn} {'pingpong' if pp else 'cooperative'} cluster {cm}x{cn}"
            cfg = GemmConfig(tile_m=tm, tile_n=tn, pingpong=pp, cluster_m=cm, cluster_n=cn,
                             is_dynamic_persistent=False, device_capacity=9)
            try:
                out.zero_()
                gemm_tuned.fn(a, b, out, config=cfg)
                torch.cuda.synchronize()
                bad = violations(out, ref, out_tol, label)
                problems += bad
                per[label] = dc.time_ms(lambda: gemm_tuned.fn(a, b, out, config=cfg))  # noqa: B023
                if bad:
                    per[label] = f"wrong: {bad[0][:160]}"
            except Exception as exc:
                per[label] = f"{type(exc).__name__}: {str(exc)[:160]}"
        del ref, out_tol
        torch_ms = dc.time_ms(lambda: torch.matmul(a, w.T, out=out))
        timed = {c: v for c, v in per.items() if isinstance(v, float)}
        best = min(timed, key=timed.get) if timed else None
        flops = 2 * m * n * k
        row = dict(name=name, M=m, N=n, K=k, checked=problems == [] and best is not None, problems=problems[:3],
                   configs_ms=per, torch_ms=torch_ms, torch_tflops=flops / torch_ms / 1e9)
        if best is not None:
            row.update(best_config=best, quack_ms=timed[best], tflops=flops / timed[best] / 1e9,
                       ratio=torch_ms / timed[best])
        print(f"  {name:32s} quack best {row.get('tflops', 0):7.1f} TFLOP/s ({best})  torch "
              f"{row['torch_tflops']:7.1f} TFLOP/s  ratio {row.get('ratio', 0):5.2f}  checked={row['checked']}",
              flush=True)
        for c, v in per.items():
            print(f"  {'':32s} {c:40s} {v if isinstance(v, str) else f'{flops / v / 1e9:7.1f} TFLOP/s'}", flush=True)
        return row
    except Exception as exc:  # (print and go on)
        return dc.error_row(name, m, n, exc, why="failed") | {"K": k}


PROFILED_QUACK = ((128, 256, False, 2, 1), (128, 192, True, 2, 1))  # (--profile: QUACK_CONFIGS' fields)


def profile(m, n, k):
    """Each profiled kernel run once inside cudaProfilerStart/Stop, after two warm-up runs
    (compiles); the name of each printed before it."""
    from quack.gemm_config import GemmConfig
    from quack.gemm_interface import gemm_tuned

    from mxq.runtime.gemm import gemm

    a, w = inputs(m, n, k)
    out = torch.empty(m, n, dtype=a.dtype, device=a.device)
    runs = []
    for form in ("cooperative", "pingpong"):
        def run(form=form):
            with use_form(form):
                gemm(a, w, out=out)
        runs.append((f"mxq {form}", run))
    for tm, tn, pp, cm, cn in PROFILED_QUACK:
        cfg = GemmConfig(tile_m=tm, tile_n=tn, pingpong=pp, cluster_m=cm, cluster_n=cn,
                         is_dynamic_persistent=False, device_capacity=9)
        runs.append((f"quack {tm}x{tn} {'pingpong' if pp else 'cooperative'} cluster {cm}x{cn}",
                     lambda cfg=cfg: gemm_tuned.fn(a, w.T, out, config=cfg)))
    for _, run in runs:
        run(), run()
    torch.cuda.synchronize()
    for name, run in runs:
        print(f"profiled: {name} {m}x{n}x{k}", flush=True)
        torch.cuda.profiler.start()
        run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def fused_row(op, m, n, k, bench: bool = True, device="cuda", form: str = "cooperative"):
    """One op.gemm row of the kernel form ``form``: checked against op.reference on the
    accumulator hook's values (and the hook-free launch the same bytes), then timed against
    torch.matmul and torch.matmul + op. (``device`` "cpu": the check on op.gemm's CPU route, for
    the tests.)"""
    name = f"gemm_{op.__name__} {m}x{n}x{k}{_suffix(form)}"
    with use_form(form):
        return _fused_row(name, op, m, n, k, bench, device)


def _fused_row(name, op, m, n, k, bench, device):
    from mxq.testing import compare, is_exact, v_bound

    try:
        a, w = inputs(m, n, k, device=device)
        w = (w.float() / math.sqrt(k)).to(a.dtype)  # (activations of unit size: gelu's both sides)
        # (a dact op's act_input: the forward's pre-activation, of unit size too)
        kw = dict(act_input=torch.randn(m, n, device=a.device).to(a.dtype)) if op.spec.dact else {}
        ref_kw = {key: t.float() for key, t in kw.items()}
        acc = torch.empty(m, n, dtype=torch.float32, device=a.device)
        got = op.gemm(a, w, acc_out=acc, **kw)
        exact = is_exact(op)
        ref = op.reference(acc, **ref_kw)
        # (dbias: op.gemm's is in a's dtype, the reference's fp32; tests/test_gemm_epilogue.py's dbias_close
        # checks it, the bench the data and scales)
        problems = compare(dataclasses.replace(got, dbias=None), dataclasses.replace(ref, dbias=None), exact,
                           v_bound=None if exact else v_bound(op, acc, **ref_kw))
        plain = op.gemm(a, w, **kw)
        for d in ("rowwise_data", "colwise_data"):
            if getattr(got, d) is not None and not torch.equal(getattr(plain, d).view(torch.uint8),
                                                               getattr(got, d).view(torch.uint8)):
                problems.append(f"{d} differs between the hook and plain variants")
        del acc, got, plain
        row = dict(name=name, M=m, N=n, K=k, checked=problems == [], problems=problems[:3])
        if bench:
            d = torch.empty(m, n, dtype=a.dtype, device=a.device)
            fused_ms = dc.time_ms(lambda: op.gemm(a, w, **kw))
            torch_ms = dc.time_ms(lambda: torch.matmul(a, w.T, out=d))
            unfused_ms = dc.time_ms(lambda: op(torch.matmul(a, w.T, out=d), **kw))
            row.update(ms=fused_ms, torch_ms=torch_ms, unfused_ms=unfused_ms, vs_matmul=fused_ms / torch_ms,
                       speedup=unfused_ms / fused_ms, speedup_bound=unfused_ms / torch_ms,
                       tflops=2 * m * n * k / fused_ms / 1e9)
            print(f"  {name:40s} fused {fused_ms:7.3f} ms  matmul {torch_ms:7.3f}  matmul+op {unfused_ms:7.3f}  "
                  f"fused/matmul {row['vs_matmul']:5.3f}  speedup {row['speedup']:5.2f} (bound {row['speedup_bound']:4.2f})  "
                  f"checked={row['checked']} "
                  f"{problems[:1]}", flush=True)
        else:
            print(f"  {name:40s} checked={row['checked']} {problems[:2]}", flush=True)
        return row
    except Exception as exc:  # (print and go on)
        return dc.error_row(name, m, n, exc, why="failed") | {"K": k}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true", help="check only")
    ap.add_argument("--swizzle", default="", help="tile orders to time too, e.g. '4,8,-16' (< 0: bands along N)")
    ap.add_argument("--no-fused", action="store_true", help="skip the op.gemm rows")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain GEMM rows (the op.gemm rows time "
                    "torch.matmul beside them)")
    ap.add_argument("--forms", default=",".join(DEFAULT_FORMS), help=f"kernel forms to run, of {list(FORMS)}")
    ap.add_argument("--quack", action="store_true", help="time quack-kernels' sm_90 GEMM beside (quack_row)")
    ap.add_argument("--large-only", action="store_true", help="skip the small cases")
    ap.add_argument("--profile", default="", metavar="MxNxK", help="run the kernels once each for ncu (profile)")
    ap.add_argument("--ops", default="", help="only these fused rows (names of FUSED, comma-separated)")
    args = ap.parse_args(argv)
    swizzles = [int(s) for s in args.swizzle.split(",") if s]
    unknown = [f for f in args.forms.split(",") if f not in FORMS]
    if unknown:
        ap.error(f"--forms: {unknown} not among {list(FORMS)}")
    forms = args.forms.split(",")
    if args.no_plain and (args.swizzle or args.no_fused):
        ap.error("--no-plain skips the plain rows, which --swizzle times and which are all --no-fused leaves")
    if not torch.cuda.is_available():
        print("bench/gemm.py needs a CUDA device", file=sys.stderr)
        return 2
    if args.profile:
        profile(*(int(v) for v in args.profile.split("x")))
        return 0
    copy_gbps = dc.copy_bandwidth()
    print(f"copy: {copy_gbps:.0f} GB/s", flush=True)
    dev = torch.cuda.get_device_name()
    shapes = [c for c in cases(args.quick) if not args.large_only or c in LARGE]
    rows = [] if args.no_plain else [run_case(m, n, k, not args.no_bench, swizzles, pp) for m, n, k in shapes
                                     for pp in forms]
    if args.quack:
        rows += [quack_row(m, n, k) for m, n, k in shapes if (m, n, k) in LARGE]
    ops = [op for op in FUSED if not args.ops or op.__name__ in args.ops.split(",")]
    if not args.no_fused:
        rows += [fused_row(op, m, n, k, not args.no_bench, form=pp)
                 for m, n, k in (LARGE[:1] if args.quick else LARGE) for op in ops for pp in forms if runs_in(op, pp)]
    dc.write_results(args.out, dev, {"device": dev, "copy_GBps": round(copy_gbps, 1), "torch": torch.__version__,
                                     "rows": rows}, "-gemm")
    return 0 if all(r.get("checked") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
