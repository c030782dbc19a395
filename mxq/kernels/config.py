"""KernelConfig: every choice the kernels specialise on, as plain Python values.

A generated module builds one ``KernelConfig`` from its op's QuantSpec and epilogue (the
constructor call is rendered into the module, so the config is part of the source and hence of
every compile key) and hands it to ``mxq.kernels.Quantize``. The kernels read it through
``cutlass.const_expr``; nothing here imports cutlass, so codegen and the tests can build and
inspect configs without the DSL.

Tiling is the library's: each number below is the fastest variant measured on the H200
(docs/performance.md has the measurements; the slower alternatives were removed, git history
keeps them). ``Tuning`` holds the choices a benchmark may still flip for a side-by-side
timing; they are rendered into the module like everything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..formats.format import Format

ROWS = 32  # rows per CTA: one colwise block per CTA row tile (every kernel)
GENERIC_WARPS = 4  # generic kernel: a warp owns 32 columns (lane = column)
VEC = 8  # vectorised/packed kernels: a lane owns 8 adjacent columns (one 16-byte bf16 load)
DBIAS_WARPS = 8  # dbias reduction: warps per CTA ...
DBIAS_UNROLL = 4  # ... separate sums per thread (with the warps, these fix the order of the additions) ...
DBIAS_BYTES_IN_FLIGHT = 128  # ... and bytes of partials each thread loads before adding any (reduce.py)
PDL_MAX_ROWS = 4096  # dbias reduction: up to these rows M launched early (programmatic dependent launch), above staged
CHUNK = 16  # unaligned rows (unaligned.py): bytes per staged copy
UNIT = 8  # ... and per FP8 store: rows starting on such boundaries store whole units (variant "rows8")
SMEM_LIMIT = 227 * 1024  # dynamic shared memory one CTA may take on sm_90 / sm_100
# 0.5 + 0.5 * tanh(y) = sigmoid(2y) = 1 / (1 + 2^(K y)): the factor codegen.half_tanh_as_sigmoid
# folds into y's constants (or multiplies y by) before device.half_tanh_ex2_act
HALF_TANH_K = -2.0 * math.log2(math.e)


def unaligned_row_elements(cols: int, elem_bytes: int) -> int:
    """Elements of the 16-byte chunks that cover any ``cols``-column segment of a row from the
    start of its chunk (one chunk more than an aligned segment needs)."""
    return (cols * elem_bytes // CHUNK + 1) * CHUNK // elem_bytes


@dataclass(frozen=True)
class Tuning:
    """Benchmark-only switches (defaults are the library's choice).

    ``pdl``: launch the dbias reduction of a call of at most PDL_MAX_ROWS rows with
    programmatic dependent launch on sm_90+ (it then waits in ``griddepcontrol.wait``; longer
    reductions never are: reduce.dbias_kernel); False launches it after the quantize kernel.
    ``row_scale_l2_keep``: store the packed and vectorised kernels' row-scale bytes with an L2
    evict_last policy (a 32-row CTA writes 8 bytes of each 32-byte sector; plain stores cost
    rowwise + colwise ~6% of its bandwidth on the H200).
    ``halves_one_cta``: a two-halves op (a gated backward, mxq/gated.py) on the packed kernel
    computes both halves of a column tile in one CTA, one pass each over the same loaded inputs,
    instead of one CTA per half each loading every input tile (docs/performance.md, 2026-12-01:
    87-91% of copy against 74-77% for swiglu backward + dbias on the H200). False: one CTA per half.
    ``unaligned_warps``: warps of the packed kernel with unaligned rows (N % 8 != 0); 0 is the
    library's choice (KernelConfig.packed_warps: 8 warps of 4 rows for plain casts with colwise
    output, which measured 71-73% of copy for rowwise + colwise against 63-65% at 4 warps of 8
    rows; ops with arithmetic and rowwise-only casts keep 4, 1-6 points faster there; dbias ops
    take 8 anyway; variant "rows8" of a plain cast without dbias holds both, picked by the input's
    row stride parity, KernelConfig.rows8_warps). docs/performance.md, "N % 8 != 0", steps 5 and 18.
    ``vec_stage``: the fp32 kernel of a dact op stages its inputs through shared memory with
    cp.async and reuses that memory for the column reduction (80 registers against 100, 3 CTAs
    of 8 warps per SM against 2; docs/performance.md, "fp32 inputs", has the timings against
    the unstaged kernel). False: registers only.
    ``vec_unaligned_copy``: how the fp32 kernel stages unaligned rows (KernelConfig.
    vec_unaligned_chunks): "chunks", "words", or "" for the library's choice.
    ``rows8_min_blocks``: CTAs per SM the packed kernel of variant "rows8" is compiled for
    (``min_blocks_per_mp``, a register cap); 0: no cap. Timed on the H200 and not taken: dgelu +
    dbias + both at 4 (its shared memory holds it at 3 CTAs per SM anyway), the plain casts at
    5-12 (equal or slower; docs/performance.md, "N % 8 != 0", step 18)."""

    pdl: bool = True
    row_scale_l2_keep: bool = True
    halves_one_cta: bool = True
    unaligned_warps: int = 0
    vec_unaligned_copy: str = ""
    vec_stage: bool = True
    rows8_min_blocks: int = 0

    def __post_init__(self):
        if self.vec_unaligned_copy not in ("", "words", "chunks"):
            raise ValueError(f"mxq: Tuning.vec_unaligned_copy must be '', 'words' or 'chunks', "
                             f"got {self.vec_unaligned_copy!r}")


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
    tuning: Tuning = field(default_factory=Tuning)
    # the epilogue writes two halves side by side (mxq/gated.py): outputs [M, 2N], grid columns doubled
    halves: bool = False

    # -- derived choices (one definition each) -----------------------------------------------
    @property
    def computed(self) -> bool:
        """The op does arithmetic on its inputs (act, dact or a user epilogue), not a plain cast."""
        return self.has_act or self.has_dact or not self.identity

    @property
    def col_reduce(self) -> bool:
        """The CTA reduces over its 32 rows: colwise scales, amax or dbias."""
        return self.colwise or self.amax or self.dbias

    @property
    def stage(self) -> bool:
        """Packed kernel: stage the inputs through shared memory with cp.async (ops with
        arithmetic; with plain loads ptxas issued later rows' loads after earlier rows' math)."""
        return self.computed

    @property
    def vec_stage(self) -> bool:
        """Vectorised (fp32) kernel: stage the full-size inputs through shared memory with
        cp.async (Tuning.vec_stage; dact ops only, whose two fp32 inputs held in registers for all
        rows take 100 registers, 2 CTAs per SM); the column reduction then reuses that memory."""
        if not (self.has_dact and self.tuning.vec_stage):
            return False
        # (each staged input takes 32 rows x 32 * VEC fp32 values; the column scales 1 KB, a grouped
        # call's lookups 1 KB: an op with too many inputs keeps the unstaged kernel)
        return (self.n_inputs + 1) * ROWS * 32 * VEC * 4 + 2048 <= SMEM_LIMIT

    def vec_unaligned_bytes(self, chunks: bool) -> int:
        """Upper bound of the shared memory the vectorised kernel's unaligned rows allocate (every
        epilogue tensor counted as a staged source; keep it in step with vectorized.py): the
        staged rows (32 x 256 words per source, or the chunks covering them), the inverse column
        scales, and the dbias sums where they cannot reuse a second staged source."""
        per = ROWS * (unaligned_row_elements(32 * VEC, 4) if chunks else 32 * VEC) * 4
        total = (self.n_inputs + self.has_dact) * per
        if self.colwise:
            total += 32 * VEC * 4
        if self.dbias:
            total += self.vec_warps * 32 * VEC * 8
        return total

    @property
    def vec_unaligned(self) -> bool:
        """Variant "rows8" of an fp32 op (FP8 output rows on 8-byte boundaries, any N and input
        alignment) runs the vectorised kernel with its rows staged through shared memory
        (vectorized.py; words or chunks, vec_unaligned_chunks) where the op writes one half, writes
        rowwise output or computes, and its staged rows fit a CTA; else the element-wise kernel
        (generic.py), which ran a plain colwise cast 2% faster (docs/performance.md, "fp32
        inputs")."""
        fits = self.vec_unaligned_bytes(chunks=False) <= SMEM_LIMIT
        return fits and not self.halves and (self.rowwise or self.computed)

    @property
    def vec_unaligned_chunks(self) -> bool:
        """The fp32 kernel's unaligned rows (vec_unaligned) are staged as whole 16-byte chunks
        and realigned as they are read back (unaligned.stage_row / read_chunked_words), else word
        by word (4- or 8-byte copies into place, nothing to realign). Measured on the H200 at
        8192x8190, 4096x14335 and 8191x8191 (docs/performance.md, "fp32 inputs", step 5): chunks
        ran rowwise 83.6-85.0% of copy against 81.3-81.9% and dgelu + dbias + both 79.8-80.7%
        against 71.0-71.7%; words ran both and gelu + both -0.1 to +2.6 points against chunks
        (86.4-86.6 / 85.5-85.6% against 84.0-84.1 / 83.3% at 8192x8190). So words for an op that
        writes colwise output from one input, else chunks (an epilogue's broadcast tensors count
        as inputs: not timed), where they fit (chunks take 1.6% more shared memory);
        Tuning.vec_unaligned_copy overrides."""
        if self.tuning.vec_unaligned_copy:
            want = self.tuning.vec_unaligned_copy == "chunks"
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

    def packed_shared_bytes(self, n_sources: int, unaligned: bool, grouped: bool = False) -> int:
        """Upper bound of the shared memory the packed kernel allocates with ``n_sources`` 16-bit
        tensors read per element, each buffer rounded up to 16 bytes (every source counted as a
        full one; an aligned row operand, a bias, stages one row, not PK_ROWS): whether an op
        with many epilogue tensors fits SMEM_LIMIT (mxq/op.py refuses one that does not, before
        any launch). Keep it in step with the allocations in packed.py."""
        def r16(n):
            return (n + 15) // 16 * 16

        warps = self.packed_warps(unaligned)
        cols, rows = 32 * VEC, ROWS // warps
        total = 0
        if self.stage or unaligned:
            per = ROWS * unaligned_row_elements(cols, 2) * 2 if unaligned else ROWS * cols * 2
            total += n_sources * r16(per)
        if self.wide_tile(grouped, unaligned):
            total += r16(rows * (cols * warps // 32))  # row-scale bytes
        if self.col_reduce:
            total += r16(warps * 32 * (VEC // 2) * 4)  # column maxima
        if self.colwise:
            total += r16(cols * 4)  # inverse column scales
        if self.dbias:
            total += r16(warps * cols * 4)  # partial sums
        if unaligned:
            total += r16(warps * 4 * rows * 2 * 4)  # parked partial output units
        if grouped:
            total += 1024  # GroupTile's lookups (grouped.py), generously
        return total

    @property
    def vec_warps(self) -> int:
        """Vectorised (fp32) kernel: 4 warps x 8 rows, 8 x 4 for the register-hungry ops."""
        return 8 if self.heavy else 4

    @property
    def pk_warps(self) -> int:
        """Packed (16-bit) kernel: 4 warps x 8 rows; dbias ops 8 x 4 (at 4 warps they need 80
        registers and 43 KB of shared memory per CTA and ran 4 points slower)."""
        return 8 if self.dbias else 4

    def packed_warps(self, unaligned: bool = False) -> int:
        """Packed kernel's warps: pk_warps; with unaligned rows Tuning.unaligned_warps where set,
        else 8 for a plain cast with colwise output (its 4-row threads keep 47 registers against
        71 for 8 rows, and the kernel is latency-bound), and never fewer than pk_warps."""
        if not unaligned:
            return self.pk_warps
        warps = self.tuning.unaligned_warps or (8 if self.colwise and not self.computed else 4)
        return max(self.pk_warps, warps)

    def rows8_warps(self):
        """Variant "rows8" of a plain cast without dbias (Tuning.unaligned_warps unset): the warps
        of its packed kernel for an even and for an odd input row stride (elements), (8, 4);
        else None (one kernel, packed_warps). Measured on the H200 (docs/performance.md, "N % 8 !=
        0", step 18): at 8192x8190 8 warps ran rowwise 86-88% of copy against 82-83% at 4; at
        4096x14335 and 8191x8191 4 warps ran rowwise 85-85.5% against 81-82% at 8, colwise and
        both 86-87.5% against 80-84%."""
        if self.computed or self.dbias or self.halves or self.tuning.unaligned_warps:
            return None
        return (8, 4)

    def rows8_twins(self):
        """The configs of rows8_warps' two kernels (this config with Tuning.unaligned_warps set to
        each), or None."""
        warps = self.rows8_warps()
        if warps is None:
            return None
        return tuple(replace(self, tuning=replace(self.tuning, unaligned_warps=w)) for w in warps)

    @property
    def halves_passes(self) -> int:
        """Packed kernel: passes per CTA over its loaded tile, one per output half it writes (2
        with Tuning.halves_one_cta for a two-halves op; its grid is then not doubled)."""
        return 2 if self.halves and self.tuning.halves_one_cta else 1

    @property
    def pdl(self) -> bool:
        return self.dbias and self.tuning.pdl
