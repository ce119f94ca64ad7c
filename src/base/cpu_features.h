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

}  // namespace xpert
