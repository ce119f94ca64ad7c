#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/host_transfer.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/trace.h"
#include "backend/cuda/weight_layout.h"
#include "backend/stream_share.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert {
namespace {

constexpr size_t align16(size_t bytes) { return (bytes + 15) & ~(size_t)15; }

// Batches of at least this many tokens stream a split layer's host experts to the GPU (see moe_split);
// measured on an H200 host (docs/PERF.md).
constexpr int64_t kDefaultStreamMinTokens = 64;
// A decode attention warp streams at least this many keys before another joins it (and a combine).
constexpr int32_t kDecodeMinKeys = 128;
// Up to this many keys a sequence, a decode step's attention is one block per KV head whose warps split
// the keys and combine them in the block (cuda::DecodeAttentionArgs::one_block): no combine launch.
constexpr int32_t kOneBlockMaxKeys = 512;
// Smaller batches copy part of the host experts they use and compute the rest on the host, at the same
// time: by default as many as balance the measured copy and host rates (backend/stream_share.h).

using cuda::detail::env_on;
bool env_is_1(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "1";
}

class CudaBackend final : public Backend, public DecodeFusions, public PassGraphs, public SplitExperts {
 public:
  DecodeFusions* decode_fusions() override { return this; }
  PassGraphs* pass_graphs() override { return this; }
  SplitExperts* split_experts() override { return this; }

  explicit CudaBackend(int device) : device_(device), pin_logits_(env_on("XPERT_PIN_LOGITS")) {
    const std::vector<cuda::DeviceInfo> devs = cuda::list_devices();
    if (devs.empty()) fail("no CUDA device: {}", cuda::no_device_reason());
    if (device < 0 || device >= (int)devs.size())
      fail("cuda:{} does not exist ({} CUDA device{})", device, devs.size(), devs.size() == 1 ? "" : "s");
    info_ = devs[device];
    XPERT_CUDA_CHECK(cudaSetDevice(device));
    stream_ = std::make_unique<cuda::Stream>();
    cuda::matmul_init();
  }
  ~CudaBackend() override {
    if (capturing_) abort_graph();
    cudaStreamSynchronize(s());  // host nodes in flight use this object
    if (cuda::detail::trace_enabled()) cuda::detail::trace_dump();
    step_times_.report();
    if (const std::string share = stream_share_.summary(); !share.empty()) log::info("stream share {}", share);
    for (auto& [key, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    drop_scratch();
    expert_tables_.clear();
    stream_buf_ = DeviceBuffer();  // frees through this object: before its members go
    prep_buf_ = DeviceBuffer();
    router_done_ = DeviceBuffer();
  }

  void set_expert_streaming(int64_t min_tokens, double share) override {
    if (min_tokens >= 0) stream_min_tokens_ = min_tokens;
    if (share >= 0) stream_share_.set(std::min(share, 1.0));
  }

  // Model::move_experts swapped experts of split layers: the pointer tables (expert_tables_, keyed by
  // the split), the host masks of the host nodes (split_calls_) and the graphs that baked both are
  // rebuilt on next use. clear_graphs waits for the stream first, so nothing in flight reads them.
  void on_experts_moved() override {
    if (capturing_) abort_graph();
    clear_graphs();
    stale_graphs_ = false;
    split_calls_.clear();
    expert_tables_.clear();
  }

  // A key seen once runs eagerly (it sizes the scratch); the second time it is recorded and run from the
  // graph; after that its ops are skipped and the graph replays.
  bool begin_graph(const std::string& key) override {
    if (no_graphs_ || capturing_ || skip_) return false;
    graph_pass_ = true;
    if (stale_graphs_) {
      clear_graphs();
      stale_graphs_ = false;
    }
    auto it = graphs_.find(key);
    if (it != graphs_.end() && it->second.exec) {
      step_times_.walk();
      skip_ = true;
      pending_ = &it->second;
      return true;
    }
    if (it == graphs_.end()) {
      if (graphs_.size() >= kMaxGraphs) clear_graphs();
      graphs_[key] = {};
      return false;
    }
    XPERT_CUDA_CHECK(cudaStreamBeginCapture(s(), cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    capture_key_ = key;
    return false;
  }

  void end_graph() override {
    settle();
    graph_pass_ = false;
    if (skip_) {
      skip_ = false;
      // The caller takes the outputs where the recording put them (the scratch arena's addresses): a
      // replay whose pass ended elsewhere would read the wrong memory.
      if (scratch().mark() != pending_->end_mark)
        fail("internal error: a decode graph's replay ends at scratch offset {}, its recording at {}",
             scratch().mark(), pending_->end_mark);
      step_times_.before(s());
      XPERT_CUDA_CHECK(cudaGraphLaunch(pending_->exec, s()));
      step_times_.after(s());
      return;
    }
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    XPERT_CUDA_CHECK(cudaStreamEndCapture(s(), &g));
    cudaGraphExec_t e = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
    cudaGraphDestroy(g);
    XPERT_CUDA_CHECK(err);
    XPERT_CUDA_CHECK(cudaGraphLaunch(e, s()));
    if (scratch().spilled()) {  // it recorded addresses that the next reset frees: use once
      synchronize();
      cudaGraphExecDestroy(e);
      graphs_.erase(capture_key_);
    } else {
      graphs_[capture_key_] = {.exec = e, .end_mark = scratch().mark()};
    }
  }

  void abort_graph() override {
    graph_pass_ = false;
    skip_ = false;
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s(), &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    graphs_.erase(capture_key_);
  }

  std::string name() const override { return fmt::format("cuda:{} ({})", device_, info_.name); }
  DeviceKind kind() const override { return DeviceKind::cuda; }
  cudaStream_t s() const { return stream_->get(); }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so the device stays usable
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("out of memory on {}: {:.2f} GiB asked, {:.2f} GiB free of {:.2f} GiB (offload fewer layers: -ngl)",
           name(), bytes / double(1ull << 30), free_b / double(1ull << 30), total_b / double(1ull << 30));
    }
    return p;
  }
  void dealloc(void* p) override { cudaFree(p); }
  void zero(void* p, size_t bytes) override {
    touch();
    XPERT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s()));
  }
  // Small copies (a decode step's ids and x) pass through a pinned ring outside graph recordings: one DMA
  // the driver need not stage from pageable memory.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    touch();
    if (bytes <= cuda::PinnedRing::kMaxCopy && !capturing_ && !graph_pass_) {
      void* staged = up_ring_.take(bytes, s());
      std::memcpy(staged, src, bytes);
      src = staged;
    }
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s()));
  }
  void upload_weight(void* dst, const Weight& w) override {
    touch();
    cuda::upload_weights(dst, w.data, w.n_bytes, w.type, w.ne[0], w.ne[1], s());
  }
  // A decode step's logits (600 KB for Qwen3's vocabulary) copied into pageable memory took ~80 us after
  // the graph had finished (H200, qwen3-30b-a3b, XPERT_STEP_TIMES=1: 1,701 us on the GPU, 1,796 from one
  // launch to the next). The sessions and the server register their logits (PinnedFloats) so the copy is
  // one DMA straight into them: tg128 +3 % (qwen3-30b-a3b) and +5 % (qwen3.5-35b-a3b), 2026-12-01; a copy
  // through a pinned staging buffer and a memcpy gained +0.5-1.5 % and is gone. XPERT_PIN_LOGITS=0 turns
  // the registration off.
  bool pin_host(void* p, size_t bytes) override {
    if (!pin_logits_) return false;
    if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) == cudaSuccess) return true;
    cudaGetLastError();  // a refusal (locked-memory limits) leaves the memory as it was
    return false;
  }
  void unpin_host(void* p) override {
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    settle();
    const auto t0 = std::chrono::steady_clock::now();
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s()));
    synchronize();
    step_times_.done(t0);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    touch();
    if (dst != src) XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s()));
  }
  void synchronize() override {
    settle();
    XPERT_CUDA_CHECK(cudaStreamSynchronize(s()));
    check_host_error();
  }
  size_t free_memory() const override {
    size_t free_b = 0, total_b = 0;
    XPERT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
  }

  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override {
    if (skip_) return;
    settle();
    const int64_t k = w.ne[0], n = w.ne[1];
    if (const cuda::Activations* a = prepared(x, m, k, w.type)) {
      cuda::matmul_prepared(w.type, w.data, n, *a, y, ldy ? ldy : n, s());
      if (overlaps(y, (size_t)(m * (ldy ? ldy : n)), x)) prepared_ = {};
      return;
    }
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::matmul_workspace_bytes(w.type, m, k);
    void* work = ws ? ar.take_bytes(ws) : nullptr;
    cuda::matmul(w.type, w.data, n, k, x, m, y, ldy ? ldy : n, work, ws, s());
    ar.release(mark);
  }
  // The jobs share one conversion of x per activation form (prefill: q, k and v convert x to f16 once);
  // at decode sizes the jobs of one weight type also share one launch.
  void matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) override {
    if (skip_) return;
    settle();
    const int64_t k = jobs.empty() ? 0 : jobs[0].w->ne[0];
    bool batched = true;  // an output over x would change what a later conversion reads
    for (const MatmulJob& j : jobs)
      batched = batched && j.w->ne[0] == k && !overlaps(j.y, (size_t)(m * (j.ldy ? j.ldy : j.w->ne[1])), x);
    if (!batched) {
      for (const MatmulJob& j : jobs) matmul(*j.w, x, m, j.y, j.ldy);
      return;
    }
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    std::vector<cuda::Activations> converted;
    auto activations = [&](DType t) {
      if (const cuda::Activations* p = prepared(x, m, k, t)) return *p;
      const cuda::ActFormat f = cuda::activation_format(t, m);
      for (const cuda::Activations& a : converted)
        if (a.format == f) return a;
      const size_t ws = cuda::activation_bytes(f, m, k);
      converted.push_back(cuda::quantize_activations(f, x, k, m, k, ws ? ar.take_bytes(ws) : nullptr, s()));
      return converted.back();
    };
    struct Group {
      DType t;
      cuda::MatmulOut outs[8];
      int count = 0;
    };
    std::vector<Group> groups;  // the jobs by weight type, in order of first use
    std::vector<bool> done(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (done[i]) continue;
      Group& g = groups.emplace_back();
      g.t = jobs[i].w->type;
      for (size_t j = i; j < jobs.size() && g.count < 8; ++j) {
        if (done[j] || jobs[j].w->type != g.t) continue;
        done[j] = true;
        g.outs[g.count++] = {.w = jobs[j].w->data,
                             .n = jobs[j].w->ne[1],
                             .y = jobs[j].y,
                             .ldy = jobs[j].ldy ? jobs[j].ldy : jobs[j].w->ne[1]};
      }
      cuda::check_matmul_shape(g.t, k);
    }
    // Two types of one decode row (a Q4_K_M layer's Q4_K q / k and Q6_K v) over the same activations: one
    // launch.
    if (groups.size() == 2 && groups[0].count <= 4 && groups[1].count <= 4) {
      const Group &g0 = groups[0], &g1 = groups[1];
      const cuda::Activations a0 = activations(g0.t), a1 = activations(g1.t);
      if (a0.data == a1.data && cuda::matmul_pair_supported(g0.t, g1.t, a0)) {
        cuda::matmul_prepared_pair(g0.t, g0.outs, g0.count, g1.t, g1.outs, g1.count, a0, s());
        ar.release(mark);
        return;
      }
    }
    for (const Group& g : groups) cuda::matmul_prepared_multi(g.t, g.outs, g.count, activations(g.t), s());
    ar.release(mark);
  }
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override {
    add_rmsnorm(nullptr, const_cast<float*>(x), w, y, rows, n, eps);  // without d, x is only read
  }
  // A decode-sized norm also writes its output's q8_1 activations, which the products that read it next
  // take instead of converting again (see prepared()).
  void add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                   float eps) override {
    if (skip_) return;
    touch();
    const cuda::Activations* act = prepare_slot(y, rows, n);
    int8_t* q = act ? static_cast<int8_t*>(const_cast<void*>(act->data)) : nullptr;
    auto* ds = act ? reinterpret_cast<float2*>(const_cast<float*>(act->aux)) : nullptr;
    cuda::add_rmsnorm_q8(d, x, n, w, y, n, rows, n, eps, q, ds, s());
    if (act) prepared_.x = y;
  }
  void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, const int32_t* pos,
                    int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_rot,
                    float freq_base, float freq_scale, RopeMode mode, float eps) override {
    if (skip_) return;
    touch();
    cuda::qk_norm_rope(q, k, q_norm, k_norm, q_norm != nullptr, k_norm != nullptr, pos, n_tokens, n_head,
                       n_head_kv, head_dim, n_rot, freq_base, freq_scale, mode, eps, s());
  }
  void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
            float freq_base, float freq_scale, RopeMode mode) override {
    if (skip_) return;
    touch();
    cuda::rope(x, pos, n_tokens, n_heads, head_dim, n_rot, freq_base, freq_scale, mode, s());
  }
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::swiglu(gate, up, y, n, s());
  }
  void geglu(const float* gate, const float* up, float* y, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::geglu(gate, up, y, n, s());
  }
  void add(const float* a, const float* b, float* y, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::add(a, b, y, n, s());
  }
  void scale(float* x, float v, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::scale(x, v, n, s());
  }
  void add_bias(float* x, const float* bias, int64_t rows, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::add_bias(x, bias, rows, n, s());
  }
  void mul_sigmoid(float* x, const float* gate, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::mul_sigmoid(x, gate, n, s());
  }
  void add_sigmoid_scaled(float* y, const float* v, const float* g, int64_t rows, int64_t n) override {
    if (skip_) return;
    touch();
    cuda::add_sigmoid_scaled(y, v, g, rows, n, s());
  }
  void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) override {
    if (skip_) return;
    touch();
    cuda::deinterleave(src, rows, width, a, b, s());
  }
  void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) override {
    if (skip_) return;
    touch();
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    int64_t* idx = ar.take<int64_t>((int64_t)rows.size());
    copy_from_host(idx, rows.data(), rows.size_bytes());
    if (x == y) {  // gather in place would race: go through a temporary
      float* tmp = ar.take<float>((int64_t)rows.size() * width);
      cuda::gather_rows(x, idx, (int64_t)rows.size(), width, tmp, s());
      copy(y, tmp, rows.size() * width * sizeof(float));
    } else {
      cuda::gather_rows(x, idx, (int64_t)rows.size(), width, y, s());
    }
    ar.release(mark);
  }
  void store_kv(const float* x, void* dst, int64_t n, DType type) override {
    if (skip_) return;
    touch();
    if (type == DType::F16) return cuda::store_f16(x, static_cast<uint16_t*>(dst), n, s());
    cuda::store_kv(x, n / 32, 32, type, dst, 0, nullptr, nullptr, s());  // n / 32 contiguous blocks
  }
  void attention(const AttentionArgs& a) override {
    if (skip_) return;
    touch();
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::attention_workspace_bytes(a);
    cuda::attention(a, ws ? ar.take_bytes(ws) : nullptr, s());
    ar.release(mark);
  }

  // One launch stores k/v (after d.prep's norms and RoPE, for an f16 cache), then the split attention;
  // its combine step also writes the q8_1 activations the output projection takes (prepared()).
  // Qwen3.5's q and output gate read where the projection leaves them interleaved, the combine applying the
  // gate as it writes: no deinterleave or mul_sigmoid launch, no q8_1 conversion of its own for the output
  // projection (+2 % tg on qwen3.5, docs/PERF.md).
  bool fuses_attention_gate() const override { return true; }
  // 1: every sequence sees fewer than kOneBlockMaxKeys keys: a block per KV head splits them among its
  // warps and combines them itself, with no combine launch.
  int decode_attention_form(int32_t max_pos) const override {
    return max_pos >= 0 && max_pos < kOneBlockMaxKeys ? 1 : 0;
  }
  bool decode_attention(const DecodeAttention& d) override { return attend_decode(d, nullptr, nullptr); }
  // The attention and its output projection as one launch (cuda::DecodeAttentionArgs::Proj) where it fits:
  // proj then owes the sum of its head groups' parts (owed_), which the router adds itself when the layer's
  // FFN is add_rmsnorm_moe_ffn_add's fused form, and settle() otherwise.
  bool decode_attention_proj(const DecodeAttention& d, const Weight& wo, float* proj) override {
    if (skip_) return true;
    // The cheap checks, before the parts' buffer is made; cuda::attention_decode_proj_fits decides.
    if (!d.prep || d.n_seq != 1 || d.gate || wo.type != DType::Q4_K || wo.ne[0] != d.n_head * d.head_dim ||
        decode_attention_form(d.max_pos) != 1)
      return false;
    const size_t need = (size_t)(cuda::attention_decode_proj_parts(d.n_head) * wo.ne[1]) * sizeof(float);
    if (parts_buf_.size() < need) {
      if (capturing_) return false;
      stale_graphs_ = true;
      synchronize();
      parts_buf_ = DeviceBuffer(*this, need);
    }
    return attend_decode(d, &wo, proj);
  }
  // decode_attention; with wo, the fused projection into proj, or false (nothing done) where it does not fit.
  bool attend_decode(const DecodeAttention& d, const Weight* wo, float* proj) {
    if (skip_) return true;
    touch();
    if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256) {
      no_graphs_ = true;  // the per-sequence kernels bake positions in: no graphs for this model
      return false;
    }
    const int64_t row = d.n_head_kv * d.head_dim;
    auto* q = const_cast<float*>(d.q);  // prep may normalize and rotate q in place (Backend's contract)
    auto* k = const_cast<float*>(d.k);
    const QkPrep* pr = d.prep;
    const bool f16 = d.k_type == DType::F16 && d.v_type == DType::F16;
    // The attention normalizes, rotates and stores q / k / v (DecodeAttentionArgs::prep): inside its blocks
    // where its form can, else by qk_norm_rope_store_f16 first.
    const bool hand_prep = pr && f16;
    if (wo && !hand_prep) return false;
    cuda::DecodeAttentionArgs::QkPrep prep{};
    if (hand_prep) {
      prep = {.k = d.k,
              .v = d.v,
              .q_norm = pr->q_norm,
              .k_norm = pr->k_norm,
              .n_rot = pr->n_rot,
              .freq_base = pr->freq_base,
              .freq_scale = pr->freq_scale,
              .eps = pr->eps,
              .mode = pr->mode};
    } else {
      if (pr)
        cuda::qk_norm_rope(q, k, pr->q_norm, pr->k_norm, pr->q_norm != nullptr, pr->k_norm != nullptr,
                           pr->pos, d.n_seq, d.n_head, d.n_head_kv, d.head_dim, pr->n_rot, pr->freq_base,
                           pr->freq_scale, pr->mode, pr->eps, s(), d.q_stride);
      cuda::store_kv(d.k, d.n_seq, row, d.k_type, d.k_cache, d.slot_stride, d.slots, d.pos, s());
      cuda::store_kv(d.v, d.n_seq, row, d.v_type, d.v_cache, d.slot_stride, d.slots, d.pos, s());
    }
    cuda::DecodeAttentionArgs a{.q = d.q,
                                .k = d.k_cache,
                                .v = d.v_cache,
                                .slot_stride = d.slot_stride,
                                .slots = d.slots,
                                .pos = d.pos,
                                .out = d.out,
                                .n_seq = d.n_seq,
                                .n_head = d.n_head,
                                .n_head_kv = d.n_head_kv,
                                .head_dim = d.head_dim,
                                .max_kv = d.n_ctx,
                                .kq_scale = d.kq_scale,
                                .sliding_window = d.sliding_window,
                                .min_keys_per_split = kDecodeMinKeys,
                                .k_type = d.k_type,
                                .v_type = d.v_type,
                                .gate = d.gate,
                                .gate_stride = d.gate_stride,
                                .q_stride = d.q_stride,
                                .one_block = decode_attention_form(d.max_pos) == 1,
                                .prep = hand_prep ? &prep : nullptr};
    cuda::DecodeAttentionArgs::Proj pj{};
    if (wo) {  // nothing is launched yet: a projection that does not fit declines the whole call
      pj = {.w = wo->data,
            .type = wo->type,
            .n_out = wo->ne[1],
            .parts = static_cast<float*>(parts_buf_.data())};
      a.proj = &pj;
      if (!cuda::attention_decode_proj_fits(a)) return false;
      cuda::attention_decode(a, nullptr, s());
      owed_ = {.out = proj, .n_parts = (int)cuda::attention_decode_proj_parts(d.n_head), .n = wo->ne[1]};
      return true;
    }
    const int64_t out_k = d.n_head * d.head_dim;
    const cuda::Activations* out_act = prepare_slot(d.out, d.n_seq, out_k);
    if (out_act) {
      a.out_q = static_cast<int8_t*>(const_cast<void*>(out_act->data));
      a.out_ds = reinterpret_cast<float2*>(const_cast<float*>(out_act->aux));
    }
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::attention_decode_workspace_bytes(a);
    cuda::attention_decode(a, ws ? ar.take_bytes(ws) : nullptr, s());
    ar.release(mark);
    if (out_act) prepared_.x = d.out;  // valid once the launch is in the stream
    return true;
  }

  void moe_ffn(const MoeFfn& ffn, const float* x, int64_t n, float* out) override {
    moe(ffn, x, n, out, false, false);
  }
  // The experts' down product adds into y itself (the same sum as an add after it) when every expert of
  // the layer is here, the shared expert (Qwen3.5) riding along as one more slot at decode sizes
  // (shared_slot); split layers and the rest take the default (the host part or the shared expert added
  // separately).
  void moe_ffn_add(const MoeFfn& ffn, const float* x, int64_t n, float* y) override {
    if (skip_) return;
    if (!whole_moe_here(ffn, n)) return Backend::moe_ffn_add(ffn, x, n, y);
    moe(ffn, x, n, y, true, (bool)ffn.shared_up);
  }
  // The layer's experts, and its shared expert if it has one, all run in this backend's MoE kernels.
  bool whole_moe_here(const MoeFfn& ffn, int64_t n) {
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
  // writes cur and cur's q8_1 into the same slot, which the next layer's q/k/v products take (prepared()).
  // Without it, the norm's own launch after the experts. Leaving that launch out entirely (a
  // probe with wrong output) measured qwen3-30b-a3b's tg128 7.5 % faster, qwen3.5-35b-a3b's 3.6 %; doing
  // it in every CTA of the q/k/v products (XPERT_NORM_IN_QKV, 2026-12-01, since removed) 11 % and 21 %
  // slower: ~1,280 CTAs each normalizing x for 4 rows of work. XPERT_NORM_IN_ROUTER and
  // XPERT_NORM_AFTER_DOWN, the switches that turned both off, are gone (docs/PERF.md, 2026-12-03).
  void add_rmsnorm_moe_ffn_add(const MoeFfn& ffn, const float* d, float* x,
                               const float* w, float* cur, int64_t n, const float* next_w) override {
    if (skip_) return;
    const int64_t E = ffn.n_embd;
    const cuda::MoeRouting routing{.n_expert = ffn.n_expert, .k = ffn.n_used};
    const bool fits = cuda::long_row_norm_fits(n, E) && whole_moe_here(ffn, n) &&
                      cuda::moe_router_fusable(ffn.router.type, n, E, routing);
    if (!fits) return Backend::add_rmsnorm_moe_ffn_add(ffn, d, x, w, cur, n, next_w);
    // d still owed as decode_attention_proj's parts: the router adds them (and writes d) itself.
    const bool take = owed_.out == d && owed_.n == E && owed_.n_parts <= cuda::kMaxRouterParts;
    const OwedSum owed = take ? std::exchange(owed_, {}) : OwedSum{};
    touch();
    const cuda::Activations* act = prepare_slot(cur, n, E);  // where the router writes cur's q8_1
    if (!act) {
      if (take) owed_ = owed;  // settled by the path below
      return Backend::add_rmsnorm_moe_ffn_add(ffn, d, x, w, cur, n, next_w);
    }
    auto* q = static_cast<int8_t*>(const_cast<void*>(act->data));
    auto* ds = reinterpret_cast<float2*>(const_cast<float*>(act->aux));
    const cuda::RouterNorm nm{.res = x,
                              .d = d,
                              .w = w,
                              .eps = ffn.rms_eps,
                              .y = cur,
                              .q = q,
                              .ds = ds,
                              .parts = take ? static_cast<const float*>(parts_buf_.data()) : nullptr,
                              .n_parts = owed.n_parts};
    cuda::MoeNormOut no;
    if (next_w) {  // fits: long_row_norm_fits, as for the router's norm
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
    moe(ffn, cur, n, x, true, (bool)ffn.shared_up, &nm, d, no);
  }
  // The layer's shared expert can be slot k of the decode kernels: the routed experts' block types and
  // length, an f32 gate, a fused router.
  bool shared_slot(const MoeFfn& ffn, int64_t n) {
    const cuda::MoeRouting routing{.n_expert = ffn.n_expert, .k = ffn.n_used};
    return ffn.shared_up && experts(ffn).shared && n <= cuda::kMoeDecodeMaxTokens &&
           ffn.n_used + 1 <= 32 && ffn.shared_gate_inp.type == DType::F32 &&
           ffn.shared_gate_inp.ne[0] == ffn.n_embd &&
           cuda::moe_router_fusable(ffn.router.type, n, ffn.n_embd, routing);
  }
  // nm: the router normalizes x itself and residual is added by the down product (add_rmsnorm_moe_ffn_add,
  // which checks that the fused router and the decode experts take this layer).
  void moe(const MoeFfn& ffn, const float* x, int64_t n, float* out,
           bool accumulate, bool shared, const cuda::RouterNorm* nm = nullptr,
           const float* residual = nullptr, const cuda::MoeNormOut& norm_out = {}) {
    if (skip_) return;
    settle();  // it does not touch: x may be prepared activations
    const int64_t X = ffn.n_expert, k = ffn.n_used, slots = k + (shared ? 1 : 0);
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    float* logits = ar.take<float>(n * X);
    int32_t* ids = ar.take<int32_t>(n * slots);
    float* weights = ar.take<float>(n * slots);
    const cuda::MoeRouting routing{.n_expert = X, .k = k, .norm_weights = ffn.norm_weights,
                                   .weights_scale = ffn.weights_scale};
    if (cuda::moe_router_fusable(ffn.router.type, n, ffn.n_embd, routing)) {
      if (!router_done_.data()) {
        router_done_ = DeviceBuffer(*this, sizeof(unsigned));
        XPERT_CUDA_CHECK(cudaMemset(router_done_.data(), 0, sizeof(unsigned)));  // not a stream op: capturable
      }
      cuda::moe_router(static_cast<const float*>(ffn.router.data), x, n, ffn.n_embd, routing, logits, ids,
                       weights, static_cast<unsigned*>(router_done_.data()), s(),
                       shared ? static_cast<const float*>(ffn.shared_gate_inp.data) : nullptr,
                       cuda::RouteForm::automatic, nm);
      if (nm) prepared_.x = nm->y;
    } else {
      matmul(ffn.router, x, n, logits, X);
      cuda::moe_route(logits, n, routing, ids, weights, s());
    }
    const ExpertTables& t = experts(ffn);
    if (ffn.split && t.fused) {
      moe_split(ffn, t.e, x, n, ids, weights, out);
      ar.release(mark);
      return;
    }
    if (!t.fused) {
      if (ffn.split)
        fail("this layer's experts cannot be split between the GPU and the host: {}", t.why_not);
      no_graphs_ = true;  // the unfused path reads the routing back to the host
      moe_unfused(ffn, x, n, ids, weights, out);
      ar.release(mark);
      return;
    }
    const cuda::MoeExperts& e = t.e;
    const size_t ws = cuda::moe_workspace_bytes(e, n, slots);
    const cuda::Activations* xq = prepared(x, n, ffn.n_embd, e.gate_type);
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
    if (overlaps(out, (size_t)(n * ffn.n_embd), x)) prepared_ = {};
  }

  void gated_delta_net(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                       float* ssm_state, float* out) override {
    if (skip_) return;
    touch();
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::gated_delta_net_workspace_bytes(gs, in.n_tokens);
    // At decode sizes the gated norm also writes out's q8_1 activations, for the output projection.
    const cuda::Activations* act =
        gs.head_v_dim % 32 == 0 ? prepare_slot(out, in.n_tokens, gs.value_dim()) : nullptr;
    int8_t* q = act ? static_cast<int8_t*>(const_cast<void*>(act->data)) : nullptr;
    auto* ds = act ? reinterpret_cast<float2*>(const_cast<float*>(act->aux)) : nullptr;
    cuda::gated_delta_net(gs, p, in, conv_state, ssm_state, out, ws ? ar.take_bytes(ws) : nullptr, s(),
                          DeltaRuleForm::automatic, q, ds);
    ar.release(mark);
    if (act) prepared_.x = out;
  }

 private:
  // The q8_1 activations of the last decode-sized norm output (prep_buf_), valid until any op other than
  // a product that reads it writes memory: every other op calls touch(). Products of `x` with m rows of
  // k and a weight type whose decode form is q8_1 take them instead of converting x again.
  struct Prepared {
    const float* x = nullptr;
    cuda::Activations act;
  };
  void touch() {
    settle();
    prepared_ = {};
  }
  // The sum decode_attention_proj left owed: its parts in parts_buf_, out = their sum (cuda::sum_parts).
  // Every op but the router that takes them (add_rmsnorm_moe_ffn_add) settles it first: touch() and the ops
  // that do not touch.
  struct OwedSum {
    float* out = nullptr;
    int n_parts = 0;
    int64_t n = 0;
  };
  void settle() {
    if (!owed_.out) return;
    const OwedSum o = std::exchange(owed_, {});
    cuda::sum_parts(static_cast<const float*>(parts_buf_.data()), o.n_parts, o.n, o.out, s());
  }
  // Room in prep_buf_ for the q8_1 activations of rows x k (decode sizes, k % 32 == 0): describes them
  // in prepared_.act (prepared_.x stays null until the producer is launched), or null without room. The
  // buffer grows outside a capture only; graphs recorded with the old one are dropped.
  const cuda::Activations* prepare_slot(const float* x, int64_t rows, int64_t k) {
    if (rows > cuda::kDecodeMaxRows || k % 32 != 0 || !x) return nullptr;
    const size_t qb = cuda::activation_bytes(cuda::ActFormat::q8_1, rows, k);
    if (prep_buf_.size() < qb) {
      if (capturing_) return nullptr;
      stale_graphs_ = true;
      synchronize();
      prep_buf_ = DeviceBuffer(*this, std::max(qb, prep_buf_.size() * 2));
    }
    auto* q = static_cast<int8_t*>(prep_buf_.data());
    auto* ds = reinterpret_cast<float2*>(q + cuda::Workspace::round((size_t)(rows * k)));
    prepared_ = {.x = nullptr, .act = {.format = cuda::ActFormat::q8_1, .data = q,
                                       .aux = reinterpret_cast<const float*>(ds), .m = rows, .k = k}};
    return &prepared_.act;
  }
  const cuda::Activations* prepared(const float* x, int64_t m, int64_t k, DType w_type) const {
    if (!prepared_.x || prepared_.x != x || prepared_.act.m != m || prepared_.act.k != k) return nullptr;
    if (!cuda::matmul_supported(w_type) || cuda::activation_format(w_type, m) != cuda::ActFormat::q8_1)
      return nullptr;
    return &prepared_.act;
  }
  static bool overlaps(const float* y, size_t n, const float* x) { return x >= y && x < y + n; }

  // Experts split between this GPU and the host. Small batches (decode) are driven by the stream, so a
  // decode step stays one CUDA graph: a second stream waits for the routing, copies ids, weights and x
  // to pinned host memory and calls the host's threads from a host node (moe_experts_partial over the
  // mmap); meanwhile the main stream computes the resident experts, then waits for the host's sum,
  // uploads it and adds it. Batches of stream_min_tokens_ or more instead copy the host experts they use
  // to the GPU and run every expert there (moe_streamed): a batch then reads each host expert once over
  // PCIe instead of the CPU computing hundreds of rows of it.
  struct SplitCall {
    CudaBackend* self;
    MoeFfn host;  // the layer with its host experts (host_view); stats: the pass that recorded the graph
    int64_t n;
    std::vector<bool> on_host;
  };
  void moe_split(const MoeFfn& ffn, const cuda::MoeExperts& e, const float* x, int64_t n,
                 const int32_t* ids_d, const float* weights_d, float* out) {
    if (!host_pool_) fail("{}: a split MoE layer needs the host's threads", name());
    // Streaming needs the routing on the host before it can copy: not in a graph.
    if (!graph_pass_ && stream_min_tokens_ > 0 && n >= stream_min_tokens_) {
      moe_streamed(ffn, e, x, n, ids_d, weights_d, out, true);
      return;
    }
    if (stream_share_.is_auto() || stream_share_.fixed() > 0) {
      no_graphs_ = true;  // every step then waits for its routing
      if (!graph_pass_) {
        moe_streamed(ffn, e, x, n, ids_d, weights_d, out, false);
        return;
      }
    }
    const int64_t k = ffn.n_used, E = ffn.n_embd;
    const size_t ids_b = n * k * sizeof(int32_t), w_b = n * k * sizeof(float), x_b = n * E * sizeof(float);
    // The copies bake these addresses into recorded graphs: when a buffer moves, drop the graphs.
    void* const in0 = split_in_.data();
    void* const out0 = split_out_.data();
    auto* in = static_cast<uint8_t*>(split_in_.get(ids_b + w_b + x_b, s()));
    auto* yh = static_cast<float*>(split_out_.get(x_b, s()));
    if ((in0 && in != in0) || (out0 && yh != out0)) stale_graphs_ = true;
    SplitCall& call = split_call(ffn, n);
    call.host.stats = ffn.stats;  // a replayed graph counts into the pass that recorded it
    // The thread that launched the step spins in its wait for the step's end meanwhile (the lowest
    // latency for the step): the host node gets the other cores. One thread more measured 1.5x slower.
    node_threads();
    cudaStream_t aux = aux_stream();
    XPERT_CUDA_CHECK(cudaEventRecord(fork_.get(), s()));
    XPERT_CUDA_CHECK(cudaStreamWaitEvent(aux, fork_.get(), 0));
    XPERT_CUDA_CHECK(cudaMemcpyAsync(in, ids_d, ids_b, cudaMemcpyDeviceToHost, aux));
    XPERT_CUDA_CHECK(cudaMemcpyAsync(in + ids_b, weights_d, w_b, cudaMemcpyDeviceToHost, aux));
    XPERT_CUDA_CHECK(cudaMemcpyAsync(in + ids_b + w_b, x, x_b, cudaMemcpyDeviceToHost, aux));
    XPERT_CUDA_CHECK(cudaLaunchHostFunc(aux, &CudaBackend::host_experts, &call));
    XPERT_CUDA_CHECK(cudaEventRecord(join_.get(), aux));
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    const size_t ws = cuda::moe_workspace_bytes(e, n, k);
    cuda::moe_experts(e, {.x = x, .n_tokens = n, .k = k, .ids = ids_d, .weights = weights_d, .out = out,
                          .accumulate = false, .path = cuda::MoePath::automatic},
                      ws ? ar.take_bytes(ws) : nullptr, ws, s());
    XPERT_CUDA_CHECK(cudaStreamWaitEvent(s(), join_.get(), 0));
    float* yd = ar.take<float>(n * E);
    XPERT_CUDA_CHECK(cudaMemcpyAsync(yd, yh, x_b, cudaMemcpyHostToDevice, s()));
    cuda::add(out, yd, out, n * E, s());
    ar.release(mark);
  }

  // The host node of moe_split, on a CUDA driver thread (no CUDA calls here). The main thread is then
  // waiting for the step, so the host pool is free.
  static void CUDART_CB host_experts(void* p) {
    auto* call = static_cast<SplitCall*>(p);
    CudaBackend& b = *call->self;
    try {
      const MoeFfn& host = call->host;
      const int64_t n = call->n, k = host.n_used;
      const auto* in = static_cast<const uint8_t*>(b.split_in_.data());
      thread_local Routing r;
      r.n_tokens = n;
      r.k = k;
      const auto* ids = reinterpret_cast<const int32_t*>(in);
      const auto* w = reinterpret_cast<const float*>(in + n * k * sizeof(int32_t));
      r.ids.assign(ids, ids + n * k);
      r.weights.assign(w, w + n * k);
      const auto* x = reinterpret_cast<const float*>(in + 2 * n * k * sizeof(int32_t));
      if (host.stats && host.layer >= 0) host.stats->add(host.layer, r.ids);
      thread_local cpu::MoeScratch ms;
      cpu::moe_experts_partial(host, x, n, r, call->on_host, static_cast<float*>(b.split_out_.data()), false, ms,
                               *b.node_pool_);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(b.host_error_mutex_);
      if (b.host_error_.empty()) b.host_error_ = e.what();
    }
  }

  // The pool of host nodes: one thread fewer than the host's (the caller of run() is one of
  // them), since the thread that launched the step spins in its wait meanwhile (the lowest latency for the
  // step; one thread more measured 1.5x slower).
  ThreadPool& node_threads() {
    const int n = std::max(1, host_pool_->size() - 1);
    if (!node_pool_ || (node_pool_->size() != n && !capturing_)) {
      if (node_pool_) synchronize();  // a host node may be running on it
      node_pool_ = std::make_unique<ThreadPool>(n);
    }
    return *node_pool_;
  }

  SplitCall& split_call(const MoeFfn& ffn, int64_t n) {
    auto& slot = split_calls_[{ffn.split, n}];
    if (!slot) {
      slot = std::make_unique<SplitCall>(SplitCall{.self = this, .host = ffn.host_view(), .n = n, .on_host = {}});
      slot->on_host.resize(ffn.n_expert);
      for (int64_t i = 0; i < ffn.n_expert; ++i) slot->on_host[i] = !ffn.split->on_device[i];
    }
    return *slot;
  }

  cudaStream_t aux_stream() {
    if (!aux_) aux_ = std::make_unique<cuda::Stream>();
    return aux_->get();
  }

  // A host node that failed: its error, raised on the caller's thread at the next wait.
  void check_host_error() {
    std::lock_guard<std::mutex> lock(host_error_mutex_);
    if (host_error_.empty()) return;
    const std::string e = std::move(host_error_);
    host_error_.clear();
    fail("host experts: {}", e);
  }

  // The batch's routing comes to the host; of the host experts it uses, those with the most rows are
  // copied into a device buffer (how many: stream_share_) and run on the GPU with the resident ones (one
  // fused MoE over a table of resident and copied experts; the others null: absent), while the host's
  // threads compute the rest from the mmap at the same time. copy_all: every used host expert is copied
  // (prefill).
  void moe_streamed(const MoeFfn& ffn, const cuda::MoeExperts& e, const float* x,
                    int64_t n, const int32_t* ids_d, const float* weights_d, float* out, bool copy_all) {
    const int64_t k = ffn.n_used, X = ffn.n_expert, E = ffn.n_embd;
    const bool host_part = !copy_all;
    const size_t ids_b = n * k * sizeof(int32_t), w_b = n * k * sizeof(float), x_b = n * E * sizeof(float);
    auto* in = static_cast<uint8_t*>(split_in_.get(ids_b + w_b + x_b, s()));
    XPERT_CUDA_CHECK(cudaMemcpyAsync(in, ids_d, ids_b, cudaMemcpyDeviceToHost, s()));
    if (host_part) {
      XPERT_CUDA_CHECK(cudaMemcpyAsync(in + ids_b, weights_d, w_b, cudaMemcpyDeviceToHost, s()));
      XPERT_CUDA_CHECK(cudaMemcpyAsync(in + ids_b + w_b, x, x_b, cudaMemcpyDeviceToHost, s()));
    }
    XPERT_CUDA_CHECK(cudaEventRecord(fork_.get(), s()));
    XPERT_CUDA_CHECK(cudaEventSynchronize(fork_.get()));
    check_host_error();
    report_copy_times();  // the previous call's copies and MoE are done
    const auto* ids = reinterpret_cast<const int32_t*>(in);
    if (ffn.stats && ffn.layer >= 0) ffn.stats->add(ffn.layer, std::span<const int32_t>(ids, n * k));

    // The used host experts, most rows first; the first `share` of them are copied.
    std::vector<int64_t> rows(X, 0);
    for (int64_t i = 0; i < n * k; ++i) ++rows[ids[i]];
    std::vector<int32_t> used;
    for (int64_t i = 0; i < X; ++i)
      if (rows[i] > 0 && !ffn.split->on_device[i]) used.push_back((int32_t)i);
    std::stable_sort(used.begin(), used.end(), [&](int32_t a, int32_t b) { return rows[a] > rows[b]; });
    const MoeFfn hw = ffn.host_view();
    const Weight* mats[3] = {&hw.gate, &hw.up, &hw.down};
    size_t per_expert = 0, staged = 0;  // staged: the largest matrix converted on the device
    for (const Weight* w : mats) {
      const size_t matrix = row_bytes(w->type, w->ne[0]) * (size_t)w->ne[1];
      per_expert += align16(matrix);
      if (cuda::device_layout_differs(w->type)) staged = std::max(staged, matrix);
      pins_.pin(w->data, matrix * (size_t)w->ne[2]);
    }
    size_t n_copy = used.size();
    if (host_part) {
      std::lock_guard<std::mutex> lock(share_mutex_);
      n_copy = (size_t)stream_share_.copies((int64_t)used.size(), per_expert);
    }
    std::vector<bool> copied(X, false), on_cpu(X, false);
    for (size_t i = 0; i < used.size(); ++i) (i < n_copy ? copied : on_cpu)[used[i]] = true;
    // The host's share, while the copies and the GPU run: computed on this thread after it has issued the
    // copies, the next kernels launched after it. On a background job instead, while this thread queued the
    // GPU's next kernels, it measured 3-6 % slower (docs/PERF.md; XPERT_ASYNC_HOST, removed 2026-12-03).
    const bool host_cpu = host_part && n_copy < used.size();
    float* yh = nullptr;
    std::function<void(ThreadPool&)> compute_host;
    if (host_cpu) {
      HostShare& h = host_share_;
      h.r.n_tokens = n;
      h.r.k = k;
      h.r.ids.assign(ids, ids + n * k);
      const auto* w = reinterpret_cast<const float*>(in + ids_b);
      h.r.weights.assign(w, w + n * k);
      h.on_cpu = std::move(on_cpu);
      yh = static_cast<float*>(split_out_.get(x_b, s()));
      const auto* xh = reinterpret_cast<const float*>(in + ids_b + w_b);
      const size_t host_bytes = (used.size() - n_copy) * per_expert;
      compute_host = [this, &hw, xh, n, yh, host_bytes](ThreadPool& pool) {
        const auto t0 = std::chrono::steady_clock::now();
        cpu::moe_experts_partial(hw, xh, n, host_share_.r, host_share_.on_cpu, yh, false, host_share_.ms, pool);
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(share_mutex_);
        stream_share_.observe_host(host_bytes, us);
      };
    }
    const bool timed = host_part && n_copy > 0;
    if (timed) XPERT_CUDA_CHECK(cudaEventRecord(copy_begin_.get(), s()));
    if (n_copy * per_expert > stream_buf_.size()) {
      synchronize();
      stream_buf_ = DeviceBuffer(*this, (size_t)X * per_expert);  // a whole layer: every later batch fits
    }
    if (staged > layout_stage_.bytes()) {
      synchronize();
      layout_stage_.reserve(staged);
    }
    auto* table = static_cast<const void**>(stream_table_.get(3 * X * sizeof(void*), s()));
    auto* dst = static_cast<uint8_t*>(stream_buf_.data());
    const std::vector<const void*>* resident[3] = {&ffn.split->gate, &ffn.split->up, &ffn.split->down};
    for (int64_t i = 0; i < X; ++i) {
      for (int m = 0; m < 3; ++m) {
        const void* p = nullptr;
        if (ffn.split->on_device[i]) {
          p = (*resident[m])[i];
        } else if (copied[i]) {
          const Weight ex = expert_matrix(*mats[m], i);
          p = dst;
          // A type the device lays out otherwise (weight_layout.h) goes through a staging buffer.
          const bool convert = cuda::device_layout_differs(ex.type);
          auto* to = convert ? static_cast<uint8_t*>(layout_stage_.data()) : dst;
          pins_.for_each_piece(ex.data, ex.n_bytes, [&](const void* src, size_t bytes) {
            XPERT_CUDA_CHECK(cudaMemcpyAsync(to, src, bytes, cudaMemcpyHostToDevice, s()));
            to += bytes;
          });
          if (convert)
            cuda::to_device_layout(dst, layout_stage_.data(), ex.n_bytes, ex.type, ex.ne[0], ex.ne[1], s());
          dst += align16(ex.n_bytes);  // each matrix 16-byte aligned, as weight_layout.h's readers want
        }
        table[m * X + i] = p;
      }
    }
    Arena& ar = scratch();
    const size_t mark = ar.mark();
    auto* table_d = static_cast<const void**>(ar.take_bytes(3 * X * sizeof(void*)));
    XPERT_CUDA_CHECK(cudaMemcpyAsync(table_d, table, 3 * X * sizeof(void*), cudaMemcpyHostToDevice, s()));
    if (timed) XPERT_CUDA_CHECK(cudaEventRecord(copy_end_.get(), s()));
    cuda::MoeExperts all = e;
    all.gate = table_d;
    all.up = table_d + X;
    all.down = table_d + 2 * X;
    all.gate_base = all.up_base = all.down_base = nullptr;  // this call's table only
    const size_t ws = cuda::moe_workspace_bytes(all, n, k);
    cuda::moe_experts(all, {.x = x, .n_tokens = n, .k = k, .ids = ids_d, .weights = weights_d, .out = out,
                            .accumulate = false, .path = cuda::MoePath::automatic},
                      ws ? ar.take_bytes(ws) : nullptr, ws, s());
    if (timed) {
      XPERT_CUDA_CHECK(cudaEventRecord(moe_end_.get(), s()));
      copy_pending_ = n_copy * per_expert;
    }
    if (host_cpu) {
      compute_host(*host_pool_);
      float* yd = ar.take<float>(n * E);
      XPERT_CUDA_CHECK(cudaMemcpyAsync(yd, yh, x_b, cudaMemcpyHostToDevice, s()));
      cuda::add(out, yd, out, n * E, s());
    }
    // The pinned buffers are rewritten only after the next layer's wait, which follows these copies.
    ar.release(mark);
  }

  // The copy and GPU MoE times of the last timed moe_streamed, once its events have completed.
  void report_copy_times() {
    if (!copy_pending_) return;
    float copy_ms = 0, moe_ms = 0;
    if (cudaEventElapsedTime(&copy_ms, copy_begin_.get(), copy_end_.get()) == cudaSuccess &&
        cudaEventElapsedTime(&moe_ms, copy_end_.get(), moe_end_.get()) == cudaSuccess) {
      std::lock_guard<std::mutex> lock(share_mutex_);
      stream_share_.observe_copy(copy_pending_, 1e3 * copy_ms, 1e3 * moe_ms);
    }
    copy_pending_ = 0;
  }

  // The device tables of a layer's expert pointers, made on first use (all experts resident, or the
  // layer's split).
  struct ExpertTables {
    DeviceBuffer tables;
    cuda::MoeExperts e;
    bool fused = true;  // the MoE kernels take these types and shapes
    bool shared = false;  // entry n_expert of each table is the layer's shared expert
    std::string why_not;  // when not fused: what the kernels refused
  };
  const ExpertTables& experts(const MoeFfn& ffn) {
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
      t.shared =
          ffn.shared_up && ffn.n_ff_shared == ffn.n_ff && ffn.shared_gate.type == ffn.gate.type &&
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
      t.e.gate_up_bytes =
          row_bytes(ffn.gate.type, ffn.gate.ne[0]) * (size_t)ffn.gate.ne[1];
      t.e.down_bytes =
          row_bytes(ffn.down.type, ffn.down.ne[0]) * (size_t)ffn.down.ne[1];
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
  void moe_unfused(const MoeFfn& ffn, const float* x, int64_t n, const int32_t* ids_d,
                   const float* weights_d, float* out) {
    const int64_t k = ffn.n_used, E = ffn.n_embd, F = ffn.n_ff;
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
        matmul(expert_matrix(ffn.gate, e), x + t * E, 1, gate, 0);
        matmul(expert_matrix(ffn.up, e), x + t * E, 1, up, 0);
        cuda::swiglu(gate, up, gate, F, s());
        matmul(expert_matrix(ffn.down, e), gate, 1, y, 0);
        cuda::scale(y, w[t * k + j], E, s());
        if (j == 0) copy(out + t * E, y, E * sizeof(float));
        else cuda::add(out + t * E, y, out + t * E, E, s());
      }
    }
    ar.release(mark);
  }

  struct Graph {
    cudaGraphExec_t exec = nullptr;
    size_t end_mark = 0;  // the scratch arena's mark at end_graph: a replay must end where the recording did
  };
  static constexpr size_t kMaxGraphs = 64;
  void clear_graphs() {
    synchronize();
    for (auto& [key, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    if (split_calls_.size() > 4096) split_calls_.clear();  // only graphs and in-flight nodes point at them
  }
  std::map<std::string, Graph> graphs_;
  std::string capture_key_;
  const Graph* pending_ = nullptr;  // the graph end_graph replays
  bool capturing_ = false, skip_ = false, no_graphs_ = false;
  bool graph_pass_ = false;  // between begin_graph and end_graph: ops must be capturable

  // XPERT_STEP_TIMES=1: each replayed graph's time on the GPU (events around its launch, read when its
  // output reaches the host) against the host's time from one replay's launch to the next, reported when
  // the backend goes: what a decode step spends outside its kernels.
  struct StepTimes {
    const bool on = env_is_1("XPERT_STEP_TIMES");
    cuda::Event ev[2] = {cuda::Event(true), cuda::Event(true)};
    bool pending = false;
    int64_t n = 0;
    double gpu_ms = 0, gap_ms = 0, copy_ms = 0,
           prep_ms = 0,  // prep: from the output's copy to the next launch
        walk_ms = 0;     // the part of prep in which the model's ops are called and skipped
    std::chrono::steady_clock::time_point last{}, copied{}, walk_start{};
    static double ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    }
    void walk() {
      if (on) walk_start = std::chrono::steady_clock::now();
    }
    void before(cudaStream_t s) {
      if (!on) return;
      const auto now = std::chrono::steady_clock::now();
      if (n > 0) {
        gap_ms += ms(last, now);
        prep_ms += ms(copied, now);
        walk_ms += ms(walk_start, now);
      }
      last = now;
      XPERT_CUDA_CHECK(cudaEventRecord(ev[0].get(), s));
    }
    void after(cudaStream_t s) {
      if (!on) return;
      XPERT_CUDA_CHECK(cudaEventRecord(ev[1].get(), s));
      pending = true;
    }
    void done(std::chrono::steady_clock::time_point copy_start) {  // the stream has finished
      if (!pending) return;
      pending = false;
      copied = std::chrono::steady_clock::now();
      copy_ms += ms(copy_start, copied);
      float ms = 0;
      XPERT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0].get(), ev[1].get()));
      gpu_ms += ms;
      ++n;
    }
    void report() {
      if (!on || n < 2) return;
      log::info(
          "decode graphs: {} replays, {:.1f} us each on the GPU, {:.1f} us from one launch to the next; the "
          "output's copy call {:.1f} us (waiting included), from its return to the next launch {:.1f} us, of "
          "which {:.1f} us between the graph's begin and end (the model's ops called and skipped)",
          n, gpu_ms * 1e3 / n, gap_ms * 1e3 / (n - 1), copy_ms * 1e3 / n, prep_ms * 1e3 / (n - 1),
          walk_ms * 1e3 / (n - 1));
    }
  } step_times_;

  int device_;
  const bool pin_logits_;  // XPERT_PIN_LOGITS, on unless 0 (pin_host)
  cuda::DeviceInfo info_;
  std::unique_ptr<cuda::Stream> stream_;
  std::map<const void*, ExpertTables> expert_tables_;

  // Split MoE layers (moe_split / moe_streamed).
  int64_t stream_min_tokens_ = kDefaultStreamMinTokens;
  StreamShare stream_share_;  // under share_mutex_: the host's shares report to it
  std::mutex share_mutex_;
  struct HostShare {  // moe_streamed's host share: its routing, experts and scratch
    Routing r;
    std::vector<bool> on_cpu;
    cpu::MoeScratch ms;
  };
  HostShare host_share_;
  cuda::Event copy_begin_{true}, copy_end_{true}, moe_end_{true};  // moe_streamed's copies and MoE, timed
  size_t copy_pending_ = 0;  // bytes whose copy times are not reported yet
  std::unique_ptr<ThreadPool> node_pool_;  // the host nodes' threads: one fewer than the host's (see host_pool)
  cuda::PinnedBuffer split_in_, split_out_, stream_table_;
  cuda::PinnedRing up_ring_;  // copy_from_host's small copies
  cuda::Event fork_, join_;
  std::unique_ptr<cuda::Stream> aux_;
  std::map<std::pair<const ExpertSplit*, int64_t>, std::unique_ptr<SplitCall>> split_calls_;
  bool stale_graphs_ = false;  // a pinned buffer that recorded graphs copy from has moved
  std::mutex host_error_mutex_;
  std::string host_error_;
  cuda::HostPins pins_;
  DeviceBuffer stream_buf_;
  cuda::DeviceBuffer layout_stage_;  // a host expert matrix on its way into the device layout
  Prepared prepared_;
  DeviceBuffer prep_buf_;
  DeviceBuffer router_done_;  // moe_router's block counter
  DeviceBuffer norm_done_;    // the down product's block counter for the next norm (MoeNormOut)
  DeviceBuffer parts_buf_;    // decode_attention_proj's parts
  OwedSum owed_;
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend(int device) { return std::make_shared<CudaBackend>(device); }

}  // namespace xpert
