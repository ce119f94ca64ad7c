// A test backend that is the CPU for every op but the routed experts: the split-MoE tests derive from it
// and implement moe_ffn (how they split a layer between two executors).
#pragma once
#include <span>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace xpert {

class CpuForwardingBackend : public Backend {
 public:
  explicit CpuForwardingBackend(ThreadPool& pool) : cpu_(pool) {}
  ~CpuForwardingBackend() override { drop_scratch(); }

  DeviceKind kind() const override { return DeviceKind::cpu; }
  void* alloc(size_t bytes) override { return cpu_.alloc(bytes); }
  void dealloc(void* p) override { cpu_.dealloc(p); }
  void zero(void* p, size_t bytes) override { cpu_.zero(p, bytes); }
  void copy_from_host(void* d, const void* s, size_t n) override { cpu_.copy_from_host(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { cpu_.copy_to_host(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { cpu_.copy(d, s, n); }
  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override {
    cpu_.matmul(w, x, m, y, ldy);
  }
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override {
    cpu_.rmsnorm(x, w, y, rows, n, eps);
  }
  void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
            float freq_base, float freq_scale, RopeMode mode) override {
    cpu_.rope(x, pos, n_tokens, n_heads, head_dim, n_rot, freq_base, freq_scale, mode);
  }
  void swiglu(const float* g, const float* u, float* y, int64_t n) override { cpu_.swiglu(g, u, y, n); }
  void geglu(const float* g, const float* u, float* y, int64_t n) override { cpu_.geglu(g, u, y, n); }
  void add(const float* a, const float* b, float* y, int64_t n) override { cpu_.add(a, b, y, n); }
  void scale(float* x, float s, int64_t n) override { cpu_.scale(x, s, n); }
  void add_bias(float* x, const float* bias, int64_t rows, int64_t n) override {
    cpu_.add_bias(x, bias, rows, n);
  }
  void mul_sigmoid(float* x, const float* g, int64_t n) override { cpu_.mul_sigmoid(x, g, n); }
  void add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n) override {
    cpu_.add_sigmoid_scaled(y, s, g, rows, n);
  }
  void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) override {
    cpu_.deinterleave(src, rows, width, a, b);
  }
  void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) override {
    cpu_.gather_rows(x, rows, width, y);
  }
  void store_kv(const float* x, void* dst, int64_t n, DType type) override { cpu_.store_kv(x, dst, n, type); }
  void attention(const AttentionArgs& a) override { cpu_.attention(a); }
  void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                       float* conv_state, float* ssm_state, float* out) override {
    cpu_.gated_delta_net(s, p, in, conv_state, ssm_state, out);
  }

 protected:
  CpuBackend cpu_;
};

}  // namespace xpert
