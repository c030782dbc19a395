"""MXFP4 on the kernels: rowwise 1x32 blocks of E2M1 elements two per byte (mxq/kernels/codec.py
encode8, device.e2m1_code / e2m1x8) on the aligned packed (bf16/fp16) and vectorised (fp32)
kernels; the transposed colwise copy: tests/test_kernels_mxfp4_col.py; other shapes run the
reference (limits.fp4_unserved). NVFP4's kernels: tests/test_kernels_nvfp4.py.

CPU: the integer E2M1 encode sm_90 runs (device.e2m1_code, the very expression, on Python ints
and torch tensors) against mxq/formats/fp4.encode_rn at every threshold and on sampled fp32
patterns, and against tests/oracle_fp4.py; what the kernels serve; the PTX of each variant for
sm_90 (no e2m1 cvt) and sm_100a (cvt.rn.satfinite.e2m1x2.f32). GPU (marked gpu): every dtype,
scale mode, layout and shape class against the torch reference byte for byte, fused ops, planted
NaN/inf/subnormal/saturating values, and a small case against the oracle.
"""

import math
import re
import struct

import pytest
import torch

import mxq
from mxq.formats import fp4
from mxq.frontend import codegen
from mxq.kernels import config as kconfig
from mxq.kernels import device as dev
from mxq.kernels.vectorized import VectorizedKernel
from mxq.runtime import compiler, limits
from mxq.runtime.call import Call
from mxq.testing import planted, poisoned, same_bytes

from . import oracle_fp4 as oracle
from .checks import check_exact as _check

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def ident(x):
    return x


def _fmt_ids(case):
    return "-".join([case[0]] + [f"{k}={v}" for k, v in case[1].items()])


def scaled_shift(x, b, s: float = 1.5):
    return x * s + b


# -- the integer E2M1 encode (sm_90) ---------------------------------------------------------------
class TORCH:
    """device.e2m1_code's operations on int64 tensors holding uint32 values."""

    @staticmethod
    def U32(v):
        return v & 0xFFFFFFFF if isinstance(v, torch.Tensor) else torch.tensor(int(v) & 0xFFFFFFFF)

    min = staticmethod(torch.minimum)
    max = staticmethod(torch.maximum)

    @staticmethod
    def select(cond, a, b):
        return torch.where(cond, a, b)


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def _reference_codes(bits: torch.Tensor) -> torch.Tensor:
    """fp4.encode_rn of the fp32 values with these bit patterns (int64 holding uint32)."""
    return fp4.encode_rn(bits.to(torch.int32).view(torch.float32)).to(torch.int64)


def bits_around(pts) -> list:
    """The fp32 bits of each of ``pts`` (rounded to nearest) and its two neighbours each way, both
    signs, and the specials (infs, NaNs of either sign and payload)."""
    bits = set()
    for p in pts:
        b = _bits(p)
        for d in (-2, -1, 0, 1, 2):
            if 0 <= b + d <= 0x7F800000:
                bits.update({b + d, (b + d) | 0x80000000})
    bits.update({0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF})
    return sorted(bits)


def _edges() -> list:
    """Every threshold of the E2M1 grid, the grid values, their fp32 neighbours, and specials, both signs."""
    return bits_around([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0,
                        1e30, 2.0 ** -149, 2.0 ** -126, 0.125, 0.9999999])


def test_integer_encode_at_every_threshold():
    edges = _edges()
    want = _reference_codes(torch.tensor(edges, dtype=torch.int64))
    for b, w in zip(edges, want.tolist()):
        assert dev.e2m1_code(b, ops=dev.HOST) == w, hex(b)
        assert w == oracle.e2m1(_f32(b)), hex(b)  # (the reference itself, against the oracle)


def test_integer_encode_on_sampled_patterns():
    """2^21 uniformly drawn fp32 bit patterns plus 2^20 drawn from |y| < 8 (every rounding case
    many times), the same expression on int64 tensors: equal to fp4.encode_rn."""
    g = torch.Generator().manual_seed(41)
    wide = torch.randint(0, 2 ** 32, (2 ** 21,), generator=g, dtype=torch.int64)
    near = torch.randint(0, _bits(8.0), (2 ** 20,), generator=g, dtype=torch.int64)
    near = near | (torch.randint(0, 2, near.shape, generator=g, dtype=torch.int64) << 31)
    for bits in (wide, near):
        got = dev.e2m1_code(bits, ops=TORCH)
        assert torch.equal(got, _reference_codes(bits))


def test_integer_encode_against_the_oracle():
    g = torch.Generator().manual_seed(7)
    bits = torch.randint(0, _bits(16.0), (3000,), generator=g, dtype=torch.int64).tolist()
    for b in bits:
        assert dev.e2m1_code(b, ops=dev.HOST) == oracle.e2m1(_f32(b)), hex(b)
        assert dev.e2m1_code(b | 0x80000000, ops=dev.HOST) == oracle.e2m1(_f32(b | 0x80000000)), hex(b)


# -- the same rule two at a time in 16-bit lanes (device.e2m1x2_codes, sm_90) ---------------------
def _bf16_exact(h: int):
    """A finite bf16's value as (integer, power of two), exactly."""
    e, m = (h >> 7) & 0xFF, h & 0x7F
    mant, exp = (m, -133) if e == 0 else (m | 0x80, e - 134)
    return (-mant if h & 0x8000 else mant), exp


def _bf16_rn(num: int, exp: int) -> int:
    """The bf16 bits of num * 2^exp (num >= 0) rounded to nearest even (finite results only)."""
    if num == 0:
        return 0
    top = num.bit_length() + exp - 1  # the leading bit's weight
    q = max(top - 7, -133)  # the weight of the last kept bit
    shift = q - exp
    if shift > 0:
        kept, rest, half = num >> shift, num & ((1 << shift) - 1), 1 << (shift - 1)
        kept += 1 if rest > half or (rest == half and kept & 1) else 0
    else:
        kept = num << -shift
    if kept >> 8:  # a carry into the next binade
        kept, q = kept >> 1, q + 1
    e = q + 134 if kept >> 7 else 0
    if e >= 0xFF:
        return 0x7F80  # (overflow: inf)
    return (e << 7) | (kept & 0x7F) if e else kept


class PAIRS:
    """device.PAIR_DEVICE's lane operations on Python ints, written from PTX's definitions
    (per-lane unsigned min; bf16 fma, a * b + c exactly, rounded once to nearest even, and
    multiply, a * b + (-0) likewise; NaN results the canonical NaN)."""

    U32 = staticmethod(dev.HOST.U32)

    @staticmethod
    def _lanes(f, *words):
        return sum(f(*(w >> k & 0xFFFF for w in words)) << k for k in (0, 16))

    @staticmethod
    def min16x2(a, b):
        return PAIRS._lanes(min, a, b)

    @staticmethod
    def _fma(x, y, z):
        """One lane of fma.rn.bf16x2."""
        if any(v & 0x7FFF > 0x7F80 for v in (x, y, z)):
            return 0x7FFF  # (the canonical NaN)
        psign, zsign = (x ^ y) & 0x8000, z & 0x8000
        if x & 0x7FFF == 0x7F80 or y & 0x7FFF == 0x7F80:  # an infinite product
            if not (x & 0x7FFF and y & 0x7FFF) or (z & 0x7FFF == 0x7F80 and zsign != psign):
                return 0x7FFF  # (inf * 0, inf - inf)
            return 0x7F80 | psign
        if z & 0x7FFF == 0x7F80:
            return z
        (nx, ex), (ny, ey), (nz, ez) = _bf16_exact(x), _bf16_exact(y), _bf16_exact(z)
        exp = min(ex + ey, ez)
        num = ((nx * ny) << (ex + ey - exp)) + (nz << (ez - exp))
        if num == 0:  # (an exact zero: -0 only from -0 + -0)
            return 0x8000 if psign and zsign and not (nx * ny) and not nz else 0
        return _bf16_rn(abs(num), exp) | (0x8000 if num < 0 else 0)

    @staticmethod
    def fma_bf16x2(a, b, c):
        return PAIRS._lanes(PAIRS._fma, a, b, c)

    @staticmethod
    def mul_bf16x2(a, b):
        return PAIRS._lanes(PAIRS._fma, a, b, 0x80008000)

    @staticmethod
    def lop3(a, b, c, lut: int):
        """Bit i of the result is bit (a_i << 2 | b_i << 1 | c_i) of the look-up table."""
        return sum(((lut >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i for i in range(32))

    @staticmethod
    def prmt(a, b, selector: int):
        src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
        return sum(((src >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


class PAIRS_SIGNED_NAN(PAIRS):
    """PAIRS with a NaN result signed as the product's operands say (PTX leaves a NaN result's
    sign open): the encode must not depend on it."""

    @staticmethod
    def _signed(r, a, b):
        for k in (0, 16):
            if (r >> k) & 0x7FFF > 0x7F80:
                r |= ((a ^ b) >> k & 0x8000) << k
        return r

    @staticmethod
    def mul_bf16x2(a, b):
        return PAIRS_SIGNED_NAN._signed(PAIRS.mul_bf16x2(a, b), a, b)

    @staticmethod
    def fma_bf16x2(a, b, c):
        return PAIRS_SIGNED_NAN._signed(PAIRS.fma_bf16x2(a, b, c), a, b)


def _bf16_code(h: int) -> int:
    """The oracle's code of a bf16 (bits)."""
    return oracle.e2m1(_f32(h << 16))


def test_pair_encode_on_every_bf16():
    """e2m1x2_codes on all 65,536 bf16 patterns in each lane (paired with a shuffled copy), on
    the PTX lane operations written out by hand: each lane's code is the oracle's; the lanes do
    not disturb each other."""
    g = torch.Generator().manual_seed(5)
    other = torch.randperm(1 << 16, generator=g).tolist()
    for lo in range(1 << 16):
        hi = other[lo]
        codes = dev.e2m1x2_codes(lo | (hi << 16), ops=PAIRS)
        assert codes & 0xFFF0FFF0 == 0, hex(lo)
        assert (codes & 0xF, codes >> 16) == (_bf16_code(lo), _bf16_code(hi)), (hex(lo), hex(hi))


def test_round_to_odd_pairs_encode_as_fp32():
    """bf16x2_rto then e2m1x2_codes gives fp32's codes (rounding to odd keeps what E2M1's
    rounding needs): every threshold edge and 2^14 sampled patterns, against the oracle."""
    g = torch.Generator().manual_seed(11)
    near = torch.randint(0, _bits(8.0), (1 << 13,), generator=g, dtype=torch.int64)
    near = (near | (torch.randint(0, 2, near.shape, generator=g, dtype=torch.int64) << 31)).tolist()
    wide = torch.randint(0, 2 ** 32, (1 << 13,), generator=g, dtype=torch.int64).tolist()
    bits = _edges() + near + wide
    for lo, hi in zip(bits, bits[1:] + bits[:1]):
        want = (oracle.e2m1(_f32(lo)), oracle.e2m1(_f32(hi)))
        codes = dev.e2m1x2_codes(dev.bf16x2_rto(lo, hi, ops=PAIRS), ops=PAIRS)
        assert (codes & 0xF, codes >> 16) == want, (hex(lo), hex(hi))
        codes = dev.e2m1x2_rto_codes(lo, hi, ops=PAIRS)  # (the kernels' form: the sticky bits apart)
        assert (codes & 0xF, codes >> 16) == want, (hex(lo), hex(hi))


def test_pairs_pack_in_element_order():
    """e2m1x8_from_pairs puts element k at bits 4k (element 2j in the low nibble of byte j)."""
    for trial in range(64):
        c = [(trial * 7 + 3 * k) % 16 for k in range(8)]
        pairs = [c[2 * j] | (c[2 * j + 1] << 16) for j in range(4)]
        want = sum(c[k] << (4 * k) for k in range(8))
        assert dev.e2m1x8_from_pairs(pairs, ops=PAIRS) == want


def test_bf16_pairs_scaled_in_bf16_encode_as_fp32():
    """MXFP4 on bf16 (codec.pow2_bf16_pairs): a bf16 times every E8M0 inverse scale, multiplied
    in bf16 (the multiplier's high half in both lanes), encodes as the fp32 product does, with
    the NaN lanes taken from the multiplier (device.e2m1x2_scaled_codes). A NaN element only
    meets scale 255 (its block's), so other scales pair with non-NaN elements."""
    g = torch.Generator().manual_seed(13)
    xs = torch.randint(0, 1 << 16, (96,), generator=g).tolist() + [0x3F80, 0xBF80, 0x7FC0, 0xFFC0, 0x7F80, 0x0001]
    for e in range(256):
        m = dev.inv_scale_bits(e, ops=dev.HOST) & 0xFFFFFFFF
        assert m & 0xFFFF == 0
        m2 = PAIRS.prmt(m, m, 0x3232)
        for lo, hi in zip(xs, xs[::-1]):
            if e != 255 and any(h & 0x7FFF > 0x7F80 for h in (lo, hi)):
                continue
            want = [oracle.e2m1(_f32(h << 16) * _f32(m)) if not math.isnan(_f32(m)) else 7 for h in (lo, hi)]
            for ops in (PAIRS, PAIRS_SIGNED_NAN):
                codes = dev.e2m1x2_scaled_codes(lo | (hi << 16), m2, ops=ops)
                assert [codes & 0xF, codes >> 16] == want, (e, hex(lo), hex(hi), ops.__name__)


# -- what is served ------------------------------------------------------------------------------
def _unserved(op, x, call=None):
    return limits.unserved(op.spec, op.epilogue, x, lambda: None, call)


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("opts", [dict(), dict(scale_mode="rceil", scale_layout="swizzled"), dict(act="gelu"),
                                  dict(dact="gelu", dbias=True, amax=True)])
def test_rowwise_mxfp4_is_served(dtype, opts):
    op = mxq.fused_quant(format="mxfp4", **opts)(ident)
    for n in (16, 48, 200, 4096):
        assert _unserved(op, torch.zeros(3, n, dtype=dtype)) is None


@pytest.mark.parametrize("fmt, opts, x, why", [
    ("mxfp4", dict(colwise=True), torch.zeros(4, 64), "colwise"),
    ("mxfp4", dict(), torch.zeros(4, 6, dtype=torch.bfloat16), "N % 8"),
    ("mxfp4", dict(), torch.zeros(4, 66, dtype=torch.bfloat16), "N % 8"),
    ("mxfp4", dict(), torch.zeros(4 * 64 + 4, dtype=torch.bfloat16)[4:].view(4, 64), "aligned"),
    ("mxfp4", dict(), torch.zeros(4, 68)[:, :64], "aligned"),
    ("nvfp4", dict(), torch.zeros(4, 40, dtype=torch.bfloat16), "N % 16"),
    ("nvfp4", dict(colwise=True), torch.zeros(4, 64, dtype=torch.bfloat16), "M % 8"),
    ("nvfp4", dict(colwise=True), torch.zeros(12, 64), "M % 8"),  # (fp32 too: the vectorised kernel's 8-row threads)
    ("nvfp4", dict(block_2d=True), torch.zeros(4, 40), "N % 16"),
    ("nvfp4", dict(stochastic_rounding=True), torch.zeros(4, 24), "N % 16"),
])
def test_unserved_names_what_has_no_kernel(fmt, opts, x, why):
    op = mxq.fused_quant(format=fmt, **opts)(ident)
    reason = _unserved(op, x)
    assert reason is not None and fmt in reason and why in reason and "reference" in reason


def test_grouped_rowwise_is_served_and_the_rest_falls_back():
    """Grouped calls of either format run the grouped kernels (NVFP4's amax per group), the
    colwise copy too, NVFP4's global_amax too (one value or one per group); misaligned out=
    data runs the reference."""
    from mxq.formats.fp4 import CallArgs

    x = torch.zeros(8, 64, dtype=torch.bfloat16)
    offs = torch.tensor([8])
    for fmt in ("mxfp4", "nvfp4"):
        row = mxq.fused_quant(format=fmt)(ident)
        assert _unserved(row, x, Call([x], [], group_offsets=offs)) is None
        both = mxq.fused_quant(format=fmt, colwise=True)(ident)
        assert _unserved(both, x, Call([x], [], group_offsets=offs)) is None
    nv = mxq.fused_quant(format="nvfp4")(ident)
    given = Call([x], [], group_offsets=offs)._replace(fp4=CallArgs(1.0, None, None))
    assert _unserved(nv, x, given) is None
    per_group = Call([x], [], group_offsets=offs)._replace(fp4=CallArgs(torch.ones(1), None, None))
    assert _unserved(nv, x, per_group) is None
    x32 = x.float()  # (grouped from fp32: the vectorised kernel, either format, the colwise copy too)
    for fmt in ("mxfp4", "nvfp4"):
        for opts in (dict(), dict(colwise=True)):
            o = mxq.fused_quant(format=fmt, **opts)(ident)
            assert _unserved(o, x32, Call([x32], [], group_offsets=offs)) is None
    op = mxq.fused_quant(format="mxfp4")(ident)
    out = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu")
    assert _unserved(op, x, Call([x], [], out=out)) is None
    buf = torch.zeros(8 * 32 + 4, dtype=torch.uint8)
    out.rowwise_data = buf[4:].view(8, 32)  # data not 16-byte aligned
    assert "aligned" in _unserved(op, x, Call([x], [], out=out))


def test_grouped_row_scale_offsets_count_the_formats_blocks():
    """The vectorised kernel's (fp32 inputs) grouped rowwise scale byte of row r and a lane's
    columns c0: compact grouped scales are the ungrouped ones, block c0 // B of B columns (16 for
    NVFP4, 32 for MXFP4/MXFP8): a hard-coded 32 wrote NVFP4's scales into half the blocks on the
    H200 (the GPU counterpart: test_grouped_rowwise_matches_reference)."""
    import types

    from mxq.kernels.vectorized import VectorizedKernel

    for fmt, block in (("nvfp4", 16), ("mxfp4", 32), ("mxfp8", 32)):
        op = mxq.fused_quant(format=fmt)(ident)
        cfg = codegen.kernel_config(op.spec, op.epilogue)
        kern = VectorizedKernel(cfg, types.SimpleNamespace(out_col=lambda co, c: c))
        nbr = 96 // block
        for grouped in (True, False):
            k = types.SimpleNamespace(GROUPED=grouped)
            for r in (0, 5):
                for c0 in range(0, 96, 4):
                    t = types.SimpleNamespace(gt=None, co=0, c0=c0, nbr=nbr, M=204)
                    assert kern.row_scale_offset(k, t, r) == r * nbr + c0 // block, (fmt, grouped, r, c0)


def test_source_renders_for_served_specs_only():
    assert "mxfp4" in mxq.fused_quant(format="mxfp4")(ident).source
    for opts in (dict(format="mxfp4", colwise=True), dict(format="nvfp4", colwise=True, hadamard=True)):
        assert opts["format"] in mxq.fused_quant(**opts)(ident).source
    cfg = codegen.kernel_config(mxq.fused_quant(format="mxfp4")(ident).spec, mxq.fused_quant()(ident).epilogue)
    assert cfg.fmt.packed and cfg.fmt.element == "e2m1" and cfg.fmt.block == (1, 32)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_grouped_rowwise_compiles(arch, dtype):
    """CPU counterpart of test_grouped_rowwise_matches_reference: the grouped kernels of both
    formats compile (the packed and vectorised ones); NVFP4's zero its amax per group in a loop
    over the [G] slot before the amax pass and the quantize pass (three kernels)."""
    mx = _ptx(mxq.fused_quant(format="mxfp4")(ident), arch, dtype, "vec_grouped")
    assert mx.count(".entry") == 1
    nv = _ptx(mxq.fused_quant(format="nvfp4")(ident), arch, dtype, "vec_grouped")
    assert nv.count(".entry") == 3
    given = _ptx(mxq.fused_quant(format="nvfp4")(ident), arch, dtype, "vec_given_grouped")
    assert given.count(".entry") == 1  # (a given amax: the quantize pass alone, its entries written first)
    init = next(e for e in nv.split(".entry ")[1:] if "amax_init" in e.split("(")[0])
    # (the block's 256 threads stride over the G entries: a loop of zero stores stepping by 256)
    assert ".reqntid 256" in init and "%tid.x" in init and "st.global.b32" in init
    assert re.search(r"add\.s32\s+(%r\d+), \1, 256;", init)


GROUPED_COLWISE = [("mxfp4", dict()), ("mxfp4", dict(rowwise=False, scale_mode="rceil")),
                   ("mxfp4", dict(dact="relu", dbias=True)), ("nvfp4", dict()), ("nvfp4", dict(rowwise=False)),
                   ("nvfp4", dict(dact="relu", dbias=True, amax=True))]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("case", GROUPED_COLWISE, ids=_fmt_ids)
def test_grouped_colwise_compiles(arch, case):
    """CPU counterpart of test_gpu_grouped_colwise_matches_reference: the grouped packed kernel
    with the transposed colwise copy traces (its scales at [N, M // B + G] columns start // B + g
    on, PackedKernel.fp4_column_scales; the copy's runs stored as aligned words with 2- and
    1-byte pieces at their ends where a group's rows do not align them, store_fp4_shifted) and,
    on sm_90, assembles without spills."""
    import shutil

    fmt, opts = case
    op = mxq.fused_quant(format=fmt, colwise=True, **opts)(ident)
    ptx = _ptx(op, arch, "bf16", "vec_grouped")
    assert "st.global.b16" in ptx and "st.global.b8" in ptx  # (the end pieces of unaligned group runs)
    # fp32: the vectorised kernel, each column's word of 8 rows as 4 bytes (32 a thread, 8 scale bytes)
    vec = max(_ptx(op, arch, "fp32", "vec_grouped").split(".entry")[1:], key=lambda e: e.count("st.global"))
    assert vec.count("st.global.b8 ") == 32 + 8 and "st.global.b16" not in vec
    if arch == "sm_90a" and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _assert_ptxas_clean

        _assert_ptxas_clean(ptx)


def cdiv(a, b):
    return -(-a // b)


@pytest.fixture(scope="module")
def fp4_libs(tmp_path_factory):
    """Exported NVFP4 and MXFP4 ops (both directions with drelu and dbias; NVFP4 grouped too),
    loaded: (op, library, export info) by format."""
    import tvm_ffi

    libs = {}
    for fmt, opts in (("nvfp4", dict(colwise=True, dact="relu", dbias=True)),
                      ("mxfp4", dict(colwise=True, dact="relu", dbias=True, scale_layout="swizzled"))):
        op = mxq.fused_quant(format=fmt, **opts)(ident)
        info = op.export(tmp_path_factory.mktemp(fmt), arch="sm_90", dtype="bf16", name=f"e_{fmt}",
                         grouped=fmt == "nvfp4")
        libs[fmt] = (op, tvm_ffi.load_module(info["library"]), info)
    return libs


def _fp4_args(fmt, m, n, groups=None, device="cpu", **wrong):
    """An exported FP4 op's arguments of the sizes written out here: data [M, N/2] and the
    transposed copy [N, M/2]; scales per 16 (NVFP4, compact) or per 32 (MXFP4, swizzled:
    roundup(M, 128) x roundup(ceil(N/32), 4) and roundup(N, 128) x roundup(ceil(M/32), 4)); the
    amax [1] ([G] grouped); the dbias workspace a row per colwise tile (FP4_COL_ROWS rows; grouped:
    one more per group)."""
    z = dict(device=device)
    if fmt == "nvfp4":
        row_scale, col_scale = m * cdiv(n, 16), n * (m // 16 + len(groups) if groups is not None else cdiv(m, 16))
    else:
        row_scale = -(-m // 128) * 128 * cdiv(cdiv(n, 32), 4) * 4
        col_scale = -(-n // 128) * 128 * cdiv(cdiv(m, 32), 4) * 4
    rows = kconfig.FP4_COL_ROWS
    ws = m // rows + len(groups) if groups is not None else cdiv(m, rows)
    args = dict(mIn0=torch.zeros(m, n, dtype=torch.bfloat16, **z), mActIn=torch.zeros(m, n, dtype=torch.bfloat16, **z),
                mRowData=torch.zeros(m, n // 2, dtype=torch.uint8, **z), mRowScale=torch.zeros(row_scale, dtype=torch.uint8, **z),
                mColData=torch.zeros(n, m // 2, dtype=torch.uint8, **z), mColScale=torch.zeros(col_scale, dtype=torch.uint8, **z),
                mAmax=torch.zeros(len(groups) if groups is not None else 1, **z),
                mDbias=torch.zeros((len(groups), n) if groups is not None else (n,), dtype=torch.bfloat16, **z),
                mDbiasWs=torch.zeros(ws, n, **z), mNoop=torch.zeros(1, **z))
    if fmt == "mxfp4":  # (MXFP4 without amax=True has no amax)
        del args["mAmax"]
    if groups is not None:
        args["mGroupEnds"] = groups.to(device)
    args.update(wrong)
    return list(args.values())


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # (tvm_ffi raises the check's ValueError, or the compiled function's error)
        return f"{type(exc).__name__}: {exc}"
    return ""


def test_export_serves_the_aligned_kernels_and_refuses_the_rest(fp4_libs, tmp_path):
    """export() of FP4 ops: the aligned kernel alone ("_vec"; NVFP4 also "_vec_given", the
    quantize pass of a given amax; grouped "_vec_grouped"), the header naming what is left out
    and the packed data's shapes; the Hadamard transform and gated backwards refused before
    anything is built."""
    _, _, info = fp4_libs["nvfp4"]
    assert info["functions"] == ["e_nvfp4_vec", "e_nvfp4_vec_given", "e_nvfp4_vec_grouped",
                                 "e_nvfp4_vec_given_grouped"]
    text = open(info["header"]).read()
    for words in ("NVFP4 (E2M1 data, E4M3 scales per 16", "mRowData    uint8[M, N/2]", "mColData    uint8[N, M/2]",
                  "mRowScale   uint8[M * ceil(N/16)] flat E4M3", '"e_nvfp4_vec_given" takes the same arguments',
                  'Not in this library: "e_nvfp4"', "N % 16 == 0 (and M % 8 == 0", "mColScale must be zero before"):
        assert words in text, words
    _, _, info = fp4_libs["mxfp4"]
    assert info["functions"] == ["e_mxfp4_vec"]
    for opts, word in ((dict(format="nvfp4", colwise=True, hadamard=True), "hadamard"),
                       (dict(format="mxfp4", dact="swiglu"), "gated backward")):
        with pytest.raises(ValueError, match=word):
            mxq.fused_quant(**opts)(ident).export(tmp_path / "x")
    for opts, word in ((dict(format="mxfp4", scale_layout="swizzled"), "compact"),
                       (dict(format="nvfp4", stochastic_rounding=True), "stochastic_rounding"),
                       (dict(format="nvfp4", block_2d=True), "block_2d")):  # (grouped: validation's rule)
        with pytest.raises(ValueError, match=word):
            mxq.fused_quant(**opts)(ident).export(tmp_path / "x", grouped=True)
    assert not (tmp_path / "x").exists()


def test_fp32_exports_serve_the_vectorised_kernel(tmp_path):
    """export(dtype="fp32") of FP4 ops on the vectorised kernel: the colwise copy (drelu + dbias;
    grouped too), NVFP4's 16x16 tiles and stochastic rounding (ungrouped: validation's rule),
    each its "_vec" function (NVFP4's "_vec_given" too). GPU counterpart:
    test_exported_fp4_functions_run_on_cuda (fp32)."""
    for i, (fmt, opts, grouped) in enumerate((("mxfp4", dict(colwise=True, dact="relu", dbias=True), True),
                                              ("nvfp4", dict(colwise=True, block_2d=True), False),
                                              ("nvfp4", dict(stochastic_rounding=True), False))):
        op = mxq.fused_quant(format=fmt, **opts)(ident)
        info = op.export(tmp_path / f"f{i}", arch="sm_90", dtype="fp32", name=f"f_{fmt}", grouped=grouped)
        want = [f"f_{fmt}_vec"] + ([f"f_{fmt}_vec_given"] if fmt == "nvfp4" else [])
        assert info["functions"] == want + [f + "_grouped" for f in want if grouped], opts


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m, n", [(64, 96), (8, 512), (200, 48)])
def test_exported_fp4_functions_check_every_size(fp4_libs, fmt, m, n):
    """csrc/export_check.h on FP4's arguments: the right sizes pass to the compiled function
    (which refuses the CPU device); each buffer one element short or long, the data as FP8's
    [M, N], the transposed copy as [M, N/2], an amax of two entries, M % 8 != 0: a ValueError
    naming the argument and the size due."""
    op, lib, _ = fp4_libs[fmt]
    fname = f"e_{fmt}_vec"
    names = ("mIn0", "mActIn", "mRowData", "mRowScale", "mColData", "mColScale") + ("mAmax",) * (fmt == "nvfp4") + (
        "mDbias", "mDbiasWs")
    assert "device_type=cuda" in _error(lib[fname], *_fp4_args(fmt, m, n)), fname  # (sizes pass)
    ok = dict(zip(names, _fp4_args(fmt, m, n)))
    for slot in ("mRowScale", "mColScale", "mDbias") + ("mAmax",) * (fmt == "nvfp4"):
        t = ok[slot]
        for bad in (t[:-1], torch.zeros(t.numel() + 1, dtype=t.dtype)):
            msg = _error(lib[fname], *_fp4_args(fmt, m, n, **{slot: bad}))
            assert msg.startswith(f"ValueError: mxq: {fname}: argument #") and f"'{slot}'" in msg, msg
    for slot, bad, want in (("mRowData", torch.zeros(m, n, dtype=torch.uint8), f"[{m}, {n // 2}]"),
                            ("mColData", torch.zeros(m, n // 2, dtype=torch.uint8), f"[{n}, {m // 2}]")):
        msg = _error(lib[fname], *_fp4_args(fmt, m, n, **{slot: bad}))
        assert f"'{slot}'" in msg and want in msg, msg
    enc = "E4M3" if fmt == "nvfp4" else "E8M0"
    for dtype in (torch.float32, torch.int8, torch.float8_e4m3fn):  # (the header's uint8 bytes only)
        msg = _error(lib[fname], *_fp4_args(fmt, m, n, mRowScale=ok["mRowScale"].to(dtype)))
        assert "'mRowScale' has dtype" in msg and f"this op's scales are uint8 ({enc} bytes)" in msg, msg
    msg = _error(lib[fname], *_fp4_args(fmt, m + 4, n))  # (M % 8 == 4: the colwise words)
    assert "M % 8 == 0" in msg, msg


def test_exported_grouped_fp4_function_checks_the_groups(fp4_libs):
    """The grouped NVFP4 function: its amax one per group, its colwise scales [N, M // 16 + G],
    its dbias [G, N]."""
    op, lib, _ = fp4_libs["nvfp4"]
    m, n = 64, 96
    offs = torch.tensor([0, 16, 40, 64], dtype=torch.int32)
    fname = "e_nvfp4_vec_grouped"
    assert "device_type=cuda" in _error(lib[fname], *_fp4_args("nvfp4", m, n, offs))
    msg = _error(lib[fname], *_fp4_args("nvfp4", m, n, offs, mAmax=torch.zeros(1)))
    assert "'mAmax'" in msg and "4 elements (one per group)" in msg, msg
    msg = _error(lib[fname], *_fp4_args("nvfp4", m, n, offs, mColScale=torch.zeros(n * (m // 16), dtype=torch.uint8)))
    assert "'mColScale'" in msg and f"needs {n * (m // 16 + 4)} elements" in msg, msg


# -- compiled code ---------------------------------------------------------------------------------
def _ptx(op, arch, dtype, variant="vec"):
    return compiler.compile_op(op, arch, dtype, keep_ptx=True, variant=variant).__ptx__


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("dtype, mode, layout", [("bf16", "floor", "compact"), ("fp16", "rceil", "swizzled"),
                                                 ("fp32", "floor", "swizzled"), ("fp32", "rceil", "compact")])
def test_rowwise_compiles_per_arch(arch, dtype, mode, layout):
    op = mxq.fused_quant(format="mxfp4", scale_mode=mode, scale_layout=layout)(ident)
    ptx = _ptx(op, arch, dtype)
    assert f".target {arch}" in ptx
    cvts = ptx.count("cvt.rn.satfinite.e2m1x2.f32")
    if arch == "sm_100a":  # four conversions of two values per row of 8 values
        assert cvts > 0 and cvts % 4 == 0
    else:  # no FP4 conversion on Hopper: the lane encode two values at a time (device.e2m1x2_codes)
        assert cvts == 0 and "min.u16x2" in ptx and "fma.rn.bf16x2" in ptx
        # bf16 scaled in bf16 (codec.pow2_bf16_pairs), the rest in fp32 and rounded to odd
        assert ("mul.rn.bf16x2" in ptx) == (dtype == "bf16")
    assert "cvt.rn.satfinite.e4m3x2" not in ptx and "e5m2x2" not in ptx  # (no FP8 byte anywhere)
    assert "st.global.b32" in ptx or "st.global.u32" in ptx  # a row's 8 codes: one 4-byte store
    if mode == "rceil":  # E2M1's fp32(1/6) in the scale rule
        assert "0f3E2AAAAB" in ptx


def test_fused_ops_compile():
    ops = [mxq.fused_quant(format="mxfp4", act="gelu")(ident),
           mxq.fused_quant(format="mxfp4", dact="gelu", dbias=True, amax=True)(ident),
           mxq.fused_quant(format="mxfp4")(scaled_shift)]
    for op in ops:
        for dtype in ("bf16", "fp32"):
            assert "cvt.rn.satfinite.e2m1x2.f32" in _ptx(op, "sm_100a", dtype)


@pytest.mark.parametrize("dtype, variant", [("bf16", "generic"), ("fp32", "rows8")])
def test_unaligned_variants_refuse_to_trace(dtype, variant):
    op = mxq.fused_quant(format="mxfp4")(ident)
    with pytest.raises(Exception, match="FP4"):
        _ptx(op, "sm_90", dtype, variant)


# the colwise copy beside dbias (its column sums: PackedKernel.column_owners, over the 32-row tile)
COLWISE_DBIAS = [("mxfp4", dict(dact="relu")), ("mxfp4", dict(dact="relu", rowwise=False, scale_mode="rceil")),
                 ("mxfp4", dict(scale_layout="swizzled")), ("nvfp4", dict(dact="relu")),
                 ("nvfp4", dict(dact="relu", rowwise=False, scale_layout="swizzled")),
                 ("nvfp4", dict(dact="relu", stochastic_rounding=True)), ("nvfp4", dict(dact="relu", block_2d=True)),
                 ("nvfp4", dict(dact="relu", hadamard=True))]


@pytest.mark.parametrize("case", COLWISE_DBIAS, ids=_fmt_ids)
def test_colwise_copy_with_dbias_is_served_and_compiles(case):
    """The transposed colwise copy beside dbias from 16-bit inputs (M % 8 == 0; Hadamard M % 16):
    served, and the packed kernel traces for sm_90 and sm_100a and assembles without spills;
    from fp32 served on the vectorised kernel but with the Hadamard transform (bf16 alone), named."""
    import shutil

    fmt, opts = case
    op = mxq.fused_quant(format=fmt, colwise=True, dbias=True, **opts)(ident)
    for dtype in (torch.bfloat16, torch.float16):
        if opts.get("hadamard") and dtype is torch.float16:
            continue
        assert _unserved(op, torch.zeros(208, 272, dtype=dtype)) is None, dtype
    flag = "hadamard" if opts.get("hadamard") else None
    why = _unserved(op, torch.zeros(208, 272))
    assert (why is None) if flag is None else (flag in why), why
    for arch in ("sm_90", "sm_100a"):
        ptx = _ptx(op, arch, "bf16")
        # (Hopper has no E2M1 cvt; stochastic rounding runs the software rule on sm_100a too)
        want_cvt = arch == "sm_100a" and not opts.get("stochastic_rounding")
        assert ("cvt.rn.satfinite.e2m1x2.f32" in ptx) == want_cvt, arch
        if arch == "sm_90" and shutil.which("ptxas") is not None:
            from .test_gemm_epilogue import _assert_ptxas_clean

            _assert_ptxas_clean(ptx)


# gated backwards (two output halves [M, 2N]: the packed kernel's two passes over one loaded tile)
GATED_BWD = [("mxfp4", dict()), ("mxfp4", dict(colwise=True, dbias=True, scale_mode="rceil")),
             ("mxfp4", dict(rowwise=False, colwise=True, amax=True)), ("nvfp4", dict()),
             ("nvfp4", dict(colwise=True, dbias=True)), ("nvfp4", dict(colwise=True, scale_layout="swizzled"))]


@pytest.mark.parametrize("case", GATED_BWD, ids=_fmt_ids)
def test_gated_backward_is_served_and_compiles(case):
    """A gated backward from 16-bit inputs on the packed kernel (each half's rowwise bytes from
    byte co / 2, its transposed colwise rows from row co, its scales from column co): served
    (N a multiple of the rowwise block: none straddles the halves), traced for sm_90 and
    sm_100a, assembled without spills; from fp32 on the vectorised kernel (a CTA per half, each
    row's inputs loaded just before it on 8-row threads: VectorizedKernel.lazy_loads), grouped
    fp32 calls, stochastic rounding, the Hadamard transform and 16x16 tiles with two halves run
    the reference, named."""
    import shutil

    fmt, opts = case
    op = mxq.fused_quant(format=fmt, dact="swiglu", **opts)(ident)
    inner = op.inner
    x = torch.zeros(72, 96, dtype=torch.bfloat16)
    assert limits.unserved(inner.spec, inner.epilogue, x, inner._packed_smem_shortfall) is None
    x32 = x.float()
    assert limits.unserved(inner.spec, inner.epilogue, x32, inner._packed_smem_shortfall) is None
    grouped = Call([x32], [], group_offsets=torch.tensor([72], dtype=torch.int32))
    assert "group_offsets and fp32" in limits.unserved(inner.spec, inner.epilogue, x32, lambda: None, grouped)
    cfg = codegen.kernel_config(inner.spec, inner.epilogue)
    assert VectorizedKernel(cfg, None).lazy_loads() == bool(opts.get("colwise"))
    for arch, dtype in (("sm_90", "bf16"), ("sm_100a", "bf16"), ("sm_90", "fp32")):
        ptx = _ptx(inner, arch, dtype)
        assert ("cvt.rn.satfinite.e2m1x2.f32" in ptx) == (arch == "sm_100a")
        if arch == "sm_90" and shutil.which("ptxas") is not None:
            from .test_gemm_epilogue import _assert_ptxas_clean

            _assert_ptxas_clean(ptx)
    for flag in ("stochastic_rounding", "block_2d", "hadamard") if fmt == "nvfp4" else ():  # (NVFP4's options)
        other = mxq.fused_quant(format=fmt, dact="swiglu", colwise=True, **{flag: True})(ident).inner
        why = limits.unserved(other.spec, other.epilogue, x, other._packed_smem_shortfall)
        assert why is not None and flag in why and "two output halves" in why, flag


GATED_BWD_GROUPED = [c for c in GATED_BWD if c[1].get("scale_layout", "compact") == "compact"]  # (grouped: compact)


def _even_group_ends(m: int, g: int, seed: int) -> torch.Tensor:
    """Random group ends over m (even) rows with empty groups (test_gated._random_groups), each
    rounded down to an even row: FP4's colwise copy packs rows 2j and 2j + 1 in one byte."""
    from .test_gated import _random_groups

    return _random_groups(m, g, seed) // 2 * 2


def _check_grouped_gated_backward(fmt, opts, name, dtype, device):
    """A grouped gated backward (dact ``name``, exact: dreglu or dsreglu) on ``device``, into
    poisoned outputs and allocating, against the reference (checks.check_exact: bytes, dbias
    [G, 2N] within an ulp), at N = 96 (a partial column tile a half) and 288 over random groups
    with empty ones."""
    for m, n, g in ((336, 96, 7), (80, 288, 3)):  # (the colwise copy: M % 8 == 0, limits.fp4_unserved)
        offs = _even_group_ends(m, g, seed=n)
        a = planted(m, 2 * n, dtype, seed=m + n, scale=2.0)
        grad = planted(m, n, dtype, seed=m + n + 1, specials=False)
        op = mxq.fused_quant(format=fmt, dact=name, **opts)(ident)
        gd, ad, od = grad.to(device), a.to(device), offs.to(device)
        for got in (op(gd, act_input=ad, group_offsets=od, out=poisoned(op, gd, od)),
                    op(gd, act_input=ad, group_offsets=od)):
            assert got.dbias is None or got.dbias.shape == (g, 2 * n)
            _check(op, [grad], got, act_input=a, group_offsets=offs)


def _check_gated_backward_given_amax(grouped: bool, device):
    """NVFP4's gated backward (dreglu + dbias, both directions) with global_amax= (the quantize
    pass alone over the two halves; grouped: one value for every group, and a [G] tensor), on
    ``device``, against the reference with the same amax (checks.check_exact)."""
    op = mxq.fused_quant(format="nvfp4", dact="reglu", colwise=True, dbias=True)(ident)
    m, n = 96, 96
    a = planted(m, 2 * n, torch.bfloat16, seed=3, scale=2.0)
    grad = planted(m, n, torch.bfloat16, seed=4, specials=False)
    offs = _even_group_ends(m, 5, seed=1) if grouped else None
    givens = (300.0, torch.tensor([300.0, 2.0, 7.5, 1.0, 40.0])) if grouped else (300.0, torch.tensor(0.5))
    for given in givens:
        got = op(grad.to(device), act_input=a.to(device), group_offsets=None if offs is None else offs.to(device),
                 global_amax=given.to(device) if isinstance(given, torch.Tensor) else given)
        _check(op, [grad], got, act_input=a, group_offsets=offs, global_amax=given)


def test_gated_backward_with_a_given_amax_is_served():
    """NVFP4's gated backward with global_amax= is the kernels' (grouped or not), and
    _check_gated_backward_given_amax runs on the reference path."""
    inner = mxq.fused_quant(format="nvfp4", dact="reglu", colwise=True, dbias=True)(ident).inner
    g, a = torch.zeros(96, 96, dtype=torch.bfloat16), torch.zeros(96, 192, dtype=torch.bfloat16)
    for offs in (None, _even_group_ends(96, 5, seed=1)):
        call = Call([g, a[:, :96], a[:, 96:]], [0.0], group_offsets=offs)._replace(fp4=fp4.CallArgs(300.0, None, None))
        assert limits.unserved(inner.spec, inner.epilogue, g, inner._packed_smem_shortfall, call) is None
        _check_gated_backward_given_amax(offs is not None, "cpu")


@pytest.mark.parametrize("case", GATED_BWD_GROUPED, ids=_fmt_ids)
def test_grouped_gated_backward_is_served(case):
    """The grouped gated backward from 16-bit inputs is served by the grouped kernels (the GPU
    test below checks their bytes), and its check runs on the reference path (the CPU call)."""
    fmt, opts = case
    inner = mxq.fused_quant(format=fmt, dact="reglu", **opts)(ident).inner
    x = torch.zeros(336, 96, dtype=torch.bfloat16)
    call = Call([x], [], group_offsets=_even_group_ends(336, 7, seed=96))
    assert limits.unserved(inner.spec, inner.epilogue, x, inner._packed_smem_shortfall, call) is None
    _check_grouped_gated_backward(fmt, opts, "reglu", torch.bfloat16, "cpu")


# -- on the device -----------------------------------------------------------------------------
@pytest.fixture
def strict(monkeypatch):
    """No fallback: every call here is one the kernels serve (MXQ_STRICT=1 raises otherwise)."""
    monkeypatch.setenv("MXQ_STRICT", "1")


BOTH = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax")


def same_outputs(op, x, got, **kw):
    """Every output of both directions (and amax) that the reference has, byte-equal to ``got``'s."""
    want = op.reference(x, **kw)
    for f in BOTH:
        if getattr(want, f) is not None:
            assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), f


def _specials(m, n, dtype, seed):
    """planted data (NaN, inf, subnormals, zeros) plus MXFP4's edge blocks: a block of ties and
    saturating values (amax in [6, 8) * 2^k: floor saturates), a subnormal block, a zero block."""
    x = planted(m, n, torch.float32, seed=seed)
    if m >= 3 and n >= 48:
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.1, 7.5, -7.9, 6.0, 0.0, -0.0, 1.0, 3.0])
        x[0, 32:48] = ties * 2.0 ** 3
        x[1, :16] = 1e-39 if dtype is torch.float32 else 1e-6
        x[2, :n] = 0.0
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 1000])
@pytest.mark.parametrize("n", [16, 48, 200, 4096])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode, layout", [("floor", "compact"), ("floor", "swizzled"), ("rceil", "compact"),
                                          ("rceil", "swizzled")])
def test_rowwise_matches_reference(strict, m, n, dtype, mode, layout):
    op = mxq.fused_quant(format="mxfp4", scale_mode=mode, scale_layout=layout)(ident)
    x = _specials(m, n, DTYPES[dtype], seed=m + n)
    _check(op, [x], op(x.cuda()))
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_ops_match_reference(strict, dtype):
    t = DTYPES[dtype]
    x, b = _specials(70, 384, t, seed=1), planted(1, 384, t, seed=2, specials=False).reshape(384)
    relu = mxq.fused_quant(format="mxfp4", act="relu", amax=True)(ident)
    _check(relu, [x], relu(x.cuda()))
    epi = mxq.fused_quant(format="mxfp4", scale_layout="swizzled", scale_mode="rceil")(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))
    drelu = mxq.fused_quant(format="mxfp4", dact="relu", dbias=True)(ident)
    a = planted(70, 384, t, seed=5)
    _check(drelu, [x], drelu(x.cuda(), act_input=a.cuda()), act_input=a)
    y = _specials(3, 4096, t, seed=6).reshape(3, 2, 2048)  # (leading dims)
    _check(relu, [y], relu(y.cuda()))


def within_gelu_class(got, want, direction="rowwise", block=32, zero_scale_saturates=False):
    """gelu's approximate transcendentals on FP4 (docs/NUMERICS.md's transcendental class, on the
    E2M1 grid): at most 1% of ``direction``'s scale bytes (compact) off and, in the blocks of equal
    scales, at most 1 in 1000 codes, each by one step of the grid (signed zeros alike); an amax
    within a relative 1e-5. ``zero_scale_saturates`` (NVFP4): in a block whose scale byte is 0 (too
    small for any scale: multiplier FLT_MAX) every v off zero saturates, so the bound that moves a
    v from zero (an fp16 gelu at a rounding tie of the subnormal grid) moves its code from 0 to 6."""
    g, w = (fp4.unpack(getattr(t, f"{direction}_data").cpu()).to(torch.int64) for t in (got, want))
    gs, ws = (getattr(t, f"{direction}_scale").cpu().view(torch.uint8) for t in (got, want))
    same_scale = (gs == ws).repeat_interleave(block, dim=1)[:, :g.shape[1]]
    zero_scale = ((gs == 0) & (ws == 0)).repeat_interleave(block, dim=1)[:, :g.shape[1]]
    off = (g != w) & same_scale  # (a block whose scale differs: every code scaled by it)
    step = ((g & 7) - (w & 7)).abs()
    if zero_scale_saturates:
        step = torch.where(zero_scale & (step == 7), torch.ones_like(step), step)  # (0 against 6)
    same_sign = ((g ^ w) & 8 == 0) | ((g & 7) == 0) | ((w & 7) == 0)
    assert off.float().mean() <= 1e-3 and bool((step[off] <= 1).all() and same_sign[off].all()), direction
    assert (gs != ws).float().mean() <= 0.01, direction
    if want.amax is not None:
        assert torch.allclose(got.amax.cpu(), want.amax, rtol=1e-5, equal_nan=True), "amax"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n_tensors", [6, 7])
def test_many_epilogue_tensors_colwise_match_reference(strict, fmt, n_tensors):
    """The colwise copy of an op summing 6 (the 64-row tile) or 7 (the 32-row tile: 64 rows would
    not fit, KernelConfig.fp4_tall_fits) full tensors, M % 64 != 0, against the reference. CPU
    counterpart: test_kernels_nvfp4.test_colwise_tile_config."""
    from .test_validation import _seven_for_smem, _six_for_smem

    op = mxq.fused_quant(format=fmt, colwise=True, amax=True)({6: _six_for_smem, 7: _seven_for_smem}[n_tensors])
    ins = [planted(200, 256, torch.bfloat16, seed=i) for i in range(n_tensors)]
    _check(op, ins, op(*[t.cuda() for t in ins]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gelu_within_the_transcendental_class(strict, dtype):
    op = mxq.fused_quant(format="mxfp4", act="gelu")(ident)
    x = planted(96, 512, DTYPES[dtype], seed=4)
    within_gelu_class(op(x.cuda()), op.reference(x))


@pytest.mark.gpu
def test_unserved_shapes_fall_back_with_the_reference(monkeypatch):
    op = mxq.fused_quant(format="mxfp4")(ident)
    x = planted(5, 30, torch.bfloat16, seed=8)  # N % 8 != 0
    _check(op, [x], op(x.cuda()))  # (after a one-time warning)
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="N % 8"):
        op(x.cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_kernels_match_the_oracle(strict, dtype, mode):
    x = _specials(4, 96, DTYPES[dtype], seed=9)
    got = mxq.quantize(x.cuda(), format="mxfp4", scale_mode=mode)
    codes, scales = oracle.mxfp4(x.float().tolist(), mode)
    assert got.rowwise_data.cpu().tolist() == oracle.pack(codes)
    assert got.rowwise_scale.cpu().tolist() == scales
    assert math.prod(got.rowwise_data.shape) == 4 * 48


GROUP_SIZES = [0, 1, 31, 32, 33, 0, 100, 7, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fmt, opts", [("mxfp4", dict()), ("mxfp4", dict(scale_mode="rceil", amax=True)),
                                       ("nvfp4", dict()), ("nvfp4", dict(act="gelu", dbias=True)),
                                       ("mxfp4", dict(dact="relu", dbias=True))])
def test_grouped_rowwise_matches_reference(fmt, opts, dtype, strict):
    """Grouped rowwise calls on the kernels (no fallback): random group sizes with empty ones
    first, last and between; NVFP4's amax per group (its amax pass and quantize pass read entry
    g), dbias per group, MXFP4's amax over the whole tensor; into fresh and poisoned outputs.
    CPU counterpart: test_grouped_rowwise_compiles."""
    t = DTYPES[dtype]
    offs = torch.tensor(GROUP_SIZES).cumsum(0).to(torch.int32)
    m, n = int(offs[-1]), 96
    op = mxq.fused_quant(format=fmt, **opts)(ident)
    x = planted(m, n, t, seed=m + len(opts))
    kw = {"act_input": planted(m, n, t, seed=m + 1)} if "dact" in opts else {}
    cuda_kw = {k: v.cuda() for k, v in kw.items()}
    got = op(x.cuda(), group_offsets=offs.cuda(), **cuda_kw)
    into = op(x.cuda(), group_offsets=offs.cuda(), out=poisoned(op, x.cuda(), group_offsets=offs.cuda()), **cuda_kw)
    for t_out in (got, into):
        if opts.get("act") != "gelu":
            _check(op, [x], t_out, group_offsets=offs, **kw)
        else:  # (transcendental: each group's amax within rtol 1e-5, the rest in the class under the kernels' amax)
            from mxq.testing import compare, v_abs_sum
            amax = t_out.amax.cpu()
            assert torch.allclose(amax, op.reference(x, group_offsets=offs).amax, rtol=1e-5, atol=0.0)
            want = op.reference(x, group_offsets=offs, global_amax=amax)
            assert compare(t_out, want, exact=False, v_abs=v_abs_sum(op, x, group_offsets=offs)) == []
    if fmt == "nvfp4":
        want = torch.stack([x[s:e].float().abs().nan_to_num(0.0, math.inf).amax() if e > s else torch.zeros(())
                            for s, e in zip([0, *offs[:-1].tolist()], offs.tolist())]) if not opts else None
        if want is not None:
            assert torch.equal(got.amax.cpu(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("case", COLWISE_DBIAS, ids=_fmt_ids)
def test_gpu_colwise_copy_with_dbias_matches_reference(strict, case, dtype):
    """The colwise copy beside dbias on the kernels, allocating and into poisoned outputs: every
    data, scale and amax byte equal to the reference's (drelu, a plain cast and the exact NVFP4
    options: stochastic rounding, 16x16 tiles, the Hadamard transform), dbias within an ulp
    (_check's rule); M with a partial 32-row tile (72) and whole ones (256); N past one 256-column
    tile. CPU counterpart: test_colwise_copy_with_dbias_is_served_and_compiles."""
    fmt, opts = case
    if opts.get("hadamard") and dtype == "fp16":
        pytest.skip("the Hadamard transform takes bf16 inputs")
    t = DTYPES[dtype]
    op = mxq.fused_quant(format=fmt, colwise=True, dbias=True, **opts)(ident)
    kw = {"seed": 11, "offset": 2 ** 33 + 4} if opts.get("stochastic_rounding") else {}
    for m, n in ((80 if opts.get("hadamard") else 72, 528), (256, 272)):
        x = planted(m, n, t, seed=m + n, specials=not opts.get("hadamard"))
        a = planted(m, n, t, seed=m + n + 1)
        args = dict(act_input=a) if "dact" in opts else {}
        want = op.reference(x, **args, **kw)
        cuda_args = {k: v.cuda() for k, v in args.items()}
        for got in (op(x.cuda(), **cuda_args, **kw), op(x.cuda(), **cuda_args, out=poisoned(op, x.cuda()), **kw)):
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "colwise_amax"):
                if getattr(want, f) is not None:
                    g, w = getattr(got, f), getattr(want, f)
                    assert same_bytes(g.contiguous(), w.contiguous()) or (
                        f.endswith("amax") and bool(g.isnan().cpu().all() & w.isnan().all())), (m, f)
            gd, wd = got.dbias.cpu().double(), want.dbias.double()
            ulp = torch.finfo(t).eps * wd.abs() + torch.finfo(t).tiny
            assert bool((((gd - wd).abs() <= ulp) | (gd == wd) | (gd.isnan() & wd.isnan())).all()), m


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("case", GROUPED_COLWISE, ids=_fmt_ids)
def test_gpu_grouped_colwise_matches_reference(strict, case, dtype):
    """Grouped calls with the transposed colwise copy on the kernels (no fallback), allocating and
    into poisoned outputs (whose colwise scales between the groups' blocks the launch zeroes):
    every byte equal to the reference's, dbias within an ulp, NVFP4's amax per group; group sizes
    even (a byte packs two rows), empty ones first, between and last, and group starts both
    aligned to the 4-byte runs and not (6, 38, ...: the byte stores); fp32 on the vectorised
    kernel (each column's word as 4 bytes below the group's end). CPU counterpart:
    test_grouped_colwise_compiles."""
    fmt, opts = case
    t = DTYPES[dtype]
    for sizes in ([0, 6, 32, 0, 100, 2, 68, 0], [16, 48, 32, 0, 64]):  # (M % 8 == 0: 208, 160)
        offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
        m, n = int(offs[-1]), 272
        op = mxq.fused_quant(format=fmt, colwise=True, **opts)(ident)
        x = planted(m, n, t, seed=m + len(opts))
        kw = {"act_input": planted(m, n, t, seed=m + 1)} if "dact" in opts else {}
        cuda_kw = {k: v.cuda() for k, v in kw.items()}
        want = op.reference(x, group_offsets=offs, **kw)
        got = op(x.cuda(), group_offsets=offs.cuda(), **cuda_kw)
        into = op(x.cuda(), group_offsets=offs.cuda(), out=poisoned(op, x.cuda(), group_offsets=offs.cuda()),
                  **cuda_kw)
        for res in (got, into):
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
                if getattr(want, f) is not None:
                    g, w = getattr(res, f), getattr(want, f)
                    assert same_bytes(g.contiguous(), w.contiguous()) or (
                        f == "amax" and bool((g.cpu().isnan() & w.isnan()).all())), (sizes, f)
            if want.dbias is not None:
                gd, wd = res.dbias.cpu().double(), want.dbias.double()
                ulp = torch.finfo(t).eps * wd.abs() + torch.finfo(t).tiny
                assert bool((((gd - wd).abs() <= ulp) | (gd == wd) | (gd.isnan() & wd.isnan())).all()), sizes
    # op.prepare: the offsets changed in place between launches (the colwise scales' gaps move: cleared)
    if "dact" not in opts:
        offs = torch.tensor([0, 6, 38, 38, 138, 140, 208, 208], dtype=torch.int32)
        moved = torch.tensor([32, 32, 70, 100, 100, 140, 180, 208], dtype=torch.int32)
        x = planted(208, 272, t, seed=3, specials=False)
        oc = offs.cuda()
        launch, out = op.prepare(x.cuda(), group_offsets=oc)
        for ends in (offs, moved):
            oc.copy_(ends)
            launch()
            want = op.reference(x, group_offsets=ends)
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
                if getattr(want, f) is not None:
                    assert same_bytes(getattr(out, f).contiguous(), getattr(want, f).contiguous()), (ends.tolist(), f)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("case", GATED_BWD, ids=_fmt_ids)
def test_gpu_gated_backward_matches_reference(strict, case, dtype):
    """A gated backward on the kernels (no fallback), into poisoned outputs: the exact gated
    derivatives (dreglu, dsreglu) byte for byte against the reference, dbias within an ulp;
    dswiglu in the transcendental class (within_gelu_class, each direction); N = 96 (one partial
    column tile a half) and 288; M with a partial 32-row tile; fp32 on the vectorised kernel. CPU
    counterpart: test_gated_backward_is_served_and_compiles."""
    fmt, opts = case
    t = DTYPES[dtype]
    for m, n in ((72, 96), (40, 288)):
        a = planted(m, 2 * n, t, seed=m + n, scale=2.0)
        grad = planted(m, n, t, seed=m + n + 1, specials=False)
        for name in ("reglu", "sreglu", "swiglu"):
            op = mxq.fused_quant(format=fmt, dact=name, **opts)(ident)
            want = op.reference(grad, act_input=a)
            got = op(grad.cuda(), act_input=a.cuda(), out=poisoned(op, grad.cuda()))
            if name == "swiglu":
                if opts.get("scale_layout") == "swizzled":  # (within_gelu_class reads compact scales)
                    continue
                if fmt == "nvfp4":  # (the amax within rtol 1e-5, the bytes in the class under the kernels' amax)
                    assert torch.allclose(got.amax.cpu(), want.amax, rtol=1e-5, atol=0.0)
                    want = op.reference(grad, act_input=a, global_amax=got.amax.cpu())
                for d in ("rowwise", "colwise"):
                    if getattr(want, f"{d}_data") is not None:
                        within_gelu_class(got, want, d, block=16 if fmt == "nvfp4" else 32,
                                          zero_scale_saturates=fmt == "nvfp4")
                continue
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
                if getattr(want, f) is not None:
                    g, w = getattr(got, f), getattr(want, f)
                    assert same_bytes(g.contiguous(), w.contiguous()) or (
                        f == "amax" and bool((g.cpu().isnan() & w.isnan()).all())), (name, m, f)
            if want.dbias is not None:
                gd, wd = got.dbias.cpu().double(), want.dbias.double()
                ulp = torch.finfo(t).eps * wd.abs() + torch.finfo(t).tiny
                assert bool((((gd - wd).abs() <= ulp) | (gd == wd) | (gd.isnan() & wd.isnan())).all()), (name, m)


@pytest.mark.gpu
@pytest.mark.parametrize("grouped", [False, True])
def test_gpu_gated_backward_with_a_given_amax_matches_reference(strict, grouped):
    """NVFP4's gated backward with global_amax= on the kernels ("vec_given" over the two halves,
    grouped too): _check_gated_backward_given_amax. CPU counterpart:
    test_gated_backward_with_a_given_amax_is_served."""
    _check_gated_backward_given_amax(grouped, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("case", GATED_BWD_GROUPED, ids=_fmt_ids)
def test_gpu_grouped_gated_backward_matches_reference(strict, case, dtype):
    """The grouped gated backward on the grouped kernels (no fallback): dreglu and dsreglu byte for
    byte against the reference, into poisoned outputs and allocating, random groups with empty
    ones (_check_grouped_gated_backward). CPU counterpart: test_grouped_gated_backward_is_served."""
    fmt, opts = case
    for name in ("reglu", "sreglu"):
        _check_grouped_gated_backward(fmt, opts, name, DTYPES[dtype], "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_exported_fp4_functions_run_on_cuda(tmp_path, fmt, dtype):
    """The exported FP4 functions write the reference's bytes on the H200: drelu + dbias, both
    directions (NVFP4 compact, MXFP4 swizzled), NVFP4's "_vec_given" with a given amax and its
    grouped function (the colwise scales zeroed first, as the header says); fp32 on the
    vectorised kernel. CPU counterparts: test_exported_fp4_functions_check_every_size,
    test_exported_grouped_fp4_function_checks_the_groups, test_fp32_exports_serve_the_vectorised_kernel."""
    import tvm_ffi

    from mxq.formats.numerics import dbias_partial_dtype
    from mxq.runtime import targets

    arch = targets.device_arch(torch.device("cuda"))
    t = DTYPES[dtype]
    grouped = fmt == "nvfp4"
    opts = dict(colwise=True, dact="relu", dbias=True, scale_layout="compact" if fmt == "nvfp4" else "swizzled")
    op = mxq.fused_quant(format=fmt, **opts)(ident)
    info = op.export(tmp_path / "e", arch=arch, dtype=dtype, name=f"e_{fmt}", grouped=grouped)
    lib = tvm_ffi.load_module(info["library"])
    m, n = 200, 272
    x, a = planted(m, n, t, seed=1), planted(m, n, t, seed=2)

    def flat(t):
        return (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).reshape(-1)

    def run(fname, kw, groups=None):
        got = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cuda", zeroed=True, group_offsets=groups)
        if "given" in kw:
            got.amax.fill_(kw["global_amax"])
        args = [x.cuda(), a.cuda(), got.rowwise_data, flat(got.rowwise_scale), got.colwise_data,
                flat(got.colwise_scale), *([got.amax.reshape(-1)] if got.amax is not None else []), got.dbias,
                torch.empty(m // kconfig.FP4_COL_ROWS + len(groups) if groups is not None
                            else cdiv(m, kconfig.FP4_COL_ROWS), n, device="cuda",
                            dtype=dbias_partial_dtype(t)),
                torch.zeros(1, device="cuda")] + ([groups.cuda()] if groups is not None else [])
        lib[fname](*args)
        torch.cuda.synchronize()
        want = op.reference(x, act_input=a, group_offsets=groups,
                            **({"global_amax": kw["global_amax"]} if "given" in kw else {}))
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
            if getattr(want, f) is not None:
                assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), (fname, f)
        gd, wd = got.dbias.cpu().double(), want.dbias.double()
        ulp = torch.finfo(t).eps * wd.abs() + torch.finfo(t).tiny
        assert bool((((gd - wd).abs() <= ulp) | (gd == wd) | (gd.isnan() & wd.isnan())).all()), fname

    run(f"e_{fmt}_vec", {})
    if fmt == "nvfp4":
        run("e_nvfp4_vec_given", {"given": True, "global_amax": 300.0})
    if grouped:
        run("e_nvfp4_vec_grouped", {}, torch.tensor([0, 16, 16, 120, 200], dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("colwise", [False, True])
def test_gpu_grouped_given_amax_matches_reference(strict, colwise, dtype):
    """NVFP4's grouped calls with global_amax= on the kernels (the quantize pass alone, each
    group's entry written first; fp32 on the vectorised kernel): one value for every group and a
    [G] tensor of one per group (on the device, and changed in place between launches of a
    prepared call); every byte the reference's. CPU counterpart:
    test_grouped_rowwise_is_served_and_the_rest_falls_back and
    tests/test_kernels_nvfp4.py::test_given_amax_and_rng_operands (launch.given_amax_first)."""
    offs = torch.tensor([0, 6, 38, 38, 138, 144], dtype=torch.int32)
    m, n = 144, 272
    x = planted(m, n, DTYPES[dtype], seed=5)
    op = mxq.fused_quant(format="nvfp4", colwise=colwise)(ident)
    fields = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax")
    per_group = torch.tensor([300.0, 5.0, 1.0, 7.5, 2.0e4, 1.0])
    for given in (100.0, per_group):
        g_cuda = given.cuda() if isinstance(given, torch.Tensor) else given
        got = op(x.cuda(), group_offsets=offs.cuda(), global_amax=g_cuda)
        want = op.reference(x, group_offsets=offs, global_amax=given)
        for f in fields:
            if getattr(want, f) is not None:
                assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), (f, given)
    g_cuda = per_group.cuda()
    launch, out = op.prepare(x.cuda(), group_offsets=offs.cuda(), global_amax=g_cuda)
    for scale in (1.0, 0.5):
        g_cuda.copy_(per_group * scale)
        launch()
        want = op.reference(x, group_offsets=offs, global_amax=per_group * scale)
        for f in fields:
            if getattr(want, f) is not None:
                assert same_bytes(getattr(out, f).contiguous(), getattr(want, f).contiguous()), (f, scale)


def test_exported_fp4_gated_forward_takes_the_halves(tmp_path):
    """A gated FP4 forward exports its inner op over the [M, 2N] input's halves (strided views;
    GatedOp.export): the check passes the halves and [M, N] outputs to the compiled function and
    refuses outputs sized for 2N."""
    import tvm_ffi

    op = mxq.fused_quant(format="nvfp4", act="swiglu")(ident)
    info = op.export(tmp_path / "g", arch="sm_90", dtype="bf16", name="e_swiglu_fp4")
    assert info["functions"] == ["e_swiglu_fp4_vec", "e_swiglu_fp4_vec_given"]
    lib = tvm_ffi.load_module(info["library"])
    m, n = 64, 96
    x = torch.zeros(m, 2 * n, dtype=torch.bfloat16)

    def args(w):
        return [x[:, :n], x[:, n:], torch.zeros(m, w // 2, dtype=torch.uint8), torch.zeros(m * cdiv(w, 16), dtype=torch.uint8),
                torch.zeros(1), torch.zeros(1)]

    assert "device_type=cuda" in _error(lib["e_swiglu_fp4_vec"], *args(n))
    msg = _error(lib["e_swiglu_fp4_vec"], *args(2 * n))
    assert msg.startswith("ValueError") and "'mRowData'" in msg, msg


class _ADDR(dev.HOST):
    """device.RNG_DEVICE's 64-bit integers as Python ints (the store rules' ``ops``)."""

    I64 = staticmethod(int)


def _even_groups(m, g, seed):
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randint(0, m // 2 + 1, (g - 1,), generator=gen).tolist())
    ends = [2 * c for c in cuts] + [m]
    return list(zip([0, *ends[:-1]], ends))


def _shifted_stores(addr, w, nv, warps):
    """PackedKernel.store_fp4_shifted on ints: its stores (address, bytes, value) of run ``w``
    (``warps`` words) at byte address ``addr`` whose first ``nv`` bytes lie below the group's end."""
    from mxq.kernels import packed

    s = addr % 4
    aligned, out = addr - s, []
    for kk, i0, width, j0 in packed.fp4_shifted_plan(s, warps):
        word = packed.fp4_shifted_word(w, kk, s, warps, const=int, mask=0xFFFFFFFF)
        at = aligned + 4 * kk
        first, halves = packed.fp4_piece_stores(i0, width, j0)

        def piece(tries):
            (i, size, need), rest = tries[0], tries[1:]
            if need < nv:
                out.append((at + i, size, (word >> 8 * i) & (0xFFFF if size == 2 else 0xFF)))
            elif rest and rest[0][2] < nv:
                out.append((at + rest[0][0], 1, (word >> 8 * rest[0][0]) & 0xFF))

        if not halves:
            piece(first)
        elif j0 + 3 < nv:
            out.append((at, 4, word))
        else:
            for half in halves:
                piece(half[0])
    return out


@pytest.mark.parametrize("warps", [2, 4, 8])
def test_shifted_colwise_stores_write_the_run_below_its_end(warps):
    """packed.fp4_shifted_plan / fp4_piece_stores / fp4_shifted_word, as store_fp4_shifted issues
    them: for a run at every address % 4 and every count of bytes below its group's end, each
    of those bytes is written once with its own value (run byte j: byte j % 4 of word j // 4),
    nothing else, every store aligned to its size, and at most warps + 3 stores (a whole run:
    warps at address % 4 == 0, warps + 1 at 2, warps + 2 at 1 or 3; byte by byte took 4 warps)."""
    import random

    rng = random.Random(warps)
    for trial in range(20):
        w = [rng.getrandbits(32) for _ in range(warps)]
        run = [(w[j // 4] >> 8 * (j % 4)) & 0xFF for j in range(4 * warps)]
        for addr in (4096, 4097, 4098, 4099):
            for nv in range(1, 4 * warps + 1):
                stores = _shifted_stores(addr, w, nv, warps)
                wrote = {}
                for at, size, value in stores:
                    assert at % size == 0, (addr, nv, at, size)
                    for b in range(size):
                        assert at + b not in wrote, (addr, nv)
                        wrote[at + b] = (value >> 8 * b) & 0xFF
                assert wrote == {addr + j: run[j] for j in range(nv)}, (addr, nv)
                assert len(stores) <= warps + 3
                if nv == 4 * warps:
                    assert len(stores) == warps + [0, 2, 1, 2][addr % 4], (addr, len(stores))


@pytest.mark.parametrize("rows", [16, 32, 64])
def test_grouped_colwise_stores_write_each_byte_of_its_group_once(rows):
    """packed.fp4_group_store_words / fp4_run_stores / the shifted path, as store_fp4_columns issues
    them for a grouped call, against brute force: over random even group ends of M (% 8 == 0)
    rows and bases 16-byte aligned, every tile of every group (rows start + k * tile rows, below
    its end) writes each byte of the group's [start / 2, end / 2) of a column's M / 2 exactly
    once, word stores aligned to their size, nothing of another group's or past the row."""
    from mxq.kernels import packed

    warps = rows // 8
    for m in (8, 40, 96, 256):
        half = m // 2
        for seed in range(6):
            for base in (0, 2 ** 20 + 16):
                wrote = {}
                for g, (start, end) in enumerate(_even_groups(m, 5, seed + m)):
                    for r0 in range(start, end, rows):
                        end_t = min(r0 + rows, end)  # (the kernel's Ms: GroupTile.row_end)
                        words = packed.fp4_group_store_words(base | half | r0 // 2 | end_t // 2, warps, _ADDR)
                        addr = base + r0 // 2
                        if words:
                            stores = [(addr + 4 * q, 4 * n) for q, n in packed.fp4_run_stores(words, warps)
                                      if q == 0 or r0 + 8 * q < end_t]
                        else:
                            nv = min((end_t - r0 + 1) // 2, 4 * warps)
                            stores = [(at, size) for at, size, _ in _shifted_stores(addr, [0] * warps, nv, warps)]
                        for at, size in stores:
                            assert at % size == 0, (m, seed, g, r0)
                            for b in range(at, at + size):
                                assert b not in wrote and base + start // 2 <= b < base + end // 2, (m, seed, g, r0)
                                wrote[b] = g
                assert sorted(wrote) == list(range(base, base + half)), (m, seed)


@pytest.mark.parametrize("fmt, rows", [("nvfp4", 16), ("nvfp4", 32), ("nvfp4", 64), ("mxfp4", 32), ("mxfp4", 64)])
def test_grouped_colwise_scale_columns(fmt, rows):
    """packed.fp4_group_block on ints: every colwise block of every group's tiles lands on the
    column fp4_layouts places it (first_colwise_block + its index in the group), each once,
    inside the [N, M // B + G] buffer."""
    from mxq.formats import fp4_layouts
    from mxq.kernels import packed

    block = 16 if fmt == "nvfp4" else 32
    for m in (32, 96, 256, 1000):
        m -= m % 8
        groups = _even_groups(m, 7, m)
        seen = set()
        for g, (start, end) in enumerate(groups):
            for b, r0 in enumerate(range(start, end, rows)):
                for w0 in range(0, rows // 8, max(1, block // 8)):  # (each block's first warp)
                    if r0 + w0 * 8 >= end:
                        continue
                    col = packed.fp4_group_block(start, g, b, rows, w0, 8, block)
                    want = fp4_layouts.first_colwise_block(g, start, fmt) + (r0 + w0 * 8 - start) // block
                    assert col == want and col not in seen and col < m // block + len(groups), (m, g, b, w0)
                    seen.add(col)


def test_an_sm89_gpu_runs_fp4_on_the_reference(monkeypatch):
    """limits.fp4_unserved on an sm_89 device: FP4's encode has no form there, so the call runs
    the reference (with the fallback's warning) instead of failing to compile."""
    from mxq.runtime import limits

    class _OnAda:  # (a CUDA tensor's two attributes the check reads first)
        is_cuda = True
        device = "cuda:0"

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    for fmt in ("nvfp4", "mxfp4"):
        op = mxq.fused_quant(format=fmt)(ident)
        assert "sm_90 or newer" in limits.fp4_unserved(op.spec, op.epilogue, _OnAda(), None)
