"""torch.compile on the GPU: fullgraph traces of mxq ops give the eager bytes, and a compiled
function captures in a CUDA graph (mode="reduce-overhead").

    python bench/compile_check.py

Prints one line per check; exits 1 on a mismatch. (CPU counterpart: tests/test_torch_ops.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mxq  # noqa: E402
from mxq.testing import compare  # noqa: E402


@mxq.fused_quant(colwise=True, act="gelu", amax=True)
def resid(x, b, alpha: float = 0.5):
    return x * alpha + b


def f(x, b):
    return mxq.quantize(x, rowwise=True, colwise=True), resid(x, b, alpha=0.25)


def main() -> int:
    bad = 0
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    want = f(x, b)
    for mode, dynamic in ((None, False), (None, True), ("reduce-overhead", False)):
        torch._dynamo.reset()
        cf = torch.compile(f, fullgraph=True, dynamic=dynamic, mode=mode)
        for _ in range(3):  # reduce-overhead records the graph on a later call
            got = cf(x, b)
        torch.cuda.synchronize()
        problems = [p for g, w in zip(got, want) for p in compare(g, w, exact=False)]
        bad += bool(problems)
        print(f"torch.compile(fullgraph=True, dynamic={dynamic}, mode={mode}): "
              f"{'same bytes as eager' if not problems else problems[:2]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
