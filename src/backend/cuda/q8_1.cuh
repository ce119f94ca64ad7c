// q8_1 activations (matmul.h) made by a warp: lane i holds value i of one 32-block; d = amax / 127,
// q = round(v / d), and (d, d * sum q) for the weights' offsets. Every CUDA producer of q8_1 (the
// conversion kernel, the norms, the attention combine, the MoE gate/up) rounds through here, so the
// products see the same bits whichever kernel made their input.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace xpert::cuda {

// The whole warp calls it; lane i writes *q (its own element), lane 0 also *ds (the block's scale pair).
// sm_80+: the maximum and the sum are one warp reduction each (redux.sync), not five shuffles each: a
// non-negative float's bits order as the float does, so the integer maximum of |v|'s bits is amax's.
// (An H200 norm of 2048 values with its q8_1 took 2.42 us a launch in a chain against 1.66 without.)
__device__ __forceinline__ void warp_quantize_q8_1(float v, int8_t* q, float2* ds) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
#else
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
#endif
  const float d = amax / 127.0f;
  const int qi = amax == 0.0f ? 0 : __float2int_rn(v * (127.0f / amax));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int sum = __reduce_add_sync(0xffffffffu, qi);
#else
  int sum = qi;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
#endif
  *q = (int8_t)qi;
  if ((threadIdx.x & 31) == 0) *ds = make_float2(d, d * (float)sum);
}

// The same blocks made by one thread each: threads [0, nthreads) of the caller (thread `tid`) convert the
// n values of v (n % 32 == 0; shared memory) into q / ds, block b by thread b % nthreads, with
// warp_quantize_q8_1's arithmetic (the same bits). Thread t starts at element t % 32 of its block, so the
// reads of a warp hit 32 different banks.
__device__ __forceinline__ void thread_quantize_q8_1(const float* v, int n, int8_t* q, float2* ds, int tid,
                                                     int nthreads) {
  for (int b = tid; b < n / 32; b += nthreads) {
    const float* x = v + b * 32;
    const int r = tid & 31;
    float amax = 0.0f;
#pragma unroll 8
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[(i + r) & 31]));
    const float inv = 127.0f / amax;
    int sum = 0;
#pragma unroll 8
    for (int i = 0; i < 32; ++i) {
      const int j = (i + r) & 31;
      const int qi = amax == 0.0f ? 0 : __float2int_rn(x[j] * inv);
      q[b * 32 + j] = (int8_t)qi;
      sum += qi;
    }
    const float d = amax / 127.0f;
    ds[b] = make_float2(d, d * (float)sum);
  }
}

}  // namespace xpert::cuda
