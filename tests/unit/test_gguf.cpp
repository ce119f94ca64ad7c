// GGUF reader and writer: round trips, the real Gemma 3 270M test model, interop with the Python `gguf` package,
// and hostile files built byte by byte (each must give one Error naming the file and the problem).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>

#include "base/error.h"
#include "format/gguf.h"

namespace xpert::gguf {
namespace {

// ---- helpers ----

// A GGUF image assembled field by field, for files no honest writer would produce.
struct Raw {
  std::vector<uint8_t> b;

  template <typename T>
  Raw& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Raw& u8(uint8_t v) { return put(v); }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32((uint32_t)ValueType::U32).u32(v); }
  Raw& kv_str(std::string_view key, std::string_view v) {
    return str(key).u32((uint32_t)ValueType::STRING).str(v);
  }
  Raw& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32((uint32_t)dims.size());
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t alignment = 32) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

std::unique_ptr<GGUFFile> parse(const std::vector<uint8_t>& b, const std::string& name = "test.gguf") {
  return GGUFFile::parse(b.data(), b.size(), name);
}

// Parsing must throw Error, its message must start with the file name and contain every word.
void expect_rejected(const std::vector<uint8_t>& b, std::initializer_list<std::string_view> words) {
  // An exact-size heap copy, so a sanitizer build would catch any read past the end.
  const std::vector<uint8_t> copy(b);
  try {
    GGUFFile::parse(copy.data(), copy.size(), "hostile.gguf");
    ADD_FAILURE() << "parsed without error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("hostile.gguf: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (std::string_view w : words) EXPECT_NE(m.find(w), std::string::npos) << "'" << w << "' not in: " << m;
  }
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = (uint8_t)(seed + k * 7);
  return v;
}

// A small valid file whose last tensor ends exactly at the end of the file (32 bytes, no padding after
// it), so that cutting it anywhere must be detected.
GGUFWriter small_writer() {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_f32_array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  w.set_strings("tokenizer.ggml.tokens", {"<s>", "a", ""});
  w.set("nested", Value::of_arrays({Value::of_strings({"x"}), Value::of_numbers(ValueType::U16, "\1\0", 1)}));
  const auto q = pattern(68, 1);
  w.add_tensor("blk.0.q8", DType::Q8_0, {32, 2}, q.data(), q.size());
  const auto f = pattern(32, 2);
  w.add_tensor("output_norm.weight", DType::F32, {8}, f.data(), f.size());
  return w;
}
std::vector<uint8_t> small_valid_file() { return small_writer().to_bytes(); }

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / (std::to_string(::getpid()) + "_" + name)).string();
}

bool python_gguf_available() {
  static const bool ok = std::system("python3 -c 'import gguf, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

int run_python(const std::string& script, const std::string& arg) {
  const std::string path = temp_path("check.py");
  std::ofstream(path) << script;
  const int rc = std::system(("python3 '" + path + "' '" + arg + "'").c_str());
  std::filesystem::remove(path);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// ---- round trips ----

TEST(GgufRoundTrip, EveryScalarType) {
  GGUFWriter w;
  w.set("u8", Value::of_uint(ValueType::U8, 200));
  w.set("i8", Value::of_int(ValueType::I8, -100));
  w.set("u16", Value::of_uint(ValueType::U16, 60000));
  w.set("i16", Value::of_int(ValueType::I16, -30000));
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set_u64("u64", (uint64_t{1} << 63) + 5);
  w.set("i64", Value::of_int(ValueType::I64, -(int64_t{1} << 62)));
  w.set_f32("f32", 1.5f);
  w.set("f64", Value::of_float(ValueType::F64, std::numbers::pi));
  w.set_bool("bool_t", true);
  w.set_bool("bool_f", false);
  w.set_string("str", std::string("h\xc3\xa9llo\n\0x", 9));
  w.set_string("empty", "");
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);

  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), 14u);
  const char* order[] = {"u8",  "i8",  "u16", "i16",    "u32",    "i32", "u64",
                         "i64", "f32", "f64", "bool_t", "bool_f", "str", "empty"};
  for (size_t k = 0; k < 14; ++k) EXPECT_EQ(f->metadata()[k].first, order[k]);

  EXPECT_EQ(f->find("u8")->type, ValueType::U8);
  EXPECT_EQ(f->require_int("u8"), 200);
  EXPECT_EQ(f->find("i8")->type, ValueType::I8);
  EXPECT_EQ(f->require_int("i8"), -100);
  EXPECT_EQ(f->require_int("u16"), 60000);
  EXPECT_EQ(f->find("u16")->type, ValueType::U16);
  EXPECT_EQ(f->require_int("i16"), -30000);
  EXPECT_EQ(f->find("i16")->type, ValueType::I16);
  EXPECT_EQ(f->require_int("u32"), 4000000000);
  EXPECT_EQ(f->require_int("i32"), -2000000000);
  EXPECT_EQ(f->find("u64")->type, ValueType::U64);
  EXPECT_EQ(f->find("u64")->u, (uint64_t{1} << 63) + 5);
  EXPECT_THROW(f->require_int("u64"), Error);  // does not fit int64: said, not wrapped
  EXPECT_EQ(f->require_int("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(f->find("f32")->type, ValueType::F32);
  EXPECT_EQ(f->require_float("f32"), 1.5);
  EXPECT_EQ(f->find("f64")->type, ValueType::F64);
  EXPECT_EQ(f->require_float("f64"), std::numbers::pi);
  EXPECT_EQ(f->get_bool("bool_t"), true);
  EXPECT_EQ(f->get_bool("bool_f"), false);
  EXPECT_EQ(f->require_string("str"), std::string("h\xc3\xa9llo\n\0x", 9));
  EXPECT_EQ(f->require_string("empty"), "");
  EXPECT_EQ(f->require_float("u32"), 4000000000.0);  // integers read as floats
  EXPECT_EQ(f->tensors().size(), 0u);
}

TEST(GgufRoundTrip, NumericAndStringArrays) {
  GGUFWriter w;
  const uint8_t u8s[] = {0, 1, 255};
  const int8_t i8s[] = {-128, 0, 127};
  const uint16_t u16s[] = {0, 65535};
  const int16_t i16s[] = {-32768, 32767};
  const uint32_t u32s[] = {0, 4294967295u};
  const uint64_t u64s[] = {1, uint64_t{1} << 40};
  const int64_t i64s[] = {-(int64_t{1} << 50), 7};
  const double f64s[] = {0.25, -1e300};
  const uint8_t bools[] = {1, 0, 1};
  w.set("a.u8", Value::of_numbers(ValueType::U8, u8s, 3));
  w.set("a.i8", Value::of_numbers(ValueType::I8, i8s, 3));
  w.set("a.u16", Value::of_numbers(ValueType::U16, u16s, 2));
  w.set("a.i16", Value::of_numbers(ValueType::I16, i16s, 2));
  w.set("a.u32", Value::of_numbers(ValueType::U32, u32s, 2));
  w.set_i32_array("a.i32", {-5, 0, 1 << 30});
  w.set("a.u64", Value::of_numbers(ValueType::U64, u64s, 2));
  w.set("a.i64", Value::of_numbers(ValueType::I64, i64s, 2));
  w.set_f32_array("a.f32", {1.0f, -2.5f, 3e38f});
  w.set("a.f64", Value::of_numbers(ValueType::F64, f64s, 2));
  w.set("a.bool", Value::of_numbers(ValueType::BOOL, bools, 3));
  w.set_strings("a.str", {"", "one", std::string("t\0o", 3), "\xe2\x96\x81the"});
  w.set_f32_array("a.empty", {});
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);

  const Value& a8 = *f->find("a.u8");
  EXPECT_EQ(a8.type, ValueType::ARRAY);
  EXPECT_EQ(a8.elem, ValueType::U8);
  ASSERT_EQ(a8.count, 3u);
  EXPECT_EQ(a8.int_at(2), 255);
  // Zero copy: numeric arrays point into the image.
  EXPECT_GE(a8.raw, bytes.data());
  EXPECT_LT(a8.raw, bytes.data() + bytes.size());
  EXPECT_EQ(f->find("a.i8")->int_at(0), -128);
  EXPECT_EQ(f->find("a.i8")->int_at(2), 127);
  EXPECT_EQ(f->find("a.u16")->int_at(1), 65535);
  EXPECT_EQ(f->find("a.i16")->int_at(0), -32768);
  EXPECT_EQ(f->find("a.u32")->int_at(1), 4294967295);
  EXPECT_EQ(f->find("a.i32")->int_at(2), 1 << 30);
  EXPECT_EQ(f->find("a.i32")->int_at(0), -5);
  EXPECT_EQ(f->find("a.u64")->int_at(1), int64_t{1} << 40);
  EXPECT_EQ(f->find("a.i64")->int_at(0), -(int64_t{1} << 50));
  EXPECT_EQ(f->find("a.f32")->number_at(1), -2.5);
  EXPECT_EQ(f->find("a.f32")->number_at(2), (double)3e38f);
  EXPECT_EQ(f->find("a.f64")->number_at(1), -1e300);
  EXPECT_EQ(f->find("a.bool")->elem, ValueType::BOOL);
  EXPECT_EQ(f->find("a.bool")->int_at(1), 0);
  EXPECT_EQ(f->find("a.bool")->int_at(2), 1);
  EXPECT_THROW(f->find("a.f32")->int_at(0), Error);
  EXPECT_THROW(f->find("a.i32")->number_at(3), Error);  // out of range
  EXPECT_THROW(f->find("a.str")->number_at(0), Error);

  const Value& s = *f->find("a.str");
  EXPECT_EQ(s.elem, ValueType::STRING);
  ASSERT_EQ(s.strings.size(), 4u);
  EXPECT_EQ(s.strings[0], "");
  EXPECT_EQ(s.strings[2], std::string("t\0o", 3));
  EXPECT_EQ(s.strings[3], "\xe2\x96\x81the");
  EXPECT_EQ(f->find("a.empty")->count, 0u);
  EXPECT_EQ(f->find("a.empty")->elem, ValueType::F32);

  EXPECT_EQ(f->find("a.i32")->to_display(), "[-5, 0, 1073741824]");
  EXPECT_EQ(f->find("a.i32")->to_display(2), "[-5, 0, ... (3 I32 in all)]");
  EXPECT_EQ(f->find("a.str")->to_display(2), "[\"\", \"one\", ... (4 STRING in all)]");
}

TEST(GgufRoundTrip, NestedArrays) {
  GGUFWriter w;
  const int32_t a[] = {1, 2, 3};
  const float b[] = {4.5f};
  w.set("nest.mixed",
        Value::of_arrays({Value::of_numbers(ValueType::I32, a, 3), Value::of_numbers(ValueType::F32, b, 1),
                          Value::of_strings({"x", "yz"}), Value::of_strings({})}));
  w.set("nest.deep",
        Value::of_arrays({Value::of_arrays({Value::of_arrays({Value::of_numbers(ValueType::I32, a, 2)})}),
                          Value::of_arrays({})}));
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);

  const Value& m = *f->find("nest.mixed");
  EXPECT_EQ(m.elem, ValueType::ARRAY);
  ASSERT_EQ(m.items.size(), 4u);
  EXPECT_EQ(m.items[0].elem, ValueType::I32);
  EXPECT_EQ(m.items[0].int_at(2), 3);
  EXPECT_EQ(m.items[1].number_at(0), 4.5);
  EXPECT_EQ(m.items[2].strings, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(m.items[3].count, 0u);
  EXPECT_EQ(m.to_display(), "[[1, 2, 3], [4.5], [\"x\", \"yz\"], []]");

  const Value& d = *f->find("nest.deep");
  ASSERT_EQ(d.items.size(), 2u);
  ASSERT_EQ(d.items[0].items.size(), 1u);
  ASSERT_EQ(d.items[0].items[0].items.size(), 1u);
  EXPECT_EQ(d.items[0].items[0].items[0].int_at(1), 2);
  EXPECT_EQ(d.items[1].elem, ValueType::ARRAY);
  EXPECT_EQ(d.items[1].count, 0u);

  // Re-writing what was read (arrays that point into the image) gives the same bytes.
  GGUFWriter again;
  for (const auto& [key, v] : f->metadata()) again.set(key, v);
  EXPECT_EQ(again.to_bytes(), bytes);
}

TEST(GgufRoundTrip, TensorsShapesTypesAndAlignment) {
  for (size_t alignment : {size_t{32}, size_t{1}, size_t{64}, size_t{4096}}) {
    SCOPED_TRACE(alignment);
    GGUFWriter w(alignment);
    w.set_string("general.architecture", "test");
    struct Spec {
      const char* name;
      DType type;
      std::vector<int64_t> shape;
      size_t n_bytes;
    };
    const Spec specs[] = {
        {"f32", DType::F32, {5}, 20},
        {"f16", DType::F16, {3, 4}, 24},
        {"bf16", DType::BF16, {2, 1, 3}, 12},
        {"q4_0", DType::Q4_0, {64, 2}, 4 * 18},
        {"q8_0", DType::Q8_0, {32, 2, 2, 2}, 8 * 34},
        {"q4_k", DType::Q4_K, {256, 3}, 3 * 144},
        {"q6_k", DType::Q6_K, {512, 1, 1}, 2 * 210},
        {"i32", DType::I32, {1}, 4},
    };
    for (size_t k = 0; k < std::size(specs); ++k) {
      const auto data = pattern(specs[k].n_bytes, (uint8_t)k);
      w.add_tensor(specs[k].name, specs[k].type, specs[k].shape, data.data(), data.size());
    }
    const auto bytes = w.to_bytes();
    const auto f = parse(bytes);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    EXPECT_EQ(f->find("general.alignment") != nullptr, alignment != 32);
    ASSERT_EQ(f->tensors().size(), std::size(specs));
    for (size_t k = 0; k < std::size(specs); ++k) {
      const TensorInfo& t = f->tensors()[k];
      EXPECT_EQ(t.name, specs[k].name);
      EXPECT_EQ(f->tensor(specs[k].name), &t);
      EXPECT_EQ(t.type, specs[k].type);
      EXPECT_EQ(t.shape, specs[k].shape);
      EXPECT_EQ(t.n_bytes, specs[k].n_bytes);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ((size_t)(t.data - bytes.data()) % alignment, 0u);
      EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), pattern(specs[k].n_bytes, (uint8_t)k));
    }
    EXPECT_EQ(f->tensor("f16")->n_elements(), 12);
    EXPECT_EQ(f->tensor("nope"), nullptr);
  }
}

// Found by the fuzzer: a file without tensors may name any power-of-two alignment; rewriting it must not pad
// its index out to that alignment (2^30 here: a GiB of zeros).
TEST(GgufRoundTrip, NoTensorsNoPaddingWhateverTheAlignment) {
  GGUFWriter w(size_t{1} << 30);
  w.set_string("general.architecture", "test");
  const auto bytes = w.to_bytes();
  EXPECT_LT(bytes.size(), 256u);
  const auto f = parse(bytes);
  EXPECT_EQ(f->alignment(), size_t{1} << 30);
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufRoundTrip, WriteAndOpenAFile) {
  const auto bytes = small_valid_file();
  const std::string path = temp_path("small.gguf");
  const GGUFWriter w = small_writer();
  w.write(path);
  {
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(on_disk, bytes);
  }
  const auto f = GGUFFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->file_size(), bytes.size());
  EXPECT_EQ(f->require_string("general.architecture"), "llama");
  const TensorInfo* last = f->tensor("output_norm.weight");
  EXPECT_EQ(f->data_offset() + last->offset + last->n_bytes, f->file_size());
  EXPECT_EQ(std::vector<uint8_t>(last->data, last->data + 32), pattern(32, 2));
  std::filesystem::remove(path);

  try {
    GGUFFile::open(path);
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.write("/nonexistent-dir/x.gguf"), Error);
}

TEST(GgufRoundTrip, SetReplacesInPlaceAndGettersCheckTypes) {
  GGUFWriter w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_u32("a", 2);
  const auto f = parse(w.to_bytes(), "g.gguf");
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].first, "a");
  EXPECT_EQ(f->require_int("a"), 2);

  EXPECT_EQ(f->get_string("missing"), std::nullopt);
  EXPECT_EQ(f->get_int("missing"), std::nullopt);
  try {
    f->require_string("missing.key");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "g.gguf: metadata key 'missing.key' is missing (expected a string)");
  }
  try {
    f->require_string("a");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "g.gguf: metadata key 'a' has type U32 (expected a string)");
  }
  EXPECT_THROW(f->require_int("b"), Error);
  EXPECT_THROW(f->get_bool("a"), Error);
  EXPECT_THROW(f->require_float("b"), Error);
}

TEST(GgufWriter, RefusesBadInput) {
  GGUFWriter w;
  const auto d = pattern(64, 0);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {8}, d.data(), 31), Error);     // wrong byte count
  EXPECT_THROW(w.add_tensor("t", DType::Q4_K, {128}, d.data(), 72), Error);  // not a whole block
  EXPECT_THROW(w.add_tensor("t", DType::F32, {}, d.data(), 0), Error);       // no dims
  EXPECT_THROW(w.add_tensor("t", DType::F32, {1, 1, 1, 1, 1}, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {0}, d.data(), 0), Error);
  EXPECT_THROW(w.add_tensor("", DType::F32, {1}, d.data(), 4), Error);
  w.add_tensor("t", DType::F32, {16}, d.data(), 64);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {16}, d.data(), 64), Error);  // twice
  EXPECT_THROW(w.set("", Value::of_bool(true)), Error);
  EXPECT_THROW(Value::of_uint(ValueType::U8, 256), Error);
  EXPECT_THROW(Value::of_int(ValueType::I16, 40000), Error);
  EXPECT_THROW(Value::of_uint(ValueType::I32, 1), Error);
  EXPECT_THROW(Value::of_arrays({Value::of_bool(true)}), Error);
  EXPECT_THROW(GGUFWriter(3).to_bytes(), Error);
  EXPECT_THROW(GGUFWriter(0).to_bytes(), Error);
  GGUFWriter conflicting(64);
  conflicting.set_u32("general.alignment", 32);
  EXPECT_THROW(conflicting.to_bytes(), Error);
}

// ---- interop with the Python gguf package ----

TEST(GgufPython, PythonReadsOurFileAndWeReadTheirs) {
  if (!python_gguf_available()) GTEST_SKIP() << "python3 with the gguf package is not importable";
  GGUFWriter w(64);
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 3);
  w.set("u8", Value::of_uint(ValueType::U8, 7));
  w.set("i64", Value::of_int(ValueType::I64, -5));
  w.set("f64", Value::of_float(ValueType::F64, 0.125));
  w.set_bool("flag", true);
  w.set_f32_array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 2, 3});
  w.set_strings("tokenizer.ggml.tokens", {"<s>", "\xe2\x96\x81hi", ""});
  std::vector<float> f32(8 * 3);
  for (size_t k = 0; k < f32.size(); ++k) f32[k] = (float)k * 0.5f;
  w.add_tensor("a.weight", DType::F32, {8, 3}, f32.data(), f32.size() * 4);
  const auto q = pattern(2 * 34, 3);
  w.add_tensor("b.weight", DType::Q8_0, {64}, q.data(), q.size());
  const std::string path = temp_path("py_in.gguf");
  w.write(path);

  const char* check = R"PY(
import sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1])
f = r.fields
assert r.alignment == 64, r.alignment
assert f['general.architecture'].contents() == 'llama'
assert f['llama.block_count'].contents() == 3
assert f['u8'].contents() == 7 and f['i64'].contents() == -5 and f['f64'].contents() == 0.125
assert f['flag'].contents() == True
assert f['tokenizer.ggml.scores'].contents() == [0.5, -1.0, 2.0]
assert f['tokenizer.ggml.token_type'].contents() == [1, 2, 3]
assert f['tokenizer.ggml.tokens'].contents() == ['<s>', '\u2581hi', ''], f['tokenizer.ggml.tokens'].contents()
t = {x.name: x for x in r.tensors}
assert list(t) == ['a.weight', 'b.weight']
a = t['a.weight']
assert a.tensor_type == gguf.GGMLQuantizationType.F32 and list(a.shape) == [8, 3]
assert np.array_equal(a.data.reshape(-1), np.arange(24, dtype=np.float32) * 0.5)
b = t['b.weight']
assert b.tensor_type == gguf.GGMLQuantizationType.Q8_0 and list(b.shape) == [64]
assert bytes(b.data.tobytes()) == bytes((3 + k * 7) % 256 for k in range(68))
assert a.data_offset % 64 == 0 and b.data_offset % 64 == 0
)PY";
  EXPECT_EQ(run_python(check, path), 0) << "the Python gguf reader rejected or misread " << path;

  // The other direction: a file written by the Python GGUFWriter.
  const std::string theirs = temp_path("py_out.gguf");
  const char* make = R"PY(
import sys, numpy as np, gguf
w = gguf.GGUFWriter(sys.argv[1], 'llama')
w.add_uint32('llama.context_length', 4096)
w.add_float32('llama.rope.freq_base', 10000.0)
w.add_array('tokenizer.ggml.tokens', ['a', 'bc'])
w.add_array('tokenizer.ggml.scores', [0.25, 0.5])
w.add_tensor('tok.weight', np.arange(12, dtype=np.float32).reshape(3, 4))
w.add_tensor('h.weight', np.ones((2, 32), dtype=np.float16))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
)PY";
  ASSERT_EQ(run_python(make, theirs), 0) << "the Python gguf writer failed";
  const auto f = GGUFFile::open(theirs);
  EXPECT_EQ(f->require_string("general.architecture"), "llama");
  EXPECT_EQ(f->require_int("llama.context_length"), 4096);
  EXPECT_EQ(f->require_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->strings, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(f->find("tokenizer.ggml.scores")->number_at(1), 0.5);
  const TensorInfo* t = f->tensor("tok.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{4, 3}));  // ggml order: the row first
  float v11;
  std::memcpy(&v11, t->data + 11 * 4, 4);
  EXPECT_EQ(v11, 11.0f);
  ASSERT_NE(f->tensor("h.weight"), nullptr);
  EXPECT_EQ(f->tensor("h.weight")->type, DType::F16);
  EXPECT_EQ(f->tensor("h.weight")->shape, (std::vector<int64_t>{32, 2}));
  std::filesystem::remove(path);
  std::filesystem::remove(theirs);
}

// ---- the real Gemma 3 270M test model (models/gemma3-270m.gguf) ----

TEST(GgufModel, ReadsTheDefaultGemma3) {
  const char* src = std::getenv("XPERT_SOURCE_DIR");
  const std::string path = std::string(src ? src : XPERT_SOURCE_DIR) + "/models/gemma3-270m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  const auto f = GGUFFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 33u);
  EXPECT_EQ(f->tensors().size(), 236u);
  EXPECT_EQ(f->require_string("general.architecture"), "gemma3");
  const Value* tokens = f->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->elem, ValueType::STRING);
  EXPECT_EQ(tokens->strings.size(), 262144u);
  EXPECT_EQ(f->require_int("gemma3.block_count"), 18);
  const TensorInfo* emb = f->tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape.at(1), 262144);
  size_t bytes = 0;
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.offset % f->alignment(), 0u) << t.name;
    EXPECT_LE(f->data_offset() + t.offset + t.n_bytes, f->file_size()) << t.name;
    bytes += t.n_bytes;
  }
  EXPECT_GT(bytes, f->file_size() * 9 / 10);  // the index accounts for (nearly) the whole file
}

TEST(GgufModel, FuzzSeedCorpusParses) {
  const char* src = std::getenv("XPERT_SOURCE_DIR");
  const std::filesystem::path dir = std::filesystem::path(src ? src : XPERT_SOURCE_DIR) / "tests/fuzz/corpus";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".gguf") continue;
    EXPECT_NO_THROW(GGUFFile::open(entry.path().string())) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 3);
}

// ---- hostile input ----

TEST(GgufHostile, TruncatedAtEveryByteAlwaysThrows) {
  const auto full = small_valid_file();
  ASSERT_NO_THROW(parse(full));
  for (size_t n = 0; n < full.size(); ++n) {
    const std::vector<uint8_t> cut(full.begin(), full.begin() + (ptrdiff_t)n);
    EXPECT_THROW(GGUFFile::parse(cut.data(), cut.size(), "cut.gguf"), Error) << "cut at " << n;
  }
}

TEST(GgufHostile, TruncatedInsideTheIndexSaysTruncated) {
  const auto full = small_valid_file();
  for (size_t n : {size_t{6}, size_t{20}, size_t{30}, size_t{60}, size_t{100}}) {
    SCOPED_TRACE(n);
    expect_rejected(std::vector<uint8_t>(full.begin(), full.begin() + (ptrdiff_t)n), {"truncated"});
  }
}

TEST(GgufHostile, BadMagic) {
  auto b = small_valid_file();
  b[0] = 'X';
  expect_rejected(b, {"not a GGUF file", "XGUF"});
  expect_rejected({}, {"not a GGUF file"});
  expect_rejected({'G', 'G'}, {"not a GGUF file"});
}

TEST(GgufHostile, UnsupportedVersions) {
  expect_rejected(Raw().header(0, 0, 1).b, {"version 1", "not supported", "2 or 3"});
  expect_rejected(Raw().header(0, 0, 99).b, {"unsupported GGUF version 99", "2 or 3"});
  expect_rejected(Raw().header(0, 0, 0x03000000).b, {"big-endian"});
  EXPECT_EQ(parse(Raw().header(0, 1, 2).kv_u32("a", 5).b)->version(), 2u);  // v2 is read like v3
}

TEST(GgufHostile, HugeCounts) {
  expect_rejected(Raw().header(0, ~uint64_t{0}).b, {"metadata count", "cannot fit"});
  expect_rejected(Raw().header(uint64_t{1} << 60, 0).zeros(100).b, {"tensor count", "cannot fit"});
  expect_rejected(Raw().header(0, 1).str("k").u32((uint32_t)ValueType::STRING).u64(~uint64_t{0}).b,
                  {"metadata 'k'", "string value has length 18446744073709551615"});
  expect_rejected(Raw().header(0, 1).u64(uint64_t{1} << 62).zeros(16).b, {"key has length"});
  expect_rejected(Raw()
                      .header(0, 1)
                      .str("k")
                      .u32((uint32_t)ValueType::ARRAY)
                      .u32((uint32_t)ValueType::U64)
                      .u64(uint64_t{1} << 61)
                      .zeros(64)
                      .b,
                  {"metadata 'k'", "array of 2305843009213693952 U64", "bytes are left"});
  expect_rejected(Raw()
                      .header(0, 1)
                      .str("k")
                      .u32((uint32_t)ValueType::ARRAY)
                      .u32((uint32_t)ValueType::STRING)
                      .u64(1000)
                      .zeros(64)
                      .b,
                  {"array of 1000 STRING"});
  expect_rejected(Raw()
                      .header(0, 1)
                      .str("k")
                      .u32((uint32_t)ValueType::ARRAY)
                      .u32((uint32_t)ValueType::ARRAY)
                      .u64(~uint64_t{0})
                      .b,
                  {"array of 18446744073709551615 ARRAY"});
}

TEST(GgufHostile, BadValueTypes) {
  expect_rejected(Raw().header(0, 1).str("k").u32(13).u32(0).b, {"metadata 'k'", "unknown value type 13"});
  expect_rejected(Raw().header(0, 1).str("k").u32((uint32_t)ValueType::ARRAY).u32(77).u64(0).b,
                  {"unknown array element type 77"});
  expect_rejected(Raw().header(0, 1).str("k").u32((uint32_t)ValueType::BOOL).u8(2).b, {"bool value is 2"});
  expect_rejected(Raw().header(0, 1).str("").u32((uint32_t)ValueType::U8).u8(0).zeros(8).b, {"empty key"});
  // Arrays of arrays nested far too deep: refused before the recursion gets deep.
  Raw deep;
  deep.header(0, 1).str("k").u32((uint32_t)ValueType::ARRAY);
  for (int k = 0; k < 1000; ++k) deep.u32((uint32_t)ValueType::ARRAY).u64(1);
  deep.u32((uint32_t)ValueType::U8).u64(0);
  expect_rejected(deep.b, {"nested more than"});
  // Many (valid, empty) nested arrays: bounded, as each decodes to a Value ~15x its size on disk.
  Raw wide;
  wide.header(0, 1)
      .str("k")
      .u32((uint32_t)ValueType::ARRAY)
      .u32((uint32_t)ValueType::ARRAY)
      .u64((1 << 20) + 1);
  for (int k = 0; k < (1 << 20) + 1; ++k) wide.u32((uint32_t)ValueType::U8).u64(0);
  expect_rejected(wide.b, {"items in arrays of arrays"});
}

TEST(GgufHostile, DuplicateKeyAndTensor) {
  expect_rejected(Raw().header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).b,
                  {"metadata 'a.b'", "duplicate metadata key"});
  // Hostile names are escaped in messages, so an Error stays one printable line.
  expect_rejected(Raw().header(0, 2).kv_u32("\x01\nk", 1).kv_u32("\x01\nk", 2).b,
                  {"metadata '\\x01\\nk'", "duplicate metadata key"});
  expect_rejected(Raw().header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64).b,
                  {"tensor 'w'", "duplicate tensor name"});
}

TEST(GgufHostile, BadAlignment) {
  expect_rejected(Raw().header(0, 1).kv_u32("general.alignment", 0).b,
                  {"general.alignment", "power of two", "0"});
  expect_rejected(Raw().header(0, 1).kv_u32("general.alignment", 3).b,
                  {"general.alignment", "power of two", "3"});
  expect_rejected(Raw().header(0, 1).kv_str("general.alignment", "32").b,
                  {"general.alignment", "U32", "STRING"});
  ASSERT_NO_THROW(parse(Raw().header(0, 1).kv_u32("general.alignment", 1u << 31).b));
}

TEST(GgufHostile, BadTensorInfo) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data_bytes) {
    return Raw().header(1, 0).tensor("w", std::move(dims), type, offset).pad().zeros(data_bytes).b;
  };
  ASSERT_NO_THROW(parse(one({8}, 0, 0, 32)));
  expect_rejected(one({1, 1, 1, 1, 1}, 0, 0, 32), {"tensor 'w'", "5 dimensions", "1 to 4"});
  expect_rejected(one({}, 0, 0, 32), {"tensor 'w'", "0 dimensions"});
  expect_rejected(one({8, 0}, 0, 0, 32), {"tensor 'w'", "dimension 1 is 0", "positive"});
  expect_rejected(one({(uint64_t)-8}, 0, 0, 32), {"dimension 0 is -8"});
  expect_rejected(one({uint64_t{1} << 62, uint64_t{1} << 62}, 0, 0, 32), {"overflows"});
  expect_rejected(one({uint64_t{1} << 62}, 0, 0, 32), {"byte size", "overflows"});  // 2^62 F32 = 2^64 bytes
  expect_rejected(one({8}, 99, 0, 32), {"tensor 'w'", "unknown tensor type 99"});
  expect_rejected(one({256}, 4, 0, 512), {"unknown tensor type 4"});  // removed Q4_2
  expect_rejected(one({100}, (uint32_t)DType::Q4_K, 0, 512), {"row length 100", "Q4_K", "block size 256"});
  expect_rejected(one({8}, 0, 4, 64), {"data offset 4", "not a multiple of the alignment 32"});
  expect_rejected(one({8}, 0, 0, 31), {"tensor 'w'", "past the end of the file"});
  expect_rejected(one({8}, 0, ~uint64_t{0} - 31, 32), {"past the end of the file"});  // offset + size wraps
  expect_rejected(Raw().header(1, 0).tensor("", {8}, 0, 0).pad().zeros(32).b, {"empty tensor name"});
}

TEST(GgufHostile, OverlappingTensors) {
  expect_rejected(Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(64).b,
                  {"'a'", "'b'", "overlap"});
  // Touching is fine.
  ASSERT_NO_THROW(parse(Raw().header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(64).b));
}

TEST(GgufHostile, EveryMessageNamesTheFile) {
  auto b = small_valid_file();
  b[4] = 9;  // version
  try {
    GGUFFile::parse(b.data(), b.size(), "/models/x.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "/models/x.gguf: unsupported GGUF version 9 (expected version 2 or 3)");
  }
}

}  // namespace
}  // namespace xpert::gguf
