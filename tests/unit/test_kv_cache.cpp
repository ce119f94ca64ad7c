// Quantized KV cache (issue #10): f16 / q8_0 / q4_0 cache types end to end on the CPU.
// - cpu::attention over every (K type, V type) pair against a double-precision reference over the
//   dequantized cache, at real shapes (head_dim 64/128/256, GQA 8/2, 16/2, 32/4, none), prefill and decode,
//   on every ISA path (scalar, AVX2).
// - KvCache / memory plan / state cache: bytes per row by type, rows copied as bytes, errors for types and
//   head sizes that cannot be stored.
// - The tiny hybrid fixture with q8_0 and q4_0 caches against f16 (logits within stated bounds, same
//   greedy tokens).
// - Depth: a tiny hybrid model gives the same greedy tokens at position ~32K whether the prompt was
//   prefilled in chunks of 512 or in one pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include <unistd.h>

#include "backend/cpu/ops.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "model/kv_cache.h"
#include "runtime/memory_plan.h"
#include "model/recurrent_state.h"
#include "runtime/session.h"
#include "runtime/state_cache.h"
#include "sample/sampler.h"
#include "test_data.h"

namespace xpert {
namespace {

const DType kTypes[] = {DType::F16, DType::Q8_0, DType::Q4_0};

struct Shape {
  int64_t n_head, n_head_kv, head_dim;
};

// Max |out - reference| of cpu::attention over a cache of `type`s, the reference being double-precision
// attention over the dequantized cache (so the cache's own rounding is not counted here).
double attention_error(const Shape& s, DType kt, DType vt, int64_t n_tokens, int64_t pos0, int32_t window,
                       uint32_t seed, ThreadPool& pool) {
  const int64_t D = s.head_dim, H = s.n_head, HKV = s.n_head_kv, row = HKV * D, n_kv = pos0 + n_tokens;
  const float scale = 1.0f / std::sqrt((float)D);
  // Sharper than N(0, 1) scores, as in trained models: a few keys dominate.
  const auto q = randn(n_tokens * H * D, seed, 2.0f);
  const auto kf = randn(n_kv * row, seed + 1), vf = randn(n_kv * row, seed + 2);
  std::vector<uint8_t> k(n_kv * row_bytes(kt, row)), v(n_kv * row_bytes(vt, row));
  cpu::store_kv(kf.data(), k.data(), n_kv * row, kt);
  cpu::store_kv(vf.data(), v.data(), n_kv * row, vt);
  std::vector<float> kd(kf.size()), vd(vf.size());
  dequantize_row(kt, k.data(), kd.data(), n_kv * row);
  dequantize_row(vt, v.data(), vd.data(), n_kv * row);
  std::vector<int32_t> pos(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) pos[t] = (int32_t)(pos0 + t);
  std::vector<float> out(n_tokens * H * D);
  cpu::attention({.q = q.data(), .k = k.data(), .v = v.data(), .out = out.data(), .pos = pos.data(),
                  .n_tokens = n_tokens, .n_head = H, .n_head_kv = HKV, .head_dim = D, .n_kv = n_kv,
                  .kq_scale = scale, .sliding_window = window, .k_type = kt, .v_type = vt},
                 pool);
  double worst = 0;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / HKV);
      const int64_t lo = window ? std::max<int64_t>(0, pos[t] - window + 1) : 0;
      std::vector<double> sc;
      for (int64_t j = lo; j <= pos[t]; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += (double)q[(t * H + h) * D + c] * kd[j * row + hk * D + c];
        sc.push_back(d * scale);
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < D; ++c) {
        double o = 0;
        for (size_t j = 0; j < sc.size(); ++j) o += sc[j] / sum * vd[(lo + (int64_t)j) * row + hk * D + c];
        worst = std::max(worst, std::fabs(out[(t * H + h) * D + c] - o));
      }
    }
  return worst;
}

// The CPU rounds q and the softmax weights to f16 (llama.cpp's rounding points): with outputs ~ N(0, 1)
// that is up to ~1e-3 of error whatever the cache type (measured: 1.7e-3 at worst, scalar and AVX2); the
// bound leaves ~2x.
constexpr double kAttentionBound = 3e-3;

TEST(KvCacheAttention, EveryTypePairMatchesReference) {
  IsaCapGuard guard;
  ThreadPool pool(2);
  const Shape shapes[] = {{8, 2, 64}, {16, 2, 256}, {32, 4, 128}, {4, 4, 128}};
  for (Isa isa : {Isa::scalar, Isa::avx2}) {
    if (!isa_supported(isa)) continue;
    set_isa_cap(isa);
    uint32_t seed = 1;
    double worst = 0;
    for (const Shape& s : shapes)
      for (DType kt : kTypes)
        for (DType vt : kTypes) {
          const std::string what = std::string(isa_name(isa)) + " K " + kv_type_name(kt) + " V " +
                                   kv_type_name(vt) + " heads " + std::to_string(s.n_head) + "/" +
                                   std::to_string(s.n_head_kv) + " D " + std::to_string(s.head_dim);
          const double prefill = attention_error(s, kt, vt, 13, 40, 0, seed += 3, pool);
          const double decode = attention_error(s, kt, vt, 1, 299, 0, seed += 3, pool);
          EXPECT_LT(prefill, kAttentionBound) << what << " prefill";
          EXPECT_LT(decode, kAttentionBound) << what << " decode";
          worst = std::max({worst, prefill, decode});
        }
    std::printf("%s: max |attention - reference| over every type pair and shape: %.2e\n", isa_name(isa), worst);
    EXPECT_LT(attention_error({8, 1, 256}, DType::Q8_0, DType::Q4_0, 9, 120, 32, 99, pool), kAttentionBound)
        << "sliding window";
  }
}

ModelConfig hybrid_config(int64_t head_dim) {
  ModelConfig c;
  c.n_layer = 4;
  c.n_head = 8;
  c.n_head_kv = 2;
  c.head_dim = head_dim;
  c.layer_recurrent = {true, true, true, false};  // KV rows on layer 3 only
  return c;
}

TEST(KvCacheTypes, BytesPerRowAndPlan) {
  const ModelConfig c = hybrid_config(128);
  const int64_t row = 2 * 128;
  EXPECT_EQ(kv_row_bytes(c, DType::F16), (size_t)row * 2);
  EXPECT_EQ(kv_row_bytes(c, DType::Q8_0), (size_t)row / 32 * 34);
  EXPECT_EQ(kv_row_bytes(c, DType::Q4_0), (size_t)row / 32 * 18);
  for (DType kt : kTypes)
    for (DType vt : kTypes) {
      const KvCache kv(c, 100, 3, {}, {.k = kt, .v = vt});
      EXPECT_EQ(kv.bytes(), kv_bytes_per_layer(c, 100, 3, {.k = kt, .v = vt}));  // one attention layer
      EXPECT_EQ(kv.slot_stride(), (int64_t)(100 * (kv_row_bytes(c, kt) + kv_row_bytes(c, vt))));
      EXPECT_FALSE(kv.has_layer(0));
      EXPECT_TRUE(kv.has_layer(3));
    }
  EXPECT_EQ(parse_kv_type("Q8_0"), DType::Q8_0);
  EXPECT_EQ(parse_kv_type("q4_0"), DType::Q4_0);
  EXPECT_EQ(parse_kv_type("f16"), DType::F16);
  try {
    parse_kv_type("q5_1");
    ADD_FAILURE() << "q5_1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16, q8_0, q4_0"), std::string::npos) << e.what();
  }
  try {
    KvCache bad(hybrid_config(16), 8, 1, {}, {.k = DType::F16, .v = DType::Q8_0});
    ADD_FAILURE() << "head_dim 16 accepted for q8_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cache-type-v q8_0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("head_dim is 16"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(KvCache(hybrid_config(16), 8));  // f16 stores any head
}

// The state cache copies quantized rows as bytes: what it restores is what the slot held.
TEST(KvCacheTypes, StateCacheKeepsQuantizedRows) {
  ModelConfig c = hybrid_config(64);
  c.layer_recurrent.clear();  // dense: resumes at any prefix, no recurrent state needed
  c.n_layer = 2;
  const KvTypes types{.k = DType::Q8_0, .v = DType::Q4_0};
  KvCache kv(c, 64, 2, {}, types);
  StateCache sc(c, types, 1 << 20);
  const int64_t n = 40;
  std::vector<std::vector<uint8_t>> rows;  // [layer][kv]
  for (int64_t il = 0; il < 2; ++il)
    for (int k = 0; k < 2; ++k) {
      const auto f = randn(n * kv.row(), 7 + (uint32_t)(il * 2 + k));
      std::vector<uint8_t> r(n * kv.row_bytes(k));
      cpu::store_kv(f.data(), r.data(), n * kv.row(), kv.type(k));
      kv.write_rows(il, 0, k, 0, n, r.data());
      rows.push_back(r);
    }
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = (int32_t)(i * 7 % 31);
  EXPECT_EQ(sc.store(tokens, kv, nullptr, 0), n);
  EXPECT_EQ(sc.stats().bytes, (size_t)n * (2 * (kv.row_bytes(0) + kv.row_bytes(1)) + 4));
  const StateCache::Match m = sc.match(tokens, n);
  ASSERT_EQ(m.resume, n);
  sc.restore(tokens, m.resume, 0, kv, nullptr, 1);
  for (int64_t il = 0; il < 2; ++il)
    for (int k = 0; k < 2; ++k) {
      std::vector<uint8_t> got(n * kv.row_bytes(k));
      kv.read_rows(il, 1, k, 0, n, got.data());
      EXPECT_EQ(got, rows[il * 2 + k]) << "layer " << il << " kv " << k;
    }
}

std::string fixture_dir() {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/";
}

// Prefill the fixture's prompt, then 24 steps: each feeds the argmax of the previous logits (greedy), or
// with `forced` the token forced[i] (so runs with different caches see the same inputs). The logits of
// every step; `out` gets the tokens fed.
std::vector<std::vector<float>> step_logits(const Model& m, const std::vector<int32_t>& prompt, KvTypes types,
                                            std::vector<int32_t>& out, const std::vector<int32_t>* forced = nullptr) {
  Session s(m, {.n_ctx = 128, .n_threads = 2, .n_batch = 16, .cache_types = types});
  std::vector<std::vector<float>> all;
  std::vector<float> l = s.eval(prompt);
  for (int i = 0; i < 24; ++i) {
    all.push_back(l);
    const int32_t t = forced ? (*forced)[i] : argmax(l);
    out.push_back(t);
    l = s.eval(std::span<const int32_t>(&t, 1));
  }
  return all;
}

double max_rel_error(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double err = 0, top = 0;
    for (size_t j = 0; j < ref[i].size(); ++j) {
      err = std::max(err, (double)std::fabs(got[i][j] - ref[i][j]));
      top = std::max(top, (double)std::fabs(ref[i][j]));
    }
    worst = std::max(worst, err / top);
  }
  return worst;
}

// tiny_qwen35 (n_embd 64, 6 layers of which 2 attend with 4 heads x 32). With the same inputs at every
// step (teacher forcing), max |logit - f16 logit| / max |f16 logit| over prompt + 24 steps measured
// 3.6e-3 for q8_0 and 6.6e-2 for q4_0 (a q8_0 value is within 1/254 of its block's largest magnitude,
// q4_0 within 1/16, so q4_0's error is ~16x larger, as measured). Bounds: ~3x the measurement. Free-
// running greedy tokens: q8_0 gives the same 24 as f16; q4_0 does not have to (on this random-weight model
// it leaves the f16 path at step 8, where the f16 top two logits are close).
constexpr double kQ8Bound = 1e-2, kQ4Bound = 2e-1;

TEST(KvCacheModel, QuantizedCacheStaysCloseToF16) {
  std::ifstream in(fixture_dir() + "tiny_qwen35_logits.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json fx = nlohmann::json::parse(in);
  const std::vector<int32_t> prompt = fx["tokens"].get<std::vector<int32_t>>();
  auto model = Model::load(fixture_dir() + "tiny_qwen35.gguf");
  std::vector<int32_t> ref_tokens;
  const auto ref = step_logits(*model, prompt, {}, ref_tokens);
  for (const auto& [t, bound] : {std::pair{DType::Q8_0, kQ8Bound}, std::pair{DType::Q4_0, kQ4Bound}}) {
    std::vector<int32_t> fed, greedy;
    const double forced = max_rel_error(step_logits(*model, prompt, {.k = t, .v = t}, fed, &ref_tokens), ref);
    step_logits(*model, prompt, {.k = t, .v = t}, greedy);
    size_t same = 0;
    while (same < greedy.size() && greedy[same] == ref_tokens[same]) ++same;
    std::printf("tiny_qwen35 K,V %s: max |logit - f16| / max |logit| = %.3e (same inputs); greedy: first %zu of %zu "
                "tokens equal to f16's\n",
                kv_type_name(t).c_str(), forced, same, greedy.size());
    EXPECT_LT(forced, bound) << kv_type_name(t);
    if (t == DType::Q8_0) {
      EXPECT_EQ(greedy, ref_tokens);
    }
  }
  // Mixed: q8_0 K with f16 V (llama.cpp's common -ctk q8_0) sits between.
  std::vector<int32_t> fed;
  EXPECT_LT(max_rel_error(step_logits(*model, prompt, {.k = DType::Q8_0, .v = DType::F16}, fed, &ref_tokens), ref),
            kQ8Bound);
}

// Issue #10's depth check: on a tiny hybrid model (synth tiny-qwen35-long: one Gated DeltaNet layer and
// one attention layer of one 32-dim head, trained context 40960) a 32,760-token prompt prefilled in chunks
// of 512 and in one pass gives the same greedy tokens at positions 32,760.. and the same logits. Measured:
// identical bits (every op but the DeltaNet is per row, and 512 is a multiple of its chunk of 64); the bound
// allows summation-order differences should a kernel start tiling across rows. ~12 s of CPU on 2 threads,
// nearly all of it the 2 x 5.4e8 (query, key) pairs of attention.
TEST(KvCacheDepth, ChunkedPrefillMatchesOneShotAt32K) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("xpert_test_kv_depth_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  synth_write({.preset = "tiny-qwen35-long", .type = "Q8_0", .output = path, .seed = 3});
  auto model = Model::load(path);
  std::filesystem::remove(path);  // mapped: the data stays readable
  const ModelConfig& c = model->config();
  ASSERT_TRUE(c.has_recurrent_layers());
  const int64_t n_prompt = 32760, n_gen = 8;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(3, (int32_t)c.n_vocab - 1);
  std::vector<int32_t> prompt(n_prompt);
  for (int32_t& t : prompt) t = tok(rng);
  auto run = [&](int64_t chunk, std::vector<float>& first_logits) {
    Session s(*model, {.n_ctx = n_prompt + n_gen, .n_threads = 2, .n_batch = chunk});
    std::vector<float> l = s.eval(prompt);
    first_logits = l;
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n_gen; ++i) {
      out.push_back(argmax(l));
      l = s.eval(std::span<const int32_t>(&out.back(), 1));
    }
    return out;
  };
  std::vector<float> la, lb;
  const std::vector<int32_t> chunked = run(512, la), one_shot = run(n_prompt, lb);
  double err = 0, top = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    err = std::max(err, (double)std::fabs(la[i] - lb[i]));
    top = std::max(top, (double)std::fabs(lb[i]));
  }
  std::printf("depth %lld: chunked (512) vs one-shot prefill: max |logit diff| / max |logit| = %.2e\n",
              (long long)n_prompt, err / top);
  EXPECT_EQ(chunked, one_shot);
  EXPECT_LT(err / top, 1e-3);
}

}  // namespace
}  // namespace xpert
