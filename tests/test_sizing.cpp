// The sizing calculator (engine/parallel/sizing.h) against the course's 70B example (140 GB of fp16
// gradients, ~5.6 s on InfiniBand's 50 GB/s, 36% overhead for 10 s of compute, 65% for 3 s), the
// ZeRO paper's Table 1 (Ψ = 7.5B, K = 12, N_d = 64: 120, 31.4, 16.6, 1.9 GB), 6·N·tokens plus
// attention, Korthikanti et al.'s activations, each dimension's link, and `dtlab-cli plan
// --global-batch` (text, JSON, one-sentence errors). Sources: docs/course_sources.md §6f.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/sizing.h"
#include "tests/cli_util.h"

using namespace dtlab;
using nlohmann::json;

namespace {

// The course's premise: pure data parallelism of a 70B model in fp16 over InfiniBand (the dgx-h100x2
// profile's 50 GB/s NICs), forward + backward taking `compute_s` seconds.
SizingInput course_70b(double compute_s) {
  SizingInput in;
  in.params = 70e9;
  in.layers = 80, in.hidden = 8192, in.heads = 64, in.seq = 4096;
  in.dp = 128, in.tp = 1, in.pp = 1;
  in.global_batch = 128;
  in.precision = PlanDType::Fp16;
  in.zero = 0;
  in.profile = "dgx-h100x2";
  in.compute_seconds = compute_s;
  return in;
}

double round_to(double x, double step) { return std::round(x / step) * step; }

test::CliResult plan_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return test::run_cli(args);
}

void check_usage_error(const std::vector<std::string>& args, const std::string& expect) {
  const test::CliResult r = plan_cli(args);
  INFO("stderr: ", r.err);
  CHECK(test::one_sentence_usage_error(r));
  CHECK(r.err.find(expect) != std::string::npos);
}

const std::vector<std::string> kSmall = {"--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "2048"};

std::vector<std::string> small_with(std::vector<std::string> extra) {
  std::vector<std::string> v = kSmall;
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

}  // namespace

TEST_SUITE("plan_sizing") {
  TEST_CASE("plan sizing: the course's 70B example, 140 GB of fp16 gradients, 5.6 s on 50 GB/s, 36% and 65% overhead") {
    const SizingPlan p = plan_sizing(course_70b(10));
    CHECK(p.grad_bytes == 140e9);
    // A ring all-reduce sends 2(d-1)/d of the payload per rank: about twice 140 GB.
    CHECK(p.dp_bytes == doctest::Approx(2.0 * 127 / 128 * 140e9));
    CHECK(p.dp_seconds == doctest::Approx(p.dp_bytes / 50e9));
    CHECK(round_to(p.dp_seconds, 0.1) == doctest::Approx(5.6));
    CHECK(p.tp_bytes == 0);
    CHECK(p.pp_bytes == 0);
    CHECK(p.comm_seconds == p.dp_seconds);
    CHECK(round_to(p.overhead, 0.01) == doctest::Approx(0.36));
    CHECK(round_to(1 - p.overhead, 0.01) == doctest::Approx(0.64));
    const SizingPlan fast = plan_sizing(course_70b(3));
    CHECK(round_to(fast.overhead, 0.01) == doctest::Approx(0.65));
    CHECK(round_to(1 - fast.overhead, 0.01) == doctest::Approx(0.35));
    // The <20% rule: the compute must last at least four times the communication.
    CHECK(plan_sizing(course_70b(4.01 * p.comm_seconds)).overhead < 0.2);
    CHECK(plan_sizing(course_70b(3.99 * p.comm_seconds)).overhead > 0.2);
    // And pure DP of 70B does not fit: 16 bytes per parameter on every GPU.
    CHECK(p.params + p.grads + p.optimizer == 70e9 * 16);
    CHECK_FALSE(p.fits);
    CHECK(sizing_line(p, "grad.bytes").formula == "N · 2");
    CHECK(format_sizing_value(p.grad_bytes, SizingUnit::Bytes) == "140.00 GB");
    CHECK(format_sizing_value(p.dp_seconds, SizingUnit::Seconds) == "5.56 s");
    CHECK(sizing_line(p, "dp.seconds").formula.find("InfiniBand (across nodes, 50 GB/s)") != std::string::npos);
  }

  TEST_CASE("plan sizing: the ZeRO paper's Table 1 through the calculator (7.5B, K = 12, N_d = 64)") {
    SizingInput in;
    in.params = 7.5e9;
    in.layers = 32, in.hidden = 4096, in.heads = 32, in.seq = 2048;
    in.dp = 64, in.tp = 1, in.pp = 1, in.global_batch = 64;
    in.precision = PlanDType::Bf16;
    const double expect[4] = {120, 31.4, 16.6, 1.9};  // GB, one decimal as the paper prints them
    for (int zero = 0; zero <= 3; zero++) {
      CAPTURE(zero);
      in.zero = zero;
      const SizingPlan p = plan_sizing(in);
      CHECK(round_to((p.params + p.grads + p.optimizer) / 1e9, 0.1) == doctest::Approx(expect[zero]));
      // The activations come on top, the same at every stage.
      CHECK(p.total == doctest::Approx(p.params + p.grads + p.optimizer + p.activations));
    }
    in.zero = 3;
    const SizingPlan p3 = plan_sizing(in);
    CHECK(sizing_line(p3, "memory.optimizer").formula == "12·Ψ/(t·p)/d");
    CHECK(sizing_line(p3, "memory.params").formula == "2·Ψ/(t·p)/d");
  }

  TEST_CASE("plan sizing: FLOPs per step are 6·N·tokens plus 12·L·h·s per token, and the step time at an MFU") {
    SizingInput in;
    in.params = 7e9;
    in.layers = 32, in.hidden = 4096, in.heads = 32, in.seq = 2048;
    in.dp = 8, in.tp = 1, in.pp = 1, in.global_batch = 64;
    in.profile = "dgx-h100";
    in.mfu = 0.5;
    const SizingPlan p = plan_sizing(in);
    const double tokens = 64.0 * 2048;
    CHECK(p.tokens == tokens);
    CHECK(p.dense_flops == 6 * 7e9 * tokens);
    CHECK(p.attention_flops == 12.0 * 32 * 4096 * 2048 * tokens);
    CHECK(p.model_flops == p.dense_flops + p.attention_flops);
    CHECK(p.recompute_flops == 0);
    CHECK(p.peak_flops == 989e12);
    CHECK(p.compute_seconds == doctest::Approx(p.model_flops / (8 * 989e12 * 0.5)));
    in.recompute = true;
    const SizingPlan r = plan_sizing(in);
    CHECK(r.recompute_flops == doctest::Approx(p.model_flops / 3));
    CHECK(r.compute_seconds == doctest::Approx(p.compute_seconds * 4 / 3));
    CHECK(gpu_peak_flops(find_profile("ib2x4")) == 312e12);
  }

  TEST_CASE("plan sizing: activations are Korthikanti et al.'s, split by tp with sequence parallelism, 2sbh with recompute") {
    SizingInput in;
    in.params = 7e9;
    in.layers = 32, in.hidden = 4096, in.heads = 32, in.seq = 2048, in.micro_batch = 1;
    in.dp = 1, in.tp = 1, in.pp = 1, in.global_batch = 1;
    in.precision = PlanDType::Bf16;
    const ActivationPlan a = plan_activations(32, 4096, 2048, 1, 32);
    CHECK(plan_sizing(in).activations == a.total);
    in.tp = 4, in.sequence_parallel = true;
    CHECK(plan_sizing(in).activations == doctest::Approx(a.total / 4));
    in.sequence_parallel = false;
    const double sbh = 2048.0 * 4096;
    CHECK(plan_sizing(in).activations == doctest::Approx(32 * sbh * (10 + 24.0 / 4 + 5.0 * 32 * 2048 / 4096 / 4)));
    in.recompute = true;
    CHECK(plan_sizing(in).activations == a.total_checkpointed);
    in.sequence_parallel = true;
    CHECK(plan_sizing(in).activations == doctest::Approx(a.total_checkpointed / 4));
    // 1F1B: the first stage holds min(m, p) micro-batches of its L/p layers.
    in.recompute = false, in.tp = 1, in.pp = 4, in.global_batch = 8;
    const SizingPlan p = plan_sizing(in);
    CHECK(p.in_flight == 4);
    CHECK(p.activations == doctest::Approx(a.total));
    CHECK(p.bubble == doctest::Approx(3.0 / 11));
    CHECK(p.bubble_seconds == doctest::Approx(p.compute_seconds * 3 / 8));
  }

  TEST_CASE("plan sizing: tp stays on NVSwitch, dp crosses InfiniBand, recompute adds the forward's tp collectives") {
    SizingInput in;  // the defaults: 70B, tp 8 x dp 64 on dgx-h100x2
    const SizingPlan p = plan_sizing(in);
    CHECK(p.world == 512);
    CHECK(p.micro_batches == 8);
    // Placed in Megatron-core's order (the placement lines, tp first and the dp x cp group third).
    REQUIRE(p.placement.size() == 4);
    const SizingGroup& tp = p.placement[0];
    const SizingGroup& dp = p.placement[2];
    CHECK(tp.place.spanning == 0);
    CHECK(sizing_line(p, "tp.spanning").value == 0);
    CHECK(tp.link == "NVSwitch");
    CHECK(dp.link == "InfiniBand");
    CHECK(sizing_line(p, "dp.spanning").formula == "64 ranks 8 apart: 8 of 8 groups cross nodes (InfiniBand)");
    CHECK(p.tp_seconds == doctest::Approx(p.tp_bytes / 370e9));
    CHECK(p.dp_seconds == doctest::Approx(p.dp_bytes / 50e9));
    // ZeRO-1 over 64: reduce-scatter + all-gather of the rank's 70B/8 bf16 gradients, 2(d-1)/d of them.
    CHECK(p.dp_bytes == doctest::Approx(2.0 * 63 / 64 * 70e9 / 8 * 2));
    // Megatron: (L/p)·m·4·2(t-1)/t·b·s·h·2 bytes.
    CHECK(p.tp_bytes == doctest::Approx(80.0 * 8 * 4 * 2 * 7 / 8 * 4096 * 8192 * 2));
    in.recompute = true;
    CHECK(plan_sizing(in).tp_bytes == doctest::Approx(p.tp_bytes * 1.5));
    CHECK(p.ratio == doctest::Approx(p.comm_seconds / p.compute_seconds));
  }

  TEST_CASE("plan sizing: a spec string round-trips and bad settings are one sentence") {
    SizingInput in;
    in.params = 13e9, in.dp = 4, in.pp = 2, in.tp = 2, in.zero = 2, in.recompute = true, in.mfu = 0.35, in.global_batch = 64;
    in.layers = 40, in.hidden = 5120, in.heads = 40, in.profile = "ib2x4";
    const SizingInput back = parse_sizing_spec(sizing_spec(in));
    CHECK(sizing_spec(back) == sizing_spec(in));
    CHECK(plan_sizing(back).total == plan_sizing(in).total);
    CHECK_THROWS_WITH_AS(parse_sizing_spec("dq=4"), doctest::Contains("'dq' is not a sizing setting"), Error);
    CHECK_THROWS_WITH_AS(parse_sizing_spec("dp=four"), doctest::Contains("dp=four is not a whole number"), Error);
    in.global_batch = 6;
    CHECK_THROWS_WITH_AS(plan_sizing(in), doctest::Contains("use a multiple of dp x micro-batch = 4"), Error);
    in.global_batch = 64, in.heads = 41;
    CHECK_THROWS_WITH_AS(plan_sizing(in), doctest::Contains("41 attention heads do not split evenly over tp 2"), Error);
    CHECK_THROWS_WITH_AS(sizing_line(plan_sizing(SizingInput{}), "nope"), doctest::Contains("is not a sizing figure"), Error);
  }

  TEST_CASE("plan --global-batch: the calculator in the CLI, as text and as JSON") {
    const std::vector<std::string> args = {"--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--seq", "4096",
                                           "--global-batch", "128", "--dp", "128", "--precision", "fp16", "--compute-time", "10"};
    const test::CliResult r = plan_cli(args);
    INFO("stderr: ", r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("Layout: dp 128 x tp 1 x pp 1 = 128 GPUs on dgx-h100x2, fp16, ZeRO-0") != std::string::npos);
    CHECK(r.out.find("140.00 GB  N · 2") != std::string::npos);
    CHECK(r.out.find("5.56 s  bytes / bandwidth on InfiniBand") != std::string::npos);
    CHECK(r.out.find("35.7%  comm / (compute + comm)") != std::string::npos);
    CHECK(r.out.find("Does not fit") != std::string::npos);
    std::vector<std::string> j_args = args;
    j_args.push_back("--json");
    const test::CliResult jr = plan_cli(j_args);
    REQUIRE(jr.code == 0);
    const json j = json::parse(jr.out)["sizing"];
    CHECK(j["world"] == 128);
    CHECK(j["figures"]["grad.bytes"]["value"] == 140e9);
    CHECK(j["figures"]["flops.dense"]["formula"] == "6 · N · B·s");
    CHECK(j["spec"].get<std::string>().find("dp=128 tp=1 pp=1 precision=fp16 zero=0") != std::string::npos);
    // --world alone gives dp = world / (tp x pp); the existing table is untouched without sizing flags.
    const test::CliResult w = plan_cli(small_with({"--global-batch", "64", "--world", "16", "--tp", "2", "--pp", "2"}));
    CHECK(w.out.find("dp 4 x tp 2 x pp 2 = 16 GPUs") != std::string::npos);
    CHECK(plan_cli({"--params", "7.5B", "--world", "64"}).out.find("Memory per rank: 7.5B parameters") == 0);
  }

  TEST_CASE("plan --global-batch: layouts that describe no run are one sentence, exit 2") {
    check_usage_error({"--params", "7B", "--global-batch", "64"},
                      "sizing a run needs the model's shape and the global batch; add --layers, --hidden, --seq, --heads");
    check_usage_error({"--params", "7B", "--layers", "32", "--dp", "8"}, "add --hidden, --seq, --heads, --global-batch");
    check_usage_error(small_with({"--global-batch", "60", "--dp", "8"}),
                      "a global batch of 60 sequences does not split into whole micro-batches of 1 on 8 replicas; use a multiple of dp x micro-batch = 8");
    check_usage_error(small_with({"--global-batch", "64", "--dp", "8", "--world", "16"}), "--world 16 is not dp x tp x pp = 8");
    check_usage_error(small_with({"--global-batch", "64", "--world", "12", "--tp", "8"}), "--world 12 is not a multiple of tp x pp = 8");
    check_usage_error(small_with({"--global-batch", "64", "--zero", "4"}), "--zero");
    check_usage_error(small_with({"--global-batch", "64", "--pp", "3"}), "32 layers do not split evenly over 3 pipeline stages");
    check_usage_error(small_with({"--global-batch", "64", "--pp", "2", "--stages", "2"}), "give the pipeline degree once");
    check_usage_error(small_with({"--global-batch", "64", "--strategy", "full"}), "--strategy is not part of sizing");
    check_usage_error(small_with({"--global-batch", "64", "--profile", "dgx-z"}), "dgx-z");
    check_usage_error({"--params", "7B"}, "--world is required");
  }
}

TEST_SUITE("plan_sizing") {
  TEST_CASE("plan sizing: the layout scaled down for the lab is a run dtlab-cli train accepts") {
    // The Sizing view's "Run it scaled down" restarts the lab with these flags; the CLI's parser and
    // config check are the lab's (add_train_flags), so every preset and a pipeline must pass them.
    std::vector<SizingInput> layouts(4);
    layouts[1] = parse_sizing_spec("params=70B dp=128 tp=1 global_batch=128 precision=fp16 zero=0 sp=0 compute_s=10");
    layouts[2] = parse_sizing_spec("params=7B layers=32 hidden=4096 heads=32 global_batch=64 micro_batch=2 dp=8 tp=1 zero=3 recompute=1 sp=0 profile=dgx-h100");
    layouts[3] = parse_sizing_spec("dp=16 tp=8 pp=4 zero=1 global_batch=256");
    for (const SizingInput& in : layouts) {
      std::vector<std::string> args = sizing_mirror_flags(in);
      CAPTURE(sizing_spec(in));
      int world = 0;
      for (size_t i = 0; i + 1 < args.size(); i++)
        if (args[i] == "--world") world = std::stoi(args[i + 1]);
      CHECK(world >= 1);
      CHECK(world <= 8);
      args.insert(args.begin(), "train");
      std::ostringstream out, err;
      const int code = cli::run_cli(args, {out, err, false, cli::Mode::CheckConfig});
      INFO("stderr: ", err.str());
      CHECK(code == 0);
    }
  }
}
