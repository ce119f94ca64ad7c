#include "runtime/latency.h"

#include <algorithm>
#include <cmath>

namespace xpert {

void LatencyWindow::add(double seconds) {
  ++total_;
  sum_ += seconds;
  if (cap_ == 0) return;
  if (v_.size() < cap_) {
    v_.push_back(seconds);
    return;
  }
  v_[next_] = seconds;
  next_ = (next_ + 1) % cap_;
}

double LatencyWindow::quantile(double q) const {
  if (v_.empty()) return 0.0;
  std::vector<double> s = v_;
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  const size_t rank = (size_t)std::max(1.0, std::ceil(std::clamp(q, 0.0, 1.0) * (double)s.size()));
  std::nth_element(s.begin(), s.begin() + (rank - 1), s.end());
  return s[rank - 1];
}

}  // namespace xpert
