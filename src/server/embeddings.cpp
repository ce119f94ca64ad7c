// POST /v1/embeddings: one vector per input (a string, token ids, or a list of either), the model's final
// hidden states pooled (--pooling, else the model's metadata) and L2-normalised, as floats or base64.
#include <fmt/format.h>

#include <cstring>

#include "model/model.h"
#include "server/context.h"
#include "text/tokenizer.h"

namespace xpert::server {

namespace {

using namespace fields;

constexpr size_t kMaxInputs = 2048;  // OpenAI's limit

std::string base64(const void* data, size_t n) {
  static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out += kAlphabet[v >> 18 & 63];
    out += kAlphabet[v >> 12 & 63];
    out += i + 1 < n ? kAlphabet[v >> 6 & 63] : '=';
    out += i + 2 < n ? kAlphabet[v & 63] : '=';
  }
  return out;
}

void embeddings(Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const ojson body = parse_body(req.body);
  const std::string model_name = ctx.model_name(string(body, "model"));
  const ojson* input = field(body, "input");
  if (!input) bad("input", "'input' is required: a string, an array of token ids, or an array of those");
  std::vector<Prompt> inputs = parse_prompts(*input, "input", kMaxInputs);
  const std::string format = string(body, "encoding_format", "float");
  if (format != "float" && format != "base64")
    bad("encoding_format", fmt::format("'encoding_format' is '{}'; expected float or base64", format));
  const int64_t n_embd = ctx.m.model->config().n_embd;
  if (field(body, "dimensions") && integer(body, "dimensions", 1, 1 << 20, n_embd) != n_embd)
    bad("dimensions", fmt::format("'dimensions' must be this model's {} (it cannot be shortened)", n_embd));

  std::vector<std::vector<int32_t>> tokens;
  for (Prompt& p : inputs) {
    tokens.push_back(p.is_tokens ? std::move(p.tokens) : ctx.tokenize(p.text));
    const auto& t = tokens.back();
    if (t.empty()) bad("input", "an input is empty");
    for (int32_t id : t)
      if (id >= ctx.m.tokenizer->n_vocab())
        bad("input", fmt::format("'input' token id {} is out of range [0, {})", id, ctx.m.tokenizer->n_vocab()));
    if ((int64_t)t.size() > ctx.m.engine->n_ctx())
      throw ApiError(400,
                     fmt::format("an input has {} tokens; this server's context per slot is {}", t.size(),
                                 ctx.m.engine->n_ctx()),
                     "input", "context_length_exceeded");
  }

  ojson data = ojson::array();
  int64_t n_tokens = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (ctx.stopping.load()) throw ApiError(503, "the server is shutting down", "", "", "server_error");
    std::vector<float> v;
    try {
      v = ctx.m.engine->embed(tokens[i], ctx.m.pooling);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "input");
    }
    n_tokens += (int64_t)tokens[i].size();
    ojson e = {{"object", "embedding"}, {"index", i}};
    if (format == "base64")
      e["embedding"] = base64(v.data(), v.size() * sizeof(float));  // little-endian float32, as OpenAI's
    else
      e["embedding"] = v;
    data.push_back(std::move(e));
  }
  ojson out = {{"object", "list"},
               {"data", std::move(data)},
               {"model", model_name},
               {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
  res.set_content(dump(out), "application/json");
}

}  // namespace

void add_embedding_routes(Router& r) {
  Context& ctx = r.ctx();
  r.post("/v1/embeddings", [&ctx](const httplib::Request& q, httplib::Response& s) { embeddings(ctx, q, s); });
}

}  // namespace xpert::server
