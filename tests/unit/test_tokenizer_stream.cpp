// Streaming detokenization (UTF-8 assembly) and stop strings, on hand-made cases.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "text/tokenizer.h"
#include "text/utf8_stream.h"

namespace xpert {
namespace {

const std::string kFFFD = "\xef\xbf\xbd";

std::string push_all(Utf8Assembler& a, const std::vector<std::string>& chunks,
                     std::vector<std::string>* outs = nullptr) {
  std::string all;
  for (const std::string& c : chunks) {
    std::string o = a.push(c);
    if (outs) outs->push_back(o);
    all += o;
  }
  return all;
}

TEST(Utf8Assembler, PassesAsciiAndCompleteCharacters) {
  Utf8Assembler a;
  EXPECT_EQ(a.push("hello "), "hello ");
  EXPECT_EQ(a.push("\xe4\xbd\xa0\xe5\xa5\xbd"), "\xe4\xbd\xa0\xe5\xa5\xbd");  // 你好
  EXPECT_EQ(a.flush(), "");
}

TEST(Utf8Assembler, HoldsSplitCharactersUntilComplete) {
  // 😀 = F0 9F 98 80, fed one byte at a time, then "é" split in two.
  Utf8Assembler a;
  std::vector<std::string> outs;
  const std::string all = push_all(a,
                                   {"a\xf0", "\x9f", "\x98",
                                    "\x80"
                                    "b\xc3",
                                    "\xa9"},
                                   &outs);
  EXPECT_EQ(outs, (std::vector<std::string>{"a", "", "",
                                            "\xf0\x9f\x98\x80"
                                            "b",
                                            "\xc3\xa9"}));
  EXPECT_EQ(all,
            "a\xf0\x9f\x98\x80"
            "b\xc3\xa9");
  EXPECT_EQ(a.pending_bytes(), 0u);
}

TEST(Utf8Assembler, ReplacesInvalidBytesAtOnce) {
  Utf8Assembler a;
  EXPECT_EQ(a.push("a\x80"
                   "b"),
            "a" + kFFFD + "b");                              // lone continuation
  EXPECT_EQ(a.push("\xff\xfe"), kFFFD + kFFFD);              // never valid
  EXPECT_EQ(a.push("\xc0\xaf"), kFFFD + kFFFD);              // overlong lead C0
  EXPECT_EQ(a.push("\xed\xa0\x80"), kFFFD + kFFFD + kFFFD);  // surrogate: ED then A0 is out of range
  EXPECT_EQ(a.push("\xe4\xbd"), "");                         // still a valid prefix
  EXPECT_EQ(a.push("x"), kFFFD + "x");                       // ... that did not complete: one U+FFFD
  EXPECT_EQ(a.push("\xf4\x90"), kFFFD + kFFFD);              // above U+10FFFF
}

TEST(Utf8Assembler, FlushReplacesAnIncompleteTail) {
  Utf8Assembler a;
  EXPECT_EQ(a.push("ok\xe2\x82"), "ok");
  EXPECT_EQ(a.pending_bytes(), 2u);
  EXPECT_EQ(a.flush(), kFFFD);
  EXPECT_EQ(a.flush(), "");
  EXPECT_EQ(a.push("\xac"), kFFFD);  // the continuation of a flushed prefix is on its own now
}

TEST(Utf8Assembler, SanitizeKeepsValidTextUnchanged) {
  const std::string s = "mixed 中文 😀 \xc3\xa9\n\t";
  EXPECT_EQ(sanitize_utf8(s), s);
  EXPECT_EQ(sanitize_utf8("\xe4\xbd"), kFFFD);
}

// However the bytes are cut into chunks, the stream gives what one pass over all of them gives.
TEST(Utf8Assembler, OutputDoesNotDependOnChunking) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", " ", "\xc3\xa9", "\xe4\xbd\xa0", "\xf0\x9f\x98\x80", "\x80", "\xff",
                                  "\xe4", "\xf0\x9f", "\xed\xa0\x80", "\xc0"};
  for (int round = 0; round < 500; ++round) {
    std::string bytes;
    const int n = std::uniform_int_distribution<int>(0, 30)(rng);
    for (int i = 0; i < n; ++i) bytes += alphabet[rng() % std::size(alphabet)];
    Utf8Assembler a;
    std::string out;
    for (size_t at = 0; at < bytes.size();) {
      const size_t len = std::min<size_t>(bytes.size() - at, rng() % 5);
      out += a.push(std::string_view(bytes).substr(at, len));
      at += len;
    }
    out += a.flush();
    ASSERT_EQ(out, sanitize_utf8(bytes)) << "round " << round;
    ASSERT_EQ(sanitize_utf8(out), out);  // always valid UTF-8
  }
}

// A tiny vocabulary whose pieces split characters: the stream must still emit whole ones.
TEST(Utf8Stream, DetokenizesByteTokensIntoWholeCharacters) {
  Vocab v;
  v.texts = {"<pad>", "<eos>", "<bos>", "<unk>", "\xe2\x96\x81hi", "<ctrl>"};
  v.types = {TokenType::control, TokenType::control, TokenType::control,
             TokenType::unknown, TokenType::normal,  TokenType::control};
  for (int b = 0; b < 256; ++b) {
    v.texts.push_back(fmt::format("<0x{:02X}>", b));
    v.types.push_back(TokenType::byte);
  }
  v.bos = 2, v.eos = 1, v.unk = 3, v.add_space_prefix = false;
  auto t = Tokenizer::create(v);
  const int32_t byte0 = 6;

  Utf8Stream s(*t);
  EXPECT_EQ(s.push(4), " hi");
  EXPECT_EQ(s.push(byte0 + 0xE4), "");
  EXPECT_EQ(s.push(5), "");  // a control token prints nothing without `special`, and breaks nothing
  EXPECT_EQ(s.push(byte0 + 0xBD), "");
  EXPECT_EQ(s.push(byte0 + 0xA0), "\xe4\xbd\xa0");
  EXPECT_EQ(s.push(byte0 + 0xF0), "");
  EXPECT_EQ(s.flush(), kFFFD);

  Utf8Stream special(*t, true);
  EXPECT_EQ(special.push(5), "<ctrl>");
}

TEST(StopMatcher, PassesTextWithoutStops) {
  StopMatcher m({"STOP"});
  auto s = m.push("hello world");
  EXPECT_EQ(s.text, "hello world");
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopStringSpanningThreeTokens) {
  StopMatcher m({"<|end|>"});
  auto a = m.push("answer <|");
  EXPECT_EQ(a.text, "answer ");
  EXPECT_FALSE(a.stopped);
  EXPECT_EQ(m.held_bytes(), 2u);
  auto b = m.push("en");
  EXPECT_EQ(b.text, "");
  EXPECT_FALSE(b.stopped);
  auto c = m.push("d|> trailing");
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.stop_index, 0u);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more").text, "");
}

TEST(StopMatcher, ReleasesAFalseStart) {
  StopMatcher m({"\n\nUser:"});
  EXPECT_EQ(m.push("x\n").text, "x");
  EXPECT_EQ(m.push("\nUs").text, "");
  auto s = m.push("ually");
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.text, "\n\nUsually");
}

TEST(StopMatcher, HoldsOnlyTheLongestPossibleStart) {
  StopMatcher m({"abc"});
  // "xab": "ab" might become "abc"; "x" cannot.
  EXPECT_EQ(m.push("xab").text, "x");
  // "aba": the old "ab" is no stop now, but the final "a" might start one.
  EXPECT_EQ(m.push("a").text, "ab");
  auto s = m.push("bc!");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"", "world", "o w"});
  auto s = m.push("hello world");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "hell");
  EXPECT_EQ(s.stop_index, 2u);  // index into the list given, empty strings included
}

TEST(StopMatcher, StopInsideOneChunkAndFlush) {
  StopMatcher m({"###"});
  auto s = m.push("a#b##");
  EXPECT_EQ(s.text, "a#b");
  EXPECT_EQ(m.flush(), "##");  // generation ended: the held text was never a stop
}

// With one stop string, any chunking releases exactly the text before its first occurrence.
TEST(StopMatcher, OutputDoesNotDependOnChunking) {
  std::mt19937 rng(11);
  for (int round = 0; round < 2000; ++round) {
    std::string text, stop;
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < n; ++i) text += "ab"[rng() % 2];
    const int k = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int i = 0; i < k; ++i) stop += "ab"[rng() % 2];
    StopMatcher m({stop});
    std::string out;
    bool stopped = false;
    for (size_t at = 0; at < text.size() && !stopped;) {
      const size_t len = std::min<size_t>(text.size() - at, 1 + rng() % 4);
      StopMatcher::Step step = m.push(std::string_view(text).substr(at, len));
      out += step.text;
      stopped = step.stopped;
      at += len;
    }
    if (!stopped) out += m.flush();
    const size_t first = text.find(stop);
    ASSERT_EQ(stopped, first != std::string::npos) << text << " / " << stop;
    ASSERT_EQ(out, text.substr(0, first)) << text << " / " << stop;
  }
}

TEST(StopMatcher, MultibyteStopStrings) {
  StopMatcher m({"终止"});
  EXPECT_EQ(m.push("好的终").text, "好的");
  auto s = m.push("止了");
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "");
}

}  // namespace
}  // namespace xpert
