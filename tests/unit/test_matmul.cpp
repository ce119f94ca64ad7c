#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "test_data.h"

namespace xpert {
namespace {

struct Shape {
  int64_t k, n, m;
};

// Real projection widths (640..2560), decode (m=1), small and odd batches, odd n; the 19 x 29 case is
// split over X rows instead of weight rows. k=640 at m=1 is the output projection's shape; k=96 and 160
// give an odd block count (a lone last block in the two-blocks-per-vector decode kernels).
// From 8 X rows on AVX-512 takes the panel kernels (16 weight rows repacked, X rows in tiles of 8): the
// m = 29, 37, 13 and 64 cases cover a partial last panel (n % 16) and every tile height.
const Shape kShapes[] = {
    {640, 256, 7}, {1024, 512, 3}, {2048, 257, 1}, {2560, 512, 1}, {2560, 66, 64}, {640, 19, 29},
    {640, 1027, 1}, {96, 9, 1},    {96, 9, 2},     {160, 70, 1},   {1024, 40, 37}, {2048, 33, 13},
    {512, 16, 8},   {256, 1, 9},
    // Decode at the MoE and default-model widths, n not a multiple of the 8-row decode tiles.
    {4096, 45, 1},  {1024, 523, 1}, {512, 1029, 1}, {640, 13, 1},   {2048, 7, 1},
};

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q5_0,
                              DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

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

// X rows for the packing test: random blocks, plus an all-zero block, a block whose largest magnitude
// appears twice with both signs (Q8_K keeps the first), and tiny and huge values.
std::vector<float> awkward_row(int64_t k, uint64_t seed) {
  std::vector<float> x = random_values((size_t)k, seed);
  for (int64_t i = 0; i < 32; ++i) x[i] = 0.0f;
  x[300] = -1.5f;
  x[301] = 1.5f;
  for (int64_t i = 320; i < 352; ++i) x[i] *= 1e-30f;
  for (int64_t i = 512; i < 544; ++i) x[i] *= 1e4f;
  return x;
}

TEST(Matmul, FastPackingMatchesActivationQuantizers) {
  if (!isa_supported(Isa::avx512)) GTEST_SKIP() << "no AVX-512 VNNI";
  const int64_t k = 1024;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const std::vector<float> x = awkward_row(k, seed);
    {
      std::vector<quant::BlockQ8_0> ref(k / 32);
      quantize_row_activation(DType::Q8_0, x.data(), ref.data(), k);
      const cpu::PackedLayout l{.d_offset = (size_t)k, .sum_offset = (size_t)k + 4 * (k / 32), .aux_offset = 0,
                                .row_bytes = (size_t)k + 8 * (k / 32)};
      std::vector<uint8_t> out(l.row_bytes);
      cpu::pack_row_q8_0_avx512(x.data(), k, l, 16, out.data());
      for (int64_t b = 0; b < k / 32; ++b) {
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
          ASSERT_EQ((int8_t)out[32 * b + j], ref[b].qs[j]) << "Q8_0 block " << b << " element " << j;
          sum += ref[b].qs[j];
        }
        float d;
        int32_t neg_sum;
        std::memcpy(&d, out.data() + l.d_offset + 4 * b, 4);
        std::memcpy(&neg_sum, out.data() + l.sum_offset + 4 * b, 4);
        EXPECT_EQ(f32_to_bits(d), f32_to_bits(f16_to_f32(ref[b].d))) << "Q8_0 block " << b;
        EXPECT_EQ(neg_sum, -sum) << "Q8_0 block " << b;
      }
    }
    {
      std::vector<quant::BlockQ8_K> ref(k / 256);
      quantize_row_activation(DType::Q8_K, x.data(), ref.data(), k);
      const cpu::PackedLayout l{.d_offset = (size_t)k, .sum_offset = (size_t)k + 4 * (k / 256), .aux_offset = 0,
                                .row_bytes = (size_t)k + 4 * (k / 256) + 2 * (k / 16)};
      std::vector<uint8_t> out(l.row_bytes);
      cpu::pack_row_q8_k_avx512(x.data(), k, l, out.data());
      for (int64_t b = 0; b < k / 256; ++b) {
        for (int j = 0; j < 256; ++j) ASSERT_EQ((int8_t)out[256 * b + j], ref[b].qs[j]) << "Q8_K block " << b << " element " << j;
        float d;
        std::memcpy(&d, out.data() + l.d_offset + 4 * b, 4);
        EXPECT_EQ(f32_to_bits(d), f32_to_bits(ref[b].d)) << "Q8_K block " << b;
        for (int g = 0; g < 16; ++g) {
          int16_t s;
          std::memcpy(&s, out.data() + l.sum_offset + 2 * (16 * b + g), 2);
          EXPECT_EQ(s, ref[b].bsums[g]) << "Q8_K block " << b << " group " << g;
        }
      }
    }
  }
}

// Decode (one X row) of the quantized types on AVX-512 runs 512-bit kernels, small batches (2..7 rows) the
// 256-bit tiles, or for Q4_K and Q6_K the decode kernels over 2-3 X rows at once (on AVX2 both are tiles,
// of other heights); they sum in the same order, so a token's result does not depend on the batch it came
// in (the MoE and server tests rely on it).
TEST(Matmul, QuantizedDecodeHasTheSmallBatchBits) {
  IsaCapGuard guard;
  ThreadPool pool(1);
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    set_isa_cap(isa);
    for (DType wt : {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
      for (int64_t m : {2, 3, 4, 5, 7}) {
        const int64_t k = 1024, n = 45;
        const std::vector<float> w_f32 = random_values((size_t)(n * k), 31);
        const size_t rb = row_bytes(wt, k);
        std::vector<uint8_t> w(rb * n);
        for (int64_t j = 0; j < n; ++j) quantize_row(wt, w_f32.data() + j * k, w.data() + j * rb, k);
        const std::vector<float> x = random_values((size_t)(m * k), 32);
        std::vector<float> batch((size_t)(m * n)), one((size_t)n);
        cpu::matmul(wt, w.data(), n, k, x.data(), m, batch.data(), n, pool);
        for (int64_t i = 0; i < m; ++i) {
          cpu::matmul(wt, w.data(), n, k, x.data() + i * k, 1, one.data(), n, pool);
          for (int64_t j = 0; j < n; ++j)
            ASSERT_EQ(one[j], batch[i * n + j])
                << dtype_name(wt) << " " << isa_name(isa) << " m " << m << " row " << i << " col " << j;
        }
      }
  }
}

// matmul_batch (a MoE step's experts, a layer's q/k/v through CpuBackend::matmuls) gives each job the bits
// matmul gives it alone: the same tile kernels over the same packed X, whatever the chunking. Jobs of
// several types, two sharing x and one on another x, 1..7 X rows, 1 and 2 threads.
TEST(Matmul, BatchHasTheBitsOfSeparateProducts) {
  const int64_t k = 1024;
  struct Job {
    DType t;
    int64_t n;
    int x;  // which X
  };
  const Job kJobs[] = {{DType::Q4_K, 300, 0}, {DType::Q6_K, 77, 0}, {DType::Q8_0, 129, 1}, {DType::F32, 5, 0},
                       {DType::Q4_0, 64, 0}};
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (int64_t m : {1, 3, 7}) {
      const std::vector<float> x0 = random_values((size_t)(m * k), 40 + m), x1 = random_values((size_t)(m * k), 50 + m);
      std::vector<std::vector<uint8_t>> w;
      std::vector<std::vector<float>> got, want;
      std::vector<cpu::MatmulJob> batch;
      for (const Job& j : kJobs) {
        const std::vector<float> wf = random_values((size_t)(j.n * k), 60 + j.n);
        const size_t rb = row_bytes(j.t, k);
        w.emplace_back(rb * j.n);
        for (int64_t r = 0; r < j.n; ++r) quantize_row(j.t, wf.data() + r * k, w.back().data() + r * rb, k);
      }
      for (size_t i = 0; i < std::size(kJobs); ++i) {
        const Job& j = kJobs[i];
        const float* x = j.x ? x1.data() : x0.data();
        got.emplace_back((size_t)(m * j.n), -1.0f);
        want.emplace_back((size_t)(m * j.n));
        cpu::matmul(j.t, w[i].data(), j.n, k, x, m, want.back().data(), j.n, pool);
      }
      for (size_t i = 0; i < std::size(kJobs); ++i)
        batch.push_back({.w_type = kJobs[i].t, .w = w[i].data(), .n = kJobs[i].n, .k = k,
                         .x = kJobs[i].x ? x1.data() : x0.data(), .m = m, .y = got[i].data(), .ldy = kJobs[i].n});
      cpu::matmul_batch(batch, pool);
      for (size_t i = 0; i < std::size(kJobs); ++i)
        EXPECT_EQ(got[i], want[i]) << dtype_name(kJobs[i].t) << " m " << m << " threads " << threads;
    }
  }
}

// With set_batch_invariant (what `xpert serve` runs), a row's result has the same bits at every batch size:
// 1 row, a few, and the 8+ rows a prefill chunk brings that take the panel kernels otherwise (issue #37: a
// seeded request's text changed with the traffic batched with it).
TEST(Matmul, BatchInvariantRowsHaveTheBitsOfOneRow) {
  IsaCapGuard guard;
  struct Reset {
    ~Reset() { cpu::set_batch_invariant(false); }
  } reset;
  ThreadPool pool(3);
  const int64_t k = 1024, n = 70;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    set_isa_cap(isa);
    for (DType wt : kWeightTypes) {
      const std::vector<float> w_f32 = random_values((size_t)(n * k), 70);
      const size_t rb = row_bytes(wt, k);
      std::vector<uint8_t> w(rb * n);
      for (int64_t j = 0; j < n; ++j) quantize_row(wt, w_f32.data() + j * k, w.data() + j * rb, k);
      const int64_t m_max = 300;  // past kAmxMinRows too
      const std::vector<float> x = random_values((size_t)(m_max * k), 71);
      std::vector<float> one((size_t)n);
      cpu::set_batch_invariant(true);
      cpu::matmul(wt, w.data(), n, k, x.data(), 1, one.data(), n, pool);
      int differing_before = 0;
      for (int64_t m : {2, 7, 8, 29, 64, 300}) {
        std::vector<float> batch((size_t)(m * n));
        cpu::set_batch_invariant(true);
        cpu::matmul(wt, w.data(), n, k, x.data(), m, batch.data(), n, pool);
        int bad = 0;
        for (int64_t j = 0; j < n; ++j) bad += one[j] != batch[j];
        EXPECT_EQ(bad, 0) << dtype_name(wt) << " " << isa_name(isa) << " m " << m;
        cpu::set_batch_invariant(false);
        cpu::matmul(wt, w.data(), n, k, x.data(), m, batch.data(), n, pool);
        for (int64_t j = 0; j < n; ++j) differing_before += one[j] != batch[j];
      }
      // Without it too: every kernel, AVX-512's panels included, takes one float order per row.
      EXPECT_EQ(differing_before, 0) << dtype_name(wt) << " " << isa_name(isa);
    }
  }
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
