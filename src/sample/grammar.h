// Grammars for constrained sampling, in llama.cpp's GBNF syntax:
//
//   root   ::= object                    # a rule; `root` is where a sentence starts
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= [a-z_]+ ":" ws [^"\x00-\x1f]{1,16} | "null"
//   ws     ::= [ \t\n]*
//
// Literals ("..."), character classes ([a-z], [^"\\], with \n \t \xHH \uHHHH \UHHHHHHHH escapes), `.` (any
// character), rule names, groups, alternatives (|), `*` `+` `?` and `{m}` `{m,}` `{m,n}`; `#` comments.
// Newlines are plain space: a rule ends where the next `name ::=` begins.
//
// A Grammar is compiled once (parse() throws GrammarError saying where and what for a bad grammar) and is
// immutable: one object may serve many requests. A GrammarMatcher walks one generation through it code
// point by code point (pieces of tokens are bytes; a token may end inside a UTF-8 character and may span
// several grammar elements). TokenTrie + GrammarMatcher::allowed_tokens give the tokens that can come next.
//
// How it matches: the grammar is flattened into alternatives of symbols (a character set or a rule
// reference). The matcher's state is a set of stacks of positions (return addresses, the top being the
// next character set to match); a rule reference in tail position is not kept (a repetition does not
// grow the stack). Left recursion is refused at parse time, so expanding a stack always ends.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.h"

namespace xpert {

class GrammarError : public Error {
 public:
  using Error::Error;
};

class Grammar {
 public:
  // Throws GrammarError for a malformed grammar, an undefined rule, a missing `root`, left recursion.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf);

  // Internal form, read by the matcher. elems_: every alternative of every rule as a run of symbols
  // closed by an `end` symbol; a position is an index into it.
  enum class Kind : uint8_t { end, ref, chars };
  struct Sym {
    Kind kind;
    uint32_t index;  // ref: rule id; chars: index into sets_
  };
  struct CharSet {
    bool negated = false;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive code point ranges
    uint64_t ascii[2] = {0, 0};                         // membership of 0..127, negation applied
    bool matches(uint32_t cp) const;
    bool intersects(uint32_t lo, uint32_t hi) const;  // some code point in [lo, hi] matches
  };

  // A set of stacks, flat: stack i is data[offsets[i] .. offsets[i+1]), top last. An empty stack means
  // "the sentence may end here". Kept sorted and without duplicates.
  struct Stacks {
    std::vector<uint32_t> data;
    std::vector<uint32_t> offsets{0};
    size_t size() const { return offsets.size() - 1; }
    void clear() {
      data.clear();
      offsets.assign(1, 0);
    }
    std::span<const uint32_t> at(size_t i) const { return {data.data() + offsets[i], offsets[i + 1] - offsets[i]}; }
    void add(const uint32_t* s, size_t n) {
      data.insert(data.end(), s, s + n);
      offsets.push_back((uint32_t)data.size());
    }
  };

  // The stacks a sentence starts with.
  const Stacks& initial() const { return initial_; }
  // The stacks after the code point `cp` from `in` (into `out`, cleared first); empty when no stack takes it.
  // Thread-safe (a grammar may serve several requests at once).
  void advance(const Stacks& in, uint32_t cp, Stacks& out) const;
  // Whether some stack's next character set meets [lo, hi] (a UTF-8 character still incomplete).
  bool may_match(const Stacks& in, uint32_t lo, uint32_t hi) const;
  size_t n_rules() const { return rule_alts_.size(); }
  const std::string& source() const { return source_; }  // the GBNF text it was parsed from

 private:
  friend class GrammarParser;
  void expand(std::vector<uint32_t>& buf, size_t n, Stacks& out) const;
  void canonicalize(Stacks& s) const;

  std::vector<Sym> elems_;
  std::vector<std::vector<uint32_t>> rule_alts_;  // rule -> start positions of its alternatives
  std::vector<CharSet> sets_;
  std::vector<std::string> rule_names_;
  Stacks initial_;
  std::string source_;
};

// The vocabulary as a byte trie in preorder, for walking all tokens' pieces at once. Tokens with an empty
// piece (control tokens) are left out: a grammar never produces them.
class TokenTrie {
 public:
  explicit TokenTrie(const std::vector<std::string>& pieces);  // pieces[id]: the token's bytes
  int32_t n_vocab() const { return n_vocab_; }
  const std::string& piece(int32_t id) const { return pieces_[id]; }

  struct Node {
    uint32_t end;        // index after this node's subtree
    uint32_t tok_begin;  // tokens whose piece ends here: ids_[tok_begin, tok_end)
    uint32_t tok_end;
    uint16_t depth;  // bytes from the root
    uint8_t byte;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  int32_t n_vocab_ = 0;
  std::vector<std::string> pieces_;
  std::vector<Node> nodes_;  // nodes_[0]: the root (empty prefix)
  std::vector<int32_t> ids_;
};

// What the mask walks learn about one grammar over one vocabulary: stack sets interned, the transitions
// between them (a token inside a JSON string mostly loops on one state: one table lookup per byte) and
// the masks per state. Matchers of requests with the same grammar may share one (one thread at a time),
// so an agent that sends the same schema every time pays each walk once.
struct GrammarTables {
  const TokenTrie* trie = nullptr;  // what the masks are over
  std::vector<Grammar::Stacks> states;
  std::unordered_map<std::string, uint32_t> state_ids;
  std::vector<std::array<uint32_t, 128>> ascii_next;
  std::unordered_map<uint64_t, uint32_t> other_next;
  std::unordered_map<uint64_t, std::vector<uint32_t>> masks;  // by (state, UTF-8 tail)
  void clear();
};

// One generation's walk through a grammar. Not thread-safe; one per request.
class GrammarMatcher {
 public:
  // `tables`: shared with other matchers of the same grammar (null: its own).
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<GrammarTables> tables = nullptr);

  // Advances over the bytes if the grammar allows them (true), else leaves the state as it was (false).
  bool accept(std::string_view bytes);
  // The sentence so far is complete: end of generation may come now.
  bool complete() const;
  // Complete, and no character may follow: generation is over.
  bool finished() const;
  // Bit i of the result: token i's piece may come next (end-of-generation tokens are not included:
  // see complete()). Cached per state, so a state seen before costs a lookup.
  const std::vector<uint32_t>& allowed_tokens(const TokenTrie& trie);
  const Grammar& grammar() const { return *grammar_; }

 private:
  struct Utf8 {
    uint32_t cp = 0;
    uint8_t left = 0;  // continuation bytes still expected
    uint8_t len = 0;   // bytes of the character
  };
  uint32_t intern(const Grammar::Stacks& s);
  uint32_t next_state(uint32_t id, uint32_t cp);  // (interned) stacks after cp, or a dead mark

  std::shared_ptr<const Grammar> grammar_;
  Grammar::Stacks stacks_;
  Utf8 utf8_;
  Grammar::Stacks tmp_;
  std::shared_ptr<GrammarTables> tables_;
  struct Level {
    uint32_t state = 0;
    Utf8 utf8;
  };
  std::vector<Level> levels_;
};

}  // namespace xpert
