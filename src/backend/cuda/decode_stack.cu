// The persistent decode kernel of an attention + routed-experts stack (decode_stack.h). Conventions:
// - a grid of one 512-thread block per SM (XPERT_STACK_BLOCKS=2..8 asks for more where they fit);
// - weight rows are dealt to the grid's warps in turn, 8 to 32 lanes a row (Deal), lanes splitting the
//   row's chunks as the decode matvec does;
// - data a block reads after a barrier that another block wrote during this kernel (x, q/k/v, att,
//   logits, h) is read past L1 (__ldcg); weights and the older cache rows are read-only here and take the
//   read-only path;
// - a block's activations are in its shared memory as q8_1 (every block converts the same vector, and
//   every block routes the token itself: cheaper than one more barrier).
// Measurement knobs: XPERT_STACK_PROFILE=1 (with XPERT_GRAPHS=0) prints each phase's time per layer as
// block 0 sees it; XPERT_STACK_BARRIERS=N adds N empty barriers per layer (to time one).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/decode_stack.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/q8_1.cuh"

namespace xpert::cuda {
namespace {

using dev::Dot;
using dev::SharedAct;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxExperts = 1024;
constexpr int kMaxSlots = 32;
constexpr int kKeysPerSplit = 512;  // a head's keys past this are split over more blocks
constexpr int kMaxItems = 1024;     // (head, split) items: the workspace's partial rows

struct Work {
  float *q, *k, *v, *att, *part, *logits, *h;
  int8_t* xq;  // the FFN input as q8_1 (phase D's block 0, for phase E)
  float2* xds;
};

// The routing's scratch in shared memory (route_token_block's), rounded up so that the slots' arrays after it
// stay aligned.
__host__ __device__ inline int route_floats(int n_expert) {
  return (route_block_floats(n_expert, kThreads) + 3) & ~3;
}

struct Params {
  StackShape s;
  const StackLayer* layers;
  float* x;
  const int32_t* pos;
  const int32_t* slot;
  Work w;
  unsigned* bar;             // the grid barrier's counter
  int extra_barriers;        // XPERT_STACK_BARRIERS
  unsigned long long* prof;  // XPERT_STACK_PROFILE: block 0's clock at each point, [layer][kPhases]
};
constexpr int kPhases = 14;  // 8 phase boundaries, then points inside phases (report_profile)

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ int g_layer;  // the layer block 0 is in, for sub_mark
__device__ __forceinline__ void sub_mark(const Params& p, int point) {
  if (p.prof && blockIdx.x == 0 && threadIdx.x == 0) p.prof[g_layer * kPhases + point] = global_ns();
}

// Shared memory of a block, carved the same way on the host (for its size) and the device.
struct Smem {
  size_t yf, q, ds, attn, route, red, total;
};
__host__ __device__ inline size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }
__host__ __device__ inline Smem smem_layout(const StackShape& s) {
  const size_t qd = (size_t)s.n_head * s.head_dim;
  const size_t kf = (size_t)s.k * s.n_ff, e = (size_t)s.n_embd;
  const size_t act = e > qd ? (e > kf ? e : kf) : (qd > kf ? qd : kf);
  Smem m;
  m.yf = 0;  // f32: a norm's output, or the f32 form of an activation being converted
  m.q = m.yf + align16(act * 4);
  m.ds = m.q + align16(act);
  m.attn = m.ds + align16(act / 32 * 8);
  m.route = m.attn + align16(((size_t)(3 + kWarps) * s.head_dim + 2 * kWarps) * 4);
  m.red = m.route + align16((size_t)route_floats(s.n_expert) * 4 + 2 * kMaxSlots * 4 + 3 * kMaxSlots * 8);
  m.total = m.red + 32 * 4;
  return m;
}

// ------------------------------------------------------------------------------------------ barrier
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid arrives, then all go on; the counter only grows (zeroed before the launch).
struct GridBarrier {
  unsigned* count;
  unsigned target;
  __device__ void sync() {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(count, 1u);
      while (ld_acquire(count) < target) {
      }
    }
    __syncthreads();
  }
};

// ------------------------------------------------------------------------------------------ helpers
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

template <DType T>
__device__ __forceinline__ float dot_chunks(const dev::row_t<T>& row, int64_t k, const SharedAct& a, int sub,
                                            int lanes) {
  const int nc = (int)(k / Dot<T>::kElems);
  float acc[1] = {0.0f};
  dev::dot_row<T, 1, 2>(row, sub, lanes, nc, a, 1, acc);
  return acc[0];
}

// This lane's part of row r (of a matrix w of `rows` rows, rb bytes each as the file stores them) . a
// (lanes `lanes`, this one `sub`); the caller adds the lanes' parts.
__device__ __noinline__ float row_part(int t, const void* w, int r, int rows, size_t rb, int64_t k,
                                       SharedAct a, int sub, int lanes) {
  float v = 0.0f;
  dev::dispatch_quant_type(
      (DType)t, [&]<DType T>() { v = dot_chunks<T>(dev::row_at<T>(w, r, rows, rb), k, a, sub, lanes); });
  return v;
}

// Rows of a matrix dealt to the grid's warps, `lpr` lanes a row (32 / lpr rows a warp at once): row
// r = slot + i * slots, slot = global warp * (32 / lpr) + lane / lpr. Fewer lanes a row when the rows
// outnumber the warps, so that every row's loads are in flight in one pass.
struct Deal {
  int lpr, slot, slots, sub;
  __device__ Deal(int n_rows, int nc, int min_lpr = 8, int max_lpr = 32) {
    lpr = max_lpr;
    const int warps = (int)gridDim.x * kWarps;
    while (lpr > min_lpr && n_rows > warps * (32 / lpr) && nc >= lpr) lpr /= 2;
    const int lane = threadIdx.x & 31;
    slot = ((int)blockIdx.x * kWarps + (int)threadIdx.x / 32) * (32 / lpr) + lane / lpr;
    slots = warps * (32 / lpr);
    sub = lane & (lpr - 1);
  }
  // The sum of the lanes of a row (every lane gets it).
  __device__ float reduce(float v) const {
    for (int off = lpr / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
    return v;
  }
  // Rows [first, first + count) of this block, per round, for the prefetch.
  __device__ int block_rows() const { return kWarps * (32 / lpr); }
};

// Chunks of a row of k elements (the dot's unit: Dot<T>::kElems).
__device__ int chunks_of(int t, int64_t k) {
  int e = 32;
  dev::dispatch_quant_type((DType)t, [&]<DType T>() { e = Dot<T>::kElems; });
  return (int)(k / e);
}

// This block's rows of a weight phase (n rows of rb bytes, k elements) on their way into L2, issued by
// the calling thread; prefetch_rows: by thread 0.
__device__ void rows_to_l2(const void* w, size_t rb, int n, int per, int first) {
  for (int r0 = first; r0 < n; r0 += (int)gridDim.x * per)
    prefetch_l2(static_cast<const uint8_t*>(w) + (size_t)r0 * rb, (size_t)min(per, n - r0) * rb);
}
__device__ void prefetch_rows(const void* w, size_t rb, int t, int64_t k, int n) {
  if (threadIdx.x != 0 || !w) return;
  const Deal d(n, chunks_of(t, k));
  rows_to_l2(w, rb, n, d.block_rows(), (int)blockIdx.x * d.block_rows());
}

// n floats another block wrote (n % 4 == 0) -> shared memory, every load in flight at once.
__device__ void load_smem(const float* src, int n, float* dst) {
#pragma unroll 4
  for (int i = threadIdx.x; i < n / 4; i += kThreads)
    reinterpret_cast<float4*>(dst)[i] = __ldcg(reinterpret_cast<const float4*>(src) + i);
}

// v (n floats in shared memory) -> q8_1 blocks, a thread per block (q8_1.cuh), then a __syncthreads.
__device__ void quantize_smem(const float* v, int n, int8_t* q, float2* ds) {
  thread_quantize_q8_1(v, n, q, ds, threadIdx.x, kThreads);
  __syncthreads();
}

// y = x * (1 / sqrt(mean(x^2) + eps)) * w over the block: f32 into yf, q8_1 into q/ds (when q is set).
__device__ void norm_rows(const float* x, const float* w, int E, float eps, float* yf, int8_t* q, float2* ds,
                          float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  float ss = 0.0f;
#pragma unroll 2
  for (int i = threadIdx.x; i < E / 4; i += kThreads) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(x) + i);
    reinterpret_cast<float4*>(yf)[i] = v;
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = warp_sum(ss);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float tot = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) tot += red[i];
  const float inv = 1.0f / sqrtf(tot / (float)E + eps);
  for (int i = threadIdx.x; i < E / 4; i += kThreads) {  // this thread's own elements from above
    float4 v = reinterpret_cast<float4*>(yf)[i];
    const float4 g = __ldg(reinterpret_cast<const float4*>(w) + i);
    v.x = v.x * inv * g.x, v.y = v.y * inv * g.y, v.z = v.z * inv * g.z, v.w = v.w * inv * g.w;
    reinterpret_cast<float4*>(yf)[i] = v;
  }
  __syncthreads();
  if (q) quantize_smem(yf, E, q, ds);
}

// n f32 values another block wrote -> q8_1 in shared memory (through the f32 scratch f).
__device__ void quantize_block(const float* src, int n, float* f, int8_t* q, float2* ds) {
  load_smem(src, n, f);
  __syncthreads();
  quantize_smem(f, n, q, ds);
}

// One head row (global, fresh) -> per-head RMS norm (w may be null: none) and RoPE into dst (shared), by
// one warp, as norm_rope_kernel does it (angles built by repeated products, the CPU's floats).
__device__ void norm_rope_row(const float* src, const float* w, const StackShape& s, float pos, float* dst) {
  const int lane = threadIdx.x & 31, D = s.head_dim;
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) {
    const float v = __ldcg(src + i);
    dst[i] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float sc = 1.0f / sqrtf(ss / (float)D + s.eps);
  if (w)
    for (int i = lane; i < D; i += 32) dst[i] = dst[i] * sc * __ldg(w + i);
  __syncwarp();
  for (int i2 = lane; i2 < s.n_rot / 2; i2 += 32) {
    float theta = pos;
    for (int j = 0; j < i2; ++j) theta *= s.theta_scale;
    const float th = s.freq_scale * theta;
    const float c = cosf(th), sn = sinf(th);
    const int a = s.neox ? i2 : 2 * i2, b = s.neox ? i2 + s.n_rot / 2 : 2 * i2 + 1;
    const float x0 = dst[a], x1 = dst[b];
    dst[a] = x0 * c - x1 * sn;
    dst[b] = x0 * sn + x1 * c;
  }
  __syncwarp();
}

// ------------------------------------------------------------------------------------------- phases
struct Ctx {
  const Params& p;
  const StackShape& s;
  uint8_t* sm;
  Smem lay;
  __device__ float* yf() const { return reinterpret_cast<float*>(sm + lay.yf); }
  __device__ int8_t* q() const { return reinterpret_cast<int8_t*>(sm + lay.q); }
  __device__ float2* ds() const { return reinterpret_cast<float2*>(sm + lay.ds); }
  __device__ float* attn() const { return reinterpret_cast<float*>(sm + lay.attn); }
  __device__ float* route() const { return reinterpret_cast<float*>(sm + lay.route); }
  __device__ float* red() const { return reinterpret_cast<float*>(sm + lay.red); }
};

// A: rmsnorm(x) -> q, k, v.
__device__ void phase_qkv(const Ctx& c, const StackLayer& L) {
  const StackShape& s = c.s;
  const int E = s.n_embd, qd = s.n_head * s.head_dim, kvd = s.n_head_kv * s.head_dim, n = qd + 2 * kvd;
  norm_rows(c.p.x, L.attn_norm, E, s.eps, c.yf(), c.q(), c.ds(), c.red());
  sub_mark(c.p, 12);
  const SharedAct a{c.q(), c.ds(), E};
  const Deal d(n, chunks_of(L.tq, E));
  for (int base = d.slot - d.slot % (32 / d.lpr); base < n; base += d.slots) {
    const int r = base + d.slot % (32 / d.lpr);
    const bool ok = r < n, iq = r < qd, ik = !iq && r < qd + kvd;
    const int t = iq ? L.tq : ik ? L.tk : L.tv;
    const int row = iq ? r : ik ? r - qd : r - qd - kvd;
    const void* w = iq ? L.wq : ik ? L.wk : L.wv;
    const size_t rb = iq ? L.rq : ik ? L.rk : L.rv;
    const float v = d.reduce(ok ? row_part(t, w, row, iq ? qd : kvd, rb, E, a, d.sub, d.lpr) : 0.0f);
    if (ok && d.sub == 0) (iq ? c.p.w.q : ik ? c.p.w.k : c.p.w.v)[row] = v;
  }
  sub_mark(c.p, 13);
  prefetch_rows(L.wo, L.ro, L.to, qd, E);
}

// How many blocks share a head's keys (the same on every block).
__device__ int n_splits(const StackShape& s, int n_kv) {
  const int most = max(1, min((int)gridDim.x, kMaxItems) / s.n_head);
  int n = min(most, (n_kv + kKeysPerSplit - 1) / kKeysPerSplit);
  const int per = (n_kv + n - 1) / n;
  return (n_kv + per - 1) / per;
}

// B: per (q head, key split): norms + RoPE, the f16 stores (the group's first head, first split), and the
// split's online-softmax attention, lanes over keys for the scores, over dims for the values. The token's
// own k/v row is read from shared memory (its store may not have landed): row pointers are generic.
template <int D>
__device__ void phase_attention(const Ctx& c, const StackLayer& L) {
  constexpr int kDpl = D / 32;  // value dims per lane
  const StackShape& s = c.s;
  const int group = s.n_head / s.n_head_kv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int pos = __ldg(c.p.pos), n_kv = pos + 1, ns = n_splits(s, n_kv), per = (n_kv + ns - 1) / ns;
  const int64_t slot = __ldg(c.p.slot), row = (int64_t)s.n_head_kv * D;
  float* sq = c.attn();
  float* sk = sq + D;  // f32 scratch of the k row, then its f16 bits
  float* sv = sk + D;
  float* wacc = sv + D;            // [kWarps][D]
  float* wml = wacc + kWarps * D;  // [kWarps][2]: max, sum
  __half* hk16 = reinterpret_cast<__half*>(sv);
  __half* hv16 = hk16 + D;
  for (int item = blockIdx.x; item < s.n_head * ns; item += gridDim.x) {
    const int h = item / ns, sp = item % ns, hk = h / group;
    __half* kc = reinterpret_cast<__half*>(static_cast<char*>(L.k_cache) + slot * s.slot_stride) + hk * D;
    __half* vc = reinterpret_cast<__half*>(static_cast<char*>(L.v_cache) + slot * s.slot_stride) + hk * D;
    const bool store = h % group == 0 && sp == 0;
    if (warp == 0) norm_rope_row(c.p.w.q + (int64_t)h * D, L.q_norm, s, (float)pos, sq);
    if (warp == 1) {
      norm_rope_row(c.p.w.k + (int64_t)hk * D, L.k_norm, s, (float)pos, sk);
      for (int i = lane; i < D; i += 32) {
        const __half v = __float2half_rn(sk[i]);
        hk16[i] = v;
        if (store) kc[(int64_t)pos * row + i] = v;
      }
    }
    if (warp == 2) {
      for (int i = lane; i < D; i += 32) {
        const __half v = __float2half_rn(__ldcg(c.p.w.v + (int64_t)hk * D + i));
        hv16[i] = v;
        if (store) vc[(int64_t)pos * row + i] = v;
      }
    }
    __syncthreads();
    const int kb = sp * per, ke = min(n_kv, kb + per);
    float m = -INFINITY, l = 0.0f, acc[kDpl];
#pragma unroll
    for (int i = 0; i < kDpl; ++i) acc[i] = 0.0f;
    // Warp w takes keys [wb, we): an equal share, so short rows take one round of 32 keys.
    const int kpw = (ke - kb + kWarps - 1) / kWarps, wb = kb + warp * kpw, we = min(ke, wb + kpw);
    for (int key0 = wb; key0 < we; key0 += 32) {
      const int key = key0 + lane;
      const uint4* kr =
          reinterpret_cast<const uint4*>(key == pos || key >= we ? hk16 : kc + (int64_t)key * row);
      float dot = 0.0f;
#pragma unroll
      for (int i0 = 0; i0 < D / 8; i0 += 8) {  // 8 loads of 16 bytes in flight, then their products
        uint4 kv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) kv[i] = kr[i0 + i];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t wv[4] = {kv[i].x, kv[i].y, kv[i].z, kv[i].w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&wv[j]));
            const int e = 8 * (i0 + i) + 2 * j;
            dot = fmaf(sq[e], f.x, fmaf(sq[e + 1], f.y, dot));
          }
        }
      }
      const float sc = key < we ? dot * s.kq_scale : -INFINITY;
      const float mn = fmaxf(m, warp_max(sc));
      const float pr = key < we ? expf(sc - mn) : 0.0f, corr = expf(m - mn);
      l = l * corr + warp_sum(pr);
#pragma unroll
      for (int i = 0; i < kDpl; ++i) acc[i] *= corr;
      m = mn;
      const int nk = min(32, we - key0);
      for (int j0 = 0; j0 < nk; j0 += 8) {
        __half vv[8][kDpl];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int kj = key0 + j0 + u;
          const __half* vr = (kj == pos || kj >= we ? hv16 : vc + (int64_t)kj * row) + lane * kDpl;
          if constexpr (kDpl == 2)
            *reinterpret_cast<uint32_t*>(vv[u]) = *reinterpret_cast<const uint32_t*>(vr);
          else if constexpr (kDpl == 4)
            *reinterpret_cast<uint2*>(vv[u]) = *reinterpret_cast<const uint2*>(vr);
          else
            *reinterpret_cast<uint4*>(vv[u]) = *reinterpret_cast<const uint4*>(vr);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float pj = __shfl_sync(kFull, pr, j0 + u);
#pragma unroll
          for (int i = 0; i < kDpl; ++i) acc[i] = fmaf(pj, __half2float(vv[u][i]), acc[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kDpl; ++i) wacc[warp * D + lane * kDpl + i] = acc[i];
    if (lane == 0) {
      wml[2 * warp] = m;
      wml[2 * warp + 1] = l;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += kThreads) {
      float M = -INFINITY;
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wml[2 * w]);
      float sl = 0.0f, sa = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        if (wml[2 * w] == -INFINITY) continue;
        const float e = expf(wml[2 * w] - M);
        sl += wml[2 * w + 1] * e;
        sa += wacc[w * D + d] * e;
      }
      if (ns == 1) {
        c.p.w.att[(int64_t)h * D + d] = sa / sl;
      } else {
        float* pt = c.p.w.part + (int64_t)item * (D + 2);
        pt[2 + d] = sa;
        if (d == 0) pt[0] = M, pt[1] = sl;
      }
    }
    __syncthreads();
  }
}

// The splits of each head into att (only when a head had more than one).
__device__ void phase_combine(const Ctx& c, int ns) {
  const StackShape& s = c.s;
  const int D = s.head_dim;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < s.n_head * D; i += gridDim.x * kThreads) {
    const int h = i / D, d = i % D;
    const float* pt = c.p.w.part + (int64_t)h * ns * (D + 2);
    float M = -INFINITY;
    for (int j = 0; j < ns; ++j) M = fmaxf(M, __ldcg(pt + j * (D + 2)));
    float sl = 0.0f, sa = 0.0f;
    for (int j = 0; j < ns; ++j) {
      const float e = expf(__ldcg(pt + j * (D + 2)) - M);
      sl += __ldcg(pt + j * (D + 2) + 1) * e;
      sa += __ldcg(pt + j * (D + 2) + 2 + d) * e;
    }
    c.p.w.att[i] = sa / sl;
  }
}

// C: att -> o rows added into x.
__device__ void phase_out(const Ctx& c, const StackLayer& L) {
  const StackShape& s = c.s;
  const int E = s.n_embd, qd = s.n_head * s.head_dim;
  quantize_block(c.p.w.att, qd, c.yf(), c.q(), c.ds());
  const SharedAct a{c.q(), c.ds(), qd};
  const size_t rb = L.ro;
  const Deal d(E, chunks_of(L.to, qd));
  for (int base = d.slot - d.slot % (32 / d.lpr); base < E; base += d.slots) {
    const int r = base + d.slot % (32 / d.lpr);
    const bool ok = r < E;
    const float v = d.reduce(ok ? row_part(L.to, L.wo, r, E, rb, qd, a, d.sub, d.lpr) : 0.0f);
    if (ok && d.sub == 0) c.p.x[r] = __ldcg(c.p.x + r) + v;
  }
  if (threadIdx.x == 0) {
    rows_to_l2(L.router, (size_t)E * 4, s.n_expert, 1, (int)blockIdx.x);  // phase D: a row a block
    prefetch_l2(L.ffn_norm, (size_t)E * 4);
  }
}

struct Slots {  // the routing in shared memory: ids, weights, each slot's matrices
  int32_t* ids;
  float* w;
  const uint8_t** gate;
  const uint8_t** up;
  const uint8_t** down;
  __device__ Slots(const Ctx& c) {
    float* l = c.route() + route_floats(c.s.n_expert);
    ids = reinterpret_cast<int32_t*>(l);
    w = l + kMaxSlots;
    gate = reinterpret_cast<const uint8_t**>(w + kMaxSlots);
    up = gate + kMaxSlots;
    down = up + kMaxSlots;
  }
  __device__ void set_matrices(const StackLayer& L, int j) {  // thread j
    const uint64_t e = (uint64_t)ids[j];
    gate[j] = static_cast<const uint8_t*>(L.gate) + e * L.gate_bytes;
    up[j] = static_cast<const uint8_t*>(L.up) + e * L.up_bytes;
    down[j] = static_cast<const uint8_t*>(L.down) + e * L.down_bytes;
  }
};

// moe.h's routing of the logits (phase D's, in global memory) by the whole block (moe_route.cuh), into the
// slots; ends with a __syncthreads.
__device__ void route_block(const Ctx& c, int K, Slots& sl) {
  const StackShape& s = c.s;
  route_token_block<kThreads>(c.p.w.logits, c.route(), s.n_expert, K, s.norm_weights, s.weights_scale, sl.ids,
                              sl.w);
  __syncthreads();
}

// D: rmsnorm(x) -> router logits, a row a block (the blocks with rows); block 0 also leaves the FFN input's
// q8_1 for E.
__device__ void phase_router(const Ctx& c, const StackLayer& L) {
  const StackShape& s = c.s;
  const int E = s.n_embd, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const bool first = blockIdx.x == 0;
  if ((int)blockIdx.x >= s.n_expert && !first) return;
  float* y = c.yf();
  float* red = c.red();
  norm_rows(c.p.x, L.ffn_norm, E, s.eps, y, first ? c.q() : nullptr, c.ds(), red);
  if (first) {
    for (int i = threadIdx.x; i < E / 16; i += kThreads)
      reinterpret_cast<uint4*>(c.p.w.xq)[i] = reinterpret_cast<const uint4*>(c.q())[i];
    for (int i = threadIdx.x; i < E / 32; i += kThreads) c.p.w.xds[i] = c.ds()[i];
  }
  for (int e = blockIdx.x; e < s.n_expert; e += gridDim.x) {
    const float4* w = reinterpret_cast<const float4*>(L.router + (int64_t)e * E);
    float acc = 0.0f;
    for (int i = threadIdx.x; i < E / 4; i += kThreads) {
      const float4 a = __ldg(w + i), b = reinterpret_cast<const float4*>(y)[i];
      acc = fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
    }
    acc = warp_sum(acc);
    __syncthreads();  // red[] is free (norm_rows' or the last row's)
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float tot = 0.0f;
      for (int i = 0; i < kWarps; ++i) tot += red[i];
      c.p.w.logits[e] = tot;
    }
  }
}

// E: routing (every block: cheaper than one more barrier), the FFN input's q8_1 (from phase D), then gate
// and up rows of the chosen experts: SwiGLU -> h. Once the experts are known, this block's rows of them start
// into L2 (all its rounds at once), and so do its rows of phase F.
__device__ void phase_gate_up(const Ctx& c, const StackLayer& L) {
  const StackShape& s = c.s;
  const int E = s.n_embd, F = s.n_ff, K = s.k;
  Slots sl(c);
  for (int i = threadIdx.x; i < E / 16; i += kThreads)
    reinterpret_cast<uint4*>(c.q())[i] = __ldcg(reinterpret_cast<const uint4*>(c.p.w.xq) + i);
  for (int i = threadIdx.x; i < E / 32; i += kThreads) c.ds()[i] = __ldcg(c.p.w.xds + i);
  route_block(c, K, sl);
  if (threadIdx.x < K) sl.set_matrices(L, threadIdx.x);
  __syncthreads();
  sub_mark(c.p, 8);
  // Rows 2t and 2t + 1 are task t's gate and up rows, in neighbouring lane groups of one warp.
  const Deal d(2 * K * F, chunks_of(L.tg, E), 8, 16);
  const int rounds = (2 * K * F + d.slots - 1) / d.slots, per = d.block_rows();
  const size_t rg = L.rg, ru = L.ru;
  for (int i = threadIdx.x; i < rounds * per; i += kThreads) {  // a row per thread, every round at once
    const int r = (int)blockIdx.x * per + i % per + i / per * d.slots;
    if (r < 2 * K * F) {
      const int j = r / 2 / F, f = r / 2 % F;
      if (r & 1)
        prefetch_l2(sl.up[j] + ru * f, ru);
      else
        prefetch_l2(sl.gate[j] + rg * f, rg);
    }
  }
  if (threadIdx.x < K)  // this block's rows of phase F
    rows_to_l2(sl.down[threadIdx.x], L.rd, E, kWarps, (int)blockIdx.x * kWarps);
  const SharedAct a{c.q(), c.ds(), E};
  const int group = d.slot % (32 / d.lpr);
  for (int base = d.slot - group; base < 2 * K * F; base += d.slots) {
    const int r = base + group, t = r / 2, j = t / F, f = t % F;
    const bool ok = r < 2 * K * F, up = r & 1;
    const float v = d.reduce(
        ok ? row_part(up ? L.tu : L.tg, up ? sl.up[j] : sl.gate[j], f, F, up ? ru : rg, E, a, d.sub, d.lpr)
           : 0.0f);
    const float u = __shfl_down_sync(kFull, v, d.lpr);
    if (ok && !up && d.sub == 0) c.p.w.h[t] = v / (1.0f + expf(-v)) * u;
  }
  sub_mark(c.p, 9);
}

// F: h (q8_1) -> down rows of the chosen experts, weighted in slot order, added into x. A warp takes a row
// of every slot at once: `lps` lanes per slot.
__device__ void phase_down(const Ctx& c, const StackLayer& L, const StackLayer* next) {
  const StackShape& s = c.s;
  const int E = s.n_embd, F = s.n_ff, K = s.k, lane = threadIdx.x & 31;
  Slots sl(c);  // this block's from phase E: the same
  float* wts = sl.w;
  quantize_block(c.p.w.h, K * F, c.yf(), c.q(), c.ds());
  sub_mark(c.p, 10);
  int kp = 1;
  while (kp < K) kp *= 2;
  const int lps = 32 / kp, j = lane / lps, sub = lane % lps;
  const size_t rb = L.rd;
  const uint8_t* w = j < K ? sl.down[j] : nullptr;
  const SharedAct a{c.q() + (int64_t)min(j, K - 1) * F, c.ds() + (int64_t)min(j, K - 1) * (F / 32), F};
  const int n_warps = (int)gridDim.x * kWarps;
  for (int r = (int)blockIdx.x * kWarps + (int)threadIdx.x / 32; r < E; r += n_warps) {
    float v = j < K ? row_part(L.td, w, r, E, rb, F, a, sub, lps) : 0.0f;
    for (int off = lps / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
    float sum = 0.0f;
    for (int jj = 0; jj < K; ++jj) sum += wts[jj] * __shfl_sync(kFull, v, jj * lps);
    if (lane == 0) c.p.x[r] = __ldcg(c.p.x + r) + sum;
  }
  sub_mark(c.p, 11);
  if (next) {
    const int qd = s.n_head * s.head_dim, kvd = s.n_head_kv * s.head_dim;
    // Phase A deals q, k and v as one range: these blocks' shares differ from it, but together they fetch
    // every row.
    if (threadIdx.x == 0) prefetch_l2(next->attn_norm, (size_t)E * 4);
    prefetch_rows(next->wq, next->rq, next->tq, E, qd);
    prefetch_rows(next->wk, next->rk, next->tk, E, kvd);
    prefetch_rows(next->wv, next->rv, next->tv, E, kvd);
  }
}

__global__ void __launch_bounds__(kThreads, 1) stack_kernel(Params p) {
  extern __shared__ uint4 stack_smem[];
  const Ctx c{p, p.s, reinterpret_cast<uint8_t*>(stack_smem), smem_layout(p.s)};
  GridBarrier bar{p.bar, 0};
  const int n_kv = __ldg(p.pos) + 1, ns = n_splits(p.s, n_kv);
  int ph = 0;
  const auto mark = [&](int il) {
    if (p.prof && blockIdx.x == 0 && threadIdx.x == 0) p.prof[il * kPhases + ph] = global_ns(), g_layer = il;
    ++ph;
  };
  __shared__ StackLayer layer;  // this layer's table, read often: from shared memory
  const StackLayer& L = layer;
  for (int il = 0; il < p.s.n_layer; ++il) {
    if (threadIdx.x == 0) layer = p.layers[il];
    __syncthreads();
    for (int i = 0; i < p.extra_barriers; ++i) bar.sync();
    ph = 0;
    mark(il);
    phase_qkv(c, L);
    bar.sync();
    mark(il);
    switch (p.s.head_dim) {
      case 64:
        phase_attention<64>(c, L);
        break;
      case 128:
        phase_attention<128>(c, L);
        break;
      default:
        phase_attention<256>(c, L);
        break;
    }
    bar.sync();
    mark(il);
    if (ns > 1) {
      phase_combine(c, ns);
      bar.sync();
    }
    mark(il);
    phase_out(c, L);
    bar.sync();
    mark(il);
    phase_router(c, L);
    bar.sync();
    mark(il);
    phase_gate_up(c, L);
    bar.sync();
    mark(il);
    phase_down(c, L, il + 1 < p.s.n_layer ? &p.layers[il + 1] : nullptr);
    if (il + 1 < p.s.n_layer) bar.sync();
    mark(il);
  }
}

// The block-quantized types (those the decode dots multiply with q8_1).
bool block_type(int32_t t) {
  return dev::dispatch_quant_type((DType)t, [&]<DType>() {});
}

// Blocks per SM: as many as fit, at most XPERT_STACK_BLOCKS (default 1).
int blocks_per_sm() {
  static const int n = [] {
    const char* e = std::getenv("XPERT_STACK_BLOCKS");
    const int v = e ? std::atoi(e) : 0;
    return v >= 1 && v <= 8 ? v : 1;
  }();
  return n;
}

// XPERT_STACK_PROFILE=1 (with XPERT_GRAPHS=0): each phase's mean time over the layers, every 32 steps.
void report_profile(const unsigned long long* prof_dev, int n_layer, int grid, cudaStream_t stream) {
  static std::vector<unsigned long long> t;
  static double sum[kPhases] = {};
  static int calls = 0;
  t.resize((size_t)kPhases * n_layer);
  XPERT_CUDA_CHECK(cudaStreamSynchronize(stream));
  XPERT_CUDA_CHECK(cudaMemcpy(t.data(), prof_dev, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  // Each entry: a point and the point before it (phase boundaries 0..7; inside A: 12, 13; E: 8, 9; F: 10,
  // 11).
  static const int from[kPhases] = {0, 13, 1, 2, 3, 4, 9, 11, 5, 8, 6, 10, 0, 12};
  static const int order[] = {12, 13, 1, 2, 3, 4, 5, 8, 9, 6, 10, 11, 7};
  static const char* names[kPhases] = {"",          "A wait", "B attention", "combine", "C o",
                                       "D router",  "E wait", "F wait",      "E route", "E rows",
                                       "F convert", "F rows", "A norm",      "A rows"};
  for (int il = 0; il < n_layer; ++il)
    for (int ph = 1; ph < kPhases; ++ph)
      sum[ph] += (double)(t[il * kPhases + ph] - t[il * kPhases + from[ph]]) / n_layer;
  if (++calls % 32) return;
  std::fprintf(stderr, "decode stack, grid %d, us per layer:", grid);
  for (int ph : order) std::fprintf(stderr, " %s %.2f", names[ph], sum[ph] / 1e3 / calls);
  std::fprintf(stderr, "\n");
}

}  // namespace

std::string stack_unsupported(const StackShape& s, const StackLayer* layers) {
  const int D = s.head_dim;
  if (s.n_layer < 1) return "no layers";
  if (D != 64 && D != 128 && D != 256) return "head_dim must be 64, 128 or 256";
  if (s.n_rot < 2 || s.n_rot > D || s.n_rot % 2) return "n_rot must be even and at most head_dim";
  if (s.n_head < 1 || s.n_head_kv < 1 || s.n_head % s.n_head_kv) return "heads must group evenly";
  if (s.n_embd % 32 || s.n_ff % 32) return "n_embd and n_ff must be multiples of 32";
  if (s.n_expert < 1 || s.n_expert > kMaxExperts || s.k < 1 || s.k > kMaxSlots || s.k > s.n_expert)
    return "up to 1024 experts, top-k up to 32";
  if (smem_layout(s).total > 110 * 1024) return "the shapes need too much shared memory";
  for (int il = 0; il < s.n_layer; ++il) {
    const StackLayer& L = layers[il];
    for (int32_t t : {L.tq, L.tk, L.tv, L.to, L.tg, L.tu, L.td})
      if (!block_type(t)) return "a matrix is not block-quantized (Q4_0 Q5_0 Q8_0 Q4_K Q5_K Q6_K)";
    const auto whole = [](int32_t t, int64_t k) { return k % dtype_info((DType)t).block_size == 0; };
    const int64_t E = s.n_embd, qd = (int64_t)s.n_head * D;
    if (!whole(L.tq, E) || !whole(L.tk, E) || !whole(L.tv, E) || !whole(L.to, qd) || !whole(L.tg, E) ||
        !whole(L.tu, E) || !whole(L.td, s.n_ff))
      return "a row is not a whole number of its blocks";
    if (!L.attn_norm || !L.ffn_norm || !L.router || !L.gate || !L.up || !L.down || !L.k_cache || !L.v_cache)
      return "a layer lacks a tensor";
  }
  return {};
}

size_t stack_workspace_bytes(const StackShape& s) {
  const size_t qd = (size_t)s.n_head * s.head_dim, kvd = (size_t)s.n_head_kv * s.head_dim;
  return 4 * (qd + 2 * kvd + qd + (size_t)kMaxItems * (s.head_dim + 2) + s.n_expert + (size_t)s.k * s.n_ff) +
         (size_t)s.n_embd + (size_t)s.n_embd / 32 * 8 + 512;
}

void stack_decode(const StackShape& s, const StackLayer* layers, float* x, const int32_t* pos,
                  const int32_t* slot, void* workspace, unsigned* barrier, cudaStream_t stream) {
  const size_t qd = (size_t)s.n_head * s.head_dim, kvd = (size_t)s.n_head_kv * s.head_dim;
  float* f = static_cast<float*>(workspace);
  Work w;
  w.q = f, f += qd;
  w.k = f, f += kvd;
  w.v = f, f += kvd;
  w.att = f, f += qd;
  w.part = f, f += (size_t)kMaxItems * (s.head_dim + 2);
  w.logits = f, f += s.n_expert;
  w.h = f, f += (size_t)s.k * s.n_ff;
  const auto up16 = [](void* q) { return reinterpret_cast<char*>(((uintptr_t)q + 15) & ~(uintptr_t)15); };
  w.xds = reinterpret_cast<float2*>(up16(f));
  w.xq = reinterpret_cast<int8_t*>(up16(w.xds + s.n_embd / 32));
  static const bool profile = [] {
    const char* e = std::getenv("XPERT_STACK_PROFILE");
    return e && std::string(e) == "1";
  }();
  static unsigned long long* prof_dev = nullptr;  // a measurement knob's buffer, kept for the process
  static int prof_layers = 0;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  XPERT_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  const bool prof_now = profile && cap == cudaStreamCaptureStatusNone;
  if (prof_now && prof_layers < s.n_layer) {
    if (prof_dev) XPERT_CUDA_CHECK(cudaFree(prof_dev));
    XPERT_CUDA_CHECK(cudaMalloc(&prof_dev, sizeof(unsigned long long) * kPhases * s.n_layer));
    prof_layers = s.n_layer;
  }
  static const int extra = [] {
    const char* e = std::getenv("XPERT_STACK_BARRIERS");
    return e ? std::atoi(e) : 0;
  }();
  const Params p{s, layers, x, pos, slot, w, barrier, extra, prof_now ? prof_dev : nullptr};
  const size_t smem = smem_layout(s).total;
  int dev = 0, sms = 0, fit = 0;
  XPERT_CUDA_CHECK(cudaGetDevice(&dev));
  XPERT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (smem > 48 * 1024)
    XPERT_CUDA_CHECK(
        cudaFuncSetAttribute(stack_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  XPERT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, stack_kernel, kThreads, smem));
  if (fit < 1) fail_cat("CUDA decode stack: the kernel does not fit on an SM");
  const int grid = sms * std::min(fit, blocks_per_sm());
  XPERT_CUDA_CHECK(cudaMemsetAsync(barrier, 0, sizeof(unsigned), stream));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  XPERT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, stack_kernel, p));
  XPERT_CUDA_CHECK_LAUNCH();
  if (prof_now) report_profile(prof_dev, s.n_layer, grid, stream);
}

}  // namespace xpert::cuda
