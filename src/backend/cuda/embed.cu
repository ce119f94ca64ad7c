#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/embed.h"
#include "backend/cuda/matmul_blocks.h"

namespace xpert::cuda {
namespace {

// One thread per 32-element group of a row; blockIdx.y = which id.
template <DType T>
__global__ void get_rows_kernel(const uint8_t* __restrict__ table, int64_t n_rows, size_t row_bytes,
                                int n_groups, const int32_t* __restrict__ ids, float* __restrict__ out,
                                int64_t ldo) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= n_groups) return;
  const int64_t id = ids[blockIdx.y];
  float v[32];
  if (id >= 0 && id < n_rows) {
    dev::Deq<T>::dequant(dev::Deq<T>::load(dev::row_at<T>(table, id, n_rows, row_bytes), g), v);
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = 0.0f;
  }
  float4* o = reinterpret_cast<float4*>(out + (int64_t)blockIdx.y * ldo + 32 * g);
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

// Rows that are not whole 32-element groups (float tables only): one element per thread.
template <DType T>
__global__ void get_rows_scalar_kernel(const uint8_t* __restrict__ table, int64_t n_rows, int64_t row_len,
                                       const int32_t* __restrict__ ids, float* __restrict__ out,
                                       int64_t ldo) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= row_len) return;
  const int64_t id = ids[blockIdx.y];
  float v = 0.0f;
  if (id >= 0 && id < n_rows) {
    if constexpr (T == DType::F32)
      v = reinterpret_cast<const float*>(table)[id * row_len + i];
    else if constexpr (T == DType::F16)
      v = dev::f16_bits(reinterpret_cast<const uint16_t*>(table)[id * row_len + i]);
    else
      v = dev::bf16_bits(reinterpret_cast<const uint16_t*>(table)[id * row_len + i]);
  }
  out[(int64_t)blockIdx.y * ldo + i] = v;
}

}  // namespace

void get_rows(DType type, const void* table, int64_t n_rows, int64_t row_len, const int32_t* ids,
              int64_t n_ids, float* out, int64_t ldo, cudaStream_t stream) {
  XPERT_CU_ASSERT(ldo >= row_len);
  if (n_ids == 0 || row_len == 0) return;
  if (n_ids > 65535) fail_cat("CUDA get_rows: ", n_ids, " ids in one call (at most 65535)");
  const auto* t = static_cast<const uint8_t*>(table);
  if (row_len % dtype_info(type).block_size != 0)
    fail_cat("CUDA get_rows: a row of ", row_len, " elements is not whole ", dtype_name(type), " blocks");
  // The group kernel writes 16-byte vectors and reads float tables 16 bytes at a time.
  const bool vec_ok = row_len % 32 == 0 && ldo % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(table) % 16 == 0;
  const bool ok = dev::dispatch_type(type, [&]<DType T>() {
    if (vec_ok) {
      const int n_groups = (int)(row_len / 32);
      const dim3 grid((unsigned)((n_groups + 63) / 64), (unsigned)n_ids);
      get_rows_kernel<T><<<grid, 64, 0, stream>>>(t, n_rows, row_bytes(T, row_len), n_groups, ids, out, ldo);
    } else if constexpr (!dev::is_quant(T)) {
      const dim3 grid((unsigned)((row_len + 255) / 256), (unsigned)n_ids);
      get_rows_scalar_kernel<T><<<grid, 256, 0, stream>>>(t, n_rows, row_len, ids, out, ldo);
    } else {
      fail_cat("CUDA get_rows: ", dtype_name(T), " tables need 16-byte aligned table and output rows");
    }
    XPERT_CUDA_CHECK_LAUNCH();
  });
  if (!ok) fail_cat("CUDA get_rows: type ", dtype_name(type), " is not supported");
}

}  // namespace xpert::cuda
