// AVX-512 (F/BW/VL/DQ) + VNNI kernels (Ice Lake, Sapphire Rapids, Zen 4 and later): the same code as the
// AVX2 table, with dpbusd/dpwssd for the integer dot products, mask moves, and 32 vector registers.
#define XP_SIMD_TABLE_NAME matmul_kernels_avx512
#define XP_SIMD_ISA_LABEL "avx512-vnni"
#include "backend/cpu/matmul_simd.inl"
