"""An independent implementation of docs/NUMERICS.md's "NVFP4 and MXFP4", in plain Python.

It shares no code with ``mxq``: E2M1 encoding searches the table of the eight magnitudes (exact
Fractions) for the nearest with ties to the even code; every fp32 rounding is done on exact
rationals (tests/oracle_fp8_block.py ``round_f32``); E4M3 is tests/oracle.py's table search; the
E8M0 rules are written from the text (smallest power of two at or above, exponent fields); the
Hadamard transform sums exact rationals and rounds once to bf16 by hand; Philox4x32-10 runs on
Python ints. Stochastic rounding is stated through the two grid neighbours of |y| (mxq states it
through the spacing). Slow: use small tensors.
"""

from __future__ import annotations

import math
from fractions import Fraction

from tests.oracle import encode as encode_fp8
from tests.oracle_fp8_block import round_f32

GRID = [Fraction(v) for v in ("0", "1/2", "1", "3/2", "2", "3", "4", "6")]
FLT_MAX = float((2 - Fraction(1, 2 ** 23)) * 2 ** 127)
SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def _sign(x: float) -> int:
    return 8 if math.copysign(1.0, x) < 0 else 0


def e2m1(y: float) -> int:
    """fp32 -> E2M1 code: nearest, ties to the even code, saturating at 6; NaN -> 7; the sign
    is kept (a negative value rounding to 0 is 8)."""
    if math.isnan(y):
        return 7
    if math.isinf(y) or abs(y) >= 6:
        return _sign(y) | 7
    a = Fraction(abs(y))
    best = min(range(8), key=lambda c: (abs(GRID[c] - a), c % 2))
    return _sign(y) | best


def e2m1_sr(y: float, r: int) -> int:
    """Stochastic rounding with random byte ``r``: between the grid neighbours lo <= |y| < hi, up
    iff floor(256 (|y| - lo) / (hi - lo)) + r >= 256."""
    if math.isnan(y):
        return 7
    if math.isinf(y) or abs(y) >= 6:
        return _sign(y) | 7
    a = Fraction(abs(y))
    lo = max(c for c in range(8) if GRID[c] <= a)
    f = (a - GRID[lo]) / (GRID[lo + 1] - GRID[lo])
    up = math.floor(256 * f) + r >= 256
    return _sign(y) | (lo + up)


def e2m1_value(code: int) -> float:
    v = float(GRID[code & 7])
    return -v if code & 8 else v


def e4m3_value(byte: int) -> Fraction:
    e, m = (byte >> 3) & 0xF, byte & 7
    mag = Fraction(m, 8) * Fraction(2) ** -6 if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
    return -mag if byte & 0x80 else mag


def mul(a: float, b: float) -> float:
    """fp32(a * b) of fp32 values (inf and NaN as IEEE)."""
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b) or a == 0 or b == 0:
        return a * b  # (IEEE signs of zero and infinity)
    return round_f32(Fraction(a) * Fraction(b))


def div(a: float, b: float) -> float:
    """fp32(a / b) of fp32 values (a finite or b finite)."""
    if math.isinf(b):
        return math.copysign(0.0, a) * math.copysign(1.0, b)
    if b == 0:
        return math.copysign(math.inf, a) if a else math.nan
    if math.isinf(a):
        return a
    return round_f32(Fraction(a) / Fraction(b))


def amax(values) -> float:
    """max |v| of the non-NaN values, from 0."""
    return max([abs(v) for v in values if not math.isnan(v)], default=0.0)


def s_enc(global_amax: float) -> float:
    s = min(div(2688.0, global_amax) if global_amax else math.inf, FLT_MAX)
    return 1.0 if global_amax == 0 or s == 0 else s


def nvfp4(rows: list, global_amax: float, tile_rows: int = 1, rand=None) -> tuple[list, list]:
    """NVFP4 of fp32 [R, C] values (lists): (E2M1 codes [R, C], E4M3 scale bytes [R, ceil(C/16)]).
    ``rand``: random bytes [R, C] for stochastic rounding, or None."""
    enc = s_enc(global_amax)
    sf = mul(enc, round_f32(Fraction(1, 6)))
    s_dec = div(1.0, enc)
    n_rows, n_cols = len(rows), len(rows[0]) if rows else 0
    codes = [[0] * n_cols for _ in range(n_rows)]
    scales = [[0] * (-(-n_cols // 16)) for _ in range(n_rows)]
    for r0 in range(0, n_rows, tile_rows):
        for c0 in range(0, n_cols, 16):
            block = [rows[r][c] for r in range(r0, min(r0 + tile_rows, n_rows)) for c in range(c0, min(c0 + 16, n_cols))]
            d = min(mul(amax(block), sf), FLT_MAX)
            byte = encode_fp8(d, "e4m3")
            prod = mul(float(e4m3_value(byte)), s_dec)
            mult = min(div(1.0, prod), FLT_MAX)
            for r in range(r0, min(r0 + tile_rows, n_rows)):
                scales[r][c0 // 16] = byte
                for c in range(c0, min(c0 + 16, n_cols)):
                    y = mul(rows[r][c], mult)
                    codes[r][c] = e2m1(y) if rand is None else e2m1_sr(y, rand[r][c])
    return codes, scales


def e8m0(block_amax: float, mode: str) -> int:
    """MXFP4's scale byte: NaN -> 255; floor: the exponent field of amax minus 2 (E2M1's largest
    power of two is 4), clamped to [0, 255]; rceil: the smallest 2^k (k in [-127, 127]) at or
    above fp32(amax * fp32(1/6)), as k + 127."""
    if math.isnan(block_amax):
        return 255
    if mode == "floor":
        if block_amax == 0:
            field = 0
        elif math.isinf(block_amax):
            field = 255
        else:
            field = max(0, math.floor(math.log2(Fraction(block_amax))) + 127)
            if Fraction(2) ** (field - 127) > Fraction(block_amax):  # (log2's float rounding)
                field -= 1
            while Fraction(2) ** (field + 1 - 127) <= Fraction(block_amax) and field < 254:
                field += 1
        return max(0, field - 2)
    p = mul(block_amax, round_f32(Fraction(1, 6)))
    if math.isinf(p):
        return 254
    k = -127
    while k < 127 and Fraction(2) ** k < Fraction(p):
        k += 1
    return k + 127


def mxfp4(rows: list, mode: str) -> tuple[list, list]:
    """MXFP4 of fp32 [R, C] values: (codes [R, C], E8M0 bytes [R, ceil(C/32)]); a NaN makes its
    block's amax NaN."""
    codes, scales = [], []
    for row in rows:
        crow, srow = [], []
        for c0 in range(0, len(row), 32):
            block = row[c0:c0 + 32]
            a = math.nan if any(math.isnan(v) for v in block) else max(abs(v) for v in block)
            e = e8m0(a, mode)
            srow.append(e)
            for v in block:
                if e == 255:
                    y = math.nan
                elif math.isfinite(v) and v != 0:
                    y = round_f32(Fraction(v) * Fraction(2) ** (127 - e))
                else:
                    y = v  # (inf, NaN, signed zeros as they are)
                crow.append(e2m1(y))
        codes.append(crow)
        scales.append(srow)
    return codes, scales


def pack(codes: list) -> list:
    return [[row[j] | row[j + 1] << 4 for j in range(0, len(row), 2)] for row in codes]


def round_bf16(q: Fraction) -> float:
    """The bf16 nearest to ``q`` (ties to even, subnormal quantum 2^-133)."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = math.floor(math.log2(a))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** max(e - 7, -133)
    n = a / quantum
    lo = n.numerator // n.denominator
    if n - lo > Fraction(1, 2) or (n - lo == Fraction(1, 2) and lo % 2):
        lo += 1
    v = lo * quantum
    return math.copysign(math.inf if v >= 2 ** 128 else float(v), float(q))


def hadamard_rows(rows: list, signs=SIGNS) -> list:
    """Each row's 16-element groups x -> y_j = sum_i x_i s_i (-1)^popcount(i & j) / 4, exact,
    rounded once to bf16 (``signs`` s: TE's unless given)."""
    out = []
    for row in rows:
        orow = []
        for g in range(0, len(row), 16):
            x = row[g:g + 16]
            for j in range(16):
                total = sum(Fraction(x[i]) * signs[i] * (-1) ** bin(i & j).count("1") for i in range(16))
                orow.append(round_bf16(total / 4))
        out.append(orow)
    return out


M32 = 0xFFFFFFFF


def philox(ctr: list, key: list) -> list:
    """Philox4x32-10 on Python ints."""
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & M32, (p0 >> 32) ^ c[3] ^ k[1], p0 & M32]
    return c


def random_bytes(n_rows: int, n_cols: int, seed: int, offset: int, direction: int) -> list:
    """The random byte of element (r, c): byte c % 4 of 32-bit word w = offset + r * ceil(C/4) +
    c // 4, which is word w % 4 of philox(counter (w // 4 low, high, direction, 0), key (seed
    low, high))."""
    groups = -(-n_cols // 4)
    out = []
    for r in range(n_rows):
        row = []
        for c in range(n_cols):
            w = offset + r * groups + c // 4
            q = w // 4
            word = philox([q & M32, q >> 32, direction, 0], [seed & M32, seed >> 32])[w % 4]
            row.append(word >> (8 * (c % 4)) & 0xFF)
        out.append(row)
    return out
