// The memory planner against the ZeRO paper's own example (Ψ = 7.5B, N_d = 64: 120, 31.4, 16.6,
// 1.9 GB), fp32 numbers worked by hand for dtlab's default model, HYBRID_SHARD's groups, the
// one-sentence errors, and `dtlab-cli plan` driven in-process (table, --json, bad input).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "engine/core/check.h"
#include "engine/core/optim.h"
#include "engine/parallel/memory_plan.h"
#include "test_util.h"

using namespace dtlab;
using nlohmann::json;

using dtlab::test::line_starting;

namespace {

MemoryPlan plan(double params, int world, Sharding s, PlanDType dtype = PlanDType::Fp32) {
  MemoryPlanInput in;
  in.params = params;
  in.world = world;
  in.sharding = s;
  in.dtype = dtype;
  return plan_memory(in);
}

double one_decimal_gb(double bytes) { return std::round(bytes / 1e8) / 10; }

struct PlanCliResult {
  int code = -1;
  std::string out, err;
};

PlanCliResult run_plan_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  std::ostringstream out, err;
  PlanCliResult r;
  r.code = dtlab::cli::run_cli(args, {out, err, false});
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The CLI's bad-input contract (see test_cli.cpp): exit 2, nothing on stdout, one line on stderr.
void check_plan_usage_error(const std::vector<std::string>& args, const std::string& expect) {
  PlanCliResult r = run_plan_cli(args);
  INFO("stderr: ", r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.rfind("dtlab-cli: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(expect) != std::string::npos);
}

}  // namespace

TEST_SUITE("plan") {

TEST_CASE("memory plan: the ZeRO paper's example, 7.5B parameters on 64 ranks in mixed precision") {
  const double psi = 7.5e9;
  const MemoryPlan p0 = plan(psi, 64, Sharding::NoShard, PlanDType::Mixed);
  const MemoryPlan p1 = plan(psi, 64, Sharding::Zero1, PlanDType::Mixed);
  const MemoryPlan p2 = plan(psi, 64, Sharding::ShardGradOp, PlanDType::Mixed);
  const MemoryPlan p3 = plan(psi, 64, Sharding::FullShard, PlanDType::Mixed);
  // Every term is a whole number of bytes well below 2^53, so the sums are exact.
  CHECK(p0.total == 120e9);
  CHECK(p1.total == 31.40625e9);
  CHECK(p2.total == 16.640625e9);
  CHECK(p3.total == 1.875e9);
  // As the paper prints them.
  CHECK(one_decimal_gb(p1.total) == doctest::Approx(31.4));
  CHECK(one_decimal_gb(p2.total) == doctest::Approx(16.6));
  CHECK(one_decimal_gb(p3.total) == doctest::Approx(1.9));

  // The parts: K = 12 bytes of optimizer state per parameter, split over 64 from stage 1 on.
  CHECK(p0.parameters == 15e9);
  CHECK(p0.gradients == 15e9);
  CHECK(p0.optimizer_state == 90e9);
  CHECK(p1.optimizer_state == 90e9 / 64);
  CHECK(p2.gradients == 15e9 / 64);
  CHECK(p3.parameters == 15e9 / 64);
  CHECK(p3.gathered == 0);  // no unit size given
  CHECK(p0.shard_ranks == 1);
  CHECK(p3.shard_ranks == 64);

  CHECK(p0.formula == "(2+2+12)Ψ");
  CHECK(p1.formula == "(2+2)Ψ + 12Ψ/N_d");
  CHECK(p2.formula == "2Ψ + (2+12)Ψ/N_d");
  CHECK(p3.formula == "(2+2+12)Ψ/N_d");

  // Communication: 2Ψ for stages 0-2, 3Ψ for stage 3, each with the ring's (N-1)/N, fp16 = 2 bytes.
  const double ring = 63.0 / 64;
  CHECK(p0.comm_bytes == doctest::Approx(2 * ring * psi * 2));
  CHECK(p1.comm_bytes == doctest::Approx(2 * ring * psi * 2));
  CHECK(p2.comm_bytes == doctest::Approx(2 * ring * psi * 2));
  CHECK(p3.comm_bytes == doctest::Approx(3 * ring * psi * 2));
  CHECK(p0.comm_formula == "2Ψ");
  CHECK(p2.comm_formula == "2Ψ");
  CHECK(p3.comm_formula == "3Ψ");
  CHECK(p3.comm_cross_group_bytes == 0);
}

TEST_CASE("memory plan: fp32 AdamW by hand for mlp:2,64,64,3 (4547 parameters) on 4 ranks") {
  // 2*64+64 + 64*64+64 + 64*3+3 = 4547. Sharded parts hold ceil(4547/4) = 1137 elements, the flat
  // parameter's padded shard (4 ranks * 1137 = 4548: one element of padding).
  const double psi = 4547;
  const MemoryPlan p0 = plan(psi, 4, Sharding::NoShard);
  CHECK(p0.parameters == 4 * 4547);
  CHECK(p0.gradients == 4 * 4547);
  CHECK(p0.optimizer_state == 8 * 4547);
  CHECK(p0.total == 72752);  // 16 * 4547
  CHECK(p0.formula == "(4+4+8)Ψ");

  const MemoryPlan p1 = plan(psi, 4, Sharding::Zero1);
  CHECK(p1.optimizer_state == 8 * 1137);
  CHECK(p1.total == 36376 + 9096);
  CHECK(p1.formula == "(4+4)Ψ + 8Ψ/N_d");

  const MemoryPlan p2 = plan(psi, 4, Sharding::ShardGradOp);
  CHECK(p2.total == 18188 + 12 * 1137);
  CHECK(p2.formula == "4Ψ + (4+8)Ψ/N_d");

  const MemoryPlan p3 = plan(psi, 4, Sharding::FullShard);
  CHECK(p3.total == 16 * 1137);  // 18192
  CHECK(p3.formula == "(4+4+8)Ψ/N_d");

  // Ring traffic per rank: (N-1)/N = 3/4 of the payload per all-gather or reduce-scatter.
  CHECK(p0.comm_bytes == doctest::Approx(2 * 0.75 * 4547 * 4));  // all-reduce 27282
  CHECK(p1.comm_bytes == doctest::Approx(0.75 * 4547 * (4 + 4)));
  CHECK(p3.comm_bytes == doctest::Approx(0.75 * 4547 * (4 + 4 + 4)));  // 40923

  SUBCASE("the largest unit in flight: the 64x64 layer, 4160 parameters") {
    MemoryPlanInput in;
    in.params = psi;
    in.world = 4;
    in.largest_unit_params = 4160;  // divisible by 4: no padding
    in.sharding = Sharding::FullShard;
    MemoryPlan p = plan_memory(in);
    CHECK(p.gathered == 4160 * (4 + 4));  // its parameters, then its full gradient in backward
    CHECK(p.total == 18192 + 33280);
    CHECK(p.formula == "(4+4+8)Ψ/N_d + (4+4)Ψ_u");
    in.units_in_flight = 2;  // prefetch: the next unit is gathered too
    p = plan_memory(in);
    CHECK(p.gathered == 2 * 4160 * 8);
    CHECK(p.formula == "(4+4+8)Ψ/N_d + 2×(4+4)Ψ_u");
    in.units_in_flight = 1;
    in.sharding = Sharding::ShardGradOp;  // parameters stay whole: only the unit's gradient
    p = plan_memory(in);
    CHECK(p.gathered == 4160 * 4);
    CHECK(p.formula == "4Ψ + (4+8)Ψ/N_d + 4Ψ_u");
    in.sharding = Sharding::Zero1;  // gradients are whole already: nothing is gathered
    CHECK(plan_memory(in).gathered == 0);
    in.largest_unit_params = 4159;  // the unsharded flat parameter is 4 padded shards: 4160
    in.sharding = Sharding::FullShard;
    CHECK(plan_memory(in).gathered == 4160 * 8);
  }
}

TEST_CASE("memory plan: optimizer bytes agree with the engine's optimizers") {
  for (bool momentum : {false, true}) {
    OptimizerConfig c = default_optimizer_config(OptimizerKind::SGD);
    c.momentum = momentum ? 0.9 : 0.0;
    Optimizer sgd(c, 10, nullptr);
    CHECK(bytes_per_param(PlanDType::Fp32, OptimizerKind::SGD, momentum).optimizer_state ==
          sgd.state_bytes_per_param());
  }
  Optimizer adamw(default_optimizer_config(OptimizerKind::AdamW), 10, nullptr);
  CHECK(bytes_per_param(PlanDType::Fp32, OptimizerKind::AdamW, false).optimizer_state ==
        adamw.state_bytes_per_param());
  // Mixed precision adds the fp32 master copy to whatever the optimizer keeps.
  CHECK(bytes_per_param(PlanDType::Mixed, OptimizerKind::AdamW, false).optimizer_state == 12);
  CHECK(bytes_per_param(PlanDType::Mixed, OptimizerKind::SGD, true).optimizer_state == 8);
  CHECK(bytes_per_param(PlanDType::Mixed, OptimizerKind::SGD, false).optimizer_state == 4);

  // Plain SGD keeps no state: the empty term is left out of the formula.
  MemoryPlanInput in;
  in.params = 1000;
  in.world = 4;
  in.optimizer = OptimizerKind::SGD;
  in.sharding = Sharding::Zero1;
  const MemoryPlan p = plan_memory(in);
  CHECK(p.optimizer_state == 0);
  CHECK(p.total == 8000);
  CHECK(p.formula == "(4+4)Ψ");
}

TEST_CASE("memory plan: HYBRID_SHARD shards inside node groups and replicates across them") {
  MemoryPlanInput in;
  in.params = 7.5e9;
  in.world = 64;
  in.node_size = 8;
  in.dtype = PlanDType::Mixed;
  in.sharding = Sharding::Hybrid;
  const MemoryPlan p = plan_memory(in);
  CHECK(p.shard_ranks == 8);
  CHECK(p.total == 16 * 7.5e9 / 8);  // 15 GB: stage 3 with N_d = 8
  CHECK(p.formula == "(2+2+12)Ψ/N_d");
  // 3Ψ inside the group of 8, plus an all-reduce of the 1/8 shard across the 8 groups.
  const double cross = 2 * (7.0 / 8) * (7.5e9 / 8) * 2;
  CHECK(p.comm_cross_group_bytes == doctest::Approx(cross));
  CHECK(p.comm_bytes == doctest::Approx(3 * (7.0 / 8) * 7.5e9 * 2 + cross));
  CHECK(p.comm_formula == "3Ψ + 2Ψ/N_d");

  // The node size only concerns HYBRID_SHARD.
  in.sharding = Sharding::FullShard;
  CHECK(plan_memory(in).shard_ranks == 64);
  // One group spanning the world is FULL_SHARD.
  in.sharding = Sharding::Hybrid;
  in.node_size = 0;
  const MemoryPlan whole = plan_memory(in);
  CHECK(whole.total == plan(7.5e9, 64, Sharding::FullShard, PlanDType::Mixed).total);
  CHECK(whole.comm_formula == "3Ψ");
  // Groups of one rank are plain replication: all memory on each rank, DDP's all-reduce.
  in.node_size = 1;
  const MemoryPlan single = plan_memory(in);
  CHECK(single.total == 120e9);
  CHECK(single.comm_formula == "2Ψ");
  CHECK(single.comm_bytes == doctest::Approx(plan(7.5e9, 64, Sharding::NoShard, PlanDType::Mixed).comm_bytes));
}

TEST_CASE("memory plan: one rank shards nothing and sends nothing") {
  for (Sharding s : kAllShardings) {
    const MemoryPlan p = plan(4547, 1, s);
    CHECK(p.total == 16 * 4547);
    CHECK(p.comm_bytes == 0);
    CHECK(p.comm_formula == "0");
  }
}

TEST_CASE("memory plan: names, stages and parameter counts") {
  for (Sharding s : kAllShardings) CHECK(parse_sharding(sharding_flag(s)) == s);
  CHECK(std::string(sharding_name(Sharding::ShardGradOp)) == "SHARD_GRAD_OP");
  CHECK(std::string(sharding_name(Sharding::Hybrid)) == "HYBRID_SHARD");
  CHECK(std::string(sharding_name(Sharding::Zero1)) == "ZeRO-1 (optimizer state)");
  CHECK(zero_stage(Sharding::NoShard) == 0);
  CHECK(zero_stage(Sharding::Zero1) == 1);
  CHECK(zero_stage(Sharding::ShardGradOp) == 2);
  CHECK(zero_stage(Sharding::FullShard) == 3);
  CHECK(zero_stage(Sharding::Hybrid) == 3);
  CHECK(parse_plan_dtype("mixed") == PlanDType::Mixed);
  CHECK(parse_plan_dtype("fp32") == PlanDType::Fp32);

  CHECK(parse_param_count("7.5e9") == 7.5e9);
  CHECK(parse_param_count("7B") == 7e9);
  CHECK(parse_param_count("70b") == 70e9);
  CHECK(parse_param_count("125M") == 125e6);
  CHECK(parse_param_count("350K") == 350e3);
  CHECK(parse_param_count("1.3B") == 1300000000.0);  // 1.3 * 1e9 is a hair off in binary
  CHECK(parse_param_count("1.3T") == 1.3e12);
  CHECK(parse_param_count("4547") == 4547);
  // Beyond the bound, said on the text as given (the CLI once printed 1e300 as "1e+30").
  CHECK_THROWS_WITH_AS(parse_param_count("1e300"), "'1e300' is more than 1e15 parameters, beyond any model this plans; give at most 1e15 (1000T)", Error);
  CHECK(parse_param_count("1000T") == 1e15);
  CHECK(param_count_str(7.5e9) == "7.5B");
  CHECK(param_count_str(70e9) == "70B");
  CHECK(param_count_str(125e6) == "125M");
  CHECK(param_count_str(4547) == "4547");
}

TEST_CASE("memory plan: bad input is one sentence saying how to fix it") {
  auto with = [](auto change) {
    MemoryPlanInput in;
    in.params = 4547;
    in.world = 8;
    change(in);
    return in;
  };
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.params = 0; })),
                       doctest::Contains("whole number of parameters from 1 to 1e15, not 0"), Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.params = 1.5; })),
                       doctest::Contains("not 1.5"), Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.world = 0; })),
                       doctest::Contains("world size must be at least 1 rank, not 0"), Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.node_size = 3; })),
                       doctest::Contains("node size 3 does not divide world size 8; HYBRID_SHARD needs equal groups, so use one of 1, 2, 4, 8"),
                       Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.node_size = 16; })),
                       doctest::Contains("node size must be from 1 to the world size (8)"), Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.largest_unit_params = 5000; })),
                       doctest::Contains("largest unit (5000 parameters) cannot be larger than the whole model (4547)"),
                       Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.units_in_flight = 3; })),
                       doctest::Contains("units in flight must be 1 (no prefetch) or 2"), Error);
  CHECK_THROWS_WITH_AS(plan_memory(with([](MemoryPlanInput& in) { in.sgd_momentum = true; })),
                       doctest::Contains("momentum applies to SGD"), Error);
  CHECK_THROWS_WITH_AS(parse_sharding("fsdp"),
                       doctest::Contains("'fsdp' is not known; use no-shard, zero1, grad-op, full or hybrid"), Error);
  CHECK_THROWS_WITH_AS(parse_plan_dtype("fp8"), doctest::Contains("use fp32"), Error);
  for (const char* bad : {"7Q", "", "B", "inf", "nan", " 7B", "-5", "7e"})
    CHECK_THROWS_WITH_AS(parse_param_count(bad), doctest::Contains("is not a parameter count"), Error);
  CHECK_THROWS_WITH_AS(parse_param_count("0.5"), doctest::Contains("less than one parameter"), Error);
  CHECK_THROWS_WITH_AS(parse_param_count("4547.5"), doctest::Contains("not a whole number of parameters"), Error);
}

TEST_CASE("dtlab-cli plan: every strategy side by side") {
  PlanCliResult r = run_plan_cli({"--params", "7.5e9", "--world", "64", "--dtype", "mixed"});
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("7.5B parameters (Ψ = 7500000000), 64 ranks, mixed precision (fp16), adamw") != std::string::npos);
  CHECK(r.out.find("optimizer state 12 (fp32 master copy, m, v)") != std::string::npos);
  CHECK(r.out.find("GB per rank (1 GB = 1e9 bytes)") != std::string::npos);
  const std::string no_shard = line_starting(r.out, "NO_SHARD ");
  const std::string zero1 = line_starting(r.out, "ZeRO-1 (optimizer state) ");
  const std::string grad_op = line_starting(r.out, "SHARD_GRAD_OP ");
  const std::string full = line_starting(r.out, "FULL_SHARD ");
  const std::string hybrid = line_starting(r.out, "HYBRID_SHARD ");
  CHECK(no_shard.find("120.00 (111.76)") != std::string::npos);
  CHECK(no_shard.find("29.53 (2Ψ)") != std::string::npos);
  CHECK(zero1.find("31.41 (29.25)") != std::string::npos);
  CHECK(zero1.find("(2+2)Ψ + 12Ψ/N_d") != std::string::npos);
  CHECK(grad_op.find("16.64 (15.50)") != std::string::npos);
  CHECK(full.find("1.88 (1.75)") != std::string::npos);
  CHECK(full.find("44.30 (3Ψ)") != std::string::npos);
  CHECK(hybrid.find("(2+2+12)Ψ/N_d") != std::string::npos);  // one group of 64: FULL_SHARD
  CHECK(r.out.find("HYBRID_SHARD: one group of all 64 ranks, the same as FULL_SHARD") != std::string::npos);

  // Units follow the smallest total, so the most sharded row keeps its digits.
  r = run_plan_cli({"--params", "70B", "--world", "512", "--node-size", "8", "--dtype", "mixed"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("HYBRID_SHARD: FULL_SHARD inside groups of 8 ranks, replicated across 64 groups") != std::string::npos);
  CHECK(line_starting(r.out, "NO_SHARD ").find("1120.00 (1043.08)") != std::string::npos);
  CHECK(line_starting(r.out, "FULL_SHARD ").find("2.19 (2.04)") != std::string::npos);  // 16 * 70e9 / 512

  // A toy model stays in exact bytes, one strategy gives one row.
  r = run_plan_cli({"--params", "4547", "--world", "4", "--strategy", "full"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("bytes per rank") != std::string::npos);
  const std::string row = line_starting(r.out, "FULL_SHARD ");
  CHECK(row.find(" 18192 ") != std::string::npos);
  CHECK(row.find("(4+4+8)Ψ/N_d") != std::string::npos);
  CHECK(line_starting(r.out, "NO_SHARD ").empty());
}

TEST_CASE("dtlab-cli plan --json") {
  PlanCliResult r = run_plan_cli({"--params", "7.5B", "--world", "64", "--dtype", "mixed", "--node-size", "8", "--json"});
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  const json j = json::parse(r.out);
  CHECK(j["params"] == 7500000000LL);
  CHECK(j["world"] == 64);
  CHECK(j["node_size"] == 8);
  CHECK(j["dtype"] == "mixed");
  CHECK(j["bytes_per_param"]["optimizer_state"] == 12);
  REQUIRE(j["strategies"].size() == 5);
  const std::vector<std::string> names = {"NO_SHARD", "ZeRO-1 (optimizer state)", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"};
  const std::vector<int64_t> totals = {120000000000LL, 31406250000LL, 16640625000LL, 1875000000LL, 15000000000LL};
  for (size_t i = 0; i < 5; i++) {
    CHECK(j["strategies"][i]["name"] == names[i]);
    CHECK(j["strategies"][i]["total"] == totals[i]);
  }
  CHECK(j["strategies"][4]["strategy"] == "hybrid");
  CHECK(j["strategies"][4]["zero_stage"] == 3);
  CHECK(j["strategies"][4]["shard_ranks"] == 8);
  CHECK(j["strategies"][4]["comm_formula"] == "3Ψ + 2Ψ/N_d");
  CHECK(j["strategies"][1]["formula"] == "(2+2)Ψ + 12Ψ/N_d");
}

TEST_CASE("dtlab-cli plan: bad input") {
  const std::vector<std::string> ok = {"--params", "7B", "--world", "64"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = ok;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  check_plan_usage_error(with({"--bogus"}), "run 'dtlab-cli plan --help'");
  check_plan_usage_error({"--world", "64"}, "--params is required");
  check_plan_usage_error({"--params", "7Q", "--world", "64"}, "--params: '7Q' is not a parameter count");
  check_plan_usage_error(with({"--world", "0"}), "--world: 0 is out of range");
  check_plan_usage_error(with({"--strategy", "fsdp"}), "--strategy 'fsdp' is not known; use no-shard, zero1, grad-op, full, hybrid or all");
  check_plan_usage_error(with({"--dtype", "fp8"}), "precision 'fp8' is not known");
  check_plan_usage_error(with({"--optimizer", "adam"}), "optimizer 'adam' is not supported; use sgd or adamw");
  check_plan_usage_error(with({"--momentum"}), "--momentum applies to --optimizer sgd");
  check_plan_usage_error(with({"--node-size", "6"}), "node size 6 does not divide world size 64");
  check_plan_usage_error(with({"--node-size", "8", "--strategy", "full"}), "--node-size sets HYBRID_SHARD's shard group");
  check_plan_usage_error(with({"--prefetch"}), "--prefetch counts the next unit's gathered parameters");
  check_plan_usage_error(with({"--unit-params", "8B"}), "cannot be larger than the whole model");
}

}  // TEST_SUITE
