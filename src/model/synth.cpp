// The synthetic-model writer. The GGUF is streamed: header, metadata and tensor index first (every
// offset is known from the shapes), then each tensor's bytes as they are generated.
//
// Speed does not depend on weight values, and quantizing 16 GiB of floats would take long, so each
// (type, row length) gets one pool of 4096 rows quantized from N(0, 1/sqrt(row length)) floats, and a
// tensor's rows are drawn from it in a tensor-specific order (row r -> pool[(a r + b) mod 4096], a odd):
// the rows of a tensor of at most 4096 rows are all distinct, and no two tensors are alike.
#include "model/synth.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <utility>

#include "base/error.h"
#include "format/gguf.h"
#include "model/loader.h"
#include "quant/quant.h"

namespace xpert {

const std::vector<SynthPreset>& synth_presets() {
  // clang-format off
  static const std::vector<SynthPreset> presets = {
      {.name = "qwen3-30b-a3b", .arch = "qwen3moe", .description = "Qwen3-30B-A3B shapes (48 layers, 128 experts, top-8)",
       .n_layer = 48, .n_expert = 128, .n_expert_used = 8, .n_embd = 2048, .n_ff = 6144, .n_ff_exp = 768,
       .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_vocab = 151936, .n_ctx = 40960},
      {.name = "qwen3moe-1.3b", .arch = "qwen3moe", .description = "the CPU anchor (12 layers, 64 experts, top-8)",
       .n_layer = 12, .n_expert = 64, .n_expert_used = 8, .n_embd = 1024, .n_ff = 3072, .n_ff_exp = 512,
       .n_head = 16, .n_head_kv = 4, .head_dim = 64, .n_vocab = 32000, .n_ctx = 40960},
      {.name = "tiny-qwen3moe", .arch = "qwen3moe", .description = "for tests (2 layers, 8 experts, top-2, K-quant-sized rows)",
       .n_layer = 2, .n_expert = 8, .n_expert_used = 2, .n_embd = 256, .n_ff = 512, .n_ff_exp = 256,
       .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_vocab = 512, .n_ctx = 2048},
      {.name = "tiny-qwen3moe-hd128", .arch = "qwen3moe", .description = "for tests (tiny-qwen3moe with Qwen3-30B-A3B's head_dim 128)",
       .n_layer = 2, .n_expert = 8, .n_expert_used = 2, .n_embd = 256, .n_ff = 512, .n_ff_exp = 256,
       .n_head = 4, .n_head_kv = 2, .head_dim = 128, .n_vocab = 512, .n_ctx = 2048},
      {.name = "tiny-qwen3moe-2048", .arch = "qwen3moe", .description = "for tests (tiny-qwen3moe with Qwen3-30B-A3B's n_embd 2048)",
       .n_layer = 2, .n_expert = 8, .n_expert_used = 2, .n_embd = 2048, .n_ff = 512, .n_ff_exp = 256,
       .n_head = 16, .n_head_kv = 4, .head_dim = 128, .n_vocab = 512, .n_ctx = 2048},
      {.name = "tiny-qwen3moe-gqa8", .arch = "qwen3moe", .description = "for tests (tiny-qwen3moe with Qwen3-30B-A3B's attention: 32 / 4 heads of 128, n_embd 2048)",
       .n_layer = 2, .n_expert = 8, .n_expert_used = 2, .n_embd = 2048, .n_ff = 512, .n_ff_exp = 256,
       .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_vocab = 512, .n_ctx = 2048},
      {.name = "tiny-qwen3moe-64", .arch = "qwen3moe", .description = "for tests (n_embd 64: K-quants fall back to Q5_0/Q8_0)",
       .n_layer = 2, .n_expert = 8, .n_expert_used = 2, .n_embd = 64, .n_ff = 128, .n_ff_exp = 32,
       .n_head = 4, .n_head_kv = 2, .head_dim = 16, .n_vocab = 384, .n_ctx = 2048},
      // Qwen3.5-35B-A3B's text model (config.json: text_config), as llama.cpp's converter writes it; the
      // MTP layer is left out, as older converters did. Qwen3.6-35B-A3B has the same shapes.
      {.name = "qwen3.5-35b-a3b", .arch = "qwen35moe",
       .description = "Qwen3.5/3.6-35B-A3B shapes (40 layers: 30 Gated DeltaNet + 10 attention, 256 experts, top-8)",
       .n_layer = 40, .n_expert = 256, .n_expert_used = 8, .n_embd = 2048, .n_ff = 0, .n_ff_exp = 512,
       .n_head = 16, .n_head_kv = 2, .head_dim = 256, .n_vocab = 248320, .n_ctx = 262144, .rope_base = 1e7f,
       .rms_eps = 1e-6f, .n_rot = 64, .full_attention_interval = 4, .n_ff_shexp = 512,
       .rope_sections = {11, 11, 10, 0}, .ssm_d_conv = 4, .ssm_n_k_heads = 16, .ssm_n_v_heads = 32,
       .ssm_head_dim = 128},
      {.name = "tiny-qwen35moe", .arch = "qwen35moe",
       .description = "for tests (4 layers: 3 Gated DeltaNet + 1 attention, 16 experts, top-4, shared expert)",
       .n_layer = 4, .n_expert = 16, .n_expert_used = 4, .n_embd = 256, .n_ff = 0, .n_ff_exp = 256,
       .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_vocab = 512, .n_ctx = 2048, .rope_base = 1e7f,
       .rms_eps = 1e-6f, .n_rot = 16, .full_attention_interval = 4, .n_ff_shexp = 256,
       .rope_sections = {3, 3, 2, 0}, .ssm_d_conv = 4, .ssm_n_k_heads = 2, .ssm_n_v_heads = 4,
       .ssm_head_dim = 128},
      {.name = "tiny-qwen35moe-2048", .arch = "qwen35moe",
       .description = "for tests (tiny-qwen35moe with Qwen3.5-35B-A3B's n_embd 2048)",
       .n_layer = 4, .n_expert = 16, .n_expert_used = 4, .n_embd = 2048, .n_ff = 0, .n_ff_exp = 256,
       .n_head = 4, .n_head_kv = 2, .head_dim = 256, .n_vocab = 512, .n_ctx = 2048, .rope_base = 1e7f,
       .rms_eps = 1e-6f, .n_rot = 64, .full_attention_interval = 4, .n_ff_shexp = 256,
       .rope_sections = {11, 11, 10, 0}, .ssm_d_conv = 4, .ssm_n_k_heads = 2, .ssm_n_v_heads = 4,
       .ssm_head_dim = 128},
      {.name = "tiny-qwen35", .arch = "qwen35",
       .description = "for tests (dense hybrid: 4 layers, 3 Gated DeltaNet + 1 attention, SwiGLU 512)",
       .n_layer = 4, .n_expert = 0, .n_expert_used = 0, .n_embd = 256, .n_ff = 512, .n_ff_exp = 0,
       .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_vocab = 512, .n_ctx = 2048, .rope_base = 1e7f,
       .rms_eps = 1e-6f, .n_rot = 16, .full_attention_interval = 4, .n_ff_shexp = 0,
       .rope_sections = {3, 3, 2, 0}, .ssm_d_conv = 4, .ssm_n_k_heads = 2, .ssm_n_v_heads = 4,
       .ssm_head_dim = 128},
      // Long-context tests (issue #10): one Gated DeltaNet + one attention layer of a single 32-dim head,
      // so 32K positions of one-shot prefill cost seconds on two cores.
      {.name = "tiny-qwen35-long", .arch = "qwen35",
       .description = "for tests (2 layers: 1 Gated DeltaNet + 1 attention of one head, trained context 40960)",
       .n_layer = 2, .n_expert = 0, .n_expert_used = 0, .n_embd = 64, .n_ff = 128, .n_ff_exp = 0,
       .n_head = 1, .n_head_kv = 1, .head_dim = 32, .n_vocab = 512, .n_ctx = 40960, .rope_base = 1e7f,
       .rms_eps = 1e-6f, .n_rot = 16, .full_attention_interval = 2, .n_ff_shexp = 0,
       .rope_sections = {3, 3, 2, 0}, .ssm_d_conv = 4, .ssm_n_k_heads = 1, .ssm_n_v_heads = 1,
       .ssm_head_dim = 32},
  };
  // clang-format on
  return presets;
}

const SynthPreset& synth_preset(const std::string& name) {
  std::vector<std::string> names;
  for (const SynthPreset& p : synth_presets()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  fail("unknown preset '{}' (known: {})", name, fmt::join(names, ", "));
}

std::vector<std::string> synth_types() { return {"Q4_K_M", "Q8_0", "F16", "BF16", "F32"}; }

namespace {

constexpr size_t kAlignment = gguf::kDefaultAlignment;
constexpr int64_t kPoolRows = 4096;  // a power of two: row r -> (a r + b) mod kPoolRows is a bijection for odd a

// The types of one `--type`: most matrices, those llama.cpp gives more bits in some layers, the output
// projection, and llama.cpp's file_type number.
struct TypeMix {
  DType linear, more_bits, output;
  uint32_t file_type;
};

TypeMix type_mix(const std::string& type) {
  if (type == "Q4_K_M") return {DType::Q4_K, DType::Q6_K, DType::Q6_K, 15};
  if (type == "Q8_0") return {DType::Q8_0, DType::Q8_0, DType::Q8_0, 7};
  if (type == "F16") return {DType::F16, DType::F16, DType::F16, 1};
  if (type == "BF16") return {DType::BF16, DType::BF16, DType::BF16, 32};
  if (type == "F32") return {DType::F32, DType::F32, DType::F32, 0};
  fail("unknown --type '{}' (known: {})", type, fmt::join(synth_types(), ", "));
}

// llama.cpp's quantizer (llama-quant.cpp) gives Q4_K_M's "attn_v-like" tensors (attn_v, and attn_qkv,
// which for Qwen3.5 is the Gated DeltaNet input projection) and every ffn_down (routed and shared) Q6_K
// in the first and last eighth of the layers and in every third layer between (SynthFill::more_bits);
// the rest is Q4_K. Both count layers in order here, since each layer has exactly one attn_v-like
// tensor. (Its extra rules for 8-expert models are not mirrored: no preset that uses these rules has 8
// experts.)
bool use_more_bits(int64_t il, int64_t n_layer) {
  return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

// A row length the type's blocks do not divide falls back as llama.cpp's quantizer does.
DType fit_type(DType want, int64_t row_len) {
  if (row_len % dtype_info(want).block_size == 0) return want;
  if (want == DType::Q4_K && row_len % 32 == 0) return DType::Q5_0;
  if (want == DType::Q6_K && row_len % 32 == 0) return DType::Q8_0;
  return DType::F16;
}

struct TensorSpec {
  std::string name;
  DType type;
  std::vector<int64_t> shape;  // ggml order
  SynthFill fill;              // matrices: rows from a RowPool; the others F32
  uint64_t offset = 0;
  int64_t rows() const {
    int64_t r = 1;
    for (size_t d = 1; d < shape.size(); ++d) r *= shape[d];
    return r;
  }
  size_t row_size() const { return row_bytes(type, shape[0]); }
  size_t bytes() const { return row_size() * (size_t)rows(); }
  bool pooled() const {
    return fill == SynthFill::matrix || fill == SynthFill::more_bits || fill == SynthFill::output;
  }
};

bool is_hybrid(const SynthPreset& p) { return p.arch == "qwen35" || p.arch == "qwen35moe"; }

// The config the loader reads from the file metadata() writes.
ModelConfig model_config(const SynthPreset& p) {
  ModelConfig c;
  c.arch = p.arch;
  c.n_layer = p.n_layer;
  c.n_embd = p.n_embd;
  c.n_ff = p.n_ff;
  c.n_vocab = p.n_vocab;
  c.n_head = p.n_head;
  c.n_head_kv = p.n_head_kv;
  c.head_dim = p.head_dim;
  c.n_expert = p.n_expert;
  c.n_expert_used = p.n_expert_used;
  c.n_ff_exp = p.n_ff_exp;
  c.n_ff_shexp = p.n_ff_shexp;
  if (is_hybrid(p)) {
    c.ssm_d_conv = p.ssm_d_conv;
    c.ssm_d_state = p.ssm_head_dim;
    c.ssm_n_group = p.ssm_n_k_heads;
    c.ssm_dt_rank = p.ssm_n_v_heads;
    c.ssm_d_inner = p.ssm_n_v_heads * p.ssm_head_dim;
    for (int64_t il = 0; il < p.n_layer; ++il)
      c.layer_recurrent.push_back((il + 1) % p.full_attention_interval != 0);
  }
  return c;
}

// The architecture's tensor table in llama.cpp's file order: the embedding, the layers, the final norm
// and the head.
std::vector<TensorSpec> tensor_specs(const SynthPreset& p, const TypeMix& mix) {
  // The qwen3moe presets keep the plain mix (Q4_K everywhere but the output) that docs/PERF.md's
  // figures were measured on; the hybrid ones follow llama.cpp's per-layer choice.
  const bool llama_rules = is_hybrid(p);
  const ModelConfig c = model_config(p);
  const TensorTableFn table = tensor_table(p.arch);
  std::vector<TensorSpec> t;
  auto add = [&](const TensorDecl& d, int64_t il) {
    TensorSpec s{layer_tensor_name(il, d.name), DType::F32, d.shape, d.synth};
    if (s.pooled()) {
      const bool more = llama_rules && d.synth == SynthFill::more_bits && use_more_bits(il, p.n_layer);
      s.type = fit_type(d.synth == SynthFill::output ? mix.output
                        : more                       ? mix.more_bits
                                                     : mix.linear,
                        d.shape[0]);
    }
    t.push_back(std::move(s));
  };
  const TensorList io = table(c, kIoTensors);
  add(io[0], kIoTensors);
  for (int64_t il = 0; il < p.n_layer; ++il)
    for (const TensorDecl& d : table(c, il)) add(d, il);
  for (size_t i = 1; i < io.size(); ++i) add(io[i], kIoTensors);
  uint64_t offset = 0;
  for (TensorSpec& s : t) {
    s.offset = offset;
    offset += (s.bytes() + kAlignment - 1) / kAlignment * kAlignment;
  }
  return t;
}

// A SentencePiece-style ("llama") vocabulary, which both xpert and llama.cpp read: <unk> <s> </s>, the
// 256 byte tokens, then plain pieces.
void add_vocab(std::vector<std::pair<std::string, gguf::Value>>& kv, int64_t n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
    scores.push_back(0);
  }
  for (int64_t i = 0; (int64_t)tokens.size() < n_vocab; ++i) {
    tokens.push_back(fmt::format("\u2581w{}", i));
    types.push_back(1);
    scores.push_back(-(float)i);
  }
  using gguf::Value, gguf::ValueType;
  kv.emplace_back("tokenizer.ggml.model", Value::of_string("llama"));
  kv.emplace_back("tokenizer.ggml.tokens", Value::of_strings(tokens));
  kv.emplace_back("tokenizer.ggml.scores", Value::of_numbers(ValueType::F32, scores.data(), scores.size()));
  kv.emplace_back("tokenizer.ggml.token_type", Value::of_numbers(ValueType::I32, types.data(), types.size()));
  kv.emplace_back("tokenizer.ggml.unknown_token_id", Value::of_uint(ValueType::U32, 0));
  kv.emplace_back("tokenizer.ggml.bos_token_id", Value::of_uint(ValueType::U32, 1));
  kv.emplace_back("tokenizer.ggml.eos_token_id", Value::of_uint(ValueType::U32, 2));
}

std::vector<std::pair<std::string, gguf::Value>> metadata(const SynthPreset& p, const TypeMix& mix,
                                                          const std::string& type) {
  using gguf::Value, gguf::ValueType;
  std::vector<std::pair<std::string, Value>> kv;
  auto u32 = [&](const std::string& k, int64_t v) { kv.emplace_back(k, Value::of_uint(ValueType::U32, (uint64_t)v)); };
  auto f32 = [&](const std::string& k, float v) { kv.emplace_back(k, Value::of_float(ValueType::F32, v)); };
  const std::string a = p.arch + ".";
  kv.emplace_back("general.architecture", Value::of_string(p.arch));
  kv.emplace_back("general.name", Value::of_string(fmt::format("synthetic {} {}", p.name, type)));
  u32("general.file_type", mix.file_type);
  u32("general.quantization_version", 2);
  u32(a + "block_count", p.n_layer);
  u32(a + "context_length", p.n_ctx);
  u32(a + "embedding_length", p.n_embd);
  if (p.n_ff > 0) u32(a + "feed_forward_length", p.n_ff);  // Qwen3.5 MoE configs have no intermediate_size
  if (p.n_expert > 0) u32(a + "expert_feed_forward_length", p.n_ff_exp);
  u32(a + "attention.head_count", p.n_head);
  u32(a + "attention.head_count_kv", p.n_head_kv);
  u32(a + "attention.key_length", p.head_dim);
  u32(a + "attention.value_length", p.head_dim);
  f32(a + "rope.freq_base", p.rope_base);
  f32(a + "attention.layer_norm_rms_epsilon", p.rms_eps);
  if (p.n_expert > 0) {
    u32(a + "expert_count", p.n_expert);
    u32(a + "expert_used_count", p.n_expert_used);
    if (is_hybrid(p)) u32(a + "expert_shared_feed_forward_length", p.n_ff_shexp);
  }
  if (is_hybrid(p)) {
    u32(a + "rope.dimension_count", p.n_rot);
    kv.emplace_back(a + "rope.dimension_sections",
                    Value::of_numbers(ValueType::I32, p.rope_sections.data(), 4));
    u32(a + "full_attention_interval", p.full_attention_interval);
    u32(a + "ssm.conv_kernel", p.ssm_d_conv);
    u32(a + "ssm.state_size", p.ssm_head_dim);
    u32(a + "ssm.group_count", p.ssm_n_k_heads);
    u32(a + "ssm.time_step_rank", p.ssm_n_v_heads);
    u32(a + "ssm.inner_size", p.ssm_n_v_heads * p.ssm_head_dim);
  }
  add_vocab(kv, p.n_vocab);
  return kv;
}

// Sequential file output with a running position, for the streamed layout.
class FileOut {
 public:
  explicit FileOut(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) fail("cannot create '{}': {}", path, std::strerror(errno));
  }
  ~FileOut() {
    if (f_) {
      std::fclose(f_);
      std::remove(path_.c_str());  // not closed by close(): an error is on its way
    }
  }
  size_t pos() const { return pos_; }
  void bytes(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) fail("cannot write '{}': {}", path_, std::strerror(errno ? errno : EIO));
    pos_ += n;
  }
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  void string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    static const uint8_t zeros[64] = {};
    bytes(zeros, (alignment - pos_ % alignment) % alignment);
  }
  void close() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) {
      std::remove(path_.c_str());
      fail("cannot write '{}': {}", path_, std::strerror(errno));
    }
  }

 private:
  std::string path_;
  std::FILE* f_;
  size_t pos_ = 0;
};

void write_value(FileOut& out, const gguf::Value& v) {
  using gguf::ValueType;
  switch (v.type) {
    case ValueType::U32: out.put<uint32_t>((uint32_t)v.u); break;
    case ValueType::F32: out.put<float>((float)v.f); break;
    case ValueType::STRING: out.string(v.s); break;
    case ValueType::ARRAY:
      out.put<uint32_t>((uint32_t)v.elem);
      out.put<uint64_t>(v.count);
      if (v.elem == ValueType::STRING) {
        for (const std::string& s : v.strings) out.string(s);
      } else {
        XP_ASSERT(v.elem != ValueType::ARRAY);
        out.bytes(v.array_data(), v.count * gguf::value_type_size(v.elem));
      }
      break;
    default: XP_ASSERT(!"synth writes only u32, f32, string and array values");
  }
}

class RowPool {
 public:
  RowPool(DType type, int64_t row_len, std::mt19937_64& rng) : row_bytes_(row_bytes(type, row_len)) {
    data_.resize(row_bytes_ * kPoolRows);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt((float)row_len));
    std::vector<float> row(row_len);
    for (int64_t r = 0; r < kPoolRows; ++r) {
      for (float& v : row) v = normal(rng);
      quantize_row(type, row.data(), data_.data() + r * row_bytes_, row_len);
    }
  }
  const uint8_t* row(uint64_t i) const { return data_.data() + (i % kPoolRows) * row_bytes_; }

 private:
  size_t row_bytes_;
  std::vector<uint8_t> data_;
};

}  // namespace

SynthPlan synth_plan(const std::string& preset, const std::string& type) {
  const SynthPreset& p = synth_preset(preset);
  const TypeMix mix = type_mix(type);
  SynthPlan plan;
  for (const TensorSpec& s : tensor_specs(p, mix)) {
    plan.tensors.push_back({s.name, s.type, s.shape});
    plan.n_params += s.rows() * s.shape[0];
    plan.tensor_bytes += s.bytes();
  }
  plan.metadata = metadata(p, mix, type);
  return plan;
}

SynthResult synth_write(const SynthOptions& o) {
  const SynthPreset& p = synth_preset(o.preset);
  const TypeMix mix = type_mix(o.type);
  if (o.output.empty()) fail("no output file given (-o FILE)");
  const std::vector<TensorSpec> specs = tensor_specs(p, mix);
  const auto kv = metadata(p, mix, o.type);

  SynthResult res;
  size_t total = 0;
  for (const TensorSpec& s : specs) {
    total += s.bytes();
    res.n_params += s.rows() * s.shape[0];
  }

  FileOut out(o.output);
  out.bytes("GGUF", 4);
  out.put<uint32_t>(3);
  out.put<uint64_t>(specs.size());
  out.put<uint64_t>(kv.size());
  for (const auto& [key, v] : kv) {
    out.string(key);
    out.put<uint32_t>((uint32_t)v.type);
    write_value(out, v);
  }
  for (const TensorSpec& s : specs) {
    out.string(s.name);
    out.put<uint32_t>((uint32_t)s.shape.size());
    for (int64_t d : s.shape) out.put<uint64_t>((uint64_t)d);
    out.put<uint32_t>((uint32_t)s.type);
    out.put<uint64_t>(s.offset);
  }
  out.pad_to(kAlignment);
  const size_t data_start = out.pos();

  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + 1);
  std::map<std::pair<DType, int64_t>, RowPool> pools;
  std::vector<uint8_t> chunk;
  constexpr size_t kChunkBytes = 16u << 20;
  size_t done = 0;
  for (const TensorSpec& s : specs) {
    XP_ASSERT(out.pos() - data_start == s.offset);
    const int64_t k = s.shape[0], rows = s.rows();
    const size_t rb = s.row_size();
    if (s.pooled()) {
      auto it = pools.find({s.type, k});
      if (it == pools.end()) it = pools.try_emplace({s.type, k}, s.type, k, rng).first;
      const RowPool& pool = it->second;
      const uint64_t a = rng() | 1, b = rng();
      for (int64_t r0 = 0; r0 < rows;) {
        const int64_t n = std::min<int64_t>(rows - r0, std::max<size_t>(1, kChunkBytes / rb));
        chunk.resize(n * rb);
        for (int64_t i = 0; i < n; ++i) std::memcpy(chunk.data() + i * rb, pool.row(a * (r0 + i) + b), rb);
        out.bytes(chunk.data(), chunk.size());
        r0 += n;
      }
    } else {
      std::vector<float> v(rows * k, 1.0f);
      if (s.fill == SynthFill::normal) {
        std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt((float)k));
        for (float& x : v) x = normal(rng);
      } else if (s.fill == SynthFill::decay) {
        std::uniform_real_distribution<float> rate(0.1f, 2.0f);
        for (float& x : v) x = -rate(rng);
      }
      out.bytes(v.data(), v.size() * sizeof(float));
    }
    out.pad_to(kAlignment);
    done += s.bytes();
    if (o.progress) o.progress(done, total);
  }
  res.file_bytes = out.pos();
  out.close();
  return res;
}

}  // namespace xpert
