"""AOT export: a shared library with the kernels embedded plus a C header, for C++ programs
that run with no Python (``op.export``, ``python -m mxq export``)."""

from __future__ import annotations

import filecmp
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

from .compiler import _DTYPE_BY_NAME, LAYOUT_CODES, compile_op
from .toolchain import compile_cxx, link_shared, runtime_libraries
from ..frontend import epilogue as epilogue_mod
from ..frontend import gated
from ..formats import groups
from . import limits, slots, targets
from ..kernels.config import UNIT
from ..formats.numerics import dbias_partial_dtype


# How a C++ caller passes an epilogue tensor of each operand kind (the compiler's LAYOUT_CODES,
# mxq/runtime/operands.py): always as an [M, N] tensor, with these strides (torch: the expand() / slice of
# the tensor it has). tests/test_cache.py holds the two key sets equal.
OPERAND_DOC = {
    "full": "contiguous",
    "strided": "strides (ld, 1), ld >= N (a column slice such as x[:, :N]; ld % 8 == 0 for _vec)",
    "row": "strides (0, 1): a [N] row broadcast down the rows (torch: b.expand(M, N))",
    "col": "strides (1, 0): a [M] column broadcast along the rows (torch: s.reshape(M, 1).expand(M, N))",
    "scalar": "strides (0, 0): one element (torch: a.reshape(1, 1).expand(M, N))",
}


def check_operands(op, operands):
    """``operands`` as a tuple of kinds, one per epilogue tensor, or None for all full."""
    if operands is None:
        return None
    names = op.epilogue.tensor_params
    if isinstance(operands, str) or not isinstance(operands, (tuple, list)) or len(operands) != len(names):
        raise ValueError(f"mxq: export() argument 'operands' must be a sequence of {len(names)} kind(s), one per "
                         f"epilogue tensor {names}, each one of {tuple(LAYOUT_CODES)}; got {operands!r}")
    for nm, k in zip(names, operands):
        if k not in LAYOUT_CODES:
            raise ValueError(f"mxq: export() argument 'operands': {nm!r} has kind {k!r}; kinds are "
                             f"{tuple(LAYOUT_CODES)}")
    if operands[0] not in ("full", "strided"):
        raise ValueError(f"mxq: export() argument 'operands': the first tensor {names[0]!r} sets the shape and "
                         f"must be 'full' or 'strided', got {operands[0]!r}")
    return None if all(k == "full" for k in operands) else tuple(operands)


MAX_NAME = 200  # (lib<name>.so, <name>.h; a file name has at most 255 bytes on Linux's file systems)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def default_name(epilogue) -> str:
    """The export name of an op exported without one: mxq_ and its epilogue function's name,
    which must then make a C identifier (a Python identifier may hold letters C's do not)."""
    name = f"mxq_{epilogue.name}"
    if not _C_IDENTIFIER.fullmatch(name):
        raise ValueError(f"mxq: the epilogue function {epilogue.name!r} gives the default export name {name!r}, "
                         "which is not a C identifier: name the export (a C identifier)")
    return name


def check_name(name) -> str:
    """An export name: a C identifier starting with a letter. Every exported function is the
    symbol ``__tvm_ffi_<function name>``, and TVM-FFI's loader gives symbols of its own meaning
    to ``__tvm_ffi__library_ctx``, ``_library_bin``, ``_metadata_*``, ``_doc_*``, ``_cubin_*``
    (a library exporting ``_library_ctx`` crashes its loader) and ``__tvm_ffi_main`` (the
    library's default entry), so names starting with an underscore and ``main`` are refused."""
    if not isinstance(name, str):
        raise TypeError(f"mxq: export() argument 'name' must be a str or None, got {type(name).__name__}")
    if not _C_IDENTIFIER.fullmatch(name):
        raise ValueError(f"mxq: export name must be a C identifier, got {name!r}")
    if len(name) > MAX_NAME:
        raise ValueError(f"mxq: export name must be at most {MAX_NAME} characters (its files lib<name>.so and "
                         f"<name>.h, and the functions' suffixes, within a file name's 255 bytes), got {len(name)}")
    if name.startswith("_") or name == "main":
        raise ValueError(f"mxq: export name {name!r} is reserved: TVM-FFI's loader gives meaning to the symbols "
                         f"'__tvm_ffi_main' and '__tvm_ffi__*'; start the name with a letter and not as 'main'")
    return name


def gated_export(op, dtype: str, operands):
    """(dtype, the inner op's operand kinds, the header note, N's multiple) of GatedOp.export,
    which exports its inner op, the kernels over the halves. Forward: a C++ caller passes each
    [M, 2N] tensor as its two halves, x[:, :N] and x[:, N:] (every tensor's gate half, then every
    up half; a row operand's [2N] halves likewise, a column or scalar operand twice); ``operands``:
    each of the gated op's tensors' kind, which both its halves take ("full" tensors' halves are
    "strided" views). Backward: the gradient(s) [M, N] as they are, then act_input's halves; the
    outputs are [M, 2N] (both halves side by side), N a multiple of 32 when the op has rowwise
    output (a block would straddle the halves)."""
    dtype = targets.normalize_dtype(dtype)
    kinds = check_operands(op, operands) or ("full",) * len(op.epilogue.tensor_params)
    inner = op.inner
    mult = limits.n_multiple(inner.spec, inner.epilogue)
    inner_kinds, note = gated_args(op.spec, op.epilogue, inner.epilogue, kinds, mult)
    return dtype, inner_kinds, note, mult


def gated_args(spec, epilogue, inner_epilogue, kinds, n_multiple: int):
    """(the inner op's operand kinds, the header note) of a gated op's export (mxq/frontend/gated.py;
    ``kinds``: the gated op's own tensors' kinds). Forward: every tensor's two halves, gate halves
    first. Backward: the gradient(s) as they are, then act_input's two halves."""
    if spec.act is not None:
        halves = tuple("strided" if k == "full" else k for k in kinds)
        params = epilogue.tensor_params
        gate, up = inner_epilogue.tensor_params[:len(params)], inner_epilogue.tensor_params[len(params):]

        def how(p, k, g, u):  # how tensor p of kind k reaches the arguments g (gate) and u (up)
            if k in ("col", "scalar"):
                return f"{g} and {u} both take {p} (a {k} operand serves both halves)"
            if k == "row":
                return f"{g} = {p}[:N], {u} = {p}[N:] (as [M, N] views of strides (0, 1))"
            return f"{g} = {p}[:, :N], {u} = {p}[:, N:]"

        which = "; ".join(how(p, k, g, u) for p, k, g, u in zip(params, kinds, gate, up))
        return halves * 2, (f"Gated op {epilogue.name} (act={spec.act!r}): its [M, 2N] tensors go in as "
                            f"their two halves, every gate half first, then every up half: {which}. The outputs are "
                            f"those of an [M, N] input.")
    params = ", ".join(epilogue.tensor_params)
    need = (f"N must be a multiple of {n_multiple} (rowwise blocks and 128x128 tiles may not straddle the "
            f"halves; the functions check it), " if n_multiple > 1 else "")
    note = (f"Gated backward {epilogue.name} (dact={spec.dact!r}): the arguments are the incoming "
            f"gradient ({params}, [M, N]), then act_input (the forward's [M, 2N] input) as its two halves, "
            f"_mxq_gate = act_input[:, :N] and _mxq_up = act_input[:, N:] (strided views). The outputs hold "
            f"both halves' gradients side by side: rowwise and colwise data [M, 2N], scale buffers, dbias and "
            f"its workspace sized for 2N columns, as listed below (checked). {need}\"_rows8\" also needs "
            f"N % {UNIT} == 0 (checked).")
    return (*kinds, "strided", "strided"), note


def check_note(note) -> None:
    """export()'s ``note``: text for the header's comment block, so a str of printable
    characters (whitespace folds into the paragraph) without a comment delimiter, which would
    end the comment and put the rest into the compiled header."""
    if not isinstance(note, str):
        raise TypeError(f"mxq: export() argument 'note' must be a str, got {type(note).__name__}")
    bad = next((c for c in note if not (c.isprintable() or c in " \t\n")), None)
    if bad is not None or "*/" in note or "/*" in note:
        what = f"the character {bad!r}" if bad is not None else "a C comment delimiter ('*/' or '/*')"
        raise ValueError(f"mxq: export() argument 'note' is a paragraph of the header's comment and must not hold "
                         f"{what}")


def export(op, directory, arch: str, dtype: str = "bf16", name: str | None = None, grouped: bool = False,
           operands=None, note: str = "", n_multiple: int = 1) -> dict:
    """Write ``lib<name>.so`` (its kernel variants, cubin embedded) and ``<name>.h`` to ``directory``;
    ``name`` defaults to ``mxq_<the epilogue function's name>`` (``libmxq_bias_gelu.so``).

    A C++ program loads the library with ``tvm::ffi::Module::LoadFromFile`` and calls
    ``<name>`` (any shape), ``<name>_vec`` (N % 8 == 0, 16-byte aligned) or ``<name>_rows8`` (FP8
    data rows on 8-byte boundaries, e.g. padded to 16 bytes) with the argument list
    the header documents; no Python is involved. ``grouped``: also ``<name>_grouped`` and
    ``<name>_vec_grouped``, the grouped kernels (int32 group ends last; docs/NUMERICS.md, "Groups").
    ``operands``: the kind of each epilogue tensor ("full", "strided", "row", "col", "scalar";
    mxq/runtime/operands.py), for kernels that read a bias [N] once per tile and the like (the header says
    which strides each kind takes); default all full. ``note``: a paragraph for the header.
    ``n_multiple``: every function refuses an N that is not a multiple of it (a gated backward's
    rowwise blocks must not straddle its halves); a two-halves op's ``_rows8`` also needs N % 8
    == 0 (its second half starts at column N; launch.variant_for).
    """
    layouts = check_operands(op, operands)
    check_note(note)
    arch = targets.normalize_arch(arch)
    gap = limits.arch_gap(op.spec, arch)
    if gap:
        raise ValueError(f"mxq: export(): {gap}")
    dtype = targets.normalize_dtype(dtype)
    name = check_name(default_name(op.epilogue) if name is None else name)
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"mxq: export() argument 'directory' must be a path (str or os.PathLike), got "
                        f"{type(directory).__name__}")
    if not os.fspath(directory):
        raise ValueError("mxq: export() argument 'directory' must name a directory, got '' (for the current "
                         "one, '.')")
    runtime = runtime_libraries()
    if f"lib{name}.so" in {Path(src).name for src in runtime}:
        raise ValueError(f"mxq: export name {name!r} is reserved: lib{name}.so is a runtime library the export "
                         "copies beside its own library, which would overwrite it")
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise ValueError(f"mxq: export() argument 'directory' is {os.fspath(out)!r}, which is a file, not a directory")
    functions, left_out = _served_functions(op, name, dtype, grouped)
    _check_destinations(out, name, functions, runtime)
    made = not out.exists()  # (a directory this export makes is removed again where it fails)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # (a file on its path, no permission: named before anything compiles)
        raise ValueError(f"mxq: export() argument 'directory' is {os.fspath(out)!r}, which cannot be made: "
                         f"{exc.strerror or exc}") from exc
    if not os.access(out, os.W_OK | os.X_OK):  # (a read-only one: named before anything compiles)
        raise ValueError(f"mxq: export() argument 'directory' is {os.fspath(out)!r}, which this process cannot "
                         "write into")
    try:
        return _write(op, out, name, arch, dtype, grouped, layouts, note, functions, left_out, runtime, n_multiple)
    except BaseException:
        if made:
            _remove_made(out, name, runtime)
        raise


def _write(op, out: Path, name: str, arch: str, dtype: str, grouped: bool, layouts, note: str, functions, left_out,
           runtime, n_multiple: int) -> dict:
    """export()'s files, into ``out`` (which exists), once every argument is checked."""
    objects = []
    with tempfile.TemporaryDirectory() as d:
        for variant, fname in functions:
            mult = math.lcm(n_multiple, UNIT) if variant == "rows8" and gated.is_halves(op.epilogue) else n_multiple
            if op.spec.is_fp4:  # (whole 1x16 blocks: limits.fp4_unserved's N rule)
                mult = math.lcm(mult, limits.NVFP4_N_MULTIPLE if op.spec.format == "nvfp4" else UNIT)
            compiled = compile_op(op, arch, dtype, variant=variant, layouts=layouts, n_multiple=mult)
            obj = Path(d) / f"{fname}.o"
            compiled.export_to_c(str(obj), function_name=UNCHECKED + fname, export_only_tvm_ffi_symbols=True)
            objects.append(obj)
        objects.append(_compile_checks(op, functions, Path(d)))
        # only the checked names leave the library (CuTeDSL's objects export nothing else today;
        # should a later version need more symbols exported, they belong in this list)
        script = Path(d) / "exports.map"
        script.write_text("{ global: " + " ".join(f"__tvm_ffi_{f};" for _, f in functions) + " local: *; };\n")
        lib = out / f"lib{name}.so"
        # relocatable: the runtime libraries it needs are copied beside it and found through
        # RUNPATH $ORIGIN, so the directory can move to a machine without this Python environment
        link_shared(objects, lib, rpaths=["$ORIGIN"], flags=["-Xlinker", f"--version-script={script}"])
    copies = [str(_copy_runtime(src, out / Path(src).name)) for src in runtime]
    header = out / f"{name}.h"
    header.write_text(_export_header(op, name, arch, dtype, grouped, layouts, note, functions, left_out))
    return {"library": str(lib), "header": str(header), "functions": [f for _, f in functions],
            "runtime_libraries": copies}


def _remove_made(out: Path, name: str, runtime) -> None:
    """Undo a failed export into the directory ``out`` it made: its library and header, then the
    runtime copies and the directory where nothing else is there (another export may be writing
    into the same new directory: its files, and the runtime copies they load, stay)."""
    for path in (out / f"lib{name}.so", out / f"{name}.h"):
        path.unlink(missing_ok=True)
    copies = {Path(src).name for src in runtime}
    try:
        if any(p.name not in copies for p in out.iterdir()):
            return
        for copy in copies:
            (out / copy).unlink(missing_ok=True)
        out.rmdir()
    except OSError:  # (something else arrived meanwhile: it stays)
        pass


def _copy_runtime(src, dst: Path) -> Path:
    """``dst``, a copy of the runtime library ``src``: left as it is where it holds the same
    bytes, else replaced as a whole (a new file renamed over it): a program that has the old
    copy loaded keeps its mapping, where a copy over the same file would change the pages under
    it (SIGBUS)."""
    if dst.exists() and (os.path.samefile(src, dst) or filecmp.cmp(src, dst, shallow=False)):
        return dst
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.")
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
    return dst


_MACRO = re.compile(r'^#define (\w+)_NAME "([^"]*)"', re.M)


def _check_destinations(out: Path, name: str, functions, runtime) -> None:
    """Refuse, before anything compiles, an export whose files would not land as plain files in
    ``out`` (its library, header or a runtime library's copy being a directory or another
    non-file, or a symbolic link the copy would write through), or that collides with another
    export in ``out`` (its header and library): a name differing only in case (the header's
    include guard and macros upper-case it), or a function whose _NAME macro (its upper-cased
    name) the other's header defines too. An including program would silently get one header's
    macros."""
    ours = [out / f"lib{name}.so", out / f"{name}.h"]
    for path in ours + [out / Path(src).name for src in runtime]:
        same = path not in ours and path.exists() and any(os.path.samefile(path, src) for src in runtime)
        if path.is_symlink() and not same:  # (a link to the runtime library itself: left as it is)
            raise ValueError(f"mxq: export() would write through the symbolic link {os.fspath(path)!r}; remove it "
                             "or pick another directory")
        if path.exists() and not path.is_file():
            raise ValueError(f"mxq: export() writes the file {os.fspath(path)!r}, which exists and is not a file; "
                             "remove it or pick another directory")
    if not out.is_dir():
        return
    macros = {f.upper(): f for _, f in functions}
    for header in sorted(out.glob("*.h")):
        if header.stem == name or not (out / f"lib{header.stem}.so").exists():
            continue  # (this export's own header, rewritten; a header that is not an export's)
        if header.stem.upper() == name.upper():
            raise ValueError(f"mxq: export name {name!r} differs from the export {header.stem!r} in "
                             f"{os.fspath(out)!r} only in case: their headers' include guard "
                             f"(MXQ_EXPORT_{name.upper()}_H_) "
                             "and their functions' _NAME macros would collide; pick another name or directory")
        for macro, value in _MACRO.findall(header.read_text(errors="replace")):
            if macro in macros:
                raise ValueError(f"mxq: export name {name!r}: its function {macros[macro]!r} and the export "
                                 f"{header.stem!r}'s {value!r} in {os.fspath(out)!r} share the macro {macro}_NAME, "
                                 "which a program including both headers would get one of; pick another name or "
                                 "directory")


# The compiled kernel functions' names inside the library; each exported name is the argument
# check of csrc/export_check.h in front of one of them (_compile_checks).
UNCHECKED = "_mxq_unchecked_"

# mxq/runtime/slots.py's roles -> export_check.h's Role enumerators (kOther for the rest; the first
# input, kInput0, is found by its index; the colwise data of an op whose colwise copy is transposed,
# limits.cpp_transposed, is kColDataT: [N, M])
_CHECK_ROLES = {"rowwise_data": "kRowData", "rowwise_scale": "kRowScale", "colwise_data": "kColData",
                "colwise_scale": "kColScale", "dbias": "kDbias", "dbias_workspace": "kWorkspace",
                "group_offsets": "kGroupEnds", "amax": "kAmax"}


def _compile_checks(op, functions, directory: Path) -> Path:
    """An object file that defines every exported function as csrc/export_check.h's check of
    its arguments' sizes, then the compiled function (``UNCHECKED`` + its name). Rendered from
    the slot table and validated names only."""
    import tvm_ffi.libinfo

    spec, epi = op.spec, op.epilogue
    halves = int(gated.is_halves(epi))
    facts = limits.cpp_facts(spec, epi)
    # (FP4's colwise copy is transposed too, [N, M/2]: two values a byte, per_byte)
    roles_by = dict(_CHECK_ROLES, **({"colwise_data": "kColDataT"} if spec.colwise_transposed else {}))
    per_byte = 2 if spec.is_fp4 else 1
    m_multiple = UNIT if spec.is_fp4 and spec.colwise else 1  # (FP4's colwise words: 8 rows each)
    amax = ("mxq_export::kAmaxPerGroup" if spec.format == "nvfp4" else "mxq_export::kAmaxOne")
    scale_text = {"nvfp4": "uint8 (E4M3 bytes)", "mxfp4": "uint8 (E8M0 bytes)"}.get(
        spec.format, "float32 (fp32 scales)" if spec.block_format.scale == "fp32" else "uint8 (E8M0 bytes)")
    parts = ['#include "export_check.h"', "",
             f"static const int64_t kFacts[mxq_sizes::kFacts] = {{{', '.join(map(str, facts))}}};  "
             "// slots.scale_facts", ""]
    for k, (variant, fname) in enumerate(functions):
        table = slots.kernel_slots(spec, len(epi.tensor_params), gated.launch_scalars(epi), variant.endswith("_grouped"))
        roles = ["kInput0" if (s.role == "input" and s.index == 0) else roles_by.get(s.role, "kOther")
                 for s in table]
        names = ", ".join(f'"{s.name}"' for s in table)
        parts.append(f"""extern "C" int __tvm_ffi_{UNCHECKED}{fname}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
static const int kRoles{k}[] = {{{", ".join("mxq_export::" + r for r in roles)}}};
static const char* const kNames{k}[] = {{{names}}};
static const mxq_export::Function kFunction{k} = {{"{fname}", {len(table)}, kRoles{k}, kNames{k}, kFacts, {halves},
                                                 {groups.MAX_GROUPS}, {per_byte}, {m_multiple}, {amax},
                                                 "{scale_text}", {UNIT if variant == "rows8" else 1}}};
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_{fname}(void* self, const TVMFFIAny* args, int32_t num_args,
                                                  TVMFFIAny* result) {{
  if (mxq_export::Check(kFunction{k}, args, num_args) != 0) return -1;
  return __tvm_ffi_{UNCHECKED}{fname}(self, args, num_args, result);
}}
""")
    src, obj = directory / "checks.cc", directory / "checks.o"
    src.write_text("\n".join(parts))
    csrc = Path(__file__).resolve().parents[1] / "csrc"
    compile_cxx(src, obj, [tvm_ffi.libinfo.find_include_path(), str(csrc)])
    return obj


def _functions(name: str, grouped: bool, given: bool = False):
    """(compiler variant, exported function name) pairs; ``given``: NVFP4's quantize pass of a
    given amax too ("vec_given": the caller writes the amax into mAmax)."""
    pairs = [("generic", name), ("vec", f"{name}_vec"), ("rows8", f"{name}_rows8")]
    pairs += [("vec_given", f"{name}_vec_given")] if given else []
    pairs += [("generic_grouped", f"{name}_grouped"), ("vec_grouped", f"{name}_vec_grouped")] if grouped else []
    return pairs + ([("vec_given_grouped", f"{name}_vec_given_grouped")] if grouped and given else [])


def _served_functions(op, name: str, dtype: str, grouped: bool):
    """(the (variant, name) pairs exported, {a name left out: why}): a variant the kernels do not
    serve for ``dtype`` (limits.cpp_gap: FP8 block scaling's fp32 "generic") is left out."""
    served, left_out = [], {}
    for variant, fname in _functions(name, grouped, op.spec.format == "nvfp4"):
        gap = limits.cpp_gap(op.spec, op.epilogue, dtype, variant, variant.endswith("_grouped"))
        if gap:
            left_out[fname] = gap
        else:
            served.append((variant, fname))
    return served, left_out


# the colwise data's line of an op whose colwise copy is transposed (limits.cpp_transposed; the slot
# table's line says [M, N])
TRANSPOSED_DOC = "uint8[{w}, M]{pad}(FP8 bytes, the transposed colwise copy: contiguous, {blocks})"


def _slot_lines(spec, epi, el: str, ws: str, grouped: bool) -> str:
    args = []
    n_out = "2N" if gated.is_halves(epi) else "N"
    tile_rows = limits.cpp_facts(spec, epi)[-1]
    transposed = limits.cpp_transposed(spec)
    for s in slots.kernel_slots(spec, len(epi.tensor_params), gated.launch_scalars(epi), grouped, n_out, tile_rows):
        doc = s.doc.replace("dtype[", f"{el}[").replace("ws[", f"{ws}[")
        if transposed and s.role == "colwise_data":
            br, bc = slots.direction_facts(spec, True)[:2]
            doc = TRANSPOSED_DOC.format(w=n_out, pad=" " * (9 - len(n_out)),
                                        blocks=f"blocks of {br} along M" if bc == 1 else f"{br}x{bc} tiles")
        args.append(f"  {s.name:<11} {doc}")
    return "\n".join(" * " + a for a in args)


def _export_header(op, name: str, arch: str, dtype: str, grouped: bool = False, layouts=None,
                   note: str = "", functions=None, left_out=None) -> str:
    import textwrap

    from .._version import __version__

    spec, epi = op.spec, op.epilogue
    operand_doc = "".join(f"\n *   {f'mIn{i}':<11} ({p}): {OPERAND_DOC[k]}"
                          for i, (p, k) in enumerate(zip(epi.tensor_params, layouts or ())) if k != "full")
    if operand_doc:
        operand_doc = "\n *\n * Epilogue tensors with their own layout (each passed as an [M, N] tensor):" + operand_doc
    # (no line break inside a slice such as x[:, :N])
    wrapped = textwrap.wrap(note.replace(", :", ",\0:"), 92)
    note_doc = "".join(f"\n * {line}".replace("\0", " ") for line in wrapped) + "\n *" if note else ""
    el = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[dtype]
    ws = str(dbias_partial_dtype(_DTYPE_BY_NAME[dtype])).removeprefix("torch.")
    lines = _slot_lines(spec, epi, el, ws, False)
    guard = "MXQ_EXPORT_" + name.upper() + "_H_"  # (prefixed: a name such as tvm_ffi_function is another's guard)
    padding = (" * Swizzled scale buffers must be zero before each grouped call: the kernels write the\n"
               " * groups' scales only, and the padding between groups moves with the offsets (e.g.\n"
               " * cudaMemsetAsync them first)." if spec.scale_layout == "swizzled" else
               " * mColScale must be zero before each grouped call: the kernels write the groups' colwise\n"
               " * blocks only, and the columns between groups move with the offsets." if spec.is_fp4 and spec.colwise else
               " * The kernels write every scale byte, the compact padding rows between groups as zero.")
    exported = [f for _, f in (functions if functions is not None else _functions(name, grouped))]
    which = [f'"{f}"' for f in exported if f.endswith("_grouped")]
    which_grouped = (" and ".join(which) + " (the same conditions" + (
        "; the colwise copy's group ends even: a byte packs two rows" if spec.is_fp4 and spec.colwise else "")
        + (") are the grouped kernels" if len(which) > 1 else ") is the grouped kernel"))
    grouped_doc = "" if not grouped else f"""
 *
 * {which_grouped} (row groups,
 * docs/NUMERICS.md "Groups"): G cumulative int32 group ends along the rows, read on the device
 * (clamped to [0, M]; not validated). Their arguments:
 *
{_slot_lines(spec, epi, el, ws, True)}
 *
{padding}"""
    which_n = "any M and N % 8 == 0 (the second half starts at column N)" if gated.is_halves(epi) else "any M, N"
    rows8_doc = f"""
 *
 * "{name}_rows8" serves {which_n} when rowwise_data and colwise_data
 * (where given) hold rows that start on 8-byte boundaries (an address and a row stride that are
 * multiples of 8 bytes, e.g. rows padded to 16 bytes: strides (ld, 1), ld >= N); at N % 8 != 0 it
 * is the faster of the two (it stores whole 8-byte units; fp32 plain colwise casts run the same
 * kernel as "{name}")."""
    takers = f'Those two and "{name}_rows8" (below)'
    functions = functions if functions is not None else _functions(name, grouped)
    left_out = left_out or {}
    defines = "".join(f'\n#define {f.upper()}_NAME "{f}"' for _, f in functions)
    left_doc = "".join("\n *\n * " + "\n * ".join(textwrap.wrap(
        f'Not in this library: "{f}" ({why}; the calls it would serve have no kernel).', 92))
        for f, why in left_out.items())
    faster, take = " and is faster", "take"
    if name in left_out and f"{name}_rows8" in left_out:  # (the transposed copy: "_vec" alone has a kernel)
        serves, takers, rows8_doc, faster, take = "", "It", "", "", "takes"
    elif name in left_out:  # (no "{name}": the two others serve what has a kernel)
        serves, takers = "", f'It and "{name}_rows8" (below)'
    else:
        serves = f'"{name}" serves any M, N >= 1; '
    label = {"mxfp8": "MXFP8", "fp8_block": f"FP8 block-scaling ({spec.block[0]}x{spec.block[1]} blocks, fp32 scales)",
             "nvfp4": "NVFP4 (E2M1 data, E4M3 scales per 16, a per-tensor amax)",
             "mxfp4": "MXFP4 (E2M1 data, E8M0 scales per 32)"}
    if spec.is_fp4:  # (the aligned kernel alone: whole blocks, 16-byte aligned tensors)
        rows8_doc = "" if spec.format != "nvfp4" else f"""
 *
 * "{name}_vec_given" takes the same arguments with mAmax holding a known amax (delayed scaling,
 * Python's global_amax=): it runs the quantize pass alone."""
    aligned = ("N % 16 == 0" if spec.format == "nvfp4" else "N % 8 == 0") + (
        " (and M % 8 == 0: the colwise copy's 8-row words)" if spec.is_fp4 and spec.colwise else "")
    return f"""/* Generated by mxq {__version__}: AOT export of one fused {label.get(spec.format, spec.format)} quantization op.
 *
 * op: {'mxq.quantize (no epilogue)' if epi is epilogue_mod.IDENTITY else epi.name}  spec: {spec}
 * input dtype: {dtype}   arch: {arch}   epilogue fingerprint: {epi.fingerprint}
 *{note_doc}
 * lib{name}.so exports {len(functions)} TVM-FFI functions (load with tvm::ffi::Module::LoadFromFile and
 * GetFunction): {serves}"{name}_vec" needs {aligned} and 16-byte
 * aligned [M, N] tensors{faster}. {takers} {take} these positional arguments (DLPack tensors on
 * one CUDA device; the launch uses TVM-FFI's environment stream, see TVMFFIEnvSetStream):
 *
{lines}{operand_doc}{rows8_doc}{grouped_doc}{left_doc}
 *
 * Every argument is checked before the kernels run: its count and types (TypeError), then
 * dtypes, devices, alignment and shapes against mIn0's M and N (and G), including each flat
 * scale buffer's length and the workspace's rows as listed above (ValueError naming the
 * argument); errors are tvm::ffi::Error.
 * The directory is relocatable: libcute_dsl_runtime.so and libtvm_ffi.so (which need only system
 * libraries; the CUDA driver is loaded at run time) are copied beside lib{name}.so, whose RUNPATH
 * is $ORIGIN. A program links against libtvm_ffi.so from here (or its own copy of TVM-FFI).
 */
#ifndef {guard}
#define {guard}{defines}
#endif  /* {guard} */
"""
