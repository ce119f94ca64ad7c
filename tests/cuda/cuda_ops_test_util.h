// Helpers of the CUDA op / attention / Gated DeltaNet tests: skip without a GPU, device copies of host
// vectors, random data, error measures.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/check.h"
#include "cuda_test_util.h"

namespace xpert::cudaops_test {

// Skipping without a GPU is cuda_test_util.h's.
#define XPERT_OPS_REQUIRE_GPU() XPERT_REQUIRE_GPU()

// A device copy of a host vector (or n uninitialized elements), freed on destruction.
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) { XPERT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { upload(v); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    XPERT_CUDA_CHECK(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    XPERT_CUDA_CHECK(cudaDeviceSynchronize());
    XPERT_CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // Every byte 0xff: an f32 NaN, so an output the kernel forgets to write fails the comparison.
  void poison() { XPERT_CUDA_CHECK(cudaMemset(p_, 0xff, std::max<size_t>(n_, 1) * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

using ::xpert::randn;  // the unit tests' normal generator (test_data.h)

struct Err {
  double max_abs = 0, rel_l2 = 0, ref_max = 0;
  bool finite = true;
};

// |got - ref| measures; any NaN / inf in got makes finite false.
template <class A, class B>
Err compare(const A& got, const B& ref) {
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = (double)got[i], r = (double)ref[i];
    if (!std::isfinite(g)) e.finite = false;
    e.max_abs = std::max(e.max_abs, std::fabs(g - r));
    e.ref_max = std::max(e.ref_max, std::fabs(r));
    num += (g - r) * (g - r);
    den += r * r;
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

inline std::ostream& operator<<(std::ostream& o, const Err& e) {
  return o << "max_abs " << e.max_abs << " rel_l2 " << e.rel_l2 << " ref_max " << e.ref_max
           << (e.finite ? "" : " NON-FINITE");
}

}  // namespace xpert::cudaops_test
