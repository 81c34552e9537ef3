// The watchdog: the one deadline every communication wait runs under, and the words it fails with.
// Project rule: nothing waits forever; every wait has a timeout and, when it runs out, a diagnosis
// (which collective, who arrived, who is missing, what they are doing).
// The threads backend, the nccl backend and the socket mesh wait with it; a stepper's pause stops its
// clock where a paused rank can hold a peer's wait (a rank held at a gate is not hung).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace dtlab {

class Stepper;  // engine/trace/stepper.h

// A deadline `timeout_s` from now. With a `paused` query its clock does not run while the world is
// paused: expired() starts the timeout over whenever it finds the query true, so a pausable wait
// wakes at least every kPauseCheck to ask (next_wake()). Without one it is a plain deadline.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kPauseCheck{100};

  explicit Deadline(double timeout_s, std::function<bool()> paused = nullptr);
  Deadline(double timeout_s, const Stepper* stepper);  // paused while the stepper is; none: never

  double timeout_s() const { return timeout_s_; }  // as given, for the diagnosis ("within 0.5 s")
  // True once the timeout has run out; when paused it first starts the timeout over (never true then).
  bool expired();
  void restart() { at_ = Clock::now() + timeout_; }
  Clock::time_point at() const { return at_; }
  // When a condition-variable wait should look again: at(), or sooner when pausable.
  Clock::time_point next_wake() const;
  // at() in seconds of the steady clock, the unit tcp's poll-based waits take (tcp::now_s()).
  double at_s() const { return std::chrono::duration<double>(at_.time_since_epoch()).count(); }

 private:
  double timeout_s_;
  Clock::duration timeout_;
  Clock::time_point at_;
  std::function<bool()> paused_;
};

// Waits on `cv` (with `lock` held) until `pred` holds or the deadline expires, paused time not
// counted. Returns pred()'s last answer: true when it held in time.
template <class Pred>
bool wait_under(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Deadline& deadline, Pred pred) {
  while (true) {
    if (cv.wait_until(lock, deadline.next_wake(), pred)) return true;
    if (deadline.expired()) return false;
  }
}

// ---- diagnoses: the watchdog's sentences ----

// What one rank the watchdog names is doing.
struct RankDoing {
  int rank = 0;
  std::string comm;     // its comm worker: "at the gate of #3 ...", "idle"
  std::string compute;  // its compute thread: RankContext::activity()
  std::string note;     // why, when known: "it skipped #1 (fault injection)"; empty: nothing
};

// The ranks in 0..world_size-1 that are not in `arrived`, in order.
std::vector<int> missing_ranks(const std::vector<int>& arrived, int world_size);

// A collective not every rank arrived at: "watchdog: collective #1 allreduce of ..., 4.0 KiB, did
// not complete within 0.5 s: ranks 0, 1 arrived (in that order); rank 2 missing; rank 2 is ...".
// `collective` is describe(desc, seq); `missing` in the order to name them.
std::string diagnose_missing(const std::string& collective, int64_t bytes, double timeout_s,
                             const std::vector<int>& arrived, const std::vector<RankDoing>& missing);

// A collective every rank entered that stopped moving: rank `rank` waited the timeout for `what`.
// `steps_finished`: per rank, the algorithm steps it finished.
std::string diagnose_stall(const std::string& collective, int rank, double timeout_s, const std::string& what,
                           const std::vector<int>& steps_finished);

// A receive whose message never came: `what` names it ("recv #2 of 4 elements from rank 1 (tag 3)"),
// `peer` is what the sender is doing.
std::string diagnose_recv(const std::string& what, int rank, double timeout_s, const RankDoing& peer);

}  // namespace dtlab
