// Elementwise and normalization kernels (ops.h) and the launch helpers of ops_internal.h.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/check.h"
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

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return (unsigned)std::clamp<int64_t>(blocks, 1, (int64_t)sm_count() * 16);
}

}  // namespace detail

namespace {

using detail::grid_for;

constexpr int kThreads = 256;

#define XPERT_GRID_STRIDE(i, n)                                             \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sum of squares in double (as the CPU), one warp per row, or one block per row for long rows.
template <bool kBlockPerRow>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const float* x, int64_t xs, const float* w, float* y, int64_t ys, int64_t rows, int n,
                   float eps) {
  __shared__ double red[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = kBlockPerRow ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * (kThreads / 32) + warp;
  if (row >= rows) return;
  const int first = kBlockPerRow ? threadIdx.x : lane, step = kBlockPerRow ? kThreads : 32;
  const float* xr = x + row * xs;
  float* yr = y + row * ys;
  double sum = 0.0;
  for (int i = first; i < n; i += step) sum += (double)(xr[i] * xr[i]);
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
  for (int i = first; i < n; i += step)
    yr[i] = w ? __fmul_rn(__fmul_rn(xr[i], s), w[i]) : __fmul_rn(xr[i], s);
}

// One block per token; a thread per rotated pair builds its angle as the CPU does (theta = pos, then
// theta *= theta_scale once per pair before it), so the angles are the same floats.
__global__ void rope_kernel(float* x, const int32_t* pos, int64_t n_heads, int64_t head_dim, int n_rot,
                            float theta_scale, float freq_scale, bool neox) {
  const int64_t t = blockIdx.x;
  for (int i2 = threadIdx.x; i2 < n_rot / 2; i2 += blockDim.x) {
    float theta = (float)pos[t];
    for (int k = 0; k < i2; ++k) theta *= theta_scale;
    const float th = freq_scale * theta;
    const float c = cosf(th), s = sinf(th);
    const int a = neox ? i2 : 2 * i2;
    const int b = neox ? i2 + n_rot / 2 : 2 * i2 + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      const float x0 = v[a], x1 = v[b];
      v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
      v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
  }
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
    kernel<<<grid_for((n), kThreads), kThreads, 0, (stream)>>>(__VA_ARGS__); \
    XPERT_CUDA_CHECK_LAUNCH();                                               \
  } while (0)

}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             cudaStream_t stream) {
  rmsnorm_strided(x, n, w, y, n, rows, n, eps, stream);
}

void rmsnorm_strided(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride,
                     int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (n > INT32_MAX) detail::fail_rt("cuda rmsnorm: rows of ", n, " values are too long");
  if (n > 1024) {
    rmsnorm_kernel<true>
        <<<(unsigned)rows, kThreads, 0, stream>>>(x, x_stride, w, y, y_stride, rows, (int)n, eps);
  } else {
    const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
    rmsnorm_kernel<false>
        <<<(unsigned)blocks, kThreads, 0, stream>>>(x, x_stride, w, y, y_stride, rows, (int)n, eps);
  }
  XPERT_CUDA_CHECK_LAUNCH();
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t n_rot,
          float freq_base, float freq_scale, RopeMode mode, cudaStream_t stream) {
  if (n_tokens <= 0 || n_heads <= 0) return;
  if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 != 0)
    detail::fail_rt("cuda rope: n_rot ", n_rot, " must be even and at most head_dim ", head_dim);
  // The same float expression as cpu::rope, evaluated on the host, so theta_scale is the same float.
  const float theta_scale = std::pow(freq_base, -2.0f / (float)n_rot);
  const int threads = (int)std::min<int64_t>(std::max<int64_t>(32, n_rot / 2), 256);
  rope_kernel<<<(unsigned)n_tokens, threads, 0, stream>>>(x, pos, n_heads, head_dim, (int)n_rot, theta_scale,
                                                          freq_scale, mode == RopeMode::neox);
  XPERT_CUDA_CHECK_LAUNCH();
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
