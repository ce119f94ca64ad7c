// CPU products with native GPTQ-INT4 weights (DType GPTQ4_*, layout in quant/gptq.h), the MoE experts'
// path for GPTQ folders: qweight, scales (and zero points) read as the checkpoint stores them.
//   Y[i][j] = sum_k X[i][k] * W[j][k],  W[j][k] = (q - zero) * scale of (k / group, j)
// X is quantized to Q8_0 (as for Q4_0 weights) and each block of 8 inputs reordered even-then-odd, so one
// u32 of qweight (8 inputs of one output) meets two 4-byte runs of X in two u8 x s8 dot products:
// sum over a group = scale * (sum d_x * sum q * x_q - zero * sum x). cpu::matmul / matmul_batch call these
// for the GPTQ types; the tests call them directly per ISA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cpu/matmul.h"

namespace xpert::cpu {

void matmul_gptq(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
                 int64_t ldy, ThreadPool& pool);
// Every job has a GPTQ weight type.
void matmul_batch_gptq(std::span<const MatmulJob> jobs, ThreadPool& pool);

// Internal: one packed X row is xq int8[k] (even-odd per 8) | d f32[k/32] | sx f32[k/group] (sum of the
// rounded x per group), padded to 64 bytes.
struct GptqArgs {
  const uint8_t* qweight;  // u32 [k/8][n]
  const uint8_t* scales;   // f16 [k/group][n]
  const uint8_t* zeros;    // u8 [k/group][n], or null (8)
  int64_t n, k, group;
  const uint8_t* x;  // packed X rows
  size_t x_row_bytes, d_offset, sx_offset;
  float* y;
  int64_t ldy;
};
// Y rows [i0, i1), columns [j0, j1). Overwrites those Y entries.
using GptqKernel = void (*)(const GptqArgs& a, int64_t j0, int64_t j1, int64_t i0, int64_t i1);
GptqKernel gptq_kernel_scalar();
GptqKernel gptq_kernel_avx2();
GptqKernel gptq_kernel_avx512();

}  // namespace xpert::cpu
