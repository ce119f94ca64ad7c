// What a parsed API request must satisfy whatever body a client sent: the checks of the HTTP fuzz target
// (tests/fuzz/fuzz_http.cpp) and of the unit test that sweeps every field of the APIs' bodies through each
// JSON type (tests/unit/test_request_fields.cpp). check_request parses `body` as route `path` runs it: it
// returns "" when the parameters are in their documented ranges and a description of the first that is
// not; a bad field throws ApiError (the route's 4xx), as the parsers do.
#pragma once
#include <cmath>
#include <optional>
#include <string>

#include "server/api_requests.h"
#include "server/openai.h"

namespace xpert::server::checks {

inline std::string sampling_defect(const SamplingParams& sp) {
  if (!std::isfinite(sp.temperature) || sp.temperature < 0)
    return "temperature out of range: " + std::to_string(sp.temperature);
  if (!std::isfinite(sp.top_p) || sp.top_p < 0 || sp.top_p > 1)
    return "top_p out of range: " + std::to_string(sp.top_p);
  if (!std::isfinite(sp.min_p) || sp.min_p < 0 || sp.min_p > 1)
    return "min_p out of range: " + std::to_string(sp.min_p);
  if (!std::isfinite(sp.presence_penalty) || !std::isfinite(sp.frequency_penalty) ||
      !std::isfinite(sp.repeat_penalty))
    return "penalty not finite";
  for (auto& [id, bias] : sp.logit_bias)
    if (id < 0 || !std::isfinite(bias)) return "logit_bias entry out of range: " + std::to_string(id);
  return "";
}

inline std::string gen_defect(const GenerateParams& g) {
  if (std::string s = sampling_defect(g.sampling); !s.empty()) return s;
  if (g.max_tokens < 0) return "negative max_tokens: " + std::to_string(g.max_tokens);
  if (g.top_logprobs > 20) return "top_logprobs above 20: " + std::to_string(g.top_logprobs);
  for (const std::string& s : g.stop)
    if (s.empty()) return "empty stop string";
  return "";
}

// What a refusal must be: a 4xx with a message ("" when it is).
inline std::string refusal_defect(const ApiError& e) {
  if (e.status < 400 || e.status > 499)
    return "an ApiError of status " + std::to_string(e.status) + ": " + e.what();
  if (std::string(e.what()).empty()) return "an ApiError without a message";
  return "";
}

// What each route runs before it renders a prompt and submits. /v1/responses has one stored conversation,
// "resp_kept", as if an earlier response had been kept.
inline std::string check_request(const std::string& path, const std::string& body) {
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    const CompletionRequest r = parse_completion_request(body, path == "/v1/chat/completions");
    if (r.n < 1) return "n below 1: " + std::to_string(r.n);
    if (r.include_usage && !r.stream) return "stream_options without stream";
    if (r.chat && !r.messages.is_array()) return "messages not an array";
    return gen_defect(r.gen);
  }
  if (path == "/v1/messages" || path == "/v1/messages/count_tokens") {
    const MessagesRequest r = parse_messages_request(body, path == "/v1/messages");
    if (!r.chat.messages.is_array()) return "messages not an array";
    for (const ojson& m : r.chat.messages)
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return "message without a role: " + m.dump();
    return gen_defect(r.gen);
  }
  const ResponsesRequest r = parse_responses_request(body, [](const std::string& id) -> std::optional<ojson> {
    if (id != "resp_kept") return std::nullopt;
    return ojson::array(
        {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "hello"}}});
  });
  if (!r.messages.is_array()) return "messages not an array";
  return gen_defect(r.gen.gen);
}

}  // namespace xpert::server::checks
