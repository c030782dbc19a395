"""An independent implementation of docs/NUMERICS.md's "FP8 block scaling", in plain Python.

It shares no code with ``mxq``: every fp32 rounding (the division FP8_MAX / amax, the product
x * scale, the reciprocal) is done on exact rationals (``Fraction``) and rounded to the nearest
fp32 with ties to even by hand; ``pow2`` takes the power of two below the scale with
``math.frexp`` (mxq masks bits); the FP8 encoding is tests/oracle.py's table search. Slow: use
small tensors.
"""

from __future__ import annotations

import math
from fractions import Fraction

from tests.oracle import encode

FP8_MAX = {"e4m3": 448, "e5m2": 57344}
# the input dtype's largest finite value (what an infinite quotient becomes)
INPUT_MAX = {"fp32": (2 - Fraction(1, 2 ** 23)) * 2 ** 127, "bf16": (2 - Fraction(1, 2 ** 7)) * 2 ** 127,
             "fp16": Fraction(65504)}
R = 128


def round_f32(q: Fraction) -> float:
    """The fp32 nearest to the rational ``q`` (ties to even); beyond the largest finite: inf."""
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    n = a / quantum
    lo = n.numerator // n.denominator
    rest = n - lo
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and lo % 2 == 1):
        lo += 1
    value = lo * quantum
    if value >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(value)


def scale(amax: float, fp8: str, mode: str, dtype: str) -> float:
    """The quantization multiplier of one block amax (>= 0)."""
    if amax == 0 or math.isinf(amax):
        return 1.0
    q = round_f32(Fraction(FP8_MAX[fp8]) / Fraction(amax))
    if math.isinf(q):
        q = float(INPUT_MAX[dtype])
    if mode == "pow2":
        _, e = math.frexp(q)  # q = m * 2^e, 0.5 <= m < 1
        q = math.ldexp(1.0, e - 1)
    return q


def scale_inv(s: float) -> float:
    """The stored dequantization multiplier: fp32(1 / s)."""
    return round_f32(Fraction(1) / Fraction(s))


def encode_scaled(x: float, s: float, fp8: str) -> int:
    """The FP8 byte of fp32(x * s), saturating."""
    if math.isnan(x) or math.isinf(x) or x == 0:  # (a zero keeps its sign: s > 0)
        return encode(x, fp8)
    return encode(round_f32(Fraction(x) * Fraction(s)), fp8)


def quantize(rows: list[list[float]], fp8: str, block: tuple, mode: str, dtype: str):
    """(FP8 codes [M][N], fp32 dequantization scales [ceil(M/rows)][ceil(N/cols)]) of the fp32
    values ``rows`` in (rows, cols) blocks; ``dtype`` names the op's input dtype."""
    m = len(rows)
    n = len(rows[0]) if m else 0
    br, bc = block
    mb, nb = -(-m // br), -(-n // bc)
    codes = [[0] * n for _ in range(m)]
    scales = [[0.0] * nb for _ in range(mb)]
    for bi in range(mb):
        for bj in range(nb):
            cells = [(i, j) for i in range(bi * br, min(m, bi * br + br)) for j in range(bj * bc, min(n, bj * bc + bc))]
            amax = 0.0
            for i, j in cells:
                if not math.isnan(rows[i][j]):
                    amax = max(amax, abs(rows[i][j]))
            s = scale(amax, fp8, mode, dtype)
            scales[bi][bj] = scale_inv(s)
            for i, j in cells:
                codes[i][j] = encode_scaled(rows[i][j], s, fp8)
    return codes, scales


def gemm_rowwise_offsets(rows: int, cols: int, tiles: bool) -> dict:
    """Element offset, in the fp32 buffer of the GEMM-ready layout, of logical scale (i, j) of a
    [rows, cols] operand, from docs/NUMERICS.md's drawing: 1x128: column-major with a leading
    dimension roundup(rows, 4); 128x128: row-major with a leading dimension roundup(ceil(cols/128), 4)."""
    if tiles:
        mb, nb = -(-rows // R), -(-cols // R)
        ld = -(-nb // 4) * 4
        return {(i, j): i * ld + j for i in range(mb) for j in range(nb)}
    nb = -(-cols // R)
    ld = -(-rows // 4) * 4
    return {(i, j): j * ld + i for i in range(rows) for j in range(nb)}
