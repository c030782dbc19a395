"""Time two checkouts of mxq side by side on one GPU, alternating A B A B, in one call.

Why: a change that should not move speed (a refactor whose PTX is identical, see
bench/ptx_digest.py) is checked against the code before it on the same machine in the same
minutes; comparing against an older results file mixes in the run-to-run and machine-to-machine
spread of the H200 (about 1-2% between leases).

    python bench/ab_trees.py --a OLD_TREE --b NEW_TREE [--rounds 2] [--dtypes bf16,fp32] [--odd]
                             [--ops both,gelu_both] --out $OUT

Each round runs, for each tree, a fresh process that imports that tree's mxq and
bench/device_check.py and times device_check.bench (kernel time, GPU held busy while the host
issues, median of 50) for every op (or ``--ops``) at the four benchmark shapes (``--odd``: the
shapes with N % 8 != 0, device_check.ODD_SHAPES), against the copy measured in the same process.
Prints per row the two trees' best time over the rounds and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {root!r} + "/bench")
import torch, device_check as dc
assert dc.mxq.__file__.startswith({root!r}), dc.mxq.__file__
copy = dc.copy_bandwidth()
rows = []
shapes = dc.ODD_SHAPES if {odd!r} else dc.BENCH_SHAPES + (dc.ODD_SHAPES[:1] if {standard!r} else [])
for dtype in {dtypes!r}:
    rows += [dict(r, dtype=dtype) for r in dc.bench(copy, shapes, dtype=dtype, ops={ops!r})]
if {standard!r}:  # (the epilogues with an extra tensor, bf16)
    rows += [dict(r, dtype="bf16") for r in dc.bench_operands(copy, dc.BENCH_SHAPES)]
print("JSON" + json.dumps({{"copy": copy, "rows": rows}}))
"""


def run_tree(root: str, dtypes: list, odd: bool = False, ops=None, standard: bool = False) -> dict:
    env = dict(os.environ, MXQ_CACHE_DIR=os.path.join(os.environ.get("MXQ_CACHE_DIR", "/tmp/mxq"), Path(root).name))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                  if p and Path(p).resolve() != Path.cwd().resolve()])
    child = CHILD.format(root=root, dtypes=dtypes, odd=odd, ops=ops, standard=standard)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=root, timeout=900)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("JSON")), None)
    if line is None:
        raise RuntimeError(f"{root}: {r.stdout[-2000:]}{r.stderr[-3000:]}")
    return json.loads(line[4:])


def _device_check_ops() -> set:
    """The op names of bench/device_check.py's OPS (a sibling module; what --ops may name)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # imported from elsewhere (the tests), not run as a script
        sys.path.insert(0, here)
    import device_check

    return set(device_check.OPS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="checkout A (e.g. the code before a change)")
    ap.add_argument("--b", required=True, help="checkout B")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--odd", action="store_true", help="time device_check.ODD_SHAPES instead (N %% 8 != 0)")
    ap.add_argument("--ops", default="", help="only these ops of device_check.OPS (comma-separated)")
    ap.add_argument("--standard", action="store_true", help="the standard table: the four shapes and the first odd "
                    "shape per dtype, and the epilogues with an extra tensor (device_check.bench_operands, bf16)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    ops = set(filter(None, args.ops.split(","))) or None
    known = _device_check_ops()
    if ops and not ops <= known:
        ap.error(f"--ops: unknown {sorted(ops - known)}; device_check.OPS has {sorted(known)}")
    dtypes = args.dtypes.split(",")
    runs = {"a": [], "b": []}
    for rnd in range(args.rounds):
        for side in ("a", "b"):
            t = time.time()
            runs[side].append(run_tree(os.path.abspath(getattr(args, side)), dtypes, args.odd, ops, args.standard))
            print(f"round {rnd} {side}: copy {runs[side][-1]['copy']:.0f} GB/s ({time.time() - t:.0f} s)", flush=True)
    best = {}
    for side in ("a", "b"):
        for run in runs[side]:
            for r in run["rows"]:
                k = (r["name"], r["dtype"], r["M"], r["N"])
                best.setdefault(k, {}).setdefault(side, []).append(r["ms"] * 1000)
    table = []
    print(f"{'op':24} {'dtype':5} {'shape':12} {'A us (runs)':>24} {'B us (runs)':>24} {'B/A':>6}")
    for k, v in best.items():
        a, b = min(v["a"]), min(v["b"])
        table.append({"name": k[0], "dtype": k[1], "M": k[2], "N": k[3], "a_us": v["a"], "b_us": v["b"],
                      "b_over_a": round(b / a, 4)})
        runs_a = "/".join(f"{x:.1f}" for x in v["a"])
        runs_b = "/".join(f"{x:.1f}" for x in v["b"])
        print(f"{k[0]:24} {k[1]:5} {k[2]}x{k[3]:<6} {runs_a:>24} {runs_b:>24} {b / a:6.3f}")
    ratios = sorted(r["b_over_a"] for r in table)
    print(f"B/A of the best times: min {ratios[0]:.3f}, median {ratios[len(ratios) // 2]:.3f}, max {ratios[-1]:.3f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    path = Path(args.out) / "ab.json"
    path.write_text(json.dumps({"device": dev, "date": time.strftime("%Y-%m-%d"), "a": args.a, "b": args.b,
                                "copy_GBps": {s: [r["copy"] for r in runs[s]] for s in runs}, "rows": table},
                               indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
