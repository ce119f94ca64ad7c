// Hugging Face checkpoint folders against transformers: tiny random-weight models recorded by
// tests/reference/make_hf_fixtures.py (transformers 5.17, float32 on the CPU). Each folder is loaded with
// Model::load(folder), evaluated all at once and token by token, and its logits compared with
// transformers' for all 32 prompt positions; greedy decoding must give transformers' 32 tokens. GPTQ INT4
// is checked bit for bit against the raw layout; malformed and unsupported folders must be refused
// with a message naming the field or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/matmul.h"
#include "base/error.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "format/safetensors.h"
#include "model/hf_model.h"
#include "model/hf_vocab.h"
#include "model/loader.h"
#include "model/model.h"
#include "quant/blocks.h"
#include "quant/gptq.h"
#include "quant/quant.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"
#include "runtime/session.h"
#include "sample/sampler.h"
#include "text/builtin_templates.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  return json::parse(in);
}
void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

struct Reference {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> margins, logits;  // logits [prompt][V]
  json tokenize;
  // MoE: per position, the smallest gap between the k-th and (k+1)-th router logit over the layers
  // (make_hf_fixtures.py); empty for dense models.
  std::vector<float> router_gap;
};

Reference read_reference(const std::string& dir) {
  const json j = read_json(fs::path(dir) / "xpert_reference.json");
  Reference r;
  r.prompt = j["prompt"].get<std::vector<int32_t>>();
  r.greedy = j["greedy"].get<std::vector<int32_t>>();
  r.margins = j["greedy_margins"].get<std::vector<float>>();
  r.tokenize = j["tokenize"];
  if (j.contains("router_min_gap")) r.router_gap = j["router_min_gap"].get<std::vector<float>>();
  const auto shape = j["logits_shape"].get<std::vector<int64_t>>();
  r.logits.resize(shape[0] * shape[1]);
  std::ifstream in(fs::path(dir) / j["logits_file"].get<std::string>(), std::ios::binary);
  in.read(reinterpret_cast<char*>(r.logits.data()), (std::streamsize)(r.logits.size() * 4));
  EXPECT_TRUE(in.good());
  return r;
}

// A scratch copy of a fixture folder, removed at the end of the test.
struct TempFolder {
  fs::path path;
  explicit TempFolder(const std::string& from = "") {
    path = fs::temp_directory_path() /
           fmt::format("xpert_hf_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                       getpid());
    fs::remove_all(path);
    fs::create_directories(path);
    if (!from.empty())
      for (const auto& e : fs::directory_iterator(fixture(from)))
        fs::copy_file(e.path(), path / e.path().filename());
  }
  ~TempFolder() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

// Per position, max |x - ref| over the reference's logit range (max - min), as docs/ARCHITECTURE.md
// quotes agreement; the worst over all positions.
double max_relative_error(std::span<const float> x, std::span<const float> ref, int64_t V) {
  double worst = 0;
  for (size_t t = 0; t < ref.size() / V; ++t) {
    double err = 0, lo = ref[t * V], hi = ref[t * V];
    for (int64_t i = 0; i < V; ++i) {
      err = std::max(err, (double)std::fabs(x[t * V + i] - ref[t * V + i]));
      lo = std::min(lo, (double)ref[t * V + i]);
      hi = std::max(hi, (double)ref[t * V + i]);
    }
    worst = std::max(worst, err / (hi - lo));
  }
  return worst;
}

struct Variant {
  const char* folder;
  const char* arch;
  double tolerance;  // max relative logit error vs transformers per position (see kVariants)
  int outliers;      // positions allowed above it (a routing flip)
};

// Measured 2026-11-30 (error over the logit range; max over the 32 positions; printed by the test):
// f32: xpert computes in f32 like transformers; what differs is summation order and, mostly, the f16 KV
//   cache and f16 attention inputs (llama.cpp's choices; position 0, where attention returns v itself,
//   already shows 4e-5 .. 1e-4): 6.7e-5 .. 4.8e-4. Limit 1e-3, as the issue states.
// bf16: xpert rounds activations to bf16 before each bf16 matmul (as llama.cpp does, 2^-9 relative per
//   element) where transformers' reference keeps f32: 1.1e-3 .. 2.6e-3 at 31 positions, limit 1e-2. At
//   one position (8) a router near-tie picks another expert: 0.13. One such position is allowed.
// Qwen3.5-MoE bf16 (the held-out check's divergences, 2026-12-04): 1.4e-3 .. 6.8e-3 up to the prompt's
//   first router near-tie; 4.1e-2 at position 28, where the second and third experts' router logits are
//   1.5e-3 apart in transformers. Held-out folders (3 seeds x 4 prompts) agree: f32 within 1e-4 everywhere
//   (near-ties included), bf16 within 1.2e-2 and GPTQ within 4e-2 until the first near-tie, larger after
//   one: near-ties under bf16 / Q8_0 rounding, not an accuracy defect.
// GPTQ: the INT4 values are exact (Q4_0; GptqDequantizedMatchesTransformers gets 8.6e-5 with them in
//   f32), but every Q4_0 matmul quantizes its activations to int8 blocks (Q8_0, as llama.cpp's Q4_0
//   kernels do) against transformers' f32: 4.5e-3 .. 3.4e-2, limit 5e-2.
const Variant kVariants[] = {
    {"hf_qwen3", "qwen3", 1e-3, 0},
    {"hf_qwen3moe", "qwen3moe", 1e-3, 0},
    {"hf_qwen35", "qwen35", 1e-3, 0},
    {"hf_qwen35moe", "qwen35moe", 1e-3, 0},
    {"hf_qwen3moe_bf16", "qwen3moe", 1e-2, 1},
    {"hf_qwen35moe_bf16", "qwen35moe", 1e-2, 1},
    {"hf_qwen35moe_gptq", "qwen35moe", 5e-2, 0},
};

// A router gap below this in the f32 reference may flip an expert under bf16 or int8 rounding.
constexpr float kRouterNearTie = 0.05f;

// The positions before the prompt's first router near-tie: there rounding alone separates xpert from
// transformers, so an error above tolerance there is an accuracy defect.
size_t before_first_near_tie(const Reference& ref) {
  for (size_t t = 0; t < ref.router_gap.size(); ++t)
    if (ref.router_gap[t] < kRouterNearTie) return t;
  return ref.prompt.size();
}

// Positions whose relative error exceeds `tolerance`.
int count_above(std::span<const float> x, std::span<const float> ref, int64_t V, double tolerance) {
  int n = 0;
  for (size_t t = 0; t < ref.size() / V; ++t)
    n += max_relative_error(x.subspan(t * V, V), ref.subspan(t * V, V), V) > tolerance;
  return n;
}

class HfTiny : public ::testing::TestWithParam<Variant> {};

std::vector<float> prefill_all(const Model& m, std::span<const int32_t> tokens, ThreadPool& pool) {
  KvCache cache(m.config(), 128);
  std::unique_ptr<RecurrentState> state;
  if (m.config().has_recurrent_layers()) state = std::make_unique<RecurrentState>(m.config());
  std::vector<float> logits;
  m.forward(
      {.tokens = tokens, .pos0 = 0, .cache = &cache, .seq = 0, .all_logits = true, .state = state.get()},
      logits, pool);
  return logits;
}

std::vector<float> token_by_token(const Model& m, std::span<const int32_t> tokens, ThreadPool& pool) {
  KvCache cache(m.config(), 128);
  std::unique_ptr<RecurrentState> state;
  if (m.config().has_recurrent_layers()) state = std::make_unique<RecurrentState>(m.config());
  std::vector<float> all, one;
  for (size_t t = 0; t < tokens.size(); ++t) {
    m.forward(
        {.tokens = tokens.subspan(t, 1), .pos0 = (int32_t)t, .cache = &cache, .seq = 0, .state = state.get()},
        one, pool);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

TEST_P(HfTiny, LogitsMatchTransformers) {
  const Variant v = GetParam();
  auto model = Model::load(fixture(v.folder));
  EXPECT_EQ(model->config().arch, v.arch);
  const Reference ref = read_reference(fixture(v.folder));
  const int64_t V = model->config().n_vocab;
  ASSERT_EQ((int64_t)ref.logits.size(), (int64_t)ref.prompt.size() * V);
  ThreadPool pool(2);
  const std::vector<float> all = prefill_all(*model, ref.prompt, pool);
  const std::vector<float> steps = token_by_token(*model, ref.prompt, pool);
  const double err_all = max_relative_error(all, ref.logits, V),
               err_steps = max_relative_error(steps, ref.logits, V);
  const double self = max_relative_error(all, steps, V);
  if (std::getenv("XPERT_HF_DEBUG")) {
    for (size_t t = 0; t < ref.prompt.size(); ++t)
      std::printf(
          "  pos %zu: %.3e argmax %d/%d\n", t,
          max_relative_error(std::span(all).subspan(t * V, V), std::span(ref.logits).subspan(t * V, V), V),
          argmax(std::span(all).subspan(t * V, V)), argmax(std::span(ref.logits).subspan(t * V, V)));
  }
  std::printf(
      "%s: max relative logit error vs transformers %.2e (prefill) %.2e (token by token); prefill vs steps "
      "%.2e\n",
      v.folder, err_all, err_steps, self);
  EXPECT_LE(count_above(all, ref.logits, V, v.tolerance), v.outliers);
  EXPECT_LE(count_above(steps, ref.logits, V, v.tolerance), v.outliers);
  const size_t clean = before_first_near_tie(ref);
  EXPECT_EQ(count_above(std::span(all).first(clean * V), std::span(ref.logits).first(clean * V), V, v.tolerance), 0)
      << "above tolerance before the first router near-tie (position " << clean << ")";
  // The two forms run the same kernels over different row counts (and the chunked vs the recurrent delta
  // rule); only summation order differs, which an int8 rounding of the quantized variants can amplify.
  EXPECT_LT(self, v.tolerance > 1e-3 ? 1e-3 : 1e-4);
  int argmax_differs = 0;
  for (size_t t = 0; t < ref.prompt.size(); ++t) {
    EXPECT_EQ(argmax(std::span(all).subspan(t * V, V)), argmax(std::span(steps).subspan(t * V, V))) << t;
    argmax_differs +=
        argmax(std::span(all).subspan(t * V, V)) != argmax(std::span(ref.logits).subspan(t * V, V));
  }
  EXPECT_LE(argmax_differs, v.outliers);
}

TEST_P(HfTiny, GreedyMatchesTransformers) {
  const Variant v = GetParam();
  auto model = Model::load(fixture(v.folder));
  const Reference ref = read_reference(fixture(v.folder));
  Session s(*model, {.n_ctx = 128, .n_threads = 2, .n_batch = 512});
  const std::vector<float>* logits = &s.eval(ref.prompt);
  std::vector<int32_t> got;
  for (size_t i = 0; i < ref.greedy.size(); ++i) {
    const int32_t id = argmax(*logits);
    got.push_back(id);
    logits = &s.eval(std::span<const int32_t>(&id, 1));
  }
  // The fixture picked prompts whose greedy path has no near-tie (smallest top-1/top-2 margin printed by
  // make_hf_fixtures.py); quantized variants may still part at a narrow step, so they must agree up to
  // the first step whose margin is below their error, and f32 everywhere.
  size_t must = ref.greedy.size();
  if (v.tolerance > 1e-3) {
    const auto [lo, hi] = std::minmax_element(ref.logits.begin(), ref.logits.end());
    const float range = *hi - *lo;
    for (size_t i = 0; i < ref.margins.size(); ++i)
      if (ref.margins[i] < 2 * v.tolerance * range) {
        must = i;
        break;
      }
  }
  std::printf("%s: greedy agrees on %zu of %zu tokens (required: %zu)\n", v.folder,
              (size_t)(std::mismatch(got.begin(), got.end(), ref.greedy.begin()).first - got.begin()),
              got.size(), must);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + must),
            std::vector<int32_t>(ref.greedy.begin(), ref.greedy.begin() + must));
}

TEST_P(HfTiny, TokenizerAndChatTemplateFromTheFolder) {
  const Variant v = GetParam();
  auto model = Model::load(fixture(v.folder));
  const Reference ref = read_reference(fixture(v.folder));
  auto tok = Tokenizer::from_gguf(model->file());
  EXPECT_EQ(tok->n_vocab(), model->config().n_vocab);
  const std::string text = ref.tokenize["text"].get<std::string>();
  EXPECT_EQ(tok->encode(text, tok->add_bos(), true), ref.tokenize["ids"].get<std::vector<int32_t>>());
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->token_text(tok->eos()), "<|im_end|>");
  EXPECT_TRUE(tok->is_eog(*tok->find_token("<|im_end|>")));
  const ChatTemplate t = chat_template_for(model->file());
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  ChatRenderOptions opts;
  opts.add_generation_prompt = true;
  EXPECT_EQ(t.render(nlohmann::ordered_json(messages), opts),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // The tokenizer alone (xpert tokenize -m FOLDER) gives the same ids.
  auto only = hf::open_tokenizer_only(fixture(v.folder));
  EXPECT_EQ(Tokenizer::from_gguf(*only)->encode(text, false, true),
            ref.tokenize["ids"].get<std::vector<int32_t>>());
}

// The in-memory conversion written as a GGUF file loads to the same model, bit for bit.
TEST_P(HfTiny, SavedGgufGivesTheSameLogits) {
  const Variant v = GetParam();
  auto model = Model::load(fixture(v.folder));
  TempFolder tmp;
  const std::string path = (tmp.path / "model.gguf").string();
  hf::save_gguf(model->file(), path);
  auto again = Model::load(path);
  const Reference ref = read_reference(fixture(v.folder));
  ThreadPool pool(2);
  EXPECT_EQ(prefill_all(*model, ref.prompt, pool), prefill_all(*again, ref.prompt, pool));
  EXPECT_EQ(Tokenizer::from_gguf(again->file())->encode("hello world", false, false),
            Tokenizer::from_gguf(model->file())->encode("hello world", false, false));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfTiny, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.folder + 3); });

// The GPTQ folder with its Q4_0 tensors dequantized to F32 is the model transformers ran (the dequantized
// weights): only f32 arithmetic differs, as for the f32 variants. This isolates the repack (including the
// value-head permutation of out_proj's input blocks) from the int8 activations of the Q4_0 kernels.
TEST(HfModel, GptqDequantizedMatchesTransformers) {
  auto q = hf::open_folder(fixture("hf_qwen35moe_gptq"));
  std::vector<std::pair<std::string, gguf::Value>> kv = q->metadata();
  std::vector<gguf::TensorInfo> tensors;
  auto owned = std::make_shared<std::vector<std::vector<float>>>();
  owned->reserve(q->tensors().size());
  int n_q4 = 0;
  for (gguf::TensorInfo t : q->tensors()) {
    if (t.type == DType::Q4_0) {
      std::vector<float>& f = owned->emplace_back(t.n_elements());
      const int64_t rows = t.n_elements() / t.shape[0];
      for (int64_t r = 0; r < rows; ++r)
        dequantize_row(DType::Q4_0, t.data + r * row_bytes(DType::Q4_0, t.shape[0]),
                       f.data() + r * t.shape[0], t.shape[0]);
      t.type = DType::F32;
      t.data = reinterpret_cast<const uint8_t*>(f.data());
      t.n_bytes = f.size() * 4;
      ++n_q4;
    }
    tensors.push_back(t);
  }
  EXPECT_GT(n_q4, 20);
  auto model = make_qwen35(gguf::GGUFFile::assemble("dequantized", std::move(kv), std::move(tensors),
                                                    std::shared_ptr<const void>(owned, owned.get())));
  const Reference ref = read_reference(fixture("hf_qwen35moe_gptq"));
  ThreadPool pool(2);
  const double err =
      max_relative_error(prefill_all(*model, ref.prompt, pool), ref.logits, model->config().n_vocab);
  std::printf("hf_qwen35moe_gptq dequantized to f32: max relative logit error vs transformers %.2e\n", err);
  EXPECT_LT(err, 1e-3);
  Session s(*model, {.n_ctx = 128, .n_threads = 2, .n_batch = 512});
  const std::vector<float>* logits = &s.eval(ref.prompt);
  std::vector<int32_t> got;
  for (size_t i = 0; i < ref.greedy.size(); ++i) {
    got.push_back(argmax(*logits));
    logits = &s.eval(std::span<const int32_t>(&got.back(), 1));
  }
  EXPECT_EQ(got, ref.greedy);
}

// What the conversion does to each kind of tensor: float matrices read in place, vectors as F32,
// experts gathered, GPTQ repacked to Q4_0.
TEST(HfModel, TensorTypesAndPlacement) {
  auto f32 = hf::open_folder(fixture("hf_qwen3moe"));
  EXPECT_EQ(f32->tensor("blk.0.attn_q.weight")->type, DType::F32);
  EXPECT_EQ(f32->tensor("blk.0.ffn_gate_exps.weight")->shape, (std::vector<int64_t>{64, 32, 8}));
  EXPECT_EQ(f32->tensor("blk.1.ffn_down_exps.weight")->shape, (std::vector<int64_t>{32, 64, 8}));
  auto bf16 = hf::open_folder(fixture("hf_qwen3moe_bf16"));
  EXPECT_EQ(bf16->tensor("blk.0.attn_q.weight")->type, DType::BF16);
  EXPECT_EQ(bf16->tensor("blk.0.ffn_up_exps.weight")->type, DType::BF16);
  EXPECT_EQ(bf16->tensor("blk.0.attn_norm.weight")->type, DType::F32);
  EXPECT_EQ(bf16->tensor("token_embd.weight")->type, DType::BF16);
  auto q = hf::open_folder(fixture("hf_qwen35moe_gptq"));
  for (const char* name :
       {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_shexp.weight", "blk.0.attn_qkv.weight",
        "blk.0.ssm_out.weight", "blk.2.attn_q.weight", "blk.2.attn_output.weight"})
    EXPECT_EQ(q->tensor(name)->type, DType::Q4_0) << name;
  EXPECT_EQ(q->tensor("blk.0.ssm_alpha.weight")->type, DType::F32);
  EXPECT_EQ(q->tensor("blk.0.ssm_conv1d.weight")->shape, (std::vector<int64_t>{4, 256}));
  EXPECT_EQ(q->tensor("blk.0.ffn_gate_inp_shexp.weight")->shape, (std::vector<int64_t>{64}));
  // Tied embedding: no output.weight.
  EXPECT_EQ(hf::open_folder(fixture("hf_qwen3"))->tensor("output.weight"), nullptr);
}

// ---- GPTQ INT4 -> Q4_0 ----

struct RandomGptq {
  std::vector<int32_t> qweight;
  std::vector<uint16_t> scales;
  gptq::Layer layer;
  RandomGptq(int64_t k, int64_t n, int64_t group, uint32_t seed) {
    std::mt19937 rng(seed);
    qweight.resize(k / 8 * n);
    for (int32_t& w : qweight) w = (int32_t)rng();
    std::normal_distribution<float> d(0.01f, 0.004f);
    scales.resize(k / group * n);
    for (uint16_t& s : scales) s = f32_to_f16(d(rng));
    layer = {.qweight = reinterpret_cast<const uint8_t*>(qweight.data()),
             .scales = reinterpret_cast<const uint8_t*>(scales.data()),
             .k = k,
             .n = n,
             .group = group};
  }
};

std::vector<float> dequantize_q4_0(const std::vector<uint8_t>& q, int64_t rows, int64_t k) {
  std::vector<float> out(rows * k);
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(DType::Q4_0, q.data() + r * row_bytes(DType::Q4_0, k), out.data() + r * k, k);
  return out;
}

// Real shapes (Qwen3-30B-A3B experts: k 2048 / 768, n 768 / 2048; group 128) and the other group sizes.
TEST(Gptq, RepackToQ4_0IsLossless) {
  for (auto [k, n, group] : {std::tuple<int64_t, int64_t, int64_t>{2048, 768, 128},
                             {768, 2048, 128},
                             {256, 40, 32},
                             {512, 24, 256},
                             {192, 16, 64}}) {
    RandomGptq g(k, n, group, (uint32_t)(k * 31 + n));
    std::vector<float> want(n * k);
    gptq::dequantize_reference(g.layer, want.data());
    std::vector<uint8_t> q(n * row_bytes(DType::Q4_0, k));
    gptq::repack_q4_0(g.layer, {}, {}, q.data());
    const std::vector<float> got = dequantize_q4_0(q, n, k);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << k << "x" << n << " g" << group;
    EXPECT_EQ(gptq::nibble(g.layer, 3, 9), ((uint32_t)g.qweight[1 * n + 3] >> 4) & 0xF);  // low nibble first
  }
}

TEST(Gptq, RepackPermutesRowsAndColumnBlocks) {
  const int64_t k = 256, n = 24, group = 64;
  RandomGptq g(k, n, group, 7);
  std::vector<float> w(n * k);
  gptq::dequantize_reference(g.layer, w.data());
  std::vector<int64_t> rows = {5, 0, 23, 7, 7, 11}, blocks = {3, 2, 1, 0, 7, 6, 5, 4};
  std::vector<uint8_t> q(rows.size() * row_bytes(DType::Q4_0, k));
  gptq::repack_q4_0(g.layer, rows, blocks, q.data());
  const std::vector<float> got = dequantize_q4_0(q, (int64_t)rows.size(), k);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t b = 0; b < k / 32; ++b)
      for (int64_t j = 0; j < 32; ++j)
        ASSERT_EQ(got[r * k + b * 32 + j], w[rows[r] * k + blocks[b] * 32 + j]) << r << " " << b << " " << j;
}

// The repacked layer runs through the ordinary Q4_0 matmul: same result as the reference product of the
// dequantized weights (int8 activations in both).
TEST(Gptq, RepackedLayerMultipliesLikeQ4_0) {
  const int64_t k = 2048, n = 64, m = 3;
  RandomGptq g(k, n, 128, 11);
  std::vector<uint8_t> q(n * row_bytes(DType::Q4_0, k));
  gptq::repack_q4_0(g.layer, {}, {}, q.data());
  std::vector<float> x(m * k), y(m * n), y_ref(m * n);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (float& v : x) v = d(rng);
  ThreadPool pool(2);
  cpu::matmul(DType::Q4_0, q.data(), n, k, x.data(), m, y.data(), n, pool);
  cpu::matmul_reference(DType::Q4_0, q.data(), n, k, x.data(), m, y_ref.data(), n);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(y[i], y_ref[i], 1e-3 * (1 + std::fabs(y_ref[i])));
}

TEST(Gptq, ZeroPointsAndGroupIndex) {
  const int64_t groups = 2, n = 16;
  std::vector<uint32_t> v1(groups * n / 8, 0x77777777u), v2(groups * n / 8, 0x88888888u);
  EXPECT_NO_THROW(gptq::check_qzeros(reinterpret_cast<const uint8_t*>(v1.data()), groups, n, 1, "t.qzeros"));
  EXPECT_NO_THROW(gptq::check_qzeros(reinterpret_cast<const uint8_t*>(v2.data()), groups, n, 0, "t.qzeros"));
  EXPECT_THROW(gptq::check_qzeros(reinterpret_cast<const uint8_t*>(v2.data()), groups, n, 1, "t.qzeros"),
               Error);
  v1[3] = 0x77777767u;  // one asymmetric zero point
  try {
    gptq::check_qzeros(reinterpret_cast<const uint8_t*>(v1.data()), groups, n, 1, "t.qzeros");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.qzeros: zero point 7 (group 1, output 9)"), std::string::npos)
        << e.what();
  }
  std::vector<int32_t> g_idx(256);
  for (int i = 0; i < 256; ++i) g_idx[i] = i / 128;
  EXPECT_NO_THROW(gptq::check_g_idx(reinterpret_cast<const uint8_t*>(g_idx.data()), 256, 128, "t.g_idx"));
  std::swap(g_idx[0], g_idx[200]);
  EXPECT_THROW(gptq::check_g_idx(reinterpret_cast<const uint8_t*>(g_idx.data()), 256, 128, "t.g_idx"), Error);
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << parts[0] << "'";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Gptq, ConfigRefusesAnythingButSymmetricInt4) {
  const json good = {
      {"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"sym", true}, {"desc_act", false}};
  EXPECT_EQ(gptq::parse_config(good, "c").group_size, 128);
  EXPECT_EQ(gptq::parse_config(good, "c").zero_offset, 1);
  json v2 = good;
  v2["checkpoint_format"] = "gptq_v2";
  EXPECT_EQ(gptq::parse_config(v2, "c").zero_offset, 0);
  auto with = [&](const char* key, json value) {
    json j = good;
    j[key] = std::move(value);
    return j;
  };
  expect_error([&] { gptq::parse_config(with("bits", 8), "cfg.json"); },
               {"cfg.json", "quantization_config.bits = 8"});
  expect_error([&] { gptq::parse_config(with("sym", "yes"), "c"); }, {"quantization_config.sym = \"yes\""});
  EXPECT_FALSE(gptq::parse_config(with("sym", false), "c").sym);  // asymmetric: native experts only
  expect_error([&] { gptq::parse_config(with("desc_act", true), "c"); },
               {"quantization_config.desc_act = true"});
  expect_error([&] { gptq::parse_config(with("group_size", 48), "c"); },
               {"quantization_config.group_size = 48"});
  expect_error([&] { gptq::parse_config(with("quant_method", "awq"), "c"); }, {"quant_method = \"awq\""});
  expect_error([&] { gptq::parse_config(with("checkpoint_format", "marlin"), "c"); },
               {"checkpoint_format = \"marlin\""});
  expect_error(
      [&] {
        gptq::parse_config(with("dynamic", {{"+:.*q_proj", {{"bits", 8}}}}), "c");
      },
      {"dynamic['+:.*q_proj']"});
  EXPECT_NO_THROW(gptq::parse_config(with("dynamic", {{"-:.*lm_head", json::object()}}), "c"));
}

// ---- other layouts of the same checkpoint ----

// transformers' in-memory layout (mlp.experts.gate_up_proj [X, 2F, E], down_proj [X, E, F]) loads to the
// same model as the per-expert tensors save_pretrained writes.
TEST(HfModel, FusedExpertsLoadLikePerExpert) {
  TempFolder tmp("hf_qwen3moe");
  auto ck = safetensors::Checkpoint::open(fixture("hf_qwen3moe"));
  std::vector<safetensors::TensorBytes> out;
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(4);  // references into it stay valid
  const int64_t X = 8, F = 32, E = 64;
  for (const safetensors::Tensor* t : ck->tensors())
    if (t->name.find(".mlp.experts.") == std::string::npos)
      out.push_back({t->name, t->dtype, t->shape, t->data, t->n_bytes});
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", layer);
    std::vector<uint8_t>& gu = keep.emplace_back(X * 2 * F * E * 4);
    std::vector<uint8_t>& down = keep.emplace_back(X * E * F * 4);
    for (int e = 0; e < X; ++e) {
      const auto* g = ck->find(fmt::format("{}{}.gate_proj.weight", p, e));
      const auto* u = ck->find(fmt::format("{}{}.up_proj.weight", p, e));
      const auto* d = ck->find(fmt::format("{}{}.down_proj.weight", p, e));
      std::memcpy(gu.data() + e * 2 * F * E * 4, g->data, g->n_bytes);
      std::memcpy(gu.data() + (e * 2 + 1) * F * E * 4, u->data, u->n_bytes);
      std::memcpy(down.data() + e * E * F * 4, d->data, d->n_bytes);
    }
    out.push_back({p + "gate_up_proj", safetensors::DType::F32, {X, 2 * F, E}, gu.data(), gu.size()});
    out.push_back({p + "down_proj", safetensors::DType::F32, {X, E, F}, down.data(), down.size()});
  }
  for (const auto& e : fs::directory_iterator(tmp.path))
    if (e.path().string().find("safetensors") != std::string::npos) fs::remove(e.path());
  safetensors::write((tmp.path / "model.safetensors").string(), out);
  auto fused = Model::load(tmp.str());
  auto per_expert = Model::load(fixture("hf_qwen3moe"));
  const Reference ref = read_reference(fixture("hf_qwen3moe"));
  ThreadPool pool(2);
  EXPECT_EQ(prefill_all(*fused, ref.prompt, pool), prefill_all(*per_expert, ref.prompt, pool));
}

void edit_config(const TempFolder& t, const std::function<void(json&)>& f) {
  json c = read_json(t.path / "config.json");
  f(c);
  write_json(t.path / "config.json", c);
}

// A text-only Qwen3.5-MoE config has no rope_parameters.mrope_section: transformers runs plain RoPE over
// the rotary dims, which on text positions is what the fixture's interleaved sections compute.
TEST(HfModel, Qwen35WithoutMropeSectionRunsPlainRope) {
  TempFolder tmp("hf_qwen35moe");
  edit_config(tmp, [](json& c) {
    c["rope_parameters"].erase("mrope_section");
    c["rope_parameters"].erase("mrope_interleaved");
  });
  auto plain = Model::load(tmp.str());
  auto sections = Model::load(fixture("hf_qwen35moe"));
  const Reference ref = read_reference(fixture("hf_qwen35moe"));
  ThreadPool pool(2);
  const std::vector<float> got = prefill_all(*plain, ref.prompt, pool);
  EXPECT_EQ(got, prefill_all(*sections, ref.prompt, pool));
  EXPECT_LT(max_relative_error(got, ref.logits, plain->config().n_vocab), 1e-3);
}

// ---- refusals ----

TEST(HfModel, RefusesUnsupportedConfigs) {
  struct Case {
    const char* folder;
    std::function<void(json&)> edit;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"hf_qwen3",
       [](json& c) { c["model_type"] = "llama4"; },
       {"config.json", "model_type 'llama4' is not supported"}},
      {"hf_qwen3", [](json& c) { c["hidden_act"] = "gelu"; }, {"hidden_act = \"gelu\" is not supported"}},
      {"hf_qwen3",
       [](json& c) { c["rope_parameters"]["rope_type"] = "yarn"; },
       {"rope_parameters.rope_type = 'yarn' is not supported"}},
      {"hf_qwen3", [](json& c) { c["attention_bias"] = true; }, {"attention_bias = true is not supported"}},
      {"hf_qwen3", [](json& c) { c["tie_word_embeddings"] = false; }, {"'lm_head.weight' is missing"}},
      {"hf_qwen3",
       [](json& c) { c["num_hidden_layers"] = 3; },
       {"tensor 'model.layers.2.input_layernorm.weight' is missing"}},
      {"hf_qwen3",
       [](json& c) { c["head_dim"] = 16; },
       {"model.layers.0.self_attn.q_proj.weight' has shape [128, 64], expected [64, 64]"}},
      {"hf_qwen3", [](json& c) { c["num_hidden_layers"] = -1; }, {"num_hidden_layers = -1 is not valid"}},
      {"hf_qwen3moe",
       [](json& c) { c["norm_topk_prob"] = false; },
       {"norm_topk_prob = false is not supported"}},
      {"hf_qwen3moe",
       [](json& c) { c["mlp_only_layers"] = {1}; },
       {"mlp_only_layers = [1] is not supported"}},
      {"hf_qwen35moe",
       [](json& c) { c["layer_types"][1] = "sliding_attention"; },
       {"layer_types[1] = \"sliding_attention\" is not supported"}},
      {"hf_qwen35moe",
       [](json& c) { c["linear_num_key_heads"] = 3; },
       {"not a multiple of linear_num_key_heads 3"}},
      {"hf_qwen35moe",
       [](json& c) {
         c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 64}};
       },
       {}},  // a float checkpoint with a GPTQ config loads: every layer is looked up as .weight first
      {"hf_qwen35moe_gptq",
       [](json& c) { c["quantization_config"]["bits"] = 3; },
       {"quantization_config.bits = 3"}},
      {"hf_qwen35moe_gptq",
       [](json& c) { c["quantization_config"]["desc_act"] = true; },
       {"quantization_config.desc_act = true"}},
      {"hf_qwen35moe_gptq",
       [](json& c) { c["quantization_config"]["sym"] = false; },
       {"expert 'model.layers.0.mlp.experts.0.gate_proj' is asymmetric GPTQ (sym = false)", "only natively"}},
      {"hf_qwen35moe_gptq",
       [](json& c) { c["quantization_config"]["group_size"] = 128; },
       {"group size 128 does not divide"}},
      {"hf_qwen35moe_gptq",
       [](json& c) { c["quantization_config"]["group_size"] = 32; },
       {"'model.layers.0.linear_attn.in_proj_qkv.scales' has shape [1, 256], expected [2, 256]"}},
      // v2 stores the zero point itself: the file's 7s are then asymmetric.
      {"hf_qwen35moe_gptq",
       [](json& c) { c["quantization_config"]["checkpoint_format"] = "gptq_v2"; },
       {".qzeros: zero point 7", "not the symmetric 8", "sym = true"}},
      {"hf_qwen35moe_gptq",
       [](json& c) { c.erase("quantization_config"); },
       {"'model.layers.0.linear_attn.in_proj_qkv.qweight' is GPTQ-quantized, but config.json has no "
        "quantization_config"}},
  };
  for (const Case& c : cases) {
    TempFolder t(c.folder);
    edit_config(t, c.edit);
    if (c.message.empty()) {
      EXPECT_NO_THROW(Model::load(t.str()));
      continue;
    }
    expect_error([&] { Model::load(t.str()); }, c.message);
  }
}

TEST(HfModel, RefusesMissingOrBrokenFiles) {
  {
    TempFolder t;
    expect_error([&] { Model::load(t.str()); }, {"no config.json"});
  }
  {
    TempFolder t("hf_qwen3");
    fs::remove(t.path / "model.safetensors");
    expect_error([&] { Model::load(t.str()); },
                 {"no model.safetensors, model.safetensors.index.json or *.safetensors"});
  }
  {
    TempFolder t("hf_qwen3moe");
    json index = read_json(t.path / "model.safetensors.index.json");
    index["weight_map"]["model.norm.weight"] = "../model.safetensors";
    write_json(t.path / "model.safetensors.index.json", index);
    expect_error([&] { Model::load(t.str()); }, {"weight_map['model.norm.weight'] = '../model.safetensors'"});
  }
  {
    TempFolder t("hf_qwen3moe");
    fs::remove(t.path / "model-00002-of-00003.safetensors");
    expect_error([&] { Model::load(t.str()); }, {"model-00002-of-00003.safetensors"});
  }
  {
    TempFolder t("hf_qwen3");
    std::ofstream(t.path / "config.json") << "{\"model_type\": ";
    expect_error([&] { Model::load(t.str()); }, {"config.json: not valid JSON"});
  }
  {  // a truncated weight file names the file and the tensor
    TempFolder t("hf_qwen3");
    fs::resize_file(t.path / "model.safetensors", fs::file_size(t.path / "model.safetensors") - 100);
    expect_error([&] { Model::load(t.str()); }, {"model.safetensors: tensor '", "reach past the"});
  }
  {  // a GPTQ layer whose qzeros encode another zero point
    TempFolder t("hf_qwen35moe_gptq");
    auto ck = safetensors::Checkpoint::open(t.str());
    std::vector<safetensors::TensorBytes> out;
    std::vector<int32_t> zeros;
    for (const safetensors::Tensor* x : ck->tensors()) {
      out.push_back({x->name, x->dtype, x->shape, x->data, x->n_bytes});
      if (x->name == "model.layers.2.self_attn.o_proj.qzeros") {
        zeros.assign(x->n_elements(), 0x77777777);
        zeros[1] = 0x77778777;
        out.back().data = zeros.data();
      }
    }
    const auto bytes = safetensors::serialize(out);
    ck.reset();
    std::ofstream(t.path / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
    expect_error([&] { Model::load(t.str()); },
                 {"model.layers.2.self_attn.o_proj.qzeros: zero point 9 (group 0, output 11)"});
  }
}

}  // namespace
}  // namespace xpert
