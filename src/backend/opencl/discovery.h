// OpenCL device discovery: every device of every platform, numbered in that order (`opencl:N`), with what
// the expert kernels need to know (subgroups, memory shared with the host, Intel extensions), and the
// reasons a machine shows no GPU, worded as what to do about it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/opencl/cl_api.h"

namespace xpert::opencl {

struct DeviceInfo {
  int index = 0;  // N of opencl:N
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  std::string platform_name, platform_version;
  std::string name, vendor, driver_version, device_version, opencl_c_version;
  cl_device_type type = 0;
  uint64_t global_mem_bytes = 0, max_alloc_bytes = 0, local_mem_bytes = 0;
  uint32_t compute_units = 0, clock_mhz = 0;
  size_t max_work_group_size = 0;
  uint32_t max_sub_groups = 0;            // CL_DEVICE_MAX_NUM_SUB_GROUPS (0: no subgroups)
  std::vector<size_t> sub_group_sizes;    // the sizes a kernel may require (Intel), or the warp/wavefront width
  bool host_unified_memory = false;       // the device reads host memory directly (iGPU, CPU)
  bool svm_fine_grain_system = false;     // CL_DEVICE_SVM_FINE_GRAIN_SYSTEM: any host pointer is SVM
  uint64_t usm_host_caps = 0;             // CL_DEVICE_HOST_MEM_CAPABILITIES_INTEL (0: none)
  bool correctly_rounded_divide = false;  // CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT
  bool fp16 = false;                      // cl_khr_fp16
  bool intel_subgroups = false, intel_required_subgroup_size = false, khr_subgroups = false;
  bool intel_usm = false, intel_subgroup_mma = false;
  bool command_buffer = false;  // cl_khr_command_buffer: a decode step recorded once, replayed
  bool nv_compiler_options = false;  // cl_nv_compiler_options: -cl-nv-maxrregcount and the like
  std::string extensions;
  // "dddd:bb:dd.f" (lower-case hex) from cl_khr_pci_bus_info or NVIDIA's cl_nv_device_attribute_query; ""
  // where the device names none (PoCL, most CPUs): with cuda::DeviceInfo::pci_bus_id, whether an OpenCL
  // device is a GPU that CUDA also drives.
  std::string pci_bus_id;

  bool is_gpu() const { return (type & CL_DEVICE_TYPE_GPU) != 0; }
  bool is_cpu() const { return (type & CL_DEVICE_TYPE_CPU) != 0; }
  const char* type_name() const;
  // Whether weights can stay in host memory and be read in place.
  bool shares_host_memory() const { return host_unified_memory || is_cpu(); }
  // Whether the whole-model backend's kernels (SVM pointers) can read weights where they lie in host memory:
  // a device on the host's own cores, or one with fine-grained system SVM.
  bool reads_host_pointers() const { return is_cpu() || svm_fine_grain_system; }
  bool has_sub_group_size(size_t n) const;
  // The whole-model matvecs' subgroup size for rows of `width` work-items: the largest size up to 16 that
  // divides it and that a kernel may require here (cl_intel_subgroups, cl_intel_required_subgroup_size);
  // 0 without. (Intel's compiler spills the GPU-width matvecs at SIMD32: 38-62 on DG2, none at 16.)
  int matvec_sub_group(int width) const;
  // The matvecs' row width the whole-model backend picks: a CPU runs a work-group as one thread.
  int matvec_width() const { return is_cpu() ? 4 : 32; }
};

// All devices; throws Error with what to install when there is no loader or no platform.
std::vector<DeviceInfo> list_devices();

// The device opencl:index; throws Error listing how many there are when out of range.
DeviceInfo device_info(int index);

// Why no GPU is visible, as advice (empty when a GPU device is listed): /dev/dri/renderD* that this user
// cannot open (join the render group), render nodes but no GPU driver (install intel-opencl-icd), no
// render nodes at all.
std::string no_gpu_advice(const std::vector<DeviceInfo>& devices);

}  // namespace xpert::opencl
