// The collective table (engine/core/collective.h): one row per op, names that round-trip, nccl-tests'
// bus bandwidth factors, the algorithms check_algorithm accepts with its messages, element counts and
// payloads, and the CLI bench and the cost model reading the same factor and default algorithm.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/comm/queued_comm.h"
#include "engine/core/check.h"
#include "engine/core/collective.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/trace_import.h"
#include "tests/cli_util.h"

using dtlab::Algorithm;
using dtlab::CollectiveOp;
using dtlab::collective_traits;

namespace {

const std::vector<CollectiveOp> kAllOps = {CollectiveOp::AllReduce, CollectiveOp::ReduceScatter, CollectiveOp::AllGather,
                                           CollectiveOp::Broadcast, CollectiveOp::Reduce,        CollectiveOp::Barrier,
                                           CollectiveOp::Send,      CollectiveOp::Recv,          CollectiveOp::AllToAll};
const std::vector<Algorithm> kAllAlgorithms = {Algorithm::Default, Algorithm::Ring, Algorithm::Tree, Algorithm::Naive,
                                               Algorithm::Pairwise, Algorithm::Grouped};

}  // namespace

TEST_SUITE("collective_table") {
  TEST_CASE("every op has its row, in enum order, and names that round-trip") {
    REQUIRE(dtlab::collective_table().size() == kAllOps.size());
    std::set<std::string> names, display, short_names;
    for (CollectiveOp op : kAllOps) {
      const dtlab::CollectiveTraits& t = collective_traits(op);
      CAPTURE(t.name);
      CHECK(t.op == op);
      CHECK(&t == &dtlab::collective_table()[static_cast<size_t>(op)]);
      CHECK(std::string(dtlab::collective_name(op)) == t.name);
      REQUIRE(dtlab::find_collective(t.name).has_value());
      CHECK(*dtlab::find_collective(t.name) == op);
      names.insert(t.name);
      display.insert(t.display_name);
      short_names.insert(t.short_name);
      CHECK(std::string(t.nccl_call).rfind("nccl", 0) == 0);
      CHECK(std::string(t.explanation).size() > 20);
    }
    CHECK(names.size() == kAllOps.size());
    CHECK(display.size() == kAllOps.size());
    CHECK(short_names.size() == kAllOps.size());
    // The spellings the traces, the prose and the bench use.
    CHECK(std::string(collective_traits(CollectiveOp::ReduceScatter).name) == "reduce_scatter");
    CHECK(std::string(collective_traits(CollectiveOp::ReduceScatter).display_name) == "reduce-scatter");
    CHECK(std::string(collective_traits(CollectiveOp::ReduceScatter).short_name) == "reducescatter");
    CHECK(std::string(collective_traits(CollectiveOp::AllToAll).name) == "all_to_all");
    CHECK_FALSE(dtlab::find_collective("gather").has_value());
    // A value outside the enum (a corrupt message) reads as "?", not as a crash.
    const auto outside = static_cast<CollectiveOp>(200);
    CHECK(std::string(dtlab::collective_name(outside)) == "?");
    CHECK(dtlab::bus_bandwidth_factor(outside, 4) == 1.0);
    CHECK_NOTHROW(dtlab::check_algorithm(outside, Algorithm::Tree));
  }

  TEST_CASE("bus bandwidth factors are nccl-tests' closed forms at n = 1, 2, 4, 8") {
    for (int n : {1, 2, 4, 8}) {
      CAPTURE(n);
      const double ring_share = static_cast<double>(n - 1) / n;
      for (CollectiveOp op : kAllOps) {
        const dtlab::CollectiveTraits& t = collective_traits(op);
        CAPTURE(t.name);
        const std::string formula = t.busbw_formula();
        double want = 1.0;
        if (op == CollectiveOp::AllReduce) {
          want = 2 * ring_share;
          CHECK(formula == "2(n-1)/n");
        } else if (op == CollectiveOp::ReduceScatter || op == CollectiveOp::AllGather || op == CollectiveOp::AllToAll) {
          want = ring_share;
          CHECK(formula == "(n-1)/n");
        } else {
          CHECK(formula == "1");
        }
        CHECK(dtlab::bus_bandwidth_factor(op, n) == want);
        CHECK(t.busbw_factor(n) == want);
      }
    }
    CHECK(dtlab::bus_bandwidth_factor(CollectiveOp::AllReduce, 8) == 1.75);
    CHECK(dtlab::bus_bandwidth_factor(CollectiveOp::AllGather, 4) == 0.75);
    // The trace importer's factor, by c10d name, is the table's (1 with one rank, as nccl-tests has it).
    CHECK(dtlab::busbw_factor("allreduce", 4) == 1.5);
    CHECK(dtlab::busbw_factor("reduce_scatter", 8) == 0.875);
    CHECK(dtlab::busbw_factor("alltoall", 4) == 0.75);
    CHECK(dtlab::busbw_factor("broadcast", 4) == 1.0);
    CHECK(dtlab::busbw_factor("allreduce", 1) == 1.0);
  }

  TEST_CASE("check_algorithm accepts exactly the allowed pairs, with the messages users see") {
    using A = Algorithm;
    // What each op runs besides Default (written out here, not read from the table).
    auto allowed = [](CollectiveOp op, A a) {
      if (a == A::Default) return true;
      switch (op) {
        case CollectiveOp::ReduceScatter:
        case CollectiveOp::AllGather: return a == A::Ring;
        case CollectiveOp::Broadcast:
        case CollectiveOp::Reduce: return a == A::Tree || a == A::Naive;
        case CollectiveOp::AllReduce: return a == A::Ring || a == A::Tree || a == A::Naive;
        case CollectiveOp::AllToAll: return a == A::Pairwise || a == A::Grouped;
        default: return true;  // the others have one schedule and ignore the choice
      }
    };
    for (CollectiveOp op : kAllOps)
      for (A a : kAllAlgorithms) {
        CAPTURE(dtlab::collective_name(op));
        CAPTURE(dtlab::algorithm_name(a));
        if (allowed(op, a)) CHECK_NOTHROW(dtlab::check_algorithm(op, a));
        else CHECK_THROWS_AS(dtlab::check_algorithm(op, a), dtlab::Error);
      }
    CHECK_THROWS_WITH(dtlab::check_algorithm(CollectiveOp::ReduceScatter, A::Tree),
                      "reduce_scatter does not run the tree algorithm; use ring");
    CHECK_THROWS_WITH(dtlab::check_algorithm(CollectiveOp::AllGather, A::Naive),
                      "allgather does not run the naive algorithm; use ring");
    CHECK_THROWS_WITH(dtlab::check_algorithm(CollectiveOp::Broadcast, A::Ring),
                      "broadcast does not run the ring algorithm; use tree or naive");
    CHECK_THROWS_WITH(dtlab::check_algorithm(CollectiveOp::Reduce, A::Ring),
                      "reduce does not run the ring algorithm; use tree or naive");
    CHECK(dtlab::algorithm_choices(collective_traits(CollectiveOp::AllReduce)) == "ring, tree, naive, dbtree, hierarchical or nvls");
    CHECK_THROWS_WITH(dtlab::check_algorithm(CollectiveOp::AllToAll, A::Ring),
                      "all_to_all does not run the ring algorithm; use pairwise or grouped");
    // Defaults: tree for broadcast and reduce, pairwise for all-to-all, ring for the rest; the
    // communicator's the same.
    for (CollectiveOp op : kAllOps) {
      const bool rooted = op == CollectiveOp::Broadcast || op == CollectiveOp::Reduce;
      CHECK(collective_traits(op).default_algorithm == (rooted ? A::Tree : op == CollectiveOp::AllToAll ? A::Pairwise : A::Ring));
      CHECK(collective_traits(op).has_root == rooted);
    }
    const dtlab::AlgorithmDefaults defaults;
    CHECK(defaults.allreduce == A::Ring);
    CHECK(defaults.broadcast == A::Tree);
    CHECK(defaults.reduce == A::Tree);
  }

  TEST_CASE("element counts and payload bytes per op, as the communicator records them") {
    struct Row {
      CollectiveOp op;
      int64_t in, out, payload;  // for count 5 on 4 ranks
    };
    const std::vector<Row> rows = {
        {CollectiveOp::AllReduce, 5, 5, 5},    {CollectiveOp::ReduceScatter, 20, 5, 20}, {CollectiveOp::AllGather, 5, 20, 20},
        {CollectiveOp::Broadcast, 5, 5, 5},    {CollectiveOp::Reduce, 5, 5, 5},          {CollectiveOp::Barrier, 5, 5, 0},
        {CollectiveOp::Send, 5, 5, 5},         {CollectiveOp::Recv, 5, 5, 5},            {CollectiveOp::AllToAll, 20, 20, 20},
    };
    for (const Row& r : rows) {
      const dtlab::CollectiveTraits& t = collective_traits(r.op);
      CAPTURE(t.name);
      CHECK(t.in_count(5, 4) == r.in);
      CHECK(t.out_count(5, 4) == r.out);
      CHECK(t.payload_count(5, 4) == r.payload);
      dtlab::CollDesc d;
      d.op = r.op;
      d.count = 5;
      d.dtype = dtlab::DType::F32;
      CHECK(dtlab::payload_bytes(d, 4) == r.payload * 4);
      d.dtype = dtlab::DType::I64;
      CHECK(dtlab::payload_bytes(d, 4) == r.payload * 8);
      // Out of place exactly where the input and output differ in length.
      CHECK(t.out_of_place == (r.in != r.out || r.op == CollectiveOp::AllToAll));
      const bool reduces = r.op == CollectiveOp::AllReduce || r.op == CollectiveOp::ReduceScatter || r.op == CollectiveOp::Reduce;
      CHECK(t.reduces == reduces);
    }
  }

  TEST_CASE("the bench and the cost model read the table's factor, formula and default algorithm") {
    for (CollectiveOp op : {CollectiveOp::AllReduce, CollectiveOp::ReduceScatter, CollectiveOp::AllGather, CollectiveOp::Broadcast}) {
      const dtlab::CollectiveTraits& t = collective_traits(op);
      CAPTURE(t.name);
      const int n = 4;
      dtlab::test::CliResult text = dtlab::test::run_cli({"bench", "collectives", "--op", t.short_name, "--world", "4",
                                                          "--min-bytes", "4096", "--max-bytes", "4096", "--iters", "1"});
      REQUIRE(text.code == 0);
      CHECK(text.out.find(std::string("# busbw = algbw * ") + t.busbw_formula() + " (nccl-tests)") != std::string::npos);
      CHECK(text.out.find(std::string(", ") + dtlab::algorithm_name(t.default_algorithm) + ", world 4") != std::string::npos);

      dtlab::test::CliResult js = dtlab::test::run_cli({"bench", "collectives", "--op", t.short_name, "--world", "4",
                                                        "--min-bytes", "4096", "--max-bytes", "8192", "--iters", "1",
                                                        "--profile", "nvlink8", "--json"});
      REQUIRE(js.code == 0);
      const nlohmann::json j = nlohmann::json::parse(js.out);
      CHECK(j["wrong"] == 0);
      const dtlab::CostModel model(dtlab::find_profile("nvlink8"), n);
      for (const nlohmann::json& row : j["rows"]) {
        const double algbw = row["algbw"], busbw = row["busbw"], size = row["size"], model_us = row["model_us"];
        CHECK(busbw == doctest::Approx(algbw * dtlab::bus_bandwidth_factor(op, n)));
        CHECK(model_us == doctest::Approx(model.collective_time(op, Algorithm::Default, size) * 1e6));
        CHECK(model_us == doctest::Approx(model.collective_time(op, t.default_algorithm, size) * 1e6));
      }
    }
  }
}
