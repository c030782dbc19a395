// Whether two tensors share memory: the overlap check of the registered dispatcher
// (dispatch.cc) and of exported functions (export_check.h), the C++ twin of Python's
// validation.check_apart. An op's kernels read each input once and write each output once, so an
// output that shares a byte with another output or with an input is written while it is read,
// or twice: silently wrong bytes. Spans are conservative: two views interleaved in one buffer
// (rows of one between rows of the other) count as overlapping.
#ifndef MXQ_SPANS_H_
#define MXQ_SPANS_H_

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

namespace mxq_spans {

// The bytes `t` can touch, [*lo, *hi): from its lowest-addressed element to its highest. False
// for an empty tensor (it touches none).
inline bool Span(const DLTensor* t, uintptr_t* lo, uintptr_t* hi) {
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return false;
  }
  int64_t low = 0, high = 0, compact = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    const int64_t stride = t->strides != nullptr ? t->strides[d] : compact;
    const int64_t reach = (t->shape[d] - 1) * stride;
    (reach < 0 ? low : high) += reach;
    compact *= t->shape[d];
  }
  const int64_t item = (static_cast<int64_t>(t->dtype.bits) * t->dtype.lanes + 7) / 8;
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  *lo = base + low * item;
  *hi = base + (high + 1) * item;
  return true;
}

// Whether `t` (no negative dimension) has an element count and bytes from its first element to its
// last that an int64 holds, as Span and the checks' sizes assume (a raw DLTensor* may say otherwise).
// An empty tensor does.
inline bool Fits(const DLTensor* t) {
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return true;
  }
  int64_t count = 1, extent = 1, step = 0, bytes = 0;
  for (int d = 0; d < t->ndim; ++d) {
    const int64_t s = t->strides != nullptr ? t->strides[d] : 1;
    if (s == INT64_MIN || __builtin_mul_overflow(count, t->shape[d], &count) ||
        __builtin_mul_overflow(t->shape[d] - 1, s < 0 ? -s : s, &step) ||
        __builtin_add_overflow(extent, step, &extent)) {
      return false;
    }
  }
  const int64_t item = (static_cast<int64_t>(t->dtype.bits) * t->dtype.lanes + 7) / 8;
  return !__builtin_mul_overflow(t->strides != nullptr ? extent : count, item, &bytes);
}

// Why no kernel can read tensor `t`, "" where one can: a negative stride (torch's DLPack import,
// which the Python routes hand it to, aborts the process), a negative dimension, more elements or
// bytes than an int64 counts, elements but no data, several lanes an element (bfloat16x2 is not
// the scalar the kernels take). Both C++ routes refuse such a tensor, naming it (dispatch.cc's and
// export_check.h's CheckTensors), as they refuse a NULL DLTensor* (kNullTensor: a C caller's;
// tvm-ffi's C++ AnyView refuses one).
constexpr const char* kNullTensor = "is a null DLTensor pointer";

inline std::string Unreadable(const DLTensor* t) {
  for (int d = 0; t->strides != nullptr && d < t->ndim; ++d) {
    if (t->strides[d] < 0) {
      return "has a negative stride (" + std::to_string(t->strides[d]) + " at dimension " + std::to_string(d) + ")";
    }
  }
  bool empty = false;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0) {
      return "has a negative dimension (" + std::to_string(t->shape[d]) + " at dimension " + std::to_string(d) + ")";
    }
    empty = empty || t->shape[d] == 0;
  }
  if (!Fits(t)) return "has more elements or bytes than an int64 counts";
  if (!empty && t->data == nullptr) return "has elements but no data (a null pointer)";
  if (t->dtype.lanes != 1) {
    return "has a dtype of " + std::to_string(t->dtype.lanes) + " lanes an element; mxq takes one";
  }
  return "";
}

inline bool Overlap(const DLTensor* a, const DLTensor* b) {
  if (a->device.device_type != b->device.device_type || a->device.device_id != b->device.device_id) return false;
  uintptr_t alo, ahi, blo, bhi;
  if (!Span(a, &alo, &ahi) || !Span(b, &blo, &bhi)) return false;
  return alo < bhi && blo < ahi;
}

}  // namespace mxq_spans

#endif  // MXQ_SPANS_H_
