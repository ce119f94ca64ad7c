#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "quant/quant.h"

namespace xpert {
namespace {

// Uniform in [-1, 1) from a fixed-seed 64-bit LCG: the same data on every standard library.
std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& f : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    f = (float)((double)(seed >> 40) * 0x1p-23 - 1.0);
  }
  return v;
}

struct Shape {
  int64_t k, n, m;
};

// Real projection widths (640..2560), decode (m=1), small and odd batches, odd n; the 19 x 29 case is
// split over X rows instead of weight rows. k=640 at m=1 is the output projection's shape; k=96 and 160
// give an odd block count (a lone last block in the two-blocks-per-vector decode kernels).
const Shape kShapes[] = {
    {640, 256, 7}, {1024, 512, 3}, {2048, 257, 1}, {2560, 512, 1}, {2560, 66, 64},
    {640, 19, 29}, {640, 1027, 1}, {96, 9, 1},     {96, 9, 2},     {160, 70, 1},
};

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q5_0,
                              DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

class IsaCapGuard {
 public:
  ~IsaCapGuard() { set_isa_cap(Isa::avx512); }
};

TEST(Matmul, EveryIsaMatchesReference) {
  IsaCapGuard guard;
  ThreadPool pool1(1), pool3(3);
  for (DType wt : kWeightTypes) {
    for (const Shape& s : kShapes) {
      if (s.k % dtype_info(wt).block_size != 0) continue;
      // Weights: random values quantized with the reference quantizer, rows at their storage stride.
      const std::vector<float> w_f32 = random_values((size_t)(s.n * s.k), 1000 + s.k + s.n);
      const size_t w_row_bytes = row_bytes(wt, s.k);
      std::vector<uint8_t> w(w_row_bytes * s.n);
      for (int64_t j = 0; j < s.n; ++j)
        quantize_row(wt, w_f32.data() + j * s.k, w.data() + j * w_row_bytes, s.k);
      const std::vector<float> x = random_values((size_t)(s.m * s.k), 7 + s.m);
      const int64_t ldy = s.n + 3;  // a padded output stride
      std::vector<float> ref((size_t)(s.m * ldy), 0.0f);
      cpu::matmul_reference(wt, w.data(), s.n, s.k, x.data(), s.m, ref.data(), ldy);

      // Tolerance: float accumulation error relative to sum |w_l x_l| of the row pair.
      std::vector<float> w_deq((size_t)(s.n * s.k)), x_abs(x.size());
      for (int64_t j = 0; j < s.n; ++j)
        dequantize_row(wt, w.data() + j * w_row_bytes, w_deq.data() + j * s.k, s.k);
      for (size_t i = 0; i < x.size(); ++i) x_abs[i] = std::fabs(x[i]) * 1.01f;  // x's rounding is <1%
      std::vector<double> tol((size_t)(s.m * s.n));
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          double a = 0;
          for (int64_t l = 0; l < s.k; ++l) a += std::fabs(w_deq[j * s.k + l]) * x_abs[i * s.k + l];
          tol[i * s.n + j] = 2e-5 * a + 1e-6;
        }

      for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
        if (!isa_supported(isa)) continue;
        set_isa_cap(isa);
        for (ThreadPool* pool : {&pool1, &pool3}) {
          std::vector<float> y((size_t)(s.m * ldy), -12345.0f);
          cpu::matmul(wt, w.data(), s.n, s.k, x.data(), s.m, y.data(), ldy, *pool);
          int bad = 0;
          for (int64_t i = 0; i < s.m && bad < 5; ++i) {
            for (int64_t j = 0; j < s.n && bad < 5; ++j) {
              const float got = y[i * ldy + j], want = ref[i * ldy + j];
              if (!(std::fabs(got - want) <= tol[i * s.n + j])) {
                ++bad;
                ADD_FAILURE() << dtype_name(wt) << " " << isa_name(isa) << " threads=" << pool->size()
                              << " k=" << s.k << " n=" << s.n << " m=" << s.m << " at [" << i << "][" << j
                              << "]: " << got << " vs " << want << " (tol " << tol[i * s.n + j] << ")";
              }
            }
            // The padding between rows is never written.
            for (int64_t j = s.n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -12345.0f);
          }
        }
      }
    }
  }
}

TEST(Matmul, ReferenceRoundsActivationsLikeLlamaCpp) {
  // One Q8_0 weight row of ones: the product is the sum of X after llama.cpp's x86 Q8_0 rounding of X.
  const int64_t k = 32;
  std::vector<float> ones(k, 1.0f), x(k);
  for (int64_t i = 0; i < k; ++i) x[i] = 0.37f * (float)(i - 11);
  std::vector<uint8_t> w(row_bytes(DType::Q8_0, k)), xq(row_bytes(DType::Q8_0, k));
  quantize_row(DType::Q8_0, ones.data(), w.data(), k);
  quantize_row_activation(DType::Q8_0, x.data(), xq.data(), k);
  std::vector<float> x_rounded(k), w_rounded(k);
  dequantize_row(DType::Q8_0, xq.data(), x_rounded.data(), k);
  dequantize_row(DType::Q8_0, w.data(), w_rounded.data(), k);  // 127 * f16(1/127), not quite 1
  double want = 0;
  for (int64_t i = 0; i < k; ++i) want += (double)w_rounded[i] * x_rounded[i];
  float y = 0;
  cpu::matmul_reference(DType::Q8_0, w.data(), 1, k, x.data(), 1, &y, 1);
  EXPECT_FLOAT_EQ(y, (float)want);
  ThreadPool pool(1);
  float y_fast = 0;
  cpu::matmul(DType::Q8_0, w.data(), 1, k, x.data(), 1, &y_fast, 1, pool);
  EXPECT_NEAR(y_fast, y, 1e-5f * std::fabs(y));
}

TEST(Matmul, EmptyShapesAreNoOps) {
  ThreadPool pool(2);
  float y = 7.0f;
  cpu::matmul(DType::F32, nullptr, 0, 64, nullptr, 1, &y, 1, pool);
  cpu::matmul(DType::F32, nullptr, 1, 64, nullptr, 0, &y, 1, pool);
  EXPECT_EQ(y, 7.0f);
}

}  // namespace
}  // namespace xpert
