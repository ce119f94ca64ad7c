// GBNF grammars: parsing, errors, the matcher over bytes and UTF-8, and the token masks against a
// brute-force check of every token.
#include <gtest/gtest.h>

#include <random>

#include "sample/constrained.h"
#include "sample/grammar.h"

namespace xpert {
namespace {

bool full_match(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::parse(gbnf));
  return m.accept(text) && m.complete();
}

std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(Grammar, LiteralsAlternativesGroups) {
  const std::string g = R"G(root ::= "yes" | "no" | ("may" "be"))G";
  EXPECT_TRUE(full_match(g, "yes"));
  EXPECT_TRUE(full_match(g, "no"));
  EXPECT_TRUE(full_match(g, "maybe"));
  EXPECT_FALSE(full_match(g, "ye"));
  EXPECT_FALSE(full_match(g, "yess"));
  EXPECT_FALSE(full_match(g, "may"));
}

TEST(Grammar, ClassesRangesNegationAndAny) {
  EXPECT_TRUE(full_match("root ::= [a-c0-9_]+", "ab9_c"));
  EXPECT_FALSE(full_match("root ::= [a-c0-9_]+", "abd"));
  EXPECT_FALSE(full_match("root ::= [a-c0-9_]+", ""));
  EXPECT_TRUE(full_match(R"G(root ::= "\"" [^"\\]* "\"")G", "\"hi there\""));
  EXPECT_FALSE(full_match(R"G(root ::= "\"" [^"\\]* "\"")G", "\"a\"b\""));
  EXPECT_TRUE(full_match("root ::= . . .", "a\xce\xb1z"));  // . is one character, multi-byte or not
  EXPECT_FALSE(full_match("root ::= . .", "abc"));
  EXPECT_TRUE(full_match(R"G(root ::= [\x41-\x43] [\u03b1-\u03c9] "\t")G", "B\xce\xb2\t"));
  EXPECT_TRUE(full_match(R"G(root ::= [-a] [a-] [\]\[])G", "-a]"));
}

TEST(Grammar, Repetitions) {
  const std::string g = R"G(root ::= "a"{2} "b"{1,3} "c"{2,} "d"? "e"*)G";
  EXPECT_TRUE(full_match(g, "aabcc"));
  EXPECT_TRUE(full_match(g, "aabbbccccde"));
  EXPECT_TRUE(full_match(g, "aabccdeee"));
  EXPECT_FALSE(full_match(g, "abcc"));
  EXPECT_FALSE(full_match(g, "aabbbbcc"));
  EXPECT_FALSE(full_match(g, "aabc"));
  EXPECT_FALSE(full_match(g, "aabccdd"));
  EXPECT_TRUE(full_match(R"G(root ::= ("ab" | "c"){0,2} "!")G", "abc!"));
  EXPECT_TRUE(full_match(R"G(root ::= ("ab" | "c"){0,2} "!")G", "!"));
  EXPECT_FALSE(full_match(R"G(root ::= ("ab" | "c"){0,2} "!")G", "cab c!"));
  EXPECT_TRUE(full_match(R"G(root ::= "ab"+)G", "ababab"));
  EXPECT_FALSE(full_match(R"G(root ::= "ab"+)G", "aba"));
}

TEST(Grammar, RulesCommentsAndNewlines) {
  const std::string g = R"G(
# a list of numbers
root ::= "[" ws ( num ( "," ws num )* )? "]"   # trailing comment
num  ::= "-"? [0-9]+
ws   ::= [ \t\n]*
)G";
  EXPECT_TRUE(full_match(g, "[]"));
  EXPECT_TRUE(full_match(g, "[ 1,\n-22,3]"));
  EXPECT_FALSE(full_match(g, "[1,]"));
  // A rule may continue over several lines; it ends where the next `name ::=` begins.
  EXPECT_TRUE(full_match("root ::= a\n  | b\na ::= \"x\"\nb ::= \"y\"", "y"));
}

TEST(Grammar, RecursionAndDeepNesting) {
  const std::string g = R"G(root ::= "(" root ")" | "")G";
  EXPECT_TRUE(full_match(g, ""));
  EXPECT_TRUE(full_match(g, std::string(200, '(') + std::string(200, ')')));
  EXPECT_FALSE(full_match(g, "(()"));
}

TEST(Grammar, Errors) {
  EXPECT_NE(parse_error("root ::= foo").find("'foo' is used but never defined"), std::string::npos);
  EXPECT_NE(parse_error("main ::= \"x\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"abc").find("unterminated string"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [abc").find("unterminated character class"), std::string::npos);
  EXPECT_NE(parse_error("root ::= root \"x\" | \"y\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"x\"?)*").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= a\na ::= b \"x\"\nb ::= \"\" | a").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [z-a]").find("reversed"), std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"a\"").find("unclosed '('"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{3,1}").find("max below min"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"{99999}").find("repetition count"), std::string::npos);
  EXPECT_NE(parse_error("root ::= * \"a\"").find("must follow something"), std::string::npos);
  std::string huge = "root ::= \"\"";
  for (int i = 0; i < 300; ++i) huge += " [a-z]{10000}";
  EXPECT_NE(parse_error(huge).find("too large"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(parse_error("root = \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(parse_error("").find("empty"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\n  x ::= y").find("line 2 column 9"), std::string::npos);
}

TEST(GrammarMatcher, BytesSplitInsideCharactersAndTokens) {
  GrammarMatcher m(Grammar::parse(R"G(root ::= "key" ":" [α-ω]+ "!")G"));
  EXPECT_TRUE(m.accept("ke"));
  EXPECT_FALSE(m.accept("x"));  // rejected: the state stays where it was
  EXPECT_TRUE(m.accept("y:\xce"));  // one token spans three elements and ends inside "α"
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(m.accept("\x41"));  // not a continuation byte
  EXPECT_TRUE(m.accept("\xb1\xce\xb2"));
  EXPECT_FALSE(m.accept("\xd0\x96"));  // Ж is outside [α-ω]
  EXPECT_FALSE(m.accept("\xff"));      // never valid UTF-8
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept("!"));
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.accept("!"));
}

TEST(GrammarMatcher, CompleteButNotFinished) {
  GrammarMatcher m(Grammar::parse("root ::= [0-9]+"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept("12"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.finished());
  // A prefix of a multi-byte character that no class allows is refused at once.
  GrammarMatcher a(Grammar::parse("root ::= [a-z]+"));
  EXPECT_FALSE(a.accept("\xce"));
  // Overlong forms and surrogates are not characters (else E0 80 B7 would pass for "7").
  EXPECT_FALSE(full_match("root ::= [0-9]", "\xe0\x80\xb7"));
  EXPECT_FALSE(full_match("root ::= [0-9]", "\xc0\xb7"));
  EXPECT_FALSE(full_match("root ::= .", "\xed\xa0\x80"));
  EXPECT_FALSE(full_match("root ::= .", "\xf4\x90\x80\x80"));
  EXPECT_TRUE(full_match("root ::= .", "\xf4\x8f\xbf\xbf"));
  GrammarMatcher b(Grammar::parse("root ::= [0-9]"));
  EXPECT_FALSE(b.accept("\xe0"));  // nothing this may become is a digit
}

const char* kJsonish = R"G(
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )?
ws     ::= [ \n]{0,2}
)G";

// A vocabulary of single bytes, pieces of JSON, multi-byte characters and split halves of them.
std::vector<std::string> test_vocab() {
  std::vector<std::string> v;
  for (int c = 0; c < 256; ++c) v.push_back(std::string(1, (char)c));
  for (const char* p : {"{\"", "\":", "\": \"", "\",", "true", "false", "null", "nul", "[]", "{}", "},", "],",
                        "12", "0.", ".5", "\\n", "\\\"", " \"", "\n  ", "\xce\xb1", "\xce", "\xb1\"", "\xe4\xbd\xa0",
                        "\xe4\xbd", "a\xe4", "\"}", "\"]", "truex", "-0", "--", ""})
    v.push_back(p);
  v.push_back("abc");
  v.push_back("abc");  // two tokens with one piece
  return v;
}

TEST(GrammarMatcher, TokenMasksEqualBruteForce) {
  const auto grammar = Grammar::parse(kJsonish);
  const std::vector<std::string> vocab = test_vocab();
  const TokenTrie trie(vocab);
  std::mt19937 rng(7);
  int steps = 0, checked_masks = 0;
  auto shared = std::make_shared<GrammarTables>();  // odd walks share what earlier ones learned
  for (int walk = 0; walk < 30; ++walk) {
    GrammarMatcher m(grammar, walk % 2 ? shared : nullptr);
    std::vector<std::string> taken;
    for (int step = 0; step < 40 && !m.finished(); ++step) {
      const std::vector<uint32_t> mask = m.allowed_tokens(trie);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < (int32_t)vocab.size(); ++id) {
        GrammarMatcher probe = m;
        const bool ok = !vocab[id].empty() && probe.accept(vocab[id]);
        ASSERT_EQ(ok, (bool)((mask[id / 32] >> (id % 32)) & 1)) << "token " << id << " step " << step;
        if (ok) allowed.push_back(id);
      }
      ++checked_masks;
      std::string trail;
      for (const std::string& t : taken) trail += "[" + t + "]";
      ASSERT_FALSE(allowed.empty()) << trail << " walk " << walk << " step " << step;
      EXPECT_EQ(&m.allowed_tokens(trie), &m.allowed_tokens(trie));  // cached
      taken.push_back(vocab[allowed[rng() % allowed.size()]]);
      ASSERT_TRUE(m.accept(taken.back()));
      ++steps;
    }
  }
  EXPECT_GT(checked_masks, 300);
  EXPECT_GT(steps, 300);
}

TEST(TokenTrie, HoldsEveryNonEmptyPiece) {
  const std::vector<std::string> vocab = test_vocab();
  const TokenTrie trie(vocab);
  std::vector<int> seen(vocab.size(), 0);
  for (const auto& n : trie.nodes())
    for (uint32_t t = n.tok_begin; t < n.tok_end; ++t) {
      const int32_t id = trie.ids()[t];
      ++seen[id];
      EXPECT_EQ(vocab[id].size(), n.depth);
    }
  for (size_t id = 0; id < vocab.size(); ++id) EXPECT_EQ(seen[id], vocab[id].empty() ? 0 : 1) << id;
  EXPECT_EQ(trie.nodes()[0].end, trie.nodes().size());
}

// Lazy start (a thinking model): before the start text the draws are free, except end of generation;
// after it the grammar takes the rest.
TEST(GrammarSampler, LazyStartLeavesTheReasoningFree) {
  //                                 0    1    2           3      4     5     6 (end of generation)
  const std::vector<std::string> pieces = {"a", "b", "</think>", "yes", "no", "\n\n", "<eos>"};
  const TokenTrie trie(pieces);
  SamplingParams greedy;
  greedy.temperature = 0;
  // The model's preferences, step by step: free text, an early end (refused: the answer has not come),
  // the start text, whitespace (let through), then text the grammar refuses where "no" is the best
  // allowed choice.
  const std::vector<std::vector<float>> steps = {
      {5, 1, 0, 0, 2, 0, 0}, {0, 5, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 0, 5}, {0, 0, 0, 0, 0, 5, 0},
      {5, 0, 0, 1, 2, 0, 0}};
  GrammarSampler lazy(Grammar::parse(R"(root ::= "yes" | "no")"), trie, {6}, nullptr, "</think>");
  Sampler sampler(greedy);
  std::vector<int32_t> got;
  for (const auto& logits : steps) {
    got.push_back(lazy.sample(sampler, logits));
    if (lazy.finished()) break;
  }
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 5, 4}));
  EXPECT_FALSE(lazy.waiting());
  EXPECT_TRUE(lazy.finished());
  // Without the lazy start, the same preferences are constrained from the first token.
  GrammarSampler eager(Grammar::parse(R"(root ::= "yes" | "no")"), trie, {6});
  Sampler sampler2(greedy);
  EXPECT_EQ(eager.sample(sampler2, steps[0]), 4);
}

}  // namespace
}  // namespace xpert
