// Heterogeneous experts without a GPU: a MoE layer's experts computed in two parts by two CPU executors
// (moe_experts_partial, the first part out=, the second accumulate, each on its own ThreadPool) against
// moe_ffn, on the tiny MoE fixtures and the synth tiny preset; greedy decoding through a model whose MoE
// layers all run split that way against the same model unsplit; and routing statistics counted through
// ForwardArgs. This is the CPU stand-in for "GPU-resident experts + the rest on the expert device".
//
// Exactness: each expert's output is moe_ffn's bits (same rows, same order, any pool). The per-token sum
// is exact when k <= 2 (float addition commutes: tiny_qwen35moe, the synth preset) or when one part holds
// everything; with k = 3 (tiny_qwen3moe) a split adds a token's terms in another order than slot order,
// so results agree to a few float ulps, and greedy tokens must still be identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "base/thread_pool.h"
#include "cpu_forwarding_backend.h"
#include "model/model.h"
#include "backend/cpu/moe.h"
#include "runtime/experts/routing_stats.h"
#include "model/synth.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"
#include "test_data.h"

namespace xpert {
namespace {

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

// The synth tiny preset, written once per test process under a name of its own (TempFile: ctest runs the
// tests of this file in parallel processes), and removed when the process ends.
const std::string& synth_tiny() {
  static const TempFile file("moe_split_tiny.gguf");
  static const bool written =
      (synth_write({.preset = "tiny-qwen3moe", .type = "Q4_K_M", .output = file.path, .seed = 3}), true);
  (void)written;
  return file.path;
}

std::string model_path(const std::string& which) {
  return which == "synth" ? synth_tiny() : fixture(which + ".gguf");
}

// The masks a test runs: the first 0/25/50/75/100 % of experts by index, and a random one.
std::vector<std::vector<bool>> split_masks(int64_t n_expert, uint32_t seed) {
  std::vector<std::vector<bool>> masks;
  for (int pct : {0, 25, 50, 75, 100}) {
    std::vector<bool> m(n_expert);
    for (int64_t e = 0; e < n_expert; ++e) m[e] = e < n_expert * pct / 100;
    masks.push_back(m);
  }
  std::mt19937 rng(seed);
  std::vector<bool> m(n_expert);
  for (int64_t e = 0; e < n_expert; ++e) m[e] = rng() & 1;
  masks.push_back(m);
  return masks;
}

std::vector<bool> complement(const std::vector<bool>& m) {
  std::vector<bool> c(m.size());
  for (size_t i = 0; i < m.size(); ++i) c[i] = !m[i];
  return c;
}

bool one_part_has_all(const std::vector<bool>& m) {
  return std::all_of(m.begin(), m.end(), [](bool b) { return b; }) ||
         std::none_of(m.begin(), m.end(), [](bool b) { return b; });
}

// Relative to the largest |value|: 4 float ulps of the sum.
constexpr double kSplitTolerance = 5e-7;

class MoeSplit : public ::testing::TestWithParam<std::string> {};

// Every split, on every MoE layer, batches of 1 (decode), 5 and 40 tokens (prefill).
TEST_P(MoeSplit, TwoPartsOnTwoPoolsEqualMoeFfn) {
  auto model = Model::load(model_path(GetParam()));
  const ModelConfig& c = model->config();
  ASSERT_GT(c.n_expert, 0);
  ThreadPool pool_a(2), pool_b(1);
  cpu::MoeScratch sa, sb, sf;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const MoeFfn ffn = moe_ffn_args(c, model->host_weights().layers[il], il, nullptr);
    for (int64_t n : {1, 5, 40}) {
      std::vector<float> x(n * c.n_embd);
      for (float& v : x) v = normal(rng);
      std::vector<float> want(x.size());
      cpu::moe_ffn(ffn, x.data(), n, want.data(), sf, pool_a);
      Routing r;
      cpu::moe_route(ffn, x.data(), n, r, sa, pool_a);
      EXPECT_EQ(r.ids, sf.routing.ids);
      for (const std::vector<bool>& mask : split_masks(c.n_expert, (uint32_t)(il * 100 + n))) {
        std::vector<float> got(x.size(), std::nanf(""));
        cpu::moe_experts_partial(ffn, x.data(), n, r, mask, got.data(), false, sa, pool_a);
        cpu::moe_experts_partial(ffn, x.data(), n, r, complement(mask), got.data(), true, sb, pool_b);
        if (c.n_expert_used <= 2 || one_part_has_all(mask)) {
          ASSERT_EQ(got, want) << GetParam() << " layer " << il << " n " << n;
        } else {
          double max_ref = 0;
          for (float v : want) max_ref = std::max(max_ref, (double)std::fabs(v));
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_NEAR(got[i], want[i], kSplitTolerance * max_ref)
                << GetParam() << " layer " << il << " n " << n;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeSplit, ::testing::Values("tiny_qwen3moe", "tiny_qwen35moe", "synth"));

// A random layer with k = 4 and 16 experts: the full include set is moe_ffn's bits, the empty one writes
// zeros (out=) or leaves out alone (accumulate); a split by expert equals moe_ffn up to summation order
// (k > 2: the two parts add a token's slots in another order), and exactly when the first part holds
// each token's leading slots.
TEST(MoePartial, FullEmptyAndSplitOfAWiderRouting) {
  MoeFfn c;
  c.n_embd = 256;
  c.n_ff = 256;
  c.n_expert = 16;
  c.n_used = 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> router(c.n_embd * c.n_expert), gate(c.n_embd * c.n_ff * c.n_expert), up(gate.size()),
      down(gate.size());
  for (float& v : router) v = normal(rng) * 0.1f;
  for (auto* w : {&gate, &up, &down})
    for (float& v : *w) v = normal(rng) * 0.06f;
  auto weight = [](std::vector<float>& v, int64_t k, int64_t n, int64_t x) {
    return Weight{.type = DType::F32, .data = v.data(), .ne = {k, n, x}, .n_bytes = v.size() * 4};
  };
  c.router = weight(router, c.n_embd, c.n_expert, 1);
  c.gate = weight(gate, c.n_embd, c.n_ff, c.n_expert);
  c.up = weight(up, c.n_embd, c.n_ff, c.n_expert);
  c.down = weight(down, c.n_ff, c.n_embd, c.n_expert);
  const MoeFfn& ffn = c;

  const int64_t n = 9, D = c.n_embd, k = c.n_used;
  std::vector<float> x(n * D);
  for (float& v : x) v = normal(rng);
  ThreadPool pool(2), one(1);
  cpu::MoeScratch s, s2;
  std::vector<float> want(x.size());
  cpu::moe_ffn(ffn, x.data(), n, want.data(), s, pool);
  Routing r;
  cpu::moe_route(ffn, x.data(), n, r, s, pool);

  std::vector<float> got(x.size(), 7.0f);
  cpu::moe_experts_partial(ffn, x.data(), n, r, std::vector<bool>(c.n_expert, true), got.data(), false, s, one);
  EXPECT_EQ(got, want);
  cpu::moe_experts_partial(ffn, x.data(), n, r, std::vector<bool>(c.n_expert, false), got.data(), true, s, one);
  EXPECT_EQ(got, want);
  cpu::moe_experts_partial(ffn, x.data(), n, r, std::vector<bool>(c.n_expert, false), got.data(), false, s, one);
  EXPECT_EQ(got, std::vector<float>(x.size(), 0.0f));

  double max_ref = 0;
  for (float v : want) max_ref = std::max(max_ref, (double)std::fabs(v));
  for (const std::vector<bool>& mask : split_masks(c.n_expert, 9)) {
    cpu::moe_experts_partial(ffn, x.data(), n, r, mask, got.data(), false, s, pool);
    cpu::moe_experts_partial(ffn, x.data(), n, r, complement(mask), got.data(), true, s2, one);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * max_ref) << i;
  }
  // One token whose first part is its slots 0..1 and second part its slots 2..3: exact.
  Routing r1;
  r1.n_tokens = 1;
  r1.k = k;
  r1.ids.assign(r.ids.begin(), r.ids.begin() + k);
  r1.weights.assign(r.weights.begin(), r.weights.begin() + k);
  std::vector<bool> lead(c.n_expert, false);
  lead[r1.ids[0]] = lead[r1.ids[1]] = true;
  std::vector<float> got1(D);
  cpu::moe_experts_partial(ffn, x.data(), 1, r1, lead, got1.data(), false, s, pool);
  cpu::moe_experts_partial(ffn, x.data(), 1, r1, complement(lead), got1.data(), true, s2, one);
  EXPECT_EQ(got1, std::vector<float>(want.begin(), want.begin() + D));
}

// A CPU backend whose MoE layers run in two parts, as the GPU backend will run a layer with some experts
// resident and the rest on the expert device: routing and the first part (the "GPU" experts) on pool a,
// the rest on pool b, accumulated into the same output. Test-only; everything else is CpuBackend's.
class SplitCpuBackend final : public CpuForwardingBackend {
 public:
  SplitCpuBackend(ThreadPool& a, ThreadPool& b) : CpuForwardingBackend(a), a_(a), b_(b) {}
  // Layer keyed by its expert tensor's address as the model hands it to this backend.
  std::map<const void*, std::vector<bool>> first_part;
  int64_t calls = 0;

  std::string name() const override { return "split-cpu"; }
  void moe_ffn(const MoeFfn& ffn, const float* x, int64_t n, float* out) override {
    const std::vector<bool>& first = first_part.at(ffn.gate.data);
    cpu::moe_route(ffn, x, n, routing_, sa_, a_);
    cpu::moe_experts_partial(ffn, x, n, routing_, first, out, false, sa_, a_);
    cpu::moe_experts_partial(ffn, x, n, routing_, complement(first), out, true, sb_, b_);
    ++calls;
  }

 private:
  ThreadPool &a_, &b_;
  Routing routing_;
  cpu::MoeScratch sa_, sb_;
};

// Greedy tokens (and every step's logits) of a prompt plus n_gen generated tokens, fed in chunks.
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
Greedy greedy(const Model& m, ThreadPool& pool, int64_t n_gen, RoutingStats* stats = nullptr) {
  const ModelConfig& c = m.config();
  KvCache cache(c, 128, 1, m.layer_devices());
  std::unique_ptr<RecurrentState> state;
  if (c.has_recurrent_layers()) state = std::make_unique<RecurrentState>(c, 1, m.layer_devices());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((int32_t)((i * 37 + 5) % c.n_vocab));
  Greedy g;
  std::vector<float> logits;
  int32_t pos = 0;
  auto eval = [&](std::span<const int32_t> t) {
    m.forward({.tokens = t,
               .pos0 = pos,
               .cache = &cache,
               .seq = 0,
               .all_logits = false,
               .segments = {},
               .state = state.get(),
               .routing_stats = stats},
              logits, pool);
    pos += (int32_t)t.size();
    g.logits.push_back(logits);
  };
  eval(std::span<const int32_t>(prompt).subspan(0, 7));  // a prefill chunk, then the rest
  eval(std::span<const int32_t>(prompt).subspan(7));
  for (int64_t i = 0; i < n_gen; ++i) {
    const int32_t id = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    g.tokens.push_back(id);
    eval(std::span<const int32_t>(&id, 1));
  }
  return g;
}

class MoeSplitModel : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeSplitModel, GreedyDecodingIsIdenticalForEverySplit) {
  ThreadPool pool(2), pool_b(1);
  auto plain = Model::load(model_path(GetParam()));
  const Greedy want = greedy(*plain, pool, 16);
  const int64_t E = plain->config().n_expert;
  std::vector<std::vector<bool>> masks = split_masks(E, 21);
  for (size_t mi = 0; mi < masks.size(); ++mi) {
    auto split = Model::load(model_path(GetParam()));
    auto backend = std::make_shared<SplitCpuBackend>(pool, pool_b);
    split->offload(backend, split->config().n_layer);
    // Layer il gets the mask rotated by il: different layers split differently.
    for (int64_t il = 0; il < split->config().n_layer; ++il) {
      std::vector<bool> m(E);
      for (int64_t e = 0; e < E; ++e) m[e] = masks[mi][(e + il) % E];
      backend->first_part[split->layer(il).ffn_gate_exps.data] = m;
    }
    const Greedy got = greedy(*split, pool, 16);
    EXPECT_GT(backend->calls, 0);
    EXPECT_EQ(got.tokens, want.tokens) << GetParam() << " mask " << mi;
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t i = 0; i < got.logits.size(); ++i) {
      if (plain->config().n_expert_used <= 2 || one_part_has_all(masks[mi])) {
        ASSERT_EQ(got.logits[i], want.logits[i]) << "step " << i;
        continue;
      }
      const auto [lo, hi] = std::minmax_element(want.logits[i].begin(), want.logits[i].end());
      for (size_t j = 0; j < got.logits[i].size(); ++j)
        ASSERT_NEAR(got.logits[i][j], want.logits[i][j], 1e-5 * (*hi - *lo))
            << "step " << i << " logit " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeSplitModel, ::testing::Values("tiny_qwen3moe", "tiny_qwen35moe", "synth"));

// ForwardArgs::routing_stats: every MoE layer counts k routings per token, and nothing is counted
// without it.
TEST(RoutingStatsCounting, ForwardCountsEveryTokenOfEveryLayer) {
  ThreadPool pool(2);
  auto model = Model::load(fixture("tiny_qwen3moe.gguf"));
  const ModelConfig& c = model->config();
  RoutingStats stats(*model);
  const int64_t n_gen = 5;
  greedy(*model, pool, n_gen, &stats);
  const uint64_t tokens = 12 + n_gen;
  for (int64_t il = 0; il < c.n_layer; ++il) EXPECT_EQ(stats.layer_total(il), tokens * c.n_expert_used) << il;
  EXPECT_EQ(stats.max_tokens(), tokens);
  // A pass without stats leaves them alone.
  const RoutingStats before = stats;
  greedy(*model, pool, 2);
  for (int64_t il = 0; il < c.n_layer; ++il) EXPECT_EQ(stats.layer_counts(il), before.layer_counts(il));
}

}  // namespace
}  // namespace xpert
