"""One call on the GPU: bit-exactness of generated kernels against the reference, then timings.

    python bench/device_check.py [--quick] [--no-bench] [--out DIR]

Correctness: for a sample of specs that covers every option value (the full cross product is
too large for one device call), on aligned and odd shapes, with planted specials, the kernel
writes into poisoned outputs and every byte is compared with ``op.reference`` computed on the
CPU. Exactness classes follow NUMERICS.md (exact ops: every byte; transcendental ops: at most
1 in 1e4 data bytes off, each by one FP8 code; dbias within 1 ulp of a float64 sum).
Benchmark: bytes the op must move / median CUDA-event time, against a device-to-device copy
measured in the same run. Prints a table last; writes JSON to --out (default $OUT or .).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mxq  # noqa: E402
from mxq.op import FusedOp  # noqa: E402
from mxq.frontend.spec import QuantSpec  # noqa: E402
from mxq.runtime.call import Call  # noqa: E402
from mxq.tensor import MXFP8Tensor  # noqa: E402
from mxq.testing import byte_diff, compare, is_exact, planted, poisoned, same_bytes, v_abs_sum  # noqa: E402


def residual_scale(x, r, alpha: float = 0.5):
    return x * alpha + r


def clipped_sq(x):
    y = mxq.minimum(mxq.maximum(x, -3.0), 3.0)
    return mxq.where(y > 0.0, y * y, -y) - 0.25


def smooth(x, r):
    return mxq.exp(-mxq.abs(x)) * mxq.tanh(r) + mxq.sqrt(mxq.abs(x)) / (1.0 + r * r)


def identity(x):
    return x


EPILOGUES = {"identity": identity, "residual": residual_scale, "clipped_sq": clipped_sq, "smooth": smooth}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SHAPES = [(1, 1), (31, 33), (33, 31), (127, 200), (128, 256), (4095, 96), (8192, 64), (256, 4104), (3, 7, 70)]


# the spec every case starts from (each case overrides some of it)
BASE_SPEC = dict(fp8="e4m3", rowwise=True, colwise=False, scale_mode="rceil", scale_layout="compact",
                 amax=False, act=None, dact=None, dbias=False)


def cases(quick: bool):
    """Spec sample: every value of every option appears, crossed with dtypes and shapes."""
    out = []
    base = BASE_SPEC
    variants = []
    for fp8, mode, layout in itertools.product(("e4m3", "e5m2"), ("rceil", "floor", "ceil", "even"),
                                               ("compact", "swizzled")):
        for rw, cw in ((True, False), (False, True), (True, True)):
            variants.append(dict(base, fp8=fp8, scale_mode=mode, scale_layout=layout, rowwise=rw, colwise=cw,
                                 amax=(mode in ("rceil", "even"))))
    for act in mxq.frontend.spec.ACTIVATIONS:
        variants.append(dict(base, act=act, colwise=True, amax=True))
        variants.append(dict(base, dact=act, colwise=True, dbias=True))
    variants.append(dict(base, dbias=True, amax=True, colwise=True, scale_layout="swizzled"))
    for i, v in enumerate(variants):
        epi = "identity"
        if i % 7 == 3:
            epi = "residual"
        if i % 11 == 5:
            epi = "clipped_sq"
        if i % 13 == 6:
            epi = "smooth"
        dtype = ("bf16", "fp16", "fp32")[i % 3]
        shapes = SHAPES[:4] if quick else [SHAPES[i % len(SHAPES)], SHAPES[(i + 4) % len(SHAPES)], (64, 96)]
        out.append((v, epi, dtype, shapes))
    # dbias of a plain cast (v is the input) in every dtype: the index rule above gave the only
    # identity-epilogue dbias variant a user epilogue, and the packed kernel once left such
    # partial sums unset
    for j, dtype in enumerate(("bf16", "fp16", "fp32")):
        shapes = SHAPES[:4] if quick else [SHAPES[(j + 3) % len(SHAPES)], SHAPES[(j + 6) % len(SHAPES)], (64, 96)]
        out.append((dict(base, rowwise=j != 1, colwise=True, dbias=True, amax=j == 2), "identity", dtype, shapes))
    return out


def matrix_cases():
    """Every combination of the kernels' template branches one input can reach: plain cast,
    built-in act, dact, user epilogue x dbias x amax x direction, in each dtype, on an aligned
    shape (the packed / vectorised kernel) and odd ones (N % 8 != 0: the packed kernel's unaligned
    rows for 16-bit inputs, the generic kernel for fp32; several column tiles, odd N). cases() samples
    the options by an index rule, which must not leave a combination unchecked (plain-cast dbias in
    16-bit dtypes once hid a packed-kernel bug that way). Run with --matrix (144 specs,
    576 cases over its 4 shapes)."""
    base = BASE_SPEC
    out = []
    for dtype, kind in itertools.product(("bf16", "fp16", "fp32"), ("plain", "act", "dact", "epilogue")):
        for dbias, amax, (rw, cw) in itertools.product((False, True), (False, True),
                                                       ((True, False), (False, True), (True, True))):
            v = dict(base, rowwise=rw, colwise=cw, dbias=dbias, amax=amax,
                     act="gelu" if kind == "act" else None, dact="srelu" if kind == "dact" else None)
            out.append((v, "clipped_sq" if kind == "epilogue" else "identity", dtype,
                        [(256, 264), (33, 70), (65, 1030), (40, 333)]))
    return out


def check_case(variant, epi_name, dtype_name, shape, seed):
    op = FusedOp(EPILOGUES[epi_name], QuantSpec(**variant))
    m = 1
    for s in shape[:-1]:
        m *= s
    n = shape[-1]
    dtype = DTYPES[dtype_name]
    k = len(op.epilogue.tensor_params)
    ins = [planted(m, n, dtype, seed=seed + j, scale=(1.0, 3.0, 1e-3)[j % 3]).reshape(shape) for j in range(k)]
    kw = {}
    if variant["dact"]:
        kw["act_input"] = planted(m, n, dtype, seed=seed + 7, scale=2.0).reshape(shape)
    want = op.reference(*ins, **kw)
    gins = [t.cuda() for t in ins]
    gkw = {k2: v.cuda() for k2, v in kw.items()}
    out = poisoned(op, gins[0])
    got = op(*gins, out=out, **gkw)
    torch.cuda.synchronize()
    exact = is_exact(op)
    v_abs = v_abs_sum(op, *ins, **kw) if variant["dbias"] and not exact else None
    res = {"spec": variant, "epilogue": epi_name, "dtype": dtype_name, "shape": list(shape), "exact": exact,
           "problems": compare(got, want, exact, v_abs)}
    if want.dbias is not None:
        again = op(*gins, **gkw).dbias
        if not same_bytes(again, got.dbias):
            res["problems"].append("dbias not deterministic")
    # noop: nothing written
    if k == 1 and not variant["dact"]:
        snap = {nm: getattr(got, nm).clone() for nm in ("rowwise_data", "colwise_data", "rowwise_scale",
                                                          "colwise_scale", "amax", "dbias")
                if getattr(got, nm) is not None}
        op(gins[0] * 3, out=got, noop=torch.ones(1, device="cuda"))
        torch.cuda.synchronize()
        for nm, t in snap.items():
            if byte_diff(getattr(got, nm), t)[0]:
                res["problems"].append(f"noop wrote {nm}")
    return res


BENCH_SHAPES = [(8192, 8192), (16384, 16384), (4096, 14336), (32768, 4096)]  # the issue's timed shapes
# N % 8 != 0 (``--odd``): the packed kernel's unaligned rows (16-bit), the generic kernel (fp32)
ODD_SHAPES = [(8192, 8190), (4096, 14335), (8191, 8191)]  # shapes with N % 8 != 0 (docs/performance.md)
HOLD_CYCLES = 2_000_000  # ~1 ms at 1.98 GHz: longer than any timed call takes the host to issue


def time_ms(fn, iters=50, warmup=5, hold=True):
    """Median GPU time of one call of fn between two CUDA events.

    hold=True (the method of every table): a spin kernel queued before the start
    event keeps the GPU busy while the host issues the start event, fn's launches and the end
    event, so the interval is the GPU's time for fn alone (launch processing included, as
    triton's do_bench gets by queueing its cache flush first). hold=False:
    the start event fires on an idle GPU as soon as the host records it, so the interval also
    holds the host's time to issue fn (5-6 us for an mxq launch, more for Triton and
    torch.compile); it is kept in each row as ms_idle_start."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold:
            torch.cuda._sleep(HOLD_CYCLES)
        t = time.perf_counter()
        s.record()
        fn()
        e.record()
        issue_us = (time.perf_counter() - t) * 1e6
        e.synchronize()
        ts.append(s.elapsed_time(e))
        if hold and issue_us > 800:  # the spin (~1 ms) may have run out: say so
            print(f"  note: host took {issue_us:.0f} us to issue a timed call", flush=True)
    return statistics.median(ts)


_equal_copy: dict = {}


def equal_copy_ms(moved):
    """GPU time of torch's copy of moved / 2 bytes (moved / 2 read, moved / 2 written): what a
    pure copy of exactly an op's traffic costs at that size, launch and last wave included. The
    2 GiB copy of pct_copy runs at a rate no smaller transfer reaches (95% of it at 8192^2)."""
    if moved not in _equal_copy:
        a = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        _equal_copy[moved] = time_ms(lambda: b.copy_(a))
        del a, b
    return _equal_copy[moved]


def timed_row(fn, moved, copy_gbps, **fields):
    """A result row: GPU time held (see time_ms) and, for comparison, with an idle start, and
    the row's time against a copy of the same number of bytes (pct_equal_copy)."""
    ms = time_ms(fn)
    gbps = moved / ms / 1e6
    return dict(fields, ms=round(ms, 5), GBps=round(gbps, 1), pct_copy=round(100 * gbps / copy_gbps, 1),
                pct_equal_copy=round(100 * equal_copy_ms(moved) / ms, 1),
                ms_idle_start=round(time_ms(fn, hold=False), 5))


def printed_row(fn, moved, copy_gbps, name, m, n, problems=None):
    """timed_row of ``fn``, printed as a line; ``problems``: the list a check before it returned
    (recorded as ``checked``; None: not checked)."""
    fields = {} if problems is None else {"checked": problems == []}
    row = timed_row(fn, moved, copy_gbps, name=name, M=m, N=n, **fields)
    note = "" if problems is None else f"  checked={problems == []} {problems[:2]}"
    print(f"  {name:34s} {m}x{n} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of copy{note}", flush=True)
    return row


def error_row(name, m, n, exc, why="not served"):
    """The row of a case that could not run here (a kernel not served yet, a peer that fails), printed."""
    print(f"  {name:34s} {m}x{n} {why}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    return dict(name=name, M=m, N=n, error=f"{type(exc).__name__}: {str(exc)[:300]}")


def copy_bandwidth(numel=2 ** 30, hold=True):
    a = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), iters=20, hold=hold)
    return 2 * a.numel() * 2 / ms / 1e6  # GB/s, read + write


OPS = {
    "rowwise": dict(rowwise=True),
    "colwise": dict(rowwise=False, colwise=True),
    "both": dict(rowwise=True, colwise=True),
    "gelu_both": dict(rowwise=True, colwise=True, act="gelu"),
    "dgelu_dbias_both": dict(rowwise=True, colwise=True, dact="gelu", dbias=True),
}


def moved_bytes(opts, m, n, esize=2):
    """Bytes the op must move: each input read once, each output written once (``esize``: bytes
    per input element)."""
    nout = opts.get("rowwise", True) + opts.get("colwise", False)
    return m * n * esize * (1 + ("dact" in opts)) + nout * (m * n + m * n // 32) + (n * esize if opts.get("dbias") else 0)


def bench(copy_gbps, shapes, tuning=None, prefix="mxq", ops=None, dtype="bf16", row_align=None):
    """Kernel time: a prepared launch (no Python checks or allocation between launches). Rows of
    another input dtype than bf16 (the issue's) carry a ``dtype`` field. ``row_align``: into an
    out= of FP8 rows aligned to it (MXFP8Tensor.empty(row_align=...); 1: contiguous); None: the
    library's own outputs (rows padded to 16 bytes at N % 8 != 0)."""
    rows = []
    tdtype = DTYPES[dtype]
    esize = torch.finfo(tdtype).bits // 8
    for (m, n) in shapes:
        x = torch.randn(m, n, device="cuda", dtype=tdtype)
        a = torch.randn(m, n, device="cuda", dtype=tdtype)
        for name, opts in OPS.items():
            if ops and name not in ops:
                continue
            op = FusedOp(identity, QuantSpec(**opts))._with_tuning(make_tuning(tuning))
            padded = {} if row_align is None else {"out": MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device,
                                                                            row_align=row_align)}
            launch, out = op.prepare(x, **({"act_input": a} if "dact" in opts else {}), **padded)
            extra = {} if dtype == "bf16" else {"dtype": dtype}
            row = timed_row(launch, moved_bytes(opts, m, n, esize), copy_gbps, name=f"{prefix}/{name}", M=m, N=n,
                            **extra)
            rows.append(row)
            print(f"  {row['name']:24s} {dtype} {m:6d}x{n:<6d} {row['ms'] * 1000:8.1f} us {row['GBps']:8.0f} GB/s "
                  f"{row['pct_copy']:5.1f}% ({row['pct_equal_copy']:5.1f}% of an equal copy)  "
                  f"(idle start {row['ms_idle_start'] * 1000:.1f} us)", flush=True)
    return rows


def bias_gelu(x, b):
    return x + b


def residual_scale_silu(x, r, alpha: float = 0.5):
    return x * alpha + r


def gate_mul(g, u):
    return g * u


def bench_operands(copy_gbps, shapes):
    """Epilogues with extra operands (mxq/runtime/operands.py), both directions, bf16: x + bias[N] with
    gelu (against the same op on a materialised [M, N] bias), x * alpha + r with silu, and the
    product of the two halves of a [M, 2N] tensor passed as strided views; and the composition
    a user runs today for the first (bias_gelu_composition), timed on the same inputs. Bytes
    moved count every operand byte read (a bias: N elements) and every output byte."""
    rows = []
    both = dict(rowwise=True, colwise=True)
    out_bytes = lambda m, n: 2 * (m * n + m * n // 32)  # noqa: E731
    for (m, n) in shapes:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        cases = [
            ("bias_gelu_both", FusedOp(bias_gelu, QuantSpec(**both, act="gelu")),
             (x, torch.randn(n, device="cuda", dtype=torch.bfloat16)), 2 * m * n + 2 * n),
            ("bias_full_gelu_both", FusedOp(bias_gelu, QuantSpec(**both, act="gelu")),
             (x, torch.randn(m, n, device="cuda", dtype=torch.bfloat16)), 4 * m * n),
            ("residual_silu_both", FusedOp(residual_scale_silu, QuantSpec(**both, act="silu")),
             (x, torch.randn(m, n, device="cuda", dtype=torch.bfloat16)), 4 * m * n),
        ]
        gu = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
        cases.append(("halves_mul_both", FusedOp(gate_mul, QuantSpec(**both)), (gu[:, :n], gu[:, n:]), 4 * m * n))
        for name, op, args, read in cases:
            launch, out = op.prepare(*args)
            row = timed_row(launch, read + out_bytes(m, n), copy_gbps, name=f"mxq/{name}", M=m, N=n)
            rows.append(row)
            print(f"  {row['name']:24s} bf16 {m:6d}x{n:<6d} {row['ms'] * 1000:8.1f} us {row['GBps']:8.0f} GB/s "
                  f"{row['pct_copy']:5.1f}%", flush=True)
        composed = bias_gelu_composition()
        if composed is not None:  # what a user writes today for the first case, on the same inputs
            b = cases[0][2][1]
            row = timed_row(lambda: composed(x, b), cases[0][3] + out_bytes(m, n), copy_gbps,
                            name="composition/bias_gelu_then_torchao_dim0_dim1", M=m, N=n)
            row["mxq_speedup"] = round(row["ms"] / rows[-len(cases)]["ms"], 2)
            rows.append(row)
            print(f"  {row['name']:24s} bf16 {m:6d}x{n:<6d} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}%  "
                  f"mxq bias_gelu_both is {row['mxq_speedup']}x", flush=True)
    return rows


def bias_gelu_composition():
    """torch's x + b and tanh gelu, then torchao's Triton dim0 and dim1 casts (FLOOR; the sm_100
    gate patched as in load_peers): the composition mxq's bias_gelu_both replaces, or None
    without torchao."""
    try:
        import torchao.utils as tu

        tu.is_sm_at_least_100 = lambda: True
        from torchao.prototype.mx_formats import kernels as tk
    except Exception as exc:
        print(f"composition unavailable: {type(exc).__name__}: {exc}", flush=True)
        return None

    def composed(x, b):
        y = torch.nn.functional.gelu(x + b, approximate="tanh")
        return tk.triton_to_mxfp8_dim0(y, 32, "floor"), tk.triton_to_mxfp8_dim1(y, 32, "floor")

    return composed


def load_peers():
    """torchao's Triton MXFP8 kernels (gated to sm_100 upstream; they run on sm_90 in FLOOR mode
    once the gate is patched) and torch.compile of its to_mx (RCEIL). Benchmark-only peers."""
    peers = {}
    try:
        import torchao.utils as tu

        tu.is_sm_at_least_100 = lambda: True
        from torchao.prototype.mx_formats import kernels as tk
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        peers["torchao/dim0_floor"] = ("rowwise", lambda x: tk.triton_to_mxfp8_dim0(x, 32, "floor"))
        peers["torchao/dim1_floor"] = ("colwise", lambda x: tk.triton_to_mxfp8_dim1(x, 32, "floor"))
        compiled = torch.compile(lambda x: to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL))
        peers["torch.compile/to_mx_rceil"] = ("rowwise", compiled)
    except Exception as exc:  # report, keep benchmarking mxq
        print(f"peers unavailable: {type(exc).__name__}: {exc}", flush=True)
    return peers


def bench_peers(copy_gbps, shapes, rows):
    mxq_gbps = {(r["name"].split("/")[1], r["M"], r["N"]): r["GBps"] for r in rows}
    out = []
    for name, (match, fn) in load_peers().items():
        for (m, n) in shapes:
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            try:
                fn(x)
                row = timed_row(lambda: fn(x), m * n * 2 + m * n + m * n // 32, copy_gbps, name=name, M=m, N=n)
            except Exception as exc:
                print(f"  {name} {m}x{n}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            row["mxq_speedup"] = round(mxq_gbps[(match, m, n)] / row["GBps"], 2)
            out.append(row)
            print(f"  {name:26s} {m:6d}x{n:<6d} {row['ms'] * 1000:8.1f} us {row['GBps']:8.0f} GB/s "
                  f"{row['pct_copy']:5.1f}%  mxq/{match} is {row['mxq_speedup']}x "
                  f"(idle start {row['ms_idle_start'] * 1000:.1f} us)", flush=True)
    return out


def paired_peer_rows(rows, copy_gbps):
    """torchao's dim0 and dim1 kernels back to back (the same two outputs) against mxq's one-pass
    rowwise+colwise: the other reading of the issue's "1.5x torchao's dim0 and dim1 kernels"
    (bench_peers' rows compare each direction alone). Derived from rows timed in the same run:
    the pair's time is the sum of its two rows', its bytes those of mxq/both."""
    by = {(r["name"], r["M"], r["N"]): r for r in rows}
    out = []
    for r in rows:
        if r["name"] != "mxq/both":
            continue
        d0, d1 = by.get(("torchao/dim0_floor", r["M"], r["N"])), by.get(("torchao/dim1_floor", r["M"], r["N"]))
        if d0 is None or d1 is None:
            continue
        ms = d0["ms"] + d1["ms"]
        gbps = moved_bytes(OPS["both"], r["M"], r["N"]) / ms / 1e6
        out.append({"name": "torchao/dim0+dim1_floor", "M": r["M"], "N": r["N"], "ms": round(ms, 5),
                    "GBps": round(gbps, 1), "pct_copy": round(100 * gbps / copy_gbps, 1),
                    "mxq_speedup": round(r["GBps"] / gbps, 2), "mxq_op": "both",
                    "derived": "sum of the torchao/dim0_floor and torchao/dim1_floor rows' times"})
    return out


def python_call_ns(calls=200_000):
    """ns per call of a trivial Python function: the speed of the core this process runs on."""

    def f(a, b):
        return a + b

    t = time.perf_counter()
    for i in range(calls):
        f(i, 1)
    return round((time.perf_counter() - t) / calls * 1e9, 1)


def current_cpu():
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])


def core_speeds():
    """python_call_ns on each CPU this process may use (one pinned after another). On the lent
    H200's 16 vCPUs four ran Python at half the speed of the others (73-95 vs 145-153 ns), and
    a process scheduled on one of them measured 25-27 us per small call instead of 15-16 us."""
    allowed = os.sched_getaffinity(0)
    speeds = {}
    try:
        for c in sorted(allowed):
            os.sched_setaffinity(0, {c})
            speeds[c] = python_call_ns()
    finally:
        os.sched_setaffinity(0, allowed)
    return speeds


def host_overhead(profile=False):
    """Host time of a full Python call (checks + allocation + launch) on the core the OS picked
    and pinned to the fastest core, and GPU time of a small one."""
    speeds = core_speeds()
    print("python ns per trivial call, by CPU:", speeds, flush=True)
    cpu_before = current_cpu()
    host, host_dest, breakdown = host_times(profile)
    result = {"python_call_ns_by_cpu": speeds, "host_cpu": [cpu_before, current_cpu()]}
    allowed = os.sched_getaffinity(0)
    fastest = min(speeds, key=speeds.get)
    try:
        os.sched_setaffinity(0, {fastest})
        pinned, pinned_dest, pinned_breakdown = host_times()
    finally:
        os.sched_setaffinity(0, allowed)
    print(f"pinned to CPU {fastest}: {pinned:.2f} us host per 256x4096 both call "
          f"({pinned_dest:.2f} us with torch.empty outputs); breakdown {pinned_breakdown}", flush=True)
    result.update({"host_us_256x4096_both_fastest_cpu": round(pinned, 2), "fastest_cpu": fastest,
                   "host_us_256x4096_both_torch_alloc_fastest_cpu": round(pinned_dest, 2),
                   "host_breakdown_us_fastest_cpu": pinned_breakdown})
    result.update(small_kernel_gpu_time())
    result.update({"host_us_256x4096_both": round(host, 2), "host_us_256x4096_both_torch_alloc": round(host_dest, 2),
                   "host_breakdown_us": breakdown})
    return result


def host_times(profile=False):
    """(us per full call, us per call down the torch.empty route, breakdown) in this process."""
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    mxq.quantize(x, rowwise=True, colwise=True)
    torch.cuda.synchronize()
    n = 3000

    def loop():
        for _ in range(n):
            mxq.quantize(x, rowwise=True, colwise=True)

    loop()  # warm (also after a change of CPU)
    torch.cuda.synchronize()
    t = time.perf_counter()
    loop()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    # the same call down the destination-passing route (Python allocates with torch.empty)
    launcher = next(iter(mxq.op._quantize_op(QuantSpec(rowwise=True, colwise=True))._launchers.values()))
    launcher.native_alloc = False
    launcher.op._fast.clear()  # the fast path would keep taking the allocating route
    loop()
    torch.cuda.synchronize()
    t = time.perf_counter()
    loop()
    host_dest = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    launcher.native_alloc = True
    breakdown = host_breakdown(x, launcher, n)
    print("host breakdown (us per call):", breakdown, flush=True)
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.runcall(loop)
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    return host, host_dest, breakdown


def small_kernel_gpu_time():
    """GPU time of one 1024x1024 rowwise kernel (CUDA graph of 50 launches)."""
    y = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    launch, _ = FusedOp(identity, QuantSpec()).prepare(y)
    for _ in range(10):
        launch()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(200):
        launch()
    e.record()
    e.synchronize()
    back_to_back = s.elapsed_time(e) / 200 * 1000  # bounded below by the host's launch rate
    gpu, method = back_to_back, "back-to-back launches"
    try:  # a CUDA graph of 50 launches: the GPU's own time per kernel, launch gaps shrunk
        g, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(50):
                launch()
        g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(20):
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / 50 * 1000)
        gpu, method = statistics.median(ts), "CUDA graph of 50 launches"
    except Exception as exc:  # report, keep the back-to-back number
        print(f"graph timing unavailable: {type(exc).__name__}: {exc}", flush=True)
    print(f"1024x1024 rowwise: {gpu:.2f} us per kernel ({method}); {back_to_back:.2f} us back to back", flush=True)
    return {"gpu_us_1024x1024_method": method, "gpu_us_1024x1024_back_to_back": round(back_to_back, 2),
            "gpu_us_1024x1024_rowwise": round(gpu, 2)}


def host_breakdown(x, launcher, n):
    """Where a small call's host time goes: the native allocate-and-launch call alone (and with
    one allocation per direction instead of one for both), the compiled kernel function alone
    on bound arguments (the floor of any TVM-FFI launch), and torch allocating the same four
    outputs."""
    op = launcher.op
    native = launcher.allocating
    fn, args, _ = launcher.bind(Call([x], []))

    def per_call(f):
        f()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            f()
        dt = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        return round(dt, 2)

    def torch_outputs():
        MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)

    from mxq.runtime import ffi

    share, ffi.SHARED_ALLOC_MAX_BYTES = ffi.SHARED_ALLOC_MAX_BYTES, 0
    try:  # the same call with one allocation per direction (what calls above the limit get)
        unshared = FusedOp(identity, op.spec)._native_dispatchers()[1]
    finally:
        ffi.SHARED_ALLOC_MAX_BYTES = share
    unshared(x, None, None)
    out = MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device)
    dest = launcher.dispatch
    parts = {}
    if op._fast_call((x,), None, None) is not None:  # a decorated op's fast path: _fast_call -> allocating
        parts["fast_call"] = per_call(lambda: op._fast_call((x,), None, None))
    # the same results kept, then dropped together: how much of a call is freeing the last one's
    kept = [native(x, None, None) for _ in range(n)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    del kept
    parts["free_one_result"] = round((time.perf_counter() - t) / n * 1e6, 2)
    r = native(x, None, None)
    t0 = [r.rowwise_data, r.rowwise_scale, r.colwise_data, r.colwise_scale]
    parts["mxfp8tensor_init"] = per_call(lambda: MXFP8Tensor(t0[0], t0[2], t0[1], t0[3], None, None, "e4m3", "compact",
                                                             x.shape))
    return {**parts, "native_alloc_call_with_mxfp8tensor": per_call(lambda: native(x, None, None)),
            "native_alloc_call_one_allocation_per_direction": per_call(lambda: unshared(x, None, None)),
            "native_dest_call": per_call(lambda: dest(x, None, out.rowwise_data, out.rowwise_scale, out.colwise_data,
                                                      out.colwise_scale, None, None, None)),
            "kernel_function_call": per_call(lambda: fn(*args)),
            "torch_empty_outputs": per_call(torch_outputs),
            "python_checks": per_call(lambda: mxq.runtime.validation.check_call(op.spec, op.epilogue, Call([x], [])))}


PROFILED_RANGE = "mxq_launch"  # (the NVTX range bench/ncu.py profiles inside)


def launch_for_profiler(launch, times: int = 4):
    """Run ``launch`` once (compiling, autotuning), then ``times`` times inside the NVTX range
    PROFILED_RANGE, for a profiler (bench/ncu.py profiles only kernels inside it)."""
    launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(PROFILED_RANGE)
    for _ in range(times):
        launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def pick_shapes(text: str, quick: bool, shapes: list) -> list:
    """A benchmark's shapes: ``text``'s ('MxN,MxN', each one of ``shapes``: a ValueError names
    another), else the first two of ``shapes`` with ``quick``, else all of them."""
    if not text:
        return shapes[:2] if quick else shapes
    picked = [parse_shape(s) for s in text.split(",")]
    for s in picked:
        if s not in shapes:
            raise ValueError(f"--shapes: {s[0]}x{s[1]} is not one of {', '.join(f'{m}x{n}' for m, n in shapes)}")
    return picked


def parse_shape(text: str) -> tuple[int, int]:
    """'8192x4096' -> (8192, 4096); anything else is a ValueError naming it."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"a shape is MxN with positive integers, got {text!r}")
    return int(parts[0]), int(parts[1])


def parse_tuning(variant: str) -> dict:
    """'pdl=0,row_scale_l2_keep=0' -> {'pdl': False, 'row_scale_l2_keep': False}: fields of
    mxq.kernels.config.Tuning (the benchmark-only switches: booleans as 0/1, integers and
    strings as such, e.g. 'vec_unaligned_copy=words'), plus 'ops=a+b' to limit a variant to those
    ops and 'dtype=fp32' to time it on that input dtype (default bf16; strings both). See
    make_tuning."""
    import dataclasses

    from mxq.kernels.config import Tuning

    types = {f.name: f.type for f in dataclasses.fields(Tuning)}
    out = {}
    for k, v in (kv.split("=") for kv in variant.split(",") if kv):
        kind = types.get(k)
        if k in ("ops", "dtype") or kind in (str, "str"):
            out[k] = v
        else:
            out[k] = int(v) if kind in (int, "int", "int | None") else bool(int(v))
    return out


def bench_variants(copy_gbps, shapes, variants: str) -> list:
    """Rows of each Tuning variant of ``variants`` ('k=v,...;k=v', see parse_tuning) on ``shapes``:
    'ops=a+b' limits a variant to those ops, 'dtype=fp32' times it on that input dtype."""
    rows = []
    for variant in filter(None, variants.split(";")):
        tuning = parse_tuning(variant)
        ops = tuning.pop("ops", "")
        dtype = tuning.pop("dtype", "bf16")
        rows += bench(copy_gbps, shapes, tuning, prefix=f"mxq[{variant}]", ops=set(filter(None, ops.split("+"))),
                      dtype=dtype)
    return rows


def make_tuning(tuning: dict | None):
    """A Tuning from parse_tuning's dict (None: the library's choice); unknown names are a
    TypeError naming them."""
    from mxq.kernels.config import Tuning

    return Tuning(**tuning) if tuning else None


def write_results(out, dev: str, result: dict, suffix: str = "") -> Path:
    """Write ``result`` as <out>/<device>-<yyyymmdd><suffix>.json, led by the date, the kernel
    layer's hash (mxq.frontend.codegen.kernels_hash: which kernels were timed) and the command."""
    from mxq.frontend.codegen import kernels_hash

    result = {"date": time.strftime("%Y-%m-%d"), "kernel_layer": kernels_hash(),
              "command": " ".join(["python", *sys.argv]), **result}
    Path(out).mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() else "-" for c in dev).strip("-").lower()
    path = Path(out) / f"{name}-{time.strftime('%Y%m%d')}{suffix}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--matrix", action="store_true",
                    help="check matrix_cases() (every branch combination) instead of cases(); results file -matrix")
    ap.add_argument("--variants", default="", help="also time Tuning variants, e.g. 'pdl=0;row_scale_l2_keep=0' ('ops=a+b' limits one to those ops)")
    ap.add_argument("--profile", action="store_true", help="cProfile the host path of a small call")
    ap.add_argument("--host", action="store_true", help="with --no-bench: still measure the host overhead")
    ap.add_argument("--dtypes", default="fp16,fp32",
                    help="also time these input dtypes (rows_dtypes; the issue's table is bf16)")
    ap.add_argument("--odd", action="store_true", help="also time ODD_SHAPES (rows_odd)")
    ap.add_argument("--odd-only", action="store_true", help="time only ODD_SHAPES, bf16 then fp32 (rows_odd; writes -odd)")
    ap.add_argument("--shard", default="", help="I/N: check only every N-th case from I (parallel processes; "
                    "writes -shardI; with --no-bench)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.environ.setdefault("MXQ_STRICT", "1")
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}  torch {torch.__version__}  python {platform.python_version()}", flush=True)
    results, t0 = [], time.time()
    todo = [] if args.no_check else matrix_cases() if args.matrix else cases(args.quick)
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        todo = todo[i::n]
    for i, (variant, epi, dtype, shapes) in enumerate(todo):
        for shape in shapes:
            try:
                r = check_case(variant, epi, dtype, shape, seed=i * 31 + len(shape))
            except Exception as exc:  # report and go on: one broken spec must not hide the rest
                r = {"spec": variant, "epilogue": epi, "dtype": dtype, "shape": list(shape),
                     "problems": [f"{type(exc).__name__}: {str(exc)[:400]}"]}
            results.append(r)
            if r["problems"]:
                print("FAIL", r["spec"], epi, dtype, shape, r["problems"], flush=True)
    bad = [r for r in results if r["problems"]]
    print(f"correctness: {len(results) - len(bad)}/{len(results)} cases bit-exact within their class "
          f"({time.time() - t0:.0f} s)", flush=True)
    summary = {"device": dev, "date": time.strftime("%Y-%m-%d"), "checks": len(results), "failures": len(bad),
               "failed": bad[:50]}
    if args.odd_only:
        copy = copy_bandwidth()
        print(f"copy bandwidth: {copy:.0f} GB/s", flush=True)
        summary["copy_GBps"] = round(copy, 1)
        for name in ("both", "dgelu_dbias_both"):  # one full-size odd shape, every byte
            r = check_case(dict(BASE_SPEC, **OPS[name]), "identity", "bf16", ODD_SHAPES[-1], seed=1)
            summary.setdefault("odd_checks", []).append({"op": name, "shape": r["shape"], "problems": r["problems"]})
            print("odd check", name, ODD_SHAPES[-1], r["problems"] or "bit-exact", flush=True)
        summary["rows_odd"] = bench(copy, ODD_SHAPES) + bench(copy, ODD_SHAPES, dtype="fp32")
        # the library's outputs are FP8 rows padded to 16 bytes (variant rows8, performance.md steps 12
        # and 14); contiguous ones (out= of row_align=1) take the realigned stores
        summary["rows_odd"] += bench(copy, ODD_SHAPES, prefix="mxq[row_align=1]", row_align=1)
        summary["rows_odd"] += bench_variants(copy, ODD_SHAPES, args.variants)  # e.g. 'unaligned_warps=4'
        summary["copy_same_bytes"] = {f"{m}x{n}": round(copy_bandwidth(m * n), 1) for (m, n) in ODD_SHAPES}
        write_results(args.out, dev, summary, "-odd")
        return
    if not args.no_bench:
        copy = copy_bandwidth()
        print(f"copy bandwidth: {copy:.0f} GB/s", flush=True)
        summary["copy_GBps"] = round(copy, 1)
        shapes = BENCH_SHAPES
        summary["rows"] = bench(copy, shapes)
        summary["copy_same_bytes"] = {f"{m}x{n}": round(copy_bandwidth(m * n), 1) for (m, n) in shapes}
        summary["copy_same_bytes_idle_start"] = {f"{m}x{n}": round(copy_bandwidth(m * n, hold=False), 1)
                                                 for (m, n) in shapes}
        summary["timing"] = ("median of 50 event-timed calls, GPU held by a spin kernel while the host "
                             "issues each (ms); ms_idle_start: the same without the spin kernel")
        print("copy of each shape's input bytes (GB/s):", summary["copy_same_bytes"], "idle start:",
              summary["copy_same_bytes_idle_start"], flush=True)
        variant_rows = bench_variants(copy, shapes, args.variants)
        if variant_rows:
            summary["rows_variants"] = variant_rows
        for dtype in filter(None, args.dtypes.split(",")):
            summary.setdefault("rows_dtypes", []).extend(bench(copy, shapes, dtype=dtype))
        if args.odd:
            summary["rows_odd"] = bench(copy, ODD_SHAPES)
        summary["rows_operands"] = bench_operands(copy, shapes)
        summary["rows"] += bench_peers(copy, shapes, summary["rows"])
        summary["rows"] += paired_peer_rows(summary["rows"], copy)
    if not args.no_bench or args.host:
        summary.update(host_overhead(args.profile))
        print(f"{summary['host_us_256x4096_both']} us host per 256x4096 both call on CPU(s) {summary['host_cpu']} "
              f"({summary['host_us_256x4096_both_fastest_cpu']} us pinned to CPU {summary['fastest_cpu']}; "
              f"{summary['host_us_256x4096_both_torch_alloc']} us with torch.empty outputs); "
              f"{summary['gpu_us_1024x1024_rowwise']} us GPU for 1024x1024 rowwise", flush=True)
    write_results(args.out, dev, summary, ("-matrix" if args.matrix else "") + (
        f"-shard{args.shard.split('/')[0]}" if args.shard else ""))


if __name__ == "__main__":
    main()
