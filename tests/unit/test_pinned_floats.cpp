// PinnedFloats (runtime/pinned_floats.h): the logits buffer a device registers for direct copies. A test
// device records which ranges are registered: the buffer is registered once, unregistered before it moves
// and when it goes, and a buffer the device refused is not offered again.
#include <gtest/gtest.h>

#include <map>

#include "cpu_forwarding_backend.h"
#include "runtime/pinned_floats.h"

namespace xpert {
namespace {

class PinRecorder final : public CpuForwardingBackend {
 public:
  using CpuForwardingBackend::CpuForwardingBackend;
  std::string name() const override { return "pin-recorder"; }
  void moe_ffn(const MoeFfn&, const float*, int64_t, float*) override {}
  bool pin_host(void* p, size_t bytes) override {
    ++offers;
    if (refuse) return false;
    EXPECT_TRUE(live.emplace(p, bytes).second) << "registered twice";
    return true;
  }
  void unpin_host(void* p) override { EXPECT_EQ(live.erase(p), 1u) << "unregistered without a registration"; }
  std::map<void*, size_t> live;  // registered ranges
  int offers = 0;
  bool refuse = false;
};

TEST(PinnedFloats, RegistersTheBufferAndDropsItBeforeItMoves) {
  ThreadPool pool(1);
  PinRecorder dev(pool);
  {
    PinnedFloats f(&dev);
    f.ensure(100);
    ASSERT_EQ(dev.live.size(), 1u);
    EXPECT_EQ(dev.live.begin()->first, f.get().data());
    EXPECT_GE(dev.live.begin()->second, 100 * sizeof(float));
    f.get().resize(100);  // what a forward does with it: no move
    EXPECT_TRUE(f.intact());
    f.ensure(50);  // already room, already registered
    EXPECT_EQ(dev.offers, 1);
    f.ensure(100000);  // grows: the old buffer is unregistered before it is freed, the new one registered
    ASSERT_EQ(dev.live.size(), 1u);
    EXPECT_EQ(dev.live.begin()->first, f.get().data());
    EXPECT_EQ(dev.offers, 2);
    f.get().resize(100000);
    EXPECT_TRUE(f.intact());
  }
  EXPECT_TRUE(dev.live.empty()) << "still registered after the buffer went";
}

TEST(PinnedFloats, ARefusedBufferIsPlainMemoryAndNotOfferedAgain) {
  ThreadPool pool(1);
  PinRecorder dev(pool);
  dev.refuse = true;
  PinnedFloats f(&dev);
  f.ensure(64);
  f.ensure(64);
  f.ensure(32);
  EXPECT_EQ(dev.offers, 1);
  f.get().assign(64, 1.5f);
  EXPECT_TRUE(f.intact());
  PinnedFloats none(nullptr);  // no device: plain memory
  none.ensure(8);
  EXPECT_GE(none.get().capacity(), 8u);
}

}  // namespace
}  // namespace xpert
