// OpenCL C of the prefill GEMMs (kernels_prefill.h's gemm_t, moe_gate_up_t, moe_down_t: the same arguments
// and results) on Intel's matrix engines (XMX / DPAS), through cl_intel_subgroup_matrix_multiply_accumulate:
// each weight chunk is dequantized (any quantized type; Q4_K / Q6_K by wide loads) to f16 in local memory,
// the activations are converted to f16 beside it, and intel_sub_group_f16_f16_matrix_mad_k16 multiplies
// 8 rows x 16 deep by XT_SG features (XT_SG = 8: DG2 / Arc A-series; 16: Xe-HPC, Xe2), accumulating in f32.
//
// Unverified on hardware: CI compiles it with Intel's offline compiler for dg2 and pvc (test_opencl_xmx.cpp,
// which also asserts that dpas instructions come out) and runs it on PoCL over an emulation of the builtins
// written from the spec's layouts (which checks the tiling and the packing against that reading of the spec,
// not the reading itself); prefill_xmx.cpp uses it only after a self-check at first use, per weight type, has
// matched the f32 kernels on the device (otherwise: a warning, and the f32 kernels).
//
// The program: kClCommonSource + kMatmulSource (dequant32) + kPrefillRawSource (pt_load, pt_deq) +
// kPrefillXmxSource twice (XT_BM 64 / 32, names suffixed XT_SUF _m64 / _m32), built with matmul_program's
// options and -DXT_SG=8|16 (prefill_xmx.cpp xmx_program_text). Work-group: 4 XT_BM work-items (one dimension),
// 128 columns x XT_BM rows of the output, as the f32 tile. Subgroup s covers rows 16 (s / NCS) + 0..15 (two
// 8-row blocks a = 0, 1) and two blocks of XT_SG columns b = 0, 1: XT_SG (s % NCS) + lane + 64 b (so
// moe_gate_up_t's gate and up columns of a feature are in the same work-item), NCS = 64 / XT_SG.
//
// Operand layouts (the extension's "Matrix Multiply Accumulate Functions" per subgroup size), with
// A = activations (M = 8 rows x K = 16), B = weights transposed (K = 16 x N = XT_SG features), C = output:
//   XT_SG 8:  A int8:   component r of lane l holds row r's halves 2l, 2l + 1 (low half first)
//   XT_SG 16: A short8: component r of lane l holds row r's half l
//   both:     B int8:   component i of lane l holds feature l's halves 2i, 2i + 1 (a row of the weights, as
//                       stored: ws[feature][k])
//             C float8: component r of lane l is row r, feature l
// Local memory rows are padded to XT_LD halves (80 bytes) against bank conflicts; every int read stays 4-byte
// aligned.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kPrefillXmxSource = R"CLC(
#if defined(cl_intel_subgroup_matrix_multiply_accumulate)
#ifndef XT_COMMON
#define XT_COMMON 1
#define XT_LD 40
// Empty: test_opencl_xmx.cpp's emulation of the builtins (for a device without them) declares its exchange
// buffer here, at each kernel's scope.
#ifndef XT_EMU_SCRATCH
#define XT_EMU_SCRATCH
#endif
#define XT_NCS (64 / XT_SG)
#if XT_SG == 8
// Row r of the 8 at p (halves, stride XT_LD), this lane's pair of k.
#define XT_A(p, l)                                                                                           \
  (int8)(((local const int*)(p))[(l)], ((local const int*)((p) + XT_LD))[(l)],                               \
         ((local const int*)((p) + 2 * XT_LD))[(l)], ((local const int*)((p) + 3 * XT_LD))[(l)],             \
         ((local const int*)((p) + 4 * XT_LD))[(l)], ((local const int*)((p) + 5 * XT_LD))[(l)],             \
         ((local const int*)((p) + 6 * XT_LD))[(l)], ((local const int*)((p) + 7 * XT_LD))[(l)])
#elif XT_SG == 16
#define XT_A(p, l)                                                                                           \
  (short8)(((local const short*)(p))[(l)], ((local const short*)((p) + XT_LD))[(l)],                         \
           ((local const short*)((p) + 2 * XT_LD))[(l)], ((local const short*)((p) + 3 * XT_LD))[(l)],       \
           ((local const short*)((p) + 4 * XT_LD))[(l)], ((local const short*)((p) + 5 * XT_LD))[(l)],       \
           ((local const short*)((p) + 6 * XT_LD))[(l)], ((local const short*)((p) + 7 * XT_LD))[(l)])
#else
#error "XT_SG must be 8 or 16"
#endif
// Column of block b (0, 1) of subgroup column cs, before the lane.
#define XT_COL(cs, b) ((b) * 64 + XT_SG * (cs))
// Part `part` of chunk j of a row, XT_PART weights: one work-item's share. Q4_K / Q6_K: halves, two
// work-items a row as in the f32 tile (kPrefillRawSource's wide loads); other types: the whole chunk
// (dequant32), as half of it cost them more spills in IGC's dumps (Q8_0 at SIMD16: 2.7-4.9 KiB against
// 0.1-2.6).
#if defined(PT_RAW)
#define XT_PART 16
void xt_deq(global const uchar* row, int j, int k, int part, float* w) {
  const pt_raw r = pt_load(row, j, part, k);
  pt_deq(&r, j, w);
}
#else
#define XT_PART 32
void xt_deq(global const uchar* row, int j, int k, int part, float* w) { dequant32(row, j, k, w); }
#endif
#endif

#define XT_CAT2(a, b) a##b
#define XT_CAT(a, b) XT_CAT2(a, b)
#define XT_NAME(n) XT_CAT(n, XT_SUF)
#define XT_WG (4 * XT_BM)

// The tile's product over k into acc[2][2] (a: row block, b: column block): wa / wb are the weight rows of
// columns 0 and 64 (na / nb valid, the rest read as 0); xr[i] is activation row (lid >> 3) + XT_BM / 2 * i
// of the tile (null: past its end, read as 0), i < 2. Per 32-deep chunk the work-items dequantize the
// weights to f16 (ws[column][k]: XT_PART of a row each, xt_deq), and convert two float4s of activations
// each (xs[row][k]: eight work-items a row's 128 bytes); then each subgroup does 2 x 2 DPAS per 16 of k.
// (2 x 4 blocks a subgroup spilled 4 KiB of registers a work-item on dg2: an f32 a lane is a whole register
// at SIMD8.)
#define XT_TILE_MM(wa, wb, row_bytes, na, nb, k, xr, ws, xs, acc)                                            \
  {                                                                                                         \
    const int lid_ = get_local_id(0), lane_ = get_sub_group_local_id(), sg_ = get_sub_group_id();           \
    const int cs_ = sg_ % XT_NCS, rs_ = sg_ / XT_NCS;                                                       \
    for (int a_ = 0; a_ < 2; ++a_)                                                                          \
      for (int b_ = 0; b_ < 2; ++b_) acc[a_][b_] = (float8)(0.0f);                                          \
    const int chunks_ = ((k) + 31) / 32;                                                                    \
    for (int j_ = 0; j_ < chunks_; ++j_) {                                                                  \
      for (int p_ = lid_; p_ < 128 * (32 / XT_PART); p_ += XT_WG) {                                        \
        const int c_ = p_ / (32 / XT_PART), part_ = p_ % (32 / XT_PART);                                    \
        float w_[XT_PART];                                                                                  \
        const int valid_ = c_ < 64 ? c_ < (na) : c_ - 64 < (nb);                                            \
        if (valid_) {                                                                                       \
          global const uchar* row_ =                                                                        \
              c_ < 64 ? (wa) + (ulong)c_ * (row_bytes) : (wb) + (ulong)(c_ - 64) * (row_bytes);             \
          xt_deq(row_, j_, (k), part_, w_);                                                                 \
        } else {                                                                                            \
          for (int i_ = 0; i_ < XT_PART; ++i_) w_[i_] = 0.0f;                                               \
        }                                                                                                   \
        local half* wd_ = (local half*)((ws) + c_ * XT_LD + XT_PART * part_);                               \
        for (int i_ = 0; i_ < XT_PART / 8; ++i_) vstore_half8(vload8(i_, w_), 0, wd_ + 8 * i_);            \
      }                                                                                                     \
      const int xp_ = lid_ & 7, kg_ = j_ * 32 + 4 * xp_;                                                    \
      for (int it_ = 0; it_ < 2; ++it_) {                                                                   \
        const float4 v_ = ld_x4((xr)[it_], kg_, (k));                                                       \
        vstore_half4(v_, 0, (local half*)((xs) + ((lid_ >> 3) + XT_BM / 2 * it_) * XT_LD + 4 * xp_));      \
      }                                                                                                     \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                         \
      for (int kk_ = 0; kk_ < 32; kk_ += 16) {                                                              \
        int8 bw_[2];                                                                                        \
        for (int b_ = 0; b_ < 2; ++b_)                                                                      \
          bw_[b_] = vload8(0, (local const int*)((ws) + (XT_COL(cs_, b_) + lane_) * XT_LD + kk_));          \
        for (int a_ = 0; a_ < 2; ++a_) {                                                                    \
          local const ushort* xa_ = (xs) + (16 * rs_ + 8 * a_) * XT_LD + kk_;                               \
          const XT_ATYPE av_ = XT_A(xa_, lane_);                                                            \
          for (int b_ = 0; b_ < 2; ++b_)                                                                    \
            acc[a_][b_] = intel_sub_group_f16_f16_matrix_mad_k16(av_, bw_[b_], acc[a_][b_]);                \
        }                                                                                                   \
      }                                                                                                     \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                         \
    }                                                                                                       \
  }
#if XT_SG == 8
#define XT_ATYPE int8
#else
#define XT_ATYPE short8
#endif
// The tile's output loop: row i (of XT_BM) and column c (of 128) of acc element (a, b, r) for this lane.
#define XT_ROW(a, r) (16 * (get_sub_group_id() / XT_NCS) + 8 * (a) + (r))
#define XT_COLUMN(b) (XT_COL(get_sub_group_id() % XT_NCS, (b)) + (int)get_sub_group_local_id())
// This work-item's outputs of acc into y: rows row0 + XT_ROW(a, r) below row_end, features n0 + XT_COLUMN(b)
// below n_out.
void XT_NAME(xt_store)(float8 acc[2][2], global float* y, int ldy, int row0, int row_end, int n0, int n_out) {
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      float o[8];
      vstore8(acc[a][b], 0, o);
      const int n = n0 + XT_COLUMN(b);
      for (int r = 0; r < 8; ++r) {
        const int rr = row0 + XT_ROW(a, r);
        if (rr < row_end && n < n_out) y[(long)rr * ldy + n] = o[r];
      }
    }
}

// Work-group (i, j): features 128 i .., rows XT_BM j ...
__attribute__((intel_reqd_sub_group_size(XT_SG))) __attribute__((reqd_work_group_size(XT_WG, 1, 1)))
kernel void XT_NAME(gemm_t)(global const uchar* w, ulong row_bytes, global const float* x, int ldx, int k,
                            int n_out, global float* y, int ldy, int m) {
  local ushort ws[128 * XT_LD] __attribute__((aligned(16)));
  local ushort xs[XT_BM * XT_LD] __attribute__((aligned(16)));
  XT_EMU_SCRATCH
  const int n0 = get_group_id(0) * 128, m0 = get_group_id(1) * XT_BM, lid = get_local_id(0);
  global const float* xr[2];
  for (int i = 0; i < 2; ++i) {
    const int row = m0 + (lid >> 3) + XT_BM / 2 * i;
    xr[i] = row < m ? x + (long)row * ldx : 0;
  }
  float8 acc[2][2];
  XT_TILE_MM(w + (ulong)n0 * row_bytes, w + (ulong)(n0 + 64) * row_bytes, row_bytes, min(64, n_out - n0),
             min(64, n_out - n0 - 64), k, xr, ws, xs, acc)
  XT_NAME(xt_store)(acc, y, ldy, m0, m, n0, n_out);
}

// Work-group (i, t): gate and up features 64 i .. of tile t (tiles: expert, first grouped row, end; n_tiles[0]
// of them). h: G rows of n_ff.
__attribute__((intel_reqd_sub_group_size(XT_SG))) __attribute__((reqd_work_group_size(XT_WG, 1, 1)))
kernel void XT_NAME(moe_gate_up_t)(global const uchar* gate, global const uchar* up, ulong row_bytes,
                                   ulong expert_stride, global const int* tiles, global const int* n_tiles,
                                   global const int* row_slot, int k_used, global const float* x, int ldx, int k,
                                   int n_ff, global float* h) {
  local ushort ws[128 * XT_LD] __attribute__((aligned(16)));
  local ushort xs[XT_BM * XT_LD] __attribute__((aligned(16)));
  XT_EMU_SCRATCH
  const int t = get_group_id(1);
  if (t >= n_tiles[0]) return;  // the whole group: before any barrier
  const int e = tiles[4 * t], g0 = tiles[4 * t + 1], g1 = tiles[4 * t + 2];
  const int f0 = get_group_id(0) * 64, lid = get_local_id(0);
  global const float* xr[2];
  for (int i = 0; i < 2; ++i) {
    const int g = g0 + (lid >> 3) + XT_BM / 2 * i;
    xr[i] = g < g1 ? x + (long)(row_slot[g] / k_used) * ldx : 0;
  }
  const ulong off = (ulong)e * expert_stride + (ulong)f0 * row_bytes;
  float8 acc[2][2];
  const int nv = min(64, n_ff - f0);
  XT_TILE_MM(gate + off, up + off, row_bytes, nv, nv, k, xr, ws, xs, acc)
  for (int a = 0; a < 2; ++a)
    {  // gate block 0, up block 1: the same features
      float og[8], ou[8];
      vstore8(acc[a][0], 0, og);
      vstore8(acc[a][1], 0, ou);
      const int f = f0 + XT_COLUMN(0);
      for (int r = 0; r < 8; ++r) {
        const int gg = g0 + XT_ROW(a, r);
        if (gg < g1 && f < n_ff) h[(long)gg * n_ff + f] = silu_f(og[r]) * ou[r];
      }
    }
}

// Work-group (i, t): output features 128 i .. of tile t; hq: G rows of k; yg: G rows of n_out.
__attribute__((intel_reqd_sub_group_size(XT_SG))) __attribute__((reqd_work_group_size(XT_WG, 1, 1)))
kernel void XT_NAME(moe_down_t)(global const uchar* down, ulong row_bytes, ulong expert_stride,
                                global const int* tiles, global const int* n_tiles, global const float* hq, int k,
                                int n_out, global float* yg) {
  local ushort ws[128 * XT_LD] __attribute__((aligned(16)));
  local ushort xs[XT_BM * XT_LD] __attribute__((aligned(16)));
  XT_EMU_SCRATCH
  const int t = get_group_id(1);
  if (t >= n_tiles[0]) return;
  const int e = tiles[4 * t], g0 = tiles[4 * t + 1], g1 = tiles[4 * t + 2];
  const int n0 = get_group_id(0) * 128, lid = get_local_id(0);
  global const float* xr[2];
  for (int i = 0; i < 2; ++i) {
    const int g = g0 + (lid >> 3) + XT_BM / 2 * i;
    xr[i] = g < g1 ? hq + (long)g * k : 0;
  }
  global const uchar* we = down + (ulong)e * expert_stride;
  float8 acc[2][2];
  XT_TILE_MM(we + (ulong)n0 * row_bytes, we + (ulong)(n0 + 64) * row_bytes, row_bytes, min(64, n_out - n0),
             min(64, n_out - n0 - 64), k, xr, ws, xs, acc)
  XT_NAME(xt_store)(acc, yg, n_out, g0, g1, n0, n_out);
}
#undef XT_WG
#undef XT_TILE_MM
#undef XT_ATYPE
#undef XT_ROW
#undef XT_COLUMN
#endif
)CLC";

}  // namespace xpert::opencl
