// config.json of a Hugging Face checkpoint folder, read with errors that name the file and the field.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace xpert::hf {

// A multimodal config (Qwen3.5's *ForConditionalGeneration) keeps the language model's settings under
// text_config; those are read first, the top level filling in the rest.
class Config {
 public:
  static Config load(const std::string& dir);  // throws Error when config.json is missing or not JSON
  static Config from_json(nlohmann::json j, std::string path);

  const std::string& path() const { return path_; }
  const nlohmann::json* find(const std::string& key) const;  // text_config first, then the top level
  bool has(const std::string& key) const { return find(key) != nullptr; }
  int64_t require_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  // Throws "<path>: <key> = <value> is not supported (<expected>)".
  [[noreturn]] void refuse(const std::string& key, const std::string& expected) const;

 private:
  nlohmann::json top_, text_;
  std::string path_;
};

}  // namespace xpert::hf
