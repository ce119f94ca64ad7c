// `xpert chat`: a multi-turn conversation in the terminal, and `xpert template`: a rendered prompt.
//
// Each turn re-renders the whole conversation with the model's chat template and tokenizes it; the
// tokens already in the KV cache that the new prompt starts with are kept and only the rest is
// evaluated. Usually that is everything after the previous reply; when the template renders the
// reply differently from the tokens generated, the cache is cut back to the common prefix
// (Session::truncate). A recurrent state cannot be cut back, so for hybrid models the session keeps
// checkpoints (at the end of each prompt and every --checkpoint-every tokens) and goes back to the
// nearest one at or below the common prefix.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "model/model.h"
#include "runtime/session.h"
#include "runtime/state_cache.h"
#include "sample/sampler.h"
#include "text/builtin_templates.h"
#include "text/tokenizer.h"
#include "text/utf8_stream.h"

namespace xpert::cli {

namespace {

void write(std::string_view s, FILE* f = stdout) {
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

// The prompt's ids. Templates usually write the BOS text themselves; then no second BOS is added.
std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const std::string& prompt) {
  bool add_bos = tok.add_bos();
  if (add_bos && tok.bos() != kNoToken && prompt.starts_with(tok.token_text(tok.bos()))) add_bos = false;
  return tok.encode(prompt, add_bos, true);
}

}  // namespace

Command add_chat(CLI::App& app) {
  struct Opts {
    ModelFlags m;
    int64_t n_predict = 512;
    SamplingParams sp;
    std::string system;
    int64_t cache_ram_mib = -1;  // -1: default_cache_ram_bytes()
    int64_t checkpoint_every = 1024;
  };
  auto o = std::make_shared<Opts>();
  o->m.add(app);
  app.add_option("-n,--n-predict", o->n_predict, "most tokens per reply")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 24));
  add_sampling_flags(app, o->sp);
  app.add_option("--system", o->system, "system message");
  app.add_option("--cache-ram", o->cache_ram_mib,
                 "hybrid models: MiB of RAM for checkpoints of the recurrent state (0: none; default: 8192, "
                 "or a quarter of RAM when less)")
      ->check(CLI::Range((int64_t)-1, (int64_t)1 << 30));
  app.add_option("--checkpoint-every", o->checkpoint_every,
                 "hybrid models: also checkpoint every N tokens (0: only at the end of each prompt)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 30));
  return [o] {
    const size_t cache_ram = o->cache_ram_mib < 0 ? default_cache_ram_bytes() : (size_t)o->cache_ram_mib << 20;
    auto model = load_model(o->m, {.n_parallel = 1, .cache_ram_bytes = cache_ram, .n_ctx = 0});
    prefetch_weights(model->file());
    auto tok = Tokenizer::from_gguf(model->file());
    const ChatTemplate tmpl = chat_template_for(model->file());
    Session s(*model, {.n_ctx = o->m.ctx,
                       .n_threads = o->m.threads,
                       .n_batch = o->m.batch,
                       .cache_ram_bytes = cache_ram,
                       .checkpoint_every = o->checkpoint_every,
                       .cache_types = o->m.cache_types()});
    Sampler sampler(o->sp);
    const bool interactive = isatty(STDIN_FILENO);

    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
    std::vector<int32_t> evaluated;  // what the KV cache holds, position by position
    int64_t n_reused = 0, n_evaluated = 0;
    std::string line;
    for (;;) {
      if (interactive) write("> ", stderr);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line.empty()) continue;
      messages.push_back({{"role", "user"}, {"content", line}});
      ChatRenderOptions render;
      render.add_generation_prompt = true;
      const std::vector<int32_t> prompt = tokenize_prompt(*tok, tmpl.render(messages, render));
      if ((int64_t)prompt.size() >= s.n_ctx())
        fail("the conversation has {} tokens; the context (-c) holds {}", prompt.size(), s.n_ctx());

      size_t keep = 0;
      while (keep < evaluated.size() && keep < prompt.size() && evaluated[keep] == prompt[keep]) ++keep;
      if (keep == prompt.size()) --keep;  // at least one token to evaluate, for its logits
      if (keep < (size_t)s.n_past()) {
        const size_t kept = (size_t)s.truncate((int64_t)keep);
        if (kept < keep)
          log::debug(
              "chat: the prompt diverges from the cache at token {}; the recurrent state goes back to its "
              "checkpoint at {}",
              keep, kept);
        keep = kept;
      }
      const std::vector<float>* logits = &s.eval(std::span(prompt).subspan(keep));
      s.checkpoint();  // where the next turn's prompt most likely still agrees
      evaluated = prompt;
      n_reused += keep, n_evaluated += prompt.size() - keep;

      Utf8Stream out(*tok);
      std::string reply;
      for (int64_t n = 0; n < o->n_predict && s.n_past() < s.n_ctx(); ++n) {
        const int32_t id = sampler.sample(*logits);
        if (tok->is_eog(id)) break;
        sampler.accept(id);
        const std::string text = out.push(id);
        reply += text;
        write(text);
        logits = &s.eval(std::span<const int32_t>(&id, 1));
        evaluated.push_back(id);
      }
      const std::string rest = out.flush();
      reply += rest;
      write(rest);
      write("\n");
      messages.push_back({{"role", "assistant"}, {"content", reply}});
    }
    log::info("chat: {} prompt tokens reused from the cache, {} evaluated", n_reused, n_evaluated);
    return 0;
  };
}

Command add_template(CLI::App& app) {
  struct Opts {
    std::string model, messages;
    bool add_generation_prompt = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "model file (GGUF)")->required();
  app.add_option("--messages", o->messages,
                 "JSON file: an array of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  app.add_flag("--add-generation-prompt", o->add_generation_prompt, "end with the assistant turn's opening");
  return [o] {
    std::ifstream in(o->messages);
    if (!in) fail("cannot open {}", o->messages);
    std::ostringstream text;
    text << in.rdbuf();
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text.str(), nullptr, false);
    if (j.is_discarded()) fail("{}: not valid JSON", o->messages);
    ChatRenderOptions opts;
    opts.add_generation_prompt = o->add_generation_prompt;
    nlohmann::ordered_json messages = j;
    if (j.is_object()) {
      if (!j.contains("messages")) fail("{}: an object must have \"messages\"", o->messages);
      messages = j["messages"];
      if (j.contains("tools")) opts.tools = j["tools"];
    }
    if (!messages.is_array()) fail("{}: expected an array of messages", o->messages);
    auto file = gguf::GGUFFile::open(o->model);
    const ChatTemplate tmpl = chat_template_for(*file);
    write(tmpl.render(messages, opts));
    return 0;
  };
}

}  // namespace xpert::cli
