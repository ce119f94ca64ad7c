// Anthropic's Messages request body (/v1/messages, /v1/messages/count_tokens) into OpenAI chat terms.
#include <fmt/format.h>

#include "server/api_requests.h"

namespace xpert::server {

namespace {

using namespace fields;

constexpr size_t kMaxStopSequences = 16;

// A string, or an array of text blocks, as one string; `param` names the field in errors.
std::string text_of(const ojson& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(param, fmt::format("'{}' must be a string or an array of content blocks, got {}", param, type_name(v)));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const ojson& b = v[i];
    const std::string at = fmt::format("{}[{}]", param, i);
    if (!b.is_object() || string_in(b, "type", at) != "text" || !b.contains("text") || !b["text"].is_string())
      bad(at, fmt::format("'{}' must be a text block {{\"type\": \"text\", \"text\": ...}}", at));
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

}  // namespace

MessagesRequest parse_messages_request(const std::string& text, bool generate) {
  using namespace fields;
  const ojson body = parse_body(text);
  MessagesRequest r;
  r.chat.chat = true;
  ojson& messages = r.chat.messages;
  messages = ojson::array();
  r.model = string(body, "model");
  if (const ojson* sys = field(body, "system")) messages.push_back({{"role", "system"}, {"content", text_of(*sys, "system")}});

  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    bad("messages", "'messages' is required: a non-empty array of {role, content}");
  for (size_t i = 0; i < it->size(); ++i) {
    const ojson& m = (*it)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(at, fmt::format("'{}' must be an object", at));
    const std::string role = string_in(m, "role", at);
    if (role != "user" && role != "assistant")
      bad(at + ".role", fmt::format("'{}.role' must be 'user' or 'assistant'", at));
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) bad(at + ".content", fmt::format("'{}.content' is required", at));
    if (c->is_string()) {
      messages.push_back({{"role", role}, {"content", c->get<std::string>()}});
      continue;
    }
    if (!c->is_array()) bad(at + ".content", fmt::format("'{}.content' must be a string or an array of blocks", at));
    std::string content, reasoning;
    ojson calls = ojson::array();
    for (size_t j = 0; j < c->size(); ++j) {
      const ojson& b = (*c)[j];
      const std::string bat = fmt::format("{}.content[{}]", at, j);
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
        bad(bat, fmt::format("'{}' must be a content block with a 'type'", bat));
      const std::string type = b["type"].get<std::string>();
      if (type == "text") {
        content += text_of(ojson::array({b}), bat);
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
          bad(bat, fmt::format("'{}' (tool_use) needs a string 'id' and 'name'", bat));
        const ojson input = b.contains("input") ? b["input"] : ojson::object();
        if (!input.is_object()) bad(bat + ".input", fmt::format("'{}.input' must be an object", bat));
        calls.push_back({{"id", b["id"]},
                         {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
      } else if (type == "thinking" && role == "assistant") {
        if (!b.contains("thinking") || !b["thinking"].is_string())
          bad(bat + ".thinking", fmt::format("'{}.thinking' must be a string", bat));
        reasoning += b["thinking"].get<std::string>();
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Another server's encrypted reasoning: nothing a template can show.
      } else if (type == "tool_result" && role == "user") {
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
          bad(bat + ".tool_use_id", fmt::format("'{}.tool_use_id' must be a string", bat));
        std::string result;
        if (b.contains("content") && !b["content"].is_null()) result = text_of(b["content"], bat + ".content");
        if (boolean_in(b, "is_error", bat, false)) result = "Error: " + result;
        // Text before the results stays a user message of its own, in order.
        if (!content.empty()) {
          messages.push_back({{"role", "user"}, {"content", content}});
          content.clear();
        }
        messages.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      } else {
        bad(bat + ".type", fmt::format("'{}.type' is '{}'; this server takes text, and tool_use (assistant) / "
                                       "tool_result (user) blocks",
                                       bat, type));
      }
    }
    if (role == "assistant") {
      ojson msg = {{"role", "assistant"}, {"content", content}};
      if (!calls.empty()) msg["tool_calls"] = calls;
      if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
      messages.push_back(std::move(msg));
    } else if (!content.empty() || c->empty()) {
      messages.push_back({{"role", "user"}, {"content", content}});
    }
  }

  if (const ojson* t = field(body, "tools")) {
    if (!t->is_array()) bad("tools", fmt::format("'tools' must be an array, got {}", type_name(*t)));
    ojson tools = ojson::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& d = (*t)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!d.is_object() || !d.contains("name") || !d["name"].is_string())
        bad(at, fmt::format("'{}' must be a tool {{name, description, input_schema}}", at));
      if (d.contains("type") && d["type"].is_string() && d["type"] != "custom")
        bad(at + ".type", fmt::format("'{}.type' '{}': only client tools (name, input_schema) are supported", at,
                                      d["type"].get<std::string>()));
      ojson fn = {{"name", d["name"]}};
      if (d.contains("description")) fn["description"] = d["description"];
      fn["parameters"] = d.contains("input_schema") ? d["input_schema"] : ojson{{"type", "object"}};
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) r.chat.tools = tools;
  }
  if (const ojson* tc = field(body, "tool_choice")) {
    using TC = CompletionRequest::ToolChoice;
    if (!tc->is_object() || !tc->contains("type") || !(*tc)["type"].is_string())
      bad("tool_choice", "'tool_choice' must be an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const std::string type = (*tc)["type"].get<std::string>();
    if (type == "none") {
      r.chat.tool_choice = TC::none;
    } else if (type == "any") {
      r.chat.tool_choice = TC::required;
    } else if (type == "tool") {
      if (!tc->contains("name") || !(*tc)["name"].is_string())
        bad("tool_choice.name", "'tool_choice.name' is required with type 'tool'");
      r.chat.tool_choice = TC::function;
      r.chat.tool_choice_name = (*tc)["name"].get<std::string>();
      bool known = false;
      if (r.chat.tools.is_array())
        for (const ojson& t : r.chat.tools) known = known || t["function"]["name"] == r.chat.tool_choice_name;
      if (!known) bad("tool_choice.name", fmt::format("'tool_choice.name' '{}' is not one of 'tools'", r.chat.tool_choice_name));
    } else if (type != "auto") {
      bad("tool_choice.type", fmt::format("'tool_choice.type' '{}': expected auto, any, tool or none", type));
    }
    if ((type == "any" || type == "tool") && r.chat.tools.is_null())
      bad("tool_choice", "'tool_choice' asks for a tool call, but there are no 'tools'");
    if (boolean_in(*tc, "disable_parallel_tool_use", "tool_choice", false)) r.chat.parallel_tool_calls = false;
  }
  // Extended thinking is the template's enable_thinking (off unless asked, as Anthropic's default).
  // budget_tokens is checked as Anthropic checks it and is a target, not enforced: max_tokens bounds
  // the whole answer.
  bool thinking = false;
  int64_t budget = 0;
  if (const ojson* th = field(body, "thinking")) {
    const ojson* type = th->is_object() ? field(*th, "type") : nullptr;
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    if (t != "enabled" && t != "disabled")
      bad("thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    thinking = t == "enabled";
    if (thinking) {
      const ojson* b = field(*th, "budget_tokens");
      if (!b || !b->is_number_integer() || b->get<int64_t>() < 1 || b->get<int64_t>() > (1 << 24))
        bad("thinking.budget_tokens", "'thinking.budget_tokens' is required with type enabled: a positive integer");
      budget = b->get<int64_t>();
    }
  }
  r.chat.template_kwargs["enable_thinking"] = thinking;
  if (!generate) return r;

  if (!field(body, "max_tokens")) bad("max_tokens", "'max_tokens' is required");
  r.gen.max_tokens = integer(body, "max_tokens", 1, 1 << 24, 0);
  if (thinking && budget >= r.gen.max_tokens)
    bad("thinking.budget_tokens", fmt::format("'thinking.budget_tokens' ({}) must be less than 'max_tokens' ({})", budget,
                                              r.gen.max_tokens));
  SamplingParams& sp = r.gen.sampling;
  sp.temperature = (float)number(body, "temperature", 0, 1, 1.0);  // Anthropic's default and range
  sp.top_p = (float)number(body, "top_p", 0, 1, sp.top_p);
  sp.top_k = (int32_t)integer(body, "top_k", 0, 1 << 20, sp.top_k);
  r.gen.stop = stops(body, "stop_sequences", kMaxStopSequences);
  r.stream = boolean(body, "stream", false);
  return r;
}

}  // namespace xpert::server
