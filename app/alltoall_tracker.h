// The All-to-all view's data, kept by the SnapshotBuilder: the newest all-to-alls' events (each
// rank's issue, its RingSteps, its end), turned once a frame into Snapshot::alltoall and
// Snapshot::alltoall_groups. A receiver's RingStep says who sent and how many bytes arrived, so the
// matrix is what really moved, pair by pair; each rank's issue says what it keeps (its own block) and
// what it sends, for the plain all_to_all (equal blocks) and all_to_all_v (a size per pair) alike.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "app/snapshot.h"

namespace dtlab::app {

class AllToAllTracker {
 public:
  void reset();
  // CollectiveIssue, Collective and RingStep events; what is not an all-to-all's is ignored.
  void ingest(int rank, const Event& e);
  // Every group's newest all-to-all over its members (group -> global ranks and name, as the builder
  // learned them from the labels), newest first, into `groups`; into `shown` the one the view shows
  // unless the user picks a group: the newest of the group of the operation the stepper holds
  // (`held`; `follows_held` true) when that group has had one, else the newest of all. `shown.valid`
  // false when there is none yet.
  void build(const std::map<int32_t, std::vector<int>>& group_ranks, const std::map<int32_t, std::string>& group_names,
             int world, const PendingItem& held, std::vector<AllToAllView>& groups, AllToAllView& shown, bool& follows_held) const;

 private:
  using Key = std::pair<int32_t, uint64_t>;  // (group, seq), as the builder's CollKey
  struct Track {
    uint64_t order = 0;  // the recorder order of its first issue seen
    DType dtype = DType::F32;
    bool split_sizes = false;                      // all_to_all_v
    Algorithm algo = Algorithm::Pairwise;          // pairwise or grouped
    std::map<int, int64_t> kept_bytes, sent_bytes;  // global rank: its own block (a local copy), what leaves it
    std::map<std::pair<int, int>, int64_t> pairs;   // (global src, global dst): bytes received
    std::map<int, int> steps;                       // global rank: steps finished
    std::map<int, bool> done;                       // global rank: its Collective event came
  };
  // One all-to-all as the view draws it; false when its group's members are not known yet.
  bool view_of(const Key& k, const Track& t, const std::map<int32_t, std::vector<int>>& group_ranks,
               const std::map<int32_t, std::string>& group_names, int world, AllToAllView& out) const;
  // The newest all-to-alls kept (an MoE block issues five a step), beyond each group's newest.
  static constexpr size_t kKept = 8;
  std::map<Key, Track> tracks_;
  std::map<int32_t, Key> newest_;  // group -> its newest all-to-all (never forgotten)
};

// The all-to-all the view shows: the held operation's group's while the stepper holds one of a group
// that has had all-to-alls (Snapshot::alltoall_held); else the newest of `group` (the view's pick; -1:
// none) when that group has had one; else the newest of all (Snapshot::alltoall).
const AllToAllView& pick_alltoall(const Snapshot& s, int32_t group);

}  // namespace dtlab::app
