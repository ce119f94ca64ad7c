// safetensors, the weight format of Hugging Face checkpoints: u64 little-endian header length N, N bytes
// of JSON {"name": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data; offsets are from the end of the header. Shapes are in
// PyTorch order (the last dimension is contiguous), the reverse of ggml's.
//
// SafetensorsFile maps a file and indexes it; nothing is copied (tensor data points into the map). The
// header is parsed with nlohmann-json after a bracket-depth scan, and every field is checked: dtype
// known, shape non-negative, element count x element size == end - begin without overflow, the range
// inside the file, tensors not overlapping. Anything malformed throws one Error naming the file and the
// tensor. Checkpoint opens a folder: model.safetensors, or the shards listed by
// model.safetensors.index.json ("weight_map": tensor -> shard file).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/mmap_file.h"

namespace xpert::safetensors {

// A header larger than this is refused before it is parsed (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100u << 20;
inline constexpr int kMaxJsonDepth = 16;  // real headers nest 3 deep
inline constexpr size_t kMaxDims = 8;

enum class DType { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2 };
std::string_view dtype_name(DType t);
size_t dtype_size(DType t);

struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;     // PyTorch order
  const uint8_t* data = nullptr;  // into the map
  size_t n_bytes = 0;
  const std::string* file = nullptr;  // the file it lives in, for messages
  int64_t n_elements() const;
  int64_t dim(size_t i) const { return i < shape.size() ? shape[i] : 1; }
};

class SafetensorsFile {
 public:
  // Maps and parses; throws Error ("<path>: <what is wrong>") for anything malformed.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory image (the fuzz target and tests); `data` must outlive the object.
  static std::unique_ptr<SafetensorsFile> parse(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return name_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse_all();

  std::unique_ptr<MappedFile> map_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// Writing, for tests and tools: tensors laid out back to back (larger element types first, so each stays
// aligned to its element size), the header padded with spaces to a multiple of 8 bytes.
struct TensorBytes {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t n_bytes = 0;
};
std::vector<uint8_t> serialize(const std::vector<TensorBytes>& tensors,
                               const std::map<std::string, std::string>& metadata = {});
void write(const std::string& path, const std::vector<TensorBytes>& tensors,
           const std::map<std::string, std::string>& metadata = {});  // throws Error on I/O failure

// All tensors of a checkpoint folder, across its shards.
class Checkpoint {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json (+ the shards it names). Throws Error.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Tensor* find(std::string_view name) const;
  // Every tensor, sorted by name.
  std::vector<const Tensor*> tensors() const;
  size_t n_files() const { return files_.size(); }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const Tensor*, std::less<>> index_;
};

}  // namespace xpert::safetensors
