"""AOT export: a shared library + header, used by a C++ program with no Python in its process.

Run: python examples/aot_export/run.py
1. exports the MXFP8 cast (e4m3, rowwise, rceil) for bf16 to build/ (`op.export`, the same as
   `python -m mxq export --dir build --name mxq_cast`);
2. builds main.cpp with g++ against TVM-FFI only (no mxq, no cutlass, no Python);
3. runs it: a scale buffer one byte short is refused by name (every exported function checks
   its buffers' sizes first); then on a GPU it quantizes a tensor written by this script and the
   bytes are compared with `mxq.quantize`; without a GPU it loads the library and shows the
   clean error a CPU tensor gets.
"""

import os
import subprocess
import sys
from pathlib import Path

import torch

import mxq

HERE = Path(__file__).resolve().parent


@mxq.fused_quant()
def cast(x):
    return x


def tvm_ffi_flags(*what):
    out = subprocess.check_output([sys.executable, "-m", "tvm_ffi.config", *what], text=True)
    return out.split()


def main() -> None:
    build = Path(os.environ.get("MXQ_AOT_BUILD", HERE / "build"))
    build.mkdir(parents=True, exist_ok=True)
    arch = "sm_90"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    info = cast.export(build, arch=arch, dtype="bf16", name="mxq_cast")
    print("exported", info["library"], "with", ", ".join(info["functions"]))
    exe = build / "aot_main"
    libdir = tvm_ffi_flags("--libdir")[0]
    subprocess.run(["g++", "-std=c++17", "-O2", str(HERE / "main.cpp"), "-o", str(exe),
                    *tvm_ffi_flags("--cxxflags"), *tvm_ffi_flags("--ldflags"), *tvm_ffi_flags("--libs"),
                    f"-Wl,-rpath,{libdir}", "-ldl"], check=True)
    m, n = 256, 1024
    x = (torch.randn(m, n) * 4).bfloat16()
    (build / "x.bf16").write_bytes(bytes(x.view(torch.uint8).reshape(-1).tolist()))
    mode = "cuda" if torch.cuda.is_available() else "cpu"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([str(exe), info["library"], "mxq_cast_vec", str(m), str(n), str(build / "x.bf16"),
                        str(build / "q"), mode], capture_output=True, text=True, env=env)
    print(r.stdout.strip())
    if r.returncode:
        raise SystemExit(f"aot_main failed: {r.stderr}")
    assert "a short scale buffer is refused: ValueError: mxq: mxq_cast_vec: argument #2 'mRowScale'" in r.stdout, r.stdout
    if mode == "cuda":
        want = mxq.quantize(x)
        data = torch.tensor(list((build / "q.data").read_bytes()), dtype=torch.uint8).reshape(m, n)
        scale = torch.tensor(list((build / "q.scale").read_bytes()), dtype=torch.uint8).reshape(m, n // 32)
        same = torch.equal(data, want.rowwise_data.view(torch.uint8)) and torch.equal(scale, want.rowwise_scale)
        print("C++ program's bytes equal mxq.quantize's:", same)
        assert same
    else:
        assert "device_type=cuda" in r.stdout, r.stdout


if __name__ == "__main__":
    main()
