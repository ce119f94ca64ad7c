// The defaults of the ops that hand an Act or a PartialSum on (backend.h): what a backend that fuses
// nothing does with them. CUDA's forms: tests/cuda/test_cuda_act.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/moe.h"
#include "base/thread_pool.h"
#include "cpu_forwarding_backend.h"
#include "test_data.h"

namespace xpert {
namespace {

// The CPU with a DecodeFusions that only sums parts (counting the calls): what the default
// add_rmsnorm_moe_ffn_add needs to take a PartialSum.
class PartsBackend : public CpuForwardingBackend, public DecodeFusions {
 public:
  using CpuForwardingBackend::CpuForwardingBackend;
  std::string name() const override { return "parts"; }
  void moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) override {
    cpu::moe_ffn_reference(m, x, n, out);
  }
  DecodeFusions* decode_fusions() override { return this; }
  std::optional<Act> decode_attention(const DecodeAttention&) override { return std::nullopt; }
  std::optional<PartialSum> decode_attention_proj(const DecodeAttention&, const Weight&, float*) override {
    return std::nullopt;
  }
  int decode_attention_form(int32_t) const override { return 0; }
  bool fuses_attention_gate() const override { return false; }
  void sum_parts(const PartialSum& p) override {
    ++sums;
    for (int64_t i = 0; i < p.n; ++i) {
      float s = 0;
      for (int j = 0; j < p.n_parts; ++j) s += p.parts[j * p.n + i];
      p.out[i] = s;
    }
  }
  int sums = 0;
};

// A MoE layer of f32 experts (the reference takes any type).
struct F32Moe {
  std::vector<float> router, gate, up, down;
  MoeFfn ffn;
  F32Moe(int64_t E, int64_t F, int64_t X, int64_t k)
      : router(random_values(E * X, 1)), gate(random_values(E * F * X, 2)), up(random_values(E * F * X, 3)),
        down(random_values(F * E * X, 4)) {
    auto w = [](const std::vector<float>& v, int64_t k, int64_t n, int64_t m) {
      return Weight{.type = DType::F32, .data = v.data(), .ne = {k, n, m}, .n_bytes = v.size() * 4};
    };
    ffn.n_embd = E;
    ffn.n_ff = F;
    ffn.n_expert = X;
    ffn.n_used = k;
    ffn.router = w(router, E, X, 1);
    ffn.gate = w(gate, E, F, X);
    ffn.up = w(up, E, F, X);
    ffn.down = w(down, F, E, X);
  }
};

TEST(Act, DefaultNormIsThePlainOneAndNamesItsOutput) {
  ThreadPool pool(1);
  CpuBackend cpu(pool);
  Backend& b = cpu;  // the forward's view: the Act overloads are Backend's
  const int64_t rows = 3, n = 64;
  std::vector<float> x = random_values(rows * n, 5), w = random_values(n, 6), y(rows * n), want(rows * n);
  b.rmsnorm(x.data(), w.data(), want.data(), rows, n, 1e-6f);
  const Act a = b.rmsnorm_act(x.data(), w.data(), y.data(), rows, n, 1e-6f);
  EXPECT_EQ(y, want);
  EXPECT_EQ(a.x, y.data());
  EXPECT_EQ(a.rows, rows);
  EXPECT_EQ(a.k, n);
  EXPECT_EQ(a.form, nullptr);  // the CPU writes no other form
  // A product of the Act is the product of its rows.
  const std::vector<float> wm = random_values(32 * n, 7);
  const Weight W{.type = DType::F32, .data = wm.data(), .ne = {n, 32, 1}, .n_bytes = wm.size() * 4};
  std::vector<float> p0(rows * 32), p1(rows * 32);
  b.matmul(W, y.data(), rows, p0.data());
  b.matmul(W, a, p1.data());
  EXPECT_EQ(p0, p1);
}

// The attention's output left as parts, handed to the MoE half: the default sums them once, first, and
// then gives what the whole d gives; with next_w it returns the next layer's input as an Act.
TEST(Act, DefaultMoeHalfAddsHandedPartsFirst) {
  ThreadPool pool(1);
  PartsBackend parts_backend(pool);
  Backend& b = parts_backend;
  const int64_t E = 64;
  const F32Moe moe(E, 32, 8, 2);
  const std::vector<float> x0 = random_values(E, 10), w = random_values(E, 11), next_w = random_values(E, 12);
  const std::vector<float> p0 = random_values(E, 13), p1 = random_values(E, 14);
  std::vector<float> parts(p0);
  parts.insert(parts.end(), p1.begin(), p1.end());
  std::vector<float> d(E);
  for (int64_t i = 0; i < E; ++i) d[i] = p0[i] + p1[i];

  std::vector<float> x_want(x0), cur_want(E);
  const Act none = b.add_rmsnorm_moe_ffn_add(moe.ffn, d.data(), x_want.data(), w.data(), cur_want.data(), 1,
                                             nullptr);
  EXPECT_EQ(none.x, nullptr);  // without next_w, the next layer normalizes itself
  EXPECT_EQ(parts_backend.sums, 0);

  std::vector<float> x(x0), cur(E), owed(E, 0.0f);
  const PartialSum ps{.out = owed.data(), .parts = parts.data(), .n_parts = 2, .n = E};
  const Act next = b.add_rmsnorm_moe_ffn_add(moe.ffn, owed.data(), x.data(), w.data(), cur.data(), 1,
                                             next_w.data(), &ps);
  EXPECT_EQ(parts_backend.sums, 1);
  EXPECT_EQ(owed, d);
  EXPECT_EQ(x, x_want);
  ASSERT_EQ(next.x, cur.data());
  EXPECT_EQ(next.rows, 1);
  EXPECT_EQ(next.k, E);
  std::vector<float> cur_next(E);
  b.rmsnorm(x_want.data(), next_w.data(), cur_next.data(), 1, E, moe.ffn.rms_eps);
  EXPECT_EQ(cur, cur_next);
}

}  // namespace
}  // namespace xpert
