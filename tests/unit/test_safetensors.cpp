// The safetensors reader on well-formed and hostile images: every malformed header gives one Error that
// names the file and the tensor, never a crash or a read outside the image; a folder's shards are indexed
// through model.safetensors.index.json.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/error.h"
#include "format/safetensors.h"

namespace xpert::safetensors {
namespace {

namespace fs = std::filesystem;

// An image from a header text and `data_bytes` bytes of data (0, 1, 2, ...).
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = (uint8_t)i;
  return out;
}

void expect_refused(const std::vector<uint8_t>& img, const std::vector<std::string>& parts) {
  try {
    SafetensorsFile::parse(img.data(), img.size(), "img.safetensors");
    ADD_FAILURE() << "parsed; expected an error containing '" << parts[0] << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("img.safetensors: ", 0), 0u) << what;
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what;
  }
}

TEST(Safetensors, ParsesTensorsInPlace) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  const std::vector<uint16_t> b = {0x3c00, 0xc000};
  const std::vector<uint8_t> img = serialize({{"a.weight", DType::F32, {2, 3}, a.data(), 24},
                                              {"b", DType::BF16, {2}, b.data(), 4},
                                              {"empty", DType::I32, {0, 5}, nullptr, 0}},
                                             {{"format", "pt"}});
  auto f = SafetensorsFile::parse(img.data(), img.size(), "x.safetensors");
  ASSERT_EQ(f->tensors().size(), 3u);
  const Tensor* t = f->find("a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::F32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->n_elements(), 6);
  EXPECT_EQ(std::memcmp(t->data, a.data(), 24), 0);
  EXPECT_GE(t->data, img.data());  // a pointer into the image, not a copy
  EXPECT_LT(t->data, img.data() + img.size());
  EXPECT_EQ((t->data - img.data()) % 8, 0);
  EXPECT_EQ(f->find("b")->n_bytes, 4u);
  EXPECT_EQ(f->find("empty")->n_bytes, 0u);
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(Safetensors, RefusesMalformedHeaders) {
  const std::string ok = R"("t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  EXPECT_NO_THROW(SafetensorsFile::parse(image("{" + ok + "}", 16).data(), 8 + ok.size() + 2 + 16, "img"));
  expect_refused({1, 2, 3}, {"only 3 bytes long"});
  {
    std::vector<uint8_t> img = image("{}", 0);
    const uint64_t huge = 1ull << 40;
    std::memcpy(img.data(), &huge, 8);
    expect_refused(img, {"header length 1099511627776 is more than the 2 bytes"});
  }
  expect_refused(image("[1, 2]", 0), {"must be a JSON object"});
  expect_refused(image("{\"t\": ", 0), {"not valid JSON"});
  expect_refused(image("{" + std::string(40, '[') + std::string(40, ']') + "}", 0), {"nests deeper"});
  expect_refused(
      image(
          R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
          16),
      {"tensor 't' appears twice"});
  expect_refused(image(R"({"t":[1]})", 0), {"tensor 't'", "expected an object"});
  expect_refused(image(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8),
                 {"tensor 't'", "'dtype' is missing"});
  expect_refused(image(R"({"t":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}})", 8),
                 {"tensor 't'", "dtype 'F4'"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                 {"tensor 't'", "non-negative"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
                 {"non-negative integers"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                 {"tensor 't'", "overflows"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
                 {"9 dimensions"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
                 {"'data_offsets' must be"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                 {"end before they begin"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 7),
                 {"tensor 't'", "reach past the 7"});
  expect_refused(image(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                 {"tensor 't'", "3 F32 elements of shape [3] need 12 bytes", "span 8"});
  expect_refused(
      image(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      {"tensors 'a' and 'b' overlap"});
  expect_refused(image(R"({"__metadata__":{"k":1}})", 0), {"__metadata__['k'] must be a string"});
  expect_refused(image(R"({"":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4), {"empty name"});
  expect_refused(image("{\"t\\u0001\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4),
                 {"tensor 't\\x01'"});
}

// Random corruptions of a valid image: each one parses or throws Error (run under the sanitizers too).
TEST(Safetensors, SurvivesRandomCorruption) {
  const std::vector<float> a(12, 1.0f);
  const std::vector<uint8_t> good = serialize({{"model.layers.0.w", DType::F32, {3, 4}, a.data(), 48},
                                               {"model.layers.0.b", DType::F16, {4}, a.data(), 8}});
  std::mt19937 rng(42);
  int parsed = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<uint8_t> img = good;
    const int edits = 1 + (int)(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % img.size();
      switch (rng() % 3) {
        case 0:
          img[at] = (uint8_t)rng();
          break;
        case 1:
          img[at] = "0123456789[]{}\",:-e"[rng() % 19];
          break;
        default:
          img.resize(at);
          break;
      }
      if (img.empty()) break;
    }
    try {
      auto f = SafetensorsFile::parse(img.data(), img.size(), "fuzz");
      for (const Tensor& t : f->tensors()) {
        ASSERT_GE(t.data, img.data());
        ASSERT_LE(t.data + t.n_bytes, img.data() + img.size());
      }
      ++parsed;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(parsed, 0);
}

struct Dir {
  fs::path path = fs::temp_directory_path() /
                  fmt::format("xpert_st_{}_{}",
                              ::testing::UnitTest::GetInstance()->current_test_info()->name(), getpid());
  Dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

TEST(Safetensors, CheckpointFollowsTheIndex) {
  Dir d;
  const std::vector<float> x(4, 2.0f);
  write((d.path / "a.safetensors").string(), {{"w1", DType::F32, {4}, x.data(), 16}});
  write((d.path / "b.safetensors").string(), {{"w2", DType::F32, {2, 2}, x.data(), 16}});
  std::ofstream(d.path / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 32}, "weight_map": {"w1": "a.safetensors", "w2": "b.safetensors"}})";
  auto ck = Checkpoint::open(d.path.string());
  EXPECT_EQ(ck->n_files(), 2u);
  ASSERT_NE(ck->find("w2"), nullptr);
  EXPECT_EQ(ck->find("w2")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(ck->tensors().size(), 2u);

  std::ofstream(d.path / "model.safetensors.index.json")
      << R"({"weight_map": {"w1": "b.safetensors", "w2": "b.safetensors"}})";
  try {
    Checkpoint::open(d.path.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("puts tensor 'w1' in b.safetensors, which does not hold it"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map": {"w1": "/etc/passwd"}})";
  EXPECT_THROW(Checkpoint::open(d.path.string()), Error);
  std::ofstream(d.path / "model.safetensors.index.json")
      << R"({"weight_map": {"w1": "a.safetensors", "w2": "c.safetensors"}})";
  EXPECT_THROW(Checkpoint::open(d.path.string()), Error);  // c.safetensors does not exist
  write((d.path / "b.safetensors").string(), {{"w1", DType::F32, {4}, x.data(), 16}});
  std::ofstream(d.path / "model.safetensors.index.json")
      << R"({"weight_map": {"w1": "a.safetensors", "w2": "b.safetensors"}})";
  try {
    Checkpoint::open(d.path.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w1' is in both"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace xpert::safetensors
