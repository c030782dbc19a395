"""The sm_90 GEMM (mxq/kernels/gemm_sm90.py, mxq/runtime/gemm.py).

CPU: the kernel compiles to sm_90a PTX holding wgmma and TMA loads, with and without the fp32
accumulator hook, in both forms (cooperative, and ``pingpong``: its mainloops ordered by a named
barrier pair, whose protocol is also simulated on ints); the kernel CuTeDSL assembles stays
within the setmaxnreg budget with no local memory (cuobjdump); bad arguments raise before any
launch, naming the argument; bench/gemm.py's cases and tolerances (the tolerances checked on an
fp32 CPU matmul, and a planted wrong K tile caught); W multicast to clusters of two and the
barriers' counts, and where clusters are taken (cluster_for). GPU (marked ``gpu``), each form in
clusters of two and without: D and the accumulator against a float64 matmul on full and partial
tiles, fp16, ``out=`` into a view, and empty M.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


import pytest
import torch

import mxq
from mxq.runtime import gemm as g
from mxq.runtime import inspection

from .test_codegen import _bench_tool


FORMS = [False, True]  # GemmSm90's pingpong


def _form(pingpong):
    return "pingpong" if pingpong else "cooperative"


@pytest.fixture(scope="module")
def ptx():
    """PTX of both variants (bf16), by hook; [hook, pingpong] for both forms."""
    out = {hook: g.compile_gemm("bf16", acc_hook=hook, keep_ptx=True).__ptx__ for hook in (False, True)}
    out.update({(hook, pp): out[hook] if not pp else
                g.compile_gemm("bf16", acc_hook=hook, keep_ptx=True, pingpong=True).__ptx__
                for hook in (False, True) for pp in FORMS})
    return out


def init_counts(ptx: str) -> set:
    """The arrival counts the PTX's mbarrier.init instructions set (immediates, or registers
    moved from one)."""
    counts = set()
    for reg_or_imm in re.findall(r"mbarrier\.init\.\S+\s+\[[^\]]+\],\s*([^;]+);", ptx):
        v = reg_or_imm.strip()
        if not v.isdigit():
            v = re.search(rf"mov\.[bu]32\s+{re.escape(v)},\s*(\d+);", ptx).group(1)
        counts.add(int(v))
    return counts


def _ident(x):
    return x


def _plus(x, b):
    return x + b


def test_the_kernel_rule_is_the_same_on_every_gpu(monkeypatch):
    """kernel_for: 128 x 192 ping-pong in bands along N for the plain GEMM and ops reading the
    accumulator alone at K <= WIDE_MAX_K, the cooperative form otherwise (1x128 blocks do not fit
    192 columns, 128-row colwise blocks no ping-pong tile), whatever the device (it timed fastest
    on the H100 and the H200); PINGPONG, where set, forces 64 x 256 ping-pong where it serves."""
    blocks128 = mxq.fused_quant(format="fp8_block", colwise=True)(_ident)
    rows = mxq.fused_quant(format="fp8_block")(_ident)
    mx = mxq.fused_quant(act="gelu")(_ident)
    mx_both = mxq.fused_quant(act="gelu", colwise=True)(_ident)
    bias = mxq.fused_quant(act="gelu")(_plus)
    monkeypatch.setattr(g, "PINGPONG", None)
    # (op.gemm's rowwise data staged for TMA stores: kernel_for's stage_rows, stages_rows' rule)
    wide = g.Kernel(True, g.WIDE_TILE, g.WIDE_ORDER, 2)
    for device in (None, 0, 1):
        assert g.kernel_for(None, 8192, 14336, 4096, device) == wide == g.kernel_for(
            mx, 8192, 14336, 8192, device)._replace(stage_rows=False)
        assert g.kernel_for(mx, 8192, 14336, 14336, device) == g.Kernel(False, g.COOPERATIVE_TILE, 8, 2, True)
        assert g.kernel_for(None, 8192, 14336, 14336, device).pingpong is False
        for op in (mx_both, bias, rows, blocks128):  # (not the accumulator alone; 1x128; 128-row colwise blocks)
            assert not g.kernel_for(op, 8192, 14336, 4096, device).pingpong, op
        # the wide tile's order pads no more than 1/WIDE_MAX_PAD of the M clusters: a decode-sized M in plain order
        assert g.kernel_for(mx, 64, 14336, 4096, device) == g.Kernel(True, g.WIDE_TILE, 1, 1, True)
    monkeypatch.setattr(g, "PINGPONG", True)  # (forced: 64 x 256 ping-pong wherever it serves the op, order by N)
    assert g.kernel_for(mx, 8192, 14336, 14336) == g.Kernel(True, g.PP_TILE, 8, 2, True) == g.kernel_for(
        bias, 8192, 14336, 4096)
    assert g.kernel_for(mx, 64, 8, 8) == g.Kernel(True, g.PP_TILE, 1, 1)  # (one M tile: no cluster; N % 16 != 0)
    assert g.kernel_for(rows, 8192, 14336, 4096).pingpong and not g.kernel_for(blocks128, 8192, 14336, 4096).pingpong
    monkeypatch.setattr(g, "PINGPONG", False)
    assert not g.kernel_for(mx, 8192, 14336, 4096).pingpong


def test_wide_order_bands_along_n_pad_little():
    """wide_order: bands of 8, 4 or 2 clusters of 128-row tiles along N where the band pads the M
    clusters by at most 1/WIDE_MAX_PAD (hand values: 64 clusters -> 8, 4 -> 4, 33 -> 2), else the
    order along M by N (1 cluster, 5, 9: swizzle_for of 14336 / 192 = 75 tiles, 1); M unknown:
    WIDE_ORDER. Over every M the padding bound holds and a band divides where one of 8 does."""
    assert (g.WIDE_ORDER, g.WIDE_MAX_PAD, g.WIDE_TILE) == (-8, 16, (128, 192))
    for m, cluster, want in ((8192, 2, -8), (16384, 2, -8), (1024, 2, -4), (8320, 2, -2), (64, 1, 1), (640, 1, 1),
                             (2304, 2, 1), (8192, 1, -8), (128 * 12, 1, -4)):
        assert g.wide_order(m, 14336, cluster) == want, (m, cluster)
    assert g.wide_order(None, None, 2) == -8 and g.wide_order(2304, 4096, 2) == g.swizzle_for(4096, 192) == 2
    for m in range(1, 66000, 61):
        clusters = -(-(-(-m // 128)) // 2)
        order = g.wide_order(m, 14336, 2)
        if order < 0:
            assert (-(-clusters // -order) * -order - clusters) * 16 <= clusters, m
        if clusters % 8 == 0:
            assert order == -8, m


def test_cluster_for_pairs_the_m_tiles():
    """Clusters of two where the M tiles (64 rows ping-pong, 128 cooperative) pair up or are
    at least CLUSTER_MIN_ODD_TILES (9: one padding tile in ten at most); a small odd count runs
    unclustered (one tile of M: half the CTAs would compute zeros); CLUSTER_M = 1 never."""
    assert (g.CLUSTER_M, g.CLUSTER_MIN_ODD_TILES) == (2, 9)
    for rows in (64, 128):
        for tiles, want in ((1, 1), (2, 2), (3, 1), (4, 2), (7, 1), (8, 2), (9, 2), (10, 2), (129, 2)):
            for m in (tiles * rows - (rows - 1), tiles * rows):  # (the first and the last M of that many tiles)
                assert g.cluster_for(rows, m) == want, (rows, m)
    assert g.cluster_for() == 2  # (no M: the compile of a given cluster)


@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
def test_forms_multicast_w_across_their_cluster(pingpong):
    """Either form with CLUSTER_M = 2: W's TMA loads multicast to the cluster, A's not; a stage's
    release arrives on the peer CTA's barrier too (mapa: its address in the cluster); the
    barriers' initialisation synced across the cluster. Without clusters none of it. GemmSm90
    refuses clusters other than 1 and 2."""
    from mxq.kernels.gemm_sm90 import GemmSm90

    assert g.CLUSTER_M == 2 and g.cluster_for() == 2
    text = g.compile_gemm("bf16", keep_ptx=True, pingpong=pingpong).__ptx__
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\.\S+", text)
    assert sum("multicast::cluster" in x for x in loads) == len(loads) // 2 > 0  # (W's half of the loads)
    assert "mapa.shared::cluster" in text and "barrier.cluster.arrive" in text and "barrier.cluster.wait" in text
    plain = g.compile_gemm("bf16", keep_ptx=True, pingpong=pingpong, cluster_m=1).__ptx__
    assert "multicast" not in plain and "mapa" not in plain and "barrier.cluster" not in plain
    # the empty barriers count every consumer warp of the cluster (4 a warpgroup, one or two warpgroups
    # a stage, one or two CTAs); the full ones the producer's one arrival
    warps = 4 if pingpong else 8
    assert init_counts(text) == {1, 2 * warps} and init_counts(plain) == {1, warps}
    with pytest.raises(ValueError, match="cluster_m"):
        GemmSm90(cluster_m=3, pingpong=pingpong)


@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
@pytest.mark.parametrize("hook", [False, True])
def test_compiles_to_sm90a_ptx_with_wgmma_and_tma(ptx, hook, pingpong):
    text = ptx[hook, pingpong]
    assert re.search(r"^\.target sm_90a", text, re.M)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in text
    assert "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes" in text  # (A's)
    assert "setmaxnreg.dec" in text and "setmaxnreg.inc" in text  # producer / consumer warpgroups
    assert "mbarrier.try_wait" in text  # the stages' full / empty barriers


def _ptxas_output(text) -> str:
    """ptxas -v's report of PTX ``text`` for sm_90a (inspection.run_ptxas), asserting it assembled."""
    with tempfile.TemporaryDirectory() as d:
        rc, out, _ = inspection.run_ptxas(text, "sm_90a", Path(d) / "k.cubin")
    assert rc == 0, out[-2000:]
    return out


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs a local ptxas")
@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
@pytest.mark.parametrize("hook", [False, True])
def test_ptxas_keeps_wgmmas_pipelined_without_spills(ptx, hook, pingpong):
    """The local ptxas assembles the kernel with no spills and without serialising the wgmmas
    (its C7514 warning: a non-wgmma instruction reading the accumulators while a wgmma group is in
    flight, which an edge store of single elements caused)."""
    out = _ptxas_output(ptx[hook, pingpong])
    assert "C7514" not in out and "serialized" not in out, out[-2000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in out
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    assert regs <= 65536 // 384  # (384 threads at launch, before setmaxnreg moves registers between warpgroups)


def test_fp16_compiles_to_f16_wgmma():
    text = g.compile_gemm("fp16", keep_ptx=True).__ptx__
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in text


def test_d_leaves_as_bf16_pairs_and_the_hook_adds_fp32_stores(ptx):
    """D leaves as 32-bit bf16 pairs (full tiles and edge tiles alike: a pair never straddles
    N, a multiple of 8); the hook variant also stores the fp32 accumulator (pairs as v2.b32)."""
    plain = re.findall(r"st\.global[\w.]*", ptx[False])
    assert plain and set(plain) == {"st.global.b32"}
    assert "st.global.v2.b32" in ptx[True]


def test_pingpong_orders_the_mainloops_with_a_named_barrier_pair(ptx):
    """The ping-pong form: one 256-thread bar.sync (a warpgroup waits for its turn) and two
    bar.arrive (warpgroup 0 opens its own barrier once; each warpgroup signals the other's after
    its last wgmmas are issued, before it waits for them); five 40 KiB stages of a 64-row A tile
    (W's stages start after 5 x 64 x 64 bf16 of A, at 1024 + 40960). The cooperative form has
    no named barrier and four 48 KiB stages (W after 4 x 128 x 64 bf16 of A)."""
    for hook in (False, True):
        coop, pp = ptx[hook, False], ptx[hook, True]
        assert not re.search(r"\bbar\.(sync|arrive)\s+%r", coop)
        assert len(re.findall(r"\bbar\.sync\s+%r\d+, 256;", pp)) == 1
        arrives = [m.start() for m in re.finditer(r"\bbar\.arrive\s+%r\d+, 256;", pp)]
        assert len(arrives) == 2
        last_wait = [m.start() for m in re.finditer(r"wgmma\.wait_group\.sync\.aligned\s+0;", pp)]
        assert len(last_wait) == 1 and arrives[1] < last_wait[0]
        assert "wgmma" not in pp[arrives[1]:last_wait[0]]
        assert pp.index("wgmma.mma_async") < arrives[1]
        assert coop.count("mbarrier.init.shared.b64") == 2 * 4 and pp.count("mbarrier.init.shared.b64") == 2 * 5
        tma = r"cp\.async\.bulk\.tensor\.2d[^\n]*\[%r\d+\+{}\]"
        assert re.search(tma.format(1024 + 5 * 64 * 64 * 2), pp)
        assert re.search(tma.format(1024 + 4 * 128 * 64 * 2), coop)


def _simulate_pingpong(tiles: int, k_tiles: int):
    """The ping-pong consumers' protocol (GemmSm90.consume / mainloop) run on ints against a model
    of named barriers (128 threads a warpgroup: a phase completes at 2 warpgroups' arrivals, a
    bar.sync arriving too and waiting for its phase to complete). Returns the mainloops in the
    order they ran, as (warpgroup, CTA-local tile, the stage counts it read)."""
    from mxq.kernels.gemm_sm90 import CONSUMER_WGS, ordered_barrier_ids

    count, phase = {}, {}  # barrier id -> arrivals on its current phase, phases completed
    order = []

    def arrive(bar):
        count[bar] = count.get(bar, 0) + 1
        if count[bar] == CONSUMER_WGS:
            count[bar] = 0
            phase[bar] = phase.get(bar, 0) + 1

    def consumer(wg):
        wait_id, signal_id = ordered_barrier_ids(wg)
        if wg == 0:
            arrive(wait_id)
        read, j = k_tiles * wg, wg
        while j < tiles:
            done = phase.get(wait_id, 0)
            arrive(wait_id)  # (bar.sync: arrive, then wait for the phase to complete)
            while phase.get(wait_id, 0) == done:
                yield "blocked"
            order.append((wg, j, list(range(read, read + k_tiles))))
            read += k_tiles
            arrive(signal_id)
            yield "epilogue"
            read += k_tiles
            j += CONSUMER_WGS

    runs = [consumer(0), consumer(1)]
    live = list(runs)
    for _ in range(100 * (tiles + 2)):
        for r in list(live):
            if next(r, None) is None:
                live.remove(r)
        if not live:
            return order
    raise AssertionError(f"deadlock with {tiles} tiles: {order}")


@pytest.mark.parametrize("tiles", [0, 1, 2, 3, 4, 7, 10])
def test_pingpong_barrier_pair_alternates_the_mainloops_in_schedule_order(tiles):
    """Simulated on ints: whatever the CTA's tile count, the mainloops run in the producer's tile
    order (tile j by warpgroup j % 2, alternating), each reading exactly the stages the producer
    filled for that tile (j k_tiles .. (j + 1) k_tiles - 1), and nothing deadlocks."""
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)
    for k_tiles in (1, 3, 64):
        order = _simulate_pingpong(tiles, k_tiles)
        assert order == [(j % 2, j, list(range(j * k_tiles, (j + 1) * k_tiles))) for j in range(tiles)]


def test_ordered_barrier_ids_are_a_pair_of_named_barriers():
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)
    from mxq.kernels.gemm_sm90 import ordered_barrier_ids

    (w0, s0), (w1, s1) = ordered_barrier_ids(0), ordered_barrier_ids(1)
    assert (w0, s0) == (s1, w1) and w0 != w1  # each signals the barrier the other waits on
    assert {w0, w1} <= set(range(1, 16))  # named barriers; 0 is __syncthreads'


CUOBJDUMP = shutil.which("cuobjdump") or os.environ.get("MXQ_CUOBJDUMP")


def cubin_resources(monkeypatch, compile_fn) -> dict:
    """cuobjdump's resource line of the cubin ``compile_fn()`` produces (CuTeDSL's own ptxas:
    what would run), with ``max_reg``: the highest register its SASS names, and ``local``: its
    local-memory instructions."""
    import contextlib
    import shlex

    from mxq.runtime import compiler

    with tempfile.TemporaryDirectory() as d:
        @contextlib.contextmanager
        def options(arch, keep_ptx):
            yield f"--enable-tvm-ffi --gpu-arch {arch} --keep-cubin --dump-dir {shlex.quote(d)}"

        monkeypatch.setattr(compiler, "compile_options", options)
        compile_fn()
        cubins = list(Path(d).glob("*.cubin"))
        assert len(cubins) == 1, cubins
        res = subprocess.run([CUOBJDUMP, "-res-usage", str(cubins[0])], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", str(cubins[0])], capture_output=True, text=True).stdout
    line = re.search(r"Function \S+:\n\s*(REG:.*)", res).group(1)
    out = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
    out["max_reg"] = max(int(r) for r in re.findall(r"\bR(\d+)\b", sass))
    out["local"] = len(re.findall(r"\b(LDL|STL)\b", sass))
    return out


def assert_within_budget(res: dict):
    """The launch's registers fit 384 threads, the consumers' code the setmaxnreg budget (the
    highest register named below CONSUMER_REGS), and no stack or local memory (no spills)."""
    from mxq.kernels.gemm_sm90 import CONSUMER_REGS, CONSUMER_WGS, THREADS_PER_WG

    assert res["REG"] <= 65536 // (THREADS_PER_WG * (1 + CONSUMER_WGS)), res
    assert res["max_reg"] < CONSUMER_REGS, res
    assert res["STACK"] == 0 and res["LOCAL"] == 0 and res["local"] == 0, res


@pytest.mark.skipif(CUOBJDUMP is None, reason="needs cuobjdump (PATH or MXQ_CUOBJDUMP)")
@pytest.mark.parametrize("pingpong", FORMS, ids=_form)
def test_cubin_registers_within_the_setmaxnreg_budget_without_local_memory(monkeypatch, pingpong):
    res = cubin_resources(monkeypatch, lambda: g.compile_gemm("bf16", keep_ptx=True, pingpong=pingpong))
    assert_within_budget(res)


@pytest.mark.skipif(CUOBJDUMP is None, reason="needs cuobjdump (PATH or MXQ_CUOBJDUMP)")
def test_wide_tile_within_the_setmaxnreg_budget_without_local_memory(monkeypatch):
    """The 128 x 192 ping-pong tile (192 accumulators a thread) in bands along N, as kernel_for
    launches it on an H100: the plain GEMM and op.gemm of what it takes there (gelu + MXFP8
    rowwise reading the accumulator alone, with its amax) fit the consumers' registers with no
    local memory; an op it does not take (a bias row: its loads) is refused by wide_serves."""
    gelu = mxq.fused_quant(act="gelu")(_ident)
    gelu_amax = mxq.fused_quant(act="gelu", amax=True)(_ident)
    assert g.wide_serves(gelu) and g.wide_serves(gelu_amax) and not g.wide_serves(mxq.fused_quant(act="gelu")(_plus))
    res = cubin_resources(monkeypatch, lambda: g.compile_gemm("bf16", keep_ptx=True, pingpong=True,
                                                              swizzle=g.WIDE_ORDER, pp_tile=g.WIDE_TILE))
    assert_within_budget(res)
    for op in (gelu, gelu_amax):
        res = cubin_resources(monkeypatch, lambda op=op: g.compile_gemm_op(op, "bf16", (), False, 132, g.WIDE_ORDER,
                                                                           keep_ptx=True, pingpong=True,
                                                                           pp_tile=g.WIDE_TILE))
        assert_within_budget(res)


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize("args,match", [
    ((torch.zeros(16, 8), _bf16(16, 8)), r"a must be bfloat16 or float16"),
    ((_bf16(16, 8), torch.zeros(16, 8, dtype=torch.float16)), r"w must have a's dtype"),
    ((_bf16(16, 8), torch.zeros(16, 8, dtype=torch.int8)), r"w must be bfloat16 or float16"),
    ((_bf16(8, 16).T, _bf16(16, 8)), r"a must be K-major"),
    ((_bf16(16, 8), _bf16(8, 16).T), r"w must be K-major"),
    ((_bf16(16, 16)[:, :8], _bf16(16, 8)), r"a must be K-major and contiguous"),
    ((_bf16(16), _bf16(16, 8)), r"a must be 2-D"),
    ((_bf16(16, 8), _bf16(16, 16)), r"w must be \[N, K\] with a's K=8"),
    ((_bf16(16, 12), _bf16(16, 12)), r"K \(a.shape\[1\]\) must be a positive multiple of 8"),
    ((_bf16(16, 0), _bf16(16, 0)), r"K \(a.shape\[1\]\) must be a positive multiple of 8"),
    ((_bf16(16, 8), _bf16(12, 8)), r"N \(w.shape\[0\]\) must be a multiple of 8"),
    ((_bf16(17, 8).reshape(-1)[1:129].reshape(16, 8), _bf16(16, 8)), r"a must start on a 16-byte boundary"),
    (("x", _bf16(16, 8)), r"a must be a torch.Tensor"),
])
def test_bad_arguments_name_the_argument(args, match):
    with pytest.raises((TypeError, ValueError), match=match):
        g.check_args(*args)


@pytest.mark.parametrize("kw,match", [
    (dict(out=torch.zeros(16, 16)), r"out must be a torch.bfloat16 tensor of shape \(16, 16\)"),
    (dict(out=_bf16(16, 8)), r"out must be a torch.bfloat16 tensor of shape \(16, 16\)"),
    (dict(out=_bf16(16, 32)[:, :16]), r"out must be contiguous"),
    (dict(acc_out=_bf16(16, 16)), r"acc_out must be a torch.float32 tensor of shape \(16, 16\)"),
    (dict(acc_out=torch.zeros(16, 17)), r"acc_out must be a torch.float32 tensor"),
])
def test_bad_outputs_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        g.check_args(_bf16(16, 8), _bf16(16, 8), **kw)


def test_good_arguments_pass_and_cpu_tensors_are_refused_before_launch():
    a, w = _bf16(16, 8), _bf16(24, 8)
    g.check_args(a, w, out=_bf16(16, 24), acc_out=torch.zeros(16, 24))
    with pytest.raises(ValueError, match=r"a must be a CUDA tensor"):
        g.gemm(a, w)


def test_compile_once_caches_and_lets_argument_errors_escape(monkeypatch):
    """_compile_once: a hit builds nothing; keep_ptx compiles again and caches nothing; make()'s
    errors raise as they are; a failed compile is a RuntimeError naming what was compiled."""
    compiled, made = [], []

    class Cute:
        @staticmethod
        def compile(entry, *args, options=None):
            compiled.append(args)
            return entry(*args)

    monkeypatch.setattr(g.toolchain, "import_cutlass", lambda arch: Cute)
    monkeypatch.setattr(g, "_compiled", {})

    def make():
        made.append(1)
        return (lambda *a: ("fn", a)), (1, 2)

    assert g._compile_once(("k",), False, make, "x") == ("fn", (1, 2))
    assert g._compile_once(("k",), False, make, "x") == ("fn", (1, 2)) and len(made) == len(compiled) == 1
    g._compile_once(("k",), True, make, "x")
    g._compile_once(("p",), True, make, "x")
    assert len(compiled) == 3 and list(g._compiled) == [("k",)]
    with pytest.raises(ValueError, match="bad tile"):
        g._compile_once(("v",), False, lambda: (_ for _ in ()).throw(ValueError("bad tile")), "x")

    def boom(*a):
        raise TypeError("no")
    with pytest.raises(RuntimeError, match="mxq: compiling the thing for .* failed: no"):
        g._compile_once(("b",), False, lambda: (boom, ()), "the thing")
    assert ("v",) not in g._compiled and ("b",) not in g._compiled


def test_tile_order_groups_divide_the_n_tiles():
    from mxq.runtime import toolchain

    toolchain.import_cutlass(g.ARCH)  # (the kernel module imports cutlass: with the arch set first)
    from mxq.kernels.gemm_sm90 import PINGPONG_TILES, TILE, WG_ROWS

    assert g.COOPERATIVE_TILE == TILE[:2] and g.PP_TILE in PINGPONG_TILES and g.WG_ROWS == WG_ROWS
    assert g.WIDE_TILE in PINGPONG_TILES and g.WIDE_ORDER < 0
    assert [g.swizzle_for(n) for n in (8, 256, 512, 768, 1024, 4096, 14336, 28672, 2056)] == [1, 1, 2, 1, 4, 8, 8, 8, 1]
    for tile_n in (256, 192):
        for n in range(8, 40000, 8):
            tiles = -(-n // tile_n)
            s = g.swizzle_for(n, tile_n)
            assert tiles % s == 0 and all(tiles % t for t in g.SWIZZLES if t > s), n


def test_bench_cases_cover_the_shapes_and_partial_tiles():
    tool = _bench_tool("gemm")
    full = tool.cases()
    for m in (8192, 16384):
        for k, n in ((4096, 14336), (14336, 4096), (8192, 28672)):
            assert (m, n, k) in full
    assert (200, 136, 64) in full and (1000, 520, 4096) in full
    assert all(n % 8 == 0 and k % 8 == 0 for _, n, k in full)  # what TMA takes
    tile_m, tile_n, tile_k = 128, 256, 64
    assert any(m % tile_m for m, _, _ in full) and any(n % tile_n for _, n, _ in full)
    assert any(k % tile_k for _, _, k in full)
    assert set(tool.cases(quick=True)) < set(full)


def test_bench_tolerance_admits_fp32_accumulation_and_catches_a_wrong_k_tile():
    """The bounds hold for a true fp32 accumulation (torch's CPU fp32 matmul) and are tight
    enough to catch a missing K tile (the last 64 products of every element)."""
    tool = _bench_tool("gemm")
    a, w = tool.inputs(96, 40, 1024, device="cpu")
    ref, acc_tol, out_tol = tool.bounds(a, w)
    acc = a.float() @ w.float().T
    assert tool.violations(acc, ref, acc_tol, "acc") == []
    assert tool.violations(acc.to(torch.bfloat16), ref, out_tol, "D") == []
    short = a[:, :-64].float() @ w[:, :-64].float().T
    assert tool.violations(short, ref, acc_tol, "acc")
    assert tool.violations(short.to(torch.bfloat16), ref, out_tol, "D")
    one = acc.clone()
    one[95, 39] += float(acc_tol[95, 39]) * 2
    assert "[95,39]" in tool.violations(one, ref, acc_tol, "acc")[0]


def test_bench_case_errors_become_rows(monkeypatch):
    """A case that raises (here: no CUDA) prints and returns an error row; the run goes on."""
    tool = _bench_tool("gemm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    row = tool.run_case(200, 136, 64)
    assert row["name"] == "gemm_bf16 200x136x64" and "error" in row and row["K"] == 64
    assert tool.main([]) == 2


def test_bench_quack_row_keeps_each_config_and_the_best(monkeypatch):
    """quack's row (--quack): each config's D checked against float64 and timed; a config that
    raises or writes a wrong D keeps that as its entry and is not the best; the ratio is the
    best timed config's. Run on CPU tensors with a stand-in for quack's entry and the timer."""
    import sys
    import types

    tool = _bench_tool("gemm")
    m, n, k = 40, 24, 64
    real_inputs = tool.inputs
    monkeypatch.setattr(tool, "inputs", lambda mm, nn, kk, **kw: real_inputs(mm, nn, kk, device="cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    times = iter([2.0, 1.0, 0.5, 3.0])  # (each config that ran, the wrong one the fastest; then torch's)
    monkeypatch.setattr(tool.dc, "time_ms", lambda fn, **kw: (fn(), next(times))[1])

    class Config:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    def fn(a, b, out, config):
        if config.tile_n == 208:
            raise ValueError("refused")
        out.copy_(a.float() @ b.float())
        if config.tile_n == 128:  # (a wrong element: not timed as a winner)
            out[3, 5] += 100

    tuned = types.SimpleNamespace(fn=fn)
    monkeypatch.setitem(sys.modules, "quack", types.ModuleType("quack"))
    monkeypatch.setitem(sys.modules, "quack.gemm_config", types.SimpleNamespace(GemmConfig=Config))
    monkeypatch.setitem(sys.modules, "quack.gemm_interface", types.SimpleNamespace(gemm_tuned=tuned))
    monkeypatch.setattr(torch, "matmul", lambda a, b, out=None: out.copy_(a.float() @ b.float()))
    configs = ((128, 192, True, 2, 1), (128, 208, True, 2, 1), (256, 192, False, 2, 1), (128, 128, True, 2, 1))
    row = tool.quack_row(m, n, k, configs)
    per = row["configs_ms"]
    assert per["128x208 pingpong cluster 2x1"].startswith("ValueError: refused")
    assert per["128x128 pingpong cluster 2x1"].startswith("wrong: ")
    assert row["best_config"] == "256x192 cooperative cluster 2x1" and row["quack_ms"] == 1.0
    assert row["ratio"] == 3.0 and row["checked"] is False  # (a config gave a wrong D)


def test_bench_quack_row_without_quack_is_an_error_row(monkeypatch):
    """Where quack cannot be imported the row says so and the run goes on."""
    import sys

    tool = _bench_tool("gemm")
    monkeypatch.setitem(sys.modules, "quack", None)
    monkeypatch.setitem(sys.modules, "quack.gemm_config", None)
    row = tool.quack_row(8192, 14336, 4096)
    assert row["name"] == "quack_bf16 8192x14336x4096" and row["error"].startswith("ModuleNotFoundError")


# (PINGPONG, CLUSTER_M, PP_TILE, ORDER): each form in clusters of two and without, the wide tile and 192 x 128
GPU_FORMS = [(False, 2, None, None), (True, 2, (64, 256), None), (False, 1, None, None), (True, 1, (64, 256), None),
             (True, 2, (128, 192), None), (True, 2, (192, 128), None)]


@pytest.fixture(params=GPU_FORMS, ids=["cooperative", "pingpong", "cooperative1", "pingpong1", "pingpong128x192",
                                       "pingpong192x128"])
def form(request, monkeypatch):
    """Every kernel (cooperative and ping-pong on 64 x 256, each in clusters of two and without;
    ping-pong on 128 x 192 in its tile order, wide_order's, which runtime/gemm.kernel_for takes,
    and on 192 x 128, three wgmma rows a warpgroup whose columns hold 1x128 blocks):
    runtime/gemm.PINGPONG, CLUSTER_M, PP_TILE and ORDER set for the test, clusters taken at any
    M (the padding tile of an odd M tile count exercised at the small shapes too: cluster_for's
    own rule is tests/test_gemm_sm90.py::test_cluster_for_pairs_the_m_tiles), and every compile
    the test makes (gemm, op.gemm) checked to have asked for that form, cluster and tile. Yields
    its pingpong."""
    pingpong, cluster, tile, order = request.param
    seen = []
    for name in ("compile_gemm", "compile_gemm_op"):
        def spy(*args, _real=getattr(g, name), **kw):
            seen.append((kw.get("pingpong"), kw.get("cluster_m"), kw.get("pp_tile")))
            return _real(*args, **kw)

        monkeypatch.setattr(g, name, spy)
    monkeypatch.setattr(g, "PINGPONG", pingpong)
    monkeypatch.setattr(g, "CLUSTER_M", cluster)
    monkeypatch.setattr(g, "CLUSTER_MIN_ODD_TILES", 1)
    if tile is not None:
        monkeypatch.setattr(g, "PP_TILE", tile)
    monkeypatch.setattr(g, "ORDER", order)
    yield pingpong
    assert all(s == (pingpong, cluster, tile) for s in seen), seen


GPU_SHAPES = [(128, 256, 64), (200, 136, 64), (1000, 520, 4096), (1, 8, 8), (129, 264, 72), (384, 768, 1024),
              (4096, 4096, 4096), (8192, 14336, 512),
              (64, 256, 64), (65, 520, 136), (2176, 2048, 256)]  # (ping-pong: 1 tile; 2 x 3; 272 tiles on 132 CTAs)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_gpu_gemm_against_float64(m, n, k, form):
    tool = _bench_tool("gemm")
    # (torch.matmul's own verdict is only printed by the bench: cuBLAS may reduce split-K partials in bf16)
    problems, _ = tool.check(m, n, k)
    assert problems == [], problems


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_out_argument_and_dtypes(dtype, form):
    tool = _bench_tool("gemm")
    a, w = tool.inputs(300, 1000, 200, dtype=dtype)
    out = torch.full((300, 1000), float("nan"), dtype=dtype, device="cuda")
    assert g.gemm(a, w, out=out) is out
    ref, _, out_tol = tool.bounds(a, w)
    assert tool.violations(out, ref, out_tol, "D") == []


@pytest.mark.gpu
def test_gpu_edges_leave_memory_outside_d_untouched(form):
    """D written into a view of a larger buffer's leading rows: the rows after it keep their values."""
    tool = _bench_tool("gemm")
    a, w = tool.inputs(130, 264, 64)
    buf = torch.full((130 + 128, 264), 7.0, dtype=torch.bfloat16, device="cuda")
    g.gemm(a, w, out=buf[:130])
    assert bool((buf[130:] == 7.0).all())
    ref, _, out_tol = tool.bounds(a, w)
    assert tool.violations(buf[:130], ref, out_tol, "D") == []


@pytest.mark.gpu
def test_gpu_empty_m_returns_empty(form):
    a, w = torch.zeros(0, 64, dtype=torch.bfloat16, device="cuda"), torch.zeros(8, 64, dtype=torch.bfloat16,
                                                                              device="cuda")
    assert g.gemm(a, w).shape == (0, 8)
