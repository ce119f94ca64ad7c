#include "backend/opencl/backend_impl.h"

#include <bit>

#include "backend/cpu/moe.h"

namespace xpert {
namespace opencl {

void* OpenclBackend::alloc(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  // A kept block of at least `bytes` and at most twice that.
  if (auto it = pool_.lower_bound(bytes); it != pool_.end() && it->first <= 2 * bytes) {
    void* p = it->second;
    pooled_bytes_ -= it->first;
    pool_.erase(it);
    return p;
  }
  if (bytes > info_.max_alloc_bytes)
    fail(
        "{}: one allocation of {:.2f} GiB exceeds the device's limit of {:.2f} GiB "
        "(CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
        name(), bytes / double(1ull << 30), info_.max_alloc_bytes / double(1ull << 30));
  void* p = api().clSVMAlloc(ctx_.get(), CL_MEM_READ_WRITE, bytes, 0);
  if (!p && pooled_bytes_) {
    release_pool();
    synchronize();  // the frees are enqueued: done before asking again
    p = api().clSVMAlloc(ctx_.get(), CL_MEM_READ_WRITE, bytes, 0);
  }
  if (!p)
    fail(
        "out of memory on {}: {:.2f} GiB asked, {:.2f} GiB in use of {:.2f} GiB (offload fewer layers: "
        "-ngl)",
        name(), bytes / double(1ull << 30), allocated_ / double(1ull << 30),
        info_.global_mem_bytes / double(1ull << 30));
  sizes_[p] = bytes;
  allocated_ += bytes;
  return p;
}

// The commands on the (in-order) queue that use p finish before any later command that reuses it starts.
void OpenclBackend::dealloc(void* p) {
  if (!p) return;
  pre_ = {};
  graphs_stale_ = true;
  auto it = sizes_.find(p);
  const size_t bytes = it != sizes_.end() ? it->second : 0;
  if (bytes && bytes <= kPoolMaxBlock && pooled_bytes_ + bytes <= pool_cap()) {
    pool_.emplace(bytes, p);
    pooled_bytes_ += bytes;
    return;
  }
  // Freed in queue order, after the commands that use p, without the host waiting for them (clSVMFree
  // would need a clFinish first).
  ++stats_.enqueues;
  XP_CL(clEnqueueSVMFree, q(), 1, &p, nullptr, nullptr, 0, nullptr, nullptr);
  if (it != sizes_.end()) {
    allocated_ -= bytes;
    sizes_.erase(it);
  }
}

void OpenclBackend::release_pool() {
  if (pool_.empty()) return;
  std::vector<void*> ptrs;
  for (auto& [bytes, p] : pool_) {
    ptrs.push_back(p);
    allocated_ -= bytes;
    sizes_.erase(p);
  }
  pool_.clear();
  pooled_bytes_ = 0;
  ++stats_.enqueues;
  XP_CL(clEnqueueSVMFree, q(), (cl_uint)ptrs.size(), ptrs.data(), nullptr, nullptr, 0, nullptr, nullptr);
}

// Batches of a layer wholly on the device route there: fewer than kMoeGemmMinRows tokens in
// moe_small_batch, more in moe_prefill (prefill.cpp; XPERT_OPENCL_OPTS prefill=0: here). Split layers and
// uniform routing route on the host (the router logits are n x n_expert floats), so the CPU's exact top-k and
// the routing statistics come for free; the rows are then grouped by expert as the CPU groups them. Experts
// with many rows (prefill) run the tiled kernel on their contiguous rows; the rest run in one batched gemv
// per matrix, each row with its own expert. Split layers (some experts on the host) run the host's share
// on the host's threads and add it.
void OpenclBackend::moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) {
  const int64_t X = m.n_expert, K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* logits_d = ar.take<float>(n * X);
  // The FFN norm's rounding of x, if it made one (the router's launch forgets it).
  const Prerounded xq = pre_;
  matmul(m.router, x, n, logits_d, X);
  if (!m.split && n < kMoeGemmMinRows && m.uniform_seed == 0) {  // (uniform routing: the host's router)
    // Every expert has fewer rows than the tiled kernel takes, so the host's grouping would send each row
    // to the batched gemv on its own anyway: route on the device and skip the two round trips. Like a
    // layer wholly on a CUDA GPU, its routing is not counted (m.stats).
    moe_small_batch(m, x, n, logits_d, out);
    ar.release(mark);
    return;
  }
  if (moe_prefill_fits(m, n)) {  // prefill: routed and grouped on the device too (prefill.cpp)
    moe_prefill(m, x, n, logits_d, out, xq);
    ar.release(mark);
    return;
  }
  thread_local std::vector<float> logits;
  logits.resize(n * X);
  copy_to_host(logits.data(), logits_d, logits.size() * sizeof(float));
  Routing r;
  cpu::route_top_k(logits.data(), n, m.router_params(), r);
  if (m.stats && m.layer >= 0) m.stats->add(m.layer, r.ids);

  const ExpertSplit* split = m.split;
  auto on_device = [&](int32_t e) { return !split || split->on_device[e]; };
  // Grouped rows: the device's slots, by expert, in slot order within an expert.
  std::vector<int32_t> offsets(X + 1, 0);
  for (int64_t s = 0; s < S; ++s)
    if (on_device(r.ids[s])) ++offsets[r.ids[s] + 1];
  for (int64_t e = 0; e < X; ++e) offsets[e + 1] += offsets[e];
  const int64_t G = offsets[X];
  std::vector<int32_t> row_slot(std::max<int64_t>(G, 1)), slot_row(S),
      fill(offsets.begin(), offsets.end() - 1);
  std::vector<float> weights(S);
  for (int64_t s = 0; s < S; ++s) {
    const int32_t e = r.ids[s];
    if (!on_device(e)) {
      slot_row[s] = -1;  // the host adds this slot
      continue;
    }
    const int32_t g = fill[e]++;
    row_slot[g] = (int32_t)s;
    slot_row[s] = g;
    weights[s] = r.weights[s];
  }
  std::vector<int32_t> tasks;  // (row, expert) of the rows of small experts
  for (int64_t e = 0; e < X; ++e) {
    const int32_t cnt = offsets[e + 1] - offsets[e];
    if (cnt > 0 && cnt < kMoeGemmMinRows && !split)
      for (int32_t g = offsets[e]; g < offsets[e + 1]; ++g) tasks.push_back(g), tasks.push_back((int32_t)e);
  }

  // The four tables in one upload (each blocking write drains the queue).
  thread_local std::vector<int32_t> tables;
  tables.clear();
  tables.insert(tables.end(), row_slot.begin(), row_slot.end());
  tables.insert(tables.end(), slot_row.begin(), slot_row.end());
  for (float w : weights) tables.push_back(std::bit_cast<int32_t>(w));
  tables.insert(tables.end(), tasks.begin(), tasks.end());
  int32_t* tables_d = ar.take<int32_t>((int64_t)tables.size());
  copy_from_host(tables_d, tables.data(), tables.size() * sizeof(int32_t));
  const int32_t* row_slot_d = tables_d;
  const int32_t* slot_row_d = row_slot_d + row_slot.size();
  const float* weights_d = reinterpret_cast<const float*>(slot_row_d + S);
  const int32_t* tasks_d = slot_row_d + 2 * S;

  const int64_t Gd = std::max<int64_t>(G, 1);
  float* xg = ar.take<float>(Gd * E);
  float* gate = ar.take<float>(Gd * F);
  float* up = ar.take<float>(Gd * F);
  float* yg = ar.take<float>(Gd * E);
  if (G > 0) {
    elementwise("moe_gather", G * E, x, row_slot_d, (cl_int)K, (cl_int)E, xg, (cl_long)(G * E));
    // One matrix of every expert: big experts tiled, small ones in one batched gemv.
    auto expert_matmul = [&](const Weight& w3, int w_index, const float* in, int64_t k_in, float* o,
                             int64_t n_o) {
      const size_t stride = row_bytes(w3.type, w3.ne[0]) * (size_t)w3.ne[1];
      const size_t mark_in = ar.mark();
      in = rounded_activations(w3.type, in, G, k_in);  // once for every expert of the matrix
      for (int64_t e = 0; e < X; ++e) {
        const int32_t g0 = offsets[e], cnt = offsets[e + 1] - offsets[e];
        if (cnt == 0 || (cnt < kMoeGemmMinRows && !split)) continue;
        const void* we = split ? (w_index == 0   ? split->gate[e]
                                  : w_index == 1 ? split->up[e]
                                                 : split->down[e])
                               : static_cast<const uint8_t*>(w3.data) + e * stride;
        const float* xe = in + (int64_t)g0 * k_in;
        float* ye = o + (int64_t)g0 * n_o;
        if (cnt <= kGemvMaxRows)
          gemv(w3.type, we, n_o, k_in, xe, k_in, cnt, ye, n_o, nullptr, 0, 0);
        else
          gemm(w3.type, we, n_o, k_in, xe, k_in, cnt, ye, n_o);
      }
      if (!tasks.empty())
        gemv(w3.type, w3.data, n_o, k_in, in, k_in, (int64_t)tasks.size() / 2, o, n_o, tasks_d,
             (int64_t)tasks.size() / 2, stride);
      ar.release(mark_in);
    };
    expert_matmul(m.gate, 0, xg, E, gate, F);
    expert_matmul(m.up, 1, xg, E, up, F);
    swiglu(gate, up, gate, G * F);
    expert_matmul(m.down, 2, gate, F, yg, E);
  }
  elementwise("moe_combine", n * E, yg, slot_row_d, weights_d, (cl_int)K, (cl_int)E, out, (cl_long)(n * E));

  if (split && G < S) {  // the host's experts, over the mmap, added in
    if (!host_pool_) fail("{}: a split MoE layer needs the host's threads", name());
    std::vector<bool> on_host(X);
    for (int64_t e = 0; e < X; ++e) on_host[e] = !split->on_device[e];
    thread_local std::vector<float> xh, yh;
    xh.resize(n * E);
    yh.resize(n * E);
    copy_to_host(xh.data(), x, xh.size() * sizeof(float));
    thread_local cpu::MoeScratch ms;
    cpu::moe_experts_partial(m.host_view(), xh.data(), n, r, on_host, yh.data(), false, ms, *host_pool_);
    float* yd = ar.take<float>(n * E);
    copy_from_host(yd, yh.data(), yh.size() * sizeof(float));
    add(out, yd, out, n * E);
  }
  ar.release(mark);
}

OpenclBackend::DeviceRouting OpenclBackend::route_on_device(const MoeFfn& m, int64_t n,
                                                            const float* logits_d) {
  const int64_t S = n * m.n_used;
  Arena& ar = scratch();
  DeviceRouting r;
  r.row_slot = ar.take<int32_t>(S);
  r.slot_row = ar.take<int32_t>(S);
  r.weights = ar.take<float>(S);
  r.tasks = ar.take<int32_t>(2 * S);
  const RouterParams rp = m.router_params();
  launch(ops("moe_route_slots"), {(size_t)n * kRedWg}, {kRedWg}, logits_d, (cl_int)m.n_expert,
         (cl_int)m.n_used, (cl_int)rp.norm_weights, rp.weights_scale, r.row_slot, r.slot_row, r.weights,
         r.tasks, (cl_int)n);
  return r;
}

// A decode-sized batch of a layer wholly on the device, routed by moe_route_slots: no host round trip.
void OpenclBackend::moe_small_batch(const MoeFfn& m, const float* x, int64_t n, const float* logits_d,
                                    float* out) {
  const int64_t K = m.n_used, E = m.n_embd, F = m.n_ff, S = n * K;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const DeviceRouting rt = route_on_device(m, n, logits_d);
  int32_t *row_slot_d = rt.row_slot, *slot_row_d = rt.slot_row, *tasks_d = rt.tasks;
  float* weights_d = rt.weights;
  float* xg = ar.take<float>(S * E);
  float* gate = ar.take<float>(S * F);
  float* up = ar.take<float>(S * F);
  float* yg = ar.take<float>(S * E);
  elementwise("moe_gather", S * E, x, row_slot_d, (cl_int)K, (cl_int)E, xg, (cl_long)(S * E));
  auto expert_matmul = [&](const Weight& w3, const float* in, int64_t k_in, float* o, int64_t n_o) {
    const size_t stride = row_bytes(w3.type, w3.ne[0]) * (size_t)w3.ne[1];
    const size_t mark_in = ar.mark();
    in = rounded_activations(w3.type, in, S, k_in);
    gemv(w3.type, w3.data, n_o, k_in, in, k_in, S, o, n_o, tasks_d, S, stride);
    ar.release(mark_in);
  };
  expert_matmul(m.gate, xg, E, gate, F);
  expert_matmul(m.up, xg, E, up, F);
  swiglu(gate, up, gate, S * F);
  expert_matmul(m.down, gate, F, yg, E);
  elementwise("moe_combine", n * E, yg, slot_row_d, weights_d, (cl_int)K, (cl_int)E, out, (cl_long)(n * E));
  ar.release(mark);
}

void OpenclBackend::gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                    float* conv_state, float* ssm_state, float* out) {
  const int64_t T = in.n_tokens, dk = s.head_k_dim, dv = s.head_v_dim;
  if (T <= 0) return;
  if (dk > kGdnMaxDk)
    fail("{}: Gated DeltaNet key heads of {} > {} are not supported", name(), dk, kGdnMaxDk);
  DeltaRuleForm form = gdn_form_;
  if (form == DeltaRuleForm::automatic)
    form = T >= kChunkedMinTokens ? DeltaRuleForm::chunked : DeltaRuleForm::recurrent;
  if (form == DeltaRuleForm::chunked) {
    // The prep kernel's group as large as it runs (kGdnChunk at least); the scan's: cb state columns by r row
    // slices, its block of S (dk x cb) in local memory. Narrow column blocks on a CPU: more groups for the
    // few heads of a layer (the scan is serial over chunks). The recurrent form where they do not fit.
    const int64_t prep_wg = kernel_max_group(gdn("delta_chunk_prep"), kGdnPrepWg);
    const int64_t r = (dk + kGdnSr - 1) / kGdnSr;
    const int64_t cb = std::min<int64_t>({dv, info_.is_cpu() ? 16 : kGdnScanCb, kGdnScanS / dk,
                                          kernel_max_group(gdn("delta_chunk_scan"), kGdnMaxWg) / r});
    if (prep_wg >= kGdnChunk && cb >= 1)
      return gdn_chunked(s, p, in, conv_state, ssm_state, out, prep_wg, r, cb);
  }
  gdn_recurrent(s, p, in, conv_state, ssm_state, out);
}

// One launch: each group (a value head) its own convolution, norms and gates, the delta rule in R row slices
// of kGdnNr rows by as many of the dv columns at once as the kernel's group allows, the gated norm, and
// (mode >= 0) the output rounded for ssm_out. Counters: the rounding's first, then one per key head for the
// convolution's state.
void OpenclBackend::gdn_recurrent(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                  float* conv_state, float* ssm_state, float* out) {
  const int64_t T = in.n_tokens, Hk = s.n_k_heads, Hv = s.n_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  cl_kernel rec = gdn("delta_rule_recurrent");
  const int64_t R = (dk + kGdnNr - 1) / kGdnNr,
                C = std::min<int64_t>(dv, kernel_max_group(rec, kGdnMaxWg) / R);
  if (C < 1)
    fail("{}: Gated DeltaNet key heads of {} need work-groups of {} (this device allows {})", name(), dk, R,
         kernel_max_group(rec, kGdnMaxWg));
  if (Hk > kCounters) fail("{}: Gated DeltaNet layers of more than {} key heads", name(), kCounters);
  int mode = head_round_mode(p.out_type, T, Hv, dv);
  if ((mode == 0 || mode == 1) && T * Hv + Hk > kCounters) mode = -1;
  const int64_t conv_counters = mode == 0 || mode == 1 ? T * Hv : 0;
  float* outq = mode >= 0 ? preround_buffer(T * Hv * dv) : nullptr;
  launch(rec, {(size_t)(Hv * C * R)}, {(size_t)(C * R)}, in.qkv, (cl_int)s.conv_dim(), p.conv1d,
         (cl_int)s.d_conv, conv_state, in.alpha, in.beta, p.dt_bias, p.a, ssm_state, out, (cl_int)T,
         (cl_int)Hk, (cl_int)Hv, (cl_int)dk, (cl_int)dv, p.norm, in.z, s.eps, (cl_int)R, (cl_int)mode, outq,
         counters_, counters_ + conv_counters);
  if (mode >= 0) pre_ = {out, outq, T, Hv * dv, mode};
}

// gdn_prep (the inputs of every head), delta_chunk_prep, delta_chunk_scan (groups of cb columns by r row
// slices), then the gated norm.
void OpenclBackend::gdn_chunked(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                float* conv_state, float* ssm_state, float* out, int64_t prep_wg, int64_t r,
                                int64_t cb) {
  const int64_t T = in.n_tokens, Hk = s.n_k_heads, Hv = s.n_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  const int64_t CD = s.conv_dim();
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* conv = ar.take<float>(T * CD);
  float* g = ar.take<float>(T * Hv);
  float* beta = ar.take<float>(T * Hv);
  // The convolution, q and k (the first 2 * key_dim channels) normalized per head, and the gates: one launch,
  // a group per q/k head and per kRedWg v channels, and per block of kGdnPrepTokens tokens (at least the
  // convolution's state rows: only the first block reads the state).
  const int64_t prep_groups = 2 * Hk + (int64_t)groups(CD - 2 * s.key_dim(), kRedWg);
  const int64_t block_tokens = std::max<int64_t>(kGdnPrepTokens, s.d_conv - 1);
  launch(gdn("gdn_prep"), {(size_t)prep_groups * kRedWg, groups(T, block_tokens)}, {kRedWg, 1}, in.qkv,
         (cl_int)T, (cl_int)block_tokens, (cl_int)CD, p.conv1d, (cl_int)s.d_conv, conv_state, conv,
         (cl_int)dk, (cl_int)Hk, s.eps, in.alpha, in.beta, p.dt_bias, p.a, (cl_int)Hv, g, beta);
  const float *q = conv, *k = conv + s.key_dim(), *v = conv + 2 * s.key_dim();
  // The workspace, per (chunk, value head) block: G, QK, u, w, q', QK u (kernels_gdn.h).
  const int64_t blocks = groups(T, kGdnChunk) * Hv, C = kGdnChunk;
  float* ws_g = ar.take<float>(blocks * C);
  float* ws_qk = ar.take<float>(blocks * C * C);
  float* ws_u = ar.take<float>(blocks * C * dv);
  float* ws_w = ar.take<float>(blocks * C * dk);
  float* ws_qp = ar.take<float>(blocks * C * dk);
  float* ws_qku = ar.take<float>(blocks * C * dv);
  launch(gdn("delta_chunk_prep"), {groups(T, kGdnChunk) * (size_t)prep_wg, (size_t)Hv}, {(size_t)prep_wg, 1},
         q, k, v, (cl_long)CD, (cl_long)CD, g, beta, (cl_int)T, (cl_int)Hk, (cl_int)Hv, (cl_int)dk,
         (cl_int)dv, ws_g, ws_qk, ws_u, ws_w, ws_qp, ws_qku);
  launch(gdn("delta_chunk_scan"), {groups(dv, cb) * (size_t)cb, (size_t)r, (size_t)Hv},
         {(size_t)cb, (size_t)r, 1}, k, (cl_long)CD, ssm_state, out, (cl_int)T, (cl_int)Hk, (cl_int)Hv,
         (cl_int)dk, (cl_int)dv, ws_g, ws_u, ws_w, ws_qp, ws_qku);
  launch(gdn("gated_rmsnorm"), {(size_t)(T * Hv) * kRedWg}, {kRedWg}, out, p.norm, in.z, (cl_int)dv, s.eps);
  ar.release(mark);
}

}  // namespace opencl

std::shared_ptr<Backend> make_opencl_backend(int opencl_index) {
  return std::make_shared<opencl::OpenclBackend>(opencl_index, DeltaRuleForm::automatic);
}
std::shared_ptr<Backend> make_opencl_backend(int opencl_index, DeltaRuleForm gdn_form) {
  return std::make_shared<opencl::OpenclBackend>(opencl_index, gdn_form);
}

}  // namespace xpert
