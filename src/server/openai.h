// The OpenAI wire format: request bodies of /v1/chat/completions and /v1/completions checked field by
// field into a CompletionRequest, and OpenAI's error shape. Every bad field becomes an ApiError that
// names the parameter (OpenAI's `param`) and says what was expected.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "runtime/engine.h"

namespace xpert::server {

using ojson = nlohmann::ordered_json;

struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;  // empty param / code are sent as null
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {},
           std::string type = {});
};

// {"error": {"message", "type", "param", "code"}}; type defaults by status.
std::string error_body(int status, const std::string& message, const std::string& param = {},
                       const std::string& code = {}, const std::string& type = {});

// A prompt of /v1/completions: text, or token ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

struct CompletionRequest {
  bool chat = false;
  std::string model;           // empty when the client sent none
  ojson messages;              // chat: checked array of {role, content, ...}
  ojson tools = nullptr;       // chat: passed to the template
  std::vector<Prompt> prompts; // completions: one or more (OpenAI's "array of strings" / "of arrays")
  int n = 1;                   // choices per prompt
  bool echo = false;           // completions: the prompt comes back before each choice's text
  std::optional<std::string> suffix;  // completions: the text after the gap (fill-in-the-middle)
  GenerateParams gen;  // everything but the prompt
  bool stream = false, include_usage = false;
  bool logprobs = false;  // chat: logprobs; completions: logprobs is an int (gen.top_logprobs)
  // chat: tool use and reasoning (chat_request.cpp)
  enum class ToolChoice { automatic, none, required, function };
  ToolChoice tool_choice = ToolChoice::automatic;
  std::string tool_choice_name;     // ToolChoice::function: the function to call
  bool parallel_tool_calls = true;  // false: one call at most
  bool split_reasoning = true;      // reasoning_format: <think> spans into reasoning_content (none: kept)
  ojson template_kwargs = ojson::object();  // chat_template_kwargs: more template variables
};

// A prompt field: a string, an array of token ids, or an array of up to `max` of those.
std::vector<Prompt> parse_prompts(const ojson& p, const std::string& param, size_t max);

// Throws ApiError (400) for malformed JSON and for every field of the wrong type or out of range.
CompletionRequest parse_completion_request(const std::string& body, bool chat);

// chat_request.cpp: tools, tool_choice, parallel_tool_calls, reasoning_format, chat_template_kwargs, and
// the assistant tool calls / tool results in `messages`. Throws ApiError naming the field.
void parse_chat_tool_fields(const ojson& body, CompletionRequest& r);

// A 400 naming the first top-level field of `body` that is not in `known` (a field we would ignore).
void reject_unknown_fields(const ojson& body, std::initializer_list<const char*> known);

// JSON dump that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const ojson& j);

// The checks every API's parser shares. Each throws ApiError(400) naming the field; absent or null
// optional fields give the default.
namespace fields {
ojson parse_body(const std::string& text);  // a JSON object, not nested too deep
const char* type_name(const ojson& v);
[[noreturn]] void bad(const std::string& param, const std::string& msg);
const ojson* field(const ojson& body, const char* name);
double number(const ojson& body, const char* name, double lo, double hi, double def);
int64_t integer(const ojson& body, const char* name, int64_t lo, int64_t hi, int64_t def);
bool boolean(const ojson& body, const char* name, bool def);
std::string string(const ojson& body, const char* name, const std::string& def = {});
// The same inside a nested object `obj` found at `at` (e.g. "messages[2]"): errors name "at.name".
std::string string_in(const ojson& obj, const char* name, const std::string& at, const std::string& def = {});
bool boolean_in(const ojson& obj, const char* name, const std::string& at, bool def);
// temperature, top_p, top_k, min_p, penalties, seed: the sampling fields the APIs share.
void sampling(const ojson& body, SamplingParams& sp);
// 'stop' (OpenAI) or 'stop_sequences' (Anthropic): a string or up to `max` strings.
std::vector<std::string> stops(const ojson& body, const char* name, size_t max);
}  // namespace fields

}  // namespace xpert::server
