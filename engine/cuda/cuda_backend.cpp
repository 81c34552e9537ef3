#include "engine/cuda/cuda_backend.h"

#include <nvtx3/nvToolsExt.h>

#include <cstdint>

#include "engine/comm/data_mover.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/issue_events.h"
#include "engine/cuda/kernels.h"

namespace dtlab {

namespace {

using cuda::RankDevice;

// Scratch from the device's stream-ordered pool: a collective allocates it every call, and
// cudaMalloc/cudaFree would synchronize the whole device (every other rank's work) each time.
class DeviceScratch : public CommScratch {
 public:
  DeviceScratch(const RankDevice& dev, int64_t bytes, MemoryTracker* tracker)
      : dev_(dev), bytes_(bytes), tracker_(tracker) {
    dev_.bind();
    DTLAB_CUDA_CHECK(cudaMallocAsync(&data_, static_cast<size_t>(bytes_), dev_.comm()));
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(dev_.comm()));  // other ranks' streams read it
    if (tracker_) tracker_->on_alloc(MemCategory::CommBuffers, bytes_);
  }
  ~DeviceScratch() override {
    // The algorithms free scratch only after every reader has finished its (synchronized) step.
    dev_.bind();
    cudaFreeAsync(data_, dev_.comm());
    if (tracker_) tracker_->on_free(MemCategory::CommBuffers, bytes_);
  }
  void* data() override { return data_; }

 private:
  const RankDevice& dev_;
  int64_t bytes_;
  MemoryTracker* tracker_;
  void* data_ = nullptr;
};

class CudaMover : public DataMover {
 public:
  explicit CudaMover(std::vector<RankDevice*> devs) : devs_(std::move(devs)) {
    for (RankDevice* d : devs_) issued_.push_back(std::make_unique<cuda::IssueEvents>(d->compute()));
  }

  const char* device_name() const override { return "cuda"; }
  bool slice_ring_steps() const override { return false; }
  cuda::IssueEvents& issued(int rank) { return *issued_[static_cast<size_t>(rank)]; }

  void copy(int rank, void* dst, const void* src, int64_t bytes) override {
    const RankDevice& d = dev(rank);
    // cudaMemcpyDefault: unified addressing tells device, peer device and host memory apart.
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, d.comm()));
    sync(d);
  }
  void reduce_into(int rank, void* dst, const void* src, int64_t count, DType dt, ReduceOp op) override {
    reduce_to(rank, dst, dst, src, count, dt, op);
  }
  void reduce_to(int rank, void* dst, const void* a, const void* b, int64_t count, DType dt, ReduceOp op) override {
    const RankDevice& d = dev(rank);
    const bool max = op == ReduceOp::Max;
    if (dt == DType::F32)
      cuda::launch_reduce_f32(d.comm(), static_cast<float*>(dst), static_cast<const float*>(a),
                              static_cast<const float*>(b), count, max);
    else if (dt == DType::BF16 || dt == DType::F16)
      cuda::launch_reduce_half(d.comm(), static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                               static_cast<const uint16_t*>(b), count, max, dt == DType::BF16 ? HalfFormat::BF16 : HalfFormat::FP16);
    else
      cuda::launch_reduce_i64(d.comm(), static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                              static_cast<const int64_t*>(b), count, max);
    sync(d);
  }
  // The ring's step as one kernel on float32 (reduce or copy, and Avg's division where the chunk is
  // final); the other types keep their reduction kernel or copy, which is one pass already.
  void reduce_copy(int rank, void* dst, const void* src, int64_t count, DType dt, ReduceOp op, bool reduce,
                   int finish_n) override {
    if (dt != DType::F32) return DataMover::reduce_copy(rank, dst, src, count, dt, op, reduce, finish_n);
    const RankDevice& d = dev(rank);
    const float scale = op == ReduceOp::Avg && finish_n > 1 ? 1.0f / static_cast<float>(finish_n) : 1.0f;
    cuda::launch_reduce_copy_f32(d.comm(), static_cast<float*>(dst), static_cast<const float*>(src), count, reduce,
                                 op == ReduceOp::Max, scale);
    sync(d);
  }
  void finish_avg(int rank, void* buf, int64_t count, DType dt, ReduceOp op, int n) override {
    if (dt != DType::F32 || op != ReduceOp::Avg || n == 1) return;
    const RankDevice& d = dev(rank);
    cuda::launch_scale(d.comm(), static_cast<float*>(buf), 1.0f / static_cast<float>(n), count);  // as reduce_kernels.h
    sync(d);
  }
  std::unique_ptr<CommScratch> scratch(int rank, int64_t bytes, MemoryTracker* tracker) override {
    return std::make_unique<DeviceScratch>(dev(rank), bytes, tracker);
  }

  // The job's steps read and write peers' buffers directly, so the host waits for the compute the
  // call was issued after (not just the comm stream).
  void begin_job(int rank, const std::string& label) override {
    dev(rank);
    cuda::IssueEvents& q = issued(rank);
    if (cudaEvent_t e = q.take()) {
      const cudaError_t err = cudaEventSynchronize(e);
      q.recycle(e);
      if (err != cudaSuccess) cuda::fail_cuda(__FILE__, __LINE__, "cudaEventSynchronize (the issuing compute)", err);
    }
    nvtxRangePushA(label.c_str());
  }
  void end_job(int rank) override { nvtxRangePop(); }

 private:
  const RankDevice& dev(int rank) {
    const RankDevice& d = *devs_[static_cast<size_t>(rank)];
    d.bind();  // the comm worker is a plain host thread
    return d;
  }
  static void sync(const RankDevice& d) {
    DTLAB_CUDA_CHECK(cudaGetLastError());
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(d.comm()));
  }
  std::vector<RankDevice*> devs_;
  std::vector<std::unique_ptr<cuda::IssueEvents>> issued_;
};

std::vector<int> checked_devices(int world_size, const std::vector<int>& devices) {
  if (!cuda::cuda_available())
    throw Error("the cuda backend needs a CUDA device: " + cuda::unavailable_reason() + "; use the threads backend");
  if (world_size < 1 || world_size > CudaWorld::kMaxWorldSize)
    throw Error("world size " + std::to_string(world_size) + " is out of range for the cuda backend; use 1 to " +
                std::to_string(CudaWorld::kMaxWorldSize));
  if (devices.empty()) throw Error("the cuda backend needs at least one device");
  for (int d : devices)
    if (d < 0 || d >= cuda::device_count())
      throw Error("CUDA device " + std::to_string(d) + " does not exist; this machine has " +
                  std::to_string(cuda::device_count()) + " (0.." + std::to_string(cuda::device_count() - 1) + ")");
  return devices;
}

// Ring steps read a neighbour's buffer in place, so every device must reach every other's memory,
// both cudaMalloc'd buffers (peer access) and the stream-ordered pool's scratch (pool access).
}  // namespace

struct CudaWorld::Impl {
  std::vector<std::unique_ptr<RankDevice>> devices;
  std::shared_ptr<CudaMover> mover;
  std::unique_ptr<ThreadsWorld> world;
  std::vector<std::unique_ptr<cuda::IssueRecordingComm>> comms;
};

CudaWorld::CudaWorld(int world_size, WorldOptions options, std::vector<int> devices)
    : impl_(std::make_unique<Impl>()) {
  devices = checked_devices(world_size, devices);
  std::vector<int> used(devices.begin(), devices.begin() + std::min<size_t>(devices.size(), static_cast<size_t>(world_size)));
  // Peers must reach each other's pool memory (the mover copies between ranks' buffers).
  cuda::prepare_pools(used, /*peers_required=*/true);
  std::vector<RankDevice*> raw;
  for (int r = 0; r < world_size; r++) {
    impl_->devices.push_back(std::make_unique<RankDevice>(r, devices[static_cast<size_t>(r) % devices.size()]));
    raw.push_back(impl_->devices.back().get());
  }
  impl_->mover = std::make_shared<CudaMover>(raw);
  options.mover = impl_->mover;
  impl_->world = std::make_unique<ThreadsWorld>(world_size, std::move(options));
  for (int r = 0; r < world_size; r++)
    impl_->comms.push_back(std::make_unique<cuda::IssueRecordingComm>(impl_->world->comm(r), impl_->mover->issued(r), "cuda"));
}

CudaWorld::~CudaWorld() {
  impl_->comms.clear();
  impl_->world.reset();  // joins the comm workers before the streams they use go away
}

int CudaWorld::world_size() const { return impl_->world->world_size(); }
Communicator& CudaWorld::comm(int rank) { return *impl_->comms.at(static_cast<size_t>(rank)); }
RankContext& CudaWorld::context(int rank) { return impl_->world->context(rank); }
MemoryTracker& CudaWorld::memory(int rank) { return impl_->world->memory(rank); }
cuda::RankDevice& CudaWorld::device(int rank) { return *impl_->devices.at(static_cast<size_t>(rank)); }
ThreadsWorld& CudaWorld::world() { return *impl_->world; }

void CudaWorld::run(const std::function<void(int, Communicator&, RankContext&, cuda::RankDevice&)>& fn) {
  impl_->world->run([&](int rank, Communicator&, RankContext& ctx) {
    RankDevice& dev = device(rank);
    dev.bind();
    fn(rank, comm(rank), ctx, dev);
  });
}

}  // namespace dtlab
