"""The torch reference of the whole mxq pipeline: the specification kernels are tested against.

Steps are numbered as in docs/NUMERICS.md. It runs on CPU or CUDA tensors, never imports cutlass,
and evaluates the epilogue and act/dact through the same IR the kernels are generated from,
one fp32 rounding per operation (the kernels are generated without FMA contraction to match).

dbias here is the float64 column sum rounded fp64 -> fp32 -> input dtype: the value docs/NUMERICS.md
measures the kernels against (within 1 ulp of the input dtype). The kernels sum each 32-row
block in fp32 for 16-bit inputs and in fp64 for fp32 inputs, and the blocks in fp64
(``numerics.dbias_partial_dtype`` says why and how far that can be from this sum).
"""

from __future__ import annotations

import torch

from ..frontend import activations, gated, ir
from . import fp4, fp4_layouts, fp8_block, fp8_block_layouts, groups, layouts
from ..runtime import operands
from ..frontend.epilogue import Epilogue
from .numerics import quantize_blocks
from ..frontend.spec import QuantSpec
from ..tensor import MXFP8Tensor, data_rows, flat_dims


def epilogue_value(spec: QuantSpec, epilogue: Epilogue, tensors, scalars, act_input) -> torch.Tensor:
    """Steps 1-3: the fp32 value v of every element as a [M, N] tensor."""
    x = tensors[0]
    m, n = flat_dims(x.shape)
    flat = [operands.as_matrix(t, operands.kind_of(t.shape, m, n, x.shape), m, n).to(torch.float32)
            for t in tensors]
    if gated.is_halves(epilogue):  # two halves side by side (mxq/frontend/gated.py): the kernels' HALF = 0, 1
        user = list(scalars)[:-1]
        return torch.cat([ir.evaluate(epilogue.expr, flat, user + [h]).expand(m, n) for h in (0.0, 1.0)], dim=1)
    v = flat[0] if epilogue.is_identity else ir.evaluate(epilogue.expr, flat, list(scalars))
    v = v.expand(m, n)
    if spec.act:
        v = ir.evaluate(activations.act_ir(spec.act).expr, [v], [])
    if spec.dact:
        a = act_input.reshape(m, n).to(torch.float32)
        v = v * ir.evaluate(activations.dact_ir(spec.dact).expr, [a], []).expand(m, n)
    return v


def run(spec: QuantSpec, epilogue: Epilogue, call) -> MXFP8Tensor:
    """Quantize ``call`` (a mxq/runtime/call.py Call) per ``spec``; its values are assumed
    validated (see validation.check_call). With ``group_offsets`` colwise blocks restart at every
    group and dbias is per group (mxq/formats/groups.py)."""
    tensors, scalars, act_input, noop, out, group_offsets, fp4_args = call
    x = tensors[0]
    shape = gated.out_shape(epilogue, x.shape)
    bnds = None
    if spec.is_fp4 and group_offsets is not None:  # (ends clamped; an odd one with the colwise copy refused before any write)
        bnds = fp4_layouts.group_bounds(group_offsets, spec.colwise, flat_dims(shape)[0])
    if out is None:
        out = MXFP8Tensor.empty(spec, shape, x.dtype, x.device, group_offsets=group_offsets)
    else:
        out.label(spec, group_offsets, noop)
    if noop is not None and bool(noop.reshape(-1)[0] == 1.0):
        return out  # write nothing at all
    m, n = flat_dims(shape)
    v = epilogue_value(spec, epilogue, tensors, scalars, act_input)
    if group_offsets is not None and bnds is None:
        bnds = groups.bounds(group_offsets)
    if bnds is not None:
        # the padding between groups moves with the offsets: a reused out= starts from zero (the
        # kernels write the compact padding rows as zero and launch.bind clears swizzled padding)
        for buf in (out.rowwise_scale if spec.scale_layout == "swizzled" else None, out.colwise_scale):
            if buf is not None:
                buf.zero_()
    if spec.dbias:  # step 4: before the input-dtype round trip
        vc = v.contiguous()  # (torch's summation order follows the layout: a view sums as its contiguous copy)
        if bnds is None:
            out.dbias.copy_(vc.sum(dim=0, dtype=torch.float64).to(torch.float32).to(x.dtype))
        else:
            for g, (start, end) in enumerate(bnds):
                out.dbias[g].copy_(vc[start:end].sum(dim=0, dtype=torch.float64).to(torch.float32).to(x.dtype))
    computed = spec.act or spec.dact or not epilogue.is_identity
    if x.dtype != torch.float32 and computed:  # step 5
        v = v.to(x.dtype).to(torch.float32)
    if spec.amax and spec.format != "nvfp4":  # (NVFP4's: write_fp4, after reading a given amax, which may be out.amax)
        out.amax.copy_(v.abs().amax() if v.numel() else torch.zeros((), device=v.device))
    if spec.format == "fp8_block":
        write_fp8_block(spec, v, out, bnds, x.dtype)
        return out
    if spec.is_fp4:
        if bnds is None:
            write_fp4(spec, v, out, fp4_args or fp4.CallArgs())
        else:
            write_fp4_groups(spec, v, out, fp4_args or fp4.CallArgs(), bnds)
        return out
    fmt = spec.element
    swizzled_groups = bnds is not None and spec.scale_layout == "swizzled"
    if swizzled_groups:
        row_starts, col_starts = groups.swizzled_starts(bnds)
    if spec.rowwise:
        data, s = quantize_blocks(v, fmt, spec.scale_mode)
        out.rowwise_data.copy_(data.reshape(shape))
        if not swizzled_groups:
            out.rowwise_scale.copy_(layouts.to_layout_rowwise(s, spec.scale_layout))
        else:  # each group blocked on its own, one after another
            for g, (start, end) in enumerate(bnds):
                if end > start:
                    blocked = layouts.to_layout_rowwise(s[start:end], "swizzled")
                    out.rowwise_scale[row_starts[g]:row_starts[g] + blocked.shape[0]].copy_(blocked)
    if spec.colwise and bnds is None:
        data_t, s_t = quantize_blocks(v.t().contiguous(), fmt, spec.scale_mode)
        out.colwise_data.copy_(data_t.t().reshape(shape))
        out.colwise_scale.copy_(layouts.to_layout_colwise(s_t.t(), spec.scale_layout))
    elif spec.colwise:  # blocks restart at every group; each group's scales from its block row
        data = out.colwise_data.reshape(m, n)
        for g, (start, end) in enumerate(bnds):
            if end == start:
                continue
            data_t, s_t = quantize_blocks(v[start:end].t().contiguous(), fmt, spec.scale_mode)
            data[start:end].copy_(data_t.t())
            if swizzled_groups:
                blocked = layouts.to_layout_colwise(s_t.t(), "swizzled")
                out.colwise_scale[col_starts[g]:col_starts[g] + blocked.shape[0]].copy_(blocked)
            else:
                first = groups.first_block_row(g, start)
                out.colwise_scale[first:first + s_t.shape[1]].copy_(s_t.t())
    return out


def write_fp8_block(spec: QuantSpec, v: torch.Tensor, out: MXFP8Tensor, bnds, input_dtype: torch.dtype) -> None:
    """Steps 6- of FP8 block scaling (docs/NUMERICS.md) on the [M, N] values ``v``, into ``out``
    (mxq/formats/fp8_block.py; the layouts of mxq/formats/fp8_block_layouts.py). With groups
    (``bnds``; compact layout) blocks that span rows restart at each group, whose block rows start
    at fp8_block_layouts.first_block_row; 1x128 rowwise blocks lie within a row and ignore them."""
    m, n = v.shape

    def quant(start, end, block):
        return fp8_block.quantize(v[start:end], spec.fp8, block, spec.scale_mode, input_dtype)

    if bnds is not None:  # the rows between groups' blocks are 0 (a reused out= too)
        for buf in (out.rowwise_scale if spec.block[0] > 1 else None, out.colwise_scale):
            if buf is not None:
                buf.zero_()
    if spec.rowwise and spec.block[0] == 1:
        data, s = quant(0, m, spec.block)
        data_rows(out.rowwise_data, m, n).copy_(data)
        out.rowwise_scale.copy_(s)
    for g, (start, end) in enumerate([(0, m)] if bnds is None else bnds):
        if end == start:
            continue
        first = 0 if bnds is None else fp8_block_layouts.first_block_row(g, start)
        if spec.rowwise and spec.block[0] > 1:
            data, s = quant(start, end, spec.block)
            data_rows(out.rowwise_data, m, n)[start:end].copy_(data)
            out.rowwise_scale[first:first + s.shape[0]].copy_(s)
        if spec.colwise:
            data, s = quant(start, end, fp8_block_layouts.colwise_block(spec.block))
            if spec.scale_layout == "gemm":  # the transposed copy [N, M] and its scales (never grouped)
                out.colwise_data.copy_(data.t())
                out.colwise_scale.copy_(s.t())
            else:
                data_rows(out.colwise_data, m, n)[start:end].copy_(data)
                out.colwise_scale[first:first + s.shape[0]].copy_(s)


def write_fp4_groups(spec: QuantSpec, v: torch.Tensor, out: MXFP8Tensor, args, bnds) -> None:
    """write_fp4 of each group's rows alone (docs/NUMERICS.md "NVFP4 and MXFP4", groups; the
    grouped layouts of fp4_layouts.py): its rowwise rows, its columns [start / 2, end / 2) of the
    colwise copy, its colwise blocks from column start // B + g of the zeroed grouped buffer;
    NVFP4's amax per group (``args.global_amax``: one value for every group, or one per group).
    ``bnds``: the groups' (start, end), fp4_layouts.group_bounds."""
    m, n = v.shape
    if spec.colwise:
        out.colwise_scale.zero_()  # (the columns between groups' blocks are 0: a reused out= too)
    given = fp4_layouts.given_amax(args.global_amax, v.device)
    for g, (start, end) in enumerate(bnds):
        if spec.format == "nvfp4":
            if given is None:
                g_amax = None
            else:
                g_amax = given.reshape(-1)[g if given.numel() > 1 else 0]
            out.amax[g].copy_(fp4.global_amax(v[start:end]) if g_amax is None else g_amax)
        if end == start:
            continue
        part = MXFP8Tensor.empty(spec, (end - start, n), v.dtype, v.device)
        write_fp4(spec, v[start:end], part, fp4.CallArgs(out.amax[g].clone() if spec.format == "nvfp4" else None))
        if spec.rowwise:
            out.rowwise_data.reshape(m, n // 2)[start:end].copy_(part.rowwise_data)
            out.rowwise_scale[start:end].copy_(part.rowwise_scale)
        if spec.colwise:
            out.colwise_data[:, start // 2:end // 2].copy_(part.colwise_data)
            first = fp4_layouts.first_colwise_block(g, start, spec.format)
            out.colwise_scale[:, first:first + part.colwise_scale.shape[1]].copy_(part.colwise_scale)


def write_fp4(spec: QuantSpec, v: torch.Tensor, out: MXFP8Tensor, args) -> None:
    """The FP4 steps (docs/NUMERICS.md "NVFP4 and MXFP4") on the [M, N] values ``v``, into ``out``
    (mxq/formats/fp4.py; the layouts of fp4_layouts.py; a group's rows alone: write_fp4_groups). The colwise copy is the
    same quantization of v transposed ([N, M]; after the Hadamard transform with ``hadamard``).
    NVFP4's global amax is ``args.global_amax`` when given, else computed from v (step N1); it
    is computed in full before any block is quantized (TE's two passes). ``args``: fp4.CallArgs."""
    seed, offset = (fp4.seed_and_offset(args.seed, args.offset, v.device, fp4.words_drawn(*v.shape))
                    if spec.stochastic_rounding else (None, None))
    copies = [("rowwise", v)] if spec.rowwise else []
    if spec.colwise:
        signs = fp4.HADAMARD_SIGNS if spec.hadamard_signs is None else spec.hadamard_signs
        copies.append(("colwise", fp4.hadamard(v.t(), signs) if spec.hadamard else v.t()))
    if spec.format == "nvfp4":  # pass 1: the global amax (of each copy, with the transform)
        given = fp4_layouts.given_amax(args.global_amax, v.device)  # (with hadamard: the pair)
        if spec.hadamard:
            out.amax.copy_(fp4.global_amax(v) if given is None else given.reshape(2)[0])
            out.colwise_amax.copy_(fp4.global_amax(copies[-1][1]) if given is None else given.reshape(2)[1])
        else:
            out.amax.copy_(fp4.global_amax(v) if given is None else given.reshape(()))
    for d, (direction, w) in enumerate(copies, start=0 if spec.rowwise else 1):
        if spec.format == "mxfp4":
            data, s = fp4.quantize_mxfp4(w, spec.scale_mode)
        else:  # pass 2
            amax = out.colwise_amax if d and spec.hadamard else out.amax
            rand = None
            if spec.stochastic_rounding:
                rand = fp4.random_bytes(*w.shape, seed, offset, d, v.device)
            data, s = fp4.quantize_nvfp4(w, fp4.global_encode_scale(amax), spec.block[0], rand)
        getattr(out, f"{direction}_data").copy_(data.reshape(getattr(out, f"{direction}_data").shape))
        getattr(out, f"{direction}_scale").copy_(fp4_layouts.to_layout(s, spec.scale_layout))
