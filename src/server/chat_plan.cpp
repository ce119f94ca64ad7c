#include "server/chat_plan.h"

#include <fmt/format.h>

#include <set>

#include "base/error.h"
#include "sample/json_schema.h"
#include "server/context.h"
#include "text/chat_template.h"

namespace xpert::server {

std::string forced_call_start(ToolFormat format, const std::string& name) {
  const bool named = !name.empty();
  switch (format) {
    case ToolFormat::hermes_json:
      return "<tool_call>\n{\"name\": \"" + (named ? name + "\", \"arguments\": " : "");
    case ToolFormat::qwen_xml:
      return "<tool_call>\n<function=" + (named ? name + ">\n" : "");
    case ToolFormat::llama3_json:
      return "{\"name\": \"" + (named ? name + "\", \"parameters\": " : "");
    default:
      return "{\"tool_calls\": [{\"name\": \"" + (named ? name + "\", \"arguments\": " : "");
  }
}

namespace {

// A GBNF string literal.
std::string literal(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

const ojson& function_of(const ojson& tool) { return tool["function"]; }

// The schema of a tool's arguments: its `parameters`, else any object.
ojson parameters_schema(const ojson& tool) {
  const ojson& fn = function_of(tool);
  auto p = fn.find("parameters");
  if (p == fn.end() || p->is_null()) return ojson{{"type", "object"}, {"additionalProperties", true}};
  return *p;
}

[[noreturn]] void bad_schema(size_t i, const JsonSchemaError& e) {
  const std::string param = fmt::format("tools[{}].function.parameters", i);
  throw ApiError(400, fmt::format("'{}' cannot constrain a forced call: {}", param, e.what()), param);
}

// JSON arguments (hermes, llama3, generic): the values of the tool's schema.
std::string json_arguments_rules(const ojson& tool, size_t i, const std::string& rule) {
  const ojson schema = parameters_schema(tool);
  try {
    return json_schema_rules(schema, schema, rule);
  } catch (const JsonSchemaError& e) {
    bad_schema(i, e);
  }
}

// Qwen3.5's XML arguments: <parameter=NAME>\nVALUE\n</parameter>\n per property in the schema's order
// (the required ones always, the others optionally), a string's value as raw text, any other value as
// JSON of its schema. A string's enum is kept; its other constraints (pattern, format, lengths) are not
// expressed in raw text. Without properties: any parameter names.
std::string xml_arguments_rules(const ojson& tool, size_t i, const std::string& rule) {
  const ojson schema = parameters_schema(tool);
  auto props = schema.find("properties");
  if (props == schema.end() || !props->is_object() || props->empty())
    return rule + R"( ::= ( "<parameter=" [a-zA-Z0-9_.-]{1,64} ">\n" [^<]* "</parameter>\n" )*)" + "\n";
  std::set<std::string> required;
  if (auto r = schema.find("required"); r != schema.end() && r->is_array())
    for (const ojson& n : *r)
      if (n.is_string()) required.insert(n.get<std::string>());
  std::string body, rules;
  size_t k = 0;
  for (auto& [name, prop] : props->items()) {
    const std::string value_rule = fmt::format("{}-p{}", rule, k++);
    const bool is_string = prop.is_object() && prop.contains("type") && prop["type"] == "string";
    std::string value;
    if (is_string && prop.contains("enum") && prop["enum"].is_array()) {
      for (const ojson& e : prop["enum"])
        if (e.is_string()) value += (value.empty() ? "" : " | ") + literal(e.get<std::string>());
      value = "( " + (value.empty() ? std::string("[^<]*") : value) + R"( ) "\n")";
    } else if (is_string) {
      value = "[^<]*";
    } else {
      try {
        rules += json_schema_rules(schema, prop, value_rule);
      } catch (const JsonSchemaError& e) {
        bad_schema(i, e);
      }
      value = value_rule + R"( "\n")";
    }
    const std::string one = R"("<parameter=" )" + literal(name) + R"( ">\n" )" + value + R"( "</parameter>\n")";
    body += required.count(name) ? " " + one : " ( " + one + " )?";
  }
  return rules + rule + " ::=" + body + "\n";
}

}  // namespace

std::string forced_call_grammar(ToolFormat format, const ojson& tools, const std::string& name, bool parallel) {
  // What comes between a call's name and its arguments, after the arguments, and before another call.
  std::string sep = R"("\", \"arguments\": ")", end = R"(ws "}")", next;
  switch (format) {
    case ToolFormat::hermes_json:
      end = R"(ws "}" ws "</tool_call>")", next = R"(ws "<tool_call>" ws "{\"name\": \"")";
      break;
    case ToolFormat::qwen_xml:
      sep = R"(">\n")", end = R"("</function>\n</tool_call>")", next = R"(ws "<tool_call>\n<function=")";
      break;
    case ToolFormat::llama3_json:
      sep = R"("\", \"parameters\": ")";
      break;
    default:
      next = R"(ws "," ws "{\"name\": \"")";
      break;
  }
  // One arguments rule per tool, so the call's name picks its schema.
  std::string g, calls, named_args;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string fn = function_of(tools[i])["name"].get<std::string>();
    const std::string rule = fmt::format("args{}", i);
    g += format == ToolFormat::qwen_xml ? xml_arguments_rules(tools[i], i, rule)
                                         : json_arguments_rules(tools[i], i, rule);
    calls += (calls.empty() ? "" : " | ") + literal(fn) + " " + sep + " " + rule;
    if (fn == name) named_args = rule;
  }
  g += "call ::= ( " + calls + " ) " + end + "\n";
  const std::string first = name.empty() ? "call" : named_args + " " + end;
  const std::string more = parallel && !next.empty() ? " ( " + next + " call )*" : "";
  // Whitespace may end it: a model that wrote a newline after its last call then stops.
  g += "root ::= " + first + more + (format == ToolFormat::generic_json ? R"( ws "]}")" : "") + " ws\n";
  return g + json_primitives_gbnf();
}

ChatPlan plan_chat(const Context& ctx, const CompletionRequest& r, std::string call_id_prefix) {
  using TC = CompletionRequest::ToolChoice;
  const ChatTemplate& tmpl = *ctx.m.chat_template;
  const bool use_tools = !r.tools.is_null() && r.tool_choice != TC::none;
  ChatRenderOptions ro;
  ro.tools = use_tools ? r.tools : nullptr;
  ro.extra = r.template_kwargs;

  ChatPlan p;
  p.prompt = ctx.render_chat(r.messages, ro, "messages");
  // Templates without tools get the generic JSON convention in their system message (ChatTemplate).
  p.format = tmpl.capabilities().tools ? tool_format_for(tmpl.source()) : ToolFormat::generic_json;

  std::string_view end = p.prompt.text;
  while (!end.empty() && (end.back() == '\n' || end.back() == ' ')) end.remove_suffix(1);
  const bool in_reasoning = end.size() >= 7 && end.substr(end.size() - 7) == "<think>";

  p.output.split_reasoning = r.split_reasoning;
  p.output.in_reasoning = in_reasoning;
  p.output.parse_tools = use_tools;
  p.output.parallel_calls = r.parallel_tool_calls;
  p.output.tools = use_tools ? r.tools : nullptr;
  p.output.call_id_prefix = std::move(call_id_prefix);

  if (use_tools && (r.tool_choice == TC::required || r.tool_choice == TC::function)) {
    // A forced call skips the thinking a template opened.
    if (in_reasoning) p.forced = "</think>\n\n";
    p.forced += forced_call_start(p.format, r.tool_choice == TC::function ? r.tool_choice_name : "");
    p.prompt.text += p.forced;
    p.grammar = forced_call_grammar(p.format, r.tools, r.tool_choice == TC::function ? r.tool_choice_name : "",
                                    r.parallel_tool_calls);
  }
  return p;
}

}  // namespace xpert::server
