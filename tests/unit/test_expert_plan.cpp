// The placement planner (which experts of which layers live on the GPU, and the bytes per device), the
// routing statistics file, and the placement flags' validation. No GPU needed: free memory is a number.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/error.h"
#include "model/model.h"
#include "runtime/experts/plan.h"
#include "runtime/experts/routing_stats.h"
#include "runtime/placement.h"

namespace xpert {
namespace {

std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("xpert_test_plan_" + name)).string();
}

// 4 layers of 8 experts (top-2): dense 1000 bytes and 100 bytes per expert, embedding 500, output 300.
ModelConfig config() {
  ModelConfig c;
  c.arch = "qwen3moe";
  c.n_layer = 4;
  c.n_expert = 8;
  c.n_expert_used = 2;
  return c;
}
ModelBytes sizes(size_t expert = 100) {
  ModelBytes b;
  b.layers.assign(4, LayerBytes{.dense = 1000, .expert = expert});
  b.embedding = 500;
  b.output = 300;
  return b;
}

std::vector<int32_t> gpu_list(const ExpertPlan& p, int64_t il) {
  std::vector<int32_t> v;
  for (int64_t e = 0; e < p.n_expert; ++e)
    if (p.expert_on_gpu(il, e)) v.push_back((int32_t)e);
  return v;
}

size_t all_bytes(const ModelConfig& c, const ModelBytes& b) {
  size_t s = b.embedding + b.output;
  for (const LayerBytes& l : b.layers) s += l.dense + l.expert * (size_t)c.n_expert;
  return s;
}

TEST(ExpertPlan, WithoutCountsEveryExpertOfAGpuLayerIsOnTheGpu) {
  const ModelConfig c = config();
  const ExpertPlan p = plan_experts(c, sizes(), {.n_gpu_layers = 2});
  EXPECT_EQ(p.first_gpu_layer, 2);
  EXPECT_EQ(p.choice, ExpertChoice::all);
  EXPECT_FALSE(p.splits_experts());
  EXPECT_EQ(gpu_list(p, 0), std::vector<int32_t>{});
  EXPECT_EQ(p.n_gpu_experts(3), 8);
  EXPECT_EQ(p.gpu_dense_bytes, 2000u);
  EXPECT_EQ(p.gpu_expert_bytes, 1600u);
  EXPECT_EQ(p.gpu_output_bytes, 300u);  // the output head goes with any offload (Model::offload)
  EXPECT_EQ(p.host_bytes, 500u + 2000u + 1600u);
  EXPECT_EQ(p.gpu_bytes() - p.gpu_stream_bytes + p.host_bytes, all_bytes(c, sizes()));
  EXPECT_DOUBLE_EQ(p.gpu_routing_share, 1.0);

  const ExpertPlan all = plan_experts(c, sizes(), {.n_gpu_layers = 4});
  EXPECT_EQ(all.gpu_output_bytes, 300u);
  EXPECT_EQ(all.host_bytes, 500u);
  const ExpertPlan none = plan_experts(c, sizes(), {});
  EXPECT_EQ(none.first_gpu_layer, 4);
  EXPECT_EQ(none.gpu_bytes(), 0u);
  EXPECT_EQ(none.host_bytes, all_bytes(c, sizes()));
  EXPECT_NE(none.summary().find("on the host"), std::string::npos);
}

TEST(ExpertPlan, CountPerLayerByIndexWithoutAProfile) {
  const ModelConfig c = config();
  const ExpertPlan p = plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 3});
  EXPECT_EQ(p.choice, ExpertChoice::index);
  EXPECT_TRUE(p.splits_experts());
  EXPECT_EQ(gpu_list(p, 1), std::vector<int32_t>{});  // a host layer keeps all its experts on the host
  EXPECT_EQ(gpu_list(p, 2), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(gpu_list(p, 3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(p.gpu_expert_bytes, 600u);
  EXPECT_EQ(p.host_expert_bytes, 2600u);
  EXPECT_EQ(p.gpu_stream_bytes, 800u);  // one layer's 8 experts, copied to the GPU for a batch
  EXPECT_EQ(p.gpu_bytes() - p.gpu_stream_bytes + p.host_bytes, all_bytes(c, sizes()));
  EXPECT_DOUBLE_EQ(p.gpu_routing_share, 3.0 / 8.0);  // uniform routing assumed
  // Expected host expert bytes per token: every layer routes 2 of 8 experts: P = 1/4 per expert.
  EXPECT_DOUBLE_EQ(p.host_expert_bytes_per_token, 0.25 * 100 * (8 + 8 + 5 + 5));
  EXPECT_NE(p.summary(true).find("by index"), std::string::npos);

  const ExpertPlan zero = plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 0});
  EXPECT_EQ(zero.gpu_expert_bytes, 0u);
  EXPECT_TRUE(zero.splits_experts());
  const ExpertPlan full = plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 8});
  EXPECT_FALSE(full.splits_experts());
}

RoutingStats skewed_profile() {
  RoutingStats s(4, 8, 2);
  const uint64_t l2[8] = {80, 10, 5, 5, 0, 0, 0, 0};
  const uint64_t l3[8] = {10, 10, 10, 10, 10, 10, 20, 20};
  for (int64_t e = 0; e < 8; ++e) {
    s.set(0, e, e < 4 ? 10 : 15);  // every layer saw the same 50 tokens (100 routings)
    s.set(1, e, e < 4 ? 15 : 10);
    s.set(2, e, l2[e]);
    s.set(3, e, l3[e]);
  }
  return s;
}

TEST(ExpertPlan, CountPerLayerByFrequencyWithAProfile) {
  const ModelConfig c = config();
  const RoutingStats prof = skewed_profile();
  const ExpertPlan p = plan_experts(
      c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 3, .profile = &prof, .profile_path = "p.json"});
  EXPECT_EQ(p.choice, ExpertChoice::frequency);
  EXPECT_EQ(gpu_list(p, 2), (std::vector<int32_t>{0, 1, 2}));  // 80, 10, then 5 vs 5: the lower index
  EXPECT_EQ(gpu_list(p, 3), (std::vector<int32_t>{0, 6, 7}));  // 20, 20, then a tie of 10s: expert 0
  EXPECT_DOUBLE_EQ(p.layer_gpu_share[2], 0.95);
  EXPECT_DOUBLE_EQ(p.layer_gpu_share[3], 0.5);
  EXPECT_DOUBLE_EQ(p.gpu_routing_share, (95.0 + 50.0) / 200.0);
  EXPECT_EQ(p.profile_tokens, 50u);  // 100 routings of top-2
  EXPECT_NE(p.summary().find("by routing frequency (profile p.json"), std::string::npos);
}

TEST(ExpertPlan, BudgetGoesRoundRobinByIndexWithoutAProfile) {
  const ModelConfig c = config();
  const ExpertPlan p = plan_experts(c, sizes(), {.n_gpu_layers = 2, .gpu_expert_budget_bytes = 350});
  EXPECT_EQ(p.choice, ExpertChoice::index);
  EXPECT_EQ(gpu_list(p, 2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(gpu_list(p, 3), (std::vector<int32_t>{0}));
  EXPECT_EQ(p.gpu_expert_bytes, 300u);
  EXPECT_EQ(p.gpu_bytes() - p.gpu_stream_bytes + p.host_bytes, all_bytes(c, sizes()));
}

TEST(ExpertPlan, BudgetGoesGloballyToTheMostRoutedExperts) {
  const ModelConfig c = config();
  const RoutingStats prof = skewed_profile();
  const ExpertPlan p =
      plan_experts(c, sizes(), {.n_gpu_layers = 2, .gpu_expert_budget_bytes = 399, .profile = &prof});
  EXPECT_EQ(gpu_list(p, 2), (std::vector<int32_t>{0}));     // 80 %
  EXPECT_EQ(gpu_list(p, 3), (std::vector<int32_t>{6, 7}));  // 20 % each beat layer 2's 10 %
  EXPECT_EQ(p.gpu_expert_bytes, 300u);
  EXPECT_DOUBLE_EQ(p.gpu_routing_share, (80.0 + 40.0) / 200.0);
  // Host experts read per token: Σ P × bytes over host experts (P = count * k / total).
  double want = 0;
  for (int64_t il = 0; il < 4; ++il)
    for (int64_t e = 0; e < 8; ++e)
      if (!p.expert_on_gpu(il, e)) want += (double)prof.count(il, e) * 2 / (double)prof.layer_total(il) * 100;
  EXPECT_NEAR(p.host_expert_bytes_per_token, want, 1e-9);
}

TEST(ExpertPlan, BudgetWeighsRoutingAgainstExpertSize) {
  ModelConfig c = config();
  ModelBytes b = sizes();
  b.layers[3].expert = 40;  // e.g. a layer quantized smaller: more of its experts per byte
  const RoutingStats prof = skewed_profile();
  const ExpertPlan p =
      plan_experts(c, b, {.n_gpu_layers = 2, .gpu_expert_budget_bytes = 200, .profile = &prof});
  // P per byte: layer 2's expert 0 (1.6 / 100) first, then layer 3's experts 6 and 7 (0.4 / 40), then
  // layer 3's others (0.2 / 40) before layer 2's expert 1 (0.2 / 100); 100 + 40 + 40 = 180 and no
  // further expert fits in 200.
  EXPECT_EQ(gpu_list(p, 2), (std::vector<int32_t>{0}));
  EXPECT_EQ(gpu_list(p, 3), (std::vector<int32_t>{6, 7}));
  EXPECT_LE(p.gpu_expert_bytes, 200u);
  EXPECT_EQ(p.gpu_bytes() - p.gpu_stream_bytes + p.host_bytes, all_bytes(c, b));
}

TEST(ExpertPlan, ContradictionsAndImpossibleRequestsAreErrors) {
  const ModelConfig c = config();
  EXPECT_THROW(
      plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 2, .gpu_expert_budget_bytes = 100}),
      Error);
  EXPECT_THROW(plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 9}), Error);
  EXPECT_THROW(plan_experts(c, sizes(), {.n_gpu_layers = 0, .num_gpu_experts = 2}), Error);
  ModelConfig dense = config();
  dense.n_expert = dense.n_expert_used = 0;
  EXPECT_THROW(plan_experts(dense, sizes(0), {.n_gpu_layers = 2, .gpu_expert_budget_bytes = 100}), Error);
  const RoutingStats other(4, 16, 2);
  EXPECT_THROW(plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 2, .profile = &other}), Error);
}

TEST(ExpertPlan, APlanThatDoesNotFitTheGpuIsRefusedSayingWhatFits) {
  const ModelConfig c = config();
  // Layers 2-3: dense 2000 + 16 experts 1600 + output 300 = 3900.
  EXPECT_NO_THROW(plan_experts(c, sizes(), {.n_gpu_layers = 2, .gpu_free_bytes = 3900}));
  try {
    plan_experts(c, sizes(), {.n_gpu_layers = 2, .gpu_free_bytes = 3000, .gpu_extra_bytes = 100});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("free"), std::string::npos) << m;
    EXPECT_NE(m.find("--gpu-expert-budget"), std::string::npos) << m;
  }
  // With the output, the staging of one layer's host experts (8 x 100) and the extra bytes counted, 6
  // experts fit in 3800 - 2000 - 300 - 800 - 100 = 600 bytes.
  const ExpertPlan p = plan_experts(
      c, sizes(),
      {.n_gpu_layers = 2, .gpu_expert_budget_bytes = 600, .gpu_free_bytes = 3800, .gpu_extra_bytes = 100});
  EXPECT_EQ(p.gpu_expert_bytes, 600u);
  EXPECT_EQ(p.gpu_stream_bytes, 800u);
  EXPECT_EQ(p.gpu_bytes(), 3800u);
  EXPECT_THROW(plan_experts(c, sizes(),
                            {.n_gpu_layers = 2,
                             .gpu_expert_budget_bytes = 600,
                             .gpu_free_bytes = 3000,
                             .gpu_extra_bytes = 100}),
               Error);
  try {
    plan_experts(c, sizes(), {.n_gpu_layers = 2, .num_gpu_experts = 0, .gpu_free_bytes = 1500});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lower -ngl"), std::string::npos) << e.what();
  }
}

// A device that reads its weights in place from host memory (an OpenCL CPU device, fine-grained system SVM)
// needs room for its cache and scratch alone: weights beyond its free bytes are no reason to refuse.
TEST(ExpertPlan, WeightsReadInPlaceTakeNoDeviceMemory) {
  const ModelConfig c = config();
  const ExpertPlan p = plan_experts(
      c, sizes(),
      {.n_gpu_layers = 2, .gpu_free_bytes = 1000, .gpu_extra_bytes = 100, .gpu_weights_in_place = true});
  EXPECT_TRUE(p.gpu_weights_in_place);
  EXPECT_EQ(p.gpu_bytes(),
            4000u);  // what the layers read: dense 2000 + experts 1600 + output 300 + extra 100
  EXPECT_NE(p.summary().find("read in place from host memory"), std::string::npos) << p.summary();
  try {
    plan_experts(
        c, sizes(),
        {.n_gpu_layers = 2, .gpu_free_bytes = 1000, .gpu_extra_bytes = 1200, .gpu_weights_in_place = true});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cache and scratch"), std::string::npos) << m;
    EXPECT_NE(m.find("lower -c"), std::string::npos) << m;
  }
}

TEST(ExpertPlan, BytesOfARealModelAddUpToItsTensors) {
  auto m = Model::load(fixture("tiny_qwen3moe.gguf"));
  const ModelConfig& c = m->config();
  const ModelBytes b = ModelBytes::of(*m);
  size_t tensors = 0;
  for (const auto& t : m->file().tensors()) tensors += t.n_bytes;
  size_t sum = b.embedding + b.output;
  for (const LayerBytes& l : b.layers) {
    EXPECT_GT(l.expert, 0u);
    sum += l.dense + l.expert * (size_t)c.n_expert;
  }
  if (!m->host_weights().output) sum -= m->host_weights().tok_embd.n_bytes;  // a tied head is the embedding
  EXPECT_EQ(sum, tensors);
  const ExpertPlan p = plan_experts(c, b, {.n_gpu_layers = c.n_layer, .num_gpu_experts = c.n_expert / 2});
  EXPECT_EQ(p.gpu_expert_bytes, b.layers[0].expert * (size_t)(c.n_expert / 2) * (size_t)c.n_layer);
}

TEST(PlacementFlags, ExpertDeviceAndFlagsAreValidatedBeforeAnythingIsLoaded) {
  auto m = Model::load(fixture("tiny_qwen3moe.gguf"));
  // --expert-device: cpu, or opencl:N in builds with OpenCL (a model on the host; OpenCLModel tests it).
  EXPECT_NO_THROW(plan_placement(*m, {.device = "cpu", .n_gpu_layers = -1}));
#ifdef XPERT_HAVE_OPENCL
  EXPECT_NO_THROW(plan_placement(*m, {.device = "cpu", .expert_device = "opencl:0"}));
#else
  try {
    plan_placement(*m, {.device = "cpu", .expert_device = "opencl:0"});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without OpenCL"), std::string::npos) << e.what();
  }
#endif
  EXPECT_THROW(plan_placement(*m, {.device = "cpu", .expert_device = "cuda:0"}), Error);
  EXPECT_THROW(plan_placement(*m, {.device = "cpu", .expert_device = "tpu"}), Error);
  // Lists: an OpenCL device and the CPU together, each named once; --expert-share only for that pair.
  auto error_of = [&](const PlacementOptions& o) -> std::string {
    try {
      plan_placement(*m, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({.device = "cpu", .expert_device = "cpu,cpu"}).find("named twice"), std::string::npos);
  EXPECT_NE(error_of({.device = "cpu", .expert_device = "cpu,"}), "");
  EXPECT_NE(error_of({.device = "cpu", .expert_device = "cpu,cuda:0"}), "");
  EXPECT_NE(error_of({.device = "cpu", .expert_device = "cpu", .expert_share = "0.5"}).find("opencl:N,cpu"),
            std::string::npos);
#ifdef XPERT_HAVE_OPENCL
  EXPECT_EQ(error_of({.device = "cpu", .expert_device = "opencl:0,cpu"}), "");
  EXPECT_EQ(error_of({.device = "cpu", .expert_device = "cpu,opencl:0", .expert_share = "0.25,0.75"}), "");
  EXPECT_NE(error_of({.device = "cpu", .expert_device = "opencl:0,opencl:1"}).find("one OpenCL"),
            std::string::npos);
  EXPECT_NE(
      error_of({.device = "cpu", .expert_device = "opencl:0", .expert_share = "0.5"}).find("opencl:N,cpu"),
      std::string::npos);
  for (const char* bad : {"1.5", "-0.1", "half", "0.2,", ",0.2", "0.2,0.3,0.4", "nan"})
    EXPECT_NE(error_of({.device = "cpu", .expert_device = "opencl:0,cpu", .expert_share = bad})
                  .find("--expert-share"),
              std::string::npos)
        << bad;
#endif
  // Experts on a GPU need GPU layers.
  EXPECT_THROW(plan_placement(*m, {.device = "cpu", .num_gpu_experts = 2}), Error);
  EXPECT_THROW(plan_placement(*m, {.device = "cpu", .gpu_expert_budget = "12 parsecs"}), Error);
  if (cuda_device_count() == 0) {
    EXPECT_THROW(plan_placement(*m, {.num_gpu_experts = 2}), Error);
    const ExpertPlan p = plan_placement(*m, {});
    EXPECT_EQ(p.first_gpu_layer, m->config().n_layer);
  }
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("12GiB"), 12ull << 30);
  EXPECT_EQ(parse_bytes("12gib"), 12ull << 30);
  EXPECT_EQ(parse_bytes("800MiB"), 800ull << 20);
  EXPECT_EQ(parse_bytes("800M"), 800ull << 20);
  EXPECT_EQ(parse_bytes("1.5G"), 3ull << 29);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000u);
  EXPECT_EQ(parse_bytes("64KiB"), 65536u);
  EXPECT_EQ(parse_bytes("1TiB"), 1ull << 40);
  EXPECT_EQ(parse_bytes("100B"), 100u);
  for (const char* bad : {"", "abc", "12XB", "-1", "1.5", "1.2.3G", "G", "12 G B", "1e9"})
    EXPECT_THROW(parse_bytes(bad, "--gpu-expert-budget"), Error) << bad;
}

TEST(RoutingStats, CountsRankingAndShares) {
  RoutingStats s(2, 4, 2);
  const std::vector<int32_t> ids = {3, 1, 3, 0, 3, 1};
  s.add(1, ids);
  EXPECT_EQ(s.layer_counts(1), (std::vector<uint64_t>{1, 2, 0, 3}));
  EXPECT_EQ(s.layer_total(0), 0u);
  EXPECT_EQ(s.max_tokens(), 3u);
  EXPECT_EQ(s.ranked(1), (std::vector<int32_t>{3, 1, 0, 2}));
  EXPECT_DOUBLE_EQ(s.top_share(1, 1), 0.5);
  EXPECT_DOUBLE_EQ(s.top_share(0, 1), 0.0);
  RoutingStats copy = s;
  s.reset();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(copy.count(1, 3), 3u);
  EXPECT_THROW(RoutingStats(2, 0, 0), Error);
}

TEST(RoutingStats, SaveLoadRoundTripAndIdentityCheck) {
  auto m = Model::load(fixture("tiny_qwen3moe.gguf"));
  const ModelIdentity id = ModelIdentity::of(*m);
  EXPECT_EQ(id.arch, "qwen3moe");
  EXPECT_EQ(id.file_bytes, std::filesystem::file_size(fixture("tiny_qwen3moe.gguf")));
  RoutingStats s(*m);
  for (int64_t il = 0; il < s.n_layer(); ++il)
    for (int64_t e = 0; e < s.n_expert(); ++e)
      s.set(il, e, (uint64_t)(il * 1000 + e * 7 + (e % 3) * (1ull << 40)));
  const std::string path = temp_path("profile.json");
  s.save(path, id);
  const RoutingStats back = RoutingStats::load(path, id);
  for (int64_t il = 0; il < s.n_layer(); ++il) EXPECT_EQ(back.layer_counts(il), s.layer_counts(il));
  EXPECT_EQ(back.n_expert_used(), s.n_expert_used());

  auto expect_error = [&](const ModelIdentity& other, const char* word) {
    try {
      RoutingStats::load(path, other);
      FAIL() << "expected an Error about " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  ModelIdentity other = id;
  other.file_bytes += 1;
  expect_error(other, "file size");
  other = id;
  other.arch = "qwen35moe";
  expect_error(other, "architecture");
  other = id;
  other.n_expert *= 2;
  expect_error(other, "n_expert");
  other = id;
  other.n_layer += 1;
  expect_error(other, "n_layer");

  auto write = [&](const std::string& text) { std::ofstream(path, std::ios::trunc) << text; };
  for (const char* bad : {"", "{", "[]", R"({"format": "other", "version": 1})",
                          R"({"format": "xpert-routing-profile", "version": 2})"}) {
    write(bad);
    EXPECT_THROW(RoutingStats::load(path, id), Error) << bad;
  }
  // Right identity, counts of the wrong shape or sign.
  nlohmann::json j = {{"format", "xpert-routing-profile"},
                      {"version", 1},
                      {"model",
                       {{"arch", id.arch},
                        {"name", id.name},
                        {"n_layer", id.n_layer},
                        {"n_expert", id.n_expert},
                        {"n_expert_used", id.n_expert_used},
                        {"file_bytes", id.file_bytes}}},
                      {"tokens", 1},
                      {"counts", nlohmann::json::array({nlohmann::json::array({1, 2})})}};
  write(j.dump());
  EXPECT_THROW(RoutingStats::load(path, id), Error);
  j["counts"] = nlohmann::json::array();
  for (int64_t il = 0; il < id.n_layer; ++il) j["counts"].push_back(std::vector<int>(id.n_expert, -1));
  write(j.dump());
  EXPECT_THROW(RoutingStats::load(path, id), Error);
  EXPECT_THROW(RoutingStats::load(temp_path("missing.json"), id), Error);
  std::filesystem::remove(path);

  EXPECT_EQ(RoutingStats::default_path("/m/x.gguf"), "/m/x.gguf.xpert-profile.json");
  EXPECT_EQ(RoutingStats::default_path("/m/folder/"), "/m/folder.xpert-profile.json");
}

// Which placements load a GPTQ folder's experts natively: wherever every expert executor reads them so (the
// CPU, an OpenCL expert device, CUDA's MoE kernels), not with the whole-model OpenCL backend's layers.
TEST(Placement, NativeGptqExpertsWhereEveryExecutorReadsThem) {
  EXPECT_TRUE(native_gptq_experts({.device = "cpu"}));
  EXPECT_FALSE(native_gptq_experts({.device = "cuda:0"}));  // wholly on the GPU: the faster Q4_0 decode
  EXPECT_TRUE(native_gptq_experts({.device = "cuda:0", .gpu_expert_budget = "8GiB"}));  // split experts
  EXPECT_TRUE(native_gptq_experts({.device = "cuda:0", .num_gpu_experts = 16}));  // split layers
  EXPECT_TRUE(native_gptq_experts({.device = "cuda:0", .n_gpu_layers = 10, .expert_device = "opencl:0,cpu"}));
  EXPECT_FALSE(native_gptq_experts({.device = "opencl:0"}));  // OpenclBackend's layers: the Q4_0 repack
  EXPECT_TRUE(native_gptq_experts({.device = "opencl:0", .n_gpu_layers = 0}));         // no GPU layer
  EXPECT_FALSE(native_gptq_experts({.device = "cuda:0", .expert_device = "cuda:0"}));  // refused later
}

}  // namespace
}  // namespace xpert
