"""FP8 block scaling end to end: an MLP trained through torch._scaled_mm next to its bf16 twin.

``FP8BlockMLP`` is a torch.autograd.Function for ``y = gelu(x w1^T + b1) w2^T + b2``:

- forward: x is quantized 1x128 (rowwise for the GEMM, the transposed colwise copy kept for the
  weight gradient); the first GEMM's output goes through one fused mxq op, bias + gelu +
  quantize (``act="gelu"``), into the second GEMM; weights are quantized 128x128;
- backward: dy is quantized 1x128 with its bias gradient fused (``dbias=True``); the gradient of
  the hidden activation goes through one fused op, dgelu + dbias + quantize (``dact="gelu"``);
- every GEMM (forward, dgrad, wgrad) is ``torch._scaled_mm`` on mxq's ``scale_layout="gemm"``
  outputs exactly as the README writes it on CUDA, and its float emulation on CPU.

Both models start from the same weights and see the same batches; after 300 steps their losses
agree within 0.5%. The FP8 GEMM dims must be multiples of 16 (cuBLAS refuses others):
``scaled_mm`` says so before calling it. On CUDA the weights' dims are multiples of 512 (the
H200's torch 2.11 takes 128x128 scales only at multiples of 4 blocks; docs/NUMERICS.md), on CPU
a smaller model keeps the emulated run short.
"""

import time

import torch

import mxq

GEMM = dict(format="fp8_block", colwise=True, scale_layout="gemm")  # 1x128 activations and gradients
WEIGHT = dict(GEMM, block=(128, 128))


@mxq.fused_quant(act="gelu", **GEMM)
def bias_gelu(h, b):
    return h + b


@mxq.fused_quant(dact="gelu", dbias=True, **GEMM)
def dgelu(g):
    return g


@mxq.fused_quant(dbias=True, **GEMM)
def grad_out(g):
    return g


def scaled_mm(a, b, scale_a, scale_b):
    """a [M, K] @ b [K, N] in bf16 from FP8 operands and their block scales (1x128 or 128x128)."""
    if any(d % 16 for d in (*a.shape, b.shape[1])):
        raise ValueError(f"FP8 GEMM dims must be multiples of 16, got [{a.shape[0]}, {a.shape[1]}] x "
                         f"[{b.shape[0]}, {b.shape[1]}]: pad the batch or the layer")
    if a.is_cuda:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    m, k = a.shape
    n = b.shape[1]
    kb = torch.arange(k) // 128
    rows = torch.arange(m) if scale_a.shape[0] == m else torch.arange(m) // 128
    cols = torch.arange(n) if scale_b.shape[1] == n else torch.arange(n) // 128
    da = a.float() * scale_a[rows][:, kb]
    db = b.float() * scale_b[kb][:, cols]
    return (da @ db).bfloat16()


class FP8BlockMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        qx = mxq.quantize(x, **GEMM)
        qw1, qw2 = mxq.quantize(w1, **WEIGHT), mxq.quantize(w2, **WEIGHT)
        h = scaled_mm(qx.rowwise_data, qw1.rowwise_data.t(), qx.rowwise_scale, qw1.rowwise_scale.t())
        qa = bias_gelu(h, b1)  # bias + gelu + 1x128 quantization, one op
        y = scaled_mm(qa.rowwise_data, qw2.rowwise_data.t(), qa.rowwise_scale, qw2.rowwise_scale.t()) + b2
        ctx.save_for_backward(h + b1)  # gelu's input, for dgelu
        ctx.q = qx, qa, qw1, qw2
        return y

    @staticmethod
    def backward(ctx, dy):
        (pre,), (qx, qa, qw1, qw2) = ctx.saved_tensors, ctx.q
        qdy = grad_out(dy.contiguous())  # 1x128 both directions, db2 fused
        da = scaled_mm(qdy.rowwise_data, qw2.colwise_data.t(), qdy.rowwise_scale, qw2.colwise_scale.t())
        dw2 = scaled_mm(qdy.colwise_data, qa.colwise_data.t(), qdy.colwise_scale, qa.colwise_scale.t())
        qdh = dgelu(da, act_input=pre)  # dgelu + db1 + 1x128 quantization, one op
        dw1 = scaled_mm(qdh.colwise_data, qx.colwise_data.t(), qdh.colwise_scale, qx.colwise_scale.t())
        return None, dw1, qdh.dbias, dw2, qdy.dbias


def bf16_mlp(x, w1, b1, w2, b2):
    return torch.nn.functional.gelu(x @ w1.t() + b1, approximate="tanh") @ w2.t() + b2


def train(forward, params, batches, target, lr=0.02):
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    for x in batches:
        loss = torch.nn.functional.mse_loss(forward(x, *params).float(), target(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(steps=300, batch=128):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d_in, hidden, d_out = (512, 1024, 512) if device == "cuda" else (128, 256, 128)
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    batches = [torch.randn(batch, d_in, generator=g).bfloat16().to(device) for _ in range(steps)]
    noise = [0.5 * torch.randn(batch, d_out, generator=g).to(device) for _ in range(steps)]
    targets = {x.data_ptr(): torch.tanh(x.float() @ teacher.to(device).t()) + e for x, e in zip(batches, noise)}
    init = [torch.randn(hidden, d_in, generator=g) / d_in ** 0.5, torch.zeros(hidden),
            torch.randn(d_out, hidden, generator=g) / hidden ** 0.5, torch.zeros(d_out)]

    def params():
        return [p.bfloat16().to(device).requires_grad_() for p in init]

    t0 = time.time()
    fp8 = train(FP8BlockMLP.apply, params(), batches, lambda x: targets[x.data_ptr()])
    t1 = time.time()
    ref = train(bf16_mlp, params(), batches, lambda x: targets[x.data_ptr()])
    t2 = time.time()
    tail_fp8, tail_ref = sum(fp8[-50:]) / 50, sum(ref[-50:]) / 50  # the last 50 steps' mean loss
    gap = abs(tail_fp8 - tail_ref) / tail_ref
    print(f"{device}: MLP {d_in} -> {hidden} -> {d_out}, batch {batch}; first loss fp8_block {fp8[0]:.4f}, "
          f"bf16 {ref[0]:.4f}")
    print(f"after {steps} steps (mean of the last 50): fp8_block {tail_fp8:.5f}, bf16 {tail_ref:.5f} "
          f"({100 * gap:.3f}% apart); {t1 - t0:.1f} s and {t2 - t1:.1f} s")
    assert tail_fp8 < 0.6 * fp8[0], "the FP8 model did not train"
    assert gap < 0.005, f"losses {100 * gap:.2f}% apart (more than 0.5%)"


if __name__ == "__main__":
    import warnings

    with warnings.catch_warnings():  # (a CUDA call the kernels do not serve runs the torch reference)
        warnings.filterwarnings("ignore", message="mxq: running the torch reference")
        main()
