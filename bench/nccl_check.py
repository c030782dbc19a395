"""Two GPUs of one host (NCCL): mxq.distributed.all_gather byte-equality and its time against a
bf16 all-gather of the same weights.

    python bench/nccl_check.py [--out DIR]

Each rank holds half the rows of a weight, quantizes its shard with the kernels (rowwise +
colwise, and rowwise alone: what a forward needs), all-gathers it with mxq.distributed.all_gather
and compares the result byte for byte with quantizing the full weight on one GPU. Timing: the
all-gather collective alone (one uint8 buffer per rank: 1 + 1/32 bytes per element for one
direction) against torch's all_gather_into_tensor of the bf16 shard (2 bytes per element), CUDA
events around 20 back-to-back calls after warm-up, median of 5; and mxq.distributed.all_gather
end to end (its shape check, gather and unpacking included).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = [(8192, 8192), (14336, 4096), (4096, 4096)]


def timed(fn, reps=20, rounds=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / reps)
    return statistics.median(ts)


def worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    import mxq
    from mxq import distributed as mxd
    from mxq.testing import compare

    rows = []
    for m, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + k)
        full = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g) * 3
        shard = full[rank * m // world:(rank + 1) * m // world].contiguous()
        for opts in (dict(rowwise=True), dict(rowwise=True, colwise=True)):
            t = mxq.quantize(shard, **opts)
            got = mxd.all_gather(t)
            want = mxq.quantize(full, **opts)
            problems = compare(got, want, exact=True)
            ref_problems = compare(got, mxq.quantize(full.cpu(), **opts), exact=True) if m * k <= 2 ** 24 else None
            nbytes = sum(getattr(t, f).numel() for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale")
                         if getattr(t, f) is not None)
            buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            gathered = torch.empty(world * nbytes, dtype=torch.uint8, device="cuda")
            mx_ms = timed(lambda: dist.all_gather_into_tensor(gathered, buf))
            end_ms = timed(lambda: mxd.all_gather(t))
            bf = torch.empty(world * shard.numel(), dtype=torch.bfloat16, device="cuda")
            bf_ms = timed(lambda: dist.all_gather_into_tensor(bf, shard.reshape(-1)))
            row = dict(M=m, K=k, directions="+".join(d for d in ("rowwise", "colwise") if opts.get(d)),
                       byte_equal_to_one_gpu=problems == [], byte_equal_to_reference=ref_problems == [] if ref_problems is not None else None,
                       mxfp8_bytes_per_rank=nbytes, bf16_bytes_per_rank=shard.numel() * 2,
                       mxfp8_gather_ms=round(mx_ms, 4), mxq_all_gather_ms=round(end_ms, 4), bf16_gather_ms=round(bf_ms, 4),
                       speedup=round(bf_ms / mx_ms, 2))
            rows.append(row)
            if rank == 0:
                print(row, flush=True)
    if rank == 0:
        name = torch.cuda.get_device_name()
        path = Path(out_dir) / f"{name.lower().replace(' ', '-')}-x2-{time.strftime('%Y%m%d')}-nccl.json"
        path.write_text(json.dumps({"device": f"2 x {name}", "torch": torch.__version__,
                                    "nccl": ".".join(map(str, torch.cuda.nccl.version())), "rows": rows}, indent=1))
        print("wrote", path, flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    assert torch.cuda.device_count() >= 2, "needs two GPUs"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, args.out), nprocs=2)


if __name__ == "__main__":
    main()
