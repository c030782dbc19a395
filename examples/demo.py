"""The mxq demo: quantize, then decorate -> generated source -> compile -> run.

Run: python examples/demo.py  (the README's demo command sets up .venv and runs this)
On a CPU-only machine the kernel is compiled for sm_90 and sm_100a (PTX and cubin, no GPU
needed) and the call runs the bit-exact torch reference; on a CUDA machine it runs the kernel
and checks it against the reference byte for byte.
"""

import time

import torch

import mxq


@mxq.fused_quant(act="gelu", colwise=True, amax=True)
def residual_gelu(x, r, alpha: float = 1.0):
    return x * alpha + r


def main() -> None:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    print("== 1. plain MXFP8 quantization")
    x = torch.randn(4, 96, dtype=torch.bfloat16) * torch.tensor([[1.0], [1e-3], [50.0], [1e4]]).bfloat16()
    x[0, 7] = float("nan")  # a NaN makes its whole 32-element block NaN: scale byte 255
    t = mxq.quantize(x, rowwise=True, colwise=True, amax=True)
    print("rowwise E8M0 scale bytes:", t.rowwise_scale.tolist())
    ok = ~torch.isnan(t.dequantize())
    rel = ((t.dequantize() - x.float()).abs() / x.float().abs().clamp_min(1e-30))[ok]
    print(f"round trip: median relative error {rel.median().item():.3g}, max {rel.max().item():.3g}")

    print("\n== 2. decorate an epilogue: residual add + GELU, rowwise+colwise, amax")
    print(residual_gelu)
    src = residual_gelu.source
    print(f"generated CuTeDSL module: {len(src.splitlines())} lines, e.g.:")
    body = src[src.index("def epilogue("): src.index("def act(")].strip().splitlines()
    print("\n".join("    " + line for line in body))
    print("    (the kernels are mxq/kernels/; the module instantiates them: QUANTIZE = Quantize(CONFIG, ...))")

    print("\n== 3. compile (no GPU needed)")
    for arch in ("sm_90", "sm_100a"):
        t0 = time.time()
        art = residual_gelu.asm(arch=arch)
        regs = {k.split("_tensor")[0].replace("kernel_cutlass_", ""): v.get("registers")
                for k, v in art.get("kernels", {}).items()}
        print(f"{arch}: {len(art['ptx'])} bytes of PTX in {time.time() - t0:.1f} s; registers {regs}; "
              f"fp8/e8m0 cvt: {[c for c in art['conversions'] if 'sat' in c]}")

    print(f"\n== 4. run on {device}")
    a = torch.randn(1024, 4096, device=device, dtype=torch.bfloat16)
    r = torch.randn(1024, 4096, device=device, dtype=torch.bfloat16)
    out = residual_gelu(a, r, alpha=0.5)
    print(out, "amax", out.amax.item())
    if device == "cuda":
        ref = residual_gelu.reference(a.cpu(), r.cpu(), alpha=0.5)
        diff = (out.rowwise_data.view(torch.uint8).cpu() != ref.rowwise_data.view(torch.uint8)).float().mean().item()
        print(f"kernel vs reference: {diff * 100:.4f}% of data bytes differ (GELU's tanh: transcendental class)")
    else:
        print("(CPU: this was the torch reference; on a GPU the same call launches the compiled kernel)")


if __name__ == "__main__":
    main()
