"""Seeded fuzz of every public entry point with bad inputs, and of the kernel cache with random
damage: nothing may crash the process, hang, or fail with anything but a clean TypeError /
ValueError (mxq.EpilogueError at decoration) -- or succeed. MXQ_FUZZ_SEED and
MXQ_FUZZ_CASES override the seed and the number of cases per entry point."""

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mxq
import mxq.testing

SEED = int(os.environ.get("MXQ_FUZZ_SEED", "20261130"))
CASES = int(os.environ.get("MXQ_FUZZ_CASES", "300"))
ROOT = Path(__file__).resolve().parent.parent


class _Sub(torch.Tensor):
    pass


def _values(rng):
    """A bag of things a caller might pass by mistake."""
    t = torch.randn(8, 64)
    return [None, 0, 1, True, False, 2.5, float("nan"), -1, 10 ** 400 if rng.random() < 0.1 else 3, "x", "e4m3",
            "rceil", "bf16", b"bytes", [1, 2], (t,), {"a": 1}, object(), t, t.double(), t.to(torch.int32),
            t.bool(), t.to(torch.complex64), t.half(), t.bfloat16(), t[:, :7], t.t(), t[::2], t.reshape(-1),
            torch.tensor(1.0), torch.empty(0, 64), torch.empty(8, 0), t.as_subclass(_Sub), t.to_sparse(),
            torch.ones(1), torch.ones(3), torch.ones(1, dtype=torch.float64), t.expand(2, 8, 64)]


def _clean(call):
    try:
        call()
    except (TypeError, ValueError, mxq.EpilogueError):
        pass


OPTS = ["fp8", "rowwise", "colwise", "scale_mode", "scale_layout", "amax"]


def test_fuzz_quantize_and_decorated_ops():
    rng = random.Random(SEED)
    vals = _values(rng)

    @mxq.fused_quant(colwise=True, amax=True, dbias=True)
    def two(x, r, alpha: float = 1.0):
        return x * alpha + r

    @mxq.fused_quant(dact="gelu")
    def grad(g):
        return g

    n = 0
    for _ in range(CASES):
        x = rng.choice(vals)
        kw = {k: rng.choice(vals) for k in rng.sample(OPTS, rng.randrange(0, 3))}
        if rng.random() < 0.3:
            kw["noop"] = rng.choice(vals)
        if rng.random() < 0.2:
            kw["out"] = rng.choice(vals + [mxq.quantize(torch.randn(8, 64))])
        _clean(lambda: mxq.quantize(x, **kw))
        args = [rng.choice(vals) for _ in range(rng.randrange(0, 4))]
        _clean(lambda: two(*args))
        _clean(lambda: two.reference(*args, alpha=rng.choice(vals)))
        _clean(lambda: grad(rng.choice(vals), act_input=rng.choice(vals)))
        n += 4
    print(f"\n[fuzz] {n} bad calls of quantize / decorated ops (seed {SEED}): clean errors or results")


def test_fuzz_ffi_entry_points():
    import tvm_ffi

    rng = random.Random(SEED + 1)
    vals = _values(rng)

    @mxq.fused_quant(colwise=True)
    def one(x, s: float = 1.0):
        return x * s

    fn = one.register("fuzz_one")
    key = tvm_ffi.get_global_func("mxq.get_quantize_kernel")
    names = ["", ".", "a.", "a..b", "ok", "x" * 300, "é", "get_quantize_kernel", "a b", "a.b", 3, None]
    n = 0
    for _ in range(CASES):
        _clean(lambda: one.register(rng.choice(names)))
        _clean(lambda: key(rng.choice([0, 1, 2, 6, 7 << 7, -1, 1 << 20, "2", 2.0, 2.5, None, True])))
        args = [rng.choice(vals) for _ in range(rng.choice([0, 1, 2, 9, 10, 11]))]
        try:
            fn(*args)
        except (TypeError, ValueError):
            pass
        except RuntimeError as exc:
            # the one error that is not mxq's: TVM-FFI converting a storage-less (sparse) torch
            # tensor to DLPack before the dispatcher is reached
            assert "storage" in str(exc), exc
        n += 3
    print(f"\n[fuzz] {n} bad calls of register / get_quantize_kernel / a registered dispatcher (seed {SEED + 1})")


def _resid(x, r, alpha: float = 1.0):
    return x * alpha + r


def test_fuzz_aliased_outputs():
    """out= whose tensors are carved at random from one byte pool (contiguous pieces at random
    aligned offsets), inputs too: a call is refused with an 'overlaps' ValueError exactly when an
    output piece shares a byte with another output or with an input (the test's own intervals),
    and otherwise writes the reference's bytes, its inputs unchanged."""
    rng = random.Random(SEED + 2)
    op = mxq.fused_quant(colwise=True, amax=True, dbias=True)(_resid)
    m, n = 64, 32
    sizes = {"x": m * n * 2, "r": m * n * 2, "rowwise_data": m * n, "colwise_data": m * n,
             "rowwise_scale": m * (n // 32), "colwise_scale": (m // 32) * n, "amax": 4, "dbias": n * 2}
    dtypes = {"x": torch.bfloat16, "r": torch.bfloat16, "rowwise_data": torch.float8_e4m3fn,
              "colwise_data": torch.float8_e4m3fn, "rowwise_scale": torch.uint8, "colwise_scale": torch.uint8,
              "amax": torch.float32, "dbias": torch.bfloat16}
    shapes = {"x": (m, n), "r": (m, n), "rowwise_data": (m, n), "colwise_data": (m, n),
              "rowwise_scale": (m, n // 32), "colwise_scale": (m // 32, n), "amax": (), "dbias": (n,)}
    refused = 0
    for case in range(max(20, CASES // 4)):
        pool = torch.zeros(sum(sizes.values()), dtype=torch.uint8)
        where = {}  # name -> (start, end) in the pool, for the pieces carved from it
        views = {}
        for name, size in sizes.items():
            if rng.random() < 0.5:
                start = rng.randrange(0, len(pool) - size + 1) // 4 * 4
                where[name] = (start, start + size)
                views[name] = pool[start:start + size].view(dtypes[name]).reshape(shapes[name])
            else:
                views[name] = torch.zeros(shapes[name], dtype=dtypes[name])
        x_val, r_val = torch.randn(m, n, dtype=torch.bfloat16), torch.randn(m, n, dtype=torch.bfloat16)
        views["x"].copy_(x_val)
        views["r"].copy_(r_val)
        x_val, r_val = views["x"].clone(), views["r"].clone()  # (x and r may overlap each other: reads only)
        outs = [f for f in sizes if f not in ("x", "r")]
        clash = any(a in where and b in where and where[a][0] < where[b][1] and where[b][0] < where[a][1]
                    for i, a in enumerate(outs) for b in outs[:i] + ["x", "r"])
        out = mxq.MXFP8Tensor(*(views[f] for f in outs), "e4m3", "compact", torch.Size((m, n)))
        if clash:
            with pytest.raises(ValueError, match="overlaps"):
                op(views["x"], views["r"], out=out)
            refused += 1
            continue
        got = op(views["x"], views["r"], out=out)
        assert torch.equal(views["x"], x_val) and torch.equal(views["r"], r_val), case
        want = op.reference(x_val, r_val)
        assert mxq.testing.compare(got, want, exact=True) == [], (case, where)
    assert 0 < refused < max(20, CASES // 4)  # (both outcomes drawn)
    print(f"\n[fuzz] aliased outputs (seed {SEED + 2}): {refused} refused, the rest byte-exact")


DAMAGE = """
import os, random, shutil, sys
from pathlib import Path
from mxq.runtime import cache, compiler
from mxq.op import _quantize_op
from mxq.frontend.spec import QuantSpec
rng = random.Random(int(sys.argv[1]))


def put(path, data):
    # damage arrives as a new file (a rename), as from another process or machine: rewriting a
    # library this process has mapped would fault any program, not only mxq
    tmp = path.with_name(path.name + ".damage")
    tmp.write_bytes(data)
    os.replace(tmp, path)


op = _quantize_op(QuantSpec(rowwise=True, colwise=True, scale_mode="floor"))
compiler.native_function(op, "sm_90", "bf16", "generic")
so = next(Path(os.environ["MXQ_CACHE_DIR"], "kernels").rglob("*.so"))
cases = 0
for i in range(int(sys.argv[2])):
    target = rng.choice([so, so.with_suffix(".sha256"), so.with_suffix(".lock"), cache.source_file(op.source)])
    kind = rng.choice(["truncate", "flip", "garbage", "empty", "dir", "delete"])
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists() and kind in ("truncate", "flip"):
        data = target.read_bytes()
        if kind == "truncate":
            put(target, data[: rng.randrange(0, max(1, len(data)))])
        else:
            at = rng.randrange(0, max(1, len(data)))
            put(target, data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:] if data else b"x")
    elif kind == "garbage":
        put(target, os.urandom(rng.randrange(1, 4096)))
    elif kind == "empty":
        put(target, b"")
    elif kind == "dir":
        target.unlink(missing_ok=True)
        target.mkdir()
    else:
        target.unlink(missing_ok=True)
    compiler._native.clear()
    compiler._compiled.clear()
    compiler._modules.clear()
    fn = compiler.native_function(op, "sm_90", "bf16", "generic")
    assert fn is not None and cache.verified(so), (i, target.name, kind)
    cases += 1
print("damaged", cases)
"""


@pytest.mark.parametrize("seed", [SEED, SEED + 7])
def test_fuzz_cache_damage(tmp_path, seed):
    """Random damage to the cached library, its digest, its lock and the generated module,
    then a fresh lookup: it rebuilds or loads a verified library every time (in a subprocess, so
    that a damaged library that got loaded would show as a crash, not kill the test run)."""
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(DAMAGE), str(seed), "8"], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0 and "damaged 8" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
    print(f"\n[fuzz] 8 random cache damages (seed {seed}): every lookup verified")
