// Byte layouts of the quantized blocks, identical to ggml's (ggml-common.h), so GGUF tensor data is read in
// place. Scales are raw IEEE half bits (uint16_t) to keep the structs trivially copyable and header-light.
// Table of fields: quant/README.md.
#pragma once
#include <cstdint>

namespace xpert::quant {

constexpr int kQK = 32;    // elements per legacy block (Q4_0, Q5_0, Q8_0)
constexpr int kQKK = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;             // f16 scale
  uint8_t qs[kQK / 2];    // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ5_0 {
  uint16_t d;             // f16 scale
  uint8_t qh[4];          // bit 4 of element j (little-endian uint32, bit j)
  uint8_t qs[kQK / 2];    // low 4 bits, as Q4_0
};
struct BlockQ8_0 {
  uint16_t d;             // f16 scale
  int8_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d, dmin;       // f16 super-scales of the 6-bit sub-block scales and mins
  uint8_t scales[12];     // 8 x (6-bit scale, 6-bit min), packed (see unpack_scale_min_k4)
  uint8_t qs[kQKK / 2];   // 4 chunks of 64: element c*64+l low nibble of qs[c*32+l], c*64+32+l high
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];     // as Q4_K
  uint8_t qh[kQKK / 8];   // bit 4: element c*64+l at bit 2c of qh[l], c*64+32+l at bit 2c+1
  uint8_t qs[kQKK / 2];   // low 4 bits, as Q4_K
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];   // low 4 bits
  uint8_t qh[kQKK / 4];   // high 2 bits
  int8_t scales[kQKK / 16];  // 16 signed 8-bit scales, one per 16 elements
  uint16_t d;             // f16 super-scale
};
struct BlockQ8_K {
  float d;                // f32 scale (activation format: never stored in files)
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];  // sum of each 16 quants, lets K-quant mins be applied per block
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block: j < 4 sit in the low 6 bits of
// bytes j and j+4; j >= 4 keep their low 4 bits in byte j+4 and their top 2 bits in the spare top bits
// of bytes j-4 (scale) and j (min).
inline void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace xpert::quant
