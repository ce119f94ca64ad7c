// What the running CPU can do, read once with cpuid/xgetbv. Kernels choose their ISA from this at one
// boundary; XPERT_ISA=scalar|avx2|avx512 caps the choice (tests run every path that way).
#pragma once
#include <string>

namespace xpert {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

struct CpuFeatures {
  bool sse3 = false, ssse3 = false, avx = false, avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false;
  bool avx512bf16 = false, avxvnni = false, amx_tile = false, amx_int8 = false, amx_bf16 = false;
};

const CpuFeatures& cpu_features();
// The best ISA level this CPU supports, capped by XPERT_ISA or set_isa_cap().
Isa best_isa();
void set_isa_cap(Isa cap);  // for tests: run the scalar / avx2 / avx512 paths in turn
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);
std::string cpu_features_string();

// AMX-INT8 tiles are usable: the CPU has AMX-TILE and AMX-INT8, the OS saves their state, and Linux granted
// this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, requested here on the first call, once per
// process, thread-safe). Without the grant the first tile instruction kills the process (SIGILL), so every
// AMX kernel sits behind this. A refusal is logged once at debug level.
bool amx_usable();
// The prefill kernels may use AMX: amx_usable(), best_isa() is avx512 (their epilogue is AVX-512) and
// XPERT_NO_AMX is not set to 1 (A/B benches).
bool amx_enabled();

}  // namespace xpert
