// Model level: each tiny fixture model (dense, qwen3moe, qwen35 hybrids) with every layer on the GPU,
// and with half of them (-ngl n_layer/2), against the same model on the CPU: logits of a prefill, then
// greedy decoding token by token. Kernels differ in summation order and activation precision (the GPU
// prefill multiplies f16 activations, the CPU int8), so logits agree within a tolerance, not exactly;
// greedy tokens must agree until a near-tie (a gap under kTieGap in the CPU's logits), where either
// choice is right. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "../unit/model_outputs.h"
#include "backend/cuda/cuda_backend.h"
#include "base/thread_pool.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/kv_cache.h"
#include "runtime/recurrent_state.h"
#include "runtime/session.h"

namespace xpert {
namespace {

constexpr float kLogitTol = 2e-2f;  // max |gpu - cpu| / max |cpu logit|

class CudaModel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CudaModel, MatchesCpu) {
  XPERT_REQUIRE_GPU();
  const auto& [file, fraction] = GetParam();  // fraction: layers on the GPU, in halves (2 = all)
  auto cpu = Model::load(fixture(file));
  auto gpu = Model::load(fixture(file));
  const int64_t n_layer = gpu->config().n_layer;
  gpu->offload(make_cuda_backend(0), fraction == 2 ? n_layer : n_layer / 2);
  const int64_t V = cpu->config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));
  ThreadPool pool(2);
  const Outputs a = run(*cpu, prompt, 24, pool), b = run(*gpu, prompt, 24, pool);

  const float d = prefill_rel_diff(a, b);
  EXPECT_LT(d, kLogitTol) << file;
  SCOPED_TRACE(file);
  const size_t agree = greedy_agreement(a, b, V);  // the CPU's logits decide a near-tie
  std::printf("%s, %s on the GPU: prefill max|d|/max|logit| %.2e, greedy agrees on %zu of %zu tokens\n",
              file.c_str(), fraction == 2 ? "all layers" : "half the layers", d, agree, a.tokens.size());
}

// A decode-step fusion against the same model without it (its variable at 0 when that backend is made),
// every layer on the GPU: the prompt's logits, then 24 greedy steps, of each.
// n_prompt prompt tokens, n_gen steps, in a cache of ctx rows. on_value: the variable's value for the model
// with the fusion (null: unset, for a fusion that is on by default).
std::pair<Outputs, Outputs> with_and_without(const char* var, const std::string& file, int n_prompt = 20,
                                             int n_gen = 24, int64_t ctx = 128,
                                             const char* on_value = nullptr) {
  auto on = Model::load(file);
  auto off = Model::load(file);
  if (on_value) setenv(var, on_value, 1);
  on->offload(make_cuda_backend(0), on->config().n_layer);
  setenv(var, "0", 1);
  off->offload(make_cuda_backend(0), off->config().n_layer);
  unsetenv(var);
  const int64_t V = on->config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < n_prompt; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));
  ThreadPool pool(2);
  return {run(*on, prompt, n_gen, pool, {}, ctx), run(*off, prompt, n_gen, pool, {}, ctx)};
}

// Each step's logits of a against b (the reference) within kLogitTol while greedy agrees; returns the worst.
float worst_step_diff(const Outputs& a, const Outputs& b, size_t steps) {
  float worst = 0;
  for (size_t i = 0; i < steps; ++i) {
    float w = 0;
    for (size_t j = 0; j < b.step_logits[i].size(); ++j)
      w = std::max(w, std::fabs(a.step_logits[i][j] - b.step_logits[i][j]));
    worst = std::max(worst, w / max_abs(b.step_logits[i]));
  }
  return worst;
}

// a (a fusion that changes the summation order) against b (without it), n_prompt prompt tokens: the same
// prefill, each step's logits within kLogitTol while greedy agrees (b's logits decide a near-tie).
void expect_steps_close(const Outputs& a, const Outputs& b, int n_prompt, const std::string& what) {
  EXPECT_EQ(a.prefill, b.prefill) << what;
  const int64_t V = (int64_t)(a.prefill.size() / n_prompt);
  const size_t agree = greedy_agreement(b, a, V);
  const float worst = worst_step_diff(a, b, agree);
  EXPECT_LT(worst, kLogitTol) << what;
  std::printf("%s: steps max|d|/max|logit| %.2e, greedy %zu of %zu\n", what.c_str(), worst, agree,
              a.tokens.size());
}

// The whole decode step of a qwen3moe stack in one persistent kernel (cuda/decode_stack.h, opt-in:
// XPERT_DECODE_STACK=1) against the op-by-op kernels, synth tiny models at Q4_K_M (head dims 64 and 128, the
// attention is compiled for each). The prefill takes neither path: the same bits. The steps sum in other
// orders, and the two attentions differ in precision (the op path rounds q and the probabilities to f16 for
// its tensor cores; the stack keeps f32 over the same f16 cache). The first kStackSteps steps must be
// within kStackTol (measured on the H200: 1.1e-2 to 2.1e-2), and not bit-identical (else the stack did not
// run). Later steps are only reported: once the two caches differ, a router near-tie can pick another
// expert in one path, which moves the logits by far more than the sums' rounding (seen at step 10 of the
// head-dim-128 run at 600 tokens: 2.1e-2, then 0.56, and the greedy tokens part). At 20 prompt tokens a
// head's keys are one block's; at 600, past 512, they are split over blocks and combined.
constexpr float kStackTol = 4e-2f;
constexpr size_t kStackSteps = 4;
class CudaDecodeStack : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CudaDecodeStack, MatchesOps) {
  XPERT_REQUIRE_GPU();
  const auto& [preset, n_prompt] = GetParam();
  const TempFile tmp("cuda_stack_" + preset + ".gguf");  // this process's: the parameters run in parallel
  const std::string& file = tmp.path;
  synth_write({.preset = preset, .type = "Q4_K_M", .output = file, .seed = 11, .progress = {}});
  const auto [a, b] = with_and_without("XPERT_DECODE_STACK", file, n_prompt, 16, 1024, "1");
  EXPECT_EQ(a.prefill, b.prefill);
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  EXPECT_NE(a.step_logits[0], b.step_logits[0]) << "the decode stack did not run";
  size_t agree = 0;  // steps fed the same tokens
  while (agree < a.tokens.size() && a.tokens[agree] == b.tokens[agree]) ++agree;
  ASSERT_GE(agree, kStackSteps);
  EXPECT_LT(worst_step_diff(a, b, kStackSteps), kStackTol);
  std::printf("%s Q4_K_M, %d prompt tokens, decode stack vs ops, max|d|/max|logit| up to each step:",
              preset.c_str(), n_prompt);
  for (size_t i = 1; i <= agree; ++i) std::printf(" %.1e", worst_step_diff(a, b, i));
  std::printf(" (greedy %zu of %zu)\n", agree, a.tokens.size());
}
INSTANTIATE_TEST_SUITE_P(Depths, CudaDecodeStack,
                         ::testing::Combine(::testing::Values("tiny-qwen3moe", "tiny-qwen3moe-hd128"),
                                            ::testing::Values(20, 600)));

// Qwen3.5's shared expert as one more slot of the decode MoE kernels (synth tiny-qwen35moe at Q4_K_M: the
// shared expert has the routed experts' length and block types) against the same model computing it apart
// (sigmoid(x . g) * its FFN added after the routed sum). The prefill takes neither: the same bits; the steps
// differ in summation order only: each step's logits within kLogitTol, greedy agreeing up to a near-tie.
TEST(CudaModelFusions, SharedExpertSlotMatchesSeparateProducts) {
  XPERT_REQUIRE_GPU();
  const TempFile tmp("cuda_shexp_tiny.gguf");
  const std::string& file = tmp.path;
  synth_write({.preset = "tiny-qwen35moe", .type = "Q4_K_M", .output = file, .seed = 9, .progress = {}});
  {
    auto m = Model::load(file);
    int slot_layers = 0;  // layers whose shared expert the kernels can take as a slot
    for (int64_t il = 0; il < m->config().n_layer; ++il) {
      const LayerWeights& l = m->layer(il);
      slot_layers +=
          l.ffn_gate_shexp.type == l.ffn_gate_exps.type && l.ffn_down_shexp.type == l.ffn_down_exps.type;
    }
    ASSERT_GT(slot_layers, 0) << "the synth no longer exercises the shared-expert slot";
  }
  const auto [a, b] = with_and_without("XPERT_SHARED_SLOT", file);
  expect_steps_close(a, b, 20, "tiny-qwen35moe Q4_K_M, shared-expert slot vs apart");
}

// A preset's Q4_K_M with var unset and =0: the same prefill, tokens and step logits, bit for bit.
void expect_exact_with(const char* var, const char* preset, int n_prompt) {
  const TempFile tmp("cuda_exact_with.gguf");
  synth_write({.preset = preset, .type = "Q4_K_M", .output = tmp.path, .seed = 7, .progress = {}});
  const auto [a, b] = with_and_without(var, tmp.path, n_prompt, 24, 128);
  EXPECT_EQ(a.prefill, b.prefill);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.step_logits, b.step_logits);
}

// Qwen3.5's output gate applied by the attention combine (the default) against mul_sigmoid after it
// (XPERT_ATTN_GATE=0).
TEST(CudaModelFusions, AttentionGateInCombineIsExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_ATTN_GATE", "tiny-qwen35moe", 20);
}

// The decode attention starting its first key stages before its PDL wait (the default) against after it
// (XPERT_ATTN_EARLY=0), at depths where the early start happens.
TEST(CudaModelFusions, EarlyKeyStagesAreExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_ATTN_EARLY", "tiny-qwen3moe", 60);
}

// q/k norms + RoPE + K/V stores done by the one-block attention's blocks (the default at head_dim 128 /
// 256 with an f16 cache) against their own launch first (XPERT_ATTN_PREP=0): the same bits.
TEST(CudaModelFusions, AttentionPrepInBlocksIsExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_ATTN_PREP", "tiny-qwen3moe-hd128", 20);
}

// Qwen3.5's gated norm folded into the recurrent delta rule (a block per value head; the default where the
// head dims allow) against its own launch after it (XPERT_GDN_NORM_FUSE=0): the same bits in every decode
// step (the prefill takes the chunked form).
TEST(CudaModelFusions, GatedNormInDeltaRuleIsExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_GDN_NORM_FUSE", "tiny-qwen35moe", 20);
}

// A decode row's products of two weight types in one launch (the default; tiny models at Q4_K_M have Q6_K
// attn_v / attn_qkv in their last layers) against a launch per type (XPERT_MATVEC_PAIR=0): the same bits.
TEST(CudaModelFusions, PairedProductsAreExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_MATVEC_PAIR", "tiny-qwen3moe-hd128", 20);
  expect_exact_with("XPERT_MATVEC_PAIR", "tiny-qwen35moe", 20);
}

// The FFN norm inside the decode router (the default at n_embd 1025..2048 with every expert on the GPU:
// each router block normalizes x + d itself, the experts' down product adds d) against the norm's own
// launch (XPERT_NORM_IN_ROUTER=0): the same bits, Qwen3's layers and Qwen3.5's (the shared expert's gate
// block normalizes too).
TEST(CudaModelFusions, NormInRouterIsExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_NORM_IN_ROUTER", "tiny-qwen3moe-2048", 20);
  expect_exact_with("XPERT_NORM_IN_ROUTER", "tiny-qwen35moe-2048", 20);
}

// The next layer's attention norm done by the experts' down product's last block (the default beside the
// norm in the router) against its own launch at the next layer's start (XPERT_NORM_AFTER_DOWN=0): the same
// bits, Qwen3's layers and Qwen3.5's (before both of its mixers).
TEST(CudaModelFusions, NormAfterDownIsExact) {
  XPERT_REQUIRE_GPU();
  expect_exact_with("XPERT_NORM_AFTER_DOWN", "tiny-qwen3moe-2048", 20);
  expect_exact_with("XPERT_NORM_AFTER_DOWN", "tiny-qwen35moe-2048", 20);
}

// The attention and its output projection in one launch (the default for Qwen3-30B-A3B's attention with a
// Q4_K output matrix: each block's rows over 4 heads' columns, the router adding the groups' parts)
// against the attention then the product (XPERT_ATTN_PROJ=0): the same prefill (which takes neither), and
// steps within kLogitTol, not the same bits (the products sum in another order, so equal bits would mean
// the fusion did not run). Then the same with the FFN norm's own launch (XPERT_NORM_IN_ROUTER=0 on both),
// which takes the parts' sum from sum_parts instead of the router.
TEST(CudaModelFusions, ProjectionInAttentionIsClose) {
  XPERT_REQUIRE_GPU();
  const TempFile tmp("cuda_attn_proj.gguf");
  synth_write(
      {.preset = "tiny-qwen3moe-gqa8", .type = "Q4_K_M", .output = tmp.path, .seed = 7, .progress = {}});
  for (const bool router : {true, false}) {
    if (!router) setenv("XPERT_NORM_IN_ROUTER", "0", 1);
    const auto [a, b] = with_and_without("XPERT_ATTN_PROJ", tmp.path, 20, 24, 128);
    unsetenv("XPERT_NORM_IN_ROUTER");
    expect_steps_close(a, b, 20,
                       router ? "projection in attention, parts added by the router"
                              : "projection in attention, parts added by sum_parts");
    EXPECT_NE(a.step_logits, b.step_logits) << "the fusion did not run";
  }
}

// A session's logits registered with the GPU (the default: each step's copy lands in them directly) against
// plain ones (XPERT_PIN_LOGITS=0): the logits the session returns are registered host memory, and the same
// bits over a prompt and 8 decode steps.
TEST(CudaModelFusions, PinnedLogitsAreTheSame) {
  XPERT_REQUIRE_GPU();
  const TempFile tmp("cuda_pin_logits.gguf");
  synth_write({.preset = "tiny-qwen3moe", .type = "Q4_K_M", .output = tmp.path, .seed = 7, .progress = {}});
  auto on = Model::load(tmp.path);
  auto off = Model::load(tmp.path);
  on->offload(make_cuda_backend(0), on->config().n_layer);
  setenv("XPERT_PIN_LOGITS", "0", 1);
  off->offload(make_cuda_backend(0), off->config().n_layer);
  unsetenv("XPERT_PIN_LOGITS");
  Session a(*on, {.n_ctx = 256, .n_threads = 2}), b(*off, {.n_ctx = 256, .n_threads = 2});
  const int64_t V = on->config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));
  const std::vector<float>& la = a.eval(prompt);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, la.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "the session's logits are not registered";
  const std::vector<float>& lb = b.eval(prompt);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, lb.data()), cudaSuccess);
  EXPECT_NE(attr.type, cudaMemoryTypeHost) << "XPERT_PIN_LOGITS=0 registered the logits";
  EXPECT_EQ(la, lb);
  for (int i = 0; i < 8; ++i) {
    const int32_t t = (int32_t)((i * 104729 + 7) % V);
    const std::vector<float>& sa = a.eval(std::span<const int32_t>(&t, 1));
    EXPECT_EQ(sa, b.eval(std::span<const int32_t>(&t, 1))) << "step " << i;
  }
}

// Decode steps whose keys are few (here every step: under 512 positions) record the attention as a block
// per KV head combining its warps itself (the default) against the split attention and its combine launch
// (XPERT_ATTN_ONE_BLOCK=0), with and without Qwen3.5's gate: another summation order, so each step's
// logits within kLogitTol while greedy agrees; the prefill does not take it (the same bits).
TEST(CudaModelFusions, OneBlockAttentionMatchesSplit) {
  XPERT_REQUIRE_GPU();
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
    const TempFile tmp("cuda_one_block.gguf");
    synth_write({.preset = preset, .type = "Q4_K_M", .output = tmp.path, .seed = 7, .progress = {}});
    const auto [a, b] = with_and_without("XPERT_ATTN_ONE_BLOCK", tmp.path, 20, 24, 1024);
    expect_steps_close(a, b, 20, std::string(preset) + " Q4_K_M, one-block attention vs split");
  }
}

// Heterogeneous experts: every layer on the GPU, but only some experts there (none, every other one, all
// but one); the rest run on the host's threads over the mmap. Compared with the same model wholly on the
// GPU (the split changes only which device computes an expert and the order of the final sum), same
// tolerance. The synth tiny-qwen3moe (Q4_K_M, rows of 256) has expert types the fused GPU kernels take.
// Modes: the host computes every host expert (from a host node: decode steps are graphs); a step copies
// half its host experts to the GPU while the host computes the rest (--stream-share 0.5); batches of 2
// tokens or more copy every host expert they use (--stream-experts 2), so the prefill runs the same
// kernels over the same experts as the reference: the same bits.
// auto_share: as shared, with the share balanced from measured rates (the default, --stream-share auto).
enum class SplitMode { host, shared, auto_share, streamed };
void set_streaming(Backend& dev, SplitMode mode) {
  dev.set_expert_streaming(mode == SplitMode::streamed ? 2 : 0,
                           mode == SplitMode::shared ? 0.5 : mode == SplitMode::auto_share ? -1 : 0.0);
}
const char* mode_name(SplitMode mode) {
  return mode == SplitMode::streamed ? " streamed" : mode == SplitMode::shared ? " shared"
         : mode == SplitMode::auto_share ? " auto share" : "";
}
class CudaSplitExperts : public ::testing::TestWithParam<std::tuple<int, SplitMode>> {};

void split_matches_cpu(const char* preset, int split, SplitMode mode) {
  const bool streamed = mode == SplitMode::streamed;
  const TempFile tmp("cuda_split_tiny.gguf");
  const std::string& file = tmp.path;
  synth_write({.preset = preset, .type = "Q4_K_M", .output = file, .seed = 7, .progress = {}});
  auto cpu = Model::load(file);  // the reference: every expert on the GPU
  auto gpu = Model::load(file);
  const ModelConfig& c = gpu->config();
  cpu->offload(make_cuda_backend(0), c.n_layer);
  std::vector<std::vector<bool>> masks(c.n_layer, std::vector<bool>(c.n_expert));
  for (auto& m : masks)
    for (int64_t e = 0; e < c.n_expert; ++e)
      m[e] = split == 0 ? false : split == 1 ? e % 2 == 0 : e != 3;
  std::shared_ptr<Backend> dev = make_cuda_backend(0);
  set_streaming(*dev, mode);
  gpu->offload(std::move(dev), c.n_layer, &masks);
  const int64_t V = c.n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));
  ThreadPool pool(2);
  const Outputs a = run(*cpu, prompt, 24, pool), b = run(*gpu, prompt, 24, pool);
  const float scale = max_abs(a.prefill);
  float worst = 0;
  for (size_t i = 0; i < a.prefill.size(); ++i) worst = std::max(worst, std::fabs(a.prefill[i] - b.prefill[i]));
  if (streamed) {
    EXPECT_EQ(worst, 0.0f) << "a streamed prefill runs the reference's kernels";
  }
  // Host experts use the CPU's kernels (Q8_K activations where the GPU quantizes to q8_1): the split may
  // be as far from the GPU as the whole model on the CPU is, on this random-weight model.
  auto host = Model::load(file);
  const Outputs h = run(*host, prompt, 0, pool);
  float cpu_gap = 0;
  for (size_t i = 0; i < a.prefill.size(); ++i) cpu_gap = std::max(cpu_gap, std::fabs(a.prefill[i] - h.prefill[i]));
  EXPECT_LT(worst, std::max(kLogitTol * scale, cpu_gap)) << "the CPU alone differs by " << cpu_gap / scale;
  const size_t agree = greedy_agreement(a, b, V);
  std::printf(
      "%s, split %d%s: prefill max|d|/max|logit| %.2e (CPU alone %.2e), greedy agrees on %zu of %zu tokens\n",
      preset, split, mode_name(mode), worst / scale, cpu_gap / scale, agree, a.tokens.size());
}

TEST_P(CudaSplitExperts, MatchesCpu) {
  XPERT_REQUIRE_GPU();
  const auto [split, mode] = GetParam();
  split_matches_cpu("tiny-qwen3moe", split, mode);
}

// tiny-qwen35moe's Q4_K_M has Q6_K down experts (layers 2 and 3, llama.cpp's rules), which the device
// stores field by field (weight_layout.h): the streamed host experts are converted on the device as they
// arrive, so the streamed prefill is still the all-GPU model's bits.
TEST(CudaSplitExpertsQ6K, StreamedMatchesAllGpu) {
  XPERT_REQUIRE_GPU();
  split_matches_cpu("tiny-qwen35moe", 1, SplitMode::streamed);
}

// Rebalancing while serving (Model::move_experts, issue #8): experts move between two greedy steps of a
// split model (after 8 steps, so decode graphs were recorded with the old placement); the tokens still
// follow the all-GPU model as in MatchesCpu. Then the moved model and one split the new way from the
// start run a fresh prompt: the same placement, the same kernels, so the same bits, which fails if a
// pointer table, a host node's mask or a graph of the old placement survived the move.
TEST_P(CudaSplitExperts, MovingExpertsKeepsOutput) {
  XPERT_REQUIRE_GPU();
  const auto [split, mode] = GetParam();
  if (split == 0) GTEST_SKIP() << "no resident expert to move";
  // The auto share picks how many host experts a step copies from measured times, so two models can send
  // an expert to different sides (CPU vs GPU arithmetic) and differ in the last bits; bit identity is
  // checked in the fixed-share modes, and MatchesCpu bounds the auto share's output.
  if (mode == SplitMode::auto_share) GTEST_SKIP() << "the auto share is not bit-reproducible between two models";
  const TempFile tmp("cuda_move_tiny.gguf");
  const std::string& file = tmp.path;
  synth_write({.preset = "tiny-qwen3moe", .type = "Q4_K_M", .output = file, .seed = 7, .progress = {}});
  auto all = Model::load(file);
  const ModelConfig& c = all->config();
  all->offload(make_cuda_backend(0), c.n_layer);
  // Before: every other expert (split 1) or all but expert 3 (split 2). The moves: expert 0 -> 3 (and
  // 2 -> 1 with split 1), in every layer.
  std::vector<std::vector<bool>> before(c.n_layer, std::vector<bool>(c.n_expert)), after;
  std::vector<ExpertMove> moves;
  for (int64_t il = 0; il < c.n_layer; ++il) {
    for (int64_t e = 0; e < c.n_expert; ++e) before[il][e] = split == 1 ? e % 2 == 0 : e != 3;
    moves.push_back({.layer = il, .evict = 0, .admit = 3});
    if (split == 1) moves.push_back({.layer = il, .evict = 2, .admit = 1});
  }
  after = before;
  for (const ExpertMove& m : moves) after[m.layer][m.evict] = false, after[m.layer][m.admit] = true;
  auto split_model = [&](const std::vector<std::vector<bool>>& masks) {
    auto m = Model::load(file);
    std::shared_ptr<Backend> dev = make_cuda_backend(0);
    set_streaming(*dev, mode);
    m->offload(std::move(dev), c.n_layer, &masks);
    return m;
  };
  auto moved = split_model(before), fresh = split_model(after);
  const int64_t V = c.n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));
  ThreadPool pool(2);
  const Outputs a = run(*all, prompt, 24, pool);

  // The moved model, by hand: prefill, 8 greedy steps, the moves, 16 more.
  Outputs b;
  {
    KvCache kv(c, 128, 1, moved->layer_devices());
    moved->forward({.tokens = prompt, .pos0 = 0, .cache = &kv, .seq = 0, .all_logits = true}, b.prefill, pool);
    int32_t next = argmax(b.prefill.data() + (prompt.size() - 1) * V, V);
    int32_t pos = (int32_t)prompt.size();
    std::vector<float> logits;
    for (int i = 0; i < 24; ++i) {
      if (i == 8) {
        const size_t bytes = moved->move_experts(moves);
        EXPECT_GT(bytes, 0u);
        for (int64_t il = 0; il < c.n_layer; ++il) EXPECT_EQ(moved->expert_split(il)->on_device, after[il]);
      }
      b.tokens.push_back(next);
      const int32_t tok[1] = {next};
      moved->forward({.tokens = tok, .pos0 = pos++, .cache = &kv, .seq = 0, .all_logits = false}, logits, pool);
      b.step_logits.push_back(logits);
      next = argmax(logits.data(), V);
    }
  }
  const size_t agree = greedy_agreement(a, b, V);
  // Fresh prompts through the moved model and the one placed that way from the start: the same bits.
  std::vector<int32_t> prompt2;
  for (int i = 0; i < 12; ++i) prompt2.push_back((int32_t)((i * 4241 + 5) % V));
  const Outputs m2 = run(*moved, prompt2, 12, pool), f2 = run(*fresh, prompt2, 12, pool);
  EXPECT_EQ(m2.prefill, f2.prefill);
  EXPECT_EQ(m2.tokens, f2.tokens);
  EXPECT_EQ(m2.step_logits, f2.step_logits);
  std::printf("%s, split %d%s, %zu moves after 8 steps: greedy agrees with all-GPU on %zu of %zu tokens\n",
              file.c_str(), split, mode_name(mode),
              moves.size(), agree, a.tokens.size());
}

INSTANTIATE_TEST_SUITE_P(Splits, CudaSplitExperts,
                         ::testing::Combine(::testing::Values(0, 1, 2),
                                            ::testing::Values(SplitMode::host, SplitMode::shared, SplitMode::auto_share,
                                                              SplitMode::streamed)));

// Quantized KV cache (issue #10): synth tiny models (head_dim 64, so the flash prefill and the split-K
// decode kernels run, decode steps as graphs) with every layer on the GPU and q8_0 / q4_0 (and mixed) caches,
// against the CPU with the same cache types; same tolerances as the f16 runs. F16 weights: with Q8_0 ones the
// two sides already differ by 4.7e-2 (tiny-qwen35) and 0.39 (tiny-qwen3moe) with an f16 cache (int8 vs f16
// activations on random weights), which would hide the cache. Measured on the H200 (f16 / q8_0 / q4_0 caches):
// tiny-qwen35 9.1e-4 / 1.6e-3 / 4.9e-3; tiny-qwen3moe f16 8.7e-4, K q8_0 V f16 1.4e-3, K q4_0 V q8_0 8.2e-3;
// greedy 24 of 24 everywhere. (With F32 weights one MoE case jumps to 0.77 while the others stay below
// 1e-2: a router near-tie that the last bits of attention flip.)
class CudaQuantizedKv : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(CudaQuantizedKv, MatchesCpu) {
  XPERT_REQUIRE_GPU();
  const auto& [preset, kt, vt] = GetParam();
  const TempFile tmp("cuda_kv_" + preset + ".gguf");
  const std::string& file = tmp.path;
  synth_write({.preset = preset, .type = "F16", .output = file, .seed = 5, .progress = {}});
  auto cpu = Model::load(file);
  auto gpu = Model::load(file);
  gpu->offload(make_cuda_backend(0), gpu->config().n_layer);
  const KvTypes types{.k = parse_kv_type(kt), .v = parse_kv_type(vt)};
  const int64_t V = cpu->config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back((int32_t)((i * 7919 + 13) % V));  // two row blocks of 64
  ThreadPool pool(2);
  const Outputs a = run(*cpu, prompt, 24, pool, types), b = run(*gpu, prompt, 24, pool, types);
  const float d = prefill_rel_diff(a, b);
  EXPECT_LT(d, kLogitTol);
  const size_t agree = greedy_agreement(a, b, V);
  std::printf("%s K %s V %s: prefill max|d|/max|logit| %.2e, greedy agrees on %zu of %zu tokens\n",
              preset.c_str(), kt.c_str(), vt.c_str(), d, agree, a.tokens.size());
}

INSTANTIATE_TEST_SUITE_P(Types, CudaQuantizedKv,
                         ::testing::Values(std::tuple{"tiny-qwen35", "f16", "f16"},
                                           std::tuple{"tiny-qwen35", "q8_0", "q8_0"},
                                           std::tuple{"tiny-qwen35", "q4_0", "q4_0"},
                                           std::tuple{"tiny-qwen3moe", "f16", "f16"},
                                           std::tuple{"tiny-qwen3moe", "q8_0", "f16"},
                                           std::tuple{"tiny-qwen3moe", "q4_0", "q8_0"}));

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel,
                         ::testing::Combine(::testing::Values("tiny_llama.gguf", "tiny_qwen2.gguf", "tiny_qwen3.gguf",
                                                              "tiny_qwen3moe.gguf", "tiny_qwen35.gguf",
                                                              "tiny_qwen35moe.gguf"),
                                            ::testing::Values(1, 2)));

}  // namespace
}  // namespace xpert
