// OpenCL C of the whole-model backend's attention (op_types.h AttentionArgs): one sequence's causal
// attention of f32 queries over its f16 KV cache, GQA and sliding window, as one pass of tiled online
// softmax. Core OpenCL C 1.2: the cache is read with vload_half.
//
// With slots (a decode step of several sequences, one token each): token t attends over slot slots[t]'s
// rows 0..pos[t], the slots slot_stride halves apart.
//
// One work-group of ATT_WG work-items per (head, token): the query (rounded to f16, as the CPU does) sits
// in local memory; each tile of ATT_WG keys gets one score per work-item. Two passes over the key tiles:
// the first keeps the running max and sum of the softmax (online, each work-item over its own keys, then a
// tree over the work-items), the second takes the scores again (kept in local memory where a query has at
// most ATT_KEEP keys, computed again past that) and adds each normalized weight, rounded to f16 as the CPU
// (and llama.cpp's f16 V product) rounds it, times V (each work-item owns head_dim / ATT_WG output dims, in
// pairs, head_dim <= ATT_MAXD). Two passes, but the output matches the CPU's to ~1e-6, so a model's routing
// near-ties resolve the same way on both. A decode step over 1024 keys or more takes the split form instead
// (kernels_attention_split.h).
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kAttentionSource = R"CLC(
#define ATT_WG 64
#define ATT_MAXD 512
#define ATT_DPT (ATT_MAXD / ATT_WG)
// Pass 1's scores are kept in local memory for pass 2 where a query has at most ATT_KEEP keys: every decode
// step that takes this kernel (deeper ones take the split form, kernels_attention_split.h).
#define ATT_KEEP 1024
#if ATT_WG != RED_WG
#error "the attention kernel's norms sum as wg_sum does: a tree over RED_WG work-items"
#endif
#if ATT_MAXD > ATT_KEEP
#error "the attention kernel stages v's row in kept"
#endif

// The f16 cache's values 2, 4 or 8 at a time from p. NVIDIA's OpenCL splits vload_half2 / 4 / 8 into 2-byte
// loads (no wider global load in either attention kernel's PTX, 2026-12-06), so this program reads a 4-, 8- or
// 16-byte word and converts each half from a register: the same values. The host builds it only where every
// such p is aligned to its word (att_wide_loads: the cache's rows and heads 16-byte aligned); NO_WIDE_LOADS
// (elsewhere, and the switch wide=0) reads with vload_halfN. H100, pp512: attention_block 242.7 -> 214.6 us a
// launch (qwen3-30b-a3b), 287.2 -> 241.2 (qwen3.5-35b-a3b); the decode kernel unchanged (2026-12-06). An
// alignment test a load instead lost (242 -> 365 us): each load sat in a branch of its own, so a key tile's
// loads were no longer in flight together.
#ifdef NO_WIDE_LOADS
#define ld_h2(p) vload_half2(0, (p))
#define ld_h4(p) vload_half4(0, (p))
#define ld_h8(p) vload_half8(0, (p))
#else
float2 ld_h2(global const half* p) {
  const uint w = *(global const uint*)p;
  return (float2)(h2f(w), h2f(w >> 16));
}
float4 ld_h4(global const half* p) {
  const uint2 w = *(global const uint2*)p;
  return (float4)(h2f(w.x), h2f(w.x >> 16), h2f(w.y), h2f(w.y >> 16));
}
float8 ld_h8(global const half* p) {
  const uint4 w = *(global const uint4*)p;
  return (float8)(h2f(w.x), h2f(w.x >> 16), h2f(w.y), h2f(w.y >> 16), h2f(w.z), h2f(w.z >> 16),
                  h2f(w.w), h2f(w.w >> 16));
}
#endif

// q.k * kq_scale, k read from the f16 cache: up to 128 halves loaded at once (32 loads in flight, not one
// trip to memory per value; a head of 128 in one trip), then summed in the order of one value at a time (the
// same bits as that loop).
float score(local const float* qs, global const half* kr, int d, float kq_scale) {
  float dot = 0.0f;
  int i = 0;
  while (i + 4 <= d) {
    const int n4 = min(32, (d - i) / 4);
    float4 k[32];
    for (int u = 0; u < 32; ++u) k[u] = ld_h4(kr + i + 4 * min(u, n4 - 1));  // no branch: all in flight
    for (int u = 0; u < n4; ++u) {
      dot += qs[i + 4 * u] * k[u].x;
      dot += qs[i + 4 * u + 1] * k[u].y;
      dot += qs[i + 4 * u + 2] * k[u].z;
      dot += qs[i + 4 * u + 3] * k[u].w;
    }
    i += 4 * n4;
  }
  for (; i < d; ++i) dot += qs[i] * vload_half(i, kr);
  return dot * kq_scale;
}

// q head (t, h) at q + (t * n_head + h) * q_stride; with has_gate, the output is multiplied by sigmoid(gate)
// (Qwen3.5's gated attention: gate head (t, h) at gate + (t * n_head + h) * gate_stride).
//
// store (a decode step, with slots): each group first normalizes (has_qn / has_kn: weights given) and rotates
// (n_rot > 0) its q head and its KV head's new k (k_new), as qk_norm_rope does with the same sums, and stores
// that k and v_new as f16 at row pos[t] of the slot, before it reads the cache. The n_head / n_head_kv groups
// of one KV head write the same bits to the same row; each reads it back only after its own writes (barrier):
// no group depends on another's. Its norms' tree is wg_sum's only with ATT_WG == RED_WG.
kernel void attention(global const float* q, global half* kc, global half* vc, global float* out,
                      global const int* pos, int n_head, int n_head_kv, int d, int n_kv, float kq_scale,
                      int window, global const int* slots, int use_slots, long slot_stride, int q_stride,
                      global const float* gate, int gate_stride, int has_gate, int out_mode,
                      global float* outq, volatile global int* counters, int store, global const float* k_new,
                      global const float* v_new, global const float* q_norm, int has_qn,
                      global const float* k_norm, int has_kn, int n_rot, float theta_scale, float freq_scale,
                      int neox, float eps) {
  local float qs[ATT_MAXD], kb[ATT_MAXD];
  local float ps[ATT_WG], ls[ATT_WG], kept[ATT_KEEP];
  local int pi[ATT_WG], flag;
  const int h = get_group_id(0), lid = get_local_id(0);
  const long t = get_group_id(1);
  const int hk = h / (n_head / n_head_kv);
  const long kv_row = (long)n_head_kv * d;
  global const float* qr = q + (t * n_head + h) * q_stride;
  const int p = pos[t];
  if (use_slots) {  // a decode step: token t is its sequence's last, over its slot's rows 0..p
    kc += (long)slots[t] * slot_stride;
    vc += (long)slots[t] * slot_stride;
    n_kv = p + 1;
  }
  // Every group takes the same barriers, store or not (PoCL wants no barrier under a branch).
  global const float* kr = store ? k_new + (t * n_head_kv + hk) * d : qr;
  global const float* vr = store ? v_new + (t * n_head_kv + hk) * d : qr;
  // q and k normalized with qk_norm_rope's sums, in one tree of pairs (ps, ls), every row's load issued before
  // it: v's row and the two norms' weights staged in kept (free until pass 1) where they fit.
  const int nq = store && has_qn, nk = store && has_kn, stage_w = 3 * d <= ATT_KEEP;
  local float *vs = kept, *wqs = kept + d, *wks = kept + 2 * d;
  float sq = 0.0f, sk = 0.0f;
  for (int i = lid; i < d; i += ATT_WG) {
    const float a = qr[i], b = kr[i];
    qs[i] = a;
    kb[i] = b;
    vs[i] = vr[i];
    if (stage_w && nq) wqs[i] = q_norm[i];
    if (stage_w && nk) wks[i] = k_norm[i];
    sq += a * a;
    sk += b * b;
  }
  ps[lid] = sq;
  ls[lid] = sk;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = ATT_WG / 2; s > 0; s >>= 1) {
    if (lid < s) {
      ps[lid] += ps[lid + s];
      ls[lid] += ls[lid + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float scq = 1.0f / sqrt(ps[0] / (float)d + eps), sck = 1.0f / sqrt(ls[0] / (float)d + eps);
  for (int i = lid; i < d; i += ATT_WG) {  // each work-item's own entries
    if (nq) qs[i] = (qs[i] * scq) * (stage_w ? wqs[i] : q_norm[i]);
    if (nk) kb[i] = (kb[i] * sck) * (stage_w ? wks[i] : k_norm[i]);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lid; store && i < n_rot / 2; i += ATT_WG) {
    int a, b;
    const float2 cs = rope_pair(p, i, n_rot, neox, theta_scale, freq_scale, &a, &b);
    rotate_local(qs, a, b, cs);
    rotate_local(kb, a, b, cs);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int i = lid; i < d; i += ATT_WG) {
    if (store) {
      vstore_half_rte(kb[i], (long)p * kv_row + (long)hk * d + i, kc);
      vstore_half_rte(vs[i], (long)p * kv_row + (long)hk * d + i, vc);
    }
    qs[i] = round_f16(qs[i]);
  }
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);

  const int lo = window > 0 ? max(0, p - window + 1) : 0;
  const int hi = min(p, n_kv - 1), keep = hi - lo < ATT_KEEP;
  // Pass 1: each work-item the running max and sum of exp over its own keys lo + lid, lo + lid + ATT_WG, ...
  // (no barrier between its keys, so its loads of one key need not wait for the group), then one tree
  // combines the work-items' pairs. Where they fit, the scores stay in `kept` for pass 2, which reads them in
  // the same work-item (key j0 + lid of each tile): not computed and read from the cache twice.
  float mx = -INFINITY, l = 0.0f;
  for (int j = lo + lid; j <= hi; j += ATT_WG) {
    const float sc = score(qs, kc + j * kv_row + hk * d, d, kq_scale);
    if (keep) kept[j - lo] = sc;
    const float mnew = max(mx, sc);
    l = l * exp(mx - mnew) + exp(sc - mnew);
    mx = mnew;
  }
  ps[lid] = mx;
  ls[lid] = l;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = ATT_WG / 2; s > 0; s >>= 1) {
    if (lid < s) {
      const float ma = ps[lid], mb = ps[lid + s], m = max(ma, mb);
      if (m > -INFINITY) ls[lid] = ls[lid] * exp(ma - m) + ls[lid + s] * exp(mb - m);
      ps[lid] = m;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  mx = ps[0];
  l = ls[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  // Pass 2: the normalized weights, rounded to f16 as the CPU rounds them, times V (key by key in order).
  // Work-item lid owns dims 2 lid + 2 ATT_WG a and the next (ATT_DIM(i): acc[i]'s), read as pairs, 32 keys'
  // loads in flight.
#define ATT_DIM(i) (2 * lid + 2 * ATT_WG * ((i) / 2) + (i) % 2)
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float acc[ATT_DPT];
  for (int i = 0; i < ATT_DPT; ++i) acc[i] = 0.0f;
  for (int j0 = lo; j0 <= hi; j0 += ATT_WG) {
    const int j = j0 + lid;
    float wt = 0.0f;
    if (j <= hi) {
      const float sc = keep ? kept[j - lo] : score(qs, kc + j * kv_row + hk * d, d, kq_scale);
      wt = round_f16(exp(sc - mx) * inv);
    }
    ps[lid] = wt;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int nt = min(ATT_WG, hi - j0 + 1);
    for (int a = 0; a < ATT_DPT / 2; ++a) {
      const int dd = ATT_DIM(2 * a);
      if (dd >= d) break;
      const bool pair = dd + 1 < d;
      float v0 = acc[2 * a], v1 = acc[2 * a + 1];
      global const half* vr = vc + (long)j0 * kv_row + hk * d + dd;
      for (int i0 = 0; i0 < nt; i0 += 32) {
        float2 vv[32];  // past the tile's last key its row again (unused): no load under a branch
        if (pair)
          for (int u = 0; u < 32; ++u) vv[u] = ld_h2(vr + min(i0 + u, nt - 1) * kv_row);
        else
          for (int u = 0; u < 32; ++u) vv[u] = (float2)(vload_half(min(i0 + u, nt - 1) * kv_row, vr), 0.0f);
        for (int u = 0; u < 32; ++u)
          if (i0 + u < nt) {
            v0 += ps[i0 + u] * vv[u].x;
            v1 += ps[i0 + u] * vv[u].y;
          }
      }
      acc[2 * a] = v0;
      acc[2 * a + 1] = v1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  global float* o = out + (t * n_head + h) * d;
  global const float* gr = gate + (t * n_head + h) * gate_stride;
  for (int i = 0; i < ATT_DPT; ++i) {
    const int dd = ATT_DIM(i);
    if (dd < d) acc[i] = has_gate ? acc[i] * sigmoid_f(gr[dd]) : acc[i];
    if (dd < d) o[dd] = acc[i];
  }
  // out_mode >= 0: the output also rounded for the projection that reads it (round_unit): values alone by
  // each group; blocks (modes 0, 1) by the last group of the heads a block spans (hpu of them; the host
  // launches only where d and the block divide one another), from the heads' outputs in global memory.
  if (out_mode >= 2)
    for (int i = 0; i < ATT_DPT; ++i) {
      const int dd = ATT_DIM(i);
      if (dd < d) outq[(t * n_head + h) * d + dd] = round_elem(acc[i], out_mode);
    }
#undef ATT_DIM
  if (out_mode == 0 || out_mode == 1)  // the same for every group
    round_head_blocks(out, outq, t, h, n_head, d, out_mode, ATT_WG, counters, &flag, ps, pi);
}

// Prefill: ATT_QB consecutive tokens (t0 = ATT_QB * group 1, fewer at the batch's end) of head `group 0` per
// work-group, without slots, so each key tile's K and V rows are read once for the block. Per query the sums
// are attention's, in its order (the same bits where there is no sliding window): the scores summed one value
// at a time; pass 1's running max and sum per work-item over its keys, then a tree; pass 2's weights rounded
// to f16, each work-item adding its pair of dims' V products key by key (weight 0 past a query's last key).
// The key tile's K comes through local memory ATT_KC dims at a time, read coalesced and stored as floats dim
// by dim (ks[dim * ATT_KS + key]: a warp's stores and reads each hit 32 banks), where each work-item reading
// its own key's row from global memory touched a cache line a work-item; the queries' values and the weights
// are read from local memory four at a time (a 16-byte read for four FMAs, where it was one read a FMA).
// H100, qwen3-30b-a3b pp512: 869 -> 414 us a launch (2026-12-05). A chunk's K loads are issued before the
// previous chunk's products, and V is read ATT_VK keys at a time, so the group waits for memory a few times a
// key tile rather than at every chunk and every 4 keys.
#define ATT_QB 8
#define ATT_KC 32
// ATT_BKEEP (the program's options: 512 where the device has the local memory, else 0): pass 1's scores of
// a block whose keys number at most this many are kept in local memory for pass 2, which then neither reads K
// nor computes the scores again (H200, qwen3-30b-a3b pp512: 288 us a launch, pp512 +4.3 %; 2026-12-06).
#ifndef ATT_BKEEP
#define ATT_BKEEP 0
#endif
#define ATT_BKEEP_ARR (ATT_BKEEP > 0 ? ATT_BKEEP : 1)
// ATT_BD (the block program's options: 128, 256 or 512, the least that holds the model's head_dim): a query's
// dims in local memory and a work-item's V accumulators (ATT_BDPT), so a head of 128 takes 4 KiB of q rows
// a group where ATT_MAXD took 16 (more groups a compute unit) and 16 accumulators where it took 64.
#ifndef ATT_BD
#define ATT_BD ATT_MAXD
#endif
#define ATT_BDPT (ATT_BD / ATT_WG)
#if ATT_BD % (2 * ATT_WG) || ATT_BD > ATT_MAXD
#error "ATT_BD: a multiple of 2 ATT_WG, at most ATT_MAXD"
#endif
#define ATT_KS (ATT_WG + 1)
// Pass 2 of attention_block reads V ATT_VK keys at a time (their loads in flight together: a tile of 64 keys
// waits for memory 4 times, where 4 keys at a time waited 16).
#define ATT_VK 16
#if ATT_KC != 32
#error "attention_block stages a chunk as 4 work-items of 8 dims a key"
#endif
// The K chunk a work-item stages (ATT_BLOCK_SCORES): for r < 4, the 8 halves at off of key j0 + r ATT_WG / 4
// + lid / 4 as floats, 0 past bhi and past the chunk's n values from off.
void att_k_chunk(global const half* kc, int j0, int bhi, long kv_row, long off, int n, int lid, float8* kn) {
  if (n >= 8) {  // the 4 loads unbranched (a key past bhi reads bhi's row, then 0): all in flight
    float8 t[4];
    for (int r = 0; r < 4; ++r) t[r] = ld_h8(kc + max(min(j0 + r * (ATT_WG / 4) + lid / 4, bhi), 0) * kv_row + off);
    for (int r = 0; r < 4; ++r) kn[r] = j0 + r * (ATT_WG / 4) + lid / 4 <= bhi ? t[r] : (float8)(0.0f);
    return;
  }
  for (int r = 0; r < 4; ++r) {
    const int kj = j0 + r * (ATT_WG / 4) + lid / 4;
    global const half* kr = kc + kj * kv_row + off;
    float k[8];
    for (int e = 0; e < 8; ++e) k[e] = kj <= bhi && e < n ? vload_half(e, kr) : 0.0f;
    kn[r] = vload8(0, k);
  }
}

// Pass 1's tree (attention_block, attention_split): the work-items' running max mx[u] and sum l[u] of each
// query combined pairwise, the query's max and sum left in ps[u ATT_WG] and ls[u ATT_WG].
void att_block_tree(const float* mx, const float* l, local float* ps, local float* ls, int lid) {
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int u = 0; u < ATT_QB; ++u) {
    ps[u * ATT_WG + lid] = mx[u];
    ls[u * ATT_WG + lid] = l[u];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = ATT_WG / 2; s > 0; s >>= 1) {
    if (lid < s)
      for (int u = 0; u < ATT_QB; ++u) {
        const int i = u * ATT_WG + lid;
        const float ma = ps[i], mb = ps[i + s], m = max(ma, mb);
        if (m > -INFINITY) ls[i] = ls[i] * exp(ma - m) + ls[i + s] * exp(mb - m);
        ps[i] = m;
      }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

// n keys' V pairs from row i of vr into v, pair (both dims) or not decided once: a choice in each load put
// each in a branch of its own, waiting its own trip (NVIDIA's OpenCL).
#define ATT_V_LOADS(v, n, i)                                                               \
  if (pair)                                                                                \
    for (int e = 0; e < (n); ++e) v[e] = ld_h2(vr + ((i) + e) * kv_row);                   \
  else                                                                                     \
    for (int e = 0; e < (n); ++e) v[e] = (float2)(vload_half(((i) + e) * kv_row, vr), 0.0f);

// Pass 2's products of a key tile (attention_block, attention_split): acc[u] += ps[u]'s weights times V's
// rows j0 .. j0 + nt - 1, work-item lid owning dims 2 lid + 2 ATT_WG a and the next (acc[u][2 a], acc[u][2 a
// + 1]), key by key in order.
#define ATT_BLOCK_V(j0, ntiles)                                                                          \
  {                                                                                                      \
    const int nt = (ntiles);                                                                             \
    for (int a = 0; a < ATT_BDPT / 2; ++a) {                                                             \
      const int dd = 2 * lid + 2 * ATT_WG * a;                                                           \
      if (dd >= d) break;                                                                                \
      const bool pair = dd + 1 < d;                                                                      \
      global const half* vr = vc + (long)(j0) * kv_row + hk * d + dd;                                    \
      int i = 0;                                                                                         \
      for (; i + ATT_VK <= nt; i += ATT_VK) { /* ATT_VK keys' loads in flight, then the products */      \
        float2 v[ATT_VK];                                                                                \
        ATT_V_LOADS(v, ATT_VK, i)                                                                        \
        for (int u = 0; u < ATT_QB; ++u) {                                                               \
          float s0 = acc[u][2 * a], s1 = acc[u][2 * a + 1];                                              \
          for (int e = 0; e < ATT_VK; e += 4) {                                                          \
            const float4 p = *(local const float4*)(ps + u * ATT_WG + i + e);                            \
            s0 += p.x * v[e].x;                                                                          \
            s1 += p.x * v[e].y;                                                                          \
            s0 += p.y * v[e + 1].x;                                                                      \
            s1 += p.y * v[e + 1].y;                                                                      \
            s0 += p.z * v[e + 2].x;                                                                      \
            s1 += p.z * v[e + 2].y;                                                                      \
            s0 += p.w * v[e + 3].x;                                                                      \
            s1 += p.w * v[e + 3].y;                                                                      \
          }                                                                                              \
          acc[u][2 * a] = s0, acc[u][2 * a + 1] = s1;                                                    \
        }                                                                                                \
      }                                                                                                  \
      for (; i + 4 <= nt; i += 4) {                                                                      \
        float2 v[4];                                                                                     \
        ATT_V_LOADS(v, 4, i)                                                                             \
        for (int u = 0; u < ATT_QB; ++u) {                                                               \
          const float4 p = *(local const float4*)(ps + u * ATT_WG + i);                                  \
          float s0 = acc[u][2 * a], s1 = acc[u][2 * a + 1];                                              \
          s0 += p.x * v[0].x;                                                                            \
          s1 += p.x * v[0].y;                                                                            \
          s0 += p.y * v[1].x;                                                                            \
          s1 += p.y * v[1].y;                                                                            \
          s0 += p.z * v[2].x;                                                                            \
          s1 += p.z * v[2].y;                                                                            \
          s0 += p.w * v[3].x;                                                                            \
          s1 += p.w * v[3].y;                                                                            \
          acc[u][2 * a] = s0, acc[u][2 * a + 1] = s1;                                                    \
        }                                                                                                \
      }                                                                                                  \
      for (; i < nt; ++i) {                                                                              \
        const float2 v = pair ? ld_h2(vr + i * kv_row) : (float2)(vload_half(i * kv_row, vr), 0.0f);     \
        for (int u = 0; u < ATT_QB; ++u) {                                                               \
          acc[u][2 * a] += ps[u * ATT_WG + i] * v.x;                                                     \
          acc[u][2 * a + 1] += ps[u * ATT_WG + i] * v.y;                                                 \
        }                                                                                                \
      }                                                                                                  \
    }                                                                                                    \
  }

kernel void attention_block(global const float* q, global const half* kc, global const half* vc,
                            global float* out, global const int* pos, int n_tokens, int n_head, int n_head_kv,
                            int d, int n_kv, float kq_scale, int window) {
  local float qs[ATT_QB * ATT_BD] __attribute__((aligned(16)));
  local float ps[ATT_QB * ATT_WG] __attribute__((aligned(16))), ls[ATT_QB * ATT_WG];
  local float ks[ATT_KC * ATT_KS];
  local float stat[2 * ATT_QB];
  local float kept[ATT_QB * ATT_BKEEP_ARR];
  const int h = get_group_id(0), lid = get_local_id(0);
  const int t0 = get_group_id(1) * ATT_QB, nq = min(ATT_QB, n_tokens - t0);
  const int hk = h / (n_head / n_head_kv);
  const long kv_row = (long)n_head_kv * d;
  for (int u = 0; u < ATT_QB; ++u)
    for (int i = lid; i < d; i += ATT_WG)
      qs[u * ATT_BD + i] = u < nq ? round_f16(q[((long)(t0 + u) * n_head + h) * d + i]) : 0.0f;
  int lo[ATT_QB], hi[ATT_QB];
  int blo = n_kv, bhi = -1;
  for (int u = 0; u < ATT_QB; ++u) {
    const int p = u < nq ? pos[t0 + u] : 0;
    lo[u] = window > 0 ? max(0, p - window + 1) : 0;
    hi[u] = u < nq ? min(p, n_kv - 1) : -1;
    if (u < nq) blo = min(blo, lo[u]), bhi = max(bhi, hi[u]);
  }
  const int keep = bhi - blo < ATT_BKEEP;  // the same in every work-item
  // Scores of key j0 + lid for every query of the block into ps (-INFINITY outside a query's keys), over the
  // dims below dl (d; 0 where pass 2 takes them from kept: the loop's barriers still in every work-item's
  // path, as PoCL wants). Staging: work-item lid loads dims 8 (lid % 4) .. + 7 of the chunk for keys
  // lid / 4 + r ATT_WG / 4 (r < 4). The next chunk's loads are issued before this chunk's products (kn), so
  // a tile waits for memory once, not once a chunk (the same values staged, the same sums).
#define ATT_BLOCK_SCORES(j0, dl)                                                                  \
  {                                                                                               \
    const int j = (j0) + lid, part = 8 * (lid % 4);                                               \
    float dot[ATT_QB];                                                                            \
    for (int u = 0; u < ATT_QB; ++u) dot[u] = 0.0f;                                               \
    float8 kn[4];                                                                                 \
    if ((dl) > 0) att_k_chunk(kc, (j0), bhi, kv_row, hk * d + part, min(ATT_KC, d) - part, lid, kn); \
    for (int i0 = 0; i0 < (dl); i0 += ATT_KC) {                                                   \
      const int nc = min(ATT_KC, d - i0);                                                         \
      barrier(CLK_LOCAL_MEM_FENCE); /* the last reads of ks (and the stores of qs) done */        \
      for (int r = 0; r < 4; ++r) {                                                               \
        local float* kd = ks + part * ATT_KS + r * (ATT_WG / 4) + lid / 4;                        \
        kd[0] = kn[r].s0, kd[ATT_KS] = kn[r].s1, kd[2 * ATT_KS] = kn[r].s2;                       \
        kd[3 * ATT_KS] = kn[r].s3, kd[4 * ATT_KS] = kn[r].s4, kd[5 * ATT_KS] = kn[r].s5;          \
        kd[6 * ATT_KS] = kn[r].s6, kd[7 * ATT_KS] = kn[r].s7;                                     \
      }                                                                                           \
      barrier(CLK_LOCAL_MEM_FENCE);                                                               \
      if (i0 + ATT_KC < (dl))                                                                     \
        att_k_chunk(kc, (j0), bhi, kv_row, hk * d + i0 + ATT_KC + part, min(ATT_KC, d - i0 - ATT_KC) - part, \
                    lid, kn);                                                                     \
      /* every work-item, past bhi too (its scores unused): PoCL 3.1 miscompiled this under if (j <= bhi) */ \
      local const float* kr = ks + lid;                                                           \
      int i = 0;                                                                                  \
      for (; i + 4 <= nc; i += 4) {                                                               \
        const float k0 = kr[i * ATT_KS], k1 = kr[(i + 1) * ATT_KS];                               \
        const float k2 = kr[(i + 2) * ATT_KS], k3 = kr[(i + 3) * ATT_KS];                         \
        for (int u = 0; u < ATT_QB; ++u) {                                                        \
          const float4 q4 = *(local const float4*)(qs + u * ATT_BD + i0 + i);                     \
          float s = dot[u];                                                                       \
          s += q4.x * k0;                                                                         \
          s += q4.y * k1;                                                                         \
          s += q4.z * k2;                                                                         \
          s += q4.w * k3;                                                                         \
          dot[u] = s;                                                                             \
        }                                                                                         \
      }                                                                                           \
      for (; i < nc; ++i)                                                                         \
        for (int u = 0; u < ATT_QB; ++u) dot[u] += qs[u * ATT_BD + i0 + i] * kr[i * ATT_KS];      \
    }                                                                                             \
    for (int u = 0; u < ATT_QB; ++u)                                                              \
      ps[u * ATT_WG + lid] = j >= lo[u] && j <= hi[u] ? dot[u] * kq_scale : -INFINITY;            \
  }
  // Pass 1, as attention's: work-item lid keeps each query's running max and sum over its keys blo + lid,
  // blo + lid + ATT_WG, ... (the same keys as attention's work-item lid where blo == lo), then a tree per query
  // combines the work-items' pairs (ps: the maxima, ls: the sums).
  float mx[ATT_QB], l[ATT_QB];
  for (int u = 0; u < ATT_QB; ++u) mx[u] = -INFINITY, l[u] = 0.0f;
  for (int j0 = blo; j0 <= bhi; j0 += ATT_WG) {
    ATT_BLOCK_SCORES(j0, d)
    for (int u = 0; u < ATT_QB; ++u) {
      const float sc = ps[u * ATT_WG + lid];
      if (keep && j0 + lid <= bhi) kept[u * ATT_BKEEP_ARR + j0 + lid - blo] = sc;
      if (sc == -INFINITY) continue;
      const float mnew = max(mx[u], sc);
      l[u] = l[u] * exp(mx[u] - mnew) + exp(sc - mnew);
      mx[u] = mnew;
    }
  }
  att_block_tree(mx, l, ps, ls, lid);
  if (lid < ATT_QB) {
    stat[lid] = ps[lid * ATT_WG];
    stat[ATT_QB + lid] = ls[lid * ATT_WG] > 0.0f ? 1.0f / ls[lid * ATT_WG] : 0.0f;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  // Pass 2. Work-item lid owns dims 2 lid + 2 ATT_WG a and the next (acc[u][2 a], acc[u][2 a + 1]).
  float acc[ATT_QB][ATT_BDPT];
  for (int u = 0; u < ATT_QB; ++u)
    for (int a = 0; a < ATT_BDPT; ++a) acc[u][a] = 0.0f;
  for (int j0 = blo; j0 <= bhi; j0 += ATT_WG) {
    ATT_BLOCK_SCORES(j0, keep ? 0 : d)
    for (int u = 0; u < ATT_QB; ++u) {
      const float s = keep ? (j0 + lid <= bhi ? kept[u * ATT_BKEEP_ARR + j0 + lid - blo] : -INFINITY)
                           : ps[u * ATT_WG + lid];
      ps[u * ATT_WG + lid] = s == -INFINITY ? 0.0f : round_f16(exp(s - stat[u]) * stat[ATT_QB + u]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ATT_BLOCK_V(j0, min(ATT_WG, bhi - j0 + 1))
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int u = 0; u < nq; ++u) {
    global float* o = out + ((long)(t0 + u) * n_head + h) * d;
    for (int a = 0; a < ATT_BDPT / 2; ++a) {
      const int dd = 2 * lid + 2 * ATT_WG * a;
      if (dd < d) o[dd] = acc[u][2 * a];
      if (dd + 1 < d) o[dd + 1] = acc[u][2 * a + 1];
    }
  }
}
)CLC";

}  // namespace xpert::opencl
