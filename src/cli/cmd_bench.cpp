// llama-bench's method: random tokens, one warm-up run, then r timed runs; pp = n_prompt tokens in batches
// of -b, tg = n_gen tokens one at a time. Reports mean ± stddev t/s. With -d DEPTH (llama-bench's -d) each
// run starts after DEPTH tokens already in the context: they are evaluated once, untimed, and each run
// cuts the context back to them (hybrid models through a checkpoint of the recurrent state).
// --parallel N1,N2,.. runs llama-batched-bench's shape on the serving Engine instead (cli/bench_parallel.*);
// --routing uniform makes MoE layers route each token to k experts drawn at random (Model::set_uniform_routing).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "base/cpu_features.h"
#include "base/error.h"
#include "base/log.h"
#include "cli/bench_parallel.h"
#include "cli/commands.h"
#include "runtime/experts/plan.h"
#include "model/model.h"
#include "runtime/experts/routing_stats.h"
#include "runtime/session.h"
#include "runtime/traffic.h"

namespace xpert::cli {
namespace {

struct Result {
  std::string test;
  int64_t n_prompt, n_gen;
  std::vector<double> tps;
  int64_t depth = 0;
  double bytes = 0;  // what one run moves through memory (runtime/traffic.h)
  double tokens() const { return (double)(n_prompt + n_gen); }
  double roofline(double bandwidth) const { return tokens() * bandwidth / bytes; }  // t/s
  double mean() const {
    double s = 0;
    for (double v : tps) s += v;
    return tps.empty() ? 0 : s / tps.size();
  }
  double stddev() const {
    if (tps.size() < 2) return 0;
    double m = mean(), s = 0;
    for (double v : tps) s += (v - m) * (v - m);
    return std::sqrt(s / (tps.size() - 1));
  }
};

// Brings the session to exactly `depth` random tokens: a cut back when it holds them already (the
// depth's tokens are fixed per session), else a fresh evaluation.
void set_depth(Session& s, int64_t depth, const std::vector<int32_t>& depth_tokens) {
  if (depth > 0 && s.n_past() >= depth && s.truncate(depth) == depth) return;
  s.reset();
  if (depth == 0) return;
  s.eval(depth_tokens);
  s.checkpoint();
}

double run_once(Session& s, int64_t depth, const std::vector<int32_t>& depth_tokens, int64_t n_prompt,
                int64_t n_gen, std::mt19937& rng, int64_t n_vocab) {
  std::uniform_int_distribution<int32_t> tok(0, (int32_t)n_vocab - 1);
  set_depth(s, depth, depth_tokens);
  std::vector<int32_t> prompt(n_prompt);
  for (auto& t : prompt) t = tok(rng);
  const auto t0 = std::chrono::steady_clock::now();
  if (n_prompt > 0) s.eval(prompt);
  for (int64_t i = 0; i < n_gen; ++i) {
    int32_t t = tok(rng);
    s.eval(std::span<const int32_t>(&t, 1));
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return (double)(n_prompt + n_gen) / sec;
}

// The bytes one run of a test moves: its prompt in passes of `batch` tokens, or its tokens one at a time,
// after `depth` tokens already in the context.
double run_bytes(const StepTraffic& t, int64_t depth, int64_t n_prompt, int64_t n_gen, int64_t batch) {
  double bytes = 0;
  for (int64_t done = 0; done < n_prompt;) {
    const int64_t n = std::min(batch, n_prompt - done);
    done += n;
    bytes += t.prefill_bytes(n, (double)(depth + done));
  }
  for (int64_t i = 0; i < n_gen; ++i) bytes += t.decode_bytes((double)(depth + i + 1));
  return bytes;
}

}  // namespace

Command add_bench(CLI::App& app) {
  struct Opts {
    ModelFlags m;
    int64_t n_prompt = 512, n_gen = 128;
    int reps = 5;
    std::vector<int64_t> depths = {0};
    std::string output = "md";
    std::string profile_out;
    bool batch_invariant = false;
    std::vector<int> parallel;
    int64_t batch_tokens = 0;
    std::string routing = "model";
    uint32_t routing_seed = 1;
  };
  auto o = std::make_shared<Opts>();
  o->m.add(app, false);
  app.add_option("-p,--n-prompt", o->n_prompt, "prompt tokens (0: skip pp)")->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  app.add_option("-n,--n-gen", o->n_gen, "generated tokens (0: skip tg)")->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  CLI::Option* reps = app.add_option("-r,--repetitions", o->reps, "timed runs per test (with --parallel: default 1)")
                          ->check(CLI::Range(1, 1000));
  app.add_option("-b,--batch-size,--chunk-size", o->m.batch, "prompt tokens per step")->check(CLI::Range((int64_t)1, (int64_t)1 << 16));
  app.add_option("-d,--n-depth", o->depths, "tokens already in the context before each test (comma list)")
      ->delimiter(',')
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 24));
  app.add_flag("--batch-invariant", o->batch_invariant,
               "CPU: the setting `xpert serve` runs by default (every row's bits independent of its batch; the "
               "CPU kernels hold it by construction, so it costs nothing)");
  app.add_option("-o,--output", o->output, "md or json")->check(CLI::IsMember({"md", "json"}));
  app.add_option("--profile-out", o->profile_out,
                 "MoE models: write how often each layer routed to each expert over the benchmarked tokens to this "
                 "file (a routing profile for --expert-profile). Counted where the routing reaches the host: the "
                 "CPU, or layers whose experts are split (--num-gpu-experts below all); counting costs some speed");
  app.add_option("--parallel", o->parallel,
                 "llama-batched-bench's shape on the serving engine: for each N of this comma list, N sequences "
                 "each prefill -p random tokens, then generate -n tokens together; prints prefill, generation and "
                 "total t/s and the time to first token and between tokens")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--batch-tokens", o->batch_tokens,
                 "with --parallel: tokens of one engine step at most, as xpert serve's (default: N * -p, every "
                 "prompt in one step, like llama-batched-bench with -b >= N * PP)")
      ->check(CLI::Range((int64_t)1, (int64_t)1 << 24));
  app.add_option("--routing", o->routing,
                 "MoE models: model (the router's choice) or uniform (each token's top-k drawn uniformly at random, "
                 "a speed measurement without random-weight files' skewed routing; outputs are meaningless)")
      ->check(CLI::IsMember({"model", "uniform"}));
  app.add_option("--routing-seed", o->routing_seed, "the seed of --routing uniform's draws")
      ->check(CLI::Range(1u, 0xffffffffu));
  return [o, reps] {
    cpu::set_batch_invariant(o->batch_invariant);
    if (!o->parallel.empty()) {
      if (reps->count() == 0) o->reps = 1;
      if (o->depths != std::vector<int64_t>{0}) fail("--parallel: -d is not supported (each sequence starts empty)");
      if (!o->profile_out.empty()) fail("--parallel: --profile-out is not supported; profile with one stream");
      if (o->n_prompt < 1) fail("--parallel: -p must be at least 1 (each sequence is a request with a prompt)");
    } else if (o->batch_tokens > 0) {
      fail("--batch-tokens applies to --parallel only");
    }
    const int64_t max_depth = *std::max_element(o->depths.begin(), o->depths.end());
    SessionOptions so{.n_ctx = max_depth + std::max<int64_t>(o->n_prompt + 1, o->n_gen + 1),
                      .n_threads = o->m.threads,
                      .n_batch = o->m.batch,
                      .cache_ram_bytes = (size_t)1 << 30,  // room for the depth's checkpoint (hybrid models)
                      .checkpoint_every = 0,
                      .cache_types = o->m.cache_types()};
    const int max_parallel = o->parallel.empty() ? 1 : *std::max_element(o->parallel.begin(), o->parallel.end());
    const RunMemory mem = o->parallel.empty()
                              ? RunMemory{.n_parallel = 1, .cache_ram_bytes = so.cache_ram_bytes, .n_ctx = so.n_ctx}
                              : RunMemory{.n_parallel = max_parallel, .n_ctx = o->n_prompt + o->n_gen + 2};
    auto model = load_model(o->m, mem);
    const ModelConfig& c = model->config();
    if (o->routing == "uniform") {
      if (c.n_expert <= 0) fail("--routing uniform: {} ({}) has no routed experts", o->m.model, c.arch);
      model->set_uniform_routing(o->routing_seed);
    }
    prefetch_weights(model->file());
    if (!o->parallel.empty())
      return run_parallel_bench(*model, {.n_parallel = o->parallel,
                                         .n_prompt = o->n_prompt,
                                         .n_gen = o->n_gen,
                                         .reps = o->reps,
                                         .prefill_chunk = o->m.batch,
                                         .batch_tokens = o->batch_tokens,
                                         .threads = o->m.threads,
                                         .cache_types = o->m.cache_types(),
                                         .routing = o->routing,
                                         .output = o->output});
    std::unique_ptr<RoutingStats> routing;
    if (!o->profile_out.empty()) {
      if (c.n_expert <= 0) fail("--profile-out: {} ({}) has no routed experts", o->m.model, c.arch);
      routing = std::make_unique<RoutingStats>(*model);
      so.routing_stats = routing.get();
    }
    Session s(*model, so);
    const StepTraffic traffic = StepTraffic::of(*model, so.cache_types);
    std::mt19937 rng(1234);
    std::vector<Result> results;
    for (int64_t depth : o->depths) {
      std::vector<int32_t> depth_tokens(depth);
      std::uniform_int_distribution<int32_t> tok(0, (int32_t)c.n_vocab - 1);
      for (auto& t : depth_tokens) t = tok(rng);
      const std::string at = depth ? fmt::format(" @ d{}", depth) : "";
      std::vector<Result> tests;
      if (o->n_prompt > 0) tests.push_back({fmt::format("pp{}{}", o->n_prompt, at), o->n_prompt, 0, {}, depth});
      if (o->n_gen > 0) tests.push_back({fmt::format("tg{}{}", o->n_gen, at), 0, o->n_gen, {}, depth});
      for (Result& r : tests) {
        run_once(s, depth, depth_tokens, r.n_prompt, r.n_gen, rng, c.n_vocab);  // warm-up
        for (int i = 0; i < o->reps; ++i) {
          r.tps.push_back(run_once(s, depth, depth_tokens, r.n_prompt, r.n_gen, rng, c.n_vocab));
          log::debug("{}: run {} of {}: {:.2f} t/s", r.test, i + 1, o->reps, r.tps.back());
        }
        r.bytes = run_bytes(traffic, r.depth, r.n_prompt, r.n_gen, o->m.batch);
        results.push_back(std::move(r));
      }
    }
    if (routing) {
      if (routing->empty())
        fail("--profile-out: no routing was counted (every MoE layer ran wholly on the GPU: give "
             "--num-gpu-experts below the expert count, or run on the CPU)");
      routing->save(o->profile_out, ModelIdentity::of(*model));
      log::info("routing profile of {} tokens written to {}", routing->max_tokens(), o->profile_out);
    }
    size_t bytes = 0;
    int64_t params = 0;
    for (const auto& t : model->file().tensors()) {
      bytes += t.n_bytes;
      params += t.n_elements();
    }
    const int threads = s.pool().size();
    // The roofline: the device that runs every layer (the host when none is offloaded); none when the layers
    // or their experts are split between devices, whose bandwidths differ.
    double bandwidth = 0;
    std::string where;
    if (model->n_offloaded() == 0 || (model->n_offloaded() == c.n_layer && !model->splits_experts())) {
      Backend* dev = model->n_offloaded() ? model->offload_device() : nullptr;
      where = dev ? dev->name() : "host";
      try {
        bandwidth = copy_bandwidth(dev, s.pool());
      } catch (const std::exception& e) {  // Error from a device's allocation, bad_alloc from the host's
        log::warn("no bandwidth roofline: the copy to measure it failed ({})", e.what());
      }
    }
    const std::string backend = model->n_offloaded()
                                    ? fmt::format("{} ngl={}", model->offload_device()->name(), model->n_offloaded())
                                    : fmt::format("CPU ({})", isa_name(best_isa()));
    if (o->output == "json") {
      nlohmann::json out = nlohmann::json::array();
      for (const Result& r : results) {
        out.push_back({{"model", c.name},
                       {"arch", c.arch},
                       {"model_size", bytes},
                       {"model_n_params", params},
                       {"backend", backend},
                       {"isa", isa_name(best_isa())},
                       {"n_threads", threads},
                       {"n_prompt", r.n_prompt},
                       {"n_gen", r.n_gen},
                       {"n_depth", r.depth},
                       {"avg_ts", r.mean()},
                       {"stddev_ts", r.stddev()},
                       {"samples_ts", r.tps},
                       {"bytes_per_token", r.bytes / r.tokens()}});
        if (bandwidth > 0) {
          out.back()["copy_bandwidth"] = bandwidth;
          out.back()["roofline_ts"] = r.roofline(bandwidth);
        }
      }
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("| model | size | params | backend | threads | test | t/s |\n");
      fmt::print("| ----- | ---: | -----: | ------- | ------: | ---: | --: |\n");
      for (const Result& r : results)
        fmt::print("| {} {} | {:.2f} MiB | {:.2f} M | {} | {} | {} | {:.2f} ± {:.2f} |\n", c.arch, c.name,
                   bytes / 1048576.0, params / 1e6, backend, threads, r.test, r.mean(), r.stddev());
      if (bandwidth > 0) {
        fmt::print(
            "\nroofline: the bytes a test moves at the copy bandwidth of {}, {:.0f} GB/s (read + write)\n",
            where, bandwidth / 1e9);
        for (const Result& r : results) {
          const double roof = r.roofline(bandwidth);
          fmt::print("  {}: {} a token, at most {:.1f} t/s; {:.2f} t/s is {:.1f} % of it\n", r.test,
                     format_bytes(r.bytes / r.tokens()), roof, r.mean(), 100.0 * r.mean() / roof);
        }
      } else if (where.empty()) {
        fmt::print("\nroofline: not measured (the layers or their experts are split between devices)\n");
      }
    }
    return 0;
  };
}

}  // namespace xpert::cli
