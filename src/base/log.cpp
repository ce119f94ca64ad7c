#include "base/log.h"

#include <atomic>
#include <mutex>

namespace xpert::log {
namespace {
std::atomic<Level> g_level{Level::info};
std::mutex g_mutex;
}  // namespace

Level level() { return g_level.load(std::memory_order_relaxed); }
void set_level(Level l) { g_level.store(l); }

void write(Level l, const std::string& line) {
  static const char* tags[] = {"debug", "info", "warn", "error", ""};
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "xpert %s: %s\n", tags[static_cast<int>(l)], line.c_str());
}

}  // namespace xpert::log
