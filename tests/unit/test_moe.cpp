// The MoE block: routing (softmax, top-k with ties, renormalization) on hand-made logits, and grouped-
// by-expert execution against the token-by-token reference on random data of real shapes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <thread>

#include "backend/cpu/moe.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "quant/quant.h"
#include "runtime/experts/executor_share.h"

namespace xpert {
namespace {

TEST(MoeRouter, TopKRenormalized) {
  const std::vector<float> logits = {0, 1, 2, 3, /* token 1 */ 3, 2, 1, 0};
  Routing r;
  cpu::route_top_k(logits.data(), 2, {.n_expert = 4, .k = 2, .norm_weights = true, .weights_scale = 1.0f}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2, 0, 1}));
  const float w0 = std::exp(1.0f) / (std::exp(1.0f) + 1.0f);
  EXPECT_NEAR(r.weights[0], w0, 1e-6);
  EXPECT_NEAR(r.weights[1], 1 - w0, 1e-6);
  EXPECT_NEAR(r.weights[2], w0, 1e-6);
  EXPECT_NEAR(r.weights[3], 1 - w0, 1e-6);
}

TEST(MoeRouter, TiesTakeTheLowerExpertFirst) {
  const std::vector<float> logits = {1, 3, 3, 2, 3};
  Routing r;
  cpu::route_top_k(logits.data(), 1, {.n_expert = 5, .k = 2}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
  cpu::route_top_k(logits.data(), 1, {.n_expert = 5, .k = 3}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 4}));
  for (float w : r.weights) EXPECT_NEAR(w, 1.0f / 3, 1e-7);
  // All equal: the first k experts, equal weights.
  const std::vector<float> flat(8, -7.5f);
  cpu::route_top_k(flat.data(), 1, {.n_expert = 8, .k = 4}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float w : r.weights) EXPECT_FLOAT_EQ(w, 0.25f);
}

TEST(MoeRouter, WithoutNormalizationTheWeightsAreSoftmaxProbabilities) {
  const std::vector<float> logits = {0, 1000, 0, 999};  // large logits must not overflow
  Routing r;
  cpu::route_top_k(logits.data(), 1, {.n_expert = 4, .k = 2, .norm_weights = false}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.weights[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weights[1], 1 / (1 + std::exp(1.0)), 1e-6);
  const std::vector<float> l2 = {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  cpu::route_top_k(l2.data(), 1, {.n_expert = 4, .k = 2, .norm_weights = false, .weights_scale = 2.0f}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(r.weights[0], 2 * 0.4f, 1e-6);
  EXPECT_NEAR(r.weights[1], 2 * 0.3f, 1e-6);
}

TEST(MoeExperts, ExpertIsASliceOfTheLayerTensor) {
  std::vector<uint8_t> bytes(row_bytes(DType::Q4_K, 512) * 3 * 5);
  Weight w{.type = DType::Q4_K, .data = bytes.data(), .ne = {512, 3, 5}, .n_bytes = bytes.size()};
  const Weight e = expert_matrix(w, 4);
  EXPECT_EQ(e.data, bytes.data() + 4 * 3 * row_bytes(DType::Q4_K, 512));
  EXPECT_EQ(e.ne[0], 512);
  EXPECT_EQ(e.ne[1], 3);
  EXPECT_EQ(e.ne[2], 1);
  EXPECT_EQ(e.n_bytes, 3 * row_bytes(DType::Q4_K, 512));
}

// A 3-D expert tensor of random rows: a pool of quantized random rows, tiled in a shuffled order
// (quantizing 33 M floats to Q4_K one by one would dominate the test's time).
struct RandomTensor {
  std::vector<uint8_t> bytes;
  Weight w;
  RandomTensor(DType t, int64_t k, int64_t n, int64_t x, std::mt19937& rng) {
    const size_t rb = row_bytes(t, k);
    constexpr int64_t kPool = 1024;
    std::vector<uint8_t> pool(rb * kPool);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt((float)k));
    std::vector<float> row(k);
    for (int64_t r = 0; r < kPool; ++r) {
      for (float& v : row) v = normal(rng);
      quantize_row(t, row.data(), pool.data() + r * rb, k);
    }
    bytes.resize(rb * n * x);
    for (int64_t r = 0; r < n * x; ++r)
      std::memcpy(bytes.data() + r * rb, pool.data() + rng() % kPool * rb, rb);
    w = Weight{.type = t, .data = bytes.data(), .ne = {k, n, x}, .n_bytes = bytes.size()};
  }
};

// A MoE layer of random weights: an F32 router, Q4_K gate and up, Q6_K down.
struct RandomMoe {
  std::vector<float> router;
  RandomTensor gate, up, down;
  MoeFfn ffn;
  RandomMoe(int64_t n_embd, int64_t n_ff, int64_t n_expert, int64_t n_used, std::mt19937& rng)
      : router(random_router(n_embd * n_expert, rng)),
        gate(DType::Q4_K, n_embd, n_ff, n_expert, rng),
        up(DType::Q4_K, n_embd, n_ff, n_expert, rng),
        down(DType::Q6_K, n_ff, n_embd, n_expert, rng) {
    ffn.n_embd = n_embd;
    ffn.n_ff = n_ff;
    ffn.n_expert = n_expert;
    ffn.n_used = n_used;
    ffn.router = Weight{
        .type = DType::F32, .data = router.data(), .ne = {n_embd, n_expert, 1}, .n_bytes = router.size() * 4};
    ffn.gate = gate.w;
    ffn.up = up.w;
    ffn.down = down.w;
  }
  static std::vector<float> random_router(int64_t n, std::mt19937& rng) {
    std::vector<float> r(n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : r) v = normal(rng) * 0.03f;
    return r;
  }
};

class MoeGrouped : public ::testing::TestWithParam<int64_t> {};

TEST_P(MoeGrouped, EqualsTokenByTokenReference) {
  const int64_t m = GetParam();
  std::mt19937 rng(42 + m);
  const RandomMoe layer(1024, 512, 64, 8, rng);
  const MoeFfn& ffn = layer.ffn;
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<float> x(m * ffn.n_embd);
  for (float& v : x) v = normal(rng);
  std::vector<float> want(x.size());
  cpu::moe_ffn_reference(ffn, x.data(), m, want.data());
  double max_ref = 0;
  for (float v : want) max_ref = std::max(max_ref, (double)std::fabs(v));
  ASSERT_GT(max_ref, 0);

  ThreadPool pool(2);
  cpu::MoeScratch s;
  std::vector<float> by_expert(x.size()), by_rows(x.size()), batched(x.size()), automatic(x.size());
  cpu::moe_ffn(ffn, x.data(), m, by_expert.data(), s, pool, cpu::MoeSchedule::by_expert);
  cpu::moe_ffn(ffn, x.data(), m, by_rows.data(), s, pool, cpu::MoeSchedule::by_rows);
  cpu::moe_ffn(ffn, x.data(), m, batched.data(), s, pool, cpu::MoeSchedule::batched);
  cpu::moe_ffn(ffn, x.data(), m, automatic.data(), s, pool);
  double max_err = 0;
  for (size_t i = 0; i < want.size(); ++i)
    max_err = std::max(max_err, (double)std::fabs(by_expert[i] - want[i]));
  EXPECT_LT(max_err, 2e-3 * max_ref) << "m = " << m << ", max |ref| = " << max_ref;
  // The schedules only change which thread computes what: the same bits.
  EXPECT_EQ(by_expert, by_rows);
  // batched runs the tile kernels at every row count; cpu::matmul switches to the panel kernels at 8
  // rows (other summation order): the same bits only below that.
  if (m < 8) {
    EXPECT_EQ(by_expert, batched);
  } else {
    double batched_err = 0;
    for (size_t i = 0; i < want.size(); ++i)
      batched_err = std::max(batched_err, (double)std::fabs(batched[i] - want[i]));
    EXPECT_LT(batched_err, 2e-3 * max_ref);
  }
  EXPECT_EQ(by_expert, automatic);
  // And each token's result does not depend on the other tokens of the batch: the same bits while every
  // expert sees fewer than 8 rows; past that the panel kernels sum in another order (last-bit differences).
  std::vector<float> one(ffn.n_embd);
  cpu::moe_ffn(ffn, x.data() + (m - 1) * ffn.n_embd, 1, one.data(), s, pool);
  for (int64_t i = 0; i < ffn.n_embd; ++i) {
    if (m < 8)
      EXPECT_EQ(one[i], by_expert[(m - 1) * ffn.n_embd + i]) << i;
    else
      EXPECT_NEAR(one[i], by_expert[(m - 1) * ffn.n_embd + i], 1e-5 * max_ref) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeGrouped, ::testing::Values(1, 7, 64));

// An expert executor that computes its tasks with the CPU's own kernels on a thread of its own, as an
// OpenCL device would beside the CPU's threads: each task through moe_experts_partial with k = 1 and
// weight 1 (its rows, its expert), so its rows get the CPU's bits.
class ThreadExecutor final : public ExpertExecutor {
 public:
  std::string name() const override { return "a thread"; }
  void start(const MoeFfn& m, std::span<const ExpertTask> tasks, const float* xg, int64_t n_rows,
             float* yg) override {
    wait();
    rows += n_rows;
    experts += (int64_t)tasks.size();
    std::vector<ExpertTask> ts(tasks.begin(), tasks.end());
    MoeFfn one = m;
    one.exec = nullptr;
    one.n_used = 1;
    worker_ = std::thread([this, one, ts, xg, yg] {
      std::vector<bool> include(one.n_expert, false);
      for (const ExpertTask& t : ts) {
        Routing r;
        r.n_tokens = t.n_rows;
        r.k = 1;
        r.ids.assign(t.n_rows, t.expert);
        r.weights.assign(t.n_rows, 1.0f);
        include.assign(one.n_expert, false);
        include[t.expert] = true;
        cpu::moe_experts_partial(one, xg + t.row0 * one.n_embd, t.n_rows, r, include,
                                 yg + t.row0 * one.n_embd, false, scratch_, pool_, cpu::MoeSchedule::by_rows);
      }
    });
  }
  void wait() override {
    if (worker_.joinable()) worker_.join();
  }
  ~ThreadExecutor() override { wait(); }
  int64_t rows = 0, experts = 0;

 private:
  std::thread worker_;
  ThreadPool pool_{1};
  cpu::MoeScratch scratch_;
};

// --expert-device opencl:N,cpu: a batch's experts split between an executor and the CPU's threads give
// the CPU's own bits at any share, and the executor gets about its share of the rows.
TEST(MoeExecutorShare, SplitBatchEqualsTheCpuAlone) {
  std::mt19937 rng(7);
  const RandomMoe layer(512, 256, 32, 4, rng);
  const MoeFfn& ffn = layer.ffn;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 64}) {
    std::vector<float> x(n * ffn.n_embd);
    for (float& v : x) v = normal(rng);
    cpu::MoeScratch s;
    std::vector<float> want(x.size());
    cpu::moe_ffn(ffn, x.data(), n, want.data(), s, pool, cpu::MoeSchedule::by_rows);
    for (double share : {0.0, 0.3, 0.5, 1.0}) {
      ThreadExecutor exec;
      MoeFfn m = ffn;
      m.exec = &exec;
      m.exec_share = {.decode = share, .prefill = share};
      std::vector<float> got(x.size());
      cpu::moe_ffn(m, x.data(), n, got.data(), s, pool, cpu::MoeSchedule::by_rows);
      EXPECT_EQ(got, want) << "n = " << n << ", share " << share;
      const int64_t rows = n * ffn.n_used;
      if (share == 0.0) {
        EXPECT_EQ(exec.rows, 0);
      }
      if (share == 1.0) {
        EXPECT_EQ(exec.rows, rows);
      }
      if (share == 0.5 && n == 64) {
        EXPECT_GT(exec.rows, rows / 4) << "the executor's rows";
        EXPECT_LT(exec.rows, 3 * rows / 4) << "the executor's rows";
      }
      // The partial form (a split GPU layer's host share) shares the same way.
      std::vector<bool> some(ffn.n_expert, false);
      for (int64_t e = 0; e < ffn.n_expert; e += 2) some[e] = true;
      std::vector<float> part_cpu(x.size()), part(x.size());
      cpu::moe_experts_partial(ffn, x.data(), n, s.routing, some, part_cpu.data(), false, s, pool,
                               cpu::MoeSchedule::by_rows);
      const Routing r = s.routing;
      cpu::moe_experts_partial(m, x.data(), n, r, some, part.data(), false, s, pool,
                               cpu::MoeSchedule::by_rows);
      EXPECT_EQ(part, part_cpu) << "partial, n = " << n << ", share " << share;
    }
  }
}

// The share is measured once per machine and layer shape, then read from the cache.
TEST(MoeExecutorShare, MeasuredOnceThenCached) {
  std::mt19937 rng(9);
  const RandomMoe layer(256, 256, 16, 4, rng);
  const MoeFfn& ffn = layer.ffn;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("xpert_share_cache_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  ThreadPool pool(2);
  ThreadExecutor exec;
  const ShareMeasurement first = measure_executor_share(ffn, exec, pool);
  EXPECT_FALSE(first.cached);
  EXPECT_GT(exec.rows, 0) << "the executor was timed";
  for (int phase = 0; phase < 2; ++phase) {
    EXPECT_GT(first.cpu_ms[phase], 0);
    EXPECT_GT(first.device_ms[phase], 0);
    // Never slower than the better single executor as measured: the split is chosen only when faster.
    EXPECT_LE(first.chosen_ms[phase], std::min(first.cpu_ms[phase], first.device_ms[phase]));
  }
  EXPECT_NE(first.summary().find("CPU alone"), std::string::npos) << first.summary();
  const ShareMeasurement again = measure_executor_share(ffn, exec, pool);
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(again.share.decode, first.share.decode);
  EXPECT_EQ(again.share.prefill, first.share.prefill);
  if (old)
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(parse_executor_share("0.4").decode, 0.4);
  EXPECT_EQ(parse_executor_share("0.2,0.9").prefill, 0.9);
  EXPECT_THROW(parse_executor_share("2"), Error);
}

// The decode share applies below prefill_min_tokens, the prefill share from there on.
TEST(MoeExecutorShare, PhaseByBatchSize) {
  const ExecutorShare s{.decode = 0.1, .prefill = 0.9, .prefill_min_tokens = 16};
  EXPECT_EQ(s.of(1), 0.1);
  EXPECT_EQ(s.of(15), 0.1);
  EXPECT_EQ(s.of(16), 0.9);
  EXPECT_EQ(s.of(512), 0.9);
}

}  // namespace
}  // namespace xpert
