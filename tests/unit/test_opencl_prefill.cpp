// The whole-model OpenCL backend's prefill products (backend/opencl/prefill.cpp, kernels_prefill.h) on random
// data: the register-tiled GEMM against cpu::matmul_reference (rows and features that are not whole tiles),
// and a MoE layer's prefill routed and grouped on the device (moe_route_slots, moe_group, the grouped gate/up
// + SwiGLU and down products, the combine) against cpu::moe_ffn_reference, the CPU backend and the
// host-routed path of before (XPERT_OPENCL_OPTS prefill=0), with 32- and 64-row tiles; the backend's pool of
// freed blocks. CI runs it on PoCL; without an OpenCL device it skips.
#include <gtest/gtest.h>

#ifdef XPERT_HAVE_OPENCL
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/moe.h"
#include "backend/opencl/backend_impl.h"
#include "backend/opencl/opencl_backend.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "opencl_test_util.h"
#include "quant/quant.h"

namespace xpert {
namespace {

using namespace cltest;

// Device 0 as a whole-model backend made under XPERT_OPENCL_OPTS=opts (one per setting, kept for the binary).
Backend* device_with(const std::string& opts) {
  static std::map<std::string, std::shared_ptr<Backend>> made;
  if (!device()) return nullptr;
  auto it = made.find(opts);
  if (it != made.end()) return it->second.get();
  setenv("XPERT_OPENCL_OPTS", opts.c_str(), 1);
  std::shared_ptr<Backend> b = make_opencl_backend(0);
  unsetenv("XPERT_OPENCL_OPTS");
  return made.emplace(opts, b).first->second.get();
}

// --- the tiled GEMM ---------------------------------------------------------------------------------------

class OpenCLPrefillGemm : public ::testing::TestWithParam<DType> {};

TEST_P(OpenCLPrefillGemm, MatchesReference) {
  DEVICE_OR_SKIP();
  const DType type = GetParam();
  std::mt19937 rng(71 + (int)type);
  // 200 features (two 128-feature tiles, the second's second half partial), rows of 512 (two K-quant
  // blocks). On a device of two compute units (PoCL and Intel's runtime on CI's two cores), 50 rows take
  // 32-row tiles and 300 rows 64-row ones (prefill.cpp gemm_tiled), each with a partial tile.
  const int64_t k = 512, n = 200, ldy = n + 8;
  const std::vector<uint8_t> wq = random_weights(type, n, k, rng);
  DeviceBuffer wbuf = upload(dev, wq);
  Weight w{.type = type, .data = wbuf.data(), .ne = {k, n, 1}, .n_bytes = wq.size()};
  for (const int64_t m : {50, 300}) {
    const std::vector<float> x = random_vec(m * k, rng);
    std::vector<float> ref(m * n);
    cpu::matmul_reference(type, wq.data(), n, k, x.data(), m, ref.data(), n);
    DeviceBuffer xbuf = upload(dev, x), ybuf = upload(dev, std::vector<float>(m * ldy, 7.0f));
    dev.matmul(w, ptr<float>(xbuf), m, ptr<float>(ybuf), ldy);
    bool untouched = false;
    const std::vector<float> packed =
        first_columns(download<float>(dev, ybuf, m * ldy), m, n, ldy, 7.0f, &untouched);
    EXPECT_TRUE(untouched) << m << " rows: a column past n was written";
    EXPECT_LT(rel_err(packed, ref), 1e-5f) << dtype_name(type) << ", " << m << " rows";
    // One local-memory buffer (pt_bufs=1) or two (the default where they fit): the same sums, the same bits.
    Backend& one = *device_with("pt_bufs=1");
    DeviceBuffer wb1 = upload(one, wq), xb1 = upload(one, x),
                 yb1 = upload(one, std::vector<float>(m * ldy, 7.0f));
    Weight w1 = w;
    w1.data = wb1.data();
    one.matmul(w1, ptr<float>(xb1), m, ptr<float>(yb1), ldy);
    EXPECT_EQ(download<float>(one, yb1, m * ldy), download<float>(dev, ybuf, m * ldy))
        << dtype_name(type) << ", " << m << " rows, pt_bufs=1";
  }
}

// The product split along k (gemm_split: gemm_tk_m32 / gemm_tk_m64 into planes that each tile's last slice
// adds, in the same launch): forced with
// XPERT_OPENCL_OPTS ksplit=N (32-row tiles), and as the device plans it (ksplit=0: on CI's two units, two
// 64-row tiles in 2 slices). k of 1,000 for F32 (four slices of 256, the last one 232), 1,024 in two slices
// of 512 and in four of 256. 40 rows, 200 features (a partial tile each way; 198 once: the sums' scalar
// form). Each product runs twice: the tiles' counts start from 0 again, so the second gives the same bits.
TEST_P(OpenCLPrefillGemm, SplitAlongKMatchesReference) {
  const DType type = GetParam();
  std::mt19937 rng(91 + (int)type);
  struct Case {
    int64_t k, n;
    int slices;
  };
  for (const Case& c : {Case{1000, 200, 4}, Case{1024, 198, 2}, Case{1024, 200, 4}}) {
    if (c.k % opencl::block_elems(type) != 0) continue;
    const int64_t n = c.n, k = c.k, m = 40, ldy = n + 8;
    const std::vector<uint8_t> wq = random_weights(type, n, k, rng);
    const std::vector<float> x = random_vec(m * k, rng);
    std::vector<float> ref(m * n);
    cpu::matmul_reference(type, wq.data(), n, k, x.data(), m, ref.data(), n);
    uint64_t whole = 0;
    for (const int split : {1, c.slices, 0}) {  // ksplit=1: the same product whole, for its launch count
      Backend* d = device_with(fmt::format("ksplit={}", split));
      if (!d) GTEST_SKIP() << "no OpenCL device with SVM";
      auto& ocl = dynamic_cast<opencl::OpenclBackend&>(*d);
      DeviceBuffer wbuf = upload(*d, wq), xbuf = upload(*d, x),
                   ybuf = upload(*d, std::vector<float>(m * ldy, 7.0f));
      Weight w{.type = type, .data = wbuf.data(), .ne = {k, n, 1}, .n_bytes = wq.size()};
      const uint64_t e0 = ocl.enqueue_count();
      d->matmul(w, ptr<float>(xbuf), m, ptr<float>(ybuf), ldy);
      const uint64_t enqueues = ocl.enqueue_count() - e0;
      const std::vector<float> first = download<float>(*d, ybuf, m * ldy);
      d->matmul(w, ptr<float>(xbuf), m, ptr<float>(ybuf), ldy);
      bool untouched = false;
      const std::vector<float> packed = first_columns(first, m, n, ldy, 7.0f, &untouched);
      const std::string what = fmt::format("{}, n {}, k {}, ksplit={}", dtype_name(type), n, k, split);
      EXPECT_TRUE(untouched) << what << ": a column past n was written";
      EXPECT_LT(rel_err(packed, ref), 1e-5f) << what;
      EXPECT_EQ(download<float>(*d, ybuf, m * ldy), first) << what << ": the second run differs";
      // The split form is one launch too: each tile's last slice adds the planes.
      if (split == c.slices) {
        EXPECT_GT(opencl::dense_plan(n, m, k, std::max<uint32_t>(ocl.facts().compute_units, 1), split).slices,
                  1)
            << what;
      }
      if (split == 1)
        whole = enqueues;
      else
        EXPECT_EQ(enqueues, whole) << what;
    }
  }
}

// Two products of one type and shape on the same rows (a layer's k and v) through matmuls, where gemm would
// split each along k: one launch for both (gemm_pair), each product's columns after the first's column
// groups. With ksplit=4 the pair's slices are each product's alone, so the bits are two matmuls'; the
// device's own plan (ksplit=0: on CI's two units the pair is not split, so not paired) is checked against
// the reference. 40 rows (past kGemvMaxRows), 200 features (a partial column tile: the second product's
// groups start at a whole tile), k 1,024, y rows of 208.
TEST_P(OpenCLPrefillGemm, PairOfProductsInOneLaunch) {
  const DType type = GetParam();
  std::mt19937 rng(97 + (int)type);
  const int64_t n = 200, k = 1024, m = 40, ldy = n + 8;
  const std::vector<uint8_t> wq1 = random_weights(type, n, k, rng), wq2 = random_weights(type, n, k, rng);
  const std::vector<float> x = random_vec(m * k, rng);
  std::vector<float> ref1(m * n), ref2(m * n);
  cpu::matmul_reference(type, wq1.data(), n, k, x.data(), m, ref1.data(), n);
  cpu::matmul_reference(type, wq2.data(), n, k, x.data(), m, ref2.data(), n);
  for (const int split : {4, 0}) {
    Backend* d = device_with(fmt::format("ksplit={}", split));
    if (!d) GTEST_SKIP() << "no OpenCL device with SVM";
    auto& ocl = dynamic_cast<opencl::OpenclBackend&>(*d);
    DeviceBuffer w1buf = upload(*d, wq1), w2buf = upload(*d, wq2), xbuf = upload(*d, x);
    DeviceBuffer y1 = upload(*d, std::vector<float>(m * ldy, 7.0f)),
                 y2 = upload(*d, std::vector<float>(m * ldy, 7.0f));
    DeviceBuffer s1 = upload(*d, std::vector<float>(m * ldy, 7.0f)),
                 s2 = upload(*d, std::vector<float>(m * ldy, 7.0f));
    const Weight w1{.type = type, .data = w1buf.data(), .ne = {k, n, 1}, .n_bytes = wq1.size()};
    const Weight w2{.type = type, .data = w2buf.data(), .ne = {k, n, 1}, .n_bytes = wq2.size()};
    const Backend::MatmulJob jobs[] = {{&w1, ptr<float>(y1), ldy}, {&w2, ptr<float>(y2), ldy}};
    uint64_t e0 = ocl.enqueue_count();
    d->matmuls(ptr<float>(xbuf), m, jobs);
    const uint64_t paired = ocl.enqueue_count() - e0;
    e0 = ocl.enqueue_count();
    d->matmul(w1, ptr<float>(xbuf), m, ptr<float>(s1), ldy);
    d->matmul(w2, ptr<float>(xbuf), m, ptr<float>(s2), ldy);
    const uint64_t apart = ocl.enqueue_count() - e0;
    const std::string what = fmt::format("{}, ksplit={}", dtype_name(type), split);
    const std::vector<float> got1 = download<float>(*d, y1, m * ldy), got2 = download<float>(*d, y2, m * ldy);
    bool untouched1 = false, untouched2 = false;
    EXPECT_LT(rel_err(first_columns(got1, m, n, ldy, 7.0f, &untouched1), ref1), 1e-5f) << what;
    EXPECT_LT(rel_err(first_columns(got2, m, n, ldy, 7.0f, &untouched2), ref2), 1e-5f) << what;
    EXPECT_TRUE(untouched1 && untouched2) << what << ": a column past n was written";
    if (split == 4) {
      EXPECT_EQ(got1, download<float>(*d, s1, m * ldy)) << what;
      EXPECT_EQ(got2, download<float>(*d, s2, m * ldy)) << what;
      // matmul rounds x for each product (F32 rows are not rounded); matmuls once, and one launch does both.
      const uint64_t rounds = type == DType::F32 ? 0 : 1;
      EXPECT_EQ(apart - paired, rounds + 1) << what << ": " << paired << " against " << apart;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, OpenCLPrefillGemm,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K,
                                           DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// gemm_tiled's plan (dense_plan): 64-row tiles where they make about two work-groups a compute unit; fewer
// of them split along k into about that many while the 32-row tiles cover the units; below that 64-row tiles
// in at most 16 slices where they reach about two a unit and the rows fill them, else 32-row tiles split into
// about two a unit (at most 16 slices, whole 256-element slices); ksplit=1 the rule before the split;
// ksplit=N > 1 32-row tiles in N slices as far as k allows.
TEST(OpenCLPrefillGemm, PlanFillsTheUnits) {
  struct Case {
    int64_t n, m, k, units;
    int forced;
    opencl::DensePlan want;
    const char* what;
  };
  // qwen3-30b-a3b at 512 rows on an H100's 132 units, then CI's two units, then the switch's forms.
  const Case cases[] = {
      {128, 512, 2048, 132, 0, {32, 8, 256}, "the router (128 features): 8 slices of 256"},
      {1024, 512, 2048, 132, 0, {64, 4, 512}, "k and v as a pair (2 x 512)"},
      {512, 512, 2048, 132, 0, {64, 8, 256}, "k / v (512): 64-row tiles in 8 slices of 256"},
      {512, 40, 2048, 132, 0, {32, 8, 256}, "k / v of 40 rows: 64-row tiles too few"},
      {4096, 512, 2048, 132, 0, {64, 1, 0}, "q (256 tiles of 64 rows): whole"},
      {2048, 512, 4096, 132, 0, {64, 2, 2048}, "o (128 tiles of 64 rows, k 4,096): 2 slices"},
      {8192, 512, 2048, 132, 0, {64, 1, 0}, "8,192 features: whole"},
      {1, 1, 65536, 132, 0, {32, 16, 4096}, "one tile: 16 slices at most"},
      {128, 512, 256, 132, 0, {32, 1, 0}, "one slice of k: nothing to split"},
      {200, 40, 1024, 2, 0, {64, 2, 512}, "two units, two 64-row tiles: 2 slices"},
      {128, 20, 4096, 2, 0, {32, 4, 1024}, "two units, 20 rows: 32-row tile, 4 slices"},
      {2048, 512, 2048, 2, 0, {64, 1, 0}, "two units, many tiles: whole"},
      {4096, 512, 2048, 132, 1, {32, 1, 0}, "ksplit=1: 32-row tiles below two 64-row ones a unit"},
      {8192, 512, 2048, 132, 1, {64, 1, 0}, "ksplit=1: 64-row tiles from two a unit"},
      {128, 512, 2048, 132, 1, {32, 1, 0}, "ksplit=1: never split"},
      {200, 40, 1000, 132, 3, {32, 2, 512}, "ksplit=3 of 4 blocks: 2 slices of 512"},
      {200, 40, 1000, 132, 4, {32, 4, 256}, "ksplit=4 of 4 blocks: 4 slices of 256"},
  };
  for (const Case& c : cases) {
    const opencl::DensePlan p = opencl::dense_plan(c.n, c.m, c.k, c.units, c.forced);
    EXPECT_EQ(p.bm, c.want.bm) << c.what;
    EXPECT_EQ(p.slices, c.want.slices) << c.what;
    EXPECT_EQ(p.kc, c.want.kc) << c.what;
  }
}

// The prefill tiles' buffers: two where the device's local memory holds them (the MoE _m64 form's 40 KiB,
// the dense one's 48: NVIDIA's 48 KiB, an Intel GPU's 64), else one; pt_bufs=1 always one, pt_bufs=2 two or
// a refusal (0).
TEST(OpenCLPrefillMoeTiles, TwoBuffersWhereTheyFit) {
  EXPECT_EQ(opencl::kTwoTileBufsBytes, 40u * 1024);
  // The dense tiles' two buffers: the _m64 form's 48 KiB (NVIDIA's whole work-group).
  EXPECT_EQ(opencl::kTwoDenseBufsBytes, 48u * 1024);
  EXPECT_EQ(opencl::tile_bufs_for(48 * 1024, 0, opencl::kTwoDenseBufsBytes), 2);
  EXPECT_EQ(opencl::tile_bufs_for(40 * 1024, 0, opencl::kTwoDenseBufsBytes), 1);
  EXPECT_EQ(opencl::tile_bufs_for(40 * 1024, 2, opencl::kTwoDenseBufsBytes), 0);
  EXPECT_EQ(opencl::tile_bufs_for(48 * 1024, 0), 2);
  EXPECT_EQ(opencl::tile_bufs_for(40 * 1024, 0), 2);
  EXPECT_EQ(opencl::tile_bufs_for(32 * 1024, 0), 1);
  EXPECT_EQ(opencl::tile_bufs_for(64 * 1024, 1), 1);
  EXPECT_EQ(opencl::tile_bufs_for(64 * 1024, 2), 2);
  EXPECT_EQ(opencl::tile_bufs_for(32 * 1024, 2), 0);
}

// --- memory: freed blocks kept for reuse -------------------------------------------------------------------

// A freed block comes back for an allocation of its size (or up to half smaller) without a driver call or a
// command, and counts as free memory meanwhile.
TEST(OpenCLMemory, FreedBlocksAreReused) {
  Backend* d = device_with("");
  if (!d) GTEST_SKIP() << "no OpenCL device with SVM";
  auto& ocl = dynamic_cast<opencl::OpenclBackend&>(*d);
  const size_t free0 = d->free_memory();
  void* a = d->alloc(7 << 20);
  EXPECT_EQ(d->free_memory(), free0 - (7 << 20));
  const uint64_t e0 = ocl.enqueue_count();
  d->dealloc(a);
  EXPECT_EQ(ocl.enqueue_count(), e0) << "a pooled block is not freed on the queue";
  EXPECT_EQ(d->free_memory(), free0);
  void* b = d->alloc((7 << 20) - 4096);
  EXPECT_EQ(b, a);
  void* c = d->alloc(1 << 20);  // nothing pooled of that size: a new block
  EXPECT_NE(c, a);
  d->dealloc(b);
  void* e = d->alloc(1 << 20);  // the 7 MiB block is more than twice as large: not taken
  EXPECT_NE(e, b);
  d->dealloc(c);
  d->dealloc(e);
  EXPECT_EQ(d->free_memory(), free0);
}

// --- prefill attention (attention_block: 8 tokens a work-group) --------------------------------------------

class OpenCLPrefillAttention : public ::testing::TestWithParam<AttCase> {};

TEST_P(OpenCLPrefillAttention, MatchesCpuAndPerTokenKernel) {
  const AttCase c = GetParam();
  Backend* d = device_with("");
  if (!d) GTEST_SKIP() << "no OpenCL device with SVM";
  ThreadPool pool(2);
  CpuBackend cpu(pool);
  std::mt19937 rng(29 + (int)c.n_tokens);
  const AttInputs in(c, rng);
  const std::vector<float>& q = in.q;
  std::vector<float> ref(q.size());
  cpu.attention(in.args(q.data(), in.k.data(), in.v.data(), ref.data(), in.pos.data()));
  std::map<std::string, std::vector<float>> got;
  // wide=0: the same kernels reading the f16 cache with vload_halfN instead of 4- to 16-byte words.
  for (const std::string opts : {"", "prefill=0", "wide=0", "prefill=0:wide=0"}) {
    Backend& dev = *device_with(opts);
    DeviceBuffer dq = upload(dev, q), dk = upload(dev, in.k), dv = upload(dev, in.v),
                 dp = upload(dev, in.pos);
    DeviceBuffer dout(dev, q.size() * sizeof(float));
    dev.attention(in.args(ptr<float>(dq), dk.data(), dv.data(), ptr<float>(dout), ptr<int32_t>(dp)));
    got[opts] = download<float>(dev, dout, q.size());
    // Weights and q rounded to f16 as the CPU rounds them; a weight on a rounding boundary may flip (~3e-5).
    EXPECT_LT(rel_err(got[opts], ref), 2e-4f) << "XPERT_OPENCL_OPTS=" << opts;
  }
  // The per-token kernel's sums in its order (key tiles that start elsewhere under a sliding window); a
  // compiler may contract other products of the two kernels into FMAs (NVIDIA's OpenCL on the H200 at
  // t45_p100_d128_w0: above 1e-6, then 1.48e-5 against a bound of 1e-5, 2026-12-04), still 4x under the
  // bound against the CPU.
  EXPECT_LT(rel_err(got[""], got["prefill=0"]), 5e-5f);
  // Read in words or with vload_halfN, the same values in the same sums: the same bits.
  EXPECT_EQ(got[""], got["wide=0"]);
  EXPECT_EQ(got["prefill=0"], got["prefill=0:wide=0"]);
}

// The wide form of the attention program only where each of its words is aligned: both caches 16-byte
// aligned, heads and slots a multiple of 8 halves.
TEST(OpenCLPrefillWideLoads, OnlyWhereAligned) {
  alignas(16) static const uint16_t cache[64] = {};
  EXPECT_TRUE(opencl::att_wide_loads(cache, cache + 16, 128, 8 * 1024));
  EXPECT_TRUE(opencl::att_wide_loads(cache, cache, 80));
  EXPECT_FALSE(opencl::att_wide_loads(cache + 4, cache, 128));            // k 8-byte aligned only
  EXPECT_FALSE(opencl::att_wide_loads(cache, cache + 1, 128));            // v 2-byte aligned only
  EXPECT_FALSE(opencl::att_wide_loads(cache, cache, 33));                 // odd heads
  EXPECT_FALSE(opencl::att_wide_loads(cache, cache, 36));                 // heads of 4-half words
  EXPECT_FALSE(opencl::att_wide_loads(cache, cache, 128, 8 * 1024 + 4));  // slots 4 halves off
}

// Qwen3-30B-A3B's heads (32 / 4 of 128) over a prefix, a partial last block of 8 tokens; a sliding window
// shorter than the block's span of keys, wide heads; blocks of more keys than pass 1 keeps scores for
// (ATT_BKEEP 512: pass 2 computes them again). Heads of 64 / 128, 256 and 320 take the block program built
// for 128, 256 and 512 dims a query (att_block_dims); heads of 80 end in a partial chunk of K's dims.
INSTANTIATE_TEST_SUITE_P(Shapes, OpenCLPrefillAttention,
                         ::testing::Values(AttCase{45, 100, 32, 4, 128, 0}, AttCase{30, 70, 4, 1, 256, 20},
                                           AttCase{70, 0, 4, 2, 64, 0}, AttCase{20, 600, 4, 2, 64, 0},
                                           AttCase{19, 40, 2, 1, 320, 0}, AttCase{20, 30, 4, 2, 80, 0}),
                         [](const auto& info) {
                           const AttCase& a = info.param;
                           return "t" + std::to_string(a.n_tokens) + "_p" + std::to_string(a.pos0) + "_d" +
                                  std::to_string(a.head_dim) + "_w" + std::to_string(a.window);
                         });

// --- the MoE prefill --------------------------------------------------------------------------------------

struct Shape {
  DType type;  // gate / up (down: Q6_K beside Q4_K, else the same)
  int64_t n_embd, n_ff, n_expert, n_used, n_tokens;
};

class OpenCLPrefillMoe : public ::testing::TestWithParam<Shape> {};

TEST_P(OpenCLPrefillMoe, MatchesCpuAndHostRouting) {
  const Shape sh = GetParam();
  Backend* d = device_with("moe_bm=32");
  if (!d) GTEST_SKIP() << "no OpenCL device with SVM";
  ThreadPool pool(2);
  CpuBackend cpu(pool);
  std::mt19937 rng(23 + (int)sh.n_embd);
  ModelConfig c;
  c.n_embd = sh.n_embd, c.n_expert = sh.n_expert, c.n_expert_used = sh.n_used, c.n_ff_exp = sh.n_ff;
  c.expert_weights_norm = true;
  const int64_t E = sh.n_embd, F = sh.n_ff, X = sh.n_expert, n = sh.n_tokens;
  std::vector<std::vector<uint8_t>> bytes(4);
  LayerWeights host;
  auto make = [&](DType t, int64_t k, int64_t rows, int64_t mats, std::vector<uint8_t>& b, Weight& w) {
    const size_t rb = row_bytes(t, k);
    b.resize(rb * rows * mats);
    const std::vector<float> f = random_vec(k * rows * mats, rng, 1.0f / std::sqrt((float)k));
    for (int64_t r = 0; r < rows * mats; ++r) quantize_row(t, f.data() + r * k, b.data() + r * rb, k);
    w = {.type = t, .data = b.data(), .ne = {k, rows, mats}, .n_bytes = b.size()};
  };
  make(DType::F32, E, X, 1, bytes[0], host.ffn_gate_inp);
  make(sh.type, E, F, X, bytes[1], host.ffn_gate_exps);
  make(sh.type, E, F, X, bytes[2], host.ffn_up_exps);
  make(sh.type == DType::Q4_K ? DType::Q6_K : sh.type, F, E, X, bytes[3], host.ffn_down_exps);
  const std::vector<float> x = random_vec(n * E, rng);
  std::vector<float> ref(n * E), on_cpu(n * E);
  cpu::moe_ffn_reference(moe_ffn_args(c, host, 0, nullptr), x.data(), n, ref.data());
  static_cast<Backend&>(cpu).moe_ffn(moe_ffn_args(c, host, 0, nullptr), x.data(), n, on_cpu.data());

  std::map<std::string, std::vector<float>> got;
  std::map<std::string, uint64_t> launches;
  for (const std::string opts :
       {"moe_bm=32", "moe_bm=64", "moe_bm=32:pt_bufs=1", "moe_bm=64:pt_bufs=1", "prefill=0"}) {
    Backend& dev = *device_with(opts);
    LayerWeights lw = host;
    std::vector<DeviceBuffer> bufs;
    for (Weight* w : {&lw.ffn_gate_inp, &lw.ffn_gate_exps, &lw.ffn_up_exps, &lw.ffn_down_exps}) {
      bufs.emplace_back(dev, w->n_bytes);
      dev.copy_from_host(bufs.back().data(), w->data, w->n_bytes);
      w->data = bufs.back().data();
    }
    DeviceBuffer dx = upload(dev, x), dout = upload(dev, std::vector<float>(n * E, 7.0f));
    auto& ocl = dynamic_cast<opencl::OpenclBackend&>(dev);
    const uint64_t e0 = ocl.enqueue_count();
    dev.moe_ffn(moe_ffn_args(c, lw, 0, nullptr), ptr<float>(dx), n, ptr<float>(dout));
    launches[opts] = ocl.enqueue_count() - e0;
    got[opts] = download<float>(dev, dout, n * E);
    // Summation order moves the hidden state by ~1e-7, which can flip one int8 rounding of it (~5e-4).
    EXPECT_LT(rel_err(got[opts], ref), 2e-3f) << opts;
    EXPECT_LT(rel_err(got[opts], on_cpu), 2e-3f) << opts;
    if (opts != "moe_bm=32") continue;
    // The norm before the FFN rounds its rows for gate/up in its own launch (its mode learned from the last
    // q/k/v product, here 16 rows of the gate's type): the MoE then skips that rounding launch, and its
    // output has the bits of the same rows rounded by the MoE itself (a copy).
    Weight wq = lw.ffn_gate_exps;
    wq.ne[1] = 16, wq.ne[2] = 1;
    DeviceBuffer dq(dev, n * 16 * sizeof(float)), dq2(dev, n * 16 * sizeof(float));
    const Backend::MatmulJob jobs[] = {{&wq, ptr<float>(dq)}, {&wq, ptr<float>(dq2)}};
    dev.matmuls(ptr<float>(dx), n, jobs);
    DeviceBuffer dw = upload(dev, random_vec(E, rng)), dcur(dev, n * E * sizeof(float)),
                 dcopy(dev, n * E * sizeof(float)), dnorm = upload(dev, std::vector<float>(n * E, 7.0f)),
                 dplain = upload(dev, std::vector<float>(n * E, 7.0f));
    dev.rmsnorm_act(ptr<float>(dx), ptr<float>(dw), ptr<float>(dcur), n, E, 1e-6f);
    const uint64_t e1 = ocl.enqueue_count();
    dev.moe_ffn(moe_ffn_args(c, lw, 0, nullptr), ptr<float>(dcur), n, ptr<float>(dnorm));
    const uint64_t after_norm = ocl.enqueue_count() - e1;
    dev.copy(dcopy.data(), dcur.data(), n * E * sizeof(float));
    const uint64_t e2 = ocl.enqueue_count();
    dev.moe_ffn(moe_ffn_args(c, lw, 0, nullptr), ptr<float>(dcopy), n, ptr<float>(dplain));
    EXPECT_EQ(after_norm + 1, ocl.enqueue_count() - e2) << "x's rounding done by the norm";
    EXPECT_EQ(download<float>(dev, dnorm, n * E), download<float>(dev, dplain, n * E));
  }
  // The same grouped rows by other tiles, and the host's grouping: each row's product is the same sum.
  EXPECT_LT(rel_err(got["moe_bm=64"], got["moe_bm=32"]), 1e-6f);
  // One buffer or two (the device's default where it has the local memory): the same sums in the same order.
  EXPECT_EQ(got["moe_bm=32:pt_bufs=1"], got["moe_bm=32"]);
  EXPECT_EQ(got["moe_bm=64:pt_bufs=1"], got["moe_bm=64"]);
  EXPECT_LT(rel_err(got["prefill=0"], got["moe_bm=32"]), 2e-3f);
  // Routed on the device: router, routing, grouping, two roundings (x's, h's), gate/up, down, combine; the
  // host's routing uploads its tables and runs a product per expert and matrix. The router's few features
  // split along k on a device of many compute units (an H100: 2–7 tiles for 132), in the same one launch.
  EXPECT_LE(launches["moe_bm=32"], 8u);
  EXPECT_GT(launches["prefill=0"], launches["moe_bm=32"]);
}

// Qwen3-30B-A3B's n_embd and top-8, over 12 experts of 256 features (Q4_K gate/up, Q6_K down: 27 rows an
// expert on average: partial tiles, some experts over two 32-row tiles); few experts with many rows (several
// tiles each); Q8_0 rows that are not whole feature tiles (288 / 128, 160 / 64).
INSTANTIATE_TEST_SUITE_P(Shapes, OpenCLPrefillMoe,
                         ::testing::Values(Shape{DType::Q4_K, 2048, 256, 12, 8, 40},
                                           Shape{DType::Q4_K, 512, 256, 8, 3, 200},
                                           Shape{DType::Q8_0, 288, 160, 16, 4, 90}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return std::string(dtype_name(s.type)) + "_E" + std::to_string(s.n_embd) + "_X" +
                                  std::to_string(s.n_expert) + "_n" + std::to_string(s.n_tokens);
                         });

}  // namespace
}  // namespace xpert

#else
TEST(OpenCLPrefill, NotBuiltIn) { GTEST_SKIP() << "built without the OpenCL backend"; }
#endif
