#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace xpert::jinja {

// ---- Dict and CallArgs ----

size_t Dict::size() const { return items_.size(); }

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
  } else {
    items_.emplace_back(key, std::move(v));
  }
}

bool Dict::erase(std::string_view key) {
  auto it = std::find_if(items_.begin(), items_.end(), [&](const auto& kv) { return kv.first == key; });
  if (it == items_.end()) return false;
  items_.erase(it);
  return true;
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

void CallArgs::check(std::string_view what, std::initializer_list<std::string_view> names) const {
  if (positional.size() > names.size()) {
    raise("{} takes at most {} argument(s), {} given", what, names.size(), positional.size());
  }
  for (const auto& [k, v] : keyword) {
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      raise("{} got an unexpected keyword argument '{}'", what, k);
    }
  }
}

// ---- construction ----

Value Value::undefined(std::string name) {
  Value v;
  v.str_ = std::move(name);
  return v;
}

Value Value::none() {
  Value v;
  v.type_ = Type::none;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::boolean;
  v.bool_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::integer;
  v.int_ = i;
  return v;
}

Value Value::floating(double f) {
  Value v;
  v.type_ = Type::floating;
  v.float_ = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::string;
  v.str_ = std::move(s);
  return v;
}

Value Value::list(List items, bool tuple) {
  Value v;
  v.type_ = Type::list;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(bool is_namespace) {
  Value v;
  v.type_ = Type::dict;
  v.namespace_ = is_namespace;
  v.dict_ = std::make_shared<Dict>();
  return v;
}

Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> call) {
  Value v;
  v.type_ = Type::function;
  v.fn_ = std::make_shared<Function>(Function{std::move(name), std::move(call)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = dict();
      for (const auto& [k, e] : j.items()) d.entries().set(k, from_json(e));
      return d;
    }
    default:
      fail("chat template input: unsupported JSON value (binary or discarded)");
  }
}

// ---- accessors ----

int64_t Value::as_int() const {
  if (is_bool()) return bool_ ? 1 : 0;
  if (is_int()) return int_;
  raise("expected an integer, got {}", type_name());
}

double Value::as_double() const {
  if (is_float()) return float_;
  return static_cast<double>(as_int());
}

bool Value::same_object(const Value& o) const {
  if (type_ != o.type_) return false;
  switch (type_) {
    case Type::list:
      return list_ == o.list_;
    case Type::dict:
      return dict_ == o.dict_;
    case Type::function:
      return fn_ == o.fn_;
    default:
      return equals(*this, o);
  }
}

bool Value::truthy() const {
  switch (type_) {
    case Type::undefined:
    case Type::none:
      return false;
    case Type::boolean:
      return bool_;
    case Type::integer:
      return int_ != 0;
    case Type::floating:
      return float_ != 0;
    case Type::string:
      return !str_.empty();
    case Type::list:
      return !list_->empty();
    case Type::dict:
      return dict_->size() != 0;
    case Type::function:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type_) {
    case Type::undefined:
      return "Undefined";
    case Type::none:
      return "NoneType";
    case Type::boolean:
      return "bool";
    case Type::integer:
      return "int";
    case Type::floating:
      return "float";
    case Type::string:
      return "str";
    case Type::list:
      return tuple_ ? "tuple" : "list";
    case Type::dict:
      return namespace_ ? "Namespace" : "dict";
    case Type::function:
      return "function";
  }
  return "?";
}

// ---- printing ----

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), std::fabs(f), std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // "d.ddde+XX"
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  int exp = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp);
  std::string out = std::signbit(f) ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (exp >= 0) {
    if (n <= exp + 1) {
      out += digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
    } else {
      out +=
          digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  }
  return out;
}

namespace {

// Decodes one UTF-8 code point at s[i]; invalid bytes decode as themselves (Latin-1) and advance by 1.
uint32_t decode_utf8(std::string_view s, size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + static_cast<size_t>(n) > s.size()) {
    ++i;
    return b;
  }
  uint32_t cp = n == 1 ? b : b & (0x7f >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((c & 0xc0) != 0x80) {
      ++i;
      return b;
    }
    cp = (cp << 6) | (c & 0x3f);
  }
  i += static_cast<size_t>(n);
  return cp;
}

// str.isprintable() for the code points that show up in chat text; everything else is printable.
bool printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f)) {
    return false;
  }
  return !(cp == 0x3000 || cp == 0xfeff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0xfff9 && cp <= 0xfffb));
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, i);
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (printable(cp)) {
      out.append(s.substr(start, i - start));
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", cp);
    } else {
      out += fmt::format("\\u{:04x}", cp);
    }
  }
  out += quote;
  return out;
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", cp);
          }
        } else {
          out.append(s.substr(start, i - start));
        }
    }
  }
  out += '"';
}

}  // namespace

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    decode_utf8(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) decode_utf8(s, i);
  return n;
}

std::string Value::to_str() const {
  switch (type_) {
    case Type::undefined:
      return "";
    case Type::string:
      return str_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (type_) {
    case Type::undefined:
      return "Undefined";
    case Type::none:
      return "None";
    case Type::boolean:
      return bool_ ? "True" : "False";
    case Type::integer:
      return std::to_string(int_);
    case Type::floating:
      return format_float(float_);
    case Type::string:
      return repr_string(str_);
    case Type::list: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Type::dict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items()) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + v.repr();
      }
      out += namespace_ ? "}>" : "}";
      return out;
    }
    case Type::function:
      return "<function " + fn_->name + ">";
  }
  return "";
}

std::string Value::to_json(const JsonStyle& style) const {
  std::string out;
  dump_json(out, style, 0);
  return out;
}

void Value::dump_json(std::string& out, const JsonStyle& style, int depth) const {
  auto newline = [&](int level) {
    if (!style.has_indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += style.indent;
  };
  switch (type_) {
    case Type::none:
      out += "null";
      return;
    case Type::boolean:
      out += bool_ ? "true" : "false";
      return;
    case Type::integer:
      out += std::to_string(int_);
      return;
    case Type::floating:
      if (std::isnan(float_)) {
        out += "NaN";
      } else if (std::isinf(float_)) {
        out += float_ < 0 ? "-Infinity" : "Infinity";
      } else {
        out += format_float(float_);
      }
      return;
    case Type::string:
      json_string(out, str_, style.ensure_ascii);
      return;
    case Type::list: {
      if (list_->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += style.item_sep;
        newline(depth + 1);
        (*list_)[i].dump_json(out, style, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Type::dict: {
      if (namespace_) break;
      if (dict_->size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& kv : dict_->items()) order.push_back(&kv);
      if (style.sort_keys) {
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += style.item_sep;
        newline(depth + 1);
        json_string(out, order[i]->first, style.ensure_ascii);
        out += style.key_sep;
        order[i]->second.dump_json(out, style, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      break;
  }
  raise("Object of type {} is not JSON serializable", type_name());
}

// ---- operators ----

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::undefined:
    case Value::Type::none:
      return true;
    case Value::Type::string:
      return a.str() == b.str();
    case Value::Type::list: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!equals(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Value::Type::dict: {
      if (a.entries().size() != b.entries().size()) return false;
      for (const auto& [k, v] : a.entries().items()) {
        const Value* other = b.entries().find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.items().size(), b.items().size());
    for (size_t i = 0; i < n; ++i) {
      if (!equals(a.items()[i], b.items()[i])) return compare(a.items()[i], b.items()[i]);
    }
    return a.items().size() < b.items().size() ? -1 : a.items().size() > b.items().size() ? 1 : 0;
  }
  raise("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::undefined:
      return false;
    case Value::Type::string:
      if (!item.is_string()) raise("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Type::list:
      for (const Value& v : container.items()) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Type::dict:
      return !container.is_namespace() && item.is_string() && container.entries().find(item.str()) != nullptr;
    default:
      raise("argument of type '{}' is not iterable", container.type_name());
  }
}

}  // namespace xpert::jinja
