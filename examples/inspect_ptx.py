"""Look inside: the generated CuTeDSL source and the PTX it compiles to, with no GPU needed.

On sm_100a the RCEIL scale uses the hardware `cvt.rp.satfinite.ue8m0x2.f32`; on sm_90 (Hopper)
the same byte comes from integer bit math. Both convert with `cvt.rn.satfinite.e4m3x2.f32`.
Run: python examples/inspect_ptx.py   (same as: python -m mxq compile --arch sm_100a ...)
"""

import mxq


@mxq.fused_quant(act="silu", colwise=True, amax=True)
def scaled(x, s: float = 2.0):
    return x * s


def main() -> None:
    src = scaled.source
    print(f"generated module: {len(src.splitlines())} lines; its element functions:")
    body = src[src.index("def epilogue("): src.index("QUANTIZE = ")]
    print("\n".join("    " + line for line in body.strip().splitlines()[:24]))
    for arch in ("sm_90", "sm_100a"):
        art = scaled.asm(arch=arch, dtype="bf16")
        quant = next(v for k, v in art["kernels"].items() if "packed_kernel" in k) if art.get("kernels") else {}
        print(f"{arch}: PTX {len(art['ptx'])} bytes, registers {quant.get('registers', '?')}, "
              f"spills {quant.get('spill_stores', '?')} B; conversions: "
              + ", ".join(c for c in art["conversions"] if "e4m3" in c or "ue8m0" in c))


if __name__ == "__main__":
    main()
