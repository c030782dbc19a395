"""Gated activations (SwiGLU, GeGLU, ...) as one-line epilogues over the two halves of a tensor.

Run: python examples/gated_activations.py

A gated MLP's first GEMM writes [M, 2N]: the gate half goes through an activation and multiplies
the other half. In mxq that is an epilogue over the two strided views x[:, :N] and x[:, N:]
(read in place by the kernels, no copy), calling a built-in activation:

    @mxq.fused_quant(rowwise=True, colwise=True)
    def swiglu(g, u):
        return mxq.silu(g) * u

The same forms are built in, with their backward (TransformerEngine's set and conventions):
``act="swiglu"`` (also "geglu", "reglu", "qgeglu", "sreglu") takes the [M, 2N] tensor itself
and writes the quantized [M, N]; ``dact="swiglu"`` takes the incoming gradient [M, N] and the
forward's input as ``act_input`` and writes the quantized [M, 2N] gradient of both halves, here
with the bias gradient over 2N columns (formulas: docs/NUMERICS.md, "Gated activations").

The script checks each form against the same formula evaluated eagerly and then quantized (same
bytes), on CPU with the reference, on CUDA with the kernels.
"""

import torch

import mxq
from mxq.frontend.activations import dsilu


@mxq.fused_quant(rowwise=True, colwise=True)
def swiglu(g, u):
    return mxq.silu(g) * u


@mxq.fused_quant(rowwise=True, colwise=True)
def geglu(g, u):
    return mxq.gelu(g) * u


@mxq.fused_quant(rowwise=True, colwise=True)
def reglu(g, u):
    return mxq.relu(g) * u


@mxq.fused_quant(rowwise=True, colwise=True, act="swiglu")
def swiglu_fwd(x):
    return x


@mxq.fused_quant(rowwise=True, colwise=True, dact="swiglu", dbias=True)
def swiglu_bwd(grad):
    return grad


def check(name, t, v, device):
    """t (an MXFP8Tensor) against quantizing v, the eagerly computed value; returns bytes equal."""
    want = mxq.quantize(v, rowwise=True, colwise=True)
    got, ref = t.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8)
    same = torch.equal(got, ref)
    off = (got != ref).float().mean().item()
    print(f"{name}: bytes equal to the eager formula: {same}"
          f"{'' if same else f' ({off:.2%} one-code differences: transcendental class on GPU)'}")
    assert same or (device == "cuda" and off < 1e-3)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(256, 2 * 512, device=device, dtype=torch.bfloat16)
    g, u = x[:, :512], x[:, 512:]  # views: the kernels read them in place
    for op, act in ((swiglu, mxq.silu), (geglu, mxq.gelu), (reglu, mxq.relu)):
        v = (act(g.float()) * u.float()).to(torch.bfloat16)  # the same formula, eagerly
        check(f"{op.__name__}(x[:, :512], x[:, 512:]) -> [256, 512]", op(g, u), v, device)

    # the built-in forms: act= on the [M, 2N] tensor, the same bytes as the epilogue above
    fwd = swiglu_fwd(x)
    assert torch.equal(fwd.rowwise_data.view(torch.uint8), swiglu(g, u).rowwise_data.view(torch.uint8))
    print(f"act='swiglu' on [256, 1024] -> {list(fwd.shape)}: the same bytes as swiglu(x[:, :512], x[:, 512:])")

    # backward: d/dg = d * u * dsilu(g), d/du = d * silu(g), one [M, 2N] tensor, dbias over 2N
    d = torch.randn(256, 512, device=device, dtype=torch.bfloat16)
    bwd = swiglu_bwd(d, act_input=x)
    df, gf, uf = d.float(), g.float(), u.float()
    dx = torch.cat([df * uf * dsilu(gf), df * mxq.silu(gf)], dim=1)
    check(f"dact='swiglu': grad {list(d.shape)}, act_input {list(x.shape)} -> {list(bwd.shape)}",
          bwd, dx.to(torch.bfloat16), device)
    db = dx.double().sum(0).float().to(torch.bfloat16)
    assert torch.allclose(bwd.dbias.float(), db.float(), rtol=2 ** -7, atol=1e-3)
    print(f"dbias over the 2N = {bwd.dbias.numel()} columns matches the column sums of the eager gradient")


if __name__ == "__main__":
    main()
