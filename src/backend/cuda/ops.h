// Elementwise and normalization ops on a CUDA device, with cpu::ops' meaning (backend/cpu/ops.h): f32
// rows, the KV cache in f16. Every pointer is device memory (positions and row indices included), every
// call is asynchronous on `stream` and checks its launch. Precision as the CPU where it changes
// results: rms sums in double, RoPE angles by repeated multiplication, GELU rounded through f16.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_types.h"

namespace xpert::cuda {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for rows of n; w may be null; y may alias x. w is a weight: the
// decode-sized form reads it before its PDL wait (launch.cuh), so no kernel of the step may write it.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             cudaStream_t stream);
// The same over strided rows: row r of x at x + r * x_stride, of y at y + r * y_stride. Per-head q/k norms
// are rows = n_tokens * n_heads of n = head_dim; Qwen3.5's q, interleaved with its gate per head, is
// x_stride = 2 * head_dim (normalized and packed into y in one pass).
void rmsnorm_strided(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                     int64_t rows, int64_t n, float eps, cudaStream_t stream);

// x += d, then y = rmsnorm(x) * w (rows of n; d may be null: the plain norm, x only read). With q and ds
// (n % 32 == 0, y dense): also y's q8_1 activations, int8 [rows][n] and float2 [rows][n / 32] as
// matmul.h's quantize_activations writes them, so decode products can start from them.
void add_rmsnorm_q8(const float* d, float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                    int64_t rows, int64_t n, float eps, int8_t* q, float2* ds, cudaStream_t stream);

// Per-head RMS norm of q (when norm_q; weights q_norm, may be null) and of k (norm_k, k_norm), then RoPE of
// both, in place: q [n_tokens][n_head][head_dim], k [n_tokens][n_head_kv][head_dim] (k may be null with
// n_head_kv = 0). The same results as rmsnorm then rope on each, in one launch. pos is read before the
// launch's PDL wait (launch.cuh): no kernel of the stream may write it (positions come from host copies).
// q_stride: floats from one (token, head) row of q to the next (0: head_dim; Qwen3.5's q rows interleaved
// with its gate's: 2 head_dim).
void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, bool norm_q, bool norm_k,
                  const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                  int64_t n_rot, float freq_base, float freq_scale, RopeMode mode, float eps,
                  cudaStream_t stream, int64_t q_stride = 0);

// The same for a decode step into an f16 cache: q normalized and rotated in place; k normalized, rotated and
// stored, and v stored, at row pos[t] of slot slots[t] (cache + slot * slot_stride + pos * n_head_kv *
// head_dim halves; slots may be null) -- qk_norm_rope then store_kv_f16 of k and of v, in one launch (k
// itself is left as it was). Norm weights may be null (no norm).
void qk_norm_rope_store_f16(float* q, const float* k, const float* v, const float* q_norm,
                            const float* k_norm, const int32_t* pos, int64_t n_tokens, int64_t n_head,
                            int64_t n_head_kv, int64_t head_dim, int64_t n_rot, float freq_base,
                            float freq_scale, RopeMode mode, float eps, uint16_t* k_cache, uint16_t* v_cache,
                            int64_t slot_stride, const int32_t* slots, cudaStream_t stream,
                            int64_t q_stride = 0);

// x: rows of n_heads * head_dim, one per token at position pos[t]; rotates the first n_rot dims of each head.
void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
          float freq_base, float freq_scale, RopeMode mode, cudaStream_t stream);

void swiglu(const float* gate, const float* up, float* y, int64_t n, cudaStream_t stream);  // silu(gate) * up
void geglu(const float* gate, const float* up, float* y, int64_t n,
           cudaStream_t stream);  // gelu_tanh(gate) * up
void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);
void scale(float* x, float s, int64_t n, cudaStream_t stream);
void add_bias(float* x, const float* bias, int64_t rows, int64_t n, cudaStream_t stream);
// x[i] *= sigmoid(gate[i])
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);
// Rows of n: x[r][i] *= sigmoid(gate[r * gate_stride + i]) (Qwen3.5's attention output gate read in
// place from the interleaved q|gate projection: gate = qg + head_dim, gate_stride = 2 * head_dim).
void mul_sigmoid_strided(float* x, const float* gate, int64_t gate_stride, int64_t rows, int64_t n,
                         cudaStream_t stream);
// y[r][i] += s[r][i] * sigmoid(g[r]) for rows of n (the shared expert's gate).
void add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n,
                        cudaStream_t stream);
// src rows of 2 * width -> a (first half of each row), b (second half).
void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b, cudaStream_t stream);
// y[i] = x[rows[i]] for n_rows rows of width.
void gather_rows(const float* x, const int64_t* rows, int64_t n_rows, int64_t width, float* y,
                 cudaStream_t stream);

// f32 -> f16, round to nearest even.
void store_f16(const float* x, uint16_t* dst, int64_t n, cudaStream_t stream);
// KV rows into the cache: token t's row of `row` values goes to row pos[t] of slot slots[t]
// (cache + slots[t] * slot_stride + pos[t] * row). slots may be null (slot 0). Positions on the device, so a
// decode step can be captured once and replayed.
void store_kv_f16(const float* x, int64_t n_tokens, int64_t row, uint16_t* cache, int64_t slot_stride,
                  const int32_t* slots, const int32_t* pos, cudaStream_t stream);

}  // namespace xpert::cuda
