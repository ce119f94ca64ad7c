// OpenCL C of the whole-model backend's fused forms (fused_ops.cpp): fewer launches per layer, since on a
// discrete GPU's OpenCL each enqueue costs microseconds of host time. Core OpenCL C 1.2 like the rest.
//
// kFusedOpsSource (appended to the ops program, so it rounds divisions like round_activations):
//   add_rmsnorm_round   x += d (optional), y = rmsnorm(x) * w, and y rounded for the next matmul's weight type
//                       (round_unit) into yq, in one work-group per row.
//   qk_norm_rope_store  per (head, token): q and k heads normalized (optional weights) and rotated in place,
//                       as qk_norm_rope; with a cache, the token's k and v heads stored as f16 at its position
//                       of its slot (a decode step's store_kv).
//   empty_kernel(16)    nothing (with 1 or 16 arguments): what one enqueue costs (XPERT_OPENCL_OPTS probe).
// kFusedMatmulSource (appended to each weight type's matmul program, after kMatmulSource):
//   gemv_multi          up to three matrices of one type and width on the same activations (q, k, v).
//   moe_router_route    the router's logits, then (the token's last group) its top-k routing.
//   moe_gate_up         per (feature, slot): silu(x_t . gate_e) * (x_t . up_e) for slot s = t * k + j of
//                       expert e: the routed rows read x in place (no gather) and SwiGLU is applied as the sums
//                       are reduced.
//   moe_down_add        per (feature, token): y_t += sum_j weight_s * (h_s . down_e), in slot order, as
//                       moe_combine then add sum them.
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

// Group (hh, t): hh < n_head: q head hh; then n_head_kv k heads; then (with store) n_head_kv v heads.
// Each head is normalized (its weights given) then rotated, as rmsnorm then rope; k and v heads are stored
// as f16 (rounded to nearest even) at row pos[t] of slot slots[t] (slot_stride halves apart).
kernel void qk_norm_rope_store(global float* q, global float* k, global const float* v, global const float* q_norm,
                               int has_qn, global const float* k_norm, int has_kn, global const int* pos,
                               int n_head, int n_head_kv, int d, int n_rot, float theta_scale, float freq_scale,
                               int neox, float eps, int store, global half* kc, global half* vc,
                               global const int* slots, long slot_stride) {
  local float hb[512];
  local float buf[RED_WG];
  const int hh = get_group_id(0), lid = get_local_id(0);
  const long t = get_group_id(1);
  const int kind = hh < n_head ? 0 : hh < n_head + n_head_kv ? 1 : 2;  // q, k, v
  const int h = kind == 0 ? hh : kind == 1 ? hh - n_head : hh - n_head - n_head_kv;
  const long row = store ? (long)slots[t] * slot_stride + (long)pos[t] * n_head_kv * d + (long)h * d : 0;
  global const float* src = kind == 0 ? q + (t * n_head + h) * d
                            : kind == 1 ? k + (t * n_head_kv + h) * d
                                        : v + (t * n_head_kv + h) * d;
  global const float* nw = kind == 0 ? q_norm : k_norm;
  const int has_norm = kind == 0 ? has_qn : kind == 1 ? has_kn : 0;
  // Every group takes the same barriers (PoCL wants no barrier under a branch, even a uniform one).
  float s = 0.0f;
  for (int i = lid; i < d; i += RED_WG) s += src[i] * src[i];
  s = wg_sum(s, buf);
  const float scale = 1.0f / sqrt(s / (float)d + eps);
  for (int i = lid; i < d; i += RED_WG) hb[i] = has_norm ? (src[i] * scale) * nw[i] : src[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  // The angle built by repeated multiplication, as the rope kernel (and the CPU) builds it.
  const int pairs = kind == 2 ? 0 : n_rot / 2;
  for (int i = lid; i < pairs; i += RED_WG) {
    float theta = (float)pos[t];
    for (int j = 0; j < i; ++j) theta *= theta_scale;
    const float th = freq_scale * theta;
    const float c = cos(th), sn = sin(th);
    const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = hb[a], x1 = hb[b];
    hb[a] = x0 * c - x1 * sn;
    hb[b] = x0 * sn + x1 * c;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lid; i < d; i += RED_WG) {
    if (kind == 0) q[(t * n_head + h) * d + i] = hb[i];
    if (kind == 1) k[(t * n_head_kv + h) * d + i] = hb[i];
    if (store && kind != 0) vstore_half_rte(hb[i], row + i, kind == 1 ? kc : vc);
  }
}

kernel void empty_kernel(global float* x) {}
kernel void empty_kernel16(global float* a, global float* b, global float* c, global float* d, global float* e,
                           global float* f, global float* g, global float* h, int i0, int i1, int i2, int i3, int i4,
                           int i5, int i6, float x) {}
)CLC";

inline constexpr std::string_view kFusedMatmulSource = R"CLC(
#define MOE_MAX_USED 16
// This work-item's part of row . xr (k values). Q4_K and Q6_K rows with 32 work-items (a GPU's width): the
// group walks the row a 256-weight block at a time, each work-item 8 weights of it, so consecutive work-items
// read consecutive quant bytes and activations (coalesced; L1 serves each load in one pass). Otherwise
// (PoCL's 4 work-items, other types): chunks lid, lid + MV_WG, ..., each summed alone first (as gemv).
#if MV_WG == 32 && !defined(NO_WIDE_LOADS) && (defined(WT_Q4_K) || defined(WT_Q6_K))
float mv_partial(global const uchar* row, global const float* xr, int k) {
  const int lid = get_local_id(0), nb = k / 256;
  float acc = 0.0f;
#if defined(WT_Q4_K)
  // Work-item lid: bytes 4 (lid % 8) .. +3 of quant group c = lid / 8: low nibbles are weights of sub-block 2c,
  // high nibbles of sub-block 2c + 1.
  const int c = lid / 8, b4 = (lid % 8) * 4;
  for (int sb = 0; sb < nb; ++sb) {
    global const uchar* blk = row + sb * 144;
    const uint q = *(global const uint*)(blk + 16 + 32 * c + b4);
    float sc0, mn0, sc1, mn1;
    scale_min_k4(2 * c, blk + 4, &sc0, &mn0);
    scale_min_k4(2 * c + 1, blk + 4, &sc1, &mn1);
    const float d = ld_f16(blk), dm = ld_f16(blk + 2);
    const float d0 = d * sc0, m0 = dm * mn0, d1 = d * sc1, m1 = dm * mn1;
    const float4 xa = vload4(0, xr + sb * 256 + 64 * c + b4), xb = vload4(0, xr + sb * 256 + 64 * c + 32 + b4);
    acc += (d0 * (int)(q & 0xF) - m0) * xa.x + (d0 * (int)((q >> 8) & 0xF) - m0) * xa.y +
           (d0 * (int)((q >> 16) & 0xF) - m0) * xa.z + (d0 * (int)((q >> 24) & 0xF) - m0) * xa.w;
    acc += (d1 * (int)((q >> 4) & 0xF) - m1) * xb.x + (d1 * (int)((q >> 12) & 0xF) - m1) * xb.y +
           (d1 * (int)((q >> 20) & 0xF) - m1) * xb.z + (d1 * (int)((q >> 28) & 0xF) - m1) * xb.w;
  }
#else
  // Work-item lid: half c = lid / 16 of the block, positions 2 (lid % 16) and +1 of each of its 4 quarters.
  const int c = lid / 16, l2 = (lid % 16) * 2;
  for (int sb = 0; sb < nb; ++sb) {
    global const uchar* blk = row + sb * 210;
    const uint qa = *(global const ushort*)(blk + 64 * c + l2), qb = *(global const ushort*)(blk + 64 * c + 32 + l2);
    const uint qh = *(global const ushort*)(blk + 128 + 32 * c + l2);
    global const char* sc = (global const char*)(blk + 192) + 8 * c + l2 / 16;
    const float d = ld_f16(blk + 208);
    global const float* xq = xr + sb * 256 + 128 * c + l2;
    for (int g = 0; g < 4; ++g) {
      const uint lo = (g & 1 ? qb : qa) >> (g >= 2 ? 4 : 0), hi = qh >> (2 * g);
      const int q0 = (int)((lo & 0xF) | ((hi & 3) << 4)) - 32;
      const int q1 = (int)(((lo >> 8) & 0xF) | (((hi >> 8) & 3) << 4)) - 32;
      const float dg = d * sc[2 * g];
      const float2 xv = vload2(0, xq + 32 * g);
      acc += dg * q0 * xv.x + dg * q1 * xv.y;
    }
  }
#endif
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

// Sum of v over the MV_WG work-items (every one gets it); buf: MV_WG floats.
float mv_sum(float v, local float* buf) {
  const int lid = get_local_id(0);
  buf[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = MV_WG / 2; s > 0; s >>= 1) {
    if (lid < s) buf[lid] += buf[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = buf[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

// Group (f, r): feature f of the concatenation [n0 | n1 | n2] of three matrices' outputs, activation row r.
kernel void gemv_multi(global const uchar* w0, global const uchar* w1, global const uchar* w2, ulong row_bytes,
                       int n0, int n1, global float* y0, global float* y1, global float* y2, int ldy0, int ldy1,
                       int ldy2, global const float* x, int ldx, int k) {
  local float buf[MV_WG];
  int f = get_group_id(0);
  const long r = get_group_id(1);
  global const uchar* w = w0;
  global float* y = y0;
  int ldy = ldy0;
  if (f >= n0 + n1) {
    f -= n0 + n1, w = w2, y = y2, ldy = ldy2;
  } else if (f >= n0) {
    f -= n0, w = w1, y = y1, ldy = ldy1;
  }
  const float s = mv_sum(mv_partial(w + (ulong)f * row_bytes, x + r * ldx, k), buf);
  if (get_local_id(0) == 0) y[r * ldy + f] = s;
}

// The last of `total` work-groups to pass here (after lid 0 wrote the group's results) gets 1, the others 0,
// every work-item of a group the same; the last resets *cnt for the next launch. Its reads of the others'
// results must go through volatile pointers (an SM's L1 may hold lines from before their writes).
int last_group(volatile global int* cnt, int total, local int* flag) {
  if (get_local_id(0) == 0) {
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    const int last = atomic_inc(cnt) == total - 1;
    if (last) atomic_xchg(cnt, 0);
    *flag = last;
  }
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  const int r = *flag;
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  return r;
}

// Sums over the MV_WG work-items of n values at once (v: n rows of MV_WG in local memory, each summed as
// mv_sum sums it, so the same bits), in one pass of barriers; v[j * MV_WG] holds row j's sum afterwards.
void mv_sum_rows(local float* v, int n) {
  const int lid = get_local_id(0);
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = MV_WG / 2; s > 0; s >>= 1) {
    if (lid < s)
      for (int j = 0; j < n; ++j) v[j * MV_WG + lid] += v[j * MV_WG + lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

// Group (e, t): logits[t][e] = router row e . x[t]; token t's last group then routes it (route_token,
// kClCommonSource), every group taking the routing's barriers.
kernel void moe_router_route(global const uchar* w, ulong row_bytes, global const float* x, int k,
                             global float* logits, int n_expert, int n_used, int norm, float scale,
                             global int* row_slot, global int* slot_row, global float* weights, global int* tasks,
                             volatile global int* counters) {
  local float buf[MV_WG];
  local int flag;
  local float p[ROUTE_MAX];
  local float bv[MV_WG];
  local int bi[MV_WG];
  const int e = get_group_id(0);
  const long t = get_group_id(1);
  const float s = mv_sum(mv_partial(w + (ulong)e * row_bytes, x + t * k, k), buf);
  if (get_local_id(0) == 0) logits[t * n_expert + e] = s;
  const int last = last_group(counters + t, n_expert, &flag);
  route_token(logits + t * n_expert, n_expert, n_used, norm, scale, (int)t, last, row_slot, slot_row, weights, tasks,
              MV_WG, p, bv, bi);
}

// Group (f, s): slot s (token s / n_used) of expert tasks[2s + 1]; h[s][f] = silu(g) * u. With mode >= 0, the
// slot's last group rounds its row into hq for the down product (round_unit), so no launch does it.
kernel void moe_gate_up(global const uchar* gate, global const uchar* up, ulong row_bytes, ulong expert_stride,
                        global const int* tasks, int n_used, global const float* x, int k, global float* h,
                        int n_ff, volatile global int* counters, int mode, global float* hq) {
  local float buf[2 * MV_WG];
  local int flag;
  const int f = get_group_id(0), s = get_group_id(1), lid = get_local_id(0);
  const ulong off = (ulong)tasks[2 * s + 1] * expert_stride + (ulong)f * row_bytes;
  global const float* xr = x + (long)(s / n_used) * k;
  // Both products' loads in flight before one reduction of the two sums.
  buf[lid] = mv_partial(gate + off, xr, k);
  buf[MV_WG + lid] = mv_partial(up + off, xr, k);
  mv_sum_rows(buf, 2);
  if (lid == 0) h[(long)s * n_ff + f] = silu_f(buf[0]) * buf[MV_WG];
  // Every group counts and takes the rounding's barriers (PoCL wants no barrier skipped, even on a branch a
  // whole group takes); the slot's last group rounds.
  const int last = last_group(counters + s, n_ff, &flag);
  volatile global const float* hr = h + (long)s * n_ff;
  if (mode >= 2 && last)
    for (int i = lid; i < n_ff; i += MV_WG) hq[(long)s * n_ff + i] = round_elem(hr[i], mode);
  local float rv[MV_WG];
  local int ri[MV_WG];
  const int blocks = mode == 0 || mode == 1 ? round_units(n_ff, mode) : 0;
  for (int b = 0; b < blocks; ++b) round_block_group_v(hr, hq + (long)s * n_ff, mode, b, MV_WG, last, rv, ri);
}

// Group (f, t): y[t][f] += sum over token t's slots s of weights[s] * (h[s] . down_e[f]), e = tasks[2s + 1].
// With has_norm, token t's last group then writes cur[t] = rmsnorm(y[t]) * norm_w (the next layer's norm).
kernel void moe_down_add(global const uchar* down, ulong row_bytes, ulong expert_stride, global const int* tasks,
                         global const float* weights, int n_used, global const float* h, int k,
                         global float* y, int width, volatile global int* counters, int has_norm,
                         global const float* norm_w, float eps, global float* cur) {
  local float buf[MOE_MAX_USED * MV_WG];
  local int flag;
  const int f = get_group_id(0), lid = get_local_id(0);
  const long t = get_group_id(1);
  // Every slot's products in flight before one reduction of all their sums; then the weighted sum in slot
  // order (as moe_combine).
  for (int j = 0; j < n_used; ++j) {
    const long s = t * n_used + j;
    const ulong off = (ulong)tasks[2 * s + 1] * expert_stride + (ulong)f * row_bytes;
    buf[j * MV_WG + lid] = mv_partial(down + off, h + s * k, k);
  }
  mv_sum_rows(buf, n_used);
  if (lid == 0) {
    float acc = 0.0f;
    for (int j = 0; j < n_used; ++j) acc += weights[t * n_used + j] * buf[j * MV_WG];
    y[t * width + f] = acc + y[t * width + f];
  }
  const int last = last_group(counters + t, width, &flag) && has_norm;
  // Every group takes the reduction's barriers; only the last one has anything to sum.
  volatile global const float* yr = y + t * width;
  float sq = 0.0f;
  if (last)
    for (int i = lid; i < width; i += MV_WG) {
      const float v = yr[i];
      sq += v * v;
    }
  sq = mv_sum(sq, buf);
  if (!last) return;
  const float scale = 1.0f / sqrt(sq / (float)width + eps);
  for (int i = lid; i < width; i += MV_WG) cur[t * width + i] = (yr[i] * scale) * norm_w[i];
}
)CLC";

}  // namespace xpert::opencl
