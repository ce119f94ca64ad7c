// The native GPTQ kernel with AVX-512F/BW + VNNI: 512-bit vectors of 16 outputs, dpbusd; 32 registers: 4
// vectors x 1 row at decode, 2 x 4 rows at prefill.
#define XP_GPTQ_KERNEL_NAME gptq_kernel_avx512
#define XP_GPTQ_512 1
#define XP_GPTQ_C1 4
#define XP_GPTQ_C 2
#define XP_GPTQ_T 4
// GCC 12 flags the _mm512_undefined_* inside the 512-bit intrinsic headers as "maybe uninitialized".
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "backend/cpu/matmul_gptq_simd.inl"
