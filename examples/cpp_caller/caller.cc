// C++ code calling an mxq op: a registered decorated op ("mxq.residual_gelu") and a built-in
// quantize spec through mxq.hpp's lazy, thread-safe per-key cache. Built into a shared library
// that Python loads with tvm_ffi.load_module (see run.py); the C++ side sees only TVM-FFI.
#include <mxq/mxq.hpp>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <chrono>
#include <string>

namespace ffi = tvm::ffi;

// Backward-style call into the destinations the caller owns: rowwise+colwise FP8 and dbias.
void residual_gelu_into(ffi::Tensor x, ffi::Tensor r, double alpha, ffi::Tensor row_data, ffi::Tensor row_scale,
                        ffi::Tensor col_data, ffi::Tensor col_scale, ffi::Tensor dbias) {
  static const ffi::Function op = ffi::Function::GetGlobalRequired("mxq.residual_gelu");
  ffi::Optional<ffi::Tensor> none;
  //   x, r, alpha, act_input, rowwise_data, rowwise_scale, colwise_data, colwise_scale, amax, dbias, noop
  op(x, r, alpha, none, row_data, row_scale, col_data, col_scale, none, dbias, none);
}

// Plain MXFP8 cast (e4m3, rowwise, rceil, compact) of a bf16 tensor by 32-bit spec key.
void quantize_rowwise(ffi::Tensor x, ffi::Tensor data, ffi::Tensor scale) {
  const uint32_t key = mxq::kRowwise | (2u << mxq::kDtypeShift);
  ffi::Optional<ffi::Tensor> none;
  mxq::GetQuantizeKernel(key)(x, none, data, scale, none, none, none, none, none);
}

// What a C++ caller sees on a bad call: the Python exception kind and message.
ffi::String try_bad_shape(ffi::Tensor x, ffi::Tensor r_wrong, ffi::Tensor row_data, ffi::Tensor row_scale,
                          ffi::Tensor col_data, ffi::Tensor col_scale, ffi::Tensor dbias) {
  try {
    residual_gelu_into(x, r_wrong, 1.0, row_data, row_scale, col_data, col_scale, dbias);
  } catch (const ffi::Error& e) {
    return ffi::String(std::string(e.kind()) + ": " + std::string(e.message()));
  }
  return ffi::String("no error");
}

// Host time of one call from C++ (mean of n back-to-back calls, microseconds; launches are async).
double time_quantize_us(ffi::Tensor x, ffi::Tensor data, ffi::Tensor scale, int64_t n) {
  quantize_rowwise(x, data, scale);  // first call: kernel lookup and compile or load
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) quantize_rowwise(x, data, scale);
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(n);
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(time_quantize_us, time_quantize_us);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(residual_gelu_into, residual_gelu_into);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(quantize_rowwise, quantize_rowwise);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(try_bad_shape, try_bad_shape);
