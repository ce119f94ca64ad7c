// A host vector of floats that a device copies results into (a decode step's logits), kept registered with
// that device (Backend::pin_host) for as long as it lives: the copies are then one DMA each instead of a
// staged copy through the driver's page-locked buffers (the CUDA logits' copy took ~80 us a token that
// way on an H200). ensure() must cover what the next fill resizes the vector to: a buffer that moved
// while registered would leave the registration on freed memory.
#pragma once
#include <cstddef>
#include <vector>

#include "backend/backend.h"

namespace xpert {

class PinnedFloats {
 public:
  explicit PinnedFloats(Backend* device) : dev_(device) {}
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;
  ~PinnedFloats() { unpin(); }

  // Room for n floats, registered where the device does that (the buffer is unregistered before it moves;
  // a buffer the device refused is not offered again).
  void ensure(size_t n) {
    if (v_.capacity() >= n && tried_ == v_.data()) return;
    unpin();
    v_.reserve(n);
    tried_ = v_.data();
    if (dev_ && v_.capacity() > 0 && dev_->pin_host(v_.data(), v_.capacity() * sizeof(float)))
      pinned_ = v_.data();
  }
  std::vector<float>& get() { return v_; }
  const std::vector<float>& get() const { return v_; }
  // After a fill: the buffer must not have moved while registered (ensure() too small is a bug).
  bool intact() const { return !pinned_ || pinned_ == v_.data(); }

 private:
  void unpin() {
    if (pinned_) dev_->unpin_host(pinned_);
    pinned_ = nullptr;
  }
  Backend* dev_;
  std::vector<float> v_;
  void* pinned_ = nullptr;
  const float* tried_ = nullptr;  // the buffer last offered to the device
};

}  // namespace xpert
