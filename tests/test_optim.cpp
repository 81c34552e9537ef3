// Optimizer steps against hand-computed values (torch's formulas evaluated in double; torch 1.13's
// own float32 results are in the comments and agree to 1e-7), plus the contiguous-range contract.
#include <doctest/doctest.h>

#include <vector>

#include "engine/core/check.h"
#include "engine/core/optim.h"

using namespace dtlab;

TEST_SUITE("optim") {

TEST_CASE("AdamW: three steps with bias correction and decoupled weight decay") {
  OptimizerConfig c;
  c.kind = OptimizerKind::AdamW;
  c.lr = 0.1;
  c.weight_decay = 0.01;
  MemoryTracker mem;
  Optimizer opt(c, 1, &mem);
  CHECK(mem.stats().current_of(MemCategory::OptimizerState) == 0);  // lazy, as torch
  float p = 1.0f;
  const float grads[] = {0.5f, -0.25f, 0.125f};
  // p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  const double expected[] = {0.899000002, 0.8714672987058463, 0.8365529176159483};
  // torch.optim.AdamW(lr=0.1, weight_decay=0.01): 0.8990000486, 0.8714673519, 0.8365529776
  for (int t = 0; t < 3; t++) {
    opt.step(&p, &grads[t]);
    CHECK(p == doctest::Approx(expected[t]).epsilon(2e-7));
  }
  CHECK(opt.steps_taken() == 3);
  CHECK(mem.stats().current_of(MemCategory::OptimizerState) == 8);  // m and v, one float each
}

TEST_CASE("SGD with momentum and weight decay (nesterov off, dampening 0)") {
  OptimizerConfig c;
  c.kind = OptimizerKind::SGD;
  c.lr = 0.1;
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  Optimizer opt(c, 1, nullptr);
  float p = 1.0f;
  const float grads[] = {0.5f, -0.25f, 0.125f};
  // d = g + wd p; buf = d (first step) else 0.9 buf + d; p -= lr buf
  const double expected[] = {0.94, 0.9016, 0.845524};
  for (int t = 0; t < 3; t++) {
    opt.step(&p, &grads[t]);
    CHECK(p == doctest::Approx(expected[t]).epsilon(2e-7));
  }
}

TEST_CASE("plain SGD and dampening") {
  OptimizerConfig c;
  c.kind = OptimizerKind::SGD;
  c.lr = 0.5;
  MemoryTracker mem;
  Optimizer plain(c, 2, &mem);
  float p[2] = {1.0f, -2.0f};
  const float g[2] = {0.5f, 1.0f};
  plain.step(p, g);
  CHECK(p[0] == 0.75f);
  CHECK(p[1] == -2.5f);
  CHECK(mem.stats().current_of(MemCategory::OptimizerState) == 0);  // no momentum, no state

  c.momentum = 0.5;
  c.dampening = 0.5;
  Optimizer damped(c, 1, nullptr);
  float q = 0.0f, g1 = 1.0f;
  damped.step(&q, &g1);  // first step: buf = g (dampening not applied), q = -0.5
  damped.step(&q, &g1);  // buf = 0.5*1 + 0.5*1 = 1, q = -1
  CHECK(q == doctest::Approx(-1.0));
}

TEST_CASE("an optimizer over a sub-range touches only that range") {
  OptimizerConfig c;
  c.kind = OptimizerKind::AdamW;
  c.lr = 0.01;
  std::vector<float> params(10, 1.0f), grads(10, 1.0f);
  Optimizer shard(c, 4, nullptr);
  shard.step(params.data() + 3, grads.data() + 3);
  for (int i = 0; i < 10; i++) {
    if (i >= 3 && i < 7) CHECK(params[i] < 1.0f);
    else CHECK(params[i] == 1.0f);
  }
  CHECK(shard.exp_avg().numel() == 4);
}

TEST_CASE("optimizer names") {
  CHECK(parse_optimizer_kind("sgd") == OptimizerKind::SGD);
  CHECK(parse_optimizer_kind("adamw") == OptimizerKind::AdamW);
  CHECK_THROWS_WITH_AS(parse_optimizer_kind("adam"),
                       "optimizer 'adam' is not supported; use sgd or adamw", Error);
}

}  // TEST_SUITE
