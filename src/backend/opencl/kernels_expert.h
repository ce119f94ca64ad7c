// OpenCL C of the expert kernels (SwiGLU FFN of one MoE expert: gate and up, SiLU(gate) * up, down), compiled
// by the driver at run time, one program per weight type. Everything here is core OpenCL C 1.2: no fp16
// arithmetic (halves are read with vload_half), no subgroups unless SUBGROUP16 is defined.
//
// Build options:
//   WT_Q4_0 | WT_Q8_0 | WT_Q4_K | WT_Q6_K  the weight type of the matrix kernels, GGUF blocks read in place
//   WT_GPTQ + GPTQ_GROUP (+ GPTQ_ZEROS)  native GPTQ-INT4 (quant/gptq.h): whole matrices, read as stored
//   LANES       work-items sharing one output feature in the matrix-vector kernels (16 on GPUs, 1 on CPUs)
//   MV_NR       output features per matrix-vector work-group
//   SUBGROUP16  the LANES (= 16) work-items of a feature are one subgroup (cl_intel_subgroups +
//               cl_intel_required_subgroup_size): sums by sub_group_reduce_add instead of local memory
//
// Activations are quantized to int8 as the CPU path does (Q8_0 for Q4_0/Q8_0 weights, Q8_K for K-quants)
// and kept per row of K as: qa[K] int8, da[K/32] the scale of each 32-group (a Q8_K scale repeated over
// its 8 groups), sa[K/16] the sum of each 16 quants (for the weights' offsets and mins).
// A weight 32-group contributes da * (s_lo * sum(w*a, 0..15) + s_hi * sum(w*a, 16..31) - mn * sum(a)).
//
// Kernels: quantize_q8_0, quantize_q8_k (activations); mv_gate_up, mv_down (decode: few rows per expert,
// LANES work-items per output feature); mm_gate_up, mm_down (prefill, W4A8: one output feature per
// work-item, TM activation rows staged in local memory, every weight group read once per TM rows).
// Work is described by chunks (int4: expert slot, first row, row count, unused), one per group id 2
// (matrix-vector) or 1 (tiled).
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kExpertKernelSource = R"CLC(
#define MV_ROWS 4   // activation rows a matrix-vector pass multiplies with each weight group
#define TM 16       // activation rows of a tiled work-group
#define TN 64       // output features of a tiled work-group (= its work-items)
#define KT 8        // 32-groups of K staged in local memory per tiled step

#ifdef SUBGROUP16
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
#define MV_ATTRS __attribute__((reqd_work_group_size(LANES, MV_NR, 1))) __attribute__((intel_reqd_sub_group_size(16)))
#else
#define MV_ATTRS __attribute__((reqd_work_group_size(LANES, MV_NR, 1)))
#endif

// The integer weights of one 32-group (lo: elements 0..15, hi: 16..31) and how they scale.
typedef struct {
  char16 lo, hi;
  float s_lo, s_hi, mn;
} Group;

// Products in 16 bits (|w * a| <= 128 * 128), summed in pairs into 32. Fewer instructions than widening each
// operand to int (DG2's compiler spills less), and the form Intel's x86 CPU runtime (2026.2.0) compiles right for
// AVX-512: hsum(convert_int16(w) * convert_int16(a)) came out wrong in mv_down on Q4_K there (right at
// -cl-opt-disable, for AVX2, and on PoCL).
inline int dot16(char16 w, char16 a) {
  const short16 p = convert_short16(w) * convert_short16(a);
  const int8 s = convert_int8(p.even) + convert_int8(p.odd);
  const int4 b = s.lo + s.hi;
  const int2 c = b.lo + b.hi;
  return c.x + c.y;
}

inline float group_dot(const Group w, char16 a0, char16 a1, float da, int sum_a) {
  return da * (w.s_lo * (float)dot16(w.lo, a0) + w.s_hi * (float)dot16(w.hi, a1) - w.mn * (float)sum_a);
}

// ---- weight groups, GGUF block layouts (quant/README.md) ----

// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes of nibbles (element j low nibble of qs[j], j+16 high); d*(q-8).
inline Group load_q4_0(global const uchar* row, int g) {
  global const uchar* b = row + 18 * g;
  const float d = vload_half(0, (global const half*)b);
  const uchar16 q = vload16(0, b + 2);
  Group w;
  w.lo = as_char16(q & (uchar16)(0xF)) - (char16)(8);
  w.hi = as_char16(q >> (uchar16)(4)) - (char16)(8);
  w.s_lo = d;
  w.s_hi = d;
  w.mn = 0.0f;
  return w;
}

// Q8_0: 34-byte blocks of 32: f16 d, 32 int8.
inline Group load_q8_0(global const uchar* row, int g) {
  global const uchar* b = row + 34 * g;
  const float d = vload_half(0, (global const half*)b);
  global const char* q = (global const char*)(b + 2);
  Group w;
  w.lo = vload16(0, q);
  w.hi = vload16(1, q);
  w.s_lo = d;
  w.s_hi = d;
  w.mn = 0.0f;
  return w;
}

// Q4_K: 144-byte super-blocks of 256: f16 d, dmin, 12 bytes of 6-bit (scale, min) x 8, 128 bytes of nibbles;
// group j of 8: d*sc[j]*q - dmin*m[j], q the low (j even) or high (j odd) nibbles of qs[32*(j/2)..+31].
inline Group load_q4_k(global const uchar* row, int g) {
  global const uchar* b = row + 144 * (g >> 3);
  const int j = g & 7;
  const float d = vload_half(0, (global const half*)b);
  const float dmin = vload_half(1, (global const half*)b);
  global const uchar* sc = b + 4;
  uchar s, m;
  if (j < 4) {
    s = sc[j] & 63;
    m = sc[j + 4] & 63;
  } else {
    s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
  global const uchar* q = b + 16 + 32 * (j >> 1);
  const uchar16 q0 = vload16(0, q), q1 = vload16(1, q);
  Group w;
  if (j & 1) {
    w.lo = as_char16(q0 >> (uchar16)(4));
    w.hi = as_char16(q1 >> (uchar16)(4));
  } else {
    w.lo = as_char16(q0 & (uchar16)(0xF));
    w.hi = as_char16(q1 & (uchar16)(0xF));
  }
  w.s_lo = d * (float)s;
  w.s_hi = w.s_lo;
  w.mn = dmin * (float)m;
  return w;
}

// Q6_K: 210-byte super-blocks of 256: ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16] (one per 16),
// f16 d; element c*128 + 32*i + l: low bits in ql[64c + 32(i&1) + l] (high nibble for i >= 2), high bits
// at bit 2i of qh[32c + l]; value d*scale*(q-32).
inline Group load_q6_k(global const uchar* row, int g) {
  global const uchar* b = row + 210 * (g >> 3);
  const int j = g & 7, c = j >> 2, i = j & 3;
  const float d = vload_half(0, (global const half*)(b + 208));
  global const uchar* ql = b + 64 * c + 32 * (i & 1);
  global const uchar* qh = b + 128 + 32 * c;
  uchar16 l0 = vload16(0, ql), l1 = vload16(1, ql);
  if (i >= 2) {
    l0 = l0 >> (uchar16)(4);
    l1 = l1 >> (uchar16)(4);
  } else {
    l0 = l0 & (uchar16)(0xF);
    l1 = l1 & (uchar16)(0xF);
  }
  const uchar16 shift = (uchar16)(2 * i);
  const uchar16 h0 = (vload16(0, qh) >> shift) & (uchar16)(3), h1 = (vload16(1, qh) >> shift) & (uchar16)(3);
  global const char* sc = (global const char*)(b + 192) + 8 * c + 2 * i;
  Group w;
  w.lo = as_char16(l0 | (h0 << (uchar16)(4))) - (char16)(32);
  w.hi = as_char16(l1 | (h1 << (uchar16)(4))) - (char16)(32);
  w.s_lo = d * (float)sc[0];
  w.s_hi = d * (float)sc[1];
  w.mn = 0.0f;
  return w;
}

#ifdef WT_GPTQ
// GPTQ-INT4 as the checkpoint stores it (quant/gptq.h): the matrix at m is qweight u32 [K/8][N], scales f16
// [K/GPTQ_GROUP][N] (and with GPTQ_ZEROS zero points u8 [K/GPTQ_GROUP][N]); input i of feature f is nibble
// i%8 of qweight[i/8][f], value (q - zero) * scale. Not rows of blocks: the kernels' row pointer stays the
// matrix (ROW_BYTES 0) and load_group takes the feature (fr) and shapes (N, K) of the calling kernel.
inline char8 gptq_nibbles(global const uchar* m, size_t word) {
  const uint w = as_uint(vload4(0, m + 4 * word));
  return convert_char8(((uint8)(w) >> (uint8)(0, 4, 8, 12, 16, 20, 24, 28)) & (uint8)(0xF));
}
inline Group load_gptq(global const uchar* m, size_t f, int N, int K, int g) {
  const size_t n = (size_t)N, grp = (size_t)(32 * g / GPTQ_GROUP), q_bytes = (size_t)K / 2 * n;
#ifdef GPTQ_ZEROS
  const char z = (char)m[q_bytes + (size_t)(K / GPTQ_GROUP) * n * 2 + grp * n + f];
#else
  const char z = 8;
#endif
  Group w;
  w.lo = (char16)(gptq_nibbles(m, (size_t)(4 * g) * n + f), gptq_nibbles(m, (size_t)(4 * g + 1) * n + f)) - (char16)(z);
  w.hi = (char16)(gptq_nibbles(m, (size_t)(4 * g + 2) * n + f), gptq_nibbles(m, (size_t)(4 * g + 3) * n + f)) - (char16)(z);
  w.s_lo = vload_half(grp * n + f, (global const half*)(m + q_bytes));
  w.s_hi = w.s_lo;
  w.mn = 0.0f;
  return w;
}
#endif

#if defined(WT_GPTQ)
#define ROW_BYTES(k) ((size_t)0)
#define load_group(m, g) load_gptq(m, fr, N, K, g)
#elif defined(WT_Q4_0)
#define ROW_BYTES(k) ((size_t)(k) / 32 * 18)
#define load_group load_q4_0
#elif defined(WT_Q8_0)
#define ROW_BYTES(k) ((size_t)(k) / 32 * 34)
#define load_group load_q8_0
#elif defined(WT_Q4_K)
#define ROW_BYTES(k) ((size_t)(k) / 256 * 144)
#define load_group load_q4_k
#elif defined(WT_Q6_K)
#define ROW_BYTES(k) ((size_t)(k) / 256 * 210)
#define load_group load_q6_k
#else
#error "define the weight type: WT_Q4_0, WT_Q8_0, WT_Q4_K or WT_Q6_K"
#endif

// ---- activations ----

// Q8_0 (for Q4_0 and Q8_0 weights) as the CPU's x86 path: d = f16(amax / 127), q = rint(x * 127 / amax).
// One work-item per 32-group; n_groups = rows * K / 32.
kernel void quantize_q8_0(global const float* x, global char* qa, global float* da, global int* sa, int n_groups) {
  const int g = get_global_id(0);
  if (g >= n_groups) return;
  global const float* v = x + 32 * (size_t)g;
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = fmax(amax, fabs(v[i]));
  ushort d16;
  vstore_half_rte(amax / 127.0f, 0, (private half*)&d16);
  da[g] = vload_half(0, (private const half*)&d16);
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int s0 = 0, s1 = 0;
  for (int i = 0; i < 32; ++i) {
    const int q = (int)rint(v[i] * id);
    qa[32 * (size_t)g + i] = (char)q;
    if (i < 16) s0 += q;
    else s1 += q;
  }
  sa[2 * (size_t)g] = s0;
  sa[2 * (size_t)g + 1] = s1;
}

// Q8_K (for K-quant weights) as ggml: the signed value of largest magnitude m, q = min(127, rint(-127/m * x)),
// d = 1 / (-127/m). One work-item per 256; n_blocks = rows * K / 256.
kernel void quantize_q8_k(global const float* x, global char* qa, global float* da, global int* sa, int n_blocks) {
  const int blk = get_global_id(0);
  if (blk >= n_blocks) return;
  global const float* v = x + 256 * (size_t)blk;
  global char* q = qa + 256 * (size_t)blk;
  float amax = 0.0f, mx = 0.0f;
  for (int i = 0; i < 256; ++i) {
    const float a = fabs(v[i]);
    if (a > amax) {
      amax = a;
      mx = v[i];
    }
  }
  const float iscale = amax != 0.0f ? -127.0f / mx : 0.0f;
  const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
  for (int s = 0; s < 16; ++s) {
    int sum = 0;
    for (int i = 16 * s; i < 16 * s + 16; ++i) {
      const int qi = min(127, (int)rint(iscale * v[i]));
      q[i] = (char)qi;
      sum += qi;
    }
    sa[16 * (size_t)blk + s] = sum;
  }
  for (int g = 0; g < 8; ++g) da[8 * (size_t)blk + g] = d;
}

// ---- decode: matrix-vector, LANES work-items per output feature ----

inline float silu_mul(float g, float u) { return g / (1.0f + exp(-g)) * u; }

// Sums acc over the LANES work-items of a feature into lane 0. MV_LOCALS declares the scratch it needs (local
// memory must be declared at kernel scope).
#if LANES == 1
#define MV_LOCALS
#define LANE_SUMS(acc, n)
#elif defined(SUBGROUP16)
#define MV_LOCALS
#define LANE_SUMS(acc, n) \
  for (int r_ = 0; r_ < (n); ++r_) acc[r_] = sub_group_reduce_add(acc[r_]);
#else
#define MV_LOCALS local float red_[MV_NR * 2 * MV_ROWS * LANES];
#define LANE_SUMS(acc, n)                                                                  \
  {                                                                                        \
    local float* mine_ = red_ + get_local_id(1) * 2 * MV_ROWS * LANES;                     \
    for (int r_ = 0; r_ < (n); ++r_) mine_[r_ * LANES + lane] = acc[r_];                   \
    barrier(CLK_LOCAL_MEM_FENCE);                                                          \
    if (lane == 0)                                                                         \
      for (int r_ = 0; r_ < (n); ++r_) {                                                   \
        float s_ = 0.0f;                                                                   \
        for (int l_ = 0; l_ < LANES; ++l_) s_ += mine_[r_ * LANES + l_];                   \
        acc[r_] = s_;                                                                      \
      }                                                                                    \
  }
#endif

// h[row][f] = silu(gate_f . x_row) * (up_f . x_row) for the rows of chunk group_id(2), f < N (= n_ff).
// gate/up of expert slot s start at w + w_off + s * stride; K = n_embd.
MV_ATTRS kernel void mv_gate_up(global const uchar* wg, global const uchar* wu, ulong off_g, ulong off_u,
                                ulong stride_g, ulong stride_u, int K, int N, global const int4* chunks,
                                global const char* qa, global const float* da, global const int* sa,
                                global float* h) {
  MV_LOCALS
  const int lane = get_local_id(0);
  const int f = get_group_id(0) * MV_NR + get_local_id(1);
  const int4 ch = chunks[get_group_id(2)];
  const size_t rb = ROW_BYTES(K), fr = min(f, N - 1);  // features past N compute row N-1, write nothing
  global const uchar* rg = wg + off_g + ch.x * stride_g + fr * rb;
  global const uchar* ru = wu + off_u + ch.x * stride_u + fr * rb;
  const int ng = K / 32;
  float acc[2 * MV_ROWS];
  for (int r = 0; r < 2 * MV_ROWS; ++r) acc[r] = 0.0f;
  for (int g = lane; g < ng; g += LANES) {
    // Gate, then up: one weight group in registers at a time (the rows' activations read twice, from cache).
    // Both at once spilled on Intel GPUs at SIMD16 (IGC's estimate, DG2: 7-29 by type; Xe-LP: 9), none so.
    for (int m = 0; m < 2; ++m) {
      const Group a = load_group(m ? ru : rg, g);
      for (int r = 0; r < MV_ROWS; ++r) {
        if (r < ch.z) {
          const size_t row = ch.y + r;
          global const char* q = qa + row * K + 32 * g;
          const int s = sa[row * 2 * ng + 2 * g] + sa[row * 2 * ng + 2 * g + 1];
          acc[m * MV_ROWS + r] += group_dot(a, vload16(0, q), vload16(1, q), da[row * ng + g], s);
        }
      }
    }
  }
  LANE_SUMS(acc, 2 * MV_ROWS)
  if (lane == 0 && f < N)
    for (int r = 0; r < ch.z; ++r) h[(size_t)(ch.y + r) * N + f] = silu_mul(acc[r], acc[MV_ROWS + r]);
}

// y[row][f] = down_f . h_row, f < N (= n_embd); K = n_ff.
MV_ATTRS kernel void mv_down(global const uchar* w, ulong off, ulong stride, int K, int N, global const int4* chunks,
                             global const char* qa, global const float* da, global const int* sa, global float* y) {
  MV_LOCALS
  const int lane = get_local_id(0);
  const int f = get_group_id(0) * MV_NR + get_local_id(1);
  const int4 ch = chunks[get_group_id(2)];
  const size_t rb = ROW_BYTES(K), fr = min(f, N - 1);
  global const uchar* rw = w + off + ch.x * stride + fr * rb;
  const int ng = K / 32;
  float acc[MV_ROWS];
  for (int r = 0; r < MV_ROWS; ++r) acc[r] = 0.0f;
  for (int g = lane; g < ng; g += LANES) {
    const Group a = load_group(rw, g);
    for (int r = 0; r < MV_ROWS; ++r) {
      if (r < ch.z) {
        const size_t row = ch.y + r;
        global const char* q = qa + row * K + 32 * g;
        const int s = sa[row * 2 * ng + 2 * g] + sa[row * 2 * ng + 2 * g + 1];
        acc[r] += group_dot(a, vload16(0, q), vload16(1, q), da[row * ng + g], s);
      }
    }
  }
  LANE_SUMS(acc, MV_ROWS)
  if (lane == 0 && f < N)
    for (int r = 0; r < ch.z; ++r) y[(size_t)(ch.y + r) * N + f] = acc[r];
}

// ---- prefill: tiled W4A8, one output feature per work-item, TM rows per work-group ----

// Copies KT groups (from group g0, kt of them) of the chunk's rows into local memory.
inline void stage_rows(int4 ch, int K, int g0, int kt, global const char* qa, global const float* da,
                       global const int* sa, local char* lq, local float* ld, local int* ls) {
  const int t = get_local_id(0), ng = K / 32;
  for (int i = t; i < ch.z * kt * 2; i += TN) {
    const int r = i / (kt * 2), p = i % (kt * 2);
    vstore16(vload16(0, qa + (size_t)(ch.y + r) * K + 32 * g0 + 16 * p), 0, lq + r * KT * 32 + 16 * p);
  }
  for (int i = t; i < ch.z * kt; i += TN) {
    const int r = i / kt, k = i % kt;
    const size_t row = ch.y + r;
    ld[r * KT + k] = da[row * ng + g0 + k];
    ls[r * KT + k] = sa[row * 2 * ng + 2 * (g0 + k)] + sa[row * 2 * ng + 2 * (g0 + k) + 1];
  }
}

__attribute__((reqd_work_group_size(TN, 1, 1)))
kernel void mm_gate_up(global const uchar* wg, global const uchar* wu, ulong off_g, ulong off_u, ulong stride_g,
                       ulong stride_u, int K, int N, global const int4* chunks, global const char* qa,
                       global const float* da, global const int* sa, global float* h) {
  local char lq[TM * KT * 32];
  local float ld[TM * KT];
  local int ls[TM * KT];
  const int f = get_group_id(0) * TN + get_local_id(0);
  const int4 ch = chunks[get_group_id(1)];
  const size_t rb = ROW_BYTES(K), fr = min(f, N - 1);
  global const uchar* rg = wg + off_g + ch.x * stride_g + fr * rb;
  global const uchar* ru = wu + off_u + ch.x * stride_u + fr * rb;
  const int ng = K / 32;
  float ag[TM], au[TM];
  for (int r = 0; r < TM; ++r) ag[r] = au[r] = 0.0f;
  for (int g0 = 0; g0 < ng; g0 += KT) {
    const int kt = min(KT, ng - g0);
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous step has read the stage
    stage_rows(ch, K, g0, kt, qa, da, sa, lq, ld, ls);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < kt; ++k) {
      const Group a = load_group(rg, g0 + k), b = load_group(ru, g0 + k);
      for (int r = 0; r < TM; ++r) {
        if (r < ch.z) {
          local const char* q = lq + r * KT * 32 + 32 * k;
          const char16 x0 = vload16(0, q), x1 = vload16(1, q);
          const float d = ld[r * KT + k];
          const int s = ls[r * KT + k];
          ag[r] += group_dot(a, x0, x1, d, s);
          au[r] += group_dot(b, x0, x1, d, s);
        }
      }
    }
  }
  if (f < N)
    for (int r = 0; r < ch.z; ++r) h[(size_t)(ch.y + r) * N + f] = silu_mul(ag[r], au[r]);
}

__attribute__((reqd_work_group_size(TN, 1, 1)))
kernel void mm_down(global const uchar* w, ulong off, ulong stride, int K, int N, global const int4* chunks,
                    global const char* qa, global const float* da, global const int* sa, global float* y) {
  local char lq[TM * KT * 32];
  local float ld[TM * KT];
  local int ls[TM * KT];
  const int f = get_group_id(0) * TN + get_local_id(0);
  const int4 ch = chunks[get_group_id(1)];
  const size_t rb = ROW_BYTES(K), fr = min(f, N - 1);
  global const uchar* rw = w + off + ch.x * stride + fr * rb;
  const int ng = K / 32;
  float acc[TM];
  for (int r = 0; r < TM; ++r) acc[r] = 0.0f;
  for (int g0 = 0; g0 < ng; g0 += KT) {
    const int kt = min(KT, ng - g0);
    barrier(CLK_LOCAL_MEM_FENCE);
    stage_rows(ch, K, g0, kt, qa, da, sa, lq, ld, ls);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < kt; ++k) {
      const Group a = load_group(rw, g0 + k);
      for (int r = 0; r < TM; ++r) {
        if (r < ch.z) {
          local const char* q = lq + r * KT * 32 + 32 * k;
          acc[r] += group_dot(a, vload16(0, q), vload16(1, q), ld[r * KT + k], ls[r * KT + k]);
        }
      }
    }
  }
  if (f < N)
    for (int r = 0; r < ch.z; ++r) y[(size_t)(ch.y + r) * N + f] = acc[r];
}
)CLC";

}  // namespace xpert::opencl
