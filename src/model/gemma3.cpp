// Gemma 3 (dense): sliding-window and global attention layers (every `sliding_window_pattern`-th layer
// is global), QK-norm, norms after attention and after the FFN, GELU-gated FFN, embeddings scaled by
// sqrt(n_embd), q scaled by 1/sqrt(head_dim) (27B: 1/sqrt(n_embd/n_head)). Norm weights in GGUF already
// include Gemma's +1.
#include <cmath>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/blocks.h"
#include "model/loader.h"
#include "model/kv_cache.h"

namespace xpert {

// (The converter takes no Gemma checkpoints: no HF names beyond the shared attention's.)
TensorList gemma3_tensors(const ModelConfig& c, int64_t il) {
  if (il == kIoTensors) return io_tensors(c);
  using LW = LayerWeights;
  using enum SynthFill;
  const int64_t E = c.n_embd, F = c.n_ff;
  TensorList t = {{"attn_norm.weight", {E}, &LW::attn_norm, ones}};
  append(t, attention_tensors(c, {.qk_norm = true}));
  // clang-format off
  append(t, {
      {"post_attention_norm.weight", {E},    &LW::attn_post_norm, ones},
      {"ffn_norm.weight",            {E},    &LW::ffn_norm,       ones},
      {"ffn_gate.weight",            {E, F}, &LW::ffn_gate,       matrix},
      {"ffn_up.weight",              {E, F}, &LW::ffn_up,         matrix},
      {"ffn_down.weight",            {F, E}, &LW::ffn_down,       more_bits},
      {"post_ffw_norm.weight",       {E},    &LW::ffn_post_norm,  ones},
  });
  // clang-format on
  return t;
}

namespace {

class Gemma3 : public Model {
 public:
  explicit Gemma3(std::unique_ptr<gguf::GGUFFile> f) : Model(std::move(f)) {
    const gguf::GGUFFile& g = *file_;
    ModelConfig& c = config_;
    c.arch = "gemma3";
    read_common_config(g, c);
    ArchKeys k(g, c.arch);
    c.rope_neox = true;
    c.act = ActivationFn::gelu_tanh;
    c.embed_scale = std::sqrt((float)c.n_embd);
    c.q_scale = c.n_layer == 62 ? 1.0f / std::sqrt((float)(c.n_embd / c.n_head)) : 1.0f / std::sqrt((float)c.head_dim);
    c.sliding_window = (int32_t)k.get_int("attention.sliding_window", 0);
    c.rope_base_swa = (float)k.get_float("rope.freq_base_swa", 10000.0);
    c.layer_swa.assign(c.n_layer, false);
    if (c.sliding_window > 0) {
      const gguf::Value* pat = k.find("attention.sliding_window_pattern");
      if (pat && pat->type == gguf::ValueType::ARRAY) {
        if ((int64_t)pat->count != c.n_layer) fail("{}: sliding_window_pattern has {} entries for {} layers", g.path(), pat->count, c.n_layer);
        for (int64_t i = 0; i < c.n_layer; ++i) c.layer_swa[i] = pat->int_at(i) != 0;
      } else {
        const int64_t every = pat ? pat->as_int() : 6;
        for (int64_t i = 0; i < c.n_layer; ++i) c.layer_swa[i] = every == 0 || (i % every) < every - 1;
      }
    }

    load_tensors(g, c, gemma3_tensors, w_);
  }

  void forward(const ForwardArgs& args, std::vector<float>& logits, ThreadPool& pool) const override {
    const ModelConfig& c = config_;
    Exec ex(*this, args, pool, c.embed_scale);
    const int64_t n = ex.n(), E = c.n_embd, F = c.n_ff;
    for (int64_t il = 0; il < c.n_layer; ++il) {
      Backend& b = ex.enter(il);
      if (ex.replaying()) break;  // the recorded graph runs the layers
      Activations& a = ex.a();
      const LayerWeights& l = layer(il);
      const bool swa = c.layer_swa[il];
      AttentionLayerParams p{.rope_base = swa ? c.rope_base_swa : c.rope_base,
                             .rope_scale = swa ? 1.0f : c.rope_scale,
                             .rope_mode = RopeMode::neox,
                             .q_scale = c.q_scale,
                             .kq_scale = 1.0f,
                             .sliding_window = swa ? c.sliding_window : 0};
      self_attention(c, l, p, il, ex, b.rmsnorm_act(a.x, l.attn_norm.f32(), a.cur, n, E, c.rms_eps));
      b.rmsnorm(a.out, l.attn_post_norm.f32(), a.out, n, E, c.rms_eps);
      b.add(a.out, a.x, a.x, n * E);  // x = sa_out

      const Act cur = b.rmsnorm_act(a.x, l.ffn_norm.f32(), a.cur, n, E, c.rms_eps);
      b.matmul(l.ffn_gate, cur, a.ff_gate);
      b.matmul(l.ffn_up, cur, a.ff_up);
      b.geglu(a.ff_gate, a.ff_up, a.ff_gate, n * F);
      b.matmul(l.ffn_down, a.ff_gate, n, a.out);
      b.rmsnorm(a.out, l.ffn_post_norm.f32(), a.out, n, E, c.rms_eps);
      b.add(a.out, a.x, a.x, n * E);
    }
    ex.output_logits(logits);
  }
};

}  // namespace

std::unique_ptr<Model> make_gemma3(std::unique_ptr<gguf::GGUFFile> f) { return std::make_unique<Gemma3>(std::move(f)); }

}  // namespace xpert
