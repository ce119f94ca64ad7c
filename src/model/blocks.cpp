#include "model/blocks.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "base/error.h"
#include "base/log.h"
#include "quant/quant.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"

namespace xpert {

MoeFfn moe_ffn_args(const ModelConfig& c, const LayerWeights& lw, int64_t il, RoutingSink* stats) {
  return {.n_embd = c.n_embd,
          .n_ff = c.n_ff_exp,
          .n_expert = c.n_expert,
          .n_used = c.n_expert_used,
          .norm_weights = c.expert_weights_norm,
          .weights_scale = c.expert_weights_scale,
          .rms_eps = c.rms_eps,
          .router = lw.ffn_gate_inp,
          .gate = lw.ffn_gate_exps,
          .up = lw.ffn_up_exps,
          .down = lw.ffn_down_exps,
          .n_ff_shared = lw.ffn_up_shexp ? c.n_ff_shexp : 0,
          .shared_gate_inp = lw.ffn_gate_inp_shexp,
          .shared_gate = lw.ffn_gate_shexp,
          .shared_up = lw.ffn_up_shexp,
          .shared_down = lw.ffn_down_shexp,
          .split = lw.split,
          .exec = lw.expert_exec,
          .exec_share = lw.expert_share,
          .layer = il,
          .stats = stats,
          .uniform_seed = c.uniform_routing_seed};
}

Exec::Exec(const Model& m, const ForwardArgs& args, ThreadPool& pool, float embed_scale) : m_(m), args_(args) {
  const ModelConfig& c = m.config();
  n_ = (int64_t)args.tokens.size();
  if (n_ == 0) fail("empty batch");
  if (args.segments.empty())
    segments_.push_back({.seq = args.seq, .pos0 = args.pos0, .n_tokens = (int32_t)n_, .all_logits = args.all_logits});
  else
    segments_.assign(args.segments.begin(), args.segments.end());
  pos_.resize(n_);
  int64_t row = 0;
  for (const BatchSegment& g : segments_) {
    if (g.n_tokens <= 0 || g.pos0 < 0) fail("bad batch segment: {} tokens at position {}", g.n_tokens, g.pos0);
    if (args.cache) {
      if (g.seq < 0 || g.seq >= args.cache->n_seq())
        fail("sequence slot {} out of range (0..{})", g.seq, args.cache->n_seq() - 1);
      if (g.pos0 + g.n_tokens > args.cache->n_ctx())
        fail("context is full: position {} + {} tokens exceeds {}", g.pos0, g.n_tokens, args.cache->n_ctx());
    }
    if (row + g.n_tokens > n_) fail("batch segments cover more than the batch's {} tokens", n_);
    if (g.n_tokens != 1) decode_only_ = false;
    for (int32_t t = 0; t < g.n_tokens; ++t) {
      pos_[row + t] = g.pos0 + t;
      max_pos_ = std::max(max_pos_, g.pos0 + t);
      if (g.all_logits || t == g.n_tokens - 1) out_rows_.push_back(row + t);
    }
    row += g.n_tokens;
  }
  if (row != n_) fail("batch segments cover {} tokens, the batch has {}", row, n_);

  // The embedding lookup runs on the host (the table stays in the mmap); x then goes where layer 0 runs.
  CpuBackend& cpu = CpuBackend::of(pool);
  cpu_pool_ = &pool;
  devs_.reserve(2);
  b_ = &cpu;
  a_ = &on(cpu).a;
  const Weight& te = m.host_weights().tok_embd;
  const int64_t E = c.n_embd, n_vocab = te.ne[1];
  const size_t rb = row_bytes(te.type, E);
  for (int64_t t = 0; t < n_; ++t) {
    const int32_t id = args.tokens[t];
    if (id < 0 || id >= n_vocab) fail("token id {} is outside the vocabulary (0..{})", id, n_vocab - 1);
    float* x = a_->x + t * E;
    dequantize_row(te.type, static_cast<const uint8_t*>(te.data) + rb * id, x, E);
    if (embed_scale != 1.0f) cpu::scale(x, embed_scale, E);
  }
}

Exec::OnDevice* Exec::find(const Backend& b) {
  for (OnDevice& d : devs_)
    if (d.b == &b) return &d;
  return nullptr;
}

Exec::OnDevice& Exec::on(Backend& b, const float* x_from_host) {
  if (OnDevice* d = find(b)) return *d;
  const ModelConfig& c = m_.config();
  const int64_t n = n_, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  const int64_t ff = std::max(c.n_ff, c.n_ff_shexp);
  Arena& ar = b.scratch();
  ar.reset();
  OnDevice d;
  d.b = &b;
  // The batch's positions and slots, then x, in one block that one copy fills: [pos | seq | pad | x]
  // (x from x_from_host where given). A decode step makes one upload, not three calls.
  const size_t ids_bytes = (2 * (size_t)n * sizeof(int32_t) + 255) / 256 * 256;
  const size_t x_bytes = (size_t)(n * c.n_embd) * sizeof(float);
  char* in = static_cast<char*>(ar.take_bytes(ids_bytes + x_bytes));
  d.a.pos = reinterpret_cast<int32_t*>(in);
  d.a.seq = d.a.pos + n;
  d.a.x = reinterpret_cast<float*>(in + ids_bytes);
  d.a.cur = ar.take<float>(n * c.n_embd);
  d.a.out = ar.take<float>(n * c.n_embd);
  d.a.q = ar.take<float>(n * q_dim);
  d.a.att = ar.take<float>(n * q_dim);
  d.a.k = ar.take<float>(n * kv_dim);
  d.a.v = ar.take<float>(n * kv_dim);
  d.a.ff_gate = ar.take<float>(n * ff);
  d.a.ff_up = ar.take<float>(n * ff);
  upload_.assign(ids_bytes + (x_from_host ? x_bytes : 0), 0);
  int32_t* ids = reinterpret_cast<int32_t*>(upload_.data());
  int32_t* seq = std::copy(pos_.begin(), pos_.end(), ids);
  for (const BatchSegment& g : segments_) seq = std::fill_n(seq, g.n_tokens, g.seq);
  if (x_from_host) std::memcpy(upload_.data() + ids_bytes, x_from_host, x_bytes);
  b.copy_from_host(in, upload_.data(), upload_.size());
  if (!b.is_host()) b.set_host_pool(cpu_pool_);
  XP_ASSERT(devs_.size() < devs_.capacity());
  devs_.push_back(d);
  return devs_.back();
}

Exec::~Exec() {
  if (graph_open_) b_->pass_graphs()->abort_graph();
  // A pass that outgrew a device's scratch grows it now, at its end (its outputs are read back), rather than
  // at the next pass's start, whose time it would take: a prompt after one of a new size, a bench's first
  // timed run after its warm-up.
  if (std::uncaught_exceptions() > 0) return;
  for (OnDevice& d : devs_) {
    if (!d.b->scratch().spilled()) continue;
    try {
      d.b->scratch().reset();
    } catch (const std::exception& e) {  // the next pass spills again and reports what fails
      log::warn("{}: the scratch could not grow after this pass: {}", d.b->name(), e.what());
    }
  }
}

namespace {
bool graphs_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("XPERT_GRAPHS");
    return !(e && std::string(e) == "0");
  }();
  return on;
}
}  // namespace

Backend& Exec::enter(int64_t il) {
  Backend* want = m_.layer_device(il);
  if (!want) want = devs_.front().b;  // the CPU
  if (want != b_) {
    // First time on this device, from the host, and small (a decode step's): x goes over with the batch's
    // ids in one copy. A prefill's x goes straight from where it is (no staging copy of megabytes).
    const size_t x_bytes = (size_t)n_ * m_.config().n_embd * sizeof(float);
    const float* x_host = b_->is_host() && !find(*want) && x_bytes <= (64 << 10) ? a_->x : nullptr;
    OnDevice& d = on(*want, x_host);
    if (!x_host) copy_between(*b_, a_->x, *want, d.a.x, x_bytes);
    b_ = want;
    a_ = &d.a;
    // A decode step of a model wholly on one device is one graph from here to the logits, keyed by
    // everything the recorded ops bake in (batch layout, caches, scratch addresses).
    PassGraphs* graphs = want->pass_graphs();
    if (graphs && il == 0 && decode_only_ && !args_.hidden && m_.n_offloaded() == m_.config().n_layer && graphs_enabled()) {
      std::string key = fmt::format("m{}|kv{}|st{}|ar{}|", fmt::ptr(&m_), args_.cache ? args_.cache->id() : 0,
                                    args_.state ? args_.state->id() : 0, want->scratch().generation());
      if (const DecodeFusions* f = want->decode_fusions()) key += fmt::format("af{}|", f->decode_attention_form(max_pos_));
      for (const BatchSegment& g : segments_) key += fmt::format("{},", g.seq);
      for (int64_t r : out_rows_) key += fmt::format("{};", r);
      replaying_ = graphs->begin_graph(key);
      graph_open_ = true;
    }
  }
  return *b_;
}

bool Exec::next_layer_here(int64_t il) const {
  return il + 1 < m_.config().n_layer && m_.layer_device(il + 1) == m_.layer_device(il);
}

void Exec::output_logits(std::vector<float>& logits) {
  const ModelConfig& c = m_.config();
  const ModelWeights& w = b_->is_host() ? m_.host_weights() : m_.io_weights();
  const int64_t n_out = (int64_t)out_rows_.size(), E = c.n_embd;
  Backend& b = *b_;
  if (!args_.hidden) logits.resize(n_out * c.n_vocab);
  if (replaying_) {  // the recorded graph computes the head too, into the scratch address it recorded
    const size_t mark = arena().mark();
    float* y = arena().take<float>(n_out * c.n_vocab);
    graph_open_ = false;
    b.pass_graphs()->end_graph();
    b.copy_to_host(logits.data(), y, logits.size() * sizeof(float));
    arena().release(mark);
    return;
  }
  Act cur;
  if (n_out == n_) {  // every row (decode): no gather
    cur = b.rmsnorm_act(a_->x, w.output_norm.f32(), a_->cur, n_out, E, c.rms_eps);
  } else {
    b.gather_rows(a_->x, out_rows_, E, a_->cur);
    cur = b.rmsnorm_act(a_->cur, w.output_norm.f32(), a_->cur, n_out, E, c.rms_eps);
  }
  if (args_.hidden) {  // embeddings: the normed rows themselves, no head
    logits.clear();
    args_.hidden->resize(n_out * E);
    b.copy_to_host(args_.hidden->data(), a_->cur, args_.hidden->size() * sizeof(float));
    return;
  }
  const Weight& head = w.output ? w.output : w.tok_embd;
  if (b.is_host()) {
    b.matmul(head, cur, logits.data());
  } else {
    const size_t mark = arena().mark();
    float* y = arena().take<float>(n_out * c.n_vocab);
    b.matmul(head, cur, y);
    if (graph_open_) {
      graph_open_ = false;
      b.pass_graphs()->end_graph();
    }
    b.copy_to_host(logits.data(), y, logits.size() * sizeof(float));
    arena().release(mark);
  }
}

AttentionLayerParams default_attention_params(const ModelConfig& c) {
  return {.rope_base = c.rope_base,
          .rope_scale = c.rope_scale,
          .rope_mode = c.rope_neox ? RopeMode::neox : RopeMode::normal,
          .q_scale = 1.0f,
          .kq_scale = c.kq_scale,
          .sliding_window = 0};
}

Act attend_segments(const ModelConfig& c, const AttentionLayerParams& p, int64_t il, Exec& ex,
                    const QkPrep* prep, const AttentionGate* gate, const Weight* wo,
                    std::optional<PartialSum>* parts) {
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim, D = c.head_dim;
  Backend& b = ex.b();
  Activations& a = ex.a();
  KvCache& kv = *ex.args().cache;
  DecodeFusions* fusions = ex.decode_only() ? b.decode_fusions() : nullptr;
  const bool decode = fusions != nullptr;
  const bool fuse = gate && decode && fusions->fuses_attention_gate();
  auto split_gate = [&] { b.deinterleave(gate->qg, ex.n() * c.n_head, D, a.q, gate->gate); };
  if (gate && !fuse) split_gate();
  if (decode) {
    const DecodeAttention d{.q = fuse ? gate->qg : a.q,
                            .k = a.k,
                            .v = a.v,
                            .k_cache = kv.k(il, 0),
                            .v_cache = kv.v(il, 0),
                            .slot_stride = kv.slot_stride(),
                            .slots = a.seq,
                            .pos = a.pos,
                            .max_pos = ex.max_pos(),
                            .out = a.att,
                            .n_seq = ex.n(),
                            .n_head = c.n_head,
                            .n_head_kv = c.n_head_kv,
                            .head_dim = c.head_dim,
                            .n_ctx = kv.n_ctx(),
                            .kq_scale = p.kq_scale,
                            .sliding_window = p.sliding_window,
                            .k_type = kv.type(0),
                            .v_type = kv.type(1),
                            .prep = prep,
                            .gate = fuse ? gate->qg + D : nullptr,
                            .gate_stride = fuse ? 2 * D : 0,
                            .q_stride = fuse ? 2 * D : 0,
                            .out_type = wo ? wo->type : DType::F32};
    if (wo && parts && !gate) {
      *parts = fusions->decode_attention_proj(d, *wo, a.out);
      if (*parts) return {};
    }
    if (const std::optional<Act> att = fusions->decode_attention(d)) {
      if (!gate || fuse) return *att;
      b.mul_sigmoid(a.att, gate->gate, ex.n() * q_dim);  // a.att written again: its form is gone
      return Act::of(a.att, ex.n(), q_dim);
    }
    if (fuse) split_gate();  // the backend declined (and applied nothing): the path below reads a.q
  }
  // One sequence's rows: q and k normalized and rotated, k and v stored, by one op (one launch on OpenCL);
  // several: q and k of all rows at once, then each sequence's stores.
  const bool one = ex.segments().size() == 1;
  if (prep && !one)
    b.qk_norm_rope(a.q, a.k, prep->q_norm, prep->k_norm, prep->pos, ex.n(), c.n_head, c.n_head_kv, c.head_dim,
                   prep->n_rot, prep->freq_base, prep->freq_scale, prep->mode, prep->eps);
  int64_t row = 0;
  for (const BatchSegment& g : ex.segments()) {
    auto* kc = static_cast<uint8_t*>(kv.k(il, g.seq));
    auto* vc = static_cast<uint8_t*>(kv.v(il, g.seq));
    uint8_t *krow = kc + (size_t)g.pos0 * kv.row_bytes(0), *vrow = vc + (size_t)g.pos0 * kv.row_bytes(1);
    if (prep && one) {
      b.qk_norm_rope_store_kv(a.q, a.k, a.v, *prep, g.n_tokens, c.n_head, c.n_head_kv, D, krow, kv.type(0),
                              vrow, kv.type(1));
    } else {
      b.store_kv(a.k + row * kv_dim, krow, g.n_tokens * kv_dim, kv.type(0));
      b.store_kv(a.v + row * kv_dim, vrow, g.n_tokens * kv_dim, kv.type(1));
    }
    b.attention({.q = a.q + row * q_dim,
                 .k = kc,
                 .v = vc,
                 .out = a.att + row * q_dim,
                 .pos = a.pos + row,
                 .n_tokens = g.n_tokens,
                 .n_head = c.n_head,
                 .n_head_kv = c.n_head_kv,
                 .head_dim = c.head_dim,
                 .n_kv = g.pos0 + g.n_tokens,
                 .kq_scale = p.kq_scale,
                 .sliding_window = p.sliding_window,
                 .k_type = kv.type(0),
                 .v_type = kv.type(1)});
    row += g.n_tokens;
  }
  if (gate) b.mul_sigmoid(a.att, gate->gate, ex.n() * q_dim);
  return Act::of(a.att, ex.n(), q_dim);
}

void self_attention(const ModelConfig& c, const LayerWeights& lw, const AttentionLayerParams& p, int64_t il,
                    Exec& ex, const Act& cur, std::optional<PartialSum>* parts) {
  const int64_t n = ex.n();
  const int64_t D = c.head_dim, q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  Backend& b = ex.b();
  Activations& a = ex.a();
  const Backend::MatmulJob qkv[] = {{&lw.wq, a.q}, {&lw.wk, a.k}, {&lw.wv, a.v}};
  b.matmuls(cur, qkv);
  if (lw.bq) b.add_bias(a.q, lw.bq.f32(), n, q_dim);
  if (lw.bk) b.add_bias(a.k, lw.bk.f32(), n, kv_dim);
  if (lw.bv) b.add_bias(a.v, lw.bv.f32(), n, kv_dim);
  const QkPrep prep{.q_norm = lw.q_norm ? lw.q_norm.f32() : nullptr,
                             .k_norm = lw.k_norm ? lw.k_norm.f32() : nullptr,
                             .pos = a.pos,
                             .n_rot = c.n_rot,
                             .freq_base = p.rope_base,
                             .freq_scale = p.rope_scale,
                             .mode = p.rope_mode,
                             .eps = c.rms_eps};
  if (p.q_scale != 1.0f) {  // the scale goes after RoPE (Gemma): not foldable into the store
    b.qk_norm_rope(a.q, a.k, prep.q_norm, prep.k_norm, a.pos, n, c.n_head, c.n_head_kv, D, c.n_rot, p.rope_base,
                   p.rope_scale, p.rope_mode, c.rms_eps);
    b.scale(a.q, p.q_scale, n * q_dim);
    b.matmul(lw.wo, attend_segments(c, p, il, ex, nullptr, nullptr, &lw.wo), a.out);
    return;
  }
  std::optional<PartialSum> proj;
  const Act att = attend_segments(c, p, il, ex, &prep, nullptr, &lw.wo, &proj);
  if (!proj) return b.matmul(lw.wo, att, a.out);
  if (parts)
    *parts = proj;  // the caller hands them on
  else
    b.decode_fusions()->sum_parts(*proj);  // a.out whole now
}

}  // namespace xpert
