// CUDA attention and Gated DeltaNet speed on Qwen3.5-35B-A3B's shapes (attention: 16 q heads, 2 kv
// heads, head_dim 256; DeltaNet: 16 key heads, 32 value heads, head dims 128).
//   - device copy bandwidth (bytes read + written), the ceiling for decode;
//   - decode attention at depth 0 / 8K / 32K / 128K: KV bytes read per call / time vs that bandwidth;
//   - prefill attention (512 tokens after a depth): tensor-core rate;
//   - the delta rule over a 512-token prompt: chunked vs recurrent, and one decode step.
// Inputs rotate over several copies so that caches smaller than L2 are not timed from L2.
// Usage: bench_cuda_attention [repetitions]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/check.h"
#include "backend/cuda/gdn.h"
#include "base/half.h"

namespace {

using namespace xpert;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { XPERT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~Buf() { cudaFree(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Fills device memory with random f16 (or f32) values, tiling a random host block.
void fill_random(void* dst, size_t bytes, bool f16, uint64_t seed, float scale = 1.0f) {
  const size_t block = 16 << 20;
  std::vector<uint8_t> h(block);
  uint64_t s = seed;
  for (size_t i = 0; i + 4 <= block; i += 4) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float f = ((float)(s >> 40) * 0x1p-24f * 2.0f - 1.0f) * scale;
    if (f16) {
      const uint16_t v = f32_to_f16(f);
      std::memcpy(&h[i], &v, 2);
      const uint16_t w = f32_to_f16(-f * 0.5f);
      std::memcpy(&h[i + 2], &w, 2);
    } else {
      std::memcpy(&h[i], &f, 4);
    }
  }
  for (size_t off = 0; off < bytes; off += block)
    XPERT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dst) + off, h.data(), std::min(block, bytes - off),
                                cudaMemcpyHostToDevice));
}

// Median over `groups` of the mean time of `reps` calls, in microseconds.
double time_us(int reps, const std::function<void(int)>& call, int groups = 5) {
  cudaEvent_t a, b;
  XPERT_CUDA_CHECK(cudaEventCreate(&a));
  XPERT_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) call(i);  // warm-up
  std::vector<double> t;
  for (int g = 0; g < groups; ++g) {
    XPERT_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) call(g * reps + i);
    XPERT_CUDA_CHECK(cudaEventRecord(b));
    XPERT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    XPERT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1e3 * ms / reps);
  }
  XPERT_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The same, with the `reps` calls captured once in a CUDA graph and replayed (how decode steps run).
double time_graph_us(int reps, const std::function<void(int, cudaStream_t)>& call, int groups = 5) {
  cudaStream_t st;
  XPERT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  call(0, st);  // plans, shared-memory limits: set up outside the capture
  XPERT_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaGraph_t graph;
  XPERT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) call(i, st);
  XPERT_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  XPERT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  XPERT_CUDA_CHECK(cudaGraphLaunch(exec, st));
  cudaEvent_t a, b;
  XPERT_CUDA_CHECK(cudaEventCreate(&a));
  XPERT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int g = 0; g < groups; ++g) {
    XPERT_CUDA_CHECK(cudaEventRecord(a, st));
    XPERT_CUDA_CHECK(cudaGraphLaunch(exec, st));
    XPERT_CUDA_CHECK(cudaEventRecord(b, st));
    XPERT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    XPERT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1e3 * ms / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, atoi(argv[1])) : 20;
  cudaDeviceProp prop{};
  XPERT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // Copy bandwidth: 1 GiB device to device, bytes read + written.
  const size_t copy_bytes = size_t(1) << 30;
  double copy_gbs = 0;
  {
    Buf src(copy_bytes), dst(copy_bytes);
    XPERT_CUDA_CHECK(cudaMemset(src.p, 1, copy_bytes));
    const double us = time_us(std::max(reps / 4, 3), [&](int) {
      XPERT_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, copy_bytes, cudaMemcpyDeviceToDevice));
    });
    copy_gbs = 2.0 * copy_bytes / (us * 1e3);
    std::printf("copy: %.0f GB/s (1 GiB, read + write)\n", copy_gbs);
  }

  // Decode attention at depth.
  const int64_t n_head = 16, n_head_kv = 2, D = 256, kv_row = n_head_kv * D;
  std::printf("\ndecode attention, Qwen3.5 shapes (16/2 heads, head_dim 256), one sequence:\n");
  std::printf("(us/call: back-to-back launches; graph: the calls replayed from a CUDA graph; GB/s and %% from graph)\n");
  std::printf("| depth | us/call | graph us/call | KV MB read | GB/s | %% of copy | 10 layers (ms/token) |\n"
              "|---|---|---|---|---|---|---|\n");
  for (int64_t depth : {int64_t(0), int64_t(8192), int64_t(32768), int64_t(131072)}) {
    const int64_t n_ctx = depth + 1;
    const size_t cache_bytes = (size_t)n_ctx * kv_row * 2;  // K or V of one copy
    const int copies = (int)std::clamp<int64_t>((int64_t)((size_t(1) << 30) / (2 * cache_bytes)), 1, 32);
    Buf k(cache_bytes * copies), v(cache_bytes * copies), q(n_head * D * 4 * copies), out(n_head * D * 4);
    fill_random(k.p, cache_bytes * copies, true, 1);
    fill_random(v.p, cache_bytes * copies, true, 2);
    fill_random(q.p, n_head * D * 4 * copies, false, 3, 2.0f);
    const std::vector<int32_t> pos_h(copies, (int32_t)depth);
    std::vector<int32_t> slot_h(copies);
    for (int c = 0; c < copies; ++c) slot_h[c] = c;
    Buf pos(copies * 4), slots(copies * 4);
    XPERT_CUDA_CHECK(cudaMemcpy(pos.p, pos_h.data(), copies * 4, cudaMemcpyHostToDevice));
    XPERT_CUDA_CHECK(cudaMemcpy(slots.p, slot_h.data(), copies * 4, cudaMemcpyHostToDevice));
    cuda::DecodeAttentionArgs a{.q = q.as<float>(),
                                .k = k.as<uint16_t>(),
                                .v = v.as<uint16_t>(),
                                .slot_stride = n_ctx * kv_row,
                                .slots = slots.as<int32_t>(),
                                .pos = pos.as<int32_t>(),
                                .out = out.as<float>(),
                                .n_seq = 1,
                                .n_head = n_head,
                                .n_head_kv = n_head_kv,
                                .head_dim = D,
                                .max_kv = n_ctx,
                                .kq_scale = 1.0f / 16.0f,
                                .sliding_window = 0,
                                .min_keys_per_split = 64};
    Buf ws(cuda::attention_decode_workspace_bytes(a));
    auto call = [&](int i, cudaStream_t st) {
      cuda::DecodeAttentionArgs b = a;
      const int c = i % copies;  // another copy each call: its own slot, q and position entry
      b.slots = slots.as<int32_t>() + c;
      b.pos = pos.as<int32_t>() + c;
      b.q = q.as<float>() + c * n_head * D;
      cuda::attention_decode(b, ws.p, st);
    };
    const double us = time_us(reps, [&](int i) { call(i, nullptr); });
    const double gus = time_graph_us(reps, call);
    const double bytes = 2.0 * n_ctx * kv_row * 2;
    std::printf("| %lld | %.1f | %.1f | %.1f | %.0f | %.0f%% | %.3f |\n", (long long)depth, us, gus, bytes / 1e6,
                bytes / (gus * 1e3), 100.0 * bytes / (gus * 1e3) / copy_gbs, 10 * gus / 1e3);
  }

  // Prefill attention: 512 tokens after `depth` tokens.
  std::printf("\nprefill attention, 512 tokens, Qwen3.5 shapes:\n| depth | ms | TFLOP/s |\n|---|---|---|\n");
  for (int64_t depth : {int64_t(0), int64_t(4096), int64_t(32768)}) {
    const int64_t T = 512, n_kv = depth + T;
    Buf k(n_kv * kv_row * 2), v(n_kv * kv_row * 2), q(T * n_head * D * 4), out(T * n_head * D * 4), pos(T * 4);
    fill_random(k.p, n_kv * kv_row * 2, true, 4);
    fill_random(v.p, n_kv * kv_row * 2, true, 5);
    fill_random(q.p, T * n_head * D * 4, false, 6, 2.0f);
    std::vector<int32_t> ph(T);
    for (int64_t t = 0; t < T; ++t) ph[t] = (int32_t)(depth + t);
    XPERT_CUDA_CHECK(cudaMemcpy(pos.p, ph.data(), T * 4, cudaMemcpyHostToDevice));
    const AttentionArgs a{.q = q.as<float>(),
                          .k = k.as<uint16_t>(),
                          .v = v.as<uint16_t>(),
                          .out = out.as<float>(),
                          .pos = pos.as<int32_t>(),
                          .n_tokens = T,
                          .n_head = n_head,
                          .n_head_kv = n_head_kv,
                          .head_dim = D,
                          .n_kv = n_kv,
                          .kq_scale = 1.0f / 16.0f,
                          .sliding_window = 0};
    const double us = time_us(std::max(reps / 4, 3), [&](int) { cuda::attention(a, nullptr, nullptr); });
    double keys = 0;
    for (int64_t t = 0; t < T; ++t) keys += (double)(depth + t + 1);
    const double flops = 4.0 * n_head * D * keys;
    std::printf("| %lld | %.3f | %.1f |\n", (long long)depth, us / 1e3, flops / (us * 1e6));
  }

  // Delta rule, Qwen3.5-35B-A3B: one layer over a 512-token prompt, and a decode step.
  {
    const GdnShape s{.d_conv = 4, .n_k_heads = 16, .n_v_heads = 32, .head_k_dim = 128, .head_v_dim = 128};
    const int64_t T = 512;
    Buf q(T * s.key_dim() * 4), k(T * s.key_dim() * 4), v(T * s.value_dim() * 4), g(T * s.n_v_heads * 4),
        beta(T * s.n_v_heads * 4), out(T * s.value_dim() * 4), state(s.ssm_state_size() * 4);
    fill_random(q.p, T * s.key_dim() * 4, false, 7, 0.088f);  // about unit norm per head
    fill_random(k.p, T * s.key_dim() * 4, false, 8, 0.088f);
    fill_random(v.p, T * s.value_dim() * 4, false, 9);
    fill_random(g.p, T * s.n_v_heads * 4, false, 10, 0.05f);  // decays in (-0.05, 0.05): exp(g) ~ 1
    fill_random(beta.p, T * s.n_v_heads * 4, false, 11, 0.5f);
    XPERT_CUDA_CHECK(cudaMemset(state.p, 0, s.ssm_state_size() * 4));
    Buf ws(cuda::delta_rule_chunked_workspace_bytes(s, T));
    auto args = [&](int64_t n) {
      return DeltaRuleArgs{.q = q.as<float>(),
                           .k = k.as<float>(),
                           .v = v.as<float>(),
                           .g = g.as<float>(),
                           .beta = beta.as<float>(),
                           .state = state.as<float>(),
                           .out = out.as<float>(),
                           .n_tokens = n};
    };
    const double us_chunked =
        time_us(std::max(reps / 4, 3), [&](int) { cuda::delta_rule_chunked(s, args(T), ws.p, nullptr); });
    const double us_recurrent =
        time_us(std::max(reps / 4, 3), [&](int) { cuda::delta_rule_recurrent(s, args(T), nullptr); });
    const double us_step = time_us(reps, [&](int) { cuda::delta_rule_recurrent(s, args(1), nullptr); });
    const double us_step_graph =
        time_graph_us(reps, [&](int, cudaStream_t st) { cuda::delta_rule_recurrent(s, args(1), st); });
    const double us_64 = time_us(reps, [&](int) { cuda::delta_rule_chunked(s, args(64), ws.p, nullptr); });
    const double state_bytes = 2.0 * s.ssm_state_size() * 4;
    std::printf("\ndelta rule, Qwen3.5-35B-A3B layer (32 value heads, 128x128 state):\n");
    std::printf("| form | tokens | us | tokens/s (one layer) |\n|---|---|---|---|\n");
    std::printf("| chunked | %lld | %.1f | %.0f |\n", (long long)T, us_chunked, T / (us_chunked * 1e-6));
    std::printf("| chunked | 64 | %.1f | %.0f |\n", us_64, 64 / (us_64 * 1e-6));
    std::printf("| recurrent | %lld | %.1f | %.0f |\n", (long long)T, us_recurrent, T / (us_recurrent * 1e-6));
    std::printf("| recurrent (decode step) | 1 | %.1f (graph %.1f) | state r+w %.0f GB/s (graph) |\n", us_step,
                us_step_graph, state_bytes / (us_step_graph * 1e3));
    std::printf("chunked / recurrent speed-up at %lld tokens: %.1fx\n", (long long)T, us_recurrent / us_chunked);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
    return 1;
  }
}
