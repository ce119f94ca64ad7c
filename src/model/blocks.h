// Building blocks shared by the architecture files: linear layers, embedding lookup, and the
// self-attention block (projections, optional biases and QK-norm, RoPE, KV-cache store, attention,
// output projection). Each architecture's forward reads top to bottom by calling these.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "model/model.h"

namespace xpert {

class KvCache;

// y[m][w.ne[1]] = x[m][w.ne[0]] . w^T
void linear(const Weight& w, const float* x, int64_t m, float* y, ThreadPool& pool);
// x[t][n_embd] = row tokens[t] of the embedding, times scale.
void embed(const Weight& tok_embd, std::span<const int32_t> tokens, float scale, float* x);

struct AttentionLayerParams {
  float rope_base = 10000.0f, rope_scale = 1.0f;
  cpu::RopeMode rope_mode = cpu::RopeMode::normal;
  float q_scale = 1.0f;   // applied to q after RoPE (Gemma)
  float kq_scale = 1.0f;  // applied to q.k
  int32_t sliding_window = 0;
};

// Reusable activation buffers for one forward pass, and the batch's layout.
struct Scratch {
  std::vector<float> x, cur, q, k, v, att, ff_gate, ff_up, out;
  std::vector<int32_t> pos;            // per token
  std::vector<BatchSegment> segments;  // the batch as runs of one sequence (one run for a single sequence)
  std::vector<int64_t> out_rows;       // token rows that produce logits, in order
  void reserve(const ModelConfig& c, int64_t n_tokens);
};

// Sizes the buffers for the batch and fills pos / segments / out_rows; call first in every forward.
// Throws Error for a batch that does not fit the cache or has out-of-range slots.
void begin_forward(const ModelConfig& c, const ForwardArgs& args, Scratch& s);

// cur [n][n_embd] (already normalized) -> s.out [n][n_embd]. Stores this batch's K/V in the cache.
void self_attention(const ModelConfig& c, const LayerWeights& lw, const AttentionLayerParams& p, int64_t il,
                    const ForwardArgs& args, Scratch& s, ThreadPool& pool);

// Final norm and output projection of the rows that need logits.
void output_logits(const ModelConfig& c, const ModelWeights& w, const ForwardArgs& args, Scratch& s,
                   std::vector<float>& logits, ThreadPool& pool);

}  // namespace xpert
