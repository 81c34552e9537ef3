// Issue 32: any run can be stepped one operation at a time. A mesh stepped operation by operation
// stops before exactly the operations its plan says it runs (the TP collectives of
// tp_collectives(), the DP buckets' all-reduces, the schedule's sends and receives, and the
// iteration's own world collective), each with its members at the gate; and random sequences of
// step commands over random meshes and strategies never deadlock and end with the same parameters
// as the unstepped run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <bit>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/core/mesh.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

using Clock = std::chrono::steady_clock;

// One item the world stopped at: its group ("tp0", "dp1", "world", or "p2p" for a send/recv), what
// it is, its bytes and its members; a send/recv by its source and destination.
struct Stop {
  std::string group;
  CollectiveOp op = CollectiveOp::AllReduce;
  int64_t bytes = 0;
  std::vector<int> members;
  int src = -1, dst = -1;
  auto operator<=>(const Stop&) const = default;
};

Stop stop_of(const PendingItem& p) {
  Stop s;
  const GateInfo& g = p.gate;
  s.bytes = g.bytes;
  s.members = p.members;
  if (g.op.p2p) {
    s.group = "p2p";
    s.op = CollectiveOp::Send;  // the transfer, whichever half is shown
    s.src = g.op.src;
    s.dst = g.op.dst;
  } else {
    s.group = g.label.substr(0, g.label.find(' '));
    s.op = g.coll;
  }
  return s;
}

// Runs `c` paused and steps it with step(kind) to its end; returns the stops of iteration `it`.
std::vector<Stop> operations_of_iteration(TrainConfig c, int it) {
  c.start_paused = true;
  Trainer t(c);
  test::BackgroundRun runner(t);
  Stepper& st = t.stepper();
  std::vector<Stop> out;
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  while (!runner.done() && Clock::now() < give_up) {
    if (!st.wait_until_settled(std::chrono::milliseconds(100))) continue;
    const StepperState s = st.state();
    if (s.pending.valid && s.pending.kind == GateKind::Collective && s.pending.gate.iteration == it) {
      // Whole, or a send going ahead of its receive (1F1B's sends cross: each stage sends before it
      // receives, and sends are eager).
      const bool lone_send = s.pending.gate.op.p2p && s.pending.missing == std::vector<int>{s.pending.gate.op.dst};
      CHECK_MESSAGE((s.pending.missing.empty() || lone_send), "held with members missing: " << s.pending.gate.label);
      out.push_back(stop_of(s.pending));
    }
    st.step(GateKind::Collective);
  }
  REQUIRE_MESSAGE(runner.finish(std::chrono::seconds(0)), "the stepped run did not end: " << st.state().waiting);
  CHECK(runner.error() == "");
  return out;
}

std::vector<int> ranks(std::initializer_list<int> l) { return std::vector<int>(l); }

// The TP collectives of one forward and backward on a TP group's members, as stops.
void add_tp(std::vector<Stop>& want, const TrainConfig& c, int first, int end, int64_t rows, bool input_grad,
            const std::string& name, const std::vector<int>& members, bool forward, bool backward) {
  for (const TpCollective& k : tp_collectives(c.model, first, end, TensorParallelSpec{c.tp, 0, c.sequence_parallel}, rows, input_grad))
    if ((k.backward && backward) || (!k.backward && forward)) want.push_back(Stop{name, k.op, k.bytes, members});
}

// The DDP buckets rank `r` launched in iteration `it`, by their bytes.
std::vector<int64_t> bucket_bytes(Trainer& t, int r, int it) {
  std::vector<int64_t> v;
  for (const Event& e : t.recorder().events(r))
    if (e.kind == EventKind::BucketLaunch && e.iteration == it) v.push_back(e.bucket.bytes);
  return v;
}

TrainConfig mesh_config(const std::string& strategy, int world, int tp) {
  TrainConfig c = test::demo_config(strategy, world, 16, 4);  // iteration 3 gathers the result: the tests read 1 and 2
  c.model = ModelSpec::parse("mlp:2,32,32,32,32,3");
  c.tp = tp;
  c.seed = 3;
  c.timeout_s = 30;
  return c;
}

void check_same(std::vector<Stop> got, std::vector<Stop> want) {
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got.size() == want.size());
  // The first difference, readable.
  for (size_t i = 0; i < std::min(got.size(), want.size()); i++) {
    CAPTURE(i);
    CHECK_MESSAGE(got[i] == want[i], "got " << got[i].group << " " << std::string(collective_name(got[i].op)) << " "
                                             << got[i].bytes << " B " << got[i].src << "->" << got[i].dst << ", want "
                                             << want[i].group << " " << std::string(collective_name(want[i].op)) << " "
                                             << want[i].bytes << " B " << want[i].src << "->" << want[i].dst);
    if (!(got[i] == want[i])) break;
  }
}

}  // namespace

TEST_SUITE("step") {

TEST_CASE("DDP x TP (world 4, tp 2) stepped by operation: every TP collective, bucket all-reduce and the loss sum, with their members") {
  const TrainConfig c = mesh_config("ddp", 4, 2);
  const int it = 2;  // after DDP's bucket rebuild (iteration 1), an iteration like every later one
  const std::vector<Stop> got = operations_of_iteration(c, it);
  // The reference: tp0 {0,1} and tp1 {2,3} each run tp_collectives() of the whole model on the
  // replica's batch; dp0 {0,2} and dp1 {1,3} all-reduce the buckets their shards launched (read from
  // an unstepped run of the same configuration); the world sums the loss (4 floats).
  Trainer free_run(c);
  free_run.run();
  std::vector<Stop> want;
  const int linears = static_cast<int>(c.model.dims.size()) - 1;
  add_tp(want, c, 0, linears, c.batch, false, "tp0", ranks({0, 1}), true, true);
  add_tp(want, c, 0, linears, c.batch, false, "tp1", ranks({2, 3}), true, true);
  for (int64_t b : bucket_bytes(free_run, 0, it)) want.push_back(Stop{"dp0", CollectiveOp::AllReduce, b, ranks({0, 2})});
  for (int64_t b : bucket_bytes(free_run, 1, it)) want.push_back(Stop{"dp1", CollectiveOp::AllReduce, b, ranks({1, 3})});
  want.push_back(Stop{"world", CollectiveOp::AllReduce, 16, ranks({0, 1, 2, 3})});
  CHECK(!bucket_bytes(free_run, 0, it).empty());
  check_same(got, want);
}

TEST_CASE("a 2 x 2 x 2 mesh (pipeline, dp 2, tp 2) stepped by operation: TP collectives, the schedule's sends and receives, DP all-reduces") {
  TrainConfig c = mesh_config("pipeline", 8, 2);
  c.pipeline.stages = 2;
  c.pipeline.dp = 2;
  c.pipeline.microbatches = 2;
  const int it = 1;
  const std::vector<Stop> got = operations_of_iteration(c, it);
  Trainer plan_of(c);
  const PipelinePlan& plan = *plan_of.pipeline_plan();
  const MeshShape m = plan_of.mesh();
  REQUIRE(m == MeshShape{2, 2, 2});
  const int64_t rows = c.batch / c.pipeline.microbatches;
  const int S = static_cast<int>(plan.stages.size());
  std::vector<Stop> want;
  for (int d = 0; d < m.dp; d++)
    for (int s = 0; s < S; s++) {
      const StageRange& r = plan.stages[static_cast<size_t>(s)];
      const int first_rank = mesh_rank(m, MeshCoord{d, s, 0});
      const std::vector<int> tp = mesh_group(m, MeshDim::TP, first_rank);
      const std::string tp_name = mesh_group_name(m, MeshDim::TP, first_rank);
      // Every micro-batch's forward and backward through the stage.
      for (int mb = 0; mb < c.pipeline.microbatches; mb++)
        add_tp(want, c, r.first, r.end, rows, s > 0, tp_name, tp, true, true);
      for (int t = 0; t < m.tp; t++) {
        const int me = mesh_rank(m, MeshCoord{d, s, t});
        // Activations to the next stage, gradients back to the previous one, each micro-batch.
        if (s + 1 < S) {
          const int next = mesh_rank(m, MeshCoord{d, s + 1, t});
          const int64_t bytes = rows * c.model.dims[static_cast<size_t>(r.end)] * 4;
          for (int mb = 0; mb < c.pipeline.microbatches; mb++)
            want.push_back(Stop{"p2p", CollectiveOp::Send, bytes, {std::min(me, next), std::max(me, next)}, me, next});
          for (int mb = 0; mb < c.pipeline.microbatches; mb++)
            want.push_back(Stop{"p2p", CollectiveOp::Send, bytes, {std::min(me, next), std::max(me, next)}, next, me});
        }
      }
    }
  // The DP all-reduce of each stage shard's gradients (one per rank's DP group), and the world's
  // all-gather of every rank's figures.
  for (int r = 0; r < m.world(); r++) {
    const std::vector<int> dp = mesh_group(m, MeshDim::DP, r);
    if (dp.front() != r) continue;  // once per group
    int64_t params = 0;
    const MeshCoord k = mesh_coord(m, r);
    const StageRange& sr = plan.stages[static_cast<size_t>(k.pp)];
    const std::vector<TpRole> roles = tp_roles(sr.first, sr.end, m.tp);
    for (int l = sr.first; l < sr.end; l++) {
      const int64_t in = c.model.dims[static_cast<size_t>(l)], out = c.model.dims[static_cast<size_t>(l + 1)];
      const TpSlice sl = tp_slice(roles[static_cast<size_t>(l - sr.first)], out, in, m.tp, k.tp);
      params += sl.weight_numel() + (sl.bias_end - sl.bias_begin);
    }
    want.push_back(Stop{mesh_group_name(m, MeshDim::DP, r), CollectiveOp::AllReduce, params * 4, dp});
  }
  int64_t gathered = -1;
  for (const Stop& s : got)
    if (s.group == "world") gathered = s.bytes;
  CHECK(gathered > 0);
  want.push_back(Stop{"world", CollectiveOp::AllGather, gathered, ranks({0, 1, 2, 3, 4, 5, 6, 7})});
  check_same(got, want);
}

TEST_CASE("a mesh stepped by ring step: each group collective's steps, in order, among its members only") {
  TrainConfig c = mesh_config("ddp", 4, 2);
  c.start_paused = true;
  const int it = 2;
  Trainer t(c);
  test::BackgroundRun runner(t);
  Stepper& st = t.stepper();
  struct Steps {
    std::string label;
    uint64_t members = 0;
    std::vector<int> steps;
  };
  std::map<std::tuple<int32_t, uint64_t, int64_t>, Steps> ops;  // (group, members, seq) -> its ring steps
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  while (!runner.done() && Clock::now() < give_up) {
    if (!st.wait_until_settled(std::chrono::milliseconds(100))) continue;
    const PendingItem p = st.state().pending;
    if (p.valid && p.gate.iteration == it && !p.gate.op.p2p) {
      const OpRef& o = p.gate.op;
      Steps& s = ops[{o.group, o.members, o.seq}];
      if (p.kind == GateKind::Collective) {
        s.label = p.gate.label;
        s.members = o.members;
      } else if (p.kind == GateKind::RingStep) {
        CAPTURE(p.gate.label);
        CHECK(p.missing.empty());
        uint64_t at = 0;
        for (int r : p.members) at |= uint64_t{1} << r;
        CHECK(at != 0);
        CHECK((at & ~o.members) == 0);  // only the operation's members take part in its steps
        s.steps.push_back(p.gate.step);
      }
    }
    st.step(GateKind::RingStep);
  }
  REQUIRE_MESSAGE(runner.finish(std::chrono::seconds(0)), "the stepped run did not end: " << st.state().waiting);
  CHECK(runner.error() == "");
  int group_ops = 0;
  for (const auto& op : ops) {  // not a structured binding: clang 14 cannot capture one in CAPTURE's lambda
    const Steps& s = op.second;
    CAPTURE(s.label);
    REQUIRE(!s.label.empty());  // stopped before its issue, then at its steps
    REQUIRE(!s.steps.empty());
    for (size_t i = 0; i < s.steps.size(); i++) CHECK(s.steps[i] == static_cast<int>(i));  // each step once, in order
    const int n = std::popcount(s.members);
    if (s.label.find("allreduce") != std::string::npos && s.label.find("(sum, ring)") != std::string::npos)
      CHECK(static_cast<int>(s.steps.size()) == 2 * (n - 1));  // reduce-scatter, then all-gather
    if (std::get<0>(op.first) != 0) group_ops++;
  }
  CHECK(group_ops >= 4);  // the TP groups' all-reduces and the DP groups' buckets
}

TEST_CASE("with a focus, each step advances the focused rank by one operation: its own operations, in its program order") {
  TrainConfig c = mesh_config("pipeline", 8, 2);
  c.pipeline.stages = 2;
  c.pipeline.dp = 2;
  c.pipeline.microbatches = 2;
  c.steps = 2;
  const int focus = 5;
  // Every stop of an unfocused run that involves rank 5, in order; then the focused run's stops.
  auto stops = [&](bool focused) {
    TrainConfig p = c;
    p.start_paused = true;
    Trainer t(p);
    test::BackgroundRun runner(t);
    Stepper& st = t.stepper();
    if (focused) st.set_focus(focus, "");
    std::vector<Stop> out;
    bool others = false;  // a stop at an operation without rank 5 came
    const auto give_up = Clock::now() + std::chrono::seconds(120);
    while (!runner.done() && Clock::now() < give_up) {
      if (!st.wait_until_settled(std::chrono::milliseconds(100))) continue;
      const PendingItem pi = st.state().pending;
      if (pi.valid && pi.kind == GateKind::Collective) {
        const bool mine = std::find(pi.members.begin(), pi.members.end(), focus) != pi.members.end();
        // Focused, the steps stop only at rank 5's operations until it has none left (the end of
        // the run gathers the result without it); then they step like no focus.
        if (focused && mine) CHECK_MESSAGE(!others, "a focused step stopped at another rank's operation before rank 5's " << pi.gate.label);
        others = others || !mine;
        if (mine) out.push_back(stop_of(pi));
      }
      st.step(GateKind::Collective);
    }
    REQUIRE_MESSAGE(runner.finish(std::chrono::seconds(0)), "the stepped run did not end: " << st.state().waiting);
    CHECK(runner.error() == "");
    return out;
  };
  const std::vector<Stop> all = stops(false), mine = stops(true);
  CHECK(mine.size() >= 12);
  CHECK(mine == all);
}

TEST_CASE("a stage's receive released with its pipeline action, its sender held at a TP all-reduce: the world still settles") {
  // 2 stages x TP 2. A layer step leaves stage 1 (ranks 2, 3) at its first receive; an action step
  // releases those receives with their actions (sends and receives run with the action) while
  // stage 0 stops at its first tensor-parallel all-reduce, before it sends. The receiving ranks
  // wait for a peer held at a gate: the world must settle without them, or it never does.
  TrainConfig c = mesh_config("pipeline", 4, 2);
  c.pipeline.stages = 2;
  c.pipeline.dp = 1;
  c.pipeline.microbatches = 2;
  c.pipeline.schedule = parse_schedule_kind("1f1b");
  c.steps = 2;
  Trainer ref(c);
  ref.run();
  TrainConfig p = c;
  p.start_paused = true;
  Trainer t(p);
  test::BackgroundRun runner(t);
  Stepper& st = t.stepper();
  REQUIRE(st.wait_until_settled(std::chrono::seconds(20)));
  st.step(GateKind::Layer);
  REQUIRE(st.wait_until_settled(std::chrono::seconds(20)));
  st.step(GateKind::Action);
  REQUIRE_MESSAGE(st.wait_until_settled(std::chrono::seconds(20)), "the world did not settle: " << st.state().waiting);
  const PendingItem pi = st.state().pending;
  INFO(gate_kind_name(pi.kind) << ": " << pi.gate.label);
  CHECK(pi.kind == GateKind::Collective);
  CHECK(pi.gate.label.find("tp0 #0 allreduce") != std::string::npos);
  CHECK(pi.members == std::vector<int>{0, 1});
  int steps = 0;  // and actions step on to the end
  while (!runner.done() && steps < 2000) {
    if (!st.wait_until_settled(std::chrono::seconds(20))) break;
    st.step(GateKind::Action);
    steps++;
  }
  REQUIRE_MESSAGE(runner.finish(std::chrono::seconds(30)), "the stepped run did not end: " << st.state().waiting);
  CHECK(runner.error() == "");
  CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) == 0.0);
}

TEST_CASE("random step commands over random meshes and strategies: no deadlock, the same parameters as the unstepped run") {
  struct Layout {
    const char* strategy;
    int world, tp, stages, dp;
    const char* schedule;
    bool fused;
  };
  const std::vector<Layout> layouts = {
      {"single", 1, 1, 1, 1, "", false},        {"ddp", 3, 1, 1, 1, "", false},
      {"ddp", 4, 2, 1, 1, "", false},           {"fsdp", 4, 2, 1, 1, "", false},
      {"dp", 3, 1, 1, 1, "", false},            {"pipeline", 4, 1, 2, 2, "1f1b", false},
      {"pipeline", 8, 2, 2, 2, "1f1b", false},  {"pipeline", 2, 1, 2, 1, "gpipe", true},
      {"pipeline", 4, 2, 2, 1, "zb-h1", false}, {"pipeline", 4, 1, 2, 2, "interleaved", true},
  };
  // Mostly the fine steps (an iteration step leaps over a whole iteration).
  const GateKind kinds[] = {GateKind::RingStep, GateKind::RingStep, GateKind::Collective, GateKind::Collective,
                            GateKind::Layer,    GateKind::Layer,    GateKind::Grad,       GateKind::Grad,
                            GateKind::Action,   GateKind::Iteration};
  // DTLAB_STEP_FUZZ_SEED=N runs another sequence (what a failure to reproduce needs).
  const char* seed = std::getenv("DTLAB_STEP_FUZZ_SEED");
  std::mt19937 rng(seed ? static_cast<unsigned>(std::strtoul(seed, nullptr, 10)) : 20261128u);
  if (seed) MESSAGE("DTLAB_STEP_FUZZ_SEED=" << seed);
  // The sanitizer runs (DTLAB_TEST_QUICK) take every other layout: DDP x TP, DataParallel, the
  // 2 x 2 x 2 pipeline mesh and ZB-H1 with TP stay among them.
  for (size_t li = 0; li < layouts.size(); li += test::quick() ? 2 : 1) {
    const Layout& l = layouts[li];
    CAPTURE(l.strategy);
    CAPTURE(l.world);
    CAPTURE(l.tp);
    CAPTURE(l.schedule);
    TrainConfig c = mesh_config(l.strategy, l.world, l.tp);
    c.steps = 3;
    if (std::string(l.strategy) == "pipeline") {
      c.pipeline.stages = l.stages;
      c.pipeline.dp = l.dp;
      c.pipeline.microbatches = 2;
      c.pipeline.schedule = parse_schedule_kind(l.schedule);
      c.pipeline.chunks = std::string(l.schedule) == "interleaved" ? 2 : 1;
      c.pipeline.fuse_p2p = l.fused;
      if (c.pipeline.chunks == 2) c.model = ModelSpec::parse("mlp:2,32,32,32,32,32,32,32,3");
    }
    Trainer ref(c);
    ref.run();
    TrainConfig p = c;
    p.start_paused = true;
    Trainer t(p);
    test::BackgroundRun runner(t);
    Stepper& st = t.stepper();
    std::string commands;  // what was asked, for the failure message
    int stepped = 0;
    const auto give_up = Clock::now() + std::chrono::seconds(120);
    while (!runner.done() && Clock::now() < give_up) {
      const int roll = static_cast<int>(rng() % 20);
      if (roll == 0 && stepped >= 5) {  // run a moment, then pause wherever the ranks are (not before 5 steps: it may run to the end)
        st.run();
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
        st.pause();
        commands += "run+pause ";
      } else if (roll == 1) {  // focus a rank, a group, or nothing
        const int r = static_cast<int>(rng() % static_cast<unsigned>(l.world + 1)) - 1;
        st.set_focus(r, r < 0 && l.tp > 1 ? "tp0" : "");
        commands += "focus " + std::to_string(r) + " ";
      } else {
        if (!st.wait_until_settled(std::chrono::milliseconds(200))) continue;
        const GateKind k = kinds[rng() % std::size(kinds)];
        st.step(k);
        stepped++;
        commands += std::string(gate_kind_name(k)) + ", ";
      }
      if (commands.size() > 4000) commands.erase(0, commands.size() - 4000);
    }
    REQUIRE_MESSAGE(runner.finish(std::chrono::seconds(0)),
                    "deadlocked or too slow; the stepper waits: " << st.state().waiting << "; last commands: " << commands);
    CHECK(runner.error() == "");
    CHECK(stepped >= (l.world == 1 ? 1 : 5));  // the run was really stepped, not run through (one rank: no operations to stop at)
    MESSAGE(std::string(l.strategy) << " world " << l.world << ": " << stepped << " step commands");
    CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) == 0.0);
  }
}

}  // TEST_SUITE
