"""mxq/integrations/fsdp.py: FSDP2 all-gathers of MXFP8 weights on two CPU processes (gloo). The gathered
bytes are the full weight's quantization (rowwise before forward, colwise before backward),
the layer's outputs and gradients are those of its dequantized weights, and bad shapes are
refused by name. examples/fsdp2_mxfp8.py trains with it (run by tests/test_examples.py)."""

import os
import subprocess
import sys

import pytest
import torch

import mxq

from .test_distributed import ROOT, run_two_ranks

WORKER = r"""
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import mxq, mxq.fsdp

rank, world = int(sys.argv[1]), 2
dist.init_process_group("gloo", init_method=os.environ["MXQ_TEST_INIT"], rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
layer = torch.nn.Linear(96, 128)
full_w = layer.weight.detach().clone() * 3
layer.weight.data.copy_(full_w)
mxq.fsdp.mxfp8_all_gather(layer, world_size=world)
fully_shard(layer, mesh=mesh)
wrapper = torch.nn.Sequential(layer)  # the root: its child reshards after forward
fully_shard(wrapper, mesh=mesh)

seen = []
dequantize = mxq.fsdp.MXFP8GatheredWeight.dequantize
def recording(self):
    seen.append((self._direction, self._fp8.clone(), self._scales.clone()))
    return dequantize(self)
mxq.fsdp.MXFP8GatheredWeight.dequantize = recording

x = torch.randn(16, 96, requires_grad=True)
y = wrapper(x)
y.square().sum().backward()
dirs = [d for d, _, _ in seen]
assert dirs == ["rowwise", "colwise"], dirs
want = mxq.quantize(full_w, rowwise=True, colwise=True)
_, fwd_data, fwd_scales = seen[0]
_, bwd_data, bwd_scales = seen[1]
assert torch.equal(fwd_data, want.rowwise_data.view(torch.uint8))
assert torch.equal(fwd_scales, want.rowwise_scale)
assert torch.equal(bwd_data, want.colwise_data.view(torch.uint8))
assert torch.equal(bwd_scales.reshape(-1), want.colwise_scale.reshape(-1))
# outputs and gradients: those of the dequantized weights (rowwise forward, colwise dx)
w_row, w_col = want.dequantize("rowwise"), want.dequantize("colwise")
b = layer.bias.full_tensor().detach()
x2 = x.detach().clone().requires_grad_()
y2 = x2 @ w_row.t() + b
assert torch.equal(y.detach(), y2.detach())
dy = 2 * y2.detach()
assert torch.allclose(x.grad, dy @ w_col, rtol=1e-6, atol=1e-6)
assert torch.allclose(layer.weight.grad.full_tensor(), dy.t() @ x2.detach(), rtol=1e-5, atol=1e-5)
# FSDP's column split (shard_placement_fn: Shard(1)) is refused by name on every rank (it failed inside
# FSDP's copy-out with a shape error)
cols = torch.nn.Linear(128, 64)
mxq.fsdp.mxfp8_all_gather(cols, world_size=world)
fully_shard(cols, mesh=mesh, shard_placement_fn=lambda p: torch.distributed.tensor.Shard(1) if p.dim() == 2 else None)
try:
    cols(torch.randn(8, 128))
except ValueError as exc:
    assert "sharded along its columns" in str(exc) and "Shard(0)" in str(exc), exc
else:
    raise AssertionError("a column split was gathered")
print(f"rank {rank}: gathered bytes byte-equal", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # no interpreter shutdown: see examples/fsdp2_mxfp8.py, worker()
"""


def test_fsdp_gathers_the_full_weights_mxfp8_bytes(tmp_path):
    run_two_ranks(WORKER, tmp_path, "byte-equal")


def test_shapes_that_cannot_travel_as_mxfp8_are_refused():
    with pytest.raises(ValueError, match=r"0\.weight of shape \(96, 64\).*4 ranks: the rows per rank"):
        mxq.fsdp.mxfp8_all_gather(torch.nn.Sequential(torch.nn.Linear(64, 96)), world_size=4)
    # K is checked whatever world_size is, and the message names K alone (it read "over None ranks")
    for world_size in (None, 2):
        with pytest.raises(ValueError, match=r"\(64, 48\) cannot travel as MXFP8: K = 48 is not a multiple of 32$"):
            mxq.fsdp.mxfp8_all_gather(torch.nn.Linear(48, 64), world_size=world_size)
    mesh = type("Mesh", (), {"ndim": 1, "size": lambda self, dim=None: 2})()
    w = mxq.fsdp.MXFP8ShardedWeight(torch.randn(48, 64))
    with pytest.raises(ValueError, match=r"weight of shape \(96, 64\) sharded over 2 ranks \(\[48, 48\] rows"):
        w.fsdp_pre_all_gather(mesh, torch.Size((96, 64)), None, None, None)
    # (every rank judges the whole weight's split: rank 0's 32 rows of a [63, 64] weight are refused too, where
    # refusing rank 1's 31 alone left rank 0 waiting in the all-gather)
    w = mxq.fsdp.MXFP8ShardedWeight(torch.randn(32, 64))
    with pytest.raises(ValueError, match=r"\(63, 64\) sharded over 2 ranks \(\[32, 31\] rows each\)"):
        w.fsdp_pre_all_gather(mesh, torch.Size((63, 64)), None, None, None)
    data, scales = w.fsdp_pre_all_gather(mesh, torch.Size((64, 64)), None, None, None)[0]
    assert data.shape == (32, 64) and scales.shape == (32, 2)


@pytest.mark.parametrize("world_size", [0, -2, 1.5, True, "2"])
def test_a_world_size_that_is_not_a_positive_int_is_refused_by_name(world_size):
    with pytest.raises(ValueError, match=r"argument 'world_size' must be a positive int or None, got"):
        mxq.fsdp.mxfp8_all_gather(torch.nn.Linear(64, 64), world_size=world_size)


def test_a_module_that_is_not_a_module_is_refused_by_name():
    with pytest.raises(TypeError, match=r"argument 'module' must be a torch.nn.Module, got Tensor"):
        mxq.fsdp.mxfp8_all_gather(torch.randn(64, 64))


def test_sharded_weight_behaves_as_its_tensor():
    """Outside the all-gather the wrapper is its high-precision tensor: arithmetic, in-place
    updates (the optimizer), views and copies."""
    data = torch.randn(64, 32)
    w = mxq.fsdp.MXFP8ShardedWeight(data.clone())
    assert torch.equal(w + 1, data + 1) and type(w + 1) is torch.Tensor
    w.add_(1.0)
    assert torch.equal(w._data, data + 1)
    half = w[:32]
    assert type(half) is mxq.fsdp.MXFP8ShardedWeight and torch.equal(half._data, (data + 1)[:32])
    assert type(w.detach()) is mxq.fsdp.MXFP8ShardedWeight


def test_fsdp_is_an_attribute_of_mxq_loaded_on_first_use():
    """``mxq.fsdp`` as the README writes it (no explicit ``import mxq.fsdp``), in a fresh process."""
    code = "import sys, mxq; a = 'mxq.fsdp' in sys.modules; f = mxq.fsdp.mxfp8_all_gather; print(a, f.__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.stdout.split() == ["False", "mxfp8_all_gather"], r.stderr
