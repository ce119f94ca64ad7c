// AVX2 + FMA + F16C kernels (Haswell and later, Zen 1 and later). The code is in matmul_simd.inl.
#define XP_SIMD_TABLE_NAME matmul_kernels_avx2
#define XP_SIMD_ISA_LABEL "avx2"
#include "backend/cpu/matmul_simd.inl"
