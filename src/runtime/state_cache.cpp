#include "runtime/state_cache.h"

#include <unistd.h>

#include <algorithm>

#include "base/error.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"

namespace xpert {

namespace {

std::vector<int64_t> recurrent_layers(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t il = 0; il < c.n_layer; ++il)
    if (c.recurrent(il)) out.push_back(il);
  return out;
}

std::vector<float> save_layers(const std::vector<int64_t>& layers, RecurrentState& st, int seq) {
  const size_t per = st.slot_floats();
  std::vector<float> out(layers.size() * per);
  for (size_t i = 0; i < layers.size(); ++i) st.read(layers[i], seq, out.data() + i * per);
  return out;
}

void load_layers(const std::vector<int64_t>& layers, RecurrentState& st, int seq, std::span<const float> data,
                 int64_t n_pos) {
  const size_t per = st.slot_floats();
  XP_ASSERT(data.size() == layers.size() * per);
  for (size_t i = 0; i < layers.size(); ++i) st.write(layers[i], seq, data.data() + i * per);
  st.set_n_pos(seq, n_pos);
}

}  // namespace

size_t default_cache_ram_bytes() {
  const size_t cap = size_t{8} << 30;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return cap;
  return std::min(cap, (size_t)pages * (size_t)page / 4);
}

std::vector<float> save_recurrent(const ModelConfig& c, RecurrentState& st, int seq) {
  return save_layers(recurrent_layers(c), st, seq);
}

void load_recurrent(const ModelConfig& c, RecurrentState& st, int seq, std::span<const float> data,
                    int64_t n_pos) {
  load_layers(recurrent_layers(c), st, seq, data, n_pos);
}

// --- the radix tree --------------------------------------------------------------------------------

struct StateCache::Node {
  Node* parent = nullptr;
  int64_t pos0 = 0;             // position of tokens[0]
  std::vector<int32_t> tokens;  // never empty, except at the root
  std::vector<uint8_t> kv;      // [attention layer][K|V][tokens.size()][row bytes] (see plane())
  std::vector<float> state;  // checkpoint after the last token: [recurrent layer][slot floats]; empty: none
  uint64_t used = 0;         // LRU stamps: of the run (an ancestor is never older than a descendant)
  uint64_t state_used = 0;   // and of the checkpoint
  bool pinned = false;       // on the path of the store in progress: not removed
  std::vector<std::unique_ptr<Node>> children;  // distinct first tokens
  int64_t end() const { return pos0 + (int64_t)tokens.size(); }
};

// Where a token sequence leaves the tree.
struct StateCache::Path {
  std::vector<Node*> nodes;  // runs matched whole, from the root down (root excluded)
  Node* partial = nullptr;   // then the run matched only in part, if any
  int64_t partial_len = 0;   // (its first partial_len tokens)
  int64_t n_common = 0;      // tokens matched
};

StateCache::StateCache(const ModelConfig& c, KvTypes types, size_t budget_bytes)
    : k_row_bytes_(kv_row_bytes(c, types.k)),
      v_row_bytes_(kv_row_bytes(c, types.v)),
      budget_(budget_bytes),
      root_(std::make_unique<Node>()) {
  for (int64_t il = 0; il < c.n_layer; ++il)
    (c.recurrent(il) ? recurrent_layers_ : attn_layers_).push_back(il);
  if (!recurrent_layers_.empty()) {
    const GdnShape s = gdn_shape(c);
    state_floats_ = recurrent_layers_.size() * (size_t)(s.conv_state_size() + s.ssm_state_size());
  }
}

StateCache::~StateCache() = default;

size_t StateCache::node_bytes(const Node& n) const { return n.tokens.size() * token_bytes(); }

StateCache::Path StateCache::walk(std::span<const int32_t> tokens) const {
  Path p;
  const Node* n = root_.get();
  const int64_t N = (int64_t)tokens.size();
  int64_t pos = 0;
  while (pos < N) {
    Node* next = nullptr;
    for (const auto& c : n->children)
      if (c->tokens[0] == tokens[pos]) {
        next = c.get();
        break;
      }
    if (!next) break;
    const int64_t len = (int64_t)next->tokens.size(), lim = std::min(len, N - pos);
    int64_t m = 0;
    while (m < lim && next->tokens[m] == tokens[pos + m]) ++m;
    pos += m;
    if (m < len) {
      p.partial = next;
      p.partial_len = m;
      break;
    }
    p.nodes.push_back(next);
    n = next;
  }
  p.n_common = pos;
  return p;
}

StateCache::Match StateCache::match(std::span<const int32_t> tokens, int64_t limit) const {
  Match m;
  if (!enabled()) return m;
  const Path p = walk(tokens);
  m.n_common = p.n_common;
  limit = std::max<int64_t>(0, limit);
  if (!recurrent()) {
    m.resume = std::min(m.n_common, limit);
  } else {
    for (const Node* n : p.nodes)
      if (!n->state.empty() && n->end() <= limit) m.resume = n->end();
  }
  return m;
}

bool StateCache::has_checkpoint(std::span<const int32_t> tokens) const {
  if (!enabled() || tokens.empty()) return false;
  const Path p = walk(tokens);
  return !p.partial && p.n_common == (int64_t)tokens.size() && !p.nodes.empty() &&
         !p.nodes.back()->state.empty();
}

void StateCache::touch(Node* n) {
  const uint64_t t = ++clock_;
  for (; n && n != root_.get(); n = n->parent) n->used = t;
}

void StateCache::write_kv(const Node& n, int64_t from, int64_t to, KvCache& kv, int seq) const {
  from = std::max(from, n.pos0);
  to = std::min(to, n.end());
  if (from >= to) return;
  const size_t len = n.tokens.size();
  for (size_t i = 0; i < attn_layers_.size(); ++i)
    for (int k = 0; k < 2; ++k) {
      const uint8_t* src = n.kv.data() + plane(i, k, len) + (size_t)(from - n.pos0) * row_bytes(k);
      kv.write_rows(attn_layers_[i], seq, k, from, to - from, src);
    }
}

void StateCache::restore(std::span<const int32_t> tokens, int64_t resume, int64_t from, KvCache& kv,
                         RecurrentState* st, int seq) {
  if (resume <= 0) return;
  const Path p = walk(tokens.first((size_t)resume));
  XP_ASSERT(p.n_common == resume);
  for (Node* n : p.nodes) write_kv(*n, from, resume, kv, seq);
  if (p.partial) write_kv(*p.partial, from, resume, kv, seq);
  Node* last = p.partial ? p.partial : p.nodes.back();
  touch(last);
  if (recurrent()) {
    XP_ASSERT(!p.partial && st && !last->state.empty());
    load_layers(recurrent_layers_, *st, seq, last->state, resume);
    last->state_used = clock_;
  }
}

// Cuts n after its first `keep` tokens: a new node takes them (and n's place), n keeps the rest below it.
StateCache::Node* StateCache::split(Node* n, int64_t keep) {
  const int64_t len = (int64_t)n->tokens.size(), rest = len - keep;
  XP_ASSERT(keep > 0 && rest > 0);
  auto upper = std::make_unique<Node>();
  upper->parent = n->parent;
  upper->pos0 = n->pos0;
  upper->tokens.assign(n->tokens.begin(), n->tokens.begin() + keep);
  upper->used = n->used;
  upper->pinned = n->pinned;
  upper->kv.resize(plane(attn_layers_.size(), 0, keep));
  std::vector<uint8_t> lower(plane(attn_layers_.size(), 0, rest));
  for (size_t i = 0; i < attn_layers_.size(); ++i)
    for (int k = 0; k < 2; ++k) {
      const size_t row = row_bytes(k);
      const uint8_t* src = n->kv.data() + plane(i, k, len);
      std::copy_n(src, keep * row, upper->kv.data() + plane(i, k, keep));
      std::copy_n(src + keep * row, rest * row, lower.data() + plane(i, k, rest));
    }
  n->kv.swap(lower);
  n->tokens.erase(n->tokens.begin(), n->tokens.begin() + keep);
  n->pos0 += keep;
  Node* raw = upper.get();
  for (auto& c : n->parent->children)
    if (c.get() == n) {
      std::unique_ptr<Node> owned = std::move(c);
      c = std::move(upper);
      owned->parent = raw;
      raw->children.push_back(std::move(owned));
      break;
    }
  return raw;
}

void StateCache::remove_leaf(Node* n) {
  XP_ASSERT(n != root_.get() && n->children.empty());
  bytes_ -= node_bytes(*n) + n->state.size() * sizeof(float);
  n_tokens_ -= (int64_t)n->tokens.size();
  if (!n->state.empty()) --n_checkpoints_;
  auto& siblings = n->parent->children;
  siblings.erase(std::find_if(siblings.begin(), siblings.end(), [n](const auto& c) { return c.get() == n; }));
}

// Hybrid models: KV rows with no checkpoint at or below them cannot be resumed from.
void StateCache::drop_useless(Node* n) {
  if (!recurrent()) return;
  while (n != root_.get() && !n->pinned && n->children.empty() && n->state.empty()) {
    Node* parent = n->parent;
    remove_leaf(n);
    n = parent;
  }
}

bool StateCache::evict_one() {
  Node* victim = nullptr;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& c : n->children) stack.push_back(c.get());
    if (n == root_.get()) continue;
    if (recurrent()) {
      if (!n->state.empty() && (!victim || n->state_used < victim->state_used)) victim = n;
    } else if (n->children.empty() && !n->pinned && (!victim || n->used < victim->used)) {
      victim = n;
    }
  }
  if (!victim) return false;
  ++evictions_;
  if (recurrent()) {
    bytes_ -= state_bytes();
    --n_checkpoints_;
    std::vector<float>().swap(victim->state);
    drop_useless(victim);
  } else {
    remove_leaf(victim);
  }
  return true;
}

bool StateCache::make_room(size_t need) {
  if (recurrent() && need > budget_) return false;  // would empty the pool for nothing
  while (bytes_ + need > budget_)
    if (!evict_one()) return false;
  return true;
}

void StateCache::unpin(const Path& p) {
  if (p.partial) p.partial->pinned = false;
  for (Node* n : p.nodes) n->pinned = false;
  // A pinned run may have lost its checkpoint meanwhile; only the deepest can be a leaf.
  Node* deepest = p.partial ? p.partial : p.nodes.empty() ? nullptr : p.nodes.back();
  if (deepest) drop_useless(deepest);
}

int64_t StateCache::store(std::span<const int32_t> tokens, KvCache& kv, RecurrentState* st, int seq) {
  const int64_t n = (int64_t)tokens.size();
  if (!enabled() || n == 0) return 0;
  const bool ckpt = recurrent();
  XP_ASSERT(!ckpt || (st && st->n_pos(seq) == n));
  Path p = walk(tokens);
  const int64_t L = p.n_common;
  Node* at = p.nodes.empty() ? root_.get() : p.nodes.back();
  if (L == n && !p.partial && (!ckpt || !at->state.empty())) {  // all there already
    touch(at);
    if (ckpt) at->state_used = clock_;
    return n;
  }
  if (!ckpt && L == n) {  // inside a run: nothing to add
    touch(p.partial);
    return n;
  }

  if (p.partial) p.partial->pinned = true;
  for (Node* x : p.nodes) x->pinned = true;
  int64_t n_store = n;
  if (!make_room((size_t)(n - L) * token_bytes() + (ckpt ? state_bytes() : 0))) {
    if (ckpt) {
      unpin(p);
      return 0;
    }
    const size_t room = budget_ > bytes_ ? budget_ - bytes_ : 0;
    n_store = L + (int64_t)(room / token_bytes());
  }
  if (n_store > L || ckpt) {
    if (p.partial) {
      Node* lower = p.partial;
      at = split(lower, p.partial_len);  // the new upper part is pinned like the rest of the path
      lower->pinned = false;
      p.partial = nullptr;
      p.nodes.push_back(at);
    }
  }
  for (int64_t pos = L; pos < n_store;) {
    const int64_t len = std::min(kMaxNodeTokens, n_store - pos);
    auto node = std::make_unique<Node>();
    node->parent = at;
    node->pos0 = pos;
    node->tokens.assign(tokens.begin() + pos, tokens.begin() + pos + len);
    node->kv.resize(plane(attn_layers_.size(), 0, (size_t)len));
    for (size_t i = 0; i < attn_layers_.size(); ++i)
      for (int k = 0; k < 2; ++k) kv.read_rows(attn_layers_[i], seq, k, pos, len, node->kv.data() + plane(i, k, len));
    bytes_ += node_bytes(*node);
    n_tokens_ += len;
    at->children.push_back(std::move(node));
    at = at->children.back().get();
    pos += len;
  }
  if (ckpt) {
    XP_ASSERT(at->end() == n && at->state.empty());
    at->state = save_layers(recurrent_layers_, *st, seq);
    bytes_ += state_bytes();
    ++n_checkpoints_;
    ++checkpoints_stored_;
  }
  touch(at);
  if (ckpt) at->state_used = clock_;
  unpin(p);
  XP_ASSERT(bytes_ <= budget_);
  return std::max(L, n_store);
}

StateCacheStats StateCache::stats() const {
  return {.bytes = bytes_,
          .budget_bytes = budget_,
          .n_tokens = n_tokens_,
          .n_checkpoints = n_checkpoints_,
          .checkpoints_stored = checkpoints_stored_,
          .evictions = evictions_};
}

void StateCache::clear() {
  root_ = std::make_unique<Node>();
  bytes_ = 0;
  n_tokens_ = n_checkpoints_ = 0;
}

}  // namespace xpert
