"""FP8 block scaling (format="fp8_block") on the GPU against torchao's Triton block-scaling kernels.

    python bench/fp8_block.py [--out DIR] [--no-peers] [--quick] [--step] [--rows a,b] [--variants 'k=v,...;k=v']
    python bench/fp8_block.py --launch ROW [--shape MxN] [--variants 'k=v,...']   (bench/ncu.py's run)

At 8192^2, 16384^2, 4096 x 14336 and 32768 x 4096 (bf16; --quick: the first two), each of mxq's
rows (1x128 rowwise compact and GEMM-ready, 128-row colwise compact and transposed, both, both with
amax, 128x128 tiles rowwise and both, gelu, dgelu + dbias, a user epilogue with a bias, SwiGLU
forward; fp32 inputs: 128x128 tiles and the transposed copy, ``fp32_cases``) is checked against
the reference on the GPU (exact class:
byte for byte; transcendental: mxq.testing.compare's class), then timed by
bench/device_check.py's busy-GPU method against a 1 GiB copy; torchao's kernels on the same
input (1x128 lhs, 128x1 rhs, the transposed lhs, 128x128 weights) are timed in the same process
and paired with mxq's row of the same output (``vs_torchao``: torchao's time / mxq's). A row mxq
does not serve (yet) is listed with its error. ``--step``: also one training step (forward and
backward) of examples/fp8_block_linear.py's FP8BlockMLP at an MLP shape against the same step in
bf16 (``vs_bf16``: the bf16 step's time / the FP8 step's). ``--variants``: the rows on the
128-row tile (colwise and both, compact and transposed, dgelu + dbias + both) again under each
Tuning variant (device_check.parse_tuning's form, e.g. 'rows128_min_blocks=2'; 'ops=a+b' limits a
variant to those rows), checked the same way; the transposed copy's input staging, old and new
forms beside the library's choice and torchao's transposed kernel: ``--quick --rows
colwise_compact,colwise_gemm,both_gemm --variants
'tr_stage=regs,ops=colwise_gemm;tr_stage=stage,ops=colwise_gemm+both_gemm;tr_stage=park,ops=both_gemm'``.
``--rows``: only those of mxq's rows (torchao's kernels all the same). Results:
<out>/<device>-<date>-fp8-block.json. ``--launch ROW``: only build one row's op (a name of
mxq_cases, or torchao/<kernel>) at one shape under the first variant and launch it 4 times, for a
profiler (bench/ncu.py).
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
from mxq.testing import compare, v_abs_sum, v_bound  # noqa: E402

SHAPES = [(8192, 8192), (16384, 16384), (4096, 14336), (32768, 4096)]


def scale_bytes(m, n, rowwise, colwise):
    """fp32 scales: one per 1x128 row block and one per 128-row column block."""
    return 4 * (rowwise * m * -(-n // 128) + colwise * -(-m // 128) * n)


def moved(m, n, rowwise=True, colwise=False, inputs=1, extra=0):
    """Bytes the op must move: its bf16 inputs read once, FP8 data and fp32 scales written once."""
    return 2 * m * n * inputs + (rowwise + colwise) * m * n + scale_bytes(m, n, rowwise, colwise) + extra


def tile_moved(m, n, copies=1):
    """Bytes of a 128x128-tile op: bf16 read once, ``copies`` FP8 copies and their fp32 tile scales."""
    return 2 * m * n + copies * (m * n + 4 * -(-m // 128) * -(-n // 128))


def mxq_cases(m, n):
    """name -> (op, args, kwargs, moved bytes, exact)."""
    fb = dict(format="fp8_block")
    cases = {
        "rowwise_compact": (dict(fb), moved(m, n), True),
        "rowwise_gemm": (dict(fb, scale_layout="gemm"), moved(m, n), True),
        "colwise_compact": (dict(fb, rowwise=False, colwise=True), moved(m, n, False, True), True),
        "both_compact": (dict(fb, colwise=True), moved(m, n, True, True), True),
        "colwise_gemm": (dict(fb, rowwise=False, colwise=True, scale_layout="gemm"), moved(m, n, False, True), True),
        "both_gemm": (dict(fb, colwise=True, scale_layout="gemm"), moved(m, n, True, True), True),
        "both_amax_compact": (dict(fb, colwise=True, amax=True), moved(m, n, True, True), True),
        "tiles_rowwise_gemm": (dict(fb, block=(128, 128), scale_layout="gemm"), tile_moved(m, n), True),
        "tiles_both_gemm": (dict(fb, block=(128, 128), colwise=True, scale_layout="gemm"), tile_moved(m, n, 2), True),
        "gelu_rowwise_gemm": (dict(fb, act="gelu", scale_layout="gemm"), moved(m, n), False),
        "dgelu_dbias_both": (dict(fb, colwise=True, dact="gelu", dbias=True), moved(m, n, True, True, 2, 2 * n), False),
    }
    return cases


# (--variants: the 128-row tile's rows; the transposed copy's two rows are the ones Tuning.tr_stage switches)
EXTRA_ROWS = ("bias_gelu_rowwise_gemm", "swiglu_fwd_rowwise", "swiglu_bwd_dbias_both_gemm",
              "fp32_swiglu_bwd_dbias_both_gemm")  # (beside mxq_cases)


def fp32_cases(m, n):
    """name -> (options, moved bytes) of fp32 inputs (master weights: 128x128 tiles; the
    vectorised kernel's 128-row tile), the input read 4 bytes an element; each exact."""
    fb = dict(format="fp8_block")
    return {
        "fp32_tiles_rowwise_gemm": (dict(fb, block=(128, 128), scale_layout="gemm"), tile_moved(m, n) + 2 * m * n),
        "fp32_tiles_both_compact": (dict(fb, block=(128, 128), colwise=True), tile_moved(m, n, 2) + 2 * m * n),
        "fp32_tiles_both_gemm": (dict(fb, block=(128, 128), colwise=True, scale_layout="gemm"),
                                 tile_moved(m, n, 2) + 2 * m * n),
        "fp32_both_gemm": (dict(fb, colwise=True, scale_layout="gemm"), moved(m, n, True, True) + 2 * m * n),
    }
TILE128_ROWS = ("colwise_compact", "both_compact", "colwise_gemm", "both_gemm", "dgelu_dbias_both")


def prepared(opts, ins, kw, fn=None, tuning=None):
    """(op, launch, outputs) of ``opts``' op over ``fn`` (default the identity) on ``ins``,
    compiled with ``tuning`` (parse_tuning's dict; None: the library's)."""
    op = mxq.fused_quant(**opts)(fn or dc.identity)
    if tuning:
        op._with_tuning(dc.make_tuning(tuning))
    launch, out = op.prepare(*ins, **kw)
    return op, launch, out


def run_mxq(name, opts, mv, exact, x, copy_gbps, kw=None, fn=None, args=None, tuning=None):
    """One checked and timed row of an op on ``args`` (default [x]), compiled with ``tuning``
    (parse_tuning's dict; None: the library's); the row is named by x's shape."""
    m, n = x.shape
    try:
        ins, kw = args or [x], kw or {}
        op, launch, out = prepared(opts, ins, kw, fn, tuning)
        launch()
        want = op.reference(*ins, **kw)
        if exact:
            problems = compare(out, want, True)
        else:  # (the transcendental class, as the tests check it: v's bound for the bytes, its |v| sums for dbias)
            v_abs = v_abs_sum(op, *ins, **kw) if op.spec.dbias else None
            problems = compare(out, want, False, v_abs, v_bound=v_bound(op, *ins, **kw))
        return dc.printed_row(launch, mv, copy_gbps, f"mxq/{name}", m, n, problems)
    except Exception as exc:  # (a row not served yet: say why)
        return dc.error_row(f"mxq/{name}", m, n, exc)


TORCHAO_KERNELS = {"rowwise": "triton_fp8_blockwise_act_quant_lhs", "colwise": "triton_fp8_blockwise_act_quant_rhs",
                   "transposed": "triton_fp8_blockwise_act_quant_transposed_lhs",
                   "weight_128x128": "triton_fp8_blockwise_weight_quant_rhs"}  # (our name: torchao's function)


def torchao_kernels():
    try:
        from torchao.prototype.blockwise_fp8_training import kernels as k
    except Exception as exc:
        print(f"  torchao: cannot import: {exc}", flush=True)
        return {}
    return {name: getattr(k, fn) for name, fn in TORCHAO_KERNELS.items()}


def run_torchao(name, fn, x, mv, copy_gbps):
    m, n = x.shape
    try:
        fn(x)
        torch.cuda.synchronize()
        return dc.printed_row(lambda: fn(x), mv, copy_gbps, f"torchao/{name}", m, n)
    except Exception as exc:
        return dc.error_row(f"torchao/{name}", m, n, exc, "cannot run")


def pair(rows, mine, theirs, label):
    a = next((r for r in rows if r["name"] == mine and "ms" in r), None)
    b = [next((r for r in rows if r["name"] == t and "ms" in r), None) for t in theirs]
    if a is None or None in b:
        return None
    ms = sum(r["ms"] for r in b)
    row = dict(name=f"pair/{label}", M=a["M"], N=a["N"], mxq_ms=a["ms"], torchao_ms=round(ms, 5),
               vs_torchao=round(ms / a["ms"], 3))
    print(f"  {row['name']:28s} mxq {a['ms'] * 1000:7.1f} us, torchao {ms * 1000:7.1f} us: {row['vs_torchao']}x", flush=True)
    return row


def step_rows(copy_gbps, m=8192, d_in=4096, hidden=14336):
    """One training step (forward + backward) of the example's FP8BlockMLP against the bf16 MLP,
    same weights and batch (the FP8 step quantizes the weights every step, as the example does)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "fp8_block_linear.py"
    spec = importlib.util.spec_from_file_location("fp8_block_linear", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    torch.manual_seed(0)
    x = torch.randn(m, d_in, device="cuda", dtype=torch.bfloat16)
    params = [(torch.randn(hidden, d_in, device="cuda") / d_in ** 0.5).bfloat16().requires_grad_(),
              torch.zeros(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True),
              (torch.randn(d_in, hidden, device="cuda") / hidden ** 0.5).bfloat16().requires_grad_(),
              torch.zeros(d_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)]
    dy = torch.randn(m, d_in, device="cuda", dtype=torch.bfloat16)
    rows = {}
    for name, fwd in (("fp8_block", ex.FP8BlockMLP.apply), ("bf16", ex.bf16_mlp)):
        try:
            rows[name] = dc.time_ms(lambda: fwd(x, *params).backward(dy), iters=20)
        except Exception as exc:
            print(f"  step {name} cannot run: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    if len(rows) < 2:
        return []
    row = dict(name="step/mlp_fwd_bwd", M=m, N=d_in, hidden=hidden, fp8_ms=round(rows["fp8_block"], 4),
               bf16_ms=round(rows["bf16"], 4), vs_bf16=round(rows["bf16"] / rows["fp8_block"], 3))
    print(f"  MLP step {m}x{d_in}->{hidden}: fp8_block {rows['fp8_block']:.3f} ms, bf16 {rows['bf16']:.3f} ms: "
          f"{row['vs_bf16']}x", flush=True)
    return [row]


def launch_rows() -> list:
    """The rows --launch accepts: mxq_cases' names and torchao's kernels (torchao/<name>)."""
    return list(mxq_cases(128, 128)) + [f"torchao/{k}" for k in TORCHAO_KERNELS]


def launch_only(row: str, m: int, n: int, variant: str = ""):
    """Build ``row``'s op (or torchao's kernel) on a random bf16 [m, n] input and launch it 4
    times, for a profiler."""
    torch.manual_seed(m + n)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    if row.startswith("torchao/"):
        peers = torchao_kernels()
        if not peers:
            raise SystemExit(f"{row}: torchao's kernels cannot be imported here")
        fn = peers[row.split("/", 1)[1]]
        launch = lambda: fn(x)  # noqa: E731
    else:
        opts = mxq_cases(m, n)[row][0]
        kw = {"act_input": torch.randn_like(x)} if "dact" in opts else {}
        tuning = dc.parse_tuning(variant) if variant else {}
        tuning.pop("ops", None)  # (a row named already)
        launch = prepared(opts, [x], kw, tuning=tuning or None)[1]
    dc.launch_for_profiler(launch)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", default="", help="only these of the shapes, e.g. '4096x14336,32768x4096' "
                    "(a run that a device call's time limit would cut, in parts)")
    ap.add_argument("--step", action="store_true", help="also the example's training step against bf16")
    ap.add_argument("--variants", default="", help="also the 128-row tile's rows under Tuning variants, "
                    "e.g. 'rows128_min_blocks=2;rows128_min_blocks=3'")
    ap.add_argument("--launch", choices=launch_rows(), help="only build one row's op and launch it 4 times "
                    "(a profiler's run)")
    ap.add_argument("--shape", default="8192x8192", help="with --launch: MxN")
    ap.add_argument("--rows", default="", help="only these of mxq's rows (comma-separated: names of "
                    "mxq_cases, bias_gelu_rowwise_gemm, swiglu_fwd_rowwise); torchao's kernels all the same")
    args = ap.parse_args(argv)
    keep = set(filter(None, args.rows.split(",")))
    unknown = keep - set(mxq_cases(128, 128)) - set(EXTRA_ROWS) - set(fp32_cases(128, 128))
    if unknown:
        raise SystemExit(f"--rows: no such rows {sorted(unknown)}")
    wanted = lambda name: not keep or name in keep  # noqa: E731
    if args.launch:
        return launch_only(args.launch, *dc.parse_shape(args.shape), args.variants.split(";")[0])
    copy_gbps = dc.copy_bandwidth()
    print(f"copy: {copy_gbps:.0f} GB/s", flush=True)
    dev = torch.cuda.get_device_name()
    peers = {} if args.no_peers else torchao_kernels()
    rows = step_rows(copy_gbps) if args.step else []
    for m, n in dc.pick_shapes(args.shapes, args.quick, SHAPES):
        torch.manual_seed(m + n)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for name, (opts, mv, exact) in mxq_cases(m, n).items():
            if not wanted(name):
                continue
            kw = {"act_input": torch.randn_like(x)} if "dact" in opts else None
            rows.append(run_mxq(name, opts, mv, exact, x, copy_gbps, kw=kw))
            for variant in filter(None, args.variants.split(";")) if name in TILE128_ROWS else ():
                tuning = dc.parse_tuning(variant)
                if name in tuning.pop("ops", name).split("+"):  # ('ops=a+b': those rows alone)
                    rows.append(run_mxq(f"{name}[{variant}]", opts, mv, exact, x, copy_gbps, kw=kw, tuning=tuning))
        if wanted("bias_gelu_rowwise_gemm"):
            rows.append(run_mxq("bias_gelu_rowwise_gemm", dict(format="fp8_block", act="gelu", scale_layout="gemm"),
                                moved(m, n, extra=2 * n), False, x, copy_gbps, fn=dc.bias_gelu, args=[x, b]))
        if wanted("swiglu_fwd_rowwise"):
            gu = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
            rows.append(run_mxq("swiglu_fwd_rowwise", dict(format="fp8_block", act="swiglu"),
                                moved(m, n, inputs=2), False, x, copy_gbps, args=[gu]))  # (x: the output's shape)
        if wanted("swiglu_bwd_dbias_both_gemm"):  # (x: the gradient [M, N]; outputs [M, 2N], the transposed copy)
            gu = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
            rows.append(run_mxq("swiglu_bwd_dbias_both_gemm", dict(format="fp8_block", dact="swiglu", dbias=True,
                                                                    colwise=True, scale_layout="gemm"),
                                moved(m, 2 * n, True, True, extra=2 * m * n + 4 * n), False, x, copy_gbps,
                                kw={"act_input": gu}))
        x32 = None
        for name, (opts, mv) in fp32_cases(m, n).items():
            if wanted(name):
                x32 = x.float() if x32 is None else x32
                rows.append(run_mxq(name, opts, mv, True, x32, copy_gbps))
        if wanted("fp32_swiglu_bwd_dbias_both_gemm"):  # (the bf16 row's op from fp32: the vectorised kernel)
            x32 = x.float() if x32 is None else x32
            gu = torch.randn(m, 2 * n, device="cuda", dtype=torch.float32)
            rows.append(run_mxq("fp32_swiglu_bwd_dbias_both_gemm", dict(format="fp8_block", dact="swiglu", dbias=True,
                                                                         colwise=True, scale_layout="gemm"),
                                moved(m, 2 * n, True, True, extra=8 * m * n + 4 * n), False, x32, copy_gbps,
                                kw={"act_input": gu}))
        for name, fn in peers.items():
            mv = moved(m, n, name != "colwise", name == "colwise") if name != "weight_128x128" else tile_moved(m, n)
            rows.append(run_torchao(name, fn, x, mv, copy_gbps))
        if "weight_128x128" in peers and x32 is not None:  # (torchao's weight kernel on the fp32 master weight)
            rows.append(run_torchao("weight_128x128_fp32", peers["weight_128x128"], x32,
                                    tile_moved(m, n) + 2 * m * n, copy_gbps))
        if peers:
            for mine, theirs, label in [("mxq/rowwise_gemm", ["torchao/rowwise"], "rowwise"),
                                        ("mxq/colwise_compact", ["torchao/colwise"], "colwise"),
                                        ("mxq/both_compact", ["torchao/rowwise", "torchao/colwise"], "both"),
                                        ("mxq/colwise_gemm", ["torchao/transposed"], "transposed"),
                                        ("mxq/both_gemm", ["torchao/rowwise", "torchao/transposed"], "both_gemm"),
                                        ("mxq/tiles_rowwise_gemm", ["torchao/weight_128x128"], "weight_128x128"),
                                        ("mxq/fp32_tiles_rowwise_gemm", ["torchao/weight_128x128_fp32"],
                                         "weight_128x128_fp32")]:
                r = pair([r for r in rows if r.get("M") == m and r.get("N") == n], mine, theirs, label)
                if r is not None:
                    rows.append(r)
        if peers and wanted("bias_gelu_rowwise_gemm"):  # (torch's bias + gelu, then torchao)
            composed = None
            try:
                lhs = peers["rowwise"]
                composed = dc.time_ms(lambda: lhs(torch.nn.functional.gelu(x + b, approximate="tanh")))
            except Exception as exc:
                print(f"  composition cannot run: {exc}", flush=True)
            mine = next((r for r in rows if r["name"] == "mxq/bias_gelu_rowwise_gemm" and r.get("M") == m and "ms" in r), None)
            if composed is not None and mine is not None:
                rows.append(dict(name="pair/bias_gelu_vs_torch_then_torchao", M=m, N=n, mxq_ms=mine["ms"],
                                 torchao_ms=round(composed, 5), vs_torchao=round(composed / mine["ms"], 3)))
                print(f"  torch bias+gelu then torchao: {composed * 1000:7.1f} us: mxq {rows[-1]['vs_torchao']}x", flush=True)
        dc.write_results(args.out, dev, {"device": dev, "copy_GBps": round(copy_gbps, 1), "torch": torch.__version__,
                                         "rows": rows}, "-fp8-block")


if __name__ == "__main__":
    main()
