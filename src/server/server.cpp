#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "server/access.h"
#include "server/context.h"
#include "server/http_guard.h"
#include "server/openai.h"
#include "server/web_ui.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace xpert::server {

namespace {

struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;
  void count(const std::string& endpoint, int status) {
    std::lock_guard lk(mu);
    requests[{endpoint, status}]++;
  }
};

// Paths that answer without the API key and while the model loads (they say so themselves).
bool public_path(const std::string& path) {
  return path == "/" || path == "/health" || path == "/v1/health" || path == "/metrics" || path.rfind("/web/", 0) == 0;
}

}  // namespace

struct Server::Impl {
  Context ctx;
  GuardedServer http;
  std::thread listener;
  Metrics metrics;
  std::set<std::string> paths;  // registered, for the metrics' endpoint label
  int bound_port = 0;

  void routes();
  std::string metrics_text();
  std::string endpoint_label(const std::string& path) const {
    return paths.count(path) ? path : path.rfind("/v1/models/", 0) == 0 ? "/v1/models/{id}" : "other";
  }
};

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
  if (ctx.ready.load()) s = ctx.m.engine->stats();
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
  auto summary = [&](const char* name, const char* help, double p50, double p90, double sum, uint64_t count) {
    out += fmt::format(
        "# HELP {0} {1}\n# TYPE {0} summary\n{0}{{quantile=\"0.5\"}} {2}\n{0}{{quantile=\"0.9\"}} {3}\n"
        "{0}_sum {4}\n{0}_count {5}\n",
        name, help, p50, p90, sum, count);
  };
  summary("xpert_time_to_first_token_seconds",
          "From a request's submission to the engine (queueing included) to its first token; quantiles over the "
          "last 4096 requests.",
          s.ttft_p50, s.ttft_p90, s.ttft_sum, s.ttft_count);
  summary("xpert_inter_token_latency_seconds",
          "Between a request's consecutive tokens; quantiles over the last 65536 tokens.", s.itl_p50, s.itl_p90,
          s.itl_sum, s.itl_count);
  metric("xpert_forward_seconds_total", "counter", "Time spent in batched forward passes.",
         s.forward_seconds);
  metric("xpert_engine_steps_total", "counter", "Batched forward passes.", s.steps);
  metric("xpert_queue_depth", "gauge", "Requests waiting for a slot.", s.queue_depth);
  metric("xpert_busy_slots", "gauge", "Slots prefilling or generating.", s.busy_slots);
  metric("xpert_slots", "gauge", "Slots (--parallel).", ctx.ready.load() ? ctx.m.engine->n_parallel() : 0);
  metric("xpert_ready", "gauge", "1 once the model is loaded.", ctx.ready.load() ? 1 : 0);
  return out;
}

void Server::Impl::routes() {
  using httplib::Request;
  using httplib::Response;
  using HR = httplib::Server::HandlerResponse;

  http.set_limits({.max_body_bytes = ctx.opts.max_body_bytes,
                   .header_timeout_ms = ctx.opts.header_timeout_ms,
                   .body_timeout_ms = ctx.opts.body_timeout_ms,
                   .max_connections = ctx.opts.max_connections});
  http.set_reject_counter([this](int status) { metrics.count("other", status); });

  // Host, Origin and the key (OpenAI's 'Authorization: Bearer KEY' or Anthropic's 'x-api-key: KEY') for
  // every route but the chat page and /health; then, while the model loads, 503 but for public paths.
  auto access = std::make_shared<AccessPolicy>(AccessOptions{.api_key = ctx.opts.api_key,
                                                             .cors_origins = ctx.opts.cors_origins,
                                                             .allowed_hosts = ctx.opts.allowed_hosts,
                                                             .bind_host = ctx.opts.host});
  http.set_pre_routing_handler([this, access](const Request& req, Response& res) {
    const ErrorStyle style = error_style_of(req.path);
    if (const auto refusal = access->check(req, res)) {
      if (refusal->status) send_error(res, refusal->status, refusal->message, "", refusal->code,
                                      "invalid_request_error", style);
      return HR::Handled;
    }
    if (public_path(req.path)) return HR::Unhandled;
    if (!ctx.ready.load()) {
      res.set_header("Retry-After", "1");
      send_error(res, 503, "the model is still loading; retry when /health returns 200", "", "model_loading",
                 "server_error", style);
      return HR::Handled;
    }
    return HR::Unhandled;
  });

  add_web_ui_routes(http);  // GET / and the page's /web/ files
  http.Get("/health", [this](const Request&, Response& res) {
    if (ctx.ready.load()) {
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

  Router router(http, ctx);
  add_text_routes(router);
  add_completion_routes(router);
  add_embedding_routes(router);
  add_anthropic_routes(router);
  add_responses_routes(router);
  router.finish();
  paths = router.paths();
  for (const char* p : {"/health", "/metrics"}) {
    paths.insert(p);
    auto h = [allowed = std::string("GET")](const Request& req, Response& res) {
      res.set_header("Allow", allowed);
      send_error(res, 405, fmt::format("{} is not allowed on {}; use {}", req.method, req.path, allowed), "",
                 "method_not_allowed");
    };
    http.Post(p, h);
    http.Put(p, h);
    http.Patch(p, h);
    http.Delete(p, h);
  }

  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
    if (!res.body.empty()) return HR::Unhandled;  // a handler already wrote the error
    switch (res.status) {
      case 404:
        send_error(res, 404, fmt::format("Unknown route: {} {}", req.method, req.path), "", "not_found", {},
                   error_style_of(req.path));
        break;
      case 413:
        send_error(res, 413,
                   fmt::format("the request body is larger than the limit of {} bytes (--max-body)",
                               ctx.opts.max_body_bytes),
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

Server::Server(const ServeOptions& opts) : impl_(std::make_unique<Impl>()) { impl_->ctx.opts = opts; }

Server::~Server() {
  stop();
  wait();
}

void Server::start() {
  impl_->routes();
  if (impl_->ctx.opts.port == 0) {
    impl_->bound_port = impl_->http.bind_to_any_port(impl_->ctx.opts.host);
    if (impl_->bound_port <= 0) fail("cannot listen on {} (any port)", impl_->ctx.opts.host);
  } else {
    if (!impl_->http.bind_to_port(impl_->ctx.opts.host, impl_->ctx.opts.port))
      fail("cannot listen on {}:{}: the address is in use or not available (try another --port)",
           impl_->ctx.opts.host, impl_->ctx.opts.port);
    impl_->bound_port = impl_->ctx.opts.port;
  }
  impl_->listener = std::thread([this] { impl_->http.listen_after_bind(); });
}

void Server::set_ready(const ServedModel& m) {
  impl_->ctx.m = m;
  impl_->ctx.ready.store(true);
}

void Server::stop() {
  impl_->ctx.stopping.store(true);
  impl_->http.begin_stop();
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
