#include "engine/comm/world.h"

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

std::unique_ptr<RankWorld> make_threads_world(int world_size, WorldOptions options) {
  return std::make_unique<HostWorld>(world_size, std::move(options));
}

}  // namespace dtlab
