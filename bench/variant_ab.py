"""Side by side in one process: one op's prepared call under two compiled variants, same tensors.

    python bench/variant_ab.py [--variants generic,rows8] [--row-align 16] [--ops both,gelu_both]
                               [--dtype bf16] [--rounds 3] [--out DIR]

For each op of device_check.OPS and each of its odd shapes, the call is prepared once per variant
(launch.variant_for forced to return it) into FP8 outputs padded to ``--row-align`` bytes (1:
contiguous), the outputs of the variants are compared byte for byte (every output slot), and
each is timed with device_check.time_ms, alternating A, B, A, B, ... over ``--rounds`` rounds
(best per variant). Prints one line per (op, shape) and writes variant-ab.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import device_check as dc  # noqa: E402

from mxq.runtime import launch, slots  # noqa: E402
from mxq.op import FusedOp  # noqa: E402
from mxq.frontend.spec import QuantSpec  # noqa: E402
from mxq.tensor import MXFP8Tensor  # noqa: E402


def prepared(opts, x, a, row_align, variant):
    """(launch, out) of one op's call with launch.variant_for forced to ``variant``."""
    op = FusedOp(dc.identity, QuantSpec(**opts))
    out = MXFP8Tensor.empty(op.spec, x.shape, x.dtype, x.device, row_align=row_align)
    keep = launch.variant_for
    launch.variant_for = lambda *args: variant
    try:
        return op.prepare(x, **({"act_input": a} if "dact" in opts else {}), out=out)
    finally:
        launch.variant_for = keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="generic,rows8")
    ap.add_argument("--row-align", type=int, default=16)
    ap.add_argument("--ops", default=",".join(dc.OPS))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    va, vb = args.variants.split(",")
    copy = dc.copy_bandwidth()
    print(f"copy {copy:.0f} GB/s; {va} against {vb}, FP8 rows aligned to {args.row_align} bytes", flush=True)
    rows = []
    tdtype = dc.DTYPES[args.dtype]
    for (m, n) in dc.ODD_SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=tdtype)
        a = torch.randn(m, n, device="cuda", dtype=tdtype)
        for name in args.ops.split(","):
            opts = dc.OPS[name]
            (la, oa), (lb, ob) = (prepared(opts, x, a, args.row_align, v) for v in (va, vb))
            la(); lb()
            torch.cuda.synchronize()
            same = all(dc.same_bytes(getattr(oa, f), getattr(ob, f)) for f in slots.OUTPUTS
                       if getattr(oa, f) is not None)
            best = {va: float("inf"), vb: float("inf")}
            for _ in range(args.rounds):
                for v, fn in ((va, la), (vb, lb)):
                    best[v] = min(best[v], dc.time_ms(fn))
            moved = dc.moved_bytes(opts, m, n, torch.finfo(tdtype).bits // 8)
            pct = {v: round(100 * moved / best[v] / 1e6 / copy, 1) for v in best}
            rows.append(dict(op=name, M=m, N=n, us={v: round(best[v] * 1000, 2) for v in best}, pct_copy=pct,
                             same_bytes=same))
            print(f"  {name:18s} {m:6d}x{n:<6d} {va} {best[va] * 1000:7.1f} us {pct[va]:5.1f}%   "
                  f"{vb} {best[vb] * 1000:7.1f} us {pct[vb]:5.1f}%   {vb}/{va} {best[vb] / best[va]:.3f}  "
                  f"same bytes: {same}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "variant-ab.json").write_text(json.dumps(
        dict(device=torch.cuda.get_device_name(), copy_GBps=round(copy, 1), variants=[va, vb],
             row_align=args.row_align, dtype=args.dtype, rows=rows), indent=1))


if __name__ == "__main__":
    main()
