// Activation conversion for the CUDA products: q8_1 blocks (decode) and per-row scaled f16 / bf16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/q8_1.cuh"

namespace xpert::cuda::detail {
namespace {

// One warp per 32-block: d = amax / 127, q = round(x / d), and d * sum(q) for the weights' offsets.
__global__ void quantize_q8_1_kernel(const float* __restrict__ x, int64_t ldx, int64_t n_blocks, int64_t bpr,
                                     int8_t* __restrict__ q, float2* __restrict__ ds) {
  pdl_begin();
  const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (b >= n_blocks) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = b / bpr, col = (b % bpr) * 32 + lane;
  warp_quantize_q8_1(x[row * ldx + col], q + row * (bpr * 32) + col, ds + b);
}

// One CTA per row. f16: scaled by a power of two that puts max |x| in [2^14, 2^15), so nothing overflows
// and (normal) values round exactly as an unscaled conversion would; the product is scaled back.
template <bool kBf16>
__global__ void convert_16_kernel(const float* __restrict__ x, int64_t ldx, int64_t k,
                                  uint32_t* __restrict__ out, float* __restrict__ scale,
                                  const int32_t* __restrict__ rows_dev) {
  const int64_t row = blockIdx.x;
  if (rows_dev && row >= *rows_dev) return;
  const float* xr = x + row * ldx;
  float s = 1.0f, inv = 1.0f;
  if constexpr (!kBf16) {
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(xr[i]));
    __shared__ float red[32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < (int)(blockDim.x / 32); ++i) amax = fmaxf(amax, red[i]);
    if (amax > 0.0f && isfinite(amax)) {
      const int e = ilogbf(amax);
      s = ldexpf(1.0f, e - 14);
      inv = ldexpf(1.0f, 14 - e);
    }
  }
  uint32_t* o = out + row * (k / 2);
  for (int64_t i = threadIdx.x; i < k / 2; i += blockDim.x) {
    const float2 v = make_float2(xr[2 * i] * inv, xr[2 * i + 1] * inv);
    uint32_t u;
    if constexpr (kBf16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
      memcpy(&u, &h, 4);
    } else {
      const __half2 h = __floats2half2_rn(v.x, v.y);
      memcpy(&u, &h, 4);
    }
    o[i] = u;
  }
  if (threadIdx.x == 0) scale[row] = s;
}

}  // namespace

void launch_quantize_q8_1(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* q, float2* ds,
                          cudaStream_t stream) {
  const int64_t bpr = k / 32, n_blocks = m * bpr;
  if (n_blocks == 0) return;
  constexpr int kThreads = 256;
  const int64_t grid = (n_blocks + kThreads / 32 - 1) / (kThreads / 32);
  launch_pdl(quantize_q8_1_kernel, (unsigned)grid, kThreads, 0, stream, x, ldx, n_blocks, bpr, q, ds);
  XPERT_CUDA_CHECK_LAUNCH();
}

void launch_convert_16(bool bf16, const float* x, int64_t ldx, int64_t m, int64_t k, void* out, float* scale,
                       const int32_t* rows_dev, cudaStream_t stream) {
  if (m == 0) return;
  auto* o = static_cast<uint32_t*>(out);
  if (bf16)
    convert_16_kernel<true><<<(unsigned)m, 256, 0, stream>>>(x, ldx, k, o, scale, rows_dev);
  else
    convert_16_kernel<false><<<(unsigned)m, 256, 0, stream>>>(x, ldx, k, o, scale, rows_dev);
  XPERT_CUDA_CHECK_LAUNCH();
  trace_launch(bf16 ? convert_16_kernel<true> : convert_16_kernel<false>, stream);
}

}  // namespace xpert::cuda::detail
