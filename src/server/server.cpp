#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "server/openai.h"
#include "server/structured.h"
#include "server/web_ui.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace xpert::server {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* const kRoutes[] = {
    "/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/apply-template"};

std::string endpoint_label(const std::string& path) {
  for (const char* r : kRoutes)
    if (path == r) return r;
  return "other";
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& code = {}, const std::string& type = {}) {
  res.status = status;
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

// OpenAI's `bytes` field: the UTF-8 bytes of a token as integers.
ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back((int)c);
  return b;
}

struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;
  void count(const std::string& endpoint, int status) {
    std::lock_guard lk(mu);
    requests[{endpoint, status}]++;
  }
};

ChatRenderOptions render_options(const CompletionRequest& r) {
  ChatRenderOptions o;
  o.add_generation_prompt = true;
  o.tools = r.tools;
  return o;
}

}  // namespace

struct Server::Impl {
  ServeOptions opts;
  httplib::Server http;
  std::thread listener;
  std::atomic<bool> ready{false}, stopping{false};
  ServedModel m;
  Metrics metrics;
  int bound_port = 0;

  void routes();
  void chat_or_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  std::vector<int32_t> tokenize(const std::string& text) const;
  void check_model(const std::string& name) const;
  std::string metrics_text();
};

// A prompt rendered from a template may already start with the BOS text; do not add a second one.
std::vector<int32_t> Server::Impl::tokenize(const std::string& text) const {
  const Tokenizer& tok = *m.tokenizer;
  std::vector<int32_t> ids = tok.encode(text, false, true);
  if (tok.add_bos() && tok.bos() != kNoToken && (ids.empty() || ids.front() != tok.bos()))
    ids.insert(ids.begin(), tok.bos());
  return ids;
}

void Server::Impl::check_model(const std::string& name) const {
  if (name.empty() || name == m.id) return;
  for (const std::string& a : m.aliases)
    if (name == a) return;
  throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, m.id),
                 "model", "model_not_found");
}

void Server::Impl::chat_or_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  CompletionRequest r = parse_completion_request(req.body, chat);
  check_model(r.model);
  std::vector<int32_t> prompt;
  if (chat) {
    std::string text;
    try {
      text = m.chat_template->render(r.messages, render_options(r));
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("the chat template rejected the messages: {}", e.what()), "messages");
    }
    prompt = tokenize(text);
  } else if (r.prompt_is_tokens) {
    prompt = std::move(r.prompt_tokens);
    for (int32_t t : prompt)
      if (t >= m.tokenizer->n_vocab())
        throw ApiError(400,
                       fmt::format("'prompt' token id {} is out of range [0, {})", t, m.tokenizer->n_vocab()),
                       "prompt");
  } else {
    prompt = tokenize(r.prompt_text);
  }
  if (prompt.empty()) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt");
  check_logit_bias(r.gen, m.tokenizer->n_vocab());
  const int64_t n_ctx = m.engine->n_ctx();
  if ((int64_t)prompt.size() >= n_ctx)
    throw ApiError(
        400,
        fmt::format(
            "This model's context per slot is {} tokens; the prompt has {} tokens, which leaves no room "
            "to generate. Shorten the prompt or start the server with a larger -c.",
            n_ctx, prompt.size()),
        chat ? "messages" : "prompt", "context_length_exceeded");

  r.gen.prompt = std::move(prompt);
  const int64_t n_prompt = (int64_t)r.gen.prompt.size();
  std::shared_ptr<Job> job;
  try {
    job = m.engine->submit(std::move(r.gen));
  } catch (const QueueFull& e) {
    res.set_header("Retry-After", "1");
    throw ApiError(503, e.what(), "", "server_overloaded", "server_error");
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }

  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  const std::string model_name = r.model.empty() ? m.id : r.model;
  const bool want_logprobs = r.logprobs;
  const Tokenizer* tok = m.tokenizer;
  (void)tok;

  auto usage = [job, n_prompt] {
    const int64_t n_gen = job->n_generated();
    return ojson{{"prompt_tokens", n_prompt},
                 {"completion_tokens", n_gen},
                 {"total_tokens", n_prompt + n_gen},
                 {"prompt_tokens_details", ojson{{"cached_tokens", job->n_cached()}}}};
  };
  // Logprobs in OpenAI's chat shape ({content: [...]}) or completions shape (parallel arrays).
  auto logprobs_json = [chat, want_logprobs](const std::vector<TokenLogprob>& lps,
                                             size_t text_offset0) -> ojson {
    if (!want_logprobs) return nullptr;
    if (chat) {
      ojson content = ojson::array();
      for (const TokenLogprob& lp : lps) {
        ojson top = ojson::array();
        for (auto& [piece, l] : lp.top)
          top.push_back({{"token", piece}, {"logprob", l}, {"bytes", bytes_of(piece)}});
        content.push_back({{"token", lp.piece},
                           {"logprob", lp.logprob},
                           {"bytes", bytes_of(lp.piece)},
                           {"top_logprobs", top}});
      }
      return ojson{{"content", content}, {"refusal", nullptr}};
    }
    ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(),
          offsets = ojson::array();
    size_t off = text_offset0;
    for (const TokenLogprob& lp : lps) {
      tokens.push_back(lp.piece);
      token_logprobs.push_back(lp.logprob);
      ojson t = ojson::object();
      for (auto& [piece, l] : lp.top) t[piece] = l;
      top.push_back(t);
      offsets.push_back(off);
      off += lp.piece.size();
    }
    return ojson{{"tokens", tokens},
                 {"token_logprobs", token_logprobs},
                 {"top_logprobs", top},
                 {"text_offset", offsets}};
  };

  if (!r.stream) {
    Job::Update all, u;
    while (true) {
      if (stopping.load()) {
        job->cancel();
        throw ApiError(503, "the server is shutting down", "", "", "server_error");
      }
      if (!job->wait(u, 250ms)) continue;
      all.text += u.text;
      for (auto& lp : u.logprobs) all.logprobs.push_back(std::move(lp));
      if (u.finish != Finish::none) {
        all.finish = u.finish;
        all.error = u.error;
        break;
      }
    }
    if (all.finish == Finish::error) throw ApiError(500, "generation failed: " + all.error);
    ojson choice = ojson::object();
    choice["index"] = 0;
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", all.text}, {"refusal", nullptr}};
    else
      choice["text"] = all.text;
    choice["logprobs"] = logprobs_json(all.logprobs, 0);
    choice["finish_reason"] = finish_name(all.finish);
    ojson out = {{"id", id},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", model_name},
                 {"system_fingerprint", "xpert"},
                 {"choices", ojson::array({choice})},
                 {"usage", usage()}};
    res.set_content(dump(out), "application/json");
    return;
  }

  const bool include_usage = r.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, chat, id, created, model_name, include_usage, usage, logprobs_json](
          size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& s) {
          if (!sink.write(s.data(), s.size())) {
            job->cancel();  // the client left: free its slot now
            return false;
          }
          return true;
        };
        auto chunk = [&](ojson delta_or_text, ojson logprobs, ojson finish) {
          ojson choice = ojson::object();
          choice["index"] = 0;
          if (chat)
            choice["delta"] = std::move(delta_or_text);
          else
            choice["text"] = std::move(delta_or_text);
          choice["logprobs"] = std::move(logprobs);
          choice["finish_reason"] = std::move(finish);
          ojson c = {{"id", id},
                     {"object", chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", created},
                     {"model", model_name},
                     {"system_fingerprint", "xpert"},
                     {"choices", ojson::array({choice})}};
          if (include_usage) c["usage"] = nullptr;
          return "data: " + dump(c) + "\n\n";
        };
        if (chat && !send(chunk(ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)))
          return false;
        size_t text_offset = 0;
        auto last_write = Clock::now();
        Job::Update u;
        while (true) {
          if (stopping.load() || !sink.is_writable()) {
            job->cancel();
            return false;
          }
          if (!job->wait(u, 200ms)) {
            // An SSE comment now and then: clients ignore it, and a closed connection shows up as a
            // failed write even while the request is still queued.
            if (Clock::now() - last_write > 1s) {
              if (!send(": keep-alive\n\n")) return false;
              last_write = Clock::now();
            }
            continue;
          }
          if (!u.text.empty() || !u.logprobs.empty()) {
            ojson body = chat ? ojson{{"content", u.text}} : ojson(u.text);
            if (!send(chunk(std::move(body), logprobs_json(u.logprobs, text_offset), nullptr))) return false;
            text_offset += u.text.size();
            last_write = Clock::now();
          }
          if (u.finish == Finish::none) continue;
          if (u.finish == Finish::error) {
            send("data: " + error_body(500, "generation failed: " + u.error) + "\n\n");
          } else if (u.finish != Finish::cancelled) {
            if (!send(chunk(chat ? ojson::object() : ojson(""), nullptr, finish_name(u.finish))))
              return false;
            if (include_usage) {
              ojson c = {{"id", id},
                         {"object", chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", created},
                         {"model", model_name},
                         {"system_fingerprint", "xpert"},
                         {"choices", ojson::array()},
                         {"usage", usage()}};
              if (!send("data: " + dump(c) + "\n\n")) return false;
            }
          }
          send("data: [DONE]\n\n");
          sink.done();
          return true;
        }
      },
      [job](bool) { job->cancel(); });
}

std::string Server::Impl::metrics_text() {
  std::string out;
  out +=
      "# HELP xpert_requests_total HTTP requests by endpoint and status code.\n# TYPE xpert_requests_total "
      "counter\n";
  {
    std::lock_guard lk(metrics.mu);
    for (auto& [k, n] : metrics.requests)
      out += fmt::format("xpert_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
  }
  Engine::Stats s;
  if (ready.load()) s = m.engine->stats();
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, value);
  };
  metric("xpert_prompt_tokens_total", "counter", "Prompt tokens of admitted requests (cached + evaluated).",
         s.prompt_tokens_total);
  metric("xpert_prompt_tokens_cached_total", "counter",
         "Prompt tokens resumed from cached state (a slot's own or the state cache), not evaluated.",
         s.prompt_tokens_cached);
  metric("xpert_prompt_tokens_evaluated_total", "counter", "Prompt tokens evaluated.", s.prompt_tokens);
  metric("xpert_checkpoint_hits_total", "counter",
         "Hybrid models: requests that resumed from a checkpoint of the recurrent state.", s.checkpoint_hits);
  metric("xpert_checkpoint_misses_total", "counter",
         "Hybrid models: requests that had no checkpoint to resume from and started at position 0.",
         s.checkpoint_misses);
  metric("xpert_checkpoints_stored_total", "counter", "Recurrent checkpoints saved to the state cache.",
         s.checkpoints_stored);
  metric("xpert_cache_checkpoints", "gauge", "Recurrent checkpoints held by the state cache.",
         s.cache.n_checkpoints);
  metric("xpert_cache_tokens", "gauge", "Positions whose KV rows the state cache holds.", s.cache.n_tokens);
  metric("xpert_cache_bytes", "gauge", "Bytes held by the state cache.", s.cache.bytes);
  metric("xpert_cache_budget_bytes", "gauge", "The state cache's budget (--cache-ram).",
         s.cache.budget_bytes);
  metric("xpert_cache_evictions_total", "counter",
         "Runs of KV rows or checkpoints evicted from the state cache.", s.cache.evictions);
  metric("xpert_generated_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
  metric("xpert_routed_tokens_total", "counter",
         "MoE models: tokens whose expert routing was counted (layers computed on the host or split).",
         s.routed_tokens);
  metric("xpert_routing_top_quarter_share", "gauge",
         "MoE models: share of routings taken by each layer's most routed quarter of experts, averaged over "
         "layers (0.25: flat routing; higher: placing experts by --expert-profile pays more).",
         s.top_quarter_share);
  metric("xpert_expert_moves_total", "counter",
         "MoE models with --rebalance-experts: experts moved between the GPU and the host while serving.",
         s.expert_moves);
  metric("xpert_expert_rebalance_rounds_total", "counter",
         "MoE models with --rebalance-experts: rebalancing rounds run (with or without moves).",
         s.rebalance_rounds);
  metric("xpert_generated_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
         s.tokens_per_second);
  metric("xpert_forward_seconds_total", "counter", "Time spent in batched forward passes.",
         s.forward_seconds);
  metric("xpert_engine_steps_total", "counter", "Batched forward passes.", s.steps);
  metric("xpert_queue_depth", "gauge", "Requests waiting for a slot.", s.queue_depth);
  metric("xpert_busy_slots", "gauge", "Slots prefilling or generating.", s.busy_slots);
  metric("xpert_slots", "gauge", "Slots (--parallel).", ready.load() ? m.engine->n_parallel() : 0);
  metric("xpert_ready", "gauge", "1 once the model is loaded.", ready.load() ? 1 : 0);
  return out;
}

void Server::Impl::routes() {
  using httplib::Request;
  using httplib::Response;
  using HR = httplib::Server::HandlerResponse;

  http.set_payload_max_length(opts.max_body_bytes);
  const int n_threads = std::max(4, opts.n_http_threads);
  http.new_task_queue = [n_threads] { return new httplib::ThreadPool((size_t)n_threads); };

  http.set_pre_routing_handler([this](const Request& req, Response& res) {
    if (req.path.rfind("/v1/", 0) != 0 && req.path != "/apply-template") return HR::Unhandled;
    if (!opts.api_key.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      if (auth.empty()) {
        send_error(res, 401, "Missing API key: send the header 'Authorization: Bearer <key>'", "",
                   "invalid_api_key", "invalid_request_error");
        return HR::Handled;
      }
      if (auth != "Bearer " + opts.api_key) {
        send_error(res, 401, "Incorrect API key provided", "", "invalid_api_key", "invalid_request_error");
        return HR::Handled;
      }
    }
    if (!ready.load()) {
      res.set_header("Retry-After", "1");
      send_error(res, 503, "the model is still loading; retry when /health returns 200", "", "model_loading",
                 "server_error");
      return HR::Handled;
    }
    return HR::Unhandled;
  });

  // Handlers turn ApiError into its status; anything else unexpected into a 500. Never a crash.
  auto guarded = [](auto fn) {
    return [fn](const Request& req, Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e.status, e.what(), e.param, e.code, e.type);
      } catch (const std::bad_alloc&) {
        send_error(res, 500, "out of memory");
      } catch (const std::exception& e) {
        log::error("server: {} {}: {}", req.method, req.path, e.what());
        send_error(res, 500, fmt::format("internal error: {}", e.what()));
      }
    };
  };

  add_web_ui_routes(http);  // GET / and the page's /web/ files
  http.Get("/health", [this](const Request&, Response& res) {
    if (ready.load()) {
      res.set_content(R"({"status":"ok"})", "application/json");
    } else {
      res.status = 503;
      res.set_header("Retry-After", "1");
      res.set_content(error_body(503, "the model is still loading", "", "model_loading", "server_error"),
                      "application/json");
    }
  });
  http.Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/v1/models", [this](const Request&, Response& res) {
    ojson model = {{"id", m.id},
                   {"object", "model"},
                   {"created", 0},
                   {"owned_by", "xpert"},
                   {"meta",
                    {{"n_ctx_per_slot", m.engine->n_ctx()},
                     {"n_parallel", m.engine->n_parallel()},
                     {"arch", m.model->config().arch},
                     {"n_vocab", m.model->config().n_vocab}}}};
    res.set_content(dump(ojson{{"object", "list"}, {"data", ojson::array({model})}}), "application/json");
  });
  http.Post("/v1/chat/completions",
            guarded([this](const Request& q, Response& s) { chat_or_completion(q, s, true); }));
  http.Post("/v1/completions",
            guarded([this](const Request& q, Response& s) { chat_or_completion(q, s, false); }));
  // The prompt a chat request renders to (as llama.cpp's server has it): for debugging templates.
  http.Post("/apply-template", guarded([this](const Request& q, Response& s) {
              CompletionRequest r = parse_completion_request(q.body, true);
              std::string text;
              try {
                text = m.chat_template->render(r.messages, render_options(r));
              } catch (const Error& e) {
                throw ApiError(400, fmt::format("the chat template rejected the messages: {}", e.what()),
                               "messages");
              }
              s.set_content(dump(ojson{{"prompt", text}}), "application/json");
            }));

  // Known paths with the wrong method: 405 with Allow.
  struct Route {
    const char* path;
    bool get;
  };
  const Route known[] = {{"/", true},
                         {"/health", true},
                         {"/metrics", true},
                         {"/v1/models", true},
                         {"/v1/chat/completions", false},
                         {"/v1/completions", false},
                         {"/apply-template", false}};
  for (const Route& r : known) {
    const std::string allowed = r.get ? "GET" : "POST";
    auto h = [allowed](const Request& req, Response& res) {
      res.set_header("Allow", allowed);
      send_error(res, 405, fmt::format("{} is not allowed on {}; use {}", req.method, req.path, allowed), "",
                 "method_not_allowed");
    };
    if (r.get)
      http.Post(r.path, h);
    else
      http.Get(r.path, h);
    http.Put(r.path, h);
    http.Patch(r.path, h);
    http.Delete(r.path, h);
  }

  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
    if (!res.body.empty()) return HR::Unhandled;  // a handler already wrote the error
    switch (res.status) {
      case 404:
        send_error(res, 404, fmt::format("Unknown route: {} {}", req.method, req.path), "", "not_found");
        break;
      case 413:
        send_error(res, 413,
                   fmt::format("the request body is larger than the limit of {} bytes (--max-body)",
                               opts.max_body_bytes),
                   "", "request_too_large");
        break;
      case 400:
        send_error(res, 400, "malformed HTTP request");
        break;
      default:
        send_error(res, res.status, fmt::format("HTTP error {}", res.status));
    }
    return HR::Handled;
  }));
  http.set_exception_handler([](const Request& req, Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log::error("server: {} {}: {}", req.method, req.path, what);
    send_error(res, 500, "internal error: " + what);
  });
  http.set_logger([this](const Request& req, const Response& res) {
    metrics.count(endpoint_label(req.path), res.status);
    log::info("{} {} {}", req.method, req.path, res.status);
  });
}

Server::Server(const ServeOptions& opts) : impl_(std::make_unique<Impl>()) { impl_->opts = opts; }

Server::~Server() {
  stop();
  wait();
}

void Server::start() {
  impl_->routes();
  if (impl_->opts.port == 0) {
    impl_->bound_port = impl_->http.bind_to_any_port(impl_->opts.host);
    if (impl_->bound_port <= 0) fail("cannot listen on {} (any port)", impl_->opts.host);
  } else {
    if (!impl_->http.bind_to_port(impl_->opts.host, impl_->opts.port))
      fail("cannot listen on {}:{}: the address is in use or not available (try another --port)",
           impl_->opts.host, impl_->opts.port);
    impl_->bound_port = impl_->opts.port;
  }
  impl_->listener = std::thread([this] { impl_->http.listen_after_bind(); });
}

void Server::set_ready(const ServedModel& m) {
  impl_->m = m;
  impl_->ready.store(true);
}

void Server::stop() {
  impl_->stopping.store(true);
  // httplib's stop() does nothing until the listener thread has entered its loop: a stop right after
  // start() (a model that fails to load) would leave wait() joining a listener that never ends. It
  // enters at once; the bound covers a listener that already returned.
  if (impl_->listener.joinable())
    for (int i = 0; i < 2000 && !impl_->http.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

void Server::wait() {
  if (impl_->listener.joinable()) impl_->listener.join();
}

int Server::port() const { return impl_->bound_port; }

}  // namespace xpert::server
