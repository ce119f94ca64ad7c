#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "model/hf_vocab.h"
#include "model/model.h"
#include "runtime/session.h"
#include "sample/sampler.h"
#include "text/tokenizer.h"
#include "text/utf8_stream.h"

namespace xpert::cli {

Command add_run(CLI::App& app) {
  struct Opts {
    ModelFlags m;
    std::string prompt;
    int64_t n_predict = 128;
    SamplingParams sp;
    bool no_special = false;
  };
  auto o = std::make_shared<Opts>();
  o->m.add(app);
  app.add_option("-p,--prompt", o->prompt, "prompt text")->required();
  app.add_option("-n,--n-predict", o->n_predict, "tokens to generate")->check(CLI::Range((int64_t)0, (int64_t)1 << 24));
  add_sampling_flags(app, o->sp);
  app.add_flag("--no-special", o->no_special, "treat special-token text in the prompt as plain text");
  return [o] {
    auto model = load_model(o->m);
    prefetch_weights(model->file());
    auto tok = Tokenizer::from_gguf(model->file());
    Session s(*model, {.n_ctx = o->m.ctx, .n_threads = o->m.threads, .n_batch = o->m.batch,
                       .cache_types = o->m.cache_types()});
    std::vector<int32_t> prompt = tok->encode(o->prompt, tok->add_bos(), !o->no_special);
    if (prompt.empty()) fail("the prompt is empty after tokenization");
    if ((int64_t)prompt.size() >= s.n_ctx()) fail("the prompt has {} tokens; the context (-c) holds {}", prompt.size(), s.n_ctx());
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<float>* logits = &s.eval(prompt);
    const auto t1 = std::chrono::steady_clock::now();
    Sampler sampler(o->sp);
    for (int32_t t : prompt) sampler.accept(t);
    Utf8Stream out(*tok);
    int64_t n_gen = 0;
    for (; n_gen < o->n_predict && s.n_past() < s.n_ctx(); ++n_gen) {
      const int32_t id = sampler.sample(*logits);
      if (tok->is_eog(id)) break;
      sampler.accept(id);
      const std::string text = out.push(id);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      if (n_gen + 1 < o->n_predict) logits = &s.eval(std::span<const int32_t>(&id, 1));
    }
    const std::string rest = out.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    const auto t2 = std::chrono::steady_clock::now();
    const double pp = std::chrono::duration<double>(t1 - t0).count(), tg = std::chrono::duration<double>(t2 - t1).count();
    log::info("prompt {} tokens in {:.3f} s ({:.1f} t/s), generated {} tokens in {:.3f} s ({:.1f} t/s)", prompt.size(), pp,
              prompt.size() / pp, n_gen, tg, n_gen / std::max(tg, 1e-9));
    return 0;
  };
}

Command add_tokenize(CLI::App& app) {
  struct Opts {
    std::string model, prompt;
    bool no_bos = false, no_special = false, pieces = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model file (GGUF)")->required();
  app.add_option("-p,--prompt", o->prompt, "text")->required();
  app.add_flag("--no-bos", o->no_bos, "do not add the BOS token");
  app.add_flag("--no-special", o->no_special, "treat special-token text as plain text");
  app.add_flag("--pieces", o->pieces, "print [id, piece] pairs");
  return [o] {
    // A Hugging Face folder: only its tokenizer files are read, not the weights.
    auto file = std::filesystem::is_directory(o->model) ? hf::open_tokenizer_only(o->model)
                                                        : gguf::GGUFFile::open(o->model);
    auto tok = Tokenizer::from_gguf(*file);
    const std::vector<int32_t> ids = tok->encode(o->prompt, tok->add_bos() && !o->no_bos, !o->no_special);
    nlohmann::json j = nlohmann::json::array();
    for (int32_t id : ids) {
      if (o->pieces) j.push_back(nlohmann::json::array({id, tok->token_to_piece(id, true)}));
      else j.push_back(id);
    }
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  };
}

}  // namespace xpert::cli
