"""Gated activations on the GPU: SwiGLU forward and backward + dbias, rowwise + colwise, bf16,
against a device copy of the same bytes, each checked against the reference first; and the
mixture-of-experts form, grouped by random expert sizes (empty experts possible), beside the
ungrouped op of the same shape.

    python bench/gated.py [--out DIR] [--quick] [--grouped-only] [--layouts L,...] [--variants 'k=v,...;k=v']
    ncu -k regex:packed_kernel -s 2 -c 1 python bench/gated.py --launch fwd|bwd [--groups G] [--variants V] [--layouts L]

Shapes are the gated output's [M, N] (the input is [M, 2N]): forward reads 2MN inputs and writes
two [M, N] FP8 copies with scales; backward reads the [M, N] gradient and the [M, 2N] forward
input and writes two [M, 2N] FP8 copies with scales and a [2N] dbias. Timing: bench/device_check.py's
busy-GPU method on a prepared launch; the user-epilogue form over half views for comparison, and
the backward with Tuning(halves_one_cta=False) (one CTA per half instead of one for both).
``--variants``: Tuning variants of the grouped ops (device_check.parse_tuning's form, e.g.
'group_search=block;group_search=warps'), each timed in the same run beside the
default's row of the same case, its bytes checked equal to the default's first (every output).
``--layouts``: the grouped rows' scale layouts (LAYOUTS: MXFP8's compact and swizzled, and
``fp8_block``), all by default.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import device_check as dc  # noqa: E402

import mxq  # noqa: E402
from mxq.kernels.config import Tuning  # noqa: E402
from mxq.testing import compare, v_abs_sum, v_bound  # noqa: E402

SHAPES = [(8192, 8192), (16384, 16384), (4096, 14336), (32768, 4096), (8192, 4096), (32768, 2048)]
GROUPED_SHAPE = (32768, 2048)  # tokens x an expert's gated width N
GROUPS = (8, 64, 256)
LAYOUTS = ("compact", "swizzled", "fp8_block")  # the grouped rows' (grouped_ops)


def _ident(x):
    return x


@mxq.fused_quant(rowwise=True, colwise=True)
def swiglu_views(g, u):
    return mxq.silu(g) * u


def scale_bytes(m, n):
    return m * (n // 32) + (m // 32) * n


def fwd_bytes(m, n, groups=0):
    return m * 2 * n * 2 + 2 * m * n + scale_bytes(m, n) + groups * n


def bwd_bytes(m, n, groups=0):
    return m * n * 2 + m * 2 * n * 2 + 2 * (2 * m * n) + scale_bytes(m, 2 * n) + max(1, groups) * 2 * n * 2


def grouped_ops(layout: str, variant: str = ""):
    """(forward, backward + dbias) SwiGLU ops, rowwise + colwise with ``layout`` scales (MXFP8's
    "compact" or "swizzled"; "fp8_block": FP8 block scaling's 1x128 and 128-row blocks, compact),
    built as Tuning ``variant`` (device_check.parse_tuning's form; "": the library's). FP8 block
    scaling's fp32 scale per 128 elements moves as many bytes as MXFP8's byte per 32 (scale_bytes)."""
    opts = dict(rowwise=True, colwise=True, scale_layout=layout)
    if layout == "fp8_block":
        opts = dict(opts, format="fp8_block", scale_layout="compact")
    ops = (mxq.fused_quant(act="swiglu", **opts)(_ident), mxq.fused_quant(dact="swiglu", dbias=True, **opts)(_ident))
    if variant:
        for op in ops:
            op.inner._with_tuning(dc.make_tuning(dc.parse_tuning(variant)))  # (a gated op runs its inner op)
    return ops


def same_as(got, want) -> bool:
    """Every output of ``got`` byte-equal to ``want``'s (a variant against the default)."""
    fields = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax", "dbias")
    return all((getattr(got, f) is None) == (getattr(want, f) is None)
               and (getattr(got, f) is None or dc.same_bytes(getattr(got, f), getattr(want, f))) for f in fields)


def grouped_rows(copy_gbps, variants: str = "", layouts=LAYOUTS):
    """SwiGLU forward and backward + dbias, rowwise + colwise, over GROUPS random expert groups
    of GROUPED_SHAPE's tokens, compact and swizzled scales, each checked against the reference
    (within the transcendental class) first; each Tuning variant of ``variants`` ('k=v,...;k=v')
    checked byte-equal to the default and timed beside it; ``layouts``: of LAYOUTS."""
    from grouped import group_sizes  # (bench/grouped.py: router-like random sizes)

    m, n = GROUPED_SHAPE
    x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    names = ["", *filter(None, variants.split(";"))]
    rows = []
    for layout in layouts:
        built = {v: grouped_ops(layout, v) for v in names}
        fwd, bwd = built[""]
        plain = [("fwd", fwd.prepare(x)[0], fwd_bytes(m, n)), ("bwd", bwd.prepare(g, act_input=x)[0], bwd_bytes(m, n))]
        for what, launch, moved in plain:
            row = dc.timed_row(launch, moved, copy_gbps, name=f"mxq/swiglu_{what}_both_{layout}", M=m, N=n, G=0)
            rows.append(row)
            print(f"  {row['name']:36s} G=0    {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of copy", flush=True)
        for groups in GROUPS:
            offs = torch.cumsum(torch.tensor(group_sizes(groups, seed=groups + n)), 0).to(torch.int32).cuda()
            rows += grouped_case(built, x, g, offs, copy_gbps, layout)
    return rows


def grouped_case(built: dict, x, g, offs, copy_gbps, layout: str) -> list:
    """Rows of one grouping ``offs``: the default ops (checked against the reference) and each
    variant of ``built`` (variant -> (fwd, bwd); checked byte-equal to the default), interleaved
    per direction."""
    m, n = GROUPED_SHAPE
    groups = offs.numel()
    fwd, bwd = built[""]
    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    v_abs = v_abs_sum(bwd.inner, g, x[:, :n], x[:, n:], 0.0, group_offsets=offs)
    base = {"fwd": fwd(x, group_offsets=offs), "bwd": bwd(g, act_input=x, group_offsets=offs)}
    checks = {"fwd": compare(base["fwd"], fwd.reference(x, group_offsets=offs), False) == [],
              "bwd": compare(base["bwd"], bwd.reference(g, act_input=x, group_offsets=offs), False, v_abs,
                             v_bound=v_bound(bwd, g, act_input=x)) == [],
              "empty_groups": int((sizes == 0).sum())}
    rows = []
    for what in ("fwd", "bwd"):
        for variant, (vf, vb) in built.items():
            op, args, kw = (vf, (x,), {}) if what == "fwd" else (vb, (g,), {"act_input": x})
            mine = checks
            if variant:
                mine = {"same_bytes_as_default": same_as(op(*args, group_offsets=offs, **kw), base[what])}
            launch = op.prepare(*args, group_offsets=offs, **kw)[0]
            moved = (fwd_bytes if what == "fwd" else bwd_bytes)(m, n, groups)
            prefix = f"mxq[{variant}]" if variant else "mxq"
            row = dc.timed_row(launch, moved, copy_gbps, name=f"{prefix}/swiglu_{what}_both_{layout}_grouped",
                               M=m, N=n, G=groups, checks=mine)
            rows.append(row)
            print(f"  {row['name']:72s} G={groups:<4d} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of "
                  f"copy {mine}", flush=True)
    return rows


def launch_only(what: str, groups: int, variant: str = "", layout: str = LAYOUTS[0]):
    """Build GROUPED_SHAPE's swiglu forward or backward + dbias (both directions, ``layout``'s
    scales, of LAYOUTS; ``groups`` > 0: grouped like grouped_rows; ``variant``: a Tuning variant,
    grouped_ops) and launch it 4 times, for a profiler."""
    from grouped import group_sizes

    m, n = GROUPED_SHAPE
    x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    offs = None
    if groups:
        offs = torch.cumsum(torch.tensor(group_sizes(groups, seed=groups + n)), 0).to(torch.int32).cuda()
    fwd, bwd = grouped_ops(layout, variant)
    if what == "fwd":
        launch = fwd.prepare(x, group_offsets=offs)[0]
    else:
        launch = bwd.prepare(g, act_input=x, group_offsets=offs)[0]
    dc.launch_for_profiler(launch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", choices=("fwd", "bwd"), help="only build and launch one op 4 times (a profiler's run)")
    ap.add_argument("--groups", type=int, default=0, help="with --launch: the group count (0: ungrouped)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    ap.add_argument("--grouped-only", action="store_true", help="only the grouped rows and their ungrouped twins")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"the grouped rows' scale layouts, of {LAYOUTS}")
    ap.add_argument("--variants", default="", help="Tuning variants of the grouped ops, 'k=v,...;k=v' (e.g. "
                    "'group_search=block;group_search=warps'), timed beside the default")
    args = ap.parse_args()
    layouts = tuple(filter(None, args.layouts.split(",")))
    if not set(layouts) <= set(LAYOUTS):
        ap.error(f"--layouts: {sorted(set(layouts) - set(LAYOUTS))} not among {LAYOUTS}")
    if args.launch:
        launch_only(args.launch, args.groups, args.variants.split(";")[0], layouts[0])  # (the first variant
        # and layout, if any)
        return
    copy_gbps = dc.copy_bandwidth()
    print(f"copy: {copy_gbps:.0f} GB/s", flush=True)
    rows = grouped_rows(copy_gbps, args.variants, layouts)
    fwd = mxq.fused_quant(act="swiglu", rowwise=True, colwise=True)(_ident)
    bwd = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident)
    # the same backward with one CTA per half (the default writes both halves from one CTA)
    bwd2 = mxq.fused_quant(dact="swiglu", rowwise=True, colwise=True, dbias=True)(_ident).inner
    bwd2._with_tuning(Tuning(halves_one_cta=False))
    for m, n in [] if args.grouped_only else SHAPES[:1] if args.quick else SHAPES:
        x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        checks = {}
        if m * n <= 2 ** 26:  # the reference on the GPU (torch ops) for the check
            checks["fwd"] = compare(fwd(x), fwd.reference(x), exact=False) == []
            checks["views"] = compare(swiglu_views(x[:, :n], x[:, n:]), fwd(x), exact=True) == []
            v_abs = v_abs_sum(bwd.inner, g, x[:, :n], x[:, n:], 0.0)
            bound = v_bound(bwd, g, act_input=x)
            checks["bwd"] = compare(bwd(g, act_input=x), bwd.reference(g, act_input=x), False, v_abs,
                                    v_bound=bound) == []
            checks["bwd_2cta"] = compare(bwd2(g, x[:, :n], x[:, n:], 0.0), bwd.reference(g, act_input=x), False,
                                         v_abs, v_bound=bound) == []
        cases = [
            ("mxq/swiglu_fwd_both", fwd.prepare(x)[0], fwd_bytes(m, n)),
            ("mxq/swiglu_views_both", swiglu_views.prepare(x[:, :n], x[:, n:])[0], fwd_bytes(m, n)),
            ("mxq/swiglu_bwd_dbias_both", bwd.prepare(g, act_input=x)[0], bwd_bytes(m, n)),
            ("mxq/swiglu_bwd_dbias_both_2cta", bwd2.prepare(g, x[:, :n], x[:, n:], 0.0)[0], bwd_bytes(m, n)),
        ]
        for name, launch, moved in cases:
            row = dc.timed_row(launch, moved, copy_gbps, name=name, M=m, N=n, checks=checks)
            rows.append(row)
            print(f"  {name:28s} {m:6d}x{n:<6d} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of copy "
                  f"({row['pct_equal_copy']:5.1f}% of an equal copy) {checks}", flush=True)
    dev = torch.cuda.get_device_name()
    dc.write_results(args.out, dev, {"device": dev, "copy_GBps": round(copy_gbps, 1), "torch": torch.__version__,
                                     "rows": rows}, "-gated")


if __name__ == "__main__":
    main()
