// OpenCL C of the whole-model backend's fused forms (fused_ops.cpp): fewer launches per layer, since on a
// discrete GPU's OpenCL each enqueue costs microseconds of host time. Core OpenCL C 1.2 like the rest.
//
// kFusedOpsSource (appended to the ops program, so it rounds divisions like round_activations):
//   add_rmsnorm_round   x += d (optional), y = rmsnorm(x) * w, and y rounded for the next matmul's weight
//                       type (round_unit) into yq, in one work-group per row.
//   qk_norm_rope        per (head, token): q and k heads normalized (optional weights) and rotated in place,
//                       as qk_norm_rope; with the k and v stores into the f16 cache where asked
//                       (qk_norm_rope_store_kv; a decode step's attention kernel does the same itself).
// kFusedMatmulSource (appended to each weight type's matmul program, after kMatmulSource):
//   gemv_multi          up to four matrices of one type and width on the same activations (q, k, v; a Gated
//                       DeltaNet layer's qkv, z, alpha, beta).
//   moe_router_route    the residual add and norm (in every group, in local memory), the router's logits and
//                       the gate/up product's rounded input, then (the token's last group) its top-k routing;
//                       with a shared expert (Qwen3.5), one group more: its sigmoid gate.
//   moe_gate_up         per (feature, slot): silu(x_t . gate_e) * (x_t . up_e) for slot s = t * k + j of
//                       expert e: the routed rows read x in place (no gather) and SwiGLU is applied as the
//                       sums are reduced.
//   moe_down_add        per (feature, token): y_t += sum_j weight_s * (h_s . down_e), in slot order, as
//                       moe_combine then add sum them; a shared expert is one slot more a token, after the
//                       routed ones (its gate/up rows are slots n_routed + t of moe_gate_up).
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kFusedOpsSource = R"CLC(
// One work-group of RED_WG per row. has_d 0: plain rmsnorm (x is only read); mode < 0: no yq.
kernel void add_rmsnorm_round(global const float* d, int has_d, global float* x, global const float* w, int has_w,
                              global float* y, int n, float eps, global float* yq, int mode) {
  local float buf[RED_WG];
  const long r = get_group_id(0);
  const int lid = get_local_id(0);
  global float* xr = x + r * n;
  global float* yr = y + r * n;
  float s = 0.0f;
  for (int i = lid; i < n; i += RED_WG) {
    float v = xr[i];
    if (has_d) {
      v = d[r * n + i] + v;
      xr[i] = v;
    }
    s += v * v;
  }
  s = wg_sum(s, buf);
  const float scale = 1.0f / sqrt(s / (float)n + eps);
  for (int i = lid; i < n; i += RED_WG) yr[i] = has_w ? (xr[i] * scale) * w[i] : xr[i] * scale;
  barrier(CLK_GLOBAL_MEM_FENCE);
  if (mode >= 2)
    for (int i = lid; i < n; i += RED_WG) yq[r * n + i] = round_elem(yr[i], mode);
  local float rv[RED_WG];
  local int ri[RED_WG];
  const int blocks = mode == 0 || mode == 1 ? round_units(n, mode) : 0;
  for (int b = 0; b < blocks; ++b) round_block_group(yr, yq + r * n, mode, b, RED_WG, 1, rv, ri);
}

// add_rmsnorm_round for rows of n % 4 == 0, n <= 4 * NORM_J * NORM_WG: one work-group of NORM_WG per row, the
// row in registers (16-byte loads, every load of a work-item in flight at once), the rounding's block maxima
// by segmented reductions in local memory (a block of B values: B / 4 consecutive work-items), so no
// work-item walks the row serially (the RED_WG kernel above took ~32 us for one row of 2048 on an H200).
#define NORM_WG 256
#define NORM_J 8
#pragma OPENCL FP_CONTRACT OFF
kernel __attribute__((reqd_work_group_size(NORM_WG, 1, 1)))
void add_rmsnorm_round4(global const float* d, int has_d, global float* x, global const float* w, int has_w,
                        global float* y, int n, float eps, global float* yq, int mode) {
  local float buf[NORM_WG];
  const long r = get_group_id(0);
  const int lid = get_local_id(0), n4 = n / 4;
  global float* xr = x + r * n;
  global float* yr = y + r * n;
  global float* qr = yq + r * n;
  global const float* dr = d + r * n;
  float4 v[NORM_J];
  for (int j = 0; j < NORM_J; ++j) {
    const int i = lid + j * NORM_WG;
    v[j] = i < n4 ? vload4(i, xr) : (float4)(0.0f);
  }
  if (has_d)
    for (int j = 0; j < NORM_J; ++j) {
      const int i = lid + j * NORM_WG;
      if (i < n4) {
        v[j] = vload4(i, dr) + v[j];
        vstore4(v[j], i, xr);
      }
    }
  float s = 0.0f;
  for (int j = 0; j < NORM_J; ++j) s += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  buf[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = NORM_WG / 2; h > 0; h >>= 1) {
    if (lid < h) buf[lid] += buf[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float scale = 1.0f / sqrt(buf[0] / (float)n + eps);
  barrier(CLK_LOCAL_MEM_FENCE);
  const int jn = (n4 + NORM_WG - 1) / NORM_WG;  // the same for every work-item
  // The rounding's block maxima (mode 0: blocks of 32, 8 work-items; mode 1: of 256, 64 work-items): each
  // work-item's signed value of largest magnitude (its first occurrence) into bv / bi, then one segmented
  // reduction over all of them (no barrier inside a loop over the row: PoCL miscompiled that form).
  local float bv[NORM_J * NORM_WG];
  local int bi[NORM_J * NORM_WG];
  const int seg = mode == 0 ? 8 : 64, blk = mode == 0 || mode == 1;
  // Loops over v run to the constant NORM_J (unrolled: v stays in registers, not in stack memory).
  for (int j = 0; j < NORM_J; ++j) {
    const int i = lid + j * NORM_WG;
    if (i >= n4) {
      bv[j * NORM_WG + lid] = 0.0f;
      bi[j * NORM_WG + lid] = 0x7fffffff;
      continue;
    }
    float4 yv = v[j] * scale;
    if (has_w) yv = yv * vload4(i, w);
    vstore4(yv, i, yr);
    if (mode >= 2)
      vstore4((float4)(round_elem(yv.x, mode), round_elem(yv.y, mode), round_elem(yv.z, mode),
                       round_elem(yv.w, mode)), i, qr);
    float best = yv.x;
    int at = 4 * i;
    if (fabs(yv.y) > fabs(best)) best = yv.y, at = 4 * i + 1;
    if (fabs(yv.z) > fabs(best)) best = yv.z, at = 4 * i + 2;
    if (fabs(yv.w) > fabs(best)) best = yv.w, at = 4 * i + 3;
    bv[j * NORM_WG + lid] = best;
    bi[j * NORM_WG + lid] = at;
  }
  if (!blk) return;  // the same for the whole group
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = seg / 2; h > 0; h >>= 1) {
    if ((lid & (seg - 1)) < h)
      for (int j = 0; j < jn; ++j) {
        const int a = j * NORM_WG + lid, b = a + h;
        const float fa = fabs(bv[a]), fb = fabs(bv[b]);
        if (fb > fa || (fb == fa && bi[b] < bi[a])) bv[a] = bv[b], bi[a] = bi[b];
      }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int j = 0; j < NORM_J; ++j) {
    const int i = lid + j * NORM_WG;
    if (i >= n4) break;
    float4 yv = v[j] * scale;
    if (has_w) yv = yv * vload4(i, w);
    const float mx = bv[j * NORM_WG + (lid & ~(seg - 1))], amax = fabs(mx);
    float4 q;
    if (mode == 0) {
      const float dd = round_f16(amax / 127.f), id = amax != 0.0f ? 127.f / amax : 0.0f;
      q = (float4)(rint(yv.x * id) * dd, rint(yv.y * id) * dd, rint(yv.z * id) * dd, rint(yv.w * id) * dd);
    } else if (amax == 0.0f) {
      q = (float4)(0.0f);
    } else {
      const float iscale = -127.f / mx, dd = 1.0f / iscale;
      q = (float4)(min(127.0f, rint(iscale * yv.x)) * dd, min(127.0f, rint(iscale * yv.y)) * dd,
                   min(127.0f, rint(iscale * yv.z)) * dd, min(127.0f, rint(iscale * yv.w)) * dd);
    }
    vstore4(q, i, qr);
  }
}
#pragma OPENCL FP_CONTRACT ON

// Group (hh, t): hh < n_head: q head hh (q_stride floats apart: d, or 2d where a gate sits beside each); then
// n_head_kv k heads. Each head is normalized (its weights given) then rotated, as rmsnorm then rope. With
// store: k's heads also go to kc as f16 and n_head_kv groups more store v's heads to vc (rows of n_head_kv d, as
// store_f16 stores them), so no launch of their own does.
kernel void qk_norm_rope(global float* q, global float* k, global const float* q_norm, int has_qn,
                         global const float* k_norm, int has_kn, global const int* pos, int n_head, int n_head_kv,
                         int d, int n_rot, float theta_scale, float freq_scale, int neox, float eps, int q_stride,
                         global const float* v, global half* kc, global half* vc, int store) {
  local float hb[512];
  local float buf[RED_WG];
  const int hh = get_group_id(0), lid = get_local_id(0);
  const long t = get_group_id(1);
  const int is_q = hh < n_head, is_v = hh >= n_head + n_head_kv;
  const int h = is_q ? hh : is_v ? hh - n_head - n_head_kv : hh - n_head;
  const long kv_at = (t * n_head_kv + h) * d;  // k's or v's head, in k / v and in the cache rows
  global const float* src = is_q ? q + (t * n_head + h) * q_stride : is_v ? v + kv_at : k + kv_at;
  global const float* nw = is_q ? q_norm : k_norm;
  const int has_norm = is_v ? 0 : is_q ? has_qn : has_kn;
  // Every group takes the same barriers (PoCL wants no barrier under a branch, even a uniform one).
  float s = 0.0f;
  for (int i = lid; has_norm && i < d; i += RED_WG) s += src[i] * src[i];  // unused without norm weights
  s = wg_sum(s, buf);
  const float scale = 1.0f / sqrt(s / (float)d + eps);
  for (int i = lid; i < d; i += RED_WG) hb[i] = has_norm ? (src[i] * scale) * nw[i] : src[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lid; !is_v && i < n_rot / 2; i += RED_WG) {
    int a, b;
    const float2 cs = rope_pair(pos[t], i, n_rot, neox, theta_scale, freq_scale, &a, &b);
    rotate_local(hb, a, b, cs);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  global float* dst = is_q ? q + (t * n_head + h) * q_stride : k + kv_at;
  for (int i = lid; i < d; i += RED_WG) {
    if (!is_v) dst[i] = hb[i];
    if (store && !is_q) vstore_half_rte(hb[i], kv_at + i, is_v ? vc : kc);
  }
}
)CLC";

inline constexpr std::string_view kFusedMatmulSource = R"CLC(
#define MOE_MAX_USED 16
// mv_partial: this work-item's part of row . xr (k values); mv_partial2: of two rows on the same activations.
// Q4_K and Q6_K rows with 32 work-items (a GPU's width) read whole blocks by teams of 8 work-items. Otherwise
// (PoCL's 4 work-items, other types): chunks lid, lid + MV_WG, ..., each summed alone first (as gemv).
#if MV_WG == 32 && !defined(NO_WIDE_LOADS) && (defined(WT_Q4_K) || defined(WT_Q6_K))
#define MV_BLOCKWISE 1
#define MV_TEAMS 1
// Q4_K and Q6_K rows with 32 work-items: four teams of 8 take blocks team, team + 4, ... of the row, lane
// l = lid % 8 taking 32 weights of each: every scale index is a constant once the loops over a block's parts
// are unrolled, and a scale applies once to a sum of products. team_x8 loads the lane's 32 activations of
// block sb (8 float4), team_dot8 dots them with the block's weights; TEAM_BYTES: a block's bytes.
#if defined(WT_Q4_K)
// Q4_K: lane l takes bytes 4l .. 4l + 3 of each of the block's four 32-byte quant groups c, whose low nibbles
// are weights 64c + 4l .. +3 (sub-block 2c) and high nibbles weights 64c + 32 + 4l .. +3 (sub-block 2c + 1);
// a sub-block's scale and min apply once, to sum(q x) and sum(x). A team's loads a block: its first 16 bytes
// (one load, the same address for the team), 32 bytes of quants and 256 bytes of activations per quant
// group. Rows are 16-byte aligned (OpenclBackend::check_mv_aligned), 144-byte blocks keep them so.
#define TEAM_BYTES 144
void team_x8(global const float* xb, int l, float4* xv) {  // xv[2c]: sub-block 2c's 4 values, xv[2c + 1]: 2c + 1's
  for (int c = 0; c < 4; ++c) {
    xv[2 * c] = *(global const float4*)(xb + 64 * c + 4 * l);
    xv[2 * c + 1] = *(global const float4*)(xb + 64 * c + 32 + 4 * l);
  }
}
float team_dot8(global const uchar* blk, int l, const float4* xv) {
  const uint4 h = *(global const uint4*)blk;  // d, dmin, the 12 scale bytes
  global const uint* qs = (global const uint*)(blk + 16) + l;
  float acc = 0.0f, macc = 0.0f;
  for (int c = 0; c < 4; ++c) {
    const uint q = qs[8 * c];
    const float4 x0 = xv[2 * c], x1 = xv[2 * c + 1];
    float sc0, mn0, sc1, mn1;
    k4_scale_min(h, 2 * c, &sc0, &mn0);
    k4_scale_min(h, 2 * c + 1, &sc1, &mn1);
    const float s0 = (float)(q & 0xF) * x0.x + (float)((q >> 8) & 0xF) * x0.y + (float)((q >> 16) & 0xF) * x0.z +
                     (float)((q >> 24) & 0xF) * x0.w;
    const float s1 = (float)((q >> 4) & 0xF) * x1.x + (float)((q >> 12) & 0xF) * x1.y +
                     (float)((q >> 20) & 0xF) * x1.z + (float)(q >> 28) * x1.w;
    acc += sc0 * s0 + sc1 * s1;
    macc += mn0 * ((x0.x + x0.y) + (x0.z + x0.w)) + mn1 * ((x1.x + x1.y) + (x1.z + x1.w));
  }
  return h2f(h.x) * acc - h2f(h.x >> 16) * macc;
}
#else
// Q6_K (ql [128], qh [64], 16 int8 scales, d): half c of the block, quarter g holds weights 128c + 32g + p,
// p < 32, their low 4 bits in ql[64c + p] (g = 0, 2: low, high nibble) or ql[64c + 32 + p] (g = 1, 3), their
// high 2 bits at bit 2g of qh[32c + p], their scale sc[8c + p / 16 + 2g]. Lane l takes p = 4l .. 4l + 3 of
// every (c, g): three 4-byte words of quants a half, each weight's scale applied once to sum((q - 32) x).
// 210-byte blocks leave every other block 2-byte aligned: the words are read as two 16-bit halves.
#define TEAM_BYTES 210
uint ld_u32_a2(global const uchar* p) {
  const ushort2 v = vload2(0, (global const ushort*)p);
  return (uint)v.x | ((uint)v.y << 16);
}
void team_x8(global const float* xb, int l, float4* xv) {  // xv[4c + g]
  for (int c = 0; c < 2; ++c)
    for (int g = 0; g < 4; ++g) xv[4 * c + g] = *(global const float4*)(xb + 128 * c + 32 * g + 4 * l);
}
float team_dot8(global const uchar* blk, int l, const float4* xv) {
  float acc = 0.0f;
  for (int c = 0; c < 2; ++c) {
    const uint A = ld_u32_a2(blk + 64 * c + 4 * l), B = ld_u32_a2(blk + 64 * c + 32 + 4 * l);
    const uint H = ld_u32_a2(blk + 128 + 32 * c + 4 * l);
    global const char* sc = (global const char*)(blk + 192) + 8 * c + l / 4;
    for (int g = 0; g < 4; ++g) {
      const uint lo = (g & 1 ? B : A) >> (g >= 2 ? 4 : 0), hi = H >> (2 * g);
      const float4 x = xv[4 * c + g];
      const float s = (float)((lo & 0xF) | ((hi & 3) << 4)) * x.x +
                      (float)(((lo >> 8) & 0xF) | (((hi >> 8) & 3) << 4)) * x.y +
                      (float)(((lo >> 16) & 0xF) | (((hi >> 16) & 3) << 4)) * x.z +
                      (float)(((lo >> 24) & 0xF) | (((hi >> 24) & 3) << 4)) * x.w;
      acc += (float)sc[2 * g] * (s - 32.0f * ((x.x + x.y) + (x.z + x.w)));
    }
  }
  return ld_f16(blk + 208) * acc;
}
#endif
float mv_partial(global const uchar* row, global const float* xr, int k) {
  const int lid = get_local_id(0), l = lid % 8, nb = k / 256;
  float acc = 0.0f;
  for (int sb = lid / 8; sb < nb; sb += 4) {
    float4 xv[8];
    team_x8(xr + sb * 256, l, xv);
    acc += team_dot8(row + sb * TEAM_BYTES, l, xv);
  }
  return acc;
}
// Two rows on the same activations (gate and up): the activations loaded once for both.
float2 mv_partial2(global const uchar* ra, global const uchar* rb, global const float* xr, int k) {
  const int lid = get_local_id(0), l = lid % 8, nb = k / 256;
  float a = 0.0f, b = 0.0f;
  for (int sb = lid / 8; sb < nb; sb += 4) {
    float4 xv[8];
    team_x8(xr + sb * 256, l, xv);
    a += team_dot8(ra + sb * TEAM_BYTES, l, xv);
    b += team_dot8(rb + sb * TEAM_BYTES, l, xv);
  }
  return (float2)(a, b);
}
#elif !defined(NO_WIDE_LOADS) && defined(WT_F32)
// f32 rows (the router's): 16-byte loads, consecutive work-items on consecutive ones.
float mv_partial(global const uchar* row, global const float* xr, int k) {
  const int lid = get_local_id(0), k4 = k / 4;
  global const float* wr = (global const float*)row;
  float acc = 0.0f;
#pragma unroll 8
  for (int i = lid; i < k4; i += MV_WG) {
    const float4 a = vload4(i, wr), b = vload4(i, xr);
    acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
  }
  for (int i = 4 * k4 + lid; i < k; i += MV_WG) acc += wr[i] * xr[i];
  return acc;
}
#else
float mv_partial(global const uchar* row, global const float* xr, int k) {
  const int lid = get_local_id(0), chunks = (k + 31) / 32;
  float acc = 0.0f;
  float wv[32];
  for (int j = lid; j < chunks; j += MV_WG) {
    dequant32(row, j, k, wv);
    const int i0 = j * 32, len = CHUNK_LEN(k - i0);
    float s = 0.0f;
    for (int i = 0; i < len; ++i) s += wv[i] * xr[i0 + i];
    acc += s;
  }
  return acc;
}
#endif
#ifndef MV_BLOCKWISE
float2 mv_partial2(global const uchar* ra, global const uchar* rb, global const float* xr, int k) {
  return (float2)(mv_partial(ra, xr, k), mv_partial(rb, xr, k));
}
#endif

// Work-groups of MV_WG x MV_R: MV_R matrix rows a group (local id 1 picks the row), so a GPU's SM holds
// enough work-items for its loads to be in flight (NVIDIA allows 32 groups an SM: groups of one warp left
// half of it idle).
// Group (g, r), row l: feature f = g * MV_R + l of the concatenation [n0 | n1 | n2 | n3] of four matrices'
// outputs (n_total of them), activation row r.
MV_KERNEL void gemv_multi(global const uchar* w0, global const uchar* w1, global const uchar* w2,
                       global const uchar* w3, ulong row_bytes, int n0, int n1, int n2, global float* y0,
                       global float* y1, global float* y2, global float* y3, int ldy0, int ldy1, int ldy2, int ldy3,
                       global const float* x, int ldx, int k, int n_total) {
  local float buf_all[MV_WG * MV_R];
  local float* buf = buf_all + get_local_id(1) * MV_WG;
  int f = get_group_id(0) * MV_R + get_local_id(1);
  const bool on = f < n_total;
  const long r = get_group_id(1);
  global const uchar* w = w0;
  global float* y = y0;
  int ldy = ldy0;
  if (f >= n0 + n1 + n2) {
    f -= n0 + n1 + n2, w = w3, y = y3, ldy = ldy3;
  } else if (f >= n0 + n1) {
    f -= n0 + n1, w = w2, y = y2, ldy = ldy2;
  } else if (f >= n0) {
    f -= n0, w = w1, y = y1, ldy = ldy1;
  }
  const float s = mv_sum(on ? mv_partial(w + (ulong)f * row_bytes, x + r * ldx, k) : 0.0f, buf);
  if (on && get_local_id(0) == 0) y[r * ldy + f] = s;
}

// Group (e, t): token t's row cur = rmsnorm(x[t] + d[t]) * nw (k values, as add_rmsnorm_round4 computes it) in
// local memory, logits[t][e] = router row e . cur, cur into cur_out and, rounded for the gate/up product
// (round_unit, mode >= 0), into xq: group e writes blocks (or values) e, e + n_expert, ...; so the residual
// add and norm take no launch of their own, and x is left as it was (moe_down_add adds d). Token t's last group
// then routes it (route_token, kClCommonSource), every group taking the routing's barriers. k % 4 == 0,
// k <= ROUTE_MAX (the row and then the probabilities share one local array). With has_shared, group e ==
// n_expert takes the shared expert's gate row shared_w instead and writes weights[n_routed + t] = sigmoid of
// it (n_routed = n_used * tokens: the routed slots' weights come first).
MV_KERNEL void moe_router_route(global const uchar* w, ulong row_bytes, global const float* shared_w,
                             global const float* d, global const float* x,
                             global const float* nw, float eps, global float* cur_out, int mode, global float* xq,
                             int k, global float* logits, int n_expert, int n_used, int norm, float scale,
                             global int* row_slot, global int* slot_row, global float* weights, global int* tasks,
                             volatile global int* counters) {
  local float buf[MV_WG];
  local int flag;
  local float4 cur[ROUTE_MAX / 4];  // the row, then (route_token, past last_group's barriers) the probabilities
  local float bv[MV_WG];
  local int bi[MV_WG];
  const int e = get_group_id(0), G = get_num_groups(0), lid = get_local_id(0), k4 = k / 4;
  const long t = get_group_id(1);
  global const float* xr = x + t * k;
  global const float* dr = d + t * k;
  // Both loops take 8 chunks a work-item at a time, their loads first: one trip to memory per 8 (a chunk at a
  // time waited a trip per chunk: ~24 us a launch on an H200); the sums in the order of one chunk at a time.
  float ss = 0.0f;
  for (int i0 = lid; i0 < k4; i0 += 8 * MV_WG) {
    float4 v[8];
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * MV_WG;
      v[u] = i < k4 ? vload4(i, dr) + vload4(i, xr) : (float4)(0.0f);
    }
    for (int u = 0; u < 8; ++u) {
      if (i0 + u * MV_WG < k4) cur[i0 + u * MV_WG] = v[u];
      ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    }
  }
  const float rs = 1.0f / sqrt(mv_sum(ss, buf) / (float)k + eps);
  float acc = 0.0f;
  global const float* wr = e < n_expert ? (global const float*)(w + (ulong)e * row_bytes) : shared_w;
  for (int i0 = lid; i0 < k4; i0 += 8 * MV_WG) {
    float4 a[8], n4[8];
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * MV_WG;
      a[u] = i < k4 ? vload4(i, wr) : (float4)(0.0f);
      n4[u] = i < k4 ? vload4(i, nw) : (float4)(0.0f);
    }
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * MV_WG;
      if (i >= k4) break;
      const float4 c = (cur[i] * rs) * n4[u];
      cur[i] = c;
      acc += a[u].x * c.x + a[u].y * c.y + a[u].z * c.z + a[u].w * c.w;
    }
  }
  const float s = mv_sum(acc, buf);  // its barriers also make cur whole for the rounding
  if (lid == 0 && e < n_expert) logits[t * n_expert + e] = s;
  if (lid == 0 && e == n_expert) weights[(long)get_num_groups(1) * n_used + t] = sigmoid_f(s);
  local const float* cl = (local const float*)cur;
  global float* qr = xq + t * k;
  global float* cr = cur_out + t * k;
  for (int i = e + G * lid; i < k; i += G * MV_WG) {
    cr[i] = cl[i];
    if (mode >= 2) qr[i] = round_elem(cl[i], mode);
  }
  const int blocks = mode == 0 || mode == 1 ? round_units(k, mode) : 0;
  for (int b0 = 0; b0 < blocks; b0 += G) round_block_group_l(cl, qr, mode, b0 + e, MV_WG, b0 + e < blocks, bv, bi);
  const int last = last_group(counters + t, G, &flag);
  route_token(logits + t * n_expert, n_expert, n_used, norm, scale, (int)t, last, row_slot, slot_row, weights, tasks,
              MV_WG, (local float*)cur, bv, bi);
}

// Group (g, s), row l: feature f = g * MV_R + l of slot s (token s / n_used) of expert tasks[2s + 1];
// h[s][f] = silu(g) * u. Slots from n_routed on are the shared expert's (shared_gate, shared_up) for token
// s - n_routed. With mode >= 0, the slot's last group rounds its row into hq for the down product
// (round_unit; its MV_R rows a block each at a time), so no launch does it.
MV_KERNEL void moe_gate_up(global const uchar* gate, global const uchar* up, ulong row_bytes, ulong expert_stride,
                        global const int* tasks, int n_used, global const float* x, int k, global float* h,
                        int n_ff, volatile global int* counters, int mode, global float* hq,
                        global const uchar* shared_gate, global const uchar* shared_up, int n_routed) {
  local float buf_all[2 * MV_WG * MV_R];
  local int flag;
  const int ly = get_local_id(1), f = get_group_id(0) * MV_R + ly, s = get_group_id(1), lid = get_local_id(0);
  local float* buf = buf_all + ly * 2 * MV_WG;
  const bool on = f < n_ff, sh = s >= n_routed;
  const ulong off = (sh ? 0 : (ulong)tasks[2 * s + 1] * expert_stride) + (ulong)(on ? f : 0) * row_bytes;
  global const float* xr = x + (long)(sh ? s - n_routed : s / n_used) * k;
  // Both products' loads in flight before one reduction of the two sums.
  const float2 gu = on ? mv_partial2((sh ? shared_gate : gate) + off, (sh ? shared_up : up) + off, xr, k)
                       : (float2)(0.0f);
  buf[lid] = gu.x;
  buf[MV_WG + lid] = gu.y;
  mv_sum_rows(buf, 2);
  if (on && lid == 0) h[(long)s * n_ff + f] = silu_f(buf[0]) * buf[MV_WG];
  // Every group counts and takes the rounding's barriers (PoCL wants no barrier skipped, even on a branch a
  // whole group takes); the slot's last group rounds.
  const int last = last_group(counters + s, get_num_groups(0), &flag);
  volatile global const float* hr = h + (long)s * n_ff;
  global float* qr = hq + (long)s * n_ff;
  if (mode >= 2 && last) {
    const int fl = ly * MV_WG + lid;
    for (int i0 = fl; i0 < n_ff; i0 += 8 * MV_WG * MV_R) {  // 8 loads in flight a work-item
      float v[8];
      for (int u = 0; u < 8; ++u) v[u] = i0 + u * MV_WG * MV_R < n_ff ? hr[i0 + u * MV_WG * MV_R] : 0.0f;
      for (int u = 0; u < 8; ++u)
        if (i0 + u * MV_WG * MV_R < n_ff) qr[i0 + u * MV_WG * MV_R] = round_elem(v[u], mode);
    }
  }
  local float rv_all[MV_WG * MV_R];
  local int ri_all[MV_WG * MV_R];
  const int blocks = mode == 0 || mode == 1 ? round_units(n_ff, mode) : 0;
  for (int b0 = 0; b0 < blocks; b0 += MV_R)
    round_block_group_v(hr, qr, mode, b0 + ly, MV_WG, last && b0 + ly < blocks, rv_all + ly * MV_WG,
                        ri_all + ly * MV_WG);
}

// Group (g, t), row l: feature f = g * MV_R + l; y[t][f] += (has_d: d[t][f], the residual add moe_router_route
// left, first) + sum over token t's slots s of weights[s] * (h[s] . down_e[f]), e = tasks[2s + 1], then (has_shared)
// weights[n_routed + t] * (h[n_routed + t] . shared_down[f]), n_routed = n_used * tokens. With
// has_norm, token t's last group then writes cur[t] = rmsnorm(y[t]) * norm_w (the next layer's norm), its
// MV_WG * MV_R work-items over the row (held in row, width floats of local memory), and with next_mode >= 0
// also curq[t] = cur[t] rounded for the next matmul (round_unit), so no launch does it.
MV_KERNEL void moe_down_add(global const uchar* down, ulong row_bytes, ulong expert_stride, global const int* tasks,
                         global const float* weights, int n_used, global const float* h, int k,
                         global float* y, global const float* d, int has_d, int width, volatile global int* counters,
                         int has_norm, global const float* norm_w, float eps, global float* cur, int next_mode,
                         global float* curq, global const uchar* shared_down, int has_shared, local float* row) {
  local float buf_all[MOE_MAX_USED * MV_WG * MV_R];
  local int flag;
  const int ly = get_local_id(1), lid = get_local_id(0), f = get_group_id(0) * MV_R + ly;
  local float* buf = buf_all + ly * MOE_MAX_USED * MV_WG;
  const bool on = f < width;
  const long t = get_group_id(1), n_routed = (long)get_num_groups(1) * n_used;
  const int slots = n_used + has_shared;  // the shared expert's: j == n_used
  // Every slot's products in flight before one reduction of all their sums; then the weighted sum in slot
  // order (as moe_combine).
#if defined(MV_TEAMS)
  // The teams of 8 work-items (mv_partial) over the token's (slot, block) pairs: over one slot's blocks at a
  // time, a row of 768 (3 blocks) would leave one team of four idle.
  const int nb = k / 256, l = lid % 8;
  for (int j = 0; j < slots; ++j) buf[j * MV_WG + lid] = 0.0f;
#pragma unroll 2
  for (int u = lid / 8; u < slots * nb; u += 4) {
    const int j = u / nb, sb = u - j * nb;
    const bool sh = j == n_used;
    const long s = sh ? n_routed + t : t * n_used + j;
    const ulong off =
        (sh ? 0 : (ulong)tasks[2 * s + 1] * expert_stride) + (ulong)(on ? f : 0) * row_bytes + sb * TEAM_BYTES;
    float4 xv[8];
    team_x8(h + s * k + sb * 256, l, xv);
    buf[j * MV_WG + lid] += on ? team_dot8((sh ? shared_down : down) + off, l, xv) : 0.0f;
  }
#else
#pragma unroll 8
  for (int j = 0; j < slots; ++j) {
    const bool sh = j == n_used;
    const long s = sh ? n_routed + t : t * n_used + j;
    const ulong off = (sh ? 0 : (ulong)tasks[2 * s + 1] * expert_stride) + (ulong)(on ? f : 0) * row_bytes;
    buf[j * MV_WG + lid] = on ? mv_partial((sh ? shared_down : down) + off, h + s * k, k) : 0.0f;
  }
#endif
  mv_sum_rows(buf, slots);
  if (on && lid == 0) {
    float acc = 0.0f;
    for (int j = 0; j < n_used; ++j) acc += weights[t * n_used + j] * buf[j * MV_WG];
    if (has_shared) acc += weights[n_routed + t] * buf[n_used * MV_WG];
    const float res = y[t * width + f];
    y[t * width + f] = acc + (has_d ? d[t * width + f] + res : res);
  }
  const int last = last_group(counters + t, get_num_groups(0), &flag) && has_norm;
  // The last group reads y[t] once, 8 loads in flight a work-item (volatile loads one at a time would each wait
  // a full trip to L2), into local memory; the norm and the rounding then work from there. Every group takes
  // the tail's barriers; only the last one has anything to do. row: width floats (with has_norm).
  const int fl = ly * MV_WG + lid, G = MV_WG * MV_R;
  volatile global const float* yr = y + t * width;
  float sq = 0.0f;
  if (last)
    for (int i0 = fl; i0 < width; i0 += 8 * G) {
      float v[8];
      for (int u = 0; u < 8; ++u) v[u] = i0 + u * G < width ? yr[i0 + u * G] : 0.0f;
      for (int u = 0; u < 8; ++u) {
        sq += v[u] * v[u];
        if (i0 + u * G < width) row[i0 + u * G] = v[u];
      }
    }
  sq = grp_sum(sq, buf_all, fl, G);
  const float scale = 1.0f / sqrt(sq / (float)width + eps);
  global float* cr = cur + t * width;
  if (last)  // each work-item's own entries of row, as the loop above wrote them
    for (int i0 = fl; i0 < width; i0 += 8 * G) {
      float w[8];
      for (int u = 0; u < 8; ++u) w[u] = i0 + u * G < width ? norm_w[i0 + u * G] : 0.0f;
      for (int u = 0; u < 8; ++u) {
        if (i0 + u * G >= width) break;
        const float c = (row[i0 + u * G] * scale) * w[u];
        row[i0 + u * G] = c;
        cr[i0 + u * G] = c;
      }
    }
  if (next_mode < 0) return;  // the same for every group
  barrier(CLK_LOCAL_MEM_FENCE);  // the whole row in local memory for the rounding
  global float* qr = curq + t * width;
  if (next_mode >= 2 && last)
    for (int i = fl; i < width; i += G) qr[i] = round_elem(row[i], next_mode);
  // Every group takes the rounding's barriers; the last one rounds, its MV_R rows a block each at a time.
  local int ri_all[MV_WG * MV_R];
  const int blocks = next_mode <= 1 ? round_units(width, next_mode) : 0;
  for (int b0 = 0; b0 < blocks; b0 += MV_R)
    round_block_group_l(row, qr, next_mode, b0 + ly, MV_WG, last && b0 + ly < blocks, buf_all + ly * MV_WG,
                        ri_all + ly * MV_WG);
}
)CLC";

}  // namespace xpert::opencl
