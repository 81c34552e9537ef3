// The monitor (engine/monitor): a launched world of processes seen and stepped from one viewer.
// These tests start real `dtlab-cli launch` runs with --monitor and attach a MonitorClient, as the
// dtlab window does: the world starts paused, steps one collective or one ring step at a time with
// every rank's gates decided by rank 0's stepper, every rank's events reach the viewer, and the run
// finishes when told to run. Bad use gets one sentence.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>
#include <tuple>

#include "engine/comm/socket_mesh.h"
#include "engine/core/check.h"
#include "engine/monitor/monitor.h"
#include "engine/monitor/monitor_internal.h"
#include "engine/train/config_json.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

using test::ShellResult;

// Starts `dtlab-cli launch ... -- train ... --monitor PORT` in the background.
std::future<ShellResult> launch_monitored(int nproc, const std::string& train_args, int port) {
  const std::string cmd = "timeout 90 " DTLAB_CLI_PATH " launch --nproc-per-node " + std::to_string(nproc) +
                          " -- train " + train_args + " --monitor " + std::to_string(port);
  return std::async(std::launch::async, [cmd] { return test::shell(cmd); });
}

// The stepper, as the hub reports it, has settled on its next item: every rank waits at a gate.
bool all_held(const StepperState& st, int world) {
  return static_cast<int>(st.gates.size()) == kStepperLanes * world && st.paused && st.settled();
}

// What the next step releases: (kind, the world collective's number, the ring step or -1).
std::tuple<GateKind, int64_t, int> held_at(const StepperState& st) {
  const PendingItem& p = st.pending;
  return {p.kind, p.gate.op.seq, p.kind == GateKind::RingStep ? p.gate.step : -1};
}

bool wait_held(MonitorClient& c, uint64_t after_generation) {
  return c.wait_for([&](const StepperState& st, const std::vector<RankMonitorStatus>&) {
    return st.generation > after_generation && all_held(st, c.world_size());
  }, 30);
}

}  // namespace

TEST_SUITE("monitor") {

TEST_CASE("a run's configuration round-trips through JSON, every field") {
  TrainConfig c;
  c.strategy = Strategy::Fsdp;
  c.world_size = 4;
  c.model = ModelSpec::parse("mlp:2,16,8,3");
  c.data = "blobs";
  c.batch = 7;
  c.steps = 0;
  c.epochs = 3;
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.momentum = 0.9;
  c.seed = 42;
  c.shuffle = false;
  c.drop_last = true;
  c.accum = 2;
  c.skip_layer = 2;
  c.ddp.bucket_cap_bytes = 1234;
  c.fsdp.sharding = Sharding::Hybrid;
  c.fsdp.node_size = 2;
  c.fsdp.backward_prefetch = BackwardPrefetch::Post;
  c.pipeline.schedule = ScheduleKind::ZBH1;
  c.pipeline.split = {1, 2};
  c.pipeline.fixed_costs = ActionCosts{1, 2, 1, 1, 0.5};
  c.faults.push_back(Fault{FaultKind::Delay, 1, 5, 0.25});
  c.backend = "socket";
  c.socket.master_port = 4321;
  c.socket.algorithms.allreduce = Algorithm::Tree;
  c.monitor_port = 29777;
  c.device = "cpu";
  const std::string j = train_config_to_json(c);
  const TrainConfig back = train_config_from_json(j);
  CHECK(train_config_to_json(back) == j);
  CHECK(back.model.str() == "mlp:2,16,8,3");
  CHECK(back.fsdp.sharding == Sharding::Hybrid);
  CHECK(back.pipeline.fixed_costs->backward == 2.0);
  CHECK(back.faults.at(0).delay_s == 0.25);
  CHECK(back.socket.algorithms.allreduce == Algorithm::Tree);

  CHECK_THROWS_WITH_AS(train_config_from_json("{\"batch\": \"many\"}"), doctest::Contains("'batch' has the wrong type"), Error);
  CHECK_THROWS_WITH_AS(train_config_from_json("[1]"), doctest::Contains("not a JSON object"), Error);
  // Whole-number fields: a float, a number beyond the field's type or a negative for an unsigned one
  // is refused (converting it would be undefined behaviour).
  for (const char* bad : {"{\"world_size\": 1e300}", "{\"world_size\": 4294967297}", "{\"seed\": -1}", "{\"batch\": 2.5}"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(train_config_from_json(bad), doctest::Contains("is not a whole number in range"), Error);
  }
}

TEST_CASE("malformed monitor messages are refused by their decoders, never misread") {
  // Found by fuzz/monitor.cpp and while writing it: a number out of an int's range (undefined
  // behavior in nlohmann's get<int>()), a labels "first" that made the hub write past its label map,
  // and event times whose shift or difference overflowed. Each is now a refusal the loops drop.
  RankMonitorStatus st;
  nlohmann::json good = status_json(st);
  CHECK(status_from(good).current_seq == -1);
  for (const char* key : {"op", "current_seq", "steps"}) {
    CAPTURE(key);
    nlohmann::json bad = good;
    bad[key] = 1e300;
    CHECK_THROWS_AS(status_from(bad), Error);
    bad[key] = 1.5;
    CHECK_THROWS_AS(status_from(bad), Error);
  }
  CHECK(labels_from("{\"first\": 2, \"labels\": [\"0.weight\"]}").first == 2);
  CHECK_THROWS_AS(labels_from("{\"first\": 18446744073709551615, \"labels\": [\"a\"]}"), Error);
  CHECK_THROWS_AS(labels_from("{\"first\": -1, \"labels\": []}"), Error);
  CHECK_THROWS_AS(feed_hello_from("{\"rank\": 1e300, \"world\": 2, \"start_ns\": 5}"), Error);
  CHECK_THROWS_AS(feed_hello_from("{\"rank\": 1, \"world\": 2, \"start_ns\": -9223372036854775808}"), Error);
  CHECK_THROWS_AS(hello_from("{\"config\": \"{}\", \"world\": 2147483647, \"total_steps\": 1, \"backend\": \"socket\", "
                             "\"device\": \"cpu\", \"start_ns\": 5}"),
                  Error);
  CHECK(command_from("{\"cmd\": \"step\", \"kind\": 1}").kind == GateKind::Collective);
  CHECK_THROWS_AS(command_from("{\"cmd\": \"step\", \"kind\": 1e300}"), Error);
  CHECK_THROWS_AS(step_report_from_json("{\"step\": 1e300}"), Error);
  Event e(EventKind::RingStep, Lane::Comm, 100, 200, 0, 1);
  std::string payload(reinterpret_cast<const char*>(&e), sizeof e);
  CHECK(events_from(payload + "tail").size() == 1);  // a partial event after the last is ignored
  e.wall_end_ns = INT64_MAX;
  CHECK_THROWS_AS(events_from(std::string(reinterpret_cast<const char*>(&e), sizeof e)), Error);

  // A frame header claiming a gigabyte, then the stream ends: the link closes, having grown the
  // payload by a megabyte at a time as bytes arrived (fuzz/monitor.cpp holds it to 128 MB).
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  MonitorLink link(fds[0], 1.0);
  const uint8_t header[16] = {0x44, 0x4d, 0x4f, 0x4e, static_cast<uint8_t>(MonitorMsg::Events), 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0};
  REQUIRE(::write(fds[1], header, sizeof header) == static_cast<ssize_t>(sizeof header));
  REQUIRE(::write(fds[1], "0123456789", 10) == 10);
  ::close(fds[1]);
  MonitorMsg type;
  std::string got;
  CHECK(link.recv(type, got, 1.0) == WaitEnd::Closed);
  CHECK(got.size() <= (size_t{1} << 20));
}

TEST_CASE("a launched 2-process DDP run is stepped from a viewer: collective by collective, ring step by ring step") {
  const int port = pick_free_port("127.0.0.1");
  auto run = launch_monitored(2, "--strategy ddp --model mlp:2,16,3 --data spiral --steps 3 --batch 16 --timeout 30", port);
  MonitorClient c("127.0.0.1:" + std::to_string(port), 30);
  CHECK(c.world_size() == 2);
  CHECK(c.backend() == "socket");
  CHECK(c.total_steps() == 3);
  const TrainConfig cfg = train_config_from_json(c.config_json());
  CHECK(cfg.strategy == Strategy::Ddp);
  CHECK(cfg.model.str() == "mlp:2,16,3");

  // Paused from the start: both processes wait at DDP's first collective (#0, the parameter shape
  // check), then #1 broadcasts rank 0's parameters.
  REQUIRE(wait_held(c, 0));
  StepperState st = c.stepper_state();
  CHECK(held_at(st) == std::make_tuple(GateKind::Collective, int64_t{0}, -1));
  CHECK(st.pending.arrived == std::vector<int>{0, 1});
  CHECK(st.pending.gate.coll == CollectiveOp::AllGather);
  std::vector<RankMonitorStatus> ranks = c.ranks();
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[1].connected);
  INFO(ranks[1].compute_activity);
  CHECK(ranks[1].compute_activity.find("at the gate of world #0 allgather") != std::string::npos);
  CHECK(ranks[1].memory.total_current > 0);  // rank 1's replica, counted in its own process

  // One collective at a time: both ranks run #0 and stop at #1's gate, then at #2's (the first
  // gradient bucket's all-reduce).
  c.step(GateKind::Collective);
  REQUIRE(wait_held(c, st.generation));
  st = c.stepper_state();
  CHECK(held_at(st) == std::make_tuple(GateKind::Collective, int64_t{1}, -1));
  CHECK(st.pending.gate.coll == CollectiveOp::Broadcast);
  c.step(GateKind::Collective);
  REQUIRE(wait_held(c, st.generation));
  st = c.stepper_state();
  CHECK(held_at(st) == std::make_tuple(GateKind::Collective, int64_t{2}, -1));
  CHECK(st.pending.gate.coll == CollectiveOp::AllReduce);

  // Ring steps inside #2 (a ring all-reduce of 2 ranks has 2 steps): each step holds both again.
  c.step(GateKind::RingStep);
  REQUIRE(wait_held(c, st.generation));
  st = c.stepper_state();
  CHECK(held_at(st) == std::make_tuple(GateKind::RingStep, int64_t{2}, 0));
  CHECK(st.gates[size_t(kStepperLanes + kCommLane)].blocked);  // rank 1's comm worker, in its own process
  c.step(GateKind::RingStep);
  REQUIRE(wait_held(c, st.generation));
  st = c.stepper_state();
  CHECK(held_at(st) == std::make_tuple(GateKind::RingStep, int64_t{2}, 1));

  // Rank 1's events reached the viewer: its broadcast and its half of the ring's first step.
  bool rank1_collective = false, rank1_step = false;
  for (const Event& e : c.recorder().events(1)) {
    rank1_collective = rank1_collective || (e.kind == EventKind::Collective && e.coll.seq == 1);
    rank1_step = rank1_step || (e.kind == EventKind::RingStep && e.step.seq == 2 && e.step.step == 0 && e.step.bytes > 0);
  }
  CHECK(rank1_collective);
  CHECK(rank1_step);
  CHECK(c.recorder().label_count() > 0);  // DDP's bucket names, interned on rank 0

  // Let it go: the run ends, and the viewer has every step's report.
  c.run(0);
  REQUIRE(c.wait_ended(60));
  CHECK(c.error() == "");
  const std::vector<StepReport> reports = c.reports();
  REQUIRE(reports.size() == 3);
  CHECK(reports.back().step == 3);
  const ShellResult r = run.get();
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("dtlab --attach 127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(r.out.find("done: 3 steps") != std::string::npos);
}

// One stop of a stepped run, as text both sides can compare: the group (the label's first word:
// "world", "dp1", or "send"/"recv"), the operation, its bytes, its members, its iteration.
std::string stop_text(const PendingItem& p) {
  const GateInfo& g = p.gate;
  std::string t = "it " + std::to_string(g.iteration) + " ";
  if (g.op.p2p) {
    t += "p2p " + std::to_string(g.op.src) + "->" + std::to_string(g.op.dst);
  } else {
    t += g.label.substr(0, g.label.find(' ')) + " #" + std::to_string(g.op.seq) + " " + collective_name(g.coll);
  }
  t += " " + std::to_string(g.bytes) + " B, ranks";
  for (int r : p.members) t += " " + std::to_string(r);
  return t;
}

// A launched run on the CPU is DDP or FSDP (pipeline and TP launch on GPUs only in this version):
// HYBRID_SHARD's node groups and replica groups are the process-group mesh that can be launched here.
TEST_CASE("a launched mesh (HYBRID_SHARD: 2 node groups x 2 replicas, 4 processes) stepped from a viewer stops at the same operations, in the same order, as in-process") {
  const int port = pick_free_port("127.0.0.1");
  auto run = launch_monitored(4, "--strategy fsdp --sharding hybrid --node-size 2 --model mlp:2,16,16,3 "
                                 "--data spiral --steps 1 --batch 16 --timeout 30", port);
  MonitorClient c("127.0.0.1:" + std::to_string(port), 30);
  REQUIRE(c.world_size() == 4);
  // Through the viewer: one operation per step command until the run ends.
  std::vector<std::string> launched;
  uint64_t gen = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!c.ended() && std::chrono::steady_clock::now() < give_up && launched.size() < 500) {
    if (!c.wait_for([&](const StepperState& st, const std::vector<RankMonitorStatus>&) {
          return st.generation > gen && st.paused && st.settled();
        }, 1))
      continue;
    const StepperState st = c.stepper_state();
    gen = st.generation;
    launched.push_back(stop_text(st.pending));
    c.step(GateKind::Collective);
  }
  REQUIRE(c.wait_ended(60));
  CHECK(c.error() == "");
  const ShellResult r = run.get();
  INFO(r.out);
  CHECK(r.code == 0);

  // In-process, the same configuration on the threads backend, stepped the same way.
  TrainConfig cfg = train_config_from_json(c.config_json());
  cfg.backend = "threads";
  cfg.launched = false;
  cfg.socket = {};
  cfg.monitor_port = 0;
  cfg.start_paused = true;
  Trainer t(cfg);
  test::BackgroundRun runner(t);
  Stepper& st = t.stepper();
  std::vector<std::string> in_process;
  const auto give_up2 = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!runner.done() && std::chrono::steady_clock::now() < give_up2) {
    if (!st.wait_until_settled(std::chrono::milliseconds(100))) continue;
    const PendingItem p = st.state().pending;
    if (!p.valid) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    in_process.push_back(stop_text(p));
    st.step(GateKind::Collective);
  }
  REQUIRE(runner.finish(std::chrono::seconds(0)));
  CHECK(runner.error() == "");

  // The node groups' all-gathers and reduce-scatters, the replica groups' all-reduces, the world's.
  CHECK(launched.size() >= 12);
  int group_ops = 0;
  for (const std::string& s : launched) group_ops += s.find(" world #") == std::string::npos;
  CHECK(group_ops >= 8);
  MESSAGE(launched.size() << " stops, " << group_ops << " of them group collectives");
  CHECK(launched.size() == in_process.size());
  for (size_t i = 0; i < std::min(launched.size(), in_process.size()); i++) {
    CAPTURE(i);
    CHECK(launched[i] == in_process[i]);
    if (launched[i] != in_process[i]) break;
  }
}

TEST_CASE("one viewer at a time, a viewer that detaches lets the run finish on its own") {
  const int port = pick_free_port("127.0.0.1");
  auto run = launch_monitored(2, "--strategy fsdp --model mlp:2,16,3 --steps 4 --batch 16 --timeout 30", port);
  {
    MonitorClient first("127.0.0.1:" + std::to_string(port), 30);
    REQUIRE(wait_held(first, 0));
    CHECK_THROWS_WITH_AS(MonitorClient("127.0.0.1:" + std::to_string(port), 10),
                         doctest::Contains("refused the viewer: a viewer is already attached to this run"), Error);
  }  // detaches while the world is paused
  const ShellResult r = run.get();
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("done: 4 steps") != std::string::npos);
}

TEST_CASE("an attached run of every strategy with LoRA, bf16 and --tp shows the viewer the launch's configuration") {
  // What `dtlab --attach` reads (Session::attach): the launched ranks' TrainConfig as JSON over the
  // monitor. ddp, fsdp and the pipeline on 4 processes, each with --tp 2, LoRA and bf16 (single and
  // dp are not launched: one rank, one process).
  struct Case {
    const char* flags;
    Strategy strategy;
  };
  for (const Case& k : {Case{"--strategy ddp", Strategy::Ddp}, Case{"--strategy fsdp --sharding hybrid --node-size 1", Strategy::Fsdp},
                        Case{"--strategy pipeline --stages 2 --microbatches 2", Strategy::Pipeline}}) {
    CAPTURE(k.flags);
    const int port = pick_free_port("127.0.0.1");
    auto run = launch_monitored(4, std::string(k.flags) + " --tp 2 --lora-rank 4 --precision bf16 --model mlp:2,16,16,3 "
                                   "--steps 1 --batch 8 --timeout 30", port);
    {
      MonitorClient c("127.0.0.1:" + std::to_string(port), 30);
      CHECK(c.world_size() == 4);
      CHECK(c.total_steps() == 1);
      const TrainConfig cfg = train_config_from_json(c.config_json());
      CHECK(cfg.strategy == k.strategy);
      CHECK(cfg.world_size == 4);
      CHECK(cfg.tp == 2);
      CHECK(cfg.lora.rank == 4);
      CHECK(cfg.precision == Precision::BF16);
      CHECK(cfg.model.str() == "mlp:2,16,16,3");
      CHECK(cfg.batch == 8);
      if (k.strategy == Strategy::Fsdp) CHECK((cfg.fsdp.sharding == Sharding::Hybrid && cfg.fsdp.node_size == 1));
      if (k.strategy == Strategy::Pipeline) CHECK((cfg.pipeline.stages == 2 && cfg.pipeline.microbatches == 2));
      CHECK(train_config_to_json(cfg) == c.config_json());  // every field, nothing lost on the way
      REQUIRE(wait_held(c, 0));
    }  // the viewer detaches: the run finishes on its own
    const ShellResult r = run.get();
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("done: 1 step in") != std::string::npos);
  }
}

TEST_CASE("a monitored run nobody attaches to fails with a sentence saying how to attach") {
  const int port = pick_free_port("127.0.0.1");
  auto run = launch_monitored(2, "--strategy ddp --model mlp:2,8,3 --steps 2 --timeout 20 --monitor-wait 0.5", port);
  const ShellResult r = run.get();
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("no viewer attached to 127.0.0.1:" + std::to_string(port) + " within 0.5 s; start 'dtlab --attach 127.0.0.1:" +
                   std::to_string(port)) != std::string::npos);
}

TEST_CASE("monitor misuse gets one sentence") {
  ShellResult r = test::shell(DTLAB_CLI_PATH " train --strategy ddp --world 2 --steps 1 --monitor 29999");
  CHECK(r.code == 2);
  CHECK(r.out.find("--monitor serves a launched world to a viewer; run it under 'dtlab-cli launch") != std::string::npos);
  // Nothing listens on a port we just found free.
  const int port = pick_free_port("127.0.0.1");
  const std::string nobody = "nothing answers at 127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(MonitorClient("127.0.0.1:" + std::to_string(port), 0.3), doctest::Contains(nobody.c_str()), Error);
  CHECK_THROWS_WITH_AS(MonitorClient("localhost", 1), doctest::Contains("is not an address; write HOST:PORT"), Error);
  CHECK_THROWS_WITH_AS(MonitorClient("127.0.0.1:99999", 1), doctest::Contains("is not a port (1-65535)"), Error);
}

}  // TEST_SUITE
