"""A CPU model of the kernels' built-in act/dact formulas, for tests: codegen's SSA records of the
formula evaluated in fp32 torch as device.py computes them (each mul/add/sub rounded once, an
"fma" record as an fp64 product-sum rounded once, sigmoid_act and tanh_act through
1 / (1 + 2^z)), with ``ex2.approx.ftz.f32`` and ``rcp.approx.ftz.f32`` modelled as the correctly
rounded value moved a chosen number of fp32 ulps (their documented errors: up to 2 and 1 ulp).
It is a model of the PTX the kernels emit (test_codegen.py checks those instructions), not
of the hardware's exact bits."""

from __future__ import annotations

import torch

from mxq.frontend import activations, codegen

EX2_ULPS, RCP_ULPS = 2, 1  # the largest error of each approximate instruction, in ulps


def f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def moved(t: torch.Tensor, ulps) -> torch.Tensor:
    """fp32 ``t`` moved ``ulps`` (an int or an int32 tensor) ulps, normal finite values only."""
    m = (t.view(torch.int32) + ulps).view(torch.float32)
    return torch.where(torch.isfinite(t) & (t.abs() >= 2.0 ** -126), m, t)


def unary_ops(ex2_ulps, rcp_ulps) -> dict:
    """tanh_act, sigmoid_act and half_tanh_ex2_act as device.py computes them, with ex2 and rcp off by the given
    ulps (ints, or callables of the shape giving int32 tensors)."""
    def ulps(k, t):
        return k(t.shape) if callable(k) else k

    def one_over_one_plus_ex2(z):
        e = torch.exp2(z.double()).float()
        p = moved(e, ulps(ex2_ulps, e)) + 1.0
        r = (1.0 / p.double()).float()
        return moved(r, ulps(rcp_ulps, r))

    def tanh_act(y):
        r = one_over_one_plus_ex2(y.abs() * f32(2.885390081777927))
        return torch.copysign((r.double() * -2.0 + 1.0).float(), y)

    def sigmoid_act(x):
        return one_over_one_plus_ex2(x * f32(-1.4426950408889634))

    def half_tanh_ex2_act(z):  # (0.5 + 0.5 tanh(y) from z = -2 y log2(e): two fmas, each rounded once)
        t = (one_over_one_plus_ex2(z).double() * -2.0 + 1.0).float()
        return (t.double() * -0.5 + 0.5).float()

    return {"tanh_act": tanh_act, "sigmoid_act": sigmoid_act, "half_tanh_ex2_act": half_tanh_ex2_act}


def run(records: list[dict], out: str, env: dict, unary: dict) -> torch.Tensor:
    """Evaluate SSA records on fp32 tensors (``env``: input variable -> tensor)."""
    env = dict(env)
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}
    for r in records:
        a = [env[v] for v in r.get("args", [])]
        if r["kind"] == "const":
            env[r["var"]] = f32(float(r["value"]))
        elif r["kind"] == "fma":
            env[r["var"]] = (a[0].double() * a[1].double() + a[2].double()).float()
        elif r["kind"] == "binary":
            env[r["var"]] = binary[r["op"]](a[0], a[1])
        elif r["kind"] == "unary":
            env[r["var"]] = unary[r["op"]](a[0])
        else:
            raise AssertionError(f"record kind not modelled: {r}")
    return env[out]


def dact(name: str, a: torch.Tensor, ex2_ulps=0, rcp_ulps=0) -> torch.Tensor:
    """The kernels' built-in derivative ``name`` at fp32 ``a``, ex2 and rcp off by the given ulps."""
    records, out = codegen.ssa(activations.dact_ir(name).expr, "g", {0: "a"}, {}, builtin=True)
    return run(records, out, {"a": a}, unary_ops(ex2_ulps, rcp_ulps))


def dact_formula_f64(name: str, a: torch.Tensor) -> torch.Tensor:
    """docs/NUMERICS.md's derivative ``name`` in fp64 (its constants rounded to fp32, as the
    formulas' are): the value both the reference and the kernels approximate."""
    a = a.double()

    def c(v):
        return float(f32(v))

    if name in ("silu", "qgelu"):
        z = a if name == "silu" else c(1.702) * a
        s = torch.sigmoid(z)
        return z * (s * (1.0 - s)) + s
    t = torch.tanh(c(0.79788456) * a * (1.0 + c(0.044715) * a * a))
    return 0.5 * a * ((1.0 - t * t) * (c(0.79788456) + c(0.1070322243) * a * a)) + 0.5 * (1.0 + t)


def root(name: str) -> float:
    """The root of ``dact_formula_f64(name)`` on the negative axis (bisection in fp64)."""
    lo, hi = -2.0, -0.5  # the sign changes once here for gelu, silu and qgelu
    for _ in range(100):
        mid = (lo + hi) / 2
        if dact_formula_f64(name, torch.tensor(mid, dtype=torch.float64)).item() < 0:
            lo = mid
        else:
            hi = mid
    return lo
