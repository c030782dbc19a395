"""mxq.targets: the archs mxq compiles for, and the names users may give targets and dtypes.

Expectations are written out by hand (from compiling every candidate arch; see the module's
docstring), not derived from mxq.targets.
"""

import shutil

import pytest
import torch

from mxq.runtime.targets import SUPPORTED_ARCHS, normalize_arch, normalize_dtype

ARCHS = ("sm_89", "sm_90", "sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_103f", "sm_110a", "sm_110f",
         "sm_120a", "sm_120f", "sm_121a", "sm_121f")
ARCH_LIST = ("(sm_89, sm_90, sm_90a, sm_100a, sm_100f, sm_103a, sm_103f, sm_110a, sm_110f, sm_120a, "
             "sm_120f, sm_121a, sm_121f)")


def test_supported_archs_are_those_that_compile():
    assert SUPPORTED_ARCHS == ARCHS
    assert type(SUPPORTED_ARCHS) is tuple


@pytest.mark.parametrize("arch", ARCHS)
def test_every_supported_arch_is_accepted_as_is(arch):
    got = normalize_arch(arch)
    assert got == arch and type(got) is str


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_86", "sm_87", "sm_100", "sm_103", "sm_120", "sm_121",
                                  "sm_101a", "sm_100 ", " sm_90", "SM_90", "sm90", "90", "sm_90A", "sm_89a",
                                  "sm_100a\n", "", 90, 90.0, None, b"sm_90", ["sm_90"], ("sm_90",),
                                  torch.float32])
def test_anything_else_is_refused_in_one_line_naming_the_supported_archs(arch):
    with pytest.raises(ValueError) as e:
        normalize_arch(arch)
    msg = str(e.value)
    assert msg.startswith(f"mxq: arch must be one of {ARCH_LIST}, got {arch!r}")
    assert "\n" not in msg


@pytest.mark.parametrize("arch,msg", [
    ("sm_80", f"mxq: arch must be one of {ARCH_LIST}, got 'sm_80' (the FP8 conversions need sm_89 or newer)"),
    ("sm_75", f"mxq: arch must be one of {ARCH_LIST}, got 'sm_75' (the FP8 conversions need sm_89 or newer)"),
    ("sm_100", f"mxq: arch must be one of {ARCH_LIST}, got 'sm_100' "
               "(the E8M0 scale conversion needs an arch-specific target: sm_100a or sm_100f)"),
    ("sm_120", f"mxq: arch must be one of {ARCH_LIST}, got 'sm_120' "
               "(the E8M0 scale conversion needs an arch-specific target: sm_120a or sm_120f)"),
    ("sm_101a", f"mxq: arch must be one of {ARCH_LIST}, got 'sm_101a' (CUDA 13 names it sm_110a)"),
    ("sm_100 ", f"mxq: arch must be one of {ARCH_LIST}, got 'sm_100 '"),
    (90, f"mxq: arch must be one of {ARCH_LIST}, got 90"),
    (None, f"mxq: arch must be one of {ARCH_LIST}, got None"),
])
def test_refusal_messages(arch, msg):
    with pytest.raises(ValueError) as e:
        normalize_arch(arch)
    assert str(e.value) == msg


@pytest.mark.parametrize("dtype,short", [
    ("fp32", "fp32"), ("fp16", "fp16"), ("bf16", "bf16"),
    ("float32", "fp32"), ("float16", "fp16"), ("bfloat16", "bf16"),
    (torch.float32, "fp32"), (torch.float16, "fp16"), (torch.bfloat16, "bf16"),
    (torch.float, "fp32"), (torch.half, "fp16"),  # torch's aliases are the same objects
])
def test_dtype_names(dtype, short):
    got = normalize_dtype(dtype)
    assert got == short and type(got) is str


DTYPE_MSG = ("mxq: dtype must be one of 'fp32', 'fp16', 'bf16', their torch names 'float32', 'float16', "
             "'bfloat16' or torch.float32, torch.float16, torch.bfloat16, got ")


@pytest.mark.parametrize("dtype", ["int8", "fp8", "FP32", "fp32 ", "torch.float32", "float", "half", "f32", "",
                                   torch.float64, torch.int8, torch.float8_e4m3fn, torch.uint8,
                                   None, 32, 1.0, ["fp32"], {"fp32": 1}, b"fp32", True])
def test_other_dtypes_are_refused_naming_the_argument_and_the_accepted_values(dtype):
    with pytest.raises(ValueError) as e:
        normalize_dtype(dtype)
    assert str(e.value) == DTYPE_MSG + repr(dtype)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_supported_archs_compile(arch, tmp_path, monkeypatch):
    """The claim itself: a plain and a dbias op compile (vec kernel, bf16) for every listed arch,
    and the local ptxas, where there is one, assembles the PTX for it."""
    import mxq
    from mxq.op import _quantize_op

    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    for spec in (mxq.QuantSpec(colwise=True), mxq.QuantSpec(colwise=True, dbias=True)):
        art = _quantize_op(spec).asm(arch=arch, dtype="bf16")
        assert f".target {arch}\n" in art["ptx"]
        if shutil.which("ptxas"):
            assert art["ptxas"] == "ok", art["ptxas"]
