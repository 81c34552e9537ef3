// The dp strategy's per-rank loop, torch.nn.DataParallel's training loop:
//
//   model = nn.DataParallel(model)              # the module on device 0
//   for x, y in loader:                         # ONE loader: batch x world samples per step
//       loss = F.cross_entropy(model(x), y)     # scatter, replicate, parallel_apply, gather; loss on device 0
//       loss.backward()                         # scatter the gradient, replicas' backward, reduce-add onto device 0
//       optimizer.step()                        # device 0 only
//
// Rank 0 is that one process's thread for device 0: it loads the batches, computes the loss over the
// whole batch and steps. The other ranks are the devices' replicas; they know each batch's size (the
// one process knows it in torch) and hold nothing between iterations.
#include <chrono>
#include <cmath>
#include <limits>

#include "engine/core/check.h"
#include "engine/train/iteration_gate.h"
#include "engine/train/nonfinite.h"
#include "engine/train/train.h"

namespace dtlab {

namespace {

// The sizes of the batches rank 0's DataLoader yields, epoch after epoch, for the ranks that do not
// load them: full batches, then the partial last one unless drop_last.
class BatchSizes {
 public:
  BatchSizes(int64_t n, int64_t batch, bool drop_last)
      : n_(n), batch_(batch), per_epoch_(drop_last ? n / batch : (n + batch - 1) / batch) {}
  int64_t next() {
    if (at_ == per_epoch_) at_ = 0;
    return std::min(batch_, n_ - batch_ * at_++);
  }

 private:
  int64_t n_, batch_, per_epoch_, at_ = 0;
};

}  // namespace

void Trainer::run_dp_rank(int rank, Communicator& comm, RankContext& ctx, MemoryTracker& mem, TrainSummary& sum,
                          const std::function<void(const StepReport&)>& on_step) {
  const Dataset& ds = *dataset_;
  Model& model = *models_[static_cast<size_t>(rank)];
  Device& dev = model.device();
  dev.bind_thread();
  const int N = config_.world_size;
  const int64_t D = config_.model.in_features(), C = config_.model.out_features();
  const int64_t A = config_.accum, G = config_.batch * N;  // G: the batch rank 0 loads and scatters
  // On the CPU (dp's only device) the rank's context times the ops; the trainer made it the model's
  // observer already.
  ComputeObserver* const obs = &ctx;
  model.set_layer_gate(&ctx);  // a stepped run pauses before each layer of this rank's replica
  struct NoGate {
    Model& m;
    ~NoGate() { m.set_layer_gate(nullptr); }
  } no_gate{model};

  DataParallel dp(model, comm, &ctx);
  const bool module = dp.is_module();
  // Only the module's device loads data, computes the loss and holds the optimizer (and its state).
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<RankBatches> data;
  Tensor probs, dlogits, loss_stats;
  if (module) {
    opt = std::make_unique<Optimizer>(config_.optimizer, model.num_params(), &mem, dev);
    TrainConfig loader = config_;
    loader.batch = G;
    data = std::make_unique<RankBatches>(loader, ds, 1, 0);
    probs = Tensor({G, C}, MemCategory::Activations, &mem, DType::F32, dev);
    dlogits = Tensor({G, C}, MemCategory::Activations, &mem, DType::F32, dev);
    loss_stats = Tensor({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::F64, dev);
  }
  BatchSizes sizes(ds.n, G, config_.drop_last);

  double overlap_sum = 0;
  int64_t overlap_n = 0;
  for (int64_t step = 1; step <= total_steps_; step++) {
    const int32_t iter = static_cast<int32_t>(step - 1);
    enter_iteration(&ctx, rank, iter);
    mem.reset_peaks();
    const auto t0 = std::chrono::steady_clock::now();
    int64_t samples = 0, last_batch = 0;
    bool input_bad = false;
    double reduce_s = 0, overlapped_s = 0;
    if (module) {
      loss_stats.zero();
      ComputeScope scope(obs, ComputeKind::ZeroGrad, -1, 0.0);
      model.zero_grad();
    }
    for (int64_t micro = 0; micro < A; micro++) {
      const int64_t B = last_batch = sizes.next();
      const float* x = nullptr;
      const int64_t* y = nullptr;
      if (module) {
        const Batch& batch = data->next();
        DTLAB_CHECK(batch.size == B, "DataParallel: rank 0's batch has " + std::to_string(batch.size) +
                                         " rows where the replicas expect " + std::to_string(B));
        if (!config_.allow_nonfinite && !input_bad) input_bad = has_nonfinite(batch.x.data(), B * D);
        x = batch.x.data();
        y = batch.y.data();
      }
      const float* logits = dp.forward(x, B);
      if (module) {
        {
          ComputeScope scope(obs, ComputeKind::Loss, -1, 5.0 * B * C);
          dev.cross_entropy_forward(probs.f32(), loss_stats.f64(), logits, y, B, C);
        }
        // The mean over the whole batch, divided by the number of micro-batches (loss / accum).
        ComputeScope scope(obs, ComputeKind::LossBackward, -1, 2.0 * B * C);
        dev.cross_entropy_backward(dlogits.f32(), probs.f32(), y, B, C, 1.0f / static_cast<float>(B * A));
      }
      dp.backward(module ? dlogits.f32() : nullptr);
      samples += B;
      reduce_s += dp.last_stats().reduce_seconds;
      overlapped_s += dp.last_stats().overlapped_seconds;
    }
    double loss_sums[kLossStatsDoubles] = {0, 0};
    if (module) {
      {
        ComputeScope scope(obs, ComputeKind::OptimizerStep, -1, 10.0 * model.num_params());
        opt->step(model.params(), model.grads());
      }
      dev.download(loss_sums, loss_stats.f64(), sizeof loss_sums);
      // One process computed the loss: rank 0 stops the run, the other ranks fail their next wait.
      if (input_bad) loss_sums[0] = std::numeric_limits<double>::quiet_NaN();
      if (!config_.allow_nonfinite && !std::isfinite(loss_sums[0])) {
        const NonFiniteSite site = input_bad ? NonFiniteSite{NonFiniteSite::Input, -1} : find_nonfinite(model);
        throw RunStopped(nonfinite_stop_message(step, loss_sums[0], -1, site, model));
      }
    }
    ctx.end_iteration();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rank_memory_[static_cast<size_t>(rank)] = mem.stats();
    if (!module) continue;
    total_samples_ += static_cast<double>(samples);
    StepReport r = make_step_report(step, total_steps_, data->epoch(), last_batch, loss_sums[0], loss_sums[1],
                                    static_cast<double>(samples), dt);
    if (reduce_s > 0) {
      r.overlap = overlapped_s / reduce_s;
      overlap_sum += r.overlap;
      overlap_n++;
    }
    if (on_step) on_step(r);
  }
  dev.synchronize();
  if (module) {
    sum.epochs_started = data->epochs_started();
    sum.mean_overlap = overlap_n ? overlap_sum / static_cast<double>(overlap_n) : -1;
  }
  save_at_end(rank, *models_[0], &comm);
}

}  // namespace dtlab
