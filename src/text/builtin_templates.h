// Chat templates for models whose GGUF carries none (tokenizer.chat_template missing), by architecture.
// A file's own template always wins; these are the published templates of the model families, so a
// stripped conversion still gets the prompt format it was trained on.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"

namespace xpert {

// The built-in template source for general.architecture `arch`, if there is one.
std::optional<std::string_view> builtin_chat_template(std::string_view arch);

// The file's template; else the built-in one for its architecture; else ChatML. Logs which one is used.
ChatTemplate chat_template_for(const gguf::GGUFFile& file);

// The names --chat-template takes: "chatml" and the architectures with a built-in template.
std::vector<std::string> builtin_chat_template_names();

// --chat-template-file PATH (a Jinja file) or --chat-template NAME (a built-in) instead of the file's
// template; both empty: chat_template_for(file). bos/eos text comes from the file's vocabulary. Throws
// Error for an unknown name, an unreadable file or a template that does not parse.
ChatTemplate chat_template_override(const gguf::GGUFFile& file, const std::string& name, const std::string& path);

}  // namespace xpert
