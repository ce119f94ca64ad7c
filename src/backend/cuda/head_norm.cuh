// Per-head pieces that several CUDA kernels compute the same way, so that their results are the same
// bits: RoPE's angles (norm_rope_kernel, the one-block decode attention's q/k prep) and a warp's RMS
// scale of one row (those two, and the Gated DeltaNet's gated norm).
#pragma once
#include <cuda_runtime.h>

namespace xpert::cuda {

// A lane's rotation angles for pairs lane + 32 j (j < kPairs) below n_rot / 2, built as cpu::rope builds
// them: theta = pos, times theta_scale once per pair before it, so the angles are the same floats. The
// entries of pairs at or past n_rot / 2 are left as they are.
template <int kPairs>
__device__ __forceinline__ void rope_angles(float pos, int n_rot, float theta_scale, float freq_scale,
                                            float (&rc)[kPairs], float (&rs)[kPairs]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i2 = lane + 32 * j;
    if (i2 < n_rot / 2) {
      float theta = pos;
      for (int e = 0; e < i2; ++e) theta *= theta_scale;
      const float th = freq_scale * theta;
      rc[j] = cosf(th);
      rs[j] = sinf(th);
    }
  }
}

// 1 / sqrt(mean(x^2) + eps) of a row of n values held by one warp, a lane's values (lane + 32 j) in xv: the
// squares summed in double, lane by lane, then across the warp as a xor tree (the same tree in every lane).
template <int kPer>
__device__ __forceinline__ float warp_rms_scale(const float (&xv)[kPer], int n, float eps) {
  const int lane = threadIdx.x % 32;
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (lane + 32 * j < n) sum += (double)(xv[j] * xv[j]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  return 1.0f / sqrtf((float)(sum / (double)n) + eps);
}

}  // namespace xpert::cuda
