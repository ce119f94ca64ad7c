// The routed experts of a MoE layer on the GPU, with backend/cpu/moe.h's semantics:
//   route:   softmax over the experts -> top k (ties: the lower expert first) -> renormalize -> scale
//   experts: for every (token, slot) whose expert is resident here, silu(x Wg^T) * (x Wu^T) -> Wd, and
//            out[t] = sum over its resident slots, in slot order, of weight * expert output.
// Experts are addressed one by one through device tables of device pointers (expert e = matrix e of the
// layer's 3-D tensor, or anywhere else); a null entry means "not on this GPU": its slots are skipped, so
// the caller can add what another device computes for them (heterogeneous experts).
// Decode (n_tokens <= kMoeDecodePathMaxTokens): one launch computes gate+up+SwiGLU for every (token, slot)
// pair, a second the down products with the weighted sum per token. Prefill: rows grouped by expert on
// the GPU, grouped tensor-core GEMMs (gate and up fused with SwiGLU, then down), then the weighted sum.
// GPTQ-INT4 experts (DType GPTQ4_*, quant/gptq.h) are read as the checkpoint stores them (moe_gptq.h): decode
// in f32 (x is not quantized), prefill as f16 tiles on tensor cores.
// Everything is asynchronous on `stream`, allocation-free and graph-capturable. All pointers: DEVICE.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/matmul.h"
#include "quant/dtype.h"

namespace xpert::cuda {

constexpr int64_t kMoeDecodeMaxTokens = 8;  // the router launch that also routes (moe_router)
// The automatic path's bound for the decode kernels (one CTA row per (token, slot): an expert two tokens
// share is read twice, mostly from L2). Above it the grouped tiles of 64 rows, which at 16-32 tokens x top 8
// of 128 experts hold one or two rows each. H200, qwen3-30b-a3b synth, `xpert bench --parallel 16,32,64
// -p 128 -n 64 --routing uniform` S_TG against the bound of 8: 704 -> 1,128 t/s at 16 streams, 1,130 ->
// 1,453 at 32; at 64 the decode kernels lost (1,785 against 1,984 grouped) (2026-12-04).
// Between the two, decode dots over tiles of up to 8 rows of one expert (each weight chunk read once and
// multiplied with all of the tile's q8_1 rows, M accumulators a lane) lost to the grouped GEMMs at 64 tokens:
// S_TG 1,560 (8 rows a tile) and 1,837 (4) against 1,913, and to the decode kernels at 16-32 (2026-12-04).
// With the grouped GEMM of few rows an expert (matmul_grouped.cu) a bound of 8 lost again at 16 streams
// (1,410 -> 1,113) and tied at 32 (1,541-1,594 against 1,566-1,617), 2026-12-04 14:19.
constexpr int64_t kMoeDecodePathMaxTokens = 32;
// The same bound for GPTQ experts (moe_gptq.h), whose decode kernels read a word of 8 inputs a lane: the
// grouped GEMM tied them at 16 tokens and won at 32 (H200, 2048 x 768 experts, 128 of them, top 8, uniform
// routing, one moe_experts call: 283 / 282 us at 16 tokens, 544 / 343 at 32; 2026-12-04).
constexpr int64_t kMoeGptqDecodePathMaxTokens = 16;

struct MoeRouting {
  int64_t n_expert = 0, k = 0;
  bool norm_weights = true;    // divide the k probabilities by their sum
  float weights_scale = 1.0f;  // then multiply by this
  uint32_t uniform_seed = 0;   // RouterParams::uniform_seed: a uniformly random top k (speed measurement)
};

// logits: [n_tokens][n_expert] -> ids, weights: [n_tokens][k] (slot order: descending probability).
// n_expert <= 1024, k <= 32.
void moe_route(const float* logits, int64_t n_tokens, const MoeRouting& r, int32_t* ids, float* weights,
               cudaStream_t stream);

// The router product and the routing in one launch, for decode: w = the router, f32 [n_expert][n_embd];
// x [n_tokens][n_embd] -> logits [n_tokens][n_expert] (also written), ids, weights as moe_route. `done`:
// one device counter, zero before the first call (the kernel leaves it zero). Takes what
// moe_router_fusable allows (f32 router, up to kMoeDecodeMaxTokens tokens). With shared_gate (f32
// [n_embd], a sigmoid-gated shared expert: Qwen3.5) every token gets one slot more, slot k: id n_expert
// (where the expert tables put the shared expert) with weight sigmoid(x . shared_gate); ids and weights
// are then [n_tokens][k + 1].
// `form` picks how one token's top k is found (the same result every way): automatic is the block's
// two-phase ranking wherever it fits; tests name the others (warp: one warp's serial top-k always; block:
// the one-phase block ranking up to 128 experts, the warp past it).
enum class RouteForm { automatic = -1, warp = 0, block = 1, two_phase = 2 };
bool moe_router_fusable(DType w_type, int64_t n_tokens, int64_t n_embd, const MoeRouting& r);
// The FFN norm before the router, inside its launch (one token, long_row_norm_fits): the router's input is
// y = rmsnorm(res + d) * w. Every block computes it itself from res and d, summing as add_rmsnorm_q8's
// long-row kernel does (the same bits), and block b writes y's q8_1 blocks b, b + blocks, ... (y as f32
// and q / ds). res is not written: res + d is left to the caller (MoeRun::residual adds d in the experts'
// down product). The router's x argument is then y.
struct RouterNorm {
  const float* res = nullptr;  // [n_embd], written before the kernel before the router's previous one
  const float* d = nullptr;    // [n_embd]
  const float* w = nullptr;    // [n_embd], the norm's weights
  float eps = 0.0f;
  float* y = nullptr;    // [n_embd] out
  int8_t* q = nullptr;   // [n_embd] out, y's q8_1 values
  float2* ds = nullptr;  // [n_embd / 32] out, their scales (matmul.h)
  // Optional: d comes as d_parts rows of n_embd (attention_decode's Proj parts): every block adds them as
  // sum_parts does, and block 0 writes the sum to d, which is then out as well.
  const float* parts = nullptr;
  int n_parts = 0;  // 1 .. kMaxRouterParts
};
constexpr int kMaxRouterParts = 8;
// What RouterNorm and MoeNormOut take: the long-row norm's exact sums in fewer threads (norm_row.cuh), one
// token, 1024 < n_embd <= 2048, n_embd % 32 == 0.
bool long_row_norm_fits(int64_t n_tokens, int64_t n_embd);
void moe_router(const float* w, const float* x, int64_t n_tokens, int64_t n_embd, const MoeRouting& r,
                float* logits, int32_t* ids, float* weights, unsigned* done, cudaStream_t stream,
                const float* shared_gate = nullptr, RouteForm form = RouteForm::automatic,
                const RouterNorm* norm = nullptr);

// One layer's routed experts as seen from this GPU.
struct MoeExperts {
  DType gate_type = DType::Q4_K, up_type = DType::Q4_K, down_type = DType::Q6_K;
  int64_t n_embd = 0, n_ff = 0, n_expert = 0;
  // DEVICE arrays of n_expert DEVICE pointers: gate/up [n_ff][n_embd], down [n_embd][n_ff]; null = absent.
  const void* const* gate = nullptr;
  const void* const* up = nullptr;
  const void* const* down = nullptr;
  // Optional, where experts 0 .. n_expert - 1 lie back to back and all are here (a layer's 3-D tensors):
  // expert e's gate at gate_base + e * gate_up_bytes (up alike), its down at down_base + e * down_bytes.
  // The decode kernels then compute the address instead of reading the table (one dependent memory read
  // fewer); ids past n_expert (a shared expert) still go through the tables, which stay complete.
  const void* gate_base = nullptr;
  const void* up_base = nullptr;
  const void* down_base = nullptr;
  size_t gate_up_bytes = 0, down_bytes = 0;
};

enum class MoePath { automatic, decode, grouped };

// Decode, one token: after the experts' sum, y = rmsnorm(out) * w with y's q8_1 (the next layer's input
// norm; add_rmsnorm_q8's bits). The down product's last block to finish computes it (long_row_norm_fits).
struct MoeNormOut {
  const float* w = nullptr;  // [n_embd], the norm's weights; null: no norm
  float eps = 0.0f;
  float* y = nullptr;        // [n_embd] out
  int8_t* q = nullptr;       // [n_embd] out, y's q8_1 values
  float2* ds = nullptr;      // [n_embd / 32] out, their scales (matmul.h)
  unsigned* done = nullptr;  // one device counter, zero before the first call (the launch leaves it zero)
};

struct MoeRun {
  const float* x = nullptr;        // [n_tokens][n_embd], the normalized FFN input
  int64_t n_tokens = 0, k = 0;     // k = experts per token
  const int32_t* ids = nullptr;    // [n_tokens][k]
  const float* weights = nullptr;  // [n_tokens][k]
  float* out = nullptr;            // [n_tokens][n_embd]
  bool accumulate = false;         // out += result instead of out = result
  MoePath path = MoePath::automatic;
  const Activations* xq = nullptr;  // x already in q8_1 (matmul.h), taken by the decode path; may be null
  // The decode gate/up kernel's CTAs per 32 outputs: 1, or 2 as one thread block cluster (sm_90; else 1).
  // The same bits either way; 0: 2.
  int gate_up_parts = 0;
  // Decode, accumulate: out = (out + residual) + the experts' sum, per element (a residual add the router's
  // norm left to this launch, RouterNorm; null: none).
  const float* residual = nullptr;
  MoeNormOut norm_out = {};  // decode, accumulate: the next norm of out (MoeNormOut)
};

// Throws xpert::Error for shapes or types the kernels do not take (gate and up must share a block type;
// the types are Q4_0 Q5_0 Q8_0 Q4_K Q5_K Q6_K, or GPTQ types for all three (n_embd % 32 == 0, n_embd
// and n_ff <= 12288); n_ff % 32 == 0).
void check_moe_experts(const MoeExperts& e);
// Whether MoeRun::norm_out is taken for these experts (not for GPTQ ones).
bool moe_norm_out_supported(const MoeExperts& e);
size_t moe_workspace_bytes(const MoeExperts& e, int64_t n_tokens, int64_t k);
void moe_experts(const MoeExperts& e, const MoeRun& run, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

// Helper for the common case: expert e of a 3-D tensor at `base` (experts back to back, each
// `expert_bytes` long) when resident[e], else null. Returns the host table; upload it to the device.
std::vector<const void*> expert_table(const void* base, size_t expert_bytes,
                                      const std::vector<bool>& resident);

}  // namespace xpert::cuda
