// The routed-experts FFN of a Mixture-of-Experts layer, as llama.cpp's build_moe_ffn computes it for
// qwen3moe: router logits -> softmax over all experts -> top-k -> the k probabilities renormalized to
// sum 1 (optionally scaled) -> SwiGLU experts -> weighted sum in rank order.
//
// A batch runs grouped by expert: the rows routed to an expert are gathered, multiplied by that
// expert's weights once (m = rows routed to it), and the weighted results summed per token. An expert
// is always addressed as a slice ("matrix e of the layer's 3-D tensor"), never the whole tensor, so a
// placement can later put experts one by one on different devices.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/experts.h"
#include "base/thread_pool.h"

namespace xpert::cpu {

// logits: [n_tokens][n_expert].
void route_top_k(const float* logits, int64_t n_tokens, const RouterParams& p, Routing& r);

// How the experts of one batch share the threads. by_expert: each thread runs whole experts (taken
// from a shared queue) with a single-threaded matmul, no synchronization between experts: the choice
// when many experts get few rows each (decode). by_rows: experts one after another, each matmul split
// over all threads: the choice when a few experts get most rows. batched: the gate and up products of
// every expert in one parallel region, then every down product in another, each thread streaming an
// equal share of the weight bytes: the choice when each expert has few rows (decode, with fewer
// experts than threads twice over). automatic picks per batch.
enum class MoeSchedule { automatic, by_expert, by_rows, batched };

// Reusable buffers of one MoE evaluation.
struct MoeScratch {
  std::vector<float> logits;         // [n][n_expert]
  Routing routing;
  std::vector<int32_t> offsets;      // [n_expert + 1]: expert e's rows are [offsets[e], offsets[e+1])
  std::vector<int32_t> row_slot;     // grouped row -> slot (t*k + j)
  std::vector<int32_t> slot_row;     // slot -> grouped row
  std::vector<float> xg, gate, up, yg;  // grouped rows: [n*k][n_embd], [n*k][n_ff_exp] x2, [n*k][n_embd]
  std::vector<float> xe, ye;            // the rows an ExpertExecutor computes, in its task order
};

// x: [n][n_embd] (the normalized FFN input) -> out: [n][n_embd]. Counts the routing in m.stats when set.
// The experts run on the pool, or with m.exec set on m.exec for m.exec_share of their rows and on the pool
// for the rest at the same time (the CPU routes, gathers and combines).
// = moe_route, then moe_experts_partial of all.
void moe_ffn(const MoeFfn& m, const float* x, int64_t n, float* out, MoeScratch& s, ThreadPool& pool,
             MoeSchedule schedule = MoeSchedule::automatic);

// The router alone: logits = x . m.router, then route_top_k with the layer's parameters into r.
void moe_route(const MoeFfn& m, const float* x, int64_t n, Routing& r, MoeScratch& s, ThreadPool& pool);

// Heterogeneous experts: only the experts with include[e] (include.size() == n_expert) for a routing
// computed elsewhere (r: n tokens, k = n_expert_used). For every (token, slot) whose expert is included,
// the SwiGLU expert output times the slot's weight, added per token in slot order:
//   accumulate = false: out[t] = sum over the included slots (0 for a token with none),
//   accumulate = true:  out[t] += each included slot's term, one after another in slot order.
// Rows are grouped by expert exactly as in moe_ffn (each included expert's weights read once per batch,
// the same rows in the same order), so its expert outputs are moe_ffn's bits, and a full include set
// reproduces moe_ffn bit for bit. Like moe_ffn, m.exec computes m.exec_share of the included experts'
// rows. Two parts (the first out=, the second accumulate) equal moe_ffn exactly when each token's
// first-part slots come before its second-part slots, and always for k <= 2 (float addition is
// commutative); otherwise up to summation order. Expert weights are read through
// expert_matrix, so m may be the host's view (the mmap) of a layer whose other experts are elsewhere.
void moe_experts_partial(const MoeFfn& m, const float* x, int64_t n, const Routing& r,
                         const std::vector<bool>& include, float* out, bool accumulate, MoeScratch& s,
                         ThreadPool& pool, MoeSchedule schedule = MoeSchedule::automatic);

// The obvious version for tests: token by token, slot by slot, with cpu::matmul_reference.
void moe_ffn_reference(const MoeFfn& m, const float* x, int64_t n, float* out);

}  // namespace xpert::cpu
