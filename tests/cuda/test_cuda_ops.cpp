// CUDA elementwise / norm ops against the CPU ops (backend/cpu/ops.h) on random data of real shapes.
// Most are the CPU's float operations in the CPU's order and agree to an ulp or two; GELU goes through
// f16 on both sides and may differ by one f16 ulp where tanh lands on a rounding boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/device.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/ops.h"
#include "base/half.h"
#include "cuda_ops_test_util.h"

namespace xpert::cudaops_test {
namespace {

TEST(CudaOps, RmsNorm) {
  XPERT_OPS_REQUIRE_GPU();
  struct Case {
    int64_t rows, n;
    bool weight;
  };
  for (const Case c : {Case{7, 2048, true}, Case{5, 4096, false}, Case{64 * 16, 128, true}, Case{33, 256, false},
                       Case{3, 1000, true}}) {
    const auto x = randn(c.rows * c.n, 1, 3.0f), w = randn(c.n, 2);
    std::vector<float> ref(x.size());
    cpu::rmsnorm(x.data(), c.weight ? w.data() : nullptr, ref.data(), c.rows, c.n, 1e-6f);
    Dev<float> dx(x), dw(w), dy(x.size());
    dy.poison();
    cuda::rmsnorm(dx.get(), c.weight ? dw.get() : nullptr, dy.get(), c.rows, c.n, 1e-6f, nullptr);
    const Err e = compare(dy.download(), ref);
    EXPECT_TRUE(e.finite);
    EXPECT_LT(e.max_abs, 2e-6 * e.ref_max) << c.rows << "x" << c.n << " " << e;
    // In place.
    cuda::rmsnorm(dx.get(), c.weight ? dw.get() : nullptr, dx.get(), c.rows, c.n, 1e-6f, nullptr);
    EXPECT_LT(compare(dx.download(), ref).max_abs, 2e-6 * e.ref_max);
  }
}

// Qwen3.5's q norm: q interleaved with its gate per head ([t][h][q | gate]), normalized into packed rows.
TEST(CudaOps, RmsNormStridedPerHead) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t T = 9, H = 16, D = 256;
  const auto qg = randn(T * H * 2 * D, 3), w = randn(D, 4);
  std::vector<float> q(T * H * D), ref(T * H * D);
  for (int64_t r = 0; r < T * H; ++r) std::copy(&qg[r * 2 * D], &qg[r * 2 * D + D], &q[r * D]);
  cpu::rmsnorm(q.data(), w.data(), ref.data(), T * H, D, 1e-6f);
  Dev<float> dqg(qg), dw(w), dy(T * H * D);
  dy.poison();
  cuda::rmsnorm_strided(dqg.get(), 2 * D, dw.get(), dy.get(), D, T * H, D, 1e-6f, nullptr);
  const Err e = compare(dy.download(), ref);
  EXPECT_TRUE(e.finite);
  EXPECT_LT(e.max_abs, 2e-6 * e.ref_max) << e;
}

TEST(CudaOps, Rope) {
  XPERT_OPS_REQUIRE_GPU();
  struct Case {
    int64_t T, H, D, n_rot;
    float base, scale;
    RopeMode mode;
    int32_t max_pos;
  };
  for (const Case c : {Case{7, 16, 256, 64, 1e7f, 1.0f, RopeMode::neox, 200000},   // Qwen3.5: partial NeoX
                       Case{5, 32, 128, 128, 1e6f, 1.0f, RopeMode::neox, 40000},   // Qwen3
                       Case{6, 8, 64, 64, 1e4f, 0.25f, RopeMode::normal, 5000},    // llama, scaled
                       Case{3, 4, 256, 256, 1e4f, 1.0f, RopeMode::normal, 100}}) {
    auto x = randn(c.T * c.H * c.D, 5);
    std::vector<int32_t> pos(c.T);
    for (int64_t t = 0; t < c.T; ++t) pos[t] = (int32_t)((t * 7919 + 13) % c.max_pos);
    pos[0] = c.max_pos - 1;
    Dev<float> dx(x);
    Dev<int32_t> dpos(pos);
    cpu::rope(x.data(), pos.data(), c.T, c.H, c.D, c.n_rot, c.base, c.scale, c.mode);
    cuda::rope(dx.get(), dpos.get(), c.T, c.H, c.D, c.n_rot, c.base, c.scale, c.mode, nullptr);
    const Err e = compare(dx.download(), x);
    // Same angles (same floats); cos/sin of the CUDA libm vs glibc differ by an ulp.
    EXPECT_LT(e.max_abs, 2e-6 * e.ref_max) << "D " << c.D << " n_rot " << c.n_rot << " " << e;
  }
}

// The residual add fused into the norm, and the norm's q8_1 output: the same bits as add, then rmsnorm,
// then quantize_activations on the GPU (decode rows of 2048 and 768; block and warp forms of the kernel).
TEST(CudaOps, AddRmsNormWritesQ8Activations) {
  XPERT_OPS_REQUIRE_GPU();
  for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{1, 2048}, {8, 2048}, {3, 768}, {5, 4096}}) {
    const auto x = randn(rows * n, 21, 2.0f), d = randn(rows * n, 22), w = randn(n, 23);
    Dev<float> dx(x), dd(d), dw(w), dy(x.size()), ex(x), ey(x.size());
    const size_t qb = cuda::activation_bytes(cuda::ActFormat::q8_1, rows, n);
    Dev<uint8_t> q8(qb), want(qb);
    auto* q = reinterpret_cast<int8_t*>(q8.get());
    auto* ds = reinterpret_cast<float2*>(q + cuda::Workspace::round((size_t)(rows * n)));
    q8.poison();
    cuda::add_rmsnorm_q8(dd.get(), dx.get(), n, dw.get(), dy.get(), n, rows, n, 1e-6f, q, ds, nullptr);
    // Unfused: add, norm, convert.
    cuda::add(dd.get(), ex.get(), ex.get(), rows * n, nullptr);
    cuda::rmsnorm(ex.get(), dw.get(), ey.get(), rows, n, 1e-6f, nullptr);
    const cuda::Activations a =
        cuda::quantize_activations(cuda::ActFormat::q8_1, ey.get(), n, rows, n, want.get(), nullptr);
    EXPECT_EQ(dx.download(), ex.download()) << rows << "x" << n;
    EXPECT_EQ(dy.download(), ey.download()) << rows << "x" << n;
    std::vector<uint8_t> got = q8.download(), ref = want.download();
    const size_t used = cuda::Workspace::round((size_t)(rows * n)) + (size_t)(rows * (n / 32)) * 8;
    got.resize(used), ref.resize(used);
    EXPECT_EQ(got, ref) << rows << "x" << n;
    EXPECT_EQ(a.m, rows);
  }
}

// q/k norms and RoPE in one launch vs the CPU's rmsnorm then rope on each (Qwen3: 32 + 4 heads of 128,
// full NeoX; Qwen3.5: 16 + 2 heads of 256, partial NeoX; a model without norms: normal pairs).
TEST(CudaOps, QkNormRope) {
  XPERT_OPS_REQUIRE_GPU();
  struct Case {
    int64_t T, H, HKV, D, n_rot;
    float base;
    RopeMode mode;
    bool norm;
  };
  for (const Case c : {Case{3, 32, 4, 128, 128, 1e6f, RopeMode::neox, true},
                       Case{5, 16, 2, 256, 64, 1e7f, RopeMode::neox, true},
                       Case{2, 8, 8, 64, 64, 1e4f, RopeMode::normal, false}}) {
    auto q = randn(c.T * c.H * c.D, 31, 3.0f), k = randn(c.T * c.HKV * c.D, 32, 3.0f);
    const auto qw = randn(c.D, 33), kw = randn(c.D, 34);
    std::vector<int32_t> pos(c.T);
    for (int64_t t = 0; t < c.T; ++t) pos[t] = (int32_t)(t * 4099 + 17);
    Dev<float> dq(q), dk(k), dqw(qw), dkw(kw);
    Dev<int32_t> dpos(pos);
    if (c.norm) {
      cpu::rmsnorm(q.data(), qw.data(), q.data(), c.T * c.H, c.D, 1e-6f);
      cpu::rmsnorm(k.data(), kw.data(), k.data(), c.T * c.HKV, c.D, 1e-6f);
    }
    cpu::rope(q.data(), pos.data(), c.T, c.H, c.D, c.n_rot, c.base, 1.0f, c.mode);
    cpu::rope(k.data(), pos.data(), c.T, c.HKV, c.D, c.n_rot, c.base, 1.0f, c.mode);
    cuda::qk_norm_rope(dq.get(), dk.get(), c.norm ? dqw.get() : nullptr, c.norm ? dkw.get() : nullptr, c.norm,
                       c.norm, dpos.get(), c.T, c.H, c.HKV, c.D, c.n_rot, c.base, 1.0f, c.mode, 1e-6f, nullptr);
    const Err eq = compare(dq.download(), q), ek = compare(dk.download(), k);
    EXPECT_TRUE(eq.finite && ek.finite);
    EXPECT_LT(eq.max_abs, 4e-6 * eq.ref_max) << "q, D " << c.D << " " << eq;
    EXPECT_LT(ek.max_abs, 4e-6 * ek.ref_max) << "k, D " << c.D << " " << ek;
  }
}

// The decode form: q in place, k and v into an f16 cache at (slot, pos): the same bits as qk_norm_rope then
// store_kv_f16 of each.
TEST(CudaOps, QkNormRopeStoreF16) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t T = 3, H = 32, HKV = 4, D = 128, n_ctx = 64, row = HKV * D, n_slots = 4;
  const auto q = randn(T * H * D, 61, 3.0f), k = randn(T * HKV * D, 62, 3.0f), v = randn(T * HKV * D, 63);
  const auto qw = randn(D, 64), kw = randn(D, 65);
  const std::vector<int32_t> pos = {5, 63, 0}, slots = {2, 0, 3};
  Dev<float> dq(q), dk(k), dv(v), dqw(qw), dkw(kw), rq(q), rk(k);
  Dev<int32_t> dpos(pos), dslots(slots);
  Dev<uint16_t> kc(n_slots * n_ctx * row), vc(n_slots * n_ctx * row), rkc(n_slots * n_ctx * row),
      rvc(n_slots * n_ctx * row);
  for (auto* c : {&kc, &vc, &rkc, &rvc}) XPERT_CUDA_CHECK(cudaMemset(c->get(), 0, c->size() * 2));
  cuda::qk_norm_rope_store_f16(dq.get(), dk.get(), dv.get(), dqw.get(), dkw.get(), dpos.get(), T, H, HKV, D, D,
                               1e6f, 1.0f, RopeMode::neox, 1e-6f, kc.get(), vc.get(), n_ctx * row, dslots.get(),
                               nullptr);
  cuda::qk_norm_rope(rq.get(), rk.get(), dqw.get(), dkw.get(), true, true, dpos.get(), T, H, HKV, D, D, 1e6f, 1.0f,
                     RopeMode::neox, 1e-6f, nullptr);
  cuda::store_kv_f16(rk.get(), T, row, rkc.get(), n_ctx * row, dslots.get(), dpos.get(), nullptr);
  cuda::store_kv_f16(dv.get(), T, row, rvc.get(), n_ctx * row, dslots.get(), dpos.get(), nullptr);
  EXPECT_EQ(dq.download(), rq.download());
  EXPECT_EQ(dk.download(), k);  // k itself is left as it was
  EXPECT_EQ(kc.download(), rkc.download());
  EXPECT_EQ(vc.download(), rvc.download());
}

TEST(CudaOps, GatedActivations) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t n = 3 * 6144 + 5;
  auto gate = randn(n, 6, 3.0f), up = randn(n, 7);
  gate[0] = -10.0f, gate[1] = 10.0f, gate[2] = -12.0f, gate[3] = 15.0f;  // the clamps
  Dev<float> dg(gate), du(up), dy(n);
  std::vector<float> ref(n);

  cpu::swiglu(gate.data(), up.data(), ref.data(), n);
  dy.poison();
  cuda::swiglu(dg.get(), du.get(), dy.get(), n, nullptr);
  Err e = compare(dy.download(), ref);
  EXPECT_LT(e.max_abs, 1e-6 * e.ref_max) << "swiglu " << e;

  cpu::geglu(gate.data(), up.data(), ref.data(), n);
  dy.poison();
  cuda::geglu(dg.get(), du.get(), dy.get(), n, nullptr);
  const auto got = dy.download();
  int64_t off_by_one = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double tol = std::fabs(ref[i]) * (1.0 / 1024) + 1e-7;  // one f16 ulp of the GELU value
    ASSERT_LE(std::fabs(got[i] - ref[i]), tol) << "geglu at " << i << " gate " << gate[i];
    off_by_one += got[i] != ref[i];
  }
  EXPECT_LT(off_by_one, n / 100) << "GELU should round like the CPU table nearly everywhere";
}

TEST(CudaOps, Elementwise) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t rows = 13, n = 2048;
  const auto a = randn(rows * n, 8), b = randn(rows * n, 9), bias = randn(n, 10), g = randn(rows, 11);
  Dev<float> da(a), db(b), dbias(bias), dg(g), dy(rows * n);

  std::vector<float> ref(rows * n);
  cpu::add(a.data(), b.data(), ref.data(), rows * n);
  cuda::add(da.get(), db.get(), dy.get(), rows * n, nullptr);
  EXPECT_EQ(dy.download(), ref);

  ref = a;
  cpu::scale(ref.data(), 0.37f, rows * n);
  dy.upload(a);
  cuda::scale(dy.get(), 0.37f, rows * n, nullptr);
  EXPECT_EQ(dy.download(), ref);

  ref = a;
  cpu::add_bias(ref.data(), bias.data(), rows, n);
  dy.upload(a);
  cuda::add_bias(dy.get(), dbias.get(), rows, n, nullptr);
  EXPECT_EQ(dy.download(), ref);

  auto sig = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  ref = a;
  for (int64_t i = 0; i < rows * n; ++i) ref[i] *= sig(b[i]);
  dy.upload(a);
  cuda::mul_sigmoid(dy.get(), db.get(), rows * n, nullptr);
  Err e = compare(dy.download(), ref);
  EXPECT_LT(e.max_abs, 1e-6 * e.ref_max) << "mul_sigmoid " << e;

  // Strided gate: rows of n/2 read from rows of n (the first half as x, the second as the gate).
  const int64_t h = n / 2;
  std::vector<float> x2(rows * h), ref2(rows * h);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < h; ++i) {
      x2[r * h + i] = a[r * n + i];
      ref2[r * h + i] = a[r * n + i] * sig(a[r * n + h + i]);
    }
  Dev<float> dx2(x2);
  cuda::mul_sigmoid_strided(dx2.get(), da.get() + h, n, rows, h, nullptr);
  e = compare(dx2.download(), ref2);
  EXPECT_LT(e.max_abs, 1e-6 * e.ref_max) << "mul_sigmoid_strided " << e;

  ref = a;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) ref[r * n + i] += b[r * n + i] * sig(g[r]);
  dy.upload(a);
  cuda::add_sigmoid_scaled(dy.get(), db.get(), dg.get(), rows, n, nullptr);
  e = compare(dy.download(), ref);
  EXPECT_LT(e.max_abs, 1e-6 * e.ref_max) << "add_sigmoid_scaled " << e;

  // deinterleave: rows of 2h -> two halves.
  Dev<float> d1(rows * h), d2(rows * h);
  cuda::deinterleave(da.get(), rows, h, d1.get(), d2.get(), nullptr);
  const auto o1 = d1.download(), o2 = d2.download();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < h; ++i) {
      ASSERT_EQ(o1[r * h + i], a[r * n + i]);
      ASSERT_EQ(o2[r * h + i], a[r * n + h + i]);
    }

  const std::vector<int64_t> idx = {12, 0, 5, 5, 7};
  Dev<int64_t> didx(idx);
  Dev<float> dgat(idx.size() * n);
  cuda::gather_rows(da.get(), didx.get(), (int64_t)idx.size(), n, dgat.get(), nullptr);
  const auto gat = dgat.download();
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t c = 0; c < n; ++c) ASSERT_EQ(gat[i * n + c], a[idx[i] * n + c]);
}

TEST(CudaOps, StoreF16) {
  XPERT_OPS_REQUIRE_GPU();
  const int64_t T = 5, row = 2 * 256, n_ctx = 40, n_slots = 3;
  auto x = randn(T * row, 12, 100.0f);
  x[0] = 70000.0f, x[1] = -1e-8f, x[2] = 65519.0f, x[3] = 65520.0f;  // overflow, subnormal, rounding edge
  std::vector<uint16_t> ref(T * row);
  cpu::store_f16(x.data(), ref.data(), T * row);
  Dev<float> dx(x);
  Dev<uint16_t> dh(T * row);
  cuda::store_f16(dx.get(), dh.get(), T * row, nullptr);
  EXPECT_EQ(dh.download(), ref);

  // Into a cache of 3 slots at scattered positions.
  const std::vector<int32_t> slots = {2, 0, 1, 2, 0}, pos = {39, 0, 17, 3, 38};
  Dev<int32_t> dslots(slots), dpos(pos);
  Dev<uint16_t> cache(n_slots * n_ctx * row);
  XPERT_CUDA_CHECK(cudaMemset(cache.get(), 0, cache.size() * 2));
  cuda::store_kv_f16(dx.get(), T, row, cache.get(), n_ctx * row, dslots.get(), dpos.get(), nullptr);
  const auto c = cache.download();
  int64_t written = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ(c[(slots[t] * n_ctx + pos[t]) * row + i], ref[t * row + i]);
      written += c[(slots[t] * n_ctx + pos[t]) * row + i] != 0;
    }
  int64_t nonzero = 0;
  for (uint16_t v : c) nonzero += v != 0;
  EXPECT_EQ(nonzero, written);  // nothing else touched
}

}  // namespace
}  // namespace xpert::cudaops_test
