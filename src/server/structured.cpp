#include "server/structured.h"

#include <fmt/format.h>

#include <cmath>

#include "sample/grammar.h"
#include "sample/json_schema.h"

namespace xpert::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::shared_ptr<const Grammar> from_schema(const ojson& schema, const std::string& param, const std::string& path) {
  std::string gbnf;
  try {
    gbnf = json_schema_to_gbnf(schema);
  } catch (const JsonSchemaError& e) {
    bad(param, fmt::format("'{}' cannot be used: {}", path, e.what()));
  }
  try {
    return Grammar::parse(gbnf);
  } catch (const GrammarError& e) {  // a converter bug rather than the client's, but still this field
    bad(param, fmt::format("'{}' gave a grammar that does not compile: {}", path, e.what()));
  }
}

std::shared_ptr<const Grammar> response_format(const ojson& rf) {
  const std::string p = "response_format";
  if (!rf.is_object()) bad(p, "'response_format' must be an object such as {\"type\": \"json_object\"}");
  auto type = rf.find("type");
  if (type == rf.end() || !type->is_string())
    bad(p, "'response_format.type' is required: one of text, json_object, json_schema");
  const std::string t = type->get<std::string>();
  if (t == "text") return nullptr;
  if (t == "json_object") {
    // llama.cpp's extension: {"type": "json_object", "schema": {...}}
    if (const ojson* s = field(rf, "schema")) return from_schema(*s, p, "response_format.schema");
    return Grammar::parse(json_object_gbnf());
  }
  if (t != "json_schema")
    bad(p, fmt::format("'response_format.type' is '{}'; expected one of text, json_object, json_schema", t));
  const ojson* js = field(rf, "json_schema");
  if (!js || !js->is_object())
    bad(p, "'response_format.json_schema' is required with type json_schema: {\"name\": ..., \"schema\": {...}}");
  if (const ojson* name = field(*js, "name"); name && !name->is_string())
    bad(p, "'response_format.json_schema.name' must be a string");
  if (const ojson* strict = field(*js, "strict"); strict && !strict->is_boolean())
    bad(p, "'response_format.json_schema.strict' must be a boolean");
  const ojson* schema = field(*js, "schema");
  if (!schema) bad(p, "'response_format.json_schema.schema' is required: the JSON schema of the answer");
  return from_schema(*schema, p, "response_format.json_schema.schema");
}

float bias_value(const ojson& v, const std::string& id) {
  if (v.is_boolean() && !v.get<bool>()) return -100.0f;  // llama.cpp: false bans
  if (!v.is_number()) bad("logit_bias", fmt::format("'logit_bias' value of token {} must be a number", id));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < -100 || d > 100)
    bad("logit_bias", fmt::format("'logit_bias' value of token {} must be between -100 and 100, got {}", id, d));
  return (float)d;
}

int32_t token_id(const std::string& key) {
  size_t used = 0;
  long long id = -1;
  try {
    id = std::stoll(key, &used);
  } catch (const std::exception&) {
  }
  if (key.empty() || used != key.size() || id < 0 || id > INT32_MAX)
    bad("logit_bias", fmt::format("'logit_bias' keys must be token ids (non-negative integers), got '{}'", key));
  return (int32_t)id;
}

std::vector<std::pair<int32_t, float>> logit_bias(const ojson& v) {
  std::vector<std::pair<int32_t, float>> out;
  if (v.is_object()) {
    for (auto& [k, b] : v.items()) out.emplace_back(token_id(k), bias_value(b, k));
  } else if (v.is_array()) {  // llama.cpp: [[id, bias], ...]
    for (const ojson& pair : v) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer())
        bad("logit_bias", "'logit_bias' as an array must hold [token_id, bias] pairs");
      out.emplace_back(token_id(pair[0].dump()), bias_value(pair[1], pair[0].dump()));
    }
  } else {
    bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases, e.g. {\"50256\": -100}");
  }
  if (out.size() > 4096) bad("logit_bias", "'logit_bias' has more than 4096 entries");
  return out;
}

}  // namespace

void parse_constraints(const ojson& body, CompletionRequest& r) {
  std::shared_ptr<const Grammar> g;
  const char* from = nullptr;
  if (const ojson* rf = field(body, "response_format")) {
    g = response_format(*rf);
    if (g) from = "response_format";
  }
  if (const ojson* s = field(body, "json_schema")) {
    if (from) bad("json_schema", fmt::format("'json_schema' and '{}' both constrain the output; send one", from));
    g = from_schema(*s, "json_schema", "json_schema");
    from = "json_schema";
  }
  if (const ojson* gr = field(body, "grammar")) {
    if (!gr->is_string()) bad("grammar", "'grammar' must be a string of GBNF rules, e.g. root ::= \"yes\" | \"no\"");
    if (!gr->get<std::string>().empty()) {
      if (from) bad("grammar", fmt::format("'grammar' and '{}' both constrain the output; send one", from));
      try {
        g = Grammar::parse(gr->get<std::string>());
      } catch (const GrammarError& e) {
        bad("grammar", fmt::format("'grammar' is not a valid GBNF grammar: {}", e.what()));
      }
    }
  }
  if (g) r.gen.grammar = std::move(g);
  if (const ojson* lb = field(body, "logit_bias")) r.gen.sampling.logit_bias = logit_bias(*lb);
}

void check_logit_bias(const GenerateParams& gen, int32_t n_vocab) {
  for (auto [id, bias] : gen.sampling.logit_bias)
    if (id >= n_vocab) bad("logit_bias", fmt::format("'logit_bias' token id {} is out of range [0, {})", id, n_vocab));
}

}  // namespace xpert::server
