// JSON schema -> grammar, checked exactly where a brute force is cheap: integer and number bounds over
// every value in a window, enum/const literals, and the generic json_object grammar. (Random sentences of
// many schemas are validated by python's jsonschema in tests/cli/test_json_schema.py.)
#include <gtest/gtest.h>

#include <cmath>

#include "sample/grammar.h"
#include "sample/json_schema.h"

namespace xpert {
namespace {

using json = nlohmann::ordered_json;

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.complete();
}

TEST(JsonSchema, IntegerBoundsExactlyOverAWindow) {
  const std::vector<std::pair<json, json>> bounds = {
      {7, 1234}, {-250, -3}, {-20, 20}, {99, nullptr}, {nullptr, -5}, {0, 0}, {-1000, 999}, {1, 10}, {100, 199}};
  for (auto& [lo, hi] : bounds) {
    json s = {{"type", "integer"}};
    if (!lo.is_null()) s["minimum"] = lo;
    if (!hi.is_null()) s["maximum"] = hi;
    const auto g = Grammar::parse(json_schema_to_gbnf(s));
    for (int v = -1300; v <= 1300; ++v) {
      const bool want = (lo.is_null() || v >= lo.get<int>()) && (hi.is_null() || v <= hi.get<int>());
      ASSERT_EQ(matches(g, std::to_string(v)), want) << s.dump() << " " << v;
    }
    EXPECT_FALSE(matches(g, "007"));
    EXPECT_FALSE(matches(g, "-0"));
  }
}

TEST(JsonSchema, NumberBoundsOverAWindow) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 1}, {-3, 2}, {-10, -2}, {5, 9}}) {
    const auto g = Grammar::parse(json_schema_to_gbnf({{"type", "number"}, {"minimum", lo}, {"maximum", hi}}));
    for (int tenths = -120; tenths <= 120; ++tenths) {
      const double v = tenths / 10.0;
      std::string text = (tenths < 0 ? "-" : "") + std::to_string(std::abs(tenths) / 10) + "." +
                         std::to_string(std::abs(tenths) % 10);
      ASSERT_EQ(matches(g, text), v >= lo && v <= hi) << lo << " " << hi << " " << text;
    }
  }
}

// Fractional and exclusive bounds, exactly: every number with up to 3 decimals in a window, written
// with 0-3 fraction digits (trailing zeros too), against the bounds compared in thousandths.
TEST(JsonSchema, FractionalAndExclusiveNumberBounds) {
  struct Case {
    json lo, hi;
    bool lo_excl, hi_excl;
  };
  const std::vector<Case> cases = {
      {0.5, 2.25, false, false}, {0.5, 2.25, true, true},   {-1.75, 0.3, false, true}, {-2.5, -0.125, true, false},
      {0.25, 0.75, false, false}, {0.25, 0.75, true, true}, {0, 0.05, true, false},    {-0.05, 0, false, true},
      {1.5, nullptr, true, false}, {nullptr, -0.5, false, false}, {-1, 1, true, true}, {0.125, 0.125, false, false}};
  for (const Case& c : cases) {
    json s = {{"type", "number"}};
    if (!c.lo.is_null()) s[c.lo_excl ? "exclusiveMinimum" : "minimum"] = c.lo;
    if (!c.hi.is_null()) s[c.hi_excl ? "exclusiveMaximum" : "maximum"] = c.hi;
    const auto g = Grammar::parse(json_schema_to_gbnf(s));
    const auto k = [](const json& v) { return (long)std::lround(v.get<double>() * 1000); };
    for (long t = -3000; t <= 3000; ++t) {  // thousandths
      const bool want = (c.lo.is_null() || (c.lo_excl ? t > k(c.lo) : t >= k(c.lo))) &&
                        (c.hi.is_null() || (c.hi_excl ? t < k(c.hi) : t <= k(c.hi)));
      const long a = std::labs(t);
      const std::string sign = t < 0 ? "-" : "", ip = std::to_string(a / 1000);
      char frac[4];
      std::snprintf(frac, sizeof frac, "%03ld", a % 1000);
      std::string f = frac;
      std::vector<std::string> texts = {sign + ip + "." + f, sign + ip + "." + f + "0"};
      while (!f.empty() && f.back() == '0') f.pop_back();
      texts.push_back(f.empty() ? sign + ip : sign + ip + "." + f);
      for (const std::string& text : texts)
        ASSERT_EQ(matches(g, text), want) << s.dump() << " " << text;
    }
  }
  EXPECT_THROW(json_schema_to_gbnf({{"type", "number"}, {"minimum", 1.5}, {"exclusiveMaximum", 1.5}}), JsonSchemaError);
}

TEST(JsonSchema, EnumConstAndObjectOrder) {
  const auto g = Grammar::parse(json_schema_to_gbnf(json::parse(R"({"type": "object",
    "properties": {"a": {"enum": ["x\"y", 3, null]}, "b": {"const": {"k": [1, true]}}, "c": {"type": "boolean"}},
    "required": ["a", "b"], "additionalProperties": false})")));
  EXPECT_TRUE(matches(g, R"({"a": "x\"y", "b": {"k":[1,true]}})"));
  EXPECT_TRUE(matches(g, R"({"a":null,"b":{"k":[1,true]},"c":false})"));
  EXPECT_FALSE(matches(g, R"({"b":{"k":[1,true]},"a":3})"));    // the schema's order
  EXPECT_FALSE(matches(g, R"({"a":3})"));                        // b is required
  EXPECT_FALSE(matches(g, R"({"a":4,"b":{"k":[1,true]}})"));     // not in the enum
  EXPECT_FALSE(matches(g, R"({"a":3,"b":{"k":[1,true]},"d":1})"));  // no extra properties
}

TEST(JsonSchema, JsonObject) {
  const auto g = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(matches(g, R"({"a": [1, -2.5e3, "x\u00e9\n", {"b": null}], "c": true})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"({"a": "tab	inside"})"));
}

TEST(JsonSchema, ErrorsNameWhere) {
  try {
    json_schema_to_gbnf(json::parse(R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":2}}})"));
    FAIL();
  } catch (const JsonSchemaError& e) {
    EXPECT_EQ(e.where, "/properties/n/multipleOf");
    EXPECT_NE(std::string(e.what()).find("multipleOf"), std::string::npos);
  }
}

}  // namespace
}  // namespace xpert
