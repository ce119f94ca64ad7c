#include "backend/opencl/discovery.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "base/error.h"

namespace xpert::opencl {

namespace {

constexpr const char* kInstallHint =
    "on Debian/Ubuntu install ocl-icd-libopencl1 and a driver: intel-opencl-icd for Intel GPUs, "
    "pocl-opencl-icd for the CPU";

std::string platform_string(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  if (api().clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  XP_CL(clGetPlatformInfo, p, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

// Optional queries (vendor extensions, deprecated fields) answer an error on devices that lack them.
bool query(cl_device_id d, cl_device_info what, size_t size, void* out) {
  return api().clGetDeviceInfo(d, what, size, out, nullptr) == CL_SUCCESS;
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (api().clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  XP_CL(clGetDeviceInfo, d, what, n, s.data(), nullptr);
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

template <typename T>
T device_value(cl_device_id d, cl_device_info what) {
  T v{};
  query(d, what, sizeof v, &v);
  return v;
}

bool has_extension(const std::string& list, const char* name) {
  std::istringstream in(list);
  for (std::string e; in >> e;)
    if (e == name) return true;
  return false;
}

// cl_nv_device_attribute_query's PCI fields (not in Khronos' headers); the slot id packs device << 3 |
// function.
constexpr cl_device_info kPciBusIdNv = 0x4008, kPciSlotIdNv = 0x4009, kPciDomainIdNv = 0x400A;

std::string pci_bus_id(cl_device_id d, const std::string& ext) {
  cl_device_pci_bus_info_khr b{};
  if (has_extension(ext, "cl_khr_pci_bus_info")) {
    if (!query(d, CL_DEVICE_PCI_BUS_INFO_KHR, sizeof b, &b)) return "";
  } else if (has_extension(ext, "cl_nv_device_attribute_query")) {
    cl_uint slot = 0;
    if (!query(d, kPciBusIdNv, sizeof b.pci_bus, &b.pci_bus) || !query(d, kPciSlotIdNv, sizeof slot, &slot))
      return "";
    query(d, kPciDomainIdNv, sizeof b.pci_domain, &b.pci_domain);  // older drivers: domain 0
    b.pci_device = slot >> 3;
    b.pci_function = slot & 7;
  } else {
    return "";
  }
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", b.pci_domain, b.pci_bus, b.pci_device, b.pci_function);
}

DeviceInfo describe(int index, cl_platform_id p, cl_device_id d) {
  DeviceInfo i;
  i.index = index;
  i.platform = p;
  i.device = d;
  i.platform_name = platform_string(p, CL_PLATFORM_NAME);
  i.platform_version = platform_string(p, CL_PLATFORM_VERSION);
  i.name = device_string(d, CL_DEVICE_NAME);
  i.vendor = device_string(d, CL_DEVICE_VENDOR);
  i.driver_version = device_string(d, CL_DRIVER_VERSION);
  i.device_version = device_string(d, CL_DEVICE_VERSION);
  i.opencl_c_version = device_string(d, CL_DEVICE_OPENCL_C_VERSION);
  i.extensions = device_string(d, CL_DEVICE_EXTENSIONS);
  i.type = device_value<cl_device_type>(d, CL_DEVICE_TYPE);
  i.global_mem_bytes = device_value<cl_ulong>(d, CL_DEVICE_GLOBAL_MEM_SIZE);
  i.max_alloc_bytes = device_value<cl_ulong>(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  i.local_mem_bytes = device_value<cl_ulong>(d, CL_DEVICE_LOCAL_MEM_SIZE);
  i.compute_units = device_value<cl_uint>(d, CL_DEVICE_MAX_COMPUTE_UNITS);
  i.clock_mhz = device_value<cl_uint>(d, CL_DEVICE_MAX_CLOCK_FREQUENCY);
  i.max_work_group_size = device_value<size_t>(d, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  i.max_sub_groups = device_value<cl_uint>(d, CL_DEVICE_MAX_NUM_SUB_GROUPS);
  i.host_unified_memory = device_value<cl_bool>(d, CL_DEVICE_HOST_UNIFIED_MEMORY) == CL_TRUE;
  i.svm_fine_grain_system = (device_value<cl_device_svm_capabilities>(d, CL_DEVICE_SVM_CAPABILITIES) &
                             CL_DEVICE_SVM_FINE_GRAIN_SYSTEM) != 0;
  i.correctly_rounded_divide =
      (device_value<cl_device_fp_config>(d, CL_DEVICE_SINGLE_FP_CONFIG) & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;

  const std::string& ext = i.extensions;
  i.fp16 = has_extension(ext, "cl_khr_fp16");
  i.khr_subgroups = has_extension(ext, "cl_khr_subgroups");
  i.intel_subgroups = has_extension(ext, "cl_intel_subgroups");
  i.intel_required_subgroup_size = has_extension(ext, "cl_intel_required_subgroup_size");
  i.intel_usm = has_extension(ext, "cl_intel_unified_shared_memory");
  i.intel_subgroup_mma = has_extension(ext, "cl_intel_subgroup_matrix_multiply_accumulate");
  i.command_buffer = has_extension(ext, "cl_khr_command_buffer");
  i.nv_compiler_options = has_extension(ext, "cl_nv_compiler_options");
  if (i.intel_usm) i.usm_host_caps = device_value<cl_ulong>(d, CL_DEVICE_HOST_MEM_CAPABILITIES_INTEL);

  // Subgroup sizes: Intel lists the sizes a kernel may require; NVIDIA and AMD report their fixed width.
  if (i.intel_required_subgroup_size) {
    size_t n = 0;
    if (api().clGetDeviceInfo(d, CL_DEVICE_SUB_GROUP_SIZES_INTEL, 0, nullptr, &n) == CL_SUCCESS && n > 0) {
      i.sub_group_sizes.resize(n / sizeof(size_t));
      if (!query(d, CL_DEVICE_SUB_GROUP_SIZES_INTEL, n, i.sub_group_sizes.data())) i.sub_group_sizes.clear();
    }
  } else if (has_extension(ext, "cl_nv_device_attribute_query")) {
    if (cl_uint w = device_value<cl_uint>(d, CL_DEVICE_WARP_SIZE_NV)) i.sub_group_sizes = {w};
  } else if (has_extension(ext, "cl_amd_device_attribute_query")) {
    if (cl_uint w = device_value<cl_uint>(d, CL_DEVICE_WAVEFRONT_WIDTH_AMD)) i.sub_group_sizes = {w};
  }
  i.pci_bus_id = pci_bus_id(d, ext);
  return i;
}

}  // namespace

const char* DeviceInfo::type_name() const {
  if (type & CL_DEVICE_TYPE_GPU) return host_unified_memory ? "integrated GPU" : "GPU";
  if (type & CL_DEVICE_TYPE_CPU) return "CPU";
  if (type & CL_DEVICE_TYPE_ACCELERATOR) return "accelerator";
  return "other";
}

bool DeviceInfo::has_sub_group_size(size_t n) const {
  return std::find(sub_group_sizes.begin(), sub_group_sizes.end(), n) != sub_group_sizes.end();
}

int DeviceInfo::matvec_sub_group(int width) const {
  if (!intel_subgroups || !intel_required_subgroup_size) return 0;
  for (int s = std::min(width, 16); s >= 2; s /= 2)
    if (width % s == 0 && has_sub_group_size((size_t)s)) return s;
  return 0;
}

std::vector<DeviceInfo> list_devices() {
  const Api& a = api();
  cl_uint n_platforms = 0;
  const cl_int err = a.clGetPlatformIDs(0, nullptr, &n_platforms);
  if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && n_platforms == 0))
    fail("no OpenCL platform (the loader found no driver); {}", kInstallHint);
  if (err != CL_SUCCESS) throw_cl_error(err, "clGetPlatformIDs", __FILE__, __LINE__);
  std::vector<cl_platform_id> platforms(n_platforms);
  XP_CL(clGetPlatformIDs, n_platforms, platforms.data(), nullptr);

  std::vector<DeviceInfo> out;
  for (cl_platform_id p : platforms) {
    cl_uint n = 0;
    // A platform without devices answers CL_DEVICE_NOT_FOUND: not an error for a listing.
    if (a.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n) != CL_SUCCESS || n == 0) continue;
    std::vector<cl_device_id> devices(n);
    XP_CL(clGetDeviceIDs, p, CL_DEVICE_TYPE_ALL, n, devices.data(), nullptr);
    for (cl_device_id d : devices) out.push_back(describe((int)out.size(), p, d));
  }
  if (out.empty()) fail("OpenCL platforms are installed but show no device; {}", kInstallHint);
  return out;
}

DeviceInfo device_info(int index) {
  std::vector<DeviceInfo> all = list_devices();
  if (index < 0 || index >= (int)all.size())
    fail("no device opencl:{}: this machine has {} OpenCL device{} (opencl:0..opencl:{}; see `xpert devices`)", index,
         all.size(), all.size() == 1 ? "" : "s", all.size() - 1);
  return all[index];
}

std::string no_gpu_advice(const std::vector<DeviceInfo>& devices) {
  for (const DeviceInfo& d : devices)
    if (d.is_gpu()) return {};
  namespace fs = std::filesystem;
  std::vector<std::string> nodes, denied;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/dri", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("renderD", 0) != 0) continue;
    nodes.push_back(e.path().string());
    if (access(e.path().c_str(), R_OK | W_OK) != 0) denied.push_back(e.path().string());
  }
  if (!denied.empty())
    return fmt::format(
        "no OpenCL GPU: this user cannot open {}; add the user to the `render` group "
        "(sudo usermod -aG render $USER) and log in again",
        denied.front());
  if (!nodes.empty())
    return "no OpenCL GPU, but the machine has GPU render nodes: install the GPU's OpenCL driver "
           "(Intel: intel-opencl-icd)";
  return "no OpenCL GPU (no /dev/dri/renderD* on this machine)";
}

}  // namespace xpert::opencl
