"""op.gemm: the sm_90 GEMM whose epilogue is the op (mxq/kernels/gemm_quant.py).

CPU: launch_gemm compiles to sm_90a PTX (wgmma, the FP8 conversions, 16-bit data stores, scale
stores, no store of the product) for FP8 block scaling and MXFP8 with broadcast, full and float
operands, in both forms of the GEMM (cooperative and ping-pong), within the setmaxnreg budget and
with no local memory (cuobjdump); refusals are ValueErrors naming the option (TypeError / ValueError naming the
argument for bad tensors) before anything compiles; on CPU op.gemm is the reference on the fp32
accumulator, checked against the independent oracles (tests/oracle.py, oracle_fp8_block.py).
GPU (marked ``gpu``): data and scale bytes equal op.reference applied to the kernel's own
accumulator (the acc_out hook; every byte for exact ops, docs/NUMERICS.md's transcendental
class for gelu), for random shapes with partial M and N tiles, every served format and scale
layout; the accumulator against a float64 matmul; the hook-free launch writes the same bytes;
each in both forms of the GEMM.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil

import pytest
import torch

import mxq
from mxq.runtime import gemm as g
from mxq.testing import compare, is_exact, v_bound

from . import oracle, oracle_fp8_block
from .test_gemm_sm90 import (CUOBJDUMP, FORMS, _form, _ptxas_output, assert_within_budget,  # noqa: F401
                              cubin_resources, form)


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128))
def bias_gelu(x, b):
    return x + b


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128), scale_layout="gemm")
def bias_gelu_gemm(x, b):
    return x + b


@mxq.fused_quant(act="gelu")
def bias_gelu_mx(x, b):
    return x + b


@mxq.fused_quant(act="gelu", scale_layout="swizzled")
def bias_gelu_mx_sw(x, b):
    return x + b


@mxq.fused_quant(format="fp8_block", block=(1, 128), fp8="e5m2")
def scaled_residual(x, s, r, alpha: float = 1.0):
    return x * s * alpha + r


@mxq.fused_quant(fp8="e5m2")
def scaled_residual_mx(x, s, r, alpha: float = 1.0):
    return x * s * alpha + r


@mxq.fused_quant(format="fp8_block", block=(1, 128))
def plus_bias(x, b):
    return x + b


@mxq.fused_quant(format="fp8_block", block=(1, 128), scale_layout="gemm", scale_mode="fp32")
def plus_bias_gemm(x, b):
    return x + b


@mxq.fused_quant()
def plus_bias_mx(x, b):
    return x + b


@mxq.fused_quant(scale_layout="swizzled")
def plus_bias_mx_sw(x, b):
    return x + b


@mxq.fused_quant(format="fp8_block", block=(1, 128), amax=True)
def plus_bias_amax(x, b):
    return x + b


@mxq.fused_quant(act="gelu", amax=True)
def bias_gelu_mx_amax(x, b):
    return x + b


@mxq.fused_quant(format="fp8_block", block=(1, 128), dbias=True)
def plus_bias_dbias(x, b):
    return x + b


@mxq.fused_quant(act="gelu", dbias=True, amax=True, scale_layout="swizzled")
def bias_gelu_mx_dbias(x, b):
    return x + b


@mxq.fused_quant(format="fp8_block", block=(1, 128), fp8="e5m2", dbias=True)
def scaled_residual_dbias(x, s, r, alpha: float = 1.0):
    return x * s * alpha + r


@mxq.fused_quant(act="gelu", colwise=True)
def bias_gelu_mx_both(x, b):
    return x + b


@mxq.fused_quant(rowwise=False, colwise=True, scale_layout="swizzled", amax=True)
def plus_bias_mx_col_sw(x, b):
    return x + b


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128), colwise=True)
def bias_gelu_both(x, b):
    return x + b


@mxq.fused_quant(format="fp8_block", block=(1, 128), colwise=True, scale_mode="fp32", amax=True, dbias=True)
def plus_bias_both_dbias(x, b):
    return x + b


@mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128), colwise=True, scale_layout="gemm")
def bias_gelu_gemm_both(x, b):
    return x + b


@mxq.fused_quant(dact="gelu", dbias=True, colwise=True)
def dgelu_both(dy):  # (the backward: dgrad GEMM, dgelu of the forward's pre-activation, dbias, both)
    return dy


@mxq.fused_quant(dact="relu", dbias=True, colwise=True, format="fp8_block", block=(1, 128), scale_layout="gemm")
def drelu_scaled_gemm(dy, s):
    return dy * s


@mxq.fused_quant(format="fp8_block", block=(1, 128), rowwise=False, colwise=True, scale_layout="gemm",
                 scale_mode="fp32", fp8="e5m2")
def plus_bias_tr(x, b):
    return x + b


# --- CPU: PTX ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptx():
    """PTX of two launch_gemm compiles in both forms (by (format, pingpong)): FP8 block scaling +
    bias + gelu (bf16), and MXFP8 e5m2 with a column operand, a full residual and a float (fp16,
    with the accumulator hook), their rowwise data stored from registers; and each staged for TMA
    stores (by (format, pingpong, "staged"))."""
    out = {}
    for pp in FORMS:
        for fmt, args in (("fp8_block", (bias_gelu, "bf16", ("row",), False, 132, 1)),
                          ("mxfp8", (scaled_residual_mx, "fp16", ("col", "full"), True, 132, 8))):
            out[fmt, pp] = g.compile_gemm_op(*args, keep_ptx=True, pingpong=pp).__ptx__
            out[fmt, pp, "staged"] = g.compile_gemm_op(*args, keep_ptx=True, pingpong=pp, stage_rows=True).__ptx__
    return out


@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_launch_gemm_compiles_to_sm90a_with_the_quantize_in_its_epilogue(ptx, fmt, pingpong):
    text = ptx[fmt, pingpong]
    assert re.search(r"^\.target sm_90a", text, re.M)
    el = "bf16" if fmt == "fp8_block" else "f16"
    assert f"wgmma.mma_async.sync.aligned.m64n256k16.f32.{el}.{el}" in text
    cvt = "e4m3x2" if fmt == "fp8_block" else "e5m2x2"
    assert text.count(f"cvt.rn.satfinite.{cvt}.f32") == 64  # 128 accumulator values a thread, in pairs
    assert text.count("st.global.b16") == 64  # the FP8 pairs; no bf16/fp16 product anywhere
    assert not re.search(r"cvt\.rn\.(bf16|f16)x2\.f32", text)
    # (the library's clusters of two: W multicast, the release on both CTAs, the cluster's sync)
    assert g.CLUSTER_M == 2 and "multicast::cluster" in text and "mapa.shared::cluster" in text
    if fmt == "fp8_block":  # 2 rows x 2 blocks of 1x128 a thread: fp32 1/scale by div.rn, NaN-dropping max
        stores = re.findall(r"st\.global\.[\w.:]+", text)
        assert sorted(set(stores)) == ["st.global.b16", "st.global.b32"] and stores.count("st.global.b32") == 4
        assert "div.rn.f32" in text and "max.NaN.f32" not in text
    else:  # 2 rows x 8 blocks of 1x32: E8M0 bytes (L2-kept), NaN-propagating max; the hook's fp32 pairs
        assert text.count("st.global.L2::cache_hint.b8") == 16
        assert "max.NaN.f32" in text
        assert text.count("st.global.v2.b32") == 2 * 64  # a full tile's and an edge tile's


@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
def test_dbias_is_a_partial_row_per_warp_then_a_reduction(pingpong):
    """An op with dbias: the epilogue's column sums over a warp's 16 rows, reduce-scattered over
    the 8 lanes of a column (4 chunks of 16 values a thread, 8 + 4 + 2 shuffles each: 56, beside
    the rowwise blocks' 2 a row and block), each lane storing two columns' partials to the fp32
    workspace (4 chunks x 2), then a second kernel (reduce.dbias_kernel) adding the partial rows
    in fp64; either form."""
    from mxq.kernels import gemm_quant

    assert gemm_quant.DBIAS_ROWS == g.DBIAS_ROWS  # (the kernel's stripe, the workspace's rows per partial)
    text = g.compile_gemm_op(plus_bias_dbias, "bf16", ("row",), False, 132, 1, keep_ptx=True,
                             pingpong=pingpong).__ptx__
    entries = re.findall(r"\.entry\s+(\w+)", text)
    assert len(entries) == 2 and any("dbias_kernel" in e for e in entries), entries
    gemm = text.split(".entry")[1 if "dbias_kernel" not in entries[0] else 2]
    assert gemm.count("shfl.sync.bfly") == 56 + 2 * 2 * 2 and "add.f64" not in gemm  # (fp32 partials in the GEMM)
    assert gemm.count("st.global.b32") == 2 * 2 + 4 * 2  # (the 1x128 row scales, the partial pairs)


@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
def test_amax_is_one_atomic_per_warp_in_the_epilogue(ptx, pingpong):
    """An op with amax: the epilogue's values' maximum, over the warp, into the amax slot by one
    red.max a warp (device.amax_atomic), in either form; ops without amax write none."""
    text = g.compile_gemm_op(plus_bias_amax, "bf16", ("row",), False, 132, 1, keep_ptx=True,
                             pingpong=pingpong).__ptx__
    assert text.count("red.relaxed.gpu.global.max.s32") == 1
    assert "red.relaxed.gpu.global.max.s32" not in ptx["fp8_block", pingpong]


COLWISE_FORMS = [(bias_gelu_mx_both, True), (bias_gelu_mx_both, False), (bias_gelu_both, False),
                 (bias_gelu_gemm_both, False)]


@pytest.fixture(scope="module")
def colwise_ptx():
    """PTX of gelu + both directions (bias row, bf16): MXFP8 in either form, FP8 block scaling
    (128-row colwise blocks) in the cooperative one."""
    return {(op.__name__, pp): g.compile_gemm_op(op, "bf16", ("row",), False, 132, 1, keep_ptx=True,
                                                 pingpong=pp).__ptx__ for op, pp in COLWISE_FORMS}


@pytest.mark.parametrize("op, pingpong", COLWISE_FORMS, ids=lambda v: getattr(v, "__name__", _form(v)))
def test_colwise_blocks_are_reduced_across_the_tiles_warps(colwise_ptx, op, pingpong):
    """The colwise copy in the epilogue: each warp's column maxima reduce-scattered over its 8
    lanes of a column (4 chunks x (8 + 4 + 2) butterfly shuffles, beside the rowwise blocks' 2 a
    row and block), 8 column maxima a lane into shared memory and its block's R / 16 warps' read
    back (16 loads for MXFP8's 32 rows, 64 for 128) between two barriers of the tile's threads
    (ping-pong: the warpgroup's 128 on barrier 3 + wg; cooperative: 256 on 3), each value's
    multiplier by one indexed shuffle a column (64), 64 more 16-bit data stores or, for the
    transposed copy, the lane exchange of stripe_transpose (4 chunks x 12 shuffles) and 8 16-byte
    stores (where M % 16 == 0; else 16 predicated bytes each); the scales: MXFP8's E8M0 bytes (8
    colwise a thread beside the 16 L2-kept rowwise), FP8 block scaling's fp32 (8 beside 4)."""
    text = colwise_ptx[op.__name__, pingpong]
    mx = op.spec.format == "mxfp8"
    row_blocks = 8 if mx else 2
    tr = op.spec.colwise_transposed
    assert text.count("shfl.sync.bfly") == 4 * (8 + 4 + 2) + 2 * 2 * row_blocks + 4 * 12 * tr
    assert len(re.findall(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, %r\d+,", text)) == 64
    assert text.count("st.shared.b32") == 8 and text.count("ld.shared.b32") == 8 * (2 if mx else 8)
    bars = re.findall(r"bar\.sync\s+(\S+), (\d+);", text)
    assert bars.count(("3", "256") if not pingpong else bars[-1]) == 2 and bars[-1][1] == ("128" if pingpong else "256")
    assert text.count("st.global.b16") == 128 - 64 * tr and text.count("cvt.rn.satfinite.e4m3x2.f32") == 128
    assert text.count("st.global.v4.b32") == 8 * tr and text.count("st.global.b8") == (8 if mx else 16 * 8 * tr)
    assert text.count("prmt.b32") >= 4 * 3 * 8 * tr
    if mx:
        assert text.count("st.global.L2::cache_hint.b8") == 16
    else:
        assert text.count("st.global.b32") == 4 + 8


def test_dact_reads_act_input_as_one_more_full_operand():
    """A dact op's kernel (drelu, dbias, both directions, GEMM-ready; a row scale): per thread its
    128 act_input values (16-bit loads, one an element) more than the same op without dact, the
    launcher's parameter after the epilogue's tensors; ptxas takes the rowwise dgelu op without
    spills."""
    from mxq.frontend import codegen

    loads = []
    for op, kinds in ((drelu_scaled_gemm, ("row", "full")), (mxq.fused_quant(
            dbias=True, colwise=True, format="fp8_block", scale_layout="gemm")(drelu_scaled_gemm.fn), ("row",))):
        text = g.compile_gemm_op(op, "bf16", kinds, False, 132, 1, keep_ptx=True, pingpong=False).__ptx__
        loads.append(len(re.findall(r"ld\.global(?:\.nc)?(?:\.L2::\w+)?\.(?:b16|u16)", text)))
    assert loads[0] == loads[1] + 128, loads
    params = codegen._gemm_launcher_text(drelu_scaled_gemm.spec, drelu_scaled_gemm.epilogue)["params"]
    assert params.index("x1: cute.Tensor") < params.index("act_in: cute.Tensor") < params.index("row_data")
    op = mxq.fused_quant(dact="gelu", format="fp8_block", scale_layout="gemm")(_ident)
    if shutil.which("ptxas") is not None:
        _assert_ptxas_clean(g.compile_gemm_op(op, "bf16", ("full",), False, 132, 1, keep_ptx=True,
                                              pingpong=True).__ptx__)


def test_gpu_tests_skip_the_ping_pong_forms_a_128_row_colwise_op_does_not_run(monkeypatch):
    """The GPU tests' form filter (_in_form; the form fixture asserts every compile's form): under
    PINGPONG an FP8 block-scaling op with the colwise copy runs cooperative and is skipped there,
    every other op runs; under the cooperative forms every op runs."""
    monkeypatch.setattr(g, "PINGPONG", True)
    assert [_in_form(op) for op in (bias_gelu, bias_gelu_mx_both, bias_gelu_both, plus_bias_tr)] == [
        True, True, False, False]
    monkeypatch.setattr(g, "PP_TILE", g.WIDE_TILE)  # (the wide tile: MXFP8 reading the accumulator alone)
    wide = mxq.fused_quant(act="gelu")(_ident)
    assert [_in_form(op) for op in (bias_gelu, bias_gelu_mx_both, bias_gelu_both, wide)] == [False, False, False, True]
    monkeypatch.setattr(g, "PP_TILE", (192, 128))  # (1x128 blocks in its columns; the same 192 accumulators)
    tall = mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128))(_ident)
    assert [_in_form(op) for op in (bias_gelu, bias_gelu_both, tall, wide)] == [False, False, True, True]
    monkeypatch.setattr(g, "PINGPONG", False)
    assert all(_in_form(op) for op in GPU_OPS + [dgelu_both, drelu_scaled_gemm, wide])


def test_colwise_forms_and_exchange():
    """op.gemm's form: the library's rule runs ops with the colwise copy cooperative; forced
    ping-pong takes them unless the colwise blocks have 128 rows, which a 64-row ping-pong tile
    cannot hold (GemmSm90 refuses that form for them); the exchange holds a lane's 8 kept columns
    (XCH_SLOTS: 4 chunks of 8 groups, two columns each)."""
    import types

    from mxq.frontend import codegen
    from mxq.kernels import gemm_quant, gemm_sm90

    assert g.kernel_for(bias_gelu_mx_both).pingpong is False and g.kernel_for(bias_gelu).pingpong is False
    assert g.kernel_for(bias_gelu_both).pingpong is False
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "PINGPONG", True)
        assert g.kernel_for(bias_gelu_mx_both).pingpong and not g.kernel_for(bias_gelu_both).pingpong
    assert gemm_sm90.XCH_SLOTS == 2 * gemm_sm90.TILE[1] // 8 // gemm_quant.CHUNK_GROUPS
    rows = {op: gemm_quant.colwise_rows(codegen.kernel_config(op.spec, op.epilogue))
            for op in (bias_gelu, bias_gelu_mx_both, bias_gelu_both)}
    assert rows == {bias_gelu: 0, bias_gelu_mx_both: 32, bias_gelu_both: 128}
    fused = types.SimpleNamespace(cfg=codegen.kernel_config(bias_gelu_both.spec, bias_gelu_both.epilogue))
    with pytest.raises(ValueError, match="128 rows"):
        gemm_sm90.GemmSm90(fused=fused, pingpong=True)
    gemm_sm90.GemmSm90(fused=fused, pingpong=False)


class LANES:
    """gemm_quant's warp operations on 32 emulated lanes (a value: a list of the 32 lanes')."""

    @staticmethod
    def _v(x):
        return x if isinstance(x, list) else [x] * 32

    @staticmethod
    def bit(lane, b):
        return [((lo >> b) & 1) == 1 for lo in lane]

    @staticmethod
    def select(c, a, b):
        return [x if ci else y for ci, x, y in zip(c, LANES._v(a), LANES._v(b))]

    @staticmethod
    def bfly(v, offset):
        return [v[lo ^ offset] for lo in range(32)]

    @staticmethod
    def prmt(a, b, sel):
        out = []
        for x, y, s in zip(LANES._v(a), LANES._v(b), LANES._v(sel)):
            src = x.to_bytes(4, "little") + y.to_bytes(4, "little")
            out.append(int.from_bytes(bytes(src[(s >> (4 * k)) & 7] for k in range(4)), "little"))
        return out

    u32 = staticmethod(lambda x: x)


@pytest.mark.parametrize("combine", ["max", "sum"])
def test_stripe_reduce_leaves_each_lane_its_groups_columns_over_the_8_lanes(combine):
    """gemm_quant.stripe_reduce (the colwise maxima and dbias partials of a warp's stripe) on 32
    emulated lanes: lane l ends with, for c = 0, 1, the combination over the 8 lanes of its quad
    position (l % 4) of their value 2 (l // 4) + c: group 8u + l // 4's columns."""
    from mxq.kernels import gemm_quant

    gen = torch.Generator().manual_seed(6)
    vals = [torch.randint(-1000, 1000, (32,), generator=gen).tolist() for _ in range(16)]
    fn = (lambda a, b: [max(x, y) for x, y in zip(a, b)]) if combine == "max" else \
        (lambda a, b: [x + y for x, y in zip(a, b)])
    kept = gemm_quant.stripe_reduce(vals, list(range(32)), fn, ops=LANES)
    red = max if combine == "max" else sum
    for lane in range(32):
        p, q = divmod(lane, 4)
        assert [kept[c][lane] for c in range(2)] == [red(vals[2 * p + c][4 * pp + q] for pp in range(8))
                                                     for c in range(2)], lane


def test_stripe_transpose_gives_each_lane_its_columns_16_rows_in_order():
    """gemm_quant.stripe_transpose (the transposed colwise copy's lane exchange) on 32 emulated
    lanes: lane (p, q) starts with, per group gg, the bytes of columns 2 gg, 2 gg + 1 in rows p
    and p + 8 (each byte naming its row, column and q); it ends with columns 2p, 2p + 1, each as
    four words holding rows 0-15 in order."""
    from mxq.kernels import gemm_quant

    def byte(row, col, q):
        return (16 * row + col + 37 * q) % 256

    words = []
    for gg in range(8):
        lanes = []
        for lane in range(32):
            p, q = divmod(lane, 4)
            b = [byte(p + 8 * h, 2 * gg + c, q) for h in range(2) for c in range(2)]
            lanes.append(int.from_bytes(bytes(b), "little"))
        words.append(lanes)
    cols = gemm_quant.stripe_transpose(words, list(range(32)), ops=LANES)
    for lane in range(32):
        p, q = divmod(lane, 4)
        for c in range(2):
            got = b"".join(w[lane].to_bytes(4, "little") for w in cols[c])
            assert list(got) == [byte(row, 2 * p + c, q) for row in range(16)], (lane, c)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs a local ptxas")
@pytest.mark.parametrize("op, pingpong", COLWISE_FORMS, ids=lambda v: getattr(v, "__name__", _form(v)))
def test_ptxas_assembles_the_colwise_kernel_without_spills(colwise_ptx, op, pingpong):
    _assert_ptxas_clean(colwise_ptx[op.__name__, pingpong])


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs a local ptxas")
@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
def test_mxfp8_amax_takes_the_row_blocks_maxima(pingpong):
    """MXFP8's tensor amax from its rowwise blocks' maxima (the same NaN rule), one max a block
    and row (16 a thread) instead of one a value (128): gelu + both + amax adds 16 + 5 (the
    warp's) NaN-propagating maxima to the same op without amax, and assembles without spills."""
    op = mxq.fused_quant(act="gelu", colwise=True, amax=True)(bias_gelu_mx_both.fn)
    text = g.compile_gemm_op(op, "bf16", ("row",), False, 132, 1, keep_ptx=True, pingpong=pingpong).__ptx__
    _assert_ptxas_clean(text)
    twin = g.compile_gemm_op(bias_gelu_mx_both, "bf16", ("row",), False, 132, 1, keep_ptx=True,
                             pingpong=pingpong).__ptx__
    assert text.count("max.NaN.f32") - twin.count("max.NaN.f32") == 16 + 5  # (16 block maxima, the warp's 5)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs a local ptxas")
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_ptxas_assembles_the_fused_kernel_without_spills_or_serialised_wgmmas(ptx, fmt, pingpong, staged):
    """The local ptxas takes the fused kernel, its rowwise data stored from registers or staged,
    with no spills and no C7514 warning (an instruction reading the accumulators while a wgmma
    group is in flight)."""
    _assert_ptxas_clean(ptx[(fmt, pingpong, "staged") if staged else (fmt, pingpong)])


@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_staged_rows_go_through_shared_memory_and_tma_stores(ptx, fmt, pingpong):
    """stage_rows: the rowwise FP8 pairs are 16-bit shared stores (64 a thread, none to global
    memory), made visible to the async proxy, then one TMA store a 128-byte subtile (two a
    256-column tile) and a commit group, and the next tile waits only for the stores' reads; the
    scales (and the hook's fp32 pairs) still leave from registers; the data's bytes and scales
    are computed as in the direct kernel (the same conversions)."""
    direct, staged = ptx[fmt, pingpong], ptx[fmt, pingpong, "staged"]
    assert staged.count("st.shared.b16") == 64 and "st.global.b16" not in staged
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", staged)) == 2
    _assert_staged_order(staged, 128 if pingpong else 256)
    assert not re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", direct)
    for pattern in (r"cvt\.rn\.satfinite\.\w+\.f32", r"div\.rn\.f32", r"st\.global\.b32",
                    r"st\.global\.L2::cache_hint\.b8", r"st\.global\.v2\.b32"):
        assert len(re.findall(pattern, staged)) == len(re.findall(pattern, direct)), pattern


def _assert_ptxas_clean(text):
    out = _ptxas_output(text)
    assert "C7514" not in out and "wgmma" not in out.lower(), out[-2000:]
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", out), out[-2000:]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs a local ptxas")
def test_the_192_row_ping_pong_tile_holds_1x128_blocks_in_three_wgmma_rows():
    """Ping-pong on 192 x 128 (PINGPONG_TILES): gelu + FP8 block scaling 1x128 reading the
    accumulator alone, its rowwise data staged, issues n128 wgmmas (three m64 rows a warpgroup:
    three times the K loop's wgmmas of one row), and ptxas takes it without spills or serialised
    wgmmas."""
    op = mxq.fused_quant(act="gelu", format="fp8_block", block=(1, 128))(_ident)
    text = g.compile_gemm_op(op, "bf16", (), False, 132, -2, keep_ptx=True, pingpong=True, pp_tile=(192, 128),
                             stage_rows=True).__ptx__
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", text)
    assert set(wgmma) == {"m64n128k16"} and len(wgmma) % 3 == 0, wgmma
    _assert_ptxas_clean(text)


@pytest.mark.skipif(CUOBJDUMP is None, reason="needs cuobjdump (PATH or MXQ_CUOBJDUMP)")
@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
def test_fused_cubin_registers_within_the_setmaxnreg_budget_without_local_memory(monkeypatch, pingpong):
    """gelu + FP8 block scaling with a bias row in the epilogue (the 128 accumulators and the
    op's values live together) fits the consumers' registers with no local memory, either form."""
    res = cubin_resources(monkeypatch, lambda: g.compile_gemm_op(bias_gelu, "bf16", ("row",), False, 132, 1,
                                                                 keep_ptx=True, pingpong=pingpong))
    assert_within_budget(res)


def _assert_staged_order(text: str, threads: int):
    """A staged tile's sequence in the kernel's PTX, in order: the issuing warp waits for the last
    TMA store's reads, the tile's threads meet (a named barrier of ``threads``), the pairs go to
    shared memory, a proxy fence, the threads meet again, the TMA stores and their commit; and
    once more after the tile loop, the last store's reads waited for. Exactly two waits and two
    such barriers: without the first wait and barrier a tile's pairs may overwrite the staged
    tile while the TMA unit still reads the last one."""
    def at(pattern, which=0):
        found = [m.start() for m in re.finditer(pattern, text)]
        assert found, pattern
        return found[which]

    bar = r"bar\.sync\s+5, 256;" if threads == 256 else r"bar\.sync\s+%r\d+, 128;"  # (ping-pong: 5 + warpgroup)
    waits = [m.start() for m in re.finditer(r"cp\.async\.bulk\.wait_group\.read\s+0;", text)]
    bars = [m.start() for m in re.finditer(bar, text)]
    assert len(waits) == 2 and len(bars) == 2, (len(waits), len(bars))
    first_st, last_st = at(r"st\.shared\.b16"), at(r"st\.shared\.b16", -1)
    fence, store = at(r"fence\.proxy\.async\.shared::cta"), at(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta")
    commit = at(r"cp\.async\.bulk\.commit_group")
    assert waits[0] < bars[0] < first_st and last_st < fence < bars[1] < store < commit < waits[1]


def test_wide_tile_stages_two_parts_in_64_byte_subtiles():
    """The 128 x 192 ping-pong tile (the H100's for ops reading the accumulator alone) staged: a
    warpgroup's two m64 parts go into one staged tile of three 64-byte subtiles (TMA's 64-byte
    swizzle, checked against CuTe's layout at the trace), three TMA stores a tile, 96 pair
    stores a thread, in the staged order, and ptxas takes it with no spills."""
    text = g.compile_gemm_op(gelu_mx, "bf16", (), False, 132, 1, keep_ptx=True, pingpong=True, pp_tile=(128, 192),
                             stage_rows=True).__ptx__
    assert text.count("st.shared.b16") == 96 and "st.global.b16" not in text
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", text)) == 3
    _assert_staged_order(text, 128)
    if shutil.which("ptxas") is not None:
        _assert_ptxas_clean(text)


def test_stage_offset_is_a_bijection_without_bank_conflicts():
    """gemm_quant.stage_offset (the staged tile's address arithmetic): a bijection of the tile's
    bytes onto its shared memory, and one warp's pair store (8 rows of a stripe, 4 lanes 2 columns
    apart each) touches 16 different 4-byte banks, two lanes' pairs in each bank word: no conflict
    (256-byte rows unswizzled would put all 8 rows in one bank pair). GemmSm90 checks it against
    CuTe's layout of the TMA store at every trace (check_stage_layout)."""
    from mxq.kernels.gemm_quant import stage_offset

    for rows, width, subs in ((128, 128, 2), (64, 128, 4), (128, 64, 6)):
        offs = {stage_offset(r, c, rows, width) for r in range(rows) for c in range(width * subs)}
        assert offs == set(range(rows * width * subs))
        for r0 in (0, 8, 16, 40):
            for grp in range(width * subs // 8):
                at = [stage_offset(r0 + lane // 4, 8 * grp + 2 * (lane % 4), rows, width) for lane in range(32)]
                assert len({a // 4 % 32 for a in at}) == 16 and len({a // 4 for a in at}) == 16


def test_stage_layout_check_catches_a_wrong_swizzle(monkeypatch):
    """check_stage_layout raises where gemm_quant.stage_offset would address bytes other than where
    the TMA store's layout puts them (a swizzle of row % 4 instead of row % 8)."""
    from mxq.kernels import gemm_quant

    monkeypatch.setattr(gemm_quant, "stage_xor", lambda rl, width: (rl & 3) << 4)
    with pytest.raises(RuntimeError, match="does not match the TMA store's layout"):
        g.compile_gemm_op(plus_bias, "bf16", ("row",), False, 132, 1, keep_ptx=True, stage_rows=True)


def test_stages_rows_where_the_tma_store_can_take_them():
    """op.gemm stages its rowwise data for TMA stores where it writes the rowwise copy alone and N
    is a multiple of 16 (a TMA row pitch); STAGE_ROWS forces either way where it can; the plain
    GEMM, colwise copies and N % 16 != 0 never; the staged kernels' shared memory comes out of the
    pipeline stages (four from five in ping-pong; three cooperative beside the colwise exchange)."""
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)
    from mxq.kernels.gemm_sm90 import stages_that_fit

    assert g.STAGE_ROWS is None
    assert g.stages_rows(bias_gelu, 14336) and g.stages_rows(bias_gelu) and g.stages_rows(bias_gelu_mx, 784)
    assert not g.stages_rows(bias_gelu, 1032) and not g.stages_rows(None, 4096)
    assert not g.stages_rows(bias_gelu_both, 4096) and not g.stages_rows(plus_bias_tr, 4096)
    assert g.kernel_for(bias_gelu, 8192, 14336, 4096).stage_rows
    assert not g.kernel_for(bias_gelu, 8192, 14344, 4096).stage_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "STAGE_ROWS", False)
        assert not g.stages_rows(bias_gelu, 4096)
        mp.setattr(g, "STAGE_ROWS", True)
        assert g.stages_rows(bias_gelu, 4096) and not g.stages_rows(bias_gelu, 4104)
    coop, pp, wide = (128, 256, 64), (64, 256, 64), (128, 192, 64)
    assert stages_that_fit(4, coop, 1, False, False) == 4 and stages_that_fit(4, coop, 1, False, True) == 4
    assert stages_that_fit(4, coop, 1, True, True) == 3 and stages_that_fit(4, coop, 1, True, False) == 4
    assert stages_that_fit(5, pp, 2, False, False) == 5 and stages_that_fit(5, pp, 2, False, True) == 4
    assert stages_that_fit(5, wide, 2, False, True) == 4


def _ident(x):
    return x


def test_asm_gemm_is_the_kernel_op_gemm_launches(ptx):
    """op.asm(gemm=True): the PTX of the compile op.gemm runs (operand kinds as given, op.gemm's
    form, tile order 1, its rowwise data staged: N unknown), with ptxas's report; bad arguments
    named."""
    art = bias_gelu.asm(gemm=True, operands=["row"])
    assert art["ptx"] == ptx["fp8_block", False, "staged"] and art["pingpong"] is False  # (1x128: cooperative)
    assert art["stage_rows"] is True
    assert art["variant"] == "gemm" and art["arch"] == "sm_90a"
    assert "wgmma.mma_async" in art["ptx"] and art["operands"] == ("row",) and "launch_gemm" in art["source"]
    if art["ptxas"] is not None:
        assert art["ptxas"] == "ok" and all(k.get("spill_stores", 0) == 0 for k in art["kernels"].values())
    for kw, named in ((dict(operands=["row", "row"]), "operands"), (dict(operands=["diag"]), "operands"),
                      (dict(dtype="fp32"), "dtype"), (dict(arch="sm_100a"), "arch")):
        with pytest.raises(ValueError, match=named):
            bias_gelu.asm(gemm=True, **kw)
    with pytest.raises(ValueError, match="gated"):
        mxq.fused_quant(dact="swiglu")(_ident).asm(gemm=True)
    with pytest.raises(ValueError, match="act='swiglu'"):  # (a gated op: not its inner op's kernel)
        mxq.fused_quant(act="swiglu")(_ident).asm(gemm=True)
    for op in (bias_gelu, mxq.fused_quant(act="swiglu")(_ident)):  # (gemm= a bool, as dispatcher()'s: "yes"
        for truthy in (1, "yes"):  # compiled the GEMM's kernel)
            with pytest.raises(TypeError, match="asm\\(\\) argument 'gemm' must be a bool"):
                op.asm(gemm=truthy)
    art = drelu_scaled_gemm.asm(gemm=True, operands=["row"])  # (act_input: full, not named)
    assert art["operands"] == ("row", "full") and art["pingpong"] is False
    with pytest.raises(ValueError, match="operand kind"):
        g.compile_gemm_op(drelu_scaled_gemm, "bf16", ("row",), False, 132, 1, keep_ptx=True)
    with pytest.raises(ValueError, match="operands"):
        bias_gelu.asm(operands=["row"])


def _tiled_mmas():
    """(cute, mma): CuTe, and a builder of GemmSm90's tiled MMAs (bf16, both operands K-major, fp32
    accumulator) from warpgroup atoms and an M x N tiler, for trace-time layout checks."""
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90

    k_major = utils.LayoutEnum.ROW_MAJOR.sm90_mma_major_mode()

    def mma(atoms, tiler):
        return sm90.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, k_major, k_major, cutlass.Float32,
                                           atoms, tiler_mn=tiler)

    return cute, mma


def test_the_accumulator_layout_assumption_is_checked_at_trace_time():
    """gemm_quant.check_layout passes on GemmSm90's tiled MMAs (it runs in every fused compile):
    the cooperative form's two warpgroups on 128 rows, the ping-pong form's one on 64; it fails on
    a tiled MMA of another value order (planted: two warpgroups along N) and on a tile that is not
    64 rows a warpgroup."""
    cute, mma = _tiled_mmas()
    from mxq.kernels import gemm_quant
    from mxq.kernels.gemm_sm90 import TILE

    @cute.jit
    def gemm_sm90s():  # (host-only: the check runs while these trace)
        gemm_quant.check_layout(mma((2, 1, 1), (64, TILE[1])), (TILE[0], TILE[1]))
        gemm_quant.check_layout(mma((1, 1, 1), (64, 256)), (64, 256), 1)  # (the 64 x 256 ping-pong tile)

    @cute.jit
    def planted():
        gemm_quant.check_layout(mma((1, 2, 1), (TILE[0] // 2, TILE[1])), (TILE[0], TILE[1]))

    @cute.jit
    def planted_rows():
        gemm_quant.check_layout(mma((1, 1, 1), (64, TILE[1])), (TILE[0], TILE[1]), 1)

    cute.compile(gemm_sm90s, options=f"--gpu-arch {g.ARCH}")
    with pytest.raises(Exception, match="layout assumption"):
        cute.compile(planted, options=f"--gpu-arch {g.ARCH}")
    with pytest.raises(Exception, match="not 1 warpgroups of 64 rows"):
        cute.compile(planted_rows, options=f"--gpu-arch {g.ARCH}")


def test_pingpong_128_row_tile_is_two_parts():
    """A 128-row ping-pong tile (GemmSm90 pp_tile (128, 128)): a warpgroup's fragment holds two
    wgmma rows, and its slice at M mode p is value for value part p's own partition (64 x 128),
    which the fused epilogue writes as a tile (gemm_quant.check_parts, run where GemmSm90
    traces); a tiled MMA of two warpgroups on the same tile has no such parts (planted)."""
    cute, mma = _tiled_mmas()
    from mxq.kernels import gemm_quant

    @cute.jit
    def parts():
        gemm_quant.check_parts(mma((1, 1, 1), (64, 128)), (128, 128), (64, 128))
        gemm_quant.check_layout(mma((1, 1, 1), (64, 128)), (64, 128), 1)

    @cute.jit
    def planted():
        gemm_quant.check_parts(mma((2, 1, 1), (64, 128)), (128, 128), (64, 128))  # (the cooperative form's MMA)

    cute.compile(parts, options=f"--gpu-arch {g.ARCH}")
    with pytest.raises(Exception, match="wgmma rows, not 2 parts"):
        cute.compile(planted, options=f"--gpu-arch {g.ARCH}")


def test_gemm_sm90_refuses_bad_tiles_and_orders():
    """GemmSm90's options by name: a ping-pong tile not in PINGPONG_TILES, a tile order of 0."""
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)
    import types

    from mxq.frontend import codegen
    from mxq.kernels.gemm_sm90 import PINGPONG_TILES, GemmSm90

    assert g.PP_TILE in PINGPONG_TILES and (128, 128) in PINGPONG_TILES
    with pytest.raises(ValueError, match="pp_tile"):
        GemmSm90(pingpong=True, pp_tile=(64, 128))
    with pytest.raises(ValueError, match="swizzle"):
        GemmSm90(swizzle=0)
    fp8_block = types.SimpleNamespace(cfg=codegen.kernel_config(bias_gelu.spec, bias_gelu.epilogue))  # (1x128)
    with pytest.raises(ValueError, match="no whole rowwise blocks of 128"):
        GemmSm90(fused=fp8_block, pingpong=True, pp_tile=(128, 192))
    GemmSm90(fused=fp8_block, pingpong=True, pp_tile=(128, 128))


# --- CPU: refusals ----------------------------------------------------------------------------
def _ab(m=4, n=16, k=16, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(m, k, generator=gen).to(dtype), torch.randn(n, k, generator=gen).to(dtype))


@pytest.mark.parametrize("options, named", [
    (dict(colwise=True, dact="swiglu"), "dact='swiglu' (a gated activation)"),
    (dict(act="swiglu"), "act='swiglu'"),
    (dict(format="fp8_block", block=(128, 128)), "block=(128, 128)"),
    (dict(format="mxfp4"), "format='mxfp4'"),
    (dict(format="nvfp4"), "format='nvfp4'"),
])
def test_unserved_options_are_value_errors_naming_the_option(options, named):
    def identity(x):
        return x

    op = mxq.fused_quant(**options)(identity)
    a, w = _ab()
    with pytest.raises(ValueError, match=re.escape(named)):
        op.gemm(a, w)


@pytest.mark.parametrize("keyword", ["group_offsets", "noop"])
def test_call_keywords_without_a_gemm_route_are_named(keyword):
    a, w = _ab()
    with pytest.raises(ValueError, match=f"does not serve {keyword}="):
        plus_bias.gemm(a, w, torch.zeros(16, dtype=torch.bfloat16), **{keyword: torch.zeros(2, dtype=torch.int32)})


def test_cpu_gemm_dact_is_the_value_times_the_derivative_at_act_input():
    """A dact op in the GEMM: v = epilogue(acc, ...) * dact(act_input), quantized and summed (the
    backward's dgrad GEMM with the activation's derivative, dbias and both directions). drelu
    (exact: 1 where act_input > 0, else 0) by the independent oracle on v: 1x128 rowwise codes
    and scales, the transposed colwise copy's, dbias within one bf16 ulp of the float64 sums."""
    a, w = _ab(130, 136, 24)
    gen = torch.Generator().manual_seed(8)
    s = torch.randn(136, generator=gen).to(torch.bfloat16)
    x = torch.randn(130, 136, generator=gen).to(torch.bfloat16)
    x[5, :] = 0  # (drelu(0) = 0)
    acc = torch.empty(130, 136)
    t = drelu_scaled_gemm.gemm(a, w, s, act_input=x, acc_out=acc)
    v = [[float(oracle.f32(p * q)) * (1.0 if xx > 0 else 0.0) for p, q, xx in zip(ra, s.float().tolist(), rx)]
         for ra, rx in zip(acc.tolist(), x.float().tolist())]
    codes, scales = oracle_fp8_block.quantize(v, "e4m3", (1, 128), "pow2", "fp32")
    assert t.rowwise_data.view(torch.uint8).tolist() == codes
    assert t.rowwise_scale.tolist() == scales
    codes, scales = oracle_fp8_block.quantize(_t(v), "e4m3", (1, 128), "pow2", "fp32")
    assert t.colwise_data.view(torch.uint8).tolist() == codes and t.colwise_scale.tolist() == scales
    want = torch.tensor(v, dtype=torch.float64).sum(0)
    assert t.dbias.dtype == torch.bfloat16
    assert bool(((t.dbias.double() - want).abs() <= torch.finfo(torch.bfloat16).eps * want.abs() + 1e-30).all())
    _check_against_reference(dgelu_both, a, w, act_input=x)  # (a transcendental dact: the reference's class)


def test_gemm_dispatcher_takes_act_input_for_dact_ops():
    """op.gemm's dispatcher of a dact op: the act_input slot (the first destination slot's
    place, as a quantize dispatcher's) carries the forward's pre-activation; the bytes op.gemm
    writes; a missing one named."""
    a, w = _ab(n=40, k=32)
    gen = torch.Generator().manual_seed(2)
    s, x = torch.randn(40, generator=gen).to(a.dtype), torch.randn(4, 40, generator=gen).to(a.dtype)
    want = drelu_scaled_gemm.gemm(a, w, s, act_input=x)
    dests, got = _dest_args(drelu_scaled_gemm, 4, 40)
    dests[0] = x
    drelu_scaled_gemm.dispatcher(gemm=True)(a, w, s, *dests)
    assert compare(got, want, exact=True) == []
    dests[0] = None
    with pytest.raises(ValueError, match="needs act_input"):
        drelu_scaled_gemm.dispatcher(gemm=True)(a, w, s, *dests)


def test_act_input_is_checked_by_name():
    """act_input: required by a dact op, refused by one without dact, [M, N] in a's dtype,
    contiguous, on a's device; named before anything runs."""
    a, w = _ab(4, 16, 16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    with pytest.raises(ValueError, match="needs act_input"):
        dgelu_both.gemm(a, w)
    with pytest.raises(ValueError, match="has no dact"):
        plus_bias.gemm(a, w, torch.zeros(16, dtype=torch.bfloat16), act_input=x)
    for bad, named in ((x.float(), "act_input must be"), (x[:, :8], "act_input must be"),
                       (torch.randn(16, 4).to(torch.bfloat16).t(), "contiguous"), ([1.0], "torch.Tensor")):
        with pytest.raises((ValueError, TypeError), match=named):
            dgelu_both.gemm(a, w, act_input=bad)


def test_out_receives_the_allocating_calls_bytes_and_bad_outs_are_named():
    """out=: the call writes into it and returns it, the allocating call's bytes (the CPU route:
    the reference into out); an out of the wrong shape or format, with data rows apart (which a
    quantize call takes) or overlapping an input is refused by name."""
    for op, n in ((plus_bias_gemm, 24), (plus_bias_mx_sw, 40)):
        a, w = _ab(n=n, k=32)
        b = torch.randn(n, dtype=torch.bfloat16)
        o = mxq.MXFP8Tensor.empty(op.spec, (4, n), a.dtype, "cpu", row_align=1)
        o.rowwise_data.view(torch.uint8).fill_(0x5A)
        assert op.gemm(a, w, b, out=o) is o
        assert compare(o, op.gemm(a, w, b), exact=True) == []
        padded = mxq.MXFP8Tensor.empty(op.spec, (4, n), a.dtype, "cpu", row_align=1)
        padded.rowwise_data = torch.empty(4, n + 8, dtype=o.rowwise_data.dtype)[:, :n]  # (rows n + 8 apart)
        with pytest.raises(ValueError, match="out.rowwise_data"):
            op.gemm(a, w, b, out=padded)
        with pytest.raises(ValueError, match="out"):
            op.gemm(a, w, b, out=mxq.MXFP8Tensor.empty(op.spec, (4, n + 8), a.dtype, "cpu", row_align=1))
        with pytest.raises(ValueError, match="out"):
            op.gemm(a, w, b, out=mxq.MXFP8Tensor.empty(plus_bias.spec, (4, n), a.dtype, "cpu", row_align=1))
    a, w = _ab(n=16, k=32)
    o = mxq.MXFP8Tensor.empty(plus_bias_gemm.spec, (4, 16), a.dtype, "cpu", row_align=1)
    b = o.rowwise_data.view(torch.uint8).view(torch.bfloat16).reshape(-1)[:16]  # (a bias inside out's data)
    with pytest.raises(ValueError, match="overlaps"):
        plus_bias_gemm.gemm(a, w, b, out=o)
    b = torch.randn(16, dtype=torch.bfloat16)
    for op in (bias_gelu_mx_both, plus_bias_tr):  # (the colwise copy: contiguous; transposed: 16-byte aligned)
        o = mxq.MXFP8Tensor.empty(op.spec, (4, 16), a.dtype, "cpu", row_align=1)
        assert op.gemm(a, w, b, out=o) is o and compare(o, op.gemm(a, w, b), exact=is_exact(op)) == []
        shape = tuple(o.colwise_data.shape)
        o.colwise_data = torch.empty(shape[0], shape[1] + 8, dtype=o.colwise_data.dtype)[:, :shape[1]]
        with pytest.raises(ValueError, match="out.colwise_data"):
            op.gemm(a, w, b, out=o)
    o = mxq.MXFP8Tensor.empty(plus_bias_tr.spec, (4, 16), a.dtype, "cpu", row_align=1)
    o.colwise_data = torch.empty(16 * 4 + 1, dtype=torch.uint8)[1:].view(o.colwise_data.dtype).view(16, 4)
    with pytest.raises(ValueError, match="16-byte boundary"):
        plus_bias_tr.gemm(a, w, b, out=o)


def _dest_args(op, m, n, poison: int = 0x5A, device="cpu", stale_amax: float = -1.0):
    """A C++ caller's destinations for op.gemm's dispatcher: the data the op writes (rowwise,
    colwise) as bytes [M, N], poisoned, their scales as flat buffers (GEMM-ready scales: the
    whole padded buffer), the amax (fp32 [1], poisoned) and dbias where the op has them, the
    other slots None; and the MXFP8Tensor view of them (to compare)."""
    like = mxq.MXFP8Tensor.empty(op.spec, (m, n), torch.bfloat16, device, row_align=1)
    slots = []
    for d in ("rowwise", "colwise"):
        data, scale = getattr(like, f"{d}_data"), getattr(like, f"{d}_scale")
        if data is None:
            slots += [None, None]
            continue
        flat = (scale._base if scale._base is not None else scale).reshape(-1)
        slots += [data.view(torch.uint8).fill_(poison), flat.view(torch.uint8) if flat.dtype.itemsize == 1 else flat]
    amax = like.amax.view(1).fill_(stale_amax) if like.amax is not None else None
    dbias = like.dbias.fill_(7.0) if like.dbias is not None else None
    return [None, *slots, amax, dbias, None], like


@pytest.mark.parametrize("op", [plus_bias_gemm, plus_bias_mx_sw, scaled_residual, plus_bias_amax, plus_bias_dbias,
                                bias_gelu_mx_both, plus_bias_mx_col_sw, plus_bias_both_dbias, plus_bias_tr],
                         ids=lambda o: o.__name__)
def test_gemm_dispatcher_writes_what_op_gemm_writes(op):
    """op.dispatcher(gemm=True) and op.register(name, gemm=True): op.gemm's destination-passing
    function (a, w, the epilogue's other tensors and floats, the eight destination slots) writes
    into a C++ caller's buffers (FP8 data as bytes, flat scales) the bytes op.gemm returns (CPU:
    the reference); slots op.gemm does not write, a wrong count, a wrong type are named."""
    import tvm_ffi

    a, w = _ab(n=40, k=32)
    m, n = a.shape[0], w.shape[0]
    if op is scaled_residual:
        others, floats = [torch.randn(m, 1, dtype=a.dtype), torch.randn(m, n, dtype=a.dtype)], [0.75]
    else:
        others, floats = [torch.randn(n, dtype=a.dtype)], []
    want = op.gemm(a, w, *others, **dict(zip(op.epilogue.scalar_params, floats)))
    op.register(f"gemm_{op.__name__}", gemm=True)
    for fn in (op.dispatcher(gemm=True), tvm_ffi.get_global_func(f"mxq.gemm_{op.__name__}")):
        dests, got = _dest_args(op, m, n)
        fn(a, w, *others, *floats, *dests)
        assert compare(got, want, exact=True) == []
    dests, _ = _dest_args(op, m, n)
    for slot, name, has in ((1, "rowwise_data", op.spec.rowwise), (3, "colwise_data", op.spec.colwise)):
        bad = list(dests)  # (a copy the op writes: required; one it does not: refused)
        bad[slot] = None if has else torch.empty(m, n, dtype=torch.uint8)
        with pytest.raises(ValueError, match=name):
            op.dispatcher(gemm=True)(a, w, *others, *floats, *bad)
    with pytest.raises(TypeError, match="arguments"):
        op.dispatcher(gemm=True)(a, w, *others, *floats, *dests[:-1])
    bad = list(dests)
    at = 2 if op.spec.rowwise else 4
    bad[at] = torch.empty(3, dtype=bad[at].dtype)
    with pytest.raises(ValueError, match="rowwise_scale" if op.spec.rowwise else "colwise_scale"):
        op.dispatcher(gemm=True)(a, w, *others, *floats, *bad)
    for slot, name, has in ((5, "amax", op.spec.amax), (6, "dbias", op.spec.dbias)):
        bad = list(dests)  # (the amax and dbias slots: required where the op has them, refused where not)
        bad[slot] = None if has else torch.empty(n, dtype=a.dtype)
        with pytest.raises(ValueError, match=name):
            op.dispatcher(gemm=True)(a, w, *others, *floats, *bad)
    with pytest.raises(TypeError, match="gemm"):
        op.dispatcher(gemm=1)


def test_acc_out_sharing_memory_with_an_input_is_refused():
    """acc_out is written while the inputs are read: one sharing memory with an operand (or a,
    w, act_input) is refused by name, with or without out= (it was written over the operand the
    reference then read: wrong bytes, silently)."""
    a, w = _ab(n=16, k=32)
    s, r = torch.randn(4, 1, dtype=a.dtype), torch.randn(4, 16, dtype=a.dtype)
    acc = torch.zeros(4, 16)
    inside = acc.view(-1).view(a.dtype)[:64].view(4, 16)  # (an operand in acc_out's bytes)
    inside.copy_(r)
    out = mxq.MXFP8Tensor.empty(scaled_residual.spec, (4, 16), a.dtype, "cpu", row_align=1)
    for given in (None, out):
        with pytest.raises(ValueError, match="'acc_out' overlaps 'r'"):
            scaled_residual.gemm(a, w, s, inside, alpha=0.5, acc_out=acc, out=given)
    shared = torch.zeros(4, 16)  # (a's [4, 32] bf16 bytes are an fp32 [4, 16] acc_out's)
    a_inside = shared.view(a.dtype).view(4, 32)
    a_inside.copy_(a)
    with pytest.raises(ValueError, match="'acc_out' overlaps 'a'"):
        scaled_residual.gemm(a_inside, w, s, r, alpha=0.5, acc_out=shared)
    got = scaled_residual.gemm(a, w, s, r, alpha=0.5, acc_out=acc)  # (apart: as before)
    assert compare(got, scaled_residual.reference(acc, s.float(), r.float(), alpha=0.5), exact=False) == []


def test_a_w_that_require_grad_are_named_and_outputs_carry_no_graph():
    """op.gemm's outputs are data: with a w that requires grad (grad mode on) the warning names
    w, and acc_out (the accumulator) carries no autograd graph."""
    a, w = _ab(n=16, k=32)
    acc = torch.zeros(4, 16)
    w = w.clone().requires_grad_(True)
    with pytest.warns(UserWarning, match="'w' requires grad"):
        plus_bias_gemm.gemm(a, w, torch.randn(16, dtype=a.dtype), acc_out=acc)
    assert not acc.requires_grad and acc.grad_fn is None


def test_noop_and_group_offsets_none_are_taken_as_a_calls():
    a, w = _ab(n=16, k=32)
    b = torch.randn(16, dtype=a.dtype)
    want = plus_bias_gemm.gemm(a, w, b)
    got = plus_bias_gemm.gemm(a, w, b, noop=None, group_offsets=None)
    assert compare(got, want, exact=True) == []
    for kw in (dict(noop=torch.zeros(1)), dict(group_offsets=torch.tensor([4], dtype=torch.int32))):
        with pytest.raises(ValueError, match=next(iter(kw))):
            plus_bias_gemm.gemm(a, w, b, **kw)


def test_gemm_dispatcher_refuses_an_untransposed_colwise_buffer():
    """The transposed colwise copy [N, M] through op.dispatcher(gemm=True): an [M, N] buffer of
    the same size is refused by name (as the quantize dispatcher refuses it)."""
    a, w = _ab(m=8, n=16, k=32)
    dests, _ = _dest_args(plus_bias_tr, 8, 16)
    dests[3] = torch.empty(8, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="transposed colwise copy"):
        plus_bias_tr.dispatcher(gemm=True)(a, w, torch.randn(16, dtype=a.dtype), *dests)


def test_broadcast_operands_of_other_strides_are_copied_for_the_kernel(monkeypatch):
    """The GEMM's epilogue reads a row or a column operand of unit stride: a strided or expanded
    one is copied with the copy's warning (an error under MXQ_STRICT=1); contiguous ones and
    full ones are passed as they are."""
    from mxq.runtime import operands, validation

    row = torch.randn(32)[::2]
    col = torch.randn(4, 2)[:, :1]
    for t, kind in ((row, "row"), (torch.tensor(1.0).expand(16), "row"), (col, "col")):
        with pytest.warns(RuntimeWarning, match=f"copies a {kind} operand"):
            got = operands.unit_stride(t, kind, validation.copied)
        assert got.is_contiguous() and torch.equal(got, t)
    for t, kind in ((torch.randn(16), "row"), (torch.randn(4, 1), "col"), (torch.randn(4, 16), "full")):
        assert operands.unit_stride(t, kind, validation.copied) is t
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(Exception, match="copies a row operand"):
        operands.unit_stride(row, "row", validation.copied)


def test_gemm_dispatcher_refuses_what_op_gemm_does_not_serve():
    op = mxq.fused_quant(act="swiglu", colwise=True)(_plus)
    with pytest.raises(ValueError, match="gated"):
        op.dispatcher(gemm=True)
    with pytest.raises(ValueError, match="gated"):
        op.register("gemm_refused", gemm=True)


def _plus(x, b):
    return x + b


@pytest.mark.gpu
@pytest.mark.parametrize("op", [bias_gelu_gemm, bias_gelu_mx_sw, plus_bias_amax, plus_bias_dbias, plus_bias_mx_col_sw,
                                plus_bias_both_dbias, plus_bias_tr], ids=lambda o: o.__name__)
def test_gpu_gemm_dispatcher_writes_op_gemms_bytes(op):
    """op.gemm's dispatcher on CUDA tensors (the caller's stream) writes op.gemm's bytes (and
    its amax into a stale slot, zeroed on that stream first). CPU counterpart:
    test_gemm_dispatcher_writes_what_op_gemm_writes."""
    a = torch.randn(300, 256, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(520, 256, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(520, dtype=torch.bfloat16, device="cuda")
    want = op.gemm(a, w, b)
    dests, like = _dest_args(op, 300, 520, device="cuda", stale_amax=1e30)
    op.dispatcher(gemm=True)(a, w, b, *dests)
    torch.cuda.synchronize()
    assert compare(like, want, exact=True) == []  # (dbias too: the same kernel's, in the same order)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 65, 129, 200])
def test_gpu_gemm_amax_leaves_out_rows_past_m(m, form):
    """Every output value exactly 0 (a's first column 1, the rest 0; w's first column -b: x + b =
    0), so the amax is 0; a row past M (the tile's padding, a cluster's padding tile) holds the
    op of a zero accumulator, b, which must not enter it. An empty product's amax is 0 too,
    into a stale out=. CPU counterpart: test_amax_is_one_atomic_per_warp_in_the_epilogue (the
    epilogue's amax in PTX), test_bench_fused_rows_check_on_the_cpu_route (the amax row's reference)."""
    _skip_outside_form(plus_bias_amax)
    n, k = 264, 64
    b = ((torch.arange(n, device="cuda") % 7) - 3.5).to(torch.bfloat16)  # (|b| >= 0.5: never 0)
    a = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
    a[:, 0] = 1.0
    w = torch.zeros(n, k, device="cuda", dtype=torch.bfloat16)
    w[:, 0] = -b
    t = plus_bias_amax.gemm(a, w, b)
    assert float(t.amax) == 0.0 and float(b.float().abs().min()) > 0
    out = mxq.MXFP8Tensor.empty(plus_bias_amax.spec, (0, n), a.dtype, "cuda", row_align=1)
    out.amax.fill_(5.0)
    assert float(plus_bias_amax.gemm(a[:0], w, b, out=out).amax) == 0.0


def test_bad_tensors_are_named_before_anything_runs():
    a, w = _ab()
    b = torch.zeros(16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="a must be bfloat16 or float16"):
        plus_bias.gemm(a.float(), w.float(), b)
    with pytest.raises(ValueError, match="N \\(w.shape\\[0\\]\\) must be a multiple of 8"):
        plus_bias.gemm(a, w[:12], b[:12])
    with pytest.raises(ValueError, match="argument 'b' of shape \\(15,\\) does not broadcast"):
        plus_bias.gemm(a, w, torch.zeros(15, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="argument 'b' must have a's dtype"):
        plus_bias.gemm(a, w, b.float())
    with pytest.raises(ValueError, match="acc_out must be a torch.float32 tensor of shape \\(4, 16\\)"):
        plus_bias.gemm(a, w, b, acc_out=torch.zeros(4, 15))
    for meta in ((a.to("meta"), w), (a, w.to("meta")), (a.to("meta"), w.to("meta"))):  # (not the epilogue's 'x')
        name = "a" if meta[0].is_meta else "w"
        with pytest.raises(ValueError, match=f"mxq.gemm: {name} is on the meta device"):
            plus_bias.gemm(*meta, b)
    # (an operand passed by keyword is named by its parameter, not by its place among the tensors)
    with pytest.raises(ValueError, match="argument 'r' of shape \\(5,\\) does not broadcast"):
        scaled_residual_mx.gemm(a, w, b, r=torch.zeros(5, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="argument 's' of shape \\(5,\\) does not broadcast"):
        scaled_residual_mx.gemm(a, w, torch.zeros(5, dtype=torch.bfloat16), b)


def test_subclassed_and_sparse_tensors_are_named_before_the_gemm_runs():
    """a, w, the operands and act_input are plain dense tensors, each refused by its name before
    the GEMM: a tensor subclass as a or w was refused as the epilogue's accumulator only after the
    matmul had written acc_out, and a sparse operand with out= or acc_out= crashed in the overlap
    check (no data pointer)."""
    from torch.testing._internal.two_tensor import TwoTensor

    a, w = _ab()
    b = torch.zeros(16, dtype=torch.bfloat16)
    acc = torch.full((4, 16), -7.0)
    for args, name in (((TwoTensor(a, a.clone()), w, b), "a"), ((a, TwoTensor(w, w.clone()), b), "w"),
                       ((a, w, TwoTensor(b, b.clone())), "b")):
        with pytest.raises(TypeError, match=f"argument '{name}' is a TwoTensor"):
            plus_bias.gemm(*args, acc_out=acc)
        assert bool((acc == -7.0).all()), name  # (nothing ran)
    out = mxq.MXFP8Tensor.empty(plus_bias.spec, (4, 16), a.dtype, "cpu", row_align=1)
    for given in (dict(out=out), dict(acc_out=acc), {}):
        with pytest.raises(TypeError, match="argument 'b' must be a dense strided tensor"):
            plus_bias.gemm(a, w, b.to_sparse(), **given)
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="argument 'act_input' is a TwoTensor"):
        dgelu_both.gemm(a, w, act_input=TwoTensor(x, x.clone()), acc_out=acc)
    assert bool((acc == -7.0).all())


# --- CPU: the reference on the fp32 accumulator -----------------------------------------------
def _f32_rows(t):
    return [[float(v) for v in row] for row in t.tolist()]


@pytest.mark.parametrize("mode", ["pow2", "fp32"])
def test_cpu_gemm_is_the_op_on_the_fp32_accumulator_fp8_block(mode):
    """FP8 block scaling: codes and scales of fp32(acc + b) by the independent oracle; N = 136,
    a partial second 1x128 block."""
    op = mxq.fused_quant(format="fp8_block", block=(1, 128), scale_mode=mode)(plus_bias.fn)
    a, w = _ab(5, 136, 24)
    b = torch.randn(136).to(torch.bfloat16)
    acc = torch.empty(5, 136)
    t = op.gemm(a, w, b, acc_out=acc)
    assert torch.equal(acc, a.float() @ w.float().t())
    v = _f32_rows(acc + b.float())
    codes, scales = oracle_fp8_block.quantize(v, "e4m3", (1, 128), mode, "fp32")
    assert t.rowwise_data.view(torch.uint8).tolist() == codes
    assert t.rowwise_scale.tolist() == scales


def test_cpu_gemm_is_the_op_on_the_fp32_accumulator_mxfp8():
    a, w = _ab(3, 64, 16)
    b = torch.randn(64).to(torch.bfloat16)
    acc = torch.empty(3, 64)
    t = plus_bias_mx.gemm(a, w, b, acc_out=acc)
    codes, scales = oracle.quantize_rows(_f32_rows(acc + b.float()), "e4m3", plus_bias_mx.spec.scale_mode)
    assert t.rowwise_data.view(torch.uint8).tolist() == codes
    assert t.rowwise_scale.tolist() == scales


def _t(rows):
    return [list(col) for col in zip(*rows)]


def test_cpu_gemm_colwise_is_the_op_on_the_fp32_accumulator():
    """The colwise copy on CPU by the independent oracles, on the columns of fp32(acc + b): MXFP8
    32-row blocks (M = 70: a partial third block; compact and, colwise alone, swizzled scales)
    and FP8 block scaling 128-row blocks (M = 130: a partial second block), with the rowwise
    copy beside."""
    a, w = _ab(70, 64, 16)
    b = torch.randn(64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    acc = torch.empty(70, 64)
    op = mxq.fused_quant(colwise=True)(plus_bias.fn)
    mode = op.spec.scale_mode
    assert mode == plus_bias_mx_col_sw.spec.scale_mode
    t = op.gemm(a, w, b, acc_out=acc)
    v = _f32_rows(acc + b.float())
    codes, scales = oracle.quantize_rows(_t(v), "e4m3", mode)
    assert t.colwise_data.view(torch.uint8).tolist() == _t(codes)
    assert t.colwise_scale.tolist() == _t(scales)
    assert t.rowwise_data.view(torch.uint8).tolist() == oracle.quantize_rows(v, "e4m3", mode)[0]
    t = plus_bias_mx_col_sw.gemm(a, w, b)
    assert t.rowwise_data is None and t.colwise_data.view(torch.uint8).tolist() == _t(codes)
    flat = t.colwise_scale.reshape(-1).tolist()
    for j, col in enumerate(scales):  # (column j's blocks: the 128x4 atoms, as oracle.swizzle_offset places them)
        assert [flat[oracle.swizzle_offset(j, rb, 3)] for rb in range(3)] == col
    assert float(t.amax) == max(abs(x) for row in v for x in row)
    a, w = _ab(130, 136, 24)
    b = torch.randn(136, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    acc = torch.empty(130, 136)
    t = bias_gelu_both.gemm(a, w, b, acc_out=acc)
    ref = bias_gelu_both.reference(acc, b.float())
    assert compare(t, ref, exact=False, v_bound=v_bound(bias_gelu_both, acc, b.float())) == []
    op = mxq.fused_quant(format="fp8_block", block=(1, 128), colwise=True, fp8="e5m2", scale_mode="fp32")(plus_bias.fn)
    t = op.gemm(a, w, b, acc_out=acc)
    v = _f32_rows(acc + b.float())
    codes, scales = oracle_fp8_block.quantize(_t(v), "e5m2", (1, 128), "fp32", "fp32")
    assert t.colwise_data.view(torch.uint8).tolist() == _t(codes)
    assert t.colwise_scale.tolist() == _t(scales)
    t = plus_bias_tr.gemm(a, w, b)  # (the transposed copy [N, M], its 1x128 scales outer-dim-major)
    assert t.rowwise_data is None and t.colwise_data.shape == (136, 130)
    assert t.colwise_data.view(torch.uint8).tolist() == codes
    assert t.colwise_scale.shape == (136, 2) and t.colwise_scale.stride() == (1, 136)
    assert t.colwise_scale.tolist() == scales


def test_cpu_gemm_takes_operands_and_floats_as_a_call_does():
    """Column scale, full residual and a float by keyword: op.reference on the accumulator."""
    a, w = _ab(6, 256, 32)
    s = torch.rand(6, 1).to(torch.bfloat16)
    r = torch.randn(6, 256).to(torch.bfloat16)
    acc = torch.empty(6, 256)
    for op in (scaled_residual, scaled_residual_mx):
        t = op.gemm(a, w, s, r, alpha=0.75, acc_out=acc)
        ref = op.reference(acc, s.float(), r.float(), alpha=0.75)
        assert torch.equal(t.rowwise_data.view(torch.uint8), ref.rowwise_data.view(torch.uint8))
        assert torch.equal(t.rowwise_scale, ref.rowwise_scale)


@mxq.fused_quant
def _scale_first(s: float, acc, r):
    return acc * s + r


def test_the_accumulator_is_the_first_tensor_wherever_it_stands():
    """The accumulator binds to the epilogue's first tensor, also after a float parameter: the
    other arguments positional, by name or both, the positional ones filling the parameters
    not given by name in order (`gemm(a, w, r, s=2.0)`: r is r, not s); the accumulator given
    by name is refused by name."""
    a, w = _ab(6, 32, 16)
    r = torch.randn(6, 32).to(torch.bfloat16)
    acc = torch.empty(6, 32)
    want = _scale_first.gemm(a, w, 2.0, r, acc_out=acc)
    ref = _scale_first.reference(2.0, acc, r.float())
    assert torch.equal(want.rowwise_data.view(torch.uint8), ref.rowwise_data.view(torch.uint8))
    for got in (_scale_first.gemm(a, w, s=2.0, r=r), _scale_first.gemm(a, w, r=r, s=2.0),
                _scale_first.gemm(a, w, 2.0, r=r), _scale_first.gemm(a, w, r, s=2.0)):
        assert torch.equal(got.rowwise_data.view(torch.uint8), ref.rowwise_data.view(torch.uint8))
    with pytest.raises(TypeError, match="'acc' is the accumulator"):
        _scale_first.gemm(a, w, 2.0, r, acc=r)
    with pytest.raises(TypeError, match="too many positional"):
        _scale_first.gemm(a, w, 2.0, r, r)


# --- GPU: bit-exact against the reference on the kernel's own accumulator ----------------------
GPU_OPS = [bias_gelu, bias_gelu_gemm, bias_gelu_mx, bias_gelu_mx_sw, plus_bias, plus_bias_gemm, plus_bias_mx,
           plus_bias_mx_sw, plus_bias_amax, bias_gelu_mx_amax, plus_bias_dbias, bias_gelu_mx_dbias, bias_gelu_mx_both,
           plus_bias_mx_col_sw, bias_gelu_both, plus_bias_both_dbias, bias_gelu_gemm_both, plus_bias_tr]
SHAPES = [(1, 8, 8), (128, 256, 64), (200, 264, 72), (300, 520, 1000), (257, 1032, 136), (1024, 768, 512),
          (2176, 2048, 256), (3, 784, 136)]  # (2176: 272 ping-pong tiles on 132 CTAs, some with an odd count)
# (N % 16 == 0 stages the rowwise data for TMA stores, runtime/gemm.stages_rows: 256, 768, 2048 and 784, whose
# last N tile holds 16 columns, its TMA boxes past N; the others store from registers)
# the shapes each op also runs in the kernel forms the library does not launch it in (a fifth of
# the GPU suite's time went to every shape in all four forms): one tile, K % 64 != 0 with partial
# M and N tiles, many tiles with an odd count, a staged tile of 3 rows and 16 columns
OTHER_FORM_SHAPES = [(1, 8, 8), (300, 520, 1000), (2176, 2048, 256), (3, 784, 136)]


@mxq.fused_quant(act="gelu")
def gelu_mx(x):
    return x


@mxq.fused_quant(act="gelu", amax=True, scale_layout="swizzled")
def gelu_mx_amax_sw(x):
    return x


# ops whose epilogue reads the accumulator alone: what runtime/gemm.kernel_for runs on the 128 x 192
# ping-pong tile on an H100 (wide_serves), in every form as GPU_OPS
ACC_ALONE_OPS = [gelu_mx, gelu_mx_amax_sw]



def _acc_bound(a, w):
    """The fp32 accumulator's bound against the float64 product (bench/gemm.py's): 8 sqrt(K)
    2^-24 |A| |W|^T."""
    k = a.shape[1]
    return 8 * math.sqrt(k) * 2.0 ** -24 * (a.double().abs() @ w.double().abs().t())


def _check_against_reference(op, a, w, *operands, **params):
    acc = torch.full((a.shape[0], w.shape[0]), float("nan"), device=a.device)
    t = op.gemm(a, w, *operands, acc_out=acc, **params)
    exact = a.double() @ w.double().t()
    assert ((acc.double() - exact).abs() <= _acc_bound(a, w)).all()
    _same_as_reference(op, t, acc, *operands, **params)
    return t


def _same_as_reference(op, t, acc, *operands, **params):
    """t against op.reference on the accumulator ``acc``: every byte for ops of the exact class,
    docs/NUMERICS.md's transcendental class (gelu) through mxq.testing.compare otherwise; the
    scales' padding (GEMM-ready, swizzled) included."""
    args = (acc, *[o.float() for o in operands])
    if params.get("act_input") is not None:  # (the GEMM reads a's dtype; the reference's fp32 call an fp32 copy)
        params = dict(params, act_input=params["act_input"].float())
    ref = op.reference(*args, **params)
    if ref.dbias is not None:  # (the column sums: dbias_close, in a's dtype; the rest as any op's)
        dbias_close(op, t, args, ref, **params)
        ref.dbias = None
        t = dataclasses.replace(t, dbias=None)
    exact = is_exact(op)
    assert compare(t, ref, exact, v_bound=None if exact else v_bound(op, *args, **params)) == []
    for d in ("rowwise", "colwise"):
        if getattr(op.spec, d):
            flat_t, flat_ref = launch_flat(getattr(t, f"{d}_scale")), launch_flat(getattr(ref, f"{d}_scale"))
            if exact:
                assert torch.equal(flat_t.view(torch.uint8), flat_ref.view(torch.uint8))
            else:
                assert flat_t.shape == flat_ref.shape


def dbias_close(op, t, args, ref, **params):
    """op.gemm's dbias ([N], a's dtype) against the float64 column sums of the op's values on
    the kernel's accumulator (mxq.testing.v_abs_sum's values, summed signed): within one ulp of
    the dtype plus 2^-18 of the column's sum of |v| (the epilogue adds fp32 partials of 16 rows
    each, in another order than the reference's fp64 sum; a column that cancels may not keep a
    relative ulp), NaN where the sum is NaN."""
    from mxq.testing import v_abs_sum

    want = ref.dbias.double().cpu()
    got = t.dbias.double().cpu()
    assert t.dbias.dtype in (torch.bfloat16, torch.float16) and t.dbias.shape == ref.dbias.shape  # (a's dtype)
    va = v_abs_sum(op, *args, **params).double().cpu().reshape(want.shape)
    va = torch.where(torch.isfinite(va), va, torch.zeros_like(va))
    bound = torch.finfo(t.dbias.dtype).eps * want.abs() + 2.0 ** -18 * va + torch.finfo(t.dbias.dtype).tiny
    ok = ((got - want).abs() <= bound) | (got.isnan() & want.isnan()) | (got == want)
    assert bool(ok.all()), f"dbias: {int((~ok).sum())} of {ok.numel()} columns off"


def _in_form(op) -> bool:
    """Whether op.gemm of ``op`` runs the kernel form the ``form`` fixture set: where the form's
    ping-pong tile does not serve the op (runtime/gemm.serves: 128-row colwise blocks in any,
    FP8 block scaling's 1x128 blocks in 192 columns) it runs cooperative whatever PINGPONG says,
    and on the tiles of 192 accumulators a thread (128 x 192, 192 x 128) only what reads the
    accumulator alone runs without spills (wide_serves), so under such a form its test is skipped
    (the fixture checks every compile's form; the other forms' tests cover the op)."""
    if g.PINGPONG and g.PP_TILE[0] * g.PP_TILE[1] == 192 * 128 and not g.wide_serves(op, g.PP_TILE):
        return False
    return g.kernel_for(op).pingpong == g.PINGPONG


def _skip_outside_form(op):
    if not _in_form(op):
        pytest.skip("the form's ping-pong tile does not take this op (its other forms' test ids)")


def _library_form(op) -> bool:
    """Whether the ``form`` fixture set the kernel op.gemm of ``op`` runs in the library on this
    GPU (runtime/gemm.kernel_for under the library's settings, K unknown: the short-K choice)."""
    now = g.kernel_for(op)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in LIBRARY_FORM.items():
            mp.setattr(g, name, value)
        lib = g.kernel_for(op)
    return (now.pingpong, now.tile, now.cluster_m) == (lib.pingpong, lib.tile, lib.cluster_m)


# (read at import, before the form fixture sets them)
LIBRARY_FORM = {"PINGPONG": g.PINGPONG, "CLUSTER_M": g.CLUSTER_M, "PP_TILE": g.PP_TILE, "ORDER": g.ORDER}


def launch_flat(s):
    from mxq.runtime.launch import flat_scale

    return flat_scale(s)


@pytest.mark.gpu
@pytest.mark.parametrize("op", GPU_OPS + ACC_ALONE_OPS, ids=lambda o: o.__name__)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_gemm_bytes_equal_the_reference_on_its_accumulator(op, shape, form):
    """Every GPU op (and those reading the accumulator alone: the 128 x 192 tile's on an H100, with
    partial 192-column tiles at N = 8, 264, 520, 1032) at every shape in the form the library
    launches it in, and at OTHER_FORM_SHAPES in the other forms, against the reference on the
    kernel's accumulator."""
    _skip_outside_form(op)
    if shape not in OTHER_FORM_SHAPES and not _library_form(op):
        pytest.skip("the other kernel forms run OTHER_FORM_SHAPES")
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    _check_against_reference(op, a, w, *((b,) if len(op.epilogue.tensor_params) > 1 else ()))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [dgelu_both, drelu_scaled_gemm], ids=lambda o: o.__name__)
@pytest.mark.parametrize("shape", [(1, 8, 8), (200, 264, 72), (257, 1032, 136), (1024, 768, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_gemm_dact_bytes_equal_the_reference_on_its_accumulator(op, shape, form):
    """The backward's dgrad GEMM with the activation's derivative: dact(act_input) times the
    op's value, both directions, dbias, against the reference on the kernel's accumulator. CPU
    counterpart: test_cpu_gemm_dact_is_the_value_times_the_derivative_at_act_input."""
    _skip_outside_form(op)
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    x = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
    ops = [torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)] if op is drelu_scaled_gemm else []
    _check_against_reference(op, a, w, *ops, act_input=x)


@pytest.mark.gpu
@pytest.mark.parametrize("op", [scaled_residual, scaled_residual_mx, scaled_residual_dbias], ids=lambda o: o.__name__)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gemm_column_full_and_float_operands(op, dtype, form):
    _skip_outside_form(op)
    m, n, k = 333, 392, 264
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=gen) / 16).to(dtype)
    s = torch.rand(m, 1, device="cuda", generator=gen).to(dtype)
    r = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    _check_against_reference(op, a, w, s, r, alpha=0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("op", [bias_gelu, bias_gelu_mx_sw, bias_gelu_mx_both, bias_gelu_both, bias_gelu_gemm_both],
                         ids=lambda o: o.__name__)
def test_gpu_gemm_without_the_hook_writes_the_same_bytes(op, form):
    _skip_outside_form(op)
    m, n, k = 515, 1288, 392
    gen = torch.Generator(device="cuda").manual_seed(9)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / 20).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    hooked = _check_against_reference(op, a, w, b)
    plain = op.gemm(a, w, b)
    for d in ("rowwise", "colwise"):
        if getattr(op.spec, d):
            assert torch.equal(getattr(plain, f"{d}_data").view(torch.uint8), getattr(hooked, f"{d}_data").view(torch.uint8))
            assert torch.equal(launch_flat(getattr(plain, f"{d}_scale")), launch_flat(getattr(hooked, f"{d}_scale")))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [bias_gelu_gemm, bias_gelu_mx_sw, plus_bias_amax, bias_gelu_mx_dbias, bias_gelu_mx_both,
                                plus_bias_mx_col_sw, plus_bias_both_dbias, bias_gelu_gemm_both, plus_bias_tr],
                         ids=lambda o: o.__name__)
def test_gpu_gemm_into_out_writes_the_allocating_bytes(op, form):
    """out= on the H200: the poisoned buffer gets the allocating call's bytes, partial tiles
    included; the call returns it. CPU counterpart:
    test_out_receives_the_allocating_calls_bytes_and_bad_outs_are_named."""
    _skip_outside_form(op)
    gen = torch.Generator(device="cuda").manual_seed(12)
    a = torch.randn(515, 392, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(1288, 392, device="cuda", generator=gen) / 20).to(torch.bfloat16)
    b = torch.randn(1288, device="cuda", generator=gen).to(torch.bfloat16)
    o = mxq.MXFP8Tensor.empty(op.spec, (515, 1288), a.dtype, "cuda", row_align=1)
    for d in ("rowwise", "colwise"):
        if getattr(op.spec, d):
            getattr(o, f"{d}_data").view(torch.uint8).fill_(0x5A)
            if getattr(o, f"{d}_scale").dtype == torch.float32:  # (the logical entries: padding stays zero)
                getattr(o, f"{d}_scale").fill_(float("nan"))
    if o.amax is not None:  # (a stale amax above the product's: the call starts it from zero)
        o.amax.fill_(1e30)
    if o.dbias is not None:
        o.dbias.fill_(float("nan"))
    want = op.gemm(a, w, b)
    assert op.gemm(a, w, b, out=o) is o
    for d in ("rowwise", "colwise"):
        if getattr(op.spec, d):
            assert torch.equal(getattr(o, f"{d}_data").view(torch.uint8), getattr(want, f"{d}_data").view(torch.uint8))
            assert torch.equal(launch_flat(getattr(o, f"{d}_scale")), launch_flat(getattr(want, f"{d}_scale")))
    if o.amax is not None:
        assert torch.equal(o.amax, want.amax) and 0 < float(want.amax) < 1e30
    if o.dbias is not None:  # (the same kernels in the same order: the same bits)
        assert torch.equal(o.dbias, want.dbias) and not bool(want.dbias.isnan().any())


@pytest.mark.gpu
@pytest.mark.parametrize("op", [bias_gelu_gemm, bias_gelu_mx_sw], ids=lambda o: o.__name__)
def test_gpu_compiled_gemm_writes_the_eager_bytes(op):
    """op.gemm under torch.compile on the H200 (one torch.ops.mxq.fused_gemm node; inductor, static
    and dynamic M): the eager call's bytes, partial tiles included. CPU counterpart:
    tests/test_torch_ops.py::test_op_gemm_compiles_to_one_node_with_the_eager_bytes."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    w = (torch.randn(1288, 392, device="cuda", generator=gen) / 20).to(torch.bfloat16)
    b = torch.randn(1288, device="cuda", generator=gen).to(torch.bfloat16)
    for dynamic in (False, True):
        torch._dynamo.reset()
        f = torch.compile(lambda a, w, b: op.gemm(a, w, b), fullgraph=True, dynamic=dynamic)
        for m in (515, 128):
            a = torch.randn(m, 392, device="cuda", generator=gen).to(torch.bfloat16)
            got, want = f(a, w, b), op.gemm(a, w, b)
            assert torch.equal(got.rowwise_data.view(torch.uint8), want.rowwise_data.view(torch.uint8)), (m, dynamic)
            assert torch.equal(launch_flat(got.rowwise_scale), launch_flat(want.rowwise_scale)), (m, dynamic)


def _specials(device):
    """A, W and a bias with planted specials: an inf in a row of A (that row's accumulator
    inf/NaN), a zero row (blocks of amax 0), a NaN in a row of W (that column NaN in every row:
    a 128-row colwise block of NaN alone, whose FP8 block-scaling amax is 0), a huge bias
    (saturation)."""
    m, n, k = 130, 264, 64
    gen = torch.Generator(device=device).manual_seed(3)
    a = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, device=device, generator=gen).to(torch.bfloat16)
    a[3, 5] = float("inf")
    a[7, :] = 0
    w[40, 9] = float("nan")
    b = torch.randn(n, device=device, generator=gen).to(torch.bfloat16)
    b[17] = 3e38
    return a, w, b


@pytest.mark.gpu
def test_gpu_gemm_specials_nan_and_overflow_in_the_accumulator(form):
    """FP8 block scaling drops NaN from its block amax, MXFP8 propagates it; both as the
    reference on the kernel's accumulator."""
    a, w, b = _specials("cuda")
    # (no dbias op: the planted 3e38 bias overflows the epilogue's fp32 partials of 16 rows, which
    # an inf row of the other sign then meets as NaN where the reference's fp64 sum keeps -inf)
    for op in (bias_gelu, bias_gelu_mx, plus_bias, plus_bias_mx, plus_bias_amax, bias_gelu_mx_amax, bias_gelu_mx_both,
               plus_bias_mx_col_sw, bias_gelu_both, bias_gelu_gemm_both, *ACC_ALONE_OPS):
        if _in_form(op):
            _check_against_reference_loose_acc(op, a, w, *((b,) if len(op.epilogue.tensor_params) > 1 else ()))


def test_cpu_counterpart_of_the_gpu_checks():
    """The GPU tests' checks, run on the CPU route (the reference on torch's fp32 matmul): a
    random shape with partial tiles, the operands and floats, the specials."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(200, 72, generator=gen).to(torch.bfloat16)
    w = (torch.randn(264, 72, generator=gen) / 8).to(torch.bfloat16)
    b = torch.randn(264, generator=gen).to(torch.bfloat16)
    for op in (bias_gelu_gemm, plus_bias_mx_sw, plus_bias_dbias, bias_gelu_mx_dbias, bias_gelu_mx_both, plus_bias_mx_col_sw,
               bias_gelu_both, plus_bias_both_dbias, bias_gelu_gemm_both, plus_bias_tr):
        _check_against_reference(op, a, w, b)
    s, r = torch.rand(200, 1, generator=gen).to(torch.bfloat16), torch.randn(200, 264, generator=gen).to(torch.bfloat16)
    _check_against_reference(scaled_residual, a, w, s, r, alpha=0.5)
    for op in ACC_ALONE_OPS:
        _check_against_reference(op, a, w)
    a, w, b = _specials("cpu")
    for op in (bias_gelu, plus_bias_mx, plus_bias_amax, plus_bias_dbias, bias_gelu_mx_both, bias_gelu_both):
        _check_against_reference_loose_acc(op, a, w, b)


def test_cpu_one_row_of_gemm_ready_scales():
    """M = 1 with GEMM-ready scales (the GPU test's 1x8x8 shape): [1, ceil(N/128)] views of
    strides (1, 4), whose reshape(-1) keeps stride 4. The checks compare their bytes, and the
    flat scale buffer op.gemm launches with is of unit stride (launch_gemm's compact 1-D scales)."""
    for n in (8, 136):
        a, w = _ab(1, n, 8)
        b = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
        for op in (bias_gelu_gemm, plus_bias_gemm):
            t = _check_against_reference(op, a, w, b)
            assert t.rowwise_scale.stride() == (1, 4)
            assert launch_flat(t.rowwise_scale).stride() == (1,)


def _check_against_reference_loose_acc(op, a, w, *operands):
    acc = torch.empty((a.shape[0], w.shape[0]), device=a.device)
    t = op.gemm(a, w, *operands, acc_out=acc)
    _same_as_reference(op, t, acc, *operands)


@pytest.mark.gpu
def test_gpu_gemm_empty_m_returns_empty_outputs(form):
    a = torch.zeros(0, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.zeros(256, 64, device="cuda", dtype=torch.bfloat16)
    t = bias_gelu.gemm(a, w, torch.zeros(256, device="cuda", dtype=torch.bfloat16))
    assert t.rowwise_data.shape == (0, 256)
    out = mxq.MXFP8Tensor.empty(plus_bias_dbias.spec, (0, 256), a.dtype, "cuda", row_align=1)
    out.dbias.fill_(3.0)  # (an empty product's column sums: 0, as the reference's)
    assert plus_bias_dbias.gemm(a, w, torch.zeros(256, device="cuda", dtype=a.dtype), out=out) is out
    assert bool((out.dbias == 0).all())


def test_bench_fused_rows_check_on_the_cpu_route():
    """bench/gemm.py's op.gemm rows (gelu + FP8 block scaling, gelu + MXFP8) check on op.gemm's
    CPU route (the timing needs the GPU)."""
    from .test_codegen import _bench_tool

    tool = _bench_tool("gemm")
    assert [(op.spec.format, op.spec.amax, op.spec.colwise, op.spec.dact) for op in tool.FUSED] == [
        ("fp8_block", False, False, None), ("mxfp8", False, False, None), ("fp8_block", True, False, None),
        ("mxfp8", False, True, None), ("fp8_block", False, True, None), ("fp8_block", False, True, "gelu")]
    for op in tool.FUSED:
        for form, suffix in (("cooperative", ""), ("pingpong", " pingpong"), ("cooperative1", " cluster1"),
                             ("pingpong1", " pingpong cluster1")):
            assert tool.runs_in(op, form) == (not (form.startswith("pingpong") and op.spec.format == "fp8_block"
                                                   and op.spec.colwise))
            if not tool.runs_in(op, form):
                continue
            row = tool.fused_row(op, 130, 264, 72, bench=False, device="cpu", form=form)
            assert row["checked"], row
            assert row["name"] == f"gemm_{op.__name__} 130x264x72" + suffix


def test_bench_runs_each_form_through_the_runtime_switch():
    """bench/gemm.py's --forms: cooperative and pingpong by default, each row run with
    mxq.runtime.gemm.PINGPONG and CLUSTER_M set to its form's and restored after (cooperative1,
    pingpong1: each form without clusters); an unknown name is refused before anything runs."""
    from .test_codegen import _bench_tool

    tool = _bench_tool("gemm")
    assert tool.DEFAULT_FORMS == ("cooperative", "pingpong")
    base = {*tool.DEFAULT_FORMS, "cooperative1", "pingpong1", "pingpong128x128", "pingpong128x192", "pingpong128x192n8",
            "cooperativen8", "pingpong192x128", "pingpong192x128n2", "pingpong192x128c1", "library"}
    assert set(tool.FORMS) == base | {f"{f}-direct" for f in base}
    for form in base:  # (-direct: the same kernel, its rowwise data stored from registers)
        assert tool.FORMS[f"{form}-direct"] == (*tool.FORMS[form][:2], tool.FORMS[form][2] + " direct",
                                                 *tool.FORMS[form][3:5], False)
        assert tool.FORMS[form][5] is None
    with tool.use_form("pingpong-direct"):
        assert g.PINGPONG is True and g.STAGE_ROWS is False and not g.kernel_for(tool.gelu_mxfp8, 64, 4096).stage_rows
    assert g.STAGE_ROWS is None and g.kernel_for(tool.gelu_mxfp8, 64, 4096).stage_rows
    before = g.PINGPONG, g.CLUSTER_M, g.PP_TILE, g.ORDER
    for form, want in (("cooperative", (False, before[1], before[2], before[3])),
                       ("pingpong", (True, before[1], before[2], before[3])),
                       ("cooperative1", (False, 1, before[2], before[3])), ("pingpong1", (True, 1, before[2], before[3])),
                       ("pingpong128x128", (True, before[1], (128, 128), before[3])),
                       ("pingpong128x192", (True, before[1], (128, 192), before[3])),
                       ("pingpong128x192n8", (True, before[1], (128, 192), -8)),
                       ("cooperativen8", (False, before[1], before[2], -8)),
                       ("pingpong192x128", (True, before[1], (192, 128), before[3])),
                       ("pingpong192x128n2", (True, before[1], (192, 128), -2)),
                       ("pingpong192x128c1", (True, 1, (192, 128), before[3])), ("library", before)):
        with tool.use_form(form):
            assert (g.PINGPONG, g.CLUSTER_M, g.PP_TILE, g.ORDER) == want and g.cluster_for() == want[1]
            kern = g.kernel_for(None, 8192, 14336, 4096)
            rule = (g.wide_order(8192, 14336, kern.cluster_m) if kern.pingpong and kern.tile == g.WIDE_TILE
                    else g.swizzle_for(14336, kern.tile[1]))  # (the order kernel_for's rule gives: any GPU)
            assert kern.order == (rule if want[3] is None else want[3])
        assert (g.PINGPONG, g.CLUSTER_M, g.PP_TILE, g.ORDER) == before
    # (a row's block inside a tile: MXFP8's 32 in 192 columns, FP8 block scaling's 128 not; no colwise copy there)
    assert tool.runs_in(tool.gelu_mxfp8, "pingpong128x192") and not tool.runs_in(tool.gelu_fp8_block, "pingpong128x192")
    assert not tool.runs_in(tool.gelu_mxfp8_both, "pingpong128x192n8") and tool.runs_in(tool.gelu_mxfp8, "pingpong128x128")
    assert tool.runs_in(tool.gelu_fp8_block, "pingpong192x128")  # (1x128 in 128 columns)
    assert not tool.runs_in(tool.gelu_fp8_block_both, "pingpong192x128")  # (the colwise copy would spill)
    assert all(tool.runs_in(op, "library") for op in tool.FUSED)
    for argv in (["--forms", "cooperative,pinpong"], ["--no-plain", "--swizzle=-8"], ["--no-plain", "--no-fused"]):
        with pytest.raises(SystemExit):
            tool.main(argv)


def test_gemm_checks_its_floats_as_a_call_does():
    """op.gemm's float parameters are checked as a call's, by name (a bool, a string or a
    tensor ran as a number; None a bare float() error)."""
    a, w = _ab(6, 32, 16)
    r = torch.randn(6, 32).to(torch.bfloat16)
    for bad, kind in ((True, "bool"), ("0.5", "str"), (torch.tensor(0.5), "Tensor"), (None, "NoneType"),
                      ([0.5], "list")):
        with pytest.raises(TypeError, match=f"argument 's' must be a float, got {kind}"):
            _scale_first.gemm(a, w, r, s=bad)
    _scale_first.gemm(a, w, r, s=2)  # (an int: a number)


def _posonly_scale(acc, s: float, /):
    return acc * s


def test_gemm_refuses_a_positional_only_float_by_name():
    """op.gemm binds as a call does: a positional-only parameter given by keyword is refused."""
    op = mxq.fused_quant(_posonly_scale)
    a, w = _ab(6, 32, 16)
    with pytest.raises(TypeError, match="'s' parameter is positional only"):
        op.gemm(a, w, s=2.0)
    assert torch.equal(op.gemm(a, w, 2.0).rowwise_data.view(torch.uint8),
                       op.reference(torch.matmul(a.float(), w.float().t()), 2.0).rowwise_data.view(torch.uint8))
