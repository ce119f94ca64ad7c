// A loaded model: hyper-parameters (data, not code), weights read in place from the file, and one
// forward pass per architecture family. The runtime owns sequences and caches; a Model is immutable
// after load and can serve any number of them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/experts.h"
#include "backend/tensor.h"
#include "format/gguf.h"
#include "quant/dtype.h"

namespace xpert {

class ThreadPool;
class KvCache;
class RecurrentState;
class Backend;
class DeviceBuffer;

enum class ActivationFn { silu, gelu_tanh };

struct ModelConfig {
  std::string arch;  // general.architecture
  std::string name;
  int64_t n_layer = 0, n_embd = 0, n_ff = 0, n_vocab = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-6f;
  float rope_base = 10000.0f, rope_scale = 1.0f;
  bool rope_neox = false;
  ActivationFn act = ActivationFn::silu;
  // Gemma-style extras.
  float embed_scale = 1.0f;   // multiplies the token embedding
  float q_scale = 1.0f;       // multiplies q before the q.k product
  float kq_scale = 1.0f;      // multiplies the q.k product
  int32_t sliding_window = 0; // for layers marked in `layer_swa`
  float rope_base_swa = 10000.0f;
  std::vector<bool> layer_swa;
  // Mixture of experts (qwen3moe): softmax router, top n_expert_used, SwiGLU experts of n_ff_exp.
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  bool expert_weights_norm = true;    // renormalize the chosen experts' weights to sum 1
  float expert_weights_scale = 1.0f;  // then multiply them by this
  int64_t n_ff_shexp = 0;             // shared expert (qwen35moe), sigmoid-gated; 0: none
  // Not from the file: nonzero replaces the router's choice by a uniformly random top-k drawn with this
  // seed (RouterParams::uniform_seed), a speed-measurement mode (Model::set_uniform_routing).
  uint32_t uniform_routing_seed = 0;
  // Hybrid recurrent models (qwen35, qwen35moe): layers marked in `layer_recurrent` are Gated DeltaNet
  // layers with a per-sequence state instead of a KV cache (see backend/gated_delta_net.h).
  std::vector<bool> layer_recurrent;
  int64_t ssm_d_conv = 0, ssm_d_inner = 0, ssm_d_state = 0, ssm_n_group = 0, ssm_dt_rank = 0;
  bool recurrent(int64_t il) const { return il < (int64_t)layer_recurrent.size() && layer_recurrent[il]; }
  bool has_recurrent_layers() const {
    for (bool r : layer_recurrent)
      if (r) return true;
    return false;
  }
};

struct LayerWeights;

// One swap inside a split layer (Model::move_experts): expert `admit` comes to the GPU into the memory of
// expert `evict`, which from then on runs from the host's copy. The layer's resident count is unchanged.
struct ExpertMove {
  int64_t layer = 0;
  int32_t evict = 0, admit = 0;
};

struct LayerWeights {
  Weight attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, attn_post_norm;
  Weight ffn_norm, ffn_gate, ffn_up, ffn_down, ffn_post_norm;
  // MoE: router [n_embd, n_expert]; experts as one 3-D tensor each, expert e = matrix e (a slice):
  // gate/up [n_embd, n_ff_exp, n_expert], down [n_ff_exp, n_embd, n_expert].
  Weight ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
  // Shared expert (qwen35moe): gate [n_embd] (one sigmoid gate per token), SwiGLU of n_ff_shexp.
  Weight ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
  // Gated DeltaNet (recurrent layers): qkv [n_embd, conv_dim], gate (z) [n_embd, value_dim],
  // conv1d [d_conv, conv_dim], dt bias / a [n_v_heads], beta / alpha [n_embd, n_v_heads],
  // norm [head_v_dim], out [value_dim, n_embd].
  Weight ssm_qkv, ssm_gate, ssm_conv1d, ssm_dt, ssm_a, ssm_beta, ssm_alpha, ssm_norm, ssm_out;
  // Offloaded MoE layers whose experts are not all on the GPU (ffn_*_exps then hold no device data).
  const ExpertSplit* split = nullptr;
  // MoE layers with host experts (host layers, split GPU layers) whose host experts an expert device computes
  // (--expert-device opencl:N[,cpu]) for expert_share of their rows; null: the CPU alone.
  ExpertExecutor* expert_exec = nullptr;
  ExecutorShare expert_share;
};

struct ModelWeights {
  Weight tok_embd, output_norm, output;
  std::vector<LayerWeights> layers;
};

// A run of consecutive tokens of one sequence inside a batch.
struct BatchSegment {
  int32_t seq = 0;          // cache slot
  int32_t pos0 = 0;         // position of its first token
  int32_t n_tokens = 0;
  bool all_logits = false;  // false: logits of its last token only
};

// One batch. Either one sequence (tokens at pos0.. of slot `seq`), or, when `segments` is not empty,
// several sequences back to back in `tokens` (continuous batching); then pos0/seq/all_logits are unused.
// Logits come out in batch order: for each segment, its last token's row or all its rows.
struct ForwardArgs {
  std::span<const int32_t> tokens;
  int32_t pos0 = 0;
  KvCache* cache = nullptr;
  int32_t seq = 0;             // cache slot
  bool all_logits = false;     // false: logits of the last token only
  std::span<const BatchSegment> segments = {};
  RecurrentState* state = nullptr;  // per-slot recurrent state; required by models with recurrent layers
  RoutingSink* routing_stats = nullptr;  // MoE models: count each layer's expert choices here
  // Embeddings: when set, the output rows' hidden states after the final norm ([n_out][n_embd]) go here
  // instead of logits (the output head is skipped; `logits` comes back empty).
  std::vector<float>* hidden = nullptr;
};

// Layer il's routed-experts FFN as the backend's MoE ops take it (lw: the layer's weights on its device).
MoeFfn moe_ffn_args(const ModelConfig& c, const LayerWeights& lw, int64_t il, RoutingSink* stats);

// Calls fn(name, weight) for every tensor of a layer that is present.
void for_each_weight(LayerWeights& l, const std::function<void(const char*, Weight&)>& fn);

class Model {
 public:
  virtual ~Model();
  const ModelConfig& config() const { return config_; }
  const gguf::GGUFFile& file() const { return *file_; }
  // logits: [n_out][n_vocab], n_out = tokens.size() if all_logits else 1.
  virtual void forward(const ForwardArgs& args, std::vector<float>& logits, ThreadPool& pool) const = 0;

  // Loads any supported architecture; throws Error naming what is wrong or unsupported.
  struct LoadOptions {
    bool native_gptq_experts = false;  // a GPTQ folder's experts as stored (hf::OpenOptions)
  };
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options);
  static std::unique_ptr<Model> load(const std::string& path) { return load(path, LoadOptions{}); }

  // Moves the last n_layers layers (llama.cpp's -ngl; more than n_layer means all) to `dev`: their
  // weights are copied into its memory once, and their forward runs there. The output norm and head go
  // along (the last layer is always among them). Call before creating caches (they follow layer_devices()).
  // Returns the bytes uploaded (not those the device reads in place: Backend::reads_host_weights).
  // gpu_experts (optional, per layer): which experts of an offloaded MoE layer go to the GPU; the rest
  // stay in the host's mmap and run on the CPU (an empty entry: all experts on the GPU).
  size_t offload(std::shared_ptr<Backend> dev, int64_t n_layers,
                 const std::vector<std::vector<bool>>* gpu_experts = nullptr);
  int64_t n_offloaded() const { return n_offloaded_; }
  Backend* offload_device() const { return dev_.get(); }
  // Per layer: the backend it runs on, null for the CPU.
  std::vector<Backend*> layer_devices() const;
  Backend* layer_device(int64_t il) const { return il >= config_.n_layer - n_offloaded_ ? dev_.get() : nullptr; }
  // The weights of layer il as seen by its device (device copies for offloaded layers).
  const LayerWeights& layer(int64_t il) const { return layer_device(il) ? dev_layers_[il] : w_.layers[il]; }
  // Output norm and head on the device of the last layer (offloading always includes the last layer).
  const ModelWeights& io_weights() const { return n_offloaded_ ? dev_io_ : w_; }
  const ModelWeights& host_weights() const { return w_; }
  // The host experts of every MoE layer (all experts of a host layer, the host share of a split GPU layer)
  // go to `exec` for `share` of their rows, the rest to the CPU (which routes and combines). After offload.
  void attach_expert_executor(std::shared_ptr<ExpertExecutor> exec, const ExecutorShare& share = {});

  // Offloaded MoE layer il's split (which experts are resident on the GPU), null when it is not split.
  const ExpertSplit* expert_split(int64_t il) const {
    return il >= 0 && il < (int64_t)splits_.size() ? splits_[il].get() : nullptr;
  }
  bool splits_experts() const;  // some offloaded layer keeps experts on the host
  // Rebalancing while serving: applies the moves in order, each copying the admitted expert's matrices
  // from the host's view (the mmap) into the evicted expert's device memory (a layer's experts are all
  // the same size, so buffers are reused and GPU memory does not change), then tells the device
  // (Backend::on_experts_moved) so it drops what it derived from the old placement. Must run between
  // forward passes: nothing may be reading the layer (the engine calls it from its own thread between
  // steps). Throws Error, changing nothing, for a move that is not a swap of a resident and a host expert
  // of a split layer. Returns the bytes copied.
  size_t move_experts(std::span<const ExpertMove> moves);
  // `xpert bench --routing uniform`: every MoE layer routes each token to k experts drawn uniformly at
  // random (RouterParams::uniform_seed; 0: the router's choice again). Random-weight files route far more
  // skewed than trained models; this measures speed without that flattery. Outputs are meaningless. Call
  // before the first forward (recorded CUDA graphs bake the routing mode in).
  void set_uniform_routing(uint32_t seed) { config_.uniform_routing_seed = seed; }

 protected:
  explicit Model(std::unique_ptr<gguf::GGUFFile> file);
  std::unique_ptr<gguf::GGUFFile> file_;
  ModelConfig config_;
  ModelWeights w_;

 private:
  std::shared_ptr<Backend> dev_;
  int64_t n_offloaded_ = 0;
  std::vector<LayerWeights> dev_layers_;  // offloaded layers' weights, pointing into dev_mem_
  std::vector<std::unique_ptr<ExpertSplit>> splits_;  // per layer, for split MoE layers
  ModelWeights dev_io_;                   // output_norm / output on dev_ (layers unused)
  std::vector<DeviceBuffer> dev_mem_;
  std::shared_ptr<ExpertExecutor> expert_exec_;
};

std::vector<std::string> supported_architectures();

}  // namespace xpert
