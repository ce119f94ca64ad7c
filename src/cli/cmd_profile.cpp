// `xpert profile`: runs prompts through a MoE model on the CPU with greedy generation, counts how often
// each layer's router picks each expert (runtime/experts/routing_stats.h), and writes the profile that places the
// most routed experts on the GPU (--num-gpu-experts / --gpu-expert-budget).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "runtime/experts/plan.h"
#include "runtime/experts/routing_stats.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"
#include "text/builtin_templates.h"
#include "text/tokenizer.h"

namespace xpert::cli {
namespace {

// A small mixed set: what routing looks like depends on the text (code, math, languages, chat).
const std::vector<std::string>& builtin_prompts() {
  static const std::vector<std::string> p = {
      "Explain in three sentences why the sky is blue.",
      "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test.",
      "Solve for x: 3x + 7 = 22. Show each step.",
      "Translate into French and German: 'The meeting is moved to Thursday afternoon.'",
      "用三句话介绍一下长城的历史。",
      "Write a short poem about autumn rain in a city.",
      "What are the differences between TCP and UDP? Answer as a list.",
      "Summarize the plot of Romeo and Juliet in one paragraph.",
      "Write a SQL query that returns the ten customers with the highest total order value.",
      "A train leaves at 14:35 and arrives at 18:10. How long is the journey?",
      "Give me three tips for writing clear error messages in a command-line tool.",
      "Explique brièvement ce qu'est la photosynthèse.",
      "Write a C++ function that reverses a singly linked list in place.",
      "What is the derivative of x^3 * sin(x)?",
      "Draft a polite email declining a meeting invitation.",
      "List five uses of a hash map and the operation each relies on.",
  };
  return p;
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("cannot read the prompts file {}", path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) out.push_back(line);
  }
  if (out.empty()) fail("{} holds no prompts (one per line)", path);
  return out;
}

int32_t argmax(const std::vector<float>& logits) {
  return (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The profile's report: how skewed routing is, and what placing by it is worth over index order.
void print_report(const RoutingStats& s) {
  const int64_t L = s.n_layer(), E = s.n_expert();
  const int64_t quarter = std::max<int64_t>(1, E / 4);
  double sum = 0, lo = 1, hi = 0;
  int64_t lo_l = 0, hi_l = 0, n = 0;
  for (int64_t il = 0; il < L; ++il) {
    if (s.layer_total(il) == 0) continue;
    const double sh = s.top_share(il, quarter);
    sum += sh;
    ++n;
    if (sh < lo) lo = sh, lo_l = il;
    if (sh > hi) hi = sh, hi_l = il;
  }
  if (n == 0) return;
  fmt::print(
      "routing skew: the top 25 % of experts ({} of {}) take {:.1f} % of routings on average "
      "({:.1f} % if uniform); least skewed layer {} ({:.1f} %), most skewed layer {} ({:.1f} %)\n",
      quarter, E, 100.0 * sum / n, 100.0 * quarter / E, lo_l, 100.0 * lo, hi_l, 100.0 * hi);
  fmt::print("share of routings served by GPU experts, chosen by frequency vs by index (on this profile):\n");
  for (int pct : {25, 50, 75}) {
    const int64_t g = std::max<int64_t>(1, E * pct / 100);
    double freq = 0, index = 0;
    for (int64_t il = 0; il < L; ++il) {
      const uint64_t total = s.layer_total(il);
      if (total == 0) continue;
      freq += s.top_share(il, g);
      uint64_t first = 0;
      for (int64_t e = 0; e < g; ++e) first += s.count(il, e);
      index += (double)first / (double)total;
    }
    fmt::print("  --num-gpu-experts {:>4} ({:>2} %): {:5.1f} % vs {:5.1f} %\n", g, pct, 100.0 * freq / n,
               100.0 * index / n);
  }
  const int64_t top = std::min<int64_t>(8, E);
  fmt::print("top {} experts per layer (share of the layer's routings):\n", top);
  for (int64_t il = 0; il < L; ++il) {
    const uint64_t total = s.layer_total(il);
    if (total == 0) continue;
    const std::vector<int32_t> r = s.ranked(il);
    std::string line = fmt::format("  {:>3}:", il);
    for (int64_t i = 0; i < top; ++i)
      line += fmt::format(" {:>4} {:4.1f}%", r[i], 100.0 * (double)s.count(il, r[i]) / (double)total);
    fmt::print("{}\n", line);
  }
}

}  // namespace

Command add_profile(CLI::App& app) {
  struct Opts {
    std::string model, prompts, output;
    int64_t n_predict = 64, ctx = 4096, batch = 512;
    int threads = 0;
    bool raw = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model file (GGUF) or Hugging Face folder")->required();
  app.add_option("--prompts", o->prompts, "prompts, one per line (default: a built-in mixed set of 16)");
  app.add_option("-o,--output", o->output, "profile to write (default: MODEL.xpert-profile.json)");
  app.add_option("-n,--n-predict", o->n_predict, "tokens generated greedily per prompt")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  app.add_option("-t,--threads", o->threads, "CPU threads (default: physical cores)")
      ->check(CLI::Range(0, 1024));
  app.add_option("-c,--ctx-size", o->ctx, "context per prompt in tokens")
      ->check(CLI::Range((int64_t)16, (int64_t)1 << 24));
  app.add_option("-b,--batch-size", o->batch, "prompt tokens evaluated per step")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 16));
  app.add_flag("--raw", o->raw,
               "feed the prompts as they are (default: as a user message through the chat template)");
  return [o] {
    // On the CPU: the CPU MoE is what counts routings.
    auto model = Model::load(o->model, {.native_gptq_experts = true});
    const ModelConfig& c = model->config();
    if (c.n_expert <= 0) fail("{} ({}) has no routed experts: nothing to profile", o->model, c.arch);
    const std::vector<std::string> texts = o->prompts.empty() ? builtin_prompts() : read_prompts(o->prompts);
    const std::string out = o->output.empty() ? RoutingStats::default_path(o->model) : o->output;
    auto tok = Tokenizer::from_gguf(model->file());
    std::unique_ptr<ChatTemplate> tmpl;
    if (!o->raw) tmpl = std::make_unique<ChatTemplate>(chat_template_for(model->file()));

    ThreadPool pool(o->threads > 0 ? o->threads : ThreadPool::default_threads());
    KvCache cache(c, o->ctx, 1);
    std::unique_ptr<RecurrentState> state;
    if (c.has_recurrent_layers()) state = std::make_unique<RecurrentState>(c, 1);
    RoutingStats stats(*model);
    std::vector<float> logits;
    int64_t n_prompt = 0, n_gen = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids;
      if (tmpl) {
        const std::string text =
            tmpl->render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", texts[i]}}}));
        bool bos = tok->add_bos();
        if (bos && tok->bos() != kNoToken && text.starts_with(tok->token_text(tok->bos()))) bos = false;
        ids = tok->encode(text, bos, true);
      } else {
        ids = tok->encode(texts[i], tok->add_bos(), false);
      }
      if (ids.empty()) continue;
      if ((int64_t)ids.size() >= o->ctx) {
        log::warn("prompt {} has {} tokens, more than -c {}: cut", i + 1, ids.size(), o->ctx);
        ids.resize(o->ctx - 1);
      }
      if (state) state->reset();
      int64_t pos = 0;
      auto eval = [&](std::span<const int32_t> t) {
        const ForwardArgs a{.tokens = t,
                            .pos0 = (int32_t)pos,
                            .cache = &cache,
                            .seq = 0,
                            .all_logits = false,
                            .segments = {},
                            .state = state.get(),
                            .routing_stats = &stats};
        model->forward(a, logits, pool);
        pos += (int64_t)t.size();
      };
      for (size_t b = 0; b < ids.size(); b += (size_t)o->batch)
        eval(std::span<const int32_t>(ids).subspan(b, std::min<size_t>((size_t)o->batch, ids.size() - b)));
      n_prompt += (int64_t)ids.size();
      for (int64_t g = 0; g < o->n_predict && pos < o->ctx; ++g) {
        const int32_t id = argmax(logits);
        if (tok->is_eog(id)) break;
        eval(std::span<const int32_t>(&id, 1));
        ++n_gen;
      }
      log::info("prompt {}/{}: {} tokens + {} generated", i + 1, texts.size(), ids.size(),
                pos - (int64_t)ids.size());
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats.save(out, ModelIdentity::of(*model));
    fmt::print("profile: {} prompts, {} tokens ({} prompt + {} generated) in {:.1f} s -> {}\n", texts.size(),
               n_prompt + n_gen, n_prompt, n_gen, secs, out);
    print_report(stats);
    return 0;
  };
}

}  // namespace xpert::cli
