"""NVFP4 on the kernels: rowwise 1x16 blocks of E2M1 elements (N % 16 == 0, aligned; the packed
kernel for bf16/fp16, the vectorised one for fp32), two launches with no host sync: the amax
pass (the op's values, their NaN-dropping amax) and the quantize pass (E4M3 scales under the
per-tensor scale, mxq/kernels/device.py nvfp4_global / nvfp4_scale / nvfp4_multiplier); with
``global_amax=`` the quantize pass alone (variant "vec_given"); stochastic rounding from 16-bit
inputs (Philox words per row, device.e2m1x8_sr). Everything else runs the reference
(limits.fp4_unserved).

CPU: what is served; the device expressions of the scales, Philox and the stochastic rule run on
torch tensors and ints against mxq/formats/fp4.py; the compiled passes per arch (sm_90a: the
integer E2M1 encode; sm_100a: cvt.rn.satfinite.e2m1x2.f32). GPU (marked gpu): every dtype,
layout and shape class against the torch reference byte for byte (data, scales, amax), planted
NaN/inf/ties/saturating values, zero blocks, subnormal scales, amax 0, a given amax (float,
tensor, under noop), fused ops, stochastic rounding's bytes, prepare() under a CUDA graph, and a
case against the oracle of tests/oracle_fp4.py.
"""

import math
import re
import struct
from dataclasses import replace
from fractions import Fraction

import pytest
import torch

import mxq
from mxq.frontend import codegen
from mxq.kernels import config as kconfig
from mxq.kernels import device as dev
from mxq.kernels import packed
from mxq.runtime import compiler, limits
from mxq.testing import planted, poisoned, same_bytes

from . import oracle_fp4 as oracle
from .checks import check_exact as _check
from .test_kernels_fp4 import PAIRS, bits_around

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FIELDS = ("rowwise_data", "rowwise_scale", "amax", "dbias")


def ident(x):
    return x


def scaled_shift(x, b, s: float = 1.5):
    return x * s + b


# -- what is served ------------------------------------------------------------------------------
def _unserved(op, x, call=None):
    return limits.unserved(op.spec, op.epilogue, x, lambda: None, call)


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("opts", [dict(), dict(scale_layout="swizzled"), dict(act="gelu"),
                                  dict(dact="relu", dbias=True), dict(stochastic_rounding=True),
                                  dict(colwise=True), dict(colwise=True, rowwise=False, stochastic_rounding=True)])
def test_served_calls(dtype, opts):
    op = mxq.fused_quant(format="nvfp4", **opts)(ident)
    for n in (16, 48, 208, 4096):
        why = _unserved(op, torch.zeros(24, n, dtype=dtype))
        assert why is None


def test_source_has_the_given_amax_launcher():
    src = mxq.fused_quant(format="nvfp4")(ident).source
    assert "def launch_vec_given(" in src and '"vec_given"' in src
    assert "launch_vec_given" not in mxq.fused_quant(format="mxfp4")(ident).source


class TORCH:
    """device.NV_DEVICE's operations on torch tensors: fp32 0-d or 1-d values (IEEE fp32
    arithmetic, one rounding each, as div.rn / mul.rn), int64 ones holding uint32 values, and
    the E4M3 conversion as cvt.rn.satfinite does it (RNE, saturating at 448)."""

    @staticmethod
    def U32(v):
        return v & 0xFFFFFFFF if isinstance(v, torch.Tensor) else torch.tensor(int(v) & 0xFFFFFFFF)

    @staticmethod
    def F32(v):
        return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float32)

    div = staticmethod(torch.div)
    mul = staticmethod(torch.mul)
    select = staticmethod(torch.where)

    @staticmethod
    def e4m3(x):
        return x.clamp(max=448.0).to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)

    @staticmethod
    def f32_bits(b):
        return b.to(torch.int32).view(torch.float32)

    @staticmethod
    def small_int_f32(u):
        return u.to(torch.float32)

    @staticmethod
    def e4m3_f32(e):  # (the device converts in hardware, exactly: the integer rule stands in here)
        return dev.e4m3_value(e, ops=TORCH)

    @staticmethod
    def rcp(x):  # (rcp.rn.f32: IEEE's reciprocal, one rounding)
        return torch.div(1.0, x)

    @staticmethod
    def e4m3x2(x0, x1):
        return TORCH.e4m3(x0) | (TORCH.e4m3(x1) << 8)

    @staticmethod
    def e4m3x2_f32(w):
        return dev.e4m3_value(w & 0xFF, ops=TORCH), dev.e4m3_value(w >> 8, ops=TORCH)


def _amaxes(g):
    """fp32 magnitudes of every kind the scales meet: 0, fp32 subnormals, E4M3's subnormal and
    zero-scale ranges, ordinary values, the largest finite, inf; plus random bit patterns."""
    pts = [0.0, 1e-45, 1e-40, 2.0 ** -126, 1e-10, 2.0 ** -10, 0.005, 0.03, 0.1, 1.0, 5.25, 6.0, 6.3, 448.0,
           2688.0, 3000.0, 1e20, 3.4028234663852886e38, float("inf")]
    rnd = torch.randint(0, 0x7F800000, (3000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    return torch.cat([torch.tensor(pts), rnd])


def test_scale_expressions_equal_the_reference():
    """device.nvfp4_global / nvfp4_scale / nvfp4_multiplier, the very expressions the kernels
    trace, on fp32 tensors (TORCH) against mxq/formats/fp4.py's steps N2, N4 and N5, for every
    pair of a global and a block amax drawn from _amaxes (block <= global, as in a tensor)."""
    from mxq.formats import fp4

    g = torch.Generator().manual_seed(41)
    ga = _amaxes(g)
    for gv in ga.tolist()[::7] + [0.0, 2688.0, float("inf"), 1e-40]:
        gt = torch.tensor(gv, dtype=torch.float32)
        sf, s_dec = dev.nvfp4_global(gt, ops=TORCH)
        s_enc = fp4.global_encode_scale(gt)
        assert torch.equal(s_dec, 1 / s_enc)
        blocks = ga[ga <= gv] if gv > 0 else torch.zeros(1)
        e = dev.nvfp4_scale(blocks, sf, ops=TORCH)
        want = fp4.block_scale(blocks, s_enc)
        assert torch.equal(e, want.view(torch.uint8).to(torch.int64)), gv
        mult = fp4.block_multiplier(want, s_enc)
        assert torch.equal(dev.nvfp4_multiplier(e, s_dec, ops=TORCH), mult), gv
        # two columns' at once (device.nvfp4_scales2): each block paired with the reversed order's
        w, m0, m1 = dev.nvfp4_scales2(blocks, blocks.flip(0), sf, s_dec, ops=TORCH)
        byte = want.view(torch.uint8).to(torch.int64)
        assert torch.equal(w, byte | (byte.flip(0) << 8)), gv
        assert torch.equal(m0, mult) and torch.equal(m1, mult.flip(0)), gv


def test_e4m3_decode_of_every_scale_byte():
    """device.e4m3_value_bits (normal bytes; the kernels' subnormal ones are mantissa * 2^-9) equal
    to torch's float8_e4m3fn decode and the oracle's, for every byte a scale can take (0..126)."""
    want = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    for e in range(127):
        if e >= 8:
            got = struct.unpack("<f", struct.pack("<I", dev.e4m3_value_bits(e, ops=dev.HOST)))[0]
        else:
            got = (e & 7) * dev.E4M3_SUBNORMAL_QUANTUM
        assert got == want[e] == float(oracle.e4m3_value(e)), e


def test_given_amax_and_rng_operands():
    """launch.given_amax_first writes the given amax (float or tensor) before the quantize pass,
    nothing under noop; launch.rng_tensor holds seed and offset as int64, a seed >= 2^63 as the
    same 64 bits."""
    from mxq.formats import fp4
    from mxq.runtime import launch

    ran = []
    amax = torch.zeros(())
    launch.given_amax_first(lambda *a: ran.append(a), amax, 7.5)(1, 2)
    assert amax.item() == 7.5 and ran == [(1, 2)]
    launch.given_amax_first(None, amax, torch.tensor([3.0]))()
    assert amax.item() == 3.0
    launch.given_amax_first(None, amax, 9.0, torch.ones(1))()
    assert amax.item() == 3.0
    launch.given_amax_first(None, amax, 9.0, torch.zeros(1))()
    assert amax.item() == 9.0
    groups = torch.zeros(3)  # (a grouped call's amax [G]: one value for every group, or one per group)
    launch.given_amax_first(None, groups, 2.0)()
    assert groups.tolist() == [2.0, 2.0, 2.0]
    launch.given_amax_first(None, groups, torch.tensor([4.0]))()
    assert groups.tolist() == [4.0, 4.0, 4.0]
    launch.given_amax_first(None, groups, torch.tensor([1.0, 5.0, 6.0]))()
    assert groups.tolist() == [1.0, 5.0, 6.0]
    launch.given_amax_first(None, groups, torch.tensor([7.0, 8.0, 9.0]), torch.tensor([1.0]))()
    assert groups.tolist() == [1.0, 5.0, 6.0]
    # an amax that requires grad (a tensor, a [2] pair, two one-element tensors, under noop too)
    # gives a slot that does not: the outputs are data
    for slot, given, noop in ((torch.zeros(()), torch.tensor([3.0], requires_grad=True), None),
                              (torch.zeros(2), torch.tensor([2.0, 3.0], requires_grad=True), None),
                              (torch.zeros(2), (torch.tensor(2.0, requires_grad=True), torch.tensor([3.0])), None),
                              (torch.zeros(2), torch.tensor([2.0, 3.0], requires_grad=True), torch.zeros(1))):
        launch.given_amax_first(None, slot, given, noop)()
        assert not slot.requires_grad and slot.reshape(-1)[-1].item() == 3.0
    r = launch.rng_tensor(fp4.CallArgs(seed=2 ** 64 - 5, offset=2 ** 40), "cpu", 64, 64)
    assert r.dtype == torch.int64 and r.tolist() == [-5, 2 ** 40]
    assert launch.rng_tensor(None, "cpu", 64, 64)[1].item() == 0


# -- compiled code ---------------------------------------------------------------------------------
def _ptx(op, arch, dtype, variant="vec"):
    return compiler.compile_op(op, arch, dtype, keep_ptx=True, variant=variant).__ptx__


@pytest.mark.parametrize("arch, dtype, layout", [("sm_90a", "bf16", "compact"), ("sm_100a", "fp16", "swizzled"),
                                                 ("sm_90a", "fp32", "swizzled")])
def test_two_passes_compile_per_arch(arch, dtype, layout):
    op = mxq.fused_quant(format="nvfp4", scale_layout=layout)(ident)
    ptx = _ptx(op, arch, dtype)
    assert f".target {arch}" in ptx
    # amax zeroed, the amax pass (one atomic max per owner warp), the quantize pass
    assert ptx.count(".entry") == 3 and ptx.count("red.relaxed.gpu.global.max.s32") == 1
    assert "max.NaN.bf16x2" not in ptx and "max.NaN.f16x2" not in ptx  # (NaN enters no packed maximum)
    assert "0f45280000" in ptx and "0f3E2AAAAB" in ptx  # S_enc = 2688 / amax; S_enc * fp32(1/6)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx  # the E4M3 scales
    cvts = ptx.count("cvt.rn.satfinite.e2m1x2.f32")
    if arch == "sm_100a":
        assert cvts > 0 and cvts % 4 == 0
    else:  # no FP4 conversion on Hopper: the integer encode two at a time, fp32 products rounded to odd
        assert cvts == 0 and "min.u16x2" in ptx and "fma.rn.bf16x2" in ptx and "mul.rn.bf16x2" not in ptx
        assert "0x7632" in ptx or "30258" in ptx  # (bf16x2_rto's prmt of the high halves)
    given = _ptx(op, arch, dtype, "vec_given")  # the quantize pass alone
    assert given.count(".entry") == 1 and "global.max" not in given and "0f45280000" in given


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_stochastic_rounding_compiles_to_the_integer_rule(arch):
    """Philox's rounds (20 mul.hi each) and the stochastic rule on fp16 pairs (one
    cvt.rz.f16x2.f32 and one min.f16x2 per two values) on both archs (sm_100a's cvt.rs is not
    used: not yet checked on a Blackwell). A thread's 8 rows: 4 Philox shared by neighbour lanes
    where the rows' words start on a counter, else 8 (2 lane swaps per row pair either way); the
    colwise copy the same, shared by the two warps of a 16-row group. Each copy's encode is
    compiled twice, its multipliers taken times 2^-14 or not (one vote: PackedKernel.sr_prescaled),
    the rows' words with each."""
    op = mxq.fused_quant(format="nvfp4", stochastic_rounding=True)(ident)
    ptx = _ptx(op, arch, "bf16")
    assert ptx.count(".entry") == 3 and ptx.count("mul.hi.u32") == 20 * 2 * (4 + 8)
    assert "-766435501" in ptx or "3528531795" in ptx  # (Philox's first multiplier, 0xD2511F53)
    assert "e2m1x2" not in ptx and "cvt.rs" not in ptx and ptx.count("cvt.rz.f16x2.f32") == 2 * 32
    assert ptx.count("min.f16x2") == 2 * 32 and ptx.count("vote.sync.all") == 1
    rn = _ptx(mxq.fused_quant(format="nvfp4")(ident), arch, "bf16")
    swaps = re.compile(r"shfl\.sync\.bfly\.b32[^;]*, 1, 31, -1;")
    assert len(swaps.findall(ptx)) - len(swaps.findall(rn)) == 2 * (8 + 8)
    both = _ptx(mxq.fused_quant(format="nvfp4", stochastic_rounding=True, colwise=True)(ident), arch, "bf16")
    assert both.count("mul.hi.u32") == 20 * (2 * (4 + 8) + 4 + 8) and both.count("cvt.rz.f16x2.f32") == 2 * 64
    col = _ptx(mxq.fused_quant(format="nvfp4", stochastic_rounding=True, colwise=True, rowwise=False)(ident), arch,
               "bf16")  # (the colwise copy alone: served, so compiled here too)
    assert col.count("mul.hi.u32") == 20 * (4 + 8) and col.count("cvt.rz.f16x2.f32") == 2 * 32


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_fp32_stochastic_rounding_compiles(arch):
    """fp32 on the vectorised kernel: the same Philox rounds and rule as the packed kernel; a
    thread's 8 rows as 4 row pairs, each one Philox shared by neighbour lanes where the words start
    on a counter, else two (both compiled: 12 a thread); each of its 8 columns half of its 16-row
    group's words, one Philox or two (24), unshared; no spills on sm_90; grouped calls are named
    (fp4_layouts.grouped_gap, validation's rule). GPU counterparts: test_stochastic_rounding_matches_reference,
    test_colwise_copy_matches_reference (fp32)."""
    import shutil

    from mxq.runtime.call import Call

    rows = _ptx(mxq.fused_quant(format="nvfp4", stochastic_rounding=True)(ident), arch, "fp32")
    assert rows.count("mul.hi.u32") == 20 * 12 and "cvt.rs" not in rows and "e2m1x2" not in rows
    op = mxq.fused_quant(format="nvfp4", stochastic_rounding=True, colwise=True)(ident)
    both = _ptx(op, arch, "fp32")
    assert both.count("mul.hi.u32") == 20 * (12 + 24) and both.count("cvt.rz.f16x2.f32") == 64  # (no prescaled twin)
    x = torch.zeros(16, 256)
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None) is None
    grouped = Call([x], [], group_offsets=torch.tensor([16], dtype=torch.int32))
    assert "stochastic_rounding" in limits.unserved(op.spec, op.epilogue, x, lambda: None, grouped)  # (validation's)
    if arch == "sm_90a" and shutil.which("ptxas") is not None:
        from .test_gemm_epilogue import _ptxas_output

        assert all(b == "0" for b in re.findall(r"(\d+) bytes spill stores", _ptxas_output(both)))


@pytest.mark.parametrize("arch, dtype, layout", [("sm_90a", "bf16", "swizzled"), ("sm_100a", "fp16", "compact")])
def test_colwise_copy_compiles(arch, dtype, layout):
    """The transposed copy: 32-row tiles of four 8-row warps, each thread's 8 columns as one word
    of 8 codes each, staged in shared memory and leaving as one 16-byte run (the four warps'
    words) per output row: 256 columns over 128 threads, two runs per thread, each as one
    16-byte store, two 8-byte or four 4-byte ones (store_fp4_columns, by the copy's alignment);
    8 column scales (both 16-row blocks' from one thread's rows: its own block's), two per E4M3
    conversion (device.nvfp4_scales2), the block's two warps computing half of them each
    (PackedKernel.fp4_split_column_scales)."""
    both = _ptx(mxq.fused_quant(format="nvfp4", colwise=True, scale_layout=layout)(ident), arch, dtype)
    col = _ptx(mxq.fused_quant(format="nvfp4", colwise=True, rowwise=False, scale_layout=layout)(ident), arch,
               dtype)
    assert both.count(".entry") == col.count(".entry") == 3
    assert col.count("st.global.v4.b32") == both.count("st.global.v4.b32") == 2
    assert col.count("st.global.v2.b32") == both.count("st.global.v2.b32") == 4
    assert _stores(col)[2] == 8 and both.count("st.global.b32") > col.count("st.global.b32")
    assert col.count("cvt.rn.satfinite.e4m3x2.f32") == 2 and col.count("cvt.rn.f16x2.e4m3x2") == 2
    if arch == "sm_100a":
        assert col.count("cvt.rn.satfinite.e2m1x2.f32") == 32


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("rows, v4, v2, b32", [(16, 0, 4, 8), (64, 2, 4, 8)])
def test_colwise_tiles_compile(arch, rows, v4, v2, b32):
    """Tuning.fp4_col_rows' other tiles: 16 rows (two warps: an 8-byte run, no 16-byte store,
    four columns a thread), 64 rows (eight warps: a 32-byte run as two 16-byte, four 8-byte or
    eight 4-byte stores, one column a thread)."""
    op = mxq.fused_quant(format="nvfp4", colwise=True, rowwise=False)(ident)._with_tuning(
        kconfig.Tuning(fp4_col_rows=rows))
    ptx = _ptx(op, arch, "bf16")
    assert ptx.count(".entry") == 3
    assert _stores(ptx) == (v4, v2, b32)


def _stores(ptx):
    """The 16-, 8- and 4-byte global stores of the quantize pass (the entry with stores of FP4
    codes; the amax passes store nothing but their amax)."""
    entry = max(ptx.split(".entry")[1:], key=lambda e: e.count("st.global.v"))
    return tuple(entry.count(f"st.global{v}.b32") for v in (".v4", ".v2", ""))


def test_colwise_tile_config():
    """NVFP4's colwise copy takes FP4_COL_ROWS (64) rows of 8-row warps (32 with stochastic
    rounding or the Hadamard transform), or Tuning.fp4_col_rows; its rowwise-only casts and every
    other format keep their tiles."""
    def cfg(tuning=None, **opts):
        op = mxq.fused_quant(**opts)(ident)
        c = codegen.kernel_config(op.spec, op.epilogue)
        return replace(c.global_passes()[1] if c.global_passes() else c, tuning=tuning)

    both = cfg(format="nvfp4", colwise=True)
    assert kconfig.FP4_COL_ROWS == 64 and both.fp4_columns and both.tile_rows == 64
    assert both.packed_warps() == both.packed_warps(True) == 8 and both.min_blocks == 0 and both.rows8_warps() is None
    for drawn in ({"stochastic_rounding": True}, {"hadamard": True}):
        assert cfg(format="nvfp4", colwise=True, **drawn).tile_rows == kconfig.FP4_COL_ROWS_DRAWN == 32
    assert [b.name for b in both.packed_buffers([], False)] == ["max", "fp4t"]  # (no "inv": scales in registers)
    for rows in kconfig.FP4_COL_TILES:  # (stochastic rounding: each warp pair's words of its 8 columns, 4 per lane)
        sr = cfg(kconfig.Tuning(fp4_col_rows=rows), format="nvfp4", colwise=True, stochastic_rounding=True)
        bufs = {b.name: b for b in sr.packed_buffers([], False)}
        assert list(bufs) == ["max", "fp4t", "srx"] and bufs["srx"].shape == (rows // 16, 8, 2, 32, 2)
    for rows in kconfig.FP4_COL_TILES:
        c = cfg(kconfig.Tuning(fp4_col_rows=rows), format="nvfp4", colwise=True, rowwise=False)
        assert (c.tile_rows, c.packed_warps()) == (rows, rows // 8) and c.min_blocks == 0
    with pytest.raises(ValueError, match="fp4_col_rows"):
        kconfig.Tuning(fp4_col_rows=128)
    # many epilogue tensors: 64 rows of six full ones fit a CTA's shared memory staged whole, of
    # seven not (7 x 256 threads x 8 rows x 16 bytes alone is 229,376 of 232,448): 32 rows, which
    # fit 13 (the README's bound) and are served
    from .test_validation import _seven_for_smem, _six_for_smem, _thirteen

    x = torch.zeros(64, 256, dtype=torch.bfloat16)
    for fn, rows in ((_six_for_smem, 64), (_seven_for_smem, 32), (_thirteen, 32)):
        for fmt in ("nvfp4", "mxfp4"):
            op = mxq.fused_quant(format=fmt, colwise=True)(fn)
            c = codegen.kernel_config(op.spec, op.epilogue)
            c = c.global_passes()[1] if c.global_passes() else c
            assert c.tile_rows == rows and c.fp4_tall_fits == (rows == 64) and op._unserved(x) is None, (fmt, fn)
    tuned = kconfig.Tuning(fp4_col_rows=64)
    for opts, rows, warps in ((dict(format="nvfp4"), 32, 4), (dict(colwise=True), 32, 4),
                              (dict(colwise=True, dbias=True), 32, 8),
                              (dict(format="fp8_block", colwise=True), 128, 16), (dict(format="mxfp4"), 32, 4)):
        for c in (cfg(**opts), cfg(tuned, **opts)):
            assert not c.fp4_columns and (c.tile_rows, c.pk_warps) == (rows, warps), opts


class ADDR(dev.HOST):
    """device.RNG_DEVICE's 64-bit integers as Python ints."""

    I64 = staticmethod(int)


@pytest.mark.parametrize("rows", [16, 32, 64])
def test_colwise_run_stores_write_each_byte_once(rows):
    """packed.fp4_store_words / fp4_run_stores, as store_fp4_columns issues them, against brute
    force: over every row tile of M (% 8 == 0) rows and columns whose row bytes start at any
    4-byte offset, each byte of a column's M / 2 is written once, by the store of its 8 rows'
    word, every store aligned to its size, nothing outside the row."""
    warps = rows // 8
    for m in range(8, 8 * 26, 8):
        half = m // 2
        for base in (0, 4, 8, 12, 2 ** 20 + 16):
            a = base | half
            words = packed.fp4_store_words(a, warps, ADDR)
            assert words == (4 if a % 16 == 0 and warps >= 4 else 2 if a % 8 == 0 else 1)
            for oc in range(3):
                start = base + oc * half
                wrote = {}
                for r0 in range(0, m, rows):  # (the grid's row tiles; the kernel stores below M only)
                    addr = start + r0 // 2
                    for q, n in packed.fp4_run_stores(words, warps):
                        if q == 0 or r0 + 8 * q < m:
                            assert (addr + 4 * q) % (4 * n) == 0, (m, base, oc, r0, q)
                            for b in range(4 * n):
                                pos = addr + 4 * q + b
                                assert pos not in wrote, (m, base, oc, r0, q)
                                wrote[pos] = r0 // 8 + q + b // 4  # (the word of rows 8 * that ..)
                assert wrote == {start + b: b // 4 for b in range(half)}, (m, base, oc)


def test_colwise_scale_warps():
    """packed.fp4_scale_warps against brute force: the warps whose 8 rows lie in warp w's 16-row
    block are w0 .. w0 + wpb - 1, w0 the first of them (the one that stores the block's scales),
    on every tile; 16-row warps hold a block alone."""
    for tile in (16, 32, 64, 128):
        for rows in (8, 16):
            for w in range(tile // rows):
                same = [v for v in range(tile // rows) if v * rows // 16 == w * rows // 16]
                w0, wpb = packed.fp4_scale_warps(w, rows)
                assert list(range(w0, w0 + wpb)) == same and (w0 * rows) // 16 == (w * rows) // 16


def test_fused_ops_compile():
    for op, dtype in ((mxq.fused_quant(format="nvfp4", act="gelu")(ident), "bf16"),
                      (mxq.fused_quant(format="nvfp4", dact="relu", dbias=True)(ident), "fp32"),
                      (mxq.fused_quant(format="nvfp4")(scaled_shift), "bf16")):
        assert "cvt.rn.satfinite.e2m1x2.f32" in _ptx(op, "sm_100a", dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_unaligned_variants_refuse_to_trace(dtype):
    op = mxq.fused_quant(format="nvfp4")(ident)
    with pytest.raises(Exception, match="NVFP4"):
        _ptx(op, "sm_90a", dtype, "generic")


# -- on the device -----------------------------------------------------------------------------
@pytest.fixture
def strict(monkeypatch):
    """No fallback: every call here is one the kernels serve (MXQ_STRICT=1 raises otherwise)."""
    monkeypatch.setenv("MXQ_STRICT", "1")


def _specials(m, n, dtype, seed):
    """planted finite data plus NVFP4's edge blocks under the tensor amax 2688 (S_enc = 1): ties
    of the E2M1 grid at block scale 1, a block whose scale rounds down so its maximum saturates
    (6.3 -> 6), a subnormal E4M3 scale (block amax 0.03), a block too small for any scale (byte
    0: multiplier FLT_MAX), a block of NaN alone, a zero row."""
    x = planted(m, n, torch.float32, seed=seed, specials=False)
    if m >= 4 and n >= 48:
        x[0, 0] = 2688.0  # (the tensor amax: S_enc = 1)
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.1, 5.5, -5.9, 6.0, 0.0, -0.0, 1.0, 3.0])
        x[0, 16:32] = ties  # (block amax 6: scale 1, multiplier 1)
        x[1, :16] = torch.linspace(-0.03, 0.03, 16)  # scale 0.005: a subnormal E4M3 byte
        x[1, 16:32] = float("nan")
        x[1, 32:48] = 2.0 ** -10  # scale below E4M3's least subnormal: byte 0
        x[2, :n] = 0.0
        x[3, 32:48] = torch.tensor([6.3, -6.25, float("nan")] + [1.0] * 13)
    if m >= 48 and n >= 48:  # (the colwise copy's later 16-row blocks: a column block of NaN alone,
        x[16:32, 3] = float("nan")  # one too small for any scale, one of E2M1 ties at scale 1)
        x[32:48, 4] = 2.0 ** -10
        x[32:48, 5] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.1, 5.5, -5.9, 6.0, 0.0, -0.0,
                                    1.0, 3.0])
    return x.to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 1000])
@pytest.mark.parametrize("n", [16, 48, 208, 4096])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_rowwise_matches_reference(strict, m, n, dtype, layout):
    op = mxq.fused_quant(format="nvfp4", scale_layout=layout)(ident)
    x = _specials(m, n, DTYPES[dtype], seed=m + n)
    _check(op, [x], op(x.cuda()))
    _check(op, [x], op(x.cuda(), out=poisoned(op, x.cuda())))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_specials_and_finite_tensors(strict, dtype):
    """The planted specials (inf makes the amax inf: S_enc 1), a finite tensor (a real S_enc),
    a tensor of zeros and NaN alone (amax 0), tiny values (subnormal scales everywhere)."""
    t = DTYPES[dtype]
    op = mxq.fused_quant(format="nvfp4")(ident)
    for x in (planted(64, 256, t, seed=3), planted(64, 256, t, seed=4, specials=False),
              torch.zeros(8, 64, dtype=t).index_fill_(1, torch.tensor([3, 40]), float("nan")),
              (planted(16, 64, torch.float32, seed=5, specials=False) * 1e-4).to(t)):
        got = op(x.cuda())
        _check(op, [x], got)


def _fp32(v) -> float:
    """``v`` rounded to fp32, as the amax slot holds it (1e-3 is not an fp32 value)."""
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


def _given_amax_case(dtype, device):
    """A given amax (float, tensor, 0) is the amax slot's fp32 value and the scales' base: the
    planted inf makes the computed amax inf, so an amax pass that ran would show; under noop
    nothing is written, the amax included."""
    op = mxq.fused_quant(format="nvfp4")(ident)
    x = _specials(70, 384, DTYPES[dtype], seed=11)
    for given in (100.0, 1e-3, 0.0, torch.tensor(3000.0)):
        got = op(x.to(device), global_amax=given.to(device) if isinstance(given, torch.Tensor) else given)
        _check(op, [x], got, global_amax=given)
        assert got.amax.item() == _fp32(given)
    out = op(x.to(device))
    before = [getattr(out, f).clone() for f in FIELDS[:3]]
    noop = torch.ones(1, device=device)
    op(x.to(device), out=out, noop=noop, global_amax=5.0)
    assert all(torch.equal(b, getattr(out, f)) for b, f in zip(before, FIELDS[:3]))


def test_given_amax_on_cpu():
    """_given_amax_case on the reference (the GPU test's expectations hold there too)."""
    _given_amax_case("bf16", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_given_amax_skips_the_first_pass(strict, dtype):
    _given_amax_case(dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_ops_match_reference(strict, dtype):
    t = DTYPES[dtype]
    x, b = _specials(70, 384, t, seed=1), planted(1, 384, t, seed=2, specials=False).reshape(384)
    relu = mxq.fused_quant(format="nvfp4", act="relu")(ident)
    _check(relu, [x], relu(x.cuda()))
    epi = mxq.fused_quant(format="nvfp4", scale_layout="swizzled")(scaled_shift)
    _check(epi, [x, b], epi(x.cuda(), b.cuda()))
    drelu = mxq.fused_quant(format="nvfp4", dact="relu", dbias=True)(ident)
    a = planted(70, 384, t, seed=5)
    _check(drelu, [x], drelu(x.cuda(), act_input=a.cuda()), act_input=a)
    y = _specials(4, 4096, t, seed=6).reshape(4, 2, 2048)  # (leading dims)
    _check(relu, [y], relu(y.cuda()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m, n, layout", [(1, 16, "compact"), (5, 48, "swizzled"), (1000, 4096, "compact")])
def test_stochastic_rounding_matches_reference(strict, dtype, m, n, layout):
    """The same Philox bytes and rule as the reference (docs/NUMERICS.md): byte for byte, for
    seeds and offsets of every width (a seed of 2^63 or more, offsets past 2^32) and offset % 4
    (0: neighbour lanes sharing Philox), a given amax, values near bf16's largest (multipliers
    that 2^-14 would take below fp32's normals: PackedKernel.sr_prescaled's other path); fp32 on
    the vectorised kernel (each value scaled apart). CPU counterparts:
    test_stochastic_rounding_compiles_to_the_integer_rule, test_fp32_stochastic_rounding_compiles."""
    op = mxq.fused_quant(format="nvfp4", stochastic_rounding=True, scale_layout=layout)(ident)
    x = _specials(m, n, DTYPES[dtype], seed=m + 3)
    for seed, offset in ((1, 0), (2 ** 40 + 7, 12345), (2 ** 64 - 5, 2 ** 33 + 3), (2 ** 63 + 1, 2 ** 34 + 4),
                         (6, 2 ** 32 - 2)):
        _check(op, [x], op(x.cuda(), seed=seed, offset=offset), seed=seed, offset=offset)
    _check(op, [x], op(x.cuda(), seed=9, offset=2, global_amax=50.0), seed=9, offset=2, global_amax=50.0)
    relu = mxq.fused_quant(format="nvfp4", stochastic_rounding=True, act="relu")(ident)
    _check(relu, [x], relu(x.cuda(), seed=4, offset=1), seed=4, offset=1)
    if dtype in ("bf16", "fp32"):  # (a global amax near 2^122: multipliers below 2^-112, each value scaled apart)
        big = (torch.randn(m, n, generator=torch.Generator().manual_seed(m)) * 2.0 ** 120).to(DTYPES[dtype])
        for offset in (4, 2 ** 33 + 3):  # (and words straddling two counters: two Philox per 16 values)
            _check(op, [big], op(big.cuda(), seed=3, offset=offset), seed=3, offset=offset)


@pytest.mark.gpu
def test_a_seed_left_none_follows_the_cuda_generator(strict):
    """Stochastic rounding with no seed on the kernels: torch's CUDA generator's seed and Philox
    offset (the bytes the reference gives with them), the offset advanced by the words drawn,
    so a second call draws other words and torch.cuda.manual_seed repeats the first
    (fp4.seed_and_offset). CPU counterpart: tests/test_fp4.py::test_a_seed_left_none_follows_the_cuda_generator."""
    from mxq.formats import fp4

    x = planted(64, 256, torch.bfloat16, seed=5)
    xc = x.cuda()
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    kw = dict(format="nvfp4", stochastic_rounding=True, colwise=True)
    torch.cuda.manual_seed(11)
    start = gen.get_offset()
    first = mxq.quantize(xc, **kw)
    assert gen.get_offset() == start + -(-fp4.words_drawn(64, 256) // 4) * 4
    want = mxq.quantize(x, seed=11, offset=start, **kw)
    fields = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax")
    for f in fields:
        assert same_bytes(getattr(first, f).cpu(), getattr(want, f)), f
    second = mxq.quantize(xc, **kw)
    assert not torch.equal(second.rowwise_data.cpu(), first.rowwise_data.cpu())
    torch.cuda.manual_seed(11)
    again = mxq.quantize(xc, **kw)
    for f in fields:
        assert same_bytes(getattr(again, f).cpu(), getattr(first, f).cpu()), f


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m, n", [(8, 16), (16, 272), (24, 48), (48, 528), (80, 16), (96, 48), (1000, 208),
                                  (4096, 4096)])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_colwise_copy_matches_reference(strict, dtype, m, n, layout):
    """The transposed copy [N, M/2] and its [N, ceil(M/16)] scales on the 32-row tile: M % 32 of
    0 (16-byte stores), 16 (a last tile of one block: 8-byte stores) and 8 or 24 (M % 16 == 8: a
    partial last block, 4-byte stores); N a multiple of the 256-column tile or not; with and
    without the rowwise copy, a given amax, an act, stochastic rounding (offsets % 4 of 1, 0 and
    2; the colwise copy alone at 0: where M % 16 == 0 the two warps of a 16-row group share
    their Philox)."""
    t = DTYPES[dtype]
    x = _specials(m, n, t, seed=m * 7 + n)
    both = mxq.fused_quant(format="nvfp4", colwise=True, scale_layout=layout)(ident)
    for got, kw in ((both(x.cuda()), {}), (both(x.cuda(), global_amax=300.0), {"global_amax": 300.0}),
                    (both(x.cuda(), out=poisoned(both, x.cuda())), {})):
        want = both.reference(x, **kw)
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
            assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), f
    for opts, kw in ((dict(rowwise=False), {}), (dict(act="relu"), {}),
                     (dict(stochastic_rounding=True), {"seed": 3, "offset": 2 ** 35 + 1}),
                     (dict(stochastic_rounding=True), {"seed": 2 ** 63 + 9, "offset": 2 ** 34}),
                     (dict(stochastic_rounding=True), {"seed": 5, "offset": 6}),
                     (dict(stochastic_rounding=True, rowwise=False), {"seed": 13, "offset": 8})):
        op = mxq.fused_quant(format="nvfp4", colwise=True, scale_layout=layout, **opts)(ident)
        got, want = op(x.cuda(), **kw), op.reference(x, **kw)
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
            if getattr(want, f) is not None:
                assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), (opts, f)
    if t is torch.bfloat16:  # (stochastic rounding with multipliers below 2^-112: each value scaled apart)
        big = (torch.randn(m, n, generator=torch.Generator().manual_seed(n)) * 2.0 ** 120).to(t)
        op = mxq.fused_quant(format="nvfp4", colwise=True, scale_layout=layout, stochastic_rounding=True)(ident)
        for offset in (8, 2 ** 33 + 5):  # (and words straddling two counters)
            got, want = op(big.cuda(), seed=2, offset=offset), op.reference(big, seed=2, offset=offset)
            for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
                assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), ("big", offset, f)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("opts", [dict(), dict(rowwise=False, scale_layout="swizzled"), dict(act="gelu", dbias=True)])
def test_fp32_colwise_copy_compiles(arch, opts):
    """The colwise copy from fp32 on the vectorised kernel (two launches: the amax pass, then
    the quantize pass): FP4_COL_ROWS / 8 warps of 8 rows, a 16-row block two of them (fp4_scale_warps), each
    thread's 8 rows of a column one word of codes (8 four-byte stores, 8 more for the rowwise
    rows), 8 column-scale bytes a thread (each block's first warp stores them), NaN-dropping
    column maxima; grouped calls served too (test_grouped_colwise_compiles). GPU counterpart:
    test_gpu_fp32_colwise_dbias_matches_reference, test_colwise_copy_matches_reference (fp32)."""
    from mxq.runtime.call import Call

    op = mxq.fused_quant(format="nvfp4", colwise=True, **opts)(ident)
    x = torch.zeros(24, 256)
    assert limits.unserved(op.spec, op.epilogue, x, lambda: None) is None
    grouped = Call([x], [], group_offsets=torch.tensor([24], dtype=torch.int32))
    why = limits.unserved(op.spec, op.epilogue, x, lambda: None, grouped)  # (grouped scales: compact alone)
    assert why is None if op.spec.scale_layout == "compact" else "compact" in why
    ptx = _ptx(mxq.fused_quant(format="nvfp4", colwise=True, amax=True, **opts)(ident), arch, "fp32")
    vec = max(ptx.split(".entry")[1:], key=lambda e: e.count("st.global.b32"))
    both = opts.get("rowwise", True)
    assert vec.count("st.global.b32") == 8 * (2 if both else 1) and vec.count("st.global.b8 ") >= 8
    assert f".reqntid {kconfig.FP4_COL_ROWS * 4}, 1, 1" in ptx and "max.NaN" not in vec
    if arch == "sm_100a":
        assert vec.count("cvt.rn.satfinite.e2m1x2.f32") == 32 * (2 if both else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(8, 16), (16, 272), (24, 48), (48, 528), (1000, 208), (4096, 4096)])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_gpu_fp32_colwise_dbias_matches_reference(strict, m, n, layout):
    """The transposed copy from fp32 on the vectorised kernel beside drelu + dbias (dbias within an
    ulp), alone and with the rowwise copy (test_colwise_copy_matches_reference runs the plain
    casts, an act and stochastic rounding from fp32). CPU counterpart: test_fp32_colwise_copy_compiles."""
    x = _specials(m, n, torch.float32, seed=m * 7 + n)
    a = planted(m, n, torch.float32, seed=m)
    for opts in (dict(rowwise=False), dict()):
        op = mxq.fused_quant(format="nvfp4", colwise=True, scale_layout=layout, dact="relu", dbias=True, **opts)(ident)
        _check(op, [x], op(x.cuda(), act_input=a.cuda()), act_input=a)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 64])
@pytest.mark.parametrize("m, n", [(16, 48), (48, 272), (80, 16), (200, 208), (1024, 528)])
def test_colwise_tiles_match_reference(strict, rows, m, n):
    """Tuning.fp4_col_rows' other tiles, the 64-row one with M % 64 of 16, 48, 8 and 0: both
    directions, the colwise copy alone, stochastic rounding (offsets % 4 of 1 and 0: 16-row groups
    of M % 16 == 0 share their Philox between their warps), byte for byte."""
    x = _specials(m, n, torch.bfloat16, seed=m + n + rows)
    for opts, kw in ((dict(), {}), (dict(rowwise=False, scale_layout="swizzled"), {}),
                     (dict(stochastic_rounding=True), {"seed": 7, "offset": 2 ** 33 + 1}),
                     (dict(stochastic_rounding=True), {"seed": 9, "offset": 2 ** 33 + 4})):
        op = mxq.fused_quant(format="nvfp4", colwise=True, **opts)(ident)._with_tuning(
            kconfig.Tuning(fp4_col_rows=rows))
        got, want = op(x.cuda(), **kw), op.reference(x, **kw)
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
            if getattr(want, f) is not None:
                assert same_bytes(getattr(got, f).contiguous(), getattr(want, f).contiguous()), (opts, f)


@pytest.mark.gpu
def test_prepare_under_a_cuda_graph(strict):
    """Both passes (and the given amax's copy) replay from a graph; the amax follows the input."""
    op = mxq.fused_quant(format="nvfp4")(ident)
    x = planted(256, 512, torch.bfloat16, seed=7, specials=False).cuda()
    for kw in ({}, {"global_amax": torch.tensor(40.0, device="cuda")}):
        launch, out = op.prepare(x, **kw)
        launch()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch()
        x.mul_(2.0)
        if kw:
            kw["global_amax"].fill_(80.0)
        g.replay()
        torch.cuda.synchronize()
        ref_kw = {k: v.cpu() for k, v in kw.items()}
        _check(op, [x.cpu()], out, **ref_kw)


@pytest.mark.gpu
def test_unserved_shapes_fall_back_with_the_reference(monkeypatch):
    op = mxq.fused_quant(format="nvfp4")(ident)
    x = planted(5, 40, torch.bfloat16, seed=8)  # N % 16 != 0
    _check(op, [x], op(x.cuda()))  # (after a one-time warning)
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(RuntimeError, match="N % 16"):
        op(x.cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernels_match_the_oracle(strict, dtype):
    x = _specials(4, 96, DTYPES[dtype], seed=9)
    got = mxq.quantize(x.cuda(), format="nvfp4")
    v = x.float().tolist()
    ga = oracle.amax([e for row in v for e in row])
    assert got.amax.item() == ga
    codes, scales = oracle.nvfp4(v, ga)
    assert got.rowwise_data.cpu().tolist() == oracle.pack(codes)
    assert got.rowwise_scale.cpu().view(torch.uint8).tolist() == scales


# -- stochastic rounding's device expressions (CPU) ----------------------------------------------------
class RNG_HOST(dev.HOST):
    """device.RNG_DEVICE's multiplies on Python ints."""

    @staticmethod
    def mulhi(a, b):
        return (a * b) >> 32 & 0xFFFFFFFF

    @staticmethod
    def mullo(a, b):
        return a * b & 0xFFFFFFFF


def test_philox_rounds_equal_the_reference():
    from mxq.formats import fp4

    g = torch.Generator().manual_seed(5)
    words = torch.randint(0, 2 ** 32, (20, 6), generator=g, dtype=torch.int64).tolist()
    for c0, c1, c2, c3, k0, k1 in words + [[0] * 6, [0xFFFFFFFF] * 6]:
        got = dev.philox((c0, c1, c2, c3), (k0, k1), ops=RNG_HOST)
        want = fp4.philox(tuple(torch.tensor([v]) for v in (c0, c1, c2, c3)), (k0, k1))
        assert list(got) == [int(w) for w in want]


def _f32_rn(x: float) -> int:
    """fp32 bits of the float64 ``x`` rounded to nearest even (subnormals included)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _f16_rz(b: int) -> int:
    """cvt.rz.f16.f32 of the fp32 bits ``b``, from IEEE's definition: the fp16 at or below |x|
    (subnormals kept, a finite value past the range the largest finite, inf stays inf); NaN
    the canonical 0x7FFF."""
    sign, a = (b >> 16) & 0x8000, b & 0x7FFFFFFF
    if a > 0x7F800000:
        return 0x7FFF
    if a == 0x7F800000:
        return sign | 0x7C00
    x = Fraction(struct.unpack("<f", struct.pack("<I", a))[0])
    if x >= 65504:
        return sign | 0x7BFF
    if x < Fraction(1, 2 ** 14):
        return sign | math.floor(x * 2 ** 24)  # (subnormal: multiples of 2^-24)
    e = math.floor(math.log2(x))
    while Fraction(2) ** e > x:  # (log2's float rounding, corrected exactly)
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    m = math.floor(x / Fraction(2) ** (e - 10))  # 1024 <= m < 2048
    return sign | ((e + 15) << 10) | (m - 1024)


class SR_PAIRS(PAIRS):
    """device.SR_PAIR_DEVICE's operations on Python ints (fp32 values as their bits), from PTX's
    definitions: a product rounded once to fp32 (a NaN kept as it is), the fp16 conversion toward
    zero (_f16_rz), fp16 lane min and max (NaN results canonical)."""

    @staticmethod
    def mul_f32(b, c: float):
        x = struct.unpack("<f", struct.pack("<I", b))[0]
        return _f32_rn(x * c) if math.isfinite(x) else b  # (c a power of two: x * c exact in float64)

    @staticmethod
    def f16x2_rz(lo, hi):
        return _f16_rz(lo) | (_f16_rz(hi) << 16)

    @staticmethod
    def _pick(x, y, smaller: bool):
        """One lane of min/max.f16x2: the operand whose fp16 value is smaller (larger), the other
        one where one is NaN, the canonical NaN where both are."""
        nx, ny = x & 0x7FFF > 0x7C00, y & 0x7FFF > 0x7C00
        if nx or ny:
            return 0x7FFF if nx and ny else (y if nx else x)
        vx, vy = (struct.unpack("<e", struct.pack("<H", v))[0] for v in (x, y))
        return x if (vx <= vy) == smaller else y

    @staticmethod
    def min_f16x2(a, b):
        return PAIRS._lanes(lambda x, y: SR_PAIRS._pick(x, y, True), a, b)

    @staticmethod
    def max_f16x2(a, b):
        return PAIRS._lanes(lambda x, y: SR_PAIRS._pick(x, y, False), a, b)


class SR_PAIRS_SIGNED_NAN(SR_PAIRS):
    """SR_PAIRS with a NaN converted keeping its sign and payload's top bits (PTX leaves a NaN
    result's bits open): the rule must not depend on them."""

    @staticmethod
    def f16x2_rz(lo, hi):
        def one(b):
            return ((b >> 16) & 0x8000) | 0x7C00 | ((b >> 13) & 0x3FF) | 1 if b & 0x7FFFFFFF > 0x7F800000 else _f16_rz(b)
        return one(lo) | (one(hi) << 16)


def _sr_edges() -> list:
    """fp32 bits around every E2M1 grid value, every point where floor(256 f) steps near them, and
    specials, both signs: where the rule's bits can go wrong."""
    pts = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 2.0 ** -9, 2.0 ** -10, 2.0 ** -14, 2.0 ** -24,
           2.0 ** -25, 2.0 ** -112, 2.0 ** -113, 2.0 ** -126, 1e-45, 65504.0, 65520.0, 1e30]
    pts += [k * 2.0 ** -9 for k in (1, 127, 255, 256, 257, 511)]  # (steps of floor(256 f) below 1)
    pts += [1 + k * 2.0 ** -9 for k in (1, 255, 511)] + [2 + k * 2.0 ** -8 for k in (1, 255, 511)]
    pts += [4 + k * 2.0 ** -7 for k in (1, 255)]
    return bits_around(pts)


def _sr_words(vals: list, rbytes: list, ops, prescaled: bool = False) -> list:
    """device.e2m1x8_sr on the values (fp32 bits) eight at a time, element k taking byte k % 4 of
    random word k // 4 (the bytes given in element order): each element's code."""
    codes = []
    for i in range(0, len(vals), 8):
        rand = [sum(rbytes[i + 4 * w + k] << (8 * k) for k in range(4)) for w in range(2)]
        word = dev.e2m1x8_sr(vals[i:i + 8], rand, ops=ops, prescaled=prescaled)
        codes += [word >> (4 * k) & 0xF for k in range(8)]
    return codes


@pytest.mark.parametrize("ops", [SR_PAIRS, SR_PAIRS_SIGNED_NAN])
def test_stochastic_rule_equals_the_reference(ops):
    """device.e2m1x8_sr (fp16 pairs: each value times 2^-14 converted toward zero, clamped by
    fp16 min and max, the rule in 16-bit lanes) on the PTX operations written out by hand, against fp4.encode_sr and the
    oracle's e2m1_sr: every r at every edge (_sr_edges), 2^13 sampled patterns below 8 and 2^12
    of any kind with random bytes; each element takes byte k % 4 of word k // 4."""
    from mxq.formats import fp4

    g = torch.Generator().manual_seed(9)
    edges = _sr_edges()
    near = torch.randint(0, 0x41000000, (1 << 13,), generator=g, dtype=torch.int64)
    near = (near | (torch.randint(0, 2, near.shape, generator=g, dtype=torch.int64) << 31)).tolist()
    wide = torch.randint(0, 2 ** 32, (1 << 12,), generator=g, dtype=torch.int64).tolist()
    pad = [0] * (-len(edges) % 8)
    cases = [((edges + pad) * 256, [r for r in range(256) for _ in edges + pad])]
    for bits in (near, wide):
        cases.append((bits, torch.randint(0, 256, (len(bits),), generator=g).tolist()))
    for bits, r in cases:
        got = _sr_words(bits, r, ops)
        y = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
        want = fp4.encode_sr(y, torch.tensor(r, dtype=torch.uint8)).tolist()
        bad = [i for i in range(len(bits)) if got[i] != want[i]]
        assert not bad, [(hex(bits[i]), r[i], got[i], want[i]) for i in bad[:8]]
    for b in edges + near[:512]:  # (the oracle, Fraction arithmetic: every rule spelt out once more)
        for rr in (0, 1, 127, 128, 254, 255):
            assert _sr_words([b] * 8, [rr] * 8, ops)[0] == oracle.e2m1_sr(struct.unpack("<f", struct.pack(
                "<I", b))[0], rr), (hex(b), rr)


def test_stochastic_rule_on_prescaled_products():
    """PackedKernel.sr_prescaled: a multiplier m >= 2^-112 taken times 2^-14 (exact), the products
    fp32(v * m * 2^-14) encoded with ``prescaled`` give fp4.encode_sr's codes of fp32(v * m): for
    bf16 values of every magnitude class (random, up to 2^126 so that the smallest multipliers
    give codes too, tiny, huge, inf, NaN) and multipliers from 2^-112 to FLT_MAX, each with the
    byte where the reference starts rounding it up and the byte below (a product off by one
    step of floor(256 f) fails one of them)."""
    from mxq.formats import fp4

    g = torch.Generator().manual_seed(21)
    v = torch.randn(4096, generator=g) * torch.pow(2.0, torch.randint(-30, 30, (4096,), generator=g).float())
    big = torch.randn(1024, generator=g) * torch.pow(2.0, torch.randint(100, 126, (1024,), generator=g).float())
    v = torch.cat([v, big, torch.tensor([0.0, -0.0, 2.0 ** -133, -(2.0 ** -120), 3e38, -3e38, float("inf"),
                                    float("-inf"), float("nan")] * 8)]).to(torch.bfloat16).float()
    ms = [2.0 ** -112, 1.5 * 2.0 ** -112, 2.0 ** -100, 1e-20, 0.37, 1.0, 6.0 / 448, 5e3, 2.0 ** 100, 3.4028234e38]
    for m in ms:
        m = torch.tensor(m, dtype=torch.float32)
        y = v * m  # (fp32 products, rounded once)
        yp = v * (m * 2.0 ** -14)  # (m * 2^-14 exact: m >= 2^-112)
        assert (m * 2.0 ** -14) * 2.0 ** 14 == m
        # each value's byte where it starts rounding up (256: never), and the one below it
        every = fp4.encode_sr(y[:, None].expand(-1, 256), torch.arange(256, dtype=torch.uint8).expand(len(y), -1))
        up = torch.where(every != every[:, :1], torch.arange(256), 256).amin(1)
        bits = (yp.view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist()
        for r in (up.clamp(max=255), (up - 1).clamp(min=0)):
            got = _sr_words(bits[:len(bits) // 8 * 8], r.tolist(), SR_PAIRS, prescaled=True)
            want = fp4.encode_sr(y[:len(got)], r[:len(got)].to(torch.uint8)).tolist()
            bad = [i for i in range(len(got)) if got[i] != want[i]]
            assert not bad, (float(m), [(float(v[i]), int(r[i]), got[i], want[i]) for i in bad[:6]])


def test_stochastic_pairs_take_the_random_bytes_in_element_order():
    """Element k of e2m1x8_sr's eight takes byte k % 4 of random word k // 4: with every element
    0.75 (f = 0.5: rounded up iff r >= 128), the codes read back the bytes' top bits."""
    for trial in range(64):
        rbytes = [((trial * 37 + 11 * k) % 256) for k in range(8)]
        got = _sr_words([_f32_rn(0.75)] * 8, rbytes, SR_PAIRS)
        assert got == [1 + (rb >= 128) for rb in rbytes], (trial, rbytes)


def _mulhilo(a: int, b: torch.Tensor):
    """(hi, lo) words of a * b for uint32 words ``b`` (int64 tensors): four 16x16-bit products."""
    al, ah, bl, bh = a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16
    mid = (al * bh) + (ah * bl)  # < 2^33
    low = al * bl + ((mid & 0xFFFF) << 16)  # < 2^49
    return (ah * bh + (mid >> 16) + (low >> 32)) & 0xFFFFFFFF, low & 0xFFFFFFFF


class RNG_LANES:
    """device.RNG_DEVICE's operations on int64 tensors with one element per lane of a warp (lanes
    2l and 2l + 1 neighbours): ``when`` runs both sides and keeps each lane's, ``swap_pair``
    exchanges neighbours' values."""

    @staticmethod
    def U32(v):
        return torch.as_tensor(v, dtype=torch.int64) & 0xFFFFFFFF

    @staticmethod
    def I32(v):
        v = torch.as_tensor(v, dtype=torch.int64) & 0xFFFFFFFF
        return v - ((v >> 31) << 32)

    @staticmethod
    def I64(v):
        return torch.as_tensor(v, dtype=torch.int64)

    select = staticmethod(torch.where)

    @staticmethod
    def mulhi(a, b):
        return _mulhilo(a, b)[0]

    @staticmethod
    def mullo(a, b):
        return _mulhilo(a, b)[1]

    @staticmethod
    def swap_pair(v):
        return v.reshape(-1, 2).flip(1).reshape(-1)

    @staticmethod
    def when(cond, n, then, other):
        t, o = then(), other()
        return [torch.where(cond, t[i], o[i]) for i in range(n)]


def _oracle_words(n_rows: int, n_cols: int, seed: int, offset: int, direction: int) -> list:
    """tests/oracle_fp4.py's random bytes of [n_rows, n_cols] as each row's 32-bit words."""
    b = oracle.random_bytes(n_rows, n_cols, seed, offset, direction)
    return [[sum(row[4 * q + i] << (8 * i) for i in range(4)) for q in range(n_cols // 4)] for row in b]


def _signed64(seed: int) -> int:
    """A seed as the rng slot holds it (int64, two's complement)."""
    return seed - (seed >> 63 << 64)


# (seed, offset): every offset % 4, counters past 2^32, a seed of 2^63 or more
RNG_CASES = [(0, 0), (1, 1), (2, 2), (3, 3), (2 ** 40 + 7, 12345), (2 ** 64 - 5, 2 ** 33 + 3), (9, 4 * 2 ** 32 - 8),
             (2 ** 63 + 11, 4 * 2 ** 32 - 5), (77, 2 ** 62 - 4096), (5, 2 ** 62 - 4095), (6, 2 ** 35 + 2)]


@pytest.mark.parametrize("seed, offset", RNG_CASES)
@pytest.mark.parametrize("n", [16, 48, 528, 24, 40])
def test_rowwise_random_words_equal_the_oracle(seed, offset, n):
    """device.sr_row_words on int64 lanes (g = 0, 1, ...: lanes 2l, 2l + 1 neighbours) against
    the oracle's random bytes of rows 2k, 2k + 1 of [rows, N]: N % 16 == 0 (one Philox per lane
    pair and row where offset % 4 == 0, two otherwise), N = 24, 40 (rows not starting on a
    counter: two for any offset); rows from 0 and from row 3001 (the oracle called
    at that row's offset)."""
    groups = n // 4
    g = torch.arange(2 * -(-n // 16), dtype=torch.int64)  # (past N / 8: columns never stored)
    for row0 in (0, 3001):
        want = _oracle_words(4, n, seed, offset + row0 * groups, 0)  # rows row0 .. row0 + 3
        for r in (0, 2):
            got = dev.sr_row_words(row0 + r, g, groups, _signed64(seed), offset, ops=RNG_LANES)
            for lane in range(len(g)):
                if 2 * lane + 1 < groups:
                    words = [int(got[j][lane]) for j in range(4)]
                    assert words == want[r][2 * lane:2 * lane + 2] + want[r + 1][2 * lane:2 * lane + 2], (r, lane)


@pytest.mark.parametrize("seed, offset", RNG_CASES)
@pytest.mark.parametrize("m", [16, 24, 48, 80])
def test_colwise_shared_random_words_equal_the_oracle(seed, offset, m):
    """PackedKernel.sr_col_stage restated on int64 lanes: the thread of warp w (rows 8w ..;
    parity p = w % 2) draws device.sr_col_group of its columns 2q + p from row 8w - 8p (one
    Philox where device.sr_col_aligned, M % 16 == 0 and offset % 4 == 0, else two: sr_words4's
    straddle) and leaves half h of the words for the warp of parity h; every warp then reads its
    own half of every column: the oracle's words of its rows (those below M), for columns 0 .. 7
    and 2000 .. 2007 (lanes: the 8 columns of one thread)."""
    groups = m // 4
    aligned = m % 16 == 0 and offset % 4 == 0
    assert bool(dev.sr_col_aligned(groups, offset, ops=RNG_LANES)) == aligned
    warps = -(-m // 16) * 2  # (a partial last group: its lower warp's rows lie past M)
    for c0 in (0, 2000):
        want = _oracle_words(8, m, seed, offset + c0 * groups, 1)
        srx = {}
        for w in range(warps):
            p = w % 2
            c = c0 + 2 * torch.arange(4, dtype=torch.int64) + p  # (one column per lane)
            words = dev.sr_col_group(c, 8 * w - 8 * p, groups, _signed64(seed), offset, ops=RNG_LANES,
                                     straddle=not aligned)
            for q in range(4):
                for h in range(2):
                    srx[(w // 2, 2 * q + p, h)] = [int(words[2 * h][q]), int(words[2 * h + 1][q])]
        for w in range(m // 8):
            for c in range(8):
                assert srx[(w // 2, c, w % 2)] == want[c][2 * w:2 * w + 2], (w, c)


def test_rows32_register_cap_reaches_the_quantize_pass_not_the_amax_pass():
    """Tuning.rows32_min_blocks caps the 32-row tile's kernels: NVFP4's quantize pass is compiled
    for that many CTAs per SM (.minnctapersm), its amax pass (no data written) and the library's
    default are not; the 128-row tile keeps its own cap. The library's choice caps MXFP4's
    rowwise-only kernel alone, at 6 (0 switches it off)."""
    from mxq.runtime import inspection

    op = mxq.fused_quant(format="nvfp4")(ident)
    capped = codegen.kernel_config(op.spec, op.epilogue, kconfig.Tuning(rows32_min_blocks=6))
    amax_pass, quantize_pass = capped.global_passes()
    assert (amax_pass.packed_min_blocks(), quantize_pass.packed_min_blocks()) == (0, 6)
    assert codegen.kernel_config(op.spec, op.epilogue).global_passes()[1].packed_min_blocks() == 0
    block = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    assert codegen.kernel_config(block.spec, block.epilogue, kconfig.Tuning(rows32_min_blocks=6)).min_blocks == 2
    with pytest.raises(ValueError, match="rows32_min_blocks"):
        kconfig.Tuning(rows32_min_blocks=-1)
    caps = {}
    for name, opts in (("mxfp4", dict(format="mxfp4")), ("mxfp4 both", dict(format="mxfp4", colwise=True)),
                       ("mxfp8", dict()), ("nvfp4 both", dict(format="nvfp4", colwise=True)),
                       ("mxfp4 gelu dbias", dict(format="mxfp4", act="gelu", dbias=True)),
                       ("mxfp4 amax", dict(format="mxfp4", amax=True))):
        o = mxq.fused_quant(**opts)(ident)
        caps[name] = codegen.kernel_config(o.spec, o.epilogue).min_blocks
    assert caps == {"mxfp4": 6, "mxfp4 both": 0, "mxfp8": 0, "nvfp4 both": 0, "mxfp4 gelu dbias": 0,
                    "mxfp4 amax": 0}, caps
    mx = mxq.fused_quant(format="mxfp4")(ident)
    assert codegen.kernel_config(mx.spec, mx.epilogue, kconfig.Tuning(rows32_min_blocks=0)).min_blocks == 0
    op._with_tuning(kconfig.Tuning(rows32_min_blocks=6))
    ptx = inspection.ptx_of(op, "sm_90", "bf16")
    entries = [e for e in ptx.split(".entry ")[1:] if e.startswith("kernel_cutlass_packed_kernel")]
    assert len(entries) == 2 and sum(bool(re.search(r"\.minnctapersm\s+6\b", e)) for e in entries) == 1


@pytest.mark.parametrize("swizzled", [False, True])
def test_colwise_scale_runs_match_each_columns_offset(swizzled):
    """packed.fp4_column_scale_run, as fp4_column_scales stores a thread's VEC columns' scales
    (column c0 + q at offset + q * step, c0 % VEC == 0), against each column's own offset in the
    oracle's layouts (compact c * nbm + blk; swizzled tests/oracle.py swizzle_offset), for column
    runs across several 128-row atoms and blocks across several 4-block atoms."""
    from . import oracle as base_oracle

    vec = packed.VEC
    for nbm in (1, 3, 4, 5, 9):
        for blk in range(nbm):
            for c0 in range(0, 3 * 128 + 64, vec):
                off, step = packed.fp4_column_scale_run(swizzled, c0, blk, nbm)
                for q in range(vec):
                    c = c0 + q
                    want = base_oracle.swizzle_offset(c, blk, nbm) if swizzled else c * nbm + blk
                    assert off + q * step == want, (swizzled, nbm, blk, c0, q)
