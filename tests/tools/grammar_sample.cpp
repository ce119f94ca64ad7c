// Random sentences of a grammar, for tests that check them with an outside validator
// (tests/cli/test_json_schema.py checks JSON-schema grammars' sentences with python's jsonschema).
//
//   grammar_sample SCHEMA.json N SEED      N sentences of the schema's grammar, as a JSON array of strings
//   grammar_sample --gbnf FILE N SEED      the same for a GBNF file
//
// A walk draws tokens of a small vocabulary (every byte and some multi-byte and multi-element pieces)
// through the token masks, as constrained decoding does, preferring closing punctuation now and then so
// that strings and arrays end; it stops at a complete sentence with probability 1/2 and gives up after
// 3000 bytes (a sentence it did not finish is not printed).
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "sample/grammar.h"
#include "sample/json_schema.h"

using namespace xpert;

int main(int argc, char** argv) {
  try {
    int a = 1;
    const bool gbnf = argc > 1 && std::string(argv[1]) == "--gbnf";
    if (gbnf) ++a;
    if (argc - a != 3) {
      std::cerr << "usage: grammar_sample [--gbnf] FILE N SEED\n";
      return 2;
    }
    std::ifstream in(argv[a]);
    std::stringstream text;
    text << in.rdbuf();
    const std::string source =
        gbnf ? text.str() : json_schema_to_gbnf(nlohmann::ordered_json::parse(text.str()));
    const auto grammar = Grammar::parse(source);
    const int n = std::stoi(argv[a + 1]);
    std::mt19937_64 rng(std::stoull(argv[a + 2]));

    std::vector<std::string> vocab;
    for (int c = 1; c < 256; ++c) vocab.push_back(std::string(1, (char)c));
    for (const char* p : {"{\"", "\":", "\": ", "\", \"", "\",", "true", "false", "null", "}", "]", "},", "],",
                          "12", "0.5", "-3", "\\n", "\\\"", "\\u00e9", "\xc3\xa9", "\xe4\xbd\xa0", "\xce", "\xb1",
                          "ab", " a", "2024-", "-0", ":00", "@", ".com"})
      vocab.push_back(p);
    const TokenTrie trie(vocab);
    const std::string closing = "\"]},0123456789";

    nlohmann::json out = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      GrammarMatcher m(grammar);
      std::string text;
      bool done = false;
      while (text.size() < 3000) {
        if (m.finished() || (m.complete() && rng() % 2 == 0)) {
          done = true;
          break;
        }
        const std::vector<uint32_t>& mask = m.allowed_tokens(trie);
        std::vector<int32_t> allowed, preferred;
        for (int32_t id = 0; id < trie.n_vocab(); ++id)
          if ((mask[id / 32] >> (id % 32)) & 1) {
            allowed.push_back(id);
            if (vocab[id].size() == 1 && closing.find(vocab[id][0]) != std::string::npos) preferred.push_back(id);
          }
        if (allowed.empty()) break;  // cannot happen for a grammar whose every prefix continues
        const auto& pool = !preferred.empty() && rng() % 3 == 0 ? preferred : allowed;
        const int32_t id = pool[rng() % pool.size()];
        if (!m.accept(vocab[id])) {
          std::cerr << "grammar_sample: a token of the mask was refused\n";
          return 1;
        }
        text += vocab[id];
      }
      if (done) out.push_back(text);
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "grammar_sample: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
