// GPTQ-INT4 experts read natively by CudaBackend: the fused decode op around a GPTQ layer (the next norm as
// its own launch, moe_norm_out_supported) against its plain steps, and a GPTQ checkpoint folder loaded with
// native experts (as runtime/placement.cpp's native_gptq_experts now loads it for CUDA) wholly on the GPU
// and split with the host, against the same model on the CPU. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "../unit/model_outputs.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "base/thread_pool.h"
#include "cuda_test_util.h"
#include "model/model.h"

namespace xpert {
namespace {

using cudatest::OnDevice;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    b = (uint8_t)(seed >> 56);
  }
  return v;
}

// One decode token of a GPTQ MoE layer through add_rmsnorm_moe_ffn_add with the next norm (CUDA's fused
// form: the FFN norm inside the router, the residual added by the experts' down kernel, then the next norm
// in its own launch because the GPTQ down kernel has none inside) against Backend's plain steps
// (add_rmsnorm, moe_ffn_add, rmsnorm) on the same GPU: the same bits.
TEST(CudaMoeGptq, FusedDecodeOpEqualsPlainSteps) {
  XPERT_REQUIRE_GPU();
  std::shared_ptr<Backend> dev = make_cuda_backend(0);
  Backend& b = *dev;
  const int64_t D = 2048, F = 768, E = 128, K = 8;
  for (const DType t : {DType::GPTQ4_G128, DType::GPTQ4Z_G32}) {
    SCOPED_TRACE(dtype_name(t));
    // Codes random; scales and zero points valid (f16 0.01-ish, zero points 0..16) so sums stay finite.
    std::vector<uint8_t> gate = random_bytes(row_bytes(t, D) * F * E, 1), up = random_bytes(gate.size(), 2),
                         down = random_bytes(row_bytes(t, F) * D * E, 3);
    auto fix = [&](std::vector<uint8_t>& m, int64_t k, int64_t n) {
      const size_t one = row_bytes(t, k) * n, q = (size_t)(k / 2 * n), g = (size_t)(k / gptq_group(t) * n);
      for (int64_t e = 0; e < E; ++e) {
        uint8_t* p = m.data() + e * one;
        for (size_t i = 0; i < g; ++i) {
          const uint16_t s = 0x2000 | (p[q + 2 * i] & 0x3ff);  // f16 in [0.0078, 0.0156)
          std::memcpy(p + q + 2 * i, &s, 2);
          if (gptq_has_zeros(t)) p[q + 2 * g + i] %= 17;
        }
      }
    };
    fix(gate, D, F);
    fix(up, D, F);
    fix(down, F, D);
    std::vector<float> router = cudatest::random_values((size_t)(D * E), 5);
    for (float& v : router) v *= 0.05f;
    const OnDevice gd(b, gate.data(), gate.size()), ud(b, up.data(), up.size()),
        dd(b, down.data(), down.size()), rd(b, router);
    MoeFfn ffn;
    ffn.n_embd = D;
    ffn.n_ff = F;
    ffn.n_expert = E;
    ffn.n_used = K;
    ffn.router = {.type = DType::F32, .data = rd.p, .ne = {D, E, 1}, .n_bytes = router.size() * 4};
    ffn.gate = {.type = t, .data = gd.p, .ne = {D, F, E}, .n_bytes = gate.size()};
    ffn.up = {.type = t, .data = ud.p, .ne = {D, F, E}, .n_bytes = up.size()};
    ffn.down = {.type = t, .data = dd.p, .ne = {F, D, E}, .n_bytes = down.size()};

    const std::vector<float> x = cudatest::random_values((size_t)D, 11),
                             d = cudatest::random_values((size_t)D, 12);
    std::vector<float> w = cudatest::random_values((size_t)D, 13),
                       nw = cudatest::random_values((size_t)D, 14);
    for (float& v : w) v = 1.0f + 0.2f * v;
    for (float& v : nw) v = 1.0f + 0.2f * v;
    const OnDevice wd(b, w), nwd(b, nw), dd1(b, d);
    std::vector<float> got_x[2], got_cur[2];
    for (int form = 0; form < 2; ++form) {
      const OnDevice xd(b, x), cur(b, std::vector<float>((size_t)D));
      const Act a =
          form == 0 ? b.add_rmsnorm_moe_ffn_add(ffn, dd1.f(), xd.f(), wd.f(), cur.f(), 1, nwd.f(), nullptr)
                    : b.Backend::add_rmsnorm_moe_ffn_add(ffn, dd1.f(), xd.f(), wd.f(), cur.f(), 1, nwd.f(),
                                                         nullptr);
      ASSERT_EQ(a.x, cur.f()) << "the next norm's output is returned";
      got_x[form] = xd.get((size_t)D);
      got_cur[form] = cur.get((size_t)D);
    }
    double moved = 0;
    for (int64_t i = 0; i < D; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got_x[0][i]), std::bit_cast<uint32_t>(got_x[1][i])) << "x " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(got_cur[0][i]), std::bit_cast<uint32_t>(got_cur[1][i]))
          << "cur " << i;
      moved += std::fabs(got_x[0][i] - (x[i] + d[i]));
    }
    EXPECT_GT(moved / D, 1e-3) << "the experts added something";
  }
}

// The GPTQ fixture (Qwen3.5-MoE, group 64, symmetric) with its experts native on the GPU (whole, and with
// every other expert on the host: computed there, or with batches of 2+ tokens copied to the GPU) against the
// same folder with its experts repacked to Q4_0 on the GPU (the path before native experts: the same dense
// layers and kernels, only the experts' differ) and against the native model on the CPU. 40 prompt tokens
// take the grouped GEMMs, the greedy steps the decode kernels.
Outputs run_folder(const std::string& dir, bool native, int mode, const std::vector<int32_t>& prompt,
                   ThreadPool& pool) {
  auto m = Model::load(dir, {.native_gptq_experts = native});
  const ModelConfig& c = m->config();
  int64_t n_native = 0;
  for (int64_t il = 0; il < c.n_layer; ++il)
    if (const Weight& g = m->host_weights().layers[il].ffn_gate_exps; g && is_gptq(g.type)) ++n_native;
  EXPECT_EQ(n_native > 0, native) << "experts native: " << n_native << " layers";
  if (mode >= 0) {  // -1: the CPU
    std::shared_ptr<Backend> be = make_cuda_backend(0);
    if (mode == 0) {
      m->offload(std::move(be), c.n_layer);
    } else {
      be->split_experts()->set_expert_streaming(mode == 2 ? 2 : 0, 0.0);
      std::vector<std::vector<bool>> masks(c.n_layer, std::vector<bool>(c.n_expert));
      for (auto& mk : masks)
        for (int64_t e = 0; e < c.n_expert; ++e) mk[e] = e % 2 == 0;
      m->offload(std::move(be), c.n_layer, &masks);
    }
  }
  return run(*m, prompt, 24, pool);
}

TEST(CudaMoeGptq, ModelMatchesRepackAndCpu) {
  XPERT_REQUIRE_GPU();
  const std::string dir = fixture("hf_qwen35moe_gptq");
  const int64_t V = Model::load(dir, {})->config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));
  ThreadPool pool(2);
  const Outputs cpu = run_folder(dir, true, -1, prompt, pool);
  const Outputs repack = run_folder(dir, false, 0, prompt, pool);
  const float d_repack = prefill_rel_diff(cpu, repack);
  for (const int mode : {0, 1, 2}) {
    const char* what = mode == 0   ? "all experts on the GPU"
                       : mode == 1 ? "half, host computed"
                                   : "half, streamed";
    SCOPED_TRACE(what);
    const Outputs g = run_folder(dir, true, mode, prompt, pool);
    const float d = prefill_rel_diff(repack, g), d_cpu = prefill_rel_diff(cpu, g);
    EXPECT_LT(d, 2e-2f) << "against the Q4_0 repack on the GPU";
    EXPECT_LT(d_cpu, std::max(2e-2f, 1.5f * d_repack))
        << "against the CPU (the repack on the GPU: " << d_repack << ")";
    const size_t agree = greedy_agreement(repack, g, V);
    std::printf(
        "hf_qwen35moe_gptq native experts, %s: prefill max|d|/max|logit| %.2e against the repack on the GPU, "
        "%.2e "
        "against the CPU (the repack %.2e); greedy agrees with the repack on %zu of %zu\n",
        what, d, d_cpu, d_repack, agree, repack.tokens.size());
  }
}

}  // namespace
}  // namespace xpert
