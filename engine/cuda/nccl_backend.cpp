#include "engine/cuda/nccl_backend.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/comm/data_mover.h"  // job_label
#include "engine/core/check.h"
#include "engine/comm/socket_mesh.h"
#include "engine/comm/watchdog.h"
#include "engine/cuda/compute_timer.h"  // NvtxRange
#include "engine/cuda/runtime.h"
#include "engine/cuda/issue_events.h"

#define DTLAB_NCCL_CHECK(call)                                                                     \
  do {                                                                                             \
    ncclResult_t dtlab_r_ = (call);                                                                \
    if (dtlab_r_ != ncclSuccess && dtlab_r_ != ncclInProgress)                                     \
      ::dtlab::cuda::fail_library(__FILE__, __LINE__, #call,                                       \
                                  std::string(ncclGetErrorString(dtlab_r_)) + " " + ncclGetLastError(nullptr)); \
  } while (0)

namespace dtlab {

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);  // e.g. 22809: major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

namespace {

using cuda::RankDevice;

// What a rank's watchdog shares with its world: one abort for everyone, and words for a diagnosis.
class NcclWatch {
 public:
  virtual ~NcclWatch() = default;
  virtual bool aborted(std::string& reason) = 0;
  virtual void abort(const std::string& reason) = 0;
  virtual std::string others(int rank) = 0;  // "; rank 0 is ..." for each other rank, or a note
  void set_activity(int rank, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (activity_.size() <= static_cast<size_t>(rank)) activity_.resize(static_cast<size_t>(rank) + 1, "idle");
    activity_[static_cast<size_t>(rank)] = std::move(what);
  }
  std::string activity(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(rank) < activity_.size() ? activity_[static_cast<size_t>(rank)] : "idle";
  }

 private:
  std::mutex mu_;
  std::vector<std::string> activity_;
};

// NCCL's element type for each of ours: a 16-bit bucket is summed as bfloat16 or float16 (NCCL 2.10+),
// not as the int64 words its bytes would fill.
ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I64: return ncclInt64;
  }
  DTLAB_CHECK(false, "nccl_type: a dtype NCCL is not given");
  return ncclInt64;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  if (op == ReduceOp::Max) return ncclMax;
  return op == ReduceOp::Avg ? ncclAvg : ncclSum;
}

// One rank's communicator: the queue and worker are QueuedCommunicator's; a job is one NCCL call.
class NcclRankComm : public QueuedCommunicator {
 public:
  NcclRankComm(int rank, int n, RankContext* ctx, AlgorithmDefaults defaults, ncclComm_t comm, const RankDevice& dev,
               cuda::IssueEvents& issued, NcclWatch& watch, double timeout_s, std::vector<Fault> faults)
      : QueuedCommunicator(rank, n, ctx, defaults), comm_(comm), dev_(dev), issued_(issued), watch_(watch),
        timeout_s_(timeout_s), faults_(std::move(faults)) {
    dev_.bind();
    DTLAB_CUDA_CHECK(cudaMalloc(&barrier_, sizeof(float)));  // NCCL has no barrier: a 1-float all-reduce
    start_worker();
  }
  ~NcclRankComm() override {
    stop_worker();
    dev_.bind();
    std::string reason;
    if (!aborted_ && watch_.aborted(reason)) abort_comm();  // a peer may be gone: never wait for it
    if (!aborted_) ncclCommDestroy(comm_);
    cudaFree(barrier_);
  }
  const char* backend_name() const override { return "nccl"; }
  // NCCL's send waits for the peer's receive: a paired exchange is one group (one job).
  bool send_recv_fused() const override { return true; }
  WorkPtr send_recv(const void* send_buf, int64_t send_count, int to, int send_tag, void* recv_buf, int64_t recv_count,
                    int from, int recv_tag, DType dt) override {
    return fused_send_recv(send_buf, send_count, to, send_tag, recv_buf, recv_count, from, dt);
  }
  // A process group's grouped all-to-all: every send and receive in one ncclGroupStart/End.
  WorkPtr group_send_recv(const std::vector<P2PPair>& pairs, int tag, DType dt) override { return grouped_send_recv(pairs, tag, dt); }

 private:
  WorkTimes run_job(CommJob& j) override {
    dev_.bind();
    const std::string what = job_name(j);
    cuda::NvtxRange range(job_label(j.desc.op, j.seq));
    std::string reason;
    if (watch_.aborted(reason)) throw CommError(reason);
    // The comm stream (not the host) waits for the compute the call was issued after.
    if (cudaEvent_t e = issued_.take()) {
      const cudaError_t err = cudaStreamWaitEvent(dev_.comm(), e, 0);
      issued_.recycle(e);
      DTLAB_CUDA_CHECK(err);
    }
    RankContext* c = ctx();
    double late = 0;
    for (const Fault& f : faults_) {  // the watchdog lessons: a rank that skips or arrives late
      if (j.p2p || f.rank != rank() || f.seq != j.seq) continue;
      if (f.kind == FaultKind::Skip) {
        const int64_t now = now_ns();
        const double t = c ? c->comm_clock() : 0;
        return WorkTimes{now, now, t, t};
      }
      watch_.set_activity(rank(), "delayed before " + what + " (fault injection)");
      std::this_thread::sleep_for(std::chrono::duration<double>(f.delay_s));
      late += f.delay_s;
    }
    const double begin = std::max(c ? c->comm_clock() : 0.0, j.issue_model) + late;
    // The stepper's gate was at the issue (QueuedCommunicator::gate); NCCL's steps run inside one
    // kernel, so a collective here has no ring-step gates.
    watch_.set_activity(rank(), "in " + what);
    const int64_t wall0 = now_ns();
    launch(j);
    wait_done(what);
    watch_.set_activity(rank(), "idle");
    return finish_job(j, wall0, begin, begin + modeled_duration(j));
  }

  void after_job(const std::string& error, bool internal) override {
    if (internal) watch_.abort(error);
    watch_.set_activity(rank(), error.empty() ? "idle" : "failed");
  }

  double modeled_duration(const CommJob& j) const {
    const CostModel* cost = ctx() ? ctx()->cost() : nullptr;
    if (!cost) return 0;
    const double bytes = static_cast<double>(payload_bytes(j.desc, j.p2p ? 1 : world_size()));
    if (!j.p2p) return cost->collective_time(j.desc.op, j.desc.algo, bytes);
    const bool send = j.desc.op == CollectiveOp::Send;
    const Link& link = cost->link(send ? rank() : j.peer, send ? j.peer : rank());
    return link.alpha + bytes * link.beta;
  }

  void launch(const CommJob& j) {
    const ncclDataType_t t = nccl_type(j.desc.dtype);
    const ncclRedOp_t op = nccl_op(j.desc.reduce);
    const size_t c = static_cast<size_t>(j.desc.count);
    const int root = j.desc.root;
    cudaStream_t s = dev_.comm();
    switch (j.desc.op) {
      case CollectiveOp::AllReduce: DTLAB_NCCL_CHECK(ncclAllReduce(j.buf, j.buf, c, t, op, comm_, s)); break;
      case CollectiveOp::ReduceScatter: DTLAB_NCCL_CHECK(ncclReduceScatter(j.in, j.buf, c, t, op, comm_, s)); break;
      case CollectiveOp::AllGather: DTLAB_NCCL_CHECK(ncclAllGather(j.in, j.buf, c, t, comm_, s)); break;
      case CollectiveOp::Broadcast: DTLAB_NCCL_CHECK(ncclBroadcast(j.buf, j.buf, c, t, root, comm_, s)); break;
      case CollectiveOp::Reduce: DTLAB_NCCL_CHECK(ncclReduce(j.buf, j.buf, c, t, op, root, comm_, s)); break;
      case CollectiveOp::Barrier: DTLAB_NCCL_CHECK(ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_, s)); break;
      case CollectiveOp::Send:
        if (!j.group.empty()) {  // group_send_recv: every pair in one group
          DTLAB_NCCL_CHECK(ncclGroupStart());
          for (const P2PPair& p : j.group) {
            DTLAB_NCCL_CHECK(ncclSend(p.send, static_cast<size_t>(p.send_count), t, p.to, comm_, s));
            DTLAB_NCCL_CHECK(ncclRecv(p.recv, static_cast<size_t>(p.recv_count), t, p.from, comm_, s));
          }
          DTLAB_NCCL_CHECK(ncclGroupEnd());
        } else if (j.fused) {  // send_recv: both in one group, so neither waits for the other's peer first
          DTLAB_NCCL_CHECK(ncclGroupStart());
          DTLAB_NCCL_CHECK(ncclSend(j.in, c, t, j.peer, comm_, s));
          DTLAB_NCCL_CHECK(ncclRecv(j.buf, static_cast<size_t>(j.recv_count), t, j.recv_peer, comm_, s));
          DTLAB_NCCL_CHECK(ncclGroupEnd());
        } else {
          DTLAB_NCCL_CHECK(ncclSend(j.buf, c, t, j.peer, comm_, s));
        }
        break;
      case CollectiveOp::Recv: DTLAB_NCCL_CHECK(ncclRecv(j.buf, c, t, j.peer, comm_, s)); break;
      case CollectiveOp::AllToAll: {
        const size_t block = c * static_cast<size_t>(dtype_size(j.desc.dtype));
        const int n = world_size(), me = rank();
        auto in_at = [&](int p) { return static_cast<const char*>(j.in) + p * block; };
        auto out_at = [&](int p) { return static_cast<char*>(j.buf) + p * block; };
        if (j.desc.algo == Algorithm::Pairwise) {  // n - 1 rounds: round k sends to me + k, receives from me - k
          DTLAB_CUDA_CHECK(cudaMemcpyAsync(out_at(me), in_at(me), block, cudaMemcpyDeviceToDevice, s));
          for (int k = 1; k < n; k++) {
            DTLAB_NCCL_CHECK(ncclGroupStart());
            DTLAB_NCCL_CHECK(ncclSend(in_at((me + k) % n), c, t, (me + k) % n, comm_, s));
            DTLAB_NCCL_CHECK(ncclRecv(out_at((me - k + n) % n), c, t, (me - k + n) % n, comm_, s));
            DTLAB_NCCL_CHECK(ncclGroupEnd());
          }
          break;
        }
        // Grouped, NCCL's own all-to-all: one group of n sends and n receives.
        DTLAB_NCCL_CHECK(ncclGroupStart());
        for (int p = 0; p < n; p++) {
          DTLAB_NCCL_CHECK(ncclSend(in_at(p), c, t, p, comm_, s));
          DTLAB_NCCL_CHECK(ncclRecv(out_at(p), c, t, p, comm_, s));
        }
        DTLAB_NCCL_CHECK(ncclGroupEnd());
        break;
      }
    }
  }

  // The watchdog: poll the stream and NCCL's asynchronous error against the timeout (a paused
  // stepper stops its clock, as in the threads backend), and abort the communicator on expiry.
  void wait_done(const std::string& what) {
    Deadline deadline(timeout_s_, ctx() ? ctx()->stepper() : nullptr);
    std::string reason;
    for (int spins = 0;; spins++) {
      const cudaError_t q = cudaStreamQuery(dev_.comm());
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        abort_comm();
        cuda::fail_cuda(__FILE__, __LINE__, "cudaStreamQuery (the NCCL kernel)", q);
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string msg = "nccl: " + what + " failed on rank " + std::to_string(rank()) + ": " +
                                ncclGetErrorString(async) + " " + ncclGetLastError(comm_);
        fail(msg);
      }
      if (watch_.aborted(reason)) {
        abort_comm();
        throw CommError(reason);
      }
      if (deadline.expired()) {
        std::ostringstream os;
        os << "watchdog: collective " << what << " on rank " << rank() << " (GPU " << dev_.device()
           << ") did not complete within " << timeout_s_ << " s; NCCL does not say which peer it waits for"
           << watch_.others(rank()) << "; the NCCL communicator was aborted (ncclCommAbort)";
        fail(os.str());
      }
      if (spins < 200) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  [[noreturn]] void fail(const std::string& msg) {
    abort_comm();
    watch_.abort(msg);
    throw CommError(msg);
  }

  void abort_comm() {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);  // ends the kernels waiting for peers; the communicator is gone after this
  }

  ncclComm_t comm_;
  const RankDevice& dev_;
  cuda::IssueEvents& issued_;
  NcclWatch& watch_;
  double timeout_s_;
  std::vector<Fault> faults_;
  void* barrier_ = nullptr;
  bool aborted_ = false;  // touched by the worker only (and the destructor after it stopped)
};

// NcclWorld's watch: the abort is its ThreadsWorld's (whose stepper also stops), and the diagnosis
// can say what every other rank is doing.
class WorldWatch : public NcclWatch {
 public:
  explicit WorldWatch(ThreadsWorld*& w) : w_(w) {}
  bool aborted(std::string& reason) override {
    if (!w_->stepper().aborted()) return false;
    reason = w_->status().error;
    if (reason.empty()) reason = "the world was aborted";
    return true;
  }
  void abort(const std::string& reason) override { w_->abort(reason); }
  std::string others(int rank) override {
    const WorldStatus s = w_->status();
    std::string out;
    for (int r = 0; r < static_cast<int>(s.compute_activity.size()); r++)
      if (r != rank)
        out += "; rank " + std::to_string(r) + " is " + activity(r) + " on its comm worker and " +
               s.compute_activity[static_cast<size_t>(r)] + " on its compute thread";
    return out;
  }

 private:
  ThreadsWorld*& w_;
};

// NcclProcess's watch: the abort travels over the rendezvous mesh, so every process stops with it.
class MeshWatch : public NcclWatch {
 public:
  explicit MeshWatch(SocketMesh& mesh) : mesh_(mesh) {}
  bool aborted(std::string& reason) override {
    if (!mesh_.aborted()) return false;
    reason = mesh_.abort_reason();
    return true;
  }
  void abort(const std::string& reason) override { mesh_.abort(reason); }
  std::string others(int) override { return "; the other ranks run in their own processes (their output says where they are)"; }

 private:
  SocketMesh& mesh_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// NcclWorld: the threads world provides ranks, contexts, recorder, stepper and run(); NCCL moves data.

struct NcclWorld::Impl {
  std::unique_ptr<ThreadsWorld> world;
  ThreadsWorld* world_ptr = nullptr;
  WorldWatch watch{world_ptr};
  std::vector<std::unique_ptr<RankDevice>> devices;
  std::vector<std::unique_ptr<cuda::IssueEvents>> issued;
  std::vector<std::unique_ptr<NcclRankComm>> inner;
  std::vector<std::unique_ptr<cuda::IssueRecordingComm>> comms;
};

NcclWorld::NcclWorld(int world_size, WorldOptions options) : impl_(std::make_unique<Impl>()) {
  const int have = cuda::device_count();
  if (world_size < 1 || world_size > have)
    throw Error("the nccl backend needs one GPU per rank: world size " + std::to_string(world_size) + " but " +
                (have == 0 ? cuda::unavailable_reason() : "this machine has " + std::to_string(have) + " CUDA devices") +
                " (NCCL refuses two ranks on one GPU; the cuda backend runs up to 16 ranks on one)");
  const AlgorithmDefaults defaults{options.allreduce_algo, options.broadcast_algo, options.reduce_algo, options.protocol,
                                   options.alltoall_algo};
  const double timeout_s = options.timeout_s;
  const std::vector<Fault> faults = options.faults;
  impl_->world = std::make_unique<ThreadsWorld>(world_size, std::move(options));
  impl_->world_ptr = impl_->world.get();
  std::vector<ncclComm_t> comms(static_cast<size_t>(world_size));
  std::vector<int> devs(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; r++) devs[static_cast<size_t>(r)] = r;
  cuda::prepare_pools(devs, /*peers_required=*/false);  // before NCCL maps peers' buffers
  DTLAB_NCCL_CHECK(ncclCommInitAll(comms.data(), world_size, devs.data()));
  for (int r = 0; r < world_size; r++) {
    impl_->devices.push_back(std::make_unique<RankDevice>(r, r));
    impl_->issued.push_back(std::make_unique<cuda::IssueEvents>(impl_->devices.back()->compute()));
    impl_->inner.push_back(std::make_unique<NcclRankComm>(r, world_size, &impl_->world->context(r), defaults,
                                                          comms[static_cast<size_t>(r)], *impl_->devices.back(),
                                                          *impl_->issued.back(), impl_->watch, timeout_s, faults));
    impl_->comms.push_back(std::make_unique<cuda::IssueRecordingComm>(*impl_->inner.back(), *impl_->issued.back(), "nccl"));
  }
}

NcclWorld::~NcclWorld() {
  impl_->comms.clear();
  impl_->inner.clear();  // joins the NCCL workers, destroys (or aborts) the communicators
}

int NcclWorld::world_size() const { return impl_->world->world_size(); }
Communicator& NcclWorld::comm(int rank) { return *impl_->comms.at(static_cast<size_t>(rank)); }
RankContext& NcclWorld::context(int rank) { return impl_->world->context(rank); }
MemoryTracker& NcclWorld::memory(int rank) { return impl_->world->memory(rank); }
cuda::RankDevice& NcclWorld::device(int rank) { return *impl_->devices.at(static_cast<size_t>(rank)); }
TraceRecorder& NcclWorld::recorder() { return impl_->world->recorder(); }
ThreadsWorld& NcclWorld::world() { return *impl_->world; }
Stepper& NcclWorld::stepper() { return impl_->world->stepper(); }
void NcclWorld::abort(const std::string& reason) { impl_->world->abort(reason); }

void NcclWorld::run(const std::function<void(int, Communicator&, RankContext&, cuda::RankDevice&)>& fn) {
  impl_->world->run([&](int rank, Communicator&, RankContext& ctx) {
    RankDevice& dev = device(rank);
    dev.bind();
    fn(rank, comm(rank), ctx, dev);
  });
}

// ---------------------------------------------------------------------------------------------
// NcclProcess: the unique id travels over the socket backend's rendezvous.

struct NcclProcess::Impl {
  std::unique_ptr<SocketMesh> mesh;
  std::unique_ptr<MeshWatch> watch;
  const RankDevice* device = nullptr;
  std::unique_ptr<cuda::IssueEvents> issued;
  std::unique_ptr<NcclRankComm> inner;
  std::unique_ptr<cuda::IssueRecordingComm> comm;
};

NcclProcess::NcclProcess(const SocketOptions& opt, const RankDevice& rank_device, RankContext* ctx)
    : impl_(std::make_unique<Impl>()) {
  const int device = rank_device.device();
  if (device < 0 || device >= cuda::device_count())
    throw Error("the nccl backend needs GPU " + std::to_string(device) + " for rank " + std::to_string(opt.rank) +
                " but " + (cuda::cuda_available() ? "this machine has " + std::to_string(cuda::device_count()) + " CUDA devices"
                                                  : cuda::unavailable_reason()));
  impl_->mesh = std::make_unique<SocketMesh>(
      MeshOptions{opt.rank, opt.world_size, opt.master_addr, opt.master_port, opt.timeout_s});
  impl_->watch = std::make_unique<MeshWatch>(*impl_->mesh);
  constexpr int kIdTag = -77;  // a point-to-point tag no program uses
  ncclUniqueId id{};
  if (opt.rank == 0) {
    DTLAB_NCCL_CHECK(ncclGetUniqueId(&id));
    for (int p = 1; p < opt.world_size; p++) {
      WireHeader h;
      h.kind = WireKind::P2P;
      h.tag = kIdTag;
      h.bytes = sizeof id;
      std::string why;
      if (!impl_->mesh->send(p, h, &id, why))
        throw CommError("nccl rendezvous: rank 0 could not send the NCCL id to rank " + std::to_string(p) + ": " + why);
    }
  } else {
    WireMessage msg;
    if (impl_->mesh->take(WireKind::P2P, 0, kIdTag, msg) != WaitEnd::Ok || msg.payload.size() != sizeof id)
      throw CommError("nccl rendezvous: rank " + std::to_string(opt.rank) + " did not receive the NCCL id from rank 0 within " +
                      std::to_string(opt.timeout_s) + " s");
    std::memcpy(&id, msg.payload.data(), sizeof id);
  }
  impl_->device = &rank_device;
  rank_device.bind();
  ncclComm_t comm = nullptr;
  DTLAB_NCCL_CHECK(ncclCommInitRank(&comm, opt.world_size, id, opt.rank));
  impl_->issued = std::make_unique<cuda::IssueEvents>(impl_->device->compute());
  impl_->inner = std::make_unique<NcclRankComm>(opt.rank, opt.world_size, ctx, opt.algorithms, comm, *impl_->device,
                                                *impl_->issued, *impl_->watch, opt.timeout_s, std::vector<Fault>{});
  impl_->comm = std::make_unique<cuda::IssueRecordingComm>(*impl_->inner, *impl_->issued, "nccl");
}

NcclProcess::~NcclProcess() {
  impl_->comm.reset();
  impl_->inner.reset();
}

Communicator& NcclProcess::comm() { return *impl_->comm; }
const cuda::RankDevice& NcclProcess::device() { return *impl_->device; }

}  // namespace dtlab
