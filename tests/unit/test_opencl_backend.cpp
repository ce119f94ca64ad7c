// The whole-model OpenCL backend (backend/opencl/opencl_backend.h), op by op, against the CPU: the matmul and
// the MoE FFN against cpu::matmul_reference / moe_ffn_reference (dequantized weights, activations rounded
// through the CPU's activation type, double sums), every other op against CpuBackend. Random data, shapes of the tiny test models and of real
// ones (head_dim 128, K-quant rows of 256+). CI runs it on PoCL; without an OpenCL device it skips.
#include <gtest/gtest.h>

#ifdef XPERT_HAVE_OPENCL
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta_net.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/opencl_backend.h"
#include "base/error.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "opencl_test_util.h"
#include "quant/quant.h"

namespace xpert {
namespace {
using namespace xpert::cpu;  // the reference kernels

using namespace cltest;  // device(), DEVICE_OR_SKIP, random data, upload / download

struct Threads {
  ThreadPool pool{2};
  CpuBackend cpu{pool};
};

// --- matmul ----------------------------------------------------------------------------------------------

class OpenCLBackendMatmul : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(OpenCLBackendMatmul, MatchesDequantizedReference) {
  DEVICE_OR_SKIP();
  const auto [type, m] = GetParam();
  std::mt19937 rng(1234 + (int)type * 31 + m);
  // Rows of 512 (two K-quant blocks) and 80 output features (not a multiple of the 64-feature tile).
  const int64_t k = 512, n = 80;
  const std::vector<uint8_t> wq = random_weights(type, n, k, rng);
  const std::vector<float> x = random_vec(m * k, rng);
  std::vector<float> ref(m * n);
  cpu::matmul_reference(type, wq.data(), n, k, x.data(), m, ref.data(), n);
  DeviceBuffer wbuf = upload(dev, wq), xbuf = upload(dev, x), ybuf(dev, m * n * sizeof(float));
  Weight w{.type = type, .data = wbuf.data(), .ne = {k, n, 1}, .n_bytes = wq.size()};
  dev.matmul(w, ptr<float>(xbuf), m, ptr<float>(ybuf));
  EXPECT_LT(rel_err(download<float>(dev, ybuf, m * n), ref), 1e-5f) << dtype_name(type) << " m=" << m;

  // Into a wider output (ldy): the columns beyond n stay untouched.
  const int64_t ldy = n + 16;
  std::vector<float> wide(m * ldy, 7.0f);
  DeviceBuffer wbufy = upload(dev, wide);
  dev.matmul(w, ptr<float>(xbuf), m, ptr<float>(wbufy), ldy);
  bool untouched = false;
  const std::vector<float> packed =
      first_columns(download<float>(dev, wbufy, m * ldy), m, n, ldy, 7.0f, &untouched);
  EXPECT_TRUE(untouched) << "a column past n was written";
  EXPECT_LT(rel_err(packed, ref), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Types, OpenCLBackendMatmul,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                                              DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q5_K,
                                                              DType::Q6_K),
                                            ::testing::Values(1, 3, 6, 45)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_m" +
                                  std::to_string(std::get<1>(info.param));
                         });

// F32 rows of a length that is not a multiple of 32 (router-sized matrices of odd models).
TEST(OpenCLBackendOps, MatmulF32OddRows) {
  DEVICE_OR_SKIP();
  Threads th;
  std::mt19937 rng(5);
  const int64_t k = 70, n = 9;
  for (int64_t m : {2, 33}) {
    const std::vector<float> wf = random_vec(n * k, rng), x = random_vec(m * k, rng);
    Weight wc{.type = DType::F32, .data = wf.data(), .ne = {k, n, 1}, .n_bytes = wf.size() * 4};
    std::vector<float> ref(m * n);
    static_cast<Backend&>(th.cpu).matmul(wc, x.data(), m, ref.data());
    DeviceBuffer wbuf = upload(dev, wf), xbuf = upload(dev, x), ybuf(dev, m * n * sizeof(float));
    Weight wd = wc;
    wd.data = wbuf.data();
    dev.matmul(wd, ptr<float>(xbuf), m, ptr<float>(ybuf));
    EXPECT_LT(rel_err(download<float>(dev, ybuf, m * n), ref), 1e-5f);
  }
}

// --- small ops ---------------------------------------------------------------------------------------

TEST(OpenCLBackendOps, RmsnormAndElementwise) {
  DEVICE_OR_SKIP();
  Threads th;
  Backend& cpu = th.cpu;
  std::mt19937 rng(7);
  const int64_t rows = 5, n = 320, N = rows * n;
  const std::vector<float> a = random_vec(N, rng), b = random_vec(N, rng), w = random_vec(n, rng);
  const std::vector<float> g = random_vec(rows, rng), bias = random_vec(n, rng);
  DeviceBuffer da = upload(dev, a), db = upload(dev, b), dw = upload(dev, w), dg = upload(dev, g);
  DeviceBuffer dbias = upload(dev, bias), dy(dev, N * sizeof(float));

  auto check = [&](const char* what, auto&& on_cpu, auto&& on_dev, float tol) {
    std::vector<float> ref(N, 0.0f);
    on_cpu(ref.data());
    dev.copy_from_host(dy.data(), std::vector<float>(N, 0.0f).data(), N * sizeof(float));
    on_dev(ptr<float>(dy));
    EXPECT_LE(rel_err(download<float>(dev, dy, N), ref), tol) << what;
  };
  check("rmsnorm", [&](float* y) { cpu.rmsnorm(a.data(), w.data(), y, rows, n, 1e-6f); },
        [&](float* y) { dev.rmsnorm(ptr<float>(da), ptr<float>(dw), y, rows, n, 1e-6f); }, 1e-5f);
  check("rmsnorm no weight", [&](float* y) { cpu.rmsnorm(a.data(), nullptr, y, rows, n, 1e-5f); },
        [&](float* y) { dev.rmsnorm(ptr<float>(da), nullptr, y, rows, n, 1e-5f); }, 1e-5f);
  check("swiglu", [&](float* y) { cpu.swiglu(a.data(), b.data(), y, N); },
        [&](float* y) { dev.swiglu(ptr<float>(da), ptr<float>(db), y, N); }, 1e-5f);
  check("geglu", [&](float* y) { cpu.geglu(a.data(), b.data(), y, N); },
        [&](float* y) { dev.geglu(ptr<float>(da), ptr<float>(db), y, N); }, 1e-5f);
  {  // gate values past the CPU's GELU table (|x| >= 10)
    std::vector<float> wide(N);
    for (int64_t i = 0; i < N; ++i) wide[i] = a[i] * 8.0f;
    DeviceBuffer dwide = upload(dev, wide);
    check("geglu wide", [&](float* y) { cpu.geglu(wide.data(), b.data(), y, N); },
          [&](float* y) { dev.geglu(ptr<float>(dwide), ptr<float>(db), y, N); }, 1e-5f);
  }
  check("add", [&](float* y) { cpu.add(a.data(), b.data(), y, N); },
        [&](float* y) { dev.add(ptr<float>(da), ptr<float>(db), y, N); }, 1e-6f);
  check("scale",
        [&](float* y) {
          std::copy(a.begin(), a.end(), y);
          cpu.scale(y, 0.37f, N);
        },
        [&](float* y) {
          dev.copy(y, da.data(), N * sizeof(float));
          dev.scale(y, 0.37f, N);
        },
        1e-6f);
  check("add_bias",
        [&](float* y) {
          std::copy(a.begin(), a.end(), y);
          cpu.add_bias(y, bias.data(), rows, n);
        },
        [&](float* y) {
          dev.copy(y, da.data(), N * sizeof(float));
          dev.add_bias(y, ptr<float>(dbias), rows, n);
        },
        1e-6f);
  check("mul_sigmoid",
        [&](float* y) {
          std::copy(a.begin(), a.end(), y);
          cpu.mul_sigmoid(y, b.data(), N);
        },
        [&](float* y) {
          dev.copy(y, da.data(), N * sizeof(float));
          dev.mul_sigmoid(y, ptr<float>(db), N);
        },
        1e-5f);
  check("add_sigmoid_scaled",
        [&](float* y) {
          std::copy(a.begin(), a.end(), y);
          cpu.add_sigmoid_scaled(y, b.data(), g.data(), rows, n);
        },
        [&](float* y) {
          dev.copy(y, da.data(), N * sizeof(float));
          dev.add_sigmoid_scaled(y, ptr<float>(db), ptr<float>(dg), rows, n);
        },
        1e-5f);
  // deinterleave: rows of 2 * width into two halves.
  check("deinterleave", [&](float* y) { cpu.deinterleave(a.data(), rows, n / 2, y, y + N / 2); },
        [&](float* y) { dev.deinterleave(ptr<float>(da), rows, n / 2, y, y + N / 2); }, 0.0f);
}

TEST(OpenCLBackendOps, GatherRowsAndStoreF16) {
  DEVICE_OR_SKIP();
  std::mt19937 rng(9);
  const int64_t rows = 7, width = 96;
  const std::vector<float> x = random_vec(rows * width, rng);
  const std::vector<int64_t> pick = {6, 0, 3, 3};
  std::vector<float> ref;
  for (int64_t r : pick) ref.insert(ref.end(), x.begin() + r * width, x.begin() + (r + 1) * width);
  DeviceBuffer dx = upload(dev, x), dy(dev, pick.size() * width * sizeof(float));
  dev.gather_rows(ptr<float>(dx), pick, width, ptr<float>(dy));
  EXPECT_EQ(download<float>(dev, dy, ref.size()), ref);
  dev.gather_rows(ptr<float>(dx), pick, width, ptr<float>(dx));  // in place
  EXPECT_EQ(download<float>(dev, dx, ref.size()), ref);

  std::vector<uint16_t> h(rows * width);
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(x[i]);
  DeviceBuffer dx2 = upload(dev, x), dh(dev, h.size() * 2);
  dev.store_kv(ptr<float>(dx2), dh.data(), (int64_t)h.size(), DType::F16);
  EXPECT_EQ(download<uint16_t>(dev, dh, h.size()), h);
  EXPECT_THROW(dev.store_kv(ptr<float>(dx2), dh.data(), 64, DType::Q8_0), Error);
}

class OpenCLBackendRope : public ::testing::TestWithParam<std::tuple<RopeMode, int>> {};

TEST_P(OpenCLBackendRope, MatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  const auto [mode, n_rot] = GetParam();
  std::mt19937 rng(11);
  const int64_t T = 6, H = 3, D = 128;
  std::vector<float> x = random_vec(T * H * D, rng);
  const std::vector<int32_t> pos = {0, 1, 2, 17, 300, 4095};
  DeviceBuffer dx = upload(dev, x), dp = upload(dev, pos);
  th.cpu.rope(x.data(), pos.data(), T, H, D, n_rot, 1e6f, 1.0f, mode);
  dev.rope(ptr<float>(dx), ptr<int32_t>(dp), T, H, D, n_rot, 1e6f, 1.0f, mode);
  // The angles are built as the CPU builds them, but Intel's x86 OpenCL runtime rounds the chain of products
  // differently from pair 12 on: at position 4095 an angle of ~307 rad is an ulp (3e-5) off, 2.8e-5 here.
  EXPECT_LT(rel_err(download<float>(dev, dx, x.size()), x), 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Modes, OpenCLBackendRope,
                         ::testing::Combine(::testing::Values(RopeMode::normal, RopeMode::neox),
                                            ::testing::Values(128, 64)));  // full and partial rotary

// --- attention ---------------------------------------------------------------------------------------

class OpenCLBackendAttention : public ::testing::TestWithParam<AttCase> {};

TEST_P(OpenCLBackendAttention, MatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  const AttCase c = GetParam();
  std::mt19937 rng(13 + (int)c.head_dim + c.window);
  const AttInputs in(c, rng);
  const std::vector<float>& q = in.q;
  std::vector<float> ref(q.size());
  // The CPU's short path at every length: the kernels take its steps (the CPU's tiled path, past
  // kAttentionTiledMinKeys keys, leaves the weights unrounded: 3.2e-4 from them at 6,200 keys).
  cpu::attention_plain(in.args(q.data(), in.k.data(), in.v.data(), ref.data(), in.pos.data()), th.pool);
  DeviceBuffer dq = upload(dev, q), dk = upload(dev, in.k), dv = upload(dev, in.v), dp = upload(dev, in.pos);
  DeviceBuffer dout(dev, q.size() * sizeof(float));
  dev.attention(in.args(ptr<float>(dq), dk.data(), dv.data(), ptr<float>(dout), ptr<int32_t>(dp)));
  // Weights and q rounded to f16 as the CPU rounds them; a weight on a rounding boundary may flip (~3e-5).
  EXPECT_LT(rel_err(download<float>(dev, dout, q.size()), ref), 2e-4f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpenCLBackendAttention,
                         ::testing::Values(AttCase{1, 0, 4, 2, 64, 0},      // first token
                                           AttCase{1, 150, 8, 2, 128, 0},   // decode, several key tiles
                                           AttCase{20, 0, 4, 4, 64, 0},     // prefill, MHA
                                           AttCase{9, 70, 6, 2, 128, 0},    // prefill after a prefix, GQA
                                           AttCase{12, 90, 4, 1, 256, 16},  // sliding window, MQA, wide heads
                                           AttCase{1, 200, 4, 2, 64, 32},
                                           AttCase{1, 600, 4, 2, 64, 0},   // past the kept scores (ATT_KEEP)
                                           AttCase{1, 6200, 4, 2, 64, 0},  // a long context
                                           AttCase{1, 70, 4, 2, 33,
                                                   0}));  // odd head_dim: V read in pairs but one

// --- MoE -----------------------------------------------------------------------------------------------

// A qwen3moe-shaped layer of random experts, on the host and uploaded.
struct MoeLayer {
  ModelConfig c;
  std::vector<uint8_t> router, gate, up, down;
  LayerWeights host, dev;
  std::vector<DeviceBuffer> bufs;

  MoeLayer(Backend& d, DType type, std::mt19937& rng) {
    c.n_embd = 256, c.n_expert = 8, c.n_expert_used = 3, c.n_ff_exp = 512;
    c.expert_weights_norm = true;
    const int64_t E = c.n_embd, F = c.n_ff_exp, X = c.n_expert;
    auto make = [&](DType t, int64_t k, int64_t n, int64_t m, std::vector<uint8_t>& bytes, Weight& w) {
      const size_t rb = row_bytes(t, k);
      bytes.resize(rb * n * m);
      const std::vector<float> f = random_vec(k * n * m, rng, 1.0f / std::sqrt((float)k));
      for (int64_t r = 0; r < n * m; ++r) quantize_row(t, f.data() + r * k, bytes.data() + r * rb, k);
      w = {.type = t, .data = bytes.data(), .ne = {k, n, m}, .n_bytes = bytes.size()};
    };
    make(DType::F32, E, X, 1, router, host.ffn_gate_inp);
    make(type, E, F, X, gate, host.ffn_gate_exps);
    make(type, E, F, X, up, host.ffn_up_exps);
    make(type == DType::Q4_K ? DType::Q6_K : type, F, E, X, down, host.ffn_down_exps);
    dev = host;
    for (Weight* w : {&dev.ffn_gate_inp, &dev.ffn_gate_exps, &dev.ffn_up_exps, &dev.ffn_down_exps}) {
      bufs.emplace_back(d, w->n_bytes);
      d.copy_from_host(bufs.back().data(), w->data, w->n_bytes);
      w->data = bufs.back().data();
    }
  }
};

class OpenCLBackendMoe : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(OpenCLBackendMoe, MatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  const auto [type, n] = GetParam();
  std::mt19937 rng(17 + n);
  MoeLayer L(dev, type, rng);
  const int64_t E = L.c.n_embd;
  const std::vector<float> x = random_vec(n * E, rng);
  std::vector<float> ref(n * E);
  moe_ffn_reference(moe_ffn_args(L.c, L.host, 0, nullptr), x.data(), n, ref.data());
  std::vector<float> cpu(n * E);
  th.cpu.moe_ffn(moe_ffn_args(L.c, L.host, 0, nullptr), x.data(), n, cpu.data());
  DeviceBuffer dx = upload(dev, x), dout(dev, ref.size() * sizeof(float));
  dev.moe_ffn(moe_ffn_args(L.c, L.dev, 0, nullptr), ptr<float>(dx), n, ptr<float>(dout));
  const std::vector<float> got = download<float>(dev, dout, ref.size());
  // Summation order moves the hidden state by ~1e-7, which can flip one int8 rounding of it (~5e-4).
  EXPECT_LT(rel_err(got, ref), 2e-3f) << "n=" << n;
  EXPECT_LT(rel_err(got, cpu), 2e-3f) << "n=" << n;
}

// n = 1 and 5: every expert in the batched gemv; n = 60: most experts tiled (>= 16 rows each).
INSTANTIATE_TEST_SUITE_P(Batches, OpenCLBackendMoe,
                         ::testing::Combine(::testing::Values(DType::Q4_K, DType::Q8_0), ::testing::Values(1, 5, 60)));

// Split layer: experts 0, 2, 4, 6 on the device, the rest on the host's threads.
TEST(OpenCLBackendOps, MoeSplitExperts) {
  DEVICE_OR_SKIP();
  Threads th;
  std::mt19937 rng(19);
  MoeLayer L(dev, DType::Q4_K, rng);
  const int64_t E = L.c.n_embd, X = L.c.n_expert, n = 24;
  ExpertSplit sp;
  sp.on_device.resize(X);
  sp.host_gate = L.host.ffn_gate_exps, sp.host_up = L.host.ffn_up_exps, sp.host_down = L.host.ffn_down_exps;
  sp.gate.assign(X, nullptr), sp.up.assign(X, nullptr), sp.down.assign(X, nullptr);
  for (int64_t e = 0; e < X; e += 2) {
    sp.on_device[e] = true;
    sp.gate[e] = expert_matrix(L.dev.ffn_gate_exps, e).data;
    sp.up[e] = expert_matrix(L.dev.ffn_up_exps, e).data;
    sp.down[e] = expert_matrix(L.dev.ffn_down_exps, e).data;
  }
  LayerWeights lw = L.dev;
  lw.split = &sp;
  const std::vector<float> x = random_vec(n * E, rng);
  std::vector<float> ref(n * E);
  th.cpu.moe_ffn(moe_ffn_args(L.c, L.host, 0, nullptr), x.data(), n, ref.data());
  DeviceBuffer dx = upload(dev, x), dout(dev, ref.size() * sizeof(float));
  dev.set_host_pool(&th.pool);
  dev.moe_ffn(moe_ffn_args(L.c, lw, 0, nullptr), ptr<float>(dx), n, ptr<float>(dout));
  dev.set_host_pool(nullptr);
  const std::vector<float> got = download<float>(dev, dout, ref.size());
  EXPECT_LT(rel_err(got, ref), 2e-3f);
}

// --- Gated DeltaNet -------------------------------------------------------------------------------------

TEST(OpenCLBackendOps, GatedDeltaNetMatchesCpu) {
  DEVICE_OR_SKIP();
  Threads th;
  std::mt19937 rng(23);
  // Qwen3.5-like heads (key heads tiled over twice as many value heads), small counts.
  const GdnShape s{.d_conv = 4, .n_k_heads = 2, .n_v_heads = 4, .head_k_dim = 128, .head_v_dim = 128, .eps = 1e-6f};
  const int64_t CD = s.conv_dim(), Hv = s.n_v_heads, VD = s.value_dim();
  const std::vector<float> conv1d = random_vec(CD * s.d_conv, rng, 0.5f), dt_bias = random_vec(Hv, rng);
  std::vector<float> a = random_vec(Hv, rng);
  for (float& v : a) v = -std::exp(v * 0.5f);
  const std::vector<float> norm = random_vec(s.head_v_dim, rng);
  DeviceBuffer d_conv1d = upload(dev, conv1d), d_dt = upload(dev, dt_bias), d_a = upload(dev, a),
               d_norm = upload(dev, norm);
  std::vector<float> conv_state(s.conv_state_size(), 0.0f), ssm_state(s.ssm_state_size(), 0.0f);
  DeviceBuffer d_conv_state = upload(dev, conv_state), d_ssm_state = upload(dev, ssm_state);
  GdnScratch scratch;
  // A prefill of 7 tokens, then two single-token steps: the state carries over.
  for (int64_t T : {7, 1, 1}) {
    const std::vector<float> qkv = random_vec(T * CD, rng), z = random_vec(T * VD, rng),
                             alpha = random_vec(T * Hv, rng), beta = random_vec(T * Hv, rng);
    std::vector<float> ref(T * VD);
    gated_delta_net(s, {.conv1d = conv1d.data(), .dt_bias = dt_bias.data(), .a = a.data(), .norm = norm.data()},
                    {.qkv = qkv.data(), .z = z.data(), .alpha = alpha.data(), .beta = beta.data(), .n_tokens = T},
                    conv_state.data(), ssm_state.data(), ref.data(), scratch, th.pool);
    DeviceBuffer d_qkv = upload(dev, qkv), d_z = upload(dev, z), d_alpha = upload(dev, alpha),
                 d_beta = upload(dev, beta), d_out(dev, ref.size() * sizeof(float));
    dev.gated_delta_net(s,
                        {.conv1d = ptr<float>(d_conv1d), .dt_bias = ptr<float>(d_dt), .a = ptr<float>(d_a),
                         .norm = ptr<float>(d_norm)},
                        {.qkv = ptr<float>(d_qkv), .z = ptr<float>(d_z), .alpha = ptr<float>(d_alpha),
                         .beta = ptr<float>(d_beta), .n_tokens = T},
                        ptr<float>(d_conv_state), ptr<float>(d_ssm_state), ptr<float>(d_out));
    EXPECT_LT(rel_err(download<float>(dev, d_out, ref.size()), ref), 1e-4f) << "T=" << T;
    EXPECT_LT(rel_err(download<float>(dev, d_conv_state, conv_state.size()), conv_state), 1e-6f) << "T=" << T;
    EXPECT_LT(rel_err(download<float>(dev, d_ssm_state, ssm_state.size()), ssm_state), 1e-4f) << "T=" << T;
  }
}

// The chunked delta rule (prefill) against the recurrent one and the CPU's two forms, through the whole
// mixer, on real Qwen3.5 shapes and tiny / odd ones. Prompts of 1, 63, 64 and 130 tokens (one chunk short,
// exact and three with a short last one), each continuing the state the one before left.
struct GdnCase {
  int64_t n_k_heads, n_v_heads, head_k_dim, head_v_dim;
  std::vector<int64_t> prompts;
};
class OpenCLBackendGdnChunked : public ::testing::TestWithParam<GdnCase> {};

Backend* device_with_form(DeltaRuleForm form) {
  static std::map<DeltaRuleForm, std::shared_ptr<Backend>> made;
  if (!device()) return nullptr;
  auto& b = made[form];
  if (!b) b = make_opencl_backend(0, form);
  return b.get();
}

TEST_P(OpenCLBackendGdnChunked, MatchesRecurrentAndCpu) {
  DEVICE_OR_SKIP();
  (void)dev;
  const GdnCase& gc = GetParam();
  Threads th;
  std::mt19937 rng(31);
  const GdnShape s{.d_conv = 4, .n_k_heads = gc.n_k_heads, .n_v_heads = gc.n_v_heads, .head_k_dim = gc.head_k_dim,
                   .head_v_dim = gc.head_v_dim, .eps = 1e-6f};
  const int64_t CD = s.conv_dim(), Hv = s.n_v_heads, VD = s.value_dim();
  const std::vector<float> conv1d = random_vec(CD * s.d_conv, rng, 0.5f), dt_bias = random_vec(Hv, rng);
  std::vector<float> a = random_vec(Hv, rng);
  // Decays as slow as a trained model's (about -0.02 to -0.15 a token with these gates): the state carries
  // across chunks, so an error in one chunk's state update shows in the next.
  for (float& v : a) v = -0.1f * std::exp(v * 0.5f);
  const std::vector<float> norm = random_vec(s.head_v_dim, rng);
  const GdnLayerParams hp{.conv1d = conv1d.data(), .dt_bias = dt_bias.data(), .a = a.data(), .norm = norm.data()};

  // Per run: a backend's state; the CPU's two forms and the device's two forms.
  struct Run {
    Backend* b = nullptr;  // null: the CPU
    DeltaRuleForm form;
    std::vector<float> conv_state, ssm_state, out;
    std::unique_ptr<DeviceBuffer> d_conv1d, d_dt, d_a, d_norm, d_conv_state, d_ssm_state;
  };
  std::vector<Run> runs(4);
  runs[0].form = runs[2].form = DeltaRuleForm::chunked;
  runs[1].form = runs[3].form = DeltaRuleForm::recurrent;
  runs[2].b = device_with_form(DeltaRuleForm::chunked);
  runs[3].b = device_with_form(DeltaRuleForm::recurrent);
  for (Run& r : runs) {
    r.conv_state.assign(s.conv_state_size(), 0.0f);
    r.ssm_state.assign(s.ssm_state_size(), 0.0f);
    if (!r.b) continue;
    r.d_conv1d = std::make_unique<DeviceBuffer>(upload(*r.b, conv1d));
    r.d_dt = std::make_unique<DeviceBuffer>(upload(*r.b, dt_bias));
    r.d_a = std::make_unique<DeviceBuffer>(upload(*r.b, a));
    r.d_norm = std::make_unique<DeviceBuffer>(upload(*r.b, norm));
    r.d_conv_state = std::make_unique<DeviceBuffer>(upload(*r.b, r.conv_state));
    r.d_ssm_state = std::make_unique<DeviceBuffer>(upload(*r.b, r.ssm_state));
  }
  GdnScratch scratch;
  for (int64_t T : gc.prompts) {
    const std::vector<float> qkv = random_vec(T * CD, rng), z = random_vec(T * VD, rng),
                             alpha = random_vec(T * Hv, rng), beta = random_vec(T * Hv, rng);
    for (Run& r : runs) {
      r.out.assign(T * VD, 0.0f);
      if (!r.b) {
        gated_delta_net(s, hp, {.qkv = qkv.data(), .z = z.data(), .alpha = alpha.data(), .beta = beta.data(), .n_tokens = T},
                        r.conv_state.data(), r.ssm_state.data(), r.out.data(), scratch, th.pool, r.form);
        continue;
      }
      Backend& b = *r.b;
      DeviceBuffer d_qkv = upload(b, qkv), d_z = upload(b, z), d_alpha = upload(b, alpha), d_beta = upload(b, beta),
                   d_out(b, r.out.size() * sizeof(float));
      b.gated_delta_net(s,
                        {.conv1d = ptr<float>(*r.d_conv1d), .dt_bias = ptr<float>(*r.d_dt), .a = ptr<float>(*r.d_a),
                         .norm = ptr<float>(*r.d_norm)},
                        {.qkv = ptr<float>(d_qkv), .z = ptr<float>(d_z), .alpha = ptr<float>(d_alpha),
                         .beta = ptr<float>(d_beta), .n_tokens = T},
                        ptr<float>(*r.d_conv_state), ptr<float>(*r.d_ssm_state), ptr<float>(d_out));
      r.out = download<float>(b, d_out, r.out.size());
      r.ssm_state = download<float>(b, *r.d_ssm_state, r.ssm_state.size());
    }
    // Bound 1e-4 of max |ref| between any two of the four (the forms sum in different orders).
    const Run &cpu_c = runs[0], &cpu_r = runs[1], &dev_c = runs[2], &dev_r = runs[3];
    EXPECT_LT(rel_err(dev_c.out, cpu_c.out), 1e-4f) << "T=" << T;
    EXPECT_LT(rel_err(dev_c.out, dev_r.out), 1e-4f) << "T=" << T;
    EXPECT_LT(rel_err(dev_c.out, cpu_r.out), 1e-4f) << "T=" << T;
    EXPECT_LT(rel_err(dev_c.ssm_state, cpu_c.ssm_state), 1e-4f) << "T=" << T;
    EXPECT_LT(rel_err(dev_c.ssm_state, dev_r.ssm_state), 1e-4f) << "T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, OpenCLBackendGdnChunked,
    ::testing::Values(GdnCase{16, 32, 128, 128, {130, 64}},  // Qwen3.5-35B-A3B's linear-attention heads
                      GdnCase{2, 4, 128, 128, {1, 63, 64, 130}},
                      GdnCase{1, 2, 16, 8, {1, 63, 64, 130}},  // tiny
                      GdnCase{3, 3, 32, 48, {5, 70}},          // key heads not tiled, dv not a multiple of 16
                      // the recurrent kernel's row slices not whole (40 = 3 x 16 - 8) and more columns than
                      // its group holds at once (column blocks, the last one short)
                      GdnCase{1, 2, 40, 1500, {1, 3}},
                      // the chunk scan's block of 14 columns (its local state holds 4,096 / 276) by 35 row
                      // slices of 8, the last one short (4 rows)
                      GdnCase{1, 1, 276, 40, {70}}),
    [](const ::testing::TestParamInfo<GdnCase>& i) {
      return fmt::format("k{}x{}_v{}x{}", i.param.n_k_heads, i.param.head_k_dim, i.param.n_v_heads, i.param.head_v_dim);
    });

TEST(OpenCLBackendOps, NamesAndRefusals) {
  DEVICE_OR_SKIP();
  EXPECT_EQ(dev.kind(), DeviceKind::opencl);
  EXPECT_EQ(dev.name().rfind("opencl:0 (", 0), 0u) << dev.name();
  EXPECT_THROW(make_opencl_backend(1000), Error);
  DeviceBuffer w(dev, 64);
  const Weight iq{.type = DType::Q4_1, .data = w.data(), .ne = {32, 1, 1}, .n_bytes = 20};
  DeviceBuffer x(dev, 32 * sizeof(float)), y(dev, sizeof(float));
  EXPECT_THROW(dev.matmul(iq, ptr<float>(x), 1, ptr<float>(y)), Error);
}

}  // namespace
}  // namespace xpert

#else
TEST(OpenCLBackendOps, NotBuiltIn) { GTEST_SKIP() << "built without the OpenCL backend"; }
#endif
