// The native GPTQ kernel for AVX2 + FMA + F16C (16 registers: 2 tiles x 1 row at decode, 1 x 3 at prefill).
#define XP_GPTQ_KERNEL_NAME gptq_kernel_avx2
#define XP_GPTQ_C1 2
#define XP_GPTQ_C 1
#define XP_GPTQ_T 3
#include "backend/cpu/matmul_gptq_simd.inl"
