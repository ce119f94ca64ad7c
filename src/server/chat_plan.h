// A chat request -> the prompt text and how to read the answer: the template rendered with the
// request's tools and chat_template_kwargs (and the fallbacks for what it lacks), whether the answer
// starts inside a <think> span, and for tool_choice "required" or a named function the start of a call
// in the model family's format, appended to the prompt, and a grammar (GBNF) for the rest of the call, so
// the answer is a call to one of the tools, with JSON arguments, and nothing else.
#pragma once
#include <string>
#include <vector>

#include "server/chat_output.h"
#include "server/chat_prompt.h"
#include "server/openai.h"

namespace xpert::server {

struct ChatPlan {
  ChatPrompt prompt;         // the prompt, ending with `forced`
  std::string forced;        // the start of a call the prompt forces; the parser reads it first
  ChatOutputOptions output;  // how to read the generated text
  ToolFormat format = ToolFormat::generic_json;
  std::string grammar;  // GBNF for the generated text when a call is forced, else empty
};

// The call's first text for each format; `name` empty: up to the name ("required").
std::string forced_call_start(ToolFormat format, const std::string& name);

// GBNF for what follows forced_call_start(format, name): the function's name (one of `tools`) unless
// given, arguments that the named tool's `parameters` schema accepts, the call's end; more calls after
// it when `parallel` (not Llama 3). Throws ApiError (400, param tools[i].function.parameters) for a
// schema the converter cannot express (sample/json_schema.h).
std::string forced_call_grammar(ToolFormat format, const ojson& tools, const std::string& name, bool parallel);

struct Context;

// Throws ApiError (400, param "messages") when the template rejects the conversation.
ChatPlan plan_chat(const Context& ctx, const CompletionRequest& r, std::string call_id_prefix);

}  // namespace xpert::server
