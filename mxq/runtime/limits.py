"""What the compiled kernels serve, asked before a launch: the Python routes fall back to the torch
reference for a call they do not serve (validation.fallback: a one-time warning, an error under
MXQ_STRICT=1); the C++ routes (register, dispatcher, export), which cannot fall back, refuse the
op up front with a ValueError saying why.
"""

from __future__ import annotations

import re

import torch

from ..formats import fp4_layouts
from ..frontend import codegen, gated
from ..kernels import config as kconfig
from ..tensor import MAX_ELEMENTS, MAX_ROWS, data_rows, flat_dims
from . import slots, targets


def unsupported(x: torch.Tensor) -> str | None:
    """Why no kernel can serve CUDA tensor ``x`` (the caller falls back), or None."""
    m, n = flat_dims(x.shape)
    if m * n >= MAX_ELEMENTS or m >= MAX_ROWS:
        return "tensors of 2^31 or more elements are not supported by the kernels yet"
    return None


def unserved(spec, epilogue, x: torch.Tensor, smem_shortfall, call=None) -> str | None:
    """Why the kernels cannot serve an op's call on CUDA tensor ``x``, or None. A 16-bit op whose
    inputs do not fit the packed kernel's shared memory (many epilogue tensors; ``smem_shortfall()``,
    the op's own smem_shortfall). A two-halves op (mxq/frontend/gated.py): a block of the
    [M, 2N] output must not straddle the halves (n_multiple). FP8 block scaling:
    fp8_block_unserved (``call``: the call's out= and group_offsets)."""
    if spec.format != "mxfp8":
        why = {"fp8_block": fp8_block_unserved, "mxfp4": fp4_unserved, "nvfp4": fp4_unserved}.get(spec.format)
        why = why(spec, epilogue, x, call) if why else "has no GPU kernels yet"
        if why:
            return f"format={spec.format!r} {why}; running the torch reference"
    too_big = smem_shortfall() if x.element_size() == 2 else None
    if too_big:
        return f"{too_big}; running the torch reference"
    if not gated.is_halves(epilogue):
        return None
    mult = n_multiple(spec, epilogue)
    if x.dim() and x.shape[-1] % mult:
        return (f"a gated backward with blocks of {mult} columns needs N % {mult} == 0 on the kernels (N = "
                f"{x.shape[-1]}: a block would straddle the two halves); running the torch reference")
    return None


def arch_gap(spec, arch: str) -> str | None:
    """What of ``spec`` the kernels cannot compile for ``arch`` (a targets.SUPPORTED_ARCHS name),
    or None: FP4's encode (sm_90's lane rule on bf16x2 and u16x2 words, sm_100's cvt) has no
    sm_89 form (ptxas refuses mul.bf16x2 and min.u16x2 below sm_90)."""
    gap = _fp4_arch_gap(arch) if spec.is_fp4 else None
    return f"format={spec.format!r} {gap}" if gap else None


def _fp4_arch_gap(arch: str) -> str | None:
    # (the arch's number as targets reads it: "sm_89" 89, "sm_90a" 90, "sm_100a" 100)
    if int(re.sub(r"\D", "", arch)[:3] or 0) < 90:
        return f"needs sm_90 or newer (its E2M1 encode works on bf16x2 and u16x2 words), not {arch}"
    return None


def fp8_block_unserved(spec, epilogue, x: torch.Tensor, call) -> str | None:
    """What of an FP8 block-scaling call the kernels do not serve, or None: fp8_block_gap for the
    call's dtype and groups; the GEMM-ready transposed colwise copy from rows that are not aligned
    (_aligned_rows); fp32 inputs: colwise blocks, tiles and two halves from rows that are not
    aligned, FP8 rows not on 8-byte boundaries (the element-wise kernel, variant_gap), which mxq's
    own outputs never are."""
    grouped = call is not None and call.group_offsets is not None
    gap = fp8_block_gap(spec, epilogue, DTYPE_NAMES.get(x.dtype), grouped)
    if gap:
        return gap
    if spec.colwise and spec.scale_layout == "gemm" and not _aligned_rows(x, call):
        return ("with colwise=True and scale_layout='gemm' (the transposed copy) from inputs with N % 8 != 0 or "
                "not 16-byte aligned rows, or into rowwise FP8 rows not 16-byte aligned, has no GPU kernels yet")
    if x.dtype != torch.float32:
        return None
    if grouped and not _aligned_rows(x, call):  # (fp32 grouped calls: the vectorised kernel's aligned rows alone)
        return ("with group_offsets and fp32 inputs from rows that are not aligned (N % 8 != 0 or tensors not "
                "16-byte aligned) has no GPU kernels yet")
    col = call.out.colwise_data if call is not None and call.out is not None else None
    if col is not None and not spec.colwise_transposed:
        # (its [M, N] rows as the kernel writes them, [M, 2N] for two halves; None: not viewable so)
        col = data_rows(col, *flat_dims(gated.out_shape(epilogue, x.shape)))
    if _fp32_aligned_only(spec, epilogue) and (not _aligned_rows(x, call) or (
            spec.colwise and not spec.colwise_transposed and call is not None and call.out is not None and (col is None or _misaligned(col, kconfig.VEC)))):
        # (the vectorised kernel's 128-row tile: aligned rows alone, its colwise FP8 rows too)
        return ("with colwise=True, block=(128, 128) or a gated backward and fp32 inputs from rows that are not "
                "aligned (N % 8 != 0 or tensors not 16-byte aligned), or into colwise FP8 rows that are not, has no GPU "
                "kernels yet")
    data = call.out.rowwise_data if call is not None and call.out is not None else None
    if data is not None and (data.data_ptr() % kconfig.UNIT or (data.dim() > 1 and data.shape[0] > 1
                                                                 and data.stride(0) % kconfig.UNIT)):
        return "with fp32 inputs into FP8 rows not on 8-byte boundaries has no GPU kernels yet"
    return None


def _fp32_aligned_only(spec, epilogue) -> bool:
    """FP8 block scaling's fp32 calls the vectorised kernel serves from aligned rows alone (variant
    "vec"): its 128-row tile (colwise blocks, 128x128 tiles) and two-halves ops (no staged rows,
    KernelConfig.vec_unaligned)."""
    return spec.colwise or spec.block[0] > 1 or gated.is_halves(epilogue)


# input dtypes by the names the C++ routes use (export's dtype=, the dispatcher's resolve)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def fp8_block_gap(spec, epilogue, dtype: str | None, grouped: bool = False) -> str | None:
    """What of an FP8 block-scaling op the kernels do not serve for calls of input ``dtype``
    ("bf16", "fp16", "fp32"; None: whatever the dtype), or None. They serve 1x128 rowwise blocks
    (compact or gemm layout) and, from 16-bit inputs, colwise 128-row blocks (the packed kernel's
    128-row tile, KernelConfig.tile_rows; compact, or the GEMM-ready transposed copy from aligned
    rows; with or without amax) and 128x128 tiles (the same tile, either layout and direction),
    grouped ones too from 16-bit inputs (compact: the grouped row tiles of the kernel's tile
    rows, kernels/grouped.py), gated backwards from 16-bit inputs (two output halves, grouped or
    not, in every form above: 1x128 rowwise blocks, 128-row colwise blocks, the transposed copy,
    128x128 tiles; N % 128 == 0 with the rowwise blocks or tiles: unserved, n_multiple); fp32
    inputs through the vectorised kernel: rowwise 1x128 blocks aligned or with staged rows
    (launch.variant_for picks "vec" or "rows8": variant_gap), where the staged rows fit shared
    memory, 128-row colwise blocks, 128x128 tiles (either layout and direction, the transposed
    copy too) and gated backwards on aligned rows (its 128-row tile, "vec" alone:
    fp8_block_unserved, variant_gap), and grouped calls of these (compact) from aligned rows
    ("vec_grouped"). The rule of the Python routes
    (fp8_block_unserved) and, with cpp_only_gap, the C++ ones (cpp_gap)."""
    gap = codegen.kernel_gap(spec)
    if gap:
        return f"{gap} has no GPU kernels yet"
    if dtype == "fp32" and not _fp32_aligned_only(spec, epilogue) and not codegen.kernel_config(
            spec, epilogue).vec_unaligned:
        # (fp32 colwise blocks, tiles and two halves: the aligned kernel alone, fp8_block_unserved says so)
        return "with fp32 inputs whose staged rows would not fit shared memory has no GPU kernels yet"
    return None


def fp4_unserved(spec, epilogue, x: torch.Tensor, call) -> str | None:
    """What of an MXFP4 or NVFP4 call the kernels do not serve, or None. They serve rowwise blocks
    on the aligned kernels (the packed one for bf16/fp16, the vectorised one for fp32;
    launch.fp4_variant): N % 8 == 0 (NVFP4: N % 16 == 0), every tensor operand and the data
    16-byte aligned, matrix rows a multiple of 8 elements apart; the transposed colwise copy (dbias
    too) where M % 8 == 0 (the 32-row tile of 8-row threads: NVFP4's 16-row blocks, MXFP4's 32-row
    ones, a partial last block zero-padded; NVFP4's with hadamard=True from bf16, M % 16 == 0:
    validation's, into amax and colwise_amax that are one fp32[2] buffer); NVFP4's 16x16 tiles and
    stochastic rounding (any M rowwise, the colwise copy's rule with it). Grouped calls run the
    grouped kernels (NVFP4's amax pass and quantize pass with an amax per group,
    grouped.group_amax, or the quantize pass alone after a given amax is written into each group's
    entry, launch.given_amax_first; the colwise copy's tiles from each group's first row), but
    not what fp4_layouts.grouped_gap refuses (validation's rule, asked first). Two halves (gated
    backwards) run on the kernels but grouped from fp32 or with stochastic rounding, the Hadamard
    transform or 16x16 tiles (whose words and tiles are placed by the input's columns); those and
    other shapes or alignments run the reference."""
    gap = codegen.kernel_gap(spec)
    if gap:
        return f"{gap} has no GPU kernels yet"
    gap = _fp4_arch_gap(targets.device_arch(x.device)) if x.is_cuda else None  # (CPU tensors: the rules below)
    if gap:
        return gap
    gap = fp4_gap(spec, epilogue, targets.DTYPES.get(x.dtype, str(x.dtype)))
    if gap:  # (validation refuses a hadamard=True call of other inputs first; the kernels' own rule)
        return gap
    if gated.is_halves(epilogue) and x.element_size() != 2 and call is not None and call.group_offsets is not None:
        return "with a gated backward (two output halves), group_offsets and fp32 inputs has no GPU kernels yet"
    gap = fp4_layouts.grouped_gap(spec) if call is not None and call.group_offsets is not None else None
    if gap:  # (validation's rule for grouped FP4 outputs, whatever the dtype: it refuses such calls first)
        return f"with group_offsets {gap}"
    if spec.colwise:  # (the transposed copy: the packed kernel's 8-row threads, whole words of output rows)
        m = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
        if m % kconfig.VEC:
            return f"with colwise=True and M % {kconfig.VEC} != 0 (M = {m}) has no GPU kernels yet"
        col = call.out.colwise_data if call is not None and call.out is not None else None
        if col is not None and (col.data_ptr() % 16 or not col.is_contiguous()):
            return "with colwise=True into colwise data not contiguous and 16-byte aligned has no GPU kernels yet"
        out = call.out if call is not None else None
        if spec.hadamard and out is not None and fp4_layouts.amax_pair(out.amax, out.colwise_amax) is None:
            return ("with hadamard=True into an out= whose amax and colwise_amax are not the two entries of one "
                    "fp32[2] buffer (MXFP8Tensor.empty's) has no GPU kernels yet")
    mult = NVFP4_N_MULTIPLE if spec.format == "nvfp4" else kconfig.VEC
    if x.dim() == 0 or x.shape[-1] % mult:
        return f"with N % {mult} != 0 (N = {x.shape[-1] if x.dim() else 1}) has no GPU kernels yet"
    ins = [x] if call is None else [t for t in (*call.tensors, call.act_input) if isinstance(t, torch.Tensor)]
    data = call.out.rowwise_data if call is not None and call.out is not None else None
    if any(_misaligned(t, kconfig.VEC) for t in ins) or (data is not None and _misaligned(data, kconfig.VEC // 2)):
        return "with tensors not 16-byte aligned or rows not whole 16-byte vectors apart has no GPU kernels yet"
    return None


def fp4_gap(spec, epilogue, dtype: str | None = None) -> str | None:
    """What of an NVFP4 / MXFP4 op no kernel serves, whatever the call's shapes (fp4_unserved's
    first rules; asm() refuses it by name rather than compile a kernel no call would run), or
    None: gated backwards (two output halves) with the options whose words or tiles are placed by
    the input's columns (they stay on the reference); with ``dtype`` ("bf16", "fp16", "fp32"),
    the Hadamard transform from other than bf16."""
    if gated.is_halves(epilogue):  # (the packed kernel's two passes)
        flag = next((f for f in ("stochastic_rounding", "hadamard", "block_2d") if getattr(spec, f)), None)
        if flag:
            return f"with a gated backward (two output halves) and {flag}=True has no GPU kernels yet"
    if spec.hadamard and dtype is not None and dtype != "bf16":
        return f"with hadamard=True and {dtype} inputs has no GPU kernels (the transform takes bf16 inputs only)"
    return None


NVFP4_N_MULTIPLE = 16  # NVFP4's kernels serve whole 1x16 blocks


def _misaligned(t: torch.Tensor, row_multiple: int) -> bool:
    """A non-empty tensor not 16-byte aligned, or whose rows are not ``row_multiple`` elements apart."""
    rows_apart = t.dim() > 1 and t.shape[-2] > 1 and t.shape[-1] > 1 and t.stride(-2) % row_multiple != 0
    return bool(t.numel()) and (t.data_ptr() % 16 != 0 or rows_apart)


def _aligned_rows(x: torch.Tensor, call) -> bool:
    """Whether a call takes the packed kernel's aligned rows (variant "vec", which alone writes
    the transposed colwise copy): N % 8 == 0, and every input read per element and an ``out=``'s
    rowwise FP8 data 16-byte aligned with rows a multiple of 8 elements apart
    (launch.variant_for's rule; a broadcast operand's zero strides pass, and operands broadcast
    along the columns, [M, 1] or one element, are read one element at a time)."""
    data = call.out.rowwise_data if call is not None and call.out is not None else None
    if data is not None and _misaligned(data, kconfig.VEC):
        return False
    tensors = [x] if call is None else [*call.tensors, call.act_input]
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or (t is not x and t.shape[-1] == 1):
            continue
        if t.shape[-1] % kconfig.VEC or t.data_ptr() % 16 or (t.dim() > 1 and t.stride(-2) % kconfig.VEC):
            return False
    return x.dim() > 0 and x.shape[-1] % kconfig.VEC == 0


def variant_gap(spec, dtype: str | None, variant: str | None) -> str | None:
    """Why compiled ``variant`` (compiler.VARIANTS) cannot serve an op's calls of ``dtype``, or
    None: FP8 block scaling's fp32 calls have no "generic" kernel (the element-wise kernel serves
    1x32 blocks only; fp32 FP8 rows not on 8-byte boundaries)."""
    if spec.format == "fp8_block" and dtype == "fp32" and variant is not None and variant.startswith("generic"):
        return "with fp32 inputs into FP8 rows not on 8-byte boundaries has no GPU kernels yet"
    if spec.format == "fp8_block" and dtype == "fp32" and (spec.colwise or spec.block[0] > 1) and (
            variant is not None and not variant.startswith("vec")):
        return ("with colwise=True or block=(128, 128) and fp32 inputs from unaligned rows (N % 8 != 0 or tensors "
                "not 16-byte aligned) has no GPU kernels yet (the aligned kernel, variant 'vec', alone)")
    return None


def cpp_gap(spec, epilogue, dtype: str | None = None, variant: str | None = None, grouped: bool = False,
            native: bool = True) -> str | None:
    """What of an op the C++ routes (register, dispatcher, export) cannot serve, as
    "format=... <why>", or None: formats without kernels, fp8_block_gap, variant_gap,
    cpp_only_gap, fp4_cpp_gap. register() and dispatcher() ask it with no dtype before anything is built and
    the native dispatcher with each call's dtype and variant (ffi's resolve); export() with its
    dtype, grouped, and each variant it exports (a variant with a gap is left out of the library).
    ``native``: a route of compiled code alone (export, the native dispatcher); NVFP4's and
    MXFP4's register() and dispatcher() run in Python (ffi.python_dispatcher)."""
    if spec.format == "mxfp8":
        return None
    if spec.is_fp4:
        why = fp4_cpp_gap(spec, epilogue, native, dtype, variant, grouped)
        return f"format={spec.format!r} {why}" if why else None
    why = (fp8_block_gap(spec, epilogue, dtype, grouped) or variant_gap(spec, dtype, variant)
           or cpp_only_gap(spec, grouped, variant, dtype, gated.is_halves(epilogue))
           if spec.format == "fp8_block" else "is not served by the C++ routes yet")
    return f"format={spec.format!r} {why}" if why else None


def fp4_cpp_gap(spec, epilogue, native: bool, dtype: str | None = None, variant: str | None = None,
                grouped: bool = False) -> str | None:
    """What of an NVFP4 / MXFP4 op the C++ routes do not serve. export() (``native``: compiled code
    alone, which cannot fall back to the reference) serves what the kernels serve for every call
    its checks let through (csrc/export_check.h): the aligned kernel alone (variant "vec", and
    NVFP4's "vec_given": the quantize pass of a given amax; fp4_unserved's N % 8 == 0, NVFP4's N %
    16 == 0, 16-byte aligned tensors), the colwise copy, 16x16 tiles and stochastic rounding (the
    colwise copy grouped too), groups (a given amax too); not the Hadamard
    transform (its amax and colwise_amax pair) nor gated backwards. register(), dispatcher() and get_quantize_kernel run
    Python on every call (the destination-passing signature): there stochastic rounding and the
    Hadamard transform, whose seed, offset and colwise_amax have no slot."""
    if not native:
        for flag in ("stochastic_rounding", "hadamard"):
            if getattr(spec, flag):
                return (f"with {flag}=True is not served by the C++ routes yet (its seed, offset or colwise_amax "
                        "have no slot in the destination-passing signature)")
        return None
    if spec.hadamard:
        return "with hadamard=True is not served by export() yet (its amax and colwise_amax pair)"
    if grouped and fp4_layouts.grouped_gap(spec):  # (validation's rule for grouped FP4 outputs)
        return f"with group_offsets {fp4_layouts.grouped_gap(spec)}"
    if gated.is_halves(epilogue):
        return "with a gated backward (two output halves) is not served by the C++ routes yet"
    if variant is not None and not variant.startswith("vec"):
        return ("is served by the aligned kernel alone ('_vec': N % 8 == 0, NVFP4's N % 16 == 0, 16-byte aligned "
                "tensors with rows a multiple of 8 elements apart)")
    return None


def cpp_facts(spec, epilogue) -> tuple[int, ...]:
    """The C++ routes' size facts of an op (slots.scale_facts at the kernels' tile rows)."""
    return slots.scale_facts(spec, codegen.kernel_config(spec, epilogue).tile_rows)


def cpp_only_gap(spec, grouped: bool = False, variant: str | None = None, dtype: str | None = None,
                 halves: bool = False) -> str | None:
    """What of an FP8 block-scaling op the Python routes serve and the C++ routes do not (they
    cannot fall back to the reference): groups with the GEMM-ready layout (validation refuses
    them everywhere; export(grouped=True) serves compact scales; a registered op's dispatcher
    sends its grouped calls, int32 or int64 ends, to Python's binding of the kernels,
    slots.dispatch_flags), and the
    GEMM-ready transposed colwise copy (cpp_transposed) on a kernel ``variant`` other than the
    aligned one (variant None: whatever the variant, which register() and dispatcher() ask): the
    packed and vectorised kernels write that copy from aligned rows alone, variant "vec" (N % 8 == 0, the
    tensors it reads 16 bytes at a time 16-byte aligned, rows a multiple of 8 elements apart;
    launch.variant_for's rule, the Python routes running the reference for other calls,
    fp8_block_unserved), so export() leaves "generic" and "rows8" out of the library and the
    native dispatcher refuses a call that would take them when it resolves the kernel. 128x128
    tiles and amax beside colwise blocks are served as the kernels serve them (fp8_block_gap).
    fp32 gated backwards (``halves``, ``dtype``: the aligned kernel alone, whose other variants
    export would leave out by a rule variant_gap does not know) stay with the Python routes."""
    if halves and dtype == "fp32":
        return "with a gated backward (two output halves) and fp32 inputs is not served by the C++ routes yet"
    if grouped and spec.scale_layout == "gemm":  # (validation's rule: grouped FP8 block scales are compact)
        return "with group_offsets and scale_layout='gemm' is not served (grouped scales are compact)"
    if variant is not None and not variant.startswith("vec") and cpp_transposed(spec):
        return ("with colwise=True and scale_layout='gemm' (the transposed copy) from inputs with N % 8 != 0, or "
                "tensors not 16-byte aligned or rows not a multiple of 8 elements apart (the rowwise FP8 data's too), "
                "has no GPU kernels yet (the aligned kernel, variant 'vec', alone writes the copy)")
    return None


def cpp_transposed(spec) -> bool:
    """Whether an op's colwise FP8 data is the transposed copy [N, M] (FP8 block scaling's
    GEMM-ready layout: what fp8_block_layouts.colwise_data allocates, the kernels'
    KernelConfig.transposed). The C++ routes take it as a contiguous [N, M] tensor
    (csrc/export_check.h's kColDataT, rendered by export; dispatch.cc's State::transposed, passed
    by ffi.make_dispatchers) and serve it on the aligned kernel alone (cpp_only_gap)."""
    return spec.format == "fp8_block" and spec.colwise_transposed


def n_multiple(spec, epilogue) -> int:
    """What N must be a multiple of for the kernels to serve an op: a two-halves op with rowwise
    output or 128x128 tiles, its blocks' width (a block may not straddle the halves: 32 MXFP8,
    128 FP8 block scaling); else 1."""
    if gated.is_halves(epilogue) and (spec.rowwise or spec.block[0] > 1):
        return spec.block[1]
    return 1


def packed_shared_bytes(spec, epilogue, tuning) -> int:
    """The shared memory the 16-bit kernel needs for an op at its largest (unaligned rows,
    grouped, either warp count of a rows8 plain cast; KernelConfig.packed_shared_bytes for the
    op's config and ``tuning``). The transposed colwise copy is written from aligned rows alone
    (fp8_block_unserved) and never grouped (validation refuses groups with the gemm layout)."""
    cfg = codegen.kernel_config(spec, epilogue, tuning)
    any_rows = not cfg.transposed
    return max(c.packed_shared_bytes(cfg.n_inputs + cfg.has_dact, unaligned=any_rows, grouped=any_rows)
               for c in (cfg, *(cfg.rows8_twins() or ())))


def smem_shortfall(epilogue, need: int) -> str | None:
    """Why the 16-bit kernel cannot take an op that needs ``need`` bytes of shared memory (more
    than a CTA may take), or None."""
    if need <= kconfig.SMEM_LIMIT:
        return None
    return (f"{len(epilogue.tensor_params)} epilogue tensors need {need} bytes of shared "
            f"memory in the 16-bit kernel (at most {kconfig.SMEM_LIMIT})")


def refuse_cpp(what: str, spec, epilogue, smem_shortfall, dtype: str | None = None, grouped: bool = False,
               native: bool = True) -> None:
    """Ops a C++ route cannot serve, refused before anything is built: what the kernels do not
    serve (cpp_gap: a C++ route cannot fall back to the reference; ``native``: its route of
    compiled code alone), a gated op's inner op (the gated op serves them itself), and
    refuse_unlaunchable's."""
    gap = cpp_gap(spec, epilogue, dtype, grouped=grouped, native=native)
    if gap:
        raise ValueError(f"mxq: {what}: {gap}, so it has no C++ route; call the op from Python")
    if spec.gated or gated.is_halves(epilogue):
        raise ValueError(f"mxq: {what}: the inner op of a gated activation is not served by this C++ route; "
                         "use the gated op's own register(), dispatcher() or export(), or call it from Python "
                         "(eager or torch.compile)")
    refuse_unlaunchable(what, smem_shortfall, dtype)


def refuse_unlaunchable(what: str, smem_shortfall, dtype: str | None = None) -> None:
    """Ops whose 16-bit kernel would not fit shared memory (the Python routes run the reference
    for those CUDA calls; a C++ route would fail at launch): for register()/dispatcher(), which
    serve every dtype, whatever the dtype; for export(), its ``dtype``."""
    too_big = smem_shortfall() if dtype in (None, "bf16", "fp16") else None
    if too_big:
        raise ValueError(f"mxq: {what}: {too_big}, so its bf16/fp16 calls cannot launch; call the op from "
                         "Python (which runs the torch reference for them)"
                         + (" or export it for dtype='fp32'" if dtype else ""))


__all__ = ["DTYPE_NAMES", "cpp_facts", "cpp_gap", "cpp_only_gap", "cpp_transposed", "fp8_block_gap",
           "fp8_block_unserved", "n_multiple", "packed_shared_bytes", "refuse_cpp", "refuse_unlaunchable",
           "smem_shortfall", "unserved", "unsupported", "variant_gap"]
