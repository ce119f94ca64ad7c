#include "server/context.h"

#include <fmt/format.h>

#include <chrono>
#include <random>

#include "base/error.h"
#include "base/log.h"
#include "server/http_guard.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace xpert::server {

using namespace std::chrono_literals;

ErrorStyle error_style_of(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 || path.rfind("/messages", 0) == 0 ? ErrorStyle::anthropic
                                                                                : ErrorStyle::openai;
}

namespace {

// Anthropic's error types by status.
const char* anthropic_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

}  // namespace

namespace {
std::string anthropic_error_body(int status, const std::string& message, const std::string& param) {
  const std::string text = param.empty() ? message : fmt::format("{}: {}", param, message);
  return dump(ojson{{"type", "error"}, {"error", {{"type", anthropic_type(status)}, {"message", text}}}});
}
}  // namespace

std::string openai_error_event(const ApiError& e) {
  return "data: " + error_body(e.status, e.what(), e.param, e.code, e.type) + "\n\ndata: [DONE]\n\n";
}

std::string anthropic_error_event(const ApiError& e) {
  return "event: error\ndata: " + anthropic_error_body(e.status, e.what(), e.param) + "\n\n";
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param,
                const std::string& code, const std::string& type, ErrorStyle style) {
  res.status = status;
  if (style == ErrorStyle::anthropic) {
    res.set_content(anthropic_error_body(status, message, param), "application/json");
    return;
  }
  res.set_content(error_body(status, message, param, code, type), "application/json");
}

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lk(mu);
  return fmt::format("{}{:016x}", prefix, rng());
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// --- Context -----------------------------------------------------------------------------------------

std::vector<int32_t> Context::tokenize(const std::string& text) const { return tokenize(ChatPrompt{text, {}}); }

std::vector<int32_t> Context::tokenize(const ChatPrompt& prompt) const {
  const Tokenizer& tok = *m.tokenizer;
  std::vector<int32_t> ids = prompt.literal.empty() ? tok.encode(prompt.text, false, true)
                                                    : tok.encode(prompt.text, false, prompt.literal);
  if (tok.add_bos() && tok.bos() != kNoToken && (ids.empty() || ids.front() != tok.bos()))
    ids.insert(ids.begin(), tok.bos());
  return ids;
}

std::string Context::model_name(const std::string& name) const {
  if (name.empty() || name == m.id) return m.id;
  if (!opts.strict_model) return name;
  for (const std::string& a : m.aliases)
    if (name == a) return name;
  throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, m.id), "model",
                 "model_not_found");
}

ChatPrompt Context::render_chat(const ojson& messages, const ojson& tools, const std::string& param) const {
  ChatRenderOptions o;
  o.tools = tools;
  return render_chat(messages, std::move(o), param);
}

ChatPrompt Context::render_chat(const ojson& messages, ChatRenderOptions o, const std::string& param) const {
  o.add_generation_prompt = true;
  o.fallbacks = true;
  try {
    // Prefill: an assistant message last is the start of the answer, which the model continues.
    if (!messages.empty() && messages.back().value("role", "") == "assistant" &&
        !messages.back().contains("tool_calls")) {
      const ojson& last = messages.back();
      std::string prefix;
      if (last["content"].is_string()) {
        prefix = last["content"].get<std::string>();
      } else if (last["content"].is_array()) {
        for (const ojson& part : last["content"]) prefix += part.value("text", "");
      }
      ojson before = ojson::array();
      for (size_t i = 0; i + 1 < messages.size(); ++i) before.push_back(messages[i]);
      // Nothing to render before it: the text itself.
      ChatPrompt p = before.empty() ? ChatPrompt{} : render_chat_prompt(*m.chat_template, *m.tokenizer, before, o);
      for (auto [b, e] : m.tokenizer->control_spans(prefix))
        p.literal.emplace_back(p.text.size() + b, p.text.size() + e);
      p.text += prefix;
      return p;
    }
    return render_chat_prompt(*m.chat_template, *m.tokenizer, messages, o);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template rejected the messages: {}", e.what()), param);
  }
}

void Context::check_prompt_fits(const std::vector<int32_t>& prompt, const std::string& param) const {
  if (prompt.empty()) throw ApiError(400, "the prompt is empty", param);
  const int64_t n_ctx = m.engine->n_ctx();
  for (int32_t t : prompt)
    if (t < 0 || t >= m.tokenizer->n_vocab())
      throw ApiError(400, fmt::format("'{}' token id {} is out of range [0, {})", param, t, m.tokenizer->n_vocab()),
                     param);
  if ((int64_t)prompt.size() >= n_ctx)
    throw ApiError(400,
                   fmt::format("This model's context per slot is {} tokens; the prompt has {} tokens, which leaves "
                               "no room to generate. Shorten the prompt or start the server with a larger -c.",
                               n_ctx, prompt.size()),
                   param, "context_length_exceeded");
}

std::shared_ptr<Job> Context::submit(GenerateParams p, httplib::Response& res) const {
  try {
    return m.engine->submit(std::move(p));
  } catch (const QueueFull& e) {
    res.set_header("Retry-After", "1");
    throw ApiError(503, e.what(), "", "server_overloaded", "server_error");
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
}

// --- Router ------------------------------------------------------------------------------------------

void Router::add(const std::string& method, const std::string& path, Handler h) {
  const ErrorStyle style = error_style_of(path);
  Handler guarded = [h = std::move(h), style](const httplib::Request& req, httplib::Response& res) {
    try {
      h(req, res);
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.param, e.code, e.type, style);
    } catch (const std::bad_alloc&) {
      send_error(res, 500, "out of memory", {}, {}, {}, style);
    } catch (const std::exception& e) {
      log::error("server: {} {}: {}", req.method, req.path, e.what());
      send_error(res, 500, fmt::format("internal error: {}", e.what()), {}, {}, {}, style);
    }
  };
  std::vector<std::string> variants = {path};
  if (path.rfind("/v1/", 0) == 0) variants.push_back(path.substr(3));
  for (const std::string& p : variants) {
    if (method == "GET")
      http_.Get(p, guarded);
    else
      http_.Post(p, guarded);
    routes_.emplace_back(p, method);
    if (p.find('(') == std::string::npos) paths_.insert(p);
  }
}

void Router::get(const std::string& path, Handler h) { add("GET", path, std::move(h)); }
void Router::post(const std::string& path, Handler h) { add("POST", path, std::move(h)); }

void Router::finish() {
  for (auto& [path, method] : routes_) {
    const std::string allowed = method;
    auto h = [allowed, style = error_style_of(path)](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allowed);
      send_error(res, 405, fmt::format("{} is not allowed on {}; use {}", req.method, req.path, allowed), "",
                 "method_not_allowed", {}, style);
    };
    if (method == "GET")
      http_.Post(path, h);
    else
      http_.Get(path, h);
    http_.Put(path, h);
    http_.Patch(path, h);
    http_.Delete(path, h);
  }
}

// --- Jobs ----------------------------------------------------------------------------------------------

bool pump(const Context& ctx, const std::vector<std::shared_ptr<Job>>& jobs,
          const std::function<bool(JobOutput&)>& on, const std::function<bool()>& idle) {
  auto cancel_all = [&] {
    for (auto& j : jobs) j->cancel();
  };
  std::vector<bool> done(jobs.size(), false);
  size_t n_done = 0;
  auto last_news = std::chrono::steady_clock::now(), last_socket_check = last_news;
  JobOutput out;
  while (n_done < jobs.size()) {
    if (ctx.stopping.load()) {
      cancel_all();
      throw ApiError(503, "the server is shutting down", "", "", "server_error");
    }
    bool news = false;
    // One job: block on it. Several: poll each, then block briefly on the first unfinished one.
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (done[i]) continue;
      const auto wait = jobs.size() - n_done == 1 ? 200ms : 0ms;
      if (!jobs[i]->wait(out.update, wait)) continue;
      news = true;
      out.index = i;
      if (out.update.finish != Finish::none) {
        done[i] = true;
        ++n_done;
      }
      if (!on(out)) {
        cancel_all();
        return false;
      }
    }
    // Nobody will read the answer: free the slots now (checked every 100 ms, news or not).
    if (const auto now = std::chrono::steady_clock::now(); now - last_socket_check > 100ms) {
      last_socket_check = now;
      if (GuardedServer::client_gone()) {
        cancel_all();
        throw ApiError(499, "the client closed the connection");
      }
    }
    if (news) {
      last_news = std::chrono::steady_clock::now();
      continue;
    }
    if (jobs.size() - n_done > 1) {
      for (size_t i = 0; i < jobs.size(); ++i)
        if (!done[i]) {
          if (jobs[i]->wait(out.update, 20ms)) {
            out.index = i;
            if (out.update.finish != Finish::none) {
              done[i] = true;
              ++n_done;
            }
            if (!on(out)) {
              cancel_all();
              return false;
            }
            last_news = std::chrono::steady_clock::now();
          }
          break;
        }
    }
    if (idle && std::chrono::steady_clock::now() - last_news > 1s) {
      if (!idle()) {
        cancel_all();
        return false;
      }
      last_news = std::chrono::steady_clock::now();
    }
  }
  return true;
}

std::vector<Collected> collect(const Context& ctx, const std::vector<std::shared_ptr<Job>>& jobs) {
  std::vector<Collected> all(jobs.size());
  pump(ctx, jobs, [&](JobOutput& o) {
    Collected& c = all[o.index];
    c.text += o.update.text;
    for (auto& lp : o.update.logprobs) c.logprobs.push_back(std::move(lp));
    if (o.update.finish != Finish::none) {
      c.finish = o.update.finish;
      c.stop_index = o.update.stop_index;
      if (c.finish == Finish::error) {
        for (auto& j : jobs) j->cancel();
        throw ApiError(500, "generation failed: " + o.update.error);
      }
    }
    return true;
  });
  return all;
}

void stream_sse(httplib::Response& res, std::vector<std::shared_ptr<Job>> jobs, SseProducer producer,
                SseErrorEvent error_event) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [jobs, producer = std::move(producer), error_event](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto send = [&](const std::string& s) {
          if (!ok || !sink.is_writable() || !sink.write(s.data(), s.size())) {
            for (auto& j : jobs) j->cancel();  // the client left: free the slots now
            ok = false;
          }
          return ok;
        };
        try {
          producer(send);
        } catch (const ApiError& e) {
          if (e.status != 499) send(error_event(e));
        } catch (const std::exception& e) {
          send(error_event(ApiError(500, fmt::format("internal error: {}", e.what()))));
        }
        for (auto& j : jobs) j->cancel();
        if (!ok) return false;
        sink.done();
        return true;
      },
      [jobs](bool) {
        for (auto& j : jobs) j->cancel();
      });
}

}  // namespace xpert::server
