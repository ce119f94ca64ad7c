#include "format/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"

namespace xpert::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and read in place");

namespace {

using nlohmann::json;

struct DTypeName {
  std::string_view name;
  DType type;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {"BOOL", DType::BOOL, 1}, {"U8", DType::U8, 1},           {"I8", DType::I8, 1},
    {"U16", DType::U16, 2},   {"I16", DType::I16, 2},         {"F16", DType::F16, 2},
    {"BF16", DType::BF16, 2}, {"U32", DType::U32, 4},         {"I32", DType::I32, 4},
    {"F32", DType::F32, 4},   {"U64", DType::U64, 8},         {"I64", DType::I64, 8},
    {"F64", DType::F64, 8},   {"F8_E4M3", DType::F8_E4M3, 1}, {"F8_E5M2", DType::F8_E5M2, 1},
};

const DTypeName* find_dtype(std::string_view s) {
  for (const DTypeName& d : kDTypes)
    if (d.name == s) return &d;
  return nullptr;
}

// Names come from the file: shown with anything unprintable escaped and long ones cut.
std::string printable(std::string_view s, size_t max_chars = 120) {
  std::string out;
  for (unsigned char ch : s) {
    if (out.size() >= max_chars) return out + "...";
    if (ch >= 0x20 && ch < 0x7f)
      out += (char)ch;
    else
      out += fmt::format("\\x{:02x}", ch);
  }
  return out;
}

// The deepest bracket nesting of a JSON text, counting only brackets outside strings. nlohmann parses
// iteratively, but a bound keeps a hostile header from building a huge tree of empty arrays.
int json_depth(std::string_view s) {
  int depth = 0, worst = 0;
  bool in_string = false, escaped = false;
  for (char ch : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      worst = std::max(worst, ++depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return worst;
}

bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

std::string_view dtype_name(DType t) {
  for (const DTypeName& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const DTypeName& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

int64_t Tensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->map_ = std::make_unique<MappedFile>(path);
  f->base_ = f->map_->data();
  f->size_ = f->map_->size();
  f->name_ = path;
  f->parse_all();
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                        const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->base_ = data;
  f->size_ = data ? size : 0;
  f->name_ = name;
  f->parse_all();
  return f;
}

void SafetensorsFile::parse_all() {
  if (size_ < 8) fail("{}: not a safetensors file (it is only {} bytes long)", name_, size_);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, base_, 8);
  if (header_bytes > size_ - 8)
    fail(
        "{}: header length {} is more than the {} bytes that follow it (truncated, or not a safetensors "
        "file)",
        name_, header_bytes, size_ - 8);
  if (header_bytes > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the {} byte limit", name_, header_bytes, kMaxHeaderBytes);
  if (header_bytes < 2 || base_[8] != '{')
    fail("{}: not a safetensors file (the header must be a JSON object)", name_);
  const std::string_view text(reinterpret_cast<const char*>(base_ + 8), (size_t)header_bytes);
  if (json_depth(text) > kMaxJsonDepth)
    fail("{}: header JSON nests deeper than {} levels (corrupt)", name_, kMaxJsonDepth);

  // Duplicate names are legal JSON that nlohmann would silently collapse; the callback sees each key.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    fail("{}: the header is not valid JSON: {}", name_, e.what());
  }
  if (!header.is_object()) fail("{}: the header must be a JSON object", name_);
  if (!duplicate.empty()) fail("{}: tensor '{}' appears twice in the header", name_, printable(duplicate));

  const size_t data_start = 8 + (size_t)header_bytes;
  const uint64_t data_bytes = size_ - data_start;
  tensors_.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ must be an object of strings", name_);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail("{}: __metadata__['{}'] must be a string, found {}", name_, printable(m.key()),
               m.value().type_name());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", name_, printable(key));
    if (key.empty()) fail("{}: a tensor has an empty name", name_);
    if (!v.is_object()) fail("{}: expected an object with dtype, shape and data_offsets", where);
    Tensor t;
    t.name = key;
    t.file = &name_;

    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) fail("{}: 'dtype' is missing or not a string", where);
    const DTypeName* d = find_dtype(dt->get<std::string>());
    if (!d) fail("{}: dtype '{}' is not supported", where, printable(dt->get<std::string>()));
    t.dtype = d->type;

    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) fail("{}: 'shape' is missing or not an array", where);
    if (sh->size() > kMaxDims)
      fail("{}: has {} dimensions (at most {} are supported)", where, sh->size(), kMaxDims);
    uint64_t n_elements = 1;
    for (const json& dim : *sh) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t)INT64_MAX)
        fail("{}: shape {} must hold non-negative integers", where, sh->dump());
      if (!mul_ok(n_elements, dim.get<uint64_t>(), n_elements) || n_elements > (uint64_t)INT64_MAX)
        fail("{}: the element count of shape {} overflows", where, sh->dump());
      t.shape.push_back((int64_t)dim.get<uint64_t>());
    }

    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail("{}: 'data_offsets' must be [begin, end] with non-negative integers", where);
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end) fail("{}: data_offsets [{}, {}] end before they begin", where, begin, end);
    if (end > data_bytes)
      fail("{}: data_offsets [{}, {}] reach past the {} data bytes of the file (truncated or corrupt)", where,
           begin, end, data_bytes);
    uint64_t want = 0;
    if (!mul_ok(n_elements, d->size, want) || want != end - begin)
      fail("{}: {} {} elements of shape {} need {} bytes, but data_offsets [{}, {}] span {}", where,
           n_elements, d->name, sh->dump(), n_elements * d->size, begin, end, end - begin);
    t.data = base_ + data_start + begin;
    t.n_bytes = (size_t)(end - begin);
    tensors_.push_back(std::move(t));
  }

  std::vector<const Tensor*> by_offset;  // empty tensors take no bytes and overlap nothing
  for (const Tensor& t : tensors_)
    if (t.n_bytes) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Tensor* a, const Tensor* b) { return a->data < b->data; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const Tensor& a = *by_offset[k - 1];
    const Tensor& b = *by_offset[k];
    if (a.data + a.n_bytes > b.data)
      fail("{}: tensors '{}' and '{}' overlap in the data section", name_, printable(a.name),
           printable(b.name));
  }
  for (size_t k = 0; k < tensors_.size(); ++k) index_.emplace(tensors_[k].name, k);
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- writing ----

std::vector<uint8_t> serialize(const std::vector<TensorBytes>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorBytes*> order;
  for (const TensorBytes& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const TensorBytes* a, const TensorBytes* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const TensorBytes* t : order) {
    header[t->name] = {{"dtype", dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->n_bytes}}};
    offset += t->n_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out(8 + text.size() + offset);
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* data = out.data() + 8 + text.size();
  for (const TensorBytes* t : order) {
    if (t->n_bytes) std::memcpy(data, t->data, t->n_bytes);
    data += t->n_bytes;
  }
  return out;
}

void write(const std::string& path, const std::vector<TensorBytes>& tensors,
           const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> bytes = serialize(tensors, metadata);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  if (!out) fail("cannot write {}", path);
}

// ---- Checkpoint ----

namespace {

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("cannot open {}", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  try {
    return json::parse(s.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", p.string(), e.what());
  }
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto c = std::make_unique<Checkpoint>();
  c->dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index_path)) {
    const json index = read_json(index_path);
    const std::string where = index_path.string();
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("{}: expected an object with a 'weight_map' object", where);
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail("{}: weight_map['{}'] must be a file name", where, printable(it.key()));
      const std::string file = it.value().get<std::string>();
      // Shards sit beside the index: a path that leaves the folder is refused.
      if (file.empty() || file.find('/') != std::string::npos || file.find('\\') != std::string::npos ||
          file == "." || file == "..")
        fail("{}: weight_map['{}'] = '{}' is not a plain file name in the folder", where, printable(it.key()),
             printable(file));
      weight_map[it.key()] = file;
      if (std::find(shards.begin(), shards.end(), file) == shards.end()) shards.push_back(file);
    }
    if (shards.empty()) fail("{}: weight_map is empty", where);
  } else if (fs::exists(root / "model.safetensors")) {
    shards.push_back("model.safetensors");
  } else {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.path().extension() == ".safetensors") shards.push_back(e.path().filename().string());
    if (ec) fail("{}: cannot list the folder: {}", dir, ec.message());
    if (shards.empty())
      fail("{}: no model.safetensors, model.safetensors.index.json or *.safetensors in this folder", dir);
    std::sort(shards.begin(), shards.end());
  }

  for (const std::string& s : shards) {
    c->files_.push_back(SafetensorsFile::open((root / s).string()));
    const SafetensorsFile& f = *c->files_.back();
    for (const Tensor& t : f.tensors()) {
      const auto [it, inserted] = c->index_.emplace(t.name, &t);
      if (!inserted)
        fail("{}: tensor '{}' is in both {} and {}", dir, printable(t.name), *it->second->file, f.path());
    }
  }
  for (const auto& [name, file] : weight_map) {
    const auto it = c->index_.find(name);
    if (it == c->index_.end())
      fail("{}: model.safetensors.index.json puts tensor '{}' in {}, which does not hold it", dir,
           printable(name), file);
    if (fs::path(*it->second->file).filename().string() != file)
      fail("{}: model.safetensors.index.json puts tensor '{}' in {}, but it is in {}", dir, printable(name),
           file, *it->second->file);
  }
  return c;
}

const Tensor* Checkpoint::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<const Tensor*> Checkpoint::tensors() const {
  std::vector<const Tensor*> out;
  out.reserve(index_.size());
  for (const auto& [name, t] : index_) out.push_back(t);
  return out;
}

}  // namespace xpert::safetensors
