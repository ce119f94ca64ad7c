// Warp-level building blocks of the attention kernels (sm_80+): asynchronous 16-byte copies into
// shared memory, ldmatrix, the f16 tensor-core product m16n8k16 with f32 accumulators, movmatrix.
// Fragment layouts (PTX ISA, "mma.m16n8k16"): lane = 4 * gid + tig. A (16x16, row-major) holds rows
// gid / gid+8 and columns 2tig..2tig+1 (+8); B (16x8) holds rows (k) 2tig..2tig+1 (+8) of column gid;
// C (16x8) holds row gid columns 2tig..2tig+1 in c0,c1 and row gid+8 in c2,c3.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace xpert::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, bypassing L1; valid = false writes zeros (src is not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b, f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Transposes an 8x8 f16 matrix held one row pair per lane (the C / ldmatrix layout).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Two floats -> f16x2 (round to nearest even), lo in the low half (the lower column index).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Shared-memory tiles of rows of D halves, in 16-byte chunks, XOR-swizzled so that the 8 row addresses
// of one ldmatrix (same logical chunk, 8 consecutive rows) hit 8 different bank groups.
template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(D % 64 == 0, "rows of at least 8 chunks");
  return row * (D / 8) + (chunk ^ (row & 7));  // in 16-byte units
}

}  // namespace xpert::cuda::detail
