#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace xpert {
namespace {

using namespace quant;

// A tiny PCG-style generator that Python reproduces exactly (fixtures below come from gguf-py).
struct Lcg {
  uint64_t x;
  uint64_t next() { return x = x * 6364136223846793005ull + 1442695040888963407ull; }
  uint8_t byte() { return (uint8_t)(next() >> 56); }
  float uniform4() { return (float)(((double)(next() >> 40) * 0x1p-24 - 0.5) * 4.0); }  // [-2, 2)
};

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 0x100000001b3ull;
  return h;
}

std::vector<float> gaussian_like(size_t n, uint64_t seed) {
  Lcg g{seed};
  std::vector<float> v(n);
  for (auto& f : v) f = (g.uniform4() + g.uniform4() + g.uniform4()) * 0.5f;  // roughly normal, sd ~1
  return v;
}

double relative_rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (double)(a[i] - b[i]) * (a[i] - b[i]);
    ref += (double)a[i] * a[i];
  }
  return std::sqrt(err / ref);
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, (int64_t)x.size()));
  std::vector<float> y(x.size());
  quantize_row(t, x.data(), q.data(), (int64_t)x.size());
  dequantize_row(t, q.data(), y.data(), (int64_t)x.size());
  return y;
}

TEST(Quant, RoundTripErrorBounds) {
  // Bounds sit ~25% above the relative RMSE each format reaches on Gaussian data.
  const struct {
    DType t;
    double max_rel_rmse;
  } cases[] = {
      {DType::F32, 0.0},     {DType::F16, 2.7e-4},  {DType::BF16, 2.1e-3}, {DType::Q8_0, 6.3e-3},
      {DType::Q4_0, 0.10},   {DType::Q5_0, 0.050},  {DType::Q4_K, 0.085},  {DType::Q5_K, 0.043},
      {DType::Q6_K, 0.021},  {DType::Q8_K, 7.5e-3},
  };
  const std::vector<float> x = gaussian_like(256 * 64, 1);
  for (const auto& c : cases) {
    const double e = relative_rmse(x, round_trip(c.t, x));
    EXPECT_LE(e, c.max_rel_rmse) << dtype_name(c.t);
    if (c.t != DType::F32) {
      EXPECT_GT(e, c.max_rel_rmse / 4) << dtype_name(c.t) << ": bound too loose";
    }
  }
}

TEST(Quant, BlockwiseErrorWithinHalfStep) {
  // Symmetric 32-blocks round to the nearest level: every element is within half a step of its value.
  const std::vector<float> x = gaussian_like(32 * 200, 2);
  for (DType t : {DType::Q4_0, DType::Q5_0, DType::Q8_0}) {
    std::vector<uint8_t> q(row_bytes(t, (int64_t)x.size()));
    std::vector<float> y(x.size());
    quantize_row(t, x.data(), q.data(), (int64_t)x.size());
    dequantize_row(t, q.data(), y.data(), (int64_t)x.size());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      uint16_t d_bits;
      std::memcpy(&d_bits, q.data() + b * dtype_info(t).block_bytes, 2);
      const float step = std::fabs(f16_to_f32(d_bits));
      for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
        // +1% for the f16 rounding of the scale; Q4_0/Q5_0 clip the top level of the non-max sign.
        const float slack = (t == DType::Q8_0) ? 0.51f * step + 1e-3f * std::fabs(x[j]) : 1.02f * step;
        ASSERT_LE(std::fabs(x[j] - y[j]), slack) << dtype_name(t) << " element " << j;
      }
    }
  }
}

TEST(Quant, ZeroRowsStayZero) {
  const std::vector<float> zeros(512, 0.0f);
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::Q8_K}) {
    for (float v : round_trip(t, zeros)) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

// Quantizer bytes against gguf-py 0.19 (its numpy quantizers are bit-exact with ggml's *_ref ones):
//   x[i] = lcg(7).uniform4(), 1024 values; fixture = fnv1a(quantized bytes).
TEST(Quant, QuantizeMatchesGgufPy) {
  const struct {
    DType t;
    uint64_t fnv;
  } cases[] = {
      {DType::Q4_0, 0x1eb8ed904669687bull},
      {DType::Q5_0, 0xca23cb8b6c6364a7ull},
      {DType::Q8_0, 0xecbe9fd63349855bull},
      {DType::BF16, 0x911475d488bcfa3cull},
  };
  Lcg g{7};
  std::vector<float> x(1024);
  for (auto& f : x) f = g.uniform4();
  for (const auto& c : cases) {
    std::vector<uint8_t> q(row_bytes(c.t, 1024));
    quantize_row(c.t, x.data(), q.data(), 1024);
    EXPECT_EQ(fnv1a(q.data(), q.size()), c.fnv) << dtype_name(c.t);
  }
}

// Quantizer bytes against ggml itself: quantize_row_*_ref of libggml-base 0.25.3 (llama-cpp-python 0.3.36),
// called through ctypes on x = lcg(7).uniform4() x 1024 with x[256..511] *= 0.01f and x[512..767] = 0.
// For Q8_0 ggml-cpu's x86 quantize_row_q8_0 gives the same bytes on this data (no exact ties).
TEST(Quant, QuantizeMatchesGgmlRef) {
  const struct {
    DType t;
    uint64_t fnv;
  } cases[] = {
      {DType::Q4_0, 0x34abff492efe99b8ull}, {DType::Q5_0, 0x7b4402ca55cffb53ull},
      {DType::Q8_0, 0x9d461dcfc27b82c2ull}, {DType::Q4_K, 0xc16f54bde140131dull},
      {DType::Q5_K, 0x3ba1841311fd667bull}, {DType::Q6_K, 0x46093f61729e91a7ull},
      {DType::Q8_K, 0x4888bcc92788b785ull},
  };
  Lcg g{7};
  std::vector<float> x(1024);
  for (auto& f : x) f = g.uniform4();
  for (int i = 256; i < 512; ++i) x[i] *= 0.01f;
  for (int i = 512; i < 768; ++i) x[i] = 0.0f;
  for (const auto& c : cases) {
    std::vector<uint8_t> q(row_bytes(c.t, 1024));
    quantize_row(c.t, x.data(), q.data(), 1024);
    EXPECT_EQ(fnv1a(q.data(), q.size()), c.fnv) << dtype_name(c.t);
    if (c.t == DType::Q8_0) {
      quantize_row_activation(c.t, x.data(), q.data(), 1024);
      EXPECT_EQ(fnv1a(q.data(), q.size()), c.fnv) << "Q8_0 activation";
    }
  }
}

// Dequantization of random blocks against gguf-py's independent numpy decoder: random bytes from lcg(11),
// then every f16 scale field replaced by 0x2000 | (lcg >> 53 & 0x7ff) (positive, ~2^-7) so values are finite.
// Fixture: sum(y) and sum(y[i] * ((7i mod 31) - 15)), which catch any misplaced element or scale.
TEST(Quant, DequantizeMatchesGgufPy) {
  const struct {
    DType t;
    std::vector<size_t> scale_offsets;
    double sum, weighted_sum;
  } cases[] = {
      {DType::Q4_0, {0}, -8.880775451660156, 0.8992080688476562},
      {DType::Q5_0, {0}, -6.291656494140625, -33.664955139160156},
      {DType::Q8_0, {0}, -35.863922119140625, 454.3719940185547},
      {DType::Q4_K, {0, 2}, 2594.4534225463867, 366.9483413696289},
      {DType::Q5_K, {0, 2}, 7837.274963378906, -292.27403259277344},
      {DType::Q6_K, {208}, 154.910400390625, -3503.3976135253906},
  };
  constexpr int64_t n = 1024;
  for (const auto& c : cases) {
    const DTypeInfo& info = dtype_info(c.t);
    const int64_t n_blocks = n / info.block_size;
    Lcg g{11};
    std::vector<uint8_t> raw(n_blocks * info.block_bytes);
    for (auto& b : raw) b = g.byte();
    for (int64_t b = 0; b < n_blocks; ++b) {
      for (size_t off : c.scale_offsets) {
        const uint16_t v = (uint16_t)(0x2000 | ((g.next() >> 53) & 0x7ff));
        std::memcpy(raw.data() + b * info.block_bytes + off, &v, 2);
      }
    }
    std::vector<float> y(n);
    dequantize_row(c.t, raw.data(), y.data(), n);
    double sum = 0, weighted = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += y[i];
      weighted += y[i] * (double)((7 * i) % 31 - 15);
    }
    EXPECT_NEAR(sum, c.sum, 1e-9 * std::fabs(c.sum) + 1e-9) << dtype_name(c.t);
    EXPECT_NEAR(weighted, c.weighted_sum, 1e-9 * std::fabs(c.weighted_sum) + 1e-9) << dtype_name(c.t);
  }
}

TEST(Quant, Q4_0KnownBlock) {
  BlockQ4_0 b;
  b.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::Q4_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8));
    EXPECT_EQ(y[j + 16], 0.5f * (7 - j));
  }
  // Quantizing it back: the element of largest magnitude (-4, first) maps to level 0 exactly.
  BlockQ4_0 back;
  quantize_row(DType::Q4_0, y, &back, 32);
  EXPECT_EQ(back.d, b.d);
  EXPECT_EQ(0, std::memcmp(back.qs, b.qs, 16));
}

TEST(Quant, Q5_0KnownBlock) {
  BlockQ5_0 b;
  b.d = f32_to_f16(0.25f);
  const uint32_t qh = 0xF0F0A5A5u;
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = (uint8_t)((j * 3 % 16) | ((j * 5 % 16) << 4));
  float y[32];
  dequantize_row(DType::Q5_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * (((j * 3 % 16) | (int)((qh >> j) & 1) << 4) - 16)) << j;
    EXPECT_EQ(y[j + 16], 0.25f * (((j * 5 % 16) | (int)((qh >> (j + 16)) & 1) << 4) - 16)) << j;
  }
}

TEST(Quant, Q4_KKnownBlockUsesSixBitScales) {
  // Scales and mins above 15 exercise the split high bits of sub-blocks 4..7.
  const uint8_t sc[8] = {1, 2, 3, 63, 17, 33, 48, 62};
  const uint8_t mn[8] = {0, 5, 63, 7, 40, 16, 1, 59};
  BlockQ4_K b{};
  b.d = f32_to_f16(0.125f);
  b.dmin = f32_to_f16(0.0625f);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  for (int j = 0; j < 128; ++j) b.qs[j] = (uint8_t)(j * 37);
  float y[256];
  dequantize_row(DType::Q4_K, &b, y, 256);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 32, c = i / 64, l = i % 32;
    const int q = (b.qs[32 * c + l] >> (4 * (s % 2))) & 0xF;
    EXPECT_EQ(y[i], 0.125f * sc[s] * q - 0.0625f * mn[s]) << i;
  }
}

TEST(Quant, Q6_KKnownBlock) {
  BlockQ6_K b{};
  b.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) b.scales[j] = (int8_t)(j * 9 - 70);
  for (int j = 0; j < 128; ++j) b.ql[j] = (uint8_t)(j * 29 + 3);
  for (int j = 0; j < 64; ++j) b.qh[j] = (uint8_t)(j * 53 + 1);
  float y[256];
  dequantize_row(DType::Q6_K, &b, y, 256);
  for (int i = 0; i < 256; ++i) {
    const int c = i / 128, g = (i % 128) / 32, l = i % 32;
    const int lo = (b.ql[64 * c + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xF;
    const int hi = (b.qh[32 * c + l] >> (2 * g)) & 3;
    EXPECT_EQ(y[i], 0.5f * b.scales[i / 16] * ((lo | (hi << 4)) - 32)) << i;
  }
}

TEST(Quant, Q8_KActivationKnownBlock) {
  float x[256];
  for (int i = 0; i < 256; ++i) x[i] = (float)(i - 100) * 0.5f;  // max magnitude: x[255] = 77.5
  BlockQ8_K b;
  quantize_row(DType::Q8_K, x, &b, 256);
  // ggml maps the signed maximum to -127, so a positive maximum gives a negative scale.
  EXPECT_FLOAT_EQ(b.d, -77.5f / 127.f);
  EXPECT_EQ(b.qs[255], -127);
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
    EXPECT_EQ(b.bsums[g], sum);
  }
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(b.qs[i], x[i] / b.d, 0.5f + 1e-4f);
}

TEST(Quant, Q8_0ActivationRoundsLikeGgmlX86) {
  // amax = 127 makes both multipliers exactly 1: ties show the rounding rule. ggml's _ref rounds half away
  // from zero; its x86 SIMD path (what matmul reproduces) rounds half to even.
  float x[32] = {};
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -3.5f;
  x[3] = 0.5f;
  BlockQ8_0 ref, act;
  quantize_row(DType::Q8_0, x, &ref, 32);
  quantize_row_activation(DType::Q8_0, x, &act, 32);
  EXPECT_EQ(ref.qs[1], 3);
  EXPECT_EQ(act.qs[1], 2);
  EXPECT_EQ(ref.qs[2], -4);
  EXPECT_EQ(act.qs[2], -4);
  EXPECT_EQ(ref.qs[3], 1);
  EXPECT_EQ(act.qs[3], 0);
  EXPECT_EQ(ref.d, act.d);
}

TEST(Quant, ActivationTypes) {
  EXPECT_EQ(activation_type(DType::Q4_0), DType::Q8_0);
  EXPECT_EQ(activation_type(DType::Q5_0), DType::Q8_0);
  EXPECT_EQ(activation_type(DType::Q8_0), DType::Q8_0);
  EXPECT_EQ(activation_type(DType::Q4_K), DType::Q8_K);
  EXPECT_EQ(activation_type(DType::Q5_K), DType::Q8_K);
  EXPECT_EQ(activation_type(DType::Q6_K), DType::Q8_K);
  EXPECT_EQ(activation_type(DType::F16), DType::F16);
  EXPECT_EQ(activation_type(DType::BF16), DType::BF16);
  EXPECT_EQ(activation_type(DType::F32), DType::F32);
}

}  // namespace
}  // namespace xpert
