#include "model/hf_vocab.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "format/hf_config.h"
#include "text/hf_tokenizer.h"

namespace xpert::hf {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const fs::path& p) {
  const auto text = read_text(p);
  if (!text) return json();
  try {
    return json::parse(*text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", p.string(), e.what());
  }
}

}  // namespace

std::optional<std::string> chat_template(const std::string& dir) {
  if (auto t = read_text(fs::path(dir) / "chat_template.jinja")) return t;
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  const json config = read_json(config_path);
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null())
    return std::nullopt;
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    fail("{}: chat_template is a list without a \"default\" entry", config_path.string());
  }
  fail("{}: chat_template must be a string or a list of {{name, template}}", config_path.string());
}

bool add_tokenizer_metadata(const std::string& dir, int64_t n_vocab, Metadata& kv) {
  const fs::path tok_path = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(tok_path)) return false;
  const json tok = read_json(tok_path);
  const json config = read_json(fs::path(dir) / "tokenizer_config.json");
  Vocab v = vocab_from_hf_json(tok, config, tok_path.string());
  if (n_vocab > 0 && (int64_t)v.texts.size() > n_vocab)
    fail("{}: the tokenizer has {} tokens but the model's embedding has only {} rows", tok_path.string(),
         v.texts.size(), n_vocab);
  for (int64_t i = (int64_t)v.texts.size(); i < n_vocab; ++i) {
    v.texts.push_back("[PAD" + std::to_string(i) + "]");
    v.types.push_back(TokenType::unused);
  }
  std::vector<int32_t> types(v.texts.size(), (int32_t)TokenType::normal);
  for (size_t i = 0; i < v.types.size() && i < types.size(); ++i) types[i] = (int32_t)v.types[i];

  using gguf::Value;
  using gguf::ValueType;
  kv.emplace_back("tokenizer.ggml.model", Value::of_string(v.model));
  kv.emplace_back("tokenizer.ggml.pre", Value::of_string(v.pre));
  kv.emplace_back("tokenizer.ggml.tokens", Value::of_strings(std::move(v.texts)));
  kv.emplace_back("tokenizer.ggml.token_type", Value::of_numbers(ValueType::I32, types.data(), types.size()));
  kv.emplace_back("tokenizer.ggml.merges", Value::of_strings(std::move(v.merges)));
  auto id = [&](const char* key, int32_t value) {
    if (value != kNoToken) kv.emplace_back(key, Value::of_uint(ValueType::U32, (uint32_t)value));
  };
  id("tokenizer.ggml.bos_token_id", v.bos);
  id("tokenizer.ggml.eos_token_id", v.eos);
  id("tokenizer.ggml.padding_token_id", v.pad);
  kv.emplace_back("tokenizer.ggml.add_bos_token", Value::of_bool(v.add_bos));
  kv.emplace_back("tokenizer.ggml.add_eos_token", Value::of_bool(v.add_eos));
  if (auto t = chat_template(dir))
    kv.emplace_back("tokenizer.chat_template", Value::of_string(std::move(*t)));
  return true;
}

std::unique_ptr<gguf::GGUFFile> open_tokenizer_only(const std::string& dir) {
  int64_t n_vocab = 0;
  if (fs::exists(fs::path(dir) / "config.json")) n_vocab = Config::load(dir).get_int("vocab_size", 0);
  Metadata kv;
  if (!add_tokenizer_metadata(dir, n_vocab, kv)) fail("{}: no tokenizer.json in this folder", dir);
  return gguf::GGUFFile::assemble(dir, std::move(kv), {}, nullptr);
}

}  // namespace xpert::hf
