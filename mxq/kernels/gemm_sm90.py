"""The Hopper (sm_90a) GEMM: D = A @ W^T, the mainloop the fused epilogue (the user's op, then
quantize: gemm_quant.py) runs behind.

A is [M, K], W is [N, K] (both K-major, bf16 or fp16), D is [M, N] in the input dtype; the
accumulator is fp32 on wgmma. Built from nvidia-cutlass-dsl's pieces (TMA atoms, the
cutlass.pipeline TMA pipeline's mbarriers, the warpgroup MMA, the static persistent tile
scheduler); see docs/DESIGN.md "The sm_90 GEMM".

- CTA tile 128 x 256 x 64 (TILE): two consumer warpgroups each own a 64 x 256 half (128 fp32
  accumulator registers per thread), one producer warpgroup issues the TMA loads. 128 x 256 reads
  a 48 KiB stage for 2 x 128 x 256 x 64 flops, half the shared-memory bytes per flop of 128 x 128,
  and four stages (192 KiB) fit the 227 KiB of an H100/H200 CTA.
- Persistent: the grid is min(tiles, SMs) CTAs (with clusters: the M tile count padded to a
  multiple of cluster_m, and SMs // cluster_m clusters, which assumes that many fit at once: a
  GPU shared with other work runs the rest later); each CTA walks output tiles in the
  scheduler's order, the producer running ahead into the next tile's stages while the
  consumers write the last one.
- ``cluster_m``: CTAs in clusters of that many along M, which the scheduler gives tiles of one
  N column (in ping-pong each warpgroup's tiles pair with the peer warpgroup's of the other
  CTA); each loads 1/cluster_m of the stage's W tile and multicasts it to the cluster (TMA
  multicast), so W leaves L2 once per cluster instead of once per CTA. Each consumer warp
  releases a stage on every CTA of its cluster (the empty barrier counts all of them: a peer's
  multicast may overwrite the stage only when both CTAs are done with it). At 8192x14336x4096
  the unclustered kernels read 10.6 GB (cooperative) and 18.2 GB (ping-pong) from L2 against
  cuBLAS's 6.1 GB (docs/performance.md).
- ``pingpong`` (CUTLASS's KernelTmaWarpSpecializedPingpong): each consumer warpgroup owns a whole
  64 x 256 output tile (``pp_tile``, the same 128 accumulators a thread; or 128 x 128, two wgmma
  rows, 128 x 192, or 192 x 128, three wgmma rows whose 128 columns hold a 1x128 block:
  PINGPONG_TILES) and the two take
  alternate tiles of the CTA's schedule (warpgroup w its tiles j = w, w + 2, ...). An ordered
  barrier pair (two named barriers, ``ordered_barrier_ids``) makes their mainloops alternate: a
  warpgroup waits on its own barrier before its first wgmma of a tile and arrives on the other's
  once its last K tile's wgmmas are issued, so one warpgroup's epilogue (the op, block amax,
  cast, stores) runs while the other's wgmmas fill the tensor cores. The producer still loads
  every tile of the CTA in schedule order into one pipeline whose stages each warpgroup consumes
  for its own tiles alone (a stage's empty barrier counts one warpgroup's 4 warps); warpgroup 1
  starts k_tiles stages in and each warpgroup skips the other's k_tiles stages per tile. A
  64 x 256 x 64 stage is 40 KiB: five stages (200 KiB) fit.
- Edges: TMA fills out-of-bounds rows and columns of A and W with zeros (M, N, K at any size that
  TMA can describe: K and N multiples of 8 for 16-byte rows), and the epilogue predicates its
  stores on the tile coordinates, so partial tiles at the M and N edges are exact.
- ``epilogue`` is the seam: it receives the accumulator fragment and its tile coordinates and
  writes D (and, with the ``acc_hook`` test option, the fp32 accumulator too). With ``fused``
  (a gemm_quant.GemmQuant: ``op.gemm``) it writes the op's FP8 data and scales instead of D,
  launched by ``run_fused`` from a rendered module's ``launch_gemm`` (templates/module.py.j2).
- ``stage_rows`` (the fused epilogue's rowwise FP8 data, N % 16 == 0): each thread puts its FP8
  pairs into a swizzled shared-memory copy of its tile (gemm_quant.stage_offset; one per
  warpgroup in ping-pong) instead of storing 2 bytes at a time to global memory, and one thread
  stores the tile by TMA (a box per 128- or 64-byte column subtile, rows and columns past M and N
  left out by the TMA unit), asynchronously: the warpgroups go on to their next mainloop while it
  drains, and the tile's next use waits only for the TMA unit to have read it. Its shared memory
  comes out of the stages (stages_that_fit).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32

from . import gemm_quant, reduce
from .config import SMEM_LIMIT

TILE = (128, 256, 64)  # CTA tile (M, N, K) of the cooperative form
STAGES = 4  # its shared-memory stages of A and W tiles (4 x 48 KiB)
# the ping-pong form's tiles (M, N; one consumer warpgroup's, K as TILE's) -> their stages: 5 x 40 KiB,
# 6 x 32 KiB, 5 x 40 KiB, 5 x 40 KiB (the first is GemmSm90's default)
PINGPONG_TILES = {(64, 256): 5, (128, 128): 6, (128, 192): 5, (192, 128): 5}
WG_ROWS = 64  # rows of one wgmma (m64): the fused epilogue's part of a tile (gemm_quant's layout)
THREADS_PER_WG = 128
CONSUMER_WGS = 2  # cooperative: each owns 64 rows of the 128-row tile; ping-pong: alternate tiles
PRODUCER_REGS, CONSUMER_REGS = 40, 232  # setmaxnreg: 128 x 40 + 256 x 232 <= 64 Ki registers
ORDER_BARRIER = 1  # ping-pong: named barriers ORDER_BARRIER + w (0 is __syncthreads')
XCH_SLOTS = 8  # the colwise exchange's fp32 values per lane (gemm_quant.GemmQuant.colwise_write)
STAGE_BARRIER = 5  # stage_rows: named barrier STAGE_BARRIER (+ the warpgroup in ping-pong) of a staged tile's threads
BAR_ALIGN = 1024  # shared memory: the barriers, then each 1024-byte aligned swizzled buffer (A, W, the staged tile)


def stages_that_fit(stages: int, tile: tuple, bufs: int, colwise: bool, stage_rows: bool, elem_bytes: int = 2) -> int:
    """The most pipeline stages up to ``stages`` whose shared memory fits a CTA (SMEM_LIMIT) beside
    the staged FP8 tiles (``stage_rows``: ``bufs`` tiles of tile[0] x tile[1] bytes) and the
    colwise exchange (``colwise``): GemmSm90's allocation order, each buffer aligned as it asks."""
    def total(k):
        used = BAR_ALIGN + k * (tile[0] + tile[1]) * tile[2] * elem_bytes  # (barriers padded, A and W stages)
        if stage_rows:
            used += bufs * tile[0] * tile[1]
        if colwise:
            used += CONSUMER_WGS * THREADS_PER_WG // 32 * XCH_SLOTS * 32 * 4
        return used

    while stages > 2 and total(stages) > SMEM_LIMIT:
        stages -= 1
    if total(stages) > SMEM_LIMIT:
        raise ValueError(f"mxq: GemmSm90: a {tile} tile does not fit shared memory with two stages")
    return stages


def check_stage_layout(layout, rows: int, width: int, subs: int) -> None:
    """Trace-time check that the staged tile's shared-memory layout (hopper_helpers'
    make_smem_layout_epi of Uint8 rows ``width`` bytes wide) places every sampled byte where
    gemm_quant.stage_offset (the kernel's own address arithmetic) does."""
    for r in (0, 1, 2, 3, 5, 7, 8, 9, 17, rows - 1):
        for c in (0, 2, 6, 8, 14, 16, 30, 46, width - 2):
            for s in range(subs):
                got, want = layout((r, c, s)), gemm_quant.stage_offset(r, c + s * width, rows, width)
                if got != want:
                    raise AssertionError(f"mxq: staged byte ({r}, {c}) of subtile {s} lies at {got}, not {want}: "
                                         "gemm_quant.stage_offset does not match the TMA store's layout")


def ordered_barrier_ids(wg):
    """(the barrier warpgroup ``wg`` (0 or 1) waits on before its mainloop, the one it arrives on
    once its wgmmas are issued): its own, then the other's. Python ints or Int32."""
    return ORDER_BARRIER + wg, ORDER_BARRIER + 1 - wg


class GemmSm90:
    """D = A @ W^T on sm_90a for one input dtype. ``acc_hook``: the epilogue also writes the fp32
    accumulator (a test hook: the numerics of the mainloop alone). ``num_sms``: the persistent
    grid's width (the device's SM count). ``swizzle``: the scheduler walks groups of this many N
    tiles down M (1: plain M-fastest order; > 1 pads the N tile count to a multiple, and the
    padding tiles store nothing). ``fused``: the op's epilogue and quantize (gemm_quant.GemmQuant)
    in place of D. ``pingpong``: each consumer warpgroup a whole 64 x 256 tile, the two
    alternating (module docstring); else both cooperate on a 128 x 256 tile. ``cluster_m``: CTAs
    per cluster along M sharing each W stage by TMA multicast (module docstring). ``swizzle`` < 0:
    bands of -swizzle clusters of M tiles moving along N instead (raster along N: W read once per
    band, A once). ``pp_tile``: the ping-pong form's tile (M, N), one of PINGPONG_TILES (a
    warpgroup's 64, 128 or 192 rows are one, two or three m64 wgmma rows, which the fused epilogue
    writes one at a time).
    ``stage_rows``: the fused epilogue's rowwise FP8 data through shared memory and TMA stores
    (module docstring; the op must write the rowwise copy, and N be a multiple of 16)."""

    def __init__(self, acc_hook: bool = False, num_sms: int = 132, swizzle: int = 1, fused=None,
                 pingpong: bool = False, cluster_m: int = 1, pp_tile: tuple | None = None, stage_rows: bool = False):
        if cluster_m not in (1, 2):
            raise ValueError(f"mxq: GemmSm90: cluster_m must be 1 or 2, got {cluster_m}")
        if swizzle == 0:
            raise ValueError("mxq: GemmSm90: swizzle must be a nonzero int (< 0: bands along N)")
        pp_tile = next(iter(PINGPONG_TILES)) if pp_tile is None else tuple(pp_tile)
        if pp_tile not in PINGPONG_TILES:
            raise ValueError(f"mxq: GemmSm90: pp_tile must be one of {sorted(PINGPONG_TILES)}, got {pp_tile}")
        tile_n = pp_tile[1] if pingpong else TILE[1]
        if fused is not None and tile_n % fused.cfg.fmt.block[1]:
            raise ValueError(f"mxq: GemmSm90: a tile of {tile_n} columns holds no whole rowwise blocks of "
                             f"{fused.cfg.fmt.block[1]} (the fused epilogue reduces a row's block inside its tile)")
        if fused is not None and pingpong and gemm_quant.colwise_rows(fused.cfg) > WG_ROWS:
            raise ValueError(f"mxq: GemmSm90: colwise blocks of {gemm_quant.colwise_rows(fused.cfg)} rows need the "
                             f"cooperative form's {TILE[0]}-row tile, not ping-pong's parts of {WG_ROWS} rows")
        if stage_rows and (fused is None or not fused.cfg.rowwise):
            raise ValueError("mxq: GemmSm90: stage_rows stages the fused epilogue's rowwise FP8 data: an op that "
                             "writes the rowwise copy")
        self.cluster_m = cluster_m
        self.acc_hook = acc_hook
        self.stage_rows = stage_rows
        self.fused = fused
        self.num_sms = num_sms
        self.swizzle = swizzle
        self.pingpong = pingpong
        self.tile = (*pp_tile, TILE[2]) if pingpong else TILE
        self.tile_mn = self.tile[:2]  # (an output tile)
        self.mma_wgs = 1 if pingpong else CONSUMER_WGS  # warpgroups on one tile (and one stage)
        # stage_rows: one staged tile per warpgroup in ping-pong (each writes its own tiles), one per CTA
        # cooperative, stored in subtiles of stage_width bytes (a whole number of TMA's swizzled rows)
        self.stage_bufs = CONSUMER_WGS // self.mma_wgs
        self.stage_width = gemm_quant.STAGE_WIDTHS[0] if tile_n % gemm_quant.STAGE_WIDTHS[0] == 0 else \
            gemm_quant.STAGE_WIDTHS[1]
        self.stage_subs = tile_n // self.stage_width
        self.stages = stages_that_fit(PINGPONG_TILES[pp_tile] if pingpong else STAGES, self.tile, self.stage_bufs,
                                      fused is not None and fused.cfg.colwise, stage_rows)
        # (the fused epilogue's part of a tile: the tile's rows of one wgmma row per warpgroup; a ping-pong
        # tile of 128 rows is two parts, the accumulator fragment's two M modes)
        self.part_mn = (WG_ROWS * self.mma_wgs, self.tile[1])
        self.parts = self.tile[0] // self.part_mn[0]
        self.threads = THREADS_PER_WG * (1 + CONSUMER_WGS)

    def setup(self, dtype):
        """The tiled MMA, the staged shared-memory layouts and the bytes one stage receives."""
        self.dtype = dtype
        k_major = utils.LayoutEnum.ROW_MAJOR  # A [M, K] and W [N, K] both have K innermost
        self.tiled_mma = sm90.make_trivial_tiled_mma(
            dtype, dtype, k_major.sm90_mma_major_mode(), k_major.sm90_mma_major_mode(), Float32,
            (self.mma_wgs, 1, 1), tiler_mn=(64, self.tile[1]))
        self.a_layout = sm90.make_smem_layout_a(k_major, self.tile, dtype, self.stages)
        self.w_layout = sm90.make_smem_layout_b(k_major, self.tile, dtype, self.stages)
        self.stage_bytes = (self.tile[0] + self.tile[1]) * self.tile[2] * dtype.width // 8
        self.o_layout = None
        if self.stage_rows:  # (subtiles [rows, stage_width] of FP8 bytes, stage_subs a tile, stage_bufs tiles)
            self.o_layout = sm90.make_smem_layout_epi(cutlass.Uint8, utils.LayoutEnum.ROW_MAJOR,
                                                      (self.tile[0], self.stage_width),
                                                      self.stage_subs * self.stage_bufs)
            check_stage_layout(self.o_layout, self.tile[0], self.stage_width, self.stage_subs * self.stage_bufs)

    @cute.jit
    def launch(self, mA: cute.Tensor, mW: cute.Tensor, mD: cute.Tensor, stream):
        """D = A @ W^T."""
        self.run(mA, mW, mD, mD, stream)

    @cute.jit
    def launch_acc(self, mA: cute.Tensor, mW: cute.Tensor, mD: cute.Tensor, mAcc: cute.Tensor, stream):
        """D = A @ W^T, and the fp32 accumulator into ``mAcc`` (the acc_hook variant)."""
        self.run(mA, mW, mD, mAcc, stream)

    def run_fused(self, mA, mW, row_data, row_scale, amax, ins: list, scalars: list, mAcc, stream, dbias=None,
                  dbias_ws=None, noop=None, col_data=None, col_scale=None):
        """The fused GEMM (``fused`` set): the op's FP8 data [M, N] and scales from A @ W^T (a
        colwise-only op's launcher passes its colwise data as ``row_data``, which then gives the
        shape alone), its amax into ``amax`` (fp32 [1], zeroed by the caller; unused unless the
        op has amax), the op's other tensors ``ins`` as [M, N] views and its floats ``scalars``;
        ``mAcc``: the fp32 accumulator (acc_hook), else any tensor (unused). With the op's dbias:
        ``dbias`` [N] (a's dtype), ``dbias_ws`` fp32 [ceil(M / 16), N] for the epilogue's partial
        sums (one row per 16-row warp stripe, gemm_quant.GemmQuant.columns) and the zero
        ``noop`` the reduction kernel reads. With its colwise copy: ``col_data`` ([M, N], or the
        transposed [N, M]) and its flat ``col_scale``. Traced by a module's launch_gemm."""
        self.run(mA, mW, row_data, mAcc, stream, row_scale, ins, scalars, amax, dbias, dbias_ws, noop, col_data,
                 col_scale)

    def run(self, mA, mW, mD, mAcc, stream, row_scale=None, ins=(), scalars=(), amax=None, dbias=None, dbias_ws=None,
            noop=None, col_data=None, col_scale=None):
        """Traced by every launcher: TMA descriptors, the tile scheduler, the launch."""
        self.setup(mA.element_type)
        if cutlass.const_expr(self.fused is not None):
            gemm_quant.check_layout(self.tiled_mma, self.part_mn, self.mma_wgs)
            if cutlass.const_expr(self.parts > 1):
                gemm_quant.check_parts(self.tiled_mma, self.tile_mn, self.part_mn)
        op = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA = cute.nvgpu.cpasync.make_tiled_tma_atom(
            op, mA, cute.slice_(self.a_layout, (None, None, 0)), (self.tile[0], self.tile[2]))
        w_op = cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cutlass.const_expr(self.cluster_m > 1) else op
        tma_w, gW = cute.nvgpu.cpasync.make_tiled_tma_atom(
            w_op, mW, cute.slice_(self.w_layout, (None, None, 0)), (self.tile[1], self.tile[2]),
            num_multicast=self.cluster_m)
        tma_o, gO = None, None
        if cutlass.const_expr(self.stage_rows):  # (the FP8 data's TMA store, a box per subtile)
            tma_o, gO = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mD, cute.slice_(self.o_layout, (None, None, 0)),
                (self.tile[0], self.stage_width))
        tiles = cute.zipped_divide(mD, self.tile_mn)[(0, (None, None))].shape
        sched = utils.PersistentTileSchedulerParams((*tiles, 1), (self.cluster_m, 1, 1), abs(self.swizzle),
                                                    self.swizzle > 0)
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.num_sms // self.cluster_m)
        kernel = self.kernel(tma_a, gA, tma_w, gW, mD, mAcc, self.tiled_mma, self.a_layout, self.w_layout, sched,
                             row_scale, amax, dbias_ws, list(ins), list(scalars), col_data, col_scale, tma_o, gO,
                             self.o_layout)
        if cutlass.const_expr(self.cluster_m > 1):
            kernel.launch(grid=grid, block=[self.threads, 1, 1], cluster=[self.cluster_m, 1, 1], min_blocks_per_mp=1,
                          stream=stream)
        else:
            kernel.launch(grid=grid, block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream)
        if cutlass.const_expr(self.fused is not None and self.fused.cfg.dbias):
            # dbias[c] = the partial rows' sum, in fp64 in a fixed order (the quantize kernels' reduction)
            rgrid, rblock = reduce.dbias_grid(mD.shape[1])
            reduce.dbias_kernel(dbias_ws, dbias, noop, None, dbias_ws.shape[0], mD.shape[0], mD.shape[1], False,
                                True).launch(grid=rgrid, block=rblock, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, gA_full: cute.Tensor, tma_w: cute.CopyAtom, gW_full: cute.Tensor,
               mD: cute.Tensor, mAcc: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               w_layout: cute.ComposedLayout, sched: utils.PersistentTileSchedulerParams, row_scale, amax,
               dbias_ws, ins: list, scalars: list, col_data, col_scale, tma_o, gO, o_layout):
        """One persistent CTA: warpgroup 0 loads, warpgroups 1 and 2 multiply and write (a tile
        together, or with ``pingpong`` alternate tiles). With the op's colwise copy, an fp32
        exchange [consumer warps, 8, 32] in shared memory (gemm_quant.GemmQuant.colwise_write);
        with ``stage_rows``, the staged FP8 tiles (``o_layout``; ``tma_o``, ``gO``: their TMA store)."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_w)
        smem = cutlass.utils.SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, 2 * self.stages)
        sA = smem.allocate_tensor(self.dtype, a_layout.outer, byte_alignment=1024, swizzle=a_layout.inner)
        sW = smem.allocate_tensor(self.dtype, w_layout.outer, byte_alignment=1024, swizzle=w_layout.inner)
        xch = None
        if cutlass.const_expr(self.fused is not None and self.fused.cfg.colwise):
            warps = CONSUMER_WGS * THREADS_PER_WG // 32  # ([warp, slot, lane], lane fastest: no bank conflict)
            xch = smem.allocate_tensor(Float32, cute.make_layout((warps, XCH_SLOTS, 32), stride=(XCH_SLOTS * 32, 32, 1)),
                                       byte_alignment=16)
        staged = None
        if cutlass.const_expr(self.stage_rows):
            sO = smem.allocate_tensor(cutlass.Uint8, o_layout.outer, byte_alignment=BAR_ALIGN, swizzle=o_layout.inner)
            staged = (tma_o, gO, sO)
        # (a stage is empty once every consumer warp of the cluster released it: lane r of each
        # warp arrives on CTA r's barrier, PipelineTmaAsync's signalling; create() syncs the cluster)
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=bars, num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mma_wgs * 4 * self.cluster_m),
            tx_count=self.stage_bytes, cta_layout_vmnk=cute.make_layout((1, self.cluster_m, 1, 1)))
        wg = cute.arch.make_warp_uniform(tidx // THREADS_PER_WG)
        if wg == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.produce(pipe, tma_a, gA_full, sA, tma_w, gW_full, sW, sched)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.consume(pipe, tiled_mma, sA, sW, mD, mAcc, sched, tidx - THREADS_PER_WG, gA_full,
                         (row_scale, ins, scalars, amax, dbias_ws, col_data, col_scale, xch, staged))

    @cute.jit
    def produce(self, pipe, tma_a, gA_full, sA, tma_w, gW_full, sW, sched):
        """The producer warp: for each of the CTA's tiles, every K tile of A and W into the next
        free stage (with ``cluster_m``: this CTA's slice of W, multicast to the cluster)."""
        gA = cute.local_tile(gA_full, (self.tile[0], self.tile[2]), (None, None))  # (bM, bK, tiles M, tiles K)
        gW = cute.local_tile(gW_full, (self.tile[1], self.tile[2]), (None, None))
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        cluster = cute.make_layout((self.cluster_m, 1, 1))
        rank = 0
        w_mask = None
        if cutlass.const_expr(self.cluster_m > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            w_mask = cute.make_layout_image_mask(cluster, cluster.get_flat_coord(rank), mode=0)
        tWsW, tWgW = cute.nvgpu.cpasync.tma_partition(
            tma_w, rank, cute.make_layout(self.cluster_m), cute.group_modes(sW, 0, 2), cute.group_modes(gW, 0, 2))
        k_tiles = cute.size(gA, mode=[3])
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
        work = tiles.initial_work_tile_info()
        while work.is_valid_tile:
            tm, tn = work.tile_idx[0], work.tile_idx[1]
            for k in range(k_tiles):
                pipe.producer_acquire(state)
                bar = pipe.producer_get_barrier(state)
                cute.copy(tma_a, tAgA[(None, tm, k)], tAsA[(None, state.index)], tma_bar_ptr=bar)
                if cutlass.const_expr(self.cluster_m > 1):
                    cute.copy(tma_w, tWgW[(None, tn, k)], tWsW[(None, state.index)], tma_bar_ptr=bar, mcast_mask=w_mask)
                else:
                    cute.copy(tma_w, tWgW[(None, tn, k)], tWsW[(None, state.index)], tma_bar_ptr=bar)
                pipe.producer_commit(state)
                state.advance()
            tiles.advance_to_next_work()
            work = tiles.get_current_work()
        pipe.producer_tail(state)

    @cute.jit
    def consume(self, pipe, tiled_mma, sA, sW, mD, mAcc, sched, ctid, gA_full, fused_args):
        """The consumer warpgroups: the K loop on wgmma for each tile, then ``epilogue`` (or,
        with ``fused``, the op's: ``fused_args`` are its row_scale, ins, scalars, amax, dbias_ws,
        col_data, col_scale and the colwise exchange). With
        ``pingpong`` warpgroup w takes the CTA's tiles w, w + 2, ... (its read state starts w
        tiles' stages in and skips the other's after each), its mainloop ordered after the
        other's by the barrier pair (warpgroup 0 opens its own barrier once to start)."""
        wg = cute.arch.make_warp_uniform(ctid // THREADS_PER_WG)
        if cutlass.const_expr(self.pingpong):
            ctid = ctid % THREADS_PER_WG
        thr_mma = tiled_mma.get_slice(ctid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrW = tiled_mma.make_fragment_B(thr_mma.partition_B(sW))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(cute.local_tile(mD, self.tile_mn, (0, 0))).shape, Float32)
        k_tiles = (gA_full.shape[1] + self.tile[2] - 1) // self.tile[2]
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tiles = utils.StaticPersistentTileScheduler.create(sched, cute.arch.block_idx(), cute.arch.grid_dim())
        work = tiles.initial_work_tile_info()
        wait_id, signal_id = ordered_barrier_ids(wg)
        if cutlass.const_expr(self.pingpong):
            if wg == 0:
                cute.arch.barrier_arrive(barrier_id=wait_id, number_of_threads=2 * THREADS_PER_WG)
            read.advance(k_tiles * wg)  # (branch-free: warpgroup 1 starts one tile in)
            tiles.advance_to_next_work(advance_count=wg)
            work = tiles.get_current_work()
        while work.is_valid_tile:
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier(barrier_id=wait_id, number_of_threads=2 * THREADS_PER_WG)
            read = self.mainloop(pipe, read, tiled_mma, tCrA, tCrW, acc, k_tiles, signal_id)
            if cutlass.const_expr(self.fused is None):
                self.epilogue(acc, work.tile_idx[0], work.tile_idx[1], thr_mma, mD, mAcc)
            else:
                self.fused_epilogue(acc, work.tile_idx[0], work.tile_idx[1], thr_mma, ctid, wg, mD, mAcc, fused_args)
            if cutlass.const_expr(self.pingpong):
                read.advance(k_tiles)  # (the other warpgroup's tile)
                tiles.advance_to_next_work(advance_count=CONSUMER_WGS)
            else:
                tiles.advance_to_next_work()
            work = tiles.get_current_work()
        if cutlass.const_expr(self.stage_rows):  # (the last tile's TMA store has read its shared memory)
            if ctid < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def mainloop(self, pipe, read, tiled_mma, tCrA, tCrW, acc, k_tiles, signal_id):
        """acc = the tile's A @ W^T over every K tile (K > 0): the first K tile's wgmmas overwrite
        acc, each later one waits for its stage, issues its wgmmas, and keeps them in flight while
        it releases the stage before it. With ``pingpong``, once the last wgmmas are issued it
        arrives on the other warpgroup's barrier ``signal_id`` (its mainloop may start). Returns
        the advanced read state."""
        release = read.clone()
        self.k_tile(pipe, read, tiled_mma, tCrA, tCrW, acc, False)
        read.advance()
        for _ in cutlass.range(k_tiles - 1, unroll=1):
            self.k_tile(pipe, read, tiled_mma, tCrA, tCrW, acc, True)
            cute.nvgpu.warpgroup.wait_group(1)
            pipe.consumer_release(release)
            release.advance()
            read.advance()
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(barrier_id=signal_id, number_of_threads=2 * THREADS_PER_WG)
        cute.nvgpu.warpgroup.wait_group(0)
        pipe.consumer_release(release)
        return read

    @cute.jit
    def k_tile(self, pipe, read, tiled_mma, tCrA, tCrW, acc, accumulate: cutlass.Constexpr):
        """Wait for the stage of ``read`` and issue its wgmmas (``accumulate``: onto acc, else
        the first overwrites it), committed as one group."""
        pipe.consumer_wait(read)
        cute.nvgpu.warpgroup.fence()
        mma = cute.make_mma_atom(tiled_mma.op)  # (a fresh atom: its ACCUMULATE flag is set here)
        mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, accumulate)
        for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(mma, acc, tCrA[(None, None, kb, read.index)], tCrW[(None, None, kb, read.index)], acc)
            mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def epilogue(self, acc: cute.Tensor, tile_m: Int32, tile_n: Int32, thr_mma, mD: cute.Tensor, mAcc: cute.Tensor):
        """The seam: this thread's accumulator fragment of output tile (tile_m, tile_n) -> D (the
        input dtype), and with ``acc_hook`` the fp32 accumulator too. A full tile stores whole
        fragments; an edge tile stores the column pairs inside [M, N] (``store_edge``)."""
        gD = cute.local_tile(mD, self.tile_mn, (tile_m, tile_n))
        tDgD = thr_mma.partition_C(gD)
        out = cute.make_rmem_tensor(acc.shape, mD.element_type)
        out.store(acc.load().to(mD.element_type))
        full_m = cutlass.Boolean((tile_m + 1) * self.tile[0] <= mD.shape[0])
        if full_m & ((tile_n + 1) * self.tile[1] <= mD.shape[1]):
            cute.autovec_copy(out, tDgD)
            if cutlass.const_expr(self.acc_hook):
                cute.autovec_copy(acc, thr_mma.partition_C(cute.local_tile(mAcc, self.tile_mn, (tile_m, tile_n))))
        else:
            self.store_edge(acc, out, tile_m, tile_n, thr_mma, mD, mAcc)

    @cute.jit
    def store_edge(self, acc, out, tile_m, tile_n, thr_mma, mD, mAcc):
        """An edge tile's stores: each pair of adjacent columns (one 32-bit bf16 pair of D) stored
        when it lies inside [M, N]; N % 8 == 0, so a pair never straddles N. ``mD`` None: the
        accumulator pairs alone (the fused epilogue's hook; ``mAcc`` has D's shape either way)."""
        shape = mAcc.shape if cutlass.const_expr(mD is None) else mD.shape
        coords = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(shape), self.tile_mn,
                                                     (tile_m, tile_n)))
        tAgA = thr_mma.partition_C(cute.local_tile(mAcc, self.tile_mn, (tile_m, tile_n)))
        if cutlass.const_expr(mD is not None):
            tDgD = thr_mma.partition_C(cute.local_tile(mD, self.tile_mn, (tile_m, tile_n)))
        for i in cutlass.range_constexpr(0, cute.size(acc), 2):
            if cute.elem_less(coords[i], shape):
                if cutlass.const_expr(mD is not None):
                    tDgD[i], tDgD[i + 1] = out[i], out[i + 1]
                if cutlass.const_expr(self.acc_hook):
                    tAgA[i], tAgA[i + 1] = acc[i], acc[i + 1]

    @cute.jit
    def fused_epilogue(self, acc, tile_m: Int32, tile_n: Int32, thr_mma, ctid: Int32, wg: Int32,
                       row_data: cute.Tensor, mAcc: cute.Tensor, fused_args):
        """The seam with ``fused``: the fp32 accumulator first (acc_hook), then the op's values,
        FP8 data and scales (gemm_quant.GemmQuant.write, which overwrites ``acc``; ``ctid`` the
        thread's index in the tile, ``wg`` its warpgroup). The colwise copy's exchange is the
        tile's: in ping-pong the warpgroup's 4 warps of it and a barrier of its 128 threads
        (gemm_quant.COLWISE_BARRIER + wg), cooperative all 8 and the 256 threads'."""
        row_scale, ins, scalars, amax, dbias_ws, col_data, col_scale, xch, staged = fused_args
        col = None
        if cutlass.const_expr(self.fused.cfg.colwise):
            if cutlass.const_expr(self.pingpong):
                col = (col_data, col_scale, xch, gemm_quant.COLWISE_BARRIER + wg, THREADS_PER_WG, 4 * wg)
            else:
                col = (col_data, col_scale, xch, gemm_quant.COLWISE_BARRIER, CONSUMER_WGS * THREADS_PER_WG, 0)
        if cutlass.const_expr(self.acc_hook):
            full = cutlass.Boolean((tile_m + 1) * self.tile[0] <= mAcc.shape[0])
            if full & ((tile_n + 1) * self.tile[1] <= mAcc.shape[1]):
                cute.autovec_copy(acc, thr_mma.partition_C(cute.local_tile(mAcc, self.tile_mn, (tile_m, tile_n))))
            else:
                self.store_edge(acc, None, tile_m, tile_n, thr_mma, None, mAcc)
        stage = None
        if cutlass.const_expr(self.stage_rows):
            stage = self.stage_begin(tile_m, tile_n, ctid, wg, staged[2])
        if cutlass.const_expr(self.parts == 1):
            self.fused.write(acc, tile_m, tile_n, thr_mma, self.tile_mn, ctid, ins, scalars, row_data, row_scale, amax,
                             dbias_ws, col, stage)
        else:  # (each wgmma row of the tile as a part of part_mn: the fragment's M mode p, gemm_quant's layout)
            for p in cutlass.range_constexpr(self.parts):
                self.fused.write(acc[(None, p, None)], tile_m * self.parts + p, tile_n, thr_mma, self.part_mn, ctid,
                                 ins, scalars, row_data, row_scale, amax, dbias_ws, col, stage)
        if cutlass.const_expr(self.stage_rows):
            self.stage_store(tile_m, tile_n, ctid, wg, staged)

    def stage_group(self, wg):
        """(the staged tile's buffer, its named barrier, the threads that write it) of warpgroup
        ``wg``'s tiles: in ping-pong its own, else the CTA's one."""
        if cutlass.const_expr(self.pingpong):
            return wg, STAGE_BARRIER + wg, THREADS_PER_WG
        return 0, STAGE_BARRIER, CONSUMER_WGS * THREADS_PER_WG

    @cute.jit
    def stage_begin(self, tile_m: Int32, tile_n: Int32, ctid: Int32, wg: Int32, sO: cute.Tensor):
        """Before a tile's FP8 bytes go into the staged tile: its last TMA store has read it (the
        thread that issued it waits, then the tile's threads meet). Returns write()'s ``stage``."""
        buf, bar, threads = self.stage_group(wg)
        if ctid < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=bar, number_of_threads=threads)
        base = sO.iterator.toint() + buf * (self.stage_subs * self.tile[0] * self.stage_width)
        return (Int32(base), tile_m * self.tile[0], tile_n * self.tile[1], self.tile[0], self.stage_width)

    @cute.jit
    def stage_store(self, tile_m: Int32, tile_n: Int32, ctid: Int32, wg: Int32, staged):
        """After a tile's FP8 bytes are staged: made visible to the TMA unit (a proxy fence, then the
        tile's threads meet), and the first warp stores each subtile by TMA, one commit group."""
        tma_o, gO, sO = staged
        buf, bar, threads = self.stage_group(wg)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=bar, number_of_threads=threads)
        if ctid < 32:
            gOt = cute.local_tile(gO, (self.tile[0], self.stage_width), (None, None))
            tOsO, tOgO = cute.nvgpu.cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                                          cute.group_modes(gOt, 0, 2))
            for s in cutlass.range_constexpr(self.stage_subs):
                cute.copy(tma_o, tOsO[(None, buf * self.stage_subs + s)], tOgO[(None, tile_m, tile_n * self.stage_subs + s)])
            cute.arch.cp_async_bulk_commit_group()
