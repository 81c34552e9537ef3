// The pipeline strategy's per-rank loop: the same data, loss and optimizer as the other strategies'
// run_rank (train.cpp), but the forward and backward are this rank's row of the pipeline schedule
// (engine/parallel/pipeline.h), so it gets its own loop.
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <type_traits>

#include "engine/core/check.h"
#include "engine/train/iteration_gate.h"
#include "engine/train/nonfinite.h"
#include "engine/train/train.h"

namespace dtlab {

namespace {

constexpr int64_t kRecordFloats = sizeof(PipelineRankIteration) / sizeof(float);
static_assert(sizeof(PipelineRankIteration) % sizeof(float) == 0 &&
              std::is_trivially_copyable_v<PipelineRankIteration>);

// Every tp-th record: each TP group's first rank, in pipeline-rank order.
std::vector<PipelineRankIteration> tp_leaders(const std::vector<PipelineRankIteration>& world, int tp) {
  if (tp == 1) return world;
  std::vector<PipelineRankIteration> leaders;
  for (size_t r = 0; r < world.size(); r += static_cast<size_t>(tp)) leaders.push_back(world[r]);
  return leaders;
}

}  // namespace

// World rank = (replica * p + pipeline rank) * tp + tp rank (engine/core/mesh.h). Every rank of a
// replica reads the same batches (its replica's DistributedSampler shard); the first stage takes the
// inputs, the last the labels.
void Trainer::run_pipeline_rank(int rank, Communicator& comm, RankContext& ctx, MemoryTracker& mem, TrainSummary& sum,
                                const std::function<void(const StepReport&)>& on_step) {
  const Dataset& ds = *dataset_;
  const PipelinePlan& plan = *pipeline_;
  const int N = config_.world_size, D = plan.options.dp;
  Device& dev = device(rank);
  dev.bind_thread();
  std::unique_ptr<DeviceTimer> timer = dev.make_timer(&ctx);  // a GPU's stream timing; null on the CPU
  const RankContext::TimerAttachment attached(&ctx, timer.get());
  PipelineRank pipe(plan, config_.model, rank, comm, &ctx, &mem, config_.seed, config_.optimizer, dev, timer.get(), config_.tp);
  ComputeObserver* const obs = timer ? static_cast<ComputeObserver*>(timer.get()) : &ctx;
  if (!config_.init_path.empty()) pipe.load_parameters(*models_[0]);
  PipelineMeter meter(plan, config_.tp);

  RankBatches data(config_, ds, D, pipe.replica());  // a replica's ranks share its shard
  // A device's batch is uploaded once per step; the stages read their micro-batches' rows there.
  const int64_t F = config_.model.in_features();
  Tensor x_dev, y_dev;
  if (!dev.is_host()) {
    x_dev = Tensor({config_.batch, F}, MemCategory::Activations, &mem, DType::F32, dev);
    y_dev = Tensor({config_.batch}, MemCategory::Activations, &mem, DType::I64, dev);
  }
  Tensor gathered({kRecordFloats * N}, MemCategory::Other, nullptr, DType::F32, dev);
  Tensor mine_dev({kRecordFloats}, MemCategory::Other, nullptr, DType::F32, dev);
  std::vector<float> all(static_cast<size_t>(kRecordFloats * N));
  std::vector<PipelineRankIteration> records(static_cast<size_t>(N));
  for (int64_t step = 1; step <= total_steps_; step++) {
    const int32_t iter = static_cast<int32_t>(step - 1);
    enter_iteration(&ctx, rank, iter);
    mem.reset_peaks();
    const auto t0 = std::chrono::steady_clock::now();
    {
      ComputeScope scope(obs, ComputeKind::ZeroGrad, -1, 0.0);
      pipe.zero_grad();
    }
    const Batch& batch = data.next();
    // Every replica's batch has batch.size samples (the sampler pads), so the step's mean loss
    // weighs each sample 1 / (D x batch.size).
    const float scale = 1.0f / static_cast<float>(batch.size * D);
    const float* x = batch.x.data();
    const int64_t* y = batch.y.data();
    if (!dev.is_host()) {
      dev.upload(x_dev.raw(), x, batch.size * F * static_cast<int64_t>(sizeof(float)));
      dev.upload(y_dev.raw(), y, batch.size * static_cast<int64_t>(sizeof(int64_t)));
      x = x_dev.f32();
      y = y_dev.i64();
    }
    PipelineRankIteration mine = pipe.run_iteration(x, y, batch.size, scale);
    // Non-finite input stops the step even if the loss comes out finite. A stage that computes no
    // loss reports NaN for it instead of 0, so every rank learns which replica's batch was bad.
    const bool input_bad = !config_.allow_nonfinite && has_nonfinite(batch.x.data(), batch.size * F);
    if (input_bad && mine.samples == 0) mine.loss_sum = std::numeric_limits<double>::quiet_NaN();
    pipe.reduce_gradients();
    {
      ComputeScope scope(obs, ComputeKind::OptimizerStep, -1, 10.0 * static_cast<double>(pipe.num_params()));
      pipe.step();
    }
    // Every rank learns every rank's figures (one all-gather, bit for bit, no rank-0-only sync).
    dev.upload(mine_dev.raw(), &mine, sizeof mine);
    comm.all_gather(gathered.f32(), mine_dev.f32(), kRecordFloats, DType::F32)->wait();
    dev.download(all.data(), gathered.raw(), gathered.nbytes());
    std::memcpy(static_cast<void*>(records.data()), all.data(), all.size() * sizeof(float));
    // A non-finite loss stops every rank with the same sentence; the last stage of a replica
    // computes its loss (where the values came from may be an earlier stage).
    if (!config_.allow_nonfinite)
      for (int r = 0; r < N; r++)
        if (!std::isfinite(records[static_cast<size_t>(r)].loss_sum)) {
          // A rank without a loss of its own (samples 0) says its batch was bad.
          const NonFiniteSite site{records[static_cast<size_t>(r)].samples == 0 ? NonFiniteSite::Input : NonFiniteSite::None, -1};
          throw RunStopped(nonfinite_stop_message(step, records[static_cast<size_t>(r)].loss_sum, r, site, *models_[0]));
        }
    if (timer) timer->flush();
    ctx.end_iteration();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rank_memory_[static_cast<size_t>(rank)] = mem.stats();
    std::vector<double> bubbles = meter.add(records);
    if (rank != 0) continue;
    // --tp: the ranks of a TP group compute one loss.
    double loss_sum = 0, correct = 0, samples = 0;
    for (const PipelineRankIteration& r : tp_leaders(records, config_.tp))
      loss_sum += r.loss_sum, correct += r.correct, samples += r.samples;
    total_samples_ += samples;
    StepReport r = make_step_report(step, total_steps_, data.epoch(), batch.size, loss_sum, correct, samples, dt);
    r.bubble = std::move(bubbles);
    if (on_step) on_step(r);
  }
  pipe.gather_parameters(rank == 0 ? models_[0].get() : nullptr);
  dev.synchronize();
  if (timer) timer->flush();
  if (rank == 0) {
    sum.epochs_started = data.epochs_started();
    sum.pipeline = meter.stats();
  }
  save_at_end(rank, *models_[0], &comm);
}

}  // namespace dtlab
