// Expert-kernel speed on one OpenCL device, as effective weight-read bandwidth against the memory's.
//   ./build/bench/bench_opencl_experts [device=0] [type=Q4_K|Q4_0|Q8_0] [variant=automatic|portable|subgroup16]
//                                      [seconds=2]
// One MoE layer of qwen3-30b-a3b (n_embd 2048, n_ff_exp 768, 128 experts; gate, up and down in `type`) in
// page-aligned host memory, registered as an mmap'ed model's would be. Decode: 8 experts x 1 row per
// submit (a new set of experts each time, so nothing stays in cache), submit + wait timed end to end;
// bandwidth = the 8 experts' weight bytes / time. Prefill: n experts x 32 rows in one submit (n = 128 on
// a GPU, 16 on a CPU device); bandwidth = the experts' bytes (each read once at best) / time, plus int8
// GOPS. Ceilings measured in the same run: the host's memcpy and read bandwidth (all cores) and the
// device's clEnqueueCopyBuffer bandwidth.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/opencl/cl_api.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/expert_device.h"
#include "base/error.h"
#include "quant/quant.h"

using namespace xpert;
using namespace xpert::opencl;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best of a few runs of f(), in seconds.
template <typename F>
double best_time(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// The host's memcpy and read bandwidth over 512 MiB, one thread per core (GB/s; memcpy counts bytes
// copied, not read + written).
std::pair<double, double> host_bandwidth() {
  const size_t bytes = (size_t)512 << 20;
  const int nth = (int)std::max(1u, std::thread::hardware_concurrency());
  std::vector<uint64_t> a(bytes / 8, 1), b(bytes / 8, 0);
  auto split = [&](auto&& body) {
    std::vector<std::thread> th;
    for (int t = 0; t < nth; ++t) th.emplace_back([&, t] { body(a.size() * t / nth, a.size() * (t + 1) / nth); });
    for (auto& t : th) t.join();
  };
  const double copy = best_time(3, [&] {
    split([&](size_t i0, size_t i1) { std::memcpy(b.data() + i0, a.data() + i0, (i1 - i0) * 8); });
  });
  std::vector<uint64_t> sums(nth);
  const double read = best_time(3, [&] {
    split([&](size_t i0, size_t i1) {
      uint64_t s = 0;
      for (size_t i = i0; i < i1; ++i) s += a[i];
      sums[i0 * nth / a.size()] = s;
    });
  });
  return {bytes / copy / 1e9, bytes / read / 1e9};
}

// clEnqueueCopyBuffer between two 512 MiB device buffers (GB/s, bytes copied).
double device_copy_bandwidth(const DeviceInfo& d) {
  const Api& a = api();
  cl_int err = CL_SUCCESS;
  const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)d.platform, 0};
  Context ctx(a.clCreateContext(props, 1, &d.device, nullptr, nullptr, &err));
  Queue q(a.clCreateCommandQueueWithProperties(ctx.get(), d.device, nullptr, &err));
  const size_t bytes = std::min<size_t>((size_t)512 << 20, d.max_alloc_bytes / 2);
  Mem src(a.clCreateBuffer(ctx.get(), CL_MEM_READ_WRITE, bytes, nullptr, &err));
  Mem dst(a.clCreateBuffer(ctx.get(), CL_MEM_READ_WRITE, bytes, nullptr, &err));
  if (!src || !dst) return 0;
  const uint32_t zero = 0;
  XP_CL(clEnqueueFillBuffer, q.get(), src.get(), &zero, 4, 0, bytes, 0, nullptr, nullptr);
  XP_CL(clFinish, q.get());
  const double t = best_time(5, [&] {
    XP_CL(clEnqueueCopyBuffer, q.get(), src.get(), dst.get(), 0, 0, bytes, 0, nullptr, nullptr);
    XP_CL(clFinish, q.get());
  });
  return bytes / t / 1e9;
}

struct HostTensor {
  void* mem = nullptr;
  size_t bytes = 0;
  Weight w;
  HostTensor(DType t, int64_t k, int64_t n, int64_t n_expert, std::mt19937& rng) {
    const size_t rb = row_bytes(t, k);
    constexpr int kPool = 256;
    std::vector<uint8_t> pool(rb * kPool);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt((float)k));
    std::vector<float> row(k);
    for (int r = 0; r < kPool; ++r) {
      for (float& v : row) v = normal(rng);
      quantize_row(t, row.data(), pool.data() + r * rb, k);
    }
    bytes = rb * n * n_expert;
    mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) fail("out of memory for the expert tensors");
    for (int64_t r = 0; r < n * n_expert; ++r)
      std::memcpy(static_cast<uint8_t*>(mem) + r * rb, pool.data() + rng() % kPool * rb, rb);
    w = Weight{.type = t, .data = mem, .ne = {k, n, n_expert}, .n_bytes = bytes};
  }
  ~HostTensor() { munmap(mem, bytes); }
};

KernelVariant parse_variant(const std::string& s) {
  if (s == "automatic") return KernelVariant::automatic;
  if (s == "portable") return KernelVariant::portable;
  if (s == "subgroup16") return KernelVariant::subgroup16;
  fail("unknown variant '{}' (automatic, portable, subgroup16)", s);
}

DType parse_type(const std::string& s) {
  for (DType t : {DType::Q4_K, DType::Q4_0, DType::Q8_0, DType::Q6_K})
    if (dtype_name(t) == s) return t;
  fail("unknown type '{}' (Q4_K, Q4_0, Q8_0, Q6_K)", s);
}

int run(int argc, char** argv) {
  const int index = argc > 1 ? std::stoi(argv[1]) : 0;
  const DType type = parse_type(argc > 2 ? argv[2] : "Q4_K");
  const KernelVariant variant = parse_variant(argc > 3 ? argv[3] : "automatic");
  const double seconds = argc > 4 ? std::stod(argv[4]) : 2.0;
  const int64_t D = 2048, F = 768, E = 128, K_USED = 8, PREFILL_ROWS = 32;

  const DeviceInfo info = device_info(index);
  const auto [host_copy, host_read] = host_bandwidth();
  const double dev_copy = device_copy_bandwidth(info);

  std::mt19937 rng(1);
  HostTensor gate(type, D, F, E, rng), up(type, D, F, E, rng), down(type, F, D, E, rng);
  const double expert_bytes = (double)(gate.bytes + up.bytes + down.bytes) / E;

  const auto t_setup = Clock::now();
  ExpertDevice dev(index, {.variant = variant, .zero_copy = true, .tiled_min_rows = 8});
  dev.add_layer(0, gate.w, up.w, down.w);
  const double setup_s = seconds_since(t_setup);

  std::printf("device   opencl:%d %s (%s), driver %s, %s kernels, weights %s\n", index, info.name.c_str(),
              info.type_name(), info.driver_version.c_str(), variant_name(dev.variant()),
              dev.device_bytes() ? "copied to the device" : "read in place");
  std::printf("ceilings host memcpy %.1f GB/s, host read %.1f GB/s (%u threads), device copy %.1f GB/s\n", host_copy,
              host_read, std::max(1u, std::thread::hardware_concurrency()), dev_copy);
  std::printf("layer    qwen3-30b-a3b experts, %s, %lld x %.2f MiB; setup (kernels + weights) %.2f s\n",
              std::string(dtype_name(type)).c_str(), (long long)E, expert_bytes / 1048576.0, setup_s);

  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto report = [&](const char* what, double bytes, double t, double ops, int64_t rows) {
    const double gbs = bytes / t / 1e9;
    std::printf("| %-22s | %7.3f ms | %8.2f GB/s | %5.1f %% of host memcpy | %5.1f %% of device copy | %7.1f GOPS "
                "| %6lld rows |\n",
                what, t * 1e3, gbs, 100 * gbs / host_copy, dev_copy > 0 ? 100 * gbs / dev_copy : 0.0, ops / t / 1e9,
                (long long)rows);
  };

  {  // decode: one token, top-8
    std::vector<float> x(K_USED * D), y(x.size());
    for (float& v : x) v = normal(rng);
    std::vector<ExpertRows> tasks(K_USED);
    int64_t iters = 0, next = 0;
    auto step = [&] {
      for (int64_t j = 0; j < K_USED; ++j) tasks[j] = {.expert = (int32_t)(next++ % E), .row0 = (int32_t)j, .n_rows = 1};
      dev.submit(0, tasks, x.data(), K_USED, y.data()).wait();
      ++iters;
    };
    for (int i = 0; i < 3; ++i) step();  // warm-up
    iters = 0;
    const auto t0 = Clock::now();
    while (seconds_since(t0) < seconds || iters < 5) step();
    const double t = seconds_since(t0) / iters;
    report("decode (8 experts x 1)", K_USED * expert_bytes, t, 2.0 * K_USED * 3 * D * F, K_USED);
  }
  {  // prefill: n experts x 32 rows
    const int64_t n_exp = info.is_cpu() ? 16 : E, rows = n_exp * PREFILL_ROWS;
    std::vector<float> x(rows * D), y(x.size());
    for (float& v : x) v = normal(rng);
    std::vector<ExpertRows> tasks;
    for (int64_t e = 0; e < n_exp; ++e)
      tasks.push_back({.expert = (int32_t)e, .row0 = (int32_t)(e * PREFILL_ROWS), .n_rows = (int32_t)PREFILL_ROWS});
    dev.submit(0, tasks, x.data(), rows, y.data()).wait();  // warm-up
    int64_t iters = 0;
    const auto t0 = Clock::now();
    while (seconds_since(t0) < seconds || iters < 2) {
      dev.submit(0, tasks, x.data(), rows, y.data()).wait();
      ++iters;
    }
    const double t = seconds_since(t0) / iters;
    const std::string what = fmt::format("prefill ({} x {})", n_exp, PREFILL_ROWS);
    report(what.c_str(), n_exp * expert_bytes, t, 2.0 * rows * 3 * D * F, rows);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_opencl_experts: %s\n", e.what());
    return 1;
  }
}
