// GGUF (v2 and v3) as llama.cpp writes it: a header, typed metadata key/values, a tensor index, then the
// aligned tensor data. GGUFFile maps the file and indexes it; nothing is copied (tensor data and
// numeric arrays point into the map). Every count, length and offset is checked against the file's
// size before use, so a truncated or hostile file gives one clear Error and never a huge allocation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/mmap_file.h"
#include "quant/dtype.h"

namespace xpert::gguf {

inline constexpr size_t kDefaultAlignment = 32;  // when general.alignment is absent
inline constexpr size_t kMaxDims = 4;
// Arrays of arrays are legal but rare; a bound keeps the reader's recursion (and stack) small on hostile
// input. A top-level array is level 1.
inline constexpr int kMaxArrayDepth = 8;

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Scalars are held by value; a numeric array points into the map (`raw`, `count`
// elements of `elem`); a string array is decoded into `strings`; an array of arrays into `items`.
struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;   // unsigned integers and bool
  int64_t i = 0;    // signed integers
  double f = 0;     // F32 / F64
  std::string s;    // STRING
  ValueType elem = ValueType::U8;  // ARRAY element type
  uint64_t count = 0;              // ARRAY element count
  const uint8_t* raw = nullptr;    // ARRAY of numbers: little-endian elements in the map, or
  std::vector<uint8_t> owned;      //   owned here (values built by GGUFWriter); see array_data()
  std::vector<std::string> strings;  // ARRAY of STRING
  std::vector<Value> items;          // ARRAY of ARRAY (nested)

  const uint8_t* array_data() const { return raw ? raw : owned.data(); }
  bool is_integer() const;
  bool is_number() const;
  int64_t as_int() const;      // any integer or bool; throws Error otherwise
  double as_float() const;     // any number
  bool as_bool() const;
  const std::string& as_string() const;
  // Numeric array element i as a double / int64 (any numeric element type).
  double number_at(uint64_t idx) const;
  int64_t int_at(uint64_t idx) const;
  std::string to_display(size_t max_items = 8) const;  // for `xpert info`

  // Builders, for GGUFWriter::set. Arrays copy their elements (numbers as little-endian bytes).
  static Value of_uint(ValueType t, uint64_t v);  // U8 U16 U32 U64
  static Value of_int(ValueType t, int64_t v);    // I8 I16 I32 I64
  static Value of_float(ValueType t, double v);   // F32 F64
  static Value of_bool(bool v);
  static Value of_string(std::string v);
  // `count` elements of a numeric (or BOOL) `elem` type, read from `data` in host (little-endian) order.
  static Value of_numbers(ValueType elem, const void* data, uint64_t count);
  static Value of_strings(std::vector<std::string> v);
  static Value of_arrays(std::vector<Value> items);  // every item must itself be an ARRAY
};

// Bytes of one element of a fixed-size type (0 for STRING and ARRAY, which have no fixed size).
size_t value_type_size(ValueType t);

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the contiguous (row) dimension
  uint64_t offset = 0;         // from the start of the data section
  size_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the map
  int64_t n_elements() const;
};

class GGUFFile {
 public:
  // Maps and parses; throws Error ("<path>: <what is wrong>") for anything malformed.
  static std::unique_ptr<GGUFFile> open(const std::string& path);
  // Parses an in-memory image (the fuzz target and tests); `data` must outlive the object.
  static std::unique_ptr<GGUFFile> parse(const uint8_t* data, size_t size, const std::string& name);
  // A file assembled in memory (the Hugging Face loader, format/hf_*): metadata and tensors whose `data`
  // point into mappings or buffers that `owner` keeps alive. Names must be unique (Error otherwise).
  static std::unique_ptr<GGUFFile> assemble(std::string name, std::vector<std::pair<std::string, Value>> kv,
                                            std::vector<TensorInfo> tensors, std::shared_ptr<const void> owner);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }
  const std::string& path() const { return name_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Typed getters: `require_*` throw Error naming the key when it is missing or of the wrong type.
  std::string require_string(std::string_view key) const;
  int64_t require_int(std::string_view key) const;
  double require_float(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;

 private:
  GGUFFile() = default;
  void parse_all();

  std::unique_ptr<MappedFile> map_;
  std::shared_ptr<const void> owner_;  // assembled files: what the tensors point into
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Writes GGUF v3. Metadata keeps insertion order; tensors are aligned to `alignment`.
class GGUFWriter {
 public:
  explicit GGUFWriter(size_t alignment = kDefaultAlignment) : alignment_(alignment) {}
  void set(const std::string& key, Value v);  // replaces an existing key
  void set_string(const std::string& key, const std::string& v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_strings(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // shape in ggml order; bytes must equal row_bytes(type, shape[0]) * rows. The data is copied.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape, const void* data,
                  size_t n_bytes);
  void write(const std::string& path) const;   // throws Error on I/O failure
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  void serialize(const std::function<void(const void*, size_t)>& sink) const;  // the whole file, in order

  size_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace xpert::gguf
