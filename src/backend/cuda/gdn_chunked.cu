// The chunked (WY / UT) delta rule for prefill; gdn.h says how the work is split, and
// backend/cpu/gated_delta_net.cpp's delta_rule_chunked is the same algorithm on the CPU (same order of
// operations where it matters). Chunks of 64 tokens; a short last chunk is padded with k = q = v = 0,
// g = 0, beta = 0, which leaves every real row and the state unchanged.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda {
namespace {

constexpr int kChunk = 64;
constexpr int kMaxDim = 128;

struct ChunkParams {
  const float *q, *k, *v, *g, *beta;
  float* state;
  float* out;
  float* ws_u;    // [n_chunks][Hv][64][dv]  u = T (beta v)
  float* ws_w;    // [n_chunks][Hv][64][DK]  w = T (beta e^G k)
  float* ws_qp;   // [n_chunks][Hv][64][DK]  q' = e^G q - (Q K^T) w
  float* ws_qku;  // [n_chunks][Hv][64][dv]  (Q K^T) u
  float* ws_qk;   // [n_chunks][Hv][64][64]  decayed Q K^T (the prep kernel's scratch)
  float* ws_g;    // [n_chunks][Hv][64]      cumulative log decay
  int64_t n_tokens, qk_stride, v_stride;
  int Hk, Hv, dv;
  float scale;
};

// Per (chunk, value head): decayed K K^T -> A, Q K^T -> ws_qk, T = (I - A)^-1, u = T (beta v),
// w = T (beta e^G k), and, so that the scan needs no Q K^T product of its own (v_new = u - w S, so
// o = e^G q S + QK v_new = (e^G q - QK w) S + QK u): q' = e^G q - QK w and QK u.
template <int DK>
__global__ void __launch_bounds__(256) chunk_prep_kernel(ChunkParams p) {
  constexpr int P = kMaxDim + 1;  // row pitch of the k and q / v tiles
  extern __shared__ __align__(16) float sm[];
  float* Ks = sm;               // [64][P]
  float* QV = Ks + kChunk * P;  // [64][P]: q, later v
  float* A = QV + kChunk * P;   // [64][65]
  float* G = A + kChunk * 65;   // [64]
  float* B = G + kChunk;        // [64]
  float* old = B + kChunk;      // [64]
  float* tmp = old + kChunk;    // [3][16][17]
  const int tid = threadIdx.x, c = blockIdx.x, h = blockIdx.y, kh = h % p.Hk, dv = p.dv;
  const int64_t t0 = (int64_t)c * kChunk;
  const int L = (int)std::min<int64_t>(kChunk, p.n_tokens - t0);
  const int64_t base = (int64_t)c * p.Hv + h;

  if (tid < kChunk) {
    G[tid] = tid < L ? p.g[(t0 + tid) * p.Hv + h] : 0.0f;
    B[tid] = tid < L ? p.beta[(t0 + tid) * p.Hv + h] : 0.0f;
  }
  for (int i = tid; i < kChunk * DK; i += 256) {
    const int r = i / DK, d = i % DK;
    Ks[r * P + d] = r < L ? p.k[(t0 + r) * p.qk_stride + (int64_t)kh * DK + d] : 0.0f;
    QV[r * P + d] = r < L ? p.q[(t0 + r) * p.qk_stride + (int64_t)kh * DK + d] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {  // cumulative sum in order, as the CPU
    float cum = 0.0f;
    for (int i = 0; i < kChunk; ++i) G[i] = cum += G[i];
  }
  __syncthreads();

  // A (strictly lower) and the decayed q.k scores (lower with the diagonal); 4x4 outputs per thread,
  // rows ty + 16a, columns tx + 16b (conflict-free with the odd pitch).
  {
    const int ty = tid / 16, tx = tid % 16;
    float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < DK; ++d) {
      float ki[4], qi[4], kj[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        ki[a] = Ks[(ty + 16 * a) * P + d];
        qi[a] = QV[(ty + 16 * a) * P + d];
        kj[a] = Ks[(tx + 16 * a) * P + d];
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          kk[a][b] += ki[a] * kj[b];
          qk[a][b] += qi[a] * kj[b];
        }
    }
    float* wqk = p.ws_qk + base * kChunk * kChunk;
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = ty + 16 * a, j = tx + 16 * b;
        const float d = j <= i ? expf(G[i] - G[j]) : 0.0f;
        A[i * 65 + j] = j < i ? -B[i] * kk[a][b] * d : 0.0f;
        wqk[i * kChunk + j] = j <= i ? qk[a][b] * d : 0.0f;
      }
  }
  __syncthreads();

  // T = (I - A)^-1 (A strictly lower), stored as T - I in A, in blocks of 16 (the CPU solves it row by
  // row; this is the same matrix with short dependency chains). First each diagonal block by forward
  // substitution, the four at once: X[i][j] = A[i][j] + sum_{j<m<i} A[i][m] X[m][j] within the block.
  for (int r = 1; r < 16; ++r) {
    const int b = tid / 16, j = tid % 16, i = 16 * b + r;
    if (tid < kChunk && j < r) old[tid] = A[i * 65 + 16 * b + j];
    __syncthreads();
    if (tid < kChunk && j < r) {
      float acc = old[tid];
      for (int m = j + 1; m < r; ++m) acc += old[16 * b + m] * A[(16 * b + m) * 65 + 16 * b + j];
      A[i * 65 + 16 * b + j] = acc;
    }
    __syncthreads();
  }
  // Then block rows in order: T_ik = T_ii sum_{k<=m<i} A_im T_mk, through a temporary per k (the sums
  // read row i's original blocks, which the products then overwrite).
  for (int bi = 1; bi < 4; ++bi) {
    const int r = tid / 16, c = tid % 16;
    for (int bk = 0; bk < bi; ++bk) {
      float acc = 0.0f;
      for (int bm = bk; bm < bi; ++bm)
        for (int q = 0; q < 16; ++q) {
          const float a = A[(16 * bi + r) * 65 + 16 * bm + q];
          const float t = bm != bk ? A[(16 * bm + q) * 65 + 16 * bk + c]
                                   : (q == c ? 1.0f : q > c ? A[(16 * bk + q) * 65 + 16 * bk + c] : 0.0f);
          acc += a * t;
        }
      tmp[(bk * 16 + r) * 17 + c] = acc;
    }
    __syncthreads();
    for (int bk = 0; bk < bi; ++bk) {
      float acc = tmp[(bk * 16 + r) * 17 + c];
      for (int q = 0; q < r; ++q) acc += A[(16 * bi + r) * 65 + 16 * bi + q] * tmp[(bk * 16 + q) * 17 + c];
      A[(16 * bi + r) * 65 + 16 * bk + c] = acc;
    }
    __syncthreads();
  }

  for (int i = tid; i < kChunk * dv; i += 256) {
    const int r = i / dv, d = i % dv;
    QV[r * P + d] = r < L ? p.v[(t0 + r) * p.v_stride + (int64_t)h * dv + d] : 0.0f;
  }
  if (tid < kChunk) p.ws_g[base * kChunk + tid] = G[tid];
  __syncthreads();

  // u = T (B v), w = T (B e^G k), T = A + I: rows ty + 16a, columns tx + 16b.
  {
    const int ty = tid / 16, tx = tid % 16;
    constexpr int NB = kMaxDim / 16;
    float u[4][NB] = {}, w[4][DK / 16] = {};
    for (int j = 0; j < kChunk; ++j) {
      const float bj = B[j], egj = expf(G[j]);
      float cu[4], cw[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int i = ty + 16 * a;
        const float t = j == i ? 1.0f : A[i * 65 + j];  // 0 above the diagonal
        cu[a] = t * bj;
        cw[a] = (t * bj) * egj;
      }
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int d = tx + 16 * b;
        if (d < dv) {
          const float vj = QV[j * P + d];
#pragma unroll
          for (int a = 0; a < 4; ++a) u[a][b] += cu[a] * vj;
        }
      }
#pragma unroll
      for (int b = 0; b < DK / 16; ++b) {
        const float kj = Ks[j * P + tx + 16 * b];
#pragma unroll
        for (int a = 0; a < 4; ++a) w[a][b] += cw[a] * kj;
      }
    }
    float* wu = p.ws_u + base * kChunk * dv;
    float* ww = p.ws_w + base * kChunk * DK;
    __syncthreads();  // every thread is done reading k (Ks) and v (QV)
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int i = ty + 16 * a;
#pragma unroll
      for (int b = 0; b < NB; ++b)
        if (tx + 16 * b < dv) {
          wu[i * dv + tx + 16 * b] = u[a][b];
          QV[i * P + tx + 16 * b] = u[a][b];
        }
#pragma unroll
      for (int b = 0; b < DK / 16; ++b) {
        ww[i * DK + tx + 16 * b] = w[a][b];
        Ks[i * P + tx + 16 * b] = w[a][b];
      }
    }
  }
  // QK back from this block's scratch into A (T is no longer needed); the barrier publishes both.
  const float* wqk = p.ws_qk + base * kChunk * kChunk;
  for (int i = tid; i < kChunk * kChunk; i += 256) A[(i / kChunk) * 65 + i % kChunk] = wqk[i];
  __syncthreads();
  {
    const int ty = tid / 16, tx = tid % 16;
    constexpr int NB = kMaxDim / 16;
    float ku[4][NB] = {}, kw[4][DK / 16] = {};
    for (int m = 0; m < kChunk; ++m) {
      float c[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) c[a] = A[(ty + 16 * a) * 65 + m];  // 0 above the diagonal
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int d = tx + 16 * b;
        if (d < dv) {
          const float uv = QV[m * P + d];
#pragma unroll
          for (int a = 0; a < 4; ++a) ku[a][b] += c[a] * uv;
        }
      }
#pragma unroll
      for (int b = 0; b < DK / 16; ++b) {
        const float wv = Ks[m * P + tx + 16 * b];
#pragma unroll
        for (int a = 0; a < 4; ++a) kw[a][b] += c[a] * wv;
      }
    }
    float* wqp = p.ws_qp + base * kChunk * DK;
    float* wqku = p.ws_qku + base * kChunk * dv;
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int i = ty + 16 * a;
      const float eg = expf(G[i]);
      const float* qrow = p.q + (t0 + i) * p.qk_stride + (int64_t)kh * DK;
#pragma unroll
      for (int b = 0; b < DK / 16; ++b) {
        const int d = tx + 16 * b;
        wqp[i * DK + d] = (i < L ? qrow[d] * eg : 0.0f) - kw[a][b];
      }
#pragma unroll
      for (int b = 0; b < NB; ++b)
        if (tx + 16 * b < dv) wqku[i * dv + tx + 16 * b] = ku[a][b];
    }
  }
}

// Per (value head, 32 state columns), the chunks in order; the state slice S [DK][32] stays in shared
// memory. Per chunk two passes over S: v_new = u - w S and o = scale (q' S + QK u) together, then
// S = e^G_last S + (k e^(G_last - G))^T v_new. The w, q' and k tiles stream in with cp.async while the
// pass before computes: with three buffers (kShareK false) k(c) loads during the first pass and w, q' of
// chunk c+1 during the second; with two (less shared memory) k shares w's buffer.
template <int DK, bool kShareK>
__global__ void __launch_bounds__(256) chunk_scan_kernel(ChunkParams p) {
  extern __shared__ __align__(16) float sm[];
  constexpr int kTile = kChunk * DK;         // rows of DK floats, read as broadcasts: no padding
  float* W = sm;                             // [64][DK]
  float* Qp = W + kTile;                     // [64][DK]
  float* K = kShareK ? W : Qp + kTile;       // [64][DK]
  float* Ss = Qp + (kShareK ? 1 : 2) * kTile;  // [DK][32]
  float* Vn = Ss + DK * 32;                  // [64][33]
  float* G = Vn + kChunk * 33;               // [64]
  float* ed = G + kChunk;                    // [64]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx;
  const int h = blockIdx.y, kh = h % p.Hk, dv = p.dv, j = blockIdx.x * 32 + tx;
  float* S = p.state + (int64_t)h * DK * dv;
  for (int r = ty; r < DK; r += 8) Ss[r * 32 + tx] = S[(int64_t)r * dv + j];
  const int64_t n_chunks = (p.n_tokens + kChunk - 1) / kChunk;

  // 64 rows x DK floats from src (row stride `stride`) into dst, rows past `rows` zero-filled; no commit.
  auto load_async = [&](float* dst, const float* src, int64_t stride, int rows) {
    constexpr int kVec = DK / 4;
#pragma unroll
    for (int it = 0; it < kChunk * kVec / 256; ++it) {
      const int i = tid + 256 * it, r = i / kVec, c = i % kVec;
      const bool valid = r < rows;
      detail::cp_async16(detail::smem_addr(dst + r * DK + 4 * c), src + (valid ? r : 0) * stride + 4 * c, valid);
    }
  };
  auto load_wq = [&](int64_t c) {  // w and q' of chunk c, one group
    const int64_t base = c * p.Hv + h;
    load_async(W, p.ws_w + base * kTile, DK, kChunk);
    load_async(Qp, p.ws_qp + base * kTile, DK, kChunk);
    detail::cp_async_commit();
  };
  auto load_k = [&](int64_t c, int rows) {
    load_async(K, p.k + c * kChunk * p.qk_stride + (int64_t)kh * DK, p.qk_stride, rows);
    detail::cp_async_commit();
  };

  load_wq(0);
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t t0 = c * kChunk;
    const int L = (int)std::min<int64_t>(kChunk, p.n_tokens - t0);
    const int64_t base = c * p.Hv + h;
    // This thread's rows ty + 8a of u and QK u, in registers before the wait.
    float acc_v[8], acc_o[8];
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      acc_v[a] = p.ws_u[(base * kChunk + ty + 8 * a) * dv + j];
      acc_o[a] = 0.0f;
    }
    if (tid < kChunk) G[tid] = p.ws_g[base * kChunk + tid];
    if constexpr (!kShareK) {
      load_k(c, L);
      detail::cp_async_wait<1>();  // w, q'
    } else {
      detail::cp_async_wait<0>();
    }
    __syncthreads();
    if (tid < kChunk) ed[tid] = expf(G[L - 1] - G[tid]);

#pragma unroll 2
    for (int r = 0; r < DK; r += 4) {
      const float s0 = Ss[r * 32 + tx], s1 = Ss[(r + 1) * 32 + tx], s2 = Ss[(r + 2) * 32 + tx],
                  s3 = Ss[(r + 3) * 32 + tx];
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const float4 w = *reinterpret_cast<const float4*>(&W[(ty + 8 * a) * DK + r]);
        const float4 q = *reinterpret_cast<const float4*>(&Qp[(ty + 8 * a) * DK + r]);
        acc_v[a] -= w.x * s0;
        acc_v[a] -= w.y * s1;
        acc_v[a] -= w.z * s2;
        acc_v[a] -= w.w * s3;
        acc_o[a] += q.x * s0;
        acc_o[a] += q.y * s1;
        acc_o[a] += q.z * s2;
        acc_o[a] += q.w * s3;
      }
    }
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      const int i = ty + 8 * a;
      Vn[i * 33 + tx] = acc_v[a];
      if (i < L) p.out[((t0 + i) * p.Hv + h) * dv + j] = (acc_o[a] + p.ws_qku[(base * kChunk + i) * dv + j]) * p.scale;
    }
    __syncthreads();  // W, Qp free; Vn and ed complete
    const bool more = c + 1 < n_chunks;
    if constexpr (kShareK) {
      load_k(c, L);
      detail::cp_async_wait<0>();
    } else {
      if (more) load_wq(c + 1);
      else detail::cp_async_commit();  // an empty group keeps the count
      detail::cp_async_wait<1>();      // k
    }
    __syncthreads();

    constexpr int RPT = DK / 8;  // state rows per thread
    const float e_last = expf(G[L - 1]);
    float sr[RPT];
#pragma unroll
    for (int a = 0; a < RPT; ++a) sr[a] = Ss[(ty * RPT + a) * 32 + tx] * e_last;
    for (int i = 0; i < L; ++i) {
      const float vn = Vn[i * 33 + tx], e = ed[i];
#pragma unroll
      for (int a = 0; a < RPT; a += 4) {
        const float4 k = *reinterpret_cast<const float4*>(&K[i * DK + ty * RPT + a]);
        sr[a] += (k.x * e) * vn;
        sr[a + 1] += (k.y * e) * vn;
        sr[a + 2] += (k.z * e) * vn;
        sr[a + 3] += (k.w * e) * vn;
      }
    }
#pragma unroll
    for (int a = 0; a < RPT; ++a) Ss[(ty * RPT + a) * 32 + tx] = sr[a];
    __syncthreads();
    if constexpr (kShareK)
      if (more) load_wq(c + 1);
  }
  detail::cp_async_wait<0>();
  for (int r = ty; r < DK; r += 8) S[(int64_t)r * dv + j] = Ss[r * 32 + tx];
}

template <int DK>
constexpr size_t prep_smem_bytes() {
  return (size_t)(2 * kChunk * (kMaxDim + 1) + kChunk * 65 + 3 * kChunk + 3 * 16 * 17) * sizeof(float);
}
template <int DK, bool kShareK>
constexpr size_t scan_smem_bytes() {
  return (size_t)((kShareK ? 2 : 3) * kChunk * DK + DK * 32 + kChunk * 33 + 2 * kChunk) * sizeof(float);
}

// The workspace: u and QK u (rows x dv), w and q' (rows x DK), QK (rows x 64), G (rows), rows = chunks x
// heads x 64.
struct ChunkLayout {
  size_t v_part, k_part, qk, g;  // bytes of each part
  size_t total() const { return 2 * v_part + 2 * k_part + qk + g; }
};
ChunkLayout layout(const GdnShape& s, int64_t n_tokens) {
  const size_t chunks = (size_t)((std::max<int64_t>(n_tokens, 0) + kChunk - 1) / kChunk);
  const size_t rows = chunks * s.n_v_heads * kChunk;
  return {detail::align_up(rows * s.head_v_dim * sizeof(float), 256),
          detail::align_up(rows * s.head_k_dim * sizeof(float), 256),
          detail::align_up(rows * kChunk * sizeof(float), 256), detail::align_up(rows * sizeof(float), 256)};
}

template <int DK>
void launch(const GdnShape& s, const DeltaRuleArgs& a, void* workspace, cudaStream_t stream) {
  const ChunkLayout lay = layout(s, a.n_tokens);
  char* ws = static_cast<char*>(workspace);
  ChunkParams p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.g = a.g;
  p.beta = a.beta;
  p.state = a.state;
  p.out = a.out;
  p.ws_u = reinterpret_cast<float*>(ws);
  p.ws_qku = reinterpret_cast<float*>(ws + lay.v_part);
  p.ws_w = reinterpret_cast<float*>(ws + 2 * lay.v_part);
  p.ws_qp = reinterpret_cast<float*>(ws + 2 * lay.v_part + lay.k_part);
  p.ws_qk = reinterpret_cast<float*>(ws + 2 * lay.v_part + 2 * lay.k_part);
  p.ws_g = reinterpret_cast<float*>(ws + 2 * lay.v_part + 2 * lay.k_part + lay.qk);
  p.n_tokens = a.n_tokens;
  p.qk_stride = a.qk_stride ? a.qk_stride : s.key_dim();
  p.v_stride = a.v_stride ? a.v_stride : s.value_dim();
  p.Hk = (int)s.n_k_heads;
  p.Hv = (int)s.n_v_heads;
  p.dv = (int)s.head_v_dim;
  p.scale = 1.0f / std::sqrt((float)s.head_k_dim);
  const unsigned n_chunks = (unsigned)((a.n_tokens + kChunk - 1) / kChunk);
  constexpr size_t prep_smem = prep_smem_bytes<DK>();
  detail::set_smem_limit((const void*)chunk_prep_kernel<DK>, prep_smem);
  chunk_prep_kernel<DK><<<dim3(n_chunks, (unsigned)s.n_v_heads), 256, prep_smem, stream>>>(p);
  XPERT_CUDA_CHECK_LAUNCH();
  const dim3 grid((unsigned)(s.head_v_dim / 32), (unsigned)s.n_v_heads), block(32, 8);
  // A third buffer (k streamed during the first pass) where the device has the shared memory for it.
  constexpr size_t smem3 = scan_smem_bytes<DK, false>(), smem2 = scan_smem_bytes<DK, true>();
  if ((size_t)detail::max_smem_optin() >= smem3) {
    detail::set_smem_limit((const void*)chunk_scan_kernel<DK, false>, smem3);
    chunk_scan_kernel<DK, false><<<grid, block, smem3, stream>>>(p);
  } else {
    detail::set_smem_limit((const void*)chunk_scan_kernel<DK, true>, smem2);
    chunk_scan_kernel<DK, true><<<grid, block, smem2, stream>>>(p);
  }
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool delta_rule_chunked_supported(const GdnShape& s) {
  return (s.head_k_dim == 64 || s.head_k_dim == 128) && s.head_v_dim > 0 && s.head_v_dim <= kMaxDim &&
         s.head_v_dim % 32 == 0 && s.n_k_heads > 0 && s.n_v_heads > 0;
}

size_t delta_rule_chunked_workspace_bytes(const GdnShape& s, int64_t n_tokens) {
  if (!delta_rule_chunked_supported(s)) return 0;
  return layout(s, n_tokens).total();
}

void delta_rule_chunked(const GdnShape& s, const DeltaRuleArgs& a, void* workspace, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  // The scan streams q and k rows with 16-byte copies.
  const int64_t qk_stride = a.qk_stride ? a.qk_stride : s.key_dim();
  const bool aligned = (reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.k)) % 16 == 0 && qk_stride % 4 == 0;
  if (!delta_rule_chunked_supported(s) || !aligned) return delta_rule_recurrent(s, a, stream);
  if (!workspace) detail::fail_rt("cuda delta_rule_chunked: no workspace");
  if (s.head_k_dim == 64) return launch<64>(s, a, workspace, stream);
  return launch<128>(s, a, workspace, stream);
}

}  // namespace xpert::cuda
