// Elementwise and normalization kernels (ops.h) and the launch helpers of ops_internal.h.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/head_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/q8_1.cuh"
#include "backend/cuda/sigmoid.cuh"

namespace xpert::cuda {

namespace detail {

namespace {
constexpr int kMaxDevices = 64;
int current_device() {
  int dev = 0;
  XPERT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) detail::fail_rt("cuda: device index ", dev, " out of range");
  return dev;
}
int cached_attribute(cudaDeviceAttr attr, int (&cache)[kMaxDevices]) {
  const int dev = current_device();
  if (cache[dev] == 0) {
    int v = 0;
    XPERT_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    cache[dev] = v;  // racing writers store the same value
  }
  return cache[dev];
}
}  // namespace

int sm_count() {
  static int cache[kMaxDevices] = {};
  return cached_attribute(cudaDevAttrMultiProcessorCount, cache);
}

int max_smem_optin() {
  static int cache[kMaxDevices] = {};
  return cached_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, cache);
}

int cc_major() {
  static int cache[kMaxDevices] = {};
  return cached_attribute(cudaDevAttrComputeCapabilityMajor, cache);
}

void set_smem_limit(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> done;
  const int dev = current_device();
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = done[{kernel, dev}];
  if (have >= bytes) return;
  if (bytes > (size_t)max_smem_optin())
    detail::fail_rt("cuda: a kernel needs ", bytes, " bytes of shared memory, the device allows ",
                    max_smem_optin());
  XPERT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  have = bytes;
}

bool pdl_enabled() {
  static const bool on = [] {
    if (!env_on("XPERT_PDL")) return false;
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()) == cudaSuccess &&
           major >= 9;
  }();
  return on;
}

bool prefetch_enabled() {
  static const bool on = env_on("XPERT_PREFETCH");
  return on;
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return (unsigned)std::clamp<int64_t>(blocks, 1, (int64_t)sm_count() * 16);
}

}  // namespace detail

namespace {

using detail::grid_for;

constexpr int kThreads = 256;

#define XPERT_GRID_STRIDE(i, n)                                             \
  pdl_begin();                                                              \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

// Sum of squares in double (as the CPU), one warp per row, or one block per row for long rows. With d:
// x += d first (the residual add before a norm; x is then written back). With q: y's q8_1 blocks too, as
// quantize_q8_1_kernel rounds them (each warp step covers one whole 32-block of the row), so the decode
// products that follow skip their own conversion (matmul.h's prepared activations).
template <bool kBlockPerRow>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(float* x, int64_t xs, const float* __restrict__ d, const float* w, float* y, int64_t ys,
                   int64_t rows, int n, float eps, int8_t* __restrict__ q, float2* __restrict__ ds) {
  __shared__ double red[kThreads / 32];
  pdl_begin();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = kBlockPerRow ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * (kThreads / 32) + warp;
  if (row >= rows) return;
  const int first = kBlockPerRow ? threadIdx.x : lane, step = kBlockPerRow ? kThreads : 32;
  float* xr = x + row * xs;
  float* yr = y + row * ys;
  double sum = 0.0;
  for (int i = first; i < n; i += step) {
    float v = xr[i];
    if (d) {
      v = v + d[row * n + i];
      xr[i] = v;
    }
    sum += (double)(v * v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if constexpr (kBlockPerRow) {
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = 0.0;
    for (int i = 0; i < kThreads / 32; ++i) sum += red[i];
  }
  const float mean = (float)(sum / (double)n);
  const float s = 1.0f / sqrtf(mean + eps);
  for (int i = first; i < n; i += step) {
    const float v = w ? __fmul_rn(__fmul_rn(xr[i], s), w[i]) : __fmul_rn(xr[i], s);
    yr[i] = v;
    // n % 32 == 0 and step % 32 == 0: this warp holds block i / 32 whole
    if (q) warp_quantize_q8_1(v, q + row * n + i, ds + (row * n + i) / 32);
  }
}

// The long-row form of rmsnorm_kernel for decode-sized batches: a 1024-thread block per row, each thread
// holding kPer values in registers, so every load of the row (x, d, w) is issued before the first is
// needed (the looping form waits for memory once per step: 8.5 us for a row of 2048 on an H200).
constexpr int kWideThreads = 1024;
template <int kPer>
__global__ void __launch_bounds__(kWideThreads)
    rmsnorm_wide_kernel(float* x, int64_t xs, const float* __restrict__ d, const float* w, float* y, int64_t ys,
                        int n, float eps, int8_t* __restrict__ q, float2* __restrict__ ds) {
  __shared__ double red[kWideThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = blockIdx.x;
  float* xr = x + row * xs;
  float* yr = y + row * ys;
  float v[kPer], wv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // the norm's weights before the wait: no kernel writes them
    const int i = threadIdx.x + j * kWideThreads;
    wv[j] = w && i < n ? w[i] : 1.0f;
  }
  pdl_begin();
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kWideThreads;
    v[j] = i < n ? xr[i] : 0.0f;
    if (d) v[j] = i < n ? v[j] + d[row * n + i] : 0.0f;
  }
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kWideThreads;
    if (i < n) {
      if (d) xr[i] = v[j];
      sum += (double)(v[j] * v[j]);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  // Every warp adds the 32 partial sums as a tree (5 shuffles), not one after another (32 dependent shared
  // loads and adds: ~0.5 us of a ~4 us kernel on the H200). The same tree in every warp: the same bits.
  static_assert(kWideThreads / 32 == 32, "one partial sum a lane");
  sum = red[lane];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float mean = (float)(sum / (double)n);
  const float s = 1.0f / sqrtf(mean + eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kWideThreads;
    if (i >= n) break;  // n % 32 == 0 with q: whole warps leave together
    const float o = w ? __fmul_rn(__fmul_rn(v[j], s), wv[j]) : __fmul_rn(v[j], s);
    yr[i] = o;
    if (q) warp_quantize_q8_1(o, q + row * n + i, ds + (row * n + i) / 32);
  }
}

// Per-head RMS norm (when the tensor has norm weights) and RoPE of q and k in one pass: a warp per head
// row, the normalized row staged in shared memory for the rotation. The norm is rmsnorm_kernel's warp form
// (same sums, same bits); each rotated pair builds its angle as the CPU does (theta = pos, then theta *=
// theta_scale once per pair before it), so the angles are the same floats. With kc/vc (decode into an f16
// cache) the k rows go to the cache instead of back to k, and v's rows are stored too (store_kv_f16's
// rounding), so one launch replaces the norms, the rotations and both stores.
constexpr int kRopeWarps = 4;
constexpr int kRopeMaxDim = 512;
struct NormRopeParams {
  float* q;
  float* k;
  const float* v;
  const float* qw;
  const float* kw;
  bool q_norm, k_norm, neox;
  const int32_t* pos;
  int64_t n_tokens;
  int n_head, n_head_kv, head_dim, n_rot;
  int64_t q_stride;  // floats between (token, head) rows of q
  float theta_scale, freq_scale, eps;
  __half* kc;  // null: k in place, v untouched
  __half* vc;
  int64_t slot_stride;  // in halves
  const int32_t* slots;
};

__global__ void __launch_bounds__(kRopeWarps * 32) norm_rope_kernel(NormRopeParams p) {
  __shared__ float buf[kRopeWarps][kRopeMaxDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int D = p.head_dim;
  const int heads = p.n_head + p.n_head_kv * (p.kc ? 2 : 1);
  const int64_t r = (int64_t)blockIdx.x * kRopeWarps + warp;
  const int64_t t = r / heads;
  const int h = (int)(r % heads);
  const int hk = h - p.n_head;  // k head (0 <= hk < n_head_kv), then v head hk - n_head_kv
  // This lane's rotation angles (pairs lane, lane + 32, ...) before the wait: the positions come from the
  // step's first copy, before any kernel of it, and each angle is a chain of up to n_rot / 2 dependent
  // multiplies, so it runs while the kernel before finishes.
  constexpr int kPairs = kRopeMaxDim / 64;
  float rc[kPairs], rs[kPairs];
  if (r < p.n_tokens * heads && !(p.kc && hk >= p.n_head_kv))
    rope_angles<kPairs>((float)p.pos[t], p.n_rot, p.theta_scale, p.freq_scale, rc, rs);
  pdl_begin();
  if (r >= p.n_tokens * heads) return;
  __half* cache = nullptr;
  // A lane's values of the row (and of the norm's weights) are loaded together into registers first: each
  // loop that loads and then stores to memory the compiler cannot prove apart waits for every load in turn.
  constexpr int kPerLane = kRopeMaxDim / 32;
  float xv[kPerLane], wv[kPerLane];
  if (p.kc) {
    const int64_t row = (int64_t)p.n_head_kv * D;
    const int64_t at = (p.slots ? p.slots[t] : 0) * p.slot_stride + (int64_t)p.pos[t] * row;
    if (hk >= p.n_head_kv) {  // a v row: stored as it is
      const float* src = p.v + (t * p.n_head_kv + (hk - p.n_head_kv)) * D;
      __half* dst = p.vc + at + (int64_t)(hk - p.n_head_kv) * D;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j < D) xv[j] = src[lane + 32 * j];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (lane + 32 * j < D) dst[lane + 32 * j] = __float2half_rn(xv[j]);
      return;
    }
    if (hk >= 0) cache = p.kc + at + (int64_t)hk * D;
  }
  const bool is_q = hk < 0;
  float* v = is_q ? p.q + (t * p.n_head + h) * p.q_stride : p.k + (t * p.n_head_kv + hk) * D;
  const bool norm = is_q ? p.q_norm : p.k_norm;
  const float* w = is_q ? p.qw : p.kw;
  float* row = buf[warp];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < D) {
      xv[j] = v[i];
      wv[j] = norm && w ? w[i] : 1.0f;
    }
  }
  const float s = norm ? warp_rms_scale<kPerLane>(xv, D, p.eps) : 1.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < D) row[i] = !norm ? xv[j] : w ? __fmul_rn(__fmul_rn(xv[j], s), wv[j]) : __fmul_rn(xv[j], s);
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i2 = lane + 32 * j;
    if (i2 >= p.n_rot / 2) break;
    const float c = rc[j], sn = rs[j];
    const int a = p.neox ? i2 : 2 * i2;
    const int b = p.neox ? i2 + p.n_rot / 2 : 2 * i2 + 1;
    const float x0 = row[a], x1 = row[b];
    const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
    const float y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    if (cache) {
      cache[a] = __float2half_rn(y0);
      cache[b] = __float2half_rn(y1);
    } else {
      v[a] = y0;
      v[b] = y1;
    }
  }
  if (cache)
    for (int i = p.n_rot + lane; i < D; i += 32) cache[i] = __float2half_rn(row[i]);
  else if (norm)
    for (int i = p.n_rot + lane; i < D; i += 32) v[i] = row[i];
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* y, int64_t n) {
  XPERT_GRID_STRIDE(i, n) {
    const float g = gate[i];
    y[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// GELU (tanh form) of the f16-rounded input, rounded to f16: llama.cpp's CPU table, computed in place.
__device__ __forceinline__ float gelu_f16(float g) {
  if (g <= -10.0f) return 0.0f;
  if (g >= 10.0f) return g;
  const float x = __half2float(__float2half_rn(g));
  const float k = 0.79788456080286535587989211986876f;
  const float inner = __fmul_rn(__fmul_rn(k, x), __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, x), x)));
  const float r = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
  return __half2float(__float2half_rn(r));
}

__global__ void geglu_kernel(const float* gate, const float* up, float* y, int64_t n) {
  XPERT_GRID_STRIDE(i, n) y[i] = gelu_f16(gate[i]) * up[i];
}

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  XPERT_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) { XPERT_GRID_STRIDE(i, n) x[i] *= s; }

__global__ void add_bias_kernel(float* x, const float* bias, int64_t rows, int64_t n) {
  XPERT_GRID_STRIDE(i, rows * n) x[i] += bias[i % n];
}

__global__ void mul_sigmoid_kernel(float* x, const float* gate, int64_t gate_stride, int64_t rows,
                                   int64_t n) {
  XPERT_GRID_STRIDE(i, rows * n) {
    const int64_t r = i / n, c = i % n;
    x[i] *= sigmoidf(gate[r * gate_stride + c]);
  }
}

__global__ void add_sigmoid_scaled_kernel(float* y, const float* s, const float* g, int64_t rows, int64_t n) {
  XPERT_GRID_STRIDE(i, rows * n) y[i] += s[i] * sigmoidf(g[i / n]);
}

__global__ void deinterleave_kernel(const float* src, int64_t rows, int64_t width, float* a, float* b) {
  XPERT_GRID_STRIDE(i, rows * width) {
    const int64_t r = i / width, c = i % width;
    a[i] = src[r * 2 * width + c];
    b[i] = src[r * 2 * width + width + c];
  }
}

__global__ void gather_rows_kernel(const float* x, const int64_t* rows, int64_t n_rows, int64_t width,
                                   float* y) {
  XPERT_GRID_STRIDE(i, n_rows * width) y[i] = x[rows[i / width] * width + i % width];
}

__global__ void store_f16_kernel(const float* x, __half* dst, int64_t n) {
  XPERT_GRID_STRIDE(i, n) dst[i] = __float2half_rn(x[i]);
}

__global__ void store_kv_f16_kernel(const float* x, int64_t n_tokens, int64_t row, __half* cache,
                                    int64_t slot_stride, const int32_t* slots, const int32_t* pos) {
  XPERT_GRID_STRIDE(i, n_tokens * row) {
    const int64_t t = i / row, c = i % row;
    const int64_t slot = slots ? slots[t] : 0;
    cache[slot * slot_stride + (int64_t)pos[t] * row + c] = __float2half_rn(x[i]);
  }
}

#define XPERT_LAUNCH_1D(kernel, n, stream, ...)                              \
  do {                                                                       \
    if ((n) <= 0) return;                                                    \
    launch_pdl(kernel, grid_for((n), kThreads), kThreads, 0, (stream), __VA_ARGS__); \
    XPERT_CUDA_CHECK_LAUNCH();                                               \
  } while (0)

}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             cudaStream_t stream) {
  rmsnorm_strided(x, n, w, y, n, rows, n, eps, stream);
}

void rmsnorm_strided(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                     int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  add_rmsnorm_q8(nullptr, const_cast<float*>(x), x_stride, w, y, y_stride, rows, n, eps, nullptr, nullptr,
                 stream);  // x is only read without d
}

void add_rmsnorm_q8(const float* d, float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                    int64_t rows, int64_t n, float eps, int8_t* q, float2* ds, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (n > INT32_MAX) detail::fail_rt("cuda rmsnorm: rows of ", n, " values are too long");
  if (d && x_stride != n) detail::fail_rt("cuda rmsnorm: the residual add needs dense rows");
  if (q && (n % 32 != 0 || y_stride != n))
    detail::fail_rt("cuda rmsnorm: q8_1 output needs dense rows of a multiple of 32, got ", n);
  if (n > 1024 && n <= 8 * kWideThreads && rows <= 64) {
    const unsigned g = (unsigned)rows;
    if (n <= 2 * kWideThreads)
      launch_pdl(rmsnorm_wide_kernel<2>, g, kWideThreads, 0, stream, x, x_stride, d, w, y, y_stride, (int)n, eps, q,
                 ds);
    else if (n <= 4 * kWideThreads)
      launch_pdl(rmsnorm_wide_kernel<4>, g, kWideThreads, 0, stream, x, x_stride, d, w, y, y_stride, (int)n, eps, q,
                 ds);
    else
      launch_pdl(rmsnorm_wide_kernel<8>, g, kWideThreads, 0, stream, x, x_stride, d, w, y, y_stride, (int)n, eps, q,
                 ds);
  } else if (n > 1024) {
    launch_pdl(rmsnorm_kernel<true>, (unsigned)rows, kThreads, 0, stream, x, x_stride, d, w, y, y_stride, rows,
           (int)n, eps, q, ds);
  } else {
    const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
    launch_pdl(rmsnorm_kernel<false>, (unsigned)blocks, kThreads, 0, stream, x, x_stride, d, w, y, y_stride, rows,
           (int)n, eps, q, ds);
  }
  XPERT_CUDA_CHECK_LAUNCH();
}

namespace {
NormRopeParams norm_rope_params(float* q, float* k, const float* q_norm, const float* k_norm, bool norm_q,
                                bool norm_k, const int32_t* pos, int64_t n_tokens, int64_t n_head,
                                int64_t n_head_kv, int64_t head_dim, int64_t n_rot, float freq_base,
                                float freq_scale, RopeMode mode, float eps, int64_t q_stride) {
  if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0)
    detail::fail_rt("cuda rope: n_rot ", n_rot, " must be even and at most head_dim ", head_dim);
  if (head_dim > kRopeMaxDim) detail::fail_rt("cuda rope: head_dim ", head_dim, " is over ", kRopeMaxDim);
  NormRopeParams p{};
  p.q = q, p.k = k, p.qw = q_norm, p.kw = k_norm, p.q_norm = norm_q, p.k_norm = norm_k;
  p.neox = mode == RopeMode::neox;
  p.pos = pos, p.n_tokens = n_tokens, p.n_head = (int)n_head, p.n_head_kv = (int)n_head_kv;
  p.head_dim = (int)head_dim, p.n_rot = (int)n_rot;
  p.q_stride = q_stride ? q_stride : head_dim;
  // The same float expression as cpu::rope, evaluated on the host, so theta_scale is the same float.
  p.theta_scale = std::pow(freq_base, -2.0f / (float)n_rot);
  p.freq_scale = freq_scale, p.eps = eps;
  return p;
}
void launch_norm_rope(const NormRopeParams& p, cudaStream_t stream) {
  const int64_t rows = p.n_tokens * (p.n_head + p.n_head_kv * (p.kc ? 2 : 1));
  if (rows <= 0) return;
  launch_pdl(norm_rope_kernel, (unsigned)((rows + kRopeWarps - 1) / kRopeWarps), kRopeWarps * 32, 0, stream, p);
  XPERT_CUDA_CHECK_LAUNCH();
}
}  // namespace

void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, bool norm_q, bool norm_k,
                  const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                  int64_t n_rot, float freq_base, float freq_scale, RopeMode mode, float eps,
                  cudaStream_t stream, int64_t q_stride) {
  if (n_tokens <= 0 || n_head + n_head_kv <= 0) return;
  launch_norm_rope(norm_rope_params(q, k, q_norm, k_norm, norm_q, norm_k, pos, n_tokens, n_head, n_head_kv,
                                    head_dim, n_rot, freq_base, freq_scale, mode, eps, q_stride),
                   stream);
}

void qk_norm_rope_store_f16(float* q, const float* k, const float* v, const float* q_norm,
                            const float* k_norm, const int32_t* pos, int64_t n_tokens, int64_t n_head,
                            int64_t n_head_kv, int64_t head_dim, int64_t n_rot, float freq_base,
                            float freq_scale, RopeMode mode, float eps, uint16_t* k_cache, uint16_t* v_cache,
                            int64_t slot_stride, const int32_t* slots, cudaStream_t stream,
                            int64_t q_stride) {
  if (n_tokens <= 0) return;
  NormRopeParams p = norm_rope_params(q, const_cast<float*>(k), q_norm, k_norm, q_norm != nullptr,
                                      k_norm != nullptr, pos, n_tokens, n_head, n_head_kv, head_dim, n_rot,
                                      freq_base, freq_scale, mode, eps, q_stride);
  p.v = v;
  p.kc = reinterpret_cast<__half*>(k_cache);
  p.vc = reinterpret_cast<__half*>(v_cache);
  p.slot_stride = slot_stride;
  p.slots = slots;
  launch_norm_rope(p, stream);
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
          float freq_base, float freq_scale, RopeMode mode, cudaStream_t stream) {
  qk_norm_rope(x, nullptr, nullptr, nullptr, false, false, pos, n_tokens, n_heads, 0, head_dim, n_rot,
               freq_base, freq_scale, mode, 0.0f, stream);
}

void swiglu(const float* gate, const float* up, float* y, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(swiglu_kernel, n, stream, gate, up, y, n);
}

void geglu(const float* gate, const float* up, float* y, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(geglu_kernel, n, stream, gate, up, y, n);
}

void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(add_kernel, n, stream, a, b, y, n);
}

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(scale_kernel, n, stream, x, s, n);
}

void add_bias(float* x, const float* bias, int64_t rows, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(add_bias_kernel, rows * n, stream, x, bias, rows, n);
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(mul_sigmoid_kernel, n, stream, x, gate, n, 1, n);
}

void mul_sigmoid_strided(float* x, const float* gate, int64_t gate_stride, int64_t rows, int64_t n,
                         cudaStream_t stream) {
  XPERT_LAUNCH_1D(mul_sigmoid_kernel, rows * n, stream, x, gate, gate_stride, rows, n);
}

void add_sigmoid_scaled(float* y, const float* s, const float* g, int64_t rows, int64_t n,
                        cudaStream_t stream) {
  XPERT_LAUNCH_1D(add_sigmoid_scaled_kernel, rows * n, stream, y, s, g, rows, n);
}

void deinterleave(const float* src, int64_t rows, int64_t width, float* a, float* b, cudaStream_t stream) {
  XPERT_LAUNCH_1D(deinterleave_kernel, rows * width, stream, src, rows, width, a, b);
}

void gather_rows(const float* x, const int64_t* rows, int64_t n_rows, int64_t width, float* y,
                 cudaStream_t stream) {
  XPERT_LAUNCH_1D(gather_rows_kernel, n_rows * width, stream, x, rows, n_rows, width, y);
}

void store_f16(const float* x, uint16_t* dst, int64_t n, cudaStream_t stream) {
  XPERT_LAUNCH_1D(store_f16_kernel, n, stream, x, reinterpret_cast<__half*>(dst), n);
}

void store_kv_f16(const float* x, int64_t n_tokens, int64_t row, uint16_t* cache, int64_t slot_stride,
                  const int32_t* slots, const int32_t* pos, cudaStream_t stream) {
  XPERT_LAUNCH_1D(store_kv_f16_kernel, n_tokens * row, stream, x, n_tokens, row,
                  reinterpret_cast<__half*>(cache), slot_stride, slots, pos);
}

}  // namespace xpert::cuda
