// libFuzzer target for the GGUF reader: any input must either parse or throw xpert::Error; a crash, a
// sanitizer report, a leak or another exception type is a bug. A file that parses must also survive
// every accessor, and writing it back out must give a file that parses to the same thing.
//
// The target is built from the reader's own sources (tests/CMakeLists.txt), all with the fuzzer's
// coverage and the sanitizers, and without the rest of the engine, so `scripts/fuzz.sh` compiles little.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <vector>

#include "base/error.h"
#include "format/gguf.h"

namespace {

using namespace xpert;
using namespace xpert::gguf;

// Reads every value the way a consumer would; the checksum keeps the reads from being optimized away.
uint64_t touch(const Value& v) {
  uint64_t sum = v.u ^ (uint64_t)v.i ^ v.s.size();
  if (v.type == ValueType::ARRAY) {
    if (value_type_size(v.elem) != 0 && v.count > 0) {
      sum += std::bit_cast<uint64_t>(v.number_at(0)) + std::bit_cast<uint64_t>(v.number_at(v.count - 1));
    }
    for (const std::string& s : v.strings) sum += s.size();
    for (const Value& item : v.items) sum += touch(item);
  }
  sum += v.to_display(4).size();
  return sum;
}

std::vector<uint8_t> rewrite(const GGUFFile& f) {
  GGUFWriter w(f.alignment());
  for (const auto& [key, v] : f.metadata()) w.set(key, v);
  for (const TensorInfo& t : f.tensors()) w.add_tensor(t.name, t.type, t.shape, t.data, t.n_bytes);
  return w.to_bytes();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<GGUFFile> f;
  try {
    f = GGUFFile::parse(data, size, "fuzz.gguf");
  } catch (const Error&) {
    return 0;
  }
  volatile uint64_t sink = 0;
  for (const auto& [key, v] : f->metadata()) {
    sink = sink + touch(v);
    if (f->find(key) != &v) __builtin_trap();
  }
  for (const TensorInfo& t : f->tensors()) {
    if (f->tensor(t.name) != &t) __builtin_trap();
    sink = sink + t.data[0] + t.data[t.n_bytes - 1];  // inside the input, or ASan says so
  }
  // What the reader accepted, the writer must write and the reader read back the same way.
  const std::vector<uint8_t> once = rewrite(*f);
  std::unique_ptr<GGUFFile> g;
  try {
    g = GGUFFile::parse(once.data(), once.size(), "rewritten.gguf");
  } catch (const Error& e) {
    std::fprintf(stderr, "re-reading a rewritten file failed: %s\n", e.what());
    __builtin_trap();
  }
  if (g->metadata().size() != f->metadata().size()) __builtin_trap();
  if (g->tensors().size() != f->tensors().size()) __builtin_trap();
  if (rewrite(*g) != once) __builtin_trap();
  return 0;
}
