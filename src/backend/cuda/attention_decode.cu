// Flash decoding over the KV cache (f16, q8_0, q4_0): one query row per sequence, the visible keys split over
// many warps, partial (max, sum, unnormalized output) per warp, then a combine kernel. See attention.h.
//
// One warp = one split of one (sequence, kv head, group of up to 8 query heads). It streams its keys
// 16 at a time through a private 3-stage cp.async ring (K and V rows of that kv head) and computes
//   S^T = K Q^T   (m16 = keys, n8 = query heads, k = head_dim)   A = K from shared memory (ldmatrix),
//                                                                 B = q, held in registers all along
//   O^T += V^T P^T (m16 = head dims, n8 = heads, k16 = keys)      A = V (ldmatrix.trans), B = P^T from
//                                                                 S^T's accumulators via movmatrix
// so the 8 query heads of Qwen3's and Qwen3.5's GQA groups fill the n8 side exactly and nothing is padded.
// The grid is one wave of resident warps; the number of active splits is computed on the device from
// the position, so a fixed grid serves every depth; surplus warps exit at once. With one_block (few keys,
// known on the host) a unit's keys are split among the warps of one block, which combines them itself:
// no combine launch.
//
// A quantized side (q8_0 / q4_0) goes through the ring as raw bytes (each key's head slice, whole blocks,
// copied by 4-byte cp.async: blocks sit at 2-byte alignment, slices at 4), and at its step the warp
// dequantizes the stage into one f16 tile of the same swizzled layout, which the tensor-core code reads
//
// This file plans and issues the launches; the kernels are in attention_decode_kernels.cuh.
#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "backend/cuda/attention_decode_kernels.cuh"

namespace xpert::cuda {
namespace {

template <int D, int KT>
const void* decode_kernel_ptr_v(int vt) {
  return vt == kKvQ8   ? (const void*)decode_kernel<D, KT, kKvQ8>
         : vt == kKvQ4 ? (const void*)decode_kernel<D, KT, kKvQ4>
                       : (const void*)decode_kernel<D, KT, kKvF16>;
}
template <int D>
const void* decode_kernel_ptr_k(int kt, int vt) {
  return kt == kKvQ8   ? decode_kernel_ptr_v<D, kKvQ8>(vt)
         : kt == kKvQ4 ? decode_kernel_ptr_v<D, kKvQ4>(vt)
                       : decode_kernel_ptr_v<D, kKvF16>(vt);
}
// warp_smem_bytes for these run-time kinds.
template <int D>
size_t warp_bytes_d(int kt, int vt) {
  auto with_v = [&](auto k) -> size_t {
    constexpr int K = decltype(k)::value;
    return vt == kKvQ8   ? warp_smem_bytes<D, K, kKvQ8>()
           : vt == kKvQ4 ? warp_smem_bytes<D, K, kKvQ4>()
                         : warp_smem_bytes<D, K, kKvF16>();
  };
  return kt == kKvQ8   ? with_v(std::integral_constant<int, kKvQ8>{})
         : kt == kKvQ4 ? with_v(std::integral_constant<int, kKvQ4>{})
                       : with_v(std::integral_constant<int, kKvF16>{});
}
size_t warp_bytes(int64_t D, int kt, int vt) {
  return D == 64 ? warp_bytes_d<64>(kt, vt) : D == 128 ? warp_bytes_d<128>(kt, vt) : warp_bytes_d<256>(kt, vt);
}

// The kernel for this head_dim and these cache kinds (kv_kind).
const void* decode_kernel_ptr(int64_t D, int kt, int vt) {
  return D == 64    ? decode_kernel_ptr_k<64>(kt, vt)
         : D == 128 ? decode_kernel_ptr_k<128>(kt, vt)
                    : decode_kernel_ptr_k<256>(kt, vt);
}

// The fused prep's rows after the warps' rings: up to 2 q heads, k and v.
size_t prep_smem_bytes(int64_t D) { return 4 * (size_t)D * sizeof(float); }

// Warps per block (as many as shared memory allows, up to 4) and resident blocks per SM, per head_dim.
struct DecodeConfig {
  int warps = 0, blocks_per_sm = 0;
  size_t smem_bytes = 0;
};
DecodeConfig decode_config(int64_t D, int kt, int vt) {
  static std::mutex mu;
  static std::map<std::pair<int, int64_t>, DecodeConfig> cache;
  int dev = 0;
  XPERT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  DecodeConfig& c = cache[{dev, D * 16 + kt * 4 + vt}];
  const void* kernel = decode_kernel_ptr(D, kt, vt);
  if (c.warps) return c;
  const size_t per_warp = warp_bytes(D, kt, vt);
  c.warps = (int)std::clamp<size_t>((size_t)max_smem_optin() / per_warp, 1, 4);
  c.smem_bytes = per_warp * c.warps;
  // The limit leaves room for the fused prep's rows where they fit (plan checks the warps again).
  set_smem_limit(kernel, std::min<size_t>(c.smem_bytes + prep_smem_bytes(D), (size_t)max_smem_optin()));
  XPERT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.blocks_per_sm, kernel, 32 * c.warps,
                                                                 c.smem_bytes));
  if (c.blocks_per_sm < 1)
    detail::fail_rt("cuda attention_decode: the kernel does not fit an SM (head_dim ", D, ")");
  return c;
}

// The proj form's shared memory (head_dim 128, f16): the ring warps' rings, the prep's rows (the unit's q
// heads, k and v), W's slice and the heads' q8_1 output.
size_t proj_block_smem_bytes() {
  return kProjRingWarps * warp_smem_bytes<128, kKvF16, kKvF16>() + (kProjHeads + 2) * 128 * sizeof(float) +
         proj_smem_bytes<128>();
}

DecodePlan plan(const DecodeAttentionArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256)
    detail::fail_rt("cuda attention_decode: head_dim ", a.head_dim, " is not supported (64, 128, 256)");
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    detail::fail_rt("cuda attention_decode: n_head ", a.n_head, " is not a multiple of n_head_kv ",
                    a.n_head_kv);
  if (a.max_kv <= 0 || a.max_kv > INT32_MAX)
    detail::fail_rt("cuda attention_decode: max_kv ", a.max_kv, " out of range");
  for (DType t : {a.k_type, a.v_type})
    if (t != DType::F16 && t != DType::Q8_0 && t != DType::Q4_0)
      detail::fail_rt("cuda attention_decode: KV cache type ", (int)t, " is not supported (f16, q8_0, q4_0)");
  // Quantized slices are copied 4 bytes at a time (f16 rows 16): the bases and the slot stride must allow it.
  const bool quant = a.k_type != DType::F16 || a.v_type != DType::F16;
  if (quant && (((uintptr_t)a.k | (uintptr_t)a.v | (uintptr_t)a.slot_stride) & 3) != 0)
    detail::fail_rt(
        "cuda attention_decode: a quantized cache must be 4-byte aligned (bases and slot stride)");
  DecodePlan pl{};
  if (a.proj) {  // a block of kProjThreads per (row slice, unit of kProjHeads): its ring warps split the keys
    if (!attention_decode_proj_fits(a))
      detail::fail_rt(
          "cuda attention_decode: this output projection is not fused (attention_decode_proj_fits)");
    pl.warps = kProjThreads / 32;
    pl.hc_heads = kProjHeads;
    pl.n_hchunk = (int)(a.n_head / a.n_head_kv / kProjHeads);
    pl.max_splits = kProjRingWarps;
    pl.fuse_prep = true;
    pl.smem_bytes = proj_block_smem_bytes();
    return pl;
  }
  const DecodeConfig cfg = decode_config(a.head_dim, kv_kind(a.k_type), kv_kind(a.v_type));
  const int64_t group = a.n_head / a.n_head_kv;
  // Query heads a block takes: 8 fill the tensor cores' n side; one_block takes fewer (its blocks then
  // read the same keys from L2), so that each of its warps' combine has about one 32-dim piece: a warp's
  // combine is a chain of dependent steps per piece, and the block has only its few warps. At head_dim 128
  // that is one head a block (Qwen3: 32 blocks); two, 16 blocks, measured 1.9 % slower on qwen3-30b-a3b's
  // tg128 (H200, 2026-12-01).
  pl.warps = cfg.warps;
  pl.hc_heads = a.one_block ? (int)std::clamp<int64_t>(pl.warps / (a.head_dim / 32), 1, 8) : 8;
  pl.n_hchunk = (int)((group + pl.hc_heads - 1) / pl.hc_heads);
  const int min_keys = std::max(a.min_keys_per_split, kStepKeys);
  // One wave of resident warps shared by the batch's (sequence, kv head, head chunk) units; never more
  // splits than the keys can feed.
  const int64_t units = std::max<int64_t>(1, a.n_seq * a.n_head_kv * pl.n_hchunk);
  int64_t splits = (int64_t)sm_count() * cfg.blocks_per_sm * cfg.warps / units;
  splits = std::min<int64_t>(splits, (a.max_kv + min_keys - 1) / min_keys);
  pl.max_splits = (int)std::clamp<int64_t>(splits, 1, kMaxSplits);
  pl.smem_bytes = cfg.smem_bytes;
  if (a.one_block) {  // a block per unit, its warps the splits; no partials in global memory
    pl.max_splits = pl.warps;
    // The fused prep takes a warp per q head, one for k, one for v, and rows of shared memory for q and k.
    pl.fuse_prep = a.prep && a.k_type == DType::F16 && a.v_type == DType::F16 &&
                   (a.head_dim == 128 || a.head_dim == 256) && pl.warps >= pl.hc_heads + 2 &&
                   cfg.smem_bytes + prep_smem_bytes(a.head_dim) <= (size_t)max_smem_optin();
    if (pl.fuse_prep) pl.smem_bytes += prep_smem_bytes(a.head_dim);
    return pl;
  }
  const size_t rows = (size_t)a.n_seq * a.n_head * pl.max_splits;
  pl.ml_bytes = align_up(rows * sizeof(float2), 256);
  pl.o_bytes = align_up(rows * a.head_dim * sizeof(float), 256);
  return pl;
}

template <int D, int KT, int VT>
void launch(const DecodeAttentionArgs& a, const DecodePlan& pl, const DecodeParams& p, cudaStream_t stream) {
  const dim3 grid((pl.max_splits + pl.warps - 1) / pl.warps, (unsigned)(a.n_head_kv * pl.n_hchunk),
                  (unsigned)a.n_seq);
  launch_pdl(decode_kernel<D, KT, VT>, grid, 32 * pl.warps, pl.smem_bytes, stream, p);
  XPERT_CUDA_CHECK_LAUNCH();
  if (p.one_block) return;
  launch_pdl(combine_kernel, dim3((unsigned)a.n_head, (unsigned)a.n_seq, D / 32), 32 * kCombineWarps, 0, stream, p,
                                                                                                         D);
  XPERT_CUDA_CHECK_LAUNCH();
}

template <int D, int KT>
void launch_v(const DecodeAttentionArgs& a, const DecodePlan& pl, const DecodeParams& p, cudaStream_t stream) {
  switch (kv_kind(a.v_type)) {
    case kKvQ8: return launch<D, KT, kKvQ8>(a, pl, p, stream);
    case kKvQ4: return launch<D, KT, kKvQ4>(a, pl, p, stream);
    default: return launch<D, KT, kKvF16>(a, pl, p, stream);
  }
}
template <int D>
void launch_k(const DecodeAttentionArgs& a, const DecodePlan& pl, const DecodeParams& p, cudaStream_t stream) {
  switch (kv_kind(a.k_type)) {
    case kKvQ8: return launch_v<D, kKvQ8>(a, pl, p, stream);
    case kKvQ4: return launch_v<D, kKvQ4>(a, pl, p, stream);
    default: return launch_v<D, kKvF16>(a, pl, p, stream);
  }
}

__global__ void sum_parts_kernel(const float* __restrict__ parts, int n_parts, int64_t n,
                                 float* __restrict__ out) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  pdl_begin();
  if (i >= n) return;
  float v = parts[i];
  for (int k = 1; k < n_parts; ++k) v += parts[(int64_t)k * n + i];
  out[i] = v;
}

}  // namespace

bool attention_decode_proj_fits(const DecodeAttentionArgs& a) {
  const DecodeAttentionArgs::Proj* pr = a.proj;
  return pr && a.n_seq == 1 && a.one_block && a.prep && a.k_type == DType::F16 && a.v_type == DType::F16 &&
         a.head_dim == 128 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0 &&
         (a.n_head / a.n_head_kv) % kProjHeads == 0 && a.n_head / a.n_head_kv <= 8 && !a.gate &&
         pr->type == DType::Q4_K && pr->w && pr->parts && ((uintptr_t)pr->w & 15) == 0 && pr->n_out > 0 &&
         pr->n_out % kProjRows == 0 && pr->n_out / kProjRows <= 65535 &&
         proj_block_smem_bytes() <= (size_t)max_smem_optin();
}

int64_t attention_decode_proj_parts(int64_t n_head) { return n_head / kProjHeads; }

void sum_parts(const float* parts, int n_parts, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  XPERT_CU_ASSERT(n_parts >= 1);
  launch_pdl(sum_parts_kernel, dim3((unsigned)((n + 255) / 256)), 256, 0, stream, parts, n_parts, n, out);
  XPERT_CUDA_CHECK_LAUNCH();
}

size_t attention_decode_workspace_bytes(const DecodeAttentionArgs& a) {
  const DecodePlan pl = plan(a);
  return pl.ml_bytes + pl.o_bytes;
}

void attention_decode(const DecodeAttentionArgs& a, void* workspace, cudaStream_t stream) {
  if (a.n_seq <= 0) return;
  const DecodePlan pl = plan(a);
  if (!workspace && !a.one_block) detail::fail_rt("cuda attention_decode: no workspace");
  if (a.prep && (a.k_type != DType::F16 || a.v_type != DType::F16))
    detail::fail_rt("cuda attention_decode: the q/k prep takes an f16 cache");
  if (a.prep && !pl.fuse_prep) {
    const DecodeAttentionArgs::QkPrep& pr = *a.prep;
    qk_norm_rope_store_f16(const_cast<float*>(a.q), pr.k, pr.v, pr.q_norm, pr.k_norm, a.pos, a.n_seq,
                           a.n_head, a.n_head_kv, a.head_dim, pr.n_rot, pr.freq_base, pr.freq_scale, pr.mode,
                           pr.eps, static_cast<uint16_t*>(const_cast<void*>(a.k)),
                           static_cast<uint16_t*>(const_cast<void*>(a.v)), a.slot_stride / 2, a.slots, stream,
                           a.q_stride);
  }
  DecodeParams p{};
  p.q = a.q;
  p.k = static_cast<const char*>(a.k);
  p.v = static_cast<const char*>(a.v);
  p.slot_stride = a.slot_stride;
  p.slots = a.slots;
  p.pos = a.pos;
  p.out = a.out;
  p.gate = a.gate;
  p.gate_stride = a.gate_stride ? a.gate_stride : a.head_dim;
  p.q_stride = a.q_stride ? a.q_stride : a.head_dim;
  p.one_block = a.one_block;
  if (pl.fuse_prep) {
    const DecodeAttentionArgs::QkPrep& pr = *a.prep;
    if (pr.n_rot <= 0 || pr.n_rot > a.head_dim || pr.n_rot % 2 != 0)
      detail::fail_rt("cuda attention_decode: n_rot ", pr.n_rot, " must be even and at most head_dim");
    p.prep_k = pr.k, p.prep_v = pr.v, p.prep_qw = pr.q_norm, p.prep_kw = pr.k_norm;
    p.n_rot = (int)pr.n_rot;
    p.neox = pr.mode == RopeMode::neox;
    // The same float expression as cpu::rope and norm_rope_params, so theta_scale is the same float.
    p.theta_scale = std::pow(pr.freq_base, -2.0f / (float)pr.n_rot);
    p.freq_scale = pr.freq_scale, p.eps = pr.eps;
  }
  p.out_q = a.out_q;
  p.out_ds = a.out_ds;
  if (workspace) {
    p.part_ml = static_cast<float2*>(workspace);
    p.part_o = reinterpret_cast<float*>(static_cast<char*>(workspace) + pl.ml_bytes);
  }
  p.k_row = kv_bytes_of(kv_kind(a.k_type), a.n_head_kv * a.head_dim);
  p.v_row = kv_bytes_of(kv_kind(a.v_type), a.n_head_kv * a.head_dim);
  p.n_head = (int)a.n_head;
  p.group = (int)(a.n_head / a.n_head_kv);
  p.n_hchunk = pl.n_hchunk;
  p.hc_heads = pl.hc_heads;
  p.max_splits = pl.max_splits;
  p.min_keys = a.one_block ? kStepKeys : std::max(a.min_keys_per_split, kStepKeys);
  p.max_kv = (int)a.max_kv;
  p.window = a.sliding_window;
  p.scale_log2 = a.kq_scale * kLog2e;
  p.wide = (((uintptr_t)a.k | (uintptr_t)a.v | (uintptr_t)a.slot_stride) & 15) == 0;
  if (a.proj) {
    p.one_block = true;
    p.proj_w = static_cast<const uint8_t*>(a.proj->w);
    p.proj_row_bytes = (int64_t)row_bytes(DType::Q4_K, a.n_head * a.head_dim);
    p.proj_n_out = (int)a.proj->n_out;
    p.proj_parts = a.proj->parts;
    set_smem_limit((const void*)decode_proj_kernel<128>, pl.smem_bytes);
    launch_pdl(decode_proj_kernel<128>,
               dim3((unsigned)(a.proj->n_out / kProjRows), (unsigned)(a.n_head_kv * pl.n_hchunk), 1),
               kProjThreads, pl.smem_bytes, stream, p);
    XPERT_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (a.head_dim) {
    case 64:
      return launch_k<64>(a, pl, p, stream);
    case 128:
      return launch_k<128>(a, pl, p, stream);
    default:
      return launch_k<256>(a, pl, p, stream);
  }
}

}  // namespace xpert::cuda
