// CPU matrix products with quantized weights, the hot loop of every model.
//   Y[m][j] = sum_k X[m][k] * W[j][k]
// W: n rows of k elements in its storage format (row stride row_bytes(w_type, k)), read in place.
// X: m rows of k floats (row stride k). Y: m rows, row stride ldy (>= n).
// X is first quantized to activation_type(w_type), as llama.cpp does, so the integer dot products
// are the same as llama.cpp's. The ISA is chosen once per call from best_isa().
#pragma once
#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "quant/dtype.h"

namespace xpert::cpu {

void matmul(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
            int64_t ldy, ThreadPool& pool);

// Batch invariance: each X row's result has the same bits whatever other rows share the call, so a
// sequence's logits do not depend on the requests batched with it or on how its prompt was split into
// prefill chunks. On the CPU it holds by construction: every kernel (decode, tiles, VNNI panels, AMX tiles)
// takes one float order per row (matmul_simd.inl), so no kernel choice depends on this switch any more; it
// stays as the process-wide statement `xpert serve --batch-invariant` makes (docs/PERF.md).
void set_batch_invariant(bool on);
bool batch_invariant();

// Several independent products in one parallel region (the experts of a MoE layer at decode): the
// weight rows of all jobs are split into equal shares of bytes, one per thread, so small products pay
// one fork-join in all instead of one each and every thread streams a long run of weights. Jobs with
// the same x, m, k and activation type share one quantized copy of X.
struct MatmulJob {
  DType w_type;
  const void* w;
  int64_t n, k;
  const float* x;
  int64_t m;
  float* y;
  int64_t ldy;
};
void matmul_batch(std::span<const MatmulJob> jobs, ThreadPool& pool);

// Scalar reference of the same product: dequantize W to f32, round X through its activation type,
// accumulate in double. Tests compare every ISA path to it.
void matmul_reference(DType w_type, const void* w, int64_t n, int64_t k, const float* x, int64_t m,
                      float* y, int64_t ldy);

}  // namespace xpert::cpu
