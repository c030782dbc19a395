// The sizes of mxq's scale buffers and dbias workspace, for the C++ code that checks a caller's
// buffers: the registered dispatcher (dispatch.cc) and every exported library's argument check
// (export_check.h). Python's definitions: mxq/formats/layouts.py (rowwise_scale_shape,
// colwise_scale_shape) and mxq/formats/groups.py (the grouped buffers); tests/test_export_check.py holds
// the two equal. `groups` < 0: an ungrouped call; else G, the number of row groups.
#ifndef MXQ_SCALE_SIZES_H_
#define MXQ_SCALE_SIZES_H_

#include <cstdint>

namespace mxq_sizes {

constexpr int64_t kBlock = 32;  // elements per scale (numerics.BLOCK)

inline int64_t Cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t Roundup(int64_t a, int64_t b) { return Cdiv(a, b) * b; }

// Bytes of the rowwise E8M0 scales of an [m, n] output: compact [m, ceil(n/32)]; swizzled (the
// cuBLAS 128x4 blocked layout) [roundup(m, 128), roundup(ceil(n/32), 4)], grouped [m + 128 G, ...].
inline int64_t RowScaleBytes(int64_t m, int64_t n, bool swizzled, int64_t groups = -1) {
  const int64_t blocks = Cdiv(n, kBlock);
  if (!swizzled) return m * blocks;
  return (groups < 0 ? Roundup(m, 128) : m + 128 * groups) * Roundup(blocks, 4);
}

// Bytes of the colwise E8M0 scales: compact [ceil(m/32), n], grouped [m/32 + G, n]; swizzled
// [roundup(ceil(m/32), 4), roundup(n, 128)], grouped [m/32 + 4 G, roundup(n, 128)].
inline int64_t ColScaleBytes(int64_t m, int64_t n, bool swizzled, int64_t groups = -1) {
  if (!swizzled) return (groups < 0 ? Cdiv(m, kBlock) : m / kBlock + groups) * n;
  return (groups < 0 ? Roundup(Cdiv(m, kBlock), 4) : m / kBlock + 4 * groups) * Roundup(n, 128);
}

// Rows of the dbias workspace [rows, n] (one row of partial sums per 32-row block).
inline int64_t WorkspaceRows(int64_t m, int64_t groups = -1) {
  return groups < 0 ? Cdiv(m, kBlock) : m / kBlock + groups;
}

}  // namespace mxq_sizes

#endif  // MXQ_SCALE_SIZES_H_
