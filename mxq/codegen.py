"""QuantSpec + epilogue IR -> Jinja context -> CuTeDSL source text.

The context holds only values derived from the validated spec and IR: option flags, integer
indices, operation names from fixed tables, and fp32 constants formatted by ``_literal``.
Identifiers in the generated module are ours (``in0``, ``e3``...), never the user's parameter
names, so no user-written text reaches the output. Templates run with ``StrictUndefined``.
"""

from __future__ import annotations

import collections
import hashlib
import math
import os
from functools import lru_cache
from importlib import resources

import jinja2

from . import activations, ir
from .epilogue import Epilogue
from .numerics import FORMATS
from .spec import QuantSpec

TEMPLATE_NAME = "module.py.j2"


def _template_dir():
    """Installed: the ``mxq.templates`` package; from a source tree: ``<repo>/templates``."""
    try:
        return resources.files("mxq.templates")
    except ModuleNotFoundError:
        from pathlib import Path

        return Path(__file__).resolve().parent.parent / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@lru_cache(maxsize=1)
def templates_hash() -> str:
    """Hash of every template file: part of every cache key, so editing a template recompiles."""
    h = hashlib.sha256()
    root = _template_dir()
    for name, path in sorted(_walk(root, "")):
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _walk(root, prefix: str):
    """(relative name, file) of every template below ``root``."""
    for entry in root.iterdir():
        if entry.is_dir():
            yield from _walk(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".j2"):
            yield f"{prefix}{entry.name}", entry


def _literal(value: float) -> str:
    """An fp32 constant as Python source text (repr round-trips the exact double)."""
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '-float("inf")'
    return repr(float(value))


def ssa(expr: ir.Expr, prefix: str, inputs: dict[int, str], scalars: dict[int, str],
        builtin: bool = False) -> tuple[list[dict], str]:
    """Lower ``expr`` to SSA records in topological order; return (records, result variable).

    ``inputs`` maps tensor-argument index -> the variable holding its fp32 value, ``scalars`` maps
    scalar index -> the kernel parameter name. Structurally equal nodes share one variable.
    ``builtin`` (the act/dact formulas of NUMERICS.md, transcendental class) lowers tanh to
    ``tanh_act`` (accurate to ~2^-24 absolute, not relative: the formulas only use t as
    0.5 + 0.5*t or 1 - t*t, where that is as good as a relatively accurate tanh and half the
    instructions) and contracts products into FMAs (see ``contract_fma``). User epilogues keep
    the precise tanh and one rounding per operation.
    """
    names: dict[ir.Expr, str] = {}
    records: list[dict] = []
    for node in ir.walk(expr):
        if isinstance(node, ir.TensorArg):
            names[node] = inputs[node.index]
            continue
        if isinstance(node, ir.ScalarArg):
            names[node] = scalars[node.index]
            continue
        var = f"{prefix}{len(records)}"
        names[node] = var
        if isinstance(node, ir.Const):
            rec = {"kind": "const", "value": _literal(node.value)}
        elif isinstance(node, ir.Unary):
            op = "tanh_act" if (builtin and node.op == "tanh") else node.op
            rec = {"kind": "unary", "op": op, "args": [names[node.a]]}
        elif isinstance(node, ir.Binary):
            rec = {"kind": "binary", "op": node.op, "args": [names[node.a], names[node.b]]}
        elif isinstance(node, ir.Compare):
            rec = {"kind": "compare", "op": node.op, "args": [names[node.a], names[node.b]]}
        elif isinstance(node, ir.Where):
            rec = {"kind": "where", "op": "where", "args": [names[node.cond], names[node.a], names[node.b]]}
        else:  # pragma: no cover
            raise TypeError(f"unknown IR node {node!r}")
        rec["var"] = var
        records.append(rec)
    if builtin:
        records = scale_sum_fma(contract_fma(records))
    return records, names[expr]


def _use_counts(records: list[dict]) -> collections.Counter:
    """How many records read each variable."""
    return collections.Counter(a for rec in records for a in rec.get("args", []))


def _computed(spec: QuantSpec, epilogue: Epilogue) -> bool:
    """The op does arithmetic on its inputs (act, dact or a user epilogue), not a plain cast."""
    return bool(spec.act or spec.dact or not epilogue.is_identity)


def scale_sum_fma(records: list[dict]) -> list[dict]:
    """Rewrite ``c * (x + d)`` (c a power of two, d a constant, the sum used once) as
    ``fma(x, c, c*d)``: the same bits, one instruction fewer (dgelu's ``0.5 * (1 + t)``).

    Scaling by 2^k commutes with round-to-nearest, so c * fl(x + d) == fl(c*x + c*d) unless
    c * (x + d) lands among the subnormals (not the case for the built-in formulas: 1 + t is 0
    or at least 2^-24). Built-in formulas only, like ``contract_fma``.
    """
    by_var = {rec["var"]: rec for rec in records}
    uses = _use_counts(records)

    def const(var: str):
        rec = by_var.get(var)
        return float(rec["value"]) if rec is not None and rec["kind"] == "const" else None

    def pow2(v) -> bool:
        return v is not None and v != 0.0 and math.isfinite(v) and math.frexp(abs(v))[0] == 0.5

    out, dropped = [], set()
    for rec in records:
        if rec["kind"] == "binary" and rec["op"] == "mul":
            for k in (0, 1):
                c, total = const(rec["args"][k]), by_var.get(rec["args"][1 - k])
                if not (pow2(c) and total is not None and total["kind"] == "binary" and total["op"] == "add"
                        and uses[total["var"]] == 1):
                    continue
                ds = [const(a) for a in total["args"]]
                j = 0 if ds[0] is not None else 1 if ds[1] is not None else None
                if j is None:
                    continue
                cd = {"kind": "const", "value": _literal(c * ds[j]), "var": rec["var"] + "c"}
                out.append(cd)
                rec = {"kind": "fma", "args": [total["args"][1 - j], rec["args"][k], cd["var"]], "var": rec["var"]}
                dropped.add(total["var"])
                break
        out.append(rec)
    # the sum's record is no longer used; it stays in order before its old user, so drop it
    return [rec for rec in out if rec["var"] not in dropped]


def contract_fma(records: list[dict]) -> list[dict]:
    """Fuse ``a*b + c`` into one FMA where the product feeds only that addition.

    Only for the built-in transcendental-class formulas: skipping the product's rounding moves a
    value by at most ~1 fp32 ulp, far inside the class's 1-in-1e4 one-code budget, and saves an
    instruction per element. Subtractions are left alone on purpose: dgelu's ``1 - t*t`` cancels
    for |t| near 1 and the reference rounds t*t first, so an FMA there would differ from the
    reference by much more than an ulp of the result.
    """
    uses = _use_counts(records)
    by_var = {rec["var"]: rec for rec in records}

    def single_product(var: str):
        rec = by_var.get(var)
        if rec is not None and rec["kind"] == "binary" and rec["op"] == "mul" and uses[var] == 1:
            return rec
        return None

    fused: set[str] = set()
    out = []
    for rec in records:
        if rec["kind"] == "binary" and rec["op"] == "add":
            for k in (0, 1):
                prod = single_product(rec["args"][k])
                if prod is not None:
                    rec = {"kind": "fma", "args": [*prod["args"], rec["args"][1 - k]], "var": rec["var"]}
                    fused.add(prod["var"])
                    break
        out.append(rec)
    return [rec for rec in out if rec["var"] not in fused]


def context(spec: QuantSpec, epilogue: Epilogue, vwarps: int | None = None, order: str | None = None,
            stage: int | None = None, pdl: int | None = None, dbias_warps: int = 8,
            dbias_unroll: int = 4, rtile: str | None = None, sstore: str | None = None,
            rskeep: int = 1) -> dict:
    """The complete Jinja context of one generated module (``vwarps``/``order``/``stage``/``pdl``
    and dbias_kernel's ``dbias_warps``/``dbias_unroll``: tuning overrides)."""
    order = order or ORDER
    computed = _computed(spec, epilogue)
    stage = computed if stage is None else bool(stage)
    pk_vwarps = vwarps or VWARPS or default_vwarps(spec, epilogue, stage)
    vwarps = vwarps or VWARPS or default_vwarps(spec, epilogue, False)
    if vwarps not in (2, 4, 8) or order not in ("cols", "rows"):
        raise ValueError(f"mxq: tuning vwarps must be 2, 4 or 8 and order 'cols' or 'rows', got {vwarps!r}, {order!r}")
    rtile = rtile or RTILE
    col_reduce = bool(spec.colwise or spec.amax or spec.dbias)
    wide = rtile == "wide" and not col_reduce
    sstore = sstore or ("words" if wide else "bytes")
    if rtile not in ("tall", "wide") or sstore not in ("bytes", "words"):
        raise ValueError(f"mxq: tuning rtile must be 'tall' or 'wide' and sstore 'bytes' or 'words', got {rtile!r}, {sstore!r}")
    if dbias_warps not in (1, 2, 4, 8, 16, 32) or dbias_unroll not in range(1, 17):
        raise ValueError("mxq: tuning dbias_warps must be a power of two up to 32 and dbias_unroll 1..16, "
                         f"got {dbias_warps!r}, {dbias_unroll!r}")
    if rskeep not in (0, 1):
        raise ValueError(f"mxq: tuning rskeep must be 0 or 1, got {rskeep!r}")
    n_in = len(epilogue.tensor_params)
    n_sc = len(epilogue.scalar_params)
    inputs = {i: f"x{i}" for i in range(n_in)}
    scalars = {i: f"s{i}" for i in range(n_sc)}
    epi, epi_out = ([], "x0") if epilogue.is_identity else ssa(epilogue.expr, "e", inputs, scalars)
    act = dact = None
    if spec.act:
        nodes, out = ssa(activations.act_ir(spec.act).expr, "f", {0: "v"}, {}, builtin=True)
        act = {"nodes": nodes, "out": out, "name": spec.act}
    if spec.dact:
        nodes, out = ssa(activations.dact_ir(spec.dact).expr, "g", {0: "a"}, {}, builtin=True)
        dact = {"nodes": nodes, "out": out, "name": spec.dact}
    fmt = FORMATS[spec.fp8]
    return {
        "spec": {
            "fp8": spec.fp8, "rowwise": spec.rowwise, "colwise": spec.colwise,
            "scale_mode": spec.scale_mode, "swizzled": spec.scale_layout == "swizzled",
            "scale_layout": spec.scale_layout, "amax": spec.amax, "dbias": spec.dbias,
        },
        "rcp": _literal(fmt.rcp),
        "fmt": {"emax": fmt.emax, "mbits": fmt.mbits, "rcp_bits": f"0x{fmt.rcp_bits:08X}",
                "cvt": "e4m3x2" if spec.fp8 == "e4m3" else "e5m2x2"},
        "n_inputs": n_in,
        "n_scalars": n_sc,
        "epilogue": {"nodes": epi, "out": epi_out, "identity": epilogue.is_identity,
                     "fingerprint": epilogue.fingerprint, "exact": epilogue.exact},
        "act": act,
        "dact": dact,
        "computed": computed,
        # packed kernel: stage the inputs through shared memory with cp.async (ops with arithmetic)
        "stage": stage,
        "templates_hash": templates_hash(),
        "rows_per_cta": ROWS_PER_CTA,
        "vec": VEC, "vwarps": vwarps, "vrows": ROWS_PER_CTA // vwarps, "pkw": VEC // 2,
        "pk_vwarps": pk_vwarps,  # the packed (16-bit) kernel's warps: 4 for staged ops
        "order": order,
        # dbias ops launch dbias_kernel with programmatic dependent launch where the arch has it
        # (the launcher's use_pdl); pdl=0 turns it off for a side-by-side timing
        "pdl": True if pdl is None else bool(pdl),
        # dbias_kernel: warps per CTA and loads in flight per thread (8 x 4; 16 x 8 was faster
        # in one profiler run and slower end to end in the next, see its docstring)
        "dbias_warps": dbias_warps, "dbias_unroll": dbias_unroll,
        "col_reduce": col_reduce,
        # packed kernel of a pure rowwise cast (no column reduction): "wide" CTAs lay their warps
        # side by side along a row band instead of stacking them over 32 rows
        "wide": wide,
        # packed kernel: row scales gathered in shared memory and stored as 4-byte words instead
        # of byte by byte (default for the wide tile only; see RTILE)
        "rs_words": sstore == "words" and spec.rowwise,
        "warps": WARPS,
        # row-scale bytes stored with an L2 evict_last policy (partials/scale_stores.j2); rskeep=0
        # stores them plainly, for a side-by-side timing
        "rs_keep": bool(rskeep),
    }


ROWS_PER_CTA = 32  # one colwise block per CTA row tile
WARPS = 4  # generic kernel: each warp owns 32 columns (lane = column), a row's 32-block is one warp
VEC = 8  # vectorised kernel: a lane owns 8 adjacent columns (one 16-byte load of bf16)
# vectorised kernel: VWARPS warps x (32 / VWARPS) rows = one colwise block of 32 rows per CTA.
# Measured on the H200 with the packed kernel (bench/results/*-v4a-packed-tuning.json and
# *-v4-packed.json, rows_variants): 4 warps x 8 rows wins for plain casts (both at 16384^2: 94%
# vs 92% with 8 warps; 86% with 2 warps, and walking CTAs down columns first was no better);
# ops with act/dact/dbias need the registers and run better at 8 warps x 4 rows (gelu_both 66% vs
# 62%, dgelu_dbias_both 58% vs 52%). With column/row scales computed once per block
# (*-v5a-owners-tuning.json) gelu_both ran within 2 points at 4 and 8 warps and
# dgelu_dbias_both lost 4-7 points at 4 warps (144 registers). Since 2026-11-30 the packed
# kernel has its own count (default_vwarps, pk_vwarps): staged ops use 4 warps there, dbias ops 8,
# the fp32 kernel keeps the rule above. MXQ_VWARPS (2, 4 or 8) forces
# one for tuning runs; it changes the source, hence every cache key.
# Packed kernel of a pure rowwise cast (no colwise, amax or dbias): "wide" CTAs put their warps
# side by side along one band of 8 rows (8 x 1024 columns) and store the row scales as 4-byte
# words gathered in shared memory (sstore="words"), a row's 32 scale bytes in one request;
# "tall" is the 32-row tile every other op needs, its warps storing scale bytes themselves
# (each byte-store instruction touching 4 rows). Measured on the H200 (bench/results/
# *-20261130-s7-fixed-cost*.json): those byte stores cost rowwise ~3% of its bandwidth; wide +
# words ran 8192^2 in 50.1 us against 51.9 (tall, bytes) and 51.6 (wide, bytes). For the
# 32-row ops (a row's 8 scale bytes per CTA) words gained nothing (both, gelu_both within
# 0.3 us) or lost (dgelu_dbias_both +1.6..2.7 us at 8192^2), and column-scale words, tried
# for colwise, were 0.4 us slower: both stay bytes. tuning rtile/sstore override for runs.
RTILE = "wide"
VWARPS = int(os.environ.get("MXQ_VWARPS", "0")) or None
if VWARPS not in (None, 2, 4, 8):
    raise ValueError(f"mxq: MXQ_VWARPS must be 2, 4 or 8, got {VWARPS}")


# CTA numbering of the packed kernel: "cols" walks along a row of tiles first (consecutive CTAs
# read adjacent memory), "rows" walks down a column of tiles (a tuning override; no faster).
ORDER = "cols"


def default_vwarps(spec: QuantSpec, epilogue: Epilogue, stage: bool | None = None) -> int:
    """4 warps x 8 rows, except dbias and unstaged heavy arithmetic: 8 warps x 4 rows.

    Staged ops (``stage`` defaults to: there is arithmetic) keep their loads in flight through
    shared memory, so the fewer instructions per element of 8 rows per thread win there
    (gelu_both 86-93% of copy against 82-88% with 8 warps, bench/results/nvidia-h200-20261130-s5-final.json).
    dbias is the exception: at 4 warps dgelu_dbias_both needs 80 registers and 43 KB of shared
    memory per CTA and ran 4 points slower (76-84% against 80-88%)."""
    computed = _computed(spec, epilogue)
    if stage is None:
        stage = computed
    heavy = spec.act or spec.dact or spec.dbias or not epilogue.exact
    return 8 if spec.dbias or (heavy and not stage) else 4


def render(spec: QuantSpec, epilogue: Epilogue, **tuning) -> str:
    """The generated module's source (``tuning``: context's overrides, by name)."""
    return environment().get_template(TEMPLATE_NAME).render(**context(spec, epilogue, **tuning))
