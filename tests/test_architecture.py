"""The data path runs one way: no import circle inside mxq (lazy imports included), and the
kernel slot table is the one definition that every route reads (docs/DESIGN.md)."""

import ast
import re
from pathlib import Path

import mxq
from mxq.runtime import slots
from mxq.frontend.spec import QuantSpec

PKG = Path(mxq.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict:
    """mxq module -> the mxq modules it imports anywhere in its file (top level or lazily)."""
    graph = {}
    for path in PKG.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("mxq"):
                    continue
                for alias in node.names:  # `from . import x` imports module x when it exists
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if (PKG.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                             or (PKG.parent / sub.replace(".", "/")).is_dir() else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("mxq"))
        graph[name] = {d for d in deps if d != name}
    return graph


def find_cycle(graph: dict):
    """One import circle as a list of modules, or None. A package's __init__ importing its own
    submodules is how a package is built, not a circle: edges from a package to its children
    are left out."""
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if v.startswith(u + "."):
                continue
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v in graph and not state.get(v):
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if not state.get(u):
            found = visit(u)
            if found:
                return found
    return None


def test_no_import_circle_inside_mxq():
    graph = import_graph()
    assert "mxq.op" in graph and "mxq.kernels.quantize" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_circle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["mxq.runtime.compiler"] = graph["mxq.runtime.compiler"] | {"mxq.op"}  # compiler calling back into the op
    assert find_cycle(graph) is not None


def test_lower_stages_never_import_the_op_layer():
    graph = import_graph()
    lower = [m for m in graph if m.split(".")[1:2] in (["frontend"], ["formats"], ["kernels"], ["runtime"])]
    assert {"mxq.frontend.codegen", "mxq.runtime.compiler", "mxq.runtime.launch", "mxq.runtime.validation",
            "mxq.kernels.quantize", "mxq.formats.reference"} <= set(lower)
    for low in lower:
        assert "mxq.op" not in graph[low], low
        assert not any(d.startswith("mxq.integrations") for d in graph[low]), low


def test_only_fusedop_writes_its_state():
    """No module but op.py assigns an attribute of an op (``op._x = ``, ``setdefault`` on its
    __dict__)."""
    pattern = re.compile(r"\bop\.(_\w+)\s*(\[[^\]]*\])?\s*=[^=]|op\.__dict__")
    for path in PKG.rglob("*.py"):
        if path.name == "op.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.name}:{i}: {line.strip()}"


def test_dispatcher_slots_match_the_table():
    """csrc/dispatch.cc spells the destination-passing slots; they are the table's."""
    src = (PKG / "csrc" / "dispatch.cc").read_text()
    m = re.search(r"kSlots\[8\]\s*=\s*\{([^}]*)\}", src)
    assert m, "kSlots not found in dispatch.cc"
    assert tuple(re.findall(r'"(\w+)"', m.group(1))) == slots.DESTINATIONS
    enum = re.search(r"enum Slot \{([^}]*)\}", src).group(1)
    assert [e.strip().split(" ")[0] for e in enum.split(",")] == [
        "kAct", "kRowData", "kRowScale", "kColData", "kColScale", "kAmax", "kDbias", "kNoop"]


def test_slot_table_by_hand():
    names = [s.name for s in slots.kernel_slots(QuantSpec(colwise=True, amax=True, dact="gelu", dbias=True), 2, 1)]
    assert names == ["mIn0", "mIn1", "s0", "mActIn", "mRowData", "mRowScale", "mColData", "mColScale", "mAmax",
                     "mDbias", "mDbiasWs", "mNoop"]
    names = [s.name for s in slots.kernel_slots(QuantSpec(rowwise=False, colwise=True), 1, 0)]
    assert names == ["mIn0", "mColData", "mColScale", "mNoop"]


def test_dispatch_flags_by_hand():
    # bit 0 act_input, 1-2 rowwise data/scale, 3-4 colwise, 5 amax, 6 dbias, 7 e5m2, 8 swizzled
    assert slots.dispatch_flags(QuantSpec()) == 0b0000_0110
    assert slots.dispatch_flags(QuantSpec(scale_layout="swizzled", colwise=True)) == 0b1_0001_1110
    assert slots.dispatch_flags(QuantSpec(fp8="e5m2", rowwise=False, colwise=True, amax=True)) == 0b1011_1000
    assert slots.dispatch_flags(QuantSpec(dact="relu", dbias=True)) == 0b0100_0111
    assert slots.dispatch_flags(QuantSpec(format="fp8_block")) == 0b1_0000_0110  # (grouped calls: Python)


def test_generated_launchers_take_the_table_in_order():
    def two(x, r, alpha: float = 1.0):
        return x * alpha + r

    op = mxq.fused_quant(colwise=True, dbias=True, dact="silu")(two)
    src = op.source
    params = re.search(r"def launch\((.*)\):", src).group(1)
    names = [p.split(":")[0].strip() for p in params.split(",")]
    table = [s.name for s in slots.kernel_slots(op.spec, 2, 1)]
    assert names == table + ["use_hw_e8m0", "use_pdl", "stream"]


def test_dispatcher_workspace_dtype_is_numerics_rule():
    """csrc/dispatch.cc allocates the dbias workspace itself; its dtype rule is
    numerics.dbias_partial_dtype's (fp64 partials for fp32 inputs, fp32 for 16-bit ones)."""
    import torch

    from mxq.formats.numerics import dbias_partial_dtype

    src = (PKG / "csrc" / "dispatch.cc").read_text()
    m = re.search(r"x->dtype\.bits == 32 \? (f\d\d) : (f\d\d)", src)
    assert m, "the workspace dtype expression was not found in dispatch.cc"
    by_name = {"f32": torch.float32, "f64": torch.float64}
    assert by_name[m.group(1)] == dbias_partial_dtype(torch.float32)
    assert by_name[m.group(2)] == dbias_partial_dtype(torch.bfloat16) == dbias_partial_dtype(torch.float16)


def test_compile_cache_toolchain_inspection_flow_one_way():
    """The compile path's four jobs import only downward: toolchain <- cache <- compiler <-
    inspection (mxq/runtime/)."""
    graph = import_graph()
    order = ["mxq.runtime.toolchain", "mxq.runtime.cache", "mxq.runtime.compiler", "mxq.runtime.inspection"]
    for i, low in enumerate(order):
        assert not graph[low] & set(order[i + 1:]), (low, graph[low] & set(order[i + 1:]))


def test_public_modules_of_the_integrations_keep_their_names():
    """``mxq.distributed``, ``mxq.fsdp`` (integrations/) and ``mxq.targets`` (runtime/) stay importable by their
    public names, as attributes and as modules, each one module object (a fresh interpreter:
    nothing imported before)."""
    import subprocess
    import sys

    code = ("import sys, mxq\n"
            "assert 'mxq.integrations.fsdp' not in sys.modules\n"
            "import mxq.fsdp\n"
            "from mxq.distributed import all_gather\n"
            "import mxq.integrations.distributed as d, mxq.integrations.fsdp as f\n"
            "assert mxq.fsdp is f and mxq.distributed is d and all_gather is d.all_gather\n"
            "assert sys.modules['mxq.fsdp'] is f and f.__spec__.name == 'mxq.integrations.fsdp'\n"
            "assert callable(mxq.fsdp.mxfp8_all_gather)\n"
            "from mxq.targets import SUPPORTED_ARCHS\n"
            "import mxq.runtime.targets as t\n"
            "assert mxq.targets is t and SUPPORTED_ARCHS is t.SUPPORTED_ARCHS\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=PKG.parent, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
