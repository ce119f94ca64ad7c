#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "cli/commands.h"

namespace xpert::cli {

void prefetch_weights(const gguf::GGUFFile& f) {
  const bool tty = isatty(STDERR_FILENO);
  size_t total = 0, done = 0;
  for (const auto& t : f.tensors()) total += t.n_bytes;
  volatile uint8_t sink = 0;
  int shown = -1;
  for (const auto& t : f.tensors()) {
    for (size_t p = 0; p < t.n_bytes; p += 4096) sink = sink + t.data[p];
    done += t.n_bytes;
    if (!tty || total == 0) continue;
    const int pct = (int)(100.0 * done / total);
    if (pct == shown) continue;
    shown = pct;
    const int bar = pct / 4;
    std::fprintf(stderr, "\rloading %s [%.*s%*s] %3d%%", f.path().c_str(), bar, "=========================",
                 25 - bar, "", pct);
    std::fflush(stderr);
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
}

}  // namespace xpert::cli
