// XPERT_TRACE=1: a stamp of the GPU clock after every launch_pdl kernel (launch.cuh), so that a decode
// step's time can be split by kernel inside its CUDA graph; trace_dump() prints the mean per kernel.
// Implementation and caveats: trace.cu.
#pragma once
#include <cuda_runtime.h>

namespace xpert::cuda::detail {

bool trace_enabled();
// After a launch on `stream`; kind (a string literal, optional) tells launches of one kernel apart.
void trace_after(const void* kernel, cudaStream_t stream, const char* kind = nullptr);
void trace_dump();  // waits for the device; prints to stderr and starts over

}  // namespace xpert::cuda::detail
