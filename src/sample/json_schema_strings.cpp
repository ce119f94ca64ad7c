// String formats and `pattern` (a regular expression) as the GBNF of a JSON string's inside. The grammar
// writes the JSON encoding: a quote or backslash that the decoded text holds is written escaped, control
// characters are never generated (the generated strings are a subset of those that match).
#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "sample/json_schema_internal.h"

namespace xpert {

std::vector<uint32_t> utf8_code_points(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = (unsigned char)s[i];
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; ok && k < len; ++k) {
      const auto b = (unsigned char)s[i + k];
      ok = (b & 0xC0) == 0x80;
      cp = cp << 6 | (b & 0x3F);
    }
    if (!ok) {
      out.push_back(c);
      ++i;
    } else {
      out.push_back(cp);
      i += len;
    }
  }
  return out;
}

namespace {

const char* kDate =
    R"G([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))G";
const char* kTime =
    R"G(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))G";
const char* kLabel = R"G([a-z0-9] ( [a-z0-9-]{0,20} [a-z0-9] )?)G";

}  // namespace

const char* supported_formats() { return "date, time, date-time, uuid, email, hostname, ipv4, uri"; }

std::string format_gbnf(const std::string& format) {
  const std::string host = fmt::format("{} ( \".\" {} ){{0,3}} \".\" [a-z]{{2,6}}", kLabel, kLabel);
  if (format == "date") return fmt::format("( {} )", kDate);
  if (format == "time") return fmt::format("( {} )", kTime);
  if (format == "date-time") return fmt::format("( {} ) \"T\" ( {} )", kDate, kTime);
  if (format == "uuid")
    return R"G([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})G";
  if (format == "email") return fmt::format("[a-zA-Z0-9_+-]{{1,32}} ( \".\" [a-zA-Z0-9_+-]{{1,32}} ){{0,3}} \"@\" {}", host);
  if (format == "hostname") return host;
  if (format == "ipv4") {
    const char* octet = R"G(( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] ))G";
    return fmt::format("{} \".\" {} \".\" {} \".\" {}", octet, octet, octet, octet);
  }
  if (format == "uri")
    return fmt::format("\"http\" \"s\"? \"://\" {} ( \"/\" [a-zA-Z0-9._~-]{{1,30}} ){{0,6}} \"/\"?", host);
  return "";
}

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

std::string cp_class_item(uint32_t c) { return fmt::format("\\U{:08X}", c); }

// [lo, hi] minus [a, b], for every range.
Ranges subtract(const Ranges& in, uint32_t a, uint32_t b) {
  Ranges out;
  for (auto [lo, hi] : in) {
    if (hi < a || lo > b) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < a) out.emplace_back(lo, a - 1);
    if (hi > b) out.emplace_back(b + 1, hi);
  }
  return out;
}

bool contains(const Ranges& r, uint32_t c) {
  return std::any_of(r.begin(), r.end(), [&](auto x) { return c >= x.first && c <= x.second; });
}

class RegexConverter {
 public:
  explicit RegexConverter(const std::string& pattern) : p_(utf8_code_points(pattern)) {}

  std::string run() {
    bool start = false, end = false;
    size_t lo = 0, hi = p_.size();
    if (hi > 0 && p_[0] == '^') start = true, lo = 1;
    if (hi > lo && p_[hi - 1] == '$' && !(hi >= 2 && p_[hi - 2] == '\\')) end = true, --hi;
    p_ = std::vector<uint32_t>(p_.begin() + (ptrdiff_t)lo, p_.begin() + (ptrdiff_t)hi);
    bool top_alt = false;
    std::string body = alternatives(0, &top_alt);
    if (i_ != p_.size()) fail("pattern: unbalanced ')'");
    if (top_alt && (start || end)) fail("pattern: '|' at the top level together with ^ or $ is not supported; group it: ^(a|b)$");
    if (start && end) return "( " + body + " )";
    return fmt::format("{}( {} ){}", start ? "" : "char* ", body, end ? "" : " char*");
  }

 private:
  bool at_end() const { return i_ >= p_.size(); }

  std::string alternatives(int depth, bool* top_alt) {
    std::string out = sequence(depth);
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      if (top_alt) *top_alt = true;
      out += " | " + sequence(depth);
    }
    return out;
  }

  std::string sequence(int depth) {
    std::string out;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      std::string atom = this->atom(depth);
      atom = quantified("( " + atom + " )");
      out += (out.empty() ? "" : " ") + atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  int number() {
    int v = 0, n = 0;
    while (!at_end() && p_[i_] >= '0' && p_[i_] <= '9' && n < 6) v = v * 10 + (int)(p_[i_++] - '0'), ++n;
    return n ? v : -1;
  }

  std::string quantified(const std::string& atom) {
    if (at_end()) return atom;
    const uint32_t c = p_[i_];
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      q = std::string(1, (char)c);
    } else if (c == '{') {
      const size_t save = i_++;
      const int m = number();
      int n = m;
      if (m >= 0 && !at_end() && p_[i_] == ',') {
        ++i_;
        n = number();  // -1: unbounded
      }
      if (m < 0 || at_end() || p_[i_] != '}') {
        i_ = save;  // not a quantifier: a literal '{'
        return atom;
      }
      ++i_;
      q = n < 0 ? fmt::format("{{{},}}", m) : fmt::format("{{{},{}}}", m, n);
    } else {
      return atom;
    }
    if (!at_end() && p_[i_] == '?') ++i_;  // lazy: the same strings
    if (!at_end() && (p_[i_] == '+' || p_[i_] == '*' || p_[i_] == '{'))
      fail("pattern: a quantifier after a quantifier is not supported");
    return atom + q;
  }

  // A character the decoded text holds, as its JSON encoding.
  static std::string literal(uint32_t c) {
    if (c == '"') return R"G("\\\"")G";
    if (c == '\\') return R"G("\\\\")G";
    if (c == '\n') return R"G("\\n")G";
    if (c == '\t') return R"G("\\t")G";
    if (c == '\r') return R"G("\\r")G";
    if (c < 0x20) return fmt::format("\"\\\\u{:04x}\"", c);
    return "[" + cp_class_item(c) + "]";
  }

  // A set of characters as JSON text: plain characters from a class, quote and backslash escaped.
  static std::string set(const Ranges& r, bool negated) {
    std::vector<std::string> alts;
    if (negated) {
      std::string cls = "[^\"\\\\\\x00-\\x1f";
      for (auto [lo, hi] : r) cls += cp_class_item(lo) + "-" + cp_class_item(hi);
      alts.push_back(cls + "]");
      if (!contains(r, '"')) alts.push_back(literal('"'));
      if (!contains(r, '\\')) alts.push_back(literal('\\'));
    } else {
      Ranges plain = subtract(subtract(subtract(r, 0, 0x1f), '"', '"'), '\\', '\\');
      if (!plain.empty()) {
        std::string cls = "[";
        for (auto [lo, hi] : plain) cls += cp_class_item(lo) + "-" + cp_class_item(hi);
        alts.push_back(cls + "]");
      }
      if (contains(r, '"')) alts.push_back(literal('"'));
      if (contains(r, '\\')) alts.push_back(literal('\\'));
      for (uint32_t c : {'\n', '\t', '\r'})
        if (contains(r, c)) alts.push_back(literal(c));
      if (alts.empty()) fail("pattern: a class holds only control characters");
    }
    std::string out;
    for (const auto& a : alts) out += (out.empty() ? "" : " | ") + a;
    return out;
  }

  static Ranges digits() { return {{'0', '9'}}; }
  static Ranges word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
  static Ranges space() { return {{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}; }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (at_end()) fail("pattern: a \\x or \\u escape needs hex digits");
      const uint32_t c = p_[i_++];
      int d = c >= '0' && c <= '9' ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10) : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
      if (d < 0) fail("pattern: a \\x or \\u escape needs hex digits");
      v = v * 16 + (uint32_t)d;
    }
    return v;
  }

  // After a backslash: a class escape (into `r`, true; `negated` set for \D \W \S) or one character.
  bool escape(uint32_t& c, Ranges& r, bool& negated) {
    if (at_end()) fail("pattern: it ends with a lone backslash");
    c = p_[i_++];
    negated = false;
    switch (c) {
      case 'd': r = digits(); return true;
      case 'w': r = word(); return true;
      case 's': r = space(); return true;
      case 'D': r = digits(), negated = true; return true;
      case 'W': r = word(), negated = true; return true;
      case 'S': r = space(), negated = true; return true;
      case 'n': c = '\n'; return false;
      case 't': c = '\t'; return false;
      case 'r': c = '\r'; return false;
      case 'f': c = '\f'; return false;
      case 'v': c = '\v'; return false;
      case '0': c = 0; return false;
      case 'x': c = hex(2); return false;
      case 'u': c = hex(4); return false;
      default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))
      throw Error(fmt::format("pattern: the escape \\{} (word boundaries, back references, ...) is not supported", (char)c));
    return false;
  }

  std::string char_class() {
    ++i_;  // [
    bool negated = false;
    if (!at_end() && p_[i_] == '^') negated = true, ++i_;
    Ranges r;
    bool first = true;
    while (!at_end() && (p_[i_] != ']' || first)) {
      first = false;
      uint32_t lo = p_[i_++];
      if (lo == '\\') {
        Ranges sub;
        bool neg = false;
        if (escape(lo, sub, neg)) {
          if (neg) fail("pattern: \\D \\W \\S inside a class are not supported");
          r.insert(r.end(), sub.begin(), sub.end());
          continue;
        }
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        hi = p_[i_++];
        if (hi == '\\') {
          Ranges sub;
          bool neg = false;
          if (escape(hi, sub, neg)) fail("pattern: a class escape cannot end a range");
        }
        if (hi < lo) fail("pattern: a reversed range in a class");
      }
      r.emplace_back(lo, hi);
    }
    if (at_end()) fail("pattern: unterminated '['");
    ++i_;  // ]
    return set(r, negated);
  }

  std::string atom(int depth) {
    const uint32_t c = p_[i_];
    if (c == '(') {
      ++i_;
      if (!at_end() && p_[i_] == '?') {
        ++i_;
        if (!at_end() && p_[i_] == ':') {
          ++i_;
        } else if (!at_end() && (p_[i_] == '<' || p_[i_] == 'P') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          while (!at_end() && p_[i_] != '>') ++i_;  // a named group
          ++i_;
        } else {
          fail("pattern: lookaround groups (?=...) (?!...) are not supported");
        }
      }
      if (depth > 50) fail("pattern: groups nested too deep");
      std::string inner = alternatives(depth + 1, nullptr);
      if (at_end() || p_[i_] != ')') fail("pattern: unbalanced '('");
      ++i_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      return set({{'\n', '\n'}, {'\r', '\r'}}, true);
    }
    if (c == '^' || c == '$') fail("pattern: ^ and $ are supported only at its start and end");
    if (c == '*' || c == '+' || c == '?') throw Error(fmt::format("pattern: '{}' follows nothing", (char)c));
    ++i_;
    if (c == '\\') {
      uint32_t ch = 0;
      Ranges r;
      bool negated = false;
      if (escape(ch, r, negated)) return set(r, negated);
      return literal(ch);
    }
    return literal(c);
  }

  std::vector<uint32_t> p_;
  size_t i_ = 0;
};

}  // namespace

std::string regex_to_gbnf(const std::string& pattern) { return RegexConverter(pattern).run(); }

}  // namespace xpert
