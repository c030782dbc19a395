"""Grouped quantize (mxq/formats/groups.py): colwise blocks restart at every group. On CPU (the reference,
against tests/oracle.py and independent rearrangements), and marked gpu the grouped kernels
(mxq/kernels/grouped.py) against the reference; their CPU counterparts are the compile test below
and tests/test_kernels.py's host checks of the tile rules."""

import re

import pytest
import torch

import mxq
from mxq.formats import groups
from mxq.kernels import config as kconfig
from mxq.testing import compare, planted, poisoned, same_bytes, v_abs_sum, v_bound

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
    (torch.tensor([40, 30]), ValueError, "non-decreasing"),
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


@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_reused_out_with_new_offsets_equals_a_fresh_call_byte_for_byte(layout):
    """The padding between groups moves with the offsets: a reused out= whose scale buffers hold
    stale bytes gets exactly a fresh call's bytes (padding zero), as the kernels write."""
    x = planted(150, 96, torch.bfloat16, seed=3)
    opts = dict(rowwise=True, colwise=True, scale_layout=layout)
    t = mxq.quantize(x, group_offsets=torch.tensor([100, 100, 150]), **opts)
    t.rowwise_scale.fill_(0xEE)
    t.colwise_scale.fill_(0xEE)
    new = torch.tensor([0, 40, 41, 150], dtype=torch.int32)  # an empty first group moves every block row
    t4 = mxq.MXFP8Tensor.empty(mxq.QuantSpec(**opts), x.shape, x.dtype, "cpu", group_offsets=new)
    t4.rowwise_scale.fill_(0xEE)
    t4.colwise_scale.fill_(0xEE)
    again = mxq.quantize(x, group_offsets=new, out=t4, **opts)
    fresh = mxq.quantize(x, group_offsets=new, **opts)
    assert compare(again, fresh, exact=True) == []
    if layout == "compact":
        assert int(fresh.colwise_scale[0].max()) == 0  # (the empty group's place: padding)


def test_prepare_takes_int32_group_offsets_only():
    """prepare() reads the offsets at every launch, so it binds the caller's int32 tensor itself;
    an int64 one or a strided view (which a bind would convert, once) is refused, naming the
    argument and what is wrong with it."""
    op = mxq.fused_quant(colwise=True)(_plain)
    with pytest.raises(ValueError, match="'group_offsets'.*int32.*got dtype torch.int64"):
        op.prepare(torch.randn(64, 64), group_offsets=torch.tensor([64]))
    with pytest.raises(ValueError, match="'group_offsets'.*contiguous int32.*got a view of strides \\(2,\\)"):
        op.prepare(torch.randn(64, 64), group_offsets=torch.tensor([32, 0, 64, 0], dtype=torch.int32)[::2])
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        op.prepare(torch.randn(64, 64), group_offsets=torch.tensor([64], dtype=torch.int32))


def _plain(x):
    return x


def test_groups_with_a_second_epilogue_tensor():
    """CPU counterpart of test_grouped_kernels_with_extra_operands: with a bias [N] or strided
    halves, group k of the grouped result is the op on its rows alone (the reference), and the
    grouped kernels for those operand layouts compile."""
    from mxq.runtime import inspection

    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu", dbias=True)(_plus_gelu)
    sizes = [45, 0, 100, 31]
    xx = planted(sum(sizes), 128, torch.bfloat16, seed=11)
    b = planted(1, 64, torch.bfloat16, seed=12).reshape(64)
    offs = torch.cumsum(torch.tensor(sizes), 0)
    for x, other in ((xx[:, :64], b), (xx[:, :64], xx[:, 64:])):
        t = op(x, other, group_offsets=offs)
        start = 0
        for k, size in enumerate(sizes):
            rows = slice(start, start + size)
            alone = op(x[rows], other if other.dim() == 1 else other[rows])
            part = t.group(k)
            assert same_bytes(part.dbias, alone.dbias), k
            part.dbias = alone.dbias = None
            assert compare(part, alone, exact=True) == [], k
            start += size
    for layouts in (("full", "row"), ("strided", "strided")):
        ptx = inspection.ptx_of(op, "sm_90a", "bf16", "vec_grouped", layouts=layouts)
        # the quantize kernel, dbias_kernel's three grouped forms and dbias_groups_kernel's two (launch_dbias_by_rows)
        assert ptx.count(".entry") == 6


# --- the grouped kernels (mxq/kernels/grouped.py), on a CUDA device ------------------------------------
def _ident(x):
    return x


GPU_OPTS = [
    dict(rowwise=True, colwise=True),
    dict(rowwise=True, colwise=True, scale_layout="swizzled"),
    dict(colwise=True, act="gelu", dbias=True, amax=True),
    dict(rowwise=True, colwise=True, dact="gelu", dbias=True, scale_layout="swizzled"),
    dict(rowwise=True, dbias=True),
    dict(colwise=True, fp8="e5m2", scale_mode="floor", amax=True),
]


def _group_sizes(seed: int, m_max: int = 1200):
    """Random group sizes: empty groups, sizes 1..300 not multiples of 32, now and then one huge."""
    g = torch.Generator().manual_seed(seed)
    sizes = [int(s) for s in torch.randint(0, 300, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g)]
    sizes = [0 if int(torch.randint(0, 5, (1,), generator=g)) == 0 else s for s in sizes]
    if seed % 3 == 0:
        sizes.insert(int(torch.randint(0, len(sizes) + 1, (1,), generator=g)), m_max)
    return sizes


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [256, 72, 70])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("opts", GPU_OPTS)
def test_grouped_kernel_matches_reference(opts, dtype, n, seed):
    """The grouped kernels (vectorised for N = 256, 72; element-wise for 70) against the CPU
    reference, byte for byte, into poisoned outputs: every scale byte is written or cleared (fp16
    too: its grouped kernels had run only as gated backwards)."""
    sizes = _group_sizes(seed)
    m = sum(sizes)
    op = mxq.fused_quant(**opts)(_ident)
    x = planted(max(m, 1), n, dtype, seed=seed)[:m]
    kw = {"act_input": planted(max(m, 1), n, dtype, seed=seed + 5)[:m]} if op.spec.dact else {}
    offsets = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(torch.int32 if seed % 2 else torch.int64)
    want = op.reference(x, group_offsets=offsets, **kw)
    xc, oc = x.cuda(), offsets.cuda()
    exact = op.spec.act is None and op.spec.dact is None
    v_abs = v_abs_sum(op, x, group_offsets=offsets, **kw) if op.spec.dbias and not exact else None
    bound = None if exact else v_bound(op, x, **kw)  # (dact ops: bytes next to the derivative's roots)
    got = op(xc, group_offsets=oc, out=poisoned(op, xc, oc), **{k: v.cuda() for k, v in kw.items()})
    assert compare(got, want, exact, v_abs, v_bound=bound) == [], sizes
    fresh = op(xc, group_offsets=oc, **{k: v.cuda() for k, v in kw.items()})  # allocated outputs
    assert compare(fresh, want, exact, v_abs, v_bound=bound) == [], sizes
    compact = mxq.fused_quant(**{**opts, "scale_layout": "compact"})(_ident)  # group(k) has compact scales
    for k, (start, end) in enumerate(groups.bounds(offsets)):
        alone = compact.reference(x[start:end], **({"act_input": kw["act_input"][start:end]} if kw else {}))
        alone.amax = alone.dbias = None
        part = got.group(k)
        part.amax = part.dbias = None
        assert compare(part, alone, exact, v_bound=None if bound is None else bound[start:end]) == [], (k, start, end)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[9000, 0, 3500], [9000, 0, 3000, 45, 2]])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_grouped_dbias_of_a_long_call_matches_reference(dtype, sizes):
    """More than PDL_MAX_ROWS rows: groups averaging more than PDL_MAX_ROWS rows take
    dbias_kernel's staged form (partials copied through shared memory in rounds of 32 fp32 or 16
    fp64 rows per thread) on each group's own partial rows, groups of several full rounds, of a
    partial one, and empty; smaller groups on average its register form, launched after the
    quantize kernel (Quantize.launch_dbias_by_rows). CPU counterpart:
    tests/test_codegen.py::test_dbias_kernel_keeps_its_loads_in_flight (the staged form's copies)."""
    assert sum(sizes) > kconfig.PDL_MAX_ROWS
    assert (sum(sizes) > kconfig.PDL_MAX_ROWS * len(sizes)) == (len(sizes) == 3)  # (one of each form)
    m, n = sum(sizes), 200
    op = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(_ident)
    x, a = planted(m, n, dtype, seed=21), planted(m, n, dtype, seed=22)
    offsets = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
    want = op.reference(x, act_input=a, group_offsets=offsets)
    v_abs = v_abs_sum(op, x, act_input=a, group_offsets=offsets)
    xc, oc = x.cuda(), offsets.cuda()
    got = op(xc, act_input=a.cuda(), group_offsets=oc, out=poisoned(op, xc, oc))
    assert compare(got, want, False, v_abs, v_bound=v_bound(op, x, act_input=a)) == []


def _plus_gelu(x, b):
    return x + b


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
@pytest.mark.parametrize("kind", ["row", "full", "strided"])
def test_grouped_kernels_with_extra_operands(kind, layout):
    """An epilogue with a second tensor (a bias [N], a full tensor, or both inputs strided halves
    of one [M, 2N] tensor) under groups: the grouped kernels against the reference."""
    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu", dbias=True, scale_layout=layout)(_plus_gelu)
    sizes = [45, 0, 300, 31, 1]
    m, n = sum(sizes), 256
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    xx = planted(m, 2 * n, torch.bfloat16, seed=11)
    x, b = {"row": (xx[:, :n].contiguous(), planted(1, n, torch.bfloat16, seed=12).reshape(n)),
            "full": (xx[:, :n].contiguous(), xx[:, n:].contiguous()),
            "strided": (xx[:, :n], xx[:, n:])}[kind]
    want = op.reference(x, b, group_offsets=offs)
    v_abs = v_abs_sum(op, x, b, group_offsets=offs)
    xc = xx.cuda()
    xcv, bc = (xc[:, :n], xc[:, n:]) if kind == "strided" else (x.cuda(), b.cuda())
    got = op(xcv, bc, group_offsets=offs.cuda(), out=poisoned(op, xcv, offs.cuda()))
    assert compare(got, want, False, v_abs) == []


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_prepared_grouped_launch_follows_the_offsets(layout):
    """op.prepare with group_offsets: each launch (plain, and replayed from a CUDA graph)
    quantizes by the offsets' current contents, byte-equal to a fresh call."""
    m, n = 1000, 256
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    offsets = torch.tensor([100, 100, 613, 1000], dtype=torch.int32, device="cuda")
    op = mxq.fused_quant(rowwise=True, colwise=True, dbias=True, scale_layout=layout)(_plain)
    launch, out = op.prepare(x, group_offsets=offsets)
    for new in ([100, 100, 613, 1000], [0, 500, 501, 1000], [1000, 1000, 1000, 1000]):
        offsets.copy_(torch.tensor(new, dtype=torch.int32))
        launch()
        fresh = op(x, group_offsets=offsets.clone())
        assert compare(out, fresh, exact=True) == [] and out.group_offsets.tolist() == new, new
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    offsets.copy_(torch.tensor([31, 64, 64, 1000], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert compare(out, op(x, group_offsets=offsets.clone()), exact=True) == []


@pytest.mark.gpu
def test_grouped_call_replays_in_a_cuda_graph_after_the_offsets_change():
    """One launch, no host sync: the grouped call captures in a CUDA graph, and a replay after the
    offsets tensor is changed in place quantizes by the new groups."""
    m, n = 1000, 512
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
    offsets = torch.tensor([100, 100, 613, 1000], dtype=torch.int32, device="cuda")
    opts = dict(rowwise=True, colwise=True, dbias=True, scale_layout="swizzled")
    op = mxq.fused_quant(**opts)(_ident)
    op(x, group_offsets=offsets)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        t = op(x, group_offsets=offsets)
    for ends in ([100, 100, 613, 1000], [1, 33, 34, 1000], [0, 0, 0, 1000], [500, 700, 999, 1000]):
        offsets.copy_(torch.tensor(ends, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = op.reference(x.cpu(), group_offsets=offsets.cpu())
        assert t.group_offsets.tolist() == ends
        assert compare(t, want, exact=True) == [], ends


@pytest.mark.gpu
def test_grouped_kernel_runs_without_a_fallback_warning(monkeypatch):
    monkeypatch.setenv("MXQ_STRICT", "1")  # a fallback would raise
    x = torch.randn(300, 256, device="cuda")
    t = mxq.quantize(x, colwise=True, group_offsets=torch.tensor([45, 300], device="cuda"))
    assert torch.equal(t.colwise_scale.cpu(),
                       mxq.quantize(x.cpu(), colwise=True, group_offsets=torch.tensor([45, 300])).colwise_scale)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("variant", ["vec_grouped", "generic_grouped"])
def test_grouped_kernels_compile(variant, arch):
    """CPU counterpart of the GPU tests above: the grouped kernels compile for Hopper and
    Blackwell, read the group ends and (vectorised) keep their 16-byte accesses."""
    from mxq.runtime import inspection

    op = mxq.fused_quant(rowwise=True, colwise=True, dbias=True, scale_layout="swizzled")(_ident)
    def wide_accesses(ptx):  # 16-byte loads, 8-byte FP8 stores
        return sum(ptx.count(k) for k in ("ld.global.v4.b32", "ld.global.v2.b64", "st.global.v2.b32"))

    for dtype in ("bf16", "fp32"):
        ptx = inspection.ptx_of(op, arch, dtype, variant)
        assert ptx.count(".entry") == 6  # the quantize kernel and the per-group dbias reduction's five forms
        if variant == "vec_grouped":  # vector accesses survive the arbitrary first row
            assert wide_accesses(ptx) == wide_accesses(inspection.ptx_of(op, arch, dtype, "vec")) > 0


# --- the grouped dbias reduction's two forms (kernels.config.Tuning.dbias_group_rows) ---------------------
OLD_DBIAS = kconfig.Tuning(dbias_group_rows=0)  # dbias_kernel only: a CTA per group and column tile
DBIAS_OPTS = [dict(rowwise=True, colwise=True, dact="gelu", dbias=True),
              dict(rowwise=True, colwise=True, dbias=True, amax=True, scale_layout="swizzled")]


@pytest.mark.gpu
@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("opts", DBIAS_OPTS)
def test_grouped_dbias_forms_match_reference_and_each_other(opts, dtype, small):
    """The default (groups averaging <= 1024 rows: reduce.dbias_groups_kernel, a warp per group)
    against the reference (within the op's class) and byte for byte against dbias_kernel alone
    (the same additions in the same order), on random groups with empty ones: 40 groups of 0-299
    rows, and (``small`` False) one of 1500 rows (47 blocks of partials: more than one round of
    dbias_groups_kernel) over PDL_MAX_ROWS rows; ``small``: 12 groups under PDL_MAX_ROWS rows
    (launched early)."""
    g = torch.Generator().manual_seed(7 + small)
    sizes = [int(s) for s in torch.randint(0, 300, (12 if small else 40,), generator=g)]
    sizes[::5] = [0] * len(sizes[::5])
    if not small:
        sizes.insert(17, 1500)
    m, n = sum(sizes), 200
    assert (m <= kconfig.PDL_MAX_ROWS) == small and m <= kconfig.Tuning().dbias_group_rows * len(sizes)
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    x, a = planted(m, n, dtype, seed=31), planted(m, n, dtype, seed=32)
    kw = {"act_input": a} if "dact" in opts else {}
    op = mxq.fused_quant(**opts)(_ident)
    old = mxq.fused_quant(**opts)(_ident)
    old._with_tuning(OLD_DBIAS)
    want = op.reference(x, group_offsets=offs, **kw)
    exact = "dact" not in opts
    v_abs = None if exact else v_abs_sum(op, x, group_offsets=offs, **kw)
    bound = None if exact else v_bound(op, x, **kw)
    xc, oc, kwc = x.cuda(), offs.cuda(), {k: v.cuda() for k, v in kw.items()}
    got = op(xc, group_offsets=oc, out=poisoned(op, xc, oc), **kwc)
    assert compare(got, want, exact, v_abs, v_bound=bound) == [], sizes
    base = old(xc, group_offsets=oc, **kwc)
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        if getattr(base, f) is not None:
            assert same_bytes(getattr(got, f), getattr(base, f)), f


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_grouped_dbias_forms_compile(arch):
    """CPU counterpart: a grouped dbias op's modules hold dbias_groups_kernel (early and late)
    beside the three dbias_kernel forms by default, on Hopper for both grouped variants and
    input dtypes, on Blackwell for the bf16 vectorised one (the reduction's code has no arch
    branch); and not with Tuning(dbias_group_rows=0) (a switch of the config, not of the arch:
    checked on sm_90a)."""
    from mxq.runtime import inspection

    opts = DBIAS_OPTS[0]
    op = mxq.fused_quant(**opts)(_ident)
    old = mxq.fused_quant(**opts)(_ident)
    old._with_tuning(OLD_DBIAS)
    forms = [(d, k) for d in ("bf16", "fp32") for k in ("vec_grouped", "generic_grouped")]
    for dtype, kind in forms if arch == "sm_90a" else forms[:1]:
        ptx = inspection.ptx_of(op, arch, dtype, kind)
        assert ptx.count(".entry") == 6 and "dbias_groups_kernel" in ptx
        if arch == "sm_90a":
            base = inspection.ptx_of(old, arch, dtype, kind)
            assert base.count(".entry") == 4 and "dbias_groups_kernel" not in base


def test_workspace_rows_by_hand():
    """The dbias workspace: a row per 32-row block (ceil), grouped a row per block of each group
    (70 rows in 3 groups: at most 70 // 32 + 3 blocks)."""
    assert [groups.workspace_rows(m) for m in (1, 32, 33, 64, 65)] == [1, 1, 2, 2, 3]
    assert groups.workspace_rows(70, 3) == 5 and groups.workspace_rows(31, 1) == 1 and groups.workspace_rows(0, 2) == 2
    # (a row per tile of other rows: NVFP4's 16-row colwise tiles, launch._ws_tile_rows)
    assert groups.workspace_rows(33, None, 16) == 3 and groups.workspace_rows(70, 3, 16) == 7
    from mxq.frontend.spec import QuantSpec
    from mxq.runtime.launch import _ws_tile_rows

    assert [_ws_tile_rows(QuantSpec(**o)) for o in (dict(format="nvfp4", colwise=True, dbias=True),
                                                    dict(format="nvfp4", dbias=True), dict(format="mxfp4", colwise=True),
                                                    dict(colwise=True, dbias=True))] == [16, 32, 32, 32]


# --- the group search's forms (kernels.config.Tuning.group_search) ----------------------------------------
SEARCHES = kconfig.GROUP_SEARCHES[1:]  # (the library's, "block_all", is every other test's kernel)
SEARCH_OPTS = [dict(rowwise=True, colwise=True, scale_layout="swizzled"),
               dict(rowwise=True, colwise=True, act="swiglu", scale_layout="compact"),
               dict(rowwise=False, colwise=True, dact="swiglu", dbias=True, scale_layout="swizzled"),
               dict(rowwise=True, colwise=False, act="gelu", scale_layout="swizzled")]


def _search_op(opts, search=None):
    """The op of ``opts`` built with Tuning(group_search=search) (None: the library's); a gated
    op's inner op (which the kernels run) is the one tuned and returned beside it."""
    op = mxq.fused_quant(**opts)(_ident)
    inner = op.inner if hasattr(op, "inner") else op
    if search is not None:
        inner._with_tuning(kconfig.Tuning(group_search=search))
    return op, inner


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [256, 70])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("opts", SEARCH_OPTS)
@pytest.mark.parametrize("search", SEARCHES)
def test_group_search_forms_equal_the_library_and_the_reference(search, opts, seed, n, dtype, monkeypatch):
    """Each form's bytes (every output, dbias included) equal the library kernel's and the CPU
    reference's (within the op's class), into poisoned outputs, on random groups with empty ones
    (the first and the last among them), aligned (N = 256: the packed and vectorised kernels)
    and not (N = 70: unaligned packed rows, the element-wise fp32 kernel); seed 2 adds groups
    enough (300) for every thread of a block search and every lane of a warp search to pass
    over several. CPU counterpart: test_group_search_forms_compile."""
    monkeypatch.setenv("MXQ_STRICT", "1")  # (a fallback would raise: the kernels run)
    gated = "swiglu" in (opts.get("act"), opts.get("dact"))  # (inputs [M, 2N])
    if opts.get("dbias") and n % 32:
        n = 96  # (a gated backward with rowwise or colwise blocks takes N % 32 == 0)
    g = torch.Generator().manual_seed(60 + seed)
    count = 300 if seed == 2 else 12
    sizes = [int(s) for s in torch.randint(0, 90 if seed == 2 else 300, (count,), generator=g)]
    sizes[::4] = [0] * len(sizes[::4])
    sizes = [0, *sizes, 0]
    m = sum(sizes)
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    base, base_inner = _search_op(opts)
    op, _ = _search_op(opts, search)
    x = planted(m, 2 * n if gated else n, dtype, seed=70 + seed)
    args, kw, v_abs = (x,), {}, None
    if "dact" in opts:  # (the gated backward: the gradient, the forward's input; its inner op's halves)
        args, kw = (planted(m, n, dtype, seed=80 + seed),), {"act_input": x}
        v_abs = v_abs_sum(base_inner, args[0], x[:, :n], x[:, n:], 0.0, group_offsets=offs)
    want = base.reference(*args, group_offsets=offs, **kw)
    exact = "act" not in opts and "dact" not in opts
    bound = None if exact else v_bound(base, *args, **kw)
    cargs, ckw, coffs = [a.cuda() for a in args], {k: v.cuda() for k, v in kw.items()}, offs.cuda()
    first = base(*cargs, group_offsets=coffs, **ckw)
    got = op(*cargs, group_offsets=coffs, out=poisoned(op, cargs[0], coffs), **ckw)
    assert compare(got, want, exact, v_abs, v_bound=bound) == [], sizes
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        if getattr(first, f) is not None:
            assert same_bytes(getattr(got, f), getattr(first, f)), (f, search, sizes)


S32_REDUX = re.compile(r"redux\.sync\.(?:add|max|min)\.s32")  # (the search's; amax's are .u32)


def _quantize_entry(ptx):
    """The PTX of a module's quantize kernel (its first entry: packed, vectorised or generic)."""
    body = ptx[ptx.index(".entry "):]
    return body[:body.index("\n}\n")]


# (Blackwell for one form: the arch changes only the E8M0 conversion, none of the search's code)
@pytest.mark.parametrize("search, arch", [(s, "sm_90a") for s in SEARCHES] + [("warps", "sm_100a")])
def test_group_search_forms_compile(search, arch):
    """CPU counterpart of the GPU test above: each form's grouped kernels compile for Hopper, one
    for Blackwell too (the packed kernel aligned and not, from bf16; the vectorised and element-wise
    kernels from fp32) with the modules' kernels unchanged; each reduces a warp's terms with a
    signed redux.sync apiece (three terms compact, four or five swizzled) where "block_all" has
    none and five shuffle butterflies of five steps; "warps" with one barrier fewer."""
    from mxq.runtime import inspection

    for k, opts in enumerate(SEARCH_OPTS[:3]):
        base, base_inner = _search_op(opts, "block_all")
        op, inner = _search_op(opts, search)
        for dtype, kind in (("bf16", "vec_grouped"), ("bf16", "generic_grouped"), ("fp32", "vec_grouped"),
                            ("fp32", "generic_grouped")):
            if (k > 0 or arch != "sm_90a") and (dtype, kind) != ("bf16", "vec_grouped"):
                continue  # (every kernel once on Hopper; the other ops and Blackwell on the packed kernel alone)
            lib = inspection.ptx_of(base_inner, arch, dtype, kind)
            ptx = inspection.ptx_of(inner, arch, dtype, kind)
            assert ptx.count(".entry") == lib.count(".entry")
            lib_q, q = _quantize_entry(lib), _quantize_entry(ptx)
            terms = 3 if opts["scale_layout"] == "compact" else 4 if not (opts["rowwise"] and opts["colwise"]) else 5
            assert len(S32_REDUX.findall(lib_q)) == 0 and lib_q.count("shfl.sync.bfly") >= 25
            assert len(S32_REDUX.findall(q)) == terms, (kind, dtype, opts)
            assert lib_q.count("shfl.sync.bfly") - q.count("shfl.sync.bfly") == 25, (kind, dtype)
            assert q.count("bar.sync") == lib_q.count("bar.sync") - (search == "warps"), (kind, dtype, opts)


def test_group_search_named_default_compiles_to_the_library_kernel():
    """The library's form named explicitly compiles to the library's grouped kernels (the same
    PTX, module and kernel names aside): "block_all" for a plain cast, "warps" for an op with
    arithmetic (KernelConfig.group_search)."""
    from mxq.runtime import inspection

    strip = re.compile(r"^//.*$|kernel_cutlass_\w+|mxq_gen_\w+|_mxq\w*", re.M)
    for opts, form in zip(SEARCH_OPTS[:2], ("block_all", "warps")):
        _, lib = _search_op(opts)
        _, named = _search_op(opts, form)
        for dtype in ("bf16", "fp32"):
            assert strip.sub("", inspection.ptx_of(lib, "sm_90a", dtype, "vec_grouped")) == strip.sub(
                "", inspection.ptx_of(named, "sm_90a", dtype, "vec_grouped")), (opts, dtype)


EMPTY_TILE_OPTS = [
    dict(rowwise=True, colwise=True),
    dict(colwise=True, act="gelu", dbias=True, amax=True),
    dict(rowwise=True, colwise=True, scale_layout="swizzled"),
    dict(format="fp8_block", rowwise=True, colwise=True, act="gelu"),
    dict(format="fp8_block", rowwise=True, colwise=True, dact="gelu", dbias=True),
    dict(rowwise=True, colwise=True, dact="swiglu", dbias=True),  # (two halves: both in one CTA)
    dict(format="fp8_block", rowwise=True, colwise=True, dact="swiglu", dbias=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("opts", EMPTY_TILE_OPTS)
def test_empty_tiles_leave_early_with_the_same_bytes(opts):
    """Groups whose sizes fill their row tiles and empty groups leave many of the grid's M / R + G
    row tiles without rows; they leave after their group search writing only their compact zero
    scales (Tuning.empty_exit, PackedKernel.empty_tile: each half's, for a gated backward). Into
    poisoned outputs, the same bytes as the reference and as the tiles run whole with masked rows
    (Tuning(empty_exit=False)). CPU
    counterpart: tests/test_kernels.py::test_empty_exit_is_the_grouped_fp8_kernels_alone."""
    sizes = [256, 0, 0, 128, 0, 384, 0, 0, 0, 512, 0]  # (multiples of 128 and of 32: G empty tiles or more)
    gated = opts.get("dact") == "swiglu"
    m, n = sum(sizes), (384 if gated else 320)  # (two column tiles, the last partial but for the halves)
    offsets = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    x = planted(m, n, torch.bfloat16, seed=21, specials=not gated)
    kw = {"act_input": planted(m, 2 * n if gated else n, torch.bfloat16, seed=22)} if opts.get("dact") else {}
    exact = "act" not in opts and "dact" not in opts
    ref = mxq.fused_quant(**opts)(_ident)
    want = ref.reference(x, group_offsets=offsets, **kw)
    v_abs = None
    if opts.get("dbias") and not exact:  # (a gated op's inner op takes the halves as tensors, and HALF)
        args = (ref.inner, x, kw["act_input"][:, :n], kw["act_input"][:, n:], 0.0) if gated else (ref, x)
        v_abs = v_abs_sum(*args, group_offsets=offsets, **({} if gated else kw))
    bound = None if exact else v_bound(ref, x, **kw)
    xc, oc = x.cuda(), offsets.cuda()
    kc = {k: v.cuda() for k, v in kw.items()}
    outs = []
    for leave in (True, False):
        op = mxq.fused_quant(**opts)(_ident)
        getattr(op, "inner", op)._with_tuning(kconfig.Tuning(empty_exit=leave))
        got = op(xc, group_offsets=oc, out=poisoned(op, xc, oc), **kc)
        assert compare(got, want, exact, v_abs, v_bound=bound) == [], leave
        outs.append(got)
    for name in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        a, b = getattr(outs[0], name), getattr(outs[1], name)
        assert (a is None and b is None) or same_bytes(a, b), name
