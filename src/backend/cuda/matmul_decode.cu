// Decode products (few X rows): one weight row per group of lanes, W streamed once straight from global
// memory in 16-byte pieces, each piece multiplied with every X row before the next is needed.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda::detail {
namespace {

using dev::ActView;
using dev::Dot;

constexpr int kWarps = 4;
// Chunks in flight a lane (dev::dot_row). H200, tg128 with the MoE kernels at 2: qwen3-30b-a3b 433 / 424 /
// 418 t/s and qwen3.5-35b-a3b 382 / 367 / 359 at 1 / 2 / 4.
constexpr int kBatch = 1;

// Lanes per row: 2^lpr_log2 (4..32); rows per warp: 32 / lanes. blockIdx.y picks the M rows of X. The rows
// of up to kMaxOuts matrices of one type and row length are one range (q, k and v of a layer in one
// launch): global row r belongs to the first output whose `end` is above it.
// The body of a block bx of that grid (matvec_pair_kernel runs two grids' blocks in one launch).
template <DType T, int M, int B = kBatch>
__device__ __forceinline__ void matvec_block(const MatvecOuts& o, size_t row_bytes, int nc, const ActView& a,
                                             const float* __restrict__ row_scale, int64_t m, int lpr_log2,
                                             bool prefetch, int64_t bx) {
  if (prefetch && blockIdx.y == 0 &&
      threadIdx.x < o.count) {  // this CTA's rows of output j = threadIdx.x, fetched early
    const int j = threadIdx.x;
    const int64_t rows = (int64_t)kWarps * (32 >> lpr_log2), r0 = bx * rows;
    const int64_t begin = j ? o.end[j - 1] : 0, lo = max(r0, begin), hi = min(r0 + rows, o.end[j]);
    if (lo < hi) dev::prefetch_rows<T>(o.w[j], lo - begin, hi - lo, o.end[j] - begin, row_bytes);
  }
  pdl_begin();
  constexpr int kActBytes = dev::is_quant(T) ? 1 : T == DType::F32 ? 4 : 2;
  const int lpr = 1 << lpr_log2;
  const int lane = threadIdx.x & 31;
  const int64_t gr = (bx * kWarps + threadIdx.x / 32) * (32 >> lpr_log2) + (lane >> lpr_log2);
  int j = 0;
  while (j + 1 < o.count && gr >= o.end[j]) ++j;
  const int64_t begin = j ? o.end[j - 1] : 0, row = gr - begin;
  const bool have = gr < o.end[o.count - 1];
  const int sub = lane & (lpr - 1);
  const int64_t m0 = (int64_t)blockIdx.y * M;
  const int mm = (int)min((int64_t)M, m - m0);
  ActView av = a;
  av.data = static_cast<const char*>(a.data) + m0 * a.k * kActBytes;
  if (a.ds) av.ds = a.ds + m0 * (a.k / 32);

  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  if (have) {
    dev::dot_row<T, M, B>(dev::row_at<T>(o.w[j], row, o.end[j] - begin, row_bytes), sub, lpr, nc, av, mm,
                          acc);
  }
  for (int off = lpr >> 1; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
  }
  if (have && sub == 0) {
    float* y = o.y[j];
    const int64_t ldy = o.ldy[j];
#pragma unroll
    for (int i = 0; i < M; ++i)
      if (i < mm) y[(m0 + i) * ldy + row] = acc[i] * (row_scale ? row_scale[m0 + i] : 1.0f);
  }
}

template <DType T, int M, int B = kBatch>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_kernel(MatvecOuts o, size_t row_bytes, int nc, ActView a, const float* __restrict__ row_scale,
                  int64_t m, int lpr_log2, bool prefetch) {
  matvec_block<T, M, B>(o, row_bytes, nc, a, row_scale, m, lpr_log2, prefetch, blockIdx.x);
}

// Two matvec grids of one q8_1 row in one launch: blocks below blocks0 are grid 0's (type T0), the rest
// grid 1's, each with its own lanes per row: the same arithmetic, so the same bits, as two launches.
struct MatvecGrid {
  MatvecOuts o;
  size_t row_bytes;
  int nc, lpr_log2;
};
template <DType T0, DType T1>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_pair_kernel(MatvecGrid g0, MatvecGrid g1, ActView a0, ActView a1, unsigned blocks0,
                       bool prefetch) {
  if (blockIdx.x < blocks0)
    matvec_block<T0, 1>(g0.o, g0.row_bytes, g0.nc, a0, nullptr, 1, g0.lpr_log2, prefetch, blockIdx.x);
  else
    matvec_block<T1, 1>(g1.o, g1.row_bytes, g1.nc, a1, nullptr, 1, g1.lpr_log2, prefetch,
                        blockIdx.x - blocks0);
}

// What the kernels read of prepared activations: the values (and q8_1 scales) and, for f16 / bf16 rows,
// each row's scale.
template <DType T>
ActView act_view(const Activations& a) {
  return {a.data, dev::is_quant(T) ? reinterpret_cast<const float2*>(a.aux) : nullptr, a.k};
}
const float* row_scale_of(const Activations& a) {
  return a.format == ActFormat::f16 || a.format == ActFormat::bf16 ? a.aux : nullptr;
}

// Lanes per row: 32 down to 4, at least 2 chunks a lane.
int lanes_log2(int nc) {
  int lpr_log2 = 5;
  while (lpr_log2 > 2 && nc < (2 << lpr_log2)) --lpr_log2;
  return lpr_log2;
}

// One-row products of at least kHeadRows outputs (an output head: Qwen3's 151,936 rows of 2,048, Q6_K) at
// 16 lanes a row with two chunks' loads in flight a lane, 8 rows a CTA: the rule's 32 lanes (two chunks a
// lane, 4 rows a CTA) made 37,984 CTAs of almost no work each. H200 tg128, two rounds each, 2026-12-01:
// qwen3-30b-a3b 586.0 / 592.7 against 584.5 / 584.1, qwen3.5-35b-a3b 542.0 / 541.6 against 535.8 / 528.3;
// 8 lanes at one or four chunks in flight and 4 lanes at four were between, 32 lanes at two slower.
constexpr int64_t kHeadRows = 65536;
constexpr int kHeadLanesLog2 = 4, kHeadBatch = 2;

template <DType T, int M>
void launch(const MatvecOuts& o, const Activations& a, cudaStream_t stream) {
  const int nc = (int)(a.k / Dot<T>::kElems);
  const int64_t n = o.end[o.count - 1];
  const bool head = M == 1 && n >= kHeadRows && nc >= (kHeadBatch << kHeadLanesLog2);
  if (head && o.count == 1 && launch_matvec_stream(T, o.w[0], n, a, o.y[0], stream)) return;
  const int lpr_log2 = head ? kHeadLanesLog2 : lanes_log2(nc);
  const int64_t rows_per_cta = kWarps * (32 >> lpr_log2);
  const dim3 grid((unsigned)((n + rows_per_cta - 1) / rows_per_cta), (unsigned)((a.m + M - 1) / M));
  XPERT_CU_ASSERT(grid.y <= 65535);
  const ActView av = act_view<T>(a);
  const float* row_scale = row_scale_of(a);
  auto* kernel = matvec_kernel<T, M>;
  if constexpr (M == 1)
    if (head) kernel = matvec_kernel<T, 1, kHeadBatch>;
  launch_pdl(kernel, grid, kWarps * 32, 0, stream, o, row_bytes(T, a.k), nc, av, row_scale, a.m, lpr_log2,
             prefetch_enabled());
  XPERT_CUDA_CHECK_LAUNCH();
}

template <DType T>
MatvecGrid grid_of(const MatvecOuts& o, const Activations& a, unsigned& blocks) {
  MatvecGrid g{.o = o, .row_bytes = row_bytes(T, a.k), .nc = (int)(a.k / Dot<T>::kElems), .lpr_log2 = 0};
  g.lpr_log2 = lanes_log2(g.nc);
  const int64_t rows_per_cta = kWarps * (32 >> g.lpr_log2);
  blocks = (unsigned)((o.end[o.count - 1] + rows_per_cta - 1) / rows_per_cta);
  return g;
}

}  // namespace

bool matvec_pair_supported(DType t0, DType t1, const Activations& a) {
  return a.m == 1 && a.format == ActFormat::q8_1 &&
         ((t0 == DType::Q4_K && t1 == DType::Q6_K) || (t0 == DType::Q6_K && t1 == DType::Q4_K));
}

void launch_matvec_pair(DType t0, const MatvecOuts& o0, DType t1, const MatvecOuts& o1, const Activations& a,
                        cudaStream_t stream) {
  if (!matvec_pair_supported(t0, t1, a)) fail_cat("CUDA matmul: no paired launch for these types");
  if (t0 == DType::Q6_K) return launch_matvec_pair(t1, o1, t0, o0, a, stream);  // Q4_K's blocks first
  XPERT_CU_ASSERT(o0.count >= 1 && o1.count >= 1);
  unsigned b0 = 0, b1 = 0;
  const MatvecGrid g0 = grid_of<DType::Q4_K>(o0, a, b0), g1 = grid_of<DType::Q6_K>(o1, a, b1);
  launch_pdl(matvec_pair_kernel<DType::Q4_K, DType::Q6_K>, dim3(b0 + b1, 1), kWarps * 32, 0, stream, g0, g1,
             act_view<DType::Q4_K>(a), act_view<DType::Q6_K>(a), b0, prefetch_enabled());
  XPERT_CUDA_CHECK_LAUNCH();
}

void launch_matvec(DType w_type, const MatvecOuts& o, const Activations& a, cudaStream_t stream) {
  XPERT_CU_ASSERT(o.count >= 1 && o.count <= MatvecOuts::kMax);
  if (o.end[o.count - 1] == 0 || a.m == 0) return;
  const bool ok = dev::dispatch_type(w_type, [&]<DType T>() {
    if (a.m <= 1)
      launch<T, 1>(o, a, stream);
    else if (a.m <= 2)
      launch<T, 2>(o, a, stream);
    else if (a.m <= 4)
      launch<T, 4>(o, a, stream);
    else
      launch<T, 8>(o, a, stream);
  });
  if (!ok) fail_cat("CUDA matmul: weight type ", dtype_name(w_type), " is not supported");
}

void launch_matvec(DType w_type, const void* w, int64_t n, const Activations& a, float* y, int64_t ldy,
                   cudaStream_t stream) {
  MatvecOuts o;
  o.count = 1;
  o.w[0] = w;
  o.end[0] = n;
  o.y[0] = y;
  o.ldy[0] = ldy;
  launch_matvec(w_type, o, a, stream);
}

}  // namespace xpert::cuda::detail
