// The grouped tensor-core products' map from a CTA's tile index to its group (expert) and rows
// (GemmArgs::group_rows / group_tiles, matmul_kernels.h). Included by .cu files only.
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

}  // namespace xpert::cuda::detail
