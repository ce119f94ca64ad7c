// The tool-use and reasoning fields of a chat request, checked field by field (OpenAI's meaning).
#include <fmt/format.h>

#include <algorithm>

#include "server/openai.h"

namespace xpert::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

const char* kind(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

const ojson* field(const ojson& o, const char* name) {
  auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

void check_tools(const ojson& tools, std::vector<std::string>& names) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad(at, fmt::format("'{}' must be an object, got {}", at, kind(t)));
    const ojson* type = field(t, "type");
    if (!type || *type != "function")
      bad(at + ".type", fmt::format("'{}.type' must be \"function\" (the only tool type this server runs)", at));
    const ojson* fn = field(t, "function");
    if (!fn || !fn->is_object()) bad(at + ".function", fmt::format("'{}.function' must be an object", at));
    const ojson* name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      bad(at + ".function.name", fmt::format("'{}.function.name' must be a non-empty string", at));
    if (const ojson* d = field(*fn, "description"); d && !d->is_string())
      bad(at + ".function.description", fmt::format("'{}.function.description' must be a string", at));
    if (const ojson* p = field(*fn, "parameters"); p && !p->is_object())
      bad(at + ".function.parameters",
          fmt::format("'{}.function.parameters' must be a JSON schema object, got {}", at, kind(*p)));
    if (const ojson* s = field(*fn, "strict"); s && !s->is_boolean())
      bad(at + ".function.strict", fmt::format("'{}.function.strict' must be a boolean", at));
    names.push_back(name->get<std::string>());
  }
}

// Assistant tool calls must be well formed: the template prints them.
void check_tool_call_messages(const ojson& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const ojson* calls = field(m, "tool_calls");
    if (!calls) continue;
    const std::string at = fmt::format("messages[{}].tool_calls", i);
    if (m["role"] != "assistant") bad(at, fmt::format("'{}' is only allowed on assistant messages", at));
    if (!calls->is_array()) bad(at, fmt::format("'{}' must be an array, got {}", at, kind(*calls)));
    for (size_t j = 0; j < calls->size(); ++j) {
      const ojson& c = (*calls)[j];
      const std::string cat = fmt::format("{}[{}]", at, j);
      if (!c.is_object()) bad(cat, fmt::format("'{}' must be an object, got {}", cat, kind(c)));
      const ojson* fn = field(c, "function");
      if (!fn || !fn->is_object()) bad(cat + ".function", fmt::format("'{}.function' must be an object", cat));
      const ojson* name = field(*fn, "name");
      if (!name || !name->is_string())
        bad(cat + ".function.name", fmt::format("'{}.function.name' must be a string", cat));
      const ojson* args = field(*fn, "arguments");
      if (args && !args->is_string() && !args->is_object())
        bad(cat + ".function.arguments",
            fmt::format("'{}.function.arguments' must be a JSON string (or an object), got {}", cat, kind(*args)));
      if (const ojson* id = field(c, "id"); id && !id->is_string())
        bad(cat + ".id", fmt::format("'{}.id' must be a string", cat));
    }
  }
}

}  // namespace

void parse_chat_tool_fields(const ojson& body, CompletionRequest& r) {
  check_tool_call_messages(r.messages);
  std::vector<std::string> names;
  if (r.tools.is_array()) check_tools(r.tools, names);

  if (const ojson* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string s = tc->get<std::string>();
      if (s == "auto")
        r.tool_choice = CompletionRequest::ToolChoice::automatic;
      else if (s == "none")
        r.tool_choice = CompletionRequest::ToolChoice::none;
      else if (s == "required")
        r.tool_choice = CompletionRequest::ToolChoice::required;
      else
        bad("tool_choice",
            fmt::format("'tool_choice' is '{}'; expected \"auto\", \"none\", \"required\" or "
                        "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                        s));
    } else if (tc->is_object()) {
      const ojson* fn = field(*tc, "function");
      const ojson* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (field(*tc, "type") && (*tc)["type"] != "function")
        bad("tool_choice.type", "'tool_choice.type' must be \"function\"");
      if (!name || !name->is_string())
        bad("tool_choice.function.name", "'tool_choice' must name a function: {\"type\": \"function\", "
                                         "\"function\": {\"name\": ...}}");
      r.tool_choice = CompletionRequest::ToolChoice::function;
      r.tool_choice_name = name->get<std::string>();
      if (std::find(names.begin(), names.end(), r.tool_choice_name) == names.end())
        bad("tool_choice", fmt::format("'tool_choice' names the function '{}', which is not in 'tools'",
                                       r.tool_choice_name));
    } else {
      bad("tool_choice", fmt::format("'tool_choice' must be a string or an object, got {}", kind(*tc)));
    }
    const bool forcing = r.tool_choice == CompletionRequest::ToolChoice::required ||
                         r.tool_choice == CompletionRequest::ToolChoice::function;
    if (forcing && names.empty()) bad("tool_choice", "'tool_choice' requires a call, but 'tools' is empty");
  }
  if (const ojson* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean())
      bad("parallel_tool_calls", fmt::format("'parallel_tool_calls' must be a boolean, got {}", kind(*p)));
    r.parallel_tool_calls = p->get<bool>();
  }
  if (const ojson* f = field(body, "reasoning_format")) {
    const std::string s = f->is_string() ? f->get<std::string>() : "";
    if (s == "none")
      r.split_reasoning = false;
    else if (s == "auto" || s == "deepseek" || s == "parsed")
      r.split_reasoning = true;
    else
      bad("reasoning_format", "'reasoning_format' must be \"auto\" (<think> spans into reasoning_content, the "
                              "default) or \"none\" (kept in content)");
  }
  if (const ojson* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object())
      bad("chat_template_kwargs",
          fmt::format("'chat_template_kwargs' must be an object of template variables, got {}", kind(*k)));
    for (const char* reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
      if (k->contains(reserved))
        bad("chat_template_kwargs",
            fmt::format("'chat_template_kwargs' may not set '{}'; it comes from the request", reserved));
    r.template_kwargs = *k;
  }
}

void reject_unknown_fields(const ojson& body, std::initializer_list<const char*> known) {
  for (const auto& item : body.items()) {
    const std::string& key = item.key();  // not a structured binding: clang 14 cannot capture those
    if (item.value().is_null()) continue;  // null means "the default", as everywhere
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) != known.end()) continue;
    bad(key, fmt::format("'{}' is not supported by this server; remove it from the request", key));
  }
}

}  // namespace xpert::server
