// CUDA devices, device memory and streams: the host-side pieces every CUDA kernel launcher needs.
// Nothing here knows about models; the backend and `xpert devices` call these.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace xpert::cuda {

// Throws xpert::Error(message). For .cu files, which cannot include fmt (base/error.h): nvcc's host pass
// fails on fmt v9 in C++20 mode.
[[noreturn]] void throw_error(const std::string& message);
// throw_error with the arguments streamed one after another.
template <class... A>
[[noreturn]] void fail_cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  throw_error(s.str());
}

}  // namespace xpert::cuda

// An internal invariant of a CUDA launcher (XP_ASSERT's counterpart for .cu files; throws).
#define XPERT_CU_ASSERT(cond)                                                                            \
  do {                                                                                                   \
    if (!(cond)) ::xpert::cuda::fail_cat("internal error: ", #cond, " (", __FILE__, ":", __LINE__, ")"); \
  } while (0)

namespace xpert::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;                // multiprocessors
  size_t total_bytes = 0, free_bytes = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // shared memory a kernel may opt into
  std::string pci_bus_id;           // "dddd:bb:dd.f", lower-case hex (opencl::DeviceInfo's form)
};

// Every CUDA device the driver shows; empty (never an error) when there is no driver or no device.
std::vector<DeviceInfo> list_devices();
// Why list_devices() is empty ("no CUDA driver", "no device", ...), or "" when it is not.
std::string no_device_reason();

// One cudaMalloc'ed allocation, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { resize(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Reallocates (contents lost) when `bytes` exceeds the current size; never shrinks.
  void reserve(size_t bytes);
  // Exactly `bytes` (contents lost unless the size is unchanged).
  void resize(size_t bytes);
  void release();

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream, destroyed with its owner.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  operator cudaStream_t() const { return s_; }
  void sync() const;

 private:
  cudaStream_t s_ = nullptr;
};

// Carves aligned pieces out of one caller-owned device buffer (scratch of a launcher). Nothing is freed;
// the caller sizes the buffer with the launcher's *_workspace_bytes function.
class Workspace {
 public:
  Workspace(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
  template <class T>
  T* take(size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(size_t bytes);
  size_t used() const { return used_; }
  static constexpr size_t kAlign = 256;
  static size_t round(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

 private:
  char* base_;
  size_t bytes_, used_ = 0;
};

}  // namespace xpert::cuda
