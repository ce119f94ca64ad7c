// Embedding lookup on the GPU (ggml's get_rows): out[i] = row ids[i] of a table in any matmul weight
// type, dequantized to f32. DEVICE pointers; asynchronous on `stream`. An id outside [0, n_rows) gives a
// row of zeros (the kernel never reads outside the table; callers validate tokens on the host).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/dtype.h"

namespace xpert::cuda {

// table: n_rows rows of row_len elements (row stride row_bytes(type, row_len)); out: [n_ids][ldo] f32.
void get_rows(DType type, const void* table, int64_t n_rows, int64_t row_len, const int32_t* ids,
              int64_t n_ids, float* out, int64_t ldo, cudaStream_t stream);

}  // namespace xpert::cuda
