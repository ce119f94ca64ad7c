// CudaBackend (cuda_backend_impl.h): the fused forms of a decode step (DecodeFusions): the attention with
// its k/v store, norms and RoPE, its output gate, and its output projection.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/ops.h"
#include "quant/dtype.h"

namespace xpert::cuda_impl {

// One launch stores k/v (after d.prep's norms and RoPE, for an f16 cache), then the split attention;
// its combine step also writes the q8_1 activations the output projection takes (the returned Act's form).
// Qwen3.5's q and output gate read where the projection leaves them interleaved, the combine applying the
// gate as it writes: no deinterleave or mul_sigmoid launch, no q8_1 conversion of its own for the output
// projection (+2 % tg on qwen3.5, docs/PERF.md).
bool CudaBackend::fuses_attention_gate() const { return true; }

// 1: every sequence sees fewer than kOneBlockMaxKeys keys: a block per KV head splits them among its
// warps and combines them itself, with no combine launch.
int CudaBackend::decode_attention_form(int32_t max_pos) const {
  return max_pos >= 0 && max_pos < kOneBlockMaxKeys ? 1 : 0;
}

std::optional<Act> CudaBackend::decode_attention(const DecodeAttention& d) {
  Act out;
  if (!attend_decode(d, nullptr, nullptr, &out)) return std::nullopt;
  return out;
}

// The attention and its output projection as one launch (cuda::DecodeAttentionArgs::Proj) where it fits:
// proj is then the sum of its head groups' parts, which the router adds itself when the forward hands
// them to add_rmsnorm_moe_ffn_add's fused form, and sum_parts otherwise.
std::optional<PartialSum> CudaBackend::decode_attention_proj(const DecodeAttention& d, const Weight& wo,
                                                             float* proj) {
  // The cheap checks, before the parts' buffer is made; cuda::attention_decode_proj_fits decides.
  if (!d.prep || d.n_seq != 1 || d.gate || wo.type != DType::Q4_K || wo.ne[0] != d.n_head * d.head_dim ||
      decode_attention_form(d.max_pos) != 1)
    return std::nullopt;
  const size_t need = (size_t)(cuda::attention_decode_proj_parts(d.n_head) * wo.ne[1]) * sizeof(float);
  if (parts_buf_.size() < need) {
    if (capturing_) return std::nullopt;
    stale_graphs_ = true;
    synchronize();
    parts_buf_ = DeviceBuffer(*this, need);
  }
  if (!attend_decode(d, &wo, proj, nullptr)) return std::nullopt;
  return PartialSum{.out = proj,
                    .parts = static_cast<const float*>(parts_buf_.data()),
                    .n_parts = (int)cuda::attention_decode_proj_parts(d.n_head),
                    .n = wo.ne[1]};
}

void CudaBackend::sum_parts(const PartialSum& p) { cuda::sum_parts(p.parts, p.n_parts, p.n, p.out, s()); }

// decode_attention (out: d.out as its Act); with wo, the fused projection into proj, or false (nothing
// done) where it does not fit.
bool CudaBackend::attend_decode(const DecodeAttention& d, const Weight* wo, float* proj, Act* out) {
  if (d.head_dim != 64 && d.head_dim != 128 && d.head_dim != 256) {
    no_graphs_ = true;  // the per-sequence kernels bake positions in: no graphs for this model
    return false;
  }
  const int64_t row = d.n_head_kv * d.head_dim;
  auto* q = const_cast<float*>(d.q);  // prep may normalize and rotate q in place (Backend's contract)
  auto* k = const_cast<float*>(d.k);
  const QkPrep* pr = d.prep;
  const bool f16 = d.k_type == DType::F16 && d.v_type == DType::F16;
  // The attention normalizes, rotates and stores q / k / v (DecodeAttentionArgs::prep): inside its blocks
  // where its form can, else by qk_norm_rope_store_f16 first.
  const bool hand_prep = pr && f16;
  if (wo && !hand_prep) return false;
  cuda::DecodeAttentionArgs::QkPrep prep{};
  if (hand_prep) {
    prep = {.k = d.k,
            .v = d.v,
            .q_norm = pr->q_norm,
            .k_norm = pr->k_norm,
            .n_rot = pr->n_rot,
            .freq_base = pr->freq_base,
            .freq_scale = pr->freq_scale,
            .eps = pr->eps,
            .mode = pr->mode};
  } else {
    if (pr)
      cuda::qk_norm_rope(q, k, pr->q_norm, pr->k_norm, pr->q_norm != nullptr, pr->k_norm != nullptr, pr->pos,
                         d.n_seq, d.n_head, d.n_head_kv, d.head_dim, pr->n_rot, pr->freq_base, pr->freq_scale,
                         pr->mode, pr->eps, s(), d.q_stride);
    cuda::store_kv(d.k, d.n_seq, row, d.k_type, d.k_cache, d.slot_stride, d.slots, d.pos, s());
    cuda::store_kv(d.v, d.n_seq, row, d.v_type, d.v_cache, d.slot_stride, d.slots, d.pos, s());
  }
  cuda::DecodeAttentionArgs a{.q = d.q,
                              .k = d.k_cache,
                              .v = d.v_cache,
                              .slot_stride = d.slot_stride,
                              .slots = d.slots,
                              .pos = d.pos,
                              .out = d.out,
                              .n_seq = d.n_seq,
                              .n_head = d.n_head,
                              .n_head_kv = d.n_head_kv,
                              .head_dim = d.head_dim,
                              .max_kv = d.n_ctx,
                              .kq_scale = d.kq_scale,
                              .sliding_window = d.sliding_window,
                              .min_keys_per_split = kDecodeMinKeys,
                              .k_type = d.k_type,
                              .v_type = d.v_type,
                              .gate = d.gate,
                              .gate_stride = d.gate_stride,
                              .q_stride = d.q_stride,
                              .one_block = decode_attention_form(d.max_pos) == 1,
                              .prep = hand_prep ? &prep : nullptr};
  cuda::DecodeAttentionArgs::Proj pj{};
  if (wo) {  // nothing is launched yet: a projection that does not fit declines the whole call
    pj = {
        .w = wo->data, .type = wo->type, .n_out = wo->ne[1], .parts = static_cast<float*>(parts_buf_.data())};
    a.proj = &pj;
    if (!cuda::attention_decode_proj_fits(a)) return false;
    cuda::attention_decode(a, nullptr, s());
    return true;
  }
  const int64_t out_k = d.n_head * d.head_dim;
  const cuda::Activations* out_act = d.out ? prepare_slot(d.n_seq, out_k) : nullptr;
  if (out_act) {
    a.out_q = static_cast<int8_t*>(const_cast<void*>(out_act->data));
    a.out_ds = reinterpret_cast<float2*>(const_cast<float*>(out_act->aux));
  }
  Arena& ar = scratch();
  const size_t mark = ar.mark();
  const size_t ws = cuda::attention_decode_workspace_bytes(a);
  cuda::attention_decode(a, ws ? ar.take_bytes(ws) : nullptr, s());
  ar.release(mark);
  *out = formed(d.out, d.n_seq, out_k, out_act);
  return true;
}

}  // namespace xpert::cuda_impl
