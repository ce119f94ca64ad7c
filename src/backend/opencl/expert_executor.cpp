#include "backend/opencl/expert_executor.h"

#include <fmt/format.h>

#include <mutex>
#include <set>

#include "backend/opencl/expert_device.h"

namespace xpert::opencl {
namespace {

class OpenClExperts final : public ExpertExecutor {
 public:
  explicit OpenClExperts(int index) : index_(index), dev_(index) {}
  std::string name() const override { return fmt::format("opencl:{} ({})", index_, dev_.info().name); }

  void start(const MoeFfn& m, std::span<const ExpertTask> tasks, const float* xg, int64_t n_rows,
             float* yg) override {
    wait();  // one start in flight: the rows below and the device's staging buffers are reused
    const int64_t layer = m.layer;
    if (!registered_.count(layer)) {
      dev_.add_layer((int)layer, m.gate, m.up, m.down);
      registered_.insert(layer);
    }
    rows_.clear();
    for (const ExpertTask& t : tasks) rows_.push_back({.expert = t.expert, .row0 = t.row0, .n_rows = t.n_rows});
    pending_ = dev_.submit((int)layer, rows_, xg, n_rows, yg);
  }

  void wait() override { pending_.wait(); }

 private:
  int index_;
  ExpertDevice dev_;
  std::set<int64_t> registered_;
  std::vector<ExpertRows> rows_;
  Pending pending_;
};

}  // namespace

std::shared_ptr<ExpertExecutor> make_expert_executor(int opencl_index) {
  return std::make_shared<OpenClExperts>(opencl_index);
}

}  // namespace xpert::opencl
