#include "sample/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <map>
#include <set>
#include <vector>

#include "sample/json_schema_internal.h"

namespace xpert {

namespace {

using json = nlohmann::ordered_json;

// Shared pieces of every JSON grammar.
const char* kPrimitives = R"G(
ws      ::= ( " " | "\n" [ \t]{0,16} )?
char    ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
string  ::= "\"" char* "\""
int     ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
number  ::= int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
boolean ::= "true" | "false"
null    ::= "null"
value   ::= object | array | string | number | boolean | null
object  ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array   ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
)G";

// Keywords that only annotate.
const std::set<std::string> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "contentMediaType", "contentEncoding", "discriminator", "nullable",
    "strict", "name", "$anchor"};

std::string int_str(int64_t v) { return std::to_string(v); }

// "[lo-hi]" of single digits.
std::string digit_class(int lo, int hi) {
  if (lo == hi) return fmt::format("\"{}\"", lo);
  return fmt::format("[{}-{}]", lo, hi);
}

// Decimal strings a..b of equal length (leading zeros allowed in a, b: inner positions).
std::string same_len_range(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 1) return digit_class(a[0] - '0', b[0] - '0');
  if (a[0] == b[0]) return fmt::format("\"{}\" ({})", a[0], same_len_range(a.substr(1), b.substr(1)));
  std::vector<std::string> alts;
  const std::string nines(n - 1, '9'), zeros(n - 1, '0');
  alts.push_back(fmt::format("\"{}\" ({})", a[0], same_len_range(a.substr(1), nines)));
  if (b[0] - a[0] > 1) alts.push_back(fmt::format("{} [0-9]{{{}}}", digit_class(a[0] - '0' + 1, b[0] - '0' - 1), n - 1));
  alts.push_back(fmt::format("\"{}\" ({})", b[0], same_len_range(zeros, b.substr(1))));
  std::string out;
  for (const auto& s : alts) out += (out.empty() ? "" : " | ") + s;
  return out;
}

int64_t pow10(size_t n) {
  int64_t p = 1;
  while (n--) p *= 10;
  return p;
}

// Non-negative integers in [a, b] without leading zeros; b < 0: unbounded.
std::string nonneg_range(int64_t a, int64_t b) {
  const size_t la = int_str(a).size();
  std::vector<std::string> alts;
  const size_t lb = b < 0 ? la : int_str(b).size();
  for (size_t len = la; len <= lb; ++len) {
    const int64_t lo = len == la ? a : pow10(len - 1);
    const int64_t hi = (b >= 0 && len == lb) ? b : pow10(len) - 1;
    alts.push_back(same_len_range(int_str(lo), int_str(hi)));
  }
  if (b < 0 && la < 16) alts.push_back(fmt::format("[1-9] [0-9]{{{},{}}}", la, 15));
  std::string out;
  for (const auto& s : alts) out += (out.empty() ? "" : " | ") + s;
  return out;
}

}  // namespace

std::string gbnf_literal(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += (char)c;
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += (char)c;  // UTF-8 passes through
    }
  }
  return out + "\"";
}

std::string gbnf_int_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> alts;
  // Negative values -v with v in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const int64_t vmin = hi && *hi < 0 ? -*hi : 1;
    const int64_t vmax = lo ? -*lo : -1;
    alts.push_back(fmt::format("\"-\" ({})", nonneg_range(vmin, vmax)));
  }
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo && *lo > 0 ? *lo : 0, hi ? *hi : -1));
  std::string out;
  for (const auto& s : alts) out += (out.empty() ? "" : " | ") + s;
  return "(" + out + ")";
}

namespace {

class Converter {
 public:
  Converter(const json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}

  // `rule_name ::= ...` for `part` (a piece of the root schema, for its $refs) and the rules it uses,
  // without the primitives.
  std::string rules(const json& part, const std::string& rule_name) {
    reserved_.insert(rule_name);
    const std::string body = visit(part, "", "root");
    std::string out = rule_name + " ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& at, const std::string& what) const {
    throw JsonSchemaError(fmt::format("json schema{}: {}", at.empty() ? "" : " at " + at, what), at);
  }

  // A fresh rule name from a hint (names are [a-zA-Z0-9-]).
  std::string name_for(const std::string& hint) {
    std::string n;
    for (char c : hint) n += (std::isalnum((unsigned char)c) ? c : '-');
    if (n.empty() || n.size() > 60) n = "r";
    n = prefix_ + "s-" + n;
    std::string name = n;
    for (int i = 2; rules_.count(name) || reserved_.count(name); ++i) name = fmt::format("{}-{}", n, i);
    reserved_.insert(name);
    return name;
  }

  std::string define(const std::string& hint, const std::string& body) {
    const std::string name = name_for(hint);
    rules_[name] = body;
    return name;
  }

  const json& resolve(const std::string& ref, const std::string& at) {
    if (ref.empty() || ref[0] != '#') bad(at, fmt::format("$ref '{}': only references inside the schema (#...) are supported", ref));
    const json* node = &root_;
    std::string pointer = ref.substr(1);
    size_t pos = 0;
    while (pos < pointer.size()) {
      if (pointer[pos] != '/') bad(at, fmt::format("$ref '{}' is not a JSON pointer", ref));
      size_t next = pointer.find('/', pos + 1);
      if (next == std::string::npos) next = pointer.size();
      std::string key = pointer.substr(pos + 1, next - pos - 1);
      for (size_t i; (i = key.find("~1")) != std::string::npos;) key.replace(i, 2, "/");
      for (size_t i; (i = key.find("~0")) != std::string::npos;) key.replace(i, 2, "~");
      if (node->is_object() && node->contains(key)) {
        node = &(*node)[key];
      } else if (node->is_array() && !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit) &&
                 std::stoul(key) < node->size()) {
        node = &(*node)[std::stoul(key)];
      } else {
        bad(at, fmt::format("$ref '{}' points at nothing in the schema", ref));
      }
      pos = next;
    }
    return *node;
  }

  std::string visit(const json& s, const std::string& at, const std::string& hint) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) bad(at, "the schema 'false' accepts no value");
      return "value";
    }
    if (!s.is_object()) bad(at, "a schema must be an object or a boolean");
    if (auto r = s.find("$ref"); r != s.end()) {
      if (!r->is_string()) bad(at + "/$ref", "'$ref' must be a string");
      const std::string ref = r->get<std::string>();
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      const std::string name = name_for("ref-" + ref.substr(ref.rfind('/') + 1));
      refs_[ref] = name;  // before visiting: recursive schemas refer to the name
      rules_[name] = visit(resolve(ref, at + "/$ref"), ref, ref.substr(ref.rfind('/') + 1));
      if (s.size() > 1) {
        for (auto& [k, v] : s.items())
          if (k != "$ref" && !kAnnotations.count(k)) bad(at + "/" + k, fmt::format("'{}' next to '$ref' is not supported", k));
      }
      return name;
    }
    if (auto c = s.find("const"); c != s.end()) return gbnf_literal(c->dump());
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) bad(at + "/enum", "'enum' must be a non-empty array");
      std::string alts;
      for (const json& v : *e) alts += (alts.empty() ? "" : " | ") + gbnf_literal(v.dump());
      return "(" + alts + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) bad(at + "/" + key, fmt::format("'{}' must be a non-empty array", key));
        std::string alts;
        for (size_t i = 0; i < a->size(); ++i)
          alts += (alts.empty() ? "" : " | ") + visit((*a)[i], fmt::format("{}/{}/{}", at, key, i), hint + "-" + std::to_string(i));
        return define(hint, alts);
      }
    }
    if (auto a = s.find("allOf"); a != s.end()) return visit(merge_all_of(s, *a, at), at, hint);
    for (const char* key : {"not", "if", "then", "else", "multipleOf", "contains", "patternProperties",
                            "propertyNames", "dependentRequired", "dependentSchemas", "minProperties",
                            "maxProperties", "unevaluatedProperties", "unevaluatedItems", "minContains",
                            "maxContains", "dependencies", "additionalItems"})
      if (s.contains(key)) bad(at + "/" + key, fmt::format("'{}' is not supported for generation", key));
    if (auto u = s.find("uniqueItems"); u != s.end() && !(u->is_boolean() && !u->get<bool>()))
      bad(at + "/uniqueItems", "'uniqueItems' is not supported for generation");

    auto t = s.find("type");
    if (t == s.end()) {
      // No type: infer from the keywords present, else any value.
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
        return object(s, at, hint);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, at, hint);
      check_known(s, at, {});
      return "value";
    }
    if (t->is_array()) {
      std::string alts;
      for (const json& one : *t) {
        json copy = s;
        copy["type"] = one;
        alts += (alts.empty() ? "" : " | ") + visit(copy, at, hint);
      }
      if (alts.empty()) bad(at + "/type", "'type' must not be an empty array");
      return define(hint, alts);
    }
    if (!t->is_string()) bad(at + "/type", "'type' must be a string or an array of strings");
    const std::string type = t->get<std::string>();
    if (type == "object") return object(s, at, hint);
    if (type == "array") return array(s, at, hint);
    if (type == "string") return string(s, at, hint);
    if (type == "integer" || type == "number") return number(s, at, type == "integer");
    if (type == "boolean" || type == "null") {
      check_known(s, at, {});
      return type;
    }
    bad(at + "/type", fmt::format("unknown type '{}'", type));
  }

  // Keywords of another type (e.g. minLength on an object) are refused: the schema means something else.
  void check_known(const json& s, const std::string& at, std::set<std::string> own) {
    own.insert("type");
    for (auto& [k, v] : s.items())
      if (!own.count(k) && !kAnnotations.count(k))
        bad(at + "/" + k, fmt::format("'{}' is not supported here (type {})", k,
                                      s.contains("type") ? s["type"].dump() : "unspecified"));
  }

  json merge_all_of(const json& s, const json& all, const std::string& at) {
    if (!all.is_array() || all.empty()) bad(at + "/allOf", "'allOf' must be a non-empty array");
    if (auto a = s.find("additionalProperties"); a != s.end() && !(a->is_boolean() && a->get<bool>()))
      bad(at + "/additionalProperties", "'additionalProperties' next to 'allOf' is not supported (it would see "
                                        "only the properties beside it, not those of the 'allOf' parts)");
    json merged = s;
    merged.erase("allOf");
    for (size_t i = 0; i < all.size(); ++i) {
      const json* part = &all[i];
      const std::string pat = fmt::format("{}/allOf/{}", at, i);
      if (part->is_object() && part->contains("$ref")) part = &resolve((*part)["$ref"].get<std::string>(), pat);
      if (!part->is_object()) bad(pat, "'allOf' entries must be schemas");
      for (auto& [k, v] : part->items()) {
        if (k == "additionalProperties" && !(v.is_boolean() && v.get<bool>())) {
          bad(pat + "/additionalProperties", "'additionalProperties' inside 'allOf' is not supported");
        } else if (k == "properties") {
          for (auto& [pk, pv] : v.items()) {
            if (merged["properties"].contains(pk) && merged["properties"][pk] != pv)
              bad(pat + "/properties/" + pk, fmt::format("'allOf' parts describe property '{}' differently", pk));
            merged["properties"][pk] = pv;
          }
        } else if (k == "required") {
          for (const json& r : v) merged["required"].push_back(r);
        } else if (kAnnotations.count(k)) {
        } else if (!merged.contains(k)) {
          merged[k] = v;
        } else if (merged[k] != v) {
          bad(pat + "/" + k, fmt::format("'allOf' parts disagree on '{}'; only object schemas that add properties can be merged", k));
        }
      }
    }
    return merged;
  }

  std::string object(const json& s, const std::string& at, const std::string& hint) {
    check_known(s, at, {"properties", "required", "additionalProperties"});
    std::vector<std::pair<std::string, const json*>> props;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) bad(at + "/properties", "'properties' must be an object");
      for (auto& [k, v] : p->items()) props.emplace_back(k, &v);
    }
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) bad(at + "/required", "'required' must be an array of strings");
      for (const json& name : *r) {
        if (!name.is_string()) bad(at + "/required", "'required' must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    for (const std::string& name : required) {
      bool found = false;
      for (auto& [k, v] : props) found = found || k == name;
      if (!found) props.emplace_back(name, &kAnything);  // required but not described: any value
    }
    // Extra properties: only when asked for (true or a schema); their names avoid the declared ones.
    std::string extra;
    if (auto a = s.find("additionalProperties"); a != s.end() && !(a->is_boolean() && !a->get<bool>())) {
      std::vector<std::string> names;
      for (auto& [k, v] : props) names.push_back(k);
      const std::string val = a->is_boolean() ? "value" : visit(*a, at + "/additionalProperties", hint + "-extra");
      extra = define(hint + "-kv", fmt::format("{} ws \":\" ws {} ws", other_key(names, hint), val));
    }
    const size_t n = props.size();
    // first_i: nothing written yet, properties i.. to go; rest_i: something written, so each one after
    // a comma. Declared order, the optional ones may be left out.
    std::vector<std::string> kv(n), first(n + 1), rest(n + 1);
    for (size_t i = 0; i < n; ++i) {
      const auto& [k, v] = props[i];
      const std::string val = visit(*v, at + "/properties/" + k, hint + "-" + k);
      kv[i] = fmt::format("{} ws \":\" ws {} ws", gbnf_literal(json(k).dump()), val);
    }
    rest[n] = extra.empty() ? "" : fmt::format("( \",\" ws {} )*", extra);
    first[n] = extra.empty() ? "" : fmt::format("( {} ( \",\" ws {} )* )?", extra, extra);
    for (size_t i = n; i-- > 0;) {
      const bool req = required.count(props[i].first) > 0;
      const std::string after = rest[i + 1].empty() ? "" : " " + ref_of(hint + "-rest", rest[i + 1]);
      rest[i] = req ? fmt::format("\",\" ws {}{}", kv[i], after) : fmt::format("( \",\" ws {} )?{}", kv[i], after);
      const std::string skip = first[i + 1].empty() ? "" : ref_of(hint + "-first", first[i + 1]);
      first[i] = req ? fmt::format("{}{}", kv[i], after)
                     : fmt::format("{}{} | {}", kv[i], after, skip.empty() ? "\"\"" : skip);
    }
    const std::string body = first[0].empty() ? "" : " ( " + first[0] + " )";
    return define(hint, fmt::format("\"{{\" ws{} \"}}\"", body));
  }

  // A rule for `body` (so that chains stay linear in size).
  std::string ref_of(const std::string& hint, const std::string& body) { return define(hint, body); }

  // A JSON string key that is none of `names`: a trie of the names' code points, which the key may
  // leave at any point (then anything follows) or end in where no name ends.
  std::string other_key(const std::vector<std::string>& names, const std::string& hint) {
    if (names.empty()) return "string";
    struct Node {
      std::map<uint32_t, int> next;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      int cur = 0;
      for (uint32_t c : utf8_code_points(name)) {
        if (c == '"' || c == '\\' || c < 0x20)
          bad("", "property names with quotes, backslashes or control characters cannot be told apart from "
                  "additionalProperties");
        auto it = trie[cur].next.find(c);
        if (it == trie[cur].next.end()) {
          trie.push_back({});
          trie[cur].next[c] = (int)trie.size() - 1;
          cur = (int)trie.size() - 1;
        } else {
          cur = it->second;
        }
      }
      trie[cur].terminal = true;
    }
    const std::string base = name_for(hint + "-key");
    std::vector<std::string> node_names(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) {
      node_names[i] = i == 0 ? base : fmt::format("{}-{}", base, i);
      reserved_.insert(node_names[i]);
    }
    for (size_t i = 0; i < trie.size(); ++i) {
      std::string cls = "[^\"\\\\\\x00-\\x1f";
      std::vector<std::string> alts;
      for (auto& [c, child] : trie[i].next) {
        cls += fmt::format("\\U{:08X}", c);
        alts.push_back(fmt::format("[\\U{:08X}] {}", c, node_names[child]));
      }
      cls += "]";
      alts.push_back(fmt::format("( {} | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{{4}} ) ) char* \"\\\"\"", cls));
      if (!trie[i].terminal && i != 0) alts.push_back("\"\\\"\"");
      std::string body;
      for (const auto& a : alts) body += (body.empty() ? "" : " | ") + a;
      rules_[node_names[i]] = body;
    }
    return fmt::format("\"\\\"\" {}", base);
  }

  std::string array(const json& s, const std::string& at, const std::string& hint) {
    check_known(s, at, {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"});
    const int64_t min = count(s, "minItems", at, 0), max = count(s, "maxItems", at, -1);
    if (max >= 0 && max < min) bad(at + "/maxItems", "'maxItems' is below 'minItems'");
    std::vector<std::string> tuple;
    if (auto p = s.find("prefixItems"); p != s.end()) {
      if (!p->is_array()) bad(at + "/prefixItems", "'prefixItems' must be an array");
      for (size_t i = 0; i < p->size(); ++i)
        tuple.push_back(visit((*p)[i], fmt::format("{}/prefixItems/{}", at, i), hint + "-" + std::to_string(i)));
    }
    std::string item = "value";
    bool more = true;  // items past the tuple
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_boolean() && !it->get<bool>())
        more = false;
      else
        item = visit(*it, at + "/items", hint + "-item");
    } else if (!tuple.empty()) {
      more = false;  // closed tuple: what a generator should write
    }
    if (!tuple.empty()) {
      if ((int64_t)tuple.size() < min && !more) bad(at + "/minItems", "'minItems' is more than the tuple allows");
      std::string body = "\"[\" ws";
      for (size_t i = 0; i < tuple.size(); ++i) body += fmt::format("{} {} ws", i ? " \",\" ws" : "", tuple[i]);
      if (more && (max < 0 || max > (int64_t)tuple.size())) {
        const int64_t lo = std::max<int64_t>(0, min - (int64_t)tuple.size());
        body += max < 0 ? fmt::format(" ( \",\" ws {} ws ){{{},}}", item, lo)
                        : fmt::format(" ( \",\" ws {} ws ){{{},{}}}", item, lo, max - (int64_t)tuple.size());
      }
      return define(hint, body + " \"]\"");
    }
    if (max == 0) return "\"[\" ws \"]\"";
    const std::string tail = max < 0 ? fmt::format("( \",\" ws {} ws ){{{},}}", item, std::max<int64_t>(0, min - 1))
                                     : fmt::format("( \",\" ws {} ws ){{{},{}}}", item, std::max<int64_t>(0, min - 1), max - 1);
    const std::string items = fmt::format("{} ws {}", item, tail);
    return define(hint, min == 0 ? fmt::format("\"[\" ws ( {} )? \"]\"", items) : fmt::format("\"[\" ws {} \"]\"", items));
  }

  int64_t count(const json& s, const char* key, const std::string& at, int64_t def) {
    auto it = s.find(key);
    if (it == s.end()) return def;
    if (!it->is_number_integer() && !it->is_number_unsigned()) bad(at + "/" + key, fmt::format("'{}' must be a non-negative integer", key));
    const int64_t v = it->get<int64_t>();
    if (v < 0 || v > 10000) bad(at + "/" + key, fmt::format("'{}' must be between 0 and 10000", key));
    return v;
  }

  std::string string(const json& s, const std::string& at, const std::string& hint) {
    check_known(s, at, {"minLength", "maxLength", "pattern", "format"});
    if (auto f = s.find("format"); f != s.end()) {
      if (!f->is_string()) bad(at + "/format", "'format' must be a string");
      if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength"))
        bad(at + "/format", "'format' together with 'pattern', 'minLength' or 'maxLength' is not supported");
      const std::string body = format_gbnf(f->get<std::string>());
      if (body.empty()) bad(at + "/format", fmt::format("format '{}' is not supported (supported: {})", f->get<std::string>(), supported_formats()));
      return define(hint, "\"\\\"\" " + body + " \"\\\"\"");
    }
    if (auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) bad(at + "/pattern", "'pattern' must be a string");
      if (s.contains("minLength") || s.contains("maxLength"))
        bad(at + "/pattern", "'pattern' together with 'minLength' or 'maxLength' is not supported");
      std::string body;
      try {
        body = regex_to_gbnf(p->get<std::string>());
      } catch (const Error& e) {
        bad(at + "/pattern", e.what());
      }
      return define(hint, "\"\\\"\" " + body + " \"\\\"\"");
    }
    const int64_t min = count(s, "minLength", at, 0), max = count(s, "maxLength", at, -1);
    if (max >= 0 && max < min) bad(at + "/maxLength", "'maxLength' is below 'minLength'");
    if (min == 0 && max < 0) return "string";
    return define(hint, max < 0 ? fmt::format("\"\\\"\" char{{{},}} \"\\\"\"", min)
                                : fmt::format("\"\\\"\" char{{{},{}}} \"\\\"\"", min, max));
  }

  // An integer bound: minimum rounds up, maximum down; exclusive ones step past the value. A number's
  // bounds must be whole (so that "k" and "k.f" split cleanly at them) and inclusive.
  std::optional<int64_t> bound(const json& s, const char* key, const std::string& at, bool integer) {
    auto it = s.find(key);
    if (it == s.end()) return std::nullopt;
    if (!it->is_number()) bad(at + "/" + key, fmt::format("'{}' must be a number", key));
    const double d = it->get<double>();
    if (std::abs(d) > 1e15) bad(at + "/" + key, fmt::format("'{}' beyond 1e15 is not supported", key));
    const std::string k = key;
    const bool exclusive = k.rfind("exclusive", 0) == 0, is_min = k.find("inimum") != std::string::npos;
    if (!integer) return 0;  // numbers: decimal_range reads the bound exactly
    if (is_min) return exclusive ? (int64_t)std::floor(d) + 1 : (int64_t)std::ceil(d);
    return exclusive ? (int64_t)std::ceil(d) - 1 : (int64_t)std::floor(d);
  }

  std::string number(const json& s, const std::string& at, bool integer) {
    check_known(s, at, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"});
    std::optional<int64_t> lo = bound(s, "minimum", at, integer), hi = bound(s, "maximum", at, integer);
    if (auto x = bound(s, "exclusiveMinimum", at, integer)) lo = lo ? std::max(*lo, *x) : *x;
    if (auto x = bound(s, "exclusiveMaximum", at, integer)) hi = hi ? std::min(*hi, *x) : *x;
    if (lo && hi && *lo > *hi) bad(at, "no number lies between the minimum and the maximum");
    if (!lo && !hi) return integer ? "int" : "number";
    if (integer) return gbnf_int_range(lo, hi);
    return decimal_range(s, at);
  }

  // A number's bounds as exact decimals (fractions and exclusive bounds included).
  std::string decimal_range(const json& s, const std::string& at) {
    std::optional<Decimal> lo, hi;
    for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      const std::string k = key;
      const std::optional<Decimal> d = parse_decimal(it->dump(), k.rfind("exclusive", 0) == 0);
      if (!d) bad(at + "/" + key, fmt::format("'{}' needs at most 15 integer and 16 fraction digits", key));
      auto value = [](const Decimal& x) { return (x.negative ? -1.0 : 1.0) * std::stod(fmt::format("{}.{}0", x.magnitude.m, x.magnitude.frac)); };
      if (k.find("inimum") != std::string::npos) {
        if (!lo || value(*d) > value(*lo) || (value(*d) == value(*lo) && d->magnitude.strict)) lo = d;
      } else if (!hi || value(*d) < value(*hi) || (value(*d) == value(*hi) && d->magnitude.strict)) {
        hi = d;
      }
    }
    const std::optional<std::string> g = gbnf_decimal_range(lo, hi);
    if (!g) bad(at, "no number lies between the minimum and the maximum");
    return *g;
  }

  const json& root_;
  const std::string prefix_;
  std::map<std::string, std::string> rules_;
  std::set<std::string> reserved_{"root", "ws", "char", "string", "int", "number", "boolean", "null", "value", "object", "array"};
  std::map<std::string, std::string> refs_;
  const json kAnything = json::object();
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  return Converter(schema, "").rules(schema, "root") + kPrimitives;
}

std::string json_schema_rules(const nlohmann::ordered_json& root, const nlohmann::ordered_json& part,
                              const std::string& rule_name) {
  return Converter(root, rule_name + "-").rules(part, rule_name);
}

std::string json_primitives_gbnf() { return kPrimitives; }

std::string json_object_gbnf() { return std::string("root ::= object\n") + kPrimitives; }

}  // namespace xpert
