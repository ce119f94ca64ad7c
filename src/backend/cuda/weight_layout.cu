// Weights into their device layout (weight_layout.h).
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/weight_layout.h"
#include "quant/blocks.h"

namespace xpert::cuda {
namespace {

constexpr size_t kQ6Bytes = 210;  // ql 128, qh 64, scales 16, d 2

// One thread per block: block b of matrix m (n blocks a matrix) to its four fields' places.
__global__ void q6_fields_kernel(const uint16_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t n,
                                 int64_t total) {
  const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= total) return;
  const int64_t m = g / n, b = g % n;
  const uint16_t* s = src + g * (kQ6Bytes / 2);
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

// Blocks of one matrix, checked against the bytes.
int64_t matrix_blocks(size_t bytes, DType type, int64_t row_len, int64_t rows) {
  const int64_t bs = dtype_info(type).block_size;
  if (row_len <= 0 || rows <= 0 || row_len % bs != 0)
    fail_cat("CUDA weights: ", rows, " rows of ", row_len, " ", dtype_name(type),
             " values are not whole blocks");
  const int64_t n = row_len / bs * rows;
  if (bytes % ((size_t)n * dtype_info(type).block_bytes) != 0)
    fail_cat("CUDA weights: ", bytes, " bytes are not whole ", rows, " x ", row_len, " ", dtype_name(type),
             " matrices");
  return n;
}

}  // namespace

void to_device_layout(void* dst, const void* src, size_t bytes, DType type, int64_t row_len, int64_t rows,
                      cudaStream_t stream) {
  if (bytes == 0) return;
  if (!device_layout_differs(type)) {
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  static_assert(sizeof(quant::BlockQ6_K) == kQ6Bytes, "Q6_K block layout");
  const int64_t n = matrix_blocks(bytes, type, row_len, rows), total = (int64_t)(bytes / kQ6Bytes);
  // The readers load ql and qh 16 bytes at a time: every matrix must start 16-byte aligned (experts back
  // to back: rows x blocks a multiple of 8, as CUDA's MoE shapes always are).
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (bytes > (size_t)n * kQ6Bytes && (n * kQ6Bytes) % 16))
    fail_cat("CUDA weights: Q6_K matrices of ", rows, " rows of ", row_len,
             " must lie 16-byte aligned on the device (rows x blocks a multiple of 8)");
  if (reinterpret_cast<uintptr_t>(src) % 2) fail_cat("CUDA weights: Q6_K data must be 2-byte aligned");
  const int threads = 128;
  q6_fields_kernel<<<(unsigned)((total + threads - 1) / threads), threads, 0, stream>>>(
      static_cast<const uint16_t*>(src), static_cast<uint8_t*>(dst), n, total);
  XPERT_CUDA_CHECK_LAUNCH();
}

void upload_weights(void* dst, const void* src, size_t bytes, DType type, int64_t row_len, int64_t rows,
                    cudaStream_t stream) {
  if (bytes == 0) return;
  if (!device_layout_differs(type)) {
    XPERT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  const int64_t n = matrix_blocks(bytes, type, row_len, rows);
  const size_t matrix = (size_t)n * dtype_info(type).block_bytes;
  const size_t chunk = std::max<size_t>(1, (size_t)(64 << 20) / matrix) * matrix;  // whole matrices, ~64 MiB
  DeviceBuffer stage(std::min(bytes, chunk));
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t len = std::min(chunk, bytes - off);
    XPERT_CUDA_CHECK(cudaMemcpyAsync(stage.data(), static_cast<const uint8_t*>(src) + off, len,
                                     cudaMemcpyHostToDevice, stream));
    to_device_layout(static_cast<uint8_t*>(dst) + off, stage.data(), len, type, row_len, rows, stream);
  }
  XPERT_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the staging buffer goes
}

}  // namespace xpert::cuda
