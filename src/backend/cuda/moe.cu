// CUDA MoE: grouping by expert, the experts' SwiGLU FFN and the weighted sum (see moe.h); the routing is
// moe_router.cu.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/matmul_kernels.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_gptq.h"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/q8_1.cuh"

namespace xpert::cuda {

namespace {

using dev::ActView;
using dev::Dot;
constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------------------------------- decode path
// Where expert e's matrix is: computed where the layer's experts lie back to back (MoeExperts::gate_base
// and friends), else read from the device table.
struct ExpertAt {
  const void* const* table;
  const uint8_t* base;  // null: every id goes through the table
  size_t bytes;
  int n;  // ids below n are at base + id * bytes
  __device__ const uint8_t* operator()(int e) const {
    return base && e < n ? base + (size_t)e * bytes : static_cast<const uint8_t*>(table[e]);
  }
};
struct ExpertsAt {
  ExpertAt gate, up, down;
};
ExpertsAt experts_at(const MoeExperts& e) {
  const int n = (int)e.n_expert;
  return {{e.gate, static_cast<const uint8_t*>(e.gate_base), e.gate_up_bytes, n},
          {e.up, static_cast<const uint8_t*>(e.up_base), e.gate_up_bytes, n},
          {e.down, static_cast<const uint8_t*>(e.down_base), e.down_bytes, n}};
}

// Chunks in flight a lane (dev::dot_row) in gate/up and down. H200 tg128, batch 1 / 2 / 4 (the others at 2):
// gate/up qwen3-30b-a3b 400 / 424 / 424 t/s, qwen3.5-35b-a3b 360 / 367 / 371; down 403 / 424 / 396 and
// 373 / 367 / 361. Before the batch (one chunk in flight) both were 407 and 360.
constexpr int kGateUpBatch = 2;
constexpr int kDownBatch = 2;
// Chunks a lane of the down kernel loads before its wait: of a row of 768 (Qwen3's experts) 2 of a lane's
// 3, of 512 (Qwen3.5's) both.
constexpr int kDownPreload = 2;
// Warps per output row of the down kernel: 2 (H200, decode tg64: qwen3-30b-a3b 362 / 378 / 365 t/s and
// qwen3.5-35b-a3b 284 / 285 / 288 with 1 / 2 / 4; XPERT_MOE_DOWN_SPLIT, since removed). Past 8 slots a
// slot gets 2 lanes of a warp instead of 4, and 4 warps a row had measured a little faster there
// (qwen3.5-35b-a3b with its shared expert as slot 9: 351 / 347 t/s, 342-344 / 342). With the rows' first
// chunks loaded before the wait 2 is faster (tg128 500.3 / 494.9 against 487.4 / 489.0, 2026-12-01): its
// 1,024 blocks (Q6_K: 64 registers, 8 blocks an SM) are resident at once, 4's 2,048 took two waves.
constexpr int kDownSplit = 2;
// Lanes per row of the gate/up kernel: 8 (H200, decode tg64: qwen3-30b-a3b 309 / 311 / 306 t/s and
// qwen3.5-35b-a3b 259 / 266 with 4 / 8 / 16; XPERT_MOE_LANES, since removed).
constexpr int kLanes = 8;
// CTA = (32 / kParts rows of n_ff, one (token, slot) pair): 64 / kParts row dots (gate and up of its
// rows), kLanes lanes each, so 2 * kLanes / kParts warps. In a warp, lanes [0, 16) take gate rows and
// [16, 32) the up rows of the same outputs. The 32 outputs of one span are then quantized into one q8_1
// block for the down product. kParts 1: the CTA does that. kParts 2 (sm_90): the span's two CTAs are one
// thread block cluster; each writes its 16 outputs into the first CTA's shared memory and, after one
// cluster barrier, the first quantizes them. Every output is the same dot of the same lanes either way, so
// the same bits; the point is the grid: 192 CTAs of 512 threads (Qwen3: 24 spans x 8 slots) leave 60 of
// the H200's 132 SMs two spans' work and the others one, 384 of 256 at most three halves (H200 tg128 +1.5 %
// on both presets, 2026-12-01). The register bounds keep what each form had: two 512-thread CTAs an SM
// (64 registers), three 256-thread ones (80).
template <DType T, int kParts>
__global__ void __launch_bounds__(64 * kLanes / kParts, kParts == 2 ? 3 : 2)
    gate_up_kernel(ExpertAt gate, ExpertAt up, const int32_t* __restrict__ ids, int kslots, int64_t D,
                   int64_t F, size_t row_bytes, ActView xa, int8_t* __restrict__ hq,
                   float2* __restrict__ hds) {
  static_assert(kParts == 1 || kParts == 2, "one CTA or a cluster of two a span");
  pdl_begin();
  constexpr int kOutPerWarp = 16 / kLanes;
  const int64_t p = blockIdx.y;
  const int e = ids[p];
  const uint8_t* wg = gate(e);
  const uint8_t* wu = up(e);
  if (!wg || !wu) return;  // a cluster's CTAs share p: both leave
  const int64_t t = p / kslots;
  const ActView a{static_cast<const int8_t*>(xa.data) + t * D, xa.ds + t * (D / 32), D};
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, grp = lane / kLanes, sub = lane % kLanes;
  const int part = (int)(blockIdx.x % kParts);
  const int64_t span = blockIdx.x / kParts;
  const int fl = part * (32 / kParts) + warp * kOutPerWarp + grp % kOutPerWarp;
  const int64_t f = span * 32 + fl;
  const int nc = (int)(D / Dot<T>::kElems);
  float acc[1] = {0.0f};
  dev::dot_row<T, 1, kGateUpBatch>(dev::row_at<T>(lane < 16 ? wg : wu, f, F, row_bytes), sub, kLanes, nc, a,
                                   1, acc);
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(kFull, acc[0], off);
  const float u = __shfl_down_sync(kFull, acc[0], 16);
  __shared__ float h[32];
  const bool writes = lane < 16 && sub == 0;
  const float g = acc[0], hv = g / (1.0f + expf(-g)) * u;  // SwiGLU
  if constexpr (kParts == 1) {
    if (writes) h[fl] = hv;
    __syncthreads();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    if (writes) cluster.map_shared_rank(h, 0)[fl] = hv;
    cluster.sync();  // the span's 32 outputs in the first CTA's shared memory
    if (part != 0) return;
#else
    __trap();  // launched only on sm_90+ (gate_up_parts)
#endif
  }
  if (warp == 0) {
    warp_quantize_q8_1(h[lane], hq + p * F + span * 32 + lane, hds + p * (F / 32) + span);
  }
}

// CTAs a span of gate/up: `requested` (MoeRun::gate_up_parts) where it is 1 or 2, else 2; 2 needs sm_90
// (clusters), else 1. H200 tg128, 2 / 1, three calls (XPERT_MOE_GU_PARTS, since removed):
// qwen3-30b-a3b 552.6 / 544.3 (four rounds), qwen3.5-35b-a3b 505.6 / 497.8 (three). With gate/up at four
// chunks' loads in flight a lane (its three CTAs an SM allow 80 registers) even: 552.3 / 552.9, 502.3 /
// 506.3.
int gate_up_parts(int requested) {
  const int want = requested == 1 || requested == 2 ? requested : 2;
  return want == 2 && detail::cc_major() >= 9 ? 2 : 1;
}

// kSplit warps = one output row d of one token over all its k slots at once (2^lps_log2 lanes per slot,
// warp p of the row taking every kSplit-th chunk from chunk p), so every weight load of the row is in flight
// together; the warps' partial sums per slot are added in warp order, then the slots in slot order.
// Everything that comes from the routing (each lane's expert, row and weight, and the L2 prefetch of the
// CTA's rows) is read before the wait: the routing is two kernels back, and gate/up let this grid launch
// only after its own wait, so the router had finished and its writes were visible (read past L1, __ldcg).
// So are the first of a lane's chunks of its row (weights, which no kernel writes during a step); after the
// wait only the activations gate/up wrote are read before the rest of the row.
// kNorm (one token, MoeNormOut): each row's writer fences it, and the last CTA to finish (a counter it
// resets) normalizes the whole of out into no.y / q / ds (norm_row.cuh: the norm's own launch's bits).
template <DType T, bool kNorm = false>
__global__ void __launch_bounds__(128)
    down_kernel(ExpertAt down, const int32_t* __restrict__ ids, const float* __restrict__ weights, int kslots,
                int64_t D, int64_t F, size_t row_bytes, const int8_t* __restrict__ hq,
                const float2* __restrict__ hds, float* __restrict__ out, bool accumulate,
                const float* __restrict__ residual, int lps_log2, bool prefetch, MoeNormOut no) {
  constexpr int kSplit = kDownSplit;
  constexpr int kRows = 4 / kSplit;  // rows per CTA
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int r = warp / kSplit, wp = warp % kSplit;
  const int64_t d = (int64_t)blockIdx.x * kRows + r;
  const bool d_ok = d < D;
  const int lps = 1 << lps_log2, j = lane >> lps_log2, sub = lane & (lps - 1);
  const uint8_t* mat = nullptr;  // this lane's expert matrix (null: none)
  float wj = 0.0f;
  if (j < kslots) {
    const int64_t p = t * kslots + j;
    mat = down(__ldcg(ids + p));
    wj = __ldcg(weights + p);
    if (!d_ok) mat = nullptr;
    // Warp 0 holds the CTA's first row (d0): one lane a slot starts all the CTA's rows of that expert.
    if (prefetch && warp == 0 && sub == 0 && mat) {
      dev::prefetch_rows<T>(mat, d, min((int64_t)kRows, D - d), D, row_bytes);
    }
  }
  // The row's first chunks before the wait too (dev::RowHead): the rows' round trip overlaps gate/up.
  const int nc = (int)(F / Dot<T>::kElems);
  const dev::row_t<T> wrow = mat ? dev::row_at<T>(mat, d, D, row_bytes) : dev::row_t<T>{};
  dev::RowHead<T, kDownPreload> head;
  head.load(wrow, mat ? sub + lps * wp : nc, lps * kSplit, nc);
  pdl_begin();
  __shared__ float part[4][32];
  float acc[1] = {0.0f};
  if (mat) {
    const int64_t p = t * kslots + j;
    const ActView a{hq + p * F, hds + p * (F / 32), F};
    head.template dot<1, kDownBatch>(wrow, sub + lps * wp, lps * kSplit, nc, a, 1, acc);
  }
  for (int off = lps >> 1; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(kFull, acc[0], off);
  const bool writer = kSplit == 1 || wp == 0;  // the row's first warp adds the others' sums
  if constexpr (kSplit > 1) {
    part[warp][lane] = acc[0];
    __syncthreads();
    if (!kNorm && !writer) return;
    if (writer) {
      float v = 0.0f;
      for (int q = 0; q < kSplit; ++q) v += part[warp + q][lane];
      acc[0] = v;
    }
  }
  if (writer) {
    const int have = mat != nullptr;
    float sum = 0.0f;
    for (int jj = 0; jj < kslots; ++jj) {
      const float v = __shfl_sync(kFull, acc[0], jj << lps_log2);
      const int hv = __shfl_sync(kFull, have, jj << lps_log2);
      const float w = __shfl_sync(kFull, wj, jj << lps_log2);
      if (hv) sum += w * v;
    }
    if (lane == 0 && d_ok) {
      float o = sum;
      if (accumulate) o = residual ? (out[t * D + d] + residual[t * D + d]) + sum : out[t * D + d] + sum;
      out[t * D + d] = o;
      if constexpr (kNorm) __threadfence();  // before this CTA counts itself done
    }
  }
  if constexpr (kNorm) {
    __shared__ bool last;
    __shared__ double red[32];
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(no.done, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();  // every other CTA's rows are visible
    norm_row_128(out, no.w, (int)D, no.eps, no.y, no.q, no.ds, red);
    if (threadIdx.x == 0) *no.done = 0;
  }
}

// --------------------------------------------------------------------------------------- grouped path
// One CTA: counts per resident expert, offsets, tile offsets, and the (grouped row <-> slot) maps. The
// order of rows inside an expert's group is whatever the atomics give; no result depends on it.
__global__ void group_kernel(const int32_t* __restrict__ ids, int64_t n_pairs, int E,
                             const void* const* __restrict__ gate, const void* const* __restrict__ up,
                             const void* const* __restrict__ down, int32_t* __restrict__ offsets,
                             int32_t* __restrict__ tiles, int32_t* __restrict__ row_slot,
                             int32_t* __restrict__ slot_row, int bm) {
  extern __shared__ int group_smem[];
  int* cnt = group_smem;
  int* fill = group_smem + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    cnt[e] = 0;
    fill[e] = gate[e] && up[e] && down[e] ? 0 : -1;  // -1: not resident
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int e = ids[p];
    if (fill[e] == 0) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int r = 0, tl = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = r;
      tiles[e] = tl;
      const int c = cnt[e];
      cnt[e] = r;  // from here on: the group's first row
      r += c;
      tl += (c + bm - 1) / bm;
    }
    offsets[E] = r;
    tiles[E] = tl;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int e = ids[p];
    if (fill[e] < 0) {
      slot_row[p] = -1;
      continue;
    }
    const int r = cnt[e] + atomicAdd(&fill[e], 1);
    row_slot[r] = (int32_t)p;
    slot_row[p] = r;
  }
}

// out[t] (+)= sum over slots j in order of weight_j * yg[slot_row_j]. The slots' rows are loaded 8 at a time
// before their sums (a loop that loads and adds slot by slot waited on one load at a time: 23 us a
// qwen3-30b-a3b layer at 512 tokens).
__global__ void combine_kernel(const float* __restrict__ yg, const int32_t* __restrict__ slot_row,
                               const float* __restrict__ weights, int kslots, int64_t D,
                               float* __restrict__ out, bool accumulate) {
  constexpr int kUnroll = 8;
  const int64_t t = blockIdx.y;
  for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D;
       d += (int64_t)gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (int j0 = 0; j0 < kslots; j0 += kUnroll) {
      int r[kUnroll];
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        r[u] = j0 + u < kslots ? slot_row[t * kslots + j0 + u] : -1;
        v[u] = r[u] >= 0 ? yg[(int64_t)r[u] * D + d] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r[u] >= 0) sum += weights[t * kslots + j0 + u] * v[u];
    }
    out[t * D + d] = accumulate ? out[t * D + d] + sum : sum;
  }
}

bool moe_type_ok(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::GPTQ4_G32:
    case DType::GPTQ4_G64:
    case DType::GPTQ4_G128:
    case DType::GPTQ4Z_G32:
    case DType::GPTQ4Z_G64:
    case DType::GPTQ4Z_G128:
      return true;
    default:
      return false;
  }
}

struct DecodeBufs {
  int8_t* xq;
  float2* xds;
  int8_t* hq;
  float2* hds;
};
struct GroupedBufs {
  void* x16;
  float* xscale;
  int32_t *offsets, *tiles, *row_slot, *slot_row;
  float* h;
  void* h16;
  float* hscale;
  float* yg;
};

DecodeBufs carve_decode(Workspace& ws, const MoeExperts& e, int64_t n, int64_t k) {
  DecodeBufs b;
  b.xq = ws.take<int8_t>((size_t)(n * e.n_embd));
  b.xds = ws.take<float2>((size_t)(n * e.n_embd / 32));
  b.hq = ws.take<int8_t>((size_t)(n * k * e.n_ff));
  b.hds = ws.take<float2>((size_t)(n * k * e.n_ff / 32));
  return b;
}
// GPTQ experts at decode: the SwiGLU rows and each pair's down product, in f32 (moe_gptq.h).
struct GptqDecodeBufs {
  float* h;
  float* y;
};
GptqDecodeBufs carve_gptq_decode(Workspace& ws, const MoeExperts& e, int64_t n, int64_t k) {
  GptqDecodeBufs b;
  b.h = ws.take<float>((size_t)(n * k * e.n_ff));
  b.y = ws.take<float>((size_t)(n * k * e.n_embd));
  return b;
}
GroupedBufs carve_grouped(Workspace& ws, const MoeExperts& e, int64_t n, int64_t k) {
  GroupedBufs b;
  const size_t rows = (size_t)(n * k);
  b.x16 = ws.take_bytes((size_t)(n * e.n_embd) * 2);
  b.xscale = ws.take<float>((size_t)n);
  b.offsets = ws.take<int32_t>((size_t)e.n_expert + 1);
  b.tiles = ws.take<int32_t>((size_t)e.n_expert + 1);
  b.row_slot = ws.take<int32_t>(rows);
  b.slot_row = ws.take<int32_t>(rows);
  b.h = ws.take<float>(rows * e.n_ff);
  b.h16 = ws.take_bytes(rows * e.n_ff * 2);
  b.hscale = ws.take<float>(rows);
  b.yg = ws.take<float>(rows * e.n_embd);
  return b;
}

}  // namespace

void check_moe_experts(const MoeExperts& e) {
  if (e.gate_type != e.up_type)
    fail_cat("CUDA MoE: gate (", dtype_name(e.gate_type), ") and up (", dtype_name(e.up_type),
             ") experts must share a type");
  for (DType t : {e.gate_type, e.down_type})
    if (!moe_type_ok(t)) fail_cat("CUDA MoE: expert type ", dtype_name(t), " is not supported");
  if (e.n_expert < 1 || e.n_expert > 1024) fail_cat("CUDA MoE: ", e.n_expert, " experts (at most 1024)");
  if (e.n_ff % 32 != 0 || e.n_ff % dtype_info(e.down_type).block_size != 0 ||
      e.n_embd % dtype_info(e.gate_type).block_size != 0)
    fail_cat("CUDA MoE: n_embd ", e.n_embd, " / n_ff ", e.n_ff, " are not whole blocks of ",
             dtype_name(e.gate_type), " / ", dtype_name(e.down_type));
  if (!e.gate || !e.up || !e.down) fail_cat("CUDA MoE: missing expert table");
  if (is_gptq(e.gate_type) != is_gptq(e.down_type))
    fail_cat("CUDA MoE: gate/up experts in ", dtype_name(e.gate_type), " with down experts in ",
             dtype_name(e.down_type), ": GPTQ experts need all three matrices in GPTQ types");
  // moe_gptq.cu: 32 outputs a CTA, x[t] and h[p] in shared memory.
  if (is_gptq(e.gate_type) && (e.n_embd % 32 != 0 || e.n_embd > 12288 || e.n_ff > 12288))
    fail_cat("CUDA MoE: GPTQ experts need n_embd a multiple of 32, n_embd and n_ff up to 12288, not ",
             e.n_embd, " and ", e.n_ff);
}

bool moe_norm_out_supported(const MoeExperts& e) { return !is_gptq(e.gate_type); }

size_t moe_workspace_bytes(const MoeExperts& e, int64_t n_tokens, int64_t k) {
  const size_t huge = (size_t)1 << 62;
  Workspace a(nullptr, huge), b(nullptr, huge), c(nullptr, huge);
  carve_decode(a, e, n_tokens, k);
  carve_grouped(b, e, n_tokens, k);
  carve_gptq_decode(c, e, n_tokens, k);
  return std::max({a.used(), b.used(), c.used()});
}

std::vector<const void*> expert_table(const void* base, size_t expert_bytes,
                                      const std::vector<bool>& resident) {
  std::vector<const void*> t(resident.size(), nullptr);
  for (size_t e = 0; e < resident.size(); ++e)
    if (resident[e]) t[e] = static_cast<const uint8_t*>(base) + e * expert_bytes;
  return t;
}

bool long_row_norm_fits(int64_t n_tokens, int64_t n_embd) {
  return n_tokens == 1 && n_embd > 1024 && n_embd <= 2048 && n_embd % 32 == 0;
}

void moe_experts(const MoeExperts& e, const MoeRun& run, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  check_moe_experts(e);
  const int64_t n = run.n_tokens, k = run.k, D = e.n_embd, F = e.n_ff;
  if (k < 1 || k > 32) fail_cat("CUDA MoE: ", k, " experts per token (1..32)");
  if (n == 0) return;
  if (workspace_bytes < moe_workspace_bytes(e, n, k))
    fail_cat("CUDA MoE: workspace of ", workspace_bytes, " bytes, needs ", moe_workspace_bytes(e, n, k));
  Workspace ws(workspace, workspace_bytes);
  const bool gptq = is_gptq(e.gate_type);
  const int64_t decode_max = gptq ? kMoeGptqDecodePathMaxTokens : kMoeDecodePathMaxTokens;
  const bool decode = run.path == MoePath::decode || (run.path == MoePath::automatic && n <= decode_max);
  const size_t gu_row_bytes = row_bytes(e.gate_type, D), down_row_bytes = row_bytes(e.down_type, F);

  if (n > 65535 || (decode && n * k > 65535))
    fail_cat("CUDA MoE: ", n, " tokens in one call (at most 65535)");
  if (run.residual && (!decode || !run.accumulate))
    fail_cat("CUDA MoE: a residual is added only by the decode path when it accumulates");
  const MoeNormOut& no = run.norm_out;
  if (no.w &&
      (!decode || !run.accumulate || !long_row_norm_fits(n, D) || !no.y || !no.q || !no.ds || !no.done))
    fail_cat(
        "CUDA MoE: the norm after the experts takes one decode token of 1024 < n_embd <= 2048, "
        "accumulated, with its outputs and counter");
  if (gptq && no.w) fail_cat("CUDA MoE: GPTQ experts do not take the norm after the experts (MoeNormOut)");
  if (decode && gptq) {  // f32 activations: run.xq (q8_1) is not read
    const GptqDecodeBufs b = carve_gptq_decode(ws, e, n, k);
    detail::launch_gptq_gate_up(e, run.ids, n, k, run.x, b.h, stream);
    detail::launch_gptq_down(e, run.ids, run.weights, n, k, b.h, b.y, run.out, run.accumulate, run.residual,
                             stream);
    return;
  }
  if (decode) {
    const DecodeBufs b = carve_decode(ws, e, n, k);
    const bool have_xq = run.xq && run.xq->format == ActFormat::q8_1 && run.xq->m == n && run.xq->k == D;
    if (!have_xq) detail::launch_quantize_q8_1(run.x, D, n, D, b.xq, b.xds, stream);
    const ActView xa = have_xq ? ActView{static_cast<const int8_t*>(run.xq->data),
                                         reinterpret_cast<const float2*>(run.xq->aux), D}
                               : ActView{b.xq, b.xds, D};
    const auto [gate, up, down] = experts_at(e);
    dev::dispatch_quant_type(e.gate_type, [&]<DType T>() {
      const unsigned parts = gate_up_parts(run.gate_up_parts) == 2 ? 2 : 1;
      auto* kernel = parts == 2 ? gate_up_kernel<T, 2> : gate_up_kernel<T, 1>;
      launch_pdl_cluster(kernel, dim3((unsigned)(F / 32 * parts), (unsigned)(n * k)), 64 * kLanes / parts, 0,
                         stream, parts == 2 ? 2 : 0, gate, up, run.ids, (int)k, D, F, gu_row_bytes, xa, b.hq,
                         b.hds);
      XPERT_CUDA_CHECK_LAUNCH();
    });
    int lps_log2 = 5;
    while ((1 << (5 - lps_log2)) < k) --lps_log2;
    dev::dispatch_quant_type(e.down_type, [&]<DType T>() {
      constexpr unsigned rows_per_cta = 4 / kDownSplit;
      const dim3 grid((unsigned)((D + rows_per_cta - 1) / rows_per_cta), (unsigned)n);
      auto* kernel = no.w ? down_kernel<T, true> : down_kernel<T>;
      launch_pdl(kernel, grid, 128, 0, stream, down, run.ids, run.weights, (int)k, D, F, down_row_bytes, b.hq,
                 b.hds, run.out, run.accumulate, run.residual, lps_log2, detail::prefetch_enabled(), no);
      XPERT_CUDA_CHECK_LAUNCH();
    });
    return;
  }

  const GroupedBufs b = carve_grouped(ws, e, n, k);
  auto gemm = [&](DType t, bool dual, const detail::GemmArgs& a) {
    if (gptq)
      detail::launch_gemm_gptq(t, dual, a, stream);
    else
      detail::launch_gemm(t, dual, a, stream);
  };
  const int64_t rows = n * k;
  // Tiles of 64 rows, or 32 where the experts get few rows each (matmul_kernels.h: kGemmSmallGroupRows).
  const int bm = rows <= detail::kGemmSmallGroupRows * e.n_expert ? detail::kGemmSmallBM : detail::kGemmBM;
  group_kernel<<<1, 1024, 2 * e.n_expert * sizeof(int), stream>>>(
      run.ids, rows, (int)e.n_expert, e.gate, e.up, e.down, b.offsets, b.tiles, b.row_slot, b.slot_row, bm);
  XPERT_CUDA_CHECK_LAUNCH();
  detail::trace_launch(group_kernel, stream);
  detail::launch_convert_16(false, run.x, D, n, D, b.x16, b.xscale, nullptr, stream);

  detail::GemmArgs g;
  g.wtab0 = e.gate;
  g.wtab1 = e.up;
  g.n = F;
  g.k = D;
  g.row_bytes = gu_row_bytes;
  g.x = b.x16;
  g.x_scale = b.xscale;
  g.x_rows = b.row_slot;
  g.x_row_div = (int32_t)k;
  g.y = b.h;
  g.ldy = F;
  g.group_rows = b.offsets;
  g.group_tiles = b.tiles;
  g.n_groups = (int32_t)e.n_expert;
  g.max_tiles = (rows + bm - 1) / bm + std::min<int64_t>(e.n_expert, rows);
  g.bm = bm;
  gemm(e.gate_type, true, g);

  detail::launch_convert_16(false, b.h, F, rows, F, b.h16, b.hscale, b.offsets + e.n_expert, stream);

  detail::GemmArgs d = g;
  d.wtab0 = e.down;
  d.wtab1 = nullptr;
  d.n = D;
  d.k = F;
  d.row_bytes = down_row_bytes;
  d.x = b.h16;
  d.x_scale = b.hscale;
  d.x_rows = nullptr;
  d.x_row_div = 1;
  d.y = b.yg;
  d.ldy = D;
  gemm(e.down_type, false, d);

  const dim3 grid((unsigned)((D + 255) / 256), (unsigned)n);
  combine_kernel<<<grid, 256, 0, stream>>>(b.yg, b.slot_row, run.weights, (int)k, D, run.out, run.accumulate);
  XPERT_CUDA_CHECK_LAUNCH();
  detail::trace_launch(combine_kernel, stream);
}

}  // namespace xpert::cuda
