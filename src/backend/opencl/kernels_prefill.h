// OpenCL C of the whole-model backend's prefill products (prefill.cpp): register-tiled GEMMs over the GGUF
// blocks read in place, for dense matrices and for a MoE layer's experts grouped on the device. Core OpenCL C
// 1.2 (no subgroups, no fp16 arithmetic), f32 FMA.
//
// Two tile texts, appended to each weight type's matmul program (after kMatmulSource: dequant32) once per
// form (program_texts.cpp); names suffixed by PT_SUF, _m64 (64 rows a work-group) and _m32 (32 rows):
// - kPrefillDenseTileSource, the dense product gemm_t: 128 columns x 16 PT_RM rows a work-group of 16 x 16,
//   each work-item 8 columns x PT_RM rows (PT_RM 4: _m64, 2: _m32); per 32-deep chunk of k, the weights of
//   128 rows dequantized into local memory (ws[k][column]) and the activations loaded (xs[k][row]).
// - kPrefillTileSource, the grouped MoE products: 256 columns x 8 PT_TYN rows a work-group of 32 PT_TYN
//   (PT_TYN 8: _m64, 4: _m32), each work-item an 8 x 8 block (columns 4 tx + c and 128 + 4 tx + c, rows
//   8 ty + r), per 16-deep step of k.
// 8 x 8 blocks need a quarter of the local-memory reads per FMA of 8 x 2 (NVIDIA: 16 wavefronts for 64 FMA
// instructions, against 10 for 16), and a MoE layer's many expert tiles give them warps enough; the dense
// products at 512 rows, which give 8 x 8 blocks 2-4 warps a compute unit, lost in them (H100, qwen3.5-35b-a3b
// pp512: 185 ms for the dense products of two passes, in 8 x 8, 8 x 4 and 8 x 2 blocks of 256 columns,
// against 146 in these; 2026-12-05).
//   gemm_t          y[m][n] = x[m][k] . w[n][k]^T (columns: 128 consecutive features)
//   gemm_tk         the same split along k into planes of partial sums (a product of few tiles), which each
//                   tile's last slice adds (gemm_tk_sum); two products of one shape (k and v) in one launch
//   moe_gate_up_t   grouped rows of one expert (a tile of the device-built list, moe_group): columns 0..127
//                   gate features f0.., 128..255 the same up features; h = silu(gate) * up (SwiGLU fused);
//                   the activation row of grouped row g is token row_slot[g] / k_used of x
//   moe_down_t      grouped rows: yg[g] = h[g] . down_e^T
//
// kPrefillOpsSource (appended to the ops program): moe_group, the device-side grouping of (token, slot) by
// expert after moe_route_slots: counts, offsets, the tile list, and row_slot / slot_row of the grouped rows.
#pragma once
#include <string_view>

namespace xpert::opencl {

// Once per matmul program, before the tile texts' forms: half of a chunk's bytes in registers (pt_raw: the
// row's weights 16 hf .. 16 hf + 15 of the chunk), loaded a step ahead of the math that dequantizes them
// (pt_deq), so the next step's loads are in flight while this one is multiplied. Q4_K and Q6_K (wide loads);
// F32 / F16 / BF16 (16 values, 0 past the row's k: pt_load's last argument, which the block types ignore);
// other types are read at dequantization (dequant32). pt_deq gives dequant32's values. Also both tiles' FMAs
// of one k (PT_FMA8) and their kernels' names (PT_NAME).
inline constexpr std::string_view kPrefillRawSource = R"CLC(
// A kernel's name in the form being built: n followed by PT_SUF (_m64, _m32).
#define PT_CAT2(a, b) a##b
#define PT_CAT(a, b) PT_CAT2(a, b)
#define PT_NAME(n) PT_CAT(n, PT_SUF)
// acc[j][r] += the weight of a work-item's column j (a0's for j < 4, a1's for j >= 4) x b[r], for r < rows.
#define PT_FMA8(a0, a1, b, acc, rows)                 \
  for (int r_ = 0; r_ < (rows); ++r_) {              \
    acc[0][r_] = fma((a0).x, (b)[r_], acc[0][r_]); \
    acc[1][r_] = fma((a0).y, (b)[r_], acc[1][r_]); \
    acc[2][r_] = fma((a0).z, (b)[r_], acc[2][r_]); \
    acc[3][r_] = fma((a0).w, (b)[r_], acc[3][r_]); \
    acc[4][r_] = fma((a1).x, (b)[r_], acc[4][r_]); \
    acc[5][r_] = fma((a1).y, (b)[r_], acc[5][r_]); \
    acc[6][r_] = fma((a1).z, (b)[r_], acc[6][r_]); \
    acc[7][r_] = fma((a1).w, (b)[r_], acc[7][r_]); \
  }
#if defined(WT_Q4_K) && !defined(NO_WIDE_LOADS)
#define PT_RAW 1
// The block's bytes 0..15 (d, dmin, the 12 scale bytes) and half hf of the 32 quant bytes of the chunk's
// pair of sub-blocks: two 16-byte loads (Q4_K blocks are 144 bytes, so rows stay 16-byte aligned).
typedef struct {
  uint4 h, q;
} pt_raw;
pt_raw pt_load(global const uchar* row, int j, int hf, int k) {
  global const uchar* b = row + (j / 8) * 144;
  pt_raw r;
  r.h = *(global const uint4*)b;
  r.q = *(global const uint4*)(b + 16 + 32 * ((j % 8) / 2) + 16 * hf);
  return r;
}
void pt_deq(const pt_raw* r, int j, float* w) {
  const int s = j % 8, hi = s & 1;
  float sc, mn;
  k4_scale_min(r->h, s, &sc, &mn);
  const float d = h2f(r->h.x) * sc, m = h2f(r->h.x >> 16) * mn;
  const uint q[4] = {r->q.x, r->q.y, r->q.z, r->q.w};
  for (int l4 = 0; l4 < 4; ++l4) {
    const uint v = hi ? q[l4] >> 4 : q[l4];
    w[4 * l4 + 0] = d * (int)(v & 0xF) - m;
    w[4 * l4 + 1] = d * (int)((v >> 8) & 0xF) - m;
    w[4 * l4 + 2] = d * (int)((v >> 16) & 0xF) - m;
    w[4 * l4 + 3] = d * (int)((v >> 24) & 0xF) - m;
  }
}
#elif defined(WT_Q6_K) && !defined(NO_WIDE_LOADS)
#define PT_RAW 1
// Half hf of the chunk: 8 + 8 two-quant words of ql / qh, its scale and d (Q6_K blocks are 210 bytes:
// 2-byte aligned).
typedef struct {
  ushort ql[8], qh[8];
  ushort sc, d;
} pt_raw;
pt_raw pt_load(global const uchar* row, int j, int hf, int k) {
  pt_raw r;
  global const uchar* b = row + (j / 8) * 210;
  const int s = j % 8, c = s / 4, g = s % 4;
  global const ushort* ql = (global const ushort*)(b + 64 * c + 32 * (g & 1) + 16 * hf);
  global const ushort* qh = (global const ushort*)(b + 128 + 32 * c + 16 * hf);
  for (int i = 0; i < 8; ++i) r.ql[i] = ql[i];
  for (int i = 0; i < 8; ++i) r.qh[i] = qh[i];
  r.sc = b[192 + 8 * c + 2 * g + hf];
  r.d = *(global const ushort*)(b + 208);
  return r;
}
void pt_deq(const pt_raw* r, int j, float* w) {
  const int g = (j % 8) % 4;
  const float ds = h2f(r->d) * (char)(r->sc & 0xFF);
  const int lo_shift = g >= 2 ? 4 : 0, hi_shift = 2 * g;
  for (int l2 = 0; l2 < 8; ++l2) {
    const uint lv = (uint)r->ql[l2] >> lo_shift, hv = (uint)r->qh[l2] >> hi_shift;
    const int q0 = (int)((lv & 0xF) | ((hv & 3) << 4)) - 32;
    const int q1 = (int)(((lv >> 8) & 0xF) | (((hv >> 8) & 3) << 4)) - 32;
    w[2 * l2] = ds * q0;
    w[2 * l2 + 1] = ds * q1;
  }
}
#elif defined(PLAIN)
#define PT_RAW 1
// F32, F16, BF16 rows (the router's, a few small products): the 16 values of half hf of chunk j (0 past the
// row's k), as dequant32 reads them. Read at dequantization, each chunk waited for its loads (H100,
// qwen3-30b-a3b pp512: the router's 512 x 2048 x 128 product took 44 us a launch, 2026-12-06).
typedef struct {
  float v[16];
} pt_raw;
pt_raw pt_load(global const uchar* row, int j, int hf, int k) {
  pt_raw r;
  const int i0 = 32 * j + 16 * hf;
  for (int i = 0; i < 16; ++i) r.v[i] = i0 + i < k ? ld_plain(row, i0 + i) : 0.0f;
  return r;
}
void pt_deq(const pt_raw* r, int j, float* w) {
  for (int i = 0; i < 16; ++i) w[i] = r->v[i];
}
#endif
)CLC";

inline constexpr std::string_view kPrefillDenseTileSource = R"CLC(
#ifndef PT_DBUFS
#define PT_DBUFS 1
#endif
#define PT_BM (16 * PT_RM)
#define PT_XN (PT_BM / 32)

// The tile's product over k into acc[8][PT_RM] (declared by the kernel, so it stays in registers): wa / wb are
// the rows of columns 0 and 64 (na / nb of them valid, the rest read as 0); xr[i] is activation row
// (tid >> 3) + 32 i of the tile (null: past its end, read as 0), i < PT_XN.
// Loads, every work-item a share (coalesced as far as rows allow): weight row tid >> 1, its half tid & 1 of
// the chunk (one 16-byte load of quants and one of the block's scales for Q4_K: two rows' 32 bytes a line per
// pair of work-items, where one work-item a row read 12 scattered words); activations: 4 floats of row
// (tid >> 3) + 32 i, eight work-items a row's 128 bytes.
// Products: work-item tid holds columns 4 tx + c, 64 + 4 tx + c and rows PT_RM ty + r with tx, ty such that a
// warp of 32 spans 4 tx x 8 ty: its reads of local memory per k are 64 + 64 bytes of ws and 32 PT_RM bytes of xs.
// PT_DBUFS 2 (a device with the local memory for two chunks: 40 KiB at _m32, 48 at _m64; gemm_tk's flag then
// lives in xs, free once the tile is done): each chunk's weights and activations go to the other buffer,
// stored right after this chunk's products, so a chunk takes one barrier instead of two (H100, qwen3-30b-a3b
// pp512: gemm_tk_m64 206.2 -> 195.4 us a launch, gemm_t_m64 291.7 -> 284.9; 2026-12-07).
#define PT_TILE_MM(wa, wb, row_bytes, na, nb, k, xr, ws, xs, acc)                                             \
  {                                                                                                           \
    const int tid_ = get_local_id(1) * 16 + get_local_id(0);                                                  \
    const int tx_ = PT_TX(tid_), ty_ = PT_TY(tid_);                                                           \
    for (int j_ = 0; j_ < 8; ++j_)                                                                            \
      for (int r_ = 0; r_ < PT_RM; ++r_) acc[j_][r_] = 0.0f;                                                  \
    const int chunks_ = ((k) + 31) / 32;                                                                      \
    const int wr_ = tid_ >> 1, half_ = tid_ & 1, xp_ = tid_ & 7, xm_ = tid_ >> 3;                             \
    global const uchar* wrow_ = wr_ < 64 ? (wa) + (ulong)wr_ * (row_bytes) : (wb) + (ulong)(wr_ - 64) * (row_bytes); \
    const int wvalid_ = wr_ < 64 ? wr_ < (na) : wr_ - 64 < (nb);                                              \
    PT_RAW_DECL                                                                                               \
    float4 xv_[PT_XN];                                                                                        \
    PT_RAW_LOAD(0)                                                                                            \
    PT_LOAD_X(xr, k, 0)                                                                                       \
    if (chunks_ > 0) PT_DSTORE(ws, xs, 0, 0)                                                                  \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
    for (int j_ = 0; j_ < chunks_; ++j_) {                                                                    \
      local const float* wsb_ = (ws) + (j_ % PT_DBUFS) * 32 * 128;                                            \
      local const float* xsb_ = (xs) + (j_ % PT_DBUFS) * 32 * PT_BM;                                          \
      if (j_ + 1 < chunks_) { /* the next chunk's loads, in flight during the products */                     \
        PT_RAW_LOAD(j_ + 1)                                                                                   \
        PT_LOAD_X(xr, k, j_ + 1)                                                                              \
      }                                                                                                       \
      _Pragma("unroll 8") for (int kk_ = 0; kk_ < 32; ++kk_) {                                                \
        const float4 a0_ = *(local const float4*)(wsb_ + kk_ * 128 + 4 * tx_);                                \
        const float4 a1_ = *(local const float4*)(wsb_ + kk_ * 128 + 64 + 4 * tx_);                           \
        PT_LOAD_B(xsb_ + kk_ * PT_BM + PT_RM * ty_)                                                           \
        PT_FMA8(a0_, a1_, b_, acc, PT_RM)                                                                     \
      }                                                                                                       \
      PT_DONE_BUF_BARRIER                                                                                     \
      if (j_ + 1 < chunks_) PT_DSTORE(ws, xs, (j_ + 1) % PT_DBUFS, j_ + 1)                                    \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                           \
    }                                                                                                         \
  }
// Chunk jj's weights, dequantized, and activations (in raw_ / xv_) into buffer bf of ws / xs; inside
// PT_TILE_MM only (its locals: wrow_, wvalid_, half_, wr_, xv_, xp_, xm_).
#define PT_DSTORE(ws, xs, bf, jj)                                                                             \
  {                                                                                                           \
    float wv_[16];                                                                                            \
    if (wvalid_) {                                                                                            \
      PT_DEQ(wrow_, (jj), (k), wv_);                                                                          \
    } else {                                                                                                  \
      for (int i_ = 0; i_ < 16; ++i_) wv_[i_] = 0.0f;                                                         \
    }                                                                                                         \
    for (int i_ = 0; i_ < 16; ++i_) (ws)[(bf) * 32 * 128 + (16 * half_ + i_) * 128 + wr_] = wv_[i_];          \
    for (int it_ = 0; it_ < PT_XN; ++it_) {                                                                   \
      (xs)[(bf) * 32 * PT_BM + (4 * xp_ + 0) * PT_BM + xm_ + 32 * it_] = xv_[it_].x;                          \
      (xs)[(bf) * 32 * PT_BM + (4 * xp_ + 1) * PT_BM + xm_ + 32 * it_] = xv_[it_].y;                          \
      (xs)[(bf) * 32 * PT_BM + (4 * xp_ + 2) * PT_BM + xm_ + 32 * it_] = xv_[it_].z;                          \
      (xs)[(bf) * 32 * PT_BM + (4 * xp_ + 3) * PT_BM + xm_ + 32 * it_] = xv_[it_].w;                          \
    }                                                                                                         \
  }
#if PT_DBUFS == 1
#define PT_DONE_BUF_BARRIER barrier(CLK_LOCAL_MEM_FENCE); /* the products read the buffer the next chunk fills */
#else
#define PT_DONE_BUF_BARRIER
#endif
#if PT_RM == 4
#define PT_LOAD_B(p)                                                                                          \
  const float4 b4_ = *(local const float4*)(p);                                                               \
  const float b_[4] = {b4_.x, b4_.y, b4_.z, b4_.w};
#else
#define PT_LOAD_B(p)                                                                                          \
  const float2 b2_ = *(local const float2*)(p);                                                               \
  const float b_[2] = {b2_.x, b2_.y};
#endif
// This work-item's float4s of the activation rows xr[] for chunk jj (0 past k or without a row).
#define PT_LOAD_X(xr, k, jj) \
  for (int it_ = 0; it_ < PT_XN; ++it_) xv_[it_] = ld_x4((xr)[it_], (jj) * 32 + 4 * xp_, (k));
#if defined(PT_RAW)
#define PT_RAW_DECL pt_raw raw_;
#define PT_RAW_LOAD(jj) \
  if (wvalid_) raw_ = pt_load(wrow_, (jj), half_, k);
#define PT_DEQ(row, jj, k, w) pt_deq(&raw_, (jj), (w))
#else
#define PT_RAW_DECL
#define PT_RAW_LOAD(jj)
#define PT_DEQ(row, jj, k, w)                                 \
  {                                                           \
    float w32_[32];                                           \
    dequant32((row), (jj), (k), w32_);                        \
    for (int i_ = 0; i_ < 16; ++i_) (w)[i_] = w32_[16 * half_ + i_]; \
  }
#endif
// This work-item's tx / ty (as PT_TILE_MM maps them).
// (A warp over 16 tx x 2 ty instead lost: pp512 1,130 against 1,524-1,575 t/s, H200, 2026-12-04 16:47.)
#define PT_TX(tid) ((((tid) >> 5) & 3) * 4 + ((tid) & 3))
#define PT_TY(tid) (((tid) >> 7) * 8 + (((tid) >> 2) & 7))

// Work-group (gi, j) of 16 x 16: features 128 gi .., rows PT_BM j ...; its locals come from the kernel.
void PT_NAME(gemm_t_group)(global const uchar* w, ulong row_bytes, global const float* x, int ldx, int k,
                           int n_out, global float* y, int ldy, int m, local float* ws, local float* xs, int gi) {
  const int n0 = gi * 128, m0 = get_group_id(1) * PT_BM;
  const int tid = get_local_id(1) * 16 + get_local_id(0), tx = PT_TX(tid), ty = PT_TY(tid);
  global const float* xr[PT_XN];
  for (int i = 0; i < PT_XN; ++i) {
    const int row = m0 + (tid >> 3) + 32 * i;
    xr[i] = row < m ? x + (long)row * ldx : 0;
  }
  float acc[8][PT_RM];
  PT_TILE_MM(w + (ulong)n0 * row_bytes, w + (ulong)(n0 + 64) * row_bytes, row_bytes, min(64, n_out - n0),
             min(64, n_out - n0 - 64), k, xr, ws, xs, acc)
  for (int r = 0; r < PT_RM; ++r) {
    const int rr = m0 + PT_RM * ty + r;
    if (rr >= m) break;
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4);
      if (n < n_out) y[(long)rr * ldy + n] = acc[j][r];
    }
  }
}

kernel void PT_NAME(gemm_t)(global const uchar* w, ulong row_bytes, global const float* x, int ldx, int k,
                            int n_out, global float* y, int ldy, int m) {
  local float ws[PT_DBUFS * 32 * 128] __attribute__((aligned(16)));
  local float xs[PT_DBUFS * 32 * PT_BM] __attribute__((aligned(16)));
  PT_NAME(gemm_t_group)(w, row_bytes, x, ldx, k, n_out, y, ldy, m, ws, xs, get_group_id(0));
}

// Rows m0 .. m0 + PT_BM - 1 (below m) and columns n0 .. n0 + 127 (below n) of y = the sum of the n_planes planes
// of m x n in plane order (0 + plane 0 + plane 1 ...), by the 256 work-items tid of a group. Volatile loads
// (the other groups' planes, past last_group) each take a trip of their own unless batched: 16 float4s a
// work-item in flight at a time (PT_SUM_P planes of its PT_SUM_U; a plane at a time, the sum cost ~6 us a
// launch of 8 planes, H100); 16 floats where n % 4 != 0.
#define PT_SUM_U (PT_BM / 8)
#define PT_SUM_P (16 / PT_SUM_U)
void PT_NAME(gemm_tk_sum)(volatile global const float* planes, int n_planes, int m, int n, int n0, int m0,
                          global float* y, int ldy, int tid) {
  const long plane = (long)m * n;
  if (n % 4 == 0) {
    float4 acc[PT_SUM_U];
    for (int u = 0; u < PT_SUM_U; ++u) acc[u] = (float4)(0.0f);
    for (int p0 = 0; p0 < n_planes; p0 += PT_SUM_P) {
      float4 v[PT_SUM_P][PT_SUM_U];
      for (int q = 0; q < PT_SUM_P; ++q)
        for (int u = 0; u < PT_SUM_U; ++u) {
          const int e = tid + 256 * u, r = m0 + e / 32, c = n0 + 4 * (e % 32);
          v[q][u] = p0 + q < n_planes && r < m && c < n
                        ? *(volatile global const float4*)(planes + (p0 + q) * plane + (long)r * n + c)
                        : (float4)(0.0f);
        }
      for (int q = 0; q < PT_SUM_P; ++q)
        for (int u = 0; u < PT_SUM_U; ++u)
          if (p0 + q < n_planes) acc[u] += v[q][u];
    }
    for (int u = 0; u < PT_SUM_U; ++u) {
      const int e = tid + 256 * u, r = m0 + e / 32, c = n0 + 4 * (e % 32);
      if (r >= m || c >= n) continue;
      global float* yr = y + (long)r * ldy + c;
      yr[0] = acc[u].x, yr[1] = acc[u].y, yr[2] = acc[u].z, yr[3] = acc[u].w;
    }
    return;
  }
  for (int e0 = 0; e0 < PT_BM * 128; e0 += 16 * 256) {
    float acc[16];
    for (int u = 0; u < 16; ++u) acc[u] = 0.0f;
    for (int p = 0; p < n_planes; ++p) {
      float v[16];
      for (int u = 0; u < 16; ++u) {
        const int e = e0 + tid + 256 * u, r = m0 + e / 128, c = n0 + e % 128;
        v[u] = e < PT_BM * 128 && r < m && c < n ? planes[p * plane + (long)r * n + c] : 0.0f;
      }
      for (int u = 0; u < 16; ++u) acc[u] += v[u];
    }
    for (int u = 0; u < 16; ++u) {
      const int e = e0 + tid + 256 * u, r = m0 + e / 128, c = n0 + e % 128;
      if (e < PT_BM * 128 && r < m && c < n) y[(long)r * ldy + c] = acc[u];
    }
  }
}

// A product split along k (prefill.cpp gemm_split: products of too few tiles to fill the device): work-group
// (i, j, s) multiplies slice s of the k (kc of them from s kc, a multiple of 256 so whole blocks of every
// weight type: kc_bytes of each row) into plane s of its product's planes (m rows of n_out from s m n_out).
// The tile's last slice to finish (its count in counters[j * groups(0) + i], left at 0) then adds the tile's
// planes in plane order into y (ldy), gemm_tk_sum: no launch of its own for the sums. Two products of the
// same shape on the same rows (a layer's k and v): column groups i < cols1 are w's into y, the next cols1
// w2's into y2, its planes after w's (one launch where each took one; w2, y2 unused where groups(0) is cols1).
kernel void PT_NAME(gemm_tk)(global const uchar* w, ulong row_bytes, global const float* x, int ldx, int k,
                             int kc, ulong kc_bytes, int n_out, global float* planes, global float* y, int ldy,
                             int m, volatile global int* counters, global const uchar* w2, global float* y2,
                             int cols1) {
  local float ws[PT_DBUFS * 32 * 128] __attribute__((aligned(16)));
  local float xs[PT_DBUFS * 32 * PT_BM] __attribute__((aligned(16)));
  const int s = get_group_id(2), second = get_group_id(0) >= cols1;  // the same in the whole group
  const int gi = get_group_id(0) - (second ? cols1 : 0);
  global float* pp = planes + (second ? (long)get_num_groups(2) * m * n_out : 0);
  PT_NAME(gemm_t_group)((second ? w2 : w) + s * kc_bytes, row_bytes, x + s * kc, ldx, min(kc, k - s * kc), n_out,
                        pp + (long)s * m * n_out, n_out, m, ws, xs, gi);
  const int tile = get_group_id(1) * get_num_groups(0) + get_group_id(0);
  if (!last_group(counters + tile, get_num_groups(2), (local int*)xs)) return;  // the whole group; xs is free
  PT_NAME(gemm_tk_sum)(pp, get_num_groups(2), m, n_out, gi * 128, get_group_id(1) * PT_BM, second ? y2 : y, ldy,
                       get_local_id(1) * 16 + get_local_id(0));
}

#undef PT_BM
#undef PT_XN
#undef PT_SUM_U
#undef PT_SUM_P
#undef PT_LOAD_B
#undef PT_LOAD_X
#undef PT_RAW_DECL
#undef PT_RAW_LOAD
#undef PT_DEQ
#undef PT_TILE_MM
#undef PT_DSTORE
#undef PT_DONE_BUF_BARRIER
#undef PT_TX
#undef PT_TY
)CLC";

inline constexpr std::string_view kPrefillTileSource = R"CLC(
#ifndef PT_BUFS
#define PT_BUFS 1
#endif
#define PT_BM (8 * PT_TYN)
#define PT_NW (32 * PT_TYN)
#define PT_WU (256 / PT_NW)

// The tile's product over k into acc[8][8] (declared by the kernel, so it stays in registers): wa / wb are
// the weight rows of columns 0 and 128 (na / nb of them valid, the rest read as 0); xr is this work-item's
// activation row tid % PT_BM of the tile (null: past its end, read as 0); nr of the tile's rows are valid.
// A step is 16 of k. Loads, every work-item a share: weight rows tid + PT_NW u (u < PT_WU), each the step's
// half of its 32-weight chunk (Q4_K: one 16-byte load of quants and one of the block's scales), so a warp
// stores 32 consecutive columns of ws (no bank conflict); activations: the float4 tid / PT_BM of row
// tid % PT_BM (a warp stores 32 consecutive rows of xs). The next step's loads are in flight during the
// products. PT_BUFS 2 (a device with the local memory for two steps: 36 KiB at _m32, 40 at _m64): each step's
// weights and activations go to the other buffer, stored right after this step's products, so a step takes
// one barrier instead of two and a warp's dequantization follows its own products without waiting for the
// group's.
// Products: work-item (tx, ty) = (tid % 32, tid / 32) holds columns 4 tx + c and 128 + 4 tx + c (c < 4) for
// rows 8 ty + r (r < 8): per k, four 16-byte reads of local memory for 64 FMAs (a warp: 16 wavefronts for 64
// FMA instructions, so local memory keeps up with the FMA units; the dense tile's 8 x 2 has 10 for 16).
// (Warps of 8 tx x 4 ty, 4 distinct lines a k instead of 10, were mixed: qwen3-30b-a3b pp512 +1.5 %,
// qwen3.5-35b-a3b -3.5 %; H200, 2026-12-06. Taken in full tiles only, moe_gate_up_t stayed at 1,153 us a
// launch and moe_down_t went 561 -> 551: pp512 +0.3 to +0.7 %, within the runs' spread; H100, 2026-12-07. So
// the local memory's lines are not what bounds these tiles.)
// A warp whose 8 rows are all past nr skips the products (it still loads its share and takes every barrier):
// an expert's last tile is seldom full (qwen3-30b-a3b synth, pp512: 74 % of the 32-row tiles' rows hold a
// token, 93 % of the warps' 8 rows), and the FMA issue slots it leaves go to the unit's other groups.
#define PT_TILE_MM(wa, wb, row_bytes, na, nb, nr, k, xr, ws, xs, acc)                                         \
  {                                                                                                           \
    const int tid_ = get_local_id(0), tx_ = tid_ & 31, ty_ = tid_ >> 5;                                       \
    const int xm_ = tid_ % PT_BM, xp_ = tid_ / PT_BM;                                                         \
    for (int j_ = 0; j_ < 8; ++j_)                                                                            \
      for (int r_ = 0; r_ < 8; ++r_) acc[j_][r_] = 0.0f;                                                      \
    const int steps_ = ((k) + 15) / 16;                                                                       \
    global const uchar* wrow_[PT_WU];                                                                         \
    int wvalid_[PT_WU];                                                                                       \
    for (int u_ = 0; u_ < PT_WU; ++u_) {                                                                      \
      const int wr_ = tid_ + PT_NW * u_;                                                                      \
      wrow_[u_] = wr_ < 128 ? (wa) + (ulong)wr_ * (row_bytes) : (wb) + (ulong)(wr_ - 128) * (row_bytes);      \
      wvalid_[u_] = wr_ < 128 ? wr_ < (na) : wr_ - 128 < (nb);                                                \
    }                                                                                                         \
    PT_RAW_DECL                                                                                               \
    PT_RAW_LOAD(0)                                                                                            \
    float4 xv_ = ld_x4((xr), 4 * xp_, (k));                                                                   \
    PT_STORE(ws, xs, 0, 0)                                                                                    \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
    for (int s_ = 0; s_ < steps_; ++s_) {                                                                     \
      const int b_ = s_ % PT_BUFS;                                                                            \
      if (s_ + 1 < steps_) { /* the next step's loads, in flight during the products */                       \
        PT_RAW_LOAD(s_ + 1)                                                                                   \
        xv_ = ld_x4((xr), (s_ + 1) * 16 + 4 * xp_, (k));                                                      \
      }                                                                                                       \
      if (8 * ty_ < (nr)) { /* uniform in a warp */                                                           \
        local const float* wsb_ = (ws) + b_ * 16 * 256;                                                       \
        local const float* xsb_ = (xs) + b_ * 16 * PT_BM;                                                     \
        _Pragma("unroll 4") for (int kk_ = 0; kk_ < 16; ++kk_) {                                              \
          const float4 a0_ = *(local const float4*)(wsb_ + kk_ * 256 + 4 * tx_);                              \
          const float4 a1_ = *(local const float4*)(wsb_ + kk_ * 256 + 128 + 4 * tx_);                        \
          const float4 b0_ = *(local const float4*)(xsb_ + kk_ * PT_BM + 8 * ty_);                            \
          const float4 b1_ = *(local const float4*)(xsb_ + kk_ * PT_BM + 8 * ty_ + 4);                        \
          const float bv_[8] = {b0_.x, b0_.y, b0_.z, b0_.w, b1_.x, b1_.y, b1_.z, b1_.w};                      \
          PT_FMA8(a0_, a1_, bv_, acc, 8)                                                                      \
        }                                                                                                     \
      }                                                                                                       \
      PT_ONE_BUF_BARRIER                                                                                      \
      if (s_ + 1 < steps_) PT_STORE(ws, xs, (s_ + 1) % PT_BUFS, s_ + 1)                                       \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                           \
    }                                                                                                         \
  }
// Step ss's weights, dequantized, and activations (loaded into raw_ / xv_) into buffer b of ws / xs; inside
// PT_TILE_MM only (its locals: wrow_, wvalid_, raw_, xv_, tid_, xm_, xp_).
#define PT_STORE(ws, xs, b, ss)                                                                               \
  {                                                                                                           \
    for (int u_ = 0; u_ < PT_WU; ++u_) {                                                                      \
      float wv_[16];                                                                                          \
      if (wvalid_[u_]) {                                                                                      \
        PT_DEQ(wrow_[u_], u_, (ss), (k), wv_);                                                                \
      } else {                                                                                                \
        for (int i_ = 0; i_ < 16; ++i_) wv_[i_] = 0.0f;                                                       \
      }                                                                                                       \
      for (int i_ = 0; i_ < 16; ++i_) (ws)[(b) * 16 * 256 + i_ * 256 + tid_ + PT_NW * u_] = wv_[i_];          \
    }                                                                                                         \
    (xs)[(b) * 16 * PT_BM + (4 * xp_ + 0) * PT_BM + xm_] = xv_.x;                                             \
    (xs)[(b) * 16 * PT_BM + (4 * xp_ + 1) * PT_BM + xm_] = xv_.y;                                             \
    (xs)[(b) * 16 * PT_BM + (4 * xp_ + 2) * PT_BM + xm_] = xv_.z;                                             \
    (xs)[(b) * 16 * PT_BM + (4 * xp_ + 3) * PT_BM + xm_] = xv_.w;                                             \
  }
#if PT_BUFS == 1
#define PT_ONE_BUF_BARRIER barrier(CLK_LOCAL_MEM_FENCE); /* the products read the buffer the next step fills */
#else
#define PT_ONE_BUF_BARRIER
#endif
#if defined(PT_RAW)
#define PT_RAW_DECL pt_raw raw_[PT_WU];
#define PT_RAW_LOAD(ss)                                                          \
  for (int u_ = 0; u_ < PT_WU; ++u_)                                              \
    if (wvalid_[u_]) raw_[u_] = pt_load(wrow_[u_], (ss) >> 1, (ss) & 1, k);
#define PT_DEQ(row, u, ss, k, w) pt_deq(&raw_[u], (ss) >> 1, (w))
#else
#define PT_RAW_DECL
#define PT_RAW_LOAD(ss)
#define PT_DEQ(row, u, ss, k, w)                                             \
  {                                                                          \
    float w32_[32];                                                          \
    dequant32((row), (ss) >> 1, (k), w32_);                                  \
    for (int i_ = 0; i_ < 16; ++i_) (w)[i_] = w32_[16 * ((ss) & 1) + i_];    \
  }
#endif
// Column j of a work-item's acc: 4 tx + j, then 128 + 4 tx + j - 4.
#define PT_COL(tx, j) ((j) < 4 ? 4 * (tx) + (j) : 128 + 4 * (tx) + (j) - 4)

// Work-group (i, t): gate and up features 128 i .. of tile t (tiles: expert, first grouped row, end;
// n_tiles[0] of them). h: G rows of n_ff.
kernel __attribute__((reqd_work_group_size(PT_NW, 1, 1)))
void PT_NAME(moe_gate_up_t)(global const uchar* gate, global const uchar* up, ulong row_bytes,
                            ulong expert_stride, global const int* tiles, global const int* n_tiles,
                            global const int* row_slot, int k_used, global const float* x, int ldx, int k,
                            int n_ff, global float* h) {
  local float ws[PT_BUFS * 16 * 256] __attribute__((aligned(16)));
  local float xs[PT_BUFS * 16 * PT_BM] __attribute__((aligned(16)));
  const int t = get_group_id(1);
  if (t >= n_tiles[0]) return;  // the whole group: before any barrier
  const int e = tiles[4 * t], g0 = tiles[4 * t + 1], g1 = tiles[4 * t + 2];
  const int f0 = get_group_id(0) * 128;
  const int tid = get_local_id(0), tx = tid & 31, ty = tid >> 5;
  const int g = g0 + tid % PT_BM;
  global const float* xr = g < g1 ? x + (long)(row_slot[g] / k_used) * ldx : 0;
  const ulong off = (ulong)e * expert_stride + (ulong)f0 * row_bytes;
  float acc[8][8];
  const int nv = min(128, n_ff - f0);
  PT_TILE_MM(gate + off, up + off, row_bytes, nv, nv, g1 - g0, k, xr, ws, xs, acc)
  for (int r = 0; r < 8; ++r) {
    const int gg = g0 + 8 * ty + r;
    if (gg >= g1) break;
    for (int c = 0; c < 4; ++c) {
      const int f = f0 + 4 * tx + c;
      if (f < n_ff) h[(long)gg * n_ff + f] = silu_f(acc[c][r]) * acc[4 + c][r];
    }
  }
}

// Work-group (i, t): output features 256 i .. of tile t; hq: G rows of k; yg: G rows of n_out.
kernel __attribute__((reqd_work_group_size(PT_NW, 1, 1)))
void PT_NAME(moe_down_t)(global const uchar* down, ulong row_bytes, ulong expert_stride,
                         global const int* tiles, global const int* n_tiles, global const float* hq, int k,
                         int n_out, global float* yg) {
  local float ws[PT_BUFS * 16 * 256] __attribute__((aligned(16)));
  local float xs[PT_BUFS * 16 * PT_BM] __attribute__((aligned(16)));
  const int t = get_group_id(1);
  if (t >= n_tiles[0]) return;
  const int e = tiles[4 * t], g0 = tiles[4 * t + 1], g1 = tiles[4 * t + 2];
  const int n0 = get_group_id(0) * 256;
  const int tid = get_local_id(0), tx = tid & 31, ty = tid >> 5;
  const int g = g0 + tid % PT_BM;
  global const float* xr = g < g1 ? hq + (long)g * k : 0;
  global const uchar* we = down + (ulong)e * expert_stride;
  float acc[8][8];
  PT_TILE_MM(we + (ulong)n0 * row_bytes, we + (ulong)(n0 + 128) * row_bytes, row_bytes, min(128, n_out - n0),
             min(128, n_out - n0 - 128), g1 - g0, k, xr, ws, xs, acc)
  for (int r = 0; r < 8; ++r) {
    const int gg = g0 + 8 * ty + r;
    if (gg >= g1) break;
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + PT_COL(tx, j);
      if (n < n_out) yg[(long)gg * n_out + n] = acc[j][r];
    }
  }
}
#undef PT_BM
#undef PT_NW
#undef PT_WU
#undef PT_RAW_DECL
#undef PT_RAW_LOAD
#undef PT_DEQ
#undef PT_COL
#undef PT_TILE_MM
#undef PT_STORE
#undef PT_ONE_BUF_BARRIER
)CLC";

inline constexpr std::string_view kPrefillOpsSource = R"CLC(
#define GROUP_MAX_EXPERTS 1024
// One work-group: the n_slots slots' experts (tasks[2 s + 1], as moe_route_slots writes them) grouped by
// expert. Grouped rows of expert e are offsets[e] .. offsets[e + 1] - 1 (counts in expert order); within an
// expert the order is the atomics' (each row's product is independent of the others', so the results are
// not). tiles: (expert, first row, end row, 0) per bm rows of an expert, n_tiles[0] of them.
kernel void moe_group(global const int* tasks, int n_slots, int n_expert, int bm, global int* row_slot,
                      global int* slot_row, global int* tiles, global int* n_tiles) {
  local int cnt[GROUP_MAX_EXPERTS];
  local int off[GROUP_MAX_EXPERTS];
  const int lid = get_local_id(0), wg = get_local_size(0);
  for (int e = lid; e < n_expert; e += wg) cnt[e] = 0;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = lid; s < n_slots; s += wg) atomic_inc(&cnt[tasks[2 * s + 1]]);
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid == 0) {
    int o = 0, nt = 0;
    for (int e = 0; e < n_expert; ++e) {
      const int c = cnt[e];
      off[e] = o;
      for (int g = o; g < o + c; g += bm) {
        tiles[4 * nt] = e;
        tiles[4 * nt + 1] = g;
        tiles[4 * nt + 2] = min(g + bm, o + c);
        tiles[4 * nt + 3] = 0;
        ++nt;
      }
      o += c;
    }
    n_tiles[0] = nt;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = lid; s < n_slots; s += wg) {
    const int g = atomic_inc(&off[tasks[2 * s + 1]]);
    row_slot[g] = s;
    slot_row[s] = g;
  }
}
)CLC";

}  // namespace xpert::opencl
