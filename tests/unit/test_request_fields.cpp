// Every field of each generating API's request body, through each JSON type: the parse either gives
// parameters in their documented ranges or throws ApiError with a 4xx and a message (never another
// exception: the route would answer 500). The deterministic sweep behind the fuzz target's random one
// (tests/fuzz/fuzz_http.cpp, same checks: tests/common/request_checks.h); it found what the fuzzer took
// a CI run to hit (an empty "stop_sequences" string reaching the engine's parameters).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/request_checks.h"

namespace {

using xpert::server::ApiError;
using xpert::server::ojson;

// A body of each route that sets every field it reads, nested ones included.
const ojson& schema() {
  static const ojson s = ojson::parse(R"({"type": "object", "properties": {
    "a": {"type": "string", "minLength": 1, "maxLength": 5}, "p": {"type": "string", "pattern": "^[a-z]{1,3}$"},
    "b": {"type": "integer", "minimum": 0, "maximum": 10},
    "c": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    "d": {"enum": ["x", 1, null]}, "e": {"const": "k"},
    "f": {"anyOf": [{"type": "string", "format": "date"}, {"$ref": "#/$defs/g"}]},
    "h": {"oneOf": [{"type": "boolean"}, {"type": "null"}]}, "i": {"allOf": [{"type": "object"}]}},
    "required": ["a"], "additionalProperties": false, "$defs": {"g": {"type": "number", "exclusiveMinimum": 0}}})");
  return s;
}

struct Seed {
  const char* path;
  ojson body;
};

std::vector<Seed> seeds() {
  ojson chat = ojson::parse(R"({"model": "m", "messages": [{"role": "system", "content": "s"},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": "r"}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": true, "max_tokens": 8,
    "max_completion_tokens": 8, "temperature": 0.5, "top_p": 0.9, "top_k": 4, "min_p": 0.1, "seed": 1, "stop": ["x"],
    "n": 1, "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
    "logit_bias": {"5": 1.0}, "presence_penalty": 0.1, "frequency_penalty": 0.1, "repeat_penalty": 1.1,
    "reasoning_format": "auto", "chat_template_kwargs": {"enable_thinking": false}, "user": "u"})");
  chat["tools"] = ojson::array(
      {{{"type", "function"},
        {"function", {{"name", "f"}, {"description", "d"}, {"parameters", schema()}, {"strict", true}}}}});
  chat["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "n"}, {"schema", schema()}, {"strict", true}}}};
  ojson grammar = chat;
  grammar.erase("response_format");
  grammar["grammar"] = "root ::= \"a\"";
  ojson completion =
      ojson::parse(R"({"model": "m", "prompt": [[1, 2], "x"], "suffix": "s", "echo": true, "n": 2,
    "stop": "s", "logprobs": 2, "max_tokens": 4, "response_format": {"type": "json_object"}, "seed": 3,
    "stream": true, "stream_options": {"include_usage": true}})");
  ojson messages = ojson::parse(R"({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s"}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
      {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}], "is_error": false}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
      {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]}],
    "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true}, "thinking": {"type": "disabled"},
    "stop_sequences": ["x"], "temperature": 0.5, "top_p": 0.9, "top_k": 3, "stream": true, "metadata": {"user_id": "u"}})");
  messages["tools"] = ojson::array({{{"name", "f"}, {"description", "d"}, {"input_schema", schema()}}});
  ojson count =
      ojson::parse(R"({"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}]})");
  count["tools"] = ojson::array({{{"name", "f"}, {"input_schema", schema()}}});
  ojson responses =
      ojson::parse(R"({"model": "m", "instructions": "i", "input": [{"role": "developer", "content": "d"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c", "output": "o"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "y"}]}], "previous_response_id": "resp_kept",
    "tool_choice": "auto", "parallel_tool_calls": false, "max_output_tokens": 8, "temperature": 0.5, "top_p": 0.9,
    "stream": true, "store": false, "reasoning": {"effort": "low"}, "include": [], "metadata": {"a": "b"},
    "truncation": "auto"})");
  responses["tools"] =
      ojson::array({{{"type", "function"}, {"name", "f"}, {"parameters", schema()}, {"strict", true}}});
  responses["text"] = {
      {"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", schema()}, {"strict", true}}}};
  return {{"/v1/chat/completions", chat},       {"/v1/chat/completions", grammar},
          {"/v1/completions", completion},      {"/v1/messages", messages},
          {"/v1/messages/count_tokens", count}, {"/v1/responses", responses}};
}

// A value of each JSON type, and the edges of the ranges the parsers check.
std::vector<ojson> values() {
  return {nullptr,
          true,
          false,
          0,
          -1,
          1,
          2147483648LL,
          9223372036854775807LL,
          -9223372036854775807LL - 1,
          18446744073709551615ULL,
          0.5,
          -0.5,
          1e300,
          -1e300,
          4.9e-324,
          "",
          "x",
          "auto",
          std::string(1, '\0'),
          ojson::array(),
          ojson::array({nullptr}),
          ojson::array({1}),
          ojson::array({""}),
          ojson::array({"x"}),
          ojson::object(),
          ojson{{"a", 1}},
          ojson{{"type", "x"}}};
}

// Every JSON pointer in v (the root included).
void pointers(const ojson& v, const ojson::json_pointer& at, std::vector<ojson::json_pointer>& out) {
  out.push_back(at);
  if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it) pointers(it.value(), at / it.key(), out);
  else if (v.is_array())
    for (size_t i = 0; i < v.size(); ++i) pointers(v[i], at / i, out);
}

// "" when the route either refuses the body with a 4xx naming the problem or parses it into parameters in
// range; otherwise what went wrong.
std::string verdict(const char* path, const ojson& body) {
  try {
    const std::string d = xpert::server::checks::check_request(path, body.dump());
    return d.empty() ? "" : "parsed out of range: " + d;
  } catch (const ApiError& e) {
    return xpert::server::checks::refusal_defect(e);
  } catch (const std::exception& e) {
    return std::string("an exception other than ApiError (a 500): ") + e.what();
  }
}

TEST(RequestFields, EveryFieldThroughEveryType) {
  const std::vector<Seed> all = seeds();
  const std::vector<ojson> vals = values();
  size_t parsed = 0;
  for (const Seed& s : all) {
    // The seed itself parses on its own route (so the sweep starts from a body that gets through).
    EXPECT_EQ(xpert::server::checks::check_request(s.path, s.body.dump()), "") << s.path;
    for (const Seed& other : all)
      EXPECT_EQ(verdict(other.path, s.body), "") << other.path << " " << s.body.dump();
    std::vector<ojson::json_pointer> ptrs;
    pointers(s.body, ojson::json_pointer(), ptrs);
    for (const ojson::json_pointer& p : ptrs) {
      for (const ojson& v : vals) {
        ojson b = s.body;
        b[p] = v;
        const std::string why = verdict(s.path, b);
        EXPECT_EQ(why, "") << s.path << " with " << p.to_string() << " = " << v.dump();
        ++parsed;
      }
      if (p.empty()) continue;
      ojson b = s.body;
      ojson& parent = b[p.parent_pointer()];
      if (parent.is_object())
        parent.erase(p.back());
      else
        parent.erase(parent.begin() + std::stol(p.back()));
      EXPECT_EQ(verdict(s.path, b), "") << s.path << " without " << p.to_string();
    }
  }
  EXPECT_GT(parsed, 10000u);
}

}  // namespace
