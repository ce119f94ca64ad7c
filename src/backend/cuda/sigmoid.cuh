// The logistic function as every CUDA kernel computes it (one expression, so gates applied in different
// kernels give the same bits: the standalone mul_sigmoid, the router's shared-expert gate, the attention
// combine's output gate).
#pragma once
#include <cuda_runtime.h>

namespace xpert::cuda {

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

}  // namespace xpert::cuda
