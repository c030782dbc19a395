"""Quantize a tensor to MXFP8 and look at what comes back.

Run: python examples/quickstart.py
On a CPU machine this runs mxq's torch reference; on a CUDA tensor the same call runs the
generated kernel. Scales are E8M0 bytes: a block's values were multiplied by 2^(127 - byte).
"""

import torch

import mxq


def main() -> None:
    torch.manual_seed(0)
    # Planted on purpose: rows of very different magnitudes (1, 1e-3, 50, 1e4) and one NaN.
    x = torch.randn(4, 96, dtype=torch.bfloat16) * torch.tensor([[1.0], [1e-3], [50.0], [1e4]]).bfloat16()
    x[0, 7] = float("nan")  # one NaN: its whole 32-element block becomes NaN (scale byte 255)
    print("input: 4 x 96 bf16, rows scaled by 1, 1e-3, 50 and 1e4, with a NaN planted at [0, 7]")

    t = mxq.quantize(x, fp8="e4m3", rowwise=True, colwise=True, scale_mode="rceil", amax=True)
    print(t)
    print("rowwise scale bytes [M, N/32]:\n", t.rowwise_scale)
    print("colwise scale bytes [M/32, N] (first 8 columns):", t.colwise_scale[:, :8].tolist())
    print("amax:", t.amax.item(), "(NaN: the planted NaN propagates into the amax)")

    finite = ~torch.isnan(t.dequantize("rowwise"))
    err = (t.dequantize("rowwise") - x.float()).abs()[finite]
    rel = err / x.float().abs()[finite].clamp_min(1e-30)
    print(f"round trip (finite blocks): max abs error {err.max().item():.3g}, "
          f"median relative error {rel.median().item():.3g}")
    print("  (expected: the large absolute error is in the row scaled by 1e4; e4m3 keeps 3 mantissa bits,")
    print("  so a value near 3e4 rounds by up to ~2e3; the relative error is the number to read)")


if __name__ == "__main__":
    main()
