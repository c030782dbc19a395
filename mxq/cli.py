"""``python -m mxq {info,render,compile,export}``: what mxq generates, from the shell.

An op is chosen either by quantize options (``--fp8 e5m2 --colwise --act gelu`` builds the
built-in identity-epilogue op) or by ``FILE.py[:NAME]``, which imports that file and takes the
``@mxq.fused_quant`` op called NAME (or the only one there).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from .op import FusedOp, _quantize_op
from .spec import ACTIVATIONS, QuantSpec


def _add_op_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="FILE.py[:NAME] holding a @mxq.fused_quant op")
    p.add_argument("--fp8", default="e4m3", choices=("e4m3", "e5m2"))
    p.add_argument("--no-rowwise", action="store_true", help="do not write rowwise data")
    p.add_argument("--colwise", action="store_true")
    p.add_argument("--scale-mode", default="rceil", choices=("rceil", "floor", "ceil", "even"))
    p.add_argument("--scale-layout", default="compact", choices=("compact", "swizzled"))
    p.add_argument("--amax", action="store_true")
    p.add_argument("--act", choices=ACTIVATIONS)
    p.add_argument("--dact", choices=ACTIVATIONS)
    p.add_argument("--dbias", action="store_true")


def _load_file_op(target: str) -> FusedOp:
    path, _, name = target.partition(":")
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"mxq: no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"mxq_user_{abs(hash(file.resolve()))}", file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    ops = {k: v for k, v in vars(mod).items() if isinstance(v, FusedOp)}
    if name:
        if name not in ops:
            raise SystemExit(f"mxq: {path} has no @mxq.fused_quant op named {name!r} (found: {sorted(ops)})")
        return ops[name]
    if len(ops) != 1:
        raise SystemExit(f"mxq: {path} defines {len(ops)} ops ({sorted(ops)}); pick one with {path}:NAME")
    return next(iter(ops.values()))


def _op_from_args(args) -> FusedOp:
    if args.target:
        return _load_file_op(args.target)
    spec = QuantSpec(fp8=args.fp8, rowwise=not args.no_rowwise, colwise=args.colwise,
                     scale_mode=args.scale_mode, scale_layout=args.scale_layout, amax=args.amax,
                     act=args.act, dact=args.dact, dbias=args.dbias)
    return _quantize_op(spec)


def cmd_info(args) -> int:
    import torch

    from . import __version__, compiler, codegen

    print(f"mxq {__version__}")
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    for mod in ("cutlass", "tvm_ffi", "jinja2"):
        try:
            from importlib.metadata import version

            dist = {"cutlass": "nvidia-cutlass-dsl", "tvm_ffi": "apache-tvm-ffi", "jinja2": "jinja2"}[mod]
            print(f"{dist} {version(dist)}")
        except Exception as exc:  # pragma: no cover - reported, not fatal
            print(f"{mod}: not installed ({exc})")
    print(f"templates {codegen.templates_hash()} at {codegen._template_dir()}")
    print(f"cache dir {compiler.cache_dir()}")
    return 0


def cmd_render(args) -> int:
    print(_op_from_args(args).source, end="")
    return 0


def cmd_compile(args) -> int:
    op = _op_from_args(args)
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
    info = op.export(args.dir, arch=args.arch, dtype=args.dtype, name=args.name)
    print(f"library  {info['library']}")
    print(f"header   {info['header']}")
    print(f"functions {', '.join(info['functions'])}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--includedir"]:  # for build systems: -I$(python -m mxq --includedir)
        from . import get_include

        print(get_include())
        return 0
    ap = argparse.ArgumentParser(prog="python -m mxq", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, template hash, cache directory").set_defaults(fn=cmd_info)
    p = sub.add_parser("render", help="print the generated CuTeDSL module")
    _add_op_args(p)
    p.set_defaults(fn=cmd_render)
    p = sub.add_parser("compile", help="compile without a GPU and report PTX, registers, conversions")
    _add_op_args(p)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--ptx", help="also write the PTX to this file")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("export", help="AOT: shared library + C header for C++ programs with no Python")
    _add_op_args(p)
    p.add_argument("--dir", required=True, help="output directory")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--name", help="exported function name (a C identifier)")
    p.set_defaults(fn=cmd_export)
    args = ap.parse_args(argv)
    return args.fn(args)
