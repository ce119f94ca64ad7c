#include "server/tool_calls.h"

#include <cctype>

namespace xpert::server {

namespace {

using ojson = nlohmann::ordered_json;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string compact(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

const ojson* find_function(const ojson& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const ojson& t : tools) {
    if (!t.is_object()) continue;
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) continue;
    auto n = f->find("name");
    if (n != f->end() && n->is_string() && n->get<std::string>() == name) return &*f;
  }
  return nullptr;
}

// {name, arguments|parameters} or {type: function, function: {name, arguments}} -> a call.
std::optional<ToolCall> call_from_object(const ojson& o) {
  if (!o.is_object()) return std::nullopt;
  if (auto f = o.find("function"); f != o.end() && f->is_object()) return call_from_object(*f);
  auto name = o.find("name");
  if (name == o.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  ToolCall c{name->get<std::string>(), "{}"};
  for (const char* key : {"arguments", "parameters"}) {
    auto a = o.find(key);
    if (a == o.end() || a->is_null()) continue;
    if (a->is_string()) {  // arguments as a JSON string, as OpenAI sends them
      ojson parsed = ojson::parse(a->get<std::string>(), nullptr, false);
      if (!parsed.is_object()) return std::nullopt;
      c.arguments = compact(parsed);
    } else if (a->is_object()) {
      c.arguments = compact(*a);
    } else {
      return std::nullopt;
    }
    break;
  }
  return c;
}

void collect_calls(const ojson& v, std::vector<ToolCall>& out, bool& ok) {
  if (v.is_array()) {
    if (v.empty()) ok = false;
    for (const ojson& e : v) collect_calls(e, out, ok);
    return;
  }
  if (v.is_object()) {
    for (const char* key : {"tool_calls", "tool_call"}) {
      if (auto tc = v.find(key); tc != v.end() && v.size() == 1) return collect_calls(*tc, out, ok);
    }
  }
  if (auto c = call_from_object(v))
    out.push_back(std::move(*c));
  else
    ok = false;
}

}  // namespace

ToolFormat tool_format_for(std::string_view src) {
  if (src.find("<function=") != std::string_view::npos && src.find("<parameter=") != std::string_view::npos)
    return ToolFormat::qwen_xml;
  if (src.find("<tool_call>") != std::string_view::npos) return ToolFormat::hermes_json;
  if (src.find("<|python_tag|>") != std::string_view::npos || src.find("ipython") != std::string_view::npos)
    return ToolFormat::llama3_json;
  return ToolFormat::generic_json;
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::hermes_json:
      return "hermes_json";
    case ToolFormat::qwen_xml:
      return "qwen_xml";
    case ToolFormat::llama3_json:
      return "llama3_json";
    default:
      return "generic_json";
  }
}

std::optional<size_t> json_value_end(std::string_view s, size_t pos, bool* bad) {
  if (bad) *bad = false;
  if (pos >= s.size()) return std::nullopt;
  const char c0 = s[pos];
  auto fail = [&]() -> std::optional<size_t> {
    if (bad) *bad = true;
    return std::nullopt;
  };
  if (c0 == '{' || c0 == '[' || c0 == '"') {
    std::string stack;
    bool in_string = false, escaped = false;
    for (size_t i = pos; i < s.size(); ++i) {
      const char c = s[i];
      if (in_string) {
        if (escaped)
          escaped = false;
        else if (c == '\\')
          escaped = true;
        else if (c == '"') {
          in_string = false;
          if (stack.empty()) return i + 1;
        }
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        stack.push_back(c == '{' ? '}' : ']');
      } else if (c == '}' || c == ']') {
        if (stack.empty() || stack.back() != c) return fail();
        stack.pop_back();
        if (stack.empty()) return i + 1;
      }
    }
    return std::nullopt;
  }
  // A scalar ends at a delimiter; at the end of the text it may still go on.
  if (!(c0 == '-' || std::isdigit((unsigned char)c0) || c0 == 't' || c0 == 'f' || c0 == 'n')) return fail();
  for (size_t i = pos; i < s.size(); ++i)
    if (s[i] == ',' || s[i] == '}' || s[i] == ']' || is_space(s[i])) return i;
  return std::nullopt;
}

std::string parameter_type(const ojson& tools, const std::string& function, const std::string& parameter) {
  const ojson* f = find_function(tools, function);
  if (!f) return "";
  auto params = f->find("parameters");
  if (params == f->end() || !params->is_object()) return "";
  auto props = params->find("properties");
  if (props == params->end() || !props->is_object()) return "";
  auto p = props->find(parameter);
  if (p == props->end() || !p->is_object()) return "";
  auto t = p->find("type");
  if (t != p->end() && t->is_string()) return t->get<std::string>();
  return "";
}

std::string xml_parameter_json(std::string value, const std::string& type) {
  if (!value.empty() && value.front() == '\n') value.erase(0, 1);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (type != "string") {
    ojson parsed = ojson::parse(trim(value), nullptr, false);
    if (!parsed.is_discarded()) {
      // Without a schema, only what is clearly not text is read as JSON.
      if (!type.empty() || !parsed.is_string()) return compact(parsed);
    }
  }
  return compact(ojson(value));
}

std::optional<ToolCall> parse_tagged_call(std::string_view inner, const ojson& tools) {
  inner = trim(inner);
  if (starts_with(inner, "<function=")) {
    const size_t close = inner.find('>');
    if (close == std::string_view::npos) return std::nullopt;
    ToolCall c{std::string(trim(inner.substr(10, close - 10))), ""};
    if (c.name.empty()) return std::nullopt;
    std::string_view rest = inner.substr(close + 1);
    std::string text = "{";
    bool first = true;
    while (true) {
      const size_t p = rest.find("<parameter=");
      if (p == std::string_view::npos) break;
      const size_t e = rest.find('>', p);
      if (e == std::string_view::npos) return std::nullopt;
      const std::string pname(trim(rest.substr(p + 11, e - p - 11)));
      const size_t end = rest.find("</parameter>", e);
      if (end == std::string_view::npos) return std::nullopt;
      const std::string value(rest.substr(e + 1, end - e - 1));
      text += (first ? "" : ", ") + compact(ojson(pname)) + ": " +
              xml_parameter_json(value, parameter_type(tools, c.name, pname));
      first = false;
      rest = rest.substr(end + 12);
    }
    c.arguments = text + "}";
    return c;
  }
  const size_t start = inner.find('{');
  if (start != 0) return std::nullopt;
  ojson v = ojson::parse(inner, nullptr, false);
  if (v.is_discarded()) return std::nullopt;
  return call_from_object(v);
}

std::optional<std::vector<ToolCall>> parse_json_calls(std::string_view text, const ojson& tools) {
  text = trim(text);
  if (starts_with(text, "<|python_tag|>")) text = trim(text.substr(14));
  if (starts_with(text, "```")) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos || text.size() < 6 || text.substr(text.size() - 3) != "```")
      return std::nullopt;
    const std::string_view lang = trim(text.substr(3, nl - 3));
    if (!lang.empty() && lang != "json") return std::nullopt;
    text = trim(text.substr(nl, text.size() - 3 - nl));
  }
  if (text.empty() || (text.front() != '{' && text.front() != '[')) return std::nullopt;
  std::vector<ToolCall> calls;
  bool ok = true;
  size_t pos = 0;
  while (pos < text.size() && ok) {
    bool bad = false;
    const auto end = json_value_end(text, pos, &bad);
    if (!end) return std::nullopt;
    ojson v = ojson::parse(text.substr(pos, *end - pos), nullptr, false);
    if (v.is_discarded()) return std::nullopt;
    collect_calls(v, calls, ok);
    pos = *end;
    while (pos < text.size() && (is_space(text[pos]) || text[pos] == ';' || text[pos] == ',')) ++pos;
  }
  if (!ok || calls.empty()) return std::nullopt;
  for (const ToolCall& c : calls)
    if (!find_function(tools, c.name)) return std::nullopt;
  return calls;
}

}  // namespace xpert::server
