// XPERT_TRACE=1: where a decode step's time goes inside its CUDA graph (trace.h). After every
// launch_pdl launch, a one-warp stamp kernel waits for that kernel (PDL) and writes the GPU clock and the
// kernel's tag; the time between two stamps is the kernel between them plus one stamp launch (~0.7 us on
// the H200: bench/bench_cuda_floor.cu). trace_dump() prints the per-kernel means. A measurement knob:
// the stamps lengthen the step, so compare kernels with each other, not the traced step with an untraced one.
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/trace.h"

namespace xpert::cuda::detail {
namespace {

constexpr unsigned kCap = 1u << 22;  // stamps kept per device; later ones are dropped

struct Trace {
  unsigned long long* t = nullptr;
  int* tag = nullptr;
  unsigned* count = nullptr;
};

std::mutex mu;
std::map<int, Trace> traces;       // by device
using Tag = std::pair<const void*, const char*>;  // kernel, what kind of launch (a string literal or null)
std::vector<Tag> tag_fns;                         // tag -> kernel
std::map<Tag, int> fn_tags;

__global__ void stamp_kernel(unsigned long long* t, int* tags, unsigned* count, int tag) {
  pdl_begin();
  if (threadIdx.x == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    const unsigned i = atomicAdd(count, 1u);
    if (i < kCap) {
      t[i] = now;
      tags[i] = tag;
    }
  }
}

std::string kernel_name(const void* fn) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, fn) != cudaSuccess || !mangled) return "?";
  int st = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &st), std::free);
  std::string s = st == 0 && d ? d.get() : mangled;
  for (const char* ns : {"xpert::cuda::", "detail::", "(anonymous namespace)::", "dev::", "(xpert::DType)"})
    for (size_t p; (p = s.find(ns)) != std::string::npos;) s.erase(p, std::char_traits<char>::length(ns));
  if (const size_t p = s.find('('); p != std::string::npos) s.resize(p);  // the parameter list
  return s.size() > 90 ? s.substr(0, 90) : s;
}

// XPERT_TRACE's value: 1 counts gaps between stamps up to 200 us as the kernel's; a larger number is that
// limit in us (for steps whose kernels run longer, e.g. many streams). Longer gaps are the host's.
double trace_max_gap_us() {
  static const double us = [] {
    const char* e = std::getenv("XPERT_TRACE");
    const int v = e ? std::atoi(e) : 0;
    return v <= 0 ? 0.0 : v == 1 ? 200.0 : (double)v;
  }();
  return us;
}

std::string tag_name(const Tag& t) {
  return t.second ? kernel_name(t.first) + " " + t.second : kernel_name(t.first);
}

}  // namespace

bool trace_enabled() { return trace_max_gap_us() > 0; }

void trace_after(const void* kernel, cudaStream_t stream, const char* kind) {
  int dev = 0, tag = 0;
  XPERT_CUDA_CHECK(cudaGetDevice(&dev));
  Trace tr;
  {
    const std::lock_guard<std::mutex> lock(mu);
    auto it = traces.find(dev);
    if (it == traces.end()) {
      Trace n;
      XPERT_CUDA_CHECK(cudaMalloc(&n.t, sizeof(unsigned long long) * kCap));
      XPERT_CUDA_CHECK(cudaMalloc(&n.tag, sizeof(int) * kCap));
      XPERT_CUDA_CHECK(cudaMalloc(&n.count, sizeof(unsigned)));
      XPERT_CUDA_CHECK(cudaMemset(n.count, 0, sizeof(unsigned)));
      it = traces.emplace(dev, n).first;
    }
    tr = it->second;
    auto [f, fresh] = fn_tags.emplace(Tag{kernel, kind}, (int)tag_fns.size());
    if (fresh) tag_fns.push_back({kernel, kind});
    tag = f->second;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  XPERT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, stamp_kernel, tr.t, tr.tag, tr.count, tag));
}

void trace_dump() {
  const std::lock_guard<std::mutex> lock(mu);
  for (auto& [dev, tr] : traces) {
    if (cudaSetDevice(dev) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) continue;
    unsigned n = 0;
    if (cudaMemcpy(&n, tr.count, sizeof n, cudaMemcpyDeviceToHost) != cudaSuccess) continue;
    n = std::min(n, kCap);
    std::vector<unsigned long long> t(n);
    std::vector<int> tag(n);
    if (n == 0 || cudaMemcpy(t.data(), tr.t, sizeof(t[0]) * n, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(tag.data(), tr.tag, sizeof(tag[0]) * n, cudaMemcpyDeviceToHost) != cudaSuccess)
      continue;
    std::vector<double> sum(tag_fns.size(), 0.0);
    std::vector<long> cnt(tag_fns.size(), 0);
    double total = 0;
    for (unsigned i = 1; i < n; ++i) {
      const double us = (double)(t[i] - t[i - 1]) * 1e-3;
      if (us < 0 || us > trace_max_gap_us()) continue;  // host gaps between steps, or a clock step
      sum[tag[i]] += us;
      cnt[tag[i]] += 1;
      total += us;
    }
    std::vector<int> order(tag_fns.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = (int)i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return sum[a] > sum[b]; });
    std::fprintf(stderr, "XPERT_TRACE cuda:%d, %u stamps, %.0f us between them:\n", dev, n, total);
    std::fprintf(stderr, "%10s %9s %8s %6s  %s\n", "total us", "launches", "mean us", "share", "kernel");
    for (int k : order)
      if (cnt[k])
        std::fprintf(stderr, "%10.0f %9ld %8.2f %5.1f%%  %s\n", sum[k], cnt[k], sum[k] / (double)cnt[k],
                     100.0 * sum[k] / total, tag_name(tag_fns[k]).c_str());
    XPERT_CUDA_CHECK(cudaMemset(tr.count, 0, sizeof(unsigned)));
  }
}

}  // namespace xpert::cuda::detail
