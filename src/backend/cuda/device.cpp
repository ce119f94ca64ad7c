#include "backend/cuda/device.h"

#include <fmt/format.h>

#include <cstdint>

#include "backend/cuda/check.h"
#include "base/error.h"

namespace xpert::cuda {

void throw_error(const std::string& message) { throw Error(message); }

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return out;
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    d.sm_count = p.multiProcessorCount;
    d.total_bytes = p.totalGlobalMem;
    d.l2_bytes = (size_t)p.l2CacheSize;
    d.smem_per_block_optin = p.sharedMemPerBlockOptin;
    d.pci_bus_id = fmt::format("{:04x}:{:02x}:{:02x}.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      d.free_bytes = free_b;
    out.push_back(d);
  }
  cudaSetDevice(current);
  cudaGetLastError();
  return out;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
  }
  return n == 0 ? "no CUDA device" : "";
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes > bytes_) resize(bytes);
}

void DeviceBuffer::resize(size_t bytes) {
  if (bytes == bytes_) return;
  release();
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    cudaGetLastError();
    fail("CUDA: cannot allocate {} MiB of device memory: {}", bytes >> 20, cudaGetErrorString(e));
  }
  bytes_ = bytes;
}

void DeviceBuffer::release() {
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  XP_ASSERT(offset + bytes <= bytes_);
  XPERT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  XP_ASSERT(offset + bytes <= bytes_);
  XPERT_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

Stream::Stream() { XPERT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
void Stream::sync() const { XPERT_CUDA_CHECK(cudaStreamSynchronize(s_)); }

void* Workspace::take_bytes(size_t bytes) {
  const size_t b = round(bytes);
  if (used_ + b > bytes_)
    fail("CUDA workspace too small: needs at least {} bytes more than its {}", used_ + b - bytes_, bytes_);
  // Integer arithmetic: a Workspace over nullptr only measures (moe_workspace_bytes).
  void* p = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(base_) + used_);
  used_ += b;
  return p;
}

}  // namespace xpert::cuda
