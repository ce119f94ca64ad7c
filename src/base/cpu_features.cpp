#include "base/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace xpert {
namespace {

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse3 = c & (1u << 0);
  f.ssse3 = c & (1u << 9);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  const bool osxsave = c & (1u << 27);
  const bool avx_hw = c & (1u << 28);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  const bool amx_os = (xcr0 & (3ull << 17)) == (3ull << 17);
  f.avx = avx_hw && ymm_os;
  if (!f.avx) f.fma = f.f16c = false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = f.avx && (b & (1u << 5));
    f.bmi2 = b & (1u << 8);
    f.avx512f = zmm_os && (b & (1u << 16));
    f.avx512dq = zmm_os && (b & (1u << 17));
    f.avx512bw = zmm_os && (b & (1u << 30));
    f.avx512vl = zmm_os && (b & (1u << 31));
    f.avx512vnni = zmm_os && (c & (1u << 11));
    f.amx_bf16 = amx_os && (d & (1u << 22));
    f.amx_tile = amx_os && (d & (1u << 24));
    f.amx_int8 = amx_os && (d & (1u << 25));
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
      f.avxvnni = f.avx && (a & (1u << 4));
      f.avx512bf16 = zmm_os && (a & (1u << 5));
    }
  }
  return f;
}

Isa parse_cap() {
  const char* e = std::getenv("XPERT_ISA");
  if (!e) return Isa::avx512;
  if (!std::strcmp(e, "scalar")) return Isa::scalar;
  if (!std::strcmp(e, "avx2")) return Isa::avx2;
  return Isa::avx512;
}

std::atomic<int> g_cap{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return f.avx2 && f.fma && f.f16c && f.bmi2;
    case Isa::avx512:
      return isa_supported(Isa::avx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  }
  return false;
}

void set_isa_cap(Isa cap) { g_cap.store((int)cap); }

Isa best_isa() {
  int cap = g_cap.load();
  if (cap < 0) {
    cap = (int)parse_cap();
    g_cap.store(cap);
  }
  for (int i = cap; i > 0; --i)
    if (isa_supported((Isa)i)) return (Isa)i;
  return Isa::scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512-vnni";
  }
  return "?";
}

bool amx_usable() {
  static const bool usable = [] {
    const CpuFeatures& f = cpu_features();
    if (!f.amx_tile || !f.amx_int8) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
    // Linux >= 5.16 enables tile data per process on request (x86 arch_prctl.h: ARCH_REQ_XCOMP_PERM 0x1023,
    // XFEATURE_XTILEDATA 18); the grant covers every thread of the process, present and future.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
      log::debug("AMX: the kernel refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM: {}); prefill uses AVX-512",
                 std::strerror(errno));
      return false;
    }
    log::debug("AMX: tile data granted; prefill runs on AMX-INT8 tiles (XPERT_NO_AMX=1 turns them off)");
    return true;
#else
    return false;
#endif
  }();
  return usable;
}

bool amx_enabled() {
  static const bool env_off = [] {
    const char* e = std::getenv("XPERT_NO_AMX");
    return e && std::strcmp(e, "0") != 0 && *e;
  }();
  return !env_off && best_isa() == Isa::avx512 && amx_usable();
}

std::string cpu_features_string() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool b, const char* n) {
    if (!b) return;
    if (!s.empty()) s += ' ';
    s += n;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512bf16, "avx512bf16");
  add(f.avxvnni, "avxvnni");
  add(f.amx_int8, "amx-int8");
  add(f.amx_bf16, "amx-bf16");
  return s;
}

}  // namespace xpert
