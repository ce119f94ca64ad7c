#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/placement.h"
#include "backend/stream_share.h"
#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "runtime/memory_plan.h"

namespace xpert::cli {

void ModelFlags::add(CLI::App& app, bool with_ctx) {
  app.add_option("-m,--model", model, "model file (GGUF)")->required();
  app.add_option("-t,--threads", threads, "CPU threads (default: physical cores)")->check(CLI::Range(0, 1024));
  if (with_ctx) {
    app.add_option("-c,--ctx-size", ctx, "context size in tokens per slot (0: the model's trained maximum; default: 4096, or that maximum when less)")->check(CLI::Range((int64_t)0, (int64_t)1 << 24));
    app.add_option("-b,--batch-size,--chunk-size", batch,
                   "prompt tokens evaluated per step: prompts are prefilled in chunks of this many (bounds the scratch)")
        ->check(CLI::Range((int64_t)1, (int64_t)1 << 16));
  }
  app.add_option("--cache-type-k", cache_type_k, "-ctk: KV cache type of K: f16, q8_0, q4_0 (default f16)");
  app.add_option("--cache-type-v", cache_type_v, "-ctv: KV cache type of V: f16, q8_0, q4_0 (default f16)");
  app.add_option("--device", device, "where the layers run: cpu, cuda:N or opencl:N (default: cuda:0 when there is a GPU; `xpert devices` lists them)");
  app.add_option("--n-gpu-layers", n_gpu_layers, "-ngl: the last N layers on the GPU (default: all when there is one)")
      ->check(CLI::Range((int64_t)-1, (int64_t)1 << 20));
  app.add_option("--num-gpu-experts", num_gpu_experts,
                 "MoE: experts per GPU layer kept on the GPU, the most routed first (default: all)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  app.add_option("--gpu-expert-budget", gpu_expert_budget,
                 "MoE: GPU memory for experts over all GPU layers, e.g. 12GiB or 800MiB (instead of --num-gpu-experts)");
  app.add_option("--expert-device", expert_device,
                 "MoE: where the experts not on the GPU run: cpu (default), opencl:N, or opencl:N,cpu (the two "
                 "together, each batch's host experts shared by --expert-share)");
  app.add_option("--expert-share", expert_share,
                 "MoE with --expert-device opencl:N,cpu: the share of the host experts' rows the OpenCL device "
                 "computes, 0 to 1, or decode,prefill (default: measured on this machine once, then cached)");
  app.add_option("--stream-experts", stream_experts,
                 "MoE: batches of at least N tokens copy the host's experts to the GPU instead of computing them "
                 "on the CPU (0: never; default: the measured crossover)")
      ->check(CLI::Range((int64_t)0, (int64_t)1 << 20));
  app.add_option("--stream-share", stream_share,
                 "MoE: of the host experts a smaller batch uses, the share copied to the GPU while the CPU computes "
                 "the rest: auto (default: as many as balance the measured copy and CPU rates), or 0 to 1 (0: the "
                 "CPU computes them all, inside the step's CUDA graph)");
  app.add_option("--expert-profile", expert_profile,
                 "MoE: routing profile that picks the GPU experts (default: MODEL.xpert-profile.json when it exists; "
                 "none: by index)");
}

KvTypes ModelFlags::cache_types() const { return {.k = parse_kv_type(cache_type_k), .v = parse_kv_type(cache_type_v)}; }

PlacementOptions placement_options(const ModelFlags& f) {
  return {.device = f.device,
          .n_gpu_layers = f.n_gpu_layers,
          .num_gpu_experts = f.num_gpu_experts,
          .gpu_expert_budget = f.gpu_expert_budget,
          .expert_device = f.expert_device,
          .expert_share = f.expert_share,
          .expert_profile = f.expert_profile,
          .stream_experts = f.stream_experts,
          .stream_share = parse_stream_share(f.stream_share),
          .gpu_extra_bytes = 0};
}

namespace {
size_t file_weight_bytes(const Model& m) {
  size_t n = 0;
  for (const auto& t : m.file().tensors()) n += t.n_bytes;
  return n;
}
}  // namespace

std::unique_ptr<Model> load_model(ModelFlags& f, const RunMemory& r) {
  PlacementOptions po = placement_options(f);
  // GPTQ experts natively where every expert executor reads them so (CPU, OpenCL expert device, CUDA).
  std::unique_ptr<Model> m = Model::load(f.model, {.native_gptq_experts = native_gptq_experts(po)});
  const ModelConfig& c = m->config();
  if (r.n_ctx <= 0) f.ctx = resolve_ctx_flag(c, f.ctx);
  const MemoryPlan mp = plan_memory(c, plan_placement(*m, po),
                                    {.n_ctx = r.n_ctx > 0 ? r.n_ctx : f.ctx,
                                     .n_parallel = r.n_parallel,
                                     .n_batch = f.batch,
                                     .cache_ram_bytes = r.cache_ram_bytes,
                                     // HF folders too: what their conversion owns is allocated already
                                     .weights_mapped = true,
                                     .file_weight_bytes = file_weight_bytes(*m),
                                     .host_available = host_available_memory(),
                                     .cache_types = f.cache_types()});
  std::string summary = mp.summary();
  summary.pop_back();
  log::info("{}", summary);
  const std::string warning = mp.check();
  if (!warning.empty()) log::warn("{}", warning);
  // The expert plan's own fit check then counts what else the GPU holds.
  if (mp.gpu) po.gpu_extra_bytes = mp.gpu->kv + mp.gpu->recurrent + mp.gpu->scratch;
  place_model(*m, po);
  return m;
}

void add_sampling_flags(CLI::App& app, SamplingParams& sp) {
  app.add_option("--temp", sp.temperature, "temperature; 0 is greedy");
  app.add_option("--top-k", sp.top_k, "top-k (0: off)");
  app.add_option("--top-p", sp.top_p, "top-p (1: off)");
  app.add_option("--min-p", sp.min_p, "min-p (0: off)");
  app.add_option("--repeat-penalty", sp.repeat_penalty, "repetition penalty (1: off)");
  app.add_option("-s,--seed", sp.seed, "sampling seed");
}

}  // namespace xpert::cli

namespace {

// A crash says where it happened (addresses: `addr2line -e xpert ADDR` on an unstripped build resolves
// them), then dies of the same signal.
void on_fatal_signal(int sig) {
  char head[64];
  const int n = std::snprintf(head, sizeof head, "xpert: fatal signal %d; backtrace:\n", sig);
  if (n > 0) (void)!write(STDERR_FILENO, head, (size_t)n);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace xpert;
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) std::signal(sig, on_fatal_signal);
  CLI::App app{"xpert — LLM inference for Mixture-of-Experts models on ordinary hardware"};
  app.require_subcommand(1);
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");
  app.add_flag("-q,--quiet", quiet, "errors only");
  std::map<CLI::App*, cli::Command> commands;
  auto sub = [&](const char* name, const char* help, cli::Command (*add)(CLI::App&)) {
    CLI::App* s = app.add_subcommand(name, help);
    commands[s] = add(*s);
  };
  sub("run", "generate text from a prompt", cli::add_run);
  sub("info", "print a model's metadata, tensors and memory needs", cli::add_info);
  sub("bench", "measure prompt processing and generation speed (llama-bench style)", cli::add_bench);
  sub("devices", "list the compute devices xpert can use", cli::add_devices);
  sub("tokenize", "print a prompt's token ids as JSON", cli::add_tokenize);
  sub("synth", "write a GGUF with a real model's shapes and random weights", cli::add_synth);
  sub("serve", "serve an OpenAI-compatible HTTP API with continuous batching", cli::add_serve);
  sub("chat", "chat with a model in the terminal, using its chat template", cli::add_chat);
  sub("template", "print the prompt a chat template renders for a messages file", cli::add_template);
  sub("profile", "record how often each expert is routed, for placing experts on the GPU", cli::add_profile);
  // llama.cpp's multi-letter short flags, which CLI11 does not take.
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& a : args)
    if (a == "-ngl") a = "--n-gpu-layers";
    else if (a == "-ctk") a = "--cache-type-k";
    else if (a == "-ctv") a = "--cache-type-v";
  std::vector<char*> argv2;
  for (std::string& a : args) argv2.push_back(a.data());
  try {
    app.parse((int)argv2.size(), argv2.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (verbose) log::set_level(log::Level::debug);
  if (quiet) log::set_level(log::Level::error);
  try {
    for (auto& [s, run] : commands)
      if (s->parsed()) return run();
  } catch (const Error& e) {
    std::fprintf(stderr, "xpert: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "xpert: error: out of memory\n");
    return 1;
  }
  return 0;
}
