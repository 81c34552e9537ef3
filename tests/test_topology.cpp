// Topology profiles and the cost model's links: which physical links a step's transfers cross, their
// contention, the closed forms of the double tree, hierarchical and in-network all-reduces, and the
// step plans' per-step charges summing to collective_time for every algorithm.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/plan.h"
#include "engine/core/check.h"
#include "engine/trace/cost_model.h"

using dtlab::Algorithm;
using dtlab::CollectiveOp;
using dtlab::CostModel;
using dtlab::Fabric;
using dtlab::HardwareProfile;
using dtlab::Link;
using dtlab::LinkKind;
using dtlab::LinkLoad;
using Pairs = std::vector<std::pair<int, int>>;

namespace {

constexpr int K = dtlab::kPipelineChunks;

// Every link the same, `per_node` ranks a node, one rail per GPU (so no ring, tree or naive step
// shares a link).
HardwareProfile uniform_profile(int per_node, double a, double b, double g) {
  HardwareProfile p;
  p.name = "uniform";
  p.gpus_per_node = per_node;
  p.rails = per_node;
  p.intra = p.inter = Link{a, b};
  p.gamma = g;
  p.flops_per_s = 1e12;
  return p;
}

void check_close(double got, double want) {
  CHECK(std::abs(got - want) <= 1e-12 * std::abs(want));
}

// The double tree's height (the deeper of its two trees).
int double_tree_height(int n) {
  int h = 0;
  for (int tree = 0; tree < 2; ++tree)
    for (int r = 0; r < n; ++r) {
      int d = 0;
      for (int up = dtlab::double_tree_parent(n, tree, r); up >= 0; up = dtlab::double_tree_parent(n, tree, up)) ++d;
      h = std::max(h, d);
    }
  return h;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Whole nodes of G ranks, more than one: the hierarchical all-reduce's own schedule; else it rings.
bool hierarchical_runs(int n, int G) { return G > 1 && G < n && n % G == 0; }

int expected_steps(Algorithm algo, int n, int G) {
  switch (algo) {
    case Algorithm::Tree: return 2 * ceil_log2(n);
    case Algorithm::DoubleTree: return 2 * (K + double_tree_height(n) - 1);
    case Algorithm::Hierarchical: return hierarchical_runs(n, G) ? 2 * (G - 1) + 2 * (n / G - 1) : 2 * (n - 1);
    case Algorithm::InNetwork: return K + 1;
    default: return 2 * (n - 1);
  }
}

// True when plan.cpp steps `algo` itself (the new algorithms arrive with their own branch: until
// then the plan falls back to the ring's count or the binomial tree's transfers).
bool plan_steps(Algorithm algo, int n, int G) {
  const int count = dtlab::algorithm_step_count(CollectiveOp::AllReduce, algo, n, G);
  if (count != expected_steps(algo, n, G)) return false;
  const auto first = dtlab::algorithm_step_plan(CollectiveOp::AllReduce, algo, n, 0, 0, G);
  if (algo == Algorithm::DoubleTree) return !first.empty() && first.front().chunk >= 0;
  if (algo == Algorithm::InNetwork)
    return std::any_of(first.begin(), first.end(), [](const auto& t) { return t.dst == dtlab::kNetworkSwitch; });
  if (algo == Algorithm::Hierarchical) return first.size() == size_t(n);  // every rank sends in a ring step
  return true;
}

// The bytes each transfer of a step moves, as the stepped algorithms charge them.
double step_bytes(const CostModel& m, Algorithm algo, double S, const Pairs& pairs) {
  const int n = m.world_size(), G = m.profile().gpus_per_node;
  switch (algo) {
    case Algorithm::Tree:
    case Algorithm::Naive: return S;
    case Algorithm::DoubleTree: return S / (2.0 * K);
    case Algorithm::InNetwork: return S / K;
    case Algorithm::Hierarchical: {
      if (!hierarchical_runs(n, G)) return S / n;
      const bool crosses = std::any_of(pairs.begin(), pairs.end(),
                                       [&](const auto& t) { return m.node_of(t.first) != m.node_of(t.second); });
      return crosses ? S / (double(G) * (n / G)) : S / G;
    }
    default: return S / n;
  }
}

double plan_time(const CostModel& m, Algorithm algo, double S) {
  const int n = m.world_size(), G = m.profile().gpus_per_node;
  double total = 0;
  for (int s = 0; s < dtlab::algorithm_step_count(CollectiveOp::AllReduce, algo, n, G); ++s) {
    const auto plan = dtlab::algorithm_step_plan(CollectiveOp::AllReduce, algo, n, 0, s, G);
    Pairs pairs;
    for (const auto& t : plan) pairs.emplace_back(t.src, t.dst);
    total += m.step_time(pairs, step_bytes(m, algo, S, pairs), !plan.empty() && plan.front().reduce);
  }
  return total;
}

}  // namespace

TEST_SUITE("topology") {

TEST_CASE("profiles in display order, with their topologies") {
  std::vector<std::string> names;
  for (const auto& p : dtlab::builtin_profiles()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"nvlink8", "pcie8", "ib2x4", "eth2x4", "dgx-h100", "dgx-h100x2",
                                          "dgx-h100x4", "pcie-box"});
  names.push_back("this");
  names.push_back("ideal");
  CHECK(dtlab::profile_names() == names);
  CHECK_THROWS_WITH_AS(dtlab::find_profile("dgx"),
                       "hardware profile 'dgx' is not known; use one of nvlink8, pcie8, ib2x4, eth2x4, dgx-h100, "
                       "dgx-h100x2, dgx-h100x4, pcie-box, this, ideal",
                       dtlab::Error);

  // The older profiles: one rail per GPU, so their flat figures stand; none reduces in the switch.
  for (const char* name : {"nvlink8", "pcie8", "ib2x4", "eth2x4"}) {
    const HardwareProfile p = dtlab::find_profile(name);
    CAPTURE(name);
    CHECK(p.rails == p.gpus_per_node);
    CHECK(!p.switch_reduces);
  }
  CHECK(dtlab::find_profile("pcie8").intra_fabric == Fabric::PCIe);
  CHECK(dtlab::find_profile("eth2x4").inter_fabric == Fabric::Ethernet);
  CHECK(dtlab::find_profile("ib2x4").intra_fabric == Fabric::NVLink);

  for (const auto& named : {std::pair{"dgx-h100", 1}, std::pair{"dgx-h100x2", 2}, std::pair{"dgx-h100x4", 4}}) {
    const char* name = named.first;  // not a structured binding: clang 14 cannot capture one in CAPTURE's lambda
    const int nodes = named.second;
    const HardwareProfile p = dtlab::find_profile(name);
    CAPTURE(name);
    CHECK(p.nodes == nodes);
    CHECK(p.gpus_per_node == 8);
    CHECK(p.rails == 8);
    CHECK(p.switch_reduces);
    CHECK(p.intra_fabric == Fabric::NVSwitch);
    CHECK(p.inter_fabric == Fabric::InfiniBand);
    CHECK(1 / p.intra.beta == doctest::Approx(370e9));  // 18 NVLinks x 20.6 GB/s
    CHECK(1 / p.inter.beta == doctest::Approx(50e9));   // NDR 400 Gb/s
    CHECK(p.inter.alpha > p.intra.alpha);
  }
  const HardwareProfile box = dtlab::find_profile("pcie-box");
  CHECK(box.intra_fabric == Fabric::PCIe);
  CHECK(box.inter_fabric == Fabric::Ethernet);
  CHECK(box.inter.beta > box.intra.beta);  // the NICs, not PCIe, bound a step that leaves the box
  CHECK(box.rails == 2);
  CHECK(!box.switch_reduces);
  CHECK(dtlab::find_profile("ideal").switch_reduces);
  CHECK(std::string(dtlab::fabric_name(Fabric::NVSwitch)) == "NVSwitch");
}

TEST_CASE("links a step crosses: ports inside a node, rails between nodes, the switch") {
  const HardwareProfile dgx = dtlab::find_profile("dgx-h100x2");
  const CostModel m(dgx, 16);
  const double B = 1 << 20;
  // 0 -> 1 inside node 0; 9 -> 2 from node 1's rail 1 into node 0's rail 2.
  const auto links = m.link_loads({{0, 1}, {9, 2}}, B);
  const std::vector<LinkLoad> want = {
      {LinkKind::PortOut, 0, 0, 1, dgx.intra.alpha + B * dgx.intra.beta},
      {LinkKind::PortIn, 0, 1, 1, dgx.intra.alpha + B * dgx.intra.beta},
      {LinkKind::RailOut, 1, 1, 1, dgx.inter.alpha + B * dgx.inter.beta},
      {LinkKind::RailIn, 0, 2, 1, dgx.inter.alpha + B * dgx.inter.beta},
  };
  CHECK(links == want);
  CHECK(std::string(dtlab::link_kind_name(LinkKind::RailOut)) == "NIC out");

  // To and from the switch across nodes: the rank's port and rail, and the network switch.
  const auto sharp = m.link_loads({{3, dtlab::kNetworkSwitch}, {dtlab::kNetworkSwitch, 11}}, B);
  REQUIRE(sharp.size() == 5);
  CHECK(sharp[0].kind == LinkKind::PortOut);
  CHECK(sharp[1].kind == LinkKind::PortIn);
  CHECK(sharp[1].index == 11);
  CHECK(sharp[2].kind == LinkKind::RailOut);
  CHECK(sharp[3].kind == LinkKind::RailIn);
  CHECK(sharp[3].node == 1);
  CHECK(sharp[3].index == 3);
  CHECK(sharp[4] == LinkLoad{LinkKind::Switch, -1, 0, 2, dgx.inter.alpha});
  // Inside one node (world 8) NVLS uses the ports and node 0's NVSwitch only.
  const auto nvls = CostModel(dgx, 8).link_loads({{3, dtlab::kNetworkSwitch}, {dtlab::kNetworkSwitch, 3}}, B);
  REQUIRE(nvls.size() == 3);
  CHECK(nvls[2] == LinkLoad{LinkKind::Switch, 0, 0, 2, dgx.intra.alpha});

  const auto outside = doctest::Contains("step_time got a rank outside the world; check the algorithm's peer arithmetic");
  CHECK_THROWS_WITH(m.step_time({{0, 16}}, B, false), outside);
  CHECK_THROWS_WITH(m.step_time({{dtlab::kNetworkSwitch, dtlab::kNetworkSwitch}}, B, false), outside);
}

TEST_CASE("contention: transfers sharing a link divide its bandwidth") {
  const HardwareProfile box = dtlab::find_profile("pcie-box");  // 2 NICs for 8 GPUs
  const CostModel m(box, 16);
  const double B = 1 << 20;
  // Local GPUs 0 and 2 both use rail 0 (g % 2): twice the bytes time on one NIC, each way.
  CHECK(m.step_time({{0, 8}}, B, false) == box.inter.alpha + B * box.inter.beta);
  CHECK(m.step_time({{0, 8}, {2, 10}}, B, false) == box.inter.alpha + 2 * B * box.inter.beta);
  CHECK(m.step_time({{0, 8}, {1, 9}}, B, false) == box.inter.alpha + B * box.inter.beta);  // rails 0 and 1
  // Two sends from one GPU share its port; the reduce adds gamma once.
  CHECK(m.step_time({{0, 1}, {0, 2}}, B, true) == box.intra.alpha + 2 * B * box.intra.beta + B * box.gamma);

  // A ring across two DGX nodes, rails = 8: every link carries one transfer, the rails bound the step.
  const HardwareProfile dgx = dtlab::find_profile("dgx-h100x2");
  const CostModel two(dgx, 16);
  Pairs ring;
  for (int r = 0; r < 16; ++r) ring.emplace_back(r, (r + 1) % 16);
  for (const LinkLoad& l : two.link_loads(ring, B)) CHECK(l.load == 1);
  CHECK(two.step_time(ring, B, false) == dgx.inter.alpha + B * dgx.inter.beta);
  // The same ring on the PCIe boxes: 7 -> 8 and 15 -> 0 use different directions: no contention either.
  CHECK(m.step_time(ring, B, false) == box.inter.alpha + B * box.inter.beta);
  // The binomial tree's cross step (r -> r + 8 for r < 8) queues 4 transfers on each of the 2 NICs.
  Pairs cross;
  for (int r = 0; r < 8; ++r) cross.emplace_back(r, r + 8);
  CHECK(m.step_time(cross, B, false) == box.inter.alpha + 4 * B * box.inter.beta);
  CHECK(two.step_time(cross, B, false) == dgx.inter.alpha + B * dgx.inter.beta);

  // What the switch sends back is reduced already: no gamma for in-network steps.
  const CostModel one(dgx, 8);
  CHECK(one.step_time({{0, dtlab::kNetworkSwitch}, {dtlab::kNetworkSwitch, 0}}, B, true) ==
        dgx.intra.alpha + B * dgx.intra.beta);
}

TEST_CASE("NCCL's double binary tree") {
  // ncclGetBtree's picture for 14 ranks: 0 - 8; 8 - 4, 12; 4 - 2, 6; 12 - 10, 13; 2 - 1, 3; ...
  const int want14[] = {-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 12};
  for (int r = 0; r < 14; ++r) CHECK(dtlab::double_tree_parent(14, 0, r) == want14[r]);
  // Even n: tree 1 mirrors tree 0 (root n - 1); odd n: it shifts tree 0 by one rank (root 1).
  for (int r = 0; r < 12; ++r) {
    const int up = dtlab::double_tree_parent(12, 0, 11 - r);
    CHECK(dtlab::double_tree_parent(12, 1, r) == (up < 0 ? -1 : 11 - up));
  }
  CHECK(dtlab::double_tree_parent(12, 1, 11) == -1);
  CHECK(dtlab::double_tree_parent(13, 1, 1) == -1);
  CHECK(dtlab::double_tree_parent(13, 1, 9) == 1);  // tree 0's 8 -> 0, shifted
  CHECK(double_tree_height(8) == 3);
  CHECK(double_tree_height(14) == 4);
}

TEST_CASE("closed forms of the new all-reduces, by hand") {
  const double a = 2e-6, b = 1e-10, g = 1e-11, S = 8.0 * 3 * 5 * 7 * 1024;
  const double c = S / (2 * K);  // a double-tree chunk
  // Two ranks: each tree is one edge, used once each way per step: 2K steps at load 1.
  check_close(CostModel(uniform_profile(64, a, b, g), 2).collective_time(CollectiveOp::AllReduce, Algorithm::DoubleTree, S),
              2 * K * a + 2 * K * c * b + K * c * g);
  // Four ranks (tree 0: 1, 3 -> 2 -> 0; tree 1 mirrored: 2, 0 -> 1 -> 3; height 2): 5 reduce steps,
  // the first four with two transfers on a port, and 5 broadcast steps, the last four so.
  check_close(CostModel(uniform_profile(64, a, b, g), 4).collective_time(CollectiveOp::AllReduce, Algorithm::DoubleTree, S),
              4 * (a + 2 * c * b + c * g) + (a + c * b + c * g) + (a + c * b) + 4 * (a + 2 * c * b));

  check_close(dtlab::in_network_allreduce_time(8, S, a, b), (K + 1) * (a + S / K * b));
  check_close(CostModel(uniform_profile(64, a, b, g), 8).collective_time(CollectiveOp::AllReduce, Algorithm::InNetwork, S),
              dtlab::in_network_allreduce_time(8, S, a, b));
  // SHARP across DGX nodes: a chunk crosses the port and the rail, the rail (NDR) bounds it.
  const HardwareProfile dgx = dtlab::find_profile("dgx-h100x2");
  check_close(CostModel(dgx, 16).collective_time(CollectiveOp::AllReduce, Algorithm::InNetwork, S),
              dtlab::in_network_allreduce_time(16, S, dgx.inter.alpha, dgx.inter.beta));

  // Hierarchical: 8 rails for the 8 inter-node rings on DGX; the PCIe boxes' 2 NICs carry 4 each.
  check_close(CostModel(dgx, 16).collective_time(CollectiveOp::AllReduce, Algorithm::Hierarchical, S),
              dtlab::hierarchical_allreduce_time(8, 2, S, dgx.intra, dgx.inter, 1, dgx.gamma));
  const HardwareProfile box = dtlab::find_profile("pcie-box");
  check_close(CostModel(box, 32).collective_time(CollectiveOp::AllReduce, Algorithm::Hierarchical, S),
              dtlab::hierarchical_allreduce_time(8, 4, S, box.intra, box.inter, 4, box.gamma));
  check_close(dtlab::hierarchical_allreduce_time(4, 2, S, Link{a, b}, Link{a, b}, 1, g),
              3 * (2 * a + 2 * S / 4 * b + S / 4 * g) + (2 * a + 2 * S / 8 * b + S / 8 * g));
  // One node: the hierarchical all-reduce is the ring.
  const CostModel nv(dtlab::find_profile("nvlink8"), 8);
  CHECK(nv.collective_time(CollectiveOp::AllReduce, Algorithm::Hierarchical, S) ==
        nv.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, S));
  // Inter-node traffic: hierarchical sends 2(N-1)/N of a node's shard per rank over the rails, the
  // flat ring 2(n-1)/n of the whole buffer through its slowest hop: hierarchical wins big buffers.
  const double big = 1 << 30;
  const CostModel four(dtlab::find_profile("dgx-h100x4"), 32);
  CHECK(four.collective_time(CollectiveOp::AllReduce, Algorithm::Hierarchical, big) <
        four.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, big));
  // SHARP sends each rank's buffer up once and gets it back once: S per direction, not the ring's
  // 2(n-1)/n S (though every rank's whole buffer crosses its rail, unlike hierarchical's shard).
  CHECK(four.collective_time(CollectiveOp::AllReduce, Algorithm::InNetwork, big) <
        four.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, big));
}

TEST_CASE("per-step charges of every algorithm's plan sum to collective_time") {
  const double S = 3.0 * 5 * 7 * 16 * 1024, a = 4e-6, b = 1.0 / 50e9, g = 1.0 / 1e12;
  struct Setup {
    HardwareProfile profile;
    int world;
    bool flat;  // one kind of link: the tree's and naive's closed forms (slowest link per round) are exact
  };
  std::vector<Setup> setups;
  for (int n : {2, 3, 4, 5, 7, 8, 13, 16}) setups.push_back({uniform_profile(64, a, b, g), n, true});
  setups.push_back({uniform_profile(4, a, b, g), 8, true});
  setups.push_back({uniform_profile(4, a, b, g), 12, true});
  setups.push_back({dtlab::find_profile("ib2x4"), 8, false});
  setups.push_back({dtlab::find_profile("eth2x4"), 8, false});
  setups.push_back({dtlab::find_profile("dgx-h100"), 8, false});
  setups.push_back({dtlab::find_profile("dgx-h100x2"), 16, false});
  setups.push_back({dtlab::find_profile("pcie-box"), 16, false});
  int compared = 0, skipped = 0;
  for (const Setup& s : setups) {
    const CostModel m(s.profile, s.world);
    for (Algorithm algo : dtlab::kAlgorithms) {
      CAPTURE(s.profile.name);
      CAPTURE(s.world);
      CAPTURE(dtlab::algorithm_name(algo));
      if ((algo == Algorithm::Tree || algo == Algorithm::Naive) && !s.flat) continue;
      if (!dtlab::collective_traits(CollectiveOp::AllReduce).runs(algo)) continue;  // (all-to-all's)
      if (!plan_steps(algo, s.world, s.profile.gpus_per_node)) {
        ++skipped;
        continue;
      }
      ++compared;
      check_close(plan_time(m, algo, S), m.collective_time(CollectiveOp::AllReduce, algo, S));
    }
  }
  MESSAGE(compared << " plans compared with collective_time, " << skipped
                   << " skipped (plan.cpp does not step that algorithm yet)");
  CHECK(compared >= 30);
}

}  // TEST_SUITE
