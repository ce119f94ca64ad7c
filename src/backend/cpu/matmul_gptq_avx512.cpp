// The native GPTQ kernel with AVX-512VL + VNNI (dpbusd; 32 registers: 4 tiles x 1 row at decode, 2 x 4 at
// prefill).
#define XP_GPTQ_KERNEL_NAME gptq_kernel_avx512
#define XP_GPTQ_C1 4
#define XP_GPTQ_C 2
#define XP_GPTQ_T 4
#include "backend/cpu/matmul_gptq_simd.inl"
