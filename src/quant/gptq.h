// GPTQ INT4 as Hugging Face GPTQ checkpoints store a linear layer y = W x, W [n][k]:
//   qweight int32 [k/8][n]: element (row j, column i) is nibble i%8 of qweight[i/8][j], low nibble first
//   scales  f16   [k/group][n]
//   qzeros  int32 [k/group][n/8]: zero point of (group, output j) = nibble j%8 of qzeros[group][j/8]
//           + zero_offset (1 in the original "gptq" format, 0 in "gptq_v2")
//   value   W[j][i] = (nibble - zero) * scales[i/group][j]
// Symmetric checkpoints (sym = true) have every zero point 8: qzeros is checked and dropped. g_idx int32
// [k] must be i / group (desc_act = false, no act-order); act-order checkpoints are refused.
//
// Natively (DType GPTQ4_G*, GPTQ4Z_G* with group 32, 64 or 128), one matrix is its tensors as stored,
// back to back: qweight [k/8][n] u32 | scales [k/group][n] f16 | (Z types) zeros [k/group][n] u8, the zero
// point itself (offset applied: 0..16). 4.125 bits per weight at group 128 (+0.0625 with zeros); the expert
// kernels of the CPU (backend/cpu/matmul_gptq*), the OpenCL expert device (kernels_expert.h) and CUDA
// (backend/cuda/moe_gptq.cu) read it as it is.
//
// With a group size that is a multiple of 32, every 32 consecutive inputs of a row share one scale, so
// the layer is exactly a GGUF Q4_0 tensor (d = the group's f16 scale, q = the nibble, value = (q - 8) d):
// repack_q4_0 transposes the K-major nibbles into Q4_0 rows without changing a single value, and every
// Q4_0 kernel runs it. The cost is one f16 scale per 32 inputs instead of per group: 4.5 bits per weight
// instead of ~4.125 at group 128 (+9 %).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "quant/dtype.h"

namespace xpert::gptq {

struct Config {
  int64_t group_size = 128;  // -1 in the file: one group over all of k
  int zero_offset = 1;       // added to a stored zero point: 1 for "gptq" (v1), 0 for "gptq_v2"
  bool sym = true;           // false: qzeros hold a zero point per group and output
  std::string format = "gptq";
};

// Reads config.json's quantization_config. Anything but 4-bit GPTQ without act-order throws Error naming
// the field and its value. `source` prefixes the messages (the config file).
Config parse_config(const nlohmann::json& qc, std::string_view source);

// One layer's raw tensors (pointers into the checkpoint, any alignment) and its sizes.
struct Layer {
  const uint8_t* qweight = nullptr;  // int32 [k/8][n]
  const uint8_t* scales = nullptr;   // f16 [k/group][n]
  const uint8_t* qzeros = nullptr;   // int32 [k/group][n/8]; null: symmetric (every zero point 8)
  int64_t k = 0, n = 0, group = 0;   // group divides k; repack_q4_0 needs it a multiple of 32
  int zero_offset = 1;               // added to a stored zero point (Config::zero_offset)
};

// The 4-bit code (0..15) of W[j][i], and the zero point it is read against (8 when symmetric).
int nibble(const Layer& l, int64_t j, int64_t i);
int zero_point(const Layer& l, int64_t j, int64_t i);
// W as floats, [n][k] row-major: the obvious dequantization of the raw layout (the reference).
void dequantize_reference(const Layer& l, float* out);

// Q4_0 rows of W (ggml's BlockQ4_0, k/32 blocks per row). Output row r is W's row row_map[r] (row r when
// row_map is empty, which then covers all n rows); output block b of a row holds W's inputs
// 32*block_map[b] .. +31 (block b when block_map is empty). So a permutation of rows, or of 32-wide
// column blocks, costs nothing extra. dst: row_map rows (n when empty) of k/32 * 18 bytes.
void repack_q4_0(const Layer& l, std::span<const int64_t> row_map, std::span<const int64_t> block_map,
                 void* dst);

// The native type of a layer (zeros: asymmetric), or F32 when its group size has none (then only the
// symmetric Q4_0 repack reads it).
DType native_type(int64_t group, bool zeros);
// The native bytes of l (row_bytes(t, k) * n of them) in the layout above. t = native_type(l.group, ...).
void write_native(const Layer& l, DType t, uint8_t* dst);
// A native matrix's planes.
struct NativeView {
  const uint8_t* qweight;  // u32 [k/8][n]
  const uint8_t* scales;   // f16 [k/group][n]
  const uint8_t* zeros;    // u8 [k/group][n]; null for the symmetric types
};
NativeView native_view(DType t, const void* data, int64_t k, int64_t n);
// A native matrix as floats, [n][k] row-major (the reference the kernels are tested against).
void dequantize_native(DType t, const void* data, int64_t k, int64_t n, float* out);

// Throws Error (naming `name`) unless every zero point in qzeros [k/group][n/8] is the symmetric 8 (sym = true).
void check_qzeros(const uint8_t* qzeros, int64_t n_groups, int64_t n, int zero_offset, std::string_view name);
// Throws Error (naming `name`) unless g_idx[i] == i / group for all i < k (no act-order).
void check_g_idx(const uint8_t* g_idx, int64_t k, int64_t group, std::string_view name);

}  // namespace xpert::gptq
