// What the whole-model OpenCL backend can say about its own speed (environment switches, off by default):
// XPERT_OPENCL_OPTS (switches.h) probe (what an enqueue costs), stats (enqueues and blocking calls per decode
// step), profile (device time per kernel and weight type, from profiling events).
#include <algorithm>
#include <array>
#include <chrono>

#include "backend/opencl/backend_impl.h"
#include "backend/opencl/kernels_probe.h"

namespace xpert::opencl {

namespace {
// The shortest of reps runs of run(r), each from an idle device until the device is idle again (host time,
// µs).
template <typename Run>
double best_waited_us(Backend& b, int reps, Run&& run) {
  using clock = std::chrono::steady_clock;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    b.synchronize();
    const auto t0 = clock::now();
    run(r);
    b.synchronize();
    best = std::min(best, std::chrono::duration<double, std::micro>(clock::now() - t0).count());
  }
  return best;
}
}  // namespace

void OpenclBackend::probe_launches() {
  using clock = std::chrono::steady_clock;
  auto us = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  // n launches back to back: (host time per enqueue, time per launch until the queue drained)
  auto queued = [&](int n, auto&& one) {
    synchronize();
    const auto t0 = clock::now();
    for (int i = 0; i < n; ++i) one(i);
    const auto t1 = clock::now();
    synchronize();
    return std::pair{us(t0, t1) / n, us(t0, clock::now()) / n};
  };
  cl_kernel k1 = ops("empty_kernel"), k16 = ops("empty_kernel16");
  void* p = dummy_;
  auto one1 = [&](int) { launch(k1, {1}, {}, p); };
  auto one16 = [&](int i) { launch(k16, {1}, {}, p, p, p, p, p, p, p, p, i, 1, 2, 3, 4, 5, 6, 1.0f); };
  const bool cache = arg_cache_;
  queued(200, one1);  // warm-up
  const auto [e1, b1] = queued(2000, one1);
  arg_cache_ = false;
  const auto [e16, b16] = queued(2000, one16);  // 16 arguments set before each enqueue
  arg_cache_ = cache;
  // The argument's kind: an int alone, a buffer object (cl_mem) where the backend passes SVM pointers.
  cl_kernel ki = ops("empty_kernel_int");
  const auto [ei, bi] = queued(2000, [&](int) { launch(ki, {1}, {}, (cl_int)1); });
  cl_int err = CL_SUCCESS;
  cl_mem mem = api().clCreateBuffer(ctx_.get(), CL_MEM_READ_WRITE, 64, nullptr, &err);
  if (err != CL_SUCCESS) throw_cl_error(err, "clCreateBuffer", __FILE__, __LINE__);
  Kernel km = clone_kernel(k1);
  XP_CL(clSetKernelArg, km.get(), 0, sizeof mem, &mem);
  const auto [em, bm] = queued(2000, [&](int) {
    const size_t g = 1;
    ++stats_.enqueues;
    XP_CL(clEnqueueNDRangeKernel, q(), km.get(), 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
  });
  synchronize();
  api().clReleaseMemObject(mem);
  fmt::print(
      stderr,
      "{}: an empty kernel with an int argument: {:.2f} us of host time per enqueue ({:.2f} back to back); "
      "with a buffer object (cl_mem) argument: {:.2f} ({:.2f})\n",
      name(), ei, bi, em, bm);
  const auto t0 = clock::now();
  for (int i = 0; i < 200; ++i) {
    launch(k1, {1}, {}, p);
    synchronize();
  }
  const double round_trip = us(t0, clock::now()) / 200;
  fmt::print(
      stderr,
      "{}: an empty kernel: {:.2f} us of host time per enqueue, {:.2f} us each when 2000 run back to back; "
      "with 16 arguments set before each: {:.2f} / {:.2f} us; enqueued and waited for one at a time: {:.2f} "
      "us\n",
      name(), e1, b1, e16, b16, round_trip);
  arg_sets_.erase(k16);
  probe_grid_sync();
  probe_floors();
  probe_code();
  // What could cut the enqueues further (issue #34): recorded command buffers, subgroups (one line, so that
  // bench/h200_carry.sh's filter of the "empty kernel" lines keeps it).
  auto has = [&](const char* e) { return info_.extensions.find(e) != std::string::npos ? "yes" : "no"; };
  fmt::print(stderr,
             "{}: beside the empty kernel: cl_khr_command_buffer {}, cl_khr_subgroups {}, cl_intel_subgroups {}, "
             "cl_khr_fp16 {}; extensions: {}\n",
             name(), has("cl_khr_command_buffer"), has("cl_khr_subgroups"), has("cl_intel_subgroups"),
             has("cl_khr_fp16"), info_.extensions);
}

// What a barrier across the groups of one launch costs (a persistent kernel's phases instead of launches),
// and whether a plain load after it sees the other groups' writes; groups of 128, 1, 2 and 4 per compute
// unit.
void OpenclBackend::probe_grid_sync() {
  using clock = std::chrono::steady_clock;
  const int units = (int)info_.compute_units, rounds = 500;
  for (int per : {1, 2, 4}) {
    const int P = units * per;
    auto* cnt = static_cast<int32_t*>(alloc(4 * sizeof(int32_t)));
    auto* data = static_cast<int32_t*>(alloc(P * sizeof(int32_t)));
    auto* bad = static_cast<int32_t*>(alloc(P * sizeof(int32_t)));
    const std::vector<int32_t> zero(P, -1), z4(4, 0);
    copy_from_host(cnt, z4.data(), 4 * sizeof(int32_t));
    copy_from_host(data, zero.data(), P * sizeof(int32_t));
    synchronize();
    const auto t0 = clock::now();
    launch(ops("grid_sync_probe"), {(size_t)P * 128}, {128}, cnt, data, bad, (cl_int)rounds);
    synchronize();
    const double us = std::chrono::duration<double, std::micro>(clock::now() - t0).count();
    std::vector<int32_t> b(P), c(4);
    copy_to_host(b.data(), bad, P * sizeof(int32_t));
    copy_to_host(c.data(), cnt, 4 * sizeof(int32_t));
    int64_t errs = 0;
    for (int32_t e : b) errs += e;
    fmt::print(stderr,
               "{}: a barrier across {} groups of 128 ({} a compute unit): {:.2f} us each ({} in {:.0f} us); "
               "stale plain loads after it: {} of {}; gave up waiting: {}\n",
               name(), P, per, us / (2 * rounds), 2 * rounds, us, errs, (int64_t)P * rounds, c[2]);
    dealloc(bad);
    dealloc(data);
    dealloc(cnt);
    if (c[2]) break;
  }
}

// What one dependent step costs inside a work-group (the floor of a kernel bound by its chain: a norm's tree,
// a last group's reads of the others' results): the host time of a launch of n steps less that of one step,
// over n - 1, the best of three each.
void OpenclBackend::probe_floors() {
  auto timed = [&](auto&& run, int steps) { return best_waited_us(*this, 3, [&](int) { run(steps); }); };
  auto per_step = [&](auto&& run) {
    const int n = 4096;
    return (timed(run, n) - timed(run, 1)) / (n - 1);
  };
  // A cycle of dependent loads through `bytes`, one int a 256-byte line, the lines in a scrambled order (an
  // odd multiplier permutes a power of two): 128 MiB is past the L2 of the GPUs here, 16 KiB is not. Each run
  // starts 8,192 steps further along the cycle, so no run reads lines an earlier one left in a cache (the
  // 128 MiB cycle has 64 such starts; a chain's probe makes 6 runs).
  auto line = [](size_t i, size_t lines) { return (i * 40503) % lines; };
  auto cycle = [&](size_t bytes) {
    const size_t lines = bytes / 256, per = 64;
    std::vector<int32_t> p(bytes / 4, 0);
    for (size_t i = 0; i < lines; ++i)
      p[line(i, lines) * per] = (int32_t)(line((i + 1) % lines, lines) * per);
    void* d = alloc(bytes);
    copy_from_host(d, p.data(), bytes);
    return d;
  };
  const size_t far_bytes = size_t(128) << 20, near_bytes = size_t(16) << 10;
  void* far = cycle(far_bytes);
  void* near = cycle(near_bytes);
  auto* x = static_cast<int32_t*>(alloc(64 * sizeof(int32_t)));
  zero(x, 64 * sizeof(int32_t));
  auto chain = [&](void* p, size_t bytes) {
    size_t run = 0;
    return per_step([&](int n) {
      const size_t lines = bytes / 256, start = line((run++ * 8192) % lines, lines) * 64;
      launch(ops("floor_chain"), {1}, {1}, p, (cl_int)start, (cl_int)n, x);
    });
  };
  auto group = [&](const char* k) {
    return per_step([&](int n) { launch(ops(k), {64}, {64}, x, (cl_int)n); });
  };
  const double load_far = chain(far, far_bytes), load_near = chain(near, near_bytes);
  const double fence = group("floor_fence"), gbar = group("floor_gbarrier"), lbar = group("floor_lbarrier");
  const double atom = per_step([&](int n) { launch(ops("floor_atomic"), {1}, {1}, x, (cl_int)n, x + 32); });
  synchronize();
  dealloc(x);
  dealloc(near);
  dealloc(far);
  fmt::print(stderr,
             "{}: one dependent step in a work-group: a global load {:.3f} us (through 128 MiB) / {:.3f} us "
             "(16 KiB); a global store and fence {:.3f} us; a global store and a barrier of 64 with a global "
             "fence {:.3f} us; a local store, read and two local barriers {:.3f} us; an atomic add "
             "waiting for the last one's result {:.3f} us\n",
             name(), load_far, load_near, fence, gbar, lbar, atom);
}

// What fetching a kernel's code costs a launch (kProbeCodeSource): 32 groups of 64 (as many as the decode
// attention of qwen3-30b-a3b) run 2,048 multiply-adds a work-item, one launch at a time, waited for, the best
// of 64: from ~32 KB of straight-line code, the eight copies in turn (cold) or one copy again and again
// (hot), and from a loop. cold - hot: what fetching the code from where the last launches left it costs;
// cold - loop: the same with whatever a launch fetches anew every time (a driver may flush the SM's caches).
void OpenclBackend::probe_code() {
  Prog& p = program(probe_code_, [] { return ProgramText{std::string(kProbeCodeSource), ""}; });
  const size_t n = 32 * 64;
  auto* o = static_cast<float*>(alloc(n * 4 * sizeof(float)));
  zero(o, n * 4 * sizeof(float));
  auto best = [&](const char* base, bool rotate) {
    std::array<cl_kernel, 8> k;
    for (int c = 0; c < 8; ++c) k[c] = p.kernel(fmt::format("{}{}", base, rotate ? c : 0));
    return best_waited_us(*this, 64,
                          [&](int i) { launch(k[i % 8], {n}, {64}, o, 0.999f, 0.001f, (cl_int)64); });
  };
  best("floor_code", true);  // builds the kernels, warms the clocks
  const double cold = best("floor_code", true), hot = best("floor_code", false),
               loop = best("floor_loop", true);
  dealloc(o);
  fmt::print(
      stderr,
      "{}: a launch of 32 groups of 64, 2,048 multiply-adds a work-item, waited for: {:.2f} us from ~32 KB "
      "of straight-line code (eight copies in turn), {:.2f} us from one copy again and again, {:.2f} us "
      "from a loop; fetching the code: {:.3f} us a KB against the hot copy, {:.3f} against the loop\n",
      name(), cold, hot, loop, (cold - hot) / 32, (cold - loop) / 32);
}

Kernel OpenclBackend::clone_kernel(cl_kernel k) {
  char name[128] = {0};
  cl_program prog = nullptr;
  XP_CL(clGetKernelInfo, k, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, nullptr);
  XP_CL(clGetKernelInfo, k, CL_KERNEL_PROGRAM, sizeof prog, &prog, nullptr);
  cl_int err = CL_SUCCESS;
  Kernel inst(api().clCreateKernel(prog, name, &err));
  if (err != CL_SUCCESS) throw_cl_error(err, "clCreateKernel", __FILE__, __LINE__);
  labels_.emplace(inst.get(), kernel_label(k));
  return inst;
}

// Not XP_CL: this runs from the destructor too, where a failed query only loses a figure.
std::string OpenclBackend::kernel_label(cl_kernel k) {
  auto it = labels_.find(k);
  if (it != labels_.end()) return it->second;
  char name[128] = {0};
  api().clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, nullptr);
  std::string label = name;
  cl_program prog = nullptr;
  char opts[256] = {0};
  if (api().clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof prog, &prog, nullptr) == CL_SUCCESS &&
      api().clGetProgramBuildInfo(prog, info_.device, CL_PROGRAM_BUILD_OPTIONS, sizeof opts - 1, opts,
                                  nullptr) == CL_SUCCESS) {
    const std::string o = opts;
    if (const size_t p = o.find("-DWT_"); p != std::string::npos)
      label += " " + o.substr(p + 5, o.find(' ', p) == std::string::npos ? std::string::npos
                                                                         : o.find(' ', p) - p - 5);
  }
  return labels_[k] = label;
}

void OpenclBackend::harvest_profile() {
  bool first = true;  // the first kernel after a read: its gap spans the read and the host's work
  for (auto& [k, ev] : pending_) {
    cl_ulong tq = 0, ts = 0, t0 = 0, t1 = 0;
    auto at = [&](cl_profiling_info what, cl_ulong* t) {
      return api().clGetEventProfilingInfo(ev, what, sizeof *t, t, nullptr) == CL_SUCCESS;
    };
    if (at(CL_PROFILING_COMMAND_QUEUED, &tq) && at(CL_PROFILING_COMMAND_SUBMIT, &ts) &&
        at(CL_PROFILING_COMMAND_START, &t0) && at(CL_PROFILING_COMMAND_END, &t1)) {
      auto& [n, ns] = profile_ns_[kernel_label(k)];
      ++n;
      ns += (double)(t1 - t0);
      Idle& d = idle_;
      d.submit_lag_ns += ts > tq ? (double)(ts - tq) : 0.0, ++d.kernels;
      if (d.last_end && t0 > d.last_end) {
        const double gap = (double)(t0 - d.last_end);
        if (first) {
          d.across_reads_ns += gap;
        } else {
          d.gap_ns += gap, ++d.gaps;
          if (ts > d.last_end) d.late_ns += std::min(gap, (double)(ts - d.last_end));
        }
      }
      d.last_end = std::max(d.last_end, t1);
      first = false;
    }
    api().clReleaseEvent(ev);
  }
  pending_.clear();
}

void OpenclBackend::log_stats() {
  if (stats_on_)
    fmt::print(
        stderr,
        "{}: {} enqueues, {} blocking, {} reads to the host; the last step (between the last two reads): {} "
        "enqueues, {} blocking (the read included), {:.0f} us of host time in kernel launches, {:.0f} us "
        "from read to read\n",
        name(), stats_.enqueues, stats_.blocking, stats_.reads, stats_.step_enqueues, stats_.step_blocking,
        stats_.step_launch_us, stats_.step_wall_us);
  if (!profile_ || profile_ns_.empty()) return;
  std::vector<std::pair<std::string, std::pair<uint64_t, double>>> rows(profile_ns_.begin(),
                                                                        profile_ns_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  double total = 0;
  for (const auto& r : rows) total += r.second.second;
  fmt::print(stderr, "{}: device time per kernel over {} reads to the host ({:.1f} ms in all)\n", name(),
             stats_.reads, total / 1e6);
  for (const auto& [label, v] : rows)
    fmt::print(stderr, "  {:>10.2f} ms {:>8} launches {:>9.2f} us each  {}\n", v.second / 1e6, v.first,
               v.second / 1e3 / (double)v.first, label);
  // Where the device waited between kernels, by the events' timestamps: a gap whose kernel was submitted
  // after the previous one ended waited (that long) for the host or the driver to hand it over.
  const Idle& d = idle_;
  fmt::print(
      stderr,
      "{}: the device idle between kernels: {:.2f} ms in {} gaps between reads ({:.2f} us each), {:.2f} ms "
      "of it waiting for a later submission; {:.2f} ms across the {} reads; {:.1f} us from queued to "
      "submitted on average\n",
      name(), d.gap_ns / 1e6, d.gaps, d.gaps ? d.gap_ns / 1e3 / (double)d.gaps : 0.0, d.late_ns / 1e6,
      d.across_reads_ns / 1e6, stats_.reads, d.kernels ? d.submit_lag_ns / 1e3 / (double)d.kernels : 0.0);
}

}  // namespace xpert::opencl
