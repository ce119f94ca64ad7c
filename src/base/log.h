// Logging to stderr; stdout is reserved for the program's output (generated text, JSON).
#pragma once
#include <fmt/format.h>

#include <cstdio>

namespace xpert::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3, quiet = 4 };
Level level();
void set_level(Level l);
void write(Level l, const std::string& line);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::debug) write(Level::debug, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::info) write(Level::info, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::warn) write(Level::warn, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... a) {
  if (level() <= Level::error) write(Level::error, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace xpert::log
