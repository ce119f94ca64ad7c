// One-row products of very many Q6_K rows (an output head: Qwen3's 151,936 x 2,048, 255 MB a token) with
// the weights streamed through shared memory by bulk copies (sm_90's cp.async.bulk, completed on an
// mbarrier) instead of each lane's 16-byte loads: a CTA per SM walks its groups of kRows rows through a
// ring of stages, each stage one bulk copy per Q6_K field (weight_layout.h stores them field by field, so
// a group's rows are four contiguous runs), the next groups in flight while it multiplies one. The lanes
// then do what the decode product does with the same chunks in the same order (16 lanes a row, chunks sub,
// sub + 16, ..., the same shuffle sum), so the same bits as matmul_decode.cu's head form.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda::detail {
namespace {

using dev::ActView;
using dev::Dot;
using dev::Q6Row;

// 512 threads (32 rows a stage, 4 stages of 54 KB at Qwen3's 2,048): H200 tg128 of qwen3-30b-a3b 643.1 /
// 639.9 against 635.8 / 636.9 at 256 (16 rows, 7 stages), whose 8 warps left the head no faster than the
// lanes' loads (2026-12-02).
constexpr int kThreads = 512;
constexpr int kLanes = 16;                // lanes a row (matmul_decode.cu's head form)
constexpr int kRows = kThreads / kLanes;  // rows a group (a stage)
constexpr int kMaxStages = 8;

// The bulk copy engine and its barriers: sm_90+ only, as the kernel that uses them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, unsigned bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
#endif

// Dynamic shared memory: `stages` stages of kRows rows (ql, qh, sc, d of the group, each contiguous), then
// an mbarrier per stage.
__global__ void __launch_bounds__(kThreads)
    stream_q6k_kernel(const uint8_t* __restrict__ w, int64_t n, int nb, ActView a, float* __restrict__ y,
                      int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t groups = n / kRows;
  const size_t row_bytes = (size_t)nb * sizeof(quant::BlockQ6_K), stage_bytes = kRows * row_bytes;
  const uint32_t base = smem_addr(smem), bars = base + (uint32_t)(stages * stage_bytes);
  const unsigned ql_b = kRows * nb * 128, qh_b = kRows * nb * 64, sc_b = kRows * nb * 16,
                 d_b = kRows * nb * 2;
  // The CTA's i-th group (blockIdx.x + i * gridDim.x) into stage i % stages.
  auto issue = [&](int i) {
    const int64_t g = blockIdx.x + (int64_t)i * gridDim.x;
    if (g >= groups) return;
    const int s = i % stages;
    const uint32_t bar = bars + 8 * s, dst = base + (uint32_t)(s * stage_bytes);
    const Q6Row q = dev::row_at<DType::Q6_K>(w, g * kRows, n, row_bytes);
    mbar_expect_tx(bar, (unsigned)stage_bytes);
    bulk_copy(dst, q.ql, ql_b, bar);
    bulk_copy(dst + ql_b, q.qh, qh_b, bar);
    bulk_copy(dst + ql_b + qh_b, q.sc, sc_b, bar);
    bulk_copy(dst + ql_b + qh_b + sc_b, q.d, d_b, bar);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    // Weights only: no kernel writes them, so the first stages start before the wait.
    for (int i = 0; i < stages; ++i) issue(i);
  }
  __syncthreads();
  pdl_begin();  // the activations come from the kernel before
  const int lr = threadIdx.x / kLanes, sub = threadIdx.x % kLanes,
            nc = nb * quant::kQKK / Dot<DType::Q6_K>::kElems;
  for (int i = 0;; ++i) {
    const int64_t g = blockIdx.x + (int64_t)i * gridDim.x;
    if (g >= groups) break;
    const int s = i % stages;
    mbar_wait(bars + 8 * s, (unsigned)(i / stages) & 1);
    const unsigned char* st = smem + s * stage_bytes;
    const Q6Row q{st + lr * nb * 128, st + ql_b + lr * nb * 64, st + ql_b + qh_b + lr * nb * 16,
                  st + ql_b + qh_b + sc_b + lr * nb * 2};
    float acc[1] = {0.0f};
    for (int c = sub; c < nc; c += kLanes)
      Dot<DType::Q6_K>::template mul<1>(Dot<DType::Q6_K>::load_shared(q, c), c, a, 1, acc);
#pragma unroll
    for (int off = kLanes / 2; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
    if (sub == 0) y[g * kRows + lr] = acc[0];
    __syncthreads();                                  // every lane is done with stage s
    if (threadIdx.x == 0) issue(i + stages);
  }
#endif
}

}  // namespace

bool launch_matvec_stream(DType w_type, const void* w, int64_t n, const Activations& a, float* y,
                          cudaStream_t stream) {
  const int64_t nb = a.k / quant::kQKK;
  if (w_type != DType::Q6_K || a.m != 1 || a.format != ActFormat::q8_1 || a.k % quant::kQKK != 0 ||
      n % kRows != 0 || n / kRows > INT32_MAX || ((uintptr_t)w & 15) != 0 || cc_major() < 9)
    return false;
  const size_t stage_bytes = kRows * (size_t)nb * sizeof(quant::BlockQ6_K);
  const int stages = (int)std::min<size_t>(kMaxStages, ((size_t)max_smem_optin() - 64) / (stage_bytes + 8));
  if (stages < 2) return false;
  const size_t smem = stages * (stage_bytes + 8);
  set_smem_limit((const void*)stream_q6k_kernel, smem);
  const int64_t groups = n / kRows;
  const unsigned grid = (unsigned)std::min<int64_t>(groups, sm_count());
  const ActView av{a.data, reinterpret_cast<const float2*>(a.aux), a.k};
  launch_pdl(stream_q6k_kernel, dim3(grid), kThreads, smem, stream, static_cast<const uint8_t*>(w), n,
             (int)nb, av, y, stages);
  XPERT_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace xpert::cuda::detail
