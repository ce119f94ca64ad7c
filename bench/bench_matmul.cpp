// Micro benchmark of cpu::matmul per weight type:
//   decode  (m = 1):   GB/s of weight read, W sized well past the last-level cache;
//   prefill (m = 512): GFLOP/s and tokens/s on a 2560 x 2560 projection.
// Usage: bench_matmul [threads] [type ...]   (XPERT_ISA=scalar|avx2|avx512 caps the kernels)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "quant/quant.h"

using namespace xpert;

namespace {

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& f : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    f = (float)((double)(seed >> 40) * 0x1p-23 - 1.0);
  }
  return v;
}

// n rows of k: 16 distinct quantized rows repeated (quantizing 100 MB with the K-quant searches is slow).
std::vector<uint8_t> make_weights(DType t, int64_t n, int64_t k) {
  const size_t rb = row_bytes(t, k);
  std::vector<uint8_t> w(rb * n);
  const std::vector<float> src = random_values((size_t)(16 * k), 42);
  for (int64_t j = 0; j < 16 && j < n; ++j) quantize_row(t, src.data() + j * k, w.data() + j * rb, k);
  for (int64_t j = 16; j < n; ++j) std::memcpy(w.data() + j * rb, w.data() + (j % 16) * rb, rb);
  return w;
}

template <class F>
double seconds_per_run(F&& f, double min_seconds) {
  f();  // warm-up
  int runs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    f();
    ++runs;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / runs;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : ThreadPool::default_threads();
  std::vector<DType> types;
  for (int i = 2; i < argc; ++i) {
    for (uint32_t id = 0; id < 64; ++id) {
      const DTypeInfo* info = dtype_info(id);
      if (info && info->computable && info->name == argv[i]) types.push_back((DType)id);
    }
  }
  if (types.empty())
    types = {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K,
             DType::F16,  DType::BF16, DType::F32};
  ThreadPool pool(threads);
  std::printf("isa %s, %d threads, cpu: %s\n", isa_name(best_isa()), threads, cpu_features_string().c_str());
  std::printf("%-5s | decode m=1: k=4096, W %4s MB | prefill m=512 k=n=2560\n", "type", "");
  for (DType t : types) {
    // Decode: ~96 MB of weights so every call streams W from DRAM.
    const int64_t k_dec = 4096;
    const int64_t n_dec = (int64_t)(96e6 / (double)row_bytes(t, k_dec));
    const std::vector<uint8_t> w_dec = make_weights(t, n_dec, k_dec);
    const std::vector<float> x_dec = random_values(k_dec, 1);
    std::vector<float> y_dec(n_dec);
    const double s_dec = seconds_per_run(
        [&] { cpu::matmul(t, w_dec.data(), n_dec, k_dec, x_dec.data(), 1, y_dec.data(), n_dec, pool); }, 1.0);
    const double gbs = (double)w_dec.size() / s_dec / 1e9;

    const int64_t k = 2560, n = 2560, m = 512;
    const std::vector<uint8_t> w = make_weights(t, n, k);
    const std::vector<float> x = random_values((size_t)(m * k), 2);
    std::vector<float> y((size_t)(m * n));
    const double s_pre =
        seconds_per_run([&] { cpu::matmul(t, w.data(), n, k, x.data(), m, y.data(), n, pool); }, 1.0);
    const double gflops = 2.0 * (double)n * k * m / s_pre / 1e9;
    std::printf("%-5s | %6.1f GB/s (%5.2f ms, W %5.1f MB) | %6.1f GFLOP/s (%6.2f ms, %7.0f tok/s)\n",
                std::string(dtype_name(t)).c_str(), gbs, s_dec * 1e3, (double)w_dec.size() / 1e6, gflops,
                s_pre * 1e3, (double)m / s_pre);
  }
  return 0;
}
