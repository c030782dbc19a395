"""Grouped MXFP8 for mixture-of-experts training: token groups of any size, and expert weights.

Run: python examples/grouped_experts.py

1. Tokens routed to 4 experts, sorted by expert, with cumulative group ends `offs` (the
   convention of torch._grouped_mm), sizes that are not multiples of 32 and one empty group:
   `mxq.quantize(x, colwise=True, group_offsets=offs)` restarts the colwise 32-row blocks at every
   group, as the weight-gradient GEMM (which contracts over tokens) needs; `t.group(g)` is group
   g alone, byte-equal to quantizing its rows by themselves.
2. 3-D expert weights [E, N, K] are E equal groups of N rows.
3. The experts' gated MLP: their first grouped GEMM writes [T, 2N] (gate | up); `act="swiglu"`
   with the same `offs` quantizes SwiGLU's output for the second GEMM, and `dact="swiglu"` the
   gradient of both halves, with each expert's bias gradient ([G, 2N]).
On CUDA the grouped kernels run in one launch with no host sync, in both directions.
"""

import torch

import mxq
from mxq.testing import compare

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


@mxq.fused_quant(act="swiglu", rowwise=True, colwise=True)
def swiglu(h):
    return h


@mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)
def dswiglu(grad):
    return grad


h = torch.randn(sum(sizes), 2 * 64, dtype=torch.bfloat16, device=device)  # the experts' [T, 2N] outputs
grad = torch.randn(sum(sizes), 64, dtype=torch.bfloat16, device=device)
fwd, bwd = swiglu(h, group_offsets=offs), dswiglu(grad, act_input=h, group_offsets=offs)
print(f"swiglu of {tuple(h.shape)} by expert: {tuple(fwd.shape)}; backward {tuple(bwd.shape)}, "
      f"dbias per expert {tuple(bwd.dbias.shape)}")
start = 0
for g, size in enumerate(sizes):
    rows = slice(start, start + size)
    alone_f, alone_b = swiglu(h[rows]), dswiglu(grad[rows], act_input=h[rows])
    part_b = bwd.group(g)
    # (on CPU every byte is equal; on CUDA the check allows NUMERICS' transcendental class, the
    # class of silu's formulas)
    assert compare(fwd.group(g), alone_f, exact=device == "cpu") == [], g
    assert torch.allclose(part_b.dbias.float(), alone_b.dbias.float(), rtol=2 ** -7, atol=1e-3), g
    part_b.dbias = alone_b.dbias = None
    assert compare(part_b, alone_b, exact=device == "cpu") == [], g
    start += size
print("each expert's SwiGLU forward and backward equal running it on its tokens alone "
      f"({'byte for byte' if device == 'cpu' else 'within the transcendental class'})")
