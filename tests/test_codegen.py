"""Rendering and compiling without a GPU: every option value renders and compiles for sm_90 and
sm_100a, and the PTX holds the instructions docs/NUMERICS.md asks for."""

import ast
import collections
import itertools
import math
import re
import shutil
import tempfile

import jinja2
import pytest
import torch

import mxq
from mxq.frontend import codegen
from mxq.runtime import cache, compiler, inspection, targets, toolchain
from mxq.frontend.epilogue import IDENTITY
from mxq.kernels import config as kconfig
from mxq.kernels import device as dev
from mxq.kernels.config import Tuning
from mxq.op import FusedOp, _identity
from mxq.frontend.spec import ACTIVATIONS, QuantSpec


def ident(x):
    return x


def residual(x, r, alpha: float = 0.5):
    return x * alpha + r


def smooth(x, r):
    return mxq.exp(-mxq.abs(x)) * mxq.tanh(r) + mxq.sqrt(mxq.abs(x)) / (1.0 + r * r)


def clipped(x):
    return mxq.minimum(mxq.maximum(x, -2.0), 2.0) * x - 1.0


# A sample of the cross product in which every value of every option appears (and every dtype).
SAMPLE = [
    (dict(fp8="e4m3"), ident, "bf16"),
    (dict(fp8="e5m2", rowwise=False, colwise=True, scale_mode="floor", scale_layout="swizzled", amax=True), ident, "fp16"),
    (dict(colwise=True, scale_mode="ceil", act="gelu", amax=True), ident, "fp32"),
    (dict(fp8="e5m2", colwise=True, scale_mode="even", scale_layout="swizzled", dact="silu", dbias=True), ident, "bf16"),
    (dict(scale_layout="swizzled", act="relu"), residual, "fp16"),
    (dict(rowwise=False, colwise=True, scale_mode="even", act="qgelu"), clipped, "bf16"),
    (dict(fp8="e5m2", scale_mode="ceil", act="srelu", dbias=True), ident, "fp32"),
    (dict(colwise=True, scale_mode="floor", dact="gelu", dbias=True, amax=True), ident, "bf16"),
    (dict(dact="relu"), ident, "bf16"),
    (dict(fp8="e5m2", rowwise=False, colwise=True, scale_layout="swizzled", dact="qgelu"), ident, "fp16"),
    (dict(colwise=True, dact="srelu"), smooth, "bf16"),
    (dict(act="silu"), ident, "bf16"),
]
EXACT = {0, 1, 4, 6, 8}  # no transcendental, no division: the exact class


def test_sample_covers_every_option_value():
    seen = {k: set() for k in ("fp8", "scale_mode", "scale_layout", "act", "dact", "amax", "dbias", "dir", "dtype")}
    for opts, _, dtype in SAMPLE:
        s = QuantSpec(**opts)
        for k in ("fp8", "scale_mode", "scale_layout", "act", "dact", "amax", "dbias"):
            seen[k].add(getattr(s, k))
        seen["dir"].add((s.rowwise, s.colwise))
        seen["dtype"].add(dtype)
    assert seen["fp8"] == {"e4m3", "e5m2"} and len(seen["scale_mode"]) == 4 and len(seen["scale_layout"]) == 2
    assert seen["act"] == {None, *ACTIVATIONS} and seen["dact"] == {None, *ACTIVATIONS}
    assert seen["amax"] == seen["dbias"] == {False, True} and len(seen["dir"]) == 3 and len(seen["dtype"]) == 3


def test_every_spec_renders_to_valid_python():
    count = 0
    for fp8, (rw, cw), mode, layout, amax, dbias, (act, dact) in itertools.product(
            ("e4m3", "e5m2"), ((True, False), (False, True), (True, True)), ("rceil", "floor", "ceil", "even"),
            ("compact", "swizzled"), (False, True), (False, True),
            [(None, None)] + [(a, None) for a in ACTIVATIONS] + [(None, a) for a in ACTIVATIONS]):
        spec = QuantSpec(fp8, rw, cw, mode, layout, amax, act, dact, dbias)
        src = codegen.render(spec, FusedOp(residual, QuantSpec()).epilogue)
        ast.parse(src)
        count += 1
    assert count == 2 * 3 * 4 * 2 * 2 * 2 * 11


def test_templates_are_strict():
    env = codegen.environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.get_template(codegen.TEMPLATE_NAME).render()


def test_user_text_never_reaches_the_source():
    def zz_user_fn(qq_tensor_name, ww_other, kk_scale: float = 1.5):
        """docstring text ZZTOP"""
        yy_local = qq_tensor_name * kk_scale
        return yy_local - ww_other

    src = FusedOp(zz_user_fn, QuantSpec()).source
    for word in ("zz_user_fn", "qq_tensor_name", "ww_other", "kk_scale", "yy_local", "ZZTOP"):
        assert word not in src


def _arts(i, arch):
    opts, fn, dtype = SAMPLE[i]
    return FusedOp(fn, QuantSpec(**opts)), inspection.compile_artifacts(FusedOp(fn, QuantSpec(**opts)), arch, dtype)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("i", range(len(SAMPLE)))
def test_compiles_with_expected_ptx(i, arch):
    op, art = _arts(i, arch)
    ptx = art["ptx"]
    assert f".target {arch}" in ptx
    cvt = "e4m3x2" if op.spec.fp8 == "e4m3" else "e5m2x2"
    assert f"cvt.rn.satfinite.{cvt}.f32" in ptx
    hw = "cvt.rp.satfinite.ue8m0x2.f32"
    assert (hw in ptx) == (arch == "sm_100a" and op.spec.scale_mode == "rceil")
    if SAMPLE[i][2] == "fp32":
        assert "max.NaN.f32" in ptx  # block amax propagates NaN
    else:  # 16-bit inputs: the packed kernel takes the amax of two values per instruction
        assert {"bf16": "max.NaN.bf16x2", "fp16": "max.NaN.f16x2"}[SAMPLE[i][2]] in ptx and "packed_kernel" in ptx
    if op.spec.amax:
        # device.amax_atomic: the slot read first, the max-combine only where it grows
        assert "ld.relaxed.gpu.global.s32" in ptx and "@p red.relaxed.gpu.global.max.s32" in ptx
    if op.spec.dbias:
        assert "add.f64" in ptx or "add.rn.f64" in ptx
    if i in EXACT:
        assert "fma.rn.f32" not in ptx, "exact-class ops must not contract a*b+c"
    if shutil.which("ptxas"):
        kernels = art["kernels"]
        assert any("_kernel_mxqkernels" in k for k in kernels)
        for name, info in kernels.items():
            assert info.get("spill_stores", 0) == 0 and info.get("spill_loads", 0) == 0, (name, info)
    assert art["mlir"].startswith("module")


def test_compiled_kernels_are_cached_by_fingerprint():
    def make(scale):
        def scaled(x):
            return x * scale

        return mxq.fused_quant()(scaled)

    a, b, c = make(2.0), make(2.0), make(3.0)
    ka = compiler.compile_op(a, "sm_90", "bf16")
    assert compiler.compile_op(b, "sm_90", "bf16") is ka, "re-decorating an identical function reuses the kernel"
    assert compiler.compile_op(c, "sm_90", "bf16") is not ka, "a changed constant compiles anew"


def test_source_file_is_real_and_importable(tmp_path, monkeypatch):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path))
    op = FusedOp(residual, QuantSpec(colwise=True))
    path = cache.source_file(op.source)
    assert path.is_file() and path.read_text() == op.source and str(path).startswith(str(tmp_path))
    mod = compiler.load_module(op.source)
    assert callable(mod.launch) and callable(mod.launch_vec) and mod.QUANTIZE.cfg == codegen.kernel_config(op.spec, op.epilogue)


def test_asm_rejects_bad_arguments():
    op = FusedOp(ident, QuantSpec())
    with pytest.raises(ValueError, match="arch"):
        op.asm(arch="hopper")
    with pytest.raises(ValueError, match="dtype"):
        op.asm(dtype="fp64")


@pytest.mark.parametrize("fn,opts", [(residual, dict(colwise=True, act="gelu")), (clipped, dict(scale_mode="floor")),
                                     (smooth, dict(fp8="e5m2", colwise=True, dbias=True))])
def test_cpu_result_is_quantize_of_epilogue_by_hand(fn, opts):
    op = mxq.fused_quant(**opts)(fn)
    k = len(op.epilogue.tensor_params)
    ins = [torch.randn(40, 70, dtype=torch.bfloat16) for _ in range(k)]
    got = op(*ins)
    v = fn(*[t.float() for t in ins])  # the epilogue, eagerly, in fp32
    if op.spec.act:
        v = mxq.frontend.activations.FORWARD[op.spec.act](v)
    v_rounded = v.to(torch.bfloat16).float()
    # expected bytes from tests/oracle.py (plain Python, no mxq code)
    from . import oracle

    want = {}
    if op.spec.rowwise:
        want["rowwise_data"] = torch.tensor(oracle.quantize_rows(v_rounded.tolist(), op.spec.fp8,
                                                                 op.spec.scale_mode)[0], dtype=torch.uint8)
    if op.spec.colwise:
        want["colwise_data"] = torch.tensor(oracle.quantize_rows(v_rounded.t().tolist(), op.spec.fp8,
                                                                 op.spec.scale_mode)[0], dtype=torch.uint8).t()
    for name, w in want.items():
        g = getattr(got, name).view(torch.uint8)
        # eager torch may evaluate transcendentals differently from the IR's op-by-op order:
        # allow a handful of one-code differences there, none for the exact ones
        assert (g != w).float().mean() <= (0 if op.epilogue.exact and not op.spec.act else 0.01)
    if op.spec.dbias:
        assert torch.allclose(got.dbias.float(), v.sum(0), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("i", [1, 3, 6, 10])
def test_generic_variant_compiles(i, arch):
    """The element-wise kernel (odd N, unaligned tensors) of the same sample compiles too."""
    opts, fn, dtype = SAMPLE[i]
    art = inspection.compile_artifacts(FusedOp(fn, QuantSpec(**opts)), arch, dtype, variant="generic")
    assert "ld.global.v4" not in art["ptx"]  # element-wise loads: serves any N and alignment
    cvt = "e4m3x2" if QuantSpec(**opts).fp8 == "e4m3" else "e5m2x2"
    assert f"cvt.rn.satfinite.{cvt}.f32" in art["ptx"]
    assert art["variant"] == "generic"


def test_vectorised_variant_uses_16_byte_loads():
    art = inspection.compile_artifacts(FusedOp(ident, QuantSpec(colwise=True)), "sm_90", "bf16", variant="vec")
    assert "ld.global.v4.b32" in art["ptx"] and "st.global.v2.b32" in art["ptx"]


def test_asm_leaves_the_working_directory_alone(tmp_path, monkeypatch):
    """CuTeDSL's --keep-ptx writes into the current directory by default; mxq points it at its cache."""
    def shifted(x):
        return x + 0.8125  # a constant no other test compiles: this really compiles here

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    art = mxq.fused_quant()(shifted).asm("sm_90", "bf16")
    assert ".entry" in art["ptx"]
    assert list(work.iterdir()) == []


def _on_half_tanh_grid(s, grid: bool = True):
    """device.half_tanh_ex2_act's last two steps: t = 1 - 2s rounded once, 0.5 - 0.5 t."""
    if not grid:
        return s
    t = (s.double() * -2.0 + 1.0).float()
    return (t.double() * -0.5 + 0.5).float()


def _run_records(records, out, env, grid: bool = True, unary=None):
    """Evaluate codegen SSA records on fp32 tensors (FMA as an fp64 product-sum rounded once,
    tanh_act as torch.tanh, ex2 and rcp exact): checks what the records compute, not how the GPU
    rounds. ``grid=False``: the half-tanh ops without their last two steps (a plain sigmoid);
    ``unary``: models of unary ops by name, used instead."""
    env = dict(env)
    ops = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
    for r in records:
        a = [env[v] for v in r.get("args", [])]
        if unary and r["kind"] == "unary" and r["op"] in unary:
            env[r["var"]] = unary[r["op"]](a[0])
        elif r["kind"] == "const":
            env[r["var"]] = torch.tensor(float(r["value"]), dtype=torch.float32)
        elif r["kind"] == "fma":
            env[r["var"]] = (a[0].double() * a[1].double() + a[2].double()).float()
        elif r["kind"] == "binary":
            env[r["var"]] = ops[r["op"]](a[0], a[1])
        elif r["kind"] == "unary" and r["op"] in ("tanh_act", "tanh"):
            env[r["var"]] = torch.tanh(a[0])
        elif r["kind"] == "unary" and r["op"] in ("sigmoid", "sigmoid_act"):
            env[r["var"]] = torch.sigmoid(a[0])
        elif r["kind"] == "unary" and r["op"] == "half_tanh_ex2_act":
            env[r["var"]] = _on_half_tanh_grid((1.0 / (1.0 + torch.exp2(a[0].double()))).float(), grid)
        elif r["kind"] == "unary" and r["op"] == "neg":
            env[r["var"]] = -a[0]
        elif r["kind"] == "compare":
            env[r["var"]] = {"gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le}[r["op"]](a[0], a[1])
        elif r["kind"] == "where":
            env[r["var"]] = torch.where(a[0], a[1], a[2])
        else:
            raise AssertionError(f"record kind not modelled: {r}")
    return env[out]


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("direction", ["act", "dact"])
def test_builtin_act_records_compute_the_numerics_formula(name, direction):
    from mxq.frontend import activations

    ep = activations.act_ir(name) if direction == "act" else activations.dact_ir(name)
    records, out = codegen.ssa(ep.expr, "f", {0: "x"}, {}, builtin=True)
    x = torch.linspace(-8, 8, 4001, dtype=torch.float32)
    got = _run_records(records, out, {"x": x})
    want = mxq.frontend.ir.evaluate(ep.expr, [x], [])
    # FMA contraction moves a value by about an fp32 ulp, never more than a few
    assert torch.allclose(got.double(), want.double(), rtol=2**-20, atol=2**-22)
    kinds = [r["kind"] for r in records]
    if name == "gelu" or direction == "dact" and name in ("silu", "qgelu"):
        assert "fma" in kinds
    if name in ("relu", "srelu"):
        assert "fma" not in kinds


def test_half_tanh_becomes_a_sigmoid_with_its_constant_folded():
    """gelu's 0.5 + 0.5 * tanh(y) is sigmoid(2y) = 1 / (1 + 2^(K y)), K = -2 log2 e; y =
    x * (c0 + c1 * x * x) takes K into its two constants (by hand: K * 0.79788456 and
    K * 0.035677408), so the act lowers to half_tanh_ex2_act. dgelu reads t twice (1 - t * t,
    1 + t) and keeps tanh_act; a user's own 0.5 + 0.5 * mxq.tanh (precise tanh, one rounding per
    operation) is left alone."""
    from mxq.frontend import activations

    k = -2.0 / math.log(2.0)
    records, out = codegen.ssa(activations.act_ir("gelu").expr, "f", {0: "x"}, {}, builtin=True)
    ops = [r.get("op") for r in records]
    assert "half_tanh_ex2_act" in ops and "tanh_act" not in ops and "mul" in ops
    assert sum(r["kind"] == "binary" and r["op"] == "mul" for r in records) == 3  # x * x * c1, x * (...), x * s
    consts = sorted(float(r["value"]) for r in records if r["kind"] == "const")
    for c in (0.79788456, 0.035677408):
        assert any(abs(v - k * c) <= 1e-6 * abs(k * c) for v in consts), (c, consts)
    x = torch.linspace(-12, 12, 24001, dtype=torch.float32)
    got = _run_records(records, out, {"x": x}).double()
    want = x.double() * torch.sigmoid(2.0 * x.double() * (0.79788456 + 0.044715 * 0.79788456 * x.double() ** 2))
    assert torch.allclose(got, want, rtol=2**-20, atol=2**-22)  # (the grid: 2^-26 in s, times |x| <= 12)
    records, _ = codegen.ssa(activations.dact_ir("gelu").expr, "g", {0: "a"}, {}, builtin=True)
    ops = [r.get("op") for r in records]
    assert "tanh_act" in ops and "half_tanh_ex2_act" not in ops

    def own_gelu(x):
        return x * (0.5 + 0.5 * mxq.tanh(x * 0.8))

    op = mxq.fused_quant()(own_gelu)
    records, _ = codegen.ssa(op.epilogue.expr, "e", {0: "x"}, {}, builtin=op.epilogue.builtin)
    ops = [r.get("op") for r in records]
    assert "tanh" in ops and not {"half_tanh_ex2_act", "tanh_act"} & set(ops)


def _x_times_c(c: str) -> list[dict]:
    """Hand-built SSA records: h = 0.5, c, y = x * c (for _half_tanh)."""
    return [{"kind": "const", "value": "0.5", "var": "h"}, {"kind": "const", "value": c, "var": "c"},
            {"kind": "binary", "op": "mul", "args": ["x", "c"], "var": "y"}]


def _half_tanh(arg: str, t: str, s: str) -> list[dict]:
    """Records of s = 0.5 + 0.5 * tanh_act(arg) as contract_fma leaves them: fma(h, t, h)."""
    return [{"kind": "unary", "op": "tanh_act", "args": [arg], "var": t},
            {"kind": "fma", "args": ["h", t, "h"], "var": s}]


def test_half_tanh_without_foldable_constants_multiplies_by_k():
    """A tanh argument y = x * c whose product is read twice cannot take K (the other reader
    would see it): a product y * K is added just before half_tanh_ex2_act, and y stays as it
    was. Read once, the same product takes K into c. Records built by hand."""
    recs = _x_times_c("1.25") + _half_tanh("y", "t", "s") + [
        {"kind": "binary", "op": "mul", "args": ["s", "y"], "var": "o"}]
    k = -2.0 / math.log(2.0)
    out = codegen.half_tanh_as_sigmoid(recs)
    by_var = {r["var"]: r for r in out}
    s = by_var["s"]
    assert s["op"] == "half_tanh_ex2_act" and "t" not in by_var
    z = by_var[s["args"][0]]
    assert z["op"] == "mul" and z["args"][0] == "y" and abs(float(by_var[z["args"][1]]["value"]) - k) < 1e-12
    assert [r["var"] for r in out].index(z["var"]) == [r["var"] for r in out].index("s") - 1
    assert by_var["y"]["args"] == ["x", "c"]
    x = torch.linspace(-3, 3, 601)
    got = _run_records(out, "o", {"x": x})
    assert torch.allclose(got, (0.5 + 0.5 * torch.tanh(x * 1.25)) * x * 1.25, rtol=1e-5, atol=1e-6)
    once = codegen.half_tanh_as_sigmoid(recs[:-1])
    by_var = {r["var"]: r for r in once}
    assert by_var["s"]["args"] == ["y"] and by_var["y"]["op"] == "mul"
    assert abs(float(by_var[by_var["y"]["args"][1]]["value"]) - 1.25 * k) < 1e-12


def test_nested_half_tanh_is_rewritten_once_each():
    """0.5 + 0.5 * tanh(0.5 + 0.5 * tanh(x * c)) by hand: both become half-tanh ops; the outer
    one's argument is the inner one's result, which is not a product of constants: it is
    multiplied by K (an earlier version rewrote it again, into an FMA reading the dropped tanh).
    Every record reads only variables defined before it."""
    recs = _x_times_c("0.75") + _half_tanh("y", "t1", "s1") + _half_tanh("s1", "t2", "s2")
    out = codegen.half_tanh_as_sigmoid(recs)
    ops = {r["var"]: r.get("op") for r in out}
    assert ops["s1"] == "half_tanh_ex2_act" and ops["s2"] == "half_tanh_ex2_act"
    assert "t1" not in ops and "t2" not in ops
    assert ops[next(r for r in out if r["var"] == "s2")["args"][0]] == "mul"  # s1 * K: s1 takes no K
    defined = {"x"}
    for r in out:
        assert set(r.get("args", [])) <= defined, (r, defined)
        defined.add(r["var"])
    x = torch.linspace(-4, 4, 801)
    want = 0.5 + 0.5 * torch.tanh(0.5 + 0.5 * torch.tanh(x * 0.75))
    assert torch.allclose(_run_records(out, "s2", {"x": x}), want, rtol=1e-5, atol=1e-6)


def test_fast_dact_error_bound():
    """docs/NUMERICS.md bounds the kernels' built-in dact(a) by DACT_SLACK * (1 + |a|) around the
    reference's (testing.DACT_SLACK, the dbias slack of dact ops). The lowered records, with
    ex2 and rcp off by up to 2 and 1 ulp in a fixed pseudo-random pattern (tests/fast_math.py),
    over a in [-30, 30]: the worst error is under the bound and within 8x of it (the bound is
    not loose by orders of magnitude)."""
    from mxq.frontend import activations
    from mxq.testing import DACT_SLACK
    from tests import fast_math

    gen = torch.Generator().manual_seed(0)

    def noise(k):
        return lambda shape: torch.randint(-k, k + 1, shape, generator=gen, dtype=torch.int32)

    a = torch.linspace(-30, 30, 600001, dtype=torch.float32)
    worst = 0.0
    for name in ("gelu", "silu", "qgelu"):
        got = fast_math.dact(name, a, noise(fast_math.EX2_ULPS), noise(fast_math.RCP_ULPS))
        want = mxq.frontend.ir.evaluate(activations.dact_ir(name).expr, [a], [])
        err = ((got.double() - want.double()).abs() / (1.0 + a.double().abs())).max().item()
        assert err <= DACT_SLACK, (name, math.log2(err))
        worst = max(worst, err)
    assert worst > DACT_SLACK / 8, math.log2(worst)


def test_fast_act_error_bound():
    """docs/NUMERICS.md bounds the kernels' built-in act(a) by V_SLACK |act(a)| + ACT_SLACK |a|
    around the reference's (testing.ACT_SLACK: relative accuracy alone fails in the tails, where
    gelu's 0.5 + 0.5 tanh cancels and the sigmoid's absolute error dominates a tiny v). The
    lowered records, with ex2 and rcp off by up to 2 and 1 ulp in a fixed pseudo-random pattern
    (tests/fast_math.py), over a in [-30, 30] and every finite bf16 and fp16 input: within the
    bound, the absolute term needed (relative error alone reaches far past V_SLACK) and within 8x
    of ACT_SLACK (not loose by orders of magnitude)."""
    from mxq.frontend import activations
    from mxq.testing import ACT_SLACK, V_SLACK
    from tests import fast_math

    gen = torch.Generator().manual_seed(0)

    def noise(k):
        return lambda shape: torch.randint(-k, k + 1, shape, generator=gen, dtype=torch.int32)

    every16 = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    a = torch.cat([torch.linspace(-30, 30, 600001, dtype=torch.float32), every16.view(torch.bfloat16).float(),
                   every16.view(torch.float16).float()])
    a = a[torch.isfinite(a)]
    worst, worst_rel = 0.0, 0.0
    for name in ("gelu", "silu", "qgelu"):
        records, out = mxq.frontend.codegen.ssa(activations.act_ir(name).expr, "g", {0: "a"}, {}, builtin=True)
        got = fast_math.run(records, out, {"a": a}, fast_math.unary_ops(noise(fast_math.EX2_ULPS),
                                                                        noise(fast_math.RCP_ULPS))).double()
        want = mxq.frontend.ir.evaluate(activations.act_ir(name).expr, [a], []).double()
        finite = torch.isfinite(want)
        err = (got - want).abs()[finite]
        over = ((err - V_SLACK * want.abs()[finite]).clamp_min(0.0) / a.double().abs()[finite]).nan_to_num(0.0)
        assert over.max().item() <= ACT_SLACK, (name, math.log2(over.max().item()))
        worst = max(worst, over.max().item())
        worst_rel = max(worst_rel, (err / want.abs()[finite]).nan_to_num(0.0, 0.0, 0.0).max().item())
    assert worst > ACT_SLACK / 8, math.log2(worst)
    assert worst_rel > 2 ** 10 * V_SLACK, math.log2(worst_rel)


def test_fast_dact_error_bound_next_to_its_roots():
    """dgelu, dsilu and dqgelu each cross zero once, at a ~ -0.7525, -1.2785 and -0.7512 (the
    gated gate halves too: geglu, swiglu, qgeglu). There both the kernels' and the reference's
    derivative cancel (z s (1 - s) against s; dgelu's two halves), so neither is relatively
    accurate. Exhaustively over the fp32 inputs within 2^16 ulps of each root and every finite
    bf16 and fp16 input, with ex2 and rcp off by each of -2/0/+2 and -1/0/+1 ulps
    (tests/fast_math.py), the kernels' derivative stays within DACT_SLACK (1 + |a|) of the
    reference's (the bound docs/NUMERICS.md states) and of the fp64 formula. The reference
    itself is off from the fp64 formula by more than 2^-27 (1 + |a|) next to each root: about
    2^-27 |d| there is 8 e5m2 codes of a block whose largest |v| is ~2, so no kernel derivative
    can give the reference's bytes within one code next to a root (the class is stated in
    absolute terms instead)."""
    from mxq.frontend import activations
    from mxq.testing import DACT_SLACK
    from tests import fast_math

    every16 = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    for name in ("gelu", "silu", "qgelu"):
        near = (torch.tensor(fast_math.root(name), dtype=torch.float32).view(torch.int32)
                + torch.arange(-2 ** 16, 2 ** 16 + 1, dtype=torch.int32)).view(torch.float32)
        a = torch.cat([near, every16.view(torch.bfloat16).float(), every16.view(torch.float16).float()])
        a = a[torch.isfinite(a)]
        ref = mxq.frontend.ir.evaluate(activations.dact_ir(name).expr, [a], []).double()
        exact = fast_math.dact_formula_f64(name, a)
        weight = 1.0 + a.double().abs()
        finite = torch.isfinite(ref)  # (not past fp32's range: a * a overflows for |a| > 1.8e19)
        for e, r in itertools.product((-2, 0, 2), (-1, 0, 1)):
            got = fast_math.dact(name, a, e, r).double()
            for want in (ref, exact):
                err = ((got - want).abs() / weight)[finite].max().item()
                assert err <= DACT_SLACK, (name, e, r, math.log2(err))
        ref_err = ((ref - exact).abs() / weight)[: near.numel()].max().item()
        assert ref_err > 2.0 ** -27, (name, math.log2(ref_err))


def test_dqgelu_ptx_is_the_modelled_chain():
    """tests/fast_math.py models the kernels' built-in derivative as the PTX computes it. The
    fp32 dact="qgelu" + dbias e5m2 op (rowwise and colwise) on sm_90a: per element z = 1.702 a
    and z * -log2(e) rounded, ex2.approx.ftz, 1 + that rounded, rcp.approx.ftz, 1 - s, s (1 - s)
    rounded, one fma, then d times it; as many of each approximate instruction as fma's, and
    no other approximate or division instruction."""
    op = mxq.fused_quant(rowwise=True, colwise=True, fp8="e5m2", dact="qgelu", dbias=True)(ident)
    ptx = compiler.compile_op(op, "sm_90a", "fp32", keep_ptx=True, variant="vec").__ptx__
    chain = re.search(
        r"mul\.rn\.f32\s+(%r\d+), %r\d+, %r\d+;\s+mov\.b32\s+(%r\d+), 0fBFB8AA3B;\s+"
        r"mul\.rn\.f32\s+(%r\d+), \1, \2;.*?ex2\.approx\.ftz\.f32\s+(%r\d+), %r\d+;.*?"
        r"add\.rn\.f32\s+(%r\d+), \4, (%r\d+);.*?rcp\.approx\.ftz\.f32\s+(%r\d+), %r\d+;\s+.*?"
        r"sub\.rn\.f32\s+(%r\d+), \6, \7;\s+mul\.rn\.f32\s+(%r\d+), \7, \8;\s+"
        r"fma\.rn\.f32\s+%r\d+, \1, \9, \7;", ptx, re.S)
    assert chain, "the dqgelu chain of the modelled PTX is not in the kernel"
    assert "0f3FD9DB23" in ptx  # 1.702 as fp32
    counts = collections.Counter(re.findall(r"^\s*((?:ex2|rcp|tanh|div|lg2|sqrt|rsqrt)\.[\w.]+|fma\.rn\.f32)", ptx, re.M))
    assert set(counts) == {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32", "fma.rn.f32"}, counts
    assert counts["ex2.approx.ftz.f32"] == counts["rcp.approx.ftz.f32"] == counts["fma.rn.f32"] > 0, counts


def _bias_plus(x, b):
    return x + b


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_padding_rows_are_masked_per_row_without_dbias(arch):
    """A user epilogue may map the zero padding of rows past M to nonzero (here x + b = b). The
    packed kernel of an op without dbias zeroes the padding's magnitudes with one mask per row
    (ROW_MASK; on unaligned rows AND-ed with the masks of columns past N), so no per-element
    select of v against 0.0 is left; with dbias (which sums v) every value is still selected.
    Counted in the packed kernel's PTX; the bytes are checked on the GPU by test_gpu.py's
    broadcast-operand tests, whose M = 80 leaves padding rows equal to the bias, and the
    unaligned-row tests."""
    def selects(op, variant):
        ptx = inspection.ptx_of(op, arch, "bf16", variant, ("full", "row"))
        body = ptx[ptx.index(".entry kernel_cutlass_packed_kernel"):]
        body = body[:body.index("\n}\n")]
        return len(re.findall(r"selp\.f32[^;]*0f00000000[^;]*;", body))

    plain = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(_bias_plus)
    dbias = mxq.fused_quant(rowwise=True, colwise=True, act="gelu", dbias=True)(_bias_plus)
    assert selects(plain, "vec") == 0
    assert selects(dbias, "vec") >= kconfig.VEC * 4  # every value of the thread's rows
    assert selects(plain, "generic") == 0
    assert selects(dbias, "generic") >= kconfig.VEC * 4


def _gelu_and_its_argument(x):
    # (the second term is gelu's own tanh argument: the IR shares it, so it is read twice)
    return mxq.gelu(x) + x * (0.79788456 + 0.03567741 * x * x)


def test_half_tanh_of_a_shared_argument_multiplies_by_k():
    """A user epilogue that also uses gelu's tanh argument y itself (the IR shares equal nodes):
    y is read twice and cannot take K, so the lowering multiplies it by K before
    half_tanh_ex2_act; the records compute gelu(x) + y within a few ulp, and the module
    compiles."""
    op = mxq.fused_quant(rowwise=True)(_gelu_and_its_argument)
    records, out = codegen.ssa(op.epilogue.expr, "e", {0: "x"}, {}, builtin=op.epilogue.builtin)
    by_var = {r["var"]: r for r in records}
    half = [r for r in records if r.get("op") == "half_tanh_ex2_act"]
    assert len(half) == 1 and "tanh_act" not in [r.get("op") for r in records]
    z = by_var[half[0]["args"][0]]
    assert z["op"] == "mul" and abs(float(by_var[z["args"][1]]["value"]) + 2.0 / math.log(2.0)) < 1e-12
    x = torch.linspace(-6, 6, 12001, dtype=torch.float32)
    got = _run_records(records, out, {"x": x}).double()
    want = mxq.frontend.ir.evaluate(op.epilogue.expr, [x], []).double()
    assert torch.allclose(got, want, rtol=2**-20, atol=2**-22)
    assert ".entry" in inspection.ptx_of(op, "sm_90a", "bf16", "vec")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_lowering_stays_in_the_transcendental_class(dtype):
    """The act's records (ex2 and rcp taken exact) against the reference's formula, through the
    reference's own quantizer: at most 1 in 1e4 FP8 bytes differ. On N(0, 3^2) inputs a plain
    sigmoid(2y) (grid=False) is more accurate than the formula, whose 0.5 + 0.5 * t cancels for
    y < 0, and misses it in about 1 in 1e4 fp32 bytes (the H200 found up to 14 of 67584 on a test);
    the grid step of half_tanh_ex2_act brings that to a few in 1e6 (CPU counterpart of the GPU
    tests of act="gelu")."""
    differing, budget = _class_rate("gelu", "act", dtype)
    assert differing(True) <= budget // 20
    if dtype == torch.float32:
        assert differing(False) > budget // 2  # what the grid step is for


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,direction", [("silu", "act"), ("qgelu", "act"), ("gelu", "dact"),
                                            ("silu", "dact"), ("qgelu", "dact")])
def test_builtin_lowerings_stay_in_the_transcendental_class(name, direction, dtype):
    """The other transcendental built-ins the same way (dact: v = d * dact(a), d ~ N(0, 1)): the
    lowering's FMAs and rewrites, with the fast tanh and sigmoid taken exact, move at most 1 in
    2e5 FP8 bytes off the reference's (0 or 1 of 1048576 today; the class allows 104): a
    guard for future lowering rewrites, which the device's approximations then have the rest of
    the class for."""
    differing, budget = _class_rate(name, direction, dtype)
    assert differing(True) <= budget // 20


def _class_rate(name: str, direction: str, dtype):
    """(differing(grid) -> FP8 data bytes of the emulated records that differ from the
    reference's, the class's budget) on 1024 x 1024 N(0, 3^2) inputs."""
    from mxq.frontend import activations
    from mxq.formats.reference import quantize_blocks
    from mxq.frontend.spec import QuantSpec

    ep = activations.act_ir(name) if direction == "act" else activations.dact_ir(name)
    records, out = codegen.ssa(ep.expr, "f", {0: "x"}, {}, builtin=True)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(1024, 1024, generator=gen) * 3.0).to(dtype).float()
    d = torch.randn(1024, 1024, generator=gen).to(dtype).float() if direction == "dact" else None

    def value(f):
        return f if d is None else d * f

    want = ir_round(value(mxq.frontend.ir.evaluate(ep.expr, [x], [])), dtype)
    fmt = QuantSpec().element
    ref, _ = quantize_blocks(want, fmt, "rceil")

    def differing(grid):
        got = ir_round(value(_run_records(records, out, {"x": x}, grid=grid)), dtype)
        return int((quantize_blocks(got, fmt, "rceil")[0].view(torch.uint8) != ref.view(torch.uint8)).sum())

    return differing, x.numel() // 10000


def ir_round(v, dtype):
    """NUMERICS step 5: a computed value rounded to a 16-bit input's format."""
    return v if dtype == torch.float32 else v.to(dtype).float()


def test_fma_contraction_is_builtin_only_and_skips_subtractions():
    from mxq.frontend import activations

    def fused_looking(x, r):
        return x * r + 1.0 - x * x

    user = mxq.fused_quant()(fused_looking)
    records, _ = codegen.ssa(user.epilogue.expr, "e", {0: "x", 1: "r"}, {})
    assert all(r["kind"] != "fma" for r in records), "user epilogues keep one rounding per operation"
    records, _ = codegen.ssa(activations.dact_ir("gelu").expr, "g", {0: "a"}, {}, builtin=True)
    by_var = {r["var"]: r for r in records}
    subs = [r for r in records if r["kind"] == "binary" and r["op"] == "sub"]
    # dgelu's 1 - t*t: t*t stays a rounded product, as in the reference (it cancels near |t| = 1)
    assert any(by_var.get(s["args"][1], {}).get("op") == "mul" for s in subs)
    assert sum(r["kind"] == "fma" for r in records) >= 3


def test_activation_calls_in_user_epilogues_lower_as_builtin():
    """mxq.silu(g) * u: the activation's own nodes lower as act= does (sigmoid_act, FMAs), the
    user's arithmetic around them keeps one rounding per operation."""

    def swiglu_like(g, u):
        return mxq.silu(g * 2.0 + u) * u + g * u

    op = mxq.fused_quant()(swiglu_like)
    records, out = codegen.ssa(op.epilogue.expr, "e", {0: "g", 1: "u"}, {}, builtin=op.epilogue.builtin)
    ops = [r.get("op") for r in records]
    assert "sigmoid_act" in ops and "sigmoid" not in ops
    assert all(r["kind"] != "fma" for r in records), "the user's g * 2 + u and (...) * u + g * u stay rounded"
    g, u = torch.randn(1000), torch.randn(1000)
    got = _run_records(records, out, {"g": g, "u": u})
    assert torch.allclose(got, mxq.frontend.ir.evaluate(op.epilogue.expr, [g, u], []), rtol=1e-6, atol=1e-6)
    plain = mxq.fused_quant()(lambda_free_sigmoid)
    records, _ = codegen.ssa(plain.epilogue.expr, "e", {0: "x"}, {}, builtin=plain.epilogue.builtin)
    assert [r.get("op") for r in records if r["kind"] == "unary"] == ["sigmoid"], "mxq.sigmoid stays precise"


def lambda_free_sigmoid(x):
    return mxq.sigmoid(x) * x


def test_power_of_two_scaled_sum_becomes_a_bit_exact_fma():
    """dgelu's 0.5 * (1 + t) is emitted as fma(t, 0.5, 0.5): the same bits for every t in
    [-1, 1] (scaling by 2^k commutes with rounding), one instruction fewer; never for users."""
    from mxq.frontend import activations

    records, _ = codegen.ssa(activations.dact_ir("gelu").expr, "g", {0: "a"}, {}, builtin=True)
    consts = {r["var"]: float(r["value"]) for r in records if r["kind"] == "const"}
    scaled = [r for r in records if r["kind"] == "fma" and consts.get(r["args"][1]) == 0.5
              and consts.get(r["args"][2]) == 0.5]
    assert len(scaled) == 1
    g = torch.Generator().manual_seed(7)
    t = torch.cat([torch.rand(200_000, generator=g) * 2 - 1, torch.tensor([-1.0, -1 + 2**-24, -0.0, 0.0, 1.0]),
                   torch.tanh(torch.linspace(-20, 20, 100_001))]).float()
    want = 0.5 * (1.0 + t)  # fp32, two roundings (the reference)
    got = (t.double() * 0.5 + 0.5).float()  # an FMA: exact product-sum, one rounding
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))

    def user(x):
        return 0.5 * (x + 1.0)

    records, _ = codegen.ssa(mxq.fused_quant()(user).epilogue.expr, "e", {0: "x"}, {})
    assert all(r["kind"] != "fma" for r in records)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_builtin_acts_keep_zero_padding(name):
    """The packed kernel loads zeros past row M and skips the row mask for built-in act/dact:
    that needs act(0) == 0 and 0 * dact(0) == 0, i.e. dact(0) finite."""
    from mxq.frontend import activations

    zero = torch.zeros(1)
    assert mxq.frontend.ir.evaluate(activations.act_ir(name).expr, [zero], []).item() == 0.0
    assert torch.isfinite(mxq.frontend.ir.evaluate(activations.dact_ir(name).expr, [zero], [])).all()


def _bench_tool(name: str):
    """Import bench/<name>.py (a script directory, not a package; its siblings importable)."""
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
        tool = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool)
    finally:
        sys.path.remove(str(bench))
    return tool


def test_ptx_count_tool_ranks_the_fused_ops_above_the_plain_cast():
    """bench/ptx_count.py (the CPU-side speed predictor): counts are positive and the gelu
    fusion costs more instructions per element than the plain rowwise+colwise cast."""
    tool = _bench_tool("ptx_count")
    both = tool.count(QuantSpec(**tool.OPS["both"]), "sm_90", "bf16")
    gelu = tool.count(QuantSpec(**tool.OPS["gelu_both"]), "sm_90", "bf16")
    assert 5 < both["per_element"] < gelu["per_element"]
    # staged ops (arithmetic) and plain casts run the packed kernel with 4 warps x 8 rows
    assert gelu["vwarps"] == 4 and both["vwarps"] == 4
    if shutil.which("ptxas"):
        assert isinstance(both["registers"], int) and both["registers"] > 0


def test_tuning_is_part_of_the_source():
    """A benchmark's Tuning is rendered into its variant's module (CONFIG), so it is part of
    every compile key; a library module carries none, and one equal to the library's choice is
    the library's module. A variant op is built through FusedOp._with_tuning, before first use."""
    spec = QuantSpec(rowwise=True, colwise=True, dact="gelu", dbias=True)
    default = codegen.render(spec, IDENTITY)
    assert "Tuning" not in default and "tuning=" not in default
    assert default == codegen.render(spec, IDENTITY, Tuning())
    off = codegen.render(spec, IDENTITY, Tuning(pdl=False))
    assert off != default and "Tuning(pdl=False" in off
    op = FusedOp(_identity, spec, IDENTITY)
    assert op._with_tuning(Tuning(pdl=False)).source == off and not hasattr(op, "_tuning")
    with pytest.raises(RuntimeError, match="before"):
        op._with_tuning(Tuning())


def test_rendered_module_is_short_and_reads_as_cuTeDSL():
    """The module of act="gelu", colwise=True on an identity epilogue holds only what varies per
    op (config, element functions, launchers): far under 400 lines, no unrolled temporaries."""
    def ident(x):
        return x

    src = mxq.fused_quant(act="gelu", colwise=True)(ident).source
    assert len(src.splitlines()) <= 400
    assert not re.search(r"\b(fIn\d+_\d+|w\d+_\d+|sr\d+|rs\d+|a\d+_\d+)\b", src)
    assert src.count("0.7978845834732056") == 1, "the gelu formula appears once"
    ast.parse(src)


def test_templates_are_mostly_python():
    """At most one template line in ten is a Jinja statement: the kernels are mxq/kernels/."""
    from pathlib import Path

    root = Path(mxq.__file__).resolve().parent.parent / "templates"
    lines = [ln for p in root.rglob("*.j2") for ln in p.read_text().splitlines()]
    statements = [ln for ln in lines if ln.strip().startswith(("{%", "{#"))]
    assert lines and len(statements) * 10 <= len(lines), (len(statements), len(lines))


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_generic_kernel_issues_its_loads_first(arch):
    """The generic kernel (fp32 with N % 8 != 0 or unaligned tensors): every row's loads of every
    input come before the first store, so their latencies overlap (no row's arithmetic waits for
    that row's load alone). The GPU side: bench/device_check.py's odd shapes (generic-kernel
    cases) and its --odd timing."""
    def ident(x):
        return x

    op = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)
    body = _entry(inspection.compile_artifacts(op, arch, "fp32", "generic")["ptx"], "generic_kernel")
    loads = [m.start() for m in re.finditer(r"\bld\.global", body)]
    first_store = body.index("st.global")
    assert len(loads) >= 2 * kconfig.ROWS  # the input and act_input, every row
    assert max(loads) < first_store


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_generic_rowwise_reduces_each_row_in_one_instruction(arch):
    """The generic kernel's rowwise blocks (fp32 at any N): a row's block amax is one redux.sync
    over the magnitudes' bits (device.warp_amax), not five shuffle-and-max steps; each lane keeps
    one row's scale byte and stores it once (one scale store per thread, not one per row by lane
    0); row addresses are stepped from row to row (no 64-bit multiply per row). The GPU side:
    test_gpu.py's fp32 cases at odd shapes with planted NaN, inf and subnormals, and
    bench/device_check.py --odd-only (fp32 rows)."""
    def ident(x):
        return x

    op = mxq.fused_quant(rowwise=True, colwise=False)(ident)
    body = _entry(inspection.compile_artifacts(op, arch, "fp32", "generic")["ptx"], "generic_kernel")
    assert len(re.findall(r"\bredux\.sync\.max\.u32", body)) == kconfig.ROWS
    assert "shfl.sync" not in body
    assert f"{dev.ABS32}" in body or f"0x{dev.ABS32:08x}" in body.lower()  # (|v|'s bits)
    assert len(re.findall(r"\bst\.global\.b8", body)) == kconfig.ROWS + 1  # data per row + one scale
    assert len(re.findall(r"\b(?:mad|mul)\.(?:lo|wide)\.[su]64", body)) < kconfig.ROWS


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_fp32_unaligned_rows_are_staged_by_words_or_chunks(arch):
    """Variant rows8 of an fp32 op (FP8 rows on 8-byte boundaries, any N and input alignment)
    runs the vectorised kernel with its rows staged by cp.async (KernelConfig.vec_unaligned), in
    the form KernelConfig.vec_unaligned_chunks picks (Tuning.vec_unaligned_copy forces either):
    words, per row and source 4 copies of 8 bytes (a row that starts on 8 bytes) or 8 of 4 bytes
    (a branch per row) and two 16-byte shared loads; chunks, per row and source 3 copies of 16
    bytes (unaligned.stage_row: 65 chunks over 32 lanes) and two realigning branch tables. Both:
    one 8-byte store per row and direction (the partial last unit's byte stores in a branch), no
    16-byte global load. A plain colwise cast and a two-halves op keep the element-wise kernel.
    The GPU side: test_gpu.py::test_fp32_unaligned_rows_match_reference (every case in the form
    it takes by default; bench/device_check.py-style runs time both)."""
    import dataclasses

    def ident(x):
        return x

    cases = [(dict(rowwise=True), 1, 1, True), (dict(rowwise=True, colwise=True, act="gelu"), 1, 2, False),
             (dict(rowwise=True, colwise=True, dact="gelu", dbias=True), 2, 2, True)]
    for opts, nsrc, ndirs, chunks in cases:
        for copy in ("", "words" if chunks else "chunks"):
            op = mxq.fused_quant(**opts)(ident)._with_tuning(Tuning(vec_unaligned_copy=copy))
            cfg = codegen.kernel_config(op.spec, op.epilogue, Tuning(vec_unaligned_copy=copy))
            assert cfg.vec_unaligned and cfg.vec_unaligned_chunks == (chunks != bool(copy)), (opts, copy)
            rows = kconfig.ROWS // cfg.vec_warps
            body = _entry(inspection.compile_artifacts(op, arch, "fp32", "rows8")["ptx"], "vec_kernel")
            words = re.findall(r"cp\.async\.ca\.shared\.global \[%r\d+(?:\+\d+)?\], \[%rd\d+(?:\+\d+)?\], (\d+)", body)
            wide = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+(?:\+\d+)?\], \[%rd\d+(?:\+\d+)?\], 16", body)
            if cfg.vec_unaligned_chunks:
                assert not words and len(wide) == 3 * rows * nsrc, (opts, copy, len(wide))
                assert body.count("brx.idx.uni") == 2 * rows * nsrc
            else:
                assert not wide and "brx.idx" not in body
                assert words.count("4") == rows * kconfig.VEC * nsrc
                assert words.count("8") == rows * kconfig.VEC // 2 * nsrc
                assert len(re.findall(r"\bld\.shared\.v4\.[bf]32", body)) == 2 * rows * nsrc
            assert not re.search(r"\bld\.global\.v4", body)
            assert len(re.findall(r"\bst\.global\.v2\.b32", body)) == rows * ndirs, opts
            # each row read after its copies landed in every lane: a wait and a warp barrier per row
            assert body.count("bar.warp.sync") == rows and body.count("cp.async.wait_group") >= rows
    # the default form by hand: words only for one input with colwise output
    def add(x, r):
        return x + r

    both = dict(rowwise=True, colwise=True)
    for opts, fn, chunks in ((both, add, True), (both, ident, False),
                             (dict(rowwise=False, colwise=True, act="gelu"), ident, False),
                             (dict(rowwise=True, colwise=False, act="gelu"), ident, True)):
        op = mxq.fused_quant(**opts)(fn)
        assert codegen.kernel_config(op.spec, op.epilogue, None).vec_unaligned_chunks == chunks, (opts, fn)
    colwise = mxq.fused_quant(rowwise=False, colwise=True)(ident)
    cfg = codegen.kernel_config(colwise.spec, colwise.epilogue, None)
    assert not cfg.vec_unaligned and not dataclasses.replace(cfg, colwise=True, rowwise=True, halves=True).vec_unaligned
    assert "generic_kernel" in inspection.compile_artifacts(colwise, arch, "fp32", "rows8")["ptx"]


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_fp32_unaligned_scalar_operand_is_loaded_once(arch):
    """The vectorised fp32 kernel of unaligned rows (variant rows8) loads a scalar operand (0-d,
    strides (0, 0)) once per thread, where a row operand takes one load per existing column: one
    scalar global load more than the same op without the operand. (It took 8 predicated loads of
    the same element before.) The GPU side: test_gpu.py::test_fp32_unaligned_operands_match_reference
    with a scalar."""
    def scaled(x, s):
        return x * s

    def loads(layouts):
        op = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(scaled)
        body = _entry(inspection.compile_artifacts(op, arch, "fp32", "rows8", layouts)["ptx"], "vec_kernel")
        return len(re.findall(r"\bld\.global(?:\.nc)?\.[bfu]32", body))

    base = loads(("full", "full"))  # (both staged by cp.async, as chunks: only the noop flag's load)
    assert loads(("full", "scalar")) == base + 1
    assert loads(("full", "row")) == base + kconfig.VEC


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_unaligned_rows_are_staged_and_stored_as_words(arch, dtype):
    """16-bit inputs at any N or alignment run the packed kernel with unaligned rows
    (mxq/kernels/unaligned.py): each row segment is copied as whole 16-byte chunks (cp.async,
    every row requested before the first store), read back with funnel shifts, and FP8 rows
    leave as realigned 8-byte units (bytes only at a segment's edges); no 16-byte global load,
    which would need aligned rows. The GPU side: test_gpu.py::test_unaligned_rows_match_reference
    and bench/device_check.py --matrix / --odd."""
    def ident(x):
        return x

    op = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)
    ptx = inspection.compile_artifacts(op, arch, dtype, "generic")["ptx"]
    assert "generic_kernel" not in ptx
    body = _entry(ptx, "packed_kernel")
    copies = [m.start() for m in re.finditer(r"\bcp\.async\.cg\.shared\.global", body)]
    assert len(copies) >= 2 * 2 * (kconfig.ROWS // 8)  # two sources, two chunks per lane, every row of the thread
    assert max(copies) < body.index("st.global")
    assert "shf.r.clamp.b32" in body
    assert "st.global.v2.b32" in body and re.search(r"\bst\.global\.b8\b", body)
    assert not re.search(r"\bld\.global(\.\w+)*\.v4", body)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_unaligned_rows_store_whole_units_when_aligned(arch):
    """The unaligned packed kernel has a second store form for FP8 rows that start on 8-byte
    boundaries (padded outputs): each lane's 8 bytes as one aligned store, chosen per warp at run
    time, so a plain cast's kernel holds twice the 8-byte stores of one form. dbias ops and ops
    with arithmetic keep one form (docs/performance.md, "N % 8 != 0"). The GPU side:
    test_gpu.py::test_padded_outputs_match_reference."""
    def ident(x):
        return x

    def stores(op, variant="generic"):
        body = _entry(inspection.compile_artifacts(op, arch, "bf16", variant)["ptx"], "packed_kernel")
        return len(re.findall(r"\bst\.global\.v2\.b32", body)), len(re.findall(r"\bshfl\.sync", body))

    plain = mxq.fused_quant(rowwise=True, colwise=True)(ident)
    dbias = mxq.fused_quant(rowwise=True, colwise=True, dbias=True)(ident)
    gelu = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(ident)
    rows = kconfig.ROWS // 8  # (plain and dbias casts run 8 warps of 4 rows, gelu 4 warps of 8)
    assert stores(dbias)[0] == 2 * rows  # one realigned store per row and direction
    assert stores(plain)[0] == 2 * stores(dbias)[0]
    assert stores(gelu)[0] == 2 * 2 * rows
    # variant "rows8" (the host saw FP8 rows on 8-byte boundaries) holds the aligned form alone, for
    # every op: one store per row and direction, and none of the realigned stores' two shuffles per
    # row and direction (the shuffles left are the row scales'). A plain cast's rows8 holds a kernel
    # at 8 warps (4 rows a thread, as its generic kernel) and one at 4 (8 rows a thread; its
    # shuffles against the generic kernel compiled at 4 warps)
    for op, nrows in ((plain, rows), (dbias, rows), (gelu, 2 * rows)):
        (st8, sh8), (st, sh) = stores(op, "rows8"), stores(op)
        assert st8 == 2 * nrows
        realigned_shuffles = 2 * 2 * nrows
        assert sh8 == sh - realigned_shuffles, (op.spec, sh8, sh)
    ptx = inspection.compile_artifacts(plain, arch, "bf16", "rows8")["ptx"]
    at4 = ptx[[m.start() for m in re.finditer(r"\.entry kernel_cutlass_packed_kernel", ptx)][1]:]
    plain4 = mxq.fused_quant(rowwise=True, colwise=True)(ident)._with_tuning(kconfig.Tuning(unaligned_warps=4))
    _, sh4 = stores(plain4)
    assert re.search(r"\.reqntid (\d+)", at4).group(1) == "128"
    assert len(re.findall(r"\bst\.global\.v2\.b32", at4)) == 2 * 2 * rows
    assert len(re.findall(r"\bshfl\.sync", at4)) == sh4 - 2 * 2 * 2 * rows


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_rows8_plain_casts_pick_warps_by_row_stride_parity(arch):
    """Variant rows8 of a plain cast without dbias compiles its packed kernel twice, at 8 warps
    and at 4 (KernelConfig.rows8_warps: for even and for odd input row strides; docs/
    performance.md, "N % 8 != 0"), and its host launcher picks one by the parity; ops
    with arithmetic or dbias, other variants and an explicit Tuning.unaligned_warps hold one
    packed kernel. The GPU side: test_gpu.py::test_default_outputs_pad_odd_rows (N = 1030 and
    4100 even, 333 and 5 odd) and the padded-output tests."""
    def ident(x):
        return x

    def threads(op, variant="rows8"):
        """Threads of each packed kernel, in the order the launcher traced them (its even-stride
        branch first)."""
        ptx = inspection.compile_artifacts(op, arch, "bf16", variant)["ptx"]
        return [int(re.search(r"\.reqntid (\d+)", ptx[m.start():]).group(1))
                for m in re.finditer(r"\.entry kernel_cutlass_packed_kernel", ptx)]

    for opts in (dict(rowwise=True), dict(rowwise=False, colwise=True), dict(rowwise=True, colwise=True, amax=True)):
        op = mxq.fused_quant(**opts)(ident)
        cfg = codegen.kernel_config(op.spec, op.epilogue)
        assert [c.packed_warps(True) for c in cfg.rows8_twins()] == [8, 4]  # (even, odd)
        assert threads(op) == [8 * 32, 4 * 32], opts
        assert len(threads(op, "generic")) == 1
        pinned = mxq.fused_quant(**opts)(ident)._with_tuning(kconfig.Tuning(unaligned_warps=8))
        assert threads(pinned) == [8 * 32]
    for opts in (dict(rowwise=True, colwise=True, act="gelu"), dict(rowwise=True, colwise=True, dbias=True)):
        assert len(threads(mxq.fused_quant(**opts)(ident))) == 1, opts


def test_rows8_register_cap_reaches_the_ptx(monkeypatch):
    """Tuning.rows8_min_blocks (a benchmark's register cap for variant rows8) compiles into the
    rows8 kernel's PTX as .minnctapersm, and nowhere else. (With a cap the DSL reads the SM's
    shared memory size from the driver: stubbed here with the H200's, as no GPU is present.)"""
    toolchain.import_cutlass("sm_90")
    import cutlass.cutlass_dsl.cutlass as dsl

    monkeypatch.setattr(dsl.cuda_helpers, "get_device_attribute", lambda attr: 228 * 1024)

    def ident(x):
        return x

    op = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)
    op._with_tuning(kconfig.Tuning(rows8_min_blocks=4))
    ptx8 = _entry(inspection.compile_artifacts(op, "sm_90", "bf16", "rows8")["ptx"], "packed_kernel")
    ptxg = _entry(inspection.compile_artifacts(op, "sm_90", "bf16", "generic")["ptx"], "packed_kernel")
    assert re.search(r"\.minnctapersm\s+4", ptx8) and ".minnctapersm" not in ptxg


@pytest.fixture
def no_device_query(monkeypatch):
    """The DSL may not ask a device for an attribute (the SM's shared memory): a query fails."""
    toolchain.import_cutlass("sm_90")
    import cutlass.cutlass_dsl.cutlass as dsl

    def no_device(attr):
        raise AssertionError("the register cap asked the driver for a device attribute")

    monkeypatch.setattr(dsl.cuda_helpers, "get_device_attribute", no_device)


def test_rows128_register_cap_reaches_the_ptx_with_no_device_query(no_device_query):
    """Tuning.rows128_min_blocks compiles into the 128-row tile's packed kernel (FP8 block
    scaling's colwise blocks) as .minnctapersm, and not into a 32-row tile's; with no Tuning a
    plain cast writing both directions takes the library's cap of 2; the cap names the
    default carveout, so the DSL asks no device for the SM's shared memory (a query here fails)."""
    def ident(x):
        return x

    def ptx(**opts):
        op = mxq.fused_quant(**opts)(ident)
        op._with_tuning(kconfig.Tuning(rows128_min_blocks=2))
        return _entry(inspection.compile_artifacts(op, "sm_90", "bf16", "vec")["ptx"], "packed_kernel")

    assert re.search(r"\.minnctapersm\s+2", ptx(format="fp8_block", colwise=True))
    # the library's default (KernelConfig.min_blocks) caps a plain cast writing both directions
    default = mxq.fused_quant(format="fp8_block", colwise=True)(ident)
    assert re.search(r"\.minnctapersm\s+2",
                     _entry(inspection.compile_artifacts(default, "sm_90", "bf16", "vec")["ptx"], "packed_kernel"))
    assert ".minnctapersm" not in ptx(format="fp8_block")  # (1x128 rowwise: the 32-row tile)
    assert ".minnctapersm" not in ptx(colwise=True)  # (MXFP8)


def test_rows128_default_cap_reaches_dact_dbias_ptx(no_device_query):
    """The library's default cap (KernelConfig.packed_min_blocks) reaches the PTX of FP8 block
    scaling's dgelu + dbias writing both directions on bf16 inputs as .minnctapersm 2, with its
    staged rows as a ring (KernelConfig.stage_rows: no cp.async.wait_group above 3, the last
    four rows' words parked with st.shared.v4); not the same op on fp16 inputs (all 8 rows
    staged at once: a wait_group 7) nor its unaligned kernel (whose staged rows would not let two
    CTAs share an SM). No device is asked for the SM's shared memory."""
    def ident(x):
        return x

    op = mxq.fused_quant(format="fp8_block", colwise=True, dact="gelu", dbias=True)(ident)

    def ptx(dtype, variant):
        return _entry(inspection.compile_artifacts(op, "sm_90", dtype, variant)["ptx"], "packed_kernel")

    bf16 = ptx("bf16", "vec")
    waits = [int(w) for w in re.findall(r"cp\.async\.wait_group\s+(\d+)", bf16)]
    assert re.search(r"\.minnctapersm\s+2", bf16) and max(waits) == 3 and len(waits) == 8
    assert len(re.findall(r"st\.shared\.v4\.b32", bf16)) == 4
    fp16 = ptx("fp16", "vec")
    assert ".minnctapersm" not in fp16 and re.search(r"cp\.async\.wait_group\s+7", fp16)
    assert ".minnctapersm" not in ptx("bf16", "generic")


def test_fp8_block_bench_cases_are_served_ops_with_their_bytes():
    """bench/fp8_block.py: every mxq row is an op whose reference runs (so the GPU run checks it
    first), its bytes by hand (bf16 in, FP8 out, fp32 scales per 128), and the example it times
    a step of imports."""
    tool = _bench_tool("fp8_block")
    m, n = 256, 384
    assert tool.moved(m, n) == 2 * m * n + m * n + 4 * m * 3
    assert tool.moved(m, n, False, True) == 2 * m * n + m * n + 4 * 2 * n
    assert tool.moved(m, n, True, True, 2, 2 * n) == 4 * m * n + 2 * m * n + 4 * (3 * m + 2 * n) + 2 * n
    assert set(tool.TILE128_ROWS) <= set(tool.mxq_cases(m, n))  # (--variants re-times these rows)
    assert not set(tool.EXTRA_ROWS) & set(tool.mxq_cases(m, n))  # (--rows names either)
    with pytest.raises(SystemExit, match="nope"):  # (before any device call)
        tool.main(["--rows", "colwise_gemm,nope"])
    assert tool.tile_moved(m, n) == 2 * m * n + m * n + 4 * 2 * 3
    assert tool.tile_moved(m, n, 2) == 2 * m * n + 2 * (m * n + 4 * 2 * 3)
    x = torch.randn(m, n, dtype=torch.bfloat16)
    for name, (opts, moved, exact) in tool.mxq_cases(m, n).items():
        op = mxq.fused_quant(**opts)(tool.dc.identity)
        kw = {"act_input": torch.randn_like(x)} if "dact" in opts else {}
        got = op.reference(x, **kw)
        assert got.rowwise_data is not None or got.colwise_data is not None, name
        assert exact == ("act" not in opts and "dact" not in opts), name
    row = tool.dc.error_row("mxq/x", m, n, ValueError("no kernel"))  # (a case that cannot run: its row says why)
    assert row == dict(name="mxq/x", M=m, N=n, error="ValueError: no kernel")


def test_fp4_bench_cases_are_ops_with_their_bytes():
    """bench/fp4.py: every row is an op whose reference runs with the row's call arguments, its
    bytes by hand (bf16 in, E2M1 two per byte, a scale byte per 16 or 32 elements per direction)."""
    tool = _bench_tool("fp4")
    m, n = 64, 128
    assert tool.moved(m, n, "nvfp4") == 2 * m * n + m * n // 2 + m * n // 16
    assert tool.moved(m, n, "mxfp4", True, True) == 2 * m * n + 2 * (m * n // 2 + m * n // 32)
    x = torch.randn(m, n, dtype=torch.bfloat16)
    for name, (opts, moved, exact, given, groups) in tool.cases(m, n).items():
        op = mxq.fused_quant(**opts)(tool.dc.identity)
        kw = {"global_amax": x.float().abs().amax().reshape(1)} if given else {}
        kw.update({"seed": 1} if opts.get("stochastic_rounding") else {})
        kw.update({"act_input": x.flip(0)} if opts.get("dact") else {})
        if groups:  # (random expert groups of the rows, ending at M)
            offs = tool.group_offsets(m, groups, "cpu")
            assert offs.shape == (groups,) and int(offs[-1]) == m and bool((offs[1:] >= offs[:-1]).all()), name
            kw["group_offsets"] = offs
        assert op.reference(x, **kw).rowwise_data.shape == (m, n // 2), name


def test_ptx_count_tool_counts_the_fp32_kernels():
    """bench/ptx_count.py --dtype fp32 counts the kernel each fp32 variant runs: the vectorised
    one (vec; rows8 where KernelConfig.vec_unaligned: 8 columns x 32 / warps rows a thread) or
    the element-wise one (a plain colwise cast's rows8: a thread's column of 32 rows); gelu +
    both costs more per element than both on either."""
    tool = _bench_tool("ptx_count")
    spec = QuantSpec(**tool.OPS["both"])
    got = {v: tool.count(spec, "sm_90", "fp32", v) for v in ("vec", "rows8")}
    assert got["vec"]["per_thread"] == got["rows8"]["per_thread"] == kconfig.VEC * kconfig.ROWS // 4
    gelu = tool.count(QuantSpec(**tool.OPS["gelu_both"]), "sm_90", "fp32", "rows8")
    assert gelu["per_element"] > got["rows8"]["per_element"] > 0
    colwise = tool.count(QuantSpec(**tool.OPS["colwise"]), "sm_90", "fp32", "rows8")
    assert colwise["per_thread"] == kconfig.ROWS and colwise["vwarps"] == kconfig.GENERIC_WARPS


def test_ptx_count_occupancy_by_hand():
    """bench/ptx_count.py's CTAs per SM, against hand counts for an H200 SM (64K registers in
    four 16K partitions allocated per warp in units of 256, 228 KB of shared memory with 1 KB
    reserved per CTA, 64 warps): 48 registers x 8 warps: a warp takes 1536, a partition holds
    10 warps, the SM 40, so 5 CTAs (40 registers: 1280, 12 per partition, 6 CTAs); 76 registers
    round to 80 per thread, 2560 per warp, 6 warps per partition, 6 CTAs of 4 warps (64: 8);
    17 KB of shared memory: 228 / 18 = 12 CTAs, so 24 registers x 4 warps (21 CTAs by
    registers, 16 by warps) stops at 12; CTAs of 16 warps stop at 64 / 16 = 4 (5 by registers)."""
    tool = _bench_tool("ptx_count")
    assert tool.ctas_per_sm(48, 256, 0) == 5
    assert tool.ctas_per_sm(40, 256, 0) == 6
    assert tool.ctas_per_sm(76, 128, 0) == 6
    assert tool.ctas_per_sm(64, 128, 0) == 8
    assert tool.ctas_per_sm(24, 128, 17 * 1024) == 12
    assert tool.ctas_per_sm(24, 512, 0) == 4


def test_ptx_count_split_by_hand():
    """bench/ptx_count.py --split: a kernel of 857 instructions per thread at 4 rows and 1457 at 8
    (the unaligned both kernel) is 150 per row and 257 per tile; a line through (2, 10) and (6, 30)
    is 5 per row and 0 per tile."""
    tool = _bench_tool("ptx_count")
    assert tool.split_rows(4, 857, 8, 1457) == (150.0, 257.0)
    assert tool.split_rows(2, 10, 6, 30) == (5.0, 0.0)


def test_ab_trees_child_times_the_asked_shapes_and_ops():
    """bench/ab_trees.py's child program (run per tree on the GPU): with --odd it times
    device_check.ODD_SHAPES, with --ops only those ops, with --standard the standard table's
    shapes and the epilogues with an extra tensor; the rendered program is valid Python
    (compiled here, run on the device)."""
    tool = _bench_tool("ab_trees")
    odd = tool.CHILD.format(root="/x", dtypes=["bf16"], odd=True, ops={"both"}, standard=False)
    compile(odd, "child", "exec")
    assert "shapes = dc.ODD_SHAPES if True else" in odd and "ops={'both'}" in odd
    plain = tool.CHILD.format(root="/x", dtypes=["bf16"], odd=False, ops=None, standard=False)
    assert "if False else dc.BENCH_SHAPES" in plain and "ops=None" in plain and "if False:" in plain
    # --standard: the first odd shape too, and the epilogues with an extra tensor
    std = tool.CHILD.format(root="/x", dtypes=["bf16", "fp32"], odd=False, ops=None, standard=True)
    compile(std, "child", "exec")
    assert "dc.ODD_SHAPES[:1] if True else" in std and "if True:  # (the epilogues" in std
    # --ops names are checked against device_check's ops (read from its source)
    assert tool._device_check_ops() == set(_bench_tool("device_check").OPS)


def test_ab_trees_pairs_a_benchmarks_rows(tmp_path):
    """bench/ab_trees.py --bench: each tree's own bench/SCRIPT runs with its mxq first on the path
    and --out a fresh folder; its results file's timed rows pair by (name, dtype, M, N, G), B/A of
    the best times, a failed check in either tree marked. Two stand-in trees whose script writes
    hand-made rows: A 10 / 12 us, B 9.9 / 9 us (0.9); a row only A has is left out; B's failed
    check shows."""
    tool = _bench_tool("ab_trees")
    script = """
import argparse, json, os, sys
from pathlib import Path
ap = argparse.ArgumentParser(); ap.add_argument("--scale", type=float); ap.add_argument("--out")
args = ap.parse_args()
side = Path(__file__).resolve().parent.parent.name
assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parent.parent)
rows = [dict(name="mxq/x", M=8, N=16, G=4, ms=0.010 * args.scale * (0.9 if side == "b" else 1.0),
             checks={"bwd": side != "b"}),
        dict(name="pair/x", M=8, N=16, vs_torchao=1.5)]
if side == "a":
    rows.append(dict(name="mxq/only_a", M=8, N=16, ms=0.001, checked=True))
Path(args.out, "dev-20261205-x.json").write_text(json.dumps({"copy_GBps": 4000.0, "rows": rows}))
"""
    roots = {}
    for side in ("a", "b"):
        (tmp_path / side / "bench").mkdir(parents=True)
        (tmp_path / side / "bench" / "fake.py").write_text(script)
        roots[side] = str(tmp_path / side)
    scales = {"a": (1, 1.2), "b": (1.1, 1)}  # (B/A of the best times: 9.0 / 10.0)
    runs = {s: [tool.run_bench(roots[s], f"fake.py --scale {x}") for x in scales[s]] for s in ("a", "b")}
    assert runs["a"][0]["copy"] == 4000.0 and len(runs["a"][0]["rows"]) == 2 and len(runs["b"][0]["rows"]) == 1
    (row,) = tool.pair_runs(runs)
    assert (row["name"], row["M"], row["N"], row["G"]) == ("mxq/x", 8, 16, 4)
    assert [round(u, 3) for u in row["a_us"]] == [10.0, 12.0] and row["b_over_a"] == 0.9 and row["check_failed"]
    assert not tool.check_failed({"checked": True, "checks": {"fwd": True}}) and tool.check_failed({"error": "x"})
    assert tool.check_failed({"exact": False}) and tool.check_failed({"checked": False})
    with pytest.raises(ValueError, match="--bench"):
        tool.bench_command("/x", "../evil.py", "/o")
    assert tool.bench_command("/x", "gated.py --grouped-only", "/o")[1:] == ["/x/bench/gated.py", "--grouped-only",
                                                                              "--out", "/o"]


def test_paired_peer_row_sums_torchaos_two_kernels():
    """device_check's derived row: torchao's dim0 and dim1 kernels back to back against mxq's one
    pass. Hand-made rows: 1024x1024 moves 2 MiB in and 2 x (1 MiB + 32 KiB) out = 4,259,840 bytes;
    dim0 10 us + dim1 30 us = 40 us is 106.5 GB/s, mxq/both in 20 us twice that."""
    tool = _bench_tool("device_check")
    both_gbps = 4259840 / 0.02 / 1e6
    rows = [{"name": "mxq/both", "M": 1024, "N": 1024, "ms": 0.02, "GBps": both_gbps},
            {"name": "torchao/dim0_floor", "M": 1024, "N": 1024, "ms": 0.01},
            {"name": "torchao/dim1_floor", "M": 1024, "N": 1024, "ms": 0.03},
            {"name": "mxq/both", "M": 64, "N": 64, "ms": 0.001, "GBps": 1.0}]  # no peer rows: no pair
    (pair,) = tool.paired_peer_rows(rows, copy_gbps=4259.84)
    assert (pair["name"], pair["M"], pair["N"], pair["ms"]) == ("torchao/dim0+dim1_floor", 1024, 1024, 0.04)
    assert (pair["GBps"], pair["pct_copy"], pair["mxq_speedup"]) == (106.5, 2.5, 2.0)


def test_device_check_matrix_covers_every_branch_combination():
    """bench/device_check.py --matrix: every (plain / act / dact / epilogue) x dbias x amax x
    direction x dtype combination once, each on an aligned and an odd shape, every spec valid;
    and the default cases() check plain-cast dbias in every dtype (a combination that once hid a
    packed-kernel bug)."""
    tool = _bench_tool("device_check")
    seen = set()
    for v, epi, dtype, shapes in tool.matrix_cases():
        QuantSpec(**v)
        kind = "epilogue" if epi != "identity" else "act" if v["act"] else "dact" if v["dact"] else "plain"
        seen.add((kind, v["dbias"], v["amax"], v["rowwise"], v["colwise"], dtype))
        assert any(n % 8 == 0 for _, n in shapes) and any(n % 8 for _, n in shapes)
    assert len(seen) == 4 * 2 * 2 * 3 * 3 == len(tool.matrix_cases())
    plain_dbias = {d for v, epi, d, _ in tool.cases(False)
                   if v["dbias"] and epi == "identity" and not (v["act"] or v["dact"])}
    assert plain_dbias == {"bf16", "fp16", "fp32"}


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_grid_split_is_compiled_in(arch):
    """The packed kernel finds its tile from a 3-D grid (no integer division): the row tile is
    ctaid.y + ctaid.z * nctaid.y, so tensors of more than 65535 row tiles still launch; CTAs
    past the last tile write nothing. The GPU side is test_gpu.py::test_tall_tensor_splits_the_grid_over_y_and_z."""
    def ident(x):
        return x

    op = mxq.fused_quant(rowwise=True, colwise=True, amax=True)(ident)
    ptx = op.asm(arch, "bf16")["ptx"]
    body = ptx[ptx.index(".entry kernel_cutlass_packed_kernel"):]
    assert "%ctaid.z" in body and "%nctaid.y" in body
    assert "div.s32" not in body and "rem.s32" not in body


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("opts, wide", [
    (dict(rowwise=True), True), (dict(rowwise=True, scale_layout="swizzled"), True),
    (dict(rowwise=True, amax=True), False), (dict(rowwise=False, colwise=True), False),
    (dict(rowwise=True, colwise=True), False)])
def test_row_scales_leave_as_words(arch, opts, wide):
    """A pure rowwise cast uses the wide tile (8 rows x 1024 columns per CTA) and stores its row
    scales as 4-byte words gathered in shared memory, a row's 32 bytes per request, with byte
    stores kept for scale tensors that are not 4-byte aligned; ops with a column reduction keep
    the 32-row tile and byte stores (docs/performance.md says what was measured). The GPU side is
    test_gpu.py::test_scale_words_and_unaligned_scales_match_reference."""
    def ident(x):
        return x

    op = mxq.fused_quant(**opts)(ident)
    body = _entry(op.asm(arch, "bf16")["ptx"], "packed_kernel")
    assert codegen.kernel_config(op.spec, op.epilogue).wide == wide
    assert body.count("st.global.b32") == wide  # one word store, in the aligned branch
    if opts.get("rowwise", True):  # the row scales' byte stores (unaligned branch, or the only path)
        assert "st.global.L2::cache_hint.b8" in body
    if wide:
        assert "rem.s64" not in body and "div.s32" not in body  # alignment test and indices: masks and shifts


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_row_scale_bytes_wait_in_l2(arch):
    """The vectorised and packed kernels store row-scale bytes with an L2 evict_last policy (a
    32-row CTA writes 8 bytes of each 32-byte sector; plainly stored they cost the rowwise+colwise
    cast ~6% of its bandwidth on the H200); Tuning(row_scale_l2_keep=False) restores plain stores, and the generic
    kernel keeps them (measured slower there). Every row-scale store of a kernel carries the
    policy: one per row a thread finishes (packed: 8 rows / 4 lanes; fp32 vectorised: every row).
    The GPU side: test_gpu.py::test_row_scale_store_policy_writes_the_same_bytes."""
    spec = QuantSpec(rowwise=True, colwise=True)
    kept = "st.global.L2::cache_hint.b8"
    policy = "createpolicy.fractional.L2::evict_last.b64"
    op = FusedOp(_identity, spec, IDENTITY)
    pk = _entry(op.asm(arch, "bf16")["ptx"], "packed_kernel")
    assert pk.count(kept) == 2 and policy in pk
    vec = _entry(op.asm(arch, "fp32")["ptx"], "vec_kernel")
    assert vec.count(kept) == 8 and policy in vec
    generic = inspection.compile_artifacts(op, arch=arch, dtype="fp32", variant="generic")["ptx"]
    assert kept not in generic and policy not in generic
    plain = FusedOp(_identity, spec, IDENTITY)._with_tuning(Tuning(row_scale_l2_keep=False))
    for dtype, kernel in (("bf16", "packed_kernel"), ("fp32", "vec_kernel")):
        body = _entry(plain.asm(arch, dtype)["ptx"], kernel)
        assert kept not in body and policy not in body


def _entry(ptx, name):
    """The PTX text of kernel ``name`` (up to the next kernel)."""
    body = ptx[ptx.index(f".entry kernel_cutlass_{name}"):]
    nxt = body.find(".entry", 10)
    return body if nxt < 0 else body[:nxt]


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_ops_with_arithmetic_stage_their_loads_through_shared_memory(arch):
    """Packed kernel: act/dact/epilogue ops request every row with cp.async (one commit group
    per row, a wait before each row); plain casts load straight into registers. The GPU side: every bf16/fp16 act/dact case of test_gpu.py."""
    def ident(x):
        return x

    def entry(op):
        return _entry(op.asm(arch, "bf16")["ptx"], "packed_kernel")

    gelu = mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(ident)
    body = entry(gelu)
    assert body.count("cp.async.cg.shared.global") == 8  # 8 rows x one 16-byte copy per thread
    assert body.count("cp.async.commit_group") == 8 and "cp.async.wait_group" in body
    assert "ld.global.v4" not in body and codegen.kernel_config(gelu.spec, gelu.epilogue).pk_warps == 4
    dgelu = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)
    assert entry(dgelu).count("cp.async.cg.shared.global") == 8  # 4 rows x (grad, act input)
    assert codegen.kernel_config(dgelu.spec, dgelu.epilogue).pk_warps == 8
    plain = mxq.fused_quant(rowwise=True, colwise=True)(ident)
    assert "cp.async" not in entry(plain) and "ld.global.v4" in entry(plain)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("dtype, nbytes", [("bf16", 4), ("fp32", 8)])
def test_dbias_kernel_keeps_its_loads_in_flight(arch, dtype, nbytes):
    """dbias_kernel's time is its loads' latency. Its early form (short reductions) issues each
    round's DBIAS_UNROLL (4) loads in one block (a row past the end is clamped and added as 0);
    in its staged form (long ones) each round of a thread copies DBIAS_BYTES_IN_FLIGHT bytes of
    partials (32 fp32 or 16 fp64 ones; half as many in a round of at most half the rows) into
    shared memory with cp.async in one block (no branch between the copies, the last round too:
    a row past the end is zero-filled), then waits once. The GPU side:
    tests/test_gpu.py::test_dbias_full_and_partial_rounds_match_reference (full rounds and a
    partial one)."""
    def ident(x):
        return x

    dgelu = mxq.fused_quant(colwise=True, dact="gelu", dbias=True)(ident)
    per_round = kconfig.DBIAS_BYTES_IN_FLIGHT // nbytes
    assert (kconfig.DBIAS_WARPS, kconfig.DBIAS_UNROLL, per_round * nbytes) == (8, 4, 128)
    ptx = dgelu.asm(arch, dtype)["ptx"]  # (fp32 partials for 16-bit inputs)
    kernels = [e for e in re.split(r"(?=\.entry )", ptx) if e.startswith(".entry kernel_cutlass_dbias_kernel")]
    staged = [e for e in kernels if "cp.async" in e]
    early = [e for e in kernels if "cp.async" not in e]
    assert len(staged) == len(early) == 1, (len(staged), len(early))

    def blocks(kernel):  # basic blocks: split at labels and after branches
        return re.split(r"\n\$L__BB\d+_\d+:|\bbra(?:\.uni)?\s+\$L__BB\d+_\d+;", kernel)

    # the early form (short reductions): rounds of DBIAS_UNROLL loads with no branch between them
    load = f"ld.global.b{8 * nbytes}"
    loads = sorted(b.count(load) for b in blocks(early[0])[1:] if load in b)  # (block 0: the noop flag)
    assert loads and min(loads) >= kconfig.DBIAS_UNROLL, loads
    # the staged form (long ones)
    copy = re.compile(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], %d," % nbytes)
    rounds = [b for b in blocks(staged[0]) if copy.search(b)]
    # two round bodies (a full one, and a half one for a round of at most half the rows) ...
    assert sorted(len(copy.findall(b)) for b in rounds) == [per_round // 2, per_round], rounds
    for body in rounds:  # ... each issues its copies together, then waits for them once
        waits = [m.start() for m in re.finditer(r"cp\.async\.wait_group\s+0;", body)]
        assert len(waits) == 1
        copies = body[body.index("cp.async.ca.shared.global"):waits[0]]
        assert len(copy.findall(copies)) == len(copy.findall(body)) and "ld.global" not in copies


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_dbias_partials_precision_follows_the_input_dtype(arch, dtype):
    """numerics.dbias_partial_dtype: a 16-bit input's 32-row blocks are summed in fp32 by both
    quantize kernels (no fp64 arithmetic in them) into an fp32 workspace, an fp32 input's in fp64;
    dbias_kernel adds the blocks in fp64 either way. The GPU side:
    tests/test_gpu.py::test_dbias_blocks_sum_in_the_partial_precision (a column whose result tells
    the two apart)."""
    from mxq.runtime import export

    op = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)
    f64_math = re.compile(r"\b(?:add|cvt)\.[a-z.]*f64\b")
    fast = "vec_kernel" if dtype == "fp32" else "packed_kernel"
    for variant, kernel in (("vec", fast), ("generic", "generic_kernel" if dtype == "fp32" else "packed_kernel")):
        ptx = inspection.compile_artifacts(op, arch, dtype, variant)["ptx"]
        assert bool(f64_math.search(_entry(ptx, kernel))) == (dtype == "fp32"), (variant, kernel)
        reduce = _entry(ptx, "dbias_kernel")
        assert "add.rn.f64" in reduce or "add.f64" in reduce
        assert ("cvt.f64.f32" in reduce) == (dtype != "fp32")  # fp32 partials widened before the fp64 sum
    ws = {"fp32": "float64"}.get(dtype, "float32")
    assert re.search(rf"mDbiasWs\s+{ws}\[ceil\(M/32\), N\]  \(dbias workspace", export._export_header(op, "k", arch, dtype))


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_plain_dbias_sums_its_input(arch, dtype):
    """A plain cast with dbias (v is the input): each thread of the packed kernel adds its rows'
    values, VEC per row after the first, in fp32; the packed kernel once skipped these adds for
    ops without arithmetic, leaving its partial sums unset. The GPU side:
    tests/test_gpu.py::test_plain_dbias_matches_reference."""
    op = mxq.fused_quant(colwise=True, dbias=True)(ident)
    rows = kconfig.ROWS // codegen.kernel_config(op.spec, op.epilogue).pk_warps
    pk = _entry(op.asm(arch, dtype)["ptx"], "packed_kernel")
    assert len(re.findall(r"\badd\.(?:rn\.)?f32\b", pk)) >= kconfig.VEC * (rows - 1)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
def test_dbias_kernel_starts_early_with_programmatic_dependent_launch(arch):
    """dbias ops: the quantize kernel lets dbias_kernel launch at its start
    (griddepcontrol.launch_dependents); the launcher holds two dbias_kernels, one launched early
    (for calls of at most PDL_MAX_ROWS rows), which waits for the quantize kernel to finish before
    reading the noop flag or the partials (griddepcontrol.wait), and one launched after it (the
    staged form, test_dbias_kernel_keeps_its_loads_in_flight). Ops
    without dbias have neither, and pdl=0 turns it off. The GPU side: every dbias case of
    tests/test_gpu.py (M above and below PDL_MAX_ROWS) and bench/device_check.py."""
    def ident(x):
        return x

    dgelu = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)
    ptx = dgelu.asm(arch, "bf16")["ptx"]
    pk = _entry(ptx, "packed_kernel")
    assert "griddepcontrol.launch_dependents" in pk and "griddepcontrol.wait" not in pk
    dbias = [e for e in re.split(r"(?=\.entry )", ptx) if e.startswith(".entry kernel_cutlass_dbias_kernel")]
    early = [e for e in dbias if "griddepcontrol" in e]
    assert len(dbias) == 2 and len(early) == 1, (len(dbias), len(early))
    wait = early[0].index("griddepcontrol.wait")
    assert wait < early[0].index("ld.global"), "dbias_kernel must wait before it reads the partials"
    assert 0 < kconfig.PDL_MAX_ROWS < 8192  # (8192 rows and more: launched after, measured faster)
    assert "griddepcontrol" not in mxq.fused_quant(rowwise=True, colwise=True, act="gelu")(ident).asm(arch, "bf16")["ptx"]
    off = mxq.fused_quant(rowwise=True, colwise=True, dact="gelu", dbias=True)(ident)._with_tuning(Tuning(pdl=False))
    assert "griddepcontrol" not in off.asm(arch, "bf16")["ptx"]
    assert targets.uses_pdl(arch) and not targets.uses_pdl("sm_89")


def test_asm_takes_torch_dtypes():
    op = FusedOp(ident, QuantSpec(colwise=True))
    assert op.asm("sm_90", torch.float32)["ptx"] == op.asm("sm_90", "fp32")["ptx"]
    assert op.asm("sm_90", torch.bfloat16)["dtype"] == "bf16"
    with pytest.raises(ValueError, match="sm_89"):
        op.asm(arch="sm_80")


def _lowered_function(records, out, params):
    """The statements codegen.lower makes, executed with fp32 torch stand-ins for what they call
    (one rounding per operation, as the kernel's .rn operations; FMA as an exact product-sum
    rounded once): what the lowered code computes, checked on CPU."""
    from types import SimpleNamespace

    def f32(x):
        return x.to(torch.float32) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)

    cmath = SimpleNamespace(
        add=lambda a, b, rounding=None: a + b, mul=lambda a, b, rounding=None: a * b, div=lambda a, b: a / b,
        fma=lambda a, b, c: (a.double() * b.double() + c.double()).float(),
        **{f: getattr(torch, f) for f in ("abs", "exp", "exp2", "log", "log2", "tanh", "erf", "sqrt", "rsqrt")})
    ns = {"Float32": f32, "cute": SimpleNamespace(math=cmath), "cutlass": SimpleNamespace(select_=torch.where),
          "RN": None, "tanh_act": torch.tanh}
    body = "".join(f"    {line}\n" for line in codegen.lower(records))
    exec(f"def fn({', '.join(params)}):\n{body}    return {out}\n", ns)
    return ns["fn"]


def _every_operation(x, r, s: float = 0.75):
    a = mxq.maximum(x, r) - mxq.minimum(x * s, -r) / (r + 2.5)
    b = mxq.where(x > r, a, -a) + mxq.where(x <= 0.5, mxq.abs(x), x) * mxq.where(r >= x, 1.0, 0.0)
    c = mxq.where(x < -r, b, mxq.where(x != r, mxq.sqrt(mxq.abs(b)), mxq.exp(-mxq.abs(r))))
    d = mxq.where(x == r, c, mxq.tanh(c) + mxq.sigmoid(x) + mxq.erf(r) + mxq.log(mxq.abs(x) + 1.0))
    return d + mxq.exp2(-mxq.abs(x)) * mxq.log2(mxq.abs(r) + 2.0) + mxq.rsqrt(mxq.abs(x) + 1.0)


def test_lowering_of_every_operation_computes_the_reference():
    """Each IR operation's lowering (codegen.lower's tables) against the reference's evaluation
    of the same IR, bit for bit, on values with planted NaN, +-0 and +-inf: a lowering that
    emitted minimum for maximum, dropped a sign or swapped arguments fails here."""
    op = mxq.fused_quant()(_every_operation)
    recs, out = codegen.ssa(op.epilogue.expr, "e", {0: "x0", 1: "x1"}, {0: "s0"})
    kinds = {(r["kind"], r.get("op")) for r in recs}
    for want in [("binary", o) for o in ("add", "sub", "mul", "div", "maximum", "minimum")] + \
            [("unary", o) for o in ("neg", "abs", "exp", "exp2", "log", "log2", "tanh", "erf", "sqrt", "rsqrt",
                                    "sigmoid")] + \
            [("compare", o) for o in ("lt", "le", "gt", "ge", "eq", "ne")] + [("where", "where")]:
        assert want in kinds, want
    fn = _lowered_function(recs, out, ["x0", "x1", "s0"])
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=g) * 3
    r = torch.randn(4096, generator=g) * 3
    x[:8] = torch.tensor([float("nan"), 0.0, -0.0, float("inf"), -float("inf"), 1.0, 0.5, -2.5])
    r[:8] = torch.tensor([1.0, -0.0, 0.0, 1.0, float("nan"), 1.0, -0.5, 2.5])
    r[8:16] = x[8:16]  # equal pairs: the == / != branches
    got = fn(x, r, torch.tensor(0.75))
    want = mxq.frontend.ir.evaluate(op.epilogue.expr, [x, r], [0.75])
    # the lowering's sigmoid is 1 / (1 + exp(-x)), three roundings, against torch.sigmoid in the
    # reference (the transcendental class): at most a few fp32 ulps apart, NaN where NaN
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~got.isnan()
    assert torch.allclose(got[ok], want[ok], rtol=2**-21, atol=0)
    exact = mxq.fused_quant()(_every_exact_operation)
    recs, out = codegen.ssa(exact.epilogue.expr, "e", {0: "x0", 1: "x1"}, {0: "s0"})
    got = _lowered_function(recs, out, ["x0", "x1", "s0"])(x, r, torch.tensor(0.75))
    want = mxq.frontend.ir.evaluate(exact.epilogue.expr, [x, r], [0.75])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), "exact operations: bit for bit"


def _every_exact_operation(x, r, s: float = 0.75):
    a = mxq.maximum(x, r) - mxq.minimum(x * s, -r) / (r + 2.5)
    b = mxq.where(x > r, a, -a) + mxq.where(x <= 0.5, mxq.abs(x), x) * mxq.where(r >= x, 1.0, 0.0)
    return mxq.where(x < -r, b, mxq.where(x != r, mxq.sqrt(mxq.abs(b)), mxq.where(x == r, -b, x)))


def _times7(x):
    return x * 7.0


def _times9(x):
    return x * 9.0


def test_asm_of_ops_with_one_signature_returns_each_ops_own_ptx(tmp_path, monkeypatch):
    """Issue 21 item 4: CuTeDSL names its PTX dump by the kernel signature alone, so ops x*7 and
    x*9 would read each other's file. Each compile dumps into a directory of its own, even when the temporary directory's path holds a space,
    quotes and something that looks like an option (item 8: the option string is split like a
    shell line)."""
    odd = tmp_path / "dir with 'quotes' --keep-cubin"
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path / "cache with space"))
    seven = mxq.fused_quant()(_times7).asm("sm_90", "bf16")["ptx"]
    nine = mxq.fused_quant()(_times9).asm("sm_90", "bf16")["ptx"]
    assert "0f40E00000" in seven and "0f41100000" not in seven  # 7.0
    assert "0f41100000" in nine and "0f40E00000" not in nine  # 9.0
    assert not list(odd.glob("mxq-ptx-*")), "no dump directory left behind"


def test_kernel_hash_covers_every_file_that_shapes_the_compiled_code(monkeypatch):
    """The numerics constants the kernels read, the fake compile arguments and the arch switches are part of the
    hash in every module (hence of every disk-cache key), not only the kernel layer."""
    from pathlib import Path

    base = codegen.kernels_hash()
    real = Path.read_bytes

    for name in ("numerics.py", "compiler.py", "targets.py", "slots.py", "device.py", "module.py.j2"):
        codegen.kernels_hash.cache_clear()
        monkeypatch.setattr(Path, "read_bytes", lambda self, n=name: real(self) + (b"#" if self.name == n else b""))
        assert codegen.kernels_hash() != base, name
        monkeypatch.setattr(Path, "read_bytes", real)
    codegen.kernels_hash.cache_clear()
    assert codegen.kernels_hash() == base


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_fp32_staged_dact(arch):
    """Tuning.vec_stage (the default): the fp32 kernel of a dact op copies each thread's rows
    of both inputs to shared memory as whole 16-byte cp.async copies (4 rows x 2 inputs x 2; a
    first version copied 16 bytes per 4-byte element, at offsets +4, +8, ..., and faulted with a
    misaligned address on the H200), one barrier more (the column reduction reuses that memory),
    fewer registers; off, the kernel has no cp.async; ops without dact are untouched by it.
    test_gpu.py::test_fp32_staged_dact_matches_reference checks the bytes on a GPU."""
    from mxq.kernels.config import Tuning

    def build(tuning, **opts):
        op = FusedOp(_identity, QuantSpec(rowwise=True, colwise=True, **opts), IDENTITY)
        return op._with_tuning(tuning)

    dact = dict(dact="gelu", dbias=True)
    off = inspection.compile_artifacts(build(Tuning(vec_stage=False), **dact), arch, "fp32", "vec")
    on = inspection.compile_artifacts(build(None, **dact), arch, "fp32", "vec")
    ptx_off, ptx_on = off["ptx"], on["ptx"]
    assert "cp.async" not in _entry(ptx_off, "vec_kernel")  # (dbias_kernel's staged form has its own)
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+(?:\+(\d+))?\], \[%rd\d+(?:\+(\d+))?\], (\d+)", ptx_on)
    assert len(copies) == 4 * 2 * 2, copies
    assert all(int(s or 0) % 16 == 0 and int(g or 0) % 16 == 0 and n == "16" for s, g, n in copies), copies
    assert ptx_on.count("bar.sync") == ptx_off.count("bar.sync") + 1

    def regs(art):
        return next(v["registers"] for k, v in art["kernels"].items() if "vec_kernel" in k)

    if regs(off) is not None:  # (ptxas present)
        assert regs(on) < regs(off), (regs(on), regs(off))
    # an op whose staged inputs would not fit a CTA's shared memory keeps the unstaged kernel
    import dataclasses

    from mxq.frontend import codegen

    cfg = codegen.kernel_config(QuantSpec(rowwise=True, dact="gelu"), IDENTITY, Tuning(vec_stage=True))
    assert [dataclasses.replace(cfg, n_inputs=n).vec_stage for n in (1, 6, 7)] == [True, True, False]
    assert dataclasses.replace(cfg, tuning=Tuning()).vec_stage
    assert not dataclasses.replace(cfg, tuning=Tuning(vec_stage=False)).vec_stage
    plain = inspection.ptx_of(build(None, act="gelu"), arch, "fp32", "vec")
    assert plain == inspection.ptx_of(build(Tuning(vec_stage=False), act="gelu"), arch, "fp32", "vec")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_unaligned_warps(arch):
    """Tuning.unaligned_warps: the unaligned packed kernel (N % 8 != 0) of an op without dbias runs
    8 warps of 4 rows with fewer registers than 4 warps of 8 rows; by default (0) plain casts with
    colwise output take 8 and everything else 4 (dbias ops 8 anyway; the choice measured on the
    H200, config.Tuning); the aligned kernel is not touched by the switch (same PTX).
    test_gpu.py::test_unaligned_eight_warps_match_reference checks the bytes of 8 warps."""
    from mxq.frontend import codegen
    from mxq.kernels.config import Tuning

    def build(tuning, **opts):
        op = FusedOp(_identity, QuantSpec(**(opts or dict(rowwise=True, colwise=True))), IDENTITY)
        return op._with_tuning(tuning)

    regs = {}
    for w in (4, 8):
        art = inspection.compile_artifacts(build(Tuning(unaligned_warps=w)), arch, "bf16", "generic")
        regs[w] = next(v["registers"] for k, v in art["kernels"].items() if "packed_kernel" in k)
    assert regs[8] < regs[4], regs

    def warps(**opts):
        return codegen.kernel_config(QuantSpec(**opts), IDENTITY).packed_warps(unaligned=True)

    assert warps(rowwise=True, colwise=True) == 8 and warps(colwise=True, rowwise=False) == 8
    assert warps(rowwise=True) == 4 and warps(rowwise=True, colwise=True, act="gelu") == 4
    assert warps(rowwise=True, colwise=True, dact="gelu", dbias=True) == 8
    assert codegen.kernel_config(QuantSpec(rowwise=True, colwise=True), IDENTITY).packed_warps(unaligned=False) == 4
    default_vec = inspection.ptx_of(build(None), arch, "bf16", "vec")
    eight_vec = inspection.ptx_of(build(Tuning(unaligned_warps=8)), arch, "bf16", "vec")
    strip = re.compile(r"^//.*$|kernel_cutlass_\w+|mxq_gen_\w+|_mxq\w*", re.M)
    assert strip.sub("", default_vec) == strip.sub("", eight_vec)
    dc = _bench_tool("device_check")
    assert dc.parse_tuning("unaligned_warps=8,pdl=0,ops=both") == {"unaligned_warps": 8, "pdl": False, "ops": "both"}
    assert dc.parse_tuning("vec_stage=1,ops=dgelu_dbias_both,dtype=fp32") == {
        "vec_stage": True, "ops": "dgelu_dbias_both", "dtype": "fp32"}
    assert dc.parse_tuning("vec_unaligned_copy=words,rows8_min_blocks=4") == {
        "vec_unaligned_copy": "words", "rows8_min_blocks": 4}


def test_grouped_benches_build_each_group_search_variant_and_compare_every_output():
    """bench/gated.py and bench/grouped.py --variants: 'group_search=warps' parses as the string;
    a variant's ops render its Tuning (a gated op's inner op), the default's render none;
    gated.same_as sees a byte of any output differ, dbias included."""
    gated = _bench_tool("gated")
    assert gated.dc.parse_tuning("group_search=warps") == {"group_search": "warps"}
    assert _bench_tool("grouped").OUTPUTS == ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale")
    fwd, bwd = gated.grouped_ops("swizzled", "group_search=warp")
    for op in (fwd, bwd):
        assert "group_search='warp'" in op.inner.source and op.spec.scale_layout == "swizzled"
    assert all("Tuning(" not in op.inner.source for op in gated.grouped_ops("compact"))
    fb = gated.grouped_ops("fp8_block")  # (FP8 block scaling's grouped SwiGLU rows: compact 1x128 / 128-row blocks)
    assert all(op.spec.format == "fp8_block" and op.spec.scale_layout == "compact" and op.spec.colwise for op in fb)
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    a, b = fwd.reference(x), fwd.reference(x)
    assert gated.same_as(a, b)
    b.colwise_scale.view(torch.uint8)[1, 3] ^= 1
    assert not gated.same_as(a, b)
    g = torch.randn(64, 64, dtype=torch.bfloat16)
    c, d = bwd.reference(g, act_input=x), bwd.reference(g, act_input=x)
    assert gated.same_as(c, d)
    d.dbias[5] += 1
    assert not gated.same_as(c, d)


def test_every_module_the_kernels_import_is_hashed():
    """A module outside mxq/kernels/ that a kernel or the template imports shapes the compiled
    code: editing it must change kernels_hash (and so every cache key)."""
    from pathlib import Path

    pkg = Path(codegen.__file__).resolve().parents[1]
    sources = list((pkg / "kernels").glob("*.py")) + list(codegen._template_dir().glob("**/*.j2"))
    imported = set()
    for path in sources:
        for line in path.read_text().splitlines():
            m = re.match(r"\s*from (\.\.|mxq\.)([\w.]+) import", line)
            if m and not m.group(2).startswith("kernels"):
                imported.add(m.group(2).replace(".", "/") + ".py")
    assert imported, "the scan found no import from outside mxq/kernels/"
    assert imported <= set(codegen.SHAPING_FILES), sorted(imported - set(codegen.SHAPING_FILES))


def test_every_formats_module_a_hashed_file_imports_is_hashed():
    """The formats/ modules (layouts, constants) that a hashed file imports, directly or through
    another, shape the compiled code too: each is in SHAPING_FILES (e.g. runtime/slots.py's
    layouts and fp8_block_layouts, formats/fp4.py's fp8_block)."""
    from pathlib import Path

    pkg = Path(codegen.__file__).resolve().parents[1]
    todo = [p.relative_to(pkg).as_posix() for p in (pkg / "kernels").glob("*.py")] + list(codegen.SHAPING_FILES)
    seen, formats = set(), set()
    while todo:
        rel = todo.pop()
        if rel in seen or not (pkg / rel).is_file():
            continue
        seen.add(rel)
        here = Path(rel).parent
        for line in (pkg / rel).read_text().splitlines():
            m = re.match(r"\s*from (\.+)([\w.]*) import ([\w, ]+)", line)
            if not m:
                continue
            base = here
            for _ in range(len(m.group(1)) - 1):
                base = base.parent
            mod = (base / m.group(2).replace(".", "/")).as_posix() if m.group(2) else base.as_posix()
            names = [n.strip() for n in m.group(3).split(",")]
            for target in [f"{mod}.py"] + [f"{mod}/{n}.py" for n in names]:
                if target.startswith("formats/") and (pkg / target).is_file():
                    formats.add(target)
                    todo.append(target)
    assert {"formats/layouts.py", "formats/fp8_block_layouts.py", "formats/fp8_block.py"} <= formats
    assert formats <= set(codegen.SHAPING_FILES), sorted(formats - set(codegen.SHAPING_FILES))
