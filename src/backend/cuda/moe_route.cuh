// Routing one token with a whole block (moe.h's semantics), for the fused decode router (moe_router.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/uniform_routing.h"

namespace xpert::cuda {

// Shared memory route_token_block needs, in floats: the E logits (rounded up for the doubles after them),
// a double per warp, and 32 ids and 32 values; with kTwoPhase also an id and a value per candidate
// (route_candidates).
__host__ __device__ constexpr int route_block_floats(int E, int threads) {
  return ((E + 1) & ~1) + 2 * (threads / 32) + 2 * 32;
}
__host__ __device__ constexpr int route_candidates(int E, int k) { return E / 32 * k; }
__host__ __device__ constexpr int route_two_phase_floats(int E, int threads, int k) {
  return route_block_floats(E, threads) + 2 * route_candidates(E, k);
}
// The two-phase ranking takes E a multiple of 32, at most one expert a thread, k <= 32.
__host__ __device__ constexpr bool route_two_phase_fits(int E, int threads, int k) {
  return E % 32 == 0 && E <= threads && k <= 32;
}

// Ranks n values (ids id(c), values v(c)) among themselves, 4 threads a value, and puts the k best in
// rank order into top_id / top_v. A value's rank: the values above it, or equal at a lower id (the loop of
// route_token_block's one-phase form, with ids that are not the positions).
template <int kThreads, class Id, class Val>
__device__ inline void rank_top_k(int n, int k, Id id, Val v, int32_t* top_id, float* top_v) {
  const int lane = threadIdx.x & 31;
  for (int base = threadIdx.x & ~31; base < 4 * n; base += kThreads) {  // warp-uniform trip count
    const int i = base + lane, c = i / 4;
    int rank = 0;
    const float vc = c < n ? v(c) : 0.0f;
    const int idc = c < n ? id(c) : 0;
    if (c < n)
      for (int o = i & 3; o < n; o += 4) {
        const float u = v(o);
        rank += u > vc || (u == vc && id(o) < idc);
      }
    rank += __shfl_xor_sync(0xffffffffu, rank, 1);
    rank += __shfl_xor_sync(0xffffffffu, rank, 2);
    if (c < n && (i & 3) == 0 && rank < k) {
      top_id[rank] = idc;
      top_v[rank] = vc;
    }
  }
}

// One token routed by the whole block (router_kernel's last block):
// route_token's result, without its serial top-k. Each expert's rank (the experts above it: a higher logit,
// or an equal one at a lower index) is counted by 4 threads, so the k largest fall into place at once; the
// softmax sum is a double block sum. smem: route_block_floats(E, kThreads) floats. Every thread of the block
// calls it. kTwoPhase (route_two_phase_fits; smem route_two_phase_floats): each warp of 32 experts first
// ranks them among themselves (32 comparisons a thread) and keeps its k best; only those E / 32 * k
// candidates are then ranked among each other. The k best of all are among them, ranked the same way, so
// the result is the same; the comparisons a thread makes drop from E * E / kThreads to 32 plus a quarter
// of the candidates (256 experts, top 8, 256 threads: 256 -> 48), so 256 experts need not fall back to the
// warp's serial top-k.
// seed: RouterParams::uniform_seed (0: the logits as they are).
template <int kThreads, bool kTwoPhase = false>
__device__ inline void route_token_block(const float* src, float* smem, int E, int k, bool norm, float scale,
                                         uint32_t seed, int32_t* __restrict__ ids, float* __restrict__ weights) {
  constexpr int kW = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  float* l = smem;
  double* red = reinterpret_cast<double*>(smem + ((E + 1) & ~1));
  int32_t* top_id = reinterpret_cast<int32_t*>(red + kW);
  float* top_v = reinterpret_cast<float*>(top_id + 32);
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += kThreads) {
    const float v = __ldcg(src + e);
    mx = fmaxf(mx, l[e] = seed ? uniform_route_score(v, e, seed) : v);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = (float)red[0];
  for (int i = 1; i < kW; ++i) mx = fmaxf(mx, (float)red[i]);
  double sum = 0;  // as ggml: exp(x - max) summed in double
  for (int e = threadIdx.x; e < E; e += kThreads) sum += (double)expf(l[e] - mx);
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if constexpr (kTwoPhase) {
    int32_t* cand_id = reinterpret_cast<int32_t*>(top_v + 32);
    float* cand_v = reinterpret_cast<float*>(cand_id + route_candidates(E, k));
    const int e = threadIdx.x;  // E % 32 == 0: whole warps of experts, the warps past E / 32 sit out
    if (e < E) {
      const float v = l[e];
      int rank = 0;
      for (int o = 0; o < 32; ++o) {
        const float u = l[(e & ~31) + o];
        rank += u > v || (u == v && o < lane);
      }
      if (rank < k) {
        cand_id[e / 32 * k + rank] = e;
        cand_v[e / 32 * k + rank] = v;
      }
    }
    __syncthreads();
    rank_top_k<kThreads>(
        route_candidates(E, k), k, [&](int c) { return (int)cand_id[c]; }, [&](int c) { return cand_v[c]; },
        top_id, top_v);
  } else {
    for (int base = threadIdx.x & ~31; base < 4 * E; base += kThreads) {  // warp-uniform trip count
      const int i = base + lane, e = i / 4;
      int rank = 0;
      const float v = e < E ? l[e] : 0.0f;
      if (e < E)
        for (int o = i & 3; o < E; o += 4) {
          const float u = l[o];
          rank += u > v || (u == v && o < e);
        }
      rank += __shfl_xor_sync(0xffffffffu, rank, 1);
      rank += __shfl_xor_sync(0xffffffffu, rank, 2);
      if (e < E && (i & 3) == 0 && rank < k) {
        top_id[rank] = e;
        top_v[rank] = v;
      }
    }
  }
  __syncthreads();  // every warp has read red[] (the max) and ranked
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  if (warp != 0) return;
  double tot = 0;
  for (int i = 0; i < kW; ++i) tot += red[i];
  const float inv = (float)(1.0 / tot);
  const float p = lane < k ? expf(top_v[lane] - mx) * inv : 0.0f;
  double wsum = lane < k ? (double)p : 0.0;
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
  if (lane < k) {
    float w = p;
    if (norm)
      w /= fmaxf((float)wsum, 6.103515625e-5f);  // llama.cpp clamps the sum to the smallest f16 normal
    if (scale != 0.0f && scale != 1.0f) w *= scale;
    ids[lane] = top_id[lane];
    weights[lane] = w;
  }
}

}  // namespace xpert::cuda
