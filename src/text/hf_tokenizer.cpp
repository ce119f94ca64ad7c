#include "text/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "text/pretokenize.h"

namespace xpert {

namespace {

using nlohmann::json;

const json& field(const json& obj, const char* key, std::string_view source, std::string_view where) {
  if (!obj.is_object() || !obj.contains(key)) fail("{}: {} has no \"{}\"", source, where, key);
  return obj[key];
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

bool flag(const json& obj, const char* key, bool fallback) {
  return obj.is_object() && obj.contains(key) && obj[key].is_boolean() ? obj[key].get<bool>() : fallback;
}

// tokenizer_config.json writes a token either as a string or as {"content": ...}.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string())
    return t["content"].get<std::string>();
  return std::nullopt;
}

// The regex configuration of the pre_tokenizer, or Error.
const PreTokenizerSpec& pre_tokenizer_of(const json& pre, std::string_view source) {
  const std::string type = type_of(pre);
  auto check_byte_level = [&](const json& bl, bool want_regex, std::string_view where) {
    if (flag(bl, "add_prefix_space", false))
      fail("{}: {}.add_prefix_space = true is not supported", source, where);
    if (flag(bl, "use_regex", true) != want_regex)
      fail("{}: {}.use_regex = {} is not supported here", source, where, !want_regex);
  };
  if (type == "ByteLevel") {
    check_byte_level(pre, true, "pre_tokenizer (ByteLevel)");
    return *find_pre_tokenizer("gpt-2");
  }
  if (type != "Sequence")
    fail("{}: pre_tokenizer.type '{}' is not supported (ByteLevel or Sequence[Split, ByteLevel])", source,
         type);
  const json& list = field(pre, "pretokenizers", source, "pre_tokenizer");
  if (!list.is_array() || list.size() != 2 || type_of(list[0]) != "Split" || type_of(list[1]) != "ByteLevel")
    fail("{}: pre_tokenizer.pretokenizers must be [Split, ByteLevel]; found {}", source, list.dump());
  const json& split = list[0];
  const json& pattern = field(split, "pattern", source, "pre_tokenizer.pretokenizers[0]");
  if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
    fail("{}: pre_tokenizer.pretokenizers[0].pattern must be {{\"Regex\": ...}}", source);
  const std::string behavior = split.value("behavior", "");
  if (behavior != "Isolated")
    fail("{}: pre_tokenizer.pretokenizers[0].behavior '{}' is not supported (Isolated)", source, behavior);
  if (flag(split, "invert", false))
    fail("{}: pre_tokenizer.pretokenizers[0].invert = true is not supported", source);
  check_byte_level(list[1], false, "pre_tokenizer.pretokenizers[1]");
  const std::string regex = pattern["Regex"].get<std::string>();
  const PreTokenizerSpec* spec = find_pre_tokenizer_by_regex(regex);
  if (!spec)
    fail("{}: pre_tokenizer.pretokenizers[0].pattern.Regex is not one llama.cpp knows: {}", source, regex);
  return *spec;
}

// The BOS token the post-processor puts before a single sequence, if any.
std::optional<std::string> bos_of_post_processor(const json& post, std::string_view source) {
  const std::string type = type_of(post);
  if (type == "Sequence") {
    for (const json& p : post.value("processors", json::array())) {
      if (auto bos = bos_of_post_processor(p, source)) return bos;
    }
    return std::nullopt;
  }
  if (type != "TemplateProcessing") return std::nullopt;
  const json& single = field(post, "single", source, "post_processor");
  if (!single.is_array() || single.empty()) return std::nullopt;
  const json& first = single[0];
  if (first.is_object() && first.contains("SpecialToken")) return first["SpecialToken"].value("id", "");
  return std::nullopt;
}

}  // namespace

Vocab vocab_from_hf_json(const json& tok, const json& config, std::string_view source) {
  if (!tok.is_object()) fail("{}: not a tokenizer.json (expected a JSON object)", source);
  const json& model = field(tok, "model", source, "the file");
  const std::string model_type = type_of(model);
  if (model_type != "BPE") fail("{}: model.type '{}' is not supported (only BPE)", source, model_type);
  if (flag(model, "byte_fallback", false))
    fail("{}: model.byte_fallback = true (SentencePiece-style BPE) is not supported", source);
  if (model.contains("dropout") && !model["dropout"].is_null())
    fail("{}: model.dropout is not supported", source);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      fail("{}: model.{} is not supported", source, key);
  }

  if (tok.contains("normalizer") && !tok["normalizer"].is_null()) {
    const std::string type = type_of(tok["normalizer"]);
    if (type != "NFC") fail("{}: normalizer.type '{}' is not supported (none or NFC)", source, type);
    log::debug("{}: the NFC normalizer is not applied (as in llama.cpp)", source);
  }
  const PreTokenizerSpec& pre = pre_tokenizer_of(field(tok, "pre_tokenizer", source, "the file"), source);
  if (flag(model, "ignore_merges", false) != pre.ignore_merges)
    fail("{}: model.ignore_merges = {} but the '{}' pre-tokenizer goes with ignore_merges = {}", source,
         flag(model, "ignore_merges", false), pre.name, pre.ignore_merges);

  Vocab v;
  v.model = "gpt2";
  v.pre = std::string(pre.name);
  const json& vocab = field(model, "vocab", source, "model");
  if (!vocab.is_object()) fail("{}: model.vocab must be an object of token -> id", source);
  const json& added = tok.contains("added_tokens") ? tok["added_tokens"] : json::array();
  if (!added.is_array()) fail("{}: added_tokens must be an array", source);

  int64_t n = 0;
  auto checked_id = [&](const json& id, std::string_view where) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31) - 1)
      fail("{}: {} has an invalid id {}", source, where, id.dump());
    return id.get<int64_t>();
  };
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    n = std::max(n, checked_id(it.value(), "model.vocab") + 1);
  for (const json& a : added)
    n = std::max(n, checked_id(field(a, "id", source, "added_tokens[]"), "added_tokens[]") + 1);
  v.texts.assign(static_cast<size_t>(n), std::string());
  v.types.assign(static_cast<size_t>(n), TokenType::unused);
  std::vector<bool> set(static_cast<size_t>(n), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = static_cast<size_t>(it.value().get<int64_t>());
    if (set[id]) fail("{}: model.vocab gives id {} to both '{}' and '{}'", source, id, v.texts[id], it.key());
    v.texts[id] = it.key(), v.types[id] = TokenType::normal, set[id] = true;
  }
  for (const json& a : added) {
    const auto id = static_cast<size_t>(a["id"].get<int64_t>());
    const json& content = field(a, "content", source, "added_tokens[]");
    if (!content.is_string()) fail("{}: added_tokens[id {}].content must be a string", source, id);
    for (const char* key : {"lstrip", "rstrip", "single_word"}) {
      if (flag(a, key, false)) fail("{}: added_tokens[id {}].{} = true is not supported", source, id, key);
    }
    if (set[id] && v.texts[id] != content.get<std::string>())
      fail("{}: added token {} '{}' has the id of vocabulary token '{}'", source, id,
           content.get<std::string>(), v.texts[id]);
    v.texts[id] = content.get<std::string>();
    v.types[id] = flag(a, "special", false) ? TokenType::control : TokenType::user_defined;
    set[id] = true;
  }
  for (size_t id = 0; id < set.size(); ++id) {
    if (!set[id])
      v.texts[id] = "[PAD" + std::to_string(id) + "]";  // a hole in the ids, as the GGUF converter fills it
  }

  const json& merges = field(model, "merges", source, "model");
  if (!merges.is_array()) fail("{}: model.merges must be an array", source);
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const std::string a = m[0].get<std::string>(), b = m[1].get<std::string>();
      if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
        fail("{}: model.merges[{}] has a piece with a space, which byte-level BPE never has", source, i);
      v.merges.push_back(a + " " + b);
    } else {
      fail("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]; found {}", source, i, m.dump());
    }
  }

  auto id_of = [&](const std::string& text) -> int32_t {
    for (size_t id = 0; id < v.texts.size(); ++id) {
      if (v.texts[id] == text) return static_cast<int32_t>(id);
    }
    return kNoToken;
  };
  std::optional<std::string> bos = config_token(config, "bos_token");
  const std::optional<std::string> template_bos =
      tok.contains("post_processor") ? bos_of_post_processor(tok["post_processor"], source) : std::nullopt;
  if (!bos) bos = template_bos;
  v.bos = bos ? id_of(*bos) : kNoToken;
  v.add_bos = flag(config, "add_bos_token", template_bos.has_value());
  if (auto eos = config_token(config, "eos_token")) {
    v.eos = id_of(*eos);
  } else {
    for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|eot_id|>", "<|im_end|>"}) {
      if ((v.eos = id_of(t)) != kNoToken) break;
    }
  }
  v.add_eos = flag(config, "add_eos_token", false);
  if (auto pad = config_token(config, "pad_token")) v.pad = id_of(*pad);
  v.add_space_prefix = false;
  return v;
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail("cannot open {}", p.string());
    std::ostringstream s;
    s << in.rdbuf();
    json j = json::parse(s.str(), nullptr, false);
    if (j.is_discarded()) fail("{}: not valid JSON", p.string());
    return j;
  };
  const json tok = read(path);
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  const json config = std::filesystem::exists(config_path) ? read(config_path) : json();
  return Tokenizer::create(vocab_from_hf_json(tok, config, path));
}

}  // namespace xpert
