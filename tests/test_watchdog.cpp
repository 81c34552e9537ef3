// The watchdog's deadline and words (engine/comm/watchdog.h): a deadline runs out after its timeout,
// paused time does not count, a wait whose condition comes true in time says so, and the diagnosis
// names the collective, who arrived, who is missing and what they do. Timeouts are short and only
// the order of events is checked, never a duration (CI machines are slow).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/watchdog.h"
#include "engine/trace/stepper.h"
#include "test_util.h"

using namespace dtlab;

using dtlab::test::contains;

namespace {

using Clock = std::chrono::steady_clock;

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

}  // namespace

TEST_SUITE("watchdog") {

TEST_CASE("watchdog: a deadline is not expired at first and expires after its timeout") {
  Deadline far(60);
  CHECK(!far.expired());
  Deadline d(0.2);
  CHECK(d.timeout_s() == 0.2);
  CHECK(d.next_wake() == d.at());  // not pausable: a wait sleeps until the deadline itself
  sleep_s(0.3);
  CHECK(d.expired());
}

TEST_CASE("watchdog: paused time does not count, and the clock runs again after the pause") {
  std::atomic<bool> paused{true};
  Deadline d(0.2, [&] { return paused.load(); });
  sleep_s(0.4);
  CHECK(!d.expired());  // paused through twice the timeout: expired() starts it over
  const Clock::time_point wake = d.next_wake();
  CHECK(wake <= Clock::now() + Deadline::kPauseCheck);  // a pausable wait looks again soon
  paused = false;
  sleep_s(0.3);
  CHECK(d.expired());
}

TEST_CASE("watchdog: a stepper holding a rank at a gate stops the deadline, paused holding none (or no stepper) it is a plain deadline") {
  Stepper stepper(2, /*start_paused=*/true);
  // Paused, but no rank at a gate: whoever waits is not waiting on the user's pause (a TP replica's
  // peer that left the loop under --uneven-rank waited 20 s for the lab's settle, past --timeout).
  Deadline idle(0.2, &stepper);
  sleep_s(0.3);
  CHECK(idle.expired());
  GateInfo g;
  g.kind = GateKind::Iteration;
  std::thread rank0([&] { stepper.gate(0, kComputeLane, g); });
  for (int i = 0; i < 500 && !stepper.holding(); i++) sleep_s(0.01);
  REQUIRE(stepper.holding());
  Deadline held(0.2, &stepper);
  Deadline plain(0.2, static_cast<const Stepper*>(nullptr));
  sleep_s(0.3);
  CHECK(!held.expired());
  CHECK(plain.expired());
  stepper.run();
  rank0.join();
  sleep_s(0.3);
  CHECK(held.expired());
}

TEST_CASE("watchdog: wait_under returns true when the condition comes true in time") {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  std::thread setter([&] {
    sleep_s(0.05);
    {
      std::lock_guard<std::mutex> lock(mu);
      ready = true;
    }
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  Deadline d(30);  // far away: only the condition can end this wait
  CHECK(wait_under(cv, lock, d, [&] { return ready; }));
  lock.unlock();
  setter.join();
}

TEST_CASE("watchdog: wait_under returns false at the deadline, and not while paused") {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  Deadline d(0.2);
  CHECK(!wait_under(cv, lock, d, [] { return false; }));
  CHECK(d.expired());

  // Paused for a while longer than the timeout: the wait outlasts the pause, then expires.
  std::atomic<bool> paused{true};
  std::atomic<bool> resumed{false};
  std::thread resumer([&] {
    sleep_s(0.5);
    resumed = true;
    paused = false;
  });
  Deadline pausable(0.2, [&] { return paused.load(); });
  CHECK(!wait_under(cv, lock, pausable, [] { return false; }));
  CHECK(resumed.load());  // it did not give up before the pause ended
  resumer.join();
}

TEST_CASE("watchdog: the diagnosis names the collective, who arrived, who is missing and what they do") {
  CHECK(missing_ranks({3, 0, 1}, 5) == std::vector<int>{2, 4});
  const std::string one = diagnose_missing("#1 allreduce of 1000 float32 (sum, ring)", 4000, 0.5, {3, 0, 1},
                                           {{2, "idle", "in forward", "it skipped #1 (fault injection)"}});
  CHECK(one == "watchdog: collective #1 allreduce of 1000 float32 (sum, ring), 3.9 KiB, did not complete within 0.5 s: "
               "ranks 3, 0, 1 arrived (in that order); rank 2 missing; rank 2 is idle on its comm worker and in forward "
               "on its compute thread (it skipped #1 (fault injection))");
  const std::string two = diagnose_missing("#0 broadcast of 8 float32 (root 0, tree)", 32, 2, {0},
                                           {{1, "idle", "computing", ""}, {2, "at the gate of #0", "waiting", ""}});
  CAPTURE(two);
  CHECK(contains(two, "collective #0 broadcast"));
  CHECK(contains(two, "ranks 0 arrived"));
  CHECK(contains(two, "ranks 1, 2 missing"));
  CHECK(contains(two, "rank 2 is at the gate of #0 on its comm worker and waiting on its compute thread"));
  CHECK(!contains(two, "fault"));  // no note, nothing said of one

  CHECK(diagnose_stall("#4 allgather of 2 float32 (ring)", 1, 0.3, "its ring neighbours", {2, 1, 2}) ==
        "watchdog: collective #4 allgather of 2 float32 (ring) stalled: rank 1 waited 0.3 s for its ring neighbours; "
        "steps done per rank: 0=2 1=1 2=2");
  CHECK(diagnose_recv("recv #0 of 8 elements from rank 1 (tag 5)", 0, 0.3, {1, "idle", "returned from its rank function", ""}) ==
        "watchdog: recv #0 of 8 elements from rank 1 (tag 5) on rank 0 did not complete within 0.3 s; rank 1 is idle "
        "(compute: returned from its rank function)");
}

}  // TEST_SUITE
