// SentencePiece-style tokenization on tiny hand-made vocabularies: each test pins one rule of
// llama.cpp's algorithm that the real-model fixture might not isolate.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

const std::string kU2581 = "\xe2\x96\x81";

// <pad> <eos> <bos> <unk>, then the given pieces (normal unless typed), then 256 byte tokens.
struct VocabBuilder {
  Vocab v;
  VocabBuilder() {
    add("<pad>", 0, TokenType::control);
    add("<eos>", 0, TokenType::control);
    add("<bos>", 0, TokenType::control);
    add("<unk>", 0, TokenType::unknown);
    v.pad = 0, v.eos = 1, v.bos = 2, v.unk = 3;
    v.add_space_prefix = false;
  }
  int32_t add(std::string text, float score = 0, TokenType type = TokenType::normal) {
    v.texts.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
    return static_cast<int32_t>(v.texts.size()) - 1;
  }
  VocabBuilder& with_bytes() {
    for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, TokenType::byte);
    return *this;
  }
  std::unique_ptr<Tokenizer> build() { return Tokenizer::create(v); }
};

TEST(TokenizerSpm, MergesHighestScoreFirst) {
  VocabBuilder b;
  const int32_t a = b.add("a", -10), bb = b.add("b", -10), c = b.add("c", -10);
  const int32_t ab = b.add("ab", -2), bc = b.add("bc", -1);
  auto t = b.build();
  EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{a, bc}));
  (void)bb, (void)c, (void)ab;
}

TEST(TokenizerSpm, EqualScoresMergeLeftmostFirst) {
  VocabBuilder b;
  const int32_t a = b.add("a", -10), c = b.add("c", -10);
  b.add("b", -10);
  const int32_t ab = b.add("ab", -1);
  b.add("bc", -1);
  auto t = b.build();
  EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{ab, c}));
  EXPECT_EQ(t->encode("a", false, false), (std::vector<int32_t>{a}));
}

TEST(TokenizerSpm, MergesOnlyThroughPieces) {
  // "bcd" outscores everything, but "bc" is no piece and "ab" takes the b first.
  VocabBuilder b;
  b.add("a"), b.add("b"), b.add("c"), b.add("d");
  b.add("bcd", 5);
  const int32_t ab = b.add("ab", -1), cd = b.add("cd", -2);
  auto t = b.build();
  EXPECT_EQ(t->encode("abcd", false, false), (std::vector<int32_t>{ab, cd}));
}

TEST(TokenizerSpm, EscapesSpacesAndAddsPrefixWhenAsked) {
  VocabBuilder b;
  const int32_t sp = b.add(kU2581), x = b.add("x"), spx = b.add(kU2581 + "x", 1);
  {
    auto t = b.build();
    EXPECT_EQ(t->encode("x x", false, false), (std::vector<int32_t>{x, spx}));
    EXPECT_EQ(t->encode(" ", false, false), (std::vector<int32_t>{sp}));
    EXPECT_EQ(t->token_to_piece(spx, false), " x");
  }
  b.v.add_space_prefix = true;
  auto t = b.build();
  EXPECT_EQ(t->encode("x x", false, false), (std::vector<int32_t>{spx, spx}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{spx, spx}, false), "x x");  // the prefix space is removed again
}

TEST(TokenizerSpm, FallsBackToByteTokens) {
  VocabBuilder b;
  const int32_t x = b.add("x");
  b.with_bytes();
  auto t = b.build();
  const int32_t byte0 = *t->find_token("<0x00>");
  // U+00E9 is C3 A9; a lone continuation byte is a symbol of its own.
  EXPECT_EQ(t->encode("x\xc3\xa9", false, false), (std::vector<int32_t>{x, byte0 + 0xC3, byte0 + 0xA9}));
  EXPECT_EQ(t->encode("\x80x", false, false), (std::vector<int32_t>{byte0 + 0x80, x}));
  EXPECT_EQ(t->token_to_piece(byte0 + 0xC3, false), "\xc3");
  EXPECT_EQ(t->decode(t->encode("x\xc3\xa9\xff", false, false), false), "x\xc3\xa9\xff");
}

TEST(TokenizerSpm, LeadByteDecidesSymbolLength) {
  // E4 announces three bytes, so "\xE4xx" is one symbol even though it is invalid UTF-8: the x's
  // cannot merge with anything and come out as bytes.
  VocabBuilder b;
  const int32_t x = b.add("x"), xx = b.add("xx", 1);
  b.with_bytes();
  auto t = b.build();
  const int32_t byte0 = *t->find_token("<0x00>");
  EXPECT_EQ(t->encode("\xe4xxxx", false, false),
            (std::vector<int32_t>{byte0 + 0xE4, byte0 + 'x', byte0 + 'x', xx}));
  (void)x;
}

TEST(TokenizerSpm, UnknownTokenWhenNoByteTokens) {
  VocabBuilder b;
  const int32_t x = b.add("x");
  auto t = b.build();
  EXPECT_EQ(t->encode("x\xc3\xa9", false, false), (std::vector<int32_t>{x, 3, 3}));
}

TEST(TokenizerSpm, ControlTokensOnlyWithParseSpecial) {
  VocabBuilder b;
  const int32_t turn = b.add("<turn>", 0, TokenType::control);
  for (char c : std::string("<turn>")) b.add(std::string(1, c));
  auto t = b.build();
  const auto plain = t->encode("<turn>", false, false);
  EXPECT_EQ(plain.size(), 6u);
  EXPECT_EQ(t->encode("<turn>", false, true), (std::vector<int32_t>{turn}));
  EXPECT_EQ(t->encode("", true, true), (std::vector<int32_t>{2}));
  EXPECT_EQ(t->encode("<bos>", true, true), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(t->token_to_piece(turn, false), "");
  EXPECT_EQ(t->token_to_piece(turn, true), "<turn>");
}

TEST(TokenizerSpm, UserDefinedTokensAlwaysSplitOut) {
  VocabBuilder b;
  const int32_t nl = b.add("\n", 0, TokenType::user_defined);
  const int32_t nl2 = b.add("\n\n", 0, TokenType::user_defined);
  const int32_t x = b.add("x");
  auto t = b.build();
  for (bool special : {false, true}) {
    EXPECT_EQ(t->encode("x\n\n\nx", false, special), (std::vector<int32_t>{x, nl2, nl, x}));
  }
  EXPECT_EQ(t->token_to_piece(nl2, false), "\n\n");
}

TEST(TokenizerSpm, LongerSpecialTokensClaimTextFirst) {
  // llama.cpp places special tokens longest first, not leftmost first: in "abcd", "bcd" wins over "ab".
  VocabBuilder b;
  const int32_t ab = b.add("ab", 0, TokenType::user_defined);
  const int32_t bcd = b.add("bcd", 0, TokenType::user_defined);
  const int32_t a = b.add("a"), d = b.add("d");
  auto t = b.build();
  EXPECT_EQ(t->encode("abcd", false, false), (std::vector<int32_t>{a, bcd}));
  EXPECT_EQ(t->encode("abcdab", false, false), (std::vector<int32_t>{a, bcd, ab}));
  EXPECT_EQ(t->encode("abab", false, false), (std::vector<int32_t>{ab, ab}));
  (void)d;
}

TEST(TokenizerSpm, RunsOfSpacesTakeTheLongestTokensFromTheLeft) {
  // Gemma-style user-defined runs of 2..31 spaces. A long run is cut into 31s from the left, the rest
  // goes to the token of its length. Two megabytes of spaces take the search path that keeps no list
  // of occurrences (they would be ~60 million); both paths must agree.
  VocabBuilder b;
  std::vector<int32_t> run(32, kNoToken);
  for (size_t k = 2; k <= 31; ++k) run[k] = b.add(std::string(k, ' '), 0, TokenType::user_defined);
  const int32_t x = b.add("x");
  auto t = b.build();
  EXPECT_EQ(t->encode("x" + std::string(70, ' ') + "x", false, false),
            (std::vector<int32_t>{x, run[31], run[31], run[8], x}));
  for (size_t n : {size_t{1000}, size_t{2'000'000}}) {
    const std::vector<int32_t> ids = t->encode(std::string(n, ' ') + "x", false, false);
    ASSERT_EQ(ids.size(), n / 31 + 2) << n;
    EXPECT_EQ(ids[0], run[31]);
    EXPECT_EQ(ids[n / 31 - 1], run[31]);
    EXPECT_EQ(ids[n / 31], run[n % 31]);
    EXPECT_EQ(ids.back(), x);
  }
}

TEST(TokenizerSpm, EndOfGenerationFoundByText) {
  VocabBuilder b;
  const int32_t eot = b.add("<end_of_turn>", 0, TokenType::control);
  const int32_t s = b.add("</s>", 0, TokenType::user_defined);
  const int32_t x = b.add("x");
  auto t = b.build();
  EXPECT_EQ(t->eot(), eot);
  EXPECT_EQ(t->eog_ids(), (std::vector<int32_t>{1, eot, s}));
  // "</s>" ends generation, so llama.cpp makes it a control token: hidden unless special.
  EXPECT_TRUE(t->is_control(s));
  EXPECT_EQ(t->token_to_piece(s, false), "");
  EXPECT_FALSE(t->is_eog(x));
}

TEST(TokenizerSpm, RejectsBadVocabularies) {
  {
    VocabBuilder b;
    b.add("x");
    b.add("x");
    EXPECT_THROW(b.build(), Error);
  }
  {
    VocabBuilder b;
    b.v.model = "bert";
    try {
      b.build();
      FAIL() << "expected an Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'bert'"), std::string::npos) << e.what();
    }
  }
  {
    VocabBuilder b;
    b.v.bos = kNoToken;
    EXPECT_THROW(b.build(), Error);  // add_bos without a BOS token
  }
  VocabBuilder b;
  auto t = b.build();
  EXPECT_THROW(t->token_to_piece(1000, false), Error);
  EXPECT_THROW(t->token_to_piece(-1, false), Error);
}

}  // namespace
}  // namespace xpert
