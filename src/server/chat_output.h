// What an assistant's generated text means to an OpenAI client: `<think>` spans become
// reasoning_content, tool calls (formats in tool_calls.h) become tool_calls, the rest is content.
// One state machine for streaming and whole responses, so both say the same thing:
//
//   ChatOutputParser p({.parse_tools = true, .tools = tools});
//   for (piece : generated) send(p.feed(piece));   // only what can no longer turn out otherwise
//   send(p.finish());                               // what was held back
//   p.content(), p.reasoning(), p.calls()           // the totals (non-streaming response)
//
// Text that may still become a marker (`<tool_c…`) is held back, so a call's text is never sent as
// content. Tool-call arguments stream in pieces where the format allows it: the JSON form with
// "name" before "arguments" streams the arguments as they are generated; the <function=…> form
// streams a parameter at a time; other forms come whole when the call ends.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"

namespace xpert::server {

struct ChatOutputOptions {
  bool split_reasoning = true;  // false (reasoning_format "none"): <think> spans stay in content
  bool in_reasoning = false;    // the prompt ended inside an open <think> span
  bool parse_tools = false;     // tools were given and tool_choice is not "none"
  bool parallel_calls = true;   // false: calls after the first are dropped
  nlohmann::ordered_json tools = nullptr;
  std::string call_id_prefix = "call_";  // call i gets id prefix + i
};

struct CallDelta {
  size_t index = 0;
  std::string id, name;  // set on a call's first delta only
  std::string arguments;
};

struct ChatDelta {
  std::string content, reasoning;
  std::vector<CallDelta> calls;
  bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
};

struct ParsedCall {
  std::string id;
  ToolCall call;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions options);

  ChatDelta feed(std::string_view text);
  ChatDelta finish();

  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ParsedCall>& calls() const { return calls_; }
  ChatDelta whole() const;  // the totals as one delta

 private:
  enum class Mode { start, content, reasoning, tagged_call, json_whole };

  void run(bool final);
  bool step_start(bool final);
  bool step_content(bool final);
  bool step_reasoning(bool final);
  bool step_tagged_call(bool final);
  void stream_tagged_call(std::string_view s);
  void close_tagged_call(std::string_view inner);
  void emit_content(std::string_view s);
  void emit_reasoning(std::string_view s);
  // A new call (name and id); false when it is dropped (parallel calls off).
  bool begin_call(const std::string& name);
  void emit_arguments(std::string_view s);

  ChatOutputOptions o_;
  Mode mode_ = Mode::start;
  std::string pending_;  // text not yet classified
  ChatDelta delta_;      // what the current feed/finish releases
  std::string content_, reasoning_;
  std::vector<ParsedCall> calls_;
  bool reasoning_started_ = false;
  bool call_open_ = false;     // the current tagged call has been announced (name sent)
  bool call_dropped_ = false;  // ... or dropped: its arguments go nowhere
  size_t args_start_ = 0;      // JSON form: where the arguments value starts in pending_
  size_t args_sent_ = 0;       // JSON form: bytes of pending_ sent as arguments; XML: bytes consumed
  bool args_done_ = false;
  bool xml_first_param_ = true;
  bool incremental_failed_ = false;  // the call's text does not stream: it comes whole at its end
};

// The assistant message's fields beyond role, in OpenAI's shape: content (null when there are only
// calls), reasoning_content, tool_calls ({id, type, function: {name, arguments}}). `delta`: a streaming
// chunk's, with only what is there and each call's index.
nlohmann::ordered_json message_fields(const ChatDelta& d, bool delta);

}  // namespace xpert::server
