"""Device helpers shared by the kernels: the E8M0 scale rules, FP8 conversion, packed 16-bit
math and the inline PTX the DSL has no wrapper for.

These are plain Python functions called while a kernel is traced (they are inlined, not
launched), so they may only branch on Python values: the scale mode, the format and
``is_bf16`` select code at trace time; everything on device values goes through
``cutlass.select_``. The rules are docs/NUMERICS.md's (docs/NUMERICS.md, steps 5-9) and
mirror mxq/numerics.py, the torch reference, bit for bit.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Int64, Uint8, Uint16, Uint32, Uint64
from cutlass.cute.math import RoundingMode

from ..formats.fp4 import E2M1, HADAMARD_SIGNS
from ..formats.numerics import FORMATS

ELEMENTS = {**FORMATS, "e2m1": E2M1}  # the element formats' constants (the E8M0 rules read them)

RN = RoundingMode.NEAREST_EVEN


def mul_rn(a, b):
    """a * b rounded once (explicit .rn: ptxas never contracts it into an FMA)."""
    return Float32(cute.math.mul(a, b, rounding=RN))


def add_rn(a, b):
    return Float32(cute.math.add(a, b, rounding=RN))


# --- E8M0 scales and FP8 conversion (docs/NUMERICS.md steps 7-9) -----------------------------------
# The scale rules are integer logic on fp32 bit patterns, written once against ``ops``: DEVICE
# (DSL values, inside a kernel) or HOST (Python ints with 32-bit wrap-around), so the very
# expressions the kernels trace are checked on CPU against tests/oracle.py (tests/test_kernels.py).
class DEVICE:
    """The integer operations of the scale rules on DSL values."""

    U32 = Uint32
    I32 = Int32
    min = staticmethod(cutlass.min)
    max = staticmethod(cutlass.max)
    select = staticmethod(cutlass.select_)


class HOST:
    """The same operations on Python ints (two's complement, 32 bits)."""

    @staticmethod
    def U32(v):
        return int(v) & 0xFFFFFFFF

    @staticmethod
    def I32(v):
        v = int(v) & 0xFFFFFFFF
        return v - (1 << 32) if v >> 31 else v

    min = staticmethod(min)
    max = staticmethod(max)

    @staticmethod
    def select(cond, a, b):
        return a if cond else b


def rceil_scale(b, ops=DEVICE):
    """RCEIL scale byte from the bits ``b`` (unsigned) of p = fp32(amax * fp32(1/MAX)), p >= 0 or
    NaN. Adding 0x7FFFFF carries into the exponent exactly when the mantissa is nonzero (round
    up); min 254 covers 2^127 < p <= inf; p <= 2^-127 gives 0; NaN gives 255."""
    U32 = ops.U32
    e = ops.min((b + U32(0x7FFFFF)) >> U32(23), U32(254))
    e = ops.select(b <= U32(0x400000), U32(0), e)
    return ops.select(b > U32(0x7F800000), U32(255), e)


def exponent_scale(b, is_nan, fp8: str, mode: str, ops=DEVICE):
    """FLOOR / CEIL / EVEN scale byte from the bits ``b`` (signed) of a block amax >= 0 or NaN;
    ``is_nan()`` tells whether amax is NaN (evaluated last, as the kernels always did)."""
    I32 = ops.I32
    fmt = ELEMENTS[fp8]
    if mode == "even":
        b = (b + I32(2 ** (22 - fmt.mbits))) & I32(0x7F800000)  # round to mbits mantissa bits first
    e = (b >> 23) & 0xFF
    if mode == "ceil":
        e = e + I32(ops.select((b & 0x7FFFFF) != 0, I32(1), I32(0)))
    e = I32(ops.max(ops.min(e - fmt.emax, I32(255)), I32(0)))
    return I32(ops.select(is_nan(), I32(255), e))


def inv_scale_bits(e, ops=DEVICE):
    """The fp32 bits of 2^(127 - e); 254 -> 2^-127 (subnormal), 255 -> NaN."""
    I32 = ops.I32
    bits = (I32(254) - e) << 23
    bits = I32(ops.select(e == 254, I32(0x00400000), bits))
    return I32(ops.select(e == 255, I32(0x7FC00000), bits))


def e8m0_scale(amax, fp8: str, mode: str, use_hw_e8m0: bool):
    """Scale byte (Int32 0..255) of a block amax (fp32, >= 0 or NaN)."""
    if mode == "rceil":
        p = mul_rn(amax, Float32(ELEMENTS[fp8].rcp))  # amax / MAX, as fp32(1 / MAX) * amax
        if use_hw_e8m0:
            # sm_100+: round-up conversion in hardware; NaN -> 255, inf -> 254, p <= 2^-127 -> 0
            pk = cute.arch.inline_ptx("cvt.rp.satfinite.ue8m0x2.f32 {$w0}, {$r0}, {$r1};",
                                      write_only_types=[Uint16], read_only_args=[Float32(0.0), p])
            return Int32(pk & Uint16(0xFF))
        return Int32(rceil_scale(p.bitcast(Uint32)))
    return exponent_scale(amax.bitcast(Int32), lambda: amax != amax, fp8, mode)


POW2_BITS = 0xFF800000  # the sign and exponent bits of an fp32 (FP8 block scaling's pow2 rule)


def div_rn(a, b):
    """a / b as one IEEE fp32 division, round to nearest even (div.rn.f32)."""
    return Float32(cute.math.div(a, b, rounding=RN))


def te_scale(amax, fmax: float, input_max: float, pow2: bool):
    """FP8 block scaling's quantization multiplier of a block amax (fp32, >= 0, no NaN;
    TransformerEngine's rule, docs/NUMERICS.md "FP8 block scaling", mxq/formats/fp8_block.py
    scale_from_amax): fmax / amax as one IEEE division, an infinite quotient becomes
    ``input_max`` (the input dtype's largest finite value), ``pow2`` keeps its sign and exponent
    bits; amax 0 or inf gives 1."""
    q = div_rn(Float32(fmax), amax)
    q = Float32(cutlass.select_(q == Float32(float("inf")), Float32(input_max), q))
    if pow2:
        q = (q.bitcast(Uint32) & Uint32(POW2_BITS)).bitcast(Float32)
    special = (amax == Float32(0.0)) | (amax == Float32(float("inf")))
    return Float32(cutlass.select_(special, Float32(1.0), q))


def inv_scale(e):
    """2^(127 - e) as fp32."""
    return inv_scale_bits(e).bitcast(Float32)


def _cvt(fp8: str) -> str:
    return "e4m3x2" if fp8 == "e4m3" else "e5m2x2"


def to_fp8(q, fp8: str):
    """RNE, saturating to +-MAX, NaN -> 0x7F (the x2 instruction; the upper lane is unused)."""
    pk = cute.arch.inline_ptx(f"cvt.rn.satfinite.{_cvt(fp8)}.f32 {{$w0}}, {{$r0}}, {{$r1}};",
                              write_only_types=[Uint16], read_only_args=[Float32(0.0), q])
    return Uint8(pk & Uint16(0xFF))


def to_fp8x2_word(lo, hi, fp8: str):
    """Two values in one conversion, as one 16-bit word (lo in the low byte)."""
    return cute.arch.inline_ptx(f"cvt.rn.satfinite.{_cvt(fp8)}.f32 {{$w0}}, {{$r0}}, {{$r1}};",
                                write_only_types=[Uint16], read_only_args=[hi, lo])


def to_fp8x2(lo, hi, fp8: str):
    """Two values in one conversion: (byte of lo, byte of hi)."""
    pk = to_fp8x2_word(lo, hi, fp8)
    return Uint8(pk & Uint16(0xFF)), Uint8(pk >> 8)


def fp8x4(a, b, c, d, fp8: str):
    """Four fp32 values to four FP8 bytes in one word (a in the lowest byte): RNE, saturating."""
    cvt = _cvt(fp8)
    return cute.arch.inline_ptx(
        f"{{ .reg .b16 l, h; cvt.rn.satfinite.{cvt}.f32 l, {{$r1}}, {{$r0}}; "
        f"cvt.rn.satfinite.{cvt}.f32 h, {{$r3}}, {{$r2}}; mov.b32 {{$w0}}, {{l, h}}; }}",
        write_only_types=[Uint32], read_only_args=[a, b, c, d])


# --- NVFP4's scales (docs/NUMERICS.md steps N2, N4, N5; mxq/formats/fp4.py) -------------------------
# Written against ``ops`` like the E8M0 rules: NV_DEVICE (DSL values) in the kernels, and
# tests/test_kernels_nvfp4.py runs the very expressions on fp32 torch tensors against fp4.py.
FLT_MAX = 3.4028234663852886e38
SIXTH = 0.1666666716337204  # fp32(1/6)
E4M3_SUBNORMAL_QUANTUM = 2.0 ** -9


class NV_DEVICE(DEVICE):
    """DEVICE's operations and the fp32 ones of NVFP4's scales, on DSL values."""

    F32 = Float32
    div = staticmethod(div_rn)
    mul = staticmethod(mul_rn)

    @staticmethod
    def e4m3(x):
        """The E4M3 byte (Int32) of fp32 ``x``: RNE, saturating (cvt.rn.satfinite)."""
        return Int32(to_fp8(x, "e4m3"))

    @staticmethod
    def f32_bits(b):
        return b.bitcast(Float32)

    @staticmethod
    def small_int_f32(u):
        return Float32(Int32(u))

    @staticmethod
    def e4m3_f32(e):
        """e4m3_value of a scale byte by the hardware: cvt.rn.f16x2.e4m3x2 (every E4M3 value is an
        fp16 exactly) and cvt.f32.f16, two instructions."""
        return Float32(cute.arch.inline_ptx(
            "{ .reg .b16 b, h, x; .reg .b32 p; cvt.u16.u32 b, {$r0}; cvt.rn.f16x2.e4m3x2 p, b; "
            "mov.b32 {h, x}, p; cvt.f32.f16 {$w0}, h; }",
            write_only_types=[Float32], read_only_args=[Uint32(e)]))

    @staticmethod
    def e4m3x2(x0, x1):
        """The E4M3 bytes of fp32 ``x0``, ``x1`` (RNE, saturating) in one cvt, as a word: x0's
        byte in bits 0-7, x1's in bits 8-15."""
        return Uint32(to_fp8x2_word(x0, x1, "e4m3"))

    @staticmethod
    def e4m3x2_f32(w):
        """The fp32 values of the two E4M3 bytes of ``w`` (bits 0-7, 8-15), exactly: one
        cvt.rn.f16x2.e4m3x2 and two cvt.f32.f16."""
        return cute.arch.inline_ptx(
            "{ .reg .b16 b, h0, h1; .reg .b32 p; cvt.u16.u32 b, {$r0}; cvt.rn.f16x2.e4m3x2 p, b; "
            "mov.b32 {h0, h1}, p; cvt.f32.f16 {$w0}, h0; cvt.f32.f16 {$w1}, h1; }",
            write_only_types=[Float32, Float32], read_only_args=[Uint32(w)])

    @staticmethod
    def rcp(x):
        """1 / x rounded once to nearest even (rcp.rn.f32: IEEE's reciprocal, the quotient
        div.rn.f32 gives for 1 / x; subnormals kept)."""
        return Float32(cute.arch.inline_ptx("rcp.rn.f32 {$w0}, {$r0};", write_only_types=[Float32],
                                            read_only_args=[Float32(x)]))


def _at_most_flt_max(x, ops):
    """min(x, FLT_MAX) for x >= 0 (inf -> FLT_MAX)."""
    return ops.F32(ops.select(x > ops.F32(FLT_MAX), ops.F32(FLT_MAX), x))


def nvfp4_global(amax, ops=NV_DEVICE):
    """(fp32(S_enc * fp32(1/6)), fp32(1 / S_enc)) of the per-tensor amax (fp32, >= 0, no NaN):
    S_enc = min(fp32(2688 / amax), FLT_MAX), 1 where amax is 0 or S_enc is 0 (step N2); the
    products N4 and N5 take, each rounded once."""
    s = _at_most_flt_max(ops.div(ops.F32(2688.0), amax), ops)
    s = ops.F32(ops.select((amax == ops.F32(0.0)) | (s == ops.F32(0.0)), ops.F32(1.0), s))
    return ops.mul(s, ops.F32(SIXTH)), ops.div(ops.F32(1.0), s)


def nvfp4_scale(block_amax, sf, ops=NV_DEVICE):
    """Step N4: the E4M3 scale byte (Int32) of a block amax (>= 0, no NaN):
    e4m3_rn_satfinite(min(block_amax * sf, FLT_MAX)), ``sf`` = nvfp4_global's first value."""
    return ops.e4m3(_at_most_flt_max(ops.mul(block_amax, sf), ops))


def e4m3_value_bits(e, ops=DEVICE):
    """The fp32 bits of a non-negative normal E4M3 byte ``e`` (8..126: exponent field + 120, the
    three mantissa bits on top of fp32's); subnormal bytes (< 8) are e4m3_value's."""
    U32 = ops.U32
    return (((e >> U32(3)) + U32(120)) << U32(23)) | ((e & U32(7)) << U32(20))


def e4m3_value(e, ops=NV_DEVICE):
    """The fp32 value of a non-negative E4M3 byte ``e`` (0..126), exact: normal bytes by their
    bits, subnormal ones as mantissa * 2^-9."""
    u = ops.U32(e)
    normal = ops.f32_bits(e4m3_value_bits(u, ops))
    sub = ops.mul(ops.small_int_f32(u & ops.U32(7)), ops.F32(E4M3_SUBNORMAL_QUANTUM))
    return ops.F32(ops.select(u >= ops.U32(8), normal, sub))


def nvfp4_multiplier(e, s_dec, ops=NV_DEVICE):
    """Step N5: min(fp32(1 / fp32(fp32(scale) * s_dec)), FLT_MAX) of the E4M3 scale byte ``e``,
    ``s_dec`` = nvfp4_global's second value (scale 0: FLT_MAX). The device decodes the byte with
    cvt (ops.e4m3_f32, exact: e4m3_value's value) and takes rcp.rn.f32 (ops.rcp: the quotient of
    div.rn.f32 1 / x, without the division's extra refinement steps)."""
    return nvfp4_multiplier_of(ops.e4m3_f32(e), s_dec, ops)


def nvfp4_multiplier_of(v, s_dec, ops=NV_DEVICE):
    """nvfp4_multiplier of the scale's fp32 value ``v``."""
    return _at_most_flt_max(ops.rcp(ops.mul(v, s_dec)), ops)


def nvfp4_scales2(a0, a1, sf, s_dec, ops=NV_DEVICE):
    """nvfp4_scale and nvfp4_multiplier of two block amaxes at once: (the word of the two scale
    bytes, a0's in bits 0-7 and a1's in bits 8-15; a0's multiplier, a1's): one conversion to
    E4M3 and one back (ops.e4m3x2, ops.e4m3x2_f32) for the two."""
    w = ops.e4m3x2(_at_most_flt_max(ops.mul(a0, sf), ops), _at_most_flt_max(ops.mul(a1, sf), ops))
    v0, v1 = ops.e4m3x2_f32(w)
    return w, nvfp4_multiplier_of(v0, s_dec, ops), nvfp4_multiplier_of(v1, s_dec, ops)


# --- E2M1 (FP4) encoding (docs/NUMERICS.md step N7) ---------------------------------------------
# E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign. sm_100a converts in hardware
# (cvt.rn.satfinite.e2m1x2.f32); sm_90 has no such cvt and encodes with the integer rule below,
# written against ``ops`` like the scale rules so tests/test_kernels_fp4.py runs the very
# expressions on CPU against mxq/formats/fp4.encode_rn and tests/oracle_fp4.py.
E2M1_ONE = 0x3F800000  # fp32 bits of 1.0: from here on |y| is a normal E2M1 value (codes 2..7)
E2M1_QUARTER = 0x3E800000  # 0.25: above it |y| rounds to 0.5 (code 1; 0.25 itself ties to 0)
E2M1_THREE_QUARTERS = 0x3F400000  # 0.75: from it on |y| rounds to 1.0 (code 2; the tie goes up)


def e2m1_code(b, ops=DEVICE):
    """The E2M1 code (0..15) of the fp32 bits ``b`` (unsigned), round to nearest even: |y| >= 1
    keeps one mantissa bit (adding 0x1FFFFF plus the kept bit carries exactly when the dropped
    bits exceed half, or equal it with the kept bit odd), its (exponent, bit) minus 252 is the
    code, saturating at 7 (inf included); below 1 the two thresholds 0.25 (strict) and 0.75
    decide 0, 1 or 2. The sign is kept (0x8 for a negative value rounding to 0); NaN -> 0x7."""
    U32 = ops.U32
    a = b & U32(0x7FFFFFFF)
    r = (a + U32(0x1FFFFF) + ((a >> U32(22)) & U32(1))) >> U32(22)
    normal = ops.min(r - U32(252), U32(7))
    small = U32(ops.select(a > U32(E2M1_QUARTER), U32(1), U32(0))) + \
        U32(ops.select(a >= U32(E2M1_THREE_QUARTERS), U32(1), U32(0)))
    mag = U32(ops.select(a < U32(E2M1_ONE), small, normal))
    code = mag | ((b >> U32(28)) & U32(8))
    return U32(ops.select(a > U32(0x7F800000), U32(7), code))


def e2m1x8(vals, use_hw: bool):
    """Eight scaled fp32 values as one word of E2M1 codes, value k in bits 4k..4k+3 (element 2j
    in the low nibble of byte j): sm_100a's cvt.rn.satfinite.e2m1x2.f32 (``use_hw``; its first
    source goes to the high nibble), else two at a time in 16-bit lanes: each pair rounded to
    bf16 by round-to-odd (bf16x2_rto), then e2m1x2_codes (e2m1x2_rto_codes)."""
    if use_hw:
        cvts = " ".join(f"cvt.rn.satfinite.e2m1x2.f32 b{j}, {{$r{2 * j + 1}}}, {{$r{2 * j}}};" for j in range(4))
        return cute.arch.inline_ptx(
            f"{{ .reg .b8 b0, b1, b2, b3; {cvts} mov.b32 {{$w0}}, {{b0, b1, b2, b3}}; }}",
            write_only_types=[Uint32], read_only_args=list(vals))
    return e2m1x8_from_pairs([e2m1x2_rto_codes(vals[2 * j].bitcast(Uint32), vals[2 * j + 1].bitcast(Uint32))
                              for j in range(4)])


def e2m1x8_bf16(words, mult):
    """Eight bf16 values (four words of two, element 2j in the low lane of word j) times a power
    of two ``mult`` (fp32; MXFP4's inverse scale, whose low 16 bits are zero: inv_scale_bits) as
    one word of E2M1 codes (e2m1x8's order). The products are exact in bf16 (a bf16 times a power
    of two; below bf16's range only values that encode as a signed 0 round), so one mul.rn.bf16x2
    per pair replaces two fp32 multiplies and the rounding to bf16."""
    m = mult.bitcast(Uint32)
    m2 = prmt(m, m, 0x3232)  # (the high half in both lanes)
    return e2m1x8_from_pairs([e2m1x2_scaled_codes(w, m2) for w in words])



# --- E2M1 two at a time: the 16-bit lanes of a word (sm_90 has fma.bf16x2 and min.u16x2) --------
# The rule of e2m1_code on bf16 bits: E2M1's code of |y| is min(2|y|, |y| + 2, |y| / 2 + 4, 7)
# rounded to the nearest integer, ties to even (the three lines meet at |y| = 2 and 4, their
# slopes E2M1's spacings 0.5, 1 and 2; the offsets are even, so an even integer is an even code;
# rounding commutes with min). Each line plus 128 is one fma.rn.bf16x2 (an exact product and sum
# rounded once, in [128, 256) to bf16's spacing 1 there), so the lane's code is the unsigned min
# of the three results and 128 + 7, minus 128's bits; inf and NaN (any sign) take the 7. The sign
# bit is added apart (each lane's sum is at most 15, so lanes never carry into each other). A
# bf16 rounded to odd from fp32 (8 significant bits) rounds to E2M1 exactly as the fp32 value would.
BF16X2_128 = 0x43004300  # 128.0 in both lanes: codes are the results' bits minus these
E2M1_LINES = ((0x40004000, 0x43004300), (0x3F803F80, 0x43024302), (0x3F003F00, 0x43044304))  # (slope, 128 + offset)
BF16X2_128_7 = 0x43074307  # 135.0: the largest code, 7, plus 128


class PAIR_DEVICE(DEVICE):
    """DEVICE's operations and the 16-bit-lane ones of e2m1x2_codes, on DSL words. The lane
    instructions take no immediates, and LLVM folds a constant operand into one: each goes
    through a scoped register (ptxas hoists the moves)."""

    @staticmethod
    def _lanes(op: str, a, b):
        return cute.arch.inline_ptx(
            f"{{ .reg .b32 x, y; mov.b32 x, {{$r0}}; mov.b32 y, {{$r1}}; {op} {{$w0}}, x, y; }}",
            write_only_types=[Uint32], read_only_args=[Uint32(a), Uint32(b)])

    @staticmethod
    def fma_bf16x2(a, b, c):
        return cute.arch.inline_ptx(
            "{ .reg .b32 x, y, z; mov.b32 x, {$r0}; mov.b32 y, {$r1}; mov.b32 z, {$r2}; fma.rn.bf16x2 {$w0}, x, y, z; }",
            write_only_types=[Uint32], read_only_args=[Uint32(a), Uint32(b), Uint32(c)])

    min16x2 = staticmethod(lambda a, b: PAIR_DEVICE._lanes("min.u16x2", a, b))
    mul_bf16x2 = staticmethod(lambda a, b: PAIR_DEVICE._lanes("mul.rn.bf16x2", a, b))

    @staticmethod
    def prmt(a, b, selector: int):
        return prmt(a, b, selector)

    @staticmethod
    def lop3(a, b, c, lut: int):
        """lop3.b32 (bit i of the result: bit 4a_i + 2b_i + c_i of ``lut``), one instruction that
        LLVM cannot split (it moves a mask past a shift, which ptxas then issues apart)."""
        return cute.arch.inline_ptx(f"lop3.b32 {{$w0}}, {{$r0}}, {{$r1}}, {{$r2}}, {lut};", write_only_types=[Uint32],
                                    read_only_args=[Uint32(a), Uint32(b), Uint32(c)])


def bf16x2_rto(lo, hi, ops=PAIR_DEVICE):
    """The fp32 bits ``lo``, ``hi`` as one word of two bf16 rounded to odd (lo in the low lane):
    each high half, its last bit set where the dropped half is nonzero (inf stays inf, NaN NaN)."""
    kept, sticky = bf16x2_rto_parts(lo, hi, ops)
    return kept | sticky


def bf16x2_rto_parts(lo, hi, ops=PAIR_DEVICE):
    """bf16x2_rto's two parts: (the high halves, each lane's last bit: 1 where the dropped half
    is nonzero)."""
    return ops.prmt(lo, hi, 0x7632), ops.min16x2(ops.prmt(lo, hi, 0x5410), ops.U32(0x00010001))


NAN_LANES = 0x007F007F  # |x| + this sets bit 15 of a 16-bit lane exactly where |x| is NaN (no carry out)


def e2m1x2_codes(w, ops=PAIR_DEVICE, nan=None, sticky=None):
    """The E2M1 codes of the two bf16 values of word ``w`` (bits), each in the low nibble of its
    lane: e2m1_code's rule (round to nearest even, saturating at 6, the sign kept, NaN -> 0x7).
    ``nan``: a word whose lanes' bit 15 marks the NaN lanes (default |w| + NAN_LANES; a caller
    that knows them otherwise, e2m1x2_scaled_codes, passes its own); ``sticky``: last bits OR'ed
    into the values (round-to-odd's, e2m1x2_rto_codes: |w| then takes one lop3, and the sign
    and the kept bit do not depend on them)."""
    U32 = ops.U32
    a = w & U32(0x7FFF7FFF) if sticky is None else ops.lop3(w, sticky, U32(0x7FFF7FFF), 0xA8)  # (w | s) & m
    (s0, c0), (s1, c1), (s2, c2) = E2M1_LINES
    lines = ops.min16x2(ops.fma_bf16x2(a, U32(s0), U32(c0)), ops.fma_bf16x2(a, U32(s1), U32(c1)))
    mag = ops.min16x2(lines, ops.min16x2(ops.fma_bf16x2(a, U32(s2), U32(c2)), U32(BF16X2_128_7)))
    if nan is None:
        nan = a + U32(NAN_LANES)  # bit 15 of a lane: set exactly where it is NaN (a > 0x7F80)
    sign = ops.lop3(w, nan, U32(0x80008000), 0x20) >> U32(12)  # w & ~nan & 0x80008000: the sign bits kept
    return mag - U32(BF16X2_128) + sign


def e2m1x2_rto_codes(lo, hi, ops=PAIR_DEVICE):
    """e2m1x2_codes of the fp32 bits ``lo``, ``hi`` rounded to odd bf16 (bf16x2_rto), the sticky
    bits kept apart (bf16x2_rto_parts)."""
    kept, sticky = bf16x2_rto_parts(lo, hi, ops)
    return e2m1x2_codes(kept, ops, sticky=sticky)


def e2m1x2_scaled_codes(w, m2, ops=PAIR_DEVICE):
    """e2m1x2_codes of the bf16 pair ``w`` times ``m2`` (an E8M0 inverse scale's bf16 in both lanes)
    in one mul.rn.bf16x2, the NaN lanes those of the multiplier (m2 + NAN_LANES: one add per row,
    the same for every pair of it): a product is NaN only where the scale is (a NaN element makes
    its block's scale 255, and no E8M0 inverse scale is 0), and then in both lanes."""
    return e2m1x2_codes(ops.mul_bf16x2(w, m2), ops, m2 + ops.U32(NAN_LANES))


def e2m1x8_from_pairs(codes, ops=PAIR_DEVICE):
    """Four words of e2m1x2_codes (word j: elements 2j, 2j + 1) as one word, element k in bits
    4k..4k+3: two pairs' codes interleave into the low half of a word (elements 0-3 or 4-7),
    and one prmt joins the halves."""
    U32 = ops.U32
    halves = []
    for h in range(2):
        # (sums of disjoint bits: ptxas folds the codes' constants into one add and the shifts into lea)
        x = codes[2 * h] + (codes[2 * h + 1] << U32(8))  # bytes: e0, e2, e1, e3 (one code each)
        halves.append(x + (x >> U32(12)))  # low half: e0 | e1 << 4, e2 | e3 << 4
    return ops.prmt(halves[0], halves[1], 0x5410)


# --- stochastic rounding (docs/NUMERICS.md N7's stochastic rule; fp4.encode_sr, fp4.random_bytes) ---
# Written against ``ops`` too (RNG_DEVICE's, SR_PAIR_DEVICE's), so the tests run the Philox rounds, the
# word selection (a warp's lanes on a tensor axis) and the rounding rule on Python ints and int64
# tensors against mxq/formats/fp4.py and tests/oracle_fp4.py.
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


class RNG_DEVICE(DEVICE):
    """DEVICE's operations with the 64-bit word index, the 32-bit multiplies of Philox, the lane
    exchange and the branch of the random-word rules, on DSL values."""

    I64 = Int64

    @staticmethod
    def mulhi(a, b):
        return cute.arch.inline_ptx("mul.hi.u32 {$w0}, {$r0}, {$r1};", write_only_types=[Uint32],
                                    read_only_args=[Uint32(a), b])

    @staticmethod
    def mullo(a, b):
        return cute.arch.inline_ptx("mul.lo.u32 {$w0}, {$r0}, {$r1};", write_only_types=[Uint32],
                                    read_only_args=[Uint32(a), b])

    @staticmethod
    def swap_pair(v):
        """The value of the lane next to this one (lane ^ 1); every lane of the warp takes part."""
        return Uint32(cute.arch.shuffle_sync_bfly(Uint32(v), offset=1))

    @staticmethod
    @cute.jit
    def when(cond, n: cutlass.Constexpr, then, other):
        """``then()`` where ``cond`` holds, else ``other()`` (each a list of ``n`` Uint32): a
        branch, so only the side taken runs (uniform over a warp where ``cond`` is)."""
        box = cute.make_rmem_tensor(cute.make_layout(n), Uint32)
        if cond:
            v = then()
            for i in cutlass.range_constexpr(n):
                box[i] = Uint32(v[i])
        else:
            v = other()
            for i in cutlass.range_constexpr(n):
                box[i] = Uint32(v[i])
        return [box[i] for i in range(n)]


def philox(counter, key, ops=RNG_DEVICE):
    """Philox4x32-10 (Random123's, curand's): four uint32 counter words and two key words ->
    four uint32 words (fp4.philox's rounds)."""
    U32 = ops.U32
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = U32(k0 + U32(PHILOX_W[0])), U32(k1 + U32(PHILOX_W[1]))
        hi0, lo0 = ops.mulhi(PHILOX_M[0], c0), ops.mullo(PHILOX_M[0], c0)
        hi1, lo1 = ops.mulhi(PHILOX_M[1], c2), ops.mullo(PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


# The random words (fp4.random_bytes): word w = offset + row * groups + q of a direction's values is
# word w % 4 of Philox at counter (w // 4 low, high, direction, 0), key = seed. A thread's 8
# values of a row take two words; two threads' 16 values, four consecutive words, which are one
# Philox's where they start on a counter (w % 4 == 0) and straddle two otherwise (sr_words4).
# Rowwise, lanes 2l and 2l + 1 (columns 16l .. 16l + 15) each draw the four words of one row of a
# pair and swap halves (sr_row_pair_shared); the colwise copy's 16-row groups are shared by their
# two 8-row warps the same way, through shared memory (sr_col_group). One Philox per 16 values
# where the words start on counters (rowwise: offset % 4 == 0, NVFP4's N % 16 == 0 making every
# row start on one; colwise also M % 16 == 0), two otherwise.
def philox_at(ctr, direction: int, seed, ops=RNG_DEVICE):
    """Philox's four words at the 64-bit counter index ``ctr`` (>= 0), key ``seed`` (64 bits)."""
    U32, I64 = ops.U32, ops.I64
    m = I64(0xFFFFFFFF)
    return philox((U32(ctr & m), U32((ctr >> I64(32)) & m), U32(direction), U32(0)),
                  (U32(seed & m), U32((seed >> I64(32)) & m)), ops)


def word_index(row, q, groups, offset, ops=RNG_DEVICE):
    """w = offset + row * groups + q as a 64-bit value."""
    I64 = ops.I64
    return I64(offset) + I64(row) * I64(groups) + I64(q)


def sr_words4(w, direction: int, seed, ops=RNG_DEVICE, straddle: bool = False):
    """Words w .. w + 3 (w a 64-bit word index) of a direction's random words: Philox's four at w
    // 4 where w % 4 == 0; ``straddle``: any w, Philox at w // 4 and w // 4 + 1, words w % 4 ..
    w % 4 + 3 of their eight (three selects a word)."""
    U32, I32, I64 = ops.U32, ops.I32, ops.I64
    c = philox_at(w >> I64(2), direction, seed, ops)
    if not straddle:
        return list(c)
    seq = list(c) + list(philox_at((w >> I64(2)) + I64(1), direction, seed, ops))
    d = I32(w & I64(3))
    out = []
    for k in range(4):
        x = seq[k]
        for j in range(1, 4):
            x = U32(ops.select(d == I32(j), seq[k + j], x))
        out.append(x)
    return out


def sr_row_pair_shared(row, g, groups, seed, offset, ops=RNG_DEVICE, straddle: bool = False):
    """Rowwise words 2g, 2g + 1 of rows ``row`` and ``row + 1`` where lanes g and g ^ 1 are
    neighbours (columns 16l .. 16l + 15: the four words from w = offset + r * groups + 4 (g // 2)
    of each row r): the even lane draws them for ``row``, the odd one for ``row + 1``; each keeps
    its own two (0, 1 for an even lane, 2, 3 for an odd one) and gives the other two to its
    neighbour (sr_words4: ``straddle`` for any w, else w % 4 == 0)."""
    U32, I32 = ops.U32, ops.I32
    odd = (I32(g) & I32(1)) == I32(1)
    p = I32(ops.select(odd, I32(1), I32(0)))
    c = sr_words4(word_index(I32(row) + p, I32(g) * I32(2) - p * I32(2), groups, offset, ops), 0, seed, ops, straddle)
    mine = [U32(ops.select(odd, c[2 + h], c[h])) for h in range(2)]
    given = [ops.swap_pair(U32(ops.select(odd, c[h], c[2 + h]))) for h in range(2)]
    first = [U32(ops.select(odd, given[h], mine[h])) for h in range(2)]
    second = [U32(ops.select(odd, mine[h], given[h])) for h in range(2)]
    return first + second


def sr_col_aligned(groups, offset, ops=RNG_DEVICE):
    """The colwise copy's 16-row groups start on a counter (word 0 of a Philox) in every column:
    ``groups`` (M / 4 words a row of the transposed values) and ``offset`` multiples of 4, so
    (offset + col * groups + 4 k) % 4 == 0."""
    I64 = ops.I64
    return ((I64(offset) | I64(groups)) & I64(3)) == I64(0)


def sr_col_group(col, row, groups, seed, offset, ops=RNG_DEVICE, straddle: bool = False):
    """The colwise copy's (direction 1) four words from row ``row`` (a multiple of 16) of transposed
    row ``col`` (sr_words4: ``straddle`` unless sr_col_aligned): words 0, 1 the upper 8 rows'
    (row .. row + 7), 2, 3 the lower 8 rows'. The two 8-row warps of a 16-row group share them:
    each draws half the columns and gives the other its words through shared memory
    (PackedKernel.sr_col_stage)."""
    return sr_words4(word_index(col, ops.I32(row) >> ops.I32(2), groups, offset, ops), 1, seed, ops, straddle)


def sr_row_words(row, g, groups, seed, offset, ops=RNG_DEVICE):
    """Rowwise words 2g, 2g + 1 of rows ``row`` and ``row + 1`` (four words, row by row) of the
    lane owning columns 8g .. 8g + 7, its neighbour lane g ^ 1 in the same warp
    (sr_row_pair_shared): one Philox per 16 values where groups and offset are multiples of 4 (a
    warp-uniform branch), two otherwise. Every lane of the warp must call it (it exchanges
    words)."""
    I64 = ops.I64
    aligned = ((I64(offset) | I64(groups)) & I64(3)) == I64(0)
    return ops.when(aligned, 4, lambda: sr_row_pair_shared(row, g, groups, seed, offset, ops),
                    lambda: sr_row_pair_shared(row, g, groups, seed, offset, ops, straddle=True))


# N7's stochastic rule two values at a time, in the 16-bit lanes of a word (sm_90 and sm_100a
# alike). E2M1 is itself a binary float (two exponent bits, one mantissa bit, the codes below 1 its
# subnormals), so the fp16 bits of |y| * 2^-14 rounded toward zero, h (1.0 lands on fp16's
# smallest normal 2^-14, 0.5 on bit 9 of its subnormals), hold E2M1's spacing at bit 9 everywhere:
# h = floor(1024 |y|) below 2, 1024 + floor(512 |y|) below 4, 2048 + floor(256 |y|) below 8; so
# floor(h / 2) = floor(256 c) for the code line c = min(2|y|, |y| + 2, |y| / 2 + 4) whose integer
# part is the code and fraction f, and the code is (min(h, 6's bits) + 2 r) >> 9: bits 1 .. 8 of
# h are floor(256 f), and adding r there carries into bit 9 iff floor(256 f) + r >= 256. fp16 keeps
# the 8 bits below the kept one at every |y| < 8, and rounding toward zero never carries into
# them. |y| * 2^-14 is exact unless below fp32's normals (|y| < 2^-112), where every |y| has code
# 0 either way; a value past fp16's range becomes its largest finite (toward zero) or inf, both
# clamped to 6. The clamp is fp16's own min and max (against +-6 * 2^-14): they keep the sign,
# and take the other operand where one is NaN, so a NaN of either sign becomes +6, code 7.
F16_SIX = 0x0E000E00  # fp16 bits of 6 * 2^-14 in both lanes: the clamp, code 7
SR_SCALE = 2.0 ** -14  # |y| = 1 onto fp16's smallest normal


class SR_PAIR_DEVICE(PAIR_DEVICE):
    """PAIR_DEVICE's operations and those of the stochastic rule (fp32 pair -> fp16x2 rounded
    toward zero, fp16 lane min and max), on DSL values."""

    @staticmethod
    def mul_f32(v, c: float):
        """v * c (fp32, one explicit rounding: never contracted or reassociated)."""
        return mul_rn(v, Float32(c))

    @staticmethod
    def f16x2_rz(lo, hi):
        """The fp32 values ``lo``, ``hi`` as fp16 rounded toward zero, lo in the low lane."""
        return cute.arch.inline_ptx("cvt.rz.f16x2.f32 {$w0}, {$r1}, {$r0};", write_only_types=[Uint32],
                                    read_only_args=[Float32(lo), Float32(hi)])

    min_f16x2 = staticmethod(lambda a, b: PAIR_DEVICE._lanes("min.f16x2", a, b))
    max_f16x2 = staticmethod(lambda a, b: PAIR_DEVICE._lanes("max.f16x2", a, b))


def e2m1x2_sr_codes(h, rb, ops=SR_PAIR_DEVICE):
    """N7's stochastic rule on the fp16 pair ``h`` (bits of y * 2^-14 rounded toward zero) with
    the random bytes ``rb`` (one in bits 0 .. 7 of each lane): each lane's code in its low nibble,
    as e2m1x2_codes (the sign kept, NaN -> 0x7). The clamped lane is at most 0xE00 below its sign
    bit and 2 r at most 0x1FE, so the sum leaves bits 12 .. 15 alone and the lanes apart: its bits
    9 .. 11 are the code, bit 15 the sign."""
    U32 = ops.U32
    v = ops.max_f16x2(ops.min_f16x2(h, U32(F16_SIX)), U32(F16_SIX | 0x80008000))  # |y| <= 6; NaN -> +6
    s = v + (rb << U32(1))
    return ops.lop3(s >> U32(9), s >> U32(12), U32(0x000F000F), 0xA8)  # (code | sign << 3) per lane


def e2m1x8_sr(vals, rand, ops=SR_PAIR_DEVICE, prescaled: bool = False):
    """Eight scaled fp32 values (the tests' ops: their bits) as one word of E2M1 codes (e2m1x8's
    order) by the stochastic rule, value k taking byte k % 4 of ``rand[k // 4]`` (two random
    words, fp4.random_bytes' order): each pair times 2^-14 (exact, fp32; ``prescaled``: the
    values come so scaled, their multiplier taken times 2^-14 where that is exact,
    PackedKernel.sr_prescaled), converted to fp16 toward zero, then e2m1x2_sr_codes with its two
    bytes moved into the lanes by one prmt."""
    codes = []
    for j in range(4):
        lo, hi = vals[2 * j], vals[2 * j + 1]
        if not prescaled:
            lo, hi = ops.mul_f32(lo, SR_SCALE), ops.mul_f32(hi, SR_SCALE)
        rb = ops.prmt(rand[j // 2], ops.U32(0), 0x4140 if j % 2 == 0 else 0x4342)  # bytes 2j % 4, + 1 -> lanes
        codes.append(e2m1x2_sr_codes(ops.f16x2_rz(lo, hi), rb, ops))
    return e2m1x8_from_pairs(codes, ops)


    # --- NVFP4's random Hadamard transform (docs/NUMERICS.md, "hadamard=True") -------------------------
# A 16-row group x of a column is held by two 8-row threads (the same lane of warps w0, w0 + 1).
# With i = 8 * beta + a, Sylvester's H16[i, j'] = H8[a, j] * (-1)^(beta * b) for j' = 8 * b + j, so
# the thread of half b computes its own 8 outputs as
#     y[8b + j] = sum_a H8[a, j] * (s[a] * x0[a] + s[8 + a] * x1f[a]) / 4,   x1f = (-1)^b * x1
# (x0, x1: the group's rows 0-7 and 8-15): 8 additions, then the 3 stages of an 8-point Walsh-
# Hadamard butterfly, all in fp64 (rht_half). Every node is a signed subset sum of the bf16 inputs,
# kept as (value, negative) so that no stage negates anything: the sign reaches the last step,
# fma(value, +-1/4, +0), whose +0 addend makes an exact zero +0 (the oracle's and TE's). The sums
# are exact while a group's magnitudes span at most 2^41 (16 terms below 2^(e_max + 5), all
# multiples of 2^(e_min - 7): span + 12 bits of fp64's 53), and the one rounding is cvt.rn.bf16.f64;
# inf and NaN follow IEEE (a node holding +inf and -inf terms is NaN, as is the output that
# holds them). The rule runs on the host with HOST_F64 (tests/test_kernels_nvfp4.py).
class F64_DEVICE:
    """fp64 addition and subtraction, rounded once each (explicit .rn: never contracted)."""

    @staticmethod
    def add(a, b):
        return cute.arch.inline_ptx("add.rn.f64 {$w0}, {$r0}, {$r1};", write_only_types=[Float64],
                                    read_only_args=[a, b])

    @staticmethod
    def sub(a, b):
        return cute.arch.inline_ptx("sub.rn.f64 {$w0}, {$r0}, {$r1};", write_only_types=[Float64],
                                    read_only_args=[a, b])


class HOST_F64:
    """The same on Python floats (IEEE binary64, round to nearest even)."""

    @staticmethod
    def add(a, b):
        return a + b

    @staticmethod
    def sub(a, b):
        return a - b


def rht_half(x0, x1f, ops=F64_DEVICE, signs=None):
    """Half b of a 16-row group's transform (see above): ``x0`` rows 0-7, ``x1f`` rows 8-15 times
    (-1)^b, as fp64 values; returns the 8 outputs j as (value, negative): y[8b + j] is
    (-1 if negative else 1) * value / 4. ``signs``: the 16 signs s (Format.hadamard_signs), None
    for TE's."""
    s = HADAMARD_SIGNS if signs is None else signs
    v = [(ops.add(x0[a], x1f[a]) if s[a] == s[8 + a] else ops.sub(x0[a], x1f[a]), s[a] < 0) for a in range(8)]
    h = 1
    while h < 8:
        for a in range(8):
            if a & h == 0:
                (p, pn), (q, qn) = v[a], v[a + h]
                same = pn == qn  # P = (-1)^pn p and Q: P + Q = (-1)^pn (p + q or p - q), P - Q likewise
                v[a] = (ops.add(p, q) if same else ops.sub(p, q), pn)
                v[a + h] = (ops.sub(p, q) if same else ops.add(p, q), pn)
        h *= 2
    return v


def bf16x2_to_f64(w):
    """The two halves of a bf16x2 word as fp64 (low, high; exact: one F2F.F64.BF16 each, reading
    the half in place)."""
    return cute.arch.inline_ptx("{ .reg .b16 l, h; mov.b32 {l, h}, {$r0}; cvt.f64.bf16 {$w0}, l; "
                                "cvt.f64.bf16 {$w1}, h; }", write_only_types=[Float64, Float64], read_only_args=[w])


_QUARTER = {False: "0d3FD0000000000000", True: "0dBFD0000000000000"}  # +-1/4


def rht_bf16x2(lo, hi):
    """Two of rht_half's outputs (value, negative) as one bf16x2 word: each fma(value, +-1/4, +0)
    (exact: a power of two, the +0 making a zero +0) rounded once to bf16 (cvt.rn.bf16.f64)."""
    return cute.arch.inline_ptx(
        "{ .reg .f64 a, b; .reg .b16 l, h; "
        f"fma.rn.f64 a, {{$r0}}, {_QUARTER[lo[1]]}, 0d0000000000000000; "
        f"fma.rn.f64 b, {{$r1}}, {_QUARTER[hi[1]]}, 0d0000000000000000; "
        "cvt.rn.bf16.f64 l, a; cvt.rn.bf16.f64 h, b; mov.b32 {$w0}, {l, h}; }",
        write_only_types=[Uint32], read_only_args=[lo[0], hi[0]])


def prmt(a, b, selector: int):
    """The bytes of words ``a`` (bytes 0-3) and ``b`` (4-7) that ``selector``'s nibbles pick."""
    return cute.arch.inline_ptx(f"prmt.b32 {{$w0}}, {{$r0}}, {{$r1}}, {selector:#x};", write_only_types=[Uint32],
                                read_only_args=[a, b])


def prmt_var(a, b, selector):
    """prmt with a selector held in a register (a choice made at run time, e.g. by a lane's bit)."""
    return cute.arch.inline_ptx("prmt.b32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Uint32],
                                read_only_args=[Uint32(a), Uint32(b), Uint32(selector)])


# transpose4x4's prmt selectors: interleave two rows' bytes 0-1 and 2-3 (a0 b0 a1 b1, a2 b2 a3 b3),
# then take two such words' low and high halves (a0 b0 c0 d0, a1 b1 c1 d1)
TRANSPOSE_INTERLEAVE = (0x5140, 0x7362)
TRANSPOSE_HALVES = (0x5410, 0x7632)


def column_pairs(rows, c: int, ops=PAIR_DEVICE):
    """Column ``c`` of rows of packed 16-bit words (``rows[i][j]``: row i's columns 2j, 2j + 1) as
    words of two rows' values, e2m1x8_bf16's order: word j holds rows 2j (low lane) and 2j + 1
    (high lane), each the low lane of its word c // 2 for even c, the high lane for odd c (one
    prmt per word)."""
    sel = TRANSPOSE_HALVES[c % 2]
    return [ops.prmt(rows[2 * j][c // 2], rows[2 * j + 1][c // 2], sel) for j in range(len(rows) // 2)]


def transpose4x4(a, b, c, d):
    """Four words of four bytes (rows a-d) as the four words of their columns: byte i of word j
    of the result is byte j of row i (eight prmt)."""
    ab = [prmt(a, b, s) for s in TRANSPOSE_INTERLEAVE]
    cd = [prmt(c, d, s) for s in TRANSPOSE_INTERLEAVE]
    return [prmt(ab[h], cd[h], s) for h in range(2) for s in TRANSPOSE_HALVES]


def transpose8x8(rows):
    """An 8x8 byte block held as 8 rows of two words (``rows[i]``: bytes 0-3, 4-7 of row i) as
    its 8 columns, each two words (rows 0-3, rows 4-7): four 4x4 transposes."""
    cols = [[None, None] for _ in range(8)]
    for half in range(2):  # columns 4 * half .. 4 * half + 3
        for rg in range(2):  # rows 4 * rg .. 4 * rg + 3
            for c, w in enumerate(transpose4x4(*[rows[4 * rg + i][half] for i in range(4)])):
                cols[4 * half + c][rg] = w
    return cols


def pack64(lo, hi):
    """Two words as one 64-bit value (lo in the low half)."""
    return (Uint64(hi) << Uint64(32)) | Uint64(lo)


def store_global_words(addr, w):
    """One, two or four words at global byte address ``addr`` (aligned to their size) as one store."""
    regs = ", ".join(f"{{$r{j + 1}}}" for j in range(len(w)))
    vec = {1: "", 2: ".v2", 4: ".v4"}[len(w)]
    cute.arch.inline_ptx(f"st.global{vec}.b32 [{{$r0}}], {regs if len(w) == 1 else '{' + regs + '}'};",
                         read_only_args=[addr, *w])


def store_global_u16(addr, h):
    """A 16-bit store at global address ``addr`` (2-byte aligned)."""
    cute.arch.inline_ptx("st.global.b16 [{$r0}], {$r1};", read_only_args=[addr, Uint16(h)])


def store_shared_u16(addr, h):
    """A 16-bit store at shared-memory address ``addr`` (32 bits, 2-byte aligned)."""
    cute.arch.inline_ptx("st.shared.b16 [{$r0}], {$r1};", read_only_args=[Int32(addr), Uint16(h)])


def store_global_u8(addr, b):
    """One byte (the low byte of a word) at global byte address ``addr``."""
    cute.arch.inline_ptx("st.global.b8 [{$r0}], {$r1};", read_only_args=[addr, Uint16(b & Uint32(0xFF))])


def rcp_one_plus_ex2(z):
    """1 / (1 + 2^z) with the approximate ex2 and rcp (a few ulp relative): the core of tanh_act,
    sigmoid_act and half_tanh_ex2_act. 2^z overflows to inf for z > 128, giving exactly 0."""
    e = cute.arch.inline_ptx("ex2.approx.ftz.f32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[z])
    return cute.arch.inline_ptx("rcp.approx.ftz.f32 {$w0}, {$r0};", write_only_types=[Float32],
                                read_only_args=[add_rn(e, Float32(1.0))])


def tanh_act(y):
    """tanh(y) = sign(y) * (1 - 2 / (e^(2|y|) + 1)), accurate to ~2^-24 absolute: the large-|y|
    branch of the precise tanh, used for every y by the built-in act/dact (which only use t as
    0.5 + 0.5*t or 1 - t*t). ex2 overflows to inf for |y| > ~44, giving exactly 1; NaN stays NaN."""
    r = rcp_one_plus_ex2(mul_rn(cute.math.abs(y), Float32(2.885390081777927)))
    t = Float32(cute.math.fma(r, Float32(-2.0), Float32(1.0)))
    return (t.bitcast(Uint32) | (y.bitcast(Uint32) & Uint32(0x80000000))).bitcast(Float32)


def sigmoid_act(x):
    """1 / (1 + e^-x) for the built-in formulas: 2^(-x log2 e) and the reciprocal both
    approximate (ex2.approx, rcp.approx: a few ulp, inside the transcendental class); e^-x
    overflows to inf for x < ~-88, giving exactly 0; NaN stays NaN."""
    return rcp_one_plus_ex2(mul_rn(x, Float32(-1.4426950408889634)))


def half_tanh_ex2_act(z):
    """0.5 + 0.5 * tanh(y) given z = -2 y log2(e) (codegen.half_tanh_as_sigmoid): it equals
    sigmoid(2y) = 1 / (1 + 2^z) (ex2.approx, rcp.approx: a few ulp relative), which is then put on
    the grid the formula's own roundings give, t = 1 - 2s rounded once and 0.5 - 0.5 t (exact):
    for y < 0, 0.5 + 0.5 * t cancels, and the reference's values are multiples of 2^-25 that a
    more accurate sigmoid would miss often enough to leave the transcendental class (on the
    H200 up to 14 of 67584 FP8 bytes differed on a gelu + bias test). For y >= 0 both steps
    are exact. 2^z overflows to inf for z > 128, giving exactly 0; z = -inf gives exactly 1 (and
    ex2.approx.ftz flushes 2^z below 2^-126 to 0); NaN stays NaN. 5 instructions, where tanh_act
    and the FMA take 7 and a multiply."""
    t = Float32(cute.math.fma(rcp_one_plus_ex2(z), Float32(-2.0), Float32(1.0)))
    return Float32(cute.math.fma(t, Float32(-0.5), Float32(0.5)))


def warp_max(x):
    """NaN-propagating max over the 32 lanes of a warp (every lane gets the result)."""
    for k in range(5):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1 << k), nan=True)
    return x


def amax_atomic(t, v, index: int = 0):
    """Combine ``v`` (>= 0, or NaN) into the amax slot t[0] as red.max.s32 on its bits (the
    order of non-negative floats, NaN above inf), skipped when the slot already holds at least
    ``v``: the slot only grows within a launch, so a stale read costs at most the atomic it would
    have issued anyway, and most warps of a large tensor find the maximum already there (one
    load instead of a read-modify-write on one address every warp contends for). ``index``: the
    slot's entry (1: NVFP4's colwise_amax beside the amax)."""
    cute.arch.inline_ptx(
        "{ .reg .s32 cur; .reg .pred p; ld.relaxed.gpu.global.s32 cur, [{$r0}]; "
        "setp.gt.s32 p, {$r1}, cur; @p red.relaxed.gpu.global.max.s32 [{$r0}], {$r1}; }",
        read_only_args=[t.iterator.toint() if index == 0 else t.iterator.toint() + Int64(4 * index),
                        Float32(v).bitcast(Int32)])


ABS32 = 0x7FFFFFFF  # the magnitude bits of an fp32


def magnitude_bits(b, ops=DEVICE):
    """The bits of |v| from the bits ``b`` of an fp32 v: as unsigned integers they order like the
    magnitudes, every NaN above inf (warp_amax; the host form is checked in tests/test_kernels.py)."""
    return b & ops.U32(ABS32)


def warp_amax(v):
    """max |v| over the 32 lanes of a warp, NaN when any lane's v is NaN (every lane gets the
    result): one redux.sync (sm_80+) over magnitude_bits instead of warp_max's five
    shuffle-and-max steps. Which NaN it returns is not kept (no scale rule depends on the payload:
    tests/test_kernels.py::test_scale_rules_ignore_the_nan_payload)."""
    return Uint32(cute.arch.warp_redux_sync(magnitude_bits(v.bitcast(Uint32)), "umax")).bitcast(Float32)


# --- operand layouts (mxq/operands.py) --------------------------------------------------------------
def _static_stride(t, mode: int):
    s = t.layout.stride[mode]
    return s if isinstance(s, int) else None


def broadcast_rows(t) -> bool:
    """Every row of [M, N] operand ``t`` is the same row (a row operand, or a scalar)."""
    return _static_stride(t, 0) == 0


def broadcast_cols(t) -> bool:
    """Every column of ``t`` is the same column (a col operand, or a scalar): no vector loads."""
    return _static_stride(t, 1) == 0


# --- scale addressing and stores --------------------------------------------------------------
def swizzle_offset(i, j, blocks):
    """Byte offset of scale (row i, block j) in the cuBLAS 128x4 layout with ``blocks`` per row
    (plain integer arithmetic: also callable on Python ints, see mxq/layouts.py)."""
    t = (blocks + 3) // 4
    return ((i // 128) * t + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4


def scale_offset(swizzled: bool, i, j, blocks):
    """Byte offset of scale (row i, block j) of a [rows, blocks] scale matrix in either layout."""
    return swizzle_offset(i, j, blocks) if swizzled else i * blocks + j


def store_kept_u8(t, offset, value):
    """t[offset] = value (a scale byte) with an L2 evict_last policy: the byte waits in L2 for
    the rest of its 32-byte sector (Tuning.row_scale_l2_keep says why)."""
    keep = cute.arch.inline_ptx("createpolicy.fractional.L2::evict_last.b64 {$w0}, 1.0;", write_only_types=[Int64])
    cute.arch.inline_ptx("st.global.L2::cache_hint.b8 [{$r0}], {$r1}, {$r2};",
                         read_only_args=[t.iterator.toint() + Int64(offset), Uint16(value), keep])


def store_row_scale(t, offset, value, keep_in_l2: bool):
    """A row-scale byte: L2-kept (packed and vectorised kernels) or a plain store."""
    if keep_in_l2:
        store_kept_u8(t, offset, value)
    else:
        t[offset] = Uint8(value)


def thread_tile(t, shape, tile_row, row0, col_tile, grouped: bool, step: int = 1):
    """A thread's ``shape`` tile of [M, N] tensor ``t``: tile (tile_row, col_tile), or for a
    grouped call the tile whose first row is ``row0`` (any row: blocks start at groups); with
    ``step`` > 1, rows row0, row0 + step, ... (the packed kernel's unaligned rows)."""
    if step != 1:
        at = cute.domain_offset((row0, col_tile * shape[1]), t)
        return cute.make_tensor(at.iterator, cute.make_layout(
            shape, stride=(at.layout.stride[0] * step, at.layout.stride[1])))
    if grouped:
        return cute.local_tile(cute.domain_offset((row0, 0), t), shape, (0, col_tile))
    return cute.local_tile(t, shape, (tile_row, col_tile))


# --- packed 16-bit words (bf16x2 / f16x2) ------------------------------------------------------
# A word holds two adjacent columns' values; abs is one AND and the amax one max.NaN per two
# values, exact because max only selects. Values widen to fp32 only for the scale multiply.
ABS_BITS = 0x7FFF7FFF  # the magnitude bits of two packed 16-bit floats (|w| is w & ABS_BITS)


def pk_max(a, b, is_bf16: bool, nan: bool = True):
    """Max of each half (sm_80+): NaN-propagating, or with ``nan`` False NaN-dropping (a NaN
    half gives the other operand's half, as fmaxf does)."""
    kind = "bf16x2" if is_bf16 else "f16x2"
    op = "max.NaN" if nan else "max"
    return cute.arch.inline_ptx(f"{op}.{kind} {{$w0}}, {{$r0}}, {{$r1}};", write_only_types=[Uint32],
                                read_only_args=[a, b])


def pk_unpack(w, is_bf16: bool):
    """(low, high) halves of a word widened exactly to fp32."""
    if is_bf16:
        return (w << Uint32(16)).bitcast(Float32), (w & Uint32(0xFFFF0000)).bitcast(Float32)
    return cute.arch.inline_ptx("{ .reg .b16 l, h; mov.b32 {l, h}, {$r0}; cvt.f32.f16 {$w0}, l; cvt.f32.f16 {$w1}, h; }",
                                write_only_types=[Float32, Float32], read_only_args=[w])


def pk_round(lo, hi, is_bf16: bool):
    """Two fp32 values rounded (RNE) into one word: NUMERICS step 5 for two values at once."""
    kind = "bf16x2" if is_bf16 else "f16x2"
    return cute.arch.inline_ptx(f"cvt.rn.{kind}.f32 {{$w0}}, {{$r0}}, {{$r1}};", write_only_types=[Uint32],
                                read_only_args=[hi, lo])


def pk_amax(w, is_bf16: bool, nan: bool = True):
    """fp32 max of a word's two halves (both already >= 0 or NaN); with ``nan`` False NaN-dropping
    and at least 0 (a word of two NaN halves gives 0)."""
    lo, hi = pk_unpack(w, is_bf16)
    if nan:
        return cute.arch.fmax(lo, hi, nan=True)
    return cute.arch.fmax(cute.arch.fmax(lo, hi), Float32(0.0))


def pk_max_shuffled(keep, give, offset: int, upper, is_bf16: bool, nan: bool = True):
    """One butterfly stage of a reduce-scatter of packed maxima: the lane with ``upper`` set
    keeps ``give`` and sends ``keep`` (and the other way round), then takes the max with what
    its partner sent (pk_max's ``nan``)."""
    mine = cutlass.select_(upper, give, keep)
    theirs = cutlass.select_(upper, keep, give)
    return pk_max(mine, Uint32(cute.arch.shuffle_sync_bfly(Int32(theirs), offset=offset)), is_bf16, nan)


def pk_max_bfly(w, offset: int, is_bf16: bool, nan: bool = True):
    """One butterfly stage of an all-reduce of packed maxima (pk_max's ``nan``)."""
    return pk_max(w, Uint32(cute.arch.shuffle_sync_bfly(Int32(w), offset=offset)), is_bf16, nan)


def widen(frag, k):
    """Value k of a loaded register fragment as fp32. bf16 is taken from its 32-bit word (a shift
    or an AND); the element-wise conversion costs two instructions for the upper half."""
    if frag.element_type is cutlass.BFloat16 and _static_stride(frag, 0) != 0:
        w = cute.recast_tensor(frag, Uint32)[k // 2]
        return (w << Uint32(16)).bitcast(Float32) if k % 2 == 0 else (w & Uint32(0xFFFF0000)).bitcast(Float32)
    return frag[k].to(Float32)
