"""KernelConfig: every choice the kernels specialise on, as plain Python values.

A generated module builds one ``KernelConfig`` from its op's QuantSpec and epilogue (the
constructor call is rendered into the module, so the config is part of the source and hence of
every compile key) and hands it to ``mxq.kernels.Quantize``. The kernels read it through
``cutlass.const_expr``; nothing here imports cutlass, so codegen and the tests can build and
inspect configs without the DSL.

Tiling is the library's: each number below is the fastest variant measured on the H200
(docs/performance.md lists the slower forms), read through
KernelConfig's properties. ``Tuning`` holds the choices a benchmark may still flip for a
side-by-side timing. A library module's config has none (``tuning=None``, not rendered); a
benchmark builds a variant through one hook, ``codegen.render(spec, epilogue, tuning)``, which
``FusedOp._with_tuning`` gives an op (bench/device_check.py ``--variants``, bench/variant_ab.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ..formats.format import Format
from .smem import Buffer, nbytes

ROWS = 32  # rows per CTA: one colwise block per CTA row tile (every kernel)
FP4_COL_ROWS = 64  # FP4's colwise copy: rows per CTA, a whole 32-byte sector of each output row (two MXFP4 blocks)
FP4_COL_ROWS_DRAWN = 32  # ... with stochastic rounding or the Hadamard transform (64 no faster:
# docs/performance.md), or where 64 rows of every epilogue tensor would not fit (KernelConfig.fp4_tall_fits)
FP4_COL_TILES = (16, 32, 64)  # ... the tiles Tuning.fp4_col_rows may pick
GENERIC_WARPS = 4  # generic kernel: a warp owns 32 columns (lane = column)
VEC = 8  # vectorised/packed kernels: a lane owns 8 adjacent columns (one 16-byte bf16 load)
DBIAS_WARPS = 8  # dbias reduction: warps per CTA ...
DBIAS_UNROLL = 4  # ... separate sums per thread (with the warps, these fix the order of the additions) ...
DBIAS_BYTES_IN_FLIGHT = 128  # ... and bytes of partials each thread loads before adding any (reduce.py)
PDL_MAX_ROWS = 4096  # dbias reduction: up to these rows M launched early (programmatic dependent launch), above staged
CHUNK = 16  # unaligned rows (unaligned.py): bytes per staged copy
UNIT = 8  # ... and per FP8 store: rows starting on such boundaries store whole units (variant "rows8")
N_TERMS = 5  # grouped calls: terms find_group reduces (before, start, end, swizzled rowwise / colwise start)
# grouped calls: how a CTA finds its row tile's group (Tuning.group_search, grouped.find_group)
GROUP_SEARCHES = ("block_all", "block", "warp", "warps")
# the transposed colwise copy of a plain cast: how its input is loaded (Tuning.tr_stage, KernelConfig.tr_stage)
TR_STAGES = ("regs", "stage", "park")
SMEM_LIMIT = 227 * 1024  # dynamic shared memory one CTA may take on sm_90 / sm_100
SM_SMEM = 228 * 1024  # ... and one SM holds, of which ...
CTA_SMEM_RESERVED = 1024  # ... each resident CTA takes this much more
# 0.5 + 0.5 * tanh(y) = sigmoid(2y) = 1 / (1 + 2^(K y)): the factor codegen.half_tanh_as_sigmoid
# folds into y's constants (or multiplies y by) before device.half_tanh_ex2_act
HALF_TANH_K = -2.0 * math.log2(math.e)


def group_scratch(warps: int, search: str = "block_all") -> list:
    """The shared scratch grouped.find_group reduces through (one per CTA of a grouped call), as a
    list of at most one Buffer: a word per term and warp for the block searches, a word per term
    for "warp" (one warp's result, broadcast), none for "warps" (each warp searches alone)."""
    if search == "warps":
        return []
    return [Buffer("group", "i32", (N_TERMS, 1 if search == "warp" else warps))]


def unaligned_row_elements(cols: int, elem_bytes: int) -> int:
    """Elements of the 16-byte chunks that cover any ``cols``-column segment of a row from the
    start of its chunk (one chunk more than an aligned segment needs)."""
    return (cols * elem_bytes // CHUNK + 1) * CHUNK // elem_bytes


@dataclass(frozen=True)
class Tuning:
    """Benchmark-only switches (defaults are the library's choice; KernelConfig reads them
    through its properties, from its ``tuning`` or, in a library module, from ``Tuning()``).

    ``pdl``: launch the dbias reduction of a call of at most PDL_MAX_ROWS rows with
    programmatic dependent launch on sm_90+ (it then waits in ``griddepcontrol.wait``; longer
    reductions never are: reduce.dbias_kernel); False launches it after the quantize kernel.
    ``row_scale_l2_keep``: store the packed and vectorised kernels' row-scale bytes with an L2
    evict_last policy (a 32-row CTA writes 8 bytes of each 32-byte sector; plain stores cost
    rowwise + colwise ~6% of its bandwidth on the H200).
    ``halves_one_cta``: a two-halves op (a gated backward, mxq/gated.py) on the packed kernel
    computes both halves of a column tile in one CTA, one pass each over the same loaded inputs,
    instead of one CTA per half each loading every input tile (87-91% of copy against 74-77%
    for swiglu backward + dbias on the H200). False: one CTA per half.
    ``unaligned_warps``: warps of the packed kernel with unaligned rows (N % 8 != 0); 0 is the
    library's choice (KernelConfig.packed_warps: 8 warps of 4 rows for plain casts with colwise
    output, which measured 71-73% of copy for rowwise + colwise against 63-65% at 4 warps of 8
    rows; ops with arithmetic and rowwise-only casts keep 4, 1-6 points faster there; dbias ops
    take 8 anyway; variant "rows8" of a plain cast without dbias holds both, picked by the input's
    row stride parity, KernelConfig.rows8_warps).
    ``vec_stage``: the fp32 kernel of a dact op stages its inputs through shared memory with
    cp.async and reuses that memory for the column reduction (80 registers against 100, 3 CTAs
    of 8 warps per SM against 2, faster than the unstaged kernel on the H200). False: registers only.
    ``vec_unaligned_copy``: how the fp32 kernel stages unaligned rows (KernelConfig.
    vec_unaligned_chunks): "chunks", "words", or "" for the library's choice.
    ``rows8_min_blocks``: CTAs per SM the packed kernel of variant "rows8" is compiled for
    (``min_blocks_per_mp``, a register cap); 0: no cap. Timed on the H200 and not taken: dgelu +
    dbias + both at 4 (its shared memory holds it at 3 CTAs per SM anyway), the plain casts at
    5-12 (equal or slower).
    ``rows128_min_blocks``: CTAs per SM the packed kernel's 128-row tile (FP8 block scaling's
    colwise blocks, KernelConfig.tile_rows) is compiled for (``min_blocks_per_mp``, a register
    cap; and its shared memory: KernelConfig.stage_rows); 0: no cap; None (the default): the
    library's choice, KernelConfig.tuned_min_blocks (a grouped call's: ring_ctas). Rowwise + colwise compiles to 81 registers
    on that 512-thread tile, which holds it at one CTA per SM (65,536 registers); capped at 2:
    64, no spills (ptxas). A cap whose CTAs' shared memory would not share an SM is none
    (KernelConfig.packed_min_blocks).
    ``rows32_min_blocks``: CTAs per SM the packed kernel's 32-row tile (every kernel but the
    128-row tile: MXFP8, 1x128 rowwise, MXFP4 and NVFP4, NVFP4's colwise tile included) is
    compiled for (``min_blocks_per_mp``, a register cap; none where that many CTAs' shared memory
    would not share an SM; not NVFP4's amax pass); 0: no cap; None (the default): the library's
    choice, KernelConfig.tuned_min_blocks (6 for MXFP4's rowwise-only kernel,
    KernelConfig.mxfp4_rowwise_only; else no cap).
    ``dbias_group_rows``: a grouped dbias reduction whose groups average at most this many rows
    of 32-row tiles (M <= dbias_group_rows * G; with 128-row tiles four times as many rows, the
    same partial rows: M <= 4 dbias_group_rows * G) runs reduce.dbias_groups_kernel, a warp per group, 8 groups per
    CTA, instead of dbias_kernel's CTA per group and column tile (at 256 groups of 128 rows those
    8 warps sum about 4 partial rows each); the same additions in the same order, so the same
    bits. 0: never. SwiGLU backward + dbias at 32768 x 2048 on the H200: 0.906x the time at 256
    groups, 0.978x at 64, 0.987x at 8 (compact).
    ``group_search``: how a CTA of a grouped call finds its row tile's group (grouped.find_group;
    every form reduces the same integer terms with exact min / max / sum, so every form gives the
    same tile for any offsets): "block_all" reduces all N_TERMS terms over the CTA (a five-step
    shuffle butterfly per warp and term, a word per warp and term in shared memory, a barrier, a
    sum over the warps); "block" the same for only the terms the config reads
    (KernelConfig.group_terms), its divisions by powers of two as shifts and a warp's reduction
    one redux.sync per term; "warp" has warp 0 alone reduce those terms (redux.sync) and
    broadcast them through shared memory (the other warps wait at the barrier); "warps" has
    every warp reduce them itself (no shared memory, no barrier; each warp reads all G ends).
    "": the library's choice (KernelConfig.group_search).
    ``fp4_col_rows``: rows of the packed kernel's tile for FP4's transposed colwise copy
    (KernelConfig.fp4_columns), one of FP4_COL_TILES: 8-row warps, each output row of the copy
    getting a run of fp4_col_rows / 2 bytes per CTA; 0: the library's choice, FP4_COL_ROWS.
    MXFP4's 32-row blocks take at least 32 (16 runs as 32).
    ``tr_stage``: how the packed kernel's 128-row tile loads the input of a plain cast writing the
    transposed colwise copy (KernelConfig.tr_stage): "regs" loads each thread's 8 rows into
    registers (ptxas issues the last rows' loads only after the first rows' maxima: two memory
    latencies per CTA), "stage" requests them all with cp.async into shared memory and reads each
    back where it is used, "park" stages them the same way and leaves every row's words in its slot
    until its FP8 bytes are encoded (no input words in registers across the scale phases); both
    staged forms transpose the tile in the staged input's shared memory. "": the library's choice
    ("park").
    ``empty_exit``: a grouped call's row tile with no rows (past its group's last block: up to G
    of the grid's M / R + G row tiles, grouped.py) skips the packed kernel's loads, values and
    barriers and writes only its zero column scales (PackedKernel.empty_tile; KernelConfig.
    empty_exit says which kernels). False: it runs the whole tile with its rows masked.
    ``tr_rows_fast``: the packed kernel's grid of the transposed copy runs its row tiles along x
    and its column tiles along y (KernelConfig.rows_fast): CTAs resident together then cover
    few column tiles of many row tiles, so each output row of the copy ([N, M]) gets long runs
    at once and the input is read in shorter ones. False: column tiles along x, as every other
    kernel; None (the default): the library's choice, rows along x for the transposed copy
    alone (KernelConfig.rows_fast)."""

    pdl: bool = True
    row_scale_l2_keep: bool = True
    halves_one_cta: bool = True
    unaligned_warps: int = 0
    vec_unaligned_copy: str = ""
    vec_stage: bool = True
    rows8_min_blocks: int = 0
    rows128_min_blocks: int | None = None
    rows32_min_blocks: int | None = None
    dbias_group_rows: int = 1024
    group_search: str = ""
    fp4_col_rows: int = 0
    tr_stage: str = ""
    tr_rows_fast: bool | None = None
    empty_exit: bool = True

    def __post_init__(self):
        if self.vec_unaligned_copy not in ("", "words", "chunks"):
            raise ValueError(f"mxq: Tuning.vec_unaligned_copy must be '', 'words' or 'chunks', "
                             f"got {self.vec_unaligned_copy!r}")
        for name in ("rows8_min_blocks", "rows128_min_blocks", "rows32_min_blocks"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"mxq: Tuning.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.dbias_group_rows < 0:
            raise ValueError(f"mxq: Tuning.dbias_group_rows must be >= 0, got {self.dbias_group_rows!r}")
        if self.group_search not in ("", *GROUP_SEARCHES):
            raise ValueError(f"mxq: Tuning.group_search must be '' or one of {', '.join(GROUP_SEARCHES)}, "
                             f"got {self.group_search!r}")
        if self.tr_stage not in ("", *TR_STAGES):
            raise ValueError(f"mxq: Tuning.tr_stage must be '' or one of {', '.join(TR_STAGES)}, "
                             f"got {self.tr_stage!r}")
        if self.fp4_col_rows not in (0, *FP4_COL_TILES):
            raise ValueError(f"mxq: Tuning.fp4_col_rows must be 0 or one of {FP4_COL_TILES}, "
                             f"got {self.fp4_col_rows!r}")


@dataclass(frozen=True)
class KernelConfig:
    """What one generated module's kernels are specialised on (besides the input dtype and the
    arch, which come at compile time)."""

    fmt: Format  # block shape, element and scale encodings, scale rule and layout (MXFP8: Format.mxfp8)
    rowwise: bool
    colwise: bool
    amax: bool
    dbias: bool
    n_inputs: int  # epilogue tensor parameters
    n_scalars: int  # epilogue float parameters
    identity: bool  # the epilogue returns its first input unchanged
    has_act: bool
    has_dact: bool
    heavy: bool  # act, dact, dbias or a non-exact epilogue: the register-hungry ops
    # a benchmark's switches (module header); None in every module the library renders
    tuning: Tuning | None = None
    # the epilogue writes two halves side by side (mxq/gated.py): outputs [M, 2N], grid columns doubled
    halves: bool = False
    # packed kernel with unaligned rows: the warps a rows8 twin pins (rows8_twins); 0: packed_warps chooses
    unaligned_warps: int = 0

    def __repr__(self) -> str:
        """The constructor call rendered into the generated module: every field but an unset
        ``tuning``, so a library module carries no benchmark switch."""
        shown = [f for f in fields(self) if not (f.name == "tuning" and self.tuning is None)]
        return f"KernelConfig({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @property
    def tuned(self) -> Tuning:
        """The switches in force: a benchmark's, else the library's (``Tuning()``)."""
        return self.tuning or Tuning()

    # -- derived choices (one definition each) -----------------------------------------------
    @property
    def computed(self) -> bool:
        """The op does arithmetic on its inputs (act, dact or a user epilogue), not a plain cast."""
        return self.has_act or self.has_dact or not self.identity

    @property
    def col_reduce(self) -> bool:
        """The CTA reduces over its rows: colwise scales, amax, dbias, 128x128 or NVFP4's 16x16
        tile scales."""
        return self.colwise or self.amax or self.dbias or self.tiles or self.fp4_tiles

    @property
    def tiles(self) -> bool:
        """One scale per 128x128 tile (FP8 block scaling's block=(128, 128)): the packed kernel's
        128-row tile, whose column owners reduce each tile's maxima (packed.tile_scales)."""
        return self.fmt.block[0] > 1 and not self.fmt.packed

    @property
    def fp4_tiles(self) -> bool:
        """One E4M3 scale per 16x16 tile (NVFP4's block_2d), each tile two 8-row warps' threads of
        two adjacent lanes: the packed kernel's 32-row tile of 8-row warps (eight_row_warps),
        each thread's maximum over its 8 x 8 values meeting its partners' in shared memory and by
        one shuffle (packed.fp4_tile_scales); one multiplier per thread serves both copies."""
        return self.fmt.packed and self.fmt.block[0] > 1

    @property
    def transposed(self) -> bool:
        """The colwise copy is written transposed, [N, M] (FP8 block scaling's GEMM-ready layout):
        the packed kernel's 128-row tile stages it in shared memory (``packed_buffers``' "tr": the
        tile's columns as rows of 8-byte chunks; in the staged input's memory where tr_aliased)
        and stores it as 16-byte runs of output rows."""
        return self.colwise and self.fmt.layout == "gemm"

    @property
    def tr_stage(self) -> str:
        """How the packed kernel loads a plain cast's input (no dbias) where it writes the
        transposed colwise copy (Tuning.tr_stage; TR_STAGES; "" for every other op): "regs",
        "stage" or "park". The library's choice: "park" (the transposed copy alone: in registers
        ptxas issues 5 of a thread's 8 row loads, then their maxima, then the other 3; parked, 38
        registers instead of 53 on sm_90, 3 CTAs per SM instead of 2; beside the rowwise copy, the
        same 64 registers under the cap without "regs"' 8 bytes of stack). On the H200 at 8192^2 /
        16384^2 (docs/performance.md): the copy alone 87.0 / 92.8% of copy parked against 72.3 /
        79.1% in registers, both directions 86.6 / 90.5% parked against 85.0 / 89.1%."""
        if not self.transposed or self.computed or self.dbias:
            return ""
        return self.tuned.tr_stage or "park"

    @property
    def rows_fast(self) -> bool:
        """The packed kernel's grid runs row tiles along x and column tiles along y and z
        (Tuning.tr_rows_fast: the transposed copy, which is never grouped). The
        library's choice: the transposed copy alone (on the H200 at 8192^2 / 16384^2: 89.6 /
        97.5% of copy against 87.0 / 92.8% with column tiles along x; beside the rowwise copy
        85.0 / 89.1% either way, so that keeps column tiles along x)."""
        if self.tuned.tr_rows_fast is not None:
            return self.transposed and self.tuned.tr_rows_fast
        return self.transposed and not self.rowwise

    @property
    def tr_aliased(self) -> bool:
        """The transposed copy's tile ("tr") lies in the staged input's shared memory (tr_stage
        "stage" or "park": a plain cast's one staged source, dead or parked by then), not in a
        buffer of its own."""
        return self.tr_stage in ("stage", "park")

    @property
    def tr_parts(self) -> int:
        """Column parts the transposed copy's tile is staged and stored in, one after another
        ("tr" holds one part: PackedKernel.store_transposed_rows, a barrier more per part): 1,
        but for a two-halves op (a gated backward), whose two passes keep its three staged
        inputs (192 KiB at 128 rows) for the second: the fewest of 2 and 4 that fit SMEM_LIMIT
        with every epilogue tensor staged (4 beside the dbias sums)."""
        if not (self.transposed and self.halves):
            return 1
        n = self.n_inputs + self.has_dact
        rows = self.tile_rows // self.packed_warps(False)  # (every row staged: not stage_rows, which reads this)
        for parts in (2, 4):
            if nbytes(self._packed_buffers([(16, False)] * n, False, False, rows, parts)) <= SMEM_LIMIT:
                return parts
        return 4

    @property
    def stage(self) -> bool:
        """Packed kernel: stage the inputs through shared memory with cp.async (ops with
        arithmetic, and a plain cast's transposed copy unless tr_stage is "regs"; with plain loads
        ptxas issues later rows' loads after earlier rows' math)."""
        return self.computed or self.tr_aliased

    @property
    def vec_stage(self) -> bool:
        """Vectorised (fp32) kernel: stage the full-size inputs through shared memory with
        cp.async (Tuning.vec_stage; dact ops only, whose two fp32 inputs held in registers for all
        rows take 100 registers, 2 CTAs per SM); the column reduction then reuses that memory."""
        if not (self.has_dact and self.tuned.vec_stage):
            return False
        # (an op with too many inputs to stage, grouped calls included, keeps the unstaged kernel)
        return nbytes(self.vec_buffers([True] * (self.n_inputs + 1), grouped=True)) <= SMEM_LIMIT

    def vec_buffers(self, staged, grouped: bool = False, chunks: bool = False) -> list:
        """The vectorised kernel's shared memory (smem.Buffer), in allocation order: a grouped
        call's scratch, each staged source (``staged``: per source whether it is staged; tile_rows
        rows of 32 * VEC fp32 words, or with ``chunks`` the 16-byte chunks covering them), then the
        column maxima and dbias sums where they cannot reuse a first and second staged source
        (dead once every row is read back), the inverse column scales, and the transposed colwise
        copy's staging tile ("tr", 8-byte chunks of the tile's columns: packed.transposed_chunk)."""
        warps = self.vec_warps
        cols = 32 * VEC
        out = group_scratch(warps, self.group_search) if grouped else []
        for t, st in enumerate(staged):
            if st:
                rows = self.tile_rows
                shape = (rows, unaligned_row_elements(cols, 4)) if chunks else (rows // warps, warps * 32, 1, VEC)
                out.append(Buffer(f"in{t}", "f32", shape))
        n = sum(bool(st) for st in staged)
        if self.col_reduce:
            if n < 1:
                out.append(Buffer("max", "f32", (warps, cols)))
            if self.dbias and n < 2:
                out.append(Buffer("sum", "f64", (warps, cols)))
            if (self.colwise and not self.fp4_columns) or self.tiles:  # (tiles: the owner warps' tile maxima)
                out.append(Buffer("inv", "f32", (cols,)))
        if self.transposed:  # (the transposed copy's staging tile: packed.stage_transposed_block)
            out.append(Buffer("tr", "u64", (cols * self.tile_rows // 8,)))
        return out

    def vec_unaligned_bytes(self, chunks: bool) -> int:
        """The shared memory of the vectorised kernel's unaligned rows with every epilogue tensor
        counted as a staged source (vec_buffers; an upper bound for an op with row or scalar
        operands, which are not staged)."""
        return nbytes(self.vec_buffers([True] * (self.n_inputs + self.has_dact), chunks=chunks))

    @property
    def vec_unaligned(self) -> bool:
        """Variant "rows8" of an fp32 op (FP8 output rows on 8-byte boundaries, any N and input
        alignment) runs the vectorised kernel with its rows staged through shared memory
        (vectorized.py; words or chunks, vec_unaligned_chunks) where the op writes one half, writes
        rowwise output or computes, and its staged rows fit a CTA; else the element-wise kernel
        (generic.py), which ran a plain colwise cast 2% faster on the H200."""
        fits = self.vec_unaligned_bytes(chunks=False) <= SMEM_LIMIT
        # (tiles of other than ROWS rows: the aligned kernel alone, limits.fp8_block_gap)
        return fits and not self.halves and (self.rowwise or self.computed) and self.tile_rows == ROWS

    @property
    def vec_unaligned_chunks(self) -> bool:
        """The fp32 kernel's unaligned rows (vec_unaligned) are staged as whole 16-byte chunks
        and realigned as they are read back (unaligned.stage_row / read_chunked_words), else word
        by word (4- or 8-byte copies into place, nothing to realign). Measured on the H200 at
        8192x8190, 4096x14335 and 8191x8191: chunks
        ran rowwise 83.6-85.0% of copy against 81.3-81.9% and dgelu + dbias + both 79.8-80.7%
        against 71.0-71.7%; words ran both and gelu + both -0.1 to +2.6 points against chunks
        (86.4-86.6 / 85.5-85.6% against 84.0-84.1 / 83.3% at 8192x8190). So words for an op that
        writes colwise output from one input, else chunks (an epilogue's broadcast tensors count
        as inputs: not timed), where they fit (chunks take 1.6% more shared memory);
        Tuning.vec_unaligned_copy overrides."""
        if self.tuned.vec_unaligned_copy:
            want = self.tuned.vec_unaligned_copy == "chunks"
        else:
            want = not (self.colwise and self.n_inputs == 1 and not self.has_dact)
        return want and self.vec_unaligned_bytes(chunks=True) <= SMEM_LIMIT

    @property
    def wide(self) -> bool:
        """Packed kernel of a pure rowwise cast: warps side by side along a row band (8 x 1024
        columns), row scales gathered in shared memory and stored as 4-byte words."""
        return not self.col_reduce

    def wide_tile(self, grouped: bool, unaligned: bool) -> bool:
        """The packed kernel takes the wide tiling (a pure rowwise cast); grouped, two-halves and
        unaligned calls take 32-row tiles."""
        return self.wide and not grouped and not self.halves and not unaligned

    def packed_buffers(self, staged, unaligned: bool, grouped: bool = False, depth: int = 0) -> list:
        """The packed kernel's shared memory (smem.Buffer), in allocation order: a grouped call's
        scratch, the wide tile's row-scale bytes, the column maxima (packed words), the inverse
        column scales (but NVFP4's; or 128x128 tiles' partial maxima), the transposed colwise copy
        (``transposed``) and FP4's (with stochastic rounding, the random words its warps share), the
        dbias partial sums, the parked partial output units (unaligned rows: head and tail of each
        row, per direction), then each staged source (``staged``: per source None, or (element
        bits, broadcast along rows: one row staged, aligned kernel)), ``depth`` rows per thread
        (0: stage_rows)."""
        return self._packed_buffers(staged, unaligned, grouped, depth, self.tr_parts)

    def _packed_buffers(self, staged, unaligned: bool, grouped: bool, depth: int, tr_parts: int) -> list:
        """packed_buffers with "tr" holding one of ``tr_parts`` column parts of the tile."""
        warps = self.packed_warps(unaligned)
        cols, rows = 32 * VEC, self.tile_rows // warps
        depth = depth or self.stage_rows(unaligned, grouped)
        out = group_scratch(warps, self.group_search) if grouped else []
        if self.wide_tile(grouped, unaligned) and self.fmt.scale != "fp32":  # (fp32 scales are stored directly)
            out.append(Buffer("rs", "u8", (rows, cols * warps // self.fmt.block[1])))
        if self.col_reduce:
            out.append(Buffer("max", "u32", (warps, 32 * (VEC // 2))))
        if (self.colwise and not self.fp4_columns) or self.tiles:  # (tiles: the owner warps' maxima of the
            # CTA's two tiles; FP4's colwise multipliers stay in registers, PackedKernel.fp4_column_scales)
            out.append(Buffer("inv", "f32", (cols,)))
        if self.transposed and not self.tr_aliased:
            # (a column's 8-byte chunks per row, for cols / tr_parts columns)
            out.append(Buffer("tr", "u64", (cols * self.tile_rows // 8 // tr_parts,)))
        if self.colwise and self.fmt.packed:  # (FP4's transposed copy: each warp's word of each column)
            out.append(Buffer("fp4t", "u32", (warps * cols,)))
        if self.colwise and self.fmt.packed and self.fmt.rounding == "sr":  # (stochastic rounding: each
            # 16-row group's Philox words per column, half of them for the partner warp, PackedKernel.store_rows)
            out.append(Buffer("srx", "u32", (warps // 2, VEC, 2, 32, 2)))
        if self.fmt.hadamard:  # (NVFP4's Hadamard transform: each thread's rows, packed words, for its
            # partner warp; per word j two 4-row halves, PackedKernel.hadamard_columns)
            out.append(Buffer("rht", "u32", (warps, VEC, 32, 4)))
        if self.dbias:
            out.append(Buffer("sum", "f32", (warps, cols)))
        if unaligned:
            out.append(Buffer("edge", "u32", (warps, 4 * rows * (int(self.rowwise) + int(self.colwise)))))
        for t, src in enumerate(staged):
            if src is not None:
                bits, once = src
                if unaligned:
                    shape = (self.tile_rows, unaligned_row_elements(cols, bits // 8))
                else:
                    shape = (1 if once else depth, warps * 32, VEC)
                out.append(Buffer(f"in{t}", "src", shape, bits))
        return out

    def packed_shared_bytes(self, n_sources: int, unaligned: bool, grouped: bool = False, depth: int = 0) -> int:
        """The shared memory of the packed kernel with ``n_sources`` full-size 16-bit tensors read
        per element (packed_buffers; an upper bound for an op whose row operands stage one row):
        whether an op with many epilogue tensors fits SMEM_LIMIT (mxq/op.py refuses one that
        does not, before any launch)."""
        staged = [(16, False)] * n_sources if (self.stage or unaligned) else []
        return nbytes(self.packed_buffers(staged, unaligned, grouped, depth))

    def stage_rows(self, unaligned: bool, grouped: bool = False, fp16: bool = False) -> int:
        """Rows per thread of each staged source the packed kernel holds in shared memory at once:
        all the thread's rows, or half of them where the 128-row tile is compiled for
        ``ring_ctas`` CTAs per SM and only half lets their shared memory share an SM (aligned
        rows, one pass: a ring, row i + half requested into row i's slot once row i is read; the
        shared memory counted with every epilogue tensor and the dact input staged,
        packed_shared_bytes)."""
        rows = self.tile_rows // self.packed_warps(unaligned)
        ctas = self.ring_ctas(fp16, grouped)
        if (unaligned or self.halves_passes > 1 or ctas < 2 or self.tile_rows == ROWS or self.fp4_columns
                or self.tr_aliased):
            return rows  # (the ring serves the 128-row tile alone; a parked row keeps its slot)
        n = self.n_inputs + self.has_dact
        if self.ctas_fit(self.packed_shared_bytes(n, False, grouped, rows), ctas):
            return rows
        return rows // 2 if self.ctas_fit(self.packed_shared_bytes(n, False, grouped, rows // 2), ctas) else rows

    def ring_ctas(self, fp16: bool = False, grouped: bool = False) -> int:
        """tuned_min_blocks for the packed kernel of 16-bit inputs (``fp16``: float16, else
        bfloat16) of a ``grouped`` call or not: the library's choice for an op with arithmetic is
        bf16's alone (fp16's conversions spill 32 bytes under the cap on sm_90), and a grouped call
        of grouped_ring's ops takes 2 (its partly filled and empty tiles, up to G more than an
        ungrouped call's, each costing what a full one does, then run beside a second CTA: the
        grouped SwiGLU forward in FP8 block scaling at 32768 x 2048 ran at 91.4% of copy against
        73.0% at one CTA per SM with 256 random groups, 93.4 / 93.3% against 93.9 / 94.1% with 8 /
        64, on an H100, bench/gated.py; 64 registers, 4 bytes of spills on sm_90, where gelu's and
        relu's fit)."""
        if fp16 and self.tuned.rows128_min_blocks is None and self.computed and self.tile_rows > ROWS:
            return 0
        if grouped and self.grouped_ring:
            return 2
        return self.tuned_min_blocks

    @staticmethod
    def ctas_fit(smem_bytes: int, ctas: int) -> bool:
        """``ctas`` CTAs of ``smem_bytes`` shared memory each fit one SM (sm_90 / sm_100)."""
        return ctas * (smem_bytes + CTA_SMEM_RESERVED) <= SM_SMEM

    @property
    def vec_warps(self) -> int:
        """Vectorised (fp32) kernel: 4 warps x 8 rows, 8 x 4 for the register-hungry ops; tiles of
        other than ROWS rows (FP8 block scaling's 128-row colwise blocks), FP4's colwise copy and
        NVFP4's 16x16 tiles warps of 8 rows."""
        if self.tile_rows != ROWS or self.fp4_columns or self.fp4_tiles:  # (FP4: a thread's 8 rows, one word a column)
            return self.tile_rows // 8
        return 8 if self.heavy else 4

    @property
    def fp4_columns(self) -> bool:
        """FP4's transposed colwise copy ([N, M/2], blocks along M: NVFP4's 16 rows, MXFP4's 32):
        the packed kernel's 8-row warps, fp4_col_rows rows per CTA (packed.store_fp4_columns)."""
        return self.colwise and self.fmt.packed

    @property
    def fp4_col_rows(self) -> int:
        """Rows of FP4's colwise tile (Tuning.fp4_col_rows, else FP4_COL_ROWS, FP4_COL_ROWS_DRAWN
        with stochastic rounding or the Hadamard transform; at least one colwise block, MXFP4's 32
        rows): each output row of the transposed copy gets a run of half as many bytes per CTA, and
        the CTA computes the scales of fp4_col_rows / B blocks (B: 16 or 32 rows) of each of its
        columns."""
        if self.tuned.fp4_col_rows:
            return max(self.tuned.fp4_col_rows, self.fmt.col_block[0])
        if self.fmt.rounding == "sr" or self.fmt.hadamard or not self.fp4_tall_fits:
            return max(FP4_COL_ROWS_DRAWN, self.fmt.col_block[0])
        return FP4_COL_ROWS

    @property
    def fp4_tall_fits(self) -> bool:
        """FP4_COL_ROWS' tile fits a CTA's shared memory with every epilogue tensor (and a dact
        op's input) staged whole, grouped or not: an op with many tensors (7 or more full ones
        bf16) takes FP4_COL_ROWS_DRAWN's rows, which fit 13, instead (FP4 runs aligned rows
        alone, limits.fp4_unserved)."""
        tall = replace(self, tuning=replace(self.tuned, fp4_col_rows=FP4_COL_ROWS))
        return tall.packed_shared_bytes(self.n_inputs + self.has_dact, False, True) <= SMEM_LIMIT

    @property
    def tile_rows(self) -> int:
        """Rows of a CTA's (non-wide) tile: one colwise block, ROWS for MXFP8's 32x1 blocks and
        rowwise-only ops, 128 for FP8 block scaling's colwise blocks and 128x128 tiles (the packed kernel only:
        docs/DESIGN.md "FP8 block scaling on the kernels"); FP4's colwise copy fp4_col_rows
        (whole 16- or 32-row blocks; NVFP4's 16x16 tiles too, and ROWS, two tiles' rows, without the copy)."""
        if self.fp4_columns:
            return self.fp4_col_rows
        return self.fmt.col_block[0] if self.colwise else max(ROWS, self.fmt.block[0])

    @property
    def eight_row_warps(self) -> bool:
        """The packed kernel's warps are tile_rows / 8 warps of 8 rows, whatever the op: tiles
        other than ROWS rows, NVFP4's colwise copy (a thread's 8 rows of a column are one
        word of codes) and its 16x16 tiles (two warps' rows, fp4_tiles)."""
        return self.tile_rows != ROWS or self.fp4_columns or self.fp4_tiles

    @property
    def pk_warps(self) -> int:
        """Packed (16-bit) kernel: 4 warps x 8 rows; dbias ops 8 x 4 (at 4 warps they need 80
        registers and 43 KB of shared memory per CTA and ran 4 points slower); 128-row tiles
        (tile_rows) 16 x 8, NVFP4's colwise tile and 16x16 tiles tile_rows / 8 x 8 (eight_row_warps)."""
        if self.eight_row_warps:
            return self.tile_rows // 8
        return 8 if self.dbias else 4

    def packed_warps(self, unaligned: bool = False) -> int:
        """Packed kernel's warps: pk_warps; with unaligned rows the warps a rows8 twin pins
        (unaligned_warps) or Tuning.unaligned_warps where set, else 8 for a plain cast with
        colwise output (its 4-row threads keep 47 registers against 71 for 8 rows, and the kernel
        is latency-bound), and never fewer than pk_warps."""
        if not unaligned or self.eight_row_warps:
            return self.pk_warps
        pinned = self.unaligned_warps or self.tuned.unaligned_warps
        warps = pinned or (8 if self.colwise and not self.computed else 4)
        return max(self.pk_warps, warps)

    def rows8_warps(self):
        """Variant "rows8" of a plain cast without dbias (no warps pinned): the warps
        of its packed kernel for an even and for an odd input row stride (elements), (8, 4);
        else None (one kernel, packed_warps). On the H200, 8 warps run an even stride's rowwise
        cast at 86-88% of copy against 82-83% at 4 (8192x8190), and 4 warps an odd stride's at
        85-85.5% against 81-82% at 8, colwise and both 86-87.5% against 80-84% (4096x14335 and
        8191x8191)."""
        if (self.computed or self.dbias or self.halves or self.unaligned_warps or self.tuned.unaligned_warps
                or self.eight_row_warps):
            return None
        return (8, 4)

    def rows8_twins(self):
        """The configs of rows8_warps' two kernels (this config with unaligned_warps pinned to
        each), or None."""
        warps = self.rows8_warps()
        if warps is None:
            return None
        return tuple(replace(self, unaligned_warps=w) for w in warps)

    def global_passes(self):
        """NVFP4's two passes (a per-tensor amax before any block is quantized) as the configs of
        their kernels, (amax pass, quantize pass), or None for a one-pass format or a config that
        is one of them already. The amax pass computes the op's values and writes their NaN-dropping
        amax alone; the quantize pass reads it (the amax slot) and writes the rest."""
        if not (self.fmt.global_scale and self.amax and (self.rowwise or self.colwise)):
            return None
        return (replace(self, rowwise=False, colwise=False, dbias=False),
                replace(self, amax=False))

    @property
    def halves_passes(self) -> int:
        """Packed kernel: passes per CTA over its loaded tile, one per output half it writes (2
        with Tuning.halves_one_cta for a two-halves op; its grid is then not doubled)."""
        return 2 if self.halves and self.tuned.halves_one_cta else 1

    @property
    def pdl(self) -> bool:
        """The dbias reduction may launch early (Tuning.pdl)."""
        return self.dbias and self.tuned.pdl

    @property
    def row_scale_l2_keep(self) -> bool:
        """Row-scale bytes leave with an L2 evict_last policy (Tuning.row_scale_l2_keep)."""
        return self.tuned.row_scale_l2_keep

    @property
    def dbias_group_rows(self) -> int:
        """Grouped dbias: the largest average rows per group reduced a warp per group; 0: never
        (Tuning.dbias_group_rows)."""
        return self.tuned.dbias_group_rows if self.dbias else 0

    @property
    def tuned_min_blocks(self) -> int:
        """CTAs per SM the packed kernel's 128-row tile is meant for (Tuning.rows128_min_blocks);
        0: no register cap. The library's choice: 2 for a plain cast writing both directions (81
        registers hold it at one 512-thread CTA per SM; capped, 64 and no spills: 88-93% of copy
        against 67-70% on the H200, docs/performance.md) and for a dact op with dbias writing both
        (its two staged inputs then take half the rows at once, stage_rows: 64 registers, no
        spills for dgelu on sm_90, 8 bytes for the other dacts; bf16 inputs, ring_ctas); none
        for the rest (act ops compile to 64 registers uncapped; dgelu without dbias and a plain
        cast with dbias spill under the cap)."""
        if self.tile_rows == ROWS or self.fp4_columns:  # (not NVFP4's amax pass: no data, no cap)
            if not (self.rowwise or self.colwise):
                return 0
            if self.tuned.rows32_min_blocks is not None:
                return self.tuned.rows32_min_blocks
            return 6 if self.mxfp4_rowwise_only else 0
        if self.tuned.rows128_min_blocks is not None:
            return self.tuned.rows128_min_blocks
        plain = not self.computed and not self.dbias
        dact = self.has_dact and self.dbias and not self.halves and self.tile_rows > ROWS
        return 2 if self.rowwise and self.colwise and (plain or dact) else 0

    def packed_min_blocks(self, unaligned: bool = False, grouped: bool = False, fp16: bool = False) -> int:
        """CTAs per SM the packed kernel (aligned or ``unaligned`` rows; ``fp16`` inputs, else
        bf16) is compiled for (``min_blocks_per_mp``, a register cap); 0: no cap. ring_ctas where
        that many CTAs' shared memory (at stage_rows) fits an SM, else none (more registers
        would not buy a second CTA)."""
        ctas = self.ring_ctas(fp16, grouped)
        n = self.n_inputs + self.has_dact
        depth = self.stage_rows(unaligned, grouped, fp16)
        return ctas if ctas and self.ctas_fit(self.packed_shared_bytes(n, unaligned, grouped, depth), ctas) else 0

    @property
    def min_blocks(self) -> int:
        """CTAs per SM the packed kernel with aligned rows is compiled for (packed_min_blocks)."""
        return self.packed_min_blocks()

    @property
    def rows8_min_blocks(self) -> int:
        """CTAs per SM the packed kernel of variant "rows8" is compiled for; 0: no register cap
        (Tuning.rows8_min_blocks)."""
        return self.tuned.rows8_min_blocks

    @property
    def mxfp4_rowwise_only(self) -> bool:
        """MXFP4's plain rowwise-only cast (E2M1 data, E8M0 scales, no per-tensor scale, no
        arithmetic, dbias or amax: what was timed). Compiled for 6 CTAs per SM, ptxas schedules it
        in 72 registers instead of 48 on sm_90 (more of a thread's loads in flight): 93.4 / 102.2%
        of copy on the H200 at 8192^2 / 16384^2 against 79.3 / 89.2%; the same cap did not move
        NVFP4 or either format's both-direction kernels (docs/performance.md). Ops with arithmetic
        compile to fewer registers under it (gelu + dbias: 40 against 48), untimed: uncapped."""
        return (self.fmt.packed and not self.fmt.global_scale and self.rowwise and not self.colwise
                and not self.computed and not self.dbias and not self.amax)

    @property
    def grouped_ring(self) -> bool:
        """Whether a grouped call's packed kernel takes 2 CTAs per SM where an ungrouped one takes 1
        (ring_ctas; Tuning.rows128_min_blocks None): the 128-row tile of an op with arithmetic but
        no dact or dbias, writing both directions (not FP4's colwise tile, whose rows
        Tuning.fp4_col_rows sets and Tuning.rows32_min_blocks caps)."""
        return (self.tuned.rows128_min_blocks is None and self.tile_rows > ROWS and not self.fp4_columns
                and self.computed and not self.has_dact and not self.dbias and self.rowwise and self.colwise)

    @property
    def empty_exit(self) -> bool:
        """A grouped call's row tile with no rows leaves after its group search (Tuning.empty_exit;
        PackedKernel.empty_tile): the packed kernel's FP8 kernels with aligned rows, whose empty
        tile writes only its compact colwise scales' zeros (not FP4's tiles, NVFP4's amax pass or
        128x128 tiles, whose writes differ)."""
        return (self.tuned.empty_exit and not self.fmt.packed and not self.tiles and not self.fp4_tiles
                and (self.rowwise or self.colwise))

    @property
    def group_search(self) -> str:
        """How a grouped call's CTA finds its group (Tuning.group_search; GROUP_SEARCHES). The
        library's choice: "warps" for ops with arithmetic (no barrier before a warp's first load:
        the grouped SwiGLU forward ran at 95.0-95.7% of copy compact and 87.4-89.8% swizzled on
        the H200 at 8 / 64 / 256 groups, against 80.2-80.3% and 76.0-77.2% with "block_all"; its
        backward 0-3 points faster), "block_all" for a plain cast (the four forms within 1.5
        points there, docs/performance.md)."""
        return self.tuned.group_search or ("warps" if self.computed else "block_all")

    @property
    def group_terms(self) -> tuple:
        """The terms of grouped.terms that find_group reduces (indices < N_TERMS): all of them for
        "block_all"; else the group's index, start and end (grouped.tile), and with swizzled
        scales the swizzled rowwise rows before the group where the op writes rowwise scales, the
        colwise block rows before it where it writes colwise scales (grouped.swizzled_bases)."""
        if self.group_search == "block_all":
            return tuple(range(N_TERMS))
        swz = self.fmt.swizzled
        return (0, 1, 2) + ((3,) if swz and self.rowwise else ()) + ((4,) if swz and self.colwise else ())
