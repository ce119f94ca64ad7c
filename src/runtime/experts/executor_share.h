// How much of a layer's host experts an expert device computes beside the CPU (--expert-device opencl:N,cpu):
// measured on this machine, per phase, from the model's own weights, and cached.
//
// For decode (one token) and prefill (a 64-token batch), with uniform routing on one MoE layer, it times the
// CPU alone (share 0), the device alone (share 1) and the split that would finish both at once if their rates
// added (s = t_cpu / (t_cpu + t_device)), then s +- 0.15; the fastest wins. Executors that share the host's
// DRAM (an iGPU, PoCL) do not add their rates when the experts are bandwidth-bound: then a single executor
// wins, and the plan is never slower than the best of them (as measured). The result is cached under
// $XDG_CACHE_HOME/xpert/expert-share (else ~/.cache/...), keyed by the device, the thread count and the
// layer's shapes and types, so a machine measures once.
#pragma once
#include <string>

#include "backend/experts.h"
#include "base/thread_pool.h"

namespace xpert {

struct ShareMeasurement {
  ExecutorShare share;
  // Milliseconds per batch: CPU alone, device alone, the chosen split, for decode [0] and prefill [1]
  // (as measured when the cache was written).
  double cpu_ms[2] = {0, 0}, device_ms[2] = {0, 0}, chosen_ms[2] = {0, 0};
  bool cached = false;  // read from the cache (the times are those measured then)
  std::string summary() const;  // one line: the shares and why
};

// Measures (or reads from the cache) the share of `layer`'s experts (every expert in host memory) that
// `exec` should take, on `pool`'s threads.
ShareMeasurement measure_executor_share(const MoeFfn& layer, ExpertExecutor& exec, ThreadPool& pool);

// "0.4" (both phases) or "0.2,0.9" (decode, prefill), each 0..1: --expert-share. Throws Error naming the flag.
ExecutorShare parse_executor_share(const std::string& s);

}  // namespace xpert
