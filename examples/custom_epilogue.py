"""A user epilogue fused in front of the MXFP8 cast: residual add, scaling and a clamp.

The function body is parsed (never executed to build the kernel) into mxq's IR; the same body
also runs eagerly on torch tensors, which is how you can check it by hand, as done below.
Run: python examples/custom_epilogue.py
"""

import torch

import mxq

LIMIT = 8.0  # captured constants become part of the op's fingerprint


@mxq.fused_quant(fp8="e4m3", rowwise=True, colwise=True, scale_mode="floor")
def residual_clamp(x, r, alpha: float = 1.0):
    y = x * alpha + r
    return mxq.minimum(mxq.maximum(y, -LIMIT), LIMIT)


def main() -> None:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(256, 1000, device=device, dtype=torch.bfloat16) * 4
    r = torch.randn(256, 1000, device=device, dtype=torch.bfloat16)

    t = residual_clamp(x, r, alpha=0.5)  # the kernel on CUDA, the reference on CPU

    # the same thing by hand: evaluate the epilogue eagerly in fp32, round to bf16, quantize
    v = residual_clamp.fn(x.float(), r.float(), 0.5).to(torch.bfloat16)
    by_hand = mxq.quantize(v, rowwise=True, colwise=True, scale_mode="floor")
    same = torch.equal(t.rowwise_data.view(torch.uint8), by_hand.rowwise_data.view(torch.uint8)) and \
        torch.equal(t.colwise_scale, by_hand.colwise_scale)
    print(f"ran on {device}: {t}")
    print("matches quantize(epilogue computed by hand):", same)
    print("epilogue fingerprint:", residual_clamp.epilogue.fingerprint)
    print("values never exceed the clamp:", t.dequantize().abs().max().item() <= LIMIT)
    assert same


if __name__ == "__main__":
    main()
