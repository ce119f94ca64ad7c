// CudaBackend (cuda_backend_impl.h): MoE layers: the entry points (moe_ffn, moe_ffn_add and the fused
// add_rmsnorm_moe_ffn_add), the routing, the experts' pointer tables and the unfused fallback. Experts split
// between the GPU and the host: cuda_moe_split.cpp.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "base/error.h"
#include "quant/dtype.h"

namespace xpert::cuda_impl {

void CudaBackend::moe_ffn(const MoeFfn& ffn, const float* x, int64_t n, float* out) {
  moe(ffn, Act::of(x, n, ffn.n_embd), out, false, false);
}

// The experts' down product adds into y itself (the same sum as an add after it) when every expert of
// the layer is here, the shared expert (Qwen3.5) riding along as one more slot at decode sizes
// (shared_slot); split layers and the rest take the default's steps (the host part or the shared expert
// added separately), x's form reaching the experts and the shared expert.
void CudaBackend::moe_ffn_add(const MoeFfn& ffn, const Act& x, float* y) {
  if (whole_moe_here(ffn, x.rows)) return moe(ffn, x, y, true, (bool)ffn.shared_up);
  const int64_t E = ffn.n_embd, n = x.rows;
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* t = ar.take<float>(n * E);
  moe(ffn, x, t, false, false);
  if (ffn.shared_up) add_shared_expert(ffn, x, t);
  add(t, y, y, n * E);
  ar.release(mark);
}

// The layer's experts, and its shared expert if it has one, all run in this backend's MoE kernels.
bool CudaBackend::whole_moe_here(const MoeFfn& ffn, int64_t n) {
  return !ffn.split && experts(ffn).fused && (!ffn.shared_up || shared_slot(ffn, n));
}

// One decode token whose whole MoE layer is here and whose router takes the fused form: the FFN norm
// inside the router's launch (cuda::RouterNorm: every block normalizes x + d itself and writes its share
// of cur and cur's q8_1), x + d added by the experts' down product (MoeRun::residual). The same bits as
// add_rmsnorm then moe_ffn_add; one launch fewer a layer. H200 tg128 against the norm's own launch
// (2026-12-01, five rounds in two calls): qwen3.5-35b-a3b 507.3 / 502.4, qwen3-30b-a3b even (549.3 /
// 551.2).
//
// With next_w, the next layer's input norm of x is the down product's last block (MoeNormOut): it
// writes cur and cur's q8_1 into the same slot: the returned Act, which the next layer's q/k/v products take.
// Without it, the norm's own launch after the experts. Leaving that launch out entirely (a
// probe with wrong output) measured qwen3-30b-a3b's tg128 7.5 % faster, qwen3.5-35b-a3b's 3.6 %; doing
// it in every CTA of the q/k/v products (XPERT_NORM_IN_QKV, 2026-12-01, since removed) 11 % and 21 %
// slower: ~1,280 CTAs each normalizing x for 4 rows of work. XPERT_NORM_IN_ROUTER and
// XPERT_NORM_AFTER_DOWN, the switches that turned both off, are gone (docs/PERF.md, 2026-12-03).
Act CudaBackend::add_rmsnorm_moe_ffn_add(const MoeFfn& ffn, const float* d, float* x, const float* w,
                                         float* cur, int64_t n, const float* next_w, const PartialSum* d_parts) {
  const int64_t E = ffn.n_embd;
  const cuda::MoeRouting routing{.n_expert = ffn.n_expert, .k = ffn.n_used};
  const bool fits = cuda::long_row_norm_fits(n, E) && whole_moe_here(ffn, n) &&
                    cuda::moe_router_fusable(ffn.router.type, n, E, routing);
  if (!fits) return Backend::add_rmsnorm_moe_ffn_add(ffn, d, x, w, cur, n, next_w, d_parts);
  // d still as decode_attention_proj's parts: the router adds them (and writes d) itself.
  const bool take = d_parts && d_parts->out == d && d_parts->n == E && d_parts->n_parts <= cuda::kMaxRouterParts;
  if (d_parts && !take) sum_parts(*d_parts);
  const cuda::Activations* act = prepare_slot(n, E);  // where the router writes cur's q8_1
  if (!act) return Backend::add_rmsnorm_moe_ffn_add(ffn, d, x, w, cur, n, next_w, take ? d_parts : nullptr);
  auto* q = static_cast<int8_t*>(const_cast<void*>(act->data));
  auto* ds = reinterpret_cast<float2*>(const_cast<float*>(act->aux));
  const cuda::RouterNorm nm{.res = x,
                            .d = d,
                            .w = w,
                            .eps = ffn.rms_eps,
                            .y = cur,
                            .q = q,
                            .ds = ds,
                            .parts = take ? d_parts->parts : nullptr,
                            .n_parts = take ? d_parts->n_parts : 0};
  cuda::MoeNormOut no;
  // GPTQ experts' down kernel has no norm inside (moe_norm_out_supported): the norm's own launch after it.
  const bool norm_inside = next_w && cuda::moe_norm_out_supported(experts(ffn).e);
  if (norm_inside) {  // fits: long_row_norm_fits, as for the router's norm
    if (!norm_done_.data()) {
      norm_done_ = DeviceBuffer(*this, sizeof(unsigned));
      XPERT_CUDA_CHECK(cudaMemset(norm_done_.data(), 0, sizeof(unsigned)));  // not a stream op: capturable
    }
    no = {.w = next_w,
          .eps = ffn.rms_eps,
          .y = cur,
          .q = q,
          .ds = ds,
          .done = static_cast<unsigned*>(norm_done_.data())};
  }
  moe(ffn, formed(cur, n, E, act), x, true, (bool)ffn.shared_up, &nm, d, no);
  if (!next_w) return Act{};
  return norm_inside ? formed(cur, n, E, act) : rmsnorm_act(x, next_w, cur, n, E, ffn.rms_eps);
}

// The layer's shared expert can be slot k of the decode kernels: the routed experts' block types and
// length, an f32 gate, a fused router.
bool CudaBackend::shared_slot(const MoeFfn& ffn, int64_t n) {
  const cuda::MoeRouting routing{.n_expert = ffn.n_expert, .k = ffn.n_used};
  return ffn.shared_up && experts(ffn).shared && n <= cuda::kMoeDecodeMaxTokens && ffn.n_used + 1 <= 32 &&
         ffn.shared_gate_inp.type == DType::F32 && ffn.shared_gate_inp.ne[0] == ffn.n_embd &&
         cuda::moe_router_fusable(ffn.router.type, n, ffn.n_embd, routing);
}

// nm: the router normalizes x itself and residual is added by the down product (add_rmsnorm_moe_ffn_add,
// which checks that the fused router and the decode experts take this layer).
void CudaBackend::moe(const MoeFfn& ffn, const Act& xa, float* out, bool accumulate, bool shared,
                      const cuda::RouterNorm* nm, const float* residual, const cuda::MoeNormOut& norm_out) {
  const float* x = xa.x;  // with nm, the router writes x and its form (xa's) first
  const int64_t n = xa.rows;
  const int64_t X = ffn.n_expert, k = ffn.n_used, slots = k + (shared ? 1 : 0);
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* logits = ar.take<float>(n * X);
  int32_t* ids = ar.take<int32_t>(n * slots);
  float* weights = ar.take<float>(n * slots);
  const cuda::MoeRouting routing{
      .n_expert = X,
      .k = k,
      .norm_weights = ffn.norm_weights,
      .weights_scale = ffn.weights_scale,
      .uniform_seed = ffn.uniform_seed};
  if (cuda::moe_router_fusable(ffn.router.type, n, ffn.n_embd, routing)) {
    if (!router_done_.data()) {
      router_done_ = DeviceBuffer(*this, sizeof(unsigned));
      XPERT_CUDA_CHECK(cudaMemset(router_done_.data(), 0, sizeof(unsigned)));  // not a stream op: capturable
    }
    cuda::moe_router(static_cast<const float*>(ffn.router.data), x, n, ffn.n_embd, routing, logits, ids,
                     weights, static_cast<unsigned*>(router_done_.data()), s(),
                     shared ? static_cast<const float*>(ffn.shared_gate_inp.data) : nullptr,
                     cuda::RouteForm::automatic, nm);
  } else {
    matmul(ffn.router, xa, logits, X);
    cuda::moe_route(logits, n, routing, ids, weights, s());
  }
  const ExpertTables& t = experts(ffn);
  if (ffn.split && t.fused) {
    moe_split(ffn, t.e, x, n, ids, weights, out);
    ar.release(mark);
    return;
  }
  if (!t.fused) {
    if (ffn.split) fail("this layer's experts cannot be split between the GPU and the host: {}", t.why_not);
    no_graphs_ = true;  // the unfused path reads the routing back to the host
    moe_unfused(ffn, xa, ids, weights, out);
    ar.release(mark);
    return;
  }
  const cuda::MoeExperts& e = t.e;
  const size_t ws = cuda::moe_workspace_bytes(e, n, slots);
  const cuda::Activations* xq = prepared(xa, ffn.n_embd, e.gate_type);
  cuda::moe_experts(e,
                    {.x = x,
                     .n_tokens = n,
                     .k = slots,
                     .ids = ids,
                     .weights = weights,
                     .out = out,
                     .accumulate = accumulate,
                     .path = shared || residual ? cuda::MoePath::decode : cuda::MoePath::automatic,
                     .xq = xq,
                     .residual = residual,
                     .norm_out = norm_out},
                    ws ? ar.take_bytes(ws) : nullptr, ws, s());
  ar.release(mark);
}

// The device tables of a layer's expert pointers, made on first use (all experts resident, or the
// layer's split).
const CudaBackend::ExpertTables& CudaBackend::experts(const MoeFfn& ffn) {
  const void* key = ffn.split ? (const void*)ffn.split : ffn.gate.data;
  auto it = expert_tables_.find(key);
  if (it != expert_tables_.end()) return it->second;
  const int64_t X = ffn.n_expert;
  const std::vector<bool> all(X, true);
  auto table = [&](const Weight& w) {
    const size_t bytes = row_bytes(w.type, w.ne[0]) * (size_t)w.ne[1];
    return cuda::expert_table(w.data, bytes, all);
  };
  ExpertTables t;
  std::vector<const void*> host, up, down;
  if (ffn.split) {
    host = ffn.split->gate, up = ffn.split->up, down = ffn.split->down;
  } else {
    host = table(ffn.gate), up = table(ffn.up), down = table(ffn.down);
    t.shared = ffn.shared_up && ffn.n_ff_shared == ffn.n_ff && ffn.shared_gate.type == ffn.gate.type &&
               ffn.shared_up.type == ffn.up.type && ffn.shared_down.type == ffn.down.type;
    if (t.shared) {
      host.push_back(ffn.shared_gate.data);
      up.push_back(ffn.shared_up.data);
      down.push_back(ffn.shared_down.data);
    }
  }
  const int64_t len = (int64_t)host.size();  // X, or X + 1 with the shared expert
  host.insert(host.end(), up.begin(), up.end());
  host.insert(host.end(), down.begin(), down.end());
  t.tables = DeviceBuffer(*this, host.size() * sizeof(void*));
  copy_from_host(t.tables.data(), host.data(), host.size() * sizeof(void*));  // pageable: staged at once
  const void* const* base = static_cast<const void* const*>(t.tables.data());
  t.e = {.gate_type = ffn.gate.type,
         .up_type = ffn.up.type,
         .down_type = ffn.down.type,
         .n_embd = ffn.n_embd,
         .n_ff = ffn.n_ff,
         .n_expert = X,
         .gate = base,
         .up = base + len,
         .down = base + 2 * len};
  if (!ffn.split) {  // the 3-D tensors, every expert here: the kernels compute the addresses
    t.e.gate_base = ffn.gate.data;
    t.e.up_base = ffn.up.data;
    t.e.down_base = ffn.down.data;
    t.e.gate_up_bytes = row_bytes(ffn.gate.type, ffn.gate.ne[0]) * (size_t)ffn.gate.ne[1];
    t.e.down_bytes = row_bytes(ffn.down.type, ffn.down.ne[0]) * (size_t)ffn.down.ne[1];
  }
  try {
    cuda::check_moe_experts(t.e);
  } catch (const Error& e) {
    t.fused = false;  // e.g. f16 experts: moe_unfused
    t.why_not = e.what();
  }
  return expert_tables_.emplace(key, std::move(t)).first->second;
}

// Experts the fused kernels do not take: token by token, slot by slot, with the plain matmul (the
// routing is read back to the host). Slow, but any weight type works; real checkpoints use the fused path.
void CudaBackend::moe_unfused(const MoeFfn& ffn, const Act& xa, const int32_t* ids_d, const float* weights_d,
                              float* out) {
  const float* x = xa.x;
  const int64_t n = xa.rows, k = ffn.n_used, E = ffn.n_embd, F = ffn.n_ff;
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k);
  copy_to_host(ids.data(), ids_d, ids.size() * sizeof(int32_t));
  copy_to_host(w.data(), weights_d, w.size() * sizeof(float));
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  float* gate = ar.take<float>(F);
  float* up = ar.take<float>(F);
  float* y = ar.take<float>(E);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const Act xt = n == 1 ? xa : Act::of(x + t * E, 1, E);  // one token: x's form
      matmul(expert_matrix(ffn.gate, e), xt, gate, 0);
      matmul(expert_matrix(ffn.up, e), xt, up, 0);
      cuda::swiglu(gate, up, gate, F, s());
      matmul(expert_matrix(ffn.down, e), gate, 1, y, 0);
      cuda::scale(y, w[t * k + j], E, s());
      if (j == 0)
        copy(out + t * E, y, E * sizeof(float));
      else
        cuda::add(out + t * E, y, out + t * E, E, s());
    }
  }
  ar.release(mark);
}

}  // namespace xpert::cuda_impl
