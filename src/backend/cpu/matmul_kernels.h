// Internal to the CPU matmul: the per-ISA kernel tables and the packed activation layout they read.
//
// X is quantized once per call (quantize_row_activation: the integers llama.cpp's x86 build uses) and then
// stored in planes, so the kernels load quants with aligned-ish 32-byte loads and scales without f16
// conversion. One packed row per X row, rows kPackAlign-aligned:
//   Q8_0 : qs int8[k] | d f32[k/32] | neg_sum int32[k/32]   (-sum of the block's quants: folds weight offsets)
//   Q8_K : qs int8[k] | d f32[k/256] | bsums int16[k/16]
//   F32, F16, BF16 : f32[k], the value rounded through the activation type.
// When the panel kernels below run, each row also gets an aux plane (aux_offset), per weight type:
//   Q4_0 / Q5_0 / Q8_0 : int32[k/32], -offset * sum(a) per block (offset 8 / 16 / 128)
//   Q4_K / Q5_K        : none (the mins multiply the bsums pairs)
//   Q6_K               : int32[k/16], -32 * sum(a) per 16
#pragma once
#include <cstddef>
#include <cstdint>

namespace xpert::cpu {

constexpr size_t kPackAlign = 64;

struct PackedLayout {
  size_t d_offset = 0;    // bytes from the row start to the scale plane
  size_t sum_offset = 0;  // bytes from the row start to the sum / bsums plane
  size_t aux_offset = 0;  // bytes from the row start to the panel kernels' aux plane (0: none)
  size_t row_bytes = 0;   // stride between packed rows
};

// Y[i * ldy + j] = dot(W row j, packed X row i) for j < n_w, i < n_x.
using TileKernel = void (*)(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                            const PackedLayout& x_layout, int64_t n_x, float* y, int64_t ldy);

struct MatmulKernels {
  const char* name;
  TileKernel f32, f16, bf16, q4_0, q5_0, q8_0, q4_k, q5_k, q6_k;
};

// Each lives in its own translation unit (matmul_scalar.cpp, matmul_avx2.cpp, matmul_avx512.cpp); the avx
// ones may only be called after best_isa() said so.
const MatmulKernels& matmul_kernels_scalar();
const MatmulKernels& matmul_kernels_avx2();
const MatmulKernels& matmul_kernels_avx512();

// Prefill (many X rows): a kernel takes one panel of n_w <= kPanelRows weight rows, repacks it into
// `scratch` (panel_scratch_bytes(k), 64-byte aligned), then multiplies it with all n_x packed X rows (which
// carry the aux plane). Only where the ISA has them (matmul_panel_avx512.cpp); null entries use the tiles.
constexpr int64_t kPanelRows = 16;
constexpr size_t panel_scratch_bytes(int64_t k) { return (size_t)(kPanelRows * k) * 21 / 16 + 64; }

using PanelKernel = void (*)(int64_t k, const uint8_t* w, size_t w_row_bytes, int64_t n_w, const uint8_t* x,
                             const PackedLayout& x_layout, int64_t n_x, float* y, int64_t ldy, uint8_t* scratch);

struct PanelKernels {
  PanelKernel q4_0 = nullptr, q5_0 = nullptr, q8_0 = nullptr, q4_k = nullptr, q5_k = nullptr, q6_k = nullptr;
};

const PanelKernels& matmul_panel_kernels_avx512();

// AMX-INT8 prefill kernels (matmul_amx.cpp), the same PanelKernel contract with two more conditions: the
// packed X must be readable for n_x rounded up to kAmxXRows rows (a tile loads 16 X rows; the rows past n_x
// are computed and dropped), and only called when amx_enabled() (base/cpu_features.h). They give the same
// floats as the VNNI panels, bit for bit: the same integer sums, then the same float steps in the same order.
constexpr int64_t kAmxXRows = 16;
const PanelKernels& matmul_panel_kernels_amx();

// The 64-byte operand of ldtilecfg (Intel SDM, "Tile Configuration"): palette 1 has 8 tiles of at most 16
// rows x 64 bytes; colsb is a tile's bytes per row.
struct AmxTileConfig {
  uint8_t palette = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

// For tests on CPUs without AMX: the AMX kernels with each tile instruction handed to these functions (tile
// numbers 0..7), so packing, tile shapes and the float epilogue run everywhere AVX-512 does. The functions
// must keep tile state per thread, as the hardware does.
struct AmxEmulator {
  void (*load_config)(const AmxTileConfig& config);        // ldtilecfg
  void (*load)(int tile, const void* base, size_t stride);  // tileloadd
  void (*zero)(int tile);                                   // tilezero
  void (*dp_bssd)(int c, int a, int b);                     // tdpbssd: c += a (s8) x b (s8, 4-byte pairs)
  void (*store)(int tile, void* base, size_t stride);       // tilestored
  void (*release)();                                        // tilerelease
};
void set_amx_emulator(const AmxEmulator* emulator);  // not owned; null: none
const PanelKernels& matmul_panel_kernels_amx_emulated();

// Which prefill kernels cpu::matmul runs, for tests and benches (process-wide, like set_isa_cap):
//   automatic : AMX from kAmxMinRows X rows on where amx_enabled() (not Q6_K), else the VNNI panels (default)
//   vnni      : the VNNI panels only
//   amx       : AMX at every panel size (8+ rows) where amx_enabled(), else the VNNI panels
//   amx_emulated : the AMX kernels through set_amx_emulator's functions at every panel size
enum class PanelChoice { automatic, vnni, amx, amx_emulated };
void set_panel_choice(PanelChoice choice);
// Measured on the H200 host's Xeon (16 cores, docs/perf-history/h200.md "AMX tiles"): the tiles beat the
// VNNI panels by 1.03-1.23x at 512 rows, but not reliably below ~48 rows (0.66-1.21x at 8..128, noisy), and
// Q6_K's tiles are slower at every size (0.85-0.89x: its 16-element scale groups halve the tile depth).
constexpr int64_t kAmxMinRows = 256;
// Q4_K and Q6_K on AVX-512: up to this many X rows the decode kernels over 2-3 rows at once
// (matmul_avx512.cpp), from here on (automatic choice) the panels. 2-core Xeon, the default model, pp M t/s
// with the panels from 8 rows against the rows kernels up to 19 (interleaved, 2026-12-04): M = 8 40.0 ->
// 68.6, 10 47.1 -> 68.0, 12 53.3 -> 75.5, 15 62.5 -> 77.0, 16 65.8 -> 75.3; at 20 even (76.5 / 77.3); from
// 24 on the panels win (24: 84.0 against 79.6, 31: 94.8 against 77.7).
constexpr int64_t kFewRowsMax = 19;

// One X row quantized straight into its packed planes (aux included when l.aux_offset != 0), bit for bit
// what matmul.cpp's portable packing writes; AVX-512 only (matmul_pack_avx512.cpp). level_offset: the
// weight levels' offset the Q8_0 aux plane folds in. A Q8_K aux plane is Q6_K's.
void pack_row_q8_0_avx512(const float* x, int64_t k, const PackedLayout& l, int32_t level_offset, uint8_t* out);
void pack_row_q8_k_avx512(const float* x, int64_t k, const PackedLayout& l, uint8_t* out);

}  // namespace xpert::cpu
