// GPTQ-INT4 experts read as stored (moe_gptq.h, quant/gptq.h). qweight is K-major: word (i / 8, j) holds
// inputs i .. i + 7 of output j, so threads that take neighbouring outputs read neighbouring words (one
// 128-byte line a warp a row of words), and one word dequantizes to 8 consecutive inputs of one output,
// which is one 16-byte row piece of the [n][k] f16 tiles the tensor-core GEMM reads.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/moe_gptq.h"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda::detail {
namespace {

// One matrix's planes (quant/gptq.h NativeView), from its start and shape.
template <bool kZ>
struct Planes {
  const uint32_t* q;  // [k/8][n]
  const __half* s;    // [k/group][n]
  const uint8_t* z;   // [k/group][n] (kZ)
  __device__ Planes(const uint8_t* m, int64_t k, int64_t n, int group) {
    q = reinterpret_cast<const uint32_t*>(m);
    s = reinterpret_cast<const __half*>(m + (size_t)(k / 2 * n));
    z = kZ ? reinterpret_cast<const uint8_t*>(s + (size_t)(k / group * n)) : nullptr;
  }
};

// Expert e's matrix: base + e * bytes where the layer's experts lie back to back (MoeExperts::gate_base),
// else the device table (null: not here).
struct ExpertAt {
  const void* const* table;
  const uint8_t* base;
  size_t bytes;
  int n;
  __device__ const uint8_t* operator()(int e) const {
    return base && e < n ? base + (size_t)e * bytes : static_cast<const uint8_t*>(table[e]);
  }
};
struct ExpertsAt {
  ExpertAt gate, up, down;
  __device__ bool here(int e) const { return gate(e) && up(e) && down(e); }
};
ExpertsAt experts_at(const MoeExperts& e) {
  const int n = (int)e.n_expert;
  return {{e.gate, static_cast<const uint8_t*>(e.gate_base), e.gate_up_bytes, n},
          {e.up, static_cast<const uint8_t*>(e.up_base), e.gate_up_bytes, n},
          {e.down, static_cast<const uint8_t*>(e.down_base), e.down_bytes, n}};
}

// ------------------------------------------------------------------------------------------- decode
// A CTA = 32 outputs (a lane each) of one (token, slot) pair, its inputs staged in shared memory (every lane
// of a warp reads the same ones: broadcasts; H200, a qwen3-30b-a3b layer at one token: 27.7 us, against 31.0
// with 8 warps for gate/up reading them from L1 / L2 and 57.7 for the first form, a word's scale read per
// word and codes through I2F, 2026-12-04); warp w takes the w-th run of consecutive qweight rows, so a
// group's scale and zero point are read once, and the warps' partial sums are added in warp order. One
// token's down products go to a row of partial outputs per slot; gptq_combine_kernel adds them in slot order.
constexpr int kGateUpWarps = 16, kDownWarps = 8;
constexpr int kBatch = 4;  // rows whose words a lane loads before it uses any

// A code as a float without I2F (a quarter-rate conversion): 2^23 + q as bits, minus 2^23.
__device__ __forceinline__ float code(uint32_t w, int b) {
  return __int_as_float(0x4B000000 | ((w >> (4 * b)) & 15u)) - 8388608.0f;
}

// acc[i] += sum over qweight rows [rb, re) of matrix i's column j times xs ([k], shared memory): per group,
// scale (sum q x - zero sum x).
template <bool kZ, int kM>
__device__ __forceinline__ void column_dots(const Planes<kZ> (&m)[kM], int64_t j, int64_t n, int group_words,
                                            int64_t rb, int64_t re, const float* xs, float (&acc)[kM]) {
  float dq[kM], cs[kM], cz[kM], sx = 0.0f;
  int64_t cg = -1;
#pragma unroll
  for (int i = 0; i < kM; ++i) dq[i] = cs[i] = cz[i] = 0.0f;
  for (int64_t r0 = rb; r0 < re; r0 += kBatch) {
    uint32_t q[kM][kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int i = 0; i < kM; ++i) q[i][b] = r0 + b < re ? __ldg(m[i].q + (r0 + b) * n + j) : 0u;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t r = r0 + b;
      if (r >= re) break;
      const int64_t g = r / group_words;
      if (g != cg) {
#pragma unroll
        for (int i = 0; i < kM; ++i) {
          acc[i] += cs[i] * (dq[i] - cz[i] * sx);
          dq[i] = 0.0f;
          cs[i] = __half2float(m[i].s[g * n + j]);
          cz[i] = kZ ? (float)__ldg(m[i].z + g * n + j) : 8.0f;
        }
        sx = 0.0f;
        cg = g;
      }
      const float4 x0 = *reinterpret_cast<const float4*>(xs + r * 8);
      const float4 x1 = *reinterpret_cast<const float4*>(xs + r * 8 + 4);
      const float xe[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      sx += ((x0.x + x0.y) + (x0.z + x0.w)) + ((x1.x + x1.y) + (x1.z + x1.w));
#pragma unroll
      for (int i = 0; i < kM; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) dq[i] += code(q[i][b], e) * xe[e];
    }
  }
#pragma unroll
  for (int i = 0; i < kM; ++i) acc[i] += cs[i] * (dq[i] - cz[i] * sx);
}

// The rows [rb, re) of warp w of `warps` over `rows`.
__device__ __forceinline__ void warp_rows(int64_t rows, int warps, int w, int64_t& rb, int64_t& re) {
  const int64_t per = (rows + warps - 1) / warps;
  rb = min(rows, (int64_t)w * per);
  re = min(rows, rb + per);
}

template <bool kZ>
__global__ void __launch_bounds__(32 * kGateUpWarps, 2)
    gptq_gate_up_kernel(ExpertsAt at, const int32_t* __restrict__ ids, int kslots, int64_t D, int64_t F,
                        int group, const float* __restrict__ x, float* __restrict__ h) {
  extern __shared__ __align__(16) float xs[];  // [D]
  pdl_begin();
  const int64_t p = blockIdx.y;
  const int e = ids[p];
  if (!at.here(e)) return;
  const Planes<kZ> m[2] = {Planes<kZ>(at.gate(e), D, F, group), Planes<kZ>(at.up(e), D, F, group)};
  const int64_t t = p / kslots;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) xs[i] = x[t * D + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t j = (int64_t)blockIdx.x * 32 + lane;
  int64_t rb, re;
  warp_rows(D / 8, kGateUpWarps, warp, rb, re);
  float acc[2] = {0.0f, 0.0f};
  column_dots<kZ, 2>(m, j, F, group / 8, rb, re, xs, acc);
  __shared__ float part[2][kGateUpWarps][32];
  part[0][warp][lane] = acc[0];
  part[1][warp][lane] = acc[1];
  __syncthreads();
  if (warp != 0) return;
  float gs = 0.0f, us = 0.0f;
  for (int w = 0; w < kGateUpWarps; ++w) gs += part[0][w][lane], us += part[1][w][lane];
  h[p * F + j] = gs / (1.0f + expf(-gs)) * us;  // SwiGLU
}

// y[p] = h[p] Wd^T for every present pair p (f32 [n * k][n_embd]).
template <bool kZ>
__global__ void __launch_bounds__(32 * kDownWarps)
    gptq_down_kernel(ExpertsAt at, const int32_t* __restrict__ ids, int64_t D, int64_t F, int group,
                     const float* __restrict__ h, float* __restrict__ y) {
  extern __shared__ __align__(16) float hs[];  // [F]
  pdl_begin();
  const int64_t p = blockIdx.y;
  const int e = ids[p];
  if (!at.here(e)) return;
  const Planes<kZ> m[1] = {Planes<kZ>(at.down(e), F, D, group)};
  for (int64_t i = threadIdx.x; i < F; i += blockDim.x) hs[i] = h[p * F + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t d = (int64_t)blockIdx.x * 32 + lane;
  int64_t rb, re;
  warp_rows(F / 8, kDownWarps, warp, rb, re);
  float acc[1] = {0.0f};
  column_dots<kZ, 1>(m, d, D, group / 8, rb, re, hs, acc);
  __shared__ float part[kDownWarps][32];
  part[warp][lane] = acc[0];
  __syncthreads();
  if (warp != 0) return;
  float sum = 0.0f;
  for (int i = 0; i < kDownWarps; ++i) sum += part[i][lane];
  y[p * D + d] = sum;
}

// out[t] = (accumulate ? out[t] (+ residual[t]) : 0) + sum over t's present slots in slot order of w y[p].
__global__ void __launch_bounds__(256)
    gptq_combine_kernel(ExpertsAt at, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                        int kslots, int64_t D, const float* __restrict__ y, float* __restrict__ out,
                        bool accumulate, const float* __restrict__ residual) {
  pdl_begin();
  const int64_t t = blockIdx.y, d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= D) return;
  float sum = 0.0f;
  for (int j = 0; j < kslots; ++j) {
    const int64_t p = t * kslots + j;
    if (at.here(ids[p])) sum += weights[p] * y[p * D + d];
  }
  float o = sum;
  if (accumulate) o = residual ? (out[t * D + d] + residual[t * D + d]) + sum : out[t * D + d] + sum;
  out[t * D + d] = o;
}

// ------------------------------------------------------------------------------------- grouped GEMM
// Grouped products only (experts). matmul_prefill.cu's tile structure (BM x 64 outputs a CTA, 4 warps of BM/2
// x 32, mma m16n8k16, X by cp.async double-buffered, W one step ahead in registers) with k steps of 32: one
// step is four qweight rows and, a group being a multiple of 32, one scale (and zero) per output. Thread =
// (output column tid % 64, qweight rows 2 (tid / 64) .. +1): two coalesced words a step and matrix, each
// dequantized to 8 f16 of its tile row [n][k].
constexpr int BN = kGemmBN, BK = 32, LDS = BK + 8;  // 80-byte rows: ldmatrix without bank conflicts
constexpr int kThreads = 128;

template <bool kDual, bool kZ, int BM>
__global__ void __launch_bounds__(kThreads) gemm_gptq_kernel(const GemmArgs p, int group) {
  constexpr int NW = kDual ? 2 : 1;
  constexpr int XP = BM / 32;  // 16-byte X pieces a thread a step (BM rows x 4)
  constexpr int MT = BM / 32;  // m16 tiles a warp
  __shared__ __align__(16) uint16_t xs[2][BM][LDS];
  __shared__ __align__(16) uint16_t ws[2][NW][BN][LDS];

  GroupTile gt;
  if (!group_tile(p, (int)blockIdx.x, BM, gt)) return;
  const int64_t m_begin = gt.m_begin, m_end = gt.m_end;
  const uint8_t* wmat[NW];
  wmat[0] = static_cast<const uint8_t*>(p.wtab0[gt.group]);
  if constexpr (kDual) wmat[1] = static_cast<const uint8_t*>(p.wtab1[gt.group]);
  const int64_t N = p.n, K = p.k, n_begin = (int64_t)blockIdx.y * BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  const int nk = (int)(K / BK);

  const uint16_t* xsrc[XP];
  bool xok[XP];
#pragma unroll
  for (int i = 0; i < XP; ++i) {
    const int id = tid + kThreads * i, r = id >> 2;
    const int64_t gr = m_begin + r;
    xok[i] = gr < m_end;
    const int64_t xr = !xok[i] ? 0 : p.x_rows ? p.x_rows[gr] / p.x_row_div : gr;
    xsrc[i] = static_cast<const uint16_t*>(p.x) + xr * K + (id & 3) * 8;
  }
  auto load_x = [&](int buf, int kt) {
#pragma unroll
    for (int i = 0; i < XP; ++i) {
      const int id = tid + kThreads * i;
      cp_async16(smem_addr(&xs[buf][id >> 2][(id & 3) * 8]), xok[i] ? xsrc[i] + kt * BK : p.x, xok[i]);
    }
  };

  const int wc = tid & (BN - 1), wr0 = (tid / BN) * 2;
  const int64_t col = n_begin + wc;
  const bool col_ok = col < N;
  uint32_t rq[NW][2];
  float rs[NW], rz[NW];
  auto load_w = [&](int kt) {
    if (!col_ok) return;
    const int64_t g = (int64_t)kt * BK / group;
#pragma unroll
    for (int q = 0; q < NW; ++q) {
      const Planes<kZ> pl(wmat[q], K, N, group);
#pragma unroll
      for (int i = 0; i < 2; ++i) rq[q][i] = __ldg(pl.q + ((int64_t)kt * 4 + wr0 + i) * N + col);
      rs[q] = __half2float(pl.s[g * N + col]);
      rz[q] = kZ ? (float)__ldg(pl.z + g * N + col) : 8.0f;
    }
  };
  auto store_w = [&](int buf) {
#pragma unroll
    for (int q = 0; q < NW; ++q)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t v[4] = {0, 0, 0, 0};
        if (col_ok) {
          const uint32_t w = rq[q][i];
#pragma unroll
          for (int b = 0; b < 4; ++b)
            v[b] = pack_half2(((float)((w >> (8 * b)) & 15u) - rz[q]) * rs[q],
                              ((float)((w >> (8 * b + 4)) & 15u) - rz[q]) * rs[q]);
        }
        *reinterpret_cast<uint4*>(&ws[buf][q][wc][(wr0 + i) * 8]) = make_uint4(v[0], v[1], v[2], v[3]);
      }
  };

  float acc[NW][MT][4][4];
#pragma unroll
  for (int q = 0; q < NW; ++q)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][i][j][e] = 0.0f;

  auto compute = [&](int buf) {
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(af[mt],
                    smem_addr(&xs[buf][wm * (BM / 2) + mt * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]));
#pragma unroll
      for (int q = 0; q < NW; ++q) {
        uint32_t bf[4][2];
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t r[4];
          ldmatrix_x4(r, smem_addr(&ws[buf][q][wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)]
                                      [kk * 16 + ((lane >> 3) & 1) * 8]));
          bf[2 * np][0] = r[0];
          bf[2 * np][1] = r[1];
          bf[2 * np + 1][0] = r[2];
          bf[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            mma_f16(acc[q][mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[nt][0], bf[nt][1]);
      }
    }
  };

  load_x(0, 0);
  cp_async_commit();
  load_w(0);
  store_w(0);
  cp_async_wait<0>();
  __syncthreads();
  for (int kt = 0; kt < nk; ++kt) {
    const int buf = kt & 1;
    const bool more = kt + 1 < nk;
    if (more) {
      load_x(buf ^ 1, kt + 1);
      cp_async_commit();
      load_w(kt + 1);
    }
    compute(buf);
    if (more) store_w(buf ^ 1);
    cp_async_wait<0>();
    __syncthreads();
  }

  // Fragment element e of (mt, nt): row lane / 4 (+8 for e >= 2), columns 2 (lane % 4) + e % 2.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = m_begin + wm * (BM / 2) + mt * 16 + (lane >> 2) + half * 8;
      if (r >= m_end) continue;
      const int64_t xr = p.x_rows ? p.x_rows[r] / p.x_row_div : r;
      const float s = p.x_scale ? p.x_scale[xr] : 1.0f;
      float* yr = p.y + r * p.ldy;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t c = n_begin + wn * 32 + nt * 8 + (lane & 3) * 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = gemm_out<kDual>(acc[0][mt][nt][2 * half + e], acc[NW - 1][mt][nt][2 * half + e], s);
          if (c + e < N) yr[c + e] = v;
        }
      }
    }
  }
}

template <bool kDual, bool kZ, int BM>
void launch_gemm_gptq_t(const GemmArgs& a, int group, cudaStream_t stream) {
  if (a.max_tiles == 0) return;
  const dim3 grid((unsigned)a.max_tiles, (unsigned)((a.n + BN - 1) / BN));
  gemm_gptq_kernel<kDual, kZ, BM><<<grid, kThreads, 0, stream>>>(a, group);
  XPERT_CUDA_CHECK_LAUNCH();
  trace_launch(gemm_gptq_kernel<kDual, kZ, BM>, stream);
}

template <bool kDual, bool kZ>
void launch_gemm_gptq_bm(const GemmArgs& a, int group, cudaStream_t stream) {
  if (a.bm == kGemmSmallBM)
    launch_gemm_gptq_t<kDual, kZ, kGemmSmallBM>(a, group, stream);
  else
    launch_gemm_gptq_t<kDual, kZ, kGemmBM>(a, group, stream);
}

}  // namespace

void launch_gptq_gate_up(const MoeExperts& e, const int32_t* ids, int64_t n, int64_t k, const float* x,
                         float* h, cudaStream_t stream) {
  const int64_t D = e.n_embd, F = e.n_ff;
  const int group = (int)gptq_group(e.gate_type);
  const dim3 grid((unsigned)(F / 32), (unsigned)(n * k));
  auto* kernel = gptq_has_zeros(e.gate_type) ? gptq_gate_up_kernel<true> : gptq_gate_up_kernel<false>;
  launch_pdl(kernel, grid, 32 * kGateUpWarps, (size_t)D * sizeof(float), stream, experts_at(e), ids, (int)k,
             D, F, group, x, h);
  XPERT_CUDA_CHECK_LAUNCH();
}

void launch_gptq_down(const MoeExperts& e, const int32_t* ids, const float* weights, int64_t n, int64_t k,
                      const float* h, float* y, float* out, bool accumulate, const float* residual,
                      cudaStream_t stream) {
  const int64_t D = e.n_embd, F = e.n_ff;
  const int group = (int)gptq_group(e.down_type);
  auto* kernel = gptq_has_zeros(e.down_type) ? gptq_down_kernel<true> : gptq_down_kernel<false>;
  launch_pdl(kernel, dim3((unsigned)(D / 32), (unsigned)(n * k)), 32 * kDownWarps, (size_t)F * sizeof(float),
             stream, experts_at(e), ids, D, F, group, h, y);
  XPERT_CUDA_CHECK_LAUNCH();
  launch_pdl(gptq_combine_kernel, dim3((unsigned)((D + 255) / 256), (unsigned)n), 256, 0, stream,
             experts_at(e), ids, weights, (int)k, D, y, out, accumulate, residual);
  XPERT_CUDA_CHECK_LAUNCH();
}

void launch_gemm_gptq(DType w_type, bool dual, const GemmArgs& a, cudaStream_t stream) {
  XPERT_CU_ASSERT(is_gptq(w_type) && a.group_tiles && a.k % BK == 0 && a.k % gptq_group(w_type) == 0 &&
                  a.n_outs == 0 && (a.bm == kGemmSmallBM || a.bm == kGemmBM));
  const int group = (int)gptq_group(w_type);
  const bool z = gptq_has_zeros(w_type);
  if (dual) {
    if (z)
      launch_gemm_gptq_bm<true, true>(a, group, stream);
    else
      launch_gemm_gptq_bm<true, false>(a, group, stream);
  } else if (z) {
    launch_gemm_gptq_bm<false, true>(a, group, stream);
  } else {
    launch_gemm_gptq_bm<false, false>(a, group, stream);
  }
}

}  // namespace xpert::cuda::detail
