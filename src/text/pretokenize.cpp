#include "text/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/error.h"

namespace xpert {

namespace {

// llama.cpp's regexes (llama-vocab.cpp) as they run there; the contractions are spelled [sS] rather
// than (?i:...) because case-insensitive matching would also take "'ſ" (U+017F) for "'s".
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The same patterns as the Hugging Face tokenizer.json files write them.
constexpr std::string_view kHfGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Entry {
  std::vector<std::string_view> aliases;  // the first is the canonical name
  PreTokenizerSpec spec;
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> e;
    e.push_back(
        {{"default"},
         {"default", {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}, "", false, false}});
    e.push_back({{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                  "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "trillion", "granite-docling"},
                 {"gpt-2", {kGpt2}, kHfGpt2, false, false}});
    e.push_back({{"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                  "jina-v5-nano"},
                 {"llama-bpe", {kLlama3}, kHfLlama3, true, true}});
    e.push_back({{"dbrx", "smaug-bpe"}, {"dbrx", {kLlama3}, "", false, false}});
    e.push_back({{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "solar-open", "kormo", "f2llmv2"},
                 {"qwen2", {kQwen2}, kHfQwen2, false, false}});
    e.push_back({{"qwen35"}, {"qwen35", {kQwen35}, kHfQwen35, false, false}});
    e.push_back({{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"},
                 {"starcoder", {R"(\p{N})", kGpt2}, "", false, false}});
    return e;
  }();
  return entries;
}

// \s as Unicode's White_Space property, which llama.cpp and Hugging Face (Oniguruma) use. PCRE2's \s
// under UCP also takes U+180E MONGOLIAN VOWEL SEPARATOR, a space before Unicode 6.3.
constexpr std::string_view kSpaceMembers =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string with_unicode_spaces(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kSpaceMembers) : "[" + std::string(kSpaceMembers) + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceMembers) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  for (const Entry& e : table()) {
    for (std::string_view a : e.aliases) {
      if (a == name) return &e.spec;
    }
  }
  return nullptr;
}

const PreTokenizerSpec* find_pre_tokenizer_by_regex(std::string_view pattern) {
  for (const Entry& e : table()) {
    if (!e.spec.hf_regex.empty() && e.spec.hf_regex == pattern) return &e.spec;
    if (e.spec.regexes.size() == 1 && e.spec.regexes[0] == pattern) return &e.spec;
  }
  return nullptr;
}

std::string known_pre_tokenizers() {
  std::string out;
  for (const Entry& e : table()) {
    for (std::string_view a : e.aliases) {
      if (!out.empty()) out += ", ";
      out += a;
    }
  }
  return out;
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::span<const std::string_view> regexes) {
  for (std::string_view source : regexes) {
    const std::string pattern = with_unicode_spaces(source);
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto r = std::make_unique<Regex>();
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (!r->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail("pre-tokenizer regex '{}' does not compile at offset {}: {}", source, offset,
           reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);  // without JIT support matching is just slower
    regexes_.push_back(std::move(r));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& regex : regexes_) {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex->code, nullptr);
    if (!match) fail("out of memory for a regex match");
    next.clear();
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t at = 0, gap = 0;  // next search position; start of the unmatched stretch
      while (at < piece.size()) {
        const int rc = pcre2_match(regex->code, subject, piece.size(), at, 0, match, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(match);
          PCRE2_UCHAR message[256];
          pcre2_get_error_message(rc, message, sizeof message);
          fail("pre-tokenizer regex failed: {}", reinterpret_cast<const char*>(message));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {  // an empty match splits nothing; step over one character
          at = begin + 1;
          while (at < piece.size() && (static_cast<uint8_t>(piece[at]) & 0xC0) == 0x80) ++at;
          continue;
        }
        if (begin > gap) next.push_back(piece.substr(gap, begin - gap));
        next.push_back(piece.substr(begin, end - begin));
        at = gap = end;
      }
      if (gap < piece.size()) next.push_back(piece.substr(gap));
    }
    pcre2_match_data_free(match);
    pieces.swap(next);
  }
  words.insert(words.end(), pieces.begin(), pieces.end());
}

bool replace_invalid_utf8(std::string_view text, std::string& out) {
  // Decodes one code point as llama.cpp's unicode_cpt_from_utf8 does (lead byte and continuation
  // bytes only, no overlong or range checks); returns the length, or 0 for an invalid sequence.
  auto decode = [&](size_t at, uint32_t& cpt) -> size_t {
    const auto b = static_cast<uint8_t>(text[at]);
    size_t n;
    if (b < 0x80) return cpt = b, 1;
    if ((b & 0xE0) == 0xC0)
      n = 2, cpt = b & 0x1F;
    else if ((b & 0xF0) == 0xE0)
      n = 3, cpt = b & 0x0F;
    else if ((b & 0xF8) == 0xF0)
      n = 4, cpt = b & 0x07;
    else
      return 0;
    if (at + n > text.size()) return 0;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(text[at + k]);
      if ((c & 0xC0) != 0x80) return 0;
      cpt = (cpt << 6) | (c & 0x3F);
    }
    return n;
  };
  auto encode = [](uint32_t cpt, std::string& s) {
    if (cpt < 0x80) {
      s += static_cast<char>(cpt);
    } else if (cpt < 0x800) {
      s += static_cast<char>(0xC0 | (cpt >> 6));
      s += static_cast<char>(0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
      s += static_cast<char>(0xE0 | (cpt >> 12));
      s += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cpt & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cpt >> 18));
      s += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cpt & 0x3F));
    }
  };
  // Fast path: nothing to change.
  size_t at = 0;
  uint32_t cpt = 0;
  std::string fixed;
  bool changed = false;
  while (at < text.size()) {
    if (static_cast<uint8_t>(text[at]) < 0x80) {
      if (changed) fixed += text[at];
      ++at;
      continue;
    }
    const size_t n = decode(at, cpt);
    std::string piece;
    if (n == 0 || cpt > 0x10FFFF) {
      piece = "\xEF\xBF\xBD";
    } else {
      encode(cpt, piece);  // an overlong form comes back in its shortest form, as in llama.cpp
    }
    const size_t used = n == 0 ? 1 : n;
    if (!changed && piece != text.substr(at, used)) {
      changed = true;
      fixed.assign(text.substr(0, at));
    }
    if (changed) fixed += piece;
    at += used;
  }
  if (!changed) return false;
  out = std::move(fixed);
  return true;
}

}  // namespace xpert
