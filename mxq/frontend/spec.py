"""QuantSpec: the frozen, validated option set of one mxq op.

Everything a kernel is specialised on, except the epilogue and the input dtype, lives here, so
one object decides validation, cache keys, the 32-bit key C++ callers use, and the Jinja
context. Validation happens in ``__post_init__``: an invalid spec cannot exist, and every error
names the option that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..formats import fp4, fp8_block
from ..formats.format import FP8_BLOCKS, Format
from ..formats.layouts import LAYOUTS
from ..formats.numerics import FORMATS, SCALE_MODES

ACTIVATIONS = ("gelu", "silu", "relu", "qgelu", "srelu")
# gated activations (mxq/frontend/gated.py): name -> the activation its gate half goes through
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu", "qgeglu": "qgelu", "sreglu": "srelu"}
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPE_NAMES = tuple(DTYPES.values())
# the formats an op quantizes to: their scale modes (the first is the default), scale layouts and blocks
FORMAT_NAMES = ("mxfp8", "fp8_block", "nvfp4", "mxfp4")  # (their index is the key's format code)
_MODES = {"mxfp8": SCALE_MODES, "fp8_block": fp8_block.SCALE_MODES, **fp4.SCALE_MODES}
_LAYOUTS = {"mxfp8": LAYOUTS, "fp8_block": fp8_block.LAYOUTS, "nvfp4": LAYOUTS, "mxfp4": LAYOUTS}
_BLOCKS = {"mxfp8": ((1, 32),), "fp8_block": FP8_BLOCKS, "nvfp4": ((1, 16), (16, 16)), "mxfp4": ((1, 32),)}
BLOCK_SIZES = tuple(sorted({b for blocks in _BLOCKS.values() for block in blocks for b in block}))  # (1, 16, 32, 128)
_NVFP4_OPTIONS = ("block_2d", "hadamard", "stochastic_rounding")  # NVFP4's own options (mxq/formats/fp4.py)


def format_choices(fmt: str) -> dict:
    """A format's choices of scale_mode and scale_layout, each default first (python -m mxq's --help)."""
    _check_choice("format", fmt, FORMAT_NAMES)
    return {"scale_mode": _MODES[fmt], "scale_layout": _LAYOUTS[fmt]}


# 32-bit key layout (documented again in mxq/include/mxq/mxq.hpp for C++ callers):
#   bit 0      fp8            0 = e4m3, 1 = e5m2
#   bit 1      rowwise
#   bit 2      colwise
#   bits 3-4   scale_mode     0 rceil, 1 floor, 2 ceil, 3 even
#   bit 5      scale_layout   0 compact, 1 swizzled
#   bit 6      amax
#   bits 7-9   act            0 none, 1 gelu, 2 silu, 3 relu, 4 qgelu, 5 srelu
#   bits 10-12 dact           same codes as act
#   bit 13     dbias
#   bits 14-15 input dtype    0 fp32, 1 fp16, 2 bf16
#   bit 16     gated          act / dact is the gated form of its code (swiglu = gated silu, ...)
#   bit 17     format, low    format = bit 17 | bit 19 << 1: 0 mxfp8, 1 fp8_block (then bits 3-4:
#                             scale_mode 0 pow2, 1 fp32; bit 5: scale_layout 0 compact, 1 gemm),
#                             2 nvfp4 (bits 3-4: 0 e4m3), 3 mxfp4 (bits 3-4: 0 floor, 1 rceil)
#   bit 18     block          fp8_block: 0 = 1x128, 1 = 128x128; nvfp4: block_2d (16x16)
#   bit 19     format, high   (see bit 17)
#   bit 20     hadamard       nvfp4
#   bit 21     stochastic_rounding  nvfp4
#   bits 22-31 zero (reserved)
_ACT_CODES = (None,) + ACTIVATIONS


def _base(act):
    """The activation code's name: a gated activation's is its gate's activation."""
    return GATED_ACTIVATIONS.get(act, act)


def _gated(base, gated: int):
    """Inverse of _base for a key's gated bit."""
    if not gated or base is None:
        return base
    return next(g for g, b in GATED_ACTIVATIONS.items() if b == base)


def _check_choice(name: str, value, choices, context: str = "") -> None:
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise ValueError(f"mxq: {name} must be one of {tuple(choices)}{context}, got {value!r}")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"mxq: {name} must be a bool, got {type(value).__name__}")


def _block(value):
    """``block=`` as a tuple (a list is accepted), or the value itself when it is not a pair."""
    if isinstance(value, list):
        value = tuple(value)
    return value


@dataclass(frozen=True, repr=False)
class QuantSpec:
    """``scale_mode`` and ``block`` left None take the format's defaults (mxfp8: "rceil", 1x32;
    fp8_block: "pow2", 1x128; nvfp4: "e4m3", 1x16 or, ``block_2d``, 16x16; mxfp4: "floor",
    1x32), so equal options give equal specs. NVFP4 always records its global amax (``amax`` is
    set True)."""

    fp8: str = "e4m3"
    rowwise: bool = True
    colwise: bool = False
    scale_mode: str | None = None
    scale_layout: str = "compact"
    amax: bool = False
    act: str | None = None
    dact: str | None = None
    dbias: bool = False
    format: str = "mxfp8"
    block: tuple | None = None
    block_2d: bool = False
    hadamard: bool = False
    stochastic_rounding: bool = False
    hadamard_signs: tuple | None = None  # the transform's 16 signs; None: TE's (fp4.HADAMARD_SIGNS)

    def __post_init__(self) -> None:
        _check_choice("format", self.format, FORMAT_NAMES)
        _check_choice("fp8", self.fp8, FORMATS)
        if self.scale_mode is None:
            object.__setattr__(self, "scale_mode", _MODES[self.format][0])
        _check_choice("scale_mode", self.scale_mode, _MODES[self.format], f" with format={self.format!r}")
        _check_choice("scale_layout", self.scale_layout, _LAYOUTS[self.format], f" with format={self.format!r}")
        for name in ("rowwise", "colwise", "amax", "dbias", *_NVFP4_OPTIONS):  # (before _check_fp4 sets NVFP4's amax)
            _check_bool(name, getattr(self, name))
        for name in _NVFP4_OPTIONS:
            if getattr(self, name) and self.format != "nvfp4":
                raise ValueError(f"mxq: {name}=True is an option of format='nvfp4', not {self.format!r}")
        if self.is_fp4:
            self._check_fp4()
        default = _BLOCKS[self.format][int(self.block_2d)]
        object.__setattr__(self, "block", default if self.block is None else _block(self.block))
        if self.format == "nvfp4" and self.block != default:
            raise ValueError(f"mxq: block of format='nvfp4' follows block_2d ({default!r} with block_2d="
                             f"{self.block_2d}), got {self.block!r}")
        if not (isinstance(self.block, tuple) and all(type(b) is int for b in self.block)) or \
                self.block not in _BLOCKS[self.format]:
            raise ValueError(f"mxq: block must be one of {_BLOCKS[self.format]} with format={self.format!r}, got "
                             f"{self.block!r}")
        _check_choice("act", self.act, _ACT_CODES + tuple(GATED_ACTIVATIONS))
        _check_choice("dact", self.dact, _ACT_CODES + tuple(GATED_ACTIVATIONS))
        if self.act is not None and self.dact is not None:
            raise ValueError(f"mxq: act and dact are exclusive, got act={self.act!r} and dact={self.dact!r}")
        if not (self.rowwise or self.colwise):
            raise ValueError("mxq: at least one of rowwise and colwise must be True")
        if self.hadamard and not self.colwise:
            raise ValueError("mxq: hadamard=True transforms the colwise copy only: it needs colwise=True")
        self._check_signs()

    def _check_signs(self) -> None:
        """``hadamard_signs``: None, or 16 ints of +1 or -1 (a tuple or list) with hadamard=True;
        kept as a tuple, TE's own vector as None (equal transforms give equal specs)."""
        signs = self.hadamard_signs
        if signs is None:
            return
        if not self.hadamard:
            raise ValueError("mxq: hadamard_signs is the sign vector of hadamard=True's transform; set hadamard=True "
                             "(format='nvfp4', colwise=True) or leave it None")
        if not isinstance(signs, (tuple, list)):
            raise TypeError(f"mxq: hadamard_signs must be a tuple or list of {fp4.HADAMARD_SIZE} ints, each 1 or -1, "
                            f"got {type(signs).__name__}")
        if len(signs) != fp4.HADAMARD_SIZE or not all(
                type(v) is int and v in (1, -1) for v in signs):
            raise ValueError(f"mxq: hadamard_signs must be {fp4.HADAMARD_SIZE} ints, each 1 or -1 (a tuple or "
                             f"list), got {list(signs) if isinstance(signs, tuple) else signs!r}")
        signs = tuple(signs)
        object.__setattr__(self, "hadamard_signs", None if signs == fp4.HADAMARD_SIGNS else signs)

    def _check_fp4(self) -> None:
        """NVFP4 and MXFP4 options (mxq/formats/fp4.py): E4M3 is NVFP4's scale format and not a choice
        (fp8 stays "e4m3"); block_2d, hadamard and stochastic_rounding are NVFP4's; NVFP4 records its
        global amax."""
        if self.fp8 != "e4m3":
            raise ValueError(f"mxq: fp8 does not apply to format={self.format!r} (E2M1 elements): leave it "
                             f"'e4m3', got {self.fp8!r}")
        if self.format != "nvfp4":
            return
        if self.block_2d and self.hadamard:
            raise ValueError("mxq: block_2d and hadamard are exclusive (2-D blocks keep the two copies identical; "
                             "the transform changes the colwise one)")
        object.__setattr__(self, "amax", True)

    def __repr__(self) -> str:
        # (an mxfp8 spec reads as it did before formats were options: its rendered modules, which
        # quote it, keep their bytes; NVFP4's options show on NVFP4 specs only)
        hidden = (() if self.format != "mxfp8" else ("format", "block")) + (
            () if self.format == "nvfp4" else _NVFP4_OPTIONS) + (("hadamard_signs",) if self.hadamard_signs is None
                                                                 else ())
        shown = [f for f in fields(self) if f.name not in hidden]
        return f"QuantSpec({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @property
    def element(self):
        """The FP8 element format's constants (numerics.FP8Format)."""
        return FORMATS[self.fp8]

    @property
    def is_fp4(self) -> bool:
        """NVFP4 or MXFP4 (mxq/formats/fp4.py): E2M1 elements two per byte."""
        return self.format in fp4.FORMATS

    @property
    def colwise_transposed(self) -> bool:
        """The colwise copy is the transposed one, [N, M] contiguous: NVFP4's and MXFP4's (FP4 GEMMs
        take only the TN layout), FP8 block scaling's GEMM-ready layout (fp8_block_layouts.colwise_data)."""
        return self.colwise and (self.is_fp4 or (self.format == "fp8_block" and self.scale_layout == "gemm"))

    @property
    def block_format(self) -> Format:
        """The Format value (mxq/formats/format.py) of this spec's blocks, encodings and layout."""
        if self.format == "mxfp4":
            return Format.mxfp4(self.scale_mode, self.scale_layout)
        if self.format == "nvfp4":
            return Format.nvfp4(self.scale_layout, self.stochastic_rounding, block_2d=self.block_2d,
                                hadamard=self.hadamard, hadamard_signs=self.hadamard_signs)
        if self.format == "fp8_block":
            return Format.fp8_block(self.fp8, self.block, self.scale_mode, self.scale_layout)
        return Format.mxfp8(self.fp8, self.scale_mode, self.scale_layout)

    def key(self, dtype: str) -> int:
        """The 32-bit key of this spec for input dtype ``dtype`` ("fp32", "fp16", "bf16"). A
        caller's ``hadamard_signs`` are not in it: the key of such a spec is its options' with
        TE's signs, which ``from_key`` gives (a C++ caller reaches TE's transform by key;
        torch_ops.identity adds the signs)."""
        _check_choice("dtype", dtype, DTYPE_NAMES)
        return (
            (self.fp8 == "e5m2")
            | self.rowwise << 1
            | self.colwise << 2
            | _MODES[self.format].index(self.scale_mode) << 3
            | (self.scale_layout != "compact") << 5
            | self.amax << 6
            | _ACT_CODES.index(_base(self.act)) << 7
            | _ACT_CODES.index(_base(self.dact)) << 10
            | self.dbias << 13
            | DTYPE_NAMES.index(dtype) << 14
            | self.gated << 16
            | (FORMAT_NAMES.index(self.format) & 1) << 17
            | (self.block in ((128, 128), (16, 16))) << 18
            | (FORMAT_NAMES.index(self.format) >> 1) << 19
            | self.hadamard << 20
            | self.stochastic_rounding << 21
        )

    def signs_mask(self) -> int:
        """``hadamard_signs`` as 16 bits, bit i set where sign i is -1 (TE's: 0xd7e8)."""
        signs = fp4.HADAMARD_SIGNS if self.hadamard_signs is None else self.hadamard_signs
        return sum(1 << i for i, v in enumerate(signs) if v < 0)

    @property
    def gated(self) -> bool:
        """act or dact is a gated activation (mxq/frontend/gated.py)."""
        return self.act in GATED_ACTIVATIONS or self.dact in GATED_ACTIVATIONS

    @staticmethod
    def from_key(key: int) -> tuple["QuantSpec", str]:
        """Inverse of ``key``: (spec, dtype name). Raises ValueError on a malformed key."""
        if not isinstance(key, int) or key < 0 or key >> 22:
            raise ValueError(f"mxq: key must be a 22-bit non-negative int, got {key!r}")
        act, dact, dtype = (key >> 7) & 7, (key >> 10) & 7, (key >> 14) & 3
        fmt = FORMAT_NAMES[(key >> 17 & 1) | (key >> 19 & 1) << 1]
        modes = _MODES[fmt]
        if (key >> 3) & 3 >= len(modes) or (len(_BLOCKS[fmt]) == 1 and key >> 18 & 1):
            raise ValueError(f"mxq: key {key:#x} has an unknown scale_mode or block code for format {fmt!r}")
        if act >= len(_ACT_CODES) or dact >= len(_ACT_CODES) or dtype >= len(DTYPE_NAMES):
            raise ValueError(f"mxq: key {key:#x} has an unknown act, dact or dtype code")
        if key >> 16 & 1 and not (act or dact):
            raise ValueError(f"mxq: key {key:#x} sets the gated bit without an act or dact")
        if fmt == "nvfp4" and not key >> 6 & 1:  # (so that every key taken is its spec's own)
            raise ValueError(f"mxq: key {key:#x} is NVFP4's without the amax bit (bit 6): NVFP4 always writes its amax")
        spec = QuantSpec(
            fp8="e5m2" if key & 1 else "e4m3",
            rowwise=bool(key >> 1 & 1),
            colwise=bool(key >> 2 & 1),
            scale_mode=modes[(key >> 3) & 3],
            scale_layout=_LAYOUTS[fmt][key >> 5 & 1],
            amax=bool(key >> 6 & 1),
            act=_gated(_ACT_CODES[act], key >> 16 & 1),
            dact=_gated(_ACT_CODES[dact], key >> 16 & 1),
            dbias=bool(key >> 13 & 1),
            format=fmt,
            block=_BLOCKS[fmt][key >> 18 & 1],
            block_2d=fmt == "nvfp4" and bool(key >> 18 & 1),
            hadamard=bool(key >> 20 & 1),
            stochastic_rounding=bool(key >> 21 & 1),
        )
        return spec, DTYPE_NAMES[dtype]

    def name(self, dtype: str) -> str:
        """A readable, unique identifier (used for registry names and cache files)."""
        block = "b%dx%d" % self.block if self.format == "fp8_block" else ""
        if self.is_fp4:
            rht = "rht" if self.hadamard_signs is None else f"rht{self.signs_mask():04x}"
            block = "_".join([self.format] + [tag for tag, on in (("2d", self.block_2d), (rht, self.hadamard),
                                                                  ("sr", self.stochastic_rounding)) if on])
        parts = [block, self.fp8, dtype, "r" if self.rowwise else "", "c" if self.colwise else "",
                 self.scale_mode, self.scale_layout]
        if self.act:
            parts.append(self.act)
        if self.dact:
            parts.append("d" + self.dact)
        parts += [flag for flag in ("amax", "dbias") if getattr(self, flag)]
        return "_".join(p for p in parts if p)
