// Jinja's filters and tests, Python's str/dict/list methods, and the globals templates call
// (range, namespace, dict, raise_exception, strftime_now), with jinja2's and Python's semantics.
#pragma once
#include <string>
#include <string_view>
#include <unordered_map>

#include "text/jinja/value.h"

namespace xpert::jinja {

class Interpreter;

// `obj.name` and `obj[key]` as jinja2 resolves them; missing -> undefined (error only on undefined obj).
Value attribute_of(const Value& obj, std::string_view name);
Value item_of(const Value& obj, const Value& key);
Value slice_of(const Value& obj, const Value& start, const Value& stop, const Value& step);
// What a for loop visits: list items, dict keys, string characters; undefined visits nothing.
List iterate(const Value& v);
// Throws the error an undefined value carries ("'x' is undefined").
[[noreturn]] void undefined_error(const Value& v);

Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args);
bool apply_test(Interpreter& in, std::string_view name, const Value& input, CallArgs& args);
// Python method `obj.name(args)`; returns false when `obj` has no such method.
bool call_method(Interpreter& in, const Value& obj, std::string_view name, CallArgs& args, Value& result);
void add_globals(std::unordered_map<std::string, Value>& vars);

}  // namespace xpert::jinja
