// How weights lie in CUDA device memory: as the file stores them, except Q6_K. Q6_K's 210-byte blocks are
// only 2-byte aligned, so a decode dot would assemble every 16-byte piece from smaller loads; on the device
// each Q6_K matrix keeps its blocks field by field instead: every block's ql (128 bytes), then every
// block's qh (64), scales (16) and d (2), in block order. The same bytes, each 16-byte piece of ql and qh
// aligned (every matrix starts 16-byte aligned). matmul_blocks.h's row_at reads it. H200, a one-row product
// (bench_cuda_floor's q6k section): an output head of 151936 x 2048 in 79.3 us against 83.2 as stored
// (five 4-byte loads a piece) and 116.9 with two 16-byte loads and word selects a piece; 131072 rows of
// 512 (MoE down rows) in 18.8 us against 20.4 and 28.7.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace xpert::cuda {

// Whether type t lies on the device other than in the file (whole matrices must be converted).
constexpr bool device_layout_differs(DType t) { return t == DType::Q6_K; }

// Copies `bytes` of weights (whole matrices of `rows` rows of `row_len` elements; a 3-D expert tensor is
// bytes / matrix bytes of them) from host memory into dst in the device layout, in order on `stream`.
// Q6_K travels through a staging buffer of stage_blocks blocks (0: ~16 MiB; tests pass a few) and returns
// once it is converted.
void upload_weights(void* dst, const void* src, size_t bytes, DType type, int64_t row_len, int64_t rows,
                    cudaStream_t stream, int64_t stage_blocks = 0);

// The same conversion of weights already in device memory (src as the file stores them, src != dst).
void to_device_layout(void* dst, const void* src, size_t bytes, DType type, int64_t row_len, int64_t rows,
                      cudaStream_t stream);

}  // namespace xpert::cuda
