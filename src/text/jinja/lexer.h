// Template source -> tokens. Applies Jinja's whitespace rules as Hugging Face configures them
// (trim_blocks and lstrip_blocks on, keep_trailing_newline off), plus `-` / `+` tag modifiers, so the
// parser sees text exactly as it will print. Comments and {% raw %} are resolved here.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xpert::jinja {

enum class TokenKind : uint8_t {
  text,        // literal template text (whitespace control already applied)
  expr_begin,  // {{
  expr_end,    // }}
  stmt_begin,  // {%
  stmt_end,    // %}
  name,        // identifier or keyword
  string,      // string literal, escapes decoded
  integer,
  floating,
  op,   // operator or punctuation: + - * / // % ** ~ == != < <= > >= ( ) [ ] { } , . : | =
  end,  // end of the source
};

struct Token {
  TokenKind kind = TokenKind::end;
  std::string text;  // text, name, string value, operator spelling
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws xpert::Error ("line N: ...") for unterminated tags, strings or comments.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace xpert::jinja
