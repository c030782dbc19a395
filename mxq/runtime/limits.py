"""What the compiled kernels serve, asked before a launch: the Python routes fall back to the torch
reference for a call they do not serve (validation.fallback: a one-time warning, an error under
MXQ_STRICT=1); the C++ routes (register, dispatcher, export), which cannot fall back, refuse the
op up front with a ValueError saying why.
"""

from __future__ import annotations

import torch

from ..formats.numerics import BLOCK
from ..frontend import codegen, gated
from ..kernels import config as kconfig
from ..tensor import flat_dims
from . import slots


def unsupported(x: torch.Tensor) -> str | None:
    """Why no kernel can serve CUDA tensor ``x`` (the caller falls back), or None."""
    m, n = flat_dims(x.shape)
    if m * n >= 2 ** 31 or m >= 2 ** 31 - 64:
        return "tensors of 2^31 or more elements are not supported by the kernels yet"
    return None


def unserved(spec, epilogue, x: torch.Tensor, smem_shortfall, call=None) -> str | None:
    """Why the kernels cannot serve an op's call on CUDA tensor ``x``, or None. A 16-bit op whose
    inputs do not fit the packed kernel's shared memory (many epilogue tensors; ``smem_shortfall()``,
    the op's own smem_shortfall). A two-halves op (mxq/frontend/gated.py): rowwise blocks of the
    [M, 2N] output must not straddle the halves (each half is its own CTAs). FP8 block scaling:
    fp8_block_unserved (``call``: the call's out= and group_offsets)."""
    if spec.format != "mxfp8":
        why = fp8_block_unserved(spec, epilogue, x, call) if spec.format == "fp8_block" else "has no GPU kernels yet"
        if why:
            return f"format={spec.format!r} {why}; running the torch reference"
    too_big = smem_shortfall() if x.element_size() == 2 else None
    if too_big:
        return f"{too_big}; running the torch reference"
    if not gated.is_halves(epilogue):
        return None
    if x.dim() and x.shape[-1] % n_multiple(spec, epilogue):
        return (f"a gated backward with rowwise blocks needs N % {BLOCK} == 0 on the kernels (N = {x.shape[-1]}: "
                f"a {BLOCK}-element block would straddle the two halves); running the torch reference")
    return None


def fp8_block_unserved(spec, epilogue, x: torch.Tensor, call) -> str | None:
    """What of an FP8 block-scaling call the kernels do not serve, or None: fp8_block_gap for the
    call's dtype and groups, and fp32 inputs into FP8 rows not on 8-byte boundaries (the
    element-wise kernel, variant_gap), which mxq's own outputs never are."""
    grouped = call is not None and call.group_offsets is not None
    gap = fp8_block_gap(spec, epilogue, DTYPE_NAMES.get(x.dtype), grouped)
    if gap or x.dtype != torch.float32:
        return gap
    data = call.out.rowwise_data if call is not None and call.out is not None else None
    if data is not None and (data.data_ptr() % kconfig.UNIT or (data.dim() > 1 and data.shape[0] > 1
                                                                 and data.stride(0) % kconfig.UNIT)):
        return "with fp32 inputs into FP8 rows not on 8-byte boundaries has no GPU kernels yet"
    return None


# input dtypes by the names the C++ routes use (export's dtype=, the dispatcher's resolve)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def fp8_block_gap(spec, epilogue, dtype: str | None, grouped: bool = False) -> str | None:
    """What of an FP8 block-scaling op the kernels do not serve for calls of input ``dtype``
    ("bf16", "fp16", "fp32"; None: whatever the dtype), or None. They serve 1x128 rowwise blocks
    (compact or gemm layout) and, from 16-bit inputs, colwise 128-row blocks (compact, without
    amax: the packed kernel's 128-row tile, KernelConfig.tile_rows), of ungrouped, one-output-half
    ops; fp32 inputs only through the vectorised kernel, aligned or with staged rows (launch.variant_for
    picks "vec" or "rows8": variant_gap), where the staged rows fit shared memory. The one rule of
    the Python routes (fp8_block_unserved) and the C++ ones (cpp_gap): a kernel that serves more
    widens it here."""
    gap = codegen.kernel_gap(spec)
    if gap:
        return f"{gap} has no GPU kernels yet"
    if gated.is_halves(epilogue):
        return "with a gated backward (two output halves) has no GPU kernels yet"
    if grouped:
        return "with group_offsets has no GPU kernels yet"
    if spec.colwise and (dtype == "fp32" or spec.amax):
        return "with colwise=True and fp32 inputs or amax has no GPU kernels yet"
    if dtype == "fp32" and not codegen.kernel_config(spec, epilogue).vec_unaligned:
        return "with fp32 inputs whose staged rows would not fit shared memory has no GPU kernels yet"
    return None


def variant_gap(spec, dtype: str | None, variant: str | None) -> str | None:
    """Why compiled ``variant`` (compiler.VARIANTS) cannot serve an op's calls of ``dtype``, or
    None: FP8 block scaling's fp32 calls have no "generic" kernel (the element-wise kernel serves
    1x32 blocks only; fp32 FP8 rows not on 8-byte boundaries)."""
    if spec.format == "fp8_block" and dtype == "fp32" and variant is not None and variant.startswith("generic"):
        return "with fp32 inputs into FP8 rows not on 8-byte boundaries has no GPU kernels yet"
    return None


def cpp_gap(spec, epilogue, dtype: str | None = None, variant: str | None = None, grouped: bool = False) -> str | None:
    """What of an op the C++ routes (register, dispatcher, export) cannot serve, as
    "format=... <why>", or None: formats without kernels, fp8_block_gap, variant_gap. register()
    and dispatcher() ask it with no dtype before anything is built and the native dispatcher with
    each call's dtype and variant (ffi's resolve); export() with its dtype, grouped, and each
    variant it exports (a variant with a gap is left out of the library)."""
    if spec.format == "mxfp8":
        return None
    why = (fp8_block_gap(spec, epilogue, dtype, grouped) or variant_gap(spec, dtype, variant)
           if spec.format == "fp8_block" else "has no GPU kernels yet")
    return f"format={spec.format!r} {why}" if why else None


def cpp_facts(spec, epilogue) -> tuple[int, ...]:
    """The C++ routes' size facts of an op (slots.scale_facts at the kernels' tile rows)."""
    return slots.scale_facts(spec, codegen.kernel_config(spec, epilogue).tile_rows)


def n_multiple(spec, epilogue) -> int:
    """What N must be a multiple of for the kernels to serve an op: a two-halves op with rowwise
    output, a block (a rowwise block may not straddle the halves); else 1."""
    return BLOCK if gated.is_halves(epilogue) and spec.rowwise else 1


def packed_shared_bytes(spec, epilogue, tuning) -> int:
    """The shared memory the 16-bit kernel needs for an op at its largest (unaligned rows,
    grouped, either warp count of a rows8 plain cast; KernelConfig.packed_shared_bytes for the
    op's config and ``tuning``)."""
    cfg = codegen.kernel_config(spec, epilogue, tuning)
    return max(c.packed_shared_bytes(cfg.n_inputs + cfg.has_dact, unaligned=True, grouped=True)
               for c in (cfg, *(cfg.rows8_twins() or ())))


def smem_shortfall(epilogue, need: int) -> str | None:
    """Why the 16-bit kernel cannot take an op that needs ``need`` bytes of shared memory (more
    than a CTA may take), or None."""
    if need <= kconfig.SMEM_LIMIT:
        return None
    return (f"{len(epilogue.tensor_params)} epilogue tensors need {need} bytes of shared "
            f"memory in the 16-bit kernel (at most {kconfig.SMEM_LIMIT})")


def refuse_cpp(what: str, spec, epilogue, smem_shortfall, dtype: str | None = None, grouped: bool = False) -> None:
    """Ops a C++ route cannot serve, refused before anything is built: what the kernels do not
    serve (cpp_gap: a C++ route cannot fall back to the reference), a gated op's inner op (the
    gated op serves them itself), and refuse_unlaunchable's."""
    gap = cpp_gap(spec, epilogue, dtype, grouped=grouped)
    if gap:
        raise ValueError(f"mxq: {what}: {gap}, so it has no C++ route; call the op from Python (which runs the "
                         "torch reference for it)")
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


__all__ = ["DTYPE_NAMES", "cpp_facts", "cpp_gap", "fp8_block_gap", "fp8_block_unserved", "n_multiple",
           "packed_shared_bytes", "refuse_cpp", "refuse_unlaunchable", "smem_shortfall", "unserved",
           "unsupported", "variant_gap"]
