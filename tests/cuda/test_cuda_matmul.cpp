// CUDA matmul (decode matrix-vector and prefill tensor-core paths) and get_rows against the CPU
// references, for every weight type, on real shapes.
//
// Two kinds of X:
//  * exact: X = c * q with integer q in [-127, 127] and a +-127 in every 32-block, so every activation
//    quantizer involved (the CPU's Q8_0 / Q8_K, the GPU's q8_1, f16, bf16) represents X exactly. What is
//    left is the kernel itself: each element must be within tol * |w_j| |x_i| of the reference, tol =
//    2e-5 (f32 accumulation order) except where the prefill path rounds dequantized block weights to
//    f16: 5e-4 (2^-11 relative per weight, the worst case).
//  * random: uniform X, where the GPU's q8_1 (32-blocks) and the CPU's Q8_K (256-blocks) round X
//    differently: |y - ref| / |ref| over the whole output <= 1.5e-2 for block types (about 0.5 % seen
//    from the two int8 roundings), 1e-4 for float types (X rounded the same way on both sides).
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cuda/embed.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_kernels.h"
#include "cuda_test_util.h"

namespace xpert {
namespace {

using cudatest::from_device;
using cudatest::to_device;

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q5_0,
                        DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

struct Shape {
  int64_t k, n;
  std::vector<int64_t> ms;
};

// Real projection shapes (qwen3-30b-a3b: n_embd 2048, n_ff_exp 768, 4096-wide q / attention output, 512
// for k / v, the 151936-word output matrix), plus odd sizes: n not a multiple of any tile, m not a
// multiple of 64, 9-32 rows (the matrix-vector kernels, several CTA rows), and k = 33 blocks (a
// half-filled last tensor-core step) for the 32-element types. 33-129 rows of the k = 2048 / 4096 shapes fill
// few SMs: their k is split over a thread block cluster on sm_90 (matmul_prefill.cu k_split).
const Shape kShapes[] = {
    {2048, 768, {1, 2, 7, 16, 64, 512}}, {768, 2048, {1, 2, 7, 32, 64, 512}},
    {4096, 512, {1, 2, 7, 33, 64, 128, 129, 512}}, {2048, 151936, {1, 2, 7, 64, 512}},
    {512, 100, {3, 9, 17, 65}},          {1056, 70, {5, 8, 31, 70}},
};

bool block_fits(DType t, int64_t k) {
  if (k % dtype_info(t).block_size != 0) return false;
  return t == DType::F32 ? k % 4 == 0 : k % 8 == 0;
}

// Rows compared: all, or three slices of the big output matrix.
std::vector<std::pair<int64_t, int64_t>> checked_rows(int64_t n) {
  if (n <= 8192) return {{0, n}};
  return {{0, 256}, {n / 2, n / 2 + 256}, {n - 256, n}};
}

std::vector<float> exact_x(int64_t m, int64_t k, uint64_t seed) {
  std::vector<float> x((size_t)(m * k));
  uint64_t s = seed;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) {
      int q = (int)(cudatest::lcg_next(s) % 255) - 127;
      if (l % 32 == (i * 7 + l / 32) % 32) q = (cudatest::lcg_next(s) & 1) ? 127 : -127;
      x[i * k + l] = (float)q * 0x1p-7f;
    }
  return x;
}

double norm2(const float* v, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (double)v[i] * v[i];
  return std::sqrt(s);
}

// The output head streamed through shared memory by bulk copies (matmul_stream.cu: the default on sm_90
// for one product of a Q6_K head of a multiple of 16 rows) against the decode form's lanes (which it takes
// as one output of several in one launch): the same bits. Qwen3's head, and a row count that leaves the
// CTAs' last groups uneven.
TEST(CudaMatmulHead, StreamedIsTheDecodeFormBitForBit) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t k = 2048, n_extra = 16;
  for (const int64_t n : {int64_t{151936}, int64_t{65536 + 16 * 1001}}) {
    SCOPED_TRACE(fmt::format("n={}", n));
    const std::vector<uint8_t> w = cudatest::random_weights(DType::Q6_K, n, k, 4321);
    cuda::DeviceBuffer w_dev = cudatest::weights_to_device(w, DType::Q6_K, k, n);
    cuda::DeviceBuffer x_dev = to_device(cudatest::random_values((size_t)k, 17));
    const cuda::ActFormat f = cuda::activation_format(DType::Q6_K, 1);
    cuda::DeviceBuffer act(std::max<size_t>(cuda::activation_bytes(f, 1, k), 1));
    const cuda::Activations a = cuda::quantize_activations(f, x_dev.as<float>(), k, 1, k, act.data(), stream);
    cuda::DeviceBuffer y_streamed((size_t)n * 4), y_lanes((size_t)n * 4), y_extra((size_t)n_extra * 4);
    for (cuda::DeviceBuffer* y : {&y_streamed, &y_lanes})
      XPERT_CUDA_CHECK(cudaMemset(y->data(), 0xFF, y->bytes()));
    cuda::matmul_prepared(DType::Q6_K, w_dev.data(), n, a, y_streamed.as<float>(), n, stream);
    const cuda::MatmulOut outs[2] = {
        {.w = w_dev.data(), .n = n, .y = y_lanes.as<float>(), .ldy = n},
        {.w = w_dev.data(), .n = n_extra, .y = y_extra.as<float>(), .ldy = n_extra}};
    cuda::matmul_prepared_multi(DType::Q6_K, outs, 2, a, stream);
    stream.sync();
    const std::vector<float> ys = from_device<float>(y_streamed, (size_t)n),
                             yl = from_device<float>(y_lanes, (size_t)n);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(std::bit_cast<uint32_t>(ys[j]), std::bit_cast<uint32_t>(yl[j])) << "row " << j;
  }
}

class CudaMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CudaMatmul, MatchesReference) {
  XPERT_REQUIRE_GPU();
  const DType t = GetParam();
  cuda::Stream stream;
  for (const Shape& s : kShapes) {
    if (!block_fits(t, s.k)) continue;
    const std::vector<uint8_t> w = cudatest::random_weights(t, s.n, s.k, 1234 + s.k + s.n);
    cuda::DeviceBuffer w_dev = cudatest::weights_to_device(w, t, s.k, s.n);
    const auto rows = checked_rows(s.n);
    const size_t rb = row_bytes(t, s.k);
    std::vector<double> w_norm((size_t)s.n, 0.0);
    {
      std::vector<float> deq((size_t)s.k);
      for (auto [j0, j1] : rows)
        for (int64_t j = j0; j < j1; ++j) {
          dequantize_row(t, w.data() + j * rb, deq.data(), s.k);
          w_norm[j] = norm2(deq.data(), s.k);
        }
    }
    for (int64_t m : s.ms) {
      for (bool exact : {true, false}) {
        if (!exact && m != 7 && m != 64 && m != 65)
          continue;  // the random-X check: one decode, one prefill m
        SCOPED_TRACE(
            fmt::format("{} k={} n={} m={} {}", dtype_name(t), s.k, s.n, m, exact ? "exact X" : "random X"));
        const std::vector<float> x =
            exact ? exact_x(m, s.k, 99 + m) : cudatest::random_values((size_t)(m * s.k), 5 + m);
        const int64_t ldy = s.n + 3;
        std::vector<float> ref((size_t)(m * ldy), 0.0f);
        for (auto [j0, j1] : rows)
          cudatest::reference_rows(t, w.data(), s.k, x.data(), m, ref.data(), ldy, j0, j1);

        cuda::DeviceBuffer x_dev = to_device(x);
        cuda::DeviceBuffer y_dev((size_t)(m * ldy) * 4);
        XPERT_CUDA_CHECK(cudaMemset(y_dev.data(), 0xFF, y_dev.bytes()));  // NaN: unwritten outputs show
        cuda::DeviceBuffer ws(std::max<size_t>(cuda::matmul_workspace_bytes(t, m, s.k), 1));
        cuda::matmul(t, w_dev.data(), s.n, s.k, x_dev.as<float>(), m, y_dev.as<float>(), ldy, ws.data(),
                     ws.bytes(), stream);
        stream.sync();
        const std::vector<float> y = from_device<float>(y_dev, (size_t)(m * ldy));

        const bool prefill_rounds_w = m > cuda::kMatvecMaxRows && t != DType::F32 && t != DType::F16 &&
                                      t != DType::BF16 && s.k % 32 == 0;
        const double tol = prefill_rounds_w ? 5e-4 : 2e-5;
        int bad = 0;
        double err2 = 0, ref2 = 0;
        for (int64_t i = 0; i < m; ++i) {
          const double x_norm = norm2(x.data() + i * s.k, s.k);
          for (auto [j0, j1] : rows)
            for (int64_t j = j0; j < j1; ++j) {
              const double got = y[i * ldy + j], want = ref[i * ldy + j];
              err2 += (got - want) * (got - want);
              ref2 += want * want;
              const bool ok =
                  std::isfinite(got) && (!exact || std::fabs(got - want) <= tol * w_norm[j] * x_norm + 1e-6);
              if (!ok && ++bad <= 5)
                ADD_FAILURE() << "y[" << i << "][" << j << "] = " << got << ", reference " << want;
            }
        }
        EXPECT_EQ(bad, 0);
        if (!exact) {
          const bool float_w = t == DType::F32 || t == DType::F16 || t == DType::BF16;
          EXPECT_LE(std::sqrt(err2 / ref2), float_w ? 1e-4 : 1.5e-2);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatmul, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Prepared activations reused across products equal the one-call matmul, bit for bit.
TEST(CudaMatmulPrepared, SameAsOneCall) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t k = 2048, n = 768;
  for (int64_t m : {1, 64}) {
    const std::vector<uint8_t> w = cudatest::random_weights(DType::Q4_K, n, k, 77);
    const std::vector<float> x = cudatest::random_values((size_t)(m * k), 3);
    cuda::DeviceBuffer w_dev = to_device(w), x_dev = to_device(x);
    cuda::DeviceBuffer y1((size_t)(m * n) * 4), y2((size_t)(m * n) * 4);
    const cuda::ActFormat f = cuda::activation_format(DType::Q4_K, m);
    cuda::DeviceBuffer act(cuda::activation_bytes(f, m, k));
    const cuda::Activations a = cuda::quantize_activations(f, x_dev.as<float>(), k, m, k, act.data(), stream);
    cuda::matmul_prepared(DType::Q4_K, w_dev.data(), n, a, y1.as<float>(), n, stream);
    cuda::DeviceBuffer ws(cuda::matmul_workspace_bytes(DType::Q4_K, m, k));
    cuda::matmul(DType::Q4_K, w_dev.data(), n, k, x_dev.as<float>(), m, y2.as<float>(), n, ws.data(),
                 ws.bytes(), stream);
    stream.sync();
    EXPECT_EQ(from_device<float>(y1, (size_t)(m * n)), from_device<float>(y2, (size_t)(m * n)));
  }
}

// Several matrices over one X in one launch (q, k and v): each output is the bits of its own product, at
// decode sizes (one matvec grid) and past them (one tensor-core grid; sizes that leave partial tiles, row
// strides above n, more matrices than one launch takes). The tensor-core grid may split k by its size
// (matmul_prefill.cu k_split), so a product alone and in a shared grid can differ in rounding; at k = 1024
// both split by 4 here (each CTA keeps >= 4 k steps), the same bits.
TEST(CudaMatmulPrepared, MultiIsEachAlone) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t k = 1024;
  const std::vector<int64_t> ns = {1024, 128, 100, 64, 200};
  for (DType t : {DType::Q4_K, DType::F16})
    for (int64_t m : {2, 64, 65}) {
      SCOPED_TRACE(fmt::format("{} m={}", dtype_name(t), m));
      const std::vector<float> x = cudatest::random_values((size_t)(m * k), 9);
      cuda::DeviceBuffer x_dev = to_device(x);
      const cuda::ActFormat f = cuda::activation_format(t, m);
      cuda::DeviceBuffer act(std::max<size_t>(cuda::activation_bytes(f, m, k), 1));
      const cuda::Activations a =
          cuda::quantize_activations(f, x_dev.as<float>(), k, m, k, act.data(), stream);
      std::vector<cuda::DeviceBuffer> w, y_multi, y_one;
      std::vector<cuda::MatmulOut> outs;
      for (size_t j = 0; j < ns.size(); ++j) {
        const int64_t ldy = ns[j] + 5;
        w.push_back(cudatest::weights_to_device(cudatest::random_weights(t, ns[j], k, 300 + (uint32_t)j), t,
                                                k, ns[j]));
        y_multi.emplace_back((size_t)(m * ldy) * 4);
        y_one.emplace_back((size_t)(m * ldy) * 4);
        XPERT_CUDA_CHECK(cudaMemset(y_multi.back().data(), 0, y_multi.back().bytes()));
        XPERT_CUDA_CHECK(cudaMemset(y_one.back().data(), 0, y_one.back().bytes()));
        outs.push_back({.w = w.back().data(), .n = ns[j], .y = y_multi.back().as<float>(), .ldy = ldy});
        cuda::matmul_prepared(t, w.back().data(), ns[j], a, y_one.back().as<float>(), ldy, stream);
      }
      cuda::matmul_prepared_multi(t, outs.data(), (int)outs.size(), a, stream);
      stream.sync();
      for (size_t j = 0; j < ns.size(); ++j) {
        const size_t len = (size_t)(m * (ns[j] + 5));
        EXPECT_EQ(from_device<float>(y_multi[j], len), from_device<float>(y_one[j], len)) << "output " << j;
      }
    }
}

// Products of two weight types over one decode row in one launch (a Q4_K_M layer's Q4_K q / k and Q6_K v; a
// Gated DeltaNet's Q6_K input projection and Q4_K gate rows): each output is the bits of its own product.
TEST(CudaMatmulPrepared, PairIsEachAlone) {
  XPERT_REQUIRE_GPU();
  cuda::Stream stream;
  const int64_t k = 2048;
  const std::vector<float> x = cudatest::random_values((size_t)k, 19);
  cuda::DeviceBuffer x_dev = to_device(x);
  const cuda::ActFormat f = cuda::activation_format(DType::Q4_K, 1);
  cuda::DeviceBuffer act(cuda::activation_bytes(f, 1, k));
  const cuda::Activations a = cuda::quantize_activations(f, x_dev.as<float>(), k, 1, k, act.data(), stream);
  ASSERT_TRUE(cuda::matmul_pair_supported(DType::Q6_K, DType::Q4_K, a));
  EXPECT_FALSE(cuda::matmul_pair_supported(DType::Q4_K, DType::Q8_0, a));
  struct Case {
    std::vector<int64_t> n0, n1;  // rows of the first type's products, of the second's
    DType t0, t1;
  };
  for (const Case& c : {Case{{4096, 512}, {512}, DType::Q4_K, DType::Q6_K},
                        Case{{8192}, {4096, 32, 32}, DType::Q6_K, DType::Q4_K}}) {
    SCOPED_TRACE(
        fmt::format("{} x {} + {} x {}", c.n0.size(), dtype_name(c.t0), c.n1.size(), dtype_name(c.t1)));
    std::vector<cuda::DeviceBuffer> w, y_pair, y_one;
    std::vector<cuda::MatmulOut> outs[2];
    uint32_t seed = 500;
    for (int g = 0; g < 2; ++g) {
      const DType t = g ? c.t1 : c.t0;
      for (int64_t n : g ? c.n1 : c.n0) {
        const int64_t ldy = n + 3;
        w.push_back(cudatest::weights_to_device(cudatest::random_weights(t, n, k, ++seed), t, k, n));
        y_pair.emplace_back((size_t)ldy * 4);
        y_one.emplace_back((size_t)ldy * 4);
        XPERT_CUDA_CHECK(cudaMemset(y_pair.back().data(), 0, y_pair.back().bytes()));
        XPERT_CUDA_CHECK(cudaMemset(y_one.back().data(), 0, y_one.back().bytes()));
        outs[g].push_back({.w = w.back().data(), .n = n, .y = y_pair.back().as<float>(), .ldy = ldy});
        cuda::matmul_prepared(t, w.back().data(), n, a, y_one.back().as<float>(), ldy, stream);
      }
    }
    cuda::matmul_prepared_pair(c.t0, outs[0].data(), (int)outs[0].size(), c.t1, outs[1].data(),
                               (int)outs[1].size(), a, stream);
    stream.sync();
    for (size_t j = 0; j < y_pair.size(); ++j)
      EXPECT_EQ(from_device<float>(y_pair[j], y_pair[j].bytes() / 4),
                from_device<float>(y_one[j], y_one[j].bytes() / 4))
          << "output " << j;
  }
}

// Q6_K lies field by field on the device (weight_layout.h), matrix by matrix; other types as stored. The
// upload from the host and the conversion of data already on the device give the same bytes.
TEST(CudaWeightLayout, Q6KFieldByField) {
  XPERT_REQUIRE_GPU();
  const int64_t k = 512, rows = 8, mats = 3, nb = k / 256, n = rows * nb;  // 16 blocks a matrix
  const std::vector<uint8_t> w = cudatest::random_weights(DType::Q6_K, rows * mats, k, 91);
  ASSERT_EQ(w.size(), (size_t)(mats * n * 210));
  std::vector<uint8_t> want(w.size());
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t b = 0; b < n; ++b) {
      const uint8_t* src = w.data() + (m * n + b) * 210;
      uint8_t* mat = want.data() + m * n * 210;
      std::memcpy(mat + b * 128, src, 128);
      std::memcpy(mat + n * 128 + b * 64, src + 128, 64);
      std::memcpy(mat + n * 192 + b * 16, src + 192, 16);
      std::memcpy(mat + n * 208 + b * 2, src + 208, 2);
    }
  EXPECT_EQ(from_device<uint8_t>(cudatest::weights_to_device(w, DType::Q6_K, k, rows), w.size()), want);
  {  // staged a few blocks at a time, chunks across matrix boundaries (an output head goes ~16 MiB at a time)
    cuda::DeviceBuffer d(w.size());
    cuda::upload_weights(d.data(), w.data(), w.size(), DType::Q6_K, k, rows, nullptr, 5);
    EXPECT_EQ(from_device<uint8_t>(d, w.size()), want);
  }
  cuda::DeviceBuffer raw = to_device(w), conv(w.size());
  cuda::to_device_layout(conv.data(), raw.data(), w.size(), DType::Q6_K, k, rows, nullptr);
  EXPECT_EQ(from_device<uint8_t>(conv, w.size()), want);
  // Other types keep the file's bytes.
  const std::vector<uint8_t> q4 = cudatest::random_weights(DType::Q4_K, rows, k, 92);
  EXPECT_EQ(from_device<uint8_t>(cudatest::weights_to_device(q4, DType::Q4_K, k, rows), q4.size()), q4);
  // Back-to-back matrices that would not start 16-byte aligned, and bytes that are not whole matrices.
  const std::vector<uint8_t> odd = cudatest::random_weights(DType::Q6_K, 3 * 3, 256, 93);
  EXPECT_THROW(cudatest::weights_to_device(odd, DType::Q6_K, 256, 3), Error);
  EXPECT_THROW(cudatest::weights_to_device(w, DType::Q6_K, k, 5), Error);
}

TEST(CudaMatmulErrors, UnsupportedTypeAndShape) {
  EXPECT_THROW(cuda::check_matmul_shape(DType::Q2_K, 256), Error);
  EXPECT_THROW(cuda::check_matmul_shape(DType::Q4_K, 100), Error);
  EXPECT_NO_THROW(cuda::check_matmul_shape(DType::Q4_K, 512));
}

class CudaGetRows : public ::testing::TestWithParam<DType> {};

TEST_P(CudaGetRows, EqualsDequantizeRow) {
  XPERT_REQUIRE_GPU();
  const DType t = GetParam();
  cuda::Stream stream;
  for (int64_t k : {2048, 768, 1056, 100}) {
    if (k % dtype_info(t).block_size != 0) continue;
    SCOPED_TRACE(fmt::format("{} row {}", dtype_name(t), k));
    const int64_t n_rows = 300;
    const std::vector<uint8_t> table = cudatest::random_weights(t, n_rows, k, 31 + k, 300);
    const std::vector<int32_t> ids = {0, 299, 17, 17, 150, -1, 300, 42};  // repeats and two out of range
    cuda::DeviceBuffer table_dev = cudatest::weights_to_device(table, t, k, n_rows), ids_dev = to_device(ids);
    const int64_t ldo = k + 4;
    cuda::DeviceBuffer out((size_t)(ids.size() * ldo) * 4);
    cuda::get_rows(t, table_dev.data(), n_rows, k, ids_dev.as<int32_t>(), (int64_t)ids.size(),
                   out.as<float>(), ldo, stream);
    stream.sync();
    const std::vector<float> got = from_device<float>(out, ids.size() * ldo);
    std::vector<float> want((size_t)k);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= 0 && ids[i] < n_rows)
        dequantize_row(t, table.data() + ids[i] * row_bytes(t, k), want.data(), k);
      else
        std::fill(want.begin(), want.end(), 0.0f);
      int bad = 0;
      for (int64_t l = 0; l < k; ++l)
        if (std::fabs(got[i * ldo + l] - want[l]) > 1e-6f * (1 + std::fabs(want[l])) && ++bad <= 3)
          ADD_FAILURE() << "id " << ids[i] << " element " << l << ": " << got[i * ldo + l] << " vs "
                        << want[l];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaGetRows, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaDevices, ListIsConsistent) {
  const auto devs = cuda::list_devices();
  if (!cudatest::have_gpu()) {
    EXPECT_TRUE(devs.empty());
    EXPECT_FALSE(cuda::no_device_reason().empty());
    return;
  }
  ASSERT_FALSE(devs.empty());
  for (const auto& d : devs) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.sm_count, 0);
    EXPECT_GT(d.total_bytes, 0u);
    EXPECT_GE(d.cc_major, 5);
  }
  EXPECT_EQ(cuda::no_device_reason(), "");
}

}  // namespace
}  // namespace xpert
