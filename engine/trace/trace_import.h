// Import of PyTorch profiler traces of a multi-rank job (one Chrome-trace JSON file per rank, plain
// or gzip), so a real job reads like a dtlab run: per-rank compute and communication lanes on one
// aligned clock, the collectives matched across ranks (who arrived last, bandwidths), DDP's buckets
// and a time breakdown per rank (compute, overlapped and exposed communication, copies, idle).
//
// Two formats, both as PyTorch writes them (docs/trace_formats.md has the fields and their sources):
// - Kineto (torch.profiler): an object with "traceEvents", "distributedInfo" {rank, world_size,
//   backend}, "ProfilerStep#N" annotations, "record_param_comms" CPU ops whose args carry the
//   collective ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", ...),
//   and GPU kernels ("nccl..." kernels are communication, other kernels compute, gpu_memcpy copies).
// - Legacy autograd profiler (torch.autograd.profiler, use_kineto=False): a bare event list with
//   "c10d::allreduce_" ops on the issuing thread and "gloo:all_reduce" spans on gloo's worker thread;
//   no rank, no sizes: ranks come from the file names ("rank3", "rank_3", "rank-3") or an explicit list.
//
// Files are streamed (SAX: no document tree) so a 100 MB trace loads in bounded memory, with a
// progress callback and a cancel flag for the lab's background loader.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtlab {

enum class TraceFormat : uint8_t { Kineto, Legacy };
const char* trace_format_name(TraceFormat f);  // "kineto" | "legacy autograd profiler"

// What a span is, for the lanes and the breakdown.
enum class SpanClass : uint8_t {
  Compute,     // GPU kernel (not NCCL); on CPU-only traces a top-level op on a compute thread
  Comm,        // the communication itself: an NCCL kernel, or gloo's span on its worker thread
  Memcpy,      // gpu_memcpy / gpu_memset
  Issue,       // the CPU op that issued a collective (record_param_comms, c10d::allreduce_, nccl:*)
  Annotation,  // user annotations: ProfilerStep#N, DistributedDataParallel.forward, Optimizer.step#...
};
const char* span_class_name(SpanClass c);

// Lanes drawn per rank (the timeline's rows).
enum class TraceLane : uint8_t { Compute, Comm, Memcpy, Annotation };

struct TraceSpan {
  double begin_us = 0, end_us = 0;  // aligned clock (µs; 0 = the earliest aligned event of the run)
  double raw_begin_us = 0;          // the file's own timestamp
  int32_t name = -1;                // ImportedTrace::names
  SpanClass cls = SpanClass::Compute;
  TraceLane lane = TraceLane::Compute;
  int16_t depth = 0;                // nesting within its thread (0 = top level); lanes draw depth 0
  int32_t thread = 0;               // index into RankTrace::threads
  int32_t collective = -1;          // Comm/Issue spans: index into RankTrace::collectives
};

// One rank's view of one collective.
struct RankCollective {
  std::string name;           // c10d's name: "allreduce", "allgather", "reduce_scatter", "broadcast", ...
  int64_t in_nelems = -1, out_nelems = -1;  // -1: not recorded (legacy)
  std::string dtype;          // "Float", ... ("" when not recorded)
  int64_t bytes = -1;         // nccl-tests' S: in_nelems x element size for all-reduce and broadcast,
                              // out_nelems x size for all-gather, in_nelems x size for reduce-scatter; -1 unknown
  int group_size = -1;        // -1: not recorded (then taken to be the world)
  int64_t seq = -1;           // the process group's sequence number, where recorded
  std::string group_name;     // "Process Group Name" ("" when not recorded): "tp0" from dtlab, "0" from torch
  std::vector<int> group_ranks;  // "Process Group Ranks": global ranks (empty when not recorded)
  double issue_us = -1;       // aligned: when the rank issued it (its arrival); -1 when no issue op was seen
  double begin_us = 0, end_us = 0;  // aligned: its communication span
  int iteration = -1;         // index of the rank's ProfilerStep span it falls in (time order), or -1
  int span = -1;              // its Comm span in RankTrace::spans (its Issue span when issue_timed)
  bool issue_timed = false;   // no communication span ran for it (a one-rank world, where NCCL moves
                              // nothing): begin/end are those of the op that issued it
  double exposed_us = 0;      // of its communication span, the time no compute ran beside it
};

struct RankAlignment {
  double offset_us = 0;          // mean shift added to this rank's timestamps
  double offset_min_us = 0, offset_max_us = 0;  // range over the anchors (piecewise alignment)
  int anchors = 0;               // collectives used: the world-wide ones every rank took part in
  double residual_max_us = 0;    // after alignment, largest |end - reference end| over the anchors
};

struct RankTrace {
  int rank = 0;
  std::string file;
  TraceFormat format = TraceFormat::Legacy;
  std::string backend;            // distributedInfo.backend ("nccl", "gloo"); "" when not recorded
  int world_size = -1;            // distributedInfo.world_size; -1 when not recorded
  std::vector<std::string> threads;  // "pid 1 / tid 3" or "GPU 0 / stream 7", in first-seen order
  std::vector<TraceSpan> spans;   // sorted by begin_us, then longer first
  std::vector<RankCollective> collectives;  // in the order this rank ran them
  struct Step { int number; double begin_us, end_us; };
  std::vector<Step> steps;        // ProfilerStep#N spans, in time order
  RankAlignment alignment;
  double first_us = 0, last_us = 0;  // aligned extent of its events
};

// One collective across ranks (the k-th collective of each rank, checked to agree).
struct TraceCollective {
  std::string name;
  int64_t bytes = -1;            // -1: not recorded
  std::string dtype;
  int iteration = -1;            // index of rank 0's ProfilerStep span (time order; torch 1.13's N lag and repeat), or -1
  int bucket = -1;               // DDP: an all-reduce in a backward pass, numbered in launch order per iteration
  std::vector<int> rank_index;   // per rank: index into RankTrace::collectives
  int last_rank = -1;            // arrived last (latest issue, else latest begin of its comm span)
  double first_arrival_us = 0, last_arrival_us = 0;  // the spread: how late the last rank was
  double end_us = 0;             // latest end over ranks (aligned)
  double busy_us = 0;            // end - last arrival: the time the data moved, every rank present
  double algbw_gbs = -1, busbw_gbs = -1;  // bytes / busy (nccl-tests' conventions); -1 without bytes,
                                          // or when a rank's is issue-timed (no data moved on a lane)
};

// Per rank, a partition of its wall time (first to last profiled step, or its whole trace when no
// ProfilerStep was recorded): compute_us + overlapped_us + exposed_comm_us + memcpy_us + idle_us
// == wall_us. Overlapped = communication while compute ran; exposed = communication alone.
struct RankBreakdown {
  double begin_us = 0, end_us = 0, wall_us = 0;
  double compute_us = 0, overlapped_us = 0, exposed_comm_us = 0, memcpy_us = 0, idle_us = 0;
  int straggled = 0;             // collectives this rank arrived last to, later than the resolution
};

struct ImportedTrace {
  std::vector<RankTrace> ranks;  // by rank
  std::vector<std::string> names;
  std::vector<TraceCollective> collectives;  // in order
  std::vector<RankBreakdown> breakdown;      // by rank
  TraceFormat format = TraceFormat::Legacy;
  std::string backend;
  double resolution_us = 1;      // the files' timestamp resolution (1 µs legacy, 0.001 Kineto ns)
  double duration_us = 0;        // aligned extent of the whole run
  int iterations = 0;            // ProfilerStep spans on rank 0
  int64_t events = 0;            // events read (all files)
  std::vector<std::string> warnings;  // things that were read but could not be used, one sentence each
  const std::string& name(int32_t id) const { return names[static_cast<size_t>(id)]; }
  // All-reduces per iteration (rank 0's steps in time order), as DDP's buckets; empty when no
  // iteration was marked.
  std::vector<int> buckets_per_iteration() const;
};

struct TraceImportOptions {
  // One rank per path, in order, for files that record no rank (legacy). Empty: from distributedInfo,
  // else from the file names.
  std::vector<int> ranks;
  // Called from the loading thread with the fraction of bytes read (0..1) across all files.
  std::function<void(double)> progress;
  const std::atomic<bool>* cancel = nullptr;  // set: the import throws dtlab::Error("cancelled")
};

// `paths`: files, or one directory whose *.json and *.json.gz files are the ranks' traces. Throws
// dtlab::Error with one sentence naming the file and what is wrong (not JSON, truncated, not a
// profiler trace, ranks missing or repeated, collectives that do not match across ranks).
ImportedTrace import_traces(const std::vector<std::string>& paths, const TraceImportOptions& opt = {});

// The aligned, classified trace from already-read file contents (tests): {file name, JSON text}.
ImportedTrace import_trace_texts(const std::vector<std::pair<std::string, std::string>>& files,
                                 const TraceImportOptions& opt = {});

// Intervals [begin, end] merged where they touch or overlap, sorted by begin: a rank's busy time.
std::vector<std::pair<double, double>> merge_intervals(std::vector<std::pair<double, double>> v);

// nccl-tests' bus bandwidth factor for a collective named as c10d names it, over n ranks.
double busbw_factor(const std::string& collective, int n);

}  // namespace dtlab
