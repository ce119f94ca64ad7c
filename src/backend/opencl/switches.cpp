#include "backend/opencl/switches.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "base/error.h"

namespace xpert::opencl {

namespace {
int int_value(std::string_view key, std::string_view v, int lo, int hi) {
  char* end = nullptr;
  const std::string s(v);
  const long n = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || n < lo || n > hi)
    fail("XPERT_OPENCL_OPTS: {}={}: expected a whole number from {} to {}", key, v, lo, hi);
  return (int)n;
}
bool off_value(std::string_view key, std::string_view v) {
  if (v == "0") return false;
  if (v == "1") return true;
  fail("XPERT_OPENCL_OPTS: {}={}: expected 0 or 1", key, v);
}
}  // namespace

Switches read_switches() {
  Switches s;
  const char* env = std::getenv("XPERT_OPENCL_OPTS");
  if (!env) return s;
  std::string_view rest(env);
  while (!rest.empty()) {
    const size_t cut = rest.find_first_of(",:");
    const std::string_view item = rest.substr(0, cut);
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string_view v = eq == std::string_view::npos ? std::string_view("1") : item.substr(eq + 1);
    if (key == "fused")
      s.fused = off_value(key, v);
    else if (key == "tail")
      s.tail = off_value(key, v);
    else if (key == "arg_cache")
      s.arg_cache = off_value(key, v);
    else if (key == "wide")
      s.wide = off_value(key, v);
    else if (key == "host_weights")
      s.host_weights = off_value(key, v);
    else if (key == "graphs")
      s.graphs = off_value(key, v);
    else if (key == "subgroups")
      s.subgroups = off_value(key, v);
    else if (key == "prefill")
      s.prefill = off_value(key, v);
    else if (key == "moe_bm") {
      s.moe_bm = int_value(key, v, 32, 64);
      if (s.moe_bm != 32 && s.moe_bm != 64) fail("XPERT_OPENCL_OPTS: moe_bm={}: expected 32 or 64", v);
    } else if (key == "pt_bufs")
      s.pt_bufs = int_value(key, v, 1, 2);
    else if (key == "ksplit")
      s.ksplit = int_value(key, v, 0, 64);
    else if (key == "nv_regs") {
      s.nv_regs = int_value(key, v, 0, 255);
      if (s.nv_regs > 0 && s.nv_regs < 32)
        fail("XPERT_OPENCL_OPTS: nv_regs={}: expected 0 (the compiler's choice) or 32 to 255", v);
    } else if (key == "probe")
      s.probe = off_value(key, v);
    else if (key == "stats")
      s.stats = off_value(key, v);
    else if (key == "profile")
      s.profile = off_value(key, v);
    else if (key == "arg_sets")
      s.arg_sets = int_value(key, v, 1, 1 << 20);
    else if (key == "mv_wg") {
      s.mv_wg = int_value(key, v, 2, 256);
      if (s.mv_wg & (s.mv_wg - 1))
        fail("XPERT_OPENCL_OPTS: mv_wg={}: expected a power of two from 2 to 256", v);
    } else if (key == "mv_r") {
      s.mv_r = int_value(key, v, 1, 16);
      if (s.mv_r & (s.mv_r - 1)) fail("XPERT_OPENCL_OPTS: mv_r={}: expected 1, 2, 4, 8 or 16", v);
    } else {
      fail(
          "XPERT_OPENCL_OPTS: unknown item '{}' (fused, tail, arg_cache, arg_sets, wide, mv_wg, mv_r, "
          "graphs, host_weights, subgroups, prefill, moe_bm, pt_bufs, ksplit, nv_regs, probe, stats, "
          "profile)",
          item);
    }
  }
  return s;
}

}  // namespace xpert::opencl
