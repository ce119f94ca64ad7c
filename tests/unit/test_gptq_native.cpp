// Native GPTQ-INT4 (DType GPTQ4_*: qweight, scales and zero points as the checkpoint stores them): the
// loader's bytes against the reference dequantization of the stored tensors, the CPU kernels on every ISA
// against matmul_reference on random data of real shapes, and a whole model against the Q4_0 repack.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <random>
#include <tuple>

#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "format/safetensors.h"
#include "model/hf_model.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/model.h"
#include "model/recurrent_state.h"
#include "quant/gptq.h"
#include "runtime/session.h"

namespace xpert {
namespace {

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

// A random GPTQ layer as a checkpoint stores it; zeros: asymmetric (random qzeros).
struct RandomLayer {
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  gptq::Layer layer;
  RandomLayer(int64_t k, int64_t n, int64_t group, bool zeros, uint32_t seed, int zero_offset = 1) {
    std::mt19937 rng(seed);
    qweight.resize(k / 8 * n);
    for (int32_t& w : qweight) w = (int32_t)rng();
    std::normal_distribution<float> d(0.01f, 0.004f);
    scales.resize(k / group * n);
    for (uint16_t& s : scales) s = f32_to_f16(d(rng));
    if (zeros) {
      qzeros.resize(k / group * n / 8);
      for (int32_t& z : qzeros) z = (int32_t)rng();
    }
    layer = {.qweight = reinterpret_cast<const uint8_t*>(qweight.data()),
             .scales = reinterpret_cast<const uint8_t*>(scales.data()),
             .qzeros = zeros ? reinterpret_cast<const uint8_t*>(qzeros.data()) : nullptr,
             .k = k,
             .n = n,
             .group = group,
             .zero_offset = zero_offset};
  }
  std::vector<uint8_t> native(DType t) const {
    std::vector<uint8_t> out(row_bytes(t, layer.k) * layer.n);
    gptq::write_native(layer, t, out.data());
    return out;
  }
};

TEST(GptqNative, TypesAndBytes) {
  EXPECT_EQ(gptq::native_type(128, false), DType::GPTQ4_G128);
  EXPECT_EQ(gptq::native_type(32, true), DType::GPTQ4Z_G32);
  EXPECT_EQ(gptq::native_type(256, false), DType::F32);  // none: the Q4_0 repack
  EXPECT_EQ(gptq_group(DType::GPTQ4Z_G64), 64);
  // 4.125 bits per weight at group 128 (Q4_0: 4.5); qweight and scales as stored, nothing else.
  EXPECT_EQ(row_bytes(DType::GPTQ4_G128, 2048) * 768, (size_t)2048 * 768 / 2 + 2048 / 128 * 768 * 2);
  EXPECT_EQ(row_bytes(DType::GPTQ4_G128, 2048) * 8 * 768, (size_t)2048 * 768 * 33 / 8);
  EXPECT_EQ(dtype_info(200u), nullptr);  // not a GGUF type id
}

// The native bytes dequantize to the reference computed straight from the stored tensors, for both
// checkpoint formats' zero points and every group size.
TEST(GptqNative, DequantizesLikeTheStoredTensors) {
  for (auto [k, n, group, zeros, offset] : {std::tuple<int64_t, int64_t, int64_t, bool, int>{2048, 768, 128, false, 1},
                                            {768, 2048, 128, true, 1},
                                            {256, 40, 32, true, 0},
                                            {192, 16, 64, false, 0}}) {
    RandomLayer r(k, n, group, zeros, (uint32_t)(k + n), offset);
    const DType t = gptq::native_type(group, zeros);
    std::vector<float> want(n * k), got(n * k);
    gptq::dequantize_reference(r.layer, want.data());
    gptq::dequantize_native(t, r.native(t).data(), k, n, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << k << "x" << n << " g" << group;
    // Spot check against the raw words: output 5, input 13 = nibble 5 of qweight[1][5].
    const int q = (int)(((uint32_t)r.qweight[1 * n + 5] >> 20) & 0xF);
    const int z = zeros ? (int)(((uint32_t)r.qzeros[0 * (n / 8) + 0] >> 20) & 0xF) + offset : 8;
    EXPECT_EQ(got[5 * k + 13], (float)(q - z) * f16_to_f32(r.scales[5]));
  }
}

// The fixture folder's experts, loaded natively, are its stored tensors (qweight, scales) byte for byte.
TEST(GptqNative, FolderExpertsAreTheStoredTensors) {
  const std::string dir = fixture("hf_qwen35moe_gptq");
  auto native = hf::open_folder(dir, {.native_gptq_experts = true});
  auto ck = safetensors::Checkpoint::open(dir);
  const gguf::TensorInfo* gate = native->tensor("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->type, DType::GPTQ4_G64);
  EXPECT_EQ(native->tensor("blk.1.ffn_down_exps.weight")->type, DType::GPTQ4_G64);
  EXPECT_EQ(native->tensor("blk.0.attn_qkv.weight")->type, DType::Q4_0);        // dense: as before
  EXPECT_EQ(native->tensor("blk.0.ffn_down_shexp.weight")->type, DType::Q4_0);  // shared expert too
  const int64_t k = gate->shape[0], n = gate->shape[1];
  for (int64_t e = 0; e < gate->shape[2]; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".gate_proj.";
    const safetensors::Tensor* qw = ck->find(p + "qweight");
    const safetensors::Tensor* sc = ck->find(p + "scales");
    ASSERT_TRUE(qw && sc) << p;
    const uint8_t* m = gate->data + e * row_bytes(gate->type, k) * n;
    const gptq::NativeView v = gptq::native_view(gate->type, m, k, n);
    EXPECT_EQ(std::memcmp(v.qweight, qw->data, k / 2 * n), 0) << e;
    EXPECT_EQ(std::memcmp(v.scales, sc->data, k / 64 * n * 2), 0) << e;
    const gptq::Layer l{.qweight = qw->data, .scales = sc->data, .k = k, .n = n, .group = 64};
    std::vector<float> want(n * k), got(n * k);
    gptq::dequantize_reference(l, want.data());
    gptq::dequantize_native(gate->type, m, k, n, got.data());
    EXPECT_EQ(want, got) << e;
  }
  // The default (every backend) is still the Q4_0 repack.
  EXPECT_EQ(hf::open_folder(dir)->tensor("blk.0.ffn_gate_exps.weight")->type, DType::Q4_0);
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, (double)std::fabs(x));
  return m;
}

// Every ISA's kernel against matmul_reference (the dequantized weights times the Q8_0-rounded X, in
// double): Qwen3-30B-A3B's expert shapes at decode (1 row) and prefill (64 rows), the other group sizes,
// zero points, and widths that leave a column tail.
TEST(GptqNative, EveryIsaMatchesReference) {
  struct Case {
    int64_t k, n, group;
    bool zeros;
    int64_t m;
  };
  const Case cases[] = {{2048, 768, 128, false, 1}, {2048, 768, 128, false, 64}, {768, 2048, 128, false, 1},
                        {768, 2048, 128, true, 64}, {2048, 768, 128, true, 1},   {256, 40, 32, true, 5},
                        {192, 20, 64, false, 3},    {512, 136, 64, true, 9}};
  ThreadPool pool(2);
  for (const Case& c : cases) {
    RandomLayer r(c.k, c.n, c.group, c.zeros, (uint32_t)(c.k * 7 + c.n + c.m));
    const DType t = gptq::native_type(c.group, c.zeros);
    const std::vector<uint8_t> w = r.native(t);
    std::vector<float> x(c.m * c.k);
    std::mt19937 rng(5);
    std::normal_distribution<float> d;
    for (float& v : x) v = d(rng);
    std::vector<float> want(c.m * c.n);
    cpu::matmul_reference(t, w.data(), c.n, c.k, x.data(), c.m, want.data(), c.n);
    const double scale = max_abs(want);
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (!isa_supported(isa)) continue;
      set_isa_cap(isa);
      std::vector<float> got(c.m * c.n + 3, -7.0f);
      cpu::matmul(t, w.data(), c.n, c.k, x.data(), c.m, got.data(), c.n, pool);
      double err = 0;
      for (size_t i = 0; i < want.size(); ++i) err = std::max(err, (double)std::fabs(got[i] - want[i]));
      // f32 sums of exact integer dots: a few ulps of the largest outputs.
      EXPECT_LT(err, 2e-5 * scale) << isa_name(isa) << " " << c.k << "x" << c.n << " m" << c.m << " g" << c.group;
      EXPECT_EQ(got[c.m * c.n], -7.0f);  // nothing written past Y
      // Batch invariance (xpert serve): a row has the same bits alone as inside any batch.
      std::vector<float> last(c.n);
      cpu::matmul(t, w.data(), c.n, c.k, x.data() + (c.m - 1) * c.k, 1, last.data(), c.n, pool);
      EXPECT_EQ(std::memcmp(last.data(), got.data() + (c.m - 1) * c.n, c.n * 4), 0) << isa_name(isa) << " m" << c.m;
    }
    set_isa_cap(Isa::avx512);
  }
}

// A batch of products (the experts of a MoE layer at decode) mixing native GPTQ and a row format gives
// each product's own result.
TEST(GptqNative, BatchMatchesSeparateProducts) {
  const int64_t k = 768, n = 256, m = 2;
  RandomLayer a(k, n, 128, false, 1), b(k, n, 128, true, 2);
  const std::vector<uint8_t> wa = a.native(DType::GPTQ4_G128), wb = b.native(DType::GPTQ4Z_G128);
  std::vector<float> w_f32(n * k), x(m * k);
  std::mt19937 rng(9);
  std::normal_distribution<float> d;
  for (float& v : w_f32) v = d(rng);
  for (float& v : x) v = d(rng);
  ThreadPool pool(2);
  std::vector<float> ya(m * n), yb(m * n), yf(m * n), sa(m * n), sb(m * n), sf(m * n);
  const cpu::MatmulJob jobs[] = {{DType::GPTQ4_G128, wa.data(), n, k, x.data(), m, ya.data(), n},
                                 {DType::F32, w_f32.data(), n, k, x.data(), m, yf.data(), n},
                                 {DType::GPTQ4Z_G128, wb.data(), n, k, x.data(), m, yb.data(), n}};
  cpu::matmul_batch(jobs, pool);
  cpu::matmul(DType::GPTQ4_G128, wa.data(), n, k, x.data(), m, sa.data(), n, pool);
  cpu::matmul(DType::GPTQ4Z_G128, wb.data(), n, k, x.data(), m, sb.data(), n, pool);
  cpu::matmul(DType::F32, w_f32.data(), n, k, x.data(), m, sf.data(), n, pool);
  EXPECT_EQ(ya, sa);
  EXPECT_EQ(yb, sb);
  EXPECT_EQ(yf, sf);
}

std::vector<float> prefill_all(const Model& m, std::span<const int32_t> tokens, ThreadPool& pool) {
  KvCache cache(m.config(), 128);
  std::unique_ptr<RecurrentState> state;
  if (m.config().has_recurrent_layers()) state = std::make_unique<RecurrentState>(m.config());
  std::vector<float> logits;
  m.forward({.tokens = tokens, .pos0 = 0, .cache = &cache, .seq = 0, .all_logits = true, .state = state.get()},
            logits, pool);
  return logits;
}

int32_t argmax(std::span<const float> v) { return (int32_t)(std::max_element(v.begin(), v.end()) - v.begin()); }

std::vector<int32_t> greedy(const Model& m, std::vector<int32_t> prompt, int n) {
  Session s(m, {.n_ctx = 128, .n_threads = 2, .n_batch = 512});
  const std::vector<float>* logits = &s.eval(prompt);
  std::vector<int32_t> got;
  for (int i = 0; i < n; ++i) {
    got.push_back(argmax(*logits));
    logits = &s.eval(std::span<const int32_t>(&got.back(), 1));
  }
  return got;
}

// End to end: the GPTQ folder with native experts gives the Q4_0 repack's logits (the same integer dot
// products, summed in another order) and its greedy tokens.
TEST(GptqNative, ModelMatchesTheQ4_0Repack) {
  const std::string dir = fixture("hf_qwen35moe_gptq");
  auto native = Model::load(dir, {.native_gptq_experts = true});
  auto repack = Model::load(dir);
  ASSERT_EQ(native->file().tensor("blk.0.ffn_up_exps.weight")->type, DType::GPTQ4_G64);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back((i * 37 + 11) % (int32_t)native->config().n_vocab);
  ThreadPool pool(2);
  const std::vector<float> a = prefill_all(*native, prompt, pool), b = prefill_all(*repack, prompt, pool);
  ASSERT_EQ(a.size(), b.size());
  double err = 0, range = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, (double)std::fabs(a[i] - b[i]));
    range = std::max(range, (double)std::fabs(b[i]));
  }
  std::printf("native GPTQ experts vs Q4_0 repack: max |logit difference| %.2e (max |logit| %.2f)\n", err, range);
  EXPECT_LT(err, 1e-3 * range);
  EXPECT_EQ(greedy(*native, prompt, 16), greedy(*repack, prompt, 16));
}

// An asymmetric checkpoint (sym = false: zero points read from qzeros) loads its experts as GPTQ4Z and its
// dense layers as F32 (Q4_0 has no zero point); with the fixture's zero points (all 8) it is the same model.
// Asymmetric experts on any other path are refused with a message.
TEST(GptqNative, AsymmetricFolder) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("xpert_gptq_asym_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture("hf_qwen35moe_gptq"))) fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg["quantization_config"]["sym"] = false;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  auto asym = Model::load(dir.string(), {.native_gptq_experts = true});
  EXPECT_EQ(asym->file().tensor("blk.0.ffn_gate_exps.weight")->type, DType::GPTQ4Z_G64);
  EXPECT_EQ(asym->file().tensor("blk.0.attn_qkv.weight")->type, DType::F32);
  try {
    Model::load(dir.string());
    ADD_FAILURE() << "asymmetric experts loaded without the native path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("asymmetric GPTQ"), std::string::npos) << e.what();
  }
  auto sym = Model::load(fixture("hf_qwen35moe_gptq"), {.native_gptq_experts = true});
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back((i * 53 + 5) % (int32_t)sym->config().n_vocab);
  EXPECT_EQ(greedy(*asym, prompt, 16), greedy(*sym, prompt, 16));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace xpert
