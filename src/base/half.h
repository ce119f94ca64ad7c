// IEEE half and bfloat16 <-> float, bit-exact with F16C (round to nearest even) and ggml's bf16.
#pragma once
#include <cstdint>
#include <cstring>

namespace xpert {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000 | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_to_f32(sign);
    // subnormal: normalize
    int e = -1;
    do {
      e++;
      man <<= 1;
    } while ((man & 0x400) == 0);
    return bits_to_f32(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13));
  }
  return bits_to_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x = f32_to_bits(f);
  const uint16_t sign = (x >> 16) & 0x8000;
  x &= 0x7fffffff;
  if (x >= 0x7f800000) return sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0);  // inf / nan
  if (x >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: overflow to inf
  if (x < 0x38800000) {  // below the smallest normal half: subnormal or zero
    if (x < 0x33000000) return sign;  // < 2^-25 rounds to zero
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (112 - e)
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return sign | (uint16_t)h;
  }
  // normal: rebias exponent, round mantissa to nearest even
  uint32_t h = ((x >> 13) - (112u << 10));
  const uint32_t rem = x & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return sign | (uint16_t)h;
}

inline float bf16_to_f32(uint16_t b) { return bits_to_f32((uint32_t)b << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);  // quiet nan
  return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

}  // namespace xpert
