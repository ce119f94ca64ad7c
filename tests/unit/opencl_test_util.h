// What the OpenCL tests share (test_opencl_backend.cpp, test_opencl_fused.cpp, the model tests): whether there
// is a device, one device for the whole test binary (its programs built once), DEVICE_OR_SKIP for machines
// without one, random data, and copies to and from device memory. Only where XPERT_HAVE_OPENCL is defined.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/opencl/discovery.h"
#include "backend/opencl/opencl_backend.h"
#include "base/error.h"
#include "base/half.h"
#include "quant/quant.h"

namespace xpert::cltest {

// Whether the machine shows an OpenCL device (false, not an exception, without a loader or a platform).
inline bool have_device() {
  try {
    return !opencl::list_devices().empty();
  } catch (const Error&) {
    return false;
  }
}

// OpenCL device 0 as a whole-model backend; null when the machine has none (or none with SVM).
inline Backend* device() {
  static std::shared_ptr<Backend> b = []() -> std::shared_ptr<Backend> {
    try {
      if (opencl::list_devices().empty()) return nullptr;
      return make_opencl_backend(0);
    } catch (const Error&) {
      return nullptr;
    }
  }();
  return b.get();
}

inline std::vector<float> random_vec(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// n rows of k weights drawn as random_vec(n * k, rng, 0.05f), quantized as type: the bytes a device reads.
inline std::vector<uint8_t> random_weights(DType type, int64_t n, int64_t k, std::mt19937& rng) {
  const std::vector<float> wf = random_vec(n * k, rng, 0.05f);
  const size_t rb = row_bytes(type, k);
  std::vector<uint8_t> wq(rb * n);
  for (int64_t r = 0; r < n; ++r) quantize_row(type, wf.data() + r * k, wq.data() + r * rb, k);
  return wq;
}

// The first n values of each of y's m rows of ldy (a product written into a wider output); *untouched:
// whether every row's value n still holds `sentinel` (the product wrote no column past n).
inline std::vector<float> first_columns(const std::vector<float>& y, int64_t m, int64_t n, int64_t ldy,
                                        float sentinel, bool* untouched) {
  std::vector<float> packed(m * n);
  *untouched = true;
  for (int64_t i = 0; i < m; ++i) {
    std::copy(y.begin() + i * ldy, y.begin() + i * ldy + n, packed.begin() + i * n);
    if (y[i * ldy + n] != sentinel) *untouched = false;
  }
  return packed;
}

// An attention case (n_tokens at pos0 after a prefix, heads, sliding window) and its random inputs: q, an f16
// cache of n_kv rows (as the CPU rounds it), the positions; args() over pointers to them (host or device).
struct AttCase {
  int64_t n_tokens, pos0, n_head, n_head_kv, head_dim;
  int32_t window;
};
struct AttInputs {
  AttCase c;
  int64_t n_kv;
  std::vector<float> q;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> pos;
  AttInputs(const AttCase& ac, std::mt19937& rng) : c(ac), n_kv(ac.pos0 + ac.n_tokens) {
    const int64_t kv_row = c.n_head_kv * c.head_dim;
    q = random_vec(c.n_tokens * c.n_head * c.head_dim, rng);
    const std::vector<float> kf = random_vec(n_kv * kv_row, rng), vf = random_vec(n_kv * kv_row, rng);
    k.resize(kf.size()), v.resize(vf.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_f16(kf[i]), v[i] = f32_to_f16(vf[i]);
    for (int64_t t = 0; t < c.n_tokens; ++t) pos.push_back((int32_t)(c.pos0 + t));
  }
  AttentionArgs args(const float* q_, const void* k_, const void* v_, float* out, const int32_t* pos_) const {
    return {.q = q_,
            .k = k_,
            .v = v_,
            .out = out,
            .pos = pos_,
            .n_tokens = c.n_tokens,
            .n_head = c.n_head,
            .n_head_kv = c.n_head_kv,
            .head_dim = c.head_dim,
            .n_kv = n_kv,
            .kq_scale = 1.0f / std::sqrt((float)c.head_dim),
            .sliding_window = c.window};
  }
};

// Device memory holding a copy of host data.
template <typename T>
DeviceBuffer upload(Backend& b, const std::vector<T>& v) {
  DeviceBuffer buf(b, std::max<size_t>(v.size() * sizeof(T), 1));
  b.copy_from_host(buf.data(), v.data(), v.size() * sizeof(T));
  return buf;
}
template <typename T>
std::vector<T> download(Backend& b, const DeviceBuffer& buf, size_t n) {
  std::vector<T> v(n);
  b.copy_to_host(v.data(), buf.data(), n * sizeof(T));
  return v;
}
template <typename T>
T* ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.data());
}

// max |a - b| / max(max |b|, floor)
inline float rel_err(const std::vector<float>& a, const std::vector<float>& b, float floor = 1e-6f) {
  float worst = 0, scale = floor;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return worst / scale;
}

// Intel's offline compiler (ocloc, Debian package intel-opencl-icd) on PATH, or "" (the offline compile
// checks of test_opencl_xmx.cpp and test_opencl_intel.cpp skip).
inline std::string find_ocloc() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::filesystem::path p = std::filesystem::path(dir.empty() ? "." : dir) / "ocloc";
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace xpert::cltest

// In a test body: dev, the device (a Backend&), or the test skips.
#define DEVICE_OR_SKIP()                                  \
  Backend* dev_ = ::xpert::cltest::device();              \
  if (!dev_) GTEST_SKIP() << "no OpenCL device with SVM"; \
  Backend& dev = *dev_;
