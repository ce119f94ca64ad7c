// Shared helpers of the CUDA op tests: skip without a GPU, device copies of host vectors (raw and through a
// Backend), random data, and the CPU reference run over row slices on several threads (the references are
// scalar and slow).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "../unit/test_data.h"
#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/weight_layout.h"
#include "base/error.h"
#include "quant/quant.h"

namespace xpert::cudatest {

inline bool have_gpu() {
  static const bool have = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();
    return ok;
  }();
  return have;
}

#define XPERT_REQUIRE_GPU() \
  if (!::xpert::cudatest::have_gpu()) GTEST_SKIP() << "no CUDA device"

template <class T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 1));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// Weights (whole matrices of `rows` rows of row_len values) as the kernels read them (weight_layout.h).
inline cuda::DeviceBuffer weights_to_device(const std::vector<uint8_t>& w, DType t, int64_t row_len,
                                            int64_t rows) {
  cuda::DeviceBuffer b(std::max<size_t>(w.size(), 1));
  cuda::upload_weights(b.data(), w.data(), w.size(), t, row_len, rows, nullptr);
  XPERT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return b;
}

template <class T>
std::vector<T> from_device(const cuda::DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  XPERT_CUDA_CHECK(cudaDeviceSynchronize());
  b.download(v.data(), count * sizeof(T));
  return v;
}

// Uniform in [-1, 1) from a 64-bit LCG: the unit tests' generator (test_data.h).
using ::xpert::random_values;

inline uint64_t lcg_next(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return s >> 33;
}

// n rows of k quantized random values: a pool of distinct rows tiled in a pseudo-random order (the
// K-quant reference quantizers are too slow for 300 M elements).
inline std::vector<uint8_t> random_weights(DType t, int64_t n, int64_t k, uint64_t seed, int64_t pool = 256) {
  const size_t rb = row_bytes(t, k);
  pool = std::min(pool, n);
  std::vector<uint8_t> p(rb * pool);
  for (int64_t r = 0; r < pool; ++r) {
    const std::vector<float> src = random_values((size_t)k, seed + 7919 * (uint64_t)r);
    quantize_row(t, src.data(), p.data() + r * rb, k);
  }
  std::vector<uint8_t> w(rb * n);
  uint64_t s = seed;
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(w.data() + r * rb, p.data() + (r < pool ? r : lcg_next(s) % pool) * rb, rb);
  return w;
}

// Runs f(begin, end) over [0, n) split across the hardware threads.
template <class F>
void parallel_rows(int64_t n, F&& f) {
  const int64_t nth = std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), 32));
  const int64_t per = (n + nth - 1) / nth;
  std::vector<std::thread> th;
  for (int64_t b = 0; b < n; b += per) th.emplace_back([&f, b, e = std::min(n, b + per)] { f(b, e); });
  for (auto& t : th) t.join();
}

// cpu::matmul_reference for W rows [j0, j1) only, in parallel; y: [m][ldy] (columns j0..j1 written).
inline void reference_rows(DType t, const uint8_t* w, int64_t k, const float* x, int64_t m, float* y,
                           int64_t ldy, int64_t j0, int64_t j1) {
  const size_t rb = row_bytes(t, k);
  parallel_rows(j1 - j0, [&](int64_t b, int64_t e) {
    cpu::matmul_reference(t, w + (j0 + b) * rb, e - b, k, x, m, y + j0 + b, ldy);
  });
}

// A copy of host data in a Backend's memory (its alloc / copy_from_host), freed with it.
struct OnDevice {
  Backend& b;
  void* p;
  OnDevice(Backend& b, const void* data, size_t bytes) : b(b), p(b.alloc(bytes)) {
    b.copy_from_host(p, data, bytes);
  }
  OnDevice(Backend& b, const std::vector<float>& v) : OnDevice(b, v.data(), v.size() * 4) {}
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  ~OnDevice() { b.dealloc(p); }
  float* f() const { return static_cast<float*>(p); }
  std::vector<float> get(size_t n) const {
    std::vector<float> v(n);
    b.copy_to_host(v.data(), p, n * 4);
    return v;
  }
};

}  // namespace xpert::cudatest
