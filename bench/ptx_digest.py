"""Digest of the PTX of every kernel branch combination, to show that a change to the kernel
layer (a refactor, a rename) compiles to the same code -- no GPU needed.

    python bench/ptx_digest.py --out digests.json [--jobs 2] [--quick]
    python bench/ptx_digest.py --compare a.json b.json
    python bench/ptx_digest.py --quick --preimport quack --out b.json

``--preimport MODULE`` imports a module in every compiling process first: whether a library that
patches the DSL on import (quack-kernels rewrites its AST preprocessor's ``if`` handling and
CuTe's tensor indexing) changes what mxq's kernels compile to (``--compare`` against a digest
without it).

Each case is (spec, epilogue, dtype, variant, arch), drawn from device_check.matrix_cases() (every
combination of plain/act/dact/epilogue x dbias x amax x direction x dtype, on the packed or
vectorised kernel, the generic one and variant rows8) plus the scale modes, layouts and formats
(FP8 block scaling: 1x128 rowwise blocks in both layouts, 128-row colwise blocks compact and
transposed, with and without amax; 128x128 tiles; MXFP4's rowwise blocks on the aligned kernels,
sm_90's integer E2M1 encode and sm_100a's cvt, and its transposed colwise copy; NVFP4's rowwise
blocks, both passes and the quantize pass alone, with stochastic rounding and the transposed
colwise copy too, and its 16x16 tiles rowwise and with the copy). The PTX is
normalised before hashing: kernel entry names (derived from Python function names and argument
types) become their position, and comments and the version header are dropped; what remains is
the instruction stream ptxas sees.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def all_cases(quick: bool = False):
    from device_check import BASE_SPEC, matrix_cases

    out = []
    for v, epi, dtype, _shapes in matrix_cases():
        for variant in ("vec", "generic", "rows8"):
            out.append((v, epi, dtype, variant, "sm_90"))
    for fp8, mode, layout in itertools.product(("e4m3", "e5m2"), ("rceil", "floor", "ceil", "even"),
                                               ("compact", "swizzled")):
        v = dict(BASE_SPEC, fp8=fp8, scale_mode=mode, scale_layout=layout, colwise=True, amax=mode == "even")
        for dtype, variant in (("bf16", "vec"), ("fp32", "vec"), ("bf16", "generic")):
            out.append((v, "identity", dtype, variant, "sm_100a" if mode == "rceil" else "sm_90"))
    for fp8, mode, layout, colwise in itertools.product(("e4m3", "e5m2"), ("pow2", "fp32"), ("compact", "gemm"),
                                                        (False, True)):
        if colwise and layout == "gemm":
            continue  # (the transposed copy: below)
        v = dict(BASE_SPEC, fp8=fp8, scale_mode=mode, scale_layout=layout, colwise=colwise, format="fp8_block")
        for dtype, variant in (("bf16", "vec"), ("fp16", "generic"), ("fp32", "vec"), ("fp32", "rows8")):
            if not (colwise and dtype == "fp32"):
                out.append((v, "identity", dtype, variant, "sm_100a" if fp8 == "e5m2" else "sm_90a"))
    for mode, layout, act in (("floor", "compact", None), ("rceil", "swizzled", None), ("floor", "compact", "gelu")):
        v = dict(BASE_SPEC, scale_mode=mode, scale_layout=layout, format="mxfp4", act=act)
        for dtype, arch in (("bf16", "sm_90"), ("fp16", "sm_100a"), ("fp32", "sm_90"), ("fp32", "sm_100a")):
            out.append((v, "identity", dtype, "vec", arch))  # (MXFP4: the aligned kernels alone)
    for mode, layout, act, row in (("floor", "compact", None, True), ("rceil", "swizzled", None, False),
                                   ("floor", "swizzled", "gelu", True)):  # (MXFP4's transposed copy: 16-bit inputs)
        v = dict(BASE_SPEC, scale_mode=mode, scale_layout=layout, format="mxfp4", act=act, rowwise=row, colwise=True)
        for dtype, arch in (("bf16", "sm_90"), ("fp16", "sm_100a")):
            out.append((v, "identity", dtype, "vec", arch))
    for layout, act, sr, col in (("compact", None, False, False), ("swizzled", None, False, False),
                                 ("compact", "gelu", False, False), ("compact", None, True, False),
                                 ("swizzled", None, False, True), ("compact", None, True, True)):
        v = dict(BASE_SPEC, scale_mode="e4m3", scale_layout=layout, format="nvfp4", act=act, stochastic_rounding=sr,
                 colwise=col)
        for dtype, arch in (("bf16", "sm_90a"), ("fp16", "sm_100a"), ("fp32", "sm_90a")):
            for variant in ("vec", "vec_given"):  # (NVFP4: both passes, or the quantize pass alone)
                if not ((sr or col) and dtype == "fp32"):
                    out.append((v, "identity", dtype, variant, arch))
    for layout, act, col in (("compact", None, False), ("swizzled", None, True), ("compact", "gelu", True)):
        v = dict(BASE_SPEC, scale_mode="e4m3", scale_layout=layout, format="nvfp4", act=act, colwise=col, block_2d=True)
        for dtype, arch in (("bf16", "sm_90a"), ("fp16", "sm_100a")):  # (16x16 tiles: 16-bit inputs alone)
            for variant in ("vec", "vec_given"):
                out.append((v, "identity", dtype, variant, arch))
    # the GEMM-ready transposed colwise copy and the amax beside colwise blocks (16-bit inputs, aligned rows)
    for fp8, layout, rowwise, amax in itertools.product(("e4m3", "e5m2"), ("compact", "gemm"), (True, False),
                                                        (False, True)):
        if layout == "gemm" or amax:
            v = dict(BASE_SPEC, fp8=fp8, scale_mode="pow2" if fp8 == "e4m3" else "fp32", scale_layout=layout,
                     rowwise=rowwise, colwise=True, amax=amax, format="fp8_block")
            out.append((v, "identity", "bf16" if rowwise else "fp16", "vec", "sm_100a" if fp8 == "e5m2" else "sm_90a"))
    # 128x128 tiles (rowwise, colwise, both; either layout)
    for layout, (rowwise, colwise), amax in itertools.product(("compact", "gemm"), ((True, False), (False, True),
                                                                                   (True, True)), (False, True)):
        v = dict(BASE_SPEC, fp8="e4m3", scale_mode="pow2", scale_layout=layout, rowwise=rowwise, colwise=colwise,
                 amax=amax, format="fp8_block", block=(128, 128))
        out.append((v, "identity", "fp16" if amax else "bf16", "vec", "sm_90a"))
    if quick:
        out = out[::7]
    return out


def normalise(ptx: str) -> str:
    names = re.findall(r"\.entry\s+(\w+)", ptx)
    for i, name in enumerate(names):
        ptx = ptx.replace(name, f"kernel{i}")
    lines = []
    for line in ptx.splitlines():
        line = re.sub(r"//.*", "", line).rstrip()
        if not line or line.startswith((".version", ".file", ".loc")):
            continue
        lines.append(line)
    return "\n".join(lines)


def digest(case) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    from device_check import EPILOGUES

    from mxq.runtime import compiler
    from mxq.op import FusedOp
    from mxq.frontend.spec import QuantSpec

    v, epi, dtype, variant, arch = case
    # CuTeDSL names its PTX dump by the kernel signature alone and does not replace an existing
    # file: a fresh directory per case, or a case may read an earlier case's PTX
    os.environ["MXQ_CACHE_DIR"] = tempfile.mkdtemp(prefix="mxq-ptx-digest-")
    op = FusedOp(EPILOGUES[epi], QuantSpec(**v))
    ptx = compiler.compile_op(op, arch, dtype, keep_ptx=True, variant=variant).__ptx__
    body = normalise(ptx)
    return {"spec": v, "epilogue": epi, "dtype": dtype, "variant": variant, "arch": arch,
            "sha": hashlib.sha256(body.encode()).hexdigest()[:16], "lines": body.count("\n") + 1}


def _key(r) -> str:
    return json.dumps([r["spec"], r["epilogue"], r["dtype"], r["variant"], r["arch"]], sort_keys=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the digests here (JSON)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="every 7th case only")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two digest files")
    ap.add_argument("--preimport", metavar="MODULE", help="import this module in every worker first")
    args = ap.parse_args()
    if args.compare:
        a, b = ({_key(r): r for r in json.loads(Path(p).read_text())} for p in args.compare)
        same = [k for k in a if k in b and a[k]["sha"] == b[k]["sha"]]
        diff = [k for k in a if k in b and a[k]["sha"] != b[k]["sha"]]
        for k in diff:
            print("DIFFERENT", k, a[k]["lines"], "->", b[k]["lines"], "lines")
        print(f"{len(same)} identical, {len(diff)} different, {len(set(a) ^ set(b))} in one file only")
        return 1 if diff else 0
    cases = all_cases(args.quick)
    init = (importlib.import_module, (args.preimport,)) if args.preimport else (None, ())
    with ProcessPoolExecutor(args.jobs, initializer=init[0], initargs=init[1]) as ex:
        rows = list(ex.map(digest, cases, chunksize=4))
    print(f"{len(rows)} cases digested")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
