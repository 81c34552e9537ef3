// Helpers the suites that drive the lab's Session without a window share (test_session.cpp,
// test_timeline_index.cpp): a small paused DDP run, and stepping it by hand.
#pragma once
#include <doctest/doctest.h>

#include <chrono>

#include "app/session.h"

namespace dtlab::test {

// A paused DDP run of a small MLP on `world` ranks, with small buckets so an iteration has several.
inline TrainConfig lab_config(int world) {
  TrainConfig c;
  c.strategy = Strategy::Ddp;
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,64,64,3");
  c.batch = 16;
  c.steps = 50;
  c.ddp.bucket_cap_bytes = 4096;
  c.ddp.first_bucket_bytes = 1024;
  c.start_paused = true;
  c.timeout_s = 60;
  return c;
}

// Steps the run `times` past gates of kind `k`, waiting for it to settle, and returns the snapshot.
inline const app::Snapshot& step(app::Session& s, GateKind k, int times = 1) {
  for (int i = 0; i < times; i++) {
    REQUIRE(s.wait_settled(std::chrono::seconds(20)));
    s.step(k);
  }
  REQUIRE(s.wait_settled(std::chrono::seconds(20)));
  return s.update();
}

}  // namespace dtlab::test
