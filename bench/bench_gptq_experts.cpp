// GPTQ-INT4 experts on the CPU, native (GPTQ4_G128: qweight + scales as stored) against the Q4_0 repack
// that every other backend reads, at qwen3-30b-a3b shapes (experts 2048 -> 768 gate/up, 768 -> 2048 down,
// group 128). The same random checkpoint in both layouts; n_expert experts per layer, so each step reads
// cold weights.
//   decode:  8 routed experts of a layer per step (gate+up in one matmul_batch, SwiGLU, down), m = 1
//   prefill: one expert's gate matrix times 64 rows
// Prints bytes read per token and layer, GB/s, and the 48-layer tokens/s the host experts alone allow.
// Usage: bench_gptq_experts [threads] [layers]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "quant/gptq.h"

using namespace xpert;

namespace {

constexpr int64_t kEmbd = 2048, kFf = 768, kExperts = 128, kUsed = 8, kGroup = 128;

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

// One random GPTQ layer [n][k] written in `t` (native or Q4_0).
std::vector<uint8_t> layer_bytes(DType t, int64_t k, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> qweight(k / 8 * n);
  for (int32_t& w : qweight) w = (int32_t)rng();
  std::normal_distribution<float> d(0.01f, 0.004f);
  std::vector<uint16_t> scales(k / kGroup * n);
  for (uint16_t& s : scales) s = f32_to_f16(d(rng));
  const gptq::Layer l{.qweight = reinterpret_cast<const uint8_t*>(qweight.data()),
                      .scales = reinterpret_cast<const uint8_t*>(scales.data()),
                      .k = k,
                      .n = n,
                      .group = kGroup};
  std::vector<uint8_t> out(row_bytes(t, k) * n);
  if (t == DType::Q4_0) gptq::repack_q4_0(l, {}, {}, out.data());
  else gptq::write_native(l, t, out.data());
  return out;
}

void run(DType t, int layers, ThreadPool& pool) {
  const size_t gate_bytes = row_bytes(t, kEmbd) * kFf, down_bytes = row_bytes(t, kFf) * kEmbd;
  const size_t per_layer = (2 * gate_bytes + down_bytes) * kExperts;
  std::vector<uint8_t> w((size_t)layers * per_layer);
  const std::vector<uint8_t> g = layer_bytes(t, kEmbd, kFf, 1), dn = layer_bytes(t, kFf, kEmbd, 2);
  for (int l = 0; l < layers; ++l)
    for (int64_t e = 0; e < kExperts; ++e) {
      uint8_t* base = w.data() + l * per_layer;
      std::memcpy(base + e * gate_bytes, g.data(), gate_bytes);
      std::memcpy(base + (kExperts + e) * gate_bytes, g.data(), gate_bytes);
      std::memcpy(base + 2 * kExperts * gate_bytes + e * down_bytes, dn.data(), down_bytes);
    }
  std::vector<float> x(64 * kEmbd), gates(kUsed * kFf), ups(kUsed * kFf), ys(kUsed * kEmbd), y64(64 * kFf);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  std::vector<cpu::MatmulJob> jobs;
  const double step = seconds_per_run(
      [&] {
        for (int l = 0; l < layers; ++l) {
          const uint8_t* base = w.data() + l * per_layer;
          int64_t e[kUsed];
          for (auto& v : e) v = rng() % kExperts;
          jobs.clear();
          for (int64_t j = 0; j < kUsed; ++j) {
            jobs.push_back({t, base + e[j] * gate_bytes, kFf, kEmbd, x.data(), 1, gates.data() + j * kFf, kFf});
            jobs.push_back({t, base + (kExperts + e[j]) * gate_bytes, kFf, kEmbd, x.data(), 1, ups.data() + j * kFf, kFf});
          }
          cpu::matmul_batch(jobs, pool);
          cpu::swiglu(gates.data(), ups.data(), gates.data(), kUsed * kFf);
          jobs.clear();
          for (int64_t j = 0; j < kUsed; ++j)
            jobs.push_back({t, base + 2 * kExperts * gate_bytes + e[j] * down_bytes, kEmbd, kFf, gates.data() + j * kFf,
                            1, ys.data() + j * kEmbd, kEmbd});
          cpu::matmul_batch(jobs, pool);
        }
      },
      1.5);
  const double bytes = (double)kUsed * (2 * gate_bytes + down_bytes);
  std::printf("%-10s decode: %.2f MB per token and layer (%.3f bits/weight), %.1f us per layer, %.1f GB/s, "
              "48 layers -> %.1f t/s\n",
              std::string(dtype_name(t)).c_str(), bytes / 1e6, bytes * 8 / (kUsed * 3.0 * kEmbd * kFf),
              step / layers * 1e6, bytes * layers / step / 1e9, 1.0 / (step / layers * 48));
  int64_t next = 0;
  const double pre = seconds_per_run(
      [&] {
        const int64_t i = next++ % (layers * kExperts);
        cpu::matmul(t, w.data() + i / kExperts * per_layer + (i % kExperts) * gate_bytes, kFf, kEmbd, x.data(), 64,
                    y64.data(), kFf, pool);
      },
      1.0);
  std::printf("%-10s prefill: one %lldx%lld matrix x 64 rows: %.1f us, %.1f GFLOP/s\n", std::string(dtype_name(t)).c_str(),
              (long long)kFf, (long long)kEmbd, pre * 1e6, 2.0 * 64 * kFf * kEmbd / pre / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : ThreadPool::default_threads();
  const int layers = argc > 2 ? std::atoi(argv[2]) : 2;
  ThreadPool pool(threads);
  std::printf("threads %d, layers %d, %lld experts each\n", threads, layers, (long long)kExperts);
  run(DType::Q4_0, layers, pool);
  run(DType::GPTQ4_G128, layers, pool);
  return 0;
}
