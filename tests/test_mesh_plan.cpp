// The 3-D mesh planner (engine/parallel/mesh_plan.h) against counts worked by hand: the course's
// 64-GPU example (4-way TP x 4-way PP x 4-way DP) on DGX H100 nodes, a toy 2 x 2 x 2 mesh on
// ib2x4, sequence parallelism moving the same bytes, the one-sentence errors, and `dtlab-cli plan
// --tp/--stages` (table, --json, bad input).
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/mesh_plan.h"
#include "tests/cli_util.h"
#include "test_util.h"

using namespace dtlab;
using nlohmann::json;

using dtlab::test::line_starting;

namespace {

// 7B parameters, mixed precision AdamW, L = 32, h = 4096, s = 2048, b = 1, m = 8 micro-batches.
MeshPlanInput course_example() {
  MeshPlanInput in;
  in.memory.params = 7e9;
  in.memory.world = 64;
  in.memory.dtype = PlanDType::Mixed;
  in.memory.sharding = Sharding::NoShard;
  in.tp = 4;
  in.stages = 4;
  in.shape = TransformerShape{.layers = 32, .hidden = 4096, .seq = 2048, .micro_batch = 1, .micro_batches = 8};
  return in;
}

const DimTraffic& traffic(const MeshPlan& p, MeshDim d) { return p.traffic[static_cast<size_t>(d)]; }

test::CliResult plan_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return test::run_cli(args);
}

const std::vector<std::string> kCourseArgs = {"--params", "7B", "--world", "64", "--tp", "4", "--stages", "4", "--layers", "32",
                                              "--hidden", "4096", "--seq", "2048", "--micro-batch", "1", "--micro-batches", "8",
                                              "--dtype", "mixed"};

// The arguments with FLAG VALUE pairs set (replaced where given, else appended): CLI11 refuses a flag twice.
std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& extra) {
  for (size_t i = 0; i < extra.size(); i++) {
    auto it = std::find(base.begin(), base.end(), extra[i]);
    const bool valued = i + 1 < extra.size() && extra[i + 1].rfind("--", 0) != 0;
    if (it != base.end() && valued) *(it + 1) = extra[++i];
    else {
      base.push_back(extra[i]);
      if (valued) base.push_back(extra[++i]);
    }
  }
  return base;
}

}  // namespace

TEST_SUITE("plan") {

TEST_CASE("mesh plan: the 64-GPU example, 4-way TP x 4-way PP x 4-way DP on DGX H100 nodes") {
  const HardwareProfile prof = find_profile("dgx-h100x2");
  const MeshPlan p = plan_mesh(course_example(), &prof);
  CHECK(p.mesh == MeshShape{4, 4, 4});
  CHECK(p.rank_params == 437500000);  // 7e9 / 16
  CHECK(p.layers_per_stage == 8);
  CHECK(p.activation_elems == 2048 * 4096);
  CHECK(p.activation_bytes == 2);
  // NO_SHARD over dp: (2 + 2 + 12) bytes per parameter of the rank's share.
  CHECK(p.memory.total == 16.0 * 437500000);
  // TP: (L/p) m x 4 all-reduces x 2(t-1)/t x b s h x a = 8 x 8 x 4 x 1.5 x 16 MiB = 6 GiB.
  CHECK(traffic(p, MeshDim::TP).bytes == 8.0 * 8 * 4 * 1.5 * 16777216);
  CHECK(traffic(p, MeshDim::TP).bytes == 6442450944.0);
  // PP: a middle stage sends m activations forward and m gradients backward, 16 MiB each.
  CHECK(traffic(p, MeshDim::PP).bytes == 2.0 * 8 * 16777216);
  // DP: 2(d-1)/d of the rank's fp16 gradients.
  CHECK(traffic(p, MeshDim::DP).bytes == 2 * 0.75 * 437500000 * 2);
  // TP groups are 4 neighbours, inside a node of 8; PP (stride 4) and DP (stride 16) span nodes.
  CHECK(traffic(p, MeshDim::TP).link == "NVSwitch");
  CHECK(traffic(p, MeshDim::TP).groups == 16);
  CHECK(traffic(p, MeshDim::TP).groups_spanning_nodes == 0);
  CHECK(traffic(p, MeshDim::PP).link == "InfiniBand");
  CHECK(traffic(p, MeshDim::PP).groups_spanning_nodes == 16);
  CHECK(traffic(p, MeshDim::DP).link == "InfiniBand");
  CHECK(traffic(p, MeshDim::DP).groups_spanning_nodes == 16);
  CHECK(p.node_size == 8);
  CHECK(p.nodes == 8);
  CHECK(p.slowest_link == "InfiniBand");
  CHECK(p.slowest_link_dims == "dp + pp");
  CHECK(p.slowest_link_bytes == 1312500000.0 + 268435456.0);
  CHECK(traffic(p, MeshDim::TP).link_seconds == doctest::Approx(6442450944.0 / 370e9));
}

TEST_CASE("mesh plan: sequence parallelism moves the same bytes as TP's all-reduces") {
  MeshPlanInput in = course_example();
  const MeshPlan tp = plan_mesh(in);
  in.sequence_parallel = true;
  const MeshPlan sp = plan_mesh(in);
  CHECK(traffic(sp, MeshDim::TP).bytes == traffic(tp, MeshDim::TP).bytes);
  CHECK(traffic(tp, MeshDim::TP).formula == "(L/p)·m · 4·2(t-1)/t · b·s·h · e");
  CHECK(traffic(sp, MeshDim::TP).formula == "(L/p)·m · 8·(t-1)/t · b·s·h · e");
  CHECK(traffic(sp, MeshDim::TP).what.find("reduce-scatters") != std::string::npos);
}

TEST_CASE("mesh plan: a 2 x 2 x 2 mesh of mlp:2,64,64,3 on ib2x4, fp32, by hand") {
  MeshPlanInput in;
  in.memory.params = 4547;
  in.memory.world = 8;
  in.memory.sharding = Sharding::NoShard;
  in.tp = 2;
  in.stages = 2;
  in.shape = TransformerShape{.layers = 2, .hidden = 64, .seq = 1, .micro_batch = 8, .micro_batches = 4};
  const HardwareProfile prof = find_profile("ib2x4");
  const MeshPlan p = plan_mesh(in, &prof);
  CHECK(p.rank_params == 1137);  // ceil(4547 / 4)
  CHECK(p.activation_elems == 512);
  CHECK(traffic(p, MeshDim::TP).bytes == 1 * 4 * 4 * 0.5 * 2 * 512 * 4);  // 32768
  CHECK(traffic(p, MeshDim::PP).bytes == 4 * 512 * 4);                    // two stages: one boundary each
  CHECK(traffic(p, MeshDim::DP).bytes == 2 * 0.5 * 1137 * 4);              // 4548
  CHECK(traffic(p, MeshDim::TP).link == "NVLink");  // {0,1}
  CHECK(traffic(p, MeshDim::PP).link == "NVLink");  // {0,2}: one node of 4
  CHECK(traffic(p, MeshDim::DP).link == "InfiniBand");  // {0,4}
  CHECK(p.slowest_link_dims == "dp");
  CHECK(p.slowest_link_bytes == 4548);

  // Without TP or PP nothing moves along them, and the shape is not needed.
  MeshPlanInput dp_only;
  dp_only.memory.params = 4547;
  dp_only.memory.world = 4;
  dp_only.memory.sharding = Sharding::NoShard;
  const MeshPlan q = plan_mesh(dp_only);
  CHECK(q.mesh == MeshShape{4, 1, 1});
  CHECK(traffic(q, MeshDim::TP).bytes == 0);
  CHECK(traffic(q, MeshDim::PP).bytes == 0);
  CHECK(traffic(q, MeshDim::DP).bytes == 2 * 0.75 * 4547 * 4);
}

TEST_CASE("mesh plan: one-sentence errors") {
  MeshPlanInput in = course_example();
  in.memory.world = 60;
  CHECK_THROWS_WITH_AS(plan_mesh(in), doctest::Contains("--world 60 is not a multiple of --tp 4 x --stages 4 = 16"), Error);
  in = course_example();
  in.shape.layers = 30;
  CHECK_THROWS_WITH_AS(plan_mesh(in), "--layers 30 does not split evenly over --stages 4; every stage holds the same number of layers, so use a multiple of 4", Error);
  in = course_example();
  in.tp = 1;
  in.memory.world = 16;
  in.sequence_parallel = true;
  CHECK_THROWS_WITH_AS(plan_mesh(in), "--sequence-parallel splits activations across a tensor-parallel group; use it with --tp 2 or more", Error);
  in = course_example();
  in.shape.hidden = 0;
  CHECK_THROWS_WITH_AS(plan_mesh(in), doctest::Contains("give the transformer's --layers, --hidden, --seq and --micro-batch"), Error);
}

TEST_CASE("dtlab-cli plan --tp --stages: the mesh, the table over dp, and each dimension's traffic") {
  test::CliResult r = plan_cli(with(kCourseArgs, {"--profile", "dgx-h100x2"}));
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("Mesh: dp 4 x pp 4 x tp 4 = 64 ranks (torch init_device_mesh order, tp fastest); each rank holds Ψ/(t·p) = 437.5M parameters") != std::string::npos);
  CHECK(r.out.find("HYBRID_SHARD: one group of all 4 ranks") != std::string::npos);
  CHECK(r.out.find("7.00 (6.52)") != std::string::npos);  // NO_SHARD: 16 x 437.5M bytes
  CHECK(r.out.find("b·s·h = 1·2048·4096 = 8,388,608 elements, e = 2 bytes each") != std::string::npos);
  const std::string tp_row = line_starting(r.out, "tp ");
  CHECK(tp_row.find(" 6.00 GiB  (L/p)·m · 4·2(t-1)/t · b·s·h · e  4 all-reduces per layer (2 forward, 2 backward)") != std::string::npos);
  CHECK(tp_row.find("17.41 ms") != std::string::npos);  // 6 GiB at 370 GB/s
  CHECK(line_starting(r.out, "pp ").find(" 256.0 MiB  2 · m · b·s·h · e ") != std::string::npos);
  CHECK(line_starting(r.out, "dp ").find(" 1.22 GiB  2(d-1)/d · Ψ/(t·p) · g ") != std::string::npos);
  CHECK(r.out.find("NVSwitch (inside a node)") != std::string::npos);
  CHECK(r.out.find("InfiniBand (across nodes)") != std::string::npos);
  CHECK(r.out.find("the mesh needs 8 nodes (more than the profile's 2; its node repeated). Slowest link used: InfiniBand, carrying 1.47 GiB per rank per step (dp + pp)") != std::string::npos);

  r = plan_cli(with(kCourseArgs, {"--profile", "dgx-h100x2", "--json", "--strategy", "full"}));
  REQUIRE(r.code == 0);
  const json j = json::parse(r.out);
  REQUIRE(j["strategies"].size() == 1);
  CHECK(j["strategies"][0]["total"] == 16 * 437500000LL / 4);
  const json& m = j["mesh"];
  CHECK(m["dp"] == 4);
  CHECK(m["rank_params"] == 437500000LL);
  CHECK(m["traffic"][2]["dim"] == "tp");
  CHECK(m["traffic"][2]["bytes"] == 6442450944LL);
  CHECK(m["traffic"][1]["bytes"] == 268435456LL);
  CHECK(m["traffic"][0]["bytes"] == 3 * 437500000LL * 2 * 3 / 4);  // FULL_SHARD's 3Ψ x (d-1)/d of fp16
  CHECK(m["slowest_link"] == "InfiniBand");

  // Without mesh flags the JSON is what it was.
  r = plan_cli({"--params", "7B", "--world", "64", "--json"});
  REQUIRE(r.code == 0);
  CHECK_FALSE(json::parse(r.out).contains("mesh"));
}

TEST_CASE("dtlab-cli plan --tp: bad input") {
  auto check_error = [](const std::vector<std::string>& args, const std::string& expect) {
    test::CliResult r = plan_cli(args);
    INFO("stderr: ", r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(expect) != std::string::npos);
  };
  check_error({"--params", "7B", "--world", "64", "--tp", "4", "--layers", "32", "--hidden", "4096"},
              "--tp 4 counts its traffic in activations of b x s x h elements per micro-batch; add --seq, --micro-batch");
  check_error({"--params", "7B", "--world", "64", "--stages", "4"}, "--stages 4 counts its traffic");
  check_error(with(kCourseArgs, {"--world", "40"}), "--world 40 is not a multiple of --tp 4 x --stages 4 = 16");
  check_error(with(kCourseArgs, {"--layers", "30"}), "--layers 30 does not split evenly over --stages 4");
  check_error({"--params", "7B", "--world", "64", "--sequence-parallel"}, "use it with --tp 2 or more");
  check_error(with(kCourseArgs, {"--tp", "0"}), "--tp: 0 is out of range");
  check_error(with(kCourseArgs, {"--profile", "dgx"}), "hardware profile 'dgx' is not known");
  // A degree that does not divide what it splits was planned as if it did.
  check_error(with(kCourseArgs, {"--hidden", "4098"}),
              "--hidden 4098 is not divisible by --tp 4: tensor parallelism splits the hidden size evenly over the TP ranks; pick a multiple of 4");
  check_error(with(kCourseArgs, {"--seq", "2050", "--sequence-parallel"}), "--seq 2050 is not divisible by --tp 4");
}

}  // TEST_SUITE
