// The tuning model (engine/trace/tuning.h): ring's modeled busbw reaches the link's bandwidth, the
// double binary tree wins small all-reduces across nodes and loses large ones, forced choices are
// honoured, the explanation names both sides, and the names --algo and --proto take.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/comm/plan.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/check.h"
#include "engine/trace/export.h"
#include "engine/trace/tuning.h"
#include "engine/train/config_json.h"
#include "engine/train/train.h"
#include "tests/cli_util.h"

using namespace dtlab;

namespace {

// The profiles a two-node check runs on: ib2x4, and the DGX-H100 pair where the build has it.
std::vector<HardwareProfile> two_node_profiles() {
  std::vector<HardwareProfile> out = {find_profile("ib2x4")};
  for (const HardwareProfile& p : builtin_profiles())
    if (p.name == "dgx-h100x2") out.push_back(p);
  return out;
}

int world_of(const HardwareProfile& p) { return p.gpus_per_node * p.nodes; }

// The fastest protocol of one algorithm.
Prediction best_of(const HardwareProfile& p, Algorithm a, double bytes) {
  return select(p, world_of(p), CollectiveOp::AllReduce, bytes, a);
}

}  // namespace

TEST_CASE("tuning: ring's modeled busbw on nvlink8 equals the link bandwidth within 1% at 1 GiB") {
  const HardwareProfile p = find_profile("nvlink8");
  const Prediction r = predict(p, 8, CollectiveOp::AllReduce, Algorithm::Ring, Protocol::Simple, double(1 << 30));
  const double link = 1.0 / p.intra.beta;
  CHECK(r.busbw == doctest::Approx(link).epsilon(0.01));
  CHECK(r.busbw < link);  // the latency is still there
  CHECK(r.peak_busbw == doctest::Approx(link));
  // Ring/simple's latency is NCCL's base (8.4 us) plus 2(n-1) hops of the profile's alpha.
  CHECK(r.latency_s == doctest::Approx(8.4e-6 + 14 * p.intra.alpha));
}

TEST_CASE("tuning: the protocols' wire efficiency sets their peak bandwidth") {
  const HardwareProfile p = find_profile("nvlink8");
  auto peak = [&](Protocol proto) {
    return predict(p, 8, CollectiveOp::AllReduce, Algorithm::Ring, proto, 1 << 20).peak_busbw;
  };
  CHECK(peak(Protocol::LL) == doctest::Approx(peak(Protocol::Simple) / 2));
  CHECK(peak(Protocol::LL128) == doctest::Approx(peak(Protocol::Simple) * 120 / 128));
  // ... and LL's latency is the lowest: it wins the smallest messages.
  CHECK(select(p, 8, CollectiveOp::AllReduce, 8, Algorithm::Ring).proto == Protocol::LL);
  CHECK(select(p, 8, CollectiveOp::AllReduce, double(1 << 30), Algorithm::Ring).proto == Protocol::Simple);
}

TEST_CASE("tuning: on two nodes dbtree beats ring below the crossover and loses above it") {
  for (const HardwareProfile& p : two_node_profiles()) {
    CAPTURE(p.name);
    const int n = world_of(p);
    // Per protocol, tree (fewer network hops, NCCL's 0.92 x 1/2 bandwidth) against ring (2 x nodes
    // network hops, n / 2(n-1)): at most one crossover each, tree ahead below it and behind above it.
    double first = 1e30, last = 0;
    for (Protocol proto : kProtocols) {
      CAPTURE(protocol_name(proto));
      double crossover = 0;
      for (double s = 8; s <= double(1 << 30); s *= 2) {
        const double tree = predict(p, n, CollectiveOp::AllReduce, Algorithm::DoubleTree, proto, s).seconds;
        const double ring = predict(p, n, CollectiveOp::AllReduce, Algorithm::Ring, proto, s).seconds;
        if (crossover == 0 && tree >= ring) crossover = s;
        if (crossover > 0) CHECK(tree >= ring);  // no way back
      }
      if (crossover == 8) continue;  // tree/simple: NCCL's 256 KiB-chunk hop latency, behind from the start
      first = std::min(first, crossover);
      last = std::max(last, crossover);
    }
    // At each algorithm's best protocol: tree below every protocol's crossover, ring above all.
    for (double s = 8; s < first; s *= 2)
      CHECK(best_of(p, Algorithm::DoubleTree, s).seconds < best_of(p, Algorithm::Ring, s).seconds);
    for (double s = last; s <= double(1 << 30); s *= 2)
      CHECK(best_of(p, Algorithm::DoubleTree, s).seconds > best_of(p, Algorithm::Ring, s).seconds);
    REQUIRE(first < 1e30);
    CHECK(first > 8);
    CHECK(last < double(1 << 30));
  }
}

TEST_CASE("tuning: availability follows the profile") {
  const HardwareProfile nv = find_profile("nvlink8");
  std::vector<Prediction> all = predict_all(nv, 8, CollectiveOp::AllReduce, 4096);
  CHECK(all.size() == 6 * std::size(kProtocols));  // the all-reduce's six algorithms
  for (const Prediction& p : all) {
    CAPTURE(algorithm_name(p.algo));
    if (p.algo == Algorithm::InNetwork) CHECK(p.why_not == "nvls needs a switch that reduces (NVLink SHARP or SHARP), and profile nvlink8 has none");
    else if (p.algo == Algorithm::Hierarchical) CHECK(p.why_not == "hierarchical needs ranks on more than one node; 8 ranks fit in one node of nvlink8");
    else CHECK(p.available);
  }
  HardwareProfile pcie = nv;
  pcie.name = "pcie-box";
  pcie.intra_fabric = Fabric::PCIe;
  const Prediction ll128 = predict(pcie, 8, CollectiveOp::AllReduce, Algorithm::Ring, Protocol::LL128, 4096);
  CHECK_FALSE(ll128.available);
  CHECK(ll128.why_not == "NCCL enables LL128 by default only where GPUs talk over NVLink, and pcie-box's talk over PCIe");
  HardwareProfile sharp = nv;
  sharp.switch_reduces = true;
  CHECK(predict(sharp, 8, CollectiveOp::AllReduce, Algorithm::InNetwork, Protocol::Simple, 4096).available);
  CHECK_FALSE(predict(sharp, 8, CollectiveOp::AllReduce, Algorithm::InNetwork, Protocol::LL, 4096).available);
  // Only the table's algorithms: reduce-scatter rings, broadcast trees or goes naive.
  CHECK(predict_all(nv, 8, CollectiveOp::ReduceScatter, 4096).size() == std::size(kProtocols));
  for (const Prediction& p : predict_all(nv, 8, CollectiveOp::Broadcast, 4096))
    CHECK((p.algo == Algorithm::Tree || p.algo == Algorithm::Naive));
}

// --algo auto once picked hierarchical for a world of partial nodes, which the run then refused.
TEST_CASE("tuning: auto never picks what the world cannot run (hierarchical on partial nodes)") {
  const HardwareProfile ib = find_profile("ib2x4");
  const Prediction h = predict(ib, 6, CollectiveOp::AllReduce, Algorithm::Hierarchical, Protocol::Simple, 1 << 26);
  CHECK_FALSE(h.available);
  CHECK(h.why_not == "hierarchical needs whole nodes, and 6 ranks are not a multiple of ib2x4's 4 GPUs per node");
  for (double bytes : {1e3, 1e6, 1e8, 1e9}) {
    const Prediction pick = select(ib, 6, CollectiveOp::AllReduce, bytes);
    CHECK_NOTHROW(check_algorithm_topology(pick.algo, 6, ib));
    CHECK(pick.algo != Algorithm::Hierarchical);
  }
  CHECK(predict(ib, 8, CollectiveOp::AllReduce, Algorithm::Hierarchical, Protocol::Simple, 1 << 26).available);
  test::CliResult r = test::run_cli({"train", "--strategy", "ddp", "--world", "6", "--algo", "auto", "--profile", "ib2x4", "--steps", "1",
                                     "--model", "mlp:2,1024,1024,3"});
  CHECK_MESSAGE(r.code == 0, r.err);
}

TEST_CASE("tuning: select honours forced algorithms and protocols") {
  const HardwareProfile p = find_profile("ib2x4");
  const Prediction a = select(p, 8, CollectiveOp::AllReduce, 1 << 16, Algorithm::Naive);
  CHECK(a.algo == Algorithm::Naive);
  const Prediction b = select(p, 8, CollectiveOp::AllReduce, 1 << 16, Algorithm::Default, Protocol::Simple);
  CHECK(b.proto == Protocol::Simple);
  const Prediction c = select(p, 8, CollectiveOp::AllReduce, 1 << 16, Algorithm::Ring, Protocol::LL128);
  CHECK((c.algo == Algorithm::Ring && c.proto == Protocol::LL128));
  // Forced beats default enablement (NCCL_PROTO=LL128 on PCIe), as NCCL's overrides do.
  HardwareProfile pcie = p;
  pcie.intra_fabric = Fabric::PCIe;
  CHECK(select(pcie, 8, CollectiveOp::AllReduce, 1 << 16, Algorithm::Ring, Protocol::LL128).proto == Protocol::LL128);
  // Unforced, the pick is the fastest available pair.
  const Prediction best = select(p, 8, CollectiveOp::AllReduce, 1 << 16);
  for (const Prediction& q : predict_all(p, 8, CollectiveOp::AllReduce, 1 << 16))
    if (q.available) CHECK(best.seconds <= q.seconds);
  // An op without a choice keeps its schedule and picks a protocol.
  CHECK(select(p, 8, CollectiveOp::AllToAll, 1 << 16, Algorithm::Naive).algo == Algorithm::Naive);
  CHECK_THROWS_WITH(check_forced_choice(p, CollectiveOp::AllReduce, Algorithm::InNetwork, Protocol::Default),
                    "--algo nvls needs a profile whose switch reduces (NVLink SHARP or SHARP), and ib2x4 has none; pick such a "
                    "--profile or another algorithm");
  HardwareProfile sharp = p;
  sharp.switch_reduces = true;
  CHECK_NOTHROW(check_forced_choice(sharp, CollectiveOp::AllReduce, Algorithm::InNetwork, Protocol::Simple));
  CHECK_THROWS_WITH(check_forced_choice(sharp, CollectiveOp::AllReduce, Algorithm::InNetwork, Protocol::LL),
                    "--algo nvls runs the simple protocol only (as NCCL's NVLS), not ll; use --proto simple or auto");
}

TEST_CASE("tuning: explain names the pick, the runner-up, the size, the world and the bound") {
  const HardwareProfile p = find_profile("ib2x4");
  const std::string small = explain(p, 8, CollectiveOp::AllReduce, 64 * 1024);
  const Prediction pick = select(p, 8, CollectiveOp::AllReduce, 64 * 1024);
  CHECK(small.rfind(std::string(algorithm_name(pick.algo)) + "/" + protocol_name(pick.proto) + ": ", 0) == 0);
  CHECK(small.find(" vs ") != std::string::npos);
  CHECK(small.find(" at 64 KiB on 8 ranks over 2 nodes: latency-bound") != std::string::npos);
  CHECK(explain(p, 8, CollectiveOp::AllReduce, double(1 << 30)).find("bandwidth-bound") != std::string::npos);
  const std::string forced = explain(p, 8, CollectiveOp::AllReduce, 8, Algorithm::Naive, Protocol::Simple);
  CHECK(forced.rfind("naive/simple (the run's choice): ", 0) == 0);
  CHECK(forced.find("; the tuner would pick ") != std::string::npos);
  CHECK(explain(p, 1, CollectiveOp::AllReduce, 8) == "one rank: nothing to communicate, so nothing to choose");
}

TEST_CASE("tuning: --algo and --proto names") {
  CHECK(parse_algorithm_choice("auto") == Algorithm::Default);
  CHECK(parse_algorithm_choice("dbtree") == Algorithm::DoubleTree);
  CHECK(algorithm_choice_name(Algorithm::Default) == "auto");
  CHECK_THROWS_WITH(parse_algorithm_choice("rign"),
                    "--algo rign is not an algorithm; use auto, ring, tree, naive, dbtree, hierarchical or nvls");
  CHECK_THROWS_WITH(parse_algorithm_choice("grouped"),
                    "--algo grouped is not an all-reduce algorithm; use auto, ring, tree, naive, dbtree, hierarchical or nvls");
  CHECK(parse_algorithm_choice("grouped", CollectiveOp::AllToAll) == Algorithm::Grouped);
  CHECK_THROWS_WITH(parse_algorithm_choice("ring", CollectiveOp::AllToAll), "--algo ring is not an all-to-all algorithm; use auto, pairwise or grouped");
  CHECK(parse_protocol_choice("ll128") == Protocol::LL128);
  CHECK(parse_protocol_choice("auto") == Protocol::Default);
  CHECK(protocol_choice_name(Protocol::Default) == "auto");
  CHECK(parse_protocol_choice("LL128") == Protocol::LL128);  // NCCL_PROTO's spelling
  CHECK_THROWS_WITH(parse_protocol_choice("ll64"), "--proto ll64 is not a protocol; use auto, simple, ll or ll128");
  CHECK(format_bytes(8) == "8 B");
  CHECK(format_bytes(64 * 1024) == "64 KiB");
  CHECK(format_bytes(double(1 << 30)) == "1 GiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
}

TEST_CASE("tuning: --algo auto and --proto reach the communicator, its events and its trace") {
  WorldOptions opt;
  opt.profile = "ib2x4";
  opt.allreduce_algo = Algorithm::Default;  // auto
  ThreadsWorld w(8, opt);
  const HardwareProfile p = find_profile("ib2x4");
  const int64_t small = 4, large = 1 << 20;  // floats
  w.run([&](int, Communicator& c, RankContext&) {
    std::vector<float> a(static_cast<size_t>(small), 1.0f), b(static_cast<size_t>(large), 1.0f);
    c.all_reduce(a.data(), small, DType::F32, ReduceOp::Sum)->wait();
    c.all_reduce(b.data(), large, DType::F32, ReduceOp::Sum)->wait();
    CHECK(a[0] == 8.0f);
    CHECK(b[static_cast<size_t>(large - 1)] == 8.0f);
  });
  std::vector<Event> colls;
  for (const Event& e : w.recorder().events(0))
    if (e.kind == EventKind::Collective) colls.push_back(e);
  REQUIRE(colls.size() == 2);
  for (const Event& e : colls) {
    const Prediction want = select(p, 8, CollectiveOp::AllReduce, static_cast<double>(e.coll.bytes));
    CHECK(e.coll.algo == want.algo);
    CHECK(e.coll.proto == want.proto);
  }
  CHECK(colls[0].coll.algo != colls[1].coll.algo);  // tree at 16 B, hierarchical at 4 MiB on ib2x4
  // The Chrome trace names the protocol beside the algorithm.
  const std::string trace = chrome_trace_json(w.recorder().all_events());
  CHECK(trace.find(std::string("\"protocol\":\"") + protocol_name(colls[0].coll.proto) + "\"") != std::string::npos);

  // A forced protocol is every call's.
  opt.allreduce_algo = Algorithm::Ring;
  opt.protocol = Protocol::LL128;
  ThreadsWorld forced(4, opt);
  forced.run([&](int, Communicator& c, RankContext&) {
    std::vector<float> a(64, 1.0f);
    c.all_reduce(a.data(), 64, DType::F32, ReduceOp::Sum)->wait();
  });
  for (const Event& e : forced.recorder().events(0))
    if (e.kind == EventKind::Collective) CHECK((e.coll.algo == Algorithm::Ring && e.coll.proto == Protocol::LL128));
}

TEST_CASE("tuning: the run configuration keeps --algo and --proto (JSON, as dtlab-cli launch and the lab pass it)") {
  TrainConfig c;
  CHECK(c.algo == Algorithm::Ring);  // the lessons' pictures: ring unless asked
  c.algo = Algorithm::Default;
  c.proto = Protocol::LL128;
  const std::string j = train_config_to_json(c);
  CHECK(j.find("\"algo\":\"auto\"") != std::string::npos);
  CHECK(j.find("\"proto\":\"ll128\"") != std::string::npos);
  const TrainConfig back = train_config_from_json(j);
  CHECK(back.algo == Algorithm::Default);
  CHECK(back.proto == Protocol::LL128);
  CHECK_THROWS_WITH(train_config_from_json("{\"algo\": \"fastest\"}"),
                    "--algo fastest is not an algorithm; use auto, ring, tree, naive, dbtree, hierarchical or nvls");
}
