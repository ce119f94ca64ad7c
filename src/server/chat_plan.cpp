#include "server/chat_plan.h"

#include <fmt/format.h>

#include "base/error.h"
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

// Any JSON object, whitespace bounded (a small model must not pad forever).
constexpr const char* kJsonRules = R"(
obj ::= "{" ws ( str ws ":" ws val ( ws "," ws str ws ":" ws val )* )? ws "}"
val ::= obj | arr | str | num | "true" | "false" | "null"
arr ::= "[" ws ( val ( ws "," ws val )* )? ws "]"
str ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] | "\\u" [0-9a-fA-F]{4} )* "\""
num ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws ::= [ \t\n]{0,20}
)";

}  // namespace

std::string forced_call_grammar(ToolFormat format, const std::vector<std::string>& names, const std::string& name,
                                bool parallel) {
  std::string g;
  std::string name_rule;
  for (const std::string& n : names) name_rule += (name_rule.empty() ? "" : " | ") + literal(n);
  const bool named = !name.empty();
  switch (format) {
    case ToolFormat::hermes_json: {
      const std::string rest = "\"\\\", \\\"arguments\\\": \" obj ws \"}\" ws \"</tool_call>\"";
      g = "root ::= " + std::string(named ? "obj ws \"}\" ws \"</tool_call>\"" : "fname " + rest) +
          (parallel ? " more" : "") + "\n";
      if (parallel) g += "more ::= ( ws \"<tool_call>\" ws \"{\\\"name\\\": \\\"\" fname " + rest + " )*\n";
      break;
    }
    case ToolFormat::qwen_xml: {
      const std::string params =
          "( \"<parameter=\" [a-zA-Z0-9_.-]{1,64} \">\\n\" [^<]* \"</parameter>\\n\" )* \"</function>\\n</tool_call>\"";
      g = "root ::= " + std::string(named ? "" : "fname \">\\n\" ") + params + (parallel ? " more" : "") + "\n";
      if (parallel) g += "more ::= ( ws \"<tool_call>\\n<function=\" fname \">\\n\" " + params + " )*\n";
      break;
    }
    case ToolFormat::llama3_json:
      g = "root ::= " + std::string(named ? "" : "fname \"\\\", \\\"parameters\\\": \" ") + "obj ws \"}\"\n";
      break;
    default: {
      const std::string call = "fname \"\\\", \\\"arguments\\\": \" obj ws \"}\"";
      g = "root ::= " + std::string(named ? "obj ws \"}\"" : call) +
          (parallel ? " ( ws \",\" ws \"{\\\"name\\\": \\\"\" " + call + " )*" : "") + " ws \"]}\"\n";
      break;
    }
  }
  g += "fname ::= " + (name_rule.empty() ? literal(name) : name_rule) + "\n";
  return g + kJsonRules;
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
    std::vector<std::string> names;
    for (const auto& t : r.tools) names.push_back(t["function"]["name"].get<std::string>());
    p.grammar = forced_call_grammar(p.format, names, r.tool_choice == TC::function ? r.tool_choice_name : "",
                                    r.parallel_tool_calls);
  }
  return p;
}

}  // namespace xpert::server
