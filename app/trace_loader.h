// The lab's side of imported profiler traces (dtlab --open): the import (engine/trace/trace_import.h)
// runs on a background thread while the UI keeps drawing, and the UI takes one snapshot a frame:
// loading (how far), loaded (the whole trace, never a part of it) or failed (one sentence). The
// comparison with a dtlab run of the same model (engine/train/trace_compare.h) runs the same way,
// on demand. No ImGui here: the views read TraceSnapshot only.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/trace/trace_import.h"
#include "engine/train/trace_compare.h"

namespace dtlab::app {

// dtlab.json beside the traces: engine/train/trace_compare.h (the CLI reads it the same way).
using dtlab::TraceMeta;
using dtlab::read_trace_meta;

// The trace files --open names: a directory's *.json and *.json.gz but dtlab.json, sorted; files
// as given. Throws dtlab::Error (one sentence) for a path that does not exist, is not a regular
// file, or a directory with no trace in it.
struct TraceFiles {
  std::vector<std::string> files;
  int64_t bytes = 0;            // their sizes on disk, summed
};
TraceFiles list_trace_files(const std::vector<std::string>& paths);

// What the timeline draws of one rank, made on the loading thread so that the first frame of a
// big trace costs no more than any other.
struct TraceRow {
  TraceLane lane = TraceLane::Compute;
  int32_t thread = 0;
  std::vector<int32_t> spans;   // RankTrace::spans indices: this lane's outermost spans on one thread, by begin
  std::vector<double> reach;    // reach[i]: the latest end of spans[0..i] (culling by binary search)
};
struct RankIndex {
  std::vector<TraceRow> rows;                      // by lane, then thread
  std::vector<std::pair<double, double>> overlap;  // communication while compute ran, merged, by begin (µs)
  std::vector<int32_t> collective_of;              // RankTrace::collectives index -> ImportedTrace::collectives (-1: unmatched)
};
// Compute spans' kinds by name, for the colors: the live timeline's forward, backward, optimizer.
enum class ComputeHue : uint8_t { Forward, Backward, Optimizer, Loss };
struct TraceIndex {
  std::vector<RankIndex> ranks;    // by rank
  std::vector<ComputeHue> hue;     // by ImportedTrace::names id
};
TraceIndex index_trace(const ImportedTrace& t);

struct LoadedTrace {
  ImportedTrace trace;
  TraceIndex index;
  TraceFiles files;
  double load_s = 0;  // seconds from open to loaded
};

enum class TaskState : uint8_t { Idle, Running, Done, Failed, Cancelled };
const char* task_state_name(TaskState s);  // "idle", "running", "done", "failed", "cancelled"

// One frame's view of the loader, taken by poll().
struct TraceSnapshot {
  std::vector<std::string> paths;  // what --open named
  TaskState load = TaskState::Idle;
  double fraction = 0;             // of the bytes, while loading
  int files = 0;
  int64_t bytes = 0;               // all files' sizes
  double elapsed_s = 0;            // since the load began
  std::shared_ptr<const LoadedTrace> trace;  // set when load == Done, and only then
  std::string error;               // load == Failed: one sentence
  TaskState compare = TaskState::Idle;
  TraceCompareOptions compare_options;         // what is (or was) compared
  std::shared_ptr<const TraceComparison> comparison;  // compare == Done
  std::string compare_error;       // compare == Failed
  double compare_elapsed_s = 0;
};

class TraceLoader {
 public:
  TraceLoader() = default;
  TraceLoader(const TraceLoader&) = delete;
  TraceLoader& operator=(const TraceLoader&) = delete;
  ~TraceLoader();  // cancels a load and waits for both threads (a comparison runs to its end)

  // Starts loading `paths` (cancelling a load under way); `ranks` as TraceImportOptions::ranks.
  void open(const std::vector<std::string>& paths, const std::vector<int>& ranks);
  void reopen() { open(paths_, ranks_); }
  void cancel();  // the load under way ends as Cancelled
  // Runs compare_trace on the loaded trace; ignored while one runs or before a trace is loaded.
  void compare(const TraceCompareOptions& opt);
  // The state now; call once a frame on the UI thread.
  const TraceSnapshot& poll();

 private:
  struct Job;
  struct CompareJob;
  std::vector<std::string> paths_;
  std::vector<int> ranks_;
  std::shared_ptr<Job> job_;
  std::thread thread_;
  std::shared_ptr<CompareJob> compare_job_;
  std::thread compare_thread_;
  TraceSnapshot snap_;
};

}  // namespace dtlab::app
