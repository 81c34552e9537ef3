// The dp strategy's hooks of the one per-rank loop (engine/train/rank_strategy.h), torch.nn.DataParallel's training loop:
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
#include "engine/train/grad_clip.h"
#include "engine/train/grad_scaler.h"
#include "engine/train/iteration_gate.h"
#include "engine/train/nonfinite.h"
#include "engine/train/rank_strategy.h"
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

// torch.nn.DataParallel's hooks of the one per-rank loop: only the module's rank (0) loads, computes
// the loss and steps; every rank takes part in each micro-batch's scatter, replicate and gather.
class DataParallelRank final : public RankStrategy {
 public:
  explicit DataParallelRank(const RankEnv& env)
      : t_(env.trainer), c_(t_.config_), env_(env), model_(*t_.models_[static_cast<size_t>(env.rank)]),
        dp_(model_, *env.comm, env.ctx), module_(dp_.is_module()), G_(c_.batch * c_.world_size),
        sizes_(t_.dataset().n, G_, c_.drop_last), model_obs_(model_.observer()) {
    // The rank's observer times the replica's ops: the context on the CPU, the device's timer (events
    // on the stream) on a GPU.
    model_.set_observer(env.obs);
    model_.set_layer_gate(env.ctx);  // a stepped run pauses before each layer of this rank's replica
    if (!module_) return;
    // Loss rows per sample: 1, or a GPT's T positions (C its vocabulary).
    const int64_t C = c_.model.out_features(), R = c_.model.rows_per_sample();
    // Only the module's device loads data, computes the loss and holds the optimizer (and its state).
    opt_ = std::make_unique<Optimizer>(c_.optimizer, model_.num_params(), &env.mem, env.dev);
    // A 16-bit module: the one process keeps the fp32 master weights, and under fp16 one GradScaler
    // (torch.cuda.amp.GradScaler in the single process DataParallel runs in: nothing to agree on).
    if (model_.mixed()) opt_->init_master(model_.params16(), model_.half_format());
    if (c_.precision == Precision::FP16 || c_.amp == Precision::FP16) scaler_ = make_grad_scaler(nullptr);
    TrainConfig loader = c_;
    loader.batch = G_;
    data_ = std::make_unique<RankBatches>(loader, t_.dataset(), 1, 0);
    probs_ = Tensor({G_ * R, C}, MemCategory::Activations, &env.mem, DType::F32, env.dev);
    dlogits_ = Tensor({G_ * R, C}, MemCategory::Activations, &env.mem, DType::F32, env.dev);
    loss_stats_ = Tensor({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::F64, env.dev);
    // On a GPU the one process's batch is uploaded to device 0 before scatter (torch's DataParallel
    // takes it from the host too: scatter copies each piece to its device); the CPU reads the loader's rows.
    if (!env.dev.is_host()) {
      x_dev_ = c_.model.is_gpt() ? Tensor({G_ * R}, MemCategory::Activations, &env.mem, DType::I64, env.dev)
                                 : Tensor({G_, c_.model.in_features()}, MemCategory::Activations, &env.mem, DType::F32, env.dev);
      y_dev_ = Tensor({G_ * R}, MemCategory::Activations, &env.mem, DType::I64, env.dev);
    }
  }
  ~DataParallelRank() override {
    model_.set_observer(model_obs_);
    model_.set_layer_gate(nullptr);
  }

  int64_t micro_batches() const override { return c_.accum; }

  void zero_grad(int64_t) override {
    reduce_s_ = overlapped_s_ = 0;
    if (!module_) return;
    loss_stats_.zero();
    ComputeScope scope(env_.obs, ComputeKind::ZeroGrad, -1, zero_grad_cost(model_.num_params()));
    model_.zero_grad();
  }

  void micro_batch(int64_t step, int64_t, bool, StepTally& t) override {
    const int64_t D = c_.model.in_features(), C = c_.model.out_features(), A = c_.accum;
    const bool gpt = c_.model.is_gpt();
    const int64_t B = t.last_batch = sizes_.next();
    const int64_t rows = B * c_.model.rows_per_sample();  // the loss's: a GPT's every position
    const float* x = nullptr;
    const int64_t *y = nullptr, *tok = nullptr;
    if (module_) {
      const Batch& batch = data_->next();
      DTLAB_CHECK(batch.size == B, "DataParallel: rank 0's batch has " + std::to_string(batch.size) +
                                       " rows where the replicas expect " + std::to_string(B));
      if (!gpt && !c_.allow_nonfinite && !t.input_bad) t.input_bad = has_nonfinite(batch.x.data(), B * D);
      x = batch.x.data();
      tok = batch.tok.data();
      y = batch.y.data();
      if (x_dev_.raw() != nullptr) {  // a GPU: device 0 holds the batch
        Device& dev = env_.dev;
        if (gpt) {
          dev.upload(x_dev_.raw(), tok, rows * static_cast<int64_t>(sizeof(int64_t)));
          tok = x_dev_.i64();
        } else {
          dev.upload(x_dev_.raw(), x, B * D * static_cast<int64_t>(sizeof(float)));
          x = x_dev_.f32();
        }
        dev.upload(y_dev_.raw(), y, rows * static_cast<int64_t>(sizeof(int64_t)));
        y = y_dev_.i64();
      }
    }
    // A GPT's module scatters whole samples (their token ids) and gathers their logits, T rows each.
    const float* logits = gpt ? dp_.forward_tokens(module_ ? tok : nullptr, B) : dp_.forward(x, B);
    Device& dev = env_.dev;
    if (module_) {
      {
        ComputeScope scope(env_.obs, ComputeKind::Loss, -1, cross_entropy_forward_cost(rows, C));
        dev.cross_entropy_forward(probs_.f32(), loss_stats_.f64(), logits, y, rows, C);
      }
      // The mean over the whole batch, divided by the number of micro-batches (loss / accum).
      ComputeScope scope(env_.obs, ComputeKind::LossBackward, -1, cross_entropy_backward_cost(rows, C));
      // fp16: scaler.scale(loss). The one process computes the whole loss, so --inject-overflow
      // overflows it whichever rank --inject-overflow-rank names.
      const float scale = scaler_ ? t_.loss_scale_for(*scaler_, step, c_.inject_overflow_rank) : 1.0f;
      dev.cross_entropy_backward(dlogits_.f32(), probs_.f32(), y, rows, C, scale / static_cast<float>(rows * A));
    }
    dp_.backward(module_ ? dlogits_.f32() : nullptr);
    t.samples += rows;
    reduce_s_ += dp_.last_stats().reduce_seconds;
    overlapped_s_ += dp_.last_stats().overlapped_seconds;
  }

  bool step(int64_t step) override {
    if (!module_) return true;
    scale_ = scaler_ ? scaler_->scale() : 0.0f;
    if (scaler_ && !scaler_allows_step(*scaler_, model_, nullptr, env_.ctx)) {  // scaler.step skips it, update backs off
      t_.rank_skipped_[0].push_back(step);
      skipped_ = true;
      return false;
    }
    skipped_ = false;
    // clip_grad_norm_(model.parameters()) on the module: its gradients hold the replicas' sum.
    const float unscale = scaler_ ? 1.0f / scale_ : 1.0f;
    clip_ = {};
    if (c_.clip_grad_norm > 0) {
      GradClipInput in;
      add_model_grads(in, model_);
      in.unscale = unscale;
      clip_ = clip_grad_norm(in, c_.clip_grad_norm, env_.dev, env_.ctx);
    }
    ComputeScope scope(env_.obs, ComputeKind::OptimizerStep, -1, optimizer_step_cost(model_.num_params()));
    if (model_.mixed()) opt_->step_mixed(model_.params16(), model_.grads16(), unscale * clip_.coef);
    else opt_->step(model_.params(), model_.grads());
    return true;
  }


  // One process computed the loss: the module's rank reads it; the replicas have nothing to add (a
  // non-finite loss stops the module's rank, and the others fail their next wait).
  StepSums exchange(int64_t, const StepTally& t) override {
    if (!module_) return {};
    double loss_sums[kLossStatsDoubles] = {0, 0};
    env_.dev.download(loss_sums, loss_stats_.f64(), sizeof loss_sums);
    if (t.input_bad) loss_sums[0] = std::numeric_limits<double>::quiet_NaN();
    return {loss_sums[0], loss_sums[1], static_cast<double>(t.samples), loss_sums[0]};
  }

  std::string diagnose_nonfinite(int64_t step, const StepSums& s, const StepTally& t) override {
    const NonFiniteSite site = t.input_bad ? NonFiniteSite{NonFiniteSite::Input, -1} : find_nonfinite(model_);
    return nonfinite_stop_message(step, s.loss_sum, -1, site, model_);
  }

  bool reports() const override { return module_; }

  void annotate(StepReport& r, const StepSums&) override {
    r.loss_scale = scale_;
    r.step_skipped = skipped_;
    annotate_clip(r, clip_);
    if (reduce_s_ <= 0) return;
    r.overlap = overlapped_s_ / reduce_s_;
    overlap_sum_ += r.overlap;
    overlap_n_++;
  }

  int64_t epoch() const override { return data_ ? data_->epoch() : 0; }
  int64_t epochs_started() const override { return data_ ? data_->epochs_started() : 0; }

  const Model& finish(TrainSummary& sum) override {
    if (module_) sum.mean_overlap = overlap_n_ ? overlap_sum_ / static_cast<double>(overlap_n_) : -1;
    if (scaler_) t_.loss_scale_ = scaler_->scale();
    return *t_.models_[0];
  }

 private:
  Trainer& t_;
  const TrainConfig& c_;
  RankEnv env_;
  Model& model_;
  DataParallel dp_;
  const bool module_;
  const int64_t G_;  // the batch rank 0 loads and scatters
  BatchSizes sizes_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<GradScaler> scaler_;  // fp16, on the module's rank
  GradClipResult clip_;                 // --clip-grad-norm: this step's, on the module's rank
  float scale_ = 0;
  bool skipped_ = false;
  ComputeObserver* model_obs_;  // the model's observer before this strategy set its own
  std::unique_ptr<RankBatches> data_;
  Tensor probs_, dlogits_, loss_stats_;
  Tensor x_dev_, y_dev_;  // a GPU's copy of rank 0's batch (inputs or tokens, and targets)
  double reduce_s_ = 0, overlapped_s_ = 0, overlap_sum_ = 0;
  int64_t overlap_n_ = 0;
};

std::unique_ptr<RankStrategy> make_data_parallel_rank(const RankEnv& env) { return std::make_unique<DataParallelRank>(env); }

}  // namespace dtlab
