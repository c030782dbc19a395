"""Static PTX instruction count per element of the packed (16-bit input) kernel, or with
``--dtype fp32`` of the fp32 kernels (vectorised, or element-wise where the variant runs it), without a GPU.

Why: on the H200 the fused ops are issue-bound, so PTX instructions per element predict their
speed well enough to compare template changes on a CPU-only machine before spending device time
(SASS differs: inline-asm ``mov`` wrappers vanish, ``abs`` folds into an operand, but changes in
this count track changes in the kernel). Prints, for each op of the benchmark, the instructions
of the packed kernel's body divided by the elements one thread handles, and ptxas's registers;
with ``nvdisasm`` on PATH (pip wheel nvidia-cuda-nvdisasm; optional) also the machine
instructions per element, the better predictor; and the CTAs one SM holds at once
(``ctas_per_sm``: the plain casts of unaligned rows follow their occupancy more than their
instructions, docs/performance.md "N % 8 != 0").

    python bench/ptx_count.py [--arch sm_90] [--dtype bf16]
    python bench/ptx_count.py --opcodes gelu_both    # where the unaligned rows' extra instructions go
    python bench/ptx_count.py --split                # unaligned rows: per-row and per-tile parts
    python bench/ptx_count.py --variant rows8 --tuning unaligned_warps=8   # a Tuning variant's kernels

``--split`` compiles each op's unaligned kernel at 8 and at 4 warps (``Tuning.unaligned_warps``:
4 and 8 rows per thread) and splits its machine instructions per thread into a part per row
and a part per tile (``split_rows``): at 4 rows per thread the tile's part is 30-40% of a
plain cast's instructions (docs/performance.md, "N % 8 != 0"). The two kernels differ
in more than their rows (the column owners' share per thread, two row classes per thread at 4
warps), so read the split as an estimate. The plain casts' unaligned kernels hold
two store forms of which a warp runs one, so their static counts (here and with ``--variant
generic``) overstate what runs by the form not taken.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re

from mxq.frontend import codegen
from mxq.runtime import inspection, toolchain
from mxq.frontend.epilogue import IDENTITY
from mxq.kernels import config as kconfig
from mxq.op import FusedOp, _OPTION_NAMES, _identity, fused_quant
from mxq.frontend.spec import QuantSpec

OPS = {
    "rowwise": dict(rowwise=True, colwise=False),
    "colwise": dict(rowwise=False, colwise=True),
    "both": dict(rowwise=True, colwise=True),
    "gelu_both": dict(rowwise=True, colwise=True, act="gelu"),
    "dgelu_dbias_both": dict(rowwise=True, colwise=True, dact="gelu", dbias=True),
    # not benchmarked by device_check: the same op without dbias, to price dbias
    "dgelu_both": dict(rowwise=True, colwise=True, dact="gelu"),
    # gated (bench/gated.py): per element of one half; the backward's CTAs each write one half
    "swiglu_both": dict(rowwise=True, colwise=True, act="swiglu"),
    "dsilu_dbias_both": dict(rowwise=True, colwise=True, dact="silu", dbias=True),
    "dswiglu_dbias_both": dict(rowwise=True, colwise=True, dact="swiglu", dbias=True),
}
# ops of the benchmark with a user epilogue: (options, the epilogue, its inputs' layouts)


def bias_add(x, b):
    return x + b


def residual(x, r, alpha: float):
    return x * alpha + r


EPILOGUE_OPS = {
    "bias_gelu_both": (dict(rowwise=True, colwise=True, act="gelu"), bias_add, ("full", "row")),
    "residual_silu_both": (dict(rowwise=True, colwise=True, act="silu"), residual, ("full", "full")),
}


SM_SHARED_BYTES = 228 * 1024  # shared memory per SM of sm_90 (the H200) and sm_100


def ctas_per_sm(registers: int, threads: int, smem_bytes: int) -> int:
    """CTAs of a kernel one SM of sm_90 / sm_100 holds at once: 64K registers in 4 partitions,
    allocated per warp in units of 256 (8 per thread); 228 KB of shared memory, 1 KB of it
    reserved per CTA; 64 warps; 32 CTAs."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = 4 * (16384 // per_warp) // warps
    by_smem = SM_SHARED_BYTES // (smem_bytes + 1024)
    return min(by_regs, by_smem, 64 // warps, 32)


def _options(spec: QuantSpec) -> dict:
    return {k: getattr(spec, k) for k in _OPTION_NAMES}


def count(spec: QuantSpec, arch: str, dtype: str, variant: str = "vec", fn=None, layouts=None, tuning=None) -> dict:
    if fn is not None:
        op = fused_quant(**_options(spec))(fn)
    else:
        op = FusedOp(_identity, spec, IDENTITY) if not spec.gated else fused_quant(**_options(spec))(_identity).inner
    cfg = codegen.kernel_config(op.spec, op.epilogue, tuning)
    if variant == "rows8" and cfg.rows8_warps():
        # (a plain cast's rows8 holds a kernel per input row stride parity: count the one of its
        # default warps, KernelConfig.packed_warps)
        tuning = dataclasses.replace(tuning or kconfig.Tuning(), unaligned_warps=cfg.packed_warps(True))
        cfg = codegen.kernel_config(op.spec, op.epilogue, tuning)
    if tuning is not None:
        op._with_tuning(tuning)  # (the one hook for a benchmark's variant)
    art = inspection.compile_artifacts(op, arch=arch, dtype=dtype, variant=variant, layouts=layouts)
    ptx = art["ptx"]
    kname = "packed_kernel"
    if dtype == "fp32":  # (Quantize.launch: rows8 runs the vectorised kernel where vec_unaligned)
        vec = variant == "vec" or (variant == "rows8" and cfg.vec_unaligned)
        kname = "vec_kernel" if vec else "generic_kernel"
    body = ptx[ptx.index(f".entry kernel_cutlass_{kname}"):]
    body = body[:body.index("\n}\n")]
    instrs = [ln.strip() for ln in body.splitlines()
              if ln.strip() and not ln.strip().startswith(("//", ".", "{", "}", "$", ")", "kernel_"))
              and not re.match(r"^\w+:", ln.strip())]  # (labels, e.g. of the unaligned read's branch table)
    kinds = collections.Counter(re.sub(r"^@!?%p\d+\s+", "", i).split()[0].split(".")[0] for i in instrs)
    if kname == "packed_kernel":
        vwarps = cfg.packed_warps(unaligned=variant != "vec")
        per_thread = kconfig.VEC * (kconfig.ROWS // vwarps)
        smem = cfg.packed_shared_bytes(cfg.n_inputs + cfg.has_dact, unaligned=variant != "vec")
    elif kname == "vec_kernel":
        vwarps = cfg.vec_warps
        per_thread = kconfig.VEC * (kconfig.ROWS // vwarps)
        smem = cfg.vec_unaligned_bytes(cfg.vec_unaligned_chunks) if variant == "rows8" else 0  # (an estimate)
    else:  # the element-wise kernel: a thread's column of 32 rows
        vwarps, per_thread, smem = kconfig.GENERIC_WARPS, kconfig.ROWS, 0
    pk = next((v for k, v in art.get("kernels", {}).items() if kname in k), {})
    sass = pk.get("sass_instructions")
    ctas = ctas_per_sm(pk["registers"], 32 * vwarps, smem) if pk.get("registers") else None
    return {"instrs": len(instrs), "per_element": len(instrs) / per_thread, "registers": pk.get("registers"),
            "sass": sass,
            "sass_per_element": sass / per_thread if sass else None, "vwarps": vwarps, "top": kinds.most_common(8),
            "sass_opcodes": pk.get("sass_opcodes"), "per_thread": per_thread, "ctas_per_sm": ctas}


def split_rows(rows_a: int, count_a: int, rows_b: int, count_b: int) -> tuple:
    """(per row, per tile) of a kernel's static instruction count per thread measured at two
    numbers of rows per thread: count = per_tile + rows * per_row."""
    per_row = (count_b - count_a) / (rows_b - rows_a)
    return per_row, count_a - rows_a * per_row


def split(names, arch: str, dtype: str) -> None:
    """Per-row and per-tile machine instructions per thread of the unaligned kernels (--split)."""
    print(f"{'op':18} {'SASS @4 rows':>12} {'@8 rows':>8} {'per row':>8} {'per tile':>9} {'tile share @4':>13}")
    for name in names:
        counts = {}
        for warps in (8, 4):
            c = count(QuantSpec(**OPS[name]), arch, dtype, "generic", tuning=kconfig.Tuning(unaligned_warps=warps))
            if c["vwarps"] != warps:
                raise SystemExit(f"--split: {name} cannot run its unaligned kernel at {warps} warps")
            if not c["sass"]:
                raise SystemExit("--split needs ptxas and nvdisasm on PATH")
            counts[kconfig.ROWS // warps] = c["sass"]
        per_row, per_tile = split_rows(4, counts[4], 8, counts[8])
        print(f"{name:18} {counts[4]:12} {counts[8]:8} {per_row:8.0f} {per_tile:9.0f} {per_tile / counts[4]:13.0%}")


def opcode_diff(name: str, arch: str, dtype: str) -> None:
    """The packed kernel's machine instructions per element by opcode, aligned rows against
    unaligned rows (the kernel of N % 8 != 0, which may run more warps of fewer rows), largest
    increase first: where the unaligned path's extra instructions go."""
    if name in OPS:
        opts, fn, layouts = OPS[name], None, None
    else:
        opts, fn, layouts = EPILOGUE_OPS[name]
    a, u = (count(QuantSpec(**opts), arch, dtype, v, fn, layouts) for v in ("vec", "generic"))
    if a["sass_opcodes"] is None:
        raise SystemExit("--opcodes needs nvdisasm on PATH")
    pa, pu = ({k: n / c["per_thread"] for k, n in c["sass_opcodes"].items()} for c in (a, u))
    print(f"{name}: machine instructions per element, aligned {sum(pa.values()):.1f} ({a['vwarps']} warps), "
          f"unaligned {sum(pu.values()):.1f} ({u['vwarps']} warps)")
    print(f"{'opcode':10} {'aligned':>8} {'unaligned':>9} {'more':>6}")
    for op in sorted(set(pa) | set(pu), key=lambda k: pa.get(k, 0) - pu.get(k, 0))[:20]:
        print(f"{op:10} {pa.get(op, 0):8.2f} {pu.get(op, 0):9.2f} {pu.get(op, 0) - pa.get(op, 0):+6.2f}")


def _stub_smem_query(arch: str) -> None:
    """A register cap (Tuning.rows8_min_blocks) makes the DSL read the SM's shared memory size
    from the driver; with no GPU here, answer with the H200's (228 KB), as
    tests/test_codegen.py::test_rows8_register_cap_reaches_the_ptx does."""
    import torch

    if torch.cuda.is_available():
        return
    toolchain.import_cutlass(arch)
    import cutlass.cutlass_dsl.cutlass as dsl

    dsl.cuda_helpers.get_device_attribute = lambda attr: SM_SHARED_BYTES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--variant", default="vec", choices=["vec", "generic", "rows8"],
                    help="generic: the packed kernel's unaligned rows (any N); rows8: the same, FP8 rows on 8-byte boundaries")
    ap.add_argument("--opcodes", metavar="OP", choices=[*OPS, *EPILOGUE_OPS],
                    help="instead: OP's machine instructions per element by opcode, aligned against "
                    "unaligned rows (needs nvdisasm)")
    ap.add_argument("--split", action="store_true",
                    help="instead: the unaligned kernels' machine instructions per thread split into a part per "
                    "row and a part per tile (plain casts and gelu + both; needs nvdisasm)")
    ap.add_argument("--tuning", default="", help="compile with these Tuning fields, e.g. 'unaligned_warps=8' "
                    "(device_check.parse_tuning's form)")
    args = ap.parse_args()
    tuning = None
    if args.tuning:
        from device_check import parse_tuning
        tuning = kconfig.Tuning(**parse_tuning(args.tuning))
        if tuning.rows8_min_blocks:
            _stub_smem_query(args.arch)
    if args.split:
        split(["rowwise", "colwise", "both", "gelu_both"], args.arch, args.dtype)  # (dbias ops: 8 warps always)
        return
    if args.opcodes:
        opcode_diff(args.opcodes, args.arch, args.dtype)
        return
    print(f"{'op':18} {'PTX/elem':>8} {'SASS/elem':>9} {'regs':>5} {'warps':>5} {'CTAs/SM':>7}  most frequent PTX")
    todo = [(name, opts, None, None) for name, opts in OPS.items()]
    todo += [(name, opts, fn, layouts) for name, (opts, fn, layouts) in EPILOGUE_OPS.items()]
    for name, opts, fn, layouts in todo:
        c = count(QuantSpec(**opts), args.arch, args.dtype, args.variant, fn, layouts, tuning)
        top = " ".join(f"{k}:{v}" for k, v in c["top"])
        sass = f"{c['sass_per_element']:9.1f}" if c["sass_per_element"] else f"{'-':>9}"
        print(f"{name:18} {c['per_element']:8.1f} {sass} {c['registers'] or '-':>5} {c['vwarps']:>5} "
              f"{c['ctas_per_sm'] or '-':>7}  {top}")


if __name__ == "__main__":
    main()
