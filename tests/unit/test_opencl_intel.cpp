// Every OpenCL program xpert builds for an Intel GPU, compiled by Intel's offline compiler (ocloc, Debian
// package intel-opencl-icd) from exactly the text and options the backends use (program_texts.cpp,
// expert_program_text): the whole model's ops, attention, Gated DeltaNet and each weight type's matmul
// program at a GPU's widths (32 work-items a row, 4 rows a group), and the expert kernels' subgroup16 form
// (what an Intel GPU runs) for each weight type they take, for an Arc A GPU (dg2-g10) and, but for the matmul
// programs of types other than Q4_K / Q6_K, a Xe-LP integrated GPU (tgllp). No CI machine has an Intel GPU: a
// program that Intel's compiler refuses would otherwise first fail on a user's. The XMX prefill program has
// its own check (test_opencl_xmx.cpp). Skips without ocloc.
#include <gtest/gtest.h>

#ifdef XPERT_HAVE_OPENCL
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/opencl/backend_impl.h"
#include "backend/opencl/expert_device.h"
#include "opencl_test_util.h"

namespace xpert {
namespace {

namespace fs = std::filesystem;

// The matmul programs' build on an Intel GPU: 32 work-items a row, in subgroups of 16; the prefill tiles in
// two local-memory buffers (64 KiB a work-group: tile_bufs_for).
const opencl::MatmulBuild kIntelGpu = {
    .mv_wg = 32,
    .mv_r = 4,
    .sub_group = 16,
    .tile_bufs = opencl::tile_bufs_for(64 * 1024, 0),
    .dense_bufs = opencl::tile_bufs_for(64 * 1024, 0, opencl::kTwoDenseBufsBytes)};

// Compiles each program with ocloc for the devices named (a comma-separated list: one front end, a binary per
// device); fails with the compiler's log where one does not build.
void compile_for_intel(const std::vector<std::pair<std::string, opencl::ProgramText>>& programs,
                       const char* devices) {
  const std::string ocloc = cltest::find_ocloc();
  if (ocloc.empty())
    GTEST_SKIP()
        << "ocloc is not installed (Debian package intel-opencl-icd): the programs are not compile-checked "
           "for Intel GPUs";
  const fs::path dir = fs::temp_directory_path() /
                       fmt::format("xpert_intel_{}_{}", ::getpid(),
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [name, p] : programs) {
    SCOPED_TRACE(name);
    const fs::path run = dir / name;
    fs::create_directories(run);
    std::ofstream(run / "program.cl", std::ios::binary) << p.source;
    const std::string cmd =
        fmt::format("cd '{}' && '{}' compile -file program.cl -device {} -options '{}' > log.txt 2>&1",
                    run.string(), ocloc, devices, p.options);
    const int rc = std::system(cmd.c_str());
    const std::string log = cltest::read_text(run / "log.txt");
    ASSERT_EQ(rc, 0) << cmd << "\n" << log;
    EXPECT_NE(log.find("Build succeeded"), std::string::npos) << log;
    std::stringstream list(devices);
    if (std::string(devices).find(',') != std::string::npos) {  // several: a line each
      for (std::string device; std::getline(list, device, ',');)
        EXPECT_NE(log.find(fmt::format("Build succeeded for : {}.", device)), std::string::npos)
            << device << ":\n"
            << log;
    }
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// The whole model's small programs and the experts' (every type they take), for both devices.
TEST(OpenCLIntelOfflineCompile, OpsAttentionGdnAndExpertProgramsBuild) {
  std::vector<std::pair<std::string, opencl::ProgramText>> programs = {
      {"ops", opencl::ops_program_text(true)},
      {"attention", opencl::attention_program_text(true, 512)},
      {"gdn", opencl::gdn_program_text(true)},
  };
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::GPTQ4_G128, DType::GPTQ4Z_G32})
    programs.emplace_back(fmt::format("experts_{}", dtype_name(t)),
                          opencl::expert_program_text(t, opencl::KernelVariant::subgroup16, 16, 4, true));
  compile_for_intel(programs, "dg2-g10,tgllp");
}

// The matmul programs of a Q4_K_M file's types for both devices, the others' for the Arc GPU (the source is
// the same for every device: one catches what Intel's front end refuses).
TEST(OpenCLIntelOfflineCompile, MatmulProgramsOfQ4KAndQ6KBuild) {
  compile_for_intel({{"matmul_Q4_K", opencl::matmul_program_text(DType::Q4_K, kIntelGpu)},
                     {"matmul_Q6_K", opencl::matmul_program_text(DType::Q6_K, kIntelGpu)}},
                    "dg2-g10,tgllp");
}

TEST(OpenCLIntelOfflineCompile, MatmulProgramsOfOtherTypesBuild) {
  std::vector<std::pair<std::string, opencl::ProgramText>> programs;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_K})
    programs.emplace_back(fmt::format("matmul_{}", dtype_name(t)), opencl::matmul_program_text(t, kIntelGpu));
  compile_for_intel(programs, "dg2-g10");
}

}  // namespace
}  // namespace xpert

#else
TEST(OpenCLIntelOfflineCompile, NotBuiltIn) { GTEST_SKIP() << "built without the OpenCL backend"; }
#endif
