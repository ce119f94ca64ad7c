#include "model/blocks.h"

#include "backend/cpu/matmul.h"
#include "base/error.h"
#include "quant/quant.h"
#include "runtime/kv_cache.h"

namespace xpert {

void linear(const Weight& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  cpu::matmul(w.type, w.data, w.ne[1], w.ne[0], x, m, y, w.ne[1], pool);
}

void embed(const Weight& tok_embd, std::span<const int32_t> tokens, float scale, float* x) {
  const int64_t n_embd = tok_embd.ne[0], n_vocab = tok_embd.ne[1];
  const size_t rb = row_bytes(tok_embd.type, n_embd);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= n_vocab) fail("token id {} is outside the vocabulary (0..{})", id, n_vocab - 1);
    float* row = x + t * n_embd;
    dequantize_row(tok_embd.type, static_cast<const uint8_t*>(tok_embd.data) + rb * id, row, n_embd);
    if (scale != 1.0f) cpu::scale(row, scale, n_embd);
  }
}

void Scratch::reserve(const ModelConfig& c, int64_t n) {
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  x.resize(n * c.n_embd);
  cur.resize(n * c.n_embd);
  out.resize(n * c.n_embd);
  q.resize(n * q_dim);
  att.resize(n * q_dim);
  k.resize(n * kv_dim);
  v.resize(n * kv_dim);
  ff_gate.resize(n * c.n_ff);
  ff_up.resize(n * c.n_ff);
  pos.resize(n);
}

void begin_forward(const ModelConfig& c, const ForwardArgs& args, Scratch& s) {
  const int64_t n = (int64_t)args.tokens.size();
  if (n == 0) fail("empty batch");
  s.reserve(c, n);
  s.segments.clear();
  if (args.segments.empty()) {
    s.segments.push_back({.seq = args.seq, .pos0 = args.pos0, .n_tokens = (int32_t)n, .all_logits = args.all_logits});
  } else {
    s.segments.assign(args.segments.begin(), args.segments.end());
  }
  s.out_rows.clear();
  int64_t row = 0;
  for (const BatchSegment& g : s.segments) {
    if (g.n_tokens <= 0 || g.pos0 < 0) fail("bad batch segment: {} tokens at position {}", g.n_tokens, g.pos0);
    if (args.cache) {
      if (g.seq < 0 || g.seq >= args.cache->n_seq()) fail("sequence slot {} out of range (0..{})", g.seq, args.cache->n_seq() - 1);
      if (g.pos0 + g.n_tokens > args.cache->n_ctx())
        fail("context is full: position {} + {} tokens exceeds {}", g.pos0, g.n_tokens, args.cache->n_ctx());
    }
    for (int32_t t = 0; t < g.n_tokens; ++t) {
      s.pos[row + t] = g.pos0 + t;
      if (g.all_logits || t == g.n_tokens - 1) s.out_rows.push_back(row + t);
    }
    row += g.n_tokens;
  }
  if (row != n) fail("batch segments cover {} tokens, the batch has {}", row, n);
}

void self_attention(const ModelConfig& c, const LayerWeights& lw, const AttentionLayerParams& p, int64_t il,
                    const ForwardArgs& args, Scratch& s, ThreadPool& pool) {
  const int64_t n = (int64_t)args.tokens.size();
  const int64_t D = c.head_dim, q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  linear(lw.wq, s.cur.data(), n, s.q.data(), pool);
  linear(lw.wk, s.cur.data(), n, s.k.data(), pool);
  linear(lw.wv, s.cur.data(), n, s.v.data(), pool);
  if (lw.bq) cpu::add_bias(s.q.data(), lw.bq.f32(), n, q_dim);
  if (lw.bk) cpu::add_bias(s.k.data(), lw.bk.f32(), n, kv_dim);
  if (lw.bv) cpu::add_bias(s.v.data(), lw.bv.f32(), n, kv_dim);
  if (lw.q_norm) cpu::rmsnorm(s.q.data(), lw.q_norm.f32(), s.q.data(), n * c.n_head, D, c.rms_eps);
  if (lw.k_norm) cpu::rmsnorm(s.k.data(), lw.k_norm.f32(), s.k.data(), n * c.n_head_kv, D, c.rms_eps);
  cpu::rope(s.q.data(), s.pos.data(), n, c.n_head, D, c.n_rot, p.rope_base, p.rope_scale, p.rope_mode);
  cpu::rope(s.k.data(), s.pos.data(), n, c.n_head_kv, D, c.n_rot, p.rope_base, p.rope_scale, p.rope_mode);
  if (p.q_scale != 1.0f) cpu::scale(s.q.data(), p.q_scale, n * q_dim);

  KvCache& kv = *args.cache;
  int64_t row = 0;
  for (const BatchSegment& g : s.segments) {
    uint16_t* kc = kv.k(il, g.seq);
    uint16_t* vc = kv.v(il, g.seq);
    cpu::store_f16(s.k.data() + row * kv_dim, kc + (int64_t)g.pos0 * kv_dim, g.n_tokens * kv_dim);
    cpu::store_f16(s.v.data() + row * kv_dim, vc + (int64_t)g.pos0 * kv_dim, g.n_tokens * kv_dim);
    cpu::AttentionArgs a{.q = s.q.data() + row * q_dim, .k = kc, .v = vc, .out = s.att.data() + row * q_dim,
                         .pos = s.pos.data() + row, .n_tokens = g.n_tokens, .n_head = c.n_head,
                         .n_head_kv = c.n_head_kv, .head_dim = D, .n_kv = g.pos0 + g.n_tokens,
                         .kq_scale = p.kq_scale, .sliding_window = p.sliding_window};
    cpu::attention(a, pool);
    row += g.n_tokens;
  }
  linear(lw.wo, s.att.data(), n, s.out.data(), pool);
}

void output_logits(const ModelConfig& c, const ModelWeights& w, const ForwardArgs& args, Scratch& s,
                   std::vector<float>& logits, ThreadPool& pool) {
  const int64_t n_out = (int64_t)s.out_rows.size();
  for (int64_t i = 0; i < n_out; ++i)
    cpu::rmsnorm(s.x.data() + s.out_rows[i] * c.n_embd, w.output_norm.f32(), s.cur.data() + i * c.n_embd, 1, c.n_embd,
                 c.rms_eps);
  logits.resize(n_out * c.n_vocab);
  const Weight& out = w.output ? w.output : w.tok_embd;
  linear(out, s.cur.data(), n_out, logits.data(), pool);
}

}  // namespace xpert
