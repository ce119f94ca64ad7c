// The llama family of dense decoders, one forward for all; the variants are data:
//   llama: RoPE on adjacent pairs, no biases;  qwen2: NeoX RoPE, q/k/v biases;
//   qwen3: NeoX RoPE, per-head RMS norm of q and k.
// SwiGLU FFN, pre-norm residual blocks, output tied to the embedding when output.weight is absent.
#include <cmath>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/blocks.h"
#include "model/loader.h"
#include "model/kv_cache.h"

namespace xpert {

TensorList llama_dense_tensors(const ModelConfig& c, int64_t il) {
  if (il == kIoTensors) return io_tensors(c);
  using LW = LayerWeights;
  using enum SynthFill;
  const int64_t E = c.n_embd, F = c.n_ff;
  TensorList t = {{"attn_norm.weight", {E}, &LW::attn_norm, ones, hf_vector("input_layernorm.weight")}};
  append(t, attention_tensors(c, {.bias = c.arch == "qwen2", .qk_norm = c.arch == "qwen3"}));
  // clang-format off
  append(t, {
      {"ffn_norm.weight", {E},    &LW::ffn_norm, ones,      hf_vector("post_attention_layernorm.weight")},
      {"ffn_gate.weight", {E, F}, &LW::ffn_gate, matrix,    hf_linear("mlp.gate_proj")},
      {"ffn_up.weight",   {E, F}, &LW::ffn_up,   matrix,    hf_linear("mlp.up_proj")},
      {"ffn_down.weight", {F, E}, &LW::ffn_down, more_bits, hf_linear("mlp.down_proj")},
  });
  // clang-format on
  return t;
}

namespace {

class LlamaDense : public Model {
 public:
  explicit LlamaDense(std::unique_ptr<gguf::GGUFFile> f) : Model(std::move(f)) {
    const gguf::GGUFFile& g = *file_;
    ModelConfig& c = config_;
    c.arch = g.require_string("general.architecture");
    read_common_config(g, c);
    c.rope_neox = c.arch != "llama";
    c.kq_scale = 1.0f / std::sqrt((float)c.head_dim);
    load_tensors(g, c, llama_dense_tensors, w_);
  }

  void forward(const ForwardArgs& args, std::vector<float>& logits, ThreadPool& pool) const override {
    const ModelConfig& c = config_;
    Exec ex(*this, args, pool);
    const int64_t n = ex.n(), E = c.n_embd, F = c.n_ff;
    const AttentionLayerParams p = default_attention_params(c);
    for (int64_t il = 0; il < c.n_layer; ++il) {
      Backend& b = ex.enter(il);
      if (ex.replaying()) break;  // the recorded graph runs the layers
      Activations& a = ex.a();
      const LayerWeights& l = layer(il);
      self_attention(c, l, p, il, ex, b.rmsnorm_act(a.x, l.attn_norm.f32(), a.cur, n, E, c.rms_eps));
      // x += attention; cur = norm(x)
      const Act cur = b.add_rmsnorm(a.out, a.x, l.ffn_norm.f32(), a.cur, n, E, c.rms_eps);
      const Backend::MatmulJob gate_up[] = {{&l.ffn_gate, a.ff_gate}, {&l.ffn_up, a.ff_up}};
      b.matmuls(cur, gate_up);
      b.swiglu(a.ff_gate, a.ff_up, a.ff_gate, n * F);
      b.matmul(l.ffn_down, a.ff_gate, n, a.out);
      b.add(a.out, a.x, a.x, n * E);
    }
    ex.output_logits(logits);
  }
};

}  // namespace

std::unique_ptr<Model> make_llama_dense(std::unique_ptr<gguf::GGUFFile> f) {
  return std::make_unique<LlamaDense>(std::move(f));
}

}  // namespace xpert
