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
from functools import lru_cache
from importlib import resources

import jinja2

from . import activations, gated, ir
from ..runtime import slots
from .epilogue import Epilogue
from ..kernels.config import HALF_TANH_K, KernelConfig, Tuning
from .spec import QuantSpec

TEMPLATE_NAME = "module.py.j2"
# mxq/ files beside kernels/ and the templates that shape the compiled code (kernels_hash): those the
# kernels and the template import, the formats/ modules those import in turn (layouts, constants),
# and the runtime files that build the compile's fake arguments and options
SHAPING_FILES = ("runtime/slots.py", "formats/numerics.py", "formats/format.py", "formats/fp4.py",
                 "formats/fp8_block.py", "formats/layouts.py", "formats/fp8_block_layouts.py", "formats/groups.py",
                 "runtime/compiler.py", "runtime/targets.py", "runtime/gemm.py", "runtime/operands.py")
# The generated module's launchers: (function, Quantize.launch variant, takes a grouped call's
# group ends), one template loop; compiler.VARIANTS names the same functions
LAUNCHERS = (("launch", "generic", False), ("launch_vec", "vec", False), ("launch_rows8", "rows8", False),
             ("launch_grouped", "generic", True), ("launch_vec_grouped", "vec", True))
# NVFP4's further launcher: the quantize pass alone, for calls whose per-tensor amax is given
# (global_amax=; mxq/kernels/quantize.py)
GIVEN_AMAX_LAUNCHERS = (("launch_vec_given", "vec_given", False), ("launch_vec_given_grouped", "vec_given", True))


def launchers(spec: QuantSpec) -> tuple:
    """The launchers rendered into ``spec``'s module: LAUNCHERS, and NVFP4's GIVEN_AMAX_LAUNCHERS."""
    return LAUNCHERS + (GIVEN_AMAX_LAUNCHERS if spec.format == "nvfp4" else ())


def _template_dir():
    """From a source tree: ``<repo>/templates`` (the package's own checkout, even where an
    editable install maps ``mxq.templates`` to another one); installed: the ``mxq.templates``
    package."""
    from pathlib import Path

    tree = Path(__file__).resolve().parents[2] / "templates"
    if (tree / TEMPLATE_NAME).is_file():
        return tree
    return resources.files("mxq.templates")


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
def kernels_hash() -> str:
    """Hash of every file that shapes the compiled code (templates, mxq/kernels/*.py,
    SHAPING_FILES): part of every generated module, hence of every cache key, so editing any of
    them recompiles."""
    from pathlib import Path

    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]  # mxq/
    files = sorted(_walk(_template_dir(), "templates/"))
    files += sorted((f"kernels/{p.name}", p) for p in (pkg / "kernels").glob("*.py"))
    # (and what else shapes the compiled code: the slot table, the format constants the kernels
    # read, the fake compile arguments' alignment and dtypes, the arch switches they pass)
    files += [(name, pkg / name) for name in SHAPING_FILES]
    for name, path in files:
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
        builtin=False) -> tuple[list[dict], str]:
    """Lower ``expr`` to SSA records in topological order; return (records, result variable).

    ``inputs`` maps tensor-argument index -> the variable holding its fp32 value, ``scalars`` maps
    scalar index -> the kernel parameter name. Structurally equal nodes share one variable.
    ``builtin`` (the act/dact formulas of docs/NUMERICS.md, transcendental class; True for every
    node, or the set of nodes of activations called in a user epilogue, Epilogue.builtin) lowers
    sigmoid to ``sigmoid_act`` (a reciprocal of 1 + 2^(-x log2 e), both approximate, ~2 ulp) and
    tanh to ``tanh_act`` (accurate to ~2^-24 absolute, not relative: the formulas only use t as
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
            fast = builtin is True or (builtin and node in builtin)
            op = {"tanh": "tanh_act", "sigmoid": "sigmoid_act"}.get(node.op, node.op) if fast else node.op
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
        rec["builtin"] = builtin is True or bool(builtin and node in builtin)
        records.append(rec)
    if builtin:
        records = half_tanh_as_sigmoid(scale_sum_fma(contract_fma(records)))
    return records, names[expr]


_BINARY = {
    "add": "cute.math.add({0}, {1}, rounding=RN)",
    "sub": "cute.math.add({0}, -{1}, rounding=RN)",
    "mul": "cute.math.mul({0}, {1}, rounding=RN)",
    "div": "cute.math.div({0}, {1})",
    # NaN-dropping max/min (docs/NUMERICS.md): a NaN operand gives the other, equal inputs the second
    "maximum": "cutlass.select_(({0} > {1}) | ({1} != {1}), {0}, {1})",
    "minimum": "cutlass.select_(({0} < {1}) | ({1} != {1}), {0}, {1})",
}
_UNARY = {
    "neg": "-{0}",
    "sigmoid": "cute.math.div(Float32(1.0), cute.math.add(Float32(1.0), cute.math.exp(-{0}), rounding=RN))",
    "tanh_act": "tanh_act({0})",
    "sigmoid_act": "sigmoid_act({0})",
    "half_tanh_ex2_act": "half_tanh_ex2_act({0})",
    **{f: f"cute.math.{f}({{0}})" for f in ("abs", "exp", "exp2", "log", "log2", "tanh", "erf", "sqrt", "rsqrt")},
}
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _body(lines: list[str]) -> str:
    """Statements as a function body (indented, one per line; empty for none)."""
    return "".join(f"    {line}\n" for line in lines)


def lower(records: list[dict]) -> list[str]:
    """SSA records (``ssa``) as CuTeDSL statements, one per record. Every arithmetic operation
    is rounded on its own (explicit .rn), so ptxas cannot contract a*b+c into an FMA: the kernel
    computes exactly what the torch reference computes, one rounding per operation; "fma"
    records (built-in formulas only, ``contract_fma``) are the one exception. Operation names
    come from the fixed tables above; an unknown one is a bug, never user text."""
    lines = []
    for r in records:
        kind, a = r["kind"], r.get("args", [])
        if kind == "const":
            lines.append(f"{r['var']} = Float32({r['value']})")
            continue
        if kind == "compare":
            lines.append(f"{r['var']} = {a[0]} {_COMPARE[r['op']]} {a[1]}")
            continue
        if kind == "binary":
            expr = _BINARY[r["op"]].format(*a)
        elif kind == "unary":
            expr = _UNARY[r["op"]].format(*a)
        elif kind == "fma":
            expr = f"cute.math.fma({a[0]}, {a[1]}, {a[2]})"
        elif kind == "where":
            expr = f"cutlass.select_({a[0]}, {a[1]}, {a[2]})"
        else:  # pragma: no cover
            raise TypeError(f"mxq: unknown SSA record {r!r}")
        lines.append(f"{r['var']} = Float32({expr})")
    return lines


def _const(by_var: dict, var: str) -> float | None:
    """The value of ``var`` if its record is a constant, else None."""
    rec = by_var.get(var)
    return float(rec["value"]) if rec is not None and rec["kind"] == "const" else None


def _use_counts(records: list[dict]) -> collections.Counter:
    """How many records read each variable."""
    return collections.Counter(a for rec in records for a in rec.get("args", []))


def scale_sum_fma(records: list[dict]) -> list[dict]:
    """Rewrite ``c * (x + d)`` (c a power of two, d a constant, the sum used once) as
    ``fma(x, c, c*d)``: the same bits, one instruction fewer (dgelu's ``0.5 * (1 + t)``).

    Scaling by 2^k commutes with round-to-nearest, so c * fl(x + d) == fl(c*x + c*d) unless
    c * (x + d) lands among the subnormals (not the case for the built-in formulas: 1 + t is 0
    or at least 2^-24). Built-in formulas only, like ``contract_fma``.
    """
    by_var = {rec["var"]: rec for rec in records}
    uses = _use_counts(records)

    def pow2(v) -> bool:
        return v is not None and v != 0.0 and math.isfinite(v) and math.frexp(abs(v))[0] == 0.5

    out, dropped = [], set()
    for rec in records:
        if rec["kind"] == "binary" and rec["op"] == "mul" and rec.get("builtin", True):
            for k in (0, 1):
                c, total = _const(by_var, rec["args"][k]), by_var.get(rec["args"][1 - k])
                if not (pow2(c) and total is not None and total["kind"] == "binary" and total["op"] == "add"
                        and uses[total["var"]] == 1 and total.get("builtin", True)):
                    continue
                ds = [_const(by_var, a) for a in total["args"]]
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


def half_tanh_as_sigmoid(records: list[dict]) -> list[dict]:
    """Rewrite ``0.5 + 0.5 * tanh(y)`` (after ``contract_fma``: ``fma(0.5, t, 0.5)``, t = tanh(y)
    used there only) as the function it equals, ``sigmoid(2y)`` = 1 / (1 + 2^(K y)), K = -2 log2 e,
    put back on the grid of the formula's roundings (``half_tanh_ex2_act`` of K y, which says
    why): 5 instructions where tanh_act, its sign and the FMA took 7 and the multiply by 2 log2 e
    one more. ``_absorb`` folds K into the constants of y where it can (gelu's y = x * (c0 + c1 *
    x * x) becomes x * (K c0 + K c1 * x * x)); otherwise a product y * K is added before it.
    gelu's forward, so geglu's too.

    Built-in formulas only, inside the transcendental class (docs/NUMERICS.md, "Activations";
    folding K moves y by an ulp or two). A t used elsewhere too (dgelu's ``1 - t * t``) keeps
    tanh_act.
    """
    uses = _use_counts(records)
    live = {rec["var"]: rec for rec in records}  # each variable's record as rewritten so far

    dropped: set[str] = set()
    consts: list[dict] = []  # scaled constants (_absorb) and K
    scaled: dict[str, dict] = {}  # a product y * K, emitted just before the record that reads it
    for rec in records:
        rec = live[rec["var"]]
        if rec["kind"] == "fma" and rec.get("builtin", True) and _const(live, rec["args"][2]) == 0.5:
            for k in (0, 1):
                t = live.get(rec["args"][k])
                if (_const(live, rec["args"][1 - k]) == 0.5 and t is not None and t["kind"] == "unary" and t["op"] == "tanh_act"
                        and uses[t["var"]] == 1):
                    y = t["args"][0]
                    if _absorbable(y, live, uses):
                        z = _absorb(y, HALF_TANH_K, live, uses, consts)
                    else:
                        kc = {"kind": "const", "value": _literal(HALF_TANH_K), "var": f"{rec['var']}K"}
                        consts.append(kc)
                        z = f"{rec['var']}z"
                        scaled[rec["var"]] = {"kind": "binary", "op": "mul", "args": [y, kc["var"]], "var": z,
                                              "builtin": True}
                    live[rec["var"]] = {"kind": "unary", "op": "half_tanh_ex2_act", "args": [z], "var": rec["var"],
                                        "builtin": True}
                    dropped.add(t["var"])
                    break
    # (rewritten records keep their variables and places; the new constants go first)
    out = list(consts)
    for rec in records:
        if rec["var"] not in dropped:
            out += [scaled[rec["var"]]] if rec["var"] in scaled else []
            out.append(live[rec["var"]])
    return out


def _absorbable(var: str, live: dict, uses) -> bool:
    """Whether K * var can be computed by scaling constants only: var is a constant, or a
    built-in product/FMA read only once whose scaled operands are absorbable in turn (a record
    half_tanh_as_sigmoid already rewrote is a unary, never absorbable)."""
    rec = live.get(var)
    if rec is None:
        return False  # an input
    if rec["kind"] == "const":
        return True
    if uses[var] != 1 or not rec.get("builtin", True):
        return False
    a = rec.get("args", [])
    if rec["kind"] == "binary" and rec["op"] == "mul":
        return _absorbable(a[0], live, uses) or _absorbable(a[1], live, uses)
    if rec["kind"] == "fma":  # K (p q + c) = (K p) q + K c
        return (_absorbable(a[0], live, uses) or _absorbable(a[1], live, uses)) and _absorbable(a[2], live, uses)
    return False


def _absorb(var: str, k: float, live: dict, uses, consts: list) -> str:
    """The variable of K * var (``_absorbable``): constants are scaled (new records, appended to
    ``consts``); the products and FMAs on the way are rewritten in ``live`` under their own names
    (each is read only once, so nothing else sees the change)."""
    rec = live[var]
    if rec["kind"] == "const":
        c = {"kind": "const", "value": _literal(float(rec["value"]) * k), "var": f"{var}k{len(consts)}"}
        consts.append(c)
        return c["var"]
    a = list(rec["args"])
    j = 0 if _absorbable(a[0], live, uses) else 1
    a[j] = _absorb(a[j], k, live, uses, consts)
    if rec["kind"] == "fma":
        a[2] = _absorb(a[2], k, live, uses, consts)
    live[var] = dict(rec, args=a)
    return var


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
        if (rec is not None and rec["kind"] == "binary" and rec["op"] == "mul" and uses[var] == 1
                and rec.get("builtin", True)):
            return rec
        return None

    fused: set[str] = set()
    out = []
    for rec in records:
        if rec["kind"] == "binary" and rec["op"] == "add" and rec.get("builtin", True):
            for k in (0, 1):
                prod = single_product(rec["args"][k])
                if prod is not None:
                    rec = {"kind": "fma", "args": [*prod["args"], rec["args"][1 - k]], "var": rec["var"]}
                    fused.add(prod["var"])
                    break
        out.append(rec)
    return [rec for rec in out if rec["var"] not in fused]


def kernel_config(spec: QuantSpec, epilogue: Epilogue, tuning: Tuning | None = None) -> KernelConfig:
    """The KernelConfig of one op (rendered into its module); ``tuning``: a benchmark's switches
    (one equal to the library's choice, ``Tuning()``, is the library's config). The kernels
    serve MXFP8, FP8 block scaling, MXFP4 and NVFP4 (has_kernels): another op is a
    NotImplementedError (its calls run the reference)."""
    if not has_kernels(spec):
        raise NotImplementedError(f"mxq: format={spec.format!r} {kernel_gap(spec)} has no GPU kernels yet (no module "
                                  "to render or compile); its calls run the torch reference")
    return KernelConfig(
        fmt=spec.block_format, rowwise=spec.rowwise,
        colwise=spec.colwise, amax=spec.amax, dbias=spec.dbias,
        n_inputs=len(epilogue.tensor_params), n_scalars=gated.launch_scalars(epilogue),
        identity=epilogue.is_identity, has_act=spec.act is not None, has_dact=spec.dact is not None,
        heavy=bool(spec.act or spec.dact or spec.dbias or not epilogue.exact),
        tuning=None if tuning in (None, Tuning()) else tuning, halves=gated.is_halves(epilogue))


def kernel_gap(spec: QuantSpec) -> str:
    """What of an FP8 block-scaling, MXFP4 or NVFP4 spec the kernels do not serve ("" when they
    serve it)."""
    if spec.format == "mxfp8":
        return ""
    if spec.is_fp4:
        return ""  # (the transposed colwise copy: 16-bit inputs, limits.fp4_unserved)
    if spec.format != "fp8_block":
        return "(the format)"
    return ""


def has_kernels(spec: QuantSpec) -> bool:
    """Whether a module can be rendered for ``spec``: MXFP8, FP8 block scaling (1x128 rowwise
    and 128-row colwise blocks, 128x128 tiles; compact or gemm layout: the transposed colwise
    copy) and MXFP4's and NVFP4's blocks (rowwise, and the transposed colwise copy)."""
    return spec.format in ("mxfp8", "fp8_block", "mxfp4", "nvfp4") and not kernel_gap(spec)


def gemm_gap(spec: QuantSpec, epilogue: Epilogue) -> str:
    """The option of an op that ``op.gemm`` (the GEMM whose epilogue is the op,
    mxq/kernels/gemm_quant.py) does not serve, as the user wrote it ("" when it serves the op):
    it serves MXFP8 (1x32, colwise 32x1) and FP8 block scaling 1x128 (colwise 128x1) blocks,
    rowwise and/or colwise (the colwise data [M, N], or FP8 block scaling's transposed copy
    [N, M] with scale_layout="gemm"), every scale layout, with or without amax and dbias, an
    ordinary act or dact (act_input [M, N]), operands that broadcast or match [M, N]."""
    if spec.format not in ("mxfp8", "fp8_block"):
        return f"format={spec.format!r}"
    if spec.format == "fp8_block" and tuple(spec.block) != (1, 128):
        return f"block={tuple(spec.block)}"
    if gated.is_gated(spec.dact):
        return f"dact={spec.dact!r} (a gated activation)"
    if gated.is_gated(spec.act) or gated.is_halves(epilogue):
        return f"act={spec.act!r} (a gated activation)"
    return ""


def _gemm_launcher_text(spec: QuantSpec, epilogue: Epilogue) -> dict:
    """(parameters, run_fused arguments) of the module's ``launch_gemm``: A and W, the
    epilogue's tensors after the first (the accumulator's place) and its floats, the outputs
    (rowwise data and scales, amax; then, with the colwise copy, its data and scales; with dbias,
    the dbias, its fp32 workspace and the zero noop its reduction reads), the accumulator hook's
    tensor, the compile-time options (GemmSm90's)."""
    ins = [f"x{i}" for i in range(1, len(epilogue.tensor_params))] + (["act_in"] if spec.dact else [])
    scalars = [f"s{i}" for i in range(gated.launch_scalars(epilogue))]
    params = ["a: cute.Tensor", "w: cute.Tensor", *[f"{x}: cute.Tensor" for x in ins],
              *[f"{x}: Float32" for x in scalars], "row_data: cute.Tensor", "row_scale: cute.Tensor", "amax: cute.Tensor",
              "acc: cute.Tensor", "acc_hook: cutlass.Constexpr", "num_sms: cutlass.Constexpr",
              "swizzle: cutlass.Constexpr", "pingpong: cutlass.Constexpr", "cluster_m: cutlass.Constexpr",
              "pp_tile: cutlass.Constexpr", "stage_rows: cutlass.Constexpr", "stream"]
    args = ["a", "w", "row_data", "row_scale", "amax", f"[{', '.join(ins)}]", f"[{', '.join(scalars)}]", "acc",
            "stream"]
    if spec.colwise:
        at = params.index("acc: cute.Tensor")
        params[at:at] = ["col_data: cute.Tensor", "col_scale: cute.Tensor"]
        args += ["col_data=col_data", "col_scale=col_scale"]
    if spec.dbias:
        at = params.index("acc: cute.Tensor")
        params[at:at] = ["dbias: cute.Tensor", "dbias_ws: cute.Tensor", "noop: cute.Tensor"]
        args += ["dbias=dbias", "dbias_ws=dbias_ws", "noop=noop"]
    return {"params": ", ".join(params), "args": ", ".join(args)}


def _launcher_text(spec: QuantSpec, epilogue: Epilogue, grouped: bool = False) -> tuple[str, str]:
    """(parameter list, Quantize.launch argument list) of the generated launchers, both from the
    slot table (``grouped``: the grouped launchers')."""
    table = slots.kernel_slots(spec, len(epilogue.tensor_params), gated.launch_scalars(epilogue), grouped)
    params = [f"{s.name}: {'cute.Tensor' if s.is_tensor else 'Float32'}" for s in table]
    params.append("use_hw_e8m0: cutlass.Constexpr")
    if spec.dbias:
        params.append("use_pdl: cutlass.Constexpr")
    params.append("stream")
    by_role = {s.role: s.name for s in table}
    ins = ", ".join(s.name for s in table if s.role == "input")
    scalars = ", ".join(s.name for s in table if s.role == "scalar")
    rest = [by_role.get(role, "None") for role in slots.LAUNCH_OPERANDS]
    args = [f"[{ins}]", f"[{scalars}]", *rest, "use_hw_e8m0", "use_pdl" if spec.dbias else "False", "stream"]
    return ", ".join(params), ", ".join(args)


def context(spec: QuantSpec, epilogue: Epilogue, tuning: Tuning | None = None) -> dict:
    """The complete Jinja context of one generated module."""
    n_in = len(epilogue.tensor_params)
    n_sc = len(epilogue.scalar_params)
    inputs = {i: f"x{i}" for i in range(n_in)}
    scalars = {i: f"s{i}" for i in range(n_sc)}
    epi, epi_out = ([], "x0") if epilogue.is_identity else ssa(epilogue.expr, "e", inputs, scalars,
                                                               builtin=epilogue.builtin)
    act = dact = None
    if spec.act:
        nodes, out = ssa(activations.act_ir(spec.act).expr, "f", {0: "v"}, {}, builtin=True)
        act = {"body": _body(lower(nodes)), "out": out, "name": spec.act}
    if spec.dact:
        nodes, out = ssa(activations.dact_ir(spec.dact).expr, "g", {0: "a"}, {}, builtin=True)
        dact = {"body": _body(lower(nodes)), "out": out, "name": spec.dact}
    params, call_args = _launcher_text(spec, epilogue)
    config = kernel_config(spec, epilogue, tuning)
    grouped_params, grouped_call_args = _launcher_text(spec, epilogue, grouped=True)
    return {
        "spec_text": repr(spec),
        "fingerprint": epilogue.fingerprint,
        "n_inputs": n_in,
        "n_scalars": n_sc,
        "config": repr(config),
        "config_names": "KernelConfig" if config.tuning is None else "KernelConfig, Tuning",
        "act": act,
        "dact": dact,
        "params": params,
        "call_args": call_args,
        "grouped_params": grouped_params,
        "grouped_call_args": grouped_call_args,
        "launchers": launchers(spec),
        "gemm": _gemm_launcher_text(spec, epilogue),
        "functions": _element_functions(inputs, scalars, epi, epi_out, act, dact),
        "kernels_hash": kernels_hash(),
    }


def _element_functions(inputs: dict, scalars: dict, epi, epi_out, act, dact) -> list[dict]:
    """The element functions of a generated module, in order: the epilogue, then act and dact
    where the op has them (name, parameters, docstring, body, result variable)."""
    out = [{"name": "epilogue", "params": ", ".join([*inputs.values(), *scalars.values()]),
            "doc": "The op's epilogue, lowered from its IR (codegen.lower): one rounding per operation.",
            "body": _body(lower(epi)), "out": epi_out}]
    for kind, fn, arg, prefix in (("act", act, "v", ""), ("dact", dact, "a", "d")):
        if fn is not None:
            out.append({"name": kind, "params": arg, "body": fn["body"], "out": fn["out"],
                        "doc": f"{prefix}{fn['name']}({arg}), docs/NUMERICS.md's formula (built-in: tanh_act and "
                               f"FMAs allowed)."})
    return out


def render(spec: QuantSpec, epilogue: Epilogue, tuning: Tuning | None = None) -> str:
    """The generated module's source. ``tuning``: a benchmark's kernels.config.Tuning, the one
    hook a benchmark builds a variant through (FusedOp._with_tuning); default the library's."""
    return environment().get_template(TEMPLATE_NAME).render(**context(spec, epilogue, tuning))
