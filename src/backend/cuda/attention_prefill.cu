// Flash attention for prefill (several query tokens of one sequence) over the KV cache, and the plain
// warp-per-row kernel used as the fallback. See attention.h.
//
// Prefill: a block of 4 warps takes 64 query tokens of one head (16 rows per warp). K and V tiles of BN
// keys of that head's kv head go through shared memory with cp.async, two stages deep, while the warps
// compute S = Q K^T and O += P V on tensor cores (mma.sync m16n8k16, f16 in, f32 accumulate), with the
// softmax running online per row (the FlashAttention-2 register layout: S's accumulators are P's A
// fragments). Key tiles outside the block's visible range (causal, window, n_kv) are skipped; masks
// inside a tile are per element, so any positions array works.
//
// A q8_0 / q4_0 cache is first dequantized, rows 0..n_kv-1, into an f16 copy in the workspace, which the
// same kernel then reads (as llama.cpp does): every (query block, head) streams every K/V tile, so
// dequantizing inside the kernel would convert each tile n_tokens/64 x group times; one pass converts it
// once (a few microseconds per 10^5 rows). Measured in-kernel first: pp2048 at depth 32K ran at 0.34x
// of f16 on an H200.
#include <algorithm>
#include <climits>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_kv.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/ops_internal.h"

namespace xpert::cuda {
namespace {

using namespace detail;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBlockRows = 64;

struct PrefillParams {
  const float* q;
  const __half* k;
  const __half* v;
  float* out;
  const int32_t* pos;
  int64_t row_stride;  // n_head_kv * D
  int n_tokens, n_head, group, n_kv, window;
  float scale_log2;
};

template <int D, int BN>
constexpr size_t prefill_smem_bytes() {
  return (size_t)kBlockRows * D * 2 + (size_t)2 * 2 * BN * D * 2;
}

template <int D, int BN>
__global__ void __launch_bounds__(128) prefill_kernel(PrefillParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int block_pmin, block_pmax;
  constexpr int kChunks = D / 8;
  constexpr bool kQInRegs = D <= 128;
  constexpr int kTileBytes = BN * D * 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int t0 = blockIdx.x * kBlockRows, h = blockIdx.y, hk = h / p.group;
  const uint32_t qs = smem_addr(smem_raw);
  const uint32_t kv0 = qs + kBlockRows * D * 2;  // stage s: K at kv0 + 2 s tile, V right after

  const int r0 = warp * 16 + gid;
  const int pos0 = t0 + r0 < p.n_tokens ? p.pos[t0 + r0] : -1;
  const int pos1 = t0 + r0 + 8 < p.n_tokens ? p.pos[t0 + r0 + 8] : -1;
  if (threadIdx.x == 0) {
    block_pmin = INT_MAX;
    block_pmax = -1;
  }
  __syncthreads();
  if (threadIdx.x < kBlockRows && t0 + (int)threadIdx.x < p.n_tokens) {
    const int ps = p.pos[t0 + threadIdx.x];
    atomicMin(&block_pmin, ps);
    atomicMax(&block_pmax, ps);
  }
  // Q rows -> f16 (rounded as the CPU rounds q), swizzled; rows past n_tokens are zero.
  for (int i = threadIdx.x; i < kBlockRows * kChunks; i += blockDim.x) {
    const int row = i / kChunks, ch = i % kChunks, t = t0 + row;
    float4 x0 = make_float4(0, 0, 0, 0), x1 = x0;
    if (t < p.n_tokens) {
      const float4* src = reinterpret_cast<const float4*>(p.q + ((int64_t)t * p.n_head + h) * D + ch * 8);
      x0 = src[0];
      x1 = src[1];
    }
    const uint4 packed = make_uint4(pack_half2(x0.x, x0.y), pack_half2(x0.z, x0.w), pack_half2(x1.x, x1.y),
                                    pack_half2(x1.z, x1.w));
    *reinterpret_cast<uint4*>(smem_raw + swizzle<D>(row, ch) * 16) = packed;
  }
  __syncthreads();
  const int lo = p.window > 0 ? max(0, block_pmin - p.window + 1) : 0;
  const int hi = min(block_pmax, p.n_kv - 1);
  const int tile_begin = lo / BN, tile_end = hi >= lo ? hi / BN + 1 : tile_begin;

  const __half* kg = p.k + (int64_t)hk * D;
  const __half* vg = p.v + (int64_t)hk * D;
  auto load_tile = [&](int tile, int stage) {
    const uint32_t ks = kv0 + stage * 2 * kTileBytes, vs = ks + kTileBytes;
#pragma unroll
    for (int it = 0; it < BN * kChunks / 128; ++it) {
      const int i = threadIdx.x + 128 * it;
      const int row = i / kChunks, ch = i % kChunks, key = tile * BN + row;
      const bool valid = key < p.n_kv;
      const int64_t off = (int64_t)(valid ? key : 0) * p.row_stride + ch * 8;
      const uint32_t so = swizzle<D>(row, ch) * 16;
      cp_async16(ks + so, kg + off, valid);
      cp_async16(vs + so, vg + off, valid);
    }
  };

  uint32_t qa[kQInRegs ? D / 16 : 1][4];
  (void)qa;
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldmatrix_x4(qa[kk],
                  qs + swizzle<D>(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16) * 16);
  }

  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows gid, gid+8

  if (tile_begin < tile_end) load_tile(tile_begin, 0);
  cp_async_commit();
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = (tile - tile_begin) & 1;
    if (tile + 1 < tile_end) load_tile(tile + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t ks = kv0 + stage * 2 * kTileBytes, vs = ks + kTileBytes;

    float s[BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      if constexpr (kQInRegs) {
        a[0] = qa[kk][0], a[1] = qa[kk][1], a[2] = qa[kk][2], a[3] = qa[kk][3];
      } else {
        ldmatrix_x4(a,
                    qs + swizzle<D>(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16) * 16);
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, ks + swizzle<D>(16 * np + (lane % 8) + 8 * (lane / 16), 2 * kk + (lane / 8) % 2) * 16);
        mma_f16(s[2 * np], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma_f16(s[2 * np + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }

    // Scale and mask; the online softmax per row (a row's 4 lanes share gid).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile * BN + nt * 8 + 2 * tig + (e & 1);
        const int pr = e < 2 ? pos0 : pos1;
        const bool visible = key <= pr && key < p.n_kv && (p.window <= 0 || pr - key < p.window);
        s[nt][e] = visible ? s[nt][e] * p.scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
      const float mn = fmaxf(m[j], mx[j]);
      base[j] = mn == -INFINITY ? 0.0f : mn;
      alpha[j] = exp2f(m[j] - base[j]);
      m[j] = mn;
      l[j] *= alpha[j];
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - base[e / 2]);
        l[e / 2] += s[nt][e];
      }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }

    // O += P V: P's A fragments are S's accumulators of two adjacent key tiles.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a0 = pack_half2(s[2 * kk][0], s[2 * kk][1]), a1 = pack_half2(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, vs + swizzle<D>(16 * kk + (lane % 8) + 8 * ((lane / 8) % 2), 2 * dp + lane / 16) * 16);
        mma_f16(o[2 * dp], a0, a1, a2, a3, b[0], b[1]);
        mma_f16(o[2 * dp + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
    __syncthreads();  // the stage is refilled in the next iteration
  }

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t = t0 + r0 + 8 * j;
    if (t >= p.n_tokens) continue;
    const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
    float* dst = p.out + ((int64_t)t * p.n_head + h) * D + 2 * tig;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * j] * inv, o[nt][2 * j + 1] * inv);
  }
}

template <int D, int BN>
void launch_prefill(const AttentionArgs& a, cudaStream_t stream) {
  PrefillParams p{};
  p.q = a.q;
  p.k = reinterpret_cast<const __half*>(a.k);
  p.v = reinterpret_cast<const __half*>(a.v);
  p.out = a.out;
  p.pos = a.pos;
  p.row_stride = a.n_head_kv * D;
  p.n_tokens = (int)a.n_tokens;
  p.n_head = (int)a.n_head;
  p.group = (int)(a.n_head / a.n_head_kv);
  p.n_kv = (int)a.n_kv;
  p.window = a.sliding_window;
  p.scale_log2 = a.kq_scale * kLog2e;
  constexpr size_t smem = prefill_smem_bytes<D, BN>();
  set_smem_limit((const void*)prefill_kernel<D, BN>, smem);
  const dim3 grid((unsigned)((a.n_tokens + kBlockRows - 1) / kBlockRows), (unsigned)a.n_head);
  prefill_kernel<D, BN><<<grid, 128, smem, stream>>>(p);
  XPERT_CUDA_CHECK_LAUNCH();
}

// Rows [0, n_rows) of a q8_0 / q4_0 cache (row values each) -> f16 rows: one thread per 8 values.
template <int T>
__global__ void dequantize_rows_kernel(const char* src, int64_t n_rows, int64_t row, uint4* dst) {
  const int64_t chunks = row / 8;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * chunks;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / chunks, c = i % chunks;
    dst[i] = kv_load8<T>(src + r * kv_bytes<T>(row), (int)c);
  }
}

void dequantize_rows(DType t, const void* src, int64_t n_rows, int64_t row, void* dst, cudaStream_t stream) {
  const int64_t n = n_rows * row / 8;
  if (n <= 0) return;
  const char* s = static_cast<const char*>(src);
  if (t == DType::Q8_0)
    dequantize_rows_kernel<kKvQ8><<<grid_for(n, 256), 256, 0, stream>>>(s, n_rows, row, static_cast<uint4*>(dst));
  else
    dequantize_rows_kernel<kKvQ4><<<grid_for(n, 256), 256, 0, stream>>>(s, n_rows, row, static_cast<uint4*>(dst));
  XPERT_CUDA_CHECK_LAUNCH();
}

// One warp per (token, head): keys one by one, the dot product across the lanes, online softmax.
constexpr int kSimpleMaxDim = 512;

__global__ void __launch_bounds__(256) simple_kernel(AttentionArgs a) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.n_tokens * a.n_head) return;
  const int64_t t = row / a.n_head, h = row % a.n_head, hk = h / (a.n_head / a.n_head_kv);
  const int64_t D = a.head_dim, kv_row = a.n_head_kv * D;
  const int p = a.pos[t];
  const int64_t hi = min((int64_t)p, a.n_kv - 1);
  const int64_t lo = a.sliding_window > 0 ? max((int64_t)0, (int64_t)p - a.sliding_window + 1) : 0;
  const int kt = kv_kind(a.k_type), vt = kv_kind(a.v_type);
  const int64_t k_row = kv_bytes_of(kt, kv_row), v_row = kv_bytes_of(vt, kv_row);
  const char* kc = static_cast<const char*>(a.k) + hk * kv_bytes_of(kt, D);
  const char* vc = static_cast<const char*>(a.v) + hk * kv_bytes_of(vt, D);
  constexpr int R = kSimpleMaxDim / 32;
  float q[R], acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t d = lane + 32 * i;
    q[i] = d < D ? __half2float(__float2half_rn(a.q[row * D + d])) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = lo; j <= hi; ++j) {
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) dot += q[i] * kv_value(kc + j * k_row, kt, d);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * a.kq_scale;
    const float mn = fmaxf(m, s);
    const float alpha = expf(m - mn), w = expf(s - mn);
    l = l * alpha + w;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) acc[i] = acc[i] * alpha + w * kv_value(vc + j * v_row, vt, d);
    }
    m = mn;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) a.out[row * D + d] = acc[i] * inv;
  }
}

void check_args(const AttentionArgs& a) {
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    detail::fail_rt("cuda attention: n_head ", a.n_head, " is not a multiple of n_head_kv ", a.n_head_kv);
  if (a.head_dim <= 0 || a.head_dim > kSimpleMaxDim)
    detail::fail_rt("cuda attention: head_dim ", a.head_dim, " out of range (1..", kSimpleMaxDim, ")");
  if (a.n_kv > INT32_MAX || a.n_tokens > INT32_MAX) detail::fail_rt("cuda attention: too many tokens");
  for (DType t : {a.k_type, a.v_type}) {
    if (t != DType::F16 && t != DType::Q8_0 && t != DType::Q4_0)
      detail::fail_rt("cuda attention: KV cache type ", (int)t, " is not supported (f16, q8_0, q4_0)");
    if (t != DType::F16 && a.head_dim % 32 != 0)
      detail::fail_rt("cuda attention: a q8_0 / q4_0 cache needs head_dim a multiple of 32, got ", a.head_dim);
  }
}

// Bytes of the f16 copies of the quantized sides that the flash prefill reads (0 for an f16 cache).
size_t f16_copy_bytes(const AttentionArgs& a, DType t) {
  return t == DType::F16 ? 0 : align_up((size_t)a.n_kv * a.n_head_kv * a.head_dim * 2, 256);
}

bool fast_head_dim(int64_t d) { return d == 64 || d == 128 || d == 256; }

bool prefill_kernel_case(const AttentionArgs& a) {
  return a.n_tokens > 1 && fast_head_dim(a.head_dim) && a.n_kv > 0;
}

DecodeAttentionArgs decode_args(const AttentionArgs& a) {
  return {.q = a.q,
          .k = a.k,
          .v = a.v,
          .slot_stride = 0,
          .slots = nullptr,
          .pos = a.pos,
          .out = a.out,
          .n_seq = 1,
          .n_head = a.n_head,
          .n_head_kv = a.n_head_kv,
          .head_dim = a.head_dim,
          .max_kv = a.n_kv,
          .kq_scale = a.kq_scale,
          .sliding_window = a.sliding_window,
          .min_keys_per_split = 64,
          .k_type = a.k_type,
          .v_type = a.v_type};
}

}  // namespace

size_t attention_workspace_bytes(const AttentionArgs& a) {
  check_args(a);
  if (a.n_tokens == 1 && fast_head_dim(a.head_dim) && a.n_kv > 0)
    return attention_decode_workspace_bytes(decode_args(a));
  if (prefill_kernel_case(a)) return f16_copy_bytes(a, a.k_type) + f16_copy_bytes(a, a.v_type);
  return 0;
}

void attention(const AttentionArgs& a, void* workspace, cudaStream_t stream) {
  check_args(a);
  if (a.n_tokens <= 0) return;
  if (!fast_head_dim(a.head_dim) || a.n_kv <= 0) return attention_simple(a, stream);
  if (a.n_tokens == 1) return attention_decode(decode_args(a), workspace, stream);
  if (a.k_type != DType::F16 || a.v_type != DType::F16) {
    if (!workspace) detail::fail_rt("cuda attention: no workspace for the f16 copy of a quantized cache");
    AttentionArgs f = a;
    char* ws = static_cast<char*>(workspace);
    const int64_t row = a.n_head_kv * a.head_dim;
    if (a.k_type != DType::F16) {
      dequantize_rows(a.k_type, a.k, a.n_kv, row, ws, stream);
      f.k = ws;
      f.k_type = DType::F16;
      ws += f16_copy_bytes(a, a.k_type);
    }
    if (a.v_type != DType::F16) {
      dequantize_rows(a.v_type, a.v, a.n_kv, row, ws, stream);
      f.v = ws;
      f.v_type = DType::F16;
    }
    return attention(f, nullptr, stream);
  }
  switch (a.head_dim) {
    case 64:
      return launch_prefill<64, 64>(a, stream);
    case 128:
      return launch_prefill<128, 64>(a, stream);
    default:
      return launch_prefill<256, 32>(a, stream);
  }
}

void attention_simple(const AttentionArgs& a, cudaStream_t stream) {
  check_args(a);
  if (a.n_tokens <= 0) return;
  const int64_t rows = a.n_tokens * a.n_head;
  simple_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(a);
  XPERT_CUDA_CHECK_LAUNCH();
}

}  // namespace xpert::cuda
