// An OpenCL device as a Backend: the whole model (or its last -ngl layers) on `--device opencl:N` (the Arc
// card scenario). Memory is coarse-grained shared virtual memory (OpenCL 2.0 SVM): Backend hands raw
// pointers around (weights, KV cache rows, scratch, with offsets added by the model code), and an SVM
// pointer is a raw pointer every kernel can take at any offset. A device without coarse-grained SVM is
// refused with a clear error (it can still run experts: --expert-device opencl:N).
//
// Kernels (OpenCL C compiled at run time, cached on disk by program_cache.h): kernels_matmul.h (one
// program per weight type: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q4_K Q5_K Q6_K), kernels_ops.h, kernels_attention.h,
// kernels_gdn.h (Gated DeltaNet: recurrent for decode, chunked for prefill). All portable OpenCL C 1.2 (what Debian's PoCL offers), f32 arithmetic.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "backend/gated_delta_net.h"

namespace xpert {

// Throws Error when the build has no OpenCL, the device does not exist or lacks coarse-grained SVM.
// The Gated DeltaNet delta rule takes the CPU's choice: chunked from kChunkedMinTokens tokens (prefill),
// recurrent below.
std::shared_ptr<Backend> make_opencl_backend(int opencl_index);
// The same with the delta rule's form forced (the tests run each form; only in builds with OpenCL).
std::shared_ptr<Backend> make_opencl_backend(int opencl_index, DeltaRuleForm gdn_form);

}  // namespace xpert
