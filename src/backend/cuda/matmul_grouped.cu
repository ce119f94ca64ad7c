// Grouped products of a few rows an expert (a decode step of many streams: 64 tokens x top 8 of 128
// experts are ~4 rows an expert) for Q4_K and Q6_K weights. A CTA multiplies up to 32 rows of one group
// by 64 rows of its matrix (two matrices in dual mode: silu(X W0^T) * (X W1^T)). The raw weight bytes of
// a k step and the f16 X tile arrive by cp.async kStages - 1 steps ahead into a ring of shared-memory
// stages, and each warp dequantizes its 16 columns straight from the raw bytes into mma B fragments: no
// f16 W tile, each weight dequantized once a CTA.
// What bound matmul_prefill.cu's 32-row kernel here was issue, not its loads' latency (ncu, H200: 20 % of
// DRAM bandwidth, 53 % of SM throughput, 680 instructions a warp and k step). This kernel with that
// kernel's f32 dequantization measured the same (gate/up 236 against 239 us a layer at 64 streams); the
// gain is the dequantization in f16 pairs (matmul_blocks.h's nibbles_h2 / q6_h2: one f16 multiply(-add) a
// pair with the sub-block's scale and min rounded to f16), 443 instructions a step: gate/up 179 us, down
// 126 -> 96 (2026-12-04). Q4_K walks k in order. Q6_K takes a step's 64 elements as the four 16-element
// runs that share 16 bytes of ql and qh (elements 32 j + 16 s + i of a 128-element half, j = 0..3), so
// each weight byte is copied once; the X tile follows the same order.
#include <cuda_fp16.h>

#include "backend/cuda/check.h"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/mma.cuh"
#include "quant/blocks.h"

namespace xpert::cuda::detail {
namespace {

constexpr int BM = kGemmSmallBM, BN = kGemmBN, BK = 64;
constexpr int kThreads = 128;  // 4 warps, each all BM rows x 16 columns
constexpr int kStages = 4;
constexpr int XLD = BK + 8;  // X tile row stride in halves (144 bytes: ldmatrix without bank conflicts)
static_assert(BM == 32 && BN == 64, "warps of 32 rows x 16 columns");

// One k step's raw bytes of a W row in shared memory, and where they come from.
template <DType T>
struct Raw;

// Q4_K step kt: block kt / 4, quarter c4 = kt % 4: the header (d, dmin, 12 scale bytes) and qs[32 c4 ..+32]
// (elements 64 c4 + i: low nibbles for i < 32, high nibbles for the next 32).
template <>
struct Raw<DType::Q4_K> {
  static constexpr int kStride = 48;  // [header 16][qs 32]; 12 words apart: 8 rows on 8 banks
  __device__ static void copy(uint32_t dst, const uint8_t* row, int kt, int half, bool ok) {
    const uint8_t* b = row + (kt >> 2) * sizeof(quant::BlockQ4_K);
    const uint8_t* q = b + 16 + 32 * (kt & 3);
    if (half == 0) {
      cp_async16(dst, b, ok);
      cp_async16(dst + 16, q, ok);
    } else {
      cp_async16(dst + 32, q + 16, ok);
    }
  }
  // X element of tile column 16 j + i (j = 0..3, i = 0..15).
  __device__ static int64_t x_at(int kt, int j) { return (int64_t)kt * BK + 16 * j; }
  // This lane's column: the step's two sub-blocks' scale and -min as f16 pairs, and the u16 pairs at bytes
  // 2 tig and 2 tig + 8 of qs[0..16) and qs[16..32).
  struct Col {
    __half2 a[2], nb[2];
    uint32_t q[2][2];
  };
  __device__ static Col col(const uint8_t* s, int kt, int tig) {
    Col c;
    const uint4 hdr = *reinterpret_cast<const uint4*>(s);
    const dev::ScaleMinPair sm = dev::scale_min_pair_k4(hdr.y, hdr.z, hdr.w, kt & 3);
    const float d = dev::f16_bits(hdr.x & 0xFFFF), dmin = dev::f16_bits(hdr.x >> 16);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      c.a[h] = __float2half2_rn(d * dev::small_int_float((int)sm.sc[h]));
      c.nb[h] = __float2half2_rn(-(dmin * dev::small_int_float((int)sm.mn[h])));
    }
    const uint8_t* q = s + 16;
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      c.q[p][0] = *reinterpret_cast<const uint16_t*>(q + 16 * p + 2 * tig);
      c.q[p][1] = *reinterpret_cast<const uint16_t*>(q + 16 * p + 2 * tig + 8);
    }
    return c;
  }
  // Run j: nibble j / 2 of qs[16 (j & 1) ..], sub-block j / 2 of the step.
  __device__ static void frag(const Col& c, int j, uint32_t& b0, uint32_t& b1) {
    const int sh = 4 * (j >> 1);
    auto v = [&](uint32_t u) {  // bytes 0, 1 of u: a q - b
      return dev::h2_bits(
          __hfma2(dev::nibbles_h2(dev::spread_pair(u, false), sh), c.a[j >> 1], c.nb[j >> 1]));
    };
    b0 = v(c.q[j & 1][0]);
    b1 = v(c.q[j & 1][1]);
  }
};

// Q6_K (weight_layout.h's fields) step kt: block kt / 4, half c6 = (kt / 2) % 2, s = kt % 2: runs j = 0..3
// are elements 32 j + 16 s + i of the half, whose low bits are ql[16 s + i] (j = 0, 2) or ql[32 + 16 s + i]
// (j = 1, 3), nibble j / 2, top bits 2 j of qh[16 s + i], scale sc[2 j + s] of the half's 8.
template <>
struct Raw<DType::Q6_K> {
  static constexpr int kStride = 80;  // [ql 16][ql + 32: 16][qh 16][sc 8][d 4]; 20 words apart
  __device__ static void copy(uint32_t dst, const dev::Q6Row& row, int kt, int half, bool ok) {
    const int blk = kt >> 2, c6 = (kt >> 1) & 1, s = kt & 1;
    if (half == 0) {
      const uint8_t* ql = row.ql + blk * 128 + 64 * c6 + 16 * s;
      cp_async16(dst, ql, ok);
      cp_async16(dst + 16, ql + 32, ok);
    } else {
      cp_async16(dst + 32, row.qh + blk * 64 + 32 * c6 + 16 * s, ok);
      const uint8_t* sc = row.sc + blk * 16 + 8 * c6;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst + 48), "l"(sc), "r"(ok ? 8 : 0)
                   : "memory");
      // d: 2 bytes, as the low half of a 4-byte copy (at a 4-byte aligned d: 2 bytes read, 2 zeros) or the
      // high half of the 4 aligned bytes before it (the previous block's d first).
      const uintptr_t a = reinterpret_cast<uintptr_t>(row.d + blk * 2);
      const uintptr_t src = a & ~(uintptr_t)3;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 56), "l"(src),
                   "r"(!ok       ? 0
                       : (a & 2) ? 4
                                 : 2)
                   : "memory");
    }
  }
  __device__ static int64_t x_at(int kt, int j) {
    return (int64_t)(kt >> 2) * 256 + 128 * ((kt >> 1) & 1) + 32 * j + 16 * (kt & 1);
  }
  struct Col {
    __half2 a[4];      // d * scale of runs 0..3
    uint32_t l[2][2];  // u16 pairs at bytes 2 tig, 2 tig + 8 of the two ql pieces
    uint32_t h[2];     // the same of qh
  };
  // d_high: this block's d is the high half of the copied word (its address is 2 mod 4).
  __device__ static Col col(const uint8_t* s, int kt, int tig, bool d_high) {
    Col c;
    const uint32_t dw = *reinterpret_cast<const uint32_t*>(s + 56);
    const float d = dev::f16_bits(d_high ? dw >> 16 : dw & 0xFFFF);
    const uint2 sc = *reinterpret_cast<const uint2*>(s + 48);
    const int ss = kt & 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 2 * j + ss;  // byte i of the 8
      c.a[j] = __float2half2_rn(
          d * dev::small_int_float((int8_t)(((i < 4 ? sc.x : sc.y) >> (8 * (i & 3))) & 0xFF)));
    }
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      c.l[p][0] = *reinterpret_cast<const uint16_t*>(s + 16 * p + 2 * tig);
      c.l[p][1] = *reinterpret_cast<const uint16_t*>(s + 16 * p + 2 * tig + 8);
    }
    c.h[0] = *reinterpret_cast<const uint16_t*>(s + 32 + 2 * tig);
    c.h[1] = *reinterpret_cast<const uint16_t*>(s + 32 + 2 * tig + 8);
    return c;
  }
  __device__ static void frag(const Col& c, int j, uint32_t& b0, uint32_t& b1) {
    const int lsh = 4 * (j >> 1), hsh = 2 * j;
    auto v = [&](uint32_t l, uint32_t hb) {  // bytes 0, 1 of l and hb: (q - 32) times the scale
      return dev::h2_bits(
          __hmul2(dev::q6_h2(dev::spread_pair(l, false), dev::spread_pair(hb, false), lsh, hsh), c.a[j]));
    };
    b0 = v(c.l[j & 1][0], c.h[0]);
    b1 = v(c.l[j & 1][1], c.h[1]);
  }
};

template <DType T, bool kDual>
__global__ void __launch_bounds__(kThreads, 4) grouped_kernel(const GemmArgs p) {
  constexpr int NW = kDual ? 2 : 1;
  constexpr int MT = BM / 16, NT = 2;
  constexpr int kXBytes = BM * XLD * 2, kWBytes = BN * Raw<T>::kStride;
  constexpr int kStageBytes = kXBytes + NW * kWBytes;
  extern __shared__ __align__(16) uint8_t smem[];

  GroupTile gt;
  if (!group_tile(p, (int)blockIdx.x, BM, gt)) return;
  const uint8_t* wmat[NW];
  wmat[0] = static_cast<const uint8_t*>(p.wtab0[gt.group]);
  if constexpr (kDual) wmat[1] = static_cast<const uint8_t*>(p.wtab1[gt.group]);
  const int64_t n_begin = (int64_t)blockIdx.y * BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int nk = (int)(p.k / BK);
  const uint32_t base = smem_addr(smem);

  // Copies: X pieces (row, run j, 8-element half) two a thread; W rows (row tid / 2, part tid % 2).
  int64_t xrow[2];
  bool xok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = (tid + kThreads * i) >> 3;
    const int64_t gr = gt.m_begin + r;
    xok[i] = gr < gt.m_end;
    xrow[i] = !xok[i] ? 0 : p.x_rows ? p.x_rows[gr] / p.x_row_div : gr;
  }
  const int wr = tid >> 1, wpart = tid & 1;
  const bool wok = n_begin + wr < p.n;
  dev::row_t<T> wrow[NW];
#pragma unroll
  for (int q = 0; q < NW; ++q) wrow[q] = dev::row_at<T>(wmat[q], wok ? n_begin + wr : 0, p.n, p.row_bytes);
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  auto copy_stage = [&](int stage, int kt) {
    const uint32_t sb = base + stage * kStageBytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int id = tid + kThreads * i, r = id >> 3, j = (id >> 1) & 3, h = id & 1;
      cp_async16(sb + (r * XLD + 16 * j + 8 * h) * 2, x + xrow[i] * p.k + Raw<T>::x_at(kt, j) + 8 * h,
                 xok[i]);
    }
#pragma unroll
    for (int q = 0; q < NW; ++q)
      Raw<T>::copy(sb + kXBytes + q * kWBytes + wr * Raw<T>::kStride, wrow[q], kt, wpart, wok);
  };

  float acc[NW][MT][NT][4];
#pragma unroll
  for (int q = 0; q < NW; ++q)
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][i][j][e] = 0.0f;

  // Q6_K's d: whether this lane's columns' d words are the high halves (their block index is odd).
  [[maybe_unused]] int64_t col_block0[NT] = {};
  if constexpr (T == DType::Q6_K) {
    const int64_t nb = (int64_t)(p.row_bytes / sizeof(quant::BlockQ6_K));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) col_block0[nt] = (n_begin + 16 * warp + 8 * nt + gid) * nb;
  }

  auto compute = [&](int stage, int kt) {
    const uint8_t* sp = smem + stage * kStageBytes;
    uint32_t af[4][MT][4];  // X fragments of the 4 runs
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(af[j][mt], base + stage * kStageBytes +
                                   ((mt * 16 + (lane & 15)) * XLD + 16 * j + (lane >> 4) * 8) * 2);
#pragma unroll
    for (int q = 0; q < NW; ++q)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* s = sp + kXBytes + q * kWBytes + (16 * warp + 8 * nt + gid) * Raw<T>::kStride;
        typename Raw<T>::Col c;
        if constexpr (T == DType::Q6_K)
          c = Raw<T>::col(s, kt, tig, ((col_block0[nt] + (kt >> 2)) & 1) != 0);
        else
          c = Raw<T>::col(s, kt, tig);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b0, b1;
          Raw<T>::frag(c, j, b0, b1);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            mma_f16(acc[q][mt][nt], af[j][mt][0], af[j][mt][1], af[j][mt][2], af[j][mt][3], b0, b1);
        }
      }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) copy_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step kt's stage is in, and every warp is done with the stage refilled next
    const int next = kt + kStages - 1;
    if (next < nk) copy_stage(next % kStages, next);
    cp_async_commit();
    compute(kt % kStages, kt);
  }

  // Epilogue: element e of (mt, nt) is row gid (+8 for e >= 2), column 2 tig + e % 2 of the n8 tile.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t r = gt.m_begin + mt * 16 + gid + hf * 8;
      if (r >= gt.m_end) continue;
      const int64_t xr = p.x_rows ? p.x_rows[r] / p.x_row_div : r;
      const float sx = p.x_scale ? p.x_scale[xr] : 1.0f;
      float* yr = p.y + r * p.ldy;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int64_t c = n_begin + 16 * warp + 8 * nt + 2 * tig;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = gemm_out<kDual>(acc[0][mt][nt][2 * hf + e], acc[NW - 1][mt][nt][2 * hf + e], sx);
          if (c + e < p.n) yr[c + e] = v;
        }
      }
    }
}

template <DType T, bool kDual>
constexpr int smem_bytes() {
  return kStages * (BM * XLD * 2 + (kDual ? 2 : 1) * BN * Raw<T>::kStride);
}

// Above 48 KiB (Q6_K dual) the limit is raised once per device, outside any stream capture (gemm_init).
template <DType T, bool kDual>
void set_smem_limit() {
  XPERT_CUDA_CHECK(cudaFuncSetAttribute(grouped_kernel<T, kDual>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_bytes<T, kDual>()));
}

template <DType T, bool kDual>
void launch(const GemmArgs& a, cudaStream_t stream) {
  const dim3 grid((unsigned)a.max_tiles, (unsigned)((a.n + BN - 1) / BN));
  if (grid.x == 0 || grid.y == 0) return;
  grouped_kernel<T, kDual><<<grid, kThreads, smem_bytes<T, kDual>(), stream>>>(a);
  XPERT_CUDA_CHECK_LAUNCH();
  trace_launch(grouped_kernel<T, kDual>, stream, "grouped few rows");
}

}  // namespace

void gemm_grouped_init() {
  set_smem_limit<DType::Q4_K, false>();
  set_smem_limit<DType::Q4_K, true>();
  set_smem_limit<DType::Q6_K, false>();
  set_smem_limit<DType::Q6_K, true>();
}

bool launch_gemm_grouped_small(DType w_type, bool dual, const GemmArgs& a, cudaStream_t stream) {
  if (!a.group_tiles || a.bm != BM || a.k % 256 != 0 || a.n_outs != 0) return false;
  switch (w_type) {
    case DType::Q4_K:
      dual ? launch<DType::Q4_K, true>(a, stream) : launch<DType::Q4_K, false>(a, stream);
      return true;
    case DType::Q6_K:
      dual ? launch<DType::Q6_K, true>(a, stream) : launch<DType::Q6_K, false>(a, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace xpert::cuda::detail
