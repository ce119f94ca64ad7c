// The CPU as a Backend: host memory, the SIMD kernels of matmul.h / ops.h, moe.h and gated_delta_net.h, all
// parallel over a ThreadPool the caller owns.
#pragma once
#include "backend/backend.h"
#include "base/thread_pool.h"

namespace xpert {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool& pool) : pool_(&pool) {}
  ~CpuBackend() override { drop_scratch(); }
  // This thread's CPU backend running on `pool` (its scratch memory is kept between calls).
  static CpuBackend& of(ThreadPool& pool);
  std::string name() const override { return "cpu"; }
  DeviceKind kind() const override { return DeviceKind::cpu; }
  ThreadPool& pool() const { return *pool_; }

  void* alloc(size_t bytes) override;
  void dealloc(void* p) override;
  void zero(void* p, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;

  void matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) override;
  void matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) override;
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) override;
  void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
            float freq_base, float freq_scale, RopeMode mode) override;
  void swiglu(const float* gate, const float* up, float* y, int64_t n) override;
  void geglu(const float* gate, const float* up, float* y, int64_t n) override;
  void add(const float* a, const float* b, float* y, int64_t n) override;
  void scale(float* x, float s, int64_t n) override;
  void add_bias(float* x, const float* bias, int64_t rows, int64_t n) override;
  void mul_sigmoid(float* x, const float* gate, int64_t n) override;
  void add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n) override;
  void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) override;
  void gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) override;
  void store_kv(const float* x, void* dst, int64_t n, DType type) override;
  void attention(const AttentionArgs& a) override;
  void moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) override;
  void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                       float* ssm_state, float* out) override;

 private:
  ThreadPool* pool_;
};

}  // namespace xpert
