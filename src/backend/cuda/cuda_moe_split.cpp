// CudaBackend (cuda_backend_impl.h): MoE layers whose experts are split between the GPU and the host
// (SplitExperts): moe_split's host nodes inside a decode graph, moe_streamed's copies of host experts and its
// host share.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/moe.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/host_transfer.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/weight_layout.h"
#include "backend/stream_share.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert::cuda_impl {

void CudaBackend::set_expert_streaming(int64_t min_tokens, double share) {
  if (min_tokens >= 0) stream_min_tokens_ = min_tokens;
  if (share >= 0) stream_share_.set(std::min(share, 1.0));
}

// Model::move_experts swapped experts of split layers: the pointer tables (expert_tables_, keyed by
// the split), the host masks of the host nodes (split_calls_) and the graphs that baked both are
// rebuilt on next use. clear_graphs waits for the stream first, so nothing in flight reads them.
void CudaBackend::on_experts_moved() {
  if (capturing_) abort_graph();
  clear_graphs();
  stale_graphs_ = false;
  split_calls_.clear();
  expert_tables_.clear();
}

// out = the weighted sum of the routed experts of e (those e's table holds) for n tokens of k slots, its
// workspace taken from the scratch arena and left there (the caller's mark releases it).
void CudaBackend::split_experts_out(const cuda::MoeExperts& e, const float* x, int64_t n, int64_t k,
                                    const int32_t* ids_d, const float* weights_d, float* out) {
  const size_t ws = cuda::moe_workspace_bytes(e, n, k);
  cuda::moe_experts(e,
                    {.x = x,
                     .n_tokens = n,
                     .k = k,
                     .ids = ids_d,
                     .weights = weights_d,
                     .out = out,
                     .accumulate = false,
                     .path = cuda::MoePath::automatic},
                    ws ? scratch().take_bytes(ws) : nullptr, ws, s());
}

// Experts split between this GPU and the host. Small batches (decode) are driven by the stream, so a
// decode step stays one CUDA graph: a second stream waits for the routing, copies ids, weights and x
// to pinned host memory and calls the host's threads from a host node (moe_experts_partial over the
// mmap); meanwhile the main stream computes the resident experts, then waits for the host's sum,
// uploads it and adds it. Batches of stream_min_tokens_ or more instead copy the host experts they use
// to the GPU and run every expert there (moe_streamed): a batch then reads each host expert once over
// PCIe instead of the CPU computing hundreds of rows of it.
void CudaBackend::moe_split(const MoeFfn& ffn, const cuda::MoeExperts& e, const float* x, int64_t n,
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
  split_experts_out(e, x, n, k, ids_d, weights_d, out);
  XPERT_CUDA_CHECK(cudaStreamWaitEvent(s(), join_.get(), 0));
  float* yd = ar.take<float>(n * E);
  XPERT_CUDA_CHECK(cudaMemcpyAsync(yd, yh, x_b, cudaMemcpyHostToDevice, s()));
  cuda::add(out, yd, out, n * E, s());
  ar.release(mark);
}

// The host node of moe_split, on a CUDA driver thread (no CUDA calls here). The main thread is then
// waiting for the step, so the host pool is free.
void CUDART_CB CudaBackend::host_experts(void* p) {
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
    cpu::moe_experts_partial(host, x, n, r, call->on_host, static_cast<float*>(b.split_out_.data()), false,
                             ms, *b.node_pool_);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(b.host_error_mutex_);
    if (b.host_error_.empty()) b.host_error_ = e.what();
  }
}

// The pool of host nodes: one thread fewer than the host's (the caller of run() is one of
// them), since the thread that launched the step spins in its wait meanwhile (the lowest latency for the
// step; one thread more measured 1.5x slower).
ThreadPool& CudaBackend::node_threads() {
  const int n = std::max(1, host_pool_->size() - 1);
  if (!node_pool_ || (node_pool_->size() != n && !capturing_)) {
    if (node_pool_) synchronize();  // a host node may be running on it
    node_pool_ = std::make_unique<ThreadPool>(n);
  }
  return *node_pool_;
}

CudaBackend::SplitCall& CudaBackend::split_call(const MoeFfn& ffn, int64_t n) {
  auto& slot = split_calls_[{ffn.split, n}];
  if (!slot) {
    slot =
        std::make_unique<SplitCall>(SplitCall{.self = this, .host = ffn.host_view(), .n = n, .on_host = {}});
    slot->on_host.resize(ffn.n_expert);
    for (int64_t i = 0; i < ffn.n_expert; ++i) slot->on_host[i] = !ffn.split->on_device[i];
  }
  return *slot;
}

cudaStream_t CudaBackend::aux_stream() {
  if (!aux_) aux_ = std::make_unique<cuda::Stream>();
  return aux_->get();
}

// A host node that failed: its error, raised on the caller's thread at the next wait.
void CudaBackend::check_host_error() {
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
void CudaBackend::moe_streamed(const MoeFfn& ffn, const cuda::MoeExperts& e, const float* x, int64_t n,
                               const int32_t* ids_d, const float* weights_d, float* out, bool copy_all) {
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
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
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
  split_experts_out(all, x, n, k, ids_d, weights_d, out);
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
void CudaBackend::report_copy_times() {
  if (!copy_pending_) return;
  float copy_ms = 0, moe_ms = 0;
  if (cudaEventElapsedTime(&copy_ms, copy_begin_.get(), copy_end_.get()) == cudaSuccess &&
      cudaEventElapsedTime(&moe_ms, copy_end_.get(), moe_end_.get()) == cudaSuccess) {
    std::lock_guard<std::mutex> lock(share_mutex_);
    stream_share_.observe_copy(copy_pending_, 1e3 * copy_ms, 1e3 * moe_ms);
  }
  copy_pending_ = 0;
}

}  // namespace xpert::cuda_impl
