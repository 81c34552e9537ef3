// The All-to-all view's data, kept by the SnapshotBuilder: the newest all-to-alls' events (each
// rank's issue, its RingSteps, its end), turned once a frame into Snapshot::alltoall. A receiver's
// RingStep says who sent and how many bytes arrived, so the matrix is what really moved, pair by pair.
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
  // The newest all-to-all (the one issued last) over its group's members (group -> global ranks and
  // name, as the builder learned them from the labels); `out.valid` false when there is none yet.
  void build(const std::map<int32_t, std::vector<int>>& group_ranks, const std::map<int32_t, std::string>& group_names,
             int world, AllToAllView& out) const;

 private:
  using Key = std::pair<int32_t, uint64_t>;  // (group, seq), as the builder's CollKey
  struct Track {
    uint64_t order = 0;  // the recorder order of its first issue seen
    DType dtype = DType::F32;
    std::map<int, int64_t> in_bytes, out_bytes;  // global rank: what it put in (every block), what left it
    std::map<std::pair<int, int>, int64_t> pairs;  // (global src, global dst): bytes received
    std::map<int, int> steps;                      // global rank: steps finished
    std::map<int, bool> done;                      // global rank: its Collective event came
  };
  static constexpr size_t kKept = 8;  // the newest all-to-alls kept (an MoE block issues five a step)
  std::map<Key, Track> tracks_;
  Key newest_{0, 0};
  uint64_t newest_order_ = 0;
  bool any_ = false;
};

}  // namespace dtlab::app
