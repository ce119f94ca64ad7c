// CudaBackend's Acts (backend/act.h): a decode-sized norm returns its output with the q8_1 form its
// products read, which gives the bits of converting the rows again; and a form that a later op has
// overwritten is not read (the product converts the rows itself).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace xpert {
namespace {

using cudatest::OnDevice;

TEST(CudaAct, NormFormGivesConvertedBitsAndAStaleFormIsNotRead) {
  XPERT_REQUIRE_GPU();
  std::shared_ptr<Backend> dev = make_cuda_backend(0);
  Backend& b = *dev;
  const int64_t k = 512, n_out = 256;
  for (int64_t rows : {1, 4}) {
    const std::vector<uint8_t> wq = cudatest::random_weights(DType::Q4_K, n_out, k, 31);
    void* wd = b.alloc(wq.size());
    const Weight W{.type = DType::Q4_K, .data = wq.data(), .ne = {k, n_out, 1}, .n_bytes = wq.size()};
    b.upload_weight(wd, W);
    Weight Wd = W;
    Wd.data = wd;
    const OnDevice x1(b, cudatest::random_values(rows * k, 1)), x2(b, cudatest::random_values(rows * k, 2));
    const OnDevice nw(b, cudatest::random_values(k, 3));
    const OnDevice y1(b, std::vector<float>(rows * k)), y2(b, std::vector<float>(rows * k));
    const OnDevice p_plain(b, std::vector<float>(rows * n_out)), p_act(b, std::vector<float>(rows * n_out));
    const OnDevice p_stale(b, std::vector<float>(rows * n_out)), p_stale2(b, std::vector<float>(rows * n_out));

    const Act a1 = b.rmsnorm_act(x1.f(), nw.f(), y1.f(), rows, k, 1e-6f);
    ASSERT_NE(a1.form, nullptr) << "a decode-sized norm writes its q8_1 form";
    b.matmul(Wd, a1, p_act.f());
    b.matmul(Wd, y1.f(), rows, p_plain.f());  // a plain pointer: converted again
    const std::vector<float> want = p_plain.get(rows * n_out);
    EXPECT_EQ(p_act.get(rows * n_out), want) << rows << " rows";

    // Another norm writes its form where a1's was: a1's rows are unchanged, its form is not read.
    const Act a2 = b.rmsnorm_act(x2.f(), nw.f(), y2.f(), rows, k, 1e-6f);
    ASSERT_NE(a2.form, nullptr);
    b.matmul(Wd, a1, p_stale.f());
    EXPECT_EQ(p_stale.get(rows * n_out), want) << rows << " rows";
    const Backend::MatmulJob jobs[] = {{&Wd, p_stale2.f()}};
    b.matmuls(a1, jobs);
    EXPECT_EQ(p_stale2.get(rows * n_out), want) << rows << " rows";
    // a2's own form still gives a2's product.
    b.matmul(Wd, y2.f(), rows, p_plain.f());
    b.matmul(Wd, a2, p_act.f());
    EXPECT_EQ(p_act.get(rows * n_out), p_plain.get(rows * n_out)) << rows << " rows";
    b.dealloc(wd);
  }
}

}  // namespace
}  // namespace xpert
