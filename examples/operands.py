"""Broadcast operands and strided views: a bias [N], a per-row scale [M, 1], a device scalar,
and the two halves of a [M, 2N] tensor, each read by the op as it is (no [M, N] copy made).

The first tensor parameter sets the op's shape; every other one may have that shape or be a row
([N]), a column ([M, 1]) or a scalar (0-d) that broadcasts against it (docs/NUMERICS.md,
"Operands"). A full operand may also be a 2-D view with a larger row stride, like x[:, :N].
Each case below is checked byte for byte against the same op on materialised operands.
On CUDA tensors the kernels run; on CPU, the torch reference.
Run: python examples/operands.py
"""

import warnings

import torch

import mxq


@mxq.fused_quant(rowwise=True, colwise=True, act="gelu")
def bias_gelu(x, b):
    return x + b


@mxq.fused_quant(rowwise=True, colwise=True, amax=True)
def scaled(x, s):
    return x * s


@mxq.fused_quant(rowwise=True, colwise=True)
def swiglu(g, u):
    return g * mxq.sigmoid(g) * u


def same_bytes(a: mxq.MXFP8Tensor, b: mxq.MXFP8Tensor) -> bool:
    """Every output of ``a`` equals ``b``'s, byte for byte."""
    for name in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax", "dbias"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None):
            return False
        if x is not None:
            x, y = x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)  # bits, NaN included
            if not torch.equal(x.cpu(), y.cpu()):
                return False
    return True


def check(label: str, op, args, materialised, note: str) -> mxq.MXFP8Tensor:
    """Run ``op`` on ``args`` (broadcast / strided operands) and on ``materialised`` (the same
    values as contiguous tensors of the first input's shape) and compare every output byte; on
    CUDA also check that no input was copied to make it contiguous."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = op(*args)
    copied = [w for w in caught if "copied" in str(w.message)]
    want = op(*materialised)
    same = same_bytes(got, want)
    print(f"{label}: same bytes as on materialised operands: {same}; {note}")
    assert same and not copied, label
    return got


def main() -> None:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    m, n = 512, 1024
    x = torch.randn(m, n, device=device, dtype=dtype)
    print(f"running on {device} ({'the kernels' if device == 'cuda' else 'the torch reference'}), "
          f"x: {m}x{n} bf16")

    # 1. a bias [N], then gelu: element (i, j) reads b[j]
    b = torch.randn(n, device=device, dtype=dtype)
    check("x + bias[N], gelu", bias_gelu, (x, b), (x, b.expand(m, n).contiguous()),
          f"the bias is {n} elements, not {m * n}")

    # 2. a per-row scale [M, 1]: element (i, j) reads s[i]
    s = torch.rand(m, 1, device=device, dtype=dtype) + 0.5
    check("x * row_scale[M, 1]", scaled, (x, s), (x, s.expand(m, n).contiguous()),
          f"the scale is {m} elements, not {m * n}")

    # 3. a device scalar (0-d): computed on the device and never brought to the host (no sync)
    k = (448.0 / x.abs().amax()).to(dtype)
    t = check("x * scalar (0-d tensor)", scaled, (x, k), (x, k.expand(m, n).contiguous()),
              f"k = 448 / amax(x) stayed on {device}")
    print(f"  amax of x * k: {t.amax.item():.1f}")

    # 4. the two halves of a fused [M, 2N] projection, as strided views (row stride 2N)
    gu = torch.randn(m, 2 * n, device=device, dtype=dtype)
    g, u = gu[:, :n], gu[:, n:]
    check("silu(g) * u on the halves of [M, 2N]", swiglu, (g, u), (g.contiguous(), u.contiguous()),
          f"views of shape {tuple(g.shape)}, strides {g.stride()}, read in place")

    # shapes that do not broadcast are refused, naming the argument
    try:
        bias_gelu(x, torch.randn(m, device=device, dtype=dtype))
    except ValueError as e:
        print("a bias of shape [M] is refused:", e)


if __name__ == "__main__":
    main()
