// CUDA MoE: routing against route_top_k, and the experts (decode and grouped paths) against
// moe_ffn_reference on qwen3-30b-a3b shapes (n_embd 2048, n_ff_exp 768, top 8; 16 experts instead of 128
// to keep the test small), plus experts that are not resident on the GPU (skipped, then added by the
// caller with accumulate, as the heterogeneous executor does).
// Tolerance: the GPU rounds X and the SwiGLU output to q8_1 (32-blocks) or f16 where the reference uses
// Q8_K (256-blocks), about 0.5 % per product on random data; each token's output must be within 3 % (norm)
// of the reference. A wrong expert, slot or weight moves a token by far more.
#include <bit>
#include <cmath>
#include <random>

#include "backend/cuda/attention.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "cuda_test_util.h"
#include "backend/cpu/moe.h"
#include "model/model.h"

namespace xpert {
namespace {

using cudatest::from_device;
using cudatest::to_device;

TEST(CudaMoeRoute, MatchesRouteTopK) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  struct Case {
    int64_t n, E, k;
    bool norm;
    float scale;
  };
  for (const Case c :
       {Case{64, 128, 8, true, 1.0f}, Case{5, 16, 4, false, 2.5f}, Case{3, 512, 10, true, 1.0f}}) {
    std::vector<float> logits = cudatest::random_values((size_t)(c.n * c.E), 11 + c.E);
    for (float& v : logits) v *= 4.0f;
    // Ties inside and at the edge of the top k: copies of the largest logits of token 0.
    logits[3] = logits[1] = logits[0] = 5.0f;
    logits[c.E - 1] = 5.0f;
    Routing want;
    cpu::route_top_k(logits.data(), c.n,
                {.n_expert = c.E, .k = c.k, .norm_weights = c.norm, .weights_scale = c.scale}, want);
    cuda::DeviceBuffer l_dev = to_device(logits), ids((size_t)(c.n * c.k) * 4), w((size_t)(c.n * c.k) * 4);
    cuda::moe_route(l_dev.as<float>(), c.n,
                    {.n_expert = c.E, .k = c.k, .norm_weights = c.norm, .weights_scale = c.scale},
                    ids.as<int32_t>(), w.as<float>(), stream);
    stream.sync();
    EXPECT_EQ(from_device<int32_t>(ids, (size_t)(c.n * c.k)), want.ids);
    const std::vector<float> got_w = from_device<float>(w, (size_t)(c.n * c.k));
    for (size_t i = 0; i < got_w.size(); ++i) EXPECT_NEAR(got_w[i], want.weights[i], 2e-6 * c.scale) << i;
  }
  // All equal: the first k experts with equal weights.
  const std::vector<float> flat(8, -7.5f);
  cuda::DeviceBuffer l_dev = to_device(flat), ids(16), w(16);
  cuda::moe_route(l_dev.as<float>(), 1, {.n_expert = 8, .k = 4}, ids.as<int32_t>(), w.as<float>(), stream);
  stream.sync();
  EXPECT_EQ(from_device<int32_t>(ids, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  for (float v : from_device<float>(w, 4)) EXPECT_FLOAT_EQ(v, 0.25f);
}

// --routing uniform (RouterParams::uniform_seed): the same hashed scores on the device as on the host, so
// moe_route and the fused router (every form) choose the experts route_top_k chooses with that seed.
TEST(CudaMoeRoute, UniformRoutingMatchesTheHost) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t D = 2048, E = 128, k = 8;
  const uint32_t seed = 7;
  for (const int64_t n : {1, 5, 64}) {
    const std::vector<float> logits = cudatest::random_values((size_t)(n * E), 90 + n);
    Routing want;
    cpu::route_top_k(logits.data(), n, {.n_expert = E, .k = k, .uniform_seed = seed}, want);
    cuda::DeviceBuffer l_dev = to_device(logits), ids((size_t)(n * k) * 4), w((size_t)(n * k) * 4);
    cuda::moe_route(l_dev.as<float>(), n, {.n_expert = E, .k = k, .uniform_seed = seed}, ids.as<int32_t>(),
                    w.as<float>(), stream);
    stream.sync();
    EXPECT_EQ(from_device<int32_t>(ids, (size_t)(n * k)), want.ids) << n;
    const std::vector<float> got_w = from_device<float>(w, (size_t)(n * k));
    for (size_t i = 0; i < got_w.size(); ++i) EXPECT_NEAR(got_w[i], want.weights[i], 2e-6) << i;
  }
  const std::vector<float> rw = cudatest::random_values((size_t)(E * D), 93);
  cuda::DeviceBuffer w_dev = to_device(rw), done(4);
  XPERT_CUDA_CHECK(cudaMemset(done.data(), 0, 4));
  for (const int64_t n : {1, 8})
    for (cuda::RouteForm form : {cuda::RouteForm::warp, cuda::RouteForm::block, cuda::RouteForm::two_phase}) {
      const std::vector<float> x = cudatest::random_values((size_t)(n * D), 94 + n);
      const cuda::MoeRouting r{.n_expert = E, .k = k, .uniform_seed = seed};
      cuda::DeviceBuffer x_dev = to_device(x), logits((size_t)(n * E) * 4), ids((size_t)(n * k) * 4),
                         wt((size_t)(n * k) * 4);
      cuda::moe_router(w_dev.as<float>(), x_dev.as<float>(), n, D, r, logits.as<float>(), ids.as<int32_t>(),
                       wt.as<float>(), done.as<unsigned>(), stream, nullptr, form);
      stream.sync();
      Routing want;
      cpu::route_top_k(from_device<float>(logits, (size_t)(n * E)).data(), n,
                       {.n_expert = E, .k = k, .uniform_seed = seed}, want);
      EXPECT_EQ(from_device<int32_t>(ids, (size_t)(n * k)), want.ids) << n << " form " << (int)form;
    }
}

// The fused decode router (product + routing in one launch): logits against a double-precision product,
// the routing against route_top_k on the logits it wrote; three calls in a row (the block counter resets).
TEST(CudaMoeRouter, ProductAndRouting) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t D = 2048, E = 128, k = 8;
  const std::vector<float> w = cudatest::random_values((size_t)(E * D), 41);
  cuda::DeviceBuffer w_dev = to_device(w), done(4);
  XPERT_CUDA_CHECK(cudaMemset(done.data(), 0, 4));
  for (const int64_t n : {1, 3, 8}) {
    const std::vector<float> x = cudatest::random_values((size_t)(n * D), 42 + n);
    const cuda::MoeRouting r{.n_expert = E, .k = k, .norm_weights = true, .weights_scale = 1.0f};
    ASSERT_TRUE(cuda::moe_router_fusable(DType::F32, n, D, r));
    cuda::DeviceBuffer x_dev = to_device(x), logits((size_t)(n * E) * 4), ids((size_t)(n * k) * 4),
                       wt((size_t)(n * k) * 4);
    cuda::moe_router(w_dev.as<float>(), x_dev.as<float>(), n, D, r, logits.as<float>(), ids.as<int32_t>(),
                     wt.as<float>(), done.as<unsigned>(), stream);
    stream.sync();
    const std::vector<float> got = from_device<float>(logits, (size_t)(n * E));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < E; ++e) {
        double ref = 0;
        for (int64_t i = 0; i < D; ++i) ref += (double)w[e * D + i] * x[t * D + i];
        EXPECT_NEAR(got[t * E + e], ref, 1e-4 * (1 + std::fabs(ref))) << t << " " << e;
      }
    Routing want;
    cpu::route_top_k(got.data(), n, {.n_expert = E, .k = k, .norm_weights = true, .weights_scale = 1.0f}, want);
    EXPECT_EQ(from_device<int32_t>(ids, (size_t)(n * k)), want.ids) << n;
    const std::vector<float> got_w = from_device<float>(wt, (size_t)(n * k));
    for (size_t i = 0; i < got_w.size(); ++i) EXPECT_NEAR(got_w[i], want.weights[i], 2e-6) << i;
  }
  EXPECT_EQ(from_device<uint32_t>(done, 1)[0], 0u);
}

// Every odd router row a copy of the one before: their logits are the same bits, so the lower expert must
// come first, as route_top_k orders them.
void make_tie_pairs(std::vector<float>& w, int64_t E, int64_t D) {
  for (int64_t e = 1; e < E; e += 2) std::copy(w.begin() + (e - 1) * D, w.begin() + e * D, w.begin() + e * D);
}

// One token's ids and weights from moe_router against route_top_k of the logits it wrote; returns the logits.
std::vector<float> expect_host_routing(const cuda::DeviceBuffer& logits, const cuda::DeviceBuffer& ids,
                                       const cuda::DeviceBuffer& wt, int64_t E, int64_t k) {
  const std::vector<float> got = from_device<float>(logits, (size_t)E);
  Routing want;
  cpu::route_top_k(got.data(), 1, {.n_expert = E, .k = k, .norm_weights = true, .weights_scale = 1.0f}, want);
  EXPECT_EQ(from_device<int32_t>(ids, (size_t)k), want.ids);
  const std::vector<float> got_w = from_device<float>(wt, (size_t)k);
  for (size_t i = 0; i < got_w.size(); ++i) EXPECT_NEAR(got_w[i], want.weights[i], 2e-6) << i;
  return got;
}

// One decode token is routed by the router's whole last block (route_token_block: up to 128 experts), with
// ties (make_tie_pairs).
TEST(CudaMoeRouter, OneTokenWithTies) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t D = 512, E = 128, k = 8;
  std::vector<float> w = cudatest::random_values((size_t)(E * D), 43);
  make_tie_pairs(w, E, D);
  const std::vector<float> x = cudatest::random_values((size_t)D, 44);
  cuda::DeviceBuffer w_dev = to_device(w), x_dev = to_device(x), done(4), logits((size_t)E * 4),
                     ids((size_t)k * 4), wt((size_t)k * 4);
  XPERT_CUDA_CHECK(cudaMemset(done.data(), 0, 4));
  const cuda::MoeRouting r{.n_expert = E, .k = k, .norm_weights = true, .weights_scale = 1.0f};
  cuda::moe_router(w_dev.as<float>(), x_dev.as<float>(), 1, D, r, logits.as<float>(), ids.as<int32_t>(),
                   wt.as<float>(), done.as<unsigned>(), stream);
  stream.sync();
  const std::vector<float> got = expect_host_routing(logits, ids, wt, E, k);
  for (int64_t e = 1; e < E; e += 2) ASSERT_EQ(got[e], got[e - 1]) << "the tie this test needs";
}

// Every form of one token's top k (one warp's serial top-k, the block's ranking, the block's two-phase
// ranking) gives the host's routing, with ties (every odd expert a copy of the one before) and without, at
// 128 and 256 experts (the block form only where it takes them: at most 64 comparisons a thread).
TEST(CudaMoeRouter, EveryFormAgrees) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t D = 512;
  for (const int64_t E : {128, 256})
    for (const int64_t k : {8, 10})
      for (const bool ties : {false, true}) {
        SCOPED_TRACE(fmt::format("E={} k={} ties={}", E, k, ties));
        std::vector<float> w = cudatest::random_values((size_t)(E * D), 45);
        if (ties) make_tie_pairs(w, E, D);
        const std::vector<float> x = cudatest::random_values((size_t)D, 46);
        cuda::DeviceBuffer w_dev = to_device(w), x_dev = to_device(x), done(4), logits((size_t)E * 4),
                           ids((size_t)k * 4), wt((size_t)k * 4);
        XPERT_CUDA_CHECK(cudaMemset(done.data(), 0, 4));
        const cuda::MoeRouting r{.n_expert = E, .k = k, .norm_weights = true, .weights_scale = 1.0f};
        for (const cuda::RouteForm form :
             {cuda::RouteForm::warp, cuda::RouteForm::block, cuda::RouteForm::two_phase}) {
          if (form == cuda::RouteForm::block && E > 128) continue;
          SCOPED_TRACE((int)form);
          XPERT_CUDA_CHECK(cudaMemset(ids.data(), 0xff, ids.bytes()));
          cuda::moe_router(w_dev.as<float>(), x_dev.as<float>(), 1, D, r, logits.as<float>(),
                           ids.as<int32_t>(), wt.as<float>(), done.as<unsigned>(), stream, nullptr, form);
          stream.sync();
          const std::vector<float> got = expect_host_routing(logits, ids, wt, E, k);
          if (ties) {
            for (int64_t e = 1; e < E; e += 2) ASSERT_EQ(got[e], got[e - 1]) << "the tie this test needs";
          }
        }
      }
}

// The FFN norm inside the router (RouterNorm: every block normalizes res + d itself) against the long-row
// norm's launch (add_rmsnorm_q8, which also writes res + d) then the router: the same y, q8_1 blocks,
// logits, ids and weights, bit for bit, with and without Qwen3.5's shared-expert gate; res is left as it
// was. Rows of 2048 (Qwen3's and Qwen3.5's) and 1536 (a thread's second float4 past the row). d is
// cuda::sum_parts of a few rows; the router given those parts instead (the attention's fused projection)
// gives the same bits again and writes their sum to d.
TEST(CudaMoeRouter, NormInsideIsTheNormThenTheRouterBitForBit) {
  XPERT_REQUIRE_GPU();
  using std::bit_cast;
  cuda::Stream stream;
  const int64_t E = 128, k = 8;
  const cuda::MoeRouting r{.n_expert = E, .k = k, .norm_weights = true, .weights_scale = 1.0f};
  for (const int64_t D : {2048, 1536})
    for (const bool shared : {false, true}) {
      SCOPED_TRACE(fmt::format("D={} shared={}", D, shared));
      const int n_parts = D == 2048 ? 4 : 3;
      ASSERT_TRUE(cuda::long_row_norm_fits(1, D));
      const int64_t slots = k + (shared ? 1 : 0);
      std::vector<float> w = cudatest::random_values((size_t)(E * D), 51);
      for (float& v : w) v *= 0.05f;
      const std::vector<float> sg = cudatest::random_values((size_t)D, 52),
                               res = cudatest::random_values((size_t)D, 53),
                               parts = cudatest::random_values((size_t)(n_parts * D), 54),
                               nw = cudatest::random_values((size_t)D, 55);
      cuda::DeviceBuffer w_dev = to_device(w), sg_dev = to_device(sg), parts_dev = to_device(parts),
                         d_dev((size_t)D * 4), nw_dev = to_device(nw), done(4);
      cuda::sum_parts(parts_dev.as<float>(), n_parts, D, d_dev.as<float>(), stream);
      const std::vector<float> d = from_device<float>(d_dev, (size_t)D);
      XPERT_CUDA_CHECK(cudaMemset(done.data(), 0, 4));
      struct Out {
        std::vector<float> res, y, logits, wt;
        std::vector<int8_t> q;
        std::vector<float> ds;
        std::vector<int32_t> ids;
      } out[3];
      cuda::DeviceBuffer d_out((size_t)D * 4);
      XPERT_CUDA_CHECK(cudaMemset(d_out.data(), 0xff, d_out.bytes()));
      for (int f = 0; f < 3; ++f) {
        cuda::DeviceBuffer res_dev = to_device(res), y((size_t)D * 4), q((size_t)D), ds((size_t)D / 32 * 8),
                           lg((size_t)E * 4), ids((size_t)slots * 4), wt((size_t)slots * 4);
        XPERT_CUDA_CHECK(cudaMemset(ids.data(), 0xff, ids.bytes()));
        const float* sgp = shared ? sg_dev.as<float>() : nullptr;
        if (f == 0) {
          cuda::add_rmsnorm_q8(d_dev.as<float>(), res_dev.as<float>(), D, nw_dev.as<float>(), y.as<float>(),
                               D, 1, D, 1e-6f, q.as<int8_t>(), ds.as<float2>(), stream);
          cuda::moe_router(w_dev.as<float>(), y.as<float>(), 1, D, r, lg.as<float>(), ids.as<int32_t>(),
                           wt.as<float>(), done.as<unsigned>(), stream, sgp, cuda::RouteForm::two_phase);
        } else {
          const cuda::RouterNorm nm{.res = res_dev.as<float>(),
                                    .d = f == 1 ? d_dev.as<float>() : d_out.as<float>(),
                                    .w = nw_dev.as<float>(),
                                    .eps = 1e-6f,
                                    .y = y.as<float>(),
                                    .q = q.as<int8_t>(),
                                    .ds = ds.as<float2>(),
                                    .parts = f == 2 ? parts_dev.as<float>() : nullptr,
                                    .n_parts = f == 2 ? n_parts : 0};
          cuda::moe_router(w_dev.as<float>(), nullptr, 1, D, r, lg.as<float>(), ids.as<int32_t>(),
                           wt.as<float>(), done.as<unsigned>(), stream, sgp, cuda::RouteForm::two_phase, &nm);
        }
        stream.sync();
        out[f] = {from_device<float>(res_dev, (size_t)D),  from_device<float>(y, (size_t)D),
                  from_device<float>(lg, (size_t)E),       from_device<float>(wt, (size_t)slots),
                  from_device<int8_t>(q, (size_t)D),       from_device<float>(ds, (size_t)D / 32 * 2),
                  from_device<int32_t>(ids, (size_t)slots)};
      }
      for (int f = 1; f < 3; ++f) {
        SCOPED_TRACE(f == 1 ? "norm inside" : "norm inside, d in parts");
        for (int64_t i = 0; i < D; ++i) {
          ASSERT_EQ(bit_cast<uint32_t>(out[f].res[i]), bit_cast<uint32_t>(res[i])) << "res written at " << i;
          ASSERT_EQ(bit_cast<uint32_t>(out[f].y[i]), bit_cast<uint32_t>(out[0].y[i])) << "y " << i;
          ASSERT_EQ(out[f].q[i], out[0].q[i]) << "q " << i;
        }
        for (size_t i = 0; i < out[0].ds.size(); ++i)
          ASSERT_EQ(bit_cast<uint32_t>(out[f].ds[i]), bit_cast<uint32_t>(out[0].ds[i])) << "ds " << i;
        for (int64_t e = 0; e < E; ++e)
          ASSERT_EQ(bit_cast<uint32_t>(out[f].logits[e]), bit_cast<uint32_t>(out[0].logits[e]))
              << "logit " << e;
        EXPECT_EQ(out[f].ids, out[0].ids);
        for (int64_t i = 0; i < slots; ++i)
          EXPECT_EQ(bit_cast<uint32_t>(out[f].wt[i]), bit_cast<uint32_t>(out[0].wt[i])) << "weight " << i;
      }
      const std::vector<float> d_sum = from_device<float>(d_out, (size_t)D);
      for (int64_t i = 0; i < D; ++i) {
        ASSERT_EQ(bit_cast<uint32_t>(d_sum[i]), bit_cast<uint32_t>(d[i])) << "d written at " << i;
        float ref = parts[i];  // sum_parts' order
        for (int j = 1; j < n_parts; ++j) ref += parts[j * D + i];
        ASSERT_EQ(bit_cast<uint32_t>(d[i]), bit_cast<uint32_t>(ref)) << "sum_parts at " << i;
      }
      EXPECT_NE(out[0].res, res) << "the norm's launch adds d to res";
    }
}

// One MoE layer on the host (reference input) and on the GPU (uploaded expert tensors and tables).
struct Layer {
  ModelConfig c;
  std::vector<float> router;
  std::vector<uint8_t> gate, up, down;
  LayerWeights lw;
  cuda::DeviceBuffer router_dev, gate_dev, up_dev, down_dev;

  Layer(int64_t D, int64_t F, int64_t E, int64_t k, DType gu, DType dn) {
    c.n_embd = D;
    c.n_ff_exp = F;
    c.n_expert = E;
    c.n_expert_used = k;
    router = cudatest::random_values((size_t)(D * E), 5);
    for (float& v : router) v *= 0.05f;
    gate = cudatest::random_weights(gu, F * E, D, 100, 512);
    up = cudatest::random_weights(gu, F * E, D, 200, 512);
    down = cudatest::random_weights(dn, D * E, F, 300, 512);
    auto weight = [](DType t, const void* p, int64_t k, int64_t n, int64_t x, size_t bytes) {
      return Weight{.type = t, .data = p, .ne = {k, n, x}, .n_bytes = bytes};
    };
    lw.ffn_gate_inp = weight(DType::F32, router.data(), D, E, 1, router.size() * 4);
    lw.ffn_gate_exps = weight(gu, gate.data(), D, F, E, gate.size());
    lw.ffn_up_exps = weight(gu, up.data(), D, F, E, up.size());
    lw.ffn_down_exps = weight(dn, down.data(), F, D, E, down.size());
    router_dev = to_device(router);
    gate_dev = cudatest::weights_to_device(gate, gu, D, F);
    up_dev = cudatest::weights_to_device(up, gu, D, F);
    down_dev = cudatest::weights_to_device(down, dn, F, D);
  }

  // Device tables of the resident experts.
  struct Tables {
    cuda::DeviceBuffer gate, up, down;
  };
  Tables tables(const std::vector<bool>& resident) const {
    const int64_t D = c.n_embd, F = c.n_ff_exp;
    Tables t;
    t.gate =
        to_device(cuda::expert_table(gate_dev.data(), row_bytes(lw.ffn_gate_exps.type, D) * F, resident));
    t.up = to_device(cuda::expert_table(up_dev.data(), row_bytes(lw.ffn_up_exps.type, D) * F, resident));
    t.down =
        to_device(cuda::expert_table(down_dev.data(), row_bytes(lw.ffn_down_exps.type, F) * D, resident));
    return t;
  }
  // regular: also the back-to-back layout (MoeExperts::gate_base...), for tables of every expert.
  cuda::MoeExperts experts(const Tables& t, bool regular = false) const {
    cuda::MoeExperts e;
    if (regular) {
      e.gate_base = gate_dev.data();
      e.up_base = up_dev.data();
      e.down_base = down_dev.data();
      e.gate_up_bytes = row_bytes(lw.ffn_gate_exps.type, c.n_embd) * (size_t)c.n_ff_exp;
      e.down_bytes = row_bytes(lw.ffn_down_exps.type, c.n_ff_exp) * (size_t)c.n_embd;
    }
    e.gate_type = lw.ffn_gate_exps.type;
    e.up_type = lw.ffn_up_exps.type;
    e.down_type = lw.ffn_down_exps.type;
    e.n_embd = c.n_embd;
    e.n_ff = c.n_ff_exp;
    e.n_expert = c.n_expert;
    e.gate = t.gate.as<const void*>();
    e.up = t.up.as<const void*>();
    e.down = t.down.as<const void*>();
    return e;
  }
};

// The experts for a given routing (ids, weights: [n][k] on the device), synchronized.
void gpu_experts(const cuda::MoeExperts& e, const cuda::DeviceBuffer& x_dev, int64_t n, int64_t k,
                 const cuda::DeviceBuffer& ids, const cuda::DeviceBuffer& w, float* out, bool accumulate,
                 cuda::MoePath path, cudaStream_t stream) {
  cuda::DeviceBuffer ws(cuda::moe_workspace_bytes(e, n, k));
  cuda::moe_experts(e,
                    {.x = x_dev.as<float>(),
                     .n_tokens = n,
                     .k = k,
                     .ids = ids.as<int32_t>(),
                     .weights = w.as<float>(),
                     .out = out,
                     .accumulate = accumulate,
                     .path = path},
                    ws.data(), ws.bytes(), stream);
  XPERT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// The whole block on the GPU: router matmul, routing, experts.
void gpu_moe(const Layer& L, const cuda::MoeExperts& e, const cuda::DeviceBuffer& x_dev, int64_t n,
             float* out, bool accumulate, cuda::MoePath path, cudaStream_t stream,
             cuda::DeviceBuffer* ids_out = nullptr, cuda::DeviceBuffer* w_out = nullptr) {
  const int64_t D = L.c.n_embd, E = L.c.n_expert, k = L.c.n_expert_used;
  cuda::DeviceBuffer logits((size_t)(n * E) * 4), ids((size_t)(n * k) * 4), w((size_t)(n * k) * 4);
  cuda::DeviceBuffer mws(std::max<size_t>(cuda::matmul_workspace_bytes(DType::F32, n, D), 1));
  cuda::matmul(DType::F32, L.router_dev.data(), E, D, x_dev.as<float>(), n, logits.as<float>(), E, mws.data(),
               mws.bytes(), stream);
  cuda::moe_route(logits.as<float>(), n, {.n_expert = E, .k = k}, ids.as<int32_t>(), w.as<float>(), stream);
  gpu_experts(e, x_dev, n, k, ids, w, out, accumulate, path, stream);
  if (ids_out) *ids_out = std::move(ids);
  if (w_out) *w_out = std::move(w);
}

// Per token: |got - want| / |want| (norms over n_embd).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t n, int64_t D,
                  double tol) {
  for (int64_t t = 0; t < n; ++t) {
    double e2 = 0, r2 = 0;
    for (int64_t i = 0; i < D; ++i) {
      const double g = got[t * D + i], w = want[t * D + i];
      ASSERT_TRUE(std::isfinite(g)) << "token " << t << " element " << i;
      e2 += (g - w) * (g - w);
      r2 += w * w;
    }
    EXPECT_LE(std::sqrt(e2 / r2), tol) << "token " << t;
  }
}

// The routed experts on the host for the given routing, only experts with include(e), one token per
// thread: the part another device computes in the heterogeneous mode.
template <class Include>
std::vector<float> host_moe(const Layer& L, const std::vector<float>& x, int64_t n,
                            const std::vector<int32_t>& id, const std::vector<float>& wt, Include include) {
  const int64_t D = L.c.n_embd, F = L.c.n_ff_exp, k = L.c.n_expert_used;
  std::vector<float> out((size_t)(n * D), 0.0f);
  cudatest::parallel_rows(n, [&](int64_t t0, int64_t t1) {
    std::vector<float> g(F), u(F), y(D);
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int e = id[t * k + j];
        if (!include(e)) continue;
        const Weight wg = expert_matrix(L.lw.ffn_gate_exps, e), wu = expert_matrix(L.lw.ffn_up_exps, e),
                     wd = expert_matrix(L.lw.ffn_down_exps, e);
        cpu::matmul_reference(wg.type, wg.data, F, D, x.data() + t * D, 1, g.data(), F);
        cpu::matmul_reference(wu.type, wu.data, F, D, x.data() + t * D, 1, u.data(), F);
        for (int64_t i = 0; i < F; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
        cpu::matmul_reference(wd.type, wd.data, D, F, g.data(), 1, y.data(), D);
        for (int64_t i = 0; i < D; ++i) out[t * D + i] += wt[t * k + j] * y[i];
      }
  });
  return out;
}

class CudaMoe : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaMoe, EqualsReference) {
  XPERT_REQUIRE_GPU();
  const int64_t n = GetParam();
  Layer L(2048, 768, 16, 8, DType::Q4_K, DType::Q6_K);
  const int64_t D = L.c.n_embd;
  std::vector<float> x = cudatest::random_values((size_t)(n * D), 40 + n);
  std::vector<float> want(x.size());
  cpu::moe_ffn_reference(moe_ffn_args(L.c, L.lw, 0, nullptr), x.data(), n, want.data());

  cuda::Stream stream;
  const auto tables = L.tables(std::vector<bool>(16, true));
  const cuda::MoeExperts e = L.experts(tables);
  cuda::DeviceBuffer x_dev = to_device(x), out((size_t)(n * D) * 4);
  for (cuda::MoePath path : {cuda::MoePath::automatic, cuda::MoePath::decode, cuda::MoePath::grouped}) {
    SCOPED_TRACE(fmt::format("n={} path={}", n, (int)path));
    XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
    gpu_moe(L, e, x_dev, n, out.as<float>(), false, path, stream);
    expect_close(from_device<float>(out, x.size()), want, n, D, 3e-2);
  }
  // The back-to-back layout: the decode kernels compute every expert's address, so tables that list no
  // expert at all still give the whole layer.
  const auto empty = L.tables(std::vector<bool>(16, false));
  const cuda::MoeExperts regular = L.experts(empty, true);
  XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
  gpu_moe(L, regular, x_dev, std::min<int64_t>(n, cuda::kMoeDecodeMaxTokens), out.as<float>(), false,
          cuda::MoePath::decode, stream);
  const int64_t nd = std::min<int64_t>(n, cuda::kMoeDecodeMaxTokens);
  expect_close(from_device<float>(out, (size_t)(nd * D)),
               std::vector<float>(want.begin(), want.begin() + nd * D), nd, D, 3e-2);
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaMoe, ::testing::Values(1, 4, 16, 32, 64));

// The decode gate/up kernel as clusters of two CTAs a span of 32 outputs (MoeRun::gate_up_parts 2, sm_90)
// against one CTA a span: each output is the same dot of the same lanes, so the layer's output is the same
// bits, with every expert resident and with half of them (both CTAs of a cluster whose expert is absent
// leave before its barrier).
TEST(CudaMoeDecode, GateUpClusterPairsAreBitForBit) {
  XPERT_REQUIRE_GPU();
  int major = 0;
  XPERT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) GTEST_SKIP() << "thread block clusters need sm_90+";
  struct Case {
    int64_t D, F, E, k;
    DType gu, dn;
  };
  cuda::Stream stream;
  for (const Case c :
       {Case{2048, 768, 16, 8, DType::Q4_K, DType::Q6_K}, Case{2048, 512, 16, 9, DType::Q5_K, DType::Q8_0},
        Case{1024, 256, 8, 4, DType::Q6_K, DType::Q4_K}}) {
    Layer L(c.D, c.F, c.E, c.k, c.gu, c.dn);
    for (const bool half : {false, true}) {
      std::vector<bool> resident((size_t)c.E, true);
      if (half)
        for (int64_t e = 0; e < c.E; ++e) resident[(size_t)e] = e % 2 == 0;
      const auto tables = L.tables(resident);
      const cuda::MoeExperts ex = L.experts(tables);
      for (const int64_t n : {1, 3}) {
        SCOPED_TRACE(fmt::format("{}/{} D={} F={} k={} half={} n={}", dtype_name(c.gu), dtype_name(c.dn), c.D,
                                 c.F, c.k, half, n));
        const std::vector<float> x = cudatest::random_values((size_t)(n * c.D), 300 + n);
        cuda::DeviceBuffer x_dev = to_device(x), out((size_t)(n * c.D) * 4), ids, w;
        gpu_moe(L, ex, x_dev, n, out.as<float>(), false, cuda::MoePath::decode, stream, &ids, &w);
        cuda::DeviceBuffer ws(cuda::moe_workspace_bytes(ex, n, c.k));
        std::vector<float> got[2];
        for (int parts = 1; parts <= 2; ++parts) {
          XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
          cuda::moe_experts(ex,
                            {.x = x_dev.as<float>(),
                             .n_tokens = n,
                             .k = c.k,
                             .ids = ids.as<int32_t>(),
                             .weights = w.as<float>(),
                             .out = out.as<float>(),
                             .path = cuda::MoePath::decode,
                             .gate_up_parts = parts},
                            ws.data(), ws.bytes(), stream);
          stream.sync();
          got[parts - 1] = from_device<float>(out, x.size());
        }
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(got[1][i]), std::bit_cast<uint32_t>(got[0][i])) << i;
      }
    }
  }
}

// Enough tokens per expert for 64-row tiles in the grouped GEMMs (128 tokens x 8 over 16 experts), against
// the host evaluation of the GPU's own routing.
TEST(CudaMoeGrouped, FullTiles) {
  XPERT_REQUIRE_GPU();
  const int64_t n = 128;
  Layer L(2048, 768, 16, 8, DType::Q5_K, DType::Q8_0);
  const int64_t D = L.c.n_embd, k = L.c.n_expert_used;
  const auto tables = L.tables(std::vector<bool>(16, true));
  std::vector<float> x = cudatest::random_values((size_t)(n * D), 123);
  cuda::Stream stream;
  cuda::DeviceBuffer x_dev = to_device(x), out((size_t)(n * D) * 4), ids, w;
  XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
  gpu_moe(L, L.experts(tables), x_dev, n, out.as<float>(), false, cuda::MoePath::automatic, stream, &ids, &w);
  const std::vector<float> want = host_moe(L, x, n, from_device<int32_t>(ids, (size_t)(n * k)),
                                           from_device<float>(w, (size_t)(n * k)), [](int) { return true; });
  expect_close(from_device<float>(out, x.size()), want, n, D, 3e-2);
}

// A few rows an expert (the grouped GEMM of matmul_grouped.cu: 32-row tiles, Q4_K and Q6_K, gate/up in
// either type, down in either), with a routing given here: expert 3 takes 40 rows (two tiles, the second
// partial), expert 5 one, experts 7..10 a few each, the rest none; against the host evaluation.
TEST(CudaMoeGrouped, FewRowsAnExpertEveryType) {
  XPERT_REQUIRE_GPU();
  const int64_t n = 48, k = 2;
  for (auto [gu, dn] : {std::pair{DType::Q4_K, DType::Q6_K}, std::pair{DType::Q4_K, DType::Q4_K},
                        std::pair{DType::Q6_K, DType::Q6_K}, std::pair{DType::Q6_K, DType::Q4_K}}) {
    SCOPED_TRACE(fmt::format("{} / {}", dtype_name(gu), dtype_name(dn)));
    Layer L(2048, 768, 16, k, gu, dn);
    const int64_t D = L.c.n_embd;
    std::vector<int32_t> id((size_t)(n * k));
    std::vector<float> wt((size_t)(n * k));
    for (int64_t t = 0; t < n; ++t) {
      id[t * k] = t < 40 ? 3 : (int32_t)(t % 16 == 3 ? 4 : t % 16);
      id[t * k + 1] = t == 0 ? 5 : (int32_t)(7 + t % 4);
      wt[t * k] = 0.25f + 0.5f * (float)(t % 3) / 3.0f;
      wt[t * k + 1] = 1.0f - wt[t * k];
    }
    const std::vector<float> x = cudatest::random_values((size_t)(n * D), 321);
    const std::vector<float> want = host_moe(L, x, n, id, wt, [](int) { return true; });
    const auto tables = L.tables(std::vector<bool>(16, true));
    const cuda::MoeExperts e = L.experts(tables);
    cuda::Stream stream;
    cuda::DeviceBuffer x_dev = to_device(x), ids = to_device(id), w = to_device(wt), out((size_t)(n * D) * 4);
    XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
    gpu_experts(e, x_dev, n, k, ids, w, out.as<float>(), false, cuda::MoePath::grouped, stream);
    expect_close(from_device<float>(out, x.size()), want, n, D, 3e-2);
  }
}

// Half the experts on the GPU: the GPU adds its part (accumulate) to what the caller put in `out` for the
// other half, here computed on the host; together they are the whole layer.
TEST(CudaMoeResident, SkipsAbsentExpertsAndAccumulates) {
  XPERT_REQUIRE_GPU();
  Layer L(2048, 768, 16, 8, DType::Q4_K, DType::Q4_K);
  const int64_t D = L.c.n_embd, k = L.c.n_expert_used;
  std::vector<bool> resident(16);
  for (int e = 0; e < 16; ++e) resident[e] = e % 2 == 0;
  const auto tables = L.tables(resident);
  const cuda::MoeExperts ex = L.experts(tables);
  cuda::Stream stream;
  for (int64_t n : {3, 20}) {  // decode and grouped
    SCOPED_TRACE(fmt::format("n={}", n));
    std::vector<float> x = cudatest::random_values((size_t)(n * D), 70 + n);
    std::vector<float> want(x.size());
    cpu::moe_ffn_reference(moe_ffn_args(L.c, L.lw, 0, nullptr), x.data(), n, want.data());
    cuda::DeviceBuffer x_dev = to_device(x), out((size_t)(n * D) * 4), ids, w;
    // Pass 1: which experts the GPU routes to, so the host can compute the absent ones.
    gpu_moe(L, ex, x_dev, n, out.as<float>(), false, cuda::MoePath::automatic, stream, &ids, &w);
    const std::vector<int32_t> id = from_device<int32_t>(ids, (size_t)(n * k));
    const std::vector<float> wt = from_device<float>(w, (size_t)(n * k));
    const std::vector<float> host = host_moe(L, x, n, id, wt, [&](int e) { return !resident[e]; });
    // Pass 2: out = host part, then the GPU adds the resident part.
    out.upload(host.data(), host.size() * 4);
    gpu_moe(L, ex, x_dev, n, out.as<float>(), true, cuda::MoePath::automatic, stream);
    expect_close(from_device<float>(out, x.size()), want, n, D, 3e-2);
  }
  // No expert resident: nothing is added.
  const auto none = L.tables(std::vector<bool>(16, false));
  const int64_t n = 2;
  std::vector<float> x = cudatest::random_values((size_t)(n * D), 9);
  cuda::DeviceBuffer x_dev = to_device(x), out((size_t)(n * D) * 4);
  for (cuda::MoePath path : {cuda::MoePath::decode, cuda::MoePath::grouped}) {
    XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
    gpu_moe(L, L.experts(none), x_dev, n, out.as<float>(), false, path, stream);
    for (float v : from_device<float>(out, x.size())) ASSERT_EQ(v, 0.0f);
  }
}

TEST(CudaMoeErrors, RejectsMixedGateUpTypes) {
  cuda::MoeExperts e;
  e.gate_type = DType::Q4_K;
  e.up_type = DType::Q6_K;
  e.n_embd = 2048;
  e.n_ff = 768;
  e.n_expert = 8;
  EXPECT_THROW(cuda::check_moe_experts(e), Error);
}

}  // namespace
}  // namespace xpert
