"""Grouped quantize (mxq/groups.py): colwise blocks restart at every group, on CPU (the kernels do
not take groups yet: CUDA calls run the reference with a one-time warning)."""

import pytest
import torch

import mxq
from mxq import groups
from mxq.testing import compare

from . import oracle


def _oracle_colwise(v):
    """Colwise e4m3/rceil of fp32 rows ``v`` by tests/oracle.py: (data [m, n], scales [ceil(m/32), n])."""
    data_t, scales_t = oracle.quantize_rows(v.t().tolist(), "e4m3", "rceil")
    return torch.tensor(data_t, dtype=torch.uint8).t(), torch.tensor(scales_t, dtype=torch.uint8).t()


def test_grouped_colwise_blocks_by_hand():
    """M = 70 in groups of 20, 0 and 50 rows: block rows 0 (group 0), 2-3 (group 2: starts at row
    20, so its first block row is 20 // 32 + 2); rows 1 and 4 of the [70 // 32 + 3, N] buffer stay 0."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(70, 64, generator=g) * 3
    offsets = torch.tensor([20, 20, 70], dtype=torch.int32)
    t = mxq.quantize(x, rowwise=False, colwise=True, group_offsets=offsets)
    assert t.colwise_scale.shape == (5, 64)
    d0, s0 = _oracle_colwise(x[:20])
    d2, s2 = _oracle_colwise(x[20:])
    assert torch.equal(t.colwise_data.view(torch.uint8), torch.cat([d0, d2]))
    assert torch.equal(t.colwise_scale[0:1], s0) and torch.equal(t.colwise_scale[2:4], s2)
    assert not t.colwise_scale[1].any() and not t.colwise_scale[4].any()
    assert groups.first_block_row(2, 20) == 2 and groups.grouped_colwise_rows(70, 3) == 5


@pytest.mark.parametrize("seed", range(6))
def test_each_group_equals_quantizing_its_rows_alone(seed):
    g = torch.Generator().manual_seed(seed)
    m, n, gcount = int(torch.randint(1, 300, (1,), generator=g)), 96, int(torch.randint(1, 9, (1,), generator=g))
    ends = torch.sort(torch.randint(0, m + 1, (gcount - 1,), generator=g)).values
    offsets = torch.cat([ends, torch.tensor([m])]).to(torch.int64)
    x = (torch.randn(m, n, generator=g) * 4).bfloat16()
    opts = dict(rowwise=True, colwise=True, amax=True, scale_mode=["rceil", "floor", "ceil", "even"][seed % 4],
                fp8=["e4m3", "e5m2"][seed % 2])
    t = mxq.quantize(x, group_offsets=offsets, **opts)
    assert torch.equal(t.amax, mxq.quantize(x, **opts).amax), "amax covers the whole tensor"
    for k, (start, end) in enumerate(groups.bounds(offsets)):
        want = mxq.quantize(x[start:end], **opts)
        got = t.group(k)
        want.amax = None
        assert compare(got, want, exact=True) == [], (k, start, end)
    d = t.dequantize("colwise")
    for k, (start, end) in enumerate(groups.bounds(offsets)):
        assert torch.equal(d[start:end], t.group(k).dequantize("colwise"))


def _scaled(x):
    return x * 2.0


def test_dbias_is_per_group_and_act_dact_work():
    x = torch.randn(100, 64, dtype=torch.bfloat16)
    offsets = torch.tensor([33, 33, 100])
    op = mxq.fused_quant(colwise=True, dbias=True, dact="gelu")(_scaled)
    a = torch.randn_like(x)
    t = op(x, act_input=a, group_offsets=offsets)
    assert t.dbias.shape == (3, 64)
    for k, (s, e) in enumerate(groups.bounds(offsets)):
        want = op(x[s:e], act_input=a[s:e])
        assert torch.equal(t.dbias[k], want.dbias) if e > s else not t.dbias[k].any()
        assert compare(t.group(k), want, exact=False) == [] if e > s else True


def test_expert_weights_are_equal_groups():
    """3-D expert weights [E, N, K] are the special case of E equal groups of N rows."""
    w = torch.randn(4, 48, 64)
    offsets = torch.arange(1, 5) * 48
    t = mxq.quantize(w, rowwise=True, colwise=True, group_offsets=offsets)
    for e in range(4):
        assert compare(t.group(e), mxq.quantize(w[e], rowwise=True, colwise=True), exact=True) == []


@pytest.mark.parametrize("bad, err, match", [
    (torch.tensor([10, 5, 70]), ValueError, "non-decreasing"), (torch.tensor([10, 60]), ValueError, "end at M = 70"),
    (torch.tensor([-1, 70]), ValueError, "non-decreasing"), (torch.tensor([10.0, 70.0]), TypeError, "int32 or int64"),
    (torch.tensor([[70]]), ValueError, "1-D"), (torch.tensor([], dtype=torch.int64), ValueError, "1-D"),
    ([70], TypeError, "torch.Tensor")])
def test_bad_offsets_name_the_argument(bad, err, match):
    with pytest.raises(err, match=f"group_offsets.*{match}|{match}.*group_offsets"):
        mxq.quantize(torch.randn(70, 64), colwise=True, group_offsets=bad)


def test_group_of_an_ungrouped_tensor_is_refused():
    with pytest.raises(ValueError, match="group"):
        mxq.quantize(torch.randn(64, 64), colwise=True).group(0)


@pytest.mark.parametrize("sizes", [[45, 0, 100, 31], [128, 128], [1, 300, 7]])
def test_swizzled_groups_by_an_independent_rearrangement(sizes):
    """scale_layout="swizzled" with groups: each group's scales in the 128x4 blocked layout of
    its own, the groups one after another (rowwise: row starts sum roundup(m_h, 128); colwise:
    start rows sum roundup(ceil(m_h / 32), 4) of roundup(N, 128) bytes), placed here byte by byte
    with tests/oracle.py's swizzle offset from each group's compact scales."""
    n = 200
    g = torch.Generator().manual_seed(sum(sizes))
    x = torch.randn(sum(sizes), n, generator=g) * 3
    offsets = torch.cumsum(torch.tensor(sizes), 0)
    t = mxq.quantize(x, rowwise=True, colwise=True, scale_layout="swizzled", group_offsets=offsets)
    m, nb = sum(sizes), -(-n // 32)
    pc, pn = -(-nb // 4) * 4, -(-n // 128) * 128
    assert t.rowwise_scale.shape == (m + 128 * len(sizes), pc)
    assert t.colwise_scale.shape == (m // 32 + 4 * len(sizes), pn)
    want_row = torch.zeros(t.rowwise_scale.numel(), dtype=torch.uint8)
    want_col = torch.zeros(t.colwise_scale.numel(), dtype=torch.uint8)
    row0 = col0 = start = 0
    for size in sizes:
        alone = mxq.quantize(x[start:start + size], rowwise=True, colwise=True)
        gb = -(-size // 32)
        for i in range(size):
            for j in range(nb):
                want_row[row0 * pc + oracle.swizzle_offset(i, j, nb)] = alone.rowwise_scale[i, j]
        for b in range(gb):
            for c in range(n):
                want_col[col0 * pn + oracle.swizzle_offset(c, b, gb)] = alone.colwise_scale[b, c]
        row0 += -(-size // 128) * 128
        col0 += -(-gb // 4) * 4
        start += size
    assert torch.equal(t.rowwise_scale.reshape(-1), want_row)
    assert torch.equal(t.colwise_scale.reshape(-1), want_col)
    start = 0
    for k, size in enumerate(sizes):  # group(g) brings each back to compact, byte-equal
        alone = mxq.quantize(x[start:start + size], rowwise=True, colwise=True)
        assert compare(t.group(k), alone, exact=True) == [] if size else t.group(k).shape[0] == 0
        start += size
    assert torch.equal(t.dequantize("colwise").isnan(), x.isnan())


def test_grouped_quantize_compiles():
    def f(x, o):
        return mxq.quantize(x, colwise=True, group_offsets=o)

    x = torch.randn(96, 64)
    o = torch.tensor([40, 96])
    got = torch.compile(f, fullgraph=True)(x, o)
    want = f(x, o)
    assert got.colwise_scale.shape == want.colwise_scale.shape == (5, 64)
    assert torch.equal(got.colwise_scale, want.colwise_scale)


def test_out_takes_the_new_offsets_and_results_do_not_alias_them():
    x = torch.randn(96, 64)
    off = torch.tensor([32, 96])
    t = mxq.quantize(x, colwise=True, group_offsets=off)
    off[0] = 40  # the caller reuses its tensor
    assert t.group_offsets.tolist() == [32, 96]
    again = mxq.quantize(x, colwise=True, group_offsets=torch.tensor([40, 96]), out=t)
    fresh = mxq.quantize(x, colwise=True, group_offsets=torch.tensor([40, 96]))
    assert again.group_offsets.tolist() == [40, 96]
    assert torch.equal(again.dequantize("colwise"), fresh.dequantize("colwise"))
