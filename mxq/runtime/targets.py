"""Which GPU targets mxq compiles for, and how users may name a target and an input dtype.

``SUPPORTED_ARCHS`` is what compiles, found by trying rather than assumed. Method: for each arch
below, ``inspection.compile_artifacts`` (``FusedOp.asm``) in a fresh process with
``MXQ_CACHE_DIR`` in a temporary directory, for five quantize ops -- plain (colwise), ``act="gelu"``,
``dbias=True``, one with everything (e5m2, amax, ``dact="silu"``, dbias, swizzled scales,
``scale_mode="even"``) and a colwise-only ``act="qgelu"`` with ``scale_mode="floor"`` -- in bf16,
fp32 and fp16, both kernel variants ("vec" and "generic"): 30 compiles per arch. Toolchain:
nvidia-cutlass-dsl 4.8.1 (its own ptxas), the local ptxas of CUDA 13.0.88 for the register report;
no GPU involved.

Compile (30/30, and the local ptxas accepts every PTX):
  sm_89, sm_90, sm_90a,
  sm_100a, sm_100f, sm_103a, sm_103f, sm_110a, sm_110f, sm_120a, sm_120f, sm_121a, sm_121f.
  On sm_90 and newer the dbias ops use griddepcontrol (programmatic dependent launch); on sm_89
  they launch without it. On sm_100 and newer the rceil scale is computed by
  ``cvt.rp.satfinite.ue8m0x2.f32``.

Do not compile (the one-line reason from ptxas):
  sm_80, sm_86 (and sm_87), 0/30: ``Feature 'cvt.e4m3x2.f32' requires .target sm_89 or higher``
    (``cvt.e5m2x2.f32`` likewise): the FP8 conversions need Ada or newer. (The vectorised 16-bit
    kernels also use max.NaN.bf16x2 and, with an activation, cp.async, both sm_80+; they are
    not what fails.)
  sm_100, sm_103, sm_120, sm_121, 12/30: ``Instruction 'cvt with .ue8m0x2' not supported on
    .target 'sm_100'``: the E8M0 conversion exists only on the arch-specific ("a") and family
    ("f") targets. Only the ops whose scale_mode is not rceil (the default) compiled, so these
    targets are refused as a whole.
  sm_101a compiles, but CuTeDSL emits ``.target sm_110a`` for it (CUDA 13 renamed sm_101 to
  sm_110) and the local ptxas refuses ``sm_101a``; use sm_110a.

The 16 targets above gave the same results again on the rewritten kernel layer (mxq/kernels/)
while that rewrite was in progress. Compiling is not running: of these targets only sm_90 (the
H200) is exercised on a device by the test suite. tests/test_targets.py re-checks (marked slow)
that every listed arch compiles.
"""

from __future__ import annotations

import re

import torch

from ..frontend.spec import DTYPES

SUPPORTED_ARCHS = (
    "sm_89", "sm_90", "sm_90a",
    "sm_100a", "sm_100f", "sm_103a", "sm_103f", "sm_110a", "sm_110f",
    "sm_120a", "sm_120f", "sm_121a", "sm_121f",
)

_RENAMED = {"sm_101a": "sm_110a", "sm_101f": "sm_110f"}

# "float32" -> "fp32", ...: torch's own names of the dtypes in spec.DTYPES
_TORCH_NAMES = {str(dt).removeprefix("torch."): short for dt, short in DTYPES.items()}
_ACCEPTED_DTYPES = (f"{', '.join(map(repr, DTYPES.values()))}, their torch names "
                    f"{', '.join(map(repr, _TORCH_NAMES))} or {', '.join(map(str, DTYPES))}")


def _arch_hint(arch: str) -> str:
    """Why a well-formed but refused arch is refused, or "" if there is nothing to say."""
    if arch in _RENAMED:
        return f" (CUDA 13 names it {_RENAMED[arch]})"
    digits = arch[3:] if arch.startswith("sm_") else ""
    if not digits.isdigit():
        return ""
    if int(digits) < 89:
        return " (the FP8 conversions need sm_89 or newer)"
    better = [a for a in SUPPORTED_ARCHS if a[:-1] == arch]
    if better:
        return f" (the E8M0 scale conversion needs an arch-specific target: {' or '.join(better)})"
    return ""


def normalize_arch(arch) -> str:
    """``arch`` if it is one of ``SUPPORTED_ARCHS`` (spelled exactly so: "sm_90", "sm_100a"),
    else ``ValueError`` with a one-line message naming the supported ones."""
    if isinstance(arch, str) and arch in SUPPORTED_ARCHS:
        return str(arch)
    hint = _arch_hint(arch) if isinstance(arch, str) else ""
    raise ValueError(f"mxq: arch must be one of ({', '.join(SUPPORTED_ARCHS)}), got {arch!r}{hint}")


def normalize_dtype(dtype) -> str:
    """The short name ("fp32", "fp16", "bf16") of an input dtype given as that short name, as
    torch's name ("float32", "float16", "bfloat16") or as the torch dtype itself
    (``torch.float32``, ...); else ``ValueError`` naming the accepted values."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES:
            return DTYPES[dtype]
    elif isinstance(dtype, str):
        if dtype in _TORCH_NAMES:
            return _TORCH_NAMES[dtype]
        if dtype in DTYPES.values():
            return str(dtype)
    raise ValueError(f"mxq: dtype must be one of {_ACCEPTED_DTYPES}, got {dtype!r}")


def device_arch(device) -> str:
    """The arch string of a CUDA device (torch.device), e.g. "sm_90a" for an H200."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def uses_hw_e8m0(arch: str) -> bool:
    return int(re.sub(r"\D", "", arch)[:3] or 0) >= 100


def uses_pdl(arch: str) -> bool:
    """Programmatic dependent launch (griddepcontrol, sm_90+): dbias ops launch their second
    kernel while the first still runs; it waits in griddepcontrol.wait for the first to finish."""
    return int(re.sub(r"\D", "", arch)[:3] or 0) >= 90
