"""``python -m mxq {info,render,compile,export}``: what mxq generates, from the shell.

An op is chosen either by quantize options (``--fp8 e5m2 --colwise --act gelu`` builds the
built-in identity-epilogue op; ``--format fp8_block --block 128x128``, ``--format nvfp4
--stochastic-rounding`` pick the other formats and their options, mxq.QuantSpec's) or by
``FILE.py[:NAME]``, which imports that file and takes the ``@mxq.fused_quant`` op called NAME
(or the only one there).

Errors a user can cause (a bad option or combination, an unsupported arch, a missing file, an
epilogue outside the language, a bad export name) print one line, ``mxq: ...``, on stderr and exit
with status 2. The line is mxq's own message: mxq's user-facing ``ValueError``/``TypeError``
messages start with "mxq: ", and ``EpilogueError`` names the file and line. Any other exception
is a bug (in mxq, or in code the user's file runs) and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from . import get_include
from ._version import __version__
from .frontend import codegen
from .runtime import cache
from .frontend.epilogue import EpilogueError
from .op import FusedOp, GatedOp, _identity, _quantize_op
from .frontend.spec import ACTIVATIONS, FORMAT_NAMES, GATED_ACTIVATIONS, QuantSpec, format_choices
from .runtime.targets import SUPPORTED_ARCHS, normalize_arch, normalize_dtype
from .runtime.toolchain import ToolchainError

PROG = "python -m mxq"
_DESCRIPTION = """\
What mxq generates, from the shell. An op is chosen either by quantize options
(--fp8 e5m2 --colwise --act gelu builds the built-in quantize op) or by FILE.py[:NAME], which
imports that file and takes the @mxq.fused_quant op called NAME (or the only one there).
Mistakes print one line on stderr and exit with status 2."""
DTYPE_CHOICES = ("bf16", "fp16", "fp32")
DEFAULT_ARCH = "sm_90"
BUILTIN_EXPORT_NAME = "mxq_quantize"  # export's default --name for the built-in quantize op

# the options that build the built-in quantize op (dest -> default); a FILE.py op takes its own
# options from its @mxq.fused_quant(...), so these must stay at their defaults with a FILE.py target
_OP_DEFAULTS = {"format": "mxfp8", "fp8": "e4m3", "no_rowwise": False, "colwise": False, "scale_mode": None,
                "scale_layout": "compact", "block": None, "amax": False, "act": None, "dact": None, "dbias": False,
                "block_2d": False, "hadamard": False, "hadamard_signs": None, "stochastic_rounding": False}
# every format's scale modes and layouts, in QuantSpec's order (each option's own choices per format: --help)
_SCALE_MODES = tuple(dict.fromkeys(m for f in FORMAT_NAMES for m in format_choices(f)["scale_mode"]))
_SCALE_LAYOUTS = tuple(dict.fromkeys(m for f in FORMAT_NAMES for m in format_choices(f)["scale_layout"]))


class UsageError(Exception):
    """A mistake in the command line or in the files it names: one line on stderr, exit 2."""


# mxq's words for the options the CLI passes on -> the CLI's flags: those every command has (its own
# arguments), then the built-in quantize op's spec options (an op from FILE.py keeps the words of its
# own @mxq.fused_quant(...) options, which no flag of the command sets)
_AS_FLAGS = (
    (r"^mxq: export\(\): ", "mxq: "),
    (r"^mxq: export\(\) (?=writes |would write )", "mxq: --dir, --name: the export "),
    (r"\bwith group_offsets\b", "with --grouped"),
    (r"\bexport\(\) argument 'operands'", "--operands"),
    (r"\bexport\(\) argument 'directory'", "--dir"),
    (r"\bexport name\b", "--name"),
    (r"\b(dtype|arch)=(?:'([^']*)'|None)", lambda m: f"--{m[1]} {m[2] or 'None'}"),
)
_SPEC_AS_FLAGS = (
    (r"at least one of rowwise and colwise must be True",
     "--no-rowwise needs --colwise (at least one of the rowwise and colwise outputs is written)"),
    (r"\bact and dact are exclusive", "--act and --dact are exclusive"),
    (r"\bblock_2d and hadamard are exclusive", "--block-2d and --hadamard are exclusive"),
    (r"^mxq: fp8 does not apply\b", "mxq: --fp8 does not apply"),
    (r"\b(fp8|act|dact|scale_mode|scale_layout|format)=(?:'([^']*)'|None)",
     lambda m: f"--{m[1].replace('_', '-')} {m[2] or 'None'}"),
    (r"\b(block_2d|hadamard|stochastic_rounding)=True", lambda m: "--" + m[1].replace("_", "-")),
    (r"\bhadamard_signs\b", "--hadamard-signs"),
    (r"\bblock=\((\d+), (\d+)\)", lambda m: f"--block {m[1]}x{m[2]}"),
    (r"\b(block|scale_mode|scale_layout|fp8|format) must be one of",
     lambda m: f"--{m[1].replace('_', '-')} must be one of"),
    (r"\((\d+), (\d+)\)", lambda m: f"{m[1]}x{m[2]}"),  # (a block's (rows, columns) as --block writes it)
    (r"\bcolwise=True", "--colwise"),
)


@contextlib.contextmanager
def _in_flags(spec_flags: bool = True):
    """mxq's errors about options the CLI passed on, reworded in its flags (a UsageError);
    ``spec_flags`` False (an op from FILE.py): only the command's own arguments reworded."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        message = str(exc)
        if not message.startswith("mxq:"):
            raise  # not one of mxq's messages to users (main keeps its traceback)
        for pattern, flags in _AS_FLAGS + (_SPEC_AS_FLAGS if spec_flags else ()):
            message = re.sub(pattern, flags, message)
        raise UsageError(message) from None


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (not usage + message) and exit status 2."""

    def error(self, message):
        if message.endswith("required: command"):  # (an unknown option before any command: named, not this)
            unknown = [a for a in getattr(self, "argv", ()) if a.startswith("-") and a not in ("-h", "--help")]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        hint = "" if ("choose from" in message or "must be one of" in message) else \
            f" (see `{self.prog} --help`)"
        self.exit(2, f"mxq: {message}{hint}\n")


class _IncludeDir(argparse.Action):
    """``--includedir``: print the directory holding mxq/mxq.hpp and exit (like ``--version``)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(get_include())
        parser.exit(0)


def _arch(value: str) -> str:
    try:
        return normalize_arch(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("mxq: ").removeprefix("arch ")) from None


def _dtype(value: str) -> str:
    try:
        return normalize_dtype(value)  # torch's names too: --dtype bfloat16
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(DTYPE_CHOICES)}, "
                                         "or torch's name for one, e.g. bfloat16)") from None


def _block_arg(value: str) -> tuple:
    """--block RxC (e.g. 1x128) as QuantSpec's (rows, columns)."""
    m = re.fullmatch(r"(\d+)x(\d+)", value)
    if not m:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLUMNS such as 1x128 or 128x128, got {value!r}")
    return int(m[1]), int(m[2])


def _signs_arg(value: str) -> tuple:
    """--hadamard-signs S0,S1,...,S15 (each 1 or -1) as QuantSpec's tuple."""
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 16 comma-separated signs such as 1,-1,1,...; got {value!r}") from None


def _per_format(option: str) -> str:
    """An option's choices per format, for --help: "mxfp8: a (default), b; fp8_block: ..."."""
    parts = []
    for f in FORMAT_NAMES:
        values = format_choices(f)[option]
        parts.append(f"{f}: " + ", ".join(v + (" (default)" if i == 0 and len(values) > 1 else "")
                                          for i, v in enumerate(values)))
    return "; ".join(parts)


def _add_op_args(p: argparse.ArgumentParser) -> None:
    d = _OP_DEFAULTS
    p.add_argument("target", nargs="?", metavar="FILE.py[:NAME]",
                   help="a file holding @mxq.fused_quant ops, and which one (needed if it holds several); "
                        "without it, the built-in quantize op the options below describe")
    p.add_argument("--format", default=d["format"], choices=FORMAT_NAMES,
                   help="the block-scaled format (default mxfp8): mxfp8 (E8M0 scales per 32), fp8_block (fp32 "
                        "scales per 1x128 or 128x128, FP8 block scaling), nvfp4 (E2M1, E4M3 scales per 16, a "
                        "tensor amax), mxfp4 (E2M1, E8M0 scales per 32)")
    p.add_argument("--fp8", default=d["fp8"], choices=("e4m3", "e5m2"), help="FP8 format (default e4m3)")
    p.add_argument("--no-rowwise", action="store_true", help="do not write rowwise data (blocks along N)")
    p.add_argument("--colwise", action="store_true",
                   help="also write colwise data (blocks along M; FP4 and fp8_block's gemm layout: the transposed copy)")
    p.add_argument("--scale-mode", default=d["scale_mode"], choices=_SCALE_MODES,
                   help="how the block scale is chosen, per format (" + _per_format("scale_mode") + ")")
    p.add_argument("--scale-layout", default=d["scale_layout"], choices=_SCALE_LAYOUTS,
                   help="scale layout (default compact): " + _per_format("scale_layout") +
                        " (swizzled: cuBLAS's 128x4 atoms; gemm: what a Hopper FP8 GEMM takes)")
    p.add_argument("--block", default=d["block"], type=_block_arg, metavar="RxC",
                   help="fp8_block's block: 1x128 (default; activations, gradients) or 128x128 (weights)")
    p.add_argument("--block-2d", action="store_true", help="nvfp4: 16x16 tiles (weights), each tile's scale in "
                                                           "every row's entry")
    p.add_argument("--hadamard", action="store_true",
                   help="nvfp4: the random Hadamard transform on the colwise copy (bf16 inputs)")
    p.add_argument("--hadamard-signs", default=d["hadamard_signs"], type=_signs_arg, metavar="S0,...,S15",
                   help="nvfp4 with --hadamard: the transform's 16 signs, each 1 or -1 (default TE's; "
                        "--hadamard-signs=-1,... where the first is -1)")
    p.add_argument("--stochastic-rounding", action="store_true", help="nvfp4: stochastic rounding (gradients)")
    p.add_argument("--amax", action="store_true", help="also write the absolute maximum of the values quantized")
    p.add_argument("--act", choices=ACTIVATIONS + tuple(GATED_ACTIVATIONS),
                   help="activation applied before quantizing (swiglu, ...: gated, over the input's two halves)")
    p.add_argument("--dact", choices=ACTIVATIONS + tuple(GATED_ACTIVATIONS),
                   help="activation gradient: the result times dact(act_input), for the backward pass")
    p.add_argument("--dbias", action="store_true", help="also write the column sums (bias gradient)")


def _add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default=DEFAULT_ARCH, type=_arch, metavar="ARCH",
                   help=f"GPU target, one of: {', '.join(SUPPORTED_ARCHS)} (default {DEFAULT_ARCH})")
    p.add_argument("--dtype", default="bf16", type=_dtype, choices=DTYPE_CHOICES,
                   help="input dtype (default bf16; torch's names such as bfloat16 work too)")


def split_target(target: str) -> tuple[str, str]:
    """FILE.py[:NAME] -> (FILE.py, NAME or ""): NAME is what follows the last colon when it is an
    identifier or a dotted path of them (an op in a class: Holder.op) and what precedes it names
    a file, so a path may hold colons itself."""
    path, _, name = target.rpartition(":")
    if path and all(part.isidentifier() for part in name.split(".")) and not Path(target).exists():
        return path, name
    return target, ""


def _load_file_op(target: str) -> FusedOp:
    path, name = split_target(target)
    file = Path(path)
    if not file.exists():
        if path.endswith(":") and Path(path[:-1]).exists():  # (FILE.py: with the op's name left out)
            raise UsageError(f"mxq: {path!r} names no op after its colon: give FILE.py:NAME, or FILE.py alone "
                             "for its one op")
        raise UsageError(f"mxq: no such file: {path}")
    if not file.is_file():
        raise UsageError(f"mxq: {path} is not a file (expected FILE.py[:NAME])")
    spec = importlib.util.spec_from_file_location(f"mxq_user_{abs(hash(file.resolve()))}", file)
    if spec is None:
        raise UsageError(f"mxq: {path} is not a Python file (expected FILE.py[:NAME])")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    here = str(file.resolve().parent)  # (its imports of modules beside it resolve as `python FILE.py`'s do)
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        spec.loader.exec_module(mod)  # EpilogueError (and any bug of the file's own) propagate
    except SyntaxError as exc:
        raise UsageError(f"mxq: {exc.filename}:{exc.lineno}: {exc.msg}") from None
    except SystemExit as exc:  # (exit 0 would read as the command's success, with nothing done)
        raise UsageError(f"mxq: {path} called sys.exit({exc.code!r}) while it was imported, before any op was "
                         "taken from it (guard its script part with if __name__ == '__main__':)") from None
    named = {k: v for k, v in vars(mod).items() if isinstance(v, FusedOp)}
    # the ops the file makes (not ones it imports), each once (a second name of one is not another op)
    ops = {}
    for k, v in named.items():
        if v.fn.__module__ == mod.__name__ and all(v is not o for o in ops.values()):
            ops[k] = v
    if name:
        found = mod
        for part in name.split("."):  # (Holder.op: an op that is a class attribute)
            found = getattr(found, part, None)
        if not isinstance(found, FusedOp):
            raise UsageError(f"mxq: {path} has no @mxq.fused_quant op named {name!r} (found: {sorted(named)})")
        return found
    if len(ops) != 1:
        # (ops that are attributes of the file's classes are served by name only: Holder.op)
        held = sorted(f"{k}.{a}" for k, c in vars(mod).items() if isinstance(c, type) and c.__module__ == mod.__name__
                      for a, v in vars(c).items() if isinstance(getattr(c, a, None), FusedOp))
        classes = f" and {len(held)} in its classes ({held})" if held else ""
        raise UsageError(f"mxq: {path} defines {len(ops)} ops at module level ({sorted(ops)}){classes}; pick one with "
                         f"{path}:NAME")
    return next(iter(ops.values()))


def _op_from_args(args) -> FusedOp:
    if args.target:
        changed = [k for k, v in _OP_DEFAULTS.items() if getattr(args, k) != v]
        if changed:
            flags = ", ".join("--" + k.replace("_", "-") for k in changed)
            verb = "describes" if len(changed) == 1 else "describe"
            raise UsageError(f"mxq: {flags} {verb} the built-in quantize op; {args.target} takes its "
                             f"options from its @mxq.fused_quant(...)")
        return _load_file_op(args.target)
    with _in_flags():
        spec = QuantSpec(fp8=args.fp8, rowwise=not args.no_rowwise, colwise=args.colwise,
                         scale_mode=args.scale_mode, scale_layout=args.scale_layout, amax=args.amax,
                         act=args.act, dact=args.dact, dbias=args.dbias, format=args.format, block=args.block,
                         block_2d=args.block_2d, hadamard=args.hadamard,
                         stochastic_rounding=args.stochastic_rounding, hadamard_signs=args.hadamard_signs)
        return GatedOp(_identity, spec) if spec.gated else _quantize_op(spec)


def cmd_info(args) -> int:
    print(f"mxq {__version__}")
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "jinja2"):
        try:
            print(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            print(f"{dist}: not installed")
    print(f"kernels  {codegen.kernels_hash()}, templates at {codegen._template_dir()}")
    print(f"cache dir {cache.cache_dir()}")
    print(f"archs    {', '.join(SUPPORTED_ARCHS)}")
    return 0


def cmd_render(args) -> int:
    print(_op_from_args(args).source, end="")
    return 0


def cmd_compile(args) -> int:
    if args.ptx and not Path(args.ptx).resolve().parent.is_dir():  # before a compile, not after
        raise UsageError(f"mxq: --ptx {args.ptx}: no such directory: {Path(args.ptx).parent}")
    if args.ptx and Path(args.ptx).is_dir():
        raise UsageError(f"mxq: --ptx {args.ptx} is a directory: name the file to write the PTX to")
    op = _op_from_args(args)
    with _in_flags(not args.target):
        art = op.asm(arch=args.arch, dtype=args.dtype)
    print(f"op       {op.epilogue.name} {op.spec}")
    print(f"source   {art['path']}")
    print(f"arch     {art['arch']}   input dtype {art['dtype']}")
    print(f"ptx      {len(art['ptx'])} bytes, mlir {len(art['mlir'])} bytes")
    for name, info in art.get("kernels", {}).items():
        short = name.split("_tensor")[0]
        print(f"kernel   {short}: {info.get('registers', '?')} registers, "
              f"{info.get('spill_stores', '?')} B spill stores, {info.get('spill_loads', '?')} B spill loads")
    if art.get("ptxas_note"):
        print(f"note     {art['ptxas_note']}")
    print("cvt      " + ", ".join(art["conversions"]))
    if args.ptx:
        Path(args.ptx).write_text(art["ptx"])
        print(f"wrote    {args.ptx}")
    return 0


def cmd_export(args) -> int:
    op = _op_from_args(args)
    operands = tuple(args.operands.split(",")) if args.operands is not None else None
    with _in_flags(not args.target):
        name = args.name if args.name is not None else (None if args.target else BUILTIN_EXPORT_NAME)  # (None: FusedOp.export's default)
        info = op.export(args.dir, arch=args.arch, dtype=args.dtype, name=name, grouped=args.grouped,
                         operands=operands)
    print(f"library  {info['library']}")
    print(f"header   {info['header']}")
    print(f"functions {', '.join(info['functions'])}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--includedir", action=_IncludeDir,
                    help="print the directory holding mxq/mxq.hpp and exit (-I$(python -m mxq --includedir))")
    sub = ap.add_subparsers(dest="command", required=True, title="commands")
    subs = []
    p = sub.add_parser("info", help="versions, template hash, cache directory, supported archs",
                       description="Versions, template hash, cache directory, supported archs.")
    p.set_defaults(fn=cmd_info)
    subs.append(p)
    p = sub.add_parser("render", help="print the generated CuTeDSL module",
                       description="Print the generated CuTeDSL module of an op.")
    _add_op_args(p)
    p.set_defaults(fn=cmd_render)
    subs.append(p)
    p = sub.add_parser("compile", help="compile without a GPU and report PTX, registers, conversions",
                       description="Compile an op without a GPU; report its PTX size, registers and "
                                   "conversion instructions.")
    _add_op_args(p)
    _add_target_args(p)
    p.add_argument("--ptx", metavar="FILE", help="also write the PTX to this file")
    p.set_defaults(fn=cmd_compile)
    subs.append(p)
    p = sub.add_parser("export", help="AOT: shared library + C header for C++ programs with no Python",
                       description="AOT: write lib<NAME>.so (kernels embedded) and <NAME>.h for C++ "
                                   "programs that run with no Python. NAME is --name, by default "
                                   "mxq_<epilogue function's name> (libmxq_bias_gelu.so for `def bias_gelu`), "
                                   f"{BUILTIN_EXPORT_NAME} for the built-in quantize op.")
    _add_op_args(p)
    p.add_argument("--dir", required=True, help="output directory (created if missing)")
    _add_target_args(p)
    p.add_argument("--name", help="the exported functions' name, a C identifier, which also names the files "
                                  "lib<NAME>.so and <NAME>.h (default mxq_<epilogue function's name>; "
                                  f"{BUILTIN_EXPORT_NAME} for the built-in quantize op)")
    p.add_argument("--grouped", action="store_true",
                   help="also export the grouped kernels (<NAME>_grouped, <NAME>_vec_grouped: row groups)")
    p.add_argument("--operands", metavar="KINDS",
                   help="each epilogue tensor's kind, comma-separated: full, strided, row, col, scalar "
                        "(e.g. full,row for x + bias[N]; default all full)")
    p.set_defaults(fn=cmd_export)
    subs.append(p)
    # `python -m mxq --help` shows every command's flags, not only the command names
    ap.epilog = ("options of each command (`python -m mxq COMMAND --help` explains them):\n"
                 + "".join("  " + s.format_usage().replace("\n", "\n  ").rstrip() + "\n" for s in subs)
                 + f"\nARCH (compile, export; default {DEFAULT_ARCH}): {', '.join(SUPPORTED_ARCHS)}\n")
    return ap


def _fail(message: str) -> int:
    line = re.sub(r"\s*\n\s*", " ", message.strip())
    print(line if line.startswith("mxq:") else f"mxq: {line}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    parser = build_parser()
    parser.argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(parser.argv)
    try:
        status = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:  # `python -m mxq render | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (UsageError, EpilogueError) as exc:
        return _fail(str(exc))
    except (ValueError, TypeError) as exc:
        if not str(exc).startswith("mxq:"):
            raise  # not one of mxq's messages to users: a bug, keep the traceback
        return _fail(str(exc))
    except RuntimeError as exc:  # (a compile the kernels refuse for an option and dtype: their own words;
        # the C++ toolchain's failures, mxq/runtime/toolchain.py: its message with the compiler's)
        cause = exc.__cause__
        if isinstance(cause, NotImplementedError) and str(cause).startswith("mxq:"):
            dtype = getattr(args, "dtype", None)  # (the refused dtype is the command's --dtype)
            return _fail(f"{cause} (--dtype {dtype})" if dtype else str(cause))
        if isinstance(exc, ToolchainError) or str(exc).startswith("mxq: no writable directory"):
            return _fail(str(exc))  # (the toolchain's failures; no directory mxq could write its module to)
        raise
    except OSError as exc:  # unreadable/unwritable paths the user named (--ptx, --dir)
        return _fail(f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc))
