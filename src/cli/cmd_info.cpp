#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/devices.h"
#include "base/error.h"
#include "cli/commands.h"
#include "model/model.h"
#include "runtime/kv_cache.h"

namespace xpert::cli {

Command add_info(CLI::App& app) {
  auto flags = std::make_shared<ModelFlags>();
  flags->add(app);
  auto all = std::make_shared<bool>(false);
  app.add_flag("--all-metadata", *all, "print long arrays in full length summaries too");
  return [flags, all] {
    auto model = Model::load(flags->model);
    const gguf::GGUFFile& f = model->file();
    const ModelConfig& c = model->config();
    fmt::print("file: {} (GGUF v{}, {:.1f} MiB, alignment {})\n", f.path(), f.version(), f.file_size() / 1048576.0,
               f.alignment());
    fmt::print("\nmetadata ({} keys):\n", f.metadata().size());
    for (const auto& [k, v] : f.metadata()) fmt::print("  {:<44} {}\n", k, v.to_display(*all ? 64 : 8));
    fmt::print("\ntensors ({}):\n  {:<40} {:<6} {:<22} {:>12}\n", f.tensors().size(), "name", "type", "shape", "bytes");
    size_t weight_bytes = 0;
    for (const auto& t : f.tensors()) {
      weight_bytes += t.n_bytes;
      fmt::print("  {:<40} {:<6} {:<22} {:>12}\n", t.name, dtype_name(t.type), fmt::format("[{}]", fmt::join(t.shape, ", ")),
                 t.n_bytes);
    }
    const int64_t n_ctx = flags->ctx > 0 ? flags->ctx : c.n_ctx_train;
    const double kv = 2.0 * 2.0 * c.n_layer * n_ctx * c.n_head_kv * c.head_dim;
    fmt::print("\nmodel: {} ({}), {} layers, n_embd {}, {} heads ({} kv) x {}, ff {}, vocab {}, trained ctx {}\n",
               c.name, c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab,
               c.n_ctx_train);
    fmt::print("memory: weights {:.1f} MiB (mapped, read in place) + KV cache {:.1f} MiB at -c {} (f16)\n",
               weight_bytes / 1048576.0, kv / 1048576.0, n_ctx);
    // Where the weights would go with these flags (nothing is uploaded); an impossible plan is reported
    // here, as it would be at start-up.
    fmt::print("\n");
    try {
      fmt::print("{}", plan_placement(*model, placement_options(*flags)).summary(true));
    } catch (const Error& e) {
      fmt::print("placement: {}\n", e.what());
      return 1;
    }
    return 0;
  };
}

}  // namespace xpert::cli
