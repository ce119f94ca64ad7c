// Streaming text out of a token stream: tokens arrive one by one, a piece may end in the middle of a
// UTF-8 character (byte tokens, multi-byte pieces split by the vocabulary), and the client must only
// ever see whole characters and never the start of a stop string that later completes.
//
// Invalid UTF-8 policy: a byte sequence that can no longer become a valid character is replaced by
// U+FFFD at once, one U+FFFD per maximal ill-formed subpart (the Unicode / WHATWG convention: "\xE4\xBD"
// followed by "x" gives one U+FFFD then "x"). An incomplete but still valid tail is held back until
// more bytes come; flush() turns a tail that never completed into one U+FFFD. So the output is always
// valid UTF-8, and for a valid input it equals the input byte for byte. (llama.cpp's server instead
// holds back an incomplete tail and passes invalid bytes through; JSON clients then choke.)
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xpert {

class Tokenizer;

// Bytes in, complete valid UTF-8 out.
class Utf8Assembler {
 public:
  std::string push(std::string_view bytes);
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;  // a valid prefix of one character, at most 3 bytes
};

// Replaces every ill-formed subpart of `bytes` by U+FFFD (what Utf8Assembler's push + flush give).
std::string sanitize_utf8(std::string_view bytes);

// Token ids in, complete UTF-8 out. `special`: print control tokens' text (see Tokenizer::token_to_piece).
class Utf8Stream {
 public:
  explicit Utf8Stream(const Tokenizer& tokenizer, bool special = false)
      : tokenizer_(tokenizer), special_(special) {}
  std::string push(int32_t id);
  std::string flush() { return assembler_.flush(); }

 private:
  const Tokenizer& tokenizer_;
  bool special_;
  Utf8Assembler assembler_;
  std::string piece_;
};

// Finds stop strings in streamed text. Text that could still be the start of a stop string is held
// back; text before a stop string is released; the stop string and anything after it never are.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  struct Step {
    std::string text;       // safe to show now
    bool stopped = false;   // a stop string completed; `text` ends just before it
    size_t stop_index = 0;  // which one (index into the constructor's list), when stopped
  };
  // Feed the next chunk (complete UTF-8 keeps the held-back text on character boundaries).
  // After a stop, further input is ignored.
  Step push(std::string_view text);
  // End of generation without a stop: the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::vector<size_t> index_;  // stops_[i] was the constructor's stops[index_[i]]
  size_t longest_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace xpert
