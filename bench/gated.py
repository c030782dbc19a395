"""Gated activations on the GPU: SwiGLU forward and backward + dbias, rowwise +
colwise, bf16, against a device copy of the same bytes, each checked against the reference first.

    python bench/gated.py [--out DIR]

Shapes are the gated output's [M, N] (the input is [M, 2N]): forward reads 2MN inputs and writes
two [M, N] FP8 copies with scales; backward reads the [M, N] gradient and the [M, 2N] forward
input and writes two [M, 2N] FP8 copies with scales and a [2N] dbias. Timing: bench/device_check.py's
busy-GPU method on a prepared launch; the user-epilogue form over half views for comparison, and
the backward with Tuning(halves_one_cta=False) (one CTA per half instead of one for both).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import device_check as dc  # noqa: E402

import mxq  # noqa: E402
from mxq.kernels.config import Tuning  # noqa: E402
from mxq.testing import compare, v_abs_sum  # noqa: E402

SHAPES = [(8192, 8192), (16384, 16384), (4096, 14336), (32768, 4096)]


def _ident(x):
    return x


@mxq.fused_quant(rowwise=True, colwise=True)
def swiglu_views(g, u):
    return mxq.silu(g) * u


def scale_bytes(m, n):
    return m * (n // 32) + (m // 32) * n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    args = ap.parse_args()
    copy_gbps = dc.copy_bandwidth()
    print(f"copy: {copy_gbps:.0f} GB/s", flush=True)
    fwd = mxq.fused_quant(act="swiglu", rowwise=True, colwise=True)(_ident)
    bwd = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident)
    # the same backward with one CTA per half (the default writes both halves from one CTA)
    bwd2 = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident).inner
    bwd2._with_tuning(Tuning(halves_one_cta=False))
    rows = []
    for m, n in SHAPES[:1] if args.quick else SHAPES:
        x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        checks = {}
        if m * n <= 2 ** 26:  # the reference on the GPU (torch ops) for the check
            checks["fwd"] = compare(fwd(x), fwd.reference(x), exact=False) == []
            checks["views"] = compare(swiglu_views(x[:, :n], x[:, n:]), fwd(x), exact=True) == []
            v_abs = v_abs_sum(bwd.inner, g, x[:, :n], x[:, n:], 0.0)
            checks["bwd"] = compare(bwd(g, act_input=x), bwd.reference(g, act_input=x), False, v_abs) == []
            checks["bwd_2cta"] = compare(bwd2(g, x[:, :n], x[:, n:], 0.0), bwd.reference(g, act_input=x), False,
                                         v_abs) == []
        cases = [
            ("mxq/swiglu_fwd_both", fwd.prepare(x)[0], m * 2 * n * 2 + 2 * (m * n + 0) + scale_bytes(m, n)),
            ("mxq/swiglu_views_both", swiglu_views.prepare(x[:, :n], x[:, n:])[0], m * 2 * n * 2 + 2 * m * n + scale_bytes(m, n)),
            ("mxq/swiglu_bwd_dbias_both", bwd.prepare(g, act_input=x)[0],
             m * n * 2 + m * 2 * n * 2 + 2 * (2 * m * n) + scale_bytes(m, 2 * n) + 2 * n * 2),
            ("mxq/swiglu_bwd_dbias_both_2cta", bwd2.prepare(g, x[:, :n], x[:, n:], 0.0)[0],
             m * n * 2 + m * 2 * n * 2 + 2 * (2 * m * n) + scale_bytes(m, 2 * n) + 2 * n * 2),
        ]
        for name, launch, moved in cases:
            row = dc.timed_row(launch, moved, copy_gbps, name=name, M=m, N=n, checks=checks)
            rows.append(row)
            print(f"  {name:28s} {m:6d}x{n:<6d} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of copy "
                  f"({row['pct_equal_copy']:5.1f}% of an equal copy) {checks}", flush=True)
    dev = torch.cuda.get_device_name()
    dc.write_results(args.out, dev, {"device": dev, "copy_GBps": round(copy_gbps, 1), "torch": torch.__version__,
                                     "rows": rows}, "-gated")


if __name__ == "__main__":
    main()
