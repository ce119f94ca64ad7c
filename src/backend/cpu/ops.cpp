#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_attn.h"
#include "backend/cpu/ops_f16.h"
#include "backend/cpu/ops_kv.h"
#include "base/error.h"
#include "base/half.h"
#include "quant/quant.h"

namespace xpert::cpu {

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)(xr[i] * xr[i]);
    const float mean = (float)(sum / (double)n);
    const float s = 1.0f / std::sqrt(mean + eps);
    if (w) {
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * s) * w[i];
    } else {
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * s;
    }
  }
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
          float freq_base, float freq_scale, RopeMode mode) {
  const float theta_scale = std::pow(freq_base, -2.0f / (float)n_rot);
  std::vector<float> cs(n_rot);  // cos, sin per pair
  for (int64_t t = 0; t < n_tokens; ++t) {
    // Angles by repeated multiplication, as ggml builds its cache, so they round the same way.
    float theta = (float)pos[t];
    for (int64_t i = 0; i < n_rot; i += 2) {
      const float th = freq_scale * theta;
      cs[i] = std::cos(th);
      cs[i + 1] = std::sin(th);
      theta *= theta_scale;
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < n_rot; i += 2) {
        const float c = cs[i], s = cs[i + 1];
        const int64_t a = mode == RopeMode::neox ? i / 2 : i;
        const int64_t b = mode == RopeMode::neox ? i / 2 + n_rot / 2 : i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

namespace {

float gelu_tanh(float x) {
  const float k = 0.79788456080286535587989211986876f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(k * x * (1.0f + 0.044715f * x * x)));
}

// gelu(h) for every f16 value h, rounded to f16: llama.cpp's CPU backend computes GELU this way.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f32_to_f16(gelu_tanh(f16_to_f32((uint16_t)i)));
    return t;
  }();
  return table;
}

}  // namespace

void geglu(const float* gate, const float* up, float* y, int64_t n, ThreadPool* pool) {
  const uint16_t* t = gelu_table().data();
  const auto& k = f16_kernels();
  if (!pool || n < 4096) return k.geglu(gate, up, y, n, t);
  pool->parallel_for(n, [&](int64_t b, int64_t e) { k.geglu(gate + b, up + b, y + b, e - b, t); }, 64);
}

void swiglu(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_bias(float* x, const float* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) x[r * n + i] += bias[i];
}

void store_f16(const float* x, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(x[i]);
}

void store_kv(const float* x, void* dst, int64_t n, DType type) {
  if (type == DType::F16) return store_f16(x, static_cast<uint16_t*>(dst), n);
  XP_ASSERT(type == DType::Q8_0 || type == DType::Q4_0);
  quantize_row(type, x, dst, n);
}

namespace {

// Keys a query row at position p sees.
int64_t row_keys(const AttentionArgs& a, int32_t p) {
  const int64_t lo = a.sliding_window > 0 ? std::max<int64_t>(0, p - a.sliding_window + 1) : 0;
  return std::min<int64_t>(p, a.n_kv - 1) - lo + 1;
}

// The short path (llama.cpp's rounding points), for any cache type: kdot(q, k row of kv head hk at key j)
// and vaxpy(w, v row, acc) read the cache (f16: the same function pointers the loop always called, so that
// path is unchanged). Rows that see more than max_keys keys are left to the tiled path.
template <class KDot, class VAxpy>
void attend(const AttentionArgs& a, ThreadPool& pool, int64_t max_keys, KDot kdot, VAxpy vaxpy) {
  const int64_t group = a.n_head / a.n_head_kv;
  const int64_t D = a.head_dim;
  const F16Kernels& f16 = f16_kernels();
  // One unit of work = one (token, head) pair.
  pool.parallel_for(a.n_tokens * a.n_head, [&](int64_t begin, int64_t end) {
    std::vector<float> qh(D), scores(a.n_kv), acc(D);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t t = u / a.n_head, h = u % a.n_head, hk = h / group;
      const int32_t p = a.pos[t];
      if (row_keys(a, p) > max_keys) continue;
      const float* q = a.q + (t * a.n_head + h) * D;
      // q is rounded to f16 as llama.cpp's f16 K-cache product does.
      std::copy(q, q + D, qh.begin());
      f16.round_f16(qh.data(), D);
      const int64_t lo = a.sliding_window > 0 ? std::max<int64_t>(0, p - a.sliding_window + 1) : 0;
      const int64_t hi = std::min<int64_t>(p, a.n_kv - 1);
      float mx = -INFINITY;
      for (int64_t j = lo; j <= hi; ++j) {
        const float s = kdot(qh.data(), j, hk) * a.kq_scale;
        scores[j] = s;
        mx = std::max(mx, s);
      }
      const int64_t n_keys = hi - lo + 1;
      float* sc = scores.data() + lo;
      const float inv = (float)(1.0 / f16.exp_sum(sc, mx, sc, n_keys));
      for (int64_t j = 0; j < n_keys; ++j) sc[j] *= inv;
      // The weights meet an f16 V cache as f16 in llama.cpp's product.
      f16.round_f16(sc, n_keys);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = lo; j <= hi; ++j) vaxpy(scores[j], j, hk, acc.data());
      std::copy(acc.begin(), acc.end(), a.out + (t * a.n_head + h) * D);
    }
  });
}

}  // namespace

void attention_plain(const AttentionArgs& a, ThreadPool& pool, int64_t max_keys) {
  const int64_t D = a.head_dim, kv_row = a.n_head_kv * D;
  if (a.k_type == DType::F16 && a.v_type == DType::F16) {
    const F16Kernels& f16 = f16_kernels();
    const auto* k = static_cast<const uint16_t*>(a.k);
    const auto* v = static_cast<const uint16_t*>(a.v);
    return attend(
        a, pool, max_keys, [&](const float* q, int64_t j, int64_t hk) { return f16.dot(q, k + j * kv_row + hk * D, D); },
        [&](float w, int64_t j, int64_t hk, float* acc) { f16.axpy(w, v + j * kv_row + hk * D, acc, D); });
  }
  // Mixed or quantized: each side through its own row reader, rows addressed in bytes.
  auto reader = [&](DType t) -> KvRowKernels {
    if (t != DType::F16) return kv_row_kernels(t);
    return {[](const float* q, const void* k, int64_t n) { return f16_kernels().dot(q, static_cast<const uint16_t*>(k), n); },
            [](float w, const void* v, float* acc, int64_t n) {
              f16_kernels().axpy(w, static_cast<const uint16_t*>(v), acc, n);
            }};
  };
  XP_ASSERT(D % 32 == 0 || (a.k_type == DType::F16 && a.v_type == DType::F16));
  const KvRowKernels kr = reader(a.k_type), vr = reader(a.v_type);
  const size_t k_row = row_bytes(a.k_type, kv_row), k_head = row_bytes(a.k_type, D);
  const size_t v_row = row_bytes(a.v_type, kv_row), v_head = row_bytes(a.v_type, D);
  const auto* k = static_cast<const uint8_t*>(a.k);
  const auto* v = static_cast<const uint8_t*>(a.v);
  attend(
      a, pool, max_keys, [&](const float* q, int64_t j, int64_t hk) { return kr.dot(q, k + j * k_row + hk * k_head, D); },
      [&](float w, int64_t j, int64_t hk, float* acc) { vr.axpy(w, v + j * v_row + hk * v_head, acc, D); });
}

void attention(const AttentionArgs& a, ThreadPool& pool) {
  int64_t most = 0, least = INT64_MAX;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t n = row_keys(a, a.pos[t]);
    most = std::max(most, n);
    least = std::min(least, n);
  }
  if (most < kAttentionTiledMinKeys) return attention_plain(a, pool);
  if (least < kAttentionTiledMinKeys) attention_plain(a, pool, kAttentionTiledMinKeys - 1);  // the short rows
  attention_tiled(a, pool, kAttentionTiledMinKeys);
}

}  // namespace xpert::cpu
