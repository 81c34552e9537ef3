#include "engine/comm/watchdog.h"

#include <algorithm>
#include <sstream>

#include "engine/core/format.h"
#include "engine/trace/stepper.h"

namespace dtlab {

namespace {

Deadline::Clock::duration clock_duration(double seconds) {
  return std::chrono::duration_cast<Deadline::Clock::duration>(std::chrono::duration<double>(seconds));
}

std::function<bool()> stepper_paused(const Stepper* stepper) {
  if (!stepper) return nullptr;
  return [stepper] { return stepper->holding(); };
}

std::string rank_list(const std::vector<int>& v) {  // "0, 2, 3"
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

Deadline::Deadline(double timeout_s, std::function<bool()> paused)
    : timeout_s_(timeout_s), timeout_(clock_duration(timeout_s)), at_(Clock::now() + timeout_), paused_(std::move(paused)) {}

Deadline::Deadline(double timeout_s, const Stepper* stepper) : Deadline(timeout_s, stepper_paused(stepper)) {}

bool Deadline::expired() {
  if (paused_ && paused_()) restart();
  return Clock::now() >= at_;
}

Deadline::Clock::time_point Deadline::next_wake() const {
  if (!paused_) return at_;
  return std::min(at_, Clock::now() + std::chrono::duration_cast<Clock::duration>(kPauseCheck));
}

std::vector<int> missing_ranks(const std::vector<int>& arrived, int world_size) {
  std::vector<int> missing;
  for (int r = 0; r < world_size; r++)
    if (std::find(arrived.begin(), arrived.end(), r) == arrived.end()) missing.push_back(r);
  return missing;
}

std::string diagnose_missing(const std::string& collective, int64_t bytes, double timeout_s,
                             const std::vector<int>& arrived, const std::vector<RankDoing>& missing) {
  std::vector<int> ranks;
  for (const RankDoing& m : missing) ranks.push_back(m.rank);
  std::ostringstream os;
  os << "watchdog: collective " << collective << ", " << human_bytes(bytes) << ", did not complete within "
     << seconds_text(timeout_s) << ": ranks " << rank_list(arrived) << " arrived (in that order); " << ranks_text(ranks)
     << " missing";
  for (const RankDoing& m : missing) {
    os << "; rank " << m.rank << " is " << m.comm << " on its comm worker and " << m.compute << " on its compute thread";
    if (!m.note.empty()) os << " (" << m.note << ")";
  }
  return os.str();
}

std::string diagnose_stall(const std::string& collective, int rank, double timeout_s, const std::string& what,
                           const std::vector<int>& steps_finished) {
  std::ostringstream os;
  os << "watchdog: collective " << collective << " stalled: rank " << rank << " waited " << seconds_text(timeout_s)
     << " for " << what << "; steps done per rank:";
  for (size_t r = 0; r < steps_finished.size(); r++) os << " " << r << "=" << steps_finished[r];
  return os.str();
}

std::string diagnose_recv(const std::string& what, int rank, double timeout_s, const RankDoing& peer) {
  return "watchdog: " + what + " on rank " + std::to_string(rank) + " did not complete within " + seconds_text(timeout_s) +
         "; rank " + std::to_string(peer.rank) + " is " + peer.comm + " (compute: " + peer.compute + ")";
}

}  // namespace dtlab
