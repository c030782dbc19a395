"""What a compile produced, for reading: PTX, MLIR, registers and spills from ``ptxas -v``, SASS
opcode counts from ``nvdisasm`` (``FusedOp.asm``, ``python -m mxq compile``, bench/ptx_digest.py).
No GPU is needed."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import cache, limits, targets
from .compiler import VARIANTS, compile_op


def ptx_of(op, arch: str, dtype_name: str, variant: str = "vec", layouts=None) -> str:
    """The PTX of one kernel of ``op`` (compiled with keep_ptx on first use)."""
    # (the DSL reads the dump into the compiled object right after compiling: no file is kept)
    return compile_op(op, arch, dtype_name, keep_ptx=True, variant=variant, layouts=layouts).__ptx__


def compile_artifacts(op, arch: str = "sm_90", dtype="bf16", variant: str = "vec", layouts=None) -> dict:
    """Compile without a GPU and return what was produced, for inspection. ``dtype``: "bf16",
    "fp16", "fp32" or the torch dtype; ``arch``: one of targets.SUPPORTED_ARCHS."""
    arch = targets.normalize_arch(arch)
    dtype = targets.normalize_dtype(dtype)
    gap = limits.arch_gap(op.spec, arch)
    if gap:
        raise ValueError(f"mxq: asm(): {gap}")
    gap = limits.fp4_gap(op.spec, op.epilogue, dtype) if op.spec.is_fp4 else None
    if gap:  # (such calls run the reference: no kernel to show)
        raise ValueError(f"mxq: asm(): format={op.spec.format!r} {gap}; such calls run the reference")
    if variant not in VARIANTS:
        raise ValueError(f"mxq: variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    compiled = compile_op(op, arch, dtype, keep_ptx=True, variant=variant, layouts=layouts)
    return _artifacts(op, ptx_of(op, arch, dtype, variant, layouts), compiled.ir_module, arch, dtype, variant)


def _artifacts(op, ptx: str, mlir, arch: str, dtype: str, variant: str, **more) -> dict:
    """What a compile for inspection returns: PTX, MLIR, the module's source and file, ptxas's
    report and the conversions the PTX uses (``more``: further entries)."""
    out = {"ptx": ptx, "mlir": str(mlir) if mlir is not None else "", "source": op.source,
           "path": str(cache.source_file(op.source)), "arch": arch, "dtype": dtype, "variant": variant, **more}
    out.update(ptxas_report(ptx, arch))
    out["conversions"] = sorted(set(re.findall(r"\bcvt\.[a-z0-9.]+", ptx)))
    return out


GEMM_OPERAND_KINDS = ("full", "row", "col", "scalar")  # (operands.kind_of's, as op.gemm reads them)


def gemm_artifacts(op, dtype="bf16", operands=None, pingpong: bool | None = None) -> dict:
    """Compile ``op.gemm``'s kernel (the sm_90 GEMM with the op in its epilogue) without a GPU and
    return {"ptx", "mlir", "source", "path", ...} as compile_artifacts does: the compile op.gemm
    launches for these operand kinds on a 132-SM GPU, its kernel runtime/gemm.kernel_for's (the
    same on every GPU) with M, N and K unknown (tile order 1 where it picks by N, swizzle_for), in
    clusters of gemm.CLUSTER_M (a large M's: op.gemm takes none where they would pad its M tiles,
    gemm.cluster_for). ``operands``: each of the epilogue's tensors after the accumulator, as
    "full" ([M, N]), "row" ([N]), "col" ([M, 1]) or "scalar"; all "full" by default (a dact op's
    act_input is always full and not named here). ``pingpong``: a form instead (True: ping-pong
    on gemm.PP_TILE, False: cooperative)."""
    from ..frontend import codegen
    from . import gemm as gemm_rt

    gap = codegen.gemm_gap(op.spec, op.epilogue)
    if gap:
        raise ValueError(f"mxq: asm(gemm=True): op.gemm does not serve {gap}")
    dtype = targets.normalize_dtype(dtype)
    if dtype not in gemm_rt.DTYPES.values():
        raise ValueError(f"mxq: asm(gemm=True): dtype must be one of {tuple(gemm_rt.DTYPES.values())}, got {dtype!r}")
    n = len(op.epilogue.tensor_params) - 1
    kinds = ("full",) * n if operands is None else tuple(operands)
    if len(kinds) != n or any(k not in GEMM_OPERAND_KINDS for k in kinds):
        raise ValueError(f"mxq: asm(gemm=True): operands must name the kind of each of the epilogue's {n} tensors "
                         f"after the accumulator, each one of {GEMM_OPERAND_KINDS}; got {operands!r}")
    kinds += ("full",) if op.spec.dact else ()  # (act_input: one more full operand)
    kern = gemm_rt.kernel_for(op)
    if pingpong is not None:
        pp = bool(pingpong) and gemm_rt.serves(op, gemm_rt.PP_TILE)
        kern = gemm_rt.Kernel(pp, gemm_rt.PP_TILE if pp else gemm_rt.COOPERATIVE_TILE, 1, gemm_rt.CLUSTER_M,
                              gemm_rt.stages_rows(op))
    compiled = gemm_rt.compile_gemm_op(op, dtype, kinds, False, 132, kern.order, keep_ptx=True, pingpong=kern.pingpong,
                                       cluster_m=kern.cluster_m, pp_tile=kern.tile if kern.pingpong else None,
                                       stage_rows=kern.stage_rows)
    return _artifacts(op, compiled.__ptx__, compiled.ir_module, gemm_rt.ARCH, dtype, "gemm", operands=kinds,
                      pingpong=kern.pingpong, tile=kern.tile, order=kern.order, cluster_m=kern.cluster_m,
                      stage_rows=kern.stage_rows)


def ptxas_report(ptx: str, arch: str) -> dict:
    """Registers and spills per kernel from the local ``ptxas -v``, when a CUDA toolkit is present
    (run_ptxas; a re-stamped PTX ISA version is said in ``ptxas_note``)."""
    if shutil.which("ptxas") is None:
        return {"ptxas": None, "kernels": {}}
    with tempfile.TemporaryDirectory() as d:
        rc, text, note = run_ptxas(ptx, arch, Path(d) / "k.cubin")
        sass = sass_opcodes(Path(d) / "k.cubin") if rc == 0 else {}
    kernels: dict = {name: {"sass_instructions": sum(ops.values()), "sass_opcodes": ops} for name, ops in sass.items()}
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = kernels.setdefault(m.group(1), {})
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current is not None:
            current["spill_stores"], current["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
    return {"ptxas": "ok" if rc == 0 else text, "ptxas_note": note, "kernels": kernels}


def run_ptxas(ptx: str, arch: str, cubin: Path) -> tuple:
    """The local ``ptxas -v`` of ``ptx`` for ``arch``, writing ``cubin``: (its return code, its
    report, a note). CuTeDSL embeds a newer ptxas than a local toolkit may have; if the local one
    refuses the PTX ISA version, a copy stamped with the version it accepts is assembled (the
    kernels use no newer instructions) and the note says so."""
    note = ""
    src = cubin.with_suffix(".ptx")
    for _ in range(2):
        src.write_text(ptx)
        r = subprocess.run([shutil.which("ptxas") or "ptxas", "-v", f"-arch={arch}", str(src), "-o", str(cubin)],
                           capture_output=True, text=True, timeout=600)
        text = r.stdout + r.stderr
        m = re.search(r"Unsupported \.version (\S+); current version is '([\d.]+)'", text)
        if r.returncode == 0 or not m:
            break
        note = f"PTX ISA {m.group(1)} re-stamped as {m.group(2)} for the local ptxas"
        ptx = re.sub(r"^\.version \S+", f".version {m.group(2)}", ptx, count=1, flags=re.M)
    return r.returncode, text, note


def sass_opcodes(cubin: Path) -> dict:
    """Machine instructions per kernel, by opcode (``{kernel: Counter}``), when ``nvdisasm`` is on
    PATH (optional: it is not part of the CUDA toolkits without a driver, but NVIDIA ships it as
    a pip wheel). Their total bounds the issue-limited fused ops; PTX counts include moves that
    vanish in SASS. Not counted: instructions predicated on ``!PT`` (never executed) and the
    padding after the last EXIT (its self-branch and the alignment NOPs)."""
    nvdisasm = shutil.which("nvdisasm")
    if nvdisasm is None:
        return {}
    r = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    listing: dict = {}
    current = None
    for line in r.stdout.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            current = m.group(1)
            listing[current] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)", line)
        if current and m and (m.group(1) or "").strip() != "@!PT":
            listing[current].append(m.group(2))
    counts = {}
    for name, ops in listing.items():
        while ops and ops[-1] == "NOP":
            ops.pop()
        if len(ops) >= 2 and ops[-1] == "BRA" and ops[-2] == "EXIT":
            ops.pop()
        counts[name] = collections.Counter(ops)
    return counts
