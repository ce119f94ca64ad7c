#include "model/loader.h"

#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "model/hf_model.h"

namespace xpert {

namespace {

// The tensor's Weight, if its shape (trailing 1s aside) is `shape` and xpert can compute its type.
Weight checked(const gguf::GGUFFile& f, const gguf::TensorInfo& t, const std::vector<int64_t>& shape) {
  std::vector<int64_t> want = shape;
  std::vector<int64_t> have = t.shape;
  while (have.size() > want.size() && have.back() == 1) have.pop_back();
  while (want.size() > have.size() && want.back() == 1) want.pop_back();
  if (have != want)
    fail("{}: tensor '{}' has shape [{}], expected [{}]", f.path(), t.name, fmt::join(t.shape, ", "),
         fmt::join(shape, ", "));
  const DTypeInfo& info = dtype_info(t.type);
  if (!info.computable)
    fail("{}: tensor '{}' is of type {}, which xpert cannot compute yet", f.path(), t.name, info.name);
  if (want.size() <= 1 && t.type != DType::F32)
    fail("{}: tensor '{}' is a vector of type {}, expected F32", f.path(), t.name, info.name);
  Weight w;
  w.type = t.type;
  w.data = t.data;
  // The declared extents: a 1-expert file's [E, F] experts are still [E, F, 1], sliced per expert.
  for (size_t d = 0; d < 3; ++d) w.ne[d] = d < shape.size() ? shape[d] : 1;
  w.n_bytes = t.n_bytes;
  return w;
}

Weight load(const gguf::GGUFFile& f, const TensorDecl& d, int64_t il) {
  const std::string name = layer_tensor_name(il, d.name);
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) {
    if (d.need == Need::optional) return Weight{};
    fail("{}: tensor '{}' is missing", f.path(), name);
  }
  return checked(f, *t, d.shape);
}

}  // namespace

void load_tensors(const gguf::GGUFFile& f, const ModelConfig& c, TensorTableFn table, ModelWeights& w) {
  for (const TensorDecl& d : table(c, kIoTensors)) w.*d.io_field = load(f, d, kIoTensors);
  w.layers.resize(c.n_layer);
  for (int64_t il = 0; il < c.n_layer; ++il)
    for (const TensorDecl& d : table(c, il)) w.layers[il].*d.field = load(f, d, il);
}

TensorList io_tensors(const ModelConfig& c, HfFn norm_fn) {
  const int64_t E = c.n_embd, V = c.n_vocab;
  return {{.name = "token_embd.weight",
           .shape = {E, V},
           .hf = hf_linear("model.embed_tokens"),
           .io_field = &ModelWeights::tok_embd},
          {.name = "output_norm.weight",
           .shape = {E},
           .synth = SynthFill::ones,
           .hf = hf_vector("model.norm.weight", norm_fn),
           .io_field = &ModelWeights::output_norm},
          {.name = "output.weight",
           .shape = {E, V},
           .synth = SynthFill::output,
           .hf = hf_linear("lm_head"),
           .need = Need::optional,
           .io_field = &ModelWeights::output}};
}

TensorList attention_tensors(const ModelConfig& c, AttentionTensors what) {
  using LW = LayerWeights;
  using enum SynthFill;
  const int64_t E = c.n_embd, D = c.head_dim, q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  const int64_t q_rows = (what.gated ? 2 : 1) * q_dim;
  // clang-format off
  TensorList t = {
      {"attn_q.weight",      {E, q_rows}, &LW::wq, matrix,    hf_linear("self_attn.q_proj")},
      {"attn_k.weight",      {E, kv_dim}, &LW::wk, matrix,    hf_linear("self_attn.k_proj")},
      {"attn_v.weight",      {E, kv_dim}, &LW::wv, more_bits, hf_linear("self_attn.v_proj")},
      {"attn_output.weight", {q_dim, E},  &LW::wo, matrix,    hf_linear("self_attn.o_proj")},
  };
  if (what.bias)  // qwen2; the converter takes no qwen2 checkpoints
    append(t, {
        {"attn_q.bias", {q_dim},  &LW::bq, normal},
        {"attn_k.bias", {kv_dim}, &LW::bk, normal},
        {"attn_v.bias", {kv_dim}, &LW::bv, normal},
    });
  if (what.qk_norm)
    append(t, {
        {"attn_q_norm.weight", {D}, &LW::q_norm, ones, hf_vector("self_attn.q_norm.weight", what.norm_fn)},
        {"attn_k_norm.weight", {D}, &LW::k_norm, ones, hf_vector("self_attn.k_norm.weight", what.norm_fn)},
    });
  // clang-format on
  return t;
}

TensorTableFn tensor_table(const std::string& arch) {
  if (arch == "gemma3") return gemma3_tensors;
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3") return llama_dense_tensors;
  if (arch == "qwen3moe") return qwen3moe_tensors;
  if (arch == "qwen35" || arch == "qwen35moe") return qwen35_tensors;
  fail("architecture '{}' is not supported (supported: {})", arch,
       fmt::join(supported_architectures(), ", "));
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
  // NaN passes every comparison: without this a NaN epsilon ran and printed nothing (issue #37).
  if (!(c.rms_eps > 0 && c.rms_eps < 1))
    fail("{}: attention.layer_norm_rms_epsilon = {} is not valid (expected a small positive number, e.g. 1e-6)",
         f.path(), c.rms_eps);

  const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  if (!emb) fail("{}: tensor 'token_embd.weight' is missing", f.path());
  c.n_vocab = emb->shape.size() > 1 ? emb->shape[1] : 0;
  if (toks && (int64_t)toks->count != c.n_vocab)
    log::warn("{}: vocabulary has {} tokens, embedding has {} rows", f.path(), toks->count, c.n_vocab);
}

std::vector<std::string> supported_architectures() { return {"gemma3", "llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe"}; }

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  // A folder is a Hugging Face checkpoint, converted in memory to the GGUF layout (model/hf_model.h).
  auto file = std::filesystem::is_directory(path)
                  ? hf::open_folder(path, {.native_gptq_experts = options.native_gptq_experts})
                  : gguf::GGUFFile::open(path);
  const std::string arch = file->require_string("general.architecture");
  if (arch == "gemma3") return make_gemma3(std::move(file));
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3") return make_llama_dense(std::move(file));
  if (arch == "qwen3moe") return make_qwen3moe(std::move(file));
  if (arch == "qwen35" || arch == "qwen35moe") return make_qwen35(std::move(file));
  fail("{}: architecture '{}' is not supported (supported: {})", path, arch, fmt::join(supported_architectures(), ", "));
}

}  // namespace xpert
