// `xpert serve`: the OpenAI-compatible server (src/server) over the batching engine (src/runtime/engine).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "backend/cpu/matmul.h"
#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "model/model.h"
#include "runtime/experts/routing_stats.h"
#include "runtime/engine.h"
#include "runtime/experts/rebalancer.h"
#include "runtime/state_cache.h"
#include "server/access.h"
#include "server/server.h"
#include "text/builtin_templates.h"
#include "text/tokenizer.h"

namespace xpert::cli {

Command add_serve(CLI::App& app) {
  struct Opts {
    ModelFlags m;
    server::ServeOptions http;
    int parallel = 4;
    int queue = 64;
    int64_t batch_tokens = 0;  // 0: --parallel + -b
    bool batch_invariant = true;
    int64_t cache_ram_mib = -1;  // -1: default_cache_ram_bytes()
    int64_t checkpoint_every = 1024;
    std::string profile_out;
    int64_t rebalance_every = 0;  // --rebalance-experts; 0: off
    int64_t rebalance_moves = 4;
    std::string alias, pooling, chat_template, chat_template_file;
  };
  auto o = std::make_shared<Opts>();
  o->m.batch = 128;  // prefill chunk per step: small, so a long prompt does not stall the running streams
  o->m.add(app);
  app.add_option("--host", o->http.host, "address to listen on (default 127.0.0.1: this machine only)");
  app.add_option("--port", o->http.port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--parallel", o->parallel, "sequences generated at once (slots); -c is per slot")
      ->check(CLI::Range(1, 256));
  app.add_option("--api-key", o->http.api_key,
                 "require 'Authorization: Bearer KEY' on every route but the chat page and /health");
  app.add_option_function<std::string>(
      "--cors-origins", [o](const std::string& v) { o->http.cors_origins = server::split_list(v); },
      "comma-separated origins (e.g. http://localhost:3000) whose pages may call the API besides the "
      "served chat page; '*': any (default: none)");
  app.add_option_function<std::string>(
      "--allowed-hosts", [o](const std::string& v) { o->http.allowed_hosts = server::split_list(v); },
      "comma-separated Host names to answer besides IP addresses, localhost and this machine's name (e.g. "
      "the name of a reverse proxy); '*': any. Other names get 403, against DNS rebinding");
  app.add_option("--max-connections", o->http.max_connections,
                 "open HTTP connections at most; at the cap the oldest idle or still-sending one is closed "
                 "(default 256)")
      ->check(CLI::Range(8, 65536));
  app.add_option_function<double>(
         "--header-timeout", [o](double s) { o->http.header_timeout_ms = (int)(s * 1000); },
         "seconds a client has to send a request's headers (default 10; 408 after)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option_function<double>(
         "--body-timeout", [o](double s) { o->http.body_timeout_ms = (int)(s * 1000); },
         "seconds a client has to send a request's body (default 60; 408 after)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--batch-tokens", o->batch_tokens,
                 "tokens of one engine step at most: every generating slot's next token always, then prompt chunks "
                 "(at most -b each) shared evenly by the prompts waiting, so a long prompt stalls neither the "
                 "streams nor a short prompt (default: --parallel + -b)")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  app.add_option("--queue", o->queue, "requests that may wait for a slot before new ones get 503")
      ->check(CLI::Range(0, 4096));
  app.add_option("--max-body", o->http.max_body_bytes, "largest request body in bytes (413 above)")
      ->check(CLI::Range((size_t)1024, (size_t)1 << 30));
  app.add_option("--alias", o->alias, "the model id /v1/models lists and responses report (default: the file stem)");
  app.add_flag("--batch-invariant,!--no-batch-invariant", o->batch_invariant,
               "CPU: every row's result has the same bits whatever it is batched with, so a request with a "
               "seed gives the same text whatever the other traffic and the state cache (default on; the CPU "
               "kernels hold it by construction, so off changes no kernel)");
  app.add_flag("--strict-model", o->http.strict_model,
               "a request naming another model than the served one (or its aliases) is a 404 (default: served "
               "by the one model)");
  app.add_option("--pooling", o->pooling,
                 "/v1/embeddings: how hidden states become one vector (default: the model's metadata, else mean)")
      ->check(CLI::IsMember({"mean", "last", "cls"}));
  app.add_option("--chat-template", o->chat_template,
                 "use a built-in chat template instead of the model's (chatml, gemma3)");
  app.add_option("--chat-template-file", o->chat_template_file,
                 "use this Jinja chat template file instead of the model's");
  app.add_option("--cache-ram", o->cache_ram_mib,
                 "MiB of RAM for the state cache that keeps conversations' KV rows and recurrent checkpoints "
                 "across requests (0: off; default: 8192, or a quarter of RAM when less)")
      ->check(CLI::Range((int64_t)-1, (int64_t)1 << 30));
  app.add_option("--checkpoint-every", o->checkpoint_every,
                 "hybrid models: also checkpoint the recurrent state every N tokens (0: only at prompt and "
                 "request ends)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 30));
  app.add_option("--profile-out", o->profile_out,
                 "MoE models: at shutdown, write how often each layer routed to each expert while serving to this "
                 "file (a routing profile: pass it as --expert-profile, or name it MODEL.xpert-profile.json, so "
                 "the next start puts the most used experts on the GPU)");
  app.add_option("--rebalance-experts", o->rebalance_every,
                 "MoE with experts split between the GPU and the host: every N tokens forwarded, move experts "
                 "now routed clearly more than resident ones to the GPU in their place (0: off, the default: a "
                 "move re-records CUDA graphs and, with more than 2 experts per token, can change the last bits "
                 "of outputs)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 40));
  app.add_option("--rebalance-moves", o->rebalance_moves,
                 "with --rebalance-experts: at most this many experts moved per layer per round (bounds the copy "
                 "time of a round; default 4)")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 20));
  return [o] {
    // SIGINT / SIGTERM are taken by one thread with sigwait, so stopping is not done in a signal handler.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that closes mid-write is an error return, not a signal

    if (!o->chat_template.empty() && !o->chat_template_file.empty())
      fail("--chat-template and --chat-template-file both given; pass one");
    if (!o->chat_template_file.empty() && !std::filesystem::is_regular_file(o->chat_template_file))
      fail("--chat-template-file {}: no such file", o->chat_template_file);
    if (!o->profile_out.empty()) {
      const std::filesystem::path dir = std::filesystem::absolute(o->profile_out).parent_path();
      if (!std::filesystem::is_directory(dir))
        fail("--profile-out {}: the folder {} does not exist", o->profile_out, dir.string());
    }
    server::Server srv(o->http);
    srv.start();
    log::info("listening on http://{}:{} (loading {})", o->http.host, srv.port(), o->m.model);
    // The first SIGINT/SIGTERM stops accepting and ends the requests in flight; the process exits within
    // 5 s whatever still runs (a model still loading, a stuck client); a second signal exits at once.
    std::thread signals([&srv, set] {
      int sig = 0;
      sigwait(&set, &sig);
      log::info("signal {}: stopping (a second signal exits at once)", sig);
      std::thread([set] {
        int again = 0;
        timespec grace{5, 0};
        siginfo_t info;
        again = sigtimedwait(&set, &info, &grace);
        if (again > 0) log::warn("signal {} again: exiting now", again);
        else log::warn("still stopping after 5 s: exiting now");
        std::fflush(nullptr);
        _exit(again > 0 ? 128 + again : 1);
      }).detach();
      srv.stop();
    });
    signals.detach();

    const size_t cache_ram = o->cache_ram_mib < 0 ? default_cache_ram_bytes() : (size_t)o->cache_ram_mib << 20;
    auto model = load_model(o->m, {.n_parallel = std::max(1, o->parallel), .cache_ram_bytes = cache_ram, .n_ctx = 0});
    std::unique_ptr<ExpertRebalancer> rebalancer;
    if (o->rebalance_every > 0) {
      if (!model->splits_experts())
        fail("--rebalance-experts: no GPU layer of {} keeps experts on the host, so no expert can move; it "
             "applies to a MoE model with -ngl and --num-gpu-experts or --gpu-expert-budget below its experts",
             o->m.model);
      rebalancer = std::make_unique<ExpertRebalancer>(
          *model, ExpertRebalancerOptions{.every_tokens = o->rebalance_every,
                                          .decay = 0.5,
                                          .plan = {.max_moves_per_layer = o->rebalance_moves,
                                                   .min_gain = 0.5,
                                                   .min_z = 3.0}});
      log::info("rebalancing experts every {} tokens, at most {} per layer per round", o->rebalance_every,
                o->rebalance_moves);
    }
    prefetch_weights(model->file());
    auto tok = Tokenizer::from_gguf(model->file());
    const ChatTemplate tmpl = chat_template_override(model->file(), o->chat_template, o->chat_template_file);
    // Pooling for /v1/embeddings: the flag, else llama.cpp's {arch}.pooling_type (1 mean, 2 cls, 3 last).
    Pooling pooling = Pooling::mean;
    if (o->pooling == "last") pooling = Pooling::last;
    if (o->pooling == "cls") pooling = Pooling::cls;
    if (o->pooling.empty()) {
      const auto t = model->file().get_int(model->config().arch + ".pooling_type");
      if (t == 2) pooling = Pooling::cls;
      if (t == 3) pooling = Pooling::last;
    }
    cpu::set_batch_invariant(o->batch_invariant);
    Engine engine(*model, *tok,
                  {.n_parallel = o->parallel,
                   .n_ctx = o->m.ctx,
                   .n_threads = o->m.threads,
                   .prefill_chunk = o->m.batch,
                   .batch_tokens = o->batch_tokens,
                   .max_queue = o->queue,
                   .cache_ram_bytes = cache_ram,
                   .checkpoint_every = o->checkpoint_every,
                   .cache_types = o->m.cache_types(),
                   .rebalancer = rebalancer.get()});
    const std::filesystem::path path(o->m.model);
    server::ServedModel served{.model = model.get(),
                               .tokenizer = tok.get(),
                               .chat_template = &tmpl,
                               .engine = &engine,
                               .id = o->alias.empty() ? path.stem().string() : o->alias,
                               .aliases = {path.filename().string(), o->m.model},
                               .path = o->m.model,
                               .pooling = pooling};
    if (!o->alias.empty()) served.aliases.push_back(path.stem().string());
    if (!model->config().name.empty()) served.aliases.push_back(model->config().name);
    srv.set_ready(served);
    log::info("ready: model '{}' on http://{}:{} ({} slots of {} tokens)", served.id, o->http.host,
              srv.port(), o->parallel, engine.n_ctx());
    // The port line on stdout lets scripts that pass --port 0 find the server.
    std::printf("xpert serve: listening on http://%s:%d\n", o->http.host.c_str(), srv.port());
    std::fflush(stdout);
    srv.wait();
    if (!o->profile_out.empty()) {
      const RoutingStats* r = engine.routing();
      if (!r) {
        log::warn("--profile-out: {} is not a MoE model; no profile written", o->m.model);
      } else if (r->empty()) {
        log::warn("--profile-out: no routing was counted (every MoE layer ran wholly on the GPU, or no "
                  "request came); no profile written");
      } else {
        r->save(o->profile_out, ModelIdentity::of(*model));
        log::info("routing profile of {} tokens written to {}", r->max_tokens(), o->profile_out);
      }
    }
    return 0;
  };
}

}  // namespace xpert::cli
