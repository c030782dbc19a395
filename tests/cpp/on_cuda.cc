// Tensors labelled as on CUDA device 0 over host memory (tvm-ffi tensors that alias a torch
// tensor's memory), built by tests/conftest.py's `on_cuda` fixture: a dispatcher takes its native
// route with them (checks, variant, views) and hands them to the kernel, in the tests a stand-in
// that records what it got; nothing dereferences them.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <vector>

namespace {
struct Keep {
  tvm::ffi::Tensor src;
  void AllocData(DLTensor* t) {
    const DLTensor* s = src.GetDLTensorPtr();
    t->data = static_cast<char*>(s->data) + s->byte_offset;
  }
  void FreeData(DLTensor*) {}
};
}  // namespace

tvm::ffi::Tensor on_cuda(tvm::ffi::Tensor src) {
  const DLTensor* s = src.GetDLTensorPtr();
  std::vector<int64_t> strides(s->ndim, 1);
  for (int d = s->ndim - 2; d >= 0; --d) strides[d] = strides[d + 1] * s->shape[d + 1];
  if (s->strides != nullptr) strides.assign(s->strides, s->strides + s->ndim);
  int64_t span = 1;
  for (int d = 0; d < s->ndim; ++d) span += (s->shape[d] - 1) * strides[d];
  tvm::ffi::Tensor flat = tvm::ffi::Tensor::FromNDAlloc(Keep{src}, tvm::ffi::Shape({span}), s->dtype,
                                                        DLDevice{kDLCUDA, 0});
  return flat.as_strided(tvm::ffi::ShapeView(s->shape, s->ndim), tvm::ffi::ShapeView(strides.data(), s->ndim));
}
