// The CUDA build's part of a run (engine/cuda/platform.h): the cuda and nccl worlds behind RankWorld,
// each rank's GPU as a CudaDevice.
#include "engine/cuda/platform.h"

#include <vector>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/runtime.h"
#if DTLAB_HAVE_NCCL
#include "engine/cuda/nccl_backend.h"
#endif

namespace dtlab::cuda {

bool available() { return cuda_available(); }  // the rest of platform.h's queries are device.cpp's
std::string device_name(int device) { return device_info(device).name; }

namespace {

// A world of threads whose ranks live on GPUs: W is CudaWorld or NcclWorld. Members in this order so
// the devices (which free on the ranks' streams) go before the world that owns the streams.
template <class W>
class GpuWorld final : public RankWorld {
 public:
  GpuWorld(const char* backend, int n, WorldOptions o) : backend_(backend), world_(n, std::move(o)) {
    for (int r = 0; r < n; r++) devices_.push_back(std::make_unique<CudaDevice>(world_.device(r)));
  }
  ~GpuWorld() override { devices_.clear(); }
  const char* backend() const override { return backend_; }
  ThreadsWorld& threads() override { return world_.world(); }
  Communicator& comm(int rank) override { return world_.comm(rank); }
  Device& device(int rank) override { return *devices_.at(static_cast<size_t>(rank)); }
  void run(const std::function<void(int, Communicator&, RankContext&, Device&)>& fn) override {
    world_.run([&](int rank, Communicator& comm, RankContext& ctx, RankDevice&) { fn(rank, comm, ctx, device(rank)); });
  }
  void abort(const std::string& reason) override {
    if constexpr (requires(W& w) { w.abort(reason); }) world_.abort(reason);
    else world_.world().abort(reason);
  }

 private:
  const char* backend_;
  W world_;
  std::vector<std::unique_ptr<CudaDevice>> devices_;
};

}  // namespace

std::unique_ptr<RankWorld> make_cuda_world(int world_size, WorldOptions options) {
  if (!cuda_available()) throw Error("--backend cuda: " + cuda::unavailable_reason() + "; use --device cpu");
  return std::make_unique<GpuWorld<CudaWorld>>("cuda", world_size, std::move(options));
}

std::unique_ptr<RankWorld> make_nccl_world(int world_size, WorldOptions options) {
#if DTLAB_HAVE_NCCL
  if (!cuda_available()) throw Error("--backend nccl: " + cuda::unavailable_reason() + "; use --device cpu");
  return std::make_unique<GpuWorld<NcclWorld>>("nccl", world_size, std::move(options));
#else
  throw Error("--backend nccl needs NCCL, which this build does not have; use --backend cuda (ranks sharing a GPU)");
#endif
}

std::unique_ptr<Device> make_device(int rank, int device) {
  if (!cuda_available()) throw Error("--device cuda: " + cuda::unavailable_reason() + "; use --device cpu");
  if (device < 0 || device >= device_count())
    throw Error("rank " + std::to_string(rank) + " needs GPU " + std::to_string(device) + " but this machine has " +
                std::to_string(device_count()) + "; start fewer ranks per node");
  prepare_pools({device}, /*peers_required=*/false);
  return std::make_unique<CudaDevice>(std::make_unique<RankDevice>(rank, device));
}

std::unique_ptr<LaunchedRank> join_nccl(const SocketOptions& opt, Device& dev, RankContext* ctx) {
#if DTLAB_HAVE_NCCL
  struct Joined final : LaunchedRank {
    Joined(const SocketOptions& o, CudaDevice& d, RankContext* c)
        : proc(o, d.rank_device(), c) {}
    Communicator& comm() override { return proc.comm(); }
    NcclProcess proc;
  };
  auto* gpu = dynamic_cast<CudaDevice*>(&dev);
  DTLAB_CHECK(gpu, "join_nccl() needs the rank's CUDA device (make_device)");
  return std::make_unique<Joined>(opt, *gpu, ctx);
#else
  throw Error("--backend nccl needs NCCL, which this build does not have; run launched GPU ranks with an NCCL build");
#endif
}

}  // namespace dtlab::cuda
