#include "format/hf_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace xpert::hf {

using nlohmann::json;

Config Config::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: no config.json in this folder (expected a Hugging Face checkpoint)", dir);
  std::ostringstream s;
  s << in.rdbuf();
  json j;
  try {
    j = json::parse(s.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  return from_json(std::move(j), path);
}

Config Config::from_json(json j, std::string path) {
  if (!j.is_object()) fail("{}: expected a JSON object", path);
  Config c;
  c.path_ = std::move(path);
  if (j.contains("text_config") && j["text_config"].is_object()) c.text_ = j["text_config"];
  c.top_ = std::move(j);
  return c;
}

const json* Config::find(const std::string& key) const {
  if (text_.is_object()) {
    const auto it = text_.find(key);
    if (it != text_.end() && !it->is_null()) return &*it;
  }
  const auto it = top_.find(key);
  return it != top_.end() && !it->is_null() ? &*it : nullptr;
}

int64_t Config::require_int(const std::string& key) const {
  const json* v = find(key);
  if (!v) fail("{}: '{}' is missing (expected an integer)", path_, key);
  if (!v->is_number_integer()) fail("{}: '{}' = {} is not an integer", path_, key, v->dump());
  return v->get<int64_t>();
}

int64_t Config::get_int(const std::string& key, int64_t def) const {
  return has(key) ? require_int(key) : def;
}

double Config::get_float(const std::string& key, double def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_number()) fail("{}: '{}' = {} is not a number", path_, key, v->dump());
  return v->get<double>();
}

bool Config::get_bool(const std::string& key, bool def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_boolean()) fail("{}: '{}' = {} is not true or false", path_, key, v->dump());
  return v->get<bool>();
}

std::string Config::get_string(const std::string& key, const std::string& def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_string()) fail("{}: '{}' = {} is not a string", path_, key, v->dump());
  return v->get<std::string>();
}

void Config::refuse(const std::string& key, const std::string& expected) const {
  const json* v = find(key);
  fail("{}: {} = {} is not supported ({})", path_, key, v ? v->dump() : "(missing)", expected);
}

}  // namespace xpert::hf
