"""Grouped MXFP8 for mixture-of-experts training: token groups of any size, and expert weights.

Run: python examples/grouped_experts.py

1. Tokens routed to 4 experts, sorted by expert, with cumulative group ends `offs` (the
   convention of torch._grouped_mm), sizes that are not multiples of 32 and one empty group:
   `mxq.quantize(x, colwise=True, group_offsets=offs)` restarts the colwise 32-row blocks at every
   group, as the weight-gradient GEMM (which contracts over tokens) needs; `t.group(g)` is group
   g alone, byte-equal to quantizing its rows by themselves.
2. 3-D expert weights [E, N, K] are E equal groups of N rows.
(On CUDA the grouped path runs the torch reference for now, with a one-time warning.)
"""

import warnings

import torch

import mxq

warnings.simplefilter("ignore", RuntimeWarning)  # the CUDA fallback notice, if any
device = "cuda" if torch.cuda.is_available() else "cpu"

sizes = [45, 0, 100, 31]
x = torch.randn(sum(sizes), 256, dtype=torch.bfloat16, device=device)
offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32).to(device)
t = mxq.quantize(x, rowwise=True, colwise=True, group_offsets=offs)
print(f"tokens {tuple(x.shape)} in groups of {sizes}: colwise scales {tuple(t.colwise_scale.shape)} "
      f"(M // 32 + G rows, whatever the sizes)")
start = 0
for g, size in enumerate(sizes):
    alone = mxq.quantize(x[start:start + size], rowwise=True, colwise=True)
    same = all(torch.equal(getattr(t.group(g), f).view(torch.uint8), getattr(alone, f).view(torch.uint8))
               for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"))
    print(f"group {g} ({size} rows): same bytes as quantizing it alone: {same}")
    assert same
    start += size

w = torch.randn(4, 128, 256, dtype=torch.bfloat16, device=device)  # [E, N, K]
tw = mxq.quantize(w, rowwise=True, colwise=True, group_offsets=torch.arange(1, 5, device=device) * 128)
ok = all(torch.equal(tw.group(e).colwise_scale, mxq.quantize(w[e], colwise=True).colwise_scale) for e in range(4))
print("expert weights [4, 128, 256] as 4 equal groups: colwise scales per expert equal:", ok)
assert ok
