// What the tensor-core GEMMs (matmul_prefill.cu, matmul_grouped.cu) share: the grouped products' map from a
// CTA's tile index to its group (expert) and rows (GemmArgs::group_rows / group_tiles, matmul_kernels.h), and
// an output element's value. Included by .cu files only.
#pragma once
#include <cstdint>

#include "backend/cuda/matmul_kernels.h"

namespace xpert::cuda::detail {

struct GroupTile {
  int group;
  int64_t m_begin, m_end;  // the tile's first output row, and the group's end
};

// False for tiles past the last group's (the grid is a bound: GemmArgs::max_tiles).
__device__ __forceinline__ bool group_tile(const GemmArgs& p, int t, int bm, GroupTile& out) {
  if (t >= p.group_tiles[p.n_groups]) return false;
  int lo = 0, hi = p.n_groups;  // group_tiles[lo] <= t < group_tiles[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.group_tiles[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  out.group = lo;
  out.m_begin = p.group_rows[lo] + (int64_t)(t - p.group_tiles[lo]) * bm;
  out.m_end = p.group_rows[lo + 1];
  return true;
}

// Output element from its accumulators (gate g and up u in dual mode) and its X row's scale s: g s, or
// silu(g s) * (u s).
template <bool kDual>
__device__ __forceinline__ float gemm_out(float g, float u, float s) {
  float v = g * s;
  if constexpr (kDual) v = v / (1.0f + expf(-v)) * (u * s);
  return v;
}

}  // namespace xpert::cuda::detail
