// Per-format reference (de)quantizers behind quant.h's switch. Internal to src/quant and its tests.
#pragma once
#include <algorithm>
#include <cstdint>

#include "quant/blocks.h"

namespace xpert::quant {

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n_blocks);
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t n_blocks);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n_blocks);
void quantize_q8_0_activation(const float* x, BlockQ8_0* y, int64_t n_blocks);
void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t n_blocks);
void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t n_blocks);
void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t n_blocks);

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n_blocks);
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n_blocks);
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n_blocks);
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t n_blocks);
void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t n_blocks);
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t n_blocks);
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t n_blocks);
void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t n_blocks);

}  // namespace xpert::quant
