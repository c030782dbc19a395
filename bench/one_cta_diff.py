"""Where Tuning.halves_one_cta goes wrong (a diagnostic for one device call).

On 2026-12-01 the one-CTA gated backward failed test_gated.py::test_one_cta_halves_match_reference
for geglu, bf16, N = 256, with dbias (86 rowwise bytes off by up to 161 codes, and two more
fields), while swiglu, sreglu, fp16 and N = 96 passed. This runs that case (and its passing
neighbours) with the default two-CTA kernel and the one-CTA kernel on the same inputs and prints,
for every output field that differs from the two-CTA kernel's bytes, the rows and columns of the
differing bytes (and which half, which warp's rows, which lane's columns they fall in), so the
faulty pass or index shows in one run.

    python bench/one_cta_diff.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mxq  # noqa: E402
from mxq.kernels.config import Tuning  # noqa: E402
from mxq.testing import poisoned  # noqa: E402


def _ident(x):
    return x


def run(name, dtype, n, seed, two):
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(100, 2 * n, generator=gen) * 2).to(dtype)
    grad = torch.randn(100, n, generator=gen).to(dtype)
    op = mxq.fused_quant(dact=name, rowwise=True, colwise=True, dbias=True)(_ident)
    inner = op.inner
    inner._tuning = Tuning(halves_one_cta=not two)
    cu = [grad.cuda(), a[:, :n].cuda(), a[:, n:].cuda()]
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
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    for name, dtype, n in [("geglu", torch.bfloat16, 256), ("geglu", torch.float16, 256), ("swiglu", torch.bfloat16, 256),
                           ("geglu", torch.bfloat16, 96)]:
        for seed in range(args.seeds):
            two = run(name, dtype, n, seed, two=True)
            one = run(name, dtype, n, seed, two=False)
            lines = [where(f, getattr(one, f), getattr(two, f), n)
                     for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "dbias")]
            lines = [ln for ln in lines if ln]
            print(f"{name} {str(dtype)[6:]} N={n} seed {seed}: {'same bytes' if not lines else ''}", flush=True)
            for ln in lines:
                print("   ", ln, flush=True)


if __name__ == "__main__":
    main()
