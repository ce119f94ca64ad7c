// Micro benchmark of the host side of a MoE decode step (what `--num-gpu-experts` leaves to the CPU):
//   pool:    the fork-join latency of ThreadPool::run with an empty job;
//   matmul:  one expert matrix (m = 1) at qwen3-30b-a3b shapes, as GB/s of weight read;
//   layer:   k experts of one layer (gate, up, SwiGLU, down per expert, as moe.cpp's run_expert does)
//            drawn from n_expert experts laid out like a GGUF file, so every step reads cold weights.
// Usage: bench_host_experts [threads] [n_layers]   (experts Q4_K for gate/up, Q6_K for down: Q4_K_M)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/thread_pool.h"
#include "quant/quant.h"

using namespace xpert;

namespace {

constexpr int64_t kEmbd = 2048, kFf = 768, kExperts = 128, kUsed = 8;

template <class F>
double seconds_per_run(F&& f, double min_seconds) {
  f();
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

// n rows of k: 16 distinct quantized rows repeated (K-quant quantization of GBs is slow).
void fill_weights(DType t, int64_t n, int64_t k, uint8_t* w) {
  const size_t rb = row_bytes(t, k);
  std::vector<float> src(16 * k);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& v : src) v = d(rng);
  for (int64_t j = 0; j < 16 && j < n; ++j) quantize_row(t, src.data() + j * k, w + j * rb, k);
  for (int64_t j = 16; j < n; ++j) std::memcpy(w + j * rb, w + (j % 16) * rb, rb);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : ThreadPool::default_threads();
  const int layers = argc > 2 ? std::atoi(argv[2]) : 8;
  ThreadPool pool(threads);
  std::printf("threads %d, layers %d\n", threads, layers);

  std::atomic<int> sink{0};
  const double fj = seconds_per_run(
      [&] {
        for (int i = 0; i < 1000; ++i) pool.run([&](int ith, int) { if (ith == 1 << 30) sink++; });
      },
      0.5);
  std::printf("pool.run, empty job: %.2f us\n", fj / 1000 * 1e6);

  const size_t gate_bytes = row_bytes(DType::Q4_K, kEmbd) * kFf, down_bytes = row_bytes(DType::Q6_K, kFf) * kEmbd;
  const size_t layer_bytes = (2 * gate_bytes + down_bytes) * kExperts;
  std::vector<uint8_t> w((size_t)layers * layer_bytes);
  for (int l = 0; l < layers; ++l)
    for (int64_t e = 0; e < kExperts; ++e) {
      uint8_t* g = w.data() + l * layer_bytes + e * gate_bytes;
      fill_weights(DType::Q4_K, kFf, kEmbd, g);
      std::memcpy(g + kExperts * gate_bytes, g, gate_bytes);
      fill_weights(DType::Q6_K, kEmbd, kFf, w.data() + l * layer_bytes + 2 * kExperts * gate_bytes + e * down_bytes);
    }
  std::vector<float> x(kEmbd, 0.5f), gate(kFf), up(kFf), y(kEmbd);

  // One matrix, read cold (a different expert each call).
  int64_t next = 0;
  const double one = seconds_per_run(
      [&] {
        const int64_t i = next++ % (layers * kExperts);
        const uint8_t* g = w.data() + i / kExperts * layer_bytes + (i % kExperts) * gate_bytes;
        cpu::matmul(DType::Q4_K, g, kFf, kEmbd, x.data(), 1, gate.data(), kFf, pool);
      },
      0.5);
  std::printf("one Q4_K expert matrix %lldx%lld (%.2f MB): %.1f us, %.1f GB/s\n", (long long)kFf,
              (long long)kEmbd, gate_bytes / 1e6, one * 1e6, gate_bytes / one / 1e9);

  // k experts per layer, layer after layer.
  std::mt19937 rng(1);
  const double step = seconds_per_run(
      [&] {
        for (int l = 0; l < layers; ++l) {
          const uint8_t* base = w.data() + l * layer_bytes;
          for (int64_t j = 0; j < kUsed; ++j) {
            const int64_t e = rng() % kExperts;
            cpu::matmul(DType::Q4_K, base + e * gate_bytes, kFf, kEmbd, x.data(), 1, gate.data(), kFf, pool);
            cpu::matmul(DType::Q4_K, base + (kExperts + e) * gate_bytes, kFf, kEmbd, x.data(), 1, up.data(), kFf,
                        pool);
            cpu::swiglu(gate.data(), up.data(), gate.data(), kFf);
            cpu::matmul(DType::Q6_K, base + 2 * kExperts * gate_bytes + e * down_bytes, kEmbd, kFf, gate.data(), 1,
                        y.data(), kEmbd, pool);
          }
        }
      },
      1.0);
  const double bytes = (double)layers * kUsed * (2 * gate_bytes + down_bytes);
  auto report = [&](const char* how, double t) {
    std::printf("%s: %lld experts x %d layers: %.2f ms per step (%.1f us per layer), %.1f GB/s; 48 layers -> %.1f t/s cap\n",
                how, (long long)kUsed, layers, t * 1e3, t / layers * 1e6, bytes / t / 1e9, 1.0 / (t / layers * 48));
  };
  report("one matmul at a time", step);

  // The same with every expert's gate and up in one parallel region, then every down (cpu::matmul_batch).
  std::vector<float> gates(kUsed * kFf), ups(kUsed * kFf), ys(kUsed * kEmbd);
  const double batched = seconds_per_run(
      [&] {
        std::vector<cpu::MatmulJob> jobs;
        for (int l = 0; l < layers; ++l) {
          const uint8_t* base = w.data() + l * layer_bytes;
          int64_t e[kUsed];
          for (auto& v : e) v = rng() % kExperts;
          jobs.clear();
          for (int64_t j = 0; j < kUsed; ++j) {
            jobs.push_back({DType::Q4_K, base + e[j] * gate_bytes, kFf, kEmbd, x.data(), 1, gates.data() + j * kFf, kFf});
            jobs.push_back({DType::Q4_K, base + (kExperts + e[j]) * gate_bytes, kFf, kEmbd, x.data(), 1,
                            ups.data() + j * kFf, kFf});
          }
          cpu::matmul_batch(jobs, pool);
          cpu::swiglu(gates.data(), ups.data(), gates.data(), kUsed * kFf);
          jobs.clear();
          for (int64_t j = 0; j < kUsed; ++j)
            jobs.push_back({DType::Q6_K, base + 2 * kExperts * gate_bytes + e[j] * down_bytes, kEmbd, kFf,
                            gates.data() + j * kFf, 1, ys.data() + j * kEmbd, kEmbd});
          cpu::matmul_batch(jobs, pool);
        }
      },
      1.0);
  report("batched (matmul_batch)", batched);
  return sink.load() == 42;
}
