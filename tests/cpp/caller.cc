// A C++ caller of mxq, built by tests/test_ffi.py with tvm-ffi's load_inline: it reaches the
// registered op and the lazy quantize entrypoint only through TVM-FFI globals and mxq.hpp.
#include <mxq/mxq.hpp>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ffi = tvm::ffi;

// Call "mxq.<name>" (a registered op with 2 tensors and 1 float) into the given destinations.
void call_registered(ffi::String name, ffi::Tensor x, ffi::Tensor r, double alpha, ffi::Tensor row_data,
                     ffi::Tensor row_scale, ffi::Tensor col_data, ffi::Tensor col_scale, ffi::Tensor amax,
                     ffi::Tensor dbias) {
  ffi::Function f = ffi::Function::GetGlobalRequired(std::string("mxq.") + std::string(name));
  f(x, r, alpha, ffi::Optional<ffi::Tensor>(), row_data, row_scale, col_data, col_scale, amax, dbias,
    ffi::Optional<ffi::Tensor>());
}

// The error a call produces, as "Kind: message" ("" if none); `full` passes every destination.
ffi::String call_error(ffi::String name, ffi::Tensor x, ffi::Tensor r, bool full, ffi::Tensor row_data,
                       ffi::Tensor row_scale, ffi::Tensor col_data, ffi::Tensor col_scale, ffi::Tensor amax,
                       ffi::Tensor dbias) {
  ffi::Function f = ffi::Function::GetGlobalRequired(std::string("mxq.") + std::string(name));
  ffi::Optional<ffi::Tensor> none;
  try {
    if (full) {
      f(x, r, 1.0, none, row_data, row_scale, col_data, col_scale, amax, dbias, none);
    } else {
      f(x, r, 1.0, none, none, none, none, none, none, none, none);
    }
  } catch (const ffi::Error& e) {
    return ffi::String(std::string(e.kind()) + ": " + std::string(e.message()));
  }
  return ffi::String("");
}

// Quantize x rowwise through the lazy entrypoint for `key` (compact layout, rowwise only).
void quantize_by_key(int64_t key, ffi::Tensor x, ffi::Tensor data, ffi::Tensor scale) {
  ffi::Function f = mxq::GetQuantizeKernel(static_cast<uint32_t>(key));
  ffi::Optional<ffi::Tensor> none;
  f(x, none, data, scale, none, none, none, none, none);
}

// Many threads ask for one key at once: returns (distinct function handles, builds so far).
ffi::Array<int64_t> concurrent_get(int64_t key, int64_t threads) {
  std::vector<std::thread> pool;
  std::vector<const void*> got(threads, nullptr);
  std::atomic<int> errors{0};
  for (int64_t i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      try {
        got[i] = mxq::GetQuantizeKernel(static_cast<uint32_t>(key)).get();
      } catch (...) {
        ++errors;
      }
    });
  }
  for (auto& t : pool) t.join();
  std::set<const void*> distinct(got.begin(), got.end());
  return ffi::Array<int64_t>({static_cast<int64_t>(distinct.size()), mxq::KernelCache::Global().builds(),
                              static_cast<int64_t>(errors.load())});
}

// A bad key fails every time it is asked for (the failure is not cached).
ffi::String bad_key_twice(int64_t key) {
  std::string out;
  for (int i = 0; i < 2; ++i) {
    try {
      mxq::GetQuantizeKernel(static_cast<uint32_t>(key));
      out += "ok;";
    } catch (const ffi::Error& e) {
      out += std::string(e.kind()) + ";";
    }
  }
  return ffi::String(out);
}
