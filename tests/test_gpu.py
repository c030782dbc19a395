"""On a CUDA device: generated kernels against the reference, byte for byte (exactness classes).

Skipped without CUDA. CPU counterparts: the same specs compile for sm_90/sm_100a with their PTX
checked in test_codegen.py, and the reference itself is checked in test_reference.py. The full
device sweep (every option value, many shapes, timings) is bench/device_check.py.
"""

import math

import pytest
import torch

import mxq
from mxq.kernels.config import Tuning
from mxq.testing import compare, is_exact, padded_rows, planted, poisoned, same_bytes, v_abs_sum, v_bound

from .test_codegen import SAMPLE

pytestmark = pytest.mark.gpu


def _bound(op, *ins, **kw):
    """compare's ``v_bound`` for ``op`` on CPU inputs: the transcendental class's per-element bound on
    v (a dact op's bytes next to a root of its derivative may be several codes off within it);
    None in the exact class."""
    return None if is_exact(op) else v_bound(op, *ins, **kw)


def _sample_call(i, shape, seed):
    """SAMPLE op i with planted CPU inputs of ``shape``: (op, tensor inputs, act_input kwargs)."""
    opts, fn, dtype_name = SAMPLE[i]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    op = mxq.fused_quant(**opts)(fn)
    m = 1
    for d in shape[:-1]:
        m *= d
    ins = [planted(m, shape[-1], dtype, seed=seed + j).reshape(shape) for j in range(len(op.epilogue.tensor_params))]
    kw = {"act_input": planted(m, shape[-1], dtype, seed=seed + 97).reshape(shape)} if op.spec.dact else {}
    return op, ins, kw


@pytest.mark.parametrize("shape", [(1, 1), (33, 31), (127, 200), (4, 5, 96)])
@pytest.mark.parametrize("i", range(len(SAMPLE)))
def test_kernel_matches_reference(i, shape):
    op, ins, kw = _sample_call(i, shape, seed=i)
    want = op.reference(*ins, **kw)
    got = op(*[t.cuda() for t in ins], out=poisoned(op, ins[0].cuda()), **{k: v.cuda() for k, v in kw.items()})
    assert compare(got, want, is_exact(op), v_bound=_bound(op, *ins, **kw)) == []


@pytest.mark.parametrize("shape", [(127, 200), (4, 5, 96)])
@pytest.mark.parametrize("i", range(len(SAMPLE)))
def test_allocating_route_matches_reference(i, shape):
    """Calls without out=: compact-scale ops allocate their outputs in the native dispatcher (the
    host-time path); dtypes, shapes and bytes must be those of MXFP8Tensor.empty + the reference."""
    op, ins, kw = _sample_call(i, shape, seed=7 * i)
    want = op.reference(*ins, **kw)
    got = op(*[t.cuda() for t in ins], **{k: v.cuda() for k, v in kw.items()})
    like = mxq.MXFP8Tensor.empty(op.spec, shape, ins[0].dtype, "meta")
    for field in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax", "dbias"):
        g, w = getattr(got, field), getattr(like, field)
        assert (g is None) == (w is None), field
        if g is not None:
            assert g.is_cuda and g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous(), field
    assert compare(got, want, is_exact(op), v_bound=_bound(op, *ins, **kw)) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fast_path_matches_reference_and_still_checks(dtype, monkeypatch):
    """After one checked CUDA call, plain calls skip the Python checks (op._fast); every later
    call must still give the reference bytes, and unusual inputs must still take the full path
    (a transposed input is copied, an error under MXQ_STRICT=1)."""
    op = mxq.fused_quant(colwise=True, amax=True)(_fast_ident)
    xs = [planted(m, n, dtype, seed=m + n).cuda() for m, n in [(64, 256), (127, 200), (33, 8)]]
    op(xs[0])
    assert (dtype, xs[0].get_device()) in op._fast
    for x in xs:  # the second and later calls go the fast way
        assert compare(op(x), op.reference(x.cpu()), True) == []
    t = xs[0].t()
    assert compare(op(t), op.reference(t.cpu()), True) == []
    monkeypatch.setenv("MXQ_STRICT", "1")
    with pytest.raises(Exception, match="non-contiguous"):
        op(t)
    empty = op(xs[0][:0])
    assert empty.rowwise_data.shape == (0, 256)


def test_allocating_route_outputs_outlive_each_other():
    """A direction's data and scales share one allocation (csrc/dispatch.cc): each must stay
    valid and 256-byte aligned however the others are dropped."""
    x = planted(256, 4096, torch.bfloat16, seed=3).cuda()
    out = mxq.quantize(x, rowwise=True, colwise=True)
    keep, want = out.colwise_scale, out.colwise_scale.clone()
    data, data_want = out.rowwise_data, out.rowwise_data.clone()
    assert all(t.data_ptr() % 256 == 0 for t in (out.rowwise_data, out.rowwise_scale, out.colwise_data, keep))
    del out
    torch.cuda.synchronize()
    junk = [torch.full((256 * 4096 + 4096,), 7, dtype=torch.uint8, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    assert same_bytes(keep, want) and same_bytes(data, data_want)
    del junk


@pytest.mark.parametrize("m, shared", [(256, True), (2048, False)])
def test_allocating_route_frees_a_large_direction(m, shared):
    """Below ffi.SHARED_ALLOC_MAX_BYTES (4 MiB of FP8 outputs) a call's rowwise and colwise
    outputs share one allocation (one allocation less per small call); above it each direction
    has its own, so dropping the rowwise half (after the forward GEMM) frees its memory. CPU
    counterpart: tests/test_ffi.py::test_allocating_route_layout."""
    x = planted(m, 4096, torch.bfloat16, seed=m).cuda()
    want = mxq.quantize(x.cpu(), rowwise=True, colwise=True)
    out = mxq.quantize(x, rowwise=True, colwise=True)
    torch.cuda.synchronize()
    assert compare(out, want, True) == []
    before = torch.cuda.memory_allocated()
    out.rowwise_data = out.rowwise_scale = None
    freed = before - torch.cuda.memory_allocated()
    assert (freed == 0) if shared else (freed >= m * (4096 + 128)), freed
    assert same_bytes(out.colwise_data, want.colwise_data) and same_bytes(out.colwise_scale, want.colwise_scale)


def _fast_ident(x):
    return x


def test_noop_on_device_writes_nothing():
    x = torch.randn(64, 96, device="cuda")
    out = mxq.quantize(x, rowwise=True, colwise=True, amax=True)
    before = [out.rowwise_data.clone(), out.colwise_scale.clone(), out.amax.clone()]
    mxq.quantize(x * 7, rowwise=True, colwise=True, amax=True, out=out, noop=torch.ones(1, device="cuda"))
    assert all(same_bytes(a, b) for a, b in zip(before, [out.rowwise_data, out.colwise_scale, out.amax]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dbias_full_and_partial_rounds_match_reference(dtype):
    """M = 9590 is 300 rows of partials (the last block partial): a round of dbias_kernel copies
    8 warps x 32 fp32 rows (bf16) or 8 x 16 fp64 rows (fp32), so one full round and one of 44 rows
    (bf16), or two full rounds and one of 44 (fp32), whose copies past the end are zero-filled and
    added as 0; bf16 takes the packed kernel, fp32 the vectorised one. Columns 1000 (not a multiple
    of 32: the last CTA has idle lanes). CPU counterpart:
    tests/test_codegen.py::test_dbias_kernel_keeps_its_loads_in_flight."""
    x = torch.randn(9590, 1000, dtype=dtype)
    x[:, 7] = 0.0
    x[::3, 9] = -x[::3, 9]
    a = torch.randn(9590, 1000, dtype=dtype)
    op = mxq.fused_quant(rowwise=True, colwise=True, dact="relu", dbias=True)(_fast_ident)
    want = op.reference(x, act_input=a)
    got = op(x.cuda(), act_input=a.cuda(), out=poisoned(op, x.cuda()))
    assert compare(got, want, is_exact(op)) == []
    assert torch.equal(op(x.cuda(), act_input=a.cuda()).dbias.cpu(), got.dbias.cpu())  # deterministic


@pytest.mark.parametrize("dtype, n, want", [(torch.bfloat16, 64, 0.0), (torch.bfloat16, 36, 0.0),
                                            (torch.float32, 64, 2.0), (torch.float32, 36, 2.0)])
def test_dbias_blocks_sum_in_the_partial_precision(dtype, n, want):
    """A hand-made column that tells fp32 block sums from fp64 ones: 2^24, 1, 1 in rows 0-2 and
    -2^24 in row 32. Its exact sum (the fp64 reference) is 2. A 16-bit input's 32-row block is
    summed in fp32, where 2^24 + 1 rounds to 2^24, so dbias is 0; fp32 inputs sum their blocks in
    fp64 and get 2 (numerics.dbias_partial_dtype). N = 64 takes the packed / vectorised kernel, N =
    36 the generic one: both paths sum in the same precision. CPU counterpart:
    tests/test_codegen.py::test_dbias_partials_precision_follows_the_input_dtype."""
    x = torch.zeros(64, n, dtype=dtype)
    x[0, 0], x[1, 0], x[2, 0], x[32, 0] = 2.0 ** 24, 1.0, 1.0, -(2.0 ** 24)
    op = mxq.fused_quant(colwise=True, dbias=True)(_fast_ident)
    assert op.reference(x).dbias[0].item() == 2.0
    got = op(x.cuda(), out=poisoned(op, x.cuda())).dbias.cpu()
    assert got[0].item() == want and torch.all(got[1:] == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(300, 256), (33, 36)])
def test_plain_dbias_matches_reference(dtype, shape):
    """dbias of a plain cast (no act, dact or epilogue: v is the input). A packed kernel that left
    its partial sums unset for such ops would pass every other GPU case. CPU counterpart:
    tests/test_codegen.py::test_plain_dbias_sums_its_input."""
    x = planted(*shape, dtype, seed=5)
    for op in (mxq.fused_quant(colwise=True, dbias=True)(_fast_ident),
               mxq.fused_quant(rowwise=True, colwise=True, dbias=True, amax=True)(_fast_ident)):
        got = op(x.cuda(), out=poisoned(op, x.cuda()))
        assert compare(got, op.reference(x), is_exact(op)) == []


# the packed kernel's scale stores: the wide rowwise tile's word stores (both layouts) and the
# tall tile's byte stores
SCALE_OPS = [dict(rowwise=True), dict(rowwise=True, scale_layout="swizzled", scale_mode="floor"),
             dict(rowwise=False, colwise=True, fp8="e5m2"), dict(rowwise=True, colwise=True),
             dict(rowwise=True, colwise=True, scale_layout="swizzled", amax=True),
             dict(rowwise=True, colwise=True, dact="gelu", dbias=True)]


def _scales_at_offset(out, offset):
    """``out`` with each scale tensor replaced by a view ``offset`` bytes into a larger buffer
    (holding the same bytes): a legal out= whose scales are not 4-byte aligned when offset % 4."""
    for name in ("rowwise_scale", "colwise_scale"):
        t = getattr(out, name)
        if t is not None:
            view = torch.empty(t.numel() + 8, dtype=torch.uint8, device=t.device)[offset:offset + t.numel()].view(t.shape)
            view.copy_(t)
            setattr(out, name, view)
    return out


@pytest.mark.parametrize("offset", [0, 1, 2])
@pytest.mark.parametrize("shape", [(100, 1024), (33, 4352)])
@pytest.mark.parametrize("opts", SCALE_OPS)
def test_scale_words_and_unaligned_scales_match_reference(opts, shape, offset):
    """Scale rows with nbr % 4 == 0 (N = 1024, 4352): 4-byte aligned scale tensors take the word
    stores, offsets 1 and 2 the byte-by-byte path of the same kernel; partial row tiles (M = 100,
    33) and a partial column tile (4352 = 4.25 x 1024 for the wide rowwise tile). CPU counterpart:
    tests/test_codegen.py::test_row_scales_leave_as_words."""
    m, n = shape
    x = planted(m, n, torch.bfloat16, seed=m + offset)
    kw = {"act_input": planted(m, n, torch.bfloat16, seed=n)} if opts.get("dact") else {}
    op = mxq.fused_quant(**opts)(_fast_ident)
    want = op.reference(x, **kw)
    out = _scales_at_offset(poisoned(op, x.cuda()), offset)
    got = op(x.cuda(), out=out, **{k: v.cuda() for k, v in kw.items()})
    assert compare(got, want, is_exact(op), v_bound=_bound(op, x, **kw)) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(100, 1024), (33, 4352), (257, 264)])
@pytest.mark.parametrize("opts", [dict(rowwise=True, colwise=True), dict(rowwise=True, scale_layout="swizzled", amax=True),
                                  dict(rowwise=True, colwise=True, act="gelu", dbias=True, scale_mode="floor")])
def test_row_scale_store_policy_writes_the_same_bytes(opts, shape, dtype):
    """Row-scale bytes stored with the L2 evict_last policy (the default) and plainly (Tuning(row_scale_l2_keep=False))
    are the same bytes, and the reference's, on the packed (bf16) and vectorised (fp32) kernels,
    partial row and column tiles included. CPU counterpart:
    tests/test_codegen.py::test_row_scale_bytes_wait_in_l2."""
    m, n = shape
    x = planted(m, n, dtype, seed=m * 7 + n)
    want = None
    outs = []
    for keep in (1, 0):
        op = mxq.fused_quant(**opts)(_fast_ident)
        op._with_tuning(Tuning(row_scale_l2_keep=bool(keep)))
        want = op.reference(x) if want is None else want
        got = op(x.cuda(), out=poisoned(op, x.cuda()))
        v_abs = v_abs_sum(op, x) if opts.get("dbias") and not is_exact(op) else None
        assert compare(got, want, is_exact(op), v_abs) == []
        outs.append(got.rowwise_scale)
    assert same_bytes(*outs)


@pytest.mark.parametrize("opts", [dict(rowwise=True, colwise=True, amax=True), dict(colwise=True, dact="gelu", dbias=True),
                                  dict(rowwise=True)])
def test_tall_tensor_splits_the_grid_over_y_and_z(opts):
    """M = 2,200,032 rows is 68,751 row tiles: more than grid y allows, so the packed kernel's row
    tiles are split over y and z (34,376 x 2, one CTA past the end, which must write nothing);
    the rowwise cast's 8-row wide tiles make 275,004 row tiles (55,001 x 5, one past the end).
    CPU counterpart: tests/test_codegen.py::test_grid_split_is_compiled_in."""
    m, n = 2_200_032, 16
    x = torch.randn(m, n, dtype=torch.bfloat16)
    x[-1, -1], x[0, 0], x[-33, 3] = float("nan"), float("inf"), 0.0
    kw = {"act_input": torch.randn(m, n, dtype=torch.bfloat16)} if opts.get("dact") else {}
    op = mxq.fused_quant(**opts)(_fast_ident)
    want = op.reference(x, **kw)
    got = op(x.cuda(), out=poisoned(op, x.cuda()), **{k: v.cuda() for k, v in kw.items()})
    assert compare(got, want, is_exact(op), v_bound=_bound(op, x, **kw)) == []


@pytest.mark.parametrize("shape", [(127, 200), (64, 256)])
@pytest.mark.parametrize("i", range(len(SAMPLE)))
def test_prepare_matches_reference(i, shape):
    """prepare(): bound once in Python (launch.Launcher.bind), launched twice into poisoned
    outputs; every byte as the reference's. CPU counterpart (the binding by slot):
    tests/test_runtime.py::test_python_binding_puts_every_tensor_in_its_slot."""
    op, ins, kw = _sample_call(i, shape, seed=11 * i + 1)
    want = op.reference(*ins, **kw)
    gins = [t.cuda() for t in ins]
    gkw = {k: v.cuda() for k, v in kw.items()}
    out = poisoned(op, gins[0])
    launch, got = op.prepare(*gins, out=out, **gkw)
    assert got is out
    launch()
    launch()
    torch.cuda.synchronize()
    v_abs = v_abs_sum(op, *ins, **kw) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs, v_bound=_bound(op, *ins, **kw)) == []


def _bias_scale(x, s, b):
    return x * s + b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(256, 264), (33, 70), (2, 40, 96)])
@pytest.mark.parametrize("dirs", [dict(rowwise=True), dict(rowwise=False, colwise=True),
                                  dict(rowwise=True, colwise=True, amax=True, dbias=True, act="gelu")])
@pytest.mark.parametrize("kinds", [("col", "row"), ("scalar", "row"), ("full", "scalar"), ("col", "full")])
def test_broadcast_and_strided_operands_match_reference(kinds, dirs, shape, dtype):
    """Broadcast operands (row [N], col [..., 1], scalars) through the packed / vectorised and the
    generic kernels, every byte against the reference. CPU counterpart: tests/test_operands.py."""
    op = mxq.fused_quant(**dirs)(_bias_scale)
    m = 1
    for d in shape[:-1]:
        m *= d
    n = shape[-1]
    x = planted(m, n, dtype, seed=m + n).reshape(shape)

    def operand(kind, seed):
        full = planted(m, n, dtype, seed=seed, specials=False).reshape(shape)
        return {"full": full, "row": full.reshape(m, n)[0], "col": full.reshape(m, n)[:, :1].reshape(*shape[:-1], 1),
                "scalar": full.reshape(-1)[:1].reshape(())}[kind]

    s, b = operand(kinds[0], 5), operand(kinds[1], 6)
    want = op.reference(x, s, b)
    got = op(x.cuda(), s.cuda(), b.cuda(), out=poisoned(op, x.cuda()))
    v_abs = v_abs_sum(op, x, s, b) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs) == []


def _gate_mul(g, u):
    return g * u


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [256, 72, 70])
@pytest.mark.parametrize("dirs", [dict(rowwise=True), dict(rowwise=True, colwise=True, dbias=True, act="silu")])
def test_strided_half_views_match_reference(dirs, n, dtype):
    """x[:, :N] and x[:, N:] of a [M, 2N] tensor run on the kernels with their row stride (no
    copy): the vectorised kernels when 2N keeps 16-byte rows, else the generic one."""
    op = mxq.fused_quant(**dirs)(_gate_mul)
    base = planted(100, 2 * n, dtype, seed=n)
    want = op.reference(base[:, :n].contiguous(), base[:, n:].contiguous())
    g = base.cuda()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no copy warning: the views go in as they are
        got = op(g[:, :n], g[:, n:], out=poisoned(op, g[:, :n].contiguous()))
    v_abs = v_abs_sum(op, base[:, :n].contiguous(), base[:, n:].contiguous()) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs) == []


def test_prepare_with_a_bias_matches_reference():
    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(_bias_scale)
    x = planted(300, 512, torch.bfloat16, seed=3)
    s, b = torch.tensor(0.75, dtype=torch.bfloat16), planted(1, 512, torch.bfloat16, seed=4, specials=False)[0]
    want = op.reference(x, s, b)
    launch, out = op.prepare(x.cuda(), s.cuda(), b.cuda(), out=poisoned(op, x.cuda()))
    launch()
    torch.cuda.synchronize()
    assert compare(out, want, is_exact(op)) == []


def _residual(x, r):
    return x * 0.5 + r


def _at_offset(t, offset):
    """``t``'s values in a view ``offset`` elements into a larger buffer (a legal input whose
    rows start at no particular alignment)."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


# the ops of the unaligned-rows tests (16-bit and fp32): every direction, amax, swizzled scales,
# act, dact + dbias, a two-input epilogue with dbias
_UNALIGNED_CASES = [
    (dict(rowwise=True), _fast_ident),
    (dict(rowwise=False, colwise=True, amax=True), _fast_ident),
    (dict(rowwise=True, colwise=True, scale_layout="swizzled"), _fast_ident),
    (dict(rowwise=True, colwise=True, act="gelu", amax=True), _fast_ident),
    (dict(rowwise=True, colwise=True, dact="gelu", dbias=True), _fast_ident),
    (dict(rowwise=True, colwise=True, act="silu", dbias=True), _residual),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("offset", [0, 1, 3, 9])
@pytest.mark.parametrize("shape", [(65, 1030), (40, 333), (33, 8), (5, 257), (9, 5), (3, 1)])
@pytest.mark.parametrize("case", _UNALIGNED_CASES)
def test_unaligned_rows_match_reference(case, shape, offset, dtype):
    """16-bit inputs at any N and base alignment run the packed kernel with unaligned rows
    (mxq/kernels/unaligned.py): several column tiles with a partial last one (1030, 333, 257),
    rows shorter than a chunk (8 at offset 3, 5, 1), inputs, act_input and FP8 outputs that start
    1 to 11 elements past an aligned address (the rows of odd N then start at every offset inside
    a chunk);
    every byte against the reference. CPU counterpart:
    test_codegen.py::test_unaligned_rows_are_staged_and_stored_as_words."""
    opts, fn = case
    op = mxq.fused_quant(**opts)(fn)
    m, n = shape
    ins = [planted(m, n, dtype, seed=m + n + j) for j in range(len(op.epilogue.tensor_params))]
    kw = {"act_input": planted(m, n, dtype, seed=n)} if op.spec.dact else {}
    want = op.reference(*ins, **kw)
    gins = [_at_offset(t.cuda(), offset + j) for j, t in enumerate(ins)]
    gkw = {k: _at_offset(v.cuda(), offset + 2) for k, v in kw.items()}
    out = poisoned(op, gins[0])
    for name in ("rowwise_data", "colwise_data"):  # FP8 rows at any byte alignment too
        t = getattr(out, name)
        if t is not None:
            setattr(out, name, _at_offset(t, offset))
    got = op(*gins, out=out, **gkw)
    v_abs = v_abs_sum(op, *ins, **kw) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs, v_bound=_bound(op, *ins, **kw)) == []


@pytest.mark.parametrize("layout", ["row_align=16", "row_align=8", "stride=N+3"])
@pytest.mark.parametrize("shape", [(65, 1030), (40, 333), (33, 8), (9, 5), (3, 1), (70, 512)])
@pytest.mark.parametrize("case", [
    (dict(rowwise=True), _fast_ident),
    (dict(rowwise=False, colwise=True, amax=True), _fast_ident),
    (dict(rowwise=True, colwise=True, scale_layout="swizzled"), _fast_ident),
    (dict(rowwise=True, colwise=True, act="gelu"), _fast_ident),
    (dict(rowwise=True, colwise=True, dact="gelu", dbias=True), _fast_ident),
    (dict(rowwise=True, colwise=True, act="silu"), _residual),
])
def test_padded_outputs_match_reference(case, shape, layout):
    """FP8 data whose rows are padded (out= from MXFP8Tensor.empty(row_align=...), or rows N + 3
    elements apart): at N % 8 != 0 rows that start on 8-byte boundaries take the unaligned
    kernel's aligned stores (whole units, only the last tile's tails parked; dbias ops keep the
    realigned stores), other strides the realigned ones; N % 8 == 0 the vectorised kernel when
    the row stride is a multiple of 8, else the unaligned one. Every byte against the reference,
    and no byte of the padding written. CPU counterparts: test_runtime.py::
    test_out_may_have_padded_rows and test_codegen.py::test_unaligned_rows_store_whole_units_when_aligned."""
    opts, fn = case
    op = mxq.fused_quant(**opts)(fn)
    m, n = shape
    ins = [planted(m, n, torch.bfloat16, seed=m + n + j) for j in range(len(op.epilogue.tensor_params))]
    kw = {"act_input": planted(m, n, torch.bfloat16, seed=n)} if op.spec.dact else {}
    want = op.reference(*ins, **kw)
    gins = [t.cuda() for t in ins]
    if layout.startswith("row_align"):
        out = poisoned(op, gins[0], row_align=int(layout.split("=")[1]))
    else:
        out = poisoned(op, gins[0])
        for name in ("rowwise_data", "colwise_data"):
            t = getattr(out, name)
            if t is not None:
                buf = torch.full((m, n + 3), 0xAB, dtype=torch.uint8, device="cuda").view(t.dtype)
                setattr(out, name, buf[:, :n])
    got = op(*gins, out=out, **{k: v.cuda() for k, v in kw.items()})
    assert got is out
    v_abs = v_abs_sum(op, *ins, **kw) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs, v_bound=_bound(op, *ins, **kw)) == []
    for name in ("rowwise_data", "colwise_data"):
        t = getattr(got, name)
        if t is not None:
            assert bool((padded_rows(t)[:, n:] == 0xAB).all()), f"{name}: a padding byte was written"


@pytest.mark.parametrize("shape", [(65, 1030), (40, 333), (9, 5), (64, 4100)])
@pytest.mark.parametrize("case", [
    (dict(rowwise=True), _fast_ident),
    (dict(rowwise=True, colwise=True, amax=True), _fast_ident),
    (dict(rowwise=True, colwise=True, act="gelu"), _fast_ident),
    (dict(rowwise=True, colwise=True, dact="gelu", dbias=True), _fast_ident),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_default_outputs_pad_odd_rows(case, shape, dtype):
    """Without out=, N % 8 != 0 gets FP8 data of rows padded to 16 bytes (MXFP8Tensor.empty's
    default), which the kernels write with whole 8-byte units (variant rows8; fp32: the vectorised
    kernel's staged rows, colwise alone the element-wise kernel) (N = 1030 and 4100 even, 333 and 5 odd: both warp
    counts of a plain cast's rows8 kernel, KernelConfig.rows8_warps). Every
    byte against the reference; mxq.quantize alike. CPU counterpart:
    test_runtime.py::test_default_outputs_pad_rows_that_are_not_whole_units."""
    opts, fn = case
    op = mxq.fused_quant(**opts)(fn)
    m, n = shape
    x = planted(m, n, dtype, seed=m * n)
    kw = {"act_input": planted(m, n, dtype, seed=n)} if op.spec.dact else {}
    want = op.reference(x, **kw)
    got = op(x.cuda(), **{k: v.cuda() for k, v in kw.items()})
    stride = n if n % 8 == 0 else -(-n // 16) * 16
    for name in ("rowwise_data", "colwise_data"):
        t = getattr(got, name)
        if t is not None:
            assert t.stride() == (stride, 1), name
    v_abs = v_abs_sum(op, x, **kw) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs, v_bound=_bound(op, x, **kw)) == []
    if not op.spec.dact and fn is _fast_ident and not op.spec.act:
        q = mxq.quantize(x.cuda(), rowwise=op.spec.rowwise, colwise=op.spec.colwise, amax=op.spec.amax)
        assert q.rowwise_data is None or q.rowwise_data.stride() == (stride, 1)
        assert compare(q, want, True) == []


def _bias_gelu_in(x, b):
    return x + b


def _spy_variants(monkeypatch) -> list:
    """The variants the calls made after this ask compiled functions of, in order, on both
    routes (the C++ dispatcher's callback into Python and the Python binding)."""
    from mxq.runtime import compiler
    from mxq.runtime import launch as binding

    asked = []
    real = compiler.native_function

    def spy(op, arch, dtype_name, variant, *args, **kwargs):
        asked.append(variant)
        return real(op, arch, dtype_name, variant, *args, **kwargs)

    monkeypatch.setattr(compiler, "native_function", spy)
    monkeypatch.setattr(binding, "native_function", spy)
    return asked


@pytest.mark.parametrize("form", ["default", "other"])
@pytest.mark.parametrize("row_align", [16, 8])
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("shape", [(65, 1030), (40, 333), (33, 8), (5, 257), (9, 5), (3, 1), (70, 4100)])
@pytest.mark.parametrize("case", _UNALIGNED_CASES + [(dict(rowwise=True, colwise=True, act="gelu"), _bias_gelu_in),
                                                     (dict(rowwise=False, colwise=True, act="gelu"), _fast_ident)])
def test_fp32_unaligned_rows_match_reference(case, shape, offset, row_align, form, monkeypatch):
    """fp32 inputs at any N and base alignment whose FP8 rows start on 8-byte boundaries (variant
    rows8, mxq's own padded outputs) run the vectorised kernel with staged rows
    (KernelConfig.vec_unaligned), in the op's staging form (words or chunks) and in the other
    (Tuning.vec_unaligned_copy): partial last column tiles and units (1030, 333, 257, 5), rows
    shorter than a lane's 8 columns (5, 1), M not a multiple of 32, inputs and act_input 1 to 5
    elements past an aligned address, a bias [N] at an odd address (the last case); every byte
    against the reference, and no padding byte written. CPU counterpart:
    test_codegen.py::test_fp32_unaligned_rows_are_staged_by_words_or_chunks. (The plain colwise
    case runs the element-wise kernel in both forms; the gelu colwise one is the vectorised
    kernel's colwise-only path.) A noop call into poisoned outputs writes no byte."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    asked = _spy_variants(monkeypatch)
    opts, fn = case
    op = mxq.fused_quant(**opts)(fn)
    if form == "other":
        from mxq.frontend import codegen

        chunks = codegen.kernel_config(op.spec, op.epilogue, None).vec_unaligned_chunks
        op._with_tuning(Tuning(vec_unaligned_copy="words" if chunks else "chunks"))
    m, n = shape
    ins = [planted(m, n, torch.float32, seed=m + n + j) for j in range(len(op.epilogue.tensor_params))]
    if fn is _bias_gelu_in:
        ins[1] = ins[1][0]
    kw = {"act_input": planted(m, n, torch.float32, seed=n)} if op.spec.dact else {}
    want = op.reference(*ins, **kw)
    gins = [_at_offset(t.cuda(), offset + j) for j, t in enumerate(ins)]
    gkw = {k: _at_offset(v.cuda(), offset + 2) for k, v in kw.items()}
    out = poisoned(op, gins[0], row_align=row_align)
    got = op(*gins, out=out, **gkw)
    v_abs = v_abs_sum(op, *ins, **kw) if op.spec.dbias and not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs, v_bound=_bound(op, *ins, **kw)) == []
    for name in ("rowwise_data", "colwise_data"):
        t = getattr(got, name)
        if t is not None and n % row_align != 0:
            assert bool((padded_rows(t)[:, n:] == 0xAB).all()), f"{name}: a padding byte was written"
    skipped, fresh = poisoned(op, gins[0], row_align=row_align), poisoned(op, gins[0], row_align=row_align)
    op(*gins, out=skipped, noop=torch.ones(1, device="cuda"), **gkw)
    for name in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        if getattr(fresh, name) is not None:
            assert same_bytes(getattr(skipped, name), getattr(fresh, name)), f"{name}: written under noop"
    for name in ("rowwise_data", "colwise_data"):  # (their padding too)
        t = getattr(skipped, name)
        if t is not None:
            assert bool((padded_rows(t) == 0xAB).all()), f"{name}: written under noop"
    # the staged kernel ran (the element-wise one gives the same bytes): rows8 wherever vec cannot
    if offset or n % 8:
        assert asked and set(asked) == {"rows8"}, asked


@pytest.mark.parametrize("form", ["words", "chunks"])
@pytest.mark.parametrize("shape", [(33, 70), (40, 333), (70, 4100)])
@pytest.mark.parametrize("kinds", [("col", "row"), ("scalar", "full"), ("col", "half")])
def test_fp32_unaligned_operands_match_reference(kinds, shape, form, monkeypatch):
    """Broadcast operands (col [M, 1], row [N], scalar) and a strided half view (x[:, n:] of a [M,
    2n] tensor) on the fp32 vectorised kernel's unaligned rows (variant rows8, padded outputs),
    in both staging forms; every byte against the reference. CPU counterparts:
    tests/test_operands.py, test_codegen.py::test_fp32_unaligned_rows_are_staged_by_words_or_chunks."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    asked = _spy_variants(monkeypatch)
    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu", dbias=True)(_bias_scale)
    op._with_tuning(Tuning(vec_unaligned_copy=form))
    m, n = shape
    x = planted(m, n, torch.float32, seed=m + n)
    wide = planted(m, 2 * n, torch.float32, seed=7, specials=False)

    def operand(kind, seed):
        full = planted(m, n, torch.float32, seed=seed, specials=False)
        return {"full": full, "row": full[0], "col": full[:, :1], "scalar": full.reshape(-1)[:1].reshape(()),
                "half": wide[:, n:]}[kind]

    s, b = operand(kinds[0], 5), operand(kinds[1], 6)
    want = op.reference(x, s, b.contiguous())
    gx = _at_offset(x.cuda(), 1)
    gb = wide.cuda()[:, n:] if kinds[1] == "half" else b.cuda()
    got = op(gx, s.cuda(), gb, out=poisoned(op, gx, row_align=16))
    v_abs = v_abs_sum(op, x, s, b.contiguous()) if not is_exact(op) else None
    assert compare(got, want, is_exact(op), v_abs) == []
    assert asked and set(asked) == {"rows8"}, asked  # (the input 4 bytes off 16: never vec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_calls_take_rows8_on_both_routes(dtype, monkeypatch):
    """Padded FP8 rows at N % 8 != 0 take variant rows8 for every input dtype, on the native
    dispatcher's allocating route (csrc/dispatch.cc asks Python for the kernel it picked) and on
    op.prepare's Python binding (launch.variant_for); the bytes are the reference's. CPU
    counterpart: test_launch.py::test_variant_by_hand."""
    asked = _spy_variants(monkeypatch)
    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(_fast_ident)
    x = planted(40, 333, dtype, seed=40)
    want = op.reference(x)
    xc = x.cuda()
    assert compare(op(xc), want, is_exact(op)) == []
    assert asked == ["rows8"], asked
    # (that call took the native allocating route: the dispatcher's rule, not the binding's)
    assert (xc.dtype, xc.get_device()) in op._fast, "no native dispatcher served the call"
    launch, out = op.prepare(x.cuda())
    launch()
    torch.cuda.synchronize()
    assert compare(out, want, is_exact(op)) == []
    assert asked == ["rows8", "rows8"], asked


@pytest.mark.parametrize("shape", [(4, 1, 13), (1, 6, 37), (3, 1, 2, 45)])
def test_padded_outputs_with_size_one_dims(shape):
    """N-D padded outputs whose leading dimensions include size-1 ones, which torch gives any
    stride (a [4, 1, 13] view of 16-byte rows has strides (16, 13, 1)): the C++ dispatcher's
    RowStride skips them. Through out= (MXFP8Tensor.empty's default), a noop call (its zeroed
    outputs) and the allocating route; every byte against the reference."""
    op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(_fast_ident)
    n = shape[-1]
    x = planted(math.prod(shape[:-1]), n, torch.bfloat16, seed=n).reshape(shape)
    want = op.reference(x)
    xc = x.cuda()
    out = mxq.MXFP8Tensor.empty(op.spec, shape, x.dtype, "cuda")
    assert op(xc, out=out) is out
    assert compare(out, want, is_exact(op)) == []
    assert compare(op(xc), want, is_exact(op)) == []
    skipped = op(xc, noop=torch.ones(1, device="cuda"))
    assert not bool(skipped.rowwise_data.view(torch.uint8).any())


@pytest.mark.parametrize("shape", [(65, 1030), (40, 333)])
@pytest.mark.parametrize("case", [
    (dict(rowwise=True), _fast_ident),
    (dict(rowwise=True, colwise=True, scale_layout="swizzled", amax=True), _fast_ident),
    (dict(rowwise=True, colwise=True, act="gelu"), _fast_ident),
    (dict(rowwise=True, colwise=True, act="silu"), _residual),
])
def test_unaligned_eight_warps_match_reference(case, shape, monkeypatch):
    """Tuning.unaligned_warps=8 (N % 8 != 0, 4 rows per thread; the default for plain casts with
    colwise output, forced here for every case): every byte against the reference, inputs 3
    elements past an aligned address. CPU counterpart:
    test_codegen.py::test_unaligned_warps."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    opts, fn = case
    op = mxq.fused_quant(**opts)(fn)
    op._with_tuning(Tuning(unaligned_warps=8))
    m, n = shape
    ins = [planted(m, n, torch.bfloat16, seed=m + j) for j in range(len(op.epilogue.tensor_params))]
    want = op.reference(*ins)
    gins = [_at_offset(t.cuda(), 3) for t in ins]
    got = op(*gins, out=poisoned(op, gins[0]))
    assert compare(got, want, is_exact(op)) == []


@pytest.mark.parametrize("shape", [(256, 264), (100, 1032), (33, 8), (1, 512)])
@pytest.mark.parametrize("opts", [
    dict(rowwise=True),
    dict(rowwise=False, colwise=True, amax=True),
    dict(rowwise=True, colwise=True, dbias=True),
    dict(rowwise=True, colwise=True, dbias=True, amax=True, scale_layout="swizzled", fp8="e5m2", scale_mode="floor"),
])
@pytest.mark.parametrize("fn", [_fast_ident, _residual])
def test_fp32_staged_dact_matches_reference(fn, opts, shape, monkeypatch):
    """Tuning.vec_stage (the default): the fp32 kernel of a dact op stages its inputs through
    shared memory and reuses it for the column reduction; every byte against the reference and
    the same bytes as the unstaged kernel (Tuning(vec_stage=False)), into poisoned outputs, and
    noop writes nothing. CPU counterpart: test_codegen.py::test_fp32_staged_dact."""
    monkeypatch.setenv("MXQ_STRICT", "1")
    op = mxq.fused_quant(dact="gelu", **opts)(fn)
    op._with_tuning(Tuning(vec_stage=True))
    m, n = shape
    ins = [planted(m, n, torch.float32, seed=m + j) for j in range(len(op.epilogue.tensor_params))]
    a = planted(m, n, torch.float32, seed=n)
    want = op.reference(*ins, act_input=a)
    v_abs = v_abs_sum(op, *ins, act_input=a) if op.spec.dbias else None
    gins = [t.cuda() for t in ins]
    got = op(*gins, act_input=a.cuda(), out=poisoned(op, gins[0]))
    assert compare(got, want, False, v_abs, v_bound=_bound(op, *ins, act_input=a)) == []
    unstaged = mxq.fused_quant(dact="gelu", **opts)(fn)
    unstaged._with_tuning(Tuning(vec_stage=False))
    other = unstaged(*gins, act_input=a.cuda(), out=poisoned(op, gins[0]))
    for name in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        if getattr(got, name) is not None:
            assert same_bytes(getattr(got, name), getattr(other, name)), name
    # noop: every field keeps its poison (the staged copies are issued before noop is read)
    out, fresh = poisoned(op, gins[0]), poisoned(op, gins[0])
    op(*gins, act_input=a.cuda(), noop=torch.ones(1, device="cuda"), out=out)
    for name in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias"):
        if getattr(fresh, name) is not None:
            assert same_bytes(getattr(out, name), getattr(fresh, name)), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_noop_and_prepare_in_every_format(dtype, monkeypatch):
    """MXFP4, NVFP4 (1x16 and 16x16 tiles) and FP8 block scaling (the transposed copy, 128x128
    tiles) on the kernels: an out= call with noop 1.0 writes nothing, 0.0 the reference's bytes
    (test_launch.check_noop); a prepared launch writes the reference's bytes, and again after its
    input changed in place; MXQ_STRICT: no fallback. CPU counterpart:
    test_launch.py::test_noop_in_every_format_on_the_reference."""
    from .test_launch import NOOP_CASES, _relu, check_noop

    monkeypatch.setenv("MXQ_STRICT", "1")
    for fmt, opts in NOOP_CASES:
        check_noop(fmt, opts, dtype, "cuda")
        op = mxq.fused_quant(format=fmt, act="relu", **opts)(_relu)
        x = planted(96, 256, dtype, seed=2).cuda()
        launch, out = op.prepare(x)
        for step in range(2):
            launch()
            assert compare(out, op.reference(x.cpu()), True) == [], (fmt, step)
            x.mul_(-0.75)  # (the next launch reads the new values)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_operands_in_other_formats_match_reference(dtype, monkeypatch):
    """Column [M, 1], scalar, row [N] and full operands (``x * s + b``, the exact class) in FP8 block
    scaling (1x128 and 128-row colwise blocks, 128x128 tiles), MXFP4 and NVFP4 on the kernels, into
    poisoned outputs: every byte the reference's; MXQ_STRICT: no fallback. CPU counterpart:
    tests/test_operands.py::test_operands_in_other_formats_are_served."""
    from .test_operands import OPERAND_FORMATS, OPERAND_KINDS, _mul_add, operand_inputs

    monkeypatch.setenv("MXQ_STRICT", "1")
    for fmt, opts in OPERAND_FORMATS:
        op = mxq.fused_quant(format=fmt, **opts)(_mul_add)
        for kinds in OPERAND_KINDS:
            x, s, b = operand_inputs(kinds, 96, 512, dtype)
            xc = x.cuda()
            got = op(xc, s.cuda(), b.cuda(), out=poisoned(op, xc))
            assert compare(got, op.reference(x, s, b), True) == [], (fmt, opts, kinds)

