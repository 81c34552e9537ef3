// One engine, every device: the strategies (single, DDP, FSDP in each sharding, each pipeline
// schedule) run from one table of cases on every device present, from one list built at run time
// (cpu always, cuda when a GPU is there). On the CPU each case trains and is bit-reproducible; on a
// GPU each case ends within 1e-5 of the CPU engine after 20 steps, parameters and every step's loss.
// (The strategy suites check the CPU runs against their one-rank references; tests/test_cuda.cpp
// checks each device op.) Also the CLI's one sentence when --device cuda meets a machine without a
// GPU.
//
// Without a GPU the cuda case prints "skipped: no CUDA device (...)", which CTest reports as skipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli_util.h"
#include "tests/device_util.h"
#include "tests/train_util.h"
#include "cli/cli.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/trace/event.h"
#include "engine/train/train.h"

using namespace dtlab;
using test::devices_present;
using test::present;
using test::why_absent;

namespace {

// Every case starts from this: 4 Linear layers (enough for 2 stages x 2 chunks), spiral, 20 steps of
// SGD with momentum (its update is linear in the gradient, so float rounding stays at rounding size;
// the optimizers themselves are checked op by op in test_cuda.cpp).
TrainConfig base_config() {
  TrainConfig c;
  c.model = ModelSpec::parse("mlp:2,32,32,32,3");
  c.data = "spiral";
  c.batch = 32;
  c.steps = 20;
  c.seed = 7;
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.momentum = 0.9;
  c.timeout_s = 60;
  // Small buckets: DDP's 4.5K parameters go out in several all-reduces.
  c.ddp.bucket_cap_bytes = 4096;
  c.ddp.first_bucket_bytes = 1024;
  return c;
}

// DDP on the cuda backend: `world` ranks sharing the GPU.
TrainConfig cuda_ddp_config(int world) {
  TrainConfig c = base_config();
  c.strategy = Strategy::Ddp;
  c.world_size = world;
  c.device = "cuda";
  c.backend = "cuda";
  return c;
}

struct StrategyCase {
  std::string name;
  std::function<void(TrainConfig&)> tweak;
};

// The table: what each case changes in base_config().
std::vector<StrategyCase> strategy_cases() {
  std::vector<StrategyCase> cases;
  cases.push_back({"single", [](TrainConfig& c) { c.strategy = Strategy::Single; }});
  cases.push_back({"ddp, 4 ranks, 4 KiB buckets", [](TrainConfig& c) {
                     c.strategy = Strategy::Ddp;
                     c.world_size = 4;
                   }});
  for (Sharding s : kAllShardings)
    cases.push_back({std::string("fsdp --sharding ") + sharding_flag(s) + ", 4 ranks", [s](TrainConfig& c) {
                       c.strategy = Strategy::Fsdp;
                       c.world_size = 4;
                       c.fsdp.sharding = s;
                       if (s == Sharding::Hybrid) c.fsdp.node_size = 2;
                     }});
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1})
    cases.push_back({std::string("pipeline --schedule ") + schedule_kind_flag(k) + ", 2 stages x dp 2", [k](TrainConfig& c) {
                       c.strategy = Strategy::Pipeline;
                       c.world_size = 4;
                       c.pipeline.stages = 2;
                       c.pipeline.dp = 2;
                       c.pipeline.microbatches = 4;
                       c.pipeline.schedule = k;
                       c.pipeline.chunks = k == ScheduleKind::Interleaved1F1B ? 2 : 1;
                     }});
  return cases;
}

// What a run leaves to compare: rank 0's final parameters on the host, every step's loss, and
// rank 0's bucket all-reduces in the recorder.
struct DeviceRun {
  std::vector<float> params;
  std::vector<float> losses;
  float eval_loss = 0;
  int64_t bucket_allreduces = 0;
};

// On a GPU the ranks share device 0 (the cuda backend), which any machine with one GPU has.
DeviceRun run_on(TrainConfig c, const std::string& device) {
  c.device = device;
  c.backend = device == "cpu" ? "threads" : "cuda";
  Trainer t(c);
  DeviceRun r;
  const TrainSummary s = t.run([&](const StepReport& rep) { r.losses.push_back(rep.loss); });
  r.eval_loss = s.eval_loss;
  r.params = t.model().host_params();
  for (const Event& e : t.recorder().events(0)) r.bucket_allreduces += e.kind == EventKind::BucketAllReduce;
  return r;
}


bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

std::string num(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3g", v);
  return s;
}

// One device against the table. The CPU: each case learns and repeats itself bit for bit. Any other
// device: each case equals the CPU engine within 1e-5.
void check_every_strategy(const std::string& device) {
  constexpr double kTol = 1e-5;
  for (const StrategyCase& sc : strategy_cases()) {
    CAPTURE(sc.name);
    TrainConfig c = base_config();
    sc.tweak(c);
    const DeviceRun cpu = run_on(c, "cpu");
    REQUIRE(cpu.losses.size() == size_t(c.steps));
    if (device == "cpu") {
      const DeviceRun again = run_on(c, "cpu");
      CHECK(same_bits(again.params, cpu.params));
      CHECK(same_bits(again.losses, cpu.losses));
      CHECK(cpu.eval_loss < cpu.losses.front());  // it learns: the training set's loss after < the first batch's
      MESSAGE(sc.name << ": first loss " << num(cpu.losses.front()) << ", training-set loss after " << c.steps
                      << " steps " << num(cpu.eval_loss));
      continue;
    }
    const DeviceRun dev = run_on(c, device);
    REQUIRE(dev.losses.size() == cpu.losses.size());
    const double dp = test::max_abs_diff(dev.params, cpu.params), dl = test::max_abs_diff(dev.losses, cpu.losses);
    MESSAGE(sc.name << " on " << device << ": max |param diff| " << num(dp) << ", max |loss diff| " << num(dl)
                    << " after " << c.steps << " steps");
    CHECK(dp <= kTol);
    CHECK(dl <= kTol);
    CHECK(std::fabs(double(dev.eval_loss) - cpu.eval_loss) <= kTol);
    if (c.strategy == Strategy::Ddp) CHECK(dev.bucket_allreduces == cpu.bucket_allreduces);  // the same buckets, launched alike
  }
}

using test::CliResult;
using test::run_cli;

}  // namespace

TEST_SUITE("devices") {

TEST_CASE("devices: the list holds cpu first, and cuda exactly when a GPU is present") {
  const std::vector<std::string> d = devices_present();
  REQUIRE(!d.empty());
  CHECK(d.front() == "cpu");
#if DTLAB_HAVE_CUDA
  CHECK(present("cuda") == cuda::available());
#else
  CHECK(!present("cuda"));
#endif
  std::string all;
  for (const auto& x : d) all += (all.empty() ? "" : ", ") + x;
  MESSAGE("devices present: " << all);
}

TEST_CASE("devices: cpu: every strategy trains and repeats itself bit for bit") {
  check_every_strategy("cpu");
}

TEST_CASE("devices: cuda: every strategy equals the CPU engine within 1e-5 after 20 steps" * doctest::test_suite("cuda")) {
  if (!present("cuda")) {
    MESSAGE(("skipped: " + why_absent("cuda")));
    return;
  }
  check_every_strategy("cuda");
}

TEST_CASE("devices: cuda: DDP's bucket all-reduces overlap the backward, and the recorder has them" *
          doctest::test_suite("cuda")) {
  if (!present("cuda")) {
    MESSAGE(("skipped: " + why_absent("cuda")));
    return;
  }
  // tests/test_ddp.cpp's overlap setting: layers big enough that the backward's modeled time is
  // comparable to the all-reduces on nvlink8 (the table's small model hides none of them).
  TrainConfig c = cuda_ddp_config(4);
  c.model = ModelSpec::parse("mlp:2,512,512,512,3");
  c.batch = 512;
  c.steps = 3;
  c.ddp.bucket_cap_bytes = 512 * 1024;
  c.ddp.first_bucket_bytes = 10 * 1024;
  c.profile = "nvlink8";
  Trainer t(c);
  std::vector<double> overlaps;
  t.run([&](const StepReport& r) { overlaps.push_back(r.overlap); });
  REQUIRE(overlaps.size() == 3);
  // Iteration 1 all-reduces the whole model as ONE bucket (torch's first iteration with
  // find_unused_parameters=False, engine/parallel/ddp.h), launched after the last gradient: nothing
  // hides. The rebuilt, sized buckets of iterations 2 and 3 launch during the backward.
  CHECK(overlaps[0] == 0.0);
  for (size_t i = 1; i < overlaps.size(); i++) {
    CAPTURE(i);
    CHECK(overlaps[i] > 0);
    CHECK(overlaps[i] < 1);  // the last bucket cannot hide
  }
  // The same events as the CPU engine records for the same run: one GPU-timed span per layer's
  // backward (4 Linear + 3 ReLU = 7 layers x 3 steps, flushed at each step's end) and the same
  // number of bucket all-reduces (1 in iteration 1, then the rebuilt buckets).
  TrainConfig cpu = c;
  cpu.device = "cpu";
  cpu.backend = "threads";
  Trainer tc(cpu);
  tc.run();
  for (int rank = 0; rank < c.world_size; rank++) {
    CAPTURE(rank);
    int64_t buckets = 0, backward = 0, cpu_buckets = 0, cpu_backward = 0;
    for (const Event& e : t.recorder().events(rank)) {
      buckets += e.kind == EventKind::BucketAllReduce;
      backward += e.kind == EventKind::Compute && e.compute.kind == ComputeKind::LayerBackward;
    }
    for (const Event& e : tc.recorder().events(rank)) {
      cpu_buckets += e.kind == EventKind::BucketAllReduce;
      cpu_backward += e.kind == EventKind::Compute && e.compute.kind == ComputeKind::LayerBackward;
    }
    CHECK(buckets > 3);  // more than one bucket an iteration after the rebuild
    CHECK(buckets == cpu_buckets);
    CHECK(backward == 3 * 7);
    CHECK(backward == cpu_backward);
  }
  // On the wall clock (information, not a check: it depends on the GPU and the host): the share of
  // rank 0's all-reduce time that falls inside its GPU-timed backward, per step.
  for (int32_t iter = 0; iter < 3; iter++) {
    int64_t b0 = INT64_MAX, b1 = INT64_MIN, comm = 0, hidden = 0;
    const std::vector<Event> ev = t.recorder().events(0);
    for (const Event& e : ev)
      if (e.iteration == iter && e.kind == EventKind::Compute && e.compute.kind == ComputeKind::LayerBackward)
        b0 = std::min(b0, e.wall_begin_ns), b1 = std::max(b1, e.wall_end_ns);
    for (const Event& e : ev)
      if (e.iteration == iter && e.kind == EventKind::BucketAllReduce) {
        comm += e.wall_end_ns - e.wall_begin_ns;
        hidden += std::max<int64_t>(0, std::min(e.wall_end_ns, b1) - std::max(e.wall_begin_ns, b0));
      }
    MESSAGE("step " << iter + 1 << ": modeled overlap " << num(overlaps[size_t(iter)]) << ", wall-clock "
                    << num(comm > 0 ? double(hidden) / double(comm) : 0.0) << " of " << num(comm / 1e3) << " us");
  }
}

TEST_CASE("devices: cuda: a paused run shows the GPU-timed forward and backward before its iteration ends" *
          doctest::test_suite("cuda")) {
  if (!present("cuda")) {
    MESSAGE(("skipped: " + why_absent("cuda")));
    return;
  }
  // The lab's case: held at the gate of iteration 0's bucket all-reduce (#2, after the shapes'
  // all-gather #0 and the parameter broadcast #1), each rank's compute thread waits for it. The
  // device timer hands its events over at the end of an iteration, which cannot come while the
  // all-reduce is held: the spans there come from the wait's flush (RankContext::before_wait).
  TrainConfig c = cuda_ddp_config(2);
  c.steps = 2;
  c.start_paused = true;
  Trainer t(c);
  test::BackgroundRun runner(t);
  Stepper& st = t.stepper();
  for (int i = 0; i < 2 && !runner.done(); i++) {
    REQUIRE(st.wait_until_settled(std::chrono::seconds(30)));
    st.step(GateKind::Collective);
  }
  const int layers = t.model().num_layers();
  auto count = [&](int rank, ComputeKind k) {
    int64_t n = 0;
    for (const Event& e : t.recorder().events(rank))
      n += e.kind == EventKind::Compute && e.compute.kind == k && e.iteration == 0;
    return n;
  };
  bool shown = false;
  for (int tries = 0; tries < 3000 && !shown && !runner.done(); tries++) {
    shown = count(0, ComputeKind::LayerBackward) == layers && count(1, ComputeKind::LayerBackward) == layers;
    if (!shown) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int64_t iterations_ended = 0;
  for (const Event& e : t.recorder().events(0)) iterations_ended += e.kind == EventKind::Iteration;
  CHECK(shown);
  CHECK(iterations_ended == 0);  // still inside iteration 0: the spans did not come from its end
  CHECK(count(0, ComputeKind::LayerForward) == layers);
  st.run();
  CHECK(runner.finish());
  CHECK(runner.error().empty());
}

TEST_CASE("devices: train --device cuda without a GPU: exit 2 and one sentence, for fsdp and pipeline too") {
  if (present("cuda")) {
    MESSAGE("a GPU is present: the refusal cannot be seen here (the cuda case above trains instead)");
    return;
  }
  for (const std::string strategy : {"fsdp", "pipeline", "ddp"}) {
    CAPTURE(strategy);
    const CliResult r = run_cli({"train", "--device", "cuda", "--strategy", strategy, "--world", "4", "--steps", "2"});
    INFO("stderr: ", r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("dtlab-cli: ", 0) == 0);
    REQUIRE(!r.err.empty());
    CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
#if DTLAB_HAVE_CUDA
    CHECK(r.err.find("no CUDA device") != std::string::npos);
#else
    CHECK(r.err.find("this build does not have") != std::string::npos);
#endif
  }
}

}  // TEST_SUITE
