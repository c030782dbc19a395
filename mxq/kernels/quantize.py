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
  colwise blocks as their row tiles (grouped.py);
- NVFP4 (a per-tensor amax before any block is quantized, KernelConfig.global_passes): variant
  "vec" launches two aligned kernels (packed or vectorised) on the stream with no host sync,
  the amax pass (the op's values, their NaN-dropping amax into the amax slot) and the quantize
  pass (which reads it); variant "vec_given" the quantize pass alone, for a call whose amax is
  given (global_amax=, copied into the amax slot by the launcher).

Around the quantize kernel, ops with amax zero it first (reduce.amax_init_kernel) and ops with
dbias reduce the per-CTA partial sums afterwards (reduce.dbias_kernel, launched early with
programmatic dependent launch on sm_90+).

A Quantize is composed, not inherited: it holds the op's element functions (element.ElementOp)
and one kernel object per kernel, each holding the config and that op.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from .config import PDL_MAX_ROWS, ROWS, KernelConfig
from .element import ElementOp
from .generic import GenericKernel
from .generic import grid as generic_grid
from .packed import PackedKernel
from .packed import grid as packed_grid
from .reduce import amax_init_kernel, dbias_grid, dbias_groups_grid, dbias_groups_kernel, dbias_kernel
from .vectorized import VectorizedKernel
from .vectorized import grid as vec_grid

VARIANTS = ("vec", "generic", "rows8", "vec_given")


class Quantize:
    def __init__(self, cfg: KernelConfig, epilogue, act=None, dact=None):
        self.cfg = cfg
        self.op = ElementOp(cfg, epilogue, act, dact)
        self.packed = PackedKernel(cfg, self.op)
        self.vectorized = VectorizedKernel(cfg, self.op)
        self.generic = GenericKernel(cfg, self.op)
        passes = cfg.global_passes()
        self.passes = None if passes is None else tuple(Quantize(c, epilogue, act, dact) for c in passes)

    def launch(self, variant: str, ins: list, scalars: list, act_in, row_data, row_scale, col_data, col_scale,
               amax, dbias, dbias_ws, noop, group_ends, rng, use_hw_e8m0: bool, use_pdl: bool, stream):
        """Launch the op's kernels (called while a generated @cute.jit launcher traces).

        Slots the config does not use are None; ``ins`` and ``scalars`` are the epilogue's tensor
        and float parameters in order. M and N are the first input's (symbolic) shape.
        ``group_ends``: None, or a grouped call's int32 group ends (then the grid has
        grouped.row_tiles row tiles, dbias is [G, N] and dbias_ws at least a row per row tile). ``rng``: NVFP4's
        stochastic rounding's int64 [seed, offset] (the packed kernel reads it), else None."""
        cfg = self.cfg
        if self.passes is not None:  # NVFP4: the amax pass (unless the amax is given), then the quantize pass
            if variant not in ("vec", "vec_given"):  # (limits.fp4_unserved keeps such calls on the reference)
                raise NotImplementedError("mxq: NVFP4 is served by the aligned kernels alone (variant 'vec')")
            if variant == "vec":
                self.passes[0].launch("vec", ins, scalars, act_in, row_data, row_scale, col_data, col_scale, amax,
                                      dbias, dbias_ws, noop, group_ends, None, use_hw_e8m0, use_pdl, stream)
            self.passes[1].launch("vec", ins, scalars, act_in, row_data, row_scale, col_data, col_scale, amax, dbias,
                                  dbias_ws, noop, group_ends, rng, use_hw_e8m0, use_pdl, stream)
            return
        if cfg.fmt.rounding == "sr" and ins[0].element_type.width != 16 and (group_ends is not None or cfg.halves):
            raise NotImplementedError("mxq: stochastic rounding from fp32 inputs is served ungrouped, one output half")
        if cfg.fp4_tiles and ins[0].element_type.width != 16 and (group_ends is not None or cfg.halves):
            raise NotImplementedError("mxq: NVFP4's 16x16 tiles from fp32 inputs are served ungrouped, one output half")
        if cfg.fmt.hadamard and ins[0].element_type is not cutlass.BFloat16:  # (validation's rule)
            raise NotImplementedError("mxq: NVFP4's Hadamard transform takes bf16 inputs only")
        if cfg.fmt.packed and cfg.colwise and (
                cfg.tile_rows // (cfg.packed_warps() if ins[0].element_type.width == 16 else cfg.vec_warps) != 8):
            raise NotImplementedError("mxq: FP4's colwise copy is served by the packed and vectorised kernels' 8-row "
                                      "threads")
        if cfg.tile_rows != ROWS and not cfg.fp4_columns and (
                (cfg.transposed and variant != "vec") or (ins[0].element_type.width != 16 and (
                    variant != "vec"))):
            # (limits.fp8_block_unserved keeps such calls on the reference)
            raise NotImplementedError("mxq: colwise blocks of 128 rows, 128x128 tiles and the transposed copy are "
                                      "served by the packed kernel and, from fp32 inputs on aligned rows, the "
                                      "vectorised one; the transposed copy with aligned rows only")
        if cfg.fmt.packed and variant != "vec":  # (limits.fp4_unserved keeps such calls on the reference)
            raise NotImplementedError("mxq: FP4 outputs are served by the aligned kernels alone (variant 'vec')")
        M = ins[0].shape[0]
        N = ins[0].shape[1]
        G = None if group_ends is None else group_ends.shape[0]
        if cfg.amax and group_ends is not None and cfg.fmt.global_scale:  # (NVFP4's amax per group)
            amax_init_kernel(amax, noop, 0).launch(grid=[1, 1, 1], block=[256, 1, 1], stream=stream)
        elif cfg.amax:
            amax_init_kernel(amax, noop, 2 if cfg.fmt.hadamard else 1).launch(grid=[1, 1, 1], block=[32, 1, 1],
                                                                                stream=stream)
        NO = N  # the outputs' width: 2N for a two-halves op (mxq/gated.py)
        if cfg.halves:  # (FP4's rowwise data holds two values a byte; the transposed colwise copies are [NO, ...])
            if row_data is not None:
                NO = row_data.shape[1] * 2 if cfg.fmt.packed else row_data.shape[1]
            else:
                NO = col_data.shape[0 if cfg.transposed or cfg.fmt.packed else 1]
        args = (ins, scalars, act_in, row_data, row_scale, col_data, col_scale, amax, dbias_ws, noop, group_ends,
                M, N, NO, use_hw_e8m0)
        if ins[0].element_type.width == 16:
            twins = self.rows8_twins() if variant == "rows8" and G is None else None
            if twins is None:
                self.launch_packed(variant, args, M, N, G, use_pdl, stream, rng)
            else:
                # (a plain cast's rows8 kernel at the warps its input's row stride runs fastest with)
                self.launch_packed_by_parity(twins, ins[0].layout.stride[0], args, M, N, use_pdl, stream)
        elif variant == "vec" or (variant == "rows8" and cfg.vec_unaligned):
            grid, block = vec_grid(cfg, M, N, G)
            self.vectorized.vec_kernel(*args, variant == "rows8", rng).launch(grid=grid, block=block, stream=stream)
        else:
            if cfg.fmt.block[1] != 32:  # (limits.unserved keeps such calls on the reference)
                raise NotImplementedError(f"mxq: the element-wise kernel serves 1x32 blocks only, not {cfg.fmt.block}")
            grid, block = generic_grid(cfg, M, N, G)
            self.generic.generic_kernel(*args).launch(grid=grid, block=block, stream=stream)
        if cfg.dbias:
            grid, block = dbias_grid(NO, G)
            dargs = (dbias_ws, dbias, noop, group_ends, cute.ceil_div(M, cfg.tile_rows), M, NO)
            self.launch_dbias_by_rows(dargs, M, G, grid, block, use_pdl and cfg.pdl, stream)

    def launch_packed(self, variant: str, args, M, N, G, use_pdl: bool, stream, rng=None):
        """The packed kernel (16-bit inputs) of ``variant`` with this config's warps (``rng``:
        stochastic rounding's seed and offset, or None)."""
        cfg = self.cfg
        unaligned = variant != "vec"  # any N and alignment: rows through unaligned.py
        grid, block = packed_grid(cfg, M, N, G, unaligned)
        fp16 = args[0][0].element_type is cutlass.Float16
        cap = cfg.rows8_min_blocks if variant == "rows8" else cfg.packed_min_blocks(unaligned, G is not None, fp16)
        self.packed.packed_kernel(*args, use_pdl and cfg.pdl, unaligned, variant == "rows8", rng).launch(
            grid=grid, block=block, stream=stream, **register_cap(cap))

    def rows8_twins(self):
        """(kernels for an even, for an odd input row stride) of variant rows8 where the config
        picks its warps by that parity (KernelConfig.rows8_twins), else None."""
        cfgs = self.cfg.rows8_twins()
        return None if cfgs is None else tuple(Quantize(c, self.op.epilogue, self.op.act, self.op.dact) for c in cfgs)

    @cute.jit
    def launch_dbias_by_rows(self, args, M, G, grid, block, pdl: cutlass.Constexpr, stream):
        """dbias_kernel for calls of at most PDL_MAX_ROWS rows: loads into registers, launched
        early with programmatic dependent launch (``pdl``); above: staged through shared memory,
        launched after the quantize kernel (a branch of the host launcher). Launched early, the
        reduction's CTAs wait on the SMs the quantize kernel's last CTAs leave first, several to
        an SM: that saves a small call's launch gap and costs a long reduction its spread over
        the SMs. A grouped call (``G`` groups, one CTA per group and column tile) reduces each
        group's own rows: staged only where its groups average more than PDL_MAX_ROWS rows (many
        small groups would each copy and zero-fill a whole staged round); groups averaging at
        most Tuning.dbias_group_rows rows are reduced a warp per group (dbias_groups_kernel)."""
        R = cutlass.const_expr(self.cfg.tile_rows)  # (a grouped call's partial rows: its row tiles')
        if cutlass.const_expr(G is None):
            if M <= PDL_MAX_ROWS:
                dbias_kernel(*args, pdl, False).launch(grid=grid, block=block, stream=stream, use_pdl=pdl)
            else:
                dbias_kernel(*args, False, True).launch(grid=grid, block=block, stream=stream)
        elif cutlass.const_expr(self.cfg.dbias_group_rows > 0):
            if M <= self.cfg.dbias_group_rows * (R // 32) * G:  # (at most ROUND partial rows a group on average)
                ws, dbias, noop, ends, _, _, NO = args
                ggrid, gblock = dbias_groups_grid(NO, G)
                if M <= PDL_MAX_ROWS:
                    dbias_groups_kernel(ws, dbias, noop, ends, M, NO, pdl, R).launch(grid=ggrid, block=gblock,
                                                                                  stream=stream, use_pdl=pdl)
                else:
                    dbias_groups_kernel(ws, dbias, noop, ends, M, NO, False, R).launch(grid=ggrid, block=gblock,
                                                                                    stream=stream)
            else:
                self.launch_dbias_per_group(args, M, G, grid, block, pdl, stream)
        else:
            self.launch_dbias_per_group(args, M, G, grid, block, pdl, stream)

    @cute.jit
    def launch_dbias_per_group(self, args, M, G, grid, block, pdl: cutlass.Constexpr, stream):
        """A grouped dbias reduction by dbias_kernel, a CTA per group and column tile (see
        launch_dbias_by_rows; the partial rows are the quantize kernel's row tiles of tile_rows)."""
        R = cutlass.const_expr(self.cfg.tile_rows)
        if M <= PDL_MAX_ROWS:
            dbias_kernel(*args, pdl, False, R).launch(grid=grid, block=block, stream=stream, use_pdl=pdl)
        elif M <= PDL_MAX_ROWS * G:
            dbias_kernel(*args, False, False, R).launch(grid=grid, block=block, stream=stream)
        else:
            dbias_kernel(*args, False, True, R).launch(grid=grid, block=block, stream=stream)

    @cute.jit
    def launch_packed_by_parity(self, twins, stride, args, M, N, use_pdl: cutlass.Constexpr, stream):
        """Launch twins[stride % 2]'s rows8 kernel (a branch of the host launcher: one compiled
        function holds both kernels, the Python and C++ routes and op.export see one variant)."""
        if stride % 2 == 0:
            twins[0].launch_packed("rows8", args, M, N, None, use_pdl, stream)
        else:
            twins[1].launch_packed("rows8", args, M, N, None, use_pdl, stream)


def register_cap(ctas_per_sm: int) -> dict:
    """Launch options compiling a kernel for ``ctas_per_sm`` CTAs per SM (``min_blocks_per_mp``:
    ptxas caps its registers to fit); {} for 0. The shared-memory carveout is named (-1: the
    driver's default) so the DSL does not ask a device for the SM's shared memory size: the cap
    then compiles with no GPU present."""
    return {"min_blocks_per_mp": ctas_per_sm, "preferred_smem_carveout": -1} if ctas_per_sm else {}


__all__ = ["KernelConfig", "Quantize", "VARIANTS", "register_cap"]
