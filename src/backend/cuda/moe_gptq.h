// Routed experts in GPTQ-INT4 as the checkpoint stores them (DType GPTQ4_G*, GPTQ4Z_G*; quant/gptq.h: one
// matrix W [n][k] = qweight u32 [k/8][n] | scales f16 [k/group][n] | (Z types) zeros u8 [k/group][n]), read
// in place by moe_experts (moe.cu) for both its paths; nothing is repacked. Internal launchers (moe_gptq.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/moe.h"
#include "quant/dtype.h"

namespace xpert::cuda::detail {

// Decode, gate/up: for every (token t, slot j) pair p = t * k + j whose expert has gate, up and down here,
// h[p] = silu(x[t] Wg^T) * (x[t] Wu^T), f32 [n * k][n_ff]; absent pairs' rows are left as they are.
// x: f32 [n][n_embd]. All f32 (no activation quantization).
void launch_gptq_gate_up(const MoeExperts& e, const int32_t* ids, int64_t n, int64_t k, const float* x,
                         float* h, cudaStream_t stream);
// Decode, down: y[p] = h[p] Wd^T for the present pairs (f32 [n * k][n_embd], a workspace), then
// out[t] = (accumulate ? out[t] (+ residual[t]) : 0) + the sum over t's present slots, in slot order, of
// weight * y[p].
void launch_gptq_down(const MoeExperts& e, const int32_t* ids, const float* weights, int64_t n, int64_t k,
                      const float* h, float* y, float* out, bool accumulate, const float* residual,
                      cudaStream_t stream);

// launch_gemm's grouped products (matmul_kernels.h: GemmArgs with group_tiles; dual: silu(X W0^T) * (X W1^T);
// f16 X with per-row scales) for GPTQ weights, on tensor cores, W tiles dequantized to f16 from the stored
// planes. k % 32 == 0 (a GPTQ group is a multiple of 32).
void launch_gemm_gptq(DType w_type, bool dual, const GemmArgs& a, cudaStream_t stream);

}  // namespace xpert::cuda::detail
