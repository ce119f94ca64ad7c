// `xpert synth`: the files load (shapes, types, metadata as llama.cpp names them), run, are reproducible,
// and bad options fail with a clear message. (That llama.cpp loads them too is
// tests/reference/check_synth_llama_cpp.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/kv_cache.h"

namespace xpert {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("xpert_test_synth_" + name + ".gguf")).string();
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Synth, TinyQwen3MoeLoadsAndRuns) {
  const std::string path = temp_path("tiny");
  const SynthResult r = synth_write({.preset = "tiny-qwen3moe", .type = "Q4_K_M", .output = path, .seed = 1});
  EXPECT_EQ(r.file_bytes, std::filesystem::file_size(path));
  auto model = Model::load(path);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.arch, "qwen3moe");
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 2);
  EXPECT_EQ(c.n_ff_exp, 256);
  EXPECT_EQ(c.n_vocab, 512);
  const gguf::GGUFFile& f = model->file();
  EXPECT_EQ(f.tensor("blk.1.ffn_gate_exps.weight")->type, DType::Q4_K);
  EXPECT_EQ(f.tensor("blk.1.ffn_gate_exps.weight")->shape, (std::vector<int64_t>{256, 256, 8}));
  EXPECT_EQ(f.tensor("blk.0.ffn_down_exps.weight")->shape, (std::vector<int64_t>{256, 256, 8}));
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight")->type, DType::F32);
  EXPECT_EQ(f.tensor("output.weight")->type, DType::Q6_K);
  EXPECT_EQ(f.require_int("general.file_type"), 15);
  EXPECT_EQ(f.find("tokenizer.ggml.tokens")->count, 512u);

  ThreadPool pool(2);
  const std::vector<int32_t> tokens = {1, 300, 17, 42, 511, 259, 3, 100};
  KvCache batch_cache(c, 16), step_cache(c, 16);
  std::vector<float> all, one;
  model->forward({.tokens = tokens, .pos0 = 0, .cache = &batch_cache, .seq = 0, .all_logits = true}, all, pool);
  ASSERT_EQ(all.size(), tokens.size() * 512);
  for (size_t t = 0; t < tokens.size(); ++t) {
    model->forward({.tokens = std::span(tokens).subspan(t, 1), .pos0 = (int32_t)t, .cache = &step_cache, .seq = 0},
                   one, pool);
    double max_err = 0, max_abs = 0;
    for (int64_t i = 0; i < 512; ++i) {
      ASSERT_TRUE(std::isfinite(all[t * 512 + i]));
      max_err = std::max(max_err, (double)std::fabs(all[t * 512 + i] - one[i]));
      max_abs = std::max(max_abs, (double)std::fabs(one[i]));
    }
    EXPECT_GT(max_abs, 0.1) << "random weights should give non-trivial logits";
    EXPECT_LT(max_err, 1e-3 * max_abs) << "position " << t;
  }
  std::filesystem::remove(path);
}

TEST(Synth, EveryTypeLoadsAndRowsTheBlocksDoNotDivideFallBack) {
  for (const std::string& type : synth_types()) {
    const std::string path = temp_path(type);
    synth_write({.preset = "tiny-qwen3moe-64", .type = type, .output = path});
    auto model = Model::load(path);
    const gguf::GGUFFile& f = model->file();
    const DType gate = f.tensor("blk.0.ffn_gate_exps.weight")->type;
    const DType out = f.tensor("output.weight")->type;
    if (type == "Q4_K_M") {
      EXPECT_EQ(gate, DType::Q5_0);  // rows of 64: no Q4_K
      EXPECT_EQ(out, DType::Q8_0);
    } else {
      EXPECT_EQ(dtype_name(gate), type);
    }
    ThreadPool pool(1);
    KvCache cache(model->config(), 4);
    std::vector<float> logits;
    const std::vector<int32_t> tokens = {1, 2, 3};
    model->forward({.tokens = tokens, .pos0 = 0, .cache = &cache}, logits, pool);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << type;
    std::filesystem::remove(path);
  }
}

TEST(Synth, SameSeedSameBytes) {
  const std::string a = temp_path("a"), b = temp_path("b"), c = temp_path("c");
  synth_write({.preset = "tiny-qwen3moe-64", .type = "Q8_0", .output = a, .seed = 7});
  synth_write({.preset = "tiny-qwen3moe-64", .type = "Q8_0", .output = b, .seed = 7});
  synth_write({.preset = "tiny-qwen3moe-64", .type = "Q8_0", .output = c, .seed = 8});
  EXPECT_EQ(read_all(a), read_all(b));
  EXPECT_NE(read_all(a), read_all(c));
  for (const auto& p : {a, b, c}) std::filesystem::remove(p);
}

TEST(Synth, BadOptionsFailClearly) {
  auto message = [](const SynthOptions& o) {
    try {
      synth_write(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string path = temp_path("bad");
  EXPECT_NE(message({.preset = "qwen9", .output = path}).find("known: qwen3-30b-a3b"), std::string::npos);
  EXPECT_NE(message({.preset = "qwen3.5-35b-a3b", .output = path}).find("not available yet"), std::string::npos);
  EXPECT_NE(message({.preset = "tiny-qwen3moe", .type = "Q3_K", .output = path}).find("unknown --type"),
            std::string::npos);
  EXPECT_NE(message({.preset = "tiny-qwen3moe", .output = "/nonexistent-dir/x.gguf"}).find("cannot create"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace xpert
