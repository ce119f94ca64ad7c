// Attention over the KV cache on a CUDA device, with cpu::attention's meaning (backend/op_types.h):
// cache rows [n_ctx][n_head_kv][head_dim] of f16 or GGUF Q8_0 / Q4_0 blocks (k_type / v_type, each on its
// own; the block types need head_dim a multiple of 32), positions index rows, a query at position p sees keys
// lo..min(p, n_kv-1) (lo = p - sliding_window + 1 with a window), GQA (query head h reads kv head
// h / (n_head / n_head_kv)), scores q.k * kq_scale. Every pointer is device memory, pos included, and
// every call is asynchronous on `stream`.
//
// Kernels (head_dim 64, 128, 256; any other head_dim takes a plain warp-per-row kernel):
//   prefill - flash attention: 64 queries x one head per block, K/V tiles through shared memory
//             (cp.async, two stages), online softmax, f16 tensor cores (mma.sync m16n8k16).
//   decode  - flash decoding: one query per sequence, the keys split over many warps (each streams
//             its share through a private cp.async ring and keeps all query heads of one kv head, the
//             scores computed transposed so 8 heads fill an n8 tile), then a combine kernel. The grid
//             depends only on the shapes and `max_kv`, never on positions, so a decode step can be
//             captured in a CUDA graph and replayed at any depth.
// Precision as the CPU: q is rounded to f16, products accumulate in f32, the softmax weights meet V as
// f16 (unnormalized here, normalized on the CPU: results agree to a few f16 ulps of the output). A
// quantized value becomes f16 (q * d rounded once, where the CPU keeps it in f32: one more f16 rounding
// per cache value; attention_kv.cuh): prefill first dequantizes the rows into the workspace and runs the
// f16 kernel, decode dequantizes each K/V step inside the kernel (its work per key is not repeated).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/op_types.h"

namespace xpert::cuda {

// Workspace `attention` needs (bytes): decode's split partials; for prefill over a q8_0 / q4_0 cache the
// f16 copy of rows 0..n_kv-1 of each quantized side (n_kv x n_head_kv x head_dim x 2 bytes each), which
// the flash kernel reads; 0 for f16 prefill. Give at least this much, 256-byte aligned.
size_t attention_workspace_bytes(const AttentionArgs& a);
// One sequence, any number of tokens (n_tokens == 1 takes the decode kernel).
void attention(const AttentionArgs& a, void* workspace, cudaStream_t stream);

// One decode step of several sequences: one query row each, each in its own cache slot.
struct DecodeAttentionArgs {
  const float* q;        // [n_seq][n_head][head_dim]
  const void* k;         // slot 0's K rows; slot s starts at k + s * slot_stride bytes
  const void* v;         // slot 0's V rows; slot s starts at v + s * slot_stride bytes
  int64_t slot_stride;   // bytes from one slot to the next (0 with one sequence)
  const int32_t* slots;  // [n_seq] the slot of each sequence; null: sequence i uses slot i
  const int32_t* pos;    // [n_seq] query positions: keys 0..pos are visible (window permitting)
  float* out;            // [n_seq][n_head][head_dim]
  int64_t n_seq, n_head, n_head_kv, head_dim;
  int64_t max_kv;  // keys are clamped below it, and it sizes the split grid: n_ctx will do
  float kq_scale = 1.0f;
  int32_t sliding_window = 0;
  int32_t min_keys_per_split = 64;  // a warp streams at least this many keys before another joins
  DType k_type = DType::F16, v_type = DType::F16;
  // Optional: out also as q8_1 activations (matmul.h) of n_seq rows of n_head * head_dim, for the output
  // projection: int8 [n_seq][n_head * head_dim], float2 [n_seq][n_head * head_dim / 32].
  int8_t* out_q = nullptr;
  float2* out_ds = nullptr;
  // Optional (Qwen3.5's gated attention): out (and out_q) multiplied by sigmoid(gate) as written, gate's
  // (sequence, head) rows gate_stride floats apart (0: head_dim); the same bits as mul_sigmoid on the
  // ungated out. Read before the combine's PDL wait: no kernel right before it (the attention's own) may
  // write the gate.
  const float* gate = nullptr;
  int64_t gate_stride = 0;
  int64_t q_stride = 0;  // floats between q's (sequence, head) rows (0: head_dim)
  // One block per (sequence, KV head): its warps split the keys among themselves (min_keys_per_split
  // aside) and combine them in shared memory, writing out (and out_q, the gate) with no combine launch and
  // no workspace. Right at any depth; fast where every sequence sees at most a few hundred keys (the
  // caller knows its positions). Not the split path's bits: another summation order.
  bool one_block = false;
  // Optional: q is as projected, and this step's k and v rows are not yet normalized, rotated or stored.
  // attention_decode does first what qk_norm_rope_store_f16 would (the same bits): inside the attention's
  // blocks, with no launch of its own, where it can (one_block, f16 K and V, head_dim 128 or 256), else
  // as that launch. q's contents afterwards are unspecified.
  struct QkPrep {
    const float* k;       // [n_seq][n_head_kv][head_dim]
    const float* v;       // the same
    const float* q_norm;  // per-head norm weights (head_dim), null: none
    const float* k_norm;
    int64_t n_rot;
    float freq_base, freq_scale, eps;
    RopeMode mode;
  };
  const QkPrep* prep = nullptr;
  // Optional (attention_decode_proj_fits): the output projection too, split by groups of 4 query heads. For
  // one sequence and group g (attention_decode_proj_parts of them), parts[g][n_out] = W[:, g's columns] .
  // out[g's columns]: sum_parts gives W . out (matmul's product, its sums in another order). out is not
  // written (nor out_q). Each block copies its slice of W into shared memory before the PDL wait, then
  // computes its group's attention itself (a group's blocks all the same one, keys from L2), so the output
  // never leaves the block.
  struct Proj {
    const void* w;  // [n_out][n_head * head_dim], Q4_K blocks (row_bytes apart)
    DType type = DType::Q4_K;
    int64_t n_out = 0;
    float* parts = nullptr;  // [attention_decode_proj_parts][n_out]
  };
  const Proj* proj = nullptr;
};
// Whether attention_decode takes a.proj (a.proj set): one sequence, one_block, the fused prep, f16 K and V,
// head_dim 128, 4 or 8 query heads a KV head, no gate, Q4_K weights, n_out a multiple of 128.
bool attention_decode_proj_fits(const DecodeAttentionArgs& a);
int64_t attention_decode_proj_parts(int64_t n_head);  // rows of Proj::parts: n_head / 4
// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... over n_parts rows of n floats (the order in
// which cuda::RouterNorm adds them too).
void sum_parts(const float* parts, int n_parts, int64_t n, float* out, cudaStream_t stream);
size_t attention_decode_workspace_bytes(const DecodeAttentionArgs& a);
void attention_decode(const DecodeAttentionArgs& a, void* workspace, cudaStream_t stream);

// The plain kernel (one warp per query row and head), for any head_dim up to 512: the fallback, and a
// second opinion in tests.
void attention_simple(const AttentionArgs& a, cudaStream_t stream);

// KV rows into the cache in its type: token t's `row` f32 values go to cache row r = pos[t] (pos null:
// r = t) of slot slots[t] (null: slot 0), at cache + slot * slot_stride + r * row_bytes(type, row) bytes.
// F16 rounds to nearest even; Q8_0 / Q4_0 are bit for bit quant's reference quantizers (quantize_row).
// Positions and slots on the device, so a decode step can be captured once and replayed.
void store_kv(const float* x, int64_t n_tokens, int64_t row, DType type, void* cache, int64_t slot_stride,
              const int32_t* slots, const int32_t* pos, cudaStream_t stream);

}  // namespace xpert::cuda
