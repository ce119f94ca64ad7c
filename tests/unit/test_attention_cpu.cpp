// Tiled CPU attention (issue #10): cpu::attention_tiled (online softmax over key tiles, split-K at
// decode) against a double-precision reference over the dequantized cache and against the short path,
// for every cache type, head_dim 64/128/256, GQA, a sliding window, n_kv from 1 to 40K, 1-3 threads, on
// every ISA path; and its invariances: a row's bits do not depend on the thread count, on the rest of
// the batch, or on prefill vs decode (what keeps chunked prefill equal to one-shot prefill).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_attn.h"
#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "quant/quant.h"
#include "model/kv_cache.h"
#include "test_data.h"

namespace xpert {
namespace {

struct Case {
  int64_t n_head, n_head_kv, head_dim, n_kv;
  DType kt = DType::F16, vt = DType::F16;
  int32_t window = 0;
};

// A cache of n_kv random rows in the case's types, its dequantized values, and q for n_tokens.
struct Fixture {
  Case c;
  std::vector<uint8_t> k, v;
  std::vector<float> kd, vd;
  Fixture(const Case& c_, uint32_t seed) : c(c_) {
    const int64_t row = c.n_head_kv * c.head_dim, n = c.n_kv * row;
    const auto kf = randn(n, seed + 1), vf = randn(n, seed + 2);
    k.resize(c.n_kv * row_bytes(c.kt, row));
    v.resize(c.n_kv * row_bytes(c.vt, row));
    cpu::store_kv(kf.data(), k.data(), n, c.kt);
    cpu::store_kv(vf.data(), v.data(), n, c.vt);
    kd.resize(n);
    vd.resize(n);
    dequantize_row(c.kt, k.data(), kd.data(), n);
    dequantize_row(c.vt, v.data(), vd.data(), n);
  }
  AttentionArgs args(const float* q, float* out, const int32_t* pos, int64_t n_tokens) const {
    return {.q = q, .k = k.data(), .v = v.data(), .out = out, .pos = pos, .n_tokens = n_tokens,
            .n_head = c.n_head, .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .n_kv = c.n_kv,
            .kq_scale = 1.0f / std::sqrt((float)c.head_dim), .sliding_window = c.window,
            .k_type = c.kt, .v_type = c.vt};
  }
  // Max |out - double reference| over the tokens at pos.
  double error(const std::vector<float>& q, const std::vector<float>& out, const std::vector<int32_t>& pos) const {
    const int64_t D = c.head_dim, H = c.n_head, row = c.n_head_kv * D;
    const double scale = 1.0 / std::sqrt((double)D);
    double worst = 0;
    std::vector<double> sc, o(D);
    for (size_t t = 0; t < pos.size(); ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / (H / c.n_head_kv);
        const int64_t lo = c.window ? std::max<int64_t>(0, pos[t] - c.window + 1) : 0;
        const int64_t hi = std::min<int64_t>(pos[t], c.n_kv - 1);
        sc.clear();
        for (int64_t j = lo; j <= hi; ++j) {
          double d = 0;
          for (int64_t x = 0; x < D; ++x) d += (double)q[(t * H + h) * D + x] * kd[j * row + hk * D + x];
          sc.push_back(d * scale);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        std::fill(o.begin(), o.end(), 0.0);
        for (size_t j = 0; j < sc.size(); ++j)
          for (int64_t x = 0; x < D; ++x) o[x] += sc[j] * vd[(lo + (int64_t)j) * row + hk * D + x];
        for (int64_t x = 0; x < D; ++x) worst = std::max(worst, std::fabs(out[(t * H + h) * D + x] - o[x] / sum));
      }
    return worst;
  }
};

std::string name(const Case& c) {
  return std::string("K ") + kv_type_name(c.kt) + " V " + kv_type_name(c.vt) + " heads " + std::to_string(c.n_head) +
         "/" + std::to_string(c.n_head_kv) + " D " + std::to_string(c.head_dim) + " n_kv " + std::to_string(c.n_kv) +
         " window " + std::to_string(c.window);
}

// The tiled path rounds q to f16 only (the short path also rounds the weights): the same bound as
// test_kv_cache's short-path one.
constexpr double kBound = 3e-3;

const DType kTypes[] = {DType::F16, DType::Q8_0, DType::Q4_0};

// Prefill (the last n_tokens positions of the cache) and decode (the last one) through the tiled path
// against the reference, at every thread count; bitwise equal across thread counts, and the decode row
// bitwise equal to the same row inside the prefill batch (split-K vs one thread walking the chunks).
void check(const Case& c, int64_t n_tokens, uint32_t seed) {
  SCOPED_TRACE(name(c) + " tokens " + std::to_string(n_tokens));
  const Fixture f(c, seed);
  const int64_t HD = c.n_head * c.head_dim;
  const auto q = randn(n_tokens * HD, seed, 2.0f);
  std::vector<int32_t> pos(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) pos[t] = (int32_t)(c.n_kv - n_tokens + t);
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> out(n_tokens * HD, NAN), last(HD, NAN);
    cpu::attention_tiled(f.args(q.data(), out.data(), pos.data(), n_tokens), pool);
    cpu::attention_tiled(f.args(q.data() + (n_tokens - 1) * HD, last.data(), &pos.back(), 1), pool);
    if (threads == 1) {
      EXPECT_LT(f.error(q, out, pos), kBound);
      first = out;
    } else {
      EXPECT_EQ(0, std::memcmp(out.data(), first.data(), out.size() * 4)) << threads << " threads";
    }
    EXPECT_EQ(0, std::memcmp(last.data(), out.data() + (n_tokens - 1) * HD, HD * 4)) << threads << " threads";
  }
}

TEST(CpuAttentionTiled, MatchesReferenceEveryTypeAndShape) {
  IsaCapGuard guard;
  for (Isa isa : {Isa::scalar, Isa::avx2}) {
    if (!isa_supported(isa)) continue;
    set_isa_cap(isa);
    SCOPED_TRACE(isa_name(isa));
    uint32_t seed = 7;
    for (DType kt : kTypes)
      for (DType vt : kTypes) {
        check({8, 2, 64, 700, kt, vt}, 40, seed += 5);
        check({16, 2, 256, 1100, kt, vt}, 5, seed += 5);
        check({4, 4, 128, 600, kt, vt, 200}, 9, seed += 5);  // window
        check({32, 4, 128, 530, kt, vt}, 3, seed += 5);
      }
  }
}

TEST(CpuAttentionTiled, KeyCountsFromOneToFortyK) {
  IsaCapGuard guard;
  for (Isa isa : {Isa::scalar, Isa::avx2}) {
    if (!isa_supported(isa)) continue;
    set_isa_cap(isa);
    SCOPED_TRACE(isa_name(isa));
    uint32_t seed = 100;
    for (int64_t n_kv : {1, 2, 63, 64, 65, 511, 512, 513, 1025, 4097})
      check({8, 2, 128, n_kv, DType::F16, DType::F16}, std::min<int64_t>(n_kv, 3), seed += 5);
    // Depth: 40K keys, decode and a short batch; f16 and q8_0 (the AVX2 path only: the scalar one is slow).
    if (isa == Isa::avx2) {
      check({8, 2, 128, 40000, DType::F16, DType::F16}, 2, seed += 5);
      check({8, 1, 64, 40000, DType::Q8_0, DType::Q8_0}, 1, seed += 5);
      check({4, 2, 128, 40000, DType::Q4_0, DType::F16, 4096}, 1, seed += 5);
    }
  }
}

// cpu::attention: rows below the threshold are the short path's bits, rows above the tiled path's,
// whatever else shares the batch; and a prompt prefilled in chunks gives the one-shot bits.
TEST(CpuAttention, ThresholdSplitsRowsBetweenPaths) {
  ThreadPool pool(2);
  const int64_t T = 48, n_kv = cpu::kAttentionTiledMinKeys + 24;
  const Case c{8, 2, 64, n_kv};
  const Fixture f(c, 5);
  const int64_t HD = c.n_head * c.head_dim;
  const auto q = randn(T * HD, 11, 2.0f);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = (int32_t)(n_kv - T + t);
  std::vector<float> out(T * HD), plain(T * HD), tiled(T * HD), chunked(T * HD);
  cpu::attention(f.args(q.data(), out.data(), pos.data(), T), pool);
  cpu::attention_plain(f.args(q.data(), plain.data(), pos.data(), T), pool);
  cpu::attention_tiled(f.args(q.data(), tiled.data(), pos.data(), T), pool);
  for (int64_t t0 = 0; t0 < T; t0 += 10) {
    const int64_t n = std::min<int64_t>(10, T - t0);
    cpu::attention(f.args(q.data() + t0 * HD, chunked.data() + t0 * HD, pos.data() + t0, n), pool);
  }
  int n_tiled = 0;
  for (int64_t t = 0; t < T; ++t) {
    const bool long_row = pos[t] + 1 >= cpu::kAttentionTiledMinKeys;
    n_tiled += long_row;
    const auto& want = long_row ? tiled : plain;
    EXPECT_EQ(0, std::memcmp(out.data() + t * HD, want.data() + t * HD, HD * 4)) << "token " << t;
  }
  EXPECT_EQ(n_tiled, 25);
  EXPECT_EQ(0, std::memcmp(out.data(), chunked.data(), out.size() * 4));
  EXPECT_LT(f.error(q, out, pos), kBound);
}

}  // namespace
}  // namespace xpert
