// Internal launchers shared by the CUDA matmul, MoE and embedding code (host-visible; no device code).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/matmul.h"
#include "quant/dtype.h"

namespace xpert::cuda::detail {

// Prefill tile of the tensor-core product: output rows (X rows) x W rows per CTA.
constexpr int kGemmBM = 64;
constexpr int kGemmBN = 64;
// Tiles of 32 rows where a product has few rows (33..kGemmSmallMaxRows) or a grouped product few rows an
// expert (at most kGemmSmallGroupRows on average): twice the CTAs for a dense product whose one or two
// 64-row tiles left most SMs idle, half the mma and X tile work for expert groups of a few rows. H200,
// qwen3-30b-a3b synth, `xpert bench --parallel 64 -p 128 -n 64 --routing uniform` S_TG 1,913 -> 2,241 t/s
// in one call (2026-12-04: the grouped gate/up GEMM 238 us a layer at 32 rows); at 512 tokens x top 8 of
// 128 experts (32 rows an expert) 32-row tiles had measured slower.
constexpr int kGemmSmallBM = 32;
constexpr int64_t kGemmSmallMaxRows = 128;
constexpr int64_t kGemmSmallGroupRows = 16;

// Y = X W^T on tensor cores, optionally two products at once (dual: y = silu(X W0^T) * (X W1^T)), over
// one matrix or over groups of rows that each use their own matrix (grouped experts).
struct GemmArgs {
  const void* w0 = nullptr;  // ungrouped: the matrix (and w1 the second of a dual product)
  const void* w1 = nullptr;
  const void* const* wtab0 = nullptr;  // grouped: matrix of group e (device array)
  const void* const* wtab1 = nullptr;
  int64_t n = 0, k = 0;             // W rows, row length (k % 32 == 0)
  size_t row_bytes = 0;             // bytes between W rows
  const void* x = nullptr;          // f16 (bf16 for BF16 W) [..][k]
  const float* x_scale = nullptr;   // per X row, multiplies the result (null: 1)
  const int32_t* x_rows = nullptr;  // X row of output row r = x_rows[r] / x_row_div (null: r)
  int32_t x_row_div = 1;
  int64_t m = 0;  // ungrouped: output rows
  float* y = nullptr;
  int64_t ldy = 0;
  const int32_t* group_rows = nullptr;   // grouped: [n_groups + 1] first output row of each group
  const int32_t* group_tiles = nullptr;  // grouped: [n_groups + 1] first tile of each group
  int32_t n_groups = 0;
  int64_t max_tiles = 0;  // grouped: grid bound (tiles past group_tiles[n_groups] exit)
  int32_t bm = kGemmBM;   // X rows per CTA: kGemmBM or kGemmSmallBM
  // Ungrouped and not dual: n_outs (1..kMaxOuts) matrices of one type and k over the same X in one launch;
  // column tiles [outs[j-1].tile_end, outs[j].tile_end) are matrix j's (w0 / n / y / ldy unused). q, k and
  // v of a prefill fill one grid: alone, k and v (512 rows) ran 64 blocks on 132 SMs.
  static constexpr int kMaxOuts = 4;
  struct Out {
    const void* w = nullptr;
    int64_t n = 0;
    float* y = nullptr;
    int64_t ldy = 0;
    int32_t tile_end = 0;
  };
  int32_t n_outs = 0;
  Out outs[kMaxOuts] = {};
};
void launch_gemm(DType w_type, bool dual, const GemmArgs& a, cudaStream_t stream);
// One-time per-device kernel set-up (shared-memory limits), outside any stream capture.
void gemm_init();
// launch_gemm's grouped products in tiles of kGemmSmallBM rows for Q4_K and Q6_K weights (k % 256 == 0):
// raw weight tiles streamed through shared memory several k steps ahead (matmul_grouped.cu). False
// (nothing launched) for other products. gemm_grouped_init: its part of gemm_init.
bool launch_gemm_grouped_small(DType w_type, bool dual, const GemmArgs& a, cudaStream_t stream);
void gemm_grouped_init();

// One row of q8_1 activations times very many Q6_K rows (an output head) streamed through shared memory
// (matmul_stream.cu: sm_90, n % 16 == 0, k % 256 == 0): the decode form's bits. False (nothing launched)
// where the device or the shape does not take it.
bool launch_matvec_stream(DType w_type, const void* w, int64_t n, const Activations& a, float* y,
                          cudaStream_t stream);

// Matrix-vector products for m rows of prepared activations (any m; W re-read per 8 rows).
// Several matrices of one type and row length read the same activations in one launch: output j takes
// global rows [end[j-1], end[j]) (its own rows 0..n_j) and writes y[j] with row stride ldy[j].
struct MatvecOuts {
  static constexpr int kMax = 4;
  int count = 0;
  const void* w[kMax] = {};
  int64_t end[kMax] = {};
  float* y[kMax] = {};
  int64_t ldy[kMax] = {};
};
void launch_matvec(DType w_type, const MatvecOuts& o, const Activations& a, cudaStream_t stream);
// o0's products (type t0) and o1's (t1) in one launch; where matvec_pair_supported (one q8_1 row; Q4_K with
// Q6_K, the types of a Q4_K_M layer's projections).
bool matvec_pair_supported(DType t0, DType t1, const Activations& a);
void launch_matvec_pair(DType t0, const MatvecOuts& o0, DType t1, const MatvecOuts& o1, const Activations& a,
                        cudaStream_t stream);
void launch_matvec(DType w_type, const void* w, int64_t n, const Activations& a, float* y, int64_t ldy,
                   cudaStream_t stream);

// Activation conversion. rows_dev (optional, device): only rows < *rows_dev are converted.
void launch_quantize_q8_1(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* q, float2* ds,
                          cudaStream_t stream);
void launch_convert_16(bool bf16, const float* x, int64_t ldx, int64_t m, int64_t k, void* out, float* scale,
                       const int32_t* rows_dev, cudaStream_t stream);

}  // namespace xpert::cuda::detail
