// OpenCL programs built once per machine: the driver's binary is kept on disk, keyed by platform, device,
// driver version, the source's hash and the build options, so a second start compiles nothing.
// Directory: $XPERT_OPENCL_CACHE_DIR, else $XDG_CACHE_HOME/xpert/opencl, else ~/.cache/xpert/opencl;
// XPERT_OPENCL_CACHE_DIR=off disables the cache.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

#include "backend/opencl/cl_api.h"
#include "backend/opencl/discovery.h"

namespace xpert::opencl {

// Process-wide counts, for tests and logs.
struct ProgramCacheStats {
  int source_builds = 0;   // programs compiled from OpenCL C
  int binary_loads = 0;    // programs loaded from the disk cache
  int binary_writes = 0;   // binaries written to the disk cache
};
ProgramCacheStats program_cache_stats();

// Empty when the cache is disabled.
std::filesystem::path program_cache_dir();

// A program as built: its whole OpenCL C text and its build options (what the offline compile checks of
// tests/unit/test_opencl_xmx.cpp and test_opencl_intel.cpp compile too).
struct ProgramText {
  std::string source, options;
};

// The built program for one device; throws Error with the build log when the source does not compile.
Program build_program(cl_context ctx, const DeviceInfo& dev, std::string_view source, const std::string& options);

}  // namespace xpert::opencl
