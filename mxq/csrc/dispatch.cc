// mxq's native call path for registered ops (TVM-FFI global "mxq.<name>").
//
// One dispatcher per op takes the destination-passing argument list
//   (*epilogue_tensors, *epilogue_scalars, act_input, rowwise_data, rowwise_scale,
//    colwise_data, colwise_scale, amax, dbias, noop[, group_offsets])
// checks every slot, and on CUDA tensors reshapes the arguments into the generated kernel's
// [M, N] / flat views, allocates the dbias workspace through the TVM-FFI environment allocator
// and calls the compiled kernel -- no Python after the first call of a dtype (which asks Python
// to compile or load the kernel). On CPU tensors it calls the torch reference (Python), so C++
// callers can be tested without a GPU. Broadcast operands (a row [N], a column [..., 1], a
// scalar) and strided 2-D views are launched here too, on the kernels compiled for those
// layouts (OperandKinds). Grouped calls (group_offsets given and not None) of compact scales
// with int32 group ends are launched here too, on the grouped kernels (GroupEnds); other grouped
// calls (int64 ends, which Python converts; swizzled scales, whose padding Python clears; FP8
// block scaling's, which this dispatcher does not bind: State::groups_in_python), and
// operands it does not take as they are, go to Python's binding of the kernels
// (mxq/runtime/ffi.py, _python_callback). FP8 data is [M, N] but for the transposed colwise copy
// (FP8 block scaling's GEMM-ready layout, State::transposed), [N, M] contiguous. Errors are
// tvm::ffi::Error with a Python kind.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/string.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "scale_sizes.h"  // (mxq/runtime/ffi.py puts the headers' text here: load_inline builds one source)
#include "spans.h"

namespace ffi = tvm::ffi;

namespace {

const char* const kSlots[8] = {"act_input", "rowwise_data", "rowwise_scale", "colwise_data",
                               "colwise_scale", "amax", "dbias", "noop"};
enum Slot { kAct = 0, kRowData, kRowScale, kColData, kColScale, kAmax, kDbias, kNoop };
// scale_sizes.h's Order, as errors name them
const char* const kLayoutNames[3] = {"compact", "outer-dim-major", "swizzled"};

struct State {
  int nt = 0, ns = 0;
  uint8_t fp8_code = 10;  // DLPack kDLFloat8_e4m3fn, or 12 (kDLFloat8_e5m2)
  // grouped calls go to Python's binding of the kernels: MXFP8's swizzled scales (whose padding
  // Python clears) and FP8 block scaling (whose grouped calls this route does not bind)
  bool groups_in_python = false;
  mxq_sizes::Facts facts{};  // the op's scale buffers and workspace (slots.scale_facts, from Python)
  // the colwise data is the transposed copy [N, M], contiguous (FP8 block scaling's GEMM-ready layout;
  // limits.cpp_transposed, from Python): it takes no part in the choice of variant (the kernel
  // stores it at any alignment; the "vec" kernel alone writes it, Python's resolve refuses others)
  bool transposed = false;
  bool want[8] = {false};
  std::vector<std::string> names;  // the op's tensor and float parameter names, for errors
  ffi::Function python, resolve, zero;  // Python: the CPU/grouped route, compile-or-load, a zero noop
  // Python: the allocating route's result, made from its seven outputs (the MXFP8Tensor; its
  // arguments reach Python as torch tensors in one call, not one native call per output)
  ffi::Function wrap;
  std::mutex mu;
  std::map<std::tuple<int, int, int, int, std::string>, ffi::Function> kernels;  // by dtype, variant, device, kinds
  std::map<int, ffi::Tensor> zeros;
  int64_t share_max = 0;  // the allocating route: both directions in one allocation up to this many bytes
  // FP8 rows that are not whole units of `unit` bytes are allocated padded to `pad` bytes (Python's
  // tensor.default_row_align); data rows on `unit`-byte boundaries take the "rows8" kernels
  int64_t unit = 8, pad = 16;
  int64_t max_groups = 0;  // the most group ends a grouped call may have (groups.MAX_GROUPS)
};

// An FP8 data destination's dtype: the op's FP8 format or its bytes (uint8); another 1-byte
// dtype (int8, bool, the other FP8 format) would hand back bytes read as other values.
bool DataBytes(const State& st, const DLTensor* t) {
  return t->dtype.bits == 8 && t->dtype.lanes == 1 && (t->dtype.code == kDLUInt || t->dtype.code == st.fp8_code);
}

const char* Fp8Name(const State& st) { return st.fp8_code == 12 ? "float8_e5m2" : "float8_e4m3fn"; }

// The kernel variants this route launches, in the order the resolve callback (mxq/runtime/ffi.py) names them.
enum Variant { kGeneric = 0, kVec = 1, kRows8 = 2, kVecGrouped = 3, kGenericGrouped = 4 };

// Owning ffi::Tensor objects that alias memory the caller owns (the generated kernels decode
// tensor objects; a raw DLTensor* crashed them on the H200). Freed with no effect.
struct Borrow {
  void* ptr;
  void AllocData(DLTensor* t) { t->data = ptr; }
  void FreeData(DLTensor*) {}
};

ffi::Tensor Alias(const DLTensor* src, DLDataType dtype, int64_t d0, int64_t d1, int ndim) {
  void* p = static_cast<char*>(src->data) + src->byte_offset;
  return ndim == 2 ? ffi::Tensor::FromNDAlloc(Borrow{p}, ffi::Shape({d0, d1}), dtype, src->device)
                   : ffi::Tensor::FromNDAlloc(Borrow{p}, ffi::Shape({d0}), dtype, src->device);
}

int64_t Numel(const DLTensor* t) {  // (CheckTensors: the product fits, a zero anywhere first)
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] == 0) return 0;
  }
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

bool Compact(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

// Elements between the rows of FP8 data `t` seen as [rows, n]: n when it is contiguous (any shape
// of the right count, as before padded rows); the row stride when its last dimension is n with
// unit stride, its rows are at least n apart and its leading dimensions merge into rows (padded
// rows, MXFP8Tensor.empty(row_align=...)); else -1.
// (Dimensions of size 1 are skipped: torch gives them any stride, e.g. (16, 13, 1) for a [4, 1, 13]
// view of rows padded to 16.)
int64_t RowStride(const DLTensor* t, int64_t n) {
  if (Compact(t)) return n;
  const int last = t->ndim - 1;
  if (last < 1 || t->shape[last] != n || (n != 1 && t->strides[last] != 1)) return -1;
  int64_t ld = -1, expect = -1;
  for (int i = last - 1; i >= 0; --i) {
    if (t->shape[i] == 1) continue;
    if (ld < 0) ld = expect = t->strides[i];  // the innermost leading dimension of more than one row
    if (t->strides[i] != expect) return -1;
    expect *= t->shape[i];
  }
  if (ld < 0) return n;  // one row
  return ld >= n ? ld : -1;
}

// Strides of `shape` whose rows (last dimension) start `ld` elements apart.
std::vector<int64_t> RowStrides(const ffi::Shape& shape, int64_t ld) {
  const int last = static_cast<int>(shape.size()) - 1;
  std::vector<int64_t> st(shape.size(), 1);
  if (last >= 1) st[last - 1] = ld;
  for (int i = last - 2; i >= 0; --i) st[i] = st[i + 1] * shape[i + 1];
  return st;
}

std::string ArgName(const State& st, int i) {
  if (i < st.nt + st.ns) return i < static_cast<int>(st.names.size()) ? st.names[i] : "input " + std::to_string(i);
  return kSlots[i - st.nt - st.ns];
}

const DLTensor* TensorArg(const State& st, ffi::PackedArgs args, int i) {
  std::optional<DLTensor*> t = args[i].try_cast<DLTensor*>();
  if (!t.has_value()) {
    TVM_FFI_THROW(TypeError) << "mxq: argument #" << i << " (" << ArgName(st, i)
                             << ") must be a tensor, got " << args[i].GetTypeKey();
  }
  return *t;
}

// Why argument `a` is a tensor no kernel can read, "" where it is one a kernel can read or not a
// tensor: a NULL DLTensor*, or mxq_spans::Unreadable's reason. `byte_pairs`: a byte of two 4-bit
// codes (torch's float4_e2m1fn_x2, two lanes) counts as one element.
std::string ArgProblem(const ffi::AnyView& a, bool byte_pairs = false) {
  std::optional<DLTensor*> t = a.try_cast<DLTensor*>();
  if (a.type_index() == ffi::TypeIndex::kTVMFFIDLTensorPtr && t.has_value() && *t == nullptr) {
    return std::string(mxq_spans::kNullTensor) + " (pass None for a slot the op does not use)";
  }
  if (!t.has_value() || *t == nullptr) return "";
  DLTensor view = **t;
  if (byte_pairs && view.dtype.bits == 4 && view.dtype.lanes == 2) view.dtype = DLDataType{kDLUInt, 8, 1};
  return mxq_spans::Unreadable(&view);
}

// Every tensor argument is one a kernel can read (ArgProblem; torch's view of a tensor whose size
// overflows aborted), else a ValueError naming it. `after`: the route's names of its arguments
// after the epilogue's tensors and floats.
void CheckTensors(const State& st, ffi::PackedArgs args, std::initializer_list<const char*> after) {
  const int base = st.nt + st.ns;
  for (int i = 0; i < args.size(); ++i) {
    const std::string why = ArgProblem(args[i]);
    if (why.empty()) continue;
    const std::string name = i < base ? ArgName(st, i)
                             : i - base < static_cast<int>(after.size()) ? after.begin()[i - base]
                                                                         : "#" + std::to_string(i);
    TVM_FFI_THROW(ValueError) << "mxq: argument '" << name << "' " << why;
  }
}

// A call of Python function `python`: a C++ caller's raw DLTensor* arguments passed as tensors
// that own nothing (Borrow), shape and strides as given (compact where NULL): Python reads its
// tensors through DLPack, which crashed in tvm-ffi on a borrowed raw DLTensor*.
void CallBorrowed(const ffi::Function& python, ffi::PackedArgs args, ffi::Any* rv) {
  bool raw = false;
  for (int i = 0; i < args.size(); ++i) raw = raw || args[i].type_index() == ffi::TypeIndex::kTVMFFIDLTensorPtr;
  if (!raw) {
    python.CallPacked(args, rv);
    return;
  }
  std::vector<ffi::Tensor> hold;  // must not reallocate while `call` points into it
  hold.reserve(args.size());
  std::vector<ffi::AnyView> call;
  call.reserve(args.size());
  for (int i = 0; i < args.size(); ++i) {
    if (args[i].type_index() != ffi::TypeIndex::kTVMFFIDLTensorPtr) {
      call.emplace_back(args[i]);
      continue;
    }
    const DLTensor* t = args[i].cast<DLTensor*>();
    const Borrow data{static_cast<char*>(t->data) + t->byte_offset};
    const ffi::ShapeView shape(t->shape, t->ndim);
    hold.push_back(t->ndim == 0 || t->strides == nullptr  // (compact: FromNDAlloc fills its strides)
                       ? ffi::Tensor::FromNDAlloc(data, shape, t->dtype, t->device)
                       : ffi::Tensor::FromNDAllocStrided(data, shape, ffi::ShapeView(t->strides, t->ndim), t->dtype,
                                                         t->device));
    call.emplace_back(hold.back());
  }
  python.CallPacked(call.data(), static_cast<int32_t>(call.size()), rv);
}

// The Python route of a call (st.python).
void CallPython(const State& st, ffi::PackedArgs args, ffi::Any* rv) { CallBorrowed(st.python, args, rv); }

bool Aligned16(const DLTensor* t) {
  return ((reinterpret_cast<uintptr_t>(t->data) + t->byte_offset) % 16) == 0;
}

// The epilogue tensors' layout kinds (mxq/runtime/operands.py, one letter each as
// compiler.LAYOUT_CODES: 'f' full, 's' strided 2-D view, 'r' row [N], 'c' column [..., 1],
// 'k' scalar), as Python's validation.operand_layouts names them; "" when every one is a plain
// full tensor (the default kernels). False when this route does not launch the call itself:
// a shape that does not broadcast, a non-contiguous broadcast operand or act_input (Python
// copies those), or an argument that is not a tensor (Python names it in its error).
bool OperandKinds(const State& st, ffi::PackedArgs args, const DLTensor* x, std::string* kinds) {
  const int64_t n = x->ndim ? x->shape[x->ndim - 1] : 1;
  auto same_shape = [&](const DLTensor* t) {
    if (t->ndim != x->ndim) return false;
    for (int d = 0; d < x->ndim; ++d) {
      if (t->shape[d] != x->shape[d]) return false;
    }
    return true;
  };
  // a 2-D view of unit last stride and rows more than N apart (operands.is_row_strided)
  auto row_strided = [&](const DLTensor* t) {
    return t->ndim == 2 && t->strides != nullptr && t->strides[1] == 1 && t->strides[0] > n && t->shape[0] > 1;
  };
  auto kind = [&](const DLTensor* t, bool first) -> char {
    if (first || same_shape(t)) return Compact(t) ? 'f' : row_strided(t) ? 's' : 0;
    if (!Compact(t)) return 0;
    bool ones = true;
    for (int d = 0; d < t->ndim; ++d) ones = ones && t->shape[d] == 1;
    if (ones) return 'k';
    if (t->ndim && t->shape[t->ndim - 1] == n) {
      bool lead = true;
      for (int d = 0; d + 1 < t->ndim; ++d) lead = lead && t->shape[d] == 1;
      if (lead) return 'r';
    }
    if (t->ndim == x->ndim && t->ndim && t->shape[t->ndim - 1] == 1) {
      bool lead = true;
      for (int d = 0; d + 1 < t->ndim; ++d) lead = lead && t->shape[d] == x->shape[d];
      if (lead) return 'c';
    }
    return 0;
  };
  std::string k;
  bool plain = true;
  for (int i = 0; i < st.nt; ++i) {
    std::optional<DLTensor*> t = args[i].try_cast<DLTensor*>();
    const char c = t.has_value() ? kind(*t, i == 0) : 0;
    if (!c) return false;
    plain = plain && c == 'f';
    k.push_back(c);
  }
  if (st.want[kAct] && args[st.nt + st.ns + kAct] != nullptr) {
    std::optional<DLTensor*> t = args[st.nt + st.ns + kAct].try_cast<DLTensor*>();
    if (!t.has_value() || !same_shape(*t) || !Compact(*t)) return false;
  }
  *kinds = plain ? std::string() : k;
  return true;
}

// The int32 group ends of a grouped call that this route launches itself: 1-D, contiguous, 1 to
// max_groups of them, on x's device, and compact scales (swizzled grouped buffers hold padding
// that moves with the groups, which Python's binding clears first). Null where Python's binding
// takes the call (it converts int64 ends, and names what is wrong with any other value). The
// values are never read on the host (mxq/formats/groups.py: the kernels clamp them).
const DLTensor* GroupEnds(const State& st, ffi::PackedArgs args, int i, const DLTensor* x) {
  std::optional<DLTensor*> t = args[i].try_cast<DLTensor*>();
  if (!t.has_value() || st.groups_in_python) return nullptr;
  const DLTensor* g = *t;
  const bool ok = g->dtype.code == kDLInt && g->dtype.bits == 32 && g->dtype.lanes == 1 && g->ndim == 1 &&
                  g->shape[0] >= 1 && g->shape[0] <= st.max_groups && Compact(g) &&
                  g->device.device_type == x->device.device_type && g->device.device_id == x->device.device_id;
  return ok ? g : nullptr;
}

// The CUDA driver's memset and device copy, looked up once in libcuda (always loaded where a CUDA
// tensor exists), so that this library links nothing of CUDA's. Both run on the TVM-FFI
// environment stream of the device: the stream the kernels launch on (torch's current stream
// for calls from Python).
struct Driver {
  int (*memset8)(uint64_t, unsigned char, size_t, void*) = nullptr;  // cuMemsetD8Async
  int (*copy)(uint64_t, uint64_t, size_t, void*) = nullptr;          // cuMemcpyDtoDAsync_v2
};

const Driver& CudaDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib != nullptr) {
      d.memset8 = reinterpret_cast<decltype(d.memset8)>(dlsym(lib, "cuMemsetD8Async"));
      d.copy = reinterpret_cast<decltype(d.copy)>(dlsym(lib, "cuMemcpyDtoDAsync_v2"));
    }
    return d;
  }();
  if (driver.memset8 == nullptr || driver.copy == nullptr) {
    TVM_FFI_THROW(RuntimeError) << "mxq: the CUDA driver's cuMemsetD8Async / cuMemcpyDtoDAsync_v2 were not found";
  }
  return driver;
}

uintptr_t Address(const DLTensor* t) { return reinterpret_cast<uintptr_t>(t->data) + t->byte_offset; }

// Zero `bytes` bytes from `at` bytes into tensor `t`'s memory (CPU: memset; CUDA: on the stream).
void ZeroBytes(const DLTensor* t, int64_t at, int64_t bytes) {
  if (bytes <= 0) return;
  if (t->device.device_type == kDLCPU) {
    std::memset(reinterpret_cast<void*>(Address(t) + at), 0, static_cast<size_t>(bytes));
    return;
  }
  const int rc = CudaDriver().memset8(Address(t) + at, 0, static_cast<size_t>(bytes),
                                      TVMFFIEnvGetStream(t->device.device_type, t->device.device_id));
  if (rc != 0) TVM_FFI_THROW(RuntimeError) << "mxq: cuMemsetD8Async failed (CUresult " << rc << ")";
}

// Copy `bytes` bytes of `src` into `dst` (both on one device; CUDA: on the stream).
void CopyBytes(const DLTensor* dst, const DLTensor* src, int64_t bytes) {
  if (dst->device.device_type == kDLCPU) {
    std::memcpy(reinterpret_cast<void*>(Address(dst)), reinterpret_cast<const void*>(Address(src)),
                static_cast<size_t>(bytes));
    return;
  }
  const int rc = CudaDriver().copy(Address(dst), Address(src), static_cast<size_t>(bytes),
                                   TVMFFIEnvGetStream(dst->device.device_type, dst->device.device_id));
  if (rc != 0) TVM_FFI_THROW(RuntimeError) << "mxq: cuMemcpyDtoDAsync failed (CUresult " << rc << ")";
}

// The outputs given must not share memory with each other or with a tensor the call reads
// (spans.h; Python's validation.check_apart): checked on every route, before anything runs.
void CheckApart(const State& st, ffi::PackedArgs args) {
  const int base = st.nt + st.ns;
  auto name = [&](int i) { return i == base + 8 ? std::string("group_offsets") : ArgName(st, i); };
  std::vector<std::pair<int, const DLTensor*>> outs, reads;
  for (int i = 0; i < static_cast<int>(args.size()); ++i) {
    if (i >= st.nt && i < base) continue;  // the floats
    std::optional<DLTensor*> t = args[i].try_cast<DLTensor*>();
    if (!t.has_value() || *t == nullptr) continue;  // (None; a wrong type is named by the checks below)
    (i >= base + kRowData && i <= base + kDbias ? outs : reads).emplace_back(i, *t);
  }
  for (size_t a = 0; a < outs.size(); ++a) {
    for (size_t b = 0; b < a + reads.size(); ++b) {
      const auto& other = b < a ? outs[b] : reads[b - a];
      if (mxq_spans::Overlap(outs[a].second, other.second)) {
        TVM_FFI_THROW(ValueError) << "mxq: argument '" << name(outs[a].first) << "' overlaps '" << name(other.first)
                                  << "' in memory: an op's outputs must not share memory with each other or with "
                                  << "its inputs";
      }
    }
  }
}

void Dispatch(const std::shared_ptr<State>& sp, ffi::PackedArgs args, ffi::Any* rv) {
  State& st = *sp;
  const int expect = st.nt + st.ns + 8, base = st.nt + st.ns;
  if (args.size() != expect && args.size() != expect + 1) {
    TVM_FFI_THROW(TypeError) << "mxq: expected " << expect << " arguments (" << st.nt << " tensor(s), "
                             << st.ns << " float(s), act_input, rowwise_data, rowwise_scale, "
                             << "colwise_data, colwise_scale, amax, dbias, noop[, group_offsets]), got "
                             << args.size();
  }
  const DLTensor* x = TensorArg(st, args, 0);
  CheckTensors(st, args, {"act_input", "rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "amax",
                          "dbias", "noop", "group_offsets"});
  const bool grouped = args.size() == expect + 1 && args[expect] != nullptr;
  CheckApart(st, args);
  std::string kinds;
  const DLTensor* ends = grouped ? GroupEnds(st, args, expect, x) : nullptr;
  if (x->device.device_type == kDLCPU || (grouped && ends == nullptr) || !OperandKinds(st, args, x, &kinds)) {
    // the reference (CPU), or the Python binding of the kernels: grouped calls GroupEnds leaves
    // to it, and epilogue tensors this route does not take as they are (OperandKinds)
    CallPython(st, args, rv);
    return;
  }
  for (int s = 0; s < 7; ++s) {
    bool given = args[base + s] != nullptr;
    if (st.want[s] && !given) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << kSlots[s] << "' is required by this op";
    }
    if (!st.want[s] && given) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << kSlots[s] << "' is not used by this op; pass None";
    }
  }
  const int64_t numel = Numel(x);
  const int64_t n = x->ndim ? x->shape[x->ndim - 1] : 1;
  const int64_t m = n ? numel / n : 0;
  // nothing to launch (the reference handles the empty-output rules), or more than the kernels take
  // (Python's route: the reference, with a warning)
  if (numel == 0 || numel >= mxq_sizes::kMaxElements || m >= mxq_sizes::kMaxRows) {
    CallPython(st, args, rv);
    return;
  }
  const DLDataType u8{kDLUInt, 8, 1}, f32{kDLFloat, 32, 1}, f64{kDLFloat, 64, 1}, i32{kDLInt, 32, 1};
  const int64_t groups = ends != nullptr ? ends->shape[0] : -1;  // G, or -1: ungrouped (scale_sizes.h)
  const char* grouped_note = groups < 0 ? "" : " (grouped buffers: docs/NUMERICS.md, Groups)";
  std::vector<ffi::Tensor> hold;  // must not reallocate while `call` points into it
  hold.reserve(st.nt + 12);
  std::vector<ffi::AnyView> call;
  call.reserve(st.nt + st.ns + 12);
  auto push = [&](ffi::Tensor t) {
    hold.push_back(std::move(t));
    call.emplace_back(hold.back());
  };
  bool vec = n % 8 == 0;
  bool rows8 = true;  // every FP8 data row starts on a unit boundary
  auto same_device = [&](const DLTensor* t, int i, bool rows = false) {
    if (t->device.device_type != x->device.device_type || t->device.device_id != x->device.device_id) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' is on another device than '"
                                << ArgName(st, 0) << "'";
    }
    if (!rows && !Compact(t)) TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' must be contiguous";
  };
  // epilogue tensor i (or act_input: kind 'f') as the kernel's [M, N] operand: full tensors as
  // they are, a strided view with its row stride, broadcast ones with stride-0 dimensions
  // (launch.variant_for: full, strided and row operands are read 16 bytes at a time)
  auto input = [&](int i, char kind) {
    const DLTensor* t = TensorArg(st, args, i);
    same_device(t, i, kind != 'f');
    if (t->dtype.code != x->dtype.code || t->dtype.bits != x->dtype.bits) {
      TVM_FFI_THROW(TypeError) << "mxq: argument '" << ArgName(st, i) << "' has another dtype than '"
                               << ArgName(st, 0) << "'";
    }
    if (kind != 'c' && kind != 'k') vec = vec && Aligned16(t);
    if (kind == 'f') {
      push(Alias(t, t->dtype, m, n, 2));
      return;
    }
    const int64_t ld = kind == 's' ? t->strides[0] : 0;
    if (kind == 's') vec = vec && ld % 8 == 0;
    const int64_t extent = kind == 's' ? (m - 1) * ld + n : kind == 'r' ? n : kind == 'c' ? m : 1;
    const int64_t shape[2] = {m, n};
    const int64_t strides[2] = {kind == 's' ? ld : kind == 'c' ? 1 : 0, kind == 's' || kind == 'r' ? 1 : 0};
    push(Alias(t, t->dtype, extent, 1, 1).as_strided(ffi::ShapeView(shape, 2), ffi::ShapeView(strides, 2)));
  };
  auto bytes = [&](int i, int64_t count, bool matrix) {
    const DLTensor* t = TensorArg(st, args, i);
    same_device(t, i, matrix);
    if (!DataBytes(st, t)) {
      TVM_FFI_THROW(TypeError) << "mxq: argument '" << ArgName(st, i) << "' must be a " << Fp8Name(st)
                               << " or uint8 tensor (the op's FP8 data)";
    }
    if (Numel(t) != count) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' has " << Numel(t)
                                << " elements, expected " << count;
    }
    if (!matrix) {
      push(Alias(t, u8, count, 1, 1));
      return;
    }
    // FP8 data: contiguous, or rows of unit stride at least n apart (padded rows); one row's
    // stride does not matter (Python's variant_for ignores it too)
    const int64_t ld = RowStride(t, n);
    if (ends != nullptr && ld != n && m > 1) {  // (grouped outputs are contiguous: Python's check_out, ffi._destination)
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' of a grouped call must be contiguous";
    }
    if (ld < 0) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' must be contiguous or rows of unit "
                                << "stride at least " << n << " elements apart";
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    vec = vec && Aligned16(t) && (m == 1 || ld % 8 == 0);
    rows8 = rows8 && addr % st.unit == 0 && (m == 1 || ld % st.unit == 0);
    if (ld == n || m == 1) {
      push(Alias(t, u8, m, n, 2));
    } else {  // a [m, n] view of rows ld apart
      const int64_t rows_shape[2] = {m, n}, rows_strides[2] = {ld, 1};
      push(Alias(t, u8, (m - 1) * ld + n, 1, 1).as_strided(ffi::ShapeView(rows_shape, 2), ffi::ShapeView(rows_strides, 2)));
    }
  };
  for (int i = 0; i < st.nt; ++i) input(i, kinds.empty() ? 'f' : kinds[i]);
  // the floats: a float as given (the kernel's conversion rounds it to fp32 once), an int rounded
  // to fp32 once here (ir.scalar's rule: through a double, one beyond 2^53 would round twice)
  for (int i = 0; i < st.ns; ++i) {
    const ffi::AnyView& a = args[st.nt + i];
    if (a.type_index() == ffi::TypeIndex::kTVMFFIFloat) {
      call.emplace_back(a);
    } else if (a.type_index() == ffi::TypeIndex::kTVMFFIInt) {
      call.emplace_back(static_cast<double>(static_cast<float>(a.cast<int64_t>())));
    } else {
      TVM_FFI_THROW(TypeError) << "mxq: argument #" << st.nt + i << " (" << ArgName(st, st.nt + i)
                               << ") must be a float, got " << a.GetTypeKey();
    }
  }
  if (st.want[kAct]) input(base + kAct, 'f');
  // a scale buffer: E8M0 bytes or fp32 (the facts' scale_bits) of exactly the layout's count
  // (ScaleElements), contiguous in any shape; the GEMM-ready layouts' scales (padded, row-major
  // or outer-dim-major: fp8_block_layouts.gemm_scale) may also come as the logical view of their
  // buffer that Python holds, which starts where the buffer does: the [rows, blocks] grid with
  // the layout's strides, (1, padded rows) outer-dim-major or (padded blocks, 1) row-major, or for
  // the transposed colwise copy, whose scales describe [N, M], that grid transposed
  auto scale = [&](int i, const mxq_sizes::ScaleFacts& f, bool flip) {
    const DLTensor* t = TensorArg(st, args, i);
    same_device(t, i, true);
    const bool fp32 = st.facts.scale_bits == 32;
    // (E8M0 bytes as uint8 or float8_e8m0fnu: another 1-byte dtype holds other values)
    if (fp32 ? t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1
             : t->dtype.bits != 8 || t->dtype.lanes != 1 || (t->dtype.code != kDLUInt && t->dtype.code != kDLFloat8_e8m0fnu)) {
      TVM_FFI_THROW(TypeError) << "mxq: argument '" << ArgName(st, i) << "' must be a "
                               << (fp32 ? "float32 tensor (fp32 scales)" : "uint8 (E8M0 bytes) or float8_e8m0fnu tensor");
    }
    const int64_t count = mxq_sizes::ScaleElements(f, m, n, groups);
    // the grid's shape and strides in the flat buffer, as the view of this direction's data
    int64_t shape[2] = {mxq_sizes::Cdiv(m, f.block_rows), mxq_sizes::Cdiv(n, f.block_cols)};
    int64_t strides[2] = {f.order == mxq_sizes::kOuterMajor ? 1 : mxq_sizes::ScaleCols(f, n),
                          f.order == mxq_sizes::kOuterMajor ? mxq_sizes::ScaleRows(f, m) : 1};
    if (flip) {
      std::swap(shape[0], shape[1]);
      std::swap(strides[0], strides[1]);
    }
    const bool padded = f.order != mxq_sizes::kBlocked && (f.pad_rows > 1 || f.pad_cols > 1 || flip);
    const bool view = padded && groups < 0 && t->ndim == 2 && t->shape[0] == shape[0] && t->shape[1] == shape[1] &&
                      t->strides != nullptr && (shape[0] == 1 || t->strides[0] == strides[0]) &&
                      (shape[1] == 1 || t->strides[1] == strides[1]);
    // the grid's own (non-square) shape with other strides is no padded buffer (whose 2-D shape is
    // the grid's padded, outer-dim-major ones transposed): the grid laid out in another order
    if (padded && !view && t->ndim == 2 && shape[0] != shape[1] && t->shape[0] == shape[0] && t->shape[1] == shape[1]) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' has the scales' shape [" << shape[0]
                                << ", " << shape[1] << "] but not their strides (" << strides[0] << ", " << strides[1]
                                << "): pass that view of a padded buffer, or the contiguous buffer of " << count
                                << " elements";
    }
    if (!view && (Numel(t) != count || !Compact(t))) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' has " << Numel(t) << " elements"
                                << (Compact(t) ? "" : " (not contiguous)") << "; this op's "
                                << (padded && f.order == mxq_sizes::kRowMajor ? "padded row-major" : kLayoutNames[f.order])
                                << " layout needs " << count << " contiguous"
                                << (padded ? " (or the [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) +
                                    "] view of strides (" + std::to_string(strides[0]) + ", " +
                                    std::to_string(strides[1]) + ") of such a buffer)" : std::string())
                                << grouped_note;
    }
    push(Alias(t, fp32 ? f32 : u8, count, 1, 1));
  };
  // the transposed colwise copy: [N, M] contiguous (the kernel stores its rows M bytes apart)
  auto transposed_bytes = [&](int i) {
    const DLTensor* t = TensorArg(st, args, i);
    same_device(t, i, true);
    if (!DataBytes(st, t)) {
      TVM_FFI_THROW(TypeError) << "mxq: argument '" << ArgName(st, i) << "' must be a " << Fp8Name(st)
                               << " or uint8 tensor (the op's FP8 data)";
    }
    if (t->ndim != 2 || t->shape[0] != n || t->shape[1] != m || !Compact(t)) {
      std::string shape = "[";
      for (int d = 0; d < t->ndim; ++d) shape += (d ? ", " : "") + std::to_string(t->shape[d]);
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' is the transposed colwise copy: a "
                                << "contiguous tensor of shape [" << n << ", " << m << "] ([N, M]), got shape "
                                << shape << "]" << (Compact(t) ? "" : " (not contiguous)");
    }
    push(Alias(t, u8, n, m, 2));
  };
  if (st.want[kRowData]) {
    bytes(base + kRowData, m * n, true);
    scale(base + kRowScale, st.facts.row, false);
  }
  if (st.want[kColData]) {
    if (st.transposed) {
      transposed_bytes(base + kColData);
    } else {
      bytes(base + kColData, m * n, true);
    }
    scale(base + kColScale, st.facts.col, st.transposed);
  }
  // a one-dimensional output (or, with ``rows`` > 0, a grouped dbias's [rows, count / rows])
  auto scalar_tensor = [&](int i, DLDataType dt, int64_t count, int64_t rows = 0) {
    const DLTensor* t = TensorArg(st, args, i);
    same_device(t, i);
    if (t->dtype.code != dt.code || t->dtype.bits != dt.bits || Numel(t) != count) {
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << ArgName(st, i) << "' must have " << count
                                << " element(s) of the documented dtype";
    }
    push(rows > 0 ? Alias(t, dt, rows, count / rows, 2) : Alias(t, dt, count, 1, 1));
  };
  if (st.want[kAmax]) scalar_tensor(base + kAmax, f32, 1);
  if (st.want[kDbias]) {
    if (groups < 0) {
      scalar_tensor(base + kDbias, x->dtype, n);
    } else {  // [G, N] (the grouped kernels' dbias; G >= 1)
      scalar_tensor(base + kDbias, x->dtype, groups * n, groups);
    }
    // the partial sums' precision: fp64 for fp32 inputs, fp32 for 16-bit ones (numerics.dbias_partial_dtype)
    const int64_t ws_rows = mxq_sizes::WorkspaceRows(m, st.facts.tile_rows, groups);
    push(ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, ffi::Shape({ws_rows, n}), x->dtype.bits == 32 ? f64 : f32, x->device));
  }
  ffi::Tensor zero;
  if (args[base + kNoop] != nullptr) {
    scalar_tensor(base + kNoop, f32, 1);
  } else {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.zeros.find(x->device.device_id);
    if (it == st.zeros.end()) {
      it = st.zeros.emplace(x->device.device_id, st.zero(x->device.device_id).cast<ffi::Tensor>()).first;
    }
    zero = it->second;
    push(zero);
  }
  if (ends != nullptr) push(Alias(ends, i32, groups, 1, 1));  // the grouped kernels' last argument
  ffi::Function kernel;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    // (grouped kernels: vec or generic, launch.variant_for)
    const int variant = ends != nullptr ? (vec ? kVecGrouped : kGenericGrouped) : vec ? kVec : rows8 ? kRows8 : kGeneric;
    auto key = std::make_tuple(int(x->dtype.code), int(x->dtype.bits), variant, x->device.device_id, kinds);
    auto it = st.kernels.find(key);
    if (it == st.kernels.end()) {  // first call of this dtype/variant/kinds: Python compiles or loads it
      ffi::Function f = st.resolve(int64_t(x->dtype.code), int64_t(x->dtype.bits), int64_t(variant),
                                   int64_t(x->device.device_id), ffi::String(kinds)).cast<ffi::Function>();
      it = st.kernels.emplace(key, f).first;
    }
    kernel = it->second;
  }
  kernel.CallPacked(call.data(), static_cast<int32_t>(call.size()), rv);
}

// The allocating route, for Python's calls without `out`: (*tensors, *scalars, act_input, noop[,
// group_offsets]) -> wrap(rowwise_data, rowwise_scale, colwise_data, colwise_scale, amax, dbias,
// group_offsets) (None where the op writes nothing), compact scales, allocated through the
// TVM-FFI environment allocator (the caller's framework: torch's caching allocator for torch
// tensors), then the destination-passing route above. One native call instead of four
// torch.empty calls and a 13-argument call. The outputs start as MXFP8Tensor.empty leaves them:
// a noop call's all zeroed (it may write nothing); a grouped call's colwise scales zeroed (the
// rows between groups stay 0; its dbias the reduction writes whole, an empty group's row 0), its
// FP8 data contiguous, and the group ends copied (the last output: what the outputs are laid out
// by; the caller may reuse its tensor; a small call's copy in the outputs' one allocation, which
// it keeps alive as any of its views does).
// A tensor `offset` bytes into `parent`'s memory; it holds a reference to the parent, so one
// allocation lives as long as any view of it.
struct ViewOf {
  ffi::Tensor parent;
  int64_t offset;
  void AllocData(DLTensor* t) {
    const DLTensor* p = parent.GetDLTensorPtr();
    t->data = static_cast<char*>(p->data) + p->byte_offset + offset;
  }
  void FreeData(DLTensor*) {}
};

int64_t Round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

void DispatchAlloc(const std::shared_ptr<State>& sp, ffi::PackedArgs args, ffi::Any* rv) {
  State& st = *sp;
  const int base = st.nt + st.ns;
  if (args.size() != base + 2 && args.size() != base + 3) {
    TVM_FFI_THROW(TypeError) << "mxq: expected " << base + 2 << " arguments (" << st.nt << " tensor(s), "
                             << st.ns << " float(s), act_input, noop[, group_offsets]), got " << args.size();
  }
  const DLTensor* x = TensorArg(st, args, 0);
  CheckTensors(st, args, {"act_input", "noop", "group_offsets"});
  const int64_t numel = Numel(x);
  if (numel == 0 || numel >= mxq_sizes::kMaxElements ||
      numel / (x->ndim ? x->shape[x->ndim - 1] : 1) >= mxq_sizes::kMaxRows) {
    TVM_FFI_THROW(ValueError) << "mxq: the allocating route serves non-empty tensors of fewer than 2^31 elements "
                              << "(M below 2^31 - 64) only";
  }
  if (st.transposed) {  // (FP8 block-scaling ops take Python's binding for their Python calls: ffi.dispatchers_or_none)
    TVM_FFI_THROW(ValueError) << "mxq: the allocating route does not make the transposed colwise copy";
  }
  const bool zeroed = args[base + 1] != nullptr;  // a noop call
  const DLTensor* ends = nullptr;
  if (args.size() == base + 3 && args[base + 2] != nullptr) {
    ends = GroupEnds(st, args, base + 2, x);
    if (ends == nullptr) {
      TVM_FFI_THROW(ValueError) << "mxq: argument 'group_offsets' of the allocating route must be a contiguous 1-D "
                                << "int32 tensor of 1 to " << st.max_groups << " group ends on the input's device "
                                << "(compact scales only)";
    }
  }
  const int64_t groups = ends != nullptr ? ends->shape[0] : -1;
  const int64_t n = x->ndim ? x->shape[x->ndim - 1] : 1, m = numel / n;
  // (compact E8M0 scales: what Python's calls of MXFP8 ops take this route with, launch.Launcher)
  const int64_t row_scale = mxq_sizes::ScaleElements(st.facts.row, m, n, groups);
  const int64_t col_scale = mxq_sizes::ScaleElements(st.facts.col, m, n, groups);
  const DLDataType u8{kDLUInt, 8, 1}, f32{kDLFloat, 32, 1}, fp8{st.fp8_code, 8, 1}, i32{kDLInt, 32, 1};
  auto alloc = [&](ffi::Shape shape, DLDataType dt) {
    return ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, shape, dt, x->device);
  };
  ffi::Shape xshape(x->shape, x->shape + x->ndim);
  ffi::Any outs[7];
  // A direction's data and scales share one allocation (scales at the next 256-byte boundary):
  // they are used together. When all FP8 outputs together are at most share_max bytes, both
  // directions share one allocation too: a small call's host time is mostly allocation, and a
  // small tensor's memory is not worth freeing one direction early (a large one's is: above
  // the limit, dropping the rowwise half frees it).
  // rows that are not whole units: padded to st.pad bytes ([.., n] views of them, as Python's
  // MXFP8Tensor.empty makes by default; grouped data is contiguous)
  const int64_t ld = x->ndim && n % st.unit && ends == nullptr ? (n + st.pad - 1) / st.pad * st.pad : n;
  const int64_t data_bytes = Round256(m * ld);
  const int64_t row_bytes = st.want[kRowData] ? data_bytes + Round256(row_scale) : 0;
  const int64_t col_bytes = st.want[kColData] ? data_bytes + Round256(col_scale) : 0;
  // (a grouped call's copy of its ends too, after the data and scales)
  const int64_t ends_bytes = ends != nullptr ? Round256(ends->shape[0] * 4) : 0;
  ffi::Tensor shared;
  if (row_bytes + col_bytes + ends_bytes <= st.share_max) {
    shared = alloc(ffi::Shape({row_bytes + col_bytes + ends_bytes}), u8);
  }
  if (zeroed && shared.defined()) ZeroBytes(shared.GetDLTensorPtr(), 0, row_bytes + col_bytes);
  // `bytes`: the direction's own allocation; `shared_at`: where it starts in the shared one;
  // `zero_scale`: its scales start zeroed
  auto data_and_scale = [&](ffi::Shape scale_shape, int64_t bytes, int64_t shared_at, bool zero_scale, ffi::Any* data,
                            ffi::Any* scale) {
    ffi::Tensor buf = shared.defined() ? shared : alloc(ffi::Shape({bytes}), u8);
    const int64_t at = shared.defined() ? shared_at : 0;
    if (zeroed && !shared.defined()) ZeroBytes(buf.GetDLTensorPtr(), 0, bytes);
    if (zero_scale && !zeroed) ZeroBytes(buf.GetDLTensorPtr(), at + data_bytes, bytes - data_bytes);
    if (ld == n) {
      *data = ffi::Tensor::FromNDAlloc(ViewOf{buf, at}, xshape, fp8, x->device);
    } else {
      const std::vector<int64_t> strides = RowStrides(xshape, ld);
      *data = ffi::Tensor::FromNDAlloc(ViewOf{buf, at}, ffi::Shape({m * ld}), fp8, x->device)
                  .as_strided(xshape, ffi::ShapeView(strides.data(), strides.size()));
    }
    *scale = ffi::Tensor::FromNDAlloc(ViewOf{buf, at + data_bytes}, scale_shape, u8, x->device);
  };
  if (st.want[kRowData]) data_and_scale(ffi::Shape({m, row_scale / m}), row_bytes, 0, false, &outs[0], &outs[1]);
  if (st.want[kColData]) {
    data_and_scale(ffi::Shape({col_scale / n, n}), col_bytes, row_bytes, ends != nullptr, &outs[2], &outs[3]);
  }
  if (st.want[kAmax]) {
    ffi::Tensor amax = alloc(ffi::Shape(std::vector<int64_t>{}), f32);
    if (zeroed) ZeroBytes(amax.GetDLTensorPtr(), 0, 4);
    outs[4] = amax;
  }
  if (st.want[kDbias]) {
    ffi::Tensor dbias = alloc(ends != nullptr ? ffi::Shape({groups, n}) : ffi::Shape({n}), x->dtype);
    // (a grouped call's reduction writes every group's row, an empty group's as 0: reduce.dbias_kernel)
    if (zeroed) ZeroBytes(dbias.GetDLTensorPtr(), 0, (groups < 0 ? 1 : groups) * n * x->dtype.bits / 8);
    outs[5] = dbias;
  }
  std::vector<ffi::AnyView> full;
  full.reserve(base + 9);
  for (int i = 0; i <= base; ++i) full.push_back(args[i]);  // inputs, scalars, act_input
  for (int i = 0; i < 6; ++i) full.emplace_back(outs[i]);
  full.push_back(args[base + 1]);  // noop
  if (ends != nullptr) full.push_back(args[base + 2]);
  ffi::Any ignored;
  Dispatch(sp, ffi::PackedArgs(full.data(), static_cast<int32_t>(full.size())), &ignored);
  if (ends != nullptr) {  // (after the launch was accepted: a refused call copies nothing)
    ffi::Tensor copy = shared.defined()
                           ? ffi::Tensor::FromNDAlloc(ViewOf{shared, row_bytes + col_bytes}, ffi::Shape({groups}), i32,
                                                      x->device)
                           : alloc(ffi::Shape({groups}), i32);
    CopyBytes(copy.GetDLTensorPtr(), ends, groups * 4);
    outs[6] = copy;
  }
  *rv = st.wrap(outs[0], outs[1], outs[2], outs[3], outs[4], outs[5], outs[6]);
}

}  // namespace

// The C++ face of a destination-passing function that runs in Python on every call (a gated or
// FP4 op's dispatcher, op.gemm's; mxq/runtime/ffi.py): every tensor argument one a kernel can
// read (ArgProblem, FP4's packed pairs as bytes; a ValueError naming it by `names`, "#i" past
// them), then the call with raw DLTensor* arguments borrowed (CallBorrowed).
ffi::Function python_route(ffi::Function python, ffi::Array<ffi::String> names) {
  std::vector<std::string> list;
  for (const ffi::String& name : names) list.emplace_back(std::string(name));
  return ffi::Function::FromPacked([python, list](ffi::PackedArgs args, ffi::Any* rv) {
    for (int i = 0; i < args.size(); ++i) {
      const std::string why = ArgProblem(args[i], true);
      if (why.empty()) continue;
      const std::string name = i < static_cast<int>(list.size()) ? list[i] : "#" + std::to_string(i);
      TVM_FFI_THROW(ValueError) << "mxq: argument '" << name << "' " << why;
    }
    CallBorrowed(python, args, rv);
  });
}

// [destination-passing route, allocating route] of one op. `unit`, `pad`, `max_groups`: State's;
// `facts`: its scale buffers' and workspace's (slots.scale_facts; scale_sizes.h's Facts);
// `transposed`: its colwise data is the transposed copy [N, M] (limits.cpp_transposed).
ffi::Array<ffi::Function> make_dispatcher(int64_t nt, int64_t ns, int64_t flags, ffi::Array<ffi::String> names,
                              ffi::Function python, ffi::Function resolve, ffi::Function zero, ffi::Function wrap,
                              int64_t share_max, int64_t unit, int64_t pad, int64_t max_groups,
                              ffi::Array<int64_t> facts, bool transposed) {
  auto st = std::make_shared<State>();
  if (facts.size() != mxq_sizes::kFacts) TVM_FFI_THROW(ValueError) << "mxq: make_dispatcher needs the op's size facts";
  int64_t list[mxq_sizes::kFacts];
  for (int i = 0; i < mxq_sizes::kFacts; ++i) list[i] = facts[i];
  st->facts = mxq_sizes::FromList(list);
  st->transposed = transposed;
  st->max_groups = max_groups;
  st->share_max = share_max;
  st->unit = unit;
  st->pad = pad;
  for (const ffi::String& name : names) st->names.emplace_back(std::string(name));
  st->nt = static_cast<int>(nt);
  st->ns = static_cast<int>(ns);
  for (int s = 0; s < 7; ++s) st->want[s] = (flags >> s) & 1;
  st->fp8_code = (flags >> 7) & 1 ? 12 : 10;
  st->groups_in_python = (flags >> 8) & 1;
  st->python = python;
  st->resolve = resolve;
  st->zero = zero;
  st->wrap = wrap;
  return ffi::Array<ffi::Function>(
      {ffi::Function::FromPacked([st](ffi::PackedArgs args, ffi::Any* rv) { Dispatch(st, args, rv); }),
       ffi::Function::FromPacked([st](ffi::PackedArgs args, ffi::Any* rv) { DispatchAlloc(st, args, rv); })});
}
