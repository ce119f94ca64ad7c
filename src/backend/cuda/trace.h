// XPERT_TRACE=1: a stamp of the GPU clock after every launch_pdl kernel (launch.cuh), so that a decode
// step's time can be split by kernel inside its CUDA graph; trace_dump() prints the mean per kernel.
// Implementation and caveats: trace.cu.
#pragma once
#include <cuda_runtime.h>

namespace xpert::cuda::detail {

bool trace_enabled();
void trace_after(const void* kernel, cudaStream_t stream);  // after a launch on `stream`
void trace_dump();  // waits for the device; prints to stderr and starts over

}  // namespace xpert::cuda::detail
