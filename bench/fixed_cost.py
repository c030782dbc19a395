"""Split a kernel's time into a fixed part and a bandwidth part, against a copy of the same bytes.

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
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check import (OPS, compare, equal_copy_ms, identity, is_exact, moved_bytes,  # noqa: E402
                          make_tuning, parse_tuning, time_ms, write_results)

from mxq.op import FusedOp  # noqa: E402
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


def main():
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
