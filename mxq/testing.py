"""Test-data helpers shared by the test suite, the device check and users' own tests."""

from __future__ import annotations

from dataclasses import dataclass, replace

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


_INEXACT_ACTS = ("gelu", "silu", "qgelu")  # the built-in acts (and derivatives) of the transcendental class


def is_exact(op) -> bool:
    """Whether docs/NUMERICS.md's exact class applies to ``op`` (no transcendental, no division). A
    gated op (act= or dact= "swiglu", ...) is its inner op over the two halves, whose epilogue holds
    the gated formula (reglu and sreglu: exact; swiglu, geglu, qgeglu: not)."""
    inner = getattr(op, "inner", None)
    if inner is not None:
        return is_exact(inner)
    return op.epilogue.exact and op.spec.act not in _INEXACT_ACTS and op.spec.dact not in _INEXACT_ACTS


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
# The built-in act formulas are accurate in absolute terms too: gelu's 0.5 + 0.5 tanh(y) is formed
# as 1 - 2 sigmoid(2y) rounded once (device.half_tanh_ex2_act), a multiple of 2^-25 that cancels
# for y < 0, and silu/qgelu's sigmoid carries its approximate ex2/rcp's absolute error, so in the
# tails, where act(a) is tiny, the kernels' v can be far from the reference's in relative terms (a
# grouped call's one-row group's dbias column is that v). NUMERICS.md adds ACT_SLACK * |a| (a the
# act's argument; tests/test_codegen.py::test_fast_act_error_bound: under it over [-30, 30] and
# every bf16/fp16 input, within 8x of it).
ACT_SLACK = 2.0 ** -22


def v_weight(op, *args, act_input=None, group_offsets=None, **kwargs) -> torch.Tensor:
    """Per-element fp64 weight [M, N] (the output's rows and columns) of the transcendental
    class's slack on the kernels' v, in units of V_SLACK: |v| (NUMERICS steps 1-3, on the
    reference), plus ACT_SLACK / V_SLACK times |a| for a built-in ``act`` (a its argument: the
    epilogue's value; gelu, silu, qgelu), plus DACT_SLACK / V_SLACK times the factor a built-in derivative multiplies:
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
    if spec.act in _INEXACT_ACTS:  # (|a|, the act's argument: the epilogue's value)
        a = epilogue_value(replace(spec, act=None, dact=None), ep, tensors, scalars, None)
        w = w + (ACT_SLACK / V_SLACK) * a.abs().double()
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


@dataclass(frozen=True)
class VBound:
    """Per element of [M, N], the interval [lo, hi] (fp64) that holds the kernels' v (NUMERICS
    steps 1-5) in the transcendental class: ``v_bound``'s answer, ``compare``'s ``v_bound``
    argument. Indexing takes rows (``bound[start:end]``: a group's rows)."""
    lo: torch.Tensor
    hi: torch.Tensor
    dtype: torch.dtype = torch.float32  # the op's input dtype (its values are the kernels' v after step 5)

    def __getitem__(self, rows) -> "VBound":
        return VBound(self.lo[rows], self.hi[rows], self.dtype)


def v_bound(op, *args, act_input=None, group_offsets=None, **kwargs) -> VBound:
    """Where the kernels' v (after step 5) lies in the transcendental class, per element of
    [M, N]: within B = V_SLACK x ``v_weight`` of the reference's v, so [v - B, v + B] for fp32
    inputs. bf16/fp16 inputs round v to the input dtype (step 5), which is monotone: the
    interval runs from the rounded v - B to the rounded v + B (the rounded v alone where B
    stays inside one rounding interval, a step of the dtype on either side next to a tie).
    A NaN or infinite v: the interval is v itself (no slack). ``group_offsets`` changes nothing,
    as for ``v_weight``."""
    v, w, dtype = _slack(op, args, act_input, kwargs)
    v = v.double()
    b = V_SLACK * w
    b = torch.where(torch.isfinite(v) & torch.isfinite(b), b, torch.zeros_like(b))
    lo, hi = v - b, v + b
    if dtype != torch.float32:  # fp64 -> the kernels' fp32 v -> step 5
        lo, hi = (t.float().to(dtype).double() for t in (lo, hi))
    return VBound(lo, hi, dtype)


def compare(got, want, exact: bool, v_abs: torch.Tensor | None = None, *,
            v_bound: VBound | None = None) -> list[str]:
    """Differences between two MXFP8Tensors under docs/NUMERICS.md's exactness classes ([] if none).

    Exact class: every data and scale byte and the amax bits (and colwise_amax's) equal. Transcendental class, with
    ``v_bound`` (the op's ``v_bound``): every data byte is the FP8 code, under its block's scale
    as written in ``got``, of some v in the element's interval; at most 1 in 1e4 are not, each
    within one code of the interval's codes (every byte of a block whose scale differs from
    ``want``'s is held to it, not only the bytes that differ), and each MXFP8 or FP8 block-scaling
    scale one that some v in the bound gives its block. Without ``v_bound``: at most 1 in 1e4 data
    bytes off, each by one code, a NaN no code's neighbour (FP4: E2M1 codes, two a byte, with or
    without ``v_bound``); few scale bytes off (one per 3200 elements), a 1-byte scale (E8M0,
    NVFP4's E4M3) by one code at most (FP4's scales so with ``v_bound`` too). dbias: within 1 ulp of
    the input dtype of the reference's fp64 sum (numerics.dbias_partial_dtype bounds the
    kernels'), plus, outside the exact class and where ``v_abs`` (``v_abs_sum``) is given,
    V_SLACK x the column's sum of |v|. Without it a column whose sum cancels fails that class
    now and then (its 1-ulp bound is relative to a sum near zero, while the kernels' order of
    additions differs from the reference's by rounding errors proportional to sum |v|).
    """
    from .tensor import MXFP8Tensor

    for arg, t in (("got", got), ("want", want)):
        if not isinstance(t, MXFP8Tensor):
            raise TypeError(f"mxq.testing.compare: {arg} must be an MXFP8Tensor, got {type(t).__name__}")
    if v_bound is not None and not isinstance(v_bound, VBound):
        raise TypeError(f"mxq.testing.compare: v_bound must be a VBound (mxq.testing.v_bound's answer), "
                        f"got {type(v_bound).__name__}")
    from .formats import fp4

    problems = []
    m = 1
    for d in want.shape:
        m *= d
    total = max(1, m)
    extra = [f for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale", "amax", "colwise_amax",
                         "dbias") if getattr(want, f) is None and getattr(got, f) is not None]
    if extra:  # (an output the reference has none of: another spec's result)
        problems.append(f"{', '.join(extra)}: present where the reference has none")
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
            if exact:
                if nd:
                    problems.append(f"{name}: {nd} bytes differ (worst by {worst})")
                continue
            if want.format in fp4.FORMATS:  # (FP4: two codes a byte, compared code by code; no v_bound yet)
                off, far = _fp4_codes_off(g, w) if nd else (0, 0)
                if off > max(1, total // 10000) or far:
                    problems.append(f"{name}: {off} codes differ, {far} of them by more than one code")
                continue
            # (given v_bound, also where no byte differs: a block whose scale moved over unchanged bytes)
            off, far = _unexplained(got, want, name.split("_")[0], v_bound) if nd or v_bound is not None else (0, 0)
            if off > max(1, total // 10000) or far:
                problems.append(f"{name}: {nd} bytes differ (worst by {worst}); " + (
                    f"{off} outside v_bound, {far} of them" if v_bound is not None else f"{far}")
                    + " by more than one code")
        elif nd and (exact or (not _scales_explained(got, want, name, v_bound) if v_bound is not None
                               and want.format in ("mxfp8", "fp8_block") else
                               nd > max(1, total // 3200) or (w.element_size() == 1 and worst > 1))):
            # (with v_bound, MXFP8's and FP8 block scaling's scales each one that some v inside the bound gives
            # its block, and the data of a block whose scale moved held to the bound under it (_unexplained);
            # without, 1-byte scales, E8M0 or NVFP4's E4M3, may move by one code, never more)
            problems.append(f"{name}: {nd} scale bytes differ" + (f", one by {worst} codes" if worst > 1 else ""))
    for name in ("amax", "colwise_amax"):  # (colwise_amax: NVFP4's Hadamard-transformed copy's)
        if getattr(want, name) is not None:
            if getattr(got, name) is None:
                problems.append(f"{name}: missing")
                continue
            ga, wa = getattr(got, name).cpu(), getattr(want, name).cpu()
            if ga.shape != wa.shape or ga.dtype != wa.dtype:  # (before any elementwise rule broadcasts them)
                problems.append(f"{name}: {tuple(ga.shape)} {ga.dtype} where {tuple(wa.shape)} {wa.dtype} is due")
                continue
            # (bit for bit, a NaN for a NaN; per entry where a grouped NVFP4 call has one per group)
            same = bool(((ga.view(torch.int32) == wa.view(torch.int32)) | (torch.isnan(ga) & torch.isnan(wa))).all())
            if not same and (exact or not torch.allclose(ga, wa, rtol=1e-5, equal_nan=True)):
                problems.append(f"{name} {ga.tolist()} != {wa.tolist()}")  # (a grouped NVFP4 call's: [G])
    if want.dbias is not None and got.dbias is None:
        problems.append("dbias: missing")
    elif want.dbias is not None:
        gd, wd = got.dbias.cpu().double(), want.dbias.cpu().double()
        ulp = torch.finfo(want.dbias.dtype).eps * wd.abs() + torch.finfo(want.dbias.dtype).tiny
        ulp = torch.where(torch.isfinite(wd), ulp, torch.zeros_like(ulp))  # (an infinite sum: that inf, no slack)
        if v_abs is not None and not exact:
            va = v_abs.cpu().double().reshape(ulp.shape)
            ulp = ulp + V_SLACK * torch.where(torch.isfinite(va), va, torch.zeros_like(va))  # no slack past inf
        ok = ((gd - wd).abs() <= ulp) | (torch.isnan(gd) & torch.isnan(wd)) | (gd == wd)
        if not ok.all():
            problems.append(f"dbias: {int((~ok).sum())} of {ok.numel()} columns off by more than 1 ulp")
    return problems


def _fp4_codes_off(g: torch.Tensor, w: torch.Tensor) -> tuple[int, int]:
    """(E2M1 codes that differ between packed data ``g`` and ``w``, those more than one code
    apart on the number line of codes: sign and 3-bit magnitude, +-0 both 0)."""
    def line(b):
        b = b.view(torch.uint8).cpu().to(torch.int16)
        codes = torch.stack([b & 0xF, b >> 4])
        return torch.where(codes >= 8, -(codes & 7), codes & 7), codes
    (lg, cg), (lw, cw) = line(g), line(w)
    off = cg != cw
    return int(off.sum()), int((off & ((lg - lw).abs() > 1)).sum())


def _scales_explained(got, want, name: str, v_bound: VBound) -> bool:
    """Whether every scale of ``got``'s ``name`` (MXFP8's E8M0 bytes, FP8 block scaling's fp32
    scales in either scale mode) is one that the block amax of some v in ``v_bound`` gives. The
    scale (an E8M0 byte read as an integer) is monotone in a positive
    finite amax (NUMERICS steps 2-4 and 6), so such a scale lies between the reference's scales of
    the blocks' least and greatest |v| in the bound, the least taken as the smallest positive
    value where an interval holds 0; where every interval of a block holds 0 its amax may be 0,
    whose scale is the reference's of the least |v| as it is (an amax of 0 is not on that line).
    The ends are quantized in the op's input dtype (step 3's limits are its). Every amax bit moves
    an fp32 scale, so in the transcendental class such scales differ wherever a block's largest
    |v| is off by a last bit; E8M0 scales move only across a power of two (compare's count)."""
    from .op import quantize

    dtype = v_bound.dtype
    lo, hi = (t.cpu().double().reshape(want.shape) for t in (v_bound.lo, v_bound.hi))
    least = torch.where((lo <= 0) & (hi >= 0), torch.zeros_like(lo), torch.minimum(lo.abs(), hi.abs()))
    greatest = torch.maximum(lo.abs(), hi.abs())
    top = torch.finfo(dtype).max
    greatest = torch.where(torch.isfinite(lo) & torch.isfinite(hi), greatest.clamp(max=top), greatest)
    smallest = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # (the least positive subnormal)
    grouped = None if want.group_offsets is None else want.group_offsets.cpu()

    def scales(a):
        return getattr(quantize(a.to(dtype), fp8=want.fp8, rowwise=want.rowwise_data is not None,
                                colwise=want.colwise_data is not None, scale_mode=want.scale_mode,
                                scale_layout=want.scale_layout, format=want.format, block=want.block,
                                group_offsets=grouped), name).cpu()

    low_end, high_end = scales(torch.where(least == 0, torch.full_like(least, smallest), least)), scales(greatest)
    zero_amax = scales(least)
    g, w = getattr(got, name).cpu(), getattr(want, name).cpu()
    if g.dtype != torch.float32:  # (E8M0 bytes: their order is their scales')
        g, w, low_end, high_end, zero_amax = (t.view(torch.uint8).to(torch.int16)
                                              for t in (g, w, low_end, high_end, zero_amax))
    low, high = torch.minimum(low_end, high_end), torch.maximum(low_end, high_end)
    ok = ((low <= g) & (g <= high)) | (g == zero_amax) | (g == w) | (torch.isnan(g) & torch.isnan(w))
    return bool(ok.all())


def _unexplained(got, want, direction: str, v_bound: VBound | None) -> tuple[int, int]:
    """(how many of ``direction``'s differing data bytes ``v_bound`` does not explain, how many
    of those are more than one code away). A byte is explained where it is the code of some v
    in its element's interval: it lies between the codes, under ``got``'s block scale, of the
    interval's ends (each rounded to fp32 first, as the kernels' v is; the quantization is
    monotone); the others are that many codes from the nearer end's code. Without ``v_bound``
    no byte is explained, and the distance is to ``want``'s byte."""
    from .formats import numerics
    from .tensor import flat_dims

    m, n = flat_dims(want.shape)
    codes = [_data_mn(t, direction, m, n).view(torch.uint8).cpu().to(torch.int16) for t in (got, want)]
    off = codes[0] != codes[1]
    nan = [_data_mn(t, direction, m, n).cpu().float().isnan() for t in (got, want)]
    far = off & (((codes[0] - codes[1]).abs() > 1) | (nan[0] != nan[1]))  # (a NaN is no code's neighbour)
    scales = None
    if v_bound is not None:  # every byte of a block whose scale moved is held to the bound under got's scale
        scales, theirs = _scale_map(got, direction, m, n), _scale_map(want, direction, m, n)
        off |= ~((scales == theirs) | (scales.isnan() & theirs.isnan()))
    if v_bound is not None and off.any():
        at = off.nonzero(as_tuple=True)
        q, scale = _decoded(got, direction, at, scales)
        fmt = numerics.FORMATS[got.fp8]
        ends = [numerics.cast_to_fp8((t.cpu().reshape(m, n)[at].float().double() / scale).float(), fmt)
                for t in (v_bound.lo, v_bound.hi)]
        lo, hi = (e.double() * scale for e in ends)
        nan = torch.isnan(q) | torch.isnan(lo) | torch.isnan(hi)
        inside = ((lo <= q) & (q <= hi)) | (torch.isnan(q) & torch.isnan(lo) & torch.isnan(hi))
        olo, ohi = (_on_the_line(e.view(torch.uint8).to(torch.int16)) for e in ends)
        ok = _on_the_line(codes[0][at])
        off[at] = ~inside
        far[at] = ~inside & (nan | (olo - ok > 1) | (ok - ohi > 1))
    return int(off.sum()), int(far.sum())


def _on_the_line(b: torch.Tensor) -> torch.Tensor:
    """FP8 bytes (int16) as their places on the number line of codes: +-magnitude, +-0 both 0."""
    mag = b & 0x7F
    return torch.where(b >= 0x80, -mag, mag)


def _data_mn(t, direction: str, m: int, n: int) -> torch.Tensor:
    """``t``'s ``direction`` FP8 data as [M, N] (the transposed copy transposed back)."""
    data = getattr(t, f"{direction}_data")
    return data.reshape(n, m).t() if t._transposed(direction) else data.reshape(m, n)


def _scale_map(t, direction: str, m: int, n: int) -> torch.Tensor:
    """Each element's block scale, decoded (fp64 [M, N]: data 1 decoded)."""
    data = getattr(t, f"{direction}_data")
    ones = replace(t, **{f"{direction}_data": torch.ones(data.shape, device=data.device).to(data.dtype)})
    return ones.dequantize(direction).reshape(m, n).cpu().double()


def _decoded(t, direction: str, at, scales=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoded value, the block's decoded scale) in fp64 of ``t``'s ``direction`` data at
    indices ``at`` of [M, N]: data x the scale, and the scale (``scales``: _scale_map's, when
    already made)."""
    from .tensor import flat_dims

    m, n = flat_dims(t.shape)
    data = getattr(t, f"{direction}_data")
    scale = (_scale_map(t, direction, m, n) if scales is None else scales)[at]
    q = _data_mn(t, direction, m, n).view(torch.uint8)[at].view(data.dtype).cpu().double()
    return q * scale, scale
