#include "backend/tensor.h"

#include "base/error.h"

namespace xpert {

Weight expert_matrix(const Weight& exps, int64_t e) {
  XP_ASSERT(e >= 0 && e < exps.ne[2]);
  const size_t bytes = row_bytes(exps.type, exps.ne[0]) * (size_t)exps.ne[1];
  Weight w;
  w.type = exps.type;
  w.data = static_cast<const uint8_t*>(exps.data) + bytes * (size_t)e;
  w.ne[0] = exps.ne[0];
  w.ne[1] = exps.ne[1];
  w.n_bytes = bytes;
  return w;
}

}  // namespace xpert
