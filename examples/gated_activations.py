"""Gated activations (SwiGLU, GeGLU, ...) as one-line epilogues over the two halves of a tensor.

Run: python examples/gated_activations.py

A gated MLP's first GEMM writes [M, 2N]: the gate half goes through an activation and multiplies
the other half. In mxq that is an epilogue over the two strided views x[:, :N] and x[:, N:]
(read in place by the kernels, no copy), calling a built-in activation:

    @mxq.fused_quant(rowwise=True, colwise=True)
    def swiglu(g, u):
        return mxq.silu(g) * u

The script checks each gated form against the same formula evaluated eagerly on the halves and
then quantized (same bytes), on CPU with the reference, on CUDA with the kernels.
"""

import torch

import mxq


@mxq.fused_quant(rowwise=True, colwise=True)
def swiglu(g, u):
    return mxq.silu(g) * u


@mxq.fused_quant(rowwise=True, colwise=True)
def geglu(g, u):
    return mxq.gelu(g) * u


@mxq.fused_quant(rowwise=True, colwise=True)
def reglu(g, u):
    return mxq.relu(g) * u


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(256, 2 * 512, device=device, dtype=torch.bfloat16)
    g, u = x[:, :512], x[:, 512:]  # views: the kernels read them in place
    for op, act in ((swiglu, mxq.silu), (geglu, mxq.gelu), (reglu, mxq.relu)):
        t = op(g, u)
        v = (act(g.float()) * u.float()).to(torch.bfloat16)  # the same formula, eagerly
        want = mxq.quantize(v, rowwise=True, colwise=True)
        same = torch.equal(t.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8))
        off = (t.rowwise_data.view(torch.uint8) != want.rowwise_data.view(torch.uint8)).float().mean().item()
        print(f"{op.__name__}: [256, 1024] -> quantized [256, 512]; bytes equal to the eager formula: {same}"
              f"{'' if same else f' ({off:.2%} one-code differences: transcendental class on GPU)'}")
        assert same or (device == "cuda" and off < 1e-3)


if __name__ == "__main__":
    main()
