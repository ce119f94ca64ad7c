// Rebalancing experts while serving (issue #8), without a GPU: the planner (plan_rebalance) moves toward
// the skew of a count set, respects its hysteresis and its per-layer bound, and is deterministic;
// Model::move_experts on a backend whose "device" memory is host memory (every MoE layer split between
// the device copies and the host's mmap, as the CUDA backend runs a split layer) keeps greedy decoding
// identical to the unsplit model when experts move mid-generation (exact for k <= 2, the split
// contract), and refuses bad moves without changing anything; the engine with an ExpertRebalancer gives
// the same greedy tokens as without one while it moves experts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "runtime/experts/plan.h"
#include "model/model.h"
#include "backend/cpu/moe.h"
#include "runtime/experts/routing_stats.h"
#include "runtime/engine.h"
#include "runtime/experts/rebalancer.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"
#include "text/tokenizer.h"
#include "cpu_forwarding_backend.h"

namespace xpert {
namespace {

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name + ".gguf";
}

// --- the planner ---------------------------------------------------------------------------------

std::vector<bool> first_n(int64_t n_expert, int64_t n) {
  std::vector<bool> m(n_expert);
  for (int64_t e = 0; e < n; ++e) m[e] = e < n;
  return m;
}

// Applies a plan's moves to the masks, checking each is a swap of a resident and a host expert.
void apply_moves(std::vector<std::vector<bool>>& resident, const RebalancePlan& p) {
  for (const ExpertMove& m : p.moves) {
    ASSERT_TRUE(resident[m.layer][m.evict]) << m.layer << " " << m.evict;
    ASSERT_FALSE(resident[m.layer][m.admit]) << m.layer << " " << m.admit;
    resident[m.layer][m.evict] = false;
    resident[m.layer][m.admit] = true;
  }
}

TEST(PlanRebalance, MovesTowardTheSkewAndConverges) {
  // Layer 0: experts 4..7 on the host are routed most; layer 1 is not split; layer 2: 7 hot, 0 cold.
  const int64_t E = 8;
  std::vector<std::vector<bool>> resident = {first_n(E, 4), {}, first_n(E, 4)};
  const std::vector<std::vector<double>> counts = {{100, 10, 300, 20, 900, 800, 50, 700},
                                                   {1000, 0, 0, 0, 0, 0, 0, 0},
                                                   {0, 400, 400, 400, 100, 100, 100, 900}};
  const RebalanceOptions o{.max_moves_per_layer = 2, .min_gain = 0.5, .min_z = 3.0};
  RebalancePlan p = plan_rebalance(resident, counts, o);
  // Layer 0: the two hottest host experts (4, 5) replace the two coldest residents (1, 3); layer 2: 7
  // replaces 0, and the next pair (4 vs 1..3 at 400) is no gain.
  const std::vector<std::pair<int32_t, int32_t>> want0 = {{1, 4}, {3, 5}};
  ASSERT_EQ(p.moves.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(p.moves[i].layer, 0);
    EXPECT_EQ(p.moves[i].evict, want0[i].first);
    EXPECT_EQ(p.moves[i].admit, want0[i].second);
  }
  EXPECT_EQ(p.moves[2].layer, 2);
  EXPECT_EQ(p.moves[2].evict, 0);
  EXPECT_EQ(p.moves[2].admit, 7);
  EXPECT_EQ(p.n_layers, 2);
  const double total = 2880 + 2400;  // the split layers' counts
  EXPECT_DOUBLE_EQ(p.gpu_share_before, (430.0 + 1200.0) / total);
  EXPECT_DOUBLE_EQ(p.gpu_share_after, (430.0 + 1670.0 + 2100.0) / total);
  EXPECT_GT(p.gpu_share_after, p.gpu_share_before);

  // Deterministic, and rounds converge to the top experts of each layer, then stop.
  const RebalancePlan again = plan_rebalance(resident, counts, o);
  ASSERT_EQ(again.moves.size(), p.moves.size());
  for (size_t i = 0; i < p.moves.size(); ++i)
    EXPECT_TRUE(again.moves[i].layer == p.moves[i].layer && again.moves[i].evict == p.moves[i].evict &&
                again.moves[i].admit == p.moves[i].admit);
  int rounds = 0;
  while (!p.moves.empty() && rounds < 10) {
    apply_moves(resident, p);
    p = plan_rebalance(resident, counts, o);
    ++rounds;
  }
  EXPECT_TRUE(p.moves.empty());
  EXPECT_EQ(resident[0], (std::vector<bool>{false, false, true, false, true, true, false, true}));
  EXPECT_TRUE(resident[1].empty());
  EXPECT_EQ(resident[2][7], true);
  EXPECT_EQ(resident[2][0], false);
  EXPECT_EQ(std::count(resident[2].begin(), resident[2].end(), true), 4);
}

TEST(PlanRebalance, HysteresisLeavesFlatOrThinCountsAlone) {
  const int64_t E = 16;
  std::vector<std::vector<bool>> resident = {first_n(E, 8), first_n(E, 8), first_n(E, 8), first_n(E, 8)};
  std::vector<std::vector<double>> counts(4, std::vector<double>(E, 1000.0));  // layer 0: flat
  // Layer 1: noise of a few percent around a flat 1000 (below min_gain's half of the uniform share).
  for (int64_t e = 0; e < E; ++e) counts[1][e] = 1000 + ((e * 37) % 11) * 4 - 20;
  // Layer 2: a host expert twice a resident one, but on 6 routings (not significant at 3 sigma).
  counts[2].assign(E, 0);
  counts[2][0] = 2, counts[2][12] = 4;
  counts[3].clear();  // nothing counted
  const RebalancePlan p = plan_rebalance(resident, counts, {});
  EXPECT_TRUE(p.moves.empty());
  EXPECT_EQ(p.n_layers, 0);
  EXPECT_DOUBLE_EQ(p.gpu_share_before, p.gpu_share_after);
  // Without hysteresis, the noise alone would move experts.
  const RebalancePlan loose = plan_rebalance(resident, counts, {.max_moves_per_layer = 8, .min_gain = 0, .min_z = 0});
  EXPECT_FALSE(loose.moves.empty());
  for (const ExpertMove& m : loose.moves) EXPECT_NE(m.layer, 0) << "equal counts never swap";
  // Nothing counted, or no split layer: no plan at all.
  EXPECT_EQ(plan_rebalance({{}, {}}, {{1, 2}, {3, 4}}, {}).gpu_share_before, -1);
}

TEST(PlanRebalance, BoundedPerLayerAndNothingToEvictOrAdmit) {
  const int64_t E = 32;
  std::vector<double> skew(E);
  for (int64_t e = 0; e < E; ++e) skew[e] = 100.0 * (double)e;  // the last experts are the hottest
  const std::vector<std::vector<bool>> resident = {first_n(E, 16), first_n(E, 0), std::vector<bool>(E, true)};
  const RebalancePlan p = plan_rebalance(resident, {skew, skew, skew}, {.max_moves_per_layer = 3});
  ASSERT_EQ(p.moves.size(), 3u);  // layers 1 (none resident) and 2 (all resident) cannot swap
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.moves[i].layer, 0);
    EXPECT_EQ(p.moves[i].admit, E - 1 - (int32_t)i);
    EXPECT_EQ(p.moves[i].evict, (int32_t)i);
  }
  EXPECT_TRUE(plan_rebalance(resident, {skew, skew, skew}, {.max_moves_per_layer = 0}).moves.empty());
}

// --- moving experts in a model ---------------------------------------------------------------------

// A CPU backend that runs split MoE layers the way the GPU backend does: the resident experts from the
// device copies (ExpertSplit's pointers, host memory here) on pool a, the host's experts from the mmap
// view on pool b, accumulated. The device part reads only what move_experts copied: a wrong copy or a
// stale pointer changes the logits. Counts routing in the op's statistics, as the GPU's host side does.
class SplitDeviceBackend final : public CpuForwardingBackend, public SplitExperts {
 public:
  SplitDeviceBackend(ThreadPool& a, ThreadPool& b) : CpuForwardingBackend(a), a_(a), b_(b) {}
  int64_t split_calls = 0, moved_calls = 0;

  std::string name() const override { return "split-device"; }
  SplitExperts* split_experts() override { return this; }
  void set_expert_streaming(int64_t, double) override {}
  void on_experts_moved() override { ++moved_calls; }

  void moe_ffn(const MoeFfn& ffn, const float* x, int64_t n, float* out) override {
    if (!ffn.split) {
      cpu_.moe_ffn(ffn, x, n, out);
      return;
    }
    const ExpertSplit& sp = *ffn.split;
    const MoeFfn host = ffn.host_view();
    cpu::moe_route(host, x, n, routing_, sa_, a_);
    if (ffn.stats && ffn.layer >= 0) ffn.stats->add(ffn.layer, routing_.ids);
    // The resident experts' device copies, laid out as a 3-D tensor again so moe_experts_partial reads
    // them by slice; host experts' slices stay NaN (an include mask that reached them would show).
    MoeFfn dev = host;
    Weight* mats[3] = {&dev.gate, &dev.up, &dev.down};
    const std::vector<const void*>* ptrs[3] = {&sp.gate, &sp.up, &sp.down};
    for (int m = 0; m < 3; ++m) {
      const size_t bytes = expert_matrix(*mats[m], 0).n_bytes;
      staged_[m].assign(bytes * ffn.n_expert, 0xff);
      for (int64_t e = 0; e < ffn.n_expert; ++e)
        if (sp.on_device[e]) std::memcpy(staged_[m].data() + e * bytes, (*ptrs[m])[e], bytes);
      mats[m]->data = staged_[m].data();
    }
    std::vector<bool> on_host(ffn.n_expert);
    for (int64_t e = 0; e < ffn.n_expert; ++e) on_host[e] = !sp.on_device[e];
    cpu::moe_experts_partial(dev, x, n, routing_, sp.on_device, out, false, sa_, a_);
    cpu::moe_experts_partial(host, x, n, routing_, on_host, out, true, sb_, b_);
    ++split_calls;
  }

 private:
  ThreadPool &a_, &b_;
  Routing routing_;
  cpu::MoeScratch sa_, sb_;
  std::vector<uint8_t> staged_[3];
};

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// Prompt of 12 tokens in two chunks, then n_gen greedy tokens; after_step(i) runs between steps.
Greedy greedy(const Model& m, ThreadPool& pool, int64_t n_gen, RoutingStats* stats,
              const std::function<void(int64_t)>& after_step = {}) {
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
    m.forward({.tokens = t, .pos0 = pos, .cache = &cache, .seq = 0, .all_logits = false, .segments = {},
               .state = state.get(), .routing_stats = stats},
              logits, pool);
    pos += (int32_t)t.size();
    g.logits.push_back(logits);
  };
  eval(std::span<const int32_t>(prompt).subspan(0, 7));
  eval(std::span<const int32_t>(prompt).subspan(7));
  for (int64_t i = 0; i < n_gen; ++i) {
    if (after_step) after_step(i);
    const int32_t id = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    g.tokens.push_back(id);
    eval(std::span<const int32_t>(&id, 1));
  }
  return g;
}

// Half of each layer's experts resident, by index, rotated by the layer.
std::vector<std::vector<bool>> half_masks(const ModelConfig& c) {
  std::vector<std::vector<bool>> masks(c.n_layer, std::vector<bool>(c.n_expert));
  for (int64_t il = 0; il < c.n_layer; ++il)
    for (int64_t e = 0; e < c.n_expert; ++e) masks[il][e] = (e + il) % c.n_expert < c.n_expert / 2;
  return masks;
}

// Every resident expert's device copies hold its own weights.
void expect_device_copies_match(const Model& m) {
  const ModelConfig& c = m.config();
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const ExpertSplit* sp = m.expert_split(il);
    if (!sp) continue;
    const Weight* host[3] = {&sp->host_gate, &sp->host_up, &sp->host_down};
    const std::vector<const void*>* dev[3] = {&sp->gate, &sp->up, &sp->down};
    for (int64_t e = 0; e < c.n_expert; ++e)
      for (int i = 0; i < 3; ++i) {
        if (!sp->on_device[e]) {
          EXPECT_EQ((*dev[i])[e], nullptr) << il << " " << e;
          continue;
        }
        const Weight w = expert_matrix(*host[i], e);
        ASSERT_NE((*dev[i])[e], nullptr);
        EXPECT_EQ(std::memcmp((*dev[i])[e], w.data, w.n_bytes), 0) << "layer " << il << " expert " << e;
      }
  }
}

std::vector<std::vector<double>> as_counts(const RoutingStats& s) {
  std::vector<std::vector<double>> n(s.n_layer());
  for (int64_t il = 0; il < s.n_layer(); ++il)
    for (uint64_t v : s.layer_counts(il)) n[il].push_back((double)v);
  return n;
}

std::vector<std::vector<bool>> residents(const Model& m) {
  std::vector<std::vector<bool>> r(m.config().n_layer);
  for (int64_t il = 0; il < m.config().n_layer; ++il)
    if (const ExpertSplit* sp = m.expert_split(il)) r[il] = sp->on_device;
  return r;
}

class MoveExperts : public ::testing::TestWithParam<std::string> {};

// Experts move twice during generation (toward the counted routing, no hysteresis so that they do move):
// the tokens and the logits of every step stay those of the unsplit model.
TEST_P(MoveExperts, MidGenerationKeepsGreedyOutput) {
  ThreadPool pool(2), pool_b(1);
  auto plain = Model::load(fixture(GetParam()));
  const Greedy want = greedy(*plain, pool, 16, nullptr);

  auto split = Model::load(fixture(GetParam()));
  const ModelConfig& c = split->config();
  auto dev = std::make_shared<SplitDeviceBackend>(pool, pool_b);
  const std::vector<std::vector<bool>> masks = half_masks(c);
  split->offload(dev, c.n_layer, &masks);
  ASSERT_TRUE(split->splits_experts());
  RoutingStats stats(*split);
  int64_t moved = 0, rounds_with_moves = 0;
  size_t bytes = 0;
  const Greedy got = greedy(*split, pool, 16, &stats, [&](int64_t step) {
    if (step != 3 && step != 9) return;
    const RebalancePlan p =
        plan_rebalance(residents(*split), as_counts(stats), {.max_moves_per_layer = 2, .min_gain = 0, .min_z = 0});
    bytes += split->move_experts(p.moves);
    moved += (int64_t)p.moves.size();
    rounds_with_moves += !p.moves.empty();
    stats.reset();  // the next round plans on what came after this one
  });
  EXPECT_GT(moved, 0);
  EXPECT_EQ(dev->moved_calls, rounds_with_moves);
  EXPECT_GT(dev->split_calls, 0);
  EXPECT_EQ(bytes, (size_t)moved * (expert_matrix(split->host_weights().layers[0].ffn_gate_exps, 0).n_bytes +
                                    expert_matrix(split->host_weights().layers[0].ffn_up_exps, 0).n_bytes +
                                    expert_matrix(split->host_weights().layers[0].ffn_down_exps, 0).n_bytes));
  EXPECT_NE(residents(*split), masks);
  for (int64_t il = 0; il < c.n_layer; ++il)
    EXPECT_EQ(split->expert_split(il)->n_on_device(), c.n_expert / 2) << "a layer keeps its resident count";
  expect_device_copies_match(*split);

  EXPECT_EQ(got.tokens, want.tokens) << GetParam();
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) {
    if (c.n_expert_used <= 2) {
      ASSERT_EQ(got.logits[i], want.logits[i]) << "step " << i;
      continue;
    }
    // k = 3: the two parts add a token's terms in another order (a few ulps).
    const auto [lo, hi] = std::minmax_element(want.logits[i].begin(), want.logits[i].end());
    for (size_t j = 0; j < got.logits[i].size(); ++j)
      ASSERT_NEAR(got.logits[i][j], want.logits[i][j], 1e-5 * (*hi - *lo)) << "step " << i << " logit " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoveExperts, ::testing::Values("tiny_qwen3moe", "tiny_qwen35moe"));

TEST(MoveExperts, BadMovesChangeNothing) {
  ThreadPool pool(1), pool_b(1);
  auto m = Model::load(fixture("tiny_qwen3moe"));
  const ModelConfig& c = m->config();
  auto dev = std::make_shared<SplitDeviceBackend>(pool, pool_b);
  std::vector<std::vector<bool>> masks = half_masks(c);
  masks[0].clear();  // layer 0: every expert on the GPU, not split
  m->offload(dev, c.n_layer, &masks);
  ASSERT_EQ(m->expert_split(0), nullptr);
  const int64_t il = 1;
  int32_t res = -1, host = -1;
  for (int32_t e = 0; e < c.n_expert; ++e) (masks[il][e] ? res : host) = e;
  const std::vector<std::vector<bool>> before = residents(*m);
  const std::vector<ExpertMove> bad[] = {
      {{.layer = 0, .evict = 0, .admit = 1}},                                                // not split
      {{.layer = il, .evict = host, .admit = res}},                                          // reversed
      {{.layer = il, .evict = res, .admit = host}, {.layer = il, .evict = res, .admit = host}},  // twice
      {{.layer = il, .evict = res, .admit = (int32_t)c.n_expert}},                           // out of range
      {{.layer = c.n_layer, .evict = res, .admit = host}},
  };
  for (const auto& moves : bad) EXPECT_THROW(m->move_experts(moves), Error);
  EXPECT_EQ(residents(*m), before);
  EXPECT_EQ(dev->moved_calls, 0);
  EXPECT_EQ(m->move_experts({}), 0u);
  // A chain is applied in order: res's buffers take host, then host's (the same buffers) take res back.
  const std::vector<ExpertMove> chain = {{.layer = il, .evict = res, .admit = host},
                                         {.layer = il, .evict = host, .admit = res}};
  EXPECT_GT(m->move_experts(chain), 0u);
  EXPECT_EQ(residents(*m), before);
  expect_device_copies_match(*m);
}

// --- the engine ------------------------------------------------------------------------------------

TEST(ExpertRebalancer, RefusesAModelWithoutSplitLayers) {
  auto m = Model::load(fixture("tiny_qwen3moe"));
  EXPECT_THROW({ ExpertRebalancer r(*m, {}); }, Error);
}

// Requests served with a rebalancer that runs every 4 forwarded tokens (no hysteresis, so it moves):
// greedy tokens equal an engine over the unsplit model, and the counters say experts moved.
TEST(ExpertRebalancer, EngineKeepsGreedyTokensWhileMoving) {
  const std::string file = fixture("tiny_qwen35moe");  // k = 2: the split is exact
  auto plain = Model::load(file);
  auto tok = Tokenizer::from_gguf(plain->file());
  auto split = Model::load(file);
  ThreadPool pool_a(1), pool_b(1);
  const std::vector<std::vector<bool>> masks = half_masks(split->config());
  split->offload(std::make_shared<SplitDeviceBackend>(pool_a, pool_b), split->config().n_layer, &masks);
  ExpertRebalancer rebalancer(*split, {.every_tokens = 4,
                                       .decay = 0.5,
                                       .plan = {.max_moves_per_layer = 1, .min_gain = 0, .min_z = 0}});
  auto run = [&](const Model& m, ExpertRebalancer* r) {
    Engine engine(m, *tok, {.n_parallel = 2, .n_ctx = 128, .n_threads = 1, .prefill_chunk = 5, .rebalancer = r});
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < 3; ++i) {
      GenerateParams g;
      for (int k = 0; k < 6 + 5 * i; ++k) g.prompt.push_back(3 + (k * 37 + i * 11) % 200);
      g.sampling.temperature = 0;
      g.max_tokens = 10;
      g.top_logprobs = 0;
      jobs.push_back(engine.submit(g));
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& j : jobs) {
      const Job::Update u = j->wait_all();
      EXPECT_NE(u.finish, Finish::error) << u.error;
      out.emplace_back();
      for (const TokenLogprob& lp : u.logprobs) out.back().push_back(lp.id);
    }
    const Engine::Stats s = engine.stats();
    if (r) {
      EXPECT_EQ(s.expert_moves, r->moves_total());
      EXPECT_GT(s.rebalance_rounds, 0u);
    }
    return out;
  };
  const auto want = run(*plain, nullptr);
  const auto got = run(*split, &rebalancer);
  EXPECT_EQ(got, want);
  EXPECT_GT(rebalancer.moves_total(), 0u);
  EXPECT_GT(rebalancer.bytes_total(), 0u);
  expect_device_copies_match(*split);
}

}  // namespace
}  // namespace xpert
