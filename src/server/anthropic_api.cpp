// Anthropic's Messages API: POST /v1/messages (system, content blocks, tool_use / tool_result, streaming
// events) and /v1/messages/count_tokens, with Anthropic's error shape. The conversation is brought into
// OpenAI's chat messages and rendered by the model's chat template like /v1/chat/completions.
#include <fmt/format.h>

#include "sample/grammar.h"
#include "server/api_requests.h"
#include "server/chat_output.h"
#include "server/chat_plan.h"
#include "server/context.h"

namespace xpert::server {

namespace {

using namespace fields;

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
    if (!parser.reasoning().empty())
      content.push_back({{"type", "thinking"}, {"thinking", parser.reasoning()}, {"signature", ""}});
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
    // Content blocks open as the answer needs them: thinking, text, then a tool_use block per call.
    enum class Open { none, thinking, text, tool };
    int block = -1;
    Open open = Open::none;
    auto close = [&] {
      if (open == Open::none) return true;
      // A thinking block ends with its signature (none here: nothing to verify it against).
      if (open == Open::thinking &&
          !send(event("content_block_delta", {{"type", "content_block_delta"},
                                              {"index", block},
                                              {"delta", {{"type", "signature_delta"}, {"signature", ""}}}})))
        return false;
      open = Open::none;
      return send(event("content_block_stop", {{"type", "content_block_stop"}, {"index", block}}));
    };
    auto begin = [&](Open kind, const ojson& content_block) {
      if (!close()) return false;
      ++block;
      open = kind;
      return send(event("content_block_start",
                        {{"type", "content_block_start"}, {"index", block}, {"content_block", content_block}}));
    };
    auto deliver = [&](const ChatDelta& d) {
      if (!d.reasoning.empty()) {
        if (open != Open::thinking && !begin(Open::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}))
          return false;
        if (!send(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", block},
                                                {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}})))
          return false;
      }
      if (!d.content.empty()) {
        if (open != Open::text && !begin(Open::text, {{"type", "text"}, {"text", ""}})) return false;
        if (!send(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", block},
                                                {"delta", {{"type", "text_delta"}, {"text", d.content}}}})))
          return false;
      }
      for (const CallDelta& c : d.calls) {
        if (!c.id.empty() &&
            !begin(Open::tool, {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", ojson::object()}}))
          return false;
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
  }, anthropic_error_event);
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
