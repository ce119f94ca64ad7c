#include "quant/dtype.h"

#include "base/error.h"

namespace xpert {
namespace {

// Indexed by the ggml type id; empty name = unknown id.
constexpr DTypeInfo kInfo[] = {
    {"F32", 1, 4, true},        // 0
    {"F16", 1, 2, true},        // 1
    {"Q4_0", 32, 18, true},     // 2
    {"Q4_1", 32, 20, false},    // 3
    {"", 0, 0, false},          // 4 (removed Q4_2)
    {"", 0, 0, false},          // 5 (removed Q4_3)
    {"Q5_0", 32, 22, true},     // 6
    {"Q5_1", 32, 24, false},    // 7
    {"Q8_0", 32, 34, true},     // 8
    {"Q8_1", 32, 36, false},    // 9
    {"Q2_K", 256, 84, false},   // 10
    {"Q3_K", 256, 110, false},  // 11
    {"Q4_K", 256, 144, true},   // 12
    {"Q5_K", 256, 176, true},   // 13
    {"Q6_K", 256, 210, true},   // 14
    {"Q8_K", 256, 292, false},  // 15 (activations only)
    {"IQ2_XXS", 256, 66, false},  // 16
    {"IQ2_XS", 256, 74, false},   // 17
    {"IQ3_XXS", 256, 98, false},  // 18
    {"IQ1_S", 256, 50, false},    // 19
    {"IQ4_NL", 32, 18, false},    // 20
    {"IQ3_S", 256, 110, false},   // 21
    {"IQ2_S", 256, 82, false},    // 22
    {"IQ4_XS", 256, 136, false},  // 23
    {"I8", 1, 1, false},          // 24
    {"I16", 1, 2, false},         // 25
    {"I32", 1, 4, false},         // 26
    {"I64", 1, 8, false},         // 27
    {"F64", 1, 8, false},         // 28
    {"IQ1_M", 256, 56, false},    // 29
    {"BF16", 1, 2, true},         // 30
};

// Indexed by id - 200: per group of one output, g/2 bytes of nibbles + an f16 scale (+ a zero byte).
constexpr DTypeInfo kGptqInfo[] = {
    {"GPTQ4_G32", 32, 18, true},   {"GPTQ4_G64", 64, 34, true},   {"GPTQ4_G128", 128, 66, true},
    {"GPTQ4Z_G32", 32, 19, true},  {"GPTQ4Z_G64", 64, 35, true},  {"GPTQ4Z_G128", 128, 67, true},
};

}  // namespace

const DTypeInfo* dtype_info(uint32_t raw) {
  if (raw >= sizeof(kInfo) / sizeof(kInfo[0]) || kInfo[raw].block_size == 0) return nullptr;
  return &kInfo[raw];
}

const DTypeInfo& dtype_info(DType t) {
  if (is_gptq(t)) return kGptqInfo[(uint32_t)t - 200];
  const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
  XP_ASSERT(i != nullptr);
  return *i;
}

}  // namespace xpert
