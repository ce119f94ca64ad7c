// Routing one token with a whole block (moe.h's semantics), shared by the fused decode router (moe.cu) and
// the persistent decode kernel (decode_stack.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace xpert::cuda {

// Shared memory route_token_block needs, in floats: the E logits (rounded up for the doubles after them),
// a double per warp, and 32 ids and 32 values.
__host__ __device__ constexpr int route_block_floats(int E, int threads) {
  return ((E + 1) & ~1) + 2 * (threads / 32) + 2 * 32;
}

// One token routed by the whole block (router_kernel's last block; every block of the decode stack):
// route_token's result, without its serial top-k. Each expert's rank (the experts above it: a higher logit,
// or an equal one at a lower index) is counted by 4 threads, so the k largest fall into place at once; the
// softmax sum is a double block sum. smem: route_block_floats(E, kThreads) floats. Every thread of the block
// calls it.
template <int kThreads>
__device__ inline void route_token_block(const float* src, float* smem, int E, int k, bool norm, float scale,
                                         int32_t* __restrict__ ids, float* __restrict__ weights) {
  constexpr int kW = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  float* l = smem;
  double* red = reinterpret_cast<double*>(smem + ((E + 1) & ~1));
  int32_t* top_id = reinterpret_cast<int32_t*>(red + kW);
  float* top_v = reinterpret_cast<float*>(top_id + 32);
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += kThreads) mx = fmaxf(mx, l[e] = __ldcg(src + e));
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = (float)red[0];
  for (int i = 1; i < kW; ++i) mx = fmaxf(mx, (float)red[i]);
  double sum = 0;  // as ggml: exp(x - max) summed in double
  for (int e = threadIdx.x; e < E; e += kThreads) sum += (double)expf(l[e] - mx);
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
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
