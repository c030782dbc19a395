// The argument check of an exported library's functions (mxq/runtime/export.py), before the compiled
// kernel function runs.
//
// A function exported by CuTeDSL checks what its signature can say: dtypes, devices, alignment,
// and every [M, N] argument's shape against the first input's. It cannot tie a flat scale
// buffer's length, the dbias workspace's rows, a grouped dbias's rows, or a two-halves op's
// [M, 2N] outputs to M, N and the number of groups G (each is a size of its own in the
// signature), so a buffer that is too small would be written past its end; nor can it refuse
// G = 0 (the kernels then treat all rows as one group, which buffers sized for no group do not
// hold) or more groups than the grouped dbias reduction's grid serves; the FP8 data's row
// stride, like the workspace's, is a symbol of its own, so rows that overlap would pass (the
// transposed colwise copy, [N, M] where the other data is [M, N], is checked here as that shape,
// contiguous: the kernel stores its rows M bytes apart); and
// nothing says that one argument's memory is apart from another's (spans.h); and a scale
// buffer's dtype (E8M0 bytes or fp32, scale_sizes.h's facts) is checked here so that a call on
// the wrong device still hears of it. Each
// exported name is therefore this check in front of the compiled function (linked in under a
// hidden name): it raises ValueError naming the argument, or passes the call on unchanged.
// Arguments it cannot read (a wrong count, a non-tensor, a first input that is not 2-D) are
// passed on for the compiled function to refuse with its own message.
#ifndef MXQ_EXPORT_CHECK_H_
#define MXQ_EXPORT_CHECK_H_

#include <tvm/ffi/c_api.h>

#include <cstdint>
#include <string>

#include "scale_sizes.h"
#include "spans.h"

namespace mxq_export {

// The roles of mxq/runtime/slots.py's kernel slot table (Slot.role) that have a size to check here, or
// that the check reads (the first input, the group ends); every other slot is kOther.
enum Role : int {
  kOther = 0,
  kInput0 = 1,     // the first epilogue tensor: sets M and N
  kRowData = 2,    // uint8 [M, W]
  kRowScale = 3,   // uint8 or float32 [ScaleElements(facts.row, M, W)]
  kColData = 4,    // uint8 [M, W]
  kColScale = 5,   // uint8 or float32 [ScaleElements(facts.col, M, W)]
  kDbias = 6,      // [W] ([G, W] grouped)
  kWorkspace = 7,  // [WorkspaceRows(M, facts.tile_rows), W]
  kGroupEnds = 8,  // int32 [G]
  kAmax = 9,       // float32 [1]
  kColDataT = 10,  // uint8 [W, M], contiguous: the transposed colwise copy (FP8 block scaling's GEMM-ready
                   // layout, limits.cpp_transposed's ops; FP4's colwise copy, [W, M / 2]: export.py renders it)
};

// How many entries the amax argument holds (Function::amax): one, or NVFP4's one per group of a
// grouped call (each group quantized with its own; one ungrouped).
enum AmaxRule : int { kAmaxOne = 0, kAmaxPerGroup = 1 };

// The roles an exported function writes: they must not share memory with each other or with any
// other tensor argument (spans.h).
inline bool Writes(int role) {
  return role == kRowData || role == kRowScale || role == kColData || role == kColScale || role == kDbias ||
         role == kWorkspace || role == kAmax || role == kColDataT;
}

// One exported function: its argument roles and names (the header's), its op's size facts
// (scale_sizes.h: the list mxq/runtime/slots.py's scale_facts gives, rendered by export.py), whether its outputs are 2N wide (W = 2N: a two-halves op, mxq/frontend/gated.py; else W = N), and the
// most groups a grouped call may have (groups.MAX_GROUPS).
struct Function {
  const char* name;
  int nargs;
  const int* roles;
  const char* const* arg_names;
  const int64_t* facts;  // mxq_sizes::kFacts of them
  bool halves;
  int64_t max_groups;
  int per_byte;           // data elements per byte: 1 (FP8), 2 (FP4's E2M1 codes: rows of W / 2 bytes)
  int64_t m_multiple;     // what M must be a multiple of (FP4's colwise copy: 8, whole 8-row words)
  int amax;               // AmaxRule
  const char* scale_text;  // the scales' dtype, as the refusal names it
  int64_t row_align;      // bytes the FP8 data's address and row stride must be multiples of ("_rows8": 8; else 1)
};

inline const DLTensor* AsTensor(const TVMFFIAny& a) {
  if (a.type_index == kTVMFFIDLTensorPtr) return static_cast<const DLTensor*>(a.v_ptr);
  if (a.type_index == kTVMFFITensor) return TVMFFITensorGetDLTensorPtr(a.v_obj);
  return nullptr;
}

inline int64_t Numel(const DLTensor* t) {  // (CheckTensors: the product fits, a zero anywhere first)
  int64_t n = 1;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return 0;
  }
  for (int d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

inline std::string ShapeText(const DLTensor* t) {
  std::string s = "[";
  for (int d = 0; d < t->ndim; ++d) s += (d ? ", " : "") + std::to_string(t->shape[d]);
  return s + "]";
}

inline std::string DtypeText(DLDataType d) {
  const char* kind = d.code == kDLFloat ? "float" : d.code == kDLInt ? "int" : d.code == kDLUInt ? "uint"
                                       : d.code == kDLBfloat ? "bfloat" : "code" ;
  return std::string(kind) + std::to_string(d.bits) + (d.lanes != 1 ? "x" + std::to_string(d.lanes) : "");
}

// uint8, one lane: the bytes of the FP8 data, of FP4's E2M1 pairs and of 8-bit scales (the
// header's dtype; the compiled function's own check also lets int8 through, read as other values)
inline bool Bytes(DLDataType d) { return d.code == kDLUInt && d.bits == 8 && d.lanes == 1; }

inline int Refuse(const std::string& msg) {
  TVMFFIErrorSetRaisedFromCStr("ValueError", msg.c_str());
  return -1;
}

// Whether a 2-D tensor's rows are at least w elements apart (compact, padded, or one row): the
// outputs' rows must not overlap.
inline bool RowsApart(const DLTensor* t, int64_t w) {
  return t->strides == nullptr || t->shape[0] <= 1 || t->strides[0] >= w;
}

// Whether a 2-D tensor is contiguous (strides of dimensions of one element do not matter).
inline bool Contiguous(const DLTensor* t) {
  return t->strides == nullptr || ((t->shape[1] <= 1 || t->strides[1] == 1) &&
                                   (t->shape[0] <= 1 || t->strides[0] == t->shape[1]));
}

inline std::string RowsNeed(const DLTensor* t, int64_t w) {
  return "rows at least " + std::to_string(w) + " elements apart (its row stride is " + std::to_string(t->strides[0]) +
         ")";
}

// Every argument the function writes is apart from every other tensor argument.
inline int CheckApart(const Function& f, const TVMFFIAny* args) {
  for (int i = 0; i < f.nargs; ++i) {
    const DLTensor* out = Writes(f.roles[i]) ? AsTensor(args[i]) : nullptr;
    if (out == nullptr) continue;
    for (int j = 0; j < f.nargs; ++j) {
      const DLTensor* other = j != i && (j < i || !Writes(f.roles[j])) ? AsTensor(args[j]) : nullptr;
      if (other != nullptr && mxq_spans::Overlap(out, other)) {
        return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                      "' overlaps argument #" + std::to_string(j) + " '" + f.arg_names[j] +
                      "' in memory: outputs must not share memory with each other or with the inputs");
      }
    }
  }
  return 0;
}

// Every tensor argument is one the compiled function can read (mxq_spans::Unreadable), with
// strides (a raw DLTensor* may leave them NULL for a compact tensor, which the compiled function
// would dereference), else a ValueError naming it.
inline int CheckTensors(const Function& f, const TVMFFIAny* args) {
  for (int i = 0; i < f.nargs; ++i) {
    if (args[i].type_index == kTVMFFIDLTensorPtr && args[i].v_ptr == nullptr) {  // (a C caller's NULL DLTensor*)
      return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                    "' " + mxq_spans::kNullTensor);
    }
    const DLTensor* t = AsTensor(args[i]);
    if (t == nullptr) continue;
    std::string why = mxq_spans::Unreadable(t);
    if (why.empty() && t->ndim > 0 && t->strides == nullptr) {
      why = "has no strides (a DLTensor whose strides are NULL): give its strides (compact: each dimension's the "
            "product of the sizes after it) or pass a tvm::ffi::Tensor";
    }
    if (!why.empty()) {
      return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                    "' " + why);
    }
  }
  return 0;
}

// 0: the call may go on; -1: a ValueError is raised (TVM-FFI's C convention).
inline int Check(const Function& f, const TVMFFIAny* args, int32_t num_args) {
  if (num_args != f.nargs) return 0;
  if (CheckTensors(f, args) != 0) return -1;
  const DLTensor* x = nullptr;
  int64_t groups = -1;
  for (int i = 0; i < f.nargs; ++i) {
    if (f.roles[i] == kInput0) x = AsTensor(args[i]);
    if (f.roles[i] == kGroupEnds) {
      const DLTensor* g = AsTensor(args[i]);
      if (g == nullptr) return 0;
      groups = Numel(g);
    }
  }
  if (x == nullptr || x->ndim != 2) return 0;
  if (x->shape[0] < 1 || x->shape[1] < 1 || x->shape[0] >= mxq_sizes::kMaxRows ||
      x->shape[1] >= mxq_sizes::kMaxElements ||  // (each factor below 2^31 first: the product fits an int64)
      x->shape[0] * x->shape[1] >= mxq_sizes::kMaxElements) {
    return Refuse(std::string("mxq: ") + f.name + ": argument 'mIn0' has shape " + ShapeText(x) +
                  "; the kernels take M, N >= 1 and fewer than 2^31 elements (M below 2^31 - 64)");
  }
  if (groups == 0 || groups > f.max_groups) {
    return Refuse(std::string("mxq: ") + f.name + ": argument 'mGroupEnds' has " + std::to_string(groups) +
                  " group ends; a grouped call takes 1 to " + std::to_string(f.max_groups));
  }
  const int64_t m = x->shape[0], n = x->shape[1], w = f.halves ? 2 * n : n;
  if (m % f.m_multiple != 0) {
    return Refuse(std::string("mxq: ") + f.name + ": argument 'mIn0' has M = " + std::to_string(m) +
                  " rows; this op's colwise copy needs M % " + std::to_string(f.m_multiple) + " == 0");
  }
  const int64_t wb = w / f.per_byte;  // (data bytes per output row: N % 8 == 0 where per_byte is 2)
  const mxq_sizes::Facts facts = mxq_sizes::FromList(f.facts);
  auto dims = [](int64_t a, int64_t b) { return "shape [" + std::to_string(a) + ", " + std::to_string(b) + "]"; };
  for (int i = 0; i < f.nargs; ++i) {
    const DLTensor* t = AsTensor(args[i]);
    if (t == nullptr) continue;
    std::string need;  // empty: the argument is right
    const int role = f.roles[i];
    const bool bytes = role == kRowData || role == kColData || role == kColDataT ||
                       ((role == kRowScale || role == kColScale) && facts.scale_bits != 32);
    if ((bytes && !Bytes(t->dtype)) ||
        (role == kGroupEnds && (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1))) {
      return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                    "' has dtype " + DtypeText(t->dtype) + "; " +
                    (role == kGroupEnds ? "the group ends are int32"
                     : role == kRowScale || role == kColScale ? std::string("this op's scales are ") + f.scale_text
                                                              : "the data is passed as uint8 bytes"));
    }
    switch (role) {
      case kRowData:
      case kColData:
        if (t->ndim != 2 || t->shape[0] != m || t->shape[1] != wb) {
          need = dims(m, wb);
        } else if (!RowsApart(t, wb)) {
          need = RowsNeed(t, wb);
        } else if ((reinterpret_cast<uintptr_t>(t->data) + t->byte_offset) % f.row_align != 0 ||
                   (t->shape[0] > 1 && t->strides[0] % f.row_align != 0)) {
          return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                        "' must hold rows that start on " + std::to_string(f.row_align) +
                        "-byte boundaries (an address and a row stride that are multiples of " +
                        std::to_string(f.row_align) + " bytes; its row stride is " + std::to_string(t->strides[0]) +
                        "); the function without the suffix serves any rows");
        }
        break;
      case kColDataT: {  // (the kernel stores its rows M bytes apart: padded or overlapping rows are refused)
        const int64_t mb = m / f.per_byte;
        if (t->ndim != 2 || t->shape[0] != w || t->shape[1] != mb) {
          need = dims(w, mb) + (f.per_byte == 1 ? " (the transposed colwise copy, [N, M])"
                                                : " (the transposed colwise copy, [N, M/2])");
        } else if (!Contiguous(t)) {
          need = "a contiguous tensor (the transposed colwise copy's rows " + std::to_string(mb) +
                 " elements apart; its strides are (" + std::to_string(t->strides[0]) + ", " +
                 std::to_string(t->strides[1]) + "))";
        }
        break;
      }
      case kAmax: {
        const int64_t want = f.amax == kAmaxPerGroup && groups >= 0 ? groups : 1;
        if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
          return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                        "' has dtype " + DtypeText(t->dtype) + "; the amax is float32");
        }
        if (Numel(t) != want) need = std::to_string(want) + (want == 1 ? " element" : " elements (one per group)");
        break;
      }
      case kRowScale:
      case kColScale: {
        // (checked here: on tensors of another device the compiled function names the device first)
        if (facts.scale_bits == 32 && (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1)) {
          return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                        "' has dtype " + DtypeText(t->dtype) + "; this op's scales are " + f.scale_text);
        }
        const int64_t want = mxq_sizes::ScaleElements(f.roles[i] == kRowScale ? facts.row : facts.col, m, w, groups);
        if (Numel(t) != want) need = std::to_string(want) + " elements";
        break;
      }
      case kDbias:
        if (groups < 0 ? Numel(t) != w : (t->ndim != 2 || t->shape[0] != groups || t->shape[1] != w)) {
          need = groups < 0 ? std::to_string(w) + " elements" : dims(groups, w);
        } else if (groups >= 0 && !RowsApart(t, w)) {
          need = RowsNeed(t, w);
        }
        break;
      case kWorkspace: {
        const int64_t rows = mxq_sizes::WorkspaceRows(m, facts.tile_rows, groups);
        if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != w) {
          need = dims(rows, w);
        } else if (!RowsApart(t, w)) {
          need = RowsNeed(t, w);
        }
        break;
      }
      default:
        break;
    }
    if (!need.empty()) {  // (the message is built only here: a call that passes allocates nothing)
      const std::string mn = "M = " + std::to_string(m) + ", N = " + std::to_string(n) +
                             (groups < 0 ? "" : ", G = " + std::to_string(groups));
      return Refuse(std::string("mxq: ") + f.name + ": argument #" + std::to_string(i) + " '" + f.arg_names[i] +
                    "' has shape " + ShapeText(t) + " (" + std::to_string(Numel(t)) + " elements); " + mn +
                    " needs " + need + " (the header lists every argument's size)");
    }
  }
  return CheckApart(f, args);
}

}  // namespace mxq_export

#endif  // MXQ_EXPORT_CHECK_H_
