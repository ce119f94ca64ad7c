#include "server/chat_prompt.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace xpert::server {

namespace {

// U+FDD0 and U+FDD1: Unicode noncharacters, which no template changes.
constexpr std::string_view kOpen = "\xEF\xB7\x90", kClose = "\xEF\xB7\x91";

void mask(nlohmann::ordered_json& j, const Tokenizer& tok, std::vector<std::string>& originals) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    auto spans = tok.control_spans(s);
    // The user's own U+FDD0 is swapped too, so no user text can pose as a placeholder.
    for (size_t p = s.find(kOpen); p != std::string::npos; p = s.find(kOpen, p + kOpen.size()))
      spans.emplace_back(p, p + kOpen.size());
    if (spans.empty()) return;
    std::sort(spans.begin(), spans.end());
    std::string out;
    size_t at = 0;
    for (auto [b, e] : spans) {
      out.append(s, at, b - at);
      out += kOpen;
      out += std::to_string(originals.size());
      out += kClose;
      originals.push_back(s.substr(b, e - b));
      at = e;
    }
    out.append(s, at, std::string::npos);
    j = std::move(out);
  } else if (j.is_array() || j.is_object()) {
    for (auto& v : j) mask(v, tok, originals);
  }
}

}  // namespace

ChatPrompt render_chat_prompt(const ChatTemplate& tmpl, const Tokenizer& tok, const nlohmann::ordered_json& messages,
                              ChatRenderOptions options) {
  std::vector<std::string> originals;
  nlohmann::ordered_json masked = messages;
  mask(masked, tok, originals);
  if (!options.tools.is_null()) mask(options.tools, tok, originals);
  const std::string rendered = tmpl.render(masked, options);
  if (originals.empty()) return {rendered, {}};

  ChatPrompt p;
  p.text.reserve(rendered.size());
  size_t at = 0;
  while (true) {
    const size_t open = rendered.find(kOpen, at);
    if (open == std::string::npos) break;
    const size_t digits = open + kOpen.size();
    size_t end = digits;
    while (end < rendered.size() && end - digits < 9 && rendered[end] >= '0' && rendered[end] <= '9') ++end;
    if (end == digits || rendered.compare(end, kClose.size(), kClose) != 0) {
      p.text.append(rendered, at, digits - at);  // not a placeholder (the user's own U+FDD0): plain text
      at = digits;
      continue;
    }
    const size_t k = std::stoul(rendered.substr(digits, end - digits));
    p.text.append(rendered, at, open - at);
    if (k < originals.size()) {
      p.literal.emplace_back(p.text.size(), p.text.size() + originals[k].size());
      p.text += originals[k];
    } else {
      p.text.append(rendered, open, end + kClose.size() - open);
    }
    at = end + kClose.size();
  }
  p.text.append(rendered, at, std::string::npos);
  return p;
}

}  // namespace xpert::server
