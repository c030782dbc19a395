"""Time two checkouts of mxq side by side on one GPU, alternating A B A B, in one call.

Why: a change that should not move speed (a refactor whose PTX is identical, see
bench/ptx_digest.py) is checked against the code before it on the same machine in the same
minutes; comparing against an older results file mixes in the run-to-run and machine-to-machine
spread of the H200 (about 1-2% between leases).

    python bench/ab_trees.py --a OLD_TREE --b NEW_TREE [--rounds 2] [--dtypes bf16,fp32] [--odd]
                             [--ops both,gelu_both] --out $OUT
    python bench/ab_trees.py --a OLD_TREE --b NEW_TREE --bench "gated.py --grouped-only" --out $OUT

Each round runs, for each tree, a fresh process that imports that tree's mxq and
bench/device_check.py and times device_check.bench (kernel time, GPU held busy while the host
issues, median of 50) for every op (or ``--ops``) at the four benchmark shapes (``--odd``: the
shapes with N % 8 != 0, device_check.ODD_SHAPES), against the copy measured in the same process.
``--bench "SCRIPT ARGS"``: instead, that tree's own bench/SCRIPT with ARGS (and ``--out`` a fresh
folder), its results file's timed rows paired by name, shape and group count; a row whose check
failed in either tree is marked. Prints per row the two trees' best time over the rounds and their
ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
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


def tree_env(root: str) -> dict:
    """The environment of a process running tree ``root``'s mxq: its own kernel cache, and ``root``
    first on the import path in place of this directory."""
    env = dict(os.environ, MXQ_CACHE_DIR=os.path.join(os.environ.get("MXQ_CACHE_DIR", "/tmp/mxq"), Path(root).name))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                  if p and Path(p).resolve() != Path.cwd().resolve()])
    return env


def run_tree(root: str, dtypes: list, odd: bool = False, ops=None, standard: bool = False) -> dict:
    child = CHILD.format(root=root, dtypes=dtypes, odd=odd, ops=ops, standard=standard)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=tree_env(root), cwd=root,
                       timeout=900)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("JSON")), None)
    if line is None:
        raise RuntimeError(f"{root}: {r.stdout[-2000:]}{r.stderr[-3000:]}")
    result = json.loads(line[4:])
    return {"copy": result["copy"], "rows": bench_rows(result)}


def bench_command(root: str, bench: str, out: str) -> list:
    """The command line of ``bench`` ("SCRIPT ARGS": a script of bench/ and its arguments) in tree
    ``root``, writing its results under ``out``."""
    argv = shlex.split(bench)
    if not argv or "/" in argv[0] or not argv[0].endswith(".py"):
        raise ValueError(f"--bench: a script of bench/ and its arguments, e.g. 'gated.py --grouped-only'; got {bench!r}")
    return [sys.executable, str(Path(root) / "bench" / argv[0]), *argv[1:], "--out", out]


def check_failed(row: dict) -> bool:
    """Whether a results row says its check against the reference failed (the benches' fields:
    ``checked`` False, a ``checks`` entry False, ``exact`` False or an ``error``)."""
    checks = row.get("checks")
    return (row.get("checked") is False or row.get("exact") is False or "error" in row
            or (isinstance(checks, dict) and any(v is False for v in checks.values())))


def bench_rows(result: dict) -> dict:
    """A results file's timed rows (those with ``ms``), keyed by (name, dtype, M, N, G)."""
    return {(r["name"], r.get("dtype", ""), r.get("M"), r.get("N"), r.get("G")): r
            for r in result.get("rows", []) if "ms" in r}


def run_bench(root: str, bench: str) -> dict:
    """One run of ``bench`` in tree ``root``: {"copy": GB/s, "rows": its timed rows (bench_rows)}."""
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run(bench_command(root, bench, out), capture_output=True, text=True, env=tree_env(root),
                           cwd=root, timeout=1800)
        files = sorted(Path(out).glob("*.json"))
        if r.returncode != 0 or not files:
            raise RuntimeError(f"{root}: {bench} exited {r.returncode}: {r.stdout[-2000:]}{r.stderr[-3000:]}")
        result = json.loads(files[-1].read_text())
    return {"copy": result.get("copy_GBps"), "rows": bench_rows(result)}


def pair_runs(runs: dict) -> list:
    """Rows of both sides' runs (``runs[side]``: run_bench's or run_tree's results, a round each) paired by key:
    each side's times in us over the rounds, the ratio of the best ones, and whether a check failed."""
    keys = [k for k in runs["a"][0]["rows"] if all(k in run["rows"] for s in ("a", "b") for run in runs[s])]
    table = []
    for k in keys:
        us = {s: [run["rows"][k]["ms"] * 1000 for run in runs[s]] for s in ("a", "b")}
        failed = any(check_failed(run["rows"][k]) for s in ("a", "b") for run in runs[s])
        table.append({"name": k[0], "dtype": k[1], "M": k[2], "N": k[3], "G": k[4], "a_us": us["a"], "b_us": us["b"],
                      "b_over_a": round(min(us["b"]) / min(us["a"]), 4), "check_failed": failed})
    return table


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
    ap.add_argument("--bench", default="", help="instead: 'SCRIPT ARGS', a benchmark of bench/ run in each tree "
                    "(e.g. 'gated.py --grouped-only', 'fp8_block.py --quick --no-peers --rows colwise_gemm'), its rows "
                    "paired")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.bench:
        bench_command(".", args.bench, ".")  # (the form checked before any run)
        run = lambda root: run_bench(root, args.bench)  # noqa: E731
    else:
        ops = set(filter(None, args.ops.split(","))) or None
        known = _device_check_ops()
        if ops and not ops <= known:
            ap.error(f"--ops: unknown {sorted(ops - known)}; device_check.OPS has {sorted(known)}")
        dtypes = args.dtypes.split(",")
        run = lambda root: run_tree(root, dtypes, args.odd, ops, args.standard)  # noqa: E731
    runs = {"a": [], "b": []}
    for rnd in range(args.rounds):
        for side in ("a", "b"):
            t = time.time()
            runs[side].append(run(os.path.abspath(getattr(args, side))))
            print(f"round {rnd} {side}: copy {runs[side][-1]['copy']} GB/s ({time.time() - t:.0f} s)", flush=True)
    table = pair_runs(runs)
    print(f"{'row':44} {'dtype':5} {'shape':12} {'G':>4} {'A us (runs)':>20} {'B us (runs)':>20} {'B/A':>6}")
    for r in table:
        runs_a = "/".join(f"{x:.1f}" for x in r["a_us"])
        runs_b = "/".join(f"{x:.1f}" for x in r["b_us"])
        mark = "  CHECK FAILED" if r["check_failed"] else ""
        print(f"{r['name']:44} {r['dtype']:5} {r['M']}x{r['N']:<6} {str(r['G']):>4} {runs_a:>20} {runs_b:>20} "
              f"{r['b_over_a']:6.3f}{mark}")
    return write_ab(args, runs, table)


def write_ab(args, runs: dict, table: list) -> int:
    """Print the ratios' spread and write <out>/ab.json (device, date, the trees, the command)."""
    ratios = sorted(r["b_over_a"] for r in table)
    if ratios:
        print(f"B/A of the best times: min {ratios[0]:.3f}, median {ratios[len(ratios) // 2]:.3f}, max {ratios[-1]:.3f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    path = Path(args.out) / "ab.json"
    path.write_text(json.dumps({"device": dev, "date": time.strftime("%Y-%m-%d"), "a": args.a, "b": args.b,
                                "bench": args.bench or None,
                                "copy_GBps": {s: [r["copy"] for r in runs[s]] for s in runs}, "rows": table},
                               indent=1))
    print("wrote", path)
    return 1 if any(r.get("check_failed") for r in table) else 0


if __name__ == "__main__":
    raise SystemExit(main())
