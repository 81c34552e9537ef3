// Trace recorder (ordering under concurrency, bounded window, per-iteration aggregates) and the
// Chrome Trace Event export, checked by parsing the JSON back. Events are built by hand here so
// these tests do not depend on the communicator or the training loop.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/check.h"
#include "engine/trace/event.h"
#include "engine/trace/export.h"
#include "engine/trace/recorder.h"
#include "tests/test_util.h"

using namespace dtlab;
using nlohmann::json;

namespace {

constexpr int64_t kMs = 1'000'000;  // ns

Event span(EventKind kind, int rank, int iteration, int64_t b_ns, int64_t e_ns, double mb = 0, double me = 0) {
  Event e;
  e.kind = kind;
  e.rank = rank;
  e.iteration = iteration;
  e.wall_begin_ns = b_ns;
  e.wall_end_ns = e_ns;
  e.model_begin = mb;
  e.model_end = me;
  return e;
}

Event compute(int rank, int it, ComputeKind k, int layer, int64_t b_ns, int64_t e_ns, double mb = 0, double me = 0) {
  Event e = span(EventKind::Compute, rank, it, b_ns, e_ns, mb, me);
  e.compute = ComputeInfo{k, static_cast<int16_t>(layer), 1e6, 0};
  return e;
}

Event collective(int rank, int it, CollectiveOp op, uint64_t seq, int64_t count, int64_t b_ns, int64_t e_ns,
                 DType dtype = DType::F32, int root = -1) {
  Event e = span(EventKind::Collective, rank, it, b_ns, e_ns);
  e.lane = Lane::Comm;
  e.coll = CollectiveInfo{op, Algorithm::Ring, ReduceOp::Sum, dtype, static_cast<int16_t>(root), 2, seq,
                          count, count, count * dtype_size(dtype), Protocol::Default, false, 0, 0};
  return e;
}

Event ring_step(int rank, int it, uint64_t seq, RingPhase phase, int step, int64_t bytes, int64_t b_ns, int64_t e_ns) {
  Event e = span(EventKind::RingStep, rank, it, b_ns, e_ns);
  e.lane = Lane::Comm;
  e.step = RingStepInfo{seq, phase, static_cast<int16_t>(step), 2, static_cast<int16_t>(step),
                        static_cast<int16_t>(1 - rank), static_cast<int16_t>(1 - rank), bytes, 0};
  return e;
}

Event memory(int rank, int it, EventKind kind, MemCategory c, int64_t bytes, int64_t current, int64_t total, int64_t t_ns) {
  Event e = span(kind, rank, it, t_ns, t_ns);
  e.mem = MemInfo{c, bytes, current, total};
  return e;
}

std::vector<json> of_phase(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& ev : trace["traceEvents"])
    if (ev["ph"] == ph) out.push_back(ev);
  return out;
}

// Two ranks, one iteration each: forward, an all-reduce issued then run as two ring steps (the
// first starting with the collective, so nesting order matters), memory traffic and a gate.
std::vector<Event> two_rank_trace() {
  std::vector<Event> ev;
  for (int r = 0; r < 2; ++r) {
    ev.push_back(compute(r, 0, ComputeKind::LayerForward, 0, 1 * kMs, 2 * kMs, 0.001, 0.002));
    ev.push_back(compute(r, 0, ComputeKind::LayerBackward, 2, 2 * kMs, 3 * kMs, 0.002, 0.003));
    Event issue = collective(r, 0, CollectiveOp::AllReduce, 7, 1000, 2 * kMs + kMs / 2, 2 * kMs + kMs / 2);
    issue.kind = EventKind::CollectiveIssue;
    issue.lane = Lane::Compute;
    ev.push_back(issue);
    ev.push_back(ring_step(r, 0, 7, RingPhase::ReduceScatter, 0, 2000, 3 * kMs, 5 * kMs));
    ev.push_back(ring_step(r, 0, 7, RingPhase::AllGather, 1, 2000, 5 * kMs, 7 * kMs));
    ev.push_back(collective(r, 0, CollectiveOp::AllReduce, 7, 1000, 3 * kMs, 7 * kMs));
    ev.push_back(memory(r, 0, EventKind::MemAlloc, MemCategory::Parameters, 400, 400, 400, kMs / 2));
    ev.push_back(memory(r, 0, EventKind::MemAlloc, MemCategory::Gradients, 400, 400, 800, 2 * kMs));
    ev.push_back(memory(r, 0, EventKind::MemFree, MemCategory::Gradients, 400, 0, 400, 8 * kMs));
    Event gate = span(EventKind::Gate, r, 0, 8 * kMs, 9 * kMs);
    gate.lane = Lane::Comm;
    ev.push_back(gate);
    ev.push_back(span(EventKind::Iteration, r, 0, 0, 10 * kMs));
  }
  for (size_t i = 0; i < ev.size(); ++i) ev[i].order = i;  // recording order, children before parents
  return ev;
}

}  // namespace

TEST_SUITE("trace") {
  TEST_CASE("names") {
    CHECK(std::string(compute_kind_name(ComputeKind::LossBackward)) == "loss_backward");
    CHECK(std::string(compute_kind_name(ComputeKind::OptimizerStep)) == "optimizer_step");
    CHECK(std::string(ring_phase_name(RingPhase::ReduceScatter)) == "reduce-scatter");
    CHECK(std::string(ring_phase_name(RingPhase::Gather)) == "gather");
    CHECK(std::string(collective_name(CollectiveOp::AllReduce)) == "allreduce");
    CHECK(std::string(collective_name(CollectiveOp::ReduceScatter)) == "reduce_scatter");
    CHECK(std::string(collective_name(CollectiveOp::AllGather)) == "allgather");
    CHECK(std::string(collective_name(CollectiveOp::AllToAll)) == "all_to_all");
    CHECK(std::string(algorithm_name(Algorithm::Tree)) == "tree");
    CHECK(std::string(reduce_op_name(ReduceOp::Avg)) == "avg");
    CHECK(parse_algorithm("ring") == Algorithm::Ring);
    CHECK(parse_algorithm("tree") == Algorithm::Tree);
    CHECK(parse_algorithm("naive") == Algorithm::Naive);
    CHECK(parse_algorithm("default") == Algorithm::Default);
    CHECK(parse_algorithm("grouped") == Algorithm::Grouped);
    CHECK_THROWS_WITH_AS(parse_algorithm("butterfly"),
                         "algorithm 'butterfly' is not known; use ring, tree, naive, dbtree, hierarchical, nvls, pairwise or grouped", dtlab::Error);
  }

  TEST_CASE("recorder: order is monotonic per rank and unique across 4 threads") {
    constexpr int kPerThread = 20000;
    TraceRecorder rec(2, kPerThread * 2);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)  // two threads per rank, like a compute thread and its comm worker
      threads.emplace_back([&rec, t] {
        for (int i = 0; i < kPerThread; ++i) {
          Event e = compute(t % 2, -1, ComputeKind::Other, -1, i, i + 1);
          rec.record(e);
        }
      });
    for (auto& th : threads) th.join();
    for (int r = 0; r < 2; ++r) {
      std::vector<Event> ev = rec.events(r);
      REQUIRE(ev.size() == size_t{2 * kPerThread});
      bool increasing = true;
      for (size_t i = 1; i < ev.size(); ++i) increasing &= ev[i - 1].order < ev[i].order;
      CHECK(increasing);
      CHECK(rec.dropped(r) == 0);
    }
    std::vector<Event> all = rec.all_events();
    REQUIRE(all.size() == size_t{4 * kPerThread});
    bool total = true;  // merged by order, and the orders are exactly 0..N-1: unique and gap-free
    for (size_t i = 0; i < all.size(); ++i) total &= all[i].order == i;
    CHECK(total);
  }

  TEST_CASE("recorder: the window keeps the last `capacity` events and counts the rest") {
    TraceRecorder rec(1, 8);
    for (int i = 0; i < 20; ++i) {
      Event e = compute(0, -1, ComputeKind::Other, -1, i, i + 1);
      rec.record(e);
      CHECK(e.order == uint64_t(i));  // record() stamps the caller's event too
    }
    std::vector<Event> ev = rec.events(0);
    REQUIRE(ev.size() == 8);
    for (int i = 0; i < 8; ++i) CHECK(ev[size_t(i)].wall_begin_ns == 12 + i);
    CHECK(rec.dropped(0) == 12);

    // Flat memory: a long run still holds `capacity` events and a bounded number of aggregates.
    for (int i = 0; i < 10000; ++i) {
      Event e = compute(0, i, ComputeKind::Other, -1, 0, 1);
      rec.record(e);
    }
    CHECK(rec.events(0).size() == 8);
    CHECK(rec.dropped(0) == 12 + 10000);
    std::vector<IterationAggregate> agg = rec.aggregates(0);
    REQUIRE(agg.size() == 4096);
    CHECK(agg.front().iteration == 10000 - 4096);
    CHECK(agg.back().iteration == 9999);

    uint64_t last = rec.events(0).back().order;
    rec.clear();
    CHECK(rec.events(0).empty());
    CHECK(rec.dropped(0) == 0);
    CHECK(rec.aggregates(0).empty());
    Event e = compute(0, -1, ComputeKind::Other, -1, 0, 1);
    rec.record(e);
    CHECK(e.order > last);  // order stays unique across clears
  }

  TEST_CASE("recorder: aggregates sum durations, bytes and peak memory per iteration") {
    TraceRecorder rec(2, 64);
    std::vector<Event> ev = {
        compute(0, 0, ComputeKind::LayerForward, 0, 0, 1 * kMs, 0.0, 0.5),
        compute(0, 0, ComputeKind::LayerBackward, 0, 1 * kMs, 3 * kMs, 0.5, 0.75),
        collective(0, 0, CollectiveOp::AllReduce, 0, 10, 3 * kMs, 6 * kMs),
        ring_step(0, 0, 0, RingPhase::ReduceScatter, 0, 100, 3 * kMs, 4 * kMs),
        ring_step(0, 0, 0, RingPhase::AllGather, 1, 200, 4 * kMs, 6 * kMs),
        memory(0, 0, EventKind::MemAlloc, MemCategory::Activations, 1000, 1000, 1000, 0),
        memory(0, 0, EventKind::MemAlloc, MemCategory::Gradients, 2000, 2000, 3000, 0),
        memory(0, 0, EventKind::MemFree, MemCategory::Activations, 1000, 0, 2000, 0),
        compute(0, 1, ComputeKind::LayerForward, 0, 0, 4 * kMs, 0.0, 0.25),
        compute(0, -1, ComputeKind::Other, -1, 0, 100 * kMs),  // outside any iteration: no aggregate
        compute(1, 0, ComputeKind::Loss, -1, 0, 5 * kMs),
    };
    for (Event& e : ev) rec.record(e);
    std::vector<IterationAggregate> a = rec.aggregates(0);
    REQUIRE(a.size() == 2);
    CHECK(a[0].iteration == 0);
    CHECK(a[0].events == 8);
    CHECK(a[0].compute_wall_s == doctest::Approx(0.003));
    CHECK(a[0].compute_model_s == doctest::Approx(0.75));
    CHECK(a[0].comm_wall_s == doctest::Approx(0.003));
    CHECK(a[0].collectives == 1);
    CHECK(a[0].comm_bytes == 300);
    CHECK(a[0].peak_memory == 3000);
    CHECK(a[1].iteration == 1);
    CHECK(a[1].events == 1);
    CHECK(a[1].compute_wall_s == doctest::Approx(0.004));
    CHECK(a[1].compute_model_s == doctest::Approx(0.25));
    CHECK(a[1].collectives == 0);
    std::vector<IterationAggregate> b = rec.aggregates(1);
    REQUIRE(b.size() == 1);
    CHECK(b[0].compute_wall_s == doctest::Approx(0.005));

    // A late event for an earlier iteration lands in its own aggregate, kept in iteration order.
    Event late = compute(0, 0, ComputeKind::OptimizerStep, -1, 0, 1 * kMs);
    rec.record(late);
    a = rec.aggregates(0);
    REQUIRE(a.size() == 2);
    CHECK(a[0].compute_wall_s == doctest::Approx(0.004));
  }

  TEST_CASE("recorder: a disabled recorder records nothing") {
    TraceRecorder rec(1, 4);
    rec.set_enabled(false);
    CHECK_FALSE(rec.enabled());
    Event e = compute(0, 0, ComputeKind::Other, -1, 0, 1);
    rec.record(e);
    CHECK(rec.events(0).empty());
    CHECK(rec.dropped(0) == 0);
    CHECK(rec.aggregates(0).empty());
    rec.set_enabled(true);
    rec.record(e);
    CHECK(rec.events(0).size() == 1);
    CHECK(rec.now_ns() >= 0);
  }

  TEST_CASE("export: collectives carry the PyTorch profiler args on the comm thread") {
    std::vector<Event> ev = two_rank_trace();
    ev.push_back(collective(1, 0, CollectiveOp::Broadcast, 8, 5, 11 * kMs, 12 * kMs, DType::I64, 0));
    json t = json::parse(chrome_trace_json(ev, {}));
    CHECK(t["displayTimeUnit"] == "ms");
    int seen = 0;
    for (const json& x : t["traceEvents"]) {
      if (x.value("cat", "") != "collective") continue;
      ++seen;
      CHECK(x["ph"] == "X");
      CHECK(x["tid"] == 1);
      const json& a = x["args"];
      for (const char* key : {"Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype"})
        CHECK_MESSAGE(a.contains(key), key);
      if (x["name"] == "allreduce") {
        CHECK(a["Collective name"] == "allreduce");
        CHECK(a["In msg nelems"] == 1000);
        CHECK(a["Out msg nelems"] == 1000);
        CHECK(a["Group size"] == 2);
        CHECK(a["dtype"] == "Float");
        CHECK(a["algorithm"] == "ring");
        CHECK(a["seq"] == 7);
        CHECK(a["bytes"] == 4000);
        CHECK_FALSE(a.contains("root"));
        CHECK(x["ts"].get<double>() == doctest::Approx(3000.0));
        CHECK(x["dur"].get<double>() == doctest::Approx(4000.0));
      } else {
        CHECK(x["name"] == "broadcast");
        CHECK(x["pid"] == 1);
        CHECK(a["dtype"] == "Long");
        CHECK(a["root"] == 0);
        CHECK(a["bytes"] == 40);
      }
    }
    CHECK(seen == 3);
    // An all_to_all_v: its split and the elements its own block keeps (they never leave the rank).
    Event a2a = collective(0, 1, CollectiveOp::AllToAll, 9, 96, 13 * kMs, 14 * kMs);
    a2a.coll.split_sizes = true;
    a2a.coll.kept_count = 40;
    const json one = json::parse(chrome_trace_json({a2a}, {}));
    int alltoalls = 0;
    for (const json& x : one["traceEvents"])
      if (x.value("cat", "") == "collective") {
        CHECK(x["args"]["split"] == "per pair");
        CHECK(x["args"]["kept nelems"] == 40);
        CHECK(x["args"]["In msg nelems"] == 96);
        alltoalls++;
      }
    CHECK(alltoalls == 1);
    std::set<int> pids;
    for (const json& x : t["traceEvents"])
      if (x.value("cat", "") == "collective" && x["name"] == "allreduce") pids.insert(x["pid"].get<int>());
    CHECK(pids == std::set<int>{0, 1});
  }

  TEST_CASE("export: ring steps nest inside their collective, parent written first") {
    json t = json::parse(chrome_trace_json(two_rank_trace(), {}));
    const json& all = t["traceEvents"];
    int steps = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const json& s = all[i];
      if (s.value("cat", "") != "ring_step") continue;
      ++steps;
      bool inside = false;
      for (size_t j = 0; j < i; ++j) {  // the enclosing collective must come earlier in the file
        const json& c = all[j];
        if (c.value("cat", "") != "collective" || c["pid"] != s["pid"] || c["tid"] != s["tid"]) continue;
        if (c["args"]["seq"] != s["args"]["seq"]) continue;
        double cts = c["ts"], cdur = c["dur"], sts = s["ts"], sdur = s["dur"];
        inside = cts <= sts && sts + sdur <= cts + cdur + 1e-6;
      }
      CHECK(inside);
      CHECK(s["ph"] == "X");
      for (const char* key : {"chunk", "src", "dst", "bytes", "phase"}) CHECK_MESSAGE(s["args"].contains(key), key);
    }
    CHECK(steps == 4);
    std::set<std::string> names;
    for (const json& x : all)
      if (x.value("cat", "") == "ring_step") names.insert(x["name"].get<std::string>());
    CHECK(names == std::set<std::string>{"reduce-scatter step 0", "all-gather step 1"});
  }

  TEST_CASE("export: names, lanes, instants and metadata") {
    json t = json::parse(chrome_trace_json(two_rank_trace(), {.clock = TraceClock::Wall, .title = "demo", .labels = {}}));
    CHECK(t["otherData"]["title"] == "demo");
    std::map<std::string, json> by_name;  // rank 0's events by name
    for (const json& x : t["traceEvents"])
      if (x["pid"] == 0 && x["ph"] != "M") by_name[x["name"].get<std::string>()] = x;
    for (const char* n : {"forward 0", "backward 2", "issue allreduce #7", "iteration 0", "paused"})
      REQUIRE_MESSAGE(by_name.count(n) == 1, n);
    CHECK(by_name["forward 0"]["tid"] == 0);
    CHECK(by_name["forward 0"]["cat"] == "compute");
    CHECK(by_name["forward 0"]["ts"].get<double>() == doctest::Approx(1000.0));
    CHECK(by_name["issue allreduce #7"]["ph"] == "i");
    CHECK(by_name["issue allreduce #7"]["tid"] == 0);
    CHECK(by_name["iteration 0"]["ph"] == "X");
    CHECK(by_name["iteration 0"]["tid"] == 0);
    CHECK(by_name["paused"]["tid"] == 1);  // the gate was on the comm lane

    std::vector<json> meta = of_phase(t, "M");
    for (int r = 0; r < 2; ++r) {
      int process = 0, sort = 0;
      std::set<std::string> threads;
      for (const json& m : meta) {
        if (m["pid"] != r) continue;
        if (m["name"] == "process_name" && m["args"]["name"] == "rank " + std::to_string(r)) ++process;
        if (m["name"] == "process_sort_index" && m["args"]["sort_index"] == r) ++sort;
        if (m["name"] == "thread_name") threads.insert(std::to_string(m["tid"].get<int>()) + m["args"]["name"].get<std::string>());
      }
      CHECK(process == 1);
      CHECK(sort == 1);
      CHECK(threads == std::set<std::string>{"0compute", "1comm"});
    }
  }

  TEST_CASE("export: memory counters carry one series per category") {
    json t = json::parse(chrome_trace_json(two_rank_trace(), {}));
    std::vector<json> counters;
    for (const json& c : of_phase(t, "C"))
      if (c["pid"] == 0) counters.push_back(c);
    REQUIRE(counters.size() == 3);
    for (const json& c : counters) {
      CHECK(c["name"] == "memory");
      CHECK(c["args"].size() == size_t(kNumMemCategories));
      for (int k = 0; k < kNumMemCategories; ++k)
        CHECK(c["args"].contains(std::string(mem_category_name(static_cast<MemCategory>(k)))));
    }
    // Written by time: params allocated, then grads allocated, then grads freed.
    auto cur = [&](size_t i, MemCategory k) { return counters[i]["args"][std::string(mem_category_name(k))].get<int64_t>(); };
    CHECK(cur(0, MemCategory::Parameters) == 400);
    CHECK(cur(0, MemCategory::Gradients) == 0);
    CHECK(cur(1, MemCategory::Parameters) == 400);
    CHECK(cur(1, MemCategory::Gradients) == 400);
    CHECK(cur(2, MemCategory::Parameters) == 400);
    CHECK(cur(2, MemCategory::Gradients) == 0);
    CHECK(cur(2, MemCategory::Activations) == 0);
  }

  TEST_CASE("export: the modeled clock uses model seconds") {
    json t = json::parse(chrome_trace_json(two_rank_trace(), {.clock = TraceClock::Modeled, .title = "", .labels = {}}));
    CHECK(t["otherData"]["clock"] == "modeled");
    int found = 0;
    for (const json& x : t["traceEvents"])
      if (x.value("name", "") == "backward 2") {
        ++found;
        CHECK(x["ts"].get<double>() == doctest::Approx(0.002 * 1e6));
        CHECK(x["dur"].get<double>() == doctest::Approx(0.001 * 1e6));
      }
    CHECK(found == 2);
  }

  TEST_CASE("export: the file is written atomically and equals the string form") {
    dtlab::test::TempDir dir("dtlab_trace");
    std::vector<Event> ev = two_rank_trace();
    std::string path = dir.file("trace.json");
    export_chrome_trace(path, ev, {.title = "t", .labels = {}});
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    CHECK(ss.str() == chrome_trace_json(ev, {.title = "t", .labels = {}}));
    CHECK(dir.listing() == std::set<std::string>{"trace.json"});  // no temp file left behind
    CHECK_THROWS_AS(export_chrome_trace(dir.path.string(), ev, {}), dtlab::Error);
    CHECK_THROWS_AS(export_chrome_trace(dir.file("missing/trace.json"), ev, {}), dtlab::Error);

    // A user-typed title with quotes and invalid UTF-8 still gives valid JSON.
    json odd = json::parse(chrome_trace_json(ev, {.title = "a \"b\" \xff", .labels = {}}));
    CHECK(odd["otherData"]["title"].get<std::string>().substr(0, 6) == "a \"b\" ");

    json empty = json::parse(chrome_trace_json({}, {}));
    CHECK(empty["traceEvents"].empty());
  }
}
