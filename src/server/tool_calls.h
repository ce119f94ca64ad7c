// Tool calls in a model's output text, in the formats of the families we run:
//   Qwen2.5 / Qwen3 / Hermes  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   Qwen3.5 / 3.6, Qwen3-Coder <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
//   Llama 3.x                 [<|python_tag|>]{"name": "f", "parameters": {...}}  (several: ';' between)
//   generic JSON              {"name": ..., "arguments": ...}, {"tool_calls": [...]}, a list of calls,
//                             optionally inside a ```json fence
// The streaming state machine over these (with <think> spans) is ChatOutputParser (chat_output.h).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpert::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object
};

// Which format a model's chat template asks its model to call tools in (decides the text that forces a
// call and the instructions for templates that do not render tools).
enum class ToolFormat { hermes_json, qwen_xml, llama3_json, generic_json };
ToolFormat tool_format_for(std::string_view template_source);
const char* tool_format_name(ToolFormat f);

// The end of the JSON value that starts at s[pos] (one past its last byte), std::nullopt while it is
// incomplete; `bad` is set when s[pos] cannot start a value or a closing bracket does not match.
std::optional<size_t> json_value_end(std::string_view s, size_t pos, bool* bad = nullptr);

// The inside of one <tool_call>…</tool_call> (JSON or the <function=…> form), nullopt when it is not a
// call. `tools` (the request's definitions) types the <parameter=…> values: a string parameter stays a
// string, others are read as JSON where they parse.
std::optional<ToolCall> parse_tagged_call(std::string_view inner, const nlohmann::ordered_json& tools);

// Text that is nothing but JSON tool calls (Llama 3.x, generic): one call object ({name, arguments} or
// {name, parameters}, or OpenAI's {type, function: {name, arguments}}), {"tool_calls": [...]}, a list of
// those, several objects separated by ';' or newlines, in a ```json fence or after <|python_tag|>.
// Every name must be one of `tools`' functions; else nullopt (the text is content).
std::optional<std::vector<ToolCall>> parse_json_calls(std::string_view text, const nlohmann::ordered_json& tools);

// The JSON type of a function parameter in `tools` ("string", "integer", ...), empty when unknown.
std::string parameter_type(const nlohmann::ordered_json& tools, const std::string& function,
                           const std::string& parameter);

// A <parameter=…> value (one newline each side stripped) as JSON text, typed by its schema.
std::string xml_parameter_json(std::string value, const std::string& type);

}  // namespace xpert::server
