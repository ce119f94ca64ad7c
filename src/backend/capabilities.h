// What a backend may offer beyond the plain ops of backend.h, each an interface it returns from
// Backend::decode_fusions(), pass_graphs() or split_experts() (null: not offered). The model asks for a fused
// or recorded form by name and falls back to the plain ops where it is not offered or declined.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "backend/act.h"
#include "backend/op_types.h"
#include "backend/tensor.h"

namespace xpert {

// What q and k still need before attention: per-head norms (weights, when given) and RoPE, as
// qk_norm_rope does them (pos: the tokens' positions, in this backend's memory).
struct QkPrep {
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const int32_t* pos = nullptr;
  int64_t n_rot = 0;
  float freq_base = 10000.0f, freq_scale = 1.0f;
  RopeMode mode = RopeMode::normal;
  float eps = 1e-6f;
};

// One decode step of several sequences, one token each, with positions and slots in this backend's
// memory (so the step can be replayed from a graph at any depth): stores each token's k/v rows at
// row pos[i] of slot slots[i] and attends its q over the slot's rows 0..pos[i]. k_cache/v_cache: slot
// 0's rows of this layer in k_type / v_type (see AttentionArgs); slot s at + s * slot_stride bytes.
// False when the backend has no such kernel (the caller then goes segment by segment).
struct DecodeAttention {
  const float *q, *k, *v;
  void *k_cache, *v_cache;
  int64_t slot_stride;  // bytes
  const int32_t *slots, *pos;
  int32_t max_pos;  // the largest of pos (a host copy): decode_attention_form(max_pos) says the form
  float* out;
  int64_t n_seq, n_head, n_head_kv, head_dim, n_ctx;
  float kq_scale;
  int32_t sliding_window;
  DType k_type = DType::F16, v_type = DType::F16;
  // Not null: q and k are not yet normalized and rotated; the backend applies prep first, folding it into
  // its k/v store or its attention where it can; q's contents afterwards are unspecified. A backend
  // returning false has applied nothing.
  const QkPrep* prep = nullptr;
  // Only where fuses_attention_gate() (Qwen3.5's gated attention): out multiplied by sigmoid(gate) as it
  // is written, as mul_sigmoid would after, gate's (sequence, head) rows gate_stride floats apart; and
  // q's rows q_stride apart (0: head_dim), normalized and rotated where they lie.
  const float* gate = nullptr;
  int64_t gate_stride = 0, q_stride = 0;
  // The weight type of the projection that reads out next (F32: none given): a backend may write that
  // product's input form of out in the same launch (OpenCL: out rounded as the CPU rounds activations).
  DType out_type = DType::F32;
};

// Fused forms of a decode step (one token per sequence): CUDA.
class DecodeFusions {
 public:
  // The step's attention (DecodeAttention), returning out for its output projection (an Act, with the
  // form of out the backend wrote beside it); nothing when the backend has no kernel for it (nothing done).
  virtual std::optional<Act> decode_attention(const DecodeAttention&) = 0;
  // decode_attention, then its output projection proj = out . wo (what matmul(wo, out, n_seq, proj) gives,
  // summed in another order; out itself is left unspecified) in one call where the backend fuses the two,
  // leaving proj as parts: the caller hands the PartialSum to the op that reads proj next
  // (add_rmsnorm_moe_ffn_add) or calls sum_parts. Nothing where it does not fuse them, with nothing done.
  virtual std::optional<PartialSum> decode_attention_proj(const DecodeAttention&, const Weight& wo,
                                                          float* proj) = 0;
  // p.out = the sum of p's parts.
  virtual void sum_parts(const PartialSum& p) = 0;
  // Which form of decode_attention this backend records for a step whose deepest token is at max_pos
  // (CUDA: one pass per KV head when the keys are few, split with a combine otherwise). Part of a decode
  // graph's key, since a recording keeps the form it was made with.
  virtual int decode_attention_form(int32_t max_pos) const = 0;
  // DecodeAttention::gate is applied (Qwen3.5's gated attention).
  virtual bool fuses_attention_gate() const = 0;

 protected:
  ~DecodeFusions() = default;
};

// Graphs of whole passes (CUDA graphs): begin_graph(key) either starts recording the ops that follow
// (false) or, when a pass with this key was recorded before, returns true: the caller then issues no op
// until end_graph(), which runs the recording. The key must name everything the recorded ops bake in:
// shapes, slots, caches, scratch addresses.
class PassGraphs {
 public:
  virtual bool begin_graph(const std::string& key) = 0;
  virtual void end_graph() = 0;
  virtual void abort_graph() = 0;  // a pass that failed between begin_graph and end_graph

 protected:
  ~PassGraphs() = default;
};

// A device that runs MoE layers whose experts are partly on the host (ExpertSplit).
class SplitExperts {
 public:
  // Batches of at least min_tokens tokens copy the host experts they use to this device instead of
  // computing them on the host (0: never); smaller batches copy `share` of them and compute the rest on the
  // host at the same time (0: the host computes them all). A negative value keeps the backend's default.
  virtual void set_expert_streaming(int64_t min_tokens, double share) = 0;
  // Model::move_experts changed which experts of split layers are resident (ExpertSplit's masks and
  // pointers): anything derived from them (pointer tables, host masks, recorded graphs) must be rebuilt.
  // Called between passes.
  virtual void on_experts_moved() = 0;

 protected:
  ~SplitExperts() = default;
};

}  // namespace xpert
