// The state cache's radix index on tiny made-up configs (no model): longest prefix, splits, restores
// that give back exactly the rows and states stored, checkpoints as the only resume points of hybrid
// models, LRU eviction, and a byte budget that random use never exceeds.
//
// Every KV row and state value is a function of the token prefix that produced it, so any restored row
// can be checked against what the slot would hold had it evaluated the same tokens.
#include <gtest/gtest.h>

#include <random>

#include "model/kv_cache.h"
#include "model/recurrent_state.h"
#include "runtime/state_cache.h"

namespace xpert {
namespace {

ModelConfig dense_config() {
  ModelConfig c;
  c.arch = "test";
  c.n_layer = 2;
  c.n_head_kv = 1;
  c.head_dim = 4;
  return c;
}

// Layers: recurrent, attention, recurrent.
ModelConfig hybrid_config() {
  ModelConfig c = dense_config();
  c.n_layer = 3;
  c.layer_recurrent = {true, false, true};
  c.ssm_d_conv = 2;
  c.ssm_n_group = 1;
  c.ssm_dt_rank = 1;
  c.ssm_d_state = 2;
  c.ssm_d_inner = 2;
  return c;
}

uint64_t prefix_hash(const std::vector<int32_t>& t, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; ++i) h = (h ^ (uint64_t)(uint32_t)t[i]) * 1099511628211ull;
  return h;
}

uint16_t row_value(uint64_t h, int64_t layer, int kv, int64_t e) {
  return (uint16_t)((h >> 7) + layer * 131 + kv * 17 + e);
}
float state_value(uint64_t h, int64_t layer, size_t e) {
  return (float)((h >> 11) % 100000) + (float)layer * 0.5f + (float)e;
}

bool attention_layer(const ModelConfig& c, int64_t il) {
  return il >= (int64_t)c.layer_recurrent.size() || !c.layer_recurrent[il];
}

struct Fixture {
  explicit Fixture(const ModelConfig& cfg, size_t budget, int64_t n_ctx = 1024)
      : c(cfg), kv(c, n_ctx, 2), cache(c, kv.types(), budget) {
    if (c.has_recurrent_layers()) st = std::make_unique<RecurrentState>(c, 2);
  }
  // Slot `seq` as if it had evaluated `t`: rows [0, t.size()) and the recurrent state at t.size().
  void evaluate(int seq, const std::vector<int32_t>& t) {
    std::vector<uint16_t> row(kv.row());
    for (int64_t p = 0; p < (int64_t)t.size(); ++p) {
      const uint64_t h = prefix_hash(t, p + 1);
      for (int64_t il = 0; il < c.n_layer; ++il) {
        if (!attention_layer(c, il)) continue;
        for (int k = 0; k < 2; ++k) {
          for (int64_t e = 0; e < kv.row(); ++e) row[e] = row_value(h, il, k, e);
          kv.write_rows(il, seq, k, p, 1, row.data());
        }
      }
    }
    if (!st) return;
    const uint64_t h = prefix_hash(t, (int64_t)t.size());
    std::vector<float> s(st->slot_floats());
    for (int64_t il = 0; il < c.n_layer; ++il) {
      if (attention_layer(c, il)) continue;
      for (size_t e = 0; e < s.size(); ++e) s[e] = state_value(h, il, e);
      st->write(il, seq, s.data());
    }
    st->set_n_pos(seq, (int64_t)t.size());
  }
  void wipe(int seq) {
    std::vector<uint16_t> zero(kv.row() * kv.n_ctx(), 0);
    for (int64_t il = 0; il < c.n_layer; ++il)
      if (attention_layer(c, il))
        for (int k = 0; k < 2; ++k) kv.write_rows(il, seq, k, 0, kv.n_ctx(), zero.data());
    if (st) st->reset(seq);
  }
  // Rows [0, n) of slot `seq` (and its state, at n) are those of evaluating t[0, n).
  ::testing::AssertionResult holds(int seq, const std::vector<int32_t>& t, int64_t n) {
    std::vector<uint16_t> row(kv.row());
    for (int64_t p = 0; p < n; ++p) {
      const uint64_t h = prefix_hash(t, p + 1);
      for (int64_t il = 0; il < c.n_layer; ++il) {
        if (!attention_layer(c, il)) continue;
        for (int k = 0; k < 2; ++k) {
          kv.read_rows(il, seq, k, p, 1, row.data());
          for (int64_t e = 0; e < kv.row(); ++e)
            if (row[e] != row_value(h, il, k, e))
              return ::testing::AssertionFailure()
                     << "row " << p << " layer " << il << " kv " << k << " differs";
        }
      }
    }
    if (!st) return ::testing::AssertionSuccess();
    if (st->n_pos(seq) != n)
      return ::testing::AssertionFailure() << "state at " << st->n_pos(seq) << ", want " << n;
    const uint64_t h = prefix_hash(t, n);
    std::vector<float> s(st->slot_floats());
    for (int64_t il = 0; il < c.n_layer; ++il) {
      if (attention_layer(c, il)) continue;
      st->read(il, seq, s.data());
      for (size_t e = 0; e < s.size(); ++e)
        if (s[e] != state_value(h, il, e))
          return ::testing::AssertionFailure() << "state of layer " << il << " differs";
    }
    return ::testing::AssertionSuccess();
  }
  int64_t store(int seq, const std::vector<int32_t>& t) {
    evaluate(seq, t);
    return cache.store(t, kv, st.get(), seq);
  }
  ModelConfig c;
  KvCache kv;
  std::unique_ptr<RecurrentState> st;
  StateCache cache;
};

std::vector<int32_t> seq(int32_t first, int n, int32_t salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(i == 0 ? first : 3 + (i * 7 + salt) % 50);
  return t;
}

// Bytes a dense run of n tokens costs: K and V rows of every layer, plus the token ids.
size_t dense_bytes(const Fixture& f, int64_t n) { return (size_t)n * (2 * 2 * (size_t)f.kv.row() * 2 + 4); }

TEST(StateCache, LongestPrefixAndSplit) {
  Fixture f(dense_config(), 1 << 20);
  const std::vector<int32_t> a = seq(1, 40);
  EXPECT_EQ(f.store(0, a), 40);
  std::vector<int32_t> b(a.begin(), a.begin() + 10);
  for (int i = 0; i < 15; ++i) b.push_back(900 + i);

  EXPECT_EQ(f.cache.match(a, 39).resume, 39);  // limit: the last token is evaluated again
  EXPECT_EQ(f.cache.match(a, 100).n_common, 40);
  EXPECT_EQ(f.cache.match(b, 24).n_common, 10);
  EXPECT_EQ(f.cache.match(b, 24).resume, 10);
  EXPECT_EQ(f.cache.match(seq(2, 30), 29).n_common, 0);
  std::vector<int32_t> longer = a;
  longer.push_back(5);
  EXPECT_EQ(f.cache.match(longer, 40).resume, 40);

  // Restore b's cached prefix into the other slot, then keep b too: a's run is split at 10.
  f.wipe(1);
  f.cache.restore(b, 10, 0, f.kv, nullptr, 1);
  EXPECT_TRUE(f.holds(1, b, 10));
  EXPECT_EQ(f.store(1, b), 25);
  EXPECT_EQ(f.cache.stats().n_tokens, 40 + 15);
  EXPECT_EQ(f.cache.stats().bytes, dense_bytes(f, 55));
  for (const auto& t : {a, b}) {
    f.wipe(1);
    f.cache.restore(t, (int64_t)t.size(), 0, f.kv, nullptr, 1);
    EXPECT_TRUE(f.holds(1, t, (int64_t)t.size()));
  }
  // A restore from `from` writes only the rows past it.
  f.wipe(1);
  f.cache.restore(a, 30, 12, f.kv, nullptr, 1);
  EXPECT_FALSE(f.holds(1, a, 30));
  f.cache.restore(a, 12, 0, f.kv, nullptr, 1);
  EXPECT_TRUE(f.holds(1, a, 30));
}

TEST(StateCache, LongRunsAcrossNodes) {
  Fixture f(dense_config(), 1 << 22);
  const std::vector<int32_t> a = seq(1, 700, 3);
  EXPECT_EQ(f.store(0, a), 700);
  std::vector<int32_t> b(a.begin(), a.begin() + 600);  // diverges inside the third run
  b.push_back(999);
  EXPECT_EQ(f.cache.match(b, 600).resume, 600);
  f.wipe(1);
  f.cache.restore(b, 600, 0, f.kv, nullptr, 1);
  EXPECT_TRUE(f.holds(1, a, 600));
  // Storing a run that is there already adds nothing.
  const size_t bytes = f.cache.stats().bytes;
  EXPECT_EQ(f.store(0, std::vector<int32_t>(a.begin(), a.begin() + 300)), 300);
  EXPECT_EQ(f.cache.stats().bytes, bytes);
}

TEST(StateCache, OffStoresNothing) {
  Fixture f(dense_config(), 0);
  EXPECT_FALSE(f.cache.enabled());
  EXPECT_EQ(f.store(0, seq(1, 20)), 0);
  EXPECT_EQ(f.cache.match(seq(1, 20), 19).resume, 0);
  EXPECT_EQ(f.cache.stats().bytes, 0u);
}

TEST(StateCache, DenseEvictsLeastRecentlyUsed) {
  const int64_t n = StateCache::kMaxNodeTokens;  // one run each
  Fixture probe(dense_config(), 1);
  Fixture f(dense_config(), dense_bytes(probe, n) * 5 / 2);
  const auto a = seq(1, (int)n), b = seq(2, (int)n), c = seq(3, (int)n);
  EXPECT_EQ(f.store(0, a), n);
  EXPECT_EQ(f.store(0, b), n);
  f.cache.restore(a, 10, 0, f.kv, nullptr, 1);  // a is used again: b is now the oldest
  EXPECT_EQ(f.store(0, c), n);
  EXPECT_EQ(f.cache.stats().evictions, 1u);
  EXPECT_EQ(f.cache.match(a, n).n_common, n);
  EXPECT_EQ(f.cache.match(b, n).n_common, 0);
  EXPECT_EQ(f.cache.match(c, n).n_common, n);
  EXPECT_LE(f.cache.stats().bytes, f.cache.stats().budget_bytes);

  // Deeper runs go before the prefix they hang from: a 2-run sequence loses its tail first.
  Fixture g(dense_config(), dense_bytes(probe, 2 * n + n / 2));
  const auto d = seq(4, (int)(2 * n), 1);
  EXPECT_EQ(g.store(0, d), 2 * n);
  EXPECT_EQ(g.store(0, seq(5, (int)(n / 2))), n / 2);  // fits beside it
  EXPECT_EQ(g.store(0, seq(6, (int)(n / 2))), n / 2);  // needs room: d's tail run goes (the oldest leaf)
  EXPECT_EQ(g.cache.match(d, 2 * n).n_common, n);
}

TEST(StateCache, DenseStoresThePrefixThatFits) {
  Fixture probe(dense_config(), 1);
  Fixture f(dense_config(), dense_bytes(probe, 100));
  const auto a = seq(1, 300);
  EXPECT_EQ(f.store(0, a), 100);
  EXPECT_EQ(f.cache.stats().bytes, dense_bytes(f, 100));
  f.wipe(1);
  f.cache.restore(a, 100, 0, f.kv, nullptr, 1);
  EXPECT_TRUE(f.holds(1, a, 100));
}

TEST(StateCache, HybridResumesOnlyAtCheckpoints) {
  Fixture f(hybrid_config(), 1 << 20);
  EXPECT_TRUE(f.cache.recurrent());
  const auto a = seq(1, 60);
  const std::vector<int32_t> a20(a.begin(), a.begin() + 20), a50(a.begin(), a.begin() + 50);
  EXPECT_EQ(f.store(0, a20), 20);
  EXPECT_EQ(f.store(0, a50), 50);
  EXPECT_EQ(f.cache.stats().n_checkpoints, 2);
  EXPECT_TRUE(f.cache.has_checkpoint(a20));
  EXPECT_FALSE(f.cache.has_checkpoint(std::vector<int32_t>(a.begin(), a.begin() + 30)));
  EXPECT_EQ(f.cache.match(a, 59).resume, 50);
  EXPECT_EQ(f.cache.match(a, 49).resume, 20);  // 50 is past the limit
  std::vector<int32_t> b(a.begin(), a.begin() + 30);
  b.push_back(999);
  b.push_back(998);
  const StateCache::Match m = f.cache.match(b, 31);
  EXPECT_EQ(m.n_common, 30);
  EXPECT_EQ(m.resume, 20);
  f.wipe(1);
  f.cache.restore(b, 20, 0, f.kv, f.st.get(), 1);
  EXPECT_TRUE(f.holds(1, a, 20));
  f.wipe(1);
  f.cache.restore(a, 50, 0, f.kv, f.st.get(), 1);
  EXPECT_TRUE(f.holds(1, a, 50));

  // A checkpoint inside a run splits it.
  const std::vector<int32_t> a35(a.begin(), a.begin() + 35);
  EXPECT_EQ(f.store(0, a35), 35);
  EXPECT_EQ(f.cache.match(a, 49).resume, 35);
  EXPECT_EQ(f.cache.stats().n_tokens, 50);
}

TEST(StateCache, HybridEvictsCheckpointsAndTheRowsOnlyTheyNeeded) {
  Fixture probe(hybrid_config(), 1 << 20);
  probe.store(0, seq(1, 10));
  const size_t per_token = 2 * (size_t)probe.kv.row() * 2 + 4;  // one attention layer's K and V, the id
  const size_t ckpt = probe.cache.stats().bytes - 10 * per_token;
  EXPECT_EQ(ckpt, 2 * probe.st->slot_floats() * sizeof(float));

  // Room for three checkpoints and 140 tokens' rows.
  Fixture f(hybrid_config(), 3 * ckpt + 140 * per_token);
  const auto a = seq(1, 60);
  const std::vector<int32_t> a20(a.begin(), a.begin() + 20);
  EXPECT_EQ(f.store(0, a20), 20);
  EXPECT_EQ(f.store(0, a), 60);
  f.cache.restore(a, 60, 0, f.kv, f.st.get(), 1);  // the end of a is used; its interior checkpoint is not
  const auto b = seq(2, 40);
  EXPECT_EQ(f.store(0, b), 40);
  const auto c = seq(3, 40);
  EXPECT_EQ(f.store(0, c), 40);  // evicts a's checkpoint at 20 (least recently used), keeps its rows
  EXPECT_EQ(f.cache.stats().evictions, 1u);
  EXPECT_EQ(f.cache.match(a, 60).resume, 60);
  EXPECT_EQ(f.cache.match(a20, 20).resume, 0);
  EXPECT_EQ(f.cache.stats().n_tokens, 140);
  const auto d = seq(4, 40);
  EXPECT_EQ(f.store(0, d), 40);  // evicts a's end: a's rows go with it
  EXPECT_EQ(f.cache.match(a, 60).n_common, 0);
  EXPECT_EQ(f.cache.stats().n_tokens, 120);
  EXPECT_EQ(f.cache.stats().n_checkpoints, 3);
  EXPECT_LE(f.cache.stats().bytes, f.cache.stats().budget_bytes);

  // A checkpoint that can never fit is refused without emptying the pool.
  Fixture tiny(hybrid_config(), ckpt / 2);
  EXPECT_EQ(tiny.store(0, a20), 0);
  EXPECT_EQ(tiny.cache.stats().bytes, 0u);
}

// Random stores and restores over a small alphabet (so sequences share prefixes and split runs): every
// restore gives back the rows (and state) of evaluating the same tokens, and the budget holds throughout.
void random_use(const ModelConfig& c, size_t budget, uint32_t seed) {
  Fixture f(c, budget);
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> seen;
  int verified = 0;
  for (int it = 0; it < 400; ++it) {
    std::vector<int32_t> t;
    if (!seen.empty() && rng() % 3) {  // extend or diverge from an earlier one
      t = seen[rng() % seen.size()];
      if (rng() % 2) t.resize(rng() % (t.size() + 1));
    }
    const int extra = 1 + (int)(rng() % 120);
    for (int i = 0; i < extra && (int64_t)t.size() < 900; ++i) t.push_back(1 + (int32_t)(rng() % 4));
    if (rng() % 2) {
      f.store(0, t);
      seen.push_back(t);
    } else {
      const int64_t limit = (int64_t)t.size() - 1;
      const StateCache::Match m = f.cache.match(t, limit);
      ASSERT_LE(m.resume, limit);
      ASSERT_LE(m.resume, m.n_common);
      f.wipe(1);
      f.cache.restore(t, m.resume, 0, f.kv, f.st.get(), 1);
      if (f.st && m.resume == 0) continue;
      ASSERT_TRUE(f.holds(1, t, m.resume)) << "iteration " << it;
      verified += m.resume > 0;
    }
    ASSERT_LE(f.cache.stats().bytes, budget) << "iteration " << it;
  }
  EXPECT_GT(f.cache.stats().evictions, 0u);
  EXPECT_GT(verified, 40);
}

TEST(StateCache, RandomUseKeepsDataAndBudgetDense) { random_use(dense_config(), 40000, 1); }
TEST(StateCache, RandomUseKeepsDataAndBudgetHybrid) { random_use(hybrid_config(), 40000, 2); }

}  // namespace
}  // namespace xpert
