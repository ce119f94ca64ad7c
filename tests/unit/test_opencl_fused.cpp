// The whole-model OpenCL backend's fused forms (backend/opencl/fused_ops.cpp) against the CPU's plain ops, on
// random data of Qwen3-30B-A3B's shapes (n_embd 2048, 32 / 4 heads of 128, K-quant rows): the residual add
// with the norm, the q/k/v products in one launch, q/k norms with RoPE, the decode attention over slots with
// the k/v store, and the MoE FFN half of a decode step (norm, router, top-k, gate/up + SwiGLU, down + combine
// + residual, the next norm). CI runs it on PoCL; without an OpenCL device it skips.
#include <gtest/gtest.h>

#ifdef XPERT_HAVE_OPENCL
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/opencl/backend_impl.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/opencl_backend.h"
#include "backend/opencl/switches.h"
#include "base/error.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "model/blocks.h"
#include "model/model.h"
#include "opencl_test_util.h"
#include "quant/quant.h"

namespace xpert {
namespace {

using namespace cltest;  // device(), DEVICE_OR_SKIP, random data, upload / download

// The same device with a GPU's 32 work-items per matrix row and 4 rows a work-group (XPERT_OPENCL_OPTS mv_wg,
// mv_r), so PoCL runs the kernels a GPU runs (the K-quant rows walked a block at a time).
Backend* device_gpu_width() {
  static std::shared_ptr<Backend> b = []() -> std::shared_ptr<Backend> {
    if (!device()) return nullptr;
    setenv("XPERT_OPENCL_OPTS", "mv_wg=32:mv_r=4", 1);
    auto d = make_opencl_backend(0);
    unsetenv("XPERT_OPENCL_OPTS");
    return d;
  }();
  return b.get();
}

std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = ::xpert::f16_to_f32(h[i]);
  return f;
}

struct Threads {
  ThreadPool pool{2};
  CpuBackend cpu{pool};
};

// Random weights of type t, n rows of k per matrix, m matrices, quantized as a file holds them.
struct RandomWeight {
  std::vector<uint8_t> bytes;
  Weight host;
  DeviceBuffer buf;
  Weight dev;
  RandomWeight(Backend& d, DType t, int64_t k, int64_t n, int64_t m, std::mt19937& rng) {
    const size_t rb = row_bytes(t, k);
    bytes.resize(rb * n * m);
    const std::vector<float> f = random_vec(k * n * m, rng, 1.0f / std::sqrt((float)k));
    for (int64_t r = 0; r < n * m; ++r) quantize_row(t, f.data() + r * k, bytes.data() + r * rb, k);
    host = {.type = t, .data = bytes.data(), .ne = {k, n, m}, .n_bytes = bytes.size()};
    upload_to(d);
  }
  // The same bytes on another backend (a copy made with the first one's bytes: quantizing is the slow part).
  RandomWeight(const RandomWeight& o, Backend& d) : bytes(o.bytes), host(o.host) {
    host.data = bytes.data();
    upload_to(d);
  }
  void upload_to(Backend& d) {
    buf = DeviceBuffer(d, bytes.size());
    d.copy_from_host(buf.data(), bytes.data(), bytes.size());
    dev = host;
    dev.data = buf.data();
  }
};

// Rows held in registers by a 256-wide group (n % 4 == 0, n <= 8192), and the RED_WG form for the others.
TEST(OpenCLFused, AddRmsnormMatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  std::mt19937 rng(31);
  for (const int64_t n : {2048, 64, 1030, 8448}) {
    const int64_t rows = 3;
    std::vector<float> x = random_vec(rows * n, rng);
    const std::vector<float> d = random_vec(rows * n, rng), w = random_vec(n, rng);
    DeviceBuffer dx = upload(dev, x), dd = upload(dev, d), dw = upload(dev, w),
                 dy(dev, x.size() * sizeof(float));
    std::vector<float> y(x.size());
    th.cpu.add_rmsnorm(d.data(), x.data(), w.data(), y.data(), rows, n, 1e-6f);
    dev.add_rmsnorm(ptr<float>(dd), ptr<float>(dx), ptr<float>(dw), ptr<float>(dy), rows, n, 1e-6f);
    EXPECT_EQ(download<float>(dev, dx, x.size()), x) << n;  // the residual: one add, the same bits
    EXPECT_LT(rel_err(download<float>(dev, dy, y.size()), y), 2e-6f) << n;
  }
}

class OpenCLFusedQkNormRope : public ::testing::TestWithParam<std::tuple<RopeMode, int, bool>> {};

TEST_P(OpenCLFusedQkNormRope, MatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  const auto [mode, n_rot, norms] = GetParam();
  std::mt19937 rng(37);
  const int64_t T = 4, H = 32, Hk = 4, D = 128;
  std::vector<float> q = random_vec(T * H * D, rng), k = random_vec(T * Hk * D, rng);
  const std::vector<float> qn = random_vec(D, rng), kn = random_vec(D, rng);
  const std::vector<int32_t> pos = {0, 5, 300, 4095};
  DeviceBuffer dq = upload(dev, q), dk = upload(dev, k), dqn = upload(dev, qn), dkn = upload(dev, kn),
               dp = upload(dev, pos);
  th.cpu.qk_norm_rope(q.data(), k.data(), norms ? qn.data() : nullptr, norms ? kn.data() : nullptr,
                      pos.data(), T, H, Hk, D, n_rot, 1e6f, 1.0f, mode, 1e-6f);
  dev.qk_norm_rope(ptr<float>(dq), ptr<float>(dk), norms ? ptr<float>(dqn) : nullptr,
                   norms ? ptr<float>(dkn) : nullptr, ptr<int32_t>(dp), T, H, Hk, D, n_rot, 1e6f, 1.0f, mode,
                   1e-6f);
  EXPECT_LT(rel_err(download<float>(dev, dq, q.size()), q), 2e-5f);
  EXPECT_LT(rel_err(download<float>(dev, dk, k.size()), k), 2e-5f);
}

// A prefill's q / k norms and RoPE with the k / v stores into the f16 cache in the same launch: the same bits
// as qk_norm_rope then two store_kv, in one launch instead of three.
TEST_P(OpenCLFusedQkNormRope, StoresKvInTheSameLaunch) {
  DEVICE_OR_SKIP();
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(dev);
  const auto [mode, n_rot, norms] = GetParam();
  std::mt19937 rng(38);
  const int64_t T = 5, H = 32, Hk = 4, D = 128, n = T * Hk * D;
  const std::vector<float> q = random_vec(T * H * D, rng), k = random_vec(n, rng), v = random_vec(n, rng);
  const std::vector<float> qn = random_vec(D, rng), kn = random_vec(D, rng);
  const std::vector<int32_t> pos = {7, 8, 9, 10, 11};
  DeviceBuffer dqn = upload(dev, qn), dkn = upload(dev, kn), dp = upload(dev, pos), dv = upload(dev, v);
  const QkPrep p{.q_norm = norms ? ptr<float>(dqn) : nullptr,
                 .k_norm = norms ? ptr<float>(dkn) : nullptr,
                 .pos = ptr<int32_t>(dp),
                 .n_rot = n_rot,
                 .freq_base = 1e6f,
                 .mode = mode};
  std::vector<std::vector<float>> qk[2];
  std::vector<std::vector<uint16_t>> cache[2];
  uint64_t launches[2] = {};
  for (int fused = 0; fused < 2; ++fused) {
    DeviceBuffer dq = upload(dev, q), dk = upload(dev, k), dkc(dev, n * 2), dvc(dev, n * 2);
    const uint64_t e0 = ocl.enqueue_count();
    if (fused) {
      dev.qk_norm_rope_store_kv(ptr<float>(dq), ptr<float>(dk), ptr<float>(dv), p, T, H, Hk, D, dkc.data(),
                                DType::F16, dvc.data(), DType::F16);
    } else {
      dev.qk_norm_rope(ptr<float>(dq), ptr<float>(dk), p.q_norm, p.k_norm, p.pos, T, H, Hk, D, n_rot, 1e6f,
                       1.0f, mode, 1e-6f);
      dev.store_kv(ptr<float>(dk), dkc.data(), n, DType::F16);
      dev.store_kv(ptr<float>(dv), dvc.data(), n, DType::F16);
    }
    launches[fused] = ocl.enqueue_count() - e0;
    qk[fused] = {download<float>(dev, dq, q.size()), download<float>(dev, dk, k.size())};
    cache[fused] = {download<uint16_t>(dev, dkc, n), download<uint16_t>(dev, dvc, n)};
  }
  EXPECT_EQ(qk[1], qk[0]);
  EXPECT_EQ(cache[1], cache[0]);
  EXPECT_EQ(launches[0], 3u);
  EXPECT_EQ(launches[1], 1u);
}

INSTANTIATE_TEST_SUITE_P(Modes, OpenCLFusedQkNormRope,
                         ::testing::Combine(::testing::Values(RopeMode::normal, RopeMode::neox),
                                            ::testing::Values(128, 64), ::testing::Bool()));

// q, k and v of a decode batch in one launch, against three CPU matmuls (int8 activations there: the
// same values, summed in another order).
TEST(OpenCLFused, MatmulsMatchCpu) {
  DEVICE_OR_SKIP();
  (void)dev;
  Threads th;
  std::mt19937 rng(41);
  const int64_t E = 2048;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F16})
    for (Backend* b : {device(), device_gpu_width()}) {
      Backend& dev = *b;
      // q, k, v; and a Gated DeltaNet layer's four input projections (qkv, z, alpha, beta: the last two of
      // a row per value head).
      RandomWeight wq(dev, t, E, 4096, 1, rng), wk(dev, t, E, 512, 1, rng), wv(dev, t, E, 512, 1, rng),
          wa(dev, t, E, 32, 1, rng);
      for (int64_t m : {1, 3})
        for (size_t n_jobs : {3, 4}) {
          const std::vector<float> x = random_vec(m * E, rng);
          DeviceBuffer dx = upload(dev, x), dq(dev, m * 4096 * 4), dk(dev, m * 512 * 4), dv(dev, m * 512 * 4),
                       da(dev, m * 32 * 4);
          const Backend::MatmulJob jobs[] = {{&wq.dev, ptr<float>(dq)},
                                             {&wk.dev, ptr<float>(dk)},
                                             {&wv.dev, ptr<float>(dv)},
                                             {&wa.dev, ptr<float>(da)}};
          dev.matmuls(ptr<float>(dx), m, std::span(jobs, n_jobs));
          for (auto [w, buf, n] :
               {std::tuple{&wq, &dq, 4096}, {&wk, &dk, 512}, {&wv, &dv, 512}, {&wa, &da, 32}}) {
            if (w == &wa && n_jobs == 3) continue;
            std::vector<float> ref(m * n);
            th.cpu.matmul(w->host, x.data(), m, ref.data(), 0);
            EXPECT_LT(rel_err(download<float>(dev, *buf, ref.size()), ref), 1e-4f)
                << dtype_name(t) << " m=" << m << ", " << n_jobs << " matrices, " << n << " rows";
          }
        }
    }
}

// A norm whose rows a product reads next (a layer's first norm, the output norm) rounds them in the mode of
// the last q/k/v product: the product then takes no rounding launch, and gives what it gives when it rounds a
// copy itself, bit for bit; both match the CPU's norm and product.
TEST(OpenCLFused, NormRoundsForTheNextProduct) {
  DEVICE_OR_SKIP();
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(dev);
  Threads th;
  std::mt19937 rng(53);
  const int64_t E = 2048, N = 96;
  // Q4_K rounds x by 256 (Q8_K), Q8_0 by 32; the prefill's rounding launch (round_blocks: a team of
  // work-items a block) and the norm's (a work-group a row) are written apart, so their bits are compared.
  for (const DType type : {DType::Q4_K, DType::Q8_0}) {
    RandomWeight wq(dev, type, E, N, 1, rng), wk(dev, type, E, 32, 1, rng);
    // A decode step's rows, and a prefill's (its products tiled, its rounding a launch of every row before).
    for (const int64_t rows : {3, 40}) {
      std::vector<float> x = random_vec(rows * E, rng);
      const std::vector<float> w = random_vec(E, rng);
      // Awkward blocks in every row: all zeros, the largest magnitude twice with both signs (the first is
      // kept), tiny and huge values.
      for (int64_t r = 0; r < rows; ++r) {
        float* xr = x.data() + r * E;
        for (int64_t i = 0; i < 256; ++i) xr[i] = 0.0f;
        xr[300] = -1.5f, xr[301] = 1.5f;
        for (int64_t i = 320; i < 352; ++i) xr[i] *= 1e-30f;
        for (int64_t i = 512; i < 544; ++i) xr[i] *= 1e4f;
      }
      DeviceBuffer dx = upload(dev, x), dw = upload(dev, w), dcur(dev, rows * E * 4),
                   dcopy(dev, rows * E * 4), dy(dev, rows * N * 4), dy2(dev, rows * N * 4),
                   dk(dev, rows * 32 * 4), dq(dev, rows * N * 4);
      // A q/k product first: the norm learns its rounding mode from it.
      const Backend::MatmulJob jobs[] = {{&wq.dev, ptr<float>(dq)}, {&wk.dev, ptr<float>(dk)}};
      dev.matmuls(ptr<float>(dx), rows, jobs);
      const uint64_t e0 = ocl.enqueue_count();
      const Act cur = dev.rmsnorm_act(ptr<float>(dx), ptr<float>(dw), ptr<float>(dcur), rows, E, 1e-6f);
      dev.matmul(wq.dev, cur, ptr<float>(dy));
      const uint64_t with_norm = ocl.enqueue_count() - e0;
      dev.copy(dcopy.data(), dcur.data(), rows * E * sizeof(float));
      const uint64_t e1 = ocl.enqueue_count();
      dev.matmul(wq.dev, ptr<float>(dcopy), rows, ptr<float>(dy2));
      // The product alone rounds its rows in a launch of its own; after the norm it does not.
      EXPECT_EQ(with_norm, ocl.enqueue_count() - e1)
          << dtype_name(type) << ", " << rows << " rows: the norm with its rounding, the product";
      EXPECT_EQ(download<float>(dev, dy, rows * N), download<float>(dev, dy2, rows * N))
          << dtype_name(type) << ", " << rows << " rows";
      std::vector<float> ref_cur(rows * E), ref(rows * N);
      th.cpu.rmsnorm(x.data(), w.data(), ref_cur.data(), rows, E, 1e-6f);
      th.cpu.matmul(wq.host, ref_cur.data(), rows, ref.data(), 0);
      EXPECT_LT(rel_err(download<float>(dev, dcur, ref_cur.size()), ref_cur), 1e-5f) << rows << " rows";
      EXPECT_LT(rel_err(download<float>(dev, dy, ref.size()), ref), 1e-4f) << rows << " rows";
    }
  }
}

// Q4_K_M gives some layers' v (or Gated DeltaNet qkv) projection Q6_K, the others Q4_K: the products of mixed
// types take one launch per type and round x once per rounding mode (Q4_K and Q6_K round alike; Q8_0 by 32,
// F16 to halves), and match the CPU's.
TEST(OpenCLFused, MatmulsOfMixedTypesLaunchOncePerType) {
  DEVICE_OR_SKIP();
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(dev);
  Threads th;
  std::mt19937 rng(43);
  const int64_t E = 2048;
  struct Mix {
    std::vector<DType> types;
    uint64_t launches;  // products + roundings
  };
  for (const Mix& mix : {Mix{{DType::Q4_K, DType::Q4_K, DType::Q6_K}, 2 + 1},
                         Mix{{DType::Q6_K, DType::Q4_K, DType::Q4_K, DType::Q4_K}, 2 + 1},
                         Mix{{DType::Q8_0, DType::Q4_K, DType::F16, DType::Q8_0}, 3 + 3}}) {
    const int64_t rows[] = {1024, 512, 512, 32};
    std::vector<std::unique_ptr<RandomWeight>> w;
    for (size_t i = 0; i < mix.types.size(); ++i)
      w.push_back(std::make_unique<RandomWeight>(dev, mix.types[i], E, rows[i], 1, rng));
    for (int64_t m : {1, 3}) {
      const std::vector<float> x = random_vec(m * E, rng);
      DeviceBuffer dx = upload(dev, x);
      std::vector<DeviceBuffer> dy;
      std::vector<Backend::MatmulJob> jobs;
      for (size_t i = 0; i < w.size(); ++i) dy.emplace_back(dev, m * rows[i] * 4);
      for (size_t i = 0; i < w.size(); ++i) jobs.push_back({&w[i]->dev, ptr<float>(dy[i])});
      const uint64_t e0 = ocl.enqueue_count();
      dev.matmuls(ptr<float>(dx), m, jobs);
      EXPECT_EQ(ocl.enqueue_count() - e0, mix.launches) << mix.types.size() << " matrices, m=" << m;
      for (size_t i = 0; i < w.size(); ++i) {
        std::vector<float> ref(m * rows[i]);
        th.cpu.matmul(w[i]->host, x.data(), m, ref.data(), 0);
        EXPECT_LT(rel_err(download<float>(dev, dy[i], ref.size()), ref), 1e-4f)
            << dtype_name(mix.types[i]) << " (job " << i << "), m=" << m;
      }
    }
  }
}

// Prefill-sized rows (past kGemvMaxRows): each job's tiled product as matmul runs it alone, the same bits,
// with x rounded once per rounding mode where the jobs one by one rounded it once each.
TEST(OpenCLFused, PrefillMatmulsRoundOncePerMode) {
  DEVICE_OR_SKIP();
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(dev);
  Threads th;
  std::mt19937 rng(53);
  const int64_t E = 512, m = opencl::kGemvMaxRows + 12;
  struct Mix {
    std::vector<DType> types;
    uint64_t saved;  // roundings the one-by-one form launches and matmuls does not
  };
  for (const Mix& mix :
       {Mix{{DType::Q4_K, DType::Q4_K, DType::Q6_K}, 2},
        Mix{{DType::Q8_0, DType::Q4_K, DType::F16, DType::Q8_0}, 1}, Mix{{DType::F32, DType::Q4_K}, 0}}) {
    const int64_t rows[] = {256, 128, 128, 64};
    std::vector<std::unique_ptr<RandomWeight>> w;
    for (size_t i = 0; i < mix.types.size(); ++i)
      w.push_back(std::make_unique<RandomWeight>(dev, mix.types[i], E, rows[i], 1, rng));
    const std::vector<float> x = random_vec(m * E, rng);
    DeviceBuffer dx = upload(dev, x);
    std::vector<DeviceBuffer> dy, dy1;
    std::vector<Backend::MatmulJob> jobs;
    for (size_t i = 0; i < w.size(); ++i)
      dy.emplace_back(dev, m * rows[i] * 4), dy1.emplace_back(dev, m * rows[i] * 4);
    for (size_t i = 0; i < w.size(); ++i) jobs.push_back({&w[i]->dev, ptr<float>(dy[i])});
    uint64_t e0 = ocl.enqueue_count();
    for (size_t i = 0; i < w.size(); ++i) dev.matmul(w[i]->dev, ptr<float>(dx), m, ptr<float>(dy1[i]), 0);
    const uint64_t one_by_one = ocl.enqueue_count() - e0;
    e0 = ocl.enqueue_count();
    dev.matmuls(ptr<float>(dx), m, jobs);
    EXPECT_EQ(one_by_one - (ocl.enqueue_count() - e0), mix.saved) << mix.types.size() << " matrices";
    for (size_t i = 0; i < w.size(); ++i) {
      const std::vector<float> got = download<float>(dev, dy[i], m * rows[i]);
      EXPECT_EQ(got, download<float>(dev, dy1[i], m * rows[i]))
          << dtype_name(mix.types[i]) << " (job " << i << ")";
      std::vector<float> ref(m * rows[i]);
      th.cpu.matmul(w[i]->host, x.data(), m, ref.data(), 0);
      EXPECT_LT(rel_err(got, ref), 1e-4f) << dtype_name(mix.types[i]) << " (job " << i << ")";
    }
  }
}

// Where the device can require subgroups of a size that divides a row's work-items (Intel's extensions: CI's
// Intel CPU runtime, not PoCL 3.1), the matvecs sum a row by sub_group_reduce_add: at the CPU width (4) in
// one subgroup, at the GPU width (32) in two of 16. XPERT_OPENCL_OPTS subgroups=0 keeps the tree in local
// memory. Both match the CPU, and each other up to summation order.
TEST(OpenCLFused, MatvecSumsBySubgroupsWhereOffered) {
  DEVICE_OR_SKIP();
  (void)dev;
  Threads th;
  std::mt19937 rng(47);
  for (const char* width : {"", "mv_wg=32:mv_r=4"}) {
    auto make = [&](const std::string& opts) {
      setenv("XPERT_OPENCL_OPTS", opts.c_str(), 1);
      auto b = make_opencl_backend(0);
      unsetenv("XPERT_OPENCL_OPTS");
      return b;
    };
    const std::shared_ptr<Backend> sg = make(width), tree = make(std::string(width) + ":subgroups=0");
    auto& o = dynamic_cast<opencl::OpenclBackend&>(*sg);
    const opencl::DeviceInfo& d = o.facts();
    const int wg = o.matmul_build().mv_wg, want = std::min(wg, 16);
    const bool offered = d.intel_subgroups && d.intel_required_subgroup_size && d.has_sub_group_size(want);
    EXPECT_EQ(o.matmul_build().sub_group, offered ? want : 0) << wg << " work-items a row";
    EXPECT_EQ(d.matvec_sub_group(wg), o.matmul_build().sub_group);
    EXPECT_EQ(dynamic_cast<opencl::OpenclBackend&>(*tree).matmul_build().sub_group, 0);
    for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
      RandomWeight w(*sg, t, 2048, 96, 1, rng), w_tree(w, *tree);
      for (int64_t m : {1, 3}) {
        const std::vector<float> x = random_vec(m * 2048, rng);
        std::vector<float> ref(m * 96);
        th.cpu.matmul(w.host, x.data(), m, ref.data(), 0);
        std::vector<std::vector<float>> got;
        for (auto [b, wt] : {std::pair{sg.get(), &w}, {tree.get(), &w_tree}}) {
          DeviceBuffer dx = upload(*b, x), dy(*b, m * 96 * 4);
          b->matmul(wt->dev, ptr<float>(dx), m, ptr<float>(dy));
          got.push_back(download<float>(*b, dy, ref.size()));
          EXPECT_LT(rel_err(got.back(), ref), 1e-4f) << dtype_name(t) << " m=" << m << " " << width;
        }
        EXPECT_LT(rel_err(got[0], got[1]), 1e-5f) << dtype_name(t) << " m=" << m << " " << width;
      }
    }
  }
}

// The GPU-width K-quant matvecs on rows whose block count does not divide by the work-items' share of a
// block (Q4_K: teams of 8 work-items take every fourth block; 3 and 5 blocks leave teams idle or uneven; 17
// give one team 5 blocks and the others 4, as a row of 4096 gives each 4).
TEST(OpenCLFused, MatvecOfUnevenBlockCountsMatchesCpu) {
  DEVICE_OR_SKIP();
  (void)dev;
  Threads th;
  std::mt19937 rng(43);
  Backend& gpu = *device_gpu_width();
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (int64_t k : {768, 1280, 4352}) {
      RandomWeight w(gpu, t, k, 96, 1, rng);
      for (int64_t m : {1, 2}) {
        const std::vector<float> x = random_vec(m * k, rng);
        DeviceBuffer dx = upload(gpu, x), dy(gpu, m * 96 * 4);
        gpu.matmul(w.dev, ptr<float>(dx), m, ptr<float>(dy));
        std::vector<float> ref(m * 96);
        th.cpu.matmul(w.host, x.data(), m, ref.data(), 0);
        EXPECT_LT(rel_err(download<float>(gpu, dy, ref.size()), ref), 1e-4f)
            << dtype_name(t) << " k=" << k << " m=" << m;
      }
    }
}

// A Gated DeltaNet step in its recurrent form (decode), told its output projection's type, rounds out for it
// in the same launch (Q4_K: a block spans two heads of 128, the last of their groups rounds it): the
// projection then takes one launch and gives what it gives when it rounds a copy of out itself, bit for bit.
// The chunked form (a prompt of kChunkedMinTokens or more) leaves the rounding to the projection.
TEST(OpenCLFused, GatedDeltaNetRoundsItsOutputForTheProjection) {
  DEVICE_OR_SKIP();
  (void)dev;
  std::mt19937 rng(47);
  const GdnShape s{
      .d_conv = 4, .n_k_heads = 2, .n_v_heads = 4, .head_k_dim = 128, .head_v_dim = 128, .eps = 1e-6f};
  const int64_t CD = s.conv_dim(), Hv = s.n_v_heads, VD = s.value_dim();
  std::vector<float> a = random_vec(Hv, rng);
  for (float& v : a) v = -std::exp(v * 0.5f);
  const std::vector<float> conv1d = random_vec(CD * s.d_conv, rng, 0.5f), dt = random_vec(Hv, rng),
                           norm = random_vec(s.head_v_dim, rng);
  for (DeltaRuleForm form : {DeltaRuleForm::automatic, DeltaRuleForm::recurrent}) {
    const std::shared_ptr<Backend> bp = make_opencl_backend(0, form);
    Backend& b = *bp;
    auto& ocl = dynamic_cast<opencl::OpenclBackend&>(b);
    DeviceBuffer d_conv1d = upload(b, conv1d), d_dt = upload(b, dt), d_a = upload(b, a),
                 d_norm = upload(b, norm);
    DeviceBuffer d_conv_state = upload(b, std::vector<float>(s.conv_state_size(), 0.0f)),
                 d_ssm_state = upload(b, std::vector<float>(s.ssm_state_size(), 0.0f));
    for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16})
      for (int64_t T : {1, 3}) {
        const bool tail = form == DeltaRuleForm::recurrent || T < kChunkedMinTokens;
        DeviceBuffer d_qkv = upload(b, random_vec(T * CD, rng)), d_z = upload(b, random_vec(T * VD, rng)),
                     d_alpha = upload(b, random_vec(T * Hv, rng)),
                     d_beta = upload(b, random_vec(T * Hv, rng)), d_out(b, T * VD * sizeof(float)),
                     d_copy(b, T * VD * sizeof(float));
        RandomWeight wo(b, t, VD, 64, 1, rng);
        DeviceBuffer dy(b, T * 64 * 4), dy2(b, T * 64 * 4);
        b.gated_delta_net(s,
                          {.conv1d = ptr<float>(d_conv1d),
                           .dt_bias = ptr<float>(d_dt),
                           .a = ptr<float>(d_a),
                           .norm = ptr<float>(d_norm),
                           .out_type = t},
                          {.qkv = ptr<float>(d_qkv),
                           .z = ptr<float>(d_z),
                           .alpha = ptr<float>(d_alpha),
                           .beta = ptr<float>(d_beta),
                           .n_tokens = T},
                          ptr<float>(d_conv_state), ptr<float>(d_ssm_state), ptr<float>(d_out));
        const uint64_t e0 = ocl.enqueue_count();
        b.matmul(wo.dev, ptr<float>(d_out), T, ptr<float>(dy));
        EXPECT_EQ(ocl.enqueue_count() - e0, tail ? 1u : 2u) << dtype_name(t) << " T=" << T;
        b.copy(d_copy.data(), d_out.data(), T * VD * sizeof(float));
        b.matmul(wo.dev, ptr<float>(d_copy), T, ptr<float>(dy2));
        EXPECT_EQ(download<float>(b, dy, T * 64), download<float>(b, dy2, T * 64))
            << dtype_name(t) << " T=" << T;
      }
  }
}

// The GPU-width Q4_K and Q6_K matvecs read 16-byte vectors of activations, Q4_K weights 16 bytes and Q6_K
// weights 2 at a time: a weight view that breaks the alignment is refused with a message before any launch (a
// misaligned vector load would fault on a GPU, or read wrong bytes).
TEST(OpenCLFused, TeamMatvecsRefuseMisalignedRows) {
  DEVICE_OR_SKIP();
  (void)dev;
  std::mt19937 rng(45);
  Backend& gpu = *device_gpu_width();
  for (const auto& [type, offset] : {std::pair{DType::Q4_K, 8}, std::pair{DType::Q6_K, 1}}) {
    RandomWeight w(gpu, type, 256, 8, 1, rng);
    Weight view = w.dev;
    view.data = static_cast<const uint8_t*>(w.dev.data) + offset;
    view.ne[1] = 7;
    const std::vector<float> x = random_vec(256, rng);
    DeviceBuffer dx = upload(gpu, x), dy(gpu, 8 * 4);
    try {
      gpu.matmul(view, ptr<float>(dx), 1, ptr<float>(dy));
      ADD_FAILURE() << "a misaligned " << dtype_name(type) << " row was multiplied";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("matvec on misaligned data"), std::string::npos) << e.what();
    }
    gpu.matmul(w.dev, ptr<float>(dx), 1, ptr<float>(dy));  // the aligned rows still work
    gpu.synchronize();
  }
}

// Three sequences of a decode step, in slots 2, 0, 1 at depths 5, 70 (two key tiles) and 200 (four): q/k
// norms, NeoX RoPE, the k/v rows stored as f16 at each position of each slot, and each sequence's attention
// over its slot, against the CPU's qk_norm_rope, store_kv and attention; deeper steps take the split form.
struct DecodeCase {
  int64_t n_head, n_head_kv, head_dim, n_rot, n_ctx;
  std::vector<int32_t> slots, pos;
  bool norms;
  RopeMode mode;
  int32_t window = 0;  // sliding window (Gemma 3's local layers), 0: none
  bool gated = false;  // Qwen3.5: q and an output gate interleaved per head, out *= sigmoid(gate)
};
class OpenCLFusedDecodeAttention : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(OpenCLFusedDecodeAttention, MatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  std::mt19937 rng(43);
  const DecodeCase& c = GetParam();
  const std::vector<int32_t>& slots = c.slots;
  const std::vector<int32_t>& pos = c.pos;
  const int64_t S = (int64_t)slots.size(), H = c.n_head, Hk = c.n_head_kv, D = c.head_dim, n_ctx = c.n_ctx;
  const int64_t n_slots = *std::max_element(slots.begin(), slots.end()) + 1, kv_row = Hk * D;
  std::vector<float> q = random_vec(S * H * D, rng), k = random_vec(S * kv_row, rng);
  const std::vector<float> v = random_vec(S * kv_row, rng), qn = random_vec(D, rng), kn = random_vec(D, rng);
  std::vector<uint16_t> kc(n_slots * n_ctx * kv_row), vc(kc.size());
  for (size_t i = 0; i < kc.size(); ++i) {
    kc[i] = f32_to_f16(std::normal_distribution<float>()(rng));
    vc[i] = f32_to_f16(std::normal_distribution<float>()(rng));
  }
  // Gated: the projection's rows as Qwen3.5 has them, [q head | gate head] per head.
  const std::vector<float> gate = random_vec(S * H * D, rng);
  std::vector<float> qg(2 * q.size());
  for (int64_t r = 0; r < S * H; ++r) {
    std::copy(q.begin() + r * D, q.begin() + (r + 1) * D, qg.begin() + 2 * r * D);
    std::copy(gate.begin() + r * D, gate.begin() + (r + 1) * D, qg.begin() + (2 * r + 1) * D);
  }
  DeviceBuffer dqg = upload(dev, qg);
  DeviceBuffer dq = upload(dev, q), dk = upload(dev, k), dv = upload(dev, v), dqn = upload(dev, qn),
               dkn = upload(dev, kn), dkc = upload(dev, kc), dvc = upload(dev, vc),
               dslots = upload(dev, slots), dpos = upload(dev, pos), dout(dev, q.size() * sizeof(float));
  const float kq_scale = 1.0f / std::sqrt((float)D);
  const std::vector<float> q0 = q,
                           k0 = k;  // the device's inputs (its step normalizes and rotates them in place)
  // The CPU: one sequence at a time.
  th.cpu.qk_norm_rope(q.data(), k.data(), c.norms ? qn.data() : nullptr, c.norms ? kn.data() : nullptr,
                      pos.data(), S, H, Hk, D, c.n_rot, 1e6f, 1.0f, c.mode, 1e-6f);
  std::vector<float> ref(q.size());
  const size_t slot_elems = n_ctx * kv_row;
  for (int64_t s = 0; s < S; ++s) {
    uint16_t* ks = kc.data() + slots[s] * slot_elems;
    uint16_t* vs = vc.data() + slots[s] * slot_elems;
    th.cpu.store_kv(k.data() + s * kv_row, ks + pos[s] * kv_row, kv_row, DType::F16);
    th.cpu.store_kv(v.data() + s * kv_row, vs + pos[s] * kv_row, kv_row, DType::F16);
    th.cpu.attention({.q = q.data() + s * H * D,
                      .k = ks,
                      .v = vs,
                      .out = ref.data() + s * H * D,
                      .pos = &pos[s],
                      .n_tokens = 1,
                      .n_head = H,
                      .n_head_kv = Hk,
                      .head_dim = D,
                      .n_kv = pos[s] + 1,
                      .kq_scale = kq_scale,
                      .sliding_window = c.window});
  }
  if (c.gated) th.cpu.mul_sigmoid(ref.data(), gate.data(), (int64_t)ref.size());
  DecodeFusions* f = dev.decode_fusions();
  ASSERT_NE(f, nullptr);
  const QkPrep prep{.q_norm = c.norms ? ptr<float>(dqn) : nullptr,
                    .k_norm = c.norms ? ptr<float>(dkn) : nullptr,
                    .pos = ptr<int32_t>(dpos),
                    .n_rot = c.n_rot,
                    .freq_base = 1e6f,
                    .mode = c.mode,
                    .eps = 1e-6f};
  // From 1024 keys (the CPU's tiled path, split-K at decode) the step's keys split into chunks.
  const int32_t max_pos = *std::max_element(pos.begin(), pos.end());
  EXPECT_EQ(f->decode_attention_form(max_pos), max_pos + 1 >= cpu::kAttentionTiledMinKeys ? 1 : 0);
  auto attend = [&](DType out_type) {
    dev.copy_from_host(dq.data(), q0.data(), q0.size() * sizeof(float));
    dev.copy_from_host(dqg.data(), qg.data(), qg.size() * sizeof(float));
    dev.copy_from_host(dk.data(), k0.data(), k0.size() * sizeof(float));
    const uint64_t e0 = dynamic_cast<opencl::OpenclBackend&>(dev).enqueue_count();
    const std::optional<Act> r = f->decode_attention({.q = c.gated ? ptr<float>(dqg) : ptr<float>(dq),
                                                      .k = ptr<float>(dk),
                                                      .v = ptr<float>(dv),
                                                      .k_cache = dkc.data(),
                                                      .v_cache = dvc.data(),
                                                      .slot_stride = (int64_t)(slot_elems * sizeof(uint16_t)),
                                                      .slots = ptr<int32_t>(dslots),
                                                      .pos = ptr<int32_t>(dpos),
                                                      .max_pos = max_pos,
                                                      .out = ptr<float>(dout),
                                                      .n_seq = S,
                                                      .n_head = H,
                                                      .n_head_kv = Hk,
                                                      .head_dim = D,
                                                      .n_ctx = n_ctx,
                                                      .kq_scale = kq_scale,
                                                      .sliding_window = c.window,
                                                      .k_type = DType::F16,
                                                      .v_type = DType::F16,
                                                      .prep = &prep,
                                                      .gate = c.gated ? ptr<float>(dqg) + D : nullptr,
                                                      .gate_stride = c.gated ? 2 * D : 0,
                                                      .q_stride = c.gated ? 2 * D : 0,
                                                      .out_type = out_type});
    // The norms, RoPE, the k/v store, the attention (and out's rounding for the projection): one launch, the
    // keys split into chunks or not.
    EXPECT_EQ(dynamic_cast<opencl::OpenclBackend&>(dev).enqueue_count() - e0, 1u);
    return r;
  };
  // Each sequence: a row of the CPU's short path (rounded weights) within 2e-4 (a weight on a rounding
  // boundary may flip), one of its tiled path (kAttentionTiledMinKeys keys or more: weights not rounded, so
  // only the sums' order differs) within 2e-5, which rounded weights would miss (~2e-4). The same whatever
  // the projection's type (out_type only adds out's rounding for it).
  auto expect_out = [&](DType out_type) {
    const std::vector<float> got = download<float>(dev, dout, ref.size());
    for (int64_t s = 0; s < S; ++s) {
      const int64_t keys = c.window > 0 ? std::min<int64_t>(c.window, pos[s] + 1) : pos[s] + 1;
      const auto row = [&](const std::vector<float>& x) {
        return std::vector<float>(x.begin() + s * H * D, x.begin() + (s + 1) * H * D);
      };
      EXPECT_LT(rel_err(row(got), row(ref)), keys >= cpu::kAttentionTiledMinKeys ? 2e-5f : 2e-4f)
          << "sequence " << s << ", " << keys << " keys, out_type " << dtype_name(out_type);
    }
  };
  ASSERT_TRUE(attend(DType::F32));
  expect_out(DType::F32);
  // The caches: the new rows (a rounding boundary may flip one f16 ulp), every other row untouched.
  const std::vector<uint16_t> got_k = download<uint16_t>(dev, dkc, kc.size()),
                              got_v = download<uint16_t>(dev, dvc, vc.size());
  EXPECT_LT(rel_err(widen(got_k), widen(kc)), 1e-3f);
  EXPECT_EQ(got_v, vc);
  // Told the output projection's type, the step also rounds out for it in the same launch (blocks across
  // heads: the last group of the heads a block spans): the projection then takes one launch, no rounding of
  // its own, and gives what it gives when it rounds a copy of out itself, bit for bit. The split form rounds
  // only blocks that lie in one group's heads (up to 8 query heads of one KV head); elsewhere the projection
  // rounds for itself (two launches).
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(dev);
  const int64_t gqa = H / Hk;
  const bool split =
      max_pos + 1 >= cpu::kAttentionTiledMinKeys && !(c.window > 0 && c.window < cpu::kAttentionTiledMinKeys);
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16}) {
    const int64_t unit = opencl::block_elems(t), hpu = std::max<int64_t>(1, unit / D);
    if ((H * D) % unit) continue;
    const bool tail = (D % unit == 0 || unit % D == 0) && H % hpu == 0 &&
                      (!split || (gqa % hpu == 0 && (gqa <= 8 || 8 % hpu == 0)));
    RandomWeight wo(dev, t, H * D, 64, 1, rng);
    DeviceBuffer dy(dev, S * 64 * 4), dy2(dev, S * 64 * 4), dcopy(dev, q.size() * sizeof(float));
    ASSERT_TRUE(attend(t));
    expect_out(t);
    const uint64_t e0 = ocl.enqueue_count();
    dev.matmul(wo.dev, ptr<float>(dout), S, ptr<float>(dy));
    EXPECT_EQ(ocl.enqueue_count() - e0, tail ? 1u : 2u) << dtype_name(t);
    dev.copy(dcopy.data(), dout.data(), q.size() * sizeof(float));
    dev.matmul(wo.dev, ptr<float>(dcopy), S, ptr<float>(dy2));
    EXPECT_EQ(download<float>(dev, dy, S * 64), download<float>(dev, dy2, S * 64)) << dtype_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, OpenCLFusedDecodeAttention,
    ::testing::Values(
        DecodeCase{32, 4, 128, 128, 256, {2, 0, 1}, {5, 70, 200}, true, RopeMode::neox},
        DecodeCase{4, 2, 16, 16, 64, {0}, {20}, false, RopeMode::normal},                  // tiny_llama
        DecodeCase{8, 2, 64, 32, 96, {1, 0}, {0, 95}, true, RopeMode::normal},             // partial rotary
        DecodeCase{4, 1, 256, 256, 128, {0, 1}, {40, 127}, true, RopeMode::neox, 32},      // window
        DecodeCase{16, 2, 256, 64, 256, {1, 0}, {3, 130}, true, RopeMode::neox, 0, true},  // Qwen3.5 gated
        DecodeCase{8, 2, 64, 64, 1000, {0}, {900}, true, RopeMode::neox},  // scores kept past 512 keys
        // From 1024 keys, split into chunks (qwen3-30b-a3b's heads; the short two as one chunk, the CPU's
        // short path's steps).
        DecodeCase{32, 4, 128, 128, 1600, {2, 0, 1}, {1500, 40, 700}, true, RopeMode::neox},
        DecodeCase{16, 2, 256, 64, 1100, {0}, {1024}, true, RopeMode::neox, 0, true},  // Qwen3.5, gated
        DecodeCase{4, 1, 64, 64, 1300, {0}, {1299}, false, RopeMode::normal, 300},     // window: not split
        DecodeCase{4, 1, 64, 64, 1700, {0}, {1699}, false, RopeMode::normal, 1200},    // window: split
        DecodeCase{32, 2, 64, 32, 1200, {0, 1}, {1199, 600}, true, RopeMode::normal},  // 16 heads a KV head
        // Qwen2.5-7B's 7 query heads a KV head: Q4_K's blocks (two heads of 128) span two KV heads' groups.
        DecodeCase{14, 2, 128, 128, 1100, {1, 0}, {1030, 500}, true, RopeMode::neox}));

// The FFN half of a decode step (or a prefill, PrefillRows) of a qwen3moe layer: x += d; cur = norm(x);
// x += experts(cur); cur = next norm(x). With `shared`, a Qwen3.5 layer's: a sigmoid-gated shared expert of
// the experts' width too (one slot more a token in the fused kernels; its gate in the router's launch).
class OpenCLFusedMoe : public ::testing::TestWithParam<std::tuple<DType, int, bool, bool>> {};

TEST_P(OpenCLFusedMoe, MatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  const auto [type, n, gpu_width, shared] = GetParam();
  Backend& b = gpu_width ? *device_gpu_width() : dev;
  std::mt19937 rng(47 + n);
  ModelConfig c;
  c.n_embd = 2048, c.n_expert = 16, c.n_expert_used = 8, c.n_ff_exp = 768, c.n_ff_shexp = 768;
  c.expert_weights_norm = true;
  c.rms_eps = 1e-6f;
  const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
  // One random layer per weight type (quantized once), uploaded to the backend of this case.
  static std::map<DType, std::vector<std::unique_ptr<RandomWeight>>> layers;
  auto& made = layers[type];
  if (made.empty()) {
    std::mt19937 wrng(59);
    for (auto [t, k, rows] : {std::tuple{DType::F32, E, X}, {type, E, F}, {type, E, F}, {type, F, E}})
      made.push_back(std::make_unique<RandomWeight>(b, t, k, rows, t == DType::F32 ? 1 : X, wrng));
    // The shared expert: its gate row, gate, up, down.
    for (auto [t, k, rows] :
         {std::tuple{DType::F32, E, int64_t(1)}, {type, E, F}, {type, E, F}, {type, F, E}})
      made.push_back(std::make_unique<RandomWeight>(b, t, k, rows, 1, wrng));
  }
  RandomWeight router(*made[0], b), gate(*made[1], b), up(*made[2], b), down(*made[3], b);
  LayerWeights host, lw;
  host.ffn_gate_inp = router.host, host.ffn_gate_exps = gate.host, host.ffn_up_exps = up.host;
  host.ffn_down_exps = down.host;
  lw.ffn_gate_inp = router.dev, lw.ffn_gate_exps = gate.dev, lw.ffn_up_exps = up.dev,
  lw.ffn_down_exps = down.dev;
  std::vector<std::unique_ptr<RandomWeight>> sh;
  if (shared) {
    for (int i = 4; i < 8; ++i) sh.push_back(std::make_unique<RandomWeight>(*made[i], b));
    host.ffn_gate_inp_shexp = sh[0]->host, host.ffn_gate_shexp = sh[1]->host, host.ffn_up_shexp = sh[2]->host;
    host.ffn_down_shexp = sh[3]->host;
    lw.ffn_gate_inp_shexp = sh[0]->dev, lw.ffn_gate_shexp = sh[1]->dev, lw.ffn_up_shexp = sh[2]->dev;
    lw.ffn_down_shexp = sh[3]->dev;
  }
  std::vector<float> x = random_vec(n * E, rng), cur(n * E);
  const std::vector<float> d = random_vec(n * E, rng), w = random_vec(E, rng), next_w = random_vec(E, rng);
  DeviceBuffer dx = upload(b, x), dd = upload(b, d), dw = upload(b, w), dnw = upload(b, next_w),
               dcur(b, cur.size() * sizeof(float));
  // The next layer's two products on cur (a q/k/v-like matmuls): one before the layer, so the layer's last
  // kernel knows their rounding and rounds cur for them (no rounding launch after it).
  static std::map<DType, std::unique_ptr<RandomWeight>> next_made;
  if (!next_made[type]) {
    std::mt19937 wrng(61);
    next_made[type] = std::make_unique<RandomWeight>(b, type, E, 256, 2, wrng);
  }
  RandomWeight nxt(*next_made[type], b);
  Weight w0 = nxt.dev, w1 = nxt.dev;
  w0.ne[2] = w1.ne[2] = 1;
  w1.data = static_cast<uint8_t*>(nxt.buf.data()) + nxt.bytes.size() / 2;
  DeviceBuffer dy0(b, n * 256 * 4), dy1(b, n * 256 * 4), dcur2(b, cur.size() * sizeof(float));
  const Backend::MatmulJob jobs[] = {{&w0, ptr<float>(dy0)}, {&w1, ptr<float>(dy1)}};
  b.matmuls(ptr<float>(dd), n, jobs);
  std::vector<float> x_in = x;  // x + d: what the layer adds the experts' sum to
  for (size_t i = 0; i < x_in.size(); ++i) x_in[i] += d[i];
  th.cpu.add_rmsnorm_moe_ffn_add(moe_ffn_args(c, host, 0, nullptr), d.data(), x.data(), w.data(), cur.data(),
                                 n, next_w.data());
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(b);
  const uint64_t e0 = ocl.enqueue_count();
  b.add_rmsnorm_moe_ffn_add(moe_ffn_args(c, lw, 0, nullptr), ptr<float>(dd), ptr<float>(dx), ptr<float>(dw),
                            ptr<float>(dcur), n, ptr<float>(dnw));
  const uint64_t layer_launches = ocl.enqueue_count() - e0;
  if (n < opencl::kMoeGemmMinRows) {
    EXPECT_EQ(layer_launches, 3u) << "the fused layer: the router, gate/up and down launches alone";
  }
  b.matmuls(ptr<float>(dcur), n, jobs);  // cur as the layer's last kernel rounded it
  const std::vector<float> y_pre = download<float>(b, dy0, n * 256);
  // Summation order moves the hidden state by ~1e-7, which can flip one int8 rounding of it (~5e-4). Through
  // the shared expert (weight sigmoid(g), ~0.5, against ~1/8 for a routed one) a flip weighs ~4x more: 2.3e-3
  // of the experts' sum on one of these cases, the same with the plain ops (XPERT_OPENCL_OPTS fused=0).
  const float moe_tol = shared ? 5e-3f : 1e-3f, next_tol = shared ? 1e-2f : 2e-3f;
  const std::vector<float> x_dev = download<float>(b, dx, x.size());
  EXPECT_LT(rel_err(x_dev, x), 2e-3f) << "n=" << n;
  // The experts' sum alone (small beside x: a wrong block of one expert's row would hide in x's error).
  std::vector<float> moe_dev(x.size()), moe_ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) moe_dev[i] = x_dev[i] - x_in[i], moe_ref[i] = x[i] - x_in[i];
  EXPECT_LT(rel_err(moe_dev, moe_ref), moe_tol) << "n=" << n;
  EXPECT_LT(rel_err(download<float>(b, dcur, cur.size()), cur), 2e-3f) << "n=" << n;
  std::vector<float> ref(n * 256);
  Weight h0 = nxt.host;
  h0.ne[2] = 1;
  th.cpu.matmul(h0, cur.data(), n, ref.data(), 0);
  EXPECT_LT(rel_err(y_pre, ref), next_tol) << "n=" << n;
  // The same product of a copy of cur (rounded by its own launch): the same bits.
  b.copy(ptr<float>(dcur2), ptr<float>(dcur), cur.size() * sizeof(float));
  b.matmuls(ptr<float>(dcur2), n, jobs);
  EXPECT_EQ(download<float>(b, dy0, n * 256), y_pre) << "n=" << n;
  if (n < opencl::kMoeGemmMinRows || shared) return;
  // A prefill's rows: the plain ops' order, but the norm rounds x for gate/up and the next norm adds the
  // experts' sum to x in its launch: the MoE's own launches (as it takes them alone, its rounding of x
  // included) and one more, where a launch of its own added the sum before.
  DeviceBuffer dt(b, n * E * sizeof(float));
  const uint64_t e1 = ocl.enqueue_count();
  b.moe_ffn(moe_ffn_args(c, lw, 0, nullptr), ptr<float>(dd), n, ptr<float>(dt));
  EXPECT_EQ(layer_launches, ocl.enqueue_count() - e1 + 1) << "n=" << n;
}

// Qwen3-30B-A3B's routing (128 experts, top-8) on small Q8_0 experts, with exact ties: the router rows of
// experts 3k, 3k+1 and 3k+2 are equal, so the top 8 end inside a group of three and the lower indices must
// win, as on the CPU.
TEST(OpenCLFused, RoutingOf128ExpertsWithTiesMatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  std::mt19937 rng(53);
  ModelConfig c;
  c.n_embd = 64, c.n_expert = 128, c.n_expert_used = 8, c.n_ff_exp = 32;
  c.expert_weights_norm = true;
  c.rms_eps = 1e-6f;
  const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert, n = 5;
  RandomWeight router(dev, DType::F32, E, X, 1, rng), gate(dev, DType::Q8_0, E, F, X, rng),
      up(dev, DType::Q8_0, E, F, X, rng), down(dev, DType::Q8_0, F, E, X, rng);
  float* r = reinterpret_cast<float*>(router.bytes.data());
  for (int64_t e = 0; e < X; ++e)
    if (e % 3) std::copy(r + (e - e % 3) * E, r + (e - e % 3 + 1) * E, r + e * E);
  dev.copy_from_host(router.buf.data(), router.bytes.data(), router.bytes.size());
  LayerWeights host, lw;
  host.ffn_gate_inp = router.host, host.ffn_gate_exps = gate.host, host.ffn_up_exps = up.host;
  host.ffn_down_exps = down.host;
  lw.ffn_gate_inp = router.dev, lw.ffn_gate_exps = gate.dev, lw.ffn_up_exps = up.dev,
  lw.ffn_down_exps = down.dev;
  std::vector<float> x = random_vec(n * E, rng), cur(n * E);
  const std::vector<float> d = random_vec(n * E, rng), w = random_vec(E, rng);
  DeviceBuffer dx = upload(dev, x), dd = upload(dev, d), dw = upload(dev, w),
               dcur(dev, cur.size() * sizeof(float));
  th.cpu.add_rmsnorm_moe_ffn_add(moe_ffn_args(c, host, 0, nullptr), d.data(), x.data(), w.data(), cur.data(),
                                 n, nullptr);
  dev.add_rmsnorm_moe_ffn_add(moe_ffn_args(c, lw, 0, nullptr), ptr<float>(dd), ptr<float>(dx), ptr<float>(dw),
                              ptr<float>(dcur), n, nullptr);
  EXPECT_LT(rel_err(download<float>(dev, dx, x.size()), x), 2e-3f);
  EXPECT_LT(rel_err(download<float>(dev, dcur, cur.size()), cur), 1e-5f);  // the norm before the experts
}

INSTANTIATE_TEST_SUITE_P(
    Batches, OpenCLFusedMoe,
    ::testing::Combine(::testing::Values(DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F16),
                       ::testing::Values(1, 3), ::testing::Bool(), ::testing::Values(false)));
// A prefill's rows (the tiled MoE products, not the fused decode launches).
INSTANTIATE_TEST_SUITE_P(PrefillRows, OpenCLFusedMoe,
                         ::testing::Combine(::testing::Values(DType::Q4_K, DType::Q8_0),
                                            ::testing::Values(24), ::testing::Values(false),
                                            ::testing::Bool()));
INSTANTIATE_TEST_SUITE_P(SharedExpert, OpenCLFusedMoe,
                         ::testing::Combine(::testing::Values(DType::Q4_K, DType::Q8_0),
                                            ::testing::Values(1, 3), ::testing::Bool(),
                                            ::testing::Values(true)));

// Launches keep a kernel object per argument set (XPERT_OPENCL_OPTS arg_cache): alternating arguments must each
// reach their own launch.
TEST(OpenCLFused, RepeatedLaunchesKeepTheirArguments) {
  DEVICE_OR_SKIP();
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30, 40};
  DeviceBuffer da = upload(dev, a), db = upload(dev, b);
  for (int i = 0; i < 3; ++i) {
    dev.scale(ptr<float>(da), 2.0f, 3);
    dev.scale(ptr<float>(db), 0.5f, 4);
    dev.scale(ptr<float>(db), 3.0f, 2);  // the same kernel and buffer, another factor and length
  }
  EXPECT_EQ(download<float>(dev, da, 3), (std::vector<float>{8, 16, 24}));
  EXPECT_EQ(download<float>(dev, db, 4), (std::vector<float>{33.75f, 67.5f, 3.75f, 5.0f}));
}

// Argument sets that come again get kernel objects of their own (made the second time), and more of them
// than the backend keeps (XPERT_OPENCL_OPTS arg_sets, here 8; 1,024 by default) are dropped and made again: every
// launch still runs with its own arguments. (Making an object costs ~80 ms on PoCL: few of them here.)
TEST(OpenCLFused, ManyArgumentSetsOfOneKernel) {
  DEVICE_OR_SKIP();
  (void)dev;
  setenv("XPERT_OPENCL_OPTS", "arg_sets=8", 1);
  auto b = make_opencl_backend(0);
  unsetenv("XPERT_OPENCL_OPTS");
  const int n = 12;
  std::vector<float> ref(n, 1.0f);
  DeviceBuffer buf = upload(*b, ref);
  for (int round = 0; round < 2; ++round)
    for (int i = 1; i <= n; ++i)
      for (int twice = 0; twice < 2; ++twice) {  // each set's object made at once; the ninth drops the eight
        const float f = i % 2 ? 2.0f : 0.5f;     // powers of two: exact
        b->scale(ptr<float>(buf), f, i);
        for (int j = 0; j < i; ++j) ref[j] *= f;
      }
  EXPECT_EQ(download<float>(*b, buf, n), ref);
}

// A probe of the launch cost that logs and leaves the backend working.
TEST(OpenCLFused, LaunchProbeRuns) {
  DEVICE_OR_SKIP();
  (void)dev;
  setenv("XPERT_OPENCL_OPTS", "probe", 1);
  auto b = make_opencl_backend(0);
  unsetenv("XPERT_OPENCL_OPTS");
  const std::vector<float> v = {1, 2, 3};
  DeviceBuffer buf = upload(*b, v);
  b->scale(ptr<float>(buf), 2.0f, 3);
  EXPECT_EQ(download<float>(*b, buf, 3), (std::vector<float>{2, 4, 6}));
}

// nv_regs: NVIDIA's register cap where the device offers cl_nv_compiler_options (the products still right),
// elsewhere a message naming the switch instead of a build option the compiler would refuse (0, no cap,
// is accepted everywhere).
TEST(OpenCLFused, RegisterCapOnlyWhereOffered) {
  DEVICE_OR_SKIP();
  (void)dev;
  setenv("XPERT_OPENCL_OPTS", "nv_regs=128", 1);
  std::shared_ptr<Backend> b;
  std::string error;
  try {
    b = make_opencl_backend(0);
  } catch (const Error& e) {
    error = e.what();
  }
  unsetenv("XPERT_OPENCL_OPTS");
  const bool offered = opencl::device_info(0).nv_compiler_options;
  if (!offered) {
    EXPECT_FALSE(b);
    EXPECT_NE(error.find("nv_regs=128"), std::string::npos) << error;
    EXPECT_NE(error.find("cl_nv_compiler_options"), std::string::npos) << error;
    setenv("XPERT_OPENCL_OPTS", "nv_regs=0", 1);  // the compiler's choice: nothing to refuse
    EXPECT_NO_THROW(make_opencl_backend(0));
    unsetenv("XPERT_OPENCL_OPTS");
    return;
  }
  ASSERT_TRUE(b) << error;
  std::mt19937 rng(5);
  const int64_t k = 256, n = 64, m = 40;
  const std::vector<uint8_t> wq = random_weights(DType::Q4_K, n, k, rng);
  const std::vector<float> x = random_vec(m * k, rng);
  std::vector<float> ref(m * n);
  cpu::matmul_reference(DType::Q4_K, wq.data(), n, k, x.data(), m, ref.data(), n);
  DeviceBuffer wbuf = upload(*b, wq), xbuf = upload(*b, x), ybuf = upload(*b, std::vector<float>(m * n));
  Weight w{.type = DType::Q4_K, .data = wbuf.data(), .ne = {k, n, 1}, .n_bytes = wq.size()};
  b->matmul(w, ptr<float>(xbuf), m, ptr<float>(ybuf), n);
  EXPECT_LT(rel_err(download<float>(*b, ybuf, m * n), ref), 1e-5f);
}

}  // namespace
// XPERT_OPENCL_OPTS: items by commas or colons, bare names switch on; a bad item stops with its name.
TEST(OpenCLSwitches, ParsesItemsAndRefusesBadOnes) {
  auto with = [](const char* v) {
    setenv("XPERT_OPENCL_OPTS", v, 1);
    opencl::Switches s;
    try {
      s = opencl::read_switches();
    } catch (...) {
      unsetenv("XPERT_OPENCL_OPTS");
      throw;
    }
    unsetenv("XPERT_OPENCL_OPTS");
    return s;
  };
  const opencl::Switches d = with("");
  EXPECT_TRUE(d.fused && d.tail && d.arg_cache && d.wide);
  EXPECT_FALSE(d.probe || d.stats || d.profile);
  EXPECT_EQ(d.arg_sets, 1024);
  EXPECT_EQ(d.mv_wg, 0);
  EXPECT_EQ(d.mv_r, 0);
  EXPECT_TRUE(d.graphs && d.subgroups);
  const opencl::Switches g0 = with("graphs=0:subgroups=0");
  EXPECT_FALSE(g0.graphs || g0.subgroups);
  const opencl::Switches s =
      with("fused=0:tail=0,arg_cache=0:wide=0,mv_wg=16:arg_sets=8,probe:stats,profile=1,mv_r=8");
  EXPECT_FALSE(s.fused || s.tail || s.arg_cache || s.wide);
  EXPECT_TRUE(s.probe && s.stats && s.profile);
  EXPECT_EQ(s.mv_wg, 16);
  EXPECT_EQ(s.arg_sets, 8);
  EXPECT_EQ(s.mv_r, 8);
  EXPECT_EQ(d.ksplit, 0);
  EXPECT_EQ(d.nv_regs, -1);  // kNvRegs where NVIDIA's compiler options are offered
  const opencl::Switches k = with("ksplit=1:nv_regs=128");
  EXPECT_EQ(k.ksplit, 1);
  EXPECT_EQ(k.nv_regs, 128);
  EXPECT_EQ(with("nv_regs=0").nv_regs, 0);  // the compiler's choice
  EXPECT_EQ(d.pt_bufs, 0);                  // the device's: two where they fit
  EXPECT_EQ(with("pt_bufs=1").pt_bufs, 1);
  EXPECT_EQ(with("pt_bufs=2").pt_bufs, 2);
  for (const char* bad :
       {"bogus", "fused=2", "mv_wg=12", "mv_wg=512", "arg_sets=0", "arg_sets=x", "mv_r=3", "mv_r=32",
        "ksplit=-1", "ksplit=65", "nv_regs=16", "nv_regs=256", "nv_regs=-1", "pt_bufs=0", "pt_bufs=3"}) {
    try {
      with(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("XPERT_OPENCL_OPTS"), std::string::npos) << e.what();
    }
  }
}

}  // namespace xpert

#else
TEST(OpenCLFused, NotBuiltIn) { GTEST_SKIP() << "built without the OpenCL backend"; }
#endif
