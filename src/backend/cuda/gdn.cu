// Gated DeltaNet pieces (conv, norms, gates), the recurrent delta rule and the whole mixer. gdn.h.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/head_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/q8_1.cuh"

namespace xpert::cuda {
namespace {

using detail::grid_for;

constexpr int kThreads = 256;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// A head's l2-norm scale from the warp's total sum of squares (as cpu::rmsnorm: eps_n = eps / n).
__device__ __forceinline__ float l2_scale(double sum, int n, float eps_n) {
  return 1.0f / sqrtf((float)(sum / (double)n) + eps_n);
}

// One value head's gates: g = softplus(alpha + dt_bias) * a, beta = sigmoid(beta_in).
__device__ __forceinline__ void gdn_gate(float alpha, float beta_in, float dt_bias, float a, float& g,
                                         float& beta) {
  const float x = alpha + dt_bias;
  const float sp = x > 20.0f ? x : logf(1.0f + expf(x));  // ggml's softplus threshold
  g = sp * a;
  beta = 1.0f / (1.0f + expf(-beta_in));
}

// One thread per (token, channel): the window's rows are the carried state, then x. Products and sums
// rounded one by one in the CPU's order.
__global__ void conv_kernel(const float* x, int64_t T, int64_t C, const float* w, int K, const float* state,
                            float* out) {
  pdl_begin();
  const int64_t ns = K - 1;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < T * C;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float o = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int64_t r = t + j;
      const float src = r < ns ? state[r * C + c] : x[(r - ns) * C + c];
      o = __fadd_rn(o, __fmul_rn(src, w[c * K + j]));
    }
    out[i] = silu(o);
  }
}

// The state's next rows, per channel in ascending order (row r reads row r + T >= r first: in place is safe).
__global__ void conv_state_kernel(const float* x, int64_t T, int64_t C, int K, float* state) {
  pdl_begin();
  const int64_t ns = K - 1;
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x)
    for (int64_t r = 0; r < ns; ++r) {
      const int64_t src = r + T;  // row of the window (state rows then x rows)
      state[r * C + c] = src < ns ? state[src * C + c] : x[(src - ns) * C + c];
    }
}

// One warp per (token, head); the sum of squares in double, as cpu::rmsnorm (l2 = rmsnorm(eps/n)/sqrt(n)).
__global__ void l2_norm_kernel(float* x, int64_t n_tokens, int64_t n_heads, int head_dim,
                               int64_t token_stride, float eps_n, float inv_sqrt_n) {
  pdl_begin();
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_tokens * n_heads) return;
  float* xr = x + (row / n_heads) * token_stride + (row % n_heads) * head_dim;
  double sum = 0.0;
  for (int i = lane; i < head_dim; i += 32) sum += (double)(xr[i] * xr[i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float s = l2_scale(sum, head_dim, eps_n);
  for (int i = lane; i < head_dim; i += 32) xr[i] = __fmul_rn(__fmul_rn(xr[i], s), inv_sqrt_n);
}

__global__ void gates_kernel(const float* alpha, const float* beta_in, const float* dt_bias, const float* a,
                             float* g, float* beta, int64_t n_tokens, int64_t n_v_heads) {
  pdl_begin();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_tokens * n_v_heads;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t h = i % n_v_heads;
    gdn_gate(alpha[i], beta_in[i], dt_bias[h], a[h], g[i], beta[i]);
  }
}

// One decode token (T = 1): the conv window, the shift of its state, the l2 norms of q and k and the gates in
// one launch. A warp per head of the conv's channels (n_k_heads of q, of k, then n_v_heads of v; lane l
// takes channels l, l + 32, ... of its head, as l2_norm_kernel does), and each v head's warp also computes
// that head's gates: the same arithmetic, so the same bits, as conv, conv_state, l2_norm and gates.
struct PreludeParams {
  const float *x, *w, *alpha, *beta_in, *dt_bias, *a;
  float *state, *out, *g, *beta;
  int64_t C;
  int K, Hk, Hv, dk, dv;
  float eps_n, inv_sqrt_n;
};
// gated_delta_net_rows: row r of a launch is one decode token of its own sequence, whose state is p[r]
// (conv or ssm); n = 0: one sequence (the params' own state).
struct RowStates {
  float* p[kGdnRowsPerLaunch];
  int n;
};
constexpr int kPreludeWarps = 4;
constexpr int kPreludeMaxPer = 8;  // head dims up to 256
constexpr int kPreludeMaxTaps = 8;

// A lane's conv weights and window state (written by this kernel's launch of the step before: no kernel of
// this step writes them first) are loaded before the wait, all of them at once; after it only the new row x
// (the product right before) is read. A loop that loads and then stores the state, which the compiler
// cannot prove apart from the loads, would wait for each dimension's loads in turn.
// With rows: block row blockIdx.y takes that row's token (its x, alpha, beta_in, out, g and beta rows) and
// its own conv state.
template <int kPer>
__global__ void __launch_bounds__(kPreludeWarps * 32) decode_prelude_kernel(PreludeParams p, RowStates rows) {
  const int row = blockIdx.y;
  if (rows.n) {
    p.state = rows.p[row];
    p.x += row * p.C, p.out += row * p.C;
    p.alpha += row * p.Hv, p.beta_in += row * p.Hv, p.g += row * p.Hv, p.beta += row * p.Hv;
  }
  const int lane = threadIdx.x % 32, r = blockIdx.x * kPreludeWarps + threadIdx.x / 32;
  const bool live = r < 2 * p.Hk + p.Hv;
  const bool is_v = r >= 2 * p.Hk;
  const int hd = is_v ? p.dv : p.dk;
  const int64_t c0 = is_v ? 2 * (int64_t)p.Hk * p.dk + (int64_t)(r - 2 * p.Hk) * p.dv : (int64_t)r * p.dk;
  const int ns = p.K - 1;
  float win[kPer][kPreludeMaxTaps], wt[kPer][kPreludeMaxTaps];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t c = c0 + lane + 32 * i;
#pragma unroll
    for (int j = 0; j < kPreludeMaxTaps; ++j) {
      const bool ok = live && i * 32 < hd && j < p.K;
      wt[i][j] = ok ? p.w[c * p.K + j] : 0.0f;
      win[i][j] = ok && j < ns ? p.state[j * p.C + c] : 0.0f;
    }
  }
  pdl_begin();
  if (!live) return;
  float xs[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) xs[i] = i * 32 < hd ? p.x[c0 + lane + 32 * i] : 0.0f;
  float o[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (i * 32 >= hd) break;
    const int64_t c = c0 + lane + 32 * i;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kPreludeMaxTaps; ++j)
      if (j < p.K) acc = __fadd_rn(acc, __fmul_rn(j < ns ? win[i][j] : xs[i], wt[i][j]));
    o[i] = silu(acc);
#pragma unroll
    for (int j = 0; j + 1 < kPreludeMaxTaps; ++j)
      if (j < ns) p.state[j * p.C + c] = j + 1 < ns ? win[i][j + 1] : xs[i];
  }
  if (!is_v) {
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i * 32 < hd) sum += (double)(o[i] * o[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float s = l2_scale(sum, hd, p.eps_n);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i * 32 < hd) o[i] = __fmul_rn(__fmul_rn(o[i], s), p.inv_sqrt_n);
  } else if (lane == 0) {
    const int h = r - 2 * p.Hk;
    gdn_gate(p.alpha[h], p.beta_in[h], p.dt_bias[h], p.a[h], p.g[h], p.beta[h]);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (i * 32 < hd) p.out[c0 + lane + 32 * i] = o[i];
}

// One row of n values by one warp, a lane's values (lane + 32 j) in registers: x * rsqrt(mean(x^2) + eps)
// * w * silu(z), written to xr and, with q, as q8_1 blocks (q, ds: the row's). Its sums and products are
// the bits every gated norm here gives.
template <int kPer>
__device__ __forceinline__ void gated_norm_warp(const float (&xv)[kPer], const float (&zv)[kPer],
                                                const float (&wv)[kPer], int n, float eps, float* xr,
                                                int8_t* q, float2* ds) {
  const int lane = threadIdx.x % 32;
  const float s = warp_rms_scale<kPer>(xv, n, eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    if (i >= n) break;  // n % 32 == 0 with q: whole warps leave together
    const float v = __fmul_rn(__fmul_rn(__fmul_rn(xv[j], s), wv[j]), silu(zv[j]));
    xr[i] = v;
    if (q) warp_quantize_q8_1(v, q + i, ds + i / 32);
  }
}

// With q: out's q8_1 activations too (n % 32 == 0; a warp's 32 values are one block). A warp a row; kPer > 0
// (rows of up to 32 kPer values): a lane's values of x, z and the weights in registers, all loaded at once
// (the weights before the wait), not a load-store loop that waits for each step's loads in turn.
template <int kPer>
__global__ void gated_norm_kernel(float* x, const float* z, const float* w, int64_t rows, int n, float eps,
                                  int8_t* q, float2* ds) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* xr = x + row * n;
  const float* zr = z + row * n;
  if constexpr (kPer > 0) {
    float wv[kPer], xv[kPer], zv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) wv[j] = lane + 32 * j < n ? w[lane + 32 * j] : 0.0f;
    pdl_begin();
    if (row >= rows) return;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane + 32 * j;
      xv[j] = i < n ? xr[i] : 0.0f;
      zv[j] = i < n ? zr[i] : 0.0f;
    }
    gated_norm_warp<kPer>(xv, zv, wv, n, eps, xr, q ? q + row * n : nullptr, q ? ds + row * n / 32 : nullptr);
  } else {
    pdl_begin();
    if (row >= rows) return;
    double sum = 0.0;
    for (int i = lane; i < n; i += 32) sum += (double)(xr[i] * xr[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float s = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int i = lane; i < n; i += 32) {
      const float v = __fmul_rn(__fmul_rn(__fmul_rn(xr[i], s), w[i]), silu(zr[i]));
      xr[i] = v;
      if (q) warp_quantize_q8_1(v, q + row * n + i, ds + (row * n + i) / 32);
    }
  }
}

// Recurrent delta rule. Block (32, R, C) for value head blockIdx.y and state columns (blockIdx.x * C + z) *
// 32 + x; thread (x, y, z) holds rows y*32 .. y*32+31 of its column in registers for all T tokens. With
// norm_w (C = head_v_dim / 32: the block holds the whole head) warp 0 also applies the gated norm to the
// head's output row of each token (gated_norm_warp, the bits of gated_rmsnorm_silu after it).
struct RecurrentParams {
  const float *q, *k, *v, *g, *beta;
  float* state;
  float* out;
  bool state_settled;  // no kernel right before writes the state: it is read before the wait
  int64_t n_tokens, qk_stride, v_stride;
  int Hk, Hv, dk, dv;
  float scale;
  const float *norm_w, *z;  // the fused gated norm's weights (head_v_dim) and gate rows; null: none
  int8_t* out_q;            // optional q8_1 of the normed rows
  float2* out_ds;
  float eps;
};

constexpr int kMaxRowGroups = 8;  // head_k_dim <= 256
constexpr int kMaxColGroups = 4;  // a block's columns, head_v_dim <= 128 with the fused norm
constexpr int kMaxRecurrentThreads = 512;

// With rows (gridDim.z of them): block z takes token z alone, with state rows.p[z].
__global__ void __launch_bounds__(kMaxRecurrentThreads, 1)
    recurrent_kernel(RecurrentParams p, RowStates rows) {
  __shared__ float ks[32 * kMaxRowGroups], qs[32 * kMaxRowGroups];
  __shared__ float red_kv[kMaxColGroups][kMaxRowGroups][32], red_o[kMaxColGroups][kMaxRowGroups][32];
  __shared__ float row_o[32 * kMaxColGroups];  // the head's output of a token (the fused norm)
  const int x = threadIdx.x, y = threadIdx.y, zc = threadIdx.z, R = blockDim.y, C = blockDim.z;
  const int tid = (zc * R + y) * 32 + x;
  const int h = blockIdx.y, kh = h % p.Hk, j = (blockIdx.x * C + zc) * 32 + x;
  const bool col = j < p.dv;
  float* S = (rows.n ? rows.p[blockIdx.z] : p.state) + (int64_t)h * p.dk * p.dv;
  const int64_t t_begin = rows.n ? blockIdx.z : 0, t_end = rows.n ? t_begin + 1 : p.n_tokens;
  if (!p.state_settled) pdl_begin();
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = y * 32 + i;
    s[i] = col && row < p.dk ? S[(int64_t)row * p.dv + j] : 0.0f;
  }
  // A settled state (gated_delta_net: its last writer is at least two kernels back) is read before the
  // wait, so its 64 KB a head come in while the kernel before finishes. q, k, v and the gates come after.
  if (p.state_settled) pdl_begin();
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* kt = p.k + t * p.qk_stride + (int64_t)kh * p.dk;
    const float* qt = p.q + t * p.qk_stride + (int64_t)kh * p.dk;
    for (int i = tid; i < 32 * R; i += 32 * R * C) {
      ks[i] = i < p.dk ? kt[i] : 0.0f;
      qs[i] = i < p.dk ? qt[i] : 0.0f;
    }
    const float decay = expf(p.g[t * p.Hv + h]), beta = p.beta[t * p.Hv + h];
    const float vj = col ? p.v[t * p.v_stride + (int64_t)h * p.dv + j] : 0.0f;
    __syncthreads();
    // S *= decay; kv = S^T k (this thread's rows)
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] *= decay;
      kv += s[i] * ks[y * 32 + i];
    }
    red_kv[zc][y][x] = kv;
    __syncthreads();
    float tot = 0.0f;
    for (int r = 0; r < R; ++r) tot += red_kv[zc][r][x];
    const float delta = (vj - tot) * beta;
    // S += k delta^T; o = S^T q
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] += ks[y * 32 + i] * delta;
      o += s[i] * qs[y * 32 + i];
    }
    red_o[zc][y][x] = o;
    __syncthreads();
    if (y == 0 && col) {
      float ot = 0.0f;
      for (int r = 0; r < R; ++r) ot += red_o[zc][r][x];
      if (p.norm_w)
        row_o[j] = ot * p.scale;
      else
        p.out[(t * p.Hv + h) * p.dv + j] = ot * p.scale;
    }
    __syncthreads();             // ks, qs, red_* are refilled for the next token; row_o is whole
    if (p.norm_w && tid < 32) {  // warp 0; row_o is next written after two more barriers
      float xv[kMaxColGroups], zv[kMaxColGroups], wv[kMaxColGroups];
      const int64_t row = t * p.Hv + h;
#pragma unroll
      for (int c = 0; c < kMaxColGroups; ++c) {
        const int i = x + 32 * c;
        xv[c] = i < p.dv ? row_o[i] : 0.0f;
        zv[c] = i < p.dv ? p.z[row * p.dv + i] : 0.0f;
        wv[c] = i < p.dv ? p.norm_w[i] : 0.0f;
      }
      gated_norm_warp<kMaxColGroups>(xv, zv, wv, p.dv, p.eps, p.out + row * p.dv,
                                     p.out_q ? p.out_q + row * p.dv : nullptr,
                                     p.out_q ? p.out_ds + row * p.dv / 32 : nullptr);
    }
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int row = y * 32 + i;
    if (col && row < p.dk) S[(int64_t)row * p.dv + j] = s[i];
  }
}

}  // namespace

void causal_conv1d_silu(const float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t d_conv,
                        float* conv_state, float* out, cudaStream_t stream) {
  if (n_tokens <= 0 || channels <= 0) return;
  if (d_conv < 1 || d_conv > 64)
    detail::fail_rt("cuda causal_conv1d: d_conv ", d_conv, " out of range (1..64)");
  launch_pdl(conv_kernel, grid_for(n_tokens * channels, kThreads), kThreads, 0, stream, x, n_tokens, channels, w,
                                                                                (int)d_conv, conv_state, out);
  XPERT_CUDA_CHECK_LAUNCH();
  if (d_conv > 1) {
    launch_pdl(conv_state_kernel, grid_for(channels, kThreads), kThreads, 0, stream, x, n_tokens, channels,
                                                                             (int)d_conv, conv_state);
    XPERT_CUDA_CHECK_LAUNCH();
  }
}

void l2_norm_heads(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t token_stride,
                   float eps, cudaStream_t stream) {
  const int64_t rows = n_tokens * n_heads;
  if (rows <= 0 || head_dim <= 0) return;
  const float eps_n = eps / (float)head_dim, inv = 1.0f / std::sqrt((float)head_dim);
  launch_pdl(l2_norm_kernel, (unsigned)((rows + 7) / 8), kThreads, 0, stream, x, n_tokens, n_heads, (int)head_dim,
                                                                      token_stride, eps_n, inv);
  XPERT_CUDA_CHECK_LAUNCH();
}

void gdn_gates(const float* alpha, const float* beta_in, const float* dt_bias, const float* a, float* g,
               float* beta, int64_t n_tokens, int64_t n_v_heads, cudaStream_t stream) {
  const int64_t n = n_tokens * n_v_heads;
  if (n <= 0) return;
  launch_pdl(gates_kernel, grid_for(n, kThreads), kThreads, 0, stream, alpha, beta_in, dt_bias, a, g, beta, n_tokens,
                                                               n_v_heads);
  XPERT_CUDA_CHECK_LAUNCH();
}

void gated_rmsnorm_silu(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps,
                        cudaStream_t stream, int8_t* q, float2* ds) {
  if (rows <= 0 || n <= 0) return;
  if (q && n % 32 != 0)
    detail::fail_rt("cuda gated_rmsnorm_silu: q8_1 output needs rows of a multiple of 32, got ", n);
  if (n <= 256)
    launch_pdl(gated_norm_kernel<8>, (unsigned)((rows + 7) / 8), kThreads, 0, stream, x, z, w, rows, (int)n,
               eps, q, ds);
  else
    launch_pdl(gated_norm_kernel<0>, (unsigned)((rows + 7) / 8), kThreads, 0, stream, x, z, w, rows, (int)n,
               eps, q, ds);
  XPERT_CUDA_CHECK_LAUNCH();
}

bool gdn_decode_prelude_fusable(const GdnShape& s) {
  return s.head_k_dim % 32 == 0 && s.head_v_dim % 32 == 0 && s.head_k_dim <= 32 * kPreludeMaxPer &&
         s.head_v_dim <= 32 * kPreludeMaxPer && s.d_conv >= 1 && s.d_conv <= kPreludeMaxTaps;
}

namespace {

// gdn_decode_prelude of one sequence (rows.n = 0) or of rows.n one-token sequences at once.
void launch_prelude(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                    float* conv_out, float* g, float* beta, const RowStates& rows, cudaStream_t stream) {
  if ((rows.n == 0 && in.n_tokens != 1) || !gdn_decode_prelude_fusable(s))
    detail::fail_rt("cuda gdn_decode_prelude: one token of head dims that are multiples of 32 (up to ",
                    32 * kPreludeMaxPer, ") and up to ", kPreludeMaxTaps, " conv taps");
  PreludeParams q{.x = in.qkv,
                  .w = p.conv1d,
                  .alpha = in.alpha,
                  .beta_in = in.beta,
                  .dt_bias = p.dt_bias,
                  .a = p.a,
                  .state = conv_state,
                  .out = conv_out,
                  .g = g,
                  .beta = beta,
                  .C = s.conv_dim(),
                  .K = (int)s.d_conv,
                  .Hk = (int)s.n_k_heads,
                  .Hv = (int)s.n_v_heads,
                  .dk = (int)s.head_k_dim,
                  .dv = (int)s.head_v_dim,
                  .eps_n = s.eps / (float)s.head_k_dim,
                  .inv_sqrt_n = 1.0f / std::sqrt((float)s.head_k_dim)};
  const int64_t heads = 2 * s.n_k_heads + s.n_v_heads;
  const dim3 blocks((unsigned)((heads + kPreludeWarps - 1) / kPreludeWarps), std::max(rows.n, 1));
  const int64_t hd = std::max(s.head_k_dim, s.head_v_dim);
  static_assert(kPreludeMaxPer == 8, "the instantiations below");
  if (hd <= 64)
    launch_pdl(decode_prelude_kernel<2>, blocks, kPreludeWarps * 32, 0, stream, q, rows);
  else if (hd <= 128)
    launch_pdl(decode_prelude_kernel<4>, blocks, kPreludeWarps * 32, 0, stream, q, rows);
  else
    launch_pdl(decode_prelude_kernel<8>, blocks, kPreludeWarps * 32, 0, stream, q, rows);
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gdn_decode_prelude(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                        float* conv_state, float* conv_out, float* g, float* beta, cudaStream_t stream) {
  launch_prelude(s, p, in, conv_state, conv_out, g, beta, RowStates{}, stream);
}

bool gdn_recurrent_norm_fusable(const GdnShape& s) {
  const int64_t R = (s.head_k_dim + 31) / 32, C = s.head_v_dim / 32;
  return s.head_v_dim % 32 == 0 && C <= kMaxColGroups && R <= kMaxRowGroups &&
         32 * R * C <= kMaxRecurrentThreads;
}

namespace {

// delta_rule_recurrent of one sequence (rows.n = 0) or of rows.n one-token sequences at once.
void launch_recurrent(const GdnShape& s, const DeltaRuleArgs& a, cudaStream_t stream, bool state_settled,
                      const GatedNormArgs* norm, const RowStates& rows) {
  if (a.n_tokens <= 0) return;
  if (s.head_k_dim <= 0 || s.head_k_dim > 32 * kMaxRowGroups || s.head_v_dim <= 0 || s.n_k_heads <= 0 ||
      s.n_v_heads <= 0)
    detail::fail_rt("cuda delta_rule: head_k_dim ", s.head_k_dim, " (at most ", 32 * kMaxRowGroups,
                    ") or head counts out of range");
  RecurrentParams p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.g = a.g;
  p.beta = a.beta;
  p.state = a.state;
  p.out = a.out;
  p.state_settled = state_settled;
  p.n_tokens = a.n_tokens;
  p.qk_stride = a.qk_stride ? a.qk_stride : s.key_dim();
  p.v_stride = a.v_stride ? a.v_stride : s.value_dim();
  p.Hk = (int)s.n_k_heads;
  p.Hv = (int)s.n_v_heads;
  p.dk = (int)s.head_k_dim;
  p.dv = (int)s.head_v_dim;
  p.scale = 1.0f / std::sqrt((float)s.head_k_dim);
  const unsigned R = (unsigned)((s.head_k_dim + 31) / 32), cols = (unsigned)((s.head_v_dim + 31) / 32);
  if (norm) {  // a block per head, warp 0 normalizing its rows
    if (!gdn_recurrent_norm_fusable(s))
      detail::fail_rt("cuda delta_rule: the gated norm does not fold in at head dims ", s.head_k_dim, " / ",
                      s.head_v_dim);
    if (norm->q && s.head_v_dim % 32 != 0)
      detail::fail_rt("cuda delta_rule: q8_1 output needs head_v_dim % 32");
    p.norm_w = norm->w, p.z = norm->z, p.out_q = norm->q, p.out_ds = norm->ds, p.eps = norm->eps;
    launch_pdl(recurrent_kernel, dim3(1, (unsigned)s.n_v_heads, std::max(rows.n, 1)), dim3(32, R, cols), 0,
               stream, p, rows);
  } else {
    launch_pdl(recurrent_kernel, dim3(cols, (unsigned)s.n_v_heads, std::max(rows.n, 1)), dim3(32, R, 1), 0,
               stream, p, rows);
  }
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void delta_rule_recurrent(const GdnShape& s, const DeltaRuleArgs& a, cudaStream_t stream, bool state_settled,
                          const GatedNormArgs* norm) {
  launch_recurrent(s, a, stream, state_settled, norm, RowStates{});
}

size_t gated_delta_net_workspace_bytes(const GdnShape& s, int64_t n_tokens) {
  const size_t T = (size_t)std::max<int64_t>(n_tokens, 0);
  return detail::align_up(T * s.conv_dim() * sizeof(float), 256) +
         2 * detail::align_up(T * s.n_v_heads * sizeof(float), 256) +
         delta_rule_chunked_workspace_bytes(s, n_tokens);
}

void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                     float* ssm_state, float* out, void* workspace, cudaStream_t stream, DeltaRuleForm form,
                     int8_t* out_q, float2* out_ds) {
  const int64_t T = in.n_tokens, CD = s.conv_dim(), Hv = s.n_v_heads;
  if (T <= 0) return;
  char* ws = static_cast<char*>(workspace);
  float* conv_out = reinterpret_cast<float*>(ws);
  ws += detail::align_up((size_t)T * CD * sizeof(float), 256);
  float* g = reinterpret_cast<float*>(ws);
  ws += detail::align_up((size_t)T * Hv * sizeof(float), 256);
  float* beta = reinterpret_cast<float*>(ws);
  ws += detail::align_up((size_t)T * Hv * sizeof(float), 256);

  if (T == 1 && gdn_decode_prelude_fusable(s)) {
    gdn_decode_prelude(s, p, in, conv_state, conv_out, g, beta, stream);
  } else {
    causal_conv1d_silu(in.qkv, T, CD, p.conv1d, s.d_conv, conv_state, conv_out, stream);
    // q and k are the first 2 * key_dim channels of each row: n_k_heads heads each.
    l2_norm_heads(conv_out, T, 2 * s.n_k_heads, s.head_k_dim, CD, s.eps, stream);
    gdn_gates(in.alpha, in.beta, p.dt_bias, p.a, g, beta, T, Hv, stream);
  }
  const DeltaRuleArgs a{.q = conv_out,
                        .k = conv_out + s.key_dim(),
                        .v = conv_out + 2 * s.key_dim(),
                        .g = g,
                        .beta = beta,
                        .state = ssm_state,
                        .out = out,
                        .n_tokens = T,
                        .qk_stride = CD,
                        .v_stride = CD};
  if (form == DeltaRuleForm::automatic)
    form = T >= kChunkedMinTokens ? DeltaRuleForm::chunked : DeltaRuleForm::recurrent;
  const GatedNormArgs norm{.z = in.z, .w = p.norm, .eps = s.eps, .q = out_q, .ds = out_ds};
  if (form == DeltaRuleForm::chunked) {
    delta_rule_chunked(s, a, ws, stream);
  } else if (gdn_recurrent_norm_fusable(s)) {  // the gated norm folded into the recurrent kernel
    delta_rule_recurrent(s, a, stream, true, &norm);
    return;
  } else {
    delta_rule_recurrent(s, a, stream, true);  // the prelude or the gates ran since the state's last writer
  }
  gated_rmsnorm_silu(out, in.z, p.norm, T * Hv, s.head_v_dim, s.eps, stream, out_q, out_ds);
}

void gated_delta_net_rows(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                          std::span<const GdnSlotState> states, float* out, void* workspace,
                          cudaStream_t stream, int8_t* out_q, float2* out_ds) {
  const int64_t n = in.n_tokens, CD = s.conv_dim(), Hv = s.n_v_heads, VD = s.value_dim();
  if ((int64_t)states.size() != n)
    detail::fail_rt("cuda gated_delta_net_rows: ", n, " rows, ", states.size(), " states");
  const auto row_in = [&](int64_t r, int64_t k) {
    return GdnLayerInputs{.qkv = in.qkv + r * CD,
                          .z = in.z + r * VD,
                          .alpha = in.alpha + r * Hv,
                          .beta = in.beta + r * Hv,
                          .n_tokens = k};
  };
  if (!gdn_decode_prelude_fusable(s) || !gdn_recurrent_norm_fusable(s)) {  // row by row
    for (int64_t r = 0; r < n; ++r)
      gated_delta_net(s, p, row_in(r, 1), states[r].conv, states[r].ssm, out + r * VD, workspace, stream,
                      DeltaRuleForm::recurrent, out_q ? out_q + r * VD : nullptr,
                      out_q ? out_ds + r * VD / 32 : nullptr);
    return;
  }
  char* ws = static_cast<char*>(workspace);
  float* conv_out = reinterpret_cast<float*>(ws);
  ws += detail::align_up((size_t)n * CD * sizeof(float), 256);
  float* g = reinterpret_cast<float*>(ws);
  ws += detail::align_up((size_t)n * Hv * sizeof(float), 256);
  float* beta = reinterpret_cast<float*>(ws);
  for (int64_t r0 = 0; r0 < n; r0 += kGdnRowsPerLaunch) {
    const int64_t k = std::min<int64_t>(kGdnRowsPerLaunch, n - r0);
    RowStates conv{}, ssm{};
    conv.n = ssm.n = (int)k;
    for (int64_t i = 0; i < k; ++i) conv.p[i] = states[r0 + i].conv, ssm.p[i] = states[r0 + i].ssm;
    float* co = conv_out + r0 * CD;
    launch_prelude(s, p, row_in(r0, k), nullptr, co, g + r0 * Hv, beta + r0 * Hv, conv, stream);
    const DeltaRuleArgs a{.q = co,
                          .k = co + s.key_dim(),
                          .v = co + 2 * s.key_dim(),
                          .g = g + r0 * Hv,
                          .beta = beta + r0 * Hv,
                          .state = nullptr,
                          .out = out + r0 * VD,
                          .n_tokens = k,
                          .qk_stride = CD,
                          .v_stride = CD};
    const GatedNormArgs norm{.z = in.z + r0 * VD,
                             .w = p.norm,
                             .eps = s.eps,
                             .q = out_q ? out_q + r0 * VD : nullptr,
                             .ds = out_q ? out_ds + r0 * VD / 32 : nullptr};
    launch_recurrent(s, a, stream, true, &norm, ssm);
  }
}

}  // namespace xpert::cuda
