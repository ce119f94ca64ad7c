#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "runtime/placement.h"
#include "base/error.h"
#include "cli/commands.h"
#include "model/model.h"
#include "runtime/memory_plan.h"

namespace xpert::cli {

Command add_info(CLI::App& app) {
  auto flags = std::make_shared<ModelFlags>();
  flags->add(app);
  auto all = std::make_shared<bool>(false);
  app.add_flag("--all-metadata", *all, "print long arrays in full length summaries too");
  return [flags, all] {
    // As run/serve load it: GPTQ experts natively where every expert executor reads them so.
    auto model = Model::load(flags->model, {.native_gptq_experts = native_gptq_experts(placement_options(*flags))});
    const gguf::GGUFFile& f = model->file();
    const ModelConfig& c = model->config();
    const bool folder = std::filesystem::is_directory(flags->model);
    if (folder)
      fmt::print("file: {} (Hugging Face folder, translated to GGUF names and keys in memory)\n", flags->model);
    else
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
    const int64_t n_ctx = resolve_ctx_flag(c, flags->ctx);
    const KvTypes kv_types = flags->cache_types();
    check_kv_type(c, kv_types.k, "--cache-type-k");
    check_kv_type(c, kv_types.v, "--cache-type-v");
    size_t kv = 0;
    for (int64_t il = 0; il < c.n_layer; ++il)
      if (!c.recurrent(il)) kv += kv_bytes_per_layer(c, n_ctx, 1, kv_types);
    std::string ffn = c.n_ff ? fmt::format("ff {}", c.n_ff) : "";
    if (c.n_expert > 0) {
      ffn += fmt::format("{}{} experts (top {}) x ff {}", ffn.empty() ? "" : ", ", c.n_expert, c.n_expert_used,
                         c.n_ff_exp);
      if (c.n_ff_shexp > 0) ffn += fmt::format(" + shared expert ff {}", c.n_ff_shexp);
    }
    fmt::print("\nmodel: {} ({}), {} layers, n_embd {}, {} heads ({} kv) x {}, {}, vocab {}, trained ctx {}\n", c.name,
               c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, ffn, c.n_vocab, c.n_ctx_train);
    fmt::print("memory: weights {:.1f} MiB ({}) + KV cache {:.1f} MiB at -c {} (K {}, V {}, attention layers only)\n",
               weight_bytes / 1048576.0,
               folder ? "read in place where unchanged, converted tensors in one buffer" : "mapped, read in place",
               kv / 1048576.0, n_ctx, kv_type_name(kv_types.k), kv_type_name(kv_types.v));
    // Where the weights would go with these flags (nothing is uploaded) and what `xpert run` with them
    // would hold per device; an impossible plan is reported here, as it would be at start-up.
    fmt::print("\n");
    try {
      const ExpertPlan placement = plan_placement(*model, placement_options(*flags));
      fmt::print("{}", placement.summary(true));
      const MemoryPlan mp = plan_memory(c, placement,
                                        {.n_ctx = n_ctx,
                                         .n_parallel = 1,
                                         .n_batch = flags->batch,
                                         .cache_ram_bytes = 0,
                                         .weights_mapped = true,
                                         .file_weight_bytes = weight_bytes,
                                         .host_available = host_available_memory(),
                                         .cache_types = kv_types});
      fmt::print("\n{}", mp.summary());
      const std::string warning = mp.check();
      if (!warning.empty()) fmt::print("warning: {}\n", warning);
    } catch (const Error& e) {
      fmt::print("placement: {}\n", e.what());
      return 1;
    }
    return 0;
  };
}

}  // namespace xpert::cli
