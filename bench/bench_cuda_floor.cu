// The fixed costs a decode step pays whatever its kernels do (GPU machine): ./build/bench/bench_cuda_floor
//   chain:   a CUDA graph of kKernels launches, each block's thread 0 reading what the kernel before wrote
//            and writing its own slot, plain or with programmatic dependent launch (PDL, as launch_pdl);
//            the time a launch adds to a step when it does (almost) nothing.
//   barrier: one persistent grid (a block an SM, cooperative launch) crossing kKernels grid-wide barriers
//            (one counter, thread 0 of each block arriving with atomicAdd and spinning on an acquire load),
//            each followed by a read of what another block wrote before it: the floor of a phase of the
//            persistent decode kernel.
//   stream:  what a MoE gate/up launch reads after its wait, idealized: a one-block kernel writes 8 expert
//            ids, then 192 blocks of 512 threads each read their two 36 KB spans of those experts' 884 KB
//            matrices (14.2 MB, from DRAM: 16 launches in a row touch 226 MB) with every thread's loads
//            coalesced, several ways; the time of the pair less the same pair with an empty second kernel.
//            The floor of the gate/up kernel once its experts are known. Then the same bytes in 2x and 4x
//            as many, smaller blocks: whether the SMs that get two of the 192 blocks set the time.
//   hops:    a chain of 132-block launches, each block's thread 0 reading the word the launch before wrote,
//            then making d loads one after another, each address from the value before, in a 113 MB buffer
//            (twice L2: about half the loads go to DRAM) or a 4 MB one (L2): the slope in d is one
//            dependent round trip inside a decode graph.
//   norm:    a chain of launches each reading the 2048 floats the launch before wrote, summing their squares
//            across the block (shuffles, shared memory, a barrier) and writing its slice of them scaled, as
//            a decode norm does: its time less the chain floor is what a norm's chain costs by itself.
//            Then the model's own norm (ops.h add_rmsnorm_q8 on a row of 2048) in a chain of itself, with and
//            without its residual add and its q8_1 output: what of the norm's time in a decode step is its
//            own body.
//   q6k:     a one-row product with Q6_K weights as the file stores them (210-byte blocks, 2-byte aligned,
//            each 16-byte piece from five 4-byte loads) against the device layout (weight_layout.h: field
//            by field, each piece one aligned load; dev::row_at), the same arithmetic (dev::Dot<Q6_K>::mul):
//            what the blocks' alignment costs the decode dot; and the device layout with each lane's two
//            chunks' loads in flight at once (dev::dot_row batch 2; measured slower, 2026-12-01). An output
//            head's shape and MoE down rows'.
//   attn:    the decode attention (attention.h) in a chain of itself at a few depths, Qwen3's heads (32 / 4,
//            head_dim 128) and Qwen3.5's (16 / 2, 256, gated, q and gate interleaved), f16 cache, q8_1 out:
//            split over the GPU with its combine launch against one block per KV head (one_block). Long
//            depths and bandwidth: bench_cuda_attention.
//   cluster: thread block clusters (sm_90): how many clusters of 2..16 blocks can be resident at once with
//   one
//            or two blocks an SM (cudaOccupancyMaxActiveClusters), and one hand-off inside a cluster: every
//            block's thread 0 writing the next block's shared memory (distributed shared memory), one
//            cluster barrier, then reading its own, kHops times in one launch: the cost of a fused kernel's
//            phase boundary that stays inside a cluster, beside the chain's and the grid barrier's. Then how
//            a few clusters of 8 or 16 blocks of two-an-SM size spread over the SMs (%smid): whether a fused
//            kernel's clusters get an SM a block.
// Each figure is the best of kReplays replays, in microseconds per launch, per barrier or per pair.
// Arguments: the sections to run (default all).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/ops.h"

namespace {

constexpr int kKernels = 1000;
constexpr int kReplays = 5;

#define CHECK(x)                                                                               \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

__global__ void chain_kernel(int* slots, int i, bool pdl) {
  if (pdl) xpert::cuda::pdl_begin();
  if (threadIdx.x == 0) {
    const int v = __ldcg(slots + (size_t)i * gridDim.x + (blockIdx.x + 1) % gridDim.x);
    slots[(size_t)(i + 1) * gridDim.x + blockIdx.x] = v + 1;
  }
}

__device__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void barrier_kernel(unsigned* count, int* slots, int n) {
  int v = 0;
  for (int i = 0; i < n; ++i) {
    if (threadIdx.x == 0) {
      slots[(size_t)i * gridDim.x + blockIdx.x] = v + 1;
      __threadfence();
      atomicAdd(count, 1u);
      const unsigned target = (unsigned)(i + 1) * gridDim.x;
      while (ld_acquire(count) < target) {
      }
      v = __ldcg(slots + (size_t)i * gridDim.x + (blockIdx.x + 1) % gridDim.x);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && v < 0) slots[0] = v;  // keeps the reads
}

float time_graph(cudaGraphExec_t exec, cudaStream_t s) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r < kReplays; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return best * 1000.0f / kKernels;
}

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, bool pdl, cudaStream_t s, A... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// A graph of body(i) for i < kKernels, timed: microseconds per i.
template <class F>
float graph_us(cudaStream_t s, F&& body) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kKernels; ++i) body(i);
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaGraphLaunch(exec, s));  // warm-up
  CHECK(cudaStreamSynchronize(s));
  const float us = time_graph(exec, s);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  return us;
}

float chain(int blocks, int threads, bool pdl, int* slots, cudaStream_t s) {
  return graph_us(s, [&](int i) { launch(chain_kernel, blocks, threads, 0, pdl, s, slots, i, pdl); });
}

// ----------------------------------------------------------------------------------------- cluster
constexpr int kHops = 10000;

// kHops hand-offs around each cluster's ring of blocks (double-buffered slots: a write of hop i + 1 lands in
// the slot its reader emptied before the barrier of hop i).
__global__ void cluster_hop_kernel(int* out, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  __shared__ int slot[2];
  const unsigned rank = cl.block_rank(), size = cl.num_blocks();
  int v = (int)rank;
  if (threadIdx.x == 0) slot[0] = slot[1] = 0;
  cl.sync();
  for (int i = 0; i < n; ++i) {
    if (threadIdx.x == 0) cl.map_shared_rank(slot, (rank + 1) % size)[i & 1] = v + 1;
    cl.sync();
    if (threadIdx.x == 0) v = slot[i & 1];
  }
  cl.sync();  // no block leaves while another may still write its shared memory
  if (threadIdx.x == 0) out[blockIdx.x] = v;
#endif
}

// Where each block ran: its SM's id.
__global__ void cluster_where_kernel(int* sm) {
  if (threadIdx.x == 0) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = (int)id;
  }
}

cudaLaunchConfig_t cluster_config(int blocks, int threads, int size, size_t smem, cudaLaunchAttribute* attr,
                                  cudaStream_t s) {
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)size;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters of `size` blocks that can be resident at once, each block `threads` threads with `smem` bytes of
// dynamic shared memory (a block an SM or two, as a fused kernel's blocks would be).
int max_clusters(int size, int threads, size_t smem, cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(size, threads, size, smem, attr, s);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, cluster_hop_kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return n;
}

// Microseconds a hop: one launch of `clusters` clusters of `size` blocks doing kHops hops.
float cluster_hop_us(int clusters, int size, int threads, size_t smem, int* out, cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(clusters * size, threads, size, smem, attr, s);
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r <= kReplays; ++r) {  // the first is a warm-up
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaLaunchKernelEx(&cfg, cluster_hop_kernel, out, kHops));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) best = std::min(best, ms);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return best * 1000.0f / kHops;
}

// How `clusters` clusters of `size` blocks with `smem` bytes each spread over the SMs: the SMs used and the
// most blocks on one.
std::pair<int, int> cluster_spread(int clusters, int size, size_t smem, int* sm, cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(clusters * size, 512, size, smem, attr, s);
  CHECK(cudaLaunchKernelEx(&cfg, cluster_where_kernel, sm));
  CHECK(cudaStreamSynchronize(s));
  std::vector<int> ids(clusters * size);
  CHECK(cudaMemcpy(ids.data(), sm, ids.size() * sizeof(int), cudaMemcpyDeviceToHost));
  std::vector<int> per(1024, 0);
  int used = 0, most = 0;
  for (int id : ids) {
    if (id < 0 || id >= 1024) continue;
    used += per[id]++ == 0;
    most = std::max(most, per[id]);
  }
  return {used, most};
}

// ------------------------------------------------------------------------------------------ stream
constexpr int kExperts = 128, kUsed = 8, kSpans = 24;  // qwen3-30b-a3b: 768 rows = 24 spans of 32
constexpr size_t kRowBytes = 1152;                     // 2048 Q4_K weights
constexpr size_t kSpan = 32 * kRowBytes, kExpertBytes = kSpans * kSpan;
constexpr int kStreamThreads = 512;
constexpr int kPerThread = (int)(2 * kSpan / 16 / kStreamThreads);  // 16-byte loads a thread: 9

// PDL's wait and trigger on sm_90+, nothing on older GPUs (launch.cuh).
__device__ void wait_then_trigger() { xpert::cuda::pdl_begin(); }

// Step i's experts: (8 i + 17 j) mod 128, all different within 16 consecutive steps.
__global__ void route_stub(int* ids, int i) {
  wait_then_trigger();
  if (threadIdx.x < kUsed) ids[threadIdx.x] = (i * kUsed + (int)threadIdx.x * 17) % kExperts;
}

__global__ void empty_stream(const uint8_t*, const uint8_t*, const int*, unsigned*) { wait_then_trigger(); }

// kMode 0: kDepth loads in flight a thread; 1: the same after thread 0 bulk-prefetched both spans into L2;
// 2: both spans into shared memory by cp.async, then read there.
template <int kMode, int kDepth>
__global__ void __launch_bounds__(kStreamThreads)
    stream_kernel(const uint8_t* gate, const uint8_t* up, const int* ids, unsigned* out) {
  extern __shared__ uint4 staged[];
  wait_then_trigger();
  const int e = ids[blockIdx.y];
  const uint8_t* g = gate + e * kExpertBytes + blockIdx.x * kSpan;
  const uint8_t* u = up + e * kExpertBytes + blockIdx.x * kSpan;
  auto at = [&](int i) {  // 16-byte piece i of the block's 2 spans
    return reinterpret_cast<const uint4*>(i < (int)(kSpan / 16) ? g + 16 * (size_t)i
                                                                : u + 16 * (size_t)i - kSpan);
  };
  unsigned acc = 0;
  if constexpr (kMode == 2) {
    for (int i = threadIdx.x; i < (int)(2 * kSpan / 16); i += kStreamThreads) {
      const uint32_t d = (uint32_t)__cvta_generic_to_shared(staged + i);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(at(i)) : "memory");
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    for (int i = threadIdx.x; i < (int)(2 * kSpan / 16); i += kStreamThreads) {
      const uint4 v = staged[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  } else {
    if (kMode == 1 && threadIdx.x == 0) {
      for (const uint8_t* p : {g, u}) xpert::cuda::prefetch_l2(p, kSpan);
    }
    for (int c0 = 0; c0 < kPerThread; c0 += kDepth) {
      uint4 v[kDepth];
#pragma unroll
      for (int k = 0; k < kDepth; ++k)
        if (c0 + k < kPerThread) v[k] = __ldg(at(threadIdx.x + (c0 + k) * kStreamThreads));
#pragma unroll
      for (int k = 0; k < kDepth; ++k)
        if (c0 + k < kPerThread) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
  }
  if (acc == 0x9e3779b9u) out[blockIdx.y * gridDim.x + blockIdx.x] = acc;  // keeps the loads
}

// The same bytes in kSplit times as many blocks of kStreamThreads / kSplit threads, each a kSplit-th of a
// span pair, every load in flight at once: 192 blocks of 512 threads leave 60 of 132 SMs two blocks and
// the rest one, so if an SM's own bandwidth bounds it, the SMs with two set the time; more, smaller blocks
// even that out (the gate/up kernel's blocks are 32 rows, for one q8_1 block of outputs).
template <int kSplit>
__global__ void __launch_bounds__(kStreamThreads / kSplit)
    stream_split_kernel(const uint8_t* gate, const uint8_t* up, const int* ids, unsigned* out) {
  wait_then_trigger();
  const int span = blockIdx.x / kSplit, part = blockIdx.x % kSplit;
  const int e = ids[blockIdx.y];
  const uint8_t* g = gate + e * kExpertBytes + span * kSpan;
  const uint8_t* u = up + e * kExpertBytes + span * kSpan;
  constexpr int kPieces = (int)(2 * kSpan / 16) / kSplit, kThreads = kStreamThreads / kSplit;
  uint4 v[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = part * kPieces + threadIdx.x + k * kThreads;
    v[k] = __ldg(reinterpret_cast<const uint4*>(i < (int)(kSpan / 16) ? g + 16 * (size_t)i
                                                                      : u + 16 * (size_t)i - kSpan));
  }
  unsigned acc = 0;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  if (acc == 0x9e3779b9u) out[blockIdx.y * gridDim.x + blockIdx.x] = acc;  // keeps the loads
}

using StreamKernel = void (*)(const uint8_t*, const uint8_t*, const int*, unsigned*);
float stream_pair(StreamKernel k, size_t smem, const uint8_t* gate, const uint8_t* up, int* ids,
                  unsigned* out, cudaStream_t s, int split = 1) {
  if (smem > 48 * 1024)
    CHECK(cudaFuncSetAttribute((const void*)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  return graph_us(s, [&](int i) {
    launch(route_stub, 1, 32, 0, true, s, ids, i);
    launch(k, dim3(kSpans * split, kUsed), kStreamThreads / split, smem, true, s, gate, up, (const int*)ids,
           out);
  });
}

float barrier(int blocks, int threads, unsigned* count, int* slots, cudaStream_t s) {
  float best = 1e30f;
  for (int r = 0; r < kReplays; ++r) {
    CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    int n = kKernels;
    void* args[] = {&count, &slots, &n};
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaLaunchCooperativeKernel((const void*)barrier_kernel, dim3(blocks), dim3(threads), args, 0, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) best = std::min(best, ms);  // the first is a warm-up
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
  }
  return best * 1000.0f / kKernels;
}

// ------------------------------------------------------------------------------------------ hops, norm
template <int kDeps>
__global__ void hop_kernel(const uint4* big, unsigned n16, const unsigned* in, unsigned* out) {
  wait_then_trigger();
  if (threadIdx.x == 0) {
    unsigned v = __ldcg(in + blockIdx.x) + blockIdx.x * 40503u;  // each block its own addresses
#pragma unroll 1
    for (int d = 0; d < kDeps; ++d) v += __ldcg(big + (v * 2654435761u) % n16).x;
    out[blockIdx.x] = v;
  }
}

template <int kDeps>
float hops(const uint4* big, unsigned n16, unsigned* a, unsigned* b, int blocks, cudaStream_t s) {
  return graph_us(s, [&](int i) {
    launch(hop_kernel<kDeps>, blocks, 32, 0, true, s, (const uint4*)big, n16,
           (const unsigned*)(i % 2 ? b : a), i % 2 ? a : b);
  });
}

constexpr int kNormN = 2048;
// Every block reads all kNormN values of `in`, sums their squares (T: float or double) and writes its slice
// of out = in * rsqrt(mean).
template <class T, int kThreads>
__global__ void __launch_bounds__(kThreads) norm_step_kernel(const float* in, float* out) {
  __shared__ T red[kThreads / 32];
  wait_then_trigger();
  constexpr int kPer = kNormN / kThreads;
  float v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = __ldcg(in + threadIdx.x + j * kThreads);
  T sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum += (T)(v[j] * v[j]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = threadIdx.x % 32 < kThreads / 32 ? red[threadIdx.x % 32] : (T)0;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float scale = rsqrtf((float)(sum / (T)kNormN) + 1e-6f);
  const int slice = kNormN / gridDim.x, lo = blockIdx.x * slice;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // the values this thread holds that fall in the block's slice
    const int at = threadIdx.x + j * kThreads;
    if (at >= lo && at < lo + slice) out[at] = v[j] * scale;
  }
}

template <class T, int kThreads>
float norm_chain(int blocks, float* a, float* b, cudaStream_t s) {
  return graph_us(s, [&](int i) {
    launch(norm_step_kernel<T, kThreads>, blocks, kThreads, 0, true, s, (const float*)(i % 2 ? b : a),
           i % 2 ? a : b);
  });
}

// ------------------------------------------------------------------------------------------ q6k
// One row per 32 >> lpr_log2 lanes, as matmul_decode.cu's matvec_kernel. kMode 0: the blocks as the file
// stores them; 1: field by field, one chunk's loads in flight a lane (the matvec's batch 1); 2: field by
// field through dev::dot_row with two chunks' loads in flight.
template <int kMode>
__global__ void __launch_bounds__(128)
    q6k_kernel(const uint8_t* w, int64_t rows, int nc, xpert::cuda::dev::ActView a, float* y, int lpr_log2) {
  using D = xpert::cuda::dev::Dot<xpert::DType::Q6_K>;
  constexpr bool kPlanar = kMode != 0;
  wait_then_trigger();
  const int lpr = 1 << lpr_log2, lane = threadIdx.x & 31, sub = lane & (lpr - 1);
  const int64_t r = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * (32 >> lpr_log2) + (lane >> lpr_log2);
  if (r >= rows) return;
  const int nb = nc / 8;
  float acc[1] = {0.0f};
  if constexpr (kMode == 2) {
    xpert::cuda::dev::dot_row<xpert::DType::Q6_K, 1, 2>(
        xpert::cuda::dev::row_at<xpert::DType::Q6_K>(w, r, rows, (size_t)nb * 210), sub, lpr, nc, a, 1, acc);
  } else
    for (int c = sub; c < nc; c += lpr) {
      D::Raw raw;
      if constexpr (kPlanar) {
        raw = D::load(xpert::cuda::dev::row_at<xpert::DType::Q6_K>(w, r, rows, (size_t)nb * 210), c);
      } else {  // the blocks as the file stores them: 16-byte pieces from 2-byte aligned addresses
        const uint8_t* blk = w + ((size_t)r * nb + (c >> 3)) * 210;
        const int c6 = (c >> 2) & 1, ga = (c >> 1) & 1, h = c & 1;
        raw.ql = xpert::cuda::dev::ld_u128_a2(blk + 64 * c6 + 32 * ga + 16 * h);
        raw.qh = xpert::cuda::dev::ld_u128_a2(blk + 128 + 32 * c6 + 16 * h);
        raw.sc0 = xpert::cuda::dev::ld_s8(blk + 192 + 8 * c6 + 2 * ga + h);
        raw.sc1 = xpert::cuda::dev::ld_s8(blk + 196 + 8 * c6 + 2 * ga + h);
        raw.d = xpert::cuda::dev::ld_u16(blk + 208);
      }
      D::mul<1>(raw, c, a, 1, acc);
    }
  for (int off = lpr >> 1; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
  if (sub == 0) y[r] = acc[0];
}

float q6k_us(int mode, const uint8_t* w, int64_t rows, int k, const int8_t* xq, const float2* xds, float* y,
             cudaStream_t s) {
  const int nc = k / 32, lpr_log2 = nc >= 64 ? 5 : nc >= 32 ? 4 : 3;
  const xpert::cuda::dev::ActView a{xq, xds, k};
  const unsigned grid = (unsigned)((rows + 4 * (32 >> lpr_log2) - 1) / (4 * (32 >> lpr_log2)));
  return graph_us(s, [&](int) {
    launch(mode == 2   ? q6k_kernel<2>
           : mode == 1 ? q6k_kernel<1>
                       : q6k_kernel<0>,
           grid, 128, 0, true, s, w, rows, nc, a, y, lpr_log2);
  });
}

}  // namespace

// attn: us per decode attention launch (its combine included) at positions pos.
float attn_us(bool one_block, bool qwen35, int32_t pos, cudaStream_t s) {
  const int64_t H = qwen35 ? 16 : 32, Hk = qwen35 ? 2 : 4, D = qwen35 ? 256 : 128, n_ctx = 4096;
  const int64_t qs = qwen35 ? 2 * D : D;  // Qwen3.5: q and gate interleaved per head
  float *q = nullptr, *out = nullptr;
  void *k = nullptr, *v = nullptr, *ws = nullptr;
  int8_t* oq = nullptr;
  float2* ods = nullptr;
  int32_t* dpos = nullptr;
  const size_t kv = (size_t)n_ctx * Hk * D * 2;
  CHECK(cudaMalloc(&q, H * qs * sizeof(float)));
  CHECK(cudaMemset(q, 0x3c, H * qs * sizeof(float)));
  CHECK(cudaMalloc(&out, H * D * sizeof(float)));
  CHECK(cudaMalloc(&k, kv));
  CHECK(cudaMalloc(&v, kv));
  CHECK(cudaMemset(k, 0x2c, kv));
  CHECK(cudaMemset(v, 0x2c, kv));
  CHECK(cudaMalloc(&oq, H * D));
  CHECK(cudaMalloc(&ods, H * D / 32 * sizeof(float2)));
  CHECK(cudaMalloc(&dpos, sizeof(int32_t)));
  CHECK(cudaMemcpy(dpos, &pos, sizeof(int32_t), cudaMemcpyHostToDevice));
  xpert::cuda::DecodeAttentionArgs a{.q = q,
                                     .k = k,
                                     .v = v,
                                     .slot_stride = 0,
                                     .slots = nullptr,
                                     .pos = dpos,
                                     .out = out,
                                     .n_seq = 1,
                                     .n_head = H,
                                     .n_head_kv = Hk,
                                     .head_dim = D,
                                     .max_kv = n_ctx,
                                     .kq_scale = 1.0f / 16,
                                     .sliding_window = 0,
                                     .min_keys_per_split = 128,
                                     .out_q = oq,
                                     .out_ds = ods,
                                     .gate = qwen35 ? q + D : nullptr,
                                     .gate_stride = qwen35 ? 2 * D : 0,
                                     .q_stride = qs,
                                     .one_block = one_block};
  const size_t wsb = xpert::cuda::attention_decode_workspace_bytes(a);
  if (wsb) CHECK(cudaMalloc(&ws, wsb));
  const float us = graph_us(s, [&](int) { xpert::cuda::attention_decode(a, ws, s); });
  for (void* p : {(void*)q, (void*)out, k, v, ws, (void*)oq, (void*)ods, (void*)dpos}) CHECK(cudaFree(p));
  return us;
}

int main(int argc, char** argv) {
  auto run = [&](const char* section) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i)
      if (!std::strcmp(argv[i], section)) return true;
    return false;
  };
  int sms = 0, major = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  const bool sm90 = major >= 9;  // PDL, bulk prefetches and clusters; older GPUs run the plain forms only
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int max_blocks = 4096;
  int* slots = nullptr;
  unsigned* count = nullptr;
  CHECK(cudaMalloc(&slots, sizeof(int) * (size_t)(kKernels + 1) * max_blocks));
  CHECK(cudaMemset(slots, 0, sizeof(int) * (size_t)(kKernels + 1) * max_blocks));
  CHECK(cudaMalloc(&count, sizeof(unsigned)));
  if (run("chain")) {
    std::printf("| what | blocks x threads | us each |\n|---|---|---:|\n");
    for (int blocks : {sms, 1024, 4096})
      for (bool pdl : {false, true})
        if (!pdl || sm90)
          std::printf("| graph chain, %s | %d x 128 | %.2f |\n", pdl ? "PDL" : "plain", blocks,
                    chain(blocks, 128, pdl, slots, s));
    for (int threads : {128, 512})
      std::printf("| grid barrier + a read | %d x %d | %.2f |\n", sms, threads,
                  barrier(sms, threads, count, slots, s));
  }
  if (run("cluster") && !sm90) std::printf("\ncluster: skipped, thread block clusters need sm_90+\n");
  if (run("cluster") && sm90) {
    CHECK(cudaFuncSetAttribute(cluster_hop_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(cluster_hop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 120 << 10));
    // 120 KB of shared memory: one block an SM; 100 KB: two.
    const size_t one = 120 << 10, two = 100 << 10;
    std::printf(
        "\n| cluster of | resident clusters, a block an SM | two an SM | hop us, 512 threads, a block an SM "
        "(clusters) |\n|---:|---:|---:|---|\n");
    for (int size : {2, 4, 8, 16}) {
      const int n1 = max_clusters(size, 512, one, s), n2 = max_clusters(size, 512, two, s);
      std::printf("| %d | %d | %d | ", size, n1, n2);
      if (n1 > 0) {
        const int full = std::min(n1, sms / size);
        for (int clusters : {1, full})
          std::printf("%.3f (%d) ", cluster_hop_us(clusters, size, 512, one, slots, s), clusters);
      }
      std::printf("|\n");
    }
    CHECK(cudaFuncSetAttribute(cluster_where_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(cluster_where_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 120 << 10));
    std::printf(
        "\n| clusters x blocks, 100 KB a block (two fit an SM) | SMs used | most blocks on one SM "
        "|\n|---|---:|---:|\n");
    for (const auto& [clusters, size] : {std::pair{4, 16}, {8, 16}, {9, 16}, {8, 8}, {16, 8}, {18, 8}}) {
      const auto [used, most] = cluster_spread(clusters, size, two, slots, s);
      std::printf("| %d x %d | %d | %d |\n", clusters, size, used, most);
    }
  }
  if (run("attn")) {
    std::printf(
        "\n| decode attention, us a launch | position | split + combine | one block "
        "|\n|---|---:|---:|---:|\n");
    for (const bool qwen35 : {false, true})
      for (const int32_t pos : {15, 63, 127, 255, 511, 1023})
        std::printf("| %s | %d | %.2f | %.2f |\n",
                    qwen35 ? "Qwen3.5 (16/2 x 256, gated)" : "Qwen3 (32/4 x 128)", pos,
                    attn_us(false, qwen35, pos, s), attn_us(true, qwen35, pos, s));
  }

  uint8_t *gate = nullptr, *up = nullptr;
  int* ids = nullptr;
  unsigned* out = nullptr;
  CHECK(cudaMalloc(&gate, kExperts * kExpertBytes));
  CHECK(cudaMalloc(&up, kExperts * kExpertBytes));
  CHECK(cudaMemset(gate, 1, kExperts * kExpertBytes));
  CHECK(cudaMemset(up, 2, kExperts * kExpertBytes));
  CHECK(cudaMalloc(&ids, kUsed * sizeof(int)));
  CHECK(cudaMemset(ids, 0, kUsed * sizeof(int)));
  CHECK(cudaMalloc(&out, 4 * kSpans * kUsed * sizeof(unsigned)));
  const double mb = 2.0 * kUsed * kSpans * kSpan / 1e6;
  if (run("stream")) {
    const float floor = stream_pair(empty_stream, 0, gate, up, ids, out, s);
    std::printf(
        "\n| after 8 expert ids: %.1f MB read by %d x %d blocks of %d threads | us (pair - %.2f) | TB/s |\n"
        "|---|---:|---:|\n",
        mb, kSpans, kUsed, kStreamThreads, floor);
    const struct {
      const char* name;
      StreamKernel k;
      size_t smem;
    } modes[] = {{"1 load in flight a thread", stream_kernel<0, 1>, 0},
                 {"3 loads in flight", stream_kernel<0, 3>, 0},
                 {"9 loads in flight (all)", stream_kernel<0, 9>, 0},
                 {"L2 bulk prefetch of both spans, then 1 load in flight", stream_kernel<1, 1>, 0},
                 {"cp.async into shared memory (72 KB), then read there", stream_kernel<2, 1>, 2 * kSpan}};
    for (const auto& m : modes) {
      const float us = stream_pair(m.k, m.smem, gate, up, ids, out, s) - floor;
      std::printf("| %s | %.2f | %.2f |\n", m.name, us, mb / us);
    }
    const struct {
      const char* name;
      StreamKernel k;
      int split;
    } splits[] = {
        {"9 loads in flight, 384 blocks of 256 threads (half a span pair each)", stream_split_kernel<2>, 2},
        {"9 loads in flight, 768 blocks of 128 threads (a quarter each)", stream_split_kernel<4>, 4}};
    for (const auto& m : splits) {
      const float us = stream_pair(m.k, 0, gate, up, ids, out, s, m.split) - floor;
      std::printf("| %s | %.2f | %.2f |\n", m.name, us, mb / us);
    }
  }

  unsigned *ha = nullptr, *hb = nullptr;
  CHECK(cudaMalloc(&ha, 4096 * sizeof(unsigned)));
  CHECK(cudaMalloc(&hb, 4096 * sizeof(unsigned)));
  CHECK(cudaMemset(ha, 0, 4096 * sizeof(unsigned)));
  CHECK(cudaMemset(hb, 0, 4096 * sizeof(unsigned)));
  const uint4* dram =
      reinterpret_cast<const uint4*>(gate);  // 113 MB of experts: about half of scattered reads miss L2
  const unsigned dram16 = (unsigned)(kExperts * kExpertBytes / 16), l2_16 = (unsigned)((4u << 20) / 16);
  if (run("hops")) {
    std::printf(
        "\n| dependent loads after the launch's first read | %u MB (half DRAM) us | L2 (4 MB) us |\n"
        "|---|---:|---:|\n",
        (unsigned)(kExperts * kExpertBytes >> 20));
    std::printf("| 0 | %.2f | %.2f |\n", hops<0>(dram, dram16, ha, hb, sms, s),
                hops<0>(dram, l2_16, ha, hb, sms, s));
    std::printf("| 1 | %.2f | %.2f |\n", hops<1>(dram, dram16, ha, hb, sms, s),
                hops<1>(dram, l2_16, ha, hb, sms, s));
    std::printf("| 2 | %.2f | %.2f |\n", hops<2>(dram, dram16, ha, hb, sms, s),
                hops<2>(dram, l2_16, ha, hb, sms, s));
    std::printf("| 4 | %.2f | %.2f |\n", hops<4>(dram, dram16, ha, hb, sms, s),
                hops<4>(dram, l2_16, ha, hb, sms, s));
  }
  CHECK(cudaFree(ha));
  CHECK(cudaFree(hb));

  float *na = nullptr, *nb = nullptr;
  CHECK(cudaMalloc(&na, kNormN * sizeof(float)));
  CHECK(cudaMalloc(&nb, kNormN * sizeof(float)));
  CHECK(cudaMemset(na, 0, kNormN * sizeof(float)));
  CHECK(cudaMemset(nb, 0, kNormN * sizeof(float)));
  if (run("norm")) {
    std::printf(
        "\n| a norm of %d floats a launch (each block reads all) | blocks x threads | us |\n|---|---|---:|\n",
        kNormN);
    std::printf("| float sums | 1 x 1024 | %.2f |\n", norm_chain<float, 1024>(1, na, nb, s));
    std::printf("| double sums | 1 x 1024 | %.2f |\n", norm_chain<double, 1024>(1, na, nb, s));
    std::printf("| float sums | 1 x 256 | %.2f |\n", norm_chain<float, 256>(1, na, nb, s));
    std::printf("| float sums | 8 x 256 | %.2f |\n", norm_chain<float, 256>(8, na, nb, s));
    std::printf("| float sums | %d x 128 | %.2f |\n", 128, norm_chain<float, 128>(128, na, nb, s));
    float *nd = nullptr, *nw = nullptr;
    int8_t* nq = nullptr;
    float2* nds = nullptr;
    CHECK(cudaMalloc(&nd, kNormN * sizeof(float)));
    CHECK(cudaMalloc(&nw, kNormN * sizeof(float)));
    CHECK(cudaMalloc(&nq, kNormN));
    CHECK(cudaMalloc(&nds, kNormN / 32 * sizeof(float2)));
    CHECK(cudaMemset(nd, 0, kNormN * sizeof(float)));  // x += 0: the chain keeps its values
    for (float* p : {na, nb, nw}) CHECK(cudaMemset(p, 0x3f, kNormN * sizeof(float)));  // 0.747 each
    for (const bool add : {true, false})
      for (const bool q8 : {true, false})
        std::printf("| add_rmsnorm_q8%s%s | 1 x 1024 | %.2f |\n", add ? ", x += d" : "",
                    q8 ? ", q8_1 out" : "", graph_us(s, [&](int i) {
                      xpert::cuda::add_rmsnorm_q8(add ? nd : nullptr, i % 2 ? nb : na, kNormN, nw,
                                                  i % 2 ? na : nb, kNormN, 1, kNormN, 1e-6f,
                                                  q8 ? nq : nullptr, q8 ? nds : nullptr, s);
                    }));
    CHECK(cudaFree(nd));
    CHECK(cudaFree(nw));
    CHECK(cudaFree(nq));
    CHECK(cudaFree(nds));
    CHECK(cudaFree(na));
    CHECK(cudaFree(nb));
  }

  // q6k: 151936 x 2048 (an output head, 255 MB) and 131072 x 512 rows (MoE down rows, 55 MB)
  if (run("q6k")) {
    const size_t bytes = (size_t)151936 * 8 * 210;
    uint8_t* w = nullptr;
    int8_t* xq = nullptr;
    float2* xds = nullptr;
    float* y = nullptr;
    CHECK(cudaMalloc(&w, bytes));
    CHECK(cudaMemset(w, 0x11, bytes));
    CHECK(cudaMalloc(&xq, 2048));
    CHECK(cudaMemset(xq, 3, 2048));
    CHECK(cudaMalloc(&xds, 64 * sizeof(float2)));
    CHECK(cudaMemset(xds, 0x3c, 64 * sizeof(float2)));
    CHECK(cudaMalloc(&y, 151936 * sizeof(float)));
    std::printf(
        "\n| Q6_K one-row product | blocks as stored us (GB/s) | field by field us (GB/s) "
        "| field by field, 2 chunks in flight us (GB/s) |\n|---|---:|---:|---:|\n");
    for (const auto& [rows, k] : {std::pair<int64_t, int>{151936, 2048}, {131072, 512}}) {
      const double gb = (double)rows * (k / 256) * 210 / 1e9;
      const float a = q6k_us(0, w, rows, k, xq, xds, y, s), b = q6k_us(1, w, rows, k, xq, xds, y, s),
                  c = q6k_us(2, w, rows, k, xq, xds, y, s);
      std::printf("| %lld x %d | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) |\n", (long long)rows, k, a,
                  gb / a * 1e6, b, gb / b * 1e6, c, gb / c * 1e6);
    }
    CHECK(cudaFree(w));
    CHECK(cudaFree(xq));
    CHECK(cudaFree(xds));
    CHECK(cudaFree(y));
  }

  CHECK(cudaFree(gate));
  CHECK(cudaFree(up));
  CHECK(cudaFree(ids));
  CHECK(cudaFree(out));
  CHECK(cudaFree(slots));
  CHECK(cudaFree(count));
  return 0;
}
