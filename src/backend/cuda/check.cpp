#include "backend/cuda/check.h"

#include "base/error.h"

namespace xpert::cuda {

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error in {} ({}:{}): {} ({})", what, file, line, cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace xpert::cuda
