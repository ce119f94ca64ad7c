// OpenCL C of the whole-model backend's matmul, y[m][n] = x[m][k] . w[n][k]^T, one program per weight type,
// the GGUF blocks read in place. Activations stay f32 (the CPU quantizes them to int8; the difference is
// within the model tests' tolerance). Core OpenCL C 1.2: no fp16 arithmetic, no subgroups unless MV_SG.
//
// Build options:
//   WT_F32 | WT_F16 | WT_BF16 | WT_Q8_0 | WT_Q4_0 | WT_Q5_0 | WT_Q4_K | WT_Q5_K | WT_Q6_K
//   MV_WG   work-items sharing one output feature in the matrix-vector kernel (a power of two)
//   MV_SG   the matvecs' subgroup size (cl_intel_subgroups, cl_intel_required_subgroup_size; divides MV_WG):
//           a row's sums (mv_sum, mv_sum_rows) by sub_group_reduce_add, then the MV_WG / MV_SG subgroups'
//           partial sums added through local memory, instead of a tree there
//
// Every type is read as chunks of 32 consecutive weights of a row (dequant32): a legacy block, a Q4_K /
// Q5_K sub-block, two Q6_K sub-blocks, or 32 plain values (zero past k for f32 / f16 rows of any length).
//
// Kernels:
//   gemv  (decode): MV_WG work-items per output feature, up to MV_MR activation rows per weight read;
//         with tasks (int2 per row group: row, expert), that row multiplies that expert's matrix (at
//         w + expert * expert_stride): the MoE path runs the routed rows of many experts in one launch.
//   gemm  (prefill): a TN x TM tile of y per work-group of 16 x 16, weights dequantized into local memory
//         KC chunks at a time, so each weight is read once per TM activation rows.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kMatmulSource = R"CLC(
#define MV_MR 4
#define TN 64
#define TM 32
#define KC 2

float ld_f16(global const uchar* p) { return vload_half(0, (global const half*)p); }

// The matvec kernels (work-groups of MV_WG x rows, a row's work-items the consecutive local ids 0) sum over a
// row with these two. Both take a barrier that callers count on (local memory written before a sum is seen
// by the whole group after it), and both sum the same values to the same bits. With subgroups, each
// subgroup's first work-item keeps its partial sum in its own slot (lid), so no work-item overwrites a value
// another has yet to read.
#ifdef MV_SG
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
#define MV_KERNEL __attribute__((intel_reqd_sub_group_size(MV_SG))) kernel
#else
#define MV_KERNEL kernel
#endif

// Sum of v over the row's MV_WG work-items (every one gets it); buf: MV_WG floats.
float mv_sum(float v, local float* buf) {
#ifdef MV_SG
  const float s = sub_group_reduce_add(v);
#if MV_WG == MV_SG
  barrier(CLK_LOCAL_MEM_FENCE);
  return s;
#else
  const int lid = get_local_id(0);
  if (lid % MV_SG == 0) buf[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  float r = buf[0];
  for (int i = MV_SG; i < MV_WG; i += MV_SG) r += buf[i];
  barrier(CLK_LOCAL_MEM_FENCE);  // buf free again
  return r;
#endif
#else
  return grp_sum(v, buf, get_local_id(0), MV_WG);
#endif
}

// Sums over the row's MV_WG work-items of n values at once (v: n rows of MV_WG in local memory, each work-item
// having written its own), in one pass; v[j * MV_WG] holds row j's sum afterwards.
void mv_sum_rows(local float* v, int n) {
  const int lid = get_local_id(0);
#ifdef MV_SG
  for (int j = 0; j < n; ++j) {
    const float s = sub_group_reduce_add(v[j * MV_WG + lid]);
    if (lid % MV_SG == 0) v[j * MV_WG + lid] = s;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
#if MV_WG > MV_SG
  if (lid == 0)
    for (int j = 0; j < n; ++j) {
      float r = v[j * MV_WG];
      for (int i = MV_SG; i < MV_WG; i += MV_SG) r += v[j * MV_WG + i];
      v[j * MV_WG] = r;
    }
  barrier(CLK_LOCAL_MEM_FENCE);
#endif
#else
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = MV_WG / 2; s > 0; s >>= 1) {
    if (lid < s)
      for (int j = 0; j < n; ++j) v[j * MV_WG + lid] += v[j * MV_WG + lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#endif
}
uint ld_u32(global const uchar* p) { return p[0] | ((uint)p[1] << 8) | ((uint)p[2] << 16) | ((uint)p[3] << 24); }

#if defined(WT_F32)
#define PLAIN 1
float ld_plain(global const uchar* row, int i) { return ((global const float*)row)[i]; }
#elif defined(WT_F16)
#define PLAIN 1
float ld_plain(global const uchar* row, int i) { return vload_half(i, (global const half*)row); }
#elif defined(WT_BF16)
#define PLAIN 1
float ld_plain(global const uchar* row, int i) { return as_float((uint)((global const ushort*)row)[i] << 16); }
#endif

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (quant/blocks.h).
void scale_min_k4(int j, global const uchar* q, float* sc, float* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The same from a Q4_K / Q5_K block's first 16 bytes in registers (h.x: d and dmin; h.y, h.z, h.w: the 12 scale
// bytes), without indexing a private array at run time.
uint k4_sbyte(uint4 h, int i) {
  const uint w = i < 4 ? h.y : i < 8 ? h.z : h.w;
  return (w >> (8 * (i & 3))) & 0xFF;
}
void k4_scale_min(uint4 h, int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = k4_sbyte(h, j) & 63;
    *mn = k4_sbyte(h, j + 4) & 63;
  } else {
    *sc = (k4_sbyte(h, j + 4) & 0xF) | ((k4_sbyte(h, j - 4) >> 6) << 4);
    *mn = (k4_sbyte(h, j + 4) >> 4) | ((k4_sbyte(h, j) >> 6) << 4);
  }
}

// Floats k0 .. k0 + 3 of activation row xr, 0 past k (all 0 without a row: xr null).
float4 ld_x4(global const float* xr, int k0, int k) {
  float4 v = (float4)(0.0f);
  if (!xr) return v;
  if (k0 + 4 <= k) return vload4(0, xr + k0);
  v.x = k0 < k ? xr[k0] : 0.0f;
  v.y = k0 + 1 < k ? xr[k0 + 1] : 0.0f;
  v.z = k0 + 2 < k ? xr[k0 + 2] : 0.0f;
  return v;
}

// How many of a chunk's 32 weights are in the row (rest: what is left of it); quantized rows hold whole
// blocks, so a constant there lets the compiler unroll the dot product and keep the chunk in registers.
#if defined(PLAIN)
#define CHUNK_LEN(rest) min(32, (rest))
#else
#define CHUNK_LEN(rest) 32
#endif

// Weights j*32 .. j*32+31 of a row of k.
void dequant32(global const uchar* row, int j, int k, float* w) {
#if defined(PLAIN)
  const int i0 = j * 32;
  for (int i = 0; i < 32; ++i) w[i] = i0 + i < k ? ld_plain(row, i0 + i) : 0.0f;
#elif defined(WT_Q8_0)
  global const uchar* b = row + j * 34;
  const float d = ld_f16(b);
  global const char* qs = (global const char*)(b + 2);
  for (int i = 0; i < 32; ++i) w[i] = d * qs[i];
#elif defined(WT_Q4_0)
  global const uchar* b = row + j * 18;
  const float d = ld_f16(b);
  for (int i = 0; i < 16; ++i) {
    const uchar q = b[2 + i];
    w[i] = ((q & 0xF) - 8) * d;
    w[i + 16] = ((q >> 4) - 8) * d;
  }
#elif defined(WT_Q5_0)
  global const uchar* b = row + j * 22;
  const float d = ld_f16(b);
  const uint qh = ld_u32(b + 2);
  for (int i = 0; i < 16; ++i) {
    const uchar q = b[6 + i];
    w[i] = (int)(((q & 0xF) | (((qh >> i) & 1) << 4)) - 16) * d;
    w[i + 16] = (int)(((q >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16) * d;
  }
#elif defined(WT_Q4_K) && !defined(NO_WIDE_LOADS)
  // Four quants per 32-bit load: Q4_K blocks are 144 bytes, so every row (its own allocation, or a whole
  // number of blocks into one) keeps the quants 4-byte aligned.
  global const uchar* b = row + (j / 8) * 144;
  const int s = j % 8, c = s / 2, hi = s & 1;
  float sc, mn;
  scale_min_k4(s, b + 4, &sc, &mn);
  const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
  global const uint* q = (global const uint*)(b + 16 + 32 * c);
  for (int l4 = 0; l4 < 8; ++l4) {
    const uint v = hi ? q[l4] >> 4 : q[l4];
    w[4 * l4 + 0] = d * (int)(v & 0xF) - m;
    w[4 * l4 + 1] = d * (int)((v >> 8) & 0xF) - m;
    w[4 * l4 + 2] = d * (int)((v >> 16) & 0xF) - m;
    w[4 * l4 + 3] = d * (int)((v >> 24) & 0xF) - m;
  }
#elif defined(WT_Q4_K) || defined(WT_Q5_K)
#if defined(WT_Q4_K)
  global const uchar* b = row + (j / 8) * 144;
  global const uchar* qs = b + 16;
#else
  global const uchar* b = row + (j / 8) * 176;
  global const uchar* qh = b + 16;
  global const uchar* qs = b + 48;
#endif
  const int s = j % 8, c = s / 2, hi = s & 1;
  float sc, mn;
  scale_min_k4(s, b + 4, &sc, &mn);
  const float d = ld_f16(b) * sc, m = ld_f16(b + 2) * mn;
  global const uchar* q = qs + 32 * c;
  for (int l = 0; l < 32; ++l) {
    int v = hi ? q[l] >> 4 : q[l] & 0xF;
#if defined(WT_Q5_K)
    v += ((qh[l] >> (2 * c + hi)) & 1) << 4;
#endif
    w[l] = d * v - m;
  }
#elif defined(WT_Q6_K) && !defined(NO_WIDE_LOADS)
  // Two quants per 16-bit load (Q6_K blocks are 210 bytes: 2-byte aligned).
  global const uchar* b = row + (j / 8) * 210;
  const int s = j % 8, c = s / 4, g = s % 4;
  global const ushort* ql = (global const ushort*)(b + 64 * c + 32 * (g & 1));
  global const ushort* qh = (global const ushort*)(b + 128 + 32 * c);
  global const char* sc = (global const char*)(b + 192) + 8 * c + 2 * g;
  const float d = ld_f16(b + 208);
  const float d0 = d * sc[0], d1 = d * sc[1];
  const int lo_shift = g >= 2 ? 4 : 0, hi_shift = 2 * g;
  for (int l2 = 0; l2 < 16; ++l2) {
    const uint lv = ql[l2] >> lo_shift, hv = qh[l2] >> hi_shift;
    const int q0 = (int)((lv & 0xF) | ((hv & 3) << 4)) - 32;
    const int q1 = (int)(((lv >> 8) & 0xF) | (((hv >> 8) & 3) << 4)) - 32;
    w[2 * l2] = (l2 < 8 ? d0 : d1) * q0;
    w[2 * l2 + 1] = (l2 < 8 ? d0 : d1) * q1;
  }
#elif defined(WT_Q6_K)
  global const uchar* b = row + (j / 8) * 210;
  const int s = j % 8, c = s / 4, g = s % 4;
  global const uchar* ql = b + 64 * c + 32 * (g & 1);
  global const uchar* qh = b + 128 + 32 * c;
  global const char* sc = (global const char*)(b + 192) + 8 * c + 2 * g;
  const float d = ld_f16(b + 208);
  for (int l = 0; l < 32; ++l) {
    const int lo = g >= 2 ? ql[l] >> 4 : ql[l] & 0xF;
    const int q = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
    w[l] = d * sc[l / 16] * q;
  }
#else
#error "no weight type defined"
#endif
}

// Group (n, rg): output feature n for activation rows rg*MV_MR .. +MV_MR-1 (with row_expert: row rg only).
MV_KERNEL void gemv(global const uchar* w, ulong row_bytes, ulong expert_stride, global const int* tasks,
                 int use_tasks, global const float* x, int ldx, int k, int n_out, global float* y, int ldy, int m) {
  local float buf[MV_WG * MV_MR];
  const int n = get_group_id(0), lid = get_local_id(0);
  const int r0 = use_tasks ? tasks[2 * get_group_id(1)] : get_group_id(1) * MV_MR;
  const int nr = use_tasks ? 1 : min(MV_MR, m - r0);
  global const uchar* base = use_tasks ? w + (ulong)tasks[2 * get_group_id(1) + 1] * expert_stride : w;
  global const uchar* row = base + (ulong)n * row_bytes;
  const int chunks = (k + 31) / 32;
  float acc[MV_MR] = {0.0f, 0.0f, 0.0f, 0.0f};
  float wv[32];
  for (int j = lid; j < chunks; j += MV_WG) {
    dequant32(row, j, k, wv);
    const int i0 = j * 32, len = CHUNK_LEN(k - i0);
    for (int r = 0; r < MV_MR; ++r) {  // a fixed trip count: acc and wv stay in registers
      if (r >= nr) break;
      global const float* xr = x + (long)(r0 + r) * ldx + i0;
      float s = 0.0f;
      for (int i = 0; i < len; ++i) s += wv[i] * xr[i];
      acc[r] += s;
    }
  }
  for (int r = 0; r < MV_MR; ++r) buf[r * MV_WG + lid] = acc[r];
  mv_sum_rows(buf, MV_MR);
  if (lid < nr) y[(long)(r0 + lid) * ldy + n] = buf[lid * MV_WG];
}

// Work-group (16, 16) per tile: features n0 .. n0+TN-1, rows m0 .. m0+TM-1; work-item (tx, ty) computes
// features n0 + tx + 16a (a < 4) for rows m0 + ty + 16b (b < 2).
kernel void gemm(global const uchar* w, ulong row_bytes, global const float* x, int ldx, int k, int n_out,
                 global float* y, int ldy, int m) {
  local float ws[TN][KC * 32 + 1];
  local float xs[TM][KC * 32 + 1];
  const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * 16 + tx;
  const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
  const int chunks = (k + 31) / 32;
  float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
  float wv[32];
  for (int c0 = 0; c0 < chunks; c0 += KC) {
    // TN * KC chunk dequantizations, one per work-item.
    if (tid < TN * KC) {
      const int rn = tid / KC, cc = tid % KC, j = c0 + cc;
      if (n0 + rn < n_out && j < chunks) {
        dequant32(w + (ulong)(n0 + rn) * row_bytes, j, k, wv);
        for (int i = 0; i < 32; ++i) ws[rn][cc * 32 + i] = wv[i];
      } else {
        for (int i = 0; i < 32; ++i) ws[rn][cc * 32 + i] = 0.0f;
      }
    }
    // TM * KC * 32 activations, 16 per work-item.
    for (int e = tid; e < TM * KC * 32; e += 256) {
      const int rm = e / (KC * 32), kk = e % (KC * 32), kg = c0 * 32 + kk;
      xs[rm][kk] = (m0 + rm < m && kg < k) ? x[(long)(m0 + rm) * ldx + kg] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < KC * 32; ++kk) {
      const float x0 = xs[ty][kk], x1 = xs[ty + 16][kk];
      for (int a = 0; a < 4; ++a) {
        const float wa = ws[tx + 16 * a][kk];
        acc[a][0] += wa * x0;
        acc[a][1] += wa * x1;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b) {
      const int n = n0 + tx + 16 * a, r = m0 + ty + 16 * b;
      if (n < n_out && r < m) y[(long)r * ldy + n] = acc[a][b];
    }
}
)CLC";

}  // namespace xpert::opencl
