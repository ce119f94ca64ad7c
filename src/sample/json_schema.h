// JSON Schema -> GBNF (sample/grammar.h), for structured output (OpenAI's response_format json_schema)
// and forced tool calls.
//
// What it covers: type (one or a list), properties / required / additionalProperties (false, true or a
// schema; when absent no extra property is generated, which every validator accepts), enum, const,
// anyOf, oneOf (an approximation: generated as anyOf, so a value that two alternatives both accept is
// not excluded; exact when the alternatives are disjoint, e.g. by type, const, enum or a required
// property), allOf of object schemas (merged), $ref to "#", "#/$defs/..." or
// "#/definitions/..." (recursion allowed), arrays with items / prefixItems and minItems / maxItems,
// strings with minLength / maxLength / pattern (a regular-expression subset: literals, ., classes, \d \w
// \s, groups, |, * + ? {m,n}, ^ $) and format (date, time, date-time, uuid, email, hostname, ipv4, uri),
// integers with minimum / maximum / exclusiveMinimum / exclusiveMaximum, numbers with the same bounds
// as exact decimals (fractions included; sample/json_schema_numbers.cpp), booleans, null. Annotations (title,
// description, default, examples, ...) are ignored. A keyword that would constrain the value but cannot
// be expressed (multipleOf, uniqueItems, not, if, ...) is refused with a JsonSchemaError naming it,
// never silently dropped.
//
// The generated JSON is compact apart from optional whitespace (one space, or a newline and up to 16
// spaces or tabs) between tokens, and properties come in the schema's order.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"

namespace xpert {

class JsonSchemaError : public Error {
 public:
  JsonSchemaError(const std::string& message, std::string at) : Error(message), where(std::move(at)) {}
  std::string where;  // JSON pointer of the offending part of the schema ("" for the root)
};

// GBNF text whose `root` is the JSON values the schema accepts. Throws JsonSchemaError.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// Rules for a value that `part` (the root schema or a piece of it, whose $refs resolve against `root`)
// accepts, named `rule_name`; its helper rules start with `rule_name-`. Without the primitives
// (json_primitives_gbnf: ws, string, number, value, object, ...), so that several schemas share one
// grammar (a forced tool call picks its tool's schema by the name). Throws JsonSchemaError.
std::string json_schema_rules(const nlohmann::ordered_json& root, const nlohmann::ordered_json& part,
                              const std::string& rule_name);
std::string json_primitives_gbnf();

// GBNF for any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace xpert
