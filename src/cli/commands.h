// The `xpert` subcommands. Each registers its flags on a CLI11 subcommand and returns the function that
// runs it; main() catches xpert::Error at this edge and prints one line.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "runtime/placement.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "sample/sampler.h"

namespace xpert::cli {

using Command = std::function<int()>;

// Flags every command that loads a model shares.
struct ModelFlags {
  std::string model;
  int threads = 0;
  int64_t ctx = -1;  // -c; -1: not given (4096, or the model's trained context when less); load_model resolves it
  int64_t batch = 512;
  std::string device;         // --device
  int64_t n_gpu_layers = -1;  // -ngl
  int64_t num_gpu_experts = -1;      // --num-gpu-experts
  int64_t stream_experts = -1;       // --stream-experts
  std::string stream_share = "auto";  // --stream-share
  std::string gpu_expert_budget;     // --gpu-expert-budget
  std::string expert_device = "cpu";  // --expert-device
  std::string expert_share;           // --expert-share ("": measured)
  std::string expert_profile;        // --expert-profile
  std::string cache_type_k = "f16", cache_type_v = "f16";  // --cache-type-k / -v (-ctk / -ctv)
  void add(CLI::App& app, bool with_ctx = true);
  KvTypes cache_types() const;  // the two parsed (Error for an unknown name)
};

// What a command holds besides the weights, for the memory plan (runtime/memory_plan.h).
struct RunMemory {
  int n_parallel = 1;          // cache slots
  size_t cache_ram_bytes = 0;  // the state cache's budget
  int64_t n_ctx = 0;           // > 0: the command's own context (bench), used as is; 0: from -c
};
// Model::load (maps the file, reads no weight), resolves -c into f.ctx (refusing one above the trained
// maximum), prints the memory plan and refuses one that does not fit (Error saying what to change), then
// places the model on the devices the flags name.
std::unique_ptr<Model> load_model(ModelFlags& f, const RunMemory& r = {});
// The placement options the flags give (devices.h).
PlacementOptions placement_options(const ModelFlags& f);

// --temp --top-k --top-p --min-p --repeat-penalty --seed, shared by the commands that sample.
void add_sampling_flags(CLI::App& app, SamplingParams& sp);

Command add_run(CLI::App& app);
Command add_info(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_devices(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_synth(CLI::App& app);
Command add_serve(CLI::App& app);
Command add_chat(CLI::App& app);
Command add_template(CLI::App& app);
Command add_profile(CLI::App& app);

// Reads every weight page once so the first request does not pay the page faults; a progress bar
// when stderr is a terminal.
void prefetch_weights(const gguf::GGUFFile& f);

}  // namespace xpert::cli
