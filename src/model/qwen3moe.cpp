// qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (NeoX RoPE, per-head RMS norm of q and k)
// with a routed-experts FFN in every layer (softmax router, top-k renormalized, SwiGLU experts), no
// shared expert. Tensor names, shapes and keys are llama.cpp's, so hub GGUFs load unchanged.
#include <cmath>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/blocks.h"
#include "model/loader.h"

namespace xpert {

TensorList qwen3moe_tensors(const ModelConfig& c, int64_t il) {
  if (il == kIoTensors) return io_tensors(c);
  using LW = LayerWeights;
  using enum SynthFill;
  const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
  TensorList t = {{"attn_norm.weight", {E}, &LW::attn_norm, ones, hf_vector("input_layernorm.weight")}};
  append(t, attention_tensors(c, {.qk_norm = true}));
  // clang-format off
  append(t, {
      {"ffn_norm.weight",      {E},       &LW::ffn_norm,      ones,      hf_vector("post_attention_layernorm.weight")},
      {"ffn_gate_inp.weight",  {E, X},    &LW::ffn_gate_inp,  normal,    hf_linear("mlp.gate")},  // router: F32
      {"ffn_gate_exps.weight", {E, F, X}, &LW::ffn_gate_exps, matrix,    hf_experts("gate_proj")},
      {"ffn_up_exps.weight",   {E, F, X}, &LW::ffn_up_exps,   matrix,    hf_experts("up_proj")},
      {"ffn_down_exps.weight", {F, E, X}, &LW::ffn_down_exps, more_bits, hf_experts("down_proj")},
  });
  // clang-format on
  return t;
}

namespace {

class Qwen3Moe : public Model {
 public:
  explicit Qwen3Moe(std::unique_ptr<gguf::GGUFFile> f) : Model(std::move(f)) {
    const gguf::GGUFFile& g = *file_;
    ModelConfig& c = config_;
    c.arch = "qwen3moe";
    read_common_config(g, c);
    c.rope_neox = true;
    c.kq_scale = 1.0f / std::sqrt((float)c.head_dim);
    ArchKeys k(g, c.arch);
    c.n_expert = k.require_int("expert_count");
    c.n_expert_used = k.require_int("expert_used_count");
    // As llama.cpp: without the key, the dense FFN length is split over the used experts.
    c.n_ff_exp = k.get_int("expert_feed_forward_length", c.n_expert_used > 0 ? c.n_ff / c.n_expert_used : 0);
    c.expert_weights_norm = true;  // llama.cpp always renormalizes for this architecture
    c.expert_weights_scale = (float)k.get_float("expert_weights_scale", 1.0);
    if (c.n_expert <= 0 || c.n_expert > 4096) fail("{}: expert_count = {} is not valid", g.path(), c.n_expert);
    if (c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)
      fail("{}: expert_used_count = {} is not valid (expected 1..{})", g.path(), c.n_expert_used, c.n_expert);
    if (c.n_ff_exp <= 0 || c.n_ff_exp > (1 << 20))
      fail("{}: expert_feed_forward_length = {} is not valid", g.path(), c.n_ff_exp);

    load_tensors(g, c, qwen3moe_tensors, w_);
  }

  void forward(const ForwardArgs& args, std::vector<float>& logits, ThreadPool& pool) const override {
    const ModelConfig& c = config_;
    Exec ex(*this, args, pool);
    const int64_t n = ex.n(), E = c.n_embd;
    const AttentionLayerParams p = default_attention_params(c);
    Act cur;  // this layer's cur = norm(x) when the previous layer left it
    for (int64_t il = 0; il < c.n_layer; ++il) {
      Backend& b = ex.enter(il);
      if (ex.replaying()) break;  // the recorded graph runs the layers
      Activations& a = ex.a();
      const LayerWeights& l = layer(il);
      if (!cur.x) cur = b.rmsnorm_act(a.x, l.attn_norm.f32(), a.cur, n, E, c.rms_eps);
      std::optional<PartialSum> parts;  // a.out still as the attention's parts
      self_attention(c, l, p, il, ex, cur, &parts);
      // x += attention; cur = norm(x); x += experts(cur), maybe fused; then the next layer's cur = norm(x)
      const float* next_w = ex.next_layer_here(il) ? layer(il + 1).attn_norm.f32() : nullptr;
      cur = b.add_rmsnorm_moe_ffn_add(ex.moe(l, il), a.out, a.x, l.ffn_norm.f32(), a.cur, n, next_w,
                                      parts ? &*parts : nullptr);
    }
    ex.output_logits(logits);
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<gguf::GGUFFile> f) { return std::make_unique<Qwen3Moe>(std::move(f)); }

}  // namespace xpert
