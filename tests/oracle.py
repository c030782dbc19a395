"""An independent implementation of docs/NUMERICS.md in plain Python, for cross-checking.

It shares no code with ``mxq``: fp32 rounding goes through ``struct``, FP8 encoding searches the
table of every finite FP8 value (exact Fractions) for the nearest one with ties to the even
code, and the scale rules are written from the text of docs/NUMERICS.md. Slow; use small tensors.
"""

from __future__ import annotations

import bisect
import math
import struct
from fractions import Fraction

FMT = {
    # name: (exponent bits, mantissa bits, bias, max code, emax, rcp bits)
    "e4m3": (4, 3, 7, 0x7E, 8, 0x3B124925),
    "e5m2": (5, 2, 15, 0x7B, 15, 0x37924925),
}


def f32(x: float) -> float:
    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def _decode(code: int, ebits: int, mbits: int, bias: int) -> Fraction:
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if e == 0:
        return Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    return (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)


_TABLES: dict = {}


def _table(fmt: str):
    if fmt not in _TABLES:
        ebits, mbits, bias, maxcode, _, _ = FMT[fmt]
        _TABLES[fmt] = [_decode(c, ebits, mbits, bias) for c in range(maxcode + 1)]
    return _TABLES[fmt]


def encode(x: float, fmt: str) -> int:
    """fp32 value -> FP8 byte: RNE, saturate finite overflow and inf to MAX, NaN -> 0x7F."""
    if math.isnan(x):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    table = _table(fmt)
    if math.isinf(x):
        return sign | (len(table) - 1)
    a = Fraction(abs(x))
    if a >= table[-1]:
        return sign | (len(table) - 1)
    i = bisect.bisect_left(table, a)
    if table[i] == a:
        return sign | i
    lo, hi = i - 1, i
    dlo, dhi = a - table[lo], table[hi] - a
    code = lo if dlo < dhi or (dlo == dhi and lo % 2 == 0) else hi
    return sign | code


def scale_byte(amax: float, fmt: str, mode: str) -> int:
    """docs/NUMERICS.md step 7 for one block amax (>= 0 or NaN)."""
    _, mbits, _, _, emax, rcp_bits = FMT[fmt]
    if math.isnan(amax):
        return 255
    if mode == "rceil":
        p = f32(amax * from_bits(rcp_bits))
        if math.isinf(p):
            return 254
        b = bits(p)
        e, m = b >> 23, b & 0x7FFFFF
        up = m > 0 and e != 0xFE and not (e == 0 and m <= 0x400000)
        return min(254, e + up)
    b = bits(amax)
    if mode == "even":
        b = (b + (1 << (23 - mbits - 1))) & 0x7F800000
    e = (b >> 23) & 0xFF
    if mode == "ceil" and (b & 0x7FFFFF):
        e += 1
    return max(0, min(255, e - emax))


def inv_scale(e: int) -> float:
    if e == 255:
        return math.nan
    if e == 254:
        return from_bits(0x00400000)
    return from_bits((254 - e) << 23)


def quantize_rows(rows: list[list[float]], fmt: str, mode: str) -> tuple[list[list[int]], list[list[int]]]:
    """Rowwise MXFP8 of fp32 values: (data bytes, compact scale bytes)."""
    data, scales = [], []
    for row in rows:
        drow, srow = [], []
        for j in range(0, len(row), 32):
            block = row[j:j + 32]
            amax = 0.0
            for v in block:
                if math.isnan(v):
                    amax = math.nan
                    break
                amax = max(amax, abs(v))
            e = scale_byte(amax, fmt, mode)
            srow.append(e)
            s = inv_scale(e)
            drow += [encode(f32(v * s), fmt) for v in block]
        data.append(drow)
        scales.append(srow)
    return data, scales


def swizzle_offset(i: int, j: int, blocks: int) -> int:
    t = -(-blocks // 4)
    return ((i // 128) * t + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
