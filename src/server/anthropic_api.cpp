// Anthropic's Messages API: POST /v1/messages (system, content blocks, tool_use / tool_result, streaming
// events) and /v1/messages/count_tokens, with Anthropic's error shape. The conversation is brought into
// OpenAI's chat messages and rendered by the model's chat template like /v1/chat/completions.
#include <fmt/format.h>

#include "sample/grammar.h"
#include "server/chat_output.h"
#include "server/chat_plan.h"
#include "server/context.h"

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
    if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
      bad(at, fmt::format("'{}' must be a text block {{\"type\": \"text\", \"text\": ...}}", at));
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

struct MessagesRequest {
  std::string model;
  CompletionRequest chat;  // messages, tools, tool_choice in OpenAI's chat terms (for plan_chat)
  GenerateParams gen;
  bool stream = false;
};

// Anthropic's request -> the chat messages the template takes. `generate`: /v1/messages (max_tokens is
// required there, and the sampling fields are read); false: count_tokens.
MessagesRequest parse_messages_request(const std::string& text, bool generate) {
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
    const std::string role = m.value("role", "");
    if (role != "user" && role != "assistant")
      bad(at + ".role", fmt::format("'{}.role' must be 'user' or 'assistant'", at));
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) bad(at + ".content", fmt::format("'{}.content' is required", at));
    if (c->is_string()) {
      messages.push_back({{"role", role}, {"content", c->get<std::string>()}});
      continue;
    }
    if (!c->is_array()) bad(at + ".content", fmt::format("'{}.content' must be a string or an array of blocks", at));
    std::string content;
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
      } else if (type == "tool_result" && role == "user") {
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
          bad(bat + ".tool_use_id", fmt::format("'{}.tool_use_id' must be a string", bat));
        std::string result;
        if (b.contains("content") && !b["content"].is_null()) result = text_of(b["content"], bat + ".content");
        if (b.value("is_error", false)) result = "Error: " + result;
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
    if (tc->value("disable_parallel_tool_use", false)) r.chat.parallel_tool_calls = false;
  }
  if (const ojson* th = field(body, "thinking"); th && !(th->is_object() && th->value("type", "") == "disabled"))
    bad("thinking", "'thinking' (extended thinking) is not supported by this server");
  if (!generate) return r;

  if (!field(body, "max_tokens")) bad("max_tokens", "'max_tokens' is required");
  r.gen.max_tokens = integer(body, "max_tokens", 1, 1 << 24, 0);
  SamplingParams& sp = r.gen.sampling;
  sp.temperature = (float)number(body, "temperature", 0, 1, 1.0);  // Anthropic's default and range
  sp.top_p = (float)number(body, "top_p", 0, 1, sp.top_p);
  sp.top_k = (int32_t)integer(body, "top_k", 0, 1 << 20, sp.top_k);
  r.gen.stop = stops(body, "stop_sequences", kMaxStopSequences);
  r.stream = boolean(body, "stream", false);
  return r;
}

const char* stop_reason(const Collected& c) {
  if (c.finish == Finish::length) return "max_tokens";
  return c.stop_index >= 0 ? "stop_sequence" : "end_turn";
}

// A call's arguments (JSON text of an object) as tool_use.input.
ojson tool_input(const std::string& arguments) {
  ojson v = ojson::parse(arguments, nullptr, false);
  return v.is_object() ? v : ojson::object();
}

std::string event(const char* name, const ojson& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, dump(data));
}

void messages(Context& ctx, const httplib::Request& req, httplib::Response& res) {
  MessagesRequest r = parse_messages_request(req.body, true);
  const std::string model = ctx.model_name(r.model);
  const ChatPlan cp = plan_chat(ctx, r.chat, random_id("toolu_") + "_");
  r.gen.prompt = ctx.tokenize(cp.prompt);
  if (!cp.grammar.empty()) r.gen.grammar = Grammar::parse(cp.grammar);
  ctx.check_prompt_fits(r.gen.prompt, "messages");
  const int64_t n_prompt = (int64_t)r.gen.prompt.size();
  const std::vector<std::string> stops = r.gen.stop;
  std::vector<std::shared_ptr<Job>> jobs = {ctx.submit(std::move(r.gen), res)};
  const std::string id = random_id("msg_");
  auto usage = [jobs, n_prompt] {
    return ojson{{"input_tokens", n_prompt},
                 {"output_tokens", jobs[0]->n_generated()},
                 {"cache_read_input_tokens", jobs[0]->n_cached()},
                 {"cache_creation_input_tokens", 0}};
  };
  auto stop_sequence = [stops](int index) -> ojson {
    return index >= 0 && index < (int)stops.size() ? ojson(stops[index]) : ojson(nullptr);
  };

  if (!r.stream) {
    const Collected c = collect(ctx, jobs)[0];
    ChatOutputParser parser(cp.output);
    parser.feed(cp.forced);
    parser.feed(c.text);
    parser.finish();
    ojson content = ojson::array();
    if (!parser.content().empty()) content.push_back({{"type", "text"}, {"text", parser.content()}});
    for (const ParsedCall& call : parser.calls())
      content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.call.name}, {"input", tool_input(call.call.arguments)}});
    const bool called = !parser.calls().empty() && c.finish == Finish::stop;
    ojson out = {{"id", id},
                 {"type", "message"},
                 {"role", "assistant"},
                 {"model", model},
                 {"content", content},
                 {"stop_reason", called ? "tool_use" : stop_reason(c)},
                 {"stop_sequence", stop_sequence(c.stop_index)},
                 {"usage", usage()}};
    res.set_content(dump(out), "application/json");
    return;
  }

  auto parser = std::make_shared<ChatOutputParser>(cp.output);
  const std::string forced = cp.forced;
  stream_sse(res, jobs, [&ctx, jobs, id, model, n_prompt, usage, stop_sequence, parser,
                         forced](const std::function<bool(const std::string&)>& send) {
    ojson start = {{"id", id},
                   {"type", "message"},
                   {"role", "assistant"},
                   {"model", model},
                   {"content", ojson::array()},
                   {"stop_reason", nullptr},
                   {"stop_sequence", nullptr},
                   {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}};
    if (!send(event("message_start", {{"type", "message_start"}, {"message", start}}))) return;
    if (!send(event("ping", {{"type", "ping"}}))) return;
    // Content blocks open as the answer needs them: text, then a tool_use block per call.
    int block = -1;
    bool text_open = false, any_block = false;
    auto close = [&] {
      if (block < 0 || !any_block) return true;
      any_block = false;
      return send(event("content_block_stop", {{"type", "content_block_stop"}, {"index", block}}));
    };
    auto deliver = [&](const ChatDelta& d) {
      if (!d.content.empty()) {
        if (!text_open) {
          if (!close()) return false;
          ++block;
          text_open = any_block = true;
          if (!send(event("content_block_start", {{"type", "content_block_start"},
                                                  {"index", block},
                                                  {"content_block", {{"type", "text"}, {"text", ""}}}})))
            return false;
        }
        if (!send(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", block},
                                                {"delta", {{"type", "text_delta"}, {"text", d.content}}}})))
          return false;
      }
      for (const CallDelta& c : d.calls) {
        if (!c.id.empty()) {
          if (!close()) return false;
          ++block;
          text_open = false;
          any_block = true;
          if (!send(event("content_block_start",
                          {{"type", "content_block_start"},
                           {"index", block},
                           {"content_block", {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", ojson::object()}}}})))
            return false;
        }
        if (!c.arguments.empty() &&
            !send(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", block},
                                                {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}})))
          return false;
      }
      return true;
    };
    if (!deliver(parser->feed(forced))) return;
    Collected end;
    bool failed = false;
    const bool ok = pump(
        ctx, jobs,
        [&](JobOutput& o) {
          const Job::Update& u = o.update;
          if (u.finish == Finish::error) {
            send(event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", "generation failed: " + u.error}}}}));
            failed = true;
            return false;
          }
          if (!u.text.empty() && !deliver(parser->feed(u.text))) return false;
          end.finish = u.finish;
          end.stop_index = u.stop_index;
          return true;
        },
        [&] { return send(event("ping", {{"type", "ping"}})); });
    if (!ok || failed) return;
    if (!deliver(parser->finish()) || !close()) return;
    const bool called = !parser->calls().empty() && end.finish == Finish::stop;
    if (!send(event("message_delta", {{"type", "message_delta"},
                                      {"delta", {{"stop_reason", called ? "tool_use" : stop_reason(end)},
                                                 {"stop_sequence", stop_sequence(end.stop_index)}}},
                                      {"usage", usage()}})))
      return;
    send(event("message_stop", {{"type", "message_stop"}}));
  }, /*after_error=*/"");
}

void count_tokens(Context& ctx, const httplib::Request& req, httplib::Response& res) {
  MessagesRequest r = parse_messages_request(req.body, false);
  ctx.model_name(r.model);
  const std::vector<int32_t> ids = ctx.tokenize(plan_chat(ctx, r.chat, "toolu_").prompt);
  res.set_content(dump(ojson{{"input_tokens", ids.size()}}), "application/json");
}

}  // namespace

void add_anthropic_routes(Router& r) {
  Context& ctx = r.ctx();
  r.post("/v1/messages", [&ctx](const httplib::Request& q, httplib::Response& s) { messages(ctx, q, s); });
  r.post("/v1/messages/count_tokens",
         [&ctx](const httplib::Request& q, httplib::Response& s) { count_tokens(ctx, q, s); });
}

}  // namespace xpert::server
