// Weights into their device layout (weight_layout.h).
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/weight_layout.h"
#include "quant/blocks.h"

namespace xpert::cuda {
namespace {

constexpr size_t kQ6Bytes = sizeof(quant::BlockQ6_K);  // ql 128, qh 64, scales 16, d 2

// One thread per block: blocks [g0, g0 + count) of the tensor at dst (src holds just those, as stored),
// block b of matrix m (n blocks a matrix) to its four fields' places.
__global__ void q6_fields_kernel(const uint16_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t n,
                                 int64_t g0, int64_t count) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t g = g0 + i, m = g / n, b = g % n;
  const uint16_t* s = src + i * (kQ6Bytes / 2);
  uint8_t* mat = dst + m * n * kQ6Bytes;
  uint16_t* ql = reinterpret_cast<uint16_t*>(mat + b * 128);
  uint16_t* qh = reinterpret_cast<uint16_t*>(mat + n * 128 + b * 64);
  uint16_t* sc = reinterpret_cast<uint16_t*>(mat + n * 192 + b * 16);
  uint16_t* d = reinterpret_cast<uint16_t*>(mat + n * 208 + b * 2);
  for (int i = 0; i < 64; ++i) ql[i] = s[i];
  for (int i = 0; i < 32; ++i) qh[i] = s[64 + i];
  for (int i = 0; i < 8; ++i) sc[i] = s[96 + i];
  d[0] = s[104];
}

// Blocks of one matrix, checked against the bytes, and the alignment the readers need.
int64_t matrix_blocks(const void* dst, size_t bytes, DType type, int64_t row_len, int64_t rows) {
  const int64_t bs = dtype_info(type).block_size;
  if (row_len <= 0 || rows <= 0 || row_len % bs != 0)
    fail_cat("CUDA weights: ", rows, " rows of ", row_len, " ", dtype_name(type),
             " values are not whole blocks");
  const int64_t n = row_len / bs * rows;
  if (bytes % ((size_t)n * dtype_info(type).block_bytes) != 0)
    fail_cat("CUDA weights: ", bytes, " bytes are not whole ", rows, " x ", row_len, " ", dtype_name(type),
             " matrices");
  // The readers load ql and qh 16 bytes at a time: every matrix must start 16-byte aligned (experts back
  // to back: rows x blocks a multiple of 8, as CUDA's MoE shapes always are).
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (bytes > (size_t)n * kQ6Bytes && (n * kQ6Bytes) % 16))
    fail_cat("CUDA weights: Q6_K matrices of ", rows, " rows of ", row_len,
             " must lie 16-byte aligned on the device (rows x blocks a multiple of 8)");
  return n;
}

void launch_fields(const uint16_t* src, uint8_t* dst, int64_t n, int64_t g0, int64_t count,
                   cudaStream_t stream) {
  const int threads = 128;
  q6_fields_kernel<<<(unsigned)((count + threads - 1) / threads), threads, 0, stream>>>(src, dst, n, g0,
                                                                                        count);
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void to_device_layout(void* dst, const void* src, size_t bytes, DType type, int64_t row_len, int64_t rows,
                      cudaStream_t stream) {
  if (bytes == 0) return;
  if (!device_layout_differs(type)) {
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const int64_t n = matrix_blocks(dst, bytes, type, row_len, rows);
  if (reinterpret_cast<uintptr_t>(src) % 2) fail_cat("CUDA weights: Q6_K data must be 2-byte aligned");
  launch_fields(static_cast<const uint16_t*>(src), static_cast<uint8_t*>(dst), n, 0,
                (int64_t)(bytes / kQ6Bytes), stream);
}

void upload_weights(void* dst, const void* src, size_t bytes, DType type, int64_t row_len, int64_t rows,
                    cudaStream_t stream, int64_t stage_blocks) {
  if (bytes == 0) return;
  if (!device_layout_differs(type)) {
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  const int64_t n = matrix_blocks(dst, bytes, type, row_len, rows), total = (int64_t)(bytes / kQ6Bytes);
  const int64_t chunk =
      stage_blocks > 0 ? stage_blocks : (int64_t)((16 << 20) / kQ6Bytes);  // blocks at a time
  DeviceBuffer stage((size_t)std::min(total, chunk) * kQ6Bytes);
  for (int64_t g0 = 0; g0 < total; g0 += chunk) {
    const int64_t count = std::min(chunk, total - g0);
    XPERT_CUDA_CHECK(cudaMemcpyAsync(stage.data(), static_cast<const uint8_t*>(src) + g0 * kQ6Bytes,
                                     (size_t)count * kQ6Bytes, cudaMemcpyHostToDevice, stream));
    launch_fields(stage.as<uint16_t>(), static_cast<uint8_t*>(dst), n, g0, count, stream);
  }
  XPERT_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the staging buffer goes
}

}  // namespace xpert::cuda
