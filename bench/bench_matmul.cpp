// Micro benchmark of cpu::matmul per weight type:
//   decode  (m = 1):   GB/s of weight read, W sized well past the last-level cache, and W in L2 (k=640);
//   prefill (m = 512): GFLOP/s and tokens/s on a 2560 x 2560 projection.
//   model: the matmuls of the default model's 18 layers (Gemma3 270M: dim 640, Q5_0/Q8_0/Q4_K/Q6_K) at
//          m = 512 and m = 1, as tokens/s of the projections alone.
//   amx:   prefill (m = 512) on the MoE expert shapes (n x k = 768 x 2048 gate/up, 2048 x 768 down) and
//          2048 x 2048, the AMX-INT8 tiles against the AVX-512 VNNI panels: GB/s of W and GFLOP/s.
// Usage: bench_matmul [threads] [type ... | model | moe | amx [type ...]] [decode]
//   (XPERT_ISA=scalar|avx2|avx512 caps the kernels, XPERT_NO_AMX=1 turns the AMX tiles off)
// On a shared machine, compare "cpu" (process CPU seconds per wall second) before trusting a number.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
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

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double g_cpu_utilization = 0;  // of the last seconds_per_run: CPU seconds per wall second

template <class F>
double seconds_per_run(F&& f, double min_seconds) {
  f();  // warm-up
  int runs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_seconds();
  double elapsed = 0;
  do {
    f();
    ++runs;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds);
  g_cpu_utilization = (process_cpu_seconds() - cpu0) / elapsed;
  return elapsed / runs;
}

struct Projection {
  const char* name;
  DType type;
  int64_t n, k;
};

// Two layers of the default model (models/gemma3-270m.gguf, Q4_K_M mixes types: attn_v and ffn_down alternate
// between layers): W is n x k.
const Projection kDefaultLayerPair[] = {
    {"attn_q", DType::Q5_0, 1024, 640},   {"attn_k", DType::Q5_0, 256, 640},
    {"attn_v", DType::Q8_0, 256, 640},    {"attn_output", DType::Q4_K, 640, 1024},
    {"ffn_gate", DType::Q5_0, 2048, 640}, {"ffn_up", DType::Q5_0, 2048, 640},
    {"ffn_down", DType::Q6_K, 640, 2048},
    {"attn_q", DType::Q5_0, 1024, 640},   {"attn_k", DType::Q5_0, 256, 640},
    {"attn_v", DType::Q5_0, 256, 640},    {"attn_output", DType::Q4_K, 640, 1024},
    {"ffn_gate", DType::Q5_0, 2048, 640}, {"ffn_up", DType::Q5_0, 2048, 640},
    {"ffn_down", DType::Q4_K, 640, 2048},
};
constexpr int kDefaultLayerPairs = 9;

void bench_default_model(ThreadPool& pool) {
  // Separate weights per layer so decode reads them from memory as a real forward would.
  std::vector<std::vector<uint8_t>> weights;
  for (int l = 0; l < kDefaultLayerPairs; ++l)
    for (const Projection& p : kDefaultLayerPair) weights.push_back(make_weights(p.type, p.n, p.k));
  for (int64_t m : {512, 1}) {
    const std::vector<float> x = random_values((size_t)(m * 2048), 3);
    std::vector<float> y((size_t)(m * 2048));
    double flop = 0;
    const double s = seconds_per_run(
        [&] {
          flop = 0;
          size_t wi = 0;
          for (int l = 0; l < kDefaultLayerPairs; ++l)
            for (const Projection& p : kDefaultLayerPair) {
              cpu::matmul(p.type, weights[wi++].data(), p.n, p.k, x.data(), m, y.data(), p.n, pool);
              flop += 2.0 * (double)p.n * p.k * m;
            }
        },
        2.0);
    std::printf(
        "default model projections, m=%3d: %7.2f ms per pass, %7.1f tok/s, %6.1f GFLOP/s (cpu %.2f)\n",
        (int)m, s * 1e3, (double)m / s, flop / s / 1e9, g_cpu_utilization);
  }
}

// Decode of the qwen3moe-1.3b synth's experts (Q4_K, hidden 1024, expert ff 512, 8 routed of 64 per layer,
// 12 layers): per layer one matmul_batch of the 8 gate + 8 up products, then one of the 8 down products,
// as the CPU MoE runs them at m = 1. Every expert's weights are distinct, ~85 MB in all: read from DRAM.
void bench_moe_decode(ThreadPool& pool) {
  const int layers = 12, experts = 8;
  const int64_t hidden = 1024, ff = 512;
  std::vector<std::vector<uint8_t>> gate_up, down;
  for (int i = 0; i < layers * experts; ++i) {
    gate_up.push_back(make_weights(DType::Q4_K, 2 * ff, hidden));  // gate and up, one after the other
    down.push_back(make_weights(DType::Q4_K, hidden, ff));
  }
  const std::vector<float> x = random_values((size_t)hidden, 5);
  std::vector<float> h((size_t)(experts * 2 * ff)), y((size_t)(experts * hidden));
  size_t bytes = 0;
  for (int i = 0; i < layers * experts; ++i) bytes += gate_up[i].size() + down[i].size();
  const double s = seconds_per_run(
      [&] {
        for (int l = 0; l < layers; ++l) {
          std::vector<cpu::MatmulJob> jobs;
          for (int e = 0; e < experts; ++e) {
            const uint8_t* w = gate_up[l * experts + e].data();
            const size_t half = gate_up[l * experts + e].size() / 2;
            jobs.push_back({DType::Q4_K, w, ff, hidden, x.data(), 1, h.data() + e * 2 * ff, ff});
            jobs.push_back({DType::Q4_K, w + half, ff, hidden, x.data(), 1, h.data() + e * 2 * ff + ff, ff});
          }
          cpu::matmul_batch(jobs, pool);
          jobs.clear();
          for (int e = 0; e < experts; ++e)
            jobs.push_back({DType::Q4_K, down[l * experts + e].data(), hidden, ff, h.data() + e * 2 * ff, 1,
                            y.data() + e * hidden, hidden});
          cpu::matmul_batch(jobs, pool);
        }
      },
      2.0);
  std::printf("qwen3moe-1.3b experts, decode: %.3f ms per token, %.1f GB/s (%.1f MB, cpu %.2f)\n", s * 1e3,
              (double)bytes / s / 1e9, (double)bytes / 1e6, g_cpu_utilization);
}

// Prefill of one projection under each panel choice (the AMX column only where amx_enabled()).
void bench_amx(ThreadPool& pool, std::vector<DType> types) {
  if (types.empty()) types = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_K};
  const bool amx = amx_enabled();
  if (!amx)
    std::printf("AMX not usable here (cpu amx-int8: %d, kernel grant: %d, XPERT_NO_AMX / XPERT_ISA): VNNI only\n",
                (int)cpu_features().amx_int8, (int)amx_usable());
  const Projection shapes[] = {{"gate/up", DType::F32, 768, 2048}, {"down", DType::F32, 2048, 768},
                               {"square", DType::F32, 2048, 2048}};
  const int64_t m = 512;
  std::printf("prefill, m = %d X rows\n%-5s | %-7s %-11s | %-47s | %-47s | amx/vnni\n", (int)m, "type", "shape",
              "n x k", "vnni panels", "amx tiles");
  for (DType t : types)
    for (const Projection& p : shapes) {
      if (p.k % dtype_info(t).block_size != 0) continue;
      const std::vector<uint8_t> w = make_weights(t, p.n, p.k);
      const std::vector<float> x = random_values((size_t)(m * p.k), 2);
      std::vector<float> y((size_t)(m * p.n));
      const double flop = 2.0 * (double)p.n * p.k * m;
      double s[2] = {0, 0}, cpu[2] = {0, 0};
      for (int i = 0; i < (amx ? 2 : 1); ++i) {
        cpu::set_panel_choice(i == 0 ? cpu::PanelChoice::vnni : cpu::PanelChoice::amx);
        s[i] = seconds_per_run([&] { cpu::matmul(t, w.data(), p.n, p.k, x.data(), m, y.data(), p.n, pool); }, 1.0);
        cpu[i] = g_cpu_utilization;
      }
      cpu::set_panel_choice(cpu::PanelChoice::automatic);
      char col[2][64] = {"", "n/a"}, speedup[16] = "-";
      if (amx) std::snprintf(speedup, sizeof speedup, "%.2fx", s[0] / s[1]);
      for (int i = 0; i < (amx ? 2 : 1); ++i)
        std::snprintf(col[i], sizeof col[i], "%6.2f ms %6.1f GB/s %7.1f GFLOP/s (cpu %.1f)", s[i] * 1e3,
                      (double)w.size() / s[i] / 1e9, flop / s[i] / 1e9, cpu[i]);
      std::printf("%-5s | %-7s %4d x %-4d | %-47s | %-47s | %s\n", std::string(dtype_name(t)).c_str(), p.name,
                  (int)p.n, (int)p.k, col[0], col[1], speedup);
    }
  if (!amx) return;
  // Where the tiles start to pay (matmul.cpp takes them from kAmxMinRows X rows on): Q4_K gate/up at
  // short prompts, time per call.
  std::printf("Q4_K 768 x 2048, short prompts: m, vnni ms, amx ms, amx/vnni\n");
  const std::vector<uint8_t> w = make_weights(DType::Q4_K, 768, 2048);
  for (int64_t ms : {8, 16, 24, 32, 48, 64, 128}) {
    const std::vector<float> x = random_values((size_t)(ms * 2048), 2);
    std::vector<float> y((size_t)(ms * 768));
    double s[2];
    for (int i = 0; i < 2; ++i) {
      cpu::set_panel_choice(i == 0 ? cpu::PanelChoice::vnni : cpu::PanelChoice::amx);
      s[i] = seconds_per_run([&] { cpu::matmul(DType::Q4_K, w.data(), 768, 2048, x.data(), ms, y.data(), 768, pool); },
                             0.3);
    }
    cpu::set_panel_choice(cpu::PanelChoice::automatic);
    std::printf("  m=%3d  %7.3f  %7.3f  %.2fx\n", (int)ms, s[0] * 1e3, s[1] * 1e3, s[0] / s[1]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : ThreadPool::default_threads();
  std::vector<DType> types;
  ThreadPool pool(threads);
  if (argc > 2 && std::string(argv[2]) == "model") {
    std::printf("isa %s, %d threads\n", isa_name(best_isa()), threads);
    bench_default_model(pool);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "moe") {
    std::printf("isa %s, %d threads\n", isa_name(best_isa()), threads);
    bench_moe_decode(pool);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "amx") {
    std::printf("isa %s, %d threads, cpu: %s\n", isa_name(best_isa()), threads, cpu_features_string().c_str());
    for (int i = 3; i < argc; ++i)
      for (uint32_t id = 0; id < 64; ++id) {
        const DTypeInfo* info = dtype_info(id);
        if (info && info->computable && info->name == argv[i]) types.push_back((DType)id);
      }
    bench_amx(pool, types);
    return 0;
  }
  bool decode_only = false;  // "decode" among the types: skip the (slow) prefill column
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "decode") decode_only = true;
    for (uint32_t id = 0; id < 64; ++id) {
      const DTypeInfo* info = dtype_info(id);
      if (info && info->computable && info->name == argv[i]) types.push_back((DType)id);
    }
  }
  if (types.empty())
    types = {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K,
             DType::Q6_K, DType::F16,  DType::BF16, DType::F32};
  std::printf("isa %s, %d threads, cpu: %s\n", isa_name(best_isa()), threads, cpu_features_string().c_str());
  std::printf("%-5s | decode m=1: k=4096, 96 MB of W   | k=640 (K: 1024), 200 KB of W | prefill m=512, k=n=2560\n",
              "type");
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
    const double cpu_dec = g_cpu_utilization;

    // Decode from cache: k = 640 (the default model's width; K-quants: 1024), ~200 KB of W that stays in
    // L2: the kernel's own speed, without DRAM.
    const int64_t k_hot = 640 % dtype_info(t).block_size == 0 ? 640 : 1024, n_hot = (int64_t)(200e3 / (double)row_bytes(t, k_hot));
    const std::vector<uint8_t> w_hot = make_weights(t, n_hot, k_hot);
    std::vector<float> y_hot(n_hot);
    const double s_hot = seconds_per_run(
        [&] {
          for (int rep = 0; rep < 100; ++rep)
            cpu::matmul(t, w_hot.data(), n_hot, k_hot, x_dec.data(), 1, y_hot.data(), n_hot, pool);
        },
        0.5);
    const double gbs_hot = 100.0 * (double)w_hot.size() / s_hot / 1e9;
    const double cpu_hot = g_cpu_utilization;

    if (decode_only) {
      std::printf("%-5s | %6.1f GB/s (%5.2f ms, cpu %.2f) | %6.1f GB/s (cpu %.2f)\n",
                  std::string(dtype_name(t)).c_str(), gbs, s_dec * 1e3, cpu_dec, gbs_hot, cpu_hot);
      continue;
    }
    const int64_t k = 2560, n = 2560, m = 512;
    const std::vector<uint8_t> w = make_weights(t, n, k);
    const std::vector<float> x = random_values((size_t)(m * k), 2);
    std::vector<float> y((size_t)(m * n));
    const double s_pre =
        seconds_per_run([&] { cpu::matmul(t, w.data(), n, k, x.data(), m, y.data(), n, pool); }, 1.0);
    const double gflops = 2.0 * (double)n * k * m / s_pre / 1e9;
    std::printf(
        "%-5s | %6.1f GB/s (%5.2f ms, cpu %.2f) | %6.1f GB/s (cpu %.2f) | %6.1f GFLOP/s (%6.2f ms, %6.0f "
        "tok/s, "
        "cpu %.2f)\n",
        std::string(dtype_name(t)).c_str(), gbs, s_dec * 1e3, cpu_dec, gbs_hot, cpu_hot, gflops, s_pre * 1e3,
        (double)m / s_pre, g_cpu_utilization);
  }
  return 0;
}
