// CUDA MoE with GPTQ-INT4 experts read as stored (moe_gptq.cu): the decode kernels and the grouped
// tensor-core GEMMs against a host evaluation of gptq::dequantize_native's matrices (double sums), on
// qwen3-30b-a3b's expert shapes (n_embd 2048, n_ff 768, 128 experts, top 8), every native type (groups 32,
// 64, 128, symmetric and with zero points), random codes, scales and routing.
// Tolerance per token (norm over n_embd): decode sums in f32 from f32 inputs (1e-3); the grouped path
// rounds X, the dequantized weights and the SwiGLU rows to f16 (1e-2). A wrong expert, slot, group, zero
// point or nibble order moves a token by far more.
#include <cmath>
#include <cstring>

#include "backend/cuda/moe.h"
#include "base/half.h"
#include "cuda_test_util.h"
#include "quant/gptq.h"

namespace xpert {
namespace {

using cudatest::from_device;
using cudatest::to_device;

uint64_t next(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// E matrices W [n][k] of type t back to back: random codes, scales in [0.005, 0.015), zero points 0..16.
std::vector<uint8_t> random_native(DType t, int64_t k, int64_t n, int64_t E, uint64_t seed) {
  const size_t one = row_bytes(t, k) * (size_t)n;
  std::vector<uint8_t> out(one * (size_t)E);
  uint64_t s = seed;
  for (int64_t e = 0; e < E; ++e) {
    const gptq::NativeView v = gptq::native_view(t, out.data() + e * one, k, n);
    auto* q = const_cast<uint8_t*>(v.qweight);
    for (size_t i = 0; i < (size_t)(k / 2 * n); i += 8) {
      const uint64_t r = next(s);
      std::memcpy(q + i, &r, 8);
    }
    auto* sc = const_cast<uint8_t*>(v.scales);
    const int64_t groups = k / gptq_group(t) * n;
    for (int64_t i = 0; i < groups; ++i) {
      const uint16_t h = f32_to_f16(0.005f + 0.01f * (float)(next(s) >> 40) * 0x1p-24f);
      std::memcpy(sc + 2 * i, &h, 2);
    }
    if (v.zeros)
      for (int64_t i = 0; i < groups; ++i) const_cast<uint8_t*>(v.zeros)[i] = (uint8_t)(next(s) % 17);
  }
  return out;
}

// One layer's experts on the host and the GPU.
struct GptqLayer {
  int64_t D, F, E;
  DType t;
  std::vector<uint8_t> gate, up, down;
  cuda::DeviceBuffer gate_dev, up_dev, down_dev;
  GptqLayer(int64_t D_, int64_t F_, int64_t E_, DType t_, uint64_t seed) : D(D_), F(F_), E(E_), t(t_) {
    gate = random_native(t, D, F, E, seed);
    up = random_native(t, D, F, E, seed + 1);
    down = random_native(t, F, D, E, seed + 2);
    gate_dev = to_device(gate);
    up_dev = to_device(up);
    down_dev = to_device(down);
  }
  size_t gate_up_bytes() const { return row_bytes(t, D) * (size_t)F; }
  size_t down_bytes() const { return row_bytes(t, F) * (size_t)D; }

  struct Tables {
    cuda::DeviceBuffer gate, up, down;
  };
  Tables tables(const std::vector<bool>& resident) const {
    return {to_device(cuda::expert_table(gate_dev.data(), gate_up_bytes(), resident)),
            to_device(cuda::expert_table(up_dev.data(), gate_up_bytes(), resident)),
            to_device(cuda::expert_table(down_dev.data(), down_bytes(), resident))};
  }
  // regular: also the back-to-back layout (MoeExperts::gate_base...).
  cuda::MoeExperts experts(const Tables& tb, bool regular = false) const {
    cuda::MoeExperts e;
    e.gate_type = e.up_type = e.down_type = t;
    e.n_embd = D;
    e.n_ff = F;
    e.n_expert = E;
    e.gate = tb.gate.as<const void*>();
    e.up = tb.up.as<const void*>();
    e.down = tb.down.as<const void*>();
    if (regular) {
      e.gate_base = gate_dev.data();
      e.up_base = up_dev.data();
      e.down_base = down_dev.data();
      e.gate_up_bytes = gate_up_bytes();
      e.down_bytes = down_bytes();
    }
    return e;
  }
};

struct Routing {
  std::vector<int32_t> ids;  // [n][k], distinct experts per token
  std::vector<float> w;      // [n][k], positive, summing to 1 per token
};
Routing random_routing(int64_t n, int64_t k, int64_t E, uint64_t seed) {
  Routing r{std::vector<int32_t>((size_t)(n * k)), std::vector<float>((size_t)(n * k))};
  uint64_t s = seed;
  std::vector<int32_t> perm((size_t)E);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) perm[(size_t)e] = (int32_t)e;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      std::swap(perm[(size_t)j], perm[(size_t)(j + (int64_t)(next(s) % (uint64_t)(E - j)))]);
      r.ids[(size_t)(t * k + j)] = perm[(size_t)j];
      sum += r.w[(size_t)(t * k + j)] = 0.1f + (float)(next(s) >> 40) * 0x1p-24f;
    }
    for (int64_t j = 0; j < k; ++j) r.w[(size_t)(t * k + j)] /= sum;
  }
  return r;
}

// The experts with include(e) on the host: out[t] = sum over slots of w * down(silu(gate x) * up x), each
// expert's matrices dequantized once (gptq::dequantize_native), sums in double.
template <class Include>
std::vector<float> host_moe(const GptqLayer& L, const std::vector<float>& x, int64_t n, int64_t k,
                            const Routing& r, Include include) {
  const int64_t D = L.D, F = L.F;
  std::vector<std::vector<int64_t>> pairs((size_t)L.E);
  for (int64_t p = 0; p < n * k; ++p)
    if (include(r.ids[(size_t)p])) pairs[(size_t)r.ids[(size_t)p]].push_back(p);
  std::vector<double> yp((size_t)(n * k * D), 0.0);
  cudatest::parallel_rows(L.E, [&](int64_t e0, int64_t e1) {
    std::vector<float> wg((size_t)(F * D)), wu((size_t)(F * D)), wd((size_t)(D * F));
    std::vector<double> h((size_t)F);
    for (int64_t e = e0; e < e1; ++e) {
      if (pairs[(size_t)e].empty()) continue;
      gptq::dequantize_native(L.t, L.gate.data() + e * L.gate_up_bytes(), D, F, wg.data());
      gptq::dequantize_native(L.t, L.up.data() + e * L.gate_up_bytes(), D, F, wu.data());
      gptq::dequantize_native(L.t, L.down.data() + e * L.down_bytes(), F, D, wd.data());
      for (const int64_t p : pairs[(size_t)e]) {
        const float* xt = x.data() + (p / k) * D;
        for (int64_t f = 0; f < F; ++f) {
          double g = 0, u = 0;
          for (int64_t i = 0; i < D; ++i) {
            g += (double)wg[(size_t)(f * D + i)] * xt[i];
            u += (double)wu[(size_t)(f * D + i)] * xt[i];
          }
          h[(size_t)f] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int64_t d = 0; d < D; ++d) {
          double y = 0;
          for (int64_t i = 0; i < F; ++i) y += (double)wd[(size_t)(d * F + i)] * h[(size_t)i];
          yp[(size_t)(p * D + d)] = y;
        }
      }
    }
  });
  std::vector<float> out((size_t)(n * D), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D; ++d) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j)
        if (include(r.ids[(size_t)(t * k + j)]))
          sum += (double)r.w[(size_t)(t * k + j)] * yp[(size_t)((t * k + j) * D + d)];
      out[(size_t)(t * D + d)] = (float)sum;
    }
  return out;
}

std::vector<float> all_experts(const GptqLayer& L, const std::vector<float>& x, int64_t n, int64_t k,
                               const Routing& r) {
  return host_moe(L, x, n, k, r, [](int) { return true; });
}

// moe_experts for the given routing; `init`: out's contents before (then accumulate), else out is filled
// with NaNs first; residual: MoeRun::residual (decode, accumulate).
std::vector<float> gpu_moe(const cuda::MoeExperts& e, const std::vector<float>& x, int64_t n, int64_t k,
                           const Routing& r, cuda::MoePath path, const std::vector<float>* init = nullptr,
                           const std::vector<float>* residual = nullptr) {
  const int64_t D = e.n_embd;
  cuda::Stream stream;
  cuda::DeviceBuffer x_dev = to_device(x), ids = to_device(r.ids), w = to_device(r.w),
                     out((size_t)(n * D) * 4), res;
  if (init)
    out.upload(init->data(), init->size() * 4);
  else
    XPERT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
  if (residual) res = to_device(*residual);
  cuda::DeviceBuffer ws(std::max<size_t>(cuda::moe_workspace_bytes(e, n, k), 1));
  cuda::moe_experts(e,
                    {.x = x_dev.as<float>(),
                     .n_tokens = n,
                     .k = k,
                     .ids = ids.as<int32_t>(),
                     .weights = w.as<float>(),
                     .out = out.as<float>(),
                     .accumulate = init != nullptr,
                     .path = path,
                     .residual = residual ? res.as<float>() : nullptr},
                    ws.data(), ws.bytes(), stream);
  stream.sync();
  return from_device<float>(out, (size_t)(n * D));
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t n, int64_t D,
                  double tol) {
  for (int64_t t = 0; t < n; ++t) {
    double e2 = 0, r2 = 0;
    for (int64_t i = 0; i < D; ++i) {
      const double g = got[(size_t)(t * D + i)], w = want[(size_t)(t * D + i)];
      ASSERT_TRUE(std::isfinite(g)) << "token " << t << " element " << i;
      e2 += (g - w) * (g - w);
      r2 += w * w;
    }
    ASSERT_GT(r2, 0.0) << "token " << t;
    EXPECT_LE(std::sqrt(e2 / r2), tol) << "token " << t;
  }
}

constexpr int64_t kD = 2048, kF = 768, kE = 128, kK = 8;
constexpr DType kEveryType[] = {DType::GPTQ4_G128, DType::GPTQ4Z_G128, DType::GPTQ4_G64,
                                DType::GPTQ4Z_G64, DType::GPTQ4_G32,   DType::GPTQ4Z_G32};

// The decode kernels, forced, and the automatic path (the decode kernels up to kMoeGptqDecodePathMaxTokens,
// the grouped GEMMs above).
TEST(CudaMoeGptq, DecodeEveryType) {
  XPERT_REQUIRE_GPU();
  for (const DType t : kEveryType) {
    const GptqLayer L(kD, kF, kE, t, 1000 + (uint64_t)t);
    const auto tables = L.tables(std::vector<bool>(kE, true));
    const cuda::MoeExperts e = L.experts(tables);
    for (const int64_t n : {1, 4, 16, 32}) {
      SCOPED_TRACE(fmt::format("{} n={}", dtype_name(t), n));
      const std::vector<float> x = cudatest::random_values((size_t)(n * kD), 50 + n);
      const Routing r = random_routing(n, kK, kE, 7 + n);
      const std::vector<float> want = all_experts(L, x, n, kK, r);
      expect_close(gpu_moe(e, x, n, kK, r, cuda::MoePath::decode), want, n, kD, 1e-3);
      expect_close(gpu_moe(e, x, n, kK, r, cuda::MoePath::automatic), want, n, kD,
                   n <= cuda::kMoeGptqDecodePathMaxTokens ? 1e-3 : 1e-2);
    }
  }
}

// The grouped GEMMs: few rows an expert (32-row tiles: 4 and 100 tokens x top 8 of 128) and many (64-row
// tiles: 600 tokens), every type at the small counts.
TEST(CudaMoeGptq, GroupedEveryType) {
  XPERT_REQUIRE_GPU();
  for (const DType t : kEveryType) {
    const GptqLayer L(kD, kF, kE, t, 2000 + (uint64_t)t);
    const auto tables = L.tables(std::vector<bool>(kE, true));
    const cuda::MoeExperts e = L.experts(tables);
    const bool big = t == DType::GPTQ4_G128 || t == DType::GPTQ4Z_G32;
    for (const int64_t n : {4, 100, 600}) {
      if (n == 600 && !big) continue;
      SCOPED_TRACE(fmt::format("{} n={}", dtype_name(t), n));
      const std::vector<float> x = cudatest::random_values((size_t)(n * kD), 60 + n);
      const Routing r = random_routing(n, kK, kE, 9 + n);
      const std::vector<float> want = all_experts(L, x, n, kK, r);
      expect_close(gpu_moe(e, x, n, kK, r, cuda::MoePath::grouped), want, n, kD, 1e-2);
      if (n > cuda::kMoeGptqDecodePathMaxTokens)
        expect_close(gpu_moe(e, x, n, kK, r, cuda::MoePath::automatic), want, n, kD, 1e-2);
    }
  }
}

// Half the experts here (even ids; the heterogeneous split): the GPU adds its part to what `out` holds
// (the host's part), decode also with the residual the fused router leaves to it; and no expert here adds
// nothing.
TEST(CudaMoeGptq, ResidentHalfAccumulates) {
  XPERT_REQUIRE_GPU();
  for (const DType t : {DType::GPTQ4_G128, DType::GPTQ4Z_G32}) {
    const GptqLayer L(kD, kF, kE, t, 3000 + (uint64_t)t);
    std::vector<bool> resident(kE);
    for (int64_t i = 0; i < kE; ++i) resident[(size_t)i] = i % 2 == 0;
    const auto tables = L.tables(resident);
    const cuda::MoeExperts e = L.experts(tables);
    for (const int64_t n : {3, 20, 100}) {
      SCOPED_TRACE(fmt::format("{} n={}", dtype_name(t), n));
      const std::vector<float> x = cudatest::random_values((size_t)(n * kD), 70 + n);
      const Routing r = random_routing(n, kK, kE, 11 + n);
      const std::vector<float> want = all_experts(L, x, n, kK, r);
      const std::vector<float> host = host_moe(L, x, n, kK, r, [&](int i) { return !resident[(size_t)i]; });
      expect_close(gpu_moe(e, x, n, kK, r, cuda::MoePath::automatic, &host), want, n, kD,
                   n <= cuda::kMoeGptqDecodePathMaxTokens ? 1e-3 : 1e-2);
      if (n <= cuda::kMoeDecodePathMaxTokens) {  // decode: out = (host - res) + res + the GPU's part
        const std::vector<float> res = cudatest::random_values(host.size(), 80 + n);
        std::vector<float> init(host.size());
        for (size_t i = 0; i < init.size(); ++i) init[i] = host[i] - res[i];
        expect_close(gpu_moe(e, x, n, kK, r, cuda::MoePath::decode, &init, &res), want, n, kD, 1e-3);
      }
    }
    const auto none = L.tables(std::vector<bool>(kE, false));
    const int64_t n = 2;
    const std::vector<float> x = cudatest::random_values((size_t)(n * kD), 9);
    const Routing r = random_routing(n, kK, kE, 5);
    for (cuda::MoePath path : {cuda::MoePath::decode, cuda::MoePath::grouped})
      for (float v : gpu_moe(L.experts(none), x, n, kK, r, path)) ASSERT_EQ(v, 0.0f);
  }
}

// The back-to-back layout: the decode kernels compute every expert's address, so tables that list no
// expert still give the whole layer.
TEST(CudaMoeGptq, DecodeBackToBackLayout) {
  XPERT_REQUIRE_GPU();
  const GptqLayer L(kD, kF, kE, DType::GPTQ4Z_G128, 4000);
  const auto empty = L.tables(std::vector<bool>(kE, false));
  const int64_t n = 4;
  const std::vector<float> x = cudatest::random_values((size_t)(n * kD), 90);
  const Routing r = random_routing(n, kK, kE, 13);
  expect_close(gpu_moe(L.experts(empty, true), x, n, kK, r, cuda::MoePath::decode),
               all_experts(L, x, n, kK, r), n, kD, 1e-3);
}

TEST(CudaMoeGptq, RejectsMixedTypesAndTakesNoNormAfter) {
  cuda::MoeExperts e;
  e.gate_type = e.up_type = DType::GPTQ4_G128;
  e.down_type = DType::Q4_K;
  e.n_embd = 2048;
  e.n_ff = 768;
  e.n_expert = 8;
  const void* table[8] = {};
  e.gate = e.up = e.down = table;  // host pointers: only checked for null
  EXPECT_THROW(cuda::check_moe_experts(e), Error);
  e.down_type = DType::GPTQ4_G128;
  EXPECT_NO_THROW(cuda::check_moe_experts(e));
  EXPECT_FALSE(cuda::moe_norm_out_supported(e));
  e.n_embd = 2048 + 128 + 16;  // not a multiple of 32 (nor of the group)
  EXPECT_THROW(cuda::check_moe_experts(e), Error);
}

}  // namespace
}  // namespace xpert
