"""NVFP4 and MXFP4 (4-bit E2M1 elements, two per byte): the arithmetic, written once in torch.

NVFP4 is TransformerEngine's NVFP4BlockScaling: one E4M3 scale per 16 elements (1x16, or 16x16
tiles for weights: ``block_2d``) under a per-tensor fp32 scale chosen from the tensor's amax;
optionally TE's 16-point random Hadamard transform on the colwise copy and stochastic rounding.
MXFP4 is OCP MX: one E8M0 scale per 32 elements, chosen by mxq's MXFP8 rules ("floor", "rceil")
with E2M1's constants. docs/NUMERICS.md's "NVFP4 and MXFP4" section states every step; each
function here names the step it implements. Every operation is exact or one IEEE fp32 rounding,
so the reference is bit-exact on CPU and CUDA alike; tests/oracle_fp4.py states the same steps a
second time in plain Python on exact rationals.

Where the packed data and the scales live (compact and swizzled layouts, the transposed colwise
copy) is mxq/formats/fp4_layouts.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import fp8_block
from .numerics import FP8Format, e8m0_from_amax, e8m0_to_inv_scale, e8m0_to_scale

FORMATS = ("nvfp4", "mxfp4")
BLOCKS = {"nvfp4": 16, "mxfp4": 32}  # elements per scale along the quantized direction
SCALE_MODES = {"nvfp4": ("e4m3",), "mxfp4": ("floor", "rceil")}  # the first is the default
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = 3.4028234663852886e38
# E2M1's constants for the E8M0 rules of mxq/formats/numerics.py (MXFP4): max 6, fp32(1/6), the
# largest power of two <= 6 is 2^2, one mantissa bit
E2M1 = FP8Format("e2m1", torch.uint8, E2M1_MAX, 0x3E2AAAAB, 2, 1)
E2M1_NAN_CODE = 0x7  # a NaN element is stored as +6 (the hardware's satfinite rule; E2M1 has no NaN)
# TE's fixed random sign vector of the 16-point Hadamard transform (get_wgrad_sign_vector)
HADAMARD_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
HADAMARD_SIZE = 16
# the midpoints between E2M1's magnitudes (codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6): a code is how
# many |y| has passed; at a midpoint the even code wins (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
# 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), so some are passed only beyond them, others at them
_UP_STRICT = (0.25, 1.25, 2.5, 5.0)  # ties go down (to the even code below)
_UP_AT = (0.75, 1.75, 3.5)  # ties go up (to the even code above)
_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


class CallArgs(NamedTuple):
    """An FP4 call's own values (mxq/runtime/call.py Call.fp4): ``global_amax`` (NVFP4's known
    per-tensor amax, a one-element fp32 tensor or a float; a grouped call's one per group [G];
    with hadamard=True the pair (amax, colwise_amax), fp4_layouts.given_amax's forms; or None:
    computed), and the stochastic-rounding ``seed`` and ``offset`` (ints; None where the op does
    not round stochastically)."""

    global_amax: torch.Tensor | float | tuple | None = None
    seed: int | None = None
    offset: int | None = None


# -- E2M1 --------------------------------------------------------------------------------------
def _sign_nibble(y: torch.Tensor) -> torch.Tensor:
    """0x8 where y's sign bit is set (-0 and negative values rounding to 0 included), else 0."""
    return torch.signbit(y).to(torch.uint8) << 3


def encode_rn(y: torch.Tensor) -> torch.Tensor:
    """Step N7 (round to nearest even): the E2M1 codes (uint8, 0..15) of fp32 ``y``. Saturates to
    +-6 (inf included); NaN -> 0x7; negative values that round to zero keep the sign (0x8)."""
    a = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for t in _UP_STRICT:
        code += (a > t).to(torch.uint8)
    for t in _UP_AT:
        code += (a >= t).to(torch.uint8)
    code |= _sign_nibble(y)
    return torch.where(torch.isnan(y), E2M1_NAN_CODE, code)


def encode_sr(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Step N7 with stochastic rounding: E2M1 codes of fp32 ``y`` with one random byte ``r``
    (uint8, y's shape) per element. |y| = (k + f) * step with step 0.5, 1 or 2 (the E2M1
    spacing at |y|: below 2, below 4, else) and 0 <= f < 1: rounded up to (k + 1) * step iff
    floor(256 f) + r >= 256 (the 8 bits below the kept bit plus the random byte carry into it),
    else down to k * step; saturates at 6; NaN -> 0x7; the sign is kept (0x8 for a negative
    value rounded to zero)."""
    a = y.abs().clamp(max=E2M1_MAX)  # (NaN stays NaN, decided last)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    t = a / step  # exact: a power-of-two divisor
    k = torch.floor(t)
    frac8 = torch.floor((t - k) * 256)
    up = (frac8 + r.to(torch.float32)) >= 256
    mag = torch.clamp((k + up.to(torch.float32)) * step, max=E2M1_MAX)
    code = encode_rn(mag) | _sign_nibble(y)
    return torch.where(torch.isnan(y), E2M1_NAN_CODE, code)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [R, C] (C even) -> bytes [R, C/2]: element 2j in the low nibble, 2j+1 in the high."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack(data: torch.Tensor) -> torch.Tensor:
    """Bytes [R, C/2] -> E2M1 codes [R, C] (pack's inverse)."""
    lo, hi = data & 0xF, data >> 4
    return torch.stack((lo, hi), dim=-1).reshape(data.shape[0], 2 * data.shape[1])


def decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes -> their fp32 values (0x8 is -0)."""
    table = torch.tensor(_VALUES + tuple(-v for v in _VALUES), dtype=torch.float32, device=codes.device)
    return table[codes.long()]


# -- NVFP4's scales ----------------------------------------------------------------------------
def global_amax(v: torch.Tensor) -> torch.Tensor:
    """Step N1: max |v| over the whole [R, C] tensor as 0-d fp32; NaN elements do not enter it
    (TE's CUDA), an empty tensor's is 0."""
    if v.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=v.device)
    return torch.where(torch.isnan(v), 0.0, v.abs()).amax()


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """Step N2: S_enc = min(fp32(448 * 6 / amax), FLT_MAX); 1 where amax is 0 or S_enc is 0
    (amax inf). 448 * 6 = 2688 is exact; one IEEE division."""
    s = torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32, device=amax.device) / amax
    s = torch.clamp(s, max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def block_scale(block_amax: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """Step N4: the E4M3 scale of each block amax: e4m3_rn_satfinite(min(amax * (S_enc * fp32(1/6)),
    FLT_MAX)), ``S_enc * fp32(1/6)`` rounded first (TE's compute_decoding_scaling_factor). No lower
    clamp: a zero block stores scale byte 0. As torch.float8_e4m3fn."""
    sf = s_enc * torch.tensor(1.0 / 6.0, dtype=torch.float32, device=s_enc.device)
    d = torch.clamp(block_amax * sf, max=FLT_MAX)
    return torch.clamp(d, max=E4M3_MAX).to(torch.float8_e4m3fn)


def block_multiplier(scale: torch.Tensor, s_enc: torch.Tensor) -> torch.Tensor:
    """Step N5: the element multiplier of each E4M3 scale: min(fp32(1 / fp32(scale * fp32(1 /
    S_enc))), FLT_MAX), IEEE divisions (TE's compute_scaling_coefficient<float>); scale 0 gives
    FLT_MAX."""
    one = torch.ones((), dtype=torch.float32, device=s_enc.device)
    s_dec = one / s_enc
    return torch.clamp(one / (scale.to(torch.float32) * s_dec), max=FLT_MAX)


def _rows_of(blocks: torch.Tensor, tile_rows: int, rows: int) -> torch.Tensor:
    """A per-block grid [ceil(R/tile_rows), nb] with each block row repeated for its rows: [R, nb]."""
    return blocks.repeat_interleave(tile_rows, dim=0)[:rows] if tile_rows > 1 else blocks


def quantize_nvfp4(v: torch.Tensor, s_enc: torch.Tensor, tile_rows: int = 1,
                   rand: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps N3-N8 over the fp32 [R, C] tensor ``v`` (C even) in blocks of ``tile_rows`` x 16
    (1, or 16 for 16x16 tiles): (bytes [R, C/2], E4M3 scales [R, ceil(C/16)], a tile's scale in
    each of its rows). ``rand``: one random byte per element (stochastic rounding), or None."""
    rows, cols = v.shape
    tile = (tile_rows, BLOCKS["nvfp4"])
    scale = block_scale(fp8_block.block_amax(v, tile), s_enc)
    mult = fp8_block.expand(block_multiplier(scale, s_enc), tile, rows, cols)
    y = v * mult  # step N6: one fp32 multiply
    codes = encode_rn(y) if rand is None else encode_sr(y, rand)
    per_row = _rows_of(scale.view(torch.uint8), tile_rows, rows).view(torch.float8_e4m3fn)
    return pack(codes), per_row


def dequantize_nvfp4(data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Packed bytes [R, C/2] and their E4M3 scales [R, ceil(C/16)] to fp32 [R, C] as TE's
    dequantize, fp32(e2m1 * fp32(fp32(scale * amax) * fp32(1 / 2688))), where S_enc was
    2688 / amax; where step N2 clamped or replaced it (amax below 2688 / FLT_MAX, 0 with data
    given a global_amax, or inf), or where fp32(scale * amax) overflows (amax above FLT_MAX / 448),
    by the inverse of the S_enc the data were encoded with, fp32(e2m1 * fp32(scale * fp32(1 /
    S_enc))) (TE's formula there decodes a tiny tensor too small, an inf amax or a huge block's
    scale to inf, a zero amax to 0); and where step N5 clamped the element multiplier to FLT_MAX
    (a nonzero fp32(scale * fp32(1 / S_enc)) below 1 / FLT_MAX: a tensor of amax below about
    6 / FLT_MAX) by that multiplier's inverse, e2m1 * fp32(1 / FLT_MAX) = e2m1 * 2^-128, exact."""
    rows, cols = data.shape[0], 2 * data.shape[1]
    amax = amax.to(torch.float32)
    factor = torch.tensor(1.0 / (E4M3_MAX * E2M1_MAX), dtype=torch.float32, device=data.device)
    s_enc = global_encode_scale(amax)
    as_te = s_enc == torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32, device=amax.device) / amax
    scale = scale.to(torch.float32)
    one = torch.ones((), dtype=torch.float32, device=data.device)
    te = scale * amax
    inverse = scale * (one / s_enc)
    per_block = torch.where(as_te & torch.isfinite(te), te * factor, inverse)
    clamped = (inverse > 0) & torch.isinf(one / inverse)  # (N5: min(..., FLT_MAX) took FLT_MAX)
    per_block = torch.where(clamped, one / torch.finfo(torch.float32).max, per_block)
    return decode(unpack(data)) * fp8_block.expand(per_block, (1, BLOCKS["nvfp4"]), rows, cols)


# -- MXFP4 -------------------------------------------------------------------------------------
def quantize_mxfp4(v: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 over the fp32 [R, C] tensor ``v`` (C even), 1x32 blocks: (bytes [R, C/2], E8M0 scale
    bytes [R, ceil(C/32)]). The scale is mxq's MXFP8 rule ``mode`` with E2M1's constants (a NaN in
    a block makes its amax NaN: scale 255, every element NaN -> 0x7); the element is
    E2M1_rn_satfinite(v * 2^(127 - e)), exact up to the rounding."""
    if mode not in SCALE_MODES["mxfp4"]:
        raise ValueError(f"mxq: scale_mode must be one of {SCALE_MODES['mxfp4']} for mxfp4, got {mode!r}")
    rows, cols = v.shape
    block = BLOCKS["mxfp4"]
    nb = -(-cols // block)
    padded = torch.nn.functional.pad(v, (0, nb * block - cols)).reshape(rows, nb, block)
    if rows * nb == 0:
        scale = torch.zeros((rows, nb), dtype=torch.uint8, device=v.device)
    else:
        scale = e8m0_from_amax(padded.abs().amax(dim=-1), E2M1, mode)
    y = v * fp8_block.expand(e8m0_to_inv_scale(scale), (1, block), rows, cols)
    return pack(encode_rn(y)), scale


def dequantize_mxfp4(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Packed bytes [R, C/2] and E8M0 bytes [R, ceil(C/32)] to fp32 [R, C]: e2m1 * 2^(e - 127),
    exact (255 gives NaN)."""
    rows, cols = data.shape[0], 2 * data.shape[1]
    return decode(unpack(data)) * fp8_block.expand(e8m0_to_scale(scale), (1, BLOCKS["mxfp4"]), rows, cols)


# -- the Hadamard transform ----------------------------------------------------------------------
def hadamard_matrix(signs=HADAMARD_SIGNS) -> torch.Tensor:
    """diag(signs) @ H16 / 4 in float64 (H16 Sylvester: H[i, j] = (-1)^popcount(i & j)), the
    matrix a row of 16 values is multiplied by (TE's random Hadamard transform)."""
    i = torch.arange(HADAMARD_SIZE)
    parity = torch.zeros((HADAMARD_SIZE, HADAMARD_SIZE), dtype=torch.int64)
    for bit in range(4):
        parity += ((i[:, None] >> bit) & (i[None, :] >> bit)) & 1
    h = 1.0 - 2.0 * (parity % 2).to(torch.float64)
    return torch.tensor(signs, dtype=torch.float64)[:, None] * h / 4


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """float64 -> the nearest bfloat16 (ties to even, one rounding; overflow to +-inf), as fp32."""
    m, e = torch.frexp(x)  # x = m * 2^e, 0.5 <= |m| < 1
    q = torch.clamp(e - 8, min=-133)  # the bf16 quantum at x: 8 significant bits, subnormals 2^-133
    r = torch.round(torch.ldexp(x, -q)) * torch.pow(2.0, q.to(torch.float64))  # torch.round: half to even
    r = torch.where(r.abs() >= 2.0 ** 128, torch.copysign(torch.full_like(r, float("inf")), x), r)
    return torch.where(torch.isfinite(x), r, x).to(torch.float32)


def hadamard(w: torch.Tensor, signs=HADAMARD_SIGNS) -> torch.Tensor:
    """Step H: TE's random Hadamard transform along the last dim of fp32 [R, C] (C % 16 == 0):
    each row's 16-element groups times diag(signs) @ H16 / 4, summed in float64 (exact unless a
    group's magnitudes span more than 2^41; an exact zero is +0, whatever the matrix product's
    order: the + 0.0) and rounded once to bf16 (as fp32)."""
    rows, cols = w.shape
    groups = w.to(torch.float64).reshape(rows, cols // HADAMARD_SIZE, HADAMARD_SIZE)
    return round_bf16(groups @ hadamard_matrix(signs).to(w.device) + 0.0).reshape(rows, cols)


# -- Philox4x32-10 and the random bytes of stochastic rounding ------------------------------------
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_U32 = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of the 64-bit product of the constant ``a`` and uint32 words ``b``
    (int64 tensors), in 16-bit halves so no int64 overflows."""
    lo_part = b * (a & 0xFFFF)  # < 2^48
    hi_part = b * (a >> 16)  # < 2^48
    low = lo_part + ((hi_part & 0xFFFF) << 16)  # < 2^49
    return ((hi_part >> 16) + (low >> 32)) & _U32, low & _U32


def philox(counter: tuple, key: tuple) -> tuple:
    """Philox4x32-10 (Salmon et al., Random123; curand's): four uint32 counter words (int64
    tensors) and two key words (ints) -> four uint32 words (int64 tensors)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + _PHILOX_W[0]) & _U32, (k1 + _PHILOX_W[1]) & _U32
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def random_bytes(rows: int, cols: int, seed: int, offset: int, direction: int, device) -> torch.Tensor:
    """Step N7's random byte of every element of a direction's [R, C] values (uint8 [R, C]).

    The 4 elements (r, 4q .. 4q+3) share the 32-bit word w = offset + r * ceil(C/4) + q, element
    4q+i taking its bits 8i .. 8i+7; word w is word (w % 4) of Philox4x32-10 with key (seed's low,
    high 32 bits) and counter (low, high 32 bits of w // 4, ``direction``, 0); ``direction`` is 0
    for the rowwise data, 1 for the colwise copy."""
    groups = -(-cols // 4)
    # (the words offset .. offset + rows * groups - 1 come from consecutive counters q, each run once)
    q0, q1 = offset >> 2, (offset + rows * groups - 1) >> 2
    q = torch.arange(q0, q1 + 1, dtype=torch.int64, device=device)
    zeros = torch.zeros_like(q)
    words = torch.stack(philox((q & _U32, (q >> 32) & _U32, zeros + direction, zeros),
                               (seed & _U32, (seed >> 32) & _U32)), dim=1).reshape(-1)  # word 4q + i
    start = offset - 4 * q0
    word = words[start:start + rows * groups].reshape(rows, groups)
    shifts = torch.arange(4, dtype=torch.int64, device=device) * 8
    per_elem = (word[:, :, None] >> shifts) & 0xFF
    return per_elem.reshape(rows, groups * 4)[:, :cols].to(torch.uint8)


def words_drawn(m: int, n: int) -> int:
    """The random words a stochastic-rounding call of [m, n] values draws from its offset on in
    either direction (random_bytes: rows * ceil(cols / 4); the directions on counters of their
    own): the larger of its rowwise [m, n] and colwise [n, m] values'."""
    return max(m * -(-n // 4), n * -(-m // 4))


def seed_and_offset(seed, offset, device, words: int) -> tuple:
    """A stochastic-rounding call's (seed, offset). A given seed is kept, with the given offset or
    0. A seed left None: on a CUDA device, torch's CUDA generator of that device gives its seed
    and, where no offset is given, its Philox offset, which the call then advances by ``words``
    rounded up to 4 (as torch's own random ops advance it): ``torch.manual_seed`` or
    ``torch.cuda.manual_seed`` repeats a run, and successive calls draw other words. Elsewhere,
    and while a CUDA graph is being captured (whose replays could not advance it), one draw from
    torch's default (CPU) generator, offset 0."""
    if seed is not None:
        return seed, 0 if offset is None else offset
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        gen = torch.cuda.default_generators[torch.cuda.current_device() if device.index is None else device.index]
        if offset is None:
            offset = gen.get_offset()
            gen.set_offset(offset + -(-words // 4) * 4)
        return gen.initial_seed(), offset
    return int(torch.randint(0, 2 ** 62, (), dtype=torch.int64)), 0 if offset is None else offset


__all__ = ["BLOCKS", "CallArgs", "E2M1", "FORMATS", "HADAMARD_SIGNS", "SCALE_MODES", "block_multiplier",
           "block_scale", "decode", "dequantize_mxfp4", "dequantize_nvfp4", "encode_rn",
           "encode_sr", "global_amax", "global_encode_scale", "hadamard", "hadamard_matrix", "pack", "philox",
           "quantize_mxfp4", "quantize_nvfp4", "random_bytes", "round_bf16", "seed_and_offset", "unpack", "words_drawn"]
