// Byte-level BPE against Hugging Face tokenizers and llama.cpp: tests/reference/fixtures/bpe_cases.json
// (tests/reference/make_bpe_fixtures.py) holds their ids for a corpus, for three tiny committed
// tokenizers (qwen2, llama-bpe and gpt-2 pre-tokenizers) and for the full Qwen2 and Qwen3.5
// vocabularies, which are too big to commit (models/bpe/, written by the script; skipped if absent).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "base/error.h"
#include "format/gguf.h"
#include "text/hf_tokenizer.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

std::string source_dir() {
  const char* env = std::getenv("XPERT_SOURCE_DIR");
  return env && *env ? env : XPERT_SOURCE_DIR;
}

std::string from_hex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

const nlohmann::json& fixture() {
  static const nlohmann::json j = [] {
    std::ifstream in(source_dir() + "/tests/reference/fixtures/bpe_cases.json");
    return in ? nlohmann::json::parse(in) : nlohmann::json();
  }();
  return j;
}

const nlohmann::json* find_entry(const std::string& name) {
  if (!fixture().is_object()) return nullptr;
  for (const auto& t : fixture()["tokenizers"])
    if (t["name"] == name) return &t;
  return nullptr;
}

// Loads a fixture tokenizer once; nullptr when its file is absent.
const Tokenizer* tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  if (auto it = loaded.find(name); it != loaded.end()) return it->second.get();
  const nlohmann::json* e = find_entry(name);
  std::unique_ptr<Tokenizer> t;
  if (e) {
    const std::string path = source_dir() + "/" + (*e)["file"].get<std::string>();
    if (std::filesystem::exists(path)) t = load_hf_tokenizer(path);
  }
  return (loaded[name] = std::move(t)).get();
}

void check_cases(const std::string& name) {
  const nlohmann::json* e = find_entry(name);
  if (!e) GTEST_SKIP() << "bpe_cases.json has no tokenizer '" << name << "'";
  const Tokenizer* t = tokenizer(name);
  if (!t)
    GTEST_SKIP() << (*e)["file"].get<std::string>()
                 << " is absent (run tests/reference/make_bpe_fixtures.py)";
  EXPECT_EQ(t->n_vocab(), (*e)["n_vocab"].get<int32_t>());
  int n_hf = 0, n_llama = 0;
  for (const auto& c : (*e)["cases"]) {
    const std::string text = from_hex(c["text"]);
    const std::vector<int32_t> ids = t->encode(text, false, true);
    if (c.contains("ids")) {
      EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << name << "/" << c["name"].get<std::string>();
      EXPECT_EQ(t->decode(ids, true), text) << name << "/" << c["name"].get<std::string>();
      ++n_hf;
    }
    if (c.contains("llama_cpp_ids")) {
      EXPECT_EQ(ids, c["llama_cpp_ids"].get<std::vector<int32_t>>())
          << name << "/" << c["name"].get<std::string>();
      ++n_llama;
    }
  }
  EXPECT_GE(n_hf, 40);
  fmt::print("{}: {} strings vs HF tokenizers, {} vs llama.cpp\n", name, n_hf, n_llama);
}

TEST(BpeReference, TinyQwen2) { check_cases("tiny_qwen2"); }
TEST(BpeReference, TinyLlama3) { check_cases("tiny_llama3"); }
TEST(BpeReference, TinyGpt2) { check_cases("tiny_gpt2"); }
TEST(BpeReference, Qwen35) { check_cases("qwen35"); }
TEST(BpeReference, Qwen2) { check_cases("qwen2"); }

TEST(BpeReference, QwenSpecialTokens) {
  const Tokenizer* t = tokenizer("qwen35");
  if (!t) GTEST_SKIP() << "models/bpe/qwen35_tokenizer.json is absent";
  EXPECT_EQ(t->find_token("<|im_start|>"), 248045);
  EXPECT_EQ(t->find_token("<think>"), 248068);
  EXPECT_TRUE(t->is_eog(*t->find_token("<|im_end|>")));
  EXPECT_TRUE(t->is_eog(*t->find_token("<|endoftext|>")));
  EXPECT_FALSE(t->add_bos());
  // Without parse_special a control token is plain text; <think> is not special in Qwen's file, so
  // it is split out either way.
  EXPECT_GT(t->encode("<|im_start|>", false, false).size(), 1u);
  EXPECT_EQ(t->encode("<think>", false, false), std::vector<int32_t>{248068});
  EXPECT_EQ(t->token_to_piece(248045, false), "");
  EXPECT_EQ(t->token_to_piece(248045, true), "<|im_start|>");
}

TEST(BpeTokenizer, DigitsOneByOneForQwen) {
  const Tokenizer* t = tokenizer("tiny_qwen2");
  if (!t) GTEST_SKIP();
  EXPECT_EQ(t->encode("12345", false, false).size(), 5u);
}

TEST(BpeTokenizer, EveryByteRoundTrips) {
  const Tokenizer* t = tokenizer("tiny_gpt2");
  if (!t) GTEST_SKIP();
  std::string ascii;
  for (int b = 0; b < 128; ++b) ascii += static_cast<char>(b);
  EXPECT_EQ(t->decode(t->encode(ascii, false, false), false), ascii);
  // Invalid UTF-8 becomes U+FFFD, as llama.cpp reads it.
  EXPECT_EQ(t->decode(t->encode("a\x80z", false, false), false), "a\xEF\xBF\xBDz");
}

// Random bytes (mostly ill-formed UTF-8): no crash, and the text comes back as llama.cpp reads it.
TEST(BpeTokenizer, RandomBytesRoundTripAsReplaced) {
  const Tokenizer* t = tokenizer("tiny_qwen2");
  if (!t) GTEST_SKIP();
  std::mt19937 rng(42);
  const std::string pool[] = {"a",
                              " ",
                              "\n",
                              "\t",
                              "1",
                              "'s",
                              "\xC3\xA9",
                              "\xE4\xBD\xA0",
                              "\xF0\x9F\x98\x80",
                              "\x80",
                              "\xC3",
                              "\xFF",
                              "<|im_end|>",
                              "\xE2\x80\x8D",
                              "\xCC\x81"};
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) text += pool[rng() % std::size(pool)];
    std::string expected;
    if (!replace_invalid_utf8(text, expected)) expected = text;
    EXPECT_EQ(t->decode(t->encode(text, false, true), true), expected) << i;
  }
}

TEST(BpeTokenizer, LongWordsUseTheHeapPathAndAgree) {
  const Tokenizer* t = tokenizer("tiny_qwen2");
  if (!t) GTEST_SKIP();
  // A word longer than the scan threshold and the same word cut into pieces by specials merge alike.
  const std::string word(300, 'a');
  const std::vector<int32_t> ids = t->encode(word, false, false);
  EXPECT_EQ(t->decode(ids, false), word);
  EXPECT_LT(ids.size(), word.size());
}

// The vocabulary /work/shared/tools/synth_qwen3moe.py writes: the 256 byte stand-ins, one merge
// ("Ġ t"), filler tokens, two control tokens; pre "qwen2", no BOS.
TEST(BpeTokenizer, SynthToolVocabulary) {
  Vocab v;
  v.model = "gpt2";
  v.pre = "qwen2";
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  std::vector<uint32_t> cs(bs.begin(), bs.end());
  for (int b = 0, n = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b), cs.push_back(256 + n++);
  }
  for (uint32_t c : cs) {
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    v.texts.push_back(s);
  }
  v.texts.push_back("\xC4\xA0t");
  for (int i = 0; i < 10; ++i) v.texts.push_back(fmt::format("<tok{}>", i));
  v.texts.push_back("<|endoftext|>");
  v.texts.push_back("<|im_end|>");
  v.types.assign(v.texts.size(), TokenType::normal);
  v.types[v.texts.size() - 2] = v.types[v.texts.size() - 1] = TokenType::control;
  v.merges = {"\xC4\xA0 t"};
  v.bos = static_cast<int32_t>(v.texts.size()) - 2, v.eos = static_cast<int32_t>(v.texts.size()) - 1;
  v.add_bos = false;
  auto t = Tokenizer::create(std::move(v));
  const std::string text = "the tiny test, with 42 tokens\n";
  const std::vector<int32_t> ids = t->encode(text + "<|im_end|>", t->add_bos(), true);
  EXPECT_EQ(t->decode(ids, false), text);
  EXPECT_EQ(ids.back(), t->eos());
  EXPECT_TRUE(t->is_eog(ids.back()));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 256), 3);  // " t" three times, by the one merge
  EXPECT_EQ(ids.size(), 28u);                             // 26 for the text, "\n", <|im_end|>
}

nlohmann::json tiny_json() {
  std::ifstream in(source_dir() + "/tests/reference/fixtures/bpe_tiny_qwen2.json");
  return nlohmann::json::parse(in);
}

void expect_error(const nlohmann::json& j, const std::string& needle) {
  try {
    vocab_from_hf_json(j, nullptr, "test.json");
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BpeHfJson, UnsupportedFieldsAreNamed) {
  if (!std::filesystem::exists(source_dir() + "/tests/reference/fixtures/bpe_tiny_qwen2.json")) GTEST_SKIP();
  nlohmann::json j = tiny_json();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "model.type");
  j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  expect_error(j, "pattern.Regex");
  j = tiny_json();
  j["added_tokens"][0]["lstrip"] = true;
  expect_error(j, "lstrip");
  j = tiny_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_error(j, "normalizer.type");
  j = tiny_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j, "pre_tokenizer.type");
  j = tiny_json();
  j["model"]["merges"][0] = 7;
  expect_error(j, "model.merges[0]");
}

TEST(BpeHfJson, MergesAsPairsEqualMergesAsStrings) {
  if (!std::filesystem::exists(source_dir() + "/tests/reference/fixtures/bpe_tiny_qwen2.json")) GTEST_SKIP();
  nlohmann::json j = tiny_json();
  nlohmann::json strings = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"]) {
    strings.push_back(m.is_string() ? m.get<std::string>()
                                    : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& m : strings) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ', 1);
    pairs.push_back({s.substr(0, space), s.substr(space + 1)});
  }
  j["model"]["merges"] = strings;
  auto a = Tokenizer::create(vocab_from_hf_json(j, nullptr, "strings"));
  j["model"]["merges"] = pairs;
  auto b = Tokenizer::create(vocab_from_hf_json(j, nullptr, "pairs"));
  const std::string text = "Hello, world! 你好 😀 it's 2024\n\n  x";
  EXPECT_EQ(a->encode(text, false, true), b->encode(text, false, true));
}

TEST(BpePreTokenizer, UnknownNameIsAnError) {
  Vocab v;
  v.model = "gpt2";
  v.pre = "no-such-pre";
  v.texts = {"a", "b"};
  v.add_bos = false;
  EXPECT_THROW(Tokenizer::create(std::move(v)), Error);
}

// Throughput on a mixed corpus (the fixture's texts repeated; XPERT_BPE_BENCH_CORPUS names a file to
// use instead), single thread. tests/reference/bench_bpe.py runs HF tokenizers on the same file.
TEST(BpeReference, Throughput) {
  const char* name_env = std::getenv("XPERT_BPE_BENCH_TOKENIZER");
  const std::string name = name_env && *name_env ? name_env : "qwen35";
  const Tokenizer* t = tokenizer(name);
  if (!t) GTEST_SKIP() << "tokenizer '" << name << "' is absent";
  std::string corpus;
  if (const char* path = std::getenv("XPERT_BPE_BENCH_CORPUS"); path && *path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    corpus = s.str();
  } else {
    for (const auto& c : (*find_entry(name))["cases"])
      if (c.contains("ids")) corpus += from_hex(c["text"]) + "\n";
    while (corpus.size() < (1u << 20)) corpus += corpus;
  }
  // Lines, as a document collection is tokenized; the word cache starts cold.
  std::vector<std::string_view> lines;
  for (size_t at = 0; at < corpus.size();) {
    size_t end = corpus.find('\n', at);
    end = end == std::string::npos ? corpus.size() : end + 1;
    lines.push_back(std::string_view(corpus).substr(at, end - at));
    at = end;
  }
  std::vector<std::string> chunks(1);  // ~64 KB of whole lines each
  for (std::string_view line : lines) {
    chunks.back() += line;
    if (chunks.back().size() >= 65536) chunks.emplace_back();
  }
  auto run = [&](const char* unit, const auto& parts) {
    size_t n_tokens = 0;
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& part : parts)
      n_tokens += t->encode(part, false, true).size();  // HF always splits out added tokens
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    fmt::print(
        "xpert bpe [{}] {}: {:.1f} MB, {} tokens in {:.3f} s wall, {:.3f} s CPU: {:.1f} MB/s, {:.2f} M "
        "tokens/s\n",
        name, unit, corpus.size() / 1e6, n_tokens, s, cpu, corpus.size() / 1e6 / s, n_tokens / 1e6 / s);
  };
  run("lines", lines);  // the word cache starts cold here
  run("64KB chunks", chunks);
}

}  // namespace
}  // namespace xpert
