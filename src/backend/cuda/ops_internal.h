// Host-side helpers shared by the op, attention and Gated DeltaNet launchers (not part of the API).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

namespace xpert::cuda::detail {

// Throws xpert::Error(message) (defined in a .cpp: nvcc's host pass cannot compile fmt, so .cu files
// build their messages by streaming).
[[noreturn]] void throw_error(const std::string& message);
template <typename... Args>
[[noreturn]] void fail_rt(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  throw_error(s.str());
}

// Of the current device, read once per device.
int sm_count();
int max_smem_optin();  // bytes of dynamic shared memory a block may ask for
int cc_major();        // compute capability (9: Hopper)

// Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KB.
void set_smem_limit(const void* kernel, size_t bytes);

// Blocks for a grid-stride loop over n elements with `threads` per block.
unsigned grid_for(int64_t n, int threads);

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// A switch that is on unless its environment variable is "0".
inline bool env_on(const char* name) {
  const char* env = std::getenv(name);
  return !(env && std::string(env) == "0");
}

}  // namespace xpert::cuda::detail
