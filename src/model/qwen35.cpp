// qwen35 (Qwen3.5 / 3.6 dense) and qwen35moe (Qwen3.5-35B-A3B and larger): hybrid stacks where most
// layers are Gated DeltaNet (linear attention with a per-sequence recurrent state, gated_delta_net.h)
// and every full_attention_interval-th layer is full attention with QK-norm, partial NeoX RoPE and a
// sigmoid output gate. Each layer: x += mixer(rmsnorm(x)); x += ffn(rmsnorm(x)); the FFN is SwiGLU
// (qwen35) or routed experts plus a sigmoid-gated shared expert (qwen35moe). The two variants differ
// only in the FFN, which is data here. Tensor names, shapes and keys are llama.cpp's.
#include <algorithm>
#include <cmath>

#include "backend/gated_delta_net.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "model/blocks.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/recurrent_state.h"

namespace xpert {

// HF stores the norm weights zero-centered (w -> 1 + w: HfFn::plus_one), all but the recurrent layers'
// gated norm.
TensorList qwen35_tensors(const ModelConfig& c, int64_t il) {
  using enum HfFn;
  if (il == kIoTensors) return io_tensors(c, plus_one);
  using LW = LayerWeights;
  using enum SynthFill;
  using H = HfHeads;
  using enum Need;
  const int64_t E = c.n_embd;
  TensorList t = {
      {"attn_norm.weight", {E}, &LW::attn_norm, ones, hf_vector("input_layernorm.weight", plus_one)}};
  if (c.recurrent(il)) {
    // Gated DeltaNet: q|k|v projection, z gate, conv kernel (F32: llama.cpp keeps it so and xpert requires
    // it), per-value-head step and decay, beta and alpha projections, gated norm, output.
    const GdnShape s = gdn_shape(c);
    const int64_t Hv = s.n_v_heads, CD = s.conv_dim(), VD = s.value_dim();
    // clang-format off
    append(t, {
        {"attn_qkv.weight",   {E, CD},         &LW::ssm_qkv,    more_bits, hf_linear("linear_attn.in_proj_qkv", H::qkv_rows)},
        {"attn_gate.weight",  {E, VD},         &LW::ssm_gate,   matrix,    hf_linear("linear_attn.in_proj_z", H::v_rows)},
        {"ssm_conv1d.weight", {s.d_conv, CD},  &LW::ssm_conv1d, normal,    hf_conv1d("linear_attn.conv1d.weight", H::qkv_rows)},
        {"ssm_dt.bias",       {Hv},            &LW::ssm_dt,     normal,    hf_vector("linear_attn.dt_bias", none, H::rows)},
        {"ssm_a",             {Hv},            &LW::ssm_a,      decay,     hf_vector("linear_attn.A_log", minus_exp, H::rows)},
        {"ssm_beta.weight",   {E, Hv},         &LW::ssm_beta,   matrix,    hf_linear("linear_attn.in_proj_b", H::rows)},
        {"ssm_alpha.weight",  {E, Hv},         &LW::ssm_alpha,  matrix,    hf_linear("linear_attn.in_proj_a", H::rows)},
        {"ssm_norm.weight",   {s.head_v_dim},  &LW::ssm_norm,   ones,      hf_vector("linear_attn.norm.weight")},
        {"ssm_out.weight",    {VD, E},         &LW::ssm_out,    matrix,    hf_linear("linear_attn.out_proj", H::v_cols)},
    });
    // clang-format on
  } else {
    append(t, attention_tensors(c, {.qk_norm = true, .gated = true, .norm_fn = plus_one}));
  }
  const int64_t F = c.n_ff, Fx = c.n_ff_exp, X = c.n_expert, Fs = c.n_ff_shexp;
  // clang-format off
  append(t, {{"post_attention_norm.weight", {E}, &LW::attn_post_norm, ones, hf_vector("post_attention_layernorm.weight", plus_one)}});
  if (X > 0) {
    append(t, {
        {"ffn_gate_inp.weight",  {E, X},     &LW::ffn_gate_inp,  normal,    hf_linear("mlp.gate")},  // router: F32
        {"ffn_gate_exps.weight", {E, Fx, X}, &LW::ffn_gate_exps, matrix,    hf_experts("gate_proj")},
        {"ffn_up_exps.weight",   {E, Fx, X}, &LW::ffn_up_exps,   matrix,    hf_experts("up_proj")},
        {"ffn_down_exps.weight", {Fx, E, X}, &LW::ffn_down_exps, more_bits, hf_experts("down_proj")},
    });
    if (Fs > 0)  // the shared expert and its sigmoid gate, optional (a file has all four or none)
      append(t, {
          {"ffn_gate_inp_shexp.weight", {E},     &LW::ffn_gate_inp_shexp, normal,    hf_vector("mlp.shared_expert_gate.weight"),  optional},
          {"ffn_gate_shexp.weight",     {E, Fs}, &LW::ffn_gate_shexp,     matrix,    hf_linear("mlp.shared_expert.gate_proj"), optional},
          {"ffn_up_shexp.weight",       {E, Fs}, &LW::ffn_up_shexp,       matrix,    hf_linear("mlp.shared_expert.up_proj"),   optional},
          {"ffn_down_shexp.weight",     {Fs, E}, &LW::ffn_down_shexp,     more_bits, hf_linear("mlp.shared_expert.down_proj"), optional},
      });
  } else {
    append(t, {
        {"ffn_gate.weight", {E, F}, &LW::ffn_gate, matrix,    hf_linear("mlp.gate_proj")},
        {"ffn_up.weight",   {E, F}, &LW::ffn_up,   matrix,    hf_linear("mlp.up_proj")},
        {"ffn_down.weight", {F, E}, &LW::ffn_down, more_bits, hf_linear("mlp.down_proj")},
    });
  }
  // clang-format on
  return t;
}

namespace {

class Qwen35 : public Model {
 public:
  explicit Qwen35(std::unique_ptr<gguf::GGUFFile> f) : Model(std::move(f)) {
    const gguf::GGUFFile& g = *file_;
    ModelConfig& c = config_;
    c.arch = g.require_string("general.architecture");
    moe_ = c.arch == "qwen35moe";
    read_common_config(g, c, /*require_ff=*/!moe_);
    c.rope_neox = true;
    c.kq_scale = 1.0f / std::sqrt((float)c.head_dim);
    ArchKeys k(g, c.arch);
    auto bad = [&](const char* what, int64_t v) {
      fail("{}: {}.{} = {} is not valid", g.path(), c.arch, what, v);
    };

    // Gated DeltaNet sizes.
    c.ssm_d_conv = k.require_int("ssm.conv_kernel");
    c.ssm_d_inner = k.require_int("ssm.inner_size");
    c.ssm_d_state = k.require_int("ssm.state_size");
    c.ssm_dt_rank = k.require_int("ssm.time_step_rank");
    c.ssm_n_group = k.require_int("ssm.group_count");
    if (c.ssm_d_conv < 1 || c.ssm_d_conv > 64) bad("ssm.conv_kernel", c.ssm_d_conv);
    if (c.ssm_d_state <= 0 || c.ssm_d_state > 4096) bad("ssm.state_size", c.ssm_d_state);
    if (c.ssm_dt_rank <= 0 || c.ssm_dt_rank > 4096) bad("ssm.time_step_rank", c.ssm_dt_rank);
    if (c.ssm_n_group <= 0 || c.ssm_dt_rank % c.ssm_n_group) bad("ssm.group_count", c.ssm_n_group);
    if (c.ssm_d_inner <= 0 || c.ssm_d_inner % c.ssm_dt_rank) bad("ssm.inner_size", c.ssm_d_inner);
    if (c.ssm_d_inner / c.ssm_dt_rank != c.ssm_d_state)
      fail(
          "{}: value head size {} != key head size {} (ssm.inner_size / ssm.time_step_rank vs "
          "ssm.state_size) "
          "is not supported",
          g.path(), c.ssm_d_inner / c.ssm_dt_rank, c.ssm_d_state);

    // Which layers are recurrent: an explicit per-layer array, else every interval-th layer is attention.
    c.layer_recurrent.assign(c.n_layer, false);
    if (const gguf::Value* rl = k.find("attention.recurrent_layers")) {
      if (rl->type != gguf::ValueType::ARRAY || (int64_t)rl->count < c.n_layer)
        fail("{}: {}.attention.recurrent_layers must be an array of at least {} entries", g.path(), c.arch,
             c.n_layer);
      for (int64_t i = 0; i < c.n_layer; ++i) c.layer_recurrent[i] = rl->int_at(i) != 0;
    } else {
      const int64_t interval = k.get_int("full_attention_interval", 4);
      if (interval <= 0) bad("full_attention_interval", interval);
      for (int64_t i = 0; i < c.n_layer; ++i) c.layer_recurrent[i] = (i + 1) % interval != 0;
    }
    check_rope_sections(k);

    if (moe_) {
      c.n_expert = k.require_int("expert_count");
      c.n_expert_used = k.require_int("expert_used_count");
      if (c.n_expert <= 0 || c.n_expert > 4096) bad("expert_count", c.n_expert);
      if (c.n_expert_used <= 0 || c.n_expert_used > c.n_expert) bad("expert_used_count", c.n_expert_used);
      c.n_ff_exp = k.get_int("expert_feed_forward_length", c.n_ff / c.n_expert_used);
      c.n_ff_shexp = k.get_int("expert_shared_feed_forward_length", c.n_ff);
      if (c.n_ff_exp <= 0 || c.n_ff_exp > (1 << 20)) bad("expert_feed_forward_length", c.n_ff_exp);
      if (c.n_ff_shexp < 0 || c.n_ff_shexp > (1 << 22))
        bad("expert_shared_feed_forward_length", c.n_ff_shexp);
      c.expert_weights_norm = true;  // llama.cpp renormalizes the top-k weights for this architecture
      c.expert_weights_scale = (float)k.get_float("expert_weights_scale", 1.0);
      if (c.expert_weights_scale == 0.0f) c.expert_weights_scale = 1.0f;  // llama.cpp: 0 means unscaled
    }
    load_tensors(g, c, qwen35_tensors, w_);
    check_tensors();
  }

  void forward(const ForwardArgs& args, std::vector<float>& logits, ThreadPool& pool) const override {
    const ModelConfig& c = config_;
    if (!args.cache) fail("{}: forward needs a KV cache", c.arch);
    Exec ex(*this, args, pool);
    const int64_t n = ex.n(), E = c.n_embd;
    begin_recurrent(ex);
    Act cur;  // this layer's cur = norm(x) when the previous layer left it
    for (int64_t il = 0; il < c.n_layer; ++il) {
      Backend& b = ex.enter(il);
      if (ex.replaying()) break;  // the recorded graph runs the layers
      Activations& a = ex.a();
      const LayerWeights& l = layer(il);
      if (!cur.x) cur = b.rmsnorm_act(a.x, l.attn_norm.f32(), a.cur, n, E, c.rms_eps);
      if (c.layer_recurrent[il])
        delta_net_layer(l, il, ex, cur);
      else
        gated_attention(l, il, ex, cur);
      if (moe_) {  // x += mixer; cur = norm(x); x += routed experts + gated shared expert; then the next
                   // layer's cur = norm(x)
        const float* next_w = ex.next_layer_here(il) ? layer(il + 1).attn_norm.f32() : nullptr;
        cur = b.add_rmsnorm_moe_ffn_add(ex.moe(l, il), a.out, a.x, l.attn_post_norm.f32(), a.cur, n, next_w);
        continue;
      }
      // x += mixer; cur = norm(x)
      dense_ffn(l, ex, b.add_rmsnorm(a.out, a.x, l.attn_post_norm.f32(), a.cur, n, E, c.rms_eps));
      b.add(a.out, a.x, a.x, n * E);
      cur = {};
    }
    ex.output_logits(logits);
    for (const BatchSegment& g : ex.segments()) args.state->set_n_pos(g.seq, g.pos0 + g.n_tokens);
  }

 private:
  // IMRoPE (interleaved multi-section RoPE) on text positions rotates every pair at the token's
  // position, i.e. plain NeoX RoPE over n_rot dims, as long as every pair falls in the t/h/w sections
  // (pairs of the 4th section would take position 0, which the text path does not support).
  void check_rope_sections(const ArchKeys& k) const {
    const ModelConfig& c = config_;
    const gguf::Value* v = k.find("rope.dimension_sections");
    if (!v) fail("{}: key {}.rope.dimension_sections is missing", file_->path(), c.arch);
    if (v->type != gguf::ValueType::ARRAY || v->count < 3 || v->count > 4)
      fail("{}: {}.rope.dimension_sections must be an array of 4 integers", file_->path(), c.arch);
    int64_t sec[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < v->count; ++i) sec[i] = v->int_at(i);
    const int64_t total = sec[0] + sec[1] + sec[2] + sec[3];
    if (total <= 0 || total > c.n_rot / 2)
      fail("{}: rope.dimension_sections sum to {}, expected 1..{}", file_->path(), total, c.n_rot / 2);
    for (int64_t i = 0; i < c.n_rot / 2; ++i) {
      const int64_t sector = i % total;
      const bool thw = (sector % 3 == 0 && sector < 3 * sec[0]) || (sector % 3 == 1 && sector < 3 * sec[1]) ||
                       (sector % 3 == 2 && sector < 3 * sec[2]);
      if (!thw)
        fail(
            "{}: rope.dimension_sections [{}, {}, {}, {}] put rotary pair {} in the extra section, which "
            "xpert "
            "does not support",
            file_->path(), sec[0], sec[1], sec[2], sec[3], i);
    }
  }

  // What the table's shapes do not say: the conv kernel is F32, a shared expert is whole or absent.
  void check_tensors() const {
    const ModelConfig& c = config_;
    const gguf::GGUFFile& g = *file_;
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const LayerWeights& l = w_.layers[i];
      if (l.ssm_conv1d && l.ssm_conv1d.type != DType::F32)
        fail("{}: tensor '{}' must be F32 (it is {})", g.path(), layer_tensor_name(i, "ssm_conv1d.weight"),
             dtype_info(l.ssm_conv1d.type).name);
      const int n_sh = !!l.ffn_gate_inp_shexp + !!l.ffn_gate_shexp + !!l.ffn_up_shexp + !!l.ffn_down_shexp;
      if (n_sh != 0 && n_sh != 4)
        fail(
            "{}: layer {} has only some of the shared expert's tensors (ffn_gate_inp_shexp, "
            "ffn_gate_shexp, "
            "ffn_up_shexp, ffn_down_shexp)",
            g.path(), i);
    }
  }

  // Checks the batch against the slots' recurrent states before anything changes; clears slots that
  // start over at position 0.
  void begin_recurrent(const Exec& ex) const {
    RecurrentState* st = ex.args().state;
    if (!st) fail("{}: this model has recurrent layers; forward needs a RecurrentState", config_.arch);
    const std::vector<BatchSegment>& segs = ex.segments();
    for (size_t i = 0; i < segs.size(); ++i) {
      const BatchSegment& g = segs[i];
      if (g.seq < 0 || g.seq >= st->n_seq())
        fail("sequence slot {} out of range (0..{})", g.seq, st->n_seq() - 1);
      for (size_t j = 0; j < i; ++j)
        if (segs[j].seq == g.seq) fail("sequence slot {} appears twice in one batch", g.seq);
      if (g.pos0 != 0 && st->n_pos(g.seq) != g.pos0)
        fail(
            "slot {}: the recurrent state is at position {}, the batch continues at {}; recurrent layers "
            "cannot rewind (restart the sequence at position 0)",
            g.seq, st->n_pos(g.seq), g.pos0);
    }
    for (const BatchSegment& g : segs)
      if (g.pos0 == 0) st->reset(g.seq);
  }

  // cur (a.cur [n][n_embd]) -> a.out [n][n_embd], each segment through its own slot's state.
  void delta_net_layer(const LayerWeights& l, int64_t il, Exec& ex, const Act& cur) const {
    const int64_t n = ex.n();
    RecurrentState& st = *ex.args().state;
    const GdnShape gs = st.shape();
    const int64_t CD = gs.conv_dim(), VD = gs.value_dim(), Hv = gs.n_v_heads;
    Backend& b = ex.b();
    Activations& a = ex.a();
    Arena& ar = ex.arena();
    const size_t mark = ar.mark();
    float* qkv = ar.take<float>(n * CD);
    float* z = ar.take<float>(n * VD);
    float* alpha = ar.take<float>(n * Hv);
    float* beta = ar.take<float>(n * Hv);
    float* y = ar.take<float>(n * VD);
    const Backend::MatmulJob proj[] = {
        {&l.ssm_qkv, qkv}, {&l.ssm_gate, z}, {&l.ssm_alpha, alpha}, {&l.ssm_beta, beta}};
    b.matmuls(cur, proj);
    const GdnLayerParams p{.conv1d = l.ssm_conv1d.f32(),
                           .dt_bias = l.ssm_dt.f32(),
                           .a = l.ssm_a.f32(),
                           .norm = l.ssm_norm.f32(),
                           .out_type = l.ssm_out.type};
    const std::vector<BatchSegment>& segs = ex.segments();
    const bool rows = segs.size() > 1 && std::all_of(segs.begin(), segs.end(),
                                                     [](const BatchSegment& g) { return g.n_tokens == 1; });
    if (rows) {  // a decode step of many streams: every sequence's token at once
      std::vector<GdnSlotState> states;
      states.reserve(segs.size());
      for (const BatchSegment& g : segs) states.push_back({st.conv(il, g.seq), st.ssm(il, g.seq)});
      const GdnLayerInputs in{.qkv = qkv, .z = z, .alpha = alpha, .beta = beta, .n_tokens = n};
      b.matmul(l.ssm_out, b.gated_delta_net_rows(gs, p, in, states, y), a.out);
      ar.release(mark);
      return;
    }
    int64_t row = 0;
    Act out = Act::of(y, n, VD);  // one segment: as its gated delta net returned it
    for (const BatchSegment& g : segs) {
      const GdnLayerInputs in{.qkv = qkv + row * CD,
                              .z = z + row * VD,
                              .alpha = alpha + row * Hv,
                              .beta = beta + row * Hv,
                              .n_tokens = g.n_tokens};
      const Act seg = b.gated_delta_net_act(gs, p, in, st.conv(il, g.seq), st.ssm(il, g.seq), y + row * VD);
      if (segs.size() == 1) out = seg;
      row += g.n_tokens;
    }
    b.matmul(l.ssm_out, out, a.out);
    ar.release(mark);
  }

  // Full attention with QK-norm, partial NeoX RoPE, and the output gated by sigmoid(gate), where q and
  // gate come interleaved per head from one projection.
  void gated_attention(const LayerWeights& l, int64_t il, Exec& ex, const Act& cur) const {
    const ModelConfig& c = config_;
    const int64_t n = ex.n();
    const int64_t D = c.head_dim, q_dim = c.n_head * D;
    Backend& b = ex.b();
    Activations& a = ex.a();
    Arena& ar = ex.arena();
    const size_t mark = ar.mark();
    float* qg = ar.take<float>(n * 2 * q_dim);
    float* gate = ar.take<float>(n * q_dim);
    const Backend::MatmulJob qkv[] = {{&l.wq, qg}, {&l.wk, a.k}, {&l.wv, a.v}};
    b.matmuls(cur, qkv);
    const QkPrep prep{.q_norm = l.q_norm.f32(),
                               .k_norm = l.k_norm.f32(),
                               .pos = a.pos,
                               .n_rot = c.n_rot,
                               .freq_base = c.rope_base,
                               .freq_scale = c.rope_scale,
                               .mode = RopeMode::neox,
                               .eps = c.rms_eps};
    const AttentionLayerParams p = default_attention_params(c);
    const AttentionGate g{.qg = qg, .gate = gate};
    b.matmul(l.wo, attend_segments(c, p, il, ex, &prep, &g, &l.wo), a.out);
    ar.release(mark);
  }

  // cur (a.cur [n][n_embd]) -> a.out: the dense SwiGLU FFN.
  void dense_ffn(const LayerWeights& l, Exec& ex, const Act& cur) const {
    const ModelConfig& c = config_;
    const int64_t n = ex.n();
    Backend& b = ex.b();
    Activations& a = ex.a();
    const Backend::MatmulJob gate_up[] = {{&l.ffn_gate, a.ff_gate}, {&l.ffn_up, a.ff_up}};
    b.matmuls(cur, gate_up);
    b.swiglu(a.ff_gate, a.ff_up, a.ff_gate, n * c.n_ff);
    b.matmul(l.ffn_down, a.ff_gate, n, a.out);
  }

  bool moe_ = false;
};

}  // namespace

std::unique_ptr<Model> make_qwen35(std::unique_ptr<gguf::GGUFFile> f) {
  return std::make_unique<Qwen35>(std::move(f));
}

}  // namespace xpert
