// The fixed costs a decode step pays whatever its kernels do (GPU machine): ./build/bench/bench_cuda_floor
//   chain:   a CUDA graph of kKernels launches, each block's thread 0 reading what the kernel before wrote
//            and writing its own slot, plain or with programmatic dependent launch (PDL, as launch_pdl);
//            the time a launch adds to a step when it does (almost) nothing.
//   barrier: one persistent grid (a block an SM, cooperative launch) crossing kKernels grid-wide barriers
//            (one counter, thread 0 of each block arriving with atomicAdd and spinning on an acquire load),
//            each followed by a read of what another block wrote before it: the floor of a phase of the
//            persistent decode kernel.
// Each figure is the best of kReplays replays, in microseconds per launch or per barrier.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

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
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
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

float chain(int blocks, int threads, bool pdl, int* slots, cudaStream_t s) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kKernels; ++i) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, chain_kernel, slots, i, pdl));
  }
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

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int max_blocks = 4096;
  int* slots = nullptr;
  unsigned* count = nullptr;
  CHECK(cudaMalloc(&slots, sizeof(int) * (size_t)(kKernels + 1) * max_blocks));
  CHECK(cudaMemset(slots, 0, sizeof(int) * (size_t)(kKernels + 1) * max_blocks));
  CHECK(cudaMalloc(&count, sizeof(unsigned)));
  std::printf("| what | blocks x threads | us each |\n|---|---|---:|\n");
  for (int blocks : {sms, 1024, 4096})
    for (bool pdl : {false, true})
      std::printf("| graph chain, %s | %d x 128 | %.2f |\n", pdl ? "PDL" : "plain", blocks,
                  chain(blocks, 128, pdl, slots, s));
  for (int threads : {128, 512})
    std::printf("| grid barrier + a read | %d x %d | %.2f |\n", sms, threads,
                barrier(sms, threads, count, slots, s));
  CHECK(cudaFree(slots));
  CHECK(cudaFree(count));
  return 0;
}
