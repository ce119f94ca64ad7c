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
  caps_.tool_calls = object_ok || string_ok;

  auto found = [](const std::optional<std::string>& text, const char* what) {
    return text && text->find(what) != std::string::npos;
  };
  ojson with_result = tool_chat(caps_.object_arguments ? ojson{{"xpert_probe_arg", "v"}} : ojson("{}"));
  with_result.push_back({{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", "xpert-probe-result"}});
  caps_.tool_results = found(try_render(with_result), "xpert-probe-result");
  caps_.developer_role = found(try_render(ojson::array({{{"role", "developer"}, {"content", "xpert-probe-dev"}},
                                                        {{"role", "user"}, {"content", "q"}}})),
                               "xpert-probe-dev");
  ChatRenderOptions with_tools = plain;
  with_tools.tools = ojson::array(
      {{{"type", "function"},
        {"function",
         {{"name", "xpert_probe_tool"},
          {"description", "probe"},
          {"parameters", {{"type", "object"}, {"properties", ojson::object()}}}}}}});
  try {
    caps_.tools = render_raw(ojson::array({{{"role", "user"}, {"content", "q"}}}), with_tools)
                      .find("xpert_probe_tool") != std::string::npos;
  } catch (const Error&) {
    caps_.tools = false;
  }
}

namespace {

// A system message that lists the tools and a JSON calling convention, for templates without tools.
std::string tools_system_text(const ojson& tools) {
  std::string out =
      "You can call the following tools (JSON schemas of their arguments):\n";
  for (const ojson& t : tools) out += "\n" + t.dump(-1, ' ', false, ojson::error_handler_t::replace);
  out +=
      "\n\nTo call tools, answer with only this JSON and nothing else:\n"
      "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<arguments>}}]}";
  return out;
}

std::string text_of(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) return join_text_parts(content).value_or("");
  return "";
}

}  // namespace

ojson ChatTemplate::normalize(const ojson& messages, const ChatRenderOptions& options) const {
  if (!messages.is_array()) fail("chat messages: expected an array, got {}", messages.type_name());
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) fail("chat messages[{}]: expected an object, got {}", i, m.type_name());
    if (!m.contains("role") || !m["role"].is_string()) fail("chat messages[{}]: missing string 'role'", i);
  }
  // The fallbacks for what the template does not render (Capabilities).
  const ojson& tools = options.tools;
  const bool fb = options.fallbacks;
  ojson out = ojson::array();
  if (fb && tools.is_array() && !tools.empty() && !caps_.tools) {
    std::string text = tools_system_text(tools);
    if (!messages.empty() && (messages[0]["role"] == "system" || messages[0]["role"] == "developer"))
      text = text_of(messages[0]["content"]) + "\n\n" + text;
    out.push_back({{"role", "system"}, {"content", text}});
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson m = messages[i];
    const std::string role = m["role"].get<std::string>();
    if (i == 0 && !out.empty() && (role == "system" || role == "developer")) continue;  // merged above
    if (!fb) {
      out.push_back(std::move(m));
      continue;
    }
    if (role == "developer" && !caps_.developer_role) m["role"] = "system";
    const bool has_calls = m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty();
    if (role == "assistant" && has_calls && (!m.contains("content") || m["content"].is_null())) m["content"] = "";
    if (role == "assistant" && has_calls && !caps_.tool_calls) {
      ojson calls = ojson::array();
      for (const ojson& c : m["tool_calls"]) {
        const ojson fn = c.is_object() ? c.value("function", ojson::object()) : ojson::object();
        if (!fn.is_object()) continue;
        ojson args = fn.value("arguments", ojson::object());
        if (args.is_string()) {
          ojson parsed = ojson::parse(args.get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) args = std::move(parsed);
        }
        calls.push_back({{"name", fn.value("name", "")}, {"arguments", args}});
      }
      std::string text = text_of(m["content"]);
      if (!text.empty()) text += "\n";
      m["content"] = text + ojson{{"tool_calls", calls}}.dump(-1, ' ', false, ojson::error_handler_t::replace);
      m.erase("tool_calls");
    }
    if (role == "tool" && !caps_.tool_results) {
      std::string text = "Tool result";
      if (m.contains("name") && m["name"].is_string()) text += " of " + m["name"].get<std::string>();
      text += ":\n" + text_of(m["content"]);
      // Consecutive results become one user turn (templates that want turns to alternate).
      if (!out.empty() && out.back().value("xpert_tool_result", false)) {
        out.back()["content"] = out.back()["content"].get<std::string>() + "\n\n" + text;
        continue;
      }
      m = {{"role", "user"}, {"content", text}, {"xpert_tool_result", true}};
    }
    out.push_back(std::move(m));
  }
  for (ojson& m : out) m.erase("xpert_tool_result");
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
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
  const ojson normalized = normalize(messages, options);
  try {
    if (options.fallbacks && !caps_.tools && !options.tools.is_null()) {  // the tools are in the system message
      ChatRenderOptions without = options;
      without.tools = nullptr;
      return render_raw(normalized, without);
    }
    return render_raw(normalized, options);
  } catch (const Error& e) {
    fail("chat template: {}", e.what());
  }
}

}  // namespace xpert
