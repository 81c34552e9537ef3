// Helpers the strategy suites (ddp, fsdp, pipeline) share to compare a run with its one-rank
// reference: that reference's config, the largest parameter difference, and a run that keeps every
// step's report.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
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

}  // namespace dtlab::test
