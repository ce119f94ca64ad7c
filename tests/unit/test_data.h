// Random data and ISA helpers shared by the unit tests (one copy, so every test draws the same numbers
// from the same seed).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "base/cpu_features.h"

namespace xpert {

// Uniform in [-1, 1) from a fixed-seed 64-bit LCG: the same data on every standard library.
inline std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& f : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    f = (float)((double)(seed >> 40) * 0x1p-23 - 1.0);
  }
  return v;
}

// Normal with the given scale (std::mt19937 + std::normal_distribution).
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A file in the temporary directory for this process alone, removed with the object. ctest runs a binary's
// cases as separate processes, two at a time in CI: two cases writing one path (a synth model, say) while the
// other reads it through mmap end in SIGBUS.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() / ("xpert_" + std::to_string(::getpid()) + "_" + name))
                 .string()) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

// Puts the ISA cap back after a test lowered it (set_isa_cap).
struct IsaCapGuard {
  ~IsaCapGuard() { set_isa_cap(Isa::avx512); }
};

}  // namespace xpert
