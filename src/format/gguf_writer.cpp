// GGUF v3 writer: the layout GGUFFile reads (see gguf.cpp), with every tensor's data aligned and padded
// to the alignment, as llama.cpp and the Python `gguf` package write it.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>

#include "base/error.h"
#include "format/gguf.h"

namespace xpert::gguf {

namespace {

using Sink = std::function<void(const void*, size_t)>;

class Out {
 public:
  explicit Out(const Sink& sink) : sink_(sink) {}
  size_t pos() const { return pos_; }
  void bytes(const void* p, size_t n) {
    if (n) sink_(p, n);
    pos_ += n;
  }
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof(T));
  }
  void string(std::string_view s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    static const uint8_t zeros[256] = {};
    size_t n = (alignment - pos_ % alignment) % alignment;
    while (n) {
      const size_t k = std::min(n, sizeof(zeros));
      bytes(zeros, k);
      n -= k;
    }
  }

 private:
  const Sink& sink_;
  size_t pos_ = 0;
};

// Checks that a Value can be written, so that a bad one fails at set() naming its key, and copies numeric
// arrays that point into a reader's map, so the writer does not depend on that map staying open.
void adopt(const std::string& key, Value& v, int depth) {
  if ((uint32_t)v.type > (uint32_t)ValueType::F64) fail("GGUF writer: key '{}': bad value type", key);
  if (v.type != ValueType::ARRAY) return;
  const size_t size = value_type_size(v.elem);
  if (size != 0) {
    if (v.raw) {
      v.owned.assign(v.raw, v.raw + v.count * size);
      v.raw = nullptr;
    }
    if (v.owned.size() != v.count * size) {
      fail("GGUF writer: key '{}': array of {} {} holds {} bytes, expected {}", key, v.count,
           value_type_name(v.elem), v.owned.size(), v.count * size);
    }
  } else if (v.elem == ValueType::STRING) {
    if (v.strings.size() != v.count) {
      fail("GGUF writer: key '{}': array count {} but {} strings", key, v.count, v.strings.size());
    }
  } else if (v.elem == ValueType::ARRAY) {
    if (depth + 1 >= kMaxArrayDepth) {
      fail("GGUF writer: key '{}': arrays nested more than {} deep (readers refuse them)", key,
           kMaxArrayDepth);
    }
    if (v.items.size() != v.count) {
      fail("GGUF writer: key '{}': array count {} but {} items", key, v.count, v.items.size());
    }
    for (Value& item : v.items) {
      if (item.type != ValueType::ARRAY) {
        fail("GGUF writer: key '{}': an item of an array of arrays is a {}", key, value_type_name(item.type));
      }
      adopt(key, item, depth + 1);
    }
  } else {
    fail("GGUF writer: key '{}': bad array element type {}", key, (uint32_t)v.elem);
  }
}

// The value's bytes, without its type tag (the caller writes that: the kv's type or the array's elem).
void write_value(Out& out, const Value& v) {
  // clang-format off
  switch (v.type) {
    case ValueType::U8: out.put<uint8_t>((uint8_t)v.u); break;
    case ValueType::I8: out.put<int8_t>((int8_t)v.i); break;
    case ValueType::U16: out.put<uint16_t>((uint16_t)v.u); break;
    case ValueType::I16: out.put<int16_t>((int16_t)v.i); break;
    case ValueType::U32: out.put<uint32_t>((uint32_t)v.u); break;
    case ValueType::I32: out.put<int32_t>((int32_t)v.i); break;
    case ValueType::U64: out.put<uint64_t>(v.u); break;
    case ValueType::I64: out.put<int64_t>(v.i); break;
    case ValueType::F32: out.put<float>((float)v.f); break;
    case ValueType::F64: out.put<double>(v.f); break;
    case ValueType::BOOL: out.put<uint8_t>(v.u ? 1 : 0); break;
    case ValueType::STRING: out.string(v.s); break;
    case ValueType::ARRAY:
      out.put<uint32_t>((uint32_t)v.elem);
      out.put<uint64_t>(v.count);
      if (v.elem == ValueType::STRING) {
        for (const std::string& s : v.strings) out.string(s);
      } else if (v.elem == ValueType::ARRAY) {
        for (const Value& item : v.items) write_value(out, item);
      } else {
        out.bytes(v.array_data(), v.count * value_type_size(v.elem));
      }
      break;
  }
  // clang-format on
}

size_t padded(size_t n, size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace

void GGUFWriter::set(const std::string& key, Value v) {
  if (key.empty()) fail("GGUF writer: empty metadata key");
  adopt(key, v, 0);
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

void GGUFWriter::set_string(const std::string& key, const std::string& v) { set(key, Value::of_string(v)); }
void GGUFWriter::set_u32(const std::string& key, uint32_t v) { set(key, Value::of_uint(ValueType::U32, v)); }
void GGUFWriter::set_i32(const std::string& key, int32_t v) { set(key, Value::of_int(ValueType::I32, v)); }
void GGUFWriter::set_u64(const std::string& key, uint64_t v) { set(key, Value::of_uint(ValueType::U64, v)); }
void GGUFWriter::set_f32(const std::string& key, float v) { set(key, Value::of_float(ValueType::F32, v)); }
void GGUFWriter::set_bool(const std::string& key, bool v) { set(key, Value::of_bool(v)); }
void GGUFWriter::set_strings(const std::string& key, const std::vector<std::string>& v) {
  set(key, Value::of_strings(v));
}
void GGUFWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
  set(key, Value::of_numbers(ValueType::F32, v.data(), v.size()));
}
void GGUFWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  set(key, Value::of_numbers(ValueType::I32, v.data(), v.size()));
}

void GGUFWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                            const void* data, size_t n_bytes) {
  if (name.empty()) fail("GGUF writer: empty tensor name");
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) fail("GGUF writer: tensor '{}' added twice", name);
  }
  if (shape.empty() || shape.size() > kMaxDims) {
    fail("GGUF writer: tensor '{}' has {} dimensions (expected 1 to {})", name, shape.size(), kMaxDims);
  }
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(type));
  if (!info) fail("GGUF writer: tensor '{}' has unknown type {}", name, static_cast<uint32_t>(type));
  uint64_t rows = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) fail("GGUF writer: tensor '{}': dimension {} is {} (expected > 0)", name, d, shape[d]);
    if (d > 0 && __builtin_mul_overflow(rows, (uint64_t)shape[d], &rows)) {
      fail("GGUF writer: tensor '{}': element count overflows", name);
    }
  }
  if (shape[0] % info->block_size != 0) {
    fail("GGUF writer: tensor '{}': row length {} is not a multiple of the {} block size {}", name, shape[0],
         info->name, info->block_size);
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow((uint64_t)row_bytes(type, shape[0]), rows, &expected)) {
    fail("GGUF writer: tensor '{}': byte size overflows", name);
  }
  if (n_bytes != expected) {
    fail("GGUF writer: tensor '{}': got {} bytes, expected {} for {} of {} rows of {}", name, n_bytes,
         expected, info->name, rows, shape[0]);
  }
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({name, type, shape, std::vector<uint8_t>(p, p + n_bytes)});
}

void GGUFWriter::serialize(const Sink& sink) const {
  const size_t alignment = alignment_;
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (size_t{1} << 31)) {
    fail("GGUF writer: alignment {} is not a power of two between 1 and 2^31", alignment);
  }
  // A non-default alignment must be recorded in the file, or readers would look for the data elsewhere.
  bool has_alignment_key = false;
  for (const auto& [key, v] : kv_) {
    if (key != "general.alignment") continue;
    has_alignment_key = true;
    if (v.type != ValueType::U32 || v.u != alignment) {
      fail("GGUF writer: general.alignment is set to {} ({}) but the writer aligns to {}", v.to_display(),
           value_type_name(v.type), alignment);
    }
  }
  const bool add_alignment_key = !has_alignment_key && alignment != kDefaultAlignment;

  Out out(sink);
  out.bytes("GGUF", 4);
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(kv_.size() + (add_alignment_key ? 1 : 0));
  for (const auto& [key, v] : kv_) {
    out.string(key);
    out.put<uint32_t>((uint32_t)v.type);
    write_value(out, v);
  }
  if (add_alignment_key) {
    out.string("general.alignment");
    out.put<uint32_t>((uint32_t)ValueType::U32);
    out.put<uint32_t>((uint32_t)alignment);
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    out.string(t.name);
    out.put<uint32_t>((uint32_t)t.shape.size());
    for (int64_t d : t.shape) out.put<uint64_t>((uint64_t)d);
    out.put<uint32_t>((uint32_t)t.type);
    out.put<uint64_t>(offset);
    offset += padded(t.data.size(), alignment);
  }
  // The padding only places tensor data: a file without tensors ends with its index (a huge alignment
  // would otherwise make it that large).
  if (!tensors_.empty()) out.pad_to(alignment);
  for (const PendingTensor& t : tensors_) {
    out.bytes(t.data.data(), t.data.size());
    out.pad_to(alignment);
  }
}

void GGUFWriter::write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot create '{}': {}", path, std::strerror(errno));
  int err = 0;  // the first write error
  try {
    serialize([&](const void* p, size_t n) {
      if (err == 0 && std::fwrite(p, 1, n, f) != n) err = errno ? errno : EIO;
    });
  } catch (...) {
    std::fclose(f);
    std::remove(path.c_str());
    throw;
  }
  if (std::fclose(f) != 0 && err == 0) err = errno ? errno : EIO;
  if (err != 0) {
    std::remove(path.c_str());
    fail("cannot write '{}': {}", path, std::strerror(err));
  }
}

std::vector<uint8_t> GGUFWriter::to_bytes() const {
  std::vector<uint8_t> bytes;
  serialize([&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  });
  return bytes;
}

}  // namespace xpert::gguf
