#include "model/loader.h"

#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "model/hf_model.h"

namespace xpert {

std::string TensorTable::layer(int64_t il, const char* suffix) { return fmt::format("blk.{}.{}", il, suffix); }

Weight TensorTable::check(const gguf::TensorInfo& t, std::initializer_list<int64_t> shape) const {
  std::vector<int64_t> want(shape);
  std::vector<int64_t> have = t.shape;
  while (have.size() > want.size() && have.back() == 1) have.pop_back();
  while (want.size() > have.size() && want.back() == 1) want.pop_back();
  if (have != want)
    fail("{}: tensor '{}' has shape [{}], expected [{}]", f_.path(), t.name, fmt::join(t.shape, ", "),
         fmt::join(shape, ", "));
  const DTypeInfo& info = dtype_info(t.type);
  if (!info.computable)
    fail("{}: tensor '{}' is of type {}, which xpert cannot compute yet", f_.path(), t.name, info.name);
  if (want.size() <= 1 && t.type != DType::F32)
    fail("{}: tensor '{}' is a vector of type {}, expected F32", f_.path(), t.name, info.name);
  Weight w;
  w.type = t.type;
  w.data = t.data;
  w.ne[0] = want.empty() ? 1 : want[0];
  w.ne[1] = want.size() > 1 ? want[1] : 1;
  w.ne[2] = want.size() > 2 ? want[2] : 1;
  w.n_bytes = t.n_bytes;
  return w;
}

Weight TensorTable::require(const std::string& name, std::initializer_list<int64_t> shape) const {
  const gguf::TensorInfo* t = f_.tensor(name);
  if (!t) fail("{}: tensor '{}' is missing", f_.path(), name);
  return check(*t, shape);
}

Weight TensorTable::optional(const std::string& name, std::initializer_list<int64_t> shape) const {
  const gguf::TensorInfo* t = f_.tensor(name);
  return t ? check(*t, shape) : Weight{};
}

void require_io_weights(const TensorTable& t, const ModelConfig& c, ModelWeights& w) {
  w.tok_embd = t.require("token_embd.weight", {c.n_embd, c.n_vocab});
  w.output_norm = t.require("output_norm.weight", {c.n_embd});
  w.output = t.optional("output.weight", {c.n_embd, c.n_vocab});
}

void require_attention(const TensorTable& t, const ModelConfig& c, int64_t il, AttentionTensors what, LayerWeights& l) {
  const int64_t E = c.n_embd, D = c.head_dim, q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  auto L = [&](const char* s) { return TensorTable::layer(il, s); };
  l.attn_norm = t.require(L("attn_norm.weight"), {E});
  l.wq = t.require(L("attn_q.weight"), {E, q_dim});
  l.wk = t.require(L("attn_k.weight"), {E, kv_dim});
  l.wv = t.require(L("attn_v.weight"), {E, kv_dim});
  l.wo = t.require(L("attn_output.weight"), {q_dim, E});
  if (what.bias) {
    l.bq = t.require(L("attn_q.bias"), {q_dim});
    l.bk = t.require(L("attn_k.bias"), {kv_dim});
    l.bv = t.require(L("attn_v.bias"), {kv_dim});
  }
  if (what.qk_norm) {
    l.q_norm = t.require(L("attn_q_norm.weight"), {D});
    l.k_norm = t.require(L("attn_k_norm.weight"), {D});
  }
}

void read_common_config(const gguf::GGUFFile& f, ModelConfig& c, bool require_ff) {
  ArchKeys k(f, c.arch);
  c.name = f.get_string("general.name").value_or(c.arch);
  c.n_layer = k.require_int("block_count");
  c.n_embd = k.require_int("embedding_length");
  c.n_ff = require_ff ? k.require_int("feed_forward_length") : k.get_int("feed_forward_length", 0);
  c.n_head = k.require_int("attention.head_count");
  c.n_head_kv = k.get_int("attention.head_count_kv", c.n_head);
  c.n_ctx_train = k.get_int("context_length", 2048);
  const int64_t n_embd_head = c.n_head > 0 ? c.n_embd / c.n_head : 0;
  c.head_dim = k.get_int("attention.key_length", n_embd_head);
  const int64_t v_dim = k.get_int("attention.value_length", c.head_dim);
  c.n_rot = k.get_int("rope.dimension_count", c.head_dim);
  c.rms_eps = (float)k.get_float("attention.layer_norm_rms_epsilon", 1e-6);
  c.rope_base = (float)k.get_float("rope.freq_base", 10000.0);
  const auto scaling = f.get_string(c.arch + ".rope.scaling.type");
  const double factor = k.get_float("rope.scaling.factor", 0.0);
  if (scaling && *scaling == "linear" && factor > 0) c.rope_scale = (float)(1.0 / factor);
  else if (scaling && *scaling != "none" && *scaling != "linear")
    fail("{}: rope scaling '{}' is not supported yet", f.path(), *scaling);

  auto bad = [&](const char* what, int64_t v) { fail("{}: {} = {} is not valid", f.path(), what, v); };
  if (c.n_layer <= 0 || c.n_layer > 4096) bad("block_count", c.n_layer);
  if (c.n_embd <= 0 || c.n_embd > (1 << 20)) bad("embedding_length", c.n_embd);
  if ((require_ff && c.n_ff <= 0) || c.n_ff < 0 || c.n_ff > (1 << 22)) bad("feed_forward_length", c.n_ff);
  if (c.n_head <= 0 || c.n_head > 4096) bad("attention.head_count", c.n_head);
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0) bad("attention.head_count_kv", c.n_head_kv);
  if (c.head_dim <= 0 || c.head_dim > 4096 || c.head_dim % 2) bad("attention.key_length", c.head_dim);
  if (v_dim != c.head_dim) fail("{}: value_length {} != key_length {} is not supported", f.path(), v_dim, c.head_dim);
  if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2) bad("rope.dimension_count", c.n_rot);
  if (!(c.rope_base > 0) || !std::isfinite(c.rope_base)) fail("{}: rope.freq_base must be positive", f.path());

  const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  if (!emb) fail("{}: tensor 'token_embd.weight' is missing", f.path());
  c.n_vocab = emb->shape.size() > 1 ? emb->shape[1] : 0;
  if (toks && (int64_t)toks->count != c.n_vocab)
    log::warn("{}: vocabulary has {} tokens, embedding has {} rows", f.path(), toks->count, c.n_vocab);
}

std::vector<std::string> supported_architectures() { return {"gemma3", "llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe"}; }

std::unique_ptr<Model> Model::load(const std::string& path) {
  // A folder is a Hugging Face checkpoint, converted in memory to the GGUF layout (model/hf_model.h).
  auto file = std::filesystem::is_directory(path) ? hf::open_folder(path) : gguf::GGUFFile::open(path);
  const std::string arch = file->require_string("general.architecture");
  if (arch == "gemma3") return make_gemma3(std::move(file));
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3") return make_llama_dense(std::move(file));
  if (arch == "qwen3moe") return make_qwen3moe(std::move(file));
  if (arch == "qwen35" || arch == "qwen35moe") return make_qwen35(std::move(file));
  fail("{}: architecture '{}' is not supported (supported: {})", path, arch, fmt::join(supported_architectures(), ", "));
}

}  // namespace xpert
