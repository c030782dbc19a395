"""An MLP block forward with ``op.gemm``: the first projection's GEMM writes FP8 directly.

    y = gelu(x w1^T) w2^T        x [T, D], w1 [F, D], w2 [D, F]

Unfused: ``h = x @ w1.T`` is written in bf16 ([T, F]: the largest tensor of the block), then read
again by a fused mxq op (gelu + 1x128 FP8 block quantization). Fused: ``gelu_q.gemm(x, w1)`` runs
the same op inside the GEMM's epilogue on its fp32 accumulator and writes only the FP8 data and
scales. Both feed the second GEMM, ``torch._scaled_mm`` on the 1x128 activations and 128x128
weight tiles (``scale_layout="gemm"``, as examples/fp8_block_linear.py; its float emulation on
CPU). The two outputs agree within FP8 error: the fused path quantizes the fp32 accumulator, the
unfused one the accumulator rounded to bf16.

Training also needs h's transposed copy (1x128 blocks along T): what w2's weight gradient
``dW2 = dy^T h`` reads. ``gelu_q_train.gemm(x, w1)`` writes it from the same epilogue
(``colwise=True``: the GEMM's cooperative form, whose 128-row tiles hold the colwise blocks), and
the weight gradients from the fused and unfused copies agree within FP8 error too.

On an sm_90 GPU (H100/H200) it runs at an MLP's size and times both paths; elsewhere op.gemm is
the reference (the op on a float32 matmul), shown at a small size.
"""

import torch

import mxq

GEMM = dict(format="fp8_block", scale_layout="gemm")  # 1x128 rowwise activations


@mxq.fused_quant(act="gelu", **GEMM)
def gelu_q(h):
    return h


@mxq.fused_quant(act="gelu", colwise=True, **GEMM)  # (and h's transposed copy, [F, T])
def gelu_q_train(h):
    return h


def scaled_mm(a, b, scale_a, scale_b):
    """a [M, K] @ b [K, N] in bf16 from FP8 operands and their block scales (1x128 or 128x128)."""
    if a.is_cuda:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    m, k = a.shape
    n = b.shape[1]
    kb = torch.arange(k) // 128
    cols = torch.arange(n) if scale_b.shape[1] == n else torch.arange(n) // 128  # (1x128 or 128x128 blocks)
    return ((a.float() * scale_a[torch.arange(m)][:, kb]) @ (b.float() * scale_b[kb][:, cols])).bfloat16()


def second(qa, qw2):
    return scaled_mm(qa.rowwise_data, qw2.rowwise_data.t(), qa.rowwise_scale, qw2.rowwise_scale.t())


def weight_grad(qdy, qh):
    """dW2 = dy^T h from the two transposed copies ([D, T] and [F, T]: both K-major)."""
    return scaled_mm(qdy.colwise_data, qh.colwise_data.t(), qdy.colwise_scale, qh.colwise_scale.t())


def unfused(x, w1, qw2):
    return second(gelu_q(x @ w1.T), qw2)  # h in bf16, then the fused op on it


def fused(x, w1, qw2):
    return second(gelu_q.gemm(x, w1), qw2)  # h is never written: the GEMM's epilogue quantizes it


def time_ms(fn, iters=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    on_sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    device = "cuda" if on_sm90 else "cpu"
    t, d, f = (8192, 4096, 14336) if on_sm90 else (256, 256, 512)
    if not on_sm90:
        print("no sm_90 GPU: op.gemm runs its reference (the op on a float32 matmul) at a small size")
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(t, d, generator=g, device=device).to(torch.bfloat16)
    w1 = (torch.randn(f, d, generator=g, device=device) / d ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(d, f, generator=g, device=device) / f ** 0.5).to(torch.bfloat16)
    qw2 = mxq.quantize(w2, block=(128, 128), **GEMM)

    y_unfused, y_fused = unfused(x, w1, qw2), fused(x, w1, qw2)
    rel = ((y_fused.float() - y_unfused.float()).norm() / y_unfused.float().norm()).item()
    print(f"MLP block T={t} D={d} F={f}: fused vs unfused output, relative difference {rel:.2e}")
    assert rel < 0.05, rel  # (FP8 e4m3 block quantization of the hidden activations, both ways)
    qdy = mxq.quantize(torch.randn(t, d, generator=g, device=device).to(torch.bfloat16), colwise=True, **GEMM)
    dw2_unfused = weight_grad(qdy, gelu_q_train(x @ w1.T))
    dw2_fused = weight_grad(qdy, gelu_q_train.gemm(x, w1))
    rel = ((dw2_fused.float() - dw2_unfused.float()).norm() / dw2_unfused.float().norm()).item()
    print(f"w2's weight gradient from h's transposed copy, fused vs unfused: relative difference {rel:.2e}")
    assert rel < 0.05, rel
    if on_sm90:
        ms_u = time_ms(lambda: unfused(x, w1, qw2))
        ms_f = time_ms(lambda: fused(x, w1, qw2))
        print(f"forward: unfused {ms_u:.3f} ms, fused (op.gemm) {ms_f:.3f} ms, {ms_u / ms_f:.2f}x")


if __name__ == "__main__":
    main()
