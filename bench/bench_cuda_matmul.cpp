// CUDA kernel bench: speed-of-light figures of the matmul and MoE kernels.
//   copy:    device-to-device copy bandwidth (bytes read + written), the roofline of everything below
//   decode:  m = 1 matrix-vector products at real shapes, GB/s of weights read, % of copy bandwidth
//            (W rotated over enough copies that it streams from HBM, not L2)
//   moe:     one decode step of a qwen3-30b-a3b MoE layer (128 experts, top 8, 2048 / 768, Q4_K gate/up,
//            Q6_K down): GB/s of the 8 experts' weights
//   prefill: m = 512 tensor-core products, TFLOP/s; and the MoE layer at 512 tokens
// Every kernel case is timed as a CUDA graph of many launches (launch gaps as in a captured decode step);
// the copy as plain stream copies (cudaMemcpyAsync device to device).
// Usage: bench_cuda_matmul [quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/weight_layout.h"
#include "base/error.h"
#include "quant/quant.h"

using namespace xpert;
using namespace xpert::cuda;

namespace {

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& f : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    f = (float)((double)(seed >> 40) * 0x1p-23 - 1.0);
  }
  return v;
}

// n rows of k: 64 distinct quantized rows tiled (quantizing GBs with the reference quantizers is slow), in
// the device layout of matrices of `rows` rows (default n).
DeviceBuffer make_weights(DType t, int64_t n, int64_t k, int copies = 1, int64_t rows = 0) {
  const size_t rb = row_bytes(t, k);
  std::vector<uint8_t> pool(rb * 64);
  const std::vector<float> src = random_values((size_t)(64 * k), 42);
  for (int j = 0; j < 64; ++j) quantize_row(t, src.data() + j * k, pool.data() + j * rb, k);
  std::vector<uint8_t> w(rb * n);
  for (int64_t j = 0; j < n; ++j) std::memcpy(w.data() + j * rb, pool.data() + (j * 7 % 64) * rb, rb);
  DeviceBuffer d(w.size() * copies);
  for (int c = 0; c < copies; ++c)
    upload_weights(d.as<uint8_t>() + w.size() * c, w.data(), w.size(), t, k, rows ? rows : n, nullptr);
  XPERT_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

// Median over `reps` graph replays of `iters` calls of f(i); returns seconds per call.
template <class F>
double time_graph(cudaStream_t s, int iters, int reps, F&& f) {
  f(0);  // outside the capture first: lazy module loading
  XPERT_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  XPERT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) f(i);
  XPERT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  XPERT_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  XPERT_CUDA_CHECK(cudaGraphLaunch(ge, s));  // warm-up
  XPERT_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, s);
    XPERT_CUDA_CHECK(cudaGraphLaunch(ge, s));
    cudaEventRecord(b, s);
    XPERT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3 / iters;
}

// The same without a graph (a memcpy node in a graph can run on a copy engine, slower than the SMs).
template <class F>
double time_stream(cudaStream_t s, int iters, int reps, F&& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a, s);
    for (int i = 0; i < iters; ++i) f(i);
    cudaEventRecord(b, s);
    XPERT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3 / iters;
}

struct Row {
  std::string what;
  std::string figure;
};
std::vector<Row> g_summary;

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  const auto devs = list_devices();
  if (devs.empty()) {
    std::printf("no CUDA device: %s\n", no_device_reason().c_str());
    return 1;
  }
  const DeviceInfo& dv = devs[0];
  std::printf("device: %s, cc %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", dv.name.c_str(), dv.cc_major,
              dv.cc_minor, dv.sm_count, dv.total_bytes / 1073741824.0, dv.l2_bytes / 1048576.0);
  Stream stream;
  matmul_init();

  // Copy bandwidth: 2 GiB device to device, read + write counted; measured again at the end, the better
  // of the two is the roofline (the first run also brings the clocks up from idle).
  const size_t copy_bytes = (size_t)2 << 30;
  DeviceBuffer copy_a(copy_bytes), copy_b(copy_bytes);
  XPERT_CUDA_CHECK(cudaMemset(copy_a.data(), 1, copy_bytes));
  auto measure_copy = [&] {
    return 2.0 * copy_bytes /
           time_stream(stream, 8, 9,
                       [&](int) {
                         XPERT_CUDA_CHECK(cudaMemcpyAsync(copy_b.data(), copy_a.data(), copy_bytes,
                                                          cudaMemcpyDeviceToDevice, stream));
                       }) /
           1e9;
  };
  for (int i = 0; i < 3; ++i) measure_copy();  // warm-up: clocks
  double copy_gbs = measure_copy();
  std::printf("copy: %.0f GB/s (read + write)\n", copy_gbs);

  // Decode matrix-vector products at m = 1.
  struct Mv {
    const char* name;
    DType t;
    int64_t k, n;
  };
  const Mv mvs[] = {
      {"attn_q   2048->4096", DType::Q4_K, 2048, 4096},
      {"attn_out 4096->2048", DType::Q4_K, 4096, 2048},
      {"expert   2048->768 ", DType::Q4_K, 2048, 768},
      {"output   2048->151936", DType::Q6_K, 2048, 151936},
      {"output   2048->151936", DType::Q8_0, 2048, 151936},
      {"attn_q   2048->4096", DType::Q8_0, 2048, 4096},
      {"attn_q   2048->4096", DType::Q6_K, 2048, 4096},
      {"attn_q   2048->4096", DType::Q5_K, 2048, 4096},
      {"attn_q   2048->4096", DType::Q4_0, 2048, 4096},
      {"attn_q   2048->4096", DType::Q5_0, 2048, 4096},
      {"attn_q   2048->4096", DType::F16, 2048, 4096},
      {"attn_q   2048->4096", DType::BF16, 2048, 4096},
  };
  std::printf("\ndecode, m = 1 (activation quantization + matvec, graph of 100 calls)\n");
  for (const Mv& c : mvs) {
    const size_t wbytes = row_bytes(c.t, c.k) * c.n;
    const int copies = (int)std::max<size_t>(1, std::min<size_t>(64, ((size_t)400 << 20) / wbytes));
    DeviceBuffer w = make_weights(c.t, c.n, c.k, copies);
    const std::vector<float> x = random_values((size_t)c.k, 1);
    DeviceBuffer xd((size_t)c.k * 4), y((size_t)c.n * 4),
        ws(std::max<size_t>(matmul_workspace_bytes(c.t, 1, c.k), 1));
    xd.upload(x.data(), x.size() * 4);
    const double s = time_graph(stream, 100, 5, [&](int i) {
      matmul(c.t, w.as<uint8_t>() + (size_t)(i % copies) * wbytes, c.n, c.k, xd.as<float>(), 1, y.as<float>(),
             c.n, ws.data(), ws.bytes(), stream);
    });
    const double gbs = wbytes / s / 1e9;
    // The matrix-vector kernel alone, on activations prepared once.
    const ActFormat af = activation_format(c.t, 1);
    DeviceBuffer act(std::max<size_t>(activation_bytes(af, 1, c.k), 1));
    const Activations a = quantize_activations(af, xd.as<float>(), c.k, 1, c.k, act.data(), stream);
    const double sk = time_graph(stream, 100, 5, [&](int i) {
      matmul_prepared(c.t, w.as<uint8_t>() + (size_t)(i % copies) * wbytes, c.n, a, y.as<float>(), c.n,
                      stream);
    });
    const double gbk = wbytes / sk / 1e9;
    std::printf(
        "  %-5s %-22s %8.1f us %6.0f GB/s %5.1f %% of copy | kernel alone %8.1f us %6.0f GB/s %5.1f %%\n",
        dtype_name(c.t).data(), c.name, s * 1e6, gbs, 100 * gbs / copy_gbs, sk * 1e6, gbk,
        100 * gbk / copy_gbs);
    g_summary.push_back(
        {fmt::format("decode {} {} (m=1)", dtype_name(c.t), c.name),
         fmt::format("{:.1f} us, {:.0f} GB/s, {:.0f} % of copy; kernel alone {:.1f} us, {:.0f} %", s * 1e6,
                     gbs, 100 * gbs / copy_gbs, sk * 1e6, 100 * gbk / copy_gbs)});
  }

  // MoE layer: qwen3-30b-a3b shapes.
  {
    const int64_t D = 2048, F = 768, E = 128, K = 8;
    const DType gu = DType::Q4_K, dn = DType::Q6_K;
    const size_t gbytes = row_bytes(gu, D) * F, dbytes = row_bytes(dn, F) * D;
    DeviceBuffer gate = make_weights(gu, F * E, D, 1, F), up = make_weights(gu, F * E, D, 1, F),
                 down = make_weights(dn, D * E, F, 1, D);
    const std::vector<bool> all(E, true);
    DeviceBuffer tg(E * 8), tu(E * 8), td(E * 8);
    tg.upload(expert_table(gate.data(), gbytes, all).data(), E * 8);
    tu.upload(expert_table(up.data(), gbytes, all).data(), E * 8);
    td.upload(expert_table(down.data(), dbytes, all).data(), E * 8);
    MoeExperts ex;
    ex.gate_type = ex.up_type = gu;
    ex.down_type = dn;
    ex.n_embd = D;
    ex.n_ff = F;
    ex.n_expert = E;
    ex.gate = tg.as<const void*>();
    ex.up = tu.as<const void*>();
    ex.down = td.as<const void*>();
    for (int64_t n : {(int64_t)1, (int64_t)4, (int64_t)512}) {
      // 16 routings of distinct random experts per token, rotated so the experts stream from HBM.
      constexpr int kSets = 16;
      std::vector<int32_t> ids((size_t)(kSets * n * K));
      uint64_t seed = 99;
      for (int64_t r = 0; r < kSets * n; ++r)
        for (int64_t j = 0; j < K; ++j) {
          int32_t e;
          bool dup;
          do {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            e = (int32_t)((seed >> 33) % E);
            dup = false;
            for (int64_t q = 0; q < j; ++q) dup |= ids[r * K + q] == e;
          } while (dup);
          ids[r * K + j] = e;
        }
      const std::vector<float> wts((size_t)(kSets * n * K), 1.0f / K);
      const std::vector<float> x = random_values((size_t)(n * D), 3);
      DeviceBuffer ids_d(ids.size() * 4), w_d(wts.size() * 4), x_d(x.size() * 4), out((size_t)(n * D) * 4);
      ids_d.upload(ids.data(), ids.size() * 4);
      w_d.upload(wts.data(), wts.size() * 4);
      x_d.upload(x.data(), x.size() * 4);
      DeviceBuffer ws(moe_workspace_bytes(ex, n, K));
      const int iters = n == 512 ? 10 : 100;
      const double s = time_graph(stream, iters, 5, [&](int i) {
        const int set = i % kSets;
        moe_experts(ex,
                    {.x = x_d.as<float>(),
                     .n_tokens = n,
                     .k = K,
                     .ids = ids_d.as<int32_t>() + set * n * K,
                     .weights = w_d.as<float>() + set * n * K,
                     .out = out.as<float>()},
                    ws.data(), ws.bytes(), stream);
      });
      // Bytes: every distinct expert of the step once.
      double bytes = 0;
      for (int set = 0; set < 1; ++set) {
        std::vector<bool> used(E, false);
        for (int64_t q = 0; q < n * K; ++q) used[ids[set * n * K + q]] = true;
        for (int64_t e = 0; e < E; ++e) bytes += used[e] ? 2.0 * gbytes + dbytes : 0.0;
      }
      const double flops = 2.0 * n * K * (3.0 * D * F);
      const double gbs = bytes / s / 1e9;
      std::printf("moe layer n=%-4lld %8.1f us  %6.0f GB/s (%4.1f %% of copy)  %6.1f TFLOP/s\n", (long long)n,
                  s * 1e6, gbs, 100 * gbs / copy_gbs, flops / s / 1e12);
      g_summary.push_back({fmt::format("MoE layer qwen3-30b-a3b, {} tokens", n),
                           fmt::format("{:.1f} us, {:.0f} GB/s ({:.0f} % of copy), {:.1f} TFLOP/s", s * 1e6,
                                       gbs, 100 * gbs / copy_gbs, flops / s / 1e12)});
    }
  }

  // Prefill at m = 512.
  std::printf("\nprefill, m = 512 (activation conversion + tensor-core product)\n");
  const Mv pfs[] = {
      {"attn_q   2048->4096", DType::Q4_K, 2048, 4096},     {"attn_out 4096->2048", DType::Q4_K, 4096, 2048},
      {"output   2048->151936", DType::Q6_K, 2048, 151936}, {"attn_q   2048->4096", DType::Q8_0, 2048, 4096},
      {"attn_q   2048->4096", DType::Q6_K, 2048, 4096},     {"attn_q   2048->4096", DType::Q4_0, 2048, 4096},
      {"attn_q   2048->4096", DType::F16, 2048, 4096},      {"attn_q   2048->4096", DType::BF16, 2048, 4096},
  };
  for (const Mv& c : pfs) {
    if (quick && c.n > 10000) continue;
    const int64_t m = 512;
    DeviceBuffer w = make_weights(c.t, c.n, c.k);
    const std::vector<float> x = random_values((size_t)(m * c.k), 1);
    DeviceBuffer xd(x.size() * 4), y((size_t)(m * c.n) * 4), ws(matmul_workspace_bytes(c.t, m, c.k));
    xd.upload(x.data(), x.size() * 4);
    const int iters = c.n > 10000 ? 3 : 20;
    const double s = time_graph(stream, iters, 5, [&](int) {
      matmul(c.t, w.data(), c.n, c.k, xd.as<float>(), m, y.as<float>(), c.n, ws.data(), ws.bytes(), stream);
    });
    const double tf = 2.0 * m * c.n * c.k / s / 1e12;
    std::printf("  %-5s %-22s %8.1f us  %6.1f TFLOP/s\n", dtype_name(c.t).data(), c.name, s * 1e6, tf);
    g_summary.push_back({fmt::format("prefill {} {} (m=512)", dtype_name(c.t), c.name),
                         fmt::format("{:.1f} us, {:.1f} TFLOP/s", s * 1e6, tf)});
  }

  const double copy_end = measure_copy();
  std::printf("\ncopy at the end: %.0f GB/s (percentages above use the first figure)\n", copy_end);
  g_summary.insert(g_summary.begin(), {"copy bandwidth (D2D, read+write; start / end)",
                                       fmt::format("{:.0f} / {:.0f} GB/s", copy_gbs, copy_end)});
  std::printf("\n| case | result |\n|---|---|\n");
  for (const Row& r : g_summary) std::printf("| %s | %s |\n", r.what.c_str(), r.figure.c_str());
  return 0;
}
