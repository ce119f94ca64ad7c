// OpenclBackend (backend_impl.h): PassGraphs by command buffers (command_buffer.h). As the CUDA backend's
// graphs (cuda/cuda_graphs.cpp): a key seen once runs op by op (it sizes the scratch); the second time its
// kernels are recorded, and the recording runs at end_graph; after that the forward issues no op
// (Exec::replaying) and end_graph enqueues the recording, one command for the whole step instead of ~8 a
// layer.
//
// Only kernel launches are recorded, with the arguments they hold then; everything they read per step (token
// ids, positions, slots) is in device memory the pass uploads before begin_graph. A recording stops where
// the pass does anything else: a copy, a read to the host, a free on the queue, or an op that puts the step's
// position into its arguments (the plain attention and KV store, for shapes the decode kernels decline). What
// was recorded so far then runs, the pass goes on op by op, and that key is never recorded again.
#include "backend/opencl/backend_impl.h"

namespace xpert::opencl {

bool OpenclBackend::begin_graph(const std::string& key) {
  if (!cmdbuf_ || recording_ || replay_) return false;
  if (graphs_stale_) {
    clear_graphs();
    graphs_stale_ = false;
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {  // the first time: op by op
    if (graphs_.size() >= kMaxGraphs) clear_graphs();
    graphs_[key] = {};
    return false;
  }
  StepGraph& g = it->second;
  if (g.buf) {
    replay_ = &g;
    return true;
  }
  if (g.never) return false;
  try {
    recording_ = std::make_unique<CommandBuffer>(*cmdbuf_, queue_.get());
  } catch (const Error& e) {
    log::warn("{}: decode steps not recorded, enqueued kernel by kernel ({})", name(), e.what());
    cmdbuf_.reset();
    return false;
  }
  rec_key_ = key;
  return false;
}

bool OpenclBackend::record(cl_kernel k, cl_uint dims, const size_t* global, const size_t* local) {
  try {
    recording_->record(k, dims, global, local);
    return true;
  } catch (const Error& e) {
    // The caller enqueues this kernel (after what was recorded), and no step records from now on.
    log::warn("{}: decode steps not recorded, enqueued kernel by kernel ({})", name(), e.what());
    stop_recording();
    cmdbuf_.reset();
    return false;
  }
}

std::unique_ptr<CommandBuffer> OpenclBackend::run_recording() {
  std::unique_ptr<CommandBuffer> buf = std::move(recording_);
  if (!buf->commands()) return nullptr;
  buf->finalize();
  ++stats_.enqueues;
  buf->enqueue();
  return buf;
}

void OpenclBackend::stop_recording() {
  StepGraph& g = graphs_[rec_key_];
  g.never = true;
  g.spent = run_recording();
}

void OpenclBackend::end_graph() {
  if (StepGraph* g = std::exchange(replay_, nullptr)) {
    // The caller reads the outputs where the recording's pass put them.
    if (scratch().mark() != g->end_mark)
      fail("internal error: a recorded decode step's replay ends at scratch offset {}, its recording at {}",
           scratch().mark(), g->end_mark);
    ++stats_.enqueues, ++stats_.replays;
    g->buf->enqueue();
    // Drained here, not by the caller's read of the outputs that comes next: Intel's x86 CPU runtime (2026.2)
    // waits for a command buffer in a blocking read at half speed (qwen3moe-1.3b synth, 2 cores: 6.6 t/s,
    // 12.5 with this wait; 12.3 op by op). PoCL: the same either way (11.9, 11.7-12.0).
    synchronize();
    return;
  }
  if (!recording_) return;
  StepGraph& g = graphs_[rec_key_];
  std::unique_ptr<CommandBuffer> buf = run_recording();
  if (!buf) return;
  // A pass that spilled recorded addresses the scratch's reset frees; one that freed memory may have recorded
  // addresses the pool hands out again: run once, not kept.
  if (scratch().spilled() || graphs_stale_) {
    g.spent = std::move(buf);
  } else {
    g.buf = std::move(buf);
    g.end_mark = scratch().mark();
  }
}

void OpenclBackend::abort_graph() {
  replay_ = nullptr;
  if (!recording_) return;
  recording_.reset();  // the pass failed: what it recorded never runs
  graphs_.erase(rec_key_);
}

void OpenclBackend::clear_graphs() {
  if (graphs_.empty()) return;
  synchronize();  // recordings still running are released after they end
  graphs_.clear();
}

}  // namespace xpert::opencl
