// CUDA attention (flash prefill, split-K decode, batched decode, the plain kernel) against cpu::attention
// on random data of real shapes: GQA 32/4 (Qwen3) and 16/2 (Qwen3.5), head_dim 64 / 128 / 256, up to 4096
// keys, causal with and without a sliding window.
//
// Tolerance: both sides round q to f16 and read the f16 cache; the CPU rounds the normalized softmax
// weights to f16, the GPU the unnormalized ones (exp(s - running max)) and divides at the end, so each
// weight differs by up to ~2 f16 half-ulps (~1e-3 relative). The outputs, weighted means of V ~ N(0, 1),
// then differ by about 1e-3 of their size: max |diff| < 4e-3 and relative L2 < 2e-3.
//
// Quantized caches (q8_0, q4_0; issue #10): both sides read the same blocks; the GPU dequantizes each value
// to f16 (q * d rounded once, up to 2^-11 relative) where the CPU keeps it in f32, which adds about as much
// as q's f16 rounding already costs: bounds 6e-3 / 3e-3 for them. The store kernel must give the reference
// quantizer's bytes exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/device.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/ops.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "cuda_ops_test_util.h"
#include "cuda_test_util.h"
#include "quant/quant.h"
#include "model/kv_cache.h"

namespace xpert::cudaops_test {
namespace {

constexpr double kMaxAbs = 4e-3, kRelL2 = 2e-3;
constexpr double kQuantMaxAbs = 6e-3, kQuantRelL2 = 3e-3;

struct KvPair {
  DType k = DType::F16, v = DType::F16;
};
bool quantized(KvPair t) { return t.k != DType::F16 || t.v != DType::F16; }
std::string name(KvPair t) { return " K " + kv_type_name(t.k) + " V " + kv_type_name(t.v); }

// n rows of `row` N(0, 1) values stored in the cache type (the CPU store: f16, or quant's reference
// quantizer).
std::vector<uint8_t> random_rows(DType t, int64_t n, int64_t row, uint32_t seed) {
  const auto f = randn(n * row, seed);
  std::vector<uint8_t> b(n * row_bytes(t, row));
  cpu::store_kv(f.data(), b.data(), n * row, t);
  return b;
}

ThreadPool& pool() {
  static ThreadPool p(ThreadPool::default_threads());
  return p;
}

struct Shape {
  int64_t n_head, n_head_kv, head_dim;
};

// n_tokens queries at positions pos0.., over a cache of pos0 + n_tokens rows (the model's prefill).
void check_sequence(const Shape& s, int64_t n_tokens, int64_t pos0, int32_t window, uint32_t seed,
                    bool simple = false, KvPair types = {}) {
  const int64_t D = s.head_dim, n_kv = pos0 + n_tokens, kv_row = s.n_head_kv * D;
  // Sharper than N(0,1) scores so that a few keys dominate, as in trained models.
  const auto q = randn(n_tokens * s.n_head * D, seed, 2.0f);
  const auto k = random_rows(types.k, n_kv, kv_row, seed + 1), v = random_rows(types.v, n_kv, kv_row, seed + 2);
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
                  .sliding_window = window,
                  .k_type = types.k,
                  .v_type = types.v};
  cpu::attention(a, pool());

  Dev<float> dq(q), dout(ref.size());
  Dev<uint8_t> dk(k), dv(v);
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
                           std::to_string(pos0) + " window " + std::to_string(window) + name(types);
  EXPECT_TRUE(e.finite) << what;
  EXPECT_LT(e.max_abs, quantized(types) ? kQuantMaxAbs : kMaxAbs) << what << ": " << e;
  EXPECT_LT(e.rel_l2, quantized(types) ? kQuantRelL2 : kRelL2) << what << ": " << e;
}

const KvPair kQuantPairs[] = {{DType::Q8_0, DType::Q8_0},
                              {DType::Q4_0, DType::Q4_0},
                              {DType::Q8_0, DType::F16},
                              {DType::F16, DType::Q4_0},
                              {DType::Q4_0, DType::Q8_0}};

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
// Both forms: split over the GPU with a combine launch, and one_block (a block per KV head combining its
// warps itself). Within a form, every variant of the launch (early key stages, q8_1 out, the gate, q and
// gate interleaved) gives the plain launch's bits.
void check_batched_decode(KvPair types, const Shape& s = {16, 2, 256}) {
  const int64_t D = s.head_dim, kv_row = s.n_head_kv * D, n_ctx = 4096, n_slots = 4;
  const size_t k_row = row_bytes(types.k, kv_row), v_row = row_bytes(types.v, kv_row);
  // One buffer per side here, so slot s of K starts at s * n_ctx * k_row and of V at s * n_ctx * v_row;
  // the kernel takes one slot stride for both, so K and V get the larger row's stride.
  const size_t stride = n_ctx * std::max(k_row, v_row);
  std::vector<uint8_t> k(n_slots * stride), v(n_slots * stride);
  for (int64_t sl = 0; sl < n_slots; ++sl) {
    const auto ks = random_rows(types.k, n_ctx, kv_row, 50 + 2 * (uint32_t)sl);
    const auto vs = random_rows(types.v, n_ctx, kv_row, 51 + 2 * (uint32_t)sl);
    std::copy(ks.begin(), ks.end(), k.begin() + sl * stride);
    std::copy(vs.begin(), vs.end(), v.begin() + sl * stride);
  }
  const std::vector<int32_t> slots = {3, 0, 2};
  const int64_t n_seq = (int64_t)slots.size();
  const auto q = randn(n_seq * s.n_head * D, 52, 2.0f);
  auto reference = [&](const std::vector<int32_t>& pos) {
    std::vector<float> ref(n_seq * s.n_head * D);
    for (int64_t i = 0; i < n_seq; ++i) {
      const AttentionArgs a{.q = q.data() + i * s.n_head * D,
                            .k = k.data() + slots[i] * stride,
                            .v = v.data() + slots[i] * stride,
                            .out = ref.data() + i * s.n_head * D,
                            .pos = &pos[i],
                            .n_tokens = 1,
                            .n_head = s.n_head,
                            .n_head_kv = s.n_head_kv,
                            .head_dim = D,
                            .n_kv = pos[i] + 1,
                            .kq_scale = 1.0f / 16.0f,
                            .sliding_window = 0,
                            .k_type = types.k,
                            .v_type = types.v};
      cpu::attention(a, pool());
    }
    return ref;
  };
  Dev<float> dq(q), dout(n_seq * s.n_head * D);
  Dev<uint8_t> dk(k), dv(v);
  Dev<int32_t> dslots(slots), dpos(n_seq);
  const cuda::DecodeAttentionArgs b{.q = dq.get(),
                                    .k = dk.get(),
                                    .v = dv.get(),
                                    .slot_stride = (int64_t)stride,
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
                                    .min_keys_per_split = 64,
                                    .k_type = types.k,
                                    .v_type = types.v};
  Dev<char> ws(cuda::attention_decode_workspace_bytes(b));
  const int64_t K = s.n_head * D;
  const size_t qb = cuda::activation_bytes(cuda::ActFormat::q8_1, n_seq, K);
  const size_t used = cuda::Workspace::round((size_t)(n_seq * K)) + (size_t)(n_seq * (K / 32)) * 8;
  Dev<uint8_t> oq(qb), want(qb);
  auto q8 = [&](Dev<uint8_t>& d) {
    std::vector<uint8_t> v = d.download();
    v.resize(used);
    return v;
  };
  for (const bool one_block : {false, true})
    for (const std::vector<int32_t>& pos :
         {std::vector<int32_t>{4095, 0, 1777}, std::vector<int32_t>{5, 3000, 63},
          std::vector<int32_t>{63, 0, 17}}) {
      const std::string what = std::string(one_block ? " one block" : " split") + " heads " +
                               std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " D " +
                               std::to_string(D) + " at " + std::to_string(pos[0]) + name(types);
      cuda::DecodeAttentionArgs b1 = b;
      b1.one_block = one_block;
      dpos.upload(pos);
      dout.poison();
      cuda::attention_decode(b1, one_block ? nullptr : ws.get(), nullptr);  // one_block needs no workspace
      const auto got = dout.download();
      const Err e = compare(got, reference(pos));
      EXPECT_TRUE(e.finite) << what;
      EXPECT_LT(e.max_abs, quantized(types) ? kQuantMaxAbs : kMaxAbs) << what << ": " << e;
      EXPECT_LT(e.rel_l2, quantized(types) ? kQuantRelL2 : kRelL2) << what << ": " << e;
      cuda::attention_decode(b1, ws.get(), nullptr);
      EXPECT_EQ(dout.download(), got) << "deterministic" << what;
      // The output's q8_1 activations (for the output projection): the bits quantize_activations gives.
      oq.poison();
      cuda::DecodeAttentionArgs bq = b1;
      bq.out_q = reinterpret_cast<int8_t*>(oq.get());
      bq.out_ds = reinterpret_cast<float2*>(oq.get() + cuda::Workspace::round((size_t)(n_seq * K)));
      cuda::attention_decode(bq, ws.get(), nullptr);
      EXPECT_EQ(dout.download(), got) << what;
      cuda::quantize_activations(cuda::ActFormat::q8_1, dout.get(), K, n_seq, K, want.get(), nullptr);
      EXPECT_EQ(q8(oq), q8(want)) << what;
      // Qwen3.5's output gate applied as the output is written: the bits of mul_sigmoid on the ungated
      // output, and the q8_1 blocks of those.
      const auto gate = randn(n_seq * K, 53, 3.0f);
      Dev<float> dgate(gate), gated(got);
      cuda::mul_sigmoid(gated.get(), dgate.get(), n_seq * K, nullptr);
      cuda::DecodeAttentionArgs bg = bq;
      bg.gate = dgate.get();
      oq.poison();
      cuda::attention_decode(bg, ws.get(), nullptr);
      EXPECT_EQ(dout.download(), gated.download()) << "gated" << what;
      cuda::quantize_activations(cuda::ActFormat::q8_1, gated.get(), K, n_seq, K, want.get(), nullptr);
      EXPECT_EQ(q8(oq), q8(want)) << "gated" << what;
      // The same with q and the gate interleaved per head, as Qwen3.5's projection gives them: rows 2 D
      // apart.
      std::vector<float> qg((size_t)(n_seq * s.n_head * 2 * D));
      for (int64_t r = 0; r < n_seq * s.n_head; ++r) {
        std::copy(q.begin() + r * D, q.begin() + (r + 1) * D, qg.begin() + r * 2 * D);
        std::copy(gate.begin() + r * D, gate.begin() + (r + 1) * D, qg.begin() + r * 2 * D + D);
      }
      Dev<float> dqg(qg);
      cuda::DecodeAttentionArgs bs = bg;
      bs.q = dqg.get();
      bs.q_stride = 2 * D;
      bs.gate = dqg.get() + D;
      bs.gate_stride = 2 * D;
      dout.poison();
      cuda::attention_decode(bs, ws.get(), nullptr);
      EXPECT_EQ(dout.download(), gated.download()) << "interleaved" << what;
    }
}

// The fused prep's arguments: this step's k and v rows, the per-head norm weights, NeoX RoPE over n_rot
// dims (Qwen3's and Qwen3.5's constants).
cuda::DecodeAttentionArgs::QkPrep neox_prep(const Dev<float>& k, const Dev<float>& v,
                                            const Dev<float>& q_norm, const Dev<float>& k_norm,
                                            int64_t n_rot) {
  return {.k = k.get(),
          .v = v.get(),
          .q_norm = q_norm.get(),
          .k_norm = k_norm.get(),
          .n_rot = n_rot,
          .freq_base = 1e6f,
          .freq_scale = 1.0f,
          .eps = 1e-6f,
          .mode = RopeMode::neox};
}

// The q/k prep inside one_block's blocks (DecodeAttentionArgs::prep: q, k and v as projected; per-head
// norms, RoPE, the f16 K/V stores done by the attention) against qk_norm_rope_store_f16's launch and then
// the same attention: the same output bits and the same cache bytes; and the split form, which takes the
// prep as that launch, likewise. Several sequences in their slots;
// Qwen3's heads (2 a block, full NeoX rotation) and Qwen3.5's (1 a block, 64 of 256 dims rotated,
// q and gate interleaved).
void check_fused_prep(const Shape& s, int64_t n_rot, bool interleaved) {
  const int64_t D = s.head_dim, kv_row = s.n_head_kv * D, n_ctx = 1024, n_slots = 3;
  const int64_t qs = interleaved ? 2 * D : D;
  const size_t stride = n_ctx * row_bytes(DType::F16, kv_row);
  std::vector<uint8_t> cache(n_slots * stride);
  for (int64_t sl = 0; sl < n_slots; ++sl) {
    const auto r = random_rows(DType::F16, n_ctx, kv_row, 70 + (uint32_t)sl);
    std::copy(r.begin(), r.end(), cache.begin() + sl * stride);
  }
  const std::vector<int32_t> slots = {2, 0, 1};
  const int64_t n_seq = (int64_t)slots.size();
  const auto q = randn(n_seq * s.n_head * qs, 71, 2.0f), k = randn(n_seq * kv_row, 72, 2.0f),
             v = randn(n_seq * kv_row, 73), qw = randn(D, 74, 0.5f), kw = randn(D, 75, 0.5f);
  Dev<float> dk(k), dv(v), dqw(qw), dkw(kw), dout(n_seq * s.n_head * D);
  Dev<int32_t> dslots(slots), dpos(n_seq);
  const cuda::DecodeAttentionArgs::QkPrep prep = neox_prep(dk, dv, dqw, dkw, n_rot);
  for (const std::vector<int32_t>& pos :
       {std::vector<int32_t>{63, 0, 17}, std::vector<int32_t>{300, 5, 511}}) {
    dpos.upload(pos);
    // Outputs and caches of: the prep's own launch, then one_block; the prep inside one_block; the same two
    // with the split form.
    std::vector<float> out[4];
    std::vector<uint8_t> kc[4], vc[4];
    for (int variant = 0; variant < 4; ++variant) {
      const bool fused = variant % 2, one_block = variant < 2;
      Dev<float> dq(q);
      Dev<uint8_t> dkc(cache), dvc(cache);
      if (!fused)
        cuda::qk_norm_rope_store_f16(dq.get(), dk.get(), dv.get(), dqw.get(), dkw.get(), dpos.get(), n_seq,
                                     s.n_head, s.n_head_kv, D, n_rot, prep.freq_base, prep.freq_scale,
                                     prep.mode, prep.eps, reinterpret_cast<uint16_t*>(dkc.get()),
                                     reinterpret_cast<uint16_t*>(dvc.get()), (int64_t)stride / 2,
                                     dslots.get(), nullptr, qs);
      const cuda::DecodeAttentionArgs a{.q = dq.get(),
                                        .k = dkc.get(),
                                        .v = dvc.get(),
                                        .slot_stride = (int64_t)stride,
                                        .slots = dslots.get(),
                                        .pos = dpos.get(),
                                        .out = dout.get(),
                                        .n_seq = n_seq,
                                        .n_head = s.n_head,
                                        .n_head_kv = s.n_head_kv,
                                        .head_dim = D,
                                        .max_kv = n_ctx,
                                        .kq_scale = 1.0f / 16.0f,
                                        .q_stride = qs,
                                        .one_block = one_block,
                                        .prep = fused ? &prep : nullptr};
      Dev<char> ws(std::max<size_t>(cuda::attention_decode_workspace_bytes(a), 1));
      dout.poison();
      cuda::attention_decode(a, ws.get(), nullptr);
      out[variant] = dout.download(), kc[variant] = dkc.download(), vc[variant] = dvc.download();
    }
    const std::string what = " heads " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                             " D " + std::to_string(D) + " at " + std::to_string(pos[0]);
    EXPECT_EQ(out[1], out[0]) << "fused prep" << what;
    EXPECT_EQ(kc[1], kc[0]) << "fused prep, K cache" << what;
    EXPECT_EQ(vc[1], vc[0]) << "fused prep, V cache" << what;
    EXPECT_NE(kc[0], cache) << "the prep stored nothing" << what;
    EXPECT_EQ(out[3], out[2]) << "split form, prep" << what;
    EXPECT_EQ(kc[3], kc[2]) << "split form, prep, K cache" << what;
    EXPECT_EQ(vc[3], vc[2]) << "split form, prep, V cache" << what;
  }
}

TEST(CudaAttention, FusedPrepMatchesItsLaunch) {
  XPERT_OPS_REQUIRE_GPU();
  check_fused_prep({32, 4, 128}, 128, false);  // Qwen3
  check_fused_prep({16, 2, 256}, 64, true);    // Qwen3.5
}

// The attention with its output projection in one launch (DecodeAttentionArgs::Proj: one_block with the
// fused prep, then each block's rows of W over its 4 query heads' columns, parts summed by sum_parts)
// against the same attention then the decode product over its q8_1 output: the same cache bytes and, the
// products' sums being in another order, the same projection within float rounding. Qwen3's heads (32 / 4
// at 128), other counts of KV heads and 4 query heads a KV head, with and without a sliding window, at
// depths 0 to 900; a shape it does not take is said so by attention_decode_proj_fits.
void check_proj(int64_t group, int64_t n_head_kv, int64_t n_out, int32_t window = 0) {
  const Shape s{group * n_head_kv, n_head_kv, 128};
  const int64_t D = s.head_dim, kv_row = s.n_head_kv * D, n_ctx = 1024, k_in = s.n_head * D;
  const size_t stride = n_ctx * row_bytes(DType::F16, kv_row);
  const auto cache = random_rows(DType::F16, n_ctx, kv_row, 80);
  const auto q = randn(s.n_head * D, 81, 2.0f), k = randn(kv_row, 82, 2.0f), v = randn(kv_row, 83),
             qw = randn(D, 84, 0.5f), kw = randn(D, 85, 0.5f);
  const std::vector<uint8_t> w = cudatest::random_weights(DType::Q4_K, n_out, k_in, 86);
  const int64_t n_parts = cuda::attention_decode_proj_parts(s.n_head);
  Dev<float> dk(k), dv(v), dqw(qw), dkw(kw), datt(k_in), dy(n_out), dparts(n_parts * n_out);
  Dev<uint8_t> dw(w);
  Dev<int32_t> dpos(1);
  const cuda::DecodeAttentionArgs::QkPrep prep = neox_prep(dk, dv, dqw, dkw, D);
  const cuda::DecodeAttentionArgs::Proj proj{
      .w = dw.get(), .type = DType::Q4_K, .n_out = n_out, .parts = dparts.get()};
  for (const int32_t pos : {0, 1, 63, 200, 900}) {
    dpos.upload(std::vector<int32_t>{pos});
    std::vector<float> y[2];
    std::vector<uint8_t> kc[2], vc[2];
    for (int fused = 0; fused < 2; ++fused) {
      Dev<float> dq(q);
      Dev<uint8_t> dkc(cache), dvc(cache);
      cuda::DecodeAttentionArgs a{.q = dq.get(),
                                  .k = dkc.get(),
                                  .v = dvc.get(),
                                  .slot_stride = (int64_t)stride,
                                  .slots = nullptr,
                                  .pos = dpos.get(),
                                  .out = datt.get(),
                                  .n_seq = 1,
                                  .n_head = s.n_head,
                                  .n_head_kv = s.n_head_kv,
                                  .head_dim = D,
                                  .max_kv = n_ctx,
                                  .kq_scale = 1.0f / 16.0f,
                                  .sliding_window = window,
                                  .one_block = true,
                                  .prep = &prep};
      dy.poison();
      if (fused) {
        a.proj = &proj;
        ASSERT_TRUE(cuda::attention_decode_proj_fits(a));
        dparts.poison();
        cuda::attention_decode(a, nullptr, nullptr);
        cuda::sum_parts(dparts.get(), (int)n_parts, n_out, dy.get(), nullptr);
      } else {
        // The model's path: the combine's q8_1 blocks, then the decode product over them.
        Dev<int8_t> aq(k_in);
        Dev<float> ads(k_in / 16);
        a.out_q = aq.get(), a.out_ds = reinterpret_cast<float2*>(ads.get());
        cuda::attention_decode(a, nullptr, nullptr);
        const cuda::Activations act{
            .format = cuda::ActFormat::q8_1, .data = aq.get(), .aux = ads.get(), .m = 1, .k = k_in};
        cuda::matmul_prepared(DType::Q4_K, dw.get(), n_out, act, dy.get(), n_out, nullptr);
      }
      y[fused] = dy.download(), kc[fused] = dkc.download(), vc[fused] = dvc.download();
    }
    const std::string what = " window " + std::to_string(window) + " heads " + std::to_string(s.n_head) +
                             "/" + std::to_string(n_head_kv) + " rows " + std::to_string(n_out) + " at " +
                             std::to_string(pos);
    EXPECT_EQ(kc[1], kc[0]) << "K cache" << what;
    EXPECT_EQ(vc[1], vc[0]) << "V cache" << what;
    const Err e = compare(y[1], y[0]);
    double scale = 0.0;
    for (float x : y[0]) scale = std::max(scale, (double)std::fabs(x));
    EXPECT_TRUE(e.finite) << what;
    EXPECT_GT(scale, 0.1) << what;
    EXPECT_LT(e.max_abs, 1e-5 * scale) << what << ": " << e;
    EXPECT_LT(e.rel_l2, 1e-6) << what << ": " << e;
  }
}

TEST(CudaAttention, ProjectionInsideMatchesAttentionThenMatmul) {
  XPERT_OPS_REQUIRE_GPU();
  check_proj(8, 4, 2048);  // Qwen3-30B-A3B
  check_proj(8, 1, 128);
  check_proj(8, 8, 4096);
  check_proj(4, 4, 2048);
  check_proj(8, 4, 2048, 100);  // a sliding window: the one-block form's key ranges
  // What it does not take: another head_dim, 2 query heads a KV head, a row count off the blocks' 128.
  Dev<int32_t> dpos(1);
  cuda::DecodeAttentionArgs::QkPrep prep{};
  prep.n_rot = 128;
  const cuda::DecodeAttentionArgs::Proj proj{
      .w = dpos.get(), .type = DType::Q4_K, .n_out = 2048, .parts = reinterpret_cast<float*>(dpos.get())};
  cuda::DecodeAttentionArgs a{};
  a.pos = dpos.get(), a.n_seq = 1, a.n_head = 32, a.n_head_kv = 4, a.head_dim = 128, a.max_kv = 64;
  a.one_block = true, a.prep = &prep, a.proj = &proj;
  EXPECT_TRUE(cuda::attention_decode_proj_fits(a));
  a.head_dim = 256;
  EXPECT_FALSE(cuda::attention_decode_proj_fits(a));
  a.head_dim = 128, a.n_head_kv = 16;
  EXPECT_FALSE(cuda::attention_decode_proj_fits(a));
  a.n_head_kv = 4;
  const cuda::DecodeAttentionArgs::Proj odd{.w = dpos.get(),
                                            .type = DType::Q4_K,
                                            .n_out = 2048 + 64,
                                            .parts = reinterpret_cast<float*>(dpos.get())};
  a.proj = &odd;
  EXPECT_FALSE(cuda::attention_decode_proj_fits(a));
  a.proj = &proj;
  EXPECT_THROW(cuda::attention_decode(
                   [&] {
                     auto b = a;
                     b.head_dim = 256;
                     return b;
                   }(),
                   nullptr, nullptr),
               Error);
}

TEST(CudaAttention, BatchedDecodeMatchesCpu) {
  XPERT_OPS_REQUIRE_GPU();
  check_batched_decode({});                // Qwen3.5
  check_batched_decode({}, {32, 4, 128});  // Qwen3
  check_batched_decode({}, {24, 2, 128});  // group 12: two head chunks, the second 4 heads
  check_batched_decode({}, {8, 1, 64});    // head_dim 64
}

// Issue #10: q8_0 / q4_0 caches (and mixed pairs) through every kernel: flash prefill, split-K decode,
// batched decode, the plain kernel.
TEST(CudaAttention, QuantizedCacheMatchesCpu) {
  XPERT_OPS_REQUIRE_GPU();
  uint32_t seed = 100;
  for (const KvPair& t : kQuantPairs) {
    check_sequence({32, 4, 128}, 100, 0, 0, seed += 3, false, t);    // prefill
    check_sequence({16, 2, 256}, 77, 3000, 0, seed += 3, false, t);  // a later chunk at depth
    check_sequence({12, 4, 64}, 130, 50, 0, seed += 3, false, t);    // head_dim 64, partial row block
    check_sequence({8, 1, 256}, 96, 700, 512, seed += 3, false, t);  // sliding window
    for (int64_t n_kv : {1, 17, 4096}) {
      check_sequence({16, 2, 256}, 1, n_kv - 1, 0, seed += 3, false, t);  // decode
      check_sequence({32, 4, 128}, 1, n_kv - 1, 0, seed += 3, false, t);
    }
    check_sequence({8, 1, 64}, 1, 3000, 0, seed += 3, false, t);
    check_sequence({4, 2, 96}, 9, 20, 0, seed += 3, false, t);                  // plain kernel (head_dim 96)
    check_sequence({16, 2, 256}, 33, 500, 0, seed += 3, /*simple=*/true, t);  // plain kernel forced
    check_batched_decode(t);
  }
}

// The store kernel writes quant's reference quantizer's bytes, whether rows are contiguous or scattered to
// (slot, position) on the device; rows with ties of opposite sign and all-zero rows included.
TEST(CudaAttention, StoreKvMatchesReferenceQuantizer) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t row = 2 * 256, T = 7, n_ctx = 16, n_slots = 3;
  auto x = randn(T * row, 77, 3.0f);
  for (int64_t i = 0; i < row; ++i) x[2 * row + i] = 0.0f;  // token 2: zeros (d = 0)
  x[4 * row + 3] = 5.0f, x[4 * row + 9] = -5.0f;             // token 4: a tie of opposite signs
  x[5 * row + 40] = -7.5f, x[5 * row + 33] = 7.5f;
  const std::vector<int32_t> slots = {2, 0, 1, 2, 0, 1, 2}, pos = {0, 5, 15, 3, 9, 0, 14};
  Dev<float> dx(x);
  Dev<int32_t> dslots(slots), dpos(pos);
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::F16}) {
    const size_t rb = row_bytes(t, row), stride = n_ctx * rb;
    std::vector<uint8_t> ref(T * rb);
    quantize_row(t, x.data(), ref.data(), T * row);
    Dev<uint8_t> flat(T * rb);
    cuda::store_kv(dx.get(), T, row, t, flat.get(), 0, nullptr, nullptr, nullptr);
    EXPECT_EQ(flat.download(), ref) << kv_type_name(t) << " contiguous";
    std::vector<uint8_t> zero(n_slots * stride, 0);
    Dev<uint8_t> cache(zero);
    cuda::store_kv(dx.get(), T, row, t, cache.get(), (int64_t)stride, dslots.get(), dpos.get(), nullptr);
    const auto got = cache.download();
    for (int64_t i = 0; i < T; ++i)
      EXPECT_TRUE(std::equal(ref.begin() + i * rb, ref.begin() + (i + 1) * rb,
                             got.begin() + slots[i] * stride + pos[i] * rb))
          << kv_type_name(t) << " token " << i;
  }
}

}  // namespace
}  // namespace xpert::cudaops_test
