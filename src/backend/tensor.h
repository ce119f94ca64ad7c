// A weight matrix (or vector) in its storage format, in some backend's memory: what ops take as weights.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace xpert {

// ne[0] is the row length (ggml order).
struct Weight {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t ne[3] = {0, 1, 1};  // [cols (k), rows (n), matrices (experts of a 3-D expert tensor)]
  size_t n_bytes = 0;
  explicit operator bool() const { return data != nullptr; }
  const float* f32() const { return static_cast<const float*>(data); }
};

// Matrix e of a 3-D expert tensor [k, n, n_expert] as a 2-D weight [k, n] (a view into the same bytes).
Weight expert_matrix(const Weight& exps, int64_t e);

}  // namespace xpert
