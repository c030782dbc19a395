"""Test-data helpers shared by the test suite, the device check and users' own tests."""

from __future__ import annotations

from dataclasses import replace

import torch


def planted(m: int, n: int, dtype=torch.float32, seed: int = 0, scale: float = 1.0,
            specials: bool = True, device="cpu") -> torch.Tensor:
    """Random normal data times ``scale`` with +-0, NaN, +-inf, fp32 subnormals, an all-zero
    block and a huge block planted at fixed places (where the shape has room for them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((m, n), generator=g, dtype=torch.float32) * scale
    if specials and m * n:
        flat = x.view(-1)
        picks = torch.randperm(flat.numel(), generator=g)
        vals = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -3e-39, 2.0 ** -130]
        for v, p in zip(vals, picks[: len(vals)].tolist()):
            flat[p] = v
        if m >= 2 and n >= 64:
            x[1, 32:64] = 0.0  # an all-zero block
        if m >= 4 and n >= 32:
            x[3, :32] *= 1e30 if dtype == torch.float32 else 1e3  # a huge block
    return x.to(dtype).to(device)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes in logical element order, on the CPU (a fresh 1-D copy: reshape(-1) of a view
    keeps a stride even of a single element, e.g. one row of GEMM-ready scales, and
    view(uint8) refuses a stride other than 1)."""
    return t.new_empty(t.numel()).copy_(t.reshape(-1)).view(torch.uint8).cpu()


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN-safe) of two tensors of one dtype and shape."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


def poisoned(op, x: torch.Tensor, group_offsets=None, row_align: int = 1):
    """Outputs for ``op`` on ``x`` filled with garbage, so a byte the kernel fails to write shows.

    Swizzled scale padding stays zero (it is zeroed at allocation; the kernels write only
    logical entries), amax and dbias get values no kernel would produce. Grouped outputs
    (``group_offsets``) are poisoned in every scale byte: a grouped call writes (or, swizzled,
    clears) them all. ``row_align``: FP8 data rows padded to it (MXFP8Tensor.empty), the padding
    poisoned too (``padded_rows`` reads it back: no kernel may write it); the default 1 gives
    contiguous data at any N (the library's own outputs pad rows at N % 8 != 0).
    """
    from .tensor import MXFP8Tensor

    out = MXFP8Tensor.empty(op.spec, op.output_shape(x.shape), x.dtype, x.device, group_offsets=group_offsets,
                            row_align=row_align)
    for name in ("rowwise_data", "colwise_data"):
        t = getattr(out, name)
        if t is not None:
            padded_rows(t).fill_(0xAB)
    if op.spec.scale_layout == "compact" or group_offsets is not None:
        for name in ("rowwise_scale", "colwise_scale"):
            t = getattr(out, name)
            if t is not None:
                t.fill_(0xCD)
    if out.dbias is not None:
        out.dbias.fill_(12345.0)
    if out.amax is not None:
        out.amax.fill_(-1.0)
    return out


def padded_rows(t: torch.Tensor) -> torch.Tensor:
    """The whole rows, padding included, of FP8 data ``t`` made by MXFP8Tensor.empty (with or
    without row_align), as bytes [rows, row stride] (tensor.data_rows' rows; one row: its n bytes)."""
    from .tensor import data_rows, flat_dims

    m, n = flat_dims(t.shape)
    v = data_rows(t.view(torch.uint8), m, n)
    ld = v.stride(0) if m > 1 else n
    return v.as_strided((m, ld), (ld, 1))


def byte_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """(number of differing bytes, largest difference of two differing bytes as codes)."""
    a, b = _bytes(a).to(torch.int16), _bytes(b).to(torch.int16)
    d = a != b
    return int(d.sum()), int((a - b).abs()[d].max()) if d.any() else 0


def is_exact(op) -> bool:
    """Whether docs/NUMERICS.md's exact class applies to ``op`` (no transcendental, no division)."""
    inexact = ("gelu", "silu", "qgelu")
    return op.epilogue.exact and op.spec.act not in inexact and op.spec.dact not in inexact


# Transcendental class, dbias: the kernels' v may differ from the reference's by a few fp32 ulps
# per element (their exp/tanh/erf are not torch's), and docs/NUMERICS.md measures dbias against a sum
# of the kernel's own v, which a test cannot see. Slack per column: this times its sum of |v|.
V_SLACK = 2.0 ** -21
# The built-in dact formulas are accurate in absolute, not relative terms (the fast tanh and
# sigmoid are good to ~2^-24 absolute, and dgelu's `1 - t * t` and dsilu's `1 - s` cancel), so
# where dact(a) is small the kernel's v = d * dact(a) can be far from the reference's in relative
# terms: a column of one row is v itself. NUMERICS.md bounds |dact_kernel(a) - dact_ref(a)| by
# DACT_SLACK * (1 + |a|) (an emulation of the approximate ex2/rcp over [-30, 30] stays under it:
# tests/test_codegen.py::test_fast_dact_error_bound); v_weight adds that times |d| (1 + |a|) per
# element (the gate half of a gated backward: |d u| (1 + |g|)), the bound on the data bytes near
# the derivative's roots (v_bound) and, summed per column, the dbias slack (v_abs_sum).
DACT_SLACK = 2.0 ** -20


def v_weight(op, *args, act_input=None, group_offsets=None, **kwargs) -> torch.Tensor:
    """Per-element fp64 weight [M, N] (the output's rows and columns) of the transcendental
    class's slack on the kernels' v, in units of V_SLACK: |v| (NUMERICS steps 1-3, on the
    reference), plus DACT_SLACK / V_SLACK times the factor a built-in derivative multiplies:
    |d| (1 + |a|) for a ``dact`` op (d the epilogue's value, a the ``act_input``), |d u| (1 + |g|)
    on the gate half of a gated backward ((d * u) * dact(g); its up half d * act(g) adds nothing).
    So the kernels' v is within V_SLACK times this of the reference's (docs/NUMERICS.md,
    "Exactness classes"); ``v_abs_sum`` sums it per column, ``v_bound`` bounds the data with it.
    ``group_offsets`` is taken as ``v_abs_sum`` takes it and changes nothing (v is per element)."""
    return _slack(op, args, act_input, kwargs)[1]


def _slack(op, args, act_input, kwargs):
    """(the reference's v [M, N], v_weight, the input dtype) of one call of ``op``."""
    from .formats.reference import epilogue_value
    from .frontend import gated

    op, call = op._lower(op._bind(args, kwargs, act_input))  # a gated op: its inner op over the halves
    spec, ep, tensors, scalars = op.spec, op.epilogue, call.tensors, call.scalars
    v = epilogue_value(spec, ep, tensors, scalars, call.act_input)
    w = v.abs().double()
    if spec.dact is not None:
        d = epilogue_value(replace(spec, dact=None), ep, tensors, scalars, None)
        w = w + (DACT_SLACK / V_SLACK) * _dact_factor(d, call.act_input)
    elif gated.is_halves(ep):
        n = v.shape[1] // 2
        du = epilogue_value(spec, replace(ep, expr=_gate_product(ep.expr)), tensors, scalars, None)[:, :n]
        w[:, :n] += (DACT_SLACK / V_SLACK) * _dact_factor(du, tensors[-2])  # tensors[-2]: the gate half g
    return v, w, tensors[0].dtype


def _gate_product(expr):
    """d * u in gated.backward_epilogue's where(HALF == 0, (d * u) * dact(g), d * act(g))."""
    from .frontend import ir

    gate = getattr(expr, "a", None)
    if not (isinstance(expr, ir.Where) and isinstance(gate, ir.Binary) and isinstance(gate.a, ir.Binary)):
        raise TypeError(f"mxq.testing: not the epilogue of a gated backward: {expr!r}")
    return gate.a


def _dact_factor(d: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """|d| (1 + |a|) in fp64: what multiplies DACT_SLACK in the bound on d * dact(a)."""
    return d.abs().double() * (1.0 + a.reshape(d.shape).double().abs())


def v_abs_sum(op, *args, act_input=None, group_offsets=None, **kwargs) -> torch.Tensor:
    """Per-column fp64 weight of ``compare``'s dbias slack (its ``v_abs`` argument, [G, N] per
    group with ``group_offsets``) for an op in the transcendental class: the column sums of
    ``v_weight``."""
    from .formats import groups

    w = v_weight(op, *args, act_input=act_input, **kwargs)
    if group_offsets is None:
        return w.sum(0)
    return torch.stack([w[start:end].sum(0) for start, end in groups.bounds(group_offsets)])


def v_bound(op, *args, act_input=None, group_offsets=None, **kwargs) -> torch.Tensor:
    """Per-element fp64 bound [M, N] on how far the kernels' v (after step 5) may be from the
    reference's in the transcendental class, ``compare``'s ``v_bound`` argument: B = V_SLACK x
    ``v_weight`` for fp32 inputs. bf16/fp16 inputs round v to the input dtype (step 5), which is
    monotone, so the kernels' rounded v lies between those of v - B and v + B: the bound is the
    larger distance from the reference's rounded v to them (0 where B stays inside one rounding
    interval, up to a step of the dtype where v is next to a tie). 0 where not finite (a NaN or
    inf v: no slack). ``group_offsets`` changes nothing, as for ``v_weight``."""
    v, w, dtype = _slack(op, args, act_input, kwargs)
    b = V_SLACK * w
    if dtype != torch.float32:
        def rounded(t):  # fp64 -> the kernels' fp32 v -> step 5
            return t.float().to(dtype).double()

        v = v.double()
        b = torch.maximum(rounded(v + b) - rounded(v), rounded(v) - rounded(v - b))
    return torch.where(torch.isfinite(b), b, torch.zeros_like(b))


def _spacing(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of FP8 ``dtype``'s values at magnitudes ``y`` >= 0 (fp64; at a power of two,
    the spacing above it), one code: eps x the largest power of two <= y, subnormals' spacing
    below the smallest normal."""
    fi = torch.finfo(dtype)
    y = y.double()
    _, e = torch.frexp(y)
    p = torch.where(y > 0, torch.ldexp(torch.ones_like(y), e - 1), torch.zeros_like(y))
    return fi.eps * torch.clamp(p, min=fi.tiny)


def compare(got, want, exact: bool, v_abs: torch.Tensor | None = None, *,
            v_bound: torch.Tensor | None = None) -> list[str]:
    """Differences between two MXFP8Tensors under docs/NUMERICS.md's exactness classes ([] if none).

    Exact class: every data and scale byte and the amax bits equal. Transcendental class: at
    most 1 in 1e4 data bytes off, each by one code, or by more only where ``v_bound`` (the
    op's ``v_bound``: the per-element bound on the kernels' v) is given and the decoded values
    (data x the block's scale) differ by at most that bound plus half a code of each (both
    round their v once to the FP8 grid); few scale bytes off. dbias: within 1 ulp of the input
    dtype of the reference's fp64 sum (numerics.dbias_partial_dtype bounds the kernels'), plus,
    outside the exact class and where ``v_abs`` (``v_abs_sum``) is given, V_SLACK x the
    column's sum of |v|. Without it a column whose sum cancels fails that class now and then (its
    1-ulp bound is relative to a sum near zero, while the kernels' order of additions differs from
    the reference's by rounding errors proportional to sum |v|).
    """
    problems = []
    m = 1
    for d in want.shape:
        m *= d
    total = max(1, m)
    for name in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        w = getattr(want, name)
        if w is None:
            continue
        g = getattr(got, name)
        if g is None or g.shape != w.shape:
            problems.append(f"{name}: missing or wrong shape")
            continue
        nd, worst = byte_diff(g, w)
        if "data" in name:
            far = 0 if exact or worst <= 1 else _far_bytes(got, want, name.split("_")[0], v_bound)
            if nd if exact else (nd > max(1, total // 10000) or far):
                problems.append(f"{name}: {nd} bytes differ (worst by {worst})" + (
                    f"; {far} by more than one code" + (" outside v_bound" if v_bound is not None else "")
                    if far else ""))
        elif nd and (exact or nd > max(1, total // 3200)):
            problems.append(f"{name}: {nd} scale bytes differ")
    if want.amax is not None:
        ga, wa = got.amax.cpu(), want.amax.cpu()
        same = same_bytes(ga, wa) or bool(torch.isnan(ga) & torch.isnan(wa))
        if not same and (exact or not torch.allclose(ga, wa, rtol=1e-5)):
            problems.append(f"amax {ga.item()} != {wa.item()}")
    if want.dbias is not None:
        gd, wd = got.dbias.cpu().double(), want.dbias.cpu().double()
        ulp = torch.finfo(want.dbias.dtype).eps * wd.abs() + torch.finfo(want.dbias.dtype).tiny
        if v_abs is not None and not exact:
            va = v_abs.cpu().double().reshape(ulp.shape)
            ulp = ulp + V_SLACK * torch.where(torch.isfinite(va), va, torch.zeros_like(va))  # no slack past inf
        ok = ((gd - wd).abs() <= ulp) | (torch.isnan(gd) & torch.isnan(wd)) | (gd == wd)
        if not ok.all():
            problems.append(f"dbias: {int((~ok).sum())} of {ok.numel()} columns off by more than 1 ulp")
    return problems


def _far_bytes(got, want, direction: str, v_bound: torch.Tensor | None) -> int:
    """How many of ``direction``'s data bytes differ by more than one code and, where
    ``v_bound`` is given, decode to values further apart than it plus half a code of each."""
    from .tensor import flat_dims

    m, n = flat_dims(want.shape)
    codes = [getattr(t, f"{direction}_data").reshape(m, n).view(torch.uint8).cpu().to(torch.int16)
             for t in (got, want)]
    far = (codes[0] - codes[1]).abs() > 1
    if v_bound is None or not far.any():
        return int(far.sum())
    at = far.nonzero(as_tuple=True)
    (vg, hg), (vw, hw) = (_decoded(t, direction, at) for t in (got, want))
    bound = v_bound.cpu().double().reshape(m, n)[at]
    ok = ((vg - vw).abs() <= bound + hg + hw) | (torch.isnan(vg) & torch.isnan(vw))
    return int((~ok).sum())


def _decoded(t, direction: str, at) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoded value, half a code there) in fp64 of ``t``'s ``direction`` data at indices ``at``
    of [M, N]: data x the block's scale, and half the FP8 spacing at |data| x the scale."""
    from .tensor import flat_dims

    m, n = flat_dims(t.shape)
    data = getattr(t, f"{direction}_data")
    ones = replace(t, **{f"{direction}_data": torch.ones(t.shape, device=data.device).to(data.dtype)})
    scale = ones.dequantize(direction).reshape(m, n)[at].cpu().double()
    q = data.reshape(m, n).view(torch.uint8)[at].view(data.dtype).cpu().double()
    return q * scale, 0.5 * _spacing(q.abs(), data.dtype) * scale
