// Reading the KV cache in its type inside the attention kernels. Q8_0 / Q4_0 rows (GGUF blocks of 32
// values along each head's dims: f16 d, then 32 int8 / 16 bytes of nibbles, element j low and j+16 high)
// become f16 (q * d, rounded once) in the same swizzled tiles the f16 path fills, so the tensor-core code
// after the load does not change with the type. Blocks are 34 / 18 bytes, so a block sits at an even
// address only; one head's slice (D/32 blocks, D in 64/128/256) is a multiple of 4 bytes, so whole slices
// can be staged into shared memory with 4-byte cp.async.
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

// 16-bit elements of 16-byte-unaligned blocks: two loads make a 32-bit word.
__device__ __forceinline__ uint32_t load_u32_a2(const char* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// 4 bytes of u (each 0..255) -> two half2 holding (byte - bias) exactly: 0x64XX is the half 1024 + XX.
// `bias` is the half2 of 1024 + the value offset (128 for int8 flipped to unsigned, 8 for nibbles).
__device__ __forceinline__ void bytes_to_half2(uint32_t u, __half2 bias, __half2& lo, __half2& hi) {
  const uint32_t a = __byte_perm(u, 0x64646464u, 0x4140), b = __byte_perm(u, 0x64646464u, 0x4342);
  lo = __hsub2(*reinterpret_cast<const __half2*>(&a), bias);
  hi = __hsub2(*reinterpret_cast<const __half2*>(&b), bias);
}

__device__ __forceinline__ uint32_t half2_u32(__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); }

// Values 8c .. 8c+7 of one head's slice (`head` points at its first block; global or shared memory) as 8
// f16 (uint4, lowest index in the low half of .x): each an exact half of q (or nibble - 8) times d, one
// correctly rounded half multiply, the same bits as rounding the f32 product.
template <int T>
__device__ __forceinline__ uint4 kv_load8(const char* head, int c) {
  static_assert(T == kKvQ8 || T == kKvQ4, "f16 rows are copied, not converted");
  const char* blk = head + (c / 4) * kv_block_bytes<T>();
  const __half2 d = __half2half2(*reinterpret_cast<const __half*>(blk));
  const int e0 = (c % 4) * 8;
  uint32_t w0, w1;
  __half2 bias;
  if constexpr (T == kKvQ8) {
    w0 = load_u32_a2(blk + 2 + e0) ^ 0x80808080u;  // int8 -> unsigned + 128
    w1 = load_u32_a2(blk + 6 + e0) ^ 0x80808080u;
    bias = __half2half2(__ushort_as_half((unsigned short)0x6480));  // 1152 = 1024 + 128
  } else {
    const int shift = e0 >= 16 ? 4 : 0;
    w0 = (load_u32_a2(blk + 2 + (e0 & 15)) >> shift) & 0x0F0F0F0Fu;
    w1 = (load_u32_a2(blk + 6 + (e0 & 15)) >> shift) & 0x0F0F0F0Fu;
    bias = __half2half2(__ushort_as_half((unsigned short)0x6408));  // 1032 = 1024 + 8
  }
  __half2 v0, v1, v2, v3;
  bytes_to_half2(w0, bias, v0, v1);
  bytes_to_half2(w1, bias, v2, v3);
  return make_uint4(half2_u32(__hmul2(v0, d)), half2_u32(__hmul2(v1, d)), half2_u32(__hmul2(v2, d)),
                    half2_u32(__hmul2(v3, d)));
}

// 4 bytes global -> shared (cache-all: the only cp.async size below 16); valid = false writes zeros.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
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
