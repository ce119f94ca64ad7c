// Argument types shared by every backend's ops (see backend.h and cpu/ops.h).
#pragma once
#include <cstdint>

#include "quant/dtype.h"

namespace xpert {

enum class RopeMode { normal, neox };  // normal: pairs (2i, 2i+1); neox: pairs (i, i + n_rot/2)

// One sequence's causal attention over its KV cache.
//   q:   [n_tokens][n_head][head_dim] (f32), token t at position pos[t]
//   k,v: cache rows [n_ctx][n_head_kv][head_dim] in k_type / v_type: F16, or GGUF Q8_0 / Q4_0 blocks of
//        32 along each head's dims (head_dim a multiple of 32), so a row is row_bytes(type, n_head_kv *
//        head_dim) bytes and kv head h starts at h * row_bytes(type, head_dim). Positions 0..n_kv-1 valid.
//   out: [n_tokens][n_head][head_dim]
// Keys at position p are visible to a query at position q when p <= q and, with a sliding window w > 0,
// q - p < w. scores = q.k * kq_scale, with k (and v) the dequantized cache values. All pointers in the
// executing backend's memory.
struct AttentionArgs {
  const float* q;
  const void* k;
  const void* v;
  float* out;
  const int32_t* pos;
  int64_t n_tokens, n_head, n_head_kv, head_dim, n_kv;
  float kq_scale = 1.0f;
  int32_t sliding_window = 0;
  DType k_type = DType::F16, v_type = DType::F16;
};

}  // namespace xpert
