// Tiled attention for long contexts (issue #10): the tile kernels and the driver behind cpu::attention
// for rows that see many keys. See ops_attn.cpp for the algorithm and why its results do not depend on
// the thread count, the query batch or prefill vs decode.
#pragma once
#include <cstdint>

#include "backend/op_types.h"
#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert::cpu {

// f32 tile products, one implementation per ISA (the AVX2 file is called only when best_isa() says so).
// Every (row, key) score and every output element is summed the same way whatever R and J are, so a
// row's result does not depend on which other rows share its tile.
struct AttnTileKernels {
  // s[r * lds + j] = sum_c q[r * D + c] * k[j * D + c]   (r < R, j < J)
  void (*scores)(const float* q, int64_t R, const float* k, int64_t J, int64_t D, float* s, int64_t lds);
  // o[r * D + c] += sum_j p[r * ldp + j] * v[j * D + c], j in order   (r < R, j < J)
  void (*pv)(const float* p, int64_t ldp, int64_t R, const float* v, int64_t J, int64_t D, float* o);
  // out[j * D + c] = value c of the head slice at src + j * stride (F16, Q8_0 or Q4_0), exactly as
  // quant's dequantize_row gives it (q * d in f32).
  void (*rows_f32)(DType type, const uint8_t* src, size_t stride, int64_t J, int64_t D, float* out);
};
const AttnTileKernels& attn_tile_kernels();

void attn_scores_scalar(const float* q, int64_t R, const float* k, int64_t J, int64_t D, float* s, int64_t lds);
void attn_pv_scalar(const float* p, int64_t ldp, int64_t R, const float* v, int64_t J, int64_t D, float* o);
void attn_rows_f32_scalar(DType type, const uint8_t* src, size_t stride, int64_t J, int64_t D, float* out);
void attn_rows_f32_avx2(DType type, const uint8_t* src, size_t stride, int64_t J, int64_t D, float* out);
void attn_scores_avx2(const float* q, int64_t R, const float* k, int64_t J, int64_t D, float* s, int64_t lds);
void attn_pv_avx2(const float* p, int64_t ldp, int64_t R, const float* v, int64_t J, int64_t D, float* o);

// Keys per tile, and per split-K chunk; both grids are absolute key positions (chunk c holds keys
// [c * kAttnChunk, (c + 1) * kAttnChunk)), which is what makes a row's result independent of the rest.
constexpr int64_t kAttnBlock = 64;
constexpr int64_t kAttnChunk = 512;

// Attention for the query rows (token, head) that see at least `min_keys` keys (the others are left
// untouched): online softmax over key tiles, parallel over (kv head, query block), or, when those are
// fewer than a few per thread (decode), also over key chunks whose partial results are merged after.
void attention_tiled(const AttentionArgs& a, ThreadPool& pool, int64_t min_keys = 0);

}  // namespace xpert::cpu
