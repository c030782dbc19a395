"""NVFP4 and MXFP4 (mxq/formats/fp4.py and the reference): bit-exact against tests/oracle_fp4.py
and hand vectors, every format, mode, dtype, layout and edge; the Hadamard transform against a
float64 matrix product; stochastic rounding's statistics and determinism."""

import math
import struct

import pytest
import torch

import mxq
from mxq.formats import fp4
from tests import oracle_fp4 as oracle

NAN, INF = float("nan"), float("inf")


def f32_rows(v: torch.Tensor) -> list:
    return v.to(torch.float32).reshape(-1, v.shape[-1]).tolist()


def codes_of(data: torch.Tensor) -> list:
    """Unpack bytes [R, C/2] in the test (low nibble first), independent of fp4.unpack."""
    return [[nib for b in row for nib in (b & 0xF, b >> 4)] for row in data.tolist()]


def scale_bytes(t: torch.Tensor) -> list:
    return t.contiguous().view(torch.uint8).tolist()


def edge_input(m, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-8, 8, (m, 1), generator=g).float())
    x[0, :min(n, 16)] = 0.0  # a zero block
    if m > 1:
        x[1, 3 % n] = NAN  # NaN elements enter no amax
        x[1, 20 % n] = -0.0
    if m > 2:
        x[2, 5 % n] = INF if dtype != torch.float16 else 60000.0
        x[2, 6 % n] = -INF if dtype != torch.float16 else -60000.0
    if m > 3:
        x[3, :] = x[3, :] * 1e-30 if dtype != torch.float16 else x[3, :] * 1e-6  # tiny: subnormal E4M3 scales
    return x.to(dtype)


# -- E2M1 --------------------------------------------------------------------------------------
def test_e2m1_round_to_nearest_even_hand_vectors():
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.2500001, 5.0000005, 7.0, INF, NAN, -NAN,
                      -0.1, -0.0, 0.0, -0.25, -6.0, -1e30, 1e-45])
    want = [0, 2, 2, 4, 4, 6, 6, 1, 7, 7, 7, 7, 7, 8, 8, 0, 8, 15, 15, 0]
    assert fp4.encode_rn(y).tolist() == want
    assert [oracle.e2m1(v) for v in y.tolist()] == want


def test_e2m1_every_fp32_near_the_grid_matches_the_oracle():
    grid = [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 8]
    vals = []
    for g in grid:
        b = struct.unpack("<I", struct.pack("<f", g))[0] if g else 1
        vals += [struct.unpack("<f", struct.pack("<I", b + d))[0] for d in (-2, -1, 0, 1, 2) if b + d > 0]
    vals += [-v for v in vals]
    y = torch.tensor(vals, dtype=torch.float32)
    assert fp4.encode_rn(y).tolist() == [oracle.e2m1(v) for v in y.tolist()]


def test_pack_puts_the_even_element_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    assert fp4.pack(codes).tolist() == [[0x21, 0x8F]]
    assert fp4.unpack(fp4.pack(codes)).tolist() == codes.tolist()


# -- NVFP4 -------------------------------------------------------------------------------------
def test_nvfp4_hand_vector():
    # global amax 5.25 = 2688/512: S_enc 512; sf = 512 * fp32(1/6); the block scale 448 (0x7E);
    # multiplier fp32(1 / (448 * 2^-9)) = fp32(8/7); 5.25 * 8/7 = 6 -> 7; 0.4375 * 8/7 = 0.5 -> 1
    x = torch.tensor([[5.25, -2.625, 0.4375, -0.0, 0.1, NAN] + [0.0] * 10])
    t = mxq.quantize(x, format="nvfp4")
    assert t.amax.item() == 5.25
    assert scale_bytes(t.rowwise_scale) == [[0x7E]]
    assert codes_of(t.rowwise_data)[0][:6] == [7, 13, 1, 8, 0, 7]


def test_nvfp4_zero_and_nan_only_tensors():
    t = mxq.quantize(torch.tensor([[0.0, -0.0, NAN, 0.0]]), format="nvfp4")
    assert t.amax.item() == 0.0
    assert scale_bytes(t.rowwise_scale) == [[0]]  # no lower clamp: a zero block stores 0
    assert codes_of(t.rowwise_data) == [[0, 8, 7, 0]]


def test_nvfp4_subnormal_and_zero_scale_bytes():
    # amax 2688: S_enc 1. Block 1 (amax 0.03): 0.03 * fp32(1/6) = 0.005 -> the E4M3 subnormal
    # 3 * 2^-9 (byte 3); multiplier fp32(1 / 0.005859375) = 170.66667: 0.03 -> 5.12 -> 6 (7),
    # -0.015 -> -2.56 -> -3 (0xD), 0.0075 -> 1.28 -> 1.5 (3), 0.002 -> 0.34 -> 0.5 (1). Block 2
    # (amax 2^-10): 2^-10 / 6 is below half E4M3's least subnormal -> byte 0, multiplier FLT_MAX:
    # 2^-10 saturates to 6 (7), -0.0 stays 0x8
    x = torch.zeros(1, 48)
    x[0, 0] = 2688.0
    x[0, 16:20] = torch.tensor([0.03, -0.015, 0.0075, 0.002])
    x[0, 32:35] = torch.tensor([2.0 ** -10, -0.0, 2.0 ** -11])
    t = mxq.quantize(x, format="nvfp4")
    assert scale_bytes(t.rowwise_scale) == [[0x7E, 3, 0]]
    codes = codes_of(t.rowwise_data)[0]
    assert codes[16:20] == [7, 0xD, 3, 1] and codes[32:35] == [7, 8, 7]
    want_codes, want_scales = oracle.nvfp4(f32_rows(x), 2688.0)
    assert (codes, scale_bytes(t.rowwise_scale)) == (want_codes[0], want_scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 40), (1, 18), (17, 32), (4, 2)])
@pytest.mark.parametrize("block_2d", [False, True])
def test_nvfp4_against_the_oracle(dtype, shape, block_2d):
    x = edge_input(*shape, dtype)
    t = mxq.quantize(x, format="nvfp4", colwise=shape[0] % 2 == 0, block_2d=block_2d)
    v = f32_rows(x)
    ga = oracle.amax([e for row in v for e in row])
    assert t.amax.item() == ga or (math.isinf(ga) and math.isinf(t.amax.item()))
    codes, scales = oracle.nvfp4(v, ga, 16 if block_2d else 1)
    assert codes_of(t.rowwise_data) == codes
    assert scale_bytes(t.rowwise_scale) == scales
    if t.colwise_data is not None:
        vt = [list(col) for col in zip(*v)]
        codes_t, scales_t = oracle.nvfp4(vt, ga, 16 if block_2d else 1)
        assert codes_of(t.colwise_data) == codes_t
        assert scale_bytes(t.colwise_scale) == scales_t


def test_nvfp4_block_2d_copies_are_numerically_identical():
    x = edge_input(48, 64, torch.bfloat16, seed=3)
    t = mxq.quantize(x, format="nvfp4", colwise=True, block_2d=True)
    a, b = t.dequantize("rowwise"), t.dequantize("colwise")
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_nvfp4_global_amax_given_skips_the_first_pass():
    x = torch.randn(8, 32)
    t = mxq.quantize(x, format="nvfp4", global_amax=10.0)
    assert t.amax.item() == 10.0
    codes, scales = oracle.nvfp4(f32_rows(x), 10.0)
    assert codes_of(t.rowwise_data) == codes and scale_bytes(t.rowwise_scale) == scales
    t2 = mxq.quantize(x, format="nvfp4", global_amax=torch.tensor(10.0))
    assert torch.equal(t2.rowwise_data, t.rowwise_data)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_nvfp4_given_amax_that_is_out_amax_is_read_before_it_is_written(device):
    """Delayed scaling into the same buffers: global_amax=t.amax with out=t quantizes by the given
    amax (the oracle's bytes at that amax), not by the values' own amax written over it first;
    likewise a grouped call's per-group amax and hadamard=True's pair (on CUDA: the kernels)."""
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(5))
    t = mxq.quantize(x.to(device), format="nvfp4", global_amax=2.0)
    got = mxq.quantize(x.to(device), format="nvfp4", global_amax=t.amax, out=t)
    codes, scales = oracle.nvfp4(f32_rows(x), 2.0)
    assert got.amax.item() == 2.0
    assert codes_of(got.rowwise_data.cpu()) == codes and scale_bytes(got.rowwise_scale.cpu()) == scales
    offs, per_group = torch.tensor([16, 16, 64]), torch.tensor([1.5, 2.0, 7.0])
    want = mxq.quantize(x, format="nvfp4", group_offsets=offs, global_amax=per_group)
    g = mxq.quantize(x.to(device), format="nvfp4", group_offsets=offs.to(device), global_amax=per_group.to(device))
    g = mxq.quantize(x.to(device), format="nvfp4", group_offsets=offs.to(device), global_amax=g.amax, out=g)
    assert g.amax.tolist() == [1.5, 2.0, 7.0]
    for f in ("rowwise_data", "rowwise_scale"):
        assert torch.equal(getattr(g, f).cpu().view(torch.uint8), getattr(want, f).view(torch.uint8)), f
    xb = x.bfloat16()
    want = mxq.quantize(xb, format="nvfp4", colwise=True, hadamard=True, global_amax=(1.0, 2.0))
    h = mxq.quantize(xb.to(device), format="nvfp4", colwise=True, hadamard=True, global_amax=(1.0, 2.0))
    h = mxq.quantize(xb.to(device), format="nvfp4", colwise=True, hadamard=True,
                     global_amax=(h.amax, h.colwise_amax), out=h)
    assert (h.amax.item(), h.colwise_amax.item()) == (1.0, 2.0)
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
        assert torch.equal(getattr(h, f).cpu().view(torch.uint8), getattr(want, f).view(torch.uint8)), f


def test_nvfp4_an_amax_of_inf_given_back_is_the_computed_one():
    """The amax of values holding inf is inf (N1); given back as global_amax (a number, a CPU
    tensor, a grouped call's per-group amax) it is taken, as N2 defines it, and gives the bytes of
    the call that computed it."""
    x = edge_input(64, 48, torch.float32, seed=9)
    t = mxq.quantize(x, format="nvfp4", colwise=True)
    assert t.amax.item() == math.inf
    for given in (math.inf, torch.tensor(math.inf), t.amax):
        g = mxq.quantize(x, format="nvfp4", colwise=True, global_amax=given)
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
            assert torch.equal(getattr(g, f).reshape(-1).view(torch.uint8),
                               getattr(t, f).reshape(-1).view(torch.uint8)), (given, f)
    offs = torch.tensor([16, 16, 40, 64])
    tg = mxq.quantize(x, format="nvfp4", group_offsets=offs)
    assert math.inf in tg.amax.tolist() and 0.0 in tg.amax.tolist()  # (an empty group's amax is 0)
    g = mxq.quantize(x, format="nvfp4", group_offsets=offs, global_amax=tg.amax)
    assert torch.equal(g.rowwise_data, tg.rowwise_data) and torch.equal(g.rowwise_scale.view(torch.uint8),
                                                                      tg.rowwise_scale.view(torch.uint8))
    for bad in (math.nan, -1.0, torch.tensor(math.nan), torch.tensor([1.0, -0.5, 2.0, 3.0])):
        with pytest.raises(ValueError, match="global_amax"):
            mxq.quantize(x, format="nvfp4", group_offsets=offs if isinstance(bad, torch.Tensor) and bad.dim()
                         else None, global_amax=bad)


@pytest.mark.parametrize("case", ["ordinary", "inf", "tiny", "given_zero", "huge", "subnormal"])
def test_nvfp4_dequantize_is_tes_formula_or_the_inverse_of_s_enc(case):
    """dequantize(): TE's fp32(e2m1 * fp32(fp32(scale * amax) * fp32(1/2688))) where S_enc was
    2688 / amax; where N2 clamped or replaced it (an inf in the tensor, an amax of 1e-36, a
    global_amax of 0 with data) or fp32(scale * amax) overflows (an amax of 3e37 and a block's
    scale above FLT_MAX / amax) the inverse of that S_enc, fp32(e2m1 * fp32(scale * fp32(1 /
    S_enc))); where N5 clamped the element multiplier to FLT_MAX (fp32 subnormals, amax 3e-39)
    e2m1 * fp32(1 / FLT_MAX): the values come back near the input's, not 0.39 of them, a twelfth
    of them, infinities or 0."""
    x = {"ordinary": torch.randn(6, 48, generator=torch.Generator().manual_seed(5)),
         "inf": edge_input(6, 48, torch.float32, seed=5),
         "tiny": torch.tensor([[1.0, -2.0, 3.0, 0.5] * 12] * 6) * 1e-36,
         "given_zero": torch.randn(6, 48, generator=torch.Generator().manual_seed(6)),
         "huge": torch.randn(6, 48, generator=torch.Generator().manual_seed(7)) * 1e37,
         "subnormal": torch.randn(6, 48, generator=torch.Generator().manual_seed(8)) * 1e-39}[case]
    t = mxq.quantize(x, format="nvfp4", **({"global_amax": 0.0} if case == "given_zero" else {}))
    got = t.dequantize()
    amax = t.amax.item()
    enc = oracle.s_enc(amax)
    as_te = amax not in (0.0, math.inf) and enc == oracle.div(2688.0, amax)
    assert as_te == (case in ("ordinary", "huge"))
    factor = oracle.round_f32(oracle.Fraction(1, 2688))
    codes = codes_of(t.rowwise_data)
    sc = scale_bytes(t.rowwise_scale)
    for r in range(6):
        for c in range(48):
            scale = float(oracle.e4m3_value(sc[r][c // 16]))
            te = oracle.mul(scale, amax)
            inverse = oracle.mul(scale, oracle.div(1.0, enc))
            per_block = (oracle.div(1.0, oracle.FLT_MAX) if inverse > 0 and math.isinf(oracle.div(1.0, inverse))
                         else oracle.mul(te, factor) if as_te and math.isfinite(te) else inverse)
            want = oracle.mul(oracle.e2m1_value(codes[r][c]), per_block)
            g = got[r, c].item()
            assert g == want or (math.isnan(g) and math.isnan(want)), (r, c)
    blocks, back = x.view(6, 3, 16), got.view(6, 3, 16)
    whole = blocks.isfinite().all(-1, keepdim=True)
    assert bool(whole.any()) and bool((back.isfinite() | ~whole).all()), case  # (finite blocks decode finite)
    if case != "inf":  # near the input: within a fifth of its block's amax (E2M1's widest step is 2 of ~amax / 6)
        # (under a clamped multiplier a value lies at most half E2M1's widest step, 1 * 2^-128, from its code's)
        bound = blocks.abs().amax(-1, keepdim=True) / 5 if case != "subnormal" else 2.0 ** -128
        assert bool(((back - blocks).abs() <= bound).all()), case


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_swizzled_scales_are_the_compact_ones_in_atoms(fmt):
    x = edge_input(130, 72, torch.bfloat16, seed=7)
    a = mxq.quantize(x, format=fmt, colwise=True)
    b = mxq.quantize(x, format=fmt, colwise=True, scale_layout="swizzled")
    blk = 16 if fmt == "nvfp4" else 32
    assert b.rowwise_scale.shape == (256, 8 if fmt == "nvfp4" else 4)
    assert b.colwise_scale.shape == (128, 12 if fmt == "nvfp4" else 8)
    for d in ("rowwise", "colwise"):
        assert torch.equal(b.compact_scale(d).view(torch.uint8), getattr(a, f"{d}_scale").view(torch.uint8))
        assert torch.equal(getattr(a, f"{d}_data"), getattr(b, f"{d}_data"))
    # the atom: compact (i, j) at ((i//128) * ceil(blocks/4) + j//4) * 512 + (i%32)*16 + ((i%128)//32)*4 + j%4
    flat = b.rowwise_scale.contiguous().view(torch.uint8).reshape(-1)
    comp = a.rowwise_scale.view(torch.uint8)
    blocks = -(-72 // blk)
    for i in (0, 33, 129):
        for j in range(blocks):
            off = ((i // 128) * -(-blocks // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
            assert flat[off] == comp[i, j]


def test_layouts_shapes_and_rank():
    x = torch.randn(2, 3, 4, 40)
    t = mxq.quantize(x, format="nvfp4", colwise=True)
    assert t.rowwise_data.shape == (2, 3, 4, 20) and t.rowwise_data.dtype == torch.uint8
    assert t.colwise_data.shape == (40, 12) and t.rowwise_scale.shape == (24, 3)
    assert t.colwise_scale.shape == (40, 2) and t.rowwise_scale.dtype == torch.float8_e4m3fn
    assert t.dequantize().shape == x.shape and t.dequantize("colwise").shape == x.shape


# -- the Hadamard transform ----------------------------------------------------------------------
def sylvester16() -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def test_hadamard_matches_a_float64_matrix_product():
    x = torch.randn(32, 48).to(torch.bfloat16)
    signs = torch.tensor(oracle.SIGNS, dtype=torch.float64)
    mat = torch.diag(signs) @ sylvester16() / 4
    prod = (x.t().double().reshape(48, 2, 16) @ mat).reshape(48, 32)
    want = [[oracle.round_bf16(oracle.Fraction(v)) for v in row] for row in prod.tolist()]
    got = fp4.hadamard(x.t().float())
    assert got.tolist() == want
    assert got.tolist() == oracle.hadamard_rows(x.t().float().tolist())


def test_hadamard_colwise_copy_against_the_oracle():
    x = edge_input(32, 48, torch.bfloat16, seed=11)
    x = torch.where(x.isnan() | x.isinf(), 1.0, x.float()).to(torch.bfloat16)
    t = mxq.quantize(x, format="nvfp4", colwise=True, hadamard=True)
    v = f32_rows(x)
    w = oracle.hadamard_rows([list(col) for col in zip(*v)])
    assert t.colwise_amax.item() == oracle.amax([e for row in w for e in row])
    assert t.amax.item() == oracle.amax([e for row in v for e in row])
    codes, scales = oracle.nvfp4(w, t.colwise_amax.item())
    assert codes_of(t.colwise_data) == codes and scale_bytes(t.colwise_scale) == scales
    plain = mxq.quantize(x, format="nvfp4")
    assert torch.equal(t.rowwise_data, plain.rowwise_data)  # the rowwise data is not transformed


# -- stochastic rounding ------------------------------------------------------------------------
def test_philox_known_answers():
    z = torch.zeros(1, dtype=torch.int64)
    assert [int(w) for w in fp4.philox((z, z, z, z), (0, 0))] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert oracle.philox([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ctr = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]
    want = [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    assert [int(w) for w in fp4.philox(tuple(torch.tensor([c]) for c in ctr), (0xA4093822, 0x299F31D0))] == want


@pytest.mark.parametrize("seed, offset", [(0, 0), (2 ** 40 + 7, 5), (9, 2), (2 ** 64 - 1, 2 ** 33 + 3)])
@pytest.mark.parametrize("rows, cols", [(3, 10), (1, 1), (5, 16)])
def test_random_bytes_against_the_oracle(seed, offset, rows, cols):
    """Every offset % 4 (a run of words starting and ending anywhere in a Philox call's four)."""
    got = fp4.random_bytes(rows, cols, seed, offset, 1, "cpu")
    assert got.tolist() == oracle.random_bytes(rows, cols, seed, offset, 1)


def test_stochastic_rounding_against_the_oracle():
    x = edge_input(4, 36, torch.float32, seed=13)
    t = mxq.quantize(x, format="nvfp4", colwise=True, stochastic_rounding=True, seed=123, offset=8)
    v = f32_rows(x)
    ga = oracle.amax([e for row in v for e in row])
    codes, scales = oracle.nvfp4(v, ga, rand=oracle.random_bytes(4, 36, 123, 8, 0))
    assert codes_of(t.rowwise_data) == codes and scale_bytes(t.rowwise_scale) == scales
    vt = [list(c) for c in zip(*v)]
    codes_t, _ = oracle.nvfp4(vt, ga, rand=oracle.random_bytes(36, 4, 123, 8, 1))
    assert codes_of(t.colwise_data) == codes_t


def test_stochastic_rounding_is_deterministic_per_seed_and_offset():
    x = torch.randn(64, 64)
    a = mxq.quantize(x, format="nvfp4", stochastic_rounding=True, seed=7, offset=0)
    b = mxq.quantize(x, format="nvfp4", stochastic_rounding=True, seed=7, offset=0)
    c = mxq.quantize(x, format="nvfp4", stochastic_rounding=True, seed=8, offset=0)
    d = mxq.quantize(x, format="nvfp4", stochastic_rounding=True, seed=7, offset=4)
    assert torch.equal(a.rowwise_data, b.rowwise_data)
    assert not torch.equal(a.rowwise_data, c.rowwise_data) and not torch.equal(a.rowwise_data, d.rowwise_data)
    torch.manual_seed(1)
    e = mxq.quantize(x, format="nvfp4", stochastic_rounding=True)
    torch.manual_seed(1)
    f = mxq.quantize(x, format="nvfp4", stochastic_rounding=True)
    assert torch.equal(e.rowwise_data, f.rowwise_data)


class _FakeCudaGenerator:
    """torch's CUDA generator as seed_and_offset reads it: a seed and a Philox offset that torch
    keeps a multiple of 4."""

    def __init__(self, seed, offset):
        self.seed, self.offset = seed, offset

    def initial_seed(self):
        return self.seed

    def get_offset(self):
        return self.offset

    def set_offset(self, offset):
        assert offset % 4 == 0, offset  # (torch's CUDA generator refuses others)
        self.offset = offset


def test_words_drawn_by_hand():
    # rowwise [5, 9]: 5 rows of ceil(9 / 4) = 3 words; colwise [9, 5]: 9 rows of 2
    assert fp4.words_drawn(5, 9) == 18 and fp4.words_drawn(9, 5) == 18
    assert fp4.words_drawn(64, 256) == 64 * 64 and fp4.words_drawn(1, 4) == 4  # (colwise: 4 rows of one word)


def test_a_seed_left_none_follows_the_cuda_generator(monkeypatch):
    """seed_and_offset on a CUDA device (torch's CUDA generator stood in for): its seed and offset,
    the offset advanced by the words drawn rounded up to 4, so successive calls draw disjoint
    words; a given offset leaves the generator alone; a given seed never reads it; while a CUDA
    graph is captured, and on CPU, a draw from the CPU generator (torch.manual_seed repeats it)."""
    gens = [_FakeCudaGenerator(11, 0), _FakeCudaGenerator(2 ** 64 - 3, 40)]
    monkeypatch.setattr(torch.cuda, "default_generators", gens)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert fp4.seed_and_offset(None, None, "cuda:0", 18) == (11, 0) and gens[0].offset == 20
    assert fp4.seed_and_offset(None, None, "cuda:0", 20) == (11, 20) and gens[0].offset == 40
    assert fp4.seed_and_offset(None, None, "cuda", 1) == (2 ** 64 - 3, 40) and gens[1].offset == 44
    assert fp4.seed_and_offset(None, 7, "cuda:0", 18) == (11, 7) and gens[0].offset == 40
    assert fp4.seed_and_offset(5, None, "cuda:0", 18) == (5, 0) and fp4.seed_and_offset(5, 3, "cuda:0", 18) == (5, 3)
    assert gens[0].offset == 40
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    for device in ("cuda:0", "cpu"):
        torch.manual_seed(3)
        first = fp4.seed_and_offset(None, None, device, 18)
        torch.manual_seed(3)
        assert fp4.seed_and_offset(None, None, device, 18) == first and first[1] == 0
    assert gens[0].offset == 40


def test_stochastic_rounding_is_unbiased_and_beats_round_to_nearest_on_the_mean():
    # values between grid points in every spacing; the block max 6 fixes the global and block scales
    vals = [0.1, 0.3, 0.6, 1.1, 1.3, 1.9, 2.2, 2.7, 3.3, 4.4, 5.1, 5.7, -0.2, -1.6, -3.9, 6.0]
    x = torch.tensor(vals).repeat(256, 1)  # 256 rows: 256 independent draws per value
    enc = oracle.s_enc(6.0)
    byte = oracle.encode_fp8(min(oracle.mul(6.0, oracle.mul(enc, oracle.round_f32(oracle.Fraction(1, 6)))),
                                 oracle.FLT_MAX), "e4m3")
    mult = oracle.div(1.0, oracle.mul(float(oracle.e4m3_value(byte)), oracle.div(1.0, enc)))
    target = torch.tensor([oracle.mul(v, mult) for v in vals], dtype=torch.float64)  # y = v * multiplier

    def decoded(t):
        return torch.tensor([[oracle.e2m1_value(c) for c in row] for row in codes_of(t.rowwise_data)],
                            dtype=torch.float64)

    q = torch.cat([decoded(mxq.quantize(x, format="nvfp4", stochastic_rounding=True, seed=s, offset=0))
                   for s in range(4)])  # 1024 draws per value
    mean = q.mean(0)
    step = torch.where(target.abs() < 2, 0.5, torch.where(target.abs() < 4, 1.0, 2.0))
    # unbiased: within 5 standard errors (at most step/2 per draw) plus the 8-bit rule's 1/256 of a step
    assert ((mean - target).abs() <= 5 * step / 2 / math.sqrt(q.shape[0]) + step / 256).all(), mean - target
    rn = decoded(mxq.quantize(x[:1], format="nvfp4"))[0]
    assert (mean - target).pow(2).mean().sqrt() < (rn - target).pow(2).mean().sqrt() / 4


# -- MXFP4 -------------------------------------------------------------------------------------
def test_mxfp4_hand_vector():
    x = torch.tensor([[6.0, -3.0, 1.5, 0.25, 0.75, NAN] + [0.0] * 26 + [6.0, -3.0] + [0.0] * 30])
    for mode in ("floor", "rceil"):
        t = mxq.quantize(x, format="mxfp4", scale_mode=mode)
        assert t.rowwise_scale.tolist() == [[255, 127]]  # a NaN makes its block's scale NaN
        assert codes_of(t.rowwise_data)[0][:6] == [7] * 6 and codes_of(t.rowwise_data)[0][32:34] == [7, 13]


@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 72), (1, 34), (6, 64)])
def test_mxfp4_against_the_oracle(mode, dtype, shape):
    x = edge_input(*shape, dtype, seed=17)
    t = mxq.quantize(x, format="mxfp4", scale_mode=mode, colwise=shape[0] % 2 == 0)
    v = f32_rows(x)
    codes, scales = oracle.mxfp4(v, mode)
    assert codes_of(t.rowwise_data) == codes and t.rowwise_scale.tolist() == scales
    if t.colwise_data is not None:
        codes_t, scales_t = oracle.mxfp4([list(c) for c in zip(*v)], mode)
        assert codes_of(t.colwise_data) == codes_t and t.colwise_scale.tolist() == scales_t


def test_mxfp4_rceil_never_saturates_and_floor_may():
    x = torch.tensor([[7.0] + [0.0] * 31])
    assert codes_of(mxq.quantize(x, format="mxfp4", scale_mode="rceil").rowwise_data)[0][0] == 6  # 7/2 -> 4
    assert codes_of(mxq.quantize(x, format="mxfp4").rowwise_data)[0][0] == 7  # floor: 7 -> 6 (saturated)


def test_mxfp4_rceil_by_multiply_picks_the_power_the_division_picks():
    """rceil rounds fp32(amax * fp32(1/6)) up to a power of two; FlashInfer and DeepGEMM round
    fp32(amax / 6): the same byte for every amax within 40 ulps of 3, 4, 6 and 12 times each
    power of two where a quotient can sit on a power (normal quotients), so the two are one rule."""
    amaxes = []
    for k in range(-124, 125):
        for m in (3, 4, 6, 12):
            bits = struct.unpack("<I", struct.pack("<f", m * 2.0 ** k))[0]
            amaxes += [struct.unpack("<f", struct.pack("<I", b))[0] for b in range(bits - 40, bits + 41)]
    amaxes = [a for a in amaxes if math.isfinite(a) and a * 6 < oracle.FLT_MAX]
    x = torch.zeros(len(amaxes), 32)
    x[:, 0] = torch.tensor(amaxes)
    got = mxq.quantize(x, format="mxfp4", scale_mode="rceil").rowwise_scale[:, 0].tolist()
    want = []
    for a in amaxes:
        q = oracle.div(a, 6.0)  # (a normal quotient: its exponent field, one more unless a power of two)
        b = struct.unpack("<I", struct.pack("<f", q))[0]
        want.append((b >> 23) + ((b & 0x7FFFFF) > 0))
    assert got == want


def test_mxfp4_dequantize_is_exact():
    x = edge_input(4, 64, torch.float32, seed=19)
    t = mxq.quantize(x, format="mxfp4")
    got = t.dequantize().tolist()
    codes = codes_of(t.rowwise_data)
    for r in range(4):
        for c in range(64):
            e = t.rowwise_scale[r, c // 32].item()
            want = math.nan if e == 255 else oracle.round_f32(oracle.Fraction(oracle.e2m1_value(codes[r][c])) * oracle.Fraction(2) ** (e - 127))
            assert got[r][c] == want or (math.isnan(got[r][c]) and math.isnan(want))


# -- groups (group_offsets; mxq/formats/fp4_layouts.py) --------------------------------------------
GROUP_SIZES = [[0, 18, 2, 40, 0, 64, 6], [34], [2, 0, 0, 30, 32, 0]]


@pytest.mark.parametrize("fmt, mode", [("nvfp4", None), ("mxfp4", "floor"), ("mxfp4", "rceil")])
@pytest.mark.parametrize("sizes", GROUP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_against_the_oracle_group_by_group(fmt, mode, sizes, dtype):
    """Each group's rows quantized alone by the oracle, placed by hand: its rowwise rows, its
    columns [start/2, end/2) of the colwise copy, its ceil(m/B) colwise blocks from column
    start // B + g of the [N, M // B + G] buffer (every other column zero), NVFP4's amax its own
    (an empty group's 0); group(g) is the same bytes."""
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    m, n, B = int(offs[-1]), 40, fp4.BLOCKS[fmt]
    x = edge_input(m, n, dtype, seed=len(sizes))
    opts = dict(format=fmt, colwise=True, **({"scale_mode": mode} if mode else {}))
    t = mxq.quantize(x, group_offsets=offs, **opts)
    assert t.colwise_scale.shape == (n, m // B + len(sizes))
    assert t.amax.shape == (len(sizes),) if fmt == "nvfp4" else t.amax is None
    v = f32_rows(x)
    rows, cols, scale_cols, used = codes_of(t.rowwise_data), codes_of(t.colwise_data), scale_bytes(t.colwise_scale), set()
    start = 0
    for g, size in enumerate(sizes):
        end = start + size
        part = v[start:end]
        part_t = [list(c) for c in zip(*part)] if size else [[] for _ in range(n)]
        if fmt == "nvfp4":
            ga = oracle.amax([e for row in part for e in row])
            assert t.amax[g].item() == ga
            (codes, scales), (codes_t, scales_t) = oracle.nvfp4(part, ga), oracle.nvfp4(part_t, ga)
        else:
            (codes, scales), (codes_t, scales_t) = oracle.mxfp4(part, mode), oracle.mxfp4(part_t, mode)
        assert rows[start:end] == codes and scale_bytes(t.rowwise_scale)[start:end] == scales
        assert [row[start:end] for row in cols] == codes_t
        first = start // B + g
        nb = -(-size // B)
        assert [row[first:first + nb] for row in scale_cols] == scales_t
        used.update(range(first, first + nb))
        if size:
            mine = t.group(g)
            assert codes_of(mine.colwise_data) == codes_t and scale_bytes(mine.colwise_scale) == scales_t
            assert codes_of(mine.rowwise_data) == codes and mine.shape == (size, n)
        start = end
    assert all(row[c] == 0 for row in scale_cols for c in range(len(scale_cols[0])) if c not in used)


def test_grouped_nvfp4_global_amax_per_group_or_one_for_all():
    """global_amax= of a grouped NVFP4 call: one value for every group or a [G] tensor of one per
    group; each group is quantized with its own, as quantizing its rows alone with that amax."""
    offs = torch.tensor([16, 16, 48], dtype=torch.int32)
    x = edge_input(48, 32, torch.float32, seed=5)
    per = torch.tensor([3.0, 0.0, 250.0])
    for given, amaxes in ((per, per.tolist()), (7.5, [7.5] * 3), (torch.tensor([7.5]), [7.5] * 3)):
        t = mxq.quantize(x, format="nvfp4", colwise=True, group_offsets=offs, global_amax=given)
        assert t.amax.tolist() == amaxes
        for g, (s, e) in enumerate(((0, 16), (16, 16), (16, 48))):
            if e > s:
                alone = mxq.quantize(x[s:e], format="nvfp4", colwise=True, global_amax=amaxes[g])
                got = t.group(g)
                assert torch.equal(got.rowwise_data, alone.rowwise_data)
                assert torch.equal(got.colwise_data, alone.colwise_data)
                assert scale_bytes(got.colwise_scale) == scale_bytes(alone.colwise_scale)
    with pytest.raises(ValueError, match="global_amax"):
        mxq.quantize(x, format="nvfp4", group_offsets=offs, global_amax=torch.ones(2))


def test_grouped_dequantize_out_and_dbias():
    """dequantize() of a grouped FP4 tensor is each group's, in order; poisoned out= buffers come
    back with every byte the fresh call writes (the columns between groups' blocks zeroed); dbias
    per group."""
    from mxq.testing import poisoned

    offs = torch.tensor([0, 10, 10, 64], dtype=torch.int32)
    x = edge_input(64, 48, torch.bfloat16, seed=6).nan_to_num(0.0, 0.0, 0.0)
    for fmt in ("nvfp4", "mxfp4"):
        op = mxq.fused_quant(format=fmt, colwise=True, dbias=True)(_ident)
        t = op(x, group_offsets=offs)
        for d in ("rowwise", "colwise"):  # (each group's rows quantized alone, decoded)
            want = torch.cat([mxq.quantize(x[s:e], format=fmt, colwise=True).dequantize(d) for s, e in ((0, 10), (10, 64))])
            assert torch.equal(t.dequantize(d).nan_to_num(7.0), want.nan_to_num(7.0))
        assert torch.equal(t.dbias[2], torch.zeros(48, dtype=torch.bfloat16))
        assert torch.equal(t.dbias[3], x[10:].float().sum(0, dtype=torch.float64).float().bfloat16())
        into = op(x, group_offsets=offs, out=poisoned(op, x, group_offsets=offs))
        for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
            a, b = getattr(into, f), getattr(t, f)
            assert (a is None) == (b is None) and (a is None or scale_bytes(a) == scale_bytes(b)), (fmt, f)


def _ident(x):
    return x


@pytest.mark.parametrize("opts, offsets, match", [
    (dict(format="nvfp4", colwise=True), [3, 8], "even row"),
    (dict(format="mxfp4", colwise=True), [4, 7, 8], "even row"),
    (dict(format="nvfp4", scale_layout="swizzled"), [4, 8], "compact"),
    (dict(format="nvfp4", colwise=True, stochastic_rounding=True), [4, 8], "stochastic_rounding"),
    (dict(format="nvfp4", colwise=True, block_2d=True), [4, 8], "block_2d"),
])
def test_grouped_refusals_name_group_offsets(opts, offsets, match):
    """What a grouped FP4 call may not be, refused by name before anything runs (rowwise-only
    calls take odd group ends: only the colwise copy packs rows)."""
    x = torch.randn(8, 32)
    with pytest.raises(ValueError, match="group_offsets") as e:
        mxq.quantize(x, group_offsets=torch.tensor(offsets, dtype=torch.int32), **opts)
    assert match in str(e.value)
    mxq.quantize(x, format="nvfp4", group_offsets=torch.tensor([3, 8], dtype=torch.int32))  # (rowwise: any ends)
    h = torch.randn(16, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="hadamard"):
        mxq.quantize(h, format="nvfp4", colwise=True, hadamard=True, group_offsets=torch.tensor([16], dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_grouped_on_cuda_runs_the_reference(fmt, monkeypatch):
    """A grouped FP4 call with the colwise copy at M % 8 != 0 has no kernels: it runs the
    reference (a warning; an error under MXQ_STRICT naming the rows) with the CPU's bytes, odd
    ends refused when the reference reads them. CPU counterpart:
    test_grouped_against_the_oracle_group_by_group."""
    offs = torch.tensor([0, 18, 20, 60, 60, 124, 130], dtype=torch.int32)
    x = edge_input(130, 96, torch.bfloat16, seed=7)
    want = mxq.quantize(x, format=fmt, colwise=True, group_offsets=offs)
    got = mxq.quantize(x.cuda(), format=fmt, colwise=True, group_offsets=offs.cuda())
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax"):
        a, b = getattr(got, f), getattr(want, f)
        assert (a is None) == (b is None) and (a is None or scale_bytes(a.cpu()) == scale_bytes(b)), f
    with pytest.raises(ValueError, match="even row"):
        mxq.quantize(x.cuda(), format=fmt, colwise=True, group_offsets=torch.tensor([3, 130], device="cuda"))
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(Exception, match="M % 8"):
        mxq.quantize(x.cuda(), format=fmt, colwise=True, group_offsets=offs.cuda())


def test_grouped_noop_amax_option_and_out_shapes():
    """noop=1 writes nothing into poisoned grouped outputs; MXFP4's amax=True covers the whole
    tensor; out= buffers of another group count or an ungrouped amax are refused by name."""
    from mxq.testing import poisoned

    offs = torch.tensor([6, 6, 40], dtype=torch.int32)
    x = edge_input(40, 64, torch.float32, seed=8)
    op = mxq.fused_quant(format="nvfp4", colwise=True)(_ident)
    out = poisoned(op, x, group_offsets=offs)
    before = {f: getattr(out, f).clone() for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale",
                                                    "amax")}
    op(x, group_offsets=offs, noop=torch.ones(1), out=out)
    assert all(torch.equal(getattr(out, f).view(torch.uint8), b.view(torch.uint8)) for f, b in before.items())
    clean = torch.randn(40, 64)
    mx = mxq.quantize(clean, format="mxfp4", amax=True, group_offsets=offs)
    assert mx.amax.shape == () and mx.amax.item() == oracle.amax(clean.flatten().tolist())
    other = mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu", group_offsets=torch.tensor([40], dtype=torch.int32))
    with pytest.raises(ValueError, match="out"):
        op(x, group_offsets=offs, out=other)
    with pytest.raises(ValueError, match="out"):
        op(x, group_offsets=offs, out=mxq.MXFP8Tensor.empty(op.spec, x.shape, x.dtype, "cpu"))


def test_grouped_reference_clamps_offsets_it_cannot_check():
    """Offsets the CUDA route does not validate (decreasing, negative, past M) reach the reference
    unchecked: each end clamped to [0, M] as the kernels clamp them, no error but an odd end with
    the colwise copy (run here through reference.run, as a CUDA call runs it)."""
    from mxq.formats import reference
    from mxq.runtime.call import Call

    x = torch.randn(8, 32)
    op = mxq.fused_quant(format="nvfp4", colwise=True)(_ident)
    for ends in ([6, 4, 8], [-2, 8], [4, 10], [8, 2]):
        t = reference.run(op.spec, op.epilogue, Call([x], [], group_offsets=torch.tensor(ends, dtype=torch.int32)))
        assert t.rowwise_data.shape == (8, 16)
    with pytest.raises(ValueError, match="even row"):
        reference.run(op.spec, op.epilogue, Call([x], [], group_offsets=torch.tensor([3, 8], dtype=torch.int32)))
