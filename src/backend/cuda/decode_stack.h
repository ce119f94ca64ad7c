// A whole decode step of an attention + routed-experts stack (qwen3moe) for one token, in one persistent
// kernel: a grid as large as the GPU holds at once walks the layers, and grid barriers replace the ten
// launches per layer of the op-by-op path. Per layer, six phases separated by barriers:
//   A  rmsnorm(x) (every block, into its shared memory as q8_1) -> q, k, v rows
//   B  per q head: q/k norms + RoPE, k/v stored into the f16 cache, attention over rows 0..pos
//      (a block per (head, key split); past 512 keys a head is split and a combine phase follows)
//   C  att (q8_1 per block) -> o rows, added into x
//   D  rmsnorm(x) -> router logits (f32 rows)
//   E  top-k (every block) -> gate and up rows of the k experts, SwiGLU -> h
//   F  h (q8_1 per block) -> down rows of the k experts, weighted, added into x
// Before each barrier a block starts its rows of the next weight phase on their way into L2. Sums run in
// other orders than the op-by-op kernels and the attention is f32 over the f16 cache, so results agree
// within a tolerance, not bit for bit (tests/cuda). All pointers: DEVICE.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "quant/dtype.h"

namespace xpert::cuda {

// One layer's weights and cache rows. Matrix types are block-quantized (Q4_0 Q5_0 Q8_0 Q4_K Q5_K Q6_K);
// norms and the router are f32; gate/up/down are the layer's 3-D expert tensors (expert e at
// e * *_bytes), every expert on this GPU.
struct StackLayer {
  const float *attn_norm, *q_norm, *k_norm, *ffn_norm, *router;
  const void *wq, *wk, *wv, *wo;
  const void *gate, *up, *down;
  uint64_t gate_bytes, up_bytes, down_bytes;
  void *k_cache, *v_cache;             // slot 0's rows of this layer, f16
  int32_t tq, tk, tv, to, tg, tu, td;  // DType of each matrix
  uint32_t rq, rk, rv, ro, rg, ru, rd;  // bytes of a row of each (quant/dtype.h's row_bytes)
};

struct StackShape {
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  int n_expert = 0, k = 0, n_ff = 0;
  float eps = 1e-6f, kq_scale = 1.0f, theta_scale = 1.0f, freq_scale = 1.0f;
  bool neox = true, norm_weights = true;
  float weights_scale = 1.0f;
  int64_t slot_stride = 0;  // bytes from one sequence slot's cache rows to the next
};

// Empty when the kernel takes this shape and these layer types (host copies of the layers), else why not.
std::string stack_unsupported(const StackShape& s, const StackLayer* layers);
size_t stack_workspace_bytes(const StackShape& s);
// x: [n_embd], the residual stream (in: the embedding; out: after the last layer). pos, slot: one int each.
// barrier: one device counter (the call zeroes it on the stream).
void stack_decode(const StackShape& s, const StackLayer* layers, float* x, const int32_t* pos,
                  const int32_t* slot, void* workspace, unsigned* barrier, cudaStream_t stream);

}  // namespace xpert::cuda
