// Gemma 3 (dense): sliding-window and global attention layers (every `sliding_window_pattern`-th layer
// is global), QK-norm, norms after attention and after the FFN, GELU-gated FFN, embeddings scaled by
// sqrt(n_embd), q scaled by 1/sqrt(head_dim) (27B: 1/sqrt(n_embd/n_head)). Norm weights in GGUF already
// include Gemma's +1.
#include <cmath>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/blocks.h"
#include "model/loader.h"
#include "runtime/kv_cache.h"

namespace xpert {
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

    TensorTable t(g);
    const int64_t E = c.n_embd, F = c.n_ff;
    require_io_weights(t, c, w_);
    w_.layers.resize(c.n_layer);
    for (int64_t i = 0; i < c.n_layer; ++i) {
      LayerWeights& l = w_.layers[i];
      auto L = [&](const char* s) { return TensorTable::layer(i, s); };
      require_attention(t, c, i, {.qk_norm = true}, l);
      l.attn_post_norm = t.require(L("post_attention_norm.weight"), {E});
      l.ffn_norm = t.require(L("ffn_norm.weight"), {E});
      l.ffn_gate = t.require(L("ffn_gate.weight"), {E, F});
      l.ffn_up = t.require(L("ffn_up.weight"), {E, F});
      l.ffn_down = t.require(L("ffn_down.weight"), {F, E});
      l.ffn_post_norm = t.require(L("post_ffw_norm.weight"), {E});
    }
  }

  void forward(const ForwardArgs& args, std::vector<float>& logits, ThreadPool& pool) const override {
    const ModelConfig& c = config_;
    const int64_t n = (int64_t)args.tokens.size(), E = c.n_embd, F = c.n_ff;
    thread_local Scratch s;
    begin_forward(c, args, s);
    embed(w_.tok_embd, args.tokens, c.embed_scale, s.x.data());

    for (int64_t il = 0; il < c.n_layer; ++il) {
      const LayerWeights& l = w_.layers[il];
      const bool swa = c.layer_swa[il];
      AttentionLayerParams p{.rope_base = swa ? c.rope_base_swa : c.rope_base,
                             .rope_scale = swa ? 1.0f : c.rope_scale,
                             .rope_mode = cpu::RopeMode::neox,
                             .q_scale = c.q_scale,
                             .kq_scale = 1.0f,
                             .sliding_window = swa ? c.sliding_window : 0};
      cpu::rmsnorm(s.x.data(), l.attn_norm.f32(), s.cur.data(), n, E, c.rms_eps);
      self_attention(c, l, p, il, args, s, pool);
      cpu::rmsnorm(s.out.data(), l.attn_post_norm.f32(), s.out.data(), n, E, c.rms_eps);
      cpu::add(s.out.data(), s.x.data(), s.x.data(), n * E);  // x = sa_out

      cpu::rmsnorm(s.x.data(), l.ffn_norm.f32(), s.cur.data(), n, E, c.rms_eps);
      linear(l.ffn_gate, s.cur.data(), n, s.ff_gate.data(), pool);
      linear(l.ffn_up, s.cur.data(), n, s.ff_up.data(), pool);
      cpu::geglu(s.ff_gate.data(), s.ff_up.data(), s.ff_gate.data(), n * F, &pool);
      linear(l.ffn_down, s.ff_gate.data(), n, s.out.data(), pool);
      cpu::rmsnorm(s.out.data(), l.ffn_post_norm.f32(), s.out.data(), n, E, c.rms_eps);
      cpu::add(s.out.data(), s.x.data(), s.x.data(), n * E);
    }
    output_logits(c, w_, args, s, logits, pool);
  }
};

}  // namespace

std::unique_ptr<Model> make_gemma3(std::unique_ptr<gguf::GGUFFile> f) { return std::make_unique<Gemma3>(std::move(f)); }

}  // namespace xpert
