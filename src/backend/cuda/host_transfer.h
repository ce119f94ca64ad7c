// Host <-> GPU hand-offs of the split MoE layers: page-locked ranges of the mmap'd experts, pinned
// buffers, an event. A copy from pageable memory goes through the driver's bounce buffers at a fraction
// of the PCIe rate and blocks the caller; from pinned memory it is one asynchronous DMA.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace xpert::cuda {

// Ranges of host memory pinned once, on first use, and released with the object.
class HostPins {
 public:
  HostPins() = default;
  HostPins(const HostPins&) = delete;
  HostPins& operator=(const HostPins&) = delete;
  ~HostPins();

  // Pins the pages of [p, p + bytes) not pinned yet (read-only for the device). False when this host
  // or driver refuses: copies then still work, through the driver's staging. Logs the first refusal.
  bool pin(const void* p, size_t bytes);
  size_t pinned_bytes() const { return pinned_bytes_; }
  // [p, p + bytes) cut where registered ranges begin or end: a copy must not span two registrations
  // (nor a registered and an unregistered range), or the driver refuses it.
  template <class F>
  void for_each_piece(const void* p, size_t bytes, F&& f) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t b = a + bytes;
    while (a < b) {
      uintptr_t cut = b;
      auto it = ranges_.upper_bound(a);
      if (it != ranges_.end()) cut = std::min(cut, it->first);
      if (it != ranges_.begin() && std::prev(it)->second > a) cut = std::min(cut, std::prev(it)->second);
      f(reinterpret_cast<const void*>(a), (size_t)(cut - a));
      a = cut;
    }
  }

 private:
  std::map<uintptr_t, uintptr_t> ranges_;  // registered [start, end), page aligned, disjoint
  size_t pinned_bytes_ = 0;
  bool refused_ = false;
};

// Host memory from cudaHostAlloc that only grows; reallocating waits for the stream first (a copy may
// still read the old block).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  void* get(size_t bytes, cudaStream_t stream);  // at least bytes; may move (then waits for the stream first)
  void* data() const { return p_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host memory that small host-to-device copies pass through, taken in turn: a copy from pinned
// memory is one DMA the driver need not stage. A turn that wraps around waits for the stream first (the
// copies queued from the start of the ring may still be reading it).
class PinnedRing {
 public:
  static constexpr size_t kBytes = 1 << 20;
  static constexpr size_t kMaxCopy = 64 << 10;    // larger copies go straight from their memory
  void* take(size_t bytes, cudaStream_t stream);  // bytes <= kMaxCopy
 private:
  PinnedBuffer buf_;
  size_t used_ = kBytes;  // the first take allocates and starts at 0
};

// An event without timing, created on first use (on the current device).
class Event {
 public:
  Event() = default;
  explicit Event(bool timing) : timing_(timing) {}  // timing: cudaEventElapsedTime works on it
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  cudaEvent_t get();

 private:
  cudaEvent_t e_ = nullptr;
  bool timing_ = false;
};

}  // namespace xpert::cuda
