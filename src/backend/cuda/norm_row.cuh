// The long-row norm's sums (add_rmsnorm_q8's rmsnorm_wide_kernel<2>, 1024 threads, rows of 1024 < n <= 2048)
// reproduced by fewer threads: there thread i sums the squares of elements i and i + 1024 in double, then a
// shuffle tree a warp (offsets 16 .. 1), then a tree over the 32 warps' sums. A thread here holds V of that
// kernel's consecutive threads, so the tree's offsets of V and more are shuffles between threads and those
// below V are between its own V sums: the same doubles, so the same scale and the same products. Used by
// the router's norm (moe_router.cu, 256 threads, V = 4) and the one-CTA norm after the experts (norm_row_128,
// 128 threads, V = 8).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace xpert::cuda {

// The sum of squares of a row for a block of 1024 / V threads, thread t holding the long-row kernel's
// threads V t .. V t + V - 1: v[h][c] is element h * 1024 + V t + c (zero past the row). red: 32 doubles
// of shared memory. Every thread of the block calls it and gets the total.
template <int V>
__device__ __forceinline__ double wide_row_sumsq(const float (&v)[2][V], double* red) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V a power of two up to a warp");
  const int lane = threadIdx.x & 31;
  double s[V];
#pragma unroll
  for (int c = 0; c < V; ++c) s[c] = (double)(v[0][c] * v[0][c]) + (double)(v[1][c] * v[1][c]);
#pragma unroll
  for (int off = 16; off >= V; off >>= 1)  // between threads: the partner is off / V threads away
#pragma unroll
    for (int c = 0; c < V; ++c) s[c] += __shfl_xor_sync(0xffffffffu, s[c], off / V);
#pragma unroll
  for (int off = V / 2; off > 0; off >>= 1) {  // within the thread
    double r[V];
#pragma unroll
    for (int c = 0; c < V; ++c) r[c] = s[c] + s[c ^ off];
#pragma unroll
    for (int c = 0; c < V; ++c) s[c] = r[c];
  }
  if (threadIdx.x % (32 / V) == 0) red[threadIdx.x / (32 / V)] = s[0];  // the long-row kernel's warp sums
  __syncthreads();
  double sum = red[lane];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  return sum;
}

// x [n] (read past L1: other CTAs of the launch may have written it) -> y = x / rms(x) * w [n], and y's
// q8_1 values q [n] and scales ds [n / 32]. n % 32 == 0. red: 32 doubles of shared memory. Every thread of
// the CTA (128) calls it.
__device__ __forceinline__ void norm_row_128(const float* x, const float* __restrict__ w, int n, float eps,
                                             float* __restrict__ y, int8_t* __restrict__ q,
                                             float2* __restrict__ ds, double* red) {
  const int t = threadIdx.x;
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
  const double sum = wide_row_sumsq<8>(v, red);
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
