"""Training with MXFP8 operands: an MLP block whose forward fuses bias + GELU + MXFP8 quantize and
whose backward fuses dGELU + dbias + MXFP8 quantize, against the same model in bf16.

Run: python examples/train_mlp.py [--steps 300] [--device cuda]

The block is y = W2 gelu(W1 x + b1) + b2 as a torch.autograd.Function. Every GEMM reads MXFP8
operands quantized along its contraction dimension (32-element blocks, E8M0 scales):
- forward: x and W1 rowwise (blocks along K); the fused op `bias_gelu` turns h = x W1^T into
  gelu(h + b1) quantized rowwise (for W2's GEMM) and colwise (for W2's gradient);
- backward: the fused op `dgelu` turns the incoming gradient into dgelu(z) * g quantized rowwise
  (for dx) and colwise (for dW1) and sums dbias (b1's gradient) in the same pass.
The GEMMs here dequantize their operands and multiply in bf16 (Hopper and CPU have no MXFP8
GEMM; on sm_100+ torch._scaled_mm with block scales would take the same bytes directly). Both
models start from the same weights and see the same batches of a synthetic regression task; the
script prints both loss curves and checks that the MXFP8 run tracks the bf16 one.
"""

from __future__ import annotations

import argparse

import torch

import mxq


@mxq.fused_quant(act="gelu", rowwise=True, colwise=True)
def bias_gelu(h, b):
    return h + b


@mxq.fused_quant(dact="gelu", dbias=True, rowwise=True, colwise=True)
def dgelu(g):
    return g


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b^T from MXFP8 operands (dequantized, multiplied in bf16, accumulated in fp32)."""
    return (a.bfloat16() @ b.bfloat16().t()).float()


class MXLinearGelu(torch.autograd.Function):
    """gelu(x W^T + b) for the next layer, with every GEMM operand in MXFP8."""

    @staticmethod
    def forward(ctx, x, w, b):
        xq = mxq.quantize(x, rowwise=True, colwise=True)
        wq = mxq.quantize(w, rowwise=True, colwise=True)
        h = gemm(xq.dequantize("rowwise"), wq.dequantize("rowwise")).to(x.dtype)
        z = h + b  # the pre-activation, kept for dgelu (bf16)
        a = bias_gelu(h, b)  # gelu(h + b) in one pass, both directions
        ctx.save_for_backward(xq.colwise_data, xq.colwise_scale, wq.colwise_data, wq.colwise_scale, z)
        ctx.shapes = (x.shape, w.shape)
        return a.dequantize("rowwise").to(x.dtype)  # (the next GEMM's operand, as bf16 values)

    @staticmethod
    def backward(ctx, grad_a):
        xd, xs, wd, ws, z = ctx.saved_tensors
        xshape, wshape = ctx.shapes
        xq = mxq.MXFP8Tensor(None, xd, None, xs, None, None, "e4m3", "compact", xshape)
        wq = mxq.MXFP8Tensor(None, wd, None, ws, None, None, "e4m3", "compact", wshape)
        d = dgelu(grad_a.contiguous().to(z.dtype), act_input=z)  # dgelu(z) * g, quantized, and dbias
        dx = gemm(d.dequantize("rowwise"), wq.dequantize("colwise").t().contiguous()).to(grad_a.dtype)
        dw = gemm(d.dequantize("colwise").t().contiguous(), xq.dequantize("colwise").t().contiguous())
        return dx, dw.to(grad_a.dtype), d.dbias


def train(steps: int, fp8: bool, seed: int = 0, device: str = "cpu") -> list[float]:
    g = torch.Generator().manual_seed(seed)
    d_in, d_hidden, d_out, batch = 64, 256, 32, 128
    teacher = (torch.randn(d_out, d_in, generator=g) / d_in ** 0.5).to(device)
    w1 = (torch.randn(d_hidden, d_in, generator=g) / d_in ** 0.5).bfloat16().to(device).requires_grad_()
    b1 = torch.zeros(d_hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    w2 = (torch.randn(d_out, d_hidden, generator=g) / d_hidden ** 0.5).bfloat16().to(device).requires_grad_()
    opt = torch.optim.SGD([w1, b1, w2], lr=0.2)
    data = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, d_in, generator=data).to(device)
        target = torch.tanh(x @ teacher.t()).bfloat16()
        x = x.bfloat16()
        if fp8:
            a = MXLinearGelu.apply(x, w1, b1)
        else:
            a = torch.nn.functional.gelu(x @ w1.t() + b1, approximate="tanh")
        loss = ((a @ w2.t() - target).float() ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the quantize kernels run on CUDA)")
    args = ap.parse_args()
    ref = train(args.steps, fp8=False, device=args.device)
    mx = train(args.steps, fp8=True, device=args.device)
    print(f"on {args.device}; GEMMs: dequantized MXFP8 operands, bf16 matmul (no MXFP8 GEMM used here)")
    for i in range(0, args.steps, max(1, args.steps // 6)):
        print(f"step {i:4d}: loss bf16 {ref[i]:.4f}   mxfp8 {mx[i]:.4f}")
    tail = slice(-max(1, args.steps // 10), None)
    r, m = sum(ref[tail]) / len(ref[tail]), sum(mx[tail]) / len(mx[tail])
    print(f"mean loss over the last {len(ref[tail])} steps: bf16 {r:.4f}, mxfp8 {m:.4f} ({(m / r - 1) * 100:+.1f}%)")
    # Tolerance: e4m3 keeps 3 mantissa bits, so each GEMM operand carries a relative rounding error
    # of at most 2^-4 (and the block scale can cost one more bit to the smaller values of a block);
    # these errors are unbiased and average out over K = 64..256 products, so the two curves should
    # stay within a few percent of each other. 15% leaves room for the synthetic task's noise.
    assert mx[-1] < 0.5 * mx[0], "the MXFP8 model did not learn"
    assert abs(m / r - 1) < 0.15, "the MXFP8 loss curve left the bf16 one"


if __name__ == "__main__":
    main()
