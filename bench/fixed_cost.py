"""Fixed costs: the host's per eager call (``host``), and a kernel's fixed part (the default).

``host``: host time per eager call on 256 x 4096 bf16 CUDA tensors, for every kind of call (the
built-in quantize, a decorated op with row, column, full and strided operands, floats, keywords,
``out=``, ``noop``, ``group_offsets``, a gated op, ``op.prepare()``'s launch), as a ratio to
torch's own per-op floor (``y.copy_(x)``) timed in alternation with the case (host_pair: the
host's speed drifts within a run): wall time of many calls with torch.cuda.synchronize only at
the ends, best of several repeats. Each case's outputs are
first checked against ``op.reference`` (NUMERICS.md's classes). ``--dry``: build every case and
run it once on the CPU (the reference), timing nothing (what the CPU tests run). A timed run also
times the pieces of one allocating call (host_parts: torch's allocations, the native call, the
conversion of its outputs to torch tensors, the result object), each alone, and torch's own
allocating ops (one, two and three outputs) and torchao's MXFP8 casts beside the floor
(host_peers), to show what bounds the ratio.

    python bench/fixed_cost.py host [PATH]      # PATH default $OUT/<kind>-host.json (nvidia-h200-host.json)

The default: split a kernel's time into a fixed part and a bandwidth part, against a copy of the
same bytes.

Why: an op can run below a copy's rate at the smaller shapes and at it at the larger ones.
Timing each op over a sweep of sizes and fitting time = fixed + bytes / bandwidth tells
whether the gap is a per-launch cost (launch, ramp-up, the last wave's drain), which a tiling
change can move, or a bandwidth cost. The copy is torch's copy of exactly the bytes the op
moves (half read, half written). Each tuning variant is checked byte for byte against the
torch reference (NUMERICS.md's exactness classes) at the first size before it is timed.

    python bench/fixed_cost.py --out $OUT [--variants "pdl=0;row_scale_l2_keep=0"] [--ops rowwise+both]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check import (OPS, compare, equal_copy_ms, identity, is_exact, moved_bytes,  # noqa: E402
                          make_tuning, parse_tuning, time_ms, write_results)

from mxq.op import FusedOp  # noqa: E402
from mxq.tensor import MXFP8Tensor  # noqa: E402
from mxq.frontend.spec import QuantSpec  # noqa: E402
from mxq.testing import v_abs_sum  # noqa: E402

ROWS = (1024, 2048, 4096, 8192, 16384, 32768)
# besides device_check's ops: dgelu without dbias, to price dbias (its fp64 partials and dbias_kernel)
FIT_OPS = dict(OPS, dgelu_both=dict(rowwise=True, colwise=True, dact="gelu"))


def fit(points):
    """Least-squares (fixed us, GB/s) of time = fixed + bytes / bandwidth over (bytes, ms)."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx  # ms per byte
    return round((my - slope * mx) * 1000, 2), round(1 / slope / 1e6, 1)


def copy_points(sizes):
    return [(moved, equal_copy_ms(moved)) for moved in sizes]


def op_points(opts, tuning, n, rows):
    op = FusedOp(identity, QuantSpec(**opts))._with_tuning(make_tuning(tuning))
    pts, problems = [], []
    for i, m in enumerate(rows):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        kw = {"act_input": torch.randn_like(x)} if "dact" in opts else {}
        launch, out = op.prepare(x, **kw)
        if i == 0:
            launch()
            exact = is_exact(op)
            v_abs = v_abs_sum(op, x, **kw) if opts.get("dbias") and not exact else None
            problems = compare(out, op.reference(x, **kw), exact, v_abs)  # NUMERICS.md's classes
        pts.append((moved_bytes(opts, m, n), time_ms(launch)))
    return pts, problems


HOST_SHAPE = (256, 4096)
HOST_TARGET = 1.5  # x torch's floor, every eager call (op.prepare()'s launch: 1.0)


def host_cases(device: str) -> list:
    """(name, fn, op or None, reference thunk or None, target) for every kind of eager call; the
    tensors made on ``device``."""
    from mxq import fused_quant, quantize
    from mxq.op import _quantize_op

    m, n = HOST_SHAPE
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=torch.bfloat16)

    x, r, b, col = rand(m, n), rand(m, n), rand(n), rand(m, 1)
    wide = rand(m, 2 * n)
    view = wide[:, :n]  # a strided 2-D view (row stride 2N)

    @fused_quant(rowwise=True, colwise=True, act="gelu")
    def bias_gelu(x, b):
        return x + b

    @fused_quant(rowwise=True, colwise=True, act="silu")
    def axpy_silu(x, alpha: float, r):
        return x * alpha + r

    @fused_quant(rowwise=True, colwise=True)
    def scaled(x, alpha: float):
        return x * alpha

    @fused_quant(rowwise=True, colwise=True, act="swiglu")
    def swiglu(x):
        return x

    both = _quantize_op(QuantSpec(rowwise=True, colwise=True))
    row = _quantize_op(QuantSpec())
    out = MXFP8Tensor.empty(both.spec, x.shape, x.dtype, x.device)
    op_out = MXFP8Tensor.empty(bias_gelu.spec, x.shape, x.dtype, x.device)
    noop = torch.zeros(1, device=device)
    offsets = torch.tensor([m // 8 * (i + 1) for i in range(8)], dtype=torch.int32, device=device)
    launch, _ = (None, None) if device == "cpu" else both.prepare(x)
    t = HOST_TARGET
    return [
        ("quantize(x)", lambda: quantize(x), row, lambda: row.reference(x), t),
        ("quantize(x, colwise=True)", lambda: quantize(x, colwise=True), both, lambda: both.reference(x), t),
        ("quantize(x, colwise=True, out=t)", lambda: quantize(x, colwise=True, out=out), both,
         lambda: both.reference(x), t),
        ("row [N] operand: x + b, gelu, both", lambda: bias_gelu(x, b), bias_gelu, lambda: bias_gelu.reference(x, b), t),
        ("column [M,1] operand: x + c, gelu, both", lambda: bias_gelu(x, col), bias_gelu,
         lambda: bias_gelu.reference(x, col), t),
        ("full operand + float: x * alpha + r, silu, both", lambda: axpy_silu(x, 0.5, r), axpy_silu,
         lambda: axpy_silu.reference(x, 0.5, r), t),
        ("float only: x * alpha, both", lambda: scaled(x, 0.5), scaled, lambda: scaled.reference(x, 0.5), t),
        ("strided view x[:, :N] + b, gelu, both", lambda: bias_gelu(view, b), bias_gelu,
         lambda: bias_gelu.reference(view, b), t),
        ("keywords: op(x, b=b)", lambda: bias_gelu(x, b=b), bias_gelu, lambda: bias_gelu.reference(x, b), t),
        ("op out=: x + b into out", lambda: bias_gelu(x, b, out=op_out), bias_gelu,
         lambda: bias_gelu.reference(x, b), t),
        ("noop=0 with out=", lambda: quantize(x, colwise=True, noop=noop, out=out), both, lambda: both.reference(x), t),
        ("noop=0 alone", lambda: quantize(x, colwise=True, noop=noop), both, lambda: both.reference(x), t),
        ("group_offsets (8 groups), both", lambda: quantize(x, colwise=True, group_offsets=offsets), both,
         lambda: both.reference(x, group_offsets=offsets), t),
        ("gated: swiglu forward [M, 2N], both", lambda: swiglu(wide), swiglu, lambda: swiglu.reference(wide), t),
        ("op.prepare() launch, both", launch, None, None, 1.0),
    ]


# (out= case, its allocating counterpart): an out= call must be no slower (ratio <= 1.0)
OUT_PAIRS = (("quantize(x, colwise=True, out=t)", "quantize(x, colwise=True)"),
             ("op out=: x + b into out", "row [N] operand: x + b, gelu, both"),
             ("noop=0 with out=", "noop=0 alone"))


def out_vs_alloc(rows) -> list:
    """Each OUT_PAIRS case's time over its allocating counterpart's (rows: host_main's)."""
    us = {row["case"]: row["us"] for row in rows}
    return [{"out": o, "alloc": a, "ratio": round(us[o] / us[a], 2), "meets": us[o] <= us[a]}
            for o, a in OUT_PAIRS if o in us and a in us]


def host_parts(device: str = "cuda") -> list:
    """(name, fn) of the pieces of one allocating call of ``quantize(x, colwise=True)`` on its
    native route (launch.Launcher.allocating), each timed alone: where the host's time goes. The
    route is taken once first (it is kept after a checked call)."""
    from mxq import quantize
    from mxq.op import _quantize_op

    m, n = HOST_SHAPE
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    both = _quantize_op(QuantSpec(rowwise=True, colwise=True))
    quantize(x, colwise=True)
    quantize(x, colwise=True)
    fast = both._fast.get((x.dtype, x.get_device()))
    if fast is None or fast.allocating is None:
        return []
    args = (x, None, None, None)  # (*tensors, act_input, noop, group_offsets)
    launch, _ = both.prepare(x)
    return [
        ("torch.empty(1), one allocation", lambda: torch.empty(1, device=device)),
        ("torch.empty x4 (the outputs' count, [M, N] uint8 each)",
         lambda: [torch.empty(m, n, device=device, dtype=torch.uint8) for _ in range(4)]),
        ("op.prepare() launch (TVM-FFI call + launch)", launch),
        ("allocating route: native allocate + launch + MXFP8Tensor (one callback)", lambda: fast.allocating(*args)),
        ("quantize(x, colwise=True): the whole call", lambda: quantize(x, colwise=True)),
    ]


def host_peers(device: str = "cuda") -> list:
    """(name, fn) of torch's own allocating ops and torchao's MXFP8 casts on the same input, each
    timed beside the floor as the cases are: what an op that returns fresh tensors costs the host
    in torch itself (one output, two, three), and what the kernels people quantize with today
    cost per call. torchao's are left out where it does not import."""
    m, n = HOST_SHAPE
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    peers = [
        ("torch: x.to(float8_e4m3fn), one output", lambda: x.to(torch.float8_e4m3fn)),
        ("torch: torch.aminmax(x), two outputs", lambda: torch.aminmax(x)),
        ("torch: native_layer_norm(x), three outputs", lambda: torch.native_layer_norm(x, (n,), None, None, 1e-5)),
    ]
    if device != "cuda":  # (torchao's casts are Triton kernels: CUDA only)
        return peers
    try:
        import torchao.utils as tu

        tu.is_sm_at_least_100 = lambda: True  # (their Triton casts run on sm_90 in FLOOR mode: device_check.load_peers)
        from torchao.prototype.mx_formats import kernels as tk
    except Exception as exc:  # (benchmark-only peers: reported, not needed)
        print(f"torchao peers unavailable: {type(exc).__name__}: {exc}", flush=True)
        return peers
    return peers + [
        ("torchao: triton_to_mxfp8_dim0(x), rowwise MXFP8", lambda: tk.triton_to_mxfp8_dim0(x, 32, "floor")),
        ("torchao: dim0 + dim1 casts, both directions",
         lambda: (tk.triton_to_mxfp8_dim0(x, 32, "floor"), tk.triton_to_mxfp8_dim1(x, 32, "floor"))),
    ]


def host_us(fn, calls: int = 2000, repeats: int = 7, sync=None) -> float:
    """Host time per call: ``calls`` calls between two synchronizations, best of ``repeats``."""
    return host_pair(fn, None, calls, repeats, sync)[0]


def host_pair(fn, floor, calls: int = 2000, repeats: int = 7, sync=None) -> tuple:
    """(us per call of ``fn``, of ``floor``) timed in alternation: each repeat runs ``calls`` calls
    of ``floor``, then of ``fn``, each between two synchronizations (``sync``: torch's CUDA one),
    and each keeps its best. The host's speed drifts during a run (the floor measured 9.81 us
    before the cases and 6.71 after them in one run): a case's ratio to a floor timed beside it
    does not take that drift. ``floor`` None: ``fn`` alone (floor's time NaN)."""
    sync = torch.cuda.synchronize if sync is None else sync
    pieces = [f for f in (floor, fn) if f is not None]
    for f in pieces:
        for _ in range(50):
            f()
    sync()
    best = {id(f): float("inf") for f in pieces}
    for _ in range(repeats):
        for f in pieces:
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            sync()
            best[id(f)] = min(best[id(f)], (time.perf_counter() - t0) / calls)
    return best[id(fn)] * 1e6, (best[id(floor)] * 1e6 if floor is not None else float("nan"))


def host_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="fixed_cost.py host")
    ap.add_argument("path", nargs="?", help="default: $OUT/<device kind>-host.json (nvidia-h200-host.json on an H200)")
    ap.add_argument("--dry", action="store_true", help="build every case and run it once on the CPU; no timing")
    args = ap.parse_args(argv)
    if args.dry:
        for name, fn, op, ref, _ in host_cases("cpu"):
            if fn is not None:
                fn()
        for _, fn in host_peers("cpu"):
            fn()
        names = [case[0] for case in host_cases("cpu")]
        assert all(o in names and a in names for o, a in OUT_PAIRS), "OUT_PAIRS names a case host_cases lacks"
        print(f"{len(names)} cases build and run on the CPU (--dry: nothing timed)")
        return 0
    if not torch.cuda.is_available():
        print("fixed_cost.py host: needs a CUDA device (use --dry on a machine without one)", file=sys.stderr)
        return 2
    if args.path is None:  # (each machine's host is its own CPU: one file per device kind)
        kind = "nvidia-" + torch.cuda.get_device_name().split()[1].lower()  # "NVIDIA H100 80GB HBM3" -> nvidia-h100
        args.path = str(Path(os.environ.get("OUT", ".")) / f"{kind}-host.json")
    cases = host_cases("cuda")
    failures = []
    for name, fn, op, ref, _ in cases:  # every case's bytes first (its second call: the fast routes)
        if ref is not None:
            fn()
            problems = compare(fn(), ref(), is_exact(op))
            if problems:
                failures.append({"case": name, "problems": problems})
    x = torch.randn(*HOST_SHAPE, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy = lambda: y.copy_(x)  # noqa: E731  (torch's per-op floor)
    floor = host_us(copy)
    rows = []
    for name, fn, _, _, target in cases:  # (each case beside its own floor: host_pair)
        us, near = host_pair(fn, copy)
        rows.append({"case": name, "us": round(us, 2), "floor_us": round(near, 2), "x_floor": round(us / near, 2),
                     "target_x_floor": target, "meets": us / near <= target})
    parts = [{"part": name, "us": round(host_us(fn), 2)} for name, fn in host_parts()]
    peers = []
    for name, fn in host_peers():
        us, near = host_pair(fn, copy)
        peers.append({"peer": name, "us": round(us, 2), "floor_us": round(near, 2), "x_floor": round(us / near, 2)})
    floor_end = host_us(lambda: y.copy_(x))  # (the CPU's speed drifts: the floor before and after)
    print(f"torch floor y.copy_(x), 256x4096 bf16: {floor:.2f} us per call (after the cases: {floor_end:.2f})")
    print(f"{'eager call (256 x 4096 bf16, CUDA)':52s} {'us':>7s} {'floor':>7s} {'x floor':>8s}  target")
    for row in rows:
        print(f"{row['case']:52s} {row['us']:7.2f} {row['floor_us']:7.2f} {row['x_floor']:8.2f}  <= "
              f"{row['target_x_floor']}" + ("" if row["meets"] else "  MISSED"))
    pairs = out_vs_alloc(rows)
    for pair in pairs:
        print(f"out= against allocating: {pair['out']} / {pair['alloc']}: {pair['ratio']:.2f}  <= 1.0"
              + ("" if pair["meets"] else "  MISSED"))
    print("where one allocating call's time goes (quantize(x, colwise=True), each piece alone):")
    for part in parts:
        print(f"  {part['part']:60s} {part['us']:7.2f} us  {part['us'] / floor:5.2f}x floor")
    print("torch's own allocating ops and torchao's casts on the same input, each beside its floor:")
    for peer in peers:
        print(f"  {peer['peer']:60s} {peer['us']:7.2f} us  {peer['x_floor']:5.2f}x floor")
    if failures:
        print("WRONG BYTES:", failures)
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
              "method": "wall time of 2000 eager calls between two torch.cuda.synchronize, best of 7, after 50 "
                        "warm-up calls; ratio to torch's y.copy_(x) on the same tensors timed in alternation with "
                        "each case (its floor_us; floor_us and floor_us_after: the floor alone before and after)",
              "cpu_affinity": sorted(os.sched_getaffinity(0)), "floor_us": round(floor, 2),
              "floor_us_after": round(floor_end, 2), "cases": rows, "out_vs_alloc": pairs, "parts": parts, "peers": peers, "checks": len(cases) - 1,
              "failures": failures}
    Path(args.path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.path).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.path)
    return 1 if failures else 0


def main():
    if sys.argv[1:2] == ["host"]:
        sys.exit(host_main(sys.argv[2:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--ops", default="rowwise+both")
    ap.add_argument("--variants", default="", help="';'-separated tunings, e.g. 'pdl=0;row_scale_l2_keep=0'")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    result = {"device": dev, "date": time.strftime("%Y-%m-%d"), "N": args.n, "rows": list(ROWS), "fits": []}
    copy_pts = None
    for name in args.ops.split("+"):
        opts = FIT_OPS[name]
        sizes = [moved_bytes(opts, m, args.n) for m in ROWS]
        copy_pts = copy_points(sizes)
        fixed, bw = fit(copy_pts)
        result["fits"].append({"name": f"copy/{name}-bytes", "fixed_us": fixed, "GBps": bw,
                               "us": [round(t * 1000, 2) for _, t in copy_pts]})
        print(f"{'copy/' + name + '-bytes':34s} fixed {fixed:6.2f} us  {bw:7.0f} GB/s  "
              + " ".join(f"{t * 1000:7.1f}" for _, t in copy_pts), flush=True)
        for variant in [""] + [v for v in args.variants.split(";") if v]:
            tuning = parse_tuning(variant)
            try:
                pts, problems = op_points(opts, tuning, args.n, ROWS)
            except Exception as exc:  # a variant that cannot serve this op: say so, go on
                print(f"mxq/{name}[{variant}]: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            fixed, bw = fit(pts)
            label = f"mxq/{name}" + (f"[{variant}]" if variant else "")
            pct = [round(100 * c / t, 1) for (_, t), (_, c) in zip(pts, copy_pts)]
            result["fits"].append({"name": label, "fixed_us": fixed, "GBps": bw, "problems": problems,
                                   "us": [round(t * 1000, 2) for _, t in pts], "pct_of_same_bytes_copy": pct})
            print(f"{label:34s} fixed {fixed:6.2f} us  {bw:7.0f} GB/s  "
                  + " ".join(f"{t * 1000:7.1f}" for _, t in pts)
                  + f"  ({' '.join(map(str, pct))} % of copy)" + (f"  WRONG: {problems}" if problems else ""),
                  flush=True)
    write_results(args.out, dev, result, "-fixed-cost")


if __name__ == "__main__":
    main()
