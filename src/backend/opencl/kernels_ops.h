// OpenCL C of the whole-model backend's small ops (opencl_backend.h): elementwise, rmsnorm, rope, f16
// stores, row gathers, the MoE gather / combine, the sum of a split product's planes. Core OpenCL C 1.2
// only: halves are read and written with vload_half / vstore_half_rte, no fp16 arithmetic, no subgroups.
// kClCommonSource is prepended to every program of the backend.
//
// Reductions run over one work-group of RED_WG (a power of two) work-items through local memory.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kClCommonSource = R"CLC(
#define RED_WG 64

// x rounded to the nearest f16 (ties to even), back in f32: what the CPU does where llama.cpp keeps
// values in f16 (q before the K product, the GELU table).
float round_f16(float x) {
  ushort h;
  vstore_half_rte(x, 0, (half*)&h);
  return vload_half(0, (const half*)&h);
}

// An f16 in the low 16 bits of a word, as a float (a word read whole, its halves converted from a register).
float h2f(uint bits) {
  const ushort u = (ushort)bits;
  return vload_half(0, (const half*)&u);
}

// Sum of v over n work-items of the group (n a power of two, lid the caller's flat index; every one gets it);
// buf: n floats.
float grp_sum(float v, local float* buf, int lid, int n) {
  buf[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = n / 2; s > 0; s >>= 1) {
    if (lid < s) buf[lid] += buf[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = buf[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

// Sum of v over the RED_WG work-items of the group (every work-item gets it); buf: RED_WG floats.
float wg_sum(float v, local float* buf) { return grp_sum(v, buf, get_local_id(0), RED_WG); }

float silu_f(float x) { return x / (1.0f + exp(-x)); }
float sigmoid_f(float x) { return 1.0f / (1.0f + exp(-x)); }
// Activations rounded as the CPU's matmul rounds them before multiplying (quant/quant.h
// quantize_row_activation then dequantize): mode 0: Q8_0 per 32 (scale f16(amax / 127), ties to even),
// 1: Q8_K per 256 (scale -max / 127 from the signed value of largest magnitude), 2: f16, 3: bf16.
// round_unit rounds unit b of row xr into yr: block b (modes 0, 1) or element b (modes 2, 3); a row of k
// has round_units(k, mode) of them. The matmul then sees the same values as the CPU's integer dot
// products, so the two agree up to summation order.
int round_units(int k, int mode) { return mode == 0 ? k / 32 : mode == 1 ? k / 256 : k; }
#pragma OPENCL FP_CONTRACT OFF
// Modes 2 and 3: one value.
float round_elem(float x, int mode) {
  if (mode == 2) return round_f16(x);
  const uint u = as_uint(x);
  const uint h = (u & 0x7fffffff) > 0x7f800000 ? (u >> 16) | 64 : (u + (0x7fff + ((u >> 16) & 1))) >> 16;
  return as_float(h << 16);
}
// v, of a block (modes 0, 1) whose largest magnitude is mx (mode 1: its first occurrence, kept signed), rounded
// as round_unit rounds it: the one formula of every block rounding.
float round_value(float v, int mode, float mx) {
  const float amax = fabs(mx);
  if (mode == 0) {
    const float d = round_f16(amax / 127.f), id = amax != 0.0f ? 127.f / amax : 0.0f;
    return rint(v * id) * d;
  }
  if (amax == 0.0f) return 0.0f;
  const float iscale = -127.f / mx, d = 1.0f / iscale;
  return min(127.0f, rint(iscale * v)) * d;
}
void round_unit(global const float* xr, global float* yr, int mode, int b) {
  if (mode >= 2) {
    yr[b] = round_elem(xr[b], mode);
    return;
  }
  const int len = mode == 0 ? 32 : 256, i0 = b * len;
  float mx = 0.0f;
  for (int i = 0; i < len; ++i)  // the first of the largest magnitude, signed
    if (fabs(xr[i0 + i]) > fabs(mx)) mx = xr[i0 + i];
  for (int i = 0; i < len; ++i) yr[i0 + i] = round_value(xr[i0 + i], mode, mx);
}
// The last of `total` work-groups to pass here (after its work-items wrote the group's results) gets 1, the
// others 0, every work-item of a group the same; the last resets *cnt for the next launch. Its reads of the
// others' results must go through volatile pointers (an SM's L1 may hold lines from before their writes).
int last_group(volatile global int* cnt, int total, local int* flag) {
  mem_fence(CLK_GLOBAL_MEM_FENCE);  // each writer's results before the group's count
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  if (get_local_id(0) == 0 && get_local_id(1) == 0) {
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

// Block b (modes 0, 1) of row xr rounded as round_unit rounds it, by the wg work-items of a group (rv, ri:
// wg entries of local memory): the largest magnitude (mode 1: its first occurrence, kept signed) by a
// reduction, then a value per work-item. active 0: the group only takes the barriers (kernels where only some
// groups round keep every barrier on every group). QUAL: xr's address space, volatile where it holds other
// groups' results. Loads go 8 at a time (volatile loads are not batched by the compiler: one at a time, each
// would wait its trip to L2), and where a work-item's share fits those 8 (len <= 8 wg: a GPU's groups) the
// block is read once: the rounding takes the values and the largest from registers and local memory.
#define ROUND_BLOCK_GROUP(NAME, QUAL)                                                                         \
  void NAME(QUAL const float* xr, global float* yr, int mode, int b, int wg, int active, local float* rv, \
            local int* ri) {                                                                                  \
    const int lid = get_local_id(0), len = mode == 0 ? 32 : 256, i0 = b * len, kept = len <= 8 * wg;          \
    float v[8];                                                                                               \
    float best = 0.0f;                                                                                        \
    int bi = len;                                                                                             \
    if (active)                                                                                               \
      for (int i = lid; i < len; i += 8 * wg) {                                                               \
        for (int u = 0; u < 8; ++u) v[u] = i + u * wg < len ? xr[i0 + i + u * wg] : 0.0f;                    \
        for (int u = 0; u < 8; ++u)                                                                           \
          if (fabs(v[u]) > fabs(best)) best = v[u], bi = i + u * wg;                                          \
      }                                                                                                       \
    rv[lid] = best;                                                                                           \
    ri[lid] = bi;                                                                                             \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
    for (int s = wg / 2; s > 0; s >>= 1) {                                                                    \
      if (lid < s) {                                                                                          \
        const float a = fabs(rv[lid]), c = fabs(rv[lid + s]);                                                 \
        if (c > a || (c == a && ri[lid + s] < ri[lid])) rv[lid] = rv[lid + s], ri[lid] = ri[lid + s];         \
      }                                                                                                       \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                           \
    }                                                                                                         \
    const float mx = rv[0];                                                                                   \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
    if (!active) return;                                                                                      \
    for (int i = lid; i < len; i += 8 * wg) {                                                                 \
      if (!kept)                                                                                              \
        for (int u = 0; u < 8; ++u) v[u] = i + u * wg < len ? xr[i0 + i + u * wg] : 0.0f;                     \
      for (int u = 0; u < 8; ++u) {                                                                           \
        if (i + u * wg >= len) break;                                                                         \
        yr[i0 + i + u * wg] = round_value(v[u], mode, mx);                                                    \
      }                                                                                                       \
    }                                                                                                         \
  }
ROUND_BLOCK_GROUP(round_block_group, global)
ROUND_BLOCK_GROUP(round_block_group_v, volatile global)
ROUND_BLOCK_GROUP(round_block_group_l, local)
// Token t's output head h (of n_head, d values each, in out) rounded for the projection that reads it, in
// blocks (mode 0, 1: round_unit) by the last group of the heads a block spans (hpu of them; the host asks
// only where d and the block divide one another), from the heads' outputs in global memory; every group of
// the launch takes the same barriers. rv / ri: wg entries of local memory.
void round_head_blocks(volatile global const float* out, global float* outq, long t, int h, int n_head, int d,
                       int mode, int wg, volatile global int* counters, local int* flag, local float* rv,
                       local int* ri) {
  const int unit = mode == 0 ? 32 : 256, hpu = d >= unit ? 1 : unit / d, h0 = h - h % hpu;
  const int last = last_group(counters + t * (n_head / hpu) + h / hpu, hpu, flag);
  const long row = (t * n_head + h0) * d;
  for (int b = 0; b < hpu * d / unit; ++b) round_block_group_v(out + row, outq + row, mode, b, wg, last, rv, ri);
}
#pragma OPENCL FP_CONTRACT ON
// MoE routing of token t on the device (decode-sized batches), by the wg work-items of a group: softmax over
// the router's logits l, the k most probable experts (ties: the lower index first) with their probabilities
// renormalised (the sum clamped to f16's smallest normal, as llama.cpp) and scaled, as cpu::route_top_k
// computes them (its softmax sums in double: weights within a few ulps). Each slot is its own grouped row,
// so the tables of moe_gather / gemv tasks / moe_combine are written here: row_slot[s] = slot_row[s] = s,
// tasks[s] = (s, expert). active 0: only the barriers (see round_block_group). n_expert <= ROUTE_MAX;
// p: ROUTE_MAX, bv / bi: wg entries of local memory. l is volatile: it may hold other groups' results.
#define ROUTE_MAX 4096
void route_token(volatile global const float* l, int n_expert, int k, int norm, float scale, int t, int active,
                 global int* row_slot, global int* slot_row, global float* weights, global int* tasks, int wg,
                 local float* p, local float* bv, local int* bi) {
  const int lid = get_local_id(0);
  float mx = -INFINITY;
  if (active)
    for (int e = lid; e < n_expert; e += wg) mx = fmax(mx, l[e]);
  bv[lid] = mx;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = wg / 2; s > 0; s >>= 1) {
    if (lid < s) bv[lid] = fmax(bv[lid], bv[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  mx = bv[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f;
  if (active)
    for (int e = lid; e < n_expert; e += wg) {
      const float v = exp(l[e] - mx);
      p[e] = v;
      sum += v;
    }
  bv[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = wg / 2; s > 0; s >>= 1) {
    if (lid < s) bv[lid] += bv[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / bv[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (active)
    for (int e = lid; e < n_expert; e += wg) p[e] *= inv;
  barrier(CLK_LOCAL_MEM_FENCE);
  // k rounds of a (probability, lower index) argmax over the experts not yet taken.
  float wsum = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -1.0f;
    int be = n_expert;
    if (active)
      for (int e = lid; e < n_expert; e += wg)
        if (p[e] > best) best = p[e], be = e;  // ascending e: a tie keeps the lower index
    bv[lid] = best;
    bi[lid] = be;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg / 2; s > 0; s >>= 1) {
      if (lid < s && (bv[lid + s] > bv[lid] || (bv[lid + s] == bv[lid] && bi[lid + s] < bi[lid])))
        bv[lid] = bv[lid + s], bi[lid] = bi[lid + s];
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    best = bv[0];
    be = bi[0];
    wsum += best;
    if (lid == 0 && active) {
      const int s = t * k + j;
      row_slot[s] = s;
      slot_row[s] = s;
      tasks[2 * s] = s;
      tasks[2 * s + 1] = be;
      weights[s] = best;
      p[be] = -2.0f;  // taken
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (!active) return;
  const float d = norm ? fmax(wsum, 6.103515625e-5f) : 1.0f;
  for (int j = lid; j < k; j += wg) {
    float w = weights[t * k + j];
    if (norm) w /= d;
    if (scale != 0.0f && scale != 1.0f) w *= scale;
    weights[t * k + j] = w;
  }
}

// RoPE of pair i at position pos: its two dims (NeoX: i and i + n_rot / 2, else 2i and 2i + 1) in *a and *b,
// and the cosine and sine of its angle, built by repeated multiplication as the CPU (and ggml) builds it, so
// it rounds the same way.
float2 rope_pair(int pos, int i, int n_rot, int neox, float theta_scale, float freq_scale, int* a, int* b) {
  float theta = (float)pos;
  for (int j = 0; j < i; ++j) theta *= theta_scale;
  const float th = freq_scale * theta;
  *a = neox ? i : 2 * i;
  *b = neox ? i + n_rot / 2 : 2 * i + 1;
  return (float2)(cos(th), sin(th));
}
// v's dims a and b rotated by cs = (cosine, sine).
void rotate_local(local float* v, int a, int b, float2 cs) {
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * cs.x - x1 * cs.y;
  v[b] = x0 * cs.y + x1 * cs.x;
}
)CLC";

inline constexpr std::string_view kOpsSource = R"CLC(
// One work-group per row: y = x / sqrt(mean(x^2) + eps) * w (w optional).
kernel void rmsnorm(global const float* x, global const float* w, int has_w, global float* y, int n, float eps) {
  local float buf[RED_WG];
  const long r = get_group_id(0);
  const int lid = get_local_id(0);
  global const float* xr = x + r * n;
  global float* yr = y + r * n;
  float s = 0.0f;
  for (int i = lid; i < n; i += RED_WG) s += xr[i] * xr[i];
  s = wg_sum(s, buf);
  const float scale = 1.0f / sqrt(s / (float)n + eps);
  for (int i = lid; i < n; i += RED_WG) yr[i] = has_w ? (xr[i] * scale) * w[i] : xr[i] * scale;
}

// Work-item (t, i): pair i of token t, every head (rope_pair).
kernel void rope(global float* x, global const int* pos, int n_heads, int head_dim, int n_rot, float theta_scale,
                 float freq_scale, int neox) {
  const int i = get_global_id(0);
  const long t = get_global_id(1);
  if (i >= n_rot / 2) return;
  int a, b;
  const float2 cs = rope_pair(pos[t], i, n_rot, neox, theta_scale, freq_scale, &a, &b);
  for (int h = 0; h < n_heads; ++h) {
    global float* v = x + (t * n_heads + h) * head_dim;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * cs.x - x1 * cs.y;
    v[b] = x0 * cs.y + x1 * cs.x;
  }
}

kernel void swiglu(global const float* gate, global const float* up, global float* y, long n) {
  const long i = get_global_id(0);
  if (i < n) y[i] = silu_f(gate[i]) * up[i];
}

// gelu_tanh through f16 as llama.cpp's CPU table: f16(gelu(f16(gate))) * up (gate outside (-10, 10): 0 or gate).
kernel void geglu(global const float* gate, global const float* up, global float* y, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float x = gate[i];
  if (x <= -10.0f || x >= 10.0f) {  // the CPU's table covers (-10, 10)
    y[i] = x <= -10.0f ? 0.0f : x * up[i];
    return;
  }
  const float g = round_f16(x);
  const float k = 0.79788456080286535587989211986876f;
  const float ge = 0.5f * g * (1.0f + tanh(k * g * (1.0f + 0.044715f * g * g)));
  y[i] = round_f16(ge) * up[i];
}

kernel void add(global const float* a, global const float* b, global float* y, long n) {
  const long i = get_global_id(0);
  if (i < n) y[i] = a[i] + b[i];
}

kernel void scale(global float* x, float s, long n) {
  const long i = get_global_id(0);
  if (i < n) x[i] *= s;
}

kernel void add_bias(global float* x, global const float* bias, int n, long total) {
  const long i = get_global_id(0);
  if (i < total) x[i] += bias[i % n];
}

kernel void mul_sigmoid(global float* x, global const float* gate, long n) {
  const long i = get_global_id(0);
  if (i < n) x[i] *= sigmoid_f(gate[i]);
}

kernel void add_sigmoid_scaled(global float* y, global const float* s, global const float* g, int n, long total) {
  const long i = get_global_id(0);
  if (i < total) y[i] += s[i] * sigmoid_f(g[i / n]);
}

kernel void deinterleave(global const float* src, int width, global float* a, global float* b, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const long r = i / width, c = i % width;
  a[i] = src[r * 2 * width + c];
  b[i] = src[r * 2 * width + width + c];
}

// y[i] = x[rows[i]], rows of width.
kernel void gather_rows(global const float* x, global const long* rows, int width, global float* y, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const long r = i / width, c = i % width;
  y[i] = x[rows[r] * width + c];
}

kernel void store_f16(global const float* x, global half* dst, long n) {
  const long i = get_global_id(0);
  if (i < n) vstore_half_rte(x[i], i, dst);
}

// Activations rounded as the CPU's matmul rounds them (round_unit, kClCommonSource); work-item (b, r): unit
// b of row r.
kernel void round_activations(global const float* x, int k, global float* y, int mode) {
  const long r = get_global_id(1);
  round_unit(x + r * k, y + r * k, mode, get_global_id(0));
}

// Block blk (modes 0, 1: 32 or 256 values from x + blk * len) rounded as round_unit rounds it into y, by a
// team of ROUND_TEAM work-items (lane: 0 ..; tv / ti: the team's ROUND_TEAM entries of local memory): each lane
// a float4 every 32 values (1 or 8 loads in flight, four teams' 128-byte lines a warp), the largest
// magnitude from the lanes' in one barrier, no tree; the values by round_value (FP_CONTRACT OFF, where it is
// defined). valid 0: the lane only takes the barrier.
#define ROUND_TEAM 8
void round_block_team(global const float* x, global float* y, int mode, long blk, int valid, int lane,
                      local float* tv, local int* ti) {
  const int len = mode == 0 ? 32 : 256, n4 = len / 32;
  float4 v[8];
  float best = 0.0f;
  int bi = len;
  if (valid) {
    global const float* xb = x + blk * len;
    for (int u = 0; u < 8; ++u)
      if (u < n4) v[u] = vload4(0, xb + 32 * u + 4 * lane);
    for (int u = 0; u < 8; ++u) {  // ascending index: a tie keeps the first
      if (u >= n4) break;
      const int i = 32 * u + 4 * lane;
      if (fabs(v[u].x) > fabs(best)) best = v[u].x, bi = i;
      if (fabs(v[u].y) > fabs(best)) best = v[u].y, bi = i + 1;
      if (fabs(v[u].z) > fabs(best)) best = v[u].z, bi = i + 2;
      if (fabs(v[u].w) > fabs(best)) best = v[u].w, bi = i + 3;
    }
  }
  tv[lane] = best;
  ti[lane] = bi;
  barrier(CLK_LOCAL_MEM_FENCE);
  float mx = tv[0];
  int mi = ti[0];
  for (int j = 1; j < ROUND_TEAM; ++j) {
    const float a = fabs(mx), c = fabs(tv[j]);
    if (c > a || (c == a && ti[j] < mi)) mx = tv[j], mi = ti[j];
  }
  if (!valid) return;
  global float* yb = y + blk * len;
  for (int u = 0; u < 8; ++u) {
    if (u >= n4) break;
    const float4 q = (float4)(round_value(v[u].x, mode, mx), round_value(v[u].y, mode, mx),
                              round_value(v[u].z, mode, mx), round_value(v[u].w, mode, mx));
    vstore4(q, 0, yb + 32 * u + 4 * lane);
  }
}

// Modes 0 and 1: the n_blocks blocks of x (rows of whole blocks, one after another) a team of ROUND_TEAM
// work-items each, RED_WG / ROUND_TEAM a group (round_block_team). A block a group of RED_WG with a tree
// took 24.9 us a launch on qwen3-30b-a3b pp512 (H100, 2026-12-07).
kernel void round_blocks(global const float* x, long n_blocks, global float* y, int mode) {
  local float tv[RED_WG];
  local int ti[RED_WG];
  const int lid = get_local_id(0), team = lid / ROUND_TEAM, lane = lid % ROUND_TEAM;
  const long blk = (long)get_group_id(0) * (RED_WG / ROUND_TEAM) + team;
  round_block_team(x, y, mode, blk, blk < n_blocks, lane, tv + ROUND_TEAM * team, ti + ROUND_TEAM * team);
}

// MoE routing on the device for decode-sized batches, one work-group of RED_WG per token (route_token,
// kClCommonSource).
kernel void moe_route_slots(global const float* logits, int n_expert, int k, int norm, float scale,
                            global int* row_slot, global int* slot_row, global float* weights, global int* tasks,
                            int n_tokens) {
  local float p[ROUTE_MAX];
  local float bv[RED_WG];
  local int bi[RED_WG];
  const int t = get_group_id(0);
  route_token(logits + (long)t * n_expert, n_expert, k, norm, scale, t, 1, row_slot, slot_row, weights, tasks, RED_WG,
              p, bv, bi);
}

// MoE: grouped row g holds the token of slot row_slot[g] (slot = t * k + j).
kernel void moe_gather(global const float* x, global const int* row_slot, int k, int width, global float* xg,
                       long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const long g = i / width, c = i % width;
  xg[i] = x[(long)(row_slot[g] / k) * width + c];
}

// out[t] = sum_j weights[t*k+j] * yg[slot_row[t*k+j]], in slot order (as the CPU sums); slot_row -1: a slot
// another device computes.
kernel void moe_combine(global const float* yg, global const int* slot_row, global const float* weights, int k,
                        int width, global float* out, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const long t = i / width, c = i % width;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int g = slot_row[t * k + j];
    if (g >= 0) acc += weights[t * k + j] * yg[(long)g * width + c];
  }
  out[i] = acc;
}
)CLC";

}  // namespace xpert::opencl
