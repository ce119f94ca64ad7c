// OpenAI's Responses request body (/v1/responses) into chat messages and GenerateParams.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#include "server/api_requests.h"
#include "server/structured.h"

namespace xpert::server {

namespace {

using namespace fields;

// Content given as a string or a list of text parts.
std::string content_text(const ojson& c, const std::string& at) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(at, fmt::format("'{}' must be a string or an array of content parts", at));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string pat = fmt::format("{}[{}]", at, i);
    const std::string type = string_in(p, "type", pat);
    if (type != "input_text" && type != "output_text" && type != "text")
      bad(pat + ".type", fmt::format("'{}' must be a text part (input_text or output_text); got '{}'", pat, type));
    if (!p.contains("text") || !p["text"].is_string()) bad(pat + ".text", fmt::format("'{}.text' must be a string", pat));
    out += p["text"].get<std::string>();
  }
  return out;
}

// Appends input items (OpenAI's shapes) to `messages` as chat messages.
void append_items(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return;
  }
  if (!input.is_array()) bad("input", fmt::format("'input' must be a string or an array of items, got {}", type_name(input)));
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& it = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!it.is_object()) bad(at, fmt::format("'{}' must be an object", at));
    const std::string type = string_in(it, "type", at, it.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = string_in(it, "role", at);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad(at + ".role", fmt::format("'{}.role' must be user, system, developer or assistant", at));
      if (!it.contains("content")) bad(at + ".content", fmt::format("'{}.content' is required", at));
      messages.push_back({{"role", role == "developer" ? "system" : role},
                          {"content", content_text(it["content"], at + ".content")}});
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!it.contains(k) || !it[k].is_string())
          bad(fmt::format("{}.{}", at, k), fmt::format("'{}.{}' must be a string", at, k));
      ojson call = {{"id", it["call_id"]},
                    {"type", "function"},
                    {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      // Calls after an assistant message (or each other) belong to that assistant turn.
      if (!messages.empty() && messages.back()["role"] == "assistant") {
        ojson& last = messages.back();
        if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
        last["tool_calls"].push_back(call);
      } else {
        messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
      }
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string())
        bad(at + ".call_id", fmt::format("'{}.call_id' must be a string", at));
      if (!it.contains("output")) bad(at + ".output", fmt::format("'{}.output' is required", at));
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", it["call_id"]},
                          {"content", content_text(it["output"], at + ".output")}});
    } else if (type == "reasoning") {
      continue;  // a reasoning item handed back: its text is not part of the next prompt
    } else {
      bad(at + ".type", fmt::format("'{}.type' '{}' is not supported (message, function_call, "
                                    "function_call_output)", at, type));
    }
  }
}

}  // namespace

ResponsesRequest parse_responses_request(const std::string& text, const PreviousConversation& previous) {
  using namespace fields;
  const ojson body = parse_body(text);
  ResponsesRequest r;
  r.model = string(body, "model");
  r.instructions = string(body, "instructions");
  r.previous_id = string(body, "previous_response_id");
  if (!r.previous_id.empty()) {
    std::optional<ojson> prev = previous ? previous(r.previous_id) : std::nullopt;
    if (!prev)
      throw ApiError(404, fmt::format("No response with id '{}' (it was not stored, or is too old)", r.previous_id),
                     "previous_response_id", "not_found");
    r.messages = std::move(*prev);
  }
  const ojson* input = field(body, "input");
  if (!input) bad("input", "'input' is required: a string or an array of items");
  append_items(*input, r.messages);

  if (const ojson* t = field(body, "tools")) {
    if (!t->is_array()) bad("tools", fmt::format("'tools' must be an array, got {}", type_name(*t)));
    r.tools_in = *t;
    ojson tools = ojson::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& d = (*t)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!d.is_object() || string_in(d, "type", at) != "function")
        bad(at + ".type", fmt::format("'{}' must be a function tool; built-in tools (web search, files, ...) are "
                                      "not available here", at));
      if (!d.contains("name") || !d["name"].is_string()) bad(at + ".name", fmt::format("'{}.name' must be a string", at));
      ojson fn = {{"name", d["name"]}};
      if (d.contains("description")) fn["description"] = d["description"];
      fn["parameters"] = d.contains("parameters") && !d["parameters"].is_null() ? d["parameters"] : ojson{{"type", "object"}};
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) r.tools = tools;
  }
  if (const ojson* tc = field(body, "tool_choice")) {
    using TC = CompletionRequest::ToolChoice;
    if (*tc == "none") {
      r.gen.tool_choice = TC::none;
    } else if (*tc == "required") {
      r.gen.tool_choice = TC::required;
    } else if (tc->is_object() && tc->contains("type") && (*tc)["type"] == "function" && tc->contains("name") && (*tc)["name"].is_string()) {
      r.gen.tool_choice = TC::function;
      r.gen.tool_choice_name = (*tc)["name"].get<std::string>();
      bool known = false;
      if (r.tools.is_array())
        for (const ojson& t : r.tools) known = known || t["function"]["name"] == r.gen.tool_choice_name;
      if (!known) bad("tool_choice", fmt::format("'tool_choice' names '{}', which is not one of 'tools'", r.gen.tool_choice_name));
    } else if (*tc != "auto") {
      bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
    }
    if (r.gen.tool_choice != TC::automatic && r.gen.tool_choice != TC::none && r.tools.is_null())
      bad("tool_choice", "'tool_choice' asks for a tool call, but there are no 'tools'");
  }
  // reasoning.effort "none" turns the template's thinking off (enable_thinking), any other effort on;
  // absent, the template decides. Reasoning comes whole as reasoning_text; no summaries are written
  // (summary is accepted and each reasoning item's summary is empty).
  if (const ojson* rs = field(body, "reasoning")) {
    if (!rs->is_object()) bad("reasoning", "'reasoning' must be an object {\"effort\": ..., \"summary\": ...}");
    static const std::map<std::string, std::set<std::string>> allowed = {
        {"effort", {"none", "minimal", "low", "medium", "high", "xhigh", "max"}},
        {"summary", {"auto", "concise", "detailed"}},
        {"generate_summary", {"auto", "concise", "detailed"}}};
    for (auto& [k, v] : rs->items()) {
      auto a = allowed.find(k);
      if (a == allowed.end()) bad("reasoning." + k, fmt::format("'reasoning.{}' is not supported (effort, summary)", k));
      if (v.is_null()) continue;
      if (!v.is_string() || !a->second.count(v.get<std::string>()))
        bad("reasoning." + k, fmt::format("'reasoning.{}' must be one of {}", k, fmt::join(a->second, ", ")));
      r.reasoning[k == "generate_summary" ? "summary" : k] = v;
    }
    if (r.reasoning["effort"].is_string()) r.gen.template_kwargs["enable_thinking"] = r.reasoning["effort"] != "none";
  }
  if (const ojson* inc = field(body, "include"); inc && !(inc->is_array() && inc->empty()))
    bad("include", "'include' (extra output data) is not supported by this server");
  if (const ojson* m = field(body, "metadata")) {
    if (!m->is_object()) bad("metadata", "'metadata' must be an object");
    r.metadata = *m;
  }
  r.store = boolean(body, "store", true);
  r.stream = boolean(body, "stream", false);
  r.gen.parallel_tool_calls = boolean(body, "parallel_tool_calls", true);
  string(body, "user");
  if (const ojson* tr = field(body, "truncation"); tr && *tr != "disabled" && *tr != "auto")
    bad("truncation", "'truncation' must be \"disabled\" or \"auto\"");

  sampling(body, r.gen.gen.sampling);
  r.gen.gen.max_tokens = integer(body, "max_output_tokens", 1, 1 << 24, 0);
  // text.format: text, json_object or json_schema ({name, schema, strict}), as response_format is.
  if (const ojson* tx = field(body, "text")) {
    if (!tx->is_object()) bad("text", "'text' must be an object {format: {...}}");
    if (tx->contains("format") && !(*tx)["format"].is_null()) {
      const ojson& f = (*tx)["format"];
      if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
        bad("text.format", "'text.format' must be an object with a 'type'");
      r.text_format = f;
      ojson rf = {{"type", f["type"]}};
      if (f["type"] == "json_schema") {
        ojson js = {{"name", string_in(f, "name", "text.format", "response")}};
        if (f.contains("schema")) js["schema"] = f["schema"];
        if (f.contains("strict")) js["strict"] = f["strict"];
        rf["json_schema"] = js;
      }
      try {
        parse_constraints(ojson{{"response_format", rf}}, r.gen);
      } catch (ApiError& e) {
        throw ApiError(e.status, e.what(), "text.format", e.code, e.type);
      }
    }
  }
  return r;
}

}  // namespace xpert::server
