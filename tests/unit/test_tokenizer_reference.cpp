// The Gemma 3 270M test model's tokenizer (models/gemma3-270m.gguf) against llama.cpp: tests/reference/fixtures/tokenizer_default.json
// holds llama.cpp's ids, pieces and detokenizations (tests/reference/make_tokenizer_fixtures.py).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/utf8_stream.h"

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

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

class TokenizerReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string model = source_dir() + "/models/gemma3-270m.gguf";
    const std::string fixture = source_dir() + "/tests/reference/fixtures/tokenizer_default.json";
    if (!std::filesystem::exists(model) || !std::filesystem::exists(fixture)) return;
    file_ = gguf::GGUFFile::open(model);
    tokenizer_ = Tokenizer::from_gguf(*file_);
    std::ifstream in(fixture);
    ref_ = nlohmann::json::parse(in);
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    file_.reset();
  }
  void SetUp() override {
    if (!tokenizer_) GTEST_SKIP() << "models/gemma3-270m.gguf or the tokenizer fixture is absent";
  }

  static std::unique_ptr<gguf::GGUFFile> file_;
  static std::unique_ptr<Tokenizer> tokenizer_;
  static nlohmann::json ref_;
};
std::unique_ptr<gguf::GGUFFile> TokenizerReference::file_;
std::unique_ptr<Tokenizer> TokenizerReference::tokenizer_;
nlohmann::json TokenizerReference::ref_;

TEST_F(TokenizerReference, SpecialTokensAndEndOfGeneration) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.n_vocab(), ref_["n_vocab"].get<int32_t>());
  EXPECT_EQ(t.bos(), ref_["bos"].get<int32_t>());
  EXPECT_EQ(t.eos(), ref_["eos"].get<int32_t>());
  EXPECT_EQ(t.eot(), ref_["eot"].get<int32_t>());
  EXPECT_EQ(t.add_bos(), ref_["add_bos"].get<bool>());
  EXPECT_EQ(t.eog_ids(), ref_["eog"].get<std::vector<int32_t>>());
  EXPECT_EQ(t.model_name(), "llama");
  EXPECT_EQ(t.token_text(105), "<start_of_turn>");
  EXPECT_TRUE(t.is_eog(106));  // <end_of_turn>
  EXPECT_FALSE(t.is_eog(105));
}

TEST_F(TokenizerReference, IdsMatchLlamaCpp) {
  int checked = 0, mismatched = 0;
  for (const auto& c : ref_["cases"]) {
    const std::string text = from_hex(c["hex"]);
    for (bool add_bos : {false, true}) {
      for (bool special : {false, true}) {
        const auto want =
            c[fmt::format("ids_bos{}_sp{}", int(add_bos), int(special))].get<std::vector<int32_t>>();
        const std::vector<int32_t> got = tokenizer_->encode(text, add_bos, special);
        ++checked;
        if (got != want) {
          ++mismatched;
          ADD_FAILURE() << "case " << c["name"].get<std::string>() << " add_bos=" << add_bos
                        << " special=" << special << " text='" << printable(text) << "'\n  want "
                        << ::testing::PrintToString(want) << "\n  got  " << ::testing::PrintToString(got);
        }
      }
    }
  }
  EXPECT_GE(checked, 4 * 40);
  EXPECT_EQ(mismatched, 0) << "of " << checked;
}

// Every case back to back, repeated to 256 KiB; the fixture keeps only a checksum of the ids.
TEST_F(TokenizerReference, LongTextMatchesLlamaCpp) {
  std::string joined, text;
  for (const auto& c : ref_["cases"]) joined += from_hex(c["hex"]) + "\n";
  const auto& ref = ref_["long_text"];
  while (text.size() < ref["min_bytes"].get<size_t>()) text += joined;
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tokenizer_->encode(text, false, special);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t id : ids) {
      for (int k = 0; k < 4; ++k)
        h = (h ^ ((static_cast<uint32_t>(id) >> (8 * k)) & 0xff)) * 0x100000001b3ull;
    }
    const auto& want = ref[special ? "sp1" : "sp0"];
    EXPECT_EQ(ids.size(), want["n_ids"].get<size_t>()) << "special=" << special;
    EXPECT_EQ(fmt::format("{:016x}", h), want["fnv1a_ids"].get<std::string>()) << "special=" << special;
  }
}

TEST_F(TokenizerReference, PiecesMatchLlamaCpp) {
  int checked = 0;
  for (const auto& [key, hex] : ref_["pieces"].items()) {
    const int32_t id = std::stoi(key);
    const std::string plain = from_hex(hex[0]);
    const std::string special = hex.size() > 1 ? from_hex(hex[1]) : plain;
    EXPECT_EQ(tokenizer_->token_to_piece(id, false), plain) << "token " << id;
    EXPECT_EQ(tokenizer_->token_to_piece(id, true), special) << "token " << id;
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

// Attributes after llama.cpp's fix-ups ("</s>" ends generation so becomes control, "<unusedN>"
// control tokens are marked unused).
TEST_F(TokenizerReference, AttributesMatchLlamaCpp) {
  int checked = 0;
  for (const auto& [key, attr] : ref_["attrs"].items()) {
    EXPECT_EQ(tokenizer_->token_attr(std::stoi(key)), attr.get<uint32_t>()) << "token " << key;
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

TEST_F(TokenizerReference, DecodeMatchesLlamaCpp) {
  for (const auto& c : ref_["cases"]) {
    const auto ids = c["ids_bos0_sp1"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer_->decode(ids, false), from_hex(c["detok_sp0_hex"])) << c["name"];
    EXPECT_EQ(tokenizer_->decode(ids, true), from_hex(c["detok_sp1_hex"])) << c["name"];
  }
}

// Byte fallback makes tokenization lossless for valid UTF-8. (Not for the rest, in llama.cpp too: an
// invalid lead byte swallows the next bytes into one symbol, so a following space goes out as the
// bytes of U+2581; and a literal U+2581 comes back as a space.)
TEST_F(TokenizerReference, RoundTripsValidText) {
  int checked = 0;
  for (const auto& c : ref_["cases"]) {
    const std::string text = from_hex(c["hex"]);
    if (sanitize_utf8(text) != text || text.find("\xe2\x96\x81") != std::string::npos) continue;
    ++checked;
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(text, false, false), false), text) << c["name"];
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(text, false, true), true), text) << c["name"];
  }
  EXPECT_GT(checked, 40);
}

// Token-by-token streaming gives exactly the decoded text, with ill-formed bytes replaced.
TEST_F(TokenizerReference, StreamingEqualsDecode) {
  for (const auto& c : ref_["cases"]) {
    const auto ids = c["ids_bos0_sp1"].get<std::vector<int32_t>>();
    Utf8Stream stream(*tokenizer_, true);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, sanitize_utf8(tokenizer_->decode(ids, true))) << c["name"];
  }
}

TEST_F(TokenizerReference, Throughput) {
  std::string corpus;
  for (const auto& c : ref_["cases"]) {
    const std::string text = from_hex(c["hex"]);
    if (sanitize_utf8(text) == text && text.find("\xe2\x96\x81") == std::string::npos) corpus += text + "\n";
  }
  std::string text;
  while (text.size() < (10u << 20)) text += corpus;
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t start_cpu = std::clock();
  const std::vector<int32_t> ids = tokenizer_->encode(text, false, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_seconds = static_cast<double>(std::clock() - start_cpu) / CLOCKS_PER_SEC;
  const double mb = static_cast<double>(text.size()) / (1 << 20);
  std::printf("[          ] encode: %.1f MiB -> %zu tokens in %.3f s (%.3f s CPU) = %.1f MiB/s\n", mb,
              ids.size(), seconds, cpu_seconds, mb / seconds);
  const auto start_decode = std::chrono::steady_clock::now();
  const std::string back = tokenizer_->decode(ids, true);
  const double decode_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_decode).count();
  std::printf("[          ] decode: %.1f MiB/s\n", mb / decode_s);
  // Not EXPECT_EQ: printing two 10 MB strings is not useful.
  const auto diverge = std::mismatch(back.begin(), back.end(), text.begin(), text.end());
  EXPECT_TRUE(back == text) << "first difference at byte " << (diverge.first - back.begin()) << ": '"
                            << printable(std::string(diverge.first, back.end()).substr(0, 40)) << "' vs '"
                            << printable(std::string(diverge.second, text.end()).substr(0, 40)) << "'";
  EXPECT_LT(seconds, 30.0);  // a bound for slow debug builds; Release is far faster
}

}  // namespace
}  // namespace xpert
