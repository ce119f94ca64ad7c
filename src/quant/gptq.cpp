#include "quant/gptq.h"

#include <cstring>

#include "base/error.h"
#include "base/half.h"
#include "quant/blocks.h"

namespace xpert::gptq {

namespace {

using nlohmann::json;

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

Config parse_config(const json& qc, std::string_view source) {
  if (!qc.is_object()) fail("{}: quantization_config must be an object", source);
  auto refuse = [&](std::string_view field, const json& value, std::string_view want) {
    fail("{}: quantization_config.{} = {} is not supported (xpert loads {})", source, field, value.dump(),
         want);
  };
  const json method = qc.value("quant_method", json());
  if (!method.is_string() || method.get<std::string>() != "gptq")
    refuse("quant_method", method, "\"gptq\": symmetric 4-bit GPTQ");
  const json bits = qc.value("bits", json());
  if (!bits.is_number_integer() || bits.get<int64_t>() != 4) refuse("bits", bits, "4");
  // transformers' GPTQConfig defaults: sym = true, desc_act = false.
  const json sym = qc.value("sym", json(true));
  if (!sym.is_boolean()) refuse("sym", sym, "true or false");
  const json desc_act = qc.value("desc_act", json(false));
  if (!desc_act.is_boolean() || desc_act.get<bool>())
    refuse("desc_act", desc_act, "false (no act-order: re-quantize with desc_act=false)");
  Config c;
  c.sym = sym.get<bool>();
  const json group = qc.value("group_size", json());
  if (!group.is_number_integer() ||
      (group.get<int64_t>() != -1 && (group.get<int64_t>() <= 0 || group.get<int64_t>() % 32)))
    refuse("group_size", group, "a positive multiple of 32 (128 is the tested one) or -1");
  c.group_size = group.get<int64_t>();
  // The checkpoint format: GPTQModel writes "format", older writers "checkpoint_format".
  for (const char* key : {"checkpoint_format", "format"}) {
    if (!qc.contains(key)) continue;
    const json& f = qc[key];
    if (!f.is_string() || (f.get<std::string>() != "gptq" && f.get<std::string>() != "gptq_v2"))
      refuse(key, f, "\"gptq\" or \"gptq_v2\"");
    c.format = f.get<std::string>();
  }
  c.zero_offset = c.format == "gptq_v2" ? 0 : 1;
  if (qc.contains("pack_dtype") && qc["pack_dtype"] != "int32")
    refuse("pack_dtype", qc["pack_dtype"], "\"int32\"");
  // GPTQModel's per-module overrides: only exclusions ("-:regex") keep every quantized layer alike.
  if (qc.contains("dynamic") && !qc["dynamic"].is_null()) {
    const json& d = qc["dynamic"];
    if (!d.is_object()) refuse("dynamic", d, "per-module exclusions only");
    for (auto it = d.begin(); it != d.end(); ++it)
      if (it.key().rfind("-:", 0) != 0)
        fail(
            "{}: quantization_config.dynamic['{}'] overrides the quantization of some modules, which is not "
            "supported "
            "(only exclusions \"-:...\" are)",
            source, it.key());
  }
  return c;
}

int nibble(const Layer& l, int64_t j, int64_t i) {
  return (int)((load_u32(l.qweight + 4 * ((i / 8) * l.n + j)) >> (4 * (i % 8))) & 0xF);
}

int zero_point(const Layer& l, int64_t j, int64_t i) {
  if (!l.qzeros) return 8;
  const uint32_t word = load_u32(l.qzeros + 4 * ((i / l.group) * (l.n / 8) + j / 8));
  return (int)((word >> (4 * (j % 8))) & 0xF) + l.zero_offset;
}

void dequantize_reference(const Layer& l, float* out) {
  for (int64_t j = 0; j < l.n; ++j)
    for (int64_t i = 0; i < l.k; ++i) {
      const float d = f16_to_f32(load_u16(l.scales + 2 * ((i / l.group) * l.n + j)));
      out[j * l.k + i] = (float)(nibble(l, j, i) - zero_point(l, j, i)) * d;
    }
}

DType native_type(int64_t group, bool zeros) {
  const int index = group == 32 ? 0 : group == 64 ? 1 : group == 128 ? 2 : -1;
  if (index < 0) return DType::F32;
  return (DType)((uint32_t)DType::GPTQ4_G32 + index + (zeros ? 3 : 0));
}

NativeView native_view(DType t, const void* data, int64_t k, int64_t n) {
  XP_ASSERT(is_gptq(t) && k % gptq_group(t) == 0);
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t q_bytes = (size_t)(k / 2 * n), s_bytes = (size_t)(k / gptq_group(t) * n) * 2;
  return {p, p + q_bytes, gptq_has_zeros(t) ? p + q_bytes + s_bytes : nullptr};
}

void write_native(const Layer& l, DType t, uint8_t* dst) {
  XP_ASSERT(native_type(l.group, l.qzeros != nullptr) == t);
  const NativeView v = native_view(t, dst, l.k, l.n);
  std::memcpy(const_cast<uint8_t*>(v.qweight), l.qweight, (size_t)(l.k / 2 * l.n));
  std::memcpy(const_cast<uint8_t*>(v.scales), l.scales, (size_t)(l.k / l.group * l.n) * 2);
  if (!v.zeros) return;
  auto* z = const_cast<uint8_t*>(v.zeros);
  for (int64_t g = 0; g < l.k / l.group; ++g)
    for (int64_t j = 0; j < l.n; ++j) z[g * l.n + j] = (uint8_t)zero_point(l, j, g * l.group);
}

void dequantize_native(DType t, const void* data, int64_t k, int64_t n, float* out) {
  const NativeView v = native_view(t, data, k, n);
  const int64_t group = gptq_group(t);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) {
      const int q = (int)((load_u32(v.qweight + 4 * ((i / 8) * n + j)) >> (4 * (i % 8))) & 0xF);
      const int zero = v.zeros ? v.zeros[(i / group) * n + j] : 8;
      out[j * k + i] = (float)(q - zero) * f16_to_f32(load_u16(v.scales + 2 * ((i / group) * n + j)));
    }
}

void repack_q4_0(const Layer& l, std::span<const int64_t> row_map, std::span<const int64_t> block_map,
                 void* dst) {
  XP_ASSERT(l.k % quant::kQK == 0 && l.group % quant::kQK == 0 && l.k % l.group == 0);
  const int64_t n_rows = row_map.empty() ? l.n : (int64_t)row_map.size();
  const int64_t n_blocks = l.k / quant::kQK;
  XP_ASSERT(block_map.empty() || (int64_t)block_map.size() == n_blocks);
  auto* out = static_cast<quant::BlockQ4_0*>(dst);
  // Block by block: the four qweight rows of one 32-input block are read front to back across all
  // outputs (sequential reads), each output row getting its one block.
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t sb = block_map.empty() ? b : block_map[b];
    XP_ASSERT(sb >= 0 && sb < n_blocks);
    const uint8_t* words = l.qweight + 4 * (sb * 4 * l.n);  // qweight rows 4 sb .. 4 sb + 3
    const uint8_t* scales = l.scales + 2 * ((sb * quant::kQK / l.group) * l.n);
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t j = row_map.empty() ? r : row_map[r];
      XP_ASSERT(j >= 0 && j < l.n);
      uint32_t w[4];
      for (int q = 0; q < 4; ++q) w[q] = load_u32(words + 4 * (q * l.n + j));
      quant::BlockQ4_0& blk = out[r * n_blocks + b];
      blk.d = load_u16(scales + 2 * j);
      // Q4_0 keeps inputs t and t + 16 in one byte: t < 8 come from word 0 (t + 16: word 2), 8..15 from
      // words 1 and 3.
      for (int t = 0; t < 8; ++t) {
        blk.qs[t] = (uint8_t)(((w[0] >> (4 * t)) & 0xF) | (((w[2] >> (4 * t)) & 0xF) << 4));
        blk.qs[t + 8] = (uint8_t)(((w[1] >> (4 * t)) & 0xF) | (((w[3] >> (4 * t)) & 0xF) << 4));
      }
    }
  }
}

void check_qzeros(const uint8_t* qzeros, int64_t n_groups, int64_t n, int zero_offset,
                  std::string_view name) {
  XP_ASSERT(n % 8 == 0);
  for (int64_t g = 0; g < n_groups; ++g)
    for (int64_t c = 0; c < n / 8; ++c) {
      const uint32_t word = load_u32(qzeros + 4 * (g * (n / 8) + c));
      for (int t = 0; t < 8; ++t) {
        const int zero = (int)((word >> (4 * t)) & 0xF) + zero_offset;
        if (zero != 8)
          fail(
              "{}: zero point {} (group {}, output {}) is not the symmetric 8, but quantization_config says "
              "sym = true (an asymmetric checkpoint must say sym = false)",
              name, zero, g, c * 8 + t);
      }
    }
}

void check_g_idx(const uint8_t* g_idx, int64_t k, int64_t group, std::string_view name) {
  for (int64_t i = 0; i < k; ++i) {
    int32_t g;
    std::memcpy(&g, g_idx + 4 * i, 4);
    if (g != i / group)
      fail("{}: g_idx[{}] = {}, expected {} (act-order / desc_act checkpoints are not supported)", name, i, g,
           i / group);
  }
}

}  // namespace xpert::gptq
