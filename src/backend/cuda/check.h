// Error checking for CUDA runtime calls and kernel launches: a failed call throws xpert::Error naming
// the call, the file and line, and CUDA's own message, so a broken GPU never turns into silent garbage.
#pragma once
#include <cuda_runtime.h>
// No base/error.h here: .cu files include this, and nvcc's host pass cannot compile fmt (v9, C++20).

namespace xpert::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);

}  // namespace xpert::cuda

#define XPERT_CUDA_CHECK(call)                                                     \
  do {                                                                             \
    cudaError_t xpert_cuda_err_ = (call);                                          \
    if (xpert_cuda_err_ != cudaSuccess)                                            \
      ::xpert::cuda::throw_cuda_error(xpert_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at once (not the kernel's own faults,
// which surface at the next synchronizing call).
#define XPERT_CUDA_CHECK_LAUNCH() XPERT_CUDA_CHECK(cudaGetLastError())
