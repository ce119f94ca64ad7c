// Kernel launches with programmatic dependent launch (PDL, sm_90+): a kernel launched this way may start
// while the kernel before it on the stream is still finishing, so its launch latency and prologue hide
// behind that kernel's tail — on a decode step of ~15 small kernels per layer that latency is much of
// the time. The contract: a kernel launched with `launch_pdl` calls pdl_begin() before it reads or writes any
// memory another kernel touches (griddepcontrol.wait returns once the previous grid has completed and
// its writes are visible); pdl_begin also lets the next kernel begin launching. On older GPUs, or with
// XPERT_PDL=0, launches are plain and pdl_begin is a no-op. CUDA graphs keep the programmatic edges.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/trace.h"

namespace xpert::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Starts fetching the 16-byte-aligned inside of [p, p + bytes) into L2 and returns at once (sm_90: bulk
// prefetches of up to 1 MiB; older GPUs: nothing). For data a kernel is about to read that no kernel
// writes (weights): issued before pdl_begin, the fetch overlaps the previous kernel instead of following it.
// A hint only: L2 is where device memory is coherent, so it can never make a later read stale.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const size_t g = __cvta_generic_to_global(p);
  size_t a = (g + 15) & ~(size_t)15;
  const size_t end = (g + bytes) & ~(size_t)15;
  while (a < end) {
    const uint32_t n = (uint32_t)(end - a < ((size_t)1 << 20) ? end - a : (size_t)1 << 20);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
    a += n;
  }
#else
  (void)p;
  (void)bytes;
#endif
}

namespace detail {
bool pdl_enabled();  // the current device is sm_90+ and XPERT_PDL is not 0 (ops.cu)
bool prefetch_enabled();  // XPERT_PREFETCH is not 0: kernels take a flag for their prefetch_l2 (ops.cu)
}

namespace detail {
// A launch attribute: thread block clusters of `x` blocks along x (sm_90+).
inline cudaLaunchAttribute cluster_attr(unsigned x) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}
// launch_pdl's body; cluster 0: no clusters.
template <typename... P, typename... A>
void launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               unsigned cluster, A&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster) attr[n++] = cluster_attr(cluster);
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  XPERT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
  if (trace_enabled()) trace_after(reinterpret_cast<const void*>(kernel), stream);
}
// A kernel launched with <<<>>> (no PDL) stamped like launch_pdl's under XPERT_TRACE, so the trace gives
// it its own line instead of adding its time to the next stamped kernel.
template <typename K>
void trace_launch(K* kernel, cudaStream_t stream, const char* kind = nullptr) {
  if (trace_enabled()) trace_after(reinterpret_cast<const void*>(kernel), stream, kind);
}
}  // namespace detail

template <typename... P, typename... A>
void launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  detail::launch_ex(kernel, grid, block, smem, stream, 0, std::forward<A>(args)...);
}

// launch_pdl for a grid of thread block clusters of `cluster` blocks along x (sm_90+: the caller checks;
// 0: no clusters, as launch_pdl).
template <typename... P, typename... A>
void launch_pdl_cluster(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        unsigned cluster, A&&... args) {
  detail::launch_ex(kernel, grid, block, smem, stream, cluster, std::forward<A>(args)...);
}

}  // namespace xpert::cuda
