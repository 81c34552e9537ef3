// The cost model: closed forms against hand-computed numbers, the per-step charges the algorithms
// will make summing to those closed forms, link hierarchy, profile lookup and the measured profile.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "engine/core/check.h"
#include "engine/trace/cost_model.h"
#include "tests/test_util.h"

using dtlab::Algorithm;
using dtlab::CollectiveOp;
using dtlab::CostModel;
using dtlab::HardwareProfile;
using dtlab::Link;
using Pairs = std::vector<std::pair<int, int>>;

namespace {

// One node, every link the same: the case where per-step sums must equal the closed forms.
HardwareProfile uniform_profile(double a, double b, double g) {
  HardwareProfile p;
  p.name = "uniform";
  p.nodes = 1;
  p.gpus_per_node = 64;
  p.intra = p.inter = Link{a, b};
  p.gamma = g;
  p.flops_per_s = 1e12;
  return p;
}

Pairs ring_pairs(int p) {
  Pairs pairs;
  for (int r = 0; r < p; ++r) pairs.emplace_back(r, (r + 1) % p);
  return pairs;
}

// Binomial broadcast from rank 0: in round k, every rank r < 2^k that has the data sends to r + 2^k.
std::vector<Pairs> binomial_rounds(int p) {
  std::vector<Pairs> rounds;
  for (int reach = 1; reach < p; reach *= 2) {
    Pairs pairs;
    for (int r = 0; r < reach && r + reach < p; ++r) pairs.emplace_back(r, r + reach);
    rounds.push_back(pairs);
  }
  return rounds;
}

void check_close(double got, double want) {
  CHECK(std::abs(got - want) <= 1e-12 * std::abs(want));
}

}  // namespace

TEST_SUITE("cost_model") {

TEST_CASE("closed forms match hand-computed numbers") {
  struct Case {
    const char* name;
    int p;
    double n, a, b, g;
    double allgather, reduce_scatter, allreduce, broadcast, reduce, tree, naive;  // by hand
  };
  const Case cases[] = {
      {"p=4, n=1000, a=1us, b=1ns/B, g=0.1ns/B", 4, 1000, 1e-6, 1e-9, 1e-10,  //
       3e-6 + 7.5e-7, 3e-6 + 8.25e-7, 6e-6 + 1.5e-6 + 7.5e-8, 2 * (1e-6 + 1e-6), 2 * (1e-6 + 1e-6 + 1e-7), 4.2e-6 + 4e-6,
       3 * 2.1e-6 + 3 * 2e-6},
      // ceil(lg 5) = 3 rounds for the binomial trees
      {"p=5 (not a power of two), n=1e6, a=2us, b=0.1ns/B, g=0.01ns/B", 5, 1e6, 2e-6, 1e-10, 1e-11,  //
       8e-6 + 8e-5, 8e-6 + 8.8e-5, 16e-6 + 1.6e-4 + 8e-6, 3 * (2e-6 + 1e-4), 3 * (2e-6 + 1e-4 + 1e-5), 3.36e-4 + 3.06e-4,
       4 * 1.12e-4 + 4 * 1.02e-4},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    check_close(dtlab::ring_allgather_time(c.p, c.n, c.a, c.b), c.allgather);
    check_close(dtlab::ring_reduce_scatter_time(c.p, c.n, c.a, c.b, c.g), c.reduce_scatter);
    check_close(dtlab::ring_allreduce_time(c.p, c.n, c.a, c.b, c.g), c.allreduce);
    check_close(dtlab::binomial_broadcast_time(c.p, c.n, c.a, c.b), c.broadcast);
    check_close(dtlab::binomial_reduce_time(c.p, c.n, c.a, c.b, c.g), c.reduce);
    check_close(dtlab::tree_allreduce_time(c.p, c.n, c.a, c.b, c.g), c.tree);
    check_close(dtlab::naive_allreduce_time(c.p, c.n, c.a, c.b, c.g), c.naive);
  }
}

TEST_CASE("one rank costs nothing") {
  const double n = 1e6, a = 1e-6, b = 1e-9, g = 1e-10;
  CHECK(dtlab::ring_allgather_time(1, n, a, b) == 0);
  CHECK(dtlab::ring_reduce_scatter_time(1, n, a, b, g) == 0);
  CHECK(dtlab::ring_allreduce_time(1, n, a, b, g) == 0);
  CHECK(dtlab::binomial_broadcast_time(1, n, a, b) == 0);
  CHECK(dtlab::binomial_reduce_time(1, n, a, b, g) == 0);
  CHECK(dtlab::tree_allreduce_time(1, n, a, b, g) == 0);
  CHECK(dtlab::naive_allreduce_time(1, n, a, b, g) == 0);
  CostModel m(dtlab::find_profile("nvlink8"), 1);
  for (CollectiveOp op : {CollectiveOp::AllReduce, CollectiveOp::ReduceScatter,
                          CollectiveOp::AllGather, CollectiveOp::Broadcast, CollectiveOp::Reduce,
                          CollectiveOp::Barrier, CollectiveOp::AllToAll})
    for (Algorithm algo : {Algorithm::Default, Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
      CHECK(m.collective_time(op, algo, n) == 0);
  CHECK(m.step_time({}, n, true) == 0);
}

TEST_CASE("per-step charges sum to the closed forms on uniform links") {
  const double n = 3 * 5 * 7 * 8 * 1024.0, a = 4e-6, b = 1.0 / 50e9, g = 1.0 / 1e12;
  for (int p : {2, 3, 4, 5, 8}) {
    CAPTURE(p);
    CostModel m(uniform_profile(a, b, g), p);
    const Pairs ring = ring_pairs(p);
    const double chunk = n / p;

    double reduce_scatter = 0, all_gather = 0;
    for (int step = 0; step < p - 1; ++step) reduce_scatter += m.step_time(ring, chunk, true);
    for (int step = 0; step < p - 1; ++step) all_gather += m.step_time(ring, chunk, false);
    check_close(reduce_scatter, dtlab::ring_reduce_scatter_time(p, n, a, b, g));
    check_close(all_gather, dtlab::ring_allgather_time(p, n, a, b));
    check_close(reduce_scatter + all_gather, dtlab::ring_allreduce_time(p, n, a, b, g));
    check_close(reduce_scatter + all_gather,
                m.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, n));
    check_close(reduce_scatter, m.collective_time(CollectiveOp::ReduceScatter, Algorithm::Ring, n));
    check_close(all_gather, m.collective_time(CollectiveOp::AllGather, Algorithm::Ring, n));

    double broadcast = 0, reduce = 0;
    for (const Pairs& round : binomial_rounds(p)) {
      broadcast += m.step_time(round, n, false);
      reduce += m.step_time(round, n, true);  // the same pairs reversed, receiver reduces
    }
    check_close(broadcast, dtlab::binomial_broadcast_time(p, n, a, b));
    check_close(reduce, dtlab::binomial_reduce_time(p, n, a, b, g));
    check_close(broadcast, m.collective_time(CollectiveOp::Broadcast, Algorithm::Tree, n));
    check_close(reduce + broadcast, m.collective_time(CollectiveOp::AllReduce, Algorithm::Tree, n));
  }
}

TEST_CASE("ring steps on a two-level machine sum to the closed form on the ring's slowest link") {
  CostModel m(dtlab::find_profile("ib2x4"), 8);
  const double n = 64.0 * 1024 * 1024;
  double total = 0;
  for (int step = 0; step < 7; ++step) total += m.step_time(ring_pairs(8), n / 8, true);
  for (int step = 0; step < 7; ++step) total += m.step_time(ring_pairs(8), n / 8, false);
  check_close(total, m.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, n));
}

TEST_CASE("link hierarchy") {
  const HardwareProfile ib = dtlab::find_profile("ib2x4");
  CostModel m(ib, 8);
  CHECK(m.node_of(3) == 0);
  CHECK(m.node_of(4) == 1);
  CHECK(m.ring_link().beta == ib.inter.beta);
  CHECK(m.ring_link().alpha == ib.inter.alpha);
  CHECK(m.link(0, 3).beta == ib.intra.beta);
  CHECK(m.link(3, 4).beta == ib.inter.beta);
  CHECK(m.link(4, 3).alpha == ib.inter.alpha);
  CHECK(ib.inter.beta > ib.intra.beta);

  // Four ranks of ib2x4 fit in one node: only NVLink is used.
  CHECK(CostModel(ib, 4).ring_link().beta == ib.intra.beta);

  const HardwareProfile nv = dtlab::find_profile("nvlink8");
  CostModel all_intra(nv, 8);
  for (int src = 0; src < 8; ++src)
    for (int dst = 0; dst < 8; ++dst) CHECK(all_intra.node_of(src) == all_intra.node_of(dst));
  CHECK(all_intra.ring_link().beta == nv.intra.beta);

  // A step is as slow as its slowest transfer.
  const double bytes = 1e6;
  CHECK(m.step_time({{0, 1}, {3, 4}}, bytes, false) == doctest::Approx(ib.inter.alpha + bytes * ib.inter.beta));
  CHECK(m.step_time({{0, 1}}, bytes, true) ==
        doctest::Approx(ib.intra.alpha + bytes * ib.intra.beta + bytes * ib.gamma));
}

TEST_CASE("slower networks give slower all-reduce") {
  const double S = 64.0 * 1024 * 1024;
  auto ring_allreduce = [&](const char* name) {
    return CostModel(dtlab::find_profile(name), 8)
        .collective_time(CollectiveOp::AllReduce, Algorithm::Ring, S);
  };
  const double eth = ring_allreduce("eth2x4"), ib = ring_allreduce("ib2x4"),
               nv = ring_allreduce("nvlink8");
  CHECK(eth > ib);
  CHECK(ib > nv);
  CHECK(ring_allreduce("pcie8") > nv);
}

TEST_CASE("default algorithms and the other collectives") {
  const HardwareProfile nv = dtlab::find_profile("nvlink8");
  CostModel m(nv, 8);
  const double S = 1 << 20, a = nv.intra.alpha, b = nv.intra.beta, g = nv.gamma;
  CHECK(m.collective_time(CollectiveOp::AllReduce, Algorithm::Default, S) ==
        m.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, S));
  CHECK(m.collective_time(CollectiveOp::AllGather, Algorithm::Default, S) ==
        m.collective_time(CollectiveOp::AllGather, Algorithm::Ring, S));
  CHECK(m.collective_time(CollectiveOp::Broadcast, Algorithm::Default, S) ==
        m.collective_time(CollectiveOp::Broadcast, Algorithm::Tree, S));
  CHECK(m.collective_time(CollectiveOp::Reduce, Algorithm::Default, S) ==
        m.collective_time(CollectiveOp::Reduce, Algorithm::Tree, S));
  check_close(m.collective_time(CollectiveOp::AllReduce, Algorithm::Naive, S),
              dtlab::naive_allreduce_time(8, S, a, b, g));
  check_close(m.collective_time(CollectiveOp::Broadcast, Algorithm::Naive, S), 7 * (a + S * b));
  check_close(m.collective_time(CollectiveOp::Reduce, Algorithm::Naive, S), 7 * (a + S * b + S * g));
  check_close(m.collective_time(CollectiveOp::AllToAll, Algorithm::Default, S), 7 * (a + S / 8 * b));
  check_close(m.collective_time(CollectiveOp::Barrier, Algorithm::Default, S), 14 * a);
  check_close(m.collective_time(CollectiveOp::Send, Algorithm::Default, S), a + S * b);
  // Tree beats ring for tiny messages (latency), ring beats tree for large ones (bandwidth).
  CHECK(m.collective_time(CollectiveOp::AllReduce, Algorithm::Tree, 8) <
        m.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, 8));
  CHECK(m.collective_time(CollectiveOp::AllReduce, Algorithm::Ring, 64 * S) <
        m.collective_time(CollectiveOp::AllReduce, Algorithm::Tree, 64 * S));
  // Across nodes, the tree and the naive hub both pay the inter-node link.
  const HardwareProfile eth = dtlab::find_profile("eth2x4");
  CostModel two_nodes(eth, 8);
  check_close(two_nodes.collective_time(CollectiveOp::AllReduce, Algorithm::Tree, S),
              dtlab::tree_allreduce_time(8, S, eth.inter.alpha, eth.inter.beta, eth.gamma));
  check_close(two_nodes.collective_time(CollectiveOp::AllReduce, Algorithm::Naive, S),
              dtlab::naive_allreduce_time(8, S, eth.inter.alpha, eth.inter.beta, eth.gamma));
  CHECK(m.compute_time(2e12) == doctest::Approx(2e12 / nv.flops_per_s));
}

TEST_CASE("profiles") {
  const auto& profiles = dtlab::builtin_profiles();
  REQUIRE(profiles.size() >= 4);  // the topology profiles follow (tests/test_topology.cpp)
  CHECK(profiles[0].name == "nvlink8");
  CHECK(profiles[1].name == "pcie8");
  CHECK(profiles[2].name == "ib2x4");
  CHECK(profiles[3].name == "eth2x4");
  for (const auto& p : profiles) {
    CAPTURE(p.name);
    CHECK(!p.description.empty());
    CHECK(p.nodes * p.gpus_per_node >= 8);
    CHECK(p.gamma == doctest::Approx(1e-12).epsilon(0.15));  // HBM2e to HBM3
    CHECK(p.flops_per_s > 0);
    CHECK(dtlab::find_profile(p.name).description == p.description);
  }
  CHECK(dtlab::find_profile("ib2x4").inter.beta == doctest::Approx(1.0 / 25e9));

  CHECK_THROWS_WITH_AS(dtlab::find_profile("tpu"),
                       "hardware profile 'tpu' is not known; use one of nvlink8, pcie8, ib2x4, "
                       "eth2x4, dgx-h100, dgx-h100x2, dgx-h100x4, pcie-box, this, ideal",
                       dtlab::Error);
  const HardwareProfile ideal = dtlab::find_profile("ideal");
  CHECK(ideal.intra.alpha == 0);
  CHECK(ideal.inter.beta == 0);
  CHECK(ideal.gamma == 0);
  CHECK(ideal.flops_per_s > 0);
}

TEST_CASE("this machine's figures are measured once per machine and cached with their date") {
  dtlab::test::TempDir dir("dtlab_this_profile");
  const std::string dirs = dir.path.string(), file = dirs + "/this-profile.json";
  // No cache yet: measured, and written with the machine and the date.
  const HardwareProfile first = dtlab::load_or_measure_this_profile(dirs);
  REQUIRE(std::filesystem::exists(file));
  nlohmann::json j = nlohmann::json::parse(std::ifstream(file));
  CHECK(j.at("format") == "dtlab this-profile 2");
  CHECK(!j.at("machine").get<std::string>().empty());
  CHECK(j.at("measured").get<std::string>() == first.measured);
  CHECK(first.measured.size() == std::string("2026-11-29 17:05 UTC").size());
  CHECK(first.description.find("(measured " + first.measured + ")") != std::string::npos);
  CHECK(j.at("flops_per_s").get<double>() == first.flops_per_s);
  // The CPU roofline's ceiling: one BLAS thread's sgemm, cached beside the rest.
  CHECK(j.at("sgemm_1thread_flops_per_s").get<double>() == first.sgemm_flops_per_thread);
  CHECK(first.sgemm_flops_per_thread > 0);
  // A second launch reads the file: the planted figures come back exactly, not a new measurement.
  j["flops_per_s"] = 1.5e9;
  j["sgemm_1thread_flops_per_s"] = 0.75e9;
  j["alpha_s"] = 7.25e-6;
  j["measured"] = "2020-01-02 03:04 UTC";
  std::ofstream(file) << j.dump();
  const HardwareProfile cached = dtlab::load_or_measure_this_profile(dirs);
  CHECK(cached.flops_per_s == 1.5e9);
  CHECK(cached.sgemm_flops_per_thread == 0.75e9);
  CHECK(cached.intra.alpha == 7.25e-6);
  CHECK(cached.inter.alpha == 7.25e-6);
  CHECK(cached.gamma == first.gamma);
  CHECK(cached.measured == "2020-01-02 03:04 UTC");
  CHECK(cached.description.find("7.2 us (measured 2020-01-02 03:04 UTC)") != std::string::npos);
  // Asked to measure again: the planted figures are replaced.
  CHECK(dtlab::load_or_measure_this_profile(dirs, true).flops_per_s != 1.5e9);
  // Another machine's file, a damaged one or a non-positive figure: measured again and rewritten.
  for (const std::string& bad : {std::string("machine"), std::string("truncated"), std::string("zero")}) {
    CAPTURE(bad);
    nlohmann::json k = nlohmann::json::parse(std::ifstream(file));
    k["flops_per_s"] = 1.5e9;
    if (bad == "machine") k["machine"] = "a CPU we do not have, 999 threads";
    if (bad == "zero") k["alpha_s"] = 0.0;
    std::string text = k.dump();
    if (bad == "truncated") text.resize(text.size() / 2);
    std::ofstream(file) << text;
    CHECK(dtlab::load_or_measure_this_profile(dirs).flops_per_s != 1.5e9);
    CHECK(nlohmann::json::parse(std::ifstream(file)).at("machine") == j.at("machine"));
  }
  // No cache directory at all: measured every time, nothing written.
  CHECK(dtlab::load_or_measure_this_profile("").flops_per_s > 0);
}

TEST_CASE("this machine is measured to positive finite figures") {
  const HardwareProfile& p = dtlab::this_machine_profile();
  CHECK(&p == &dtlab::this_machine_profile());  // measured once, cached
  CHECK(p.name == "this");
  CHECK(dtlab::find_profile("this").name == "this");
  CHECK(p.nodes == 1);
  CHECK(p.gpus_per_node == 64);
  for (double x : {p.intra.alpha, p.intra.beta, p.inter.alpha, p.inter.beta, p.gamma, p.flops_per_s}) {
    CHECK(x > 0);
    CHECK(std::isfinite(x));
  }
  CHECK(!p.description.empty());
  MESSAGE(p.description << "; gamma " << p.gamma * 1e9 << " ns/B, " << p.flops_per_s / 1e9 << " GFLOP/s");
}

}  // TEST_SUITE
