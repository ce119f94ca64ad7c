// The bytes a step moves (runtime/traffic.h), against sums over the fixtures' GGUF tensors by name, and the
// host copy bandwidth measurement.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "base/thread_pool.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "runtime/memory_plan.h"
#include "runtime/traffic.h"

namespace xpert {
namespace {

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

// The file's tensors by name: routed experts ("_exps"), the embedding, the head, the rest.
struct FileBytes {
  double experts = 0, embedding = 0, rest = 0;
  bool has_output = false;
};
FileBytes file_bytes(const Model& m) {
  FileBytes f;
  for (const auto& t : m.file().tensors()) {
    if (t.name.find("_exps.") != std::string::npos)
      f.experts += (double)t.n_bytes;
    else if (t.name == "token_embd.weight")
      f.embedding += (double)t.n_bytes;
    else
      f.rest += (double)t.n_bytes;
    f.has_output |= t.name == "output.weight";
  }
  return f;
}

TEST(Traffic, MoeTokenReadsItsExpertsShareAndPassReadsAll) {
  auto m = Model::load(fixture("tiny_qwen3moe.gguf"));
  const ModelConfig& c = m->config();
  ASSERT_GT(c.n_expert, c.n_expert_used);
  const FileBytes f = file_bytes(*m);
  const StepTraffic t = StepTraffic::of(*m, {});
  const double head = f.has_output ? 0.0 : f.embedding;  // a tied head reads the whole embedding
  const double row = f.embedding / (double)c.n_vocab;
  const double kv =
      (double)c.n_layer * 2 * (double)(c.n_head_kv * c.head_dim) * 2;  // f16 K and V, a position
  const double ctx = 37;
  EXPECT_DOUBLE_EQ(t.decode_bytes(ctx),
                   f.rest + head + f.experts * (double)c.n_expert_used / (double)c.n_expert + row + kv * ctx);
  // A pass of enough tokens touches every expert; one token a pass reads what a decoded token does.
  EXPECT_DOUBLE_EQ(t.prefill_bytes(512, ctx), f.rest + head + f.experts + 512 * row + kv * ctx);
  EXPECT_DOUBLE_EQ(t.prefill_bytes(1, ctx), t.decode_bytes(ctx));
  // A q8_0 cache moves 34 bytes for every 32 values instead of 64.
  const StepTraffic q8 = StepTraffic::of(*m, {DType::Q8_0, DType::Q8_0});
  EXPECT_DOUBLE_EQ(t.decode_bytes(ctx) - q8.decode_bytes(ctx), kv * ctx * (1.0 - 34.0 / 64.0));
}

TEST(Traffic, HybridReadsKvOfAttentionLayersAndMovesStates) {
  auto m = Model::load(fixture("tiny_qwen35.gguf"));
  const ModelConfig& c = m->config();
  int64_t n_attn = 0, n_rec = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) (c.layer_recurrent[il] ? n_rec : n_attn)++;
  ASSERT_GT(n_rec, 0);
  const StepTraffic t = StepTraffic::of(*m, {});
  EXPECT_DOUBLE_EQ(t.decode_bytes(100) - t.decode_bytes(40),
                   60.0 * (double)n_attn * (double)kv_bytes_per_layer(c, 1, 1, {}));
  EXPECT_DOUBLE_EQ(t.state, (double)n_rec * (double)recurrent_bytes_per_layer(c, 1));
  const FileBytes f = file_bytes(*m);
  const double head = f.has_output ? 0.0 : f.embedding;
  EXPECT_DOUBLE_EQ(t.decode_bytes(0), f.rest + head + f.embedding / (double)c.n_vocab + 2 * t.state);
}

TEST(Traffic, HostCopyBandwidthIsMeasured) {
  ThreadPool pool(2);
  const double bw = copy_bandwidth(nullptr, pool);
  EXPECT_TRUE(std::isfinite(bw));
  EXPECT_GT(bw, 0.0);
}

}  // namespace
}  // namespace xpert
