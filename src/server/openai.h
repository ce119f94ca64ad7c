// The OpenAI wire format: request bodies of /v1/chat/completions and /v1/completions checked field by
// field into a CompletionRequest, and OpenAI's error shape. Every bad field becomes an ApiError that
// names the parameter (OpenAI's `param`) and says what was expected.
#pragma once
#include <nlohmann/json.hpp>
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

struct CompletionRequest {
  bool chat = false;
  std::string model;                   // empty when the client sent none
  ojson messages;                      // chat: checked array of {role, content, ...}
  ojson tools = nullptr;               // chat: passed to the template
  std::string prompt_text;             // completions: text prompt ...
  std::vector<int32_t> prompt_tokens;  // ... or token ids
  bool prompt_is_tokens = false;
  GenerateParams gen;  // everything but the prompt
  bool stream = false, include_usage = false;
  bool logprobs = false;  // chat: logprobs; completions: logprobs is an int (gen.top_logprobs)
};

// Throws ApiError (400) for malformed JSON and for every field of the wrong type or out of range.
CompletionRequest parse_completion_request(const std::string& body, bool chat);

// JSON dump that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const ojson& j);

}  // namespace xpert::server
