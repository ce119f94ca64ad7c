// OpenCL C of a decode step's attention over many keys (OpenclBackend::decode_attention's form 1, a step
// whose deepest sequence sees kAttentionTiledMinKeys keys or more): the keys of each sequence split into
// chunks, a work-group per (KV head, its query heads ATT_QB at a time, sequence, chunk), so a deep step keeps
// every compute unit busy and reads each K / V row once for the query heads that share it. `attention`
// (kernels_attention.h) gives a query head one group: 32 groups for qwen3-30b-a3b, each reading its KV
// head's rows alone, 2.29 ms a launch at depth 4096 on an H100 (8.8 t/s against CUDA's 478; 2026-12-06).
//
// One launch, the CPU's tiled path's steps (cpu/ops_attn.cpp: split-K at decode, q rounded to f16, the
// weights not): each group the step's prep (as attention's: q / k norms, RoPE, the new k / v rows stored),
// then each key's score (attention_block's staged sums) and the chunk's max m_c and sum l_c, then its V sums
// with the weights exp(s - m_c); the last group of a (KV head, query heads, sequence) scales each chunk's sums
// by exp(m_c - M), adds them in chunk order and divides by the sum L (the gate, and out rounded for the
// projection, as attention does). A sequence that sees fewer than tiled_min keys (a short one beside a deep
// one) takes the CPU's short path's steps instead: one chunk, its weights normalized and rounded to f16.
// Uses kernels_attention.h's ATT_BLOCK_SCORES, att_block_tree and ATT_BLOCK_V.
//
// A first form in two launches (the weights normalized and rounded at every depth) ran depth 4096 at 105.1
// t/s, depth 16384 at 73.5, from 8.9 and 2.3 (H200, 2026-12-06; 117 us a layer, latency rather than
// bandwidth). This one drops its second launch, its scores' round trip and its second prep: 117.2 and 85.5
// t/s, 94 us a launch at depth 4096 (an H100, 2026-12-07; CUDA 474.5 and 394.9). ATT_SPLIT_MIN 64 ran the
// same, 256 lost at depth 4096 (106.5). As the form of every step it took 55 us a launch at depth 0, where
// `attention` takes 27: short steps stay with `attention`.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kAttentionSplitSource = R"CLC(
// A chunk's keys: a multiple of ATT_WG, at least ATT_SPLIT_MIN (fewer chunks than the grid's where the
// sequence is short; the others idle).
#define ATT_SPLIT_MIN 128
// The geometry of a group: group 0 = (KV head hk, query heads h0 .. h0 + nq - 1 of it), group 1 the sequence
// t, group 2 the chunk of the keys lo .. hi (sliding window: lo > 0): keys c0 .. c1, tiles of ATT_WG keys;
// n_used chunks hold keys (the last holds hi, the step's new row). exact: fewer than tiled_min keys, in one
// chunk.
typedef struct {
  int hk, h0, nq, unit, c0, c1, n_used, p, exact;
  long t;
} AttSplit;

AttSplit att_split(global const int* pos, int n_head, int n_head_kv, int window, int n_ch, int tiled_min) {
  AttSplit s;
  const int gqa = n_head / n_head_kv, n_hg = (gqa + ATT_QB - 1) / ATT_QB, g = get_group_id(0) % n_hg;
  s.hk = get_group_id(0) / n_hg;
  s.h0 = s.hk * gqa + g * ATT_QB;
  s.nq = min(ATT_QB, gqa - g * ATT_QB);
  s.t = get_group_id(1);
  s.unit = s.t * n_head_kv * n_hg + get_group_id(0);
  s.p = pos[s.t];
  const int lo = window > 0 ? max(0, s.p - window + 1) : 0, n = s.p - lo + 1;
  s.exact = n < tiled_min;
  const int per = s.exact ? n : max(ATT_SPLIT_MIN, ((n + n_ch - 1) / n_ch + ATT_WG - 1) / ATT_WG * ATT_WG);
  s.n_used = (n + per - 1) / per;
  s.c0 = lo + get_group_id(2) * per;
  s.c1 = min(s.p, s.c0 + per - 1);
  return s;
}

// scores: [n_seq][n_head][sc_stride] (key j at j; each work-item reads back its own); ml: [n_seq][n_head][n_ch]
// (a chunk's max, sum); parts: [n_seq][n_head][n_ch][d] (its V sums). out_mode as attention's; blocks (modes 0,
// 1) only where the group's heads hold whole blocks (the host's att_split_chunks).
kernel void attention_split(global const float* q, global half* kc, global half* vc, global const int* pos,
                            int n_head, int n_head_kv, int d, float kq_scale, int window,
                            global const int* slots, long slot_stride, int q_stride, global const float* k_new,
                            global const float* v_new, global const float* q_norm, int has_qn,
                            global const float* k_norm, int has_kn, int n_rot, float theta_scale,
                            float freq_scale, int neox, float eps, int tiled_min, global float* scores,
                            int sc_stride, global float2* ml, int n_ch, global float* parts, global float* out,
                            global const float* gate, int gate_stride, int has_gate, int out_mode,
                            global float* outq, volatile global int* counters) {
  local float qs[ATT_QB * ATT_BD] __attribute__((aligned(16)));
  local float ps[ATT_QB * ATT_WG] __attribute__((aligned(16))), ls[ATT_QB * ATT_WG];
  local float ks[ATT_KC * ATT_KS];
  local float kb[ATT_BD];
  local float stat[2 * ATT_QB];
  local int flag;
  const int lid = get_local_id(0);
  const AttSplit s = att_split(pos, n_head, n_head_kv, window, n_ch, tiled_min);
  const int hk = s.hk, p = s.p;
  const long kv_row = (long)n_head_kv * d, row0 = s.t * n_head + s.h0;  // row0: the group's first q head
  kc += (long)slots[s.t] * slot_stride;
  vc += (long)slots[s.t] * slot_stride;
  // The prep, as attention's (the same sums): the chunk that holds the new row stores it (every group of
  // that chunk the same bits) and reads it back after its own writes.
  const int live = s.c0 <= p, stores = live && p <= s.c1;  // no keys: only the barriers
  global const float* kr = k_new + (s.t * n_head_kv + hk) * d;
  global const float* vr = v_new + (s.t * n_head_kv + hk) * d;
  // The rows' sums of squares (row ATT_QB: k's) in one tree over ks, each row's the same as wg_sum's (a tree
  // a row waited for its loads and barriers nine times).
  global const float* xr[ATT_QB + 1];
  for (int u = 0; u < ATT_QB; ++u) xr[u] = q + (row0 + min(u, s.nq - 1)) * q_stride;
  xr[ATT_QB] = kr;
  for (int u = 0; u <= ATT_QB; ++u) {
    float ss = 0.0f;
    for (int i = lid; live && (u < ATT_QB ? has_qn : has_kn) && i < d; i += ATT_WG) ss += xr[u][i] * xr[u][i];
    ks[u * ATT_WG + lid] = ss;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = ATT_WG / 2; w > 0; w >>= 1) {
    if (lid < w)
      for (int u = 0; u <= ATT_QB; ++u) ks[u * ATT_WG + lid] += ks[u * ATT_WG + lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int u = 0; u <= ATT_QB; ++u) {
    const int has_n = u < ATT_QB ? has_qn : has_kn;
    global const float* w = u < ATT_QB ? q_norm : k_norm;
    local float* y = u < ATT_QB ? qs + u * ATT_BD : kb;
    const float sc = 1.0f / sqrt(ks[u * ATT_WG] / (float)d + eps);
    for (int i = lid; live && i < d; i += ATT_WG) y[i] = has_n ? (xr[u][i] * sc) * w[i] : xr[u][i];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lid; live && i < n_rot / 2; i += ATT_WG) {
    int a, b;
    const float2 cs = rope_pair(p, i, n_rot, neox, theta_scale, freq_scale, &a, &b);
    for (int u = 0; u < s.nq; ++u) rotate_local(qs + u * ATT_BD, a, b, cs);
    rotate_local(kb, a, b, cs);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lid; live && i < d; i += ATT_WG) {
    if (stores) {
      vstore_half_rte(kb[i], (long)p * kv_row + (long)hk * d + i, kc);
      vstore_half_rte(vr[i], (long)p * kv_row + (long)hk * d + i, vc);
    }
    for (int u = 0; u < ATT_QB; ++u) qs[u * ATT_BD + i] = u < s.nq ? round_f16(qs[u * ATT_BD + i]) : 0.0f;
  }
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);

  // Pass 1 over the chunk's keys, as attention_block's (ATT_BLOCK_SCORES wants lo, hi and bhi): each key's
  // score into scores, the running max and sum per work-item, then the tree: the chunk's m_c and l_c.
  int lo[ATT_QB], hi[ATT_QB];
  for (int u = 0; u < ATT_QB; ++u) lo[u] = s.c0, hi[u] = u < s.nq ? s.c1 : -1;
  const int bhi = s.c1;
  float mx[ATT_QB], l[ATT_QB];
  for (int u = 0; u < ATT_QB; ++u) mx[u] = -INFINITY, l[u] = 0.0f;
  for (int j0 = s.c0; j0 <= bhi; j0 += ATT_WG) {
    ATT_BLOCK_SCORES(j0, d)
    for (int u = 0; u < s.nq; ++u) {
      const float sc = ps[u * ATT_WG + lid];
      if (j0 + lid > bhi) continue;
      scores[(row0 + u) * sc_stride + j0 + lid] = sc;
      const float mnew = max(mx[u], sc);
      l[u] = l[u] * exp(mx[u] - mnew) + exp(sc - mnew);
      mx[u] = mnew;
    }
  }
  att_block_tree(mx, l, ps, ls, lid);
  // exact: the weights normalized and rounded (the short path's), the chunk's pair (0, 1) so that the last
  // group's scaling leaves its sums as they are.
  if (lid < ATT_QB) {
    const float m = ps[lid * ATT_WG], sum = ls[lid * ATT_WG];
    stat[lid] = m;
    stat[ATT_QB + lid] = s.exact ? (sum > 0.0f ? 1.0f / sum : 0.0f) : 1.0f;
    if (lid < s.nq && live)
      ml[(row0 + lid) * n_ch + get_group_id(2)] = s.exact ? (float2)(0.0f, 1.0f) : (float2)(m, sum);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  // Pass 2: each work-item's keys' weights (its own scores read back), times V.
  float acc[ATT_QB][ATT_BDPT];
  for (int u = 0; u < ATT_QB; ++u)
    for (int a = 0; a < ATT_BDPT; ++a) acc[u][a] = 0.0f;
  for (int j0 = s.c0; j0 <= s.c1; j0 += ATT_WG) {
    const int j = j0 + lid;
    for (int u = 0; u < ATT_QB; ++u) {
      const float w = u < s.nq && j <= s.c1 ? exp(scores[(row0 + u) * sc_stride + j] - stat[u]) : 0.0f;
      ps[u * ATT_WG + lid] = s.exact ? round_f16(w * stat[ATT_QB + u]) : w;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ATT_BLOCK_V(j0, min(ATT_WG, s.c1 - j0 + 1))
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int u = 0; u < s.nq; ++u) {
    global float* o = parts + ((row0 + u) * n_ch + get_group_id(2)) * d;
    for (int a = 0; a < ATT_BDPT / 2; ++a) {
      const int dd = 2 * lid + 2 * ATT_WG * a;
      if (dd < d) o[dd] = acc[u][2 * a];
      if (dd + 1 < d) o[dd + 1] = acc[u][2 * a + 1];
    }
  }
  const int last = last_group(counters + s.unit, n_ch, &flag);
  // The last group: query u's chunks' pairs (work-item u, 8 read at a time: volatile loads are not batched
  // by the compiler) into ps / ls, then M, each chunk's factor exp(m_c - M) (into ls) and 1 / L.
  if (last && lid < s.nq) {
    volatile global const float2* m = (volatile global const float2*)(ml + (row0 + lid) * n_ch);
    float mmax = -INFINITY;
    for (int c0 = 0; c0 < s.n_used; c0 += 8) {
      float2 v[8];
      // unbranched, all 8 in flight: past n_used the last chunk's pair again, never used
      for (int e = 0; e < 8; ++e) v[e] = m[min(c0 + e, s.n_used - 1)];
      for (int e = 0; e < 8 && c0 + e < s.n_used; ++e) {
        ps[lid * ATT_WG + c0 + e] = v[e].x;
        ls[lid * ATT_WG + c0 + e] = v[e].y;
        mmax = max(mmax, v[e].x);
      }
    }
    float sum = 0.0f;
    for (int c = 0; c < s.n_used; ++c) {
      const float f = exp(ps[lid * ATT_WG + c] - mmax);
      sum += ls[lid * ATT_WG + c] * f;
      ls[lid * ATT_WG + c] = f;
    }
    stat[ATT_QB + lid] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  // Then each work-item its own dims of every head: the chunks' sums scaled and added in chunk order, 8
  // chunks of every head's loads in flight at once, unbranched (a head past nq or a chunk past n_used reads
  // the last one's again; the sums leave those out, and a head past nq is never written).
  volatile global const float* pr = parts + row0 * d * n_ch;
  for (int dd = lid; last && dd < d; dd += ATT_WG) {
    float sum[ATT_QB];
    for (int u = 0; u < ATT_QB; ++u) sum[u] = 0.0f;
    for (int c0 = 0; c0 < s.n_used; c0 += 8) {
      float v[ATT_QB][8];
      for (int u = 0; u < ATT_QB; ++u)
        for (int e = 0; e < 8; ++e)
          v[u][e] = pr[((long)min(u, s.nq - 1) * n_ch + min(c0 + e, s.n_used - 1)) * d + dd];  // unbranched
      for (int u = 0; u < ATT_QB; ++u)
        for (int e = 0; e < 8 && c0 + e < s.n_used; ++e) sum[u] += v[u][e] * ls[u * ATT_WG + c0 + e];
    }
    for (int u = 0; u < s.nq; ++u) {
      const float o = sum[u] * stat[ATT_QB + u];
      const float og = has_gate ? o * sigmoid_f(gate[(row0 + u) * gate_stride + dd]) : o;
      out[(row0 + u) * d + dd] = og;
      if (out_mode >= 2) outq[(row0 + u) * d + dd] = round_elem(og, out_mode);
    }
  }
  if (out_mode == 0 || out_mode == 1) {  // the group's heads hold whole blocks; every group the barriers
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    const int len = out_mode == 0 ? 32 : 256;
    for (int b = 0; b < s.nq * d / len; ++b)
      round_block_group_v(out + row0 * d, outq + row0 * d, out_mode, b, ATT_WG, last, ps, (local int*)ls);
  }
}
)CLC";

}  // namespace xpert::opencl
