"""Nsight Compute counters of single kernels, several cases in one device call, one report.

    python bench/ncu.py [--out FILE] [--dry-run] CASE [CASE ...]

CASE is ``SCRIPT:ROW[@MxN][+VARIANT][~KERNEL]``: a benchmark with a ``--launch`` mode
(``fp8_block``, ``fp4``; ``gated`` with ROW ``fwd``/``bwd``, or ``fwd/LAYOUT``/``bwd/LAYOUT`` with
one of its grouped layouts (default compact), and ``@G`` its group count) and one of
its rows, at shape MxN (default the script's), under a Tuning variant ('k=v,...': bench/
device_check.parse_tuning), profiling the kernels whose name matches the regular expression
KERNEL (default ``packed_kernel`` for mxq's rows, ``fp8_blockwise`` for torchao's). Each case
runs once without the profiler (it compiles its kernels), then under ncu with the clocks left
alone, profiling the matching kernels of the last two of the 4 launches the script makes inside
the NVTX range device_check.PROFILED_RANGE (after a first launch outside it: compiling,
autotuning); an op of two kernels (NVFP4's amax pass, then its quantize pass) gives the second
launch's two. The report gets a ``=== CASE (seconds, rc)`` header and ncu's output. ``--dry-run`` prints the commands. METRICS: DRAM bytes and throughput, L2
sectors, instructions, issue activity, warps active, occupancy limits, registers, shared-memory
wavefronts and bank conflicts, and the warp stall reasons per issue.
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_check import PROFILED_RANGE, make_tuning, parse_tuning  # noqa: E402

SCRIPTS = ("fp8_block", "fp4", "gated")
METRICS = [
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sectors_op_read.sum",
    "lts__t_sectors_op_write.sum", "sm__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
    "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
] + [f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in (
    "barrier", "branch_resolving", "dispatch_stall", "lg_throttle", "long_scoreboard", "math_pipe_throttle",
    "mio_throttle", "no_instruction", "not_selected", "selected", "short_scoreboard", "wait")]
_CASE = re.compile(r"^(?P<script>\w+):(?P<row>[\w/]+)(?:@(?P<shape>\d+x\d+|\d+))?(?:\+(?P<variant>[^~]+))?"
                   r"(?:~(?P<kernel>.+))?$")


def script_rows(script: str) -> list[str]:
    """The rows ``script``'s --launch accepts."""
    if script == "gated":
        from gated import LAYOUTS
        return ["fwd", "bwd"] + [f"{what}/{layout}" for what in ("fwd", "bwd") for layout in LAYOUTS]
    tool = importlib.import_module(script)
    return tool.launch_rows() if script == "fp8_block" else list(tool.cases(128, 128))


def parse_case(text: str) -> dict:
    """CASE -> {script, row, shape, variant, kernel}; a malformed case, an unknown script or row,
    a bad shape or variant is a ValueError naming it."""
    m = _CASE.match(text)
    if not m or m["script"] not in SCRIPTS:
        raise ValueError(f"a case is SCRIPT:ROW[@MxN][+VARIANT][~KERNEL] with SCRIPT one of {SCRIPTS}, got {text!r}")
    case = m.groupdict()
    if case["kernel"] is None:
        case["kernel"] = "fp8_blockwise" if case["row"].startswith("torchao/") else "packed_kernel"
    if case["shape"] and (case["script"] == "gated") != ("x" not in case["shape"]):
        raise ValueError(f"{text!r}: gated takes @G (its group count), the others @MxN")
    if case["row"] not in script_rows(case["script"]):
        raise ValueError(f"{text!r}: {case['script']} has no row {case['row']!r} "
                         f"(rows: {', '.join(script_rows(case['script']))})")
    if case["variant"]:
        make_tuning(parse_tuning(case["variant"]))  # (a bad field is an error here, not on the device)
    return case


def launch_command(case: dict) -> list[str]:
    """The benchmark's --launch command line for ``case``."""
    script = str(Path(__file__).resolve().parent / f"{case['script']}.py")
    row, _, layout = case["row"].partition("/")  # (gated's ROW/LAYOUT)
    cmd = [sys.executable, script, "--launch", row] + (["--layouts", layout] if layout else [])
    if case["shape"]:
        cmd += ["--groups" if case["script"] == "gated" else "--shape", case["shape"]]
    if case["variant"]:
        cmd += ["--variants", case["variant"]]
    return cmd


def ncu_command(case: dict, ncu: str = "ncu") -> list[str]:
    """``case``'s launch under ncu: the matching kernels of its last two profiled launches."""
    return [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{PROFILED_RANGE}/", "-k",
            f"regex:{case['kernel']}", "-s", "2", "-c", "2", "--metrics", ",".join(METRICS), *launch_command(case)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--out", default="ncu.txt")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    cases = [(text, parse_case(text)) for text in args.cases]  # (every case checked before any run)
    if args.dry_run:
        for _, case in cases:
            print(" ".join(launch_command(case)))
            print(" ".join(ncu_command(case, args.ncu)))
        return 0
    failed = 0
    with open(args.out, "w") as report:
        for text, case in cases:
            t0 = time.time()
            warm = subprocess.run(launch_command(case), capture_output=True, text=True)
            prof = subprocess.run(ncu_command(case, args.ncu), capture_output=True, text=True) if warm.returncode == 0 \
                else warm
            failed += prof.returncode != 0
            report.write(f"=== {text} ({time.time() - t0:.0f} s, rc {prof.returncode})\n")
            report.write(prof.stdout[-20000:] + (prof.stderr[-4000:] if prof.returncode else "") + "\n")
            report.flush()
            print(f"{text}: rc {prof.returncode}, {time.time() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
