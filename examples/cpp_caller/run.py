"""Build the C++ caller with CMake (tvm-ffi's CMake package) and run it against a decorated op.

Run: python examples/cpp_caller/run.py
The op is registered as TVM-FFI global "mxq.residual_gelu"; the C++ library calls it and a
built-in quantize spec (via mxq.hpp) with tensors Python owns. On CPU tensors the registered
function runs the torch reference, on CUDA tensors the compiled kernel; either way the bytes
must equal the Python call's.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import tvm_ffi

import mxq

HERE = Path(__file__).resolve().parent


@mxq.fused_quant(act="gelu", dbias=True, rowwise=True, colwise=True)
def residual_gelu(x, r, alpha: float = 1.0):
    return x * alpha + r


def build() -> Path:
    build_dir = Path(os.environ.get("MXQ_CPP_BUILD", HERE / "build"))
    cmakedir = subprocess.check_output([sys.executable, "-m", "tvm_ffi.config", "--cmakedir"], text=True).strip()
    subprocess.run(["cmake", "-S", str(HERE), "-B", str(build_dir), f"-Dtvm_ffi_ROOT={cmakedir}",
                    f"-DMXQ_INCLUDE_DIR={mxq.get_include()}", f"-DPython_EXECUTABLE={sys.executable}",
                    "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", "2"], check=True, stdout=subprocess.DEVNULL)
    return next(build_dir.glob("libmxq_cpp_caller.*"))


def main() -> None:
    if shutil.which("cmake") is None:
        raise SystemExit("cmake is needed for this example")
    residual_gelu.register("residual_gelu")
    lib = tvm_ffi.load_module(str(build()))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m, n = 96, 256
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    r = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    rd = torch.empty(m, n, device=device, dtype=torch.float8_e4m3fn)
    rs = torch.empty(m, n // 32, device=device, dtype=torch.uint8)
    cd = torch.empty(m, n, device=device, dtype=torch.uint8)  # uint8 is accepted for data too
    cs = torch.empty(m // 32, n, device=device, dtype=torch.uint8)
    db = torch.empty(n, device=device, dtype=torch.bfloat16)
    lib["residual_gelu_into"](x, r, 0.5, rd, rs, cd, cs, db)
    want = residual_gelu(x, r, alpha=0.5)
    same = (torch.equal(rd.view(torch.uint8), want.rowwise_data.view(torch.uint8))
            and torch.equal(cd, want.colwise_data.view(torch.uint8))
            and torch.equal(rs, want.rowwise_scale) and torch.equal(cs, want.colwise_scale)
            and torch.equal(db, want.dbias))
    print(f"C++ call of mxq.residual_gelu on {device}: same bytes as the Python call: {same}")

    data, scale = torch.empty(m, n, device=device, dtype=torch.uint8), torch.empty(m, n // 32, device=device, dtype=torch.uint8)
    lib["quantize_rowwise"](x, data, scale)
    q = mxq.quantize(x)
    same_q = torch.equal(data, q.rowwise_data.view(torch.uint8)) and torch.equal(scale, q.rowwise_scale)
    print(f"C++ call through mxq::GetQuantizeKernel(key): same bytes as mxq.quantize: {same_q}")

    if device == "cuda":
        us = lib["time_quantize_us"](x, data, scale, 2000)
        torch.cuda.synchronize()
        print(f"host time of one C++ call through the registered function: {us:.2f} us")
    msg = lib["try_bad_shape"](x, r[:, :-32].contiguous(), rd, rs, cd, cs, db)
    print(f"C++ caller, mismatched shapes -> {msg}")
    assert same and same_q and msg.startswith("ValueError")


if __name__ == "__main__":
    main()
