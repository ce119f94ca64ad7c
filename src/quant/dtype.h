// Tensor element types. The numbering is ggml's, so a GGUF tensor's type field maps directly.
// This is the one place that knows each format's block size and bytes; see quant/README.md for layouts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace xpert {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  // Not ggml types (a GGUF file never holds them): GPTQ INT4 matrices as Hugging Face GPTQ checkpoints
  // store them, read natively by the expert kernels (quant/gptq.h has the layout). One type per group
  // size; the Z types carry a zero point per group and output (asymmetric GPTQ).
  GPTQ4_G32 = 200,
  GPTQ4_G64 = 201,
  GPTQ4_G128 = 202,
  GPTQ4Z_G32 = 203,
  GPTQ4Z_G64 = 204,
  GPTQ4Z_G128 = 205,
};

struct DTypeInfo {
  std::string_view name;
  int64_t block_size;   // elements per block (1 for plain types)
  size_t block_bytes;   // bytes per block
  bool computable;      // xpert has kernels for it (dequantize + matmul)
};

// nullptr for a type id xpert does not know at all. Only ggml's ids: the GPTQ types are not file types.
const DTypeInfo* dtype_info(uint32_t raw_type);
const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
// The GPTQ types (see quant/gptq.h): a whole matrix, not rows of blocks; row_bytes(t, k) * n is still its
// size (a "block" is one group of one output: its k/2-byte nibbles' share, f16 scale and zero byte).
inline bool is_gptq(DType t) { return (uint32_t)t >= 200 && (uint32_t)t <= 205; }
inline int64_t gptq_group(DType t) { return int64_t{32} << (((uint32_t)t - 200) % 3); }
inline bool gptq_has_zeros(DType t) { return (uint32_t)t >= 203; }

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& i = dtype_info(t);
  return (size_t)(n / i.block_size) * i.block_bytes;
}

}  // namespace xpert
