// OpenAI's Responses API: POST /v1/responses (input as a string or items: messages, function_call,
// function_call_output; instructions; function tools; text.format json_schema; streaming events with
// OpenAI's names) and GET /v1/responses/{id}. A response is kept in memory (bounded, oldest dropped) so a
// later request can continue it with previous_response_id: its conversation is rendered again and the
// engine's state cache resumes the shared prefix, so only the new turn is evaluated.
#include <fmt/format.h>

#include <deque>
#include <map>

#include "sample/grammar.h"
#include "server/chat_output.h"
#include "server/api_requests.h"
#include "server/chat_plan.h"
#include "server/context.h"
#include "server/structured.h"

namespace xpert::server {

namespace {

using namespace fields;

constexpr size_t kMaxStored = 256;             // responses kept for previous_response_id ...
constexpr size_t kMaxStoredBytes = 64u << 20;  // ... within this much JSON text

struct Stored {
  ojson messages;  // the conversation (without instructions) up to and including this response's output
  ojson response;  // what GET /v1/responses/{id} returns
  size_t bytes = 0;
};

class ResponseStore {
 public:
  void put(const std::string& id, Stored s) {
    s.bytes = dump(s.messages).size() + dump(s.response).size();
    std::lock_guard lk(mu_);
    const size_t b = s.bytes;
    if (!map_.emplace(id, std::move(s)).second) return;
    order_.push_back(id);
    bytes_ += b;
    while (order_.size() > kMaxStored || (bytes_ > kMaxStoredBytes && order_.size() > 1)) {
      bytes_ -= map_[order_.front()].bytes;
      map_.erase(order_.front());
      order_.pop_front();
    }
  }
  std::optional<Stored> get(const std::string& id) const {
    std::lock_guard lk(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, Stored> map_;
  std::deque<std::string> order_;
  size_t bytes_ = 0;
};

ResponseStore& store() {
  static ResponseStore s;
  return s;
}

ojson usage_json(int64_t n_prompt, int64_t n_gen, int64_t n_cached, int64_t n_reasoning) {
  return {{"input_tokens", n_prompt},
          {"input_tokens_details", {{"cached_tokens", n_cached}}},
          {"output_tokens", n_gen},
          {"output_tokens_details", {{"reasoning_tokens", n_reasoning}}},
          {"total_tokens", n_prompt + n_gen}};
}

struct Shell {  // the fields every response object carries
  std::string id, model, previous_id, instructions;
  int64_t created = 0;
  ojson tools, metadata, text_format, reasoning;
  int64_t max_output_tokens = 0;
  float temperature = 1, top_p = 1;
  bool store = true;
};

ojson response_object(const Shell& s, const std::string& status, const ojson& output, const ojson& usage,
                      Finish finish) {
  ojson r = {{"id", s.id},
             {"object", "response"},
             {"created_at", s.created},
             {"status", status},
             {"error", nullptr},
             {"incomplete_details", finish == Finish::length ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr)},
             {"instructions", s.instructions.empty() ? ojson(nullptr) : ojson(s.instructions)},
             {"max_output_tokens", s.max_output_tokens > 0 ? ojson(s.max_output_tokens) : ojson(nullptr)},
             {"model", s.model},
             {"output", output},
             {"parallel_tool_calls", true},
             {"previous_response_id", s.previous_id.empty() ? ojson(nullptr) : ojson(s.previous_id)},
             {"reasoning", s.reasoning},
             {"store", s.store},
             {"temperature", s.temperature},
             {"text", {{"format", s.text_format}}},
             {"tool_choice", "auto"},
             {"tools", s.tools},
             {"top_p", s.top_p},
             {"truncation", "disabled"},
             {"usage", usage},
             {"user", nullptr},
             {"metadata", s.metadata}};
  return r;
}

ojson message_item(const std::string& id, const std::string& text, const std::string& status) {
  ojson content = ojson::array();
  if (status == "completed" || !text.empty())
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}});
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

ojson reasoning_item(const std::string& id, const std::string& text, const std::string& status) {
  ojson content = ojson::array();
  if (status == "completed" || !text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"id", id}, {"type", "reasoning"}, {"status", status}, {"summary", ojson::array()}, {"content", content}};
}

ojson call_item(const std::string& id, const ParsedCall& c, const std::string& status) {
  return {{"id", id},        {"type", "function_call"}, {"status", status},
          {"arguments", c.call.arguments}, {"call_id", c.id}, {"name", c.call.name}};
}

void responses(Context& ctx, const httplib::Request& req, httplib::Response& res) {
  ResponsesRequest r = parse_responses_request(req.body, [](const std::string& id) -> std::optional<ojson> {
    std::optional<Stored> st = store().get(id);
    if (!st) return std::nullopt;
    return std::move(st->messages);
  });
  Shell sh;
  sh.model = ctx.model_name(r.model);
  sh.id = random_id("resp_");
  sh.created = unix_now();
  sh.previous_id = r.previous_id;
  sh.instructions = r.instructions;
  sh.tools = r.tools_in;
  sh.metadata = r.metadata;
  sh.text_format = r.text_format;
  sh.reasoning = r.reasoning;
  sh.max_output_tokens = r.gen.gen.max_tokens;
  sh.temperature = r.gen.gen.sampling.temperature;
  sh.top_p = r.gen.gen.sampling.top_p;
  sh.store = r.store;

  ojson prompt_messages = ojson::array();
  if (!r.instructions.empty()) prompt_messages.push_back({{"role", "system"}, {"content", r.instructions}});
  for (const ojson& m : r.messages) prompt_messages.push_back(m);
  r.gen.chat = true;
  r.gen.messages = prompt_messages;
  r.gen.tools = r.tools;
  const ChatPlan cp = plan_chat(ctx, r.gen, random_id("call_") + "_");
  GenerateParams g = std::move(r.gen.gen);
  g.prompt = ctx.tokenize(cp.prompt);
  if (g.grammar && cp.output.in_reasoning) g.grammar_after = "</think>";  // the reasoning is free
  if (!cp.grammar.empty()) {
    if (g.grammar) bad("tool_choice", "'tool_choice' forces a tool call and 'text.format' constrains the answer too; send one");
    g.grammar = Grammar::parse(cp.grammar);
  }
  ctx.check_prompt_fits(g.prompt, "input");
  const int64_t n_prompt = (int64_t)g.prompt.size();
  std::vector<std::shared_ptr<Job>> jobs = {ctx.submit(std::move(g), res)};
  const std::string msg_id = random_id("msg_"), rs_id = random_id("rs_");

  // The finished response: kept for previous_response_id (the conversation grows by this answer).
  // call ids -> the function_call items' ids (fc_...), given as calls appear.
  auto finish = [&ctx, jobs, n_prompt, sh, msg_id, rs_id, messages = r.messages](
                    const std::string& reasoning, const std::string& text, const std::vector<ParsedCall>& calls,
                    const std::vector<std::string>& fc_ids, Finish f) {
    ojson output = ojson::array();
    if (!reasoning.empty()) output.push_back(reasoning_item(rs_id, reasoning, "completed"));
    if (!text.empty() || calls.empty()) output.push_back(message_item(msg_id, text, "completed"));
    ojson tool_calls = ojson::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      output.push_back(call_item(fc_ids[i], calls[i], "completed"));
      tool_calls.push_back({{"id", calls[i].id},
                            {"type", "function"},
                            {"function", {{"name", calls[i].call.name}, {"arguments", calls[i].call.arguments}}}});
    }
    const ojson resp = response_object(sh, f == Finish::length ? "incomplete" : "completed", output,
                                       usage_json(n_prompt, jobs[0]->n_generated(), jobs[0]->n_cached(),
                                                  reasoning.empty() ? 0 : (int64_t)ctx.tokenize(reasoning).size()),
                                       f);
    if (sh.store) {
      ojson convo = messages;
      ojson msg = {{"role", "assistant"}, {"content", text}};
      if (!tool_calls.empty()) msg["tool_calls"] = tool_calls;
      if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
      convo.push_back(std::move(msg));
      store().put(sh.id, {std::move(convo), resp});
    }
    return resp;
  };

  if (!r.stream) {
    const Collected c = collect(ctx, jobs)[0];
    ChatOutputParser parser(cp.output);
    parser.feed(cp.forced);
    parser.feed(c.text);
    parser.finish();
    std::vector<std::string> fc_ids;
    for (size_t i = 0; i < parser.calls().size(); ++i) fc_ids.push_back(random_id("fc_"));
    res.set_content(dump(finish(parser.reasoning(), parser.content(), parser.calls(), fc_ids, c.finish)),
                    "application/json");
    return;
  }

  auto parser = std::make_shared<ChatOutputParser>(cp.output);
  const std::string forced = cp.forced;
  auto seq = std::make_shared<std::atomic<int64_t>>(0);  // every event's sequence_number, the error's too
  stream_sse(res, jobs, [&ctx, jobs, sh, msg_id, rs_id, finish, parser, forced, seq](const std::function<bool(const std::string&)>& send) {
    auto event = [&](const char* type, ojson data) {
      ojson e = {{"type", type}, {"sequence_number", (*seq)++}};
      for (auto& [k, v] : data.items()) e[k] = v;
      return send(fmt::format("event: {}\ndata: {}\n\n", type, dump(e)));
    };
    const ojson empty = response_object(sh, "in_progress", ojson::array(), nullptr, Finish::none);
    if (!event("response.created", {{"response", empty}}) || !event("response.in_progress", {{"response", empty}}))
      return;
    // Output items open as the answer needs them: reasoning, the message (its text), then a
    // function_call per call.
    enum class Open { none, reasoning, message, call } open = Open::none;
    int out_index = -1;
    std::string reasoning, text, args;
    std::vector<std::string> fc_ids;
    bool message_done = false;
    auto close = [&]() -> bool {
      if (open == Open::reasoning) {
        open = Open::none;
        return event("response.reasoning_text.done",
                     {{"item_id", rs_id}, {"output_index", out_index}, {"content_index", 0}, {"text", reasoning}}) &&
               event("response.output_item.done",
                     {{"output_index", out_index}, {"item", reasoning_item(rs_id, reasoning, "completed")}});
      }
      if (open == Open::message) {
        open = Open::none;
        message_done = true;
        const ojson part = {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}};
        return event("response.output_text.done", {{"item_id", msg_id}, {"output_index", out_index}, {"content_index", 0},
                                                   {"text", text}, {"logprobs", ojson::array()}}) &&
               event("response.content_part.done", {{"item_id", msg_id}, {"output_index", out_index}, {"content_index", 0}, {"part", part}}) &&
               event("response.output_item.done", {{"output_index", out_index}, {"item", message_item(msg_id, text, "completed")}});
      }
      if (open == Open::call) {
        open = Open::none;
        const ParsedCall& c = parser->calls().at(fc_ids.size() - 1);
        return event("response.function_call_arguments.done",
                     {{"item_id", fc_ids.back()}, {"output_index", out_index}, {"arguments", c.call.arguments}}) &&
               event("response.output_item.done", {{"output_index", out_index}, {"item", call_item(fc_ids.back(), c, "completed")}});
      }
      return true;
    };
    auto open_message = [&]() -> bool {
      open = Open::message;
      ++out_index;
      const ojson empty_part = {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}};
      return event("response.output_item.added", {{"output_index", out_index}, {"item", message_item(msg_id, "", "in_progress")}}) &&
             event("response.content_part.added", {{"item_id", msg_id}, {"output_index", out_index}, {"content_index", 0}, {"part", empty_part}});
    };
    auto deliver = [&](const ChatDelta& d) -> bool {
      if (!d.reasoning.empty()) {
        if (open != Open::reasoning) {
          if (!close()) return false;
          open = Open::reasoning;
          ++out_index;
          if (!event("response.output_item.added",
                     {{"output_index", out_index}, {"item", reasoning_item(rs_id, "", "in_progress")}}))
            return false;
        }
        reasoning += d.reasoning;
        if (!event("response.reasoning_text.delta",
                   {{"item_id", rs_id}, {"output_index", out_index}, {"content_index", 0}, {"delta", d.reasoning}}))
          return false;
      }
      if (!d.content.empty()) {
        if (open != Open::message && (!close() || !open_message())) return false;
        text += d.content;
        if (!event("response.output_text.delta", {{"item_id", msg_id}, {"output_index", out_index}, {"content_index", 0},
                                                  {"delta", d.content}, {"logprobs", ojson::array()}}))
          return false;
      }
      for (const CallDelta& c : d.calls) {
        if (!c.id.empty()) {
          if (!close()) return false;
          fc_ids.push_back(random_id("fc_"));
          open = Open::call;
          ++out_index;
          const ojson item = {{"id", fc_ids.back()}, {"type", "function_call"}, {"status", "in_progress"},
                              {"arguments", ""}, {"call_id", c.id}, {"name", c.name}};
          if (!event("response.output_item.added", {{"output_index", out_index}, {"item", item}})) return false;
        }
        if (!c.arguments.empty() &&
            !event("response.function_call_arguments.delta", {{"item_id", fc_ids.back()}, {"output_index", out_index}, {"delta", c.arguments}}))
          return false;
      }
      return true;
    };
    if (!deliver(parser->feed(forced))) return;
    Finish end = Finish::none;
    bool failed = false;
    const bool ok = pump(
        ctx, jobs,
        [&](JobOutput& o) {
          const Job::Update& u = o.update;
          if (u.finish == Finish::error) {
            ojson err = response_object(sh, "failed", ojson::array(), nullptr, Finish::none);
            err["error"] = {{"code", "server_error"}, {"message", "generation failed: " + u.error}};
            event("response.failed", {{"response", err}});
            failed = true;
            return false;
          }
          if (!u.text.empty() && !deliver(parser->feed(u.text))) return false;
          end = u.finish;
          return true;
        },
        [&] { return send(": keep-alive\n\n"); });
    if (!ok || failed) return;
    if (!deliver(parser->finish())) return;
    if (parser->calls().empty() && open == Open::none && !message_done && !open_message()) return;  // an empty answer
    if (!close()) return;
    const ojson done = finish(reasoning, text, parser->calls(), fc_ids, end);
    event(end == Finish::length ? "response.incomplete" : "response.completed", {{"response", done}});
  }, [seq](const ApiError& e) {  // OpenAI's error event of a Responses stream
    const ojson err = {{"type", "error"}, {"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)},
                       {"message", e.what()}, {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)},
                       {"sequence_number", (*seq)++}};
    return "event: error\ndata: " + dump(err) + "\n\n";
  });
}

}  // namespace

void add_responses_routes(Router& r) {
  Context& ctx = r.ctx();
  r.post("/v1/responses", [&ctx](const httplib::Request& q, httplib::Response& s) { responses(ctx, q, s); });
  r.get(R"(/v1/responses/([^/]+))", [](const httplib::Request& q, httplib::Response& s) {
    const std::string id = q.matches[1].str();
    std::optional<Stored> st = store().get(id);
    if (!st) throw ApiError(404, fmt::format("No response with id '{}'", id), "response_id", "not_found");
    s.set_content(dump(st->response), "application/json");
  });
}

}  // namespace xpert::server
