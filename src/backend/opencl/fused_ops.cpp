// The whole-model OpenCL backend's fused forms (kernels_fused.h). On a discrete GPU's OpenCL each enqueue
// costs microseconds of host time (NVIDIA's: 8-11), so a decode step is counted in launches: per MoE layer
// of qwen3moe, 6 (qkv: one gemv over the three matrices, its input rounded by the last layer's down kernel;
// two where Q4_K_M gives v more bits; q/k norms, RoPE, the k/v store and the attention, its output rounded
// for wo as it is written: one; wo: one gemv; the residual add, the FFN norm and rounding, the router's
// product and the top-k in its last groups: one; gate/up with SwiGLU, the last group of each slot rounding
// its row: one; down with the weighted combine and the residual add, the last group of each token writing the
// next layer's norm: one) instead of 29 with the plain ops, and none of them waits for the host.
#include "backend/opencl/backend_impl.h"

namespace xpert::opencl {

int OpenclBackend::round_mode(DType t, int64_t* unit) {
  int mode = -1;
  int64_t u = 1;
  switch (t) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
      mode = 0, u = 32;
      break;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      mode = 1, u = 256;
      break;
    case DType::F16:
      mode = 2;
      break;
    case DType::BF16:
      mode = 3;
      break;
    default:
      break;
  }
  if (unit) *unit = u;
  return mode;
}

// One gemv_multi per weight type among the jobs (Q4_K_M gives a layer's v or GDN qkv projection Q6_K in some
// layers, the others Q4_K), x rounded once per rounding mode (Q4_K and Q6_K round alike, and the MoE layer's
// last kernel may have rounded it already). Prefill-sized rows: a tiled product per job, x rounded once per
// rounding mode for all of them (prefill_matmuls).
void OpenclBackend::matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) {
  auto plain = [&] { Backend::matmuls(x, m, jobs); };
  if (!fused_ || m <= 0 || jobs.size() < 2) return plain();
  const int64_t k = jobs[0].w->ne[0];
  for (const MatmulJob& j : jobs) {
    const float* y = j.y;  // an output over x: one by one, as the plain form runs them
    if (j.w->ne[0] != k || !weight_macro(j.w->type) || (x >= y && x < y + m * (j.ldy ? j.ldy : j.w->ne[1])))
      return plain();
  }
  if (m > kGemvMaxRows) return prefill_matmuls(x, m, k, jobs);
  if (jobs.size() > 4) return plain();
  DType types[4];  // in the order the jobs first name them (at most 4 jobs: no allocation a decode step)
  int n_types = 0;
  for (const MatmulJob& j : jobs)
    if (std::find(types, types + n_types, j.w->type) == types + n_types) types[n_types++] = j.w->type;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  // Every rounding first: a rounding launch does not write x, so what was rounded before stays valid. A type
  // that rounds as an earlier one reads that one's rows.
  const Prerounded before = pre_;
  const float* xq[4];
  for (int ti = 0; ti < n_types; ++ti) {
    int same = 0;
    while (same < ti && round_mode(types[same]) != round_mode(types[ti])) ++same;
    if (same < ti) {
      xq[ti] = xq[same];
      continue;
    }
    pre_ = before;
    xq[ti] = rounded_activations(types[ti], x, m, k);
  }
  // What the MoE layer's last kernel rounds the next layer's input for.
  preround_type_ = types[0];
  for (int ti = 0; ti < n_types; ++ti) {
    const DType t = types[ti];
    const void* w[4] = {nullptr, nullptr, nullptr, nullptr};
    float* y[4] = {nullptr, nullptr, nullptr, nullptr};
    cl_int n[4] = {0, 0, 0, 0}, ldy[4] = {0, 0, 0, 0};
    int g = 0;
    for (const MatmulJob& j : jobs) {
      if (j.w->type != t) continue;
      check_mv_aligned(t, j.w->data, xq[ti]);
      w[g] = j.w->data;
      y[g] = j.y;
      n[g] = (cl_int)j.w->ne[1];
      ldy[g++] = (cl_int)(j.ldy ? j.ldy : j.w->ne[1]);
    }
    const cl_int n_total = n[0] + n[1] + n[2] + n[3];
    launch(matmul_program(t).kernel("gemv_multi"), {groups(n_total, mv_r_) * mv_wg_, (size_t)(m * mv_r_)},
           {(size_t)mv_wg_, (size_t)mv_r_}, w[0], w[1], w[2], w[3], (cl_ulong)row_bytes(t, k), n[0], n[1],
           n[2], y[0], y[1], y[2], y[3], ldy[0], ldy[1], ldy[2], ldy[3], xq[ti], (cl_int)k, (cl_int)k,
           n_total);
  }
  ar.release(mark);
}

// Each job's product as matmul runs it (the same kernels, the same bits), x rounded once per rounding mode
// where matmul would round it once per job: a layer's q, k and v at pp512 took three round_blocks launches of
// the same rows (H200, qwen3-30b-a3b: 14.3 us each, 2 of the 6 a layer). Two neighbouring jobs of one type
// and shape that gemm would each split along k (k and v) take one split launch (gemm_pair), planned as one
// product of both: fewer, longer slices, so their sums may differ from matmul's in the last bits (qwen3-30b-a3b
// pp512 on an H100: -1.2 to -1.6 ms of two passes' 270).
void OpenclBackend::prefill_matmuls(const float* x, int64_t m, int64_t k, std::span<const MatmulJob> jobs) {
  preround_type_ = jobs[0].w->type;  // as matmuls: what the norm before the next q/k/v product rounds for
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const float* xq[4] = {nullptr, nullptr, nullptr, nullptr};  // x rounded in round_mode 0..3
  for (const MatmulJob& j : jobs) {
    const int mode = round_mode(j.w->type);
    if (mode >= 0 && !xq[mode]) xq[mode] = rounded_activations(j.w->type, x, m, k);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    const int mode = round_mode(j.w->type);
    const int64_t n = j.w->ne[1], ldy = j.ldy ? j.ldy : n;
    if (n <= 0) continue;
    const float* xj = mode >= 0 ? xq[mode] : x;
    if (i + 1 < jobs.size()) {  // the next job of the same type and shape with it, where both would split
      const MatmulJob& j2 = jobs[i + 1];
      if (j2.w->type == j.w->type && j2.w->ne[1] == n && (j2.ldy ? j2.ldy : n) == ldy &&
          gemm_pair(j.w->type, j.w->data, j2.w->data, n, k, xj, m, j.y, j2.y, ldy)) {
        ++i;
        continue;
      }
    }
    gemm(j.w->type, j.w->data, n, k, xj, k, m, j.y, ldy);
  }
  ar.release(mark);
}

// A norm (a layer's first, the output norm, a dense layer's) also rounds y for the products that read it
// next, in the mode of the last q/k/v product (preround_block_mode), so their own rounding launch is skipped
// where the mode matches (rounded_activations finds it): at prefill too, where that launch was a round_blocks
// of every row (H100, qwen3-30b-a3b pp512: 14.3 us, one a layer).
Act OpenclBackend::add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                               float eps) {
  const int mode = fused_ && tails_ ? preround_block_mode(n) : -1;
  if (!fused_ || (!d && mode < 0)) return Backend::add_rmsnorm(d, x, w, y, rows, n, eps);  // the plain ops
  float* yq = mode >= 0 ? preround_buffer(rows * n) : nullptr;
  add_rmsnorm_round(d, x, w, y, rows, n, eps, yq, mode);
  if (mode >= 0) pre_ = {y, yq, rows, n, mode};
  return Act::of(y, rows, n);
}

void OpenclBackend::add_rmsnorm_round(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                                      float eps, float* yq, int mode) {
  if (rows <= 0) return;
  if (n % 4 == 0 && n <= 4 * kNormJ * kNormWg)
    launch(ops("add_rmsnorm_round4"), {(size_t)rows * kNormWg}, {kNormWg}, d, (cl_int)(d != nullptr), x, w,
           (cl_int)(w != nullptr), y, (cl_int)n, eps, yq, (cl_int)mode);
  else
    launch(ops("add_rmsnorm_round"), {(size_t)rows * kRedWg}, {kRedWg}, d, (cl_int)(d != nullptr), x, w,
           (cl_int)(w != nullptr), y, (cl_int)n, eps, yq, (cl_int)mode);
}

// decode_attention_proj never leaves parts here; summed with the plain ops all the same.
void OpenclBackend::sum_parts(const PartialSum& p) {
  copy(p.out, p.parts, p.n * sizeof(float));
  for (int j = 1; j < p.n_parts; ++j) add(p.parts + j * p.n, p.out, p.out, p.n);
}

void OpenclBackend::qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm,
                                 const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t n_head_kv,
                                 int64_t head_dim, int64_t n_rot, float freq_base, float freq_scale,
                                 RopeMode mode, float eps) {
  const QkPrep p{.q_norm = q_norm,
                 .k_norm = k_norm,
                 .pos = pos,
                 .n_rot = n_rot,
                 .freq_base = freq_base,
                 .freq_scale = freq_scale,
                 .mode = mode,
                 .eps = eps};
  if (!qk_norm_rope_launch(q, k, nullptr, p, n_tokens, n_head, n_head_kv, head_dim, nullptr, nullptr))
    Backend::qk_norm_rope(q, k, q_norm, k_norm, pos, n_tokens, n_head, n_head_kv, head_dim, n_rot, freq_base,
                          freq_scale, mode, eps);
}

// The k and v stores ride in the same launch (n_head_kv groups more for v): two launches of store_f16 fewer a
// layer at prefill.
void OpenclBackend::qk_norm_rope_store_kv(float* q, float* k, const float* v, const QkPrep& p,
                                          int64_t n_tokens, int64_t n_head, int64_t n_head_kv,
                                          int64_t head_dim, void* kc, DType k_type, void* vc, DType v_type) {
  check_kv_type(k_type);
  check_kv_type(v_type);
  not_recordable();  // kc / vc are the step's rows
  if (!qk_norm_rope_launch(q, k, v, p, n_tokens, n_head, n_head_kv, head_dim, kc, vc))
    Backend::qk_norm_rope_store_kv(q, k, v, p, n_tokens, n_head, n_head_kv, head_dim, kc, k_type, vc, v_type);
}

// Group (head, token) of qk_norm_rope: q heads, k heads, then (kc: the stores too) v heads. False where the
// kernel does not apply (nothing launched).
bool OpenclBackend::qk_norm_rope_launch(float* q, float* k, const float* v, const QkPrep& p, int64_t n_tokens,
                                        int64_t n_head, int64_t n_head_kv, int64_t head_dim, void* kc,
                                        void* vc) {
  if (!fused_ || head_dim > kAttMaxD || p.n_rot > head_dim || p.n_rot % 2) return false;
  if (n_tokens <= 0) return true;
  const float theta_scale = p.n_rot >= 2 ? std::pow(p.freq_base, -2.0f / (float)p.n_rot) : 1.0f;  // as rope()
  const int64_t heads = n_head + n_head_kv * (kc ? 2 : 1);
  launch(ops("qk_norm_rope"), {(size_t)heads * kRedWg, (size_t)n_tokens}, {kRedWg, 1}, q, k, p.q_norm,
         (cl_int)(p.q_norm != nullptr), p.k_norm, (cl_int)(p.k_norm != nullptr), p.pos, (cl_int)n_head,
         (cl_int)n_head_kv, (cl_int)head_dim, (cl_int)(p.n_rot >= 2 ? p.n_rot : 0), theta_scale, p.freq_scale,
         (cl_int)(p.mode == RopeMode::neox), p.eps, (cl_int)head_dim, v, kc, vc, (cl_int)(kc != nullptr));
  return true;
}

// One launch: each group (head, sequence) normalizes and rotates its q head and its KV head's new k, stores
// the k/v rows, then attends over its slot (kernels_attention.h); Qwen3.5's output gate too (q and the gate
// interleaved per head, q_stride = gate_stride = 2 head_dim).
std::optional<Act> OpenclBackend::decode_attention(const DecodeAttention& d) {
  if (d.k_type != DType::F16 || d.v_type != DType::F16 || d.head_dim > kAttMaxD || d.n_head_kv <= 0 ||
      d.n_head % d.n_head_kv || d.n_seq <= 0 || d.slot_stride % 2)
    return std::nullopt;
  const int64_t q_stride = d.q_stride ? d.q_stride : d.head_dim;
  const QkPrep* p = d.prep;
  if (p && (p->n_rot > d.head_dim || p->n_rot % 2)) return std::nullopt;
  const int64_t n_rot = p && p->n_rot >= 2 ? p->n_rot : 0;
  const float theta_scale = n_rot ? std::pow(p->freq_base, -2.0f / (float)n_rot) : 1.0f;
  const cl_long slot_halves = d.slot_stride / 2;
  const int64_t q_dim = d.n_head * d.head_dim;
  int mode = head_round_mode(d.out_type, d.n_seq, d.n_head, d.head_dim);
  const int64_t n_ch = att_split_chunks(d, &mode);
  float* outq = mode >= 0 ? preround_buffer(d.n_seq * q_dim) : nullptr;
  if (n_ch) {
    // Form 1: a group per (KV head, 8 of its query heads, sequence, chunk of keys).
    const size_t g0 = d.n_head_kv * att_head_groups(d) * kAttWg, g1 = d.n_seq, g2 = n_ch;
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    float* scores = ar.take<float>(d.n_seq * d.n_head * d.n_ctx);
    float* ml = ar.take<float>(2 * d.n_seq * d.n_head * n_ch);
    float* parts = ar.take<float>(d.n_seq * q_dim * n_ch);
    launch(attention_kernel("attention_split", d.head_dim, d.k_cache, d.v_cache, slot_halves), {g0, g1, g2},
           {kAttWg, 1, 1}, d.q, d.k_cache, d.v_cache, d.pos, (cl_int)d.n_head, (cl_int)d.n_head_kv,
           (cl_int)d.head_dim, d.kq_scale, (cl_int)d.sliding_window, d.slots, slot_halves, (cl_int)q_stride,
           d.k, d.v, p ? p->q_norm : nullptr, (cl_int)(p && p->q_norm), p ? p->k_norm : nullptr,
           (cl_int)(p && p->k_norm), (cl_int)n_rot, theta_scale, p ? p->freq_scale : 1.0f,
           (cl_int)(p && p->mode == RopeMode::neox), p ? p->eps : 0.0f, (cl_int)cpu::kAttentionTiledMinKeys,
           scores, (cl_int)d.n_ctx, ml, (cl_int)n_ch, parts, d.out, d.gate, (cl_int)d.gate_stride,
           (cl_int)(d.gate != nullptr), (cl_int)mode, outq, counters_);
    ar.release(mark);
  } else {
    launch(attention_kernel("attention", d.head_dim, d.k_cache, d.v_cache, slot_halves),
           {(size_t)d.n_head * kAttWg, (size_t)d.n_seq}, {kAttWg, 1}, d.q, d.k_cache, d.v_cache, d.out, d.pos,
           (cl_int)d.n_head, (cl_int)d.n_head_kv, (cl_int)d.head_dim, (cl_int)d.n_ctx, d.kq_scale,
           (cl_int)d.sliding_window, d.slots, (cl_int)1, slot_halves, (cl_int)q_stride, d.gate,
           (cl_int)d.gate_stride, (cl_int)(d.gate != nullptr), (cl_int)mode, outq, counters_, (cl_int)1, d.k,
           d.v, p ? p->q_norm : nullptr, (cl_int)(p && p->q_norm), p ? p->k_norm : nullptr,
           (cl_int)(p && p->k_norm), (cl_int)n_rot, theta_scale, p ? p->freq_scale : 1.0f,
           (cl_int)(p && p->mode == RopeMode::neox), p ? p->eps : 0.0f);
  }
  if (mode >= 0) pre_ = {d.out, outq, d.n_seq, q_dim, mode};
  return Act::of(d.out, d.n_seq, q_dim);
}

// About four groups a compute unit (each at least ATT_SPLIT_MIN keys; a short sequence idles the rest). Not
// for a sliding window shorter than kAttSplitKeys (Gemma 3's local layers): every row would be one chunk of
// the short path, slower than attention's group a query head. The last group of a unit rounds its heads'
// output for the projection (*mode) only where they hold whole blocks; elsewhere (a block across two KV
// heads' units: Qwen2.5-7B's 7 query heads a KV head, Llama 3.2 3B's 3, with Q4_K's blocks of two heads of
// 128) *mode becomes -1 and the projection rounds for itself, a launch where `attention` (2.3 ms at 4096
// keys) took it along.
int64_t OpenclBackend::att_split_chunks(const DecodeAttention& d, int* mode) const {
  const int64_t gqa = d.n_head / d.n_head_kv, n_hg = att_head_groups(d);
  const int64_t units = d.n_seq * d.n_head_kv * n_hg;
  if (decode_attention_form(d.max_pos) != 1 || units > kCounters ||
      (d.sliding_window > 0 && d.sliding_window < kAttSplitKeys))
    return 0;
  if (*mode == 0 || *mode == 1) {
    int64_t unit = 1;
    round_mode(d.out_type, &unit);
    const int64_t hpu = d.head_dim >= unit ? 1 : unit / d.head_dim;
    if (gqa % hpu || (n_hg > 1 && kAttQb % hpu)) *mode = -1;
  }
  const int64_t want = std::max<int64_t>(4, 4 * (int64_t)info_.compute_units / units);
  return std::min({want, kAttMaxChunks, (d.n_ctx + kAttWg - 1) / kAttWg});
}

// The plain ops' order (Backend::add_rmsnorm_moe_ffn_add) where the fused launches below do not apply (a
// prefill, experts split with another executor), but the MoE's sum is added to x by the next layer's norm, in
// its launch (add_rmsnorm_round4 with d), not by a launch of its own: the same sums, one launch fewer a
// layer.
Act OpenclBackend::moe_ffn_add_norm(const MoeFfn& m, const float* d, float* x, const float* w, float* cur,
                                    int64_t n, const float* next_w, const PartialSum* d_parts) {
  if (!fused_ || !next_w) return Backend::add_rmsnorm_moe_ffn_add(m, d, x, w, cur, n, next_w, d_parts);
  if (d_parts) sum_parts(*d_parts);
  const int64_t E = m.n_embd;
  const Act c = add_rmsnorm(d, x, w, cur, n, E, m.rms_eps);
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* t = ar.take<float>(n * E);
  moe_ffn_whole(m, c, t);
  const Act next = add_rmsnorm(t, x, next_w, cur, n, E, m.rms_eps);
  ar.release(mark);
  return next;
}

// A decode-sized batch of a MoE layer wholly on the device: three launches from the residual add to the next
// layer's norm (an F32 router: the add and norm in its groups), no host round trip (routing as
// moe_small_batch, not counted in the routing statistics). A shared expert (Qwen3.5) of the experts' width
// and weight types rides along as one slot more a token: its gate in the router's launch (one group more),
// its gate/up rows in moe_gate_up's, its down product and weight in moe_down_add's. Everything else takes the
// plain ops.
Act OpenclBackend::add_rmsnorm_moe_ffn_add(const MoeFfn& m, const float* d, float* x, const float* w,
                                           float* cur, int64_t n, const float* next_w,
                                           const PartialSum* d_parts) {
  const int64_t X = m.n_expert, K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  const bool shared = (bool)m.shared_up;
  const int64_t Sx = S + (shared ? n : 0);  // slots: the routed ones, then the shared expert's
  // The residual add, the norm, the router's product and the routing in one launch (every group normalizes
  // the token's row; the last group of each token routes it); x takes d in moe_down_add.
  const bool router_tail =
      tails_ && m.router.type == DType::F32 && X <= kRouteMax && E % 4 == 0 && E <= kRouteMax && d && w;
  const bool shared_fits =
      !shared || (router_tail && m.n_ff_shared == F && m.shared_gate.type == m.gate.type &&
                  m.shared_up.type == m.gate.type && m.shared_down.type == m.down.type &&
                  m.shared_gate_inp.type == DType::F32 && m.shared_gate_inp.ne[0] == E);
  const bool fusable = fused_ && n > 0 && n < kMoeGemmMinRows && Sx <= kCounters &&
                       K + (shared ? 1 : 0) <= kMoeMaxUsed && !m.split && !m.exec && m.uniform_seed == 0 &&
                       shared_fits && m.gate.type == m.up.type && weight_macro(m.gate.type) &&
                       weight_macro(m.down.type) && E % block_elems(m.gate.type) == 0 &&
                       F % block_elems(m.down.type) == 0;
  if (!fusable || d_parts) return moe_ffn_add_norm(m, d, x, w, cur, n, next_w, d_parts);
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const int mode = round_mode(m.gate.type);
  float* curq = mode >= 0 ? ar.take<float>(n * E) : cur;
  float* logits_d = ar.take<float>(n * X);
  int32_t* row_slot_d = ar.take<int32_t>(S);
  int32_t* slot_row_d = ar.take<int32_t>(S);
  float* weights_d = ar.take<float>(Sx);  // the shared expert's sigmoid gates after the routed weights
  int32_t* tasks_d = ar.take<int32_t>(2 * S);
  const RouterParams rp = m.router_params();
  if (router_tail) {
    launch(matmul_program(m.router.type).kernel("moe_router_route"),
           {(size_t)(X + (shared ? 1 : 0)) * mv_wg_, (size_t)n}, {(size_t)mv_wg_, 1}, m.router.data,
           (cl_ulong)row_bytes(m.router.type, E), shared ? m.shared_gate_inp.data : nullptr, d, x, w,
           m.rms_eps, cur, (cl_int)mode, curq, (cl_int)E, logits_d, (cl_int)X, (cl_int)K,
           (cl_int)rp.norm_weights, rp.weights_scale, row_slot_d, slot_row_d, weights_d, tasks_d, counters_);
  } else {
    add_rmsnorm_round(d, x, w, cur, n, E, m.rms_eps, curq, mode);
    matmul(m.router, cur, n, logits_d, X);
    launch(ops("moe_route_slots"), {(size_t)n * kRedWg}, {kRedWg}, logits_d, (cl_int)X, (cl_int)K,
           (cl_int)rp.norm_weights, rp.weights_scale, row_slot_d, slot_row_d, weights_d, tasks_d, (cl_int)n);
  }
  float* h = ar.take<float>(Sx * F);
  const size_t gate_row = row_bytes(m.gate.type, E), down_row = row_bytes(m.down.type, F);
  // h rounded for the down product by gate_up's last group of each slot (tails_), else by its own launch.
  const int down_mode = round_mode(m.down.type);
  float* hq = down_mode >= 0 && tails_ ? ar.take<float>(Sx * F) : h;
  check_mv_aligned(m.gate.type, m.gate.data, curq);
  check_mv_aligned(m.gate.type, m.up.data, curq);
  if (shared) {
    check_mv_aligned(m.gate.type, m.shared_gate.data, curq);
    check_mv_aligned(m.gate.type, m.shared_up.data, curq);
  }
  launch(matmul_program(m.gate.type).kernel("moe_gate_up"), {groups(F, mv_r_) * mv_wg_, (size_t)(Sx * mv_r_)},
         {(size_t)mv_wg_, (size_t)mv_r_}, m.gate.data, m.up.data, (cl_ulong)gate_row,
         (cl_ulong)(gate_row * F), tasks_d, (cl_int)K, curq, (cl_int)E, h, (cl_int)F, counters_,
         (cl_int)(tails_ ? down_mode : -1), hq, shared ? m.shared_gate.data : nullptr,
         shared ? m.shared_up.data : nullptr, (cl_int)S);
  const float* down_in = tails_ ? hq : rounded_activations(m.down.type, h, Sx, F);
  // The norm's row in local memory (moe_down_add's `row`), beside its own ~9 KB.
  const bool norm_tail = next_w && tails_ && E * (int64_t)sizeof(float) <= (int64_t)info_.local_mem_bytes / 2;
  // The next norm rounded for the next layer's q/k/v product too (its weights' type as the last matmuls
  // saw it), so that product's rounding launch is skipped (rounded_activations finds it).
  const int next_mode = norm_tail ? preround_block_mode(E) : -1;
  float* next_q = next_mode >= 0 ? preround_buffer(n * E) : nullptr;
  check_mv_aligned(m.down.type, m.down.data, down_in);
  if (shared) check_mv_aligned(m.down.type, m.shared_down.data, down_in);
  launch(matmul_program(m.down.type).kernel("moe_down_add"), {groups(E, mv_r_) * mv_wg_, (size_t)(n * mv_r_)},
         {(size_t)mv_wg_, (size_t)mv_r_}, m.down.data, (cl_ulong)down_row, (cl_ulong)(down_row * E), tasks_d,
         weights_d, (cl_int)K, down_in, (cl_int)F, x, router_tail ? d : nullptr, (cl_int)router_tail,
         (cl_int)E, counters_, (cl_int)norm_tail, next_w, m.rms_eps, cur, (cl_int)next_mode, next_q,
         shared ? m.shared_down.data : nullptr, (cl_int)shared,
         LocalBytes{(size_t)(norm_tail ? E : 1) * sizeof(float)});
  if (next_mode >= 0) pre_ = {cur, next_q, n, E, next_mode};
  if (next_w && !norm_tail) rmsnorm(x, next_w, cur, n, E, m.rms_eps);
  ar.release(mark);
  return next_w ? Act::of(cur, n, E) : Act{};
}

}  // namespace xpert::opencl
