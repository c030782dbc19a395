"""Format: what a block-scaled format is, as one plain value the kernels specialise on.

A format is four choices:

- the block one scale covers: ``block`` is the rowwise block as (rows, columns); the colwise
  block is its transpose (``col_block``);
- the element encoding (``element``): its bits and how many elements share a byte;
- the scale encoding (``scale``) and the rule that picks a scale from a block's amax (``rule``);
- the scale layout (``layout``): compact (row-major) or swizzled (cuBLAS 128x4 tiles).

MXFP8 is ``Format.mxfp8(fp8, scale_mode, layout)``: 1x32 blocks, e4m3 or e5m2 elements, E8M0
scales picked by one of the four rules of docs/NUMERICS.md. The formats the kernels will learn
next are further instances of the same value, not new kernel branches. FP8 block scaling is
``Format.fp8_block(fp8, block, scale_mode, layout)``: 1x128 or 128x128 blocks, fp32 scales picked
by TransformerEngine's rule (``pow2`` or ``fp32``, docs/NUMERICS.md "FP8 block scaling"), the
compact or GEMM-ready (``gemm``) layout; the kernels serve it from 16-bit inputs and its 1x128
rowwise blocks from any (mxq/kernels/codec.py, mxq/runtime/limits.py), the torch reference the rest.
MXFP4 is ``Format.mxfp4(scale_mode, layout)``: 1x32 blocks of e2m1 elements, two per byte
(element 2j in the low nibble), E8M0 scales by MXFP8's "floor" or "rceil" rule with E2M1's
constants (mxq/formats/fp4.py). NVFP4 is ``Format.nvfp4(layout)``: 1x16 blocks (or, ``block_2d``,
16x16 tiles) of e2m1, E4M3
scales (rule "e4m3": TransformerEngine's, docs/NUMERICS.md steps N2-N5) under an fp32
per-tensor scale from the tensor's amax (``global_scale``: the kernels run two passes), its
elements rounded to nearest or stochastically (``rounding``, "rn" or "sr"), its colwise copy
optionally Hadamard-transformed (``hadamard``, by TE's sign vector or ``hadamard_signs``).

Nothing here imports cutlass or torch: the config, codegen and tests build and compare formats
as plain values; the kernels read them through ``cutlass.const_expr``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Encoding:
    """A number encoding: its width in bits and its largest finite magnitude."""

    bits: int
    max: float

    @property
    def per_byte(self) -> int:
        """Values that share one byte (2 for 4-bit elements)."""
        return max(1, 8 // self.bits)


# element encodings, by name (the FP8 ones of docs/NUMERICS.md)
ENCODINGS = {
    "e4m3": Encoding(8, 448.0),
    "e5m2": Encoding(8, 57344.0),
    "e2m1": Encoding(4, 6.0),
}
# scale encodings, by name, and the rules each one admits
SCALES = {
    "e8m0": Encoding(8, 2.0 ** 127),
    "e4m3": Encoding(8, 448.0),
    "fp32": Encoding(32, 3.4028234663852886e38),
}
RULES = {
    "e8m0": ("rceil", "floor", "ceil", "even"),
    "e4m3": ("e4m3",),
    "fp32": ("pow2", "fp32"),
}
LAYOUTS = ("compact", "swizzled", "gemm")
FP8_BLOCKS = ((1, 128), (128, 128))  # the blocks FP8 block scaling takes (activations, weights)


@dataclass(frozen=True)
class Format:
    """One block-scaled format (see the module docstring). Its repr is a constructor call of
    plain values, so a generated module can render it."""

    block: tuple  # the rowwise block (rows, columns) one scale covers
    element: str  # ENCODINGS key
    scale: str  # SCALES key
    rule: str  # how a block's amax becomes its scale (RULES[scale])
    layout: str  # LAYOUTS: how the scales are laid out
    global_scale: bool = False  # an fp32 per-tensor scale on top of the block scales (NVFP4)
    rounding: str = "rn"  # the element encoding's rounding: "rn" (to nearest even) or "sr" (stochastic, NVFP4)
    hadamard: bool = False  # NVFP4's colwise copy takes TE's 16-point random Hadamard transform first
    # the transform's 16 signs (+1 / -1), or None: TransformerEngine's (mxq/formats/fp4.py HADAMARD_SIGNS)
    hadamard_signs: tuple | None = None

    def __post_init__(self):
        if self.element not in ENCODINGS:
            raise ValueError(f"mxq: Format.element must be one of {sorted(ENCODINGS)}, got {self.element!r}")
        if self.scale not in SCALES:
            raise ValueError(f"mxq: Format.scale must be one of {sorted(SCALES)}, got {self.scale!r}")
        if self.rule not in RULES[self.scale]:
            raise ValueError(f"mxq: Format.rule must be one of {RULES[self.scale]} for {self.scale} scales, "
                             f"got {self.rule!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"mxq: Format.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.rounding not in ("rn", "sr"):
            raise ValueError(f"mxq: Format.rounding must be 'rn' or 'sr', got {self.rounding!r}")
        if self.hadamard and not self.global_scale:
            raise ValueError("mxq: Format.hadamard is NVFP4's (a format with global_scale)")
        if self.hadamard_signs is not None and not (
                self.hadamard and isinstance(self.hadamard_signs, tuple) and len(self.hadamard_signs) == 16
                and all(type(v) is int and v in (1, -1) for v in self.hadamard_signs)):
            raise ValueError("mxq: Format.hadamard_signs must be None or 16 ints of +1 or -1, with hadamard, got "
                             f"{self.hadamard_signs!r}")
        if not (isinstance(self.block, tuple) and len(self.block) == 2 and all(
                isinstance(b, int) and b > 0 for b in self.block)):
            raise ValueError(f"mxq: Format.block must be (rows, columns) of positive ints, got {self.block!r}")

    @classmethod
    def mxfp8(cls, fp8: str, scale_mode: str, layout: str) -> "Format":
        """MXFP8 (OCP MX v1.0): 1x32 blocks of ``fp8`` elements, E8M0 scales by ``scale_mode``."""
        return cls(block=(1, 32), element=fp8, scale="e8m0", rule=scale_mode, layout=layout)

    @classmethod
    def fp8_block(cls, fp8: str, block: tuple, scale_mode: str, layout: str) -> "Format":
        """FP8 block scaling (TransformerEngine's Float8BlockScaling, DeepSeek-V3): ``block`` 1x128
        or 128x128 of ``fp8`` elements, one fp32 dequantization scale each, by ``scale_mode``."""
        if block not in FP8_BLOCKS:
            raise ValueError(f"mxq: Format.block of fp8_block must be one of {FP8_BLOCKS}, got {block!r}")
        return cls(block=block, element=fp8, scale="fp32", rule=scale_mode, layout=layout)

    @classmethod
    def mxfp4(cls, scale_mode: str, layout: str) -> "Format":
        """MXFP4 (OCP MX v1.0): 1x32 blocks of E2M1 elements two per byte, E8M0 scales by
        ``scale_mode`` ("floor" or "rceil", mxq/formats/fp4.py SCALE_MODES)."""
        return cls(block=(1, 32), element="e2m1", scale="e8m0", rule=scale_mode, layout=layout)

    @classmethod
    def nvfp4(cls, layout: str, stochastic: bool = False, block_2d: bool = False, hadamard: bool = False,
              hadamard_signs: tuple | None = None) -> "Format":
        """NVFP4 (TransformerEngine's NVFP4BlockScaling): 1x16 blocks (``block_2d``: 16x16 tiles,
        one scale each, which the colwise copy's transposed tiles share) of E2M1 elements two per
        byte, E4M3 scales under the per-tensor fp32 scale of the tensor's amax, rounded to
        nearest or (``stochastic``) stochastically; with ``hadamard`` the colwise copy is TE's
        random Hadamard transform of the values (16-row groups, rounded to bf16; ``hadamard_signs``
        its sign vector, None for TE's), under its own per-tensor amax (docs/NUMERICS.md)."""
        return cls(block=(16, 16) if block_2d else (1, 16), element="e2m1", scale="e4m3", rule="e4m3",
                   layout=layout, global_scale=True, rounding="sr" if stochastic else "rn", hadamard=hadamard,
                   hadamard_signs=hadamard_signs)

    @property
    def col_block(self) -> tuple:
        """The colwise block: the rowwise one transposed (32x1 for MX)."""
        return self.block[1], self.block[0]

    @property
    def elem(self) -> Encoding:
        return ENCODINGS[self.element]

    @property
    def scale_enc(self) -> Encoding:
        return SCALES[self.scale]

    @property
    def packed(self) -> bool:
        """Elements share bytes (E2M1: two per byte): a row of N values is N / per_byte bytes."""
        return self.elem.per_byte > 1

    @property
    def swizzled(self) -> bool:
        return self.layout == "swizzled"


__all__ = ["ENCODINGS", "Encoding", "FP8_BLOCKS", "Format", "LAYOUTS", "RULES", "SCALES"]
