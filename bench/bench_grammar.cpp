// What constrained decoding costs: decode tokens/s of one sequence with free sampling and under a JSON
// grammar (json_object and a schema), on a real model, and the uncached mask walk over its vocabulary.
//
//   ./build/bench/bench_grammar MODEL [tokens=128] [threads=0] [temperature=0.8]
//
// Each run decodes `tokens` tokens after the same prompt; under a grammar a new object starts whenever the
// last one is complete, so every step is constrained. "sampling" is the time in the sampler (and the
// grammar) per token; the forward pass is the rest.
#include <fmt/format.h>

#include <chrono>
#include <string>

#include "model/model.h"
#include "runtime/session.h"
#include "sample/constrained.h"
#include "sample/json_schema.h"
#include "text/tokenizer.h"

using namespace xpert;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Result {
  double tokens_per_s = 0, sample_ms = 0, forward_ms = 0;
  int64_t masked = 0, draws = 0, objects = 0;
};

Result run(const Model& model, const Tokenizer& tok, const TokenTrie& trie, const std::vector<int32_t>& prompt,
           int n_tokens, int threads, float temp, std::shared_ptr<const Grammar> grammar) {
  Session s(model, {.n_ctx = (int64_t)prompt.size() + n_tokens + 8, .n_threads = threads, .n_batch = 512});
  SamplingParams sp;
  sp.temperature = temp;
  sp.seed = 42;
  Sampler sampler(sp);
  std::unique_ptr<GrammarSampler> gs;
  if (grammar) gs = std::make_unique<GrammarSampler>(grammar, trie, tok.eog_ids());
  Result r;
  const std::vector<float>* logits = &s.eval(prompt);
  double sample_s = 0, forward_s = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < n_tokens; ++i) {
    const auto a = Clock::now();
    int32_t id = gs ? gs->sample(sampler, *logits) : sampler.sample(*logits);
    if (gs && (id < 0 || tok.is_eog(id) || gs->finished())) {
      r.masked += gs->n_masked();
      r.draws += gs->n_draws();
      ++r.objects;
      gs = std::make_unique<GrammarSampler>(grammar, trie, tok.eog_ids());  // the next object
      if (id < 0 || tok.is_eog(id)) id = gs->sample(sampler, *logits);
    }
    sampler.accept(id);
    const auto b = Clock::now();
    sample_s += seconds(a, b);
    logits = &s.eval(std::span<const int32_t>(&id, 1));
    forward_s += seconds(b, Clock::now());
  }
  const double total = seconds(t0, Clock::now());
  if (gs) r.masked += gs->n_masked(), r.draws += gs->n_draws();
  r.tokens_per_s = n_tokens / total;
  r.sample_ms = 1e3 * sample_s / n_tokens;
  r.forward_ms = 1e3 * forward_s / n_tokens;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_grammar MODEL [tokens=128] [threads=0] [temperature=0.8]\n");
    return 2;
  }
  const int n_tokens = argc > 2 ? std::stoi(argv[2]) : 128;
  const int threads = argc > 3 ? std::stoi(argv[3]) : 0;
  const float temp = argc > 4 ? std::stof(argv[4]) : 0.8f;
  auto model = Model::load(argv[1]);
  auto tok = Tokenizer::from_gguf(model->file());

  auto t0 = Clock::now();
  std::vector<std::string> pieces((size_t)tok->n_vocab());
  for (int32_t id = 0; id < tok->n_vocab(); ++id) pieces[id] = tok->token_to_piece(id, false);
  const TokenTrie trie(pieces);
  fmt::print("vocabulary: {} tokens, trie of {} nodes built in {:.0f} ms\n", tok->n_vocab(), trie.nodes().size(),
             1e3 * seconds(t0, Clock::now()));

  const auto json_object = Grammar::parse(json_object_gbnf());
  const auto schema = Grammar::parse(json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({
    "type": "object", "properties": {
      "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "email": {"type": "string", "format": "email"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "tags"], "additionalProperties": false})")));

  // The walk over the whole vocabulary for a state seen for the first time (the cache is per matcher).
  for (auto [label, text] : {std::pair{"object start", ""}, std::pair{"inside a string", "{\"key\": \"va"}}) {
    const int reps = 5;
    double ms = 0;
    int allowed = 0;
    for (int i = 0; i < reps; ++i) {
      GrammarMatcher m(json_object);
      if (*text) m.accept(text);
      const auto a = Clock::now();
      const auto& mask = m.allowed_tokens(trie);
      ms += 1e3 * seconds(a, Clock::now());
      allowed = 0;
      for (uint32_t w : mask) allowed += __builtin_popcount(w);
    }
    fmt::print("mask walk, json_object, {}: {:.2f} ms ({} tokens allowed)\n", label, ms / reps, allowed);
  }

  const std::vector<int32_t> prompt = tok->encode(
      "Here is a JSON object that describes a user of our site, with name, age, email and tags:\n", tok->add_bos(),
      false);
  fmt::print("decode {} tokens after a {}-token prompt, {} threads, temperature {}; best of 3 interleaved rounds\n",
             n_tokens, prompt.size(), threads, temp);
  const std::vector<std::pair<std::string, std::shared_ptr<const Grammar>>> modes = {
      {"free", nullptr}, {"json schema", schema}, {"json_object", json_object}, {"free again", nullptr}};
  std::vector<Result> best(modes.size());
  for (int round = 0; round < 3; ++round)
    for (size_t k = 0; k < modes.size(); ++k) {
      const Result r = run(*model, *tok, trie, prompt, n_tokens, threads, temp, modes[k].second);
      if (r.tokens_per_s > best[k].tokens_per_s) best[k] = r;
    }
  for (size_t k = 0; k < modes.size(); ++k) {
    const Result& r = best[k];
    // The grammar's own cost: the extra sampling time against a whole step of the free run.
    const double step_ms = 1e3 / best[0].tokens_per_s;
    fmt::print("  {:12} {:7.2f} tokens/s  {:+6.1f} %   forward {:.2f} ms/token   sampling {:.3f} ms/token ({:+.2f} % of a free step)",
               modes[k].first + ":", r.tokens_per_s, 100.0 * (r.tokens_per_s / best[0].tokens_per_s - 1), r.forward_ms, r.sample_ms,
               100.0 * (r.sample_ms - best[0].sample_ms) / step_ms);
    if (modes[k].second) fmt::print("   {} of {} draws masked, {} objects done", r.masked, r.draws, r.objects);
    fmt::print("\n");
  }
  return 0;
}
