// Pieces of the JSON-schema converter shared by its files (json_schema.cpp, json_schema_strings.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpert {

// A GBNF literal for the bytes (quotes, backslashes and control characters escaped).
std::string gbnf_literal(std::string_view s);
// A GBNF expression for the integers in [lo, hi] (absent: unbounded), no leading zeros, parenthesized.
std::string gbnf_int_range(std::optional<int64_t> lo, std::optional<int64_t> hi);
// A bound of a number: magnitude m.frac (frac: fraction digits without trailing zeros), strict for
// the exclusive keywords; negative for bounds below 0.
struct DecimalBound {
  int64_t m = 0;
  std::string frac;
  bool strict = false;
};
struct Decimal {
  bool negative = false;
  DecimalBound magnitude;
};
// A bound from JSON number text (nlohmann's dump); nullopt beyond 15 integer or 16 fraction digits.
std::optional<Decimal> parse_decimal(const std::string& json_number, bool strict);
// A GBNF expression for the JSON numbers (optional fraction, no exponent) in [lo, hi], each end
// inclusive or strict; nullopt when none.
std::optional<std::string> gbnf_decimal_range(std::optional<Decimal> lo, std::optional<Decimal> hi);
// The code points of UTF-8 text (invalid bytes are taken as Latin-1).
std::vector<uint32_t> utf8_code_points(std::string_view s);
// The inside of a JSON string (between its quotes) in a string format; "" for a format not supported.
std::string format_gbnf(const std::string& format);
const char* supported_formats();
// The inside of a JSON string whose decoded text matches the regular expression (searched, as JSON
// Schema's `pattern`: unanchored unless it starts with ^ / ends with $). Throws Error for syntax it does
// not support.
std::string regex_to_gbnf(const std::string& pattern);

}  // namespace xpert
