"""Grouped quantize on the GPU (row groups, as mixture-of-experts training uses).

    python bench/grouped.py [--out DIR] [--no-peers] [--variants 'k=v,...;k=v']

For G = 8, 64, 256 groups of random sizes (seeded; empty groups possible, sizes not multiples of
32) totalling 32768 rows, at K = 4096 and 7168, bf16: mxq's one grouped launch (rowwise +
colwise, swizzled and compact scales) against a device copy, each checked byte for byte against
the reference first; the ungrouped call of the same shape for comparison; and the composition a
torchao user runs today (pad the groups to 32 rows, quantize dim0 and dim1, rearrange the scales
per group), each piece timed on its own and as a whole where it runs; a piece that cannot run
here (Hopper) is listed with its error. Timing: bench/device_check.py's busy-GPU method.
``--variants``: Tuning variants of mxq's grouped call (device_check.parse_tuning's form, e.g.
'group_search=block;group_search=warps'), each checked byte-equal to the default's outputs and
timed beside it in the same run.
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

from mxq.op import FusedOp  # noqa: E402
from mxq.frontend.spec import QuantSpec  # noqa: E402
from mxq.runtime.call import Call  # noqa: E402
from mxq.testing import compare  # noqa: E402

TOKENS = 32768


def group_sizes(groups: int, seed: int) -> list[int]:
    """Random sizes summing to TOKENS: a multinomial draw over the groups (router-like skew)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(groups, generator=g) ** 2
    counts = torch.multinomial(weights, TOKENS, replacement=True, generator=g)
    return torch.bincount(counts, minlength=groups).tolist()


def moved(m, k, groups, layout):
    """Bytes a grouped rowwise + colwise call must move: bf16 in, two FP8 copies, both scales
    (their exact buffer sizes)."""
    if layout == "swizzled":
        nb = -(-k // 32)
        scales = (m + 128 * groups) * (-(-nb // 4) * 4) + (m // 32 + 4 * groups) * (-(-k // 128) * 128)
    else:
        scales = m * (-(-k // 32)) + (m // 32 + groups) * k
    return m * k * 2 + 2 * m * k + scales


OUTPUTS = ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale")


def mxq_rows(copy_gbps, x, offs, groups, variants: str = ""):
    """mxq's grouped rowwise + colwise call, swizzled and compact, checked against the reference;
    then each Tuning variant of ``variants`` ('k=v,...;k=v'), checked byte-equal to it."""
    rows = []
    m, k = x.shape
    for layout in ("swizzled", "compact"):
        base = None
        for variant in ["", *filter(None, variants.split(";"))]:
            op = FusedOp(dc.identity, QuantSpec(rowwise=True, colwise=True, scale_layout=layout))
            if variant:
                op._with_tuning(dc.make_tuning(dc.parse_tuning(variant)))
            fn, args, out = op._launcher_for(x).bind(Call([x], [], group_offsets=offs), ("full",))
            fn(*args)
            if base is None:
                try:  # the torch reference runs on the GPU too (the CPU takes minutes at these sizes)
                    want = op.reference(x, group_offsets=offs)
                except Exception:
                    want = op.reference(x.cpu(), group_offsets=offs.cpu())
                problems = compare(out, want, exact=True)
                base, check = out, {"exact": problems == []}
            else:
                same = all(dc.same_bytes(getattr(out, f), getattr(base, f)) for f in OUTPUTS)
                problems, check = [], {"same_bytes_as_default": same}
            prefix = f"mxq[{variant}]" if variant else "mxq"
            row = dc.timed_row(lambda: fn(*args), moved(m, k, groups, layout), copy_gbps,
                               name=f"{prefix}/grouped_both_{layout}", M=m, N=k, G=groups, **check)
            rows.append(row)
            print(f"  {row['name']:52s} G={groups:<4d} {m}x{k} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of "
                  f"copy  {check} {problems[:2]}", flush=True)
    return rows


def torchao_pieces(x, offs):
    """The torchao MoE-training steps for rowwise + colwise MXFP8 of grouped tokens with blocked
    (swizzled) scales: name -> zero-argument callable, or the error that stopped it here."""
    pieces = {}
    try:
        import torchao.utils as tu

        tu.is_sm_at_least_100 = lambda: True  # the Triton casts run on sm_90 in FLOOR mode (device_check.py)
        from torchao.prototype.moe_training.kernels.mxfp8 import quant as q
        from torchao.prototype.mx_formats import kernels as tk
    except Exception as exc:
        return {"import": exc}

    def attempt(name, fn):
        try:
            out = fn()
            torch.cuda.synchronize()
            pieces[name] = fn
            return out
        except Exception as exc:
            pieces[name] = exc
            return None

    padded = attempt("pad (fused_pad_token_groups_cuda)", lambda: q.fused_pad_token_groups_cuda(x, offs, 32))
    if padded is None:
        padded = attempt("pad (torch_pad_token_groups, host sync)", lambda: q.torch_pad_token_groups(x, offs, 32))
    xp, _, padded_offs = padded if padded is not None else (x, None, offs)
    dim0 = attempt("quantize dim0 (mxfp8_quantize_2d_1x32_cutedsl)", lambda: q.mxfp8_quantize_2d_1x32_cutedsl(xp))
    if dim0 is None:
        dim0 = attempt("quantize dim0 (triton_to_mxfp8_dim0, floor)", lambda: tk.triton_to_mxfp8_dim0(xp, 32, "floor"))
    dim1 = attempt("quantize dim1 (mxfp8_quantize_2d_32x1_cutedsl)",
                   lambda: q.mxfp8_quantize_2d_32x1_cutedsl(xp, offs=padded_offs))
    if dim1 is None:
        dim1 = attempt("quantize dim1 (triton_to_mxfp8_dim1, floor)", lambda: tk.triton_to_mxfp8_dim1(xp, 32, "floor"))
    if dim0 is not None:
        s0 = dim0[1].view(torch.uint8) if dim0[1].dim() == 2 else dim0[1].view(torch.uint8).reshape(xp.shape[0], -1)
        if attempt("rearrange rowwise scales (mx_block_rearrange_2d_M_groups_cuda)",
                   lambda: q.mx_block_rearrange_2d_M_groups_cuda(s0, padded_offs.to(torch.int32))) is None:
            attempt("rearrange rowwise scales (triton_mx_block_rearrange_2d_M_groups)",
                    lambda: q.triton_mx_block_rearrange_2d_M_groups(s0, padded_offs.to(torch.int32)))
    if dim1 is not None:
        s1 = dim1[1].view(torch.uint8)
        s1 = s1 if s1.dim() == 2 else s1.reshape(xp.shape[1], -1)
        attempt("rearrange colwise scales (triton_mx_block_rearrange_2d_K_groups)",
                lambda: q.triton_mx_block_rearrange_2d_K_groups(s1, padded_offs.to(torch.int32)))
    return pieces


def torchao_rows(copy_gbps, x, offs, groups, mxq_us):
    m, k = x.shape
    rows, total, complete = [], 0.0, True
    for name, fn in torchao_pieces(x, offs).items():
        if isinstance(fn, Exception):
            print(f"  torchao {name}: cannot run here: {type(fn).__name__}: {str(fn)[:160]}", flush=True)
            rows.append(dict(name=f"torchao/{name}", M=m, N=k, G=groups, error=f"{type(fn).__name__}: {str(fn)[:300]}"))
            if not name.startswith("pad (fused") and "cutedsl" not in name and "_cuda" not in name:
                complete = False
            continue
        ms = dc.time_ms(fn)
        total += ms
        rows.append(dict(name=f"torchao/{name}", M=m, N=k, G=groups, ms=round(ms, 5)))
        print(f"  torchao {name:60s} {ms * 1000:8.1f} us", flush=True)
    if complete and total:
        row = dict(name="torchao/composition", M=m, N=k, G=groups, ms=round(total, 5),
                   pct_copy=round(100 * moved(m, k, groups, "swizzled") / total / 1e6 / copy_gbps, 1),
                   mxq_speedup=round(total * 1000 / mxq_us, 2))
        rows.append(row)
        print(f"  torchao composition (pieces that ran) {total * 1000:8.1f} us: mxq is {row['mxq_speedup']}x", flush=True)
    return rows


def probe_rows(copy_gbps):
    """Which direction costs the swizzled grouped layout its time at many groups: rowwise alone,
    colwise alone, each compact and swizzled, at G = 8 and 256 (K = 4096)."""
    rows = []
    x = torch.randn(TOKENS, 4096, device="cuda", dtype=torch.bfloat16)
    for groups in (8, 256):
        offs = torch.cumsum(torch.tensor(group_sizes(groups, seed=groups + 4096)), 0).to(torch.int32).cuda()
        for direction in ("rowwise", "colwise"):
            for layout in ("compact", "swizzled"):
                opts = dict(rowwise=direction == "rowwise", colwise=direction == "colwise", scale_layout=layout)
                op = FusedOp(dc.identity, QuantSpec(**opts))
                fn, args, out = op._launcher_for(x).bind(Call([x], [], group_offsets=offs), ("full",))
                m, k = x.shape
                row = dc.timed_row(lambda: fn(*args), m * k * 3 + m * k // 16, copy_gbps,
                                   name=f"probe/grouped_{direction}_{layout}", M=m, N=k, G=groups)
                rows.append(row)
                print(f"  {row['name']:36s} G={groups:<4d} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}%", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--probe", action="store_true", help="only the rowwise/colwise x compact/swizzled probe")
    ap.add_argument("--variants", default="", help="Tuning variants of mxq's grouped call, 'k=v,...;k=v' (e.g. "
                    "'group_search=block;group_search=warps'), timed beside the default")
    args = ap.parse_args()
    copy_gbps = dc.copy_bandwidth()
    print(f"copy: {copy_gbps:.0f} GB/s", flush=True)
    if args.probe:
        probe_rows(copy_gbps)
        return
    rows = []
    for k in (4096, 7168):
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16)
        plain = FusedOp(dc.identity, QuantSpec(rowwise=True, colwise=True, scale_layout="swizzled"))
        launch, _ = plain.prepare(x)
        row = dc.timed_row(launch, dc.moved_bytes(dict(rowwise=True, colwise=True), TOKENS, k), copy_gbps,
                           name="mxq/both_swizzled_ungrouped", M=TOKENS, N=k, G=0)
        rows.append(row)
        print(f"  {row['name']:30s}        {TOKENS}x{k} {row['ms'] * 1000:8.1f} us {row['pct_copy']:5.1f}% of copy", flush=True)
        for groups in (8, 64, 256):
            sizes = group_sizes(groups, seed=groups + k)
            offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32).cuda()
            mrows = mxq_rows(copy_gbps, x, offs, groups, args.variants)
            rows += mrows
            if not args.no_peers and groups == 64:
                rows += torchao_rows(copy_gbps, x, offs, groups, mrows[0]["ms"] * 1000)
            dev = torch.cuda.get_device_name()  # written after every step: a cut-off run keeps its rows
            dc.write_results(args.out, dev, {"device": dev, "copy_GBps": round(copy_gbps, 1), "tokens": TOKENS,
                                             "torch": torch.__version__, "rows": rows}, "-grouped")


if __name__ == "__main__":
    main()
