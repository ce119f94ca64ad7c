// Numbers between decimal bounds for the JSON-schema converter: minimum / maximum /
// exclusiveMinimum / exclusiveMaximum with fractions (0.5, 2.25, -1.75), exactly. A number is taken as
// its integer part m and its fraction digits F (m.F, "m" alone is F empty); F compares with a bound's
// fraction digits as decimals (F padded with zeros), which is a small recursion over the bound's digits.
#include <fmt/format.h>

#include <optional>
#include <vector>

#include "sample/json_schema_internal.h"

namespace xpert {

namespace {

using Lang = std::optional<std::string>;  // a GBNF expression; nullopt: no string at all

const char* kAnyDigits = "[0-9]{0,15}";
const char* kNonZero = "\"0\"{0,15} [1-9] [0-9]{0,15}";  // digit strings worth more than 0

std::string digits(char lo, char hi) {
  return lo == hi ? fmt::format("\"{}\"", lo) : fmt::format("[{}-{}]", lo, hi);
}

Lang alt(const std::vector<Lang>& parts) {
  std::string out;
  for (const Lang& p : parts)
    if (p) out += (out.empty() ? "( " : " | ") + *p;
  if (out.empty()) return std::nullopt;
  return out + " )";
}

Lang then(char c, const Lang& rest) {
  if (!rest) return std::nullopt;
  return fmt::format("\"{}\" {}", c, rest->empty() ? "" : *rest);
}

Lang optional(const Lang& l) { return l ? Lang("( " + *l + " )?") : Lang(""); }

// Non-empty digit strings F with F >= B (F > B when strict); B has no trailing zeros.
Lang above(const std::string& b, bool strict);
// Non-empty digit strings F with F <= B (F < B when strict).
Lang below(const std::string& b, bool strict);

// Possibly empty digit strings (the empty one is worth 0).
Lang above_all(const std::string& b, bool strict) {
  if (b.empty()) return strict ? Lang(kNonZero) : optional(Lang(kAnyDigits));
  return above(b, strict);  // b is worth more than 0: the empty string is below it
}
Lang below_all(const std::string& b, bool strict) {
  if (b.empty()) return strict ? std::nullopt : Lang("\"0\"{0,15}");
  return optional(below(b, strict));
}

Lang above(const std::string& b, bool strict) {
  if (b.empty()) return strict ? Lang(kNonZero) : Lang("[0-9]{1,16}");
  const char d = b[0];
  return alt({d < '9' ? Lang(digits(d + 1, '9') + " " + kAnyDigits) : std::nullopt,
              then(d, above_all(b.substr(1), strict))});
}

Lang below(const std::string& b, bool strict) {
  if (b.empty()) return strict ? std::nullopt : Lang("\"0\"{1,16}");
  const char d = b[0];
  return alt({d > '0' ? Lang(digits('0', d - 1) + " " + kAnyDigits) : std::nullopt,
              then(d, below_all(b.substr(1), strict))});
}

// Digit strings between lo and hi (lo <= hi as decimals); possibly empty unless `nonempty`.
Lang between_all(const std::string& lo, bool lo_strict, const std::string& hi, bool hi_strict, bool nonempty = false) {
  if (lo.empty()) {
    // F >= 0 always; F > 0 excludes the zeros.
    if (!lo_strict) return nonempty ? below(hi, hi_strict) : below_all(hi, hi_strict);
    if (hi.empty()) return std::nullopt;
    const char h = hi[0];
    // Non-zero strings below hi: a smaller first digit and anything non-zero after it, or hi's first digit.
    return alt({h > '1' ? Lang(digits('1', h - 1) + " " + kAnyDigits) : std::nullopt,
                h > '0' ? Lang(std::string("\"0\" ") + kNonZero) : std::nullopt,
                h > '0' ? then(h, below_all(hi.substr(1), hi_strict))
                        : then('0', between_all("", true, hi.substr(1), hi_strict))});
  }
  const char l = lo[0], h = hi.empty() ? '0' : hi[0];
  const std::string lr = lo.substr(1), hr = hi.empty() ? "" : hi.substr(1);
  if (l == h) return then(l, between_all(lr, lo_strict, hr, hi_strict));
  return alt({then(l, above_all(lr, lo_strict)), h - l > 1 ? Lang(digits(l + 1, h - 1) + " " + kAnyDigits) : std::nullopt,
              then(h, below_all(hr, hi_strict))});
}

// "." F for the non-empty fraction digit strings `ne`; optional where no fraction (F empty) is allowed.
Lang fraction(const Lang& ne, bool empty_ok) {
  if (!ne) return empty_ok ? Lang("") : std::nullopt;
  const std::string f = "\".\" " + *ne;
  return empty_ok ? Lang("( " + f + " )?") : Lang(f);
}

// Non-negative m.F in [lo, hi] (hi absent: unbounded).
Lang nonneg(const DecimalBound& lo, const std::optional<DecimalBound>& hi) {
  auto int_part = [](int64_t a, int64_t b) { return gbnf_int_range(a, b); };
  auto rest_above = [&](const DecimalBound& x) {  // m == x.m: fraction above x's
    return fraction(above(x.frac, x.strict), x.frac.empty() && !x.strict);
  };
  auto rest_below = [&](const DecimalBound& x) {
    return fraction(below(x.frac, x.strict), !(x.frac.empty() && x.strict));
  };
  const std::string any_frac = "( \".\" [0-9]{1,16} )?";
  std::vector<Lang> parts;
  if (!hi) {
    parts.push_back(gbnf_int_range(lo.m + 1, std::nullopt) + " " + any_frac);
    const Lang r = rest_above(lo);
    if (r) parts.push_back(fmt::format("\"{}\" {}", lo.m, *r));
    return alt(parts);
  }
  if (lo.m < hi->m) {
    if (const Lang r = rest_above(lo)) parts.push_back(fmt::format("\"{}\" {}", lo.m, *r));
    if (hi->m - lo.m > 1) parts.push_back(int_part(lo.m + 1, hi->m - 1) + " " + any_frac);
    if (const Lang r = rest_below(*hi)) parts.push_back(fmt::format("\"{}\" {}", hi->m, *r));
    return alt(parts);
  }
  const bool zero_ok = !lo.strict && lo.frac.empty() && !(hi->strict && hi->frac.empty());
  const Lang r = fraction(between_all(lo.frac, lo.strict, hi->frac, hi->strict, /*nonempty=*/true), zero_ok);
  if (!r) return std::nullopt;
  return fmt::format("\"{}\" {}", lo.m, *r);
}

bool less(const DecimalBound& a, const DecimalBound& b) {  // as values, ignoring strictness
  if (a.m != b.m) return a.m < b.m;
  return a.frac < b.frac;  // no trailing zeros: lexicographic order is numeric order
}

}  // namespace

std::optional<std::string> gbnf_decimal_range(std::optional<Decimal> lo, std::optional<Decimal> hi) {
  std::vector<Lang> parts;
  // x >= 0: m.F in [max(lo, 0), hi].
  if (!hi || !hi->negative) {
    DecimalBound l{0, "", false};
    if (lo && !lo->negative) l = lo->magnitude;
    const std::optional<DecimalBound> h = hi ? std::optional(hi->magnitude) : std::nullopt;
    if (!h || !less(*h, l)) parts.push_back(nonneg(l, h));
  }
  // x < 0: "-" m.F with m.F in [max(-hi, 0), -lo], m.F > 0.
  if (!lo || lo->negative) {
    DecimalBound l{0, "", true};
    if (hi && hi->negative) l = hi->magnitude;
    const std::optional<DecimalBound> h = lo ? std::optional(lo->magnitude) : std::nullopt;
    if (!h || !less(*h, l)) {
      const Lang n = nonneg(l, h);
      if (n) parts.push_back("\"-\" " + *n);
    }
  }
  return alt(parts);
}

std::optional<Decimal> parse_decimal(const std::string& json_number, bool strict) {
  // nlohmann's dump: -?digits(.digits)?(e[+-]digits)?
  std::string s = json_number;
  Decimal d;
  if (!s.empty() && s[0] == '-') {
    d.negative = true;
    s.erase(0, 1);
  }
  int exp = 0;
  if (const size_t e = s.find_first_of("eE"); e != std::string::npos) {
    exp = std::stoi(s.substr(e + 1));
    s.resize(e);
  }
  std::string ip = s, fp;
  if (const size_t dot = s.find('.'); dot != std::string::npos) {
    ip = s.substr(0, dot);
    fp = s.substr(dot + 1);
  }
  std::string all = ip + fp;  // digits; the point after ip.size() + exp of them
  int point = (int)ip.size() + exp;
  if (point < 0) {
    all.insert(0, (size_t)-point, '0');
    point = 0;
  }
  if ((int)all.size() < point) all.append((size_t)point - all.size(), '0');
  ip = all.substr(0, (size_t)point);
  fp = all.substr((size_t)point);
  while (!fp.empty() && fp.back() == '0') fp.pop_back();
  while (ip.size() > 1 && ip[0] == '0') ip.erase(0, 1);
  if (ip.empty()) ip = "0";
  if (ip.size() > 15 || fp.size() > 16) return std::nullopt;
  d.magnitude = {std::stoll(ip), fp, strict};
  if (d.magnitude.m == 0 && fp.empty()) d.negative = false;  // -0 is 0
  return d;
}

}  // namespace xpert
