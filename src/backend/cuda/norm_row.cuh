// One row of 1024 < n <= 2048 normalized by one CTA of 128 threads, the same bits as add_rmsnorm_q8's
// long-row kernel (rmsnorm_wide_kernel<2>, 1024 threads): there thread i sums the squares of elements i
// and i + 1024 in double, then a shuffle tree a warp, then a tree over the 32 warps' sums. Thread t here
// holds that kernel's threads 8t .. 8t + 7 (their warp t / 4, lanes 8 (t % 4) + c), so its tree's offsets
// 16 and 8 are shuffles 2 and 1 between threads and 4, 2, 1 are between t's own eight sums: the same
// doubles, the same scale, the same products. The q8_1 blocks are q8_1.cuh's arithmetic over the four
// threads that hold a block (their maximum and sum do not depend on order).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace xpert::cuda {

// x [n] (read past L1: other CTAs of the launch may have written it) -> y = x / rms(x) * w [n], and y's
// q8_1 values q [n] and scales ds [n / 32]. n % 32 == 0. red: 32 doubles of shared memory. Every thread of
// the CTA (128) calls it.
__device__ __forceinline__ void norm_row_128(const float* x, const float* __restrict__ w, int n, float eps,
                                             float* __restrict__ y, int8_t* __restrict__ q,
                                             float2* __restrict__ ds, double* red) {
  const int t = threadIdx.x, lane = t & 31;
  float v[2][8], wv[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = h * 1024 + 8 * t + 4 * u;  // n % 8 == 0: a float4 is all in the row or all past it
      const float4 a = e < n ? __ldcg(reinterpret_cast<const float4*>(x + e)) : make_float4(0, 0, 0, 0);
      const float4 b = e < n ? __ldg(reinterpret_cast<const float4*>(w + e)) : make_float4(0, 0, 0, 0);
      v[h][4 * u] = a.x, v[h][4 * u + 1] = a.y, v[h][4 * u + 2] = a.z, v[h][4 * u + 3] = a.w;
      wv[h][4 * u] = b.x, wv[h][4 * u + 1] = b.y, wv[h][4 * u + 2] = b.z, wv[h][4 * u + 3] = b.w;
    }
  double s[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) s[c] = (double)(v[0][c] * v[0][c]) + (double)(v[1][c] * v[1][c]);
#pragma unroll
  for (int off = 2; off > 0; off >>= 1)  // the long-row kernel's offsets 16 and 8
#pragma unroll
    for (int c = 0; c < 8; ++c) s[c] += __shfl_xor_sync(0xffffffffu, s[c], off);
#pragma unroll
  for (int off = 4; off > 0; off >>= 1) {  // its offsets 4, 2, 1
    double r[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) r[c] = s[c] + s[c ^ off];
#pragma unroll
    for (int c = 0; c < 8; ++c) s[c] = r[c];
  }
  if (t % 4 == 0) red[t / 4] = s[0];
  __syncthreads();
  double sum = red[lane];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float mean = (float)(sum / (double)n);
  const float sc = 1.0f / sqrtf(mean + eps);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = h * 1024 + 8 * t;
    float o[8];
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      o[c] = __fmul_rn(__fmul_rn(v[h][c], sc), wv[h][c]);
      amax = fmaxf(amax, fabsf(o[c]));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the block's four threads
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float inv = 127.0f / amax;
    int qi[8], qsum = 0;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      qi[c] = amax == 0.0f ? 0 : __float2int_rn(o[c] * inv);
      qsum += qi[c];
    }
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
    if (e < n) {
      reinterpret_cast<float4*>(y + e)[0] = make_float4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<float4*>(y + e)[1] = make_float4(o[4], o[5], o[6], o[7]);
      auto pack = [](const int* p) {
        return (uint32_t)(uint8_t)p[0] | (uint32_t)(uint8_t)p[1] << 8 | (uint32_t)(uint8_t)p[2] << 16 |
               (uint32_t)(uint8_t)p[3] << 24;
      };
      *reinterpret_cast<uint2*>(q + e) = make_uint2(pack(qi), pack(qi + 4));
      const float d = amax / 127.0f;
      if (t % 4 == 0) ds[e / 32] = make_float2(d, d * (float)qsum);
    }
  }
}

}  // namespace xpert::cuda
