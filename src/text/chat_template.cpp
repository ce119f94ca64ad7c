#include "text/chat_template.h"

#include "base/error.h"
#include "base/log.h"
#include "format/gguf.h"
#include "text/jinja/template.h"

namespace xpert {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kChatML =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content if message.content is string else '') + "
    "'<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

std::string token_text(const gguf::GGUFFile& file, const char* id_key) {
  const auto id = file.get_int(id_key);
  const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
  if (!id || !tokens || *id < 0 || static_cast<size_t>(*id) >= tokens->strings.size()) return "";
  return tokens->strings[static_cast<size_t>(*id)];
}

// Text of a content-part list, or nullopt when it holds something other than text parts.
std::optional<std::string> join_text_parts(const ojson& parts) {
  std::string out;
  bool first = true;
  for (const ojson& p : parts) {
    if (!p.is_object() || p.value("type", "") != "text" || !p.contains("text") || !p["text"].is_string()) {
      return std::nullopt;
    }
    if (!first) out += "\n";
    first = false;
    out += p["text"].get<std::string>();
  }
  return out;
}

}  // namespace

const char* ChatTemplate::chatml_source() { return kChatML; }

ChatTemplate ChatTemplate::chatml(std::string bos_token, std::string eos_token) {
  return ChatTemplate(kChatML, std::move(bos_token), std::move(eos_token));
}

ChatTemplate ChatTemplate::from_gguf(const gguf::GGUFFile& file) {
  auto source = file.get_string("tokenizer.chat_template");
  if (!source) {
    fail("{}: no chat template (tokenizer.chat_template is missing); pass a template file or use ChatML",
         file.path());
  }
  return ChatTemplate(*source, token_text(file, "tokenizer.ggml.bos_token_id"),
                      token_text(file, "tokenizer.ggml.eos_token_id"));
}

ChatTemplate ChatTemplate::from_gguf_or_chatml(const gguf::GGUFFile& file) {
  if (file.get_string("tokenizer.chat_template")) return from_gguf(file);
  log::warn(
      "{}: no tokenizer.chat_template; using ChatML, which may not be the format this model was trained on",
      file.path());
  return chatml(token_text(file, "tokenizer.ggml.bos_token_id"),
                token_text(file, "tokenizer.ggml.eos_token_id"));
}

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {
  try {
    template_ = std::make_shared<jinja::Template>(source_);
  } catch (const Error& e) {
    fail("chat template: {}", e.what());
  }
  probe();
}

void ChatTemplate::probe() {
  ChatRenderOptions plain;
  plain.add_generation_prompt = false;
  auto try_render = [&](const ojson& messages) -> std::optional<std::string> {
    try {
      return render_raw(messages, plain);
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  // Content parts: the text must come out, and not as a printed Python list.
  const ojson parts = ojson::array(
      {{{"role", "user"}, {"content", ojson::array({{{"type", "text"}, {"text", "xpert-probe-text"}}})}}});
  const auto with_parts = try_render(parts);
  caps_.content_parts = with_parts && with_parts->find("xpert-probe-text") != std::string::npos &&
                        with_parts->find("'type'") == std::string::npos &&
                        with_parts->find("\"type\"") == std::string::npos;
  // Tool-call arguments: an object must come out as JSON, not fail or print as a Python dict.
  auto tool_chat = [](ojson arguments) {
    return ojson::array(
        {{{"role", "user"}, {"content", "xpert-probe-question"}},
         {{"role", "assistant"},
          {"content", ""},
          {"tool_calls",
           ojson::array(
               {{{"id", "call_0"},
                 {"type", "function"},
                 {"function", {{"name", "xpert_probe_fn"}, {"arguments", std::move(arguments)}}}}})}}});
  };
  const auto with_object = try_render(tool_chat({{"xpert_probe_arg", "xpert-probe-value"}}));
  const bool object_ok = with_object && with_object->find("xpert-probe-value") != std::string::npos &&
                         with_object->find("{'xpert_probe_arg'") == std::string::npos;
  const auto with_string = try_render(tool_chat("{\"xpert_probe_arg\": \"xpert-probe-value\"}"));
  const bool string_ok = with_string && with_string->find("xpert-probe-value") != std::string::npos;
  caps_.object_arguments = object_ok || !string_ok;
}

ojson ChatTemplate::normalize(const ojson& messages) const {
  if (!messages.is_array()) fail("chat messages: expected an array, got {}", messages.type_name());
  ojson out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    if (!m.is_object()) fail("chat messages[{}]: expected an object, got {}", i, m.type_name());
    if (!m.contains("role") || !m["role"].is_string()) fail("chat messages[{}]: missing string 'role'", i);
    if (m.contains("content") && m["content"].is_array() && !caps_.content_parts) {
      auto text = join_text_parts(m["content"]);
      if (!text) fail("chat messages[{}]: this model's chat template takes only text content", i);
      m["content"] = *text;
    }
    if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (ojson& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      ojson& fn = call["function"];
      if (!fn.contains("arguments")) continue;
      ojson& args = fn["arguments"];
      if (caps_.object_arguments && args.is_string()) {
        ojson parsed = ojson::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (parsed.is_object()) args = std::move(parsed);
      } else if (!caps_.object_arguments && !args.is_string()) {
        args = jinja::Value::from_json(args).to_json({});
      }
    }
  }
  return out;
}

std::string ChatTemplate::render_raw(const ojson& messages, const ChatRenderOptions& options) const {
  jinja::Value vars = jinja::Value::dict();
  jinja::Dict& d = vars.entries();
  d.set("messages", jinja::Value::from_json(messages));
  d.set("tools", options.tools.is_null() ? jinja::Value::none() : jinja::Value::from_json(options.tools));
  d.set("documents", jinja::Value::none());
  d.set("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
  d.set("bos_token", jinja::Value::string(bos_token_));
  d.set("eos_token", jinja::Value::string(eos_token_));
  if (options.extra.is_object()) {
    for (const auto& [k, v] : options.extra.items()) d.set(k, jinja::Value::from_json(v));
  }
  jinja::RenderSettings settings;
  settings.now_unix = options.now_unix;
  return template_->render(vars, settings);
}

std::string ChatTemplate::render(const ojson& messages, const ChatRenderOptions& options) const {
  if (!options.tools.is_null() && !options.tools.is_array()) {
    fail("chat tools: expected an array of tool definitions, got {}", options.tools.type_name());
  }
  const ojson normalized = normalize(messages);
  try {
    return render_raw(normalized, options);
  } catch (const Error& e) {
    fail("chat template: {}", e.what());
  }
}

}  // namespace xpert
