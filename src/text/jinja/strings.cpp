#include "text/jinja/strings.h"

#include <algorithm>
#include <cctype>

#include "text/jinja/value.h"

namespace xpert::jinja::pystr {
namespace {

bool is_ascii_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
char to_upper(char c) { return static_cast<char>(std::toupper(static_cast<unsigned char>(c))); }
char to_lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

}  // namespace

bool is_space(std::string_view ch) {
  if (ch.size() == 1) {
    const auto c = static_cast<unsigned char>(ch[0]);
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  }
  static const char* const kSpaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003",
                                        "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
                                        "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  return std::any_of(std::begin(kSpaces), std::end(kSpaces), [&](const char* s) { return ch == s; });
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string_view> cs = utf8_chars(s);
  const std::vector<std::string_view> set = chars ? utf8_chars(*chars) : std::vector<std::string_view>{};
  auto strippable = [&](std::string_view ch) {
    return chars ? std::find(set.begin(), set.end(), ch) != set.end() : is_space(ch);
  };
  size_t b = 0, e = cs.size();
  if (left) {
    while (b < e && strippable(cs[b])) ++b;
  }
  if (right) {
    while (e > b && strippable(cs[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out.append(cs[i]);
  return out;
}

std::vector<std::string> split(std::string_view s, const std::string* sep, long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) raise("split(): empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<std::string_view> cs = utf8_chars(s);
  size_t i = 0;
  while (true) {
    while (i < cs.size() && is_space(cs[i])) ++i;
    if (i == cs.size()) break;
    std::string word;
    if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) {
      for (; i < cs.size(); ++i) word.append(cs[i]);
      // the remainder keeps its inner whitespace but loses trailing whitespace
      out.push_back(strip(word, nullptr, false, true));
      break;
    }
    for (; i < cs.size() && !is_space(cs[i]); ++i) word.append(cs[i]);
    out.push_back(std::move(word));
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string& sep, long maxsplit) {
  if (sep.empty()) raise("rsplit(): empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string_view::npos) break;
    out.emplace_back(s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, long count) {
  std::string out;
  if (from.empty()) {
    long n = 0;
    for (std::string_view ch : utf8_chars(s)) {
      if (count < 0 || n < count) {
        out.append(to);
        ++n;
      }
      out.append(ch);
    }
    if (count < 0 || n < count) out.append(to);
    return out;
  }
  size_t start = 0;
  long n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(to);
    start = at + from.size();
    ++n;
  }
  out.append(s.substr(start));
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_upper(c);
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_lower(c);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = is_ascii_alpha(c);
    c = alpha ? (prev_cased ? to_lower(c) : to_upper(c)) : c;
    // non-ASCII bytes count as cased letters' continuation: leave them and keep the state
    if (static_cast<unsigned char>(c) < 0x80) prev_cased = alpha;
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool boundary = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
                          c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (boundary) {
      out += c;
      word_start = true;
    } else {
      out += word_start ? to_upper(c) : to_lower(c);
      word_start = false;
    }
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

long find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t at = reverse ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<long>(utf8_length(s.substr(0, at)));
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace xpert::jinja::pystr
