// The routes around generation: /health, /v1/models(/{id}), /props (llama.cpp's shape), /tokenize,
// /detokenize and /apply-template (llama.cpp's shapes).
#include <fmt/format.h>

#include "model/model.h"
#include "server/chat_plan.h"
#include "server/context.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace xpert::server {

namespace {

using namespace fields;

ojson model_object(const Context& ctx, const std::string& id) {
  return {{"id", id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "xpert"},
          {"meta",
           {{"n_ctx_per_slot", ctx.m.engine->n_ctx()},
            {"n_parallel", ctx.m.engine->n_parallel()},
            {"arch", ctx.m.model->config().arch},
            {"n_vocab", ctx.m.model->config().n_vocab},
            {"n_embd", ctx.m.model->config().n_embd}}}};
}

}  // namespace

void add_text_routes(Router& r) {
  Context& ctx = r.ctx();
  using httplib::Request;
  using httplib::Response;

  // Outside the /v1 gate (see server.cpp): answers 503 while the model loads.
  r.get("/v1/health", [&ctx](const Request&, Response& res) {
    if (ctx.ready.load()) {
      res.set_content(R"({"status":"ok"})", "application/json");
      return;
    }
    res.set_header("Retry-After", "1");
    send_error(res, 503, "the model is still loading", "", "model_loading", "server_error");
  });

  r.get("/v1/models", [&ctx](const Request&, Response& res) {
    res.set_content(dump(ojson{{"object", "list"}, {"data", ojson::array({model_object(ctx, ctx.m.id)})}}),
                    "application/json");
  });
  r.get(R"(/v1/models/(.+))", [&ctx](const Request& req, Response& res) {
    const std::string name = req.matches[1].str();
    const bool known = name == ctx.m.id ||
                       std::find(ctx.m.aliases.begin(), ctx.m.aliases.end(), name) != ctx.m.aliases.end();
    if (!known && ctx.opts.strict_model)
      throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, ctx.m.id),
                     "model", "model_not_found");
    res.set_content(dump(model_object(ctx, name)), "application/json");
  });

  // llama.cpp's /props: what front ends read to fill their settings.
  r.get("/props", [&ctx](const Request&, Response& res) {
    const ModelConfig& c = ctx.m.model->config();
    const SamplingParams sp;
    ojson params = {{"temperature", sp.temperature}, {"top_k", sp.top_k},   {"top_p", sp.top_p},
                    {"min_p", sp.min_p},             {"n_predict", -1},     {"stream", false},
                    {"repeat_penalty", sp.repeat_penalty}};
    ojson out = {{"default_generation_settings", {{"n_ctx", ctx.m.engine->n_ctx()}, {"params", params}}},
                 {"total_slots", ctx.m.engine->n_parallel()},
                 {"model_alias", ctx.m.id},
                 {"model_path", ctx.m.path},
                 {"chat_template", ctx.m.chat_template->source()},
                 {"modalities", {{"vision", false}, {"audio", false}}},
                 {"n_ctx_train", c.n_ctx_train},
                 {"n_vocab", c.n_vocab},
                 {"n_embd", c.n_embd},
                 {"pooling", pooling_name(ctx.m.pooling)},
                 {"build_info", "xpert"}};
    res.set_content(dump(out), "application/json");
  });

  // {content, add_special?, parse_special?, with_pieces?} -> {tokens: [id] | [{id, piece}]}
  r.post("/tokenize", [&ctx](const Request& req, Response& res) {
    const ojson body = parse_body(req.body);
    const ojson* content = field(body, "content");
    if (!content || !content->is_string()) bad("content", "'content' is required: the text to tokenize");
    const bool add_special = boolean(body, "add_special", false);
    const bool parse_special = boolean(body, "parse_special", true);
    const bool with_pieces = boolean(body, "with_pieces", false);
    const Tokenizer& tok = *ctx.m.tokenizer;
    const std::vector<int32_t> ids = tok.encode(content->get<std::string>(), add_special, parse_special);
    ojson tokens = ojson::array();
    for (int32_t id : ids) {
      if (!with_pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string piece = tok.token_to_piece(id, true);
      tokens.push_back({{"id", id}, {"piece", piece}});
    }
    res.set_content(dump(ojson{{"tokens", tokens}}), "application/json");
  });

  // {tokens: [id]} -> {content}
  r.post("/detokenize", [&ctx](const Request& req, Response& res) {
    const ojson body = parse_body(req.body);
    const ojson* t = field(body, "tokens");
    if (!t) bad("tokens", "'tokens' is required: an array of token ids");
    std::vector<int32_t> ids;
    if (!(t->is_array() && t->empty())) ids = parse_prompts(*t, "tokens", 1).at(0).tokens;
    if (!t->is_array() || (!t->empty() && !(*t)[0].is_number()))
      bad("tokens", "'tokens' must be an array of token ids");
    for (int32_t id : ids)
      if (id >= ctx.m.tokenizer->n_vocab())
        bad("tokens", fmt::format("token id {} is out of range [0, {})", id, ctx.m.tokenizer->n_vocab()));
    res.set_content(dump(ojson{{"content", ctx.m.tokenizer->decode(ids, true)}}), "application/json");
  });

  // The prompt a chat request renders to (llama.cpp's /apply-template): for debugging templates.
  r.post("/apply-template", [&ctx](const Request& req, Response& res) {
    CompletionRequest q = parse_completion_request(req.body, true);
    res.set_content(dump(ojson{{"prompt", plan_chat(ctx, q, "call_").prompt.text}}), "application/json");
  });
}

}  // namespace xpert::server
