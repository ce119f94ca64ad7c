// CUDA Gated DeltaNet against the CPU (backend/gated_delta_net.h) on Qwen3.5-35B-A3B's shapes (16 key heads,
// 32 value heads, head dims 128, d_conv 4): the causal conv with its carried state, the L2 norms, the
// recurrent and chunked delta rule (each against the CPU's same form and against each other, states
// carried across calls) and the whole mixer. All f32: differences are float rounding in another summation
// order, well under 1e-4 of the values' size.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/matmul.h"
#include "base/thread_pool.h"
#include "cuda_ops_test_util.h"
#include "backend/cpu/gated_delta_net.h"

namespace xpert::cudaops_test {
namespace {
using namespace xpert::cpu;  // the reference kernels

ThreadPool& pool() {
  static ThreadPool p(ThreadPool::default_threads());
  return p;
}

const GdnShape kQwen35{.d_conv = 4, .n_k_heads = 16, .n_v_heads = 32, .head_k_dim = 128, .head_v_dim = 128};

struct Inputs {
  std::vector<float> q, k, v, g, beta;
};

// As the model makes them: q, k L2-normalized per head; decays of -0.02 to -0.15 a token, as a trained
// model's, except every fourth head's, which are mostly near 0 with some strong ones. Slow decays carry the
// state from chunk to chunk, so an error in one chunk's state update shows in the next (fast ones erased it
// within a chunk).
Inputs random_inputs(const GdnShape& s, int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  Inputs in;
  in.q = randn(T * s.key_dim(), seed + 1);
  in.k = randn(T * s.key_dim(), seed + 2);
  in.v = randn(T * s.value_dim(), seed + 3);
  in.g.resize(T * s.n_v_heads);
  in.beta.resize(T * s.n_v_heads);
  for (size_t i = 0; i < in.g.size(); ++i)
    in.g[i] = i % s.n_v_heads % 4 == 3
                  ? -std::log1p(std::exp(n01(rng) * 2.0f - 1.0f)) * (0.1f + 4.0f * u01(rng) * u01(rng))
                  : -(0.02f + 0.13f * u01(rng));
  for (auto& x : in.beta) x = 1.0f / (1.0f + std::exp(-n01(rng)));
  l2_norm_rows(in.q.data(), T * s.n_k_heads, s.head_k_dim, 1e-6f);
  l2_norm_rows(in.k.data(), T * s.n_k_heads, s.head_k_dim, 1e-6f);
  return in;
}

struct DevInputs {
  Dev<float> q, k, v, g, beta;
  explicit DevInputs(const Inputs& in) : q(in.q), k(in.k), v(in.v), g(in.g), beta(in.beta) {}
};

template <class In>
DeltaRuleArgs args_at(const GdnShape& s, const In& q, const In& k, const In& v, const In& g, const In& beta,
                      int64_t t0, int64_t n, float* state, float* out) {
  return {.q = q + t0 * s.key_dim(),
          .k = k + t0 * s.key_dim(),
          .v = v + t0 * s.value_dim(),
          .g = g + t0 * s.n_v_heads,
          .beta = beta + t0 * s.n_v_heads,
          .state = state,
          .out = out + t0 * s.value_dim(),
          .n_tokens = n};
}
DeltaRuleArgs host_args(const GdnShape& s, const Inputs& in, int64_t t0, int64_t n, float* state, float* out) {
  return args_at(s, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), t0, n, state, out);
}
DeltaRuleArgs dev_args(const GdnShape& s, const DevInputs& in, int64_t t0, int64_t n, float* state, float* out) {
  return args_at<const float*>(s, in.q.get(), in.k.get(), in.v.get(), in.g.get(), in.beta.get(), t0, n, state,
                               out);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rel, const std::string& what) {
  const Err e = compare(got, ref);
  EXPECT_TRUE(e.finite) << what;
  EXPECT_LT(e.max_abs, rel * std::max(1.0, e.ref_max)) << what << ": " << e;
}

TEST(CudaGdn, ConvCarriesState) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t C = kQwen35.conv_dim(), K = kQwen35.d_conv;
  for (int64_t T : {1, 7, 64, 200}) {
    const auto x = randn(T * C, 1 + (uint32_t)T), w = randn(C * K, 2), s0 = randn((K - 1) * C, 3);
    const int64_t split = T / 3;  // two calls, the first possibly empty or shorter than the state
    std::vector<float> st = s0, out(T * C);
    if (split > 0) causal_conv1d_silu(x.data(), split, C, w.data(), K, st.data(), out.data());
    causal_conv1d_silu(x.data() + split * C, T - split, C, w.data(), K, st.data(), out.data() + split * C);

    Dev<float> dx(x), dw(w), dst(s0), dout(T * C);
    dout.poison();
    if (split > 0) cuda::causal_conv1d_silu(dx.get(), split, C, dw.get(), K, dst.get(), dout.get(), nullptr);
    cuda::causal_conv1d_silu(dx.get() + split * C, T - split, C, dw.get(), K, dst.get(), dout.get() + split * C,
                             nullptr);
    expect_close(dout.download(), out, 1e-6, "conv T=" + std::to_string(T));
    EXPECT_EQ(dst.download(), st) << "conv state T=" << T;
  }
}

TEST(CudaGdn, L2NormHeads) {
  XPERT_OPS_REQUIRE_GPU();
  const GdnShape& s = kQwen35;
  const int64_t T = 7, CD = s.conv_dim();
  auto x = randn(T * CD, 4, 2.0f);
  Dev<float> dx(x);
  for (int64_t t = 0; t < T; ++t) l2_norm_rows(x.data() + t * CD, 2 * s.n_k_heads, s.head_k_dim, s.eps);
  cuda::l2_norm_heads(dx.get(), T, 2 * s.n_k_heads, s.head_k_dim, CD, s.eps, nullptr);
  expect_close(dx.download(), x, 1e-6, "l2 norm");  // v channels untouched on both sides
}

// The one-token prelude (conv, its state's shift, the q/k l2 norms, the gates in one launch) gives the bits
// of the four separate launches: Qwen3.5's shapes, and head dims of 64 / 256 with 2 and 8 conv taps.
TEST(CudaGdn, DecodePreludeMatchesSeparateLaunches) {
  XPERT_OPS_REQUIRE_GPU();
  for (const GdnShape& s :
       {kQwen35, GdnShape{.d_conv = 2, .n_k_heads = 2, .n_v_heads = 4, .head_k_dim = 64, .head_v_dim = 256},
        GdnShape{.d_conv = 8, .n_k_heads = 3, .n_v_heads = 3, .head_k_dim = 256, .head_v_dim = 32}}) {
    ASSERT_TRUE(cuda::gdn_decode_prelude_fusable(s));
    const int64_t C = s.conv_dim(), Hv = s.n_v_heads;
    const auto x = randn(C, 11), w = randn(C * s.d_conv, 12, 0.5f), st0 = randn(s.conv_state_size(), 13),
               alpha = randn(Hv, 14, 4.0f), beta = randn(Hv, 15), dt = randn(Hv, 16, 4.0f), a = randn(Hv, 17);
    Dev<float> dx(x), dw(w), dalpha(alpha), dbeta(beta), ddt(dt), da(a);
    Dev<float> st_a(st0), out_a(C), g_a(Hv), b_a(Hv), st_b(st0), out_b(C), g_b(Hv), b_b(Hv);
    cuda::causal_conv1d_silu(dx.get(), 1, C, dw.get(), s.d_conv, st_a.get(), out_a.get(), nullptr);
    cuda::l2_norm_heads(out_a.get(), 1, 2 * s.n_k_heads, s.head_k_dim, C, s.eps, nullptr);
    cuda::gdn_gates(dalpha.get(), dbeta.get(), ddt.get(), da.get(), g_a.get(), b_a.get(), 1, Hv, nullptr);
    const GdnLayerParams p{.conv1d = dw.get(), .dt_bias = ddt.get(), .a = da.get(), .norm = nullptr};
    const GdnLayerInputs in{
        .qkv = dx.get(), .z = nullptr, .alpha = dalpha.get(), .beta = dbeta.get(), .n_tokens = 1};
    cuda::gdn_decode_prelude(s, p, in, st_b.get(), out_b.get(), g_b.get(), b_b.get(), nullptr);
    const std::string what = "head dims " + std::to_string(s.head_k_dim) + "/" + std::to_string(s.head_v_dim);
    EXPECT_EQ(out_b.download(), out_a.download()) << what;
    EXPECT_EQ(st_b.download(), st_a.download()) << what << ": conv state";
    EXPECT_EQ(g_b.download(), g_a.download()) << what << ": g";
    EXPECT_EQ(b_b.download(), b_a.download()) << what << ": beta";
  }
}

// The gated norm's q8_1 output (taken by the output projection) is what quantize_activations makes of its
// float output, and the float output is unchanged by asking for it.
TEST(CudaGdn, GatedNormWritesItsQ8_1) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t rows = 32, n = 128, K = rows * n;  // one token of Qwen3.5: 32 value heads of 128
  const auto x = randn(K, 21, 2.0f), z = randn(K, 22), w = randn(n, 23);
  Dev<float> xa(x), xb(x), dz(z), dw(w);
  const size_t qb = cuda::activation_bytes(cuda::ActFormat::q8_1, 1, K);
  Dev<uint8_t> got(qb), want(qb);
  auto* q = reinterpret_cast<int8_t*>(got.get());
  auto* ds = reinterpret_cast<float2*>(got.get() + cuda::Workspace::round((size_t)K));
  cuda::gated_rmsnorm_silu(xa.get(), dz.get(), dw.get(), rows, n, 1e-6f, nullptr);
  cuda::gated_rmsnorm_silu(xb.get(), dz.get(), dw.get(), rows, n, 1e-6f, nullptr, q, ds);
  EXPECT_EQ(xb.download(), xa.download());
  cuda::quantize_activations(cuda::ActFormat::q8_1, xa.get(), K, 1, K, want.get(), nullptr);
  std::vector<uint8_t> g = got.download(), r = want.download();
  const size_t used = cuda::Workspace::round((size_t)K) + (size_t)(K / 32) * 8;
  g.resize(used), r.resize(used);
  EXPECT_EQ(g, r);
}

// Many streams' decode step: gated_delta_net_rows over sequences whose states lie in shuffled slots gives
// each row the bits (output, its q8_1, both states) of gated_delta_net on that row alone. 70 rows: two
// launches of kGdnRowsPerLaunch and the rest; head_v_dim 256 does not fold the gated norm in (row by row).
TEST(CudaGdn, RowsMatchEachRowAlone) {
  XPERT_OPS_REQUIRE_GPU();
  for (const auto& [s, n] :
       {std::pair{kQwen35, (int64_t)70}, std::pair{kQwen35, (int64_t)3},
        std::pair{GdnShape{.d_conv = 4, .n_k_heads = 2, .n_v_heads = 4, .head_k_dim = 64, .head_v_dim = 256},
                  (int64_t)5}}) {
    const int64_t CD = s.conv_dim(), VD = s.value_dim(), Hv = s.n_v_heads;
    const int64_t slot = s.conv_state_size() + s.ssm_state_size(), n_slots = n + 3;
    const auto qkv = randn(n * CD, 31), z = randn(n * VD, 32), alpha = randn(n * Hv, 33, 4.0f),
               beta = randn(n * Hv, 34), w = randn(CD * s.d_conv, 35, 0.5f), dt = randn(Hv, 36, 4.0f),
               a = randn(Hv, 37), norm = randn(s.head_v_dim, 38), st0 = randn(n_slots * slot, 39, 0.3f);
    Dev<float> dqkv(qkv), dz(z), dalpha(alpha), dbeta(beta), dw(w), ddt(dt), da(a), dnorm(norm);
    Dev<float> st_rows(st0), st_alone(st0), out_rows(n * VD), out_alone(n * VD);
    const size_t qb = cuda::activation_bytes(cuda::ActFormat::q8_1, n, VD);
    Dev<uint8_t> q_rows(qb), q_alone(qb);
    const size_t q_off = cuda::Workspace::round((size_t)(n * VD));
    const auto q_of = [&](Dev<uint8_t>& d) { return reinterpret_cast<int8_t*>(d.get()); };
    const auto ds_of = [&](Dev<uint8_t>& d) { return reinterpret_cast<float2*>(d.get() + q_off); };
    Dev<uint8_t> ws(cuda::gated_delta_net_workspace_bytes(s, n));
    const GdnLayerParams p{.conv1d = dw.get(), .dt_bias = ddt.get(), .a = da.get(), .norm = dnorm.get()};
    std::vector<int64_t> slot_of(n);  // row r's slot: (7 r + 2) mod n_slots, all different
    for (int64_t r = 0; r < n; ++r) slot_of[r] = (7 * r + 2) % n_slots;
    std::vector<GdnSlotState> states;
    for (int64_t r = 0; r < n; ++r) {
      float* base = st_rows.get() + slot_of[r] * slot;
      states.push_back({base, base + s.conv_state_size()});
    }
    const GdnLayerInputs in{
        .qkv = dqkv.get(), .z = dz.get(), .alpha = dalpha.get(), .beta = dbeta.get(), .n_tokens = n};
    cuda::gated_delta_net_rows(s, p, in, states, out_rows.get(), ws.get(), nullptr, q_of(q_rows),
                               ds_of(q_rows));
    for (int64_t r = 0; r < n; ++r) {
      const GdnLayerInputs row{.qkv = dqkv.get() + r * CD,
                               .z = dz.get() + r * VD,
                               .alpha = dalpha.get() + r * Hv,
                               .beta = dbeta.get() + r * Hv,
                               .n_tokens = 1};
      float* base = st_alone.get() + slot_of[r] * slot;
      cuda::gated_delta_net(s, p, row, base, base + s.conv_state_size(), out_alone.get() + r * VD, ws.get(),
                            nullptr, DeltaRuleForm::automatic, q_of(q_alone) + r * VD,
                            ds_of(q_alone) + r * VD / 32);
    }
    const std::string what = std::to_string(n) + " rows, head_v_dim " + std::to_string(s.head_v_dim);
    EXPECT_EQ(out_rows.download(), out_alone.download()) << what;
    EXPECT_EQ(st_rows.download(), st_alone.download()) << what << ": states";
    std::vector<uint8_t> qr = q_rows.download(), qa = q_alone.download();
    const size_t used = q_off + (size_t)(n * VD / 32) * sizeof(float2);
    qr.resize(used), qa.resize(used);
    EXPECT_EQ(qr, qa) << what << ": q8_1";
  }
}

class CudaDeltaRule : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaDeltaRule, FormsMatchCpuAndEachOther) {
  XPERT_OPS_REQUIRE_GPU();
  const GdnShape& s = kQwen35;
  const int64_t T = GetParam();
  const Inputs in = random_inputs(s, T, 100 + (uint32_t)T);
  const auto s0 = randn(s.ssm_state_size(), 5, 0.3f);  // a state left by an earlier prompt

  std::vector<float> st_r = s0, st_c = s0, out_r(T * s.value_dim()), out_c(T * s.value_dim());
  delta_rule_recurrent(s, host_args(s, in, 0, T, st_r.data(), out_r.data()), pool());
  delta_rule_chunked(s, host_args(s, in, 0, T, st_c.data(), out_c.data()), pool());

  const DevInputs din(in);
  Dev<float> dst_r(s0), dst_c(s0), dout_r(T * s.value_dim()), dout_c(T * s.value_dim());
  Dev<char> ws(cuda::delta_rule_chunked_workspace_bytes(s, T));
  dout_r.poison();
  dout_c.poison();
  cuda::delta_rule_recurrent(s, dev_args(s, din, 0, T, dst_r.get(), dout_r.get()), nullptr);
  cuda::delta_rule_chunked(s, dev_args(s, din, 0, T, dst_c.get(), dout_c.get()), ws.get(), nullptr);
  const auto gr = dout_r.download(), gc = dout_c.download(), gsr = dst_r.download(), gsc = dst_c.download();

  const std::string at = " T=" + std::to_string(T);
  expect_close(gr, out_r, 5e-5, "recurrent out" + at);
  expect_close(gsr, st_r, 5e-5, "recurrent state" + at);
  expect_close(gc, out_c, 5e-5, "chunked out" + at);
  expect_close(gsc, st_c, 5e-5, "chunked state" + at);
  expect_close(gc, gr, 5e-5, "chunked vs recurrent out" + at);
  expect_close(gsc, gsr, 5e-5, "chunked vs recurrent state" + at);
}

INSTANTIATE_TEST_SUITE_P(Qwen35, CudaDeltaRule, ::testing::Values(1, 7, 64, 200),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

// Other head sizes: 64 takes the chunked kernels' second instantiation, 32 falls back to the recurrent one.
TEST(CudaGdn, DeltaRuleOtherHeadSizes) {
  XPERT_OPS_REQUIRE_GPU();
  for (int64_t dim : {64, 32}) {
    const GdnShape s{.n_k_heads = 2, .n_v_heads = 4, .head_k_dim = dim, .head_v_dim = dim};
    const int64_t T = 130;
    const Inputs in = random_inputs(s, T, 500 + (uint32_t)dim);
    const auto s0 = randn(s.ssm_state_size(), 6, 0.3f);
    std::vector<float> st = s0, out(T * s.value_dim());
    delta_rule_chunked(s, host_args(s, in, 0, T, st.data(), out.data()), pool());
    const DevInputs din(in);
    Dev<float> dst(s0), dout(T * s.value_dim());
    Dev<char> ws(std::max<size_t>(cuda::delta_rule_chunked_workspace_bytes(s, T), 1));
    dout.poison();
    cuda::delta_rule_chunked(s, dev_args(s, din, 0, T, dst.get(), dout.get()), ws.get(), nullptr);
    expect_close(dout.download(), out, 5e-5, "out dim " + std::to_string(dim));
    expect_close(dst.download(), st, 5e-5, "state dim " + std::to_string(dim));
  }
}

// Prefill 100 then 37 more == 137 at once == 137 single recurrent steps, on the GPU.
TEST(CudaGdn, DeltaRuleStateCarriesAcrossCalls) {
  XPERT_OPS_REQUIRE_GPU();
  const GdnShape& s = kQwen35;
  const int64_t T = 137;
  const Inputs in = random_inputs(s, T, 77);
  const DevInputs din(in);
  const size_t n_out = T * s.value_dim();
  Dev<float> st_all(s.ssm_state_size()), st_split(s.ssm_state_size()), st_one(s.ssm_state_size());
  for (auto* st : {&st_all, &st_split, &st_one}) XPERT_CUDA_CHECK(cudaMemset(st->get(), 0, st->size() * 4));
  Dev<float> out_all(n_out), out_split(n_out), out_one(n_out);
  Dev<char> ws(cuda::delta_rule_chunked_workspace_bytes(s, T));
  cuda::delta_rule_chunked(s, dev_args(s, din, 0, T, st_all.get(), out_all.get()), ws.get(), nullptr);
  cuda::delta_rule_chunked(s, dev_args(s, din, 0, 100, st_split.get(), out_split.get()), ws.get(), nullptr);
  cuda::delta_rule_chunked(s, dev_args(s, din, 100, 37, st_split.get(), out_split.get()), ws.get(), nullptr);
  for (int64_t t = 0; t < T; ++t)
    cuda::delta_rule_recurrent(s, dev_args(s, din, t, 1, st_one.get(), out_one.get()), nullptr);
  const auto ref = out_all.download(), ref_st = st_all.download();
  expect_close(out_split.download(), ref, 5e-5, "split");
  expect_close(out_one.download(), ref, 5e-5, "token by token");
  expect_close(st_split.download(), ref_st, 5e-5, "split state");
  expect_close(st_one.download(), ref_st, 5e-5, "token-by-token state");
}

class CudaGatedDeltaNet : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaGatedDeltaNet, MixerMatchesCpu) {
  XPERT_OPS_REQUIRE_GPU();
  const GdnShape& s = kQwen35;
  const int64_t T = GetParam(), CD = s.conv_dim(), VD = s.value_dim(), Hv = s.n_v_heads;
  const uint32_t seed = 300 + (uint32_t)T;
  const auto qkv = randn(T * CD, seed), z = randn(T * VD, seed + 1), alpha = randn(T * Hv, seed + 2),
             beta = randn(T * Hv, seed + 3), conv1d = randn(CD * s.d_conv, seed + 4, 0.5f),
             dt_bias = randn(Hv, seed + 5), norm = randn(s.head_v_dim, seed + 6, 0.2f);
  std::vector<float> a(Hv);
  // Slow decays (g = a softplus(alpha + dt_bias), about -0.02 to -0.3) but every fourth head's fast: see
  // random_inputs.
  for (int64_t h = 0; h < Hv; ++h)
    a[h] = h % 4 == 3 ? -std::exp(0.5f * (float)(h % 5) - 1.0f) : -0.03f * (1 + h % 5);
  const auto conv0 = randn(s.conv_state_size(), seed + 7), ssm0 = randn(s.ssm_state_size(), seed + 8, 0.3f);

  std::vector<float> conv_st = conv0, ssm_st = ssm0, out(T * VD);
  GdnScratch scratch;
  const GdnLayerParams p{.conv1d = conv1d.data(), .dt_bias = dt_bias.data(), .a = a.data(), .norm = norm.data()};
  const GdnLayerInputs in{
      .qkv = qkv.data(), .z = z.data(), .alpha = alpha.data(), .beta = beta.data(), .n_tokens = T};
  gated_delta_net(s, p, in, conv_st.data(), ssm_st.data(), out.data(), scratch, pool());

  Dev<float> dqkv(qkv), dz(z), dalpha(alpha), dbeta(beta), dconv1d(conv1d), ddt(dt_bias), da(a), dnorm(norm);
  for (DeltaRuleForm form : {DeltaRuleForm::automatic, DeltaRuleForm::recurrent}) {
    Dev<float> dconv(conv0), dssm(ssm0), dout(T * VD);
    Dev<char> ws(cuda::gated_delta_net_workspace_bytes(s, T));
    dout.poison();
    const GdnLayerParams dp{.conv1d = dconv1d.get(), .dt_bias = ddt.get(), .a = da.get(), .norm = dnorm.get()};
    const GdnLayerInputs din{
        .qkv = dqkv.get(), .z = dz.get(), .alpha = dalpha.get(), .beta = dbeta.get(), .n_tokens = T};
    cuda::gated_delta_net(s, dp, din, dconv.get(), dssm.get(), dout.get(), ws.get(), nullptr, form);
    const std::string at = std::string(form == DeltaRuleForm::recurrent ? " recurrent" : " automatic") +
                           " T=" + std::to_string(T);
    expect_close(dout.download(), out, 1e-4, "mixer out" + at);
    expect_close(dconv.download(), conv_st, 1e-6, "conv state" + at);
    expect_close(dssm.download(), ssm_st, 5e-5, "ssm state" + at);
  }
}

INSTANTIATE_TEST_SUITE_P(Qwen35, CudaGatedDeltaNet, ::testing::Values(1, 7, 64, 200),
                         [](const auto& info) { return "T" + std::to_string(info.param); });

}  // namespace
}  // namespace xpert::cudaops_test
