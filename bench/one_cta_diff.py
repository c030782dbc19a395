"""A gated backward with both halves from one CTA (the default, Tuning.halves_one_cta) against one
CTA per half, on the same inputs (a diagnostic for one device call).

On 2026-12-01 the one-CTA backward failed test_gated.py::test_one_cta_halves_match_reference once
(geglu, bf16, N = 256, with dbias: 86 rowwise bytes off by up to 161 codes). This runs that case
and its neighbours both ways and prints, for every output field whose bytes differ, the rows and
columns of the differing bytes (and which half, which warp's rows, which lane's columns), and
both results against the CPU reference under NUMERICS.md's classes; the test's inputs are seed
3. Its run of 2026-12-01 found the same bytes everywhere
(bench/results/nvidia-h200-20261201-checks.txt).

    python bench/one_cta_diff.py [--seeds 0,1,3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mxq  # noqa: E402
from mxq.kernels.config import Tuning  # noqa: E402
from mxq.testing import compare, poisoned, v_abs_sum  # noqa: E402


def _ident(x):
    return x


def inputs(dtype, n, seed):
    """The inputs of test_one_cta_halves_match_reference (which uses seed 3)."""
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(100, 2 * n, generator=gen) * 2).to(dtype)
    grad = torch.randn(100, n, generator=gen).to(dtype)
    return [grad, a[:, :n], a[:, n:]]


def inner_op(name, two):
    op = mxq.fused_quant(dact=name, rowwise=True, colwise=True, dbias=True)(_ident)
    inner = op.inner
    inner._tuning = Tuning(halves_one_cta=not two)
    return inner


def run(name, dtype, n, seed, two):
    inner = inner_op(name, two)
    cu = [t.cuda() for t in inputs(dtype, n, seed)]
    out = inner(*cu, 0.0, out=poisoned(inner, cu[0]))
    torch.cuda.synchronize()
    return out


def where(field, got, want, n):
    d = (got.view(torch.uint8).cpu().to(torch.int16) - want.view(torch.uint8).cpu().to(torch.int16)).abs()
    idx = d.nonzero()
    if not len(idx):
        return None
    if d.dim() == 2:
        rows = sorted(set(idx[:, 0].tolist()))
        cols = sorted(set(idx[:, 1].tolist()))
        halves = sorted({c // n for c in cols}) if field.endswith("data") else "-"
        lanes = sorted({(c % n) % 256 // 8 for c in cols}) if field.endswith("data") else "-"
        return (f"{field}: {len(idx)} bytes, worst {int(d.max())}; rows {rows[:12]}{'...' if len(rows) > 12 else ''} "
                f"(row % 32 -> {sorted({r % 32 for r in rows})}); cols {cols[:16]}{'...' if len(cols) > 16 else ''}; "
                f"halves {halves}; lanes {lanes}")
    return f"{field}: {len(idx)} entries, positions {idx.flatten().tolist()[:24]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,3", help="comma-separated input seeds")
    args = ap.parse_args()
    seeds = [int(v) for v in args.seeds.split(",")]
    for name, dtype, n in [("geglu", torch.bfloat16, 256), ("geglu", torch.float16, 256), ("swiglu", torch.bfloat16, 256),
                           ("geglu", torch.bfloat16, 96)]:
        for seed in seeds:
            two = run(name, dtype, n, seed, two=True)
            one = run(name, dtype, n, seed, two=False)
            lines = [where(f, getattr(one, f), getattr(two, f), n)
                     for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "dbias")]
            lines = [ln for ln in lines if ln]
            print(f"{name} {str(dtype)[6:]} N={n} seed {seed}: {'same bytes' if not lines else ''}", flush=True)
            for ln in lines:
                print("   ", ln, flush=True)
            ref_op = inner_op(name, True)
            args_cpu = inputs(dtype, n, seed) + [0.0]
            want = ref_op.reference(*args_cpu)
            v_abs = v_abs_sum(ref_op, *args_cpu)
            for label, got in (("two-CTA", two), ("one-CTA", one)):
                print(f"    {label} against the reference: {compare(got, want, False, v_abs) or 'within its class'}", flush=True)


if __name__ == "__main__":
    main()
