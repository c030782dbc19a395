"""Quantize: one op's kernels, specialised on its KernelConfig and element functions.

A generated module (templates/module.py.j2) builds one ``Quantize`` from its config and its
epilogue / act / dact functions (lowered from the op's IR into CuTeDSL), and its ``@cute.jit``
launchers (one per variant) call ``Quantize.launch`` while they trace:

- variant "vec": N % 8 == 0 and 16-byte aligned [M, N] tensors. 16-bit inputs run the packed
  kernel (packed.py), fp32 inputs the vectorised one (vectorized.py);
- variant "generic": any N and alignment. 16-bit inputs run the packed kernel with unaligned
  rows (unaligned.py), fp32 inputs the element-wise kernel (generic.py);
- variant "rows8": "generic" for FP8 output rows that start on 8-byte boundaries (an out= with
  padded rows, MXFP8Tensor.empty(row_align=...)): the unaligned rows store whole 8-byte units,
  with no realigning code compiled in (fp32: the vectorised kernel with rows staged as words
  or chunks, KernelConfig.vec_unaligned, else the element-wise one). A plain cast without
  dbias compiles its packed kernel at 8 and at 4 warps, and the launcher picks one by the
  parity of the input's row stride (KernelConfig.rows8_warps, ``launch_packed_by_parity``);
- with ``group_ends`` (a grouped call, group_offsets) the same kernels take the groups'
  colwise blocks as their row tiles (grouped.py).

Around the quantize kernel, ops with amax zero it first (reduce.amax_init_kernel) and ops with
dbias reduce the per-CTA partial sums afterwards (reduce.dbias_kernel, launched early with
programmatic dependent launch on sm_90+).

The methods after the launch helpers are the per-element pieces every kernel shares; they run
at trace time inside a kernel body and branch only on the config.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8

from . import device as dev
from . import grouped
from .config import PDL_MAX_ROWS, ROWS, KernelConfig
from .generic import GenericKernel
from .generic import grid as generic_grid
from .packed import PackedKernel
from .packed import grid as packed_grid
from .reduce import amax_init_kernel, dbias_grid, dbias_kernel
from .vectorized import VectorizedKernel
from .vectorized import grid as vec_grid

VARIANTS = ("vec", "generic", "rows8")


class Quantize(GenericKernel, VectorizedKernel, PackedKernel):
    def __init__(self, cfg: KernelConfig, epilogue, act=None, dact=None):
        if (act is not None) != cfg.has_act or (dact is not None) != cfg.has_dact:
            raise ValueError("mxq: Quantize needs an act (dact) function exactly when the config has one")
        self.cfg = cfg
        self.epilogue = epilogue
        self.act = act
        self.dact = dact

    def launch(self, variant: str, ins: list, scalars: list, act_in, row_data, row_scale, col_data, col_scale,
               amax, dbias, dbias_ws, noop, group_ends, use_hw_e8m0: bool, use_pdl: bool, stream):
        """Launch the op's kernels (called while a generated @cute.jit launcher traces).

        Slots the config does not use are None; ``ins`` and ``scalars`` are the epilogue's tensor
        and float parameters in order. M and N are the first input's (symbolic) shape.
        ``group_ends``: None, or a grouped call's int32 group ends (then the grid has
        grouped.row_tiles row tiles, dbias is [G, N] and dbias_ws [M // 32 + G, N])."""
        cfg = self.cfg
        M = ins[0].shape[0]
        N = ins[0].shape[1]
        G = None if group_ends is None else group_ends.shape[0]
        if cfg.amax:
            amax_init_kernel(amax, noop).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)
        NO = N  # the outputs' width: 2N for a two-halves op (mxq/gated.py)
        if cfg.halves:
            NO = (row_data if row_data is not None else col_data).shape[1]
        args = (ins, scalars, act_in, row_data, row_scale, col_data, col_scale, amax, dbias_ws, noop, group_ends,
                M, N, NO, use_hw_e8m0)
        if ins[0].element_type.width == 16:
            twins = self.rows8_twins() if variant == "rows8" and G is None else None
            if twins is None:
                self.launch_packed(variant, args, M, N, G, use_pdl, stream)
            else:
                # (a plain cast's rows8 kernel at the warps its input's row stride runs fastest with)
                self.launch_packed_by_parity(twins, ins[0].layout.stride[0], args, M, N, use_pdl, stream)
        elif variant == "vec" or (variant == "rows8" and cfg.vec_unaligned):
            grid, block = vec_grid(cfg, M, N, G)
            self.vec_kernel(*args, variant == "rows8").launch(grid=grid, block=block, stream=stream)
        else:
            grid, block = generic_grid(cfg, M, N, G)
            self.generic_kernel(*args).launch(grid=grid, block=block, stream=stream)
        if cfg.dbias:
            grid, block = dbias_grid(NO, G)
            dargs = (dbias_ws, dbias, noop, group_ends, cute.ceil_div(M, ROWS), M, NO)
            self.launch_dbias_by_rows(dargs, M, grid, block, use_pdl and cfg.pdl, stream)

    def launch_packed(self, variant: str, args, M, N, G, use_pdl: bool, stream):
        """The packed kernel (16-bit inputs) of ``variant`` with this config's warps."""
        cfg = self.cfg
        unaligned = variant != "vec"  # any N and alignment: rows through unaligned.py
        grid, block = packed_grid(cfg, M, N, G, unaligned)
        cap = cfg.tuning.rows8_min_blocks if variant == "rows8" else 0  # (a benchmark's register cap)
        self.packed_kernel(*args, use_pdl and cfg.pdl, unaligned, variant == "rows8").launch(
            grid=grid, block=block, stream=stream, **({"min_blocks_per_mp": cap} if cap else {}))

    def rows8_twins(self):
        """(kernels for an even, for an odd input row stride) of variant rows8 where the config
        picks its warps by that parity (KernelConfig.rows8_twins), else None."""
        cfgs = self.cfg.rows8_twins()
        return None if cfgs is None else tuple(Quantize(c, self.epilogue, self.act, self.dact) for c in cfgs)

    @cute.jit
    def launch_dbias_by_rows(self, args, M, grid, block, pdl: cutlass.Constexpr, stream):
        """dbias_kernel for calls of at most PDL_MAX_ROWS rows: loads into registers, launched
        early with programmatic dependent launch (``pdl``); above: staged through shared memory,
        launched after the quantize kernel (a branch of the host launcher). Launched early, the
        reduction's CTAs wait on the SMs the quantize kernel's last CTAs leave first, several to
        an SM: that saves a small call's launch gap and costs a long reduction its spread over
        the SMs (docs/performance.md, "the price of dbias")."""
        if M <= PDL_MAX_ROWS:
            dbias_kernel(*args, pdl, False).launch(grid=grid, block=block, stream=stream, use_pdl=pdl)
        else:
            dbias_kernel(*args, False, True).launch(grid=grid, block=block, stream=stream)

    @cute.jit
    def launch_packed_by_parity(self, twins, stride, args, M, N, use_pdl: cutlass.Constexpr, stream):
        """Launch twins[stride % 2]'s rows8 kernel (a branch of the host launcher: one compiled
        function holds both kernels, the Python and C++ routes and op.export see one variant)."""
        if stride % 2 == 0:
            twins[0].launch_packed("rows8", args, M, N, None, use_pdl, stream)
        else:
            twins[1].launch_packed("rows8", args, M, N, None, use_pdl, stream)

    # -- per-element pieces shared by the kernels -------------------------------------------
    def sources(self, ins, act_in) -> list:
        """The tensors read per element: the epilogue's inputs, then act_input (dact ops)."""
        return list(ins) + ([act_in] if self.cfg.has_dact else [])

    def value(self, srcs, k, scalars, load):
        """The value v that is quantized (NUMERICS steps 1-4): the epilogue of the inputs, then
        act(v), or v * dact(act_input). ``load(src, k)`` reads element k of a source as fp32."""
        cfg = self.cfg
        v = self.epilogue(*[load(srcs[t], k) for t in range(cfg.n_inputs)], *scalars)
        if cfg.has_act:
            v = self.act(v)
        if cfg.has_dact:
            a = load(srcs[cfg.n_inputs], k)
            v = dev.mul_rn(v, self.dact(a))
        return v

    def round_to_input(self, v, dtype):
        """NUMERICS step 5: a computed value is rounded to the input format (16-bit inputs)."""
        if self.cfg.computed and dtype is not Float32:
            return v.to(dtype).to(Float32)
        return v

    def dbias_zero(self, dbias_ws):
        """A partial dbias sum's start, in the workspace's precision (None without dbias)."""
        return dbias_ws.element_type(0.0) if self.cfg.dbias else None

    def dbias_add(self, dsum, v, dbias_ws):
        return dsum + v.to(dbias_ws.element_type) if self.cfg.dbias else dsum

    def store_row_scale(self, row_scale, offset, e):
        dev.store_row_scale(row_scale, offset, e, self.cfg.tuning.row_scale_l2_keep)

    def output_half(self, cb, N, NO, tile_cols: int, scalars, divby: int = 1, passes: int = 1):
        """(column tile, output column offset, output width, scalars) of grid column index cb.
        A two-halves op (KernelConfig.halves, mxq/gated.py) has every input column tile twice in
        its grid: the second copy writes half 1, at column offset N of the NO = 2N wide outputs,
        and passes HALF = 1 to its epilogue. ``divby``: what N is known to be a multiple of.
        ``passes`` 2 (the packed kernel's KernelConfig.halves_passes): the grid is not doubled
        and the kernel writes both halves itself (pass_half)."""
        if not self.cfg.halves:
            return cb, 0, N, scalars
        if passes == 2:
            return cb, 0, NO, scalars
        ncb = (N + tile_cols - 1) // tile_cols
        h = Int32(cutlass.select_(cb >= ncb, Int32(1), Int32(0)))
        co = cute.assume(h * N, divby=divby) if divby > 1 else h * N
        return cb - h * ncb, co, NO, list(scalars) + [h.to(Float32)]

    def pass_half(self, h: int, N, scalars, divby: int = 1):
        """(output column offset, scalars) of pass h of a kernel writing both halves itself."""
        co = cute.assume(Int32(h) * N, divby=divby) if divby > 1 else Int32(h) * N
        return co, list(scalars) + [Float32(float(h))]

    def out_window(self, t, co):
        """Output tensor ``t`` from column ``co`` on (two-halves ops; else ``t`` itself)."""
        return cute.domain_offset((0, co), t) if self.cfg.halves and t is not None else t

    def thread_tile(self, t, shape, tile_row, row0, col_tile, grouped: bool, step: int = 1):
        """A thread's ``shape`` tile of [M, N] tensor ``t``: tile (tile_row, col_tile), or for a
        grouped call the tile whose first row is ``row0`` (any row: blocks start at groups); with
        ``step`` > 1, rows row0, row0 + step, ... (the packed kernel's unaligned rows)."""
        if step != 1:
            at = cute.domain_offset((row0, col_tile * shape[1]), t)
            return cute.make_tensor(at.iterator, cute.make_layout(
                shape, stride=(at.layout.stride[0] * step, at.layout.stride[1])))
        if grouped:
            return cute.local_tile(cute.domain_offset((row0, 0), t), shape, (0, col_tile))
        return cute.local_tile(t, shape, (tile_row, col_tile))

    def group_row_scale_offset(self, gt, r, blk, nbr):
        """Offset of row r's scale byte of block blk in a grouped call's rowwise scales: compact
        scales do not depend on the groups; swizzled ones are blocked per group (grouped.py)."""
        if self.cfg.fmt.swizzled:
            return grouped.row_swizzled_offset(gt.row_sw, r - gt.row0, blk)
        return r * nbr + blk

    def put_col_scale(self, col_scale, gt, c, rb, M, NOUT, e):
        """Column c's scale byte of row tile rb (``gt``: a grouped call's GroupTile, else None)."""
        if gt is not None and self.cfg.fmt.swizzled:
            col_scale[self.group_col_scale_offset(gt, c)] = Uint8(e)
        elif gt is None and self.cfg.fmt.swizzled:
            col_scale[dev.swizzle_offset(c, rb, (M + 31) // 32)] = Uint8(e)
        else:
            col_scale[rb * NOUT + c] = Uint8(e)

    def group_col_scale_offset(self, gt, c):
        """Offset of column c's scale byte of a grouped tile in the swizzled colwise scales."""
        return grouped.col_swizzled_offset(gt.col_sw, gt.col_t512, c)


__all__ = ["KernelConfig", "Quantize", "VARIANTS"]
