// A/B comparison: pin the run on screen (A), start another configuration (B), and the Timeline,
// Memory, Buckets and Pipeline views draw both, one above the other, on one scale, with a table of
// what differs. Everything here reads Snapshots only: a pinned run is the copy of its last
// Snapshot, so A's pictures are what A really did, frozen, and B's go on live.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "app/snapshot.h"
#include "engine/train/train.h"

namespace dtlab::app {

// A run's last finished iteration (rank 0's) in the figures a comparison reads.
struct RunSummary {
  bool valid = false;            // some iteration finished
  int32_t iteration = -1;
  double step_model_s = 0;       // rank 0's iteration on the modeled clock
  double step_wall_s = 0;        // and on the wall clock
  double overlap = -1;           // DDP's: share of all-reduce time hidden behind backward; -1: none
  int64_t peak_bytes = 0;        // the most any rank held at once during it (every category)
  int peak_rank = -1;
  int collectives = 0;           // collectives and sends it ran (each once, whatever its group)
  int64_t collective_bytes = 0;  // their payloads S (nccl-tests' size), summed
  // The link of the run's hardware profile with the most modeled busy time over those collectives'
  // steps (CostModel::link_loads): "node 0 NIC 0 out", what it carried and for how long. "" without
  // a profile or a collective.
  std::string slowest_link;
  double slowest_link_bytes = 0, slowest_link_s = 0;
};

// From the events the Snapshot keeps (the last few iterations), its step reports and its profile.
RunSummary summarize_run(const Snapshot& s);

// One row of the differences table: what, A's value, B's value, and how B differs from A
// ("-38%", "+12 points", "same"); `better` is +1 when B's is the better value, -1 worse, 0 neither.
struct DifferenceRow {
  std::string what, a, b, change;
  int better = 0;
};
std::vector<DifferenceRow> difference_rows(const RunSummary& a, const RunSummary& b);

// The settings in which two runs differ, as (flag, A's value, B's value): what the A and B captions
// name ("--bucket-cap-mb": "1" vs "25"). A setting left at its default reads "default".
struct SettingDifference {
  std::string flag, a, b;
};
std::vector<SettingDifference> setting_differences(const RunConfigView& a, const RunConfigView& b);
// "--bucket-cap-mb 1 --algo ring" (A's side when `a`, else B's); "the same settings" when none differ.
std::string side_caption(const std::vector<SettingDifference>& diff, bool a);

// `compare --bucket-cap-mb 25 --algo dbtree`: the flags of the lab (engine/train/settings.h) applied to
// `config`, in order. Throws dtlab::Error naming the flag and the fix for an unknown flag, a missing
// value or a value the setting refuses.
void apply_compare_flags(TrainConfig& config, const std::vector<std::string>& words);

// The pinned run: its last Snapshot and its summary.
struct Pinned {
  std::shared_ptr<const Snapshot> snapshot;
  RunSummary summary;
};

}  // namespace dtlab::app
