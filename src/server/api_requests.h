// Request bodies of Anthropic's Messages API and OpenAI's Responses API, checked field by field into
// OpenAI chat terms (CompletionRequest) and GenerateParams. Parsing only: no model, no engine, so the
// HTTP fuzz target (tests/fuzz/fuzz_http.cpp) drives exactly what the routes run. Every bad field is an
// ApiError naming it.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "server/openai.h"

namespace xpert::server {

struct MessagesRequest {
  std::string model;
  CompletionRequest chat;  // messages, tools, tool_choice in OpenAI's chat terms (for plan_chat)
  GenerateParams gen;
  bool stream = false;
};

// Anthropic's request -> the chat messages the template takes. `generate`: /v1/messages (max_tokens is
// required there, and the sampling fields are read); false: /v1/messages/count_tokens.
MessagesRequest parse_messages_request(const std::string& text, bool generate);

struct ResponsesRequest {
  std::string model;
  ojson messages = ojson::array();  // previous conversation + this input (no instructions)
  std::string instructions;
  ojson tools_in = ojson::array();  // as the client sent them (echoed in the response)
  ojson tools = nullptr;            // for the template
  std::string previous_id;
  bool store = true, stream = false;
  ojson metadata = ojson::object();
  ojson text_format = {{"type", "text"}};
  ojson reasoning = {{"effort", nullptr}, {"summary", nullptr}};  // echoed in the response
  CompletionRequest gen;  // sampling, max tokens, grammar from text.format, enable_thinking from reasoning
};

// The conversation stored under a previous_response_id, or none (a 404).
using PreviousConversation = std::function<std::optional<ojson>(const std::string& id)>;
ResponsesRequest parse_responses_request(const std::string& text, const PreviousConversation& previous);

}  // namespace xpert::server
