// Errors. Bad input from outside (files, flags, requests) throws xpert::Error with a message that says
// what was expected and what was found; the CLI and the server catch it at their edge and turn it into
// one clear line and a non-zero exit, or an HTTP 4xx. Internal invariants use XP_ASSERT.
#pragma once
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace xpert {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace xpert

#define XP_ASSERT(cond)                                                                    \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "xpert: internal error: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
