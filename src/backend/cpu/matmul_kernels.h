// Internal to the CPU matmul: the per-ISA kernel tables and the packed activation layout they read.
//
// X is quantized once per call (quantize_row_activation: the integers llama.cpp's x86 build uses) and then
// stored in planes, so the kernels load quants with aligned-ish 32-byte loads and scales without f16
// conversion. One packed row per X row, rows kPackAlign-aligned:
//   Q8_0 : qs int8[k] | d f32[k/32] | neg_sum int32[k/32]   (-sum of the block's quants: folds weight offsets)
//   Q8_K : qs int8[k] | d f32[k/256] | bsums int16[k/16]
//   F32, F16, BF16 : f32[k], the value rounded through the activation type.
#pragma once
#include <cstddef>
#include <cstdint>

namespace xpert::cpu {

constexpr size_t kPackAlign = 64;

struct PackedLayout {
  size_t d_offset = 0;    // bytes from the row start to the scale plane
  size_t sum_offset = 0;  // bytes from the row start to the sum / bsums plane
  size_t row_bytes = 0;   // stride between packed rows
};

// Y[i * ldy + j] = dot(W row j, packed X row i) for j < n_w, i < n_x.
using TileKernel = void (*)(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                            const PackedLayout& x_layout, int64_t n_x, float* y, int64_t ldy);

struct MatmulKernels {
  const char* name;
  TileKernel f32, f16, bf16, q4_0, q5_0, q8_0, q4_k, q5_k, q6_k;
};

// Each lives in its own translation unit (matmul_scalar.cpp, matmul_avx2.cpp, matmul_avx512.cpp); the avx
// ones may only be called after best_isa() said so.
const MatmulKernels& matmul_kernels_scalar();
const MatmulKernels& matmul_kernels_avx2();
const MatmulKernels& matmul_kernels_avx512();

}  // namespace xpert::cpu
