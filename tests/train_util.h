// Helpers the strategy suites (ddp, fsdp, pipeline) share to compare a run with its one-rank
// reference: that reference's config, the largest parameter difference, and a run that keeps every
// step's report.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/model.h"
#include "engine/train/train.h"

namespace dtlab::test {

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

inline double max_abs_diff(const Model& a, const Model& b) {
  REQUIRE(a.num_params() == b.num_params());
  double d = 0;
  for (int64_t i = 0; i < a.num_params(); i++)
    d = std::max(d, static_cast<double>(std::fabs(a.params()[i] - b.params()[i])));
  return d;
}

// A pipeline's 1F1B and ZB-H1 runs of `c` (its schedule is replaced): with one micro-batch per stage,
// I then W add the same gradients as B, so the two end bit for bit equal. Returns ZB-H1's (merged) parameters.
inline std::vector<float> zb_h1_equals_1f1b(TrainConfig c) {
  c.pipeline.schedule = ScheduleKind::OneFOneB;
  Trainer full(c);
  full.run();
  c.pipeline.schedule = ScheduleKind::ZBH1;
  Trainer split(c);
  split.run();
  const std::vector<float> a = full.result_model().merged_params(), b = split.result_model().merged_params();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) REQUIRE(a[i] == b[i]);
  return b;
}

// Two 16-bit runs that round at different places (a TP group sums 16-bit partial outputs the one-rank
// model never forms) agree "within the dtype's rounding" at each tensor's scale: in every parameter
// tensor, the largest difference is at most rtol (torch.testing's for the dtype: bf16 1.6e-2, fp16
// 1e-3) times the tensor's largest magnitude in `want`, or at most twice `want`'s own largest distance
// from `exact` (the float32 run: the rounding error the 16-bit model already carries there). The
// vectors are the plain model's parameters (spec's torch.nn.Sequential layout). Empty when they
// agree, else what differs.
inline std::string differs_at_tensor_scale(const ModelSpec& spec, const std::vector<float>& got, const std::vector<float>& want,
                                           const std::vector<float>& exact, double rtol) {
  if (got.size() != want.size() || exact.size() != want.size()) return "the runs hold different numbers of parameters";
  const Model layout(spec, nullptr, 0);
  for (const Parameter& p : layout.parameters()) {
    double scale = 0, worst = 0, err = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; i++) {
      const size_t k = static_cast<size_t>(i);
      scale = std::max(scale, std::fabs(double(want[k])));
      worst = std::max(worst, std::fabs(double(got[k]) - double(want[k])));
      err = std::max(err, std::fabs(double(want[k]) - double(exact[k])));
    }
    if (worst > std::max(rtol * scale, 2 * err))
      return p.name + " differs by " + std::to_string(worst) + ", more than " + std::to_string(rtol) + " x its largest value " +
             std::to_string(scale) + " and twice the 16-bit model's own error " + std::to_string(err);
  }
  return {};
}

// The README demo's run: mlp:2,64,64,3 on spiral, AdamW(lr 0.01, weight decay 0.01), seed 0. Set
// explicitly: TrainConfig's optimizer defaults are torch's (lr 1e-3, no decay), not the CLI's.
inline TrainConfig demo_config(const std::string& strategy, int world, int64_t batch, int64_t steps) {
  TrainConfig c;
  c.strategy = parse_strategy(strategy);
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,64,64,3");
  c.data = "spiral";
  c.batch = batch;
  c.steps = steps;
  c.optimizer.kind = OptimizerKind::AdamW;
  c.optimizer.lr = 0.01;
  c.optimizer.weight_decay = 0.01;
  c.seed = 0;
  return c;
}

// The sentence a Trainer's constructor refuses `c` with ("" when it accepts it).
inline std::string error_of(const TrainConfig& c) {
  try {
    Trainer t(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The one-rank reference of a distributed run: same model, data, seed and optimizer, on one rank
// with `batch` samples per step (the run's samples of a step over every rank).
inline TrainConfig single_like(const TrainConfig& distributed, int64_t batch) {
  TrainConfig c = distributed;
  c.strategy = Strategy::Single;
  c.world_size = 1;
  c.batch = batch;
  c.accum = 1;
  c.pipeline = PipelineOptions{};
  return c;
}

// The runs a strategy is held equal to its one-rank reference on: 2, 3 and 4 ranks, SGD with
// momentum and AdamW, one and two micro-batches a step. `config(world)` gives the run's config;
// `check(d, world, accum)` gets it with the optimizer and accumulation set.
template <class Config, class Check>
void for_each_reference_case(Config config, Check check) {
  for (int world : {2, 3, 4}) {
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
      for (int64_t accum : {int64_t{1}, int64_t{2}}) {
        CAPTURE(world);
        CAPTURE(optimizer_name(kind));
        CAPTURE(accum);
        TrainConfig d = config(world);
        d.accum = accum;
        d.optimizer = default_optimizer_config(kind);
        if (kind == OptimizerKind::SGD) d.optimizer.momentum = 0.9;
        check(d, world, accum);
      }
    }
  }
}

struct Trained {
  TrainSummary summary;
  std::vector<StepReport> steps;
};

inline Trained train(Trainer& t) {
  Trained r;
  r.summary = t.run([&](const StepReport& s) { r.steps.push_back(s); });
  return r;
}

// t.run() on a thread of its own, as the lab runs a stepped world: the test drives t.stepper()
// meanwhile. finish() waits a bounded time and aborts the run if it did not end; the destructor
// does the same, so a failed check never leaves the runner waiting at a gate.
class BackgroundRun {
 public:
  explicit BackgroundRun(Trainer& t) : t_(t), thread_([this] { body(); }) {}
  ~BackgroundRun() { finish(std::chrono::seconds(0)); }
  BackgroundRun(const BackgroundRun&) = delete;
  BackgroundRun& operator=(const BackgroundRun&) = delete;

  bool done() const { return done_; }
  // Waits up to `patience` for run() to return, then aborts it; true if it returned by itself.
  bool finish(std::chrono::milliseconds patience = std::chrono::seconds(30)) {
    const auto give_up = std::chrono::steady_clock::now() + patience;
    while (!done_ && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const bool ended = done_;
    if (!ended) t_.abort("the test gave up waiting for the run");
    if (thread_.joinable()) thread_.join();
    return ended;
  }
  const std::string& error() const { return error_; }  // what run() threw; read after finish()

 private:
  void body() {
    try {
      t_.run();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done_ = true;
  }
  Trainer& t_;
  std::string error_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// The model's analytic gradients `grads` (flat, taken at its current values) against central finite
// differences of `loss` (step h) at the first, middle and last element of every parameter: how many
// were checked, the worst relative difference (|fd - g| / max(0.01, |fd|)) and where it was.
struct FiniteDifferenceCheck {
  int checked = 0;
  double worst = 0;
  std::string at;
};
inline FiniteDifferenceCheck finite_differences(Model& m, const std::vector<float>& grads, const std::function<double()>& loss,
                                                float h = 1e-3f) {
  FiniteDifferenceCheck r;
  for (const Parameter& p : m.parameters())
    for (int64_t k : {int64_t{0}, p.numel / 2, p.numel - 1}) {
      float* w = p.data + k;
      const float keep = *w;
      *w = keep + h;
      const double up = loss();
      *w = keep - h;
      const double down = loss();
      *w = keep;
      const double fd = (up - down) / (2.0 * h);
      const double g = grads[static_cast<size_t>(p.offset + k)];
      const double rel = std::fabs(fd - g) / std::max(1e-2, std::fabs(fd));
      if (rel > r.worst) {
        r.worst = rel;
        r.at = p.name + "[" + std::to_string(k) + "]: analytic " + std::to_string(g) + ", numeric " + std::to_string(fd);
      }
      r.checked++;
    }
  return r;
}

// A 16-bit pipeline (`c` with --precision or --amp) against one rank of the same batch in the same
// dtype: the micro-batches' 16-bit gradients add up in another order than one rank's batch, so the
// parameters agree within the dtype's rounding at each tensor's scale (test::differs_at_tensor_scale,
// the float32 rank giving the rounding the 16-bit one already carries), and every step's loss within
// torch.testing's tolerance for the dtype. Trains `pipe` (built from `c`) and returns its run.
inline Trained check_16bit_like_one_rank(const TrainConfig& c, Trainer& pipe) {
  const Precision p = is_mixed(c.amp) ? c.amp : c.precision;
  const double rtol = p == Precision::BF16 ? 1.6e-2 : 1e-3;
  TrainConfig one_c = single_like(c, c.batch * c.pipeline.dp);
  one_c.tp = 1;  // (the one rank holds the whole model)
  one_c.sequence_parallel = false;
  Trainer one(one_c);
  const Trained want = train(one);
  one_c.amp = one_c.precision = Precision::FP32;
  Trainer exact(one_c);
  exact.run();
  const Trained got = train(pipe);
  const std::string why = differs_at_tensor_scale(c.model, pipe.result_model().merged_params(), one.result_model().merged_params(),
                                                  exact.result_model().merged_params(), rtol);
  CHECK_MESSAGE(why.empty(), why);
  REQUIRE(got.steps.size() == want.steps.size());
  for (size_t s = 0; s < got.steps.size(); s++) CHECK(std::fabs(got.steps[s].loss - want.steps[s].loss) <= 1e-5 + rtol * std::fabs(want.steps[s].loss));
  return got;
}

}  // namespace dtlab::test
