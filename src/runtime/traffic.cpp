#include "runtime/traffic.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "backend/backend.h"
#include "base/thread_pool.h"
#include "runtime/experts/plan.h"
#include "runtime/memory_plan.h"

namespace xpert {

namespace {

double kv_bytes(const StepTraffic& t, double ctx) {
  return t.kv_per_position * ctx + t.kv_window_per_position * std::min(ctx, (double)t.window);
}

}  // namespace

double StepTraffic::decode_bytes(double ctx) const {
  return dense + expert * (double)n_expert_used + embedding_row + kv_bytes(*this, ctx) + 2 * state;
}

double StepTraffic::prefill_bytes(int64_t n, double ctx) const {
  const int64_t touched = std::min<int64_t>(n * n_expert_used, n_expert);
  return dense + expert * (double)touched + embedding_row * (double)n + kv_bytes(*this, ctx) + 2 * state;
}

StepTraffic StepTraffic::of(const Model& m, KvTypes types) {
  const ModelConfig& c = m.config();
  const ModelBytes b = ModelBytes::of(m);
  StepTraffic t;
  for (const LayerBytes& l : b.layers) {
    t.dense += (double)l.dense;
    t.expert += (double)l.expert;
  }
  t.dense += (double)b.output;
  t.embedding_row = c.n_vocab > 0 ? (double)b.embedding / (double)c.n_vocab : 0.0;
  t.n_expert = c.n_expert;
  t.window = c.sliding_window;
  t.n_expert_used = c.n_expert > 0 ? c.n_expert_used : 0;
  const double kv = (double)kv_bytes_per_layer(c, 1, 1, types), rec = (double)recurrent_bytes_per_layer(c, 1);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (c.recurrent(il))
      t.state += rec;
    else if (c.sliding_window > 0 && il < (int64_t)c.layer_swa.size() && c.layer_swa[il])
      t.kv_window_per_position += kv;
    else
      t.kv_per_position += kv;
  }
  return t;
}

namespace {

constexpr int kCopies = 8;

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double copy_bandwidth(Backend* device, ThreadPool& pool) {
  // 256 MiB a buffer: past any last-level cache, small beside the memory a model needs.
  const size_t bytes = (size_t)256 << 20;
  if (!device || device->is_host()) {
    std::unique_ptr<uint8_t[]> src(new uint8_t[bytes]), dst(new uint8_t[bytes]);
    auto copy = [&] {
      pool.parallel_for((int64_t)(bytes >> 16), [&](int64_t lo, int64_t hi) {
        std::memcpy(dst.get() + (lo << 16), src.get() + (lo << 16), (size_t)(hi - lo) << 16);
      });
    };
    std::memset(src.get(), 1, bytes);
    copy();  // every page touched before the clock starts
    const double s = seconds([&] {
      for (int i = 0; i < kCopies; ++i) copy();
    });
    return 2.0 * (double)bytes * kCopies / s;
  }
  Backend& b = *device;
  const DeviceBuffer src(b, bytes), dst(b, bytes);
  b.zero(src.data(), bytes);
  b.copy(dst.data(), src.data(), bytes);
  b.synchronize();
  const double s = seconds([&] {
    for (int i = 0; i < kCopies; ++i)
      i % 2 ? b.copy(src.data(), dst.data(), bytes) : b.copy(dst.data(), src.data(), bytes);
    b.synchronize();
  });
  return 2.0 * (double)bytes * kCopies / s;
}

}  // namespace xpert
