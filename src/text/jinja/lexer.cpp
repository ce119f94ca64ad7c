#include "text/jinja/lexer.h"

#include <cctype>

#include "base/error.h"

namespace xpert::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

void rstrip_all(std::string& s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  s.resize(n);
}

void lstrip_all(std::string& s) {
  size_t n = 0;
  while (n < s.size() && is_space(s[n])) ++n;
  s.erase(0, n);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& o) : src_(std::move(source)), opt_(o) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-'
    bool trim_next = false;   // the previous tag was a block or comment without '+': drop one newline
    while (true) {
      const size_t tag = find_tag(pos);
      std::string data = src_.substr(pos, (tag == std::string::npos ? src_.size() : tag) - pos);
      if (trim_next && !data.empty() && data[0] == '\n') data.erase(0, 1);
      if (strip_next) lstrip_all(data);
      if (tag == std::string::npos) {
        push_text(std::move(data), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        rstrip_all(data);
      } else if (kind != '{' && modifier != '+' && opt_.lstrip_blocks) {
        size_t k = tag;
        while (k > pos && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
        if ((k > pos && src_[k - 1] == '\n') || k == 0)
          data.resize(data.size() - std::min(data.size(), tag - k));
      }
      push_text(std::move(data), pos);
      size_t body = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", body);
        if (close == std::string::npos) fail("line {}: unterminated comment", line_of(tag));
        strip_next = close > body && src_[close - 1] == '-';
        trim_next = opt_.trim_blocks && !(close > body && src_[close - 1] == '+');
        pos = close + 2;
      } else {
        const bool is_expr = kind == '{';
        const size_t first = tokens_.size();
        tokens_.push_back(
            Token{is_expr ? TokenKind::expr_begin : TokenKind::stmt_begin, "", 0, 0, line_of(tag)});
        char end_modifier = '\0';
        pos = lex_tag(body, is_expr, end_modifier);
        strip_next = end_modifier == '-';
        trim_next = !is_expr && opt_.trim_blocks && end_modifier != '+';
        if (!is_expr && tokens_.size() == first + 3 && tokens_[first + 1].kind == TokenKind::name &&
            tokens_[first + 1].text == "raw") {
          tokens_.resize(first);
          pos = lex_raw(pos, strip_next, trim_next);
        }
      }
    }
    tokens_.push_back(Token{TokenKind::end, "", 0, 0, line_of(src_.size())});
    return std::move(tokens_);
  }

  void prepare() {
    // Jinja normalizes every newline to \n and drops one trailing newline of the source.
    std::string norm;
    norm.reserve(src_.size());
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\r') {
        norm += '\n';
        if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
      } else {
        norm += src_[i];
      }
    }
    if (!opt_.keep_trailing_newline && !norm.empty() && norm.back() == '\n') norm.pop_back();
    src_ = std::move(norm);
  }

 private:
  size_t find_tag(size_t pos) const {
    while (true) {
      pos = src_.find('{', pos);
      if (pos == std::string::npos || pos + 1 >= src_.size()) return std::string::npos;
      const char c = src_[pos + 1];
      if (c == '{' || c == '%' || c == '#') return pos;
      ++pos;
    }
  }

  int line_of(size_t pos) {
    pos = std::min(pos, src_.size());
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos; ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  void push_text(std::string data, size_t pos) {
    if (!data.empty()) tokens_.push_back(Token{TokenKind::text, std::move(data), 0, 0, line_of(pos)});
  }

  // Lexes the inside of {{ }} or {% %} starting at `pos`; returns the position after the closing
  // delimiter. Closing delimiters inside brackets do not count (as in Jinja: `{{ {'a': {'b': 1}} }}`).
  size_t lex_tag(size_t pos, bool is_expr, char& end_modifier) {
    const char closer = is_expr ? '}' : '%';
    int depth = 0;
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) fail("line {}: unterminated tag: expected '{}}}'", line_of(pos), closer);
      const int line = line_of(pos);
      const char c = src_[pos];
      if (depth == 0) {
        for (char m : {'-', '+', '\0'}) {
          const size_t at = pos + (m ? 1 : 0);
          if ((m == '\0' || c == m) && at + 1 < src_.size() && src_[at] == closer && src_[at + 1] == '}') {
            if (m == '+' && is_expr) continue;
            end_modifier = m;
            tokens_.push_back(Token{is_expr ? TokenKind::expr_end : TokenKind::stmt_end, "", 0, 0, line});
            return at + 2;
          }
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos;
        while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
          ++end;
        tokens_.push_back(Token{TokenKind::name, src_.substr(pos, end - pos), 0, 0, line});
        pos = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = lex_number(pos, line);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos, line);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                           "{",  "}",  ",",  ".",  ":",  "|",  "=", ";"};
        std::string_view rest(src_.data() + pos, src_.size() - pos);
        const char* match = nullptr;
        for (const char* op : kOps) {
          if (rest.substr(0, std::char_traits<char>::length(op)) == op) {
            match = op;
            break;
          }
        }
        if (!match) fail("line {}: unexpected character '{}' in tag", line, c);
        if (*match == '(' || *match == '[' || *match == '{') ++depth;
        if ((*match == ')' || *match == ']' || *match == '}') && depth > 0) --depth;
        tokens_.push_back(Token{TokenKind::op, match, 0, 0, line});
        pos += std::char_traits<char>::length(match);
      }
    }
  }

  size_t lex_number(size_t pos, int line) {
    auto digits = [&](size_t p) {
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) ||
                                 (src_[p] == '_' && p + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[p + 1]))))) {
        ++p;
      }
      return p;
    };
    size_t end = digits(pos);
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      end = digits(end + 1);
      is_float = true;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        end = digits(e);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t{is_float ? TokenKind::floating : TokenKind::integer, text, 0, 0, line};
    try {
      if (is_float) {
        t.float_value = std::stod(text);
      } else {
        t.int_value = std::stoll(text);
      }
    } catch (const std::exception&) {
      fail("line {}: number out of range: {}", line, text);
    }
    tokens_.push_back(std::move(t));
    return end;
  }

  size_t lex_string(size_t pos, int line) {
    const char quote = src_[pos];
    std::string out;
    size_t i = pos + 1;
    for (; i < src_.size() && src_[i] != quote; ++i) {
      if (src_[i] != '\\' || i + 1 >= src_.size()) {
        out += src_[i];
        continue;
      }
      const char e = src_[++i];
      auto hex = [&](int n) {
        if (i + static_cast<size_t>(n) >= src_.size())
          fail("line {}: truncated \\x/\\u escape in string", line);
        uint32_t v = 0;
        for (int k = 1; k <= n; ++k) {
          const char h = src_[i + static_cast<size_t>(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail("line {}: bad escape in string literal", line);
          v = v * 16 + static_cast<uint32_t>(
                           std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        i += static_cast<size_t>(n);
        append_utf8(out, v);
      };
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '0':
          out += '\0';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:
          out += '\\';
          out += e;
      }
    }
    if (i >= src_.size()) fail("line {}: unterminated string literal", line);
    tokens_.push_back(Token{TokenKind::string, std::move(out), 0, 0, line});
    return i + 1;
  }

  // Text up to {% endraw %}, verbatim; returns the position after the endraw tag.
  size_t lex_raw(size_t pos, bool& strip_next, bool& trim_next) {
    size_t search = pos;
    while (true) {
      const size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) fail("line {}: {{% raw %}} without {{% endraw %}}", line_of(pos));
      size_t p = tag + 2;
      const char modifier = p < src_.size() ? src_[p] : '\0';
      if (modifier == '-' || modifier == '+') ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char end_modifier = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_modifier = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) fail("line {}: malformed {{% endraw %}}", line_of(tag));
      std::string data = src_.substr(pos, tag - pos);
      if (trim_next && !data.empty() && data[0] == '\n') data.erase(0, 1);
      if (strip_next) lstrip_all(data);
      if (modifier == '-') rstrip_all(data);
      push_text(std::move(data), pos);
      strip_next = end_modifier == '-';
      trim_next = opt_.trim_blocks && end_modifier != '+';
      return p + 2;
    }
  }

  std::string src_;
  LexOptions opt_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  Lexer lexer{std::string(source), options};
  lexer.prepare();
  return lexer.run();
}

}  // namespace xpert::jinja
