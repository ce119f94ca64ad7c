// A chat request's prompt, rendered so that user text never becomes control tokens: before the template
// runs, every control-token spelling inside the messages' (and tools') strings is swapped for a
// placeholder; after it, the placeholders are put back and their byte ranges kept, so the tokenizer reads
// the template's own markers ("<start_of_turn>") as control tokens and the user's "<end_of_turn>" as text.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "text/chat_template.h"

namespace xpert {
class Tokenizer;
}

namespace xpert::server {

struct ChatPrompt {
  std::string text;
  std::vector<std::pair<size_t, size_t>> literal;  // [begin, end) of user text spelling control tokens
};

// Throws what ChatTemplate::render throws.
ChatPrompt render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok, const nlohmann::ordered_json& messages,
                              ChatRenderOptions options);

}  // namespace xpert::server
