// The threads backend checked the nccl-tests way: every collective against a serial reference
// (#wrong must be 0; inputs are small integers, so float sums are exact), then what it records:
// ring bytes and NCCL's chunk order, traces matched across ranks with modeled times equal to the
// cost model's closed forms, the diagnoses of desyncs, hangs and injected faults, and the memory
// its scratch buffers charge. DTLAB_TEST_QUICK=1 (the sanitizer runs) drops the 4 MiB buffers.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/threads_backend.h"
#include "engine/trace/event.h"
#include "comm_util.h"
#include "test_util.h"

using namespace dtlab;
using namespace dtlab::test;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kBig = (int64_t{1} << 20) + 3;  // odd, so ring chunks differ in size
const std::vector<int> kWorlds = {1, 2, 3, 4, 5, 8};

WorldOptions options(double timeout_s = 20, bool record = false) {
  WorldOptions o;
  o.timeout_s = timeout_s;
  o.record = record;
  o.trace_capacity = record ? size_t{1} << 14 : 16;
  return o;
}

// Element counts per call: 1, n-1, 1000 and (outside quick mode) `big`.
std::vector<int64_t> counts(int n, int64_t big) {
  std::vector<int64_t> v = {1};
  if (n > 2) v.push_back(n - 1);
  v.push_back(1000);
  if (!quick()) v.push_back(big);
  return v;
}

std::vector<int> roots(int n) { return n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1}; }

std::string label(const char* what, const char* algo, const char* op, int n, int64_t count, int root = -1) {
  return std::string(what) + " " + algo + " " + op + " world " + std::to_string(n) + " count " +
         std::to_string(count) + (root >= 0 ? " root " + std::to_string(root) : "");
}

std::vector<Event> of_kind(const std::vector<Event>& events, EventKind kind) {
  std::vector<Event> out;
  std::copy_if(events.begin(), events.end(), std::back_inserter(out), [&](const Event& e) { return e.kind == kind; });
  return out;
}

int64_t chunk_elems(int64_t count, int n, int c) { return count * (c + 1) / n - count * c / n; }

// Runs fn expecting it to fail with a CommError; returns the message and how long run() took.
std::pair<std::string, double> run_expecting_comm_error(
    ThreadsWorld& w, const std::function<void(int, Communicator&, RankContext&)>& fn) {
  auto t0 = Clock::now();
  std::string msg = "(no error)";
  try {
    w.run(fn);
  } catch (const CommError& e) {
    msg = e.what();
  } catch (const Error& e) {
    msg = std::string("(not a CommError) ") + e.what();
  }
  return {msg, seconds_since(t0)};
}

}  // namespace

TEST_SUITE("comm") {

TEST_CASE("all_reduce matches the serial reference: ring, tree, naive x sum, avg, max") {
  for (int n : kWorlds) {
    ThreadsWorld w(n, options());
    for (int64_t count : counts(n, kBig))
      for (Algorithm algo : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
          if (count == kBig && algo != Algorithm::Ring && op != ReduceOp::Sum) continue;  // time
          if (algo == Algorithm::Naive && op == ReduceOp::Avg) continue;  // its own test below
          CHECK_MESSAGE(allreduce_wrong(w, count, op, algo) == 0,
                        label("allreduce", algorithm_name(algo), reduce_op_name(op), n, count));
        }
  }
}

// Regression: naive all-reduce once let ranks copy rank 0's buffer before it had divided by n
// (no barrier after finish_avg); counts below n showed the undivided sum.
TEST_CASE("all_reduce naive avg matches the serial reference") {
  for (int n : kWorlds) {
    ThreadsWorld w(n, options());
    for (int64_t count : counts(n, 4096))
      CHECK_MESSAGE(allreduce_wrong(w, count, ReduceOp::Avg, Algorithm::Naive) == 0,
                    label("allreduce", "naive", "avg", n, count));
  }
}

TEST_CASE("reduce_scatter, all_gather (also in place, as NCCL allows) and all_to_all match the reference") {
  for (int n : kWorlds) {
    ThreadsWorld w(n, options());
    // Per-rank blocks; the large case keeps the whole buffer near kBig elements.
    for (int64_t count : counts(n, kBig / n + 1)) {
      const size_t total = static_cast<size_t>(count * n);
      for (bool in_place : {false, true}) {
        const char* how = in_place ? "ring in place" : "ring";
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
          int64_t bad = run_counting(w, [&](int r, Communicator& c) {  // in place: out is block r of in
            std::vector<float> in = inputs(r, count * n), separate(static_cast<size_t>(count), -1.0f);
            float* out = in_place ? in.data() + r * count : separate.data();
            c.reduce_scatter(out, in.data(), count, DType::F32, op)->wait();
            return count_wrong(out, count, [&](int64_t i) { return reference(op, n, r * count + i); }, op);
          });
          CHECK_MESSAGE(bad == 0, label("reduce_scatter", how, reduce_op_name(op), n, count));
        }
        int64_t bad = run_counting(w, [&](int r, Communicator& c) {  // in place: in is block r of out
          std::vector<float> in = inputs(r, count), out(total, -1.0f);
          if (in_place) std::copy(in.begin(), in.end(), out.begin() + r * count);
          c.all_gather(out.data(), in_place ? out.data() + r * count : in.data(), count, DType::F32)->wait();
          return count_wrong(out.data(), count * n, [&](int64_t j) { return value(int(j / count), j % count); });
        });
        CHECK_MESSAGE(bad == 0, label("all_gather", how, "-", n, count));
      }
      int64_t bad = run_counting(w, [&](int r, Communicator& c) {  // block j of rank i -> block i of rank j
        std::vector<float> in = inputs(r, count * n), out(total, -1.0f);
        c.all_to_all(out.data(), in.data(), count, DType::F32)->wait();
        return count_wrong(out.data(), count * n, [&](int64_t j) { return value(int(j / count), r * count + j % count); });
      });
      CHECK_MESSAGE(bad == 0, label("all_to_all", "naive", "-", n, count));
    }
  }
}

TEST_CASE("broadcast and reduce match the serial reference for roots 0 and n-1") {
  for (int n : kWorlds) {
    ThreadsWorld w(n, options());
    for (int64_t count : counts(n, kBig))
      for (Algorithm algo : {Algorithm::Tree, Algorithm::Naive})
        for (int root : roots(n)) {
          int64_t bad = run_counting(w, [&](int r, Communicator& c) {
            std::vector<float> buf = inputs(r, count);
            c.broadcast(buf.data(), count, DType::F32, root, algo)->wait();
            return count_wrong(buf.data(), count, [&](int64_t i) { return value(root, i); });
          });
          CHECK_MESSAGE(bad == 0, label("broadcast", algorithm_name(algo), "-", n, count, root));
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
            if (count == kBig && op != ReduceOp::Sum) continue;  // time
            bad = run_counting(w, [&](int r, Communicator& c) {
              std::vector<float> buf = inputs(r, count);
              c.reduce(buf.data(), count, DType::F32, op, root, algo)->wait();
              if (r == root) return count_wrong(buf.data(), count, [&](int64_t i) { return reference(op, n, i); }, op);
              return count_wrong(buf.data(), count, [&](int64_t i) { return value(r, i); });  // unchanged
            });
            CHECK_MESSAGE(bad == 0, label("reduce", algorithm_name(algo), reduce_op_name(op), n, count, root));
          }
        }
  }
}

TEST_CASE("count 0: every collective completes and moves nothing") {
  for (int n : {1, 3, 4}) {
    ThreadsWorld w(n, options());
    int64_t bad = run_counting(w, [&](int r, Communicator& c) {
      float a = 7, b = 8;
      for (Algorithm algo : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive}) c.all_reduce(&a, 0, DType::F32, ReduceOp::Sum, algo)->wait();
      c.reduce_scatter(&a, &b, 0, DType::F32, ReduceOp::Sum)->wait();
      c.all_gather(&a, &b, 0, DType::F32)->wait();
      c.broadcast(&a, 0, DType::F32, 0)->wait();
      c.reduce(&a, 0, DType::F32, ReduceOp::Sum, n - 1)->wait();
      c.all_to_all(&a, &b, 0, DType::F32)->wait();
      return int64_t{a != 7} + int64_t{b != 8};
    });
    CHECK_MESSAGE(bad == 0, "world " << n);
  }
}

TEST_CASE("barrier: no rank leaves before every rank has arrived") {
  for (int n : kWorlds) {
    ThreadsWorld w(n, options());
    constexpr int kRounds = 5;
    std::vector<std::atomic<int>> arrived(kRounds);  // value-initialized to 0 (C++20)
    int64_t bad = run_counting(w, [&](int r, Communicator& c) {
      int64_t early = 0;
      for (int k = 0; k < kRounds; k++) {
        arrived[static_cast<size_t>(k)]++;
        c.barrier()->wait();
        if (arrived[static_cast<size_t>(k)].load() != n) early++;
      }
      return early;
    });
    CHECK_MESSAGE(bad == 0, "barrier world " << n);
  }
}

TEST_CASE("send/recv: ring pattern r -> r+1 and two tags matched out of order") {
  for (int n : kWorlds) {
    if (n == 1) continue;  // nobody to talk to (send to self is an error, tested below)
    ThreadsWorld w(n, options());
    for (int64_t count : counts(n, kBig)) {
      int64_t bad = run_counting(w, [&](int r, Communicator& c) {
        const int next = (r + 1) % n, prev = (r - 1 + n) % n;
        std::vector<float> a = inputs(r, count), b = inputs(r + 100, count), got_a(a.size(), -1.0f), got_b(a.size(), -1.0f);
        // Sends first: they are eager, so every worker reaches its receives.
        WorkPtr s1 = c.send(a.data(), count, DType::F32, next, 1);
        WorkPtr s2 = c.send(b.data(), count, DType::F32, next, 2);
        c.recv(got_b.data(), count, DType::F32, prev, 2)->wait();  // tag 2 first: matched by tag
        c.recv(got_a.data(), count, DType::F32, prev, 1)->wait();
        s1->wait();
        s2->wait();
        return count_wrong(got_a.data(), count, [&](int64_t i) { return value(prev, i); }) +
               count_wrong(got_b.data(), count, [&](int64_t i) { return value(prev + 100, i); });
      });
      CHECK_MESSAGE(bad == 0, label("send/recv", "p2p", "-", n, count));
    }
  }
}

TEST_CASE("int64: all_reduce sum and max, broadcast, exact beyond float and double precision") {
  // Values near 2^58: any trip through float or double would lose the low bits.
  auto v = [](int rank, int64_t i) { return (int64_t(rank + 1) << 55) + 3 * i + 1; };
  for (int n : kWorlds) {
    ThreadsWorld w(n, options());
    for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{65537}}) {
      // root < 0: all_reduce with op; else broadcast from root.
      auto wrong = [&](ReduceOp op, Algorithm algo, int root) {
        return run_counting(w, [&](int r, Communicator& c) {
          std::vector<int64_t> buf(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; i++) buf[size_t(i)] = v(r, i);
          if (root < 0) c.all_reduce(buf.data(), count, DType::I64, op, algo)->wait();
          else c.broadcast(buf.data(), count, DType::I64, root, algo)->wait();
          int64_t bad = 0;
          for (int64_t i = 0; i < count; i++) {
            int64_t e = root >= 0 ? v(root, i) : op == ReduceOp::Max ? v(n - 1, i) : 0;
            for (int q = 0; root < 0 && op == ReduceOp::Sum && q < n; q++) e += v(q, i);
            bad += buf[size_t(i)] != e;
          }
          return bad;
        });
      };
      for (Algorithm algo : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          CHECK_MESSAGE(wrong(op, algo, -1) == 0, label("allreduce int64", algorithm_name(algo), reduce_op_name(op), n, count));
      for (Algorithm algo : {Algorithm::Tree, Algorithm::Naive})
        for (int root : roots(n))
          CHECK_MESSAGE(wrong(ReduceOp::Sum, algo, root) == 0, label("broadcast int64", algorithm_name(algo), "-", n, count, root));
    }
  }
}

TEST_CASE("ring all_reduce: 2(n-1) steps in NCCL's chunk order, each rank moving 2(n-1)/n of the buffer") {
  for (int n : {2, 3, 4, 5, 8}) {
    for (int64_t count : {int64_t{1000}, int64_t{1001}, int64_t{n - 1}, int64_t{7}}) {
      INFO("world " << n << " count " << count);
      ThreadsWorld w(n, options(20, true));
      run_counting(w, [&](int r, Communicator& c) {
        std::vector<float> buf = inputs(r, count);
        c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
        return int64_t{0};
      });
      const int64_t D = count * 4;
      std::vector<int64_t> sent(size_t(n), 0), received(size_t(n), 0);
      for (const Event& e : of_kind(w.recorder().all_events(), EventKind::RingStep)) {
        sent[size_t(e.step.src)] += e.step.bytes;
        received[size_t(e.step.dst)] += e.step.bytes;
      }
      for (int r = 0; r < n; r++) {
        std::vector<Event> steps = of_kind(w.recorder().events(r), EventKind::RingStep);
        REQUIRE(steps.size() == size_t(2 * (n - 1)));
        int64_t own_chunks = 0;
        for (int s = 0; s < 2 * (n - 1); s++) {
          const RingStepInfo& st = steps[size_t(s)].step;
          const bool rs = s < n - 1;
          const int chunk = rs ? ((r - 2 - s) % n + 2 * n) % n : ((r - 1 - (s - (n - 1))) % n + 2 * n) % n;
          CHECK((st.step == s && st.steps == 2 * (n - 1) && st.src == (r - 1 + n) % n && st.dst == r));
          CHECK(st.phase == (rs ? RingPhase::ReduceScatter : RingPhase::AllGather));
          CHECK(st.chunk == chunk);
          CHECK(st.bytes == chunk_elems(count, n, chunk) * 4);
          own_chunks += chunk_elems(count, n, chunk) * 4;
        }
        CHECK(received[size_t(r)] == own_chunks);
        CHECK(sent[size_t(r)] == received[size_t((r + 1) % n)]);
        const double ideal = 2.0 * (n - 1) / n * double(D);
        CHECK((std::abs(double(sent[size_t(r)]) - ideal) <= n * 4 && std::abs(double(received[size_t(r)]) - ideal) <= n * 4));
      }
    }
  }
}

TEST_CASE("trace: collectives match across ranks, steps nest, modeled time equals the closed forms") {
  const int n = 4;
  WorldOptions o = options(20, true);
  o.profile = "nvlink8";
  ThreadsWorld w(n, o);
  const int64_t count = 1000, block = 250;
  run_counting(w, [&](int r, Communicator& c) {
    std::vector<float> buf = inputs(r, count), in = inputs(r, count), out(count);
    std::vector<int64_t> ints(count, r);
    c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
    c.reduce_scatter(out.data(), in.data(), block, DType::F32, ReduceOp::Sum)->wait();
    c.all_gather(out.data(), in.data(), block, DType::F32)->wait();
    c.broadcast(buf.data(), count, DType::F32, 1, Algorithm::Tree)->wait();
    c.reduce(buf.data(), count, DType::F32, ReduceOp::Sum, 2, Algorithm::Tree)->wait();
    c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Max, Algorithm::Tree)->wait();
    c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Sum, Algorithm::Naive)->wait();
    c.broadcast(buf.data(), count, DType::F32, 3, Algorithm::Naive)->wait();
    c.all_to_all(out.data(), in.data(), block, DType::F32)->wait();
    c.barrier()->wait();
    c.all_reduce(ints.data(), count, DType::I64, ReduceOp::Sum, Algorithm::Ring)->wait();
    // Several in flight at once: the worker runs them in issue order.
    WorkPtr a = c.all_reduce(buf.data(), 300, DType::F32, ReduceOp::Sum, Algorithm::Ring);
    c.all_reduce(buf.data() + 300, 700, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();  // then a is done
    a->wait();
    return int64_t{0};
  });
  const size_t kCollectives = 13;
  std::map<uint64_t, std::vector<Event>> by_seq;  // seq -> one Collective event per rank
  for (const Event& e : of_kind(w.recorder().all_events(), EventKind::Collective)) by_seq[e.coll.seq].push_back(e);
  REQUIRE(by_seq.size() == kCollectives);
  for (const auto& entry : by_seq) {  // not a structured binding: CAPTURE's lambda uses it (clang 14)
    const uint64_t seq = entry.first;
    const std::vector<Event>& evs = entry.second;
    CAPTURE(seq);
    REQUIRE(evs.size() == size_t(n));
    std::set<int> ranks;
    for (const Event& e : evs) {
      ranks.insert(e.rank);  // one event from each rank
      CHECK((e.coll.op == evs[0].coll.op && e.coll.algo == evs[0].coll.algo && e.coll.bytes == evs[0].coll.bytes));
      CHECK(e.model_begin == evs[0].model_begin);  // everyone starts when the last one arrives
      CHECK(e.model_end >= e.model_begin);
      const double want = w.cost().collective_time(e.coll.op, e.coll.algo, double(e.coll.bytes));
      CHECK_MESSAGE(std::abs((e.model_end - e.model_begin) - want) <= 1e-9 * want,
                    collective_name(e.coll.op) << " " << algorithm_name(e.coll.algo));
    }
    CHECK(ranks.size() == size_t(n));
  }
  for (int r = 0; r < n; r++) {
    std::vector<Event> evs = w.recorder().events(r);
    std::map<uint64_t, Event> coll;
    double last_end = 0;
    for (const Event& e : evs) {
      CHECK(e.wall_end_ns >= e.wall_begin_ns);
      CHECK(e.model_end >= e.model_begin);
      if (e.kind == EventKind::Collective) {
        coll[e.coll.seq] = e;
        CHECK(e.model_begin >= last_end - 1e-15);  // the comm lane runs one collective at a time
        last_end = e.model_end;
      }
    }
    for (const Event& e : of_kind(evs, EventKind::RingStep)) {
      REQUIRE(coll.count(e.step.seq) == 1);
      const Event& c = coll[e.step.seq];
      CHECK(e.wall_begin_ns >= c.wall_begin_ns);
      CHECK(e.wall_end_ns <= c.wall_end_ns);
      CHECK(e.model_begin >= c.model_begin - 1e-15);
      CHECK(e.model_end <= c.model_end + 1e-15);
    }
    CHECK(of_kind(evs, EventKind::CollectiveIssue).size() == kCollectives);
  }
}

TEST_CASE("desync: different counts or different ops fail at once, naming both ranks and calls") {
  for (bool same_op : {true, false}) {
    CAPTURE(same_op);
    ThreadsWorld w(3, options(120));  // a watchdog far away: only detection at arrival can be quick
    auto result = run_expecting_comm_error(w, [&](int r, Communicator& c, RankContext&) {
      std::vector<float> buf(20, 1.0f);
      if (r != 1) c.all_reduce(buf.data(), 20, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      else if (same_op) c.all_reduce(buf.data(), 10, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      else c.broadcast(buf.data(), 20, DType::F32, 0, Algorithm::Tree)->wait();
    });
    const std::string msg = result.first;  // plain variables: CAPTURE's lambda uses them (clang 14)
    const double secs = result.second;
    CAPTURE(msg);
    CHECK(secs < 60);  // not the watchdog: the mismatch is caught when the second call arrives
    check_mentions(msg, {"desync", "#0", "rank 1", "allreduce of 20 float32 (sum, ring)",
                         same_op ? "allreduce of 10 float32 (sum, ring)" : "broadcast of 20 float32 (root 0, tree)"});
    CHECK((contains(msg, "rank 0") || contains(msg, "rank 2")));
  }
}

TEST_CASE("skip fault: the watchdog names the collective, who arrived and who is missing, and why") {
  WorldOptions o = options(0.5);
  o.faults.push_back(parse_fault("skip:rank=2,collective=1"));
  ThreadsWorld w(4, o);
  auto result = run_expecting_comm_error(w, [&](int r, Communicator& c, RankContext&) {
    std::vector<float> buf(1000, 1.0f);
    c.all_reduce(buf.data(), 1000)->wait();
    c.all_reduce(buf.data(), 1000)->wait();  // #1: rank 2 skips it, then has nothing left to do
  });
  const std::string msg = result.first;  // plain variables: CAPTURE's lambda uses them (clang 14)
  const double secs = result.second;
  CAPTURE(msg);
  CHECK(secs >= 0.45);       // the watchdog waited its timeout...
  CHECK(secs < 0.5 + 30.0);  // ...and then ended the run (generous: TSan CI is slow)
  check_mentions(msg, {"watchdog", "#1", "rank 2", "fault injection"});
  // "ranks A, B, C arrived": the three others, in some order.
  size_t at = msg.find("ranks "), end = msg.find(" arrived");
  REQUIRE((at != std::string::npos && end != std::string::npos));
  std::string list = msg.substr(at + 6, end - at - 6);
  CHECK((contains(list, "0") && contains(list, "1") && contains(list, "3") && !contains(list, "2")));
  CHECK(w.status().failed);
}

// Regression: run() once kept its per-rank "failed with a CommError" flags in a vector<bool>, whose
// bits share a word, so concurrent writes could lose one and a plain Error came out instead.
TEST_CASE("run() rethrows a comm failure as CommError, every time") {
  int plain = 0;
  for (int k = 0; k < (quick() ? 20 : 200); k++) {
    ThreadsWorld w(16, options(5));
    auto desync = [](int r, Communicator& c, RankContext&) { float b[4] = {}; c.all_reduce(b, r == 5 ? 3 : 4)->wait(); };
    try { w.run(desync); } catch (const CommError&) {} catch (const Error&) { plain++; }
  }
  CHECK(plain == 0);
}

TEST_CASE("recv failures: no matching send times out naming the peer, a size mismatch names both sizes") {
  ThreadsWorld lonely(2, options(0.3));
  auto [msg, secs] = run_expecting_comm_error(lonely, [&](int r, Communicator& c, RankContext&) {
    std::vector<float> buf(8);
    if (r == 0) c.recv(buf.data(), 8, DType::F32, 1, 5)->wait();
  });
  CHECK(secs >= 0.25);  // it waited for the watchdog (and the world did end)
  check_mentions(msg, {"recv", "from rank 1", "tag 5"});
  ThreadsWorld w(2, options(120));
  auto [msg2, secs2] = run_expecting_comm_error(w, [&](int r, Communicator& c, RankContext&) {
    std::vector<float> buf(8, 1.0f);
    if (r == 0) c.send(buf.data(), 8, DType::F32, 1)->wait();
    else c.recv(buf.data(), 4, DType::F32, 0)->wait();
  });
  CHECK(secs2 < 60);  // not the watchdog: the size mismatch is caught on delivery
  check_mentions(msg2, {"16 bytes", "32"});
}

TEST_CASE("delay fault shorter than the timeout: a straggler, late on the wall clock, result correct") {
  WorldOptions o = options(5, true);
  o.faults.push_back(parse_fault("delay:rank=1,collective=0,ms=300"));
  const int n = 3;
  ThreadsWorld w(n, o);
  int64_t bad = run_counting(w, [&](int r, Communicator& c) {
    std::vector<float> buf = inputs(r, 1000);
    c.all_reduce(buf.data(), 1000)->wait();
    return count_wrong(buf.data(), 1000, [&](int64_t i) { return reference(ReduceOp::Sum, n, i); });
  });
  CHECK(bad == 0);
  std::vector<Event> c0 = of_kind(w.recorder().events(0), EventKind::Collective);
  std::vector<Event> c1 = of_kind(w.recorder().events(1), EventKind::Collective);
  REQUIRE((c0.size() == 1 && c1.size() == 1));
  // Rank 1 arrives 300 ms late on the modeled clock too, so the collective starts then on every
  // rank (a straggler shows on the modeled timeline), and rank 0 waited for it on the wall clock.
  CHECK(c0[0].model_begin >= 0.3);
  CHECK(c0[0].model_begin == c1[0].model_begin);
  CHECK(c1[0].wall_begin_ns > c0[0].wall_begin_ns);
}

TEST_CASE("delay longer than the timeout: the watchdog names the delayed rank and cuts the delay short") {
  WorldOptions o = options(0.3);
  o.faults.push_back(parse_fault("delay:rank=1,collective=0,ms=120000"));
  ThreadsWorld w(3, o);
  auto [msg, secs] = run_expecting_comm_error(w, [&](int r, Communicator& c, RankContext&) {
    std::vector<float> buf(10, 1.0f);
    c.all_reduce(buf.data(), 10)->wait();
  });
  CHECK(secs < 60);  // the abort wakes the delayed rank; run() does not sit out the 120 s delay
  check_mentions(msg, {"rank 1", "delayed", "fault injection"});
}

TEST_CASE("bad arguments throw dtlab::Error at the call, without using up a sequence number") {
  ThreadsWorld w(4, options(5));
  Communicator& c = w.comm(0);
  std::vector<float> f(8);
  std::vector<int64_t> i64(8);
  CHECK_THROWS_AS(c.broadcast(f.data(), 8, DType::F32, 4), Error);
  CHECK_THROWS_AS(c.broadcast(f.data(), 8, DType::F32, -1), Error);
  CHECK_THROWS_AS(c.reduce(f.data(), 8, DType::F32, ReduceOp::Sum, 7), Error);
  CHECK_THROWS_AS(c.all_reduce(i64.data(), 8, DType::I64, ReduceOp::Avg), Error);
  CHECK_THROWS_AS(c.reduce(i64.data(), 8, DType::I64, ReduceOp::Avg, 0), Error);
  CHECK_THROWS_AS(c.send(f.data(), 8, DType::F32, 0), Error);
  CHECK_THROWS_AS(c.recv(f.data(), 8, DType::F32, 0), Error);
  CHECK_THROWS_AS(c.send(f.data(), 8, DType::F32, 4), Error);
  CHECK_THROWS_AS(c.reduce_scatter(f.data(), f.data(), 2, DType::F32, ReduceOp::Sum, Algorithm::Tree), Error);
  CHECK_THROWS_AS(c.all_gather(f.data(), f.data(), 2, DType::F32, Algorithm::Naive), Error);
  CHECK_THROWS_AS(c.all_reduce(f.data(), -1, DType::F32, ReduceOp::Sum), Error);
  CHECK_THROWS_AS(ThreadsWorld(0), Error);
  CHECK_THROWS_AS(ThreadsWorld(2, options(0)), Error);
  WorldOptions bad_fault = options();
  bad_fault.faults = {parse_fault("skip:rank=5,collective=0")};
  CHECK_THROWS_AS(ThreadsWorld(4, bad_fault), Error);
  CHECK_THROWS_AS(parse_algorithm("butterfly"), Error);
  // None of the refused calls took a sequence number: the ranks still agree.
  CHECK(allreduce_wrong(w, 10, ReduceOp::Sum, Algorithm::Default) == 0);
}

TEST_CASE("parse_fault reads skip and delay faults and rejects the rest") {
  Fault s = parse_fault("skip:rank=3,collective=5");
  CHECK((s.kind == FaultKind::Skip && s.rank == 3 && s.seq == 5));
  Fault d = parse_fault("delay:rank=1,collective=2,ms=500");
  CHECK((d.kind == FaultKind::Delay && d.rank == 1 && d.seq == 2));
  CHECK(d.delay_s == doctest::Approx(0.5));
  Fault o = parse_fault("delay:ms=20,collective=0,rank=0");  // any order
  CHECK(o.delay_s == doctest::Approx(0.02));
  for (const char* bad : {"", "skip", "skip:", "crash:rank=1,collective=1", "skip:rank=1", "skip:collective=1",
                          "delay:rank=1,collective=2", "skip:rank=-1,collective=0", "skip:rank=x,collective=0",
                          "skip:rank=1,collective=2,ms=5", "skip:rank=1,,collective=2", "skip:rank=1;collective=2",
                          "skip:rank=1,collective=2x", "skip:rank=,collective=2", "delay:rank=1,collective=2,ms=-5",
                          "skip:rank=4294967297,collective=1", "delay:rank=1,collective=2,ms=3600001"})
    CHECK_THROWS_AS_MESSAGE(parse_fault(bad), Error, "'" << bad << "'");
  std::string how;
  try { parse_fault("skip:rank=1"); } catch (const Error& e) { how = e.what(); }
  CHECK(contains(how, "skip:rank=R,collective=K"));  // says how to write it
}

TEST_CASE("reduce_scatter and tree reduce charge comm buffers while running and release them") {
  const int n = 4;
  const int64_t count = 1000;
  ThreadsWorld w(n, options(10, true));
  run_counting(w, [&](int r, Communicator& c) {
    std::vector<float> in = inputs(r, count * n), out(count), buf = inputs(r, count);
    c.reduce_scatter(out.data(), in.data(), count, DType::F32, ReduceOp::Sum)->wait();
    c.reduce(buf.data(), count, DType::F32, ReduceOp::Sum, 1, Algorithm::Tree)->wait();
    return int64_t{0};
  });
  for (int r = 0; r < n; r++) {
    CAPTURE(r);
    MemoryStats s = w.memory(r).stats();
    CHECK(s.current_of(MemCategory::CommBuffers) == 0);
    CHECK(s.peak_of(MemCategory::CommBuffers) >= 2 * count * 4);  // two partial-sum slots
    // Each op allocates after its issue and has freed everything by its Collective event.
    std::map<int64_t, int> allocs;  // seq of the op in flight -> CommBuffers allocations
    int64_t live = 0, seq = -1;
    for (const Event& e : w.recorder().events(r)) {
      if (e.kind == EventKind::CollectiveIssue) seq = int64_t(e.coll.seq);
      if (e.kind == EventKind::Collective) CHECK(live == 0);
      if ((e.kind != EventKind::MemAlloc && e.kind != EventKind::MemFree) || e.mem.category != MemCategory::CommBuffers) continue;
      live += e.kind == EventKind::MemAlloc ? e.mem.bytes : -e.mem.bytes;
      allocs[seq] += e.kind == EventKind::MemAlloc;
    }
    CHECK(allocs[0] >= 1);                  // reduce_scatter
    CHECK(allocs[1] == (r == 1 ? 0 : 1));   // tree reduce: non-roots accumulate in scratch
  }
}


// Regression: a rank that fails mid-collective used to unwind (freeing its scratch, failing its
// Work so its caller freed the buffer) while neighbours still read that memory. Now it waits for
// them to leave the algorithm first; ASan/TSan builds would flag the old behaviour here.
TEST_CASE("aborting the world during large collectives frees nothing a neighbour still reads") {
  for (int round = 0; round < (quick() ? 2 : 5); round++) {
    ThreadsWorld w(4, options(10));
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + 7 * round));
      w.abort("stopped by the test");
    });
    std::string msg;
    try {
      w.run([](int r, Communicator& c, RankContext&) {
        for (int k = 0; k < 50; k++) {
          std::vector<float> in(1 << 20, float(r)), out((1 << 20) / 4);
          c.reduce_scatter(out.data(), in.data(), (1 << 20) / 4, DType::F32, ReduceOp::Sum)->wait();
          std::vector<float> buf(1 << 18, 1.0f);
          c.all_reduce(buf.data(), 1 << 18)->wait();
        }
      });
    } catch (const CommError& e) {
      msg = e.what();
    }
    stopper.join();
    CHECK(msg == "stopped by the test");
    CHECK(w.status().failed);  // (in_flight keeps what was pending: the post-mortem view)
    CHECK(w.status().error == "stopped by the test");
  }
}

TEST_CASE("a rank whose allocation fails fails the run with an out-of-memory sentence naming it") {
  // What a rank does when its model, optimizer state or buffer does not fit: std::bad_alloc in its
  // thread. The world fails with that rank's sentence (exit 2 in the front ends), the others stop.
  ThreadsWorld w(4, options(5));
  std::string msg = "(no error)";
  try {
    w.run([](int r, Communicator& c, RankContext& ctx) {
      ctx.set_activity("allocating its optimizer state");
      if (r == 2) throw std::bad_alloc();
      std::vector<float> buf(64, 1.0f);
      c.all_reduce(buf.data(), 64)->wait();
    });
  } catch (const CommError& e) {
    msg = std::string("(a CommError) ") + e.what();
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg ==
        "rank 2: out of memory (its last activity: allocating its optimizer state): the run needs more memory than this "
        "machine gives it; use a smaller --model, --batch or --world");
  CHECK(out_of_memory_seen());  // the front ends then end without OpenBLAS's exit handler
}

TEST_CASE("a rank that does not return after the world failed is named, with where it is, after the limit") {
  // A rank stuck where no abort reaches it (once: OpenBLAS retrying a failed allocation forever)
  // would make run() wait forever. After return_limit_s the world reports it; by default it then
  // ends the process (exit 3), here the handler reads the sentence and frees the rank.
  WorldOptions o = options(5);
  o.return_limit_s = 0.2;
  std::atomic<bool> freed{false};
  std::string diagnosis;
  o.on_stuck = [&](const std::string& d) {
    diagnosis = d;
    freed = true;
  };
  ThreadsWorld w(3, o);
  std::string msg = "(no error)";
  try {
    w.run([&](int r, Communicator&, RankContext& ctx) {
      if (r == 0) throw Error("the test failed rank 0");
      if (r == 1) {
        ctx.set_activity("in a loop no abort reaches");
        while (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  } catch (const CommError& e) {
    msg = std::string("(a CommError) ") + e.what();
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg == "rank 0: the test failed rank 0");
  CHECK(diagnosis ==
        "the run failed (rank 0 failed: the test failed rank 0), and rank 1 (in a loop no abort reaches) did not return "
        "within 0.2 s of it; a rank stuck where no abort reaches it (out of memory inside OpenBLAS, for one) cannot be "
        "stopped, so the process ends here");
}

}  // TEST_SUITE
