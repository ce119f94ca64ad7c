// GGUF reader. The parser walks the file with a bounds-checked cursor: every count, length and offset is
// compared with the bytes that are left before it is used, so a hostile file gives one Error and never a
// huge allocation or a read past the map. Layout (all little-endian):
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv
//   n_kv  x { string key, u32 type, value }             string = u64 length + bytes (no NUL)
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset }
//   padding to general.alignment (default 32), then the tensor data; offsets are from its start.
#include "format/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace xpert::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader maps little-endian data in place");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
// The smallest encodings, used to refuse a count before anything is allocated for it.
constexpr size_t kMinStringBytes = 8;                          // the length alone
constexpr size_t kMinArrayBytes = 4 + 8;                       // element type + count
constexpr size_t kMinKvBytes = 8 + 1 + 4 + 1;                  // key length + 1-byte key + type + u8
constexpr size_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name + n_dims + one dim + type + offset

constexpr uint32_t kNumValueTypes = 13;

// A count read from the file only bounds what may follow; memory is reserved for at most this many
// entries up front (more grow as they are actually read), since an entry in memory is several times
// larger than its smallest encoding and a hostile count would otherwise reserve many times the file size.
constexpr uint64_t kMaxReserve = 1 << 16;
size_t reserve_count(uint64_t n) { return (size_t)std::min(n, kMaxReserve); }
// An item of an array of arrays costs ~15x its 12 bytes on disk once decoded; real files have none or
// a few, so their total is bounded to keep a crafted file from turning into gigabytes of Values.
constexpr uint64_t kMaxNestedItems = 1 << 20;

// Bytes of the valid UTF-8 sequence at the start of s, or 0.
size_t utf8_length(std::string_view s) {
  const auto b0 = (unsigned char)s[0];
  const size_t n = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xe ? 3 : (b0 >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if (((unsigned char)s[k] >> 6) != 0x2) return 0;
  }
  return n;
}

// For messages and display: printable ASCII as is, anything else escaped; at most `max_chars` shown.
std::string escape(std::string_view s, size_t max_chars = 200) {
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (out.size() >= max_chars) {
      out += fmt::format("...({} bytes)", s.size());
      break;
    }
    const auto ch = (unsigned char)s[k];
    if (ch == '\\' || ch == '"') {
      out += '\\';
      out += (char)ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch >= 0x20 && ch < 0x7f) {
      out += (char)ch;
    } else if (size_t n = utf8_length(s.substr(k)); n > 1) {
      out += s.substr(k, n);  // valid UTF-8 passes through (token pieces are text)
      k += n - 1;
    } else {
      out += fmt::format("\\x{:02x}", ch);  // control bytes and broken UTF-8
    }
  }
  return out;
}

// A read position in the image. `where` names what is being read (a key, a tensor) for messages.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  size_t pos() const { return pos_; }
  uint64_t nested_items = 0;  // items of arrays of arrays read so far
  size_t left() const { return size_ - pos_; }
  std::string where;

  [[noreturn]] void error(const std::string& what) const {
    if (where.empty()) fail("{}: {}", file_, what);
    fail("{}: {}: {}", file_, where, what);
  }

  const uint8_t* take(size_t n, std::string_view what) {
    if (n > left()) {
      error(fmt::format("truncated file: {} needs {} bytes at offset {}, but only {} are left", what, n, pos_,
                        left()));
    }
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T read(std::string_view what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  std::string_view read_string(std::string_view what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left()) {
      error(fmt::format("{} has length {}, more than the {} bytes left in the file (truncated or corrupt)",
                        what, n, left()));
    }
    return {reinterpret_cast<const char*>(take((size_t)n, what)), (size_t)n};
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
};

bool is_fixed_size(ValueType t) { return value_type_size(t) != 0; }

Value parse_value(Cursor& c, ValueType type, int depth);

void parse_array(Cursor& c, Value& v, int depth) {
  const uint32_t elem = c.read<uint32_t>("array element type");
  if (elem >= kNumValueTypes) c.error(fmt::format("unknown array element type {} (expected 0..12)", elem));
  v.elem = static_cast<ValueType>(elem);
  v.count = c.read<uint64_t>("array length");
  const std::string_view elem_name = value_type_name(v.elem);
  auto refuse_count = [&](size_t min_bytes) {
    if (v.count > c.left() / min_bytes) {
      c.error(
          fmt::format("array of {} {} needs at least {} bytes each, but only {} bytes are left (truncated or "
                      "corrupt)",
                      v.count, elem_name, min_bytes, c.left()));
    }
  };
  if (is_fixed_size(v.elem)) {
    const size_t size = value_type_size(v.elem);
    refuse_count(size);
    v.raw = c.take((size_t)v.count * size, "array data");
    if (v.elem == ValueType::BOOL) {
      for (uint64_t k = 0; k < v.count; ++k) {
        if (v.raw[k] > 1) c.error(fmt::format("bool array element {} is {} (expected 0 or 1)", k, v.raw[k]));
      }
    }
  } else if (v.elem == ValueType::STRING) {
    refuse_count(kMinStringBytes);
    v.strings.reserve(reserve_count(v.count));
    for (uint64_t k = 0; k < v.count; ++k) v.strings.emplace_back(c.read_string("array string"));
  } else {
    if (depth + 1 >= kMaxArrayDepth) {
      c.error(fmt::format("arrays nested more than {} deep are not supported", kMaxArrayDepth));
    }
    refuse_count(kMinArrayBytes);
    c.nested_items += v.count;  // cannot overflow: each item needs 12 bytes of the file
    if (c.nested_items > kMaxNestedItems) {
      c.error(fmt::format("more than {} items in arrays of arrays (not supported)", kMaxNestedItems));
    }
    v.items.reserve(reserve_count(v.count));
    for (uint64_t k = 0; k < v.count; ++k) v.items.push_back(parse_value(c, ValueType::ARRAY, depth + 1));
  }
}

Value parse_value(Cursor& c, ValueType type, int depth) {
  Value v;
  v.type = type;
  // clang-format off
  switch (type) {
    case ValueType::U8: v.u = c.read<uint8_t>("U8 value"); break;
    case ValueType::I8: v.i = c.read<int8_t>("I8 value"); break;
    case ValueType::U16: v.u = c.read<uint16_t>("U16 value"); break;
    case ValueType::I16: v.i = c.read<int16_t>("I16 value"); break;
    case ValueType::U32: v.u = c.read<uint32_t>("U32 value"); break;
    case ValueType::I32: v.i = c.read<int32_t>("I32 value"); break;
    case ValueType::U64: v.u = c.read<uint64_t>("U64 value"); break;
    case ValueType::I64: v.i = c.read<int64_t>("I64 value"); break;
    case ValueType::F32: v.f = c.read<float>("F32 value"); break;
    case ValueType::F64: v.f = c.read<double>("F64 value"); break;
    case ValueType::BOOL:
      v.u = c.read<uint8_t>("BOOL value");
      if (v.u > 1) c.error(fmt::format("bool value is {} (expected 0 or 1)", v.u));
      break;
    case ValueType::STRING: v.s = c.read_string("string value"); break;
    case ValueType::ARRAY: parse_array(c, v, depth); break;
  }
  // clang-format on
  return v;
}

// a + b and a * b, or false when the result does not fit.
bool add_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->map_ = std::make_unique<MappedFile>(path);
  f->base_ = f->map_->data();
  f->size_ = f->map_->size();
  f->name_ = path;
  f->parse_all();
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->base_ = data;
  f->size_ = data ? size : 0;
  f->name_ = name;
  f->parse_all();
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::assemble(std::string name, std::vector<std::pair<std::string, Value>> kv,
                                             std::vector<TensorInfo> tensors, std::shared_ptr<const void> owner) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->owner_ = std::move(owner);
  f->name_ = std::move(name);
  f->version_ = 3;
  for (auto& [key, value] : kv) {
    if (!f->kv_index_.emplace(key, f->kv_.size()).second) fail("{}: duplicate metadata key '{}'", f->name_, key);
    f->kv_.emplace_back(std::move(key), std::move(value));
  }
  for (TensorInfo& t : tensors) {
    if (!f->tensor_index_.emplace(t.name, f->tensors_.size()).second)
      fail("{}: duplicate tensor name '{}'", f->name_, t.name);
    f->size_ += t.n_bytes;
    f->tensors_.push_back(std::move(t));
  }
  return f;
}

void GGUFFile::parse_all() {
  if (size_ < sizeof(kMagic)) fail("{}: not a GGUF file (it is only {} bytes long)", name_, size_);
  if (std::memcmp(base_, kMagic, sizeof(kMagic)) != 0) {
    fail("{}: not a GGUF file (expected the magic \"GGUF\" at offset 0, found \"{}\")", name_,
         escape(std::string_view(reinterpret_cast<const char*>(base_), sizeof(kMagic))));
  }
  Cursor c(base_, size_, name_);
  c.take(sizeof(kMagic), "magic");
  c.where = "header";
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) {
    fail(
        "{}: GGUF version 1 is not supported (expected version 2 or 3); re-convert the model with a current "
        "llama.cpp",
        name_);
  }
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) {
      fail(
          "{}: big-endian GGUF files are not supported (found version {} byte-swapped); use a little-endian "
          "file",
          name_, swapped);
    }
    fail("{}: unsupported GGUF version {} (expected version 2 or 3)", name_, version_);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Both lists follow the header, so each count must fit the rest of the file at its smallest encoding.
  if (n_kv > c.left() / kMinKvBytes) {
    fail(
        "{}: metadata count {} cannot fit in the {} bytes after the header (each entry needs at least {}); "
        "the "
        "file is corrupt or truncated",
        name_, n_kv, c.left(), kMinKvBytes);
  }
  if (n_tensors > c.left() / kMinTensorInfoBytes) {
    fail(
        "{}: tensor count {} cannot fit in the {} bytes after the header (each entry needs at least {}); the "
        "file "
        "is corrupt or truncated",
        name_, n_tensors, c.left(), kMinTensorInfoBytes);
  }

  kv_.reserve(reserve_count(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    c.where = fmt::format("metadata entry {}", k);
    const std::string_view key = c.read_string("key");
    if (key.empty()) c.error("empty key");
    c.where = fmt::format("metadata '{}'", escape(key, 96));
    const uint32_t type = c.read<uint32_t>("value type");
    if (type >= kNumValueTypes) c.error(fmt::format("unknown value type {} (expected 0..12)", type));
    Value v = parse_value(c, static_cast<ValueType>(type), 0);
    const auto [it, inserted] = kv_index_.emplace(std::string(key), kv_.size());
    if (!inserted) c.error(fmt::format("duplicate metadata key (entries {} and {})", it->second, k));
    kv_.emplace_back(std::string(key), std::move(v));
  }

  alignment_ = kDefaultAlignment;
  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::U32) {
      fail("{}: general.alignment must be a U32, found {}", name_, value_type_name(a->type));
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
      fail("{}: general.alignment must be a non-zero power of two, found {}", name_, a->u);
    }
    alignment_ = (size_t)a->u;
  }

  tensors_.reserve(reserve_count(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    c.where = fmt::format("tensor {}", k);
    TensorInfo t;
    t.name = c.read_string("name");
    if (t.name.empty()) c.error("empty tensor name");
    c.where = fmt::format("tensor '{}'", escape(t.name, 96));
    const uint32_t n_dims = c.read<uint32_t>("dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) {
      c.error(fmt::format("has {} dimensions (expected 1 to {})", n_dims, kMaxDims));
    }
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = static_cast<int64_t>(c.read<uint64_t>("dimension"));
      if (dim <= 0) c.error(fmt::format("dimension {} is {} (expected a positive size)", d, dim));
      if (!mul_ok(n_elements, (uint64_t)dim, n_elements) || n_elements > (uint64_t)INT64_MAX) {
        c.error(fmt::format("element count overflows 64 bits at dimension {}", d));
      }
      t.shape.push_back(dim);
    }
    const uint32_t type = c.read<uint32_t>("type");
    const DTypeInfo* info = dtype_info(type);
    if (!info) c.error(fmt::format("unknown tensor type {} (not a ggml type id xpert knows)", type));
    t.type = static_cast<DType>(type);
    if (t.shape[0] % info->block_size != 0) {
      c.error(fmt::format("row length {} is not a multiple of the {} block size {}", t.shape[0], info->name,
                          info->block_size));
    }
    uint64_t n_bytes = 0;
    if (!mul_ok(n_elements / (uint64_t)info->block_size, info->block_bytes, n_bytes) ||
        n_bytes > std::numeric_limits<size_t>::max()) {
      c.error(fmt::format("byte size of {} {} elements overflows 64 bits", n_elements, info->name));
    }
    t.n_bytes = (size_t)n_bytes;
    t.offset = c.read<uint64_t>("data offset");
    if (t.offset % alignment_ != 0) {
      c.error(fmt::format("data offset {} is not a multiple of the alignment {}", t.offset, alignment_));
    }
    const auto [it, inserted] = tensor_index_.emplace(t.name, tensors_.size());
    if (!inserted) c.error(fmt::format("duplicate tensor name (tensors {} and {})", it->second, k));
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the first aligned offset after the index (alignment <= 2^31: no overflow).
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (TensorInfo& t : tensors_) {
    uint64_t begin = 0, end = 0;
    if (!add_ok(data_offset_, t.offset, begin) || !add_ok(begin, t.n_bytes, end) || end > size_) {
      fail(
          "{}: tensor '{}': data (offset {} + {} bytes after the data section at {}) extends past the end of "
          "the "
          "file ({} bytes); the file is truncated or corrupt",
          name_, escape(t.name, 96), t.offset, t.n_bytes, data_offset_, size_);
    }
    t.data = base_ + begin;
  }
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& a = *by_offset[k - 1];
    const TensorInfo& b = *by_offset[k];
    if (a.offset + a.n_bytes > b.offset) {  // both end within the file: no overflow
      fail("{}: tensors '{}' (data bytes {}..{}) and '{}' (from {}) overlap", name_, escape(a.name, 96),
           a.offset, a.offset + a.n_bytes, escape(b.name, 96), b.offset);
    }
  }
}

const Value* GGUFFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* GGUFFile::tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void missing(const std::string& file, std::string_view key, std::string_view expected) {
  fail("{}: metadata key '{}' is missing (expected {})", file, key, expected);
}
[[noreturn]] void wrong_type(const std::string& file, std::string_view key, std::string_view expected,
                             const Value& v) {
  fail("{}: metadata key '{}' has type {} (expected {})", file, key, value_type_name(v.type), expected);
}
bool fits_int64(const Value& v) {
  return v.is_integer() && !(v.type == ValueType::U64 && v.u > (uint64_t)INT64_MAX);
}

}  // namespace

std::optional<std::string> GGUFFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(name_, key, "a string", *v);
  return v->s;
}

std::optional<int64_t> GGUFFile::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) wrong_type(name_, key, "an integer", *v);
  if (!fits_int64(*v))
    fail("{}: metadata key '{}' is {}, too large for a signed 64-bit integer", name_, key, v->u);
  return v->as_int();
}

std::optional<double> GGUFFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(name_, key, "a number", *v);
  return v->as_float();
}

std::optional<bool> GGUFFile::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL) wrong_type(name_, key, "a bool", *v);
  return v->u != 0;
}

std::string GGUFFile::require_string(std::string_view key) const {
  if (auto v = get_string(key)) return *v;
  missing(name_, key, "a string");
}

int64_t GGUFFile::require_int(std::string_view key) const {
  if (auto v = get_int(key)) return *v;
  missing(name_, key, "an integer");
}

double GGUFFile::require_float(std::string_view key) const {
  if (auto v = get_float(key)) return *v;
  missing(name_, key, "a number");
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- Value ----

std::string_view value_type_name(ValueType t) {
  // clang-format off
  switch (t) {
    case ValueType::U8: return "U8";
    case ValueType::I8: return "I8";
    case ValueType::U16: return "U16";
    case ValueType::I16: return "I16";
    case ValueType::U32: return "U32";
    case ValueType::I32: return "I32";
    case ValueType::F32: return "F32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::U64: return "U64";
    case ValueType::I64: return "I64";
    case ValueType::F64: return "F64";
  }
  // clang-format on
  return "?";
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::STRING:
    case ValueType::ARRAY:
      return 0;
  }
  return 0;
}

namespace {

bool is_unsigned_type(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed_type(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float_type(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Element idx of a numeric array, as a scalar Value of the element type.
Value element(const Value& a, uint64_t idx) {
  if (a.type != ValueType::ARRAY || !is_fixed_size(a.elem)) {
    fail("expected a numeric array, found {}{}", value_type_name(a.type),
         a.type == ValueType::ARRAY ? fmt::format(" of {}", value_type_name(a.elem)) : "");
  }
  if (idx >= a.count) fail("array index {} is out of range (the array has {} elements)", idx, a.count);
  const uint8_t* p = a.array_data() + idx * value_type_size(a.elem);
  Value v;
  v.type = a.elem;
  // clang-format off
  switch (a.elem) {
    case ValueType::U8:
    case ValueType::BOOL: v.u = load<uint8_t>(p); break;
    case ValueType::I8: v.i = load<int8_t>(p); break;
    case ValueType::U16: v.u = load<uint16_t>(p); break;
    case ValueType::I16: v.i = load<int16_t>(p); break;
    case ValueType::U32: v.u = load<uint32_t>(p); break;
    case ValueType::I32: v.i = load<int32_t>(p); break;
    case ValueType::U64: v.u = load<uint64_t>(p); break;
    case ValueType::I64: v.i = load<int64_t>(p); break;
    case ValueType::F32: v.f = load<float>(p); break;
    case ValueType::F64: v.f = load<double>(p); break;
    case ValueType::STRING:
    case ValueType::ARRAY: break;
  }
  // clang-format on
  return v;
}

std::string scalar_display(const Value& v) {
  if (is_unsigned_type(v.type)) return fmt::format("{}", v.u);
  if (is_signed_type(v.type)) return fmt::format("{}", v.i);
  if (v.type == ValueType::F32) return fmt::format("{}", (float)v.f);
  if (v.type == ValueType::F64) return fmt::format("{}", v.f);
  if (v.type == ValueType::BOOL) return v.u ? "true" : "false";
  return fmt::format("\"{}\"", escape(v.s, 120));
}

}  // namespace

bool Value::is_integer() const { return is_unsigned_type(type) || is_signed_type(type); }
bool Value::is_number() const { return is_integer() || is_float_type(type); }

int64_t Value::as_int() const {
  if (is_signed_type(type)) return i;
  if (is_unsigned_type(type) || type == ValueType::BOOL) {
    if (u > (uint64_t)INT64_MAX) fail("value {} does not fit a signed 64-bit integer", u);
    return (int64_t)u;
  }
  fail("expected an integer, found a {} value", value_type_name(type));
}

double Value::as_float() const {
  if (is_float_type(type)) return f;
  if (is_unsigned_type(type)) return (double)u;
  if (is_signed_type(type)) return (double)i;
  fail("expected a number, found a {} value", value_type_name(type));
}

bool Value::as_bool() const {
  if (type != ValueType::BOOL) fail("expected a bool, found a {} value", value_type_name(type));
  return u != 0;
}

const std::string& Value::as_string() const {
  if (type != ValueType::STRING) fail("expected a string, found a {} value", value_type_name(type));
  return s;
}

double Value::number_at(uint64_t idx) const {
  const Value v = element(*this, idx);
  return v.type == ValueType::BOOL ? (double)v.u : v.as_float();
}

int64_t Value::int_at(uint64_t idx) const {
  const Value v = element(*this, idx);
  if (is_float_type(v.type)) fail("expected an integer array, found an array of {}", value_type_name(v.type));
  return v.as_int();
}

std::string Value::to_display(size_t max_items) const {
  if (type != ValueType::ARRAY) return scalar_display(*this);
  std::string out = "[";
  const uint64_t shown = std::min<uint64_t>(count, max_items);
  for (uint64_t k = 0; k < shown; ++k) {
    if (k) out += ", ";
    if (is_fixed_size(elem)) {
      out += scalar_display(element(*this, k));
    } else if (elem == ValueType::STRING) {
      out += fmt::format("\"{}\"", escape(strings[k], 60));
    } else {
      out += items[k].to_display(max_items);
    }
  }
  if (shown < count) out += fmt::format(", ... ({} {} in all)", count, value_type_name(elem));
  return out + "]";
}

Value Value::of_uint(ValueType t, uint64_t v) {
  if (!is_unsigned_type(t)) fail("Value::of_uint: {} is not an unsigned integer type", value_type_name(t));
  const size_t bits = value_type_size(t) * 8;
  if (bits < 64 && (v >> bits) != 0) fail("Value::of_uint: {} does not fit {}", v, value_type_name(t));
  Value r;
  r.type = t;
  r.u = v;
  return r;
}

Value Value::of_int(ValueType t, int64_t v) {
  if (!is_signed_type(t)) fail("Value::of_int: {} is not a signed integer type", value_type_name(t));
  const size_t bits = value_type_size(t) * 8;
  if (bits < 64 && (v < -(int64_t{1} << (bits - 1)) || v >= (int64_t{1} << (bits - 1)))) {
    fail("Value::of_int: {} does not fit {}", v, value_type_name(t));
  }
  Value r;
  r.type = t;
  r.i = v;
  return r;
}

Value Value::of_float(ValueType t, double v) {
  if (!is_float_type(t)) fail("Value::of_float: {} is not a float type", value_type_name(t));
  Value r;
  r.type = t;
  r.f = t == ValueType::F32 ? (double)(float)v : v;
  return r;
}

Value Value::of_bool(bool v) {
  Value r;
  r.type = ValueType::BOOL;
  r.u = v ? 1 : 0;
  return r;
}

Value Value::of_string(std::string v) {
  Value r;
  r.type = ValueType::STRING;
  r.s = std::move(v);
  return r;
}

Value Value::of_numbers(ValueType elem, const void* data, uint64_t count) {
  if (!is_fixed_size(elem)) fail("Value::of_numbers: {} is not a numeric type", value_type_name(elem));
  Value r;
  r.type = ValueType::ARRAY;
  r.elem = elem;
  r.count = count;
  const auto* p = static_cast<const uint8_t*>(data);
  r.owned.assign(p, p + count * value_type_size(elem));
  return r;
}

Value Value::of_strings(std::vector<std::string> v) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem = ValueType::STRING;
  r.count = v.size();
  r.strings = std::move(v);
  return r;
}

Value Value::of_arrays(std::vector<Value> items) {
  for (const Value& item : items) {
    if (item.type != ValueType::ARRAY) {
      fail("Value::of_arrays: every item must be an ARRAY, found a {}", value_type_name(item.type));
    }
  }
  Value r;
  r.type = ValueType::ARRAY;
  r.elem = ValueType::ARRAY;
  r.count = items.size();
  r.items = std::move(items);
  return r;
}

}  // namespace xpert::gguf
