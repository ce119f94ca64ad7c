// GBNF text -> Grammar: a recursive-descent parser, then the checks (undefined rules, root, left
// recursion) and the flattening into positions. See grammar.h for the syntax.
#include <algorithm>
#include <map>

#include "sample/grammar.h"

namespace xpert {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 10000;           // {m,n} bounds
constexpr size_t kMaxSymbols = size_t{1} << 21;  // after repetitions are expanded

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

}  // namespace

class GrammarParser {
 public:
  explicit GrammarParser(std::string_view src) : src_(src) {}

  std::shared_ptr<const Grammar> run() {
    auto g = std::make_shared<Grammar>();
    g_ = g.get();
    skip_space();
    if (at_end()) error("the grammar is empty; expected rules such as  root ::= \"yes\" | \"no\"");
    while (!at_end()) {
      const size_t start = pos_;
      const std::string name = parse_name();
      skip_space();
      if (src_.substr(pos_, 3) != "::=") error(fmt::format("expected '::=' after the rule name '{}'", name));
      pos_ += 3;
      const uint32_t id = rule_id(name, start);
      if (defined_[id]) error_at(start, fmt::format("rule '{}' is defined twice", name));
      defined_[id] = true;
      rules_[id] = parse_alternates(name, false);
      skip_space();
    }
    check();
    flatten();
    return g;
  }

 private:
  using Seq = std::vector<Grammar::Sym>;
  using Alts = std::vector<Seq>;

  [[noreturn]] void error_at(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError(fmt::format("grammar: line {} column {}: {}", line, col, what));
  }
  [[noreturn]] void error(const std::string& what) const { error_at(pos_, what); }

  bool at_end() const { return pos_ >= src_.size(); }
  char peek() const { return at_end() ? '\0' : src_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(src_[pos_])) ++pos_;
    if (pos_ == start) error(fmt::format("expected a rule name, found '{}'", peek()));
    return std::string(src_.substr(start, pos_ - start));
  }

  // At `name ::=`: the next rule begins.
  bool at_rule_start() {
    const size_t save = pos_;
    while (!at_end() && is_name_char(src_[pos_])) ++pos_;
    bool yes = pos_ > save;
    if (yes) {
      skip_space();
      yes = src_.substr(pos_, 3) == "::=";
    }
    pos_ = save;
    return yes;
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    auto [it, fresh] = ids_.emplace(name, (uint32_t)rules_.size());
    if (fresh) {
      rules_.emplace_back();
      defined_.push_back(false);
      names_.push_back(name);
      first_use_.push_back(at);
    }
    return it->second;
  }

  uint32_t new_rule(const std::string& base, Alts alts) {
    std::string name;
    do name = fmt::format("{}_{}", base, ++generated_);
    while (ids_.count(name));
    const uint32_t id = rule_id(name, pos_);
    defined_[id] = true;
    rules_[id] = std::move(alts);
    return id;
  }

  Grammar::Sym ref(uint32_t rule) const { return {Grammar::Kind::ref, rule}; }

  Grammar::Sym chars(Grammar::CharSet set) {
    for (auto [lo, hi] : set.ranges)
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 127); ++c) set.ascii[c / 64] |= uint64_t{1} << (c % 64);
    if (set.negated) {
      set.ascii[0] = ~set.ascii[0];
      set.ascii[1] = ~set.ascii[1];
    }
    std::sort(set.ranges.begin(), set.ranges.end());  // CharSet::intersects walks them in order
    g_->sets_.push_back(std::move(set));
    return {Grammar::Kind::chars, (uint32_t)g_->sets_.size() - 1};
  }

  Alts parse_alternates(const std::string& rule, bool nested) {
    Alts alts;
    alts.push_back(parse_sequence(rule, nested));
    while (peek() == '|') {
      ++pos_;
      alts.push_back(parse_sequence(rule, nested));
    }
    return alts;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) error(fmt::format("expected {} hex digits in an escape", digits));
      v = v * 16 + (uint32_t)d;
      ++pos_;
    }
    if (v > kMaxCodePoint) error(fmt::format("escape U+{:X} is beyond U+10FFFF", v));
    return v;
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  uint32_t parse_char() {
    if (at_end()) error("unexpected end of the grammar");
    const auto c = (unsigned char)src_[pos_];
    if (c == '\\') {
      ++pos_;
      if (at_end()) error("unexpected end of the grammar after '\\'");
      const char e = src_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '0':
          return 0;
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        default:
          if ((e >= 0x21 && e <= 0x2f) || (e >= 0x3a && e <= 0x40) || (e >= 0x5b && e <= 0x60) ||
              (e >= 0x7b && e <= 0x7e))
            return (uint32_t)e;  // punctuation stands for itself: \" \\ \[ \] \- \^ ...
          error_at(pos_ - 2, fmt::format("unknown escape '\\{}'", e));
      }
    }
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > src_.size()) error("the grammar is not valid UTF-8");
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = (unsigned char)src_[pos_ + i];
      if ((b & 0xC0) != 0x80) error("the grammar is not valid UTF-8");
      cp = cp << 6 | (b & 0x3F);
    }
    pos_ += len;
    return cp;
  }

  Seq parse_literal() {
    ++pos_;  // "
    Seq seq;
    while (peek() != '"') {
      if (at_end()) error("unterminated string literal (missing '\"')");
      const uint32_t cp = parse_char();
      Grammar::CharSet set;
      set.ranges.emplace_back(cp, cp);
      seq.push_back(chars(std::move(set)));
    }
    ++pos_;
    return seq;
  }

  Grammar::Sym parse_class() {
    const size_t start = pos_++;  // [
    Grammar::CharSet set;
    if (peek() == '^') {
      set.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (at_end()) error_at(start, "unterminated character class (missing ']')");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error(fmt::format("character range U+{:X}-U+{:X} is reversed", lo, hi));
      }
      set.ranges.emplace_back(lo, hi);
    }
    ++pos_;
    return chars(std::move(set));
  }

  int parse_count() {
    const size_t start = pos_;
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) error_at(start, fmt::format("repetition count above {}", kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) error("expected a number in {m,n}");
    return (int)v;
  }

  // Appends `item` repeated [min, max] times (max < 0: unbounded) to `seq`.
  void repeat(const std::string& rule, Seq& seq, Seq item, int min, int max) {
    if (item.size() != 1) item = {ref(new_rule(rule, {item}))};
    // Copies and chain rules count against one budget for the whole grammar (a request's grammar must
    // not take the server's memory).
    total_ += (size_t)min + 3 * (size_t)std::max(max - min, 1);
    if (total_ > kMaxSymbols) error("the grammar is too large once its repetitions are expanded");
    for (int i = 0; i < min; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (max < 0) {
      const uint32_t star = new_rule(rule, {});
      rules_[star] = {Seq{item[0], ref(star)}, Seq{}};
      seq.push_back(ref(star));
      return;
    }
    // x{0,k} as  r_k ::= x r_{k-1} | ε  (one way to match any count, so no ambiguity)
    int64_t tail = -1;
    for (int i = min; i < max; ++i) {
      Seq first{item[0]};
      if (tail >= 0) first.push_back(ref((uint32_t)tail));
      tail = new_rule(rule, {first, Seq{}});
    }
    if (tail >= 0) seq.push_back(ref((uint32_t)tail));
  }

  Seq parse_sequence(const std::string& rule, bool nested) {
    Seq seq;
    size_t last = SIZE_MAX;  // where the last item starts in seq
    for (;;) {
      skip_space();
      const char c = peek();
      if (at_end() || c == '|' || c == ')') break;
      if (is_name_char(c) && at_rule_start()) {
        if (nested) error("missing ')' before the next rule");
        break;
      }
      const size_t item_start = seq.size();
      if (c == '"') {
        Seq lit = parse_literal();
        if (lit.empty()) continue;  // "" matches nothing: no item to repeat
        if (lit.size() > 1 && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
          lit = {ref(new_rule(rule, {lit}))};
        seq.insert(seq.end(), lit.begin(), lit.end());
      } else if (c == '[') {
        seq.push_back(parse_class());
      } else if (c == '.') {
        ++pos_;
        Grammar::CharSet any;
        any.negated = true;
        seq.push_back(chars(std::move(any)));
      } else if (is_name_char(c)) {
        const size_t at = pos_;
        seq.push_back(ref(rule_id(parse_name(), at)));
      } else if (c == '(') {
        const size_t open = pos_++;
        Alts alts = parse_alternates(rule, true);
        if (peek() != ')') error_at(open, "unclosed '('");
        ++pos_;
        seq.push_back(ref(new_rule(rule, std::move(alts))));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == SIZE_MAX) error(fmt::format("'{}' must follow something to repeat", c));
        Seq item(seq.begin() + (ptrdiff_t)last, seq.end());
        seq.resize(last);
        ++pos_;
        int min = 0, max = -1;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          skip_space();
          min = parse_count();
          skip_space();
          max = min;
          if (peek() == ',') {
            ++pos_;
            skip_space();
            max = peek() == '}' ? -1 : parse_count();
            skip_space();
          }
          if (peek() != '}') error("expected '}' to close {m,n}");
          ++pos_;
          if (max >= 0 && max < min) error(fmt::format("repetition {{{},{}}} has max below min", min, max));
        }
        repeat(rule, seq, std::move(item), min, max);
        last = SIZE_MAX;  // x** is not allowed
        continue;
      } else {
        error(fmt::format("unexpected character '{}'", c));
      }
      last = item_start;
    }
    return seq;
  }

  // Every rule defined, a root, no left recursion.
  void check() {
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r]) error_at(first_use_[r], fmt::format("rule '{}' is used but never defined", names_[r]));
    if (!ids_.count("root")) error_at(0, "the grammar has no 'root' rule (generation starts there)");
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : rules_[r]) {
          bool all = true;
          for (const auto& s : alt) all = all && s.kind == Grammar::Kind::ref && nullable[s.index];
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Rule r calls rule q before consuming anything: a cycle is left recursion.
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r)
      for (const Seq& alt : rules_[r])
        for (const auto& s : alt) {
          if (s.kind != Grammar::Kind::ref) break;
          left[r].push_back(s.index);
          if (!nullable[s.index]) break;
        }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (size_t root = 0; root < n; ++root) {
      if (color[root]) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{(uint32_t)root, 0}};
      color[root] = 1;
      while (!path.empty()) {
        auto& [r, next] = path.back();
        if (next == left[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t q = left[r][next++];
        if (color[q] == 1)
          error_at(first_use_[q], fmt::format("rule '{}' is left-recursive: it can reach itself without consuming "
                                              "a character (a repetition of something that may be empty?)",
                                              names_[q]));
        if (color[q] == 0) {
          color[q] = 1;
          path.emplace_back(q, 0);
        }
      }
    }
  }

  void flatten() {
    Grammar& g = *g_;
    g.rule_names_ = names_;
    g.rule_alts_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (const Seq& alt : rules_[r]) {
        g.rule_alts_[r].push_back((uint32_t)g.elems_.size());
        g.elems_.insert(g.elems_.end(), alt.begin(), alt.end());
        g.elems_.push_back({Grammar::Kind::end, 0});
      }
    std::vector<uint32_t> buf(8);
    for (uint32_t a : g.rule_alts_[ids_.at("root")]) {
      if (g.elems_[a].kind == Grammar::Kind::end) {
        g.expand(buf, 0, g.initial_);
      } else {
        buf[0] = a;
        g.expand(buf, 1, g.initial_);
      }
    }
    g.canonicalize(g.initial_);
  }

  std::string_view src_;
  size_t pos_ = 0;
  Grammar* g_ = nullptr;
  std::map<std::string, uint32_t> ids_;
  std::vector<Alts> rules_;
  std::vector<bool> defined_;
  std::vector<std::string> names_;
  std::vector<size_t> first_use_;
  int generated_ = 0;
  size_t total_ = 0;  // symbols added by repetitions
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf) {
  auto g = GrammarParser(gbnf).run();
  const_cast<Grammar&>(*g).source_ = std::string(gbnf);
  return g;
}

}  // namespace xpert
