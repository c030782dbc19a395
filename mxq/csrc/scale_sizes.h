// The sizes of mxq's scale buffers and dbias workspace, for the C++ code that checks a caller's
// buffers: the registered dispatcher (dispatch.cc) and every exported library's argument check
// (export_check.h). Nothing here knows a format: each op's facts come from Python,
// mxq/runtime/slots.py (scale_facts: one list of integers, from mxq/formats/layouts.py,
// fp8_block_layouts.py and the kernels' tile), rendered into an exported library's check or
// passed to make_dispatcher; tests/test_export_check.py holds the sizes equal to what Python
// allocates. `groups` < 0: an ungrouped call; else G, the number of row groups.
#ifndef MXQ_SCALE_SIZES_H_
#define MXQ_SCALE_SIZES_H_

#include <cstdint>

namespace mxq_sizes {

// The kernels' size limit (mxq/tensor.py, MAX_ELEMENTS and MAX_ROWS, asked by runtime/limits.py; held equal by
// tests/test_export_check.py): fewer than 2^31 elements, M below 2^31 - 64. Python's routes run the
// reference beyond it; the dispatcher hands such calls to them, an exported function refuses them.
constexpr int64_t kMaxElements = int64_t{1} << 31;
constexpr int64_t kMaxRows = kMaxElements - 64;

inline int64_t Cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t Roundup(int64_t a, int64_t b) { return Cdiv(a, b) * b; }

// How one direction's scales of an [m, w] output lie in their flat buffer: a grid of
// [ceil(m / block_rows), ceil(w / block_cols)] scales, padded to multiples of
// [pad_rows, pad_cols], stored in `order`.
enum Order : int64_t {
  kRowMajor = 0,    // row after row (compact scales)
  kOuterMajor = 1,  // column after column: scale (i, j) at j * padded rows + i (FP8 block scaling's
                    // GEMM-ready 1x128 scales; a [rows, blocks] view with strides (1, padded rows))
  kBlocked = 2,     // MXFP8's swizzled 128x4 tiles (cuBLAS' blocked layout)
};

struct ScaleFacts {
  int64_t block_rows, block_cols, pad_rows, pad_cols, order;
};

// An op's facts, as slots.scale_facts lists them: rowwise scales, colwise scales, the scales'
// bits (8: E8M0 bytes; 32: fp32), and the rows of one dbias partial sum (the kernels' tile).
constexpr int kFacts = 12;
struct Facts {
  ScaleFacts row, col;
  int64_t scale_bits, tile_rows;
};

inline Facts FromList(const int64_t* v) {
  return Facts{{v[0], v[1], v[2], v[3], v[4]}, {v[5], v[6], v[7], v[8], v[9]}, v[10], v[11]};
}

// Rows of the padded scale grid. Grouped, each group's grid starts on a padded row of its own:
// at most m / block_rows + pad_rows G rows (block rows restart at each group's first row, padding
// follows each group); where neither blocks span rows nor padding is added, the groups change
// nothing: m rows.
inline int64_t ScaleRows(const ScaleFacts& f, int64_t m, int64_t groups = -1) {
  if (groups < 0) return Roundup(Cdiv(m, f.block_rows), f.pad_rows);
  if (f.block_rows == 1 && f.pad_rows == 1) return m;
  return m / f.block_rows + f.pad_rows * groups;
}

inline int64_t ScaleCols(const ScaleFacts& f, int64_t w) { return Roundup(Cdiv(w, f.block_cols), f.pad_cols); }

// Elements of the flat scale buffer of an [m, w] output.
inline int64_t ScaleElements(const ScaleFacts& f, int64_t m, int64_t w, int64_t groups = -1) {
  return ScaleRows(f, m, groups) * ScaleCols(f, w);
}

// Rows of the dbias workspace [rows, w]: one row of partial sums per tile of `tile_rows` rows
// (grouped: every group's tiles).
inline int64_t WorkspaceRows(int64_t m, int64_t tile_rows, int64_t groups = -1) {
  return groups < 0 ? Cdiv(m, tile_rows) : m / tile_rows + groups;
}

}  // namespace mxq_sizes

#endif  // MXQ_SCALE_SIZES_H_
