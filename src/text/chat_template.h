// Chat templates: OpenAI-style messages -> the prompt text a model was trained on, by running the
// model's own Jinja template (GGUF `tokenizer.chat_template`) the way Hugging Face's
// apply_chat_template does, so the prompt is byte-identical to transformers'.
//
//   ChatTemplate t = ChatTemplate::from_gguf(file);
//   std::string prompt = t.render(messages, {.add_generation_prompt = true, .tools = tools});
//
// Before rendering, messages are brought into the shape the template can take (see Capabilities):
// tool-call `function.arguments` become JSON objects (transformers' convention) unless the template
// concatenates them as strings, and content given as a list of {type: text} parts is joined with "\n"
// when the template only handles string content.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace xpert {

namespace gguf {
class GGUFFile;
}
namespace jinja {
class Template;
}

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Tool definitions ({"type": "function", "function": {...}}), or null for none. Key order is kept:
  // templates print tools with `tojson`.
  nlohmann::ordered_json tools = nullptr;
  // More template variables, e.g. {"enable_thinking": false}; they override the standard ones.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // Render what the template lacks (Capabilities) the way render() describes, instead of as the template
  // alone would (which may drop tools or raise). The server sets it; the reference tests do not.
  bool fallbacks = false;
  // The clock of `strftime_now`, as Unix seconds formatted in UTC; unset: the local time now.
  std::optional<int64_t> now_unix;
};

class ChatTemplate {
 public:
  // What the template accepts, found once by rendering probe conversations.
  struct Capabilities {
    bool content_parts = false;    // renders content given as [{type: text, text}] lists
    bool object_arguments = true;  // takes tool-call arguments as a JSON object (else a string)
    // Without these, render() with options.fallbacks falls back: tool definitions go into the system message with a JSON
    // calling convention, assistant tool calls become that JSON in the content, tool results become
    // user messages, `developer` becomes `system`.
    bool tools = false;         // renders the tool definitions
    bool tool_calls = false;    // renders an assistant message's tool_calls
    bool tool_results = false;  // renders role "tool" messages
    bool developer_role = false;
  };

  // tokenizer.chat_template, with bos/eos token text from the vocabulary. Throws Error when the file
  // has no template or the template does not parse.
  static ChatTemplate from_gguf(const gguf::GGUFFile& file);
  // As from_gguf, but a model without a template gets ChatML (with a warning in the log).
  static ChatTemplate from_gguf_or_chatml(const gguf::GGUFFile& file);
  static ChatTemplate chatml(std::string bos_token = "", std::string eos_token = "");
  static const char* chatml_source();

  // Throws Error ("chat template: line N: ...") when the template does not parse.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);

  // `messages`: an array of {role, content, [tool_calls], [tool_call_id], [name], [reasoning_content]}.
  // Throws Error for malformed messages and when the template fails or calls raise_exception.
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options = {}) const;

  const std::string& source() const { return source_; }
  const Capabilities& capabilities() const { return caps_; }

 private:
  nlohmann::ordered_json normalize(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;
  std::string render_raw(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;
  void probe();

  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  std::shared_ptr<const jinja::Template> template_;
  Capabilities caps_;
};

}  // namespace xpert
