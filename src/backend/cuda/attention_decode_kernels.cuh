// The device side of the decode attention (attention_decode.cu, its only includer): the parameters, the
// warps' key streaming and the tensor-core steps, the kernels (split, one-block, with the output projection)
// and the combine. attention_decode.cu plans a launch and issues it.
#pragma once
// as it reads an f16 stage (attention_kv.cuh). So loads stay asynchronous, kStages - 1 steps ahead.
#include <cmath>
#include <type_traits>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_kv.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/head_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matmul_blocks.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_internal.h"
#include "backend/cuda/q8_1.cuh"
#include "backend/cuda/sigmoid.cuh"

namespace xpert::cuda {
namespace {

using namespace detail;

constexpr int kStages = 3;
constexpr int kStepKeys = 16;
constexpr int kMaxSplits = 1024;
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeParams {
  const float* q;
  const char* k;
  const char* v;
  int64_t slot_stride;  // bytes
  const int32_t* slots;
  const int32_t* pos;
  float* out;
  int8_t* out_q;       // optional: out's q8_1 blocks (combine_kernel), per sequence a row of n_head * D
  float2* out_ds;
  const float* gate;  // optional: out *= sigmoid(gate) (combine_kernel), rows gate_stride apart
  int64_t gate_stride, q_stride;
  bool one_block;      // a unit's splits are the warps of one block, combined there (combine_in_block)
  // Fused q/k prep (one_block, f16 cache; DecodeAttentionArgs::prep): this step's k / v rows, the norms'
  // weights (null: none), RoPE's constants; q is read as projected and normalized + rotated in the block.
  const float *prep_k, *prep_v, *prep_qw, *prep_kw;
  int n_rot;
  bool neox;
  float theta_scale, freq_scale, eps;
  // proj (DecodeAttentionArgs::Proj): the block's rows of W start at row blockIdx.x * kProjRows.
  const uint8_t* proj_w;
  int64_t proj_row_bytes;  // bytes of one row of W (all its columns)
  int proj_n_out;
  float* proj_parts;
  float* part_o;       // [n_seq][n_head][max_splits][D]
  float2* part_ml;     // [n_seq][n_head][max_splits] (running max in log2 units, sum)
  int64_t k_row, v_row;  // bytes per cache row (n_head_kv * D values in the cache's type)
  int n_head, group, n_hchunk, hc_heads, max_splits, min_keys, max_kv, window;  // hc_heads <= 8 a chunk
  bool wide;  // cache bases and slot stride 16-byte aligned: quantized slices copied in 16/8-byte pieces
  float scale_log2;  // kq_scale * log2(e)
};

struct SplitRange {
  int lo, nk, n_active, per;
};

// The keys of sequence `seq` and how they are split; the decode and combine kernels agree through it.
__device__ __forceinline__ SplitRange split_range(const DecodeParams& p, int seq) {
  const int pos = p.pos[seq];
  const int hi = min(pos, p.max_kv - 1);
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int nk = max(0, hi - lo + 1);
  const int n = max(1, min((nk + p.min_keys - 1) / p.min_keys, p.max_splits));
  const int per = ((nk + n - 1) / n + kStepKeys - 1) / kStepKeys * kStepKeys;
  return {lo, nk, n, per};
}

// Shared memory of one warp: kStages stages of (K, V) rows of kStepKeys keys (f16 tiles, or the raw
// slices of a quantized side), then an f16 tile per quantized side.
template <int D, int T>
constexpr int stage_side_bytes() {
  return T == kKvF16 ? kStepKeys * D * 2 : kStepKeys * (int)kv_bytes<T>(D);
}
template <int D, int KT, int VT>
constexpr int warp_smem_bytes() {
  return kStages * (stage_side_bytes<D, KT>() + stage_side_bytes<D, VT>()) +
         (KT != kKvF16 ? kStepKeys * D * 2 : 0) + (VT != kKvF16 ? kStepKeys * D * 2 : 0);
}

// Raw slices of a stage (kStepKeys rows of kv_bytes(D)) -> an f16 tile (swizzled rows of D).
template <int D, int T>
__device__ __forceinline__ void dequantize_stage(const char* raw, uint32_t tile, int lane) {
  constexpr int kChunks = D / 8;
  constexpr int64_t kSlice = kv_bytes<T>(D);
#pragma unroll
  for (int it = 0; it < kStepKeys * kChunks / 32; ++it) {
    const int i = lane + 32 * it;
    const int row = i / kChunks, ch = i % kChunks;
    st_shared16(tile + swizzle<D>(row, ch) * 16, kv_load8<T>(raw + row * kSlice, ch));
  }
}

// One side's kStepKeys rows (keys key0.., those at or past `end` zero) into a stage at dst: f16 rows
// swizzled, 16 bytes at a time; quantized slices as they are, 4 bytes at a time. `src` is the side's
// head slice of key 0, rows row_bytes apart; `fallback` a key that may be read for the invalid rows.
template <int D, int T>
__device__ __forceinline__ void load_side(uint32_t dst, const char* src, int64_t row_bytes, int key0, int end,
                                          int fallback, int lane, bool wide) {
  if constexpr (T == kKvF16) {
    constexpr int kChunks = D / 8;
#pragma unroll
    for (int it = 0; it < kStepKeys * kChunks / 32; ++it) {
      const int i = lane + 32 * it;
      const int row = i / kChunks, ch = i % kChunks;
      const bool valid = key0 + row < end;
      const int64_t r = valid ? key0 + row : fallback;
      cp_async16(dst + swizzle<D>(row, ch) * 16, src + r * row_bytes + ch * 16, valid);
    }
  } else if (wide) {
    // Slices of 16n (8n) bytes at 16 (8) byte aligned addresses: 4x (2x) fewer copies than by words.
    constexpr int kSlice = (int)kv_bytes<T>(D);
    constexpr int kVec = kSlice % 16 == 0 ? 16 : kSlice % 8 == 0 ? 8 : 4;
    constexpr int kUnits = kSlice / kVec;
#pragma unroll
    for (int it = 0; it < (kStepKeys * kUnits + 31) / 32; ++it) {
      const int i = lane + 32 * it;
      if (i < kStepKeys * kUnits) {
        const int row = i / kUnits, u = i % kUnits;
        const bool valid = key0 + row < end;
        const int64_t r = valid ? key0 + row : fallback;
        const uint32_t d = dst + row * kSlice + u * kVec;
        const char* s = src + r * row_bytes + u * kVec;
        if constexpr (kVec == 16)
          cp_async16(d, s, valid);
        else if constexpr (kVec == 8)
          cp_async8(d, s, valid);
        else
          cp_async4(d, s, valid);
      }
    }
  } else {
    constexpr int kWords = (int)kv_bytes<T>(D) / 4;  // per slice
#pragma unroll
    for (int it = 0; it < (kStepKeys * kWords + 31) / 32; ++it) {
      const int i = lane + 32 * it;
      if (i < kStepKeys * kWords) {
        const int row = i / kWords, w = i % kWords;
        const bool valid = key0 + row < end;
        const int64_t r = valid ? key0 + row : fallback;
        cp_async4(dst + (row * kWords + w) * 4, src + r * row_bytes + w * 4, valid);
      }
    }
  }
}

// One head row by one warp as norm_rope_kernel does it (its norm's sums and products, then the rotation):
// src's D values -> row (shared memory), normalized and rotated.
template <int D>
__device__ __forceinline__ void norm_rope_into(const DecodeParams& p, const float* src, const float* w,
                                               const float (&rc)[D / 64], const float (&rs)[D / 64],
                                               float* row) {
  const int lane = threadIdx.x % 32;
  float xv[D / 32], wv[D / 32];
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    xv[j] = src[lane + 32 * j];
    wv[j] = w ? w[lane + 32 * j] : 1.0f;
  }
  const float s = w ? warp_rms_scale<D / 32>(xv, D, p.eps) : 1.0f;
#pragma unroll
  for (int j = 0; j < D / 32; ++j) row[lane + 32 * j] = w ? __fmul_rn(__fmul_rn(xv[j], s), wv[j]) : xv[j];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < D / 64; ++j) {
    const int i2 = lane + 32 * j;
    if (i2 >= p.n_rot / 2) break;
    const int a = p.neox ? i2 : 2 * i2, b = p.neox ? i2 + p.n_rot / 2 : 2 * i2 + 1;
    const float x0 = row[a], x1 = row[b];
    row[a] = __fsub_rn(__fmul_rn(x0, rc[j]), __fmul_rn(x1, rs[j]));
    row[b] = __fadd_rn(__fmul_rn(x0, rs[j]), __fmul_rn(x1, rc[j]));
  }
  __syncwarp();
}

// one_block: the block's warps have split the unit's keys among themselves; their partial (max, sum,
// output) meet in shared memory (each warp's own ring, free now: heads D + 4 floats apart, so the
// fragment stores hit 32 banks), and the warps share out the heads' 32-dim pieces, combining each as
// combine_kernel does: the output, times sigmoid(gate), and its q8_1 block.
constexpr int kPartPad = 4;
template <int D>
__device__ __forceinline__ float* part_of(unsigned char* smem, int warp_bytes, int w) {
  return reinterpret_cast<float*>(smem + (size_t)w * warp_bytes);
}
// This warp's partial (output, max, sum) of its heads into its ring.
template <int D>
__device__ __forceinline__ void store_part(float* part, const float (&o)[D / 16][4], const float (&m)[2],
                                           const float (&l)[2]) {
  constexpr int kRow = D + kPartPad;
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int hj = 2 * tig + j;
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      part[hj * kRow + 16 * mt + gid] = o[mt][j];
      part[hj * kRow + 16 * mt + gid + 8] = o[mt][2 + j];
    }
    if (gid == 0) reinterpret_cast<float2*>(part + 8 * kRow)[hj] = make_float2(m[j], l[j]);
  }
}
// Head hj's output at dim d from the partials of warps 0 .. n_ring - 1, as combine_kernel combines splits.
template <int D>
__device__ __forceinline__ float combine_parts(unsigned char* smem, int warp_bytes, int n_ring, int hj,
                                               int d) {
  constexpr int kRow = D + kPartPad;
  auto ml_of = [&](int w) {
    return reinterpret_cast<const float2*>(part_of<D>(smem, warp_bytes, w) + 8 * kRow)[hj];
  };
  float M = -INFINITY;
  for (int w = 0; w < n_ring; ++w) M = fmaxf(M, ml_of(w).x);
  float acc = 0.0f, L = 0.0f;
  for (int w = 0; w < n_ring; ++w) {
    const float2 ml = ml_of(w);
    const float wt = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - M);
    L += wt * ml.y;
    acc += wt * part_of<D>(smem, warp_bytes, w)[hj * kRow + d];
  }
  return L > 0.0f ? acc / L : 0.0f;
}

// one_block: the block's warps have split the unit's keys among themselves; their partial (max, sum,
// output) meet in shared memory (each warp's own ring, free now: heads D + 4 floats apart, so the
// fragment stores hit 32 banks), and the warps share out the heads' 32-dim pieces, combining each as
// combine_kernel does: the output, times sigmoid(gate), and its q8_1 block.
template <int D>
__device__ __forceinline__ void combine_in_block(const DecodeParams& p, unsigned char* smem, int warp_bytes,
                                                 int seq, int h0, int nh, const float (&o)[D / 16][4],
                                                 const float (&m)[2], const float (&l)[2]) {
  constexpr int kPieces = D / 32, kPre = 2;  // pieces whose gate is loaded early
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nw = blockDim.x / 32, items = nh * kPieces;
  auto row_of = [&](int hj) { return (int64_t)seq * p.n_head + h0 + hj; };
  cp_async_wait<0>();
  __syncwarp();
  store_part<D>(part_of<D>(smem, warp_bytes, warp), o, m, l);
  float g[kPre] = {};
  if (p.gate)
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
      const int it = min(warp + i * nw, items - 1);
      g[i] = p.gate[row_of(it / kPieces) * p.gate_stride + 32 * (it % kPieces) + lane];
    }
  __syncthreads();
  auto piece = [&](int it, float gv, bool pre) {
    const int hj = it / kPieces, d = 32 * (it % kPieces) + lane;
    const int64_t row = row_of(hj);
    float v = combine_parts<D>(smem, warp_bytes, nw, hj, d);
    if (p.gate) v *= sigmoidf(pre ? gv : p.gate[row * p.gate_stride + d]);
    p.out[row * D + d] = v;
    if (p.out_q) warp_quantize_q8_1(v, p.out_q + row * D + d, p.out_ds + (row * D + d) / 32);
  };
#pragma unroll
  for (int i = 0; i < kPre; ++i)
    if (warp + i * nw < items) piece(warp + i * nw, g[i], true);
  for (int it = warp + kPre * nw; it < items; it += nw) piece(it, 0.0f, false);
}

// proj: a block of kProjThreads, of which the first kProjRingWarps split the keys (all do the prep, combine
// and product), for kProjRows rows of the output projection over kProjHeads query heads of one KV head (a
// unit: blockIdx.y): the block's slice of W (rows x 2 Q4_K blocks at head_dim 128) in shared memory after
// the prep's rows, then the heads' output as q8_1 (int8 values, then float2 scales). Four heads a block
// rather than a KV head's eight: the prep's rows and the combine's pieces are then one round of the warps.
constexpr int kProjThreads = 256, kProjRingWarps = 4, kProjRows = 128, kProjHeads = 4;
constexpr int kProjLanes = 2;  // lanes a row in the product: 16 rows a warp
static_assert(kProjRows == kProjThreads / kProjLanes && kProjThreads > 32 * kProjRingWarps);
template <int D>
constexpr int proj_w_row_bytes() {
  return kProjHeads * D / quant::kQKK * (int)sizeof(quant::BlockQ4_K);
}
template <int D>
constexpr size_t proj_smem_bytes() {  // after the prep's rows
  return (size_t)kProjRows * proj_w_row_bytes<D>() + kProjHeads * D + kProjHeads * D / 32 * sizeof(float2);
}

// The block's rows of W, its unit's columns, into shared memory (cp.async; the caller waits): by the
// warps past the rings, whose cp.async groups hold nothing else.
template <int D>
__device__ __forceinline__ void proj_load_w(const DecodeParams& p, uint32_t dst, int unit) {
  constexpr int kRowBytes = proj_w_row_bytes<D>(), kUnits = kRowBytes / 16;
  const int t = threadIdx.x - 32 * kProjRingWarps, nt = kProjThreads - 32 * kProjRingWarps;
  const uint8_t* src =
      p.proj_w + (int64_t)blockIdx.x * kProjRows * p.proj_row_bytes + (int64_t)unit * kRowBytes;
  for (int i = t; i < kProjRows * kUnits; i += nt) {
    const int r = i / kUnits, u = i % kUnits;
    cp_async16(dst + r * kRowBytes + u * 16, src + r * p.proj_row_bytes + u * 16, true);
  }
  cp_async_commit();
}

// proj's end: the ring warps' partials combined into the unit's heads' output as q8_1 in shared memory (the
// one_block combine's values and blocks), then this block's rows of W . those columns into parts[unit].
template <int D>
__device__ __forceinline__ void combine_proj(const DecodeParams& p, unsigned char* smem, int warp_bytes,
                                             unsigned char* wsm, int unit, const float (&o)[D / 16][4],
                                             const float (&m)[2], const float (&l)[2]) {
  using Dot = dev::Dot<DType::Q4_K>;
  constexpr int kPieces = D / 32, kRowBytes = proj_w_row_bytes<D>(), kChunks = kProjHeads * D / Dot::kElems;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto* aq = reinterpret_cast<int8_t*>(wsm + kProjRows * kRowBytes);
  auto* ads = reinterpret_cast<float2*>(aq + kProjHeads * D);
  cp_async_wait<0>();  // the ring's last stages, or W
  __syncwarp();
  if (warp < kProjRingWarps) store_part<D>(part_of<D>(smem, warp_bytes, warp), o, m, l);
  __syncthreads();
  constexpr int kItems = kProjHeads * kPieces, kWarps = kProjThreads / 32;  // nh == kProjHeads (fits)
#pragma unroll
  for (int it = warp; it < kItems; it += kWarps) {
    const int hj = it / kPieces, d = 32 * (it % kPieces) + lane;
    warp_quantize_q8_1(combine_parts<D>(smem, warp_bytes, kProjRingWarps, hj, d), aq + hj * D + d,
                       ads + (hj * D + d) / 32);
  }
  __syncthreads();
  const int r = warp * (32 / kProjLanes) + lane / kProjLanes, sub = lane % kProjLanes;
  const uint8_t* row = wsm + r * kRowBytes;
  const dev::SharedAct a{aq, ads, kProjHeads * D};
  float acc[1] = {0.0f};
#pragma unroll
  for (int c = sub; c < kChunks; c += kProjLanes)
    Dot::template mul<1, dev::SharedAct>(Dot::load_shared(row, c), c, a, 1, acc);
#pragma unroll
  for (int off = kProjLanes / 2; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], off);
  if (sub == 0) p.proj_parts[(int64_t)unit * p.proj_n_out + blockIdx.x * kProjRows + r] = acc[0];
}

// The decode kernel's body; kProj: the proj form (combine_proj), a unit's blocks blockIdx.x all computing it.
template <int D, int KT, int VT, bool kProj>
__device__ __forceinline__ void decode_body(const DecodeParams& p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  // Warp-major, so that a few active splits land on different blocks (SMs), not on one block's warps.
  const int split = kProj ? warp : warp * gridDim.x + blockIdx.x;
  const int n_ring = kProj ? kProjRingWarps : blockDim.x / 32;  // warps with a ring
  const int seq = blockIdx.z;
  const int hk = blockIdx.y / p.n_hchunk, hc = blockIdx.y % p.n_hchunk;
  const int h0 = hk * p.group + hc * p.hc_heads;
  const int nh = min(p.hc_heads, p.group - hc * p.hc_heads);
  // The cache slot and the position (split_range) are host copies: read before the wait.
  const int64_t slot = p.slots ? p.slots[seq] : seq;
  const SplitRange r = split_range(p, seq);
  const bool active = split < r.n_active;
  const int kb = r.lo + split * r.per;
  const int ke = min(kb + r.per, r.lo + r.nk);
  const int n_steps = active && ke > kb ? (ke - kb + kStepKeys - 1) / kStepKeys : 0;

  constexpr int kKBytes = stage_side_bytes<D, KT>(), kVBytes = stage_side_bytes<D, VT>();
  constexpr int kStageBytes = kKBytes + kVBytes;  // K then V
  const uint32_t base = smem_addr(smem_raw);
  const uint32_t ring = base + warp * warp_smem_bytes<D, KT, VT>();
  const uint32_t tiles = ring + kStages * kStageBytes;  // f16 tiles of the quantized sides: K, then V
  const uint32_t k_tile = tiles, v_tile = tiles + (KT != kKvF16 ? kStepKeys * D * 2 : 0);
  const char* kg = p.k + slot * p.slot_stride + hk * kv_bytes<KT>(D);
  const char* vg = p.v + slot * p.slot_stride + hk * kv_bytes<VT>(D);

  // Fused prep (below): the position's K and V rows are the block's own, so the warp whose keys end at the
  // position reads the cache only below it (that row zero-filled, then written into its stage from shared
  // memory): all its stages may start before the wait, and none waits on the stores.
  constexpr bool kPrepForm = KT == kKvF16 && VT == kKvF16 && (D == 128 || D == 256);
  const bool prep = kPrepForm && p.prep_k != nullptr;
  const int pos = p.pos[seq];
  const bool own_pos = prep && n_steps > 0 && ke - 1 == pos;
  const int load_end = own_pos ? pos : ke;
  auto load_step = [&](int step) {
    const uint32_t ks = ring + (step % kStages) * kStageBytes;
    const int key0 = kb + step * kStepKeys;
    load_side<D, KT>(ks, kg, p.k_row, key0, load_end, kb, lane, p.wide);
    load_side<D, VT>(ks + kKBytes, vg, p.v_row, key0, load_end, kb, lane, p.wide);
  };
  auto prologue = [&] {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_steps) load_step(s);
      cp_async_commit();
    }
  };
  // Keys below the position were stored by earlier steps; the position's own key by the kernel right
  // before (norm + RoPE + store), or by this one (fused prep). A warp whose first stages all lie below it
  // (below load_end) starts them before the wait (their invalid rows read key kb, also below): +1 % tg on
  // qwen3 (XPERT_ATTN_EARLY, since removed; the same bits either way).
  const bool early = n_steps > 0 && min(load_end, kb + (kStages - 1) * kStepKeys) <= pos;
  if (early) prologue();
  // Fused prep: warps 0..nh-1 normalize and rotate a q head each into shared memory (after the warps'
  // rings), the last warp k and the one before v, both stored at the position in the cache by every block
  // of this KV head (the same bytes), and kept in shared memory after q; the angles before the wait.
  // Only f16 caches take it (plan): the other forms are compiled without it, so it costs them no registers.
  float* prep_rows = reinterpret_cast<float*>(smem_raw + n_ring * warp_smem_bytes<D, KT, VT>());
  unsigned char* wsm = reinterpret_cast<unsigned char*>(prep_rows + (kProjHeads + 2) * D);  // kProj: W, act
  if constexpr (kProj)
    if (warp >= kProjRingWarps) proj_load_w<D>(p, smem_addr(wsm), blockIdx.y);
  float rc[D / 64], rs[D / 64];
  if (prep) rope_angles<D / 64>((float)pos, p.n_rot, p.theta_scale, p.freq_scale, rc, rs);
  pdl_begin();
  if (!active && !p.one_block) return;  // one_block: every warp meets at the combine
  if (prep) {
    const int nw = blockDim.x / 32;
    const int64_t at = slot * p.slot_stride + (int64_t)pos * p.k_row + hk * D * 2;  // f16 cache
    auto prep_q = [&](int j) {
      norm_rope_into<D>(p, p.q + ((int64_t)seq * p.n_head + h0 + j) * p.q_stride, p.prep_qw, rc, rs,
                        prep_rows + j * D);
    };
    auto prep_k = [&] {
      float* row = prep_rows + nh * D;
      norm_rope_into<D>(p, p.prep_k + ((int64_t)seq * (p.n_head / p.group) + hk) * D, p.prep_kw, rc, rs, row);
      __half* kc = reinterpret_cast<__half*>(const_cast<char*>(p.k) + at);
#pragma unroll
      for (int j = 0; j < D / 32; ++j) kc[lane + 32 * j] = __float2half_rn(row[lane + 32 * j]);
    };
    auto prep_v = [&] {
      const float* v = p.prep_v + ((int64_t)seq * (p.n_head / p.group) + hk) * D;
      float x[D / 32];
#pragma unroll
      for (int j = 0; j < D / 32; ++j) x[j] = v[lane + 32 * j];
      __half* vc = reinterpret_cast<__half*>(const_cast<char*>(p.v) + at);
      float* vrow = prep_rows + (nh + 1) * D;
#pragma unroll
      for (int j = 0; j < D / 32; ++j) {
        vc[lane + 32 * j] = __float2half_rn(x[j]);
        vrow[lane + 32 * j] = x[j];
      }
    };
    if constexpr (kProj) {  // fewer warps than rows: k, v, then the q heads, dealt round
      for (int it = warp; it < nh + 2; it += nw) it == 0 ? prep_k() : it == 1 ? prep_v() : prep_q(it - 2);
    } else if (warp < nh) {
      prep_q(warp);
    } else if (warp == nw - 1) {
      prep_k();
    } else if (warp == nw - 2) {
      prep_v();
    }
    __syncthreads();  // q in shared memory, the position's K and V in the cache and in shared memory
  }
  // q of this warp's heads as B fragments (k = head dims, n = heads), rounded to f16 as the CPU does.
  uint32_t qb[D / 16][2];
  {
    const bool valid = gid < nh;
    const float* qrow = prep ? prep_rows + (valid ? gid : 0) * D
                             : p.q + ((int64_t)seq * p.n_head + h0 + (valid ? gid : 0)) * p.q_stride;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const float2 x0 =
          valid ? *reinterpret_cast<const float2*>(qrow + 16 * ks + 2 * tig) : make_float2(0, 0);
      const float2 x1 =
          valid ? *reinterpret_cast<const float2*>(qrow + 16 * ks + 8 + 2 * tig) : make_float2(0, 0);
      qb[ks][0] = pack_half2(x0.x, x0.y);
      qb[ks][1] = pack_half2(x1.x, x1.y);
    }
  }

  float o[D / 16][4];
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // heads 2tig, 2tig+1

  if (!early) prologue();
  for (int step = 0; step < n_steps; ++step) {
    if (step + kStages - 1 < n_steps) load_step(step + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint32_t stage = ring + (step % kStages) * kStageBytes;
    uint32_t ks = stage, vs = stage + kKBytes;
    if constexpr (kPrepForm) {
      const int row = pos - (kb + step * kStepKeys);
      if (own_pos && row < kStepKeys) {  // the position's rows, rounded as the stores above round them
        for (int i = lane; i < 2 * (D / 8); i += 32) {
          const int ch = i % (D / 8);
          const float* src = prep_rows + (nh + i / (D / 8)) * D + 8 * ch;
          uint4 h;
          h.x = pack_half2(src[0], src[1]);
          h.y = pack_half2(src[2], src[3]);
          h.z = pack_half2(src[4], src[5]);
          h.w = pack_half2(src[6], src[7]);
          st_shared16((i < D / 8 ? ks : vs) + swizzle<D>(row, ch) * 16, h);
        }
        __syncwarp();
      }
    }
    if constexpr (KT != kKvF16) {
      dequantize_stage<D, KT>(reinterpret_cast<const char*>(smem_raw) + (ks - base), k_tile, lane);
      ks = k_tile;
    }
    if constexpr (VT != kKvF16) {
      dequantize_stage<D, VT>(reinterpret_cast<const char*>(smem_raw) + (vs - base), v_tile, lane);
      vs = v_tile;
    }
    if constexpr (KT != kKvF16 || VT != kKvF16) __syncwarp();  // the tiles are written before ldmatrix

    // S^T: keys gid, gid+8 (rows) x heads 2tig, 2tig+1 (columns).
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, ks + swizzle<D>((lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16) * 16);
      mma_f16(s, a[0], a[1], a[2], a[3], qb[kk][0], qb[kk][1]);
    }
    const int key_a = kb + step * kStepKeys + gid;
    const bool va = key_a < ke, vb = key_a + 8 < ke;
    s[0] = va ? s[0] * p.scale_log2 : -INFINITY;
    s[1] = va ? s[1] * p.scale_log2 : -INFINITY;
    s[2] = vb ? s[2] * p.scale_log2 : -INFINITY;
    s[3] = vb ? s[3] * p.scale_log2 : -INFINITY;

    // Online softmax per head (column): the max over the 16 keys lives in the 8 lanes of one tig.
    float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], off));
    float alpha[2], base[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float mn = fmaxf(m[j], mx[j]);
      base[j] = mn == -INFINITY ? 0.0f : mn;
      alpha[j] = exp2f(m[j] - base[j]);
      m[j] = mn;
    }
    const float p0 = exp2f(s[0] - base[0]), p1 = exp2f(s[1] - base[1]);
    const float p2 = exp2f(s[2] - base[0]), p3 = exp2f(s[3] - base[1]);
    l[0] = l[0] * alpha[0] + (p0 + p2);
    l[1] = l[1] * alpha[1] + (p1 + p3);
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      o[mt][0] *= alpha[0];
      o[mt][1] *= alpha[1];
      o[mt][2] *= alpha[0];
      o[mt][3] *= alpha[1];
    }
    // P^T as the B operand: keys 2tig, 2tig+1 (+8) of head gid.
    const uint32_t b0 = movmatrix_trans(pack_half2(p0, p1)), b1 = movmatrix_trans(pack_half2(p2, p3));
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, vs + swizzle<D>((lane % 8) + 8 * (lane / 16), 2 * mt + (lane / 8) % 2) * 16);
      mma_f16(o[mt], a[0], a[1], a[2], a[3], b0, b1);
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }

#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) l[j] += __shfl_xor_sync(0xffffffffu, l[j], off);
  if constexpr (kProj)
    return combine_proj<D>(p, smem_raw, warp_smem_bytes<D, KT, VT>(), wsm, blockIdx.y, o, m, l);
  if (p.one_block)
    return combine_in_block<D>(p, smem_raw, warp_smem_bytes<D, KT, VT>(), seq, h0, nh, o, m, l);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int hj = 2 * tig + j;
    if (hj >= nh) continue;
    const int64_t idx = ((int64_t)seq * p.n_head + h0 + hj) * p.max_splits + split;
    if (gid == 0) p.part_ml[idx] = make_float2(m[j], l[j]);
    float* po = p.part_o + idx * D;
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      po[16 * mt + gid] = o[mt][j];
      po[16 * mt + gid + 8] = o[mt][2 + j];
    }
  }
}

template <int D, int KT, int VT>
__global__ void __launch_bounds__(128) decode_kernel(DecodeParams p) {
  decode_body<D, KT, VT, false>(p);
}
template <int D>
__global__ void __launch_bounds__(kProjThreads) decode_proj_kernel(DecodeParams p) {
  decode_body<D, kKvF16, kKvF16, true>(p);
}

// out = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s over the active splits of one (sequence, head).
// Block (head, sequence, 32 dims): 8 warps take every 8th split, a lane one dim, then a shared sum.
constexpr int kCombineWarps = 8;
__global__ void __launch_bounds__(32 * kCombineWarps) combine_kernel(DecodeParams p, int D) {
  __shared__ float w[kMaxSplits];
  __shared__ float red[kCombineWarps];
  __shared__ float part[kCombineWarps][32];
  const int h = blockIdx.x, seq = blockIdx.y, d = blockIdx.z * 32 + threadIdx.x % 32;
  const int tid = threadIdx.x, warp = tid / 32, nt = blockDim.x;
  const SplitRange r = split_range(p, seq);
  const int64_t base = ((int64_t)seq * p.n_head + h) * p.max_splits;
  const int64_t at = ((int64_t)seq * p.n_head + h) * D + d;
  // The positions (host copies) and the gate (written before the attention kernel) before the wait.
  const float g =
      p.gate && warp == 0 && d < D ? p.gate[((int64_t)seq * p.n_head + h) * p.gate_stride + d] : 0.0f;
  pdl_begin();

  auto block_reduce = [&](float v, bool is_max) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v, off);
      v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();
    if (tid % 32 == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int i = 1; i < kCombineWarps; ++i) v = is_max ? fmaxf(v, red[i]) : v + red[i];
    return v;
  };

  // The first kPre partial outputs of this thread are loaded now, with the (max, sum) pairs, rather than
  // after the two reductions that give their weights: one wait for memory instead of two.
  constexpr int kPre = 2;
  float pre[kPre];
#pragma unroll
  for (int j = 0; j < kPre; ++j) {
    const int s = warp + j * kCombineWarps;
    pre[j] = d < D && s < r.n_active ? p.part_o[(base + s) * D + d] : 0.0f;
  }
  float mx = -INFINITY;
  for (int s = tid; s < r.n_active; s += nt) mx = fmaxf(mx, p.part_ml[base + s].x);
  const float M = block_reduce(mx, true);
  float sum = 0.0f;
  for (int s = tid; s < r.n_active; s += nt) {
    const float2 ml = p.part_ml[base + s];
    const float ws = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - M);
    w[s] = ws;
    sum += ws * ml.y;
  }
  const float L = block_reduce(sum, false);  // its barriers also publish w[]
  float acc = 0.0f;
  if (d < D) {
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      const int s = warp + j * kCombineWarps;
      if (s < r.n_active) acc += w[s] * pre[j];
    }
    for (int s = warp + kPre * kCombineWarps; s < r.n_active; s += kCombineWarps)
      acc += w[s] * p.part_o[(base + s) * D + d];
  }
  part[warp][tid % 32] = acc;
  __syncthreads();
  if (warp == 0 && d < D) {
    float o = 0.0f;
    for (int i = 0; i < kCombineWarps; ++i) o += part[i][tid];
    float v = L > 0.0f ? o / L : 0.0f;
    if (p.gate) v *= sigmoidf(g);
    p.out[at] = v;
    // This warp holds one whole 32-block (D % 32 == 0).
    if (p.out_q) warp_quantize_q8_1(v, p.out_q + at, p.out_ds + at / 32);
  }
}

struct DecodePlan {
  int n_hchunk, hc_heads, max_splits, warps;
  bool fuse_prep;  // a.prep done inside the blocks
  size_t smem_bytes, ml_bytes, o_bytes;
};

}  // namespace
}  // namespace xpert::cuda
