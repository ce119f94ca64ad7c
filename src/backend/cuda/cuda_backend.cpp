// CudaBackend (cuda_backend_impl.h): construction, device memory and copies, and the plain ops (products,
// norms, RoPE, elementwise, prefill attention, gated delta net); make_cuda_backend.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/host_transfer.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/trace.h"
#include "backend/cuda/weight_layout.h"
#include "base/error.h"
#include "base/log.h"
#include "quant/dtype.h"

namespace xpert::cuda_impl {

using cuda::detail::env_on;

CudaBackend::CudaBackend(int device) : device_(device), pin_logits_(env_on("XPERT_PIN_LOGITS")) {
  const std::vector<cuda::DeviceInfo> devs = cuda::list_devices();
  if (devs.empty()) fail("no CUDA device: {}", cuda::no_device_reason());
  if (device < 0 || device >= (int)devs.size())
    fail("cuda:{} does not exist ({} CUDA device{})", device, devs.size(), devs.size() == 1 ? "" : "s");
  info_ = devs[device];
  XPERT_CUDA_CHECK(cudaSetDevice(device));
  stream_ = std::make_unique<cuda::Stream>();
  cuda::matmul_init();
}

CudaBackend::~CudaBackend() {
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

void* CudaBackend::alloc(size_t bytes) {
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

void CudaBackend::dealloc(void* p) { cudaFree(p); }

void CudaBackend::zero(void* p, size_t bytes) {
  XPERT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s()));
}

// Small copies (a decode step's ids and x) pass through a pinned ring outside graph recordings: one DMA
// the driver need not stage from pageable memory.
void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes <= cuda::PinnedRing::kMaxCopy && !capturing_ && !graph_pass_) {
    void* staged = up_ring_.take(bytes, s());
    std::memcpy(staged, src, bytes);
    src = staged;
  }
  XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s()));
}

void CudaBackend::upload_weight(void* dst, const Weight& w) {
  cuda::upload_weights(dst, w.data, w.n_bytes, w.type, w.ne[0], w.ne[1], s());
}

// A decode step's logits (600 KB for Qwen3's vocabulary) copied into pageable memory took ~80 us after
// the graph had finished (H200, qwen3-30b-a3b, XPERT_STEP_TIMES=1: 1,701 us on the GPU, 1,796 from one
// launch to the next). The sessions and the server register their logits (PinnedFloats) so the copy is
// one DMA straight into them: tg128 +3 % (qwen3-30b-a3b) and +5 % (qwen3.5-35b-a3b), 2026-12-01; a copy
// through a pinned staging buffer and a memcpy gained +0.5-1.5 % and is gone. XPERT_PIN_LOGITS=0 turns
// the registration off.
bool CudaBackend::pin_host(void* p, size_t bytes) {
  if (!pin_logits_) return false;
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) == cudaSuccess) return true;
  cudaGetLastError();  // a refusal (locked-memory limits) leaves the memory as it was
  return false;
}

void CudaBackend::unpin_host(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s()));
  synchronize();
  step_times_.done(t0);
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (dst != src) XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s()));
}

void CudaBackend::synchronize() {
  XPERT_CUDA_CHECK(cudaStreamSynchronize(s()));
  check_host_error();
}

size_t CudaBackend::free_memory() const {
  size_t free_b = 0, total_b = 0;
  XPERT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

void CudaBackend::matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) {
  const int64_t k = w.ne[0], n = w.ne[1];
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const size_t ws = cuda::matmul_workspace_bytes(w.type, m, k);
  void* work = ws ? ar.take_bytes(ws) : nullptr;
  cuda::matmul(w.type, w.data, n, k, x, m, y, ldy ? ldy : n, work, ws, s());
  ar.release(mark);
}

// x's form (Act) where it has one and the weight's products read it.
void CudaBackend::matmul_act(const Weight& w, const Act& x, float* y, int64_t ldy) {
  const int64_t n = w.ne[1];
  if (const cuda::Activations* a = prepared(x, w.ne[0], w.type))
    return cuda::matmul_prepared(w.type, w.data, n, *a, y, ldy ? ldy : n, s());
  matmul(w, x.x, x.rows, y, ldy);
}

void CudaBackend::matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) {
  matmuls_act(Act::of(x, m, jobs.empty() ? 0 : jobs[0].w->ne[0]), jobs);
}

// The jobs share one conversion of x per activation form (prefill: q, k and v convert x to f16 once; at
// decode sizes x's form where it has one); at decode sizes the jobs of one weight type also share one
// launch.
void CudaBackend::matmuls_act(const Act& xa, std::span<const MatmulJob> jobs) {
  const float* x = xa.x;
  const int64_t m = xa.rows, k = jobs.empty() ? 0 : jobs[0].w->ne[0];
  bool batched = true;  // an output over x would change what a later conversion reads
  for (const MatmulJob& j : jobs)
    batched = batched && j.w->ne[0] == k && !overlaps(j.y, (size_t)(m * (j.ldy ? j.ldy : j.w->ne[1])), x);
  if (!batched) {  // one by one; once an output has written over x, its form no longer holds
    bool whole = true;
    for (const MatmulJob& j : jobs) {
      if (whole) matmul_act(*j.w, xa, j.y, j.ldy);
      else matmul(*j.w, x, m, j.y, j.ldy);
      whole = whole && !overlaps(j.y, (size_t)(m * (j.ldy ? j.ldy : j.w->ne[1])), x);
    }
    return;
  }
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  std::vector<cuda::Activations> converted;
  auto activations = [&](DType t) {
    if (const cuda::Activations* p = prepared(xa, k, t)) return *p;
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

void CudaBackend::rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  cuda::rmsnorm(x, w, y, rows, n, eps, s());
}

// A decode-sized norm also writes its output's q8_1 activations, the form of the Act it returns, which the
// products it is handed to take instead of converting again.
Act CudaBackend::add_rmsnorm(const float* d, float* x, const float* w, float* y, int64_t rows, int64_t n,
                             float eps) {
  const cuda::Activations* act = y ? prepare_slot(rows, n) : nullptr;
  int8_t* q = act ? static_cast<int8_t*>(const_cast<void*>(act->data)) : nullptr;
  auto* ds = act ? reinterpret_cast<float2*>(const_cast<float*>(act->aux)) : nullptr;
  cuda::add_rmsnorm_q8(d, x, n, w, y, n, rows, n, eps, q, ds, s());
  return formed(y, rows, n, act);
}

void CudaBackend::qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm,
                               const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t n_head_kv,
                               int64_t head_dim, int64_t n_rot, float freq_base, float freq_scale,
                               RopeMode mode, float eps) {
  cuda::qk_norm_rope(q, k, q_norm, k_norm, q_norm != nullptr, k_norm != nullptr, pos, n_tokens, n_head,
                     n_head_kv, head_dim, n_rot, freq_base, freq_scale, mode, eps, s());
}

void CudaBackend::rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                       int64_t n_rot, float freq_base, float freq_scale, RopeMode mode) {
  cuda::rope(x, pos, n_tokens, n_heads, head_dim, n_rot, freq_base, freq_scale, mode, s());
}

void CudaBackend::swiglu(const float* gate, const float* up, float* y, int64_t n) {
  cuda::swiglu(gate, up, y, n, s());
}

void CudaBackend::geglu(const float* gate, const float* up, float* y, int64_t n) {
  cuda::geglu(gate, up, y, n, s());
}

void CudaBackend::add(const float* a, const float* b, float* y, int64_t n) {
  cuda::add(a, b, y, n, s());
}

void CudaBackend::scale(float* x, float v, int64_t n) {
  cuda::scale(x, v, n, s());
}

void CudaBackend::add_bias(float* x, const float* bias, int64_t rows, int64_t n) {
  cuda::add_bias(x, bias, rows, n, s());
}

void CudaBackend::mul_sigmoid(float* x, const float* gate, int64_t n) {
  cuda::mul_sigmoid(x, gate, n, s());
}

void CudaBackend::add_sigmoid_scaled(float* y, const float* v, const float* g, int64_t rows, int64_t n) {
  cuda::add_sigmoid_scaled(y, v, g, rows, n, s());
}

void CudaBackend::deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) {
  cuda::deinterleave(src, rows, width, a, b, s());
}

void CudaBackend::gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) {
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

void CudaBackend::store_kv(const float* x, void* dst, int64_t n, DType type) {
  if (type == DType::F16) return cuda::store_f16(x, static_cast<uint16_t*>(dst), n, s());
  cuda::store_kv(x, n / 32, 32, type, dst, 0, nullptr, nullptr, s());  // n / 32 contiguous blocks
}

void CudaBackend::attention(const AttentionArgs& a) {
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const size_t ws = cuda::attention_workspace_bytes(a);
  cuda::attention(a, ws ? ar.take_bytes(ws) : nullptr, s());
  ar.release(mark);
}

void CudaBackend::gated_delta_net(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in,
                                  float* conv_state, float* ssm_state, float* out) {
  gated_delta_net_act(gs, p, in, conv_state, ssm_state, out);
}

Act CudaBackend::gated_delta_net_act(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in,
                                     float* conv_state, float* ssm_state, float* out) {
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const size_t ws = cuda::gated_delta_net_workspace_bytes(gs, in.n_tokens);
  // At decode sizes the gated norm also writes out's q8_1 activations, for the output projection.
  const cuda::Activations* act =
      gs.head_v_dim % 32 == 0 && out ? prepare_slot(in.n_tokens, gs.value_dim()) : nullptr;
  int8_t* q = act ? static_cast<int8_t*>(const_cast<void*>(act->data)) : nullptr;
  auto* ds = act ? reinterpret_cast<float2*>(const_cast<float*>(act->aux)) : nullptr;
  cuda::gated_delta_net(gs, p, in, conv_state, ssm_state, out, ws ? ar.take_bytes(ws) : nullptr, s(),
                        DeltaRuleForm::automatic, q, ds);
  ar.release(mark);
  return formed(out, in.n_tokens, gs.value_dim(), act);
}

Act CudaBackend::gated_delta_net_rows(const GdnShape& gs, const GdnLayerParams& p, const GdnLayerInputs& in,
                                      std::span<const GdnSlotState> states, float* out) {
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const size_t ws = cuda::gated_delta_net_workspace_bytes(gs, in.n_tokens);
  const cuda::Activations* act =
      gs.head_v_dim % 32 == 0 ? prepare_slot(in.n_tokens, gs.value_dim()) : nullptr;
  int8_t* q = act ? static_cast<int8_t*>(const_cast<void*>(act->data)) : nullptr;
  auto* ds = act ? reinterpret_cast<float2*>(const_cast<float*>(act->aux)) : nullptr;
  cuda::gated_delta_net_rows(gs, p, in, states, out, ws ? ar.take_bytes(ws) : nullptr, s(), q, ds);
  ar.release(mark);
  return formed(out, in.n_tokens, gs.value_dim(), act);
}

// Room in prep_buf_ for the q8_1 activations of rows x k (decode sizes, k % 32 == 0), which the caller's
// launch writes: described in prep_act_ under a new serial (the earlier Acts' forms are stale from here),
// or null without room. The buffer grows outside a capture only; graphs recorded with the old one are
// dropped.
const cuda::Activations* CudaBackend::prepare_slot(int64_t rows, int64_t k) {
  if (rows > cuda::kDecodeMaxRows || k % 32 != 0) return nullptr;
  const size_t qb = cuda::activation_bytes(cuda::ActFormat::q8_1, rows, k);
  if (prep_buf_.size() < qb) {
    if (capturing_) return nullptr;
    stale_graphs_ = true;
    synchronize();
    prep_buf_ = DeviceBuffer(*this, std::max(qb, prep_buf_.size() * 2));
  }
  auto* q = static_cast<int8_t*>(prep_buf_.data());
  auto* ds = reinterpret_cast<float2*>(q + cuda::Workspace::round((size_t)(rows * k)));
  ++prep_serial_;
  prep_act_ = {.format = cuda::ActFormat::q8_1,
               .data = q,
               .aux = reinterpret_cast<const float*>(ds),
               .m = rows,
               .k = k};
  return &prep_act_;
}

}  // namespace xpert::cuda_impl

namespace xpert {

std::shared_ptr<Backend> make_cuda_backend(int device) {
  return std::make_shared<cuda_impl::CudaBackend>(device);
}

}  // namespace xpert
