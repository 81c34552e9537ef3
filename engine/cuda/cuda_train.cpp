#include "engine/cuda/cuda_train.h"

#include <algorithm>
#include <chrono>

#include "engine/comm/cuda_backend.h"
#include "engine/core/ops.h"
#include "engine/cuda/compute_timer.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/device_tensor.h"
#include "engine/cuda/ops.h"
#include "engine/cuda/optim.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/ddp.h"
#include "engine/trace/cost_model.h"
#if DTLAB_HAVE_NCCL
#include "engine/comm/nccl_backend.h"
#endif

namespace dtlab {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// DDP's construction-time buckets as ranges of the flat gradient. A bucket holds consecutive
// parameters (the assignment walks them in model order), so its gradients are one range.
struct GradRange {
  int64_t lo = 0, hi = 0;
};
std::vector<GradRange> bucket_ranges(const Model& m, const DdpOptions& o) {
  const BucketAssignment a = initial_bucket_assignment(parameter_bytes(m), o.first_bucket_bytes, o.bucket_cap_bytes);
  std::vector<GradRange> out;
  for (const std::vector<int>& b : a.buckets) {
    GradRange r{INT64_MAX, 0};
    for (int p : b) {
      const Parameter& prm = m.parameters()[static_cast<size_t>(p)];
      r.lo = std::min(r.lo, prm.offset);
      r.hi = std::max(r.hi, prm.offset + prm.numel);
    }
    if (r.hi > r.lo) out.push_back(r);
  }
  return out;
}

void copy_to_device(void* dst, const void* src, int64_t bytes, cudaStream_t s) {
  if (bytes > 0) DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, s));
}

void copy_to_host(void* dst, const void* src, int64_t bytes, cudaStream_t s) {
  if (bytes > 0) DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, s));
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace

CudaTrainer::CudaTrainer(const TrainConfig& config) : config_(config) {
  if (config_.device != "cuda") throw Error("CudaTrainer runs --device cuda; the CPU engine is Trainer");
  if (!cuda::cuda_available()) throw Error("--device cuda: " + cuda::unavailable_reason() + "; use --device cpu");
  if (config_.launched && config_.backend != "nccl")
    throw Error("under dtlab-cli launch the GPU engine runs --backend nccl, one GPU per process");
  if (config_.strategy != "single" && config_.strategy != "ddp")
    throw Error("--strategy " + config_.strategy + " runs on the CPU engine only; the GPU engine runs --strategy single and ddp (use --device cpu)");
  if (config_.skip_layer >= 0) throw Error("--skip-layer is the CPU engine's lesson of unused parameters; drop it with --device cuda");
  if (!config_.trace_path.empty())
    throw Error("--trace with --device cuda is not available yet (the GPU's events stay in the run); drop --trace or use --device cpu");
  if (config_.monitor_port != 0)
    throw Error("--monitor serves the CPU engine's launched runs; drop it with --device cuda");
  if (config_.backend != "cuda" && config_.backend != "nccl")
    throw Error("--device cuda runs on --backend cuda (ranks share a GPU) or nccl (one GPU per rank), not " + config_.backend);
  launched_ = config_.launched;
  // The blueprint checks the configuration the CPU engine's way and builds the data and each rank's
  // host model (initial values, --init); nothing trains on it.
  TrainConfig host = config_;
  host.device = "cpu";
  host.backend = launched_ ? "socket" : "threads";
  host.monitor_port = 0;
  blueprint_ = std::make_unique<Trainer>(host);
  const int N = config_.world_size;
  WorldOptions wo;
  wo.timeout_s = config_.timeout_s;
  wo.profile = config_.profile;
  wo.faults = config_.faults;
  wo.start_paused = config_.start_paused;
  if (config_.strategy == "ddp" && !launched_ && config_.backend == "cuda") {
    cuda_world_ = std::make_unique<CudaWorld>(N, wo);
  } else if (config_.strategy == "ddp" && !launched_) {
#if DTLAB_HAVE_NCCL
    nccl_world_ = std::make_unique<NcclWorld>(N, wo);
#else
    throw Error("--backend nccl needs NCCL, which this build does not have; use --backend cuda");
#endif
  } else {  // one rank here: single, or this process's rank of a launched world
    const int me = launched_ ? config_.socket.rank : 0;
    mem_ = std::make_unique<MemoryTracker>(me);
    rec_ = std::make_unique<TraceRecorder>(N);
    cost_ = std::make_unique<CostModel>(find_profile(config_.profile), N);
    stepper_ = std::make_unique<Stepper>(N, config_.start_paused);
    ctx_ = std::make_unique<RankContext>(me, rec_.get(), cost_.get(), stepper_.get(), mem_.get());
  }
}

CudaTrainer::~CudaTrainer() = default;

ThreadsWorld* CudaTrainer::world() {
  if (cuda_world_) return &cuda_world_->world();
#if DTLAB_HAVE_NCCL
  if (nccl_world_) return &nccl_world_->world();
#endif
  return nullptr;
}

TraceRecorder& CudaTrainer::recorder() { return world() ? world()->recorder() : *rec_; }
Stepper& CudaTrainer::stepper() { return world() ? world()->stepper() : *stepper_; }
RankContext& CudaTrainer::context() { return world() ? world()->context(0) : *ctx_; }
MemoryTracker& CudaTrainer::memory() { return world() ? world()->memory(0) : *mem_; }

void CudaTrainer::abort(const std::string& reason) {
#if DTLAB_HAVE_NCCL
  if (nccl_world_) return nccl_world_->abort(reason);
#endif
  if (ThreadsWorld* w = world()) w->abort(reason);
  else stepper_->abort();
}

cuda::DeviceMemory CudaTrainer::device_memory(int rank) const {
  int device = 0;
  if (launched_) device = config_.socket.local_rank;
#if DTLAB_HAVE_NCCL
  else if (nccl_world_) device = rank;
#endif
  return cuda::device_memory(device);
}

std::string CudaTrainer::describe() const {
  const int n = config_.world_size;
  std::string where = config_.strategy == "single" ? "one rank on device 0"
                      : config_.backend == "cuda"  ? std::to_string(n) + " ranks as threads sharing device 0, ring collectives on device memory"
                      : launched_                  ? "this process is rank " + std::to_string(config_.socket.rank) + " on device " +
                                                         std::to_string(config_.socket.local_rank) + ", NCCL collectives"
                                                   : std::to_string(n) + " ranks, one GPU each, NCCL collectives";
  return cuda::runtime_summary() + "\n  " + where;
}

TrainSummary CudaTrainer::run(const std::function<void(const StepReport&)>& on_step) {
  const int N = config_.world_size;
  TrainSummary sum;
  sum.effective_batch = effective_batch();
  rank_memory_.assign(static_cast<size_t>(N), MemoryStats{});
  total_samples_ = 0;
  auto t_start = Clock::now();
  if (cuda_world_) {
    cuda_world_->run([&](int r, Communicator& comm, RankContext& ctx, cuda::RankDevice& dev) {
      run_rank(r, &comm, &ctx, cuda_world_->memory(r), dev, sum, on_step);
    });
#if DTLAB_HAVE_NCCL
  } else if (nccl_world_) {
    nccl_world_->run([&](int r, Communicator& comm, RankContext& ctx, cuda::RankDevice& dev) {
      run_rank(r, &comm, &ctx, nccl_world_->memory(r), dev, sum, on_step);
    });
  } else if (launched_) {
    SocketOptions so = config_.socket;
    so.timeout_s = config_.timeout_s;
    NcclProcess proc(so, so.local_rank, ctx_.get());
    run_rank(so.rank, &proc.comm(), ctx_.get(), *mem_, proc.device(), sum, on_step);
#endif
  } else {
    cuda::RankDevice dev(0, 0);
    run_rank(0, nullptr, ctx_.get(), *mem_, dev, sum, on_step);
  }
  sum.seconds = seconds_since(t_start);
  sum.steps = total_steps();
  sum.samples_per_sec = sum.seconds > 0 ? total_samples_ / sum.seconds : 0;
  sum.rank_memory = rank_memory_;
  const int me = launched_ ? config_.socket.rank : 0;
  sum.memory = rank_memory_[static_cast<size_t>(me)];
  // Evaluation on the host copy of the trained parameters (run_rank downloaded them).
  Model& model = blueprint_->model();
  ComputeObserver* obs = model.observer();
  model.set_observer(nullptr);
  EvalResult ev = evaluate(model, dataset(), config_.batch);
  model.set_observer(obs);
  sum.eval_loss = ev.loss;
  sum.eval_accuracy = ev.accuracy;
  sum.eval_correct = ev.correct;
  sum.eval_samples = ev.samples;
  return sum;
}

void CudaTrainer::run_rank(int rank, Communicator* comm, RankContext* ctx, MemoryTracker& mem, cuda::RankDevice& dev,
                           TrainSummary& sum, const std::function<void(const StepReport&)>& on_step) {
  dev.bind();
  const Dataset& ds = dataset();
  Model& host = launched_ || rank == 0 ? blueprint_->model() : blueprint_->rank_model(rank);
  const int N = config_.world_size;
  const int64_t D = config_.model.in_features(), C = config_.model.out_features(), A = config_.accum;
  const int64_t Bmax = config_.batch;
  const int64_t P = host.num_params();
  const cudaStream_t s = dev.compute();

  cuda::DeviceModel model(host, &mem, dev);
  cuda::DeviceOptimizer opt(config_.optimizer, P, &mem, dev);
  cuda::DeviceComputeTimer timer(ctx, s);
  model.set_observer(&timer);
  using cuda::DeviceTensor;
  DeviceTensor gx({Bmax, D}, MemCategory::Activations, &mem, dev.device());
  DeviceTensor gy({Bmax}, MemCategory::Activations, &mem, dev.device(), DType::I64);
  DeviceTensor probs({Bmax, C}, MemCategory::Activations, &mem, dev.device());
  DeviceTensor losses({Bmax}, MemCategory::Activations, &mem, dev.device());
  DeviceTensor loss({1}, MemCategory::Activations, &mem, dev.device());
  DeviceTensor dlogits({Bmax, C}, MemCategory::Activations, &mem, dev.device());
  DeviceTensor stats({4}, MemCategory::CommBuffers, &mem, dev.device());
  std::vector<float> host_logits(static_cast<size_t>(Bmax * C));

  // DDP's constructor: every replica starts from rank 0's parameters.
  std::vector<GradRange> buckets;
  if (comm && N > 1) {
    comm->broadcast(model.params(), P, DType::F32, 0)->wait();
    buckets = bucket_ranges(host, config_.ddp);
  }

  RankBatches data(config_, ds, N, rank);
  const int64_t total = total_steps();
  for (int64_t step = 1; step <= total; step++) {
    const int32_t iter = static_cast<int32_t>(step - 1);
    if (ctx && !ctx->begin_iteration(iter, comm ? comm->collectives_issued() : 0))
      throw CommError("rank " + std::to_string(rank) + " stopped before iteration " + std::to_string(iter) + ": the run was aborted");
    mem.reset_peaks();
    auto t0 = Clock::now();
    double loss_sum = 0;
    int64_t correct = 0, samples = 0, last_batch = 0;
    model.zero_grad();
    for (int64_t micro = 0; micro < A; micro++) {
      const Batch& batch = data.next();
      const int64_t B = last_batch = batch.size;
      copy_to_device(gx.raw(), batch.x.data(), B * D * 4, s);
      copy_to_device(gy.raw(), batch.y.data(), B * 8, s);
      const float* logits = model.forward(gx.f32(), B);
      cuda::cross_entropy_forward(dev, probs.f32(), losses.f32(), loss.f32(), logits, gy.i64(), B, C);
      cuda::cross_entropy_backward(dev, dlogits.f32(), probs.f32(), gy.i64(), B, C, 1.0f / static_cast<float>(B * A));
      // The step's figures, as the CPU engine reports them: the mean loss and the correct count.
      float l = 0;
      copy_to_host(host_logits.data(), logits, B * C * 4, s);
      copy_to_host(&l, loss.f32(), 4, s);
      loss_sum += static_cast<double>(l) * B;
      correct += count_correct(host_logits.data(), batch.y.data(), B, C);
      samples += B;
      model.backward(dlogits.f32());
    }
    // DDP's averaging, bucket by bucket in launch order (bucket 0 holds the last layers).
    std::vector<WorkPtr> works;
    for (const GradRange& b : buckets) works.push_back(comm->all_reduce(model.grads() + b.lo, b.hi - b.lo, DType::F32, ReduceOp::Avg));
    for (WorkPtr& w : works) w->wait();
    opt.step(model.params(), model.grads());
    float m[4] = {static_cast<float>(loss_sum), static_cast<float>(correct), static_cast<float>(samples), -1.0f};
    if (comm && N > 1) {
      copy_to_device(stats.raw(), m, sizeof m, s);
      comm->all_reduce(stats.raw(), 4, DType::F32, ReduceOp::Sum)->wait();
      copy_to_host(m, stats.raw(), sizeof m, s);
    }
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(s));
    timer.flush();
    if (ctx) ctx->end_iteration();
    const double dt = seconds_since(t0);
    rank_memory_[static_cast<size_t>(rank)] = mem.stats();
    if (rank != 0) continue;
    total_samples_ += m[2];
    if (on_step) on_step(make_step_report(step, total, data.epoch(), last_batch, m[0], m[1], m[2], dt));
  }
  model.download_params(host);  // evaluation and --save read the host model
  if (rank == 0) {
    sum.epochs_started = data.epochs_started();
    if (!buckets.empty()) sum.buckets = describe_bucket_assignment(host, initial_bucket_assignment(parameter_bytes(host), config_.ddp.first_bucket_bytes, config_.ddp.bucket_cap_bytes));
    if (!config_.save_path.empty())
      save_checkpoint(config_.save_path, host, total,
                      {{"optimizer", config_.optimizer.str()}, {"data", config_.data}, {"seed", std::to_string(config_.seed)},
                       {"strategy", config_.strategy}, {"world", std::to_string(N)}, {"device", "cuda"}});
  }
  if (comm && N > 1 && !config_.save_path.empty()) comm->barrier()->wait();
}

}  // namespace dtlab
