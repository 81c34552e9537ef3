// The SnapshotBuilder (app/snapshot_builder.h) without a run or a window: events recorded by hand
// into a TraceRecorder, and world statuses and reports made up here, give the Snapshot the views
// would draw: ring cells from the steps every rank finished, bucket states, FSDP units, the
// collective in flight on a launched world, the event window, the data's owners, a clean reset.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include "app/alltoall_tracker.h"  // pick_alltoall
#include "app/snapshot_builder.h"
#include "engine/comm/group.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/format.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

// A 4-rank DDP run of a small MLP: what a Trainer would hand the builder, built without one. A mesh
// (`tp` > 1, or a pipeline of `stages`, dp = world / (tp x stages)) gets its pipeline plan too.
struct Rig {
  TrainConfig config;
  std::unique_ptr<Model> model;
  std::unique_ptr<Dataset> data;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<PipelinePlan> plan;
  TraceRecorder rec;
  SnapshotBuilder builder;

  explicit Rig(const std::string& strategy = "ddp", int world = 4, int tp = 1, int stages = 1) : rec(world) {
    config.strategy = parse_strategy(strategy);
    config.world_size = world;
    config.tp = tp;
    config.model = ModelSpec::parse(tp > 1 || stages > 1 ? "mlp:2,8,8,8,3" : "mlp:2,8,3");
    config.batch = 16;
    if (config.strategy == Strategy::Pipeline) {
      config.pipeline.stages = stages;
      config.pipeline.dp = world / (tp * stages);
      config.pipeline.schedule = ScheduleKind::GPipe;
      config.pipeline.microbatches = 1;
      plan = std::make_unique<PipelinePlan>(plan_pipeline(config.model, config.pipeline, config.batch, world / tp));
    }
    model = std::make_unique<Model>(config.model, nullptr, config.seed);
    data = std::make_unique<Dataset>(make_dataset(config.data, 2, 3));
    cost = std::make_unique<CostModel>(find_profile(config.profile), config.world_size);
    builder.reset(sources());
  }
  RunSources sources() const {
    RunSources run;
    run.config = &config;
    run.model = model.get();
    run.dataset = data.get();
    run.cost = cost.get();
    run.pipeline = plan.get();
    run.total_steps = 50;
    run.backend = "threads";
    return run;
  }
  const std::string& param(int i) const { return model->parameters()[static_cast<size_t>(i)].name; }
  void record(int rank, Event e, int32_t iteration = -1) {
    e.rank = rank;
    e.iteration = iteration;
    rec.record(e);
  }
  // Pulls the recorded events; `in_flight`: the world's oldest collective still running; `stepper`:
  // what the stepper holds (none: an empty state, as while the world runs).
  const Snapshot& frame(int64_t in_flight = -1, std::vector<int> missing = {}, const StepperState& stepper = {}) {
    builder.begin_frame(nullptr);
    builder.add_events(rec);
    builder.set_stepper(stepper);
    WorldStatus ws;
    ws.compute_activity.assign(static_cast<size_t>(config.world_size), "idle");
    ws.comm_activity.assign(static_cast<size_t>(config.world_size), "idle");
    if (in_flight >= 0) {
      CollectiveStatus cs;
      cs.seq = static_cast<uint64_t>(in_flight);
      for (int r = 0; r < config.world_size; r++)
        if (std::find(missing.begin(), missing.end(), r) == missing.end()) cs.arrived.push_back(r);
      cs.missing = missing;
      ws.in_flight.push_back(cs);
    }
    builder.set_world_status(ws);
    return builder.finish_frame();
  }
};

Event collective(EventKind kind, uint64_t seq, CollectiveOp op = CollectiveOp::AllReduce) {
  Event e(kind, kind == EventKind::CollectiveIssue ? Lane::Compute : Lane::Comm, 0, 0, 0, 0);
  e.coll.op = op;
  e.coll.algo = Algorithm::Ring;
  e.coll.reduce = ReduceOp::Sum;
  e.coll.dtype = DType::F32;
  e.coll.root = -1;
  e.coll.group_size = 4;
  e.coll.seq = seq;
  e.coll.in_count = e.coll.out_count = 1024;
  e.coll.bytes = 4096;
  return e;
}

Event ring_step(uint64_t seq, int step) {
  Event e(EventKind::RingStep, Lane::Comm, 0, 0, 0, 0);
  e.step.seq = seq;
  e.step.step = static_cast<int16_t>(step);
  e.step.steps = 6;
  e.step.chunk = -1;
  return e;
}

Event bucket_event(EventKind kind, int bucket, int32_t label = -1, int32_t param = -1, uint64_t seq = 0) {
  Event e(kind, Lane::Compute, 0, 0, 0, 0);
  e.bucket.bucket = static_cast<int16_t>(bucket);
  e.bucket.num_buckets = 2;
  e.bucket.param = param;
  e.bucket.label = label;
  e.bucket.seq = seq;
  return e;
}

Event unit_event(FsdpVerb verb, FsdpState state, int32_t label = -1, uint64_t seq = UINT64_MAX) {
  Event e(EventKind::FsdpUnit, Lane::Compute, 0, 0, 0, 0);
  e.fsdp.unit = 1;
  e.fsdp.num_units = 2;
  e.fsdp.verb = verb;
  e.fsdp.state = state;
  e.fsdp.shard_world = 4;
  e.fsdp.label = label;
  e.fsdp.numel = 27;
  e.fsdp.chunk = 7;
  e.fsdp.seq = seq;
  return e;
}

}  // namespace

TEST_SUITE("snapshot builder") {
  TEST_CASE("ring all-reduce: cells hold s + 2 contributions after step s, on the ranks that took it") {
    Rig rig;
    rig.record(0, collective(EventKind::CollectiveIssue, 1));
    for (int r = 0; r < 4; r++) rig.record(r, ring_step(1, 0));
    for (int r = 0; r < 3; r++) rig.record(r, ring_step(1, 1));  // rank 3 has not taken step 1 yet
    const Snapshot& a = rig.frame(1);
    const CollectiveView& cv = a.collective;
    REQUIRE(cv.valid);
    CHECK(cv.seq == 1);
    CHECK(cv.steps == 6);
    CHECK(cv.rank_steps_done == std::vector<int>{2, 2, 2, 1});
    CHECK(cv.steps_done == 1);  // the slowest rank's
    CHECK(cv.in_flight);
    CHECK(cv.phase == RingPhase::ReduceScatter);
    CHECK(cv.pending.size() == 4);
    CHECK(cv.chunks == 4);
    // Step s leaves chunk (r - s - 2) mod 4 on rank r holding s + 2 contributions.
    CHECK(cv.cells[0] == std::vector<int>{1, 3, 2, 1});
    CHECK(cv.cells[3] == std::vector<int>{1, 2, 1, 1});
    CHECK(cv.predicted_s > 0);
    CHECK(cv.busbw_gbs == doctest::Approx(cv.algbw_gbs * 1.5));  // 2(n-1)/n
    CHECK(cv.measured_s == -1);

    Event done = collective(EventKind::Collective, 1);
    done.wall_end_ns = 2'000'000;
    for (int r = 0; r < 4; r++) rig.record(r, done);
    const Snapshot& b = rig.frame();
    CHECK(b.collective.steps_done == 6);
    CHECK_FALSE(b.collective.in_flight);
    CHECK(b.collective.pending.empty());
    CHECK(b.collective.measured_s == doctest::Approx(0.002));  // rank 0's wall time
    for (const auto& row : b.collective.cells) CHECK(row == std::vector<int>{4, 4, 4, 4});
  }

  TEST_CASE("buckets: assigned, filled in gradient order, launched, all-reduced, a new pass empties them") {
    Rig rig;
    const int32_t last = rig.rec.intern(rig.param(2) + ", " + rig.param(3));
    const int32_t first = rig.rec.intern(rig.param(0) + ", " + rig.param(1));
    rig.record(0, bucket_event(EventKind::BucketAssigned, 0, last));
    rig.record(0, bucket_event(EventKind::BucketAssigned, 1, first));
    rig.record(0, bucket_event(EventKind::GradReady, 0, -1, 3), 0);
    rig.record(0, bucket_event(EventKind::GradReady, 0, -1, 2), 0);
    rig.record(0, bucket_event(EventKind::BucketReady, 0), 0);
    rig.record(0, bucket_event(EventKind::BucketLaunch, 0, -1, -1, 5), 0);
    rig.record(0, collective(EventKind::CollectiveIssue, 5));
    const Snapshot& a = rig.frame();
    REQUIRE(a.buckets.size() == 2);
    const BucketView& b0 = a.buckets[0];
    REQUIRE(b0.params.size() == 2);
    CHECK(b0.params[0].index == 2);
    CHECK(b0.params[0].bytes == 3 * 8 * 4);  // 2.weight: (3, 8) floats
    CHECK(b0.params[1].ready_order == 0);    // the bias's gradient came first
    CHECK(b0.params[0].ready_order == 1);
    CHECK(b0.state == BucketState::Launched);  // queued: no rank in it yet
    CHECK(b0.launch_order == 0);
    CHECK(a.buckets[1].state == BucketState::Empty);

    rig.record(0, ring_step(5, 0));
    const Snapshot& b = rig.frame(5);
    CHECK(b.buckets[0].state == BucketState::AllReducing);
    CHECK(b.collective.label == "DDP bucket 0: " + rig.param(2) + ", " + rig.param(3));
    Event end = collective(EventKind::Collective, 5);
    end.model_begin = 1.5, end.model_end = 2.5;
    rig.record(0, end);
    const Snapshot& c = rig.frame();
    CHECK(c.buckets[0].state == BucketState::Done);
    CHECK(c.buckets[0].allreduce_end == 2.5);

    // The comm worker can finish an all-reduce before rank 0 records the bucket's launch.
    rig.record(0, collective(EventKind::Collective, 7));
    rig.record(0, bucket_event(EventKind::BucketLaunch, 1, -1, -1, 7), 0);
    CHECK(rig.frame().buckets[1].state == BucketState::Done);

    rig.record(0, bucket_event(EventKind::GradReady, 1, -1, 1), 1);  // iteration 1's backward
    const Snapshot& d = rig.frame();
    CHECK(d.buckets[0].state == BucketState::Empty);
    CHECK(d.buckets[0].launch_order == -1);
    CHECK(d.buckets[1].state == BucketState::Filling);
    CHECK(d.buckets[1].params[1].ready_order == 0);
  }

  TEST_CASE("buckets: a PowerSGD bucket names each of its three all-reduces, and is done after the last") {
    Rig rig;
    rig.config.ddp.comm_hook = parse_comm_hook("powersgd:rank=1,start=2");
    rig.builder.reset(rig.sources());
    const int32_t last = rig.rec.intern(rig.param(2) + ", " + rig.param(3));
    rig.record(0, bucket_event(EventKind::BucketAssigned, 0, last));
    Event launch = bucket_event(EventKind::BucketLaunch, 0, -1, -1, 5);
    launch.bucket.collectives = 3;
    rig.record(0, launch, 2);
    // The whole tensors (3 floats), then P (3 floats); Q not issued yet.
    const int64_t counts[3] = {3, 3, 8};
    for (uint64_t k = 0; k < 2; k++) {
      Event issue = collective(EventKind::CollectiveIssue, 5 + k);
      issue.coll.in_count = issue.coll.out_count = counts[k];
      rig.record(0, issue, 2);
    }
    Event first = collective(EventKind::Collective, 5);
    first.coll.in_count = first.coll.out_count = counts[0];
    rig.record(0, first, 2);
    const Snapshot& a = rig.frame();
    const BucketView& b = a.buckets[0];
    CHECK(b.state == BucketState::Launched);  // its first all-reduce is done, not the bucket
    REQUIRE(b.parts.size() == 3);
    CHECK(b.parts[0].seq == 5);
    CHECK(b.parts[0].bytes == 12);
    CHECK(b.parts[0].done);
    CHECK(b.parts[1].bytes == 12);
    CHECK_FALSE(b.parts[1].done);
    CHECK(b.parts[2].seq == 7);
    CHECK(b.parts[2].bytes == -1);  // not issued yet
    CHECK(std::string(bucket_part_name(CommHook::PowerSgd, 1, 3)) == "P");

    rig.record(0, ring_step(6, 0), 2);
    CHECK(rig.frame(6).collective.label == "DDP bucket 0 (P): " + rig.param(2) + ", " + rig.param(3));
    for (uint64_t k = 1; k < 3; k++) {
      Event issue = collective(k == 2 ? EventKind::CollectiveIssue : EventKind::Collective, 5 + k);
      issue.coll.in_count = issue.coll.out_count = counts[k];
      rig.record(0, issue, 2);
    }
    CHECK(rig.frame().buckets[0].state != BucketState::Done);  // P done, Q issued: still on the wire
    Event end = collective(EventKind::Collective, 7);
    end.coll.in_count = end.coll.out_count = counts[2];
    rig.record(0, end, 2);
    const Snapshot& c = rig.frame();
    CHECK(c.buckets[0].state == BucketState::Done);
    CHECK(c.buckets[0].wire_bytes == (3 + 3 + 8) * 4);  // what each rank put into the three
    CHECK(c.buckets[0].parts[2].done);
  }

  TEST_CASE("FSDP: a unit's layout from its parameters' names, its all-gather from the collective") {
    Rig rig("fsdp");
    const int32_t names = rig.rec.intern(rig.param(2) + ", " + rig.param(3));
    for (int r = 0; r < 4; r++) rig.record(r, unit_event(FsdpVerb::Layout, FsdpState::Idle, names));
    rig.record(0, collective(EventKind::CollectiveIssue, 9, CollectiveOp::AllGather));
    rig.record(0, unit_event(FsdpVerb::Unshard, FsdpState::Forward, -1, 9));
    const Snapshot& a = rig.frame(9, {1, 2, 3});
    REQUIRE(a.units.size() == 2);
    const UnitView& u = a.units[1];
    CHECK(u.names == std::vector<std::string>{rig.param(2), rig.param(3)});
    CHECK(u.offsets == std::vector<int64_t>{0, 24});
    CHECK(u.sizes == std::vector<int64_t>{24, 3});
    CHECK(u.chunk == 7);
    CHECK(u.state[0] == FsdpState::Forward);
    CHECK(u.gathering == std::vector<uint8_t>{1, 0, 0, 0});
    CHECK(a.collective.missing == std::vector<int>{1, 2, 3});
    CHECK(a.collective.label == "FSDP unit 1 unshard: " + rig.param(2) + ", " + rig.param(3));
    CHECK(a.collective.cells[0] == std::vector<int>{4, 0, 0, 0});  // all-gather: its own chunk, final

    rig.record(0, collective(EventKind::Collective, 9, CollectiveOp::AllGather));
    const Snapshot& b = rig.frame();
    CHECK(b.units[1].gathering[0] == 0);
    CHECK(b.units[1].gathered[0] == 1);
  }

  TEST_CASE("FSDP ZeRO-1: each rank steps its slice of the whole flat parameter vector, across the units' edges") {
    // mlp:2,8,3's units: 0.weight + 0.bias (24) and 2.weight + 2.bias (27): 51 elements in chunks of
    // ceil(51 / 4) = 13, so rank 0 steps unit 0's first 13, rank 1 unit 0's last 11 and unit 1's first
    // 2, rank 3 unit 1's last 12. NO_SHARD: every rank steps everything.
    for (const Sharding sh : {Sharding::Zero1, Sharding::NoShard}) {
      CAPTURE(sharding_flag(sh));
      Rig rig("fsdp");
      rig.config.fsdp.sharding = sh;
      rig.builder.reset(rig.sources());
      const int32_t first = rig.rec.intern(rig.param(0) + ", " + rig.param(1));
      const int32_t second = rig.rec.intern(rig.param(2) + ", " + rig.param(3));
      for (int r = 0; r < 4; r++)
        for (int unit = 0; unit < 2; unit++) {
          Event e = unit_event(FsdpVerb::Layout, FsdpState::Idle, unit == 0 ? first : second);
          e.fsdp.unit = unit;
          e.fsdp.numel = unit == 0 ? 24 : 27;
          e.fsdp.chunk = unit == 0 ? 6 : 7;
          rig.record(r, e);
        }
      const Snapshot& a = rig.frame();
      REQUIRE(a.units.size() == 2);
      using Runs = std::vector<std::pair<int64_t, int64_t>>;
      if (sh == Sharding::Zero1) {
        CHECK(a.units[0].steps == Runs{{0, 13}, {13, 24}, {0, 0}, {0, 0}});
        CHECK(a.units[1].steps == Runs{{0, 0}, {0, 2}, {2, 15}, {15, 27}});
      } else {
        CHECK(a.units[0].steps == Runs(4, {0, 24}));
        CHECK(a.units[1].steps == Runs(4, {0, 27}));
      }
    }
    Rig full("fsdp");  // FULL_SHARD's units are drawn by chunk, not by stepped slice
    full.record(0, unit_event(FsdpVerb::Layout, FsdpState::Idle));
    CHECK(full.frame().units[1].steps.empty());
  }

  TEST_CASE("FSDP2: a unit's parameter shapes, and the 1/N shard reshard_after_forward=N keeps") {
    Rig rig("fsdp");
    const int32_t names = rig.rec.intern(rig.param(2) + ", " + rig.param(3));
    for (int r = 0; r < 4; r++) rig.record(r, unit_event(FsdpVerb::Layout, FsdpState::Idle, names));
    rig.record(1, unit_event(FsdpVerb::Unsharded, FsdpState::Forward));
    rig.record(1, unit_event(FsdpVerb::Reshard, FsdpState::Forward, -1, 2));  // kept 1/2
    rig.record(2, unit_event(FsdpVerb::Reshard, FsdpState::Forward));         // freed
    const Snapshot& a = rig.frame();
    const UnitView& u = a.units[1];
    REQUIRE(u.shapes.size() == 2);
    CHECK(shape_numel(u.shapes[0]) == 24);
    CHECK(u.shapes[0].size() == 2);  // a weight: (out, in), split on its rows
    CHECK(u.shapes[1] == Shape{3});
    CHECK(u.post_forward == std::vector<int16_t>{0, 2, 0, 0});
    CHECK(u.gathered[1] == 0);
    // Its backward's all-gather brings the full parameters back: no post-forward shard any more.
    rig.record(1, unit_event(FsdpVerb::Unsharded, FsdpState::PreBackward));
    CHECK(rig.frame().units[1].post_forward[1] == 0);
  }

  TEST_CASE("a launched world: the collective in flight is the oldest one some rank is in") {
    Rig rig;
    rig.record(0, collective(EventKind::CollectiveIssue, 3));
    std::vector<RankMonitorStatus> ranks(4);
    ranks[0].connected = ranks[1].connected = ranks[3].connected = true;
    ranks[0].current_seq = 3, ranks[1].current_seq = 4;
    ranks[1].done_seq = 3, ranks[3].done_seq = 2;
    ranks[1].memory.total_peak = 123;
    rig.builder.begin_frame(nullptr);
    rig.builder.add_events(rig.rec);
    rig.builder.set_rank_statuses(ranks);
    const Snapshot& s = rig.builder.finish_frame();
    CHECK(s.compute_activity[2] == "not connected");
    CHECK(s.compute_activity[0] == "starting");
    CHECK(s.memory[1].stats.total_peak == 123);
    CHECK(s.collective.in_flight);
    CHECK(s.collective.seq == 3);
    CHECK(s.collective.arrived == std::vector<int>{0, 1});
    CHECK(s.collective.missing == std::vector<int>{2, 3});
  }

  TEST_CASE("events: the last six iterations per rank, each event once, labels and clocks follow") {
    Rig rig;
    for (int it = 0; it < 10; it++)
      for (int k = 0; k < 2; k++) {
        Event e(EventKind::Compute, Lane::Compute, it, it + 1, it, it + 0.5);
        rig.record(1, e, it);
      }
    rig.rec.intern("a label");
    const Snapshot& a = rig.frame();
    CHECK(a.iteration == 9);
    REQUIRE(a.events[1].size() == 14);  // iterations 3 .. 9
    CHECK(a.events[1].front().iteration == 3);
    CHECK(a.events[0].empty());
    CHECK(a.clock_now_model == 9.5);
    CHECK(a.labels == std::vector<std::string>{"a label"});
    CHECK(rig.frame().events[1].size() == 14);  // nothing new: nothing added
    CHECK(rig.builder.snapshot().frame == 2);
  }

  TEST_CASE("reports, the run's end, the data's owners per epoch, and a reset") {
    Rig rig;
    std::vector<StepReport> reports(2);
    reports[0].step = 1, reports[1].step = 2;
    reports[1].epoch = 1;
    reports[1].loss = 0.5f;
    rig.builder.set_reports(reports, "", false);
    const Snapshot& a = rig.frame();
    REQUIRE(a.history.size() == 2);
    CHECK(a.history[1].loss == 0.5f);
    CHECK(a.step == 2);
    CHECK(a.running);
    CHECK_FALSE(a.finished);
    REQUIRE(a.data.valid);
    CHECK(a.data.epoch == 1);
    int owned[4] = {};
    for (int16_t o : a.data.owner) {
      REQUIRE(o >= 0);
      owned[o]++;
    }
    CHECK(owned[0] == a.data.n / 4);
    CHECK(owned[3] == a.data.n / 4);
    const std::vector<int16_t> epoch1 = a.data.owner;
    rig.builder.set_data_set_epoch(false);  // every epoch in epoch 0's order
    const Snapshot& b = rig.frame();
    CHECK_FALSE(b.data.set_epoch);
    CHECK(b.data.epoch == 1);
    CHECK(b.data.owner != epoch1);

    rig.builder.set_reports({}, "rank 2 timed out", true);  // reports are handed over once
    const Snapshot& c = rig.frame();
    CHECK_FALSE(c.running);
    CHECK_FALSE(c.finished);  // it ended with an error
    CHECK(c.error == "rank 2 timed out");

    rig.builder.reset(rig.sources());
    const Snapshot& d = rig.builder.snapshot();
    CHECK(d.frame == 0);
    CHECK(d.history.empty());
    CHECK_FALSE(d.collective.valid);
    CHECK(d.events.size() == 4);
    CHECK(d.param_names.size() == 4);
    CHECK(d.config.world == 4);
    CHECK(d.config.num_params == 2 * 8 + 8 + 8 * 3 + 3);
    CHECK(d.total_steps == 50);
  }

  // A long run once grew the lab by 460 MB in 7 minutes at world 8: one report and one entry per
  // collective kept for ever. Both are bounded now, and what the views read stays right.
  TEST_CASE("a long run: the step history and the collectives the builder remembers stay bounded") {
    Rig rig;
    const int64_t steps = static_cast<int64_t>(3 * (kHistoryExact + kHistoryThinned));
    int64_t skipped = 0;
    for (int64_t k = 1; k <= steps; k += 1000) {
      std::vector<StepReport> fresh;
      for (int64_t i = k; i < std::min(k + 1000, steps + 1); i++) {
        StepReport r;
        r.step = i;
        r.loss = static_cast<float>(i);
        r.step_skipped = i % 997 == 0;
        skipped += r.step_skipped;
        fresh.push_back(r);
      }
      rig.builder.set_reports(fresh, "", false);
    }
    const Snapshot& s = rig.frame();
    CHECK(s.steps_reported == steps);
    CHECK(s.steps_skipped == skipped);
    CHECK(s.last_skipped_step == steps / 997 * 997);
    CHECK(s.step == steps);
    REQUIRE(s.history.size() <= kHistoryExact + kHistoryThinned);
    CHECK(s.history.front().step == 1);  // the curve still starts at the run's start
    for (size_t i = 1; i < s.history.size(); i++) REQUIRE(s.history[i].step > s.history[i - 1].step);
    for (size_t i = s.history.size() - kHistoryExact; i < s.history.size(); i++)  // the newest, every step
      REQUIRE(s.history[i].step == steps - static_cast<int64_t>(s.history.size() - 1 - i));

    // 5,000 all-reduces, every rank's: the builder keeps about the newest thousand, and the view
    // still shows the newest with its ring steps.
    for (uint64_t seq = 1; seq <= 5000; seq++)
      for (int r = 0; r < 4; r++) rig.record(r, collective(EventKind::Collective, seq));
    rig.record(0, collective(EventKind::CollectiveIssue, 5001));
    for (int r = 0; r < 4; r++) rig.record(r, ring_step(5001, 0));
    const Snapshot& t = rig.frame(5001);
    CHECK(rig.builder.collectives_kept() <= 2 * 1024 + 1);
    CHECK(t.collective.seq == 5001);
    CHECK(t.collective.rank_steps_done == std::vector<int>{1, 1, 1, 1});
  }

  TEST_CASE("a mesh's data view counts samples per data-parallel replica and names the ranks that read them") {
    // Without a mesh each rank is its own replica.
    Rig plain;
    CHECK_FALSE(plain.frame().data.by_replica);
    CHECK(plain.builder.snapshot().data.owners.size() == 4);
    CHECK(plain.builder.snapshot().data.owners[3].name == "rank 3");
    CHECK(plain.builder.snapshot().data.owners[3].ranks.empty());

    struct Case {
      const char* strategy;
      int world, tp, stages;
      std::vector<std::string> ranks;  // per replica
    };
    for (const Case& k : {Case{"ddp", 4, 2, 1, {"ranks 0, 1", "ranks 2, 3"}}, Case{"fsdp", 4, 2, 1, {"ranks 0, 1", "ranks 2, 3"}},
                          Case{"pipeline", 8, 2, 2, {"ranks 0-3", "ranks 4-7"}}, Case{"pipeline", 4, 1, 2, {"ranks 0, 1", "ranks 2, 3"}}}) {
      CAPTURE(k.strategy);
      CAPTURE(k.world);
      CAPTURE(k.tp);
      Rig rig(k.strategy, k.world, k.tp, k.stages);
      const DataView& d = rig.frame().data;
      REQUIRE(d.valid);
      CHECK(d.by_replica);
      REQUIRE(d.owners.size() == 2);
      CHECK(d.owners[0].name == "replica 0");
      CHECK(d.owners[1].name == "replica 1");
      CHECK(d.owners[0].ranks == k.ranks[0]);
      CHECK(d.owners[1].ranks == k.ranks[1]);
      // Two replicas split the default spiral (3 classes x 1000 points) in halves; no rank of a
      // replica has a share of its own.
      CHECK(d.n == 3000);
      int64_t count[3] = {};  // replica 0, replica 1, anything else
      for (int16_t o : d.owner) count[o == 0 || o == 1 ? o : 2]++;
      CHECK(count[2] == 0);
      CHECK(count[0] == d.n / 2);
      CHECK(count[1] == d.n / 2);
      CHECK(count[0] == 1500);
    }
  }

  TEST_CASE("pipeline tracker with --tp 2: rows by stage and TP group, world ranks to (replica, stage), bubbles per replica") {
    Rig rig("pipeline", 8, 2, 2);  // dp 2 x pp 2 x tp 2, GPipe, one micro-batch
    const PipelineView& pv = rig.builder.snapshot().pipeline;
    REQUIRE(pv.valid);
    CHECK(pv.tp == 2);
    CHECK(pv.dp == 2);
    REQUIRE(pv.rows.size() == 2);
    CHECK(pv.rows[0].rank == 0);
    CHECK(pv.rows[1].rank == 2);
    CHECK(pv.rows[0].label == "stage 0: ranks 0, 1");
    CHECK(pv.rows[1].label == "stage 1: ranks 2, 3");
    CHECK(pv.rows[1].ranks == "ranks 2, 3");
    CHECK(pv.replica_ranks == "ranks 0-3");
    const int pipe[8] = {0, 0, 1, 1, 0, 0, 1, 1}, replica[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    REQUIRE(pv.ranks.size() == 8);
    for (int r = 0; r < 8; r++) {
      CAPTURE(r);
      CHECK(pv.ranks[static_cast<size_t>(r)].pipe_rank == pipe[r]);
      CHECK(pv.ranks[static_cast<size_t>(r)].replica == replica[r]);
    }

    // One iteration: every rank runs its stage's row of the plan, action k in time step k for 1 s.
    const PipelineSchedule& plan = rig.plan->schedule;
    for (int r = 0; r < 8; r++)
      for (size_t t = 0; t < plan.order[static_cast<size_t>(pipe[r])].size(); t++) {
        const auto& a = plan.order[static_cast<size_t>(pipe[r])][t];
        if (!a) continue;
        Event e(EventKind::PipelineAction, Lane::Compute, 0, 0, static_cast<double>(t), static_cast<double>(t) + 1);
        e.pipe.stage = static_cast<int16_t>(a->stage);
        e.pipe.mb = static_cast<int16_t>(a->mb);
        e.pipe.type = a->type;
        e.pipe.step = static_cast<int16_t>(t);
        rig.record(r, e, 0);
      }
    const Snapshot& s = rig.frame();
    REQUIRE(s.pipeline.complete);
    CHECK(s.pipeline.bubble_iteration == 0);
    // The stages' makespan spans the replica (F0 on stage 0, F0 B0 on stage 1, B0 on stage 0: 4 s);
    // each stage is busy 2 s of it, and the TP partners of a stage idle alike.
    for (int r = 0; r < 8; r++) {
      CAPTURE(r);
      CHECK(s.pipeline.ranks[static_cast<size_t>(r)].bubble == doctest::Approx(0.5));
    }
    CHECK(&s.pipeline.row(1) == &s.pipeline.ranks[2]);
    CHECK(s.pipeline.row(1).done.size() == 2);
  }
  // The toolbar's "Next:" line: what the held item is for, and which key does what from here.
  TEST_CASE("all-to-all: an EP group's pairwise exchange becomes the matrix of bytes per pair, step by step") {
    Rig rig("ddp", 4);
    const int32_t group = 1 + rig.rec.intern(group_label("ep0", {1, 2, 3}));
    // Elements group rank i sends to group rank j (all_to_all_v's split sizes); float32.
    const int64_t S[3][3] = {{5, 7, 2}, {3, 4, 9}, {6, 1, 8}};
    auto issue = [&](EventKind kind, int i) {
      Event e = collective(kind, 3, CollectiveOp::AllToAll);
      e.coll.group = group;
      e.coll.group_size = 3;
      e.coll.in_count = S[i][0] + S[i][1] + S[i][2];
      e.coll.bytes = (e.coll.in_count - S[i][i]) * 4;  // what leaves the rank
      e.coll.kept_count = S[i][i];
      e.coll.split_sizes = true;
      rig.record(1 + i, e);
    };
    auto step = [&](int i, int s) {  // step s: group rank i receives from i - (s + 1)
      const int from = (i + 2 - s) % 3;
      Event e = ring_step(3, s);
      e.step.group = group;
      e.step.steps = 2;
      e.step.src = static_cast<int16_t>(1 + from);
      e.step.dst = static_cast<int16_t>(1 + i);
      e.step.bytes = S[from][i] * 4;
      rig.record(1 + i, e);
    };
    for (int i = 0; i < 3; i++) issue(EventKind::CollectiveIssue, i);
    const Snapshot& held = rig.frame();
    REQUIRE(held.alltoall.valid);
    CHECK(held.alltoall.members == std::vector<int>{1, 2, 3});
    CHECK(held.alltoall.steps == 2);
    CHECK(held.alltoall.steps_done == 0);
    CHECK(held.alltoall.in_flight);
    CHECK(held.alltoall.at(1, 1) == 16);       // its own block: a local copy
    CHECK(held.alltoall.sent[2] == (6 + 1) * 4);
    CHECK(held.alltoall.at(0, 1) == -1);       // nothing moved yet
    for (int i = 0; i < 3; i++) step(i, 0);
    const Snapshot& one = rig.frame();
    CHECK(one.alltoall.steps_done == 1);
    CHECK(one.alltoall.newest_step == 0);
    CHECK(one.alltoall.at(0, 1) == 7 * 4);     // step 0 moves i -> i + 1
    CHECK(one.alltoall.at(1, 2) == 9 * 4);
    CHECK(one.alltoall.at(2, 0) == 6 * 4);
    CHECK(one.alltoall.at(0, 2) == -1);        // step 1's pairs are still to come
    CHECK(one.alltoall.step_of(0, 2) == 1);
    for (int i = 0; i < 3; i++) step(i, 1), issue(EventKind::Collective, i);
    const AllToAllView& a = rig.frame().alltoall;
    CHECK_FALSE(a.in_flight);
    CHECK(a.steps_done == 2);
    int64_t total = 0;
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        CHECK(a.at(i, j) == S[i][j] * 4);
        if (i != j) total += S[i][j] * 4;
      }
    CHECK(a.total == total);
    CHECK(a.label == "ep0 #3 all_to_all_v of float32, " + human_bytes(total));
    for (int i = 0; i < 3; i++) CHECK(a.sent[static_cast<size_t>(i)] == (S[i][0] + S[i][1] + S[i][2] - S[i][i]) * 4);
    // A newer all-to-all of the world replaces it; the world's ranks are its members.
    Event w = collective(EventKind::CollectiveIssue, 0, CollectiveOp::AllToAll);
    rig.record(0, w);
    CHECK(rig.frame().alltoall.group == 0);
    CHECK(rig.frame().alltoall.n == 4);
  }

  // Ulysses' all-to-alls (and EP's counts) are plain: count elements to each rank, the rank's own block
  // kept. As the engine records it: in_count is the whole buffer (n blocks), kept_count one block.
  TEST_CASE("all-to-all: a plain all_to_all keeps its own block and sends count elements to each other rank") {
    Rig rig("ddp", 4);
    const int32_t group = 1 + rig.rec.intern(group_label("cp0", {0, 1, 2, 3}));
    const int64_t count = 8192;  // elements per block
    auto issue = [&](EventKind kind, int r) {
      Event e = collective(kind, 4, CollectiveOp::AllToAll);
      e.coll.group = group;
      e.coll.in_count = e.coll.out_count = count * 4;
      e.coll.bytes = count * 4 * 4;  // nccl-tests' S: the whole buffer
      e.coll.kept_count = count;
      rig.record(r, e);
    };
    for (int r = 0; r < 4; r++) issue(EventKind::CollectiveIssue, r);
    const AllToAllView held = rig.frame().alltoall;
    REQUIRE(held.valid);
    CHECK_FALSE(held.split_sizes);
    for (int r = 0; r < 4; r++) {
      CAPTURE(r);
      CHECK(held.at(r, r) == count * 4);           // kept: one block, not 0
      CHECK(held.sent[static_cast<size_t>(r)] == 3 * count * 4);  // three blocks leave, not the whole buffer
    }
    for (int s = 0; s < 3; s++)
      for (int r = 0; r < 4; r++) {  // step s: rank r receives count elements from r - (s + 1)
        Event e = ring_step(4, s);
        e.step.group = group;
        e.step.steps = 3;
        e.step.src = static_cast<int16_t>((r + 3 - s) % 4);
        e.step.dst = static_cast<int16_t>(r);
        e.step.bytes = count * 4;
        rig.record(r, e);
      }
    for (int r = 0; r < 4; r++) issue(EventKind::Collective, r);
    const AllToAllView& a = rig.frame().alltoall;
    CHECK_FALSE(a.in_flight);
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) {
        CAPTURE(i);
        CAPTURE(j);
        CHECK(a.at(i, j) == count * 4);  // every block is count elements, moved or kept
      }
    CHECK(a.total == 12 * count * 4);  // what moved: the 12 pairs of different ranks
    CHECK(a.label == "cp0 #4 all_to_all of float32, " + human_bytes(12 * count * 4));
  }

  // What a real group records, fed to the tracker: a plain all_to_all of 2 elements a block and an
  // all_to_all_v of split sizes S on 3 ranks, their matrices whole once they ran.
  TEST_CASE("all-to-all: the matrices of a real group's plain all_to_all and all_to_all_v") {
    const int n = 3;
    const int64_t S[3][3] = {{5, 7, 2}, {3, 4, 9}, {6, 1, 8}};
    ThreadsWorld w(n);
    w.run([&](int rank, Communicator& comm, RankContext&) {
      auto ex = std::make_shared<GroupExecutor>();
      auto g = new_group(comm, {0, 1, 2}, 64, ex, cpu_device(), "ep0");
      std::vector<float> in(32, 1.0f), out(32);
      g->all_to_all(out.data(), in.data(), 2, DType::F32)->wait();
      std::vector<int64_t> send(n), recv(n);
      for (int j = 0; j < n; j++) send[static_cast<size_t>(j)] = S[rank][j], recv[static_cast<size_t>(j)] = S[j][rank];
      g->all_to_all_v(out.data(), recv, in.data(), send, DType::F32)->wait();
      g->all_to_all_v(out.data(), recv, in.data(), send, DType::F32, Algorithm::Grouped)->wait();  // NCCL's: one step
    });
    std::map<int32_t, std::vector<int>> ranks;
    std::map<int32_t, std::string> names;
    for (size_t i = 0; i < w.recorder().labels().size(); i++) {
      std::string name;
      std::vector<int> members;
      if (parse_group_label(w.recorder().labels()[i], name, members))
        ranks[static_cast<int32_t>(i + 1)] = members, names[static_cast<int32_t>(i + 1)] = name;
    }
    auto matrix_of = [&](uint64_t seq) {  // the tracker fed the group's all-to-all `seq` alone
      AllToAllTracker t;
      for (int r = 0; r < n; r++)
        for (const Event& e : w.recorder().events(r)) {
          const bool coll = e.kind == EventKind::CollectiveIssue || e.kind == EventKind::Collective;
          if ((coll && e.coll.seq == seq) || (e.kind == EventKind::RingStep && e.step.seq == seq)) t.ingest(r, e);
        }
      std::vector<AllToAllView> groups;
      AllToAllView shown;
      bool held = false;
      t.build(ranks, names, n, PendingItem{}, groups, shown, held);
      return shown;
    };
    const AllToAllView plain = matrix_of(0);
    REQUIRE(plain.valid);
    CHECK(plain.group_name == "ep0");
    CHECK_FALSE(plain.split_sizes);
    CHECK_FALSE(plain.in_flight);
    for (int i = 0; i < n; i++) {
      CHECK(plain.sent[static_cast<size_t>(i)] == 2 * 2 * 4);
      for (int j = 0; j < n; j++) CHECK(plain.at(i, j) == 2 * 4);
    }
    const AllToAllView v = matrix_of(1);
    REQUIRE(v.valid);
    CHECK(v.seq == 1);
    CHECK(v.split_sizes);
    for (int i = 0; i < n; i++) {
      CHECK(v.sent[static_cast<size_t>(i)] == (S[i][0] + S[i][1] + S[i][2] - S[i][i]) * 4);
      for (int j = 0; j < n; j++) CHECK(v.at(i, j) == S[i][j] * 4);
    }
    CHECK(v.algo == Algorithm::Pairwise);
    CHECK(v.steps == n - 1);
    CHECK(v.step_of(0, 2) == 1);
    // Grouped: the same matrix, moved in one step (every pair's step 0).
    const AllToAllView gr = matrix_of(2);
    REQUIRE(gr.valid);
    CHECK(gr.algo == Algorithm::Grouped);
    CHECK(gr.steps == 1);
    CHECK(gr.steps_done == 1);
    CHECK(gr.step_of(0, 2) == 0);
    CHECK(gr.step_of(1, 1) == -1);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) CHECK(gr.at(i, j) == S[i][j] * 4);
  }

  // Two CP groups (--world 4 --cp 2): each group's newest is listed, the newest first; the view
  // follows the group of the operation the stepper holds, else shows the group picked, else the newest.
  TEST_CASE("all-to-all: several groups, the held operation's group followed, else the one picked, else the newest") {
    Rig rig("ddp", 4);
    const int32_t cp0 = 1 + rig.rec.intern(group_label("cp0", {0, 1}));
    const int32_t cp1 = 1 + rig.rec.intern(group_label("cp1", {2, 3}));
    auto issue = [&](int32_t group, uint64_t seq, int r) {
      Event e = collective(EventKind::CollectiveIssue, seq, CollectiveOp::AllToAll);
      e.coll.group = group;
      e.coll.group_size = 2;
      e.coll.in_count = e.coll.out_count = 64;
      e.coll.kept_count = 32;
      rig.record(r, e);
    };
    for (int r : {0, 1}) issue(cp0, 0, r);
    for (int r : {2, 3}) issue(cp1, 0, r);
    for (int r : {0, 1}) issue(cp0, 1, r);  // cp0's second: the newest of all
    const Snapshot& s = rig.frame();
    REQUIRE(s.alltoall_groups.size() == 2);
    CHECK(s.alltoall_groups[0].group == cp0);
    CHECK(s.alltoall_groups[0].seq == 1);  // each group's newest
    CHECK(s.alltoall_groups[1].group == cp1);
    CHECK(s.alltoall_groups[1].members == std::vector<int>{2, 3});
    CHECK(s.alltoall.group == cp0);  // nothing held: the newest of all
    CHECK_FALSE(s.alltoall_held);
    CHECK(pick_alltoall(s, -1).group == cp0);
    CHECK(pick_alltoall(s, cp1).group == cp1);  // the combo's pick
    CHECK(pick_alltoall(s, 77).group == cp0);   // a group without all-to-alls: the newest
    // The stepper holds cp1's next operation: the view follows cp1, whatever was picked.
    StepperState st;
    st.paused = true;
    st.pending.valid = true;
    st.pending.kind = GateKind::Collective;
    st.pending.gate.coll = CollectiveOp::AllToAll;
    st.pending.gate.trace_group = cp1;
    st.pending.gate.op.seq = 1;
    st.pending.members = {2, 3};
    const Snapshot& h = rig.frame(-1, {}, st);
    CHECK(h.alltoall_held);
    CHECK(h.alltoall.group == cp1);
    CHECK(h.alltoall.seq == 0);
    CHECK(pick_alltoall(h, cp0).group == cp1);
    // A held world all-reduce: the world has had no all-to-all, so nothing to follow.
    st.pending.gate.coll = CollectiveOp::AllReduce;
    st.pending.gate.trace_group = 0;
    const Snapshot& w = rig.frame(-1, {}, st);
    CHECK_FALSE(w.alltoall_held);
    CHECK(w.alltoall.group == cp0);
    CHECK(pick_alltoall(w, cp1).group == cp1);
    // Many newer all-to-alls of cp0 do not push cp1's newest out.
    for (uint64_t q = 2; q < 30; q++)
      for (int r : {0, 1}) issue(cp0, q, r);
    const Snapshot& many = rig.frame();
    REQUIRE(many.alltoall_groups.size() == 2);
    CHECK(many.alltoall_groups[1].group == cp1);
    CHECK(many.alltoall_groups[0].seq == 29);
  }

  TEST_CASE("next_hint names the paused item's purpose and the keys that move on from it") {
    Snapshot s;
    s.config.strategy = Strategy::Ddp;
    CHECK(next_hint(s).empty());  // running: the toolbar says so itself
    s.stepper.paused = true;
    CHECK(next_hint(s).empty());  // paused, not settled yet
    s.held.valid = true;
    s.held.kind = GateKind::Collective;
    s.held.gate.coll = CollectiveOp::AllGather;
    s.held.gate.iteration = -1;
    s.held.gate.op.seq = 0;
    s.held.gate.label = "world #0 allgather of 2 int64 (ring)";
    s.collective.valid = true;
    s.collective.seq = 0;
    s.collective.steps = 3;
    CHECK(next_hint(s) == "Next: DDP's constructor checks that every rank's parameters have the same shapes "
                          "(_verify_param_shape_across_processes): world #0 allgather of 2 int64 (ring).  C runs it whole; "
                          "R enters it and stops before its step 1 of 3; I runs to the end of the setup");
    s.held.gate.coll = CollectiveOp::Broadcast;
    s.held.gate.op.seq = 1;  // the collective view shows another one: no R clause
    CHECK(next_hint(s) == "Next: DDP's constructor copies rank 0's parameters to every rank (_sync_module_states): "
                          "world #0 allgather of 2 int64 (ring).  C runs it whole; I runs to the end of the setup");
    // A bucket's all-reduce, by the collective number its launch recorded.
    s.held.gate.coll = CollectiveOp::AllReduce;
    s.held.gate.iteration = 0;
    s.held.gate.op.seq = 2;
    s.held.gate.label = "world #2 allreduce of 100 float32 (sum, ring)";
    BucketView b;
    b.index = 0;
    b.bytes = 400;
    b.params.resize(2);
    b.state = BucketState::Launched;
    b.seq = 2;
    s.buckets.push_back(b);
    CHECK(next_hint(s) == "Next: bucket 0's all-reduce (2 gradients, 400 B): world #2 allreduce of 100 float32 (sum, ring).  "
                          "C runs it whole; I runs to the end of iteration 0");
    s.config.strategy = Strategy::Fsdp;  // FSDP's collectives have no DDP purpose
    CHECK(next_hint(s).rfind("Next: world #2 allreduce", 0) == 0);
    // Inside a collective: its next step, numbered from 1, and its phase.
    s.held.kind = GateKind::RingStep;
    s.held.gate.label = "world #2 allreduce of 100 float32 (sum, ring), step 1";
    s.collective.seq = 2;
    s.collective.steps = 6;
    s.collective.steps_done = 1;
    s.collective.phase = RingPhase::ReduceScatter;
    CHECK(next_hint(s) == "Next: step 2 of 6 (reduce-scatter) of world #2 allreduce of 100 float32 (sum, ring).  "
                          "R runs it; C finishes the collective");
    s.held.kind = GateKind::Iteration;
    s.held.gate.iteration = 3;
    CHECK(next_hint(s) == "Next: iteration 3.  I runs it whole; C stops at its first collective; F at its first layer");
    s.finished = true;
    CHECK(next_hint(s).empty());
  }

}

#endif  // DTLAB_HAVE_GUI
