// KV rows into the cache in its type (attention.h: store_kv). Q8_0 and Q4_0 are quantized one warp per
// block of 32, lane = element, and reproduce quant's reference quantizers bit for bit: the same f32
// operations in the same order (multiplies and adds written as __fmul_rn / __fadd_rn so they are never
// fused), IEEE division, round-half-away (Q8_0) and truncation (Q4_0) as the C++ casts do.
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_kv.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda {
namespace {

using namespace detail;

constexpr int kWarpsPerBlock = 8;

template <int T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    quantize_kv_kernel(const float* x, int64_t n_tokens, int64_t row, char* cache, int64_t slot_stride,
                       const int32_t* slots, const int32_t* pos) {
  pdl_begin();
  const int64_t nb = row / 32;
  const int64_t blk = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= n_tokens * nb) return;  // whole warps leave together
  const int64_t t = blk / nb, b = blk % nb;
  const float v = x[t * row + b * 32 + lane];
  const int64_t slot = slots ? slots[t] : 0, r = pos ? pos[t] : t;
  char* dst = cache + slot * slot_stride + r * kv_bytes<T>(row) + b * kv_block_bytes<T>();
  if constexpr (T == kKvQ8) {
    float amax = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
    dst[2 + lane] = (char)(int8_t)roundf(__fmul_rn(v, id));
  } else {
    // The value of largest magnitude with its sign; on ties the lowest index (the reference's scan keeps
    // the first).
    float best = fabsf(v);
    int at = lane;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int oa = __shfl_xor_sync(0xffffffffu, at, off);
      if (ob > best || (ob == best && oa < at)) best = ob, at = oa;
    }
    const float mx = __shfl_sync(0xffffffffu, v, at);
    const float d = mx / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = min(15, __float2int_rz(__fadd_rn(__fmul_rn(v, id), 8.5f)));
    const int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
    if (lane < 16) dst[2 + lane] = (char)(uint8_t)(q | (q_hi << 4));
  }
}

}  // namespace

void store_kv(const float* x, int64_t n_tokens, int64_t row, DType type, void* cache, int64_t slot_stride,
              const int32_t* slots, const int32_t* pos, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  if (type == DType::F16) {
    if (!pos && !slots) return store_f16(x, static_cast<uint16_t*>(cache), n_tokens * row, stream);
    if (!pos) detail::fail_rt("cuda store_kv: slots without positions");
    return store_kv_f16(x, n_tokens, row, static_cast<uint16_t*>(cache), slot_stride / 2, slots, pos, stream);
  }
  if (type != DType::Q8_0 && type != DType::Q4_0)
    detail::fail_rt("cuda store_kv: KV cache type ", (int)type, " is not supported (f16, q8_0, q4_0)");
  if (row % 32 != 0) detail::fail_rt("cuda store_kv: a row of ", row, " values is not whole blocks of 32");
  const int64_t blocks = n_tokens * (row / 32);
  const unsigned grid = (unsigned)((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock);
  char* c = static_cast<char*>(cache);
  if (type == DType::Q8_0)
    launch_pdl(quantize_kv_kernel<kKvQ8>, grid, 32 * kWarpsPerBlock, 0, stream, x, n_tokens, row, c, slot_stride, slots, pos);
  else
    launch_pdl(quantize_kv_kernel<kKvQ4>, grid, 32 * kWarpsPerBlock, 0, stream, x, n_tokens, row, c, slot_stride, slots, pos);
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace xpert::cuda
