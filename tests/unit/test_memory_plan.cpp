// The memory plan (runtime/memory_plan.h): bytes per device from the config and the placement, checked
// against what KvCache and RecurrentState really allocate, and the refusals with what to change.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "runtime/experts/plan.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "runtime/memory_plan.h"
#include "model/recurrent_state.h"

namespace xpert {
namespace {

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A dense 4-layer model of 1000 bytes a layer, embedding 500, output 300.
ModelConfig dense_config() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = 4;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_ff = 128;
  c.n_vocab = 100;
  c.n_ctx_train = 8192;
  return c;
}
ModelBytes dense_bytes() {
  ModelBytes b;
  b.layers.assign(4, LayerBytes{.dense = 1000, .expert = 0});
  b.embedding = 500;
  b.output = 300;
  return b;
}
ExpertPlan placement(int64_t n_gpu_layers, size_t gpu_free = 0) {
  ExpertPlanOptions o;
  o.n_gpu_layers = n_gpu_layers;
  o.gpu_free_bytes = gpu_free;
  return plan_experts(dense_config(), dense_bytes(), o);
}

TEST(MemoryPlan, HybridFixtureKvOnlyForAttentionLayers) {
  auto m = Model::load(fixture("tiny_qwen35.gguf"));
  const ModelConfig& c = m->config();
  int64_t n_attn = 0, n_rec = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) (c.layer_recurrent[il] ? n_rec : n_attn)++;
  ASSERT_GT(n_attn, 0);
  ASSERT_GT(n_rec, 0);
  const ExpertPlan pl = plan_experts(c, ModelBytes::of(*m), {});
  const MemoryPlan p = plan_memory(c, pl, {.n_ctx = 200, .n_parallel = 3, .n_batch = 64, .cache_ram_bytes = 1 << 20,
                                           .weights_mapped = true, .host_available = 0});
  EXPECT_FALSE(p.gpu);
  // n_ctx × n_parallel × 2 × n_head_kv × head_dim × 2 bytes per attention layer, none for the others.
  EXPECT_EQ(p.host.kv, (size_t)(n_attn * 200 * 3 * 2 * c.n_head_kv * c.head_dim * 2));
  EXPECT_EQ(p.host.kv, KvCache(c, 200, 3).bytes());
  EXPECT_EQ(p.host.recurrent, RecurrentState(c, 3).bytes());
  EXPECT_EQ(p.host.recurrent, (size_t)n_rec * recurrent_bytes_per_layer(c, 3));
  EXPECT_EQ(p.host.weights, pl.host_bytes);
  size_t file_bytes = 0;
  for (const auto& t : m->file().tensors()) file_bytes += t.n_bytes;
  EXPECT_EQ(p.host.weights, file_bytes);  // everything on the host, read in place
  EXPECT_EQ(p.host.state_cache, (size_t)1 << 20);
  EXPECT_EQ(p.host.scratch, scratch_bytes(c, 64, 3));
  EXPECT_EQ(p.host.allocated(), p.host.total() - p.host.weights);
  EXPECT_EQ(p.check(), "");  // unknown availability: nothing to check
  EXPECT_NE(p.summary().find("recurrent states"), std::string::npos);
}

TEST(MemoryPlan, TiedHeadIsMappedOnce) {
  // The placement counts a tied head as the embedding again; the mapping holds it once.
  const ModelConfig c = dense_config();
  const MemoryPlan p = plan_memory(c, placement(0), {.n_ctx = 16, .n_parallel = 1, .n_batch = 8, .cache_ram_bytes = 0,
                                                     .weights_mapped = true, .file_weight_bytes = 4500,
                                                     .host_available = 0});
  EXPECT_EQ(placement(0).host_bytes, 4800u);
  EXPECT_EQ(p.host.weights, 4500u);
}

// Weights a device reads in place are the host's mapped pages: not the device's allocations, counted with the
// host's mapped weights.
TEST(MemoryPlan, WeightsReadInPlaceAreMappedHostPages) {
  const ModelConfig c = dense_config();
  ExpertPlanOptions o;
  o.n_gpu_layers = 2;
  o.gpu_free_bytes = 100000;
  o.gpu_weights_in_place = true;
  const ExpertPlan pl = plan_experts(c, dense_bytes(), o);
  const MemoryPlanOptions mo{.n_ctx = 16, .n_batch = 8, .weights_mapped = true};
  const MemoryPlan p = plan_memory(c, pl, mo);
  ASSERT_TRUE(p.gpu);
  EXPECT_TRUE(p.gpu->weights_mapped);
  EXPECT_EQ(p.gpu->weights, 2300u);  // two layers of 1000 and the output head
  EXPECT_EQ(p.gpu->allocated(), p.gpu->total() - p.gpu->weights);
  EXPECT_EQ(p.host.weights, 500u + 2000u + 2300u);  // embedding and host layers, and the device's
}

TEST(MemoryPlan, ScratchFormula) {
  const ModelConfig c = dense_config();
  // 4·64 + 2·4·16 + 2·2·16 + 3·128 + 0 = 832 floats a token, + 100 logits a sequence.
  EXPECT_EQ(scratch_bytes(c, 10), (size_t)(10 * 832 + 100) * 4);
  EXPECT_EQ(scratch_bytes(c, 10, 3), (size_t)(10 * 832 + 3 * 100) * 4);
}

TEST(MemoryPlan, OffloadedLayersHoldTheirKvOnTheGpu) {
  const ModelConfig c = dense_config();
  const MemoryPlan p = plan_memory(c, placement(3, 1 << 30), {.n_ctx = 1000, .n_parallel = 1, .n_batch = 8,
                                                              .cache_ram_bytes = 0, .weights_mapped = true,
                                                              .host_available = 0});
  ASSERT_TRUE(p.gpu);
  const size_t kv = kv_bytes_per_layer(c, 1000, 1);
  EXPECT_EQ(kv, (size_t)1000 * 2 * 2 * 16 * 2);
  EXPECT_EQ(p.host.kv, kv);
  EXPECT_EQ(p.gpu->kv, 3 * kv);
  EXPECT_EQ(p.gpu->weights, 3 * 1000 + 300u);  // 3 layers + the output head
  EXPECT_EQ(p.host.weights, 1000 + 500u);      // 1 layer + the embedding
  EXPECT_EQ(p.gpu->scratch, scratch_bytes(c, 8));
  EXPECT_EQ(p.host.scratch, 0u);
  EXPECT_EQ(p.gpu->available, (size_t)1 << 30);
  EXPECT_EQ(p.check(), "");
}

TEST(MemoryPlan, RefusesAGpuThatIsTooSmall) {
  const ModelConfig c = dense_config();
  const MemoryPlan p = plan_memory(c, placement(4, 100000), {.n_ctx = 8000, .n_parallel = 2, .n_batch = 8,
                                                              .cache_ram_bytes = 0, .weights_mapped = true,
                                                              .host_available = 0});
  const std::string e = error_of([&] { p.check(); });
  EXPECT_NE(e.find("cuda:0 needs"), std::string::npos) << e;
  EXPECT_NE(e.find("free"), std::string::npos) << e;
  EXPECT_NE(e.find("-c; now 8000"), std::string::npos) << e;
  EXPECT_NE(e.find("--parallel; now 2"), std::string::npos) << e;
  EXPECT_NE(e.find("-ngl"), std::string::npos) << e;
}

TEST(MemoryPlan, HostRamCountsAllocationsNotMappedWeights) {
  const ModelConfig c = dense_config();
  MemoryPlanOptions o{.n_ctx = 4000, .n_parallel = 1, .n_batch = 8, .cache_ram_bytes = 1 << 20,
                      .weights_mapped = true, .host_available = 0};
  const size_t allocated = plan_memory(c, placement(0), o).host.allocated();
  // Room for the allocations but not for the weights too: runs, with a warning.
  o.host_available = allocated + 10;
  const MemoryPlan fits = plan_memory(c, placement(0), o);
  EXPECT_NE(fits.check().find("read from disk again"), std::string::npos);
  // Less than the allocations: refused, naming -c and --cache-ram (not -ngl: no GPU involved).
  o.host_available = allocated - 10;
  const std::string e = error_of([&] { plan_memory(c, placement(0), o).check(); });
  EXPECT_NE(e.find("host RAM"), std::string::npos) << e;
  EXPECT_NE(e.find("-c; now 4000"), std::string::npos) << e;
  EXPECT_NE(e.find("--cache-ram"), std::string::npos) << e;
  EXPECT_EQ(e.find("-ngl"), std::string::npos) << e;
  // Weights that are allocated (not mapped) count.
  o.host_available = allocated + 10;
  o.weights_mapped = false;
  EXPECT_NE(error_of([&] { plan_memory(c, placement(0), o).check(); }), "");
}

TEST(MemoryPlan, ContextFlag) {
  ModelConfig c = dense_config();
  EXPECT_EQ(resolve_ctx_flag(c, -1), 4096);  // not given
  EXPECT_EQ(resolve_ctx_flag(c, 0), 8192);   // the trained maximum
  EXPECT_EQ(resolve_ctx_flag(c, 8192), 8192);
  const std::string e = error_of([&] { resolve_ctx_flag(c, 8193); });
  EXPECT_NE(e.find("-c 8193 is above the model's trained context of 8192 tokens"), std::string::npos) << e;
  c.n_ctx_train = 256;
  EXPECT_EQ(resolve_ctx_flag(c, -1), 256);  // the default shrinks to a small model's maximum
  c.n_ctx_train = 0;                        // not stated: any -c, but no -c 0
  EXPECT_EQ(resolve_ctx_flag(c, 100000), 100000);
  EXPECT_NE(error_of([&] { resolve_ctx_flag(c, 0); }), "");
}

TEST(MemoryPlan, HostAvailableMemoryIsRead) {
  EXPECT_GT(host_available_memory(), 0u);  // Linux: /proc/meminfo
}

}  // namespace
}  // namespace xpert
