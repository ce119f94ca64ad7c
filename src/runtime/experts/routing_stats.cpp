#include "runtime/experts/routing_stats.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "base/error.h"
#include "model/model.h"

namespace xpert {

using nlohmann::json;

namespace {
constexpr const char* kFormat = "xpert-routing-profile";
constexpr int kVersion = 1;
}  // namespace

ModelIdentity ModelIdentity::of(const Model& m) {
  const ModelConfig& c = m.config();
  return {.arch = c.arch,
          .name = c.name,
          .n_layer = c.n_layer,
          .n_expert = c.n_expert,
          .n_expert_used = c.n_expert_used,
          .file_bytes = m.file().file_size()};
}

RoutingStats::RoutingStats(int64_t n_layer, int64_t n_expert, int64_t n_expert_used)
    : n_layer_(n_layer), n_expert_(n_expert), k_(n_expert_used) {
  if (n_layer <= 0 || n_expert <= 0 || n_expert_used <= 0 || n_expert_used > n_expert)
    fail("routing statistics need a MoE model (layers {}, experts {}, experts per token {})", n_layer,
         n_expert, n_expert_used);
  counts_ = std::make_unique<std::atomic<uint64_t>[]>((size_t)(n_layer * n_expert));
  reset();
}

RoutingStats::RoutingStats(const Model& m)
    : RoutingStats(m.config().n_layer, m.config().n_expert, m.config().n_expert_used) {}

RoutingStats::RoutingStats(const RoutingStats& o) : RoutingStats(o.n_layer_, o.n_expert_, o.k_) { *this = o; }

RoutingStats& RoutingStats::operator=(const RoutingStats& o) {
  if (this == &o) return *this;
  if (o.n_layer_ != n_layer_ || o.n_expert_ != n_expert_) {
    n_layer_ = o.n_layer_;
    n_expert_ = o.n_expert_;
    counts_ = std::make_unique<std::atomic<uint64_t>[]>((size_t)(n_layer_ * n_expert_));
  }
  k_ = o.k_;
  for (int64_t i = 0; i < n_layer_ * n_expert_; ++i)
    counts_[i].store(o.counts_[i].load(std::memory_order_relaxed));
  return *this;
}

void RoutingStats::add(int64_t il, std::span<const int32_t> ids) {
  XP_ASSERT(il >= 0 && il < n_layer_);
  std::atomic<uint64_t>* row = counts_.get() + il * n_expert_;
  for (int32_t e : ids) {
    XP_ASSERT(e >= 0 && e < n_expert_);
    row[e].fetch_add(1, std::memory_order_relaxed);
  }
}

void RoutingStats::set(int64_t il, int64_t e, uint64_t count) {
  XP_ASSERT(il >= 0 && il < n_layer_ && e >= 0 && e < n_expert_);
  counts_[il * n_expert_ + e].store(count, std::memory_order_relaxed);
}

void RoutingStats::reset() {
  for (int64_t i = 0; i < n_layer_ * n_expert_; ++i) counts_[i].store(0, std::memory_order_relaxed);
}

uint64_t RoutingStats::count(int64_t il, int64_t e) const {
  XP_ASSERT(il >= 0 && il < n_layer_ && e >= 0 && e < n_expert_);
  return counts_[il * n_expert_ + e].load(std::memory_order_relaxed);
}

std::vector<uint64_t> RoutingStats::layer_counts(int64_t il) const {
  std::vector<uint64_t> v(n_expert_);
  for (int64_t e = 0; e < n_expert_; ++e) v[e] = count(il, e);
  return v;
}

uint64_t RoutingStats::layer_total(int64_t il) const {
  const std::vector<uint64_t> v = layer_counts(il);
  return std::accumulate(v.begin(), v.end(), uint64_t{0});
}

uint64_t RoutingStats::max_tokens() const {
  uint64_t best = 0;
  for (int64_t il = 0; il < n_layer_; ++il) best = std::max(best, layer_total(il));
  return best / (uint64_t)k_;
}

std::vector<int32_t> RoutingStats::ranked(int64_t il) const {
  const std::vector<uint64_t> v = layer_counts(il);
  std::vector<int32_t> order(n_expert_);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  return order;
}

double RoutingStats::top_share(int64_t il, int64_t top) const {
  const uint64_t total = layer_total(il);
  if (total == 0) return 0.0;
  const std::vector<uint64_t> v = layer_counts(il);
  const std::vector<int32_t> order = ranked(il);
  uint64_t s = 0;
  for (int64_t i = 0; i < std::min(top, n_expert_); ++i) s += v[order[i]];
  return (double)s / (double)total;
}

void RoutingStats::save(const std::string& path, const ModelIdentity& id) const {
  const json model = {{"arch", id.arch},
                      {"name", id.name},
                      {"n_layer", id.n_layer},
                      {"n_expert", id.n_expert},
                      {"n_expert_used", id.n_expert_used},
                      {"file_bytes", id.file_bytes}};
  // Written by hand so that each layer's counts stay on one line (a real model has 48 x 128 of them).
  std::string text = fmt::format(
      "{{\n \"format\": \"{}\",\n \"version\": {},\n \"model\": {},\n \"tokens\": {},\n"
      " \"counts\": [\n",
      kFormat, kVersion, model.dump(-1, ' ', false, json::error_handler_t::replace), max_tokens());
  for (int64_t il = 0; il < n_layer_; ++il)
    text += fmt::format("  {}{}\n", json(layer_counts(il)).dump(), il + 1 < n_layer_ ? "," : "");
  text += " ]\n}\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot write the routing profile {}", tmp);
    f << text;
    if (!f.flush()) fail("cannot write the routing profile {}", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail("cannot write the routing profile {}: rename failed", path);
  }
}

RoutingStats RoutingStats::load(const std::string& path, const ModelIdentity& expect) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read the routing profile {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: not a routing profile (JSON error: {})", path, e.what());
  }
  auto bad = [&](const char* what) -> Error {
    return Error(fmt::format("{}: not a valid routing profile ({})", path, what));
  };
  if (!j.is_object() || j.value("format", std::string()) != kFormat)
    throw bad("no \"format\": \"xpert-routing-profile\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kVersion)
    throw bad("expected version 1");
  if (!j.contains("model") || !j["model"].is_object()) throw bad("no \"model\" object");
  const json& m = j["model"];
  auto int_field = [&](const char* k) -> int64_t {
    if (!m.contains(k) || !m[k].is_number_integer()) throw bad(k);
    return m[k].get<int64_t>();
  };
  auto differs = [&](const char* what, auto have, auto want) {
    if (have != want)
      fail(
          "{} was recorded on a different model ({} {} there, {} here); run `xpert profile` on this model "
          "(or remove the file)",
          path, what, have, want);
  };
  if (!m.contains("arch") || !m["arch"].is_string()) throw bad("model.arch");
  differs("architecture", m["arch"].get<std::string>(), expect.arch);
  differs("n_layer", int_field("n_layer"), expect.n_layer);
  differs("n_expert", int_field("n_expert"), expect.n_expert);
  differs("n_expert_used", int_field("n_expert_used"), expect.n_expert_used);
  if (!m.contains("file_bytes") || !m["file_bytes"].is_number_unsigned()) throw bad("model.file_bytes");
  differs("file size", m["file_bytes"].get<uint64_t>(), expect.file_bytes);

  if (!j.contains("counts") || !j["counts"].is_array() || (int64_t)j["counts"].size() != expect.n_layer)
    throw bad("\"counts\" must hold one array per layer");
  RoutingStats s(expect.n_layer, expect.n_expert, expect.n_expert_used);
  for (int64_t il = 0; il < expect.n_layer; ++il) {
    const json& row = j["counts"][il];
    if (!row.is_array() || (int64_t)row.size() != expect.n_expert)
      throw bad("a layer's counts must hold one count per expert");
    for (int64_t e = 0; e < expect.n_expert; ++e) {
      if (!row[e].is_number_unsigned()) throw bad("counts must be non-negative integers");
      s.set(il, e, row[e].get<uint64_t>());
    }
  }
  return s;
}

std::string RoutingStats::default_path(const std::string& model_path) {
  std::string p = model_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p + ".xpert-profile.json";
}

}  // namespace xpert
