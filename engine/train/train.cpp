#include "engine/train/train.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "engine/core/check.h"
#include "engine/core/ops.h"
#include "engine/data/loader.h"
#include "engine/data/sampler.h"
#include "engine/io/atomic_file.h"
#include "engine/io/checkpoint.h"
#include "engine/trace/export.h"

namespace dtlab {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void validate(const TrainConfig& c) {
  if (c.strategy != "single")
    throw Error("strategy '" + c.strategy +
                "' is not available in this version; use --strategy single");
  if (c.world_size != 1)
    throw Error("--strategy single runs one rank, but --world is " + std::to_string(c.world_size) +
                "; drop --world or set it to 1");
  if (c.batch < 1) throw Error("--batch must be at least 1 (got " + std::to_string(c.batch) + ")");
  if ((c.steps > 0) == (c.epochs > 0))
    throw Error("give exactly one of --steps K or --epochs E, each at least 1");
  if (!(c.optimizer.lr > 0)) throw Error("--lr must be greater than 0");
  if (c.optimizer.weight_decay < 0) throw Error("--weight-decay must be 0 or more");
  if (c.optimizer.momentum < 0 || c.optimizer.momentum >= 1)
    throw Error("--momentum must be in [0, 1)");
  if (!c.save_path.empty()) check_output_path("--save", c.save_path);
  if (!c.trace_path.empty()) check_output_path("--trace", c.trace_path);
}

}  // namespace

void check_data_fits_model(const Dataset& ds, const ModelSpec& spec) {
  if (ds.d != spec.in_features())
    throw Error("data " + ds.name + " has " + std::to_string(ds.d) + " features but " + spec.str() +
                " takes " + std::to_string(spec.in_features()) + " inputs; make the first width " +
                std::to_string(ds.d));
  if (ds.num_classes > spec.out_features())
    throw Error("data " + ds.name + " has " + std::to_string(ds.num_classes) + " classes but " +
                spec.str() + " has " + std::to_string(spec.out_features()) +
                " outputs; make the last width at least " + std::to_string(ds.num_classes));
}

EvalResult evaluate(Model& model, const Dataset& ds, int64_t batch, float* logits_out) {
  const int64_t C = model.spec().out_features();
  DTLAB_CHECK(batch > 0, "evaluate() needs a positive batch");
  Tensor probs({std::min(batch, std::max<int64_t>(ds.n, 1)), C}, MemCategory::Activations, nullptr);
  EvalResult r;
  double loss_sum = 0;
  for (int64_t i = 0; i < ds.n; i += batch) {
    int64_t B = std::min(batch, ds.n - i);
    const float* logits = model.forward(ds.x.data() + i * ds.d, B);
    loss_sum += static_cast<double>(cross_entropy_forward(probs.f32(), logits, ds.y.data() + i, B, C)) * B;
    r.correct += count_correct(logits, ds.y.data() + i, B, C);
    if (logits_out) std::copy(logits, logits + B * C, logits_out + i * C);
  }
  r.samples = ds.n;
  r.loss = ds.n > 0 ? static_cast<float>(loss_sum / static_cast<double>(ds.n)) : 0.0f;
  r.accuracy = ds.n > 0 ? static_cast<double>(r.correct) / static_cast<double>(ds.n) : 0.0;
  return r;
}

Trainer::Trainer(const TrainConfig& config) : config_(config), memory_(0) {
  validate(config_);
  // Instrumentation is always on (it costs well under 3% of a step, see bench/bench_step.cpp); the
  // trace file is only written when asked for.
  recorder_ = std::make_unique<TraceRecorder>(1);
  cost_ = std::make_unique<CostModel>(find_profile(config_.profile), 1);
  ctx_ = std::make_unique<RankContext>(0, recorder_.get(), cost_.get(), nullptr, &memory_);
  set_compute_threads(config_.threads);
  const ModelSpec& spec = config_.model;
  dataset_ = std::make_unique<Dataset>(
      make_dataset(config_.data, spec.in_features(), spec.out_features()));
  const Dataset& ds = *dataset_;
  if (ds.n == 0) throw Error("data " + config_.data + " holds no samples");
  check_data_fits_model(ds, spec);
  // Same count a DataLoader over a one-rank DistributedSampler gives.
  batches_per_epoch_ = config_.drop_last ? ds.n / config_.batch
                                         : (ds.n + config_.batch - 1) / config_.batch;
  if (batches_per_epoch_ == 0)
    throw Error("--batch " + std::to_string(config_.batch) + " is larger than the " +
                std::to_string(ds.n) + " samples of " + config_.data +
                ", so --drop-last leaves no batch; use a smaller --batch");
  total_steps_ = config_.steps > 0 ? config_.steps : config_.epochs * batches_per_epoch_;

  model_ = std::make_unique<Model>(spec, &memory_, config_.seed);
  model_->set_observer(ctx_.get());
  if (!config_.init_path.empty()) start_step_ = load_checkpoint(config_.init_path, *model_).step;
}

Trainer::~Trainer() {
  if (model_) model_->set_observer(nullptr);
}

TrainSummary Trainer::run(const std::function<void(const StepReport&)>& on_step) {
  const Dataset& ds = *dataset_;
  Model& model = *model_;
  const int64_t C = config_.model.out_features();
  Optimizer opt(config_.optimizer, model.num_params(), &memory_);

  SamplerConfig sc;
  sc.n = ds.n;
  sc.world_size = 1;
  sc.rank = 0;
  sc.shuffle = config_.shuffle;
  sc.seed = config_.seed;
  sc.drop_last = false;  // one rank: nothing to pad or drop at the sampler level
  DistributedSampler sampler(sc);
  DataLoader loader(ds, sampler, config_.batch, config_.drop_last);

  Tensor probs({config_.batch, C}, MemCategory::Activations, &memory_);
  Tensor dlogits({config_.batch, C}, MemCategory::Activations, &memory_);

  TrainSummary sum;
  sum.start_step = start_step_;
  int64_t epoch = 0, samples = 0;
  loader.start_epoch(epoch);
  sum.epochs_started = 1;
  Batch batch;
  auto t_start = Clock::now();
  for (int64_t step = 1; step <= total_steps_; step++) {
    if (!loader.next(batch)) {  // epoch exhausted: the user's loop calls set_epoch(epoch + 1)
      loader.start_epoch(++epoch);
      sum.epochs_started++;
      DTLAB_CHECK(loader.next(batch), "a fresh epoch produced no batch");
    }
    auto t0 = Clock::now();
    const int64_t B = batch.size;
    ctx_->begin_iteration(static_cast<int32_t>(step - 1), 0);
    const float* logits = model.forward(batch.x.data(), B);
    float loss;
    int64_t correct;
    {
      ComputeScope scope(ctx_.get(), ComputeKind::Loss, -1, 5.0 * B * C);
      loss = cross_entropy_forward(probs.f32(), logits, batch.y.data(), B, C);
      correct = count_correct(logits, batch.y.data(), B, C);
    }
    {
      ComputeScope scope(ctx_.get(), ComputeKind::ZeroGrad, -1, 0.0);
      model.zero_grad();
    }
    {
      ComputeScope scope(ctx_.get(), ComputeKind::LossBackward, -1, 2.0 * B * C);
      cross_entropy_backward(dlogits.f32(), probs.f32(), batch.y.data(), B, C, 1.0f / B);
    }
    model.backward(dlogits.f32());
    {
      ComputeScope scope(ctx_.get(), ComputeKind::OptimizerStep, -1, 10.0 * model.num_params());
      opt.step(model.params(), model.grads());
    }
    ctx_->end_iteration();
    double dt = seconds_since(t0);
    samples += B;

    StepReport r;
    r.step = step;
    r.total_steps = total_steps_;
    r.epoch = epoch;
    r.batch_size = B;
    r.loss = loss;
    r.accuracy = static_cast<double>(correct) / static_cast<double>(B);
    r.step_seconds = dt;
    r.samples_per_sec = dt > 0 ? B / dt : 0;
    if (on_step) on_step(r);
  }
  sum.seconds = seconds_since(t_start);
  sum.steps = total_steps_;
  sum.samples_per_sec = sum.seconds > 0 ? samples / sum.seconds : 0;
  sum.memory = memory_.stats();

  model.set_observer(nullptr);  // evaluation is not part of the training trace
  EvalResult ev = evaluate(model, ds, config_.batch);
  model.set_observer(ctx_.get());
  sum.eval_loss = ev.loss;
  sum.eval_accuracy = ev.accuracy;
  sum.eval_correct = ev.correct;
  sum.eval_samples = ev.samples;

  if (!config_.trace_path.empty()) {
    TraceExportOptions opt;
    opt.clock = config_.trace_modeled ? TraceClock::Modeled : TraceClock::Wall;
    opt.title = "dtlab train " + config_.model.str() + " on " + ds.name;
    export_chrome_trace(config_.trace_path, recorder_->all_events(), opt);
  }
  if (!config_.save_path.empty())
    save_checkpoint(config_.save_path, model, start_step_ + total_steps_,
                    {{"optimizer", config_.optimizer.str()}, {"data", config_.data},
                     {"seed", std::to_string(config_.seed)}});
  return sum;
}

}  // namespace dtlab
