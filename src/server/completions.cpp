// POST /v1/chat/completions, /v1/completions (n choices, several prompts, echo, suffix) and /infill
// (llama.cpp's fill-in-the-middle route).
#include <fmt/format.h>

#include "sample/grammar.h"
#include "server/chat_output.h"
#include "server/chat_plan.h"
#include "server/context.h"
#include "server/structured.h"
#include "text/tokenizer.h"
#include "model/model.h"

namespace xpert::server {

namespace {

using namespace fields;

// OpenAI's `bytes` field: the UTF-8 bytes of a token as integers.
ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back((int)c);
  return b;
}

// Logprobs in OpenAI's chat shape ({content: [...]}) or completions shape (parallel arrays).
ojson logprobs_json(bool chat, const std::vector<TokenLogprob>& lps, size_t text_offset0) {
  if (chat) {
    ojson content = ojson::array();
    for (const TokenLogprob& lp : lps) {
      ojson top = ojson::array();
      for (auto& [piece, l] : lp.top) top.push_back({{"token", piece}, {"logprob", l}, {"bytes", bytes_of(piece)}});
      content.push_back(
          {{"token", lp.piece}, {"logprob", lp.logprob}, {"bytes", bytes_of(lp.piece)}, {"top_logprobs", top}});
    }
    return ojson{{"content", content}, {"refusal", nullptr}};
  }
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(), offsets = ojson::array();
  size_t off = text_offset0;
  for (const TokenLogprob& lp : lps) {
    tokens.push_back(lp.piece);
    token_logprobs.push_back(lp.logprob);
    ojson t = ojson::object();
    for (auto& [piece, l] : lp.top) t[piece] = l;
    top.push_back(t);
    offsets.push_back(off);
    off += lp.piece.size();
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// The fill-in-the-middle tokens of a vocabulary: from the GGUF keys llama.cpp writes, else by the
// spellings of the model families that have them (Qwen2.5-Coder, StarCoder, DeepSeek-Coder, CodeLlama).
struct FimTokens {
  int32_t pre = kNoToken, suf = kNoToken, mid = kNoToken;
};

std::optional<FimTokens> fim_tokens(const Model& model, const Tokenizer& tok) {
  FimTokens f;
  const gguf::GGUFFile& file = model.file();
  auto key = [&](const char* a, const char* b) -> int32_t {
    for (const char* k : {a, b})
      if (auto v = file.get_int(k); v && *v >= 0 && *v < tok.n_vocab()) return (int32_t)*v;
    return kNoToken;
  };
  f.pre = key("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id");
  f.suf = key("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id");
  f.mid = key("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id");
  if (f.pre != kNoToken && f.suf != kNoToken && f.mid != kNoToken) return f;
  const char* const spellings[][3] = {{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
                                      {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
                                      {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"},
                                      {"▁<PRE>", "▁<SUF>", "▁<MID>"},
                                      {"<PRE>", "<SUF>", "<MID>"}};
  for (const auto& s : spellings) {
    auto p = tok.find_token(s[0]), q = tok.find_token(s[1]), r = tok.find_token(s[2]);
    if (p && q && r) return FimTokens{*p, *q, *r};
  }
  return std::nullopt;
}

// prefix-suffix-middle: [BOS] <pre> prefix <suf> suffix <mid> [middle start]. The user's text is not
// scanned for special tokens.
// Repository-level context (llama.cpp's /infill input_extra: [{filename, text}]) before the FIM part, in
// Qwen2.5-Coder's layout: <|repo_name|>name\n, then <|file_sep|>filename\ntext per file, then
// <|file_sep|> and the current file's name (unknown here: a placeholder, as llama.cpp writes).
std::vector<int32_t> repo_context(const Context& ctx, const ojson& extra) {
  const Tokenizer& tok = *ctx.m.tokenizer;
  const gguf::GGUFFile& file = ctx.m.model->file();
  auto token = [&](const char* key, const char* spelling) -> std::optional<int32_t> {
    if (auto v = file.get_int(key); v && *v >= 0 && *v < tok.n_vocab()) return (int32_t)*v;
    return tok.find_token(spelling);
  };
  const std::optional<int32_t> repo = token("tokenizer.ggml.fim_rep_token_id", "<|repo_name|>"),
                               sep = token("tokenizer.ggml.fim_sep_token_id", "<|file_sep|>");
  if (!repo || !sep)
    bad("input_extra", fmt::format("'input_extra': this model ({}) has no repository-level tokens (<|repo_name|>, "
                                   "<|file_sep|>); put the context in 'input_prefix'",
                                   ctx.m.id));
  if (!extra.is_array()) bad("input_extra", "'input_extra' must be an array of {\"filename\": ..., \"text\": ...}");
  std::vector<int32_t> out = {*repo};
  auto append = [&](const std::string& s) {
    const std::vector<int32_t> ids = tok.encode(s, false, false);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  append("project\n");
  for (size_t i = 0; i < extra.size(); ++i) {
    const ojson& chunk = extra[i];
    const std::string at = fmt::format("input_extra[{}]", i);
    if (!chunk.is_object() || !chunk.contains("text") || !chunk["text"].is_string())
      bad(at, fmt::format("'{}' must be an object with a string 'text' (and a 'filename')", at));
    if (chunk.contains("filename") && !chunk["filename"].is_string())
      bad(at + ".filename", fmt::format("'{}.filename' must be a string", at));
    out.push_back(*sep);
    append(chunk.value("filename", "") + "\n" + chunk["text"].get<std::string>());
  }
  out.push_back(*sep);
  append("filename\n");
  return out;
}

std::vector<int32_t> fim_prompt(const Context& ctx, const std::string& prefix, const std::string& suffix,
                                const std::string& middle, const std::string& param, const ojson* extra) {
  const Tokenizer& tok = *ctx.m.tokenizer;
  // Repository context first: a model without its tokens is a 400 naming input_extra.
  const std::vector<int32_t> repo = extra ? repo_context(ctx, *extra) : std::vector<int32_t>{};
  const std::optional<FimTokens> f = fim_tokens(*ctx.m.model, tok);
  if (!f)
    throw ApiError(400,
                   fmt::format("'{}': this model ({}) has no fill-in-the-middle tokens; use a code model that "
                               "has them (e.g. Qwen2.5-Coder)",
                               param, ctx.m.id),
                   param);
  std::vector<int32_t> out;
  if (tok.add_bos() && tok.bos() != kNoToken) out.push_back(tok.bos());
  out.insert(out.end(), repo.begin(), repo.end());
  auto append = [&](const std::string& s) {
    const std::vector<int32_t> ids = tok.encode(s, false, false);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  out.push_back(f->pre);
  append(prefix);
  out.push_back(f->suf);
  append(suffix);
  out.push_back(f->mid);
  append(middle);
  return out;
}

struct Choice {
  size_t prompt = 0;       // which prompt
  std::string echo;        // text put before the generated text
  ojson echo_logprobs;     // echo with logprobs: the prompt's, in completions' shape (else null)
};

// The prompt's logprobs as OpenAI echoes them: the first token has none (null).
ojson prompt_logprobs_json(const std::vector<TokenLogprob>& lps) {
  ojson j = logprobs_json(false, lps, 0);
  if (!lps.empty()) {
    j["token_logprobs"][0] = nullptr;
    j["top_logprobs"][0] = nullptr;
  }
  return j;
}

// a's arrays followed by b's (completions' shape).
ojson join_logprobs(ojson a, const ojson& b) {
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const ojson& v : b[k]) a[k].push_back(v);
  return a;
}

void chat_or_completion(Context& ctx, const httplib::Request& req, httplib::Response& res, bool chat) {
  CompletionRequest r = parse_completion_request(req.body, chat);
  const std::string model_name = ctx.model_name(r.model);
  const char* param = chat ? "messages" : "prompt";

  // The prompts' tokens; for echo, the text each choice starts with.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echoes;
  ChatPlan plan;
  if (chat) {
    plan = plan_chat(ctx, r, random_id("call_") + "_");
    prompts.push_back(ctx.tokenize(plan.prompt));
    // A thinking model's reasoning is free; response_format / grammar constrain the answer after it.
    if (r.gen.grammar && plan.output.in_reasoning) r.gen.grammar_after = "</think>";
    if (!plan.grammar.empty()) {
      if (r.gen.grammar)
        throw ApiError(400, "'tool_choice' forces a tool call, and another field (response_format, grammar or "
                            "json_schema) constrains the answer too; send one of them",
                       "tool_choice");
      r.gen.grammar = Grammar::parse(plan.grammar);
    }
  } else {
    for (Prompt& p : r.prompts) {
      if (r.suffix) {
        if (p.is_tokens)
          throw ApiError(400, "'suffix' needs a text prompt (the prefix), not token ids", "prompt");
        prompts.push_back(fim_prompt(ctx, p.text, *r.suffix, "", "suffix", nullptr));
      } else {
        prompts.push_back(p.is_tokens ? std::move(p.tokens) : ctx.tokenize(p.text));
      }
      if (r.echo) echoes.push_back(p.is_tokens ? ctx.m.tokenizer->decode(prompts.back(), false) : p.text);
    }
  }
  for (const auto& p : prompts) ctx.check_prompt_fits(p, param);
  check_logit_bias(r.gen, ctx.m.tokenizer->n_vocab());
  // echo with logprobs: each prompt token's logprob after the ones before it, before any job starts.
  std::vector<ojson> echo_logprobs(prompts.size());
  if (!chat && r.echo && r.logprobs) {
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      try {
        echo_logprobs[pi] = prompt_logprobs_json(ctx.m.engine->prompt_logprobs(prompts[pi], r.gen.top_logprobs));
      } catch (const Error& e) {
        throw ApiError(400, fmt::format("'{}': {}", param, e.what()), param);
      }
    }
  }

  // One job per choice: prompt-major, as OpenAI numbers them (index = prompt * n + i).
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<Choice> choices;
  int64_t n_prompt_tokens = 0;
  try {
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      n_prompt_tokens += (int64_t)prompts[pi].size();
      for (int i = 0; i < r.n; ++i) {
        GenerateParams g = r.gen;
        g.prompt = prompts[pi];
        // Choices of one request differ: each gets its own seed (a fixed seed stays reproducible).
        if (g.sampling.seed != 0xFFFFFFFF) g.sampling.seed += (uint64_t)i;
        jobs.push_back(ctx.submit(std::move(g), res));
        choices.push_back({pi, r.echo ? echoes[pi] : std::string(), echo_logprobs[pi]});
      }
    }
  } catch (...) {
    for (auto& j : jobs) j->cancel();
    throw;
  }

  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  const bool want_logprobs = r.logprobs;
  auto usage = [jobs, n_prompt_tokens] {
    int64_t n_gen = 0, n_cached = 0;
    for (auto& j : jobs) n_gen += j->n_generated();
    for (auto& j : jobs) n_cached = std::max(n_cached, j->n_cached());
    return ojson{{"prompt_tokens", n_prompt_tokens},
                 {"completion_tokens", n_gen},
                 {"total_tokens", n_prompt_tokens + n_gen},
                 {"prompt_tokens_details", ojson{{"cached_tokens", n_cached}}}};
  };

  if (!r.stream) {
    std::vector<Collected> all = collect(ctx, jobs);
    ojson out_choices = ojson::array();
    for (size_t i = 0; i < all.size(); ++i) {
      ojson choice = ojson::object();
      choice["index"] = i;
      bool called = false;
      if (chat) {
        ChatOutputParser parser(plan.output);
        parser.feed(plan.forced);
        parser.feed(all[i].text);
        parser.finish();
        called = !parser.calls().empty();
        choice["message"] = ojson{{"role", "assistant"}};
        choice["message"].update(message_fields(parser.whole(), false));
        choice["message"]["refusal"] = nullptr;
      } else {
        choice["text"] = choices[i].echo + all[i].text;
      }
      ojson lp = want_logprobs ? logprobs_json(chat, all[i].logprobs, choices[i].echo.size()) : ojson(nullptr);
      if (!choices[i].echo_logprobs.is_null()) lp = join_logprobs(choices[i].echo_logprobs, lp);
      choice["logprobs"] = std::move(lp);
      choice["finish_reason"] = called && all[i].finish == Finish::stop ? "tool_calls" : finish_name(all[i].finish);
      out_choices.push_back(choice);
    }
    ojson out = {{"id", id},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", model_name},
                 {"system_fingerprint", "xpert"},
                 {"choices", out_choices},
                 {"usage", usage()}};
    res.set_content(dump(out), "application/json");
    return;
  }

  const bool include_usage = r.include_usage;
  // One reader of the answer per choice (content, reasoning_content, tool_calls).
  std::vector<std::shared_ptr<ChatOutputParser>> parsers;
  for (size_t i = 0; i < choices.size(); ++i) parsers.push_back(std::make_shared<ChatOutputParser>(plan.output));
  const std::string forced = plan.forced;
  stream_sse(res, jobs, [&ctx, jobs, choices, chat, id, created, model_name, include_usage, usage, want_logprobs,
                         parsers, forced](const std::function<bool(const std::string&)>& send) {
    auto chunk = [&](size_t index, ojson delta_or_text, ojson logprobs, ojson finish) {
      ojson choice = ojson::object();
      choice["index"] = index;
      if (chat)
        choice["delta"] = std::move(delta_or_text);
      else
        choice["text"] = std::move(delta_or_text);
      choice["logprobs"] = std::move(logprobs);
      choice["finish_reason"] = std::move(finish);
      ojson c = {{"id", id},
                 {"object", chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", created},
                 {"model", model_name},
                 {"system_fingerprint", "xpert"},
                 {"choices", ojson::array({choice})}};
      if (include_usage) c["usage"] = nullptr;
      return "data: " + dump(c) + "\n\n";
    };
    for (size_t i = 0; i < choices.size(); ++i) {
      if (chat && !send(chunk(i, ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) return;
      if (ChatDelta d = parsers[i]->feed(forced); chat && !d.empty())
        if (!send(chunk(i, message_fields(d, true), nullptr, nullptr))) return;
      if (!chat && !choices[i].echo.empty() && !send(chunk(i, choices[i].echo, choices[i].echo_logprobs, nullptr)))
        return;
    }
    std::vector<size_t> text_offset(choices.size(), 0);
    for (size_t i = 0; i < choices.size(); ++i) text_offset[i] = choices[i].echo.size();
    bool failed = false;
    const bool ok = pump(
        ctx, jobs,
        [&](JobOutput& o) {
          const Job::Update& u = o.update;
          ChatOutputParser& parser = *parsers[o.index];
          if (!u.text.empty() || !u.logprobs.empty()) {
            ChatDelta d;
            if (chat) d = parser.feed(u.text);
            if (!chat || !d.empty() || !u.logprobs.empty()) {
              ojson body = chat ? message_fields(d, true) : ojson(u.text);
              ojson lp = want_logprobs ? logprobs_json(chat, u.logprobs, text_offset[o.index]) : ojson(nullptr);
              if (!send(chunk(o.index, std::move(body), std::move(lp), nullptr))) return false;
            }
            text_offset[o.index] += u.text.size();
          }
          if (u.finish == Finish::error) {
            send("data: " + error_body(500, "generation failed: " + u.error) + "\n\n");
            failed = true;
            return false;
          }
          if (u.finish != Finish::none && u.finish != Finish::cancelled) {
            if (ChatDelta d = parser.finish(); chat && !d.empty())
              if (!send(chunk(o.index, message_fields(d, true), nullptr, nullptr))) return false;
            const bool called = chat && !parser.calls().empty() && u.finish == Finish::stop;
            return send(chunk(o.index, chat ? ojson::object() : ojson(""), nullptr,
                              called ? "tool_calls" : finish_name(u.finish)));
          }
          return true;
        },
        [&] { return send(": keep-alive\n\n"); });
    if (!ok && !failed) return;
    if (!failed && include_usage) {
      ojson c = {{"id", id},
                 {"object", chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", created},
                 {"model", model_name},
                 {"system_fingerprint", "xpert"},
                 {"choices", ojson::array()},
                 {"usage", usage()}};
      if (!send("data: " + dump(c) + "\n\n")) return;
    }
    send("data: [DONE]\n\n");
  });
}

// llama.cpp's /infill: {input_prefix, input_suffix, prompt (the middle's start), n_predict, ...} ->
// {content, stop, tokens_predicted, tokens_evaluated, stop_type}; streamed as data: {content, stop}.
void infill(Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const ojson body = parse_body(req.body);
  const std::string prefix = string(body, "input_prefix"), suffix = string(body, "input_suffix"),
                    middle = string(body, "prompt");
  const ojson* extra = field(body, "input_extra");
  if (extra && extra->is_array() && extra->empty()) extra = nullptr;
  GenerateParams g;
  sampling(body, g.sampling);
  g.max_tokens = integer(body, "n_predict", -1, 1 << 24, integer(body, "max_tokens", 1, 1 << 24, 0));
  if (g.max_tokens < 0) g.max_tokens = 0;
  g.stop = stops(body, "stop", 16);
  const bool stream = boolean(body, "stream", false);
  g.prompt = fim_prompt(ctx, prefix, suffix, middle, "input_prefix", extra);
  ctx.check_prompt_fits(g.prompt, "input_prefix");
  const int64_t n_prompt = (int64_t)g.prompt.size();
  std::vector<std::shared_ptr<Job>> jobs = {ctx.submit(std::move(g), res)};
  const std::string model = ctx.m.id;
  auto final_fields = [jobs, n_prompt, model](ojson& o, Finish f) {
    o["model"] = model;
    o["tokens_predicted"] = jobs[0]->n_generated();
    o["tokens_evaluated"] = n_prompt;
    o["tokens_cached"] = jobs[0]->n_cached();
    o["stop_type"] = f == Finish::length ? "limit" : "eos";
  };
  if (!stream) {
    Collected c = collect(ctx, jobs)[0];
    ojson out = {{"index", 0}, {"content", c.text}, {"stop", true}};
    final_fields(out, c.finish);
    if (c.stop_index >= 0) out["stop_type"] = "word";
    res.set_content(dump(out), "application/json");
    return;
  }
  stream_sse(res, jobs, [&ctx, jobs, final_fields](const std::function<bool(const std::string&)>& send) {
    pump(
        ctx, jobs,
        [&](JobOutput& o) {
          const Job::Update& u = o.update;
          if (u.finish == Finish::error) {
            send("data: " + error_body(500, "generation failed: " + u.error) + "\n\n");
            return false;
          }
          ojson c = {{"index", 0}, {"content", u.text}, {"stop", u.finish != Finish::none}};
          if (u.finish != Finish::none) {
            final_fields(c, u.finish);
            if (u.stop_index >= 0) c["stop_type"] = "word";
          }
          return send("data: " + dump(c) + "\n\n");
        },
        [&] { return send(": keep-alive\n\n"); });
  });
}

}  // namespace

void add_completion_routes(Router& r) {
  Context& ctx = r.ctx();
  r.post("/v1/chat/completions",
         [&ctx](const httplib::Request& q, httplib::Response& s) { chat_or_completion(ctx, q, s, true); });
  r.post("/v1/completions",
         [&ctx](const httplib::Request& q, httplib::Response& s) { chat_or_completion(ctx, q, s, false); });
  r.post("/infill", [&ctx](const httplib::Request& q, httplib::Response& s) { infill(ctx, q, s); });
}

}  // namespace xpert::server
