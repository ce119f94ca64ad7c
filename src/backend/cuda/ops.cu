// Elementwise and normalization kernels (ops.h) and the launch helpers of ops_internal.h.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"

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
    const char* env = std::getenv("XPERT_PDL");
    if (env && std::string(env) == "0") return false;
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current_device()) == cudaSuccess &&
           major >= 9;
  }();
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

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

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
    if (q) {  // n % 32 == 0 and step % 32 == 0: this warp holds block i / 32 whole
      float amax = fabsf(v);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const int qi = amax == 0.0f ? 0 : __float2int_rn(v * (127.0f / amax));
      int qs = qi;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) qs += __shfl_xor_sync(0xffffffffu, qs, off);
      q[row * n + i] = (int8_t)qi;
      const float dq = amax / 127.0f;
      if (lane == 0) ds[(row * n + i) / 32] = make_float2(dq, dq * (float)qs);
    }
  }
}

// Per-head RMS norm (when the tensor has norm weights) and RoPE of q and k in one pass: a warp per head
// row, the normalized row staged in shared memory for the rotation. The norm is rmsnorm_kernel's warp form
// (same sums, same bits); each rotated pair builds its angle as the CPU does (theta = pos, then theta *=
// theta_scale once per pair before it), so the angles are the same floats.
constexpr int kRopeWarps = 4;
constexpr int kRopeMaxDim = 512;
__global__ void __launch_bounds__(kRopeWarps * 32)
    norm_rope_kernel(float* q, float* k, const float* __restrict__ qw, const float* __restrict__ kw,
                     bool q_norm, bool k_norm, const int32_t* __restrict__ pos, int64_t n_tokens, int n_head,
                     int n_head_kv, int head_dim, int n_rot, float theta_scale, float freq_scale, bool neox,
                     float eps) {
  __shared__ float buf[kRopeWarps][kRopeMaxDim];
  pdl_begin();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int heads = n_head + n_head_kv;
  const int64_t r = (int64_t)blockIdx.x * kRopeWarps + warp;
  if (r >= n_tokens * heads) return;
  const int64_t t = r / heads;
  const int h = (int)(r % heads);
  const bool is_q = h < n_head;
  float* v = is_q ? q + (t * n_head + h) * head_dim : k + (t * n_head_kv + (h - n_head)) * head_dim;
  const bool norm = is_q ? q_norm : k_norm;
  const float* w = is_q ? qw : kw;
  float* row = buf[warp];
  float s = 1.0f;
  if (norm) {
    double sum = 0.0;
    for (int i = lane; i < head_dim; i += 32) sum += (double)(v[i] * v[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float mean = (float)(sum / (double)head_dim);
    s = 1.0f / sqrtf(mean + eps);
  }
  for (int i = lane; i < head_dim; i += 32) {
    const float x = v[i];
    row[i] = !norm ? x : w ? __fmul_rn(__fmul_rn(x, s), w[i]) : __fmul_rn(x, s);
  }
  __syncwarp();
  const float p = (float)pos[t];
  for (int i2 = lane; i2 < n_rot / 2; i2 += 32) {
    float theta = p;
    for (int j = 0; j < i2; ++j) theta *= theta_scale;
    const float th = freq_scale * theta;
    const float c = cosf(th), sn = sinf(th);
    const int a = neox ? i2 : 2 * i2;
    const int b = neox ? i2 + n_rot / 2 : 2 * i2 + 1;
    const float x0 = row[a], x1 = row[b];
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
    v[b] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
  }
  if (norm)
    for (int i = n_rot + lane; i < head_dim; i += 32) v[i] = row[i];
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
  if (n > 1024) {
    launch_pdl(rmsnorm_kernel<true>, (unsigned)rows, kThreads, 0, stream, x, x_stride, d, w, y, y_stride, rows,
           (int)n, eps, q, ds);
  } else {
    const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
    launch_pdl(rmsnorm_kernel<false>, (unsigned)blocks, kThreads, 0, stream, x, x_stride, d, w, y, y_stride, rows,
           (int)n, eps, q, ds);
  }
  XPERT_CUDA_CHECK_LAUNCH();
}

void qk_norm_rope(float* q, float* k, const float* q_norm, const float* k_norm, bool norm_q, bool norm_k,
                  const int32_t* pos, int64_t n_tokens, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                  int64_t n_rot, float freq_base, float freq_scale, RopeMode mode, float eps,
                  cudaStream_t stream) {
  if (n_tokens <= 0 || n_head + n_head_kv <= 0) return;
  if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0)
    detail::fail_rt("cuda rope: n_rot ", n_rot, " must be even and at most head_dim ", head_dim);
  if (head_dim > kRopeMaxDim) detail::fail_rt("cuda rope: head_dim ", head_dim, " is over ", kRopeMaxDim);
  // The same float expression as cpu::rope, evaluated on the host, so theta_scale is the same float.
  const float theta_scale = std::pow(freq_base, -2.0f / (float)n_rot);
  const int64_t rows = n_tokens * (n_head + n_head_kv);
  launch_pdl(norm_rope_kernel, (unsigned)((rows + kRopeWarps - 1) / kRopeWarps), kRopeWarps * 32, 0, stream,
      q, k, q_norm, k_norm, norm_q, norm_k, pos, n_tokens, (int)n_head, (int)n_head_kv, (int)head_dim,
      (int)n_rot, theta_scale, freq_scale, mode == RopeMode::neox, eps);
  XPERT_CUDA_CHECK_LAUNCH();
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
