// A C++ program with no Python in its process: load an mxq AOT library and quantize with it.
//   usage: main LIB FUNC M N input.bf16 out_prefix cpu|cuda
// The CUDA runtime is opened with dlopen (no CUDA headers or toolkit needed to build this).
// On a machine without a GPU, run it with "cpu": the library loads and rejects CPU tensors with
// a clean tvm::ffi::Error -- exactly where a driverless machine must stop.
#include <dlfcn.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;

struct CudaRuntime {
  int (*malloc_)(void**, size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*memcpy_)(void*, const void*, size_t, int) = nullptr;
  int (*sync_)() = nullptr;
  bool Load() {
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (!h) continue;
      malloc_ = reinterpret_cast<int (*)(void**, size_t)>(dlsym(h, "cudaMalloc"));
      free_ = reinterpret_cast<int (*)(void*)>(dlsym(h, "cudaFree"));
      memcpy_ = reinterpret_cast<int (*)(void*, const void*, size_t, int)>(dlsym(h, "cudaMemcpy"));
      sync_ = reinterpret_cast<int (*)()>(dlsym(h, "cudaDeviceSynchronize"));
      return malloc_ && free_ && memcpy_ && sync_;
    }
    return false;
  }
};
CudaRuntime cuda;

struct HostAlloc {
  void AllocData(DLTensor* t) { t->data = std::calloc(1, ffi::GetDataSize(*t)); }
  void FreeData(DLTensor* t) { std::free(t->data); }
};
struct DeviceAlloc {
  void AllocData(DLTensor* t) { cuda.malloc_(&t->data, ffi::GetDataSize(*t)); }
  void FreeData(DLTensor* t) { cuda.free_(t->data); }
};

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s LIB FUNC M N input.bf16 out_prefix cpu|cuda\n", argv[0]);
    return 2;
  }
  const std::string lib = argv[1], func = argv[2], input = argv[5], out = argv[6];
  const int64_t m = std::atoll(argv[3]), n = std::atoll(argv[4]), nb = (n + 31) / 32;
  const bool on_gpu = std::string(argv[7]) == "cuda";
  auto t0 = std::chrono::steady_clock::now();
  ffi::Module mod = ffi::Module::LoadFromFile(lib);
  ffi::Function f = mod->GetFunction(func).value();
  auto t1 = std::chrono::steady_clock::now();
  std::printf("loaded %s and found %s in %.2f ms\n", lib.c_str(), func.c_str(),
              std::chrono::duration<double, std::milli>(t1 - t0).count());

  std::vector<char> host(m * n * 2);
  std::ifstream(input, std::ios::binary).read(host.data(), host.size());
  DLDevice dev = on_gpu ? DLDevice{kDLCUDA, 0} : DLDevice{kDLCPU, 0};
  if (on_gpu && !cuda.Load()) {
    std::fprintf(stderr, "no CUDA runtime found\n");
    return 1;
  }
  auto make = [&](std::vector<int64_t> shape, DLDataType dt) {
    return on_gpu ? ffi::Tensor::FromNDAlloc(DeviceAlloc{}, ffi::Shape(shape), dt, dev)
                  : ffi::Tensor::FromNDAlloc(HostAlloc{}, ffi::Shape(shape), dt, dev);
  };
  auto upload = [&](ffi::Tensor& t, const void* src, size_t size) {
    if (on_gpu) cuda.memcpy_(t.data_ptr(), src, size, 1 /* host to device */);
    else std::memcpy(t.data_ptr(), src, size);
  };
  ffi::Tensor x = make({m, n}, DLDataType{kDLBfloat, 16, 1});
  ffi::Tensor data = make({m, n}, DLDataType{kDLUInt, 8, 1});
  ffi::Tensor scale = make({m * nb}, DLDataType{kDLUInt, 8, 1});
  ffi::Tensor noop = make({1}, DLDataType{kDLFloat, 32, 1});
  const float zero = 0.0f;
  upload(x, host.data(), host.size());
  upload(noop, &zero, sizeof(zero));
  // Every exported function checks its buffers against M and N before anything runs: a scale
  // buffer one byte short is a ValueError naming it, never a write past its end.
  try {
    f(x, data, make({m * nb - 1}, DLDataType{kDLUInt, 8, 1}), noop);
    std::printf("a short scale buffer was accepted\n");
    return 1;
  } catch (const ffi::Error& e) {
    std::printf("a short scale buffer is refused: %s: %s\n", e.kind().c_str(), e.message().c_str());
  }
  try {
    f(x, data, scale, noop);
  } catch (const ffi::Error& e) {
    std::printf("call failed cleanly: %s: %s\n", e.kind().c_str(), e.message().c_str());
    return on_gpu ? 1 : 0;
  }
  std::vector<char> d(m * n), s(m * nb);
  cuda.sync_();
  cuda.memcpy_(d.data(), data.data_ptr(), d.size(), 2 /* device to host */);
  cuda.memcpy_(s.data(), scale.data_ptr(), s.size(), 2);
  std::ofstream(out + ".data", std::ios::binary).write(d.data(), d.size());
  std::ofstream(out + ".scale", std::ios::binary).write(s.data(), s.size());
  std::printf("quantized %lld x %lld on the GPU; wrote %s.data and %s.scale\n", (long long)m, (long long)n,
              out.c_str(), out.c_str());
  return 0;
}
