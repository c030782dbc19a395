"""NVFP4 and MXFP4 (format="nvfp4" / "mxfp4") on the GPU against a device copy.

    python bench/fp4.py [--out DIR] [--quick] [--variants 'k=v,...;k=v'] [--rows NAME,...]
    python bench/fp4.py --launch ROW [--shape MxN] [--variants 'k=v,...']   (bench/ncu.py's run)

At 8192^2, 16384^2, 4096 x 14336 and 32768 x 4096 (bf16; --quick: the first two), each row is
checked against the reference on the GPU (byte for byte: plain casts are exact) and timed by
bench/device_check.py's busy-GPU method against a 1 GiB copy. MXQ_STRICT=1 is set: a row the
kernels do not serve (yet) is listed with its error instead of timing the torch reference. Rows:
MXFP4 rowwise and both directions (floor, rceil), NVFP4 rowwise with a given global amax (one launch) and without
(the amax launch counted), both directions, with the Hadamard transform, with stochastic
rounding (rowwise, both directions; each also with a given global amax, ``_given``), gelu, and
grouped rowwise calls of 64 random expert groups (``_grouped64``; NVFP4's amax per group), and
both directions from fp32 inputs (``_fp32``: the vectorised kernel's colwise copy).
Results: <out>/<device>-<date>-fp4.json.
``--launch ROW``: only build one row's op at one shape under the first variant and launch it 4
times, for a profiler (bench/ncu.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import device_check as dc  # noqa: E402

import mxq  # noqa: E402
from mxq.testing import compare  # noqa: E402

SHAPES = [(8192, 8192), (16384, 16384), (4096, 14336), (32768, 4096)]


def moved(m, n, fmt, rowwise=True, colwise=False):
    """Bytes the op must move: the bf16 input read once, E2M1 data (two per byte) and one scale
    byte per block written once per direction."""
    per = 16 if fmt == "nvfp4" else 32
    return 2 * m * n + (rowwise + colwise) * (m * n // 2 + -(-m * n // per))


def cases(m, n):
    """name -> (quantize options, moved bytes, exact, wants a given global amax, row groups: 0 for
    an ungrouped call, else that many random expert groups, group_offsets)."""
    nv = dict(format="nvfp4")
    rows = {
        "mxfp4_rowwise_floor": (dict(format="mxfp4"), moved(m, n, "mxfp4"), True, False),
        "mxfp4_rowwise_rceil": (dict(format="mxfp4", scale_mode="rceil"), moved(m, n, "mxfp4"), True, False),
        "mxfp4_both_floor": (dict(format="mxfp4", colwise=True), moved(m, n, "mxfp4", True, True), True, False),
        "mxfp4_both_rceil": (dict(format="mxfp4", colwise=True, scale_mode="rceil"), moved(m, n, "mxfp4", True, True),
                             True, False),
        "nvfp4_rowwise_given_amax": (dict(nv), moved(m, n, "nvfp4"), True, True),
        "nvfp4_rowwise": (dict(nv), moved(m, n, "nvfp4"), True, False),
        "nvfp4_both": (dict(nv, colwise=True), moved(m, n, "nvfp4", True, True), True, False),
        "nvfp4_both_given": (dict(nv, colwise=True), moved(m, n, "nvfp4", True, True), True, True),
        "nvfp4_both_hadamard": (dict(nv, colwise=True, hadamard=True), moved(m, n, "nvfp4", True, True), True, False),
        "nvfp4_rowwise_sr": (dict(nv, stochastic_rounding=True), moved(m, n, "nvfp4"), True, False),
        "nvfp4_both_sr": (dict(nv, colwise=True, stochastic_rounding=True), moved(m, n, "nvfp4", True, True), True,
                          False),
        "nvfp4_rowwise_sr_given": (dict(nv, stochastic_rounding=True), moved(m, n, "nvfp4"), True, True),
        "nvfp4_both_sr_given": (dict(nv, colwise=True, stochastic_rounding=True), moved(m, n, "nvfp4", True, True),
                                True, True),
        "nvfp4_gelu_rowwise": (dict(nv, act="gelu"), moved(m, n, "nvfp4"), False, False),
        "nvfp4_2d_rowwise": (dict(nv, block_2d=True), moved(m, n, "nvfp4"), True, False),
        "nvfp4_2d_both": (dict(nv, colwise=True, block_2d=True), moved(m, n, "nvfp4", True, True), True, False),
        # (a gradient's backward: drelu with dbias and both copies; the dact input is a second [M, N] read)
        "nvfp4_drelu_dbias_both_given": (dict(nv, colwise=True, dact="relu", dbias=True),
                                         moved(m, n, "nvfp4", True, True) + 2 * m * n + 2 * n, True, True),
        "mxfp4_drelu_dbias_both": (dict(format="mxfp4", colwise=True, dact="relu", dbias=True),
                                   moved(m, n, "mxfp4", True, True) + 2 * m * n + 2 * n, True, False),
    }
    rows = {name: (*row, 0) for name, row in rows.items()}
    rows["mxfp4_rowwise_grouped64"] = (dict(format="mxfp4"), moved(m, n, "mxfp4"), True, False, 64)
    rows["nvfp4_rowwise_grouped64"] = (dict(nv), moved(m, n, "nvfp4"), True, False, 64)
    # (grouped with the colwise copy: each group's 32-row tiles from its first row; a known amax per group)
    rows["mxfp4_both_grouped64"] = (dict(format="mxfp4", colwise=True), moved(m, n, "mxfp4", True, True), True,
                                    False, 64)
    rows["nvfp4_both_given_grouped64"] = (dict(nv, colwise=True), moved(m, n, "nvfp4", True, True), True, True, 64)
    # (fp32 inputs, as_input: the colwise copy on the vectorised kernel; the input read is 4 bytes an element)
    rows["mxfp4_both_fp32"] = (dict(format="mxfp4", colwise=True), moved(m, n, "mxfp4", True, True) + 2 * m * n,
                               True, False, 0)
    rows["nvfp4_both_given_fp32"] = (dict(nv, colwise=True), moved(m, n, "nvfp4", True, True) + 2 * m * n, True,
                                     True, 0)
    return rows


def as_input(name: str, x: torch.Tensor) -> torch.Tensor:
    """A row's input: ``x`` itself, or fp32 for a row named ``*_fp32``."""
    return x.float() if name.endswith("_fp32") else x


def group_offsets(m: int, groups: int, device) -> torch.Tensor:
    """``groups`` random expert groups of the m rows (a fixed seed; some empty), int32 ends, each
    even (the colwise copy packs two rows a byte)."""
    g = torch.Generator().manual_seed(m + groups)
    cuts = torch.sort(torch.randint(0, m // 2 + 1, (groups - 1,), generator=g)).values * 2
    return torch.cat([cuts, torch.tensor([m])]).to(torch.int32).to(device)


def prepared(opts, given, x, variant="", groups=0):
    """(op, launch, outputs, call keywords) of one row's op on ``x`` (``variant``: a Tuning
    variant; ``given``: the global amax passed in; stochastic rounding seeded; ``groups``: that
    many random row groups)."""
    op = mxq.fused_quant(**opts)(dc.identity)
    if variant:
        op._with_tuning(dc.make_tuning(dc.parse_tuning(variant)))
    kw = {"global_amax": x.float().abs().amax().reshape(1)} if given else {}
    if groups:
        kw["group_offsets"] = group_offsets(x.shape[0], groups, x.device)
    if opts.get("stochastic_rounding"):
        kw["seed"] = 1
    if opts.get("dact"):  # (the forward's input: x's rows in reverse order)
        kw["act_input"] = x.flip(0)
    launch, out = op.prepare(x, **kw)
    return op, launch, out, kw


def run(name, opts, mv, exact, given, groups, x, copy_gbps, variant=""):
    m, n = x.shape
    prefix = f"mxq[{variant}]" if variant else "mxq"
    try:
        op, launch, out, kw = prepared(opts, given, x, variant, groups)
        launch()
        problems = compare(out, op.reference(x, **kw), exact)  # (stochastic rounding too: seeded, exact)
        return dc.printed_row(launch, mv, copy_gbps, f"{prefix}/{name}", m, n, problems)
    except Exception as exc:  # (a row not served yet: say why)
        return dc.error_row(f"{prefix}/{name}", m, n, exc)


def launch_only(row: str, m: int, n: int, variant: str = ""):
    """Build ``row``'s op on a random bf16 [m, n] input and launch it 4 times, for a profiler."""
    torch.manual_seed(m + n)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    opts, _, _, given, groups = cases(m, n)[row]
    launch = prepared(opts, given, as_input(row, x), variant, groups)[1]
    dc.launch_for_profiler(launch)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", default="", help="only these of the shapes, e.g. '4096x14336,32768x4096' "
                    "(a run that a device call's time limit would cut, in parts)")
    ap.add_argument("--variants", default="", help="Tuning variants 'k=v,...;k=v' timed after the default")
    ap.add_argument("--rows", default="", help="only these rows, e.g. 'mxfp4_both_floor,nvfp4_both_given'")
    ap.add_argument("--launch", choices=list(cases(128, 128)), help="only build one row's op and launch it 4 "
                    "times (a profiler's run)")
    ap.add_argument("--shape", default="8192x8192", help="with --launch: MxN")
    args = ap.parse_args(argv)
    unknown = [r for r in filter(None, args.rows.split(",")) if r not in cases(128, 128)]
    if unknown:
        ap.error(f"--rows: {unknown} not among {list(cases(128, 128))}")
    if args.launch:
        return launch_only(args.launch, *dc.parse_shape(args.shape), args.variants.split(";")[0])
    os.environ["MXQ_STRICT"] = "1"  # (a fallback raises: no row times the reference)
    copy_gbps = dc.copy_bandwidth()
    print(f"copy: {copy_gbps:.0f} GB/s", flush=True)
    dev = torch.cuda.get_device_name()
    rows = []
    for m, n in dc.pick_shapes(args.shapes, args.quick, SHAPES):
        torch.manual_seed(m + n)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        for variant in ["", *filter(None, args.variants.split(";"))]:
            for name, (opts, mv, exact, given, groups) in cases(m, n).items():
                if args.rows and name not in args.rows.split(","):
                    continue
                rows.append(run(name, opts, mv, exact, given, groups, as_input(name, x), copy_gbps, variant))
        dc.write_results(args.out, dev, {"device": dev, "copy_GBps": round(copy_gbps, 1), "torch": torch.__version__,
                                         "rows": rows}, "-fp4")


if __name__ == "__main__":
    main()
