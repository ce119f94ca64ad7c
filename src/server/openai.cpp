#include "server/openai.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "server/structured.h"

namespace xpert::server {

using namespace fields;

namespace {

constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxStops = 4;  // OpenAI's limit
constexpr int kMaxChoices = 128;  // n times prompts

const char* default_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// Deeply nested JSON would recurse in the template engine; reject it before parsing.
bool too_deep(const std::string& s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

void check_messages(const ojson& body) {
  auto it = body.find("messages");
  if (it == body.end()) bad("messages", "'messages' is required: an array of {role, content} objects");
  const ojson& msgs = *it;
  if (!msgs.is_array()) bad("messages", fmt::format("'messages' must be an array, got {}", type_name(msgs)));
  if (msgs.empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& m = msgs[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(at, fmt::format("'{}' must be an object, got {}", at, type_name(m)));
    auto role = m.find("role");
    if (role == m.end()) bad(at + ".role", fmt::format("'{}.role' is required", at));
    if (!role->is_string())
      bad(at + ".role", fmt::format("'{}.role' must be a string, got {}", at, type_name(*role)));
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      bad(at + ".role",
          fmt::format("'{}.role' is '{}'; expected one of system, developer, user, assistant, tool", at, r));
    auto content = m.find("content");
    const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (content == m.end() || content->is_null()) {
      if (r == "assistant" && has_calls) continue;
      bad(at + ".content", fmt::format("'{}.content' is required", at));
    }
    if (content->is_string()) continue;
    if (!content->is_array())
      bad(at + ".content", fmt::format("'{}.content' must be a string or an array of text parts, got {}", at,
                                       type_name(*content)));
    for (size_t j = 0; j < content->size(); ++j) {
      const ojson& part = (*content)[j];
      const std::string pat = fmt::format("{}.content[{}]", at, j);
      if (!part.is_object()) bad(pat, fmt::format("'{}' must be an object, got {}", pat, type_name(part)));
      auto type = part.find("type");
      if (type == part.end() || !type->is_string())
        bad(pat + ".type", fmt::format("'{}.type' must be a string", pat));
      if (*type != "text")
        bad(pat + ".type", fmt::format("'{}.type' is '{}'; this server takes text parts only", pat,
                                       type->get<std::string>()));
      auto text = part.find("text");
      if (text == part.end() || !text->is_string())
        bad(pat + ".text", fmt::format("'{}.text' must be a string", pat));
    }
  }
}

Prompt token_prompt(const ojson& p, const std::string& param) {
  Prompt out;
  out.is_tokens = true;
  if (p.empty()) bad(param, fmt::format("'{}' must not be empty", param));
  for (const ojson& t : p) {
    if (!t.is_number_integer() && !t.is_number_unsigned())
      bad(param, fmt::format("'{}' token ids must be integers, got {}", param, type_name(t)));
    const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX ? -1 : t.get<int64_t>();
    if (id < 0 || id > INT32_MAX) bad(param, fmt::format("'{}' token id {} is out of range", param, t.dump()));
    out.tokens.push_back((int32_t)id);
  }
  return out;
}

}  // namespace

// A string, an array of token ids, or an array of either (several prompts).
std::vector<Prompt> parse_prompts(const ojson& p, const std::string& param, size_t max) {
  if (p.is_string()) return {Prompt{.text = p.get<std::string>(), .tokens = {}, .is_tokens = false}};
  if (!p.is_array())
    bad(param, fmt::format("'{}' must be a string, an array of token ids or an array of those, got {}", param,
                           type_name(p)));
  if (p.empty()) bad(param, fmt::format("'{}' must not be empty", param));
  if (!p[0].is_string() && !p[0].is_array()) return {token_prompt(p, param)};
  if (p.size() > max) bad(param, fmt::format("'{}' has {} prompts; at most {} are allowed", param, p.size(), max));
  std::vector<Prompt> out;
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", param, i);
    if (p[i].is_string())
      out.push_back(Prompt{.text = p[i].get<std::string>(), .tokens = {}, .is_tokens = false});
    else if (p[i].is_array())
      out.push_back(token_prompt(p[i], param));
    else
      bad(param, fmt::format("'{}' must be a string or an array of token ids, got {}", at, type_name(p[i])));
  }
  return out;
}

namespace fields {

const char* type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

// Optional fields: absent or null means "use the default".
const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const ojson& body, const char* name, double lo, double hi, double def) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (!v->is_number()) bad(name, fmt::format("'{}' must be a number, got {}", name, type_name(*v)));
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, d));
  return d;
}

int64_t integer(const ojson& body, const char* name, int64_t lo, int64_t hi, int64_t def) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d)) bad(name, fmt::format("'{}' must be an integer, got {}", name, d));
    if (d < (double)lo || d > (double)hi)
      bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, d));
    return (int64_t)d;
  }
  if (!v->is_number_integer() && !v->is_number_unsigned())
    bad(name, fmt::format("'{}' must be an integer, got {}", name, type_name(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t)std::numeric_limits<int64_t>::max())
    bad(name, fmt::format("'{}' must be between {} and {}", name, lo, hi));
  const int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, i));
  return i;
}

bool boolean(const ojson& body, const char* name, bool def) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) bad(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(*v)));
  return v->get<bool>();
}

std::string string(const ojson& body, const char* name, const std::string& def) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (!v->is_string()) bad(name, fmt::format("'{}' must be a string, got {}", name, type_name(*v)));
  return v->get<std::string>();
}

std::string string_in(const ojson& obj, const char* name, const std::string& at, const std::string& def) {
  const ojson* v = obj.is_object() ? field(obj, name) : nullptr;
  if (!v) return def;
  const std::string param = at.empty() ? name : fmt::format("{}.{}", at, name);
  if (!v->is_string()) bad(param, fmt::format("'{}' must be a string, got {}", param, type_name(*v)));
  return v->get<std::string>();
}

bool boolean_in(const ojson& obj, const char* name, const std::string& at, bool def) {
  const ojson* v = obj.is_object() ? field(obj, name) : nullptr;
  if (!v) return def;
  const std::string param = at.empty() ? name : fmt::format("{}.{}", at, name);
  if (!v->is_boolean()) bad(param, fmt::format("'{}' must be a boolean, got {}", param, type_name(*v)));
  return v->get<bool>();
}

ojson parse_body(const std::string& text) {
  if (too_deep(text)) bad("", fmt::format("the JSON body is nested deeper than {} levels", kMaxJsonDepth));
  ojson body = ojson::parse(text, nullptr, false);
  if (body.is_discarded())
    bad("", "could not parse the JSON body of the request: it is not valid JSON (or not valid UTF-8)");
  if (!body.is_object())
    bad("", fmt::format("the request body must be a JSON object, got {}", type_name(body)));
  return body;
}

void sampling(const ojson& body, SamplingParams& sp) {
  sp.temperature = (float)number(body, "temperature", 0, 2, sp.temperature);
  sp.top_p = (float)number(body, "top_p", 0, 1, sp.top_p);
  sp.top_k = (int32_t)integer(body, "top_k", 0, 1 << 20, sp.top_k);
  sp.min_p = (float)number(body, "min_p", 0, 1, sp.min_p);
  sp.presence_penalty = (float)number(body, "presence_penalty", -2, 2, sp.presence_penalty);
  sp.frequency_penalty = (float)number(body, "frequency_penalty", -2, 2, sp.frequency_penalty);
  sp.repeat_penalty = (float)number(body, "repeat_penalty", 0, 10, sp.repeat_penalty);
  if (field(body, "seed")) {
    const int64_t seed =
        integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 0);
    sp.seed = (uint64_t)seed;
    if (sp.seed == 0xFFFFFFFF) sp.seed = 0xFFFFFFFE;  // 0xFFFFFFFF means "random" to the sampler
  }
}

std::vector<std::string> stops(const ojson& body, const char* name, size_t max) {
  const ojson* v = field(body, name);
  if (!v) return {};
  if (!v->is_string() && !v->is_array())
    bad(name, fmt::format("'{}' must be a string or an array of strings, got {}", name, type_name(*v)));
  if (v->is_array() && v->size() > max)
    bad(name, fmt::format("'{}' has {} entries; at most {} are allowed", name, v->size(), max));
  // An empty stop string stops nothing, so it is left out: the stop indices the engine reports (Anthropic's
  // stop_sequence) then count the strings that remain.
  std::vector<std::string> out;
  for (const ojson& s : v->is_string() ? ojson::array({*v}) : *v) {
    if (!s.is_string()) bad(name, fmt::format("'{}' entries must be strings, got {}", name, type_name(s)));
    if (!s.get_ref<const std::string&>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace fields

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string code_,
                   std::string type_)
    : std::runtime_error(message),
      status(status_),
      type(std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string error_body(int status, const std::string& message, const std::string& param,
                       const std::string& code, const std::string& type) {
  ojson e = ojson::object();
  e["message"] = message;
  e["type"] = type.empty() ? default_type(status) : type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  e["code"] = code.empty() ? ojson(nullptr) : ojson(code);
  return dump(ojson{{"error", e}});
}

CompletionRequest parse_completion_request(const std::string& text, bool chat) {
  const ojson body = parse_body(text);
  CompletionRequest r;
  r.chat = chat;
  if (const ojson* m = field(body, "model")) {
    if (!m->is_string()) bad("model", fmt::format("'model' must be a string, got {}", type_name(*m)));
    r.model = m->get<std::string>();
  }
  if (chat) {
    check_messages(body);
    r.messages = body["messages"];
    if (const ojson* t = field(body, "tools")) {
      if (!t->is_array()) bad("tools", fmt::format("'tools' must be an array, got {}", type_name(*t)));
      if (!t->empty()) r.tools = *t;
    }
    parse_chat_tool_fields(body, r);
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || p->is_null())
      bad("prompt", "'prompt' is required: a string, an array of token ids, or an array of those");
    r.prompts = parse_prompts(*p, "prompt", kMaxChoices);
    r.echo = boolean(body, "echo", false);
    if (const ojson* s = field(body, "suffix")) {
      if (!s->is_string()) bad("suffix", fmt::format("'suffix' must be a string, got {}", type_name(*s)));
      r.suffix = s->get<std::string>();
    }
    if (const ojson* b = field(body, "best_of"); b && !(b->is_number_integer() && b->get<int64_t>() == 1))
      bad("best_of", "'best_of' other than 1 is not supported");
  }

  r.n = (int)integer(body, "n", 1, kMaxChoices, 1);
  if (r.n * std::max<size_t>(1, r.prompts.size()) > kMaxChoices)
    bad("n", fmt::format("{} prompts times n = {} is more than {} choices in one request", r.prompts.size(), r.n,
                         kMaxChoices));

  sampling(body, r.gen.sampling);

  int64_t max_tokens = integer(body, "max_tokens", 1, 1 << 24, 0);
  if (chat) max_tokens = integer(body, "max_completion_tokens", 1, 1 << 24, max_tokens);
  r.gen.max_tokens = max_tokens;
  r.gen.stop = stops(body, "stop", kMaxStops);

  if (chat) {
    r.logprobs = boolean(body, "logprobs", false);
    const ojson* tl = field(body, "top_logprobs");
    const int64_t top = integer(body, "top_logprobs", 0, 20, 0);
    if (tl && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.gen.top_logprobs = r.logprobs ? (int)top : -1;
  } else {
    const ojson* lp = field(body, "logprobs");
    if (lp && lp->is_boolean())
      bad("logprobs", "'logprobs' of /v1/completions is an integer (0 to 5), got a boolean");
    r.gen.top_logprobs = lp ? (int)integer(body, "logprobs", 0, 5, 0) : -1;
    r.logprobs = lp != nullptr;
  }

  r.stream = boolean(body, "stream", false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object())
      bad("stream_options", fmt::format("'stream_options' must be an object, got {}", type_name(*so)));
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  parse_constraints(body, r);  // response_format, grammar, json_schema, logit_bias (server/structured.cpp)
  // Every field read above; a field we do not act on is a 400, never a silent 200. `user`, `metadata`,
  // `store`, `service_tier`, `safety_identifier` and `prompt_cache_key` change nothing in the answer.
  if (chat)
    reject_unknown_fields(body, {"model", "messages", "tools", "tool_choice", "parallel_tool_calls",
                                 "reasoning_format", "chat_template_kwargs", "n", "temperature", "top_p", "top_k",
                                 "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "seed",
                                 "max_tokens", "max_completion_tokens", "stop", "logprobs", "top_logprobs", "stream",
                                 "stream_options", "user", "metadata", "store", "service_tier", "safety_identifier",
                                 "prompt_cache_key", "response_format", "grammar", "json_schema", "logit_bias"});
  else
    reject_unknown_fields(body, {"model", "prompt", "echo", "suffix", "best_of", "n", "temperature", "top_p", "top_k",
                                 "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "seed",
                                 "max_tokens", "stop", "logprobs", "stream", "stream_options", "user", "response_format",
                                 "grammar", "json_schema", "logit_bias"});
  return r;
}

}  // namespace xpert::server
