// Quantized matrix products on the GPU, with cpu::matmul's semantics:
//   Y[i][j] = sum_l X[i][l] * W[j][l]      X: m rows of k f32, W: n rows of k in a GGUF block format
// All pointers are DEVICE pointers; every call is asynchronous on `stream` and graph-capturable (no
// allocation, no host synchronization). Types: F32 F16 BF16 Q4_0 Q5_0 Q8_0 Q4_K Q5_K Q6_K.
//
// X is first converted once to the form the kernel multiplies ("activations"):
//   q8_1  int8 per 32-block with its f32 scale and scaled sum (m <= kMatvecMaxRows, quant types)
//   f16   f16 scaled per row by a power of two, so no value overflows (prefill of quant types; F16 W)
//   bf16  (BF16 W), f32 (F32 W: X is used as is)
// Decode and small batches (m <= kMatvecMaxRows): matrix-vector kernels, W streamed with 16-byte loads
// once per 8 rows of X (grid.y), integer dot products.
// Prefill: W tiles dequantized to f16 in shared memory, tensor-core mma (m16n8k16, f32 accumulate).
// Row strides: X is dense (k), W rows are row_bytes(w_type, k) apart, Y rows ldy floats apart.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace xpert::cuda {

constexpr int64_t kDecodeMaxRows = 8;  // a decode step's rows: a norm may hand the product its q8_1 X
// m at or below this: the matrix-vector kernels (8 rows a CTA row, W re-read every 8 rows), above it tensor
// cores. When the GEMM ran 64-row tiles without a split, the matrix-vector kernels up to 32 rows had won
// (16 streams 1,128 -> 1,374 t/s); with 32-row tiles whose k is split over a cluster (matmul_prefill.cu)
// the GEMM wins from 9 rows on. H200, qwen3-30b-a3b synth, `xpert bench --parallel 16,32 -p 128 -n 64`,
// bound 32 -> 8, two rounds each routing in one call (2026-12-04 14:46): 16 streams 1,355-1,400 ->
// 1,447-1,461, 32 streams 1,523-1,552 -> 1,698-1,733. At 64 streams the matrix-vector kernels up to 64 rows
// had lost (S_TG 1,508 against 1,584).
constexpr int64_t kMatvecMaxRows = 8;

enum class ActFormat { q8_1, f16, bf16, f32 };

// Prepared activations: what quantize_activations writes and the *_prepared products read.
struct Activations {
  ActFormat format = ActFormat::f32;
  const void* data = nullptr;  // q8_1: int8 [m][k]; f16/bf16: [m][k]; f32: float [m][k]
  const float* aux = nullptr;  // q8_1: float2 (d, d*sum) [m][k/32]; f16/bf16: float scale [m]
  int64_t m = 0, k = 0;
};

// Once per device (that device current), before capturing any of these launchers into a CUDA graph (sets
// kernel attributes; capturing a first launch without it would make a forbidden host call inside the
// capture).
void matmul_init();

// Whether this GPU build computes w_type, and the constraint on k (throws xpert::Error if not).
bool matmul_supported(DType w_type);
void check_matmul_shape(DType w_type, int64_t k);

// The activation form matmul wants for (w_type, m), and its size in bytes.
ActFormat activation_format(DType w_type, int64_t m);
size_t activation_bytes(ActFormat f, int64_t m, int64_t k);

// x: [m][k] f32 (row stride ldx) -> `out` (activation_bytes(f, m, k) bytes, 256-byte aligned).
Activations quantize_activations(ActFormat f, const float* x, int64_t ldx, int64_t m, int64_t k, void* out,
                                 cudaStream_t stream);

// Y = X W^T from prepared activations (a.format must be activation_format(w_type, a.m)).
void matmul_prepared(DType w_type, const void* w, int64_t n, const Activations& a, float* y, int64_t ldy,
                     cudaStream_t stream);

// Several products of the same prepared activations (one weight type, row length a.k): one launch for up to
// 4 of them (a layer's q, k and v), a matvec grid at decode sizes, a tensor-core grid past them; products
// past 4 take further launches. Each output is the bits of its own matmul_prepared.
struct MatmulOut {
  const void* w = nullptr;
  int64_t n = 0;  // W rows
  float* y = nullptr;
  int64_t ldy = 0;
};
void matmul_prepared_multi(DType w_type, const MatmulOut* outs, int count, const Activations& a,
                           cudaStream_t stream);
// Two such groups whose weights differ in type, in one launch, where matmul_pair_supported (one q8_1 row,
// Q4_K with Q6_K: a Q4_K_M layer's q and k with its v, or a Gated DeltaNet input projection with its gate
// rows); up to 4 products a group. Each output is the bits of its own matmul_prepared.
bool matmul_pair_supported(DType t0, DType t1, const Activations& a);
void matmul_prepared_pair(DType t0, const MatmulOut* outs0, int count0, DType t1, const MatmulOut* outs1,
                          int count1, const Activations& a, cudaStream_t stream);

// Scratch `matmul` needs; pass at least this many bytes.
size_t matmul_workspace_bytes(DType w_type, int64_t m, int64_t k);

// The whole product: converts X into `workspace`, then multiplies.
void matmul(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
            int64_t ldy, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace xpert::cuda
