"""Run a matrix of kernel variants once each, for compute-sanitizer (memcheck, racecheck,
initcheck, synccheck) on a GPU:

    python bench/sanitize.py                       # compiles and caches the kernels, checks bytes
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python bench/sanitize.py

(``--dtypes bf16`` and ``--shard I/N`` split the matrix over processes.)

Every combination of plain cast / built-in act / dact / user epilogue x dbias x amax, both
directions and each alone, in bf16 and fp32 (fp16 runs the bf16 kernel's code), on an aligned
shape (the packed / vectorised kernels, partial row tile) and an odd one (16-bit: the packed
kernel's unaligned rows; fp32: the element-wise kernel into contiguous FP8 rows, the default
``--row-align 1``, or with ``--row-align 16`` the vectorised kernel's staged rows, as the
library's own padded outputs take them).
Each result is compared with the reference, so a run also shows the kernels wrote every byte.
Host API errors from the compiler's driver probing (cuGetProcAddress) are not kernel errors:
``--report-api-errors no`` leaves them out, and running once without the sanitizer first fills
the kernel cache so the sanitized run only loads libraries.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check import BASE_SPEC, EPILOGUES  # noqa: E402

from mxq.op import FusedOp  # noqa: E402
from mxq.frontend.spec import QuantSpec  # noqa: E402
from mxq.testing import compare, is_exact, planted, poisoned, v_abs_sum  # noqa: E402

SHAPES = [(100, 264), (33, 70)]


def cases():
    for dtype, kind in itertools.product(("bf16", "fp32"), ("plain", "act", "dact", "epilogue")):
        for dbias, amax, (rw, cw) in itertools.product((False, True), (False, True),
                                                       ((True, False), (False, True), (True, True))):
            v = dict(BASE_SPEC, rowwise=rw, colwise=cw, dbias=dbias, amax=amax,
                     act="gelu" if kind == "act" else None, dact="srelu" if kind == "dact" else None)
            yield v, ("clipped_sq" if kind == "epilogue" else "identity"), dtype


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32")
    ap.add_argument("--shard", default="", help="I/N: only every N-th case from I (parallel processes)")
    ap.add_argument("--row-align", type=int, default=1,
                    help="FP8 rows padded to this many bytes (16: the library's default outputs, which at the odd "
                    "shape run variant rows8, the vectorised fp32 kernel's staged rows; 1: contiguous, variant generic)")
    args = ap.parse_args()
    want_dtypes = set(args.dtypes.split(","))
    shard, nshards = (int(p) for p in args.shard.split("/")) if args.shard else (0, 1)
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    runs, bad = 0, []
    for i, (v, epi, dtype) in enumerate(cases()):
        if dtype not in want_dtypes or i % nshards != shard:
            continue
        op = FusedOp(EPILOGUES[epi], QuantSpec(**v))
        for m, n in SHAPES:
            x = planted(m, n, dtypes[dtype], seed=i)
            kw = {"act_input": planted(m, n, dtypes[dtype], seed=i + 1)} if v["dact"] else {}
            want = op.reference(x, **kw)
            got = op(x.cuda(), out=poisoned(op, x.cuda(), row_align=args.row_align),
                     **{k: t.cuda() for k, t in kw.items()})
            torch.cuda.synchronize()
            v_abs = v_abs_sum(op, x, **kw) if v["dbias"] and not is_exact(op) else None
            problems = compare(got, want, is_exact(op), v_abs)
            runs += 1
            if problems:
                bad.append((v, epi, dtype, (m, n), problems[:2]))
    print(f"sanitize.py: {runs} kernel calls, {runs - len(bad)} bit-exact within class")
    for b in bad:
        print("FAIL", b)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
