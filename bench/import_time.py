"""Time of ``import mxq`` against ``import torch`` (CPU only, no GPU needed).

Each import runs in a fresh interpreter, ``import torch`` then ``import mxq``, one process after
the other, ``--rounds`` times; the time is measured inside the child around the import statement
alone (interpreter start-up excluded). Prints the median of each and the ratio mxq / torch; the
target is at most 1.2 (``import mxq`` includes ``import torch``). ``--profile`` prints the
modules ``import mxq`` loads after ``import torch`` (``python -X importtime``), largest first.

    python bench/import_time.py [--rounds 7] [--profile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

# the import's time, and the part of it the garbage collector took (a full collection after
# ``import torch`` walks torch's objects: whichever import allocates next pays for it)
_CHILD = """
import gc, time
gc_s = [0.0, 0.0]
def on_gc(phase, info):
    gc_s[phase == "stop"] += time.perf_counter() * (1 if phase == "stop" else -1)
gc.callbacks.append(on_gc)
t = time.perf_counter()
import {m}
t = time.perf_counter() - t
print(t, gc_s[0] + gc_s[1])
"""


_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _time(module: str, cwd: str) -> tuple[float, float]:
    """(seconds of ``import module`` in a fresh interpreter, seconds of garbage collection in it)."""
    out = subprocess.run([sys.executable, "-c", _CHILD.format(m=module)], cwd=cwd, env=_ENV, check=True,
                         capture_output=True, text=True).stdout
    total, gc_s = out.split()[-2:]
    return float(total), float(gc_s)


def _profile(cwd: str, top: int) -> None:
    """The modules ``import mxq`` loads after ``import torch``, by cumulative time."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch; import mxq"], cwd=cwd,
                         env=_ENV, check=True, capture_output=True, text=True).stderr
    rows, after_torch = [], False
    for line in err.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        if after_torch:
            rows.append((int(parts[1]), parts[2].rstrip()))
        after_torch = after_torch or parts[2].strip() == "torch"
    print(f"\nmodules import mxq loads after import torch: {len(rows)}; largest (cumulative ms, nesting):")
    for cum, name in sorted(rows, reverse=True)[:top]:
        print(f"  {cum / 1e3:8.1f}  {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="processes per module (default 7)")
    ap.add_argument("--profile", action="store_true", help="also list the modules import mxq loads after torch, by time")
    args = ap.parse_args()
    cwd = str(Path(__file__).resolve().parent.parent)  # the checkout's mxq, as the tests import it
    _time("mxq", cwd)  # writes the bytecode of mxq's modules
    torch_s, mxq_s = [], []
    for _ in range(args.rounds):
        torch_s.append(_time("torch", cwd))
        mxq_s.append(_time("mxq", cwd))
    t, m = (statistics.median(s for s, _ in runs) for runs in (torch_s, mxq_s))
    for name, runs, med in (("torch", torch_s, t), ("mxq", mxq_s, m)):
        print(f"import {name:6} {med * 1e3:6.0f} ms  (median of {args.rounds}; min {min(s for s, _ in runs) * 1e3:.0f}; "
              f"garbage collection {statistics.median(g for _, g in runs) * 1e3:.0f} ms of it)")
    print(f"ratio         {m / t:6.2f}  (target <= 1.2)")
    if args.profile:
        _profile(cwd, 15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
