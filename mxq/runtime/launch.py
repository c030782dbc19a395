"""The CUDA call path: bind one call's tensors to a compiled kernel and launch it.

Two ways to launch, one set of rules: the native dispatcher (csrc/dispatch.cc, shared with C++
callers) for ordinary calls, broadcast and strided operands, noop and grouped calls of compact
scales with int32 group ends included, and a Python binding of the native kernel function
(``Launcher.bind``) for ``op.prepare`` (bound once, re-launched with no checks), the other
grouped calls, two-halves ops, and machines that cannot build the dispatcher. Both pick the "vec" variant when N % 8 == 0 and every [M, N] tensor is 16-byte
aligned, else the "generic" one (any shape: the packed kernel's unaligned rows for 16-bit
inputs, the element-wise kernel for fp32), or "rows8" (whole 8-byte output units: the unaligned
rows of 16-bit inputs, fp32's vectorised kernel with staged rows) where the FP8 outputs' rows
start on 8-byte boundaries, such as the padded rows mxq allocates at N % 8 != 0
(``variant_for``; the dispatcher by the same rules).
"""

from __future__ import annotations

import weakref

import torch

from ..formats import fp4, fp4_layouts, groups
from ..formats.numerics import dbias_partial_dtype
from ..frontend import gated, ir
from ..kernels.config import UNIT
from ..tensor import MXFP8Tensor, data_rows, flat_dims
from . import operands, slots, validation
from .compiler import VEC_ALIGN, VEC_DIVISOR, native_function

_noop_zero: dict = {}


def noop_tensor(device):
    """The zero noop tensor of a device (one per device, kept for the process): what a call
    without ``noop`` passes, from Python and from the C++ dispatchers."""
    t = _noop_zero.get(device)
    if t is None:
        t = _noop_zero[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


class Launcher:
    """Calls the compiled kernels for one (op, device, dtype): the vectorised one when N % 8 == 0
    and every [M, N] tensor is 16-byte aligned, else rows8 or the generic one (variant_for).
    Each compiles on first use."""

    def __init__(self, op, arch: str, dtype_name: str, dispatchers):
        """``dispatchers``: the op's (destination-passing, allocating) native dispatchers
        (ffi.make_dispatchers), or None where they cannot be built: this class's own Python
        binding (``bind``) then does the same work. ``allocating(*tensors, *scalars, act_input,
        noop, group_offsets)`` allocates the outputs, launches and returns the MXFP8Tensor in one
        native call (its arguments already checked in Python as FusedOp._fast_call does; the route
        checks the rest, csrc/dispatch.cc); compact scales only."""
        self.op, self.arch, self.dtype_name = op, arch, dtype_name
        self.fns: dict = {}
        self.dispatch, self.allocating = dispatchers[:2] if dispatchers is not None else (None, None)
        # calls without out=/noop allocate in the native route; swizzled scales need zeroed padding,
        # which that route does not write (bench/device_check.py turns this off to compare)
        self.native_alloc = op.spec.scale_layout == "compact"

    def plan(self, call, operand_kinds):
        """How a checked call runs, as (run, allocating): ``run(call)`` runs any call of the same
        Call.key (mxq/runtime/call.py) with no further layout checks. The native dispatcher takes
        calls of broadcast and strided operands, and grouped calls of compact scales with
        contiguous int32 group ends (native_groups), and checks per call what values can break
        (memory overlap; alignment, hence the variant); ``allocating``: the call takes its
        allocating route (one native call allocates every output, zeroed where a noop or grouped
        call needs it, and launches: the host-time path). Other grouped calls, two-halves ops,
        and machines without the dispatcher take the Python binding (``run``), which checks
        ``out``'s overlap itself on every call."""
        op = self.op
        if self.dispatch is None or not native_groups(op.spec, call.group_offsets) or gated.is_halves(op.epilogue):
            def bound(c):
                if c.out is not None:
                    validation.check_out_apart(op.epilogue, c, op.spec.hadamard)
                return self.run(zeroed_out(op.spec, op.epilogue, c), operand_kinds)

            return bound, False
        if call.out is None and self.native_alloc and call.tensors[0].numel():
            alloc = self.allocating
            return (lambda c: alloc(*c.tensors, *c.scalars, c.act_input, c.noop, c.group_offsets)), True
        return self._dispatch_into, False

    def _fn(self, variant: str, operand_kinds=None):
        key = (variant, operand_kinds)
        fn = self.fns.get(key)
        if fn is None:
            fn = self.fns[key] = native_function(self.op, self.arch, self.dtype_name, variant, operand_kinds)
        return fn

    def run(self, call, operand_kinds):
        """A call (mxq/runtime/call.py) through the Python binding (``operand_kinds``:
        validation.operand_layouts): grouped calls, two-halves ops (plan)."""
        return self._launch(*self.bind(call, operand_kinds), call.noop)

    def prepare(self, call, operand_kinds):
        """``op.prepare``'s (launch, out): the call bound once, ``launch()`` re-running it with no
        checks (a grouped call re-reads its offsets at every launch: grouped_relaunch)."""
        fn, fargs, out = self.bind(call, operand_kinds, deferred=True)
        if fn is None:  # (an empty call: its dbias and amax still become the reference's zeros)
            return (lambda: _empty_call(self.op.spec, out, call.noop)), out
        if call.group_offsets is None:
            return (lambda: fn(*fargs)), out
        return grouped_relaunch(fn, fargs, out, call.group_offsets, call.noop, self.op.spec), out

    def _launch(self, fn, args, out, noop):
        """Launch a bound call; an empty one (no function) still owes dbias and amax their zeros."""
        if fn is not None:
            fn(*args)
        else:
            _empty_call(self.op.spec, out, noop)
        return out

    def bind(self, call, operand_kinds=None, deferred: bool = False):
        """(native function, its argument list, out) for one call; launching is ``fn(*args)``.
        The argument list follows the kernel slot table (mxq/runtime/slots.py); ``operand_kinds``: the
        epilogue inputs' kinds (validation.operand_layouts; None: all full and contiguous); a
        grouped call's ``group_offsets`` go to the grouped kernels (no host sync). ``deferred``
        (op.prepare's binding): a given ``out`` of a grouped call is not cleared or relabelled
        with the groups here but at every launch (grouped_relaunch), under the noop of that
        launch (here it keeps its own ends: validation.check_out holds them to the call's count)."""
        tensors, scalars, act_input, noop, out, group_offsets, _ = call
        spec, epi = self.op.spec, self.op.epilogue
        x = tensors[0]
        m, n = flat_dims(x.shape)
        shape = gated.out_shape(epi, x.shape)  # (two-halves ops write [M, 2N])
        n_out = flat_dims(shape)[1]
        grouped = group_offsets is not None
        if out is None:
            out = MXFP8Tensor.empty(spec, shape, x.dtype, x.device, group_offsets=group_offsets)
        elif deferred and grouped:
            out.label(spec, group_offsets if noop is None else out.group_offsets, None)
        else:
            out.label(spec, group_offsets, noop)  # (the group ends the outputs are laid out by, ...)
            if grouped:
                _clear_padding(spec, out, noop)
        kinds = list(operand_kinds or ("full",) * len(tensors)) + (["full"] if spec.dact else [])
        sources = [*tensors, act_input] if spec.dact else list(tensors)
        for name, t, kind in zip((*epi.arg_names, "act_input"), sources, kinds):
            if kind != "strided" and not t.is_contiguous():
                raise ValueError(f"mxq: argument {name!r} must be contiguous on CUDA (call .contiguous() first)")
        mats = [t if kind == "strided" else operands.as_matrix(t, kind, m, n)
                for t, kind in zip(sources, kinds)]
        row_data = _as_u8_2d(out.rowwise_data, m, n_out // 2 if spec.is_fp4 else n_out) if spec.rowwise else None
        transposed = spec.colwise and spec.scale_layout == "gemm"  # (FP8 block scaling's [N, M] copy)
        col_shape = (n_out, m // 2) if spec.is_fp4 else (n_out, m) if transposed else (m, n_out)  # (FP4: [N, M/2])
        col_data = _as_u8_2d(out.colwise_data, *col_shape) if spec.colwise else None
        operand = {
            "act_input": lambda: mats[-1],
            "rowwise_data": lambda: row_data,
            "rowwise_scale": lambda: flat_scale(out.rowwise_scale),
            "colwise_data": lambda: col_data,
            "colwise_scale": lambda: flat_scale(out.colwise_scale),
            "amax": lambda: (fp4_layouts.amax_pair(out.amax, out.colwise_amax) if spec.hadamard  # (limits.fp4_unserved)
                             else out.amax.view(-1)),  # (a grouped NVFP4 call's: one per group)
            "dbias": lambda: out.dbias,
            # (a row per tile: 32 rows or more, NVFP4's colwise tile 16 under Tuning(fp4_col_rows=16))
            "dbias_workspace": lambda: torch.empty((groups.workspace_rows(m, group_offsets.numel() if grouped else None,
                                                                          _ws_tile_rows(spec)),
                                                    n_out), dtype=dbias_partial_dtype(x.dtype), device=x.device),
            "noop": lambda: noop.reshape(1) if noop is not None else noop_tensor(x.device),
            "group_offsets": lambda: group_offsets.to(torch.int32).contiguous(),
            "rng": lambda: rng_tensor(call.fp4, x.device, m, n),
        }
        args = []
        for slot in slots.kernel_slots(spec, len(epi.tensor_params), gated.launch_scalars(epi), grouped):
            if slot.role == "input":
                args.append(mats[slot.index])
            elif slot.role == "scalar":
                args.append(ir.scalar(scalars[slot.index]))
            else:
                args.append(operand[slot.role]())
        key = tuple(kinds[:len(tensors)]) if operand_kinds else None
        given = call.fp4.global_amax if call.fp4 is not None else None
        if spec.is_fp4:
            variant = fp4_variant(n, mats, kinds, row_data) + ("_given" if given is not None else "") + (
                "_grouped" if grouped else "")
        else:
            # (the transposed copy's rows are the kernel's own concern: store_transposed checks their alignment)
            variant = variant_for(n, n_out, mats, kinds, (row_data, None if transposed else col_data), grouped)
        fn = self._fn(variant, key) if m * n else None
        if given is not None:  # (hadamard=True: the amax slot's pair, which the given pair fills)
            fn = given_amax_first(fn, operand["amax"]() if spec.hadamard else out.amax, given, noop)
        return fn, args, out

    def _dispatch_into(self, call, token=None):
        """A call into ``call.out`` through the destination-passing dispatcher (a noop call
        without ``out``: into zeroed outputs; else fresh ones, e.g. swizzled scales, which the
        allocating route does not make); a given ``out`` then describes the call
        (MXFP8Tensor.label: its group ends, scale_mode, colwise_amax) and, without noop, holds
        the call's into_token (``token``: already computed), by which later calls into it skip
        Python's checks (FusedOp._fast_into). Every call that reaches here was checked, or is of
        the layout of one that was (Call.key, the token)."""
        given = call.out
        call = zeroed_out(self.op.spec, self.op.epilogue, call)
        out, offsets = call.out, call.group_offsets
        if out is None:
            x = call.tensors[0]
            out = MXFP8Tensor.empty(self.op.spec, x.shape, x.dtype, x.device, group_offsets=offsets)
        self.dispatch(*call.tensors, *call.scalars, call.act_input, out.rowwise_data, out.rowwise_scale,
                      out.colwise_data, out.colwise_scale, out.amax, out.dbias, call.noop,
                      *(() if offsets is None else (offsets,)))
        if given is not None:  # (outputs made here are labelled already)
            given.label(self.op.spec, offsets, call.noop)
            if call.noop is None:
                given.__dict__["_mxq_into"] = (self, token if token is not None else into_token(call.tensors[0], given,
                                                                                                offsets))
        return out


def into_token(x, out: MXFP8Tensor, group_offsets):
    """What Python's checks of an ``out=`` call of one op depend on (validation.check_out, with
    no noop; token_holds reads it): the input's shape, dtype and device, the group count, out's
    format, block, fp8, scale layout and shape (_token_head), and each field (_out_fields): None,
    or the tensor itself (a weak reference: a field set to another tensor, or to None, is checked
    again, and the token keeps no memory alive) with its shape and dtype (a field resized in
    place, or given other ``.data``, is checked again). Its strides and device the native
    dispatcher, the only route a token leads to, checks on every call (contiguous scales, data
    rows of unit stride at least N apart, one device: csrc/dispatch.cc), naming the field."""
    fields = tuple(None if t is None else (weakref.ref(t), t.shape, t.dtype) for t in _out_fields(out))
    return _token_head(x, out, group_offsets), fields


def token_holds(token, x, out: MXFP8Tensor, group_offsets) -> bool:
    """Whether ``token`` (into_token's, of an earlier checked call into ``out``) holds for a call
    of ``x`` and ``group_offsets`` into ``out`` as it is now."""
    head, fields = token
    if head != _token_head(x, out, group_offsets):
        return False
    for kept, t in zip(fields, _out_fields(out)):
        if kept is None:
            if t is not None:
                return False
        elif kept[0]() is not t or t.shape != kept[1] or t.dtype != kept[2]:
            return False
    return True


def _token_head(x, out: MXFP8Tensor, group_offsets) -> tuple:
    return (x.shape, x.dtype, x.device, None if group_offsets is None else group_offsets.shape, out.format,
            out.block, out.fp8, out.scale_layout, out.shape)


def _out_fields(out: MXFP8Tensor) -> tuple:
    """``out``'s tensors in validation.OUT_FIELDS' order (read attribute by attribute: every token route call)."""
    return (out.rowwise_data, out.colwise_data, out.rowwise_scale, out.colwise_scale, out.amax, out.dbias,
            out.colwise_amax)


def _ws_tile_rows(spec) -> int:
    """The fewest rows of a tile of ``spec``'s kernels (the dbias workspace's row of partial sums
    per tile, Launcher.bind): NVFP4's colwise 16-row blocks (KernelConfig.fp4_col_rows may tile
    by one block), else 32."""
    return spec.block_format.col_block[0] if spec.is_fp4 and spec.colwise else groups.BLOCK


def native_groups(spec, group_offsets) -> bool:
    """Whether the native dispatcher launches a call of ``group_offsets`` itself (None: an
    ungrouped call, yes): contiguous int32 group ends and compact scales (csrc/dispatch.cc's
    GroupEnds; int64 ends are converted and swizzled padding cleared by ``Launcher.bind``)."""
    return group_offsets is None or (group_offsets.dtype == torch.int32 and group_offsets.is_contiguous()
                                     and spec.scale_layout == "compact")


def zeroed_out(spec, epilogue, call):
    """``call``, or for a noop call without ``out`` the call into zeroed outputs (a noop call
    writes nothing)."""
    if call.noop is not None and call.out is None:
        x = call.tensors[0]
        return call._replace(out=MXFP8Tensor.empty(spec, gated.out_shape(epilogue, x.shape), x.dtype, x.device,
                                                   zeroed=True, group_offsets=call.group_offsets))
    return call


def variant_for(n: int, n_out: int, mats, kinds, datas, grouped: bool) -> str:
    """The compiled variant for one call: "vec" when N % 8 == 0 and every [M, N] tensor the
    vectorised kernel reads 16 bytes at a time (full, strided and row operands, the FP8 data) is
    16-byte aligned with rows a multiple of 8 elements apart; else "rows8" where the FP8 data rows
    (``datas``, [M, n_out] views; None where not written) all start on 8-byte boundaries,
    ungrouped (padded outputs, MXFP8Tensor.empty(row_align=...)); else "generic".
    A two-halves op (n_out == 2n) writes half 1 from column n, so "rows8" also needs n % 8 == 0.
    One row's stride does not matter. csrc/dispatch.cc applies the same rules to its calls."""
    outs = [t for t in datas if t is not None]
    wide = [t for t, kind in zip(mats, kinds) if kind in ("full", "strided", "row")] + outs
    vec = (n % VEC_DIVISOR == 0 and all(t.data_ptr() % VEC_ALIGN == 0 for t in wide)
           and all(t.stride(0) % VEC_DIVISOR == 0 for t, kind in zip(mats, kinds) if kind == "strided")
           and all(t.shape[0] <= 1 or t.stride(0) % VEC_DIVISOR == 0 for t in outs))
    if vec:
        return "vec_grouped" if grouped else "vec"
    if grouped:
        return "generic_grouped"
    rows8 = (n_out == n or n % UNIT == 0) and all(
        t.data_ptr() % UNIT == 0 and (t.shape[0] <= 1 or t.stride(0) % UNIT == 0) for t in outs)
    return "rows8" if rows8 else "generic"


def fp4_variant(n: int, mats, kinds, row_data) -> str:
    """The compiled variant of an FP4 call: "vec", the only one with FP4 outputs (N % 8 == 0,
    16-byte aligned operands and data, data rows whole words apart: limits.fp4_unserved keeps
    other calls on the reference); anything else is a ValueError."""
    wide = [t for t, kind in zip(mats, kinds) if kind in ("full", "strided", "row")] + [
        t for t in (row_data,) if t is not None]
    if (n % VEC_DIVISOR == 0 and all(t.data_ptr() % VEC_ALIGN == 0 for t in wide)
            and all(t.stride(0) % VEC_DIVISOR == 0 for t, kind in zip(mats, kinds) if kind == "strided")
            and (row_data is None or row_data.shape[0] <= 1 or row_data.stride(0) % (VEC_DIVISOR // 2) == 0)):
        return "vec"
    raise ValueError("mxq: an FP4 call needs N % 8 == 0 and 16-byte aligned tensors on the kernels "
                     "(limits.fp4_unserved)")


def rng_tensor(args, device, m: int, n: int) -> torch.Tensor:
    """NVFP4's stochastic-rounding slot: int64 [seed, offset] on the device (``args``:
    fp4.CallArgs or None; a seed left None taken as the reference takes it, fp4.seed_and_offset,
    for a call of [m, n] values; a seed of 2^63 or more as its two's complement, the same 64
    bits). A prepared call keeps the values it was bound with."""
    seed, offset = fp4.seed_and_offset(args.seed if args is not None else None,
                                       args.offset if args is not None else None, device, fp4.words_drawn(m, n))
    return torch.tensor([seed - (seed >> 63 << 64), offset], dtype=torch.int64, device=device)


def given_amax_first(fn, amax: torch.Tensor, given, noop=None):
    """NVFP4 with a known per-tensor amax (global_amax=, a float or a one-element fp32 tensor on the
    device; a grouped call's ``amax`` [G] takes it for every group, or a [G] tensor, one per
    group; hadamard=True's ``amax`` is the fp32[2] pair, given as an fp32 [2] tensor, two floats
    or two one-element tensors): ``fn`` (the quantize pass alone, variant "vec_given"; None for an
    empty call) run after the amax is written into ``amax`` on the stream (no host sync, no
    host-to-device copy; unless ``noop`` holds 1.0; a tensor is re-read at every launch of a
    prepared call, so one changed in place between launches is followed)."""
    floats = isinstance(given, (tuple, list)) and not isinstance(given[0], torch.Tensor)  # (a pair of floats)

    def launch(*args):
        if floats:  # (each entry filled, in place or into the value a noop picks: no copy from the host)
            value = amax if noop is None else amax.new_empty(2)
            value[0].fill_(ir.f32(given[0]))  # (rounded to fp32 once: fill_ refuses a double past its range)
            value[1].fill_(ir.f32(given[1]))
        elif isinstance(given, (tuple, list)):  # (two one-element tensors, stacked on the device)
            value = fp4_layouts.given_amax(given, amax.device)
        elif isinstance(given, torch.Tensor):  # (detached: an amax that requires grad gives outputs that do not)
            value = given.detach().reshape(() if given.numel() == 1 else amax.shape)
        else:
            value = ir.f32(given)
        if noop is not None:
            amax.copy_(torch.where(noop.reshape(()) == 1.0, amax, value))
        elif isinstance(value, torch.Tensor) and value is not amax:
            amax.copy_(value)
        elif not isinstance(value, torch.Tensor):
            amax.fill_(value)
        if fn is not None:
            fn(*args)

    return launch


def _empty_call(spec, out: MXFP8Tensor, noop) -> None:
    """What a call on an empty input writes: zeros into the dbias and amax the op owns (the
    reference's sums and maxima of nothing; with the Hadamard transform both amax entries), unless
    ``noop`` holds 1 (chosen on the device: no host sync, CUDA-graph safe)."""
    for t in (out.dbias if spec.dbias else None, out.amax if spec.amax or spec.format == "nvfp4" else None,
              out.colwise_amax):
        if t is None:
            continue
        if noop is None:
            t.zero_()
        else:
            t.masked_fill_(noop.reshape(()) != 1.0, 0)


def grouped_relaunch(fn, args, out: MXFP8Tensor, group_offsets, noop, spec):
    """``op.prepare``'s launch of a grouped call: the kernel reads ``group_offsets`` (the caller's
    int32 tensor, bound by reference) at every launch, so the groups may change in place between
    launches; the padding that moves with them (swizzled scales', FP4's colwise scales: _clear_padding)
    is cleared first, and ``out.group_offsets``
    follows (a device copy; all CUDA-graph safe)."""
    def relaunch():
        if noop is None:
            out.group_offsets.copy_(group_offsets)
        else:  # (noop == 1 writes nothing: keep the offsets the outputs were written by)
            keep = (noop.reshape(()) == 1.0)
            out.group_offsets.copy_(torch.where(keep, out.group_offsets, group_offsets.to(out.group_offsets.dtype)))
        _clear_padding(spec, out, noop)
        fn(*args)

    return relaunch


def _clear_padding(spec, out: MXFP8Tensor, noop) -> None:
    """Zero a reused ``out``'s grouped scale buffers whose padding the kernels do not write
    before a grouped call of op ``spec`` (they write only the groups' scales; the padding between
    them moves with the offsets): swizzled ones, and FP4's colwise [N, M // B + G] (fp4_layouts);
    unless noop holds 1.0: a multiply by (noop == 1), so no host sync and CUDA-graph safe."""
    swizzled = spec.scale_layout == "swizzled"
    fp4_col = spec.is_fp4 and spec.colwise
    for buf in (out.rowwise_scale if swizzled else None, out.colwise_scale if swizzled or fp4_col else None):
        if buf is not None:
            buf = buf.view(torch.uint8) if buf.dtype == torch.float8_e4m3fn else buf  # (NVFP4's E4M3 scales)
            if noop is None:
                buf.zero_()
            else:
                buf.mul_((noop.reshape(()) == 1.0).to(torch.uint8))


def flat_scale(s: torch.Tensor) -> torch.Tensor:
    """A scale tensor as the kernels' flat buffer: its elements in memory order from its first,
    contiguous or not (the GEMM-ready fp32 scales are a transposed view of a padded buffer,
    mxq/formats/fp8_block_layouts.gemm_scale; validation.check_out holds out='s strides to it).
    Always of unit stride, as the kernels' compact 1-D scale tensors are: a contiguous view's
    ``view(-1)`` keeps a size-1 dimension's stride (one row of GEMM-ready scales, [1, 1] of
    strides (1, 4), would flatten to [1] of stride 4)."""
    if s.dtype == torch.float8_e4m3fn:  # (NVFP4's E4M3 scales: the kernels store bytes)
        s = s.view(torch.uint8)
    span = 1 + sum((d - 1) * st for d, st in zip(s.shape, s.stride())) if s.numel() else 0
    return s.as_strided((span,), (1,))


def _as_u8_2d(t: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """FP8 data as the kernels' [m, n] bytes: a view of ``t`` (contiguous or padded rows, checked
    by validation.check_out), never a copy the kernel would write instead."""
    u = data_rows(t.view(torch.uint8), m, n)
    if u is None:
        raise ValueError(f"mxq: FP8 data of strides {tuple(t.stride())} is not rows of unit stride")
    return u
