#include "text/builtin_templates.h"

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "format/gguf.h"

namespace xpert {
namespace {

// Gemma 3 (google/gemma-3-*-it tokenizer_config.json), as in tests/reference/templates/Gemma-3.jinja.
constexpr std::string_view kGemma3 = R"TPL({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
)TPL";

struct Builtin {
  std::string_view arch, source;
};
constexpr Builtin kBuiltins[] = {{"gemma3", kGemma3}};

std::string token_text(const gguf::GGUFFile& file, const char* id_key) {
  const auto id = file.get_int(id_key);
  const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
  if (!id || !tokens || *id < 0 || static_cast<size_t>(*id) >= tokens->strings.size()) return "";
  return tokens->strings[static_cast<size_t>(*id)];
}

}  // namespace

std::optional<std::string_view> builtin_chat_template(std::string_view arch) {
  for (const Builtin& b : kBuiltins)
    if (b.arch == arch) return b.source;
  return std::nullopt;
}

ChatTemplate chat_template_for(const gguf::GGUFFile& file) {
  if (file.get_string("tokenizer.chat_template")) {
    log::info("chat template: the model file's own");
    return ChatTemplate::from_gguf(file);
  }
  const std::string arch = file.get_string("general.architecture").value_or("");
  if (auto src = builtin_chat_template(arch)) {
    log::info("chat template: the file has none; using the built-in {} template", arch);
    return ChatTemplate(std::string(*src), token_text(file, "tokenizer.ggml.bos_token_id"),
                        token_text(file, "tokenizer.ggml.eos_token_id"));
  }
  log::warn("chat template: the file has none and there is no built-in one for '{}'; using ChatML", arch);
  return ChatTemplate::chatml(token_text(file, "tokenizer.ggml.bos_token_id"), token_text(file, "tokenizer.ggml.eos_token_id"));
}

std::vector<std::string> builtin_chat_template_names() {
  std::vector<std::string> names = {"chatml"};
  for (const Builtin& b : kBuiltins) names.emplace_back(b.arch);
  return names;
}

ChatTemplate chat_template_override(const gguf::GGUFFile& file, const std::string& name, const std::string& path) {
  const std::string bos = token_text(file, "tokenizer.ggml.bos_token_id"),
                    eos = token_text(file, "tokenizer.ggml.eos_token_id");
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("--chat-template-file {}: cannot read the file", path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().empty()) fail("--chat-template-file {}: the file is empty", path);
    log::info("chat template: from {}", path);
    try {
      return ChatTemplate(ss.str(), bos, eos);
    } catch (const Error& e) {
      fail("--chat-template-file {}: {}", path, e.what());
    }
  }
  if (!name.empty()) {
    if (name == "chatml") return ChatTemplate::chatml(bos, eos);
    if (auto src = builtin_chat_template(name)) {
      log::info("chat template: the built-in {} template (--chat-template)", name);
      return ChatTemplate(std::string(*src), bos, eos);
    }
    std::string known;
    for (const std::string& n : builtin_chat_template_names()) known += (known.empty() ? "" : ", ") + n;
    fail("--chat-template {}: no built-in template of that name (built-in: {}); use --chat-template-file for "
         "a Jinja file",
         name, known);
  }
  return chat_template_for(file);
}

}  // namespace xpert
