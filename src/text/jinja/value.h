// Values of the Jinja interpreter, with the Python semantics chat templates rely on: truthiness,
// `none` vs undefined, int vs float printing, str()/repr() of containers, json.dumps for `tojson`.
// Lists, dicts and namespaces are shared by reference (as in Python), strings and scalars by value.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"

namespace xpert::jinja {

// An error raised while evaluating, before the interpreter knows the template line; the interpreter
// catches it at the nearest node and rethrows as xpert::Error with "line N: ...".
class RuntimeError : public Error {
 public:
  explicit RuntimeError(const std::string& message) : Error(message) {}
};

template <typename... Args>
[[noreturn]] inline void raise(fmt::format_string<Args...> f, Args&&... args) {
  throw RuntimeError(fmt::format(f, std::forward<Args>(args)...));
}

class Value;
class Interpreter;
using List = std::vector<Value>;

// Insertion-ordered string-keyed map (Python dicts keep insertion order; so must `tojson`).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
  bool erase(std::string_view key);
  size_t size() const;  // out of line: Value is incomplete here (clang rejects pair<string, Value>)
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The index-th positional argument, else the keyword `name`, else nullptr.
  const Value* get(size_t index, std::string_view name) const;
  // Fails when more positional arguments, or keywords not in `names`, were passed.
  void check(std::string_view what, std::initializer_list<std::string_view> names) const;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

class Value {
 public:
  enum class Type : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, function };

  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  static Value list(List items = {}, bool tuple = false);
  static Value dict(bool is_namespace = false);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> call);
  static Value from_json(const nlohmann::ordered_json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::undefined; }
  bool is_none() const { return type_ == Type::none; }
  bool is_bool() const { return type_ == Type::boolean; }
  bool is_int() const { return type_ == Type::integer; }
  bool is_float() const { return type_ == Type::floating; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type_ == Type::string; }
  bool is_list() const { return type_ == Type::list; }
  bool is_tuple() const { return is_list() && tuple_; }
  bool is_dict() const { return type_ == Type::dict; }
  bool is_namespace() const { return is_dict() && namespace_; }
  bool is_function() const { return type_ == Type::function; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const;                          // integer or boolean
  double as_double() const;                        // any number
  const std::string& str() const { return str_; }  // string value; undefined's variable name
  List& items() const { return *list_; }
  Dict& entries() const { return *dict_; }
  const Function& fn() const { return *fn_; }
  bool same_object(const Value& o) const;

  bool truthy() const;
  // Python str(): what `{{ x }}` prints. Undefined prints as "".
  std::string to_str() const;
  // Python repr(), used inside printed containers.
  std::string repr() const;
  // json.dumps(x, ensure_ascii, indent, separators, sort_keys): HF's `tojson`.
  struct JsonStyle {
    bool ensure_ascii = false;
    std::string indent;  // empty: single line
    bool has_indent = false;
    std::string item_sep = ", ";
    std::string key_sep = ": ";
    bool sort_keys = false;
  };
  std::string to_json(const JsonStyle& style) const;
  std::string type_name() const;  // Python's name of the type, for error messages

 private:
  void dump_json(std::string& out, const JsonStyle& style, int depth) const;

  Type type_ = Type::undefined;
  bool bool_ = false;
  bool tuple_ = false;
  bool namespace_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python semantics of ==, <, +, etc. Throw RuntimeError where Python raises TypeError.
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);               // <0, 0, >0; only numbers, strings, lists
bool contains(const Value& container, const Value& item);  // `item in container`

// Python's repr of a float ("1.0", "0.1", "1e-05", "1e+20").
std::string format_float(double f);

// UTF-8 helpers: Python strings index by code point.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

}  // namespace xpert::jinja
