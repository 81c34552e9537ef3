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
#include <string>
#include <thread>
#include <vector>

#include "engine/core/model.h"
#include "engine/train/train.h"

namespace dtlab::test {

inline double max_abs_diff(const Model& a, const Model& b) {
  REQUIRE(a.num_params() == b.num_params());
  double d = 0;
  for (int64_t i = 0; i < a.num_params(); i++)
    d = std::max(d, static_cast<double>(std::fabs(a.params()[i] - b.params()[i])));
  return d;
}

// The one-rank reference of a distributed run: same model, data, seed and optimizer, on one rank
// with `batch` samples per step (the run's samples of a step over every rank).
inline TrainConfig single_like(const TrainConfig& distributed, int64_t batch) {
  TrainConfig c = distributed;
  c.strategy = "single";
  c.world_size = 1;
  c.batch = batch;
  c.accum = 1;
  c.pipeline = PipelineOptions{};
  return c;
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

}  // namespace dtlab::test
