"""The kernel layer lands only after the GPU suite passed on it: CI has no GPU, so a kernel-side
bug (an edge predicate, a transposed scale index) passes every CPU test. bench/gpu_tests.py
--record writes bench/results/gpu-suite.json after a whole suite passed on a GPU, with the
kernel layer's hash (codegen.kernels_hash: the templates, mxq/kernels/ and what else shapes the
compiled code); this test fails when the current hash is not the recorded one."""

import json
import re
from pathlib import Path

from mxq.frontend.codegen import kernels_hash

RECORD = Path(__file__).resolve().parent.parent / "bench" / "results" / "gpu-suite.json"


def test_the_kernel_layer_is_the_one_the_gpu_suite_last_passed():
    assert RECORD.exists(), f"{RECORD} is missing: run `python bench/gpu_tests.py --record {RECORD}` on a GPU"
    rec = json.loads(RECORD.read_text())
    assert rec["kernels_hash"] == kernels_hash(), (
        f"the kernel layer changed since the GPU suite last passed (recorded {rec['kernels_hash']}, now "
        f"{kernels_hash()}): run `python bench/gpu_tests.py --record bench/results/gpu-suite.json` on a GPU and "
        "commit the record")
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|error|did not finish)", rec["summary"]))
    assert counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error"), rec["summary"]
    assert "did not finish" not in rec["summary"], rec["summary"]
