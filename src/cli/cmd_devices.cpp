// `xpert devices`: one section per backend, in the order of the device names (cpu, cuda:N, opencl:N). A
// backend adds its section to kSections; one that is not built in, or finds no device, says so in one line.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/commands.h"

#ifdef XPERT_HAS_CUDA
#include "backend/cuda/device.h"
#endif
#ifdef XPERT_HAVE_OPENCL
#include "backend/opencl/discovery.h"
#include "backend/opencl/expert_device.h"
#endif

namespace xpert::cli {

namespace {

void print_cpu() {
  // amx_enabled() also asks Linux for tile data: "amx" here means prefill really runs on the tiles.
  fmt::print("cpu       {} cores, ISA {}{} ({})\n", ThreadPool::default_threads(), isa_name(best_isa()),
             amx_enabled() ? " + amx-int8 prefill" : "", cpu_features_string());
}

#ifdef XPERT_HAS_CUDA
void print_cuda() {
  const std::vector<cuda::DeviceInfo> devs = cuda::list_devices();
  if (devs.empty()) {
    fmt::print("cuda      none: {}\n", cuda::no_device_reason());
    return;
  }
  for (const cuda::DeviceInfo& d : devs)
    fmt::print("{:<10}{} (compute {}.{}, {} SMs), {:.1f} GiB ({:.1f} GiB free), L2 {} MiB, PCI {}\n",
               fmt::format("cuda:{}", d.index), d.name, d.cc_major, d.cc_minor, d.sm_count,
               d.total_bytes / 1073741824.0, d.free_bytes / 1073741824.0, d.l2_bytes >> 20, d.pci_bus_id);
}
#else
void print_cuda() { fmt::print("cuda      not built into this binary (no CUDA compiler at build time)\n"); }
#endif

#ifdef XPERT_HAVE_OPENCL
std::string gib(uint64_t bytes) { return fmt::format("{:.1f} GiB", bytes / 1073741824.0); }

void print_opencl_device(const opencl::DeviceInfo& d) {
  const char* indent = "          ";
  const auto yes_no = [](bool b) { return b ? "yes" : "no"; };
  fmt::print("{:<10}{} ({}{})\n", fmt::format("opencl:{}", d.index), d.name, d.type_name(),
             d.pci_bus_id.empty() ? "" : ", PCI " + d.pci_bus_id);
  fmt::print("{}platform  {} ({})\n", indent, d.platform_name, d.platform_version);
  fmt::print("{}driver    {}; {}; {}\n", indent, d.driver_version, d.device_version, d.opencl_c_version);
  std::string usm = d.intel_usm ? fmt::format(", Intel USM host allocations {}", d.usm_host_caps ? "yes" : "no") : "";
  fmt::print("{}memory    {}{}, largest buffer {}{}\n", indent, gib(d.global_mem_bytes),
             d.host_unified_memory ? " shared with the host" : " (device memory)", gib(d.max_alloc_bytes), usm);
  std::string sub = "none";
  if (!d.sub_group_sizes.empty()) sub = fmt::format("sizes {}", fmt::join(d.sub_group_sizes, ", "));
  else if (d.max_sub_groups > 0 || d.khr_subgroups) sub = "yes (size chosen per kernel)";
  fmt::print("{}compute   {} units at {} MHz, work-group up to {}, subgroups: {}\n", indent, d.compute_units,
             d.clock_mhz, d.max_work_group_size, sub);
  fmt::print("{}intel     cl_intel_subgroups {}, cl_intel_unified_shared_memory {}, "
             "cl_intel_subgroup_matrix_multiply_accumulate {}\n",
             indent, yes_no(d.intel_subgroups), yes_no(d.intel_usm), yes_no(d.intel_subgroup_mma));
  fmt::print("{}experts   {} kernels, weights {}\n", indent, opencl::variant_name(opencl::preferred_variant(d)),
             d.shares_host_memory() ? "read in place from host memory" : "copied once to device memory");
  const int sg = d.matvec_sub_group(d.matvec_width());
  fmt::print("{}model     weights {}, decode steps {}, matvec sums {}\n", indent,
             d.reads_host_pointers() ? "read in place from host memory" : "copied once to device memory",
             d.command_buffer ? "recorded once and replayed (cl_khr_command_buffer)"
                              : "enqueued kernel by kernel (no cl_khr_command_buffer)",
             sg ? fmt::format("by subgroups of {}", sg) : std::string("through local memory"));
}

void print_opencl() {
  std::vector<opencl::DeviceInfo> devices;
  try {
    devices = opencl::list_devices();
  } catch (const Error& e) {
    fmt::print("opencl    {}\n", e.what());
    return;
  }
  for (const opencl::DeviceInfo& d : devices) print_opencl_device(d);
  if (std::string advice = opencl::no_gpu_advice(devices); !advice.empty()) fmt::print("opencl    {}\n", advice);
}
#else
void print_opencl() {
  fmt::print("opencl    not built into this binary (rebuild with the OpenCL headers: Debian opencl-headers)\n");
}
#endif

constexpr void (*kSections[])() = {print_cpu, print_cuda, print_opencl};

}  // namespace

Command add_devices(CLI::App& app) {
  return [] {
    for (auto section : kSections) section();
    return 0;
  };
}

}  // namespace xpert::cli
