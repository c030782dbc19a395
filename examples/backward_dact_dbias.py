"""Backward of a GELU MLP: quantize grad * dgelu(pre-activation), and get the bias gradient.

One pass reads the incoming gradient and the saved pre-activation once and writes the MXFP8
rowwise+colwise gradient (for the two backward GEMMs) plus dbias, the column sums of
grad * dgelu(a) taken before any rounding (summed in a fixed order: the same bits run to run).
Run: python examples/backward_dact_dbias.py
"""

import torch

import mxq


@mxq.fused_quant(dact="gelu", dbias=True, rowwise=True, colwise=True)
def grad_gelu(g):
    return g


def main() -> None:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(512, 768, device=device, dtype=torch.bfloat16)  # saved pre-activation
    g = torch.randn(512, 768, device=device, dtype=torch.bfloat16) * 1e-2  # incoming gradient

    t = grad_gelu(g, act_input=a)

    # autograd's view of the same gradient (torch's tanh-GELU), for comparison
    a32 = a.float().requires_grad_()
    torch.nn.functional.gelu(a32, approximate="tanh").backward(g.float())
    db_autograd = a32.grad.sum(0)
    rel = ((t.dbias.float() - db_autograd).abs().max() / db_autograd.abs().max()).item()
    print(f"ran on {device}: {t}")
    print(f"dbias vs autograd's tanh-GELU column sums: max relative difference {rel:.2e}")
    err = (t.dequantize("colwise") - a32.grad).abs().max().item()
    print(f"colwise MXFP8 gradient: max abs dequantization error {err:.2e} (grad max {a32.grad.abs().max().item():.2e})")
    assert rel < 2e-2


if __name__ == "__main__":
    main()
