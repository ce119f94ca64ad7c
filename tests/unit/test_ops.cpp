// Plain CPU ops against obvious references, on random data of the default model's shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_f16.h"
#include "base/cpu_features.h"
#include "base/half.h"
#include "test_data.h"

namespace xpert::cpu {
namespace {

TEST(Ops, F16KernelsMatchScalarOnEveryIsa) {
  for (int64_t n : {1, 7, 16, 64, 255, 256}) {
    auto a = randn(n, 1), b = randn(n, 2);
    std::vector<uint16_t> bh(n);
    for (int64_t i = 0; i < n; ++i) bh[i] = f32_to_f16(b[i]);
    double ref = 0;
    for (int64_t i = 0; i < n; ++i) ref += (double)a[i] * f16_to_f32(bh[i]);
    EXPECT_NEAR(dot_f16_scalar(a.data(), bh.data(), n), ref, 1e-4 * n);
    if (isa_supported(Isa::avx2)) {
      EXPECT_NEAR(dot_f16_avx2(a.data(), bh.data(), n), ref, 1e-4 * n);
      std::vector<float> acc1(n, 1.0f), acc2(n, 1.0f);
      axpy_f16_scalar(0.37f, bh.data(), acc1.data(), n);
      axpy_f16_avx2(0.37f, bh.data(), acc2.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(acc1[i], acc2[i], 1e-6);
    }
  }
}

TEST(Ops, F16HelpersAvx2MatchScalar) {
  if (!isa_supported(Isa::avx2)) GTEST_SKIP() << "no AVX2";
  for (int64_t n : {1, 9, 64, 1000}) {
    auto x = randn(n, 11, 30.0f);
    auto a = x, b = x;
    round_f16_scalar(a.data(), n);
    round_f16_avx2(b.data(), n);
    EXPECT_EQ(a, b);
    std::vector<float> ya(n), yb(n);
    const float mx = *std::max_element(x.begin(), x.end());
    const double sa = exp_sum_scalar(x.data(), mx, ya.data(), n), sb = exp_sum_avx2(x.data(), mx, yb.data(), n);
    EXPECT_NEAR(sa, sb, 1e-6 * sa);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(ya[i], yb[i], 4e-7f * std::max(ya[i], 1e-30f) + 1e-37f);
    auto up = randn(n, 12);
    std::vector<uint16_t> table(65536);
    for (uint32_t i = 0; i < 65536; ++i) table[i] = (uint16_t)(i ^ 0x1234);  // any table: both must look up the same
    for (auto& t : table) if (((t >> 10) & 0x1f) == 0x1f) t = 0;             // no inf/nan entries
    geglu_scalar(x.data(), up.data(), ya.data(), n, table.data());
    geglu_avx2(x.data(), up.data(), yb.data(), n, table.data());
    EXPECT_EQ(ya, yb);
  }
}

TEST(Ops, RmsNorm) {
  const int64_t n = 640;
  auto x = randn(2 * n, 3, 50.0f), w = randn(n, 4);
  std::vector<float> y(2 * n);
  rmsnorm(x.data(), w.data(), y.data(), 2, n, 1e-6f);
  for (int r = 0; r < 2; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += (double)x[r * n + i] * x[r * n + i];
    const double s = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[r * n + i], x[r * n + i] * s * w[i], 1e-4);
  }
}

TEST(Ops, RopeRotatesPairsAndKeepsNorm) {
  const int64_t H = 2, D = 64;
  for (RopeMode mode : {RopeMode::normal, RopeMode::neox}) {
    auto x = randn(3 * H * D, 5);
    auto y = x;
    const int32_t pos[3] = {0, 1, 1000};
    rope(y.data(), pos, 3, H, D, D, 10000.0f, 1.0f, mode);
    for (int t = 0; t < 3; ++t)
      for (int h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const int64_t a = mode == RopeMode::neox ? i : 2 * i, b = mode == RopeMode::neox ? i + D / 2 : 2 * i + 1;
          const float* xi = x.data() + (t * H + h) * D;
          const float* yi = y.data() + (t * H + h) * D;
          const double th = pos[t] * std::pow(10000.0, -2.0 * i / D);
          EXPECT_NEAR(yi[a], xi[a] * std::cos(th) - xi[b] * std::sin(th), 2e-3) << t << " " << i;
          EXPECT_NEAR(yi[b], xi[a] * std::sin(th) + xi[b] * std::cos(th), 2e-3) << t << " " << i;
        }
  }
}

// Causal (and sliding-window) attention over an f16 cache vs a double-precision reference.
TEST(Ops, AttentionMatchesReference) {
  const int64_t T = 9, H = 4, HKV = 2, D = 64, P0 = 5, NKV = P0 + T;
  for (int window : {0, 4}) {
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      auto q = randn(T * H * D, 7), kf = randn(NKV * HKV * D, 8), vf = randn(NKV * HKV * D, 9);
      std::vector<uint16_t> k(kf.size()), v(vf.size());
      for (size_t i = 0; i < kf.size(); ++i) k[i] = f32_to_f16(kf[i]), v[i] = f32_to_f16(vf[i]);
      std::vector<int32_t> pos(T);
      for (int t = 0; t < T; ++t) pos[t] = P0 + t;
      std::vector<float> out(T * H * D);
      attention({.q = q.data(), .k = k.data(), .v = v.data(), .out = out.data(), .pos = pos.data(), .n_tokens = T,
                 .n_head = H, .n_head_kv = HKV, .head_dim = D, .n_kv = NKV, .kq_scale = 0.125f, .sliding_window = window},
                pool);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t hk = h / (H / HKV);
          std::vector<double> s;
          int64_t lo = window ? std::max<int64_t>(0, pos[t] - window + 1) : 0;
          for (int64_t j = lo; j <= pos[t]; ++j) {
            double d = 0;
            for (int64_t c = 0; c < D; ++c) d += q[(t * H + h) * D + c] * f16_to_f32(k[(j * HKV + hk) * D + c]);
            s.push_back(d * 0.125);
          }
          double mx = *std::max_element(s.begin(), s.end()), sum = 0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int64_t c = 0; c < D; ++c) {
            double o = 0;
            for (size_t j = 0; j < s.size(); ++j) o += s[j] / sum * f16_to_f32(v[((lo + j) * HKV + hk) * D + c]);
            EXPECT_NEAR(out[(t * H + h) * D + c], o, 3e-3) << "t=" << t << " h=" << h << " window=" << window;
          }
        }
    }
  }
}

TEST(Ops, GegluUsesGeluTanh) {
  const float gate[] = {-20.0f, -1.0f, 0.0f, 0.5f, 3.0f, 12.0f}, up[] = {2, 2, 2, 2, 2, 2};
  float y[6];
  geglu(gate, up, y, 6);
  for (int i = 0; i < 6; ++i) {
    const double g = gate[i];
    const double ref = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * 2;
    EXPECT_NEAR(y[i], ref, 2e-3 * std::max(1.0, std::fabs(ref)));
  }
}

}  // namespace
}  // namespace xpert::cpu
