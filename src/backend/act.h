// What one op hands the next through the forward: rows with the form their products read (Act), and a sum
// left as parts (PartialSum). The forward passes them explicitly from the op that made them to the op that
// takes them; nothing is matched between op calls (see backend.h).
#pragma once
#include <cstdint>

namespace xpert {

// Rows one op wrote for the products that read them next: x [rows][k] (f32, in the backend's memory) and,
// where that op also wrote the products' input form of the same rows in the same launch (CUDA at decode
// sizes: q8_1 blocks), that form, which a product handed this Act reads instead of converting x again
// (the same bits). The ops that make one return it (add_rmsnorm, gated_delta_net_act, decode_attention,
// add_rmsnorm_moe_ffn_add); the forward hands it to the products of x (matmul, matmuls and the MoE ops
// that take an Act). It holds until x is written again; the backend reads its form only while no later op
// of that backend has made another (serial), and otherwise converts x as for a plain pointer.
struct Act {
  const float* x = nullptr;
  int64_t rows = 0, k = 0;
  const void* form = nullptr;  // the backend's own, opaque to the model; null: x alone
  uint64_t serial = 0;         // which of the backend's forms
  static Act of(const float* x, int64_t rows, int64_t k) { return {.x = x, .rows = rows, .k = k}; }
};

// A sum one op left as parts (DecodeFusions::decode_attention_proj): out [n] = parts[0][n] + ... +
// parts[n_parts - 1][n], in the backend's memory, not yet added, so out holds nothing yet. The forward hands
// it to the op that reads out next, which adds the parts itself where it can (add_rmsnorm_moe_ffn_add), or
// has them added first (DecodeFusions::sum_parts). The parts hold until the backend's next such op.
struct PartialSum {
  float* out = nullptr;
  const float* parts = nullptr;
  int n_parts = 0;
  int64_t n = 0;
};

}  // namespace xpert
