// Chat templates for models whose GGUF carries none (tokenizer.chat_template missing), by architecture.
// A file's own template always wins; these are the published templates of the model families, so a
// stripped conversion still gets the prompt format it was trained on.
#pragma once
#include <optional>
#include <string_view>

#include "text/chat_template.h"

namespace xpert {

// The built-in template source for general.architecture `arch`, if there is one.
std::optional<std::string_view> builtin_chat_template(std::string_view arch);

// The file's template; else the built-in one for its architecture; else ChatML. Logs which one is used.
ChatTemplate chat_template_for(const gguf::GGUFFile& file);

}  // namespace xpert
