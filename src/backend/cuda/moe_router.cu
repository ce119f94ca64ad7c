// CUDA MoE routing (see moe.h): a warp's top k per token from given logits, and the fused decode router
// (the router product and the routing in one launch).
#include <algorithm>
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/q8_1.cuh"
#include "backend/cuda/sigmoid.cuh"

namespace xpert::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;

// ------------------------------------------------------------------------------------------ routing
// One warp routes one token: src = its E logits, l = E floats of shared memory. The top k is chosen on the
// logits (softmax is monotonic), largest first, ties to the lower expert; chosen entries are marked NaN,
// which never compares greater.
// seed: RouterParams::uniform_seed (0: the logits as they are).
__device__ void route_token(const float* src, float* l, int E, int k, bool norm, float scale, uint32_t seed,
                            int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) {
    float v = __ldcg(src + e);  // may be another block's fresh output (moe_router_kernel)
    if (seed) v = uniform_route_score(v, e, seed);
    l[e] = v;
    mx = fmaxf(mx, v);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
  double sum = 0;  // as ggml: exp(x - max) summed in double
  for (int e = lane; e < E; e += 32) sum += (double)expf(l[e] - mx);
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(kFull, sum, off);
  const float inv = (float)(1.0 / sum);
  __syncwarp();

  int my_id = 0;
  float my_p = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = l[e];
      if (v > bv || (v == bv && e < bi)) bv = v, bi = e;
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, off);
      const int oi = __shfl_xor_sync(kFull, bi, off);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == j) {
      my_id = bi < E ? bi : 0;
      my_p = bi < E ? expf(bv - mx) * inv : 0.0f;
    }
    if (bi < E && lane == (bi & 31)) l[bi] = NAN;
    __syncwarp();
  }
  double wsum = lane < k ? (double)my_p : 0.0;
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(kFull, wsum, off);
  if (lane < k) {
    float w = my_p;
    if (norm)
      w /= fmaxf((float)wsum, 6.103515625e-5f);  // llama.cpp clamps the sum to the smallest f16 normal
    if (scale != 0.0f && scale != 1.0f) w *= scale;
    ids[lane] = my_id;
    weights[lane] = w;
  }
}

__global__ void route_kernel(const float* __restrict__ logits, int64_t n, int E, int k, bool norm,
                             float scale, uint32_t seed, int32_t* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x / 32;
  const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + warp;
  if (t >= n) return;
  route_token(logits + t * E, route_smem + warp * E, E, k, norm, scale, seed, ids + t * k, weights + t * k);
}

// Decode router in one launch: block e computes expert e's logit for every token (its f32 row read once,
// sums in a fixed order), and the last block to finish routes the tokens (a warp each). `done` counts the
// finished blocks and is reset by the last one, so the launch can be replayed from a graph. With a shared
// expert (sg), block E computes its gate instead and fills slot k of each token (id E); `slots` is the
// row length of ids and weights (k, or k + 1).
constexpr int kRouterThreads = 256;

// RouterNorm's y for thread t's two float4 of a row of 1024 < n <= 2048 (elements 4t.. and 1024 + 4t..):
// thread t holds add_rmsnorm_q8's long-row kernel's threads 4t .. 4t + 3, whose sums wide_row_sumsq
// reproduces (norm_row.cuh); then the same scale and the same products. red: 32 doubles of shared memory.
__device__ __forceinline__ void norm_in_router(const float4 (&res)[2], const float4 (&d)[2],
                                               const float4 (&w)[2], int n, float eps, double* red,
                                               float4 (&y)[2]) {
  float v[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {  // res + d: zeros past the row, whose squares add +0.0 (nothing)
    v[j][0] = res[j].x + d[j].x, v[j][1] = res[j].y + d[j].y;
    v[j][2] = res[j].z + d[j].z, v[j][3] = res[j].w + d[j].w;
  }
  const double sum = wide_row_sumsq<4>(v, red);
  const float mean = (float)(sum / (double)n);
  const float sc = 1.0f / sqrtf(mean + eps);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    y[j].x = __fmul_rn(__fmul_rn(v[j][0], sc), w[j].x), y[j].y = __fmul_rn(__fmul_rn(v[j][1], sc), w[j].y);
    y[j].z = __fmul_rn(__fmul_rn(v[j][2], sc), w[j].z), y[j].w = __fmul_rn(__fmul_rn(v[j][3], sc), w[j].w);
  }
}

// Decode router in one launch: block e computes expert e's logit for every token (its f32 row read once,
// sums in a fixed order), and the last block to finish routes the tokens (a warp each). `done` counts the
// finished blocks and is reset by the last one, so the launch can be replayed from a graph. With a shared
// expert (sg), block E computes its gate instead and fills slot k of each token (id E); `slots` is the
// row length of ids and weights (k, or k + 1). kNorm (one token, RouterNorm): x is computed, not read.
template <bool kNorm>
__global__ void __launch_bounds__(kRouterThreads)
    router_kernel(const float* __restrict__ w, const float* __restrict__ sg, const float* __restrict__ x,
                  int n, int D, int E, int k, int slots, bool norm, float scale, uint32_t seed,
                  float* __restrict__ logits,
                  int32_t* __restrict__ ids, float* __restrict__ weights, unsigned* __restrict__ done,
                  bool prefetch, int route_form, RouterNorm nm) {
  const int e = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const float* row = e < E ? w + (int64_t)e * D : sg;
  if (prefetch && threadIdx.x == 0) prefetch_l2(row, (size_t)D * sizeof(float));
  // The row's first kPre float4 of this thread in registers before the wait (no kernel writes it).
  constexpr int kPre = 2;
  const float4* wr = reinterpret_cast<const float4*>(row);
  float4 pre[kPre];
#pragma unroll
  for (int j = 0; j < kPre; ++j) {
    const int i = threadIdx.x + j * kRouterThreads;
    pre[j] = i < D / 4 ? __ldg(wr + i) : make_float4(0, 0, 0, 0);
  }
  // kNorm: the residual and the norm's weights before the wait too. The residual was last written two
  // kernels back (the layer's previous experts), and the kernel right before let this one launch only after
  // its own wait, so it is final and visible (read past L1).
  float4 res[kPre], nw[kPre];
  if constexpr (kNorm) {
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      const int i = threadIdx.x + j * kRouterThreads;
      res[j] = i < D / 4 ? __ldcg(reinterpret_cast<const float4*>(nm.res) + i) : make_float4(0, 0, 0, 0);
      nw[j] = i < D / 4 ? __ldg(reinterpret_cast<const float4*>(nm.w) + i) : make_float4(0, 0, 0, 0);
    }
  }
  pdl_begin();
  extern __shared__ float router_smem[];  // [n][E] for the routing; [8 warps][kMoeDecodeMaxTokens] first
  float acc[kMoeDecodeMaxTokens];
#pragma unroll
  for (int t = 0; t < kMoeDecodeMaxTokens; ++t) acc[t] = 0.0f;
  auto fma4 = [](const float4& a, const float4& b, float c) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, c))));
  };
  __shared__ float4 ys[kNorm ? 512 : 1];  // kNorm: y, for the q8_1 blocks
  if constexpr (kNorm) {
    __shared__ double nred[32];
    float4 dv[kPre], yv[kPre];
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      const int i = threadIdx.x + j * kRouterThreads;
      if (nm.parts) {  // sum_parts' order: ((p0 + p1) + p2) + ..., four parts' loads at a time
        float4 v = make_float4(0, 0, 0, 0);
#pragma unroll
        for (int k0 = 0; k0 < kMaxRouterParts; k0 += 4) {
          float4 pv[4];
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (k0 + k < nm.n_parts && i < D / 4)
              pv[k] = reinterpret_cast<const float4*>(nm.parts + (int64_t)(k0 + k) * D)[i];
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (k0 + k < nm.n_parts && i < D / 4) {
              if (k0 + k == 0) {
                v = pv[k];
              } else {
                v.x += pv[k].x, v.y += pv[k].y;
                v.z += pv[k].z, v.w += pv[k].w;
              }
            }
        }
        dv[j] = v;
        if (e == 0 && i < D / 4) reinterpret_cast<float4*>(const_cast<float*>(nm.d))[i] = v;
      } else {
        dv[j] = i < D / 4 ? reinterpret_cast<const float4*>(nm.d)[i] : make_float4(0, 0, 0, 0);
      }
    }
    norm_in_router(res, dv, nw, D, nm.eps, nred, yv);
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      const int i = threadIdx.x + j * kRouterThreads;
      if (i < D / 4) {
        ys[i] = yv[j];
        acc[0] = fma4(pre[j], yv[j], acc[0]);  // router_kernel<false>'s mac for token 0: the same logit
      }
    }
  } else {
    auto mac = [&](const float4& a, int i) {  // row chunk i against every token's x
#pragma unroll
      for (int t = 0; t < kMoeDecodeMaxTokens; ++t)
        if (t < n) acc[t] = fma4(a, *(reinterpret_cast<const float4*>(x + (int64_t)t * D) + i), acc[t]);
    };
#pragma unroll
    for (int j = 0; j < kPre; ++j)
      if (threadIdx.x + j * kRouterThreads < D / 4) mac(pre[j], threadIdx.x + j * kRouterThreads);
    for (int i = threadIdx.x + kPre * kRouterThreads; i < D / 4; i += kRouterThreads) mac(__ldg(wr + i), i);
  }
  float* red = router_smem;
#pragma unroll
  for (int t = 0; t < kMoeDecodeMaxTokens; ++t) {
    if (t >= n) break;
    float v = acc[t];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
    if (lane == 0) red[warp * kMoeDecodeMaxTokens + t] = v;
  }
  __syncthreads();
  if constexpr (kNorm) {
    if (warp == 1) {  // this block's share of y and its q8_1 blocks (warp 0 takes the logit)
      const float* yf = reinterpret_cast<const float*>(ys);
      for (int qb = e; qb < D / 32; qb += gridDim.x) {
        const float v = yf[qb * 32 + lane];
        nm.y[qb * 32 + lane] = v;
        warp_quantize_q8_1(v, nm.q + qb * 32 + lane, nm.ds + qb);
      }
    }
  }
  if (threadIdx.x < n) {
    float v = 0.0f;
    for (int i = 0; i < kRouterThreads / 32; ++i) v += red[i * kMoeDecodeMaxTokens + threadIdx.x];
    if (e < E) {
      logits[(int64_t)threadIdx.x * E + e] = v;
    } else {  // the shared expert's slot
      ids[(int64_t)threadIdx.x * slots + k] = E;
      weights[(int64_t)threadIdx.x * slots + k] = sigmoidf(v);
    }
    __threadfence();  // visible to the last block before it counts this one
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) *done = 0;  // read by no thread of this launch past this point
  if (n == 1 && route_form == (int)RouteForm::two_phase && route_two_phase_fits(E, kRouterThreads, k)) {
    route_token_block<kRouterThreads, true>(logits, router_smem, E, k, norm, scale, seed, ids, weights);
  } else if (n == 1 && route_form != (int)RouteForm::warp &&
             E * E <= 64 * kRouterThreads) {  // at most 64 comparisons a thread
    route_token_block<kRouterThreads>(logits, router_smem, E, k, norm, scale, seed, ids, weights);
  } else if (warp < n) {
    route_token(logits + (int64_t)warp * E, router_smem + warp * E, E, k, norm, scale, seed, ids + warp * slots,
                weights + warp * slots);
  }
}

}  // namespace

void moe_route(const float* logits, int64_t n_tokens, const MoeRouting& r, int32_t* ids, float* weights,
               cudaStream_t stream) {
  if (r.n_expert < 1 || r.n_expert > 1024 || r.k < 1 || r.k > 32 || r.k > r.n_expert)
    fail_cat("CUDA moe_route: ", r.n_expert, " experts, top ", r.k,
             " (supported: up to 1024 experts, k <= 32)");
  if (n_tokens == 0) return;
  constexpr int kWarps = 4;
  const size_t smem = (size_t)kWarps * r.n_expert * sizeof(float);
  launch_pdl(route_kernel, (unsigned)((n_tokens + kWarps - 1) / kWarps), kWarps * 32, smem, stream, logits,
             n_tokens, (int)r.n_expert, (int)r.k, r.norm_weights, r.weights_scale, r.uniform_seed, ids, weights);
  XPERT_CUDA_CHECK_LAUNCH();
}

bool moe_router_fusable(DType w_type, int64_t n_tokens, int64_t n_embd, const MoeRouting& r) {
  return w_type == DType::F32 && n_tokens >= 1 && n_tokens <= kMoeDecodeMaxTokens && n_embd % 4 == 0 &&
         r.n_expert >= 1 && r.n_expert <= 1024 && r.k >= 1 && r.k <= 32 && r.k <= r.n_expert;
}

// RouteForm::automatic: one decode token's top-k by the router's whole last block in two phases
// (route_token_block<.., true>) wherever it fits. The other forms, asked for by name (tests): block, the
// one-phase block ranking where it counts at most 64 ranks a thread (up to 128 experts), else one warp;
// warp, one warp (route_token) always. H200 tg128 in one call (XPERT_BLOCK_ROUTE, since removed):
// one-phase block / warp, qwen3-30b-a3b (128 experts) 391 / 377 and 397 / 384 t/s, qwen3.5-35b-a3b (256
// ranks a thread) 340 / 349; two-phase / one-phase (2026-12-01), qwen3-30b-a3b 458.0 / 457.3 and 461.5 /
// 457.2, qwen3.5-35b-a3b (two-phase / warp) 411.2 / 404.9 and 422.5 / 403.3. A form as one thread block
// cluster (blocks of 8 experts gathering their logits in one block's distributed shared memory, one
// cluster barrier, no counter): +1.4 % on qwen3-30b-a3b with gate/up at one CTA a span, 1.5-2.5 % slower
// with its clusters of two (2026-12-01), so removed.
void moe_router(const float* w, const float* x, int64_t n_tokens, int64_t n_embd, const MoeRouting& r,
                float* logits, int32_t* ids, float* weights, unsigned* done, cudaStream_t stream,
                const float* shared_gate, RouteForm form, const RouterNorm* norm) {
  if (form == RouteForm::automatic) form = RouteForm::two_phase;
  if (norm) {
    if (!long_row_norm_fits(n_tokens, n_embd))
      fail_cat("CUDA moe_router: the norm inside the router takes one token of 1024 < n_embd <= 2048, got ",
               n_tokens, " of ", n_embd);
    if (norm->parts && (norm->n_parts < 1 || norm->n_parts > kMaxRouterParts))
      fail_cat("CUDA moe_router: d in ", norm->n_parts, " parts (supported: 1 to ", kMaxRouterParts, ")");
  }
  if (!moe_router_fusable(DType::F32, n_tokens, n_embd, r) || (shared_gate && r.k + 1 > 32))
    fail_cat("CUDA moe_router: ", n_tokens, " tokens of ", n_embd, ", ", r.n_expert, " experts, top ", r.k,
             shared_gate ? " + a shared expert" : "", " (supported: up to ", kMoeDecodeMaxTokens,
             " tokens, n_embd % 4 == 0, 1024 experts, 32 slots)");
  // The routing's scratch: [n][E] floats (route_token), or for one token route_token_block's.
  const size_t one = (size_t)route_two_phase_floats((int)r.n_expert, kRouterThreads, (int)r.k);
  const size_t smem =
      std::max({(size_t)n_tokens * r.n_expert, (size_t)(kRouterThreads / 32) * kMoeDecodeMaxTokens, one}) *
      sizeof(float);
  const int slots = (int)r.k + (shared_gate ? 1 : 0);
  launch_pdl(norm ? router_kernel<true> : router_kernel<false>,
             (unsigned)(r.n_expert + (shared_gate ? 1 : 0)), kRouterThreads, smem, stream, w, shared_gate,
             norm ? norm->y : x, (int)n_tokens, (int)n_embd, (int)r.n_expert, (int)r.k, slots, r.norm_weights,
             r.weights_scale, r.uniform_seed, logits, ids, weights, done, detail::prefetch_enabled(), (int)form,
             norm ? *norm : RouterNorm{});
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace xpert::cuda
