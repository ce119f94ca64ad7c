// The grammar's stacks, the token trie and the matcher (the parser is grammar_parse.cpp).
#include "sample/grammar.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace xpert {

namespace {

// More parses alive at once than any sensible grammar has; past it the grammar is hopelessly ambiguous.
constexpr size_t kMaxStacks = 4096;
constexpr size_t kMaxCachedMasks = 256;

struct Utf8Step {
  bool ok;
  bool done;  // a code point completed
};

// One byte into a UTF-8 decoder state (cp, left, len). Overlong forms, surrogates and code points past
// U+10FFFF are invalid (else "\xE0\x80\xB7" would pass for "7").
constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};

template <class U>
Utf8Step utf8_step(U& u, uint8_t b) {
  if (u.left == 0) {
    if (b < 0x80) {
      u.cp = b;
      u.len = 1;
      return {true, true};
    }
    if (b >= 0xC2 && b <= 0xDF) {
      u.cp = b & 0x1F;
      u.left = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      u.cp = b & 0x0F;
      u.left = 2;
    } else if (b >= 0xF0 && b <= 0xF4) {
      u.cp = b & 0x07;
      u.left = 3;
    } else {
      return {false, false};
    }
    u.len = (uint8_t)(u.left + 1);
    return {true, false};
  }
  if ((b & 0xC0) != 0x80) return {false, false};
  u.cp = u.cp << 6 | (b & 0x3F);
  --u.left;
  // The smallest and largest code points this prefix may still become must leave a valid one.
  const uint32_t shift = 6 * u.left;
  const uint32_t lo = u.cp << shift, hi = lo | ((1u << shift) - 1);
  if (hi < kMinOfLength[u.len] || lo > 0x10FFFF) return {false, false};
  if (lo >= 0xD800 && hi <= 0xDFFF) return {false, false};  // surrogates only
  return {true, u.left == 0};
}

// The code points an incomplete character may still become.
template <class U>
std::pair<uint32_t, uint32_t> utf8_range(const U& u) {
  const uint32_t shift = 6 * u.left;
  const uint32_t lo = u.cp << shift;
  return {std::max(lo, kMinOfLength[u.len]), std::min<uint32_t>(lo | ((1u << shift) - 1), 0x10FFFF)};
}

}  // namespace

bool Grammar::CharSet::matches(uint32_t cp) const {
  if (cp < 128) return (ascii[cp / 64] >> (cp % 64)) & 1;
  bool in = false;
  for (auto [lo, hi] : ranges) in = in || (cp >= lo && cp <= hi);
  return in != negated;
}

bool Grammar::CharSet::intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (auto [a, b] : ranges)
      if (a <= hi && b >= lo) return true;
    return false;
  }
  // Some point of [lo, hi] outside every range (sorted at parse time): walk the covered prefix.
  uint32_t next = lo;  // the smallest candidate not yet known covered
  for (auto [a, b] : ranges) {
    if (a > next) break;
    if (b >= next) {
      if (b >= hi) return false;
      next = b + 1;
    }
  }
  return next <= hi;
}

// buf[0, n) is a stack whose top may be a rule reference: push the alternatives until every stack's top
// is a character set (or the stack is empty). Writes below n only to buf[n-1], restored on return.
void Grammar::expand(std::vector<uint32_t>& buf, size_t n, Stacks& out) const {
  if (n == 0) {
    out.add(buf.data(), 0);
    return;
  }
  const uint32_t pos = buf[n - 1];
  const Sym s = elems_[pos];
  if (s.kind == Kind::chars) {
    out.add(buf.data(), n);
    return;
  }
  if (out.size() > kMaxStacks)
    throw GrammarError(fmt::format("grammar: more than {} parses alive at once; the grammar is too ambiguous",
                                   kMaxStacks));
  size_t m = n - 1;
  if (elems_[pos + 1].kind != Kind::end) buf[m++] = pos + 1;  // the continuation after the call
  if (buf.size() < m + 1) buf.resize(m + 1);
  for (uint32_t a : rule_alts_[s.index]) {
    if (elems_[a].kind == Kind::end) {
      expand(buf, m, out);
    } else {
      buf[m] = a;
      expand(buf, m + 1, out);
    }
  }
  buf[n - 1] = pos;
}

void Grammar::canonicalize(Stacks& s) const {
  if (s.size() <= 1) return;
  thread_local std::vector<uint32_t> order;
  thread_local Stacks out;
  order.resize(s.size());
  std::iota(order.begin(), order.end(), 0);
  auto less = [&](uint32_t a, uint32_t b) {
    auto x = s.at(a), y = s.at(b);
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
  };
  std::sort(order.begin(), order.end(), less);
  out.clear();
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0) {
      auto x = s.at(order[i - 1]), y = s.at(order[i]);
      if (std::equal(x.begin(), x.end(), y.begin(), y.end())) continue;
    }
    auto x = s.at(order[i]);
    out.add(x.data(), x.size());
  }
  std::swap(s, out);
}

void Grammar::advance(const Stacks& in, uint32_t cp, Stacks& out) const {
  out.clear();
  thread_local std::vector<uint32_t> buf;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto st = in.at(i);
    if (st.empty()) continue;
    const uint32_t pos = st.back();
    if (!sets_[elems_[pos].index].matches(cp)) continue;
    if (buf.size() < st.size() + 1) buf.resize(st.size() + 1);
    std::copy(st.begin(), st.end(), buf.begin());
    size_t n = st.size();
    if (elems_[pos + 1].kind == Kind::end)
      --n;  // the alternative is done: return to the continuation below
    else
      buf[n - 1] = pos + 1;
    expand(buf, n, out);
  }
  canonicalize(out);
}

bool Grammar::may_match(const Stacks& in, uint32_t lo, uint32_t hi) const {
  for (size_t i = 0; i < in.size(); ++i) {
    const auto st = in.at(i);
    if (!st.empty() && sets_[elems_[st.back()].index].intersects(lo, hi)) return true;
  }
  return false;
}

// --- TokenTrie -------------------------------------------------------------------------------------

TokenTrie::TokenTrie(const std::vector<std::string>& pieces) : n_vocab_((int32_t)pieces.size()), pieces_(pieces) {
  for (int32_t id = 0; id < n_vocab_; ++id)
    if (!pieces_[id].empty() && pieces_[id].size() < 65535) ids_.push_back(id);
  std::sort(ids_.begin(), ids_.end(), [&](int32_t a, int32_t b) { return pieces_[a] < pieces_[b]; });
  // Preorder: a node for the prefix shared by ids_[lo, hi) of length `depth`.
  struct Frame {
    uint32_t node, lo, hi;
  };
  auto add = [&](uint32_t lo, uint32_t hi, uint16_t depth, uint8_t byte) {
    Node nd{0, lo, lo, depth, byte};
    while (nd.tok_end < hi && pieces_[ids_[nd.tok_end]].size() == depth) ++nd.tok_end;
    nodes_.push_back(nd);
    return (uint32_t)nodes_.size() - 1;
  };
  std::vector<Frame> path;
  path.push_back({add(0, (uint32_t)ids_.size(), 0, 0), 0, (uint32_t)ids_.size()});
  path.back().lo = nodes_[0].tok_end;
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.lo == f.hi) {
      nodes_[f.node].end = (uint32_t)nodes_.size();
      path.pop_back();
      continue;
    }
    // The next child: the run of ids_ from f.lo sharing the byte at this depth.
    const uint16_t depth = nodes_[f.node].depth;
    const auto byte = (uint8_t)pieces_[ids_[f.lo]][depth];
    uint32_t end = f.lo;
    while (end < f.hi && (uint8_t)pieces_[ids_[end]][depth] == byte) ++end;
    const uint32_t lo = f.lo;
    f.lo = end;
    const uint32_t child = add(lo, end, depth + 1, byte);
    path.push_back({child, nodes_[child].tok_end, end});
  }
}

// --- GrammarMatcher --------------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<GrammarTables> tables)
    : grammar_(std::move(grammar)),
      stacks_(grammar_->initial()),
      tables_(tables ? std::move(tables) : std::make_shared<GrammarTables>()) {}

void GrammarTables::clear() {
  masks.clear();
  states.clear();
  state_ids.clear();
  ascii_next.clear();
  other_next.clear();
}

bool GrammarMatcher::accept(std::string_view bytes) {
  Grammar::Stacks cur = stacks_;
  Utf8 u = utf8_;
  for (char ch : bytes) {
    const Utf8Step st = utf8_step(u, (uint8_t)ch);
    if (!st.ok) return false;
    if (!st.done) continue;
    grammar_->advance(cur, u.cp, tmp_);
    std::swap(cur, tmp_);
    if (cur.size() == 0) return false;
  }
  if (u.left > 0) {
    auto [lo, hi] = utf8_range(u);
    if (!grammar_->may_match(cur, lo, hi)) return false;
  }
  stacks_ = std::move(cur);
  utf8_ = u;
  return true;
}

bool GrammarMatcher::complete() const { return utf8_.left == 0 && stacks_.size() > 0 && stacks_.at(0).empty(); }

bool GrammarMatcher::finished() const { return complete() && stacks_.size() == 1; }

namespace {

std::string stacks_key(const Grammar::Stacks& s) {
  std::string key(4 * (s.offsets.size() + s.data.size()), '\0');
  std::memcpy(key.data(), s.offsets.data(), 4 * s.offsets.size());
  std::memcpy(key.data() + 4 * s.offsets.size(), s.data.data(), 4 * s.data.size());
  return key;
}

constexpr uint32_t kUnknown = UINT32_MAX, kDead = UINT32_MAX - 1;
constexpr size_t kMaxStates = 200000;  // past it the tables start over (at a mask's start)

}  // namespace

uint32_t GrammarMatcher::intern(const Grammar::Stacks& s) {
  GrammarTables& t = *tables_;
  auto [it, fresh] = t.state_ids.emplace(stacks_key(s), (uint32_t)t.states.size());
  if (fresh) {
    t.states.push_back(s);
    t.ascii_next.emplace_back();
    t.ascii_next.back().fill(kUnknown);
  }
  return it->second;
}

uint32_t GrammarMatcher::next_state(uint32_t id, uint32_t cp) {
  GrammarTables& t = *tables_;
  if (cp < 128) {
    if (const uint32_t known = t.ascii_next[id][cp]; known != kUnknown) return known;
  } else if (auto it = t.other_next.find((uint64_t)id << 21 | cp); it != t.other_next.end()) {
    return it->second;
  }
  grammar_->advance(t.states[id], cp, tmp_);
  const uint32_t next = tmp_.size() == 0 ? kDead : intern(tmp_);
  if (cp < 128)
    t.ascii_next[id][cp] = next;
  else
    t.other_next[(uint64_t)id << 21 | cp] = next;
  return next;
}

const std::vector<uint32_t>& GrammarMatcher::allowed_tokens(const TokenTrie& trie) {
  GrammarTables& t = *tables_;
  if (t.trie != &trie || t.states.size() > kMaxStates) {
    t.clear();
    t.trie = &trie;
  }
  const uint32_t root = intern(stacks_);
  const uint64_t key = (uint64_t)root << 32 | utf8_.cp << 8 | (uint32_t)utf8_.left << 4 | utf8_.len;
  if (auto it = t.masks.find(key); it != t.masks.end()) return it->second;
  if (t.masks.size() >= kMaxCachedMasks) t.masks.clear();
  std::vector<uint32_t>& mask = t.masks[key];
  mask.assign(((size_t)trie.n_vocab() + 31) / 32, 0);

  // Preorder over the trie; levels_[d]: the state after the first d bytes of the current path (the
  // stack set of the last whole character, and the UTF-8 bytes of one not yet whole).
  const auto& nodes = trie.nodes();
  const auto& ids = trie.ids();
  if (levels_.size() < 2) levels_.resize(2);
  levels_[0] = {root, utf8_};
  for (uint32_t i = 1; i < nodes.size();) {
    const TokenTrie::Node& nd = nodes[i];
    const size_t d = nd.depth;
    if (levels_.size() <= d) levels_.resize(d + 1);
    const Level parent = levels_[d - 1];
    Level& L = levels_[d];
    L.utf8 = parent.utf8;
    const Utf8Step st = utf8_step(L.utf8, nd.byte);
    bool alive = st.ok;
    if (alive && st.done) {
      L.state = next_state(parent.state, L.utf8.cp);
      alive = L.state != kDead;
    } else if (alive) {
      L.state = parent.state;
      auto [lo, hi] = utf8_range(L.utf8);
      alive = grammar_->may_match(t.states[L.state], lo, hi);
    }
    if (!alive) {
      i = nd.end;
      continue;
    }
    for (uint32_t t = nd.tok_begin; t < nd.tok_end; ++t) mask[(uint32_t)ids[t] / 32] |= 1u << (ids[t] % 32);
    ++i;
  }
  return mask;
}

}  // namespace xpert
