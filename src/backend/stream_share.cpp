#include "backend/stream_share.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "base/error.h"

namespace xpert {
namespace {
constexpr double kAlpha = 0.05;  // weight of a new measurement in the moving averages (48 layers a token)
double average(double old, double v) { return old == 0 ? v : old + kAlpha * (v - old); }
}  // namespace

void StreamShare::set(double share) {
  if (share != kAuto && !(share >= 0 && share <= 1)) fail("stream share {}: expected auto or 0 to 1", share);
  share_ = share;
}

int64_t StreamShare::copies(int64_t used, size_t expert_bytes) {
  int64_t n;
  if (!is_auto()) {
    n = std::clamp<int64_t>(std::llround(share_ * (double)used), 0, used);
  } else {
    const int64_t lo = used >= 2 ? 1 : 0, hi = used >= 2 ? used - 1 : used;
    if (copy_us_per_byte_ == 0 || host_us_per_byte_ == 0) {
      n = std::clamp<int64_t>(std::llround(0.5 * (double)used), lo, hi);
    } else {
      const double b = (double)expert_bytes;
      double best = 0;
      n = lo;
      for (int64_t c = lo; c <= hi; ++c) {
        const double gpu = c ? (double)c * b * copy_us_per_byte_ + gpu_us_ : 0;
        const double host = (double)(used - c) * b * host_us_per_byte_;
        const double t = std::max(gpu, host);
        if (c == lo || t < best) best = t, n = c;
      }
    }
  }
  calls_ += 1;
  copied_ += (double)n;
  used_ += (double)used;
  return n;
}

void StreamShare::observe_copy(size_t bytes, double copy_us, double gpu_us) {
  if (bytes == 0 || !(copy_us > 0)) return;
  copy_us_per_byte_ = average(copy_us_per_byte_, copy_us / (double)bytes);
  gpu_us_ = average(gpu_us_, std::max(gpu_us, 0.0));
}

void StreamShare::observe_host(size_t bytes, double host_us) {
  if (bytes == 0 || !(host_us > 0)) return;
  host_us_per_byte_ = average(host_us_per_byte_, host_us / (double)bytes);
}

double parse_stream_share(const std::string& text) {
  if (text == "auto") return StreamShare::kAuto;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v >= 0 && v <= 1))
    fail("--stream-share {}: expected auto or a share from 0 to 1", text);
  return v;
}

std::string StreamShare::summary() const {
  if (calls_ == 0) return {};
  const auto gbs = [](double us_per_byte) { return us_per_byte > 0 ? 1e-3 / us_per_byte : 0.0; };
  return fmt::format("{}: copied {:.2f} of {:.2f} host experts per call over {:.0f} calls; PCIe {:.1f} GB/s, "
                     "host {:.1f} GB/s, GPU MoE after the copies {:.1f} us",
                     is_auto() ? "auto" : fmt::format("{:g}", share_), copied_ / calls_, used_ / calls_, calls_,
                     gbs(copy_us_per_byte_), gbs(host_us_per_byte_), gpu_us_);
}

}  // namespace xpert
