"""mxq/runtime/inspection.py: reading what a compile produced (the PTX and SASS reports). The
compiles themselves are exercised in test_codegen.py (``FusedOp.asm``)."""

from mxq.runtime import inspection


def test_sass_opcodes_parses_nvdisasm_output(monkeypatch, tmp_path):
    """inspection.sass_opcodes on a hand-written excerpt of `nvdisasm -c` output: per kernel, one
    count per instruction line by opcode (predicates and modifiers dropped; labels, directives
    and comments not counted), except instructions predicated on !PT (never run) and the
    padding after the last EXIT (its self-branch and NOPs). bench/ptx_count.py --opcodes reads
    these."""
    from types import SimpleNamespace

    listing = "\n".join([
        "\t.section\t.text.kernel_a,\"ax\",@progbits",
        ".text.kernel_a:",
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        "        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, 0x1 ;",
        "        /*0020*/              @!P0 BRA `(.L_x_1) ;",
        ".L_x_1:",
        "        /*0030*/              @UP1 UIADD3 UR4, UR4, 0x1, URZ ;",
        "        /*0040*/                   IMAD R3, R2, R2, RZ ;",
        "        /*0050*/              @!PT LDS RZ, [RZ] ;",
        "        /*0060*/                   NOP ;",
        "        /*0070*/                   EXIT ;",
        ".L_x_2:",
        "        /*0080*/                   BRA `(.L_x_2);",
        "        /*0090*/                   NOP;",
        "        /*00a0*/                   NOP;",
        ".text.kernel_b:",
        "        /*0000*/                   EXIT ;",
    ])
    monkeypatch.setattr(inspection.shutil, "which", lambda name: "/bin/nvdisasm")
    monkeypatch.setattr(inspection.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=listing, returncode=0))
    got = inspection.sass_opcodes(tmp_path / "k.cubin")
    assert got == {"kernel_a": {"LDC": 1, "IMAD": 2, "BRA": 1, "UIADD3": 1, "NOP": 1, "EXIT": 1},
                   "kernel_b": {"EXIT": 1}}


def test_asm_refuses_by_name_what_no_fp4_kernel_serves():
    """asm() of an FP4 op whose calls all run the reference (a gated backward with stochastic
    rounding, the Hadamard transform or 16x16 tiles; the Hadamard transform from other than
    bf16) raises ValueError naming the option before compiling, not a compile error with an
    empty message or a kernel no call runs (limits.fp4_gap, the rule fp4_unserved applies)."""
    import pytest

    import mxq

    def dswiglu(g):
        return g

    for flag in ("stochastic_rounding", "hadamard", "block_2d"):
        op = mxq.fused_quant(format="nvfp4", colwise=True, dact="swiglu", **{flag: True})(dswiglu)
        for dtype in ("bf16", "fp32"):
            with pytest.raises(ValueError, match=f"gated backward .*{flag}=True has no GPU kernels"):
                op.asm(arch="sm_90", dtype=dtype)
    op = mxq.fused_quant(format="nvfp4", colwise=True, hadamard=True)(dswiglu)
    with pytest.raises(ValueError, match="hadamard=True and fp16 inputs has no GPU kernels"):
        op.asm(arch="sm_90", dtype="fp16")
