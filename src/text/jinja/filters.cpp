// Jinja filters and tests with jinja2 3.1's semantics (and HF's `tojson`).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "text/jinja/builtins.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/strings.h"

namespace xpert::jinja {
namespace {

bool flag(const CallArgs& args, size_t i, std::string_view name, bool fallback = false) {
  const Value* v = args.get(i, name);
  return v ? v->truthy() : fallback;
}

// jinja2's attribute getter: "a.b.0" walks items, digits index lists.
Value lookup_path(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? item_of(cur, Value::integer(std::stoll(part))) : item_of(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string attribute_arg(const CallArgs& args, size_t i, std::string_view what) {
  const Value* a = args.get(i, "attribute");
  if (!a || a->is_none()) return {};
  if (a->is_int()) return std::to_string(a->as_int());
  if (!a->is_string()) raise("{}: attribute must be a string", what);
  return a->str();
}

// Sort/unique key: the attribute if given, lower-cased strings unless case-sensitive.
Value sort_key(const Value& v, const std::string& attribute, bool case_sensitive) {
  Value k = attribute.empty() ? v : lookup_path(v, attribute);
  if (!case_sensitive && k.is_string()) return Value::string(pystr::lower(k.str()));
  return k;
}

Value to_json(const Value& input, const CallArgs& args) {
  args.check("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  Value::JsonStyle style;
  style.ensure_ascii = flag(args, 0, "ensure_ascii");
  if (const Value* indent = args.get(1, "indent"); indent && !indent->is_none()) {
    style.has_indent = true;
    style.item_sep = ",";
    if (indent->is_string()) {
      style.indent = indent->str();
    } else {
      style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent->as_int(), 0, 64)), ' ');
    }
  }
  if (const Value* seps = args.get(2, "separators"); seps && !seps->is_none()) {
    if (!seps->is_list() || seps->items().size() != 2 || !seps->items()[0].is_string() ||
        !seps->items()[1].is_string()) {
      raise("tojson: separators must be a pair of strings");
    }
    style.item_sep = seps->items()[0].str();
    style.key_sep = seps->items()[1].str();
  }
  style.sort_keys = flag(args, 3, "sort_keys");
  return Value::string(input.to_json(style));
}

Value indent(const Value& input, const CallArgs& args) {
  args.check("indent", {"width", "first", "blank"});
  std::string pad = "    ";
  if (const Value* w = args.get(0, "width"))
    pad = w->is_string() ? w->str()
                         : std::string(static_cast<size_t>(std::clamp<int64_t>(w->as_int(), 0, 256)), ' ');
  const bool first = flag(args, 1, "first"), blank = flag(args, 2, "blank");
  std::vector<std::string> lines;
  const std::string s = input.to_str();
  // Jinja splits s + "\n" with splitlines(): every segment between newlines, the last one kept.
  for (size_t start = 0;;) {
    const size_t at = s.find('\n', start);
    lines.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  if (first) out = pad + out;
  return Value::string(std::move(out));
}

Value to_int(const Value& input, const CallArgs& args) {
  args.check("int", {"default", "base"});
  const Value* fallback = args.get(0, "default");
  const int64_t base = args.get(1, "base") ? args.get(1, "base")->as_int() : 10;
  if (input.is_int() || input.is_bool()) return Value::integer(input.as_int());
  if (input.is_float() && std::isfinite(input.as_double()))
    return Value::integer(static_cast<int64_t>(input.as_double()));
  if (input.is_string()) {
    std::string s = pystr::strip(input.str(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::integer(v);
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d))
      return Value::integer(static_cast<int64_t>(d));
  }
  return fallback ? *fallback : Value::integer(0);
}

Value to_float(const Value& input, const CallArgs& args) {
  args.check("float", {"default"});
  const Value* fallback = args.get(0, "default");
  if (input.is_number()) return Value::floating(input.as_double());
  if (input.is_string()) {
    const std::string s = pystr::strip(input.str(), nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::floating(d);
  }
  return fallback ? *fallback : Value::floating(0.0);
}

Value round_value(const Value& input, const CallArgs& args) {
  args.check("round", {"precision", "method"});
  const int64_t precision = args.get(0, "precision") ? args.get(0, "precision")->as_int() : 0;
  const Value* method_v = args.get(1, "method");
  const std::string method = method_v && method_v->is_string() ? method_v->str() : "common";
  if (!input.is_number()) raise("round: expected a number, got {}", input.type_name());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = input.as_double() * scale;
  double r = 0;
  if (method == "common") {
    if (!input.is_float()) return Value::integer(input.as_int());  // Python: round(int, n) stays int
    r = std::nearbyint(x);                                         // ties to even, as Python's round()
  } else if (method == "floor") {
    r = std::floor(x);
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else {
    raise("round: method must be 'common', 'floor' or 'ceil'");
  }
  return Value::floating(r / scale);
}

// select / reject / selectattr / rejectattr
Value select_items(Interpreter& in, const Value& input, CallArgs& args, bool by_attr, bool keep) {
  std::string attr;
  size_t next = 0;
  if (by_attr) {
    const Value* a = args.get(0, "attribute");
    if (!a || !a->is_string()) raise("selectattr/rejectattr: missing attribute name");
    attr = a->str();
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > next) {
    if (!args.positional[next].is_string()) raise("select: the test name must be a string");
    test = args.positional[next].str();
    test_args.positional.assign(args.positional.begin() + static_cast<long>(next) + 1, args.positional.end());
  }
  List out;
  for (const Value& item : iterate(input)) {
    const Value subject = by_attr ? lookup_path(item, attr) : item;
    const bool pass = test.empty() ? subject.truthy() : apply_test(in, test, subject, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value map_items(Interpreter& in, const Value& input, CallArgs& args) {
  List out;
  constexpr size_t kKeywordOnly = SIZE_MAX;
  const std::string attr = attribute_arg(args, kKeywordOnly, "map");
  if (!attr.empty()) {
    const Value* fallback = args.get(kKeywordOnly, "default");
    for (const Value& item : iterate(input)) {
      Value v = lookup_path(item, attr);
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    raise("map: expected a filter name or attribute=");
  const std::string filter = args.positional[0].str();
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : iterate(input)) out.push_back(apply_filter(in, filter, item, rest));
  return Value::list(std::move(out));
}

Value sorted(const Value& input, const CallArgs& args) {
  args.check("sort", {"reverse", "case_sensitive", "attribute"});
  const bool reverse = flag(args, 0, "reverse"), case_sensitive = flag(args, 1, "case_sensitive");
  const std::string attr = attribute_arg(args, 2, "sort");
  List items = iterate(input);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = compare(sort_key(a, attr, case_sensitive), sort_key(b, attr, case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value dictsort(const Value& input, const CallArgs& args) {
  args.check("dictsort", {"case_sensitive", "by", "reverse"});
  if (!input.is_dict()) raise("dictsort: expected a mapping, got {}", input.type_name());
  const bool case_sensitive = flag(args, 0, "case_sensitive"), reverse = flag(args, 2, "reverse");
  const Value* by = args.get(1, "by");
  const size_t pos = by && by->is_string() && by->str() == "value" ? 1 : 0;
  List items;
  for (const auto& [k, v] : input.entries().items())
    items.push_back(Value::list({Value::string(k), v}, true));
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c =
        compare(sort_key(a.items()[pos], "", case_sensitive), sort_key(b.items()[pos], "", case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value unique(const Value& input, const CallArgs& args) {
  args.check("unique", {"case_sensitive", "attribute"});
  const bool case_sensitive = flag(args, 0, "case_sensitive");
  const std::string attr = attribute_arg(args, 1, "unique");
  List out, seen;
  for (const Value& item : iterate(input)) {
    const Value key = sort_key(item, attr, case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& input, const CallArgs& args, bool want_max) {
  args.check(want_max ? "max" : "min", {"case_sensitive", "attribute"});
  const bool case_sensitive = flag(args, 0, "case_sensitive");
  const std::string attr = attribute_arg(args, 1, "min/max");
  const List items = iterate(input);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* best = &items[0];
  for (const Value& v : items) {
    const int c = compare(sort_key(v, attr, case_sensitive), sort_key(*best, attr, case_sensitive));
    if (want_max ? c > 0 : c < 0) best = &v;
  }
  return *best;
}

size_t length_of(const Value& v) {
  switch (v.type()) {
    case Value::Type::undefined:
      return 0;
    case Value::Type::string:
      return utf8_length(v.str());
    case Value::Type::list:
      return v.items().size();
    case Value::Type::dict:
      return v.entries().size();
    default:
      raise("object of type '{}' has no len()", v.type_name());
  }
}

}  // namespace

Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    if (input.is_undefined() || (flag(args, 1, "boolean") && !input.truthy())) {
      return fallback ? *fallback : Value::string("");
    }
    return input;
  }
  if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(length_of(input)));
  if (name == "safe") return input;
  if (name == "tojson") return to_json(input, args);
  if (name == "string") return Value::string(input.to_str());
  if (name == "list") return Value::list(iterate(input));
  if (name == "map") return map_items(in, input, args);
  if (name == "select" || name == "reject") return select_items(in, input, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select_items(in, input, args, true, name == "selectattr");
  if (name == "sort") return sorted(input, args);
  if (name == "dictsort") return dictsort(input, args);
  if (name == "unique") return unique(input, args);
  if (name == "min" || name == "max") return min_max(input, args, name == "max");
  if (name == "int") return to_int(input, args);
  if (name == "float") return to_float(input, args);
  if (name == "round") return round_value(input, args);
  if (name == "indent") return indent(input, args);
  if (name == "attr") {
    const Value* a = args.get(0, "name");
    if (!a || !a->is_string()) raise("attr: expected an attribute name");
    return attribute_of(input, a->str());
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::list();
    if (!input.is_dict() || input.is_namespace())
      raise("items: expected a mapping, got {}", input.type_name());
    List out;
    for (const auto& [k, v] : input.entries().items())
      out.push_back(Value::list({Value::string(k), v}, true));
    return Value::list(std::move(out));
  }
  if (name == "join") {
    const Value* sep = args.get(0, "d");
    const std::string attr = attribute_arg(args, 1, "join");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input)) {
      if (!first && sep) out += sep->to_str();
      first = false;
      out += (attr.empty() ? item : lookup_path(item, attr)).to_str();
    }
    return Value::string(std::move(out));
  }
  if (name == "first" || name == "last") {
    const List items = iterate(input);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    if (name == "last" && input.is_dict()) raise("last: a mapping cannot be reversed");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    List items = iterate(input);
    std::reverse(items.begin(), items.end());
    if (!input.is_string()) return Value::list(std::move(items));
    std::string out;
    for (const Value& ch : items) out += ch.str();
    return Value::string(std::move(out));
  }
  if (name == "sum") {
    const std::string attr = attribute_arg(args, 0, "sum");
    Value total = args.get(1, "start") ? *args.get(1, "start") : Value::integer(0);
    for (const Value& item : iterate(input)) {
      const Value v = attr.empty() ? item : lookup_path(item, attr);
      if (!v.is_number() || !total.is_number()) raise("sum: expected numbers, got {}", v.type_name());
      total = total.is_float() || v.is_float() ? Value::floating(total.as_double() + v.as_double())
                                               : Value::integer(total.as_int() + v.as_int());
    }
    return total;
  }
  if (name == "abs") {
    if (!input.is_number()) raise("bad operand type for abs(): '{}'", input.type_name());
    return input.is_float() ? Value::floating(std::fabs(input.as_double()))
                            : Value::integer(std::llabs(input.as_int()));
  }
  // String filters work on str(input).
  const std::string s = input.to_str();
  if (name == "trim") {
    const Value* chars = args.get(0, "chars");
    const std::string* set = chars && chars->is_string() ? &chars->str() : nullptr;
    return Value::string(pystr::strip(s, set, true, true));
  }
  if (name == "upper") return Value::string(pystr::upper(s));
  if (name == "lower") return Value::string(pystr::lower(s));
  if (name == "title") return Value::string(pystr::jinja_title(s));
  if (name == "capitalize") return Value::string(pystr::capitalize(s));
  if (name == "escape" || name == "e" || name == "forceescape") return Value::string(pystr::html_escape(s));
  if (name == "replace") {
    const Value* from = args.get(0, "old");
    const Value* to = args.get(1, "new");
    const Value* count = args.get(2, "count");
    if (!from || !to) raise("replace: expected old and new strings");
    return Value::string(
        pystr::replace(s, from->to_str(), to->to_str(),
                       count && !count->is_none() ? static_cast<long>(count->as_int()) : -1));
  }
  if (name == "wordcount") return Value::integer(static_cast<int64_t>(pystr::split(s, nullptr, -1).size()));
  raise("unsupported filter '{}'", name);
}

bool apply_test(Interpreter& in, std::string_view name, const Value& v, CallArgs& args) {
  auto arg = [&]() -> const Value& {
    if (args.positional.empty()) raise("test '{}' needs an argument", name);
    return args.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable" || name == "sequence")
    return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) raise("test '{}' expects an integer", name);
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = arg().as_int();
    if (d == 0) raise("integer division or modulo by zero");
    return v.as_int() % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
  if (name == "ne" || name == "!=") return !equals(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg()) < 0;
  if (name == "le" || name == "<=") return compare(v, arg()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg()) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg()) >= 0;
  if (name == "in") return contains(arg(), v);
  if (name == "sameas") return v.same_object(arg());
  if (name == "lower") return v.is_string() && pystr::lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && pystr::upper(v.str()) == v.str();
  (void)in;
  raise("unsupported test '{}'", name);
}

}  // namespace xpert::jinja
