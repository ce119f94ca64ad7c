// OpenCL C of the whole-model backend's prefill products (prefill.cpp): register-tiled GEMMs over the GGUF
// blocks read in place, for dense matrices and for a MoE layer's experts grouped on the device. Core OpenCL C
// 1.2 (no subgroups, no fp16 arithmetic), f32 FMA.
//
// kPrefillTileSource is appended to each weight type's matmul program (after kMatmulSource: dequant32) twice,
// once per row tile: with PT_RM 4 (BM = 64 rows per work-group) and PT_RM 2 (BM = 32), names suffixed by
// PT_SUF (_m64, _m32). A work-group of 256 = 16 x 16 computes 128 columns x BM rows: work-item (tx, ty) holds
// columns 4 tx + c and 64 + 4 tx + c (c < 4) for rows PT_RM ty + r. Per 32-deep step of k, work-items 0..127
// each dequantize one column's 32 weights into local memory (ws[k][column]) and work-items 128..255 load the
// BM x 32 activations (xs[k][row]); then every work-item does 32 x 8 x PT_RM FMAs from three vector reads of
// local memory per k.
//   gemm_t          y[m][n] = x[m][k] . w[n][k]^T (columns: 128 consecutive features)
//   moe_gate_up_t   grouped rows of one expert (a tile of the device-built list, moe_group): columns 0..63
//                   gate features f0.., 64..127 the same up features; h = silu(gate) * up (SwiGLU fused); the
//                   activation row of grouped row g is token row_slot[g] / k_used of x
//   moe_down_t      grouped rows: yg[g] = h[g] . down_e^T
//
// kPrefillOpsSource (appended to the ops program): moe_group, the device-side grouping of (token, slot) by
// expert after moe_route_slots: counts, offsets, the tile list, and row_slot / slot_row of the grouped rows.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kPrefillTileSource = R"CLC(
#define PT_BM (16 * PT_RM)
#define PT_CAT2(a, b) a##b
#define PT_CAT(a, b) PT_CAT2(a, b)
#define PT_NAME(n) PT_CAT(n, PT_SUF)

// The tile's product over k: wa / wb are the rows of columns 0 and 64 (na / nb of them valid, the rest read
// as 0); xr is this loader's activation row (work-items 128..255: row (tid - 128) % BM of the tile; null: a
// row past the tile's end, read as 0).
void PT_NAME(tile_mm)(global const uchar* wa, global const uchar* wb, ulong row_bytes, int na, int nb, int k,
                      global const float* xr, local float* ws, local float* xs, float acc[8][PT_RM]) {
  const int tid = get_local_id(1) * 16 + get_local_id(0), tx = get_local_id(0), ty = get_local_id(1);
  for (int j = 0; j < 8; ++j)
    for (int r = 0; r < PT_RM; ++r) acc[j][r] = 0.0f;
  const int chunks = (k + 31) / 32;
  global const uchar* wrow = 0;
  int wvalid = 0;
  if (tid < 128) {
    wrow = tid < 64 ? wa + (ulong)tid * row_bytes : wb + (ulong)(tid - 64) * row_bytes;
    wvalid = tid < 64 ? tid < na : tid - 64 < nb;
  }
  const int li = tid - 128, rm = li % PT_BM;
  for (int j = 0; j < chunks; ++j) {
    if (tid < 128) {
      float wv[32];
      if (wvalid) {
        dequant32(wrow, j, k, wv);
      } else {
        for (int i = 0; i < 32; ++i) wv[i] = 0.0f;
      }
      for (int i = 0; i < 32; ++i) ws[i * 128 + tid] = wv[i];
    } else {
      // BM rows x 8 float4 of k: this work-item's row rm, float4s li / BM + it * (128 / BM).
      for (int it = 0; it < PT_RM; ++it) {
        const int kq = li / PT_BM + it * (128 / PT_BM), kg = j * 32 + kq * 4;
        float4 v = (float4)(0.0f);
        if (xr) {
          if (kg + 4 <= k) {
            v = vload4(0, xr + kg);
          } else {
            v.x = kg < k ? xr[kg] : 0.0f;
            v.y = kg + 1 < k ? xr[kg + 1] : 0.0f;
            v.z = kg + 2 < k ? xr[kg + 2] : 0.0f;
          }
        }
        xs[(kq * 4 + 0) * PT_BM + rm] = v.x;
        xs[(kq * 4 + 1) * PT_BM + rm] = v.y;
        xs[(kq * 4 + 2) * PT_BM + rm] = v.z;
        xs[(kq * 4 + 3) * PT_BM + rm] = v.w;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < 32; ++kk) {
      const float4 a0 = vload4(0, ws + kk * 128 + 4 * tx), a1 = vload4(0, ws + kk * 128 + 64 + 4 * tx);
#if PT_RM == 4
      const float4 b4 = vload4(0, xs + kk * PT_BM + 4 * ty);
      const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#else
      const float2 b2 = vload2(0, xs + kk * PT_BM + 2 * ty);
      const float b[2] = {b2.x, b2.y};
#endif
      for (int r = 0; r < PT_RM; ++r) {
        acc[0][r] = fma(a0.x, b[r], acc[0][r]);
        acc[1][r] = fma(a0.y, b[r], acc[1][r]);
        acc[2][r] = fma(a0.z, b[r], acc[2][r]);
        acc[3][r] = fma(a0.w, b[r], acc[3][r]);
        acc[4][r] = fma(a1.x, b[r], acc[4][r]);
        acc[5][r] = fma(a1.y, b[r], acc[5][r]);
        acc[6][r] = fma(a1.z, b[r], acc[6][r]);
        acc[7][r] = fma(a1.w, b[r], acc[7][r]);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

// Work-group (i, j): features 128 i .., rows BM j ...
kernel void PT_NAME(gemm_t)(global const uchar* w, ulong row_bytes, global const float* x, int ldx, int k,
                            int n_out, global float* y, int ldy, int m) {
  local float ws[32 * 128];
  local float xs[32 * PT_BM];
  const int n0 = get_group_id(0) * 128, m0 = get_group_id(1) * PT_BM;
  const int tid = get_local_id(1) * 16 + get_local_id(0), tx = get_local_id(0), ty = get_local_id(1);
  const int row = m0 + (tid - 128) % PT_BM;
  global const float* xr = tid >= 128 && row < m ? x + (long)row * ldx : 0;
  float acc[8][PT_RM];
  PT_NAME(tile_mm)(w + (ulong)n0 * row_bytes, w + (ulong)(n0 + 64) * row_bytes, row_bytes, min(64, n_out - n0),
                   min(64, n_out - n0 - 64), k, xr, ws, xs, acc);
  for (int r = 0; r < PT_RM; ++r) {
    const int rr = m0 + PT_RM * ty + r;
    if (rr >= m) break;
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4);
      if (n < n_out) y[(long)rr * ldy + n] = acc[j][r];
    }
  }
}

// Work-group (i, t): gate and up features 64 i .. of tile t (tiles: expert, first grouped row, end; n_tiles[0]
// of them). h: G rows of n_ff.
kernel void PT_NAME(moe_gate_up_t)(global const uchar* gate, global const uchar* up, ulong row_bytes,
                                   ulong expert_stride, global const int* tiles, global const int* n_tiles,
                                   global const int* row_slot, int k_used, global const float* x, int ldx, int k,
                                   int n_ff, global float* h) {
  local float ws[32 * 128];
  local float xs[32 * PT_BM];
  const int t = get_group_id(1);
  if (t >= n_tiles[0]) return;  // the whole group: before any barrier
  const int e = tiles[4 * t], g0 = tiles[4 * t + 1], g1 = tiles[4 * t + 2];
  const int f0 = get_group_id(0) * 64;
  const int tid = get_local_id(1) * 16 + get_local_id(0), tx = get_local_id(0), ty = get_local_id(1);
  const int g = g0 + (tid - 128) % PT_BM;
  global const float* xr = tid >= 128 && g < g1 ? x + (long)(row_slot[g] / k_used) * ldx : 0;
  const ulong off = (ulong)e * expert_stride + (ulong)f0 * row_bytes;
  float acc[8][PT_RM];
  const int nv = min(64, n_ff - f0);
  PT_NAME(tile_mm)(gate + off, up + off, row_bytes, nv, nv, k, xr, ws, xs, acc);
  for (int r = 0; r < PT_RM; ++r) {
    const int gg = g0 + PT_RM * ty + r;
    if (gg >= g1) break;
    for (int c = 0; c < 4; ++c) {
      const int f = f0 + 4 * tx + c;
      if (f < n_ff) h[(long)gg * n_ff + f] = silu_f(acc[c][r]) * acc[4 + c][r];
    }
  }
}

// Work-group (i, t): output features 128 i .. of tile t; hq: G rows of k; yg: G rows of n_out.
kernel void PT_NAME(moe_down_t)(global const uchar* down, ulong row_bytes, ulong expert_stride,
                                global const int* tiles, global const int* n_tiles, global const float* hq, int k,
                                int n_out, global float* yg) {
  local float ws[32 * 128];
  local float xs[32 * PT_BM];
  const int t = get_group_id(1);
  if (t >= n_tiles[0]) return;
  const int e = tiles[4 * t], g0 = tiles[4 * t + 1], g1 = tiles[4 * t + 2];
  const int n0 = get_group_id(0) * 128;
  const int tid = get_local_id(1) * 16 + get_local_id(0), tx = get_local_id(0), ty = get_local_id(1);
  const int g = g0 + (tid - 128) % PT_BM;
  global const float* xr = tid >= 128 && g < g1 ? hq + (long)g * k : 0;
  global const uchar* we = down + (ulong)e * expert_stride;
  float acc[8][PT_RM];
  PT_NAME(tile_mm)(we + (ulong)n0 * row_bytes, we + (ulong)(n0 + 64) * row_bytes, row_bytes,
                   min(64, n_out - n0), min(64, n_out - n0 - 64), k, xr, ws, xs, acc);
  for (int r = 0; r < PT_RM; ++r) {
    const int gg = g0 + PT_RM * ty + r;
    if (gg >= g1) break;
    for (int j = 0; j < 8; ++j) {
      const int n = n0 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4);
      if (n < n_out) yg[(long)gg * n_out + n] = acc[j][r];
    }
  }
}
#undef PT_BM
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
