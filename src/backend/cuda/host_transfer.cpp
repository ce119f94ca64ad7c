#include "backend/cuda/host_transfer.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "backend/cuda/check.h"
#include "base/log.h"

namespace xpert::cuda {

HostPins::~HostPins() {
  for (const auto& [start, end] : ranges_) cudaHostUnregister(reinterpret_cast<void*>(start));
}

bool HostPins::pin(const void* p, size_t bytes) {
  if (refused_) return false;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  // The pieces of [a, b) not registered yet.
  std::vector<std::pair<uintptr_t, uintptr_t>> todo;
  auto it = ranges_.upper_bound(a);
  if (it != ranges_.begin() && std::prev(it)->second > a) a = std::prev(it)->second;
  for (; a < b; ++it) {
    const uintptr_t next = it == ranges_.end() ? b : std::min(b, it->first);
    if (a < next) todo.push_back({a, next});
    if (it == ranges_.end()) break;
    a = std::max(a, it->second);
  }
  for (const auto& [s, e] : todo) {
    // Read-only: the experts are a read-only mapping of the model file.
    unsigned flags = cudaHostRegisterPortable | cudaHostRegisterReadOnly;
    cudaError_t err = cudaHostRegister(reinterpret_cast<void*>(s), e - s, flags);
    if (err != cudaSuccess) {
      cudaGetLastError();
      refused_ = true;
      log::warn("cannot page-lock {:.1f} MiB of host experts ({}): streaming them to the GPU goes through the "
               "driver's staging, at a lower rate",
               (e - s) / 1048576.0, cudaGetErrorString(err));
      return false;
    }
    ranges_[s] = e;
    pinned_bytes_ += e - s;
  }
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

void* PinnedBuffer::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_) return p_;
  if (p_) {
    XPERT_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFreeHost(p_);
    p_ = nullptr;
  }
  bytes_ = std::max(bytes, bytes_ * 2);
  XPERT_CUDA_CHECK(cudaHostAlloc(&p_, bytes_, cudaHostAllocPortable));
  return p_;
}

void* PinnedRing::take(size_t bytes, cudaStream_t stream) {
  const size_t step = (bytes + 255) / 256 * 256;
  if (used_ + step > kBytes) {
    if (buf_.data()) XPERT_CUDA_CHECK(cudaStreamSynchronize(stream));
    used_ = 0;
  }
  void* p = static_cast<char*>(buf_.get(kBytes, stream)) + used_;
  used_ += step;
  return p;
}

Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}

cudaEvent_t Event::get() {
  if (!e_) XPERT_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
  return e_;
}

}  // namespace xpert::cuda
