// mxq C++ API: call mxq's fused quantization ops (MXFP8, FP8 block scaling, NVFP4, MXFP4) from C++ through TVM-FFI.
//
// In a process where Python has imported mxq, two kinds of globals exist:
//   "mxq.<name>"                 an op registered with op.register(name)
//   "mxq.get_quantize_kernel"    (key) -> Function for a built-in quantize spec (compiled lazily)
// Every op function takes the destination-passing argument list
//   (*epilogue_tensors, *epilogue_scalars, act_input, rowwise_data, rowwise_scale,
//    colwise_data, colwise_scale, amax, dbias, noop[, group_offsets])
// with None (tvm::ffi::Optional<tvm::ffi::Tensor>()) in every slot the op does not use. Data
// slots take tensors of the op's FP8 dtype (e4m3 or e5m2) or uint8, of the input's shape (format fp8_block's gemm layout: the
// colwise data is the transposed copy, a contiguous [N, M] tensor), scale slots uint8 (E8M0; or float8_e8m0fnu) in
// the op's layout, or float32 for format fp8_block (flat, contiguous; the gemm layout's scales as
// their padded buffer, e.g. 1x128 rowwise outer-dim-major [ceil(N/128), roundup(M, 4)], 128x128
// [roundup(ceil(M/128), 4), roundup(ceil(N/128), 4)]; 128x128 tiles fill both directions' scale
// buffers), amax a float32 tensor of one element (a grouped NVFP4 call: one per group, G). CUDA tensors run the kernel on TVM-FFI's
// environment stream (TVMFFIEnvSetStream); CPU tensors run the torch reference, so C++ code can be
// tested without a GPU. Pass owning tvm::ffi::Tensor objects (not TensorView) on the CPU route.
// Errors arrive as tvm::ffi::Error carrying the Python exception kind (ValueError, TypeError).
// group_offsets (optional; None or absent: ungrouped): a 1-D int32/int64 tensor of the G
// cumulative group ends along the rows, on the input's device (docs/NUMERICS.md, "Groups"):
// the scale slots then take the grouped buffer sizes (compact colwise (M/32 + G) x N; swizzled
// rowwise (M + 128 G) x roundup(ceil(N/32), 4), colwise (M/32 + 4 G) x roundup(N, 128)) and
// dbias G x N. A grouped call goes through Python on every call (the grouped kernels on CUDA,
// one launch, no host sync); ungrouped CUDA calls do not.
//
// The 32-bit key (same as mxq.QuantSpec.key in Python):
//   bit 0      fp8            0 = e4m3, 1 = e5m2
//   bit 1      rowwise
//   bit 2      colwise
//   bits 3-4   scale_mode     mxfp8: 0 rceil, 1 floor, 2 ceil, 3 even; mxfp4: 0 floor, 1 rceil;
//                             nvfp4: 0; fp8_block: bit 17's note
//   bit 5      scale_layout   0 compact, 1 swizzled
//   bit 6      amax           always set for nvfp4 (its global amax; a key without it is refused)
//   bits 7-9   act            0 none, 1 gelu, 2 silu, 3 relu, 4 qgelu, 5 srelu
//   bits 10-12 dact           same codes as act
//   bit 13     dbias
//   bits 14-15 input dtype    0 fp32, 1 fp16, 2 bf16 (informational: one function serves all)
//   bit 16     gated          act/dact is the gated form (swiglu, ...): get_quantize_kernel refuses it
//                             (a gated op's own register(), dispatcher() and export() serve it)
//   bit 17     format         fp8_block (bits 3-4 then: 0 pow2, 1 fp32; bit 5: gemm layout): served as
//                             the kernels serve it (1x128 rowwise, any dtype; 128-row colwise and
//                             128x128 from bf16/fp16, the gemm layout's transposed colwise copy from
//                             aligned rows only); the rest is refused by name (limits.cpp_gap)
//   bit 18     block          fp8_block 128x128 (else 1x128); nvfp4 block_2d (16x16)
//   bit 19     format, high   format = bit 17 | bit 19 << 1: 2 nvfp4, 3 mxfp4 (served through Python: packed
//                             data and NVFP4's E4M3 scales as uint8; stochastic rounding and hadamard refused)
//   bit 20     hadamard       nvfp4 (TE's sign vector; a Python op's own hadamard_signs have no key)
//   bit 21     stochastic_rounding  nvfp4
//   bits 22-31 zero
#ifndef MXQ_MXQ_HPP_
#define MXQ_MXQ_HPP_

#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace mxq {

enum KeyBits : uint32_t {
  kE5M2 = 1u << 0,
  kRowwise = 1u << 1,
  kColwise = 1u << 2,
  kScaleModeShift = 3,  // mxfp8: 0 rceil, 1 floor, 2 ceil, 3 even; mxfp4: 0 floor, 1 rceil; fp8_block: 0 pow2, 1 fp32
  kSwizzled = 1u << 5,
  kAmax = 1u << 6,
  kActShift = 7,
  kDactShift = 10,
  kDbias = 1u << 13,
  kDtypeShift = 14,  // 0 fp32, 1 fp16, 2 bf16
  kGated = 1u << 16,  // act / dact is the gated form of its code (swiglu = gated silu, ...)
  kFp8Block = 1u << 17,  // format fp8_block (kSwizzled then selects its gemm layout); the format's low bit
  kTiles128 = 1u << 18,  // fp8_block's 128x128 blocks; nvfp4's 16x16 blocks (block_2d)
  kFormatHigh = 1u << 19,  // the format's high bit: with kFp8Block clear nvfp4, set mxfp4
  kHadamard = 1u << 20,  // nvfp4's Hadamard transform of the colwise copy
  kStochasticRounding = 1u << 21,  // nvfp4's stochastic rounding
};

// A per-key cache of quantize functions. Thread-safe; when several threads ask for one key at
// once, one of them asks Python (which compiles) and the others wait for it. A failure is not
// cached: every waiter gets the error, and a later call tries again.
class KernelCache {
 public:
  static KernelCache& Global() {
    static KernelCache* cache = new KernelCache();  // never destroyed: safe at process exit
    return *cache;
  }

  tvm::ffi::Function Get(uint32_t key) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = entries_.find(key);
      if (it == entries_.end()) break;          // nobody has it or is building it
      if (it->second.ready) return it->second.fn;
      cv_.wait(lock);                           // another thread is building it
    }
    entries_.emplace(key, Entry{});             // claim the build
    lock.unlock();
    try {
      tvm::ffi::Function entry = tvm::ffi::Function::GetGlobalRequired("mxq.get_quantize_kernel");
      tvm::ffi::Function fn = entry(static_cast<int64_t>(key)).cast<tvm::ffi::Function>();
      lock.lock();
      entries_[key] = Entry{true, fn};
      ++builds_;
      cv_.notify_all();
      return fn;
    } catch (...) {
      lock.lock();
      entries_.erase(key);
      cv_.notify_all();
      throw;
    }
  }

  // How many keys were built (for tests and diagnostics).
  int64_t builds() {
    std::lock_guard<std::mutex> lock(mu_);
    return builds_;
  }

 private:
  struct Entry {
    bool ready = false;
    tvm::ffi::Function fn{nullptr};
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint32_t, Entry> entries_;
  int64_t builds_ = 0;
};

inline tvm::ffi::Function GetQuantizeKernel(uint32_t key) { return KernelCache::Global().Get(key); }

}  // namespace mxq

#endif  // MXQ_MXQ_HPP_
