// Placeholder until the SIMD kernels land: the scalar table.
#include "backend/cpu/matmul_kernels.h"

namespace xpert::cpu {
const MatmulKernels& matmul_kernels_avx2() { return matmul_kernels_scalar(); }
}  // namespace xpert::cpu
