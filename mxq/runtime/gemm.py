"""The sm_90 GEMM from Python: ``gemm(a, w, out=None, acc_out=None)`` (not public API yet) returns
D = a @ w^T (mxq/kernels/gemm_sm90.py), compiled once per (dtype, arch, options, SM count) with
TVM-FFI (symbolic M, N, K; the stream is torch's current one) and kept in memory; ``gemm_op``
runs ``op.gemm`` (an op's rendered ``launch_gemm``: the GEMM with the op's epilogue and quantize,
mxq/kernels/gemm_quant.py), compiled per op source, dtype and operand kinds. Both run the kernel
``kernel_for`` picks at call time for the shape and the op (GemmSm90's ``pingpong``, ``pp_tile``,
``swizzle`` and ``cluster_m``): ping-pong on 128 x 192 tiles in bands along N for the plain GEMM
and ops whose epilogue reads the accumulator alone at K up to WIDE_MAX_K; otherwise the
cooperative form (two warpgroups on 128 x 256), also wherever the tile cannot hold the op's blocks
(``serves``). That rule timed fastest on the H100 and the H200 alike (docs/performance.md). An op writing the rowwise copy alone, with N a multiple
of 16, stores it through shared memory by TMA (GemmSm90's ``stage_rows``; ``stages_rows``).
``PINGPONG``, ``PP_TILE``, ``ORDER`` and ``STAGE_ROWS`` force a kernel (a benchmark or test sets
them to time or check it). CTAs run in clusters of ``CLUSTER_M`` along M where the M tiles pair
up or number at least CLUSTER_MIN_ODD_TILES (``cluster_for``).

Arguments are checked here, before any launch, each error naming its argument: a [M, K] and
w [N, K] of one dtype (bf16 or fp16), both K-major (row-major, contiguous rows) on one CUDA
device, K and N multiples of 8 (TMA's 16-byte rows); ``out`` [M, N] of a's dtype, ``acc_out``
[M, N] fp32 (the test hook: the accumulator before rounding), both contiguous.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import torch

from ..frontend import gated
from . import cache, launch, toolchain
from . import operands as operands_mod

ARCH = "sm_90a"  # wgmma needs the arch-specific target
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ALIGN = 8  # K and N: multiples of 8 elements (16-byte rows for TMA)
COOPERATIVE_TILE = (128, 256)  # mxq/kernels/gemm_sm90.py's TILE (M, N): the cooperative form's output tile
PP_TILE = (64, 256)  # the ping-pong tile PINGPONG = True forces (benchmarks, tests): one of gemm_sm90.PINGPONG_TILES
WIDE_TILE = (128, 192)  # the ping-pong tile kernel_for takes for K <= WIDE_MAX_K (wide_serves' ops)
WIDE_ORDER = -8  # WIDE_TILE's tile order: bands of 8 clusters of M tiles moving along N (GemmSm90's swizzle < 0),
# or of fewer where 8 would pad the M clusters by more than 1/WIDE_MAX_PAD (wide_order)
WIDE_MAX_PAD = 16
WIDE_MAX_K = 8192  # (longer K: the cooperative tile's fewer loads per flop win over ping-pong's hidden epilogue)
WG_ROWS = 64  # rows of a warpgroup's wgmma (m64): a ping-pong tile's colwise blocks hold at most this many
DBIAS_ROWS = 16  # rows of one dbias partial sum in op.gemm's epilogue: a warp's stripe (gemm_quant.GemmQuant.columns)
SWIZZLES = (8, 4, 2, 1)  # tile orders gemm() picks from: the largest that divides the N tile count
ORDER = None  # a tile order gemm() and gemm_op() launch (GemmSm90's swizzle; < 0: bands along N); None: kernel_for's
PINGPONG = None  # a kernel form gemm() and gemm_op() launch: True ping-pong (on PP_TILE), False cooperative; None: kernel_for's
CLUSTER_M = 2  # CTAs per cluster along M of either form (GemmSm90's cluster_m: W stages multicast)
CLUSTER_MIN_ODD_TILES = 9  # an odd M tile count takes clusters from this many tiles (padding <= 1/9)
STAGE_ROWS = None  # op.gemm's rowwise FP8 data staged for TMA stores (True) or stored from registers (False); None: stages_rows'
STAGE_ALIGN = 16  # N: a multiple of this many FP8 bytes for the staged TMA store (its rows' 16-byte pitch)

_compiled = cache.LRU(cache.cache_size())  # (dtype, arch, acc_hook, num_sms, swizzle, pingpong, cluster, tile) -> function
_lock = threading.Lock()
os.register_at_fork(after_in_child=_lock._at_fork_reinit)  # (held by a parent thread at a fork: compiler._fresh_locks)


def check_args(a, w, out=None, acc_out=None) -> None:
    """Raise a clear error, naming the argument, for anything the kernel cannot take."""
    for name, t in (("a", a), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mxq.gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"mxq.gemm: {name} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"mxq.gemm: {name} must be 2-D [rows, K], got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"mxq.gemm: {name} must be K-major and contiguous (row-major [rows, K]), "
                             f"got strides {t.stride()}")
        if t.data_ptr() % 16:
            raise ValueError(f"mxq.gemm: {name} must start on a 16-byte boundary (TMA), got address {t.data_ptr():#x}")
        if t.numel() >= 2 ** 31:
            raise ValueError(f"mxq.gemm: {name} must have fewer than 2^31 elements (32-bit indices), got {t.numel()}")
    if w.dtype != a.dtype:
        raise TypeError(f"mxq.gemm: w must have a's dtype {a.dtype}, got {w.dtype}")
    if w.shape[1] != a.shape[1]:
        raise ValueError(f"mxq.gemm: w must be [N, K] with a's K={a.shape[1]}, got shape {tuple(w.shape)}")
    if a.shape[1] % ALIGN or a.shape[1] == 0:
        raise ValueError(f"mxq.gemm: K (a.shape[1]) must be a positive multiple of {ALIGN}, got {a.shape[1]}")
    if w.shape[0] % ALIGN:
        raise ValueError(f"mxq.gemm: N (w.shape[0]) must be a multiple of {ALIGN}, got {w.shape[0]}")
    if w.device != a.device:
        raise ValueError(f"mxq.gemm: w must be on a's device {a.device}, got {w.device}")
    shape = (a.shape[0], w.shape[0])
    for name, t, dtype in (("out", out, a.dtype), ("acc_out", acc_out, torch.float32)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"mxq.gemm: {name} must be a {dtype} tensor of shape {shape}, got {got}")
        if not t.is_contiguous() or t.device != a.device or t.data_ptr() % 16:
            raise ValueError(f"mxq.gemm: {name} must be contiguous on {a.device}, starting on a 16-byte boundary")
        if t.numel() >= 2 ** 31:
            raise ValueError(f"mxq.gemm: {name} must have fewer than 2^31 elements (32-bit indices), got {t.numel()}")


def fake_args(dtype_name: str, acc_hook: bool):
    """Compile-time arguments: symbolic M, N, K (K and N multiples of 8), 16-byte aligned
    row-major tensors, and TVM-FFI's environment stream."""
    cute = toolchain.import_cutlass(ARCH)
    import cutlass

    el = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[dtype_name]
    m, n, k = cute.sym_int(), cute.sym_int(divisibility=ALIGN), cute.sym_int(divisibility=ALIGN)
    fake = cute.runtime.make_fake_compact_tensor
    args = [fake(el, (m, k), stride_order=(1, 0), assumed_align=16),
            fake(el, (n, k), stride_order=(1, 0), assumed_align=16),
            fake(el, (m, n), stride_order=(1, 0), assumed_align=16)]
    if acc_hook:
        args.append(fake(cutlass.Float32, (m, n), stride_order=(1, 0), assumed_align=16))
    args.append(cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))
    return args


def compile_gemm(dtype_name: str = "bf16", acc_hook: bool = False, num_sms: int = 132, keep_ptx: bool = False,
                 swizzle: int = 1, pingpong: bool = False, cluster_m: int | None = None, pp_tile: tuple | None = None):
    """The compiled TVM-FFI function ``f(a, w, d[, acc])`` (cached in memory unless keep_ptx);
    ``swizzle``: GemmSm90's tile order option (benchmarks try others); ``pingpong``: its form;
    ``cluster_m``: its CTAs per cluster (None: CLUSTER_M); ``pp_tile``: GemmSm90's
    ping-pong tile (None: PP_TILE)."""
    cluster_m = CLUSTER_M if cluster_m is None else cluster_m
    pp_tile = PP_TILE if pp_tile is None else tuple(pp_tile)
    key = (dtype_name, ARCH, acc_hook, num_sms, swizzle, pingpong, cluster_m, pp_tile)

    def make():
        from ..kernels.gemm_sm90 import GemmSm90

        kernel = GemmSm90(acc_hook=acc_hook, num_sms=num_sms, swizzle=swizzle, pingpong=pingpong, cluster_m=cluster_m,
                          pp_tile=pp_tile)
        return (kernel.launch_acc if acc_hook else kernel.launch), fake_args(dtype_name, acc_hook)

    return _compile_once(key, keep_ptx, make, f"the sm_90 GEMM ({dtype_name}, acc_hook={acc_hook}, swizzle={swizzle}, "
                         f"pingpong={pingpong}, cluster_m={cluster_m}, pp_tile={pp_tile})")


def _compile_once(key, keep_ptx: bool, make, what: str):
    """The compiled function cached under ``key`` (unless keep_ptx), else compiled once under the
    lock from ``make()``'s (entry, args) (made before the compile, so their errors raise as they
    are), a failed compile a RuntimeError naming ``what``."""
    fn = _compiled.get(key)
    if fn is not None and not keep_ptx:
        return fn
    with _lock:
        fn = _compiled.get(key)
        if fn is not None and not keep_ptx:
            return fn
        entry, args = make()
        cute = toolchain.import_cutlass(ARCH)
        from . import compiler

        with compiler.compile_options(ARCH, keep_ptx) as options:
            try:
                fn = cute.compile(entry, *args, options=options)
            except Exception as exc:
                raise RuntimeError(f"mxq: compiling {what} for {ARCH} failed: {exc}") from exc
        if not keep_ptx:
            _compiled[key] = fn
        return fn


class Kernel(NamedTuple):
    """The kernel a GEMM launch runs (kernel_for): GemmSm90's ``pingpong``, the output tile (M, N)
    of that form, the tile order (GemmSm90's ``swizzle``), CTAs per cluster (``cluster_m``) and
    whether op.gemm's rowwise FP8 data goes through shared memory by TMA (``stage_rows``)."""

    pingpong: bool
    tile: tuple
    order: int
    cluster_m: int
    stage_rows: bool = False


def kernel_for(op=None, m: int | None = None, n: int | None = None, k: int | None = None, device=None) -> Kernel:
    """The kernel gemm() (``op`` None) or op.gemm of ``op`` runs for an [M, K] x [N, K] GEMM (a
    dimension None: not known, e.g. op.asm's compile; ``device``: any CUDA device, the same rule):

    - PINGPONG set (benchmarks, tests): that form on PP_TILE, cooperative where PP_TILE does not
      serve the op (``serves``);
    - else ping-pong on WIDE_TILE where the op's epilogue reads the accumulator alone
      (``wide_serves``) and K is at most WIDE_MAX_K, cooperative otherwise (the faster at every
      large shape on the H100 and the H200: docs/performance.md).

    The order: ORDER where set; on WIDE_TILE wide_order's (bands along N where they divide the M
    clusters); else swizzle_for's (by N and the tile's columns). Clusters: cluster_for's. Staged
    rowwise stores: stages_rows'."""
    if PINGPONG is not None:
        pingpong = PINGPONG and serves(op, PP_TILE)
        tile = PP_TILE if pingpong else COOPERATIVE_TILE
    else:
        pingpong = (k is None or k <= WIDE_MAX_K) and wide_serves(op)
        tile = WIDE_TILE if pingpong else COOPERATIVE_TILE
    cluster_m = cluster_for(tile[0], m)
    if ORDER is not None:
        order = ORDER
    elif pingpong and tile == WIDE_TILE:
        order = wide_order(m, n, cluster_m)
    else:
        order = 1 if n is None else swizzle_for(n, tile[1])
    return Kernel(pingpong, tile, order, cluster_m, stages_rows(op, n))


def stages_rows(op, n: int | None = None) -> bool:
    """Whether op.gemm of ``op`` (None: the plain GEMM, never) stores its rowwise FP8 data through
    shared memory by TMA (GemmSm90's ``stage_rows``): STAGE_ROWS where set, else wherever it can:
    an op writing the rowwise copy alone (with the colwise copy's exchange the staged kernels
    spill, local ptxas), N a multiple of STAGE_ALIGN (a TMA row pitch; N unknown, as op.asm's
    compile: staged)."""
    if op is None or not op.spec.rowwise or op.spec.colwise or (n is not None and n % STAGE_ALIGN):
        return False
    return True if STAGE_ROWS is None else STAGE_ROWS


def wide_order(m: int | None, n: int | None, cluster_m: int) -> int:
    """WIDE_TILE's tile order for an [M, N] output in clusters of ``cluster_m``: bands of the
    largest of SWIZZLES (up to -WIDE_ORDER) clusters of M tiles moving along N (GemmSm90's
    swizzle < 0) whose padding stays within 1/WIDE_MAX_PAD of the clusters (the scheduler pads the
    M clusters to a multiple of the band, and a padding tile runs its whole K loop on zeros: one
    cluster as a band of 8 took 4.3x the time of plain order on an H100); where none does,
    swizzle_for's order along M (bands of one cluster along N were slower: 151 against 110 us at
    640 x 14336 x 4096). M unknown: WIDE_ORDER."""
    if m is None:
        return WIDE_ORDER
    clusters = -(-(-(-m // WIDE_TILE[0])) // cluster_m)
    for band in SWIZZLES:
        if 1 < band <= -WIDE_ORDER and (-(-clusters // band) * band - clusters) * WIDE_MAX_PAD <= clusters:
            return -band
    return 1 if n is None else swizzle_for(n, WIDE_TILE[1])


def serves(op, tile) -> bool:
    """Whether a ping-pong ``tile`` (M, N) serves op.gemm of ``op`` (None: the plain GEMM, always):
    its rowwise blocks lie inside the tile's columns (gemm_quant reduces a row's block in one
    tile: FP8 block scaling's 1x128 not in 192) and its colwise blocks inside a warpgroup's part
    (WG_ROWS: FP8 block scaling's 128 rows not)."""
    if op is None:
        return True
    fmt = op.spec.block_format
    return tile[1] % fmt.block[1] == 0 and not (op.spec.colwise and fmt.col_block[0] > WG_ROWS)


def wide_serves(op, tile: tuple = WIDE_TILE) -> bool:
    """Whether a ping-pong ``tile`` of 192 accumulators a thread (WIDE_TILE, which kernel_for
    takes: 128 x 192) serves op.gemm of ``op`` without spills (None: the plain GEMM, always): the
    tile serves it, and its epilogue reads the accumulator alone, rowwise, with neither dact nor
    dbias (192 accumulators a thread leave the epilogue no more registers: an operand's loads, the
    colwise copy, dact's input or dbias's sums spill, local ptxas, sm_90a)."""
    if op is None:
        return True
    spec = op.spec
    return (serves(op, tile) and not spec.colwise and not spec.dbias and spec.dact is None
            and len(op.epilogue.tensor_params) == 1)


def cluster_for(tile_rows: int | None = None, m: int | None = None) -> int:
    """CTAs per cluster of a kernel whose tiles have ``tile_rows`` rows, for a GEMM of ``m`` rows:
    CLUSTER_M, but 1 where clusters would pad the M tiles by a whole tile in more than an
    eighth: an odd count below CLUSTER_MIN_ODD_TILES (a decode-sized M of one tile would run
    twice the CTAs, half of them on zeros, and beyond 66 N tiles twice the waves). ``m`` None:
    CLUSTER_M (the compile of a given cluster, benchmarks, tests)."""
    if m is None or CLUSTER_M == 1:
        return CLUSTER_M
    tiles = -(-m // tile_rows)
    return CLUSTER_M if tiles % CLUSTER_M == 0 or tiles >= CLUSTER_MIN_ODD_TILES else 1


def swizzle_for(n: int, tile_n: int = COOPERATIVE_TILE[1]) -> int:
    """The tile order for N columns in tiles of ``tile_n``: groups of the largest of SWIZZLES N
    tiles that divides their count (a wave of persistent CTAs then shares A's rows across a few W
    tiles instead of streaming all of A once per W tile; a count no group divides runs in plain
    order rather than pay for padding tiles)."""
    tiles = -(-n // tile_n)
    return next(s for s in SWIZZLES if tiles % s == 0)


def gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, acc_out: torch.Tensor | None = None):
    """D = a @ w^T on an sm_90 GPU (a [M, K], w [N, K], K-major bf16/fp16) into ``out`` (allocated
    if None); ``acc_out``: also the fp32 accumulator (a test hook). Returns D."""
    check_args(a, w, out, acc_out)
    if a.device.type != "cuda":
        raise ValueError(f"mxq.gemm: a must be a CUDA tensor, got device {a.device}")
    if out is None:
        out = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
    if a.shape[0] == 0 or w.shape[0] == 0:
        return out
    num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    kern = kernel_for(None, a.shape[0], w.shape[0], a.shape[1], a.device)
    fn = compile_gemm(DTYPES[a.dtype], acc_out is not None, num_sms, swizzle=kern.order, pingpong=kern.pingpong,
                      cluster_m=kern.cluster_m, pp_tile=kern.tile if kern.pingpong else None)
    with torch.cuda.device(a.device):
        fn(a, w, out, *(() if acc_out is None else (acc_out,)))
    return out


# --- op.gemm: the GEMM whose epilogue is an op (mxq/kernels/gemm_quant.py) ---------------------------
OPERAND_KINDS = ("full", "row", "col", "scalar")  # operands.py's kinds launch_gemm takes (not strided views)


def operand_names(op) -> tuple:
    """The names of op.gemm's operands, as its callers pass them: the epilogue's tensors after the
    accumulator, then a dact op's act_input."""
    return (*op.epilogue.arg_names[1:], "act_input")


def operand_kinds(a, w, operands, names) -> tuple:
    """Each operand's layout kind against the GEMM's [M, N] (operands.kind_of), checked by name
    (``names``: operand_names): a tensor of a's dtype on a's device, full ones contiguous; raise
    otherwise."""
    m, n = a.shape[0], w.shape[0]
    kinds = []
    for t, name in zip(operands, names):
        name = f"argument {name!r}"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mxq: op.gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        kind = operands_mod.kind_of(t.shape, m, n, (m, n))
        if kind is None:
            raise ValueError(f"mxq: op.gemm: {name} of shape {tuple(t.shape)} does not broadcast against the "
                             f"GEMM's [M, N] = {(m, n)} (full [M, N], row [N], column [M, 1] or a scalar)")
        if t.dtype != a.dtype:
            raise TypeError(f"mxq: op.gemm: {name} must have a's dtype {a.dtype}, got {t.dtype}")
        if t.device != a.device:
            raise ValueError(f"mxq: op.gemm: {name} must be on a's device {a.device}, got {t.device}")
        if kind == "full" and not t.is_contiguous():
            raise ValueError(f"mxq: op.gemm: {name} (full [M, N]) must be contiguous, got strides {t.stride()}")
        kinds.append(kind)
    return tuple(kinds)


def check_act_input(op, a, w, act_input):
    """A dact op's ``act_input`` for op.gemm, checked by name: an [M, N] tensor of a's dtype on
    a's device, contiguous (the kernel reads it as one more full operand); refused for an op
    without dact."""
    name = op.__name__
    if op.spec.dact is None:
        raise ValueError(f"mxq: {name}.gemm: act_input= is a dact op's (the forward's pre-activation); {name} has "
                         "no dact")
    if act_input is None:
        raise ValueError(f"mxq: {name}.gemm: dact={op.spec.dact!r} needs act_input= (the forward's pre-activation, "
                         f"[M, N] in a's dtype)")
    if not isinstance(act_input, torch.Tensor):
        raise TypeError(f"mxq: {name}.gemm: act_input must be a torch.Tensor, got {type(act_input).__name__}")
    shape = (a.shape[0], w.shape[0])
    if tuple(act_input.shape) != shape or act_input.dtype != a.dtype:
        raise ValueError(f"mxq: {name}.gemm: act_input must be [M, N] = {shape} in a's dtype {a.dtype}, got "
                         f"{act_input.dtype} {tuple(act_input.shape)}")
    if act_input.device != a.device:
        raise ValueError(f"mxq: {name}.gemm: act_input must be on a's device {a.device}, got {act_input.device}")
    if not act_input.is_contiguous():
        raise ValueError(f"mxq: {name}.gemm: act_input must be contiguous, got strides {act_input.stride()}")
    return act_input


def fake_gemm_args(op, dtype_name: str, kinds: tuple, acc_hook: bool, stage_rows: bool = False):
    """The compile-time arguments of a module's ``launch_gemm`` (codegen._gemm_launcher_text):
    A and W as fake_args' (N a multiple of STAGE_ALIGN with ``stage_rows``), the operands as [M, N] views of their kinds (broadcast dims of stride
    0), the floats, FP8 data [M, N] (bytes; a colwise-only op's: one byte of zero strides as
    [M, N]), the flat scale buffer (E8M0 bytes or fp32), the amax slot (fp32 [1]; written where
    the op has amax), with the colwise copy its data ([M, N], or [N, M] transposed) and flat
    scales, with dbias its [N] output, fp32
    workspace [ceil(M / 16), N] and zero noop (DBIAS_ROWS), the fp32 accumulator (or, without the
    hook, the data again)."""
    cute = toolchain.import_cutlass(ARCH)
    import cutlass

    el = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[dtype_name]
    m, k = cute.sym_int(), cute.sym_int(divisibility=ALIGN)
    n = cute.sym_int(divisibility=STAGE_ALIGN if stage_rows else ALIGN)
    fake = cute.runtime.make_fake_compact_tensor
    args = [fake(el, (m, k), stride_order=(1, 0), assumed_align=16),
            fake(el, (n, k), stride_order=(1, 0), assumed_align=16)]
    for kind in kinds:  # (read an element at a time: any element-aligned address)
        stride = (n, 1) if kind == "full" else operands_mod.BROADCAST_STRIDES[kind]
        args.append(cute.runtime.make_fake_tensor(el, (m, n), stride=stride, assumed_align=2))
    args += [cutlass.Float32(0.0)] * gated.launch_scalars(op.epilogue)
    scale_el, scale_align = (cutlass.Float32, 4) if op.spec.block_format.scale == "fp32" else (cutlass.Uint8, 1)
    if op.spec.rowwise:
        data = fake(cutlass.Uint8, (m, n), stride_order=(1, 0), assumed_align=16)
    else:  # (a colwise-only op: a byte of zero strides stands for [M, N], the shape the kernel tiles)
        data = cute.runtime.make_fake_tensor(cutlass.Uint8, (m, n), stride=(0, 0), assumed_align=1)
    args += [data, fake(scale_el, (cute.sym_int(),), assumed_align=scale_align),
             fake(cutlass.Float32, (1,), assumed_align=4)]  # (the amax slot: written where the op has amax)
    if op.spec.colwise:  # the colwise data ([M, N], or the transposed [N, M]) and its flat scales
        shape = (n, m) if op.spec.colwise_transposed else (m, n)
        args += [fake(cutlass.Uint8, shape, stride_order=(1, 0), assumed_align=16),
                 fake(scale_el, (cute.sym_int(),), assumed_align=scale_align)]
    if op.spec.dbias:  # dbias [N], its fp32 partials [ceil(M / 16), N] (rows of any stride), the zero noop
        args += [fake(el, (n,), assumed_align=2),
                 cute.runtime.make_fake_tensor(cutlass.Float32, (cute.sym_int(), n), stride=(cute.sym_int(), 1),
                                               assumed_align=4),
                 fake(cutlass.Float32, (1,), assumed_align=4)]
    args.append(fake(cutlass.Float32, (m, n), stride_order=(1, 0), assumed_align=16) if acc_hook else data)
    return args


def compile_gemm_op(op, dtype_name: str, kinds: tuple, acc_hook: bool, num_sms: int, swizzle: int,
                    keep_ptx: bool = False, pingpong: bool = False, cluster_m: int | None = None,
                    pp_tile: tuple | None = None, stage_rows: bool = False):
    """The compiled ``launch_gemm`` of ``op``'s rendered module (cached in memory by its source,
    dtype, operand kinds, hook, SM count, tile order, form, cluster, ping-pong tile (None:
    PP_TILE) and staged rowwise stores, unless keep_ptx)."""
    from . import compiler

    cluster_m = CLUSTER_M if cluster_m is None else cluster_m
    pp_tile = PP_TILE if pp_tile is None else tuple(pp_tile)
    want = len(op.epilogue.tensor_params) - 1 + (op.spec.dact is not None)
    if len(kinds) != want:  # (launch_gemm's tensors: the epilogue's after the accumulator, then act_input)
        raise ValueError(f"mxq: compile_gemm_op: {op.__name__} takes {want} operand kind(s) (the epilogue's "
                         f"tensors after the accumulator{', then act_input' if op.spec.dact else ''}), got {kinds}")
    source = op.source
    # (the source itself: op.source is kept on the op, and a str caches its hash, so a call's lookup
    # hashes nothing)
    key = ("op", source, dtype_name, kinds, acc_hook, num_sms, swizzle, pingpong, cluster_m, pp_tile, stage_rows)

    def make():
        cute = toolchain.import_cutlass(ARCH)
        args = fake_gemm_args(op, dtype_name, kinds, acc_hook, stage_rows)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)  # (after the compile-time options)
        return compiler.load_module(source).launch_gemm, (*args, acc_hook, num_sms, swizzle, pingpong, cluster_m,
                                                           pp_tile, stage_rows, stream)

    return _compile_once(key, keep_ptx, make, f"op.gemm of {op.__name__} ({dtype_name}, operands {kinds}, "
                         f"acc_hook={acc_hook}, pingpong={pingpong}, cluster_m={cluster_m}, pp_tile={pp_tile}, "
                         f"stage_rows={stage_rows})")


def gemm_op(op, a, w, operands, scalars, out, acc_out=None):
    """op.gemm on CUDA: ``out`` (an MXFP8Tensor of op's spec, [M, N], contiguous data) from a @ w^T
    through the op's epilogue (launch_gemm); ``acc_out``: also the fp32 accumulator. Arguments
    checked by the caller (op.gemm, check_args, operand_kinds)."""
    kinds = operand_kinds(a, w, operands, operand_names(op))
    if a.shape[0] == 0 or w.shape[0] == 0:
        for t, owned in ((out.amax, op.spec.amax), (out.dbias, op.spec.dbias)):  # (0, as the reference's)
            if owned:
                t.zero_()
        return out
    num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    kern = kernel_for(op, a.shape[0], w.shape[0], a.shape[1], a.device)
    fn = compile_gemm_op(op, DTYPES[a.dtype], kinds, acc_out is not None, num_sms, kern.order, pingpong=kern.pingpong,
                         cluster_m=kern.cluster_m, pp_tile=kern.tile if kern.pingpong else None,
                         stage_rows=kern.stage_rows)
    m, n = a.shape[0], w.shape[0]
    views = [operands_mod.as_matrix(t.detach(), kind, m, n) for t, kind in zip(operands, kinds)]
    colwise = ()
    if op.spec.colwise:
        colwise = (out.colwise_data.view(torch.uint8), launch.flat_scale(out.colwise_scale))
    if op.spec.rowwise:
        data, scale = out.rowwise_data.view(torch.uint8), launch.flat_scale(out.rowwise_scale)
    else:  # (no rowwise copy: a byte of the colwise data at zero strides gives the kernel [M, N]; never written)
        data, scale = colwise[0].as_strided((m, n), (0, 0)), colwise[1]
    if op.spec.amax:  # (the epilogue's atomics grow it from 0: an out= given holds whatever it held)
        amax = out.amax.view(1)
        amax.zero_()
    else:  # (not written: the kernel has no amax)
        amax = launch.noop_tensor(a.device)
    reduction = ()
    if op.spec.dbias:  # (each warp's 16-row stripe a row of partials, reduced after the GEMM)
        ws = torch.empty((-(-m // DBIAS_ROWS), n), dtype=torch.float32, device=a.device)
        reduction = (out.dbias, ws, launch.noop_tensor(a.device))
    with torch.cuda.device(a.device):  # (detached: DLPack exports no tensor that requires grad)
        fn(a.detach(), w.detach(), *views, *[float(s) for s in scalars], data, scale, amax, *colwise, *reduction,
           data if acc_out is None else acc_out)
    return out
