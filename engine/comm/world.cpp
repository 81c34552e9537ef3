#include "engine/comm/world.h"

#include <atomic>

namespace dtlab {

namespace {

class HostWorld final : public RankWorld {
 public:
  HostWorld(int n, WorldOptions o) : world_(n, std::move(o)) {}
  const char* backend() const override { return "threads"; }
  ThreadsWorld& threads() override { return world_; }
  Communicator& comm(int rank) override { return world_.comm(rank); }
  Device& device(int) override { return cpu_device(); }
  void run(const std::function<void(int, Communicator&, RankContext&, Device&)>& fn) override {
    world_.run([&](int rank, Communicator& comm, RankContext& ctx) { fn(rank, comm, ctx, cpu_device()); });
  }

 private:
  ThreadsWorld world_;
};

}  // namespace

namespace {
std::atomic<TestWorldFactory> g_test_world{nullptr};
}  // namespace

void set_test_world(TestWorldFactory f) { g_test_world.store(f); }
TestWorldFactory test_world() { return g_test_world.load(); }

std::unique_ptr<RankWorld> make_threads_world(int world_size, WorldOptions options) {
  return std::make_unique<HostWorld>(world_size, std::move(options));
}

}  // namespace dtlab
