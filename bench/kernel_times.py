"""Per-kernel GPU time of an op's launch, from the CUDA profiler (torch.profiler / CUPTI).

Why: an op with dbias or amax launches more than one kernel, and the event timing of
device_check.py sees only their sum. Which kernel holds the time decides what to change (for
dbias: the quantize kernel's partial sums or dbias_kernel's reduction). Each variant is
checked against the torch reference (NUMERICS.md's classes) before it is profiled.

    python bench/kernel_times.py --out $OUT [--ops dgelu_dbias_both+dgelu_both] [--variants "pdl=0"]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check import BENCH_SHAPES, HOLD_CYCLES, compare, identity, is_exact, make_tuning, parse_tuning, write_results  # noqa: E402
from fixed_cost import FIT_OPS  # noqa: E402

from mxq.op import FusedOp  # noqa: E402
from mxq.frontend.spec import QuantSpec  # noqa: E402


def short_name(kernel: str) -> str:
    """'kernel_cutlass_packed_kernel_mxqkernels...' -> 'packed_kernel'."""
    m = re.match(r"kernel_cutlass_(\w+?)_(?:tensorptr|Tensor|mxqkernels|\d)", kernel)
    return m.group(1) if m else kernel[:40]


def kernel_us(launch, iters: int = 20) -> dict:
    """Mean device time per launch of each kernel the launch runs, in us."""
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            torch.cuda._sleep(HOLD_CYCLES // 4)  # keep the launches back to back on the GPU
            launch()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "sleep" not in ev.name:
            total[short_name(ev.name)] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    return {k: round(v / iters, 2) for k, v in total.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="dgelu_dbias_both+dgelu_both")
    ap.add_argument("--variants", default="", help="';'-separated tunings, e.g. 'pdl=0'")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    result = {"device": dev, "date": time.strftime("%Y-%m-%d"), "rows": []}
    for m, n in BENCH_SHAPES:
        torch.manual_seed(m * 100_003 + n)  # the same data in every run (unseeded before 2026-11-30's last runs)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        g = torch.randn_like(x)
        for name in args.ops.split("+"):
            opts = FIT_OPS[name]
            kw = {"act_input": g} if "dact" in opts else {}
            for variant in [""] + [v for v in args.variants.split(";") if v]:
                op = FusedOp(identity, QuantSpec(**opts))
                op._tuning = make_tuning(parse_tuning(variant))
                launch, out = op.prepare(x, **kw)
                launch()
                problems = compare(out, op.reference(x, **kw), is_exact(op))
                times = kernel_us(launch)
                label = f"mxq/{name}" + (f"[{variant}]" if variant else "")
                result["rows"].append({"name": label, "M": m, "N": n, "kernel_us": times, "problems": problems})
                print(f"{label:34s} {m:6d}x{n:<6d} " + "  ".join(f"{k} {v:7.2f}" for k, v in times.items())
                      + (f"  WRONG: {problems}" if problems else ""), flush=True)
    write_results(args.out, dev, result, "-kernel-times")


if __name__ == "__main__":
    main()
