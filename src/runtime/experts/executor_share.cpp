#include "runtime/experts/executor_share.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <random>
#include <vector>

#include "backend/cpu/moe.h"
#include "base/error.h"
#include "base/log.h"
#include "quant/dtype.h"

namespace xpert {
namespace {

constexpr int64_t kPrefillTokens = 64;

std::filesystem::path cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "xpert" / "expert-share";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "xpert" / "expert-share";
  return {};
}

std::string cache_key(const MoeFfn& m, const ExpertExecutor& exec, int threads) {
  const std::string what = fmt::format("{}|threads {}|{} {} {}|embd {} ff {} experts {} used {}", exec.name(),
                                       threads, dtype_name(m.gate.type), dtype_name(m.up.type),
                                       dtype_name(m.down.type), m.n_embd, m.n_ff, m.n_expert, m.n_used);
  return fmt::format("{:016x}", std::hash<std::string>{}(what));
}

// Median milliseconds of `reps` runs of the layer's experts on n tokens, each run with a routing of its own
// (uniform, the same sequence for every share), so a decode-sized run reads experts the previous runs did
// not leave in the caches, as decoding does.
double time_share(MoeFfn m, double share, int64_t n, int reps, ThreadPool& pool) {
  m.exec_share = {.decode = share, .prefill = share, .prefill_min_tokens = kPrefillTokens};
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n * m.n_embd), out(n * m.n_embd);
  for (float& v : x) v = u(rng);
  std::vector<int32_t> experts(m.n_expert);
  auto routing = [&] {
    Routing r;
    r.n_tokens = n;
    r.k = m.n_used;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t e = 0; e < m.n_expert; ++e) experts[e] = (int32_t)e;
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int64_t j = 0; j < m.n_used; ++j) {
        r.ids.push_back(experts[j]);
        r.weights.push_back(1.0f / (float)m.n_used);
      }
    }
    return r;
  };
  const std::vector<bool> all(m.n_expert, true);
  cpu::MoeScratch s;
  std::vector<double> ms;
  for (int i = 0; i < reps + 2; ++i) {  // two warm-ups: kernels built, weights registered
    const Routing r = routing();
    const auto t0 = std::chrono::steady_clock::now();
    cpu::moe_experts_partial(m, x.data(), n, r, all, out.data(), false, s, pool);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) ms.push_back(t);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

std::string ShareMeasurement::summary() const {
  return fmt::format(
      "expert device share: decode {:.2f} (CPU alone {:.2f} ms, device alone {:.2f} ms, chosen {:.2f} ms per "
      "layer), "
      "prefill {:.2f} (CPU alone {:.1f} ms, device alone {:.1f} ms, chosen {:.1f} ms per {}-token layer{})",
      share.decode, cpu_ms[0], device_ms[0], chosen_ms[0], share.prefill, cpu_ms[1], device_ms[1],
      chosen_ms[1], kPrefillTokens, cached ? "; measured earlier on this machine, cached" : "");
}

ShareMeasurement measure_executor_share(const MoeFfn& layer, ExpertExecutor& exec, ThreadPool& pool) {
  ShareMeasurement res;
  res.share.prefill_min_tokens = 16;
  const std::filesystem::path dir = cache_dir();
  const std::filesystem::path file = dir.empty() ? dir : dir / (cache_key(layer, exec, pool.size()) + ".txt");
  if (!file.empty()) {
    std::ifstream in(file);
    double d = -1, p = -1, ms[6] = {0, 0, 0, 0, 0, 0};
    if (in >> d >> p && d >= 0 && d <= 1 && p >= 0 && p <= 1) {
      for (double& v : ms) in >> v;  // the times that chose them (absent in a hand-written file: 0)
      res.share.decode = d, res.share.prefill = p;
      for (int phase = 0; phase < 2; ++phase) {
        res.cpu_ms[phase] = ms[3 * phase];
        res.device_ms[phase] = ms[3 * phase + 1];
        res.chosen_ms[phase] = ms[3 * phase + 2];
      }
      res.cached = true;
      return res;
    }
  }
  MoeFfn m = layer;
  m.exec = &exec;
  m.split = nullptr;
  m.stats = nullptr;
  for (int phase = 0; phase < 2; ++phase) {
    const int64_t n = phase == 0 ? 1 : kPrefillTokens;
    const int reps = phase == 0 ? 15 : 3;
    auto time = [&](double s) { return time_share(m, s, n, reps, pool); };
    const double t0 = time(0.0), t1 = time(1.0);
    double best_s = t0 <= t1 ? 0.0 : 1.0, best_t = std::min(t0, t1);
    const double balanced = t0 / (t0 + t1);
    for (double s : {balanced, balanced - 0.15, balanced + 0.15}) {
      if (s <= 0.02 || s >= 0.98) continue;
      const double t = time(s);
      if (t < best_t) best_s = s, best_t = t;
    }
    (phase == 0 ? res.share.decode : res.share.prefill) = best_s;
    res.cpu_ms[phase] = t0, res.device_ms[phase] = t1, res.chosen_ms[phase] = best_t;
  }
  if (!file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(file);
    if (out) {
      out << std::setprecision(17) << res.share.decode << ' ' << res.share.prefill;  // read back exactly
      for (int phase = 0; phase < 2; ++phase)
        out << ' ' << res.cpu_ms[phase] << ' ' << res.device_ms[phase] << ' ' << res.chosen_ms[phase];
      out << '\n';
    }
    if (!out) log::debug("could not cache the expert device share in {}", file.string());
  }
  return res;
}

ExecutorShare parse_executor_share(const std::string& s) {
  auto one = [&](const std::string& v) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(d >= 0 && d <= 1))
      fail("--expert-share {}: expected a share from 0 to 1, or two (decode,prefill)", s);
    return d;
  };
  ExecutorShare r;
  const size_t comma = s.find(',');
  if (comma == std::string::npos) {
    r.decode = r.prefill = one(s);
  } else {
    r.decode = one(s.substr(0, comma));
    r.prefill = one(s.substr(comma + 1));
  }
  return r;
}

}  // namespace xpert
