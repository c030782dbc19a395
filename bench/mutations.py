"""Plant known bugs in a copy of the repository and report which tests catch each one.

    python bench/mutations.py [--only NAME] [--keep]

Each mutation is a one-line change of a kind the CPU suite must catch (a known bug class,
or one the design says a test must catch). For each, the tracked files are copied to a
temporary directory, the change is applied (the line must exist exactly once), and the CPU test
files named for it run there with that copy first on the path; a mutation is caught when they
fail. Mutations only a GPU can see are listed with the GPU tests that catch them (run those on
the device with the mutated copy: bench/README.md). The CPU part takes a few minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name, file, old text, new text, CPU test targets (None: GPU only), GPU tests that catch it
MUTATIONS = [
    ("swizzle_x16_x4_swapped", "mxq/kernels/device.py",
     "(i % 32) * 16 + ((i % 128) // 32) * 4", "(i % 32) * 4 + ((i % 128) // 32) * 16",
     ["tests/test_kernels.py"], "test_gpu.py (swizzled SAMPLE specs)"),
    ("rceil_off_by_one", "mxq/kernels/device.py",
     "(b + U32(0x7FFFFF)) >> U32(23)", "(b + U32(0x800000)) >> U32(23)",
     ["tests/test_kernels.py"], "test_gpu.py (rceil specs on sm_90)"),
    ("maximum_emitted_as_min", "mxq/frontend/codegen.py",
     '"maximum": "cutlass.select_(({0} > {1})', '"maximum": "cutlass.select_(({0} < {1})',
     ["tests/test_codegen.py::test_lowering_of_every_operation_computes_the_reference"],
     "test_gpu.py (clipped epilogue)"),
    ("dispatcher_workspace_dtype_swapped", "mxq/csrc/dispatch.cc",
     "x->dtype.bits == 32 ? f64 : f32", "x->dtype.bits == 32 ? f32 : f64",
     ["tests/test_architecture.py"], "test_gpu.py (every dbias case through the dispatcher)"),
    ("prepare_binds_row_and_col_swapped", "mxq/runtime/launch.py",
     '"rowwise_data": lambda: row_data,', '"rowwise_data": lambda: col_data if col_data is not None else row_data,',
     ["tests/test_runtime.py"], "test_gpu.py::test_prepare_matches_reference"),
    ("negative_nan_keeps_its_sign", "mxq/formats/numerics.py",
     "qb = torch.where(torch.isnan(y), FP8_NAN_BYTE, qb.to(torch.int32)).to(torch.uint8)",
     "qb = torch.where(torch.isnan(y) & (y.view(torch.int32) >= 0), FP8_NAN_BYTE, qb.to(torch.int32)).to(torch.uint8)",
     ["tests/test_numerics.py"], "-"),
    ("call_not_validated", "mxq/op.py",
     "        validation.check_call(self.spec, self.epilogue, call)\n"
     "        x = call.tensors[0]\n",
     "        x = call.tensors[0]\n",
     ["tests/test_validation.py"], "-"),
    ("out_token_ignores_field_shape", "mxq/runtime/launch.py",
     "elif kept[0]() is not t or t.shape != kept[1] or t.dtype != kept[2]:",
     "elif kept[0]() is not t or t.dtype != kept[2]:",
     ["tests/test_runtime.py"], "test_gpu_fast.py::test_out_calls_on_the_token_route_match_the_reference_and_recheck_fields"),
    ("fp8_saturation_dropped", "mxq/formats/numerics.py",
     "q = y.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype)", "q = y.to(fmt.torch_dtype)",
     ["tests/test_numerics.py"], "-"),
]


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def run(name, file, old, new, targets, keep: bool) -> str:
    tmp = Path(tempfile.mkdtemp(prefix=f"mxq-mut-{name}-"))
    try:
        copy_tree(tmp)
        path = tmp / file
        text = path.read_text()
        if text.count(old) != 1:
            return f"NOT APPLIED ({file}: the line occurs {text.count(old)} times)"
        path.write_text(text.replace(old, new))
        env = dict(os.environ, PYTHONPATH=str(tmp), MXQ_CACHE_DIR=str(tmp / ".cache"),
                   TVM_FFI_CACHE_DIR=str(tmp / ".tvm-ffi"), PYTHONDONTWRITEBYTECODE="1")
        check = subprocess.run([sys.executable, "-c", "import mxq; print(mxq.__file__)"], cwd=tmp, env=env,
                               capture_output=True, text=True)
        if not check.stdout.startswith(str(tmp)):
            return f"NOT RUN (mxq imported from {check.stdout.strip()})"
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *targets],
                           cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
        failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED ")]
        return f"caught by {failed[0]}" if r.returncode and failed else (
            "caught (error)" if r.returncode else "NOT CAUGHT")
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run one mutation by name")
    ap.add_argument("--keep", action="store_true", help="keep the mutated copies")
    args = ap.parse_args()
    missed = 0
    for name, file, old, new, targets, gpu in MUTATIONS:
        if args.only and name != args.only:
            continue
        result = run(name, file, old, new, targets, args.keep)
        missed += not result.startswith("caught")
        print(f"{name:36} CPU: {result:80} GPU (expected, not run by this script): {gpu}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
