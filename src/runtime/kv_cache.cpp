#include "runtime/kv_cache.h"

#include "base/error.h"

namespace xpert {

KvCache::KvCache(const ModelConfig& c, int64_t n_ctx, int n_seq)
    : n_ctx_(n_ctx), n_seq_(n_seq), row_(c.n_head_kv * c.head_dim) {
  if (n_ctx <= 0) fail("context size must be positive, got {}", n_ctx);
  const double bytes = 2.0 * 2.0 * (double)c.n_layer * n_seq * n_ctx * row_;
  if (bytes > 64.0 * (1ull << 30)) fail("KV cache of {:.1f} GiB for -c {} is too large; use a smaller context", bytes / (1ull << 30), n_ctx);
  data_.assign((size_t)c.n_layer * n_seq * 2 * n_ctx * row_, 0);
}

}  // namespace xpert
