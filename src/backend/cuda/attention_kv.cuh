// Reading the KV cache in its type inside the attention kernels. F16 rows are copied into shared memory as
// they are (cp.async); Q8_0 / Q4_0 rows (GGUF blocks of 32 values along each head's dims: f16 d, then 32
// int8 / 16 bytes of nibbles, element j low and j+16 high) are loaded by the threads, dequantized to f16
// (q * d, rounded once) and stored into the same swizzled tiles, so the tensor-core code after the load
// does not change with the type.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "quant/dtype.h"

namespace xpert::cuda::detail {

enum KvKind : int { kKvF16 = 0, kKvQ8 = 1, kKvQ4 = 2 };

__host__ __device__ inline int kv_kind(DType t) { return t == DType::Q8_0 ? kKvQ8 : t == DType::Q4_0 ? kKvQ4 : kKvF16; }

template <int T>
constexpr int kv_block_bytes() {
  return T == kKvQ8 ? 34 : 18;
}

// Bytes of n values (n a multiple of 32 for the block types).
template <int T>
__host__ __device__ constexpr int64_t kv_bytes(int64_t n) {
  return T == kKvF16 ? 2 * n : n / 32 * kv_block_bytes<T>();
}

// The same at run time.
__host__ __device__ inline int64_t kv_bytes_of(int kind, int64_t n) {
  return kind == kKvF16 ? 2 * n : n / 32 * (kind == kKvQ8 ? 34 : 18);
}

__device__ __forceinline__ void st_shared16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Values 8c .. 8c+7 of one head's slice (`head` points at its first block) as 8 f16 (uint4, lowest index
// in the low half of .x). Blocks sit at even addresses only (34 / 18 bytes), so loads are 16-bit.
template <int T>
__device__ __forceinline__ uint4 kv_load8(const char* head, int c) {
  static_assert(T == kKvQ8 || T == kKvQ4, "f16 rows are copied, not converted");
  const char* blk = head + (c / 4) * kv_block_bytes<T>();
  const float d = __half2float(*reinterpret_cast<const __half*>(blk));
  const int e0 = (c % 4) * 8;
  uint32_t w[4];
  if constexpr (T == kKvQ8) {
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(blk + 2 + e0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t u = qs[i];
      w[i] = half2_bits((float)(int8_t)(u & 0xFF) * d, (float)(int8_t)(u >> 8) * d);
    }
  } else {
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(blk + 2 + (e0 & 15));
    const int shift = e0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t u = qs[i];
      const int lo = (u >> shift) & 0xF, hi = (u >> (8 + shift)) & 0xF;
      w[i] = half2_bits((float)(lo - 8) * d, (float)(hi - 8) * d);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Value i of one head's slice, for the plain kernel (any type, chosen at run time).
__device__ __forceinline__ float kv_value(const char* head, int kind, int64_t i) {
  if (kind == kKvF16) return __half2float(reinterpret_cast<const __half*>(head)[i]);
  const int64_t b = i / 32, j = i % 32;
  if (kind == kKvQ8) {
    const char* blk = head + b * 34;
    return (float)(int8_t)blk[2 + j] * __half2float(*reinterpret_cast<const __half*>(blk));
  }
  const char* blk = head + b * 18;
  const uint8_t q = (uint8_t)blk[2 + (j & 15)];
  return (float)((j < 16 ? q & 0xF : q >> 4) - 8) * __half2float(*reinterpret_cast<const __half*>(blk));
}

}  // namespace xpert::cuda::detail
