// The one dtype switch of the reference conversions; the per-format code lives in quant_*.cpp.
#include "quant/quant.h"

#include <cstring>

#include "base/error.h"
#include "base/half.h"
#include "quant/quant_impl.h"

namespace xpert {

using namespace quant;

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  XP_ASSERT(n % info.block_size == 0);
  const int64_t nb = n / info.block_size;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, (size_t)n * 4); return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* b = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(b[i]);
      return;
    }
    case DType::Q4_0: dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); return;
    case DType::Q5_0: dequantize_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); return;
    case DType::Q8_0: dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); return;
    case DType::Q4_K: dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); return;
    case DType::Q5_K: dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); return;
    case DType::Q6_K: dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); return;
    case DType::Q8_K: dequantize_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb); return;
    default: break;
  }
  XP_ASSERT(!"dequantize_row: type without kernels");
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  XP_ASSERT(n % info.block_size == 0);
  const int64_t nb = n / info.block_size;
  switch (t) {
    case DType::F32: std::memcpy(dst, src, (size_t)n * 4); return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* b = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0: quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); return;
    case DType::Q5_0: quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), nb); return;
    case DType::Q8_0: quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); return;
    case DType::Q4_K: quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); return;
    case DType::Q5_K: quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), nb); return;
    case DType::Q6_K: quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); return;
    case DType::Q8_K: quantize_q8_k(src, static_cast<BlockQ8_K*>(dst), nb); return;
    default: break;
  }
  XP_ASSERT(!"quantize_row: type without kernels");
}

void quantize_row_activation(DType t, const float* src, void* dst, int64_t n) {
  if (t == DType::Q8_0) {
    XP_ASSERT(n % kQK == 0);
    quantize_q8_0_activation(src, static_cast<BlockQ8_0*>(dst), n / kQK);
    return;
  }
  quantize_row(t, src, dst, n);
}

DType activation_type(DType weight) {
  if (is_gptq(weight)) return DType::Q8_0;  // backend/cpu/matmul_gptq.h
  switch (weight) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0: return DType::Q8_0;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return DType::Q8_K;
    case DType::F16: return DType::F16;
    case DType::BF16: return DType::BF16;
    case DType::F32: return DType::F32;
    default: break;
  }
  XP_ASSERT(!"activation_type: type without kernels");
  return DType::F32;
}

}  // namespace xpert
