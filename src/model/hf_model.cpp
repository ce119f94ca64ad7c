#include "model/hf_model.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include "base/error.h"
#include "base/half.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "model/hf_vocab.h"
#include "model/loader.h"
#include "quant/gptq.h"

namespace xpert::hf {

namespace {

namespace st = safetensors;
using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

// One 2-D weight of the checkpoint for y = W x, W [rows][cols]: a float tensor (or matrix `index` of a
// 3-D one, from row `row0`), or a GPTQ layer.
struct Matrix {
  std::string name;  // the HF module, for messages
  const st::Tensor* w = nullptr;
  int64_t index = 0, row0 = 0;
  gptq::Layer q;
  int64_t rows = 0, cols = 0;
  bool is_gptq() const { return q.qweight != nullptr; }
};

// Where a planned GGUF tensor's bytes come from: the map as they are, or `fill` into the owned buffer.
struct Planned {
  gguf::TensorInfo info;
  const uint8_t* direct = nullptr;
  std::function<void(uint8_t*)> fill;
};

// An index map in units: output unit u takes source unit map[u]; empty is the identity.
using IndexMap = std::vector<int64_t>;

DType float_type(const st::Tensor& t, const std::string& dir) {
  switch (t.dtype) {
    case st::DType::F32:
      return DType::F32;
    case st::DType::F16:
      return DType::F16;
    case st::DType::BF16:
      return DType::BF16;
    default:
      fail("{}: tensor '{}' has dtype {}; xpert reads F32, F16 and BF16 weights (and GPTQ INT4)", dir, t.name,
           st::dtype_name(t.dtype));
  }
}

float load_float(const st::Tensor& t, int64_t i) {
  switch (t.dtype) {
    case st::DType::F32: {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return v;
    }
    case st::DType::F16:
    case st::DType::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return t.dtype == st::DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    default:
      XP_ASSERT(false);
  }
  return 0;
}

// The value-head reorder of llama.cpp's Qwen3.5 converter: HF groups the value heads by key head
// (k0: v0..v{r-1}, k1: ...); ggml tiles them (v0 of every key head, then v1, ...), so value head h reads
// key head h % n_k. Output unit (v * n_k + g) takes source unit (g * r + v); a unit is one head.
IndexMap tiled_heads(int64_t n_k, int64_t r) {
  IndexMap m(n_k * r);
  for (int64_t v = 0; v < r; ++v)
    for (int64_t g = 0; g < n_k; ++g) m[v * n_k + g] = g * r + v;
  return m;
}

// Expands a map in units of `unit` elements to one per element, with `prefix` identity elements first.
IndexMap expand(const IndexMap& units, int64_t unit, int64_t prefix = 0) {
  if (units.empty()) return {};
  IndexMap m(prefix + (int64_t)units.size() * unit);
  for (int64_t i = 0; i < prefix; ++i) m[i] = i;
  for (size_t u = 0; u < units.size(); ++u)
    for (int64_t j = 0; j < unit; ++j) m[prefix + (int64_t)u * unit + j] = prefix + units[u] * unit + j;
  return m;
}

struct Owner {
  std::unique_ptr<st::Checkpoint> checkpoint;
  uint8_t* buffer = nullptr;
  ~Owner() { std::free(buffer); }
};

struct Rope {
  std::string type = "default";
  double theta = 10000.0, partial = 1.0, factor = 0.0;
  std::vector<int64_t> mrope;
};

class Converter {
 public:
  Converter(const std::string& dir, const OpenOptions& o) : dir_(dir), cfg_(Config::load(dir)), options_(o) {}

  std::unique_ptr<gguf::GGUFFile> run() {
    model_type_ = cfg_.get_string("model_type", "");
    if (const json* q = cfg_.find("quantization_config")) gptq_ = gptq::parse_config(*q, cfg_.path());
    if (model_type_ == "qwen3")
      arch_ = "qwen3";
    else if (model_type_ == "qwen3_moe")
      arch_ = "qwen3moe";
    else if (model_type_ == "qwen3_5" || model_type_ == "qwen3_5_text")
      arch_ = "qwen35";
    else if (model_type_ == "qwen3_5_moe" || model_type_ == "qwen3_5_moe_text")
      arch_ = "qwen35moe";
    else
      fail("{}: model_type '{}' is not supported (supported: qwen3, qwen3_moe, qwen3_5, qwen3_5_moe)",
           cfg_.path(), model_type_);
    ck_ = st::Checkpoint::open(dir_);
    find_prefix();
    common();
    if (arch_ == "qwen3" || arch_ == "qwen3moe")
      qwen3();
    else
      qwen35();
    report_unused();
    if (!add_tokenizer_metadata(dir_, n_vocab_, kv_))
      log::warn("{}: no tokenizer.json; the model loads but cannot tokenize text", dir_);
    return assemble();
  }

 private:
  // ---- config ----

  int64_t positive(const std::string& key, int64_t max = int64_t{1} << 24) {
    const int64_t v = cfg_.require_int(key);
    if (v <= 0 || v > max) fail("{}: {} = {} is not valid", cfg_.path(), key, v);
    return v;
  }
  // transformers writes some fields under another name (attribute_map): num_experts as num_local_experts.
  int64_t n_experts() {
    return positive(
        cfg_.has("num_experts") || !cfg_.has("num_local_experts") ? "num_experts" : "num_local_experts",
        4096);
  }
  void set_u32(const std::string& key, int64_t v) {
    kv_.emplace_back(arch_ + "." + key, Value::of_uint(ValueType::U32, (uint64_t)v));
  }
  void set_f32(const std::string& key, double v) {
    kv_.emplace_back(arch_ + "." + key, Value::of_float(ValueType::F32, v));
  }

  Rope read_rope() {
    Rope r;
    const json* p = cfg_.find("rope_parameters");
    std::string where = "rope_parameters";
    if (!p || !p->is_object()) {
      p = cfg_.find("rope_scaling");
      where = "rope_scaling";
    }
    if (p && !p->is_object()) fail("{}: {} must be an object", cfg_.path(), where);
    auto number = [&](const char* key, double def) {
      if (p && p->contains(key)) {
        if (!(*p)[key].is_number())
          fail("{}: {}.{} = {} is not a number", cfg_.path(), where, key, (*p)[key].dump());
        return (*p)[key].get<double>();
      }
      return cfg_.get_float(key, def);
    };
    r.theta = number("rope_theta", 10000.0);
    r.partial = number("partial_rotary_factor", 1.0);
    if (p) {
      const json type = p->contains("rope_type") ? (*p)["rope_type"] : p->value("type", json("default"));
      if (!type.is_string()) fail("{}: {}.rope_type must be a string", cfg_.path(), where);
      r.type = type.get<std::string>();
      if (r.type == "linear") r.factor = number("factor", 0.0);
      if (p->contains("mrope_section")) {
        const json& s = (*p)["mrope_section"];
        if (!s.is_array() || s.size() > 4)
          fail("{}: {}.mrope_section must be a list of at most 4 integers", cfg_.path(), where);
        for (const json& x : s) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0)
            fail("{}: {}.mrope_section must hold non-negative integers", cfg_.path(), where);
          r.mrope.push_back(x.get<int64_t>());
        }
      }
    }
    if (r.type != "default" && r.type != "linear")
      fail("{}: {}.rope_type = '{}' is not supported (default or linear)", cfg_.path(), where, r.type);
    if (!(r.theta > 0) || !std::isfinite(r.theta))
      fail("{}: rope_theta = {} is not valid", cfg_.path(), r.theta);
    if (!(r.partial > 0 && r.partial <= 1))
      fail("{}: partial_rotary_factor = {} is not valid (0 < f <= 1)", cfg_.path(), r.partial);
    return r;
  }

  // The keys every supported architecture shares; tensors common to all (embedding, final norm, output).
  void common() {
    const std::string& p = prefix_;
    const st::Tensor* emb = use(p + "embed_tokens.weight");
    if (!emb) fail("{}: tensor '{}embed_tokens.weight' is missing", dir_, p);
    if (emb->shape.size() != 2) fail("{}: tensor '{}' must be 2-D [vocab, hidden]", dir_, emb->name);
    n_vocab_ = emb->shape[0];
    E_ = positive("hidden_size", 1 << 20);
    if (emb->shape[1] != E_)
      fail("{}: tensor '{}' has {} columns, but hidden_size is {}", dir_, emb->name, emb->shape[1], E_);
    if (cfg_.has("vocab_size") && cfg_.require_int("vocab_size") != n_vocab_)
      log::warn("{}: vocab_size is {} but the embedding has {} rows; using the embedding", cfg_.path(),
                cfg_.require_int("vocab_size"), n_vocab_);
    n_layer_ = positive("num_hidden_layers", 4096);
    H_ = positive("num_attention_heads", 4096);
    KV_ = cfg_.has("num_key_value_heads") ? positive("num_key_value_heads", 4096) : H_;
    D_ = cfg_.has("head_dim") ? positive("head_dim", 4096) : E_ / H_;
    if (cfg_.get_string("hidden_act", "silu") != "silu") cfg_.refuse("hidden_act", "only \"silu\"");
    if (cfg_.get_bool("attention_bias", false)) cfg_.refuse("attention_bias", "false: no q/k/v/o biases");
    if (cfg_.get_bool("use_sliding_window", false)) cfg_.refuse("use_sliding_window", "false");
    rope_ = read_rope();

    std::string name = cfg_.get_string("_name_or_path", "");
    if (name.empty()) name = std::filesystem::path(dir_).filename().string();
    if (name.empty()) name = std::filesystem::path(dir_).parent_path().filename().string();
    kv_.emplace_back("general.architecture", Value::of_string(arch_));
    kv_.emplace_back("general.name", Value::of_string(name));
    set_u32("block_count", n_layer_);
    set_u32("context_length", cfg_.get_int("max_position_embeddings", 4096));
    set_u32("embedding_length", E_);
    if (cfg_.has("intermediate_size")) set_u32("feed_forward_length", positive("intermediate_size", 1 << 22));
    set_u32("attention.head_count", H_);
    set_u32("attention.head_count_kv", KV_);
    set_u32("attention.key_length", D_);
    set_u32("attention.value_length", D_);
    set_f32("attention.layer_norm_rms_epsilon", cfg_.get_float("rms_norm_eps", 1e-6));
    set_f32("rope.freq_base", rope_.theta);
    if (rope_.type == "linear") {
      kv_.emplace_back(arch_ + ".rope.scaling.type", Value::of_string("linear"));
      set_f32("rope.scaling.factor", rope_.factor);
    }

    c_.arch = arch_;
    c_.n_layer = n_layer_;
    c_.n_embd = E_;
    c_.n_vocab = n_vocab_;
    c_.n_head = H_;
    c_.n_head_kv = KV_;
    c_.head_dim = D_;
    convert(kIoTensors);
  }

  void qwen3() {
    const bool moe = arch_ == "qwen3moe";
    set_u32("rope.dimension_count", D_);
    int64_t X = 0, K = 0, F = 0;
    if (moe) {
      X = n_experts();
      K = positive("num_experts_per_tok", X);
      F = positive("moe_intermediate_size", 1 << 20);
      // xpert's qwen3moe (like llama.cpp's) always renormalizes the top-k weights.
      if (!cfg_.get_bool("norm_topk_prob", false)) cfg_.refuse("norm_topk_prob", "true");
      if (cfg_.get_int("decoder_sparse_step", 1) != 1)
        cfg_.refuse("decoder_sparse_step", "1: every layer MoE");
      if (const json* m = cfg_.find("mlp_only_layers"); m && !(m->is_array() && m->empty()))
        cfg_.refuse("mlp_only_layers", "an empty list");
      set_u32("expert_count", X);
      set_u32("expert_used_count", K);
      set_u32("expert_feed_forward_length", F);
      c_.n_expert = X;
      c_.n_ff_exp = F;
    } else {
      c_.n_ff = positive("intermediate_size", 1 << 22);
    }
    for (int64_t i = 0; i < n_layer_; ++i) convert(i);
  }

  void qwen35() {
    const bool moe = arch_ == "qwen35moe";
    const int64_t n_rot = (int64_t)(D_ * rope_.partial);
    set_u32("rope.dimension_count", n_rot);
    // Without mrope_section (a text-only config) transformers runs plain RoPE over n_rot dims. Text
    // positions rotate every t/h/w section alike, so sections that interleave all n_rot/2 pairs over t, h
    // and w are exactly that ({11, 11, 10} for 64 rotary dims, llama.cpp's default).
    const int32_t pairs = (int32_t)(n_rot / 2);
    std::vector<int32_t> sections = {(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0};
    if (!rope_.mrope.empty()) {
      sections.assign(4, 0);
      for (size_t i = 0; i < rope_.mrope.size(); ++i) sections[i] = (int32_t)rope_.mrope[i];
    }
    kv_.emplace_back(arch_ + ".rope.dimension_sections",
                     Value::of_numbers(ValueType::I32, sections.data(), sections.size()));

    // Gated DeltaNet sizes.
    const int64_t d_conv = positive("linear_conv_kernel_dim", 64),
                  Hk = positive("linear_num_key_heads", 4096), Hv = positive("linear_num_value_heads", 4096),
                  dk = positive("linear_key_head_dim", 4096), dv = positive("linear_value_head_dim", 4096);
    if (Hv % Hk)
      fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", cfg_.path(), Hv, Hk);
    set_u32("ssm.conv_kernel", d_conv);
    set_u32("ssm.state_size", dk);
    set_u32("ssm.group_count", Hk);
    set_u32("ssm.time_step_rank", Hv);
    set_u32("ssm.inner_size", dv * Hv);

    c_.ssm_d_conv = d_conv;
    c_.ssm_d_state = dk;
    c_.ssm_n_group = Hk;
    c_.ssm_dt_rank = Hv;
    c_.ssm_d_inner = dv * Hv;

    std::vector<uint8_t> recurrent(n_layer_);
    const json* types = cfg_.find("layer_types");
    const int64_t interval = cfg_.get_int("full_attention_interval", 4);
    if (interval <= 0) cfg_.refuse("full_attention_interval", "a positive integer");
    for (int64_t i = 0; i < n_layer_; ++i) {
      if (!types) {
        recurrent[i] = (i + 1) % interval != 0;
        continue;
      }
      if (!types->is_array() || (int64_t)types->size() != n_layer_)
        fail("{}: layer_types must list num_hidden_layers = {} entries", cfg_.path(), n_layer_);
      const json& t = (*types)[i];
      if (t == "linear_attention")
        recurrent[i] = 1;
      else if (t != "full_attention")
        fail("{}: layer_types[{}] = {} is not supported (linear_attention or full_attention)", cfg_.path(), i,
             t.dump());
    }
    set_u32("full_attention_interval", interval);
    kv_.emplace_back(arch_ + ".attention.recurrent_layers",
                     Value::of_numbers(ValueType::BOOL, recurrent.data(), recurrent.size()));

    int64_t X = 0, F = 0, Fs = 0;
    if (moe) {
      X = n_experts();
      F = positive("moe_intermediate_size", 1 << 20);
      Fs = cfg_.get_int("shared_expert_intermediate_size", 0);
      if (Fs < 0) cfg_.refuse("shared_expert_intermediate_size", "a non-negative integer");
      set_u32("expert_count", X);
      set_u32("expert_used_count", positive("num_experts_per_tok", X));
      set_u32("expert_feed_forward_length", F);
      set_u32("expert_shared_feed_forward_length", Fs);
      c_.n_expert = X;
      c_.n_ff_exp = F;
      c_.n_ff_shexp = Fs;
    } else {
      c_.n_ff = positive("intermediate_size", 1 << 22);
    }

    c_.layer_recurrent.assign(recurrent.begin(), recurrent.end());
    const int64_t key_dim = Hk * dk;
    dv_ = dv;
    heads_ = Hk == Hv ? IndexMap{} : tiled_heads(Hk, Hv / Hk);
    v_rows_ = expand(heads_, dv);                 // value_dim rows (z), columns (out)
    qkv_rows_ = expand(heads_, dv, 2 * key_dim);  // conv_dim rows: q | k | v
    for (int64_t i = 0; i < n_layer_; ++i) convert(i);
  }

  // Plans layer il's tensors (or the io tensors) as the architecture's table describes them.
  void convert(int64_t il) {
    for (const TensorDecl& d : tensor_table(arch_)(c_, il)) {
      const std::string name = layer_tensor_name(il, d.name), hf = hf_name(il, d.hf.name);
      if (d.io_field == &ModelWeights::output) {  // absent when tied to the embedding
        const bool there = use(hf + ".weight") || ck_->find(hf + ".qweight");
        if (cfg_.get_bool("tie_word_embeddings", false)) continue;
        if (!there) fail("{}: tensor '{}.weight' is missing and tie_word_embeddings is false", dir_, hf);
      }
      switch (d.hf.form) {
        case HfForm::linear:
          if (d.hf.heads == HfHeads::v_cols)
            add_matrix(name, linear(hf, d.shape[1], d.shape[0]), {}, heads_, dv_);
          else
            add_matrix(name, linear(hf, d.shape[1], d.shape[0]), head_map(d.hf.heads));
          break;
        case HfForm::vector:
          add_vector(name, hf, d.shape[0], element_fn(d.hf.fn), head_map(d.hf.heads));
          break;
        case HfForm::conv1d:
          add_conv1d(name, hf, d.shape[1], d.shape[0], head_map(d.hf.heads));
          break;
        case HfForm::experts:
          add_experts(name, experts(hf_name(il, "mlp.experts."), d.hf.name, d.shape));
          break;
        case HfForm::none:
          fail("{}: xpert cannot convert tensor '{}' of {} from a checkpoint", dir_, name, arch_);
      }
    }
  }

  // A table's HF name: layer tensors are relative to the layer, "model." is the text model's prefix.
  std::string hf_name(int64_t il, std::string_view name) const {
    if (il != kIoTensors) return fmt::format("{}layers.{}.{}", prefix_, il, name);
    return name.starts_with("model.") ? prefix_ + std::string(name.substr(6)) : std::string(name);
  }

  const IndexMap& head_map(HfHeads h) const {
    static const IndexMap identity;
    switch (h) {
      case HfHeads::rows:
        return heads_;
      case HfHeads::v_rows:
        return v_rows_;
      case HfHeads::qkv_rows:
        return qkv_rows_;
      default:
        return identity;
    }
  }

  static float (*element_fn(HfFn fn))(float) {
    switch (fn) {
      case HfFn::plus_one:
        return plus_one;
      case HfFn::minus_exp:
        return minus_exp;
      default:
        return nullptr;
    }
  }

  // Routed experts, per expert (pe<e>.<proj>, as checkpoints and transformers' save_pretrained store
  // them) or fused (pe gate_up_proj [X, 2F, E] gate first, down_proj [X, E, F], transformers' in-memory
  // layout). shape: the GGUF tensor's {cols, rows, X}.
  std::vector<Matrix> experts(const std::string& pe, const std::string& proj,
                              const std::vector<int64_t>& shape) {
    const int64_t cols = shape[0], rows = shape[1], X = shape[2];
    std::vector<Matrix> ms;
    if (const st::Tensor* fused_gu = use_any({pe + "gate_up_proj", pe + "gate_up_proj.weight"})) {
      const st::Tensor* fused_d = use_any({pe + "down_proj", pe + "down_proj.weight"});
      if (!fused_d) fail("{}: tensor '{}gate_up_proj' is there but '{}down_proj' is missing", dir_, pe, pe);
      const bool down = proj == "down_proj";
      const int64_t F = down ? cols : rows;
      check_shape(*fused_gu, {X, 2 * F, E_});
      check_shape(*fused_d, {X, E_, F});
      for (int64_t e = 0; e < X; ++e)
        ms.push_back(down ? slice(*fused_d, e, 0, E_, F)
                          : slice(*fused_gu, e, proj == "up_proj" ? F : 0, F, E_));
    } else {
      for (int64_t e = 0; e < X; ++e) ms.push_back(linear(fmt::format("{}{}.{}", pe, e, proj), rows, cols));
    }
    return ms;
  }

  // ---- tensors ----

  void find_prefix() {
    for (const char* p : {"model.language_model.", "model."}) {
      if (ck_->find(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        return;
      }
    }
    fail(
        "{}: no 'model.embed_tokens.weight' (or 'model.language_model.embed_tokens.weight') in the "
        "checkpoint",
        dir_);
  }

  const st::Tensor* use(const std::string& name) {
    const st::Tensor* t = ck_->find(name);
    if (t) used_.insert(name);
    return t;
  }
  const st::Tensor* use_any(std::initializer_list<std::string> names) {
    for (const std::string& n : names)
      if (const st::Tensor* t = use(n)) return t;
    return nullptr;
  }

  void check_shape(const st::Tensor& t, const std::vector<int64_t>& want) const {
    if (t.shape != want)
      fail("{}: tensor '{}' has shape [{}], expected [{}]", dir_, t.name, fmt::join(t.shape, ", "),
           fmt::join(want, ", "));
  }

  Matrix float_matrix(const st::Tensor& t, int64_t rows, int64_t cols) {
    check_shape(t, {rows, cols});
    float_type(t, dir_);
    Matrix m;
    m.name = t.name;
    m.w = &t;
    m.rows = rows;
    m.cols = cols;
    return m;
  }

  Matrix slice(const st::Tensor& t, int64_t index, int64_t row0, int64_t rows, int64_t cols) {
    float_type(t, dir_);
    Matrix m;
    m.name = fmt::format("{}[{}]", t.name, index);
    m.w = &t;
    m.index = index;
    m.row0 = row0;
    m.rows = rows;
    m.cols = cols;
    return m;
  }

  // The module `prefix` as a [rows][cols] matrix: prefix.weight (float) or prefix.qweight + scales (GPTQ).
  Matrix linear(const std::string& prefix, int64_t rows, int64_t cols) {
    if (ck_->find(prefix + ".bias"))
      fail("{}: tensor '{}.bias': biases are not supported for this architecture", dir_, prefix);
    if (const st::Tensor* w = use(prefix + ".weight")) {
      Matrix m = float_matrix(*w, rows, cols);
      m.name = prefix;
      return m;
    }
    const st::Tensor* qw = use(prefix + ".qweight");
    if (!qw) fail("{}: tensor '{}.weight' is missing", dir_, prefix);
    if (!gptq_)
      fail("{}: tensor '{}.qweight' is GPTQ-quantized, but config.json has no quantization_config", dir_,
           prefix);
    const int64_t group = gptq_->group_size == -1 ? cols : gptq_->group_size;
    if (cols % group != 0 || cols % 32 != 0)
      fail(
          "{}: '{}' has {} inputs, which group size {} does not divide (GPTQ needs it to, and a multiple of "
          "32)",
          dir_, prefix, cols, group);
    auto need = [&](const st::Tensor* t, const char* suffix, st::DType type, std::vector<int64_t> shape) {
      if (!t) fail("{}: tensor '{}.{}' is missing (GPTQ layer '{}')", dir_, prefix, suffix, prefix);
      if (t->dtype != type)
        fail("{}: tensor '{}' has dtype {}, expected {}", dir_, t->name, st::dtype_name(t->dtype),
             st::dtype_name(type));
      check_shape(*t, shape);
    };
    need(qw, "qweight", st::DType::I32, {cols / 8, rows});
    const st::Tensor* scales = use(prefix + ".scales");
    need(scales, "scales", st::DType::F16, {cols / group, rows});
    const st::Tensor* z = use(prefix + ".qzeros");
    if (z) {
      if (rows % 8) fail("{}: tensor '{}' cannot pack {} outputs in 8s", dir_, z->name, rows);
      need(z, "qzeros", st::DType::I32, {cols / group, rows / 8});
      if (gptq_->sym) gptq::check_qzeros(z->data, cols / group, rows, gptq_->zero_offset, z->name);
    } else if (!gptq_->sym) {
      fail("{}: tensor '{}.qzeros' is missing (asymmetric GPTQ layer '{}', sym = false)", dir_, prefix, prefix);
    }
    if (const st::Tensor* gi = use(prefix + ".g_idx")) {
      need(gi, "g_idx", st::DType::I32, {cols});
      gptq::check_g_idx(gi->data, cols, group, gi->name);
    }
    Matrix m;
    m.name = prefix;
    m.q = {.qweight = qw->data,
           .scales = scales->data,
           .qzeros = gptq_->sym ? nullptr : z->data,
           .k = cols,
           .n = rows,
           .group = group,
           .zero_offset = gptq_->zero_offset};
    m.rows = rows;
    m.cols = cols;
    return m;
  }

  // GPTQ: Q4_0 holds a symmetric layer exactly; an asymmetric one (outside the native expert path)
  // becomes F32, also exactly.
  DType out_type(const Matrix& m) const {
    if (!m.is_gptq()) return float_type(*m.w, dir_);
    return m.q.qzeros ? DType::F32 : DType::Q4_0;
  }
  size_t matrix_bytes(const Matrix& m) const { return row_bytes(out_type(m), m.cols) * (size_t)m.rows; }

  // W's rows row_map[r] (all when empty), columns in units of `col_unit` from col_map (identity when empty).
  static void write_matrix(const Matrix& m, const IndexMap& row_map, const IndexMap& col_map,
                           int64_t col_unit, uint8_t* dst) {
    if (m.is_gptq() && m.q.qzeros) {
      std::vector<float> w((size_t)(m.rows * m.cols));
      gptq::dequantize_reference(m.q, w.data());
      float* out = reinterpret_cast<float*>(dst);
      for (int64_t r = 0; r < (row_map.empty() ? m.rows : (int64_t)row_map.size()); ++r) {
        const float* src = w.data() + (row_map.empty() ? r : row_map[r]) * m.cols;
        if (col_map.empty()) {
          std::memcpy(out + r * m.cols, src, (size_t)m.cols * 4);
          continue;
        }
        for (size_t u = 0; u < col_map.size(); ++u)
          std::memcpy(out + r * m.cols + (int64_t)u * col_unit, src + col_map[u] * col_unit, (size_t)col_unit * 4);
      }
      return;
    }
    if (m.is_gptq()) {
      IndexMap blocks;
      for (int64_t u : col_map)
        for (int64_t j = 0; j < col_unit / 32; ++j) blocks.push_back(u * (col_unit / 32) + j);
      gptq::repack_q4_0(m.q, row_map, blocks, dst);
      return;
    }
    const size_t es = st::dtype_size(m.w->dtype), row = (size_t)m.cols * es;
    const int64_t tensor_rows = m.w->shape[m.w->shape.size() - 2];
    const uint8_t* base = m.w->data + ((size_t)(m.index * tensor_rows + m.row0)) * row;
    for (int64_t r = 0; r < m.rows; ++r) {
      const uint8_t* src = base + (size_t)(row_map.empty() ? r : row_map[r]) * row;
      uint8_t* out = dst + (size_t)r * row;
      if (col_map.empty()) {
        std::memcpy(out, src, row);
        continue;
      }
      const size_t unit = (size_t)col_unit * es;
      for (size_t u = 0; u < col_map.size(); ++u)
        std::memcpy(out + u * unit, src + (size_t)col_map[u] * unit, unit);
    }
  }

  // A float tensor used whole and unchanged is read in place, if its data is aligned for its type.
  static bool in_place(const st::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data) % st::dtype_size(t.dtype) == 0;
  }

  void add_matrix(const std::string& name, Matrix m, IndexMap row_map = {}, IndexMap col_map = {},
                  int64_t col_unit = 1) {
    if (m.is_gptq() && !col_map.empty() && col_unit % 32 != 0)
      fail("{}: GPTQ layer '{}' would need its inputs permuted in runs of {}, not a multiple of 32", dir_,
           m.name, col_unit);
    Planned p;
    p.info.name = name;
    p.info.type = out_type(m);
    p.info.shape = {m.cols, m.rows};
    p.info.n_bytes = matrix_bytes(m);
    if (!m.is_gptq() && row_map.empty() && col_map.empty() && m.w->shape.size() == 2 && in_place(*m.w)) {
      p.direct = m.w->data;
    } else {
      p.fill = [m, row_map = std::move(row_map), col_map = std::move(col_map), col_unit](uint8_t* dst) {
        write_matrix(m, row_map, col_map, col_unit, dst);
      };
    }
    plan_.push_back(std::move(p));
  }

  void add_experts(const std::string& name, std::vector<Matrix> ms) {
    const Matrix& m0 = ms[0];
    for (const Matrix& m : ms) {
      if (m.is_gptq() != m0.is_gptq() || out_type(m) != out_type(m0))
        fail(
            "{}: experts '{}' and '{}' are stored differently ({} vs {}); all experts of a layer must share "
            "a format",
            dir_, m0.name, m.name, dtype_name(out_type(m0)), dtype_name(out_type(m)));
    }
    // GPTQ experts natively (options_.native_gptq_experts): each expert's tensors as stored.
    const DType native = m0.is_gptq() ? gptq::native_type(m0.q.group, m0.q.qzeros != nullptr) : DType::F32;
    if (m0.is_gptq() && m0.q.qzeros && (!options_.native_gptq_experts || native == DType::F32))
      fail(
          "{}: expert '{}' is asymmetric GPTQ (sym = false), which xpert reads only natively, with every "
          "expert on the CPU or an OpenCL expert device (group size 32, 64 or 128; --device cpu or -ngl 0)",
          dir_, m0.name);
    if (m0.is_gptq() && options_.native_gptq_experts && native != DType::F32) {
      const size_t one = row_bytes(native, m0.cols) * (size_t)m0.rows;
      Planned p;
      p.info.name = name;
      p.info.type = native;
      p.info.shape = {m0.cols, m0.rows, (int64_t)ms.size()};
      p.info.n_bytes = one * ms.size();
      p.fill = [ms = std::move(ms), one, native](uint8_t* dst) {
        for (size_t e = 0; e < ms.size(); ++e) gptq::write_native(ms[e].q, native, dst + e * one);
      };
      plan_.push_back(std::move(p));
      return;
    }
    const size_t one = matrix_bytes(m0);
    Planned p;
    p.info.name = name;
    p.info.type = out_type(m0);
    p.info.shape = {m0.cols, m0.rows, (int64_t)ms.size()};
    p.info.n_bytes = one * ms.size();
    // A fused [X, rows, cols] tensor taken whole (down_proj) is already the 3-D layout.
    bool whole = !m0.is_gptq() && m0.w->shape.size() == 3 && m0.w->shape[0] == (int64_t)ms.size() &&
                 m0.w->shape[1] == m0.rows && in_place(*m0.w);
    for (size_t e = 0; e < ms.size() && whole; ++e)
      whole = ms[e].w == m0.w && ms[e].index == (int64_t)e && ms[e].row0 == 0;
    if (whole) {
      p.direct = m0.w->data;
    } else {
      p.fill = [ms = std::move(ms), one](uint8_t* dst) {
        for (size_t e = 0; e < ms.size(); ++e) write_matrix(ms[e], {}, {}, 1, dst + e * one);
      };
    }
    plan_.push_back(std::move(p));
  }

  static float plus_one(float x) { return 1.0f + x; }
  static float minus_exp(float x) { return -std::exp(x); }

  // A vector of n floats (HF [n] or [1, n]) as F32, each element through fn, permuted by `map`.
  void add_vector(const std::string& name, const std::string& hf, int64_t n, float (*fn)(float) = nullptr,
                  IndexMap map = {}) {
    const st::Tensor* t = use(hf);
    if (!t) fail("{}: tensor '{}' is missing", dir_, hf);
    if (t->n_elements() != n || t->shape.empty() || t->shape.back() != n)
      fail("{}: tensor '{}' has shape [{}], expected [{}]", dir_, hf, fmt::join(t->shape, ", "), n);
    float_type(*t, dir_);
    Planned p;
    p.info.name = name;
    p.info.type = DType::F32;
    p.info.shape = {n};
    p.info.n_bytes = (size_t)n * 4;
    if (t->dtype == st::DType::F32 && !fn && map.empty() && in_place(*t)) {
      p.direct = t->data;
    } else {
      p.fill = [t, n, fn, map = std::move(map)](uint8_t* dst) {
        float* out = reinterpret_cast<float*>(dst);
        for (int64_t i = 0; i < n; ++i) {
          const float x = load_float(*t, map.empty() ? i : map[i]);
          out[i] = fn ? fn(x) : x;
        }
      };
    }
    plan_.push_back(std::move(p));
  }

  // conv1d.weight [C, 1, K] -> F32 {K, C}, channels permuted by `rows`.
  void add_conv1d(const std::string& name, const std::string& hf, int64_t C, int64_t K, IndexMap rows) {
    const st::Tensor* t = use(hf);
    if (!t) fail("{}: tensor '{}' is missing", dir_, hf);
    if (t->shape != std::vector<int64_t>{C, 1, K} && t->shape != std::vector<int64_t>{C, K})
      fail("{}: tensor '{}' has shape [{}], expected [{}, 1, {}]", dir_, hf, fmt::join(t->shape, ", "), C, K);
    float_type(*t, dir_);
    Planned p;
    p.info.name = name;
    p.info.type = DType::F32;
    p.info.shape = {K, C};
    p.info.n_bytes = (size_t)(C * K) * 4;
    p.fill = [t, C, K, rows = std::move(rows)](uint8_t* dst) {
      float* out = reinterpret_cast<float*>(dst);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < K; ++j) out[c * K + j] = load_float(*t, (rows.empty() ? c : rows[c]) * K + j);
    };
    plan_.push_back(std::move(p));
  }

  void report_unused() const {
    std::vector<std::string> unused;
    for (const st::Tensor* t : ck_->tensors()) {
      const std::string& n = t->name;
      if (used_.count(n)) continue;
      // Parts of a checkpoint that a text model does not run: the vision tower, multi-token prediction.
      if (n.rfind("mtp.", 0) == 0 || n.rfind("model.mtp.", 0) == 0 || n.rfind("model.visual.", 0) == 0 ||
          n.rfind("visual.", 0) == 0)
        continue;
      unused.push_back(n);
    }
    if (!unused.empty())
      log::warn("{}: {} tensors of the checkpoint are not used, e.g. '{}'", dir_, unused.size(), unused[0]);
  }

  // ---- the result ----

  std::unique_ptr<gguf::GGUFFile> assemble() {
    constexpr size_t kAlign = 64;
    size_t total = 0;
    std::vector<size_t> offsets(plan_.size());
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (plan_[i].direct) continue;
      offsets[i] = total;
      total += (plan_[i].info.n_bytes + kAlign - 1) / kAlign * kAlign;
    }
    auto owner = std::make_shared<Owner>();
    if (total > 0) {
      owner->buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, total));
      if (!owner->buffer)
        fail("{}: cannot allocate {:.1f} MiB for the repacked weights", dir_, total / 1048576.0);
    }
    // Repacking is independent per tensor: threads take tensors from a shared counter.
    std::atomic<size_t> next{0};
    ThreadPool pool(std::max(1, std::min<int>(ThreadPool::default_threads(), (int)plan_.size())));
    pool.run([&](int, int) {
      for (size_t i; (i = next.fetch_add(1)) < plan_.size();)
        if (!plan_[i].direct) plan_[i].fill(owner->buffer + offsets[i]);
    });
    std::vector<gguf::TensorInfo> tensors;
    tensors.reserve(plan_.size());
    for (size_t i = 0; i < plan_.size(); ++i) {
      gguf::TensorInfo t = std::move(plan_[i].info);
      t.data = plan_[i].direct ? plan_[i].direct : owner->buffer + offsets[i];
      tensors.push_back(std::move(t));
    }
    log::debug("{}: {} tensors, {:.1f} MiB repacked into the owned buffer", dir_, tensors.size(),
               total / 1048576.0);
    owner->checkpoint = std::move(ck_);
    return gguf::GGUFFile::assemble(dir_, std::move(kv_), std::move(tensors), std::move(owner));
  }

  std::string dir_;
  Config cfg_;
  std::string model_type_, arch_, prefix_;
  std::optional<gptq::Config> gptq_;
  OpenOptions options_;
  std::unique_ptr<st::Checkpoint> ck_;
  std::set<std::string> used_;
  Metadata kv_;
  std::vector<Planned> plan_;
  Rope rope_;
  int64_t n_vocab_ = 0, n_layer_ = 0, E_ = 0, H_ = 0, KV_ = 0, D_ = 0;
  ModelConfig c_;  // what the tensor table needs
  // Qwen3.5's value-head order (HfHeads), empty when there are as many key heads as value heads.
  IndexMap heads_, v_rows_, qkv_rows_;
  int64_t dv_ = 0;
};

}  // namespace

std::unique_ptr<gguf::GGUFFile> open_folder(const std::string& dir, const OpenOptions& options) {
  return Converter(dir, options).run();
}

void save_gguf(const gguf::GGUFFile& f, const std::string& path) {
  gguf::GGUFWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : f.tensors()) w.add_tensor(t.name, t.type, t.shape, t.data, t.n_bytes);
  w.write(path);
}

}  // namespace xpert::hf
