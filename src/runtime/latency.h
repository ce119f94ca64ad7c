// Latency samples for /metrics and `xpert bench --parallel`: the last `capacity` values of one measure
// (time to first token, time between tokens), with their percentiles. Not thread-safe: the engine keeps
// them under its mutex.
#pragma once
#include <cstddef>
#include <vector>

namespace xpert {

class LatencyWindow {
 public:
  explicit LatencyWindow(size_t capacity = 4096) : cap_(capacity) {}
  void add(double seconds);
  // The q-quantile (0 <= q <= 1) of the samples held, the nearest-rank value; 0 when there are none.
  double quantile(double q) const;
  size_t size() const { return v_.size(); }
  size_t total() const { return total_; }  // samples ever added
  double sum() const { return sum_; }       // of every sample ever added
  void clear() { v_.clear(), next_ = 0; }

 private:
  size_t cap_, next_ = 0, total_ = 0;
  double sum_ = 0;
  std::vector<double> v_;  // a ring once full
};

}  // namespace xpert
