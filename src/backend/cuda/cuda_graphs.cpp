// CudaBackend (cuda_backend_impl.h): CUDA graphs of whole passes (PassGraphs): recording, replay, the graph
// cache, and the replays' step times (XPERT_STEP_TIMES).
#include <cuda_runtime.h>

#include <chrono>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "base/error.h"
#include "base/log.h"

namespace xpert::cuda_impl {

// A key seen once runs eagerly (it sizes the scratch); the second time it is recorded and run from the
// graph; after that the forward issues no ops (Exec::replaying) and end_graph replays it.
bool CudaBackend::begin_graph(const std::string& key) {
  if (no_graphs_ || capturing_ || replay_pending_) return false;
  graph_pass_ = true;
  if (stale_graphs_) {
    clear_graphs();
    stale_graphs_ = false;
  }
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second.exec) {
    step_times_.walk();
    replay_pending_ = true;
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

void CudaBackend::end_graph() {
  graph_pass_ = false;
  if (replay_pending_) {
    replay_pending_ = false;
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

void CudaBackend::abort_graph() {
  graph_pass_ = false;
  replay_pending_ = false;
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(s(), &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  graphs_.erase(capture_key_);
}

void CudaBackend::clear_graphs() {
  synchronize();
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  if (split_calls_.size() > 4096) split_calls_.clear();  // only graphs and in-flight nodes point at them
}

void CudaBackend::StepTimes::walk() {
  if (on) walk_start = std::chrono::steady_clock::now();
}

void CudaBackend::StepTimes::before(cudaStream_t s) {
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

void CudaBackend::StepTimes::after(cudaStream_t s) {
  if (!on) return;
  XPERT_CUDA_CHECK(cudaEventRecord(ev[1].get(), s));
  pending = true;
}

// The stream has finished.
void CudaBackend::StepTimes::done(std::chrono::steady_clock::time_point copy_start) {
  if (!pending) return;
  pending = false;
  copied = std::chrono::steady_clock::now();
  copy_ms += ms(copy_start, copied);
  float ms = 0;
  XPERT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0].get(), ev[1].get()));
  gpu_ms += ms;
  ++n;
}

void CudaBackend::StepTimes::report() {
  if (!on || n < 2) return;
  log::info(
      "decode graphs: {} replays, {:.1f} us each on the GPU, {:.1f} us from one launch to the next; the "
      "output's copy call {:.1f} us (waiting included), from its return to the next launch {:.1f} us, of "
      "which {:.1f} us between the graph's begin and end (the forward's walk to the head)",
      n, gpu_ms * 1e3 / n, gap_ms * 1e3 / (n - 1), copy_ms * 1e3 / n, prep_ms * 1e3 / (n - 1),
      walk_ms * 1e3 / (n - 1));
}

}  // namespace xpert::cuda_impl
