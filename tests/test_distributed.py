"""mxq/integrations/distributed.py on two CPU processes (gloo): DTensor inputs, eager and under
torch.compile (each rank quantizes its shard; the fields are DTensors whose shards are the
single-process result's) and all_gather of MXFP8Tensors (byte-equal to quantizing the gathered
tensor)."""

import os
import sys
import textwrap
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate, Partial, DTensor
import mxq
from mxq.testing import compare

rank, world = int(sys.argv[1]), 2
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))

@mxq.fused_quant(colwise=True, amax=True, dbias=True, act="gelu")
def resid(x, r, alpha: float = 0.5):
    return x * alpha + r

# got's data and scale fields are DTensors of want's shapes (None where want's are); this rank's
# shard of each is its part of the single-process result, compared as bits (FP8 bytes, FP8 block
# scaling's fp32 scales as int32: gloo cannot gather float8, so each rank checks its own)
def check_shards(name, placement, got, want):
    assert (got.format, got.block) == (want.format, want.block), name
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        g, w = getattr(got, f), getattr(want, f)
        assert (g is None) == (w is None), (name, f)
        if w is None:
            continue
        assert isinstance(g, DTensor) and g.shape == w.shape, (name, f, g.shape, w.shape)
        (p,) = g.placements
        bits = torch.int32 if w.dtype == torch.float32 else torch.uint8
        expect = w if isinstance(p, Replicate) else torch.chunk(w, world, dim=p.dim)[rank]
        assert torch.equal(g.to_local().contiguous().view(bits), expect.contiguous().view(bits)), (name, placement, f)

torch.manual_seed(0)
x = torch.randn(128, 256, dtype=torch.bfloat16)
r = torch.randn(128, 256, dtype=torch.bfloat16)
checked = 0
for placement in (Shard(0), Shard(1), Shard(-1), Replicate()):
    dx, dr = distribute_tensor(x, mesh, [placement]), distribute_tensor(r, mesh, [placement])
    for name, got, want in (("quantize", mxq.quantize(dx, rowwise=True, colwise=True, amax=True),
                             mxq.quantize(x, rowwise=True, colwise=True, amax=True)),
                            ("resid", resid(dx, dr, alpha=0.25), resid(x, r, alpha=0.25))):
        check_shards(name, placement, got, want)
        amax = got.amax
        assert isinstance(amax, DTensor) and torch.equal(amax.full_tensor(), want.amax), (name, placement)
        if got.dbias is not None:
            assert torch.allclose(got.dbias.full_tensor().float(), want.dbias.float(), rtol=2 ** -7, atol=1e-2), placement
        if isinstance(placement, Shard):
            assert got.rowwise_data.placements == (placement,) or got.rowwise_data.placements == (Shard(placement.dim % 2),)
        checked += 1
# N % 8 != 0: mxq's own outputs pad FP8 rows, but DTensor outputs hold contiguous shards (their
# global strides say so)
xo = torch.randn(64, 13, dtype=torch.bfloat16)
for placement in (Shard(0), Replicate()):
    got, want = mxq.quantize(distribute_tensor(xo, mesh, [placement]), rowwise=True, colwise=True), \
        mxq.quantize(xo, rowwise=True, colwise=True)
    assert want.rowwise_data.stride() == (16, 1)
    check_shards("odd", placement, got, want)
    for f in ("rowwise_data", "colwise_data"):
        g = getattr(got, f)
        assert g.stride() == (13, 1) and g.to_local().is_contiguous(), (placement, f, g.stride())
        g.to_local().view(-1)
    checked += 1
# gated ops: row splits and replicas (the halves lie along the columns, so column splits are refused)
def ident(x):
    return x

swiglu_f = mxq.fused_quant(act="swiglu", rowwise=True, colwise=True, amax=True)(ident)
swiglu_b = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(ident)
xg = torch.randn(128, 128, dtype=torch.bfloat16)
dg = torch.randn(128, 64, dtype=torch.bfloat16)
for placement in (Shard(0), Replicate()):
    dxg, ddg = distribute_tensor(xg, mesh, [placement]), distribute_tensor(dg, mesh, [placement])
    for name, got, want in (("swiglu", swiglu_f(dxg), swiglu_f(xg)),
                            ("dswiglu", swiglu_b(ddg, act_input=dxg), swiglu_b(dg, act_input=xg))):
        assert got.shape == want.shape, (name, got.shape)
        check_shards(name, placement, got, want)
        if got.dbias is not None:  # Partial("sum") of the ranks' bf16 dbias: their sum, rounded once more
            assert got.dbias.shape == (128,)
            parts = [swiglu_b(part_g, act_input=part_x).dbias.float() for part_g, part_x in
                     zip(torch.chunk(dg, world), torch.chunk(xg, world))] if isinstance(placement, Shard) else [want.dbias.float()]
            assert torch.allclose(got.dbias.full_tensor().float(), sum(parts), rtol=2 ** -7, atol=0), name
        checked += 1
try:
    swiglu_f(distribute_tensor(xg, mesh, [Shard(1)]))
except ValueError as exc:
    assert "placement Shard(1) splits the columns" in str(exc), exc
else:
    raise AssertionError("a column split of a gated op was accepted")
# a split that cuts a 32-row block (colwise) names the placement
bad = distribute_tensor(torch.randn(80, 64), mesh, [Shard(0)])
try:
    mxq.quantize(bad, colwise=True)
except ValueError as exc:
    assert "placement Shard(0) cuts a 32-element block" in str(exc), exc
else:
    raise AssertionError("a block-cutting shard was accepted")
mxq.quantize(bad, rowwise=True)  # rowwise blocks run along the unsplit columns: fine
uneven = distribute_tensor(torch.randn(3, 32, 64), mesh, [Shard(0)])  # 3 batches over 2 ranks
try:
    mxq.quantize(uneven, rowwise=True)
except ValueError as exc:
    assert "divide evenly" in str(exc), exc
else:
    raise AssertionError("an uneven 3-D row split was accepted")
from mxq import distributed as mxd
for bad_t, words in ((mxq.quantize(torch.randn(64)), "2 to 8 dimensions"),
                     (mxq.quantize(torch.randn(64, 32), colwise=True, group_offsets=torch.tensor([64])), "grouped"),
                     (mxq.quantize(torch.randn(64, 32, dtype=torch.bfloat16), format="nvfp4", colwise=True,
                                   hadamard=True), "no Hadamard-transformed colwise copy"),
                     (mxq.quantize(torch.randn(48, 32), format="mxfp4", colwise=True), "multiple of its blocks' rows"),
                     (mxq.quantize(torch.randn(64, 256), format="fp8_block", colwise=True), "128 for FP8 block"),
                     (mxq.quantize(torch.randn(64, 256), format="fp8_block", block=(128, 128)), "128 for FP8 block")):
    try:
        mxd.all_gather(bad_t)
    except ValueError as exc:
        assert words in str(exc), exc
    else:
        raise AssertionError(words)
# FP8 block scaling: shards cut on whole 128-element blocks; a 128x128 op's one tile grid split
# like the data
xb = torch.randn(256, 512, dtype=torch.bfloat16)
rb = torch.randn(256, 512, dtype=torch.bfloat16)
block_resid = mxq.fused_quant(format="fp8_block", colwise=True, amax=True, dbias=True, act="gelu")(resid.fn)
for placement in (Shard(0), Shard(-1), Replicate()):
    dxb, drb = distribute_tensor(xb, mesh, [placement]), distribute_tensor(rb, mesh, [placement])
    for name, opts in (("1x128 both", dict(format="fp8_block", colwise=True, amax=True)),
                       ("1x128 rowwise e5m2 fp32", dict(format="fp8_block", fp8="e5m2", scale_mode="fp32")),
                       ("128x128", dict(format="fp8_block", block=(128, 128), colwise=True))):
        check_shards(name, placement, mxq.quantize(dxb, **opts), mxq.quantize(xb, **opts))
        checked += 1
    got, want = block_resid(dxb, drb, alpha=0.25), block_resid(xb, rb, alpha=0.25)
    check_shards("block resid", placement, got, want)
    assert torch.equal(got.amax.full_tensor(), want.amax), placement
    assert torch.allclose(got.dbias.full_tensor().float(), want.dbias.float(), rtol=2 ** -7, atol=1e-2), placement
    checked += 1
got = mxq.quantize(distribute_tensor(xb, mesh, [Replicate()]), format="fp8_block", colwise=True, scale_layout="gemm")
check_shards("replicated gemm", Replicate(), got,
                   mxq.quantize(xb, format="fp8_block", colwise=True, scale_layout="gemm"))
for t, placement, opts, words in (
        (torch.randn(320, 512), Shard(0), dict(colwise=True), "cuts a 128-element block: each rank holds 160 rows"),
        (torch.randn(320, 512), Shard(0), dict(block=(128, 128)), "for 128x128 blocks"),
        (torch.randn(64, 384), Shard(-1), dict(), "cuts a 128-element block: each rank holds 192 columns"),
        (torch.randn(256, 512), Shard(0), dict(scale_layout="gemm"), "needs scale_layout='compact'"),
        (torch.randn(64, 32), Replicate(), dict(format="nvfp4", stochastic_rounding=True),
         "stochastic_rounding=True are not supported"),
        (torch.randn(64, 32, dtype=torch.bfloat16), Shard(0), dict(format="nvfp4", colwise=True, hadamard=True),
         "hadamard=True are not supported"),
        (torch.randn(48, 64), Shard(0), dict(format="nvfp4", colwise=True), "cuts a 16-element block: each rank holds 24"),
        (torch.randn(32, 96), Shard(-1), dict(format="mxfp4"), "cuts a 32-element block: each rank holds 48 columns"),
        (torch.randn(48, 64), Shard(0), dict(format="nvfp4", block_2d=True), "for 16x16 blocks"),
        (torch.randn(64, 64), Shard(0), dict(format="mxfp4", colwise=True, scale_layout="swizzled"),
         "needs scale_layout='compact'")):
    try:
        mxq.quantize(distribute_tensor(t, mesh, [placement]), **{"format": "fp8_block", **opts})
    except ValueError as exc:
        assert words in str(exc), (words, exc)
    else:
        raise AssertionError(f"a DTensor call was accepted: {opts}, {placement}")
mxq.quantize(distribute_tensor(torch.randn(320, 512), mesh, [Shard(0)]), format="fp8_block")  # rowwise: rows free
# NVFP4 and MXFP4: packed data and the transposed copy split along the input's split dim; NVFP4's
# amax the whole tensor's (an all-reduce between two quantizes of each shard, or global_amax=)
def check_fp4(name, placement, got, want):
    check_shards(name, placement, got, want)
    if want.amax is not None:
        assert isinstance(got.amax, DTensor) and torch.equal(got.amax.full_tensor(), want.amax), (name, placement)
    if isinstance(placement, Shard) and want.colwise_data is not None:
        assert got.colwise_data.placements == (Shard(1 - placement.dim % 2),), (name, placement)


xf = torch.randn(128, 256, dtype=torch.bfloat16) * torch.linspace(0.1, 8.0, 128)[:, None].to(torch.bfloat16)
rf = torch.randn(128, 256, dtype=torch.bfloat16)
fp4_resid = mxq.fused_quant(format="nvfp4", colwise=True, act="gelu")(resid.fn)
for placement in (Shard(0), Shard(-1), Replicate()):
    dxf, drf = distribute_tensor(xf, mesh, [placement]), distribute_tensor(rf, mesh, [placement])
    for name, opts in (("nvfp4 both", dict(format="nvfp4", colwise=True)),
                       ("nvfp4 16x16", dict(format="nvfp4", colwise=True, block_2d=True)),
                       ("mxfp4 both rceil", dict(format="mxfp4", colwise=True, scale_mode="rceil", amax=True)),
                       ("mxfp4 rowwise", dict(format="mxfp4"))):
        check_fp4(name, placement, mxq.quantize(dxf, **opts), mxq.quantize(xf, **opts))
        checked += 1
    ga = torch.tensor([5.0])
    check_fp4("nvfp4 given amax", placement, mxq.quantize(dxf, format="nvfp4", colwise=True, global_amax=ga),
              mxq.quantize(xf, format="nvfp4", colwise=True, global_amax=ga))
    check_fp4("nvfp4 resid", placement, fp4_resid(dxf, drf, alpha=0.25), fp4_resid(xf, rf, alpha=0.25))
    checked += 2
try:  # (the all-reduce of an NVFP4 split is eager: refused by name while tracing)
    torch.compile(lambda t: mxq.quantize(t, format="nvfp4"), backend="aot_eager", fullgraph=True)(
        distribute_tensor(xf, mesh, [Shard(0)]))
except Exception as exc:
    assert "global_amax" in str(exc), exc
else:
    raise AssertionError("an NVFP4 split without global_amax was traced")
got = torch.compile(lambda t, a: mxq.quantize(t, format="nvfp4", colwise=True, global_amax=a), backend="aot_eager",
                    fullgraph=True)(distribute_tensor(xf, mesh, [Shard(0)]), torch.tensor([5.0]))
check_fp4("compiled nvfp4 given amax", Shard(0), got, mxq.quantize(xf, format="nvfp4", colwise=True,
                                                                    global_amax=torch.tensor([5.0])))
checked += 1
# row groups (group_offsets) with column splits and replicas: every rank holds every row
offs = torch.tensor([20, 64, 128])
for placement in (Shard(-1), Replicate()):
    dx, dr = distribute_tensor(x, mesh, [placement]), distribute_tensor(r, mesh, [placement])
    for name, got, want in (("grouped quantize", mxq.quantize(dx, rowwise=True, colwise=True, group_offsets=offs),
                             mxq.quantize(x, rowwise=True, colwise=True, group_offsets=offs)),
                            ("grouped resid", resid(dx, dr, alpha=0.25, group_offsets=offs),
                             resid(x, r, alpha=0.25, group_offsets=offs)),
                            # (FP8 block scaling's 128x128 tiles, grouped: a grid of M // 128 + G rows)
                            ("grouped 128x128", mxq.quantize(dx, format="fp8_block", block=(128, 128), colwise=True,
                                                             group_offsets=offs),
                             mxq.quantize(x, format="fp8_block", block=(128, 128), colwise=True, group_offsets=offs))):
        check_shards(name, placement, got, want)
        split = isinstance(placement, Shard)
        for f in ("rowwise_scale", "colwise_scale"):
            if getattr(got, f) is not None:  # (the grouped colwise buffer [M // 32 + G, N], split by columns)
                assert getattr(got, f).placements == ((Shard(1),) if split else (Replicate(),)), (name, f)
        assert torch.equal(got.group_offsets, offs)
        if got.dbias is not None:  # [G, N], split by columns
            assert got.dbias.shape == (3, 256) and got.dbias.placements == ((Shard(1),) if split else (Replicate(),))
            assert torch.equal(got.dbias.full_tensor(), want.dbias), placement
        checked += 1
for go in (offs, None):  # replicas in the swizzled layout: the global shapes are the local ones
    got = mxq.quantize(distribute_tensor(x[:100], mesh, [Replicate()]), rowwise=True, colwise=True,
                       scale_layout="swizzled", group_offsets=go if go is None else torch.tensor([20, 64, 100]))
    want = mxq.quantize(x[:100], rowwise=True, colwise=True, scale_layout="swizzled",
                        group_offsets=go if go is None else torch.tensor([20, 64, 100]))
    for f in ("rowwise_scale", "colwise_scale"):
        assert getattr(got, f).shape == getattr(want, f).shape, (f, getattr(got, f).shape)
        assert torch.equal(getattr(got, f).to_local(), getattr(want, f)), f
try:
    mxq.quantize(distribute_tensor(x, mesh, [Shard(0)]), colwise=True, group_offsets=offs)
except ValueError as exc:
    assert "group_offsets with placement Shard(0)" in str(exc), exc
else:
    raise AssertionError("group_offsets with a row split were accepted")
for placement in (Shard(0), Shard(-1)):  # a gated op: halves along the columns, groups along the rows
    try:
        swiglu_f(distribute_tensor(xg, mesh, [placement]), group_offsets=offs)
    except ValueError as exc:
        assert "takes Replicate() inputs only" in str(exc), exc
    else:
        raise AssertionError(f"a gated op with group_offsets took {placement}")
got = swiglu_f(distribute_tensor(xg, mesh, [Replicate()]), group_offsets=offs)
check_shards("grouped swiglu", Replicate(), got, swiglu_f(xg, group_offsets=offs))
# torch.compile: the same calls traced with no graph break (one operator node on the local
# shards, DTensors around it), byte-equal to the single-process result like the eager calls
for backend in ("aot_eager", "inductor"):
    torch._dynamo.reset()
    for placement in ((Shard(0), Shard(-1), Replicate()) if backend == "aot_eager" else (Shard(0),)):
        dx, dr = distribute_tensor(x, mesh, [placement]), distribute_tensor(r, mesh, [placement])
        got = torch.compile(lambda a, b: resid(a, b, alpha=0.25), backend=backend, fullgraph=True)(dx, dr)
        want = resid(x, r, alpha=0.25)
        check_shards("compiled resid", placement, got, want)
        eager = resid(dx, dr, alpha=0.25)
        for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "dbias"):
            if getattr(eager, f) is not None:
                assert getattr(got, f).placements == getattr(eager, f).placements, (placement, f)
        assert torch.equal(got.amax.full_tensor(), want.amax) and got.amax.placements == resid(dx, dr, alpha=0.25).amax.placements
        assert torch.allclose(got.dbias.full_tensor().float(), want.dbias.float(), rtol=2 ** -7, atol=1e-2), placement
        checked += 1
    got = torch.compile(lambda t: mxq.quantize(t, rowwise=True, colwise=True), backend=backend, fullgraph=True)(
        distribute_tensor(xo, mesh, [Shard(0)]))
    check_shards("compiled odd", Shard(0), got, mxq.quantize(xo, rowwise=True, colwise=True))
    assert got.rowwise_data.stride() == (13, 1) and got.rowwise_data.to_local().is_contiguous()
    assert got.rowwise_data.placements == (Shard(0),) and got.rowwise_scale.placements == (Shard(0),)
    got = torch.compile(lambda t: swiglu_f(t), backend=backend, fullgraph=True)(distribute_tensor(xg, mesh, [Shard(0)]))
    check_shards("compiled swiglu", Shard(0), got, swiglu_f(xg))
    assert got.rowwise_data.placements == (Shard(0),) and got.amax.placements == (Partial("max"),)
    checked += 2
from torch._dynamo.testing import CompileCounterWithBackend

counter = CompileCounterWithBackend("aot_eager")
fd = torch.compile(lambda t: mxq.quantize(t, rowwise=True, colwise=True), backend=counter, fullgraph=True,
                   dynamic=True)
for m, n in ((128, 256), (192, 320)):  # dynamic shapes: one graph, two shapes
    xs = torch.randn(m, n, dtype=torch.bfloat16)
    got = fd(distribute_tensor(xs, mesh, [Shard(0)]))
    check_shards("compiled dynamic", Shard(0), got, mxq.quantize(xs, rowwise=True, colwise=True))
    assert got.rowwise_data.placements == (Shard(0),) and got.colwise_scale.placements == (Shard(0),)
    checked += 1
assert counter.frame_count == 1, counter.frame_count
fg = torch.compile(lambda t, o: mxq.quantize(t, rowwise=True, colwise=True, group_offsets=o), backend="aot_eager",
                   fullgraph=True)
got = fg(distribute_tensor(x, mesh, [Shard(-1)]), offs)
check_shards("compiled grouped", Shard(-1), got, mxq.quantize(x, rowwise=True, colwise=True, group_offsets=offs))
assert got.colwise_scale.placements == (Shard(1),) and torch.equal(got.group_offsets, offs)
checked += 1
# two quantize option sets in one compiled function (each finds its op while the trace runs)
opts_a, opts_b = dict(colwise=True, amax=True), dict(colwise=True, fp8="e5m2", scale_mode="floor")
two = torch.compile(lambda t: (mxq.quantize(t, **opts_a), mxq.quantize(t, **opts_b)), backend="aot_eager",
                    fullgraph=True)
got_a, got_b = two(distribute_tensor(x, mesh, [Shard(0)]))
check_shards("compiled pair a", Shard(0), got_a, mxq.quantize(x, **opts_a))
check_shards("compiled pair b", Shard(0), got_b, mxq.quantize(x, **opts_b))
checked += 2
try:  # (refused while tracing; fullgraph wraps the ValueError in dynamo's error, as without DTensors)
    torch.compile(lambda t: mxq.quantize(t, colwise=True), backend="aot_eager", fullgraph=True)(bad)
except Exception as exc:
    assert "placement Shard(0) cuts a 32-element block" in str(exc), exc
else:
    raise AssertionError("a block-cutting shard was accepted under torch.compile")
# DTensor group offsets with plain inputs: refused by name, eager and traced alike
for call in (lambda o: mxq.quantize(x, colwise=True, group_offsets=o),
             lambda o: resid(x, r, alpha=0.25, group_offsets=o),
             lambda o: mxq.quantize(x, colwise=True, group_offsets=o, out=mxq.quantize(x, colwise=True)),
             torch.compile(lambda o: mxq.quantize(x, colwise=True, group_offsets=o), backend="aot_eager",
                           fullgraph=True),
             torch.compile(lambda o: resid(x, r, alpha=0.25, group_offsets=o), backend="aot_eager", fullgraph=True)):
    try:
        call(distribute_tensor(offs, mesh, [Replicate()]))
    except Exception as exc:
        assert "argument 'group_offsets' is a DTensor but the inputs are plain tensors" in str(exc), exc
    else:
        raise AssertionError("DTensor group_offsets with plain inputs were accepted")
# uneven shards (DTensor.from_local with a shape of its own) are refused by name, not placed by the even split
local = torch.randn(40, 64)[:40 if rank == 0 else 24]  # (the same draws on both ranks: later tensors agree)
uneven = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size((64, 64)), stride=(64, 1))
try:
    mxq.quantize(uneven, colwise=True)
except ValueError as exc:
    assert "uneven shards" in str(exc) and f"holds {local.shape[0]} of the 64 rows" in str(exc), exc
else:
    raise AssertionError("uneven from_local shards were accepted")
# all_gather: each rank quantizes its own rows; the gathered tensor is the full tensor's quantization
from mxq import distributed
full = torch.randn(2, 64, 96, dtype=torch.bfloat16)
mine = full[rank:rank + 1]
for opts in (dict(rowwise=True, colwise=True, amax=True), dict(rowwise=False, colwise=True, fp8="e5m2")):
    g = distributed.all_gather(mxq.quantize(mine, **opts))
    w = mxq.quantize(full, **opts)
    assert g.shape == w.shape
    assert compare(g, w, exact=True) == [], (opts, compare(g, w, exact=True))
try:
    distributed.all_gather(mxq.quantize(torch.randn(40, 64), colwise=True))
except ValueError as exc:
    assert "multiple of its blocks' rows" in str(exc) and "32 for MXFP8" in str(exc), exc
else:
    raise AssertionError("a 40-row colwise gather was accepted")
# FP8 block scaling; NVFP4 and MXFP4 (the transposed colwise copies side by side; NVFP4's shards
# under one amax)
fullb = torch.randn(2, 128, 384, dtype=torch.bfloat16)
fullf = torch.randn(2, 64, 96, dtype=torch.bfloat16)
for full, opts in ((fullb, dict(format="fp8_block", colwise=True, amax=True)),
                   (fullb, dict(format="fp8_block", block=(128, 128))),
                   (fullb, dict(format="fp8_block", fp8="e5m2", scale_mode="fp32")),
                   (fullf, dict(format="mxfp4", colwise=True, scale_mode="rceil")),
                   (fullf, dict(format="nvfp4", colwise=True, global_amax=torch.tensor([4.0]))),
                   (fullf, dict(format="nvfp4", block_2d=True, colwise=True, global_amax=2.5))):
    g = distributed.all_gather(mxq.quantize(full[rank:rank + 1], **opts))
    w = mxq.quantize(full, **opts)
    assert g.shape == w.shape and (g.format, g.block) == (w.format, w.block), opts
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax"):
        a, b = getattr(g, f), getattr(w, f)
        assert (a is None) == (b is None), (opts, f)
        if a is not None:
            bits = torch.int32 if b.dtype == torch.float32 else torch.uint8
            assert a.shape == b.shape and torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)), (opts, f)
    checked += 1
# fields whose byte counts leave the next one at an offset its dtype cannot start at (3 rows of
# 64 FP8 bytes then the fp32 amax; 130 columns of FP8 block scaling): gathered byte-equal
for full, opts in ((torch.randn(6, 64), dict(amax=True)), (torch.randn(2, 130), dict(format="fp8_block")),
                   (torch.randn(6, 64), dict(colwise=False, fp8="e5m2", amax=True, scale_mode="floor"))):
    m = full.shape[0] // 2
    g = distributed.all_gather(mxq.quantize(full[rank * m:(rank + 1) * m], **opts))
    w = mxq.quantize(full, **opts)
    assert compare(g, w, exact=True) == [], (opts, compare(g, w, exact=True))
    checked += 1
a = mxq.quantize(torch.randn(128, 256), format="fp8_block") if rank == 0 else mxq.quantize(torch.randn(128, 256))
try:  # the ranks disagree on the format: every rank raises the same error
    distributed.all_gather(a)
except ValueError as exc:
    assert "differs from rank 0's" in str(exc), exc
else:
    raise AssertionError("a gather of mixed formats was accepted")
# refusals judged from global shapes, so that every rank raises (one rank raising while another
# waits in the NVFP4 amax's all_reduce hung): FP4 shards of an odd column count, an operand split
# along a dimension it broadcasts
for fmt in ("nvfp4", "mxfp4"):
    try:
        mxq.quantize(distribute_tensor(torch.randn(32, 14), mesh, [Shard(-1)]), format=fmt, rowwise=False,
                     colwise=True)
    except ValueError as exc:
        assert "leaves a rank 7 columns" in str(exc) and "two to a byte" in str(exc), exc
    else:
        raise AssertionError(f"{fmt}: odd column shards were accepted")

@mxq.fused_quant()
def col_scaled(x, s):
    return x * s

xs, s = torch.randn(64, 64), torch.rand(64, 1)
try:
    col_scaled(distribute_tensor(xs, mesh, [Shard(-1)]), distribute_tensor(s, mesh, [Shard(-1)]))
except ValueError as exc:
    assert "argument 's' of shape (64, 1) is split along a dimension it broadcasts" in str(exc), exc
else:
    raise AssertionError("an operand split along its broadcast dimension was accepted")

@mxq.fused_quant()
def plus_bias(x, b):
    return x + b

# dequantize() of a DTensor result: the values of the whole result's, a DTensor (MXFP8's scale bytes
# decoded rank by rank: a shift of a DTensor's bytes is no shift in torch, and it gave 1e-41s)
for placement in (Shard(0), Shard(-1), Replicate()):
    both = mxq.quantize(distribute_tensor(xs, mesh, [placement]), rowwise=True, colwise=True)
    whole = mxq.quantize(xs, rowwise=True, colwise=True)
    for d in ("rowwise", "colwise"):
        values = both.dequantize(d)
        assert isinstance(values, DTensor) and torch.equal(values.full_tensor(), whole.dequantize(d)), (placement, d)
# FP4: rank by rank too (the local input's shape from the packed data [..., N/2], or from the
# transposed copy [N, M/2] where there is no rowwise data), NVFP4 under the whole tensor's amax
x3 = torch.randn(4, 16, 64)
for fmt, shape in (("nvfp4", (64, 64)), ("mxfp4", (64, 64)), ("nvfp4", (4, 16, 64))):
    xf = xs if len(shape) == 2 else x3
    for placement in (Shard(0), Shard(-1), Replicate()):
        for opts in (dict(colwise=True), dict(rowwise=False, colwise=True)):
            got = mxq.quantize(distribute_tensor(xf, mesh, [placement]), format=fmt, **opts)
            whole = mxq.quantize(xf, format=fmt, **opts)
            for d in ("rowwise", "colwise") if opts.get("rowwise", True) else ("colwise",):
                values = got.dequantize(d)
                assert isinstance(values, DTensor) and values.shape == xf.shape, (fmt, placement, d)
                assert torch.equal(values.full_tensor(), whole.dequantize(d)), (fmt, shape, placement, opts, d)

# FP4 of 3-D and 1-D inputs: the packed rowwise data keeps the input's leading dims ([..., N/2]), as the
# whole tensor's does (its DTensor said [M, N/2], and full_tensor() failed)
for shape, placement in (((4, 64, 64), Shard(0)), ((4, 64, 64), Shard(-1)), ((128,), Shard(0))):
    x3 = torch.randn(*shape)
    for fmt in ("nvfp4", "mxfp4"):
        got, want = mxq.quantize(distribute_tensor(x3, mesh, [placement]), format=fmt), mxq.quantize(x3, format=fmt)
        assert got.rowwise_data.shape == want.rowwise_data.shape, (fmt, shape, got.rowwise_data.shape)
        assert torch.equal(got.rowwise_data.full_tensor(), want.rowwise_data), (fmt, shape, placement)

# a bad split under torch.compile with dynamic shapes: dynamo's error carries mxq's message (the message
# formatted symbolic sizes and Shard's dim, which dynamo could not: "BUILD_STRING type error")
try:
    torch.compile(lambda t: mxq.quantize(t, format="fp8_block"), backend="aot_eager", fullgraph=True, dynamic=True)(
        distribute_tensor(torch.randn(256, 384), mesh, [Shard(-1)]))
except Exception as exc:
    assert "placement Shard(1) cuts a 128-element block: each rank holds 192 columns" in str(exc), str(exc)[:2000]
else:
    raise AssertionError("a split cutting 1x128 blocks was accepted under torch.compile")

b = torch.randn(64)  # (a bias [N] split by Shard(0) splits the columns, as Shard(-1) of x does)
got = plus_bias(distribute_tensor(xs, mesh, [Shard(-1)]), distribute_tensor(b, mesh, [Shard(0)]))
check_shards("bias", Shard(-1), got, plus_bias(xs, b))
checked += 1
print(f"rank {rank}: {checked} DTensor calls matched; all_gather byte-equal", flush=True)
dist.barrier()  # neither rank tears its connections down while the other still uses them
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # no interpreter shutdown: see examples/fsdp2_mxfp8.py, worker()
"""


def run_two_ranks(worker: str, tmp_path, done: str, ranks: int = 2) -> None:
    """Run ``worker`` (a script taking its rank as argv[1]) as two gloo processes (``ranks``); each
    must exit 0 and print ``done``. They meet through a file in ``tmp_path`` (``MXQ_TEST_INIT``), not a TCP
    port: a free port picked here could be taken by another process before rank 0 binds it."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo backend")
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(worker))
    env = dict(os.environ, MXQ_TEST_INIT=f"file://{tmp_path / 'rendezvous'}", PYTHONWARNINGS="ignore",
               MXQ_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, str(script), str(rank)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for rank in range(ranks)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    except subprocess.TimeoutExpired:  # (a hang fails the test instead of stalling the suite)
        for p in procs:
            p.kill()
        raise
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err[-4000:]
        assert done in out


def test_dtensor_shards_quantize_like_the_full_tensor(tmp_path):
    pytest.importorskip("torch.distributed.tensor")
    run_two_ranks(WORKER, tmp_path, "DTensor calls matched")


ONE_BLOCK = r"""
import os, sys, torch, torch.distributed as dist
import mxq
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, Replicate

dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
torch.manual_seed(0)
# a split dim that holds one block of scales (a mesh dim of size 1, a small tensor): each rank
# decodes its own fields (decoding the DTensors themselves raised inside torch)
cases = [((16, 20), Shard(1), {}), ((16, 20), Shard(0), dict(colwise=True)),
         ((64, 96), Shard(1), dict(format="fp8_block")), ((128, 256), Shard(0), dict(format="fp8_block", colwise=True)),
         ((128, 256), Shard(1), dict(format="fp8_block", block=(128, 128), colwise=True)),
         ((2, 8, 20), Shard(0), dict(colwise=True)), ((40, 20), Replicate(), dict(colwise=True)),
         # (a replicated GEMM-ready transposed copy alone: the local input is the whole one, not the copy's shape)
         ((256, 128), Replicate(), dict(format="fp8_block", scale_layout="gemm", rowwise=False, colwise=True)),
         ((2, 64, 128), Replicate(), dict(format="fp8_block", scale_layout="gemm", rowwise=False, colwise=True))]
for shape, placement, opts in cases:
    x = torch.randn(*shape)
    got = mxq.quantize(DTensor.from_local(x, mesh, [placement]), **opts)
    want = mxq.quantize(x, **opts)
    for d in ("rowwise", "colwise")[0 if opts.get("rowwise", True) else 1:2 if opts.get("colwise") else 1]:
        back = got.dequantize(d)
        assert isinstance(back, DTensor) and back.shape == x.shape and back.placements == (placement,), (shape, d)
        assert torch.equal(back.to_local().nan_to_num(7), want.dequantize(d).nan_to_num(7)), (shape, placement, d)
print("one-block shards decoded")
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_dequantize_of_a_split_dim_of_one_block(tmp_path):
    pytest.importorskip("torch.distributed.tensor")
    run_two_ranks(ONE_BLOCK, tmp_path, "one-block shards decoded", ranks=1)


DISAGREE = r"""
import os, sys, datetime, torch, torch.distributed as dist
import mxq
from mxq import distributed

rank = int(sys.argv[1])
# a short timeout: a rank left waiting in a collective fails the test in seconds, not minutes
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
mesh = init_device_mesh("cpu", (2,))
x = torch.randn(64, 64)


def lambda_free_ident(x):  # (an epilogue: a file's function)
    return x


def drop(t, fields, rank):  # (t with fields set to None on rank 1)
    for f in ((fields,) if isinstance(fields, str) else fields) if rank == 1 else ():
        setattr(t, f, None)
    return t


cases = [  # (this rank's tensor, the exception both ranks must raise, words in its message)
    (mxq.quantize(x, colwise=True, fp8="e5m2" if rank else "e4m3"), ValueError, "rank 1's fp8 format differs"),
    (mxq.quantize(x, rowwise=not rank, colwise=bool(rank)), ValueError, "rank 1's rowwise direction differs"),
    (mxq.quantize(x.reshape((1, 64, 64) if rank else (64, 64)), colwise=True), ValueError,
     "rank 1's number of dimensions differs"),
    (mxq.quantize(torch.randn(64, 96 if rank else 64), colwise=True), ValueError, "rank 1's shape differs"),
    (mxq.quantize(x, colwise=True, amax=bool(rank)), ValueError, "rank 1's amax differs"),
    (mxq.fused_quant(dact="gelu", dbias=True)(lambda_free_ident)(x, act_input=x) if rank else mxq.quantize(x),
     ValueError, "rank 1's dbias (its presence or dtype) differs"),
    (mxq.quantize(x, colwise=True, scale_mode="floor" if rank else "rceil"), ValueError, "rank 1's scale mode differs"),
    (mxq.quantize(torch.randn(40 if rank else 64, 64), colwise=True), ValueError,
     "multiple of its blocks' rows when it has blocks spanning rows (32 for MXFP8's and MXFP4's colwise blocks, "
     "128 for FP8 block scaling's colwise blocks and 128x128 tiles, 16 for NVFP4's colwise blocks and 16x16 "
     "tiles) on every rank; rank 1 has not"),
    (mxq.quantize(x, format="fp8_block") if rank else mxq.quantize(x), ValueError, "rank 1's format differs"),
    (mxq.quantize(torch.randn(128, 128), format="fp8_block", block=(128, 128) if rank else (1, 128)), ValueError,
     "rank 1's block differs"),
    (mxq.quantize(x, colwise=True, scale_layout="swizzled") if rank == 0 else mxq.quantize(x, colwise=True),
     ValueError, "compact scales (swizzled tiles span 128 rows) on every rank; rank 0 has not"),
    (mxq.quantize(x * (rank + 1), format="nvfp4", colwise=True), ValueError, "rank 1's NVFP4 amax differs"),
    (x if rank else mxq.quantize(x, colwise=True), TypeError, "needs an MXFP8Tensor on every rank; rank 1 has not"),
    # one rank's fields not a quantize call's (an NVFP4 amax, a direction's data, every field dropped):
    # both raise, the other is not left waiting
    (drop(mxq.quantize(x, format="nvfp4", colwise=True), "amax", rank), ValueError,
     "whose fields are a quantize call's (data, each direction with its scales, and NVFP4's amax; tensors of "
     "the format's dtypes, one amax value) on every rank; rank 1 has not"),
    (drop(mxq.quantize(x, colwise=True), "rowwise_data", rank), ValueError, "fields are a quantize call's"),
    (drop(mxq.quantize(x), ("rowwise_data", "rowwise_scale"), rank), ValueError, "fields are a quantize call's"),
    # one rank's result of a DTensor call (DTensor fields): both raise, the other is not left waiting
    (mxq.quantize(DTensor.from_local(x, mesh, [Replicate()])) if rank == 0 else mxq.quantize(x), TypeError,
     "needs an MXFP8Tensor of plain tensors (a DTensor call's result is already distributed"),
]
for i, (t, kind, words) in enumerate(cases):
    try:
        distributed.all_gather(t)
    except kind as exc:
        assert words in str(exc), (i, str(exc))
    else:
        raise AssertionError(f"case {i}: no error on rank {rank}")
g = distributed.all_gather(mxq.quantize(x, colwise=True, scale_mode="floor"))  # the group still works
assert g.shape == (128, 64) and g.scale_mode == "floor"
print(f"rank {rank}: disagreements refused", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_all_gather_refuses_ranks_that_disagree_on_every_rank(tmp_path):
    """Every rank checks its own tensor, then the ranks compare one fixed-width record: a rank that
    fails a check, or ranks whose format, directions, optional fields, rank or shape differ, make
    every rank raise the same error (no rank left waiting, no mix gathered under one label)."""
    run_two_ranks(DISAGREE, tmp_path, "disagreements refused")


FUZZ_RANKS = r"""
import os, sys, random, datetime, torch, torch.distributed as dist
import mxq
from mxq import distributed
from mxq.testing import compare

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
rng = random.Random(int(os.environ.get("MXQ_FUZZ_SEED", "20261130")))  # (the same draws on both ranks)
refused = gathered = 0
for case in range(40):
    opts = dict(fp8=rng.choice(["e4m3", "e5m2"]), rowwise=rng.random() < 0.7, colwise=rng.random() < 0.7,
                amax=rng.random() < 0.5, scale_mode=rng.choice(["rceil", "floor"]))
    opts["rowwise"] = opts["rowwise"] or not opts["colwise"]
    shape = rng.choice([(64, 32), (32, 96), (2, 32, 64)])
    torch.manual_seed(case)  # (the same values on both ranks)
    full = torch.randn((2 * shape[0],) + shape[1:])
    what = rng.choice([None, None, "fp8", "rowwise", "colwise", "amax", "rows", "cols", "rank", "layout", "mode"])
    # rank 1's tensor, drawn on both ranks so that both know whether the ranks differ
    opts1, part1 = dict(opts), full[shape[0]:]
    if what in ("fp8", "rowwise", "colwise", "amax"):
        opts1[what] = {"fp8": "e5m2" if opts["fp8"] == "e4m3" else "e4m3"}.get(what, not opts.get(what))
        if not (opts1["rowwise"] or opts1["colwise"]):
            opts1["rowwise" if what == "colwise" else "colwise"] = True
    if what == "rows":
        part1 = torch.randn((part1.shape[0] * 2,) + part1.shape[1:])
    if what == "cols":
        part1 = torch.randn(part1.shape[:-1] + (part1.shape[-1] + 32,))
    if what == "rank":
        part1 = part1.reshape((1,) + tuple(part1.shape))
    if what == "layout":
        opts1["scale_layout"] = "swizzled"
    if what == "mode":
        opts1["scale_mode"] = "floor" if opts["scale_mode"] == "rceil" else "rceil"
    differs = opts1 != opts or part1.shape != full[shape[0]:].shape
    mine_opts, mine = (opts1, part1) if rank else (opts, full[:shape[0]])
    try:
        g = distributed.all_gather(mxq.quantize(mine, **mine_opts))
    except ValueError as exc:
        assert differs, (case, what, str(exc))
        refused += 1
        continue
    assert not differs, (case, what, "gathered ranks that disagree")
    want = mxq.quantize(full, **opts)
    assert g.shape == want.shape and compare(g, want, exact=True) == [], (case, compare(g, want, exact=True))
    gathered += 1
assert refused and gathered, (refused, gathered)
print(f"rank {rank}: fuzzed ranks {refused} refused {gathered} gathered", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_fuzz_ranks_that_disagree(tmp_path):
    """Random options and shapes on two ranks, rank 1 sometimes differing in one way: all_gather
    raises on both ranks exactly when they differ, and otherwise equals quantizing the whole."""
    run_two_ranks(FUZZ_RANKS, tmp_path, "fuzzed ranks")


def test_all_gather_names_a_group_that_is_not_one():
    """all_gather's ``group`` must be a ProcessGroup or None: anything else is refused by name
    before any collective (it raised AttributeError from inside torch)."""
    import torch

    import mxq
    from mxq import distributed

    t = mxq.quantize(torch.randn(64, 64), colwise=True)
    for bad in ("abc", 0, object()):
        with pytest.raises(TypeError, match="all_gather\\(\\) group must be a torch.distributed ProcessGroup"):
            distributed.all_gather(t, group=bad)
    import torch.distributed as dist

    # (the marker torch's new_group gives the ranks outside the group: this rank is not in it)
    with pytest.raises(ValueError, match="'group' is one this rank is not a member of"):
        distributed.all_gather(t, group=dist.GroupMember.NON_GROUP_MEMBER)


REPLICATED = r"""
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Replicate, DTensor
import mxq

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=2)
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
x = torch.randn(64, 64)
offs = torch.tensor([32, 32, 64])
got = mxq.quantize(distribute_tensor(x, mesh, [Replicate()]), colwise=True, scale_layout="swizzled",
                   group_offsets=offs)
want = mxq.quantize(x, colwise=True, scale_layout="swizzled", group_offsets=offs)
for g in range(3):  # (group 1 is empty)
    part, alone = got.group(g), want.group(g)
    assert part.shape == alone.shape, g
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
        a, b = getattr(part, f), getattr(alone, f)
        a = a.to_local() if isinstance(a, DTensor) else a
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (g, f)
back = got.dequantize()
assert torch.equal(back.to_local() if isinstance(back, DTensor) else back, want.dequantize())
for fmt in ("fp8_block", "mxfp8"):  # (an empty group's fp8_block colwise blocks spun in DTensor's view)
    xb, ends = torch.randn(160, 128, dtype=torch.bfloat16), torch.tensor([0, 160, 160])
    got = mxq.quantize(distribute_tensor(xb, mesh, [Replicate()]), format=fmt, colwise=True, group_offsets=ends)
    want = mxq.quantize(xb, format=fmt, colwise=True, group_offsets=ends)
    for d in ("rowwise", "colwise"):
        back = got.dequantize(d)
        assert isinstance(back, DTensor), (fmt, d)
        assert torch.equal(back.to_local().nan_to_num(7), want.dequantize(d).nan_to_num(7)), (fmt, d)
empty = mxq.quantize(distribute_tensor(torch.randn(0, 64), mesh, [Replicate()]), scale_layout="swizzled")
back = empty.dequantize()
assert back.shape == (0, 64), back.shape
print(f"rank {rank}: replicated swizzled groups", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


AGREE = r"""
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
import mxq

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=2)
mesh = init_device_mesh("cpu", (2,))

@mxq.fused_quant(format="nvfp4")
def nv_add(x, r):
    return x + r

# rank 0 holds 3 rows, rank 1 two: the plain operand fits rank 0's shard alone. Rank 1 refuses its shard
# in NVFP4's first pass; rank 0 waited for it in the amax all-reduce (forever): both raise now
x, r = torch.randn(5, 64), torch.randn(3, 64)
try:
    nv_add(distribute_tensor(x, mesh, [Shard(0)]), r)
except ValueError as exc:
    assert ("another rank refused" in str(exc)) == (rank == 0), (rank, exc)
else:
    raise AssertionError(f"rank {rank} returned")
# an input of an unserved dtype is named as x (it was MXFP8Tensor.empty's 'dtype')
for fmt in ("mxfp8", "nvfp4"):
    try:
        mxq.quantize(distribute_tensor(torch.ones(64, 64, dtype=torch.float64), mesh, [Shard(0)]), format=fmt)
    except TypeError as exc:
        assert "argument 'x' must be float32, float16 or bfloat16, got torch.float64" in str(exc), exc
    else:
        raise AssertionError(fmt)
print(f"rank {rank}: ranks agree", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_ranks_refuse_together_and_name_the_input(tmp_path):
    """A refusal one rank alone meets in NVFP4's first pass reaches every rank (no rank waits in the
    amax all-reduce); a bad input dtype is named as the input."""
    pytest.importorskip("torch.distributed.tensor")
    run_two_ranks(AGREE, tmp_path, "ranks agree")


def test_replicated_results_with_swizzled_scales_give_their_groups(tmp_path):
    """A DTensor call replicated on every rank takes swizzled scales; its empty group and a call
    of zero rows decode (their buffers' layout converted on each rank's whole local copy:
    tensor.replicated_local; DTensor.view of a zero-size tensor never returned), each group
    byte-equal to the plain tensor's."""
    pytest.importorskip("torch.distributed.tensor")
    run_two_ranks(REPLICATED, tmp_path, "replicated swizzled groups")


REFUSALS = r"""
import os, sys, datetime, torch, torch.distributed as dist
import mxq
from mxq import distributed
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, Replicate, distribute_tensor

rank = int(sys.argv[1])
# a short timeout: a rank left waiting in a collective fails the test in seconds, not minutes
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=3,
                        timeout=datetime.timedelta(seconds=30))
mesh = init_device_mesh("cpu", (3,))
torch.manual_seed(0)


def refused(fn, words):
    try:
        fn()
    except (ValueError, TypeError) as exc:
        assert words in str(exc), (words, str(exc))
    else:
        raise AssertionError(f"rank {rank}: accepted, where every rank must refuse ({words})")


# uneven from_local shards (22 / 20 / 22 rows: rank 0 holds what the even split gives it) of an NVFP4
# split: every rank refuses, rank 0 too, after the amax all-reduce it joins (it waited there alone)
x = torch.randn(64, 64)
rows = [22, 20, 22][rank]
local = x[sum([22, 20, 22][:rank]):][:rows]
dx = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=x.shape, stride=x.stride())
refused(lambda: mxq.quantize(dx, format="nvfp4"), "uneven shards" if rank else "another rank refused")
# a split noop (a one-element flag: a rank holds none of it) is refused by name on every rank
even = distribute_tensor(torch.randn(96, 64), mesh, [Shard(0)])
refused(lambda: mxq.quantize(even, noop=distribute_tensor(torch.zeros(1), mesh, [Shard(0)])), "'noop'")
# all_gather of ranks with no rows, FP8 block scaling's fp32 scales included (an empty field viewed
# at an odd offset raised in torch)
for opts in (dict(format="fp8_block"), dict(format="fp8_block", block=(128, 128), colwise=True), {}):
    got = distributed.all_gather(mxq.quantize(torch.randn(0, 64), **opts))
    want = mxq.quantize(torch.randn(0, 64), **opts)
    assert got.shape == (0, 64) and all(getattr(got, f).shape == getattr(want, f).shape for f in
                                        ("rowwise_data", "rowwise_scale")), opts
# a malformed tensor on one rank (an amax that is a number, scales of another dtype) is refused on
# every rank; the others waited in the exchange
t = mxq.quantize(torch.randn(32, 64), amax=True)
if rank == 1:
    t.amax = 1.5
refused(lambda: distributed.all_gather(t), "all_gather() needs an MXFP8Tensor whose fields")
t = mxq.quantize(torch.randn(32, 64))
if rank == 2:
    t.rowwise_data = t.rowwise_data.view(torch.int8)
refused(lambda: distributed.all_gather(t), "all_gather() needs an MXFP8Tensor whose fields")
print("every rank refused together")
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_ranks_refuse_together_uneven_shards_split_noop_and_malformed_gathers(tmp_path):
    """Refusals that one rank judged alone left the others waiting in a collective (an NVFP4 split's
    amax all-reduce, all_gather's exchange) or returning where they raised: now every rank raises;
    all_gather of ranks with no rows gathers FP8 block scaling's fp32 scales too."""
    pytest.importorskip("torch.distributed.tensor")
    run_two_ranks(REFUSALS, tmp_path, "every rank refused together", ranks=3)
