// The whole-model backend's programs as OpenclBackend builds them: each one's whole text (kClCommonSource
// first) and build options, in one place, so that the offline compile check for Intel GPUs
// (tests/unit/test_opencl_intel.cpp) compiles exactly what a device would.
#include "backend/opencl/backend_impl.h"
#include "backend/opencl/kernels_prefill.h"
#include "backend/opencl/kernels_probe.h"

namespace xpert::opencl {

std::string per_tile_size(std::string_view src, const char* rows_macro, const char* suffix_macro,
                          std::initializer_list<std::pair<int, const char*>> sizes) {
  std::string r;
  for (const auto& [rows, suffix] : sizes) {
    r += fmt::format("\n#define {} {}\n#define {} {}\n", rows_macro, rows, suffix_macro, suffix);
    r += src;
    r += fmt::format("\n#undef {}\n#undef {}\n", rows_macro, suffix_macro);
  }
  return r;
}

namespace {
std::string with_common(std::initializer_list<std::string_view> parts) {
  std::string r(kClCommonSource);
  for (std::string_view p : parts) r += p;
  return r;
}
}  // namespace

// Activation scales divide by amax: correctly rounded, the rounding matches the CPU's bit for bit.
ProgramText ops_program_text(bool correctly_rounded_divide) {
  return {with_common({kOpsSource, kFusedOpsSource, kProbeSource, kPrefillOpsSource}),
          correctly_rounded_divide ? "-cl-fp32-correctly-rounded-divide-sqrt" : ""};
}

// The decode kernel rounds its output for the projection as ops' round_blocks does.
ProgramText attention_program_text(bool correctly_rounded_divide, int block_keep, int block_dims,
                                   bool wide_loads) {
  return {with_common({kAttentionSource, kAttentionSplitSource}),
          fmt::format("-DATT_BKEEP={} -DATT_BD={}{}{}", block_keep, block_dims,
                      wide_loads ? "" : " -DNO_WIDE_LOADS",
                      correctly_rounded_divide ? " -cl-fp32-correctly-rounded-divide-sqrt" : "")};
}

// The recurrent kernel rounds its output for the projection as ops' round_blocks does.
ProgramText gdn_program_text(bool correctly_rounded_divide) {
  return {with_common({kGdnSource}),
          correctly_rounded_divide ? "-cl-fp32-correctly-rounded-divide-sqrt" : ""};
}

ProgramText matmul_program_text(DType t, const MatmulBuild& b) {
  static const std::string tiles =
      per_tile_size(kPrefillDenseTileSource, "PT_RM", "PT_SUF", {{4, "_m64"}, {2, "_m32"}}) +
      per_tile_size(kPrefillTileSource, "PT_TYN", "PT_SUF", {{8, "_m64"}, {4, "_m32"}});
  return {with_common({kMatmulSource, kFusedMatmulSource, kPrefillRawSource, tiles}), matmul_options(t, b)};
}

}  // namespace xpert::opencl
