// The state cache: a host-RAM pool of sequence states that outlives the engine's slots, so a request
// that repeats or extends an earlier conversation evaluates only what is new, whichever slot held it.
//
// Index: a radix tree over token ids. A node is a run of tokens at known positions [pos0, end) below
// its parent's run and holds the host copy of those positions' KV rows for every attention layer
// ([layer][K|V][n_tokens][row bytes], in the KV cache's types, copied as they are). A node may also hold a checkpoint: the recurrent state of every
// Gated DeltaNet layer after its last token. Runs are cut at most kMaxNodeTokens long (the unit of
// eviction for dense models) and wherever two sequences diverge or a checkpoint sits.
//
// Resuming: a dense model can resume at any position of a cached prefix (the KV rows are the whole
// state). A hybrid model resumes only at a checkpoint (the recurrent state cannot be rolled back), with
// the KV rows of the attention layers up to it; so for hybrid models a node with no checkpoint at or
// below it is useless and is dropped.
//
// Memory: everything the pool holds (KV rows, checkpoints, token ids) counts against a byte budget that
// is never exceeded. To make room it evicts the least recently used entry: for dense models a leaf run
// (the deepest part of the oldest conversation goes first), for hybrid models a checkpoint (interior
// checkpoints that nobody resumed from age out before the end of a conversation that was used lately);
// KV rows go with the last checkpoint that needed them. "Used" means stored or restored.
//
// Every copy of cache contents goes through KvCache::read_rows/write_rows and RecurrentState::read/write,
// so the slots may live on any device. Not thread-safe: the engine thread is its only user.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/kv_cache.h"

namespace xpert {

class RecurrentState;

// The default --cache-ram: 8 GiB, or a quarter of the machine's memory when that is less.
size_t default_cache_ram_bytes();

// A host copy of one slot's recurrent state over every recurrent layer: [recurrent layer][slot_floats].
std::vector<float> save_recurrent(const ModelConfig& c, RecurrentState& st, int seq);
// Writes it back and sets the slot's position to n_pos.
void load_recurrent(const ModelConfig& c, RecurrentState& st, int seq, std::span<const float> data,
                    int64_t n_pos);

struct StateCacheStats {
  size_t bytes = 0, budget_bytes = 0;
  int64_t n_tokens = 0;       // positions whose KV rows the pool holds (shared prefixes once)
  int64_t n_checkpoints = 0;  // recurrent checkpoints held
  uint64_t checkpoints_stored = 0, evictions = 0;  // since start; evictions: runs or checkpoints dropped
};

class StateCache {
 public:
  static constexpr int64_t kMaxNodeTokens = 256;

  // `types`: the KV cache's (KvCache::types()); rows are stored in them.
  StateCache(const ModelConfig& c, KvTypes types, size_t budget_bytes);
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  bool enabled() const { return budget_ > 0; }
  bool recurrent() const { return !recurrent_layers_.empty(); }

  struct Match {
    int64_t n_common = 0;  // the longest prefix of the tokens the pool holds
    int64_t resume = 0;    // the longest prefix a slot can resume from, at most `limit` (see above)
  };
  Match match(std::span<const int32_t> tokens, int64_t limit) const;
  // Whether a checkpoint sits exactly after tokens.back().
  bool has_checkpoint(std::span<const int32_t> tokens) const;

  // Puts the cached state of tokens[0, resume) into slot `seq`: KV rows [from, resume) (rows below
  // `from` already hold these tokens) and, for hybrid models, the checkpoint at `resume` (its position
  // included). `resume` must come from match() with no store() since. Marks what it used recently used.
  void restore(std::span<const int32_t> tokens, int64_t resume, int64_t from, KvCache& kv, RecurrentState* st,
               int seq);

  // Saves tokens[0, n) that slot `seq` holds: the KV rows the pool lacks and, for hybrid models, a
  // checkpoint of the slot's recurrent state (which must be at position n). Evicts to stay in the
  // budget, never below what this call needs. Hybrid: all or nothing; dense: the longest prefix that
  // fits. Returns the number of leading tokens the pool holds afterwards (hybrid: n or 0).
  int64_t store(std::span<const int32_t> tokens, KvCache& kv, RecurrentState* st, int seq);

  StateCacheStats stats() const;
  void clear();

 private:
  struct Node;
  struct Path;
  Path walk(std::span<const int32_t> tokens) const;
  Node* split(Node* n, int64_t keep);
  bool make_room(size_t need);
  bool evict_one();
  void remove_leaf(Node* n);
  void drop_useless(Node* n);
  void touch(Node* n);
  void unpin(const Path& p);
  void write_kv(const Node& n, int64_t from, int64_t to, KvCache& kv, int seq) const;
  size_t node_bytes(const Node& n) const;
  size_t token_bytes() const { return attn_layers_.size() * (k_row_bytes_ + v_row_bytes_) + sizeof(int32_t); }
  // Byte offset of layer i's K (k = 0) or V rows in a node of len tokens.
  size_t plane(size_t i, int k, size_t len) const {
    return i * len * (k_row_bytes_ + v_row_bytes_) + (k ? len * k_row_bytes_ : 0);
  }
  size_t row_bytes(int k) const { return k ? v_row_bytes_ : k_row_bytes_; }
  size_t state_bytes() const { return state_floats_ * sizeof(float); }

  size_t k_row_bytes_, v_row_bytes_;
  std::vector<int64_t> attn_layers_, recurrent_layers_;
  size_t state_floats_ = 0;  // one checkpoint, all recurrent layers
  size_t budget_;
  size_t bytes_ = 0;
  int64_t n_tokens_ = 0, n_checkpoints_ = 0;
  uint64_t checkpoints_stored_ = 0, evictions_ = 0;
  uint64_t clock_ = 0;
  std::unique_ptr<Node> root_;
};

}  // namespace xpert
