// Calls a TVM-FFI function with raw DLTensor* arguments, one of them spoiled, as a C++ program
// handing DLPack tensors of its own may: built by tests/test_export_check.py with tvm-ffi's
// load_inline, to show each such argument refused by name before any launch.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <string>
#include <vector>

namespace ffi = tvm::ffi;

// The error of f(*args) with each tensor passed as a raw DLTensor* (the others as they are) and
// argument `index` spoiled by `how`: "strides" NULL, "data" a null pointer, "negative" its first
// dimension -1, "overflow" its first dimension 2^62 + 1, "lanes" two lanes an element,
// "negstride" its first stride negated, "null" the DLTensor* itself NULL; "" for none. Returns
// "Kind: message", or "" where the call returned.
ffi::String raw_call_error(ffi::Function f, ffi::Array<ffi::Any> args, int64_t index, ffi::String how) {
  std::vector<DLTensor> raw(args.size());
  std::vector<std::vector<int64_t>> shapes(args.size()), strides(args.size());
  std::vector<ffi::AnyView> call;
  for (size_t i = 0; i < args.size(); ++i) {
    const ffi::Any& a = args[i];
    if (a.type_index() != ffi::TypeIndex::kTVMFFITensor) {
      call.emplace_back(a);
      continue;
    }
    raw[i] = *a.cast<ffi::Tensor>().GetDLTensorPtr();  // (a copy: its shape and strides stay owned by the Array)
    if (static_cast<int64_t>(i) == index) {
      shapes[i].assign(raw[i].shape, raw[i].shape + raw[i].ndim);
      std::string h(how);
      if (h == "strides") raw[i].strides = nullptr;
      if (h == "data") raw[i].data = nullptr;
      if (h == "negative") shapes[i][0] = -1;
      if (h == "overflow") shapes[i][0] = (int64_t{1} << 62) + 1;
      if (h == "lanes") raw[i].dtype.lanes = 2;
      if (h == "negstride" && raw[i].strides != nullptr) {
        strides[i].assign(raw[i].strides, raw[i].strides + raw[i].ndim);
        strides[i][0] = -strides[i][0];
        raw[i].strides = strides[i].data();
      }
      raw[i].shape = shapes[i].data();
    }
    call.emplace_back(&raw[i]);
  }
  std::vector<TVMFFIAny> packed(call.size());  // (the C ABI's view of the arguments: a NULL DLTensor* there)
  for (size_t i = 0; i < call.size(); ++i) packed[i] = *reinterpret_cast<const TVMFFIAny*>(&call[i]);
  if (index >= 0 && std::string(how) == "null") {
    packed[index].type_index = kTVMFFIDLTensorPtr;
    packed[index].v_ptr = nullptr;
  }
  try {
    ffi::Any rv;
    f.CallPacked(reinterpret_cast<const ffi::AnyView*>(packed.data()), static_cast<int32_t>(packed.size()), &rv);
  } catch (const ffi::Error& e) {
    return ffi::String(std::string(e.kind()) + ": " + std::string(e.message()));
  }
  return ffi::String("");
}
