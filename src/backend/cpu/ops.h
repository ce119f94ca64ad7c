// Plain CPU ops used by the model forward passes (everything except the quantized matmul, which is
// matmul.h). Activations are f32 rows; the KV cache is f16, q8_0 or q4_0. Precision follows llama.cpp's CPU backend
// where it changes results: rms_norm sums in double, rope angles are built by repeated multiplication,
// the GELU of gated FFNs goes through an f16 table, attention rounds q and (short rows) the softmax weights to f16.
#pragma once
#include <cstdint>

#include "backend/op_types.h"
#include "base/thread_pool.h"

namespace xpert::cpu {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of n; y may alias x. w may be null.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps);

using xpert::RopeMode;  // op_types.h
// x: rows of n_heads * head_dim, one row per token at position pos[t]; rotates the first n_rot dims.
void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
          float freq_base, float freq_scale, RopeMode mode);

// y = gelu_tanh(gate) * up, gelu through llama.cpp's f16 table; y may alias gate. Parallel when a pool is given.
void geglu(const float* gate, const float* up, float* y, int64_t n, ThreadPool* pool = nullptr);
// y = silu(gate) * up
void swiglu(const float* gate, const float* up, float* y, int64_t n);
void add(const float* a, const float* b, float* y, int64_t n);
void scale(float* x, float s, int64_t n);
void add_bias(float* x, const float* bias, int64_t rows, int64_t n);

// One sequence's causal attention over its cache (see op_types.h). A query row that sees fewer than
// kAttentionTiledMinKeys keys takes the short path, llama.cpp's steps (q rounded to f16, f32 products
// with the cache's values, a score row, softmax weights rounded to f16), parallel over (token, head): the
// model tests compare its tokens with llama.cpp's. A row that sees more takes the tiled path
// (ops_attn.h: online softmax over key tiles, split-K at decode; q rounded to f16, weights not), whose
// result for a row depends only on that row, not on the batch or the thread count. Every cache type
// takes the same steps, so a quantized cache differs from f16 only by its values.
using xpert::AttentionArgs;
constexpr int64_t kAttentionTiledMinKeys = 1024;
void attention(const AttentionArgs& a, ThreadPool& pool);
// Every row (or those seeing at most max_keys keys) through the short path: the reference for the tests.
void attention_plain(const AttentionArgs& a, ThreadPool& pool, int64_t max_keys = INT64_MAX);

// Copy f32 rows into f16 cache rows.
void store_f16(const float* x, uint16_t* dst, int64_t n);
// f32 -> cache rows of `type`: F16 as store_f16, Q8_0 / Q4_0 by quant's reference quantizers (n a
// multiple of 32).
void store_kv(const float* x, void* dst, int64_t n, DType type);

}  // namespace xpert::cpu
