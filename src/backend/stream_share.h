// How many of a split MoE layer's host experts a small batch (decode) copies to the GPU while the host's
// threads compute the others (CudaBackend::moe_streamed). PCIe and the cores' memory bandwidth add up, so
// the best split is where both sides finish together; where that is depends on the machine (one H200 host
// measured best at 3 of 8 copied, another at 4 of 8: docs/PERF.md). Fixed (`--stream-share S`: round(S x
// used)) or, by default, balanced from measured rates: each call reports how long its copies, the GPU's
// MoE after them and the host's experts took, and the next call picks the count that minimizes the
// longer side, max(n B p + g, (used - n) B q) for experts of B bytes, copy time p and host time q per
// byte (moving averages) and the GPU's MoE time g. Auto keeps at least one expert on each side (when two
// or more are used) so both rates stay measured.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace xpert {

class StreamShare {
 public:
  static constexpr double kAuto = -1;
  explicit StreamShare(double share = kAuto) { set(share); }
  void set(double share);  // kAuto, or a share in [0, 1]
  bool is_auto() const { return share_ < 0; }
  double fixed() const { return share_; }
  // Of `used` host experts of `expert_bytes` bytes each, how many to copy (counted for the summary).
  int64_t copies(int64_t used, size_t expert_bytes);
  // Measurements of one call: `bytes` copied in copy_us, then the GPU's MoE took gpu_us; the host computed
  // `bytes` in host_us. Calls that copied or computed nothing report nothing for that side.
  void observe_copy(size_t bytes, double copy_us, double gpu_us);
  void observe_host(size_t bytes, double host_us);
  // "auto: copied 3.0 of 8.0 host experts per call; PCIe 52.1 GB/s, host 80.3 GB/s" (empty before a call).
  std::string summary() const;

 private:
  double share_ = kAuto;
  double copy_us_per_byte_ = 0, host_us_per_byte_ = 0, gpu_us_ = 0;  // 0: not measured yet
  double calls_ = 0, copied_ = 0, used_ = 0;  // for the summary
};

// `--stream-share` text: "auto" -> StreamShare::kAuto, a number from 0 to 1 -> itself; else Error.
double parse_stream_share(const std::string& text);

}  // namespace xpert
