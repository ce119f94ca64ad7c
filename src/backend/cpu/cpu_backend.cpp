#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backend/cpu/gated_delta_net.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "base/error.h"

namespace xpert {

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

CpuBackend& CpuBackend::of(ThreadPool& pool) {
  thread_local CpuBackend b(pool);
  b.pool_ = &pool;
  return b;
}

void* CpuBackend::alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) fail("out of host memory allocating {} bytes", bytes);
  return p;
}
void CpuBackend::dealloc(void* p) { std::free(p); }
void CpuBackend::zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }
void CpuBackend::copy_from_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy(void* dst, const void* src, size_t bytes) { std::memmove(dst, src, bytes); }

void CpuBackend::matmul(const Weight& w, const float* x, int64_t m, float* y, int64_t ldy) {
  cpu::matmul(w.type, w.data, w.ne[1], w.ne[0], x, m, y, ldy ? ldy : w.ne[1], *pool_);
}

// Decode (fewer X rows than the prefill panels take): one parallel region and one quantized copy of x for
// all the products (q, k and v pay one fork-join instead of three); the same tile kernels, so the same bits.
void CpuBackend::matmuls(const float* x, int64_t m, std::span<const MatmulJob> jobs) {
  if (m >= 8 || jobs.size() < 2) return Backend::matmuls(x, m, jobs);
  std::vector<cpu::MatmulJob> batch;
  batch.reserve(jobs.size());
  for (const MatmulJob& j : jobs)
    batch.push_back({.w_type = j.w->type, .w = j.w->data, .n = j.w->ne[1], .k = j.w->ne[0], .x = x, .m = m,
                     .y = j.y, .ldy = j.ldy ? j.ldy : j.w->ne[1]});
  cpu::matmul_batch(batch, *pool_);
}
void CpuBackend::rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  cpu::rmsnorm(x, w, y, rows, n, eps);
}
void CpuBackend::rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                      int64_t n_rot, float freq_base, float freq_scale, RopeMode mode) {
  cpu::rope(x, pos, n_tokens, n_heads, head_dim, n_rot, freq_base, freq_scale, mode);
}
void CpuBackend::swiglu(const float* gate, const float* up, float* y, int64_t n) { cpu::swiglu(gate, up, y, n); }
void CpuBackend::geglu(const float* gate, const float* up, float* y, int64_t n) { cpu::geglu(gate, up, y, n, pool_); }
void CpuBackend::add(const float* a, const float* b, float* y, int64_t n) { cpu::add(a, b, y, n); }
void CpuBackend::scale(float* x, float s, int64_t n) { cpu::scale(x, s, n); }
void CpuBackend::add_bias(float* x, const float* bias, int64_t rows, int64_t n) { cpu::add_bias(x, bias, rows, n); }

void CpuBackend::mul_sigmoid(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid(gate[i]);
}

void CpuBackend::add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float gr = sigmoid(g[r]);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += s[r * n + i] * gr;
  }
}

void CpuBackend::deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(a + r * width, src + r * 2 * width, width * sizeof(float));
    std::memcpy(b + r * width, src + r * 2 * width + width, width * sizeof(float));
  }
}

void CpuBackend::gather_rows(const float* x, std::span<const int64_t> rows, int64_t width, float* y) {
  for (size_t i = 0; i < rows.size(); ++i) std::memmove(y + i * width, x + rows[i] * width, width * sizeof(float));
}

void CpuBackend::store_kv(const float* x, void* dst, int64_t n, DType type) { cpu::store_kv(x, dst, n, type); }
void CpuBackend::attention(const AttentionArgs& a) { cpu::attention(a, *pool_); }

void CpuBackend::moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out) {
  thread_local cpu::MoeScratch s;
  cpu::moe_ffn(m, x, n, out, s, *pool_);
}

void CpuBackend::gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                                 float* conv_state, float* ssm_state, float* out) {
  thread_local cpu::GdnScratch scratch;
  cpu::gated_delta_net(s, p, in, conv_state, ssm_state, out, scratch, *pool_);
}

}  // namespace xpert
