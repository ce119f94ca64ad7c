// CUDA attention (flash prefill, split-K decode, batched decode, the plain kernel) against cpu::attention
// on random data of real shapes: GQA 32/4 (Qwen3) and 16/2 (Qwen3.5), head_dim 64 / 128 / 256, up to 4096
// keys, causal with and without a sliding window.
//
// Tolerance: both sides round q to f16 and read the f16 cache; the CPU rounds the normalized softmax
// weights to f16, the GPU the unnormalized ones (exp(s - running max)) and divides at the end, so each
// weight differs by up to ~2 f16 half-ulps (~1e-3 relative). The outputs, weighted means of V ~ N(0, 1),
// then differ by about 1e-3 of their size: max |diff| < 4e-3 and relative L2 < 2e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "cuda_ops_test_util.h"

namespace xpert::cudaops_test {
namespace {

constexpr double kMaxAbs = 4e-3, kRelL2 = 2e-3;

ThreadPool& pool() {
  static ThreadPool p(ThreadPool::default_threads());
  return p;
}

std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  const auto f = randn(n, seed);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(f[i]);
  return h;
}

struct Shape {
  int64_t n_head, n_head_kv, head_dim;
};

// n_tokens queries at positions pos0.., over a cache of pos0 + n_tokens rows (the model's prefill).
void check_sequence(const Shape& s, int64_t n_tokens, int64_t pos0, int32_t window, uint32_t seed,
                    bool simple = false) {
  const int64_t D = s.head_dim, n_kv = pos0 + n_tokens, kv_row = s.n_head_kv * D;
  // Sharper than N(0,1) scores so that a few keys dominate, as in trained models.
  const auto q = randn(n_tokens * s.n_head * D, seed, 2.0f);
  const auto k = random_f16(n_kv * kv_row, seed + 1), v = random_f16(n_kv * kv_row, seed + 2);
  std::vector<int32_t> pos(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) pos[t] = (int32_t)(pos0 + t);
  std::vector<float> ref(n_tokens * s.n_head * D);
  AttentionArgs a{.q = q.data(),
                  .k = k.data(),
                  .v = v.data(),
                  .out = ref.data(),
                  .pos = pos.data(),
                  .n_tokens = n_tokens,
                  .n_head = s.n_head,
                  .n_head_kv = s.n_head_kv,
                  .head_dim = D,
                  .n_kv = n_kv,
                  .kq_scale = 1.0f / std::sqrt((float)D),
                  .sliding_window = window};
  cpu::attention(a, pool());

  Dev<float> dq(q), dout(ref.size());
  Dev<uint16_t> dk(k), dv(v);
  Dev<int32_t> dpos(pos);
  dout.poison();
  a.q = dq.get(), a.k = dk.get(), a.v = dv.get(), a.out = dout.get(), a.pos = dpos.get();
  Dev<char> ws(std::max<size_t>(cuda::attention_workspace_bytes(a), 1));
  if (simple)
    cuda::attention_simple(a, nullptr);
  else
    cuda::attention(a, ws.get(), nullptr);
  const Err e = compare(dout.download(), ref);
  const std::string what = "heads " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " D " +
                           std::to_string(D) + " tokens " + std::to_string(n_tokens) + " at " +
                           std::to_string(pos0) + " window " + std::to_string(window);
  EXPECT_TRUE(e.finite) << what;
  EXPECT_LT(e.max_abs, kMaxAbs) << what << ": " << e;
  EXPECT_LT(e.rel_l2, kRelL2) << what << ": " << e;
}

TEST(CudaAttention, PrefillMatchesCpu) {
  XPERT_OPS_REQUIRE_GPU();
  check_sequence({32, 4, 128}, 100, 0, 0, 1);      // Qwen3: first prompt chunk
  check_sequence({32, 4, 128}, 77, 3000, 0, 2);    // a later chunk at depth
  check_sequence({16, 2, 256}, 64, 4000, 0, 3);    // Qwen3.5 attention layer
  check_sequence({16, 2, 256}, 130, 0, 0, 4);      // partial last block of rows
  check_sequence({8, 1, 256}, 96, 700, 512, 5);    // Gemma 3 sliding window
  check_sequence({12, 4, 64}, 200, 50, 0, 6);      // head_dim 64
  check_sequence({32, 32, 128}, 40, 10, 0, 7);     // no GQA
}

TEST(CudaAttention, DecodeMatchesCpu) {
  XPERT_OPS_REQUIRE_GPU();
  for (int64_t n_kv : {1, 2, 17, 1000, 4096}) {
    check_sequence({16, 2, 256}, 1, n_kv - 1, 0, 10 + (uint32_t)n_kv);
    check_sequence({32, 4, 128}, 1, n_kv - 1, 0, 20 + (uint32_t)n_kv);
  }
  check_sequence({16, 2, 256}, 1, 4095, 1024, 30);  // window
  check_sequence({8, 1, 64}, 1, 3000, 0, 31);        // group 8, head_dim 64
  check_sequence({24, 2, 128}, 1, 2500, 0, 32);      // group 12: two head chunks, the second half empty
  check_sequence({4, 4, 128}, 1, 333, 0, 33);        // group 1
}

TEST(CudaAttention, OtherHeadDimsAndSimpleKernel) {
  XPERT_OPS_REQUIRE_GPU();
  check_sequence({4, 2, 80}, 9, 20, 0, 40);   // unsupported by the fast kernels: the plain one
  check_sequence({4, 1, 16}, 1, 30, 0, 41);   // a tiny fixture's heads
  check_sequence({16, 2, 256}, 33, 500, 0, 42, /*simple=*/true);
  check_sequence({32, 4, 128}, 1, 2000, 0, 43, /*simple=*/true);
}

// Several sequences in one decode step, each in its own slot at its own depth. Positions live only on the
// device: the same launch, replayed after the positions move, is right again (a captured graph's case).
TEST(CudaAttention, BatchedDecodeMatchesCpu) {
  XPERT_OPS_REQUIRE_GPU();
  const Shape s{16, 2, 256};
  const int64_t D = s.head_dim, kv_row = s.n_head_kv * D, n_ctx = 4096, n_slots = 4;
  const auto k = random_f16(n_slots * n_ctx * kv_row, 50), v = random_f16(n_slots * n_ctx * kv_row, 51);
  const std::vector<int32_t> slots = {3, 0, 2};
  const int64_t n_seq = (int64_t)slots.size();
  const auto q = randn(n_seq * s.n_head * D, 52, 2.0f);
  auto reference = [&](const std::vector<int32_t>& pos) {
    std::vector<float> ref(n_seq * s.n_head * D);
    for (int64_t i = 0; i < n_seq; ++i) {
      const AttentionArgs a{.q = q.data() + i * s.n_head * D,
                            .k = k.data() + slots[i] * n_ctx * kv_row,
                            .v = v.data() + slots[i] * n_ctx * kv_row,
                            .out = ref.data() + i * s.n_head * D,
                            .pos = &pos[i],
                            .n_tokens = 1,
                            .n_head = s.n_head,
                            .n_head_kv = s.n_head_kv,
                            .head_dim = D,
                            .n_kv = pos[i] + 1,
                            .kq_scale = 1.0f / 16.0f,
                            .sliding_window = 0};
      cpu::attention(a, pool());
    }
    return ref;
  };
  Dev<float> dq(q), dout(n_seq * s.n_head * D);
  Dev<uint16_t> dk(k), dv(v);
  Dev<int32_t> dslots(slots), dpos(n_seq);
  const cuda::DecodeAttentionArgs b{.q = dq.get(),
                                    .k = dk.get(),
                                    .v = dv.get(),
                                    .slot_stride = n_ctx * kv_row,
                                    .slots = dslots.get(),
                                    .pos = dpos.get(),
                                    .out = dout.get(),
                                    .n_seq = n_seq,
                                    .n_head = s.n_head,
                                    .n_head_kv = s.n_head_kv,
                                    .head_dim = D,
                                    .max_kv = n_ctx,
                                    .kq_scale = 1.0f / 16.0f,
                                    .sliding_window = 0,
                                    .min_keys_per_split = 64};
  Dev<char> ws(cuda::attention_decode_workspace_bytes(b));
  for (const std::vector<int32_t>& pos : {std::vector<int32_t>{4095, 0, 1777}, std::vector<int32_t>{5, 3000, 63}}) {
    dpos.upload(pos);
    dout.poison();
    cuda::attention_decode(b, ws.get(), nullptr);
    const auto got = dout.download();
    const Err e = compare(got, reference(pos));
    EXPECT_TRUE(e.finite);
    EXPECT_LT(e.max_abs, kMaxAbs) << e;
    EXPECT_LT(e.rel_l2, kRelL2) << e;
    cuda::attention_decode(b, ws.get(), nullptr);
    EXPECT_EQ(dout.download(), got) << "deterministic";
  }
}

}  // namespace
}  // namespace xpert::cudaops_test
