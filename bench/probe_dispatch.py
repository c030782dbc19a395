"""Device probe: the registered dispatcher on CUDA tensors, step by step (isolates a crash)."""
import faulthandler
import sys

import torch

import mxq

faulthandler.enable()


def ident(x):
    return x


def dests(m, n, spec):
    d = dict(rd=None, rs=None, cd=None, cs=None, am=None, db=None)
    if spec.rowwise:
        d["rd"] = torch.empty(m, n, dtype=torch.uint8, device="cuda")
        d["rs"] = torch.empty(m, n // 32, dtype=torch.uint8, device="cuda")
    if spec.colwise:
        d["cd"] = torch.empty(m, n, dtype=torch.uint8, device="cuda")
        d["cs"] = torch.empty(m // 32, n, dtype=torch.uint8, device="cuda")
    if spec.amax:
        d["am"] = torch.empty(1, dtype=torch.float32, device="cuda")
    if spec.dbias:
        d["db"] = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    return d


x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
for step, opts in enumerate([dict(), dict(colwise=True), dict(amax=True), dict(dbias=True)]):
    op = mxq.fused_quant(**opts)(ident)
    f = op.register(f"probe{step}")
    d = dests(64, 256, op.spec)
    for noop in (torch.zeros(1, device="cuda"), None):
        print("step", step, opts, "noop given" if noop is not None else "noop None", flush=True)
        f(x, None, d["rd"], d["rs"], d["cd"], d["cs"], d["am"], d["db"], noop)
        torch.cuda.synchronize()
        want = op(x)
        ok = want.rowwise_data is None or torch.equal(d["rd"], want.rowwise_data.view(torch.uint8))
        print("  ok", ok, flush=True)
sys.exit(0)
