// Attribute / item access, iteration, Python methods and globals. Filters and tests: filters.cpp.
#include "text/jinja/builtins.h"

#include <algorithm>
#include <ctime>

#include "text/jinja/interpreter.h"
#include "text/jinja/strings.h"

namespace xpert::jinja {
namespace {

const std::string* opt_string(const CallArgs& args, size_t i, std::string_view name, std::string_view what) {
  const Value* v = args.get(i, name);
  if (!v || v->is_none()) return nullptr;
  if (!v->is_string()) raise("{}: argument '{}' must be a string, got {}", what, name, v->type_name());
  return &v->str();
}

const std::string& req_string(const CallArgs& args, size_t i, std::string_view name, std::string_view what) {
  const std::string* s = opt_string(args, i, name, what);
  if (!s) raise("{}: missing argument '{}'", what, name);
  return *s;
}

long opt_int(const CallArgs& args, size_t i, std::string_view name, long fallback) {
  const Value* v = args.get(i, name);
  if (!v || v->is_none()) return fallback;
  return static_cast<long>(v->as_int());
}

Value string_list(const std::vector<std::string>& parts) {
  List items;
  for (const std::string& p : parts) items.push_back(Value::string(p));
  return Value::list(std::move(items));
}

bool affix_matches(const Value& affix, std::string_view s, bool prefix, std::string_view what) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) raise("{}: argument must be a string or a tuple of strings", what);
    const std::string& x = a.str();
    return x.size() <= s.size() && (prefix ? s.substr(0, x.size()) == x : s.substr(s.size() - x.size()) == x);
  };
  if (affix.is_list()) return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

bool string_method(const std::string& s, std::string_view name, CallArgs& args, Value& result) {
  const std::string what = fmt::format("str.{}()", name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    args.check(what, {"chars"});
    result = Value::string(
        pystr::strip(s, opt_string(args, 0, "chars", what), name != "rstrip", name != "lstrip"));
  } else if (name == "split") {
    args.check(what, {"sep", "maxsplit"});
    result = string_list(pystr::split(s, opt_string(args, 0, "sep", what), opt_int(args, 1, "maxsplit", -1)));
  } else if (name == "rsplit") {
    args.check(what, {"sep", "maxsplit"});
    const std::string* sep = opt_string(args, 0, "sep", what);
    const long maxsplit = opt_int(args, 1, "maxsplit", -1);
    result = string_list(sep ? pystr::rsplit(s, *sep, maxsplit) : pystr::split(s, nullptr, -1));
  } else if (name == "startswith" || name == "endswith") {
    args.check(what, {"prefix"});
    const Value* a = args.get(0, "prefix");
    if (!a) raise("{}: missing argument", what);
    result = Value::boolean(affix_matches(*a, s, name == "startswith", what));
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    args.check(what, {});
    result = Value::string(name == "upper"   ? pystr::upper(s)
                           : name == "lower" ? pystr::lower(s)
                           : name == "title" ? pystr::py_title(s)
                                             : pystr::capitalize(s));
  } else if (name == "replace") {
    args.check(what, {"old", "new", "count"});
    result = Value::string(pystr::replace(s, req_string(args, 0, "old", what),
                                          req_string(args, 1, "new", what), opt_int(args, 2, "count", -1)));
  } else if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    args.check(what, {"sub"});
    const std::string& sub = req_string(args, 0, "sub", what);
    if (name == "count") {
      long n = 0;
      if (sub.empty()) {
        n = static_cast<long>(utf8_length(s)) + 1;
      } else {
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      }
      result = Value::integer(n);
    } else {
      const long at = pystr::find(s, sub, name == "rfind");
      if (name == "index" && at < 0) raise("substring not found");
      result = Value::integer(at);
    }
  } else if (name == "join") {
    args.check(what, {"iterable"});
    const Value* items = args.get(0, "iterable");
    if (!items) raise("{}: missing argument", what);
    std::string out;
    bool first = true;
    for (const Value& v : iterate(*items)) {
      if (!v.is_string()) raise("str.join(): expected str items, found {}", v.type_name());
      if (!first) out += s;
      first = false;
      out += v.str();
    }
    result = Value::string(std::move(out));
  } else if (name == "splitlines") {
    args.check(what, {});
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < s.size()) {
      size_t at = s.find('\n', start);
      if (at == std::string::npos) at = s.size();
      std::string line = s.substr(start, at - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
      start = at + 1;
    }
    result = string_list(lines);
  } else if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
             name == "isupper" || name == "islower") {
    args.check(what, {});
    bool ok = !s.empty();
    bool cased = false;
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (name == "isdigit") ok = ok && std::isdigit(c);
      if (name == "isalpha") ok = ok && std::isalpha(c);
      if (name == "isalnum") ok = ok && std::isalnum(c);
      if (name == "isspace") ok = ok && std::isspace(c);
      if (name == "isupper") ok = ok && !std::islower(c);
      if (name == "islower") ok = ok && !std::isupper(c);
      cased = cased || std::isalpha(c);
    }
    if (name == "isupper" || name == "islower") ok = ok && cased;
    result = Value::boolean(ok);
  } else if (name == "format") {
    raise("unsupported construct: str.format()");
  } else {
    return false;
  }
  return true;
}

bool dict_method(const Value& d, std::string_view name, CallArgs& args, Value& result) {
  const std::string what = fmt::format("dict.{}()", name);
  Dict& dict = d.entries();
  if (name == "get") {
    args.check(what, {"key", "default"});
    const Value* key = args.get(0, "key");
    if (!key) raise("dict.get(): missing key");
    const Value* found = key->is_string() ? dict.find(key->str()) : nullptr;
    const Value* fallback = args.get(1, "default");
    result = found ? *found : fallback ? *fallback : Value::none();
  } else if (name == "items" || name == "keys" || name == "values") {
    args.check(what, {});
    List out;
    for (const auto& [k, v] : dict.items()) {
      if (name == "items") {
        out.push_back(Value::list({Value::string(k), v}, true));
      } else {
        out.push_back(name == "keys" ? Value::string(k) : v);
      }
    }
    result = Value::list(std::move(out));
  } else if (name == "pop") {
    args.check(what, {"key", "default"});
    const Value* key = args.get(0, "key");
    if (!key || !key->is_string()) raise("dict.pop(): expected a string key");
    const Value* found = dict.find(key->str());
    const Value* fallback = args.get(1, "default");
    if (!found && !fallback) raise("KeyError: {}", key->repr());
    result = found ? *found : *fallback;
    if (found) dict.erase(key->str());
  } else if (name == "update") {
    const Value* other = args.get(0, "other");
    if (other && other->is_dict()) {
      for (const auto& [k, v] : other->entries().items()) dict.set(k, v);
    }
    for (const auto& [k, v] : args.keyword) dict.set(k, v);
    result = Value::none();
  } else {
    return false;
  }
  return true;
}

bool list_method(const Value& l, std::string_view name, CallArgs& args, Value& result) {
  const std::string what = fmt::format("list.{}()", name);
  List& items = l.items();
  if (name == "append") {
    args.check(what, {"object"});
    if (args.positional.size() != 1) raise("list.append() takes exactly one argument");
    items.push_back(args.positional[0]);
    result = Value::none();
  } else if (name == "extend") {
    args.check(what, {"iterable"});
    if (args.positional.size() != 1) raise("list.extend() takes exactly one argument");
    for (const Value& v : iterate(args.positional[0])) items.push_back(v);
    result = Value::none();
  } else if (name == "pop") {
    args.check(what, {"index"});
    if (items.empty()) raise("pop from empty list");
    long i = opt_int(args, 0, "index", -1);
    if (i < 0) i += static_cast<long>(items.size());
    if (i < 0 || i >= static_cast<long>(items.size())) raise("pop index out of range");
    result = items[static_cast<size_t>(i)];
    items.erase(items.begin() + i);
  } else if (name == "index" || name == "count") {
    args.check(what, {"value"});
    if (args.positional.size() != 1) raise("{} takes exactly one argument", what);
    long n = 0, first = -1;
    for (size_t i = 0; i < items.size(); ++i) {
      if (equals(items[i], args.positional[0])) {
        if (first < 0) first = static_cast<long>(i);
        ++n;
      }
    }
    if (name == "index" && first < 0) raise("{} is not in list", args.positional[0].repr());
    result = Value::integer(name == "index" ? first : n);
  } else {
    return false;
  }
  return true;
}

}  // namespace

[[noreturn]] void undefined_error(const Value& v) {
  raise("{}", v.str().empty() ? "undefined value" : v.str());
}

Value attribute_of(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.entries().find(name)) return *v;
  }
  const std::string type = obj.is_dict() && !obj.is_namespace() ? "dict" : obj.type_name();
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type, name));
}

Value item_of(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (key.is_string()) return attribute_of(obj, key.str());
    return Value::undefined(fmt::format("'dict object' has no attribute {}", key.repr()));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const bool is_list = obj.is_list();
    std::vector<std::string_view> chars;
    if (!is_list) chars = utf8_chars(obj.str());
    const auto n = static_cast<int64_t>(is_list ? obj.items().size() : chars.size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      return is_list ? obj.items()[static_cast<size_t>(i)]
                     : Value::string(std::string(chars[static_cast<size_t>(i)]));
    }
    return Value::undefined(fmt::format("{} object has no element {}", obj.type_name(), key.as_int()));
  }
  if (key.is_string()) return attribute_of(obj, key.str());
  return Value::undefined(fmt::format("'{} object' has no element {}", obj.type_name(), key.repr()));
}

Value slice_of(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!obj.is_list() && !obj.is_string()) raise("'{}' object is not subscriptable", obj.type_name());
  auto index = [](const Value& v, const char* what) {
    if (!v.is_none() && !v.is_int() && !v.is_bool()) raise("slice {} must be an integer or none", what);
    return v;
  };
  const Value start = index(start_v, "start"), stop = index(stop_v, "stop"), step_val = index(step_v, "step");
  std::vector<std::string_view> chars;
  if (obj.is_string()) chars = utf8_chars(obj.str());
  const auto n = static_cast<int64_t>(obj.is_list() ? obj.items().size() : chars.size());
  const int64_t step = step_val.is_none() ? 1 : step_val.as_int();
  if (step == 0) raise("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t fallback, int64_t lo, int64_t hi) {
    if (v.is_none()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return std::clamp(i, lo, hi);
  };
  const int64_t b = step > 0 ? clamp(start, 0, 0, n) : clamp(start, n - 1, -1, n - 1);
  const int64_t e = step > 0 ? clamp(stop, n, 0, n) : clamp(stop, -1, -1, n - 1);
  List items;
  std::string text;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) {
    if (obj.is_list()) {
      items.push_back(obj.items()[static_cast<size_t>(i)]);
    } else {
      text.append(chars[static_cast<size_t>(i)]);
    }
  }
  return obj.is_list() ? Value::list(std::move(items), obj.is_tuple()) : Value::string(std::move(text));
}

List iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::undefined:
      return {};
    case Value::Type::list:
      return v.items();
    case Value::Type::string: {
      List out;
      for (std::string_view ch : utf8_chars(v.str())) out.push_back(Value::string(std::string(ch)));
      return out;
    }
    case Value::Type::dict: {
      if (v.is_namespace()) break;
      List out;
      for (const auto& kv : v.entries().items()) out.push_back(Value::string(kv.first));
      return out;
    }
    default:
      break;
  }
  raise("'{}' object is not iterable", v.type_name());
}

bool call_method(Interpreter&, const Value& obj, std::string_view name, CallArgs& args, Value& result) {
  if (obj.is_string()) return string_method(obj.str(), name, args, result);
  if (obj.is_dict() && !obj.is_namespace()) return dict_method(obj, name, args, result);
  if (obj.is_list() && !obj.is_tuple()) return list_method(obj, name, args, result);
  return false;
}

void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["range"] = Value::function("range", [](Interpreter&, CallArgs& args) {
    if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
      raise("range() takes 1 to 3 positional arguments");
    }
    int64_t start = 0, stop = 0, step = 1;
    if (args.positional.size() == 1) {
      stop = args.positional[0].as_int();
    } else {
      start = args.positional[0].as_int();
      stop = args.positional[1].as_int();
      if (args.positional.size() == 3) step = args.positional[2].as_int();
    }
    if (step == 0) raise("range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 1000000) raise("range() is limited to 1000000 items");
      out.push_back(Value::integer(i));
    }
    return Value::list(std::move(out));
  });
  vars["namespace"] = Value::function("namespace", [](Interpreter&, CallArgs& args) {
    Value ns = Value::dict(/*is_namespace=*/true);
    for (const Value& p : args.positional) {
      if (!p.is_dict()) raise("namespace() takes a mapping and keyword arguments");
      for (const auto& [k, v] : p.entries().items()) ns.entries().set(k, v);
    }
    for (const auto& [k, v] : args.keyword) ns.entries().set(k, v);
    return ns;
  });
  vars["dict"] = Value::function("dict", [](Interpreter&, CallArgs& args) {
    Value d = Value::dict();
    for (const Value& p : args.positional) {
      if (!p.is_dict()) raise("dict() takes a mapping and keyword arguments");
      for (const auto& [k, v] : p.entries().items()) d.entries().set(k, v);
    }
    for (const auto& [k, v] : args.keyword) d.entries().set(k, v);
    return d;
  });
  vars["raise_exception"] = Value::function("raise_exception", [](Interpreter&, CallArgs& args) -> Value {
    const Value* msg = args.get(0, "message");
    raise("raise_exception: {}", msg ? msg->to_str() : "");
  });
  vars["strftime_now"] = Value::function("strftime_now", [](Interpreter& in, CallArgs& args) {
    const Value* f = args.get(0, "format");
    if (!f || !f->is_string()) raise("strftime_now() expects a format string");
    const std::time_t now =
        in.settings().now_unix ? static_cast<std::time_t>(*in.settings().now_unix) : std::time(nullptr);
    std::tm tm{};
    if (in.settings().now_unix) {
      gmtime_r(&now, &tm);
    } else {
      localtime_r(&now, &tm);
    }
    char buf[512];
    const size_t n = std::strftime(buf, sizeof(buf), f->str().c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace xpert::jinja
