// A MoE model whose experts run on an OpenCL device (--expert-device opencl:N; the KTransformers iGPU
// scenario) against the same model on the CPU: the CPU routes and combines, the device computes the
// experts with int8 activations like the CPU, so logits agree within a tolerance and greedy tokens
// until a near-tie; the same with the experts shared between the device and the CPU (three tiers' host
// part). CI runs it on PoCL; without an OpenCL platform it skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "base/thread_pool.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/session.h"

#ifdef XPERT_HAVE_OPENCL
#include "backend/opencl/discovery.h"
#include "backend/opencl/expert_executor.h"
#include "opencl_test_util.h"
#endif

namespace xpert {
namespace {

#ifdef XPERT_HAVE_OPENCL
// dev against cpu: prefill logits within a tolerance, greedy tokens until a near-tie.
void expect_like_the_cpu(const Model& cpu, const Model& dev, const char* what) {
  const int64_t V = cpu.config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((int32_t)((i * 131 + 7) % V));
  auto generate = [&](const Model& m, std::vector<float>& first_logits) {
    Session s(m, {.n_ctx = 64, .n_threads = 2, .n_batch = 512, .cache_ram_bytes = 0, .checkpoint_every = 0});
    std::vector<int32_t> out;
    std::vector<float> logits = s.eval(prompt);
    first_logits = logits;
    for (int i = 0; i < 8; ++i) {
      const int32_t t = (int32_t)(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
      out.push_back(t);
      logits = s.eval(std::span<const int32_t>(&t, 1));
    }
    return out;
  };
  std::vector<float> la, lb;
  const std::vector<int32_t> a = generate(cpu, la), b = generate(dev, lb);
  ASSERT_EQ(la.size(), lb.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    scale = std::max(scale, std::fabs(la[i]));
    worst = std::max(worst, std::fabs(la[i] - lb[i]));
  }
  EXPECT_LT(worst / scale, 2e-2f) << what << ": prefill logits, max |device - cpu| / max |logit|";
  size_t agree = 0;
  while (agree < a.size() && a[agree] == b[agree]) ++agree;
  EXPECT_GE(agree, 1u) << what << ": the first greedy token differs";
  std::printf("%s: prefill max|d|/max|logit| %.2e, greedy agrees on %zu of %zu tokens\n", what, worst / scale,
              agree, a.size());
}

std::string tiny_moe_file(const std::string& preset = "tiny-qwen3moe") {
  const std::string file =
      (std::filesystem::temp_directory_path() / ("xpert_opencl_model_" + preset + ".gguf")).string();
  synth_write({.preset = preset, .type = "Q4_K_M", .output = file, .seed = 11, .progress = {}});
  return file;
}

TEST(OpenCLModel, ExpertsOnTheDeviceMatchTheCpu) {
  if (!cltest::have_device()) GTEST_SKIP() << "no OpenCL device";
  const std::string file = tiny_moe_file();
  auto cpu = Model::load(file);
  auto dev = Model::load(file);
  dev->attach_expert_executor(opencl::make_expert_executor(0));
  expect_like_the_cpu(*cpu, *dev, "experts on opencl:0");
}

// --expert-device opencl:0,cpu: each batch's experts shared between the device and the CPU's threads (for
// prefill and decode alike here; the phases' shares differ in the measured plan).
TEST(OpenCLModel, ExpertsSharedWithTheCpuMatchTheCpu) {
  if (!cltest::have_device()) GTEST_SKIP() << "no OpenCL device";
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
    const std::string file = tiny_moe_file(preset);
    auto cpu = Model::load(file);
    for (ExecutorShare share : {ExecutorShare{.decode = 0.5, .prefill = 0.5},
                                ExecutorShare{.decode = 0.0, .prefill = 0.7, .prefill_min_tokens = 8}}) {
      auto dev = Model::load(file);
      dev->attach_expert_executor(opencl::make_expert_executor(0), share);
      expect_like_the_cpu(*cpu, *dev, (std::string(preset) + ": experts on opencl:0 and the CPU").c_str());
    }
  }
}

// A GPTQ-INT4 folder (tests/reference/fixtures/hf_qwen35moe_gptq) with its experts native (GPTQ4_G64, as
// --expert-device opencl:0 loads it): the device alone and shared with the CPU, against the CPU's native
// experts.
TEST(OpenCLModel, NativeGptqExpertsMatchTheCpu) {
  if (!cltest::have_device()) GTEST_SKIP() << "no OpenCL device";
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  const std::string dir = std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/hf_qwen35moe_gptq";
  auto cpu = Model::load(dir, {.native_gptq_experts = true});
  ASSERT_EQ(cpu->file().tensor("blk.0.ffn_gate_exps.weight")->type, DType::GPTQ4_G64);
  auto dev = Model::load(dir, {.native_gptq_experts = true});
  dev->attach_expert_executor(opencl::make_expert_executor(0));
  expect_like_the_cpu(*cpu, *dev, "native GPTQ experts on opencl:0");
  auto both = Model::load(dir, {.native_gptq_experts = true});
  both->attach_expert_executor(opencl::make_expert_executor(0), ExecutorShare{.decode = 0.5, .prefill = 0.5});
  expect_like_the_cpu(*cpu, *both, "native GPTQ experts on opencl:0 and the CPU");
}
#else
TEST(OpenCLModel, NotBuiltIn) { GTEST_SKIP() << "built without the OpenCL backend"; }
#endif

}  // namespace
}  // namespace xpert
