#include "backend/opencl/program_cache.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace xpert::opencl {

namespace {

std::atomic<int> g_source_builds{0}, g_binary_loads{0}, g_binary_writes{0};

// FNV-1a, 64 bits: stable across runs and compilers (std::hash is neither promised).
uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string cache_file_name(const DeviceInfo& dev, std::string_view source, const std::string& options) {
  uint64_t h = fnv1a(source);
  for (const std::string* part : {&dev.platform_name, &dev.platform_version, &dev.name, &dev.vendor,
                                  &dev.driver_version, &dev.device_version, &options})
    h = fnv1a(*part, fnv1a("\x1f", h));
  std::string tag;  // a readable prefix; the hash is what keys the entry
  for (char c : dev.name.substr(0, 40)) tag += std::isalnum((unsigned char)c) ? c : '_';
  return fmt::format("{}-{:016x}.bin", tag, h);
}

std::string build_log(cl_program p, cl_device_id d) {
  size_t n = 0;
  api().clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
  std::string s(n, '\0');
  if (n) api().clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, n, s.data(), nullptr);
  while (!s.empty() && (s.back() == '\0' || s.back() == '\n')) s.pop_back();
  return s;
}

Program try_binary(cl_context ctx, const DeviceInfo& dev, const std::filesystem::path& file,
                   const std::string& options) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return {};
  const std::vector<unsigned char> bin((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bin.empty()) return {};
  const unsigned char* ptr = bin.data();
  const size_t size = bin.size();
  cl_int status = CL_SUCCESS, err = CL_SUCCESS;
  Program p(api().clCreateProgramWithBinary(ctx, 1, &dev.device, &size, &ptr, &status, &err));
  if (err != CL_SUCCESS || status != CL_SUCCESS) return {};
  if (api().clBuildProgram(p.get(), 1, &dev.device, options.c_str(), nullptr, nullptr) != CL_SUCCESS) return {};
  return p;
}

void write_binary(cl_program p, const std::filesystem::path& file) {
  size_t size = 0;
  if (api().clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr) != CL_SUCCESS || size == 0)
    return;
  std::vector<unsigned char> bin(size);
  unsigned char* ptr = bin.data();
  if (api().clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof ptr, &ptr, nullptr) != CL_SUCCESS) return;
  // Written beside and renamed: a concurrent start never reads half a file.
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  const std::filesystem::path tmp = file.string() + fmt::format(".tmp{}", (long)getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out.write(reinterpret_cast<const char*>(bin.data()), (std::streamsize)size)) {
      log::debug("opencl: cannot write the program cache file {}", tmp.string());
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  else ++g_binary_writes;
}

}  // namespace

ProgramCacheStats program_cache_stats() {
  return {.source_builds = g_source_builds.load(), .binary_loads = g_binary_loads.load(),
          .binary_writes = g_binary_writes.load()};
}

std::filesystem::path program_cache_dir() {
  if (const char* dir = std::getenv("XPERT_OPENCL_CACHE_DIR"); dir && *dir)
    return std::string_view(dir) == "off" ? std::filesystem::path() : std::filesystem::path(dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "xpert" / "opencl";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "xpert" / "opencl";
  return {};
}

Program build_program(cl_context ctx, const DeviceInfo& dev, std::string_view source, const std::string& options) {
  const std::filesystem::path dir = program_cache_dir();
  const std::filesystem::path file = dir.empty() ? dir : dir / cache_file_name(dev, source, options);
  if (!file.empty()) {
    if (Program p = try_binary(ctx, dev, file, options)) {
      ++g_binary_loads;
      return p;
    }
  }
  const char* src = source.data();
  const size_t len = source.size();
  cl_int err = CL_SUCCESS;
  Program p(api().clCreateProgramWithSource(ctx, 1, &src, &len, &err));
  if (err != CL_SUCCESS) throw_cl_error(err, "clCreateProgramWithSource", __FILE__, __LINE__);
  ++g_source_builds;
  err = api().clBuildProgram(p.get(), 1, &dev.device, options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS)
    fail("OpenCL: the kernels do not build on {} ({}, options '{}'):\n{}", dev.name, error_name(err), options,
         build_log(p.get(), dev.device));
  if (!file.empty()) write_binary(p.get(), file);
  return p;
}

}  // namespace xpert::opencl
