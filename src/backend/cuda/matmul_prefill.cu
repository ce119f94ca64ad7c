// Prefill products on tensor cores: a 64 x 64 output tile per CTA (4 warps of 32 x 32), k in steps of 64.
// X tiles (f16, or bf16 for BF16 weights) arrive by cp.async; W tiles are loaded as raw GGUF bytes into
// registers one step ahead, dequantized after the current step's mma and stored to the other shared
// buffer, so loads of the next step overlap the tensor-core work of this one.
// Dual mode multiplies one X tile by two matrices (gate and up) and writes silu(gate) * up.
// Grouped mode maps each CTA to (group, row tile) through group_tiles: experts' row groups in one launch.
// Multi-output mode (GemmArgs::outs) maps each column tile to one of up to 4 matrices over the same X.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda::detail {
namespace {

using dev::Deq;

constexpr int BN = kGemmBN, BK = 64;
constexpr int LDS = BK + 8;  // row stride in 16-bit elements: 144 bytes keeps ldmatrix free of bank conflicts
constexpr int kThreads = 128;
constexpr size_t smem_bytes_of(bool dual, int bm) {
  return (size_t)(2 * bm * LDS + 2 * (dual ? 2 : 1) * BN * LDS) * 2;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t u;
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&u, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&u, &h, 4);
  }
  return u;
}

// BM: X rows per CTA (kGemmBM, or kGemmSmallBM for products of few rows: matmul_kernels.h). Loading W two
// k steps ahead instead of one (168 registers, three CTAs an SM instead of four) measured slower at 32 rows:
// 64 streams S_TG 2,065 against 2,170 (H200, 2026-12-04).
template <DType T, bool kDual, int BM>
__global__ void __launch_bounds__(kThreads) gemm_kernel(const GemmArgs p) {
  constexpr bool kBf16 = T == DType::BF16;
  constexpr int NW = kDual ? 2 : 1;
  constexpr int XP = BM / 16;  // X pieces of 16 bytes per thread and step
  constexpr int MT = BM / 32;  // m16 tiles per warp (warps are 2 x 2, each BM/2 rows x 32 columns)
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* xs = smem;                 // [2][BM][LDS]
  uint16_t* ws = smem + 2 * BM * LDS;  // [2][NW][BN][LDS]

  int64_t m_begin, m_end;
  const uint8_t* wmat[NW];
  if (p.group_tiles) {
    GroupTile gt;
    if (!group_tile(p, (int)blockIdx.x, BM, gt)) return;
    m_begin = gt.m_begin;
    m_end = gt.m_end;
    wmat[0] = static_cast<const uint8_t*>(p.wtab0[gt.group]);
    if constexpr (kDual) wmat[1] = static_cast<const uint8_t*>(p.wtab1[gt.group]);
  } else {
    m_begin = (int64_t)blockIdx.x * BM;
    m_end = p.m;
    wmat[0] = static_cast<const uint8_t*>(p.w0);
    if constexpr (kDual) wmat[1] = static_cast<const uint8_t*>(p.w1);
  }
  int64_t n_begin = (int64_t)blockIdx.y * BN, n_rows = p.n, ldy = p.ldy;
  float* y = p.y;
  if (!kDual && p.n_outs > 0) {  // this column tile's matrix
    int j = 0;
    while (j + 1 < p.n_outs && (int)blockIdx.y >= p.outs[j].tile_end) ++j;
    n_begin = (int64_t)(blockIdx.y - (j ? p.outs[j - 1].tile_end : 0)) * BN;
    wmat[0] = static_cast<const uint8_t*>(p.outs[j].w);
    n_rows = p.outs[j].n;
    y = p.outs[j].y;
    ldy = p.outs[j].ldy;
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  const int kg = (int)(p.k / 32), nk = (kg + 1) / 2;
  // Split k (gridDim.z CTAs of one thread block cluster): this CTA's k steps [kt_begin, kt_end).
  const int n_split = (int)gridDim.z;
  const int kt_begin = (int)((int64_t)nk * blockIdx.z / n_split),
            kt_end = (int)((int64_t)nk * (blockIdx.z + 1) / n_split);
  const size_t rb = p.row_bytes;

  // X: XP of the tile's BM * 8 16-byte pieces per thread; their source rows are fixed for the whole loop.
  const uint16_t* xsrc[XP];
  bool xok[XP];
#pragma unroll
  for (int i = 0; i < XP; ++i) {
    const int id = tid + kThreads * i, r = id >> 3;
    const int64_t gr = m_begin + r;
    xok[i] = gr < m_end;
    const int64_t xr = !xok[i] ? 0 : p.x_rows ? p.x_rows[gr] / p.x_row_div : gr;
    xsrc[i] = static_cast<const uint16_t*>(p.x) + xr * p.k + (id & 7) * 8;
  }
  auto load_x = [&](int buf, int kt) {
    uint16_t* dst = xs + buf * BM * LDS;
#pragma unroll
    for (int i = 0; i < XP; ++i) {
      const int id = tid + kThreads * i;
      const bool ok = xok[i] && kt * BK + (id & 7) * 8 < p.k;
      cp_async16(dst + (id >> 3) * LDS + (id & 7) * 8, ok ? xsrc[i] + kt * BK : p.x, ok ? 16 : 0);
    }
  };

  // W: thread = (row tid / 2, 32-element half tid % 2) of the 64 x 64 tile.
  const int wr = tid >> 1, wh = tid & 1;
  const bool wrow_ok = n_begin + wr < n_rows;
  dev::row_t<T> wrow[NW];
#pragma unroll
  for (int q = 0; q < NW; ++q) wrow[q] = dev::row_at<T>(wmat[q], n_begin + wr, n_rows, rb);
  typename Deq<T>::Raw raw[NW];
  auto load_w = [&](int kt) {
    const int g = kt * 2 + wh;
    if (wrow_ok && g < kg) {
#pragma unroll
      for (int q = 0; q < NW; ++q) raw[q] = Deq<T>::load(wrow[q], g);
    }
  };
  auto store_w = [&](int buf, int kt) {
    const bool ok = wrow_ok && kt * 2 + wh < kg;
#pragma unroll
    for (int q = 0; q < NW; ++q) {
      uint32_t packed[16];
      if (ok) {
        if constexpr (requires { Deq<T>::dequant_h2(raw[q], packed); }) {
          Deq<T>::dequant_h2(raw[q], packed);
        } else {
          float v[32];
          Deq<T>::dequant(raw[q], v);
#pragma unroll
          for (int i = 0; i < 16; ++i) packed[i] = pack2<kBf16>(v[2 * i], v[2 * i + 1]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) packed[i] = 0;
      }
      uint4* dst = reinterpret_cast<uint4*>(ws + ((buf * NW + q) * BN + wr) * LDS + wh * 32);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        dst[i] = make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]);
    }
  };

  float acc[NW][MT][4][4];
#pragma unroll
  for (int q = 0; q < NW; ++q)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][i][j][e] = 0.0f;

  auto compute = [&](int buf) {
    const uint16_t* xb = xs + buf * BM * LDS;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(af[mt], xb + (wm * (BM / 2) + mt * 16 + (lane & 15)) * LDS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int q = 0; q < NW; ++q) {
        const uint16_t* wb = ws + (buf * NW + q) * BN * LDS;
        uint32_t bf[4][2];
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t r[4];
          ldmatrix_x4(r, wb + (wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk * 16 +
                             ((lane >> 3) & 1) * 8);
          bf[2 * np][0] = r[0];
          bf[2 * np][1] = r[1];
          bf[2 * np + 1][0] = r[2];
          bf[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma16816<kBf16>(acc[q][mt][nt], af[mt], bf[nt][0], bf[nt][1]);
      }
    }
  };

  load_x(0, kt_begin);
  cp_async_commit();
  load_w(kt_begin);
  store_w(0, kt_begin);
  cp_async_wait_all();
  __syncthreads();
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    const int buf = (kt - kt_begin) & 1;
    const bool more = kt + 1 < kt_end;
    if (more) {
      load_x(buf ^ 1, kt + 1);
      cp_async_commit();
      load_w(kt + 1);
    }
    compute(buf);
    if (more) store_w(buf ^ 1, kt + 1);
    cp_async_wait_all();
    __syncthreads();
  }

  if (n_split >
      1) {  // the cluster's partial sums into its first CTA, in rank order (the same bits every run)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    static_assert(NW * MT * 16 * kThreads * sizeof(float) <= smem_bytes_of(kDual, BM),
                  "partial sums fit the tiles' room");
    float* part = reinterpret_cast<float*>(smem);  // the tiles are done with (the loop ends on a barrier)
    auto each_acc = [&](auto f) {                  // f(accumulator, its slot in a CTA's partial sums)
#pragma unroll
      for (int q = 0; q < NW; ++q)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(acc[q][i][j][e], (((q * MT + i) * 4 + j) * 4 + e) * kThreads + tid);
    };
    each_acc([&](float& a, int at) { part[at] = a; });
    cluster.sync();
    const unsigned rank = cluster.block_rank();
    if (rank == 0)
      for (int r = 1; r < n_split; ++r) {
        const float* rp = cluster.map_shared_rank(part, r);
        each_acc([&](float& a, int at) { a += rp[at]; });
      }
    cluster.sync();  // the others' shared memory stays until the first has read it
    if (rank != 0) return;
#else
    __trap();  // split only on sm_90+ (launch)
#endif
  }

  // Epilogue: fragment element e of (mt, nt) is row lane/4 (+8 for e >= 2), columns 2 (lane % 4) + e % 2.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = m_begin + wm * (BM / 2) + mt * 16 + (lane >> 2) + half * 8;
      if (r >= m_end) continue;
      const int64_t xr = p.x_rows ? p.x_rows[r] / p.x_row_div : r;
      const float s = p.x_scale ? p.x_scale[xr] : 1.0f;
      float* yr = y + r * ldy;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t c = n_begin + wn * 32 + nt * 8 + (lane & 3) * 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = gemm_out<kDual>(acc[0][mt][nt][2 * half + e], acc[NW - 1][mt][nt][2 * half + e], s);
          if (c + e < n_rows) yr[c + e] = v;
        }
      }
    }
  }
}

template <bool kDual, int BM>
constexpr size_t smem_bytes() {
  return smem_bytes_of(kDual, BM);
}

// The dual kernel needs more than the default 48 KiB of shared memory: raise its limit once per device
// (a host call that must not happen inside a stream capture: gemm_init() does it up front).
template <DType T, bool kDual, int BM>
void set_smem_limit_now() {
  XPERT_CUDA_CHECK(cudaFuncSetAttribute(
      gemm_kernel<T, kDual, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes<kDual, BM>()));
}
template <DType T, bool kDual, int BM>
void set_smem_limit() {
  static const bool done = (set_smem_limit_now<T, kDual, BM>(), true);
  (void)done;
}

// CTAs that split k between them (a cluster, sm_90+): a product of one matrix whose tiles fill few SMs (a
// decode step's attention projections at 64 streams: 64 or 160 CTAs walking 32-64 k steps each, bound by
// their loads' latency) takes up to 8, while the grid stays within 4 CTAs an SM and each keeps >= 4 steps.
// The split follows the grid, so one product alone and in a multi-output grid may be summed in other orders.
// H200, qwen3-30b-a3b, `xpert bench --parallel 64 -p 128 -n 64 --routing uniform`: S_TG 2,050 -> 2,231
// (2026-12-04, one call). In the same call W's bytes prefetched into L2 4-8 k steps ahead (a bulk prefetch a
// row and block) lost: 2,231 -> 2,101 with the split, 2,050 -> 1,939 without; removed.
unsigned k_split(const GemmArgs& a, int64_t ctas) {
  if (a.group_tiles || cc_major() < 9) return 1;
  const int64_t nk = (a.k / 32 + 1) / 2, room = 4 * (int64_t)sm_count();
  unsigned s = 1;
  while (s < 8 && ctas * s * 2 <= room && nk / (s * 2) >= 4) s *= 2;
  return s;
}

template <DType T, bool kDual, int BM>
void launch(const GemmArgs& a, cudaStream_t stream) {
  constexpr size_t kSmem = smem_bytes<kDual, BM>();
  set_smem_limit<T, kDual, BM>();
  const int64_t tiles = a.group_tiles ? a.max_tiles : (a.m + BM - 1) / BM;
  const int64_t col_tiles = a.n_outs > 0 ? a.outs[a.n_outs - 1].tile_end : (a.n + BN - 1) / BN;
  const dim3 grid((unsigned)tiles, (unsigned)col_tiles);
  XPERT_CU_ASSERT(grid.y <= 65535);
  if (tiles == 0 || col_tiles == 0) return;
  const unsigned split = k_split(a, tiles * col_tiles);
  if (split == 1) {
    gemm_kernel<T, kDual, BM><<<grid, kThreads, kSmem, stream>>>(a);
  } else {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = split;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid.x, grid.y, split);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    XPERT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_kernel<T, kDual, BM>, a));
  }
  XPERT_CUDA_CHECK_LAUNCH();
  trace_launch(gemm_kernel<T, kDual, BM>, stream,
               a.group_tiles  ? "grouped"
               : a.n_outs > 1 ? "several outputs"
               : a.m <= 64    ? "m<=64"
                              : nullptr);
}

}  // namespace

void gemm_init() {
  for (DType t : {DType::F16, DType::BF16, DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K})
    dev::dispatch_type(t, [&]<DType T>() {  // (captures: a captureless template lambda warns)
      if constexpr (T != DType::F32) {
        set_smem_limit_now<T, false, kGemmBM>();
        set_smem_limit_now<T, true, kGemmBM>();
        set_smem_limit_now<T, false, kGemmSmallBM>();
        set_smem_limit_now<T, true, kGemmSmallBM>();
      }
    });
  gemm_grouped_init();
}

void launch_gemm(DType w_type, bool dual, const GemmArgs& a, cudaStream_t stream) {
  XPERT_CU_ASSERT(a.k % 32 == 0 && (a.bm == kGemmSmallBM || a.bm == kGemmBM));
  XPERT_CU_ASSERT(a.n_outs == 0 || (!dual && !a.group_tiles && a.n_outs <= GemmArgs::kMaxOuts));
  if (launch_gemm_grouped_small(w_type, dual, a, stream)) return;
  const bool ok = dev::dispatch_type(w_type, [&]<DType T>() {
    if constexpr (T == DType::F32) {
      fail_cat("CUDA matmul: F32 weights have no tensor-core path");
    } else {
      if (a.bm == kGemmSmallBM) {
        if (dual)
          launch<T, true, kGemmSmallBM>(a, stream);
        else
          launch<T, false, kGemmSmallBM>(a, stream);
      } else if (dual) {
        launch<T, true, kGemmBM>(a, stream);
      } else {
        launch<T, false, kGemmBM>(a, stream);
      }
    }
  });
  if (!ok) fail_cat("CUDA matmul: weight type ", dtype_name(w_type), " is not supported");
}

}  // namespace xpert::cuda::detail
