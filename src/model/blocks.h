// Building blocks shared by the architecture files: the pass over a batch (Exec: which backend runs
// each layer, the activations on it, the batch's layout), the self-attention block (projections,
// optional biases and QK-norm, RoPE, KV-cache store, attention, output projection) and the output head.
// Each architecture's forward reads top to bottom by calling these and the Backend ops; nothing here
// knows which device runs it.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace xpert {

class KvCache;

struct AttentionLayerParams {
  float rope_base = 10000.0f, rope_scale = 1.0f;
  RopeMode rope_mode = RopeMode::normal;
  float q_scale = 1.0f;   // applied to q after RoPE (Gemma)
  float kq_scale = 1.0f;  // applied to q.k
  int32_t sliding_window = 0;
};

// The plain case: the model's RoPE (base, scale, mode), q.k scaled by kq_scale, no window.
AttentionLayerParams default_attention_params(const ModelConfig& c);

// The activations of a pass on one backend, in its memory.
struct Activations {
  float *x = nullptr, *cur = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr;
  float *ff_gate = nullptr, *ff_up = nullptr, *out = nullptr;
  int32_t* pos = nullptr;  // per token
  int32_t* seq = nullptr;  // per token: its cache slot
};

// One forward pass. The constructor checks the batch against the caches (throws Error for a batch that
// does not fit or has out-of-range slots) and embeds the tokens; enter(il) makes layer il's backend
// current, moving the residual stream there when the device changes.
class Exec {
 public:
  Exec(const Model& m, const ForwardArgs& args, ThreadPool& pool, float embed_scale = 1.0f);
  ~Exec();  // a pass that failed inside a graph recording ends the recording
  Backend& enter(int64_t il);
  Backend& b() const { return *b_; }
  Activations& a() { return *a_; }
  Arena& arena() const { return b_->scratch(); }  // per-layer temporaries: mark() / release()
  int64_t n() const { return n_; }
  bool decode_only() const { return decode_only_; }  // every segment is one token
  // enter(0) found this pass's graph recorded: the forward goes straight to output_logits, which replays
  // it (the recording holds every layer and the head); the backend takes no op in between.
  bool replaying() const { return replaying_; }
  const ForwardArgs& args() const { return args_; }
  // Layer il's MoE FFN for the backend's ops, counting its routing in the pass's statistics.
  MoeFfn moe(const LayerWeights& l, int64_t il) const { return moe_ffn_args(m_.config(), l, il, args_.routing_stats); }
  const std::vector<BatchSegment>& segments() const { return segments_; }
  int32_t max_pos() const { return max_pos_; }  // the batch's deepest token position
  const std::vector<int64_t>& out_rows() const { return out_rows_; }
  // Layer il + 1 exists and runs where layer il does: its input norm may then end layer il (cur stays on
  // that device).
  bool next_layer_here(int64_t il) const;
  // Final norm and output projection of the rows that need logits, copied to the host.
  void output_logits(std::vector<float>& logits);

 private:
  struct OnDevice {
    Backend* b = nullptr;
    Activations a;
  };
  OnDevice* find(const Backend& b);
  OnDevice& on(Backend& b, const float* x_from_host = nullptr);

  const Model& m_;
  const ForwardArgs& args_;
  int64_t n_ = 0;
  std::vector<BatchSegment> segments_;
  std::vector<int64_t> out_rows_;
  std::vector<int32_t> pos_;
  int32_t max_pos_ = 0;
  std::vector<OnDevice> devs_;  // at most two: the CPU and the offload device
  Backend* b_ = nullptr;
  Activations* a_ = nullptr;
  ThreadPool* cpu_pool_ = nullptr;
  bool decode_only_ = true;
  bool graph_open_ = false;  // begin_graph was called on b_; output_logits ends it
  bool replaying_ = false;
  std::vector<char> upload_;  // on(): the host side of the batch's one upload
};

// cur (a.cur [n][n_embd], already normalized, as the norm returned it) -> a.out [n][n_embd]. Stores this
// batch's K/V in the cache. With parts, a decode step's output projection may stay in the attention's
// launch (DecodeFusions::decode_attention_proj): *parts is then set (its out = a.out), and the caller hands
// it to the op that reads a.out next (add_rmsnorm_moe_ffn_add); otherwise (and without parts) a.out is
// whole on return.
void self_attention(const ModelConfig& c, const LayerWeights& lw, const AttentionLayerParams& p, int64_t il,
                    Exec& ex, const Act& cur, std::optional<PartialSum>* parts = nullptr);

// For each segment: store k/v rows at its positions in layer il's cache and attend q over it; a.att out.
// With prep, q and k (a.q, a.k) get their norms and RoPE first (a GPU folds them into its decode step).
// Qwen3.5's gated attention: q and the output gate come interleaved per head from one projection, qg
// [n][n_head][2 head_dim] (q first); gate has room for the gate alone, [n][n_head][head_dim].
struct AttentionGate {
  float* qg;
  float* gate;
};
// With gate, a.att is also multiplied by sigmoid(gate): a GPU that fuses it (fuses_attention_gate) reads
// q and the gate from qg where they lie; otherwise they are deinterleaved first (q into a.q).
// Returns a.att as the output projection's input (an Act). wo: that projection (its type lets a decode
// step's attention write its input form too, DecodeAttention::out_type). With wo and parts (no gate), a
// decode step's attention may also apply wo into a.out (DecodeFusions::decode_attention_proj): *parts is
// then set, the caller's matmul is done and the returned Act is empty.
Act attend_segments(const ModelConfig& c, const AttentionLayerParams& p, int64_t il, Exec& ex,
                    const QkPrep* prep = nullptr, const AttentionGate* gate = nullptr, const Weight* wo = nullptr,
                    std::optional<PartialSum>* parts = nullptr);

}  // namespace xpert
