// `xpert synth`: write a GGUF with a real model's shapes and random weights (see model/synth.h).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>

#include "base/error.h"
#include "cli/commands.h"
#include "model/synth.h"

namespace xpert::cli {

Command add_synth(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  auto list = std::make_shared<bool>(false);
  std::vector<std::string> presets;
  for (const SynthPreset& p : synth_presets()) presets.push_back(p.name);
  app.add_option("--preset", o->preset, "model shapes: " + fmt::format("{}", fmt::join(presets, ", ")));
  app.add_option("--type", o->type, "weight types: Q4_K_M, Q8_0, F16, BF16, F32")->capture_default_str();
  app.add_option("-o,--output", o->output, "GGUF file to write");
  app.add_option("--seed", o->seed, "random seed")->capture_default_str();
  app.add_flag("--list", *list, "list the presets and exit");
  return [o, list] {
    if (*list) {
      for (const SynthPreset& p : synth_presets())
        fmt::print("{:<18} {:<10} {}\n", p.name, p.arch, p.description);
      return 0;
    }
    synth_preset(o->preset);  // a clear error before anything is created
    if (o->output.empty()) fail("no output file given: add -o FILE");
    const bool tty = isatty(STDERR_FILENO);
    int shown = -1;
    o->progress = [&](size_t done, size_t total) {
      const int pct = total ? (int)(100.0 * done / total) : 100;
      if (!tty || pct == shown) return;
      shown = pct;
      std::fprintf(stderr, "\rwriting %s %3d%%", o->output.c_str(), pct);
      std::fflush(stderr);
    };
    const auto t0 = std::chrono::steady_clock::now();
    const SynthResult r = synth_write(*o);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tty) std::fprintf(stderr, "\r\033[K");
    fmt::print("wrote {} ({} {}, {:.2f} GiB, {:.3f} B params) in {:.1f} s\n", o->output, o->preset, o->type,
               r.file_bytes / 1073741824.0, r.n_params / 1e9, sec);
    return 0;
  };
}

}  // namespace xpert::cli
